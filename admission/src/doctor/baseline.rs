//! A counters baseline for "after any change" (driver, firmware, switch
//! config): what a port did before — its last passing perftest figures and
//! its counter rates over a short interval — and how it does now, compared
//! against thresholds. Plain data and plain functions: the node agent's
//! `doctor --baseline save|compare` samples the counters and reads the
//! admission result, this module judges.
//!
//! The file (`BASELINE_VERSION`):
//!
//! ```json
//! {"version":1,"takenAtMs":1764633600000,"intervalMs":10000,
//!  "ports":[{"device":"mlx5_0","port":1,"netdev":"ens1f0",
//!            "rates":{"port/symbol_error":0.0,"pause/rx_prio3_pause":12.5}}],
//!  "perftest":[{"network":"rdma-a","runId":"r1","finishedAt":1764630000,
//!               "bandwidthGbps":97.1,"latencyAvgUs":2.1,"latencyP99Us":3.0}]}
//! ```
//!
//! Counter keys are `<source>/<kernel name>`: `port/` (ports/N/counters),
//! `hw/` (hw_counters), `netdev/` (class/net statistics), `pause/`
//! (ethtool per-priority or global pause frames), `phy/` (ethtool PHY
//! discards). Rates are per second.

use crate::counters::{CounterRate, CounterSource};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// The schema version written and understood.
pub const BASELINE_VERSION: u32 = 1;

/// Counters whose rate should be 0 on a healthy lossless port: any rise
/// from a zero baseline is a regression. `<source>/<name>` keys.
pub const ERROR_COUNTERS: &[&str] = &[
    "port/symbol_error",
    "port/link_error_recovery",
    "port/link_downed",
    "port/port_rcv_errors",
    "port/port_xmit_discards",
    "hw/local_ack_timeout_err",
    "hw/packet_seq_err",
    "hw/out_of_sequence",
    "hw/out_of_buffer",
    "phy/rx_discards_phy",
    "phy/tx_discards_phy",
];

/// Reported for reading, never a regression on their own: traffic and ECN
/// activity depend on the load during the sample.
pub const INFO_COUNTERS: &[&str] = &[
    "port/port_xmit_data",
    "port/port_rcv_data",
    "hw/np_ecn_marked_roce_packets",
    "hw/np_cnp_sent",
    "hw/rp_cnp_handled",
];

/// One port's counter rates (per second) over the sample interval.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PortRates {
    pub device: String,
    pub port: u32,
    #[serde(default)]
    pub netdev: Option<String>,
    pub rates: BTreeMap<String, f64>,
}

/// A network's last perftest admission figures for this node.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PerftestFigures {
    pub network: String,
    pub run_id: String,
    pub finished_at: u64,
    #[serde(default)]
    pub bandwidth_gbps: Option<f64>,
    #[serde(default)]
    pub latency_avg_us: Option<f64>,
    #[serde(default)]
    pub latency_p99_us: Option<f64>,
}

/// What `save` records and `compare` samples.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Baseline {
    pub version: u32,
    pub taken_at_ms: u64,
    pub interval_ms: u64,
    pub ports: Vec<PortRates>,
    #[serde(default)]
    pub perftest: Vec<PerftestFigures>,
}

/// The `<source>/<name>` key of a rate.
pub fn rate_key(r: &CounterRate) -> String {
    let source = match r.source {
        CounterSource::Port => "port",
        CounterSource::Hw => "hw",
        CounterSource::Netdev => "netdev",
        CounterSource::Pause { .. } => "pause",
        CounterSource::PhyDiscard => "phy",
    };
    format!("{source}/{}", r.name)
}

