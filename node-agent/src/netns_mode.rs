//! The host's RDMA netns mode, as the networks on this node ask
//! (`RdmaNetwork.spec.rdmaNetnsMode`, folded into the node spec's
//! `rdmaNetnsModes`).
//!
//! Two places hold it. The live mode is the kernel's
//! `ib_devices_shared_netns` (drivers/infiniband/core/device.c), read and
//! set over RDMA netlink (`RDMA_NLDEV_CMD_SYS_GET` / `SYS_SET`, what `rdma
//! system show|set netns` sends). The kernel changes it only while no netns
//! but the initial one exists: `rdma_compatdev_set` returns -EBUSY
//! otherwise, and on a Kubernetes node pods' netns always exist. So the
//! persistent place matters: ib_core's module parameter `netns_mode`
//! (`module_param_named(netns_mode, ib_devices_shared_netns, bool, 0444)`:
//! 1 shared, 0 exclusive) in a file kroce owns under the host's
//! `/etc/modprobe.d`, read when ib_core loads at the next boot.
//!
//! [`plan`] is pure (table-tested); [`apply`] runs its actions over the
//! narrow [`NetnsModeHost`].

pub use kroce_netlink::rdma::RdmaNetnsMode;
use kroce_netlink::rdma::{self as msgs};
use kroce_netlink::{NlError, NlSocket};
use kroce_operator::crd::{Condition, NetnsModeRequest, RdmaNetnsModeSetting};
use std::path::{Path, PathBuf};

/// kroce's file under the host's modprobe.d.
pub const MODPROBE_FILE: &str = "kroce-rdma-netns-mode.conf";
/// The host's modprobe.d, under the host root when not given.
pub const DEFAULT_MODPROBE_DIR: &str = "/etc/modprobe.d";
/// The node condition: True while the live mode differs from the one asked
/// (the controller reads it too: defined in `kroce_operator::names`).
pub use kroce_operator::names::NETNS_MODE_PENDING_CONDITION as PENDING_CONDITION;
/// Its reason when only a reboot can apply the mode.
pub use kroce_operator::names::NETNS_MODE_REBOOT_REQUIRED as REBOOT_REQUIRED;
/// The Degraded reason of networks disagreeing on one node.
pub const CONFLICT_REASON: &str = "RdmaNetnsModeConflict";

/// What the networks on this node ask.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wanted {
    /// No network asks for a mode: kroce's file goes, the live mode stays.
    Unmanaged,
    Mode(RdmaNetnsMode),
    /// Networks disagree: the message names them; nothing is written.
    Conflict(String),
}

/// Folds the spec's per-network requests.
pub fn wanted(requests: &[NetnsModeRequest]) -> Wanted {
    let mut exclusive = Vec::new();
    let mut shared = Vec::new();
    for r in requests {
        match r.mode {
            RdmaNetnsModeSetting::Exclusive => exclusive.push(r.network.as_str()),
            RdmaNetnsModeSetting::Shared => shared.push(r.network.as_str()),
            RdmaNetnsModeSetting::Unmanaged => {}
        }
    }
    match (exclusive.is_empty(), shared.is_empty()) {
        (true, true) => Wanted::Unmanaged,
        (false, true) => Wanted::Mode(RdmaNetnsMode::Exclusive),
        (true, false) => Wanted::Mode(RdmaNetnsMode::Shared),
        (false, false) => Wanted::Conflict(format!(
            "RDMA netns mode: network(s) {} ask for exclusive and {} for shared on this node \
             (spec.rdmaNetnsMode); the host has one mode: nothing written until they agree",
            exclusive.join(", "),
            shared.join(", ")
        )),
    }
}

/// kroce's modprobe.d file for `mode`.
pub fn render(mode: RdmaNetnsMode) -> String {
    format!(
        "# Written by kroce-node-agent: the RDMA netns mode ({mode}) that the RdmaNetworks on \
         this node ask for\n# (spec.rdmaNetnsMode). Read when ib_core loads; removed when no \
         network asks. Do not edit.\noptions ib_core netns_mode={}\n",
        mode.kernel_value()
    )
}

