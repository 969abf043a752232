#![allow(clippy::unwrap_used, clippy::expect_used)]
//! perftest command lines from fixture hosts (GID index and NUMA-local CPUs
//! from the host model) and verdicts on the published outputs.

use kroce_admission::command::{
    CommandError, PerftestSpec, PerftestTool, client_command, resolve_endpoint, server_command,
};
use kroce_admission::lifecycle::RunOutcome;
use kroce_admission::perftest::parse;
use kroce_admission::thresholds::{AdmissionThresholds, Limit, Measurement, evaluate};
use sriov_helpers::fixture::FixtureHost;
use sriov_helpers::{CpuList, Host};
use std::net::Ipv4Addr;
use std::path::PathBuf;

fn fixture(name: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/fixtures/perftest")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "perftest fixture {} is required (../shared beside the workspace): {e}",
            path.display()
        )
    })
}

/// Everything but `-d`/`-i`/`-x` (local to each side) and the server address.
fn shared_options(argv: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut it = argv.iter().skip_while(|a| !a.starts_with("ib_")).skip(1);
    while let Some(a) = it.next() {
        if matches!(a.as_str(), "-d" | "-i" | "-x") {
            it.next();
            continue;
        }
        if a.parse::<Ipv4Addr>().is_ok() {
            continue;
        }
        out.push(a.clone());
    }
    out
}

#[test]
fn endpoints_come_from_the_host_model_and_options_match_on_both_sides() {
    let fx = FixtureHost::connectx6dx_pair().unwrap();
    // Server VF on ens1f0 (NUMA 0), client VF on ens2f0 (NUMA 1), with the
    // client's GID at an unusual index.
    fx.add_ipv4_gid("mlx5_1", 2, Ipv4Addr::new(10, 0, 0, 1), "ens1f0v0")
        .unwrap();
    fx.add_ipv4_gid("mlx5_10", 4, Ipv4Addr::new(10, 0, 0, 2), "ens2f0v0")
        .unwrap();
    let host = Host::scan(&fx.root());

    let server = resolve_endpoint(&host, Some("mlx5_1"), None).unwrap();
    assert_eq!(server.gid_index, 3);
    assert_eq!(server.netdev, "ens1f0v0");
    assert_eq!(server.ipv4, Ipv4Addr::new(10, 0, 0, 1));
    assert_eq!(server.cpus.as_ref().unwrap().to_string(), "0-15");
    let client = resolve_endpoint(&host, Some("mlx5_10"), None).unwrap();
    assert_eq!(client.gid_index, 5);
    assert_eq!(client.cpus.as_ref().unwrap().to_string(), "16-31");

    for spec in [
        PerftestSpec::bandwidth(PerftestTool::IbWriteBw, 10, 65536, 4, 18515),
        PerftestSpec::latency(PerftestTool::IbReadLat, 10_000, 2, 18516),
        PerftestSpec::latency(PerftestTool::IbWriteLat, 10_000, 2, 18517),
    ] {
        let s = server_command(&spec, &server).unwrap();
        let c = client_command(&spec, &client, server.ipv4).unwrap();
        assert_eq!(s.program, "taskset");
        assert_eq!(&s.args[..3], ["-c", "0-15", spec.tool.binary()]);
        assert_eq!(&c.args[..3], ["-c", "16-31", spec.tool.binary()]);
        assert_eq!(shared_options(&s.argv()), shared_options(&c.argv()));
        assert!(s.args.windows(2).any(|w| w == ["-x", "3"]));
        assert!(c.args.windows(2).any(|w| w == ["-x", "5"]));
        assert!(c.args.windows(2).any(|w| w == ["-d", "mlx5_10"]));
        assert_eq!(c.args.last().unwrap(), "10.0.0.1");
        assert!(!s.args.contains(&"10.0.0.1".to_string()));
    }
    let bw = server_command(
        &PerftestSpec::bandwidth(PerftestTool::IbWriteBw, 10, 65536, 4, 18515),
        &server,
    )
    .unwrap();
    for opt in [["-D", "10"], ["-s", "65536"], ["-q", "4"], ["-p", "18515"]] {
        assert!(
            bw.args.windows(2).any(|w| w == opt),
            "{opt:?} in {:?}",
            bw.args
        );
    }
    assert!(bw.args.contains(&"--report_gbits".to_string()));
    assert!(bw.args.contains(&"-F".to_string()));
}

