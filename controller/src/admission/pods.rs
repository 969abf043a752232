//! Perftest pods: their names, templates, the test attachment definition,
//! create/delete/log.

use super::multus::NETWORKS_ANNOTATION;
use super::settings::AdmissionSettings;
use crate::{Context, Error};
use k8s_openapi::api::core::v1::Pod;
use kroce_admission::lifecycle::{TestRun, UNREADY_TAINT_KEY};
use kroce_admission::pod_run::{RUNNER_BINARY, Role};
use kroce_operator::crd::{AdmissionSpec, RdmaNetwork};
use kroce_operator::names::{
    ADMISSION_MANAGER, ADMISSION_NETWORK_LABEL, ADMISSION_ROLE_LABEL, ADMISSION_RUN_LABEL,
};
use kroce_operator::names::{MANAGED_BY_LABEL, MANAGER};
use kroce_operator::plan::nad::{NetworkAttachmentDefinition, attachment_definition};
use kube::api::{DeleteParams, LogParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use std::collections::BTreeMap;
use std::net::Ipv4Addr;

/// The attachment definition test pods name, in the test namespace (its
/// own name and label, so the network's own NADs are never touched).
pub fn test_nad_name(network: &str) -> String {
    format!("kroce-admission-{network}")
}

pub fn pod_name(run: &TestRun, role: Role) -> String {
    format!("{}-{}", run.id, role.as_str())
}

/// A test pod: on its node, requesting one `rdma/<name>` device and whole
/// CPUs (Guaranteed QoS), tolerating the unready taint, running
/// `kroce-perftest-run` (which pins to the device's NUMA-local CPUs inside
/// the pod's cpuset and resolves the GID index there).
pub fn test_pod(
    settings: &AdmissionSettings,
    network: &str,
    resource: &str,
    spec: &AdmissionSpec,
    run: &TestRun,
    role: Role,
    server_ip: Option<Ipv4Addr>,
) -> Result<Pod, Error> {
    let node = match role {
        Role::Server => &run.server_node,
        Role::Client => &run.client_node,
    };
    let mut args = spec.runner_args(role);
    args.server_ip = server_ip;
    let command: Vec<String> = std::iter::once(RUNNER_BINARY.to_string())
        .chain(args.to_args())
        .collect();
    let image = spec
        .image
        .clone()
        .unwrap_or_else(|| settings.perftest_image.clone());
    let mut amounts = serde_json::Map::new();
    amounts.insert("cpu".into(), settings.cpus.max(1).to_string().into());
    amounts.insert("memory".into(), settings.memory.clone().into());
    amounts.insert(resource.into(), "1".into());
    let pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(run, role),
            "namespace": settings.test_namespace,
            "labels": {
                ADMISSION_RUN_LABEL: run.id,
                ADMISSION_NETWORK_LABEL: network,
                ADMISSION_ROLE_LABEL: role.as_str(),
                MANAGED_BY_LABEL: MANAGER,
            },
            "annotations": { NETWORKS_ANNOTATION: test_nad_name(network) },
        },
        "spec": {
            "restartPolicy": "Never",
            "activeDeadlineSeconds": spec.test_timeout_seconds,
            "terminationGracePeriodSeconds": 5,
            "automountServiceAccountToken": false,
            "enableServiceLinks": false,
            "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [node]}
                ]}]
            }}},
            "tolerations": [
                {"key": UNREADY_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}
            ],
            "containers": [{
                "name": "perftest",
                "image": image,
                "command": command,
                "resources": {"requests": amounts.clone(), "limits": amounts},
                // Root (a non-root process does not get an added
                // capability): everything dropped but IPC_LOCK, which
                // registering RDMA memory needs.
                "securityContext": {
                    "allowPrivilegeEscalation": false,
                    "capabilities": {"drop": ["ALL"], "add": ["IPC_LOCK"]},
                    "seccompProfile": {"type": "RuntimeDefault"},
                },
            }],
        },
    });
    serde_json::from_value(pod).map_err(|source| Error::Json {
        what: "test pod",
        source,
    })
}

pub(crate) fn pod_phase(p: &Pod) -> &str {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Pending")
}

pub(crate) fn label<'a>(p: &'a Pod, key: &str) -> Option<&'a str> {
    p.labels().get(key).map(String::as_str)
}

pub(crate) async fn pod_log(api: &Api<Pod>, name: &str) -> Result<String, kube::Error> {
    api.logs(name, &LogParams::default()).await
}

/// Deletes pods; absent ones are fine. Errors are collected, not fatal to the others.
pub(crate) async fn delete_pods<'a>(
    api: &Api<Pod>,
    names: impl Iterator<Item = &'a str>,
) -> Vec<String> {
    let mut errors = Vec::new();
    for n in names {
        match api
            .delete(n, &DeleteParams::default().grace_period(0))
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => errors.push(format!("pod {n}: {}", crate::api_error_text(&e))),
        }
    }
    errors
}

