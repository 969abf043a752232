//! kroce-netlink: the project's one netlink stack. A message builder and
//! attribute parser (pure, byte-exact, tested against the kernel uapi
//! layouts and iproute2's bytes), a blocking socket ([`NlSocket`]) opened
//! once per netns ([`netns::Netns`]) that matches answers by sequence number
//! and bounds every request, or subscribes to multicast groups and receives
//! the kernel's notifications, and the codecs: [`route`] (links, addresses,
//! routes, PF-side VF attributes as [`vf_attrs`] holds them), [`rdma`]
//! (RDMA netlink: device moves, soft devices, the netns mode) and [`dcb`]
//! (DCBX, PFC, the DSCP APP table).
//!
//! Synchronous on purpose: kroce-cni is a short-lived exec, the node agent
//! applies from a blocking thread and the device plugin's event listener
//! reads on a thread of its own; an async stack would need a runtime per
//! call, and the RDMA and DCB messages have no crate at all.

pub mod dcb;
pub mod netns;
pub mod rdma;
pub mod route;
pub mod socket;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod vf_attrs;

/// The netlink family a socket speaks (`NetlinkRoute`, `NetlinkRDMA`,
/// `NetlinkKObjectUEvent`): users need no nix of their own for it.
pub use nix::sys::socket::SockProtocol;
pub use socket::{NlError, NlSocket};

/// `struct nlmsghdr` is 16 bytes.
pub const NLMSG_HDRLEN: usize = 16;
pub const NLMSG_ERROR: u16 = 2;
pub const NLMSG_DONE: u16 = 3;

pub const NLM_F_REQUEST: u16 = 0x1;
pub const NLM_F_MULTI: u16 = 0x2;
pub const NLM_F_ACK: u16 = 0x4;
pub const NLM_F_ROOT: u16 = 0x100;
pub const NLM_F_MATCH: u16 = 0x200;
pub const NLM_F_DUMP: u16 = NLM_F_ROOT | NLM_F_MATCH;
pub const NLM_F_EXCL: u16 = 0x200;
pub const NLM_F_CREATE: u16 = 0x400;

/// Attribute type flag for nested attributes (`NLA_F_NESTED`).
pub const NLA_F_NESTED: u16 = 0x8000;
const NLA_TYPE_MASK: u16 = 0x3fff;

pub fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// Builds one netlink request: header, fixed family header, attributes
/// (nests tracked so their lengths are patched on close).
#[derive(Debug, Clone)]
pub struct MsgBuilder {
    buf: Vec<u8>,
    nests: Vec<usize>,
}

impl MsgBuilder {
    pub fn new(msg_type: u16, flags: u16) -> MsgBuilder {
        let mut buf = Vec::with_capacity(128);
        buf.extend_from_slice(&0u32.to_ne_bytes()); // len, patched in finish
        buf.extend_from_slice(&msg_type.to_ne_bytes());
        buf.extend_from_slice(&flags.to_ne_bytes());
        buf.extend_from_slice(&0u32.to_ne_bytes()); // seq, set by the socket
        buf.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel's 0
        MsgBuilder {
            buf,
            nests: Vec::new(),
        }
    }

    /// The fixed header after `nlmsghdr` (ifinfomsg, ifaddrmsg, rtmsg).
    pub fn family_header(mut self, bytes: &[u8]) -> MsgBuilder {
        self.buf.extend_from_slice(bytes);
        self.pad();
        self
    }

    fn pad(&mut self) {
        let n = align4(self.buf.len());
        self.buf.resize(n, 0);
    }

    pub fn attr(&mut self, ty: u16, payload: &[u8]) -> &mut MsgBuilder {
        let len = 4 + payload.len();
        self.buf.extend_from_slice(&(len as u16).to_ne_bytes());
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self.buf.extend_from_slice(payload);
        self.pad();
        self
    }

    pub fn attr_u32(&mut self, ty: u16, v: u32) -> &mut MsgBuilder {
        self.attr(ty, &v.to_ne_bytes())
    }

    pub fn attr_u8(&mut self, ty: u16, v: u8) -> &mut MsgBuilder {
        self.attr(ty, &[v])
    }

    /// A NUL-terminated string attribute.
    pub fn attr_str(&mut self, ty: u16, s: &str) -> &mut MsgBuilder {
        let mut b = Vec::with_capacity(s.len() + 1);
        b.extend_from_slice(s.as_bytes());
        b.push(0);
        self.attr(ty, &b)
    }

    pub fn begin_nest(&mut self, ty: u16) -> &mut MsgBuilder {
        self.nests.push(self.buf.len());
        self.buf.extend_from_slice(&0u16.to_ne_bytes());
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self
    }

    pub fn end_nest(&mut self) -> &mut MsgBuilder {
        if let Some(start) = self.nests.pop() {
            let len = (self.buf.len() - start) as u16;
            self.buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
        }
        self
    }

    /// The finished message with `seq` filled in.
    pub fn finish(&self, seq: u32) -> Vec<u8> {
        let mut out = self.buf.clone();
        let len = out.len() as u32;
        out[0..4].copy_from_slice(&len.to_ne_bytes());
        out[8..12].copy_from_slice(&seq.to_ne_bytes());
        out
    }

    /// The bytes after `nlmsghdr` (what recording backends compare).
    pub fn payload(&self) -> &[u8] {
        &self.buf[NLMSG_HDRLEN..]
    }

