//! Device-info files (k8snetworkplumbingwg device-info-spec 1.1.0): what
//! Multus and kroce's CNI read to learn which VF a pod got, at
//! `<devinfo-dir>/<resource with / as ->-<device id>-device.json`. The
//! format is [`kroce_contracts::device_info`], what a candidate's is
//! [`kroce_inventory::device_info`]; here, the file name of a resource's device.

use crate::resource_name::ResourceName;
pub use kroce_contracts::device_info::{DeviceInfo, PciInfo, SPEC_VERSION};
pub use kroce_inventory::device_info::for_candidate;

/// The file name for one device of a resource.
pub fn file_name(resource: &ResourceName, device_id: &str) -> String {
    kroce_contracts::device_info::file_name(&resource.device_info_prefix(), device_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_name_uses_the_resource_prefix() {
        let r = ResourceName::parse("rdma/vf").unwrap();
        assert_eq!(
            file_name(&r, "0000:3b:00.2"),
            "rdma-vf-0000:3b:00.2-device.json"
        );
    }
}
