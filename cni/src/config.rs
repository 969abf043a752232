//! The network configuration on stdin, parsed and validated completely
//! before anything is touched. Pure: bytes (and `CNI_ARGS`) in, a
//! [`NetConf`] or an error naming the field and value out.
//!
//! Keys (see README): `cniVersion`, `name`, `type`, `deviceID`
//! (`runtimeConfig.deviceID`, Multus' `deviceID`/`pciBusID`,
//! `runtimeConfig.CNIDeviceInfoFile`), `vlan`, `vlanQoS`, `vlanProto`, `mac`
//! (`runtimeConfig.mac`, `CNI_ARGS MAC=`), `mtu`, `spoofchk`, `trust`,
//! `link_state`, `min_tx_rate`, `max_tx_rate`, `rdma`, `memlock`, `ipam`,
//! `dns`, `logLevel`, `prevResult`, `cni.dev/valid-attachments`.
//!
//! The config is tenant input (a namespace admin writes it into a
//! NetworkAttachmentDefinition): no key names a host path or a program.
//! The keys that once did (`hostRoot`, `sysfsRoot`, `procRoot`, `stateDir`,
//! `logFile`) are refused by name; roots come from the plugin's environment
//! (`kroce_contracts::cni_env`). `ipam.type` is a bare file name looked up
//! on the runtime's `CNI_PATH`.

use crate::addr::Mac;
use crate::log::LogLevel;
use crate::protocol::{CniArgs, CniError, CniResult, CniVersion, Dns, code};
use crate::vf::rdma_name_ok;
use kroce_contracts::{Memlock, link_limits};
use kroce_netlink::vf_attrs::{LinkState, VlanProto};
use serde_json::{Map, Value};
use sriov_helpers::PciAddress;
use std::path::PathBuf;

/// Why a configuration was refused; each maps to one CNI error code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot decode the network configuration: {0}")]
    Decode(String),
    #[error("{0}")]
    Version(String),
    #[error("invalid {field} {value}: {reason}")]
    Invalid {
        field: String,
        value: String,
        reason: String,
    },
}

impl ConfigError {
    pub fn code(&self) -> u32 {
        match self {
            ConfigError::Decode(_) => code::DECODE,
            ConfigError::Version(_) => code::INCOMPATIBLE_VERSION,
            ConfigError::Invalid { .. } => code::INVALID_CONFIG,
        }
    }
}

impl From<ConfigError> for CniError {
    fn from(e: ConfigError) -> CniError {
        CniError::new(e.code(), e.to_string())
    }
}

fn invalid(field: &str, value: &Value, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field: field.to_string(),
        value: value.to_string(),
        reason: reason.into(),
    }
}

/// Where the VF comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceRef {
    /// Given in the config; `field` names the key it came from.
    Pci { addr: PciAddress, field: String },
    /// A soft RDMA device (e.g. rxe) named in the config; its parent netdev
    /// is the device. No PF, so no PF-side VF attributes.
    Soft { name: String, field: String },
    /// To be read from the device-info file (device-info-spec 1.1.0).
    InfoFile(PathBuf),
    /// Not given: fine for DEL/GC/STATUS, an error for ADD.
    Missing,
}

/// `rdma`: whether the VF's RDMA device follows it into the pod netns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RdmaPolicy {
    /// Move it when the host's RDMA netns mode is exclusive.
    #[default]
    Auto,
    /// Always move it (ADD fails in shared mode).
    Always,
    /// Never move it.
    Never,
}

/// PF-side VF attributes asked for (each `None` = leave as is).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VfAttrs {
    pub vlan: Option<u16>,
    pub vlan_qos: Option<u8>,
    pub vlan_proto: Option<VlanProto>,
    pub spoofchk: Option<bool>,
    pub trust: Option<bool>,
    pub link_state: Option<LinkState>,
    pub min_tx_rate: Option<u32>,
    pub max_tx_rate: Option<u32>,
}

/// `ipam`: the delegate's plugin name (the whole config goes to it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpamConf {
    pub plugin: String,
}

/// One `cni.dev/valid-attachments` entry.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Attachment {
    pub container_id: String,
    pub ifname: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct NetConf {
    pub cni_version: CniVersion,
    pub name: String,
    pub plugin_type: String,
    pub device: DeviceRef,
    pub vf: VfAttrs,
    /// Final MAC after `runtimeConfig.mac` > `CNI_ARGS MAC` > `mac`.
    pub mac: Option<Mac>,
    pub mtu: Option<u32>,
    pub rdma: RdmaPolicy,
    pub memlock: Option<Memlock>,
    pub ipam: Option<IpamConf>,
    pub dns: Dns,
    pub log_level: LogLevel,
    pub prev_result: Option<CniResult>,
    pub valid_attachments: Option<Vec<Attachment>>,
    /// The configuration as received, for the IPAM delegate.
    pub raw: Value,
}

