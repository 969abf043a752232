//! Where a claim's allocation comes from. The kubelet names a claim
//! (namespace, name, UID); what was allocated to it is in the ResourceClaim's
//! `status.allocation`, written by the scheduler. [`ClaimSource`] is the
//! narrow edge: [`KubeClaims`] GETs the claim from the API server; the
//! `testing` feature has an in-memory store. [`allocation_of`] turns a claim
//! into plain data (pure).

use crate::config::{ConfigSource, OpaqueConfig};
use k8s_openapi::api::resource::v1::ResourceClaim;
use serde::{Deserialize, Serialize};

/// A claim as the kubelet names it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ClaimRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl std::fmt::Display for ClaimRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{} (uid {})", self.namespace, self.name, self.uid)
    }
}

/// One `status.allocation.devices.results[]` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocatedDevice {
    pub request: String,
    pub driver: String,
    pub pool: String,
    pub device: String,
}

/// A claim's allocation as plain data.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Allocation {
    pub devices: Vec<AllocatedDevice>,
    pub configs: Vec<OpaqueConfig>,
    /// UIDs of the pods in `status.reservedFor` (the pods the kubelet
    /// prepares the claim for): whose sandbox gets the network attachment.
    pub pod_uids: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    #[error("ResourceClaim {claim}: not found")]
    NotFound { claim: String },
    #[error("ResourceClaim {claim}: the API server has uid {found}: the claim was replaced")]
    UidMismatch { claim: String, found: String },
    #[error("ResourceClaim {claim}: status.allocation is not set (not allocated yet)")]
    NotAllocated { claim: String },
    #[error(
        "ResourceClaim {claim}: status.allocation.devices.config[{index}].opaque.parameters: {reason}"
    )]
    BadParameters {
        claim: String,
        index: usize,
        reason: String,
    },
    #[error("cannot get ResourceClaim {claim}: {message}")]
    Api { claim: String, message: String },
}

/// Reads claims (a narrow edge: one GET).
#[tonic::async_trait]
pub trait ClaimSource: Send + Sync + std::fmt::Debug {
    async fn get(&self, claim: &ClaimRef) -> Result<ResourceClaim, ClaimError>;
}

/// The allocation of `claim` as plain data; checks the UID, so a claim
/// deleted and re-created under the same name is never prepared for the old one.
pub fn allocation_of(claim: &ClaimRef, rc: &ResourceClaim) -> Result<Allocation, ClaimError> {
    let found = rc.metadata.uid.clone().unwrap_or_default();
    if found != claim.uid {
        return Err(ClaimError::UidMismatch {
            claim: claim.to_string(),
            found,
        });
    }
    let Some(alloc) = rc.status.as_ref().and_then(|s| s.allocation.as_ref()) else {
        return Err(ClaimError::NotAllocated {
            claim: claim.to_string(),
        });
    };
    let pod_uids: Vec<String> = rc
        .status
        .iter()
        .flat_map(|s| s.reserved_for.iter().flatten())
        .filter(|r| r.resource == "pods" && r.api_group.as_deref().unwrap_or_default().is_empty())
        .map(|r| r.uid.clone())
        .collect();
    let Some(devs) = &alloc.devices else {
        return Ok(Allocation {
            pod_uids,
            ..Allocation::default()
        });
    };
    let devices = devs
        .results
        .iter()
        .flatten()
        .map(|r| AllocatedDevice {
            request: r.request.clone(),
            driver: r.driver.clone(),
            pool: r.pool.clone(),
            device: r.device.clone(),
        })
        .collect();
    let mut configs = Vec::new();
    for (index, c) in devs.config.iter().flatten().enumerate() {
        let Some(opaque) = &c.opaque else {
            continue;
        };
        let source = match c.source.as_str() {
            "FromClass" => ConfigSource::FromClass,
            _ => ConfigSource::FromClaim,
        };
        // RawExtension holds the parameters as JSON.
        let parameters =
            serde_json::to_value(&opaque.parameters).map_err(|e| ClaimError::BadParameters {
                claim: claim.to_string(),
                index,
                reason: e.to_string(),
            })?;
        configs.push(OpaqueConfig {
            source,
            index,
            requests: c.requests.clone().unwrap_or_default(),
            driver: opaque.driver.clone(),
            parameters,
        });
    }
    Ok(Allocation {
        devices,
        configs,
        pod_uids,
    })
}

