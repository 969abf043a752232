//! `kroce-node-agent doctor`: gathers what `kroce_admission::doctor` needs
//! from a host root and the running kernel, runs its checks, and adds the
//! NRI reachability check (`kroce_contracts::nri_reachability`). Thin on purpose: the checks live
//! in `kroce-admission`; the node agent reuses the same gathering for its
//! conditions.
//!
//! From the host root (so fixture hosts test it): sysfs and procfs checks,
//! and the memlock limit the container runtime hands to containers (its
//! own `RLIMIT_MEMLOCK`, read from `/proc/<runtime pid>/limits`).
//! From the running kernel, through [`LiveNet`]: IPv4 addresses, DCB PFC
//! state, the firewall ruleset.

use crate::dcb::Dcb;
use kroce_admission::doctor::{
    self, CheckResult, DoctorOptions, DoctorReport, MemlockLimit, NetState, Status,
};
use kroce_contracts::Memlock;
use kroce_contracts::nri_reachability::{NriStatus, nri_reachable};
use kroce_contracts::nri_status::{StatusError, StatusFile};
use sriov_helpers::{Host, HostRoot};
use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

/// Name of the NRI check (table, JSON, node condition).
pub const NRI_CHECK: &str = "nri";
/// Container runtimes whose limits containers inherit, by `comm`.
const RUNTIMES: &[&str] = &["containerd", "crio", "dockerd"];
/// The NRI socket under the host root when not given.
pub const DEFAULT_NRI_SOCKET: &str = "var/run/nri/nri.sock";
/// Name of the check on what the runtime let kroce-nri grant (table, JSON;
/// node condition `MemlockGrantedByRuntime`).
pub const NRI_MEMLOCK_CHECK: &str = "nriMemlockGranted";
/// kroce-nri's status file under the host root when not given
/// (`<kroce-cni state dir>/nri-status.json`, see `kroce_contracts::nri_status`).
pub const DEFAULT_NRI_STATUS: &str = "var/lib/cni/kroce/nri-status.json";

/// What only the running kernel can tell.
pub trait LiveNet {
    /// IPv4 addresses per netdev, in this network namespace.
    fn ipv4(&self) -> BTreeMap<String, Vec<Ipv4Addr>>;
    /// Priorities with PFC enabled on a netdev (`None`: unknown).
    fn pfc_enabled(&self, ifname: &str) -> Option<Vec<u8>>;
    /// `nft list ruleset` or `iptables-save` text, if either works.
    fn firewall_ruleset(&self) -> Option<String>;
}

/// The live host: getifaddrs, DCB netlink, the firewall tools on `PATH`.
#[derive(Debug)]
pub struct HostNet<D: Dcb> {
    pub dcb: Option<D>,
}

/// Priorities set in a PFC enable bitmap.
pub fn pfc_priorities(pfc_en: u8) -> Vec<u8> {
    (0..8u8).filter(|p| pfc_en & (1 << p) != 0).collect()
}

/// IPv4 addresses of this network namespace's netdevs.
pub fn live_ipv4() -> BTreeMap<String, Vec<Ipv4Addr>> {
    let mut out: BTreeMap<String, Vec<Ipv4Addr>> = BTreeMap::new();
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else {
        return out;
    };
    for a in addrs {
        if let Some(v4) = a.address.as_ref().and_then(|s| s.as_sockaddr_in()) {
            out.entry(a.interface_name.clone())
                .or_default()
                .push(v4.ip());
        }
    }
    out
}

impl<D: Dcb> LiveNet for HostNet<D> {
    fn ipv4(&self) -> BTreeMap<String, Vec<Ipv4Addr>> {
        live_ipv4()
    }

    fn pfc_enabled(&self, ifname: &str) -> Option<Vec<u8>> {
        let state = self.dcb.as_ref()?.get(ifname).ok()?;
        Some(pfc_priorities(state.pfc?.pfc_en))
    }

