//! Network attachment of DRA-prepared VFs without Multus.
//!
//! The DRA plugin leaves a network-attach request per claim
//! ([`kroce_contracts::network_attach`]) naming the claim's pods. At
//! RunPodSandbox, [`PodNetwork::attach`] moves every VF requested for the
//! pod into the sandbox's netns with kroce-cni's own ADD (VLAN, MAC, MTU,
//! IPAM, RDMA device, rollback), run in-process, and writes a result per
//! claim for the DRA plugin to report as networkData. At StopPodSandbox and
//! RemovePodSandbox, [`PodNetwork::release`] runs kroce-cni's DEL for every
//! DRA attachment kroce-cni recorded for the sandbox (idempotent: nothing
//! recorded is nothing to do).
//!
//! Pure: [`PodFacts::from_nri`], [`plan_pod`] (interface names),
//! [`cni_config`], [`device_network`]. Edges: [`CniRunner`] (one kroce-cni
//! command; [`InProcessCni`] with the real backends) and the request dir.

use crate::proto::api;
use kroce_cni::links::{Links, RtnlLinks};
use kroce_cni::netns::Netns;
use kroce_cni::protocol::{CniArgs, CniEnv, CniError, Command};
use kroce_contracts::network_attach::{
    self, AttachRequest, AttachResult, CNI_NETWORK_NAME, DeviceAttach, DeviceNetwork, FILE_VERSION,
    FileKind, IFNAME_PREFIX,
};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// What the network step needs to know about a pod sandbox.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodFacts {
    pub sandbox_id: String,
    pub uid: String,
    pub namespace: String,
    pub name: String,
    /// The sandbox's netns: the `network` namespace path, else
    /// `/proc/<pid>/ns/net` of the sandbox's pid.
    pub netns: Option<PathBuf>,
}

