//! Which devices pods hold ("in use"), and how sure the plugin is of it.
//!
//! The kubelet's answer decides: its PodResources API when reachable (a
//! deleted pod's devices leave it), else its checkpoint file (which keeps a
//! deleted pod's devices until the kubelet's next allocation), else nothing
//! is known. Devices this plugin allocated within a short grace before the
//! kubelet was asked also count: the kubelet records an allocation only
//! after Allocate returns.
//!
//! Health uses it (a held VF may leave the host namespace; a free one may
//! not), and so does file cleanup (device-info files and CDI specs of held
//! devices are kept, also across plugin restarts).

use crate::pod_resources::Assigned;
use std::collections::BTreeSet;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    PodResources,
    Checkpoint,
    /// Neither could be read: only this process's own allocations count, and
    /// nothing is removed on the strength of it.
    Unknown,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::PodResources => "PodResources",
            Source::Checkpoint => "kubelet checkpoint",
            Source::Unknown => "unknown",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct InUse {
    pub source: Source,
    /// What the kubelet says pods hold, per resource name.
    pub kubelet: Assigned,
    /// (resource, device ID) allocated by this process and not yet
    /// reflected in the kubelet's answer.
    pub pending: BTreeSet<(String, String)>,
}

impl InUse {
    pub fn unknown(pending: BTreeSet<(String, String)>) -> InUse {
        InUse {
            source: Source::Unknown,
            kubelet: Assigned::new(),
            pending,
        }
    }

    pub fn holds(&self, resource: &str, id: &str) -> bool {
        self.kubelet.get(resource).is_some_and(|s| s.contains(id))
            || self
                .pending
                .contains(&(resource.to_string(), id.to_string()))
    }

    /// Also holds `more` (allocations made since this was read).
    pub fn with_pending(mut self, more: BTreeSet<(String, String)>) -> InUse {
        self.pending.extend(more);
        self
    }

    /// Every held device ID of a resource.
    pub fn held(&self, resource: &str) -> BTreeSet<&str> {
        let mut out: BTreeSet<&str> = self
            .kubelet
            .get(resource)
            .into_iter()
            .flatten()
            .map(String::as_str)
            .collect();
        out.extend(
            self.pending
                .iter()
                .filter(|(r, _)| r == resource)
                .map(|(_, id)| id.as_str()),
        );
        out
    }

    /// Whether "not held" can be trusted enough to delete a device's files.
    pub fn can_release(&self) -> bool {
        self.source != Source::Unknown
    }

    /// Whether "held" can be trusted enough to re-create a device's files:
    /// the checkpoint also lists devices of deleted pods.
    pub fn can_restore(&self) -> bool {
        self.source == Source::PodResources
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod_resources::{api, assigned};

    fn listing(pods: &[(&str, &str, &[&str])]) -> Assigned {
        assigned(&api::ListPodResourcesResponse {
            pod_resources: pods
                .iter()
                .map(|(pod, res, ids)| api::PodResources {
                    name: pod.to_string(),
                    namespace: "default".into(),
                    containers: vec![api::ContainerResources {
                        name: "c".into(),
                        devices: vec![api::ContainerDevices {
                            resource_name: res.to_string(),
                            device_ids: ids.iter().map(|s| s.to_string()).collect(),
                            topology: None,
                        }],
                        ..Default::default()
                    }],
                })
                .collect(),
        })
    }

    #[test]
    fn a_deleted_pods_devices_stop_counting_once_podresources_drops_it() {
        let both = InUse {
            source: Source::PodResources,
            kubelet: listing(&[
                ("a", "rdma/vf", &["0000:3b:00.2"]),
                ("b", "rdma/vf", &["0000:3b:00.3", "0000:86:00.2"]),
            ]),
            pending: BTreeSet::new(),
        };
        assert!(both.holds("rdma/vf", "0000:3b:00.2"));
        assert!(both.holds("rdma/vf", "0000:86:00.2"));
        // Pod b deleted: its devices are free at once.
        let after = InUse {
            kubelet: listing(&[("a", "rdma/vf", &["0000:3b:00.2"])]),
            ..both
        };
        assert!(after.holds("rdma/vf", "0000:3b:00.2"));
        assert!(!after.holds("rdma/vf", "0000:3b:00.3"));
        assert!(!after.holds("rdma/vf", "0000:86:00.2"));
        assert!(!after.holds("rdma/hca", "0000:3b:00.2"));
        assert_eq!(
            after.held("rdma/vf").into_iter().collect::<Vec<_>>(),
            ["0000:3b:00.2"]
        );
    }

    #[test]
    fn pending_allocations_count_and_unknown_removes_nothing() {
        let pending: BTreeSet<(String, String)> =
            [("rdma/vf".to_string(), "0000:3b:00.4".to_string())].into();
        let u = InUse::unknown(pending);
        assert!(u.holds("rdma/vf", "0000:3b:00.4"));
        assert!(!u.can_release() && !u.can_restore());
        assert_eq!(u.held("rdma/vf").len(), 1);
    }
}
