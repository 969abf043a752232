//! A blocking netlink socket. Either it asks: one request at a time,
//! replies collected until the ACK (or `NLMSG_DONE` for dumps); or it
//! listens: subscribed to multicast groups, it receives what the kernel
//! sends unasked, one datagram per call.

use crate::netns::Netns;
use crate::{
    DecodeError, MsgBuilder, NLM_F_ACK, NLM_F_DUMP, NLM_F_MULTI, NLMSG_DONE, NLMSG_ERROR,
    error_code, split_messages,
};
use nix::errno::Errno;
use nix::sys::socket::{
    AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, bind, recv, send,
    setsockopt, sockopt,
};
use nix::sys::time::TimeVal;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum NlError {
    #[error("netlink socket: {0}")]
    Socket(std::io::Error),
    #[error("{0}")]
    Kernel(Errno),
    #[error(transparent)]
    Decode(#[from] DecodeError),
}

impl NlError {
    pub fn errno(&self) -> Option<Errno> {
        match self {
            NlError::Kernel(e) => Some(*e),
            NlError::Socket(e) => e.raw_os_error().map(Errno::from_raw),
            NlError::Decode(_) => None,
        }
    }
}

/// How long one request waits for its answer: a kernel (or driver) that
/// never answers must not hang the caller.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug)]
pub struct NlSocket {
    fd: OwnedFd,
    seq: u32,
    buf: Vec<u8>,
    timeout: Duration,
}

/// A netlink socket of `proto` in the calling thread's netns, bound with
/// the multicast `groups` mask (0: none).
fn bound(proto: SockProtocol, groups: u32) -> Result<OwnedFd, NlError> {
    let fd = nix::sys::socket::socket(
        AddressFamily::Netlink,
        SockType::Raw,
        SockFlag::SOCK_CLOEXEC,
        proto,
    )
    .map_err(|e| NlError::Socket(e.into()))?;
    bind(fd.as_raw_fd(), &NetlinkAddr::new(0, groups)).map_err(|e| NlError::Socket(e.into()))?;
    Ok(fd)
}

impl NlSocket {
    /// A socket in the calling thread's netns.
    pub fn open(proto: SockProtocol) -> Result<NlSocket, NlError> {
        NlSocket::from_fd(bound(proto, 0)?, REPLY_TIMEOUT)
    }

    /// Over an open datagram socket (a netlink one, or in tests a
    /// socketpair whose far end plays the kernel); each request fails with
    /// `TimedOut` when no answer to it came within `timeout`.
    pub fn from_fd(fd: OwnedFd, timeout: Duration) -> Result<NlSocket, NlError> {
        let tv = TimeVal::new(
            i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX),
            i64::from(timeout.subsec_micros()),
        );
        setsockopt(&fd, sockopt::ReceiveTimeout, &tv).map_err(|e| NlError::Socket(e.into()))?;
        Ok(NlSocket {
            fd,
            seq: 1,
            buf: vec![0; 64 * 1024],
            timeout,
        })
    }

    /// A socket bound to `ns` (created on a helper thread inside it).
    pub fn open_in(ns: &Netns, proto: SockProtocol) -> Result<NlSocket, NlError> {
        ns.run_in(|| NlSocket::open(proto).map_err(std::io::Error::other))
            .map_err(NlError::Socket)
    }

    /// A socket in the calling thread's netns that receives the kernel's
    /// notifications to `groups`: multicast group numbers (`RTNLGRP_*` for
    /// `NETLINK_ROUTE`, 1 for kernel uevents), 1 to 32, bound as the
    /// `nl_groups` mask (every group the project listens to fits; a higher
    /// one would need `NETLINK_ADD_MEMBERSHIP`). Each
    /// [`NlSocket::recv_unsolicited`] waits up to `poll`.
    pub fn subscribe(
        proto: SockProtocol,
        groups: &[u32],
        poll: Duration,
    ) -> Result<NlSocket, NlError> {
        let mut mask = 0u32;
        for g in groups {
            if !(1..=32).contains(g) {
                return Err(NlError::Socket(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("netlink multicast group {g}: only groups 1 to 32 can be bound"),
                )));
            }
            mask |= 1 << (g - 1);
        }
        let fd = bound(proto, mask)?;
        NlSocket::from_fd(fd, poll)
    }

    /// [`NlSocket::subscribe`] in `ns` (created on a helper thread inside
    /// it; the socket keeps listening there).
    pub fn subscribe_in(
        ns: &Netns,
        proto: SockProtocol,
        groups: &[u32],
        poll: Duration,
    ) -> Result<NlSocket, NlError> {
        ns.run_in(|| NlSocket::subscribe(proto, groups, poll).map_err(std::io::Error::other))
            .map_err(NlError::Socket)
    }

    /// Asks for a receive buffer of `bytes`: room for a burst of
    /// notifications between two reads. The kernel caps it at
    /// `net.core.rmem_max` without `CAP_NET_ADMIN`.
    pub fn set_recv_buffer(&self, bytes: usize) -> Result<(), NlError> {
        setsockopt(&self.fd, sockopt::RcvBuf, &bytes).map_err(|e| NlError::Socket(e.into()))
    }

    /// Sends `msg` numbered `seq` and returns at once: on a listening socket
    /// its answers arrive among the notifications, told apart by `seq`
    /// (notifications carry 0).
    pub fn send(&self, msg: &MsgBuilder, seq: u32) -> Result<(), NlError> {
        send(self.fd.as_raw_fd(), &msg.finish(seq), MsgFlags::empty())
            .map(drop)
            .map_err(|e| NlError::Socket(e.into()))
    }

    /// Waits for one datagram the kernel sends unasked (a notification, or
    /// an answer to [`NlSocket::send`]), whole; `None` when none came
    /// within the socket's timeout. A receive buffer that overran (the
    /// kernel dropped notifications) is `NlError::Socket` with `ENOBUFS`.
    pub fn recv_unsolicited(&mut self) -> Result<Option<&[u8]>, NlError> {
        match self.recv_datagram() {
            Ok(len) => Ok(Some(&self.buf[..len])),
            Err(NlError::Socket(e))
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Sends `msg` and returns the payloads of the replies (none for a plain
    /// ACK). Dumps end at `NLMSG_DONE`, other requests at their ACK.
    pub fn request(&mut self, msg: &MsgBuilder) -> Result<Vec<Vec<u8>>, NlError> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let bytes = msg.finish(seq);
        let dump = msg.flags() & NLM_F_DUMP == NLM_F_DUMP;
        send(self.fd.as_raw_fd(), &bytes, MsgFlags::empty())
            .map_err(|e| NlError::Socket(e.into()))?;
        let deadline = Instant::now() + self.timeout;
        let timed_out = |timeout: Duration| {
            NlError::Socket(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no netlink answer to request {seq} within {timeout:?}"),
            ))
        };
        let mut replies = Vec::new();
        loop {
            // Answers to earlier (timed-out) requests keep coming: still
            // bounded by this request's deadline.
            if Instant::now() >= deadline {
                return Err(timed_out(self.timeout));
            }
            let len = match self.recv_datagram() {
                Err(NlError::Socket(e))
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(timed_out(self.timeout));
                }
                other => other?,
            };
            for m in split_messages(&self.buf[..len])? {
                if m.seq != seq {
                    continue;
                }
                match m.msg_type {
                    NLMSG_ERROR => {
                        let code = error_code(m.payload)?;
                        if code == 0 {
                            return Ok(replies);
                        }
                        return Err(NlError::Kernel(Errno::from_raw(-code)));
                    }
                    NLMSG_DONE => {
                        // A dump error travels in DONE's payload.
                        if let Ok(code) = error_code(m.payload)
                            && code < 0
                        {
                            return Err(NlError::Kernel(Errno::from_raw(-code)));
                        }
                        return Ok(replies);
                    }
                    _ => {
                        replies.push(m.payload.to_vec());
                        if !dump && m.flags & NLM_F_MULTI == 0 && msg.flags() & NLM_F_ACK == 0 {
                            return Ok(replies);
                        }
                    }
                }
            }
        }
    }

    /// Receives one datagram whole, growing the buffer when needed.
    fn recv_datagram(&mut self) -> Result<usize, NlError> {
        let fd = self.fd.as_raw_fd();
        let want = loop {
            match recv(fd, &mut self.buf, MsgFlags::MSG_PEEK | MsgFlags::MSG_TRUNC) {
                Ok(n) => break n,
                Err(Errno::EINTR) => continue,
                Err(e) => return Err(NlError::Socket(e.into())),
            }
        };
        if want > self.buf.len() {
            self.buf.resize(want, 0);
        }
        loop {
            match recv(fd, &mut self.buf, MsgFlags::empty()) {
                Ok(n) => return Ok(n),
                Err(Errno::EINTR) => continue,
                Err(e) => return Err(NlError::Socket(e.into())),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::NLM_F_REQUEST;
    use crate::testing::{FakeKernel, ack};

    fn pair(timeout: Duration) -> (NlSocket, FakeKernel) {
        FakeKernel::pair(timeout).unwrap()
    }

    fn seq_of(kernel: &FakeKernel) -> u32 {
        crate::testing::seq_of(&kernel.next_request().unwrap())
    }

    #[test]
    fn answers_to_another_request_are_not_taken_for_this_one() {
        let (mut s, kernel) = pair(Duration::from_secs(5));
        let k = std::thread::spawn(move || {
            let seq = seq_of(&kernel);
            // A late refusal of an earlier request, then this one's reply
            // and ACK in one datagram.
            kernel.send(&ack(seq.wrapping_sub(1), -22)).unwrap();
            let mut answer = MsgBuilder::new(79, 0)
                .family_header(&[0, 20, 0, 0])
                .finish(seq);
            answer.extend(ack(seq, 0));
            kernel.send(&answer).unwrap();
        });
        let r = s.request(&MsgBuilder::new(79, NLM_F_REQUEST | NLM_F_ACK));
        k.join().unwrap();
        assert_eq!(r.unwrap(), vec![vec![0, 20, 0, 0]]);
    }

    #[test]
    fn a_request_nobody_answers_times_out() {
        let (mut s, _kernel) = pair(Duration::from_millis(200));
        let start = Instant::now();
        let e = s
            .request(&MsgBuilder::new(79, NLM_F_REQUEST | NLM_F_ACK))
            .unwrap_err();
        assert!(start.elapsed() < Duration::from_secs(3));
        match &e {
            NlError::Socket(io) => assert_eq!(io.kind(), std::io::ErrorKind::TimedOut, "{e}"),
            other => panic!("{other:?}"),
        }
        // Only answers to other requests: still a timeout, not a success.
        let (mut s, kernel) = pair(Duration::from_millis(200));
        let stale = std::thread::spawn(move || {
            let seq = seq_of(&kernel);
            let _ = kernel.send(&ack(seq.wrapping_add(100), 0));
            kernel
        });
        let r = s.request(&MsgBuilder::new(79, NLM_F_REQUEST | NLM_F_ACK));
        let _kernel = stale.join().unwrap();
        assert!(
            matches!(&r, Err(NlError::Socket(io)) if io.kind() == std::io::ErrorKind::TimedOut),
            "a stale ACK ended the request: {r:?}"
        );
    }

    #[test]
    fn unsolicited_datagrams_come_whole_and_silence_is_none() {
        let (mut s, kernel) = pair(Duration::from_millis(200));
        assert!(matches!(s.recv_unsolicited(), Ok(None)));
        // Bigger than the 64 KiB the socket starts with: grown, not cut.
        let big = vec![7u8; 100 * 1024];
        kernel.send(&big).unwrap();
        assert_eq!(
            s.recv_unsolicited().unwrap().map(<[u8]>::len),
            Some(big.len())
        );
        // `send` numbers the message and does not wait for an answer.
        s.send(&MsgBuilder::new(18, NLM_F_REQUEST), 0x6b72_6f63)
            .unwrap();
        assert_eq!(seq_of(&kernel), 0x6b72_6f63);
    }

    #[test]
    fn groups_beyond_the_bind_mask_are_refused() {
        for g in [0, 33] {
            let e =
                NlSocket::subscribe(SockProtocol::NetlinkRoute, &[1, g], Duration::from_secs(1))
                    .unwrap_err();
            assert!(e.to_string().contains(&format!("group {g}")), "{e}");
        }
    }
}