/// The mode a modprobe.d text sets for ib_core (`options ib_core ...
/// netns_mode=N`; the last such line wins, as modprobe reads them).
pub fn parse_option(text: &str) -> Option<RdmaNetnsMode> {
    let mut found = None;
    for line in text.lines() {
        let mut words = line.split_whitespace();
        if words.next() != Some("options") || words.next() != Some("ib_core") {
            continue;
        }
        for w in words {
            match w.strip_prefix("netns_mode=") {
                Some("0" | "n" | "N") => found = Some(RdmaNetnsMode::Exclusive),
                Some("1" | "y" | "Y") => found = Some(RdmaNetnsMode::Shared),
                _ => {}
            }
        }
    }
    found
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    WritePersistent(RdmaNetnsMode),
    RemovePersistent,
    SetLive(RdmaNetnsMode),
}

/// What to do. `live`: the kernel's mode (`None`: unreadable, e.g. no RDMA
/// stack loaded); `persistent`: kroce's file as it is (`None`: absent).
pub fn plan(wanted: &Wanted, live: Option<RdmaNetnsMode>, persistent: Option<&str>) -> Vec<Action> {
    match wanted {
        Wanted::Conflict(_) => Vec::new(),
        Wanted::Unmanaged => match persistent {
            Some(_) => vec![Action::RemovePersistent],
            None => Vec::new(),
        },
        Wanted::Mode(m) => {
            let mut actions = Vec::new();
            // The file first: it holds whatever the live write says.
            if persistent != Some(render(*m).as_str()) {
                actions.push(Action::WritePersistent(*m));
            }
            if matches!(live, Some(l) if l != *m) {
                actions.push(Action::SetLive(*m));
            }
            actions
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum NetnsModeError {
    /// `rdma_compatdev_set`'s -EBUSY: a netns other than the initial one exists.
    #[error(
        "the kernel refuses to change the RDMA netns mode while network namespaces other than \
         the host's exist (EBUSY)"
    )]
    Busy,
    #[error("RDMA netlink {op}: {source}")]
    Netlink {
        op: &'static str,
        #[source]
        source: NlError,
    },
    #[error("{path}: {source}")]
    File {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The host edges: the live mode (RDMA netlink) and kroce's file.
pub trait NetnsModeHost: Send + Sync {
    fn live(&self) -> Result<RdmaNetnsMode, NetnsModeError>;
    fn set_live(&self, mode: RdmaNetnsMode) -> Result<(), NetnsModeError>;
    /// kroce's file (`None`: absent).
    fn read_persistent(&self) -> Result<Option<String>, NetnsModeError>;
    fn write_persistent(&self, text: &str) -> Result<(), NetnsModeError>;
    fn remove_persistent(&self) -> Result<(), NetnsModeError>;
    /// The mode the host's modprobe.d sets for ib_core, any file, with the
    /// file (for `doctor`).
    fn boot_option(&self) -> Option<(PathBuf, RdmaNetnsMode)>;
    /// kroce's file, for messages.
    fn persistent_path(&self) -> PathBuf;
}

/// The real host: RDMA netlink from the calling thread's netns (the agent
/// runs in the host's), files under `modprobe_dir` (the host's
/// `/etc/modprobe.d`, a value so tests and the VM tier point it elsewhere).
#[derive(Debug, Clone)]
pub struct KernelNetnsMode {
    pub modprobe_dir: PathBuf,
}

impl KernelNetnsMode {
    fn file(&self) -> PathBuf {
        self.modprobe_dir.join(MODPROBE_FILE)
    }
}

fn file_err(path: &Path) -> impl FnOnce(std::io::Error) -> NetnsModeError + '_ {
    move |source| NetnsModeError::File {
        path: path.to_path_buf(),
        source,
    }
}

impl NetnsModeHost for KernelNetnsMode {
    fn live(&self) -> Result<RdmaNetnsMode, NetnsModeError> {
        let op = "read the netns mode (SYS_GET)";
        let mut sock = NlSocket::open(nix::sys::socket::SockProtocol::NetlinkRDMA)
            .map_err(|source| NetnsModeError::Netlink { op, source })?;
        let replies = sock
            .request(&msgs::sys_get())
            .map_err(|source| NetnsModeError::Netlink { op, source })?;
        let first = replies.first().ok_or(NetnsModeError::Netlink {
            op,
            source: NlError::Kernel(nix::errno::Errno::ENODATA),
        })?;
        msgs::parse_netns_mode(first).map_err(|e| NetnsModeError::Netlink {
            op,
            source: e.into(),
        })
    }

    fn set_live(&self, mode: RdmaNetnsMode) -> Result<(), NetnsModeError> {
        let op = "set the netns mode (SYS_SET)";
        let mut sock = NlSocket::open(nix::sys::socket::SockProtocol::NetlinkRDMA)
            .map_err(|source| NetnsModeError::Netlink { op, source })?;
        match sock.request(&msgs::sys_set_netns_mode(mode)) {
            Ok(_) => Ok(()),
            Err(e) if e.errno() == Some(nix::errno::Errno::EBUSY) => Err(NetnsModeError::Busy),
            Err(source) => Err(NetnsModeError::Netlink { op, source }),
        }
    }

    fn read_persistent(&self) -> Result<Option<String>, NetnsModeError> {
        let path = self.file();
        match std::fs::read_to_string(&path) {
            Ok(t) => Ok(Some(t)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(file_err(&path)(e)),
        }
    }

    fn write_persistent(&self, text: &str) -> Result<(), NetnsModeError> {
        let path = self.file();
        std::fs::create_dir_all(&self.modprobe_dir).map_err(file_err(&self.modprobe_dir))?;
        // Temp file and rename: modprobe never reads half a file.
        let tmp = self.modprobe_dir.join(format!(".{MODPROBE_FILE}.tmp"));
        std::fs::write(&tmp, text).map_err(file_err(&tmp))?;
        std::fs::File::open(&tmp)
            .and_then(|f| f.sync_all())
            .map_err(file_err(&tmp))?;
        std::fs::rename(&tmp, &path).map_err(file_err(&path))
    }

    fn remove_persistent(&self) -> Result<(), NetnsModeError> {
        let path = self.file();
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(file_err(&path)(e)),
        }
    }

    fn boot_option(&self) -> Option<(PathBuf, RdmaNetnsMode)> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(&self.modprobe_dir)
            .ok()?
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "conf"))
            .collect();
        // modprobe reads them in name order; the last setting wins.
        files.sort();
        files.into_iter().fold(None, |found, p| {
            match std::fs::read_to_string(&p)
                .ok()
                .as_deref()
                .and_then(parse_option)
            {
                Some(m) => Some((p, m)),
                None => found,
            }
        })
    }

    fn persistent_path(&self) -> PathBuf {
        self.file()
    }
}

