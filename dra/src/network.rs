//! Network attachment without Multus, the DRA plugin's half.
//!
//! At prepare, [`attach_request`] (pure) turns the claim's exclusive VFs
//! into a network-attach request ([`kroce_contracts::network_attach`])
//! for the pods in the claim's `status.reservedFor`; kroce-nri attaches them
//! at RunPodSandbox and writes a result. [`Reporter`] (edge) finds those
//! results and server-side applies them as `status.devices[].networkData`
//! on the ResourceClaim, with the driver name as field manager.
//!
//! Which devices are attached: VFs with a netdev, unless their config says
//! `attach: false`. Never a shared-HCA slot (its netdev is the host's and
//! the other holders'), a whole PF or a soft device.

use crate::claims::ClaimRef;
use crate::config::{ClaimConfig, NetnsMode};
use crate::driver::DRIVER_NAME;
use crate::slice::Published;
use kroce_contracts::network_attach::{
    self, AttachRequest, AttachResult, DeviceAttach, FILE_VERSION, FileKind,
};
use kroce_inventory::inventory::DeviceKind;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// One device of a claim being prepared.
#[derive(Debug, Clone)]
pub struct Prepared<'a> {
    pub device: String,
    pub requests: Vec<String>,
    /// The effective config of its first request.
    pub config: ClaimConfig,
    pub published: &'a Published,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NetworkPlanError {
    #[error(
        "devices {devices:?} are to be attached to the claim's pod, but status.reservedFor names no pod"
    )]
    NoPod { devices: Vec<String> },
    #[error(
        "interfaceName {name:?} is set for {} devices ({devices:?}): one name names one interface; set it per request with one device each",
        .devices.len()
    )]
    DuplicateName { name: String, devices: Vec<String> },
}

/// Whether `d` is moved into the pod.
pub fn attachable(d: &Prepared<'_>) -> bool {
    let c = &d.published.candidate;
    d.published.shared_slot.is_none()
        && c.kind == DeviceKind::Vf
        && c.pci.is_some()
        && c.netdev.is_some()
        && d.config.attach != Some(false)
}

/// The network-attach request of a claim; `None` when none of its devices
/// is attached. Pure.
pub fn attach_request(
    claim: &ClaimRef,
    pool: &str,
    pod_uids: &[String],
    devices: &[Prepared<'_>],
) -> Result<Option<AttachRequest>, NetworkPlanError> {
    let chosen: Vec<&Prepared<'_>> = devices.iter().filter(|d| attachable(d)).collect();
    if chosen.is_empty() {
        return Ok(None);
    }
    if pod_uids.is_empty() {
        return Err(NetworkPlanError::NoPod {
            devices: chosen.iter().map(|d| d.device.clone()).collect(),
        });
    }
    let mut by_name: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for d in &chosen {
        if let Some(n) = &d.config.interface_name {
            by_name.entry(n).or_default().push(d.device.clone());
        }
    }
    if let Some((name, devs)) = by_name.into_iter().find(|(_, v)| v.len() > 1) {
        return Err(NetworkPlanError::DuplicateName {
            name: name.to_string(),
            devices: devs,
        });
    }
    let devices = chosen
        .iter()
        .filter_map(|d| {
            let c = &d.published.candidate;
            // `attachable` took only devices with a PCI address.
            Some(DeviceAttach {
                device: d.device.clone(),
                pool: pool.to_string(),
                request: d.requests.first().cloned().unwrap_or_default(),
                pci_address: c.pci?,
                netdev: c.netdev.as_ref().map(|n| n.name.clone()),
                rdma_device: c.rdma.as_ref().map(|r| r.name.clone()),
                interface_name: d.config.interface_name.clone(),
                vlan: d.config.vlan,
                mtu: d.config.mtu,
                mac: d.config.mac,
                rdma: d.config.rdma_netns_mode.map(|m| m == NetnsMode::Exclusive),
                ipam: d.config.ipam.clone(),
            })
        })
        .collect();
    Ok(Some(AttachRequest {
        version: FILE_VERSION,
        claim_uid: claim.uid.clone(),
        claim_namespace: claim.namespace.clone(),
        claim_name: claim.name.clone(),
        pod_uids: pod_uids.to_vec(),
        devices,
    }))
}

/// The server-side apply body of a claim's `status.devices[]` for `result`
/// (`metadata.uid` included: a replaced claim refuses it). Pure.
pub fn status_apply_body(result: &AttachResult) -> Value {
    let devices: Vec<Value> = result
        .devices
        .iter()
        .map(|d| {
            let mut nd = json!({"interfaceName": d.interface_name, "ips": d.ips});
            if let Some(mac) = &d.hardware_address {
                nd["hardwareAddress"] = json!(mac);
            }
            json!({"driver": DRIVER_NAME, "pool": d.pool, "device": d.device, "networkData": nd})
        })
        .collect();
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": result.claim_name,
            "namespace": result.claim_namespace,
            "uid": result.claim_uid,
        },
        "status": {"devices": devices},
    })
}

