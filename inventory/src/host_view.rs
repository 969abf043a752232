//! Edge: one read of the host — the sriov-helpers host model plus the two
//! facts health needs that it does not carry: which nodes exist under
//! `<dev>/infiniband`, and each netdev's administrative state (`flags`).

use sriov_helpers::{Host, HostRoot};
use std::collections::{BTreeMap, BTreeSet};
use std::hash::{Hash, Hasher};
use std::path::Path;

/// `IFF_UP` in `sys/class/net/<if>/flags`.
const IFF_UP: u32 = 0x1;

#[derive(Debug, Default)]
pub struct HostView {
    pub host: Host,
    /// Names present under `<dev>/infiniband` at scan time.
    pub dev_nodes: BTreeSet<String>,
    /// Admin state per netdev, where `flags` is readable. A VF nobody has
    /// configured yet is admin-down; that is not a fault.
    pub admin_up: BTreeMap<String, bool>,
}

impl HostView {
    pub fn scan(root: &HostRoot) -> HostView {
        let host = Host::scan(root);
        let dev_nodes = std::fs::read_dir(root.dev_infiniband())
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        let admin_up = host
            .netdevs
            .keys()
            .filter_map(|name| {
                let text =
                    std::fs::read_to_string(root.class_net().join(name).join("flags")).ok()?;
                let t = text.trim();
                let flags = u32::from_str_radix(t.strip_prefix("0x").unwrap_or(t), 16).ok()?;
                Some((name.clone(), flags & IFF_UP != 0))
            })
            .collect();
        HostView {
            host,
            dev_nodes,
            admin_up,
        }
    }
}

fn hash_dir(h: &mut impl Hasher, dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names.hash(h);
    names
}

fn hash_file(h: &mut impl Hasher, path: &Path) {
    std::fs::read(path).ok().hash(h);
}

/// A cheap fingerprint of what health and discovery depend on: which PCI
/// functions, netdevs, RDMA devices, char devices and `/dev` nodes exist,
/// and each netdev's operstate, carrier and flags. A full scan of a host
/// with hundreds of VFs costs far more; it is only needed when this changes
/// (plus now and then for what this leaves out, like GID tables).
pub fn probe(root: &HostRoot, extra: &[&Path]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    hash_dir(&mut h, &root.pci_devices());
    for name in hash_dir(&mut h, &root.class_net()) {
        let dir = root.class_net().join(name);
        for f in ["operstate", "carrier", "flags"] {
            hash_file(&mut h, &dir.join(f));
        }
    }
    hash_dir(&mut h, &root.class_infiniband());
    hash_dir(&mut h, &root.class_verbs());
    hash_dir(&mut h, &root.class_mad());
    hash_dir(&mut h, &root.dev_infiniband());
    for p in extra {
        hash_file(&mut h, p);
    }
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_changes_with_what_health_reads() {
        let (_dir, mut fx) = crate::testing::connectx_pair();
        let root = fx.root();
        let base = probe(&root, &[]);
        assert_eq!(probe(&root, &[]), base);
        fx.set_operstate("ens1f0v1", "down").unwrap();
        let down = probe(&root, &[]);
        assert_ne!(down, base);
        fx.set_operstate("ens1f0v1", "up").unwrap();
        assert_eq!(probe(&root, &[]), base);
        fx.remove_char_device("uverbs3").unwrap();
        assert_ne!(probe(&root, &[]), base);
        fx.restore_char_device("uverbs3").unwrap();
        let pf = sriov_helpers::PciAddress::new(0, 0x3b, 0, 0);
        fx.set_num_vfs(&pf, 7).unwrap();
        assert_ne!(probe(&root, &[]), base);
    }
}