/// What one pass did and found.
#[derive(Debug, Clone, PartialEq)]
pub struct NetnsModeOutcome {
    pub changes: Vec<String>,
    /// `(reason, message)`: Degraded.
    pub errors: Vec<(String, String)>,
    pub condition: Condition,
}

/// Applies what the spec's `rdmaNetnsModes` ask.
pub fn apply(host: &dyn NetnsModeHost, requests: &[NetnsModeRequest]) -> NetnsModeOutcome {
    let mut out = NetnsModeOutcome {
        changes: Vec::new(),
        errors: Vec::new(),
        condition: Condition::new(PENDING_CONDITION, false, "Unmanaged", ""),
    };
    let wanted = wanted(requests);
    if let Wanted::Conflict(msg) = &wanted {
        out.errors.push((CONFLICT_REASON.into(), msg.clone()));
        out.condition = Condition::new(PENDING_CONDITION, false, "Conflict", msg.clone());
        return out;
    }
    let persistent = match host.read_persistent() {
        Ok(p) => p,
        Err(e) => {
            out.errors
                .push(("RdmaNetnsModeFileUnreadable".into(), e.to_string()));
            return out;
        }
    };
    let live = host.live();
    let file = host.persistent_path();
    let mut live_now = live.as_ref().ok().copied();
    let mut busy = false;
    for action in plan(&wanted, live_now, persistent.as_deref()) {
        match action {
            Action::WritePersistent(m) => match host.write_persistent(&render(m)) {
                Ok(()) => out
                    .changes
                    .push(format!("wrote {} (netns_mode {m})", file.display())),
                Err(e) => out
                    .errors
                    .push(("RdmaNetnsModeFileFailed".into(), e.to_string())),
            },
            Action::RemovePersistent => match host.remove_persistent() {
                Ok(()) => out.changes.push(format!(
                    "removed {} (no network asks for an RDMA netns mode)",
                    file.display()
                )),
                Err(e) => out
                    .errors
                    .push(("RdmaNetnsModeFileFailed".into(), e.to_string())),
            },
            Action::SetLive(m) => match host.set_live(m) {
                Ok(()) => {
                    out.changes.push(format!("RDMA netns mode set to {m}"));
                    live_now = Some(m);
                }
                Err(NetnsModeError::Busy) => busy = true,
                Err(e) => out
                    .errors
                    .push(("RdmaNetnsModeSetFailed".into(), e.to_string())),
            },
        }
    }
    let Wanted::Mode(m) = wanted else {
        return out;
    };
    out.condition = match (live_now, &live) {
        (Some(l), _) if l == m => Condition::new(
            PENDING_CONDITION,
            false,
            "Applied",
            format!(
                "RDMA netns mode is {m}, as asked; {} keeps it at boot",
                file.display()
            ),
        ),
        (Some(l), _) if busy => Condition::new(
            PENDING_CONDITION,
            true,
            REBOOT_REQUIRED,
            format!(
                "RDMA netns mode is {l}, the networks on this node ask for {m}: {}; {} sets {m} \
                 from the next boot (kroce does not reboot nodes: drain and reboot this one)",
                NetnsModeError::Busy,
                file.display()
            ),
        ),
        (Some(l), _) => Condition::new(
            PENDING_CONDITION,
            true,
            "SetFailed",
            format!("RDMA netns mode is {l}, the networks on this node ask for {m} (see Degraded)"),
        ),
        (None, Err(e)) => Condition::new(
            PENDING_CONDITION,
            true,
            "LiveModeUnknown",
            format!(
                "cannot read the live RDMA netns mode ({e}); {} sets {m} when ib_core loads",
                file.display()
            ),
        ),
        (None, Ok(_)) => Condition::new(PENDING_CONDITION, true, "LiveModeUnknown", ""),
    };
    out
}

