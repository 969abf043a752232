//! Edge: the kubelet's PodResources `List` (`<kubelet root>/pod-resources/kubelet.sock`),
//! through kroce-device-plugin's client code (its generated API and unix
//! socket dialer): which device IDs the kubelet assigned to which running
//! pod. A deleted pod leaves the list.

use crate::run::{PodDevices, PodResourcesListError, PodResourcesSource};
use futures::future::BoxFuture;
use kroce_device_plugin::pod_resources::api;
use kroce_device_plugin::pod_resources::api::pod_resources_lister_client::PodResourcesListerClient;
use std::path::{Path, PathBuf};
use std::time::Duration;

const LIST_TIMEOUT: Duration = Duration::from_secs(5);

/// Dials the socket for each `List` (once per pass: the kubelet re-creates
/// its socket when it restarts).
#[derive(Debug, Clone)]
pub struct KubeletPodResources {
    path: PathBuf,
}

impl KubeletPodResources {
    pub fn new(path: &Path) -> Self {
        KubeletPodResources {
            path: path.to_path_buf(),
        }
    }

    async fn list_once(&self) -> Result<Vec<PodDevices>, PodResourcesListError> {
        let channel = kroce_device_plugin::uds::connect(&self.path).await?;
        let mut client = PodResourcesListerClient::new(channel);
        let resp = tokio::time::timeout(LIST_TIMEOUT, client.list(api::ListPodResourcesRequest {}))
            .await
            .map_err(|_| PodResourcesListError::Timeout {
                path: self.path.clone(),
                timeout: LIST_TIMEOUT,
            })?
            .map_err(|s| PodResourcesListError::Status {
                path: self.path.clone(),
                code: format!("{:?}", s.code()),
                message: s.message().to_string(),
            })?;
        Ok(devices(&resp.into_inner()))
    }
}

/// One entry per container and resource of every pod in a `List` answer.
pub fn devices(resp: &api::ListPodResourcesResponse) -> Vec<PodDevices> {
    let mut out = Vec::new();
    for pod in &resp.pod_resources {
        for c in &pod.containers {
            for d in &c.devices {
                out.push(PodDevices {
                    pod: format!("{}/{}", pod.namespace, pod.name),
                    resource: d.resource_name.clone(),
                    device_ids: d.device_ids.clone(),
                });
            }
        }
    }
    out
}

impl PodResourcesSource for KubeletPodResources {
    fn list(&self) -> BoxFuture<'_, Result<Vec<PodDevices>, PodResourcesListError>> {
        Box::pin(self.list_once())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_entry_per_container_and_resource_with_the_pod_named() {
        let resp = api::ListPodResourcesResponse {
            pod_resources: vec![api::PodResources {
                name: "trainer-0".into(),
                namespace: "team-a".into(),
                containers: vec![api::ContainerResources {
                    name: "c".into(),
                    devices: vec![api::ContainerDevices {
                        resource_name: "rdma/fast".into(),
                        device_ids: vec!["0000:3b:00.2".into()],
                        topology: None,
                    }],
                    cpu_ids: Vec::new(),
                    memory: Vec::new(),
                    dynamic_resources: Vec::new(),
                }],
            }],
        };
        assert_eq!(
            devices(&resp),
            [PodDevices {
                pod: "team-a/trainer-0".into(),
                resource: "rdma/fast".into(),
                device_ids: vec!["0000:3b:00.2".into()],
            }]
        );
    }

    /// No kubelet socket: an error naming it (the loop then holds every VF).
    #[tokio::test]
    async fn a_missing_socket_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let p = KubeletPodResources::new(&dir.path().join("kubelet.sock"));
        let e = p.list().await.unwrap_err().to_string();
        assert!(e.contains("kubelet.sock"), "{e}");
    }
}
