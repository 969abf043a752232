//! Per-device RoCE and Ethernet counters on the agent's `/metrics`:
//! `kroce_admission::counters` reads them from sysfs (`ports/<n>/counters`,
//! `hw_counters`, netdev `statistics`) plus `ethtool -S` for per-priority
//! pause frames and PHY discards (no sysfs file has those, and each
//! `ethtool` run has a timeout). One snapshot is taken per agent pass, on a
//! blocking thread: it feeds the `RdmaFabricCongestion` condition, and
//! `/metrics` serves it until the next pass (a scrape reads nothing).

use kroce_admission::counters::{
    CounterSnapshot, EthtoolStats, parse_ethtool_stats, read_snapshot, render_prometheus,
};
use sriov_helpers::{Host, HostRoot};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Which RDMA devices to export.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum CounterScope {
    /// PFs and soft (rxe) devices: the fabric's view, a few series per port.
    #[default]
    Pfs,
    /// Every RDMA device, VFs too (many series on hosts with many VFs).
    All,
    /// None.
    Off,
}

/// `ethtool -S <ifname>` output: `Ok(None)` when unavailable (no such
/// program, or the driver has no statistics), an error when it could not be
/// read (it hung and was killed, or could not be started).
pub trait EthtoolSource: Send + Sync {
    fn stats(&self, ifname: &str) -> Result<Option<String>, EthtoolError>;
}

#[derive(Debug, thiserror::Error)]
pub enum EthtoolError {
    /// Killed (with its process group) so a hung driver query cannot hold
    /// the agent's pass or a thread forever.
    #[error("`{program} -S {ifname}` did not finish within {timeout:?}: killed")]
    Timeout {
        program: String,
        ifname: String,
        timeout: Duration,
    },
    #[error("`{program} -S {ifname}`: {source}")]
    Run {
        program: String,
        ifname: String,
        source: std::io::Error,
    },
}

/// Runs the `ethtool` program, at most `timeout` per netdev (absent or
/// failing: no pause counters).
#[derive(Debug, Clone)]
pub struct EthtoolCommand {
    pub program: PathBuf,
    pub timeout: Duration,
}

impl EthtoolSource for EthtoolCommand {
    fn stats(&self, ifname: &str) -> Result<Option<String>, EthtoolError> {
        let mut cmd = std::process::Command::new(&self.program);
        cmd.arg("-S").arg(ifname);
        let err = |source| EthtoolError::Run {
            program: self.program.display().to_string(),
            ifname: ifname.to_string(),
            source,
        };
        match output_within(cmd, self.timeout) {
            Ok(Some((status, stdout))) => {
                Ok(status.then(|| String::from_utf8_lossy(&stdout).into_owned()))
            }
            Ok(None) => Err(EthtoolError::Timeout {
                program: self.program.display().to_string(),
                ifname: ifname.to_string(),
                timeout: self.timeout,
            }),
            // Not installed: sysfs counters only (as documented).
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(err(e)),
        }
    }
}

/// Runs `cmd` (stdin and stderr null) and returns whether it succeeded and
/// its stdout, or `None` when it did not exit within `timeout`: then its
/// process group is killed (a wrapper script's children too, which would
/// otherwise hold the stdout pipe open) and the child reaped.
pub fn output_within(
    mut cmd: std::process::Command,
    timeout: Duration,
) -> std::io::Result<Option<(bool, Vec<u8>)>> {
    use std::io::Read as _;
    use std::os::unix::process::CommandExt as _;
    let mut child = cmd
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .process_group(0)
        .spawn()?;
    // Read stdout on its own thread: a child writing more than a pipe
    // holds would otherwise never exit.
    let (tx, rx) = std::sync::mpsc::channel();
    if let Some(mut out) = child.stdout.take() {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = out.read_to_end(&mut buf);
            let _ = tx.send(buf);
        });
    }
    // No deadline only for a timeout beyond what Instant can hold.
    let deadline = Instant::now().checked_add(timeout);
    let kill = |child: &mut std::process::Child| {
        if let Ok(pid) = i32::try_from(child.id()) {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let _ = child.kill();
        let _ = child.wait();
    };
    loop {
        let exited = match child.try_wait() {
            Ok(e) => e,
            Err(e) => {
                kill(&mut child);
                return Err(e);
            }
        };
        let now = Instant::now();
        let left = deadline.map(|d| d.saturating_duration_since(now));
        if let Some(status) = exited {
            // A grandchild may still hold stdout: do not wait past the deadline.
            let stdout = match left {
                Some(left) => rx.recv_timeout(left).unwrap_or_default(),
                None => rx.recv().unwrap_or_default(),
            };
            return Ok(Some((status.success(), stdout)));
        }
        if left.is_some_and(|l| l.is_zero()) {
            kill(&mut child);
            return Ok(None);
        }
        let poll = Duration::from_millis(10);
        std::thread::sleep(left.map_or(poll, |l| l.min(poll)));
    }
}