    fn firewall_ruleset(&self) -> Option<String> {
        for (prog, args) in [
            ("nft", &["list", "ruleset"][..]),
            ("iptables-save", &[][..]),
        ] {
            if let Ok(out) = std::process::Command::new(prog).args(args).output()
                && out.status.success()
                && !out.stdout.is_empty()
            {
                return Some(String::from_utf8_lossy(&out.stdout).into_owned());
            }
        }
        None
    }
}

/// The memlock limit of the container runtime (containers inherit it
/// unless the runtime or NRI sets one), with the process it came from.
pub fn runtime_memlock(root: &HostRoot) -> Option<(String, MemlockLimit)> {
    let rd = std::fs::read_dir(root.proc()).ok()?;
    let mut found: Vec<(u32, String)> = rd
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
            let comm = comm.trim();
            RUNTIMES.contains(&comm).then(|| (pid, comm.to_string()))
        })
        .collect();
    found.sort();
    found.into_iter().find_map(|(pid, comm)| {
        let limits =
            std::fs::read_to_string(root.proc().join(pid.to_string()).join("limits")).ok()?;
        let m = MemlockLimit::from_proc_limits(&limits)?;
        Some((format!("{comm} (pid {pid})"), m))
    })
}

/// NetState for the PFs on `host`, from the root and the live kernel.
pub fn gather(root: &HostRoot, host: &Host, live: &dyn LiveNet) -> NetState {
    let mut net = NetState {
        ipv4: live.ipv4(),
        memlock: runtime_memlock(root).map(|(_, m)| m),
        firewall_ruleset: live.firewall_ruleset(),
        ..Default::default()
    };
    for pf in host.pfs() {
        if let Some(n) = host.netdev_of(&pf.address)
            && let Some(p) = live.pfc_enabled(n)
        {
            net.pfc_enabled.insert(n.to_string(), p);
        }
    }
    net
}

/// The NRI check. Unreachable NRI is a warning while the runtime's own
/// memlock suffices, a failure when it does not either (nothing raises it).
pub fn nri_check(status: &NriStatus, memlock: Option<&CheckResult>) -> CheckResult {
    let memlock_ok = memlock.and_then(|m| match m.status {
        Status::Pass => Some(true),
        Status::Fail => Some(false),
        Status::Warn | Status::Skip => None,
    });
    let (st, hint) = match (status.is_reachable(), memlock_ok) {
        (true, _) => (Status::Pass, None),
        (false, Some(false)) => (Status::Fail, status.hint()),
        (false, _) => (Status::Warn, status.hint()),
    };
    CheckResult {
        name: NRI_CHECK.into(),
        subject: "node".into(),
        status: st,
        evidence: status.message(),
        hint: hint.map(str::to_string),
    }
}

/// The doctor's report plus NRI. A failing memlock check is only a
/// warning when NRI is reachable (kroce-nri raises it per RDMA container).
pub fn report(
    host: &Host,
    root: &HostRoot,
    net: &NetState,
    opts: &DoctorOptions,
    nri: &NriStatus,
) -> DoctorReport {
    let mut r = doctor::run_on(host, root, net, opts);
    let memlock = r
        .checks
        .iter()
        .find(|c| c.name == doctor::names::MEMLOCK)
        .cloned();
    if nri.is_reachable()
        && let Some(m) = r
            .checks
            .iter_mut()
            .find(|c| c.name == doctor::names::MEMLOCK && c.status == Status::Fail)
    {
        m.status = Status::Warn;
        m.evidence.push_str(
            " for containers the runtime starts; NRI is reachable, so kroce-nri raises it for RDMA containers",
        );
    }
    r.checks.push(nri_check(nri, memlock.as_ref()));
    r
}

