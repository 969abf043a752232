//! The agent's DCB edge: the [`Dcb`] operations it needs, per netdev, over
//! a [`NetlinkTransport`] (kroce-netlink's socket in production, a
//! recording one in tests), and an in-memory NIC ([`FakeDcb`]). The
//! messages themselves (encode, decode, the driver's in-band status) are
//! kroce-netlink's `dcb` codec. The kernel here has no NIC with dcbnl ops,
//! so the real socket is tested for what it can be (the kernel parses our
//! request and answers ENODEV/EOPNOTSUPP).

pub use kroce_netlink::dcb::{
    DCB_CAP_DCBX_HOST, DCB_CAP_DCBX_LLD_MANAGED, DCB_CAP_DCBX_VER_IEEE, DcbApp, DcbState, IeeePfc,
};
use kroce_netlink::dcb::{
    apps_msg, attr, cmd, get_msg, inband_status, parse_get_reply, set_dcbx_msg, set_pfc_msg,
    status_reason,
};
use kroce_netlink::{MsgBuilder, NlError, NlSocket};
use std::io;
use std::sync::Mutex;

#[derive(Debug, thiserror::Error)]
pub enum DcbError {
    #[error("DCB {op} on {ifname}: {source}")]
    Io {
        op: &'static str,
        ifname: String,
        #[source]
        source: io::Error,
    },
    #[error("DCB {op} on {ifname}: malformed reply: {reason}")]
    Reply {
        op: &'static str,
        ifname: String,
        reason: String,
    },
    /// The kernel took the request (ACK 0) but the driver refused it: the
    /// status byte of the reply.
    #[error("DCB {op} on {ifname}: the driver refused {what}: {reason}")]
    Refused {
        op: &'static str,
        ifname: String,
        what: String,
        reason: String,
    },
}

/// The DCB operations the agent needs, per netdev.
pub trait Dcb: Send + Sync {
    fn get(&self, ifname: &str) -> Result<DcbState, DcbError>;
    fn set_dcbx(&self, ifname: &str, mode: u8) -> Result<(), DcbError>;
    fn set_pfc(&self, ifname: &str, pfc: &IeeePfc) -> Result<(), DcbError>;
    fn add_apps(&self, ifname: &str, apps: &[DcbApp]) -> Result<(), DcbError>;
    fn del_apps(&self, ifname: &str, apps: &[DcbApp]) -> Result<(), DcbError>;
}

/// Sends one netlink request and returns the payloads (after `nlmsghdr`)
/// of the replies that came before the ACK; a negative ACK is an error.
pub trait NetlinkTransport: Send {
    fn request(&mut self, msg: &MsgBuilder) -> io::Result<Vec<Vec<u8>>>;
}

/// The real transport: kroce-netlink's socket (one stack for the
/// project; it matches answers by sequence number and bounds each request).
impl NetlinkTransport for NlSocket {
    fn request(&mut self, msg: &MsgBuilder) -> io::Result<Vec<Vec<u8>>> {
        NlSocket::request(self, msg).map_err(|e| match e {
            NlError::Socket(e) => e,
            NlError::Kernel(errno) => io::Error::from_raw_os_error(errno as i32),
            other => io::Error::new(io::ErrorKind::InvalidData, other.to_string()),
        })
    }
}

/// A `NETLINK_ROUTE` socket in the caller's netns for [`NetlinkDcb`].
pub fn route_socket() -> io::Result<NlSocket> {
    NlSocket::open(nix::sys::socket::SockProtocol::NetlinkRoute).map_err(|e| match e {
        NlError::Socket(e) => e,
        other => io::Error::other(other.to_string()),
    })
}

/// [`Dcb`] over a [`NetlinkTransport`]: the real socket in production, a
/// recording one in tests.
#[derive(Debug)]
pub struct NetlinkDcb<T> {
    transport: Mutex<T>,
}

