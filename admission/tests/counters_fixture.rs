#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Counter snapshots from fixture hosts, Prometheus text, rates and the
//! congestion condition.

use kroce_admission::counters::{
    CONDITION_TYPE, CongestionLimits, CounterSource, EthtoolStats, RateError, congestion_condition,
    parse_ethtool_stats, rates, read_snapshot, render_prometheus,
};
use sriov_helpers::Host;
use sriov_helpers::fixture::FixtureHost;
use std::collections::BTreeMap;
use std::path::Path;

fn write(path: &Path, content: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, content).unwrap();
}

/// Writes the counters a ConnectX port exposes for `dev` (port 1) and its netdev.
fn set_counters(fx: &FixtureHost, dev: &str, netdev: &str, base: u64) {
    let port = fx
        .path()
        .join(format!("sys/class/infiniband/{dev}/ports/1"));
    for (name, v) in [
        ("port_xmit_data", base * 4),
        ("port_rcv_data", base * 3),
        ("port_xmit_packets", base),
        ("port_xmit_discards", 0),
        ("port_rcv_errors", 0),
        ("symbol_error", 0),
    ] {
        write(&port.join("counters").join(name), &format!("{v}\n"));
    }
    for (name, v) in [
        ("np_ecn_marked_roce_packets", base / 10),
        ("np_cnp_sent", base / 20),
        ("rp_cnp_handled", base / 30),
        ("out_of_sequence", 2),
        ("packet_seq_err", 1),
        ("local_ack_timeout_err", 0),
        ("out_of_buffer", 0),
        // A setting, not a counter.
        ("lifespan", 10),
    ] {
        write(&port.join("hw_counters").join(name), &format!("{v}\n"));
    }
    let stats = fx.path().join(format!("sys/class/net/{netdev}/statistics"));
    for (name, v) in [
        ("rx_bytes", base * 100),
        ("tx_bytes", base * 90),
        ("rx_dropped", 5),
        ("tx_dropped", 0),
        ("rx_missed_errors", 0),
    ] {
        write(&stats.join(name), &format!("{v}\n"));
    }
}

fn ethtool(rx_prio3: u64, discards: u64) -> EthtoolStats {
    let text = format!(
        "NIC statistics:\n     rx_packets: 1000\n     rx_prio3_pause: {rx_prio3}\n     tx_prio3_pause: 12\n     rx_pause_ctrl_phy: {rx_prio3}\n     rx_discards_phy: {discards}\n"
    );
    let mut m = BTreeMap::new();
    m.insert("ens1f0".to_string(), parse_ethtool_stats(&text));
    m
}

#[test]
fn snapshot_reads_port_hw_and_netdev_counters() {
    let fx = FixtureHost::connectx6dx_pair().unwrap();
    set_counters(&fx, "mlx5_0", "ens1f0", 1_000_000);
    let host = Host::scan(&fx.root());
    let only = vec!["mlx5_0".to_string(), "mlx5_1".to_string()];
    let s = read_snapshot(
        &fx.root(),
        &host,
        "node-a",
        1_000,
        &ethtool(500, 3),
        Some(&only),
    );
    assert!(s.errors.is_empty(), "{:?}", s.errors);
    assert_eq!(s.ports.len(), 2);
    let p = &s.ports[0];
    assert_eq!((p.device.as_str(), p.port), ("mlx5_0", 1));
    assert_eq!(p.netdev.as_deref(), Some("ens1f0"));
    assert_eq!(p.counters["port_xmit_data"], 4_000_000);
    assert_eq!(p.hw_counters["np_ecn_marked_roce_packets"], 100_000);
    assert_eq!(p.hw_counters["rp_cnp_handled"], 33_333);
    assert!(!p.hw_counters.contains_key("lifespan"));
    assert_eq!(p.netdev_stats["rx_dropped"], 5);
    assert_eq!(p.pause.len(), 3);
    assert_eq!(p.phy_discards["rx_discards_phy"], 3);
    // The VF has no counters written: empty maps, not errors.
    let vf = &s.ports[1];
    assert_eq!(vf.netdev.as_deref(), Some("ens1f0v0"));
    assert!(vf.counters.is_empty() && vf.hw_counters.is_empty());
    assert!(vf.pause.is_empty());
    // Every device when not filtered.
    let all = read_snapshot(&fx.root(), &host, "node-a", 1_000, &BTreeMap::new(), None);
    assert_eq!(all.ports.len(), 18);
}

