//! Network attachment of DRA-prepared VFs, without Multus: the request the
//! DRA plugin writes at NodePrepareResources, and the result kroce-nri
//! writes back after attaching the VF at RunPodSandbox.
//!
//! Both live in `<kroce-cni state dir>/dra-attach/` (default
//! `/var/lib/cni/kroce/dra-attach`), keyed by claim UID:
//!
//! - `<claim uid>.json`, [`AttachRequest`], version 1:
//!
//!   ```json
//!   {"version":1,"claimUid":"…","claimNamespace":"ns","claimName":"c",
//!    "podUids":["…"],
//!    "devices":[{"device":"vf-0000-3b-00-2","pool":"node-a","request":"vf",
//!      "pciAddress":"0000:3b:00.2","netdev":"ens1f0v0","rdmaDevice":"mlx5_2",
//!      "interfaceName":"net1","vlan":100,"mtu":9000,"mac":"02:…","rdma":true,
//!      "ipam":{"type":"host-local","ranges":[[{"subnet":"10.56.0.0/16"}]]}}]}
//!   ```
//!   `podUids` are the claim's `status.reservedFor` pods; `rdma` true: the
//!   RDMA device must follow the netdev (exclusive), false: it stays
//!   (shared), absent: follows when the host is in exclusive mode.
//! - `<claim uid>.result.json`, [`AttachResult`], written by kroce-nri once
//!   every device of the claim is attached, removed at release; the DRA
//!   plugin reports it as the claim's `status.devices[].networkData`.
//!
//! Unknown fields are ignored, so a writer may add some without a new
//! version. The I/O stays with the writers and readers.

use crate::mac::Mac;
use serde::{Deserialize, Serialize};
use sriov_helpers::PciAddress;
use std::path::{Path, PathBuf};

/// The subdirectory of kroce-cni's state dir.
pub const DIR_NAME: &str = "dra-attach";
/// `<default kroce-cni state dir>/dra-attach`.
pub const DEFAULT_DIR: &str = "/var/lib/cni/kroce/dra-attach";
pub const FILE_VERSION: u32 = 1;
pub const REQUEST_SUFFIX: &str = ".json";
pub const RESULT_SUFFIX: &str = ".result.json";
/// The CNI network name of every DRA attachment: kroce-cni records it in
/// its claims (how kroce-nri finds its own attachments at release), and
/// host-local keeps its leases under it, so all DRA claims on a node share
/// one lease directory (no address given twice across claims).
pub const CNI_NETWORK_NAME: &str = "rdma.kroce.io";
/// Interfaces without an explicit name are `net1`, `net2`, …
pub const IFNAME_PREFIX: &str = "net";
/// Names a DRA attachment may not take: the loopback and the primary
/// network's interface.
pub const RESERVED_IFNAMES: &[&str] = &["lo", "eth0"];

/// One device to attach.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceAttach {
    /// The DRA device name (`vf-0000-3b-00-2`) and its pool.
    pub device: String,
    pub pool: String,
    /// The first request it was allocated for.
    pub request: String,
    pub pci_address: PciAddress,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netdev: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rdma_device: Option<String>,
    /// Fixed by the claim's config; absent: assigned (`netN`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vlan: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<Mac>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rdma: Option<bool>,
    /// A CNI IPAM object, given to the IPAM plugin as is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipam: Option<serde_json::Value>,
}

/// `<claim uid>.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AttachRequest {
    pub version: u32,
    pub claim_uid: String,
    pub claim_namespace: String,
    pub claim_name: String,
    pub pod_uids: Vec<String>,
    pub devices: Vec<DeviceAttach>,
}

/// What one device got, as `status.devices[].networkData` has it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceNetwork {
    pub device: String,
    pub pool: String,
    pub interface_name: String,
    /// CIDR notation (`10.56.0.2/16`).
    #[serde(default)]
    pub ips: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hardware_address: Option<Mac>,
}