pub(crate) async fn ensure_test_nad(ctx: &Context, net: &RdmaNetwork) -> Result<(), Error> {
    let name = net.name_any();
    let ns = &ctx.admission.test_namespace;
    let mut nad = attachment_definition(&name, &net.spec, ns);
    nad.metadata.name = Some(test_nad_name(&name));
    nad.metadata.labels = Some(BTreeMap::from([
        (ADMISSION_NETWORK_LABEL.to_string(), name.clone()),
        (MANAGED_BY_LABEL.to_string(), MANAGER.to_string()),
    ]));
    let api: Api<NetworkAttachmentDefinition> = Api::namespaced(ctx.client.clone(), ns);
    api.patch(
        &test_nad_name(&name),
        &PatchParams::apply(ADMISSION_MANAGER).force(),
        &Patch::Apply(&nad),
    )
    .await?;
    Ok(())
}

pub(crate) async fn create_pod(api: &Api<Pod>, pod: &Pod) -> Result<(), kube::Error> {
    match api.create(&PostParams::default(), pod).await {
        Ok(_) => Ok(()),
        // Created by an earlier pass.
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}

/// Waiting reasons of a container that will not start by waiting longer:
/// the run fails at once instead of at its timeout.
const BROKEN_WAITING: &[(&str, &str)] = &[
    ("ErrImagePull", "its image cannot be pulled"),
    ("ImagePullBackOff", "its image cannot be pulled"),
    ("InvalidImageName", "its image name is invalid"),
    (
        "ErrImageNeverPull",
        "its image is not on the node (imagePullPolicy: Never)",
    ),
    ("CreateContainerError", "its container cannot be created"),
    (
        "CreateContainerConfigError",
        "its container cannot be configured",
    ),
    ("RunContainerError", "its container cannot be started"),
];

/// A test pod left `Unschedulable` this long fails the run: right after a
/// node state is applied the device plugin may take a moment to advertise
/// the network's resource.
pub const UNSCHEDULABLE_GRACE_SECONDS: u64 = 30;

/// Why a test pod that has not finished never will (image, container,
/// scheduling, missing attachment), naming the pod, its node and the
/// kubelet's or scheduler's own words; `None` while it may still run.
/// `now`: seconds since the epoch (the admission clock).
pub fn broken_pod(pod: &Pod, role: Role, namespace: &str, nad: &str, now: u64) -> Option<String> {
    let name = pod.name_any();
    let node = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .map(|n| format!(" on node {n}"))
        .unwrap_or_default();
    let who = format!("{} pod {name}{node}", role.as_str());
    let status = pod.status.as_ref()?;
    let containers = status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten());
    for c in containers {
        let Some(w) = c.state.as_ref().and_then(|s| s.waiting.as_ref()) else {
            continue;
        };
        let reason = w.reason.as_deref().unwrap_or_default();
        if let Some((_, what)) = BROKEN_WAITING.iter().find(|(r, _)| *r == reason) {
            let msg = w.message.as_deref().unwrap_or("").trim();
            return Some(
                format!("{who}: {what} ({reason}: {msg}) [image {}]", c.image).replace(": )", ")"),
            );
        }
    }
    let unschedulable = status.conditions.iter().flatten().find(|c| {
        c.type_ == "PodScheduled"
            && c.status == "False"
            && c.reason.as_deref() == Some("Unschedulable")
    });
    if let Some(c) = unschedulable {
        let since = c
            .last_transition_time
            .as_ref()
            .map(|t| t.0.as_second().max(0) as u64)
            .unwrap_or(0);
        if now.saturating_sub(since) >= UNSCHEDULABLE_GRACE_SECONDS {
            return Some(format!(
                "{who} cannot be scheduled: {}",
                c.message.as_deref().unwrap_or("Unschedulable")
            ));
        }
    }
    // Multus reports the attachments before the containers start: a
    // running server without an address on the test attachment was never
    // attached (no Multus, or it does not know the definition).
    if role == Role::Server
        && pod_phase(pod) == "Running"
        && super::multus::attachment_ipv4(pod, namespace, nad).is_none()
    {
        return Some(format!(
            "{who} is running without an address on the test attachment {namespace}/{nad} \
             (no entry in its k8s.v1.cni.cncf.io/network-status annotation): is Multus installed, \
             and does NetworkAttachmentDefinition {namespace}/{nad} exist?"
        ));
    }
    None
}

/// A test pod (or the test attachment definition) that could not be
/// created, and whether retrying within the run can help.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct CreateFailure {
    pub message: String,
    /// The API refused (4xx other than conflict or throttling): the run
    /// fails at once with this message instead of timing out.
    pub fatal: bool,
}

fn refused(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if (400..500).contains(&s.code) && s.code != 409 && s.code != 429)
}

impl CreateFailure {
    pub(crate) fn pod(what: &str, e: &kube::Error) -> Self {
        CreateFailure {
            message: format!(
                "cannot create test pod {what}: {}",
                crate::api_error_text(e)
            ),
            fatal: refused(e),
        }
    }

    pub(crate) fn nad(namespace: &str, network: &str, e: &Error) -> Self {
        let nad = test_nad_name(network);
        let (text, fatal, missing_crd) = match e {
            Error::Kube(k) => (
                crate::api_error_text(k),
                refused(k),
                matches!(k, kube::Error::Api(s) if s.code == 404),
            ),
            other => (other.to_string(), false, false),
        };
        let hint = if missing_crd {
            " (the NetworkAttachmentDefinition CRD is not installed: install Multus)"
        } else {
            ""
        };
        CreateFailure {
            message: format!(
                "cannot create the test attachment definition {namespace}/{nad}: {text}{hint}"
            ),
            fatal,
        }
    }
}
