//! kroce-dra-plugin: the DRA kubelet plugin of driver `rdma.kroce.io`.

use anyhow::Context;
use clap::Parser;
use kroce_dra::claims::KubeClaims;
use kroce_dra::network::{KubeClaimStatus, Reporter};
use kroce_dra::plugin::{self, Options, Plugin};
use kroce_dra::prepare::Paths;
use kroce_dra::publish::KubePublisher;
use kroce_dra::sharing::{FileRules, Layered, SharingRules};
use kroce_dra::slice::Sharing;
use sriov_helpers::HostRoot;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, Parser)]
#[command(
    name = "kroce-dra-plugin",
    version,
    about = "DRA kubelet plugin for RDMA (RoCE) VFs, RDMA PFs and soft RDMA devices (driver rdma.kroce.io)"
)]
struct Cli {
    /// This node's name: the pool name and the ResourceSlices' nodeName.
    #[arg(long, env = "NODE_NAME")]
    node_name: String,
    /// The kubelet's root dir (plugins_registry/ and plugins/ live there).
    #[arg(long, default_value = kroce_dra::driver::DEFAULT_KUBELET_DIR)]
    kubelet_dir: PathBuf,
    /// Root of the host's sys/, proc/ and dev/ (a container mounts the host's here).
    #[arg(long, default_value = "/")]
    host_root: PathBuf,
    /// Where the checkpoint of prepared claims is kept.
    #[arg(long, default_value = plugin::DEFAULT_STATE_DIR)]
    state_dir: PathBuf,
    #[arg(long, default_value = plugin::DEFAULT_CDI_DIR)]
    cdi_dir: PathBuf,
    #[arg(long, default_value = plugin::DEFAULT_DEVINFO_DIR)]
    devinfo_dir: PathBuf,
    /// Where memlock requests are recorded for kroce-nri; "" turns it off.
    #[arg(long, default_value = plugin::DEFAULT_MEMLOCK_DIR)]
    memlock_dir: PathBuf,
    /// Where network-attach requests for kroce-nri go, and its results are
    /// read back as the claims' networkData (kroce-cni's state dir +
    /// `dra-attach`); "" turns VF network attachment off.
    #[arg(long, default_value = kroce_contracts::network_attach::DEFAULT_DIR)]
    network_dir: PathBuf,
    /// The device plugin's pool config (the same file/ConfigMap): HCAs its
    /// `mode: shared` pools take are published as `sharedCount` slots
    /// `shared-<pci>-<i>`; devices its other pools take are left to the
    /// device plugin. Repeat to add files (read in order, the first
    /// matching pool wins). Re-read at every rescan; absent (no network on
    /// this node yet) or unset: every device is DRA's, no HCA shared.
    #[arg(long, env = "KROCE_DP_CONFIG", value_delimiter = ',')]
    device_plugin_config: Vec<PathBuf>,
    /// Host rescan interval in milliseconds.
    #[arg(long, default_value_t = 5000, value_parser = clap::value_parser!(u64).range(100..=600_000))]
    rescan_ms: u64,
    /// off, error, warn, info, debug, trace (kroce's crates only), or a
    /// full tracing filter. Without it, RUST_LOG, else info.
    #[arg(long, env = kroce_contracts::log::LOG_LEVEL_ENV)]
    log_level: Option<String>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // The one log-level rule of every kroce binary (kroce_contracts::log).
    let rust_log = std::env::var("RUST_LOG").ok();
    let directives = kroce_contracts::log::resolve(cli.log_level.as_deref(), rust_log.as_deref())?;
    let filter = tracing_subscriber::EnvFilter::try_new(&directives)
        .with_context(|| format!("bad log filter {directives:?}"))?;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .init();
    // Before any side effect: a sharing config that cannot be read is fatal.
    let sharing: Arc<dyn SharingRules> = if cli.device_plugin_config.is_empty() {
        Arc::new(Sharing::default())
    } else {
        let files = cli
            .device_plugin_config
            .iter()
            .map(|p| FileRules::load(p))
            .collect::<Result<Vec<_>, _>>()
            .context("--device-plugin-config")?;
        Arc::new(Layered(files))
    };
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = kube::Client::try_default()
        .await
        .context("cannot build a Kubernetes client (in-cluster config or KUBECONFIG)")?;
    let network_dir = (!cli.network_dir.as_os_str().is_empty()).then_some(cli.network_dir);
    // kroce-nri's results, reported as networkData; the task ends with main.
    if let Some(dir) = &network_dir {
        let reporter = Reporter::new(dir, Arc::new(KubeClaimStatus::new(client.clone())));
        tokio::spawn(reporter.run(Duration::from_secs(1)));
    }
    let opts = Options {
        node: cli.node_name,
        kubelet_dir: cli.kubelet_dir,
        host_root: HostRoot::new(&cli.host_root),
        paths: Paths {
            cdi_dir: cli.cdi_dir,
            devinfo_dir: cli.devinfo_dir,
            memlock_dir: (!cli.memlock_dir.as_os_str().is_empty()).then_some(cli.memlock_dir),
            network_dir: network_dir.clone(),
            dev_infiniband: Some(HostRoot::new(&cli.host_root).dev_infiniband()),
        },
        state_dir: cli.state_dir,
        rescan: Duration::from_millis(cli.rescan_ms),
    };
    let plugin = Plugin::start_with(
        opts,
        sharing,
        Arc::new(KubeClaims::new(client.clone())),
        Arc::new(KubePublisher::new(client)),
    )
    .await
    .context("cannot start the DRA plugin")?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("cannot handle SIGTERM")?;
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    tracing::info!("stopping: sockets removed, prepared claims stay checkpointed");
    plugin.stop().await;
    Ok(())
}