/// `<claim uid>.result.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AttachResult {
    pub version: u32,
    pub claim_uid: String,
    pub claim_namespace: String,
    pub claim_name: String,
    pub pod_uid: String,
    pub sandbox_id: String,
    pub netns: String,
    pub devices: Vec<DeviceNetwork>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("claim uid {uid:?} is not usable as a file name (1-128 letters, digits and '-')")]
pub struct ClaimUidError {
    pub uid: String,
}

fn check_uid(uid: &str) -> Result<(), ClaimUidError> {
    let ok = (1..=128).contains(&uid.len())
        && uid.as_bytes()[0].is_ascii_alphanumeric()
        && uid.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(ClaimUidError {
            uid: uid.to_string(),
        })
    }
}

/// `<state dir>/dra-attach`.
pub fn dir(cni_state_dir: &Path) -> PathBuf {
    cni_state_dir.join(DIR_NAME)
}

pub fn request_path(dir: &Path, claim_uid: &str) -> Result<PathBuf, ClaimUidError> {
    check_uid(claim_uid)?;
    Ok(dir.join(format!("{claim_uid}{REQUEST_SUFFIX}")))
}

pub fn result_path(dir: &Path, claim_uid: &str) -> Result<PathBuf, ClaimUidError> {
    check_uid(claim_uid)?;
    Ok(dir.join(format!("{claim_uid}{RESULT_SUFFIX}")))
}

/// Which kind of file a directory entry is, by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileKind {
    Request(String),
    Result(String),
}

/// Classifies a file name of the directory (temp files and others: `None`).
pub fn classify(file_name: &str) -> Option<FileKind> {
    if let Some(uid) = file_name.strip_suffix(RESULT_SUFFIX) {
        return check_uid(uid).ok().map(|()| FileKind::Result(uid.into()));
    }
    let uid = file_name.strip_suffix(REQUEST_SUFFIX)?;
    check_uid(uid).ok().map(|()| FileKind::Request(uid.into()))
}

/// The kernel's `dev_valid_name` (1-15 bytes, not `.`/`..`, no `/`, `:` or
/// whitespace, the rule kroce-cni applies to `CNI_IFNAME`), and none of
/// [`RESERVED_IFNAMES`].
pub fn check_ifname(name: &str) -> Result<(), AttachIfnameError> {
    let bad = |why| {
        Err(AttachIfnameError {
            name: name.to_string(),
            why,
        })
    };
    if name.is_empty() || name.len() > 15 {
        return bad(IfnameRule::Length);
    }
    if name == "." || name == ".." {
        return bad(IfnameRule::Dots);
    }
    if let Some(c) = name
        .chars()
        .find(|c| *c == '/' || *c == ':' || c.is_whitespace() || c.is_control())
    {
        return bad(IfnameRule::Char(c));
    }
    if RESERVED_IFNAMES.contains(&name) {
        return bad(IfnameRule::Reserved);
    }
    Ok(())
}

/// A pod interface name [`check_ifname`] refuses, and the rule it breaks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{name:?} {why}")]
pub struct AttachIfnameError {
    pub name: String,
    pub why: IfnameRule,
}

