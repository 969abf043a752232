//! rtnetlink (NETLINK_ROUTE) messages: links, alternative names, addresses,
//! routes and PF-side VF attributes. Builders return a [`MsgBuilder`];
//! parsers take a reply payload. Constants from `linux/rtnetlink.h`,
//! `linux/if_link.h`, `linux/if_addr.h`.

use crate::vf_attrs::{LinkState, VfSetting, VfState, VlanProto};
use crate::{
    DecodeError, MsgBuilder, NLA_F_NESTED, NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL,
    NLM_F_REQUEST, attrs, read_str, read_u32,
};
use kroce_contracts::ip_net::IpNet;
use kroce_contracts::mac::Mac;
use std::net::IpAddr;

pub const RTM_NEWLINK: u16 = 16;
pub const RTM_DELLINK: u16 = 17;
pub const RTM_GETLINK: u16 = 18;
pub const RTM_SETLINK: u16 = 19;
pub const RTM_NEWADDR: u16 = 20;
pub const RTM_DELADDR: u16 = 21;
pub const RTM_GETADDR: u16 = 22;
pub const RTM_NEWROUTE: u16 = 24;
pub const RTM_NEWLINKPROP: u16 = 108;
pub const RTM_DELLINKPROP: u16 = 109;

pub const IFLA_ADDRESS: u16 = 1;
pub const IFLA_IFNAME: u16 = 3;
pub const IFLA_MTU: u16 = 4;
pub const IFLA_VFINFO_LIST: u16 = 22;
pub const IFLA_NET_NS_FD: u16 = 28;
pub const IFLA_EXT_MASK: u16 = 29;
pub const IFLA_NEW_IFINDEX: u16 = 49;
pub const IFLA_PROP_LIST: u16 = 52;
pub const IFLA_ALT_IFNAME: u16 = 53;
pub const IFLA_PARENT_DEV_NAME: u16 = 56;
pub const IFLA_PARENT_DEV_BUS_NAME: u16 = 57;

pub const IFLA_VF_INFO: u16 = 1;
pub const IFLA_VF_MAC: u16 = 1;
pub const IFLA_VF_VLAN: u16 = 2;
pub const IFLA_VF_TX_RATE: u16 = 3;
pub const IFLA_VF_SPOOFCHK: u16 = 4;
pub const IFLA_VF_LINK_STATE: u16 = 5;
pub const IFLA_VF_RATE: u16 = 6;
pub const IFLA_VF_TRUST: u16 = 9;
pub const IFLA_VF_VLAN_LIST: u16 = 12;
pub const IFLA_VF_VLAN_INFO: u16 = 1;

pub const RTEXT_FILTER_VF: u32 = 1;
pub const RTEXT_FILTER_SKIP_STATS: u32 = 8;

pub const IFF_UP: u32 = 1;
pub const AF_UNSPEC: u8 = 0;
pub const AF_INET: u8 = 2;
pub const AF_INET6: u8 = 10;

pub const IFA_ADDRESS: u16 = 1;
pub const IFA_LOCAL: u16 = 2;
pub const IFA_BROADCAST: u16 = 4;
pub const IFA_F_NODAD: u8 = 0x02;

pub const RTA_DST: u16 = 1;
pub const RTA_OIF: u16 = 4;
pub const RTA_GATEWAY: u16 = 5;
pub const RTA_PRIORITY: u16 = 6;
pub const RTA_METRICS: u16 = 8;
pub const RTA_TABLE: u16 = 15;
pub const RTAX_MTU: u16 = 2;
pub const RTAX_ADVMSS: u16 = 8;
pub const RT_TABLE_MAIN: u8 = 254;
pub const RTPROT_BOOT: u8 = 3;
pub const RT_SCOPE_UNIVERSE: u8 = 0;
pub const RT_SCOPE_LINK: u8 = 253;
pub const RTN_UNICAST: u8 = 1;

/// Multicast groups (`enum rtnetlink_groups`): what a listener subscribes to
/// with [`crate::NlSocket::subscribe`].
pub const RTNLGRP_LINK: u32 = 1;
pub const RTNLGRP_IPV4_IFADDR: u32 = 5;
pub const RTNLGRP_IPV6_IFADDR: u32 = 9;

