//! What `/metrics` says about the node's VF pools and its perftest
//! admission, rendered once per agent pass from what the pass found (the
//! spec's VF groups, the observed VFs and who holds them) and from the
//! admission entries the controller keeps in the same `RdmaNodeState`
//! status. Gauges only: each scrape reads the last pass.
//!
//! [`exported_metric_names`] is the one list of every metric and label
//! name the node agent's `/metrics` serves (RDMA counters, these gauges,
//! the agent's own counters): the chart's alert rules and Grafana dashboard
//! may use no other (`tests/monitoring_names.rs`).

use crate::holders::VfHolders;
use kroce_admission::lifecycle::AdmissionPhase;
use kroce_contracts::Memlock;
use kroce_contracts::nri_status::StatusFile;
use kroce_operator::crd::{NetworkAdmission, RdmaNodeStateSpec, RdmaNodeStateStatus};
use sriov_helpers::CpuList;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

pub const POOL_VFS: &str = "kroce_vf_pool_vfs";
pub const ADMISSION_PHASE: &str = "kroce_admission_phase";
pub const ADMISSION_PASSED: &str = "kroce_admission_last_run_passed";
pub const ADMISSION_FINISHED: &str = "kroce_admission_last_run_timestamp_seconds";
pub const ADMISSION_FAILURES: &str = "kroce_admission_consecutive_failures";
pub const ADMISSION_BANDWIDTH: &str = "kroce_admission_bandwidth_gbps";
pub const ADMISSION_PORT_RATE: &str = "kroce_admission_port_rate_gbps";
pub const ADMISSION_LATENCY: &str = "kroce_admission_latency_microseconds";
/// When the admission state machine's next step is due: a failed node's
/// retry, a running test's deadline. Absent while admitted or pending (the
/// re-test interval is the network's, which the agent does not read).
pub const ADMISSION_DUE: &str = "kroce_admission_next_run_due_timestamp_seconds";
pub const NRI_CAPPED: &str = "kroce_nri_memlock_capped_requests";
pub const NRI_LIMITED: &str = "kroce_nri_memlock_runtime_limited";

/// `state` values of [`POOL_VFS`].
pub const POOL_STATES: &[&str] = &["configured", "healthy", "allocated"];
/// `phase` values of [`ADMISSION_PHASE`] (the controller's phases).
pub const ADMISSION_PHASES: &[&str] = &["Pending", "Testing", "Admitted", "Failed"];

/// The agent's own counters (`run::AgentMetrics`), as the registry names them.
pub const AGENT_COUNTERS: &[&str] = &[
    "kroce_agent_passes_total",
    "kroce_agent_changes_total",
    "kroce_agent_failed_passes_total",
];

/// The last pass's gauges, shared with the `/metrics` handler.
#[derive(Debug, Clone, Default)]
pub struct StateMetrics {
    text: Arc<Mutex<String>>,
}

impl StateMetrics {
    pub fn set(&self, text: String) {
        if let Ok(mut t) = self.text.lock() {
            *t = text;
        }
    }

    pub fn text(&self) -> String {
        self.text.lock().map(|t| t.clone()).unwrap_or_default()
    }
}

#[derive(Default)]
struct Families {
    fams: BTreeMap<&'static str, (&'static str, Vec<String>)>,
}

impl Families {
    fn add(&mut self, name: &'static str, help: &'static str, labels: &[(&str, &str)], v: f64) {
        let body: Vec<String> = labels
            .iter()
            .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
            .collect();
        self.fams
            .entry(name)
            .or_insert((help, Vec::new()))
            .1
            .push(format!("{name}{{{}}} {v}", body.join(",")));
    }

