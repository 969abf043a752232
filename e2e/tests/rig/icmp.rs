//! An ICMP echo (what `ping` sends) from inside a netns, over a raw socket:
//! this machine has no `ping` binary, and the test should not need one.

use nix::sched::{CloneFlags, setns};
use nix::sys::socket::{
    AddressFamily, MsgFlags, SockFlag, SockProtocol, SockType, SockaddrIn, recvfrom, sendto,
    setsockopt, socket, sockopt,
};
use nix::sys::time::TimeVal;
use std::fs::File;
use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::{Duration, Instant};

/// RFC 1071 checksum.
fn checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = data
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

fn echo_request(id: u16, seq: u16) -> Vec<u8> {
    let mut p = vec![8, 0, 0, 0];
    p.extend_from_slice(&id.to_be_bytes());
    p.extend_from_slice(&seq.to_be_bytes());
    p.extend_from_slice(b"kroce-e2e-echo..");
    let c = checksum(&p);
    p[2..4].copy_from_slice(&c.to_be_bytes());
    p
}

/// Sends echo requests from the netns at `netns` to `dst` until a matching
/// reply comes back (one request per second, up to `timeout`); returns the
/// round trip of the answered one.
pub fn ping(netns: &Path, dst: Ipv4Addr, id: u16, timeout: Duration) -> io::Result<Duration> {
    let ns = File::open(netns)?;
    std::thread::scope(|s| {
        s.spawn(|| -> io::Result<Duration> {
            setns(&ns, CloneFlags::CLONE_NEWNET).map_err(io::Error::from)?;
            let fd = socket(
                AddressFamily::Inet,
                SockType::Raw,
                SockFlag::SOCK_CLOEXEC,
                SockProtocol::Icmp,
            )
            .map_err(io::Error::from)?;
            setsockopt(&fd, sockopt::ReceiveTimeout, &TimeVal::new(0, 200_000))
                .map_err(io::Error::from)?;
            let to = SockaddrIn::from(SocketAddrV4::new(dst, 0));
            let deadline = Instant::now() + timeout;
            let mut seq: u16 = 0;
            while Instant::now() < deadline {
                seq += 1;
                let sent = Instant::now();
                sendto(
                    fd.as_raw_fd(),
                    &echo_request(id, seq),
                    &to,
                    MsgFlags::empty(),
                )
                .map_err(io::Error::from)?;
                while sent.elapsed() < Duration::from_secs(1) {
                    let mut buf = [0u8; 1500];
                    let (n, from) = match recvfrom::<SockaddrIn>(fd.as_raw_fd(), &mut buf) {
                        Ok(r) => r,
                        Err(nix::errno::Errno::EAGAIN) => continue,
                        Err(e) => return Err(io::Error::from(e)),
                    };
                    // Raw IPv4 sockets deliver the IP header too.
                    let ihl = usize::from(buf[0] & 0x0f) * 4;
                    let Some(icmp) = buf.get(ihl..n) else {
                        continue;
                    };
                    let from_dst = from.is_some_and(|a| a.ip() == dst);
                    if from_dst
                        && icmp.len() >= 8
                        && icmp[0] == 0
                        && icmp[4..6] == id.to_be_bytes()
                        && icmp[6..8] == seq.to_be_bytes()
                    {
                        return Ok(sent.elapsed());
                    }
                }
            }
            Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no echo reply from {dst} within {timeout:?} ({seq} requests sent)"),
            ))
        })
        .join()
        .map_err(|_| io::Error::other("ping thread panicked"))?
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn checksum_of_a_known_packet() {
        // RFC 1071's example words 0001 f203 f4f5 f6f7 sum to ddf2 → !ddf2.
        assert_eq!(
            super::checksum(&[0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7]),
            !0xddf2
        );
    }
}
