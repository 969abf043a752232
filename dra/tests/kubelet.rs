//! The plugin against the kubelet DRA stand-in: registration through
//! `plugins_registry`, prepare/unprepare over the unix socket, restarts of
//! both sides, faults in the middle of prepare, bad claim configuration.
//! No root needed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use kroce_dra::claims::ClaimRef;
use kroce_dra::config::ConfigSource;
use kroce_dra::driver::{self, DRIVER_NAME};
use kroce_dra::plugin::Plugin;
use kroce_dra::prepare::CdiSpec;
use kroce_dra::testing::{
    ConfigEntry, KubeletDraStandIn, PluginRig, RecordingPublisher, allocated_claim, driver_config,
    rdma_device_nodes,
};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::time::Duration;

const NODE: &str = "node-a";

/// Every file under the output dirs (CDI, devinfo, memlock).
fn outputs(rig: &PluginRig) -> Vec<PathBuf> {
    rig.files(&["cdi", "devinfo", "memlock"])
}

/// The rig, the kubelet stand-in and the plugin, registered.
async fn started() -> (PluginRig, KubeletDraStandIn, Plugin) {
    let rig = PluginRig::new(NODE).unwrap();
    let (kubelet, plugin) = rig.registered().await.unwrap();
    (rig, kubelet, plugin)
}

/// Claim `default/<name>` allocated VF `device` for request `vf`.
fn vf_claim(
    rig: &PluginRig,
    name: &str,
    uid: &str,
    device: &str,
    configs: &[ConfigEntry],
) -> ClaimRef {
    rig.claim(name, uid, &[("vf", device)], configs)
}

async fn registered(kubelet: &KubeletDraStandIn, n: usize) {
    kubelet.wait_registered(DRIVER_NAME, n).await.unwrap();
}

