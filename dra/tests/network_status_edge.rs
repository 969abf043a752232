//! The networkData edge against a mock API server: the exact request
//! [`KubeClaimStatus`] sends (server-side apply of the claim's status
//! subresource, field manager rdma.kroce.io, forced, the apply body) and
//! that an API error comes back as an error naming the claim.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::Seen;
use kroce_contracts::network_attach::{AttachResult, DeviceNetwork};
use kroce_dra::network::{ClaimStatusWriter, KubeClaimStatus, status_apply_body};
use serde_json::json;
use std::sync::{Arc, Mutex};

/// A client whose requests are recorded and answered with `code`: the
/// applied body itself when 200, else a Status naming a uid mismatch.
fn mock(code: u16) -> (kube::Client, Arc<Mutex<Vec<Seen>>>) {
    common::mock(Box::new(move |s| {
        let answer = if code == 200 {
            s.body.clone()
        } else {
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                "reason": "Conflict", "code": code, "message": "uid mismatch"})
        };
        (code, answer)
    }))
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
            hardware_address: Some("02:00:00:00:00:01".parse().unwrap()),
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
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("team-a/rdma") && e.contains("uid mismatch"),
        "{e}"
    );
}
