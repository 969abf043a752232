//! One NRI connection (register, then serve the runtime's requests) and the
//! reconnect loop around it.
//!
//! On the trunk, the plugin is the ttrpc *client* of the runtime's Runtime
//! service on mux conn 2 (it sends `RegisterPlugin` there) and the ttrpc
//! *server* of its own Plugin service on mux conn 1 (the runtime sends
//! `Configure`, `Synchronize`, `CreateContainer`, ... there).

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prost::Message;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::cni_requests::MemlockRequests;
use crate::handler::{Handler, Notice, PodJob};
use crate::mux::{self, MuxError, PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN};
use crate::proto::{RUNTIME_SERVICE, api, envelope};
use crate::ttrpc::{self, Decoded, Reply, TtrpcError, code};

/// What we send as `RegisterPluginRequest.NRI_version` (containerd logs it
/// at registration, "unknown" when empty). NRI's Go stub sends its module
/// version; this plugin has none, so it names itself and its version.
pub const NRI_VERSION: &str = concat!("kroce-nri/", env!("CARGO_PKG_VERSION"));

/// Stream ID of our one request (RegisterPlugin): client streams are odd.
const REGISTER_STREAM: u32 = 1;

/// How long a pod's network work may take before its answer goes out
/// anyway: below containerd's default NRI `plugin_request_timeout` (2 s),
/// so a slow attach fails its own sandbox instead of timing out the plugin.
pub const DEFAULT_ATTACH_DEADLINE: Duration = Duration::from_millis(1500);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OptionsError {
    #[error("plugin name {0:?} is empty or has characters outside [a-zA-Z0-9_.+-]")]
    Name(String),
    #[error("plugin index {0:?} is not two digits (00-99)")]
    Index(String),
}

/// How the plugin registers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionOptions {
    name: String,
    index: String,
    registration_timeout: Duration,
    /// Where the runtime's `/proc/<pid>` is read (see [`crate::runtime`]).
    proc_root: PathBuf,
    /// Longest wait for a pod's attach or release before answering.
    attach_deadline: Duration,
}

impl SessionOptions {
    /// Validates `name` and `index` as the NRI runtime will.
    pub fn new(
        name: &str,
        index: &str,
        registration_timeout: Duration,
    ) -> Result<Self, OptionsError> {
        let name_ok = !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'+'));
        if !name_ok {
            return Err(OptionsError::Name(name.to_owned()));
        }
        if !(index.len() == 2 && index.bytes().all(|b| b.is_ascii_digit())) {
            return Err(OptionsError::Index(index.to_owned()));
        }
        Ok(SessionOptions {
            name: name.to_owned(),
            index: index.to_owned(),
            registration_timeout,
            proc_root: PathBuf::from(crate::runtime::DEFAULT_PROC_ROOT),
            attach_deadline: DEFAULT_ATTACH_DEADLINE,
        })
    }

    /// The longest a RunPodSandbox attach (or a release) may take before the
    /// runtime is answered; also capped at 3/4 of the request timeout the
    /// runtime announces in Configure.
    pub fn with_attach_deadline(mut self, deadline: Duration) -> Self {
        self.attach_deadline = deadline;
        self
    }

    pub fn attach_deadline(&self) -> Duration {
        self.attach_deadline
    }

    /// Reads the runtime's `/proc/<pid>` under `proc_root` instead of `/proc`.
    pub fn with_proc_root(mut self, proc_root: impl Into<PathBuf>) -> Self {
        self.proc_root = proc_root.into();
        self
    }

    pub fn proc_root(&self) -> &Path {
        &self.proc_root
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn index(&self) -> &str {
        &self.index
    }
}

/// Reconnect delays: doubling from `initial` up to `max`, reset after a
/// connection that registered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub initial: Duration,
    pub max: Duration,
}

impl Backoff {
    pub fn next(&self, current: Duration) -> Duration {
        (current * 2).min(self.max).max(self.initial)
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            initial: Duration::from_millis(500),
            max: Duration::from_secs(30),
        }
    }
}