/// Claims from the API server.
#[derive(Clone)]
pub struct KubeClaims {
    client: kube::Client,
}

impl std::fmt::Debug for KubeClaims {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KubeClaims")
    }
}

impl KubeClaims {
    pub fn new(client: kube::Client) -> Self {
        KubeClaims { client }
    }
}

#[tonic::async_trait]
impl ClaimSource for KubeClaims {
    async fn get(&self, claim: &ClaimRef) -> Result<ResourceClaim, ClaimError> {
        let api: kube::Api<ResourceClaim> =
            kube::Api::namespaced(self.client.clone(), &claim.namespace);
        match api.get_opt(&claim.name).await {
            Ok(Some(rc)) => Ok(rc),
            Ok(None) => Err(ClaimError::NotFound {
                claim: claim.to_string(),
            }),
            Err(e) => Err(ClaimError::Api {
                claim: claim.to_string(),
                message: e.to_string(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::DRIVER_NAME;
    use crate::testing::{ConfigEntry, allocated_claim};

    fn claim() -> ClaimRef {
        ClaimRef {
            namespace: "ns".into(),
            name: "c".into(),
            uid: "u-1".into(),
        }
    }

    #[test]
    fn allocation_as_the_scheduler_wrote_it() {
        let rc = allocated_claim(
            &claim(),
            DRIVER_NAME,
            "node-a",
            &[("vf", "vf-0000-3b-00-2"), ("gpu", "gpu-0")],
            &[ConfigEntry {
                source: ConfigSource::FromClass,
                requests: vec!["vf".into()],
                driver: DRIVER_NAME.into(),
                parameters: serde_json::json!({"vlan": 7}),
            }],
        );
        let a = allocation_of(&claim(), &rc).unwrap();
        assert_eq!(a.devices.len(), 2);
        assert_eq!(
            a.devices[0],
            AllocatedDevice {
                request: "vf".into(),
                driver: DRIVER_NAME.into(),
                pool: "node-a".into(),
                device: "vf-0000-3b-00-2".into(),
            }
        );
        assert_eq!(a.configs.len(), 1);
        assert_eq!(a.configs[0].source, ConfigSource::FromClass);
        assert_eq!(a.configs[0].requests, ["vf"]);
        assert_eq!(a.configs[0].parameters, serde_json::json!({"vlan": 7}));
        assert!(a.pod_uids.is_empty());
    }

    #[test]
    fn pods_from_reserved_for() {
        use k8s_openapi::api::resource::v1::ResourceClaimConsumerReference;
        let mut rc = allocated_claim(&claim(), DRIVER_NAME, "n", &[("vf", "d")], &[]);
        let consumer =
            |group: Option<&str>, resource: &str, uid: &str| ResourceClaimConsumerReference {
                api_group: group.map(str::to_string),
                resource: resource.into(),
                name: "x".into(),
                uid: uid.into(),
            };
        if let Some(s) = rc.status.as_mut() {
            s.reserved_for = Some(vec![
                consumer(None, "pods", "pod-1"),
                consumer(Some("example.com"), "pods", "not-a-pod"),
                consumer(Some(""), "pods", "pod-2"),
                consumer(None, "jobs", "job-1"),
            ]);
        }
        let a = allocation_of(&claim(), &rc).unwrap();
        assert_eq!(a.pod_uids, ["pod-1", "pod-2"]);
    }

    #[test]
    fn replaced_or_unallocated_claims_are_refused() {
        let mut rc = allocated_claim(&claim(), DRIVER_NAME, "n", &[("vf", "d")], &[]);
        rc.metadata.uid = Some("u-2".into());
        let e = allocation_of(&claim(), &rc).unwrap_err().to_string();
        assert_eq!(
            e,
            "ResourceClaim ns/c (uid u-1): the API server has uid u-2: the claim was replaced"
        );
        rc.metadata.uid = Some("u-1".into());
        rc.status = None;
        let e = allocation_of(&claim(), &rc).unwrap_err().to_string();
        assert!(
            e.ends_with("status.allocation is not set (not allocated yet)"),
            "{e}"
        );
    }
}
