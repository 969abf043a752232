//! Who holds which VF, so the agent never pulls a VF from under a pod. The
//! answer comes from what the node itself recorded, never from anything a
//! pod author writes (a pod's Multus annotation is the pod author's to
//! forge, and a DRA VF with `attach: false` has none):
//!
//! - kroce-cni's claims: `<CNI state dir>/vf/<VF PCI address>.json`, written
//!   before ADD's first side effect, removed when the VF is released, read
//!   with kroce-cni's own reader (`kroce_cni::state`; the pod comes from
//!   the runtime's `CNI_ARGS`);
//! - the DRA plugin's checkpoint of prepared claims
//!   (`<DRA state dir>/checkpoint.json`, read with
//!   [`kroce_contracts::dra_checkpoint`]), every prepared VF device,
//!   attached or not;
//! - the kubelet's PodResources: the VFs it assigned to running pods
//!   through the device plugin (read in [`crate::run`]).
//!
//! A source that exists but cannot be read makes every VF held (nothing is
//! removed on the strength of an unreadable record); a source that is not
//! there (no CNI claims yet, DRA not deployed) holds nothing.

use kroce_cni::state::StateDir;
use kroce_cni::vf::DeviceKey;
use kroce_contracts::dra_checkpoint;
use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

/// One holder of a VF.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Holder {
    /// `namespace/name` of the pod, when the record names one (the
    /// controller's drain evicts these).
    pub pod: Option<String>,
    /// What holds it, for people: which record says so.
    pub what: String,
}

pub trait VfHolders: Send + Sync {
    /// The holders of the VF at this PCI address.
    fn holders(&self, vf_pci: &str) -> Vec<Holder>;
}

/// Holders read from the node's records, by VF PCI address; `unknown`
/// holds every VF (a record that could not be read).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeHolders {
    pub by_pci: BTreeMap<String, Vec<Holder>>,
    /// By DRA device name (`vf-0000-3b-00-2`), from the DRA checkpoint.
    pub by_dra_device: BTreeMap<String, Vec<Holder>>,
    pub unknown: Vec<String>,
}

impl VfHolders for NodeHolders {
    fn holders(&self, vf_pci: &str) -> Vec<Holder> {
        let mut out = self.by_pci.get(vf_pci).cloned().unwrap_or_default();
        if let Some(d) = self.by_dra_device.get(&dra_vf_device_name(vf_pci)) {
            out.extend(d.iter().cloned());
        }
        out.extend(self.unknown.iter().map(|u| Holder {
            pod: None,
            what: format!("unknown ({u})"),
        }));
        out
    }
}

/// Where the node's records are (under the agent's host root).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HolderSources {
    /// kroce-cni's state dir (`/var/lib/cni/kroce`).
    pub cni_state_dir: PathBuf,
    /// The DRA plugin's checkpoint (`/var/lib/kroce/dra/checkpoint.json`).
    pub dra_checkpoint: PathBuf,
    /// The CNI state dir must exist (the agent in a cluster, where the
    /// chart installs kroce-cni): a missing one is a missing mount, and
    /// holds every VF rather than none.
    pub cni_state_required: bool,
}

/// The DRA device name of a VF, as the DRA plugin names it.
pub use kroce_contracts::dra::vf_device_name as dra_vf_device_name;

/// `namespace/name` from the runtime's `CNI_ARGS`
/// (`K8S_POD_NAMESPACE=..;K8S_POD_NAME=..`).
fn pod_of_cni_args(args: &str) -> Option<String> {
    let get = |k: &str| {
        args.split(';')
            .filter_map(|kv| kv.split_once('='))
            .find(|(key, _)| *key == k)
            .map(|(_, v)| v)
            .filter(|v| !v.is_empty())
    };
    Some(format!(
        "{}/{}",
        get("K8S_POD_NAMESPACE")?,
        get("K8S_POD_NAME")?
    ))
}

impl NodeHolders {
    /// Reads kroce-cni's claims and the DRA checkpoint.
    pub fn read(src: &HolderSources) -> NodeHolders {
        let mut h = NodeHolders::default();
        if src.cni_state_required && !src.cni_state_dir.is_dir() {
            h.unknown.push(format!(
                "kroce-cni state dir {} missing (not mounted?)",
                src.cni_state_dir.display()
            ));
        }
        h.read_cni_claims(&src.cni_state_dir);
        h.read_dra_checkpoint(&src.dra_checkpoint);
        h
    }

    pub fn add(&mut self, vf_pci: &str, holder: Holder) {
        let v = self.by_pci.entry(vf_pci.to_string()).or_default();
        if !v.contains(&holder) {
            v.push(holder);
        }
    }

