//! Shared HCAs: the device plugin config's `mode: shared` pools turned
//! into DRA slots (`shared-<pci>-<i>`) on fixture hosts, the plugin reading
//! that config file, and what preparing a slot writes. No root needed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use k8s_openapi::api::resource::v1::Device;
use kroce_dra::config::ConfigSource;
use kroce_dra::driver::DRIVER_NAME;
use kroce_dra::facts::HostFacts;
use kroce_dra::prepare::CdiSpec;
use kroce_dra::sharing::{FileRules, Layered, SharingRules};
use kroce_dra::slice::{self, Published, SHARED_ATTRIBUTE, Sharing};
use kroce_dra::testing::{
    ConfigEntry, PluginRig, RecordingPublisher, driver_config, rdma_device_nodes, scratch_dir,
};
use kroce_inventory::config::{Format, parse};
use kroce_inventory::inventory::Memory;
use serde_json::json;
use sriov_helpers::PciAddress;
use sriov_helpers::fixture::FixtureHost;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

const NODE: &str = "node-a";

/// The device plugin's shared pool for ConnectX-6 Dx PFs (101d), 3 slots.
const SHARED_PFS: &str = "pools:\n- resourceName: hca\n  mode: shared\n  sharedCount: 3\n  selectors: {devices: [\"101d\"]}\n";
/// The same, and the VFs (101e) in an exclusive device plugin pool.
const SHARED_PFS_DP_VFS: &str = "pools:\n- resourceName: hca\n  mode: shared\n  sharedCount: 3\n  selectors: {devices: [\"101d\"]}\n- resourceName: vf\n  selectors: {devices: [\"101e\"]}\n";

fn sharing(yaml: &str) -> Sharing {
    Sharing::from_config(&parse(yaml, Format::Yaml).unwrap())
}

fn published(fx: &FixtureHost, in_use: &[&str], s: &Sharing) -> Vec<Published> {
    let facts = HostFacts::scan(&fx.root(), &mut Memory::default());
    let in_use: BTreeSet<String> = in_use.iter().map(|s| s.to_string()).collect();
    slice::devices_with(&facts, &in_use, s)
}

fn names(p: &[Published]) -> Vec<String> {
    p.iter().map(|p| p.device.name.clone()).collect()
}

fn shared_attr(d: &Device) -> Option<bool> {
    d.attributes
        .as_ref()
        .and_then(|a| a.get(SHARED_ATTRIBUTE))
        .and_then(|a| a.bool)
}

#[test]
fn shared_pool_gives_each_hca_its_slots_beside_its_vfs() {
    let fx = FixtureHost::connectx6dx_pair().unwrap();
    let devs = published(&fx, &[], &sharing(SHARED_PFS));
    let slots: Vec<&Published> = devs.iter().filter(|p| p.shared_slot.is_some()).collect();
    assert_eq!(
        names(&slots.iter().map(|p| (*p).clone()).collect::<Vec<_>>()),
        [
            "shared-0000-3b-00-0-0",
            "shared-0000-3b-00-0-1",
            "shared-0000-3b-00-0-2",
            "shared-0000-86-00-0-0",
            "shared-0000-86-00-0-1",
            "shared-0000-86-00-0-2",
        ]
    );
    // The 16 VFs stay one exclusive device each.
    assert_eq!(devs.len(), 16 + 6, "{:?}", names(&devs));
    for p in &devs {
        let is_slot = p.shared_slot.is_some();
        assert_eq!(shared_attr(&p.device), Some(is_slot), "{}", p.device.name);
        assert_eq!(slice::is_shared_slot(&p.device.name), is_slot);
    }
    // A slot carries the HCA's attributes, PCIe root included (a claim can
    // pair it with a GPU on the same root).
    let a = slots[0].device.attributes.as_ref().unwrap();
    assert_eq!(a["type"].string.as_deref(), Some("pci"));
    assert_eq!(a["pciAddress"].string.as_deref(), Some("0000:3b:00.0"));
    assert_eq!(a["netdev"].string.as_deref(), Some("ens1f0"));
    assert_eq!(
        a[slice::PCIE_ROOT_ATTRIBUTE].string.as_deref(),
        Some("pci0000:3a")
    );
    assert!(
        a["rdmaDevice"]
            .string
            .as_deref()
            .unwrap()
            .starts_with("mlx5_")
    );

    // Without the sharing rules: no slots, and the VFs say shared: false.
    let plain = published(&fx, &[], &Sharing::default());
    assert_eq!(plain.len(), 16);
    assert!(plain.iter().all(|p| shared_attr(&p.device) == Some(false)));
}

