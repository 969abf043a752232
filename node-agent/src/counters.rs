//! Per-device RoCE and Ethernet counters on the agent's `/metrics`:
//! `kroce_admission::counters` reads them from sysfs (`ports/<n>/counters`,
//! `hw_counters`, netdev `statistics`) plus `ethtool -S` for per-priority
//! pause frames and PHY discards (no sysfs file has those), read at scrape
//! time; the same snapshots, taken every agent pass, feed the
//! `RdmaFabricCongestion` condition.

use kroce_admission::counters::{
    CounterSnapshot, EthtoolStats, parse_ethtool_stats, read_snapshot, render_prometheus,
};
use sriov_helpers::{Host, HostRoot};
use std::path::PathBuf;
use std::sync::Arc;

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

/// `ethtool -S <ifname>` output, or `None` when unavailable.
pub trait EthtoolSource: Send + Sync {
    fn stats(&self, ifname: &str) -> Option<String>;
}

/// Runs the `ethtool` program (absent or failing: no pause counters).
#[derive(Debug, Clone)]
pub struct EthtoolCommand {
    pub program: PathBuf,
}

impl EthtoolSource for EthtoolCommand {
    fn stats(&self, ifname: &str) -> Option<String> {
        let out = std::process::Command::new(&self.program)
            .arg("-S")
            .arg(ifname)
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

/// No `ethtool`: sysfs counters only.
#[derive(Debug, Clone, Copy)]
pub struct NoEthtool;

impl EthtoolSource for NoEthtool {
    fn stats(&self, _ifname: &str) -> Option<String> {
        None
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
        for name in &devices {
            let Some(dev) = host.rdma.get(name) else {
                continue;
            };
            let netdev = match &dev.pci {
                _ if is_vf(host, dev) => None,
                Some(pci) => host.netdev_of(pci),
                None => dev.parent_netdev.as_deref(),
            };
            if let Some(n) = netdev
                && let Some(text) = self.ethtool.stats(n)
            {
                ethtool.insert(n.to_string(), parse_ethtool_stats(&text));
            }
        }
        read_snapshot(
            &self.root,
            host,
            &self.node,
            taken_at_ms,
            &ethtool,
            Some(&devices),
        )
    }

    /// The counters as OpenMetrics text (without `# EOF`), scanned now.
    pub fn metrics_text(&self) -> String {
        if self.scope == CounterScope::Off {
            return String::new();
        }
        let host = Host::scan(&self.root);
        openmetrics(&render_prometheus(&self.snapshot(&host, now_ms())))
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
