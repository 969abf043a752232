//! `kroce-node-agent`: the per-node agent (privileged DaemonSet), and the
//! same host code for an engineer on the node: `doctor` and `apply`.

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use kroce_node_agent::apply::{Agent, AgentConfig};
use kroce_node_agent::dcb::{NetlinkDcb, route_socket};
use kroce_node_agent::holders::{HolderSources, NodeHolders};
use kroce_node_agent::links::NetlinkLinks;
use kroce_node_agent::pf_record::FilePfRecord;
use kroce_node_agent::run::{AgentMetrics, RunConfig};
use kroce_node_agent::vfs::SysfsVfControl;
use kroce_operator::crd::{RdmaNodeStateSpec, SyncState};
use kroce_operator::http::Health;
use prometheus_client::registry::Registry;
use sriov_helpers::HostRoot;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Upper bound of every duration flag (a day): no deadline arithmetic can
/// overflow, and no typo waits for years.
const MAX_SECONDS: u64 = 86_400;

/// kroce node agent: applies this node's RdmaNodeState (VFs, NUMA-local
/// IRQs, RoCE QoS) and reports what it found.
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

#[derive(clap::Args, Debug)]
struct HostArgs {
    /// Root holding the host's sys/, proc/ and dev/ (e.g. /host when mounted there).
    #[arg(long, env = "KROCE_HOST_ROOT", default_value = "/")]
    host_root: PathBuf,
    /// Override the sysfs tree (default <host-root>/sys).
    #[arg(long)]
    sys_root: Option<PathBuf>,
    /// Override the procfs tree (default <host-root>/proc).
    #[arg(long)]
    proc_root: Option<PathBuf>,
    /// configfs mount (RDMA-CM defaults live under <configfs>/rdma_cm).
    #[arg(long, default_value = "/sys/kernel/config")]
    configfs: PathBuf,
    /// Seconds to wait for new VF netdevs and RDMA devices.
    #[arg(long, default_value_t = 120, value_parser = clap::value_parser!(u64).range(1..=MAX_SECONDS))]
    vf_wait_seconds: u64,
    /// The agent's own state (which PFs kroce changed and their VF count
    /// before; root-owned, 0700). Default <host-root>/var/lib/kroce/node-agent.
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// kroce-cni's state dir, read for the VFs its claims hold. Default
    /// <host-root>/var/lib/cni/kroce.
    #[arg(long)]
    cni_state_dir: Option<PathBuf>,
    /// The host's modprobe.d: the agent keeps its RDMA netns mode file
    /// there (`rdmaNetnsMode`). Default <host-root>/etc/modprobe.d.
    #[arg(long)]
    modprobe_dir: Option<PathBuf>,
    /// The DRA plugin's checkpoint, read for the VFs prepared claims hold.
    /// Default <host-root>/var/lib/kroce/dra/checkpoint.json.
    #[arg(long)]
    dra_checkpoint: Option<PathBuf>,
}

/// `abs` (an absolute host path) under `root`.
fn under(root: &std::path::Path, abs: &str) -> PathBuf {
    root.join(abs.trim_start_matches('/'))
}

impl HostArgs {
    fn state_dir(&self) -> PathBuf {
        self.state_dir.clone().unwrap_or_else(|| {
            under(
                &self.host_root,
                kroce_node_agent::pf_record::DEFAULT_STATE_DIR,
            )
        })
    }

    fn record(&self) -> FilePfRecord {
        FilePfRecord::new(self.state_dir())
    }

    fn netns_mode(&self) -> kroce_node_agent::netns_mode::KernelNetnsMode {
        kroce_node_agent::netns_mode::KernelNetnsMode {
            modprobe_dir: self.modprobe_dir.clone().unwrap_or_else(|| {
                under(
                    &self.host_root,
                    kroce_node_agent::netns_mode::DEFAULT_MODPROBE_DIR,
                )
            }),
        }
    }

    fn holder_sources(&self) -> HolderSources {
        HolderSources {
            cni_state_dir: self
                .cni_state_dir
                .clone()
                .unwrap_or_else(|| under(&self.host_root, kroce_contracts::DEFAULT_STATE_DIR)),
            dra_checkpoint: self
                .dra_checkpoint
                .clone()
                .unwrap_or_else(|| under(&self.host_root, "/var/lib/kroce/dra/checkpoint.json")),
            cni_state_required: false,
        }
    }

