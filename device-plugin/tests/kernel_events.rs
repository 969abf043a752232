//! Health driven by kernel events, against a real link: the fixture's VF
//! netdev `ens1f0v1` is backed by a veth in a throwaway netns the plugin
//! runs in (testing::veth). Needs root; skipped without it, a failure in CI.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{Harness, SEEN_WITHIN, VF, VF_CONFIG};
use kroce_device_plugin::testing::health_of;
use kroce_device_plugin::testing::veth::{VethHost, skip_without_netns};
use std::time::{Duration, Instant};

/// The bound from `ip link set … down` to the kubelet's list.
const WITHIN: Duration = Duration::from_millis(100);
const VF1: &str = "0000:3b:00.3"; // ens1f0v1

#[test]
fn veth_link_down_and_up_reach_list_and_watch_within_100ms_and_idle_does_no_work() {
    let test = "veth_link_down_and_up_reach_list_and_watch_within_100ms_and_idle_does_no_work";
    if skip_without_netns(test) {
        return;
    }
    let mut h = Harness::prepare(VF_CONFIG, false);
    // The default safety tick: only kernel events can meet the bound.
    h.rescan = kroce_device_plugin::plugin::DEFAULT_RESCAN;
    let veth = VethHost::create(&h.fx, "ens1f0v1").unwrap();
    // The runtime's threads start in the netns, so the plugin's netlink
    // sockets are opened there.
    veth.enter().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        h.start_kubelet().await;
        h.start_plugin();
        let k = h.kubelet();
        k.wait_registered(VF, 1, SEEN_WITHIN).await.unwrap();
        k.wait_devices(VF, SEEN_WITHIN, "16 VFs, ens1f0v1 healthy", |d| {
            d.len() == 16 && health_of(d, VF1) == Some("Healthy")
        })
        .await
        .unwrap();

        // Idle: no probe, no scan (the start-up ones are done).
        tokio::time::sleep(Duration::from_millis(300)).await;
        let (probes, scans) = (h.counters.probes(), h.counters.scans());
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(
            (h.counters.probes(), h.counters.scans()),
            (probes, scans),
            "work done at idle"
        );

        for round in 0..3 {
            let t = Instant::now();
            veth.set_peer(false).unwrap();
            k.wait_devices(VF, SEEN_WITHIN, "ens1f0v1 unhealthy", |d| {
                health_of(d, VF1) == Some("Unhealthy")
            })
            .await
            .unwrap();
            let down = t.elapsed();
            assert_eq!(veth.operstate().unwrap(), "lowerlayerdown");
            let t = Instant::now();
            veth.set_peer(true).unwrap();
            k.wait_devices(VF, SEEN_WITHIN, "ens1f0v1 healthy", |d| {
                health_of(d, VF1) == Some("Healthy")
            })
            .await
            .unwrap();
            let up = t.elapsed();
            eprintln!("round {round}: down seen after {down:?}, up after {up:?}");
            assert!(
                down < WITHIN,
                "link down reached the kubelet after {down:?}"
            );
            assert!(up < WITHIN, "link up reached the kubelet after {up:?}");
        }
        assert!(
            h.counters
                .kernel_events
                .load(std::sync::atomic::Ordering::Relaxed)
                > 0
        );
        h.shutdown().await;
    });
}

#[test]
fn without_kernel_events_the_tick_still_finds_the_link_down() {
    let test = "without_kernel_events_the_tick_still_finds_the_link_down";
    if skip_without_netns(test) {
        return;
    }
    let mut h = Harness::prepare(VF_CONFIG, false);
    // Events off and a long tick asked for: the fallback tick (1 s) applies.
    h.kernel_events = false;
    h.rescan = kroce_device_plugin::plugin::DEFAULT_RESCAN;
    let veth = VethHost::create(&h.fx, "ens1f0v1").unwrap();
    veth.enter().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        h.start_kubelet().await;
        h.start_plugin();
        let k = h.kubelet();
        k.wait_devices(VF, SEEN_WITHIN, "ens1f0v1 healthy", |d| {
            d.len() == 16 && health_of(d, VF1) == Some("Healthy")
        })
        .await
        .unwrap();
        veth.set_peer(false).unwrap();
        k.wait_devices(VF, SEEN_WITHIN, "ens1f0v1 unhealthy", |d| {
            health_of(d, VF1) == Some("Unhealthy")
        })
        .await
        .unwrap();
        assert!(h.counters.probes() > 0);
        h.shutdown().await;
    });
}