/// Only the version, for error objects of configs that fail to parse.
pub fn peek_version(bytes: &[u8]) -> Option<CniVersion> {
    let v: Value = serde_json::from_slice(bytes).ok()?;
    CniVersion::parse(v.get("cniVersion")?.as_str()?)
}

/// A VF PCI address or a soft RDMA device name, as given.
#[derive(Debug, Clone, PartialEq, Eq)]
enum DeviceId {
    Pci(PciAddress),
    Soft(String),
}

impl std::fmt::Display for DeviceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceId::Pci(a) => a.fmt(f),
            DeviceId::Soft(n) => f.write_str(n),
        }
    }
}

fn network_name_ok(s: &str) -> bool {
    let mut c = s.chars();
    matches!(c.next(), Some(f) if f.is_ascii_alphanumeric())
        && c.all(|x| x.is_ascii_alphanumeric() || matches!(x, '_' | '.' | '-'))
}

/// One JSON object's keys, named in errors with `prefix` (`runtimeConfig.`).
struct Fields<'a> {
    /// `None`: the object is absent, so every key is.
    obj: Option<&'a Map<String, Value>>,
    prefix: &'a str,
}

impl<'a> Fields<'a> {
    fn name(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    /// The value, `null` counted as absent.
    fn get(&self, key: &str) -> Option<&'a Value> {
        self.raw(key).filter(|v| !v.is_null())
    }

    /// The value as given, `null` included.
    fn raw(&self, key: &str) -> Option<&'a Value> {
        self.obj.and_then(|o| o.get(key))
    }

    /// A string naming one of a fixed set, read by `parse`; else refused
    /// with `expected`.
    fn one_of<T>(
        &self,
        key: &str,
        parse: impl Fn(&str) -> Option<T>,
        expected: &str,
    ) -> Result<Option<T>, ConfigError> {
        match self.string(key)? {
            None => Ok(None),
            Some(s) => parse(s)
                .map(Some)
                .ok_or_else(|| invalid(&self.name(key), &Value::String(s.into()), expected)),
        }
    }

    fn string(&self, key: &str) -> Result<Option<&'a str>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(invalid(&self.name(key), v, "must be a string")),
        }
    }

    fn uint(&self, key: &str, min: u64, max: u64) -> Result<Option<u64>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => {
                let n = v
                    .as_u64()
                    .ok_or_else(|| invalid(&self.name(key), v, "must be a whole number"))?;
                if n < min || n > max {
                    return Err(invalid(&self.name(key), v, format!("must be {min}-{max}")));
                }
                Ok(Some(n))
            }
        }
    }

    /// `"on"`/`"off"` (sriov-cni's form) or a boolean.
    fn on_off(&self, key: &str) -> Result<Option<bool>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(Value::String(s)) if s == "on" => Ok(Some(true)),
            Some(Value::String(s)) if s == "off" => Ok(Some(false)),
            Some(v) => Err(invalid(&self.name(key), v, "must be \"on\" or \"off\"")),
        }
    }

    fn abs_path(&self, key: &str) -> Result<Option<PathBuf>, ConfigError> {
        match self.string(key)? {
            None => Ok(None),
            Some(s) if s.starts_with('/') && !s.contains('\0') => Ok(Some(PathBuf::from(s))),
            Some(s) => Err(invalid(
                &self.name(key),
                &Value::String(s.to_string()),
                "must be an absolute path",
            )),
        }
    }

    fn pci(&self, key: &str) -> Result<Option<PciAddress>, ConfigError> {
        match self.string(key)? {
            None => Ok(None),
            Some(s) => s.parse::<PciAddress>().map(Some).map_err(|e| {
                invalid(
                    &self.name(key),
                    &Value::String(s.to_string()),
                    e.to_string(),
                )
            }),
        }
    }

    /// A `deviceID`: a VF PCI address, else a soft RDMA device name.
    fn device_id(&self, key: &str) -> Result<Option<DeviceId>, ConfigError> {
        match self.string(key)? {
            None => Ok(None),
            Some(s) => match s.parse::<PciAddress>() {
                Ok(a) => Ok(Some(DeviceId::Pci(a))),
                Err(_) if rdma_name_ok(s) => Ok(Some(DeviceId::Soft(s.to_string()))),
                Err(e) => Err(invalid(
                    &self.name(key),
                    &Value::String(s.to_string()),
                    format!("{e}; nor an RDMA device name ([A-Za-z0-9_.-], 1 to 63 characters)"),
                )),
            },
        }
    }

    fn mac(&self, key: &str) -> Result<Option<Mac>, ConfigError> {
        match self.string(key)? {
            None => Ok(None),
            Some(s) => Mac::parse_unicast(s).map(Some).map_err(|e| {
                invalid(
                    &self.name(key),
                    &Value::String(s.to_string()),
                    e.to_string(),
                )
            }),
        }
    }
}

