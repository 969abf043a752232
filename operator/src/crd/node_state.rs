//! `RdmaNodeState`: one per node, named after it, owned by the operator.
//! `spec` is what the controller merged from every network selecting the
//! node; `status` is what that node's agent found and did.

use super::conditions::Condition;
use super::network::{IrqAffinity, QosSpec, RdmaNetnsModeSetting};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The VFs of one PF that one network uses.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VfGroup {
    /// The `RdmaNetwork` this group belongs to.
    pub network: String,
    /// Full extended resource name (`rdma/vf`).
    pub resource_name: String,
    /// VF indices in kernel list form (`0-3`).
    pub vf_range: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
}

/// Desired configuration of one PF.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PfConfig {
    pub pci_address: String,
    /// The PF netdev as the agent reported it (for the device plugin's `pfNames`).
    pub if_name: String,
    pub num_vfs: u32,
    /// PF MTU: the largest MTU of its groups.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    #[serde(default)]
    pub vf_groups: Vec<VfGroup>,
    #[serde(default)]
    pub irq_affinity: IrqAffinity,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qos: Option<QosSpec>,
}

#[derive(
    CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema,
)]
#[kube(
    group = "kroce.io",
    version = "v1alpha1",
    kind = "RdmaNodeState",
    plural = "rdmanodestates",
    shortname = "rdmanode",
    category = "kroce",
    status = "RdmaNodeStateStatus",
    derive = "PartialEq",
    derive = "Default",
    printcolumn = r#"{"name":"Sync","type":"string","jsonPath":".status.syncState"}"#,
    printcolumn = r#"{"name":"PFs","type":"integer","jsonPath":".status.configuredPfs"}"#,
    printcolumn = r#"{"name":"Admission","type":"string","jsonPath":".status.admissionPhase"}"#,
    printcolumn = r#"{"name":"Error","type":"string","jsonPath":".status.lastError","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct RdmaNodeStateSpec {
    pub node_name: String,
    /// PFs to configure; PFs not listed keep (or go back to) zero VFs only
    /// if kroce configured them before (see the agent's README section).
    #[serde(default)]
    pub pfs: Vec<PfConfig>,
    /// Soft RDMA devices (rxe) by netdev: nothing to create, only to check.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub soft_devices: Vec<SoftDeviceGroup>,
    /// The RDMA netns mode each network on this node asks for (networks
    /// with `rdmaNetnsMode: unmanaged` are not listed). The agent applies
    /// it when all agree; different modes: `Degraded`, nothing written.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rdma_netns_modes: Vec<NetnsModeRequest>,
}