#[test]
fn unreadable_counters_are_reported_by_path_and_the_rest_still_read() {
    let fx = FixtureHost::connectx6dx_pair().unwrap();
    set_counters(&fx, "mlx5_0", "ens1f0", 10);
    write(
        &fx.path()
            .join("sys/class/infiniband/mlx5_0/ports/1/hw_counters/np_cnp_sent"),
        "N/A\n",
    );
    // A VF whose netdev moved into a pod: no netdev here.
    fx.remove_netdev("ens1f0v0").unwrap();
    let host = Host::scan(&fx.root());
    let only = vec!["mlx5_0".to_string(), "mlx5_1".to_string()];
    let s = read_snapshot(&fx.root(), &host, "n", 1, &BTreeMap::new(), Some(&only));
    assert_eq!(s.errors.len(), 1, "{:?}", s.errors);
    assert!(s.errors[0].contains("hw_counters/np_cnp_sent") && s.errors[0].contains("N/A"));
    assert_eq!(s.ports[0].hw_counters["out_of_sequence"], 2);
    assert!(!s.ports[0].hw_counters.contains_key("np_cnp_sent"));
    assert_eq!(s.ports[1].netdev, None);
    assert!(s.ports[1].netdev_stats.is_empty());
}

/// A minimal check of the exposition format: every sample line is
/// `name{k="v",...} <u64>`, every family has one HELP and one TYPE before
/// its samples.
fn validate_exposition(text: &str) -> BTreeMap<String, usize> {
    let mut families: BTreeMap<String, usize> = BTreeMap::new();
    let mut typed: Option<String> = None;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split_whitespace().next().unwrap();
            assert!(!families.contains_key(name), "HELP twice for {name}");
            families.insert(name.to_string(), 0);
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut it = rest.split_whitespace();
            let name = it.next().unwrap();
            assert_eq!(it.next(), Some("counter"));
            typed = Some(name.to_string());
            continue;
        }
        let (name, rest) = line.split_once('{').unwrap();
        assert_eq!(
            Some(name),
            typed.as_deref(),
            "sample outside its family: {line}"
        );
        assert!(
            name.starts_with("kroce_rdma_") && name.ends_with("_total"),
            "{name}"
        );
        assert!(
            name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'),
            "{name}"
        );
        let (labels, value) = rest.rsplit_once("} ").unwrap();
        value.parse::<u64>().unwrap();
        for kv in labels.split("\",") {
            let (k, v) = kv.split_once("=\"").unwrap();
            assert!(
                k.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{k}"
            );
            assert!(!v.trim_end_matches('"').contains('"'), "{v}");
        }
        *families.get_mut(name).unwrap() += 1;
    }
    families
}

#[test]
fn prometheus_exposition() {
    let fx = FixtureHost::connectx6dx_pair().unwrap();
    set_counters(&fx, "mlx5_0", "ens1f0", 1_000);
    set_counters(&fx, "mlx5_9", "ens2f0", 2_000);
    let host = Host::scan(&fx.root());
    let only = vec!["mlx5_0".to_string(), "mlx5_9".to_string()];
    let s = read_snapshot(
        &fx.root(),
        &host,
        "worker-1",
        1,
        &ethtool(7, 1),
        Some(&only),
    );
    let text = render_prometheus(&s);
    let fams = validate_exposition(&text);
    assert_eq!(fams["kroce_rdma_hw_np_cnp_sent_total"], 2);
    assert_eq!(fams["kroce_rdma_port_port_xmit_data_total"], 2);
    assert_eq!(fams["kroce_rdma_netdev_rx_dropped_total"], 2);
    // Pause frames only for ens1f0 (ethtool given for it): rx prio3, tx prio3, rx all.
    assert_eq!(fams["kroce_rdma_pause_frames_total"], 3);
    assert!(text.contains(
        "kroce_rdma_hw_np_ecn_marked_roce_packets_total{node=\"worker-1\",device=\"mlx5_9\",port=\"1\"} 200\n"
    ), "{text}");
    assert!(text.contains(
        "kroce_rdma_pause_frames_total{node=\"worker-1\",device=\"mlx5_0\",port=\"1\",netdev=\"ens1f0\",direction=\"rx\",priority=\"3\"} 7\n"
    ), "{text}");
    assert!(text.contains("priority=\"all\"} 7\n"), "{text}");
    assert!(text.contains("# HELP kroce_rdma_port_port_xmit_data_total RDMA port counter port_xmit_data (units of 4 bytes)"));
    assert!(!text.contains("lifespan"));
    // Label values are escaped.
    let mut odd = s.clone();
    odd.node = "we\"ird\\node".into();
    let t = render_prometheus(&odd);
    assert!(t.contains("node=\"we\\\"ird\\\\node\""), "{t}");
}