#[test]
fn devices_the_device_plugin_hands_out_are_not_published() {
    let fx = FixtureHost::connectx6dx_pair().unwrap();
    // The VFs are in an exclusive device plugin pool: DRA leaves them to
    // it (one VF offered by both could reach two pods); the HCAs' slots
    // stay (shared either way).
    let devs = published(&fx, &[], &sharing(SHARED_PFS_DP_VFS));
    assert_eq!(devs.len(), 6, "{:?}", names(&devs));
    assert!(devs.iter().all(|p| p.shared_slot.is_some()));
    // A VF a DRA claim already holds stays published until released.
    let held = published(&fx, &["vf-0000-3b-00-2"], &sharing(SHARED_PFS_DP_VFS));
    assert!(names(&held).contains(&"vf-0000-3b-00-2".to_string()));
    assert_eq!(held.len(), 7);
    // A VF in a shared device plugin pool: not DRA's either.
    let shared_vfs =
        "pools:\n- resourceName: v\n  mode: shared\n  selectors: {devices: [\"101e\"]}\n";
    assert!(published(&fx, &[], &sharing(shared_vfs)).is_empty());
}

#[test]
fn an_earlier_exclusive_pool_keeps_the_hca_exclusive_like_the_device_plugin() {
    let mut fx = FixtureHost::unknown_numa().unwrap();
    fx.set_num_vfs(&PciAddress::new(0, 5, 0, 0), 0).unwrap();
    let shared_only = "pools:\n- resourceName: hca\n  mode: shared\n  sharedCount: 2\n  selectors: {isRdma: true}\n";
    assert_eq!(
        names(&published(&fx, &[], &sharing(shared_only))),
        ["shared-0000-05-00-0-0", "shared-0000-05-00-0-1"]
    );
    // The device plugin's exclusive pool comes first: the PF is its, not
    // shared and not DRA's.
    let exclusive_first = "pools:\n- resourceName: pf\n  selectors: {isRdma: true}\n- resourceName: hca\n  mode: shared\n  sharedCount: 2\n  selectors: {isRdma: true}\n";
    assert!(published(&fx, &[], &sharing(exclusive_first)).is_empty());
}

#[test]
fn an_hca_held_in_one_mode_is_offered_in_that_mode_only() {
    let mut fx = FixtureHost::unknown_numa().unwrap();
    fx.set_num_vfs(&PciAddress::new(0, 5, 0, 0), 0).unwrap();
    let shared = sharing(
        "pools:\n- resourceName: hca\n  mode: shared\n  sharedCount: 2\n  selectors: {isRdma: true}\n",
    );
    // Sharing turned on while a claim holds the whole HCA: still exclusive.
    assert_eq!(
        names(&published(&fx, &["pf-0000-05-00-0"], &shared)),
        ["pf-0000-05-00-0"]
    );
    // Sharing turned off while a slot is held: no exclusive device (its
    // netdev would be moved from under the slot's holder) until released.
    assert!(published(&fx, &["shared-0000-05-00-0-1"], &Sharing::default()).is_empty());
    assert_eq!(
        names(&published(&fx, &[], &Sharing::default())),
        ["pf-0000-05-00-0"]
    );
}

#[test]
fn unhealthy_hca_taints_every_slot() {
    let fx = FixtureHost::connectx6dx_pair().unwrap();
    fx.set_operstate("ens1f0", "down").unwrap();
    let devs = published(&fx, &[], &sharing(SHARED_PFS));
    for p in devs
        .iter()
        .filter(|p| p.device.name.starts_with("shared-0000-3b"))
    {
        assert!(p.device.taints.is_some(), "{}", p.device.name);
    }
    for p in devs
        .iter()
        .filter(|p| p.device.name.starts_with("shared-0000-86"))
    {
        assert!(p.device.taints.is_none(), "{}", p.device.name);
    }
}