    fn render(self) -> String {
        let mut out = String::new();
        for (name, (help, samples)) in self.fams {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} gauge");
            for s in samples {
                let _ = writeln!(out, "{s}");
            }
        }
        out
    }
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// OpenMetrics gauge families (no `# EOF`) for this pass: per VF pool
/// (`network`, `pool` = the device plugin resource, `pf` = PF PCI address,
/// `device` = the PF's RDMA device) how many VFs the spec gives it
/// (`configured`), how many exist with a netdev and an RDMA device
/// (`healthy`, what the device plugin can advertise) and how many of those
/// a pod or claim holds (`allocated`); per network the admission phase and
/// the last perftest run's figures.
pub fn render(
    node: &str,
    spec: &RdmaNodeStateSpec,
    status: &RdmaNodeStateStatus,
    holders: &dyn VfHolders,
    admission: &[NetworkAdmission],
) -> String {
    let mut f = Families::default();
    for pf in &spec.pfs {
        let observed = status.pfs.iter().find(|o| o.pci_address == pf.pci_address);
        let device = observed
            .and_then(|o| o.rdma_device.as_deref())
            .unwrap_or("");
        for g in &pf.vf_groups {
            // A range that does not parse was refused by the pass already.
            let Ok(range) = g.vf_range.parse::<CpuList>() else {
                continue;
            };
            let configured = range.cpus().filter(|i| *i < pf.num_vfs).count();
            let healthy: Vec<_> = observed
                .map(|o| {
                    o.vfs
                        .iter()
                        .filter(|v| range.contains(v.index) && v.index < pf.num_vfs)
                        .filter(|v| v.netdev.is_some() && v.rdma_device.is_some())
                        .collect()
                })
                .unwrap_or_default();
            let allocated = healthy
                .iter()
                .filter(|v| !holders.holders(&v.pci_address).is_empty())
                .count();
            for (state, n) in [
                ("configured", configured),
                ("healthy", healthy.len()),
                ("allocated", allocated),
            ] {
                f.add(
                    POOL_VFS,
                    "VFs of a pool: configured by the spec, healthy (netdev and RDMA device present), allocated (held by a pod or claim)",
                    &[
                        ("node", node),
                        ("network", &g.network),
                        ("pool", &g.resource_name),
                        ("pf", &pf.pci_address),
                        ("device", device),
                        ("state", state),
                    ],
                    n as f64,
                );
            }
        }
    }
    for a in admission {
        let base = [("node", node), ("network", a.network.as_str())];
        for phase in ADMISSION_PHASES {
            let mut l = base.to_vec();
            l.push(("phase", phase));
            f.add(
                ADMISSION_PHASE,
                "Perftest admission phase of the node for a network (1 for the current one)",
                &l,
                f64::from(u8::from(a.phase == *phase)),
            );
        }
        let due = match &a.state.phase {
            AdmissionPhase::Failed { retry_at, .. } => Some(*retry_at),
            AdmissionPhase::Testing { run, .. } => Some(run.deadline),
            AdmissionPhase::Admitted { .. } => a.state.retest_due,
            AdmissionPhase::Pending => None,
        };
        if let Some(due) = due {
            f.add(
                ADMISSION_DUE,
                "When the next perftest admission step is due (Unix seconds): a failed node's retry, a running test's deadline, an admitted node's periodic re-test",
                &base,
                due as f64,
            );
        }
        f.add(
            ADMISSION_FAILURES,
            "Consecutive failed perftest admission runs",
            &base,
            f64::from(a.state.failures),
        );
        let Some(r) = &a.state.last_result else {
            continue;
        };
        f.add(
            ADMISSION_PASSED,
            "Whether the last perftest admission run passed (1) or not (0)",
            &base,
            f64::from(u8::from(r.passed)),
        );
        f.add(
            ADMISSION_FINISHED,
            "When the last perftest admission run finished (Unix seconds)",
            &base,
            r.finished_at as f64,
        );
        let Some(m) = &r.measurement else { continue };
        if let Some(v) = m.bandwidth_gbps {
            f.add(
                ADMISSION_BANDWIDTH,
                "Bandwidth the last perftest admission run measured (ib_write_bw, Gb/s)",
                &base,
                v,
            );
        }
        if let Some(v) = m.port_rate_gbps {
            f.add(
                ADMISSION_PORT_RATE,
                "Port rate the last perftest admission run was judged against (Gb/s)",
                &base,
                v,
            );
        }
        for (stat, v) in [("avg", m.latency_avg_us), ("p99", m.latency_p99_us)] {
            if let Some(v) = v {
                let mut l = base.to_vec();
                l.push(("stat", stat));
                f.add(
                    ADMISSION_LATENCY,
                    "Latency the last perftest admission run measured (microseconds)",
                    &l,
                    v,
                );
            }
        }
    }
    f.render()
}

