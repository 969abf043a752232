//! End to end in-process: fixture host, kubelet stand-in on unix sockets in a
//! temp dir, the plugin as a task. No root needed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{Harness, SEEN_WITHIN, VF, VF_CONFIG, files_in};
use kroce_device_plugin::api;
use kroce_device_plugin::testing::health_of;
use sriov_helpers::PciAddress;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::time::{Duration, Instant};

const PF0: PciAddress = PciAddress::new(0, 0x3b, 0, 0);

async fn ready(h: &Harness, resource: &str, count: usize) -> Vec<api::Device> {
    h.kubelet()
        .wait_registered(resource, 1, SEEN_WITHIN)
        .await
        .unwrap();
    h.kubelet()
        .wait_devices(resource, SEEN_WITHIN, "initial list", |d| d.len() == count)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registers_and_lists_with_topology_and_tight_socket() {
    let h = Harness::start(VF_CONFIG, false).await;
    let devices = ready(&h, VF, 16).await;
    let reg = &h.kubelet().registrations()[0];
    assert_eq!(reg.version, "v1beta1");
    assert_eq!(reg.endpoint, "kroce-rdma_vf.sock");
    assert_eq!(reg.resource_name, "rdma/vf");
    assert_eq!(
        reg.options
            .as_ref()
            .map(|o| o.get_preferred_allocation_available),
        Some(true)
    );
    let p = h.kubelet().plugin(VF).unwrap();
    assert!(p.options.unwrap().get_preferred_allocation_available);
    assert!(devices.iter().all(|d| d.health == "Healthy"));
    let numa_of = |id: &str| {
        devices
            .iter()
            .find(|d| d.id == id)
            .unwrap()
            .topology
            .as_ref()
            .unwrap()
            .nodes[0]
            .id
    };
    assert_eq!(numa_of("0000:3b:00.2"), 0);
    assert_eq!(numa_of("0000:86:01.1"), 1);
    // The PFs have VFs enabled: not in an exclusive pool.
    assert!(!devices.iter().any(|d| d.id == "0000:3b:00.0"));
    let sock = h.kubelet_dir().join("kroce-rdma_vf.sock");
    let meta = std::fs::metadata(&sock).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_follows_netdev_and_char_devices() {
    let h = Harness::start(VF_CONFIG, false).await;
    ready(&h, VF, 16).await;
    let k = h.kubelet();
    let vf1 = "0000:3b:00.3"; // ens1f0v1
    let health = |want: &'static str, id: &'static str| {
        move |d: &[api::Device]| health_of(d, id) == Some(want)
    };

    h.fx.set_operstate("ens1f0v1", "down").unwrap();
    let t = Instant::now();
    let d = k
        .wait_devices(VF, SEEN_WITHIN, "VF down", health("Unhealthy", vf1))
        .await
        .unwrap();
    eprintln!("link down seen after {:?}", t.elapsed());
    assert_eq!(health_of(&d, "0000:3b:00.2"), Some("Healthy"));
    h.fx.set_operstate("ens1f0v1", "up").unwrap();
    k.wait_devices(VF, SEEN_WITHIN, "VF up", health("Healthy", vf1))
        .await
        .unwrap();

    // An admin-down VF (nobody configured it yet) is not a fault.
    let flags = h.fx.path().join("sys/class/net/ens1f0v1/flags");
    std::fs::write(&flags, "0x1002\n").unwrap();
    h.fx.set_operstate("ens1f0v1", "down").unwrap();
    tokio::time::sleep(common::RESCAN * 3).await;
    let d = k.plugin(VF).unwrap().devices.unwrap();
    assert_eq!(health_of(&d, vf1), Some("Healthy"));
    std::fs::write(&flags, "0x1003\n").unwrap();
    k.wait_devices(
        VF,
        SEEN_WITHIN,
        "admin up, link down",
        health("Unhealthy", vf1),
    )
    .await
    .unwrap();
    h.fx.set_operstate("ens1f0v1", "up").unwrap();
    k.wait_devices(VF, SEEN_WITHIN, "VF up again", health("Healthy", vf1))
        .await
        .unwrap();

    // A char device vanishing from /dev (inotify on dev/infiniband).
    let uverbs = h.uverbs_of("ens1f0v1");
    h.fx.remove_char_device(&uverbs).unwrap();
    k.wait_devices(VF, SEEN_WITHIN, "uverbs gone", health("Unhealthy", vf1))
        .await
        .unwrap();
    h.fx.restore_char_device(&uverbs).unwrap();
    k.wait_devices(VF, SEEN_WITHIN, "uverbs back", health("Healthy", vf1))
        .await
        .unwrap();

    // The netdev disappearing from the host (not handed out by us).
    h.fx.remove_netdev("ens2f0v0").unwrap();
    k.wait_devices(
        VF,
        SEEN_WITHIN,
        "netdev gone",
        health("Unhealthy", "0000:86:00.2"),
    )
    .await
    .unwrap();
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preferred_allocation_packs_numa_then_pf() {
    let h = Harness::start(VF_CONFIG, false).await;
    let devices = ready(&h, VF, 16).await;
    let mut client = h.kubelet().client(VF).unwrap();
    let all: Vec<String> = devices.iter().map(|d| d.id.clone()).collect();
    let req = |avail: Vec<String>, must: Vec<String>, size: i32| api::PreferredAllocationRequest {
        container_requests: vec![api::ContainerPreferredAllocationRequest {
            available_device_i_ds: avail,
            must_include_device_i_ds: must,
            allocation_size: size,
        }],
    };
    let got = client
        .get_preferred_allocation(req(all.clone(), vec![], 3))
        .await
        .unwrap()
        .into_inner();
    let ids = &got.container_responses[0].device_i_ds;
    assert_eq!(ids, &["0000:3b:00.2", "0000:3b:00.3", "0000:3b:00.4"]);
    // A must-include on NUMA 1 pulls the rest there.
    let got = client
        .get_preferred_allocation(req(all.clone(), vec!["0000:86:01.1".into()], 2))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        got.container_responses[0].device_i_ds,
        ["0000:86:00.2", "0000:86:01.1"]
    );
    // Two devices left on NUMA 0, four on NUMA 1: four must come from NUMA 1.
    let avail: Vec<String> = [
        "0000:3b:00.2",
        "0000:3b:00.3",
        "0000:86:00.4",
        "0000:86:00.5",
        "0000:86:00.6",
        "0000:86:00.7",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let got = client
        .get_preferred_allocation(req(avail, vec![], 4))
        .await
        .unwrap()
        .into_inner();
    assert!(
        got.container_responses[0]
            .device_i_ds
            .iter()
            .all(|id| id.starts_with("0000:86:"))
    );
    let err = client
        .get_preferred_allocation(req(all, vec!["0000:99:00.1".into()], 1))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("0000:99:00.1"), "{}", err.message());
    h.shutdown().await;
}

fn alloc_req(ids: &[&str]) -> api::AllocateRequest {
    api::AllocateRequest {
        container_requests: vec![api::ContainerAllocateRequest {
            devices_ids: ids.iter().map(|s| s.to_string()).collect(),
        }],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocate_device_specs_env_annotations_and_device_info() {
    let mut h = Harness::start(VF_CONFIG, false).await;
    ready(&h, VF, 16).await;
    let mut client = h.kubelet().client(VF).unwrap();
    let resp = client
        .allocate(alloc_req(&["0000:3b:00.2", "0000:3b:00.3"]))
        .await
        .unwrap()
        .into_inner();
    let c = &resp.container_responses[0];
    let u0 = h.uverbs_of("ens1f0v0");
    let u1 = h.uverbs_of("ens1f0v1");
    let paths: Vec<&str> = c
        .devices
        .iter()
        .map(|d| d.container_path.as_str())
        .collect();
    for want in [u0.as_str(), u1.as_str(), "rdma_cm"] {
        let p = format!("/dev/infiniband/{want}");
        assert_eq!(
            paths.iter().filter(|x| **x == p).count(),
            1,
            "{p} in {paths:?}"
        );
    }
    assert!(c.devices.iter().all(|d| d.permissions == "rw"));
    assert_eq!(c.envs["PCIDEVICE_RDMA_VF"], "0000:3b:00.2,0000:3b:00.3");
    let info: serde_json::Value = serde_json::from_str(&c.envs["PCIDEVICE_RDMA_VF_INFO"]).unwrap();
    assert_eq!(info["0000:3b:00.3"]["netdev"], "ens1f0v1");
    assert_eq!(
        c.annotations["kroce.io/rdma-devices.rdma_vf"],
        "0000:3b:00.2,0000:3b:00.3"
    );
    assert_eq!(c.annotations["kroce.io/memlock.rdma_vf"], "unlimited");
    assert!(c.cdi_devices.is_empty());
    let file = h.devinfo_dir().join("rdma-vf-0000:3b:00.2-device.json");
    let di: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(di["type"], "pci");
    assert_eq!(di["version"], "1.1.0");
    assert_eq!(di["pci"]["pci-address"], "0000:3b:00.2");
    assert_eq!(di["pci"]["pf-pci-address"], "0000:3b:00.0");
    assert!(
        di["pci"]["rdma-device"]
            .as_str()
            .unwrap()
            .starts_with("mlx5_")
    );
    let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o644);
    // Stopping the plugin removes what it wrote for devices no pod holds
    // (no pod was ever listed; past the grace the kubelet's word counts).
    tokio::time::sleep(common::GRACE).await;
    h.stop_plugin().await.unwrap();
    assert!(
        files_in(&h.devinfo_dir()).is_empty(),
        "{:?}",
        files_in(&h.devinfo_dir())
    );
    assert_eq!(files_in(&h.kubelet_dir()), ["kubelet.sock"]);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocate_in_cdi_mode() {
    let mut h = Harness::start(VF_CONFIG, true).await;
    ready(&h, VF, 16).await;
    let spec_path = h.cdi_dir().join("kroce.io-rdma_vf.json");
    let spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&spec_path).unwrap()).unwrap();
    assert_eq!(spec["kind"], "kroce.io/rdma_vf");
    assert_eq!(spec["cdiVersion"], "0.6.0");
    assert_eq!(spec["devices"].as_array().unwrap().len(), 16);
    let mut client = h.kubelet().client(VF).unwrap();
    let resp = client
        .allocate(alloc_req(&["0000:86:00.2"]))
        .await
        .unwrap()
        .into_inner();
    let c = &resp.container_responses[0];
    assert!(c.devices.is_empty());
    let names: Vec<&str> = c.cdi_devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["kroce.io/rdma_vf=0000-86-00.2"]);
    let dev = spec["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "0000-86-00.2")
        .unwrap();
    let nodes = dev["containerEdits"]["deviceNodes"].as_array().unwrap();
    assert!(nodes.iter().any(|n| n["path"] == "/dev/infiniband/rdma_cm"));
    assert_eq!(c.envs["PCIDEVICE_RDMA_VF"], "0000:86:00.2");
    // A VF removed later leaves the spec too.
    h.fx.set_num_vfs(&PF0, 7).unwrap();
    h.kubelet()
        .wait_devices(VF, SEEN_WITHIN, "15 VFs", |d| d.len() == 15)
        .await
        .unwrap();
    let spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&spec_path).unwrap()).unwrap();
    assert_eq!(spec["devices"].as_array().unwrap().len(), 15);
    // Removed behind the plugin's back (an old plugin pod cleaning up): rewritten.
    std::fs::remove_file(&spec_path).unwrap();
    h.kubelet()
        .wait_for(SEEN_WITHIN, "CDI spec rewritten", |_| {
            spec_path.exists().then_some(())
        })
        .await
        .unwrap();
    // No pod holds any device: the spec goes when the plugin stops.
    tokio::time::sleep(common::GRACE).await;
    h.stop_plugin().await.unwrap();
    assert!(!spec_path.exists());
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_or_unhealthy_device_is_invalid_argument() {
    let h = Harness::start(VF_CONFIG, false).await;
    ready(&h, VF, 16).await;
    let mut client = h.kubelet().client(VF).unwrap();
    let err = client
        .allocate(alloc_req(&["0000:3b:00.2", "0000:ff:00.1"]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(
        err.message().contains("\"0000:ff:00.1\""),
        "{}",
        err.message()
    );
    // Nothing was written for the valid half of the request.
    assert!(files_in(&h.devinfo_dir()).is_empty());
    h.fx.set_operstate("ens2f0v3", "down").unwrap();
    h.kubelet()
        .wait_devices(VF, SEEN_WITHIN, "VF down", |d| {
            health_of(d, "0000:86:00.5") == Some("Unhealthy")
        })
        .await
        .unwrap();
    let err = client
        .allocate(alloc_req(&["0000:86:00.5"]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(
        err.message().contains("0000:86:00.5") && err.message().contains("ens2f0v3 is down"),
        "{}",
        err.message()
    );
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_restart_reregisters_within_a_second() {
    let mut h = Harness::start(VF_CONFIG, false).await;
    ready(&h, VF, 16).await;
    // Make the list differ from what a fresh stream would start with only in
    // being the current one: a VF goes down before the restart.
    h.fx.set_operstate("ens1f0v0", "down").unwrap();
    h.kubelet()
        .wait_devices(VF, SEEN_WITHIN, "VF down", |d| {
            health_of(d, "0000:3b:00.2") == Some("Unhealthy")
        })
        .await
        .unwrap();
    let t = Instant::now();
    h.kubelet.as_mut().unwrap().restart().await.unwrap();
    h.kubelet()
        .wait_registered(VF, 2, Duration::from_secs(1))
        .await
        .unwrap();
    let took = t.elapsed();
    eprintln!("re-registered {took:?} after the socket was deleted");
    assert!(took < Duration::from_secs(1), "{took:?}");
    // The new stream starts with the full, current list.
    let d = h
        .kubelet()
        .wait_devices(VF, SEEN_WITHIN, "list after restart", |d| d.len() == 16)
        .await
        .unwrap();
    assert_eq!(health_of(&d, "0000:3b:00.2"), Some("Unhealthy"));
    assert!(h.kubelet_dir().join("kroce-rdma_vf.sock").exists());

    // A kubelet that only re-creates kubelet.sock is noticed too.
    h.kubelet
        .as_mut()
        .unwrap()
        .restart_keeping_plugin_sockets()
        .await
        .unwrap();
    h.kubelet()
        .wait_registered(VF, 3, Duration::from_secs(1))
        .await
        .unwrap();
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_not_up_yet_is_retried() {
    let mut h = Harness::prepare(VF_CONFIG, false);
    h.start_plugin();
    // The plugin serves and waits; it must not exit.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(h.kubelet_dir().join("kroce-rdma_vf.sock").exists());
    h.start_kubelet().await;
    let t = Instant::now();
    ready(&h, VF, 16).await;
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_reload_good_then_bad() {
    let h = Harness::start(VF_CONFIG, false).await;
    ready(&h, VF, 16).await;
    // Narrow the VF pool to NUMA 0 and add a shared HCA pool.
    h.write_config(
        "pools:
- resourceName: vf
  selectors: {devices: [\"101e\"], numaNodes: [0]}
- resourceName: hca
  mode: shared
  sharedCount: 2
  selectors: {devices: [\"101d\"]}
",
    );
    h.kubelet()
        .wait_devices(VF, SEEN_WITHIN, "narrowed pool", |d| d.len() == 8)
        .await
        .unwrap();
    let hca = ready(&h, "rdma/hca", 4).await;
    assert_eq!(hca[0].id, "0000:3b:00.0-0");
    // Allocate from the shared pool: the HCA's char devices, memlock absent.
    let mut client = h.kubelet().client("rdma/hca").unwrap();
    let resp = client
        .allocate(alloc_req(&["0000:86:00.0-1"]))
        .await
        .unwrap()
        .into_inner();
    let c = &resp.container_responses[0];
    assert_eq!(c.devices.len(), 3);
    assert!(!c.annotations.contains_key("kroce.io/memlock.rdma_hca"));
    assert_eq!(
        c.annotations["kroce.io/rdma-devices.rdma_hca"],
        "0000:86:00.0-1"
    );

    // A bad config is rejected: nothing changes, both pools keep serving.
    h.write_config("pools:\n- resourceName: vf\n  selectors: {pfNames: [\"ens1f0#5-2\"]}\n");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let k = h.kubelet();
    assert_eq!(k.plugin(VF).unwrap().devices.unwrap().len(), 8);
    assert!(!k.plugin("rdma/hca").unwrap().stream_ended);
    assert_eq!(k.registrations().len(), 2);
    assert!(h.kubelet_dir().join("kroce-rdma_hca.sock").exists());

    // A good one after the bad one is taken; the removed pool stops serving.
    h.write_config(VF_CONFIG);
    k.wait_devices(VF, SEEN_WITHIN, "back to 16", |d| d.len() == 16)
        .await
        .unwrap();
    k.wait_for(SEEN_WITHIN, "hca socket removed", |_| {
        (!h.kubelet_dir().join("kroce-rdma_hca.sock").exists()).then_some(())
    })
    .await
    .unwrap();
    k.wait_for(SEEN_WITHIN, "hca stream ended", |k| {
        k.plugin("rdma/hca").filter(|p| p.stream_ended).map(|_| ())
    })
    .await
    .unwrap();
    assert!(
        !files_in(&h.devinfo_dir())
            .iter()
            .any(|f| f.starts_with("rdma-hca-")),
        "{:?}",
        files_in(&h.devinfo_dir())
    );
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vf_count_change_is_picked_up_live() {
    let mut h = Harness::start(VF_CONFIG, false).await;
    ready(&h, VF, 16).await;
    h.fx.set_num_vfs(&PF0, 2).unwrap();
    let d = h
        .kubelet()
        .wait_devices(VF, SEEN_WITHIN, "10 VFs", |d| d.len() == 10)
        .await
        .unwrap();
    assert!(d.iter().any(|x| x.id == "0000:3b:00.3"));
    assert!(!d.iter().any(|x| x.id == "0000:3b:00.4"));
    h.fx.set_num_vfs(&PF0, 8).unwrap();
    h.kubelet()
        .wait_devices(VF, SEEN_WITHIN, "16 VFs", |d| {
            d.len() == 16 && d.iter().all(|x| x.health == "Healthy")
        })
        .await
        .unwrap();
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handed_out_vf_may_leave_the_host_namespace() {
    let mut h = Harness::start(VF_CONFIG, false).await;
    ready(&h, VF, 16).await;
    let mut client = h.kubelet().client(VF).unwrap();
    h.pods().run_pod("p", VF, &["0000:3b:00.2"]);
    client.allocate(alloc_req(&["0000:3b:00.2"])).await.unwrap();
    // The CNI moves the VF netdev into the pod: still healthy.
    h.fx.remove_netdev("ens1f0v0").unwrap();
    h.fx.remove_netdev("ens1f0v1").unwrap();
    let d = h
        .kubelet()
        .wait_devices(VF, SEEN_WITHIN, "other VF unhealthy", |d| {
            health_of(d, "0000:3b:00.3") == Some("Unhealthy")
        })
        .await
        .unwrap();
    assert_eq!(health_of(&d, "0000:3b:00.2"), Some("Healthy"));
    // Past the grace it is the kubelet's listing that keeps it healthy.
    tokio::time::sleep(common::GRACE * 3).await;
    let d = h.kubelet().plugin(VF).unwrap().devices.unwrap();
    assert_eq!(health_of(&d, "0000:3b:00.2"), Some("Healthy"));

    // PodResources unreachable: the kubelet's checkpoint is read instead.
    h.pod_resources.as_mut().unwrap().stop().await;
    std::fs::write(
        h.kubelet_dir().join("kubelet_internal_checkpoint"),
        r#"{"Data":{"PodDeviceEntries":[{"PodUID":"p","ContainerName":"c",
            "ResourceName":"rdma/vf","DeviceIDs":{"1":["0000:86:00.2"]},"AllocResp":""}],
            "RegisteredDevices":{}},"Checksum":0}"#,
    )
    .unwrap();
    h.fx.remove_netdev("ens2f0v0").unwrap();
    h.fx.remove_netdev("ens2f0v1").unwrap();
    let d = h
        .kubelet()
        .wait_devices(VF, SEEN_WITHIN, "ens2f0v1's VF unhealthy", |d| {
            health_of(d, "0000:86:00.3") == Some("Unhealthy")
        })
        .await
        .unwrap();
    assert_eq!(health_of(&d, "0000:86:00.2"), Some("Healthy"));
    // The checkpoint does not list the first VF: free, and its netdev is gone.
    assert_eq!(health_of(&d, "0000:3b:00.2"), Some("Unhealthy"));
    h.shutdown().await;
}

/// The checkpoint the kubelet keeps: it still lists a deleted pod's devices.
fn write_stale_checkpoint(h: &Harness, ids: &[&str]) {
    let ids: Vec<String> = ids.iter().map(|i| format!("{i:?}")).collect();
    std::fs::write(
        h.kubelet_dir().join("kubelet_internal_checkpoint"),
        format!(
            r#"{{"Data":{{"PodDeviceEntries":[{{"PodUID":"q","ContainerName":"c",
            "ResourceName":"rdma/vf","DeviceIDs":{{"0":[{}]}},"AllocResp":""}}],
            "RegisteredDevices":{{}}}},"Checksum":0}}"#,
            ids.join(",")
        ),
    )
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_pods_devices_stop_counting_as_in_use() {
    let h = Harness::start(VF_CONFIG, false).await;
    ready(&h, VF, 16).await;
    let mut client = h.kubelet().client(VF).unwrap();
    let (a, b) = ("0000:3b:00.2", "0000:3b:00.3");
    h.pods().run_pod("pa", VF, &[a]);
    h.pods().run_pod("pb", VF, &[b]);
    client.allocate(alloc_req(&[a])).await.unwrap();
    client.allocate(alloc_req(&[b])).await.unwrap();
    write_stale_checkpoint(&h, &[a, b]);
    // Both netdevs move into their pods.
    h.fx.remove_netdev("ens1f0v0").unwrap();
    h.fx.remove_netdev("ens1f0v1").unwrap();
    tokio::time::sleep(common::GRACE * 3).await;
    let d = h.kubelet().plugin(VF).unwrap().devices.unwrap();
    assert_eq!(health_of(&d, a), Some("Healthy"));
    assert_eq!(health_of(&d, b), Some("Healthy"));
    let file = |id: &str| h.devinfo_dir().join(format!("rdma-vf-{id}-device.json"));
    assert!(file(a).exists() && file(b).exists());
    // Pod b is deleted; its VF's netdev does not come back (on hardware:
    // a VF the driver lost). PodResources no longer lists it, the
    // checkpoint still does: it is free now, and broken.
    h.pods().delete_pod("pb");
    let t = Instant::now();
    let d = h
        .kubelet()
        .wait_devices(VF, SEEN_WITHIN, "deleted pod's VF unhealthy", |d| {
            health_of(d, b) == Some("Unhealthy")
        })
        .await
        .unwrap();
    eprintln!("released VF unhealthy after {:?}", t.elapsed());
    assert_eq!(health_of(&d, a), Some("Healthy"));
    // Its device-info file goes; the running pod's stays.
    h.kubelet()
        .wait_for(SEEN_WITHIN, "released device-info removed", |_| {
            (!file(b).exists()).then_some(())
        })
        .await
        .unwrap();
    assert!(file(a).exists());
    h.shutdown().await;
}

/// Issue 24: the device-info file of a device a deleted pod held goes
/// within the plugin's own PodResources poll, not at the next safety
/// rescan (30 s) when no kernel event happens to come; what pods hold
/// changes nothing else while it stays the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn released_device_info_goes_at_the_next_pod_resources_poll() {
    use std::sync::atomic::Ordering::Relaxed;
    let mut h = Harness::prepare(VF_CONFIG, false);
    // Only the poll can meet the bound: the safety tick is the default.
    h.rescan = kroce_device_plugin::plugin::DEFAULT_RESCAN;
    h.start_kubelet().await;
    h.start_plugin();
    ready(&h, VF, 16).await;
    let mut client = h.kubelet().client(VF).unwrap();
    let vf = "0000:3b:00.2";
    h.pods().run_pod("pa", VF, &[vf]);
    client.allocate(alloc_req(&[vf])).await.unwrap();
    let file = h.devinfo_dir().join(format!("rdma-vf-{vf}-device.json"));
    assert!(file.exists());
    // Held past the allocation grace: kept, and polls alone rescan nothing.
    tokio::time::sleep(common::GRACE * 4).await;
    assert!(file.exists());
    let (polls, scans) = (h.counters.in_use_polls.load(Relaxed), h.counters.scans());
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(h.counters.in_use_polls.load(Relaxed) >= polls + 2);
    assert_eq!(
        h.counters.scans(),
        scans,
        "polls that saw no change rescanned"
    );
    assert!(file.exists());
    h.pods().delete_pod("pa");
    let t = Instant::now();
    h.kubelet()
        .wait_for(SEEN_WITHIN, "released device-info removed", |_| {
            (!file.exists()).then_some(())
        })
        .await
        .unwrap();
    eprintln!("released device-info removed after {:?}", t.elapsed());
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn free_vf_whose_netdev_vanishes_goes_unhealthy_without_restart() {
    let h = Harness::start(VF_CONFIG, false).await;
    ready(&h, VF, 16).await;
    let mut client = h.kubelet().client(VF).unwrap();
    let vf = "0000:86:00.2"; // ens2f0v0
    // A pod gets the VF and is deleted before its netdev ever moved (e.g.
    // its sandbox failed).
    h.pods().run_pod("p", VF, &[vf]);
    client.allocate(alloc_req(&[vf])).await.unwrap();
    tokio::time::sleep(common::GRACE * 2).await;
    h.pods().delete_pod("p");
    tokio::time::sleep(common::RESCAN * 2).await;
    // Then the free VF's netdev vanishes from the host.
    h.fx.remove_netdev("ens2f0v0").unwrap();
    let d = h
        .kubelet()
        .wait_devices(VF, SEEN_WITHIN, "free VF without netdev unhealthy", |d| {
            health_of(d, vf) == Some("Unhealthy")
        })
        .await
        .unwrap();
    assert_eq!(d.len(), 16);
    let err = client.allocate(alloc_req(&[vf])).await.unwrap_err();
    assert!(
        err.message().contains("ens2f0v0 is gone"),
        "{}",
        err.message()
    );
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_devices_keep_cdi_spec_and_device_info_across_restart() {
    let mut h = Harness::start(VF_CONFIG, true).await;
    ready(&h, VF, 16).await;
    let mut client = h.kubelet().client(VF).unwrap();
    let (held, released) = ("0000:3b:00.2", "0000:86:00.2");
    h.pods().run_pod("p", VF, &[held]);
    h.pods().run_pod("q", VF, &[released]);
    client.allocate(alloc_req(&[held])).await.unwrap();
    client.allocate(alloc_req(&[released])).await.unwrap();
    tokio::time::sleep(common::GRACE).await;
    h.pods().delete_pod("q");
    let devinfo_dir = h.devinfo_dir();
    let file = |id: &str| devinfo_dir.join(format!("rdma-vf-{id}-device.json"));
    let spec_path = h.cdi_dir().join("kroce.io-rdma_vf.json");
    let spec_names = || -> Vec<String> {
        let spec: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&spec_path).unwrap()).unwrap();
        spec["devices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["name"].as_str().unwrap().to_string())
            .collect()
    };
    // SIGTERM: the running pod's files stay, the deleted pod's go.
    h.stop_plugin().await.unwrap();
    assert!(file(held).exists(), "{:?}", files_in(&h.devinfo_dir()));
    assert!(!file(released).exists(), "{:?}", files_in(&h.devinfo_dir()));
    assert!(spec_names().contains(&"0000-3b-00.2".to_string()));
    // An older plugin removed the held device's device-info on its way out:
    // the new one writes it again without an Allocate.
    std::fs::remove_file(file(held)).unwrap();
    h.start_plugin();
    h.kubelet()
        .wait_registered(VF, 2, SEEN_WITHIN)
        .await
        .unwrap();
    h.kubelet()
        .wait_for(SEEN_WITHIN, "held device-info re-written", |_| {
            file(held).exists().then_some(())
        })
        .await
        .unwrap();
    let di: serde_json::Value =
        serde_json::from_slice(&std::fs::read(file(held)).unwrap()).unwrap();
    assert_eq!(di["pci"]["pci-address"], held);
    assert!(spec_names().contains(&"0000-3b-00.2".to_string()));
    // The pod goes: after the next stop nothing of kroce's is left.
    h.pods().delete_pod("p");
    h.kubelet()
        .wait_for(
            SEEN_WITHIN,
            "device-info of the deleted pod removed",
            |_| (!file(held).exists()).then_some(()),
        )
        .await
        .unwrap();
    h.stop_plugin().await.unwrap();
    assert!(
        files_in(&h.devinfo_dir()).is_empty(),
        "{:?}",
        files_in(&h.devinfo_dir())
    );
    assert!(!spec_path.exists());
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_removed_when_nobody_can_say_what_pods_hold() {
    let mut h = Harness::start(VF_CONFIG, true).await;
    ready(&h, VF, 16).await;
    let mut client = h.kubelet().client(VF).unwrap();
    client.allocate(alloc_req(&["0000:3b:00.2"])).await.unwrap();
    // No PodResources and no kubelet checkpoint.
    h.pod_resources.as_mut().unwrap().stop().await;
    tokio::time::sleep(common::GRACE * 2).await;
    h.stop_plugin().await.unwrap();
    assert_eq!(
        files_in(&h.devinfo_dir()),
        ["rdma-vf-0000:3b:00.2-device.json"]
    );
    assert_eq!(files_in(&h.cdi_dir()), ["kroce.io-rdma_vf.json"]);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_instance_takes_over_without_a_fight() {
    let h = Harness::start(VF_CONFIG, false).await;
    ready(&h, VF, 16).await;
    // The next plugin pod of a rolling update starts on the same node.
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let second = tokio::spawn(kroce_device_plugin::plugin::run(h.options(), async move {
        let _ = stopped.await;
    }));
    h.kubelet()
        .wait_registered(VF, 2, SEEN_WITHIN)
        .await
        .unwrap();
    // No ping-pong: the first instance leaves the new socket alone.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(h.kubelet().registrations().len(), 2);
    // When the new one goes away, the old one serves again.
    let _ = stop.send(());
    second.await.unwrap().unwrap();
    h.kubelet()
        .wait_registered(VF, 3, SEEN_WITHIN)
        .await
        .unwrap();
    h.kubelet()
        .wait_devices(VF, SEEN_WITHIN, "list from the first instance", |d| {
            d.len() == 16
        })
        .await
        .unwrap();
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_config_waits_for_the_operator_to_write_it() {
    // The chart mounts an optional ConfigMap: before any RdmaNetwork selects
    // this node the directory exists but the node's file does not.
    let mut h = Harness::prepare(VF_CONFIG, false);
    std::fs::remove_dir_all(h.config_dir()).unwrap();
    std::fs::create_dir_all(h.config_dir()).unwrap();
    h.start_kubelet().await;
    h.start_plugin();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        h.kubelet().registrations().is_empty(),
        "no pool may be advertised without a config"
    );
    h.write_config(VF_CONFIG);
    ready(&h, VF, 16).await;
    h.shutdown().await;
}