/// A route as `RTM_NEWROUTE` adds it (and as a CNI 1.1.0 result carries it:
/// kroce-cni's result uses this type).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub dst: IpNet,
    pub gw: Option<IpAddr>,
    /// The fields below are CNI 1.1.0 only.
    pub mtu: Option<u32>,
    pub advmss: Option<u32>,
    pub priority: Option<u32>,
    pub table: Option<u32>,
    pub scope: Option<u8>,
}

impl Route {
    pub fn new(dst: IpNet, gw: Option<IpAddr>) -> Route {
        Route {
            dst,
            gw,
            mtu: None,
            advmss: None,
            priority: None,
            table: None,
            scope: None,
        }
    }
}

/// `struct ifinfomsg`.
pub fn ifinfomsg(index: u32, flags: u32, change: u32) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[4..8].copy_from_slice(&index.to_ne_bytes());
    b[8..12].copy_from_slice(&flags.to_ne_bytes());
    b[12..16].copy_from_slice(&change.to_ne_bytes());
    b
}

fn set_link(index: u32, flags: u32, change: u32) -> MsgBuilder {
    MsgBuilder::new(RTM_SETLINK, NLM_F_REQUEST | NLM_F_ACK)
        .family_header(&ifinfomsg(index, flags, change))
}

pub fn get_link_by_name(name: &str) -> MsgBuilder {
    let mut b =
        MsgBuilder::new(RTM_GETLINK, NLM_F_REQUEST | NLM_F_ACK).family_header(&ifinfomsg(0, 0, 0));
    b.attr_str(IFLA_IFNAME, name);
    b
}

/// Every link of the netns (`ip link show`).
pub fn dump_links() -> MsgBuilder {
    MsgBuilder::new(RTM_GETLINK, NLM_F_REQUEST | NLM_F_DUMP).family_header(&ifinfomsg(0, 0, 0))
}

pub fn get_link_by_index(index: u32) -> MsgBuilder {
    MsgBuilder::new(RTM_GETLINK, NLM_F_REQUEST | NLM_F_ACK).family_header(&ifinfomsg(index, 0, 0))
}

/// A PF with its VF table (`IFLA_VFINFO_LIST`), statistics skipped.
pub fn get_link_vfs(pf: &str) -> MsgBuilder {
    let mut b = get_link_by_name(pf);
    b.attr_u32(IFLA_EXT_MASK, RTEXT_FILTER_VF | RTEXT_FILTER_SKIP_STATS);
    b
}

pub fn set_up(index: u32, up: bool) -> MsgBuilder {
    set_link(index, if up { IFF_UP } else { 0 }, IFF_UP)
}

pub fn set_mac(index: u32, mac: &Mac) -> MsgBuilder {
    let mut b = set_link(index, 0, 0);
    b.attr(IFLA_ADDRESS, &mac.0);
    b
}

pub fn set_mtu(index: u32, mtu: u32) -> MsgBuilder {
    let mut b = set_link(index, 0, 0);
    b.attr_u32(IFLA_MTU, mtu);
    b
}

pub fn rename(index: u32, name: &str) -> MsgBuilder {
    let mut b = set_link(index, 0, 0);
    b.attr_str(IFLA_IFNAME, name);
    b
}

/// Moves a link into the netns behind `netns_fd`, renaming it on the way
/// (one request: the name never collides in the target), optionally asking
/// for an ifindex there (`IFLA_NEW_IFINDEX`, to give a VF back its own).
pub fn move_to_netns(
    index: u32,
    netns_fd: u32,
    new_name: &str,
    new_ifindex: Option<u32>,
) -> MsgBuilder {
    let mut b = set_link(index, 0, 0);
    b.attr_u32(IFLA_NET_NS_FD, netns_fd);
    b.attr_str(IFLA_IFNAME, new_name);
    if let Some(i) = new_ifindex {
        b.attr_u32(IFLA_NEW_IFINDEX, i);
    }
    b
}

/// Adds or deletes one alternative name.
pub fn altname(index: u32, name: &str, add: bool) -> MsgBuilder {
    let ty = if add {
        RTM_NEWLINKPROP
    } else {
        RTM_DELLINKPROP
    };
    let mut b =
        MsgBuilder::new(ty, NLM_F_REQUEST | NLM_F_ACK).family_header(&ifinfomsg(index, 0, 0));
    b.begin_nest(IFLA_PROP_LIST | NLA_F_NESTED)
        .attr_str(IFLA_ALT_IFNAME, name)
        .end_nest();
    b
}