/// Rates of two snapshots per port, as a baseline's ports (sorted).
pub fn port_rates(rates: &[CounterRate]) -> Vec<PortRates> {
    let mut by_port: BTreeMap<(String, u32), PortRates> = BTreeMap::new();
    for r in rates {
        let p = by_port
            .entry((r.device.clone(), r.port))
            .or_insert_with(|| PortRates {
                device: r.device.clone(),
                port: r.port,
                netdev: r.netdev.clone(),
                rates: BTreeMap::new(),
            });
        p.rates.insert(rate_key(r), r.per_sec);
    }
    by_port.into_values().collect()
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BaselineError {
    #[error("{path}: not a counters baseline: {reason}")]
    Parse { path: String, reason: String },
    #[error(
        "{path}: field `version` is {found}, this kroce reads version {BASELINE_VERSION}: run `doctor --baseline save` again"
    )]
    Version { path: String, found: u64 },
    #[error("{path}: field `{field}`: {reason}")]
    Field {
        path: String,
        field: String,
        reason: String,
    },
}

/// Reads a baseline file's text (`path` names it in errors): an old or
/// unknown version, a missing or mistyped field, or a rate that is not a
/// finite non-negative number is an error naming the path and the field.
pub fn parse(text: &str, path: &str) -> Result<Baseline, BaselineError> {
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| BaselineError::Parse {
            path: path.into(),
            reason: e.to_string(),
        })?;
    // Version first: an old file fails on it, not on a field it lacks.
    match value.get("version").map(serde_json::Value::as_u64) {
        Some(Some(v)) if v == u64::from(BASELINE_VERSION) => {}
        Some(Some(v)) => {
            return Err(BaselineError::Version {
                path: path.into(),
                found: v,
            });
        }
        Some(None) => {
            return Err(BaselineError::Field {
                path: path.into(),
                field: "version".into(),
                reason: "not a whole number".into(),
            });
        }
        None => {
            return Err(BaselineError::Field {
                path: path.into(),
                field: "version".into(),
                reason: "missing".into(),
            });
        }
    }
    let b: Baseline = serde_json::from_value(value).map_err(|e| BaselineError::Parse {
        path: path.into(),
        reason: e.to_string(),
    })?;
    for (i, p) in b.ports.iter().enumerate() {
        for (k, v) in &p.rates {
            if !v.is_finite() || *v < 0.0 {
                return Err(BaselineError::Field {
                    path: path.into(),
                    field: format!("ports[{i}].rates.{k}"),
                    reason: format!("{v} is not a rate (finite, >= 0)"),
                });
            }
        }
    }
    Ok(b)
}

/// When a difference is a regression. Defaults (`--max-*` flags of
/// `doctor --baseline compare`) and why:
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Thresholds {
    /// perftest bandwidth lower by more than this % (default 10: ib_write_bw
    /// repeats within 1-3% on a healthy port; a lost PCIe lane width or
    /// speed, a FEC or link-speed change costs far more than 10%).
    pub max_bandwidth_drop_percent: f64,
    /// perftest latency (avg or p99) higher by more than this % (default
    /// 20: latency runs vary ~5-10% with CPU frequency and IRQ placement).
    pub max_latency_rise_percent: f64,
    /// A pause counter's rate above the baseline's times this (default 3:
    /// the same benchmark load pausing three times as often is a changed
    /// buffer or ECN setting, not noise)...
    pub max_pause_factor: f64,
    /// ...and above this many frames/s (default 100, the alerts' noise
    /// floor: a few pause frames per second are normal incast).
    pub min_pause_per_sec: f64,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            max_bandwidth_drop_percent: 10.0,
            max_latency_rise_percent: 20.0,
            max_pause_factor: 3.0,
            min_pause_per_sec: 100.0,
        }
    }
}

/// One difference between the baseline and now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum Finding {
    /// An error counter that did not move in the baseline moves now.
    ErrorRateFromZero {
        device: String,
        port: u32,
        counter: String,
        per_sec: f64,
    },
    /// Pause frames up by more than the factor (and above the floor).
    PauseRateUp {
        device: String,
        port: u32,
        counter: String,
        baseline_per_sec: f64,
        per_sec: f64,
    },
    /// perftest bandwidth down by more than the threshold.
    BandwidthDrop {
        network: String,
        baseline_gbps: f64,
        gbps: f64,
        drop_percent: f64,
    },
    /// perftest latency up by more than the threshold.
    LatencyRise {
        network: String,
        stat: String,
        baseline_us: f64,
        us: f64,
        rise_percent: f64,
    },
    /// A port of the baseline that is not there now.
    MissingPort { device: String, port: u32 },
    /// A port that is not in the baseline (not a regression: save again).
    NewPort { device: String, port: u32 },
    /// A network of the baseline with no perftest figures now (not a
    /// regression: the admission result was not given or has no figures).
    NoPerftestNow { network: String },
    /// A counter rate for reading (traffic, ECN/CNP), not judged.
    Info {
        device: String,
        port: u32,
        counter: String,
        baseline_per_sec: f64,
        per_sec: f64,
    },
}

