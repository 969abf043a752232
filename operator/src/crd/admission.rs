//! The `admission` block of an `RdmaNetwork` (how a node proves itself
//! with perftests before it serves RDMA pods) and what the controller
//! records about it in `RdmaNodeState.status.admission`. The flow itself is
//! `controller::admission` over the pure core in `kroce-admission`.

use super::conditions::Condition;
use kroce_admission::command::{PerftestSpec, PerftestTool};
use kroce_admission::lifecycle::{AdmissionPolicy, AdmissionRecord, Marking};
use kroce_admission::pod_run::{DEFAULT_BW_PORT, DEFAULT_LAT_PORT, Role, RunnerArgs};
use kroce_admission::thresholds::AdmissionThresholds;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How a node that has not passed admission is kept away from RDMA pods.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum AdmissionGate {
    /// Taint `kroce.io/rdma-unready:NoSchedule` until admitted.
    #[default]
    Taint,
    /// No taint; label `kroce.io/rdma-ready=true` once admitted (pods select it).
    Label,
}

impl AdmissionGate {
    pub fn marking(self) -> Marking {
        match self {
            AdmissionGate::Taint => Marking::Taint,
            AdmissionGate::Label => Marking::Label,
        }
    }
}

/// The latency test.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum LatencyTest {
    /// `ib_read_lat` (a full round trip per operation).
    #[default]
    ReadLat,
    /// `ib_write_lat`.
    WriteLat,
}

impl LatencyTest {
    pub fn tool(self) -> PerftestTool {
        match self {
            LatencyTest::ReadLat => PerftestTool::IbReadLat,
            LatencyTest::WriteLat => PerftestTool::IbWriteLat,
        }
    }
}

fn default_true() -> bool {
    true
}
fn default_duration() -> u32 {
    10
}
fn default_message_size() -> u32 {
    65536
}
fn default_queue_pairs() -> u32 {
    4
}
fn default_iterations() -> u32 {
    10000
}
fn default_max_concurrent() -> u32 {
    2
}
fn default_timeout() -> u64 {
    600
}
fn default_backoff() -> u64 {
    60
}
fn default_max_backoff() -> u64 {
    3600
}

/// Size of the latency test's messages (perftest's default for `_lat`).
const LATENCY_MESSAGE_BYTES: u64 = 2;

/// Perftest admission settings. Omit the whole block to admit nodes on
/// configuration alone.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionSpec {
    /// `false` admits a node as soon as its node state is in sync.
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// Minimum `ib_write_bw` bandwidth, Gb/s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0))]
    pub min_bandwidth_gbps: Option<f64>,
    /// Minimum bandwidth as a fraction of the port rate (`ports/<n>/rate`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub min_bandwidth_fraction: Option<f64>,
    /// Maximum average latency (`ib_read_lat`/`ib_write_lat`), microseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0))]
    pub max_latency_us: Option<f64>,
    /// Maximum 99th-percentile latency, microseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0))]
    pub max_p99_latency_us: Option<f64>,
    /// Bandwidth test duration (`-D`), seconds.
    #[serde(default = "default_duration")]
    #[schemars(range(min = 1, max = 3600))]
    pub duration_seconds: u32,
    /// Bandwidth message size (`-s`), bytes.
    #[serde(default = "default_message_size")]
    #[schemars(range(min = 1, max = 2147483647))]
    pub message_size: u32,
    /// Queue pairs (`-q`).
    #[serde(default = "default_queue_pairs")]
    #[schemars(range(min = 1, max = 1024))]
    pub queue_pairs: u32,
    /// `readLat` (`ib_read_lat`, default) or `writeLat` (`ib_write_lat`).
    #[serde(default)]
    pub latency_test: LatencyTest,
    /// Latency test iterations (`-n`; perftest refuses fewer than 5).
    #[serde(default = "default_iterations")]
    #[schemars(range(min = 5, max = 100000000))]
    pub iterations: u32,
    /// Image with perftest and `kroce-perftest-run`; the operator's
    /// `--perftest-image` when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Nodes of this network tested at once.
    #[serde(default = "default_max_concurrent")]
    #[schemars(range(min = 1))]
    pub max_concurrent_nodes: u32,
    /// Re-test admitted nodes this often; never when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 60))]
    pub retest_interval_seconds: Option<u64>,
    /// A run without a result after this long fails and its pods are deleted.
    #[serde(default = "default_timeout")]
    #[schemars(range(min = 30, max = 86400))]
    pub test_timeout_seconds: u64,
    /// First retry delay after a failed run; doubles per consecutive failure.
    #[serde(default = "default_backoff")]
    #[schemars(range(min = 1))]
    pub retry_backoff_seconds: u64,
    /// The retry delay never exceeds this.
    #[serde(default = "default_max_backoff")]
    #[schemars(range(min = 1))]
    pub max_retry_backoff_seconds: u64,
    /// `taint` (default) or `label`.
    #[serde(default)]
    pub gate: AdmissionGate,
}