fn ip_bytes(ip: &IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

fn family(ip: &IpAddr) -> u8 {
    if ip.is_ipv4() { AF_INET } else { AF_INET6 }
}

/// An interface address; IPv6 without DAD so routes can use it at once.
pub fn add_address(index: u32, net: &IpNet) -> MsgBuilder {
    let v6 = !net.is_ipv4();
    let mut hdr = [0u8; 8];
    hdr[0] = family(&net.addr);
    hdr[1] = net.prefix;
    hdr[2] = if v6 { IFA_F_NODAD } else { 0 };
    hdr[3] = RT_SCOPE_UNIVERSE;
    hdr[4..8].copy_from_slice(&index.to_ne_bytes());
    let mut b = MsgBuilder::new(
        RTM_NEWADDR,
        NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
    )
    .family_header(&hdr);
    let a = ip_bytes(&net.addr);
    b.attr(IFA_LOCAL, &a);
    b.attr(IFA_ADDRESS, &a);
    if let Some(brd) = net.ipv4_broadcast() {
        b.attr(IFA_BROADCAST, &brd.octets());
    }
    b
}

pub fn dump_addresses() -> MsgBuilder {
    MsgBuilder::new(RTM_GETADDR, NLM_F_REQUEST | NLM_F_DUMP).family_header(&[0u8; 8])
}

/// A route out of `index`; no gateway makes it a link-scope route.
pub fn add_route(index: u32, r: &Route) -> MsgBuilder {
    let table = r.table.unwrap_or(u32::from(RT_TABLE_MAIN));
    let mut hdr = [0u8; 12];
    hdr[0] = family(&r.dst.addr);
    hdr[1] = r.dst.prefix;
    hdr[4] = u8::try_from(table).unwrap_or(0);
    hdr[5] = RTPROT_BOOT;
    hdr[6] = r.scope.unwrap_or(if r.gw.is_some() {
        RT_SCOPE_UNIVERSE
    } else {
        RT_SCOPE_LINK
    });
    hdr[7] = RTN_UNICAST;
    let mut b = MsgBuilder::new(
        RTM_NEWROUTE,
        NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
    )
    .family_header(&hdr);
    if r.dst.prefix > 0 {
        b.attr(RTA_DST, &ip_bytes(&r.dst.addr));
    }
    if let Some(gw) = &r.gw {
        b.attr(RTA_GATEWAY, &ip_bytes(gw));
    }
    b.attr_u32(RTA_OIF, index);
    if let Some(p) = r.priority {
        b.attr_u32(RTA_PRIORITY, p);
    }
    b.attr_u32(RTA_TABLE, table);
    if r.mtu.is_some() || r.advmss.is_some() {
        b.begin_nest(RTA_METRICS | NLA_F_NESTED);
        if let Some(m) = r.mtu {
            b.attr_u32(RTAX_MTU, m);
        }
        if let Some(m) = r.advmss {
            b.attr_u32(RTAX_ADVMSS, m);
        }
        b.end_nest();
    }
    b
}

/// One PF-side VF attribute on the PF at `pf_index`:
/// `IFLA_VFINFO_LIST { IFLA_VF_INFO { <attr> } }`. 802.1Q VLANs use the
/// classic `IFLA_VF_VLAN` (what `ip link` sends and every driver knows);
/// 802.1ad needs `IFLA_VF_VLAN_LIST`.
pub fn set_vf(pf_index: u32, vf: u32, s: &VfSetting) -> MsgBuilder {
    let mut b = set_link(pf_index, 0, 0);
    b.begin_nest(IFLA_VFINFO_LIST).begin_nest(IFLA_VF_INFO);
    let words = |w: &[u32]| -> Vec<u8> { w.iter().flat_map(|x| x.to_ne_bytes()).collect() };
    match *s {
        VfSetting::Mac { mac } => {
            let mut p = vf.to_ne_bytes().to_vec();
            let mut m = [0u8; 32];
            m[..6].copy_from_slice(&mac.0);
            p.extend_from_slice(&m);
            b.attr(IFLA_VF_MAC, &p);
        }
        VfSetting::Vlan {
            vlan,
            qos,
            proto: VlanProto::Dot1Q,
        } => {
            b.attr(IFLA_VF_VLAN, &words(&[vf, u32::from(vlan), u32::from(qos)]));
        }
        VfSetting::Vlan { vlan, qos, proto } => {
            let mut p = words(&[vf, u32::from(vlan), u32::from(qos)]);
            p.extend_from_slice(&proto.ethertype().to_be_bytes());
            p.extend_from_slice(&[0, 0]); // struct ifla_vf_vlan_info is 16 bytes
            b.begin_nest(IFLA_VF_VLAN_LIST)
                .attr(IFLA_VF_VLAN_INFO, &p)
                .end_nest();
        }
        VfSetting::Rate { min, max } => {
            b.attr(IFLA_VF_RATE, &words(&[vf, min, max]));
        }
        VfSetting::Spoofchk { on } => {
            b.attr(IFLA_VF_SPOOFCHK, &words(&[vf, u32::from(on)]));
        }
        VfSetting::Trust { on } => {
            b.attr(IFLA_VF_TRUST, &words(&[vf, u32::from(on)]));
        }
        VfSetting::LinkState { state } => {
            b.attr(IFLA_VF_LINK_STATE, &words(&[vf, state.as_u32()]));
        }
    }
    b.end_nest().end_nest();
    b
}

/// A link as `RTM_NEWLINK` describes it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LinkInfo {
    pub index: u32,
    pub name: String,
    pub mac: Option<Mac>,
    pub mtu: u32,
    pub up: bool,
    pub altnames: Vec<String>,
    /// The bus device behind the netdev (a VF's PCI address); `None` for
    /// virtual devices.
    pub parent_dev: Option<String>,
}