    fn agent_config(&self) -> AgentConfig {
        let base = HostRoot::new(&self.host_root);
        let root = HostRoot::with_paths(
            self.sys_root
                .clone()
                .unwrap_or_else(|| base.sys().to_path_buf()),
            self.proc_root
                .clone()
                .unwrap_or_else(|| base.proc().to_path_buf()),
            base.dev().to_path_buf(),
        );
        AgentConfig {
            root,
            configfs: self.configfs.clone(),
            vf_wait: Duration::from_secs(self.vf_wait_seconds),
            poll: Duration::from_millis(500),
        }
    }
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Run the node agent (one per node, privileged, host sysfs/procfs).
    Run {
        /// This node's name (from the downward API).
        #[arg(long, env = "NODE_NAME")]
        node_name: String,
        #[command(flatten)]
        host: HostArgs,
        /// Re-read the host and repair drift this often, seconds.
        #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=MAX_SECONDS))]
        resync_seconds: u64,
        /// Give up on a blocked sriov_numvfs write after this many seconds.
        #[arg(long, default_value_t = 120, value_parser = clap::value_parser!(u64).range(1..=MAX_SECONDS))]
        vf_write_timeout_seconds: u64,
        /// Status is written only when what the agent found changed, and
        /// again (a new `lastSyncTime`) at the first pass this many seconds
        /// after its last write: a `lastSyncTime` older than this plus
        /// `--resync-seconds` means the agent is not running.
        #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=MAX_SECONDS))]
        heartbeat_seconds: u64,
        /// The node checks of one pass (host scan, /proc, ethtool) may take
        /// this many seconds; then their last conditions are kept.
        #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=MAX_SECONDS))]
        checks_timeout_seconds: u64,
        /// The kubelet's PodResources socket, asked before each pass which
        /// VFs the device plugin assigned to running pods ("" to not ask:
        /// then only kroce-cni's claims and the DRA checkpoint count).
        // clap's PathBuf parser refuses "": parsed as an OS string.
        #[arg(long, default_value = "/var/lib/kubelet/pod-resources/kubelet.sock",
              value_parser = clap::builder::TypedValueParser::map(clap::builder::OsStringValueParser::new(), PathBuf::from))]
        pod_resources_socket: PathBuf,
        /// While IRQs wait for their device to open (a VF netdev still
        /// down), re-check them this often, seconds (when sooner than the
        /// resync).
        #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=MAX_SECONDS))]
        irq_recheck_seconds: u64,
        /// Address for /metrics and /health.
        #[arg(long, default_value = "0.0.0.0:8081")]
        listen: SocketAddr,
        #[command(flatten)]
        checks: kroce_node_agent::node_checks::NodeCheckArgs,
        /// Reboot the host when the controller asks (`--reboot-for-rdma-mode`:
        /// the node drained, its RDMA netns mode applying only at boot), via
        /// the host's `systemctl reboot` in PID 1's namespaces (needs
        /// hostPID). At most once per boot. Off: such requests are refused
        /// and reported.
        #[arg(long)]
        allow_host_reboot: bool,
    },
    /// Run the RoCE checks an engineer runs by hand against a host root and
    /// print a table (or --json); exit 1 when any check fails.
    Doctor {
        #[command(flatten)]
        host: HostArgs,
        #[command(flatten)]
        args: kroce_node_agent::doctor::DoctorArgs,
        #[command(flatten)]
        baseline: kroce_node_agent::baseline::BaselineArgs,
    },
    /// Apply an RdmaNodeState spec (YAML file) to this host once, without
    /// Kubernetes, and print the resulting status as JSON. Exit 0 when in
    /// sync, 2 when not.
    Apply {
        /// File with an RdmaNodeState spec (or a whole RdmaNodeState object).
        #[arg(long)]
        spec_file: PathBuf,
        #[command(flatten)]
        host: HostArgs,
        /// Ignored (kept so old scripts run): PFs that left the spec go back
        /// to the VF count they had before kroce changed them, from the
        /// record in --state-dir; PFs kroce never changed are left alone.
        #[arg(long, value_delimiter = ',', hide = true)]
        managed: Vec<String>,
        /// When the file is a whole RdmaNodeState carrying the controller's
        /// reboot request (`kroce.io/reboot-boot-id` = this boot's id) and
        /// the RDMA netns mode applies only at boot: reboot the host as
        /// `run --allow-host-reboot` does (at most once per boot, recorded
        /// in --state-dir). Off: such a request is refused and reported.
        #[arg(long)]
        allow_host_reboot: bool,
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

/// The spec, and the controller's reboot request when the file is a whole
/// object carrying one.
fn read_spec(path: &PathBuf) -> anyhow::Result<(RdmaNodeStateSpec, Option<String>)> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let value: serde_json::Value =
        serde_saphyr::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let requested = value
        .pointer(&format!(
            "/metadata/annotations/{}",
            kroce_node_agent::reboot::REBOOT_REQUEST_ANNOTATION.replace('/', "~1")
        ))
        .map(|v| {
            v.as_str().map(str::to_string).with_context(|| {
                format!(
                    "{}: annotation {} is not a string: {v}",
                    path.display(),
                    kroce_node_agent::reboot::REBOOT_REQUEST_ANNOTATION
                )
            })
        })
        .transpose()?;
    let spec = value.get("spec").cloned().unwrap_or(value);
    let spec = serde_json::from_value(spec)
        .with_context(|| format!("{}: not an RdmaNodeState spec", path.display()))?;
    Ok((spec, requested))
}

