//! Pure core of NodePrepareResources: from a claim's allocation and the
//! published devices to the files to write and the answer to give. Nothing
//! here touches the host; [`crate::driver`] applies a [`Plan`].
//!
//! Per prepared claim:
//! - one CDI spec `<cdi>/rdma.kroce.io-claim_<uid>.json`, kind
//!   `rdma.kroce.io/claim`, one CDI device `<uid>-<device>` per device: its
//!   `/dev/infiniband` nodes (uverbs, umad/issm where the device has them,
//!   `rdma_cm`) and env `KROCE_DRA_<DEVICE>_{PCI_ADDRESS,RDMA_DEVICE,INFO}`
//!   (INFO: the JSON the device plugin gives in `PCIDEVICE_<RES>_INFO`) and
//!   `KROCE_DRA_CLAIM_<UID>=<namespace>/<name>`;
//! - a device-info file (device-info-spec 1.1.0) per device with a PCI
//!   address: `<devinfo>/rdma.kroce.io-<uid>-<device>-device.json`;
//! - when a request's configuration sets `memlock` and a memlock dir is
//!   configured: `<memlock dir>/<uid>.json` in the memlock request file
//!   format of `kroce_contracts::memlock_file` (containerID = claim UID,
//!   one attachment per device, network = request name);
//! - when a network dir is configured, for the claim's exclusive VFs with a
//!   netdev (not shared-HCA slots, not `attach: false`): the network-attach
//!   request `<network dir>/<uid>.json` ([`crate::network`]) kroce-nri acts
//!   on at RunPodSandbox; its result file is removed with the claim.

use crate::claims::{Allocation, ClaimRef};
use crate::config::{self, ClaimConfig, ClaimConfigError};
use crate::driver::DRIVER_NAME;
use crate::slice::Published;
use kroce_contracts::cdi::CDI_VERSION;
use kroce_contracts::memlock_file::{self, AttachmentMemlock, SandboxMemlock};
use kroce_contracts::network_attach;
use kroce_inventory::device_nodes::{device_facts, device_nodes};
use kroce_inventory::inventory::Candidate;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// CDI kind of the devices this driver prepares.
pub const CDI_KIND: &str = "rdma.kroce.io/claim";

/// Where prepared files go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Paths {
    pub cdi_dir: PathBuf,
    pub devinfo_dir: PathBuf,
    /// `None`: memlock requests are not recorded.
    pub memlock_dir: Option<PathBuf>,
    /// `None`: VFs are not attached to pods (no network-attach requests).
    pub network_dir: Option<PathBuf>,
    /// The host's `/dev/infiniband` as this plugin sees it: each CDI device
    /// node gets the mode and owner of the host's node there (else the
    /// runtime makes it 0666). `None`: no mode or owner in the specs.
    pub dev_infiniband: Option<PathBuf>,
}

/// A prepared claim and its devices, as the checkpoint keeps them.
pub use kroce_contracts::dra_checkpoint::{PreparedClaim, PreparedDevice};

/// What to do for one claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub claim: PreparedClaim,
    /// (path, content), written in this order.
    pub writes: Vec<(PathBuf, Vec<u8>)>,
}

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("claim uid {uid:?} is not usable in file names (1-128 letters, digits and '-')")]
    BadUid { uid: String },
    #[error(transparent)]
    Config(#[from] ClaimConfigError),
    #[error("device {device} of request {request} is in pool {pool}, not this node's pool {node}")]
    WrongPool {
        request: String,
        device: String,
        pool: String,
        node: String,
    },
    #[error(
        "device {device} of request {request} is not published by this node (gone since allocation?)"
    )]
    UnknownDevice { request: String, device: String },
    #[error("device {device} is already prepared for claim {other}")]
    AlreadyPrepared { device: String, other: String },
    #[error(transparent)]
    Network(#[from] crate::network::NetworkPlanError),
    #[error("cannot encode {what}: {message}")]
    Encode { what: String, message: String },
}