/// Why a pass of the [`Reporter`] could not report a result.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("{}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {source}", path.display())]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("ResourceClaim {namespace}/{name}: status apply: {source}")]
    Apply {
        namespace: String,
        name: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// Writes claim status (a narrow edge: one server-side apply).
#[tonic::async_trait]
pub trait ClaimStatusWriter: Send + Sync + std::fmt::Debug {
    async fn apply(&self, namespace: &str, name: &str, body: &Value) -> Result<(), ReportError>;
}

/// Claim status through the API server: `PATCH …/resourceclaims/<name>/status`
/// as apply, field manager `rdma.kroce.io`.
#[derive(Clone)]
pub struct KubeClaimStatus {
    client: kube::Client,
}

impl std::fmt::Debug for KubeClaimStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KubeClaimStatus")
    }
}

impl KubeClaimStatus {
    pub fn new(client: kube::Client) -> Self {
        KubeClaimStatus { client }
    }
}

#[tonic::async_trait]
impl ClaimStatusWriter for KubeClaimStatus {
    async fn apply(&self, namespace: &str, name: &str, body: &Value) -> Result<(), ReportError> {
        use k8s_openapi::api::resource::v1::ResourceClaim;
        let api: kube::Api<ResourceClaim> = kube::Api::namespaced(self.client.clone(), namespace);
        let pp = kube::api::PatchParams::apply(DRIVER_NAME).force();
        api.patch_status(name, &pp, &kube::api::Patch::Apply(body))
            .await
            .map(|_| ())
            .map_err(|e| ReportError::Apply {
                namespace: namespace.to_string(),
                name: name.to_string(),
                source: Box::new(e),
            })
    }
}

/// Reports kroce-nri's results as networkData, each once (again after a
/// failed apply, or when the result changes).
#[derive(Debug)]
pub struct Reporter {
    dir: PathBuf,
    writer: Arc<dyn ClaimStatusWriter>,
    reported: BTreeMap<String, AttachResult>,
}

impl Reporter {
    pub fn new(dir: impl Into<PathBuf>, writer: Arc<dyn ClaimStatusWriter>) -> Self {
        Reporter {
            dir: dir.into(),
            writer,
            reported: BTreeMap::new(),
        }
    }

    /// One pass over the directory; the errors of this pass (a result
    /// file unreadable, an apply refused). Results of claims whose request
    /// is gone (unprepared) are not reported.
    pub async fn sync(&mut self) -> Vec<ReportError> {
        let dir = self.dir.clone();
        // Directory listing and file reads on the blocking pool: a slow
        // disk must not stall the async workers that answer the kubelet.
        let read = tokio::task::spawn_blocking(move || read_results(&dir))
            .await
            .unwrap_or_else(|e| {
                Err(ReportError::Read {
                    path: self.dir.clone(),
                    source: std::io::Error::other(e),
                })
            });
        let (all, results) = match read {
            Ok(x) => x,
            Err(e) => return vec![e],
        };
        let mut errors = Vec::new();
        self.reported.retain(|uid, _| all.contains(uid));
        for (uid, result) in results {
            let result = match result {
                Ok(r) => r,
                Err(e) => {
                    errors.push(e);
                    continue;
                }
            };
            if result.claim_uid != uid || self.reported.get(&uid) == Some(&result) {
                continue;
            }
            let body = status_apply_body(&result);
            match self
                .writer
                .apply(&result.claim_namespace, &result.claim_name, &body)
                .await
            {
                Ok(()) => {
                    tracing::info!(
                        claim = %format!("{}/{}", result.claim_namespace, result.claim_name),
                        devices = result.devices.len(),
                        "networkData reported"
                    );
                    self.reported.insert(uid, result);
                }
                Err(e) => errors.push(e),
            }
        }
        errors
    }

    /// Syncs every `interval` until the task is dropped.
    pub async fn run(mut self, interval: Duration) {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            for e in self.sync().await {
                tracing::warn!(error = %e, "networkData not reported (retried)");
            }
        }
    }
}

type Files = BTreeMap<String, PathBuf>;

/// What one pass reads (blocking): the UIDs of every result file, and the
/// results of claims with a request (prepared here), each parsed or the
/// error naming its file. A result gone meanwhile (released) is left out.
type Read = (
    std::collections::BTreeSet<String>,
    Vec<(String, Result<AttachResult, ReportError>)>,
);