    pub fn msg_type(&self) -> u16 {
        u16::from_ne_bytes([self.buf[4], self.buf[5]])
    }

    pub fn flags(&self) -> u16 {
        u16::from_ne_bytes([self.buf[6], self.buf[7]])
    }
}

/// A malformed message from the kernel (or a test).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed netlink data: {0}")]
pub struct DecodeError(pub String);

/// One received message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NlMsg<'a> {
    pub msg_type: u16,
    pub flags: u16,
    pub seq: u32,
    pub payload: &'a [u8],
}

/// Splits a datagram into messages.
pub fn split_messages(mut buf: &[u8]) -> Result<Vec<NlMsg<'_>>, DecodeError> {
    let mut out = Vec::new();
    while buf.len() >= NLMSG_HDRLEN {
        let len = u32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
        if len < NLMSG_HDRLEN || len > buf.len() {
            return Err(DecodeError(format!(
                "message length {len} with {} bytes left",
                buf.len()
            )));
        }
        out.push(NlMsg {
            msg_type: u16::from_ne_bytes([buf[4], buf[5]]),
            flags: u16::from_ne_bytes([buf[6], buf[7]]),
            seq: u32::from_ne_bytes([buf[8], buf[9], buf[10], buf[11]]),
            payload: &buf[NLMSG_HDRLEN..len],
        });
        buf = &buf[align4(len).min(buf.len())..];
    }
    Ok(out)
}

/// Iterates `(type, payload)` over an attribute area, flags masked off.
#[derive(Debug, Clone)]
pub struct Attrs<'a> {
    rest: &'a [u8],
}

pub fn attrs(buf: &[u8]) -> Attrs<'_> {
    Attrs { rest: buf }
}

impl<'a> Iterator for Attrs<'a> {
    type Item = Result<(u16, &'a [u8]), DecodeError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.len() < 4 {
            return None;
        }
        let len = u16::from_ne_bytes([self.rest[0], self.rest[1]]) as usize;
        let ty = u16::from_ne_bytes([self.rest[2], self.rest[3]]) & NLA_TYPE_MASK;
        if len < 4 || len > self.rest.len() {
            let e = DecodeError(format!(
                "attribute {ty} length {len} with {} bytes left",
                self.rest.len()
            ));
            self.rest = &[];
            return Some(Err(e));
        }
        let payload = &self.rest[4..len];
        self.rest = &self.rest[align4(len).min(self.rest.len())..];
        Some(Ok((ty, payload)))
    }
}

pub fn read_u32(b: &[u8]) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(..4)?.try_into().ok()?))
}

/// A NUL-terminated (or not) string attribute.
pub fn read_str(b: &[u8]) -> String {
    let end = b.iter().position(|c| *c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

/// The errno of an `NLMSG_ERROR` payload (0 is an ACK).
pub fn error_code(payload: &[u8]) -> Result<i32, DecodeError> {
    payload
        .get(..4)
        .map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
        .ok_or_else(|| DecodeError("short NLMSG_ERROR".into()))
}

/// Bytes as space-separated hex, for comparing messages with the layouts
/// the tests write out from the uapi structs.
#[cfg(test)]
pub(crate) fn hex(b: &[u8]) -> String {
    b.iter()
        .map(|x| format!("{x:02x}"))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builder_layout_and_nesting() {
        let mut b = MsgBuilder::new(19, NLM_F_REQUEST | NLM_F_ACK).family_header(&[1, 2, 3]);
        b.begin_nest(22).attr_u32(1, 7).attr_str(3, "ab").end_nest();
        let m = b.finish(42);
        // header(16) + family(3 -> 4) + nest hdr 4 + u32 attr 8 + "ab\0" attr 7 -> 8
        assert_eq!(m.len(), 16 + 4 + 4 + 8 + 8);
        assert_eq!(
            u32::from_ne_bytes(m[0..4].try_into().unwrap()) as usize,
            m.len()
        );
        assert_eq!(u32::from_ne_bytes(m[8..12].try_into().unwrap()), 42);
        assert_eq!(&m[16..20], &[1, 2, 3, 0]);
        // The nest length covers its padded children: 4 + 8 + 8.
        assert_eq!(u16::from_ne_bytes([m[20], m[21]]), 20);
        let msgs = split_messages(&m).unwrap();
        assert_eq!(msgs.len(), 1);
        let outer: Vec<_> = attrs(&msgs[0].payload[4..]).map(Result::unwrap).collect();
        assert_eq!(outer.len(), 1);
        assert_eq!(outer[0].0, 22);
        let inner: Vec<_> = attrs(outer[0].1).map(Result::unwrap).collect();
        assert_eq!(read_u32(inner[0].1), Some(7));
        assert_eq!(read_str(inner[1].1), "ab");
    }

    #[test]
    fn malformed_input_is_an_error_not_a_panic() {
        assert!(split_messages(&[0xff; 20]).is_err());
        let bad_attr = [200u8, 0, 1, 0, 0, 0];
        let r: Vec<_> = attrs(&bad_attr).collect();
        assert!(r[0].is_err());
        assert!(error_code(&[1, 2]).is_err());
    }

    proptest::proptest! {
        #[test]
        fn parsers_never_panic(data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256)) {
            if let Ok(msgs) = split_messages(&data) {
                for m in msgs {
                    for a in attrs(m.payload).flatten() {
                        let _ = read_str(a.1);
                        let _ = attrs(a.1).count();
                    }
                }
            }
        }
    }
}
