//! The plugin's config file: a list of pools, each a resource name, a mode,
//! an optional memlock limit and selectors. YAML or JSON.
//!
//! Parsing goes through a generic value first so every error can name the
//! pool (index and resource name) and the field, e.g.
//! `pool 1 (rdma/vf2): selectors.pfNames[0]: invalid VF range "ens1f0#3-1": range "3-1" is backwards`.

use kroce_contracts::ResourceName;
use serde_json::{Map, Value};
use sriov_helpers::{PciAddress, PfSelector};
use std::path::{Path, PathBuf};

/// The RLIMIT_MEMLOCK a pool's containers need, in the one grammar every
/// kroce component reads (`unlimited`, bytes, `64Gi`, `1G`, …). `Display`
/// gives the annotation value: `unlimited` or decimal bytes.
pub use kroce_contracts::Memlock;

/// Upper bound for `sharedCount`: every share is a device ID the kubelet tracks.
pub const MAX_SHARED_COUNT: u32 = 1000;
/// `sharedCount` when a shared pool does not give one.
pub const DEFAULT_SHARED_COUNT: u32 = 10;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub pools: Vec<Pool>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pool {
    pub resource: ResourceName,
    pub mode: Mode,
    pub memlock: Option<Memlock>,
    pub selectors: Selectors,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// One device ID per VF or soft device.
    Exclusive,
    /// `count` device IDs per HCA; every holder gets the HCA's char devices.
    Shared { count: u32 },
}

/// Link layer of a device: from its RDMA port, else from its netdev address length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LinkType {
    Ether,
    Infiniband,
}

impl LinkType {
    pub fn as_str(self) -> &'static str {
        match self {
            LinkType::Ether => "ether",
            LinkType::Infiniband => "infiniband",
        }
    }
}

/// Selector fields; `None` means "any". All given fields must match.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selectors {
    pub vendors: Option<Vec<u16>>,
    pub devices: Option<Vec<u16>>,
    pub drivers: Option<Vec<String>>,
    pub pf_names: Option<Vec<PfSelector>>,
    pub root_devices: Option<Vec<PciAddress>>,
    pub link_types: Option<Vec<LinkType>>,
    pub is_rdma: Option<bool>,
    pub numa_nodes: Option<Vec<u32>>,
    pub if_names: Option<Vec<String>>,
}

