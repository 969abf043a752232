//! Events admission publishes, on the Node and on the network.

use crate::Context;
use kroce_operator::crd::RdmaNetwork;
use kube::Resource;
use kube::runtime::events::EventType;

/// An event on a Node, through the recorder (repeats become a series).
pub(crate) async fn node_event(
    ctx: &Context,
    node: &str,
    type_: EventType,
    reason: &str,
    note: String,
) {
    ctx.event(&node_ref(node), type_, reason, "Admission", note)
        .await;
}

/// A one-off event on a Node (its taint or label changed), not kept by
/// the recorder.
pub(crate) async fn node_event_once(
    ctx: &Context,
    node: &str,
    type_: EventType,
    reason: &str,
    note: String,
) {
    ctx.event_once(&node_ref(node), type_, reason, "Admission", note)
        .await;
}

fn node_ref(node: &str) -> k8s_openapi::api::core::v1::ObjectReference {
    k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(node.to_string()),
        ..Default::default()
    }
}

pub(crate) async fn network_event(ctx: &Context, net: &RdmaNetwork, reason: &str, note: String) {
    ctx.event(
        &net.object_ref(&()),
        EventType::Warning,
        reason,
        "Admission",
        note,
    )
    .await;
}
