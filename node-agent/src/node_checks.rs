//! Node conditions beyond applying the spec, added to each report:
//! `NriReachable` (with what the admin can do when it is not),
//! `MemlockGrantedByRuntime` (from kroce-nri's status file: False when a
//! request was capped at the runtime's hard limit), the doctor
//! checks that decide whether RDMA works on the node (`RdmaLinkActive`,
//! `RoceV2GidPresent`, `RdmaMtuConsistent`, `PfcConfigured`, `EcnEnabled`,
//! `MemlockSufficient`), and `RdmaFabricCongestion` when PFC pause frames
//! or discards grow faster than the configured rates.
//!
//! Every message states facts only (no rates, intervals or times): the
//! agent writes its status only when a message changes, so anything that
//! changes every pass would make every pass a write.

use super::counters::{Counters, now_ms};
use kroce_admission::counters::{
    CONDITION_TYPE as CONGESTION_CONDITION, CongestionLimits, CounterSnapshot, CounterSource,
    congestion_condition,
};
use kroce_admission::doctor::{DoctorOptions, DoctorReport, NetState, Status, names};
use kroce_contracts::nri_reachability::{NriStatus, nri_socket_status};
use kroce_operator::crd::{Condition, ConditionStatus, RdmaNodeStateSpec, RdmaNodeStateStatus};
use sriov_helpers::Host;
use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::PathBuf;

pub const NRI_CONDITION: &str = "NriReachable";
/// From kroce-nri's status file; absent while there is none.
pub const NRI_MEMLOCK_CONDITION: &str = "MemlockGrantedByRuntime";

/// Doctor check -> node condition type (the checks that decide whether
/// RDMA works; irqbalance has its own condition already).
pub const CHECK_CONDITIONS: &[(&str, &str)] = &[
    (names::LINK, "RdmaLinkActive"),
    (names::ROCE_V2_GID, "RoceV2GidPresent"),
    (names::MTU, "RdmaMtuConsistent"),
    (names::PFC, "PfcConfigured"),
    (names::ECN, "EcnEnabled"),
    (names::MEMLOCK, "MemlockSufficient"),
    (names::IRQ_NUMA, "IrqsNumaLocal"),
    (crate::doctor::NRI_MEMLOCK_CHECK, NRI_MEMLOCK_CONDITION),
];

/// The node agent's flags for these checks and its counters.
#[derive(Debug, Clone, clap::Args)]
pub struct NodeCheckArgs {
    /// The runtime's NRI socket [default: <host-root>/var/run/nri/nri.sock].
    #[arg(long)]
    pub nri_socket: Option<PathBuf>,
    /// kroce-nri's status file [default: <host-root>/var/lib/cni/kroce/nri-status.json].
    #[arg(long)]
    pub nri_status: Option<PathBuf>,
    /// RdmaFabricCongestion when PFC pause frames of a port grow faster (per second).
    #[arg(long, default_value_t = 1000.0)]
    pub max_pause_frames_per_sec: f64,
    /// RdmaFabricCongestion when discards of a port grow faster (per second).
    #[arg(long, default_value_t = 100.0)]
    pub max_discards_per_sec: f64,
    /// Which RDMA devices' counters /metrics exports.
    #[arg(long, value_enum, default_value_t = super::counters::CounterScope::Pfs)]
    pub rdma_counters: super::counters::CounterScope,
    /// `ethtool` for per-priority pause and PHY discard counters ("" to skip).
    // clap's PathBuf parser refuses "": parsed as an OS string.
    #[arg(long, default_value = "ethtool",
          value_parser = clap::builder::TypedValueParser::map(clap::builder::OsStringValueParser::new(), PathBuf::from))]
    pub ethtool: PathBuf,
    /// Kill an `ethtool -S` that has not finished after this many seconds
    /// (its counters are then missing from that pass, and the agent logs
    /// the command and netdev).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=300))]
    pub ethtool_timeout_seconds: u64,
}

