//! Shared HCAs: where the plugin learns which HCAs are offered as slots,
//! and what preparing a slot may and may not do.
//!
//! The rules are the device plugin's config file (its `mode: shared`
//! pools, read with the device plugin's own pool rule: see
//! [`Sharing`]), passed with `--device-plugin-config`, so one ConfigMap
//! decides for both front ends. [`SharingRules`] is the narrow edge:
//! [`FileRules`] re-reads the file at every rescan (a ConfigMap update
//! swaps it) and keeps the last good rules when an edit is bad; a
//! [`Sharing`] value is the fixed, in-memory implementation.
//!
//! A slot's holder gets the HCA's RDMA char devices (CDI) and nothing else:
//! the HCA's netdev belongs to the host and to every other holder, so a
//! slot gets no device-info file (what a CNI would use to move it) and
//! refuses network settings.

use crate::config::{ClaimConfig, ClaimConfigError, NetnsMode};
use crate::prepare::PlanError;
use crate::slice::{Published, Sharing, device_name, is_shared_slot, slot_of};
use kroce_contracts::device_info::DeviceInfo;
use kroce_inventory::config::{self as dp_config, PluginConfigError as DpConfigError};
use kroce_inventory::device_info;
use kroce_inventory::inventory::Candidate;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

#[derive(Debug, thiserror::Error)]
#[error("device plugin config {path}: {source}")]
pub struct SharingError {
    pub path: PathBuf,
    #[source]
    pub source: DpConfigError,
}

/// The sharing rules in force now.
pub trait SharingRules: Send + Sync + std::fmt::Debug {
    fn current(&self) -> Sharing;
}

impl SharingRules for Sharing {
    fn current(&self) -> Sharing {
        self.clone()
    }
}

/// The device plugin's config file. An empty or absent file: no sharing.
#[derive(Debug)]
pub struct FileRules {
    path: PathBuf,
    /// (text last parsed, its rules or the last good ones, last error shown)
    last: Mutex<(String, Sharing, Option<String>)>,
}

impl FileRules {
    /// Reads the file once. Absent is fine (the operator writes a node's
    /// key only once a network selects the node: no pools, no sharing);
    /// unreadable or invalid is a start-up error naming the path (the
    /// plugin would otherwise publish shared HCAs as exclusive devices).
    pub fn load(path: &Path) -> Result<FileRules, SharingError> {
        let (text, sharing) = match dp_config::load(path) {
            Ok((text, cfg)) => (text, Sharing::from_config(&cfg)),
            Err(DpConfigError::Read { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                (String::new(), Sharing::default())
            }
            Err(source) => {
                return Err(SharingError {
                    path: path.to_path_buf(),
                    source,
                });
            }
        };
        Ok(FileRules {
            path: path.to_path_buf(),
            last: Mutex::new((text, sharing, None)),
        })
    }
}

impl SharingRules for FileRules {
    fn current(&self) -> Sharing {
        let mut last = self
            .last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let text = match std::fs::read_to_string(&self.path) {
            Ok(t) => t,
            // The key was removed (ConfigMap volumes swap atomically, so
            // this is not a transient state): no pools, no sharing.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => {
                let msg = e.to_string();
                if last.2.as_deref() != Some(msg.as_str()) {
                    tracing::warn!(path = %self.path.display(), error = %msg, "cannot read the device plugin config; keeping the last sharing rules");
                    last.2 = Some(msg);
                }
                return last.1.clone();
            }
        };
        if text == last.0 {
            return last.1.clone();
        }
        if text.is_empty() {
            *last = (text, Sharing::default(), None);
            tracing::info!(path = %self.path.display(), "no device plugin config: no HCA shared");
            return last.1.clone();
        }
        match dp_config::parse(&text, dp_config::Format::detect(Some(&self.path), &text)) {
            Ok(cfg) => {
                *last = (text, Sharing::from_config(&cfg), None);
                tracing::info!(path = %self.path.display(), "sharing rules reloaded");
            }
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "bad device plugin config; keeping the last sharing rules");
                // Not parsed again until the text changes.
                last.0 = text;
                last.2 = Some(e.to_string());
            }
        }
        last.1.clone()
    }
}

