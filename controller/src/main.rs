//! `kroce-controller`: the cluster controller (one leader per cluster,
//! unprivileged) and `crd`, which prints the CRDs.

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use kroce_controller::metrics::Metrics;
use kroce_operator::http::{Health, serve};
use prometheus_client::registry::Registry;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

// Thousands of nodes' objects come and go through the stores and each
// pass: mimalloc returns freed memory where glibc's arenas held on to it.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// kroce controller: RdmaNetworks -> one RdmaNodeState per node, the device
/// plugin's pools, NetworkAttachmentDefinitions, perftest admission.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Cli {
    /// Log level for kroce's own crates (off, error, warn, info, debug,
    /// trace; other crates stay at info or quieter), or a full tracing
    /// filter such as "info,kube=debug", used as it is. Unset: RUST_LOG,
    /// else info.
    #[arg(long, global = true, env = kroce_contracts::log::LOG_LEVEL_ENV)]
    log_level: Option<String>,
    #[command(subcommand)]
    cmd: Cmd,
}

// Parsed once at start: the size of `Run` costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
enum Cmd {
    /// Print the CRDs (RdmaNetwork, RdmaNodeState) as YAML.
    Crd,
    /// Run the cluster controller (a Deployment; one replica leads).
    Run {
        /// The operator's own namespace: device plugin ConfigMap and leader Lease.
        #[arg(long, env = "POD_NAMESPACE", default_value = "kroce-system")]
        namespace: String,
        /// Name of the shared device plugin ConfigMap (keys: <node>.yaml).
        #[arg(long, default_value = "kroce-device-plugin")]
        configmap: String,
        /// Address for /metrics and /health.
        #[arg(long, default_value = "0.0.0.0:8080")]
        listen: SocketAddr,
        /// Reconcile only while holding the Lease (needed with replicas > 1).
        /// A replica that loses the Lease exits non-zero and restarts.
        #[arg(long, default_value_t = true, action = clap::ArgAction::Set,
              num_args = 0..=1, default_missing_value = "true")]
        leader_election: bool,
        /// Name of the leader Lease (coordination.k8s.io/v1) in --namespace.
        #[arg(long, default_value = "kroce-operator")]
        lease_name: String,
        /// Seconds the Lease lives without renewal; the leader renews every
        /// 2/15 of it and gives up after 2/3 of it without a renewal.
        #[arg(long, default_value_t = 15, value_parser = clap::value_parser!(u64).range(3..=3600))]
        lease_duration_seconds: u64,
        /// This replica's name in the Lease (the pod name, from the downward API).
        #[arg(long, env = "POD_NAME")]
        leader_identity: Option<String>,
        /// When VFs that must go are held by pods: cordon that node (within
        /// --drain-max-unavailable), evict only those pods, uncordon when its
        /// VFs are in sync.
        #[arg(long, default_value_t = false, action = clap::ArgAction::Set,
              num_args = 0..=1, default_missing_value = "true")]
        drain_held_vfs: bool,
        /// Most nodes unschedulable at once while draining: a count ("3") or
        /// a percentage of the nodes with an RdmaNodeState ("10%", rounded
        /// down, at least 1). Nodes cordoned or not ready for other reasons
        /// count too. An RdmaNetwork's spec.maxUnavailable replaces it for
        /// the nodes that network needs drained.
        #[arg(long, default_value = "1")]
        drain_max_unavailable: kroce_contracts::max_unavailable::MaxUnavailable,
        /// A node not drained within this many seconds is released, reported
        /// (event DrainTimedOut, the network's status.drain) and skipped
        /// until its spec changes.
        #[arg(long, default_value_t = 1800, value_parser = clap::value_parser!(u64).range(60..=604_800))]
        drain_timeout_seconds: u64,
        /// Reboot nodes whose RDMA netns mode (RdmaNetwork spec.rdmaNetnsMode)
        /// only a reboot applies: within the drain's budget, cordon and
        /// drain the node (every pod but DaemonSet and static ones), ask its
        /// node agent to reboot the host (the agent needs
        /// --allow-host-reboot), uncordon once it reports the mode live. A
        /// node not back with it within --drain-timeout-seconds is released,
        /// reported (event RebootTimedOut, status.drain) and skipped until
        /// its spec changes. A reboot is a reboot: off by default.
        #[arg(long, default_value_t = false, action = clap::ArgAction::Set,
              num_args = 0..=1, default_missing_value = "true")]
        reboot_for_rdma_mode: bool,
        #[command(flatten)]
        admission: kroce_controller::admission::AdmissionArgs,
    },
}

