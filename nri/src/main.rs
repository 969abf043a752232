//! `kroce-nri`: the NRI plugin that gives RDMA containers their memlock limit.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, ValueEnum};
use kroce_nri::cni_requests::{DEFAULT_STATE_DIR, StateDir};
use kroce_nri::handler::Handler;
use kroce_nri::network::{CniOptions, InProcessCni, PodNetwork};
use kroce_nri::session::{self, Backoff, PluginState, SessionOptions};
use kroce_nri::status::StatusPath;
use kroce_nri::{
    DEFAULT_NRI_SOCKET, DEFAULT_PLUGIN_INDEX, DEFAULT_PLUGIN_NAME, Memlock, nri_reachable,
};

/// Sets RLIMIT_MEMLOCK (soft = hard) on every container that holds kroce RDMA
/// devices — device-plugin annotation kroce.io/rdma-devices.*, or device nodes
/// under /dev/infiniband/ — and on the containers of pods whose kroce-cni
/// attachment asked for memlock. Other containers are never touched. Needs NRI
/// enabled in the runtime (containerd >= 1.7.7, CRI-O >= 1.29).
#[derive(Debug, Parser)]
#[command(name = "kroce-nri", version)]
struct Cli {
    /// The runtime's NRI socket.
    #[arg(long, env = "KROCE_NRI_SOCKET", default_value = DEFAULT_NRI_SOCKET)]
    socket: PathBuf,

    /// kroce-cni's state directory (memlock requests are read from
    /// <dir>/memlock/<sandbox>.json, kroce-cni's, and
    /// <dir>/dra-memlock/<claim uid>.json, the DRA plugin's).
    #[arg(long, env = "KROCE_CNI_STATE_DIR", default_value = DEFAULT_STATE_DIR)]
    state_dir: PathBuf,

    /// Limit for RDMA containers that ask for none: "unlimited" or bytes. An
    /// explicit request (device-plugin annotation, CNI request or DRA claim)
    /// is used instead, larger or smaller.
    #[arg(long, env = "KROCE_DEFAULT_MEMLOCK", default_value = "unlimited")]
    default_memlock: Memlock,

    /// Where kroce-nri keeps its status for the node agent and doctor (the
    /// runtime's limits, the last capped request) [default: <state-dir>/nri-status.json].
    #[arg(long, env = "KROCE_NRI_STATUS_FILE")]
    status_file: Option<PathBuf>,

    /// Where the runtime's /proc/<pid> is read (its capabilities and memlock
    /// limit). The runtime's pid comes from the socket (SO_PEERCRED), so
    /// kroce-nri must share the host's PID namespace.
    #[arg(long, default_value = kroce_nri::runtime::DEFAULT_PROC_ROOT)]
    proc_root: PathBuf,

    /// Name to register with the runtime ([a-zA-Z0-9_.+-]).
    #[arg(long, default_value = DEFAULT_PLUGIN_NAME)]
    plugin_name: String,

    /// Two-digit index; the runtime calls plugins in ascending index order.
    #[arg(long, default_value = DEFAULT_PLUGIN_INDEX)]
    plugin_index: String,

    /// Seconds to wait for the runtime to acknowledge registration.
    #[arg(long, default_value_t = 5)]
    registration_timeout: u64,

    /// Longest wait between reconnection attempts, in seconds.
    #[arg(long, default_value_t = 30)]
    max_backoff: u64,

    /// Attach the VFs of DRA claims (the kroce DRA plugin's network-attach
    /// requests in <state-dir>/dra-attach/) to their pods at RunPodSandbox
    /// and release them at StopPodSandbox/RemovePodSandbox, with kroce-cni's
    /// ADD/DEL run in this process. Needs hostNetwork and CAP_NET_ADMIN.
    #[arg(long, env = "KROCE_DRA_NETWORK", default_value_t = true, action = clap::ArgAction::Set)]
    dra_network: bool,

    /// Longest a RunPodSandbox attach (or a release) may take, in ms, before
    /// the runtime is answered: an attach not done by then fails its sandbox
    /// (and is rolled back when it completes). Keep it below the runtime's
    /// NRI request timeout (containerd's plugin_request_timeout, default 2 s);
    /// it is also capped at 3/4 of the timeout the runtime announces.
    /// CreateContainer (memlock) answers never wait for an attach.
    #[arg(long, env = "KROCE_NRI_ATTACH_DEADLINE_MS", default_value_t = 1500, value_parser = clap::value_parser!(u64).range(100..=600_000))]
    attach_deadline_ms: u64,

