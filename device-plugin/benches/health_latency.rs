//! Link down / up → kubelet ListAndWatch latency, the old 1 s tick against
//! kernel events, side by side in one run. A fixture VF netdev backed by a
//! real veth in a throwaway netns (testing::veth); the peer goes down (the
//! VF loses carrier) and up again. Needs root; says so and exits otherwise.
//!
//! `cargo bench -p kroce-device-plugin --bench health_latency [-- ROUNDS]`
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/common/mod.rs"]
mod common;

use common::{Harness, SEEN_WITHIN, VF, VF_CONFIG};
use kroce_device_plugin::plugin::{DEFAULT_RESCAN, FALLBACK_RESCAN};
use kroce_device_plugin::testing::health_of;
use kroce_device_plugin::testing::veth::{VethHost, skip_without_netns};
use std::time::{Duration, Instant};

const VF1: &str = "0000:3b:00.3"; // ens1f0v1

fn measure(kernel_events: bool, rescan: Duration, rounds: usize) -> (Vec<Duration>, Vec<Duration>) {
    let mut h = Harness::prepare(VF_CONFIG, false);
    h.kernel_events = kernel_events;
    h.rescan = rescan;
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
        let wait = |want: &'static str| {
            k.wait_devices(VF, SEEN_WITHIN * 2, want, move |d| {
                health_of(d, VF1) == Some(want)
            })
        };
        k.wait_devices(VF, SEEN_WITHIN, "16 VFs", |d| d.len() == 16)
            .await
            .unwrap();
        wait("Healthy").await.unwrap();
        let (mut downs, mut ups) = (Vec::new(), Vec::new());
        // Out of step with the tick, spread evenly over its period: a real
        // link fails at any moment (a fixed pause would lock onto its phase).
        let pause = |i: usize| Duration::from_millis(((i * 379 + 113) % 1000) as u64);
        for i in 0..rounds {
            tokio::time::sleep(pause(2 * i)).await;
            let t = Instant::now();
            veth.set_peer(false).unwrap();
            wait("Unhealthy").await.unwrap();
            downs.push(t.elapsed());
            tokio::time::sleep(pause(2 * i + 1)).await;
            let t = Instant::now();
            veth.set_peer(true).unwrap();
            wait("Healthy").await.unwrap();
            ups.push(t.elapsed());
        }
        h.shutdown().await;
        (downs, ups)
    })
}

fn summary(v: &mut [Duration]) -> String {
    v.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let mean = v.iter().map(|d| ms(*d)).sum::<f64>() / v.len() as f64;
    format!(
        "min {:7.1}  median {:7.1}  p90 {:7.1}  max {:7.1}  mean {:7.1} ms",
        ms(v[0]),
        ms(v[v.len() / 2]),
        ms(v[(v.len() * 9 / 10).min(v.len() - 1)]),
        ms(v[v.len() - 1]),
        mean
    )
}

fn main() {
    if skip_without_netns("bench health_latency") {
        return;
    }
    // `cargo bench` passes `--bench`; a bare number is the round count.
    let rounds = std::env::args()
        .skip(1)
        .find_map(|a| a.parse::<usize>().ok())
        .unwrap_or(20)
        .max(1);
    println!("link down/up -> ListAndWatch, {rounds} rounds each");
    for (name, events, rescan) in [
        ("1 s tick, no events (before)", false, FALLBACK_RESCAN),
        ("kernel events, 30 s tick (now)", true, DEFAULT_RESCAN),
    ] {
        let (mut downs, mut ups) = measure(events, rescan, rounds);
        println!("{name}");
        println!("  down: {}", summary(&mut downs));
        println!("  up:   {}", summary(&mut ups));
    }
}