fn short(what: &str) -> DecodeError {
    DecodeError(format!("short {what}"))
}

pub fn parse_link(payload: &[u8]) -> Result<LinkInfo, DecodeError> {
    let hdr = payload.get(..16).ok_or_else(|| short("ifinfomsg"))?;
    let index = read_u32(&hdr[4..8]).ok_or_else(|| short("ifinfomsg"))?;
    let flags = read_u32(&hdr[8..12]).ok_or_else(|| short("ifinfomsg"))?;
    let mut l = LinkInfo {
        index,
        name: String::new(),
        mac: None,
        mtu: 0,
        up: flags & IFF_UP != 0,
        altnames: Vec::new(),
        parent_dev: None,
    };
    for a in attrs(&payload[16..]) {
        let (ty, p) = a?;
        match ty {
            IFLA_IFNAME => l.name = read_str(p),
            IFLA_ADDRESS => l.mac = Mac::from_slice(p),
            IFLA_MTU => l.mtu = read_u32(p).ok_or_else(|| short("IFLA_MTU"))?,
            IFLA_PARENT_DEV_NAME => l.parent_dev = Some(read_str(p)),
            IFLA_PROP_LIST => {
                for inner in attrs(p) {
                    let (t, v) = inner?;
                    if t == IFLA_ALT_IFNAME {
                        l.altnames.push(read_str(v));
                    }
                }
            }
            _ => {}
        }
    }
    Ok(l)
}

/// The VF table of a PF's `RTM_NEWLINK`: `(vf index, state)`.
pub fn parse_vfs(payload: &[u8]) -> Result<Vec<(u32, VfState)>, DecodeError> {
    let mut out = Vec::new();
    let body = payload.get(16..).ok_or_else(|| short("ifinfomsg"))?;
    for a in attrs(body) {
        let (ty, list) = a?;
        if ty != IFLA_VFINFO_LIST {
            continue;
        }
        for info in attrs(list) {
            let (t, info) = info?;
            if t != IFLA_VF_INFO {
                continue;
            }
            out.push(parse_vf_info(info)?);
        }
    }
    Ok(out)
}

