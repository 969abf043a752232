//! The kubelet's device health stream (issue 24 item 3) and the device
//! nodes' modes in the CDI specs (item 5), through the sockets.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use kroce_dra::api::health::dra_resource_health_client::DraResourceHealthClient;
use kroce_dra::api::health::{HealthStatus, NodeWatchResourcesRequest, NodeWatchResourcesResponse};
use kroce_dra::config::ConfigSource;
use kroce_dra::driver;
use kroce_dra::testing::{PluginRig, driver_config};
use kroce_kubelet_uds::uds;
use serde_json::{Value, json};
use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

const NODE: &str = "node-a";

fn unhealthy(r: &NodeWatchResourcesResponse) -> Vec<String> {
    r.devices
        .iter()
        .filter(|d| d.health == HealthStatus::Unhealthy as i32)
        .map(|d| d.device.as_ref().unwrap().device_name.clone())
        .collect()
}

#[tokio::test]
async fn health_stream_reports_every_device_and_a_vf_losing_its_link() {
    let rig = PluginRig::new(NODE).unwrap();
    let plugin = rig.plugin().await.unwrap();
    let ch = uds::connect(&driver::service_socket(&rig.opts.kubelet_dir))
        .await
        .unwrap();
    let mut stream = DraResourceHealthClient::new(ch)
        .node_watch_resources(NodeWatchResourcesRequest {})
        .await
        .expect("NodeWatchResources is served")
        .into_inner();
    let first = tokio::time::timeout(Duration::from_secs(5), stream.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(first.devices.len(), 16, "{first:?}");
    for d in &first.devices {
        let id = d.device.as_ref().unwrap();
        assert_eq!(id.pool_name, NODE);
        assert_eq!(d.health, HealthStatus::Healthy as i32, "{d:?}");
        assert!(d.last_updated_time > 1_700_000_000);
    }

    // A VF's link goes down: the next rescan taints it, the stream says so.
    let start = Instant::now();
    rig.fx.set_operstate("ens1f0v1", "down").unwrap();
    let bad = loop {
        let m = tokio::time::timeout(Duration::from_secs(5), stream.message())
            .await
            .expect("a health update within 5 s")
            .unwrap()
            .unwrap();
        let u = unhealthy(&m);
        if !u.is_empty() {
            break u;
        }
    };
    println!("UNHEALTHY after {:?}: {bad:?}", start.elapsed());
    assert_eq!(bad.len(), 1);
    // The same device the slice taints.
    let slice_dev = rig.publisher.slices(NODE)[0]
        .spec
        .devices
        .iter()
        .flatten()
        .filter(|d| d.taints.is_some())
        .map(|d| d.name.clone())
        .collect::<Vec<_>>();
    assert_eq!(bad, slice_dev);

    rig.fx.set_operstate("ens1f0v1", "up").unwrap();
    loop {
        let m = tokio::time::timeout(Duration::from_secs(5), stream.message())
            .await
            .expect("recovery within 5 s")
            .unwrap()
            .unwrap();
        if unhealthy(&m).is_empty() {
            break;
        }
    }
    plugin.stop().await;
}

#[tokio::test]
async fn cdi_device_nodes_keep_the_host_nodes_mode() {
    let rig = PluginRig::new(NODE).unwrap();
    let (kubelet, plugin) = rig.registered().await.unwrap();
    // Fixture nodes: umad 0600 as on a real host, the others 0666.
    let dev = rig.fx.root().dev_infiniband();
    for e in std::fs::read_dir(&dev).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        let mode = if name.starts_with("umad") {
            0o600
        } else {
            0o666
        };
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    let uid = "6c1d3e0a-0000-4000-8000-0000000000c1";
    let claim = rig.claim(
        "modes",
        uid,
        &[("vf", "vf-0000-3b-00-2")],
        &[driver_config(ConfigSource::FromClass, json!({"mtu": 9000}))],
    );
    let r = kubelet.prepare_claim(&claim).await.unwrap();
    assert_eq!(r.claims[uid].error, "");
    let cdi = rig
        .opts
        .paths
        .cdi_dir
        .join(format!("rdma.kroce.io-claim_{uid}.json"));
    let spec: Value = serde_json::from_slice(&std::fs::read(&cdi).unwrap()).unwrap();
    let nodes = spec["devices"][0]["containerEdits"]["deviceNodes"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(nodes.len(), 3, "{nodes:?}");
    let me = std::fs::metadata(&dev).unwrap();
    for n in &nodes {
        let path = n["path"].as_str().unwrap();
        let want = if path.contains("umad") { 0o600 } else { 0o666 };
        assert_eq!(n["fileMode"], json!(want), "{n}");
        assert_eq!(
            n["uid"],
            json!(std::os::unix::fs::MetadataExt::uid(&me)),
            "{n}"
        );
        assert_eq!(n["gid"], json!(std::os::unix::fs::MetadataExt::gid(&me)));
    }
    plugin.stop().await;
}
