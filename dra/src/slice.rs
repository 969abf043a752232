//! Pure core: ResourceSlice content (resource.k8s.io/v1) from the host
//! model, and the pool generation rule.
//!
//! One device per VF, per PCI function with RDMA and no VFs enabled (a
//! whole PF) and per soft RDMA device (rxe). Device names are DNS labels
//! derived from the PCI address (`vf-0000-3b-00-2`) or the soft device's
//! name (`soft-rxe0`).
//!
//! Shared HCAs ([`Sharing`], the device plugin's `mode: shared` pools): a
//! PCI function with an RDMA device that a sharing rule selects is offered
//! as N slots `shared-<pci>-<i>` instead of one exclusive device, each with
//! the HCA's attributes and `shared: true` (every other device has
//! `shared: false`, so a selector reading it never meets a missing
//! attribute). Every holder of a slot gets the HCA's RDMA char devices; the
//! HCA's netdev stays in the host namespace (nothing moves it: see
//! [`Published::shared_slot`]). Attributes without a domain are the driver's
//! (`rdma.kroce.io/pciAddress` in CEL: `device.attributes["rdma.kroce.io"].pciAddress`);
//! the PCIe root is the standard `resource.kubernetes.io/pcieRoot`, so a
//! claim can ask for a VF on the same root as a GPU with a matchAttribute
//! constraint.
//!
//! One pool per node (named after the node), split into slices of at most
//! [`DEVICES_PER_SLICE`]. The pool generation goes up only when the content
//! changes, so an unchanged host is never written again.

use crate::driver::{DRIVER_NAME, MANAGER};
use crate::facts::HostFacts;
use k8s_openapi::api::resource::v1::{
    Device, DeviceAttribute, DeviceTaint, ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kroce_inventory::config::{Config, Mode, Pool as PluginPool};
use kroce_inventory::health;
use kroce_inventory::inventory::{Candidate, DeviceKind};
use kroce_inventory::selection;
use std::collections::{BTreeMap, BTreeSet};

/// The standard attribute naming a device's PCIe root complex.
pub const PCIE_ROOT_ATTRIBUTE: &str = "resource.kubernetes.io/pcieRoot";
/// The taint on an unhealthy device (NoSchedule: new claims avoid it,
/// pods already running keep it).
pub const UNHEALTHY_TAINT: &str = "rdma.kroce.io/unhealthy";
/// resource.k8s.io/v1 allows 128 devices per slice, 64 when any device has
/// taints; the lower bound keeps a slice valid whatever the health.
pub const DEVICES_PER_SLICE: usize = 64;
/// Label naming the node on every slice the plugin writes (how it finds its own).
pub const NODE_LABEL: &str = "rdma.kroce.io/node";

/// Attribute saying whether a device is a shared-HCA slot.
pub const SHARED_ATTRIBUTE: &str = "shared";

/// One published device and the candidate behind it (what prepare needs).
#[derive(Debug, Clone)]
pub struct Published {
    pub device: Device,
    pub candidate: Candidate,
    /// `Some(i)`: slot `i` of a shared HCA. Its holder gets the HCA's char
    /// devices only: the netdev is the host's and other holders', so no
    /// network attach step may move it.
    pub shared_slot: Option<u32>,
}

/// What the device plugin's config says about each device: its pools,
/// read with the device plugin's own rule (the first pool whose selectors
/// match and whose mode can use the device takes it), so one ConfigMap
/// decides for both front ends which HCAs are shared and which devices are
/// the device plugin's ([`Sharing::offer`]). Empty (the default, or no
/// config): every device is DRA's, none shared.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sharing {
    pools: Vec<PluginPool>,
}

impl Sharing {
    pub fn from_config(config: &Config) -> Sharing {
        Sharing {
            pools: config.pools.clone(),
        }
    }

    /// These pools, then `later`'s (an earlier pool wins, as within one file).
    pub fn then(mut self, later: Sharing) -> Sharing {
        self.pools.extend(later.pools);
        self
    }

