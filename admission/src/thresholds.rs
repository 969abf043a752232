//! Admission thresholds (the `admission` section of an `RdmaNetwork`) and
//! the verdict on a node's measured numbers: pass, or which number missed
//! and by how much.

use crate::perftest::PerftestReport;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;

/// What a node must reach to be admitted. Unset limits are not checked;
/// when both bandwidth limits are set, both must hold.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionThresholds {
    /// Minimum average bandwidth in Gbit/s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_bandwidth_gbps: Option<f64>,
    /// Minimum average bandwidth as a fraction (0, 1] of the port rate read
    /// from `ports/<n>/rate`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_bandwidth_fraction: Option<f64>,
    /// Maximum average latency (`t_avg`) in microseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_latency_us: Option<f64>,
    /// Maximum 99th-percentile latency in microseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_p99_latency_us: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ThresholdError {
    #[error("admission.{field}: {value} is invalid: {reason}")]
    Invalid {
        field: &'static str,
        value: f64,
        reason: &'static str,
    },
}

impl AdmissionThresholds {
    /// Checks every field; the error names the field (as the CRD spells it)
    /// and the value.
    pub fn validate(&self) -> Result<(), ThresholdError> {
        let positive = |field, v: Option<f64>| match v {
            Some(value) if !value.is_finite() || value <= 0.0 => Err(ThresholdError::Invalid {
                field,
                value,
                reason: "must be a positive number",
            }),
            _ => Ok(()),
        };
        positive("minBandwidthGbps", self.min_bandwidth_gbps)?;
        positive("maxLatencyUs", self.max_latency_us)?;
        positive("maxP99LatencyUs", self.max_p99_latency_us)?;
        if let Some(value) = self.min_bandwidth_fraction
            && (!value.is_finite() || value <= 0.0 || value > 1.0)
        {
            return Err(ThresholdError::Invalid {
                field: "minBandwidthFraction",
                value,
                reason: "must be in (0, 1]",
            });
        }
        Ok(())
    }
}

/// The numbers a test run produced, plus the port rate for fractions.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Measurement {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bandwidth_gbps: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_avg_us: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_p99_us: Option<f64>,
    /// From `ports/<n>/rate` of the device under test.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port_rate_gbps: Option<f64>,
}

impl Measurement {
    /// Takes the best average bandwidth of the bandwidth run (its only row
    /// for a single-size run) and `t_avg` / 99% of the latency run's first
    /// row (admission runs one size).
    pub fn from_reports(
        bandwidth: Option<&PerftestReport>,
        latency: Option<&PerftestReport>,
        port_rate_gbps: Option<f64>,
    ) -> Measurement {
        let lat = latency.and_then(|r| r.latency_rows().first());
        Measurement {
            bandwidth_gbps: bandwidth.and_then(PerftestReport::best_average_gbps),
            latency_avg_us: lat.and_then(|r| r.t_avg_us),
            latency_p99_us: lat.and_then(|r| r.p99_us),
            port_rate_gbps,
        }
    }
}

/// Which limit a check is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Limit {
    MinBandwidthGbps,
    MinBandwidthFraction,
    MaxLatencyUs,
    MaxP99LatencyUs,
}

/// One limit checked against one number.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LimitCheck {
    pub limit: Limit,
    pub measured: Option<f64>,
    /// The threshold in the measured number's unit (for a fraction: Gbit/s).
    pub threshold: Option<f64>,
    pub passed: bool,
    /// How far the number is on the wrong side (0 when passed).
    pub shortfall: f64,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Verdict {
    pub passed: bool,
    pub checks: Vec<LimitCheck>,
    /// One line for a condition or event: every failed check, or the
    /// numbers that passed.
    pub message: String,
}

fn pct(part: f64, whole: f64) -> f64 {
    if whole == 0.0 {
        0.0
    } else {
        part / whole * 100.0
    }
}

fn min_check(limit: Limit, what: &str, measured: Option<f64>, threshold: f64) -> LimitCheck {
    match measured {
        None => LimitCheck {
            limit,
            measured,
            threshold: Some(threshold),
            passed: false,
            shortfall: threshold,
            message: format!("{what} was not measured (minimum {threshold:.2} Gb/s)"),
        },
        Some(m) if m >= threshold => LimitCheck {
            limit,
            measured,
            threshold: Some(threshold),
            passed: true,
            shortfall: 0.0,
            message: format!("{what} {m:.2} Gb/s >= minimum {threshold:.2} Gb/s"),
        },
        Some(m) => {
            let short = threshold - m;
            LimitCheck {
                limit,
                measured,
                threshold: Some(threshold),
                passed: false,
                shortfall: short,
                message: format!(
                    "{what} {m:.2} Gb/s is {short:.2} Gb/s ({:.1}%) below the minimum {threshold:.2} Gb/s",
                    pct(short, threshold)
                ),
            }
        }
    }
}