/// The rule of [`check_ifname`] a name breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum IfnameRule {
    #[error("must be 1 to 15 bytes")]
    Length,
    #[error("cannot be '.' or '..'")]
    Dots,
    #[error("contains {0:?}")]
    Char(char),
    #[error("is reserved (the loopback or the primary network's interface)")]
    Reserved,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_classification() {
        let d = dir(Path::new(crate::DEFAULT_STATE_DIR));
        assert_eq!(d, Path::new(DEFAULT_DIR));
        assert_eq!(
            request_path(&d, "u-1").unwrap(),
            Path::new("/var/lib/cni/kroce/dra-attach/u-1.json")
        );
        assert_eq!(
            result_path(&d, "u-1").unwrap(),
            Path::new("/var/lib/cni/kroce/dra-attach/u-1.result.json")
        );
        assert!(request_path(&d, "../x").is_err());
        assert!(result_path(&d, "").is_err());
        assert_eq!(classify("u-1.json"), Some(FileKind::Request("u-1".into())));
        assert_eq!(
            classify("u-1.result.json"),
            Some(FileKind::Result("u-1".into()))
        );
        assert_eq!(classify(".u-1.json.tmp"), None);
        assert_eq!(classify("a.b.json"), None);
    }

    #[test]
    fn ifnames() {
        assert!(check_ifname("net1").is_ok());
        assert!(check_ifname("rdma0").is_ok());
        for bad in [
            "",
            "eth0",
            "lo",
            "a/b",
            "a b",
            "x:1",
            "..",
            "sixteen-chars-xx",
        ] {
            let e = check_ifname(bad).unwrap_err().to_string();
            assert!(e.contains(&format!("{bad:?}")), "{bad}: {e}");
        }
    }

    #[test]
    fn request_round_trip_in_camel_case() {
        let r = AttachRequest {
            version: FILE_VERSION,
            claim_uid: "u".into(),
            claim_namespace: "ns".into(),
            claim_name: "c".into(),
            pod_uids: vec!["p".into()],
            devices: vec![DeviceAttach {
                device: "vf-0000-3b-00-2".into(),
                pool: "n".into(),
                request: "vf".into(),
                pci_address: PciAddress::new(0, 0x3b, 0, 2),
                netdev: Some("ens1f0v0".into()),
                rdma_device: None,
                interface_name: None,
                vlan: Some(100),
                mtu: None,
                mac: None,
                rdma: Some(true),
                ipam: None,
            }],
        };
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["podUids"][0], "p");
        assert_eq!(v["devices"][0]["pciAddress"], "0000:3b:00.2");
        assert!(v["devices"][0].get("mtu").is_none());
        let back: AttachRequest = serde_json::from_value(v).unwrap();
        assert_eq!(back, r);
    }

    /// Files as the DRA plugin and kroce-nri wrote them while the MAC was a
    /// string: read, typed, and written back byte for byte.
    #[test]
    fn old_files_round_trip_with_a_typed_mac() {
        let request = r#"{"version":1,"claimUid":"u","claimNamespace":"ns","claimName":"c","podUids":["p"],"devices":[{"device":"vf-0000-3b-00-2","pool":"n","request":"vf","pciAddress":"0000:3b:00.2","netdev":"ens1f0v0","interfaceName":"net1","vlan":100,"mtu":9000,"mac":"02:00:00:00:00:0a","rdma":true,"ipam":{"type":"host-local"}}]}"#;
        let r: AttachRequest = serde_json::from_str(request).unwrap();
        assert_eq!(r.devices[0].mac, Some(Mac([2, 0, 0, 0, 0, 0x0a])));
        assert_eq!(r.devices[0].pci_address, PciAddress::new(0, 0x3b, 0, 2));
        assert_eq!(serde_json::to_string(&r).unwrap(), request);
        let result = r#"{"version":1,"claimUid":"u","claimNamespace":"ns","claimName":"c","podUid":"p","sandboxId":"s","netns":"/var/run/netns/cni-1","devices":[{"device":"vf-0000-3b-00-2","pool":"n","interfaceName":"net1","ips":["10.56.0.2/16"],"hardwareAddress":"02:00:00:00:00:0a"}]}"#;
        let r: AttachResult = serde_json::from_str(result).unwrap();
        assert_eq!(
            r.devices[0].hardware_address,
            Some(Mac([2, 0, 0, 0, 0, 0x0a]))
        );
        assert_eq!(serde_json::to_string(&r).unwrap(), result);
        // A MAC or a PCI address that is not one is refused, naming it.
        let bad = request.replace("02:00:00:00:00:0a", "02:00:00:00:0a");
        let e = serde_json::from_str::<AttachRequest>(&bad).unwrap_err();
        assert!(e.to_string().contains("02:00:00:00:0a"), "{e}");
        let bad = request.replace("0000:3b:00.2", "../../etc");
        let e = serde_json::from_str::<AttachRequest>(&bad).unwrap_err();
        assert!(e.to_string().contains("../../etc"), "{e}");
    }
}