    /// How DRA offers a candidate, by the pool the device plugin would put
    /// it in: none → one exclusive DRA device; a shared pool and an HCA (a
    /// PCI function with an RDMA device) → its slots (both front ends may
    /// share it: no holder moves its netdev); any other pool → nothing, the
    /// device plugin hands it out (a VF both offered could reach two pods,
    /// and a DRA claim would move a netdev shared holders use).
    pub fn offer(&self, c: &Candidate) -> Offer {
        let Some(pool) = self
            .pools
            .iter()
            .find(|p| selection::eligible(p, c) && selection::matches(&p.selectors, c))
        else {
            return Offer::Exclusive;
        };
        match pool.mode {
            Mode::Shared { count }
                if count > 0
                    && c.kind == DeviceKind::Pci
                    && c.rdma.is_some()
                    && c.pci.is_some() =>
            {
                Offer::Slots(count)
            }
            _ => Offer::DevicePlugin,
        }
    }

    /// The slot count of a candidate, `None` when it is not a shared HCA.
    pub fn slots(&self, c: &Candidate) -> Option<u32> {
        match self.offer(c) {
            Offer::Slots(n) => Some(n),
            _ => None,
        }
    }
}

/// See [`Sharing::offer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offer {
    Exclusive,
    Slots(u32),
    DevicePlugin,
}

/// `shared-<pci>-<i>` (`shared-0000-3b-00-0-3`).
pub fn shared_slot_name(c: &Candidate, slot: u32) -> Option<String> {
    c.pci.map(|p| dns_label("shared", &format!("{p}-{slot}")))
}

/// Whether a device name is a shared-HCA slot: its holder has the HCA's
/// char devices only and its netdev must never be moved (the network
/// attach step asks this of a prepared device).
pub fn is_shared_slot(device: &str) -> bool {
    device.starts_with("shared-")
}

/// The slot index when `name` is one of `c`'s slots.
pub(crate) fn slot_of(c: &Candidate, name: &str) -> Option<u32> {
    let base = dns_label("shared", &c.pci?.to_string());
    name.strip_prefix(base.as_str())?
        .strip_prefix('-')?
        .parse()
        .ok()
}

fn push_slots(
    out: &mut Vec<Published>,
    seen: &mut BTreeSet<String>,
    c: &Candidate,
    facts: &HostFacts,
    n: u32,
) {
    // The HCA stays in the host namespace: no in-use tolerance.
    let health = health::evaluate(c, false);
    let mut attrs = attributes(c, facts);
    attrs.insert("healthy".into(), boolean(health.is_healthy()));
    attrs.insert(SHARED_ATTRIBUTE.into(), boolean(true));
    for slot in 0..n {
        let Some(name) = shared_slot_name(c, slot) else {
            continue;
        };
        if !seen.insert(name.clone()) {
            continue;
        }
        out.push(Published {
            device: Device {
                name,
                attributes: Some(attrs.clone()),
                taints: taints(health.is_healthy()),
                ..Default::default()
            },
            candidate: c.clone(),
            shared_slot: Some(slot),
        });
    }
}

/// A device name (`kroce_contracts::dra::device_name`: the node agent reads
/// the same names from the checkpoint).
pub fn dns_label(prefix: &str, raw: &str) -> String {
    kroce_contracts::dra::device_name(prefix, raw)
}

/// The device name of a candidate, `None` for what DRA does not publish
/// (a PF with VFs enabled: its VFs are the devices; a function without RDMA).
pub fn device_name(c: &Candidate) -> Option<String> {
    match c.kind {
        DeviceKind::Vf => c.pci.map(|p| dns_label("vf", &p.to_string())),
        DeviceKind::Pci if c.active_vfs == 0 && c.rdma.is_some() => {
            c.pci.map(|p| dns_label("pf", &p.to_string()))
        }
        DeviceKind::Pci => None,
        DeviceKind::Soft => c.rdma.as_ref().map(|r| dns_label("soft", &r.name)),
    }
}

fn string(v: impl Into<String>) -> DeviceAttribute {
    DeviceAttribute {
        string: Some(v.into()),
        ..Default::default()
    }
}

fn int(v: i64) -> DeviceAttribute {
    DeviceAttribute {
        int: Some(v),
        ..Default::default()
    }
}

fn boolean(v: bool) -> DeviceAttribute {
    DeviceAttribute {
        bool: Some(v),
        ..Default::default()
    }
}

