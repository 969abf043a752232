//! Controller-side validation of an `RdmaNetwork` spec. The CRD schema
//! catches types and ranges; this catches what a schema cannot (CPU lists,
//! VF ranges against `numVfs`, IPAM shape), with messages naming the field.

use crate::crd::RdmaNetworkSpec;
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

/// Every problem in the spec, not just the first.
pub fn validate_network(name: &str, spec: &RdmaNetworkSpec) -> Result<(), Vec<FieldError>> {
    let mut errors = Vec::new();
    if !is_dns_label(name) {
        errors.push(err(
            "metadata.name",
            format!("{name:?} must be a DNS label (it names attachment definitions and pools)"),
        ));
    }
    if spec.num_vfs == 0 {
        errors.push(err("spec.numVfs", "must be at least 1"));
    }
    let sel = &spec.nic_selector;
    if sel.is_empty() {
        errors.push(err(
            "spec.nicSelector",
            "is empty; set vendor, deviceID, pfNames or rootDevices",
        ));
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
    for (i, p) in sel.pf_names.iter().enumerate() {
        match p.parse::<PfSelector>() {
            Ok(s) => {
                if let Some(max) = s.vfs.as_ref().and_then(|v| v.iter().next_back())
                    && *max >= spec.num_vfs
                {
                    errors.push(err(
                        format!("spec.nicSelector.pfNames[{i}]"),
                        format!(
                            "{p:?} uses VF {max}, but numVfs {} makes VFs 0-{}",
                            spec.num_vfs,
                            spec.num_vfs - 1
                        ),
                    ));
                }
            }
            Err(e) => errors.push(err(format!("spec.nicSelector.pfNames[{i}]"), e.to_string())),
        }
    }
    for (i, r) in sel.root_devices.iter().enumerate() {
        if let Err(e) = r.parse::<PciAddress>() {
            errors.push(err(
                format!("spec.nicSelector.rootDevices[{i}]"),
                e.to_string(),
            ));
        }
    }
    if let Some(cpus) = &spec.irq_affinity.reserved_cpus
        && let Err(e) = cpus.parse::<CpuList>()
    {
        errors.push(err("spec.irqAffinity.reservedCpus", e.to_string()));
    }
    if let Some(mtu) = spec.mtu
        && !(576..=9216).contains(&mtu)
    {
        errors.push(err("spec.mtu", format!("{mtu} is outside 576-9216")));
    }
    if let Some(vlan) = spec.vlan
        && vlan > 4094
    {
        errors.push(err("spec.vlan", format!("{vlan} is outside 0-4094")));
    }
    if let Some(q) = spec.vlan_qos {
        if q > 7 {
            errors.push(err("spec.vlanQoS", format!("{q} is outside 0-7")));
        }
        if spec.vlan.unwrap_or(0) == 0 {
            errors.push(err("spec.vlanQoS", "needs a non-zero spec.vlan"));
        }
    }
    if let Some(ipam) = &spec.ipam {
        match ipam.get("type").and_then(|t| t.as_str()) {
            Some(t) if !t.is_empty() => {}
            _ => errors.push(err(
                "spec.ipam",
                "must be an object with a non-empty \"type\" (e.g. host-local, whereabouts)",
            )),
        }
    }
    for (i, ns) in spec.network_namespaces.iter().enumerate() {
        if !is_dns_label(ns) {
            errors.push(err(
                format!("spec.networkNamespaces[{i}]"),
                format!("{ns:?} is not a namespace name"),
            ));
        }
    }
    if let Some(m) = &spec.memlock
        && m != "unlimited"
    {
        let digits = m.trim_end_matches(['K', 'M', 'G', 'k', 'm', 'g']);
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            errors.push(err(
                "spec.memlock",
                format!("{m:?} is not \"unlimited\" or a byte count like 64M"),
            ));
        }
    }
    if let Some(q) = &spec.qos
        && q.pfc_priority > 7
    {
        errors.push(err(
            "spec.qos.pfcPriority",
            format!("{} is outside 0-7", q.pfc_priority),
        ));
    }
    if let Some(r) = &spec.resource_name
        && (r.is_empty() || r.contains('/'))
    {
        errors.push(err(
            "spec.resourceName",
            format!("{r:?} must be a plain name; kroce adds the rdma/ prefix"),
        ));
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
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
        };
        s.irq_affinity.reserved_cpus = Some("3-1".into());
        s.vlan_qos = Some(3);
        s.ipam = Some(serde_json::json!({"subnet": "10.0.0.0/24"}));
        s.network_namespaces = vec!["Bad_NS".into()];
        s.memlock = Some("lots".into());
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

    #[test]
    fn empty_selector_is_an_error() {
        let mut s = spec();
        s.nic_selector = NicSelector::default();
        let errs = validate_network("a", &s).unwrap_err();
        assert_eq!(errs[0].field, "spec.nicSelector");
    }
}
