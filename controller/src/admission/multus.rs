//! Multus's pod annotations: which attachments a pod asked for and which
//! IPs it got.

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use std::net::Ipv4Addr;

use kroce_operator::names::MULTUS_NETWORK_STATUS_ANNOTATION as NETWORK_STATUS_ANNOTATION;
pub(crate) use kroce_operator::names::MULTUS_NETWORKS_ANNOTATION as NETWORKS_ANNOTATION;

/// The IPv4 address Multus reports for the pod's test attachment.
pub fn attachment_ipv4(pod: &Pod, namespace: &str, nad: &str) -> Option<Ipv4Addr> {
    let text = pod.annotations().get(NETWORK_STATUS_ANNOTATION)?;
    let entries: Vec<serde_json::Value> = serde_json::from_str(text).ok()?;
    let full = format!("{namespace}/{nad}");
    entries
        .iter()
        .filter(|e| {
            e.get("name")
                .and_then(|n| n.as_str())
                .is_some_and(|n| n == full || n == nad)
        })
        .flat_map(|e| {
            e.get("ips")
                .and_then(|i| i.as_array())
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|ip| {
            let s = ip.as_str()?;
            s.split('/').next()?.parse().ok()
        })
        .next()
}