/// The attributes of one candidate (plain map, for tests and the device).
pub fn attributes(c: &Candidate, facts: &HostFacts) -> BTreeMap<String, DeviceAttribute> {
    let mut a = BTreeMap::new();
    let mut put = |k: &str, v: DeviceAttribute| {
        a.insert(k.to_string(), v);
    };
    put("type", string(c.kind.as_str()));
    if let Some(p) = c.pci {
        put("pciAddress", string(p.to_string()));
        if let Some(root) = facts.pcie_roots.get(&p) {
            put(PCIE_ROOT_ATTRIBUTE, string(root.clone()));
        }
    }
    if c.kind == DeviceKind::Vf {
        if let Some(pf) = c.pf {
            put("pfPciAddress", string(pf.to_string()));
        }
        if let Some(i) = c.vf_index {
            put("vfIndex", int(i64::from(i)));
        }
    }
    if let Some(n) = &c.pf_name {
        put("pfName", string(n.clone()));
    }
    if let Some(n) = &c.netdev {
        put("netdev", string(n.name.clone()));
    }
    if let Some(l) = c.link_type {
        put("linkType", string(l.as_str()));
    }
    if let Some(n) = c.numa {
        put("numaNode", int(i64::from(n)));
    }
    if let Some(v) = c.vendor {
        put("vendorId", string(format!("{v:04x}")));
    }
    if let Some(d) = c.device {
        put("deviceId", string(format!("{d:04x}")));
    }
    if let Some(d) = &c.driver {
        put("kernelDriver", string(d.clone()));
    }
    if let Some(r) = &c.rdma {
        put("rdmaDevice", string(r.name.clone()));
        let port = facts.ports.get(&r.name);
        put("roceV2", boolean(port.is_some_and(|p| p.roce_v2)));
        if let Some(m) = port.and_then(|p| p.rate_mbps) {
            put("portSpeedMbps", int(m));
        }
    }
    a
}

/// Every device DRA publishes for this host, no HCA shared: see
/// [`devices_with`].
pub fn devices(facts: &HostFacts, in_use: &BTreeSet<String>) -> Vec<Published> {
    devices_with(facts, in_use, &Sharing::default())
}

fn taints(healthy: bool) -> Option<Vec<DeviceTaint>> {
    (!healthy).then(|| {
        vec![DeviceTaint {
            key: UNHEALTHY_TAINT.into(),
            effect: "NoSchedule".into(),
            ..Default::default()
        }]
    })
}

/// Every device DRA publishes for this host, in candidate order (PCI
/// address, then soft devices), a shared HCA's slots in slot order where
/// its exclusive device would be. `in_use`: device names prepared for a
/// claim (their netdev may be in a pod, which is not a fault; a shared
/// HCA's netdev never leaves, so its slots get no such tolerance). A name
/// two soft devices map to is published once (the first).
pub fn devices_with(
    facts: &HostFacts,
    in_use: &BTreeSet<String>,
    sharing: &Sharing,
) -> Vec<Published> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for c in &facts.candidates {
        let exclusive = device_name(c);
        let held_exclusive = exclusive.as_ref().is_some_and(|n| in_use.contains(n));
        let held_slots = in_use.iter().any(|n| slot_of(c, n).is_some());
        // A config change never hands a device out twice: while it is
        // prepared in one mode, it is offered in that mode only (the
        // exclusive device, or no device until its slots are released).
        let offer = sharing.offer(c);
        match offer {
            Offer::Slots(n) if !held_exclusive => {
                push_slots(&mut out, &mut seen, c, facts, n);
                continue;
            }
            Offer::DevicePlugin if !held_exclusive => continue,
            Offer::Exclusive | Offer::DevicePlugin if held_slots => continue,
            _ => {}
        }
        let Some(name) = exclusive else {
            continue;
        };
        if !seen.insert(name.clone()) {
            continue;
        }
        let health = health::evaluate(c, held_exclusive);
        let mut attrs = attributes(c, facts);
        attrs.insert("healthy".into(), boolean(health.is_healthy()));
        attrs.insert(SHARED_ATTRIBUTE.into(), boolean(false));
        out.push(Published {
            device: Device {
                name,
                attributes: Some(attrs),
                taints: taints(health.is_healthy()),
                ..Default::default()
            },
            candidate: c.clone(),
            shared_slot: None,
        });
    }
    out
}

