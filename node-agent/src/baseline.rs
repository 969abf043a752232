//! `doctor --baseline save|compare`: the edge of
//! `kroce_admission::doctor::baseline`. Samples the node's RDMA counters
//! twice, `--baseline-interval-seconds` apart (the counters code the agent
//! serves `/metrics` from, under a host root given as a value), reads the
//! perftest figures from an RdmaNodeState file, and saves the baseline or
//! compares with the saved one. The judging is the pure core's.

use crate::counters::{CounterScope, Counters, EthtoolCommand, EthtoolSource, NoEthtool};
use kroce_admission::counters::rates;
use kroce_admission::doctor::baseline::{
    self, BASELINE_VERSION, Baseline, BaselineError, Comparison, PerftestFigures, Thresholds,
    port_rates,
};
use kroce_operator::crd::RdmaNodeStateStatus;
use sriov_helpers::{Host, HostRoot};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// The baseline file's name in the node agent's state dir.
pub const BASELINE_FILE: &str = "counters-baseline.json";

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BaselineMode {
    /// Sample the counters and record them with the last passing perftest
    /// figures.
    Save,
    /// Sample again and report regressions against the saved baseline
    /// (exit 1 when any).
    Compare,
}

/// `doctor --baseline` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct BaselineArgs {
    /// Instead of the checks: save a counters baseline, or compare the
    /// counters now with it (after a driver, firmware or switch change).
    #[arg(long, value_enum)]
    pub baseline: Option<BaselineMode>,
    /// The baseline file [default: <state-dir>/counters-baseline.json]
    /// (the installer's setting, not a tenant's).
    #[arg(long)]
    pub baseline_file: Option<PathBuf>,
    /// Counter rates are sampled over this many seconds (run the same
    /// benchmark load during save and compare).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub baseline_interval_seconds: u64,
    /// This node's RdmaNodeState (YAML or JSON, e.g. `kubectl get
    /// rdmanodestate <node> -o yaml`): its status.admission gives the
    /// perftest figures (save: the last passing run per network; compare:
    /// the last run). Without it, counters only.
    #[arg(long)]
    pub node_state: Option<PathBuf>,
    /// `ethtool` for per-priority pause and PHY discard counters ("" to skip).
    #[arg(long = "baseline-ethtool", default_value = "ethtool",
          value_parser = clap::builder::TypedValueParser::map(clap::builder::OsStringValueParser::new(), PathBuf::from))]
    pub ethtool: PathBuf,
    /// A regression: perftest bandwidth lower by more than this percent.
    #[arg(long, default_value_t = Thresholds::default().max_bandwidth_drop_percent)]
    pub max_bandwidth_drop_percent: f64,
    /// A regression: perftest latency (avg or p99) higher by more than this percent.
    #[arg(long, default_value_t = Thresholds::default().max_latency_rise_percent)]
    pub max_latency_rise_percent: f64,
    /// A regression: a pause counter's rate above the baseline's times this...
    #[arg(long, default_value_t = Thresholds::default().max_pause_factor)]
    pub max_pause_factor: f64,
    /// ...and above this many frames per second.
    #[arg(long, default_value_t = Thresholds::default().min_pause_per_sec)]
    pub min_pause_per_sec: f64,
}

#[derive(Debug, thiserror::Error)]
pub enum BaselineCliError {
    #[error(transparent)]
    Baseline(#[from] BaselineError),
    #[error("{path}: {reason}")]
    Io { path: String, reason: String },
    #[error("--{flag} {value}: {reason}")]
    Flag {
        flag: &'static str,
        value: f64,
        reason: &'static str,
    },
    #[error("sampling the counters: {0}")]
    Sample(String),
}

impl BaselineArgs {
    pub fn thresholds(&self) -> Result<Thresholds, BaselineCliError> {
        for (flag, value) in [
            (
                "max-bandwidth-drop-percent",
                self.max_bandwidth_drop_percent,
            ),
            ("max-latency-rise-percent", self.max_latency_rise_percent),
            ("max-pause-factor", self.max_pause_factor),
            ("min-pause-per-sec", self.min_pause_per_sec),
        ] {
            if !value.is_finite() || value < 0.0 {
                return Err(BaselineCliError::Flag {
                    flag,
                    value,
                    reason: "must be a finite number >= 0",
                });
            }
        }
        Ok(Thresholds {
            max_bandwidth_drop_percent: self.max_bandwidth_drop_percent,
            max_latency_rise_percent: self.max_latency_rise_percent,
            max_pause_factor: self.max_pause_factor,
            min_pause_per_sec: self.min_pause_per_sec,
        })
    }