fn main() -> anyhow::Result<()> {
    // The kube client's TLS needs a process-wide rustls provider; choose
    // ring explicitly so no combination of crate features leaves it
    // ambiguous (or absent: then the first client panics). An Err only
    // means one is installed already.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Apply {
            spec_file,
            host,
            managed,
            allow_host_reboot,
        } => apply_once(&spec_file, &host, &managed, allow_host_reboot),
        Cmd::Doctor {
            host,
            args,
            baseline,
        } => match baseline.baseline {
            Some(mode) => baseline_once(mode, &host, &args, &baseline),
            None => doctor_once(&host, &args),
        },
        cmd => {
            init_tracing(cli.log_level.as_deref())?;
            tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?
                .block_on(serve_cluster(cmd))
        }
    }
}

/// `apply`: plain threads, no async runtime (the netlink edge brings its own).
fn apply_once(
    spec_file: &PathBuf,
    host: &HostArgs,
    managed: &[String],
    allow_host_reboot: bool,
) -> anyhow::Result<()> {
    let (spec, requested) = read_spec(spec_file)?;
    if !managed.is_empty() {
        eprintln!(
            "warning: --managed is ignored: PFs that left the spec go back to their VF count \
             from before kroce, as recorded in {}",
            host.record().path().display()
        );
    }
    let cfg = host.agent_config();
    let vfs = SysfsVfControl::new(cfg.root.clone(), cfg.vf_wait);
    let record = host.record();
    let links = NetlinkLinks::new();
    let dcb = NetlinkDcb::new(route_socket()?);
    let netns_mode = host.netns_mode();
    let agent = Agent {
        config: &cfg,
        vfs: &vfs,
        links: &links,
        dcb: &dcb,
        record: &record,
        netns_mode: &netns_mode,
    };
    // Without a kubelet to ask: the CNI claims and the DRA checkpoint.
    let holders = NodeHolders::read(&host.holder_sources());
    let mut outcome = agent.apply(&spec, &holders);
    for c in &outcome.changes {
        eprintln!("changed: {c}");
    }
    // As the run loop does with the request on its RdmaNodeState.
    let required = kroce_node_agent::reboot::reboot_required(&outcome.status.conditions);
    let reboot_edge = kroce_node_agent::reboot::SystemdReboot {
        proc_root: cfg.root.proc().to_path_buf(),
        state_dir: host.state_dir(),
    };
    let asked = kroce_node_agent::reboot::act(
        allow_host_reboot.then_some(&reboot_edge as &dyn kroce_node_agent::reboot::HostReboot),
        requested.as_deref(),
        required,
    );
    if let Some(boot) = &asked.asked {
        eprintln!("asked the host to reboot (RDMA netns mode; leaving boot {boot})");
    }
    kroce_node_agent::reboot::note_on(&mut outcome.status.conditions, &asked);
    println!("{}", serde_json::to_string_pretty(&outcome.status)?);
    if outcome.status.sync_state != SyncState::Succeeded {
        std::process::exit(2);
    }
    Ok(())
}

