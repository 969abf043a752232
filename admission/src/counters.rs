//! Per-device RoCE and Ethernet counters: a snapshot read from sysfs
//! (`ports/<n>/counters/*`, `ports/<n>/hw_counters/*`,
//! `class/net/<if>/statistics/*`) plus the `ethtool -S` statistics the
//! caller may add (per-priority pause frames and PHY discards have no sysfs
//! file); Prometheus text exposition; rates between two snapshots; and the
//! node condition raised when pause frames or discards grow too fast.
//!
//! Units are the kernel's: `port_xmit_data` / `port_rcv_data` count 4-byte
//! words (sysfs-class-infiniband ABI), everything else counts events.

use serde::{Deserialize, Serialize};
use sriov_helpers::{Host, HostRoot};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

/// `ethtool -S` statistics per netdev.
pub type EthtoolStats = BTreeMap<String, BTreeMap<String, u64>>;

/// Entries of `hw_counters` that are settings, not counters.
const NOT_COUNTERS: &[&str] = &["lifespan"];

/// Netdev statistics that count discarded packets.
pub const NETDEV_DISCARDS: &[&str] = &["rx_dropped", "tx_dropped", "rx_missed_errors"];
/// RDMA port counters that count discarded packets.
pub const PORT_DISCARDS: &[&str] = &["port_xmit_discards", "port_rcv_errors"];
/// `ethtool -S` (mlx5) PHY discard counters.
pub const ETHTOOL_DISCARDS: &[&str] = &["rx_discards_phy", "tx_discards_phy"];

/// Kernel counter names the chart's alert rules and dashboard
/// (charts/kroce/files/) rely on, per source. They are the sysfs/ethtool file
/// names; [`exported_metric_names`] turns them into metric names with the
/// same renderer `/metrics` uses, so the rules test breaks on a rename.
pub const RULE_PORT_COUNTERS: &[&str] = &[
    "symbol_error",
    "link_error_recovery",
    "link_downed",
    "port_rcv_errors",
    "port_xmit_discards",
    "port_xmit_data",
    "port_rcv_data",
];
/// `hw_counters` (mlx5 names) the rules use.
pub const RULE_HW_COUNTERS: &[&str] = &[
    "out_of_buffer",
    "out_of_sequence",
    "packet_seq_err",
    "local_ack_timeout_err",
    "np_cnp_sent",
    "np_ecn_marked_roce_packets",
    "rp_cnp_handled",
];

/// The one list of metric names (with `_total`) and label names that
/// `/metrics` exports for the counters alert rules and dashboards may use:
/// rendered from a snapshot holding every counter named above, so names
/// come from [`render_prometheus`] itself.
pub fn exported_metric_names() -> (
    std::collections::BTreeSet<String>,
    std::collections::BTreeSet<String>,
) {
    let counters = |names: &[&str]| names.iter().map(|n| (n.to_string(), 1)).collect();
    let mut pause = BTreeMap::new();
    for direction in [Direction::Rx, Direction::Tx] {
        for priority in [None, Some(3)] {
            pause.insert(
                PauseKey {
                    direction,
                    priority,
                },
                1,
            );
        }
    }
    let snap = CounterSnapshot {
        node: "n".into(),
        ports: vec![PortCounters {
            device: "d".into(),
            port: 1,
            netdev: Some("e".into()),
            counters: counters(RULE_PORT_COUNTERS),
            hw_counters: counters(RULE_HW_COUNTERS),
            netdev_stats: counters(NETDEV_DISCARDS),
            pause: pause.clone(),
            phy_discards: counters(ETHTOOL_DISCARDS),
            pause_duration_us: pause,
        }],
        ..Default::default()
    };
    let mut names = std::collections::BTreeSet::new();
    let mut labels = std::collections::BTreeSet::new();
    for line in render_prometheus(&snap).lines() {
        let Some((name, rest)) = line.split_once('{') else {
            continue;
        };
        names.insert(name.to_string());
        let body = rest.rsplit_once('}').map_or(rest, |(b, _)| b);
        for pair in body.split(',') {
            if let Some((l, _)) = pair.split_once('=') {
                labels.insert(l.to_string());
            }
        }
    }
    (names, labels)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    Rx,
    Tx,
}