impl Selectors {
    fn is_empty(&self) -> bool {
        *self == Selectors::default()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Yaml,
    Json,
}

impl Format {
    /// By extension (`.json`, `.yaml`, `.yml`), else by content: a document
    /// starting with `{` is JSON.
    pub fn detect(path: Option<&Path>, text: &str) -> Format {
        match path
            .and_then(|p| p.extension())
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase)
            .as_deref()
        {
            Some("json") => Format::Json,
            Some("yaml" | "yml") => Format::Yaml,
            _ if text.trim_start().starts_with('{') => Format::Json,
            _ => Format::Yaml,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PluginConfigError {
    #[error("cannot read config {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("config is not valid {format}: {message}")]
    Syntax {
        format: &'static str,
        message: String,
    },
    #[error("config: {field}: {message}")]
    TopLevel { field: String, message: String },
    #[error("pool {index}{}: {field}: {message}", name.as_ref().map(|n| format!(" ({n})")).unwrap_or_default())]
    Pool {
        index: usize,
        name: Option<String>,
        field: String,
        message: String,
    },
}

const POOL_FIELDS: &[&str] = &[
    "resourceName",
    "mode",
    "sharedCount",
    "memlock",
    "selectors",
];
const SELECTOR_FIELDS: &[&str] = &[
    "vendors",
    "devices",
    "drivers",
    "pfNames",
    "rootDevices",
    "linkTypes",
    "isRdma",
    "numaNodes",
    "ifNames",
];

/// Reads and validates a config file; returns its text too (reloads
/// compare it to skip unchanged files).
pub fn load(path: &Path) -> Result<(String, Config), PluginConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| PluginConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let config = parse(&text, Format::detect(Some(path), &text))?;
    Ok((text, config))
}

/// Parses and validates a config document.
pub fn parse(text: &str, format: Format) -> Result<Config, PluginConfigError> {
    let doc: Value = match format {
        Format::Json => serde_json::from_str(text).map_err(|e| PluginConfigError::Syntax {
            format: "JSON",
            message: e.to_string(),
        })?,
        Format::Yaml => serde_saphyr::from_str(text).map_err(|e| PluginConfigError::Syntax {
            format: "YAML",
            message: e.to_string(),
        })?,
    };
    let top = |field: &str, message: String| PluginConfigError::TopLevel {
        field: field.into(),
        message,
    };
    let Value::Object(obj) = doc else {
        return Err(top(
            "(document)",
            format!("expected a mapping with `pools`, got {}", kind(&doc)),
        ));
    };
    if let Some(k) = obj.keys().find(|k| *k != "pools") {
        return Err(top(k, "unknown field (expected only `pools`)".into()));
    }
    let pools = match obj.get("pools") {
        None => return Err(top("pools", "missing".into())),
        Some(Value::Array(a)) => a,
        Some(v) => return Err(top("pools", format!("expected a list, got {}", kind(v)))),
    };
    if pools.is_empty() {
        return Err(top("pools", "no pools defined".into()));
    }
    let mut out: Vec<Pool> = Vec::with_capacity(pools.len());
    for (index, raw) in pools.iter().enumerate() {
        let pool = parse_pool(index, raw)?;
        if let Some(first) = out.iter().position(|p| p.resource == pool.resource) {
            return Err(PluginConfigError::Pool {
                index,
                name: Some(pool.resource.to_string()),
                field: "resourceName".into(),
                message: format!("duplicate of pool {first}"),
            });
        }
        out.push(pool);
    }
    Ok(Config { pools: out })
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

/// Builds errors for one pool; knows its index and (once read) its name.
struct PoolCtx {
    index: usize,
    name: Option<String>,
}

impl PoolCtx {
    fn err(&self, field: impl Into<String>, message: impl Into<String>) -> PluginConfigError {
        PluginConfigError::Pool {
            index: self.index,
            name: self.name.clone(),
            field: field.into(),
            message: message.into(),
        }
    }
}

fn parse_pool(index: usize, raw: &Value) -> Result<Pool, PluginConfigError> {
    let mut ctx = PoolCtx { index, name: None };
    let Value::Object(obj) = raw else {
        return Err(ctx.err("(pool)", format!("expected a mapping, got {}", kind(raw))));
    };
    // Name the pool in every later message, even when the name itself is bad.
    if let Some(Value::String(s)) = obj.get("resourceName") {
        ctx.name = Some(s.clone());
    }
    check_keys(obj, POOL_FIELDS, |k, m| ctx.err(k, m))?;
    let resource = match obj.get("resourceName") {
        None => return Err(ctx.err("resourceName", "missing")),
        Some(Value::String(s)) => {
            ResourceName::parse(s).map_err(|e| ctx.err("resourceName", e.to_string()))?
        }
        Some(v) => {
            return Err(ctx.err(
                "resourceName",
                format!("expected a string, got {}", kind(v)),
            ));
        }
    };
    ctx.name = Some(resource.to_string());
    let shared = match obj.get("mode") {
        None => false,
        Some(Value::String(s)) if s == "exclusive" => false,
        Some(Value::String(s)) if s == "shared" => true,
        Some(v) => {
            return Err(ctx.err(
                "mode",
                format!("expected \"exclusive\" or \"shared\", got {v}"),
            ));
        }
    };
    let mode = match (shared, obj.get("sharedCount")) {
        (false, None) => Mode::Exclusive,
        (false, Some(_)) => {
            return Err(ctx.err("sharedCount", "only valid with mode: shared"));
        }
        (true, None) => Mode::Shared {
            count: DEFAULT_SHARED_COUNT,
        },
        (true, Some(v)) => {
            let count = v
                .as_u64()
                .filter(|n| (1..=u64::from(MAX_SHARED_COUNT)).contains(n))
                .ok_or_else(|| {
                    ctx.err(
                        "sharedCount",
                        format!("expected a whole number from 1 to {MAX_SHARED_COUNT}, got {v}"),
                    )
                })?;
            Mode::Shared {
                count: count as u32,
            }
        }
    };
    let memlock = match obj.get("memlock") {
        None => None,
        Some(v) => Some(Memlock::from_json(v).map_err(|e| ctx.err("memlock", e.to_string()))?),
    };
    let selectors = match obj.get("selectors") {
        None => {
            return Err(ctx.err(
                "selectors",
                "missing (a pool must say which devices it takes)",
            ));
        }
        Some(Value::Object(s)) => parse_selectors(&ctx, s)?,
        Some(v) => {
            return Err(ctx.err("selectors", format!("expected a mapping, got {}", kind(v))));
        }
    };
    if selectors.is_empty() {
        return Err(ctx.err(
            "selectors",
            "empty: give at least one selector (a pool must not take every device)",
        ));
    }
    Ok(Pool {
        resource,
        mode,
        memlock,
        selectors,
    })
}

fn check_keys(
    obj: &Map<String, Value>,
    allowed: &[&str],
    err: impl Fn(String, String) -> PluginConfigError,
) -> Result<(), PluginConfigError> {
    match obj.keys().find(|k| !allowed.contains(&k.as_str())) {
        Some(k) => Err(err(
            k.clone(),
            format!("unknown field (expected one of: {})", allowed.join(", ")),
        )),
        None => Ok(()),
    }
}

fn parse_selectors(ctx: &PoolCtx, s: &Map<String, Value>) -> Result<Selectors, PluginConfigError> {
    check_keys(s, SELECTOR_FIELDS, |k, m| {
        ctx.err(format!("selectors.{k}"), m)
    })?;
    let hex_ids = |field: &str| -> Result<Option<Vec<u16>>, PluginConfigError> {
        list(ctx, s, field, |v| {
            let Value::String(t) = v else {
                return Err(ItemError::HexNotQuoted(v.clone()));
            };
            let digits = t.strip_prefix("0x").unwrap_or(t);
            if digits.len() != 4 {
                return Err(ItemError::HexId(t.clone()));
            }
            u16::from_str_radix(digits, 16).map_err(|_| ItemError::HexId(t.clone()))
        })
    };
    let vendors = hex_ids("vendors")?;
    let devices = hex_ids("devices")?;
    let drivers = list(ctx, s, "drivers", |v| name_str(v, 64, "a driver name"))?;
    let pf_names = list(ctx, s, "pfNames", |v| match v {
        Value::String(t) => Ok(t.parse::<PfSelector>()?),
        _ => Err(ItemError::PfNameNotString(v.clone())),
    })?;
    let root_devices = list(ctx, s, "rootDevices", |v| match v {
        Value::String(t) => Ok(t.parse::<PciAddress>()?),
        _ => Err(ItemError::PciNotString(v.clone())),
    })?;
    let link_types = list(ctx, s, "linkTypes", |v| match v.as_str() {
        Some("ether" | "ethernet") => Ok(LinkType::Ether),
        Some("infiniband") => Ok(LinkType::Infiniband),
        _ => Err(ItemError::LinkType(v.clone())),
    })?;
    let is_rdma = match s.get("isRdma") {
        None => None,
        Some(Value::Bool(b)) => Some(*b),
        Some(v) => {
            return Err(ctx.err(
                "selectors.isRdma",
                format!("expected true or false, got {v}"),
            ));
        }
    };
    let numa_nodes = list(ctx, s, "numaNodes", |v| {
        v.as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| ItemError::NumaNode(v.clone()))
    })?;
    let if_names = list(ctx, s, "ifNames", |v| name_str(v, 15, "an interface name"))?;
    Ok(Selectors {
        vendors,
        devices,
        drivers,
        pf_names,
        root_devices,
        link_types,
        is_rdma,
        numa_nodes,
        if_names,
    })
}

fn name_str(v: &Value, max: usize, what: &'static str) -> Result<String, ItemError> {
    match v {
        Value::String(t)
            if !t.is_empty()
                && t.len() <= max
                && !t.contains('/')
                && !t.chars().any(char::is_whitespace) =>
        {
            Ok(t.clone())
        }
        _ => Err(ItemError::Name {
            what,
            max,
            got: v.clone(),
        }),
    }
}

/// Why one item of a selector list is refused ([`list`] names the item).
#[derive(Debug, thiserror::Error)]
enum ItemError {
    #[error(
        "expected a quoted hex id like \"15b3\", got {0} (quote it: YAML reads 1017 as a number)"
    )]
    HexNotQuoted(Value),
    #[error("{0:?} is not a 4-digit hex id")]
    HexId(String),
    #[error("expected {what} (1-{max} characters, no '/' or spaces), got {got}")]
    Name {
        what: &'static str,
        max: usize,
        got: Value,
    },
    #[error("expected a string like \"ens1f0#0-3\", got {0}")]
    PfNameNotString(Value),
    #[error("expected a PCI address string, got {0}")]
    PciNotString(Value),
    /// A pfNames or rootDevices string that does not parse.
    #[error(transparent)]
    Parse(#[from] sriov_helpers::ParseError),
    #[error("expected \"ether\" or \"infiniband\", got {0}")]
    LinkType(Value),
    #[error("expected a NUMA node number, got {0}")]
    NumaNode(Value),
}

/// A selector list: absent is `None`; present must be a non-empty list whose
/// every item parses.
fn list<T>(
    ctx: &PoolCtx,
    s: &Map<String, Value>,
    field: &str,
    item: impl Fn(&Value) -> Result<T, ItemError>,
) -> Result<Option<Vec<T>>, PluginConfigError> {
    let path = format!("selectors.{field}");
    match s.get(field) {
        None => Ok(None),
        Some(Value::Array(a)) if a.is_empty() => Err(ctx.err(
            path,
            "empty list matches nothing; leave the field out to match any",
        )),
        Some(Value::Array(a)) => {
            let mut out = Vec::with_capacity(a.len());
            for (i, v) in a.iter().enumerate() {
                out.push(item(v).map_err(|e| ctx.err(format!("{path}[{i}]"), e.to_string()))?);
            }
            Ok(Some(out))
        }
        Some(v) => Err(ctx.err(path, format!("expected a list, got {}", kind(v)))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FULL: &str = r#"
pools:
- resourceName: vf
  mode: exclusive
  memlock: unlimited
  selectors:
    vendors: ["15b3"]
    devices: ["0x101E"]
    drivers: [mlx5_core]
    pfNames: ["ens1f0#0-3,6"]
    rootDevices: ["0000:3b:00.0"]
    linkTypes: [ether]
    isRdma: true
    numaNodes: [0]
- resourceName: example.com/hca
  mode: shared
  sharedCount: 4
  memlock: 64Gi
  selectors:
    ifNames: [eth0]
"#;

    #[test]
    fn parses_every_field() {
        let c = parse(FULL, Format::Yaml).unwrap();
        assert_eq!(c.pools.len(), 2);
        let p = &c.pools[0];
        assert_eq!(p.resource.as_str(), "rdma/vf");
        assert_eq!(p.mode, Mode::Exclusive);
        assert_eq!(p.memlock, Some(Memlock::Unlimited));
        let s = &p.selectors;
        assert_eq!(s.vendors, Some(vec![0x15b3]));
        assert_eq!(s.devices, Some(vec![0x101e]));
        assert_eq!(s.drivers, Some(vec!["mlx5_core".to_string()]));
        assert_eq!(s.pf_names.as_ref().unwrap()[0].to_string(), "ens1f0#0-3,6");
        assert_eq!(s.root_devices, Some(vec![PciAddress::new(0, 0x3b, 0, 0)]));
        assert_eq!(s.link_types, Some(vec![LinkType::Ether]));
        assert_eq!(s.is_rdma, Some(true));
        assert_eq!(s.numa_nodes, Some(vec![0]));
        let q = &c.pools[1];
        assert_eq!(q.mode, Mode::Shared { count: 4 });
        assert_eq!(q.memlock, Some(Memlock::Bytes(64 << 30)));
        assert_eq!(q.memlock.unwrap().to_string(), (64u64 << 30).to_string());
        assert_eq!(q.selectors.if_names, Some(vec!["eth0".to_string()]));
    }

    #[test]
    fn json_and_yaml_give_the_same_config() {
        let json = r#"{"pools":[{"resourceName":"rdma/vf","memlock":1048576,
            "selectors":{"vendors":["15b3"],"isRdma":true}}]}"#;
        let yaml = "pools:\n- resourceName: rdma/vf\n  memlock: 1048576\n  selectors: {vendors: [\"15b3\"], isRdma: true}\n";
        let j = parse(json, Format::detect(None, json)).unwrap();
        let y = parse(yaml, Format::detect(None, yaml)).unwrap();
        assert_eq!(j, y);
        assert_eq!(j.pools[0].memlock, Some(Memlock::Bytes(1 << 20)));
        assert_eq!(
            Format::detect(Some(Path::new("/x/c.json")), "pools: []"),
            Format::Json
        );
        assert_eq!(
            Format::detect(Some(Path::new("/x/c.yml")), "{}"),
            Format::Yaml
        );
    }

