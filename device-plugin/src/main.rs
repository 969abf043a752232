//! kroce-device-plugin: advertises RDMA VFs, soft RDMA devices and shared
//! HCAs to the kubelet. `discover` shows what it would advertise.

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use kroce_device_plugin::plugin::{self, Options};
use kroce_device_plugin::pod_resources::{self, PodResourcesClient};
use kroce_device_plugin::{config, discover, host_view::HostView, kubelet_checkpoint};
use sriov_helpers::HostRoot;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Parser)]
#[command(
    name = "kroce-device-plugin",
    version,
    about = "Kubelet device plugin for RDMA (RoCE) VFs, soft RDMA devices and shared HCAs.",
    long_about = "Kubelet device plugin for RDMA (RoCE) VFs, soft RDMA devices and shared HCAs.\n\n\
        Without a subcommand it runs the plugin: one socket and resource per pool in the \
        config, registered with the kubelet, re-registered when the kubelet restarts. The \
        config is reloaded when its file (or ConfigMap) changes; a bad new config is logged \
        and ignored.\n\nFirst time on a node? Run `kroce-device-plugin discover`."
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,

    /// Pool config file (YAML or JSON). Its directory is watched for changes.
    #[arg(long, global = true, env = "KROCE_DP_CONFIG", default_value = plugin::DEFAULT_CONFIG)]
    config: PathBuf,

    /// Root holding the host's sys/, proc/ and dev/ (set to the host mount
    /// when running in a container).
    #[arg(long, global = true, default_value = "/")]
    host_root: PathBuf,

    /// sysfs to read [default: <host-root>/sys].
    #[arg(long, global = true)]
    sysfs_root: Option<PathBuf>,

    /// /dev to check char devices in [default: <host-root>/dev]. Device specs
    /// handed to the kubelet always name /dev/infiniband/… on the node.
    #[arg(long, global = true)]
    dev_root: Option<PathBuf>,

    /// The kubelet's device plugin directory (kubelet.sock and plugin sockets).
    #[arg(long, global = true, default_value = plugin::DEFAULT_KUBELET_DIR)]
    kubelet_dir: PathBuf,

    /// The kubelet's PodResources socket (under its root dir): which devices
    /// running pods hold. Unreachable: the kubelet checkpoint is read instead.
    #[arg(long, global = true, env = "KROCE_DP_POD_RESOURCES_SOCKET", default_value = plugin::DEFAULT_POD_RESOURCES_SOCKET)]
    pod_resources_socket: PathBuf,

    /// How often, in milliseconds, PodResources is asked what pods hold on its
    /// own: a deleted pod's device-info files are removed within this.
    #[arg(long, global = true, env = "KROCE_DP_POD_RESOURCES_POLL_MS", default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(100..=3_600_000))]
    pod_resources_poll_ms: u64,

    /// Where device-info files (device-info-spec 1.1.0) are written for Multus/CNI.
    #[arg(long, global = true, default_value = plugin::DEFAULT_DEVINFO_DIR)]
    devinfo_dir: PathBuf,

    /// Where CDI specs are written in --cdi mode.
    #[arg(long, global = true, default_value = plugin::DEFAULT_CDI_DIR)]
    cdi_dir: PathBuf,

    /// Hand devices to containers as CDI devices instead of device specs
    /// (needs containerd 1.7+ or CRI-O with CDI enabled).
    #[arg(long, global = true, env = "KROCE_DP_CDI")]
    cdi: bool,

    /// The safety rescan, in milliseconds: kernel events (link changes,
    /// uevents) trigger rescans at once; this catches anything they miss.
    /// Without kernel events the plugin rescans at least every 1000 ms.
    #[arg(long, global = true, default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(100..=3_600_000))]
    rescan_ms: u64,

    /// Log level for kroce's own crates (error, warn, info, debug, trace;
    /// other crates stay at info or quieter), or a full tracing filter such
    /// as "info,h2=debug" (anything with '=' or ',') used as it is
    /// [default: $RUST_LOG as a filter, else info].
    #[arg(long, global = true, env = "KROCE_LOG_LEVEL")]
    log_level: Option<String>,

    /// Log format.
    #[arg(long, global = true, env = "KROCE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Show every device the plugin sees, its health and the pool it lands in.
    Discover {
        /// JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

impl Cli {
    fn host_root(&self) -> HostRoot {
        HostRoot::with_paths(
            self.sysfs_root
                .clone()
                .unwrap_or_else(|| self.host_root.join("sys")),
            self.host_root.join("proc"),
            self.dev_root
                .clone()
                .unwrap_or_else(|| self.host_root.join("dev")),
        )
    }
}

fn init_logs(cli: &Cli) -> anyhow::Result<()> {
    // A level applies to kroce's crates only (debug must not turn on h2's
    // frame logs); a full filter, or RUST_LOG, is used as it is.
    let rust_log = std::env::var("RUST_LOG").ok();
    let directives = kroce_contracts::log::resolve(cli.log_level.as_deref(), rust_log.as_deref())?;
    let filter = tracing_subscriber::EnvFilter::try_new(&directives)
        .with_context(|| format!("bad log filter {directives:?}"))?;
    // No colour codes in container logs.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    match cli.log_format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    init_logs(&cli)?;
    match &cli.command {
        Some(Command::Discover { json }) => discover_cmd(&cli, *json),
        None => run_cmd(&cli),
    }
}

fn discover_cmd(cli: &Cli, json: bool) -> anyhow::Result<()> {
    let cfg = match config::load(&cli.config) {
        Ok((_, c)) => Some(c),
        Err(e) => {
            eprintln!("note: {e}; showing devices without pools");
            None
        }
    };
    let view = HostView::scan(&cli.host_root());
    let allocated = allocated_devices(cli);
    let report = discover::report(&view, cfg.as_ref(), &allocated);
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", discover::table(&report));
    }
    Ok(())
}

/// What pods hold, from PodResources, else the kubelet checkpoint.
fn allocated_devices(cli: &Cli) -> pod_resources::Assigned {
    let listed = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())
        .and_then(|rt| {
            rt.block_on(PodResourcesClient::new(&cli.pod_resources_socket).list())
                .map_err(|e| e.to_string())
        });
    match listed {
        Ok(a) => a,
        Err(e) => {
            eprintln!("note: {e}; reading the kubelet checkpoint instead");
            kubelet_checkpoint::read(&cli.kubelet_dir)
        }
    }
}

fn run_cmd(cli: &Cli) -> anyhow::Result<()> {
    let opts = Options {
        host_root: cli.host_root(),
        kubelet_dir: cli.kubelet_dir.clone(),
        devinfo_dir: cli.devinfo_dir.clone(),
        cdi_dir: cli.cdi_dir.clone(),
        cdi: cli.cdi,
        config_path: cli.config.clone(),
        rescan_interval: Duration::from_millis(cli.rescan_ms),
        kernel_events: true,
        counters: Default::default(),
        pod_resources_socket: cli.pod_resources_socket.clone(),
        pod_resources_poll: Duration::from_millis(cli.pod_resources_poll_ms),
        allocation_grace: plugin::DEFAULT_ALLOCATION_GRACE,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    rt.block_on(async {
        let shutdown = async {
            let mut term =
                match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::error!(error = %e, "cannot catch SIGTERM; Ctrl-C only");
                        let _ = tokio::signal::ctrl_c().await;
                        return;
                    }
                };
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        };
        plugin::run(opts, shutdown).await
    })?;
    Ok(())
}