impl Default for AdmissionSpec {
    fn default() -> Self {
        AdmissionSpec {
            enabled: true,
            min_bandwidth_gbps: None,
            min_bandwidth_fraction: None,
            max_latency_us: None,
            max_p99_latency_us: None,
            duration_seconds: default_duration(),
            message_size: default_message_size(),
            queue_pairs: default_queue_pairs(),
            latency_test: LatencyTest::default(),
            iterations: default_iterations(),
            image: None,
            max_concurrent_nodes: default_max_concurrent(),
            retest_interval_seconds: None,
            test_timeout_seconds: default_timeout(),
            retry_backoff_seconds: default_backoff(),
            max_retry_backoff_seconds: default_max_backoff(),
            gate: AdmissionGate::default(),
        }
    }
}

impl AdmissionSpec {
    /// The settings of a network: its block, or (no block) admission on
    /// configuration alone with the default gate.
    pub fn of(spec: Option<&AdmissionSpec>) -> AdmissionSpec {
        spec.cloned().unwrap_or(AdmissionSpec {
            enabled: false,
            ..Default::default()
        })
    }

    pub fn policy(&self) -> AdmissionPolicy {
        AdmissionPolicy {
            enabled: self.enabled,
            marking: self.gate.marking(),
            max_concurrent_nodes: self.max_concurrent_nodes,
            test_timeout_seconds: self.test_timeout_seconds,
            backoff_base_seconds: self.retry_backoff_seconds,
            backoff_max_seconds: self.max_retry_backoff_seconds,
            retest_interval_seconds: self.retest_interval_seconds,
        }
    }

    pub fn thresholds(&self) -> AdmissionThresholds {
        AdmissionThresholds {
            min_bandwidth_gbps: self.min_bandwidth_gbps,
            min_bandwidth_fraction: self.min_bandwidth_fraction,
            max_latency_us: self.max_latency_us,
            max_p99_latency_us: self.max_p99_latency_us,
        }
    }

    pub fn bandwidth_spec(&self) -> PerftestSpec {
        PerftestSpec::bandwidth(
            PerftestTool::IbWriteBw,
            self.duration_seconds,
            u64::from(self.message_size),
            self.queue_pairs,
            DEFAULT_BW_PORT,
        )
    }

    pub fn latency_spec(&self) -> PerftestSpec {
        PerftestSpec::latency(
            self.latency_test.tool(),
            self.iterations,
            LATENCY_MESSAGE_BYTES,
            DEFAULT_LAT_PORT,
        )
    }

    /// The test pod's runner arguments for one side.
    pub fn runner_args(&self, role: Role) -> RunnerArgs {
        RunnerArgs::new(role, &self.bandwidth_spec(), &self.latency_spec())
    }

    /// Everything the schema cannot check; each message names the field as
    /// `spec.admission.<field>` and its value.
    pub fn validate(&self) -> Result<(), Vec<String>> {
        let mut errors = Vec::new();
        let field = |e: String| format!("spec.{e}");
        if let Err(e) = self.thresholds().validate() {
            errors.push(field(e.to_string()));
        }
        if let Err(e) = self.policy().validate() {
            errors.push(field(e.to_string()));
        }
        if let Err(e) = self.runner_args(Role::Server).validate() {
            errors.push(format!("spec.admission: {e}"));
        }
        // The bandwidth test alone takes durationSeconds.
        if self.enabled && self.test_timeout_seconds <= u64::from(self.duration_seconds) + 10 {
            errors.push(format!(
                "spec.admission.testTimeoutSeconds = {}: must exceed durationSeconds ({}) by more than 10",
                self.test_timeout_seconds, self.duration_seconds
            ));
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors)
        }
    }
}

/// A finished admission run, as recorded in `RdmaNodeState.status`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionResult {
    pub run_id: String,
    /// The node at the other end of the test.
    pub peer: String,
    /// RFC 3339.
    pub finished_at: String,
    pub passed: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bandwidth_gbps: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_avg_us: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_p99_us: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port_rate_gbps: Option<f64>,
    /// Which number missed and by how much, the numbers that passed, or
    /// why the run produced none.
    pub message: String,
}

impl AdmissionResult {
    pub fn from_record(r: &AdmissionRecord) -> AdmissionResult {
        let m = r.measurement.clone().unwrap_or_default();
        AdmissionResult {
            run_id: r.run_id.clone(),
            peer: r.peer.clone(),
            finished_at: rfc3339(r.finished_at),
            passed: r.passed,
            bandwidth_gbps: m.bandwidth_gbps,
            latency_avg_us: m.latency_avg_us,
            latency_p99_us: m.latency_p99_us,
            port_rate_gbps: m.port_rate_gbps,
            message: r.message.clone(),
        }
    }
}

