//! Controller-side validation of an `RdmaNetwork` spec. The CRD schema
//! catches types and ranges; this catches what a schema cannot (CPU lists,
//! VF ranges against `numVfs`, IPAM shape), with messages naming the field.

use crate::crd::network::{MAX_IFNAME_LEN, MAX_NETWORK_NAMESPACES, MAX_PF_NAME_LEN, MAX_PF_NAMES};
use crate::crd::{Frontend, RdmaNetworkSpec};
use kroce_contracts::link_limits;
use sriov_helpers::{CpuList, PciAddress, PfSelector};
use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// JSON path in the spec, e.g. `spec.nicSelector.pfNames[1]`.
    pub field: String,
    pub message: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

fn err(field: impl Into<String>, message: impl Into<String>) -> FieldError {
    FieldError {
        field: field.into(),
        message: message.into(),
    }
}

/// DNS-1123 label, as namespaces must be.
fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// `addr/prefix` as the API server's CEL `isCIDR()` takes it (Go's
/// `netip.ParsePrefix`): no zone, no IPv4-mapped IPv6, prefix within the
/// address family, decimal without sign or leading zeros.
pub fn is_cidr(s: &str) -> bool {
    let Some((addr, bits)) = s.split_once('/') else {
        return false;
    };
    if addr.contains('%')
        || bits.is_empty()
        || !bits.bytes().all(|b| b.is_ascii_digit())
        || (bits.len() > 1 && bits.starts_with('0'))
    {
        return false;
    }
    let Ok(bits) = bits.parse::<u32>() else {
        return false;
    };
    match addr.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(_)) => bits <= 32,
        Ok(std::net::IpAddr::V6(v6)) => bits <= 128 && v6.to_ipv4_mapped().is_none(),
        Err(_) => false,
    }
}

/// A CIDR's address and prefix length (`is_cidr` first).
fn parse_cidr(s: &str) -> Option<(std::net::IpAddr, u32)> {
    if !is_cidr(s) {
        return None;
    }
    let (addr, bits) = s.split_once('/')?;
    Some((addr.parse().ok()?, bits.parse().ok()?))
}

/// `addr` with every bit past the first `bits` cleared.
fn masked(addr: std::net::IpAddr, bits: u32) -> std::net::IpAddr {
    use std::net::IpAddr;
    match addr {
        IpAddr::V4(a) => {
            let m = u32::MAX.checked_shl(32 - bits).unwrap_or(0);
            IpAddr::V4((u32::from(a) & m).into())
        }
        IpAddr::V6(a) => {
            let m = u128::MAX.checked_shl(128 - bits).unwrap_or(0);
            IpAddr::V6((u128::from(a) & m).into())
        }
    }
}

/// The ipam fields the controller can check without knowing the plugin:
/// a top-level `subnet` (host-local's) is a network address, and
/// `rangeStart`/`rangeEnd` are addresses inside it.
fn check_ipam_ranges(ipam: &serde_json::Value, errors: &mut Vec<FieldError>) {
    let Some(sub) = ipam.get("subnet").and_then(|s| s.as_str()) else {
        return;
    };
    let Some((net, bits)) = parse_cidr(sub) else {
        return;
    };
    let base = masked(net, bits);
    if base != net {
        errors.push(err(
            "spec.ipam.subnet",
            format!("{sub:?} has host bits set: write the network address, {base}/{bits}"),
        ));
    }
    for field in ["rangeStart", "rangeEnd"] {
        let Some(v) = ipam.get(field) else { continue };
        let inside = v
            .as_str()
            .and_then(|t| t.parse::<std::net::IpAddr>().ok())
            .is_some_and(|ip| ip.is_ipv4() == base.is_ipv4() && masked(ip, bits) == base);
        if !inside {
            errors.push(err(
                format!("spec.ipam.{field}"),
                format!("{v} is not an address inside ipam.subnet {base}/{bits}"),
            ));
        }
    }
}