impl Finding {
    pub fn is_regression(&self) -> bool {
        matches!(
            self,
            Finding::ErrorRateFromZero { .. }
                | Finding::PauseRateUp { .. }
                | Finding::BandwidthDrop { .. }
                | Finding::LatencyRise { .. }
                | Finding::MissingPort { .. }
        )
    }

    /// One line for an admin.
    pub fn describe(&self) -> String {
        match self {
            Finding::ErrorRateFromZero {
                device,
                port,
                counter,
                per_sec,
            } => format!(
                "REGRESSION {device} port {port}: {counter} at {per_sec:.3}/s, 0/s in the baseline"
            ),
            Finding::PauseRateUp {
                device,
                port,
                counter,
                baseline_per_sec,
                per_sec,
            } => format!(
                "REGRESSION {device} port {port}: {counter} at {per_sec:.1}/s, {baseline_per_sec:.1}/s in the baseline"
            ),
            Finding::BandwidthDrop {
                network,
                baseline_gbps,
                gbps,
                drop_percent,
            } => format!(
                "REGRESSION network {network}: perftest bandwidth {gbps:.2} Gb/s, {baseline_gbps:.2} in the baseline ({drop_percent:.1}% lower)"
            ),
            Finding::LatencyRise {
                network,
                stat,
                baseline_us,
                us,
                rise_percent,
            } => format!(
                "REGRESSION network {network}: perftest {stat} latency {us:.2} us, {baseline_us:.2} in the baseline ({rise_percent:.1}% higher)"
            ),
            Finding::MissingPort { device, port } => {
                format!("REGRESSION {device} port {port}: in the baseline, not on the host now")
            }
            Finding::NewPort { device, port } => format!(
                "note {device} port {port}: not in the baseline (save a new baseline to include it)"
            ),
            Finding::NoPerftestNow { network } => {
                format!("note network {network}: perftest figures in the baseline, none given now")
            }
            Finding::Info {
                device,
                port,
                counter,
                baseline_per_sec,
                per_sec,
            } => format!(
                "info {device} port {port}: {counter} {per_sec:.1}/s (baseline {baseline_per_sec:.1}/s)"
            ),
        }
    }
}

/// The comparison: every finding, regressions first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Comparison {
    pub regressions: usize,
    pub thresholds: Thresholds,
    pub findings: Vec<Finding>,
}

impl Comparison {
    pub fn render_table(&self) -> String {
        let mut out = String::new();
        for f in &self.findings {
            let _ = writeln!(out, "{}", f.describe());
        }
        let _ = writeln!(
            out,
            "{} regression(s) against the baseline",
            self.regressions
        );
        out
    }
}

fn pct(base: f64, now: f64) -> f64 {
    (now - base) / base * 100.0
}