/// A key that once chose a host path (a test seam): refused wherever it
/// appears at the top or in `runtimeConfig`, so an old config fails loudly
/// instead of being half-honoured.
fn refuse_host_keys(obj: &Map<String, Value>) -> Result<(), ConfigError> {
    let rc = obj.get("runtimeConfig").and_then(Value::as_object);
    for key in kroce_contracts::cni_env::REFUSED_CONFIG_KEYS {
        let found = obj.get(*key).map(|v| (key.to_string(), v)).or_else(|| {
            rc.and_then(|m| m.get(*key))
                .map(|v| (format!("runtimeConfig.{key}"), v))
        });
        if let Some((field, v)) = found {
            return Err(invalid(
                &field,
                v,
                format!(
                    "is not accepted: the network config is tenant input and never names a host path; \
                     the installer sets {} in the runtime's environment",
                    kroce_contracts::cni_env::ALL.join(", ")
                ),
            ));
        }
    }
    Ok(())
}

/// Parses and validates a network configuration: one function per section,
/// read in this order; the first refusal is the answer.
pub fn parse(bytes: &[u8], args: &CniArgs) -> Result<NetConf, ConfigError> {
    let raw: Value =
        serde_json::from_slice(bytes).map_err(|e| ConfigError::Decode(e.to_string()))?;
    let obj = raw
        .as_object()
        .ok_or_else(|| ConfigError::Decode("the configuration is not a JSON object".into()))?;
    // Before anything else: an old config naming a host path fails on that.
    refuse_host_keys(obj)?;
    let top = Fields {
        obj: Some(obj),
        prefix: "",
    };
    let cni_version = parse_version(&top)?;
    let (name, plugin_type) = parse_identity(&top)?;
    let rc = runtime_config(&top)?;
    let device = parse_device(&top, &rc)?;
    refuse_pf_side_attrs_without_pf(&top, &device)?;
    let vf = parse_vf_attrs(&top)?;
    let mac = parse_mac(&top, &rc, args)?;
    let mtu = top
        .uint(
            "mtu",
            link_limits::MTU_MIN.into(),
            link_limits::MTU_MAX.into(),
        )?
        .map(|v| v as u32);
    let rdma = parse_rdma(&top)?;
    let memlock = parse_memlock(&top)?;
    let ipam = parse_ipam(&top)?;
    let dns = match top.get("dns") {
        None => Dns::default(),
        Some(v) => Dns::parse(v, "dns").map_err(|e| invalid("dns", v, e.to_string()))?,
    };
    let log_level = top
        .one_of(
            "logLevel",
            LogLevel::parse,
            "must be error, warning, info or debug",
        )?
        .unwrap_or(LogLevel::Info);
    let prev_result = match top.get("prevResult") {
        None => None,
        Some(v) => Some(
            CniResult::parse(v).map_err(|e| invalid("prevResult", &Value::Null, e.to_string()))?,
        ),
    };
    let valid_attachments = parse_valid_attachments(obj)?;
    Ok(NetConf {
        cni_version,
        name,
        plugin_type,
        device,
        vf,
        mac,
        mtu,
        rdma,
        memlock,
        ipam,
        dns,
        log_level,
        prev_result,
        valid_attachments,
        raw,
    })
}

/// `cniVersion`: any problem with it is a version error (code 1).
fn parse_version(top: &Fields<'_>) -> Result<CniVersion, ConfigError> {
    let version_s = top
        .string("cniVersion")
        .map_err(|e| ConfigError::Version(e.to_string()))?
        .ok_or_else(|| ConfigError::Version("cniVersion is missing".into()))?;
    CniVersion::parse(version_s).ok_or_else(|| {
        ConfigError::Version(format!(
            "cniVersion {version_s:?} is not supported (supported: 0.4.0, 1.0.0, 1.1.0)"
        ))
    })
}

/// `name` and `type`.
fn parse_identity(top: &Fields<'_>) -> Result<(String, String), ConfigError> {
    let name = top
        .string("name")?
        .ok_or_else(|| invalid("name", &Value::Null, "is required"))?;
    if !network_name_ok(name) {
        return Err(invalid(
            "name",
            &Value::String(name.into()),
            "must start with a letter or digit and hold only letters, digits, '_', '.', '-'",
        ));
    }
    let plugin_type = top
        .string("type")?
        .filter(|t| !t.is_empty())
        .ok_or_else(|| {
            invalid(
                "type",
                top.raw("type").unwrap_or(&Value::Null),
                "is required",
            )
        })?;
    Ok((name.to_string(), plugin_type.to_string()))
}

/// `runtimeConfig`: absent means no fields.
fn runtime_config<'a>(top: &Fields<'a>) -> Result<Fields<'a>, ConfigError> {
    let obj = match top.get("runtimeConfig") {
        None => None,
        Some(Value::Object(m)) => Some(m),
        Some(v) => return Err(invalid("runtimeConfig", v, "must be an object")),
    };
    Ok(Fields {
        obj,
        prefix: "runtimeConfig.",
    })
}