    fn read_cni_claims(&mut self, state_dir: &Path) {
        let state = StateDir::new(state_dir);
        // Listed here, not with `StateDir::claims`: an unreadable file must
        // still hold the VF its name says.
        let dir = state_dir.join("vf");
        let rd = match std::fs::read_dir(&dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return,
            Err(e) => {
                self.unknown.push(format!(
                    "cannot read kroce-cni claims {}: {e}",
                    dir.display()
                ));
                return;
            }
        };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            // `<VF PCI address>.json`; soft devices' claims are not VFs, and
            // temp files of a write in progress start with a dot.
            let Some(stem) = name.strip_suffix(".json") else {
                continue;
            };
            let Ok(pci) = stem.parse::<sriov_helpers::PciAddress>() else {
                continue;
            };
            let holder = match state.read_claim(&DeviceKey::Pci(pci)) {
                Ok(Some(c)) => Holder {
                    pod: pod_of_cni_args(&c.cni_args),
                    what: format!(
                        "kroce-cni claim (network {}, container {})",
                        c.network,
                        c.container_id.chars().take(12).collect::<String>()
                    ),
                },
                // Vanished between listing and reading: released.
                Ok(None) => continue,
                // The file still claims the VF even if it cannot be read.
                Err(err) => Holder {
                    pod: None,
                    what: format!("unreadable kroce-cni claim: {err}"),
                },
            };
            let pci = pci.to_string();
            self.add(&pci, holder);
        }
    }

    fn read_dra_checkpoint(&mut self, path: &Path) {
        let cp = match dra_checkpoint::load(path) {
            Ok(Some(cp)) => cp,
            Ok(None) => return,
            Err(e) => {
                self.unknown.push(e.to_string());
                return;
            }
        };
        // By device name, as the plugin published it: every prepared
        // device holds its VF, attached to a pod's network or not.
        for c in cp.claims.into_values() {
            for d in c.devices {
                let attach = match d.config.attach {
                    Some(false) => ", attach: false",
                    _ => "",
                };
                self.by_dra_device
                    .entry(d.device)
                    .or_default()
                    .push(Holder {
                        pod: None,
                        what: format!("DRA claim {}/{}{attach}", c.namespace, c.name),
                    });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sources(dir: &Path) -> HolderSources {
        HolderSources {
            cni_state_dir: dir.join("cni"),
            dra_checkpoint: dir.join("dra/checkpoint.json"),
            cni_state_required: false,
        }
    }

    #[test]
    fn dra_device_names_match_the_plugins() {
        assert_eq!(dra_vf_device_name("0000:3b:00.2"), "vf-0000-3b-00-2");
        assert_eq!(
            pod_of_cni_args("IgnoreUnknown=1;K8S_POD_NAMESPACE=a;K8S_POD_NAME=p").as_deref(),
            Some("a/p")
        );
        assert_eq!(pod_of_cni_args("K8S_POD_NAMESPACE=a"), None);
    }

    /// Nothing there holds nothing; an unreadable claim still holds its VF;
    /// an unreadable checkpoint holds every VF.
    #[test]
    fn missing_sources_hold_nothing_and_unreadable_ones_hold() {
        let dir = tempfile::tempdir().unwrap();
        let src = sources(dir.path());
        let h = NodeHolders::read(&src);
        assert_eq!(h, NodeHolders::default());
        // Unless the CNI state dir must be there (the agent in a cluster).
        let required = HolderSources {
            cni_state_required: true,
            ..src.clone()
        };
        let held = NodeHolders::read(&required).holders("0000:3b:00.2");
        assert!(
            held[0].what.contains("state dir") && held[0].what.contains("missing"),
            "{held:?}"
        );

        std::fs::create_dir_all(src.cni_state_dir.join("vf")).unwrap();
        std::fs::write(src.cni_state_dir.join("vf/0000:3b:00.2.json"), "{torn").unwrap();
        // Soft devices' claims and temp files are not VFs.
        std::fs::write(src.cni_state_dir.join("vf/rxe0.json"), "{}").unwrap();
        std::fs::write(src.cni_state_dir.join("vf/.0000:3b:00.3.json.tmp.1"), "{}").unwrap();
        let h = NodeHolders::read(&src);
        let held = h.holders("0000:3b:00.2");
        assert_eq!(held.len(), 1);
        assert!(
            held[0].what.contains("unreadable kroce-cni claim"),
            "{held:?}"
        );
        assert!(h.holders("0000:3b:00.3").is_empty());
        assert!(h.unknown.is_empty());

        std::fs::create_dir_all(src.dra_checkpoint.parent().unwrap()).unwrap();
        std::fs::write(&src.dra_checkpoint, r#"{"version": 2, "claims": {}}"#).unwrap();
        let h = NodeHolders::read(&src);
        let held = h.holders("0000:99:00.1");
        assert_eq!(held.len(), 1, "{held:?}");
        assert!(held[0].what.contains("version 2"), "{held:?}");
    }
}