fn max_check(limit: Limit, what: &str, measured: Option<f64>, threshold: f64) -> LimitCheck {
    match measured {
        None => LimitCheck {
            limit,
            measured,
            threshold: Some(threshold),
            passed: false,
            shortfall: 0.0,
            message: format!(
                "{what} was not measured (maximum {threshold:.2} us; perftest too old to print it?)"
            ),
        },
        Some(m) if m <= threshold => LimitCheck {
            limit,
            measured,
            threshold: Some(threshold),
            passed: true,
            shortfall: 0.0,
            message: format!("{what} {m:.2} us <= maximum {threshold:.2} us"),
        },
        Some(m) => {
            let over = m - threshold;
            LimitCheck {
                limit,
                measured,
                threshold: Some(threshold),
                passed: false,
                shortfall: over,
                message: format!(
                    "{what} {m:.2} us is {over:.2} us ({:.1}%) above the maximum {threshold:.2} us",
                    pct(over, threshold)
                ),
            }
        }
    }
}

/// Compares a measurement with the thresholds. Invalid thresholds are an
/// error (nothing is judged on them).
pub fn evaluate(
    thresholds: &AdmissionThresholds,
    m: &Measurement,
) -> Result<Verdict, ThresholdError> {
    thresholds.validate()?;
    let mut checks = Vec::new();
    if let Some(t) = thresholds.min_bandwidth_gbps {
        checks.push(min_check(
            Limit::MinBandwidthGbps,
            "bandwidth",
            m.bandwidth_gbps,
            t,
        ));
    }
    if let Some(f) = thresholds.min_bandwidth_fraction {
        match m.port_rate_gbps {
            Some(rate) if rate > 0.0 => {
                let mut c = min_check(
                    Limit::MinBandwidthFraction,
                    "bandwidth",
                    m.bandwidth_gbps,
                    f * rate,
                );
                let _ = write!(
                    c.message,
                    " ({:.0}% of the {rate:.0} Gb/s port rate)",
                    f * 100.0
                );
                checks.push(c);
            }
            _ => checks.push(LimitCheck {
                limit: Limit::MinBandwidthFraction,
                measured: m.bandwidth_gbps,
                threshold: None,
                passed: false,
                shortfall: 0.0,
                message: format!(
                    "minBandwidthFraction {f} cannot be judged: the port rate (ports/<n>/rate) is unknown"
                ),
            }),
        }
    }
    if let Some(t) = thresholds.max_latency_us {
        checks.push(max_check(
            Limit::MaxLatencyUs,
            "average latency",
            m.latency_avg_us,
            t,
        ));
    }
    if let Some(t) = thresholds.max_p99_latency_us {
        checks.push(max_check(
            Limit::MaxP99LatencyUs,
            "p99 latency",
            m.latency_p99_us,
            t,
        ));
    }
    let passed = checks.iter().all(|c| c.passed);
    let shown: Vec<&str> = checks
        .iter()
        .filter(|c| c.passed == passed)
        .map(|c| c.message.as_str())
        .collect();
    let message = if checks.is_empty() {
        "no admission thresholds configured".to_string()
    } else {
        shown.join("; ")
    };
    Ok(Verdict {
        passed,
        checks,
        message,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_names_the_field_and_value() {
        let t = AdmissionThresholds {
            min_bandwidth_fraction: Some(1.5),
            ..Default::default()
        };
        let e = t.validate().unwrap_err().to_string();
        assert!(
            e.contains("minBandwidthFraction") && e.contains("1.5"),
            "{e}"
        );
        let t = AdmissionThresholds {
            max_latency_us: Some(-1.0),
            ..Default::default()
        };
        let e = t.validate().unwrap_err().to_string();
        assert!(e.contains("maxLatencyUs") && e.contains("-1"), "{e}");
        let t = AdmissionThresholds {
            min_bandwidth_gbps: Some(f64::NAN),
            ..Default::default()
        };
        assert!(t.validate().is_err());
    }

    #[test]
    fn serde_uses_crd_field_names() {
        let t: AdmissionThresholds = serde_json::from_str(
            r#"{"minBandwidthGbps": 90, "minBandwidthFraction": 0.8, "maxLatencyUs": 6, "maxP99LatencyUs": 8}"#,
        )
        .unwrap();
        assert_eq!(t.min_bandwidth_gbps, Some(90.0));
        assert_eq!(t.min_bandwidth_fraction, Some(0.8));
        assert_eq!(t.max_latency_us, Some(6.0));
        assert_eq!(t.max_p99_latency_us, Some(8.0));
    }
}