/// `doctor`'s line: the live mode against the one modprobe.d sets for boot.
pub fn doctor_line(host: &dyn NetnsModeHost) -> String {
    let live = match host.live() {
        Ok(m) => m.to_string(),
        Err(e) => format!("unknown ({e})"),
    };
    let boot = match host.boot_option() {
        Some((p, m)) => format!("{m} ({})", p.display()),
        None => "not set in modprobe.d (kernel default: shared)".into(),
    };
    format!("RDMA netns mode: live {live}, at boot {boot}")
}

/// An in-memory host for tests: a live mode, a netns count, kroce's file.
#[cfg(any(test, feature = "testing"))]
pub mod fake {
    use super::*;
    use std::sync::Mutex;

    #[derive(Debug, Default)]
    pub struct State {
        /// `None`: RDMA netlink unavailable.
        pub live: Option<RdmaNetnsMode>,
        /// Network namespaces besides the initial one (EBUSY when > 0).
        pub other_netns: usize,
        pub file: Option<String>,
        pub sets: Vec<RdmaNetnsMode>,
    }

    #[derive(Debug, Default)]
    pub struct FakeNetnsMode(pub Mutex<State>);

    impl FakeNetnsMode {
        pub fn new(live: Option<RdmaNetnsMode>, other_netns: usize, file: Option<&str>) -> Self {
            FakeNetnsMode(Mutex::new(State {
                live,
                other_netns,
                file: file.map(str::to_string),
                sets: Vec::new(),
            }))
        }

