//! Test support: the stores as the watches would hold them right now, and
//! the node loop run over every node, against the in-memory API server.

use crate::Context;
use crate::stores::{Stores, from_objects};
use k8s_openapi::api::resource::v1::DeviceClass;
use kroce_operator::names::NETWORK_LABEL;
use kroce_operator::testing::mock::ApiServer;
use kube::ResourceExt;
use serde::de::DeserializeOwned;
use std::sync::Arc;

fn all<K: DeserializeOwned>(server: &ApiServer, prefix: &str, plural: &str) -> Vec<K> {
    server
        .list(prefix, plural)
        .into_iter()
        .filter_map(|v| serde_json::from_value(v).ok())
        .collect()
}

fn unserved(server: &ApiServer, plural: &str) -> bool {
    server.unserved.lock().is_ok_and(|u| u.contains(plural))
}

/// What the shared watches would hold now.
pub fn snapshot(server: &ApiServer) -> Stores {
    from_objects(
        all(server, "/api/v1", "nodes"),
        all(server, "/apis/kroce.io/v1alpha1", "rdmanetworks"),
        all(server, "/apis/kroce.io/v1alpha1", "rdmanodestates"),
        all(server, "/api/v1", "configmaps"),
        all(server, "/api/v1", "pods"),
        // As a watch would see it: never listed where the kind is not served.
        (!unserved(server, "network-attachment-definitions")).then(|| {
            all(
                server,
                "/apis/k8s.cni.cncf.io/v1",
                "network-attachment-definitions",
            )
        }),
        // The watch selects kroce's classes by label.
        (!unserved(server, "deviceclasses")).then(|| {
            all::<DeviceClass>(server, "/apis/resource.k8s.io/v1", "deviceclasses")
                .into_iter()
                .filter(|c| c.labels().contains_key(NETWORK_LABEL))
                .collect()
        }),
    )
}

/// `ctx` reading the server's current objects.
pub fn fresh(ctx: &Context, server: &ApiServer) -> Arc<Context> {
    let mut c = ctx.clone();
    c.stores = snapshot(server);
    Arc::new(c)
}

/// The node loop once over every Node, each with fresh stores.
pub async fn node_pass(ctx: &Context, server: &ApiServer) {
    let nodes: Vec<k8s_openapi::api::core::v1::Node> = all(server, "/api/v1", "nodes");
    for n in nodes {
        crate::node::reconcile_node(Arc::new(n), fresh(ctx, server))
            .await
            .unwrap_or_else(|e| panic!("node reconcile: {e}"));
    }
}