impl<T: NetlinkTransport> NetlinkDcb<T> {
    pub fn new(transport: T) -> Self {
        NetlinkDcb {
            transport: Mutex::new(transport),
        }
    }

    fn send(
        &self,
        op: &'static str,
        ifname: &str,
        msg: &MsgBuilder,
    ) -> Result<Vec<Vec<u8>>, DcbError> {
        let mut t = self.transport.lock().map_err(|_| DcbError::Io {
            op,
            ifname: ifname.to_string(),
            source: io::Error::other("netlink transport lock poisoned"),
        })?;
        t.request(msg).map_err(|source| DcbError::Io {
            op,
            ifname: ifname.to_string(),
            source,
        })
    }

    pub fn into_transport(self) -> Option<T> {
        self.transport.into_inner().ok()
    }

    /// A set: the kernel's ACK, then the driver's in-band status.
    fn set(
        &self,
        op: &'static str,
        ifname: &str,
        what: impl FnOnce() -> String,
        msg: &MsgBuilder,
        command: u8,
        status_attr: u16,
    ) -> Result<(), DcbError> {
        let replies = self.send(op, ifname, msg)?;
        match inband_status(&replies, command, status_attr) {
            None | Some(0) => Ok(()),
            Some(status) => Err(DcbError::Refused {
                op,
                ifname: ifname.to_string(),
                what: what(),
                reason: status_reason(status_attr, status),
            }),
        }
    }
}

/// `26:3, 46:5` for DSCP APP entries.
fn apps_text(apps: &[DcbApp]) -> String {
    apps.iter()
        .map(|a| format!("{}:{}", a.protocol, a.priority))
        .collect::<Vec<_>>()
        .join(", ")
}

impl<T: NetlinkTransport> Dcb for NetlinkDcb<T> {
    fn get(&self, ifname: &str) -> Result<DcbState, DcbError> {
        let replies = self.send("IEEE_GET", ifname, &get_msg(ifname))?;
        let reply = replies.first().ok_or_else(|| DcbError::Reply {
            op: "IEEE_GET",
            ifname: ifname.to_string(),
            reason: "no reply before the ACK".into(),
        })?;
        parse_get_reply(reply).map_err(|e| DcbError::Reply {
            op: "IEEE_GET",
            ifname: ifname.to_string(),
            reason: e.0,
        })
    }
    fn set_dcbx(&self, ifname: &str, mode: u8) -> Result<(), DcbError> {
        self.set(
            "SDCBX",
            ifname,
            || format!("DCBX mode {mode:#04x}"),
            &set_dcbx_msg(ifname, mode),
            cmd::SDCBX,
            attr::DCBX,
        )
    }
    fn set_pfc(&self, ifname: &str, pfc: &IeeePfc) -> Result<(), DcbError> {
        self.set(
            "IEEE_SET PFC",
            ifname,
            || format!("PFC on priorities {:08b} (pfc_en)", pfc.pfc_en),
            &set_pfc_msg(ifname, pfc),
            cmd::IEEE_SET,
            attr::IEEE,
        )
    }
    fn add_apps(&self, ifname: &str, apps: &[DcbApp]) -> Result<(), DcbError> {
        self.set(
            "IEEE_SET APP",
            ifname,
            || format!("DSCP trust (APP dscp:prio {})", apps_text(apps)),
            &apps_msg(ifname, apps, false),
            cmd::IEEE_SET,
            attr::IEEE,
        )
    }
    fn del_apps(&self, ifname: &str, apps: &[DcbApp]) -> Result<(), DcbError> {
        self.set(
            "IEEE_DEL APP",
            ifname,
            || format!("PCP trust (deleting APP dscp:prio {})", apps_text(apps)),
            &apps_msg(ifname, apps, true),
            cmd::IEEE_DEL,
            attr::IEEE,
        )
    }
}