fn parse_vf_info(info: &[u8]) -> Result<(u32, VfState), DecodeError> {
    let mut vf = None;
    let mut st = VfState::default();
    let word = |p: &[u8], i: usize, what: &str| -> Result<u32, DecodeError> {
        p.get(i * 4..i * 4 + 4)
            .and_then(read_u32)
            .ok_or_else(|| short(what))
    };
    // The kernel reports "not supported" as (u32)-1.
    let setting = |v: u32| if v == u32::MAX { None } else { Some(v != 0) };
    for a in attrs(info) {
        let (ty, p) = a?;
        match ty {
            IFLA_VF_MAC => {
                vf = Some(word(p, 0, "IFLA_VF_MAC")?);
                st.mac = p
                    .get(4..10)
                    .and_then(Mac::from_slice)
                    .ok_or_else(|| short("IFLA_VF_MAC"))?;
            }
            IFLA_VF_VLAN => {
                st.vlan = word(p, 1, "IFLA_VF_VLAN")? as u16;
                st.qos = word(p, 2, "IFLA_VF_VLAN")? as u8;
            }
            IFLA_VF_VLAN_LIST => {
                if let Some(first) = attrs(p).next() {
                    let (_, v) = first?;
                    st.vlan = word(v, 1, "IFLA_VF_VLAN_INFO")? as u16;
                    st.qos = word(v, 2, "IFLA_VF_VLAN_INFO")? as u8;
                    let proto = v.get(12..14).ok_or_else(|| short("IFLA_VF_VLAN_INFO"))?;
                    st.proto = VlanProto::from_ethertype(u16::from_be_bytes([proto[0], proto[1]]))
                        .unwrap_or_default();
                }
            }
            IFLA_VF_RATE => {
                st.min_tx_rate = word(p, 1, "IFLA_VF_RATE")?;
                st.max_tx_rate = word(p, 2, "IFLA_VF_RATE")?;
            }
            IFLA_VF_SPOOFCHK => st.spoofchk = setting(word(p, 1, "IFLA_VF_SPOOFCHK")?),
            IFLA_VF_TRUST => st.trust = setting(word(p, 1, "IFLA_VF_TRUST")?),
            IFLA_VF_LINK_STATE => {
                st.link_state = LinkState::from_u32(word(p, 1, "IFLA_VF_LINK_STATE")?);
            }
            _ => {}
        }
    }
    let vf = vf.ok_or_else(|| DecodeError("IFLA_VF_INFO without IFLA_VF_MAC".into()))?;
    Ok((vf, st))
}

