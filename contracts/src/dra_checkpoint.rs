//! The DRA plugin's checkpoint of prepared claims,
//! `<DRA state dir>/checkpoint.json` (default
//! `/var/lib/kroce/dra/checkpoint.json`), version 1. The DRA plugin writes
//! it (atomically and fsynced, after every change: `dra/src/checkpoint.rs`)
//! and reads it back at start; the node agent reads it to know which VFs
//! prepared claims hold. One shape and one reader ([`load`]) for both, so
//! the node agent needs nothing of the plugin.
//!
//! ```json
//! {"version":1,"claims":{"<claim uid>":{"namespace":"ns","name":"c",
//!   "devices":[{"requestNames":["vf"],"pool":"node-a","device":"vf-0000-3b-00-2",
//!     "cdiDeviceIds":["rdma.kroce.io/claim=<uid>-vf-0000-3b-00-2"],
//!     "config":{"vlan":100,"attach":false}}],
//!   "files":["/var/run/cdi/rdma.kroce.io-claim_<uid>.json"]}}}
//! ```
//!
//! Unknown fields are ignored, so a writer may add some without a new
//! version.

use crate::mac::Mac;
use crate::memlock::Memlock;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub const FILE_NAME: &str = "checkpoint.json";
pub const VERSION: u32 = 1;

/// The checkpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub version: u32,
    /// By claim UID.
    pub claims: BTreeMap<String, PreparedClaim>,
}

/// A prepared claim: what to answer again and what to remove at unprepare.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreparedClaim {
    pub namespace: String,
    pub name: String,
    pub devices: Vec<PreparedDevice>,
    pub files: Vec<PathBuf>,
}

/// One device of a prepared claim, as NodePrepareResources returns it, with
/// the effective configuration of its (first) request, kept for the
/// network attach step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreparedDevice {
    pub request_names: Vec<String>,
    pub pool: String,
    pub device: String,
    pub cdi_device_ids: Vec<String>,
    #[serde(default)]
    pub config: ClaimConfig,
}

/// How the RDMA device follows the netdev into the pod (the CNI's modes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NetnsMode {
    Shared,
    Exclusive,
}

/// The effective configuration of one request's devices (the DRA plugin
/// parses and checks it from the claim's opaque config).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vlan: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// A CNI IPAM configuration (passed on to the IPAM plugin as is).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipam: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memlock: Option<Memlock>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rdma_netns_mode: Option<NetnsMode>,
    /// The netdev's name in the pod (kernel rules, not `lo`/`eth0`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface_name: Option<String>,
    /// A unicast MAC (written lower-case `aa:bb:cc:dd:ee:ff`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<Mac>,
    /// `Some(false)`: the VF is not moved into the pod (char devices only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attach: Option<bool>,
}

impl ClaimConfig {
    /// `other`'s fields over these.
    pub fn overlay(&mut self, other: ClaimConfig) {
        self.vlan = other.vlan.or(self.vlan);
        self.mtu = other.mtu.or(self.mtu);
        self.ipam = other.ipam.or(self.ipam.take());
        self.memlock = other.memlock.or(self.memlock);
        self.rdma_netns_mode = other.rdma_netns_mode.or(self.rdma_netns_mode);
        self.interface_name = other.interface_name.or(self.interface_name.take());
        self.mac = other.mac.or(self.mac.take());
        self.attach = other.attach.or(self.attach);
    }
}

impl Checkpoint {
    /// An empty checkpoint of this version.
    pub fn empty() -> Checkpoint {
        Checkpoint {
            version: VERSION,
            claims: BTreeMap::new(),
        }
    }

    /// Device name → UID of the claim it is prepared for.
    pub fn devices(&self) -> BTreeMap<String, String> {
        self.claims
            .iter()
            .flat_map(|(uid, c)| {
                c.devices
                    .iter()
                    .map(move |d| (d.device.clone(), uid.clone()))
            })
            .collect()
    }
}

