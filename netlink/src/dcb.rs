//! DCB messages (`RTM_GETDCB`/`RTM_SETDCB`, `linux/dcbnl.h`): DCBX mode,
//! IEEE PFC and the DSCP APP table (which is how the kernel sets `trust
//! dscp`: mlx5 switches to DSCP trust on the first DSCP APP entry and back
//! to PCP when the last is deleted). Pure encode/decode, tested byte for
//! byte against iproute2's `dcb`; the node agent's `Dcb` edge
//! (`node-agent/src/dcb.rs`) sends them through [`crate::NlSocket`].
//!
//! A set can be refused twice over: by the kernel (a negative netlink ACK)
//! or by the driver, which `dcbnl_ieee_set`, `dcbnl_ieee_del` and
//! `dcbnl_setdcbx` (`net/dcb/dcbnl.c`) report *in band*: a one-byte
//! `DCB_ATTR_IEEE` / `DCB_ATTR_DCBX` in the reply, while the ACK is 0
//! ([`inband_status`]).

use crate::{DecodeError, MsgBuilder, NLA_F_NESTED, NLM_F_ACK, NLM_F_REQUEST, attrs};
use std::io;

pub const RTM_GETDCB: u16 = 78;
pub const RTM_SETDCB: u16 = 79;
/// `sizeof(struct dcbmsg)`: family, command, pad.
const DCBMSG_LEN: usize = 4;

/// `enum dcbnl_commands`.
pub mod cmd {
    pub const IEEE_SET: u8 = 20;
    pub const IEEE_GET: u8 = 21;
    pub const GDCBX: u8 = 22;
    pub const SDCBX: u8 = 23;
    pub const IEEE_DEL: u8 = 27;
}

/// `enum dcbnl_attrs`, `enum ieee_attrs`, `enum ieee_attrs_app`.
pub mod attr {
    pub const IFNAME: u16 = 1;
    pub const IEEE: u16 = 13;
    pub const DCBX: u16 = 14;
    pub const IEEE_PFC: u16 = 2;
    pub const IEEE_APP_TABLE: u16 = 3;
    pub const IEEE_APP: u16 = 1;
}

pub const DCB_CAP_DCBX_HOST: u8 = 0x01;
pub const DCB_CAP_DCBX_LLD_MANAGED: u8 = 0x02;
pub const DCB_CAP_DCBX_VER_IEEE: u8 = 0x08;
pub const IEEE_8021QAZ_APP_SEL_DSCP: u8 = 5;
/// `sizeof(struct ieee_pfc)`: 3 u8, pad, u16, pad to 8, 2 x 8 u64.
pub const IEEE_PFC_LEN: usize = 136;

/// `struct ieee_pfc`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IeeePfc {
    pub pfc_cap: u8,
    pub pfc_en: u8,
    pub mbc: u8,
    pub delay: u16,
    pub requests: [u64; 8],
    pub indications: [u64; 8],
}

impl IeeePfc {
    pub fn to_bytes(&self) -> [u8; IEEE_PFC_LEN] {
        let mut b = [0u8; IEEE_PFC_LEN];
        b[0] = self.pfc_cap;
        b[1] = self.pfc_en;
        b[2] = self.mbc;
        b[4..6].copy_from_slice(&self.delay.to_ne_bytes());
        for i in 0..8 {
            b[8 + i * 8..16 + i * 8].copy_from_slice(&self.requests[i].to_ne_bytes());
            b[72 + i * 8..80 + i * 8].copy_from_slice(&self.indications[i].to_ne_bytes());
        }
        b
    }

    pub fn from_bytes(b: &[u8]) -> Option<IeeePfc> {
        if b.len() < IEEE_PFC_LEN {
            return None;
        }
        let u64_at = |o: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[o..o + 8]);
            u64::from_ne_bytes(a)
        };
        let mut p = IeeePfc {
            pfc_cap: b[0],
            pfc_en: b[1],
            mbc: b[2],
            delay: u16::from_ne_bytes([b[4], b[5]]),
            ..Default::default()
        };
        for i in 0..8 {
            p.requests[i] = u64_at(8 + i * 8);
            p.indications[i] = u64_at(72 + i * 8);
        }
        Some(p)
    }
}