fn read_results(dir: &Path) -> Result<Read, ReportError> {
    let (requests, results) = list(dir)?;
    let all = results.keys().cloned().collect();
    let mut out = Vec::new();
    for (uid, path) in results {
        if !requests.contains_key(&uid) {
            continue;
        }
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            // Released meanwhile.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(source) => {
                out.push((uid, Err(ReportError::Read { path, source })));
                continue;
            }
        };
        let parsed =
            serde_json::from_slice(&bytes).map_err(|source| ReportError::Parse { path, source });
        out.push((uid, parsed));
    }
    Ok((all, out))
}

/// Request and result files of `dir` by claim UID; a missing dir is empty.
fn list(dir: &Path) -> Result<(Files, Files), ReportError> {
    let mut requests = BTreeMap::new();
    let mut results = BTreeMap::new();
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((requests, results)),
        Err(source) => {
            return Err(ReportError::Read {
                path: dir.to_path_buf(),
                source,
            });
        }
    };
    for e in rd.flatten() {
        let name = e.file_name();
        match network_attach::classify(&name.to_string_lossy()) {
            Some(FileKind::Request(uid)) => {
                requests.insert(uid, e.path());
            }
            Some(FileKind::Result(uid)) => {
                results.insert(uid, e.path());
            }
            None => {}
        }
    }
    Ok((requests, results))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kroce_contracts::network_attach::DeviceNetwork;
    use std::sync::Mutex;

    fn published(kind: DeviceKind, shared: Option<u32>) -> Published {
        use kroce_inventory::inventory::{Candidate, NetdevState, RdmaState};
        Published {
            device: Default::default(),
            candidate: Candidate {
                id: "0000:3b:00.2".into(),
                kind,
                pci: "0000:3b:00.2".parse().ok(),
                pf: "0000:3b:00.0".parse().ok(),
                pf_name: Some("ens1f0".into()),
                vf_index: Some(0),
                vendor: None,
                device: None,
                driver: None,
                numa: None,
                active_vfs: 0,
                netdev: Some(NetdevState {
                    name: "ens1f0v0".into(),
                    present: true,
                    operstate: None,
                    up: true,
                    admin_up: None,
                }),
                rdma: Some(RdmaState {
                    name: "mlx5_2".into(),
                    present: true,
                    char_devices: vec![],
                    roce_v2_gid: None,
                    port_state: None,
                }),
                link_type: None,
                rdma_cm: false,
            },
            shared_slot: shared,
        }
    }

    fn claim() -> ClaimRef {
        ClaimRef {
            namespace: "ns".into(),
            name: "c".into(),
            uid: "u-1".into(),
        }
    }

    fn dev<'a>(name: &str, p: &'a Published, cfg: ClaimConfig) -> Prepared<'a> {
        Prepared {
            device: name.into(),
            requests: vec!["vf".into()],
            config: cfg,
            published: p,
        }
    }

    #[test]
    fn vf_is_attached_with_its_config() {
        let p = published(DeviceKind::Vf, None);
        let cfg = ClaimConfig {
            vlan: Some(100),
            mtu: Some(9000),
            ipam: Some(json!({"type": "host-local"})),
            rdma_netns_mode: Some(NetnsMode::Exclusive),
            mac: Some("02:00:00:00:00:01".parse().unwrap()),
            ..Default::default()
        };
        let r = attach_request(
            &claim(),
            "node-a",
            &["pod-1".into()],
            &[dev("vf-a", &p, cfg)],
        )
        .unwrap()
        .unwrap();
        assert_eq!(r.pod_uids, ["pod-1"]);
        assert_eq!(r.claim_uid, "u-1");
        let d = &r.devices[0];
        assert_eq!(d.pci_address.to_string(), "0000:3b:00.2");
        assert_eq!(d.netdev.as_deref(), Some("ens1f0v0"));
        assert_eq!(d.rdma_device.as_deref(), Some("mlx5_2"));
        assert_eq!((d.vlan, d.mtu, d.rdma), (Some(100), Some(9000), Some(true)));
        assert_eq!(
            d.mac.map(|m| m.to_string()).as_deref(),
            Some("02:00:00:00:00:01")
        );
        assert_eq!(d.interface_name, None);
        assert_eq!(d.pool, "node-a");
    }

    #[test]
    fn shared_slots_pfs_soft_devices_and_opt_outs_are_never_attached() {
        let slot = published(DeviceKind::Vf, Some(0));
        let pf = published(DeviceKind::Pci, None);
        let soft = published(DeviceKind::Soft, None);
        let vf = published(DeviceKind::Vf, None);
        let mut no_netdev = published(DeviceKind::Vf, None);
        no_netdev.candidate.netdev = None;
        let off = ClaimConfig {
            attach: Some(false),
            ..Default::default()
        };
        // Even asked for explicitly, a shared slot stays on the host.
        let on = ClaimConfig {
            attach: Some(true),
            ..Default::default()
        };
        let devs = [
            dev("slot", &slot, on),
            dev("pf", &pf, ClaimConfig::default()),
            dev("soft", &soft, ClaimConfig::default()),
            dev("off", &vf, off),
            dev("nonet", &no_netdev, ClaimConfig::default()),
        ];
        // No pod either: nothing to attach is not an error.
        assert_eq!(attach_request(&claim(), "n", &[], &devs).unwrap(), None);
    }

    #[test]
    fn no_pod_and_duplicate_names_are_refused() {
        let p = published(DeviceKind::Vf, None);
        let e = attach_request(
            &claim(),
            "n",
            &[],
            &[dev("vf-a", &p, ClaimConfig::default())],
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("status.reservedFor names no pod"),
            "{e}"
        );
        let named = ClaimConfig {
            interface_name: Some("rdma0".into()),
            ..Default::default()
        };
        let e = attach_request(
            &claim(),
            "n",
            &["p".into()],
            &[dev("vf-a", &p, named.clone()), dev("vf-b", &p, named)],
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("\"rdma0\"") && e.contains("vf-a") && e.contains("vf-b"),
            "{e}"
        );
    }

    #[test]
    fn apply_body_names_driver_pool_device_and_uid() {
        let r = AttachResult {
            version: 1,
            claim_uid: "u-1".into(),
            claim_namespace: "ns".into(),
            claim_name: "c".into(),
            pod_uid: "p".into(),
            sandbox_id: "sb".into(),
            netns: "/run/netns/x".into(),
            devices: vec![DeviceNetwork {
                device: "vf-a".into(),
                pool: "node-a".into(),
                interface_name: "net1".into(),
                ips: vec!["10.56.0.2/16".into()],
                hardware_address: Some("02:00:00:00:00:01".parse().unwrap()),
            }],
        };
        let b = status_apply_body(&r);
        assert_eq!(b["metadata"]["uid"], "u-1");
        assert_eq!(
            b["status"]["devices"][0],
            json!({"driver": DRIVER_NAME, "pool": "node-a", "device": "vf-a",
                "networkData": {"interfaceName": "net1", "ips": ["10.56.0.2/16"],
                    "hardwareAddress": "02:00:00:00:00:01"}})
        );
    }

    #[derive(Debug, Default)]
    struct Recording {
        applied: Mutex<Vec<(String, String, Value)>>,
        fail: Mutex<bool>,
    }

    #[tonic::async_trait]
    impl ClaimStatusWriter for Recording {
        async fn apply(
            &self,
            namespace: &str,
            name: &str,
            body: &Value,
        ) -> Result<(), ReportError> {
            if *self.fail.lock().unwrap() {
                return Err(ReportError::Apply {
                    namespace: namespace.into(),
                    name: name.into(),
                    source: "API down".into(),
                });
            }
            self.applied
                .lock()
                .unwrap()
                .push((namespace.into(), name.into(), body.clone()));
            Ok(())
        }
    }

    #[tokio::test]
    async fn reporter_applies_each_result_once_and_retries_failures() {
        let dir = tempfile::tempdir().unwrap();
        let w = Arc::new(Recording::default());
        let mut rep = Reporter::new(dir.path(), w.clone());
        assert!(rep.sync().await.is_empty());
        let result = json!({"version":1,"claimUid":"u-1","claimNamespace":"ns","claimName":"c",
            "podUid":"p","sandboxId":"sb","netns":"/x",
            "devices":[{"device":"vf-a","pool":"n","interfaceName":"net1","ips":[]}]});
        std::fs::write(dir.path().join("u-1.result.json"), result.to_string()).unwrap();
        // No request (claim not prepared here): not reported.
        assert!(rep.sync().await.is_empty());
        assert!(w.applied.lock().unwrap().is_empty());
        std::fs::write(dir.path().join("u-1.json"), "{}").unwrap();
        *w.fail.lock().unwrap() = true;
        let e: Vec<String> = rep.sync().await.iter().map(|e| e.to_string()).collect();
        assert_eq!(e, ["ResourceClaim ns/c: status apply: API down"]);
        *w.fail.lock().unwrap() = false;
        assert!(rep.sync().await.is_empty());
        assert!(rep.sync().await.is_empty());
        let applied = w.applied.lock().unwrap().clone();
        assert_eq!(applied.len(), 1, "{applied:?}");
        assert_eq!((applied[0].0.as_str(), applied[0].1.as_str()), ("ns", "c"));
        // A broken result file is an error naming it.
        std::fs::write(dir.path().join("u-1.result.json"), "{").unwrap();
        let e = rep.sync().await;
        assert!(matches!(&e[..], [ReportError::Parse { .. }]), "{e:?}");
        assert!(e[0].to_string().contains("u-1.result.json"), "{e:?}");
    }
}