/// The slices of a node's pool at `generation`: `<node>-rdma.kroce.io-<i>`,
/// each naming the pool's slice count. A host without devices still gets
/// one (empty) slice, so the pool says "nothing here" instead of vanishing.
pub fn slices(node: &str, generation: i64, devices: &[Device]) -> Vec<ResourceSlice> {
    let chunks: Vec<&[Device]> = if devices.is_empty() {
        vec![&[]]
    } else {
        devices.chunks(DEVICES_PER_SLICE).collect()
    };
    let count = chunks.len() as i64;
    chunks
        .into_iter()
        .enumerate()
        .map(|(i, chunk)| ResourceSlice {
            metadata: ObjectMeta {
                name: Some(slice_name(node, i)),
                labels: Some(BTreeMap::from([
                    (
                        "app.kubernetes.io/managed-by".to_string(),
                        MANAGER.to_string(),
                    ),
                    (NODE_LABEL.to_string(), node.to_string()),
                ])),
                ..Default::default()
            },
            spec: ResourceSliceSpec {
                driver: DRIVER_NAME.into(),
                node_name: Some(node.into()),
                pool: ResourcePool {
                    name: node.into(),
                    generation,
                    resource_slice_count: count,
                },
                devices: Some(chunk.to_vec()),
                ..Default::default()
            },
        })
        .collect()
}

/// `<node>-rdma.kroce.io-<i>` (node names are DNS subdomains, so this is one).
pub fn slice_name(node: &str, index: usize) -> String {
    format!("{node}-{DRIVER_NAME}-{index}")
}

/// A node's pool as last published: the generation rule in one place.
#[derive(Debug, Clone)]
pub struct Pool {
    node: String,
    generation: i64,
    published: Option<Vec<Device>>,
}

impl Pool {
    /// A pool never published (generation starts at 1 on first publish).
    pub fn new(node: &str) -> Pool {
        Pool::resume(node, 0, None)
    }

    /// A pool already in the API at `generation` with `devices` (after a
    /// restart): unchanged content is not written again, changed content
    /// goes out at a higher generation.
    pub fn resume(node: &str, generation: i64, devices: Option<Vec<Device>>) -> Pool {
        Pool {
            node: node.to_string(),
            generation,
            published: devices,
        }
    }

    pub fn generation(&self) -> i64 {
        self.generation
    }

    /// The slices to write for `devices`, or `None` when the content is what
    /// was last published. Bumps the generation when it returns slices.
    pub fn update(&mut self, devices: Vec<Device>) -> Option<Vec<ResourceSlice>> {
        if self.published.as_ref() == Some(&devices) {
            return None;
        }
        self.generation += 1;
        let out = slices(&self.node, self.generation, &devices);
        self.published = Some(devices);
        Some(out)
    }

