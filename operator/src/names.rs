//! Every label, annotation, finalizer and field-manager name the controller
//! and the node agent write, defined once. (Pod-facing annotations shared
//! with the device plugin, CNI and NRI, and the DRA driver's name and
//! config apiVersion/kind shared with kroce-dra, live in `kroce_contracts`.)

/// Field manager of everything the controller applies, and the value of
/// [`MANAGED_BY_LABEL`] on what it creates.
pub const MANAGER: &str = "kroce-operator";
/// Field manager of the node agent's `RdmaNodeState` status.
pub const AGENT_MANAGER: &str = "kroce-node-agent";
/// Field manager of the admission gate's writes (taints, marks, run pods).
pub const ADMISSION_MANAGER: &str = "kroce-admission";
/// Field manager of `status.drain` on an `RdmaNetwork` (the controller's
/// drain loop, apart from the network loop's own status fields).
pub const DRAIN_MANAGER: &str = "kroce-drain";

/// Finalizer on every `RdmaNetwork`: its attachment definitions and VFs go
/// before the object does.
pub const FINALIZER: &str = "kroce.io/cleanup";

/// `app.kubernetes.io/managed-by` on what the controller creates.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// On each NetworkAttachmentDefinition and DeviceClass: the `RdmaNetwork`
/// it belongs to.
pub const NETWORK_LABEL: &str = "kroce.io/network";

/// On a Node the controller cordoned to free held VFs: why (see drain).
pub const DRAIN_ANNOTATION: &str = "kroce.io/drain";
/// On a Node kroce is draining: when the drain started (RFC 3339), for
/// `--drain-timeout-seconds`.
pub const DRAIN_STARTED_ANNOTATION: &str = "kroce.io/drain-started";
/// On a Node whose drain timed out: the `RdmaNodeState` generation it
/// timed out at. The node is skipped until that generation changes (or
/// someone removes the annotation).
pub const DRAIN_TIMED_OUT_ANNOTATION: &str = "kroce.io/drain-timed-out";

/// The `RdmaNodeState` condition the node agent sets while the host's live
/// RDMA netns mode differs from the one its networks ask
/// (`spec.rdmaNetnsMode`).
pub const NETNS_MODE_PENDING_CONDITION: &str = "RdmaNetnsModePending";
/// [`NETNS_MODE_PENDING_CONDITION`]'s reason when only a reboot can apply
/// the mode (the kernel refuses to change it while pods' netns exist).
pub const NETNS_MODE_REBOOT_REQUIRED: &str = "RebootRequired";
/// On a Node whose agent reports [`NETNS_MODE_REBOOT_REQUIRED`]: the
/// controller sets it (to [`NETNS_MODE_PENDING_VALUE`]) and removes it when
/// the condition clears, so admins can select such nodes.
pub const NETNS_MODE_PENDING_LABEL: &str = "kroce.io/rdma-netns-mode-pending";
/// The only value of [`NETNS_MODE_PENDING_LABEL`].
pub const NETNS_MODE_PENDING_VALUE: &str = "reboot-required";

/// On a Node kroce is rebooting for its RDMA netns mode
/// (`--reboot-for-rdma-mode`): whether kroce cordoned it (as
/// [`DRAIN_ANNOTATION`]'s values).
pub const REBOOT_ANNOTATION: &str = "kroce.io/reboot";
/// On a Node kroce is rebooting: when it started (RFC 3339), for
/// `--drain-timeout-seconds`.
pub const REBOOT_STARTED_ANNOTATION: &str = "kroce.io/reboot-started";
/// On a Node that did not come back with its RDMA netns mode in time: the
/// `RdmaNodeState` generation it gave up at. Skipped until that changes
/// (or someone removes the annotation).
pub const REBOOT_TIMED_OUT_ANNOTATION: &str = "kroce.io/reboot-timed-out";
/// On an `RdmaNodeState` (which its agent reads, without Node RBAC): the
/// controller asks the agent to reboot the host out of this boot (the
/// Node's `status.nodeInfo.bootID`, the host's
/// `/proc/sys/kernel/random/boot_id`). Once the host booted again the id
/// differs, so a request is acted on at most once.
pub const REBOOT_REQUEST_ANNOTATION: &str = "kroce.io/reboot-boot-id";

/// On admission perftest pods: the run they belong to.
pub const ADMISSION_RUN_LABEL: &str = "kroce.io/admission-run";
/// On admission perftest pods: the `RdmaNetwork` under test. Not
/// [`NETWORK_LABEL`]: these pods are not attachment definitions.
pub const ADMISSION_NETWORK_LABEL: &str = "kroce.io/admission-network";
/// On admission perftest pods: server or client.
pub const ADMISSION_ROLE_LABEL: &str = "kroce.io/admission-role";

/// Multus: the attachments a pod asks for.
pub const MULTUS_NETWORKS_ANNOTATION: &str = "k8s.v1.cni.cncf.io/networks";
/// Multus: the attachments a pod got (interfaces, IPs, device info).
pub const MULTUS_NETWORK_STATUS_ANNOTATION: &str = "k8s.v1.cni.cncf.io/network-status";
/// Multus: on a NetworkAttachmentDefinition, the device plugin resource.
pub const MULTUS_RESOURCE_ANNOTATION: &str = "k8s.v1.cni.cncf.io/resourceName";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_distinct() {
        let labels = [
            MANAGED_BY_LABEL,
            NETWORK_LABEL,
            DRAIN_ANNOTATION,
            DRAIN_STARTED_ANNOTATION,
            DRAIN_TIMED_OUT_ANNOTATION,
            NETNS_MODE_PENDING_LABEL,
            REBOOT_ANNOTATION,
            REBOOT_STARTED_ANNOTATION,
            REBOOT_TIMED_OUT_ANNOTATION,
            REBOOT_REQUEST_ANNOTATION,
            ADMISSION_RUN_LABEL,
            ADMISSION_NETWORK_LABEL,
            ADMISSION_ROLE_LABEL,
            FINALIZER,
        ];
        let managers = [MANAGER, AGENT_MANAGER, ADMISSION_MANAGER, DRAIN_MANAGER];
        for set in [&labels[..], &managers[..]] {
            let mut s: Vec<&str> = set.to_vec();
            s.sort_unstable();
            s.dedup();
            assert_eq!(s.len(), set.len(), "{set:?}");
        }
    }
}