/// Several config files read as one, in order: the device plugin's own
/// first (its pools decide), then e.g. a chart-level list of shared HCAs.
#[derive(Debug)]
pub struct Layered(pub Vec<FileRules>);

impl SharingRules for Layered {
    fn current(&self) -> Sharing {
        self.0
            .iter()
            .fold(Sharing::default(), |acc, f| acc.then(f.current()))
    }
}

/// Prepare-side checks of one device of claim `uid` (`prepared`: device
/// name → claim UID): its configuration ([`check_slot_config`]), and its
/// HCA not held in the other mode by another claim (slots and the whole
/// HCA exclude each other; the rescan offers only the mode held, this
/// closes the window of a sharing change between allocation and prepare).
pub fn check_prepare(
    device: &str,
    p: &Published,
    cfg: &ClaimConfig,
    prepared: &BTreeMap<String, String>,
    uid: &str,
) -> Result<(), PlanError> {
    check_slot_config(device, cfg)?;
    let c = &p.candidate;
    let exclusive = device_name(c);
    let conflict = prepared.iter().find(|(name, owner)| {
        owner.as_str() != uid
            && if is_shared_slot(device) {
                exclusive.as_deref() == Some(name.as_str())
            } else {
                exclusive.as_deref() == Some(device) && slot_of(c, name).is_some()
            }
    });
    match conflict {
        Some((name, owner)) => Err(PlanError::AlreadyPrepared {
            device: format!("{name} (the HCA of {device})"),
            other: owner.clone(),
        }),
        None => Ok(()),
    }
}

/// Prepare-side check of one device's effective configuration: a shared
/// slot takes `memlock` and `rdmaNetnsMode: shared` only; network settings
/// (vlan, mtu, ipam, `rdmaNetnsMode: exclusive`) would need its netdev or
/// RDMA device moved into the pod, which a shared HCA never is.
pub fn check_slot_config(device: &str, cfg: &ClaimConfig) -> Result<(), ClaimConfigError> {
    if !is_shared_slot(device) {
        return Ok(());
    }
    let bad = |field: &str, value: String| ClaimConfigError {
        at: format!("device {device} (a shared HCA slot)"),
        field: field.to_string(),
        value,
        reason: "a shared HCA's netdev and RDMA device stay in the host namespace; only memlock \
                 and rdmaNetnsMode: shared apply"
            .into(),
    };
    if let Some(v) = cfg.vlan {
        return Err(bad("vlan", v.to_string()));
    }
    if let Some(m) = cfg.mtu {
        return Err(bad("mtu", m.to_string()));
    }
    if let Some(i) = &cfg.ipam {
        return Err(bad("ipam", i.to_string()));
    }
    if cfg.rdma_netns_mode == Some(NetnsMode::Exclusive) {
        return Err(bad("rdmaNetnsMode", "\"exclusive\"".into()));
    }
    Ok(())
}

/// The device-info file of a prepared device: none for a shared slot (a
/// CNI reading it could move the HCA's netdev).
pub fn device_info_of(device: &str, c: &Candidate) -> Option<DeviceInfo> {
    if is_shared_slot(device) {
        return None;
    }
    device_info::for_candidate(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_config_refuses_network_settings_and_names_them() {
        let ok = ClaimConfig {
            memlock: Some("64Gi".parse().unwrap()),
            rdma_netns_mode: Some(NetnsMode::Shared),
            ..Default::default()
        };
        check_slot_config("shared-0000-05-00-0-1", &ok).unwrap();
        let vlan = ClaimConfig {
            vlan: Some(100),
            ..Default::default()
        };
        let e = check_slot_config("shared-0000-05-00-0-1", &vlan)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("shared-0000-05-00-0-1") && e.contains("vlan") && e.contains("100"),
            "{e}"
        );
        let excl = ClaimConfig {
            rdma_netns_mode: Some(NetnsMode::Exclusive),
            ..Default::default()
        };
        assert!(check_slot_config("shared-0000-05-00-0-1", &excl).is_err());
        // A VF takes them all.
        check_slot_config("vf-0000-3b-00-2", &vlan).unwrap();
        check_slot_config("vf-0000-3b-00-2", &excl).unwrap();
    }
}
