//! `RdmaNetwork`: one RDMA network as the admin describes it.

use super::admission::AdmissionSpec;
use super::conditions::Condition;
use kroce_contracts::link_limits;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Which PFs of a selected node carry this network. Every set field must
/// match; an empty selector matches nothing (the controller says so).
/// `ifNames` instead selects netdevs that already carry a soft RDMA device
/// (rxe, siw): no PFs, no VFs, nothing for the node agent to create.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(
    "!has(self.ifNames) || !(has(self.vendor) || has(self.deviceID) || has(self.pfNames) || has(self.rootDevices))"
).message("ifNames (soft devices) cannot be combined with vendor, deviceID, pfNames or rootDevices"))]
#[x_kube(validation = Rule::new(
    "has(self.vendor) || has(self.deviceID) || (has(self.pfNames) && size(self.pfNames) > 0) || (has(self.rootDevices) && size(self.rootDevices) > 0) || (has(self.ifNames) && size(self.ifNames) > 0)"
).message("nicSelector is empty: set vendor, deviceID, pfNames or rootDevices (SR-IOV PFs) or ifNames (soft devices)"))]
pub struct NicSelector {
    /// PCI vendor id, 4 hex digits (`15b3` for NVIDIA/Mellanox).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9a-fA-F]{4}$"))]
    pub vendor: Option<String>,
    /// PCI device id of the PF, 4 hex digits (`101d` for ConnectX-6 Dx).
    #[serde(rename = "deviceID", default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9a-fA-F]{4}$"))]
    pub device_id: Option<String>,
    /// PF netdev names, optionally with the VF indices this network uses:
    /// `ens1f0` (all VFs) or `ens1f0#0-3` (VFs 0 to 3).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "pf_names_schema")]
    pub pf_names: Vec<String>,
    /// PF PCI addresses (`0000:3b:00.0`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "root_devices_schema")]
    pub root_devices: Vec<String>,
    /// Netdevs carrying a soft RDMA device (rxe over a macvlan per "VF"),
    /// one device each, advertised as they are; leave `numVfs` unset.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "if_names_schema")]
    pub if_names: Vec<String>,
}

impl NicSelector {
    pub fn is_empty(&self) -> bool {
        !self.selects_pfs() && self.if_names.is_empty()
    }

    /// Whether any PF field (vendor, deviceID, pfNames, rootDevices) is set.
    pub fn selects_pfs(&self) -> bool {
        self.vendor.is_some()
            || self.device_id.is_some()
            || !self.pf_names.is_empty()
            || !self.root_devices.is_empty()
    }

    /// Soft devices by netdev name (`ifNames`), no PFs.
    pub fn is_soft(&self) -> bool {
        !self.if_names.is_empty() && !self.selects_pfs()
    }
}

/// Longest netdev name the kernel accepts (IFNAMSIZ - 1).
pub const MAX_IFNAME_LEN: usize = 15;
/// Bounds on `pfNames` (entries, characters each): they keep the CEL
/// rules' cost estimate within the API server's budget.
pub const MAX_PF_NAMES: usize = 32;
pub const MAX_PF_NAME_LEN: usize = 32;
/// Bounds on `networkNamespaces` (entries); each is a DNS-1123 label.
pub const MAX_NETWORK_NAMESPACES: usize = 256;
/// Longest `metadata.name`: it is the default `resourceName` and a label
/// value (cleanup selects by it), both at most 63 characters.
pub const MAX_NETWORK_NAME_LEN: usize = 63;
/// DNS-1123 label (RE2 and Rust `regex` alike).
pub const DNS_LABEL_PATTERN: &str = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";

fn pf_names_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "maxItems": MAX_PF_NAMES,
        "items": {
            "type": "string",
            "minLength": 1,
            "maxLength": MAX_PF_NAME_LEN,
            "x-kubernetes-validations": [{
                "rule": r"self.matches('^[^/:\\s#]{1,15}(#[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*)?$')",
                "message": "pfNames entries are a netdev name (1-15 characters), optionally with VF indices: ens1f0 or ens1f0#0-3,6"
            }]
        }
    })
}

/// PCI addresses as `sriov_helpers::PciAddress` parses them: `DDDD:BB:DD.F`
/// or `BB:DD.F`, device below 0x20, function below 8.
fn root_devices_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "items": {
            "type": "string",
            "maxLength": 13,
            "pattern": r"^([0-9a-fA-F]{1,8}:)?[0-9a-fA-F]{1,2}:[01]?[0-9a-fA-F]\.[0-7]$"
        }
    })
}

fn network_namespaces_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "maxItems": MAX_NETWORK_NAMESPACES,
        "items": {
            "type": "string",
            "maxLength": 63,
            "x-kubernetes-validations": [{
                "rule": format!("self.matches('{DNS_LABEL_PATTERN}')"),
                "message": "networkNamespaces entries must be namespace names (DNS-1123 labels: a-z, 0-9, '-', at most 63 characters)"
            }]
        }
    })
}

