//! The DRA half of network attachment against the kubelet stand-in:
//! prepare writes the network-attach request kroce-nri reads (exclusive
//! VFs only, never a shared-HCA slot; the pods from status.reservedFor; the
//! claim's VLAN/MTU/IPAM/MAC/name), unprepare removes it and kroce-nri's
//! result, and a claim that cannot be attached fails with nothing written.
//! No root needed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use k8s_openapi::api::resource::v1::ResourceClaimConsumerReference;
use kroce_contracts::network_attach::{self, AttachRequest};
use kroce_dra::claims::ClaimRef;
use kroce_dra::config::ConfigSource;
use kroce_dra::plugin::Plugin;
use kroce_dra::slice::Sharing;
use kroce_dra::testing::{ConfigEntry, KubeletDraStandIn, PluginRig, driver_config};
use kroce_inventory::config::{Format, parse};
use serde_json::json;
use std::path::PathBuf;
use std::sync::Arc;

const NODE: &str = "node-a";
const VF: &str = "vf-0000-3b-00-2";
const SLOT: &str = "shared-0000-3b-00-0-0";
/// ConnectX-6 Dx PFs (101d) shared in 3 slots, as the device plugin's config says.
const SHARED_PFS: &str = "pools:\n- resourceName: hca\n  mode: shared\n  sharedCount: 3\n  selectors: {devices: [\"101d\"]}\n";

/// The plugin's node writing network-attach requests (and no memlock ones).
fn rig() -> PluginRig {
    let mut rig = PluginRig::new(NODE).unwrap();
    rig.opts.paths.memlock_dir = None;
    rig.opts.paths.network_dir = Some(dir(&rig));
    rig
}

/// The kubelet stand-in and the plugin with the device plugin's shared
/// HCAs, registered.
async fn start(rig: &PluginRig) -> (KubeletDraStandIn, Plugin) {
    let sharing = Sharing::from_config(&parse(SHARED_PFS, Format::Yaml).unwrap());
    rig.registered_with(Arc::new(sharing)).await.unwrap()
}

/// Claim `claim-<uid>` reserved for the pods `pods` (their UIDs).
fn reserved_claim(
    rig: &PluginRig,
    uid: &str,
    pods: &[&str],
    devices: &[(&str, &str)],
    configs: &[ConfigEntry],
) -> ClaimRef {
    rig.claim_edited(&format!("claim-{uid}"), uid, devices, configs, |rc| {
        if let Some(s) = rc.status.as_mut() {
            s.reserved_for = Some(
                pods.iter()
                    .map(|p| ResourceClaimConsumerReference {
                        api_group: None,
                        resource: "pods".into(),
                        name: format!("pod-{p}"),
                        uid: p.to_string(),
                    })
                    .collect(),
            );
        }
    })
}

fn dir(rig: &PluginRig) -> PathBuf {
    rig.root.join("dra-attach")
}

fn request(rig: &PluginRig, uid: &str) -> Option<AttachRequest> {
    let p = network_attach::request_path(&dir(rig), uid).unwrap();
    std::fs::read(p)
        .ok()
        .map(|b| serde_json::from_slice(&b).unwrap())
}

fn files(rig: &PluginRig) -> Vec<PathBuf> {
    rig.files(&["cdi", "devinfo", "dra-attach"])
}

/// From the DeviceClass: a claim may set only what its class allows
/// (`allowClaimOverrides`, tested in `config`), and these tests are about
/// what the fields do, not who may set them.
fn cfg(fields: serde_json::Value) -> ConfigEntry {
    driver_config(ConfigSource::FromClass, fields)
}

