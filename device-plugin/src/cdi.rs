//! CDI (Container Device Interface) specs: in CDI mode each pool's devices
//! are described in `<cdi-dir>/kroce.io-<class>.json` with kind
//! `kroce.io/<class>` (class = resource name with `/` as `_`), and Allocate
//! returns fully qualified names like `kroce.io/rdma_vf=0000-3b-00.2`.

use crate::inventory::Candidate;
use crate::resource_name::{ResourceName, VENDOR_DOMAIN};
use crate::snapshot::PoolSnapshot;
/// The spec file's shape is a contract (the DRA plugin writes it too).
pub use kroce_contracts::cdi::{
    CDI_VERSION, ContainerEdits, Device, DeviceNode, Spec, device_name,
};
use kroce_inventory::device_nodes::device_nodes;
pub use kroce_inventory::device_nodes::device_nodes_on;
use std::path::Path;

/// `kroce.io/rdma_vf=0000-3b-00.2`.
pub fn qualified_name(resource: &ResourceName, id: &str) -> String {
    format!("{}={}", resource.cdi_kind(), device_name(id))
}

/// The spec file name of a pool inside the CDI dir.
pub fn file_name(resource: &ResourceName) -> String {
    format!("{VENDOR_DOMAIN}-{}.json", resource.underscored())
}

/// The spec for every device of a pool; `None` when it has none (an empty
/// spec is invalid). Device nodes without mode or owner: see
/// [`spec_for_pool_on`].
pub fn spec_for_pool(pool: &PoolSnapshot) -> Option<Spec> {
    spec_with(pool, |c| {
        device_nodes(c)
            .into_iter()
            .map(|n| n.into_cdi(None))
            .collect()
    })
}

/// [`spec_for_pool`] with each device node's mode and owner taken from the
/// host's node under `dev_infiniband` ([`device_nodes_on`]).
pub fn spec_for_pool_on(pool: &PoolSnapshot, dev_infiniband: &Path) -> Option<Spec> {
    spec_with(pool, |c| device_nodes_on(c, dev_infiniband))
}

fn spec_with(pool: &PoolSnapshot, nodes: impl Fn(&Candidate) -> Vec<DeviceNode>) -> Option<Spec> {
    if pool.devices.is_empty() {
        return None;
    }
    Some(Spec {
        cdi_version: CDI_VERSION.into(),
        kind: pool.pool.resource.cdi_kind(),
        devices: pool
            .devices
            .values()
            .map(|d| Device {
                name: device_name(&d.id),
                container_edits: ContainerEdits {
                    device_nodes: nodes(&d.candidate),
                },
            })
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        let r = ResourceName::parse("rdma/vf").unwrap();
        assert_eq!(
            qualified_name(&r, "0000:3b:00.2"),
            "kroce.io/rdma_vf=0000-3b-00.2"
        );
        assert_eq!(
            qualified_name(&r, "0000:3b:00.0-7"),
            "kroce.io/rdma_vf=0000-3b-00.0-7"
        );
        assert_eq!(device_name("rxe0"), "rxe0");
        assert_eq!(file_name(&r), "kroce.io-rdma_vf.json");
    }

    /// The spec's device nodes carry the host nodes' mode and owner: a
    /// 0600 `umadN` stays 0600 in the container (without `fileMode` the
    /// runtime made it 0666).
    #[test]
    fn device_nodes_keep_the_host_nodes_mode_and_owner() {
        use crate::config::{Format, parse};
        use crate::host_view::HostView;
        use crate::inventory::{Memory, candidates};
        use crate::snapshot::Snapshot;
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let (_dir, fx) = crate::testing::connectx_pair();
        let dev = fx.root().dev_infiniband();
        for e in std::fs::read_dir(&dev).unwrap() {
            let p = e.unwrap().path();
            let umad = p.file_name().unwrap().to_string_lossy().starts_with("umad");
            let mode = if umad { 0o600 } else { 0o666 };
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        }
        let cfg = parse(
            "pools:\n- resourceName: vf\n  selectors: {devices: [\"101e\"]}\n",
            Format::Yaml,
        )
        .unwrap();
        let c = candidates(&HostView::scan(&fx.root()), &mut Memory::default());
        let snap = Snapshot::build(&cfg, c, &|_, _| false);
        let spec = spec_for_pool_on(&snap.pools[0], &dev).unwrap();
        let owner = std::fs::metadata(&dev).unwrap();
        let d = &spec.devices[0];
        assert_eq!(d.container_edits.device_nodes.len(), 3);
        for n in &d.container_edits.device_nodes {
            let want = if n.path.contains("umad") {
                0o600
            } else {
                0o666
            };
            assert_eq!(n.file_mode, Some(want), "{n:?}");
            assert_eq!(n.uid, Some(owner.uid()));
            assert_eq!(n.gid, Some(owner.gid()));
        }
        // On the wire: CDI's `fileMode` is a number.
        let json = serde_json::to_value(&spec).unwrap();
        let umad = json["devices"][0]["containerEdits"]["deviceNodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["path"].as_str().unwrap().contains("umad"))
            .unwrap()
            .clone();
        assert_eq!(umad["fileMode"], 384);
        // Nodes that cannot be read go without (the runtime's default).
        let gone = spec_for_pool_on(&snap.pools[0], &dev.join("missing")).unwrap();
        assert_eq!(
            gone.devices[0].container_edits.device_nodes[0].file_mode,
            None
        );
    }
}