#[test]
fn file_rules_reload_and_keep_the_last_good_rules() {
    let dir = scratch_dir("kroce-dra-").unwrap();
    let path = dir.path().join("config.yaml");
    // Absent (no network on this node yet): no sharing, and it is picked
    // up once written.
    let rules = FileRules::load(&path).unwrap();
    assert_eq!(rules.current(), Sharing::default());
    std::fs::write(&path, SHARED_PFS).unwrap();
    assert_eq!(rules.current(), sharing(SHARED_PFS));
    // Invalid at start: an error naming the path.
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "pools: 3\n").unwrap();
    let e = FileRules::load(&bad).unwrap_err().to_string();
    assert!(e.contains(&bad.display().to_string()), "{e}");
    // A bad edit: the last good rules stay.
    std::fs::write(&path, "pools:\n- resourceName: hca\n  mode: bogus\n").unwrap();
    assert_eq!(rules.current(), sharing(SHARED_PFS));
    // Unreadable (a directory in its place): still the last good rules.
    std::fs::remove_file(&path).unwrap();
    std::fs::create_dir(&path).unwrap();
    assert_eq!(rules.current(), sharing(SHARED_PFS));
    std::fs::remove_dir(&path).unwrap();
    // A good edit: taken.
    let two = SHARED_PFS.replace("sharedCount: 3", "sharedCount: 2");
    std::fs::write(&path, &two).unwrap();
    assert_eq!(rules.current(), sharing(&two));
    assert_ne!(rules.current(), sharing(SHARED_PFS));
    // The key removed: no sharing.
    std::fs::remove_file(&path).unwrap();
    assert_eq!(rules.current(), Sharing::default());

    // Two files in order: the device plugin's own pools decide first.
    let dp = dir.path().join("dp.yaml");
    let extra = dir.path().join("extra.yaml");
    std::fs::write(
        &dp,
        "pools:\n- resourceName: pf\n  selectors: {isRdma: true}\n",
    )
    .unwrap();
    std::fs::write(&extra, "pools:\n- resourceName: hca\n  mode: shared\n  sharedCount: 2\n  selectors: {isRdma: true}\n").unwrap();
    let layered = Layered(vec![
        FileRules::load(&dp).unwrap(),
        FileRules::load(&extra).unwrap(),
    ]);
    let mut fx = FixtureHost::unknown_numa().unwrap();
    fx.set_num_vfs(&PciAddress::new(0, 5, 0, 0), 0).unwrap();
    assert!(published(&fx, &[], &layered.current()).is_empty());
    // The device plugin's key gone (no network there): the extra file's
    // shared pool applies.
    std::fs::remove_file(&dp).unwrap();
    assert_eq!(
        names(&published(&fx, &[], &layered.current())),
        ["shared-0000-05-00-0-0", "shared-0000-05-00-0-1"]
    );
}

/// From the DeviceClass: a claim may set only what its class allows
/// (`allowClaimOverrides`, tested in `config`), and these tests are about
/// what the fields do, not who may set them.
fn cfg(fields: serde_json::Value) -> ConfigEntry {
    driver_config(ConfigSource::FromClass, fields)
}

