//! Extended resource names (`rdma/vf`) and every name derived from one: the
//! env vars, annotation keys, device-info file names, the plugin socket and
//! the CDI kind. The operator (which advertises `rdma/<resourceName>`), the
//! device plugin (which registers it) and kroce-nri (which reads the
//! annotations) derive them all here, so pools never collide anywhere and
//! no two components spell a name differently.

use std::fmt;

/// Prefix added to a bare name (`vf` becomes `rdma/vf`).
pub const DEFAULT_PREFIX: &str = "rdma";
/// The vendor part of CDI kinds and of container annotation keys.
pub const VENDOR_DOMAIN: &str = "kroce.io";

/// A validated `domain/name` extended resource name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ResourceName(String);

/// Why a string is not a resource name. Names the value; the caller adds
/// the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{value:?} is not a valid extended resource name: {reason}")]
pub struct ResourceNameError {
    pub value: String,
    pub reason: String,
}

fn is_dns_label(l: &str) -> bool {
    !l.is_empty()
        && l.len() <= 63
        && l.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !l.starts_with('-')
        && !l.ends_with('-')
}

/// The Kubernetes "qualified name" rule for the part after the slash.
fn is_qualified_name(n: &str) -> bool {
    let b = n.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// `domain/name` as given, or `rdma/<name>` for a bare name: the name a
/// resource is advertised under, before validation.
pub fn qualified(name: &str) -> String {
    if name.contains('/') {
        name.to_string()
    } else {
        format!("{DEFAULT_PREFIX}/{name}")
    }
}

impl ResourceName {
    /// Parses `domain/name` or a bare `name` (which gets the `rdma/` prefix,
    /// as an RdmaNetwork's `resourceName` or, unset, its name does).
    pub fn parse(s: &str) -> Result<ResourceName, ResourceNameError> {
        let bad = |reason: String| ResourceNameError {
            value: s.to_owned(),
            reason,
        };
        let full = qualified(s);
        let Some((domain, name)) = full.split_once('/') else {
            return Err(bad("expected domain/name".into()));
        };
        if name.contains('/') {
            return Err(bad("at most one '/' is allowed".into()));
        }
        if domain.is_empty() || domain.len() > 253 || !domain.split('.').all(is_dns_label) {
            return Err(bad(format!(
                "{domain:?} is not a DNS subdomain (lowercase letters, digits, '-', '.')"
            )));
        }
        if domain == "kubernetes.io" || domain.ends_with(".kubernetes.io") {
            return Err(bad("the kubernetes.io domain is reserved".into()));
        }
        if !is_qualified_name(name) {
            return Err(bad(format!(
                "{name:?} must be 1-63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
            )));
        }
        Ok(ResourceName(full))
    }

    /// The resource an RdmaNetwork advertises: its `resourceName`, else its
    /// own name, under `rdma/`. Only a bare name is allowed there.
    pub fn for_network(
        network: &str,
        resource_name: Option<&str>,
    ) -> Result<ResourceName, ResourceNameError> {
        let name = resource_name.unwrap_or(network);
        if name.contains('/') {
            return Err(ResourceNameError {
                value: name.to_owned(),
                reason: format!("must be a plain name; kroce adds the {DEFAULT_PREFIX}/ prefix"),
            });
        }
        ResourceName::parse(name)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// `rdma/vf` -> `rdma_vf`: annotation key suffix and CDI class.
    pub fn underscored(&self) -> String {
        self.0.replace('/', "_")
    }

    /// `rdma/vf` -> `RDMA_VF`, for `PCIDEVICE_<RESOURCE>`.
    pub fn env_name(&self) -> String {
        self.0
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_uppercase()
                } else {
                    '_'
                }
            })
            .collect()
    }

    /// Env var with the comma-separated PCI addresses of the devices.
    pub fn pci_env(&self) -> String {
        format!("PCIDEVICE_{}", self.env_name())
    }

    /// Env var with the per-device JSON details.
    pub fn info_env(&self) -> String {
        format!("PCIDEVICE_{}_INFO", self.env_name())
    }

    /// Container annotation listing the allocated device IDs.
    pub fn devices_annotation(&self) -> String {
        crate::annotations::devices(self)
    }

    /// Container annotation with the pool's memlock limit (read by kroce-nri).
    pub fn memlock_annotation(&self) -> String {
        crate::annotations::memlock(self)
    }

    /// The plugin's socket file name inside the kubelet plugin dir.
    pub fn socket_name(&self) -> String {
        format!("kroce-{}.sock", self.underscored())
    }

    /// `<resource with / as ->` as the device-info spec names files.
    pub fn device_info_prefix(&self) -> String {
        self.0.replace('/', "-")
    }

    /// CDI kind `kroce.io/<class>`: one per pool, so pools never share a kind.
    pub fn cdi_kind(&self) -> String {
        format!("{VENDOR_DOMAIN}/{}", self.underscored())
    }
}

impl fmt::Display for ResourceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_name_gets_prefix_and_derived_names() {
        let r = ResourceName::parse("vf").expect("vf");
        assert_eq!(r.as_str(), "rdma/vf");
        assert_eq!(r.pci_env(), "PCIDEVICE_RDMA_VF");
        assert_eq!(r.info_env(), "PCIDEVICE_RDMA_VF_INFO");
        assert_eq!(r.devices_annotation(), "kroce.io/rdma-devices.rdma_vf");
        assert_eq!(r.memlock_annotation(), "kroce.io/memlock.rdma_vf");
        assert_eq!(r.socket_name(), "kroce-rdma_vf.sock");
        assert_eq!(r.device_info_prefix(), "rdma-vf");
        assert_eq!(r.cdi_kind(), "kroce.io/rdma_vf");
        let e = ResourceName::parse("example.com/hca-1.x").expect("example.com");
        assert_eq!(e.env_name(), "EXAMPLE_COM_HCA_1_X");
    }

    #[test]
    fn rejects_bad_names_naming_value_and_reason() {
        for (bad, why) in [
            ("", "must be 1-63"),
            ("rdma/", "must be 1-63"),
            ("a/b/c", "at most one"),
            ("Rdma/vf", "DNS subdomain"),
            ("kubernetes.io/vf", "reserved"),
            ("rdma/-vf", "starting and ending"),
            ("rdma/v f", "must be 1-63"),
        ] {
            let e = ResourceName::parse(bad).expect_err(bad).to_string();
            assert!(
                e.contains(why) && e.contains(&format!("{bad:?}")),
                "{bad:?}: {e}"
            );
        }
    }

    #[test]
    fn a_network_advertises_its_resource_name_or_its_own_name() {
        let r = ResourceName::for_network("rdma-a", Some("vf")).expect("vf");
        assert_eq!(r.as_str(), "rdma/vf");
        let r = ResourceName::for_network("rdma-a", None).expect("name");
        assert_eq!(r.as_str(), "rdma/rdma-a");
        let e = ResourceName::for_network("n", Some("example.com/vf")).expect_err("slash");
        assert!(e.to_string().contains("plain name"), "{e}");
        // A network name longer than a resource name may be can never be advertised.
        let long = "a".repeat(64);
        let e = ResourceName::for_network(&long, None).expect_err("long");
        assert!(e.to_string().contains("1-63"), "{e}");
    }
}