/// Whether the runtime let kroce-nri grant the memlock RDMA containers asked
/// for, from kroce-nri's status file (`status`, read from `path`). Fails
/// naming the values when a request was capped at the runtime's hard limit
/// (the runtime cannot raise it: no `CAP_SYS_RESOURCE`, or a user
/// namespace); warns when that would happen to any request above it.
/// `proc` is the host's /proc, to notice a status left by a runtime that is
/// gone.
pub fn nri_memlock_check(
    status: Result<Option<StatusFile>, StatusError>,
    path: &Path,
    proc: &Path,
) -> CheckResult {
    const RAISE_HINT: &str = "raise the container runtime's own memlock limit so it can grant more: systemd: `systemctl edit containerd` (or crio), [Service] LimitMEMLOCK=infinity, then restart it; or run the runtime with CAP_SYS_RESOURCE outside a user namespace";
    let result = |status, evidence: String, hint: Option<&str>| CheckResult {
        name: NRI_MEMLOCK_CHECK.into(),
        subject: "node".into(),
        status,
        evidence,
        hint: hint.map(str::to_string),
    };
    let s = match status {
        Err(err) => {
            return result(
                Status::Warn,
                format!("kroce-nri status unreadable: {err}"),
                None,
            );
        }
        Ok(None) => {
            return result(
                Status::Skip,
                format!(
                    "no kroce-nri status at {} (kroce-nri not running or not connected to the runtime yet)",
                    path.display()
                ),
                None,
            );
        }
        Ok(Some(s)) => s,
    };
    let Some(rt) = s.runtime else {
        let why = s
            .runtime_error
            .unwrap_or_else(|| "no reason recorded".into());
        return result(
            Status::Warn,
            format!(
                "kroce-nri cannot tell what the runtime can grant ({why}); memlock is sent as requested, which fails RDMA containers if the runtime cannot raise its hard limit"
            ),
            Some("run kroce-nri in the host PID namespace (hostPID: true) with the host's /proc"),
        );
    };
    if !proc.join(rt.pid.to_string()).exists() {
        return result(
            Status::Skip,
            format!(
                "kroce-nri status at {} describes runtime pid {}, which is gone (kroce-nri not reconnected yet?)",
                path.display(),
                rt.pid
            ),
            None,
        );
    }
    let runtime = match (s.runtime_name.as_str(), s.runtime_version.as_str()) {
        ("", _) => format!("the runtime (pid {})", rt.pid),
        (name, "") => format!("{name} (pid {})", rt.pid),
        (name, version) => format!("{name} {version} (pid {})", rt.pid),
    };
    if rt.can_raise() || rt.memlock_hard == Memlock::Unlimited {
        return result(
            Status::Pass,
            format!(
                "{runtime} can grant any memlock (CAP_SYS_RESOURCE: {}, hard limit {})",
                rt.cap_sys_resource,
                show(rt.memlock_hard)
            ),
            None,
        );
    }
    let why = if rt.cap_sys_resource {
        "runs in a user namespace"
    } else {
        "lacks CAP_SYS_RESOURCE"
    };
    match s.last_capped {
        Some(c) => result(
            Status::Fail,
            format!(
                "{runtime} {why} and its memlock hard limit is {}: kroce-nri capped {} request(s) at it; last: container {}{} asked for {}, got {}",
                show(rt.memlock_hard),
                s.capped_count,
                c.container,
                if c.pod.is_empty() {
                    String::new()
                } else {
                    format!(" of pod {}", c.pod)
                },
                show(c.requested),
                show(c.granted),
            ),
            Some(RAISE_HINT),
        ),
        None => result(
            Status::Warn,
            format!(
                "{runtime} {why} and its memlock hard limit is {}: RDMA containers asking for more get {} (none so far)",
                show(rt.memlock_hard),
                show(rt.memlock_hard)
            ),
            Some(RAISE_HINT),
        ),
    }
}