fn init_tracing(level: Option<&str>) -> anyhow::Result<()> {
    let rust_log = std::env::var("RUST_LOG").ok();
    let directives = kroce_operator::logging::directives(level, rust_log.as_deref())?;
    let filter = tracing_subscriber::EnvFilter::try_new(&directives)
        .with_context(|| format!("bad log filter {directives:?}"))?;
    tracing_subscriber::fmt()
        // No colour codes in container logs.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .with_env_filter(filter)
        .init();
    tracing::debug!(filter = %directives, "log filter");
    Ok(())
}

fn main() -> anyhow::Result<()> {
    // The kube client's TLS needs a process-wide rustls provider; choose
    // ring explicitly so no combination of crate features leaves it
    // ambiguous (or absent: then the first client panics). An Err only
    // means one is installed already.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Crd => {
            print!("{}", kroce_operator::crd::crds_yaml()?);
            Ok(())
        }
        cmd => {
            init_tracing(cli.log_level.as_deref())?;
            tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?
                .block_on(serve_cluster(cmd))
        }
    }
}

async fn serve_cluster(cmd: Cmd) -> anyhow::Result<()> {
    match cmd {
        Cmd::Run {
            namespace,
            configmap,
            listen,
            leader_election,
            lease_name,
            lease_duration_seconds,
            leader_identity,
            drain_held_vfs,
            drain_max_unavailable,
            drain_timeout_seconds,
            reboot_for_rdma_mode,
            admission,
        } => {
            let drain_settings = kroce_controller::drain::DrainSettings {
                enabled: drain_held_vfs,
                max_unavailable: drain_max_unavailable,
                timeout: Duration::from_secs(drain_timeout_seconds),
                reboot: reboot_for_rdma_mode,
            };
            let identity = match (leader_election, leader_identity) {
                (true, None) => anyhow::bail!(
                    "--leader-election needs this replica's identity: set POD_NAME from the \
                     downward API (or --leader-identity), or pass --leader-election=false"
                ),
                (_, id) => id.unwrap_or_default(),
            };
            let client = kube::Client::try_default()
                .await
                .context("no Kubernetes client configuration (in-cluster or KUBECONFIG)")?;
            let metrics = Arc::new(Metrics::default());
            let mut registry = Registry::default();
            metrics.register(&mut registry);
            let health = Arc::new(Health::default());
            let server = tokio::spawn(serve(listen, Arc::new(registry), health.clone()));
            let settings = admission.settings();
            // The reconciler and the drain run together, and only while
            // leading; so do the watches (a follower keeps no stores).
            let work = {
                let (client, namespace) = (client.clone(), namespace.clone());
                move || async move {
                    let shared = kroce_controller::stores::start(
                        &client,
                        &namespace,
                        &configmap,
                        &settings.test_namespace,
                    )?;
                    let ctx = kroce_controller::Context::new(
                        client,
                        &namespace,
                        &configmap,
                        metrics,
                        shared.stores.clone(),
                    )
                    .with_admission(settings);
                    let drain = kroce_controller::drain::run(ctx.clone(), drain_settings);
                    tokio::select! {
                        r = kroce_controller::run(ctx, shared) => Ok::<(), anyhow::Error>(r?),
                        never = drain => match never {},
                    }
                }
            };
            let r = if leader_election {
                use kroce_controller::leader::{LeaderElector, LeaseTimings, lead};
                let mut elector = LeaderElector::new(
                    client,
                    &namespace,
                    &lease_name,
                    &identity,
                    LeaseTimings::for_duration(Duration::from_secs(lease_duration_seconds)),
                );
                lead(&mut elector, work, kroce_controller::signalled())
                    .await
                    .map(|_| ())
            } else {
                work().await
            };
            health
                .failed
                .store(true, std::sync::atomic::Ordering::Relaxed);
            server.abort();
            r
        }
        Cmd::Crd => Ok(()),
    }
}