/// The plugin started with the device plugin's config file: slots are
/// published, two claims prepare two slots of one HCA with its char devices
/// and no device-info file, a slot with network settings is refused, and a
/// config edit is picked up by the next rescan.
#[tokio::test]
async fn plugin_publishes_and_prepares_shared_slots_from_the_config_file() {
    let rig = PluginRig::new(NODE).unwrap();
    let config = rig.root.join("dp-config.yaml");
    std::fs::write(&config, SHARED_PFS).unwrap();
    let (kubelet, plugin) = rig
        .registered_with(Arc::new(FileRules::load(&config).unwrap()))
        .await
        .unwrap();
    let p = rig.publisher.clone();
    let count = |p: &RecordingPublisher, prefix: &str| {
        p.slices(NODE)
            .iter()
            .flat_map(|s| s.spec.devices.clone().unwrap_or_default())
            .filter(|d| d.name.starts_with(prefix))
            .count()
    };
    kubelet
        .wait_for(Duration::from_secs(5), "slots published", |_| {
            (count(&p, "shared-") == 6).then_some(())
        })
        .await
        .unwrap();
    assert_eq!(count(&rig.publisher, "vf-"), 16);

    let a = rig.claim(
        "a",
        "00000000-0000-4000-8000-00000000000a",
        &[("hca", "shared-0000-3b-00-0-0")],
        &[cfg(json!({"memlock": "1Gi"}))],
    );
    let b = rig.claim(
        "b",
        "00000000-0000-4000-8000-00000000000b",
        &[("hca", "shared-0000-3b-00-0-1")],
        &[],
    );
    let resp = kubelet
        .prepare(DRIVER_NAME, &[a.clone(), b.clone()])
        .await
        .unwrap();
    for c in [&a, &b] {
        assert_eq!(resp.claims[&c.uid].error, "", "{}", c.name);
        let spec: CdiSpec = serde_json::from_slice(
            &std::fs::read(
                rig.opts
                    .paths
                    .cdi_dir
                    .join(format!("rdma.kroce.io-claim_{}.json", c.uid)),
            )
            .unwrap(),
        )
        .unwrap();
        let (nodes, rdma) = rdma_device_nodes(&spec.devices[0]);
        assert!(rdma, "uverbs and rdma_cm: {nodes:?}");
        let env = &spec.devices[0].container_edits.env;
        assert!(
            env.iter().any(|e| e.ends_with("_PCI_ADDRESS=0000:3b:00.0")),
            "{env:?}"
        );
    }
    // Both holders got the same char devices; nobody got a device-info
    // file (a CNI reading one could move the HCA's netdev).
    let files: Vec<_> = std::fs::read_dir(&rig.opts.paths.devinfo_dir)
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(files.is_empty(), "{files:?}");
    assert!(
        rig.opts
            .paths
            .memlock_dir
            .as_ref()
            .unwrap()
            .join(format!("{}.json", a.uid))
            .exists()
    );

    // Network settings on a slot: refused, naming the device and field,
    // nothing written.
    let c = rig.claim(
        "c",
        "00000000-0000-4000-8000-00000000000c",
        &[("hca", "shared-0000-3b-00-0-2")],
        &[cfg(json!({"vlan": 100}))],
    );
    let resp = kubelet.prepare_claim(&c).await.unwrap();
    let err = &resp.claims[&c.uid].error;
    assert!(
        err.contains("shared-0000-3b-00-0-2") && err.contains("vlan"),
        "{err}"
    );
    assert!(
        !rig.opts
            .paths
            .cdi_dir
            .join(format!("rdma.kroce.io-claim_{}.json", c.uid))
            .exists()
    );

    // Sharing turned off in the config: the next rescan drops the slots.
    std::fs::write(
        &config,
        "pools:\n- resourceName: vf\n  selectors: {devices: [\"101e\"]}\n",
    )
    .unwrap();
    kubelet
        .wait_for(Duration::from_secs(5), "slots dropped", |_| {
            (count(&p, "shared-") == 0).then_some(())
        })
        .await
        .unwrap();
    // ... and the VFs, now in the device plugin's pool, are its alone.
    assert_eq!(count(&rig.publisher, "vf-"), 0);
    // Held slots still unprepare.
    let un = kubelet.unprepare(DRIVER_NAME, &[a, b]).await.unwrap();
    assert!(un.claims.values().all(|c| c.error.is_empty()), "{un:?}");
    plugin.stop().await;
}

#[test]
fn prepare_refuses_a_slot_while_another_claim_holds_the_whole_hca_and_back() {
    use kroce_dra::config::ClaimConfig;
    use kroce_dra::sharing::check_prepare;
    use std::collections::BTreeMap;
    let mut fx = FixtureHost::unknown_numa().unwrap();
    fx.set_num_vfs(&PciAddress::new(0, 5, 0, 0), 0).unwrap();
    let shared = sharing(
        "pools:\n- resourceName: hca\n  mode: shared\n  sharedCount: 2\n  selectors: {isRdma: true}\n",
    );
    let slot = published(&fx, &[], &shared).remove(0);
    let whole = published(&fx, &[], &Sharing::default()).remove(0);
    assert_eq!(whole.device.name, "pf-0000-05-00-0");
    let cfg = ClaimConfig::default();
    let held_whole = BTreeMap::from([("pf-0000-05-00-0".to_string(), "other".to_string())]);
    let e = check_prepare(&slot.device.name, &slot, &cfg, &held_whole, "mine")
        .unwrap_err()
        .to_string();
    assert!(e.contains("pf-0000-05-00-0") && e.contains("other"), "{e}");
    let held_slot = BTreeMap::from([("shared-0000-05-00-0-1".to_string(), "other".to_string())]);
    let e = check_prepare("pf-0000-05-00-0", &whole, &cfg, &held_slot, "mine")
        .unwrap_err()
        .to_string();
    assert!(e.contains("shared-0000-05-00-0-1"), "{e}");
    // Other slots of the same HCA, or the same claim again: fine.
    check_prepare(&slot.device.name, &slot, &cfg, &held_slot, "mine").unwrap();
    check_prepare("pf-0000-05-00-0", &whole, &cfg, &held_whole, "other").unwrap();
}