    /// Forget what was published (a write failed): the next update writes
    /// again, at a new generation.
    pub fn invalidate(&mut self) {
        self.published = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kroce_inventory::inventory::Memory;
    use sriov_helpers::fixture::FixtureHost;

    fn attr<'a>(d: &'a Device, k: &str) -> &'a DeviceAttribute {
        d.attributes
            .as_ref()
            .and_then(|a| a.get(k))
            .unwrap_or_else(|| panic!("{} has no {k}: {:?}", d.name, d.attributes))
    }

    #[test]
    fn names_are_dns_labels() {
        assert_eq!(dns_label("vf", "0000:3b:00.2"), "vf-0000-3b-00-2");
        assert_eq!(dns_label("soft", "rxe_Eth0"), "soft-rxe-eth0");
        let long = dns_label("soft", &"a_".repeat(40));
        assert!(long.len() <= 63 && !long.ends_with('-'), "{long}");
    }

    #[test]
    fn connectx_pair_publishes_every_vf_with_its_attributes() {
        let fx = FixtureHost::connectx6dx_pair().unwrap();
        let facts = HostFacts::scan(&fx.root(), &mut Memory::default());
        let devs = devices(&facts, &BTreeSet::new());
        // 2 PFs with 8 VFs each: the PFs are not devices, their VFs are.
        assert_eq!(devs.len(), 16, "{:?}", facts.errors);
        let d = &devs
            .iter()
            .find(|p| p.device.name == "vf-0000-3b-00-2")
            .unwrap()
            .device;
        assert_eq!(attr(d, "type").string.as_deref(), Some("vf"));
        assert_eq!(
            attr(d, "pciAddress").string.as_deref(),
            Some("0000:3b:00.2")
        );
        assert_eq!(
            attr(d, "pfPciAddress").string.as_deref(),
            Some("0000:3b:00.0")
        );
        assert_eq!(attr(d, "pfName").string.as_deref(), Some("ens1f0"));
        assert_eq!(attr(d, "vfIndex").int, Some(0));
        assert_eq!(attr(d, "netdev").string.as_deref(), Some("ens1f0v0"));
        assert_eq!(attr(d, "linkType").string.as_deref(), Some("ether"));
        assert_eq!(attr(d, "numaNode").int, Some(0));
        assert_eq!(attr(d, "vendorId").string.as_deref(), Some("15b3"));
        assert_eq!(attr(d, "deviceId").string.as_deref(), Some("101e"));
        assert_eq!(attr(d, "kernelDriver").string.as_deref(), Some("mlx5_core"));
        assert_eq!(attr(d, "roceV2").bool, Some(true));
        assert_eq!(attr(d, "portSpeedMbps").int, Some(100_000));
        assert_eq!(attr(d, "healthy").bool, Some(true));
        assert!(
            attr(d, "rdmaDevice")
                .string
                .as_deref()
                .unwrap()
                .starts_with("mlx5_")
        );
        // The fixture hangs 0000:3b:00.x below root port 0000:3a:02.0 of pci0000:3a.
        assert_eq!(
            attr(d, PCIE_ROOT_ATTRIBUTE).string.as_deref(),
            Some("pci0000:3a")
        );
        let other = &devs
            .iter()
            .find(|p| p.device.name == "vf-0000-86-00-2")
            .unwrap()
            .device;
        assert_eq!(
            attr(other, PCIE_ROOT_ATTRIBUTE).string.as_deref(),
            Some("pci0000:85")
        );
        assert_eq!(attr(other, "numaNode").int, Some(1));
        assert!(d.taints.is_none());
        // Every attribute name is valid: a C identifier of at most 32, or a
        // domain-qualified one.
        for p in &devs {
            for k in p.device.attributes.as_ref().unwrap().keys() {
                let id = k.rsplit('/').next().unwrap();
                assert!(
                    id.len() <= 32 && id.chars().all(|c| c.is_ascii_alphanumeric()),
                    "{k}"
                );
            }
        }
    }

    #[test]
    fn soft_device_and_pf_without_vfs_are_devices() {
        let mut fx = FixtureHost::unknown_numa().unwrap();
        let pf = sriov_helpers::PciAddress::new(0, 5, 0, 0);
        fx.set_num_vfs(&pf, 0).unwrap();
        fx.add_virtual_netdev("eth9", "02:00:00:00:00:09", 1500)
            .unwrap();
        fx.add_rxe("rxe0", "eth9").unwrap();
        let facts = HostFacts::scan(&fx.root(), &mut Memory::default());
        let devs = devices(&facts, &BTreeSet::new());
        let names: Vec<&str> = devs.iter().map(|p| p.device.name.as_str()).collect();
        assert_eq!(
            names,
            ["pf-0000-05-00-0", "soft-rxe0"],
            "{:?}",
            facts.errors
        );
        let pf = &devs[0].device;
        assert_eq!(attr(pf, "type").string.as_deref(), Some("pci"));
        assert!(
            pf.attributes.as_ref().unwrap().get("numaNode").is_none(),
            "NUMA -1 is no attribute"
        );
        let rxe = &devs[1].device;
        assert_eq!(attr(rxe, "type").string.as_deref(), Some("soft"));
        assert_eq!(attr(rxe, "netdev").string.as_deref(), Some("eth9"));
        assert!(rxe.attributes.as_ref().unwrap().get("pciAddress").is_none());
    }

    #[test]
    fn unhealthy_vf_is_tainted_and_in_use_is_not() {
        let fx = FixtureHost::connectx6dx_pair().unwrap();
        fx.set_operstate("ens1f0v1", "down").unwrap();
        let facts = HostFacts::scan(&fx.root(), &mut Memory::default());
        let devs = devices(&facts, &BTreeSet::new());
        let d = &devs
            .iter()
            .find(|p| p.device.name == "vf-0000-3b-00-3")
            .unwrap()
            .device;
        assert_eq!(attr(d, "healthy").bool, Some(false));
        assert_eq!(d.taints.as_ref().unwrap()[0].key, UNHEALTHY_TAINT);
        // A prepared VF whose netdev moved into a pod is healthy.
        fx.remove_netdev("ens1f0v2").unwrap();
        let facts = HostFacts::scan(&fx.root(), &mut Memory::default());
        let in_use = BTreeSet::from(["vf-0000-3b-00-4".to_string()]);
        let devs = devices(&facts, &in_use);
        let d = &devs
            .iter()
            .find(|p| p.device.name == "vf-0000-3b-00-4")
            .unwrap()
            .device;
        assert_eq!(attr(d, "healthy").bool, Some(true), "{:?}", d.attributes);
    }

    #[test]
    fn generation_moves_only_when_content_changes() {
        let mut fx = FixtureHost::connectx6dx_pair().unwrap();
        let root = fx.root();
        let mut mem = Memory::default();
        let scan = |mem: &mut Memory| {
            let f = HostFacts::scan(&root, mem);
            devices(&f, &BTreeSet::new())
                .into_iter()
                .map(|p| p.device)
                .collect::<Vec<_>>()
        };
        let mut pool = Pool::new("node-a");
        let first = pool.update(scan(&mut mem)).unwrap();
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].spec.pool.generation, 1);
        assert_eq!(first[0].spec.pool.name, "node-a");
        assert_eq!(first[0].spec.node_name.as_deref(), Some("node-a"));
        assert_eq!(first[0].spec.driver, DRIVER_NAME);
        assert!(pool.update(scan(&mut mem)).is_none(), "same host, no write");
        // A VF goes away: new content, next generation, the VF is gone.
        fx.set_num_vfs(&sriov_helpers::PciAddress::new(0, 0x3b, 0, 0), 7)
            .unwrap();
        let second = pool.update(scan(&mut mem)).unwrap();
        assert_eq!(second[0].spec.pool.generation, 2);
        let names: Vec<_> = second[0]
            .spec
            .devices
            .as_ref()
            .unwrap()
            .iter()
            .map(|d| d.name.clone())
            .collect();
        assert_eq!(names.len(), 15);
        assert!(!names.contains(&"vf-0000-3b-01-1".to_string()), "{names:?}");
        // After a restart with the same content in the API: nothing to write.
        let devs = second[0].spec.devices.clone();
        let mut resumed = Pool::resume("node-a", 2, devs);
        assert!(resumed.update(scan(&mut mem)).is_none());
        resumed.invalidate();
        assert_eq!(
            resumed.update(scan(&mut mem)).unwrap()[0]
                .spec
                .pool
                .generation,
            3
        );
    }

    #[test]
    fn large_pools_split_into_valid_slices() {
        let dir = crate::testing::scratch_dir("kroce-dra-").unwrap();
        let fx = crate::testing::many_at(dir.path(), 8, 64).unwrap();
        let facts = HostFacts::scan(&fx.root(), &mut Memory::default());
        let devs: Vec<Device> = devices(&facts, &BTreeSet::new())
            .into_iter()
            .map(|p| p.device)
            .collect();
        assert_eq!(devs.len(), 512, "{:?}", facts.errors);
        let s = slices("n", 4, &devs);
        assert_eq!(s.len(), 8);
        for (i, sl) in s.iter().enumerate() {
            assert_eq!(
                sl.metadata.name.as_deref(),
                Some(slice_name("n", i).as_str())
            );
            assert_eq!(sl.spec.pool.resource_slice_count, 8);
            assert_eq!(sl.spec.pool.generation, 4);
            assert!(sl.spec.devices.as_ref().unwrap().len() <= DEVICES_PER_SLICE);
        }
        let empty = slices("n", 1, &[]);
        assert_eq!(empty.len(), 1);
        assert_eq!(empty[0].spec.devices.as_deref(), Some(&[][..]));
    }
}
