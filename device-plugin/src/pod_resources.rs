//! Edge: which device IDs the kubelet has assigned to the pods it runs, from
//! its PodResources API (`v1.PodResourcesLister/List` on
//! `<kubelet root>/pod-resources/kubelet.sock`). Unlike the kubelet's
//! checkpoint file, a pod leaves this list when it is deleted.

use crate::uds::{self, UdsError};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tonic::transport::Channel;

/// The generated PodResources API, from `proto/podresources/v1/api.proto`.
#[allow(missing_debug_implementations, clippy::all, clippy::pedantic)]
pub mod api {
    tonic::include_proto!("v1");
}

use api::pod_resources_lister_client::PodResourcesListerClient;

/// Where the kubelet serves PodResources, under its root dir (`--root-dir`,
/// `/var/lib/kubelet` by default).
pub const DEFAULT_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";
const LIST_TIMEOUT: Duration = Duration::from_secs(2);

/// Assigned device IDs per resource name.
pub type Assigned = BTreeMap<String, BTreeSet<String>>;

#[derive(Debug, thiserror::Error)]
pub enum PodResourcesError {
    #[error(transparent)]
    Connect(#[from] UdsError),
    #[error("PodResources List on {path} failed: {code:?}: {message}")]
    List {
        path: PathBuf,
        code: tonic::Code,
        message: String,
    },
    #[error("PodResources List on {path} timed out after {timeout:?}")]
    Timeout { path: PathBuf, timeout: Duration },
}

/// The device IDs of every container of every pod in a List answer.
pub fn assigned(resp: &api::ListPodResourcesResponse) -> Assigned {
    let mut out = Assigned::new();
    for pod in &resp.pod_resources {
        for c in &pod.containers {
            for d in &c.devices {
                out.entry(d.resource_name.clone())
                    .or_default()
                    .extend(d.device_ids.iter().cloned());
            }
        }
    }
    out
}

/// A PodResources client that dials on first use and again after a failure
/// (the kubelet re-creates its socket when it restarts).
#[derive(Debug)]
pub struct PodResourcesClient {
    path: PathBuf,
    channel: Option<Channel>,
}

impl PodResourcesClient {
    pub fn new(path: &Path) -> Self {
        PodResourcesClient {
            path: path.to_path_buf(),
            channel: None,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub async fn list(&mut self) -> Result<Assigned, PodResourcesError> {
        let channel = match &self.channel {
            Some(c) => c.clone(),
            None => {
                let c = uds::connect(&self.path).await?;
                self.channel = Some(c.clone());
                c
            }
        };
        let mut client = PodResourcesListerClient::new(channel);
        let answer =
            tokio::time::timeout(LIST_TIMEOUT, client.list(api::ListPodResourcesRequest {})).await;
        let result = match answer {
            Ok(Ok(resp)) => Ok(assigned(&resp.into_inner())),
            Ok(Err(status)) => Err(PodResourcesError::List {
                path: self.path.clone(),
                code: status.code(),
                message: status.message().to_string(),
            }),
            Err(_) => Err(PodResourcesError::Timeout {
                path: self.path.clone(),
                timeout: LIST_TIMEOUT,
            }),
        };
        if result.is_err() {
            self.channel = None;
        }
        result
    }
}

/// The bytes on the wire, by hand from the kubelet's field numbers: a
/// renumbered field in `api.proto` breaks this.
#[cfg(test)]
mod wire_tests {
    use super::api::*;
    use prost::Message;

    #[test]
    fn field_numbers_match_the_kubelet() {
        let resp = ListPodResourcesResponse {
            pod_resources: vec![PodResources {
                name: "p".into(),
                namespace: "n".into(),
                containers: vec![ContainerResources {
                    name: "c".into(),
                    devices: vec![ContainerDevices {
                        resource_name: "r".into(),
                        device_ids: vec!["a".into(), "b".into()],
                        topology: Some(TopologyInfo {
                            nodes: vec![NumaNode { id: 1 }],
                        }),
                    }],
                    cpu_ids: vec![3],
                    memory: Vec::new(),
                    dynamic_resources: Vec::new(),
                }],
            }],
        };
        // ContainerDevices: 0a 01 'r' | 12 01 'a' | 12 01 'b' | 1a 04 (0a 02 08 01)
        let dev = [
            0x0a, 1, b'r', 0x12, 1, b'a', 0x12, 1, b'b', 0x1a, 4, 0x0a, 2, 0x08, 1,
        ];
        // ContainerResources: 0a 01 'c' | 12 len dev | 1a 01 03 (packed cpu_ids)
        let mut ctr = vec![0x0a, 1, b'c', 0x12, dev.len() as u8];
        ctr.extend(dev);
        ctr.extend([0x1a, 1, 3]);
        // PodResources: 0a 01 'p' | 12 01 'n' | 1a len ctr
        let mut pod = vec![0x0a, 1, b'p', 0x12, 1, b'n', 0x1a, ctr.len() as u8];
        pod.extend(ctr);
        let mut want = vec![0x0a, pod.len() as u8];
        want.extend(pod);
        assert_eq!(resp.encode_to_vec(), want);
        assert_eq!(
            super::assigned(&resp)["r"].iter().collect::<Vec<_>>(),
            ["a", "b"]
        );
        let get = GetPodResourcesRequest {
            pod_name: "p".into(),
            pod_namespace: "n".into(),
        };
        assert_eq!(get.encode_to_vec(), [0x0a, 1, b'p', 0x12, 1, b'n']);
    }
}
