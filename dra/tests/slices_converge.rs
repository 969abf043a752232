//! The node's ResourceSlices come back when someone else deletes them: the
//! kubelet deletes all of its node's slices at every start (issue 24 item 2).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[allow(dead_code)]
mod common;

use futures::StreamExt;
use kroce_dra::publish::{KubePublisher, SlicePublisher};
use kroce_dra::testing::PluginRig;
use serde_json::json;
use std::time::{Duration, Instant};

const NODE: &str = "node-a";

async fn wait_slices(rig: &PluginRig, within: Duration) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < within {
        if !rig.publisher.slices(NODE).is_empty() {
            return Some(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

#[tokio::test]
async fn deleted_slices_are_published_again_without_waiting_for_a_device_change() {
    let mut rig = PluginRig::new(NODE).unwrap();
    // A rescan tick far away: only the watch can bring the slices back.
    rig.opts.rescan = Duration::from_secs(600);
    let plugin = rig.plugin().await.unwrap();
    wait_slices(&rig, Duration::from_secs(5))
        .await
        .expect("first publication");
    let first = rig.publisher.slices(NODE);
    let writes = rig.publisher.writes();
    // Our own write's event reads back the same content: no second write.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(rig.publisher.writes(), writes);

    for round in 0..2 {
        rig.publisher.delete_all(NODE);
        let took = wait_slices(&rig, Duration::from_secs(3))
            .await
            .unwrap_or_else(|| panic!("round {round}: slices not published again"));
        println!("round {round}: republished in {took:?}");
        let again = rig.publisher.slices(NODE);
        assert_eq!(again.len(), first.len());
        assert_eq!(again[0].spec.devices, first[0].spec.devices);
        // The generation never goes backwards.
        assert!(again[0].spec.pool.generation > first[0].spec.pool.generation);
    }
    plugin.stop().await;
}

/// The watch asks the API server for this node's slices of this driver by
/// field, and yields on the initial list's end and on each event.
#[tokio::test]
async fn kube_publisher_watches_the_nodes_slices_by_field() {
    let (client, seen) = common::mock(Box::new(|s| {
        if s.query.contains("watch=true") {
            let slice = json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                "metadata": {"name": "node-a-rdma.kroce.io-0", "resourceVersion": "2"},
                "spec": {"driver": "rdma.kroce.io", "nodeName": "node-a",
                         "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 1}}
            });
            // One event; the mock answers with a single JSON document.
            (200, json!({"type": "DELETED", "object": slice}))
        } else {
            (
                200,
                json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSliceList",
                       "metadata": {"resourceVersion": "1"}, "items": []}),
            )
        }
    }));
    let publisher = KubePublisher::new(client);
    let mut changes = publisher.changes(NODE);
    for _ in 0..2 {
        tokio::time::timeout(Duration::from_secs(5), changes.next())
            .await
            .expect("a change")
            .expect("the stream goes on");
    }
    let seen = seen.lock().unwrap().clone();
    assert!(!seen.is_empty());
    for s in &seen {
        assert_eq!(s.path, "/apis/resource.k8s.io/v1/resourceslices");
        assert!(
            s.query
                .contains("fieldSelector=spec.nodeName%3Dnode-a%2Cspec.driver%3Drdma.kroce.io"),
            "{}",
            s.query
        );
    }
    assert!(seen.iter().any(|s| s.query.contains("watch=true")));
}