#[test]
fn rates_and_the_congestion_condition() {
    let fx = FixtureHost::connectx6dx_pair().unwrap();
    let only = vec!["mlx5_0".to_string()];
    set_counters(&fx, "mlx5_0", "ens1f0", 1_000);
    let host = Host::scan(&fx.root());
    let a = read_snapshot(
        &fx.root(),
        &host,
        "n1",
        10_000,
        &ethtool(100, 0),
        Some(&only),
    );
    set_counters(&fx, "mlx5_0", "ens1f0", 11_000);
    // A counter reset (driver reload) between the snapshots.
    write(
        &fx.path()
            .join("sys/class/infiniband/mlx5_0/ports/1/hw_counters/out_of_sequence"),
        "0\n",
    );
    let b = read_snapshot(
        &fx.root(),
        &host,
        "n1",
        20_000,
        &ethtool(100, 0),
        Some(&only),
    );
    let r = rates(&a, &b).unwrap();
    let find = |name: &str| r.iter().find(|x| x.name == name).unwrap();
    // 10,000 more packets in 10 s.
    assert_eq!(find("port_xmit_packets").delta, 10_000);
    assert_eq!(find("port_xmit_packets").per_sec, 1_000.0);
    assert_eq!(find("np_cnp_sent").source, CounterSource::Hw);
    assert!(
        r.iter().all(|x| x.name != "out_of_sequence"),
        "reset counters are left out"
    );

    let limits = CongestionLimits {
        max_pause_frames_per_sec: 100.0,
        max_discards_per_sec: 10.0,
    };
    let quiet = congestion_condition(&a, &b, &limits).unwrap();
    assert!(!quiet.status, "{quiet:?}");
    assert_eq!(quiet.reason, "CountersNormal");
    assert_eq!(quiet.condition_type, CONDITION_TYPE);

    // Pause frames on the RoCE priority climb by 5,000/s.
    let c = read_snapshot(
        &fx.root(),
        &host,
        "n1",
        30_000,
        &ethtool(50_100, 0),
        Some(&only),
    );
    let cond = congestion_condition(&b, &c, &limits).unwrap();
    assert!(cond.status);
    assert_eq!(cond.reason, "PauseFramesGrowing");
    assert!(
        cond.message
            .contains("ens1f0 mlx5_0/1: rx_prio3_pause at 5000.0/s (limit 100/s)"),
        "{}",
        cond.message
    );
    assert_eq!(cond.offenders.len(), 2, "per-priority and global rx pause");

    // And discards too.
    write(
        &fx.path().join("sys/class/net/ens1f0/statistics/rx_dropped"),
        "50005\n",
    );
    let d = read_snapshot(
        &fx.root(),
        &host,
        "n1",
        40_000,
        &ethtool(100_100, 1_000),
        Some(&only),
    );
    let cond = congestion_condition(&c, &d, &limits).unwrap();
    assert_eq!(cond.reason, "PauseFramesGrowingAndDiscardsGrowing");
    assert!(
        cond.message.contains("rx_dropped at 5000.0/s"),
        "{}",
        cond.message
    );
    assert!(
        cond.message.contains("rx_discards_phy at 100.0/s"),
        "{}",
        cond.message
    );

    // Bad pairs of snapshots.
    assert!(matches!(rates(&b, &a), Err(RateError::NotLater { .. })));
    let mut other = b.clone();
    other.node = "n2".into();
    assert!(matches!(
        rates(&a, &other),
        Err(RateError::DifferentNodes(..))
    ));
    // Snapshots survive JSON (the node agent may persist the last one).
    let back: kroce_admission::counters::CounterSnapshot =
        serde_json::from_str(&serde_json::to_string(&d).unwrap()).unwrap();
    assert_eq!(back, d);
}