/// The device: every explicit source (`runtimeConfig.deviceID`, `deviceID`,
/// `pciBusID`) must agree; the device-info file is the fallback.
fn parse_device(top: &Fields<'_>, rc: &Fields<'_>) -> Result<DeviceRef, ConfigError> {
    let mut explicit: Vec<(String, DeviceId)> = Vec::new();
    for (fields, key) in [(rc, "deviceID"), (top, "deviceID")] {
        if let Some(d) = fields.device_id(key)? {
            explicit.push((fields.name(key), d));
        }
    }
    // Multus' pciBusID is only ever a PCI address.
    if let Some(a) = top.pci("pciBusID")? {
        explicit.push((top.name("pciBusID"), DeviceId::Pci(a)));
    }
    if let Some((f0, a0)) = explicit.first()
        && let Some((f1, a1)) = explicit.iter().find(|(_, a)| a != a0)
    {
        return Err(invalid(
            f1,
            &Value::String(a1.to_string()),
            format!("disagrees with {f0} {a0}"),
        ));
    }
    Ok(match explicit.into_iter().next() {
        Some((field, DeviceId::Pci(addr))) => DeviceRef::Pci { addr, field },
        Some((field, DeviceId::Soft(name))) => DeviceRef::Soft { name, field },
        None => match rc.abs_path("CNIDeviceInfoFile")? {
            Some(p) => DeviceRef::InfoFile(p),
            None => DeviceRef::Missing,
        },
    })
}

/// The keys of PF-side VF attributes (set through the PF's netdev).
const PF_SIDE_KEYS: [&str; 8] = [
    "vlan",
    "vlanQoS",
    "vlanProto",
    "spoofchk",
    "trust",
    "link_state",
    "min_tx_rate",
    "max_tx_rate",
];

/// A soft RDMA device has no PF: PF-side VF attributes cannot apply. The
/// "no PF" refusal a request meets: a soft RDMA device is the only device
/// without a PF (a PCI `deviceID` must resolve to a VF), so it is made here,
/// before anything is read. `plan::plan_add` keeps the rule for callers past
/// the parser; ADD's steps take it as given.
fn refuse_pf_side_attrs_without_pf(
    top: &Fields<'_>,
    device: &DeviceRef,
) -> Result<(), ConfigError> {
    let DeviceRef::Soft { name, .. } = device else {
        return Ok(());
    };
    match PF_SIDE_KEYS.iter().find_map(|k| Some((*k, top.get(k)?))) {
        Some((key, v)) => Err(invalid(
            key,
            v,
            format!("is a PF-side VF attribute; deviceID {name} is a soft RDMA device (no PF)"),
        )),
        None => Ok(()),
    }
}

/// `vlan`, `vlanQoS`, `vlanProto`, `spoofchk`, `trust`, `link_state`,
/// `min_tx_rate`, `max_tx_rate`.
fn parse_vf_attrs(top: &Fields<'_>) -> Result<VfAttrs, ConfigError> {
    let (vlan, vlan_qos, vlan_proto) = parse_vlan(top)?;
    let link_state = top.one_of(
        "link_state",
        LinkState::parse,
        "must be \"auto\", \"enable\" or \"disable\"",
    )?;
    let (min_tx_rate, max_tx_rate) = parse_rates(top)?;
    Ok(VfAttrs {
        vlan,
        vlan_qos,
        vlan_proto,
        spoofchk: top.on_off("spoofchk")?,
        trust: top.on_off("trust")?,
        link_state,
        min_tx_rate,
        max_tx_rate,
    })
}

type Vlan = (Option<u16>, Option<u8>, Option<VlanProto>);

/// `vlan`, `vlanQoS`, `vlanProto` and the rules between them.
fn parse_vlan(top: &Fields<'_>) -> Result<Vlan, ConfigError> {
    let vlan = top
        .uint("vlan", 0, link_limits::VLAN_MAX.into())?
        .map(|v| v as u16);
    let vlan_qos = top.uint("vlanQoS", 0, 7)?.map(|v| v as u8);
    let vlan_proto = top.one_of(
        "vlanProto",
        VlanProto::parse,
        "must be \"802.1Q\" or \"802.1ad\"",
    )?;
    if let Some(q) = vlan_qos
        && q != 0
        && vlan.unwrap_or(0) == 0
    {
        return Err(invalid("vlanQoS", &Value::from(q), "needs a non-zero vlan"));
    }
    if let Some(p) = vlan_proto {
        let refuse = |reason| invalid("vlanProto", &Value::String(p.to_string()), reason);
        if vlan.is_none() {
            return Err(refuse("needs vlan"));
        }
        if p == VlanProto::Dot1Ad && vlan == Some(0) {
            return Err(refuse("802.1ad needs a non-zero vlan"));
        }
    }
    Ok((vlan, vlan_qos, vlan_proto))
}