/// `(ifindex, address)` of an `RTM_NEWADDR`.
pub fn parse_address(payload: &[u8]) -> Result<(u32, IpNet), DecodeError> {
    let hdr = payload.get(..8).ok_or_else(|| short("ifaddrmsg"))?;
    let fam = hdr[0];
    let prefix = hdr[1];
    let index = read_u32(&hdr[4..8]).ok_or_else(|| short("ifaddrmsg"))?;
    let mut local = None;
    let mut address = None;
    for a in attrs(&payload[8..]) {
        let (ty, p) = a?;
        let ip = match (fam, p.len()) {
            (AF_INET, 4) => Some(IpAddr::from(
                <[u8; 4]>::try_from(p).map_err(|_| short("IPv4"))?,
            )),
            (AF_INET6, 16) => Some(IpAddr::from(
                <[u8; 16]>::try_from(p).map_err(|_| short("IPv6"))?,
            )),
            _ => None,
        };
        match ty {
            IFA_LOCAL => local = ip,
            IFA_ADDRESS => address = ip,
            _ => {}
        }
    }
    let ip = local
        .or(address)
        .ok_or_else(|| DecodeError("RTM_NEWADDR without an address".into()))?;
    Ok((
        index,
        IpNet::new(ip, prefix).map_err(|e| DecodeError(e.to_string()))?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::hex;

    // The expected bytes below are written out from the uapi structs
    // (x86-64, little endian), not produced by the builder.

    #[test]
    fn vf_vlan_8021ad_bytes() {
        let m = set_vf(
            7,
            2,
            &VfSetting::Vlan {
                vlan: 100,
                qos: 3,
                proto: VlanProto::Dot1Ad,
            },
        );
        assert_eq!(m.msg_type(), RTM_SETLINK);
        assert_eq!(m.flags(), NLM_F_REQUEST | NLM_F_ACK);
        let expect = "00 00 00 00 07 00 00 00 00 00 00 00 00 00 00 00 \
            20 00 16 00 1c 00 01 00 18 00 0c 00 14 00 01 00 \
            02 00 00 00 64 00 00 00 03 00 00 00 88 a8 00 00";
        assert_eq!(hex(m.payload()), expect);
    }

    #[test]
    fn vf_vlan_8021q_uses_ifla_vf_vlan() {
        let m = set_vf(
            7,
            2,
            &VfSetting::Vlan {
                vlan: 100,
                qos: 0,
                proto: VlanProto::Dot1Q,
            },
        );
        let expect = "00 00 00 00 07 00 00 00 00 00 00 00 00 00 00 00 \
            18 00 16 00 14 00 01 00 10 00 02 00 \
            02 00 00 00 64 00 00 00 00 00 00 00";
        assert_eq!(hex(m.payload()), expect);
    }

    #[test]
    fn vf_mac_rate_flags_bytes() {
        let mac: Mac = "02:11:22:33:44:55".parse().unwrap();
        let m = set_vf(3, 1, &VfSetting::Mac { mac });
        // ifla_vf_mac { u32 vf; u8 mac[32]; } = 36 bytes -> attr len 40 (0x28)
        let expect = format!(
            "00 00 00 00 03 00 00 00 00 00 00 00 00 00 00 00 \
             30 00 16 00 2c 00 01 00 28 00 01 00 01 00 00 00 \
             02 11 22 33 44 55 {}",
            vec!["00"; 26].join(" ")
        );
        assert_eq!(hex(m.payload()), expect);
        let m = set_vf(
            3,
            1,
            &VfSetting::Rate {
                min: 100,
                max: 1000,
            },
        );
        assert_eq!(
            hex(&m.payload()[16..]),
            "18 00 16 00 14 00 01 00 10 00 06 00 01 00 00 00 64 00 00 00 e8 03 00 00"
        );
        for (s, ty) in [
            (
                VfSetting::Spoofchk { on: false },
                "04 00 01 00 00 00 00 00 00 00",
            ),
            (
                VfSetting::Trust { on: true },
                "09 00 01 00 00 00 01 00 00 00",
            ),
            (
                VfSetting::LinkState {
                    state: LinkState::Disable,
                },
                "05 00 01 00 00 00 02 00 00 00",
            ),
        ] {
            let m = set_vf(3, 1, &s);
            assert_eq!(
                hex(&m.payload()[16..]),
                format!("14 00 16 00 10 00 01 00 0c 00 {ty}"),
                "{s}"
            );
        }
    }

    #[test]
    fn move_and_altname_bytes() {
        let m = move_to_netns(5, 9, "net1", None);
        assert_eq!(
            hex(m.payload()),
            "00 00 00 00 05 00 00 00 00 00 00 00 00 00 00 00 \
             08 00 1c 00 09 00 00 00 09 00 03 00 6e 65 74 31 00 00 00 00"
        );
        let m = move_to_netns(5, 9, "ab", Some(12));
        assert_eq!(
            hex(&m.payload()[16..]),
            "08 00 1c 00 09 00 00 00 07 00 03 00 61 62 00 00 08 00 31 00 0c 00 00 00"
        );
        let m = altname(5, "enp59s0", false);
        assert_eq!(m.msg_type(), RTM_DELLINKPROP);
        assert_eq!(
            hex(&m.payload()[16..]),
            "10 00 34 80 0c 00 35 00 65 6e 70 35 39 73 30 00"
        );
        let m = set_up(5, true);
        assert_eq!(
            hex(m.payload()),
            "00 00 00 00 05 00 00 00 01 00 00 00 01 00 00 00"
        );
    }

    #[test]
    fn address_and_route_bytes() {
        let m = add_address(4, &"10.56.0.2/24".parse().unwrap());
        assert_eq!(
            hex(m.payload()),
            "02 18 00 00 04 00 00 00 08 00 02 00 0a 38 00 02 08 00 01 00 0a 38 00 02 08 00 04 00 0a 38 00 ff"
        );
        let r = Route {
            priority: Some(10),
            mtu: Some(1400),
            ..Route::new(
                "10.57.0.0/16".parse().unwrap(),
                Some("10.56.0.1".parse().unwrap()),
            )
        };
        let m = add_route(4, &r);
        assert_eq!(
            hex(m.payload()),
            "02 10 00 00 fe 03 00 01 00 00 00 00 \
             08 00 01 00 0a 39 00 00 08 00 05 00 0a 38 00 01 08 00 04 00 04 00 00 00 \
             08 00 06 00 0a 00 00 00 08 00 0f 00 fe 00 00 00 0c 00 08 80 08 00 02 00 78 05 00 00"
        );
        let default = add_route(4, &Route::new("0.0.0.0/0".parse().unwrap(), None));
        // no RTA_DST, link scope
        assert_eq!(
            &default.payload()[..12],
            &[2, 0, 0, 0, 254, 3, 253, 1, 0, 0, 0, 0]
        );
    }

    /// A PF's RTM_NEWLINK as the kernel lays out one IFLA_VF_INFO.
    fn pf_reply(vf: u32, proto: u16) -> Vec<u8> {
        let mut b = MsgBuilder::new(16, 0).family_header(&ifinfomsg(7, IFF_UP, 0));
        b.attr_str(IFLA_IFNAME, "ens1f0");
        b.begin_nest(IFLA_VFINFO_LIST).begin_nest(IFLA_VF_INFO);
        let mut mac = vf.to_ne_bytes().to_vec();
        mac.extend_from_slice(&[2, 0, 0, 0, 0, 9]);
        mac.extend_from_slice(&[0; 26]);
        b.attr(IFLA_VF_MAC, &mac);
        let w = |x: &[u32]| x.iter().flat_map(|v| v.to_ne_bytes()).collect::<Vec<u8>>();
        b.attr(IFLA_VF_VLAN, &w(&[vf, 42, 5]));
        let mut vi = w(&[vf, 42, 5]);
        vi.extend_from_slice(&proto.to_be_bytes());
        vi.extend_from_slice(&[0, 0]);
        b.begin_nest(IFLA_VF_VLAN_LIST)
            .attr(IFLA_VF_VLAN_INFO, &vi)
            .end_nest();
        b.attr(IFLA_VF_RATE, &w(&[vf, 10, 20]));
        b.attr(IFLA_VF_SPOOFCHK, &w(&[vf, 1]));
        b.attr(IFLA_VF_TRUST, &w(&[vf, u32::MAX]));
        b.attr(IFLA_VF_LINK_STATE, &w(&[vf, 2]));
        b.end_nest().end_nest();
        b.payload().to_vec()
    }

    #[test]
    fn parses_vf_table() {
        let vfs = parse_vfs(&pf_reply(3, 0x88a8)).unwrap();
        assert_eq!(vfs.len(), 1);
        let (idx, st) = vfs[0];
        assert_eq!(idx, 3);
        assert_eq!(st.mac.to_string(), "02:00:00:00:00:09");
        assert_eq!((st.vlan, st.qos, st.proto), (42, 5, VlanProto::Dot1Ad));
        assert_eq!((st.min_tx_rate, st.max_tx_rate), (10, 20));
        assert_eq!(st.spoofchk, Some(true));
        assert_eq!(st.trust, None);
        assert_eq!(st.link_state, Some(LinkState::Disable));
        let link = parse_link(&pf_reply(0, 0x8100)).unwrap();
        assert_eq!(
            (link.index, link.name.as_str(), link.up),
            (7, "ens1f0", true)
        );
    }

    #[test]
    fn round_trip_set_vf_through_parser() {
        // What set_vf sends decodes back to the same setting.
        let m = set_vf(
            9,
            4,
            &VfSetting::Vlan {
                vlan: 7,
                qos: 1,
                proto: VlanProto::Dot1Ad,
            },
        );
        let mut reply = m.payload().to_vec();
        // give it the IFLA_VF_MAC the kernel always reports first
        let mut b = MsgBuilder::new(16, 0).family_header(&ifinfomsg(9, 0, 0));
        b.begin_nest(IFLA_VFINFO_LIST).begin_nest(IFLA_VF_INFO);
        let mut mac = 4u32.to_ne_bytes().to_vec();
        mac.extend_from_slice(&[0; 32]);
        b.attr(IFLA_VF_MAC, &mac);
        let inner = &reply[16 + 8..];
        b.attr(IFLA_VF_VLAN_LIST, &inner[4..]);
        b.end_nest().end_nest();
        reply = b.payload().to_vec();
        let st = parse_vfs(&reply).unwrap()[0].1;
        assert_eq!((st.vlan, st.qos, st.proto), (7, 1, VlanProto::Dot1Ad));
    }
}