#[tokio::test]
async fn registers_through_plugins_registry_like_the_kubelet() {
    let rig = PluginRig::new(NODE).unwrap();
    let kubelet = KubeletDraStandIn::start(&rig.opts.kubelet_dir).unwrap();
    let plugin = rig.plugin().await.unwrap();
    let r = kubelet.wait_registered(DRIVER_NAME, 1).await.unwrap();
    assert_eq!(r.socket, driver::registration_socket(&rig.opts.kubelet_dir));
    assert_eq!(r.info.r#type, "DRAPlugin");
    assert_eq!(r.info.supported_versions, ["v1.DRAPlugin"]);
    assert_eq!(
        Path::new(&r.info.endpoint),
        rig.opts.kubelet_dir.join("plugins/rdma.kroce.io/dra.sock")
    );
    let mut st = plugin.registration.clone();
    let s = st.wait_for(|s| s.registered).await.unwrap().clone();
    assert_eq!(
        (s.registered, s.error.as_str(), s.notifications),
        (true, "", 1)
    );
    assert!(kubelet.refused().is_empty());
    // Slices went out for the host: 16 VFs in one slice of pool node-a.
    let p = rig.publisher.clone();
    kubelet
        .wait_for(Duration::from_secs(5), "slices", |_| {
            (p.writes() >= 1).then_some(())
        })
        .await
        .unwrap();
    let slices = rig.publisher.slices(NODE);
    assert_eq!(slices.len(), 1);
    assert_eq!(slices[0].spec.devices.as_ref().unwrap().len(), 16);
    plugin.stop().await;
    // Stopping removes both sockets: the kubelet deregisters the driver.
    assert!(!driver::registration_socket(&rig.opts.kubelet_dir).exists());
    assert!(!driver::service_socket(&rig.opts.kubelet_dir).exists());
}

#[tokio::test]
async fn prepare_and_unprepare_are_idempotent() {
    let (rig, kubelet, plugin) = started().await;
    let uid = "6c1d3e0a-0000-4000-8000-000000000001";
    let claim = vf_claim(
        &rig,
        "rdma",
        uid,
        "vf-0000-3b-00-2",
        &[driver_config(
            ConfigSource::FromClass,
            json!({"memlock": "1Gi", "mtu": 9000}),
        )],
    );
    let resp = kubelet.prepare_claim(&claim).await.unwrap();
    let one = &resp.claims[uid];
    assert_eq!(one.error, "");
    assert_eq!(one.devices.len(), 1);
    let d = &one.devices[0];
    assert_eq!(
        (d.pool_name.as_str(), d.device_name.as_str()),
        (NODE, "vf-0000-3b-00-2")
    );
    assert_eq!(d.request_names, ["vf"]);
    assert_eq!(
        d.cdi_device_ids,
        [format!("rdma.kroce.io/claim={uid}-vf-0000-3b-00-2")]
    );

    // The CDI spec: the VF's uverbs and rdma_cm, the env, the right kind.
    let cdi = rig
        .opts
        .paths
        .cdi_dir
        .join(format!("rdma.kroce.io-claim_{uid}.json"));
    let spec: CdiSpec = serde_json::from_slice(&std::fs::read(&cdi).unwrap()).unwrap();
    assert_eq!(spec.kind, "rdma.kroce.io/claim");
    assert_eq!(spec.devices.len(), 1);
    assert_eq!(spec.devices[0].name, format!("{uid}-vf-0000-3b-00-2"));
    let (nodes, rdma) = rdma_device_nodes(&spec.devices[0]);
    assert!(rdma, "uverbs and rdma_cm: {nodes:?}");
    let env = &spec.devices[0].container_edits.env;
    assert!(
        env.contains(&"KROCE_DRA_VF_0000_3B_00_2_PCI_ADDRESS=0000:3b:00.2".to_string()),
        "{env:?}"
    );
    assert!(
        env.iter()
            .any(|e| e
                .starts_with("KROCE_DRA_CLAIM_6C1D3E0A_0000_4000_8000_000000000001=default/rdma")),
        "{env:?}"
    );
    // The device's facts, in the shape the device plugin's INFO env has
    // (`kroce_contracts::device_facts`).
    let info = env
        .iter()
        .find_map(|e| e.strip_prefix("KROCE_DRA_VF_0000_3B_00_2_INFO="))
        .unwrap_or_else(|| panic!("no INFO env: {env:?}"));
    let facts: kroce_contracts::device_facts::DeviceFacts = serde_json::from_str(info).unwrap();
    assert_eq!(facts.pci_address.as_deref(), Some("0000:3b:00.2"));
    assert_eq!(facts.pf_pci_address.as_deref(), Some("0000:3b:00.0"));
    assert!(facts.rdma_device.is_some(), "{info}");
    assert!(
        facts
            .char_devices
            .iter()
            .any(|c| c == "/dev/infiniband/rdma_cm"),
        "{info}"
    );
    // Device-info and the memlock request for kroce-nri.
    let di = rig
        .opts
        .paths
        .devinfo_dir
        .join(format!("rdma.kroce.io-{uid}-vf-0000-3b-00-2-device.json"));
    let di: serde_json::Value = serde_json::from_slice(&std::fs::read(di).unwrap()).unwrap();
    assert_eq!(di["pci"]["pci-address"], "0000:3b:00.2");
    assert_eq!(di["pci"]["pf-pci-address"], "0000:3b:00.0");
    let ml_file = rig
        .opts
        .paths
        .memlock_dir
        .as_ref()
        .unwrap()
        .join(format!("{uid}.json"));
    let ml: serde_json::Value = serde_json::from_slice(&std::fs::read(&ml_file).unwrap()).unwrap();
    assert_eq!(ml["containerID"], uid);
    assert_eq!(ml["memlock"], 1u64 << 30);
    assert_eq!(ml["attachments"]["vf-0000-3b-00-2"]["network"], "vf");
    // What kroce-nri makes of these two files: a container with the CDI
    // env holds the claim, and the request file (where kroce-nri reads it,
    // `<state>/dra-memlock/`) gives it the claim's 1 GiB.
    let nri_state = tempfile::tempdir().unwrap();
    let nri_dir = kroce_contracts::memlock_file::dra_dir(nri_state.path());
    std::fs::create_dir_all(&nri_dir).unwrap();
    std::fs::copy(&ml_file, nri_dir.join(format!("{uid}.json"))).unwrap();
    let container = kroce_nri::proto::api::Container {
        id: "holder".into(),
        env: env.clone(),
        ..Default::default()
    };
    let nri = kroce_nri::handler::Handler::new(
        kroce_nri::Memlock::Unlimited,
        kroce_nri::cni_requests::StateDir::new(nri_state.path()),
    );
    let d = nri.decide(&container, None);
    assert_eq!(d.limit(), Some(kroce_nri::Memlock::Bytes(1 << 30)), "{d:?}");
    let files = outputs(&rig);
    assert_eq!(files.len(), 3, "{files:?}");

    // Again: same answer, no second GET, nothing new on disk.
    let gets = rig.claims.gets();
    let again = kubelet.prepare_claim(&claim).await.unwrap();
    assert_eq!(again.claims[uid], *one);
    assert_eq!(rig.claims.gets(), gets);
    assert_eq!(outputs(&rig), files);

    let un = kubelet.unprepare_claim(&claim).await.unwrap();
    assert_eq!(un.claims[uid].error, "");
    assert!(outputs(&rig).is_empty(), "{:?}", outputs(&rig));
    let un = kubelet.unprepare_claim(&claim).await.unwrap();
    assert_eq!(
        un.claims[uid].error, "",
        "unprepare of a gone claim is fine"
    );
    plugin.stop().await;
}

#[tokio::test]
async fn restart_keeps_prepared_claims_from_the_checkpoint() {
    let (rig, kubelet, plugin) = started().await;
    let uid = "6c1d3e0a-0000-4000-8000-000000000002";
    let claim = rig.claim(
        "two",
        uid,
        &[("a", "vf-0000-3b-00-3"), ("b", "vf-0000-86-00-2")],
        &[],
    );
    let first = kubelet.prepare_claim(&claim).await.unwrap();
    assert_eq!(first.claims[uid].error, "");
    assert_eq!(first.claims[uid].devices.len(), 2);
    plugin.stop().await;
    // The claim is gone from the API server: only the checkpoint knows it.
    rig.claims.remove("default", "two");
    let plugin = rig.plugin().await.unwrap();
    registered(&kubelet, 2).await;
    assert_eq!(plugin.state.prepared_claims().await, [uid]);
    let again = kubelet.prepare_claim(&claim).await.unwrap();
    assert_eq!(again.claims[uid], first.claims[uid]);
    // Another claim for a device the checkpoint holds is refused.
    let other = rig.claim(
        "other",
        "6c1d3e0a-0000-4000-8000-000000000003",
        &[("a", "vf-0000-3b-00-3")],
        &[],
    );
    let r = kubelet.prepare_claim(&other).await.unwrap();
    assert!(
        r.claims[&other.uid].error.contains(&format!(
            "device vf-0000-3b-00-3 is already prepared for claim {uid}"
        )),
        "{r:?}"
    );
    let un = kubelet.unprepare_claim(&claim).await.unwrap();
    assert_eq!(un.claims[uid].error, "");
    assert!(outputs(&rig).is_empty(), "{:?}", outputs(&rig));
    assert!(plugin.state.prepared_claims().await.is_empty());
    plugin.stop().await;
}

#[tokio::test]
async fn re_registers_after_kubelet_restart_and_wiped_registry() {
    let (rig, mut kubelet, plugin) = started().await;
    // A kubelet restart re-reads the registry dir: GetInfo again.
    kubelet.restart();
    registered(&kubelet, 2).await;
    let mut st = plugin.registration.clone();
    st.wait_for(|s| s.notifications >= 2).await.unwrap();
    // The registry dir wiped (socket gone): the plugin puts it back.
    let reg = driver::registration_socket(&rig.opts.kubelet_dir);
    std::fs::remove_file(&reg).unwrap();
    let mut binds = plugin.registration_binds.clone();
    tokio::time::timeout(Duration::from_secs(5), binds.wait_for(|n| *n >= 2))
        .await
        .unwrap()
        .unwrap();
    registered(&kubelet, 3).await;
    assert!(reg.exists());
    // Prepare works over the re-registered endpoint.
    let claim = vf_claim(
        &rig,
        "x",
        "6c1d3e0a-0000-4000-8000-000000000004",
        "vf-0000-3b-00-4",
        &[],
    );
    let r = kubelet.prepare_claim(&claim).await.unwrap();
    assert_eq!(r.claims[&claim.uid].error, "");
    plugin.stop().await;
}

#[tokio::test]
async fn a_fault_in_the_middle_of_prepare_leaves_nothing_behind() {
    let (rig, kubelet, plugin) = started().await;
    let uid = "6c1d3e0a-0000-4000-8000-000000000005";
    let claim = vf_claim(
        &rig,
        "f",
        uid,
        "vf-0000-3b-00-5",
        &[driver_config(
            ConfigSource::FromClass,
            json!({"memlock": "unlimited"}),
        )],
    );
    // 1. The devinfo dir cannot be created (a file is in the way): the CDI
    //    spec, written first, must go again.
    std::fs::write(&rig.opts.paths.devinfo_dir, b"").unwrap();
    let r = kubelet.prepare_claim(&claim).await.unwrap();
    let e = &r.claims[uid].error;
    assert!(
        e.contains(&rig.opts.paths.devinfo_dir.display().to_string()),
        "{e}"
    );
    assert!(e.contains("nothing was left behind"), "{e}");
    assert_eq!(outputs(&rig), Vec::<PathBuf>::new());
    std::fs::remove_file(&rig.opts.paths.devinfo_dir).unwrap();
    // 2. The memlock dir (written last) fails: CDI and devinfo go again.
    let ml = rig.opts.paths.memlock_dir.clone().unwrap();
    std::fs::write(&ml, b"").unwrap();
    let r = kubelet.prepare_claim(&claim).await.unwrap();
    assert!(
        r.claims[uid].error.contains(&ml.display().to_string()),
        "{r:?}"
    );
    std::fs::remove_file(&ml).unwrap();
    assert!(outputs(&rig).is_empty(), "{:?}", outputs(&rig));
    // 3. The checkpoint cannot be saved: every file goes again.
    let cp = rig.opts.state_dir.join("checkpoint.json");
    std::fs::create_dir_all(cp.join("in-the-way")).unwrap();
    let r = kubelet.prepare_claim(&claim).await.unwrap();
    assert!(
        r.claims[uid].error.contains("prepared files removed again"),
        "{r:?}"
    );
    assert!(outputs(&rig).is_empty(), "{:?}", outputs(&rig));
    assert!(plugin.state.prepared_claims().await.is_empty());
    std::fs::remove_dir_all(&cp).unwrap();
    // Fault gone: the kubelet's retry works.
    let r = kubelet.prepare_claim(&claim).await.unwrap();
    assert_eq!(r.claims[uid].error, "");
    assert_eq!(outputs(&rig).len(), 3);
    plugin.stop().await;
}

#[tokio::test]
async fn bad_claim_config_fails_prepare_and_changes_nothing() {
    let (rig, kubelet, plugin) = started().await;
    let uid = "6c1d3e0a-0000-4000-8000-000000000006";
    let claim = vf_claim(
        &rig,
        "bad",
        uid,
        "vf-0000-3b-00-6",
        &[
            driver_config(ConfigSource::FromClass, json!({"mtu": 9000})),
            driver_config(ConfigSource::FromClaim, json!({"vlan": 5000})),
        ],
    );
    let good = vf_claim(
        &rig,
        "good",
        "6c1d3e0a-0000-4000-8000-000000000007",
        "vf-0000-3b-00-7",
        &[],
    );
    let r = kubelet
        .prepare(DRIVER_NAME, &[claim.clone(), good.clone()])
        .await
        .unwrap();
    let e = &r.claims[uid].error;
    assert!(
        e.contains("status.allocation.devices.config[1] (from the claim): opaque parameters field vlan: 5000 is invalid: expected a whole number from 0 to 4094"),
        "{e}"
    );
    assert!(r.claims[uid].devices.is_empty());
    // The other claim of the same call is prepared.
    assert_eq!(r.claims[&good.uid].error, "");
    assert!(
        outputs(&rig)
            .iter()
            .all(|p| !p.display().to_string().contains(uid)),
        "{:?}",
        outputs(&rig)
    );
    assert_eq!(
        plugin.state.prepared_claims().await,
        std::slice::from_ref(&good.uid)
    );
    // A bad entry of this driver fails the claim even when it names only a
    // request that got no device of ours: a typo is never silently ignored.
    let mut only_gpu = driver_config(ConfigSource::FromClaim, json!({"mtu": 20}));
    only_gpu.requests = vec!["gpu".into()];
    let typo = vf_claim(
        &rig,
        "typo",
        "6c1d3e0a-0000-4000-8000-00000000000b",
        "vf-0000-3b-01-0",
        &[only_gpu],
    );
    let r = kubelet.prepare_claim(&typo).await.unwrap();
    assert!(
        r.claims[&typo.uid]
            .error
            .contains("field mtu: 20 is invalid: expected a whole number from 68 to 9978"),
        "{r:?}"
    );
    // Devices of another node's pool, unknown devices and bad UIDs too.
    let wrong = ClaimRef {
        namespace: "default".into(),
        name: "w".into(),
        uid: "6c1d3e0a-0000-4000-8000-000000000008".into(),
    };
    rig.claims.insert(allocated_claim(
        &wrong,
        DRIVER_NAME,
        "node-b",
        &[("vf", "vf-0000-3b-00-2")],
        &[],
    ));
    let r = kubelet.prepare_claim(&wrong).await.unwrap();
    assert!(
        r.claims[&wrong.uid]
            .error
            .contains("is in pool node-b, not this node's pool node-a"),
        "{r:?}"
    );
    let unknown = vf_claim(
        &rig,
        "u",
        "6c1d3e0a-0000-4000-8000-000000000009",
        "vf-0000-99-00-2",
        &[],
    );
    let r = kubelet.prepare_claim(&unknown).await.unwrap();
    assert!(
        r.claims[&unknown.uid]
            .error
            .contains("device vf-0000-99-00-2 of request vf is not published by this node"),
        "{r:?}"
    );
    let evil = ClaimRef {
        namespace: "default".into(),
        name: "e".into(),
        uid: "../../etc".into(),
    };
    let r = kubelet.prepare_claim(&evil).await.unwrap();
    assert!(
        r.claims["../../etc"]
            .error
            .contains("claim uid \"../../etc\" is not usable"),
        "{r:?}"
    );
    plugin.stop().await;
}

#[tokio::test]
async fn unprepare_removes_what_it_can_and_keeps_the_claim_until_all_is_gone() {
    let (rig, kubelet, plugin) = started().await;
    let uid = "6c1d3e0a-0000-4000-8000-00000000000a";
    let claim = vf_claim(&rig, "k", uid, "vf-0000-86-00-3", &[]);
    let r = kubelet.prepare_claim(&claim).await.unwrap();
    assert_eq!(r.claims[uid].error, "");
    // The device-info file replaced by a non-empty directory: not removable.
    let di = rig
        .opts
        .paths
        .devinfo_dir
        .join(format!("rdma.kroce.io-{uid}-vf-0000-86-00-3-device.json"));
    std::fs::remove_file(&di).unwrap();
    std::fs::create_dir_all(di.join("x")).unwrap();
    let r = kubelet.unprepare_claim(&claim).await.unwrap();
    let e = &r.claims[uid].error;
    assert!(e.contains(&di.display().to_string()), "{e}");
    // The CDI spec went anyway; the claim stays for the kubelet's retry.
    assert_eq!(outputs(&rig), std::slice::from_ref(&di));
    assert_eq!(plugin.state.prepared_claims().await, [uid]);
    std::fs::remove_dir_all(&di).unwrap();
    let r = kubelet.unprepare_claim(&claim).await.unwrap();
    assert_eq!(r.claims[uid].error, "", "files already gone are no error");
    assert!(plugin.state.prepared_claims().await.is_empty());
    plugin.stop().await;
}

#[tokio::test]
async fn slices_follow_the_host_and_are_written_only_on_change() {
    let (mut rig, kubelet, plugin) = started().await;
    wait_writes(&kubelet, &rig.publisher, 1).await;
    // Several rescans of an unchanged host: no write.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(rig.publisher.writes(), 1);
    assert_eq!(rig.publisher.slices(NODE)[0].spec.pool.generation, 1);
    // A VF goes: the next rescan publishes generation 2 without it.
    let pf = sriov_helpers::PciAddress::new(0, 0x86, 0, 0);
    rig.fx.set_num_vfs(&pf, 6).unwrap();
    // The fixture removes VFs one by one: a rescan in between may publish
    // a step of it (a real change), so wait for the end state.
    let count = |p: &RecordingPublisher| {
        p.slices(NODE)
            .first()
            .and_then(|s| s.spec.devices.as_ref().map(Vec::len))
    };
    kubelet
        .wait_for(Duration::from_secs(10), "a slice with 14 devices", |_| {
            (count(&rig.publisher) == Some(14)).then_some(())
        })
        .await
        .unwrap();
    let s = rig.publisher.slices(NODE);
    let settled = rig.publisher.writes();
    assert!(settled >= 2, "{settled}");
    assert_eq!(s[0].spec.pool.generation, settled as i64);
    let names: Vec<String> = s[0]
        .spec
        .devices
        .as_ref()
        .unwrap()
        .iter()
        .map(|d| d.name.clone())
        .collect();
    assert_eq!(names.len(), 14);
    assert!(!names.iter().any(|n| n == "vf-0000-86-01-0"), "{names:?}");
    // The API server fails: retried at a new generation once it is back.
    rig.publisher.set_failing(true);
    rig.fx.set_operstate("ens1f0v0", "down").unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(rig.publisher.writes(), settled);
    rig.publisher.set_failing(false);
    wait_writes(&kubelet, &rig.publisher, settled + 1).await;
    let s = rig.publisher.slices(NODE);
    assert!(s[0].spec.pool.generation > settled as i64);
    let d = s[0]
        .spec
        .devices
        .as_ref()
        .unwrap()
        .iter()
        .find(|d| d.name == "vf-0000-3b-00-2")
        .unwrap();
    assert_eq!(
        d.taints.as_ref().map(|t| t[0].key.as_str()),
        Some("rdma.kroce.io/unhealthy")
    );
    plugin.stop().await;
    // A restarted plugin finds its slices unchanged: no write.
    let before = rig.publisher.writes();
    let plugin = rig.plugin().await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(rig.publisher.writes(), before);
    plugin.stop().await;
}

async fn wait_writes(kubelet: &KubeletDraStandIn, p: &RecordingPublisher, n: u64) {
    kubelet
        .wait_for(
            Duration::from_secs(10),
            &format!("{n} slice writes"),
            |_| (p.writes() >= n).then_some(()),
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn concurrent_prepares_never_share_a_device_and_a_slow_api_blocks_no_unprepare() {
    let rig = PluginRig::new(NODE).unwrap();
    let plugin = rig.plugin().await.unwrap();
    let a = vf_claim(
        &rig,
        "a",
        "6c1d3e0a-0000-4000-8000-0000000000c1",
        "vf-0000-3b-00-2",
        &[],
    );
    let b = vf_claim(
        &rig,
        "b",
        "6c1d3e0a-0000-4000-8000-0000000000c2",
        "vf-0000-3b-00-2",
        &[],
    );
    let s = &plugin.state;
    // The same claim twice at once: one preparation, one answer.
    let (x, y) = tokio::join!(s.prepare(&a), s.prepare(&a));
    assert_eq!(x.unwrap(), y.unwrap());
    s.unprepare(&a).await.unwrap();
    // Two claims for one VF at the same time: exactly one gets it.
    let (x, y) = tokio::join!(s.prepare(&a), s.prepare(&b));
    assert!(
        x.is_ok() != y.is_ok(),
        "exactly one gets the VF: {x:?} {y:?}"
    );
    let loser = if x.is_ok() { y } else { x };
    assert!(
        loser
            .unwrap_err()
            .to_string()
            .contains("is already prepared for claim")
    );
    // A slow API server: an unprepare runs while a prepare waits on its GET.
    let prepared = s.prepared_claims().await;
    let c = vf_claim(
        &rig,
        "c",
        "6c1d3e0a-0000-4000-8000-0000000000c3",
        "vf-0000-3b-00-3",
        &[],
    );
    rig.claims.set_delay(Duration::from_secs(2));
    let gone = ClaimRef {
        namespace: "default".into(),
        name: "x".into(),
        uid: prepared[0].clone(),
    };
    let started = std::time::Instant::now();
    let (p, u) = tokio::join!(s.prepare(&c), async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let r = s.unprepare(&gone).await;
        (r, started.elapsed())
    });
    p.unwrap();
    u.0.unwrap();
    assert!(
        u.1 < Duration::from_secs(1),
        "unprepare waited for the GET: {:?}",
        u.1
    );
    plugin.stop().await;
}

/// Issue 19: the class's fields are the admin's. A claim setting the VLAN
/// of its class (escaping the network's isolation) fails its prepare and
/// writes nothing; with the class's allow-list naming the field it passes.
#[tokio::test]
async fn a_claim_cannot_override_its_class_vlan() {
    let (rig, kubelet, plugin) = started().await;
    let uid = "6c1d3e0a-0000-4000-8000-0000000000e1";
    let claim = vf_claim(
        &rig,
        "escape",
        uid,
        "vf-0000-3b-00-2",
        &[
            driver_config(ConfigSource::FromClass, json!({"vlan": 100})),
            driver_config(ConfigSource::FromClaim, json!({"vlan": 200})),
        ],
    );
    let r = kubelet.prepare_claim(&claim).await.unwrap();
    let e = &r.claims[uid].error;
    assert!(
        e.contains("status.allocation.devices.config[1] (from the claim): opaque parameters field vlan: 200 is invalid: set by the DeviceClass only"),
        "{e}"
    );
    assert!(r.claims[uid].devices.is_empty());
    assert!(
        outputs(&rig)
            .iter()
            .all(|p| !p.display().to_string().contains(uid)),
        "{:?}",
        outputs(&rig)
    );
    assert!(plugin.state.prepared_claims().await.is_empty());

    let allowed_uid = "6c1d3e0a-0000-4000-8000-0000000000e2";
    let allowed = vf_claim(
        &rig,
        "allowed",
        allowed_uid,
        "vf-0000-3b-00-3",
        &[
            driver_config(
                ConfigSource::FromClass,
                json!({"vlan": 100, "allowClaimOverrides": ["vlan"]}),
            ),
            driver_config(ConfigSource::FromClaim, json!({"vlan": 200})),
        ],
    );
    let r = kubelet.prepare_claim(&allowed).await.unwrap();
    assert_eq!(r.claims[allowed_uid].error, "");
    plugin.stop().await;
}

/// Issue 24 item 4: a user sees at info level that the plugin started, that
/// the kubelet registered it, and each prepare and unprepare with the
/// claim and its devices.
#[tokio::test]
async fn info_logs_show_start_registration_prepare_and_unprepare() {
    let logs = kroce_device_plugin::testing::CapturedLogs::default();
    let _guard = tracing::subscriber::set_default(logs.subscriber(tracing::Level::INFO));
    let (rig, kubelet, plugin) = started().await;
    let mut st = plugin.registration.clone();
    st.wait_for(|s| s.registered).await.unwrap();
    let uid = "6c1d3e0a-0000-4000-8000-0000000000f1";
    let claim = vf_claim(&rig, "logged", uid, "vf-0000-3b-00-4", &[]);
    assert_eq!(
        kubelet.prepare_claim(&claim).await.unwrap().claims[uid].error,
        ""
    );
    kubelet.unprepare_claim(&claim).await.unwrap();
    plugin.stop().await;
    let text = logs.text();
    for want in [
        "DRA plugin serving; waiting for the kubelet to register it",
        "node=node-a devices=16",
        "the kubelet asked for plugin info (registration)",
        "registered with the kubelet",
        &format!("prepared claim=default/logged (uid {uid}) devices=[\"node-a/vf-0000-3b-00-4\"]"),
        &format!("unprepared claim=default/logged (uid {uid})"),
    ] {
        assert!(text.contains(want), "missing {want:?} in:\n{text}");
    }
}

/// Issue 21: prepares of different claims run in parallel and share
/// checkpoint writes (group commit). None answers before a stored
/// checkpoint has its claim; a failed write fails every prepare in it
/// (files removed) and no later write carries them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_prepares_share_checkpoint_writes() {
    use futures::future::join_all;
    use kroce_dra::driver_state::DriverState;
    use kroce_dra::facts::HostFacts;
    use kroce_dra::testing::SlowCheckpoint;
    use kroce_inventory::inventory::{DeviceKind, Memory};
    use std::sync::Arc;

    const SAVE: Duration = Duration::from_millis(200);
    let rig = PluginRig::new(NODE).unwrap();
    let store = Arc::new(SlowCheckpoint::new(SAVE));
    let state = DriverState::with_store(
        NODE,
        rig.opts.paths.clone(),
        rig.claims.clone(),
        store.clone(),
    )
    .unwrap();
    let facts = HostFacts::scan(&rig.opts.host_root, &mut Memory::default());
    let published = kroce_dra::slice::devices(&facts, &Default::default());
    let vfs: Vec<String> = published
        .iter()
        .filter(|p| p.candidate.kind == DeviceKind::Vf && p.shared_slot.is_none())
        .map(|p| p.device.name.clone())
        .take(16)
        .collect();
    assert_eq!(vfs.len(), 16);
    state.set_inventory(published);
    let claims: Vec<ClaimRef> = vfs
        .iter()
        .enumerate()
        .map(|(i, vf)| {
            let uid = format!("6c1d3e0a-0000-4000-8000-0000000002{i:02x}");
            vf_claim(&rig, &format!("p{i}"), &uid, vf, &[])
        })
        .collect();

    let started = std::time::Instant::now();
    let answers = join_all(claims.iter().map(|c| {
        let (state, store) = (&state, &store);
        async move {
            let r = state.prepare(c).await;
            let stored = store
                .saved()
                .iter()
                .any(|cp| cp.claims.contains_key(&c.uid));
            (r, stored)
        }
    }))
    .await;
    let took = started.elapsed();
    for (c, (r, stored)) in claims.iter().zip(answers) {
        r.unwrap();
        assert!(stored, "{} answered before a checkpoint had it", c.name);
    }
    let writes = store.saved().len();
    // The first prepare's write, then one for all that queued behind it
    // (slack for a loaded machine); one write each would be 16.
    assert!(writes <= 4, "16 prepares, {writes} checkpoint writes");
    assert!(
        took < SAVE * 8,
        "16 prepares took {took:?} with {SAVE:?} per checkpoint write: serialised"
    );
    assert_eq!(store.saved().last().unwrap().claims.len(), 16);
    assert_eq!(outputs(&rig).len(), 16 * 2, "a CDI spec and a devinfo each");

    // Unprepares share writes too.
    let before = store.saved().len();
    for r in join_all(claims.iter().map(|c| state.unprepare(c))).await {
        r.unwrap();
    }
    assert!(store.saved().len() - before <= 4, "{}", store.saved().len());
    assert!(store.saved().last().unwrap().claims.is_empty());
    assert!(outputs(&rig).is_empty(), "{:?}", outputs(&rig));

    // A failed write: every prepare in it fails with its files removed.
    store.set_failing(true);
    for r in join_all(claims[..4].iter().map(|c| state.prepare(c))).await {
        let e = r.unwrap_err().to_string();
        assert!(e.contains("prepared files removed again"), "{e}");
    }
    assert!(state.prepared_claims().await.is_empty());
    assert!(outputs(&rig).is_empty(), "{:?}", outputs(&rig));
    // The next write carries only the claim it is for.
    store.set_failing(false);
    state.prepare(&claims[5]).await.unwrap();
    let last = store.saved().last().unwrap().clone();
    assert_eq!(
        last.claims.keys().collect::<Vec<_>>(),
        [&claims[5].uid],
        "a failed claim came back"
    );
}

/// Issue 21: a host rescan stuck in sysfs (a read that does not return)
/// does not stop the plugin answering the kubelet: scans run off the async
/// workers. The plugin on a one-thread runtime, the worst case.
#[test]
fn a_stuck_host_scan_blocks_no_prepare() {
    use std::io::Write;
    let rig = PluginRig::new(NODE).unwrap();
    let claim = vf_claim(
        &rig,
        "h",
        "6c1d3e0a-0000-4000-8000-0000000003a1",
        "vf-0000-3b-00-3",
        &[],
    );
    let operstate = rig
        .opts
        .host_root
        .sys()
        .join("class/net/ens1f0v0/operstate");
    let fifo = operstate.clone();
    let (answered, answer) = std::sync::mpsc::channel();
    let (release, released) = std::sync::mpsc::channel::<()>();
    let plugin_side = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let (kubelet, plugin) = rig.registered().await.unwrap();
            // Reading it blocks until someone writes it.
            std::fs::remove_file(&fifo).unwrap();
            let made = std::process::Command::new("mkfifo")
                .arg(&fifo)
                .status()
                .unwrap();
            assert!(made.success());
            // Rescans run every 100 ms: one is stuck now.
            tokio::time::sleep(Duration::from_millis(400)).await;
            let r = kubelet.prepare_claim(&claim).await.unwrap();
            answered.send(r.claims[&claim.uid].error.clone()).unwrap();
            let _ = released.recv();
            plugin.stop().await;
        });
    });
    let got = answer.recv_timeout(Duration::from_secs(10));
    // Unstick the scan: a writer (O_RDWR never blocks on a FIFO), a
    // regular file in its place for the next scans, then the data.
    let mut w = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&operstate)
        .unwrap();
    let tmp = operstate.with_extension("tmp");
    std::fs::write(&tmp, "up\n").unwrap();
    std::fs::rename(&tmp, &operstate).unwrap();
    w.write_all(b"up\n").unwrap();
    drop(w);
    let _ = release.send(());
    let got = got.expect("prepare answered while a host scan was stuck");
    assert_eq!(got, "");
    plugin_side.join().unwrap();
}
