//! The DRA half of network attachment against the kubelet stand-in:
//! prepare writes the network-attach request kroce-nri reads (exclusive
//! VFs only, never a shared-HCA slot; the pods from status.reservedFor; the
//! claim's VLAN/MTU/IPAM/MAC/name), unprepare removes it and kroce-nri's
//! result, and a claim that cannot be attached fails with nothing written.
//! No root needed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use k8s_openapi::api::resource::v1::ResourceClaimConsumerReference;
use kroce_contracts::network_attach::{self, AttachRequest};
use kroce_device_plugin::config::{Format, parse};
use kroce_dra::claims::ClaimRef;
use kroce_dra::config::{CONFIG_API_VERSION, CONFIG_KIND, ConfigSource};
use kroce_dra::driver::DRIVER_NAME;
use kroce_dra::plugin::{Options, Plugin};
use kroce_dra::prepare::Paths;
use kroce_dra::slice::Sharing;
use kroce_dra::testing::{
    ConfigEntry, InMemoryClaims, KubeletDraStandIn, RecordingPublisher, allocated_claim,
    scratch_dir,
};
use serde_json::json;
use sriov_helpers::fixture::FixtureHost;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

const NODE: &str = "node-a";
const VF: &str = "vf-0000-3b-00-2";
const SLOT: &str = "shared-0000-3b-00-0-0";
/// ConnectX-6 Dx PFs (101d) shared in 3 slots, as the device plugin's config says.
const SHARED_PFS: &str = "pools:\n- resourceName: hca\n  mode: shared\n  sharedCount: 3\n  selectors: {devices: [\"101d\"]}\n";

struct Rig {
    _dir: tempfile::TempDir,
    root: PathBuf,
    _fx: FixtureHost,
    opts: Options,
    claims: Arc<InMemoryClaims>,
}

impl Rig {
    fn new() -> Rig {
        let dir = scratch_dir("kroce-dra-net-").unwrap();
        let root = dir.path().to_path_buf();
        let mut fx = FixtureHost::at(&root.join("host")).unwrap();
        fx.populate_connectx6dx_pair().unwrap();
        let opts = Options {
            node: NODE.into(),
            kubelet_dir: root.join("kubelet"),
            host_root: fx.root(),
            paths: Paths {
                cdi_dir: root.join("cdi"),
                devinfo_dir: root.join("devinfo"),
                memlock_dir: None,
                network_dir: Some(root.join("dra-attach")),
            },
            state_dir: root.join("state"),
            rescan: Duration::from_millis(100),
        };
        Rig {
            _dir: dir,
            root,
            _fx: fx,
            opts,
            claims: Arc::default(),
        }
    }

    async fn plugin(&self) -> Plugin {
        let sharing = Sharing::from_config(&parse(SHARED_PFS, Format::Yaml).unwrap());
        Plugin::start_with(
            self.opts.clone(),
            Arc::new(sharing),
            self.claims.clone(),
            Arc::new(RecordingPublisher::default()),
        )
        .await
        .unwrap()
    }

    fn claim(
        &self,
        uid: &str,
        pods: &[&str],
        devices: &[(&str, &str)],
        configs: &[ConfigEntry],
    ) -> ClaimRef {
        let c = ClaimRef {
            namespace: "default".into(),
            name: format!("claim-{uid}"),
            uid: uid.into(),
        };
        let mut rc = allocated_claim(&c, DRIVER_NAME, NODE, devices, configs);
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
        self.claims.insert(rc);
        c
    }

    fn dir(&self) -> PathBuf {
        self.root.join("dra-attach")
    }

    fn request(&self, uid: &str) -> Option<AttachRequest> {
        let p = network_attach::request_path(&self.dir(), uid).unwrap();
        std::fs::read(p)
            .ok()
            .map(|b| serde_json::from_slice(&b).unwrap())
    }

    fn files(&self) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for d in ["cdi", "devinfo", "dra-attach"] {
            if let Ok(rd) = std::fs::read_dir(self.root.join(d)) {
                out.extend(rd.flatten().map(|e| e.path()));
            }
        }
        out.sort();
        out
    }
}

fn cfg(extra: serde_json::Value) -> ConfigEntry {
    let mut p = json!({"apiVersion": CONFIG_API_VERSION, "kind": CONFIG_KIND});
    for (k, v) in extra.as_object().unwrap() {
        p[k] = v.clone();
    }
    ConfigEntry {
        source: ConfigSource::FromClaim,
        requests: vec![],
        driver: DRIVER_NAME.into(),
        parameters: p,
    }
}

