//! kroce's DRA driver as the other components see it: its name, the
//! apiVersion/kind of its opaque claim configuration, and the env through
//! which a container holding one of its claims is recognised.
//!
//! The DRA plugin (`kroce-dra-plugin`) serves the driver; the operator
//! writes DeviceClasses selecting it and opaque configs for it; kroce-nri
//! reads the claim env of a container being created to find the claim's
//! memlock request (`<dra memlock dir>/<claim uid>.json`, the format of
//! [`crate::memlock_file`]).

/// The DRA driver name (ResourceSlices, DeviceClass selectors, opaque
/// config `driver`, CDI vendor, field manager).
pub const DRIVER_NAME: &str = "rdma.kroce.io";
/// `apiVersion` of the driver's opaque parameters.
pub const CONFIG_API_VERSION: &str = "rdma.kroce.io/v1alpha1";
/// `kind` of the driver's opaque parameters.
pub const CONFIG_KIND: &str = "RdmaConfig";

/// Longest `Device.name` in a ResourceSlice (a DNS label).
pub const MAX_DEVICE_NAME: usize = 63;

/// A device's name in the driver's ResourceSlices: `<prefix>-<raw>`,
/// lower-case letters, digits and `-`, ending alphanumeric, at most 63
/// (`vf` + `0000:3b:00.2` -> `vf-0000-3b-00-2`). The DRA plugin names
/// devices with it; the node agent finds a VF's device in the plugin's
/// checkpoint with it.
pub fn device_name(prefix: &str, raw: &str) -> String {
    let mut s: String = format!("{prefix}-{raw}")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    s.truncate(MAX_DEVICE_NAME);
    s.trim_end_matches('-').to_string()
}

/// The device name of the VF at PCI address `pci`.
pub fn vf_device_name(pci: &str) -> String {
    device_name("vf", pci)
}

/// The claim env's name before the claim UID: the CDI spec of a prepared
/// claim sets `KROCE_DRA_CLAIM_<UID>=<namespace>/<name>` in every
/// container that holds the claim.
pub const CLAIM_ENV_PREFIX: &str = "KROCE_DRA_CLAIM_";

/// `KROCE_DRA_CLAIM_<UID>`: the UID upper-cased, every character other
/// than a letter or digit as `_` (an env name's alphabet).
pub fn claim_env(uid: &str) -> String {
    let mut name = String::with_capacity(CLAIM_ENV_PREFIX.len() + uid.len());
    name.push_str(CLAIM_ENV_PREFIX);
    name.extend(uid.chars().map(|c| {
        if c.is_ascii_alphanumeric() {
            c.to_ascii_uppercase()
        } else {
            '_'
        }
    }));
    name
}

/// The claim UID a container env entry (`NAME=value`) names, if it is a
/// claim env. Kubernetes UIDs are lower-case UUIDs (hex and `-`), which
/// [`claim_env`] maps one to one, so the UID is the name's suffix lower-cased
/// with `_` as `-`. A suffix that is not of that alphabet is not ours.
pub fn claim_uid_of_env(entry: &str) -> Option<String> {
    let name = entry.split_once('=').map_or(entry, |(n, _)| n);
    let suffix = name.strip_prefix(CLAIM_ENV_PREFIX)?;
    // A UID starts with a letter or digit (and so can name a file).
    let ok = suffix
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_digit() || b.is_ascii_uppercase())
        && suffix
            .bytes()
            .all(|b| b.is_ascii_digit() || b.is_ascii_uppercase() || b == b'_');
    ok.then(|| {
        suffix
            .chars()
            .map(|c| {
                if c == '_' {
                    '-'
                } else {
                    c.to_ascii_lowercase()
                }
            })
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claim_env_maps_kubernetes_uids_both_ways() {
        let uid = "6c1d3e0a-0000-4000-8000-000000000001";
        let env = claim_env(uid);
        assert_eq!(env, "KROCE_DRA_CLAIM_6C1D3E0A_0000_4000_8000_000000000001");
        assert_eq!(
            claim_uid_of_env(&format!("{env}=default/rdma")).as_deref(),
            Some(uid)
        );
        assert_eq!(claim_uid_of_env(&env).as_deref(), Some(uid));
        // A value with '=' in it does not matter; only the name counts.
        assert_eq!(
            claim_uid_of_env(&format!("{env}=a=b")).as_deref(),
            Some(uid)
        );
    }

    #[test]
    fn other_env_entries_are_not_claims() {
        for e in [
            "PATH=/bin",
            "KROCE_DRA_CLAIM_=x",
            "KROCE_DRA_CLAIM_",
            "KROCE_DRA_CLAIM_abc=x",
            "KROCE_DRA_CLAIM_A-B=x",
            "KROCE_DRA_CLAIM__AB=x",
            "KROCE_DRA_CLAIM_../X=y",
            "KROCE_DRA_VF_0000_3B_00_2_PCI_ADDRESS=0000:3b:00.2",
            "kroce_dra_claim_AB=x",
        ] {
            assert_eq!(claim_uid_of_env(e), None, "{e}");
        }
    }

    #[test]
    fn the_driver_owns_its_config_group() {
        assert!(CONFIG_API_VERSION.starts_with(&format!("{DRIVER_NAME}/")));
    }
}
