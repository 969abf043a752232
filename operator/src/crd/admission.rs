//! The `admission` block of an `RdmaNetwork`: how a node proves itself with
//! perftests before it serves RDMA pods. Only the schema lives here; the
//! flow is the admission issue's (crate `kroce-admission` and the operator's
//! admission controller).

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
    /// Message size (`-s`), bytes.
    #[serde(default = "default_message_size")]
    #[schemars(range(min = 1))]
    pub message_size: u32,
    /// Queue pairs (`-q`).
    #[serde(default = "default_queue_pairs")]
    #[schemars(range(min = 1, max = 1024))]
    pub queue_pairs: u32,
    /// Latency test iterations (`-n`).
    #[serde(default = "default_iterations")]
    #[schemars(range(min = 1))]
    pub iterations: u32,
    /// Image with perftest; the chart's default when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Nodes tested at once, cluster-wide.
    #[serde(default = "default_max_concurrent")]
    #[schemars(range(min = 1))]
    pub max_concurrent_nodes: u32,
    /// Re-test admitted nodes this often; never when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 60))]
    pub retest_interval_seconds: Option<u64>,
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
            iterations: default_iterations(),
            image: None,
            max_concurrent_nodes: default_max_concurrent(),
            retest_interval_seconds: None,
            gate: AdmissionGate::default(),
        }
    }
}