    /// Where IPAM plugins are for DRA attachments (CNI_PATH, ':'-separated).
    #[arg(long, env = "KROCE_CNI_BIN_DIR", default_value = "/opt/cni/bin")]
    cni_bin_dir: String,

    /// Root of the host's sys/ and proc/ for kroce-cni (a container mounts
    /// the host's here) [default: /].
    #[arg(long, env = "KROCE_HOST_ROOT")]
    host_root: Option<PathBuf>,

    /// Only check that NRI is reachable, print what to do if not, and exit (0 = reachable).
    #[arg(long)]
    check: bool,

    /// Log level for kroce's own crates (error, warn, info, debug, trace;
    /// other crates stay at info or quieter), or a full tracing filter such
    /// as "info,h2=debug" used as it is [default: $RUST_LOG as a filter,
    /// else info].
    #[arg(long, env = kroce_contracts::log::LOG_LEVEL_ENV)]
    log_level: Option<String>,

    /// Log format on stderr.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(err) = init_logging(cli.log_level.as_deref(), cli.log_format) {
        eprintln!("kroce-nri: {err}");
        return ExitCode::from(2);
    }
    if cli.check {
        let status = nri_reachable(&cli.socket);
        println!("{}", status.message());
        if let Some(hint) = status.hint() {
            println!("{hint}");
            return ExitCode::FAILURE;
        }
        return ExitCode::SUCCESS;
    }
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            tracing::error!("{err:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(level: Option<&str>, format: LogFormat) -> anyhow::Result<()> {
    // The rule every kroce binary shares: a level is for kroce's crates only.
    let rust_log = std::env::var("RUST_LOG").ok();
    let directives = kroce_contracts::log::resolve(level, rust_log.as_deref())?;
    let filter = tracing_subscriber::EnvFilter::try_new(&directives)
        .map_err(|e| anyhow::anyhow!("bad log filter {directives:?}: {e}"))?;
    // No colour codes in container logs.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
    Ok(())
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let options = SessionOptions::new(
        &cli.plugin_name,
        &cli.plugin_index,
        Duration::from_secs(cli.registration_timeout),
    )
    .context("invalid --plugin-name/--plugin-index")?
    .with_proc_root(&cli.proc_root)
    .with_attach_deadline(Duration::from_millis(cli.attach_deadline_ms));
    let backoff = Backoff {
        initial: Duration::from_millis(500),
        max: Duration::from_secs(cli.max_backoff.max(1)),
    };
    let status_file = cli
        .status_file
        .clone()
        .unwrap_or_else(|| StatusPath::in_state_dir(&cli.state_dir).0);
    let mut handler = Handler::new(cli.default_memlock, StateDir::new(&cli.state_dir))
        .with_status(Box::new(StatusPath(status_file.clone())));
    if cli.dra_network {
        let opts = CniOptions {
            state_dir: cli.state_dir.clone(),
            host_root: cli.host_root.clone(),
            cni_path: std::env::split_paths(&cli.cni_bin_dir).collect(),
        };
        let cni = InProcessCni::new(opts.roots());
        handler = handler.with_network(Box::new(PodNetwork::new(opts, cni)));
    }
    let (state, _) = tokio::sync::watch::channel(PluginState::Connecting { last_error: None });

    tracing::info!(
        socket = %cli.socket.display(),
        state_dir = %cli.state_dir.display(),
        status_file = %status_file.display(),
        proc_root = %cli.proc_root.display(),
        default_memlock = %cli.default_memlock,
        dra_network = cli.dra_network,
        attach_deadline_ms = cli.attach_deadline_ms,
        name = options.name(),
        index = options.index(),
        "starting"
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async {
        let shutdown = async {
            let mut term =
                match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                    Ok(term) => term,
                    Err(err) => {
                        tracing::warn!("cannot watch SIGTERM: {err}");
                        let _ = tokio::signal::ctrl_c().await;
                        return;
                    }
                };
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            tracing::info!("stopping");
        };
        session::start(&cli.socket, &options, backoff, &handler, &state, shutdown).await;
    });
    Ok(())
}
