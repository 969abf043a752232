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

/// One test at a time: the latency bound must not measure another test's
/// `ip` processes competing for the CPU.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn veth_link_down_and_up_reach_list_and_watch_within_100ms_and_idle_does_no_work() {
    let test = "veth_link_down_and_up_reach_list_and_watch_within_100ms_and_idle_does_no_work";
    if skip_without_netns(test) {
        return;
    }
    let _serial = serial();
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
    let _serial = serial();
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

/// Issue 24: links that are not devices (a bridge, a veth pair, the VF
/// netdev's own veth peer) and their addresses wake no rescan. In the
/// throwaway namespace their ifindexes are small, like the fixture's
/// made-up ones, which is what made them count before.
#[test]
fn bridge_and_veth_churn_wakes_no_rescan() {
    let test = "bridge_and_veth_churn_wakes_no_rescan";
    if skip_without_netns(test) {
        return;
    }
    let _serial = serial();
    let mut h = Harness::prepare(VF_CONFIG, false);
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
        k.wait_devices(VF, SEEN_WITHIN, "16 VFs, ens1f0v1 healthy", |d| {
            d.len() == 16 && health_of(d, VF1) == Some("Healthy")
        })
        .await
        .unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        let scans = h.counters.scans();
        for round in 0..2 {
            for args in [
                &["link", "add", "kbr0", "type", "bridge"][..],
                &[
                    "link", "add", "kva0", "type", "veth", "peer", "name", "kvb0",
                ],
                &["link", "set", "kva0", "master", "kbr0"],
                &["link", "set", "kbr0", "up"],
                &["link", "set", "kva0", "up"],
                &["link", "set", "kvb0", "up"],
                &["addr", "add", "10.99.0.1/24", "dev", "kbr0"],
                &["addr", "add", "10.99.0.2/24", "dev", "kvb0"],
                &["link", "set", "kvb0", "mtu", "1400"],
                // The VF netdev's own peer: a veth, not a device.
                &["addr", "add", "10.98.0.2/24", "dev", "vfpeer"],
                &["addr", "del", "10.98.0.2/24", "dev", "vfpeer"],
                &["link", "set", "vfpeer", "mtu", "1400"],
                &["link", "set", "vfpeer", "mtu", "1500"],
                &["link", "del", "kva0"],
                &["link", "del", "kbr0"],
            ] {
                veth.ip(args).unwrap();
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
            assert_eq!(
                h.counters.scans(),
                scans,
                "round {round}: bridge/veth events woke a rescan"
            );
        }
        // A device's own link still does.
        veth.set_peer(false).unwrap();
        k.wait_devices(VF, SEEN_WITHIN, "ens1f0v1 unhealthy", |d| {
            health_of(d, VF1) == Some("Unhealthy")
        })
        .await
        .unwrap();
        assert!(h.counters.scans() > scans);
        h.shutdown().await;
    });
}
