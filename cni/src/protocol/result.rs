//! The CNI result: one canonical form (a superset of 1.1.0), parsed from any
//! supported layout (IPAM delegates, `prevResult`) and rendered in the
//! version the configuration asked for.

use super::version::CniVersion;
use crate::addr::IpNet;
use kroce_contracts::ip_net::IpNetError;
use serde_json::{Map, Value, json};
use std::net::IpAddr;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CniResult {
    pub interfaces: Vec<Interface>,
    pub ips: Vec<IpConfig>,
    pub routes: Vec<Route>,
    pub dns: Dns,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Interface {
    pub name: String,
    pub mac: Option<String>,
    /// 1.1.0 only.
    pub mtu: Option<u32>,
    pub sandbox: Option<String>,
    /// 1.1.0 only.
    pub socket_path: Option<String>,
    /// 1.1.0 only.
    pub pci_id: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpConfig {
    pub address: IpNet,
    pub gateway: Option<IpAddr>,
    /// Index into `interfaces`.
    pub interface: Option<usize>,
}

/// A result's route: the rtnetlink route kroce-netlink adds (CNI 1.1.0
/// carries the same fields).
pub use kroce_netlink::route::Route;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Dns {
    pub nameservers: Vec<String>,
    pub domain: Option<String>,
    pub search: Vec<String>,
    pub options: Vec<String>,
}

impl Dns {
    pub fn is_empty(&self) -> bool {
        self.nameservers.is_empty()
            && self.domain.is_none()
            && self.search.is_empty()
            && self.options.is_empty()
    }

    pub fn parse(v: &Value, field: &str) -> Result<Dns, CniResultError> {
        let obj = v
            .as_object()
            .ok_or_else(|| CniResultError::NotObject(field.into()))?;
        Ok(Dns {
            nameservers: string_list(obj, "nameservers", field)?,
            domain: opt_string(obj, "domain", field)?,
            search: string_list(obj, "search", field)?,
            options: string_list(obj, "options", field)?,
        })
    }

    fn render(&self) -> Value {
        let mut m = Map::new();
        if !self.nameservers.is_empty() {
            m.insert("nameservers".into(), json!(self.nameservers));
        }
        if let Some(d) = &self.domain {
            m.insert("domain".into(), json!(d));
        }
        if !self.search.is_empty() {
            m.insert("search".into(), json!(self.search));
        }
        if !self.options.is_empty() {
            m.insert("options".into(), json!(self.options));
        }
        Value::Object(m)
    }
}

/// What is wrong with a CNI result (an IPAM delegate's or `prevResult`):
/// the field, and the value when there is one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CniResultError {
    #[error("result must be a JSON object")]
    NotJsonObject,
    #[error("{0} must be an object")]
    NotObject(String),
    #[error("{0} must be a list")]
    NotList(&'static str),
    #[error("{ctx}.{key} is missing")]
    Missing { ctx: String, key: &'static str },
    #[error("{ctx}.{key} must be a string, got {got}")]
    NotString {
        ctx: String,
        key: &'static str,
        got: Value,
    },
    #[error("{ctx}.{key} must be a 32-bit unsigned integer, got {got}")]
    NotU32 {
        ctx: String,
        key: &'static str,
        got: Value,
    },
    #[error("{ctx}.{key} must hold strings, got {got}")]
    NotStringItem {
        ctx: String,
        key: &'static str,
        got: Value,
    },
    #[error("{ctx}.{key} must be a list of strings, got {got}")]
    NotStringList {
        ctx: String,
        key: &'static str,
        got: Value,
    },
    #[error("{ctx}.{key} {value:?} is not an IP address")]
    NotIp {
        ctx: String,
        key: &'static str,
        value: String,
    },
    #[error("{ctx}.{key} {value:?} is not ADDRESS/PREFIX: {reason}")]
    NotNet {
        ctx: String,
        key: &'static str,
        value: String,
        reason: IpNetError,
    },
    #[error("{ctx}.interface must be an index, got {got}")]
    NotIndex { ctx: String, got: Value },
    #[error("{ctx}.interface {index} points past the {count} interfaces")]
    PastInterfaces {
        ctx: String,
        index: usize,
        count: usize,
    },
    #[error("{ctx}.scope {scope} is above 255")]
    Scope { ctx: String, scope: u32 },
}

type R<T> = Result<T, CniResultError>;

fn opt_string(obj: &Map<String, Value>, key: &'static str, ctx: &str) -> R<Option<String>> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(CniResultError::NotString {
            ctx: ctx.into(),
            key,
            got: other.clone(),
        }),
    }
}