/// Kubernetes UIDs are UUIDs; anything else cannot name our files.
pub fn check_uid(uid: &str) -> Result<(), PlanError> {
    let ok = !uid.is_empty()
        && uid.len() <= 128
        && uid.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        && uid.as_bytes()[0].is_ascii_alphanumeric();
    if ok {
        Ok(())
    } else {
        Err(PlanError::BadUid {
            uid: uid.to_string(),
        })
    }
}

pub fn cdi_file(paths: &Paths, uid: &str) -> PathBuf {
    paths
        .cdi_dir
        .join(format!("{DRIVER_NAME}-claim_{uid}.json"))
}

pub fn devinfo_file(paths: &Paths, uid: &str, device: &str) -> PathBuf {
    paths
        .devinfo_dir
        .join(format!("{DRIVER_NAME}-{uid}-{device}-device.json"))
}

/// `rdma.kroce.io/claim=<uid>-<device>`.
pub fn cdi_device_id(uid: &str, device: &str) -> String {
    format!("{CDI_KIND}={uid}-{device}")
}

/// `vf-0000-3b-00-2` → `VF_0000_3B_00_2`.
fn env_part(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect()
}

/// The env name through which a container finds its claim (and kroce-nri
/// the claim's memlock request): `KROCE_DRA_CLAIM_<UID>`, defined in
/// `kroce_contracts::dra`, where kroce-nri's reading of it lives too.
pub use kroce_contracts::dra::claim_env;

#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct CdiSpec {
    pub cdi_version: String,
    pub kind: String,
    pub devices: Vec<CdiDevice>,
}

#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct CdiDevice {
    pub name: String,
    pub container_edits: CdiEdits,
}

#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct CdiEdits {
    pub env: Vec<String>,
    pub device_nodes: Vec<CdiNode>,
}

/// One CDI device node: the device plugin's (mode and owner included).
pub type CdiNode = kroce_contracts::cdi::DeviceNode;

fn encode<T: Serialize>(what: &Path, v: &T) -> Result<Vec<u8>, PlanError> {
    serde_json::to_vec_pretty(v).map_err(|e| PlanError::Encode {
        what: what.display().to_string(),
        message: e.to_string(),
    })
}

fn cdi_device(claim: &ClaimRef, device: &str, c: &Candidate, paths: &Paths) -> CdiDevice {
    let nodes = device_nodes(c);
    let dev = env_part(device);
    let mut env = vec![format!(
        "{}={}/{}",
        claim_env(&claim.uid),
        claim.namespace,
        claim.name
    )];
    if let Some(p) = c.pci {
        env.push(format!("KROCE_DRA_{dev}_PCI_ADDRESS={p}"));
    }
    if let Some(r) = &c.rdma {
        env.push(format!("KROCE_DRA_{dev}_RDMA_DEVICE={}", r.name));
    }
    let info = device_facts(c, &nodes);
    env.push(format!(
        "KROCE_DRA_{dev}_INFO={}",
        serde_json::to_string(&info).unwrap_or_else(|_| "{}".into())
    ));
    CdiDevice {
        name: format!("{}-{device}", claim.uid),
        container_edits: CdiEdits {
            env,
            device_nodes: match &paths.dev_infiniband {
                Some(dir) => kroce_inventory::device_nodes::device_nodes_on(c, dir),
                None => nodes.into_iter().map(|n| n.into_cdi(None)).collect(),
            },
        },
    }
}

