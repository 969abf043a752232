//! Events admission publishes, on the Node and on the network.

use crate::Context;
use kroce_operator::crd::RdmaNetwork;
use kube::Resource;
use kube::runtime::events::EventType;

pub(crate) async fn node_event(
    ctx: &Context,
    node: &str,
    type_: EventType,
    reason: &str,
    note: String,
) {
    let reference = k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(node.to_string()),
        ..Default::default()
    };
    ctx.event(&reference, type_, reason, "Admission", note)
        .await;
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
