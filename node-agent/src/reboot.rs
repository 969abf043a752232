//! Rebooting the host for its RDMA netns mode, when the controller asks
//! (`--reboot-for-rdma-mode`) and only with `--allow-host-reboot`.
//!
//! The controller drains the node first, then writes
//! [`REBOOT_REQUEST_ANNOTATION`] on this node's `RdmaNodeState` (which the
//! agent reads anyway: no Node RBAC) with the boot to leave: the Node's
//! `status.nodeInfo.bootID`, the kernel's `/proc/sys/kernel/random/boot_id`.
//! The agent asks the host to reboot only while it is still in that boot,
//! its own report still says a reboot is required, and it has not asked in
//! this boot already (a record under its state dir, written before
//! asking). After the reboot the boot id differs, so a request can never
//! make a host reboot twice: the controller decides what comes next.
//!
//! The ask goes through the narrow [`HostReboot`]; [`SystemdReboot`] runs
//! the host's own `systemctl reboot` in PID 1's namespaces (the agent runs
//! with `hostPID` and privileged), so systemd stops the host's units as on
//! any clean reboot. [`decide`] is the pure decision, [`act`] runs it.

use kroce_operator::crd::RdmaNodeState;
pub use kroce_operator::names::REBOOT_REQUEST_ANNOTATION;
use std::path::{Path, PathBuf};

/// The record under the agent's state dir: the boot id it last asked to leave.
pub const RECORD_FILE: &str = "reboot-asked";
/// The kernel's id of this boot, under the proc root.
pub const BOOT_ID_PATH: &str = "sys/kernel/random/boot_id";
/// How the real host is asked: systemd's own clean reboot, run in PID 1's
/// mount, UTS, IPC, network and PID namespaces (the host's `systemctl`
/// talking to the host's systemd).
pub const REBOOT_COMMAND: &[&str] = &[
    "nsenter",
    "--target",
    "1",
    "--mount",
    "--uts",
    "--ipc",
    "--net",
    "--pid",
    "--",
    "systemctl",
    "reboot",
];

#[derive(Debug, thiserror::Error)]
pub enum RebootError {
    #[error("{path}: {source}")]
    File {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: empty boot id")]
    EmptyBootId { path: PathBuf },
    #[error("`{command}`: {detail}")]
    Command { command: String, detail: String },
}

/// The host edges of a reboot.
pub trait HostReboot: Send + Sync {
    /// This boot's id.
    fn boot_id(&self) -> Result<String, RebootError>;
    /// The boot id the agent last asked to leave (`None`: never asked).
    fn asked(&self) -> Result<Option<String>, RebootError>;
    /// Records that the agent asks to leave `boot_id` (before asking).
    fn record_ask(&self, boot_id: &str) -> Result<(), RebootError>;
    /// Asks the host to reboot; returns once the host took the request.
    fn reboot(&self) -> Result<(), RebootError>;
}

/// What a pass does about a reboot request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Nothing asked of this boot, or nothing to do.
    Nothing,
    /// Ask the host to leave this boot.
    Ask { boot_id: String },
    /// Asked, and not doing it: why (reported in the condition).
    Refuse(String),
}

/// Whether to reboot. `allowed`: `--allow-host-reboot`; `requested`: the
/// request annotation; `boot_id`: this boot; `required`: this pass reports
/// a reboot required; `asked`: the boot last asked to leave.
pub fn decide(
    allowed: bool,
    requested: Option<&str>,
    boot_id: &str,
    required: bool,
    asked: Option<&str>,
) -> Decision {
    let Some(requested) = requested else {
        return Decision::Nothing;
    };
    if requested != boot_id {
        // A request about an earlier boot: the host rebooted since.
        return Decision::Nothing;
    }
    if !required {
        return Decision::Nothing;
    }
    if !allowed {
        return Decision::Refuse(
            "the controller asks for a reboot; this agent runs without --allow-host-reboot".into(),
        );
    }
    if asked == Some(boot_id) {
        return Decision::Nothing;
    }
    Decision::Ask {
        boot_id: boot_id.to_string(),
    }
}

/// Whether a report says only a reboot applies the RDMA netns mode.
pub use kroce_operator::crd::node_state::netns_reboot_required as reboot_required;