fn opt_u32(obj: &Map<String, Value>, key: &'static str, ctx: &str) -> R<Option<u32>> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| CniResultError::NotU32 {
                ctx: ctx.into(),
                key,
                got: v.clone(),
            }),
    }
}

fn string_list(obj: &Map<String, Value>, key: &'static str, ctx: &str) -> R<Vec<String>> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| {
                x.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| CniResultError::NotStringItem {
                        ctx: ctx.into(),
                        key,
                        got: x.clone(),
                    })
            })
            .collect(),
        Some(other) => Err(CniResultError::NotStringList {
            ctx: ctx.into(),
            key,
            got: other.clone(),
        }),
    }
}

fn opt_ip(obj: &Map<String, Value>, key: &'static str, ctx: &str) -> R<Option<IpAddr>> {
    match opt_string(obj, key, ctx)? {
        None => Ok(None),
        Some(s) if s.is_empty() => Ok(None),
        Some(s) => s.parse().map(Some).map_err(|_| CniResultError::NotIp {
            ctx: ctx.into(),
            key,
            value: s,
        }),
    }
}

fn req_net(obj: &Map<String, Value>, key: &'static str, ctx: &str) -> R<IpNet> {
    let s = opt_string(obj, key, ctx)?.ok_or_else(|| CniResultError::Missing {
        ctx: ctx.into(),
        key,
    })?;
    s.parse().map_err(|reason| CniResultError::NotNet {
        ctx: ctx.into(),
        key,
        value: s,
        reason,
    })
}

impl CniResult {
    /// Parses a result in the 0.3.x/0.4.0/1.x layouts (`ips[].version` of
    /// 0.x is accepted and ignored; the address says the family).
    pub fn parse(v: &Value) -> Result<CniResult, CniResultError> {
        let obj = v.as_object().ok_or(CniResultError::NotJsonObject)?;
        let mut out = CniResult::default();
        if let Some(ifs) = obj.get("interfaces").filter(|x| !x.is_null()) {
            let ifs = ifs
                .as_array()
                .ok_or(CniResultError::NotList("interfaces"))?;
            for (i, item) in ifs.iter().enumerate() {
                let ctx = format!("interfaces[{i}]");
                let o = item
                    .as_object()
                    .ok_or_else(|| CniResultError::NotObject(ctx.clone()))?;
                out.interfaces.push(Interface {
                    name: opt_string(o, "name", &ctx)?.ok_or_else(|| CniResultError::Missing {
                        ctx: ctx.clone(),
                        key: "name",
                    })?,
                    mac: opt_string(o, "mac", &ctx)?,
                    mtu: opt_u32(o, "mtu", &ctx)?,
                    sandbox: opt_string(o, "sandbox", &ctx)?,
                    socket_path: opt_string(o, "socketPath", &ctx)?,
                    pci_id: opt_string(o, "pciID", &ctx)?,
                });
            }
        }
        if let Some(ips) = obj.get("ips").filter(|x| !x.is_null()) {
            let ips = ips.as_array().ok_or(CniResultError::NotList("ips"))?;
            for (i, item) in ips.iter().enumerate() {
                let ctx = format!("ips[{i}]");
                let o = item
                    .as_object()
                    .ok_or_else(|| CniResultError::NotObject(ctx.clone()))?;
                let interface = match o.get("interface") {
                    None | Some(Value::Null) => None,
                    Some(x) => Some(
                        x.as_u64()
                            .and_then(|n| usize::try_from(n).ok())
                            .ok_or_else(|| CniResultError::NotIndex {
                                ctx: ctx.clone(),
                                got: x.clone(),
                            })?,
                    ),
                };
                if let Some(idx) = interface
                    && idx >= out.interfaces.len()
                {
                    return Err(CniResultError::PastInterfaces {
                        ctx,
                        index: idx,
                        count: out.interfaces.len(),
                    });
                }
                out.ips.push(IpConfig {
                    address: req_net(o, "address", &ctx)?,
                    gateway: opt_ip(o, "gateway", &ctx)?,
                    interface,
                });
            }
        }
        if let Some(routes) = obj.get("routes").filter(|x| !x.is_null()) {
            let routes = routes.as_array().ok_or(CniResultError::NotList("routes"))?;
            for (i, item) in routes.iter().enumerate() {
                let ctx = format!("routes[{i}]");
                let o = item
                    .as_object()
                    .ok_or_else(|| CniResultError::NotObject(ctx.clone()))?;
                let scope = match opt_u32(o, "scope", &ctx)? {
                    None => None,
                    Some(s) => Some(u8::try_from(s).map_err(|_| CniResultError::Scope {
                        ctx: ctx.clone(),
                        scope: s,
                    })?),
                };
                out.routes.push(Route {
                    dst: req_net(o, "dst", &ctx)?,
                    gw: opt_ip(o, "gw", &ctx)?,
                    mtu: opt_u32(o, "mtu", &ctx)?,
                    advmss: opt_u32(o, "advmss", &ctx)?,
                    priority: opt_u32(o, "priority", &ctx)?,
                    table: opt_u32(o, "table", &ctx)?,
                    scope,
                });
            }
        }
        if let Some(dns) = obj.get("dns").filter(|x| !x.is_null()) {
            out.dns = Dns::parse(dns, "dns")?;
        }
        Ok(out)
    }

