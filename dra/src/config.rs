//! Pure core: the opaque claim configuration of this driver — what a
//! DeviceClass (`spec.config[].opaque`) or a ResourceClaim
//! (`spec.devices.config[].opaque`) may set, which the scheduler copies into
//! `status.allocation.devices.config`:
//!
//! ```yaml
//! opaque:
//!   driver: rdma.kroce.io
//!   parameters:
//!     apiVersion: rdma.kroce.io/v1alpha1
//!     kind: RdmaConfig
//!     vlan: 100            # 0 (untagged) .. 4094
//!     mtu: 9000            # 68 .. 9978
//!     ipam: {type: host-local, ranges: [[{subnet: 10.56.0.0/16}]]}
//!     memlock: 64Gi        # kroce's memlock grammar, or "unlimited"
//!     rdmaNetnsMode: exclusive   # or shared
//!     interfaceName: rdma0 # the VF's name in the pod (default net1, net2, …)
//!     mac: "02:00:00:00:00:01"   # a unicast MAC for the VF
//!     attach: true         # false: the VF's netdev stays on the host
//! ```
//!
//! Class entries apply first, claim entries after them; a later entry sets
//! only the fields it names. An entry applies to the requests it lists
//! (none: every request). Every error names where the entry came from, the
//! field and the value.
//!
//! The class's fields are the cluster admin's: a claim entry may set only
//! the fields that a DeviceClass entry applying to the same request lists
//! in `allowClaimOverrides` (empty by default: a claim sets nothing). Any
//! other field from a claim fails the prepare, naming the field. An `ipam`
//! from a claim (when allowed) never names a host path (`dataDir`, a
//! socket path, any value starting with `/`), and an `ipam.type` is always
//! a plugin name, never a path:
//!
//! ```yaml
//!     allowClaimOverrides: [interfaceName, memlock]   # DeviceClass only
//! ```

use crate::driver::DRIVER_NAME;
use kroce_contracts::Memlock;
use kroce_contracts::network_attach;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The opaque parameters' apiVersion and kind, shared with the operator,
/// which writes them into DeviceClasses.
pub use kroce_contracts::dra::{CONFIG_API_VERSION, CONFIG_KIND};
/// The DeviceClass-only field listing what a claim may set.
pub const ALLOW_CLAIM_OVERRIDES: &str = "allowClaimOverrides";
/// The fields a class may allow a claim to set.
pub const OVERRIDABLE: [&str; 8] = [
    "vlan",
    "mtu",
    "ipam",
    "memlock",
    "rdmaNetnsMode",
    "interfaceName",
    "mac",
    "attach",
];
/// IPAM keys that name host paths (host-local's `dataDir`, dhcp's socket).
const IPAM_PATH_KEYS: [&str; 3] = ["dataDir", "daemonSocketPath", "socketPath"];
use kroce_contracts::link_limits;
const MTU_RANGE: std::ops::RangeInclusive<u64> =
    link_limits::MTU_MIN as u64..=link_limits::MTU_MAX as u64;
const MAX_VLAN: u64 = link_limits::VLAN_MAX as u64;

/// The effective configuration is kept in the checkpoint, so its shape is
/// the checkpoint contract's.
pub use kroce_contracts::dra_checkpoint::{ClaimConfig, NetnsMode};
use kroce_contracts::mac::Mac;

/// Where an opaque entry came from (the allocation's `source`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum ConfigSource {
    FromClass,
    FromClaim,
}

/// One `status.allocation.devices.config[]` entry with an opaque part.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpaqueConfig {
    pub source: ConfigSource,
    /// Its index in `status.allocation.devices.config` (for messages).
    pub index: usize,
    pub requests: Vec<String>,
    pub driver: String,
    pub parameters: Value,
}

impl OpaqueConfig {
    fn applies_to(&self, request: &str) -> bool {
        // A subrequest `req/sub` is configured by entries naming `req`.
        self.requests.is_empty()
            || self.requests.iter().any(|r| {
                request == r
                    || request
                        .strip_prefix(r.as_str())
                        .is_some_and(|rest| rest.starts_with('/'))
            })
    }

