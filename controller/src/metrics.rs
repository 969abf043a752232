//! Prometheus metrics of the controller: reconciles, failures by reason,
//! reconcile duration, and the conflicts currently blocking nodes.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::time::Instant;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FailureLabels {
    pub reason: String,
}

#[derive(Debug)]
pub struct Metrics {
    pub reconciles: Counter,
    pub failures: Family<FailureLabels, Counter>,
    pub duration: Histogram,
    pub conflicts: Gauge,
    /// Node loop: reconciles and the writes they made.
    pub node_reconciles: Counter,
    pub node_writes: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            reconciles: Counter::default(),
            failures: Family::default(),
            duration: Histogram::new([0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]),
            conflicts: Gauge::default(),
            node_reconciles: Counter::default(),
            node_writes: Counter::default(),
        }
    }
}

impl Metrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "kroce_reconciles",
            "RdmaNetwork reconciles started",
            self.reconciles.clone(),
        );
        registry.register(
            "kroce_reconcile_failures",
            "RdmaNetwork reconciles that failed, by reason",
            self.failures.clone(),
        );
        registry.register(
            "kroce_reconcile_duration_seconds",
            "Time spent in one RdmaNetwork reconcile",
            self.duration.clone(),
        );
        registry.register(
            "kroce_node_conflicts",
            "Node conflicts found by the last reconcile (nodes kept at their last good state)",
            self.conflicts.clone(),
        );
        registry.register(
            "kroce_node_reconciles",
            "Node reconciles started (one node's RdmaNodeState spec and ConfigMap key)",
            self.node_reconciles.clone(),
        );
        registry.register(
            "kroce_node_writes",
            "Writes made by node reconciles (a node spec or a ConfigMap key that changed)",
            self.node_writes.clone(),
        );
    }

    /// Counts a reconcile and times it until the guard drops.
    pub fn start(&self) -> ReconcileTimer<'_> {
        self.reconciles.inc();
        ReconcileTimer {
            metrics: self,
            start: Instant::now(),
        }
    }

    pub fn failed(&self, reason: &str) {
        self.failures
            .get_or_create(&FailureLabels {
                reason: reason.to_string(),
            })
            .inc();
    }
}

#[derive(Debug)]
pub struct ReconcileTimer<'a> {
    metrics: &'a Metrics,
    start: Instant,
}

impl Drop for ReconcileTimer<'_> {
    fn drop(&mut self) {
        self.metrics
            .duration
            .observe(self.start.elapsed().as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_has_the_three_families() {
        let m = Metrics::default();
        let mut r = Registry::default();
        m.register(&mut r);
        drop(m.start());
        m.failed("Conflict");
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &r).unwrap();
        assert!(out.contains("kroce_reconciles_total 1"), "{out}");
        assert!(
            out.contains("kroce_reconcile_failures_total{reason=\"Conflict\"} 1"),
            "{out}"
        );
        assert!(
            out.contains("kroce_reconcile_duration_seconds_count 1"),
            "{out}"
        );
    }
}
