//! The networkData edge against a mock API server: the exact request
//! [`KubeClaimStatus`] sends (server-side apply of the claim's status
//! subresource, field manager rdma.kroce.io, forced, the apply body) and
//! that an API error comes back as an error naming the claim.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use http::{Request, Response};
use kroce_contracts::network_attach::{AttachResult, DeviceNetwork};
use kroce_dra::network::{ClaimStatusWriter, KubeClaimStatus, status_apply_body};
use kube::client::Body;
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};

#[derive(Debug, Clone)]
struct Seen {
    method: String,
    path: String,
    query: String,
    content_type: String,
    body: Value,
}

/// A client whose requests are recorded and answered with `code`.
fn mock(code: u16) -> (kube::Client, Arc<Mutex<Vec<Seen>>>) {
    let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let log = seen.clone();
    tokio::spawn(async move {
        while let Some((req, send)) = handle.next_request().await {
            let (parts, body) = req.into_parts();
            let bytes = body.collect_bytes().await.unwrap_or_default();
            let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            log.lock().unwrap().push(Seen {
                method: parts.method.to_string(),
                path: parts.uri.path().to_string(),
                query: parts.uri.query().unwrap_or("").to_string(),
                content_type: parts
                    .headers
                    .get("content-type")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_string(),
                body: body.clone(),
            });
            let answer = if code == 200 {
                body
            } else {
                json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                    "reason": "Conflict", "code": code, "message": "uid mismatch"})
            };
            send.send_response(
                Response::builder()
                    .status(code)
                    .header("content-type", "application/json")
                    .body(Body::from(serde_json::to_vec(&answer).unwrap()))
                    .unwrap(),
            );
        }
    });
    (kube::Client::new(svc, "default"), seen)
}

fn result() -> AttachResult {
    AttachResult {
        version: 1,
        claim_uid: "u-1".into(),
        claim_namespace: "team-a".into(),
        claim_name: "rdma".into(),
        pod_uid: "p".into(),
        sandbox_id: "sb".into(),
        netns: "/var/run/netns/cni-1".into(),
        devices: vec![DeviceNetwork {
            device: "vf-0000-3b-00-2".into(),
            pool: "node-a".into(),
            interface_name: "net1".into(),
            ips: vec!["10.56.0.2/16".into()],
            hardware_address: Some("02:00:00:00:00:01".into()),
        }],
    }
}

#[tokio::test]
async fn network_data_is_applied_to_the_status_subresource() {
    let (client, seen) = mock(200);
    let body = status_apply_body(&result());
    KubeClaimStatus::new(client)
        .apply("team-a", "rdma", &body)
        .await
        .unwrap();
    let s = seen.lock().unwrap()[0].clone();
    assert_eq!(s.method, "PATCH");
    assert_eq!(
        s.path,
        "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims/rdma/status"
    );
    assert!(
        s.query.contains("fieldManager=rdma.kroce.io"),
        "{}",
        s.query
    );
    assert!(s.query.contains("force=true"), "{}", s.query);
    assert_eq!(s.content_type, "application/apply-patch+yaml");
    assert_eq!(s.body, body);
    assert_eq!(s.body["metadata"]["uid"], "u-1");
    assert_eq!(
        s.body["status"]["devices"][0]["networkData"]["ips"][0],
        "10.56.0.2/16"
    );
}

#[tokio::test]
async fn an_api_error_names_the_claim() {
    let (client, _) = mock(409);
    let e = KubeClaimStatus::new(client)
        .apply("team-a", "rdma", &status_apply_body(&result()))
        .await
        .unwrap_err();
    assert!(
        e.contains("team-a/rdma") && e.contains("uid mismatch"),
        "{e}"
    );
}
