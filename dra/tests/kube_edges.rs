//! The kube edges against a mock API server: the exact requests
//! [`KubeClaims`] and [`KubePublisher`] send (paths, query, content type,
//! body) and how they read the answers.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::mock;
use k8s_openapi::api::resource::v1::Device;
use kroce_dra::claims::{ClaimError, ClaimRef, ClaimSource, KubeClaims};
use kroce_dra::driver::DRIVER_NAME;
use kroce_dra::publish::{KubePublisher, SlicePublisher};
use kroce_dra::slice::{self, NODE_LABEL};
use kroce_dra::testing::allocated_claim;
use serde_json::{Value, json};

fn not_found() -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404, "message": "not found"})
}

#[tokio::test]
async fn claims_are_read_from_resource_k8s_io_v1() {
    let claim = ClaimRef {
        namespace: "team-a".into(),
        name: "rdma".into(),
        uid: "u-1".into(),
    };
    let rc = allocated_claim(
        &claim,
        DRIVER_NAME,
        "node-a",
        &[("vf", "vf-0000-3b-00-2")],
        &[],
    );
    let body = serde_json::to_value(&rc).unwrap();
    let (client, seen) = mock(Box::new(move |s| {
        if s.path.ends_with("/rdma") {
            (200, body.clone())
        } else {
            (404, not_found())
        }
    }));
    let got = KubeClaims::new(client).get(&claim).await.unwrap();
    assert_eq!(got.metadata.uid.as_deref(), Some("u-1"));
    let s = seen.lock().unwrap()[0].clone();
    assert_eq!(
        (s.method.as_str(), s.path.as_str()),
        (
            "GET",
            "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims/rdma"
        )
    );

    let (client, _) = mock(Box::new(|_| (404, not_found())));
    let e = KubeClaims::new(client).get(&claim).await.unwrap_err();
    assert!(matches!(e, ClaimError::NotFound { .. }), "{e}");
    assert_eq!(
        e.to_string(),
        "ResourceClaim team-a/rdma (uid u-1): not found"
    );
}

#[tokio::test]
async fn slices_are_applied_and_stale_ones_deleted() {
    let devs: Vec<Device> = (0..3)
        .map(|i| Device {
            name: format!("vf-{i}"),
            ..Default::default()
        })
        .collect();
    let slices = slice::slices("node-a", 7, &devs);
    // The API server still has an old second slice of the node.
    let mut stale = slice::slices("node-a", 6, &devs)[0].clone();
    stale.metadata.name = Some(slice::slice_name("node-a", 1));
    let list = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSliceList", "metadata": {},
        "items": [serde_json::to_value(&slices[0]).unwrap(), serde_json::to_value(&stale).unwrap()],
    });
    let applied = serde_json::to_value(&slices[0]).unwrap();
    let node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a", "uid": "node-uid-1"}});
    let (client, seen) = mock(Box::new(move |s| match s.method.as_str() {
        "PATCH" => (200, applied.clone()),
        "GET" if s.path == "/api/v1/nodes/node-a" => (200, node.clone()),
        "GET" => (200, list.clone()),
        _ => (
            200,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}),
        ),
    }));
    KubePublisher::new(client)
        .publish("node-a", slices)
        .await
        .unwrap();
    let seen = seen.lock().unwrap().clone();
    let calls: Vec<(String, String)> = seen
        .iter()
        .map(|s| (s.method.clone(), s.path.clone()))
        .collect();
    assert_eq!(
        calls,
        [
            ("GET".into(), "/api/v1/nodes/node-a".into()),
            (
                "PATCH".into(),
                "/apis/resource.k8s.io/v1/resourceslices/node-a-rdma.kroce.io-0".into()
            ),
            (
                "GET".into(),
                "/apis/resource.k8s.io/v1/resourceslices".into()
            ),
            (
                "DELETE".into(),
                "/apis/resource.k8s.io/v1/resourceslices/node-a-rdma.kroce.io-1".into()
            ),
        ]
    );
    let apply = &seen[1];
    assert_eq!(apply.content_type, "application/apply-patch+yaml");
    assert!(
        apply.query.contains("fieldManager=kroce-dra"),
        "{}",
        apply.query
    );
    assert!(apply.query.contains("force=true"), "{}", apply.query);
    assert_eq!(apply.body["apiVersion"], "resource.k8s.io/v1");
    assert_eq!(apply.body["kind"], "ResourceSlice");
    assert_eq!(apply.body["spec"]["driver"], DRIVER_NAME);
    assert_eq!(apply.body["spec"]["nodeName"], "node-a");
    assert_eq!(
        apply.body["spec"]["pool"],
        json!({"name": "node-a", "generation": 7, "resourceSliceCount": 1})
    );
    assert_eq!(apply.body["spec"]["devices"][2]["name"], "vf-2");
    assert_eq!(apply.body["metadata"]["labels"][NODE_LABEL], "node-a");
    // Owned by the Node: deleting the Node deletes its slices.
    assert_eq!(
        apply.body["metadata"]["ownerReferences"],
        json!([{"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": "node-uid-1", "controller": true}])
    );
    let list_query = &seen[2].query;
    assert!(
        list_query.contains("labelSelector=rdma.kroce.io%2Fnode%3Dnode-a"),
        "{list_query}"
    );
}

#[tokio::test]
async fn slices_go_out_without_owner_when_the_node_cannot_be_read() {
    let slices = slice::slices("node-a", 1, &[]);
    let applied = serde_json::to_value(&slices[0]).unwrap();
    let (client, seen) = mock(Box::new(move |s| match s.method.as_str() {
        "PATCH" => (200, applied.clone()),
        "GET" if s.path.starts_with("/api/v1/nodes/") => (
            403,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden", "code": 403, "message": "forbidden"}),
        ),
        _ => (
            200,
            json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSliceList", "metadata": {}, "items": []}),
        ),
    }));
    KubePublisher::new(client)
        .publish("node-a", slices)
        .await
        .unwrap();
    let seen = seen.lock().unwrap().clone();
    let apply = seen.iter().find(|s| s.method == "PATCH").unwrap();
    assert_eq!(apply.body["metadata"].get("ownerReferences"), None);
}