impl NodeCheckArgs {
    pub fn node_checks(
        &self,
        node: &str,
        root: &sriov_helpers::HostRoot,
        host_root: &std::path::Path,
    ) -> NodeChecks {
        let ethtool: std::sync::Arc<dyn super::counters::EthtoolSource> =
            if self.ethtool.as_os_str().is_empty() {
                std::sync::Arc::new(super::counters::NoEthtool)
            } else {
                std::sync::Arc::new(super::counters::EthtoolCommand {
                    program: self.ethtool.clone(),
                    timeout: std::time::Duration::from_secs(self.ethtool_timeout_seconds),
                })
            };
        NodeChecks::new(
            NodeChecksConfig {
                nri_socket: crate::doctor::nri_socket(host_root, self.nri_socket.as_deref()),
                nri_status: crate::doctor::nri_status_path(host_root, self.nri_status.as_deref()),
                congestion: CongestionLimits {
                    max_pause_frames_per_sec: self.max_pause_frames_per_sec,
                    max_discards_per_sec: self.max_discards_per_sec,
                },
            },
            Counters {
                root: root.clone(),
                node: node.to_string(),
                scope: self.rdma_counters,
                ethtool,
            },
        )
    }
}

/// The agent's check settings (flags).
#[derive(Debug, Clone)]
pub struct NodeChecksConfig {
    pub nri_socket: PathBuf,
    /// kroce-nri's status file.
    pub nri_status: PathBuf,
    pub congestion: CongestionLimits,
}

pub fn nri_condition(status: &NriStatus) -> Condition {
    if status.is_reachable() {
        Condition::new(NRI_CONDITION, true, "Reachable", status.message())
    } else {
        let mut msg = status.message();
        if let Some(h) = status.hint() {
            msg.push_str(". ");
            msg.push_str(h);
        }
        Condition::new(NRI_CONDITION, false, "Unreachable", msg)
    }
}

/// One condition per mapped check, over all its subjects: False when any
/// failed, True (reason `Warning`) when any warned, True when passed,
/// Unknown when every subject was skipped.
pub fn doctor_conditions(report: &DoctorReport) -> Vec<Condition> {
    let mut out = Vec::new();
    for (check, type_) in CHECK_CONDITIONS {
        let results: Vec<_> = report.checks.iter().filter(|c| c.name == *check).collect();
        if results.is_empty() {
            continue;
        }
        let worst = results
            .iter()
            .map(|c| c.status)
            .max()
            .unwrap_or(Status::Skip);
        let shown: Vec<String> = results
            .iter()
            .filter(|c| c.status == worst)
            .map(|c| match &c.hint {
                Some(h) if worst != Status::Pass => {
                    format!("{}: {} (fix: {h})", c.subject, c.evidence)
                }
                _ => format!("{}: {}", c.subject, c.evidence),
            })
            .collect();
        let (status, reason) = match worst {
            Status::Fail => (ConditionStatus::False, "CheckFailed"),
            Status::Warn => (ConditionStatus::True, "Warning"),
            Status::Pass => (ConditionStatus::True, "Passed"),
            Status::Skip => (ConditionStatus::Unknown, "NotChecked"),
        };
        let mut c = Condition::new(type_, true, reason, shown.join("; "));
        c.status = status;
        out.push(c);
    }
    out
}

/// What the doctor gets on a node: the agent's own observations for PFC,
/// live addresses, the runtime's memlock from the host root.
pub fn net_state(
    status: &RdmaNodeStateStatus,
    ipv4: BTreeMap<String, Vec<Ipv4Addr>>,
    root: &sriov_helpers::HostRoot,
) -> NetState {
    let mut pfc_enabled = BTreeMap::new();
    for pf in &status.pfs {
        if let (Some(n), Some(q)) = (&pf.if_name, &pf.qos) {
            pfc_enabled.insert(n.clone(), q.pfc_priorities.clone());
        }
    }
    NetState {
        ipv4,
        pfc_enabled,
        memlock: crate::doctor::runtime_memlock(root).map(|(_, m)| m),
        ..Default::default()
    }
}

/// The checks on the PFs and soft devices the spec configures.
pub fn doctor_options(spec: &RdmaNodeStateSpec) -> Option<DoctorOptions> {
    let mut pf_names: Vec<String> = spec.pfs.iter().map(|p| p.if_name.clone()).collect();
    pf_names.extend(
        spec.soft_devices
            .iter()
            .flat_map(|g| g.if_names.iter().cloned()),
    );
    if pf_names.is_empty() {
        return None;
    }
    let roce_priority = spec
        .pfs
        .iter()
        .find_map(|p| p.qos.as_ref().map(|q| q.pfc_priority))
        .unwrap_or(3);
    Some(DoctorOptions {
        roce_priority,
        pf_names,
        ..Default::default()
    })
}

/// Condition types the checks report (the loop keeps the last reported
/// ones while the checks cannot run).
pub fn is_check_condition(type_: &str) -> bool {
    type_ == NRI_CONDITION
        || type_ == CONGESTION_CONDITION
        || CHECK_CONDITIONS.iter().any(|(_, t)| *t == type_)
}