        pub fn state(&self) -> std::sync::MutexGuard<'_, State> {
            self.0.lock().unwrap_or_else(|e| e.into_inner())
        }
    }

    impl NetnsModeHost for FakeNetnsMode {
        fn live(&self) -> Result<RdmaNetnsMode, NetnsModeError> {
            self.state().live.ok_or(NetnsModeError::Netlink {
                op: "read the netns mode (SYS_GET)",
                source: NlError::Kernel(nix::errno::Errno::EPROTONOSUPPORT),
            })
        }

        fn set_live(&self, mode: RdmaNetnsMode) -> Result<(), NetnsModeError> {
            let mut s = self.state();
            s.sets.push(mode);
            // rdma_compatdev_set: same mode is 0; else EBUSY with any other netns.
            if s.live == Some(mode) {
                return Ok(());
            }
            if s.other_netns > 0 {
                return Err(NetnsModeError::Busy);
            }
            s.live = Some(mode);
            Ok(())
        }

        fn read_persistent(&self) -> Result<Option<String>, NetnsModeError> {
            Ok(self.state().file.clone())
        }

        fn write_persistent(&self, text: &str) -> Result<(), NetnsModeError> {
            self.state().file = Some(text.to_string());
            Ok(())
        }

        fn remove_persistent(&self) -> Result<(), NetnsModeError> {
            self.state().file = None;
            Ok(())
        }

        fn boot_option(&self) -> Option<(PathBuf, RdmaNetnsMode)> {
            let m = parse_option(self.state().file.as_deref()?)?;
            Some((self.persistent_path(), m))
        }

        fn persistent_path(&self) -> PathBuf {
            PathBuf::from("/etc/modprobe.d").join(MODPROBE_FILE)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fake::FakeNetnsMode;
    use super::*;
    use RdmaNetnsMode::{Exclusive as X, Shared as S};

    fn req(network: &str, mode: RdmaNetnsModeSetting) -> NetnsModeRequest {
        NetnsModeRequest {
            network: network.into(),
            mode,
        }
    }

    #[test]
    fn plan_table() {
        let fx = render(X);
        let fs = render(S);
        let conflict = Wanted::Conflict("c".into());
        type Case<'a> = (Wanted, Option<RdmaNetnsMode>, Option<&'a str>, Vec<Action>);
        let table: Vec<Case> = vec![
            // Unmanaged: only kroce's own file goes; the live mode stays.
            (Wanted::Unmanaged, Some(X), None, vec![]),
            (
                Wanted::Unmanaged,
                Some(S),
                Some(&fx),
                vec![Action::RemovePersistent],
            ),
            (
                Wanted::Unmanaged,
                None,
                Some("junk"),
                vec![Action::RemovePersistent],
            ),
            // Asked and already so: nothing.
            (Wanted::Mode(X), Some(X), Some(&fx), vec![]),
            (Wanted::Mode(S), Some(S), Some(&fs), vec![]),
            // File missing, stale or edited: rewritten; live set when it differs.
            (
                Wanted::Mode(X),
                Some(X),
                None,
                vec![Action::WritePersistent(X)],
            ),
            (
                Wanted::Mode(X),
                Some(S),
                Some(&fs),
                vec![Action::WritePersistent(X), Action::SetLive(X)],
            ),
            (
                Wanted::Mode(S),
                Some(X),
                Some(&fs),
                vec![Action::SetLive(S)],
            ),
            (
                Wanted::Mode(X),
                Some(X),
                Some("edited"),
                vec![Action::WritePersistent(X)],
            ),
            // Live unreadable (no RDMA stack): the file still, for the next load.
            (
                Wanted::Mode(X),
                None,
                None,
                vec![Action::WritePersistent(X)],
            ),
            // Conflict: nothing, whatever the host holds.
            (conflict.clone(), Some(S), Some(&fx), vec![]),
            (conflict, None, None, vec![]),
        ];
        for (w, live, file, want) in table {
            assert_eq!(
                plan(&w, live, file),
                want,
                "{w:?} live {live:?} file {file:?}"
            );
        }
    }

    #[test]
    fn wanted_folds_and_names_both_sides_of_a_conflict() {
        use RdmaNetnsModeSetting as M;
        assert_eq!(wanted(&[]), Wanted::Unmanaged);
        assert_eq!(wanted(&[req("a", M::Unmanaged)]), Wanted::Unmanaged);
        assert_eq!(
            wanted(&[req("a", M::Exclusive), req("b", M::Exclusive)]),
            Wanted::Mode(X)
        );
        assert_eq!(wanted(&[req("a", M::Shared)]), Wanted::Mode(S));
        let Wanted::Conflict(msg) = wanted(&[
            req("fast", M::Exclusive),
            req("slow", M::Shared),
            req("bulk", M::Exclusive),
        ]) else {
            panic!("no conflict");
        };
        assert!(msg.contains("fast, bulk ask for exclusive"), "{msg}");
        assert!(msg.contains("slow for shared"), "{msg}");
    }

    #[test]
    fn option_round_trips_and_other_files_parse() {
        assert_eq!(parse_option(&render(X)), Some(X));
        assert_eq!(parse_option(&render(S)), Some(S));
        assert!(render(X).contains("options ib_core netns_mode=0\n"));
        assert_eq!(
            parse_option("options ib_core foo=1 netns_mode=1\n"),
            Some(S)
        );
        assert_eq!(parse_option("#options ib_core netns_mode=0\n"), None);
        assert_eq!(parse_option("options mlx5_core netns_mode=0\n"), None);
    }

    #[test]
    fn applies_live_when_no_other_netns_exists() {
        use RdmaNetnsModeSetting as M;
        let host = FakeNetnsMode::new(Some(S), 0, None);
        let o = apply(&host, &[req("fast", M::Exclusive)]);
        assert!(o.errors.is_empty(), "{:?}", o.errors);
        assert_eq!(o.changes.len(), 2, "{:?}", o.changes);
        assert_eq!(o.condition.reason, "Applied");
        assert!(!o.condition.is_true());
        let s = host.state();
        assert_eq!(s.live, Some(X));
        assert_eq!(s.file.as_deref(), Some(render(X).as_str()));
        drop(s);
        // The next pass changes nothing.
        let o = apply(&host, &[req("fast", M::Exclusive)]);
        assert!(o.changes.is_empty(), "{:?}", o.changes);
    }

    #[test]
    fn busy_kernel_means_reboot_required_and_the_file_for_the_next_boot() {
        use RdmaNetnsModeSetting as M;
        let host = FakeNetnsMode::new(Some(X), 3, Some(&render(X)));
        let o = apply(&host, &[req("slow", M::Shared)]);
        assert!(o.errors.is_empty(), "{:?}", o.errors);
        assert!(o.condition.is_true());
        assert_eq!(o.condition.reason, REBOOT_REQUIRED);
        assert!(
            o.condition.message.contains("EBUSY"),
            "{}",
            o.condition.message
        );
        let s = host.state();
        assert_eq!(s.live, Some(X), "live mode unchanged");
        assert_eq!(s.file.as_deref(), Some(render(S).as_str()));
    }

    #[test]
    fn conflict_writes_nothing_and_is_an_error() {
        use RdmaNetnsModeSetting as M;
        let host = FakeNetnsMode::new(Some(S), 0, Some(&render(S)));
        let o = apply(&host, &[req("a", M::Exclusive), req("b", M::Shared)]);
        assert_eq!(o.errors.len(), 1);
        assert_eq!(o.errors[0].0, CONFLICT_REASON);
        assert!(o.changes.is_empty());
        let s = host.state();
        assert!(s.sets.is_empty());
        assert_eq!(s.live, Some(S));
        assert_eq!(s.file.as_deref(), Some(render(S).as_str()));
    }

    #[test]
    fn unmanaged_removes_only_the_file() {
        let host = FakeNetnsMode::new(Some(X), 0, Some(&render(X)));
        let o = apply(&host, &[]);
        assert_eq!(o.changes.len(), 1, "{:?}", o.changes);
        assert!(!o.condition.is_true());
        let s = host.state();
        assert_eq!(s.file, None);
        assert_eq!(s.live, Some(X));
        assert!(s.sets.is_empty());
    }

    #[test]
    fn no_rdma_stack_writes_the_file_and_says_so() {
        use RdmaNetnsModeSetting as M;
        let host = FakeNetnsMode::new(None, 0, None);
        let o = apply(&host, &[req("a", M::Exclusive)]);
        assert!(o.errors.is_empty());
        assert_eq!(o.condition.reason, "LiveModeUnknown");
        assert!(host.state().file.is_some());
        assert!(
            doctor_line(&host).contains("at boot exclusive"),
            "{}",
            doctor_line(&host)
        );
    }

    #[test]
    fn real_files_under_a_scratch_modprobe_dir() {
        let dir = tempfile::tempdir().unwrap();
        let host = KernelNetnsMode {
            modprobe_dir: dir.path().join("modprobe.d"),
        };
        assert_eq!(host.read_persistent().unwrap(), None);
        host.write_persistent(&render(X)).unwrap();
        assert_eq!(
            host.read_persistent().unwrap().as_deref(),
            Some(render(X).as_str())
        );
        std::fs::write(
            host.modprobe_dir.join("zz-local.conf"),
            "options ib_core netns_mode=1\n",
        )
        .unwrap();
        let (p, m) = host.boot_option().unwrap();
        assert_eq!(
            (p.file_name().unwrap().to_str().unwrap(), m),
            ("zz-local.conf", S)
        );
        host.remove_persistent().unwrap();
        host.remove_persistent().unwrap();
        assert_eq!(host.read_persistent().unwrap(), None);
        let names: Vec<_> = std::fs::read_dir(&host.modprobe_dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(names, ["zz-local.conf"], "no temp file left");
    }
}