#[test]
fn a_pod_sees_one_vf_and_the_cpuset_narrows_pinning() {
    let fx = FixtureHost::connectx6dx_pair().unwrap();
    fx.add_ipv4_gid("mlx5_3", 2, Ipv4Addr::new(10, 1, 0, 9), "ens1f0v2")
        .unwrap();
    let host = Host::scan(&fx.root());
    // Only one device has an IPv4 RoCE v2 GID: found without naming it.
    let allowed: CpuList = "4-7,20-23".parse().unwrap();
    let ep = resolve_endpoint(&host, None, Some(&allowed)).unwrap();
    assert_eq!(ep.rdma_device, "mlx5_3");
    assert_eq!(ep.cpus.as_ref().unwrap().to_string(), "4-7");
    // A cpuset with no local CPU: run unpinned rather than fail.
    let far: CpuList = "20-23".parse().unwrap();
    let ep = resolve_endpoint(&host, None, Some(&far)).unwrap();
    assert_eq!(ep.cpus, None);
    let spec = PerftestSpec::latency(PerftestTool::IbSendLat, 1000, 2, 18515);
    assert_eq!(server_command(&spec, &ep).unwrap().program, "ib_send_lat");

    // Two candidates: ambiguous, and the error lists them.
    fx.add_ipv4_gid("mlx5_4", 2, Ipv4Addr::new(10, 1, 0, 10), "ens1f0v3")
        .unwrap();
    let host = Host::scan(&fx.root());
    let e = resolve_endpoint(&host, None, None).unwrap_err();
    assert_eq!(e, CommandError::AmbiguousDevice("mlx5_3, mlx5_4".into()));
}

#[test]
fn missing_gid_or_device_is_a_clear_error() {
    let fx = FixtureHost::connectx6dx_pair().unwrap();
    let host = Host::scan(&fx.root());
    let e = resolve_endpoint(&host, Some("mlx5_2"), None).unwrap_err();
    assert_eq!(
        e,
        CommandError::NoRoceV2Gid {
            device: "mlx5_2".into(),
            netdev: "ens1f0v1".into()
        }
    );
    assert!(e.to_string().contains("RoCE v2"));
    assert_eq!(
        resolve_endpoint(&host, Some("mlx5_99"), None).unwrap_err(),
        CommandError::NoSuchDevice("mlx5_99".into())
    );
    assert!(matches!(
        resolve_endpoint(&host, None, None).unwrap_err(),
        CommandError::NoRoceDevice(_)
    ));
}

#[test]
fn soft_roce_runs_unpinned() {
    let mut fx = FixtureHost::new().unwrap();
    fx.add_rxe("rxe0", "eth0").unwrap();
    fx.add_ipv4_gid("rxe0", 2, Ipv4Addr::new(172, 18, 0, 2), "eth0")
        .unwrap();
    let host = Host::scan(&fx.root());
    let ep = resolve_endpoint(&host, None, None).unwrap();
    assert_eq!(
        (ep.rdma_device.as_str(), ep.netdev.as_str(), ep.gid_index),
        ("rxe0", "eth0", 3)
    );
    assert_eq!(ep.cpus, None);
    let spec = PerftestSpec::bandwidth(PerftestTool::IbWriteBw, 5, 65536, 1, 18515);
    let c = client_command(&spec, &ep, Ipv4Addr::new(172, 18, 0, 3)).unwrap();
    assert_eq!(c.argv()[0], "ib_write_bw");
}

