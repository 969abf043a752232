//! A kernel for tests: the far end of a socketpair under an [`NlSocket`].
//! It records what the socket sends and answers as a test tells it to: a
//! reply, an ACK carrying an errno, a stale answer to another request, or
//! silence (the socket's deadline then fires). Tests of kroce-netlink and
//! of its users drive the real request/answer matching through it.

use crate::NLMSG_ERROR;
use crate::socket::NlSocket;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixDatagram;
use std::time::Duration;

/// The far end: what the kernel would be.
#[derive(Debug)]
pub struct FakeKernel {
    end: UnixDatagram,
}

impl FakeKernel {
    /// A socket whose requests time out after `timeout`, and its kernel.
    pub fn pair(timeout: Duration) -> io::Result<(NlSocket, FakeKernel)> {
        let (a, b) = UnixDatagram::pair()?;
        let socket = NlSocket::from_fd(OwnedFd::from(a), timeout)
            .map_err(|e| io::Error::other(e.to_string()))?;
        b.set_read_timeout(Some(Duration::from_secs(5)))?;
        Ok((socket, FakeKernel { end: b }))
    }

    /// The next message the socket sent, whole (waits up to 5 s).
    pub fn next_request(&self) -> io::Result<Vec<u8>> {
        let mut buf = vec![0u8; 64 * 1024];
        let n = self.end.recv(&mut buf)?;
        if n < 16 {
            return Err(io::Error::other(format!(
                "{n} bytes: not a netlink message"
            )));
        }
        buf.truncate(n);
        Ok(buf)
    }

    /// Sends one datagram to the socket (several messages may share it).
    pub fn send(&self, datagram: &[u8]) -> io::Result<()> {
        self.end.send(datagram).map(|_| ())
    }
}

/// The sequence number in a message's `nlmsghdr` (0 when too short).
pub fn seq_of(msg: &[u8]) -> u32 {
    msg.get(8..12)
        .and_then(|b| b.try_into().ok())
        .map(u32::from_ne_bytes)
        .unwrap_or(0)
}

/// The kernel's `NLMSG_ERROR` for request `seq`: `errno` 0 is an ACK, a
/// negative one a refusal (`-libc::EINVAL` style, as the kernel sends).
pub fn ack(seq: u32, errno: i32) -> Vec<u8> {
    let mut m = Vec::with_capacity(36);
    m.extend(36u32.to_ne_bytes());
    m.extend(NLMSG_ERROR.to_ne_bytes());
    m.extend(0x100u16.to_ne_bytes());
    m.extend(seq.to_ne_bytes());
    m.extend(0u32.to_ne_bytes());
    m.extend(errno.to_ne_bytes());
    m.extend([0u8; 16]);
    m
}