/// Unix seconds as RFC 3339 (the epoch when out of range).
pub fn rfc3339(secs: u64) -> String {
    i64::try_from(secs)
        .ok()
        .and_then(|s| k8s_openapi::jiff::Timestamp::from_second(s).ok())
        .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)
        .to_string()
}

/// One network's admission of this node, written by the controller (field
/// manager `kroce-admission`, separate from the node agent's).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkAdmission {
    pub network: String,
    /// `Pending`, `Testing`, `Admitted` or `Failed`.
    pub phase: String,
    /// The node may take this network's pods (admitted, or re-tested while admitted).
    pub schedulable: bool,
    /// What the node is waiting for, or why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_result: Option<Box<AdmissionResult>>,
    /// `Admitted`: False with the missed number and by how much after a failed run.
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// The admission state machine's own record (kroce-admission's
    /// `NodeAdmission`), kept verbatim between reconciles.
    // Typed, not a JSON tree: thousands of nodes x networks of these sit in
    // the controller's store, and a tree costs several times the memory.
    // One that cannot be read counts as a fresh record (the schema makes
    // the field required).
    #[schemars(schema_with = "opaque_object")]
    #[serde(deserialize_with = "lenient_record")]
    pub state: kroce_admission::lifecycle::NodeAdmission,
}

fn lenient_record<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<kroce_admission::lifecycle::NodeAdmission, D::Error> {
    let v = serde_json::Value::deserialize(d)?;
    Ok(serde_json::from_value(v).unwrap_or_default())
}

fn opaque_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absent_block_admits_on_configuration_with_the_taint_gate() {
        let s = AdmissionSpec::of(None);
        assert!(!s.enabled);
        assert_eq!(s.policy().marking, Marking::Taint);
        assert!(s.validate().is_ok());
    }

    #[test]
    fn spec_maps_onto_policy_thresholds_and_runner_args() {
        let s: AdmissionSpec = serde_json::from_value(serde_json::json!({
            "minBandwidthGbps": 90, "maxP99LatencyUs": 8, "durationSeconds": 5,
            "queuePairs": 2, "latencyTest": "writeLat", "iterations": 1000,
            "gate": "label", "retestIntervalSeconds": 3600, "testTimeoutSeconds": 120
        }))
        .unwrap();
        let p = s.policy();
        assert_eq!(p.marking, Marking::Label);
        assert_eq!(
            (p.test_timeout_seconds, p.retest_interval_seconds),
            (120, Some(3600))
        );
        assert_eq!(s.thresholds().min_bandwidth_gbps, Some(90.0));
        let a = s.runner_args(Role::Server);
        assert_eq!(
            (a.bw_tool, a.duration, a.qps, a.size),
            (PerftestTool::IbWriteBw, 5, 2, 65536)
        );
        assert_eq!((a.lat_tool, a.iterations), (PerftestTool::IbWriteLat, 1000));
        assert!(s.validate().is_ok());
    }

    #[test]
    fn validation_names_the_field_and_value() {
        let s = AdmissionSpec {
            iterations: 4,
            ..Default::default()
        };
        let e = s.validate().unwrap_err().join("; ");
        assert!(e.contains("iterations") && e.contains('4'), "{e}");
        let s = AdmissionSpec {
            min_bandwidth_fraction: Some(1.5),
            ..Default::default()
        };
        let e = s.validate().unwrap_err().join("; ");
        assert!(
            e.contains("spec.admission.minBandwidthFraction") && e.contains("1.5"),
            "{e}"
        );
        let s = AdmissionSpec {
            duration_seconds: 600,
            ..Default::default()
        };
        let e = s.validate().unwrap_err().join("; ");
        assert!(e.contains("spec.admission.testTimeoutSeconds = 600"), "{e}");
    }

    #[test]
    fn schema_refuses_fewer_than_five_iterations() {
        use kube::CustomResourceExt;
        let crd = serde_json::to_value(crate::crd::RdmaNetwork::crd()).unwrap();
        let adm = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
            ["admission"]["properties"];
        assert_eq!(adm["iterations"]["minimum"].as_f64(), Some(5.0));
        assert_eq!(adm["testTimeoutSeconds"]["minimum"].as_f64(), Some(30.0));
        assert_eq!(
            adm["latencyTest"]["enum"],
            serde_json::json!(["readLat", "writeLat"])
        );
    }

    #[test]
    fn times_are_rfc3339() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_767_225_600), "2026-01-01T00:00:00Z");
    }
}