#[test]
fn verdicts_on_the_published_outputs() {
    let bw = parse(&fixture("ib_write_bw-all-sizes-gbits-azure-aks.txt")).unwrap();
    let lat = parse(&fixture("ib_read_lat-client-azure-aks.txt")).unwrap();
    // The publisher's own criteria: > 190 Gb/s, t_avg < 6 us.
    let published = AdmissionThresholds {
        min_bandwidth_gbps: Some(190.0),
        max_latency_us: Some(6.0),
        ..Default::default()
    };
    let m = Measurement::from_reports(Some(&bw), Some(&lat), Some(200.0));
    assert_eq!(m.bandwidth_gbps, Some(196.64));
    assert_eq!(m.latency_avg_us, Some(5.50));
    assert_eq!(m.latency_p99_us, Some(5.74));
    let v = evaluate(&published, &m).unwrap();
    assert!(v.passed, "{}", v.message);
    assert!(
        v.message
            .contains("bandwidth 196.64 Gb/s >= minimum 190.00 Gb/s"),
        "{}",
        v.message
    );

    // Stricter limits: each miss says by how much.
    let strict = AdmissionThresholds {
        min_bandwidth_gbps: Some(200.0),
        min_bandwidth_fraction: Some(0.9),
        max_latency_us: Some(5.0),
        max_p99_latency_us: Some(5.0),
    };
    let v = evaluate(&strict, &m).unwrap();
    assert!(!v.passed);
    let failed: Vec<Limit> = v
        .checks
        .iter()
        .filter(|c| !c.passed)
        .map(|c| c.limit)
        .collect();
    assert_eq!(
        failed,
        vec![
            Limit::MinBandwidthGbps,
            Limit::MaxLatencyUs,
            Limit::MaxP99LatencyUs
        ]
    );
    assert!(
        v.message
            .contains("bandwidth 196.64 Gb/s is 3.36 Gb/s (1.7%) below the minimum 200.00 Gb/s"),
        "{}",
        v.message
    );
    assert!(
        v.message
            .contains("average latency 5.50 us is 0.50 us (10.0%) above the maximum 5.00 us"),
        "{}",
        v.message
    );
    assert!(
        v.message
            .contains("p99 latency 5.74 us is 0.74 us (14.8%) above the maximum 5.00 us"),
        "{}",
        v.message
    );
    // The fraction passed: 196.64 >= 0.9 * 200.
    let frac = v
        .checks
        .iter()
        .find(|c| c.limit == Limit::MinBandwidthFraction)
        .unwrap();
    assert!(frac.passed);
    assert_eq!(frac.threshold, Some(180.0));
    assert!((v.checks[0].shortfall - 3.36).abs() < 1e-9);

    // The fraction uses the port rate from sysfs (fixture: 100 Gb/sec).
    let fx = FixtureHost::connectx6dx_pair().unwrap();
    let host = Host::scan(&fx.root());
    let rate = host.rdma["mlx5_1"].ports[0].rate_gbps();
    assert_eq!(rate, Some(100.0));
    let m2 = Measurement {
        bandwidth_gbps: Some(72.0),
        port_rate_gbps: rate,
        ..Default::default()
    };
    let v = evaluate(
        &AdmissionThresholds {
            min_bandwidth_fraction: Some(0.8),
            ..Default::default()
        },
        &m2,
    )
    .unwrap();
    assert!(!v.passed);
    assert_eq!(
        v.message,
        "bandwidth 72.00 Gb/s is 8.00 Gb/s (10.0%) below the minimum 80.00 Gb/s (80% of the 100 Gb/s port rate)"
    );
    // Without a port rate the fraction cannot be judged, and says so.
    let v = evaluate(
        &AdmissionThresholds {
            min_bandwidth_fraction: Some(0.8),
            ..Default::default()
        },
        &Measurement {
            bandwidth_gbps: Some(72.0),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(
        !v.passed && v.message.contains("port rate"),
        "{}",
        v.message
    );

    // A run without a latency report cannot pass a latency limit.
    let v = evaluate(
        &published,
        &Measurement::from_reports(Some(&bw), None, None),
    )
    .unwrap();
    assert!(
        !v.passed && v.message.contains("average latency was not measured"),
        "{}",
        v.message
    );

    // What the operator hands to the state machine.
    let o = RunOutcome::from_verdict(&evaluate(&strict, &m).unwrap(), m.clone());
    assert!(!o.passed);
    assert_eq!(o.measurement, Some(m));
}