/// The kernel's rule for a netdev name (`dev_valid_name`).
fn is_ifname(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_IFNAME_LEN
        && s != "."
        && s != ".."
        && !s.chars().any(|c| c == '/' || c == ':' || c.is_whitespace())
}

/// A `frontend: dra` network: what only the device plugin path does yet is
/// refused by name instead of silently not happening.
fn validate_dra(spec: &RdmaNetworkSpec, errors: &mut Vec<FieldError>) {
    if spec.admission.as_ref().is_some_and(|a| a.enabled) {
        errors.push(err(
            "spec.admission.enabled",
            "true with frontend: dra; perftest admission runs its pods through the device plugin \
             resource and Multus, which a dra network does not have (not supported yet: set \
             admission.enabled: false or frontend: devicePlugin)",
        ));
    }
    if !spec.network_namespaces.is_empty() {
        errors.push(err(
            "spec.networkNamespaces",
            format!(
                "{} with frontend: dra; a dra network has no NetworkAttachmentDefinitions (pods \
                 claim its DeviceClass instead): leave networkNamespaces empty",
                spec.network_namespaces.join(", ")
            ),
        ));
    }
    if let Some(q) = spec.vlan_qos {
        errors.push(err(
            "spec.vlanQoS",
            format!(
                "{q} with frontend: dra; the DRA plugin's config has no VLAN priority yet: unset it"
            ),
        ));
    }
}

/// A soft-device network (`ifNames`): names, no VFs, no PF-level settings.
fn validate_soft(spec: &RdmaNetworkSpec, errors: &mut Vec<FieldError>) {
    let mut seen = std::collections::BTreeSet::new();
    for (i, n) in spec.nic_selector.if_names.iter().enumerate() {
        if !is_ifname(n) {
            errors.push(err(
                format!("spec.nicSelector.ifNames[{i}]"),
                format!(
                    "{n:?} is not a netdev name (1-{MAX_IFNAME_LEN} characters, no '/', ':' or spaces)"
                ),
            ));
        } else if !seen.insert(n.as_str()) {
            errors.push(err(
                format!("spec.nicSelector.ifNames[{i}]"),
                format!("{n:?} is listed twice"),
            ));
        }
    }
    if let Some(n) = spec.num_vfs
        && n > 0
    {
        errors.push(err(
            "spec.numVfs",
            format!(
                "is {n}; leave it unset (or 0) with nicSelector.ifNames: soft devices get no VFs"
            ),
        ));
    }
    if spec.qos.is_some() {
        errors.push(err(
            "spec.qos",
            "configures PFs; a soft-device network (nicSelector.ifNames) has none, leave qos unset",
        ));
    }
    if spec.irq_affinity != crate::crd::IrqAffinity::default() {
        errors.push(err(
            "spec.irqAffinity",
            "pins PF and VF IRQs; a soft-device network (nicSelector.ifNames) has none, leave irqAffinity unset",
        ));
    }
}