/// `unlimited` or bytes with MiB for reading.
fn show(m: Memlock) -> String {
    match m {
        Memlock::Unlimited => "unlimited".into(),
        Memlock::Bytes(b) if b >= 1 << 20 && b % (1 << 20) == 0 => {
            format!("{} MiB ({b} bytes)", b >> 20)
        }
        Memlock::Bytes(b) => format!("{b} bytes"),
    }
}

/// kroce-nri's status file: the given path, else the default under the host root.
pub fn nri_status_path(host_root: &Path, given: Option<&Path>) -> PathBuf {
    given.map_or_else(|| host_root.join(DEFAULT_NRI_STATUS), Path::to_path_buf)
}

/// The NRI socket: the given path, else the default under the host root.
pub fn nri_socket(host_root: &Path, given: Option<&Path>) -> PathBuf {
    given.map_or_else(|| host_root.join(DEFAULT_NRI_SOCKET), Path::to_path_buf)
}

/// A memlock size in the grammar every kroce component reads, as bytes
/// (`unlimited` is `u64::MAX`).
fn memlock_bytes(s: &str) -> Result<u64, kroce_contracts::MemlockError> {
    s.parse::<kroce_contracts::Memlock>()
        .map(kroce_contracts::Memlock::rlimit_value)
}

/// `kroce-node-agent doctor` flags (the host root flags come from the caller).
#[derive(Debug, Clone, clap::Args)]
pub struct DoctorArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// The RoCE traffic priority (the network's qos.pfcPriority).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u8).range(0..=7))]
    pub roce_priority: u8,
    /// Smallest memlock limit RDMA containers should get, in bytes: a
    /// number or a quantity such as `64Mi` (the one memlock grammar).
    #[arg(long, default_value_t = doctor::DEFAULT_MIN_MEMLOCK_BYTES, value_parser = memlock_bytes)]
    pub min_memlock: u64,
    /// Check only these PF netdevs (default: every PF with an RDMA device, and soft devices).
    #[arg(long = "pf", value_delimiter = ',')]
    pub pfs: Vec<String>,
    /// The runtime's NRI socket [default: <host-root>/var/run/nri/nri.sock].
    #[arg(long)]
    pub nri_socket: Option<PathBuf>,
    /// kroce-nri's status file [default: <host-root>/var/lib/cni/kroce/nri-status.json].
    #[arg(long)]
    pub nri_status: Option<PathBuf>,
    /// Read addresses, PFC state and memlock from this JSON file (a
    /// NetState) instead of asking this host's kernel.
    #[arg(long)]
    pub net_state: Option<PathBuf>,
    /// Judge this iptables-save / nft ruleset file instead of running the tools.
    #[arg(long)]
    pub firewall_ruleset: Option<PathBuf>,
}

impl DoctorArgs {
    /// Reads the input files; errors name the file.
    pub fn config(&self, root: HostRoot, host_root: &Path) -> Result<DoctorConfig, DoctorCliError> {
        let firewall_ruleset = match &self.firewall_ruleset {
            Some(p) => Some(
                std::fs::read_to_string(p).map_err(|e| DoctorCliError::Input {
                    path: p.display().to_string(),
                    reason: e.to_string(),
                })?,
            ),
            None => None,
        };
        Ok(DoctorConfig {
            root,
            options: DoctorOptions {
                roce_priority: self.roce_priority,
                min_memlock_bytes: self.min_memlock,
                pf_names: self.pfs.clone(),
            },
            nri_socket: nri_socket(host_root, self.nri_socket.as_deref()),
            nri_status: nri_status_path(host_root, self.nri_status.as_deref()),
            net_state: self.net_state.as_deref().map(read_net_state).transpose()?,
            firewall_ruleset,
        })
    }
}