/// No `ethtool`: sysfs counters only.
#[derive(Debug, Clone, Copy)]
pub struct NoEthtool;

impl EthtoolSource for NoEthtool {
    fn stats(&self, _ifname: &str) -> Result<Option<String>, EthtoolError> {
        Ok(None)
    }
}

/// Reads counter snapshots of one node.
#[derive(Clone)]
pub struct Counters {
    pub root: HostRoot,
    pub node: String,
    pub scope: CounterScope,
    pub ethtool: Arc<dyn EthtoolSource>,
}

impl std::fmt::Debug for Counters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Counters")
            .field("root", &self.root)
            .field("node", &self.node)
            .field("scope", &self.scope)
            .finish()
    }
}

fn is_vf(host: &Host, dev: &sriov_helpers::RdmaDevice) -> bool {
    dev.pci
        .as_ref()
        .and_then(|p| host.pci.get(p))
        .is_some_and(|p| p.is_vf())
}

pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Counters {
    /// A snapshot of the devices in scope on a scanned host.
    pub fn snapshot(&self, host: &Host, taken_at_ms: u64) -> CounterSnapshot {
        let devices: Vec<String> = match self.scope {
            CounterScope::Off => {
                return CounterSnapshot {
                    node: self.node.clone(),
                    taken_at_ms,
                    ..Default::default()
                };
            }
            CounterScope::All => host.rdma.keys().cloned().collect(),
            CounterScope::Pfs => host
                .rdma
                .values()
                .filter(|d| !is_vf(host, d))
                .map(|d| d.name.clone())
                .collect(),
        };
        // Pause and PHY counters live on the PF (or the soft device's) netdev.
        let mut ethtool = EthtoolStats::new();
        let mut errors = Vec::new();
        for name in &devices {
            let Some(dev) = host.rdma.get(name) else {
                continue;
            };
            let netdev = match &dev.pci {
                _ if is_vf(host, dev) => None,
                Some(pci) => host.netdev_of(pci),
                None => dev.parent_netdev.as_deref(),
            };
            let Some(n) = netdev else { continue };
            match self.ethtool.stats(n) {
                Ok(Some(text)) => {
                    ethtool.insert(n.to_string(), parse_ethtool_stats(&text));
                }
                Ok(None) => {}
                Err(e) => errors.push(e.to_string()),
            }
        }
        let mut snap = read_snapshot(
            &self.root,
            host,
            &self.node,
            taken_at_ms,
            &ethtool,
            Some(&devices),
        );
        snap.errors.extend(errors);
        snap
    }

    /// The counters as OpenMetrics text (without `# EOF`), scanned now.
    /// The agent serves [`Self::render`] of its last pass's snapshot instead.
    pub fn metrics_text(&self) -> String {
        let host = Host::scan(&self.root);
        self.render(&self.snapshot(&host, now_ms()))
    }

    /// A snapshot as OpenMetrics text (without `# EOF`); empty when off.
    pub fn render(&self, snap: &CounterSnapshot) -> String {
        if self.scope == CounterScope::Off {
            return String::new();
        }
        openmetrics(&render_prometheus(snap))
    }
}