    /// The result in the layout of `version`, fields the version does not
    /// know left out.
    pub fn render(&self, version: CniVersion) -> Value {
        let v11 = version >= CniVersion::V1_1_0;
        let interfaces: Vec<Value> = self
            .interfaces
            .iter()
            .map(|i| {
                let mut m = Map::new();
                m.insert("name".into(), json!(i.name));
                if let Some(mac) = &i.mac {
                    m.insert("mac".into(), json!(mac));
                }
                if v11 && let Some(mtu) = i.mtu {
                    m.insert("mtu".into(), json!(mtu));
                }
                if let Some(s) = &i.sandbox {
                    m.insert("sandbox".into(), json!(s));
                }
                if v11 && let Some(s) = &i.socket_path {
                    m.insert("socketPath".into(), json!(s));
                }
                if v11 && let Some(p) = &i.pci_id {
                    m.insert("pciID".into(), json!(p));
                }
                Value::Object(m)
            })
            .collect();
        let ips: Vec<Value> = self
            .ips
            .iter()
            .map(|ip| {
                let mut m = Map::new();
                if version == CniVersion::V0_4_0 {
                    m.insert(
                        "version".into(),
                        json!(if ip.address.is_ipv4() { "4" } else { "6" }),
                    );
                }
                m.insert("address".into(), json!(ip.address.to_string()));
                if let Some(gw) = ip.gateway {
                    m.insert("gateway".into(), json!(gw.to_string()));
                }
                if let Some(i) = ip.interface {
                    m.insert("interface".into(), json!(i));
                }
                Value::Object(m)
            })
            .collect();
        let routes: Vec<Value> = self
            .routes
            .iter()
            .map(|r| {
                let mut m = Map::new();
                m.insert("dst".into(), json!(r.dst.to_string()));
                if let Some(gw) = r.gw {
                    m.insert("gw".into(), json!(gw.to_string()));
                }
                if v11 {
                    for (k, v) in [
                        ("mtu", r.mtu),
                        ("advmss", r.advmss),
                        ("priority", r.priority),
                        ("table", r.table),
                        ("scope", r.scope.map(u32::from)),
                    ] {
                        if let Some(v) = v {
                            m.insert(k.into(), json!(v));
                        }
                    }
                }
                Value::Object(m)
            })
            .collect();
        let mut out = Map::new();
        out.insert("cniVersion".into(), json!(version.as_str()));
        if !interfaces.is_empty() {
            out.insert("interfaces".into(), Value::Array(interfaces));
        }
        if !ips.is_empty() {
            out.insert("ips".into(), Value::Array(ips));
        }
        if !routes.is_empty() {
            out.insert("routes".into(), Value::Array(routes));
        }
        out.insert("dns".into(), self.dns.render());
        Value::Object(out)
    }