/// Everything `kroce-node-agent doctor` takes.
#[derive(Debug, Clone)]
pub struct DoctorConfig {
    pub root: HostRoot,
    pub options: DoctorOptions,
    pub nri_socket: PathBuf,
    /// kroce-nri's status file (what the runtime let it grant).
    pub nri_status: PathBuf,
    /// Use this instead of asking the live kernel (captured elsewhere, or tests).
    pub net_state: Option<NetState>,
    /// Use this ruleset instead of running nft / iptables-save.
    pub firewall_ruleset: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum DoctorCliError {
    #[error(transparent)]
    Doctor(#[from] doctor::DoctorError),
    #[error("{path}: {reason}")]
    Input { path: String, reason: String },
}

/// Reads a `--net-state` file (JSON of `NetState`).
pub fn read_net_state(path: &Path) -> Result<NetState, DoctorCliError> {
    let bad = |reason: String| DoctorCliError::Input {
        path: path.display().to_string(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    serde_json::from_str(&text).map_err(|e| bad(format!("not a NetState JSON: {e}")))
}

/// Runs the whole doctor.
pub fn run(cfg: &DoctorConfig, live: &dyn LiveNet) -> Result<DoctorReport, DoctorCliError> {
    if cfg.options.roce_priority > 7 {
        return Err(doctor::DoctorError::BadPriority(cfg.options.roce_priority).into());
    }
    let host = Host::scan(&cfg.root);
    let mut net = match &cfg.net_state {
        Some(n) => n.clone(),
        None => gather(&cfg.root, &host, live),
    };
    if net.memlock.is_none() {
        net.memlock = runtime_memlock(&cfg.root).map(|(_, m)| m);
    }
    if let Some(r) = &cfg.firewall_ruleset {
        net.firewall_ruleset = Some(r.clone());
    }
    let nri = nri_reachable(&cfg.nri_socket);
    let mut r = report(&host, &cfg.root, &net, &cfg.options, &nri);
    r.checks.push(nri_memlock_check(
        kroce_contracts::nri_status::read(&cfg.nri_status),
        &cfg.nri_status,
        cfg.root.proc(),
    ));
    Ok(r)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        doctor: DoctorArgs,
    }

    #[test]
    fn min_memlock_takes_the_one_memlock_grammar() {
        let parse = |v: &str| Cli::try_parse_from(["doctor", "--min-memlock", v]);
        assert_eq!(parse("64Mi").unwrap().doctor.min_memlock, 64 << 20);
        assert_eq!(parse("1048576").unwrap().doctor.min_memlock, 1 << 20);
        assert_eq!(
            Cli::try_parse_from(["doctor"]).unwrap().doctor.min_memlock,
            doctor::DEFAULT_MIN_MEMLOCK_BYTES
        );
        let err = parse("64g").err().unwrap().to_string();
        assert!(
            err.contains("--min-memlock") && err.contains("\"64g\""),
            "{err}"
        );
    }

    use super::*;

    #[test]
    fn pfc_bitmap_to_priorities() {
        assert_eq!(pfc_priorities(0b0000_1000), vec![3]);
        assert_eq!(pfc_priorities(0b1000_0001), vec![0, 7]);
        assert!(pfc_priorities(0).is_empty());
    }

    #[test]
    fn nri_unreachable_is_a_warning_unless_memlock_fails_too() {
        let dir = tempfile::tempdir().unwrap();
        let missing = nri_reachable(&dir.path().join("nri.sock"));
        let ml = |s| CheckResult {
            name: doctor::names::MEMLOCK.into(),
            subject: "node".into(),
            status: s,
            evidence: String::new(),
            hint: None,
        };
        assert_eq!(
            nri_check(&missing, Some(&ml(Status::Skip))).status,
            Status::Warn
        );
        let c = nri_check(&missing, Some(&ml(Status::Pass)));
        assert_eq!(c.status, Status::Warn);
        assert!(c.hint.as_deref().unwrap().contains("LimitMEMLOCK=infinity"));
        assert_eq!(
            nri_check(&missing, Some(&ml(Status::Fail))).status,
            Status::Fail
        );
        let path = dir.path().join("up.sock");
        let _l = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let c = nri_check(&nri_reachable(&path), Some(&ml(Status::Fail)));
        assert_eq!((c.status, c.hint), (Status::Pass, None));
    }

    /// kroce-nri's status file → the check (issue 10, item 5): a capped
    /// request fails naming the runtime, its limit and the values.
    #[test]
    fn nri_memlock_check_reports_capped_requests() {
        use kroce_contracts::nri_status::RuntimeLimits;
        use kroce_contracts::nri_status::{CappedRequest, STATUS_VERSION};
        let proc = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(proc.path().join("1234")).unwrap();
        let path = Path::new("/host/var/lib/cni/kroce/nri-status.json");
        let eight = Memlock::Bytes(8 << 20);
        let limits = RuntimeLimits {
            pid: 1234,
            cap_sys_resource: false,
            initial_user_namespace: true,
            memlock_soft: eight,
            memlock_hard: eight,
        };
        let status = |runtime: Option<RuntimeLimits>, capped: bool| StatusFile {
            version: STATUS_VERSION,
            runtime_name: "containerd".into(),
            runtime_version: "2.1.9".into(),
            runtime,
            last_capped: capped.then(|| CappedRequest {
                container: "ctr-1".into(),
                pod: "default/rdma-app".into(),
                requested: Memlock::Unlimited,
                granted: eight,
                at: 1,
            }),
            capped_count: u64::from(capped),
            ..Default::default()
        };
        let check = |s| nri_memlock_check(Ok(Some(s)), path, proc.path());

        let c = check(status(Some(limits), true));
        assert_eq!(c.status, Status::Fail, "{c:?}");
        assert_eq!(c.name, NRI_MEMLOCK_CHECK);
        for want in [
            "containerd 2.1.9 (pid 1234)",
            "lacks CAP_SYS_RESOURCE",
            "8 MiB (8388608 bytes)",
            "container ctr-1 of pod default/rdma-app asked for unlimited, got 8 MiB",
        ] {
            assert!(c.evidence.contains(want), "{want:?} not in {}", c.evidence);
        }
        assert!(c.hint.unwrap().contains("LimitMEMLOCK=infinity"));

        let c = check(status(Some(limits), false));
        assert_eq!(c.status, Status::Warn, "{c:?}");
        assert!(
            c.evidence.contains("asking for more get 8 MiB"),
            "{}",
            c.evidence
        );

        let rootless = RuntimeLimits {
            cap_sys_resource: true,
            initial_user_namespace: false,
            ..limits
        };
        let c = check(status(Some(rootless), true));
        assert_eq!(c.status, Status::Fail);
        assert!(
            c.evidence.contains("runs in a user namespace"),
            "{}",
            c.evidence
        );

        let can = RuntimeLimits {
            cap_sys_resource: true,
            ..limits
        };
        assert_eq!(check(status(Some(can), false)).status, Status::Pass);

        let mut unknown = status(None, false);
        unknown.runtime_error = Some("SO_PEERCRED gave 0".into());
        let c = check(unknown);
        assert_eq!(c.status, Status::Warn);
        assert!(c.evidence.contains("SO_PEERCRED gave 0") && c.hint.unwrap().contains("hostPID"));

        // A runtime that is gone: the file is stale, not evidence.
        let gone = RuntimeLimits { pid: 999, ..limits };
        assert_eq!(check(status(Some(gone), true)).status, Status::Skip);
        let c = nri_memlock_check(Ok(None), path, proc.path());
        assert_eq!(c.status, Status::Skip);
        assert!(c.evidence.contains("nri-status.json"));
    }

    #[test]
    fn live_addresses_include_loopback() {
        // The test process's own namespace always has lo.
        let a = live_ipv4();
        assert!(
            a.get("lo")
                .is_some_and(|v| v.contains(&Ipv4Addr::LOCALHOST)),
            "{a:?}"
        );
    }
}