/// Why a checkpoint cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read checkpoint {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("checkpoint {path} is not a version {VERSION} checkpoint: {message}")]
    Parse { path: PathBuf, message: String },
}

/// Parses a checkpoint's bytes (`path` names it in errors); another
/// version is an error.
pub fn parse(path: &Path, bytes: &[u8]) -> Result<Checkpoint, LoadError> {
    let cp: Checkpoint = serde_json::from_slice(bytes).map_err(|e| LoadError::Parse {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    if cp.version != VERSION {
        return Err(LoadError::Parse {
            path: path.to_path_buf(),
            message: format!("version {}", cp.version),
        });
    }
    Ok(cp)
}

/// The checkpoint at `path`; `None` when there is none (no claim prepared
/// yet, or no DRA plugin on the node).
pub fn load(path: &Path) -> Result<Option<Checkpoint>, LoadError> {
    match std::fs::read(path) {
        Ok(bytes) => parse(path, &bytes).map(Some),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(LoadError::Read {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// The checkpoint's bytes as the plugin writes them (pretty JSON).
pub fn to_bytes(cp: &Checkpoint) -> Result<Vec<u8>, serde_json::Error> {
    serde_json::to_vec_pretty(cp)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A checkpoint as the DRA plugin wrote it before the shape moved here.
    const OLD: &str = r#"{
  "version": 1,
  "claims": {
    "6f1c": {
      "namespace": "ns",
      "name": "c",
      "devices": [
        {
          "requestNames": [
            "vf"
          ],
          "pool": "node-a",
          "device": "vf-0000-3b-00-2",
          "cdiDeviceIds": [
            "rdma.kroce.io/claim=6f1c-vf-0000-3b-00-2"
          ],
          "config": {
            "vlan": 100,
            "memlock": 68719476736,
            "rdmaNetnsMode": "exclusive",
            "mac": "02:00:00:00:00:01",
            "attach": false
          }
        }
      ],
      "files": [
        "/var/run/cdi/rdma.kroce.io-claim_6f1c.json"
      ]
    }
  }
}"#;

    #[test]
    fn reads_what_the_plugin_wrote_and_writes_it_the_same() {
        let cp = parse(Path::new("checkpoint.json"), OLD.as_bytes()).unwrap();
        let c = &cp.claims["6f1c"];
        assert_eq!((c.namespace.as_str(), c.name.as_str()), ("ns", "c"));
        let d = &c.devices[0];
        assert_eq!(d.device, "vf-0000-3b-00-2");
        assert_eq!(d.config.attach, Some(false));
        assert_eq!(d.config.rdma_netns_mode, Some(NetnsMode::Exclusive));
        assert_eq!(d.config.memlock, Some(Memlock::Bytes(64 << 30)));
        assert_eq!(
            cp.devices(),
            BTreeMap::from([("vf-0000-3b-00-2".to_string(), "6f1c".to_string())])
        );
        // Written back byte for byte.
        assert_eq!(String::from_utf8(to_bytes(&cp).unwrap()).unwrap(), OLD);
    }

    #[test]
    fn missing_is_none_and_bad_ones_name_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        assert!(load(&path).unwrap().is_none());
        std::fs::write(&path, r#"{"version": 2, "claims": {}}"#).unwrap();
        let e = load(&path).unwrap_err().to_string();
        assert!(
            e.contains("version 2") && e.contains("checkpoint.json"),
            "{e}"
        );
        std::fs::write(&path, "{torn").unwrap();
        let e = load(&path).unwrap_err().to_string();
        assert!(e.contains("checkpoint.json"), "{e}");
        let e = load(dir.path()).unwrap_err();
        assert!(matches!(e, LoadError::Read { .. }), "{e}");
        std::fs::write(&path, to_bytes(&Checkpoint::empty()).unwrap()).unwrap();
        assert_eq!(load(&path).unwrap(), Some(Checkpoint::empty()));
    }
}