/// kroce-nri's memlock gauges from its status file (`None`: no file, or it
/// describes a runtime that is gone: nothing is exported, as the doctor
/// skips it too): how many RDMA containers' memlock requests it capped at
/// the runtime's hard limit on its current connection, and whether that
/// runtime is limited at all (1: it lacks `CAP_SYS_RESOURCE` or runs in a
/// user namespace, and its hard limit is finite). Unknown limits (kroce-nri
/// could not read them) export the count only.
pub fn render_nri(node: &str, status: Option<&StatusFile>) -> String {
    let mut f = Families::default();
    let Some(s) = status else {
        return String::new();
    };
    let base = [("node", node)];
    f.add(
        NRI_CAPPED,
        "RDMA containers whose memlock request kroce-nri capped at the runtime's hard limit (current kroce-nri connection)",
        &base,
        s.capped_count as f64,
    );
    if let Some(rt) = &s.runtime {
        let limited = !rt.can_raise() && rt.memlock_hard != Memlock::Unlimited;
        f.add(
            NRI_LIMITED,
            "Whether the container runtime cannot grant more memlock than its own finite hard limit (1) or can (0)",
            &base,
            f64::from(u8::from(limited)),
        );
    }
    f.render()
}

/// Every metric name (as Prometheus stores it: counters with `_total`) and
/// label name the node agent's `/metrics` serves. Rendered by the same
/// code `/metrics` uses, from inputs that hold every counter and field the
/// alert rules and dashboard rely on, so a rename shows up here.
pub fn exported_metric_names() -> (BTreeSet<String>, BTreeSet<String>) {
    use kroce_operator::crd::{ObservedPf, ObservedVf, PfConfig, VfGroup};
    let (mut names, mut labels) = kroce_admission::counters::exported_metric_names();
    names.extend(AGENT_COUNTERS.iter().map(|s| s.to_string()));
    let spec = RdmaNodeStateSpec {
        node_name: "n".into(),
        pfs: vec![PfConfig {
            pci_address: "0000:3b:00.0".into(),
            if_name: "e".into(),
            num_vfs: 1,
            mtu: None,
            vf_groups: vec![VfGroup {
                network: "net".into(),
                resource_name: "kroce.io/r".into(),
                vf_range: "0".into(),
                mtu: None,
            }],
            irq_affinity: Default::default(),
            qos: None,
        }],
        ..Default::default()
    };
    let status = RdmaNodeStateStatus {
        pfs: vec![ObservedPf {
            pci_address: "0000:3b:00.0".into(),
            rdma_device: Some("d".into()),
            vfs: vec![ObservedVf {
                index: 0,
                pci_address: "0000:3b:00.2".into(),
                netdev: Some("v".into()),
                rdma_device: Some("dv".into()),
                ..Default::default()
            }],
            ..Default::default()
        }],
        ..Default::default()
    };
    let record = kroce_admission::lifecycle::AdmissionRecord {
        run_id: "r".into(),
        peer: "p".into(),
        finished_at: 1,
        passed: true,
        measurement: Some(kroce_admission::thresholds::Measurement {
            bandwidth_gbps: Some(1.0),
            latency_avg_us: Some(1.0),
            latency_p99_us: Some(1.0),
            port_rate_gbps: Some(1.0),
        }),
        message: String::new(),
    };
    let admission = NetworkAdmission {
        network: "net".into(),
        phase: "Admitted".into(),
        state: kroce_admission::lifecycle::NodeAdmission {
            last_result: Some(Box::new(record)),
            ..Default::default()
        },
        ..Default::default()
    };
    let text = render(
        "n",
        &spec,
        &status,
        &crate::holders::NodeHolders::default(),
        &[admission],
    );
    let mut admission_failed = NetworkAdmission {
        network: "net".into(),
        phase: "Failed".into(),
        ..Default::default()
    };
    admission_failed.state.phase = AdmissionPhase::Failed {
        at: 1,
        retry_at: 2,
        generation: 1,
        peer: None,
        reason: String::new(),
    };
    let text = text
        + &render(
            "n",
            &spec,
            &status,
            &crate::holders::NodeHolders::default(),
            &[admission_failed],
        );
    let nri = StatusFile {
        capped_count: 1,
        runtime: Some(kroce_contracts::nri_status::RuntimeLimits {
            pid: 1,
            cap_sys_resource: false,
            initial_user_namespace: true,
            memlock_soft: Memlock::Bytes(1),
            memlock_hard: Memlock::Bytes(1),
        }),
        ..Default::default()
    };
    let text = text + &render_nri("n", Some(&nri));
    for line in text.lines().filter(|l| !l.starts_with('#')) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::holders::{Holder, NodeHolders};
    use kroce_operator::crd::{ObservedPf, ObservedVf, PfConfig, VfGroup};

    fn group(network: &str, range: &str) -> VfGroup {
        VfGroup {
            network: network.into(),
            resource_name: format!("kroce.io/{network}"),
            vf_range: range.into(),
            mtu: None,
        }
    }

    fn vf(index: u32, rdma: bool) -> ObservedVf {
        ObservedVf {
            index,
            pci_address: format!("0000:3b:00.{}", index + 2),
            netdev: Some(format!("ens1f0v{index}")),
            rdma_device: rdma.then(|| format!("mlx5_{}", index + 2)),
            ..Default::default()
        }
    }

    #[test]
    fn pools_count_configured_healthy_and_allocated_vfs_and_admission_is_rendered() {
        let spec = RdmaNodeStateSpec {
            node_name: "n1".into(),
            pfs: vec![PfConfig {
                pci_address: "0000:3b:00.0".into(),
                if_name: "ens1f0".into(),
                num_vfs: 4,
                mtu: None,
                vf_groups: vec![group("a", "0-1"), group("b", "2-5")],
                irq_affinity: Default::default(),
                qos: None,
            }],
            ..Default::default()
        };
        let status = RdmaNodeStateStatus {
            pfs: vec![ObservedPf {
                pci_address: "0000:3b:00.0".into(),
                rdma_device: Some("mlx5_0".into()),
                // VF 1 lost its RDMA device; VF 3 is missing.
                vfs: vec![vf(0, true), vf(1, false), vf(2, true)],
                ..Default::default()
            }],
            ..Default::default()
        };
        let mut holders = NodeHolders::default();
        holders.add(
            "0000:3b:00.2",
            Holder {
                pod: Some("ns/p".into()),
                what: "test".into(),
            },
        );
        let mut failed = NetworkAdmission {
            network: "a".into(),
            phase: "Failed".into(),
            ..Default::default()
        };
        failed.state.failures = 2;
        failed.state.phase = AdmissionPhase::Failed {
            at: 1_700_000_000,
            retry_at: 1_700_000_600,
            generation: 1,
            peer: None,
            reason: "bandwidth".into(),
        };
        let mut testing = NetworkAdmission {
            network: "t".into(),
            phase: "Testing".into(),
            ..Default::default()
        };
        testing.state.phase = AdmissionPhase::Testing {
            run: kroce_admission::lifecycle::TestRun {
                id: "r2".into(),
                server_node: "n1".into(),
                client_node: "n2".into(),
                subjects: vec!["n1".into()],
                started_at: 1_700_000_000,
                deadline: 1_700_000_900,
            },
            previously_admitted: None,
        };
        let mut admitted = NetworkAdmission {
            network: "ok".into(),
            phase: "Admitted".into(),
            ..Default::default()
        };
        admitted.state.phase = AdmissionPhase::Admitted {
            at: kroce_admission::lifecycle::AdmittedAt {
                at: 1_700_000_000,
                generation: 1,
                without_test: false,
            },
        };
        // The same, on a network that re-tests admitted nodes.
        let mut retested = admitted.clone();
        retested.network = "re".into();
        retested.state.retest_due = Some(1_700_003_600);
        failed.state.last_result = Some(Box::new(kroce_admission::lifecycle::AdmissionRecord {
            run_id: "r1".into(),
            peer: "n2".into(),
            finished_at: 1_700_000_000,
            passed: false,
            measurement: Some(kroce_admission::thresholds::Measurement {
                bandwidth_gbps: Some(41.5),
                latency_avg_us: Some(2.5),
                latency_p99_us: None,
                port_rate_gbps: Some(100.0),
            }),
            message: "bandwidth 41.5 < 80".into(),
        }));
        let text = render(
            "n1",
            &spec,
            &status,
            &holders,
            &[failed, testing, admitted, retested],
        );
        let sample = |s: &str| {
            assert!(text.lines().any(|l| l == s), "no `{s}` in\n{text}");
        };
        let pool = |net: &str, state: &str, v: u32| {
            format!(
                "kroce_vf_pool_vfs{{node=\"n1\",network=\"{net}\",pool=\"kroce.io/{net}\",pf=\"0000:3b:00.0\",device=\"mlx5_0\",state=\"{state}\"}} {v}"
            )
        };
        sample(&pool("a", "configured", 2));
        sample(&pool("a", "healthy", 1));
        sample(&pool("a", "allocated", 1));
        // 2-5 on a PF with 4 VFs: 2 configured, 1 present.
        sample(&pool("b", "configured", 2));
        sample(&pool("b", "healthy", 1));
        sample(&pool("b", "allocated", 0));
        sample("kroce_admission_phase{node=\"n1\",network=\"a\",phase=\"Failed\"} 1");
        sample("kroce_admission_phase{node=\"n1\",network=\"a\",phase=\"Admitted\"} 0");
        sample("kroce_admission_consecutive_failures{node=\"n1\",network=\"a\"} 2");
        sample("kroce_admission_last_run_passed{node=\"n1\",network=\"a\"} 0");
        sample("kroce_admission_last_run_timestamp_seconds{node=\"n1\",network=\"a\"} 1700000000");
        sample("kroce_admission_bandwidth_gbps{node=\"n1\",network=\"a\"} 41.5");
        sample("kroce_admission_port_rate_gbps{node=\"n1\",network=\"a\"} 100");
        sample("kroce_admission_latency_microseconds{node=\"n1\",network=\"a\",stat=\"avg\"} 2.5");
        assert!(!text.contains("stat=\"p99\""), "{text}");
        // Due: the failed node's retry, the running test's deadline, an
        // admitted node's periodic re-test; none without a re-test interval.
        sample(
            "kroce_admission_next_run_due_timestamp_seconds{node=\"n1\",network=\"a\"} 1700000600",
        );
        sample(
            "kroce_admission_next_run_due_timestamp_seconds{node=\"n1\",network=\"t\"} 1700000900",
        );
        sample(
            "kroce_admission_next_run_due_timestamp_seconds{node=\"n1\",network=\"re\"} 1700003600",
        );
        assert!(
            !text.contains(
                "kroce_admission_next_run_due_timestamp_seconds{node=\"n1\",network=\"ok\"}"
            ),
            "{text}"
        );
        assert!(text.contains("# TYPE kroce_vf_pool_vfs gauge\n"), "{text}");
    }

    #[test]
    fn the_exported_list_has_every_family_and_label() {
        let (names, labels) = exported_metric_names();
        for n in [
            POOL_VFS,
            ADMISSION_PHASE,
            ADMISSION_PASSED,
            ADMISSION_FINISHED,
            ADMISSION_FAILURES,
            ADMISSION_BANDWIDTH,
            ADMISSION_PORT_RATE,
            ADMISSION_LATENCY,
            ADMISSION_DUE,
            NRI_CAPPED,
            NRI_LIMITED,
            "kroce_agent_passes_total",
            "kroce_rdma_pause_frames_total",
            "kroce_rdma_pause_duration_microseconds_total",
            "kroce_rdma_port_port_xmit_data_total",
        ] {
            assert!(names.contains(n), "{n} not in {names:?}");
        }
        for l in [
            "node",
            "device",
            "port",
            "netdev",
            "direction",
            "priority",
            "pool",
            "network",
            "pf",
            "state",
            "phase",
            "stat",
        ] {
            assert!(labels.contains(l), "{l} not in {labels:?}");
        }
    }

    #[test]
    fn agent_counters_are_the_registrys() {
        let mut r = prometheus_client::registry::Registry::default();
        crate::run::AgentMetrics::default().register(&mut r);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &r).unwrap();
        let served: BTreeSet<&str> = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.split([' ', '{']).next())
            .collect();
        assert_eq!(served, AGENT_COUNTERS.iter().copied().collect(), "{text}");
    }
}