/// Compares `now` with `base`. Pure: the same inputs give the same findings.
pub fn compare(base: &Baseline, now: &Baseline, t: &Thresholds) -> Comparison {
    let mut findings = Vec::new();
    let now_ports: BTreeMap<(&str, u32), &PortRates> = now
        .ports
        .iter()
        .map(|p| ((p.device.as_str(), p.port), p))
        .collect();
    let base_ports: BTreeMap<(&str, u32), &PortRates> = base
        .ports
        .iter()
        .map(|p| ((p.device.as_str(), p.port), p))
        .collect();
    for (&(device, port), b) in &base_ports {
        let Some(n) = now_ports.get(&(device, port)) else {
            findings.push(Finding::MissingPort {
                device: device.into(),
                port,
            });
            continue;
        };
        for (counter, &per_sec) in &n.rates {
            let baseline = b.rates.get(counter).copied().unwrap_or(0.0);
            if ERROR_COUNTERS.contains(&counter.as_str()) {
                if baseline == 0.0 && per_sec > 0.0 {
                    findings.push(Finding::ErrorRateFromZero {
                        device: device.into(),
                        port,
                        counter: counter.clone(),
                        per_sec,
                    });
                }
            } else if counter.starts_with("pause/") {
                if per_sec > baseline * t.max_pause_factor && per_sec > t.min_pause_per_sec {
                    findings.push(Finding::PauseRateUp {
                        device: device.into(),
                        port,
                        counter: counter.clone(),
                        baseline_per_sec: baseline,
                        per_sec,
                    });
                } else {
                    // Within bounds: still worth reading next to ECN/CNP.
                    findings.push(Finding::Info {
                        device: device.into(),
                        port,
                        counter: counter.clone(),
                        baseline_per_sec: baseline,
                        per_sec,
                    });
                }
            } else if INFO_COUNTERS.contains(&counter.as_str()) {
                findings.push(Finding::Info {
                    device: device.into(),
                    port,
                    counter: counter.clone(),
                    baseline_per_sec: baseline,
                    per_sec,
                });
            }
        }
    }
    for &(device, port) in now_ports.keys() {
        if !base_ports.contains_key(&(device, port)) {
            findings.push(Finding::NewPort {
                device: device.into(),
                port,
            });
        }
    }
    for b in &base.perftest {
        let Some(n) = now.perftest.iter().find(|n| n.network == b.network) else {
            findings.push(Finding::NoPerftestNow {
                network: b.network.clone(),
            });
            continue;
        };
        if let (Some(bb), Some(nb)) = (b.bandwidth_gbps, n.bandwidth_gbps)
            && bb > 0.0
            && -pct(bb, nb) > t.max_bandwidth_drop_percent
        {
            findings.push(Finding::BandwidthDrop {
                network: b.network.clone(),
                baseline_gbps: bb,
                gbps: nb,
                drop_percent: -pct(bb, nb),
            });
        }
        for (stat, bl, nl) in [
            ("avg", b.latency_avg_us, n.latency_avg_us),
            ("p99", b.latency_p99_us, n.latency_p99_us),
        ] {
            if let (Some(bl), Some(nl)) = (bl, nl)
                && bl > 0.0
                && pct(bl, nl) > t.max_latency_rise_percent
            {
                findings.push(Finding::LatencyRise {
                    network: b.network.clone(),
                    stat: stat.into(),
                    baseline_us: bl,
                    us: nl,
                    rise_percent: pct(bl, nl),
                });
            }
        }
    }
    // Regressions first, the rest in the order found.
    findings.sort_by_key(|f| !f.is_regression());
    Comparison {
        regressions: findings.iter().filter(|f| f.is_regression()).count(),
        thresholds: *t,
        findings,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(device: &str, rates: &[(&str, f64)]) -> PortRates {
        PortRates {
            device: device.into(),
            port: 1,
            netdev: None,
            rates: rates.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        }
    }

    fn figures(network: &str, bw: f64, avg: f64, p99: f64) -> PerftestFigures {
        PerftestFigures {
            network: network.into(),
            run_id: "r".into(),
            finished_at: 1,
            bandwidth_gbps: Some(bw),
            latency_avg_us: Some(avg),
            latency_p99_us: Some(p99),
        }
    }

    fn baseline(ports: Vec<PortRates>, perftest: Vec<PerftestFigures>) -> Baseline {
        Baseline {
            version: BASELINE_VERSION,
            taken_at_ms: 1,
            interval_ms: 10_000,
            ports,
            perftest,
        }
    }

    fn base() -> Baseline {
        baseline(
            vec![port(
                "mlx5_0",
                &[
                    ("port/symbol_error", 0.0),
                    ("port/port_xmit_discards", 0.0),
                    ("hw/out_of_sequence", 0.5),
                    ("pause/rx_prio3_pause", 200.0),
                    ("pause/tx_prio3_pause", 0.0),
                    ("port/port_xmit_data", 1e9),
                    ("netdev/rx_dropped", 0.0),
                ],
            )],
            vec![figures("a", 97.0, 2.0, 3.0)],
        )
    }

    /// Each kind of regression, and values within threshold that are not.
    #[test]
    fn each_regression_kind_is_found_and_within_threshold_is_not() {
        let t = Thresholds::default();
        type Case = (&'static str, fn(&mut Baseline), Option<&'static str>);
        let cases: &[Case] = &[
            ("unchanged", |_| {}, None),
            (
                "error from zero",
                |b| {
                    b.ports[0].rates.insert("port/symbol_error".into(), 0.2);
                },
                Some("port/symbol_error at 0.200/s"),
            ),
            (
                "discards from zero",
                |b| {
                    b.ports[0]
                        .rates
                        .insert("port/port_xmit_discards".into(), 5.0);
                },
                Some("port/port_xmit_discards"),
            ),
            (
                // Already non-zero in the baseline: not "from zero".
                "error already moving",
                |b| {
                    b.ports[0].rates.insert("hw/out_of_sequence".into(), 0.7);
                },
                None,
            ),
            (
                // Netdev drops may be non-RDMA traffic: not judged.
                "netdev drops not judged",
                |b| {
                    b.ports[0].rates.insert("netdev/rx_dropped".into(), 9.0);
                },
                None,
            ),
            (
                "pause x4",
                |b| {
                    b.ports[0]
                        .rates
                        .insert("pause/rx_prio3_pause".into(), 800.0);
                },
                Some("pause/rx_prio3_pause at 800.0/s, 200.0/s"),
            ),
            (
                "pause x3 exactly is within",
                |b| {
                    b.ports[0]
                        .rates
                        .insert("pause/rx_prio3_pause".into(), 600.0);
                },
                None,
            ),
            (
                "pause from 0 below the floor",
                |b| {
                    b.ports[0].rates.insert("pause/tx_prio3_pause".into(), 50.0);
                },
                None,
            ),
            (
                "pause from 0 above the floor",
                |b| {
                    b.ports[0]
                        .rates
                        .insert("pause/tx_prio3_pause".into(), 150.0);
                },
                Some("pause/tx_prio3_pause at 150.0/s"),
            ),
            (
                "bandwidth -20%",
                |b| b.perftest[0].bandwidth_gbps = Some(77.6),
                Some("bandwidth 77.60 Gb/s, 97.00 in the baseline (20.0% lower)"),
            ),
            (
                "bandwidth -5% within",
                |b| b.perftest[0].bandwidth_gbps = Some(92.15),
                None,
            ),
            (
                "bandwidth up",
                |b| b.perftest[0].bandwidth_gbps = Some(99.0),
                None,
            ),
            (
                "avg latency +50%",
                |b| b.perftest[0].latency_avg_us = Some(3.0),
                Some("avg latency 3.00 us, 2.00 in the baseline (50.0% higher)"),
            ),
            (
                "p99 latency +40%",
                |b| b.perftest[0].latency_p99_us = Some(4.2),
                Some("p99 latency 4.20 us"),
            ),
            (
                "latency +10% within",
                |b| b.perftest[0].latency_avg_us = Some(2.2),
                None,
            ),
            (
                "port gone",
                |b| b.ports.clear(),
                Some("mlx5_0 port 1: in the baseline, not on the host now"),
            ),
        ];
        for (name, change, want) in cases {
            let mut now = base();
            change(&mut now);
            let c = compare(&base(), &now, &t);
            let regressions: Vec<String> = c
                .findings
                .iter()
                .filter(|f| f.is_regression())
                .map(Finding::describe)
                .collect();
            assert_eq!(c.regressions, regressions.len(), "{name}");
            match want {
                None => assert!(regressions.is_empty(), "{name}: {regressions:?}"),
                Some(w) => {
                    assert_eq!(regressions.len(), 1, "{name}: {regressions:?}");
                    assert!(regressions[0].contains(w), "{name}: {regressions:?}");
                }
            }
        }
    }

    #[test]
    fn new_port_and_missing_perftest_are_notes_traffic_is_info() {
        let mut now = base();
        now.ports
            .push(port("mlx5_1", &[("port/symbol_error", 0.0)]));
        now.perftest.clear();
        let c = compare(&base(), &now, &Thresholds::default());
        assert_eq!(c.regressions, 0, "{c:?}");
        let text = c.render_table();
        for want in [
            "note mlx5_1 port 1: not in the baseline",
            "note network a: perftest figures in the baseline, none given now",
            "info mlx5_0 port 1: port/port_xmit_data",
            "info mlx5_0 port 1: pause/rx_prio3_pause 200.0/s (baseline 200.0/s)",
            "0 regression(s) against the baseline",
        ] {
            assert!(text.contains(want), "{want:?} not in\n{text}");
        }
        // Regressions come first in the table.
        now.ports[0].rates.insert("port/symbol_error".into(), 1.0);
        let c = compare(&base(), &now, &Thresholds::default());
        assert!(c.findings[0].is_regression(), "{c:?}");
        let json = serde_json::to_value(&c).unwrap();
        assert_eq!(json["regressions"], 1);
        assert_eq!(json["findings"][0]["kind"], "errorRateFromZero");
        assert_eq!(json["findings"][0]["counter"], "port/symbol_error");
    }

    #[test]
    fn a_saved_baseline_reads_back_and_bad_files_name_path_and_field() {
        let b = base();
        let text = serde_json::to_string(&b).unwrap();
        assert_eq!(parse(&text, "/x/b.json").unwrap(), b);
        let cases = [
            ("{", "/x/b.json: not a counters baseline"),
            (r#"{"takenAtMs":1}"#, "/x/b.json: field `version`: missing"),
            (
                r#"{"version":"1"}"#,
                "/x/b.json: field `version`: not a whole number",
            ),
            (
                r#"{"version":0,"ports":[]}"#,
                "/x/b.json: field `version` is 0, this kroce reads version 1",
            ),
            (
                r#"{"version":1,"takenAtMs":1,"intervalMs":1}"#,
                "missing field `ports`",
            ),
            (
                r#"{"version":1,"takenAtMs":1,"intervalMs":1,"ports":[{"device":"d","port":1,"rates":{"port/symbol_error":-1}}]}"#,
                "/x/b.json: field `ports[0].rates.port/symbol_error`: -1 is not a rate",
            ),
            (
                r#"{"version":1,"takenAtMs":1,"intervalMs":1,"ports":[],"extra":1}"#,
                "unknown field `extra`",
            ),
        ];
        for (text, want) in cases {
            let err = parse(text, "/x/b.json").unwrap_err().to_string();
            assert!(err.contains(want), "{text}: {err}");
            assert!(err.contains("/x/b.json"), "{text}: {err}");
        }
    }

    #[test]
    fn rates_become_keyed_port_rates() {
        use crate::counters::Direction;
        let r = |source, name: &str, per_sec| CounterRate {
            device: "mlx5_0".into(),
            port: 1,
            netdev: Some("ens1f0".into()),
            source,
            name: name.into(),
            delta: 1,
            per_sec,
        };
        let ports = port_rates(&[
            r(CounterSource::Port, "symbol_error", 0.0),
            r(
                CounterSource::Pause {
                    direction: Direction::Rx,
                    priority: Some(3),
                },
                "rx_prio3_pause",
                5.0,
            ),
            r(CounterSource::PhyDiscard, "rx_discards_phy", 1.0),
        ]);
        assert_eq!(ports.len(), 1);
        assert_eq!(ports[0].netdev.as_deref(), Some("ens1f0"));
        let keys: Vec<&str> = ports[0].rates.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "pause/rx_prio3_pause",
                "phy/rx_discards_phy",
                "port/symbol_error"
            ]
        );
    }
}