/// The controller's request on this node's state, if any.
pub fn requested(state: &RdmaNodeState) -> Option<&str> {
    state
        .metadata
        .annotations
        .as_ref()?
        .get(REBOOT_REQUEST_ANNOTATION)
        .map(String::as_str)
}

/// What [`act`] did, for the report and the log.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RebootOutcome {
    /// The host was asked to leave this boot.
    pub asked: Option<String>,
    /// Added to the pending condition's message.
    pub note: Option<String>,
}

/// Decides and acts. `host`: `None` without `--allow-host-reboot` (the
/// agent then never asks, whatever the request says).
pub fn act(
    host: Option<&dyn HostReboot>,
    requested: Option<&str>,
    required: bool,
) -> RebootOutcome {
    if requested.is_none() || !required {
        return RebootOutcome::default();
    }
    let Some(host) = host else {
        // Without the edge the boot id is not read: refuse any request.
        return match decide(false, requested, requested.unwrap_or_default(), true, None) {
            Decision::Refuse(why) => RebootOutcome {
                asked: None,
                note: Some(why),
            },
            _ => RebootOutcome::default(),
        };
    };
    let note = |s: String| RebootOutcome {
        asked: None,
        note: Some(s),
    };
    let boot_id = match host.boot_id() {
        Ok(b) => b,
        Err(e) => return note(format!("cannot read this boot's id: {e}")),
    };
    let asked = match host.asked() {
        Ok(a) => a,
        // Unknown whether it asked already: never risk asking twice.
        Err(e) => return note(format!("cannot read the reboot record: {e}")),
    };
    match decide(true, requested, &boot_id, required, asked.as_deref()) {
        Decision::Nothing if asked.as_deref() == Some(boot_id.as_str()) => {
            note(format!("reboot asked of the host (boot {boot_id})"))
        }
        Decision::Nothing => RebootOutcome::default(),
        Decision::Refuse(why) => note(why),
        Decision::Ask { boot_id } => {
            if let Err(e) = host.record_ask(&boot_id) {
                return note(format!("not rebooting: cannot record the ask: {e}"));
            }
            match host.reboot() {
                Ok(()) => RebootOutcome {
                    asked: Some(boot_id.clone()),
                    note: Some(format!("reboot asked of the host (boot {boot_id})")),
                },
                // Recorded: not asked again in this boot; the controller's
                // timeout reports the node.
                Err(e) => note(format!("the host refused the reboot: {e}")),
            }
        }
    }
}

/// Adds what [`act`] did to the RDMA netns mode's pending condition, where
/// the admin and the controller read it (run loop and `apply` alike).
pub fn note_on(conditions: &mut [kroce_operator::crd::Condition], outcome: &RebootOutcome) {
    let Some(note) = &outcome.note else {
        return;
    };
    if let Some(c) = conditions
        .iter_mut()
        .find(|c| c.type_ == crate::netns_mode::PENDING_CONDITION)
    {
        c.message = format!("{}; {note}", c.message);
    }
}

/// The real host: the boot id under `proc_root`, the record under the
/// agent's state dir, [`REBOOT_COMMAND`].
#[derive(Debug, Clone)]
pub struct SystemdReboot {
    pub proc_root: PathBuf,
    pub state_dir: PathBuf,
}

fn file_err(path: &Path) -> impl FnOnce(std::io::Error) -> RebootError + '_ {
    move |source| RebootError::File {
        path: path.to_path_buf(),
        source,
    }
}

impl HostReboot for SystemdReboot {
    fn boot_id(&self) -> Result<String, RebootError> {
        let path = self.proc_root.join(BOOT_ID_PATH);
        let id = std::fs::read_to_string(&path).map_err(file_err(&path))?;
        let id = id.trim();
        if id.is_empty() {
            return Err(RebootError::EmptyBootId { path });
        }
        Ok(id.to_string())
    }