/// Prometheus text (0.0.4) counters as OpenMetrics: a counter family is
/// named without `_total` (its samples keep it), so the `# HELP`/`# TYPE`
/// lines drop the suffix. Sample lines are the same in both formats.
pub fn openmetrics(prometheus: &str) -> String {
    let mut out = String::with_capacity(prometheus.len());
    for line in prometheus.lines() {
        let fixed = ["# HELP ", "# TYPE "].iter().find_map(|p| {
            let rest = line.strip_prefix(p)?;
            let (name, tail) = rest.split_once(' ')?;
            let family = name.strip_suffix("_total")?;
            Some(format!("{p}{family} {tail}"))
        });
        out.push_str(fixed.as_deref().unwrap_or(line));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    fn script(dir: &std::path::Path, name: &str, body: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    /// Issue 11: an `ethtool` that hangs (here a script that sleeps) is
    /// killed at its timeout and reported as an error naming the command
    /// and the netdev; the old code waited for it (30 s here, forever on a
    /// wedged driver) on a tokio worker thread.
    #[test]
    fn a_hanging_ethtool_is_killed_at_its_timeout_and_named_in_the_error() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("pid");
        let hang = script(
            dir.path(),
            "ethtool-hang",
            &format!("echo $$ > {}\nexec sleep 30", pidfile.display()),
        );
        let timeout = Duration::from_millis(300);
        let e = EthtoolCommand {
            program: hang.clone(),
            timeout,
        };
        let t = Instant::now();
        let err = e.stats("ens1f0").expect_err("a hung ethtool is an error");
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        assert!(matches!(err, EthtoolError::Timeout { .. }), "{err:?}");
        let msg = err.to_string();
        assert!(
            msg.contains(&format!("{} -S ens1f0", hang.display())) && msg.contains("300ms"),
            "{msg}"
        );
        // Killed and reaped, not left running.
        let pid: i32 = std::fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert_eq!(
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None),
            Err(nix::errno::Errno::ESRCH)
        );
        // A wrapper whose child keeps stdout open does not hold the agent either.
        let wrapper = script(dir.path(), "ethtool-wrapper", "sleep 30");
        let t = Instant::now();
        let e = EthtoolCommand {
            program: wrapper,
            timeout,
        };
        assert!(matches!(
            e.stats("ens2f0"),
            Err(EthtoolError::Timeout { .. })
        ));
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());

        // The counters of that pass go without ethtool's, and say why.
        let fx = sriov_helpers::fixture::FixtureHost::connectx6dx_pair().unwrap();
        let c = Counters {
            root: fx.root(),
            node: "n1".into(),
            scope: CounterScope::Pfs,
            ethtool: Arc::new(EthtoolCommand {
                program: hang.clone(),
                timeout,
            }),
        };
        let t = Instant::now();
        let snap = c.snapshot(&Host::scan(&fx.root()), 1);
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        assert!(
            snap.errors
                .iter()
                .any(|e| e.contains("-S ens1f0") && e.contains("did not finish")),
            "{:?}",
            snap.errors
        );
        assert!(!snap.ports.is_empty(), "sysfs counters still read");
    }

    #[test]
    fn ethtool_output_of_any_size_missing_or_failing_ethtool() {
        let dir = tempfile::tempdir().unwrap();
        let timeout = Duration::from_secs(20);
        // More than a pipe holds: read while it runs.
        let big = script(
            dir.path(),
            "ethtool-big",
            "echo 'NIC statistics:'\ni=0\nwhile [ $i -lt 4000 ]; do echo \"     rx_queue_${i}_packets: $i\"; i=$((i+1)); done\necho '     rx_prio3_pause: 7'",
        );
        let text = EthtoolCommand {
            program: big,
            timeout,
        }
        .stats("ens1f0")
        .unwrap()
        .unwrap();
        assert!(text.len() > 65536, "{}", text.len());
        assert_eq!(
            kroce_admission::counters::parse_ethtool_stats(&text).get("rx_prio3_pause"),
            Some(&7)
        );
        let failing = script(
            dir.path(),
            "ethtool-fail",
            "echo 'no stats available' >&2; exit 94",
        );
        assert!(
            EthtoolCommand {
                program: failing,
                timeout
            }
            .stats("ens1f0")
            .unwrap()
            .is_none()
        );
        let missing = EthtoolCommand {
            program: dir.path().join("no-such-ethtool"),
            timeout,
        };
        assert!(missing.stats("ens1f0").unwrap().is_none());
    }

    #[test]
    fn counter_families_lose_total_in_help_and_type_only() {
        let p = "# HELP kroce_rdma_hw_np_cnp_sent_total RDMA port hw_counter np_cnp_sent\n# TYPE kroce_rdma_hw_np_cnp_sent_total counter\nkroce_rdma_hw_np_cnp_sent_total{node=\"n1\",device=\"mlx5_0\",port=\"1\"} 7\n";
        let o = openmetrics(p);
        assert_eq!(
            o,
            "# HELP kroce_rdma_hw_np_cnp_sent RDMA port hw_counter np_cnp_sent\n# TYPE kroce_rdma_hw_np_cnp_sent counter\nkroce_rdma_hw_np_cnp_sent_total{node=\"n1\",device=\"mlx5_0\",port=\"1\"} 7\n"
        );
        assert_eq!(
            kroce_operator::http::append_families("# HELP a x\na_total 1\n# EOF\n", &o),
            format!("# HELP a x\na_total 1\n{o}# EOF\n")
        );
    }
}
