//! Processes started inside a network namespace, the way a DaemonSet pod
//! with `hostNetwork: true` runs on a node: a helper thread enters the netns
//! and spawns; the child inherits it, the test's own threads never move.

use nix::sched::{CloneFlags, setns};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Spawns `cmd` inside the netns at `netns` (e.g. `/run/netns/<name>`).
pub fn spawn_in_netns(netns: &Path, cmd: &mut Command) -> io::Result<Child> {
    let ns = File::open(netns)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", netns.display())))?;
    std::thread::scope(|s| {
        s.spawn(|| -> io::Result<Child> {
            setns(&ns, CloneFlags::CLONE_NEWNET).map_err(io::Error::from)?;
            cmd.spawn()
        })
        .join()
        .map_err(|_| io::Error::other("spawner thread panicked"))?
    })
}

/// What a one-shot command gave.
#[derive(Debug, Clone)]
pub struct Ran {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Ran {
    /// stdout as JSON (`Null` when it is not).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout).unwrap_or(serde_json::Value::Null)
    }
}

impl std::fmt::Display for Ran {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {}\n--- stdout\n{}\n--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

/// Runs `program args` to completion in the netns at `netns` with exactly
/// `env` (plus a standard `PATH`), as a runtime runs a CNI plugin, feeding
/// `stdin`.
pub fn run_in_netns(
    netns: &Path,
    program: &Path,
    args: &[&str],
    env: &[(&str, &str)],
    stdin: &[u8],
) -> io::Result<Ran> {
    use std::io::Write;
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = spawn_in_netns(netns, &mut cmd)?;
    if let Some(mut i) = child.stdin.take() {
        i.write_all(stdin)?;
    }
    let out = child.wait_with_output()?;
    Ok(Ran {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).trim().to_string(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

/// A long-running child (the device plugin) with its output in a log file.
/// Dropped while running: SIGKILL and reaped, so a failed test leaves no
/// process behind.
#[derive(Debug)]
pub struct Daemon {
    pub name: String,
    child: Option<Child>,
    pub log: PathBuf,
}

impl Daemon {
    /// Starts `cmd` in `netns`, stdout and stderr appended to `log`.
    pub fn start(name: &str, netns: &Path, mut cmd: Command, log: &Path) -> io::Result<Daemon> {
        let out = File::create(log)?;
        let err = out.try_clone()?;
        cmd.stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err));
        let child = spawn_in_netns(netns, &mut cmd)?;
        Ok(Daemon {
            name: name.to_string(),
            child: Some(child),
            log: log.to_path_buf(),
        })
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// `Some(status)` once it has exited (it should not have, while serving).
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// The log so far, for failure messages.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, then wait up to `grace` for it to exit (SIGKILL after).
    pub fn terminate(&mut self, grace: Duration) -> io::Result<ExitStatus> {
        let mut child = self
            .child
            .take()
            .ok_or_else(|| io::Error::other(format!("{} already stopped", self.name)))?;
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        let pid = Pid::from_raw(i32::try_from(child.id()).map_err(io::Error::other)?);
        kill(pid, Signal::SIGTERM).map_err(io::Error::from)?;
        let deadline = Instant::now() + grace;
        loop {
            if let Some(status) = child.try_wait()? {
                return Ok(status);
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(io::Error::other(format!(
                    "{} did not exit within {grace:?} of SIGTERM (killed)",
                    self.name
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