#[tokio::test]
async fn prepare_records_the_vf_for_the_pod_and_unprepare_removes_it() {
    let rig = rig();
    let (kubelet, _plugin) = start(&rig).await;
    let uid = "6c1d3e0a-0000-4000-8000-00000000aa01";
    let claim = reserved_claim(
        &rig,
        uid,
        &["pod-uid-1"],
        &[("vf", VF), ("hca", SLOT)],
        // Network settings for the VF's request only (a slot refuses them).
        &[ConfigEntry {
            requests: vec!["vf".into()],
            ..cfg(json!({"vlan": 100, "mtu": 9000, "mac": "02:00:00:00:00:07",
                "interfaceName": "rdma0", "rdmaNetnsMode": "exclusive",
                "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.56.0.0/16"}]]}}))
        }],
    );
    let resp = kubelet.prepare_claim(&claim).await.unwrap();
    assert_eq!(resp.claims[uid].error, "");
    assert_eq!(resp.claims[uid].devices.len(), 2);

    let req = request(&rig, uid).expect("network-attach request");
    assert_eq!(req.pod_uids, ["pod-uid-1"]);
    assert_eq!(
        (req.claim_namespace.as_str(), req.claim_name.as_str()),
        ("default", "claim-6c1d3e0a-0000-4000-8000-00000000aa01")
    );
    // The slot's netdev is the host's and the other holders': not listed.
    let devices: Vec<&str> = req.devices.iter().map(|d| d.device.as_str()).collect();
    assert_eq!(devices, [VF]);
    let d = &req.devices[0];
    assert_eq!(d.pci_address.to_string(), "0000:3b:00.2");
    assert_eq!(d.pool, NODE);
    assert_eq!(d.request, "vf");
    assert!(d.netdev.is_some() && d.rdma_device.is_some(), "{d:?}");
    assert_eq!((d.vlan, d.mtu, d.rdma), (Some(100), Some(9000), Some(true)));
    assert_eq!(
        d.mac.map(|m| m.to_string()).as_deref(),
        Some("02:00:00:00:00:07")
    );
    assert_eq!(d.interface_name.as_deref(), Some("rdma0"));
    assert_eq!(
        d.ipam,
        Some(json!({"type": "host-local", "ranges": [[{"subnet": "10.56.0.0/16"}]]}))
    );

    // kroce-nri's result, then unprepare: both files go.
    let result = network_attach::result_path(&dir(&rig), uid).unwrap();
    std::fs::write(&result, "{}").unwrap();
    let r = kubelet.unprepare_claim(&claim).await.unwrap();
    assert_eq!(r.claims[uid].error, "");
    assert!(request(&rig, uid).is_none());
    assert!(!result.exists());
    assert!(files(&rig).is_empty(), "{:?}", files(&rig));
}

#[tokio::test]
async fn claims_that_cannot_be_attached_write_nothing() {
    let rig = rig();
    let (kubelet, _plugin) = start(&rig).await;

    // No pod in status.reservedFor: whose netns would the VF go to?
    let a = "6c1d3e0a-0000-4000-8000-00000000aa02";
    let claim = reserved_claim(&rig, a, &[], &[("vf", VF)], &[]);
    let resp = kubelet.prepare_claim(&claim).await.unwrap();
    let e = &resp.claims[a].error;
    assert!(
        e.contains("reservedFor names no pod") && e.contains(VF),
        "{e}"
    );
    assert!(files(&rig).is_empty(), "{:?}", files(&rig));

    // One interface name for two VFs.
    let b = "6c1d3e0a-0000-4000-8000-00000000aa03";
    let claim = reserved_claim(
        &rig,
        b,
        &["p"],
        &[("vf", VF), ("vf", "vf-0000-3b-00-3")],
        &[cfg(json!({"interfaceName": "rdma0"}))],
    );
    let resp = kubelet.prepare_claim(&claim).await.unwrap();
    let e = &resp.claims[b].error;
    assert!(
        e.contains("interfaceName \"rdma0\" is set for 2 devices"),
        "{e}"
    );
    assert!(files(&rig).is_empty(), "{:?}", files(&rig));

    // A shared slot alone, or a VF with attach: false: prepared, no request.
    let c = "6c1d3e0a-0000-4000-8000-00000000aa04";
    let claim = reserved_claim(&rig, c, &[], &[("hca", SLOT)], &[]);
    let resp = kubelet.prepare_claim(&claim).await.unwrap();
    assert_eq!(resp.claims[c].error, "");
    assert!(request(&rig, c).is_none());
    let d = "6c1d3e0a-0000-4000-8000-00000000aa05";
    let claim = reserved_claim(
        &rig,
        d,
        &["p"],
        &[("vf", VF)],
        &[cfg(json!({"attach": false}))],
    );
    let resp = kubelet.prepare_claim(&claim).await.unwrap();
    assert_eq!(resp.claims[d].error, "");
    assert!(request(&rig, d).is_none());
}