/// A transport that records every request and answers with queued
/// replies (an ACK when none are queued).
#[cfg(any(test, feature = "testing"))]
#[derive(Debug, Default)]
pub struct RecordingTransport {
    /// Each request as sent, numbered 1, 2, ... as a fresh socket would.
    pub sent: Vec<Vec<u8>>,
    /// Reply payloads (after `nlmsghdr`) per request.
    pub replies: std::collections::VecDeque<io::Result<Vec<Vec<u8>>>>,
}

#[cfg(any(test, feature = "testing"))]
impl NetlinkTransport for RecordingTransport {
    fn request(&mut self, msg: &MsgBuilder) -> io::Result<Vec<Vec<u8>>> {
        let seq = u32::try_from(self.sent.len() + 1).unwrap_or(u32::MAX);
        self.sent.push(msg.finish(seq));
        self.replies.pop_front().unwrap_or_else(|| Ok(Vec::new()))
    }
}

/// An in-memory NIC for node-agent tests: keeps DCB state per netdev the way
/// a driver would and records every call.
#[cfg(any(test, feature = "testing"))]
#[derive(Debug, Default)]
pub struct FakeDcb {
    pub state: Mutex<std::collections::BTreeMap<String, DcbState>>,
    pub calls: Mutex<Vec<String>>,
    /// Netdevs whose driver has no dcbnl ops (EOPNOTSUPP).
    pub unsupported: Vec<String>,
}

#[cfg(any(test, feature = "testing"))]
impl FakeDcb {
    fn with<R>(
        &self,
        op: &'static str,
        ifname: &str,
        f: impl FnOnce(&mut DcbState) -> R,
    ) -> Result<R, DcbError> {
        if self.unsupported.iter().any(|u| u == ifname) {
            return Err(DcbError::Io {
                op,
                ifname: ifname.to_string(),
                source: io::Error::from_raw_os_error(libc::EOPNOTSUPP),
            });
        }
        if let Ok(mut c) = self.calls.lock() {
            c.push(format!("{op} {ifname}"));
        }
        let mut s = self.state.lock().map_err(|_| DcbError::Io {
            op,
            ifname: ifname.to_string(),
            source: io::Error::other("poisoned"),
        })?;
        let st = s.entry(ifname.to_string()).or_insert_with(|| DcbState {
            dcbx: Some(DCB_CAP_DCBX_LLD_MANAGED | DCB_CAP_DCBX_VER_IEEE),
            pfc: Some(IeeePfc {
                pfc_cap: 8,
                ..Default::default()
            }),
            apps: Vec::new(),
        });
        Ok(f(st))
    }

    pub fn calls(&self) -> Vec<String> {
        self.calls.lock().map(|c| c.clone()).unwrap_or_default()
    }
}

