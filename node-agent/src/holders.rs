//! Which pods hold which VFs, so the agent never pulls a VF from under a
//! running pod. The agent asks a [`VfHolders`]; the production one is a
//! snapshot built from the pods on the node (their Multus
//! `k8s.v1.cni.cncf.io/network-status` annotation names the VF's PCI
//! address in `device-info`), taken just before each apply.

use std::collections::BTreeMap;

pub use kroce_operator::names::MULTUS_NETWORK_STATUS_ANNOTATION as NETWORK_STATUS_ANNOTATION;

pub trait VfHolders: Send + Sync {
    /// `namespace/name` of the pods holding the VF at this PCI address.
    fn holders(&self, vf_pci: &str) -> Vec<String>;
}

/// VF PCI address -> pods, from one listing of the node's pods.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodSnapshot {
    pub by_pci: BTreeMap<String, Vec<String>>,
}

impl PodSnapshot {
    /// `(namespace, name, network-status annotation)` of each running pod.
    pub fn from_pods<'a>(pods: impl IntoIterator<Item = (&'a str, &'a str, &'a str)>) -> Self {
        let mut by_pci: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (ns, name, annotation) in pods {
            let Ok(serde_json::Value::Array(entries)) = serde_json::from_str(annotation) else {
                continue;
            };
            for e in entries {
                let pci = e
                    .pointer("/device-info/pci/pci-address")
                    .and_then(|v| v.as_str());
                if let Some(pci) = pci {
                    by_pci
                        .entry(pci.to_string())
                        .or_default()
                        .push(format!("{ns}/{name}"));
                }
            }
        }
        PodSnapshot { by_pci }
    }
}

impl VfHolders for PodSnapshot {
    fn holders(&self, vf_pci: &str) -> Vec<String> {
        self.by_pci.get(vf_pci).cloned().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_reads_device_info_from_network_status() {
        let a = r#"[{"name":"cbr0","ips":["10.0.0.5"],"default":true},
                   {"name":"team-a/fast","interface":"net1",
                    "device-info":{"type":"pci","version":"1.1.0","pci":{"pci-address":"0000:3b:00.2"}}}]"#;
        let snap =
            PodSnapshot::from_pods([("team-a", "trainer-0", a), ("team-b", "junk", "not json")]);
        assert_eq!(snap.holders("0000:3b:00.2"), ["team-a/trainer-0"]);
        assert!(snap.holders("0000:3b:00.3").is_empty());
    }
}