    fn location(&self) -> String {
        format!(
            "status.allocation.devices.config[{}] ({})",
            self.index,
            match self.source {
                ConfigSource::FromClass => "from the DeviceClass",
                ConfigSource::FromClaim => "from the claim",
            }
        )
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{at}: opaque parameters field {field}: {value} is invalid: {reason}")]
pub struct ClaimConfigError {
    pub at: String,
    pub field: String,
    pub value: String,
    pub reason: String,
}

fn err(at: &str, field: &str, value: &Value, reason: impl Into<String>) -> ClaimConfigError {
    ClaimConfigError {
        at: at.to_string(),
        field: field.to_string(),
        value: value.to_string(),
        reason: reason.into(),
    }
}

fn uint(
    at: &str,
    field: &str,
    v: &Value,
    range: std::ops::RangeInclusive<u64>,
) -> Result<u64, ClaimConfigError> {
    match v.as_u64() {
        Some(n) if range.contains(&n) => Ok(n),
        _ => Err(err(
            at,
            field,
            v,
            format!(
                "expected a whole number from {} to {}",
                range.start(),
                range.end()
            ),
        )),
    }
}

/// A unicast MAC (the one grammar, [`kroce_contracts::mac`]).
fn unicast_mac(at: &str, field: &str, v: &Value) -> Result<Mac, ClaimConfigError> {
    let s = v
        .as_str()
        .ok_or_else(|| err(at, field, v, "expected a string"))?;
    Mac::parse_unicast(s).map_err(|e| err(at, field, v, e.to_string()))
}

/// One entry, parsed: its fields, and (a class's) `allowClaimOverrides`.
#[derive(Debug, Clone, Default)]
struct Entry {
    config: ClaimConfig,
    /// The configuration fields it names, with their values.
    set: Vec<(String, Value)>,
    /// `allowClaimOverrides`, with its value, when present.
    allow: Option<(Vec<String>, Value)>,
}

fn allow_list(at: &str, v: &Value) -> Result<Vec<String>, ClaimConfigError> {
    let expected = || {
        err(
            at,
            ALLOW_CLAIM_OVERRIDES,
            v,
            format!(
                "expected a list of field names from {}",
                OVERRIDABLE.join(", ")
            ),
        )
    };
    let list = v.as_array().ok_or_else(expected)?;
    list.iter()
        .map(|f| match f.as_str() {
            Some(name) if OVERRIDABLE.contains(&name) => Ok(name.to_string()),
            _ => Err(expected()),
        })
        .collect()
}

/// Parses and validates one entry's `parameters`. `at` names the entry.
pub fn parse(parameters: &Value, at: &str) -> Result<ClaimConfig, ClaimConfigError> {
    parse_entry(parameters, at).map(|e| e.config)
}

fn parse_entry(parameters: &Value, at: &str) -> Result<Entry, ClaimConfigError> {
    let Some(obj) = parameters.as_object() else {
        return Err(err(at, "parameters", parameters, "expected an object"));
    };
    let mut entry = Entry::default();
    let out = &mut entry.config;
    let mut api_version = None;
    let mut kind = None;
    for (k, v) in obj {
        if OVERRIDABLE.contains(&k.as_str()) {
            entry.set.push((k.clone(), v.clone()));
        }
        match k.as_str() {
            "apiVersion" => api_version = Some(v),
            "kind" => kind = Some(v),
            ALLOW_CLAIM_OVERRIDES => entry.allow = Some((allow_list(at, v)?, v.clone())),
            "vlan" => out.vlan = Some(uint(at, k, v, 0..=MAX_VLAN)? as u16),
            "mtu" => out.mtu = Some(uint(at, k, v, MTU_RANGE)? as u32),
            "ipam" => {
                let ty = v.get("type").and_then(Value::as_str).unwrap_or_default();
                if !v.is_object() || ty.is_empty() {
                    return Err(err(
                        at,
                        k,
                        v,
                        "expected a CNI IPAM object with a non-empty \"type\"",
                    ));
                }
                // Resolved on the runtime's CNI path, run as root: a name,
                // never a path to a program.
                if ty.contains('/') || ty.starts_with('.') {
                    return Err(err(
                        at,
                        "ipam.type",
                        &Value::from(ty),
                        "expected an IPAM plugin name (found on the runtime's CNI path), not a path",
                    ));
                }
                out.ipam = Some(v.clone());
            }
            "memlock" => {
                out.memlock =
                    Some(Memlock::from_json(v).map_err(|e| err(at, k, v, e.to_string()))?);
            }
            "rdmaNetnsMode" => {
                out.rdma_netns_mode = Some(match v.as_str() {
                    Some("shared") => NetnsMode::Shared,
                    Some("exclusive") => NetnsMode::Exclusive,
                    _ => return Err(err(at, k, v, "expected \"shared\" or \"exclusive\"")),
                });
            }
            "interfaceName" => {
                let name = v
                    .as_str()
                    .ok_or_else(|| err(at, k, v, "expected a string"))?;
                network_attach::check_ifname(name).map_err(|e| err(at, k, v, e.to_string()))?;
                out.interface_name = Some(name.to_string());
            }
            "mac" => out.mac = Some(unicast_mac(at, k, v)?),
            "attach" => {
                out.attach = Some(
                    v.as_bool()
                        .ok_or_else(|| err(at, k, v, "expected true or false"))?,
                );
            }
            _ => {
                return Err(err(
                    at,
                    k,
                    v,
                    "unknown field (known: apiVersion, kind, vlan, mtu, ipam, memlock, rdmaNetnsMode, interfaceName, mac, attach, allowClaimOverrides)",
                ));
            }
        }
    }
    let want = |field: &str, got: Option<&Value>, expected: &str| match got {
        Some(Value::String(s)) if s == expected => Ok(()),
        Some(v) => Err(err(at, field, v, format!("expected {expected:?}"))),
        None => Err(err(
            at,
            field,
            &Value::Null,
            format!("required: {expected:?}"),
        )),
    };
    want("apiVersion", api_version, CONFIG_API_VERSION)?;
    want("kind", kind, CONFIG_KIND)?;
    Ok(entry)
}

/// Strings anywhere in a claim's `ipam` that name a host path.
fn ipam_host_path(path: &str, v: &Value) -> Option<(String, Value)> {
    match v {
        Value::String(s) if s.starts_with('/') => Some((path.to_string(), v.clone())),
        Value::Object(o) => o.iter().find_map(|(k, x)| {
            let field = format!("{path}.{k}");
            if IPAM_PATH_KEYS.contains(&k.as_str()) {
                Some((field, x.clone()))
            } else {
                ipam_host_path(&field, x)
            }
        }),
        Value::Array(a) => a
            .iter()
            .enumerate()
            .find_map(|(i, x)| ipam_host_path(&format!("{path}[{i}]"), x)),
        _ => None,
    }
}

/// A claim entry sets only what `allowed` (the class's allow-lists) names,
/// never the allow-list itself, and its `ipam` names no host path.
fn check_claim_entry(
    entry: &Entry,
    allowed: &std::collections::BTreeSet<String>,
    at: &str,
) -> Result<(), ClaimConfigError> {
    if let Some((_, v)) = &entry.allow {
        return Err(err(
            at,
            ALLOW_CLAIM_OVERRIDES,
            v,
            "only a DeviceClass's config may say what claims may set",
        ));
    }
    for (field, v) in &entry.set {
        if !allowed.contains(field) {
            let may = if allowed.is_empty() {
                "nothing".to_string()
            } else {
                allowed.iter().cloned().collect::<Vec<_>>().join(", ")
            };
            return Err(err(
                at,
                field,
                v,
                format!(
                    "set by the DeviceClass only: its config lets a claim set {may} \
                     (the class's {ALLOW_CLAIM_OVERRIDES})"
                ),
            ));
        }
        if field == "ipam"
            && let Some((path, value)) = ipam_host_path("ipam", v)
        {
            return Err(err(
                at,
                &path,
                &value,
                "a claim's ipam cannot name a path on the host",
            ));
        }
    }
    Ok(())
}

/// The fields claims may set: the union of the class entries' allow-lists.
fn allowed_by<'a>(
    classes: impl Iterator<Item = &'a OpaqueConfig>,
) -> Result<std::collections::BTreeSet<String>, ClaimConfigError> {
    let mut allowed = std::collections::BTreeSet::new();
    for c in classes.filter(|c| c.source == ConfigSource::FromClass) {
        if let Some((list, _)) = parse_entry(&c.parameters, &c.location())?.allow {
            allowed.extend(list);
        }
    }
    Ok(allowed)
}

/// The effective configuration of `request`: this driver's entries that
/// apply to it, class entries first, claim entries over them (each claim
/// field allowed by a class entry applying to the request).
pub fn effective(configs: &[OpaqueConfig], request: &str) -> Result<ClaimConfig, ClaimConfigError> {
    let mut mine: Vec<&OpaqueConfig> = configs
        .iter()
        .filter(|c| c.driver == DRIVER_NAME && c.applies_to(request))
        .collect();
    mine.sort_by_key(|c| (c.source, c.index));
    let allowed = allowed_by(mine.iter().copied())?;
    let mut out = ClaimConfig::default();
    for c in mine {
        let at = c.location();
        let entry = parse_entry(&c.parameters, &at)?;
        if c.source == ConfigSource::FromClaim {
            check_claim_entry(&entry, &allowed, &at)?;
        }
        out.overlay(entry.config);
    }
    Ok(out)
}

/// Validates every entry of this driver, whether or not a request of ours
/// uses it: a typo anywhere fails the claim instead of being ignored, and
/// a claim entry setting what no class allows is refused.
pub fn validate_all(configs: &[OpaqueConfig]) -> Result<(), ClaimConfigError> {
    let mine = || configs.iter().filter(|c| c.driver == DRIVER_NAME);
    let allowed = allowed_by(mine())?;
    for c in mine() {
        let at = c.location();
        let entry = parse_entry(&c.parameters, &at)?;
        if c.source == ConfigSource::FromClaim {
            check_claim_entry(&entry, &allowed, &at)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn entry(source: ConfigSource, index: usize, requests: &[&str], p: Value) -> OpaqueConfig {
        OpaqueConfig {
            source,
            index,
            requests: requests.iter().map(|s| s.to_string()).collect(),
            driver: DRIVER_NAME.into(),
            parameters: p,
        }
    }

    fn params(extra: Value) -> Value {
        let mut v = json!({"apiVersion": CONFIG_API_VERSION, "kind": CONFIG_KIND});
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        v
    }

    #[test]
    fn parses_every_field() {
        let c = parse(
            &params(json!({"vlan": 100, "mtu": 9000, "memlock": "64Gi",
                "rdmaNetnsMode": "exclusive", "ipam": {"type": "host-local"}})),
            "x",
        )
        .unwrap();
        assert_eq!(c.vlan, Some(100));
        assert_eq!(c.mtu, Some(9000));
        assert_eq!(c.memlock, Some(Memlock::Bytes(64 << 30)));
        assert_eq!(c.rdma_netns_mode, Some(NetnsMode::Exclusive));
        assert_eq!(c.ipam, Some(json!({"type": "host-local"})));
        let n = parse(
            &params(json!({"interfaceName": "rdma0", "mac": "02:AA:bb:cc:dd:01", "attach": false})),
            "x",
        )
        .unwrap();
        assert_eq!(n.interface_name.as_deref(), Some("rdma0"));
        assert_eq!(
            n.mac.map(|m| m.to_string()).as_deref(),
            Some("02:aa:bb:cc:dd:01")
        );
        assert_eq!(n.attach, Some(false));
    }

    #[test]
    fn errors_name_field_value_and_entry() {
        let cases = [
            (
                json!({"vlan": 4095}),
                "field vlan: 4095 is invalid: expected a whole number from 0 to 4094",
            ),
            (json!({"vlan": "7"}), "field vlan: \"7\" is invalid"),
            (
                json!({"mtu": 20}),
                "field mtu: 20 is invalid: expected a whole number from 68 to 9978",
            ),
            (
                json!({"memlock": "64g"}),
                "field memlock: \"64g\" is invalid: \"64g\" has unknown unit",
            ),
            (
                json!({"rdmaNetnsMode": "private"}),
                "field rdmaNetnsMode: \"private\" is invalid: expected \"shared\" or \"exclusive\"",
            ),
            (
                json!({"ipam": {"ranges": []}}),
                "field ipam: {\"ranges\":[]} is invalid",
            ),
            (
                json!({"interfaceName": "eth0"}),
                "field interfaceName: \"eth0\" is invalid: \"eth0\" is reserved",
            ),
            (
                json!({"interfaceName": "a/b"}),
                "field interfaceName: \"a/b\" is invalid: \"a/b\" contains '/'",
            ),
            (
                json!({"mac": "03:00:00:00:00:01"}),
                "field mac: \"03:00:00:00:00:01\" is invalid: a multicast address",
            ),
            (
                json!({"mac": "02:00:00:00:01"}),
                "field mac: \"02:00:00:00:01\" is invalid: expected six hex bytes",
            ),
            // u8::from_str_radix takes a sign: the old parser let it in.
            (
                json!({"mac": "+2:00:00:00:00:01"}),
                "field mac: \"+2:00:00:00:00:01\" is invalid: expected six hex bytes",
            ),
            (
                json!({"attach": "yes"}),
                "field attach: \"yes\" is invalid: expected true or false",
            ),
            (
                json!({"vlna": 1}),
                "field vlna: 1 is invalid: unknown field",
            ),
            (
                json!({"kind": "Other"}),
                "field kind: \"Other\" is invalid: expected \"RdmaConfig\"",
            ),
        ];
        for (extra, want) in cases {
            let e = parse(
                &params(extra.clone()),
                "status.allocation.devices.config[1] (from the claim)",
            )
            .unwrap_err()
            .to_string();
            assert!(
                e.starts_with(
                    "status.allocation.devices.config[1] (from the claim): opaque parameters "
                ),
                "{e}"
            );
            assert!(e.contains(want), "{extra}: {e}");
        }
        let e = parse(&json!({"kind": CONFIG_KIND}), "a")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("field apiVersion: null is invalid: required"),
            "{e}"
        );
        let e = parse(&json!([1]), "a").unwrap_err().to_string();
        assert!(
            e.contains("field parameters: [1] is invalid: expected an object"),
            "{e}"
        );
    }

    #[test]
    fn claim_overrides_class_per_field_and_requests_filter() {
        let configs = vec![
            entry(
                ConfigSource::FromClaim,
                2,
                &["rdma"],
                params(json!({"vlan": 200})),
            ),
            entry(
                ConfigSource::FromClass,
                0,
                &[],
                params(json!({"vlan": 100, "mtu": 9000, "allowClaimOverrides": ["vlan", "mtu"]})),
            ),
            entry(
                ConfigSource::FromClaim,
                3,
                &["other"],
                params(json!({"mtu": 1500})),
            ),
            OpaqueConfig {
                driver: "gpu.example.com".into(),
                parameters: json!({"anything": true}),
                ..entry(ConfigSource::FromClaim, 1, &[], Value::Null)
            },
        ];
        validate_all(&configs).unwrap();
        let c = effective(&configs, "rdma").unwrap();
        assert_eq!((c.vlan, c.mtu), (Some(200), Some(9000)));
        let sub = effective(&configs, "rdma/vf").unwrap();
        assert_eq!(
            sub.vlan,
            Some(200),
            "a subrequest takes its request's config"
        );
        let o = effective(&configs, "other").unwrap();
        assert_eq!((o.vlan, o.mtu), (Some(100), Some(1500)));
        assert_eq!(effective(&configs, "rdmax").unwrap().vlan, Some(100));
    }

    fn class_and_claim(class: Value, claim: Value) -> Vec<OpaqueConfig> {
        vec![
            entry(ConfigSource::FromClass, 0, &[], params(class)),
            entry(ConfigSource::FromClaim, 1, &[], params(claim)),
        ]
    }

    fn refused(configs: &[OpaqueConfig]) -> String {
        let a = validate_all(configs).unwrap_err().to_string();
        let b = effective(configs, "rdma").unwrap_err().to_string();
        assert_eq!(a, b);
        a
    }

    #[test]
    fn a_claim_cannot_override_the_class_vlan_by_default() {
        let e = refused(&class_and_claim(json!({"vlan": 100}), json!({"vlan": 200})));
        assert!(
            e.starts_with("status.allocation.devices.config[1] (from the claim): opaque parameters field vlan: 200 is invalid: set by the DeviceClass only: its config lets a claim set nothing"),
            "{e}"
        );
        // Nor set one the class left out, nor any other field.
        for f in [
            json!({"vlan": 7}),
            json!({"mac": "02:00:00:00:00:01"}),
            json!({"attach": false}),
            json!({"interfaceName": "rdma0"}),
            json!({"memlock": "1Gi"}),
        ] {
            let e = refused(&class_and_claim(json!({}), f.clone()));
            assert!(e.contains("set by the DeviceClass only"), "{f}: {e}");
        }
        // Allowed fields pass; the others are still refused, naming the list.
        let class = json!({"vlan": 100, "allowClaimOverrides": ["interfaceName", "memlock"]});
        let ok = class_and_claim(
            class.clone(),
            json!({"interfaceName": "rdma0", "memlock": "1Gi"}),
        );
        validate_all(&ok).unwrap();
        let c = effective(&ok, "rdma").unwrap();
        assert_eq!(
            (c.vlan, c.interface_name.as_deref()),
            (Some(100), Some("rdma0"))
        );
        let e = refused(&class_and_claim(class, json!({"vlan": 5})));
        assert!(e.contains("field vlan: 5 is invalid: set by the DeviceClass only: its config lets a claim set interfaceName, memlock (the class's allowClaimOverrides)"), "{e}");
    }

    #[test]
    fn only_a_class_allows_and_only_known_fields() {
        let e = refused(&class_and_claim(
            json!({}),
            json!({"allowClaimOverrides": ["vlan"], "vlan": 3}),
        ));
        assert!(
            e.contains("field allowClaimOverrides: [\"vlan\"] is invalid: only a DeviceClass"),
            "{e}"
        );
        let e = validate_all(&class_and_claim(
            json!({"allowClaimOverrides": ["stateDir"]}),
            json!({}),
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("(from the DeviceClass): opaque parameters field allowClaimOverrides: [\"stateDir\"] is invalid: expected a list of field names from vlan, mtu"), "{e}");
        // An allow-list of a class entry for another request allows nothing here.
        let configs = vec![
            entry(
                ConfigSource::FromClass,
                0,
                &["other"],
                params(json!({"allowClaimOverrides": ["vlan"]})),
            ),
            entry(
                ConfigSource::FromClaim,
                1,
                &["rdma"],
                params(json!({"vlan": 9})),
            ),
        ];
        assert!(
            effective(&configs, "rdma")
                .unwrap_err()
                .to_string()
                .contains("field vlan: 9")
        );
    }

    #[test]
    fn a_claims_ipam_never_names_a_host_path() {
        let class = json!({"allowClaimOverrides": ["ipam"]});
        let ok = class_and_claim(
            class.clone(),
            json!({"ipam": {"type": "host-local",
            "ranges": [[{"subnet": "10.56.0.0/16"}]], "routes": [{"dst": "0.0.0.0/0"}]}}),
        );
        validate_all(&ok).unwrap();
        for (ipam, field) in [
            (
                json!({"type": "host-local", "dataDir": "/tmp/x"}),
                "field ipam.dataDir: \"/tmp/x\"",
            ),
            (
                json!({"type": "dhcp", "daemonSocketPath": "run/x.sock"}),
                "field ipam.daemonSocketPath",
            ),
            (
                json!({"type": "static", "addresses": [{"address": "/etc/passwd"}]}),
                "field ipam.addresses[0].address",
            ),
        ] {
            let e = refused(&class_and_claim(class.clone(), json!({"ipam": ipam})));
            assert!(
                e.contains(field) && e.contains("cannot name a path on the host"),
                "{e}"
            );
        }
        // Unless allowed, an ipam from a claim is refused outright.
        let e = refused(&class_and_claim(
            json!({}),
            json!({"ipam": {"type": "host-local"}}),
        ));
        assert!(e.contains("field ipam: "), "{e}");
        // A type is a plugin name for anyone, the class included.
        let e = parse(&params(json!({"ipam": {"type": "/tmp/payload"}})), "a")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(
                "field ipam.type: \"/tmp/payload\" is invalid: expected an IPAM plugin name"
            ),
            "{e}"
        );
    }
}