/// `doctor --baseline save|compare`: exit 1 on a regression, 2 when the
/// baseline could not be taken or read (the error names the file or flag).
fn baseline_once(
    mode: kroce_node_agent::baseline::BaselineMode,
    host: &HostArgs,
    args: &kroce_node_agent::doctor::DoctorArgs,
    baseline: &kroce_node_agent::baseline::BaselineArgs,
) -> anyhow::Result<()> {
    let file = baseline.file(&host.state_dir());
    let outcome =
        match kroce_node_agent::baseline::run(mode, baseline, host.agent_config().root, &file) {
            Ok(o) => o,
            Err(e) => {
                eprintln!("error: {e}");
                std::process::exit(2);
            }
        };
    print!("{}", outcome.render(args.json)?);
    if outcome.regressed() {
        std::process::exit(1);
    }
    Ok(())
}

/// `doctor`: the checks, a table or JSON on stdout, exit 1 when any fails.
fn doctor_once(host: &HostArgs, args: &kroce_node_agent::doctor::DoctorArgs) -> anyhow::Result<()> {
    use kroce_admission::doctor::Status;
    let cfg = args.config(host.agent_config().root, &host.host_root)?;
    // DCB state over netlink; without a socket, PFC is reported as unknown.
    let live = kroce_node_agent::doctor::HostNet {
        dcb: route_socket().ok().map(NetlinkDcb::new),
    };
    let report = kroce_node_agent::doctor::run(&cfg, &live)?;
    let netns = kroce_node_agent::netns_mode::doctor_line(&host.netns_mode());
    if args.json {
        println!("{}", report.to_json()?);
        // The JSON is the checks' own format: the mode goes to stderr.
        eprintln!("{netns}");
    } else {
        print!("{}", report.render_table());
        println!("{netns}");
    }
    if report.worst() == Status::Fail {
        std::process::exit(1);
    }
    Ok(())
}