/// Every problem in the spec, not just the first.
pub fn validate_network(name: &str, spec: &RdmaNetworkSpec) -> Result<(), Vec<FieldError>> {
    let mut errors = Vec::new();
    if !is_dns_label(name) {
        errors.push(err(
            "metadata.name",
            format!("{name:?} must be a DNS label (it names attachment definitions and pools)"),
        ));
    }
    validate_selector(spec, &mut errors);
    validate_node_config(spec, &mut errors);
    if let Some(ipam) = &spec.ipam {
        validate_ipam(ipam, &mut errors);
    }
    validate_namespaces(spec, &mut errors);
    validate_pod_facing(name, spec, &mut errors);
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

/// What the network selects: SR-IOV PFs (and their VFs) or soft devices,
/// never both; the selector fields' own syntax.
fn validate_selector(spec: &RdmaNetworkSpec, errors: &mut Vec<FieldError>) {
    let sel = &spec.nic_selector;
    if sel.is_empty() {
        errors.push(err(
            "spec.nicSelector",
            "is empty; set vendor, deviceID, pfNames or rootDevices (SR-IOV PFs) or ifNames (soft devices)",
        ));
    }
    if spec.frontend == Frontend::Dra {
        validate_dra(spec, errors);
    }
    if sel.selects_pfs() {
        if !sel.if_names.is_empty() {
            errors.push(err(
                "spec.nicSelector.ifNames",
                format!(
                    "{} cannot be combined with vendor, deviceID, pfNames or rootDevices: a network is either SR-IOV VFs or soft devices",
                    sel.if_names.join(", ")
                ),
            ));
        }
        if spec.vf_count() == 0 {
            errors.push(err(
                "spec.numVfs",
                format!(
                    "is {}; at least 1 is required when nicSelector selects PFs (vendor, deviceID, pfNames or rootDevices)",
                    spec.num_vfs.map_or("unset".to_string(), |n| n.to_string())
                ),
            ));
        }
    } else if !sel.if_names.is_empty() {
        validate_soft(spec, errors);
    }
    for (field, value) in [("vendor", &sel.vendor), ("deviceID", &sel.device_id)] {
        if let Some(v) = value
            && (v.len() != 4 || !v.bytes().all(|b| b.is_ascii_hexdigit()))
        {
            errors.push(err(
                format!("spec.nicSelector.{field}"),
                format!("{v:?} is not 4 hex digits"),
            ));
        }
    }
    validate_pf_names(spec, errors);
    for (i, r) in sel.root_devices.iter().enumerate() {
        if let Err(e) = r.parse::<PciAddress>() {
            errors.push(err(
                format!("spec.nicSelector.rootDevices[{i}]"),
                e.to_string(),
            ));
        }
    }
}

/// `pfNames` entries: count, length, syntax, and VF ranges within `numVfs`.
fn validate_pf_names(spec: &RdmaNetworkSpec, errors: &mut Vec<FieldError>) {
    let sel = &spec.nic_selector;
    if sel.pf_names.len() > MAX_PF_NAMES {
        errors.push(err(
            "spec.nicSelector.pfNames",
            format!("has {} entries; at most {MAX_PF_NAMES}", sel.pf_names.len()),
        ));
    }
    for (i, p) in sel.pf_names.iter().enumerate() {
        if p.len() > MAX_PF_NAME_LEN {
            errors.push(err(
                format!("spec.nicSelector.pfNames[{i}]"),
                format!("{p:?} is longer than {MAX_PF_NAME_LEN} characters"),
            ));
            continue;
        }
        match p.parse::<PfSelector>() {
            Ok(s) => {
                let n = spec.vf_count();
                if let Some(max) = s.vfs.as_ref().and_then(|v| v.iter().next_back())
                    && n > 0
                    && *max >= n
                {
                    errors.push(err(
                        format!("spec.nicSelector.pfNames[{i}]"),
                        format!("{p:?} uses VF {max}, but numVfs {n} makes VFs 0-{}", n - 1),
                    ));
                }
            }
            Err(e) => errors.push(err(format!("spec.nicSelector.pfNames[{i}]"), e.to_string())),
        }
    }
}

/// What the node agent applies: IRQ CPUs, VF count, MTU, VLAN and QoS.
fn validate_node_config(spec: &RdmaNetworkSpec, errors: &mut Vec<FieldError>) {
    if let Some(cpus) = &spec.irq_affinity.reserved_cpus
        && let Err(e) = cpus.parse::<CpuList>()
    {
        errors.push(err("spec.irqAffinity.reservedCpus", e.to_string()));
    }
    if let Some(n) = spec.num_vfs
        && n > 4096
    {
        errors.push(err("spec.numVfs", format!("{n} is above 4096")));
    }
    if let Some(mtu) = spec.mtu
        && !link_limits::MTU_RANGE.contains(&mtu)
    {
        errors.push(err(
            "spec.mtu",
            format!(
                "{mtu} is outside {}-{}",
                link_limits::MTU_MIN,
                link_limits::MTU_MAX
            ),
        ));
    }
    if let Some(vlan) = spec.vlan
        && vlan > link_limits::VLAN_MAX
    {
        errors.push(err(
            "spec.vlan",
            format!("{vlan} is outside 0-{}", link_limits::VLAN_MAX),
        ));
    }
    if let Some(q) = spec.vlan_qos {
        if q > 7 {
            errors.push(err("spec.vlanQoS", format!("{q} is outside 0-7")));
        }
        if spec.vlan.unwrap_or(0) == 0 {
            errors.push(err("spec.vlanQoS", "needs a non-zero spec.vlan"));
        }
    }
}

/// The IPAM section handed to the CNI IPAM plugin.
fn validate_ipam(ipam: &serde_json::Value, errors: &mut Vec<FieldError>) {
    match ipam.get("type").and_then(|t| t.as_str()) {
        Some(t) if !t.is_empty() => {}
        _ => errors.push(err(
            "spec.ipam",
            "must be an object with a non-empty \"type\" (e.g. host-local, whereabouts)",
        )),
    }
    match ipam.get("subnet") {
        None => {}
        Some(serde_json::Value::String(sub)) if is_cidr(sub) => {}
        Some(other) => errors.push(err(
            "spec.ipam.subnet",
            format!("{other} is not a CIDR (e.g. 10.56.0.0/16)"),
        )),
    }
    check_ipam_ranges(ipam, errors);
}

/// Where the network's attachment definitions go.
fn validate_namespaces(spec: &RdmaNetworkSpec, errors: &mut Vec<FieldError>) {
    if spec.network_namespaces.len() > MAX_NETWORK_NAMESPACES {
        errors.push(err(
            "spec.networkNamespaces",
            format!(
                "has {} entries; at most {MAX_NETWORK_NAMESPACES}",
                spec.network_namespaces.len()
            ),
        ));
    }
    for (i, ns) in spec.network_namespaces.iter().enumerate() {
        if !is_dns_label(ns) {
            errors.push(err(
                format!("spec.networkNamespaces[{i}]"),
                format!("{ns:?} is not a namespace name"),
            ));
        }
    }
}

/// What pods see: memlock, the drain budget, the PFC priority and the
/// device plugin's resource name.
fn validate_pod_facing(name: &str, spec: &RdmaNetworkSpec, errors: &mut Vec<FieldError>) {
    if let Some(m) = &spec.memlock
        && let Err(e) = m.parse::<kroce_contracts::Memlock>()
    {
        errors.push(err("spec.memlock", e.to_string()));
    }
    if let Some(m) = &spec.max_unavailable
        && let Err(e) = m.parse::<kroce_contracts::max_unavailable::MaxUnavailable>()
    {
        errors.push(err("spec.maxUnavailable", e.to_string()));
    }
    if let Some(q) = &spec.qos
        && q.pfc_priority > 7
    {
        errors.push(err(
            "spec.qos.pfcPriority",
            format!("{} is outside 0-7", q.pfc_priority),
        ));
    }
    // The name the device plugin will register: the same derivation and
    // rules (`kroce_contracts::resource_name`). An unset resourceName is the
    // network's name, checked above.
    if let Some(r) = &spec.resource_name
        && let Err(e) = kroce_contracts::ResourceName::for_network(name, Some(r))
    {
        errors.push(err("spec.resourceName", e.to_string()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::NicSelector;

    pub(crate) fn spec() -> RdmaNetworkSpec {
        serde_json::from_value(serde_json::json!({
            "nicSelector": {"pfNames": ["ens1f0"]},
            "numVfs": 8
        }))
        .unwrap()
    }

    #[test]
    fn good_spec_passes() {
        assert_eq!(validate_network("rdma-a", &spec()), Ok(()));
    }

    #[test]
    fn every_bad_field_is_named_with_its_value() {
        let mut s = spec();
        s.nic_selector = NicSelector {
            vendor: Some("15b".into()),
            device_id: None,
            pf_names: vec!["ens1f0#6-9".into(), "bad/name".into()],
            root_devices: vec!["0000:zz:00.0".into()],
            if_names: vec![],
        };
        s.irq_affinity.reserved_cpus = Some("3-1".into());
        s.vlan_qos = Some(3);
        s.ipam = Some(serde_json::json!({"subnet": "10.0.0.0/24"}));
        s.network_namespaces = vec!["Bad_NS".into()];
        s.memlock = Some("lots".into());
        s.max_unavailable = Some("0%".into());
        let errs = validate_network("Net", &s).unwrap_err();
        let text: Vec<String> = errs.iter().map(ToString::to_string).collect();
        let want = [
            ("metadata.name", "\"Net\""),
            ("spec.nicSelector.vendor", "\"15b\""),
            ("spec.nicSelector.pfNames[0]", "VF 9"),
            ("spec.nicSelector.pfNames[1]", "bad/name"),
            ("spec.nicSelector.rootDevices[0]", "0000:zz:00.0"),
            ("spec.irqAffinity.reservedCpus", "3-1"),
            ("spec.vlanQoS", "non-zero spec.vlan"),
            ("spec.ipam", "type"),
            ("spec.networkNamespaces[0]", "Bad_NS"),
            ("spec.memlock", "lots"),
            ("spec.maxUnavailable", "\"0%\""),
        ];
        for (field, needle) in want {
            assert!(
                text.iter()
                    .any(|t| t.starts_with(&format!("{field}: ")) && t.contains(needle)),
                "no error for {field} containing {needle}: {text:#?}"
            );
        }
        assert_eq!(errs.len(), want.len(), "{text:#?}");
    }

    fn soft(v: serde_json::Value) -> RdmaNetworkSpec {
        serde_json::from_value(v).unwrap()
    }

    fn fields(r: Result<(), Vec<FieldError>>) -> Vec<String> {
        r.unwrap_err().iter().map(ToString::to_string).collect()
    }

    #[test]
    fn soft_devices_need_no_num_vfs_and_pfs_do() {
        let ok = soft(serde_json::json!({"nicSelector": {"ifNames": ["kvf0", "kvf1"]}}));
        assert_eq!(validate_network("rxe", &ok), Ok(()));
        // The kind e2e writes numVfs: 0, which means the same.
        let zero = soft(serde_json::json!({"nicSelector": {"ifNames": ["kvf0"]}, "numVfs": 0}));
        assert_eq!(validate_network("rxe", &zero), Ok(()));
        let no_vfs = soft(serde_json::json!({"nicSelector": {"pfNames": ["ens1f0"]}}));
        let e = fields(validate_network("a", &no_vfs));
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(
            e[0].starts_with("spec.numVfs: is unset; at least 1 is required"),
            "{e:?}"
        );
        let zero_pf = soft(serde_json::json!({"nicSelector": {"vendor": "15b3"}, "numVfs": 0}));
        assert!(fields(validate_network("a", &zero_pf))[0].starts_with("spec.numVfs: is 0"));
    }

    #[test]
    fn soft_device_mistakes_name_the_field() {
        let mixed = soft(serde_json::json!({
            "nicSelector": {"ifNames": ["kvf0"], "pfNames": ["ens1f0"]}, "numVfs": 4
        }));
        let e = fields(validate_network("a", &mixed));
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(
            e[0].starts_with("spec.nicSelector.ifNames: kvf0 cannot be combined"),
            "{e:?}"
        );
        let bad = soft(serde_json::json!({
            "nicSelector": {"ifNames": ["kvf0", "a/b", "much-too-long-name0", "kvf0", ""]},
            "numVfs": 4,
            "qos": {"trust": "dscp"},
            "irqAffinity": {"reservedCpus": "0-1"}
        }));
        let e = fields(validate_network("a", &bad));
        let want = [
            (
                "spec.nicSelector.ifNames[1]",
                "\"a/b\" is not a netdev name",
            ),
            ("spec.nicSelector.ifNames[2]", "much-too-long-name0"),
            ("spec.nicSelector.ifNames[3]", "listed twice"),
            ("spec.nicSelector.ifNames[4]", "\"\" is not a netdev name"),
            ("spec.numVfs", "is 4; leave it unset"),
            ("spec.qos", "leave qos unset"),
            ("spec.irqAffinity", "leave irqAffinity unset"),
        ];
        for (field, needle) in want {
            assert!(
                e.iter()
                    .any(|t| t.starts_with(&format!("{field}: ")) && t.contains(needle)),
                "no error for {field} containing {needle}: {e:#?}"
            );
        }
        assert_eq!(e.len(), want.len(), "{e:#?}");
    }

    #[test]
    fn empty_selector_is_an_error() {
        let mut s = spec();
        s.nic_selector = NicSelector::default();
        let errs = validate_network("a", &s).unwrap_err();
        assert_eq!(errs[0].field, "spec.nicSelector");
    }

    #[test]
    fn dra_refuses_what_only_the_device_plugin_path_does() {
        let mut s = spec();
        s.frontend = Frontend::Dra;
        validate_network("n", &s).unwrap();
        s.network_namespaces = vec!["team-a".into()];
        s.vlan = Some(100);
        s.vlan_qos = Some(3);
        s.admission = Some(serde_json::from_value(serde_json::json!({})).unwrap());
        let fields: Vec<String> = validate_network("n", &s)
            .unwrap_err()
            .into_iter()
            .map(|e| e.field)
            .collect();
        assert_eq!(
            fields,
            [
                "spec.admission.enabled",
                "spec.networkNamespaces",
                "spec.vlanQoS"
            ]
        );
        // The same spec through the device plugin is fine.
        s.frontend = Frontend::DevicePlugin;
        validate_network("n", &s).unwrap();
    }
}

#[cfg(test)]
mod ipam_tests {
    use super::*;

    fn with_ipam(ipam: serde_json::Value) -> Vec<String> {
        let spec: RdmaNetworkSpec = serde_json::from_value(serde_json::json!({
            "nicSelector": {"pfNames": ["ens1f0"]}, "numVfs": 4, "ipam": ipam}))
        .unwrap();
        validate_network("n", &spec)
            .err()
            .unwrap_or_default()
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    /// Issue 24 item 13: host bits in the subnet and a range outside it
    /// are refused naming the field, not passed to the CNI.
    #[test]
    fn subnet_host_bits_and_ranges_outside_the_subnet_are_refused() {
        let e = with_ipam(serde_json::json!({"type": "host-local", "subnet": "10.0.0.5/24"}));
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(
            e[0].starts_with("spec.ipam.subnet: ") && e[0].contains("10.0.0.0/24"),
            "{e:?}"
        );
        let e = with_ipam(
            serde_json::json!({"type": "host-local", "subnet": "10.0.0.0/24",
                                             "rangeStart": "10.0.1.10", "rangeEnd": "10.0.0.200"}),
        );
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(
            e[0].starts_with("spec.ipam.rangeStart: ") && e[0].contains("10.0.1.10"),
            "{e:?}"
        );
        let e = with_ipam(
            serde_json::json!({"type": "host-local", "subnet": "fd00::/64",
                                             "rangeEnd": "10.0.0.1"}),
        );
        assert!(e[0].starts_with("spec.ipam.rangeEnd: "), "{e:?}");
        let e = with_ipam(
            serde_json::json!({"type": "host-local", "subnet": "fd00:1::/64",
                                             "rangeStart": "fd00:1::10", "rangeEnd": "fd00:1::ff"}),
        );
        assert!(e.is_empty(), "{e:?}");
        let e = with_ipam(
            serde_json::json!({"type": "host-local", "subnet": "10.56.0.0/16",
                                             "rangeStart": "10.56.3.1", "rangeEnd": "10.56.255.254"}),
        );
        assert!(e.is_empty(), "{e:?}");
        let e = with_ipam(serde_json::json!({"type": "host-local", "subnet": "0.0.0.0/0"}));
        assert!(e.is_empty(), "{e:?}");
    }
}