#[tokio::test]
async fn prepare_records_the_vf_for_the_pod_and_unprepare_removes_it() {
    let rig = Rig::new();
    let kubelet = KubeletDraStandIn::start(&rig.opts.kubelet_dir).unwrap();
    let _plugin = rig.plugin().await;
    kubelet.wait_registered(DRIVER_NAME, 1).await.unwrap();
    let uid = "6c1d3e0a-0000-4000-8000-00000000aa01";
    let claim = rig.claim(
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
    let resp = kubelet
        .prepare(DRIVER_NAME, std::slice::from_ref(&claim))
        .await
        .unwrap();
    assert_eq!(resp.claims[uid].error, "");
    assert_eq!(resp.claims[uid].devices.len(), 2);

    let req = rig.request(uid).expect("network-attach request");
    assert_eq!(req.pod_uids, ["pod-uid-1"]);
    assert_eq!(
        (req.claim_namespace.as_str(), req.claim_name.as_str()),
        ("default", "claim-6c1d3e0a-0000-4000-8000-00000000aa01")
    );
    // The slot's netdev is the host's and the other holders': not listed.
    let devices: Vec<&str> = req.devices.iter().map(|d| d.device.as_str()).collect();
    assert_eq!(devices, [VF]);
    let d = &req.devices[0];
    assert_eq!(d.pci_address, "0000:3b:00.2");
    assert_eq!(d.pool, NODE);
    assert_eq!(d.request, "vf");
    assert!(d.netdev.is_some() && d.rdma_device.is_some(), "{d:?}");
    assert_eq!((d.vlan, d.mtu, d.rdma), (Some(100), Some(9000), Some(true)));
    assert_eq!(d.mac.as_deref(), Some("02:00:00:00:00:07"));
    assert_eq!(d.interface_name.as_deref(), Some("rdma0"));
    assert_eq!(
        d.ipam,
        Some(json!({"type": "host-local", "ranges": [[{"subnet": "10.56.0.0/16"}]]}))
    );

    // kroce-nri's result, then unprepare: both files go.
    let result = network_attach::result_path(&rig.dir(), uid).unwrap();
    std::fs::write(&result, "{}").unwrap();
    let r = kubelet
        .unprepare(DRIVER_NAME, std::slice::from_ref(&claim))
        .await
        .unwrap();
    assert_eq!(r.claims[uid].error, "");
    assert!(rig.request(uid).is_none());
    assert!(!result.exists());
    assert!(rig.files().is_empty(), "{:?}", rig.files());
}

#[tokio::test]
async fn claims_that_cannot_be_attached_write_nothing() {
    let rig = Rig::new();
    let kubelet = KubeletDraStandIn::start(&rig.opts.kubelet_dir).unwrap();
    let _plugin = rig.plugin().await;
    kubelet.wait_registered(DRIVER_NAME, 1).await.unwrap();

    // No pod in status.reservedFor: whose netns would the VF go to?
    let a = "6c1d3e0a-0000-4000-8000-00000000aa02";
    let claim = rig.claim(a, &[], &[("vf", VF)], &[]);
    let resp = kubelet
        .prepare(DRIVER_NAME, std::slice::from_ref(&claim))
        .await
        .unwrap();
    let e = &resp.claims[a].error;
    assert!(
        e.contains("reservedFor names no pod") && e.contains(VF),
        "{e}"
    );
    assert!(rig.files().is_empty(), "{:?}", rig.files());

    // One interface name for two VFs.
    let b = "6c1d3e0a-0000-4000-8000-00000000aa03";
    let claim = rig.claim(
        b,
        &["p"],
        &[("vf", VF), ("vf", "vf-0000-3b-00-3")],
        &[cfg(json!({"interfaceName": "rdma0"}))],
    );
    let resp = kubelet
        .prepare(DRIVER_NAME, std::slice::from_ref(&claim))
        .await
        .unwrap();
    let e = &resp.claims[b].error;
    assert!(
        e.contains("interfaceName \"rdma0\" is set for 2 devices"),
        "{e}"
    );
    assert!(rig.files().is_empty(), "{:?}", rig.files());

    // A shared slot alone, or a VF with attach: false: prepared, no request.
    let c = "6c1d3e0a-0000-4000-8000-00000000aa04";
    let claim = rig.claim(c, &[], &[("hca", SLOT)], &[]);
    let resp = kubelet
        .prepare(DRIVER_NAME, std::slice::from_ref(&claim))
        .await
        .unwrap();
    assert_eq!(resp.claims[c].error, "");
    assert!(rig.request(c).is_none());
    let d = "6c1d3e0a-0000-4000-8000-00000000aa05";
    let claim = rig.claim(d, &["p"], &[("vf", VF)], &[cfg(json!({"attach": false}))]);
    let resp = kubelet
        .prepare(DRIVER_NAME, std::slice::from_ref(&claim))
        .await
        .unwrap();
    assert_eq!(resp.claims[d].error, "");
    assert!(rig.request(d).is_none());
}