async fn serve_cluster(cmd: Cmd) -> anyhow::Result<()> {
    match cmd {
        Cmd::Run {
            node_name,
            host,
            resync_seconds,
            vf_write_timeout_seconds,
            heartbeat_seconds,
            checks_timeout_seconds,
            pod_resources_socket,
            irq_recheck_seconds,
            listen,
            checks,
            allow_host_reboot,
        } => {
            let client = kube::Client::try_default()
                .await
                .context("no Kubernetes client configuration (in-cluster or KUBECONFIG)")?;
            let metrics = AgentMetrics::default();
            let mut registry = Registry::default();
            metrics.register(&mut registry);
            let health = Arc::new(Health::default());
            let agent = host.agent_config();
            let checks = checks.node_checks(&node_name, &agent.root, &host.host_root);
            // RDMA counters, VF pools and admission as of the last pass: a
            // scrape reads nothing.
            let counters = checks.metrics_source();
            let state = metrics.state.clone();
            let extra: kroce_operator::http::ExtraMetrics =
                Arc::new(move || format!("{}{}", counters(), state.text()));
            let server = tokio::spawn(kroce_operator::http::serve_with(
                listen,
                Arc::new(registry),
                health.clone(),
                Some(extra),
            ));
            let cfg = RunConfig {
                node_name,
                agent,
                resync: Duration::from_secs(resync_seconds),
                vf_write_timeout: Duration::from_secs(vf_write_timeout_seconds),
                checks: Some(checks),
                checks_timeout: Duration::from_secs(checks_timeout_seconds),
                heartbeat: Duration::from_secs(heartbeat_seconds),
                // In a cluster kroce-cni is installed with the agent: its
                // state dir missing means a missing mount, not "no claims".
                holders: HolderSources {
                    cni_state_required: true,
                    ..host.holder_sources()
                },
                irq_recheck: Duration::from_secs(irq_recheck_seconds),
                progress_after: Duration::from_secs(2),
            };
            let pod_resources: Option<Arc<dyn kroce_node_agent::run::PodResourcesSource>> =
                (!pod_resources_socket.as_os_str().is_empty()).then(|| {
                    Arc::new(kroce_node_agent::pod_resources::KubeletPodResources::new(
                        &pod_resources_socket,
                    )) as _
                });
            let record = Arc::new(host.record());
            let netns_mode = Arc::new(host.netns_mode());
            // Without the flag there is no reboot edge at all.
            let reboot: Option<Arc<dyn kroce_node_agent::reboot::HostReboot>> = allow_host_reboot
                .then(|| {
                    Arc::new(kroce_node_agent::reboot::SystemdReboot {
                        proc_root: cfg.agent.root.proc().to_path_buf(),
                        state_dir: host.state_dir(),
                    }) as _
                });
            let r = kroce_node_agent::run::run(
                client,
                cfg,
                record,
                netns_mode,
                reboot,
                pod_resources,
                metrics,
            )
            .await;
            health
                .failed
                .store(true, std::sync::atomic::Ordering::Relaxed);
            server.abort();
            Ok(r?)
        }
        Cmd::Apply { .. } | Cmd::Doctor { .. } => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 11: every duration flag is bounded, so no deadline arithmetic
    /// overflows (the old flags took any u64, and 0).
    #[test]
    fn duration_flags_are_bounded() {
        let base = ["kroce-node-agent", "run", "--node-name", "n1"];
        let parse = |extra: &[&str]| {
            let args: Vec<&str> = base.iter().chain(extra).copied().collect();
            Cli::try_parse_from(args)
        };
        assert!(parse(&[]).is_ok());
        for flag in [
            "--resync-seconds",
            "--vf-write-timeout-seconds",
            "--vf-wait-seconds",
            "--heartbeat-seconds",
            "--checks-timeout-seconds",
            "--irq-recheck-seconds",
            "--ethtool-timeout-seconds",
        ] {
            assert!(parse(&[flag, "1"]).is_ok(), "{flag} 1");
            for bad in ["0", "86401", "18446744073709551615"] {
                let err = parse(&[flag, bad])
                    .err()
                    .unwrap_or_else(|| panic!("{flag} {bad} accepted"))
                    .to_string();
                assert!(err.contains(flag) && err.contains(bad), "{err}");
            }
        }
        assert!(parse(&["--resync-seconds", "86400"]).is_ok());
        let Cmd::Run {
            heartbeat_seconds, ..
        } = parse(&[]).unwrap().cmd
        else {
            panic!("not run");
        };
        assert_eq!(heartbeat_seconds, 300);
        // `apply` and `doctor` share the VF wait.
        let err = Cli::try_parse_from([
            "kroce-node-agent",
            "apply",
            "--spec-file",
            "s",
            "--vf-wait-seconds",
            "0",
        ]);
        assert!(err.is_err());
    }

    /// `--pod-resources-socket ""` (do not ask the kubelet) and
    /// `--ethtool ""` (no ethtool) are documented; clap's PathBuf parser
    /// refused them.
    #[test]
    fn empty_pod_resources_socket_and_ethtool_are_accepted() {
        let cli = Cli::try_parse_from([
            "kroce-node-agent",
            "run",
            "--node-name",
            "n1",
            "--pod-resources-socket",
            "",
            "--ethtool",
            "",
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        let Cmd::Run {
            pod_resources_socket,
            checks,
            ..
        } = cli.cmd
        else {
            panic!("not run");
        };
        assert!(pod_resources_socket.as_os_str().is_empty());
        assert!(checks.ethtool.as_os_str().is_empty());
    }

    /// `apply` reads the controller's reboot request from a whole object,
    /// none from a bare spec, and names the annotation when it is not a
    /// string.
    #[test]
    fn apply_reads_the_reboot_request_of_a_whole_object() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: &str| {
            let p = dir.path().join(name);
            std::fs::write(&p, text).unwrap();
            p
        };
        let object = write(
            "object.yaml",
            "metadata:\n  name: n1\n  annotations:\n    kroce.io/reboot-boot-id: b-1\n\
             spec:\n  nodeName: n1\n",
        );
        let (spec, requested) = read_spec(&object).unwrap();
        assert_eq!(spec.node_name, "n1");
        assert_eq!(requested.as_deref(), Some("b-1"));
        let bare = write("spec.json", r#"{"nodeName": "n1"}"#);
        assert_eq!(read_spec(&bare).unwrap().1, None);
        let bad = write(
            "bad.json",
            r#"{"metadata": {"annotations": {"kroce.io/reboot-boot-id": 7}}, "spec": {"nodeName": "n1"}}"#,
        );
        let e = format!("{:#}", read_spec(&bad).unwrap_err());
        assert!(
            e.contains("kroce.io/reboot-boot-id") && e.contains("bad.json"),
            "{e}"
        );
    }
}