/// `ipam` is passed to the CNI as it is; its `type` and a top-level
/// `subnet` (host-local's) are declared so CEL can check them.
fn ipam_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
        "required": ["type"],
        "properties": {
            "type": {"type": "string", "minLength": 1, "maxLength": 253},
            "subnet": {"type": "string", "maxLength": 64},
            "rangeStart": {"type": "string", "maxLength": 64},
            "rangeEnd": {"type": "string", "maxLength": 64}
        },
        "x-kubernetes-validations": [{
            "rule": "!has(self.subnet) || isCIDR(self.subnet)",
            "message": "ipam.subnet must be a CIDR (e.g. 10.56.0.0/16)"
        }, {
            "rule": "!has(self.subnet) || !isCIDR(self.subnet) || cidr(self.subnet) == cidr(self.subnet).masked()",
            "message": "ipam.subnet has host bits set: write the network address (10.0.0.0/24, not 10.0.0.5/24)",
            "fieldPath": ".subnet"
        }, {
            "rule": "!has(self.rangeStart) || !has(self.subnet) || !isCIDR(self.subnet) || (isIP(self.rangeStart) && cidr(self.subnet).containsIP(self.rangeStart))",
            "message": "ipam.rangeStart must be an address inside ipam.subnet",
            "fieldPath": ".rangeStart"
        }, {
            "rule": "!has(self.rangeEnd) || !has(self.subnet) || !isCIDR(self.subnet) || (isIP(self.rangeEnd) && cidr(self.subnet).containsIP(self.rangeEnd))",
            "message": "ipam.rangeEnd must be an address inside ipam.subnet",
            "fieldPath": ".rangeEnd"
        }]
    })
}

/// `memlock`: the grammar of `kroce_contracts::memlock` (its one place),
/// checked by a CEL rule so a refusal reads as a sentence, not a regex.
fn memlock_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let pattern = kroce_contracts::memlock::crd_pattern();
    schemars::json_schema!({
        "type": "string",
        "nullable": true,
        "maxLength": 32,
        "x-kubernetes-validations": [{
            "rule": format!("self.matches('{pattern}')"),
            "message": "memlock must be \"unlimited\" or a whole number of bytes above 0 with an optional suffix Ki, Mi, Gi, Ti (x1024) or k, M, G, T (x1000), e.g. 64Gi"
        }]
    })
}

/// `maxUnavailable`: the grammar of `kroce_contracts::max_unavailable`
/// (its one place), checked by a CEL rule (as `memlock`) so a refusal
/// reads as a sentence.
fn max_unavailable_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let pattern = kroce_contracts::max_unavailable::crd_pattern();
    schemars::json_schema!({
        "type": "string",
        "nullable": true,
        "maxLength": 8,
        "x-kubernetes-validations": [{
            "rule": format!("self.matches('{pattern}')"),
            "message": "maxUnavailable must be a whole number of nodes (1 to 99999) or a percentage of them (1% to 100%), as a string, e.g. \"3\" or \"10%\""
        }]
    })
}