/// Where the plugin stands, for health reporting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PluginState {
    /// Not (yet) registered; `last_error` says why the last attempt ended.
    Connecting { last_error: Option<String> },
    /// The runtime accepted the registration.
    Registered,
    /// The runtime configured us: container creations reach the plugin.
    Configured {
        runtime_name: String,
        runtime_version: String,
    },
}

/// Why a connection ended.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("connecting to NRI socket {socket}: {source}")]
    Connect { socket: PathBuf, source: io::Error },
    #[error("NRI connection: {0}")]
    Io(#[from] io::Error),
    #[error("the runtime closed the NRI connection")]
    Closed,
    #[error("malformed NRI trunk: {0}")]
    Mux(#[from] MuxError),
    #[error("cannot encode a reply: {0}")]
    Encode(#[from] TtrpcError),
    #[error("the runtime rejected the registration (code {code}): {message}")]
    Rejected { code: i32, message: String },
    #[error("the runtime did not acknowledge the registration within {0:?}")]
    RegistrationTimeout(Duration),
}

/// How one connection ended.
#[derive(Debug)]
pub struct SessionEnd {
    /// Whether the runtime had accepted our registration.
    pub registered: bool,
    pub cause: SessionError,
}

/// Serves one connection until it ends. Never panics on peer input: a bad
/// request gets an error reply, a trunk that cannot be parsed ends the
/// connection (and the caller reconnects).
pub async fn serve<S, R>(
    stream: S,
    options: &SessionOptions,
    handler: &Handler<R>,
    state: &watch::Sender<PluginState>,
) -> SessionEnd
where
    S: AsyncRead + AsyncWrite + Unpin,
    R: MemlockRequests,
{
    let mut registered = false;
    let cause = match serve_inner(stream, options, handler, state, &mut registered).await {
        Ok(never) => match never {},
        Err(cause) => cause,
    };
    SessionEnd { registered, cause }
}

enum Never {}

async fn serve_inner<S, R>(
    stream: S,
    options: &SessionOptions,
    handler: &Handler<R>,
    state: &watch::Sender<PluginState>,
    registered: &mut bool,
) -> Result<Never, SessionError>
where
    S: AsyncRead + AsyncWrite + Unpin,
    R: MemlockRequests,
{
    let (mut reader, mut writer) = tokio::io::split(stream);

    let register = api::RegisterPluginRequest {
        plugin_name: options.name.clone(),
        plugin_idx: options.index.clone(),
        nri_version: NRI_VERSION.to_owned(),
    };
    let frame = ttrpc::encode_request(
        REGISTER_STREAM,
        RUNTIME_SERVICE,
        "RegisterPlugin",
        register.encode_to_vec(),
    )?;
    writer
        .write_all(&mux::encode(RUNTIME_SERVICE_CONN, &frame))
        .await?;
    tracing::debug!(name = %options.name, index = %options.index, version = NRI_VERSION, "registering");

    let deadline = tokio::time::Instant::now() + options.registration_timeout;
    let mut trunk = mux::Decoder::new();
    let mut plugin_conn = ttrpc::Decoder::new();
    let mut runtime_conn = ttrpc::Decoder::new();
    let mut buf = vec![0u8; 64 * 1024];
    // Pods' network work in flight: each answers when it is done (or at its
    // deadline); meanwhile every other request is read and answered.
    let mut inflight: JoinSet<(u32, Reply)> = JoinSet::new();
    let sandboxes = SandboxLocks::default();

    loop {
        let n = tokio::select! {
            read = reader.read(&mut buf) => read?,
            () = tokio::time::sleep_until(deadline), if !*registered => {
                return Err(SessionError::RegistrationTimeout(options.registration_timeout));
            }
            Some(done) = inflight.join_next() => {
                match done {
                    Ok((stream_id, reply)) => {
                        let frame = ttrpc::encode_response(stream_id, &reply)?;
                        writer
                            .write_all(&mux::encode(PLUGIN_SERVICE_CONN, &frame))
                            .await?;
                    }
                    // Our tasks catch the work's panics; a cancelled one has no reply.
                    Err(e) => tracing::error!(error = %e, "pod network task lost"),
                }
                continue;
            }
        };
        if n == 0 {
            return Err(SessionError::Closed);
        }
        trunk.push(&buf[..n]);
        while let Some(frame) = trunk.next_frame()? {
            match frame.conn {
                PLUGIN_SERVICE_CONN => plugin_conn.push(&frame.payload),
                RUNTIME_SERVICE_CONN => runtime_conn.push(&frame.payload),
                // Go's mux drops frames for connections nobody opened.
                other => tracing::warn!(
                    conn = other,
                    len = frame.payload.len(),
                    "frame for unknown mux conn dropped"
                ),
            }
        }

        while let Some(item) = runtime_conn.next_message() {
            if let Some(reply) = registration_reply(item) {
                match reply {
                    Reply::Ok(_) => {
                        *registered = true;
                        state.send_replace(PluginState::Registered);
                        tracing::info!(name = %options.name, index = %options.index, "registered with the runtime");
                    }
                    Reply::Err { code, message } => {
                        return Err(SessionError::Rejected { code, message });
                    }
                }
            }
        }

        while let Some(item) = plugin_conn.next_message() {
            let item = match take_pod_job(item, handler) {
                Taken::Job(stream_id, job) => {
                    let limit = effective_deadline(
                        options.attach_deadline,
                        handler.runtime_request_timeout(),
                    );
                    inflight.spawn(run_pod_job(stream_id, job, limit, sandboxes.clone()));
                    continue;
                }
                Taken::Not(item) => item,
            };
            if let Some((stream_id, reply)) = answer(item, handler, state) {
                let frame = ttrpc::encode_response(stream_id, &reply)?;
                writer
                    .write_all(&mux::encode(PLUGIN_SERVICE_CONN, &frame))
                    .await?;
            }
        }
    }
}

enum Taken {
    Job(u32, PodJob),
    Not(Decoded),
}

/// A request that is a pod's network work, taken out to run on its own.
fn take_pod_job<R: MemlockRequests>(item: Decoded, handler: &Handler<R>) -> Taken {
    if handler.events() & crate::handler::NETWORK_EVENTS == 0 {
        return Taken::Not(item);
    }
    let Decoded::Message { header, data } = &item else {
        return Taken::Not(item);
    };
    if header.kind != ttrpc::TYPE_REQUEST {
        return Taken::Not(item);
    }
    let Ok(request) = envelope::Request::decode(data.as_slice()) else {
        return Taken::Not(item);
    };
    match handler.pod_job(&request.service, &request.method, &request.payload) {
        Some(job) => Taken::Job(header.stream_id, job),
        None => Taken::Not(item),
    }
}

/// The flag's deadline, kept below the runtime's own request timeout when
/// it announced one (3/4 of it: the answer must also travel back).
pub fn effective_deadline(flag: Duration, runtime_timeout: Option<Duration>) -> Duration {
    match runtime_timeout {
        Some(t) if !t.is_zero() => flag.min(t * 3 / 4),
        _ => flag,
    }
}

/// One lock per sandbox: its release waits for its attach (and the other
/// way round), while different sandboxes proceed in parallel. Also the
/// sandboxes whose attach missed its deadline and still runs ("late"): the
/// runtime has failed them, and the late attach undoes itself when it ends.
#[derive(Debug, Default, Clone)]
struct SandboxLocks {
    locks: Arc<Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>>,
    late: Arc<Mutex<HashSet<String>>>,
}

impl SandboxLocks {
    fn of(&self, sandbox: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut map = self
            .locks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Forget sandboxes nobody works on any more.
        map.retain(|_, l| Arc::strong_count(l) > 1);
        map.entry(sandbox.to_owned()).or_default().clone()
    }

    fn late(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.late
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Whether the runtime gets the work's answer; decided once, under the
/// lock, by whichever comes first: the work finishing or its task ending
/// (the deadline, or the connection going away).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Fate {
    Pending,
    Done(Reply),
    /// Answered without the work: an attach that still succeeds is undone.
    Abandoned,
}

type SharedFate = Arc<Mutex<Fate>>;

fn lock_fate(f: &SharedFate) -> std::sync::MutexGuard<'_, Fate> {
    f.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Marks the work abandoned if its task ends before the work did; gives
/// the work's reply if it made it. An attach abandoned at its deadline marks
/// its sandbox late (in the same step, so the work sees both or neither).
struct Abandon {
    fate: SharedFate,
    late: Option<(SandboxLocks, String)>,
}

impl Abandon {
    fn now(&self) -> Option<Reply> {
        let mut fate = lock_fate(&self.fate);
        match &*fate {
            Fate::Done(reply) => Some(reply.clone()),
            _ => {
                *fate = Fate::Abandoned;
                if let Some((locks, sandbox)) = &self.late {
                    locks.late().insert(sandbox.clone());
                }
                None
            }
        }
    }
}

impl Drop for Abandon {
    fn drop(&mut self) {
        let mut fate = lock_fate(&self.fate);
        if *fate == Fate::Pending {
            *fate = Fate::Abandoned;
        }
    }
}

/// Runs a pod's network work on a worker thread and answers within
/// `deadline`: an attach not done by then fails its sandbox with a clear
/// error (and is rolled back when it completes), a release is answered OK
/// and goes on. Waiting for the sandbox's lock counts against the deadline.
///
/// A release of a late sandbox is answered at once and runs after the late
/// attach: containerd holds one lock over every NRI call on the node while
/// it waits for an answer (`nri/pkg/adaptation`), so waiting here for the
/// late attach would stall every other pod's start by up to another
/// deadline, for nothing (the late attach undoes itself).
async fn run_pod_job(
    stream_id: u32,
    job: PodJob,
    deadline: Duration,
    locks: SandboxLocks,
) -> (u32, Reply) {
    let started = tokio::time::Instant::now();
    let sandbox = job.facts.sandbox_id.clone();
    let lock = locks.of(&sandbox);
    if !job.is_attach() && locks.late().contains(&sandbox) {
        tracing::info!(sandbox = %sandbox, method = job.method(), "release answered at once: the sandbox's late attachment is still running and rolls itself back; the release runs after it");
        tokio::spawn(async move {
            let held = lock.lock_owned().await;
            let _ = tokio::task::spawn_blocking(move || {
                let _held = held;
                job.run()
            })
            .await;
        });
        return (stream_id, Reply::Ok(Vec::new()));
    }
    let fate: SharedFate = Arc::new(Mutex::new(Fate::Pending));
    let abandon = Abandon {
        fate: fate.clone(),
        late: job.is_attach().then(|| (locks.clone(), sandbox.clone())),
    };
    let work = {
        let job = job.clone();
        async move {
            let held = lock.lock_owned().await;
            let done = tokio::task::spawn_blocking(move || {
                let _held = held;
                let netns = job.hold_netns();
                let (reply, attached) = job.run();
                let mut f = lock_fate(&fate);
                if *f == Fate::Abandoned {
                    drop(f);
                    if attached > 0 {
                        job.roll_back(netns.as_ref());
                    }
                    locks.late().remove(&job.facts.sandbox_id);
                } else {
                    *f = Fate::Done(reply);
                }
            })
            .await;
            if let Err(e) = done {
                // A panic in the work: answered as an error, nothing to undo known.
                tracing::error!(error = %e, "pod network work failed");
            }
        }
    };
    let finished = tokio::time::timeout_at(started + deadline, work)
        .await
        .is_ok();
    match abandon.now() {
        Some(reply) => (stream_id, reply),
        None if finished => (
            stream_id,
            Reply::error(
                code::INTERNAL,
                "kroce-nri: pod network work failed (see the plugin's log)",
            ),
        ),
        None => {
            let facts = &job.facts;
            let pod = format!("{}/{}", facts.namespace, facts.name);
            if job.is_attach() {
                tracing::error!(sandbox = %facts.sandbox_id, pod = %pod, deadline = ?deadline, "network attachment did not finish in time; the sandbox fails and the attachment is rolled back when it completes");
                let message = format!(
                    "kroce-nri: attaching the DRA network of sandbox {} ({pod}) did not finish within {deadline:?} (kept below the runtime's NRI request timeout); the sandbox fails and the attachment is rolled back when it completes",
                    facts.sandbox_id
                );
                (stream_id, Reply::error(code::DEADLINE_EXCEEDED, message))
            } else {
                tracing::warn!(sandbox = %facts.sandbox_id, pod = %pod, method = job.method(), deadline = ?deadline, "VF release did not finish in time; answered, and it goes on");
                (stream_id, Reply::Ok(Vec::new()))
            }
        }
    }
}

/// The registration result, if `item` is the runtime's answer to it.
fn registration_reply(item: Decoded) -> Option<Reply> {
    match item {
        Decoded::Message { header, data }
            if header.kind == ttrpc::TYPE_RESPONSE && header.stream_id == REGISTER_STREAM =>
        {
            match envelope::Response::decode(data.as_slice()) {
                Ok(response) => Some(Reply::from_response(response)),
                Err(err) => Some(Reply::error(
                    code::INTERNAL,
                    format!("undecodable RegisterPlugin response: {err}"),
                )),
            }
        }
        other => {
            tracing::warn!(item = ?header_of(&other), "unexpected message on the runtime service conn; ignored");
            None
        }
    }
}

/// The reply to a message on the plugin service conn (None: nothing to answer).
fn answer<R: MemlockRequests>(
    item: Decoded,
    handler: &Handler<R>,
    state: &watch::Sender<PluginState>,
) -> Option<(u32, Reply)> {
    match item {
        Decoded::Oversized { header } => {
            tracing::warn!(
                stream = header.stream_id,
                len = header.length,
                "oversized ttrpc message skipped"
            );
            (header.kind == ttrpc::TYPE_REQUEST).then(|| {
                (
                    header.stream_id,
                    Reply::error(
                        code::RESOURCE_EXHAUSTED,
                        format!(
                            "message length {} exceeds maximum message size of {}",
                            header.length,
                            ttrpc::MAX_DATA_LEN
                        ),
                    ),
                )
            })
        }
        Decoded::Message { header, data } if header.kind == ttrpc::TYPE_REQUEST => {
            let reply = match envelope::Request::decode(data.as_slice()) {
                Ok(request) => {
                    let handled =
                        handler.handle(&request.service, &request.method, &request.payload);
                    match handled.notice {
                        Some(Notice::Configured {
                            runtime_name,
                            runtime_version,
                        }) => {
                            state.send_replace(PluginState::Configured {
                                runtime_name,
                                runtime_version,
                            });
                        }
                        Some(Notice::Shutdown) | None => {}
                    }
                    handled.reply
                }
                Err(err) => {
                    tracing::warn!(stream = header.stream_id, error = %err, "undecodable ttrpc request");
                    Reply::error(
                        code::INVALID_ARGUMENT,
                        format!("undecodable ttrpc request: {err}"),
                    )
                }
            };
            Some((header.stream_id, reply))
        }
        Decoded::Message { header, .. } => {
            tracing::warn!(
                ?header,
                "unexpected ttrpc message type on the plugin service conn; ignored"
            );
            None
        }
    }
}

fn header_of(item: &Decoded) -> ttrpc::Header {
    match item {
        Decoded::Message { header, .. } | Decoded::Oversized { header } => *header,
    }
}

/// Connects to the NRI socket and serves the connection until it ends.
pub async fn connect_and_serve<R: MemlockRequests>(
    socket: &Path,
    options: &SessionOptions,
    handler: &Handler<R>,
    state: &watch::Sender<PluginState>,
) -> SessionEnd {
    match tokio::net::UnixStream::connect(socket).await {
        Ok(stream) => {
            tracing::debug!(socket = %socket.display(), "connected");
            // The peer is the runtime that will apply our limits: learn
            // what it can grant before the first CreateContainer.
            let observed = crate::runtime::peer_pid(&stream)
                .and_then(|pid| crate::runtime::read(&options.proc_root, pid));
            handler.runtime_connected(observed);
            serve(stream, options, handler, state).await
        }
        Err(source) => SessionEnd {
            registered: false,
            cause: SessionError::Connect {
                socket: socket.to_owned(),
                source,
            },
        },
    }
}

/// The plugin's whole life: say once at start-up if the NRI socket is not
/// there (without connecting), then [`run`] until `shutdown` completes.
pub async fn start<R, F>(
    socket: &Path,
    options: &SessionOptions,
    backoff: Backoff,
    handler: &Handler<R>,
    state: &watch::Sender<PluginState>,
    shutdown: F,
) where
    R: MemlockRequests,
    F: Future<Output = ()>,
{
    // Only look at the file: a probe connection that never registers makes
    // containerd log an error on every start.
    if let Some(status) = crate::reachability::socket_problem(socket) {
        tracing::warn!(
            "{} — will keep retrying. {}",
            status.message(),
            status.hint().unwrap_or("")
        );
    }
    run(socket, options, backoff, handler, state, shutdown).await;
}

/// Keeps the plugin connected until `shutdown` completes: connect, register,
/// serve; when the runtime goes away, wait (with backoff) and start over.
pub async fn run<R, F>(
    socket: &Path,
    options: &SessionOptions,
    backoff: Backoff,
    handler: &Handler<R>,
    state: &watch::Sender<PluginState>,
    shutdown: F,
) where
    R: MemlockRequests,
    F: Future<Output = ()>,
{
    tokio::pin!(shutdown);
    let mut delay = backoff.initial;
    let mut last_error = String::new();
    loop {
        let end = tokio::select! {
            () = &mut shutdown => return,
            end = connect_and_serve(socket, options, handler, state) => end,
        };
        if end.registered {
            delay = backoff.initial;
        }
        let error = end.cause.to_string();
        // Say it once; a runtime that stays away must not flood the log.
        if error == last_error {
            tracing::debug!(retry_in = ?delay, "{error}");
        } else {
            tracing::warn!(retry_in = ?delay, "{error}");
        }
        state.send_replace(PluginState::Connecting {
            last_error: Some(error.clone()),
        });
        last_error = error;
        tokio::select! {
            () = &mut shutdown => return,
            () = tokio::time::sleep(delay) => {}
        }
        delay = backoff.next(delay);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_validated_as_nri_does() {
        let t = Duration::from_secs(5);
        assert!(SessionOptions::new("kroce-memlock", "50", t).is_ok());
        assert!(SessionOptions::new("a_b.c+d", "00", t).is_ok());
        assert_eq!(
            SessionOptions::new("kroce memlock", "50", t),
            Err(OptionsError::Name("kroce memlock".into()))
        );
        assert_eq!(
            SessionOptions::new("", "50", t),
            Err(OptionsError::Name(String::new()))
        );
        for bad in ["5", "500", "a1", ""] {
            assert_eq!(
                SessionOptions::new("x", bad, t),
                Err(OptionsError::Index(bad.into()))
            );
        }
    }

    #[test]
    fn backoff_doubles_up_to_max() {
        let b = Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_millis(350),
        };
        assert_eq!(
            b.next(Duration::from_millis(100)),
            Duration::from_millis(200)
        );
        assert_eq!(
            b.next(Duration::from_millis(200)),
            Duration::from_millis(350)
        );
        assert_eq!(
            b.next(Duration::from_millis(350)),
            Duration::from_millis(350)
        );
    }
}