/// `struct dcb_app`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct DcbApp {
    pub selector: u8,
    pub priority: u8,
    pub protocol: u16,
}

impl DcbApp {
    pub fn dscp(dscp: u8, priority: u8) -> DcbApp {
        DcbApp {
            selector: IEEE_8021QAZ_APP_SEL_DSCP,
            priority,
            protocol: u16::from(dscp),
        }
    }
    fn to_bytes(self) -> [u8; 4] {
        let p = self.protocol.to_ne_bytes();
        [self.selector, self.priority, p[0], p[1]]
    }
}

/// What `DCB_CMD_IEEE_GET` tells about a netdev.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DcbState {
    pub dcbx: Option<u8>,
    pub pfc: Option<IeeePfc>,
    pub apps: Vec<DcbApp>,
}

impl DcbState {
    pub fn dscp_apps(&self) -> Vec<DcbApp> {
        self.apps
            .iter()
            .copied()
            .filter(|a| a.selector == IEEE_8021QAZ_APP_SEL_DSCP)
            .collect()
    }
}

/// `nlmsghdr` + `dcbmsg { AF_UNSPEC, cmd, 0 }` + `DCB_ATTR_IFNAME`.
fn request(msg_type: u16, command: u8, ifname: &str) -> MsgBuilder {
    let mut b =
        MsgBuilder::new(msg_type, NLM_F_REQUEST | NLM_F_ACK).family_header(&[0, command, 0, 0]);
    b.attr_str(attr::IFNAME, ifname);
    b
}

pub fn get_msg(ifname: &str) -> MsgBuilder {
    request(RTM_GETDCB, cmd::IEEE_GET, ifname)
}

pub fn set_dcbx_msg(ifname: &str, mode: u8) -> MsgBuilder {
    let mut b = request(RTM_SETDCB, cmd::SDCBX, ifname);
    b.attr_u8(attr::DCBX, mode);
    b
}

/// Nests carry `NLA_F_NESTED`, as libmnl's `mnl_attr_nest_start` (and so
/// iproute2's `dcb`) sets it.
pub fn set_pfc_msg(ifname: &str, pfc: &IeeePfc) -> MsgBuilder {
    let mut b = request(RTM_SETDCB, cmd::IEEE_SET, ifname);
    b.begin_nest(attr::IEEE | NLA_F_NESTED)
        .attr(attr::IEEE_PFC, &pfc.to_bytes())
        .end_nest();
    b
}

/// `IEEE_SET` (add) or `IEEE_DEL` with an APP table.
pub fn apps_msg(ifname: &str, apps: &[DcbApp], delete: bool) -> MsgBuilder {
    let command = if delete { cmd::IEEE_DEL } else { cmd::IEEE_SET };
    let mut b = request(RTM_SETDCB, command, ifname);
    b.begin_nest(attr::IEEE | NLA_F_NESTED)
        .begin_nest(attr::IEEE_APP_TABLE | NLA_F_NESTED);
    for app in apps {
        b.attr(attr::IEEE_APP, &app.to_bytes());
    }
    b.end_nest().end_nest();
    b
}

/// The driver's verdict on a set, carried in the reply to `command` as a
/// one-byte `status_attr`; `None` when no reply carries it (iproute2
/// accepts that too). `replies` are payloads after `nlmsghdr`.
pub fn inband_status(replies: &[Vec<u8>], command: u8, status_attr: u16) -> Option<u8> {
    replies
        .iter()
        .filter(|m| m.len() >= DCBMSG_LEN && m[1] == command)
        .flat_map(|m| attrs(&m[DCBMSG_LEN..]).flatten())
        .find(|(kind, payload)| *kind == status_attr && payload.len() == 1)
        .map(|(_, payload)| payload[0])
}