fn if_names_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "maxItems": 256,
        "items": {
            "type": "string",
            "minLength": 1,
            "maxLength": MAX_IFNAME_LEN,
            "pattern": r"^[^/:\s]+$"
        }
    })
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum IrqPolicy {
    /// Pin each device's IRQs round-robin on its NUMA node's CPUs.
    #[default]
    NumaLocal,
    /// Leave IRQ affinity alone.
    None,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum ReservedCpusMode {
    /// Keep IRQs off `reservedCpus` (CPUs isolated for workloads).
    #[default]
    Exclude,
    /// Put IRQs only on `reservedCpus` (housekeeping CPUs) that are NUMA-local.
    Only,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IrqAffinity {
    #[serde(default)]
    pub policy: IrqPolicy,
    /// Kernel CPU list (`0-1,16-17`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*$"))]
    pub reserved_cpus: Option<String>,
    /// What `reservedCpus` means: `exclude` (default) or `only`.
    #[serde(default)]
    pub reserved_cpus_mode: ReservedCpusMode,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Trust {
    /// Classify by DSCP (RoCE v2 over routed fabrics).
    #[default]
    Dscp,
    /// Classify by the VLAN PCP bits.
    Pcp,
}

fn default_pfc_priority() -> u8 {
    3
}
fn default_true() -> bool {
    true
}

/// How pods get this network's VFs.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Frontend {
    /// The device plugin advertises `rdma/<resourceName>`; pods attach
    /// through Multus and a NetworkAttachmentDefinition per namespace.
    #[default]
    DevicePlugin,
    /// DRA (resource.k8s.io/v1, Kubernetes 1.34+): a DeviceClass named
    /// after the network selects its VFs (driver `rdma.kroce.io`) and
    /// carries its vlan/mtu/ipam/memlock; pods claim it with a
    /// ResourceClaim. No device plugin pool, no Multus.
    Dra,
}

impl Frontend {
    fn is_device_plugin(&self) -> bool {
        *self == Frontend::DevicePlugin
    }
}

/// The host's RDMA netns mode a network needs on its nodes (ib_core's
/// `netns_mode`, `rdma system show`).
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub enum RdmaNetnsModeSetting {
    /// Each RDMA device lives in one netns and moves with its VF into the
    /// pod: RDMA isolation between pods (kroce-cni's `rdma: auto` moves it).
    Exclusive,
    /// Every RDMA device is visible in every netns; none moves.
    Shared,
    /// kroce leaves the mode (and its module option) alone: the default.
    #[default]
    Unmanaged,
}

impl RdmaNetnsModeSetting {
    pub fn is_unmanaged(&self) -> bool {
        *self == RdmaNetnsModeSetting::Unmanaged
    }
}

/// RoCE QoS of the PFs carrying this network.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QosSpec {
    /// `dscp` (default) or `pcp`.
    #[serde(default)]
    pub trust: Trust,
    /// The lossless priority: PFC on this priority only, ECN on it.
    #[serde(default = "default_pfc_priority")]
    #[schemars(range(min = 0, max = 7))]
    pub pfc_priority: u8,
    /// ECN (DCQCN reaction and notification points) on `pfcPriority`.
    #[serde(default = "default_true")]
    pub ecn: bool,
    /// RDMA-CM default ToS byte (e.g. 106 = DSCP 26 with ECT); unset leaves it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roce_tos: Option<u8>,
}

impl Default for QosSpec {
    fn default() -> Self {
        QosSpec {
            trust: Trust::Dscp,
            pfc_priority: default_pfc_priority(),
            ecn: true,
            roce_tos: None,
        }
    }
}

/// An RDMA network: VFs on the selected NICs of the selected nodes, pinned
/// and QoS-configured, advertised as `rdma/<resourceName>` and attached
/// through a NetworkAttachmentDefinition in each `networkNamespaces` entry.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[kube(
    group = "kroce.io",
    version = "v1alpha1",
    kind = "RdmaNetwork",
    plural = "rdmanetworks",
    shortname = "rdmanet",
    category = "kroce",
    status = "RdmaNetworkStatus",
    derive = "PartialEq",
    printcolumn = r#"{"name":"VFs","type":"integer","jsonPath":".spec.numVfs"}"#,
    printcolumn = r#"{"name":"Resource","type":"string","jsonPath":".spec.resourceName"}"#,
    printcolumn = r#"{"name":"Ready","type":"integer","jsonPath":".status.readyNodes"}"#,
    printcolumn = r#"{"name":"Matched","type":"integer","jsonPath":".status.matchedNodes"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[kube(validation = Rule::new(
    "self.metadata.name.size() <= 63"
).message("metadata.name must be at most 63 characters: it is the default resourceName and a label value").field_path(".metadata.name"))]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(
    "!has(self.vlanQoS) || (has(self.vlan) && self.vlan > 0)"
).message("vlanQoS needs a non-zero vlan: the priority travels in the VLAN tag").field_path(".vlanQoS"))]
#[x_kube(validation = Rule::new(
    "!has(self.nicSelector.pfNames) || !has(self.numVfs) || self.nicSelector.pfNames.all(p, !p.contains('#') || p.split('#')[1].split(',').all(r, r.split('-').all(i, int(i) < self.numVfs)))"
).message("nicSelector.pfNames uses a VF index at or above numVfs (VFs are 0 to numVfs-1)").field_path(".nicSelector.pfNames"))]
#[x_kube(validation = Rule::new(
    "has(self.nicSelector.ifNames) || (has(self.numVfs) && self.numVfs > 0)"
).message("numVfs (at least 1) is required when nicSelector selects PFs (vendor, deviceID, pfNames, rootDevices)"))]
#[x_kube(validation = Rule::new(
    "!has(self.nicSelector.ifNames) || !has(self.numVfs) || self.numVfs == 0"
).message("numVfs must be unset (or 0) with nicSelector.ifNames: soft devices get no VFs"))]
pub struct RdmaNetworkSpec {
    /// Node labels that must all match (empty: every node).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    pub nic_selector: NicSelector,
    /// VFs to create on each selected PF (the PF's `sriov_numvfs`).
    /// Required (at least 1) with PF selectors; unset with `ifNames`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 4096))]
    pub num_vfs: Option<u32>,
    /// Advertised as `rdma/<resourceName>`; defaults to the network's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[a-zA-Z0-9]([-a-zA-Z0-9_.]{0,61}[a-zA-Z0-9])?$"))]
    pub resource_name: Option<String>,
    /// MTU of the VFs (the PF gets at least this).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = link_limits::MTU_MIN, max = link_limits::MTU_MAX))]
    pub mtu: Option<u32>,
    /// VLAN id the CNI sets on each VF (0 or unset: untagged).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = link_limits::VLAN_MAX))]
    pub vlan: Option<u16>,
    /// VLAN priority (PCP) the CNI sets with `vlan`.
    #[serde(rename = "vlanQoS", default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 7))]
    pub vlan_qos: Option<u8>,
    /// CNI IPAM configuration, passed through verbatim (e.g. host-local, whereabouts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "ipam_schema")]
    pub ipam: Option<serde_json::Value>,
    /// Namespaces that get a NetworkAttachmentDefinition named after this network.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "network_namespaces_schema")]
    pub network_namespaces: Vec<String>,
    /// Locked-memory limit for pods on this network: `unlimited`, or a
    /// whole number of bytes with an optional Kubernetes quantity suffix:
    /// Ki, Mi, Gi, Ti (x1024) or k, M, G, T (x1000), e.g. `64Gi`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "memlock_schema")]
    pub memlock: Option<String>,
    #[serde(default)]
    pub irq_affinity: IrqAffinity,
    /// RoCE QoS; unset leaves the NIC's QoS alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qos: Option<QosSpec>,
    /// The host's RDMA netns mode this network needs on its nodes:
    /// `exclusive` (RDMA isolation: the device moves into the pod),
    /// `shared`, or `unmanaged` (default: kroce leaves it alone). The node
    /// agent writes the module option for the next boot and sets the mode
    /// live when the kernel allows it (no netns but the host's yet); else
    /// the node reports `RdmaNetnsModePending` (reason `RebootRequired`).
    /// Networks on one node must agree.
    #[serde(default, skip_serializing_if = "RdmaNetnsModeSetting::is_unmanaged")]
    pub rdma_netns_mode: RdmaNetnsModeSetting,
    /// Perftest admission (see the admission docs); unset admits on configuration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admission: Option<AdmissionSpec>,
    /// `devicePlugin` (default): a device plugin resource and Multus
    /// attachment definitions. `dra`: a DeviceClass named after the
    /// network instead (the node agent configures the VFs either way).
    #[serde(default, skip_serializing_if = "Frontend::is_device_plugin")]
    pub frontend: Frontend,
    /// Disruption budget for the nodes this network needs drained (VFs it
    /// removes are held by pods; the controller's `--drain-held-vfs`): at
    /// most this many of the nodes carrying this network unschedulable at
    /// once, a count (`3`) or a percentage of them (`10%`, rounded down,
    /// at least 1). Quote it. Unset: the controller's
    /// `--drain-max-unavailable` (default 1) over all kroce nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "max_unavailable_schema")]
    pub max_unavailable: Option<String>,
}