    fn asked(&self) -> Result<Option<String>, RebootError> {
        let path = self.state_dir.join(RECORD_FILE);
        match std::fs::read_to_string(&path) {
            Ok(s) => Ok(Some(s.trim().to_string()).filter(|s| !s.is_empty())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(file_err(&path)(e)),
        }
    }

    fn record_ask(&self, boot_id: &str) -> Result<(), RebootError> {
        std::fs::create_dir_all(&self.state_dir).map_err(file_err(&self.state_dir))?;
        let path = self.state_dir.join(RECORD_FILE);
        let tmp = self.state_dir.join(format!(".{RECORD_FILE}.tmp"));
        std::fs::write(&tmp, format!("{boot_id}\n")).map_err(file_err(&tmp))?;
        std::fs::rename(&tmp, &path).map_err(file_err(&path))
    }

    fn reboot(&self) -> Result<(), RebootError> {
        let command = REBOOT_COMMAND.join(" ");
        let (program, args) = REBOOT_COMMAND
            .split_first()
            .ok_or_else(|| RebootError::Command {
                command: command.clone(),
                detail: "empty command".into(),
            })?;
        let out = std::process::Command::new(program)
            .args(args)
            .output()
            .map_err(|e| RebootError::Command {
                command: command.clone(),
                detail: e.to_string(),
            })?;
        if out.status.success() {
            return Ok(());
        }
        Err(RebootError::Command {
            command,
            detail: format!(
                "{}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        })
    }
}

/// An in-memory host: a boot id, a record, and the reboots asked.
#[cfg(any(test, feature = "testing"))]
pub mod fake {
    use super::*;
    use std::sync::Mutex;

    #[derive(Debug, Default)]
    pub struct State {
        pub boot_id: String,
        pub record: Option<String>,
        /// The boot ids the host was asked to leave, in order.
        pub reboots: Vec<String>,
        /// `reboot()` fails.
        pub refuse: bool,
    }

    #[derive(Debug, Default)]
    pub struct FakeReboot(pub Mutex<State>);

    impl FakeReboot {
        pub fn new(boot_id: &str) -> Self {
            FakeReboot(Mutex::new(State {
                boot_id: boot_id.into(),
                ..Default::default()
            }))
        }

        pub fn state(&self) -> std::sync::MutexGuard<'_, State> {
            self.0.lock().unwrap_or_else(|e| e.into_inner())
        }

        /// The host came back: a new boot (the record survives, as on disk).
        pub fn boot(&self, boot_id: &str) {
            self.state().boot_id = boot_id.into();
        }
    }

    impl HostReboot for FakeReboot {
        fn boot_id(&self) -> Result<String, RebootError> {
            Ok(self.state().boot_id.clone())
        }
        fn asked(&self) -> Result<Option<String>, RebootError> {
            Ok(self.state().record.clone())
        }
        fn record_ask(&self, boot_id: &str) -> Result<(), RebootError> {
            self.state().record = Some(boot_id.into());
            Ok(())
        }
        fn reboot(&self) -> Result<(), RebootError> {
            let mut s = self.state();
            if s.refuse {
                return Err(RebootError::Command {
                    command: "fake".into(),
                    detail: "refused".into(),
                });
            }
            let b = s.boot_id.clone();
            s.reboots.push(b);
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fake::FakeReboot;
    use super::*;

    #[test]
    fn decision_table() {
        use Decision::*;
        let ask = |b: &str| Ask {
            boot_id: b.to_string(),
        };
        // (allowed, requested, boot, required, asked) -> decision
        type Case<'a> = (
            bool,
            Option<&'a str>,
            &'a str,
            bool,
            Option<&'a str>,
            Decision,
        );
        let cases: &[Case] = &[
            (true, None, "b1", true, None, Nothing),
            (true, Some("b1"), "b1", true, None, ask("b1")),
            // Asked in this boot already: never again.
            (true, Some("b1"), "b1", true, Some("b1"), Nothing),
            // Asked in an earlier boot: this request is about this boot.
            (true, Some("b2"), "b2", true, Some("b1"), ask("b2")),
            // The request is about an earlier boot: rebooted since.
            (true, Some("b1"), "b2", true, Some("b1"), Nothing),
            (true, Some("b1"), "b2", true, None, Nothing),
            // The mode applied without a reboot: nothing to do.
            (true, Some("b1"), "b1", false, None, Nothing),
        ];
        for (allowed, requested, boot, required, asked, want) in cases {
            assert_eq!(
                &decide(*allowed, *requested, boot, *required, *asked),
                want,
                "{allowed} {requested:?} {boot} {required} {asked:?}"
            );
        }
        assert!(matches!(
            decide(false, Some("b1"), "b1", true, None),
            Refuse(why) if why.contains("--allow-host-reboot")
        ));
    }

    #[test]
    fn asks_once_and_not_again_after_the_boot_changed() {
        let host = FakeReboot::new("boot-1");
        let out = act(Some(&host), Some("boot-1"), true);
        assert_eq!(out.asked.as_deref(), Some("boot-1"));
        assert_eq!(host.state().reboots, ["boot-1"]);
        assert_eq!(host.state().record.as_deref(), Some("boot-1"));
        // Next passes before the host goes down: not asked again.
        for _ in 0..3 {
            let again = act(Some(&host), Some("boot-1"), true);
            assert_eq!(again.asked, None);
            assert!(again.note.is_some_and(|n| n.contains("boot-1")));
        }
        assert_eq!(host.state().reboots.len(), 1);
        // Back in a new boot, the mode still not applied and the request
        // still there: the host is not rebooted again.
        host.boot("boot-2");
        let after = act(Some(&host), Some("boot-1"), true);
        assert_eq!(after, RebootOutcome::default());
        assert_eq!(host.state().reboots.len(), 1);
        // A new request, about this boot, is a new ask.
        assert_eq!(
            act(Some(&host), Some("boot-2"), true).asked.as_deref(),
            Some("boot-2")
        );
        assert_eq!(host.state().reboots, ["boot-1", "boot-2"]);
    }

    #[test]
    fn never_without_the_flag_or_without_a_need() {
        let host = FakeReboot::new("boot-1");
        let refused = act(None, Some("boot-1"), true);
        assert_eq!(refused.asked, None);
        assert!(
            refused
                .note
                .is_some_and(|n| n.contains("--allow-host-reboot"))
        );
        assert_eq!(act(Some(&host), Some("boot-1"), false), Default::default());
        assert_eq!(act(Some(&host), None, true), Default::default());
        assert!(host.state().reboots.is_empty());
        assert!(host.state().record.is_none());
    }

    #[test]
    fn a_refused_reboot_is_recorded_and_not_retried_in_that_boot() {
        let host = FakeReboot::new("boot-1");
        host.state().refuse = true;
        let out = act(Some(&host), Some("boot-1"), true);
        assert!(out.note.is_some_and(|n| n.contains("refused")));
        host.state().refuse = false;
        act(Some(&host), Some("boot-1"), true);
        assert!(host.state().reboots.is_empty());
    }

    #[test]
    fn real_edges_read_the_boot_id_and_keep_the_record_under_scratch_roots() {
        let dir = tempfile::tempdir().unwrap();
        let proc_root = dir.path().join("proc");
        std::fs::create_dir_all(proc_root.join("sys/kernel/random")).unwrap();
        std::fs::write(proc_root.join(BOOT_ID_PATH), "0f1e2d3c-aaaa\n").unwrap();
        let host = SystemdReboot {
            proc_root,
            state_dir: dir.path().join("state"),
        };
        assert_eq!(host.boot_id().unwrap(), "0f1e2d3c-aaaa");
        assert_eq!(host.asked().unwrap(), None);
        host.record_ask("0f1e2d3c-aaaa").unwrap();
        assert_eq!(host.asked().unwrap().as_deref(), Some("0f1e2d3c-aaaa"));
        let missing = SystemdReboot {
            proc_root: dir.path().join("nowhere"),
            state_dir: dir.path().join("state"),
        };
        let e = missing.boot_id().unwrap_err().to_string();
        assert!(e.contains("nowhere/sys/kernel/random/boot_id"), "{e}");
    }

    #[test]
    fn the_real_boot_id_is_readable_here() {
        // Any Linux host: the kernel's own file, as the agent reads it.
        let host = SystemdReboot {
            proc_root: "/proc".into(),
            state_dir: "/nonexistent".into(),
        };
        let id = host.boot_id().unwrap();
        assert_eq!(id.len(), 36, "{id}");
    }
}