/// Words for a status byte. `dcbnl_ieee_set`/`_del` store the driver's
/// negative errno in a u8; `dcbnl_setdcbx` the driver's own u8 (mlx5,
/// ixgbe: 1 = refused).
pub fn status_reason(status_attr: u16, status: u8) -> String {
    let errno = -i32::from(status as i8);
    if status_attr == attr::IEEE && errno > 0 {
        io::Error::from_raw_os_error(errno).to_string()
    } else {
        format!("driver status {status}")
    }
}

/// Parses the `RTM_GETDCB` reply to `IEEE_GET` (its payload after
/// `nlmsghdr`).
pub fn parse_get_reply(msg: &[u8]) -> Result<DcbState, DecodeError> {
    if msg.len() < DCBMSG_LEN {
        return Err(DecodeError(format!(
            "{} bytes is shorter than struct dcbmsg",
            msg.len()
        )));
    }
    let mut state = DcbState::default();
    for a in attrs(&msg[DCBMSG_LEN..]) {
        let (kind, payload) = a?;
        match kind {
            attr::DCBX => state.dcbx = payload.first().copied(),
            attr::IEEE => {
                for a in attrs(payload) {
                    let (k, p) = a?;
                    match k {
                        attr::IEEE_PFC => {
                            state.pfc = Some(IeeePfc::from_bytes(p).ok_or_else(|| {
                                DecodeError(format!(
                                    "ieee_pfc of {} bytes, want {IEEE_PFC_LEN}",
                                    p.len()
                                ))
                            })?);
                        }
                        attr::IEEE_APP_TABLE => {
                            for a in attrs(p) {
                                let (ak, ap) = a?;
                                if ak == attr::IEEE_APP && ap.len() >= 4 {
                                    state.apps.push(DcbApp {
                                        selector: ap[0],
                                        priority: ap[1],
                                        protocol: u16::from_ne_bytes([ap[2], ap[3]]),
                                    });
                                }
                            }
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    Ok(state)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode_get(ifname: &str, seq: u32) -> Vec<u8> {
        get_msg(ifname).finish(seq)
    }
    fn encode_set_dcbx(ifname: &str, mode: u8, seq: u32) -> Vec<u8> {
        set_dcbx_msg(ifname, mode).finish(seq)
    }
    fn encode_set_pfc(ifname: &str, pfc: &IeeePfc, seq: u32) -> Vec<u8> {
        set_pfc_msg(ifname, pfc).finish(seq)
    }
    fn encode_apps(ifname: &str, apps: &[DcbApp], delete: bool, seq: u32) -> Vec<u8> {
        apps_msg(ifname, apps, delete).finish(seq)
    }
    /// A whole kernel message: `nlmsghdr`, `dcbmsg`, the given attributes.
    fn encode(msg_type: u16, command: u8, seq: u32, attrs: &[u8]) -> Vec<u8> {
        let mut m = MsgBuilder::new(msg_type, 0)
            .family_header(&[0, command, 0, 0])
            .finish(seq);
        m.extend_from_slice(attrs);
        let len = m.len() as u32;
        m[0..4].copy_from_slice(&len.to_ne_bytes());
        m
    }
    /// The test's own attribute writer (an oracle independent of MsgBuilder).
    fn push_attr(buf: &mut Vec<u8>, kind: u16, payload: &[u8]) {
        let len = 4 + payload.len();
        buf.extend_from_slice(&(len as u16).to_ne_bytes());
        buf.extend_from_slice(&kind.to_ne_bytes());
        buf.extend_from_slice(payload);
        buf.resize(buf.len() + (4 - len % 4) % 4, 0);
    }
    fn ifname_attr(buf: &mut Vec<u8>, ifname: &str) {
        let mut name = ifname.as_bytes().to_vec();
        name.push(0);
        push_attr(buf, attr::IFNAME, &name);
    }
    /// What a transport hands back: the payload after `nlmsghdr`.
    fn payload(m: Vec<u8>) -> Vec<u8> {
        m[16..].to_vec()
    }

    fn ne16(v: u16) -> [u8; 2] {
        v.to_ne_bytes()
    }
    fn ne32(v: u32) -> [u8; 4] {
        v.to_ne_bytes()
    }

    /// Hand-assembled expected header: len, type, flags, seq, pid, dcbmsg.
    fn header(len: u32, ty: u16, seq: u32, command: u8) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend(ne32(len));
        v.extend(ne16(ty));
        v.extend(ne16(0x5));
        v.extend(ne32(seq));
        v.extend(ne32(0));
        v.extend([0, command, 0, 0]);
        v
    }

    fn ifname_ens1f0() -> Vec<u8> {
        // len 4 + "ens1f0\0" = 11, padded to 12
        let mut v = Vec::new();
        v.extend(ne16(11));
        v.extend(ne16(1));
        v.extend(b"ens1f0\0\0");
        v
    }

    #[test]
    fn set_pfc_message_bytes() {
        let pfc = IeeePfc {
            pfc_cap: 8,
            pfc_en: 0b1000,
            mbc: 0,
            delay: 0x1234,
            ..Default::default()
        };
        let got = encode_set_pfc("ens1f0", &pfc, 7);
        let mut want = header(16 + 4 + 12 + 4 + 4 + 136, 79, 7, 20);
        want.extend(ifname_ens1f0());
        want.extend(ne16(4 + 4 + 136)); // DCB_ATTR_IEEE, nested
        want.extend(ne16(13 | 0x8000));
        want.extend(ne16(4 + 136)); // DCB_ATTR_IEEE_PFC
        want.extend(ne16(2));
        let mut body = vec![8u8, 0b1000, 0, 0];
        body.extend(ne16(0x1234));
        body.extend([0, 0]);
        body.extend([0u8; 128]);
        want.extend(body);
        assert_eq!(got, want);
        assert_eq!(got.len(), 176);
        assert_eq!(IeeePfc::from_bytes(&pfc.to_bytes()), Some(pfc));
    }

    #[test]
    fn set_dcbx_and_app_table_bytes() {
        let got = encode_set_dcbx("ens1f0", DCB_CAP_DCBX_HOST | DCB_CAP_DCBX_VER_IEEE, 1);
        let mut want = header(16 + 4 + 12 + 8, 79, 1, 23);
        want.extend(ifname_ens1f0());
        want.extend(ne16(5));
        want.extend(ne16(14));
        want.extend([0x09, 0, 0, 0]);
        assert_eq!(got, want);

        let apps = [DcbApp::dscp(26, 3), DcbApp::dscp(46, 5)];
        let got = encode_apps("ens1f0", &apps, false, 2);
        let mut want = header(16 + 4 + 12 + 4 + 4 + 16, 79, 2, 20);
        want.extend(ifname_ens1f0());
        want.extend(ne16(4 + 4 + 16));
        want.extend(ne16(13 | 0x8000));
        want.extend(ne16(4 + 16));
        want.extend(ne16(3 | 0x8000));
        for (dscp, prio) in [(26u16, 3u8), (46, 5)] {
            want.extend(ne16(8));
            want.extend(ne16(1));
            want.extend([5, prio]);
            want.extend(ne16(dscp));
        }
        assert_eq!(got, want);
        let del = encode_apps("ens1f0", &apps, true, 2);
        assert_eq!(del[17], 27, "IEEE_DEL command");
        assert_eq!(&del[18..], &want[18..]);
    }

    #[test]
    fn get_request_and_reply_parse() {
        let got = encode_get("ens1f0", 3);
        let mut want = header(32, 78, 3, 21);
        want.extend(ifname_ens1f0());
        assert_eq!(got, want);

        // A reply as dcbnl_ieee_fill lays it out: IFNAME, IEEE{PFC, APP_TABLE}, DCBX.
        let pfc = IeeePfc {
            pfc_cap: 8,
            pfc_en: 0b1000,
            ..Default::default()
        };
        let mut ieee = Vec::new();
        push_attr(&mut ieee, attr::IEEE_PFC, &pfc.to_bytes());
        let mut table = Vec::new();
        push_attr(&mut table, attr::IEEE_APP, &DcbApp::dscp(26, 3).to_bytes());
        push_attr(&mut ieee, attr::IEEE_APP_TABLE, &table);
        let mut a = Vec::new();
        ifname_attr(&mut a, "ens1f0");
        push_attr(&mut a, attr::IEEE, &ieee);
        push_attr(&mut a, attr::DCBX, &[0x09]);
        let reply = payload(encode(RTM_GETDCB, cmd::IEEE_GET, 3, &a));
        let st = parse_get_reply(&reply).unwrap();
        assert_eq!(st.dcbx, Some(0x09));
        assert_eq!(st.pfc, Some(pfc));
        assert_eq!(st.apps, [DcbApp::dscp(26, 3)]);
        assert!(parse_get_reply(&reply[..3]).is_err());
        assert!(parse_get_reply(&reply[..10]).is_err(), "a cut attribute");
    }

    /// `hex` of a space-separated dump.
    fn unhex(s: &str) -> Vec<u8> {
        s.split_whitespace()
            .map(|b| u8::from_str_radix(b, 16).unwrap())
            .collect()
    }

    /// Requests byte for byte as iproute2 6.1's `dcb` sends them, captured
    /// with `strace -e trace=sendto -e write=3 -xx dcb ...` on a veth
    /// `kdcb0` (the kernel refuses, veth has no dcbnl_ops, but the request
    /// is what counts). iproute2 numbers from the time (seq 0x6b0f5f22).
    /// Nests carry NLA_F_NESTED (`0d 80`, `03 80`) as libmnl sets it.
    #[cfg(target_endian = "little")]
    #[test]
    fn requests_match_iproute2_dcb_byte_for_byte() {
        let seq = 0x6b0f5f22;
        // dcb dcbx set dev kdcb0 host ieee
        let dcbx = unhex(
            "28 00 00 00 4f 00 05 00 22 5f 0f 6b 00 00 00 00 \
             00 17 00 00 0a 00 01 00 6b 64 63 62 30 00 00 00 \
             05 00 0e 00 09 00 00 00",
        );
        assert_eq!(
            encode_set_dcbx("kdcb0", DCB_CAP_DCBX_HOST | DCB_CAP_DCBX_VER_IEEE, seq),
            dcbx
        );
        // dcb app add dev kdcb0 dscp-prio 26:3 46:5
        let add = unhex(
            "38 00 00 00 4f 00 05 00 22 5f 0f 6b 00 00 00 00 \
             00 14 00 00 0a 00 01 00 6b 64 63 62 30 00 00 00 \
             18 00 0d 80 14 00 03 80 08 00 01 00 05 03 1a 00 \
             08 00 01 00 05 05 2e 00",
        );
        let apps = [DcbApp::dscp(26, 3), DcbApp::dscp(46, 5)];
        assert_eq!(encode_apps("kdcb0", &apps, false, seq), add);
        // dcb app del dev kdcb0 dscp-prio 26:3 46:5
        let del = unhex(
            "38 00 00 00 4f 00 05 00 22 5f 0f 6b 00 00 00 00 \
             00 1b 00 00 0a 00 01 00 6b 64 63 62 30 00 00 00 \
             18 00 0d 80 14 00 03 80 08 00 01 00 05 03 1a 00 \
             08 00 01 00 05 05 2e 00",
        );
        assert_eq!(encode_apps("kdcb0", &apps, true, seq), del);
        // dcb pfc show dev kdcb0 (also the first request of `dcb pfc set`)
        let get = unhex(
            "20 00 00 00 4e 00 05 00 22 5f 0f 6b 00 00 00 00 \
             00 15 00 00 0a 00 01 00 6b 64 63 62 30 00 00 00",
        );
        assert_eq!(encode_get("kdcb0", seq), get);
        // `dcb pfc set` needs a GET that a veth refuses, so its SET could
        // not be captured here; iproute2's dcb_set_attribute builds it as
        // the APP one above: DCB_ATTR_IEEE nest (NLA_F_NESTED) around a
        // plain DCB_ATTR_IEEE_PFC.
        let pfc = encode_set_pfc("kdcb0", &IeeePfc::default(), seq);
        assert_eq!(&pfc[32..36], &[4 + 4 + 136, 0, 0x0d, 0x80]);
        assert_eq!(&pfc[36..40], &[4 + 136, 0, 0x02, 0x00]);
    }
}