    /// The baseline file: the flag, else under the agent's state dir.
    pub fn file(&self, state_dir: &Path) -> PathBuf {
        self.baseline_file
            .clone()
            .unwrap_or_else(|| state_dir.join(BASELINE_FILE))
    }

    fn ethtool(&self) -> Arc<dyn EthtoolSource> {
        if self.ethtool.as_os_str().is_empty() {
            Arc::new(NoEthtool)
        } else {
            Arc::new(EthtoolCommand {
                program: self.ethtool.clone(),
                timeout: Duration::from_secs(10),
            })
        }
    }
}

fn io_err(path: &Path, e: impl std::fmt::Display) -> BaselineCliError {
    BaselineCliError::Io {
        path: path.display().to_string(),
        reason: e.to_string(),
    }
}

/// Perftest figures per network from an RdmaNodeState status: the last
/// run, or only a passing one (`passed_only`, what a baseline records).
pub fn perftest_figures(status: &RdmaNodeStateStatus, passed_only: bool) -> Vec<PerftestFigures> {
    status
        .admission
        .iter()
        .filter_map(|a| {
            let r = a.state.last_result.as_ref()?;
            if passed_only && !r.passed {
                return None;
            }
            let m = r.measurement.clone().unwrap_or_default();
            Some(PerftestFigures {
                network: a.network.clone(),
                run_id: r.run_id.clone(),
                finished_at: r.finished_at,
                bandwidth_gbps: m.bandwidth_gbps,
                latency_avg_us: m.latency_avg_us,
                latency_p99_us: m.latency_p99_us,
            })
        })
        .collect()
}

/// Reads an RdmaNodeState (or just its status) from YAML or JSON.
pub fn read_node_state(path: &Path) -> Result<RdmaNodeStateStatus, BaselineCliError> {
    let text = std::fs::read_to_string(path).map_err(|e| io_err(path, e))?;
    let value: serde_json::Value =
        serde_saphyr::from_str(&text).map_err(|e| io_err(path, format!("not YAML/JSON: {e}")))?;
    let status = value.get("status").cloned().unwrap_or(value);
    serde_json::from_value(status)
        .map_err(|e| io_err(path, format!("not an RdmaNodeState status: {e}")))
}

/// Two counter snapshots `interval` apart (`sleep` waits), as per-port rates.
pub fn sample(
    counters: &Counters,
    interval: Duration,
    now_ms: &dyn Fn() -> u64,
    sleep: &dyn Fn(Duration),
) -> Result<Baseline, BaselineCliError> {
    let first = counters.snapshot(&Host::scan(&counters.root), now_ms());
    sleep(interval);
    let second = counters.snapshot(&Host::scan(&counters.root), now_ms());
    for e in first.errors.iter().chain(&second.errors) {
        eprintln!("warning: {e}");
    }
    let r = rates(&first, &second).map_err(|e| BaselineCliError::Sample(e.to_string()))?;
    Ok(Baseline {
        version: BASELINE_VERSION,
        taken_at_ms: second.taken_at_ms,
        interval_ms: second.taken_at_ms - first.taken_at_ms,
        ports: port_rates(&r),
        perftest: Vec::new(),
    })
}

/// Writes the baseline next to its final name, then renames: a reader never
/// sees half a file, a failed save leaves the old one.
pub fn write(path: &Path, b: &Baseline) -> Result<(), BaselineCliError> {
    let text = serde_json::to_string_pretty(b).map_err(|e| io_err(path, e))?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        use std::os::unix::fs::DirBuilderExt as _;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| io_err(dir, e))?;
    }
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, text + "\n").map_err(|e| io_err(&tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| io_err(path, e))
}

/// What `--baseline` did.
#[derive(Debug)]
pub enum Outcome {
    Saved { path: PathBuf, baseline: Baseline },
    Compared(Comparison),
}

