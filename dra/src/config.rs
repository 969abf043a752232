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

use crate::driver::DRIVER_NAME;
use kroce_contracts::Memlock;
use kroce_contracts::network_attach;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The opaque parameters' apiVersion and kind, shared with the operator,
/// which writes them into DeviceClasses.
pub use kroce_contracts::dra::{CONFIG_API_VERSION, CONFIG_KIND};
/// IPv4's minimum and ConnectX's largest MTU.
pub const MTU_RANGE: std::ops::RangeInclusive<u64> = 68..=9978;
pub const MAX_VLAN: u64 = 4094;

/// How the RDMA device follows the netdev into the pod (the CNI's modes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NetnsMode {
    Shared,
    Exclusive,
}

/// The effective configuration of one request's devices.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vlan: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// A CNI IPAM configuration (passed on to the IPAM plugin as is).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipam: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memlock: Option<Memlock>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rdma_netns_mode: Option<NetnsMode>,
    /// The netdev's name in the pod (kernel rules, not `lo`/`eth0`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface_name: Option<String>,
    /// A unicast MAC, lower-case `aa:bb:cc:dd:ee:ff`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// `Some(false)`: the VF is not moved into the pod (char devices only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attach: Option<bool>,
}

impl ClaimConfig {
    /// `other`'s fields over these.
    fn overlay(&mut self, other: ClaimConfig) {
        self.vlan = other.vlan.or(self.vlan);
        self.mtu = other.mtu.or(self.mtu);
        self.ipam = other.ipam.or(self.ipam.take());
        self.memlock = other.memlock.or(self.memlock);
        self.rdma_netns_mode = other.rdma_netns_mode.or(self.rdma_netns_mode);
        self.interface_name = other.interface_name.or(self.interface_name.take());
        self.mac = other.mac.or(self.mac.take());
        self.attach = other.attach.or(self.attach);
    }
}

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
pub struct ConfigError {
    pub at: String,
    pub field: String,
    pub value: String,
    pub reason: String,
}

fn err(at: &str, field: &str, value: &Value, reason: impl Into<String>) -> ConfigError {
    ConfigError {
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
) -> Result<u64, ConfigError> {
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

/// `aa:bb:cc:dd:ee:ff` (either case), not multicast, not all zeros;
/// returned lower-case.
fn unicast_mac(v: &Value) -> Result<String, String> {
    let s = v.as_str().ok_or("expected a string")?;
    let bytes: Vec<u8> = s
        .split(':')
        .map(|p| {
            if p.len() == 2 {
                u8::from_str_radix(p, 16).ok()
            } else {
                None
            }
        })
        .collect::<Option<Vec<u8>>>()
        .filter(|b| b.len() == 6)
        .ok_or("expected six hex bytes separated by ':'")?;
    if bytes[0] & 1 == 1 {
        return Err("a multicast address cannot name one interface".into());
    }
    if bytes.iter().all(|b| *b == 0) {
        return Err("all zeros is not an address".into());
    }
    Ok(s.to_ascii_lowercase())
}

/// Parses and validates one entry's `parameters`. `at` names the entry.
pub fn parse(parameters: &Value, at: &str) -> Result<ClaimConfig, ConfigError> {
    let Some(obj) = parameters.as_object() else {
        return Err(err(at, "parameters", parameters, "expected an object"));
    };
    let mut out = ClaimConfig::default();
    let mut api_version = None;
    let mut kind = None;
    for (k, v) in obj {
        match k.as_str() {
            "apiVersion" => api_version = Some(v),
            "kind" => kind = Some(v),
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
                network_attach::check_ifname(name).map_err(|e| err(at, k, v, e))?;
                out.interface_name = Some(name.to_string());
            }
            "mac" => out.mac = Some(unicast_mac(v).map_err(|e| err(at, k, v, e))?),
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
                    "unknown field (known: apiVersion, kind, vlan, mtu, ipam, memlock, rdmaNetnsMode, interfaceName, mac, attach)",
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
    Ok(out)
}

/// The effective configuration of `request`: this driver's entries that
/// apply to it, class entries first, claim entries over them.
pub fn effective(configs: &[OpaqueConfig], request: &str) -> Result<ClaimConfig, ConfigError> {
    let mut mine: Vec<&OpaqueConfig> = configs
        .iter()
        .filter(|c| c.driver == DRIVER_NAME && c.applies_to(request))
        .collect();
    mine.sort_by_key(|c| (c.source, c.index));
    let mut out = ClaimConfig::default();
    for c in mine {
        out.overlay(parse(&c.parameters, &c.location())?);
    }
    Ok(out)
}

/// Validates every entry of this driver, whether or not a request of ours
/// uses it: a typo anywhere fails the claim instead of being ignored.
pub fn validate_all(configs: &[OpaqueConfig]) -> Result<(), ConfigError> {
    for c in configs.iter().filter(|c| c.driver == DRIVER_NAME) {
        parse(&c.parameters, &c.location())?;
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
        assert_eq!(n.mac.as_deref(), Some("02:aa:bb:cc:dd:01"));
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
                params(json!({"vlan": 100, "mtu": 9000})),
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
}