    /// Appends `other` (our own part of a chained result) after `self`,
    /// shifting its interface indexes.
    pub fn chain(mut self, other: CniResult) -> CniResult {
        let offset = self.interfaces.len();
        self.interfaces.extend(other.interfaces);
        self.ips.extend(other.ips.into_iter().map(|mut ip| {
            ip.interface = ip.interface.map(|i| i + offset);
            ip
        }));
        self.routes.extend(other.routes);
        if !other.dns.is_empty() {
            self.dns = other.dns;
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> CniResult {
        CniResult {
            interfaces: vec![Interface {
                name: "net1".into(),
                mac: Some("02:00:00:00:00:01".into()),
                mtu: Some(9000),
                sandbox: Some("/run/netns/p".into()),
                socket_path: None,
                pci_id: Some("0000:3b:00.2".into()),
            }],
            ips: vec![IpConfig {
                address: "10.56.0.2/24".parse().unwrap(),
                gateway: Some("10.56.0.1".parse().unwrap()),
                interface: Some(0),
            }],
            routes: vec![Route {
                priority: Some(100),
                ..Route::new(
                    "10.57.0.0/16".parse().unwrap(),
                    Some("10.56.0.1".parse().unwrap()),
                )
            }],
            dns: Dns {
                nameservers: vec!["10.56.0.1".into()],
                ..Dns::default()
            },
        }
    }

    #[test]
    fn render_per_version() {
        let r = sample();
        let v11 = r.render(CniVersion::V1_1_0);
        assert_eq!(v11["interfaces"][0]["mtu"], 9000);
        assert_eq!(v11["interfaces"][0]["pciID"], "0000:3b:00.2");
        assert_eq!(v11["routes"][0]["priority"], 100);
        assert!(v11["ips"][0].get("version").is_none());
        let v10 = r.render(CniVersion::V1_0_0);
        assert_eq!(v10["cniVersion"], "1.0.0");
        assert!(v10["interfaces"][0].get("mtu").is_none());
        assert!(v10["interfaces"][0].get("pciID").is_none());
        assert!(v10["routes"][0].get("priority").is_none());
        let v04 = r.render(CniVersion::V0_4_0);
        assert_eq!(v04["ips"][0]["version"], "4");
        assert_eq!(v04["ips"][0]["interface"], 0);
    }

    #[test]
    fn parse_round_trips_and_accepts_old_layouts() {
        let r = sample();
        let back = CniResult::parse(&r.render(CniVersion::V1_1_0)).unwrap();
        assert_eq!(back, r);
        let old = json!({"cniVersion":"0.4.0","ips":[{"version":"4","address":"10.1.0.5/16","gateway":"10.1.0.1"}],"dns":{}});
        let p = CniResult::parse(&old).unwrap();
        assert_eq!(p.ips[0].address.to_string(), "10.1.0.5/16");
        assert_eq!(p.ips[0].interface, None);
    }

    #[test]
    fn parse_errors_name_the_field() {
        let e = CniResult::parse(&json!({"ips":[{"address":"10.0.0.1"}]}))
            .unwrap_err()
            .to_string();
        assert!(e.contains("ips[0].address"), "{e}");
        let e = CniResult::parse(&json!({"ips":[{"address":"10.0.0.1/24","interface":3}]}))
            .unwrap_err()
            .to_string();
        assert!(e.contains("interface 3"), "{e}");
        let e = CniResult::parse(&json!({"routes":[{"dst":"0.0.0.0/0","gw":"nope"}]}))
            .unwrap_err()
            .to_string();
        assert!(e.contains("routes[0].gw"), "{e}");
    }

    #[test]
    fn chain_shifts_indexes() {
        let prev = sample();
        let mine = sample();
        let c = prev.chain(mine);
        assert_eq!(c.interfaces.len(), 2);
        assert_eq!(c.ips[1].interface, Some(1));
    }
}