/// One network's `rdmaNetnsMode` on this node.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetnsModeRequest {
    pub network: String,
    pub mode: RdmaNetnsModeSetting,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum SyncState {
    #[default]
    Pending,
    InProgress,
    Succeeded,
    Failed,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObservedVf {
    pub index: u32,
    pub pci_address: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netdev: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rdma_device: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa_node: Option<u32>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObservedQos {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trust: Option<String>,
    /// Priorities with PFC enabled.
    #[serde(default)]
    pub pfc_priorities: Vec<u8>,
    /// Priorities with ECN enabled on both reaction and notification points.
    #[serde(default)]
    pub ecn_priorities: Vec<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roce_tos: Option<u8>,
}

/// One SR-IOV capable PF as the agent found it: the inventory the
/// controller matches `nicSelector` against.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObservedPf {
    pub pci_address: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub if_name: Option<String>,
    /// 4 hex digits.
    pub vendor: String,
    #[serde(rename = "deviceID")]
    pub device_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
    pub total_vfs: u32,
    pub num_vfs: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa_node: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rdma_device: Option<String>,
    /// `Ethernet` or `InfiniBand`, from the RDMA port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_layer: Option<String>,
    #[serde(default)]
    pub vfs: Vec<ObservedVf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qos: Option<ObservedQos>,
}

/// Where one IRQ was put.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IrqPlacement {
    pub irq: u32,
    /// Netdev (or PCI address) the IRQ belongs to.
    pub device: String,
    /// CPU list now in `smp_affinity_list`.
    pub cpus: String,
    /// The kernel refused the write (managed IRQ) or it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

// Not `Eq`: admission results carry measured numbers (f64).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RdmaNodeStateStatus {
    /// `metadata.generation` of the spec the agent last applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default)]
    pub sync_state: SyncState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// When the node agent last wrote this status: on every change of what
    /// it found, and at least every `--heartbeat-seconds` (default 300, at
    /// the next resync) while it runs; older than that plus the resync
    /// means the agent is not running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_sync_time: Option<String>,
    /// Number of spec PFs configured as asked.
    #[serde(default)]
    pub configured_pfs: u32,
    /// Every SR-IOV capable PF on the node.
    #[serde(default)]
    pub pfs: Vec<ObservedPf>,
    /// PCI addresses of the PFs whose VFs kroce created: a PF that leaves
    /// the spec goes back to zero VFs only if it is listed here.
    #[serde(default)]
    pub managed_pfs: Vec<String>,
    /// The spec's soft-device netdevs as found on the node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub soft_devices: Vec<ObservedSoftDevice>,
    /// VFs that must go but are held by pods (the `VfsHeld` condition, as
    /// data: what the controller's `--drain-held-vfs` evicts).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub held_vfs: Vec<HeldVf>,
    #[serde(default)]
    pub irq_placement: Vec<IrqPlacement>,
    /// `Ready`, `Degraded`, `VfsHeld`, `IrqBalanceRunning`, ...
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// Perftest admission, one entry per network selecting the node
    /// (written by the controller, field manager `kroce-admission`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub admission: Vec<super::admission::NetworkAdmission>,
    /// `Admitted` when every network admits the node, else the least
    /// advanced phase (`Pending`, `Testing`, `Failed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admission_phase: Option<String>,
}

impl RdmaNodeState {
    /// The agent reports the current spec applied.
    pub fn in_sync(&self) -> bool {
        self.status.as_ref().is_some_and(|st| {
            st.sync_state == SyncState::Succeeded
                && st.observed_generation.is_some()
                && st.observed_generation == self.metadata.generation
        })
    }

    /// The agent reports that only a reboot applies the RDMA netns mode its
    /// networks ask (`RdmaNetnsModePending`, reason `RebootRequired`).
    pub fn netns_reboot_required(&self) -> bool {
        self.status
            .as_ref()
            .is_some_and(|st| netns_reboot_required(&st.conditions))
    }

    /// The agent's report is about the current spec.
    pub fn reported_current(&self) -> bool {
        self.status.as_ref().is_some_and(|st| {
            st.observed_generation.is_some() && st.observed_generation == self.metadata.generation
        })
    }
}

/// Whether `conditions` say only a reboot applies the RDMA netns mode.
pub fn netns_reboot_required(conditions: &[Condition]) -> bool {
    use crate::names::{NETNS_MODE_PENDING_CONDITION, NETNS_MODE_REBOOT_REQUIRED};
    conditions.iter().any(|c| {
        c.type_ == NETNS_MODE_PENDING_CONDITION
            && c.is_true()
            && c.reason == NETNS_MODE_REBOOT_REQUIRED
    })
}

/// One network's soft RDMA devices on this node: netdevs that already carry
/// an rxe/siw device, advertised by the device plugin's `ifNames` selector.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SoftDeviceGroup {
    pub network: String,
    /// Full extended resource name (`rdma/vf`).
    pub resource_name: String,
    pub if_names: Vec<String>,
}

/// A soft-device netdev as the agent found it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObservedSoftDevice {
    pub if_name: String,
    /// The netdev exists in the host (agent's) network namespace.
    pub present: bool,
    /// The RDMA device over it (`rxe_kvf0`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rdma_device: Option<String>,
}

/// A VF the spec removes that pods still hold.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HeldVf {
    /// The PF's PCI address.
    pub pf: String,
    pub index: u32,
    pub pci_address: String,
    /// `namespace/name` of each holding pod; empty when the holder is not a
    /// pod kroce can name (netdev moved away, other driver, pods unlisted).
    #[serde(default)]
    pub pods: Vec<String>,
    /// Why the VF counts as held, for people.
    pub reason: String,
}