/// `min_tx_rate`, `max_tx_rate` (max 0 is "no limit").
fn parse_rates(top: &Fields<'_>) -> Result<(Option<u32>, Option<u32>), ConfigError> {
    let min_tx_rate = top
        .uint("min_tx_rate", 0, u64::from(u32::MAX))?
        .map(|v| v as u32);
    let max_tx_rate = top
        .uint("max_tx_rate", 0, u64::from(u32::MAX))?
        .map(|v| v as u32);
    if let (Some(min), Some(max)) = (min_tx_rate, max_tx_rate)
        && max != 0
        && min > max
    {
        return Err(invalid(
            "min_tx_rate",
            &Value::from(min),
            format!("is above max_tx_rate {max}"),
        ));
    }
    Ok((min_tx_rate, max_tx_rate))
}

/// The MAC: `runtimeConfig.mac` > `CNI_ARGS MAC` > `mac`; each given one
/// must be a unicast address, even when another overrides it.
fn parse_mac(
    top: &Fields<'_>,
    rc: &Fields<'_>,
    args: &CniArgs,
) -> Result<Option<Mac>, ConfigError> {
    let mac_args = match args.get("MAC") {
        None => None,
        Some(s) => Some(
            Mac::parse_unicast(s)
                .map_err(|e| invalid("CNI_ARGS MAC", &Value::String(s.into()), e.to_string()))?,
        ),
    };
    let mac = rc.mac("mac")?.or(mac_args);
    let own = top.mac("mac")?;
    Ok(mac.or(own))
}

/// `rdma`: true, false or "auto" (the default).
fn parse_rdma(top: &Fields<'_>) -> Result<RdmaPolicy, ConfigError> {
    match top.get("rdma") {
        None => Ok(RdmaPolicy::Auto),
        Some(Value::Bool(true)) => Ok(RdmaPolicy::Always),
        Some(Value::Bool(false)) => Ok(RdmaPolicy::Never),
        Some(Value::String(s)) if s == "auto" => Ok(RdmaPolicy::Auto),
        Some(v) => Err(invalid("rdma", v, "must be \"auto\", true or false")),
    }
}

/// `memlock`, in the one grammar of [`kroce_contracts::Memlock`].
fn parse_memlock(top: &Fields<'_>) -> Result<Option<Memlock>, ConfigError> {
    match top.get("memlock") {
        None => Ok(None),
        Some(v) => Memlock::from_json(v)
            .map(Some)
            .map_err(|e| invalid("memlock", v, e.to_string())),
    }
}

/// `ipam`: an object whose `type` is a bare plugin file name (looked up on
/// `CNI_PATH`, never a path); no or an empty `type` means no IPAM.
fn parse_ipam(top: &Fields<'_>) -> Result<Option<IpamConf>, ConfigError> {
    let m = match top.get("ipam") {
        None => return Ok(None),
        Some(Value::Object(m)) => m,
        Some(v) => return Err(invalid("ipam", v, "must be an object")),
    };
    let f = Fields {
        obj: Some(m),
        prefix: "ipam.",
    };
    match f.string("type")? {
        None | Some("") => Ok(None),
        Some(t) if t.contains('/') || t == "." || t == ".." || t.contains('\0') => Err(invalid(
            "ipam.type",
            &Value::String(t.into()),
            "must be a plugin file name, not a path",
        )),
        Some(t) => Ok(Some(IpamConf {
            plugin: t.to_string(),
        })),
    }
}

/// `cni.dev/valid-attachments` (or the older `cni.dev/attachments`).
/// Not through `Fields::get`: here a present `null` differs from an absent
/// key. libcni >= 1.2 sends `null` when no attachment is valid, which means
/// "none valid", an empty list; only an absent key is refused by GC.
fn parse_valid_attachments(
    obj: &Map<String, Value>,
) -> Result<Option<Vec<Attachment>>, ConfigError> {
    let found = ["cni.dev/valid-attachments", "cni.dev/attachments"]
        .into_iter()
        .find_map(|key| Some((key, obj.get(key)?)));
    match found {
        None => Ok(None),
        Some((_, Value::Null)) => Ok(Some(Vec::new())),
        Some((key, Value::Array(items))) => items
            .iter()
            .enumerate()
            .map(|(i, item)| parse_attachment(&format!("{key}[{i}]"), item))
            .collect::<Result<Vec<_>, _>>()
            .map(Some),
        Some((key, v)) => Err(invalid(key, v, "must be a list")),
    }
}