impl Direction {
    fn as_str(self) -> &'static str {
        match self {
            Direction::Rx => "rx",
            Direction::Tx => "tx",
        }
    }
}

/// Pause frames: per priority (`rx_prio3_pause`) or global
/// (`rx_pause_ctrl_phy`, priority `None`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PauseKey {
    pub direction: Direction,
    pub priority: Option<u8>,
}

/// Counters of one RDMA port and its netdev.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PortCounters {
    pub device: String,
    pub port: u32,
    pub netdev: Option<String>,
    pub counters: BTreeMap<String, u64>,
    pub hw_counters: BTreeMap<String, u64>,
    pub netdev_stats: BTreeMap<String, u64>,
    /// From `ethtool -S` when given.
    #[serde(with = "pause_map")]
    pub pause: BTreeMap<PauseKey, u64>,
    /// From `ethtool -S` when given (`rx_discards_phy`, `tx_discards_phy`).
    pub phy_discards: BTreeMap<String, u64>,
    /// Microseconds paused, from `ethtool -S` where the NIC reports it
    /// (mlx5: `rx_prio3_pause_duration`, `tx_global_pause_duration`).
    #[serde(default, with = "pause_map")]
    pub pause_duration_us: BTreeMap<PauseKey, u64>,
}

/// JSON maps need string keys: pause counters serialise as a list.
mod pause_map {
    use super::PauseKey;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use std::collections::BTreeMap;

    #[derive(Serialize, Deserialize)]
    struct Entry {
        #[serde(flatten)]
        key: PauseKey,
        frames: u64,
    }

    pub fn serialize<S: Serializer>(m: &BTreeMap<PauseKey, u64>, s: S) -> Result<S::Ok, S::Error> {
        let v: Vec<Entry> = m
            .iter()
            .map(|(k, f)| Entry {
                key: *k,
                frames: *f,
            })
            .collect();
        v.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<BTreeMap<PauseKey, u64>, D::Error> {
        let v = Vec::<Entry>::deserialize(d)?;
        Ok(v.into_iter().map(|e| (e.key, e.frames)).collect())
    }
}

/// Every port of every RDMA device at one moment.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CounterSnapshot {
    pub node: String,
    /// Milliseconds since the Unix epoch.
    pub taken_at_ms: u64,
    pub ports: Vec<PortCounters>,
    /// Files that could not be read or parsed (with their path).
    pub errors: Vec<String>,
}

/// Reads every regular file of `dir` as a u64. An absent directory is
/// empty; a file that does not parse is an error naming it.
fn read_counter_dir(dir: &Path, skip: &[&str], errors: &mut Vec<String>) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return out,
        Err(e) => {
            errors.push(format!("{}: {e}", dir.display()));
            return out;
        }
    };
    for e in rd.flatten() {
        let Some(name) = e.file_name().to_str().map(str::to_string) else {
            continue;
        };
        if skip.contains(&name.as_str()) {
            continue;
        }
        let path = e.path();
        if !path.is_file() {
            continue;
        }
        match std::fs::read_to_string(&path) {
            Ok(s) => match s.trim().parse::<u64>() {
                Ok(v) => {
                    out.insert(name, v);
                }
                Err(_) => errors.push(format!("{}: not a counter: {:?}", path.display(), s.trim())),
            },
            // Some counters refuse reads on a down port (EINVAL): report, go on.
            Err(e) => errors.push(format!("{}: {e}", path.display())),
        }
    }
    out
}

/// Pause, pause-duration and discard counters of one netdev.
#[derive(Debug, Default)]
struct EthtoolCounters {
    pause: BTreeMap<PauseKey, u64>,
    pause_duration_us: BTreeMap<PauseKey, u64>,
    discards: BTreeMap<String, u64>,
}

