//! Edge: writing a node's ResourceSlices. [`SlicePublisher`] is the narrow
//! trait; [`KubePublisher`] applies them with server-side apply and deletes
//! the node's slices that are no longer part of the pool; the `testing`
//! feature records them.

use crate::driver::{DRIVER_NAME, MANAGER};
use crate::slice::NODE_LABEL;
use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{Device, ResourceSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher;

#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("cannot {action} ResourceSlice {name}: {message}")]
    Api {
        action: &'static str,
        name: String,
        message: String,
    },
}

/// What a node's pool looks like in the API (after a restart).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Existing {
    pub generation: i64,
    /// The pool's devices when its slices are complete at that generation.
    pub devices: Option<Vec<Device>>,
}

#[tonic::async_trait]
pub trait SlicePublisher: Send + Sync + std::fmt::Debug {
    /// The node's pool as currently stored.
    async fn existing(&self, node: &str) -> Result<Existing, PublishError>;
    /// Stores exactly these slices for the node (removing others of it).
    async fn publish(&self, node: &str, slices: Vec<ResourceSlice>) -> Result<(), PublishError>;
    /// Yields whenever this node's slices of this driver may have changed in
    /// the API (someone else deleted or edited them: the kubelet deletes all
    /// of its node's slices when it starts). The plugin then reads them again
    /// and writes its own back if they differ. Never ends.
    fn changes(&self, node: &str) -> BoxStream<'static, ()>;
}

/// Pure: the pool in a list of the node's slices — the highest generation,
/// and its devices when every slice of that generation is there.
pub fn existing_of(slices: &[ResourceSlice]) -> Existing {
    let Some(generation) = slices.iter().map(|s| s.spec.pool.generation).max() else {
        return Existing::default();
    };
    let mut current: Vec<&ResourceSlice> = slices
        .iter()
        .filter(|s| s.spec.pool.generation == generation)
        .collect();
    // By the slice index at the end of the name (`…-10` after `…-9`).
    current.sort_by_key(|s| {
        s.metadata
            .name
            .as_deref()
            .and_then(|n| n.rsplit('-').next())
            .and_then(|i| i.parse::<usize>().ok())
    });
    let complete = current
        .first()
        .is_some_and(|s| s.spec.pool.resource_slice_count == current.len() as i64);
    Existing {
        generation,
        devices: complete.then(|| {
            current
                .iter()
                .flat_map(|s| s.spec.devices.iter().flatten().cloned())
                .collect()
        }),
    }
}

#[derive(Clone)]
pub struct KubePublisher {
    api: kube::Api<ResourceSlice>,
    nodes: kube::Api<Node>,
}

impl std::fmt::Debug for KubePublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KubePublisher")
    }
}

impl KubePublisher {
    pub fn new(client: kube::Client) -> Self {
        KubePublisher {
            api: kube::Api::all(client.clone()),
            nodes: kube::Api::all(client),
        }
    }

    /// The Node as owner, so its slices are garbage-collected with it.
    /// `None` (slices go out without an owner) when the Node cannot be read.
    async fn owner(&self, node: &str) -> Option<OwnerReference> {
        match self.nodes.get_opt(node).await {
            Ok(Some(n)) => Some(OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: node.to_string(),
                uid: n.metadata.uid?,
                controller: Some(true),
                ..Default::default()
            }),
            Ok(None) => {
                tracing::warn!(
                    node,
                    "Node not found: ResourceSlices go out without an owner"
                );
                None
            }
            Err(e) => {
                tracing::warn!(node, error = %e, "cannot read the Node: ResourceSlices go out without an owner");
                None
            }
        }
    }

    async fn list(&self, node: &str) -> Result<Vec<ResourceSlice>, PublishError> {
        let lp = ListParams::default().labels(&format!("{NODE_LABEL}={node}"));
        self.api
            .list(&lp)
            .await
            .map(|l| l.items)
            .map_err(|e| PublishError::Api {
                action: "list",
                name: format!("{NODE_LABEL}={node}"),
                message: e.to_string(),
            })
    }
}

#[tonic::async_trait]
impl SlicePublisher for KubePublisher {
    async fn existing(&self, node: &str) -> Result<Existing, PublishError> {
        Ok(existing_of(&self.list(node).await?))
    }

    async fn publish(&self, node: &str, slices: Vec<ResourceSlice>) -> Result<(), PublishError> {
        let pp = PatchParams::apply(MANAGER).force();
        let owner = self.owner(node).await;
        let mut keep = std::collections::BTreeSet::new();
        for mut s in slices {
            let name = s.metadata.name.clone().unwrap_or_default();
            s.metadata.managed_fields = None;
            s.metadata.owner_references = owner.clone().map(|o| vec![o]);
            // Server-side apply needs apiVersion and kind in the body.
            let body = serde_json::json!({
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": s.metadata,
                "spec": s.spec,
            });
            self.api
                .patch(&name, &pp, &Patch::Apply(&body))
                .await
                .map_err(|e| PublishError::Api {
                    action: "apply",
                    name: name.clone(),
                    message: e.to_string(),
                })?;
            keep.insert(name);
        }
        for old in self.list(node).await? {
            let name = old.metadata.name.unwrap_or_default();
            if !keep.contains(&name)
                && let Err(e) = self.api.delete(&name, &DeleteParams::default()).await
                && !matches!(&e, kube::Error::Api(s) if s.code == 404)
            {
                return Err(PublishError::Api {
                    action: "delete",
                    name,
                    message: e.to_string(),
                });
            }
        }
        Ok(())
    }

    fn changes(&self, node: &str) -> BoxStream<'static, ()> {
        // By field: the kubelet's own delete selects `spec.nodeName`, and
        // a slice of ours that lost its label still counts.
        let config = watcher::Config::default()
            .fields(&format!("spec.nodeName={node},spec.driver={DRIVER_NAME}"));
        let node = node.to_string();
        watcher::watcher(self.api.clone(), config)
            .default_backoff()
            .filter_map(move |ev| {
                let node = node.clone();
                async move {
                    match ev {
                        // A change, or the end of a (re-)list: a watch that
                        // restarted may have missed deletions.
                        Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_))
                        | Ok(watcher::Event::InitDone) => Some(()),
                        Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => None,
                        Err(e) => {
                            tracing::warn!(node, error = %e, "watching this node's ResourceSlices; retrying");
                            None
                        }
                    }
                }
            })
            .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slice::slices;

    fn dev(n: &str) -> Device {
        Device {
            name: n.into(),
            ..Default::default()
        }
    }

    #[test]
    fn existing_pool_is_the_complete_highest_generation() {
        assert_eq!(existing_of(&[]), Existing::default());
        let devs: Vec<Device> = (0..70).map(|i| dev(&format!("d{i}"))).collect();
        let mut all = slices("n", 3, &devs);
        all.extend(slices("n", 2, &devs[..1]));
        let e = existing_of(&all);
        assert_eq!(e.generation, 3);
        assert_eq!(e.devices.as_ref().map(Vec::len), Some(70));
        // One slice of generation 3 missing: generation known, content not.
        all.remove(1);
        let e = existing_of(&all);
        assert_eq!((e.generation, e.devices), (3, None));
    }
}