/// Runs `--baseline save|compare` against `root`; the file is `file`.
pub fn run(
    mode: BaselineMode,
    args: &BaselineArgs,
    root: HostRoot,
    file: &Path,
) -> Result<Outcome, BaselineCliError> {
    let thresholds = args.thresholds()?;
    // Read inputs before sampling: a bad file fails at once.
    let status = args
        .node_state
        .as_deref()
        .map(read_node_state)
        .transpose()?;
    let saved = match mode {
        BaselineMode::Compare => {
            let text = std::fs::read_to_string(file).map_err(|e| io_err(file, e))?;
            Some(baseline::parse(&text, &file.display().to_string())?)
        }
        BaselineMode::Save => None,
    };
    let counters = Counters {
        root,
        node: "local".into(),
        scope: CounterScope::Pfs,
        ethtool: args.ethtool(),
    };
    let mut now = sample(
        &counters,
        Duration::from_secs(args.baseline_interval_seconds),
        &crate::counters::now_ms,
        &std::thread::sleep,
    )?;
    match saved {
        None => {
            now.perftest = status
                .as_ref()
                .map(|s| perftest_figures(s, true))
                .unwrap_or_default();
            write(file, &now)?;
            Ok(Outcome::Saved {
                path: file.to_path_buf(),
                baseline: now,
            })
        }
        Some(base) => {
            now.perftest = status
                .as_ref()
                .map(|s| perftest_figures(s, false))
                .unwrap_or_default();
            Ok(Outcome::Compared(baseline::compare(
                &base,
                &now,
                &thresholds,
            )))
        }
    }
}

impl Outcome {
    /// For an admin (`json`: machine-readable).
    pub fn render(&self, json: bool) -> Result<String, serde_json::Error> {
        Ok(match (self, json) {
            (Outcome::Saved { path, baseline }, true) => {
                serde_json::to_string_pretty(
                    &serde_json::json!({"saved": path.display().to_string(), "baseline": baseline}),
                )? + "\n"
            }
            (Outcome::Saved { path, baseline }, false) => {
                let mut out = format!(
                    "saved a counters baseline of {} port(s) over {} ms to {}\n",
                    baseline.ports.len(),
                    baseline.interval_ms,
                    path.display()
                );
                for f in &baseline.perftest {
                    out.push_str(&format!(
                        "perftest {} (run {}): bandwidth {:?} Gb/s, latency avg {:?} us, p99 {:?} us\n",
                        f.network, f.run_id, f.bandwidth_gbps, f.latency_avg_us, f.latency_p99_us
                    ));
                }
                out
            }
            (Outcome::Compared(c), true) => serde_json::to_string_pretty(c)? + "\n",
            (Outcome::Compared(c), false) => c.render_table(),
        })
    }

    pub fn regressed(&self) -> bool {
        matches!(self, Outcome::Compared(c) if c.regressions > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kroce_admission::lifecycle::AdmissionRecord;
    use kroce_admission::thresholds::Measurement;
    use kroce_operator::crd::NetworkAdmission;

    fn admission(network: &str, passed: bool, bw: f64) -> NetworkAdmission {
        let mut a = NetworkAdmission {
            network: network.into(),
            ..Default::default()
        };
        a.state.last_result = Some(Box::new(AdmissionRecord {
            run_id: format!("run-{network}"),
            peer: "n2".into(),
            finished_at: 7,
            passed,
            measurement: Some(Measurement {
                bandwidth_gbps: Some(bw),
                latency_avg_us: Some(2.0),
                latency_p99_us: None,
                port_rate_gbps: Some(100.0),
            }),
            message: String::new(),
        }));
        a
    }

    #[test]
    fn figures_come_from_the_admission_result_passing_only_for_a_baseline() {
        let status = RdmaNodeStateStatus {
            admission: vec![
                admission("a", true, 97.0),
                admission("b", false, 40.0),
                NetworkAdmission {
                    network: "never".into(),
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        let saved = perftest_figures(&status, true);
        assert_eq!(saved.len(), 1);
        assert_eq!(
            (saved[0].network.as_str(), saved[0].bandwidth_gbps),
            ("a", Some(97.0))
        );
        let now = perftest_figures(&status, false);
        assert_eq!(now.len(), 2);
        assert_eq!(now[1].bandwidth_gbps, Some(40.0));
    }

    #[test]
    fn a_node_state_file_names_itself_when_bad() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("ns.yaml");
        std::fs::write(&p, "status:\n  admission: 3\n").unwrap();
        let err = read_node_state(&p).unwrap_err().to_string();
        assert!(
            err.contains("ns.yaml") && err.contains("not an RdmaNodeState status"),
            "{err}"
        );
        let err = read_node_state(&dir.path().join("missing.yaml"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("missing.yaml"), "{err}");
    }
}