/// Picks pause, pause-duration and discard counters out of one netdev's
/// `ethtool -S`. Durations: mlx5 counts them in microseconds, per priority
/// (`rx_prio3_pause_duration`) and for global pause
/// (`rx_global_pause_duration`, priority "all").
fn from_ethtool(stats: &BTreeMap<String, u64>) -> EthtoolCounters {
    let mut out = EthtoolCounters::default();
    for (name, v) in stats {
        let dir = if name.starts_with("rx_") {
            Direction::Rx
        } else if name.starts_with("tx_") {
            Direction::Tx
        } else {
            continue;
        };
        let rest = &name[3..];
        let prio = |suffix: &str| {
            rest.strip_prefix("prio")
                .and_then(|r| r.strip_suffix(suffix))
                .and_then(|p| p.parse::<u8>().ok())
        };
        let key = |priority| PauseKey {
            direction: dir,
            priority,
        };
        if let Some(p) = prio("_pause") {
            out.pause.insert(key(Some(p)), *v);
        } else if rest == "pause_ctrl_phy" {
            out.pause.insert(key(None), *v);
        } else if let Some(p) = prio("_pause_duration") {
            out.pause_duration_us.insert(key(Some(p)), *v);
        } else if rest == "global_pause_duration" {
            out.pause_duration_us.insert(key(None), *v);
        } else if ETHTOOL_DISCARDS.contains(&name.as_str()) {
            out.discards.insert(name.clone(), *v);
        }
    }
    out
}

/// Parses `ethtool -S <if>` output (`     rx_packets: 123`).
pub fn parse_ethtool_stats(text: &str) -> BTreeMap<String, u64> {
    text.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            let v = v.trim().parse::<u64>().ok()?;
            Some((k.trim().to_string(), v))
        })
        .collect()
}

/// Reads a snapshot of every RDMA device in `host` (or those in `only`).
pub fn read_snapshot(
    root: &HostRoot,
    host: &Host,
    node: &str,
    taken_at_ms: u64,
    ethtool: &EthtoolStats,
    only: Option<&[String]>,
) -> CounterSnapshot {
    let mut snap = CounterSnapshot {
        node: node.to_string(),
        taken_at_ms,
        ..Default::default()
    };
    for dev in host.rdma.values() {
        if only.is_some_and(|o| !o.contains(&dev.name)) {
            continue;
        }
        let netdev = match &dev.pci {
            Some(pci) => host
                .netdev_of(pci)
                .filter(|n| host.netdevs.contains_key(*n)),
            None => dev.parent_netdev.as_deref(),
        };
        let netdev_stats = match netdev {
            Some(n) => read_counter_dir(
                &root.class_net().join(n).join("statistics"),
                &[],
                &mut snap.errors,
            ),
            None => BTreeMap::new(),
        };
        let eth = netdev
            .and_then(|n| ethtool.get(n))
            .map(from_ethtool)
            .unwrap_or_default();
        for port in &dev.ports {
            let dir = root
                .class_infiniband()
                .join(&dev.name)
                .join("ports")
                .join(port.num.to_string());
            snap.ports.push(PortCounters {
                device: dev.name.clone(),
                port: port.num,
                netdev: netdev.map(str::to_string),
                counters: read_counter_dir(&dir.join("counters"), &[], &mut snap.errors),
                hw_counters: read_counter_dir(
                    &dir.join("hw_counters"),
                    NOT_COUNTERS,
                    &mut snap.errors,
                ),
                netdev_stats: netdev_stats.clone(),
                pause: eth.pause.clone(),
                phy_discards: eth.discards.clone(),
                pause_duration_us: eth.pause_duration_us.clone(),
            });
        }
    }
    snap
}