    #[test]
    fn shared_count_defaults_and_bounds() {
        let c = parse(
            "pools:\n- resourceName: hca\n  mode: shared\n  selectors: {isRdma: true}\n",
            Format::Yaml,
        )
        .unwrap();
        assert_eq!(
            c.pools[0].mode,
            Mode::Shared {
                count: DEFAULT_SHARED_COUNT
            }
        );
    }

    /// Each bad document must be rejected with a message naming the pool
    /// and the field (and the value where there is one).
    #[test]
    fn bad_configs_name_pool_and_field() {
        let good = "- resourceName: ok\n  selectors: {isRdma: true}\n";
        let cases: &[(&str, &[&str])] = &[
            ("pools: []", &["pools", "no pools"]),
            ("pool: []", &["pool", "unknown field"]),
            ("- 1", &["expected a mapping"]),
            (
                "pools:\n- resourceName: vf\n  selector: {isRdma: true}\n",
                &["pool 0 (vf)", "selector:", "unknown field"],
            ),
            (
                "pools:\n- resourceName: vf\n  selectors: {}\n",
                &["pool 0 (rdma/vf)", "selectors", "empty"],
            ),
            (
                "pools:\n- resourceName: vf\n",
                &["pool 0 (rdma/vf)", "selectors", "missing"],
            ),
            (
                "pools:\n- resourceName: vf\n  selectors: {vendor: [\"15b3\"]}\n",
                &["pool 0 (rdma/vf)", "selectors.vendor", "unknown field"],
            ),
            (
                "pools:\n- resourceName: vf\n  selectors: {pfNames: [\"ens1f0#3-1\"]}\n",
                &[
                    "pool 0 (rdma/vf)",
                    "selectors.pfNames[0]",
                    "ens1f0#3-1",
                    "backwards",
                ],
            ),
            (
                "pools:\n- resourceName: vf\n  selectors: {pfNames: [\"ens1f0#\"]}\n",
                &["selectors.pfNames[0]", "empty range"],
            ),
            (
                "pools:\n- resourceName: vf\n  selectors: {devices: [1017]}\n",
                &["selectors.devices[0]", "1017", "quote"],
            ),
            (
                "pools:\n- resourceName: vf\n  selectors: {vendors: [\"15b\"]}\n",
                &["selectors.vendors[0]", "\"15b\"", "4-digit"],
            ),
            (
                "pools:\n- resourceName: vf\n  selectors: {rootDevices: [\"0000:3b:00\"]}\n",
                &["selectors.rootDevices[0]", "0000:3b:00"],
            ),
            (
                "pools:\n- resourceName: vf\n  selectors: {linkTypes: [eth]}\n",
                &["selectors.linkTypes[0]", "\"eth\""],
            ),
            (
                "pools:\n- resourceName: vf\n  selectors: {numaNodes: []}\n",
                &["selectors.numaNodes", "empty list"],
            ),
            (
                "pools:\n- resourceName: vf\n  selectors: {isRdma: yes please}\n",
                &["selectors.isRdma", "yes please"],
            ),
            (
                "pools:\n- resourceName: vf\n  selectors: {ifNames: [\"a/b\"]}\n",
                &["selectors.ifNames[0]", "a/b"],
            ),
            (
                "pools:\n- resourceName: vf\n  mode: sharded\n  selectors: {isRdma: true}\n",
                &["pool 0 (rdma/vf)", "mode", "sharded"],
            ),
            (
                "pools:\n- resourceName: vf\n  sharedCount: 3\n  selectors: {isRdma: true}\n",
                &["pool 0 (rdma/vf)", "sharedCount", "mode: shared"],
            ),
            (
                "pools:\n- resourceName: vf\n  mode: shared\n  sharedCount: 0\n  selectors: {isRdma: true}\n",
                &["sharedCount", "got 0"],
            ),
            (
                "pools:\n- resourceName: vf\n  memlock: lots\n  selectors: {isRdma: true}\n",
                &["pool 0 (rdma/vf)", "memlock", "lots"],
            ),
            (
                "pools:\n- resourceName: vf\n  memlock: 0\n  selectors: {isRdma: true}\n",
                &["memlock", "\"0\" is zero"],
            ),
            // Kubernetes quantity spellings only: `64g` passed the old CRD
            // pattern and then stopped the plugin here; now nothing takes it.
            (
                "pools:\n- resourceName: vf\n  memlock: 64g\n  selectors: {isRdma: true}\n",
                &["pool 0 (rdma/vf)", "memlock", "\"64g\"", "unknown unit"],
            ),
            (
                "pools:\n- resourceName: Bad/Name\n  selectors: {isRdma: true}\n",
                &["pool 0 (Bad/Name)", "resourceName", "Bad/Name"],
            ),
            (
                "pools:\n- selectors: {isRdma: true}\n",
                &["pool 0:", "resourceName", "missing"],
            ),
            (
                "pools:\n- resourceName: vf\n  selectors: {isRdma: true}\n- resourceName: rdma/vf\n  selectors: {isRdma: false}\n",
                &["pool 1 (rdma/vf)", "resourceName", "duplicate of pool 0"],
            ),
            ("pools: [", &["not valid YAML"]),
        ];
        for (doc, wants) in cases {
            // The second pool proves the index is right, not always 0.
            let err = parse(doc, Format::Yaml).unwrap_err().to_string();
            for w in *wants {
                assert!(err.contains(w), "{doc:?}\n  error: {err}\n  missing: {w:?}");
            }
            if doc.starts_with("pools:\n- resourceName: vf\n  selectors: {")
                && !wants.iter().any(|w| w.contains("duplicate"))
            {
                let shifted = doc.replacen("pools:\n", &format!("pools:\n{good}"), 1);
                let err = parse(&shifted, Format::Yaml).unwrap_err().to_string();
                assert!(err.contains("pool 1 (rdma/vf)"), "{shifted}: {err}");
            }
        }
        let err = parse("{\"pools\": [{\"resourceName\": 3}]}", Format::Json)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("pool 0: resourceName: expected a string"),
            "{err}"
        );
        let err = parse("{\"pools\": ", Format::Json).unwrap_err().to_string();
        assert!(err.contains("not valid JSON"), "{err}");
    }
}