/// One attachment, `{"containerID": .., "ifname": ..}`; `field` names it.
fn parse_attachment(field: &str, item: &Value) -> Result<Attachment, ConfigError> {
    let o = item
        .as_object()
        .ok_or_else(|| invalid(field, item, "must be an object"))?;
    let get = |k: &str| {
        o.get(k)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .ok_or_else(|| invalid(&format!("{field}.{k}"), item, "is required"))
    };
    Ok(Attachment {
        container_id: get("containerID")?,
        ifname: get("ifname")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn base() -> Value {
        json!({"cniVersion":"1.0.0","name":"rdma-a","type":"kroce-cni","deviceID":"0000:3b:00.2"})
    }

    fn with(k: &str, v: Value) -> Vec<u8> {
        let mut b = base();
        b[k] = v;
        serde_json::to_vec(&b).unwrap()
    }

    fn err(bytes: &[u8]) -> ConfigError {
        parse(bytes, &CniArgs::default()).unwrap_err()
    }

    #[test]
    fn full_config() {
        let c = json!({
            "cniVersion":"1.1.0","name":"rdma-a","type":"kroce-cni",
            "deviceID":"0000:3b:00.2","vlan":100,"vlanQoS":3,"vlanProto":"802.1ad",
            "mac":"02:11:22:33:44:55","mtu":9000,"spoofchk":"off","trust":"on",
            "link_state":"enable","min_tx_rate":100,"max_tx_rate":1000,"rdma":true,
            "memlock":"unlimited","ipam":{"type":"host-local","subnet":"10.56.0.0/24"},
            "logLevel":"debug","unknownKey":{"ignored":true}
        });
        let n = parse(&serde_json::to_vec(&c).unwrap(), &CniArgs::default()).unwrap();
        assert_eq!(n.cni_version, CniVersion::V1_1_0);
        assert_eq!(n.vf.vlan, Some(100));
        assert_eq!(n.vf.vlan_qos, Some(3));
        assert_eq!(n.vf.vlan_proto, Some(VlanProto::Dot1Ad));
        assert_eq!(n.vf.spoofchk, Some(false));
        assert_eq!(n.vf.trust, Some(true));
        assert_eq!(n.vf.link_state, Some(LinkState::Enable));
        assert_eq!(n.mtu, Some(9000));
        assert_eq!(n.rdma, RdmaPolicy::Always);
        assert_eq!(n.memlock, Some(Memlock::Unlimited));
        assert_eq!(n.ipam.as_ref().unwrap().plugin, "host-local");
        assert!(matches!(n.device, DeviceRef::Pci { ref field, .. } if field == "deviceID"));
    }

    #[test]
    fn every_field_out_of_range_is_named() {
        let cases: Vec<(&str, Value, &str)> = vec![
            ("vlan", json!(4095), "vlan"),
            ("vlan", json!(-1), "vlan"),
            ("vlan", json!("100"), "vlan"),
            ("vlanQoS", json!(8), "vlanQoS"),
            ("vlanProto", json!("802.1x"), "vlanProto"),
            ("mac", json!("01:00:5e:00:00:01"), "mac"),
            ("mac", json!("00:00:00:00:00:00"), "mac"),
            ("mac", json!("zz"), "mac"),
            ("mtu", json!(67), "mtu"),
            ("mtu", json!(65536), "mtu"),
            ("spoofchk", json!("yes"), "spoofchk"),
            ("trust", json!(1), "trust"),
            ("link_state", json!("up"), "link_state"),
            ("min_tx_rate", json!(-5), "min_tx_rate"),
            ("max_tx_rate", json!(4294967296u64), "max_tx_rate"),
            ("rdma", json!("yes"), "rdma"),
            ("memlock", json!("lots"), "memlock"),
            ("memlock", json!(0), "memlock"),
            // Kubernetes spells kilo `k`; one grammar everywhere (kroce_contracts).
            ("memlock", json!("64K"), "memlock"),
            ("memlock", json!("64g"), "memlock"),
            ("ipam", json!("host-local"), "ipam"),
            ("ipam", json!({"type":"../../bin/sh"}), "ipam.type"),
            ("logLevel", json!("loud"), "logLevel"),
            ("logFile", json!("relative.log"), "logFile"),
            ("logFile", json!("/var/log/kroce-cni.log"), "logFile"),
            ("stateDir", json!("var/lib"), "stateDir"),
            ("stateDir", json!("/tmp/s"), "stateDir"),
            ("hostRoot", json!(7), "hostRoot"),
            ("hostRoot", json!("/host"), "hostRoot"),
            ("sysfsRoot", json!("/fake/sys"), "sysfsRoot"),
            ("procRoot", json!("/proc"), "procRoot"),
            ("procRoot", Value::Null, "procRoot"),
            ("deviceID", json!("../../../etc/passwd"), "deviceID"),
            ("deviceID", json!("0000:3b:00.9"), "deviceID"),
            ("deviceID", json!(5), "deviceID"),
            ("pciBusID", json!("0000:86:00.2"), "pciBusID"),
            ("name", json!("-bad"), "name"),
            ("runtimeConfig", json!([1]), "runtimeConfig"),
            (
                "cni.dev/valid-attachments",
                json!([{"containerID":"a"}]),
                "ifname",
            ),
        ];
        for (k, v, field) in cases {
            let e = err(&with(k, v.clone()));
            assert_eq!(e.code(), code::INVALID_CONFIG, "{k}={v}: {e}");
            let msg = e.to_string();
            assert!(msg.contains(field), "{k}={v}: {msg}");
        }
    }

    #[test]
    fn host_path_keys_are_refused_by_name_first() {
        for key in kroce_contracts::cni_env::REFUSED_CONFIG_KEYS {
            // Even a config that is wrong otherwise (bad cniVersion) is
            // refused for the key: nothing else is looked at first.
            let mut c = base();
            c[*key] = json!("/var/lib/cni/kroce");
            c["cniVersion"] = json!("9.9.9");
            let e = err(&serde_json::to_vec(&c).unwrap());
            assert_eq!(e.code(), code::INVALID_CONFIG, "{key}: {e}");
            assert!(e.to_string().contains(key), "{key}: {e}");
            assert!(e.to_string().contains("KROCE_CNI_"), "{key}: {e}");
            let mut c = base();
            c["runtimeConfig"] = json!({*key: "/x"});
            let e = err(&serde_json::to_vec(&c).unwrap());
            assert!(
                e.to_string().contains(&format!("runtimeConfig.{key}")),
                "{key}: {e}"
            );
        }
        // ipam.type is a bare name.
        for bad in ["/tmp/payload.sh", "../bin/sh", "..", "."] {
            let e = err(&with("ipam", json!({"type": bad})));
            assert!(e.to_string().contains("ipam.type"), "{bad}: {e}");
        }
    }

    #[test]
    fn cross_field_rules() {
        let mut c = base();
        c["vlanQoS"] = json!(3);
        assert!(
            err(&serde_json::to_vec(&c).unwrap())
                .to_string()
                .contains("non-zero vlan")
        );
        let mut c = base();
        c["vlanProto"] = json!("802.1ad");
        assert!(
            err(&serde_json::to_vec(&c).unwrap())
                .to_string()
                .contains("needs vlan")
        );
        c["vlan"] = json!(0);
        assert!(
            err(&serde_json::to_vec(&c).unwrap())
                .to_string()
                .contains("non-zero")
        );
        let mut c = base();
        c["min_tx_rate"] = json!(500);
        c["max_tx_rate"] = json!(100);
        assert!(
            err(&serde_json::to_vec(&c).unwrap())
                .to_string()
                .contains("above max_tx_rate")
        );
        c["max_tx_rate"] = json!(0);
        assert!(parse(&serde_json::to_vec(&c).unwrap(), &CniArgs::default()).is_ok());
    }

    #[test]
    fn decode_and_version_errors() {
        assert_eq!(err(b"{not json").code(), code::DECODE);
        assert_eq!(err(b"[1,2]").code(), code::DECODE);
        let mut c = base();
        c["cniVersion"] = json!("0.3.1");
        let e = err(&serde_json::to_vec(&c).unwrap());
        assert_eq!(e.code(), code::INCOMPATIBLE_VERSION);
        assert!(e.to_string().contains("0.3.1"));
        c["cniVersion"] = json!("9.9.9");
        assert_eq!(
            err(&serde_json::to_vec(&c).unwrap()).code(),
            code::INCOMPATIBLE_VERSION
        );
        c.as_object_mut().unwrap().remove("cniVersion");
        assert_eq!(
            err(&serde_json::to_vec(&c).unwrap()).code(),
            code::INCOMPATIBLE_VERSION
        );
    }

    #[test]
    fn soft_device_names() {
        let c = json!({"cniVersion":"1.0.0","name":"n","type":"kroce-cni","deviceID":"rxe_kvf0"});
        let n = parse(&serde_json::to_vec(&c).unwrap(), &CniArgs::default()).unwrap();
        assert_eq!(
            n.device,
            DeviceRef::Soft {
                name: "rxe_kvf0".into(),
                field: "deviceID".into()
            }
        );
        for bad in ["..", ".", "rxe/../x", "/sys", "a b", &"r".repeat(64)] {
            let c = json!({"cniVersion":"1.0.0","name":"n","type":"kroce-cni","deviceID":bad});
            let e = err(&serde_json::to_vec(&c).unwrap());
            assert!(e.to_string().contains("deviceID"), "{bad}: {e}");
        }
        // pciBusID stays PCI-only.
        let c = json!({"cniVersion":"1.0.0","name":"n","type":"kroce-cni","pciBusID":"rxe_kvf0"});
        assert!(
            err(&serde_json::to_vec(&c).unwrap())
                .to_string()
                .contains("pciBusID")
        );
        // Sources must agree across kinds.
        let c = json!({"cniVersion":"1.0.0","name":"n","type":"kroce-cni",
            "runtimeConfig":{"deviceID":"rxe_kvf0"},"deviceID":"0000:3b:00.2"});
        assert!(
            err(&serde_json::to_vec(&c).unwrap())
                .to_string()
                .contains("disagrees")
        );
    }

    #[test]
    fn soft_device_refuses_pf_side_attributes() {
        for (k, v) in [
            ("vlan", json!(100)),
            ("vlanQoS", json!(0)),
            ("vlanProto", json!("802.1Q")),
            ("spoofchk", json!("off")),
            ("trust", json!(true)),
            ("link_state", json!("enable")),
            ("min_tx_rate", json!(0)),
            ("max_tx_rate", json!(100)),
        ] {
            let mut c =
                json!({"cniVersion":"1.0.0","name":"n","type":"kroce-cni","deviceID":"rxe_t0"});
            c[k] = v;
            let e = err(&serde_json::to_vec(&c).unwrap());
            assert_eq!(e.code(), code::INVALID_CONFIG, "{k}: {e}");
            let msg = e.to_string();
            assert!(
                msg.contains(k) && msg.contains("soft RDMA device"),
                "{k}: {msg}"
            );
        }
        // MAC and MTU are netdev-side: fine.
        let c = json!({"cniVersion":"1.0.0","name":"n","type":"kroce-cni","deviceID":"rxe_t0",
            "mac":"02:11:22:33:44:55","mtu":1500});
        assert!(parse(&serde_json::to_vec(&c).unwrap(), &CniArgs::default()).is_ok());
    }

    #[test]
    fn device_sources_and_precedence() {
        let c = json!({"cniVersion":"1.0.0","name":"n","type":"kroce-cni",
            "runtimeConfig":{"deviceID":"0000:3b:00.3"},"deviceID":"0000:3b:00.2"});
        let e = err(&serde_json::to_vec(&c).unwrap());
        assert!(e.to_string().contains("disagrees"), "{e}");
        let c = json!({"cniVersion":"1.0.0","name":"n","type":"kroce-cni","pciBusID":"3b:00.2"});
        let n = parse(&serde_json::to_vec(&c).unwrap(), &CniArgs::default()).unwrap();
        assert_eq!(
            n.device,
            DeviceRef::Pci {
                addr: "0000:3b:00.2".parse().unwrap(),
                field: "pciBusID".into()
            }
        );
        let c = json!({"cniVersion":"1.0.0","name":"n","type":"kroce-cni",
            "runtimeConfig":{"CNIDeviceInfoFile":"/var/run/k8s.cni.cncf.io/devinfo/x.json"}});
        let n = parse(&serde_json::to_vec(&c).unwrap(), &CniArgs::default()).unwrap();
        assert!(matches!(n.device, DeviceRef::InfoFile(_)));
        let c = json!({"cniVersion":"1.0.0","name":"n","type":"kroce-cni"});
        let n = parse(&serde_json::to_vec(&c).unwrap(), &CniArgs::default()).unwrap();
        assert_eq!(n.device, DeviceRef::Missing);
    }

    #[test]
    fn mac_precedence() {
        let args = CniArgs::parse("MAC=02:00:00:00:00:02").unwrap();
        let mut c = base();
        c["mac"] = json!("02:00:00:00:00:01");
        let n = parse(&serde_json::to_vec(&c).unwrap(), &args).unwrap();
        assert_eq!(n.mac.unwrap().to_string(), "02:00:00:00:00:02");
        c["runtimeConfig"] = json!({"mac":"02:00:00:00:00:03"});
        let n = parse(&serde_json::to_vec(&c).unwrap(), &args).unwrap();
        assert_eq!(n.mac.unwrap().to_string(), "02:00:00:00:00:03");
        let bad = CniArgs::parse("MAC=ff:ff:ff:ff:ff:ff").unwrap();
        let e = parse(&serde_json::to_vec(&base()).unwrap(), &bad).unwrap_err();
        assert!(e.to_string().contains("CNI_ARGS MAC"), "{e}");
    }

    #[test]
    fn empty_ipam_means_none_and_attachments_parse() {
        let mut c = base();
        c["ipam"] = json!({});
        c["cni.dev/valid-attachments"] = json!([{"containerID":"a","ifname":"net1"}]);
        let n = parse(&serde_json::to_vec(&c).unwrap(), &CniArgs::default()).unwrap();
        assert!(n.ipam.is_none());
        assert_eq!(n.valid_attachments.unwrap()[0].ifname, "net1");
        // A present null is an empty list (libcni >= 1.2 with nothing
        // valid); an absent key is no list.
        c["cni.dev/valid-attachments"] = Value::Null;
        let n = parse(&serde_json::to_vec(&c).unwrap(), &CniArgs::default()).unwrap();
        assert_eq!(n.valid_attachments, Some(vec![]));
        c.as_object_mut()
            .unwrap()
            .remove("cni.dev/valid-attachments");
        let n = parse(&serde_json::to_vec(&c).unwrap(), &CniArgs::default()).unwrap();
        assert_eq!(n.valid_attachments, None);
    }
}