#[cfg(any(test, feature = "testing"))]
impl Dcb for FakeDcb {
    fn get(&self, ifname: &str) -> Result<DcbState, DcbError> {
        self.with("IEEE_GET", ifname, |s| s.clone())
    }
    fn set_dcbx(&self, ifname: &str, mode: u8) -> Result<(), DcbError> {
        self.with("SDCBX", ifname, |s| s.dcbx = Some(mode))
    }
    fn set_pfc(&self, ifname: &str, pfc: &IeeePfc) -> Result<(), DcbError> {
        self.with("IEEE_SET PFC", ifname, |s| s.pfc = Some(*pfc))
    }
    fn add_apps(&self, ifname: &str, apps: &[DcbApp]) -> Result<(), DcbError> {
        self.with("IEEE_SET APP", ifname, |s| {
            for a in apps {
                // IEEE: one priority per (selector, protocol).
                s.apps
                    .retain(|x| !(x.selector == a.selector && x.protocol == a.protocol));
                s.apps.push(*a);
            }
            s.apps.sort();
        })
    }
    fn del_apps(&self, ifname: &str, apps: &[DcbApp]) -> Result<(), DcbError> {
        self.with("IEEE_DEL APP", ifname, |s| {
            s.apps.retain(|x| !apps.contains(x))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kroce_netlink::dcb::RTM_SETDCB;
    use std::time::{Duration, Instant};

    const NLMSG_ERROR: u16 = 2;

    fn encode_set_dcbx(ifname: &str, mode: u8, seq: u32) -> Vec<u8> {
        set_dcbx_msg(ifname, mode).finish(seq)
    }
    fn encode_set_pfc(ifname: &str, pfc: &IeeePfc, seq: u32) -> Vec<u8> {
        set_pfc_msg(ifname, pfc).finish(seq)
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

    #[test]
    fn netlink_dcb_sends_through_the_transport_and_maps_errors() {
        let mut t = RecordingTransport::default();
        t.replies
            .push_back(Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP)));
        let dcb = NetlinkDcb::new(t);
        let e = dcb.set_dcbx("ens1f0", 9).unwrap_err();
        assert!(e.to_string().contains("SDCBX on ens1f0"), "{e}");
        dcb.set_pfc("ens1f0", &IeeePfc::default()).unwrap();
        let t = dcb.into_transport().unwrap();
        assert_eq!(t.sent.len(), 2);
        assert_eq!(t.sent[0], encode_set_dcbx("ens1f0", 9, 1));
        assert_eq!(t.sent[1], encode_set_pfc("ens1f0", &IeeePfc::default(), 2));
    }

    /// The kernel's reply to a set (`dcb_doit` → `dcbnl_ieee_set`): a
    /// RTM_SETDCB with the same command and a one-byte status attribute.
    fn set_reply(command: u8, seq: u32, status_attr: u16, status: u8) -> Vec<u8> {
        let mut a = Vec::new();
        push_attr(&mut a, status_attr, &[status]);
        encode(RTM_SETDCB, command, seq, &a)
    }

    fn ack(seq: u32, code: i32) -> Vec<u8> {
        let mut m = Vec::new();
        m.extend(ne32(36));
        m.extend(ne16(NLMSG_ERROR));
        m.extend(ne16(0x100));
        m.extend(ne32(seq));
        m.extend(ne32(0));
        m.extend(code.to_ne_bytes());
        m.extend([0u8; 16]);
        m
    }

    #[test]
    fn an_inband_refusal_fails_the_set_and_names_what_was_refused() {
        let mut t = RecordingTransport::default();
        // mlx5 refusing PFC: dcbnl_ieee_set puts -EINVAL in DCB_ATTR_IEEE.
        let einval = (-libc::EINVAL) as u8;
        t.replies.push_back(Ok(vec![payload(set_reply(
            cmd::IEEE_SET,
            1,
            attr::IEEE,
            einval,
        ))]));
        t.replies.push_back(Ok(vec![payload(set_reply(
            cmd::IEEE_SET,
            2,
            attr::IEEE,
            einval,
        ))]));
        t.replies.push_back(Ok(vec![payload(set_reply(
            cmd::IEEE_DEL,
            3,
            attr::IEEE,
            einval,
        ))]));
        // dcbnl_setdcbx puts the driver's u8 (mlx5: 1 = refused) in DCB_ATTR_DCBX.
        t.replies
            .push_back(Ok(vec![payload(set_reply(cmd::SDCBX, 4, attr::DCBX, 1))]));
        // Status 0: applied.
        t.replies.push_back(Ok(vec![payload(set_reply(
            cmd::IEEE_SET,
            5,
            attr::IEEE,
            0,
        ))]));
        let dcb = NetlinkDcb::new(t);
        let pfc = IeeePfc {
            pfc_en: 0b1000,
            ..Default::default()
        };
        let e = dcb.set_pfc("ens1f0", &pfc).unwrap_err();
        assert!(matches!(e, DcbError::Refused { .. }), "{e:?}");
        let msg = e.to_string();
        assert!(
            msg.contains("ens1f0") && msg.contains("PFC") && msg.contains("Invalid argument"),
            "{msg}"
        );
        let apps = [DcbApp::dscp(26, 3)];
        let e = dcb.add_apps("ens1f0", &apps).unwrap_err().to_string();
        assert!(e.contains("DSCP trust") && e.contains("26:3"), "{e}");
        let e = dcb.del_apps("ens1f0", &apps).unwrap_err().to_string();
        assert!(e.contains("IEEE_DEL") && e.contains("PCP trust"), "{e}");
        let e = dcb.set_dcbx("ens1f0", 0x09).unwrap_err().to_string();
        assert!(
            e.contains("DCBX mode 0x09") && e.contains("status 1"),
            "{e}"
        );
        dcb.set_pfc("ens1f0", &pfc).unwrap();
    }

    /// kroce-netlink's socket over a socketpair whose far end plays the kernel.
    fn pair_transport(timeout: Duration) -> (NlSocket, std::os::unix::net::UnixDatagram) {
        let (a, b) = std::os::unix::net::UnixDatagram::pair().unwrap();
        (
            NlSocket::from_fd(std::os::fd::OwnedFd::from(a), timeout).unwrap(),
            b,
        )
    }

    #[test]
    fn answers_to_another_request_are_not_taken_for_this_one() {
        let (t, kernel) = pair_transport(Duration::from_secs(5));
        let dcb = NetlinkDcb::new(t);
        let einval = (-libc::EINVAL) as u8;
        let k = std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            let n = kernel.recv(&mut buf).unwrap();
            let seq = u32::from_ne_bytes([buf[8], buf[9], buf[10], buf[11]]);
            // A late success for an earlier request, then this one's answer:
            // refused in band, ACK 0.
            kernel.send(&ack(seq.wrapping_sub(1), 0)).unwrap();
            let mut answer = set_reply(cmd::IEEE_SET, seq, attr::IEEE, einval);
            answer.extend(ack(seq, 0));
            kernel.send(&answer).unwrap();
            n
        });
        let r = dcb.set_pfc("ens1f0", &IeeePfc::default());
        assert!(k.join().unwrap() > 0);
        let e = r.unwrap_err();
        assert!(matches!(e, DcbError::Refused { .. }), "{e:?}");
    }