/// `RdmaFabricCongestion` from two snapshots, as a fact: which counters of
/// which ports grew faster than their limit, not the rates themselves.
/// `None` when the snapshots cannot be compared.
pub fn congestion(
    prev: &CounterSnapshot,
    cur: &CounterSnapshot,
    limits: &CongestionLimits,
) -> Option<Condition> {
    let c = congestion_condition(prev, cur, limits).ok()?;
    let message = if c.status {
        c.offenders
            .iter()
            .map(|r| {
                let limit = match r.source {
                    CounterSource::Pause { .. } => limits.max_pause_frames_per_sec,
                    _ => limits.max_discards_per_sec,
                };
                format!(
                    "{} {}/{}: {} above {limit}/s",
                    r.netdev.as_deref().unwrap_or("-"),
                    r.device,
                    r.port,
                    r.name
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
    } else {
        format!(
            "pause frames (limit {}/s) and discards (limit {}/s) within limits",
            limits.max_pause_frames_per_sec, limits.max_discards_per_sec
        )
    };
    Some(Condition::new(
        &c.condition_type,
        c.status,
        &c.reason,
        message,
    ))
}

/// The checks' state between passes: the previous counter snapshot, and
/// its OpenMetrics text, which `/metrics` serves ([`Self::metrics_source`]).
#[derive(Debug, Clone)]
pub struct NodeChecks {
    pub config: NodeChecksConfig,
    pub counters: Counters,
    previous: Option<CounterSnapshot>,
    served: std::sync::Arc<std::sync::Mutex<String>>,
}

impl NodeChecks {
    pub fn new(config: NodeChecksConfig, counters: Counters) -> Self {
        NodeChecks {
            config,
            counters,
            previous: None,
            served: Default::default(),
        }
    }

    /// What `/metrics` adds: the counters of the last pass (nothing before
    /// the first). A scrape reads no sysfs file and runs no `ethtool`.
    pub fn metrics_source(&self) -> kroce_operator::http::ExtraMetrics {
        let served = self.served.clone();
        std::sync::Arc::new(move || served.lock().map(|s| s.clone()).unwrap_or_default())
    }

    /// The conditions for this pass. `ipv4` is the host namespace's addresses.
    pub fn conditions(
        &mut self,
        spec: &RdmaNodeStateSpec,
        status: &RdmaNodeStateStatus,
        ipv4: BTreeMap<String, Vec<Ipv4Addr>>,
        taken_at_ms: u64,
    ) -> Vec<Condition> {
        let root = self.counters.root.clone();
        let host = Host::scan(&root);
        // No connection: containerd logs an unregistered one as an error.
        let nri = nri_socket_status(&self.config.nri_socket);
        let mut out = vec![nri_condition(&nri)];
        let nri_status = kroce_contracts::nri_status::read(&self.config.nri_status);
        // The gauges follow the check: a status describing a runtime that is
        // gone is not evidence, an unreadable one exports nothing.
        let nri_text = match &nri_status {
            Ok(Some(s))
                if s.runtime
                    .as_ref()
                    .is_none_or(|rt| root.proc().join(rt.pid.to_string()).exists()) =>
            {
                crate::state_metrics::render_nri(&self.counters.node, Some(s))
            }
            _ => String::new(),
        };
        let granted =
            crate::doctor::nri_memlock_check(nri_status, &self.config.nri_status, root.proc());
        // No status file (kroce-nri not deployed or not connected): no condition.
        if granted.status != Status::Skip {
            out.extend(doctor_conditions(&DoctorReport {
                checks: vec![granted],
            }));
        }
        if let Some(opts) = doctor_options(spec) {
            let net = net_state(status, ipv4, &root);
            let report = crate::doctor::report(&host, &root, &net, &opts, &nri);
            out.extend(doctor_conditions(&report));
        }
        let snap = self.counters.snapshot(&host, taken_at_ms);
        for e in &snap.errors {
            tracing::warn!(error = %e, "reading RDMA counters");
        }
        if let Some(prev) = &self.previous
            && let Some(c) = congestion(prev, &snap, &self.config.congestion)
        {
            out.push(c);
        }
        let text = self.counters.render(&snap) + &nri_text;
        if let Ok(mut served) = self.served.lock() {
            *served = text;
        }
        self.previous = Some(snap);
        out
    }

    /// [`Self::conditions`] on the live host, now.
    pub fn conditions_now(
        &mut self,
        spec: &RdmaNodeStateSpec,
        status: &RdmaNodeStateStatus,
    ) -> Vec<Condition> {
        self.conditions(spec, status, crate::doctor::live_ipv4(), now_ms())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::counters::{CounterScope, EthtoolSource, NoEthtool};
    use kroce_operator::crd::{ObservedPf, ObservedQos, PfConfig, QosSpec};
    use kroce_operator::http::append_families;
    use sriov_helpers::PciAddress;
    use sriov_helpers::fixture::FixtureHost;
    use std::path::Path;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    fn write(path: &Path, content: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, content).unwrap();
    }

    fn rdma_of(fx: &FixtureHost, pci: &str) -> String {
        let host = Host::scan(&fx.root());
        let a: PciAddress = pci.parse().unwrap();
        host.rdma_of_pci(&a).unwrap().name.clone()
    }

    fn set_hw(fx: &FixtureHost, dev: &str, name: &str, v: u64) {
        write(
            &fx.path().join(format!(
                "sys/class/infiniband/{dev}/ports/1/hw_counters/{name}"
            )),
            &format!("{v}\n"),
        );
    }

    /// `ethtool -S` answers that tests change between passes, and how many
    /// were asked for.
    #[derive(Default)]
    struct FakeEthtool(Mutex<BTreeMap<String, String>>, AtomicUsize);

    impl FakeEthtool {
        fn calls(&self) -> usize {
            self.1.load(Ordering::SeqCst)
        }

        fn set(&self, ifname: &str, rx_prio3_pause: u64, rx_discards_phy: u64) {
            self.0.lock().unwrap().insert(
                ifname.into(),
                format!(
                    "NIC statistics:\n     rx_packets: 1\n     rx_prio3_pause: {rx_prio3_pause}\n     tx_prio3_pause: 0\n     rx_discards_phy: {rx_discards_phy}\n"
                ),
            );
        }
    }

    impl EthtoolSource for FakeEthtool {
        fn stats(&self, ifname: &str) -> Result<Option<String>, crate::counters::EthtoolError> {
            self.1.fetch_add(1, Ordering::SeqCst);
            Ok(self.0.lock().unwrap().get(ifname).cloned())
        }
    }

    fn counters(fx: &FixtureHost, scope: CounterScope, e: Arc<dyn EthtoolSource>) -> Counters {
        Counters {
            root: fx.root(),
            node: "n1".into(),
            scope,
            ethtool: e,
        }
    }

    fn checks(fx: &FixtureHost, e: Arc<dyn EthtoolSource>, nri: PathBuf) -> NodeChecks {
        NodeChecks::new(
            NodeChecksConfig {
                nri_socket: nri,
                nri_status: fx.path().join(crate::doctor::DEFAULT_NRI_STATUS),
                congestion: CongestionLimits {
                    max_pause_frames_per_sec: 100.0,
                    max_discards_per_sec: 10.0,
                },
            },
            counters(fx, CounterScope::Pfs, e),
        )
    }

    fn spec() -> RdmaNodeStateSpec {
        RdmaNodeStateSpec {
            node_name: "n1".into(),
            pfs: vec![PfConfig {
                pci_address: "0000:3b:00.0".into(),
                if_name: "ens1f0".into(),
                num_vfs: 8,
                mtu: None,
                vf_groups: Vec::new(),
                irq_affinity: Default::default(),
                qos: Some(QosSpec::default()),
            }],
            ..Default::default()
        }
    }

    fn status_with_pfc(prios: Vec<u8>) -> RdmaNodeStateStatus {
        RdmaNodeStateStatus {
            pfs: vec![ObservedPf {
                pci_address: "0000:3b:00.0".into(),
                if_name: Some("ens1f0".into()),
                qos: Some(ObservedQos {
                    pfc_priorities: prios,
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn find<'a>(cs: &'a [Condition], t: &str) -> &'a Condition {
        cs.iter()
            .find(|c| c.type_ == t)
            .unwrap_or_else(|| panic!("no {t} in {cs:#?}"))
    }

    #[test]
    fn metrics_export_pf_and_soft_device_counters_as_openmetrics() {
        let mut fx = FixtureHost::connectx6dx_pair().unwrap();
        fx.add_rxe("rxe0", "eth9").unwrap();
        let pf = rdma_of(&fx, "0000:3b:00.0");
        let vf = rdma_of(&fx, "0000:3b:00.2");
        for dev in [&pf, &vf, &"rxe0".to_string()] {
            set_hw(&fx, dev, "np_cnp_sent", 42);
            set_hw(&fx, dev, "out_of_sequence", 3);
        }
        let e = Arc::new(FakeEthtool::default());
        e.set("ens1f0", 17, 2);
        let text = counters(&fx, CounterScope::Pfs, e.clone()).metrics_text();
        assert!(
            text.contains(&format!(
                "kroce_rdma_hw_np_cnp_sent_total{{node=\"n1\",device=\"{pf}\",port=\"1\"}} 42"
            )),
            "{text}"
        );
        assert!(
            text.contains("device=\"rxe0\""),
            "soft devices count: {text}"
        );
        assert!(
            !text.contains(&format!("device=\"{vf}\"")),
            "VFs only with --rdma-counters all"
        );
        assert!(
            text.contains("# TYPE kroce_rdma_hw_np_cnp_sent counter\n"),
            "{text}"
        );
        assert!(!text.contains("_total counter"), "{text}");
        assert!(
            text.contains(&format!(
                "kroce_rdma_pause_frames_total{{node=\"n1\",device=\"{pf}\",port=\"1\",netdev=\"ens1f0\",direction=\"rx\",priority=\"3\"}} 17"
            )),
            "{text}"
        );
        let all = counters(&fx, CounterScope::All, e.clone()).metrics_text();
        assert!(all.contains(&format!("device=\"{vf}\"")));
        assert!(
            counters(&fx, CounterScope::Off, e)
                .metrics_text()
                .is_empty()
        );
        // One exposition with the agent's own metrics, # EOF last.
        let mut reg = prometheus_client::registry::Registry::default();
        crate::run::AgentMetrics::default().register(&mut reg);
        let mut own = String::new();
        prometheus_client::encoding::text::encode(&mut own, &reg).unwrap();
        let body = append_families(&own, &text);
        assert!(body.ends_with("# EOF\n") && body.matches("# EOF").count() == 1);
        assert!(body.contains("kroce_agent_passes_total") && body.contains("np_cnp_sent"));
    }

    /// Issue 11: `/metrics` serves the counters the last pass read; a scrape
    /// reads no sysfs file and runs no `ethtool` (the old one did both, on a
    /// tokio worker thread, at every scrape).
    #[test]
    fn metrics_are_served_from_the_last_pass_and_scrapes_read_nothing() {
        let fx = FixtureHost::connectx6dx_pair().unwrap();
        let pf = rdma_of(&fx, "0000:3b:00.0");
        set_hw(&fx, &pf, "np_cnp_sent", 42);
        let e = Arc::new(FakeEthtool::default());
        e.set("ens1f0", 17, 2);
        let dir = tempfile::tempdir().unwrap();
        let mut nc = checks(&fx, e.clone(), dir.path().join("nri.sock"));
        let scrape = nc.metrics_source();
        assert_eq!(scrape(), "", "nothing before the first pass");
        assert_eq!(e.calls(), 0);
        let (sp, st) = (spec(), status_with_pfc(vec![3]));
        nc.conditions(&sp, &st, BTreeMap::new(), 1_000);
        let calls = e.calls();
        assert!(calls > 0, "the pass ran ethtool");
        let cnp = |v: u64| {
            format!(
                "kroce_rdma_hw_np_cnp_sent_total{{node=\"n1\",device=\"{pf}\",port=\"1\"}} {v}\n"
            )
        };
        let first = scrape();
        assert!(first.contains(&cnp(42)), "{first}");
        assert!(first.contains("priority=\"3\"} 17"), "{first}");
        // The host moves on; scrapes still show the last pass and read nothing.
        set_hw(&fx, &pf, "np_cnp_sent", 43);
        e.set("ens1f0", 18, 2);
        assert_eq!(scrape(), first);
        assert_eq!(scrape(), first);
        assert_eq!(e.calls(), calls, "a scrape ran ethtool");
        // The next pass brings the new values.
        nc.conditions(&sp, &st, BTreeMap::new(), 2_000);
        let next = scrape();
        assert!(next.contains(&cnp(43)), "{next}");
        assert!(next.contains("priority=\"3\"} 18"), "{next}");
        // A clone (what the loop runs) feeds the same /metrics.
        let mut moved = nc.clone();
        set_hw(&fx, &pf, "np_cnp_sent", 44);
        moved.conditions(&sp, &st, BTreeMap::new(), 3_000);
        assert!(scrape().contains(&cnp(44)));
    }

    /// The agent's flags reach the `ethtool` it runs: a stand-in that hangs
    /// (`--ethtool`) is killed after `--ethtool-timeout-seconds`, per netdev.
    #[test]
    fn ethtool_flags_set_the_program_and_its_timeout() {
        use std::os::unix::fs::PermissionsExt as _;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            checks: NodeCheckArgs,
        }
        let fx = FixtureHost::connectx6dx_pair().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let hang = dir.path().join("ethtool");
        std::fs::write(&hang, "#!/bin/sh\nexec sleep 30\n").unwrap();
        std::fs::set_permissions(&hang, std::fs::Permissions::from_mode(0o755)).unwrap();
        let hang_arg = hang.display().to_string();
        let cli = <Cli as clap::Parser>::try_parse_from([
            "agent",
            "--ethtool",
            hang_arg.as_str(),
            "--ethtool-timeout-seconds",
            "1",
        ])
        .unwrap();
        let nc = cli.checks.node_checks("n1", &fx.root(), fx.path());
        let t = std::time::Instant::now();
        let snap = nc.counters.snapshot(&Host::scan(&fx.root()), 1);
        // Two PFs, one second each.
        assert!(
            t.elapsed() < std::time::Duration::from_secs(10),
            "{:?}",
            t.elapsed()
        );
        for pf in ["ens1f0", "ens2f0"] {
            assert!(
                snap.errors
                    .iter()
                    .any(|e| e.contains(&format!("{hang_arg} -S {pf}")) && e.contains("1s")),
                "{pf}: {:?}",
                snap.errors
            );
        }
    }

    /// Issue 11: the congestion condition states facts (which counters are
    /// over which limit), not rates or intervals, so quiet passes produce
    /// the same condition, and a status write only when the facts change.
    #[test]
    fn congestion_messages_carry_no_rates_or_intervals() {
        let fx = FixtureHost::connectx6dx_pair().unwrap();
        let e = Arc::new(FakeEthtool::default());
        let dir = tempfile::tempdir().unwrap();
        let mut nc = checks(&fx, e.clone(), dir.path().join("nri.sock"));
        let (sp, st) = (spec(), status_with_pfc(vec![3]));
        e.set("ens1f0", 0, 0);
        nc.conditions(&sp, &st, BTreeMap::new(), 1_000);
        let mut quiet = Vec::new();
        for (i, at) in [16_000u64, 16_100, 31_100].iter().enumerate() {
            e.set("ens1f0", 10 * (i as u64 + 1), 0);
            quiet.push(
                find(
                    &nc.conditions(&sp, &st, BTreeMap::new(), *at),
                    "RdmaFabricCongestion",
                )
                .clone(),
            );
        }
        assert_eq!(quiet[0], quiet[1]);
        assert_eq!(quiet[1], quiet[2]);
        assert_eq!(
            quiet[0].message,
            "pause frames (limit 100/s) and discards (limit 10/s) within limits"
        );
        let mut busy = Vec::new();
        for (i, at) in [41_100u64, 51_100].iter().enumerate() {
            e.set("ens1f0", 100_000 * (i as u64 + 1), 0);
            busy.push(
                find(
                    &nc.conditions(&sp, &st, BTreeMap::new(), *at),
                    "RdmaFabricCongestion",
                )
                .clone(),
            );
        }
        assert_eq!(busy[0], busy[1], "different rates, same fact");
        assert!(busy[0].is_true());
        assert!(
            busy[0].message.contains("rx_prio3_pause above 100/s")
                && busy[0].message.starts_with("ens1f0 "),
            "{}",
            busy[0].message
        );
    }

    #[test]
    fn congestion_condition_follows_pause_and_discard_rates() {
        let fx = FixtureHost::connectx6dx_pair().unwrap();
        let e = Arc::new(FakeEthtool::default());
        let dir = tempfile::tempdir().unwrap();
        let mut nc = checks(&fx, e.clone(), dir.path().join("nri.sock"));
        let (sp, st) = (spec(), status_with_pfc(vec![3]));
        e.set("ens1f0", 1000, 0);
        let first = nc.conditions(&sp, &st, BTreeMap::new(), 1_000);
        assert!(
            !first.iter().any(|c| c.type_ == "RdmaFabricCongestion"),
            "no rate from one snapshot"
        );
        // 10,000 pause frames in 10 s: 1000/s > 100/s.
        e.set("ens1f0", 11_000, 5);
        let cs = nc.conditions(&sp, &st, BTreeMap::new(), 11_000);
        let c = find(&cs, "RdmaFabricCongestion");
        assert!(c.is_true());
        assert_eq!(c.reason, "PauseFramesGrowing");
        assert!(
            c.message.contains("ens1f0") && c.message.contains("rx_prio3_pause"),
            "{}",
            c.message
        );
        // Discards too fast as well.
        e.set("ens1f0", 11_010, 1_000);
        let cs = nc.conditions(&sp, &st, BTreeMap::new(), 21_000);
        assert_eq!(find(&cs, "RdmaFabricCongestion").reason, "DiscardsGrowing");
        // Quiet again.
        e.set("ens1f0", 11_020, 1_001);
        let cs = nc.conditions(&sp, &st, BTreeMap::new(), 31_000);
        let c = find(&cs, "RdmaFabricCongestion");
        assert!(!c.is_true());
        assert_eq!(c.reason, "CountersNormal");
    }

    #[test]
    fn nri_condition_says_what_to_do_when_unreachable() {
        let fx = FixtureHost::connectx6dx_pair().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("nri.sock");
        let mut nc = checks(&fx, Arc::new(NoEthtool), sock.clone());
        let cs = nc.conditions(&spec(), &status_with_pfc(vec![3]), BTreeMap::new(), 1);
        let c = find(&cs, NRI_CONDITION);
        assert!(!c.is_true());
        assert!(c.message.contains("nri.sock") && c.message.contains("LimitMEMLOCK=infinity"));
        let l = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        l.set_nonblocking(true).unwrap();
        let cs = nc.conditions(&spec(), &status_with_pfc(vec![3]), BTreeMap::new(), 2);
        let c = find(&cs, NRI_CONDITION);
        assert!(c.is_true() && c.reason == "Reachable");
        // Every pass without a connection: containerd would log each one
        // that closes unregistered as an error (issue 10, item 7).
        let _ = nc.conditions(&spec(), &status_with_pfc(vec![3]), BTreeMap::new(), 3);
        assert_eq!(
            l.accept().map(|_| ()).map_err(|e| e.kind()),
            Err(std::io::ErrorKind::WouldBlock),
            "the node agent connected to the NRI socket"
        );
    }

    /// kroce-nri capped a request at the runtime's hard limit: the node says
    /// so, naming the values (issue 10, item 5).
    #[test]
    fn memlock_granted_condition_from_the_nri_status_file() {
        let fx = FixtureHost::connectx6dx_pair().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let mut nc = checks(&fx, Arc::new(NoEthtool), dir.path().join("nri.sock"));
        let none = nc.conditions(&spec(), &status_with_pfc(vec![3]), BTreeMap::new(), 1);
        assert!(
            !none.iter().any(|c| c.type_ == NRI_MEMLOCK_CONDITION),
            "no status file, no condition"
        );
        let scrape = nc.metrics_source();
        assert!(!scrape().contains("kroce_nri_"), "no status file, no gauge");
        write(&fx.path().join("proc/812/comm"), "containerd\n");
        write(
            &fx.path().join(crate::doctor::DEFAULT_NRI_STATUS),
            r#"{"version":1,"updatedAt":1,"runtimeName":"containerd","runtimeVersion":"2.1.9",
                "runtime":{"pid":812,"capSysResource":false,"initialUserNamespace":true,
                           "memlockSoft":"8388608","memlockHard":"8388608"},
                "lastCapped":{"container":"ctr-1","pod":"default/rdma-app","requested":"unlimited",
                              "granted":"8388608","at":1},
                "cappedCount":2}"#,
        );
        let cs = nc.conditions(&spec(), &status_with_pfc(vec![3]), BTreeMap::new(), 2);
        let c = find(&cs, NRI_MEMLOCK_CONDITION);
        assert_eq!(c.status, ConditionStatus::False, "{c:?}");
        for want in [
            "containerd 2.1.9 (pid 812)",
            "lacks CAP_SYS_RESOURCE",
            "capped 2 request(s)",
            "asked for unlimited, got 8 MiB",
            "LimitMEMLOCK=infinity",
        ] {
            assert!(c.message.contains(want), "{want:?} not in {}", c.message);
        }
        // The same status as gauges `/metrics` serves (alert KroceNriMemlockCapped).
        let text = scrape();
        for want in [
            "kroce_nri_memlock_capped_requests{node=\"n1\"} 2",
            "kroce_nri_memlock_runtime_limited{node=\"n1\"} 1",
        ] {
            assert!(text.lines().any(|l| l == want), "no {want:?} in\n{text}");
        }
        // Also when kroce configures nothing on the node: pods still get capped.
        let cs = nc.conditions(
            &RdmaNodeStateSpec::default(),
            &RdmaNodeStateStatus::default(),
            BTreeMap::new(),
            3,
        );
        assert_eq!(
            find(&cs, NRI_MEMLOCK_CONDITION).status,
            ConditionStatus::False
        );
        // The runtime it describes is gone: stale, no gauges.
        std::fs::remove_dir_all(fx.path().join("proc/812")).unwrap();
        nc.conditions(&spec(), &status_with_pfc(vec![3]), BTreeMap::new(), 4);
        assert!(!scrape().contains("kroce_nri_"), "{}", scrape());
    }

    #[test]
    fn doctor_conditions_on_a_fixture_host() {
        let fx = FixtureHost::connectx6dx_pair().unwrap();
        let pf = rdma_of(&fx, "0000:3b:00.0");
        let dir = tempfile::tempdir().unwrap();
        let mut nc = checks(&fx, Arc::new(NoEthtool), dir.path().join("nri.sock"));
        // The runtime hands containers 8 MiB.
        write(&fx.path().join("proc/812/comm"), "containerd\n");
        write(
            &fx.path().join("proc/812/limits"),
            "Max locked memory         8388608              8388608              bytes\n",
        );
        let ip = Ipv4Addr::new(10, 0, 0, 1);
        fx.add_ipv4_gid(&pf, 2, ip, "ens1f0").unwrap();
        let ipv4 = BTreeMap::from([("ens1f0".to_string(), vec![ip])]);
        let cs = nc.conditions(&spec(), &status_with_pfc(vec![3]), ipv4.clone(), 1);
        assert_eq!(find(&cs, "RdmaLinkActive").status, ConditionStatus::True);
        let gid = find(&cs, "RoceV2GidPresent");
        assert!(
            gid.is_true() && gid.message.contains("GID index 3"),
            "{gid:?}"
        );
        assert_eq!(find(&cs, "PfcConfigured").status, ConditionStatus::True);
        assert_eq!(find(&cs, "IrqsNumaLocal").status, ConditionStatus::True);
        let m = find(&cs, "MemlockSufficient");
        assert_eq!(m.status, ConditionStatus::False, "{m:?}");
        assert!(
            m.message.contains("8 MiB") && m.message.contains("fix:"),
            "{}",
            m.message
        );
        // A dead port, PFC on the wrong priority, and a PF completion IRQ
        // (not the control vector) moved onto the other NUMA node.
        fx.set_port_state(&pf, "1: DOWN").unwrap();
        let host = sriov_helpers::Host::scan(&fx.root());
        let irq = host.pci[&"0000:3b:00.0".parse().unwrap()].msi_irqs[1];
        sriov_helpers::irq::write_affinity(&fx.root(), irq, &"20".parse().unwrap()).unwrap();
        let cs = nc.conditions(&spec(), &status_with_pfc(vec![0]), ipv4.clone(), 2);
        let link = find(&cs, "RdmaLinkActive");
        assert_eq!(link.status, ConditionStatus::False);
        assert!(
            link.message.contains(&pf) && link.message.contains("DOWN"),
            "{}",
            link.message
        );
        assert_eq!(find(&cs, "PfcConfigured").status, ConditionStatus::False);
        let irqs = find(&cs, "IrqsNumaLocal");
        assert_eq!(irqs.status, ConditionStatus::False, "{irqs:?}");
        assert!(irqs.message.contains(&irq.to_string()), "{}", irqs.message);
        // PFC also on another priority: a warning, still True.
        let cs = nc.conditions(&spec(), &status_with_pfc(vec![0, 3]), ipv4, 3);
        let pfc = find(&cs, "PfcConfigured");
        assert_eq!(
            (pfc.status, pfc.reason.as_str()),
            (ConditionStatus::True, "Warning")
        );
        // No address known: the GID check cannot tell.
        let cs = nc.conditions(&spec(), &status_with_pfc(vec![3]), BTreeMap::new(), 4);
        assert_eq!(
            find(&cs, "RoceV2GidPresent").status,
            ConditionStatus::Unknown
        );
        // Nothing configured by kroce: no doctor conditions, NRI still reported.
        let cs = nc.conditions(
            &RdmaNodeStateSpec::default(),
            &RdmaNodeStateStatus::default(),
            BTreeMap::new(),
            5,
        );
        assert_eq!(
            cs.len(),
            1 + usize::from(cs.iter().any(|c| c.type_ == "RdmaFabricCongestion"))
        );
    }
}