/// `[a-zA-Z0-9_]` only, as Prometheus metric names require.
fn metric_part(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn label_value(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

#[derive(Default)]
struct Family {
    help: String,
    samples: Vec<(String, u64)>,
}

/// Prometheus text exposition (format 0.0.4): one family per counter name,
/// labelled `node`, `device`, `port` (and `netdev`, `direction`,
/// `priority` where they apply).
pub fn render_prometheus(snap: &CounterSnapshot) -> String {
    let mut fams: BTreeMap<String, Family> = BTreeMap::new();
    let mut add = |name: String, help: String, labels: String, v: u64| {
        let f = fams.entry(name).or_default();
        if f.help.is_empty() {
            f.help = help;
        }
        f.samples.push((labels, v));
    };
    for p in &snap.ports {
        let base = format!(
            "node=\"{}\",device=\"{}\",port=\"{}\"",
            label_value(&snap.node),
            label_value(&p.device),
            p.port
        );
        let with_netdev = |extra: &str| match &p.netdev {
            Some(n) => format!("{base},netdev=\"{}\"{extra}", label_value(n)),
            None => format!("{base}{extra}"),
        };
        for (k, v) in &p.counters {
            let help = if k == "port_xmit_data" || k == "port_rcv_data" {
                format!("RDMA port counter {k} (units of 4 bytes)")
            } else {
                format!("RDMA port counter {k}")
            };
            add(
                format!("kroce_rdma_port_{}_total", metric_part(k)),
                help,
                base.clone(),
                *v,
            );
        }
        for (k, v) in &p.hw_counters {
            add(
                format!("kroce_rdma_hw_{}_total", metric_part(k)),
                format!("RDMA port hw_counter {k}"),
                base.clone(),
                *v,
            );
        }
        for (k, v) in &p.netdev_stats {
            add(
                format!("kroce_rdma_netdev_{}_total", metric_part(k)),
                format!("netdev statistic {k} of the RDMA device's netdev"),
                with_netdev(""),
                *v,
            );
        }
        for (k, v) in &p.pause {
            let prio = k
                .priority
                .map(|p| format!(",priority=\"{p}\""))
                .unwrap_or_else(|| ",priority=\"all\"".into());
            add(
                "kroce_rdma_pause_frames_total".into(),
                "Ethernet pause frames (ethtool -S), per priority or all".into(),
                with_netdev(&format!(",direction=\"{}\"{prio}", k.direction.as_str())),
                *v,
            );
        }
        for (k, v) in &p.pause_duration_us {
            let prio = k
                .priority
                .map(|p| format!(",priority=\"{p}\""))
                .unwrap_or_else(|| ",priority=\"all\"".into());
            add(
                "kroce_rdma_pause_duration_microseconds_total".into(),
                "Time the port was paused (ethtool -S *_pause_duration, microseconds), per priority or all".into(),
                with_netdev(&format!(",direction=\"{}\"{prio}", k.direction.as_str())),
                *v,
            );
        }
        for (k, v) in &p.phy_discards {
            add(
                format!("kroce_rdma_phy_{}_total", metric_part(k)),
                format!("PHY discards {k} (ethtool -S)"),
                with_netdev(""),
                *v,
            );
        }
    }
    let mut out = String::new();
    for (name, f) in &fams {
        let _ = writeln!(
            out,
            "# HELP {name} {}",
            f.help.replace('\\', "\\\\").replace('\n', "\\n")
        );
        let _ = writeln!(out, "# TYPE {name} counter");
        for (labels, v) in &f.samples {
            let _ = writeln!(out, "{name}{{{labels}}} {v}");
        }
    }
    out
}

/// Where a counter comes from.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(tag = "source", rename_all = "camelCase")]
pub enum CounterSource {
    Port,
    Hw,
    Netdev,
    Pause {
        direction: Direction,
        priority: Option<u8>,
    },
    PhyDiscard,
}

/// The growth of one counter between two snapshots.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CounterRate {
    pub device: String,
    pub port: u32,
    pub netdev: Option<String>,
    #[serde(flatten)]
    pub source: CounterSource,
    pub name: String,
    pub delta: u64,
    pub per_sec: f64,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RateError {
    #[error("snapshots are of different nodes ({0} and {1})")]
    DifferentNodes(String, String),
    #[error("the second snapshot ({later} ms) is not after the first ({earlier} ms)")]
    NotLater { earlier: u64, later: u64 },
}

/// Rates of every counter present in both snapshots. A counter that went
/// down was reset (driver reload, port re-created) and is left out.
pub fn rates(prev: &CounterSnapshot, cur: &CounterSnapshot) -> Result<Vec<CounterRate>, RateError> {
    if prev.node != cur.node {
        return Err(RateError::DifferentNodes(
            prev.node.clone(),
            cur.node.clone(),
        ));
    }
    if cur.taken_at_ms <= prev.taken_at_ms {
        return Err(RateError::NotLater {
            earlier: prev.taken_at_ms,
            later: cur.taken_at_ms,
        });
    }
    let secs = (cur.taken_at_ms - prev.taken_at_ms) as f64 / 1000.0;
    let before: BTreeMap<(&str, u32), &PortCounters> = prev
        .ports
        .iter()
        .map(|p| ((p.device.as_str(), p.port), p))
        .collect();
    let mut out = Vec::new();
    for p in &cur.ports {
        let Some(old) = before.get(&(p.device.as_str(), p.port)) else {
            continue;
        };
        let mut push = |source: CounterSource, name: &str, a: Option<&u64>, b: &u64| {
            if let Some(a) = a
                && b >= a
            {
                out.push(CounterRate {
                    device: p.device.clone(),
                    port: p.port,
                    netdev: p.netdev.clone(),
                    source,
                    name: name.to_string(),
                    delta: b - a,
                    per_sec: (b - a) as f64 / secs,
                });
            }
        };
        for (k, v) in &p.counters {
            push(CounterSource::Port, k, old.counters.get(k), v);
        }
        for (k, v) in &p.hw_counters {
            push(CounterSource::Hw, k, old.hw_counters.get(k), v);
        }
        for (k, v) in &p.netdev_stats {
            push(CounterSource::Netdev, k, old.netdev_stats.get(k), v);
        }
        for (k, v) in &p.pause {
            let name = match k.priority {
                Some(pr) => format!("{}_prio{pr}_pause", k.direction.as_str()),
                None => format!("{}_pause_ctrl_phy", k.direction.as_str()),
            };
            push(
                CounterSource::Pause {
                    direction: k.direction,
                    priority: k.priority,
                },
                &name,
                old.pause.get(k),
                v,
            );
        }
        for (k, v) in &p.phy_discards {
            push(CounterSource::PhyDiscard, k, old.phy_discards.get(k), v);
        }
    }
    Ok(out)
}

/// When the fabric is warning: rates above these raise the condition.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CongestionLimits {
    pub max_pause_frames_per_sec: f64,
    pub max_discards_per_sec: f64,
}

/// The node condition kroce sets from counters.
pub const CONDITION_TYPE: &str = "RdmaFabricCongestion";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CongestionCondition {
    pub condition_type: String,
    /// `true` when a limit is exceeded.
    pub status: bool,
    /// `PauseFramesGrowing`, `DiscardsGrowing`, both joined by `And`, or `CountersNormal`.
    pub reason: String,
    pub message: String,
    pub offenders: Vec<CounterRate>,
}

fn is_discard(r: &CounterRate) -> bool {
    match r.source {
        CounterSource::Netdev => NETDEV_DISCARDS.contains(&r.name.as_str()),
        CounterSource::Port => PORT_DISCARDS.contains(&r.name.as_str()),
        CounterSource::PhyDiscard => true,
        _ => false,
    }
}

/// Judges the rates between two snapshots against the limits.
pub fn congestion_condition(
    prev: &CounterSnapshot,
    cur: &CounterSnapshot,
    limits: &CongestionLimits,
) -> Result<CongestionCondition, RateError> {
    let all = rates(prev, cur)?;
    let pause: Vec<CounterRate> = all
        .iter()
        .filter(|r| matches!(r.source, CounterSource::Pause { .. }))
        .filter(|r| r.per_sec > limits.max_pause_frames_per_sec)
        .cloned()
        .collect();
    let discards: Vec<CounterRate> = all
        .iter()
        .filter(|r| is_discard(r))
        .filter(|r| r.per_sec > limits.max_discards_per_sec)
        .cloned()
        .collect();
    let describe = |rs: &[CounterRate], limit: f64| {
        rs.iter()
            .map(|r| {
                format!(
                    "{} {}/{}: {} at {:.1}/s (limit {limit}/s)",
                    r.netdev.as_deref().unwrap_or("-"),
                    r.device,
                    r.port,
                    r.name,
                    r.per_sec
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
    };
    let mut reasons = Vec::new();
    let mut msgs = Vec::new();
    if !pause.is_empty() {
        reasons.push("PauseFramesGrowing");
        msgs.push(describe(&pause, limits.max_pause_frames_per_sec));
    }
    if !discards.is_empty() {
        reasons.push("DiscardsGrowing");
        msgs.push(describe(&discards, limits.max_discards_per_sec));
    }
    let status = !reasons.is_empty();
    let secs = (cur.taken_at_ms - prev.taken_at_ms) as f64 / 1000.0;
    Ok(CongestionCondition {
        condition_type: CONDITION_TYPE.into(),
        status,
        reason: if status {
            reasons.join("And")
        } else {
            "CountersNormal".into()
        },
        message: if status {
            msgs.join("; ")
        } else {
            format!("pause frames and discards within limits over {secs:.0}s")
        },
        offenders: pause.into_iter().chain(discards).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ethtool_output_parses_and_pause_counters_are_picked() {
        let text = "NIC statistics:\n     rx_packets: 10\n     rx_prio3_pause: 7\n     rx_prio3_pause_duration: 2345\n     rx_prio3_pause_transition: 3\n     tx_prio3_pause: 2\n     tx_global_pause_duration: 11\n     rx_pause_ctrl_phy: 9\n     rx_discards_phy: 4\n     garbage line\n";
        let m = parse_ethtool_stats(text);
        assert_eq!(m.get("rx_packets"), Some(&10));
        assert!(!m.contains_key("garbage line"));
        let EthtoolCounters {
            pause,
            pause_duration_us,
            discards: disc,
        } = from_ethtool(&m);
        // Durations are not frames, and transitions are neither.
        assert_eq!(
            pause_duration_us,
            BTreeMap::from([
                (
                    PauseKey {
                        direction: Direction::Rx,
                        priority: Some(3)
                    },
                    2345
                ),
                (
                    PauseKey {
                        direction: Direction::Tx,
                        priority: None
                    },
                    11
                ),
            ])
        );
        assert_eq!(
            pause.get(&PauseKey {
                direction: Direction::Rx,
                priority: Some(3)
            }),
            Some(&7)
        );
        assert_eq!(
            pause.get(&PauseKey {
                direction: Direction::Rx,
                priority: None
            }),
            Some(&9)
        );
        assert_eq!(disc.get("rx_discards_phy"), Some(&4));
        assert_eq!(pause.len(), 3);
    }

    #[test]
    fn pause_duration_is_exported_per_direction_and_priority() {
        let m =
            parse_ethtool_stats("rx_prio3_pause_duration: 2345\ntx_global_pause_duration: 11\n");
        let eth = from_ethtool(&m);
        let snap = CounterSnapshot {
            node: "n1".into(),
            ports: vec![PortCounters {
                device: "mlx5_0".into(),
                port: 1,
                netdev: Some("ens1f0".into()),
                pause_duration_us: eth.pause_duration_us,
                ..Default::default()
            }],
            ..Default::default()
        };
        let text = render_prometheus(&snap);
        assert!(
            text.contains("kroce_rdma_pause_duration_microseconds_total{node=\"n1\",device=\"mlx5_0\",port=\"1\",netdev=\"ens1f0\",direction=\"rx\",priority=\"3\"} 2345\n"),
            "{text}"
        );
        assert!(
            text.contains("direction=\"tx\",priority=\"all\"} 11\n"),
            "{text}"
        );
        let (names, _) = exported_metric_names();
        assert!(names.contains("kroce_rdma_pause_duration_microseconds_total"));
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(label_value("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
        assert_eq!(metric_part("rx-bytes.x"), "rx_bytes_x");
    }
}
