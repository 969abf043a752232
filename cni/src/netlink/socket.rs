//! A blocking netlink socket: one request at a time, replies collected until
//! the ACK (or `NLMSG_DONE` for dumps).

use super::{
    DecodeError, MsgBuilder, NLM_F_DUMP, NLMSG_DONE, NLMSG_ERROR, error_code, split_messages,
};
use crate::netns::Netns;
use nix::errno::Errno;
use nix::sys::socket::{
    AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, bind, recv, send,
    setsockopt, sockopt,
};
use nix::sys::time::TimeVal;
use std::os::fd::{AsRawFd, OwnedFd};

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

#[derive(Debug)]
pub struct NlSocket {
    fd: OwnedFd,
    seq: u32,
    buf: Vec<u8>,
}

impl NlSocket {
    /// A socket in the calling thread's netns.
    pub fn open(proto: SockProtocol) -> Result<NlSocket, NlError> {
        let fd = nix::sys::socket::socket(
            AddressFamily::Netlink,
            SockType::Raw,
            SockFlag::SOCK_CLOEXEC,
            proto,
        )
        .map_err(|e| NlError::Socket(e.into()))?;
        bind(fd.as_raw_fd(), &NetlinkAddr::new(0, 0)).map_err(|e| NlError::Socket(e.into()))?;
        // A kernel that never answers must not hang the runtime.
        setsockopt(&fd, sockopt::ReceiveTimeout, &TimeVal::new(10, 0))
            .map_err(|e| NlError::Socket(e.into()))?;
        Ok(NlSocket {
            fd,
            seq: 1,
            buf: vec![0; 64 * 1024],
        })
    }

    /// A socket bound to `ns` (created on a helper thread inside it).
    pub fn open_in(ns: &Netns, proto: SockProtocol) -> Result<NlSocket, NlError> {
        ns.run_in(|| NlSocket::open(proto).map_err(std::io::Error::other))
            .map_err(NlError::Socket)
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
        let mut replies = Vec::new();
        loop {
            let len = self.recv_datagram()?;
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
                        if !dump
                            && m.flags & super::NLM_F_MULTI == 0
                            && msg.flags() & super::NLM_F_ACK == 0
                        {
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