/// Plans the preparation of `claim`. `inventory`: the published devices
/// by name; `prepared`: device name → claim UID of claims already prepared.
/// Validates everything (UID, every config entry of this driver, pools,
/// devices) before returning a plan, so a bad claim writes nothing.
pub fn plan(
    claim: &ClaimRef,
    alloc: &Allocation,
    node: &str,
    inventory: &BTreeMap<String, Published>,
    prepared: &BTreeMap<String, String>,
    paths: &Paths,
) -> Result<Plan, PlanError> {
    check_uid(&claim.uid)?;
    config::validate_all(&alloc.configs)?;
    // device → (requests, config of the first request, candidate)
    let mut devices: BTreeMap<&str, (Vec<String>, ClaimConfig, &Published)> = BTreeMap::new();
    let mut order = Vec::new();
    for d in alloc.devices.iter().filter(|d| d.driver == DRIVER_NAME) {
        if d.pool != node {
            return Err(PlanError::WrongPool {
                request: d.request.clone(),
                device: d.device.clone(),
                pool: d.pool.clone(),
                node: node.to_string(),
            });
        }
        let p = inventory
            .get(&d.device)
            .ok_or_else(|| PlanError::UnknownDevice {
                request: d.request.clone(),
                device: d.device.clone(),
            })?;
        if let Some(other) = prepared.get(&d.device).filter(|o| **o != claim.uid) {
            return Err(PlanError::AlreadyPrepared {
                device: d.device.clone(),
                other: other.clone(),
            });
        }
        let cfg = config::effective(&alloc.configs, &d.request)?;
        crate::sharing::check_prepare(&d.device, p, &cfg, prepared, &claim.uid)?;
        match devices.get_mut(d.device.as_str()) {
            Some((reqs, _, _)) => reqs.push(d.request.clone()),
            None => {
                order.push(d.device.as_str());
                devices.insert(&d.device, (vec![d.request.clone()], cfg, p));
            }
        }
    }
    let mut writes = Vec::new();
    let mut out = Vec::new();
    let mut cdi_devices = Vec::new();
    let mut memlocks = BTreeMap::new();
    let mut attach = Vec::new();
    for name in order {
        let Some((requests, cfg, published)) = devices.remove(name) else {
            continue;
        };
        let c = &published.candidate;
        attach.push(crate::network::Prepared {
            device: name.to_string(),
            requests: requests.clone(),
            config: cfg.clone(),
            published,
        });
        cdi_devices.push(cdi_device(claim, name, c, paths));
        if let Some(di) = crate::sharing::device_info_of(name, c) {
            let path = devinfo_file(paths, &claim.uid, name);
            writes.push((path, di.to_bytes()));
        }
        if let Some(m) = cfg.memlock {
            memlocks.insert(
                name.to_string(),
                AttachmentMemlock {
                    memlock: m,
                    network: requests[0].clone(),
                },
            );
        }
        out.push(PreparedDevice {
            request_names: requests,
            pool: node.to_string(),
            device: name.to_string(),
            cdi_device_ids: vec![cdi_device_id(&claim.uid, name)],
            config: cfg,
        });
    }
    if !cdi_devices.is_empty() {
        let path = cdi_file(paths, &claim.uid);
        let spec = CdiSpec {
            cdi_version: CDI_VERSION.into(),
            kind: CDI_KIND.into(),
            devices: cdi_devices,
        };
        let bytes = encode(&path, &spec)?;
        writes.insert(0, (path, bytes));
    }
    if let Some(dir) = &paths.memlock_dir
        && let Some(req) = SandboxMemlock::from_attachments(&claim.uid, "", memlocks)
    {
        let file = memlock_file::file_name(&claim.uid).map_err(|_| PlanError::BadUid {
            uid: claim.uid.clone(),
        })?;
        let path = dir.join(file);
        let bytes = encode(&path, &req)?;
        writes.push((path, bytes));
    }
    let mut extra_files = Vec::new();
    if let Some(dir) = &paths.network_dir
        && let Some(req) = crate::network::attach_request(claim, node, &alloc.pod_uids, &attach)?
    {
        let bad_uid = |_| PlanError::BadUid {
            uid: claim.uid.clone(),
        };
        let path = network_attach::request_path(dir, &claim.uid).map_err(bad_uid)?;
        let bytes = encode(&path, &req)?;
        writes.push((path, bytes));
        // Written by kroce-nri; removed with the claim.
        extra_files.push(network_attach::result_path(dir, &claim.uid).map_err(bad_uid)?);
    }
    let files = writes
        .iter()
        .map(|(p, _)| p.clone())
        .chain(extra_files)
        .collect();
    Ok(Plan {
        claim: PreparedClaim {
            namespace: claim.namespace.clone(),
            name: claim.name.clone(),
            devices: out,
            files,
        },
        writes,
    })
}