impl PodFacts {
    pub fn from_nri(pod: &api::PodSandbox) -> PodFacts {
        let from_ns = pod
            .linux
            .as_ref()
            .and_then(|l| l.namespaces.iter().find(|n| n.r#type == "network"))
            .map(|n| n.path.clone())
            .filter(|p| !p.is_empty())
            .map(PathBuf::from);
        let from_pid = (pod.pid != 0).then(|| PathBuf::from(format!("/proc/{}/ns/net", pod.pid)));
        PodFacts {
            sandbox_id: pod.id.clone(),
            uid: pod.uid.clone(),
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            netns: from_ns.or(from_pid),
        }
    }
}

/// One VF to attach to a pod, with its interface name decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attachment {
    pub claim_uid: String,
    pub claim_namespace: String,
    pub claim_name: String,
    pub ifname: String,
    pub device: DeviceAttach,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AttachPlanError {
    #[error("interface name {name:?} is asked for by both {first} and {second}")]
    NameTaken {
        name: String,
        first: String,
        second: String,
    },
    #[error("{device} of claim {claim}: interfaceName {0}", .reason)]
    BadName {
        claim: String,
        device: String,
        reason: network_attach::AttachIfnameError,
    },
}

/// The pod's attachments, from every request found (pure). Requests name
/// their pods; claims are taken in (namespace, name, uid) order and
/// devices in request order. Names given in a claim's config are kept;
/// the others get `net1`, `net2`, … skipping names taken, so the same
/// requests always give the same names.
pub fn plan_pod(
    pod_uid: &str,
    requests: &[AttachRequest],
) -> Result<Vec<Attachment>, AttachPlanError> {
    let mut mine: Vec<&AttachRequest> = requests
        .iter()
        .filter(|r| r.pod_uids.iter().any(|p| p == pod_uid))
        .collect();
    mine.sort_by(|a, b| {
        (&a.claim_namespace, &a.claim_name, &a.claim_uid).cmp(&(
            &b.claim_namespace,
            &b.claim_name,
            &b.claim_uid,
        ))
    });
    let label = |r: &AttachRequest, d: &DeviceAttach| {
        format!(
            "{} of claim {}/{}",
            d.device, r.claim_namespace, r.claim_name
        )
    };
    let mut taken: BTreeMap<String, String> = BTreeMap::new();
    for r in &mine {
        for d in &r.devices {
            let Some(n) = &d.interface_name else { continue };
            network_attach::check_ifname(n).map_err(|reason| AttachPlanError::BadName {
                claim: format!("{}/{}", r.claim_namespace, r.claim_name),
                device: d.device.clone(),
                reason,
            })?;
            if let Some(first) = taken.insert(n.clone(), label(r, d)) {
                return Err(AttachPlanError::NameTaken {
                    name: n.clone(),
                    first,
                    second: label(r, d),
                });
            }
        }
    }
    let used: BTreeSet<String> = taken.into_keys().collect();
    let mut next = 1u32;
    let mut out = Vec::new();
    for r in &mine {
        for d in &r.devices {
            let ifname = match &d.interface_name {
                Some(n) => n.clone(),
                None => loop {
                    let n = format!("{IFNAME_PREFIX}{next}");
                    next += 1;
                    if !used.contains(&n) {
                        break n;
                    }
                },
            };
            out.push(Attachment {
                claim_uid: r.claim_uid.clone(),
                claim_namespace: r.claim_namespace.clone(),
                claim_name: r.claim_name.clone(),
                ifname,
                device: d.clone(),
            });
        }
    }
    Ok(out)
}

/// Where kroce-cni runs for kroce-nri.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CniOptions {
    /// kroce-cni's state dir (claims, locks; the request dir is under it).
    pub state_dir: PathBuf,
    /// Where kroce-cni finds `sys/`, `proc/`, `dev/`; `None`: `/`.
    pub host_root: Option<PathBuf>,
    /// Where IPAM plugins are (`CNI_PATH`).
    pub cni_path: Vec<PathBuf>,
}

impl CniOptions {
    /// kroce-cni's roots, as typed values (never config keys: kroce-cni
    /// refuses path keys in a network config).
    pub fn roots(&self) -> kroce_cni::commands::Roots {
        let base = match &self.host_root {
            Some(h) => kroce_cni::commands::Roots::under(h),
            None => kroce_cni::commands::Roots::default(),
        };
        kroce_cni::commands::Roots {
            state_dir: self.state_dir.clone(),
            ..base
        }
    }
}

/// The kroce-cni network configuration of one attachment (pure): the
/// device by PCI address, the claim's VLAN/MTU/MAC/IPAM, and `rdma` from
/// its `rdmaNetnsMode`. No paths: those are the runner's [`CniOptions::roots`].
pub fn cni_config(a: &Attachment) -> Value {
    let d = &a.device;
    let mut c = json!({
        "cniVersion": "1.0.0",
        "name": CNI_NETWORK_NAME,
        "type": "kroce-cni",
        "deviceID": d.pci_address.to_string(),
    });
    if let Some(v) = d.vlan {
        c["vlan"] = json!(v);
    }
    if let Some(m) = d.mtu {
        c["mtu"] = json!(m);
    }
    if let Some(m) = &d.mac {
        c["mac"] = json!(m);
    }
    if let Some(r) = d.rdma {
        c["rdma"] = json!(r);
    }
    if let Some(i) = &d.ipam {
        c["ipam"] = i.clone();
    }
    c
}

/// `CNI_ARGS` as the kubelet's CNI callers set them (some IPAM plugins
/// read them).
pub fn cni_args(pod: &PodFacts) -> CniArgs {
    CniArgs(vec![
        ("IgnoreUnknown".into(), "1".into()),
        ("K8S_POD_NAMESPACE".into(), pod.namespace.clone()),
        ("K8S_POD_NAME".into(), pod.name.clone()),
        ("K8S_POD_INFRA_CONTAINER_ID".into(), pod.sandbox_id.clone()),
        ("K8S_POD_UID".into(), pod.uid.clone()),
    ])
}

/// networkData of one attachment from kroce-cni's ADD result (pure).
pub fn device_network(a: &Attachment, result: &Value) -> DeviceNetwork {
    let ips = result["ips"]
        .as_array()
        .map(|ips| {
            ips.iter()
                .filter_map(|ip| ip["address"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let mac = result["interfaces"]
        .as_array()
        .and_then(|ifs| ifs.iter().find(|i| i["name"] == a.ifname.as_str()))
        .and_then(|i| i["mac"].as_str())
        // kroce-cni writes its own `Mac`; anything else is no address to
        // report (the field is optional in networkData).
        .and_then(|m| m.parse().ok());
    DeviceNetwork {
        device: a.device.device.clone(),
        pool: a.device.pool.clone(),
        interface_name: a.ifname.clone(),
        ips,
        hardware_address: mac,
    }
}

/// Runs one kroce-cni command (a narrow edge).
pub trait CniRunner {
    fn run(&self, env: &CniEnv, config: &Value) -> Result<Option<Value>, CniError>;
    /// The netns kroce-cni treats as the host's: this thread's.
    fn host_netns(&self) -> std::io::Result<Netns> {
        Netns::current()
    }
}

/// kroce-cni in this process, with its real backends (netlink, the IPAM
/// plugin's binary), in this thread's netns: the host's (kroce-nri runs
/// with hostNetwork), on the node at `roots` (kroce-nri's own flags).
#[derive(Debug, Clone, Default)]
pub struct InProcessCni {
    roots: kroce_cni::commands::Roots,
}

impl InProcessCni {
    pub fn new(roots: kroce_cni::commands::Roots) -> Self {
        InProcessCni { roots }
    }
}

impl CniRunner for InProcessCni {
    fn run(&self, env: &CniEnv, config: &Value) -> Result<Option<Value>, CniError> {
        use kroce_cni::commands::{self, Backends, Node, Request};
        let bytes = serde_json::to_vec(config)
            .map_err(|e| CniError::new(kroce_cni::protocol::code::DECODE, e.to_string()))?;
        let conf = kroce_cni::config::parse(&bytes, &env.args)?;
        let host = kroce_cni::netns::Netns::current().map_err(|e| {
            CniError::new(
                kroce_cni::protocol::code::IO,
                format!("cannot open this thread's netns: {e}"),
            )
        })?;
        let mut node = Node::new(&self.roots, host);
        // Memlock is kroce-nri's own business; no limit warnings from ADD.
        node.runtime_pids.clear();
        let log = kroce_cni::log::Logger::new(conf.log_level, self.roots.log_file.as_deref(), true)
            .unwrap_or_else(|_| kroce_cni::log::Logger::quiet());
        let mut links = kroce_cni::links::RtnlOpener;
        let mut vf = kroce_cni::vf_config::RtnlVfConfig::new(None);
        let mut rdma = kroce_cni::rdma::NetlinkRdma::new(None);
        let mut ipam = kroce_cni::ipam::ExecIpam::with_versions_file(
            node.state.root().join(kroce_cni::state::IPAM_VERSIONS_FILE),
        );
        let mut b = Backends {
            links: &mut links,
            vf: &mut vf,
            rdma: &mut rdma,
            ipam: &mut ipam,
        };
        let req = Request {
            env: env.clone(),
            conf,
        };
        commands::run(&req, &node, &mut b, &log)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    #[error("pod {pod}: {source}")]
    Plan {
        pod: String,
        #[source]
        source: AttachPlanError,
    },
    #[error(
        "pod {pod}: sandbox {sandbox} has no network namespace in the runtime's request (host network?): VFs requested for it cannot be attached"
    )]
    NoNetns { pod: String, sandbox: String },
    #[error("pod {pod}: attaching {device} as {ifname}: {message}{}", rollback_note(.left))]
    Cni {
        pod: String,
        device: String,
        ifname: String,
        message: String,
        left: Vec<ReleaseFailure>,
    },
    #[error("pod {pod}: writing {path}: {message}{}", rollback_note(.left))]
    Result {
        pod: String,
        path: PathBuf,
        message: String,
        left: Vec<ReleaseFailure>,
    },
}

fn rollback_note(left: &[ReleaseFailure]) -> String {
    if left.is_empty() {
        " (rolled back)".into()
    } else {
        let left: Vec<String> = left.iter().map(ToString::to_string).collect();
        format!(" (rollback incomplete: {})", left.join("; "))
    }
}

/// One thing a teardown (release, roll-back, the undo of a failed attach)
/// could not do; the teardown goes on with the rest and returns them all.
#[derive(Debug, thiserror::Error)]
pub enum ReleaseFailure {
    /// kroce-cni's DEL of one attachment (`device`: the VF or DRA device).
    #[error("{device} ({ifname}): {source}")]
    Del {
        device: String,
        ifname: String,
        #[source]
        source: CniError,
    },
    /// A result file of the sandbox that could not be removed.
    #[error("{}: {source}", path.display())]
    RemoveResult {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot open the host netns: {0}")]
    HostNetns(#[source] std::io::Error),
    /// The links of the sandbox's held netns could not be read or moved.
    #[error("{}{source}", at.as_ref().map(|(vf, ifname)| format!("{vf} ({ifname}): ")).unwrap_or_default())]
    Links {
        /// The VF and its name in the pod, when about one.
        at: Option<(String, String)>,
        #[source]
        source: kroce_cni::links::LinkError,
    },
}

/// The request files and what was attached from them.
#[derive(Debug)]
pub struct PodNetwork<R> {
    dir: PathBuf,
    opts: CniOptions,
    cni: R,
}

impl<R: CniRunner> PodNetwork<R> {
    /// Requests are read from `<state dir>/dra-attach`.
    pub fn new(opts: CniOptions, cni: R) -> Self {
        PodNetwork {
            dir: network_attach::dir(&opts.state_dir),
            opts,
            cni,
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn cni(&self) -> &R {
        &self.cni
    }

    /// Every request in the dir; unreadable ones are logged and skipped
    /// (a broken file of another pod must not fail this one).
    pub fn requests(&self) -> Vec<AttachRequest> {
        let mut out = Vec::new();
        let rd = match std::fs::read_dir(&self.dir) {
            Ok(rd) => rd,
            Err(e) => {
                if e.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!(dir = %self.dir.display(), error = %e, "cannot list network-attach requests");
                }
                return out;
            }
        };
        let mut paths: Vec<PathBuf> = rd
            .flatten()
            .filter(|e| {
                matches!(
                    network_attach::classify(&e.file_name().to_string_lossy()),
                    Some(FileKind::Request(_))
                )
            })
            .map(|e| e.path())
            .collect();
        paths.sort();
        for p in paths {
            match std::fs::read(&p).map_err(|e| e.to_string()).and_then(|b| {
                serde_json::from_slice::<AttachRequest>(&b).map_err(|e| e.to_string())
            }) {
                Ok(r) if r.version == FILE_VERSION => out.push(r),
                Ok(r) => {
                    tracing::warn!(file = %p.display(), version = r.version, "network-attach request of an unknown version skipped")
                }
                Err(e) => {
                    tracing::warn!(file = %p.display(), error = %e, "network-attach request skipped")
                }
            }
        }
        out
    }

    fn env(&self, command: Command, pod: &PodFacts, ifname: &str, netns: Option<&Path>) -> CniEnv {
        CniEnv {
            command,
            container_id: Some(pod.sandbox_id.clone()),
            netns: netns.map(Path::to_path_buf),
            ifname: Some(ifname.to_string()),
            args: cni_args(pod),
            path: self.opts.cni_path.clone(),
        }
    }

    /// Attaches every VF requested for `pod`; the number attached. On any
    /// failure the ones attached before are released again.
    pub fn attach(&self, pod: &PodFacts) -> Result<usize, AttachError> {
        let label = format!("{}/{} (uid {})", pod.namespace, pod.name, pod.uid);
        let plan = plan_pod(&pod.uid, &self.requests()).map_err(|source| AttachError::Plan {
            pod: label.clone(),
            source,
        })?;
        if plan.is_empty() {
            return Ok(0);
        }
        let Some(netns) = pod.netns.as_deref() else {
            return Err(AttachError::NoNetns {
                pod: label,
                sandbox: pod.sandbox_id.clone(),
            });
        };
        let mut done: Vec<(&Attachment, Value)> = Vec::new();
        for a in &plan {
            let env = self.env(Command::Add, pod, &a.ifname, Some(netns));
            match self.cni.run(&env, &cni_config(a)) {
                Ok(r) => done.push((a, r.unwrap_or(Value::Null))),
                Err(e) => {
                    let left = self.undo(pod, netns, &done);
                    return Err(AttachError::Cni {
                        pod: label,
                        device: a.device.device.clone(),
                        ifname: a.ifname.clone(),
                        message: match &e.details {
                            Some(d) => format!("{} ({d})", e.msg),
                            None => e.msg.clone(),
                        },
                        left,
                    });
                }
            }
        }
        // One result per claim.
        let mut results: BTreeMap<&str, AttachResult> = BTreeMap::new();
        for (a, r) in &done {
            results
                .entry(a.claim_uid.as_str())
                .or_insert_with(|| AttachResult {
                    version: FILE_VERSION,
                    claim_uid: a.claim_uid.clone(),
                    claim_namespace: a.claim_namespace.clone(),
                    claim_name: a.claim_name.clone(),
                    pod_uid: pod.uid.clone(),
                    sandbox_id: pod.sandbox_id.clone(),
                    netns: netns.display().to_string(),
                    devices: Vec::new(),
                })
                .devices
                .push(device_network(a, r));
        }
        let mut written = Vec::new();
        for (uid, res) in &results {
            if let Err((path, message)) = self.write_result(uid, res) {
                for p in &written {
                    let _ = std::fs::remove_file(p);
                }
                let left = self.undo(pod, netns, &done);
                return Err(AttachError::Result {
                    pod: label,
                    path,
                    message,
                    left,
                });
            }
            if let Ok(p) = network_attach::result_path(&self.dir, uid) {
                written.push(p);
            }
        }
        for (a, _) in &done {
            tracing::info!(pod = %label, device = %a.device.device, ifname = %a.ifname, claim = %format!("{}/{}", a.claim_namespace, a.claim_name), "VF attached");
        }
        Ok(done.len())
    }

    fn write_result(&self, uid: &str, res: &AttachResult) -> Result<(), (PathBuf, String)> {
        let path = network_attach::result_path(&self.dir, uid)
            .map_err(|e| (self.dir.join(uid), e.to_string()))?;
        let bytes = serde_json::to_vec_pretty(res).map_err(|e| (path.clone(), e.to_string()))?;
        kroce_cni::state::write_atomic(&path, &bytes).map_err(|e| (path.clone(), e.to_string()))
    }

    /// DEL of what an ADD of this attach gave, newest first.
    fn undo(
        &self,
        pod: &PodFacts,
        netns: &Path,
        done: &[(&Attachment, Value)],
    ) -> Vec<ReleaseFailure> {
        let mut left = Vec::new();
        for (a, _) in done.iter().rev() {
            let env = self.env(Command::Del, pod, &a.ifname, Some(netns));
            if let Err(source) = self.cni.run(&env, &cni_config(a)) {
                left.push(ReleaseFailure::Del {
                    device: a.device.device.clone(),
                    ifname: a.ifname.clone(),
                    source,
                });
            }
        }
        left
    }

    /// Releases every DRA attachment kroce-cni holds for the sandbox, and
    /// removes its results. Idempotent; the errors of what could not be
    /// released (retried at the next Stop/Remove).
    pub fn release(&self, pod: &PodFacts) -> Vec<ReleaseFailure> {
        let mut errors = Vec::new();
        let state = kroce_cni::state::StateDir::new(&self.opts.state_dir);
        let (claims, unreadable) = state.claims();
        for e in unreadable {
            tracing::warn!(error = %e, "kroce-cni claim unreadable; not ours to judge");
        }
        for c in claims
            .iter()
            .filter(|c| c.container_id == pod.sandbox_id && c.network == CNI_NETWORK_NAME)
        {
            let netns = Path::new(&c.netns);
            let env = self.env(
                Command::Del,
                pod,
                &c.ifname,
                kroce_cni::netns::is_alive(netns).then_some(netns),
            );
            match self.cni.run(&env, &c.config) {
                Ok(_) => {
                    tracing::info!(sandbox = %pod.sandbox_id, ifname = %c.ifname, vf = %c.vf, "VF released")
                }
                Err(source) => errors.push(ReleaseFailure::Del {
                    device: c.vf.to_string(),
                    ifname: c.ifname.clone(),
                    source,
                }),
            }
        }
        errors.extend(self.remove_results(pod));
        errors
    }

    fn remove_results(&self, pod: &PodFacts) -> Vec<ReleaseFailure> {
        let mut errors = Vec::new();
        let Ok(rd) = std::fs::read_dir(&self.dir) else {
            return errors;
        };
        for e in rd.flatten() {
            if !matches!(
                network_attach::classify(&e.file_name().to_string_lossy()),
                Some(FileKind::Result(_))
            ) {
                continue;
            }
            let path = e.path();
            let ours = std::fs::read(&path)
                .ok()
                .and_then(|b| serde_json::from_slice::<AttachResult>(&b).ok())
                .is_some_and(|r| r.sandbox_id == pod.sandbox_id);
            if ours {
                match std::fs::remove_file(&path) {
                    Err(source) if source.kind() != std::io::ErrorKind::NotFound => {
                        errors.push(ReleaseFailure::RemoveResult { path, source });
                    }
                    _ => {}
                }
            }
        }
        errors
    }
}

/// What the handler calls at the pod lifecycle events.
pub trait PodNetworkHook: Send + Sync + std::fmt::Debug {
    /// `Err`: the sandbox must not run (rolled back).
    fn attach(&self, pod: &PodFacts) -> Result<usize, AttachError>;
    /// Errors of what could not be released.
    fn release(&self, pod: &PodFacts) -> Vec<ReleaseFailure>;
    /// Undoes an attach the runtime no longer waited for. `held`: the
    /// sandbox's netns, opened before the attach, alive even when the
    /// runtime has removed its path meanwhile.
    fn roll_back(&self, pod: &PodFacts, held: Option<&Netns>) -> Vec<ReleaseFailure> {
        let _ = held;
        self.release(pod)
    }
}

impl<R: CniRunner + Send + Sync + std::fmt::Debug> PodNetworkHook for PodNetwork<R> {
    fn attach(&self, pod: &PodFacts) -> Result<usize, AttachError> {
        PodNetwork::attach(self, pod)
    }

    fn release(&self, pod: &PodFacts) -> Vec<ReleaseFailure> {
        PodNetwork::release(self, pod)
    }

    fn roll_back(&self, pod: &PodFacts, held: Option<&Netns>) -> Vec<ReleaseFailure> {
        PodNetwork::roll_back(self, pod, held)
    }
}

impl<R: CniRunner> PodNetwork<R> {
    /// Undoes a late attach: [`PodNetwork::release`], after getting the
    /// VFs out of a netns the runtime removed meanwhile (`held`: the
    /// sandbox's netns, opened before the attach).
    pub fn roll_back(&self, pod: &PodFacts, held: Option<&Netns>) -> Vec<ReleaseFailure> {
        let mut errors = held
            .map(|ns| self.out_of_a_removed_netns(pod, ns))
            .unwrap_or_default();
        errors.extend(self.release(pod));
        errors
    }

    /// A late attach's VFs out of the sandbox's netns when the runtime has
    /// removed its path already (it failed the sandbox and cleaned up while
    /// the attach ran): kroce-cni's DEL can no longer enter it by the path
    /// it recorded, and the netns dies with our `held` handle, taking a
    /// virtual VF with it and leaving a real one to the kernel under its pod
    /// name. Moved to the host netns under the original name, where the DEL
    /// that follows finds it and restores the rest.
    fn out_of_a_removed_netns(&self, pod: &PodFacts, held: &Netns) -> Vec<ReleaseFailure> {
        let mut errors = Vec::new();
        let state = kroce_cni::state::StateDir::new(&self.opts.state_dir);
        let (claims, _) = state.claims();
        let gone: Vec<_> = claims
            .iter()
            .filter(|c| c.container_id == pod.sandbox_id && c.network == CNI_NETWORK_NAME)
            .filter(|c| !kroce_cni::netns::is_alive(Path::new(&c.netns)))
            .collect();
        if gone.is_empty() {
            return errors;
        }
        let host = match self.cni.host_netns() {
            Ok(h) => h,
            Err(e) => return vec![ReleaseFailure::HostNetns(e)],
        };
        let mut links = match RtnlLinks::open(held) {
            Ok(l) => l,
            Err(source) => return vec![ReleaseFailure::Links { at: None, source }],
        };
        for c in gone {
            match links.by_name(&c.ifname) {
                Ok(Some(l)) => {
                    match links.move_to(l.index, host.fd(), &c.original.link.name, None) {
                        Ok(()) => {
                            tracing::info!(sandbox = %pod.sandbox_id, ifname = %c.ifname, vf = %c.vf, netns = %c.netns, "late attachment: VF moved out of the sandbox netns the runtime had removed")
                        }
                        Err(source) => errors.push(ReleaseFailure::Links {
                            at: Some((c.vf.to_string(), c.ifname.clone())),
                            source,
                        }),
                    }
                }
                Ok(None) => {}
                Err(source) => errors.push(ReleaseFailure::Links {
                    at: Some((c.vf.to_string(), c.ifname.clone())),
                    source,
                }),
            }
        }
        errors
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(name: &str, ifname: Option<&str>) -> DeviceAttach {
        DeviceAttach {
            device: name.into(),
            pool: "node-a".into(),
            request: "vf".into(),
            pci_address: "0000:3b:00.2".parse().unwrap(),
            netdev: Some("ens1f0v0".into()),
            rdma_device: Some("mlx5_2".into()),
            interface_name: ifname.map(str::to_string),
            vlan: None,
            mtu: None,
            mac: None,
            rdma: None,
            ipam: None,
        }
    }

    fn req(uid: &str, name: &str, pods: &[&str], devices: Vec<DeviceAttach>) -> AttachRequest {
        AttachRequest {
            version: FILE_VERSION,
            claim_uid: uid.into(),
            claim_namespace: "ns".into(),
            claim_name: name.into(),
            pod_uids: pods.iter().map(|p| p.to_string()).collect(),
            devices,
        }
    }

    #[test]
    fn names_are_deterministic_and_skip_explicit_ones() {
        let reqs = vec![
            req("u-b", "b", &["pod"], vec![dev("vf-3", None)]),
            req("u-x", "x", &["other"], vec![dev("vf-9", None)]),
            req(
                "u-a",
                "a",
                &["pod"],
                vec![dev("vf-1", None), dev("vf-2", Some("net2"))],
            ),
        ];
        let names = |reqs: &[AttachRequest]| -> Vec<(String, String)> {
            plan_pod("pod", reqs)
                .unwrap()
                .into_iter()
                .map(|a| (a.device.device, a.ifname))
                .collect()
        };
        let want = vec![
            ("vf-1".to_string(), "net1".to_string()),
            ("vf-2".into(), "net2".into()),
            ("vf-3".into(), "net3".into()),
        ];
        assert_eq!(names(&reqs), want);
        let mut reversed = reqs.clone();
        reversed.reverse();
        assert_eq!(names(&reversed), want, "file order does not matter");
        assert!(plan_pod("nobody", &reqs).unwrap().is_empty());
    }

    #[test]
    fn clashing_or_bad_names_are_refused() {
        let reqs = vec![
            req("u-a", "a", &["pod"], vec![dev("vf-1", Some("rdma0"))]),
            req("u-b", "b", &["pod"], vec![dev("vf-2", Some("rdma0"))]),
        ];
        let e = plan_pod("pod", &reqs).unwrap_err().to_string();
        assert!(
            e.contains("\"rdma0\"")
                && e.contains("vf-1 of claim ns/a")
                && e.contains("vf-2 of claim ns/b"),
            "{e}"
        );
        let bad = vec![req("u-a", "a", &["pod"], vec![dev("vf-1", Some("eth0"))])];
        let e = plan_pod("pod", &bad).unwrap_err().to_string();
        assert!(
            e.contains("vf-1 of claim ns/a") && e.contains("reserved"),
            "{e}"
        );
    }

    #[test]
    fn cni_config_carries_the_claim_settings() {
        let mut d = dev("vf-1", None);
        d.vlan = Some(100);
        d.mtu = Some(9000);
        d.mac = Some("02:00:00:00:00:01".parse().unwrap());
        d.rdma = Some(true);
        d.ipam = Some(json!({"type": "host-local"}));
        let a = &plan_pod("pod", &[req("u", "c", &["pod"], vec![d])]).unwrap()[0];
        let opts = CniOptions {
            state_dir: "/var/lib/cni/kroce".into(),
            host_root: Some("/host".into()),
            cni_path: vec![],
        };
        // Paths go to kroce-cni as typed roots, never as config keys.
        let roots = opts.roots();
        assert_eq!(roots.state_dir, std::path::Path::new("/var/lib/cni/kroce"));
        assert_eq!(roots.sysfs, std::path::Path::new("/host/sys"));
        assert_eq!(roots.proc, std::path::Path::new("/host/proc"));
        let c = cni_config(a);
        assert_eq!(
            c,
            json!({"cniVersion": "1.0.0", "name": CNI_NETWORK_NAME, "type": "kroce-cni",
                "deviceID": "0000:3b:00.2", "vlan": 100,
                "mtu": 9000, "mac": "02:00:00:00:00:01", "rdma": true,
                "ipam": {"type": "host-local"}})
        );
        // kroce-cni's own parser accepts it.
        kroce_cni::config::parse(&serde_json::to_vec(&c).unwrap(), &CniArgs::default()).unwrap();
        let nd = device_network(
            a,
            &json!({"interfaces": [{"name": "net1", "mac": "02:00:00:00:00:01"}],
                "ips": [{"address": "10.56.0.2/16", "interface": 0}]}),
        );
        assert_eq!(nd.interface_name, "net1");
        assert_eq!(nd.ips, ["10.56.0.2/16"]);
        assert_eq!(
            nd.hardware_address.map(|m| m.to_string()).as_deref(),
            Some("02:00:00:00:00:01")
        );
    }

    #[test]
    fn netns_from_the_namespaces_then_the_pid() {
        let mut pod = api::PodSandbox {
            id: "sb".into(),
            uid: "u".into(),
            pid: 42,
            ..Default::default()
        };
        assert_eq!(
            PodFacts::from_nri(&pod).netns.as_deref(),
            Some(Path::new("/proc/42/ns/net"))
        );
        pod.linux = Some(api::LinuxPodSandbox {
            namespaces: vec![
                api::LinuxNamespace {
                    r#type: "ipc".into(),
                    path: "/x".into(),
                },
                api::LinuxNamespace {
                    r#type: "network".into(),
                    path: "/var/run/netns/cni-1".into(),
                },
            ],
            ..Default::default()
        });
        assert_eq!(
            PodFacts::from_nri(&pod).netns.as_deref(),
            Some(Path::new("/var/run/netns/cni-1"))
        );
        pod.pid = 0;
        pod.linux = None;
        assert_eq!(PodFacts::from_nri(&pod).netns, None);
    }
}
