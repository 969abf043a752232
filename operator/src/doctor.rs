//! `kroce-operator doctor`: gathers what `kroce_admission::doctor` needs
//! from a host root and the running kernel, runs its checks, and adds the
//! NRI reachability check (`kroce_nri`). Thin on purpose: the checks live
//! in `kroce-admission`; the node agent reuses the same gathering for its
//! conditions.
//!
//! From the host root (so fixture hosts test it): sysfs and procfs checks,
//! and the memlock limit the container runtime hands to containers (its
//! own `RLIMIT_MEMLOCK`, read from `/proc/<runtime pid>/limits`).
//! From the running kernel, through [`LiveNet`]: IPv4 addresses, DCB PFC
//! state, the firewall ruleset.

use crate::agent::dcb::Dcb;
use kroce_admission::doctor::{
    self, CheckResult, DoctorOptions, DoctorReport, MemlockLimit, NetState, Status,
};
use kroce_nri::reachability::{NriStatus, nri_reachable};
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

/// The NRI socket: the given path, else the default under the host root.
pub fn nri_socket(host_root: &Path, given: Option<&Path>) -> PathBuf {
    given.map_or_else(|| host_root.join(DEFAULT_NRI_SOCKET), Path::to_path_buf)
}

/// `kroce-operator doctor` flags (the host root flags come from the caller).
#[derive(Debug, Clone, clap::Args)]
pub struct DoctorArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// The RoCE traffic priority (the network's qos.pfcPriority).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u8).range(0..=7))]
    pub roce_priority: u8,
    /// Smallest memlock limit (bytes) RDMA containers should get.
    #[arg(long, default_value_t = doctor::DEFAULT_MIN_MEMLOCK_BYTES)]
    pub min_memlock: u64,
    /// Check only these PF netdevs (default: every PF with an RDMA device, and soft devices).
    #[arg(long = "pf", value_delimiter = ',')]
    pub pfs: Vec<String>,
    /// The runtime's NRI socket [default: <host-root>/var/run/nri/nri.sock].
    #[arg(long)]
    pub nri_socket: Option<PathBuf>,
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
            net_state: self.net_state.as_deref().map(read_net_state).transpose()?,
            firewall_ruleset,
        })
    }
}

/// Everything `kroce-operator doctor` takes.
#[derive(Debug, Clone)]
pub struct DoctorConfig {
    pub root: HostRoot,
    pub options: DoctorOptions,
    pub nri_socket: PathBuf,
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
    Ok(report(&host, &cfg.root, &net, &cfg.options, &nri))
}

#[cfg(test)]
mod tests {
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