    #[test]
    fn a_request_nobody_answers_times_out() {
        let (t, kernel) = pair_transport(Duration::from_millis(200));
        let dcb = NetlinkDcb::new(t);
        let start = Instant::now();
        let e = dcb.set_dcbx("ens1f0", 0x09).unwrap_err();
        assert!(start.elapsed() < Duration::from_secs(3));
        match &e {
            DcbError::Io { source, .. } => {
                assert_eq!(source.kind(), io::ErrorKind::TimedOut, "{e}")
            }
            other => panic!("{other:?}"),
        }
        assert!(e.to_string().contains("SDCBX on ens1f0"), "{e}");
        drop(kernel);
    }

    /// The real socket against this kernel: a netdev that does not exist
    /// must come back ENODEV (the kernel found and read our IFNAME), and
    /// `lo`, which has no dcbnl ops, EOPNOTSUPP.
    #[test]
    fn real_socket_kernel_parses_our_request() {
        let mut t = match route_socket() {
            Ok(t) => t,
            Err(e) => {
                println!("skipped: no NETLINK_ROUTE socket here: {e}");
                return;
            }
        };
        let r = NetlinkTransport::request(&mut t, &get_msg("kroce-nodev0"));
        let code = r.as_ref().err().and_then(io::Error::raw_os_error);
        if code == Some(libc::EOPNOTSUPP) {
            println!("skipped: kernel built without CONFIG_DCB (RTM_GETDCB unsupported)");
            return;
        }
        assert_eq!(code, Some(libc::ENODEV), "{r:?}");
        let r = NetlinkTransport::request(&mut t, &get_msg("lo"));
        assert_eq!(
            r.as_ref().err().and_then(io::Error::raw_os_error),
            Some(libc::EOPNOTSUPP),
            "{r:?}"
        );
    }
}