impl RdmaNetworkSpec {
    /// `numVfs`, 0 when unset (soft devices).
    pub fn vf_count(&self) -> u32 {
        self.num_vfs.unwrap_or(0)
    }

    /// `rdma/<resourceName>`, the network's name when unset (the device
    /// plugin derives the same name: `kroce_contracts::resource_name`).
    pub fn full_resource_name(&self, network: &str) -> String {
        kroce_contracts::resource_name::qualified(self.resource_name.as_deref().unwrap_or(network))
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RdmaNetworkStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready`, `Progressing`, `Degraded`.
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// Nodes selected by `nodeSelector` that have a matching PF.
    #[serde(default)]
    pub matched_nodes: u32,
    /// Matched nodes whose agent reports this network configured.
    #[serde(default)]
    pub ready_nodes: u32,
    /// Drains of nodes this network needs drained (field manager
    /// `kroce-drain`); absent when there are none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain: Option<DrainStatus>,
}

/// Most node names a [`DrainStatus`] list carries (the counts are exact).
pub const DRAIN_STATUS_MAX_NAMES: usize = 32;

/// The drain of one network's nodes: what `--drain-held-vfs` is doing to
/// free the VFs this network removes.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DrainStatus {
    /// The budget in force for these nodes, in nodes.
    pub max_unavailable: u32,
    /// Nodes in the budget's scope unschedulable now, kroce's drains and
    /// everyone else's cordons alike.
    pub unavailable_nodes: u32,
    /// Nodes being drained now.
    pub draining_nodes: u32,
    /// Nodes waiting for room in the budget.
    pub waiting_nodes: u32,
    /// Nodes whose drain did not end within `--drain-timeout-seconds`:
    /// released and skipped until their spec changes.
    pub timed_out_nodes: u32,
    /// The first of the nodes being drained, by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub draining: Vec<String>,
    /// The first of the timed-out nodes, by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub timed_out: Vec<String>,
}
