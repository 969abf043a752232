//! RDMA devices across network namespaces (NETLINK_RDMA). Needs an RDMA
//! stack: the real sockets are written for it; tests put a recording model
//! of the kernel (`testing` feature) behind the same [`NetlinkRdma`] logic
//! and compare the exact bytes and the netns each request came from.

use kroce_netlink::netns::Netns;
use kroce_netlink::rdma::{self as msgs, RdmaNetnsMode};
use kroce_netlink::{MsgBuilder, NlError, NlSocket};
use nix::errno::Errno;
use nix::sys::socket::SockProtocol;
use std::os::fd::AsRawFd;

#[derive(Debug, thiserror::Error)]
pub enum RdmaError {
    #[error("RDMA netlink is not available in netns {netns} (no RDMA stack loaded?): {source}")]
    Unavailable {
        netns: String,
        #[source]
        source: NlError,
    },
    #[error("cannot enter netns {netns} to send RDMA netlink requests from there: {source}")]
    EnterNetns {
        netns: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{op} RDMA device {device}: {source}")]
    Netlink {
        op: String,
        device: String,
        #[source]
        source: NlError,
    },
}

/// Whether a move happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Moved {
    Yes,
    /// The device is not in the source netns (already moved, or gone).
    NotFound,
}

pub trait RdmaControl {
    /// The host's RDMA netns mode.
    fn netns_mode(&mut self) -> Result<RdmaNetnsMode, RdmaError>;
    /// Whether `device` is visible in `ns`.
    fn present(&mut self, ns: &Netns, device: &str) -> Result<bool, RdmaError>;
    /// Moves `device` from `from` into `to`.
    fn move_device(&mut self, device: &str, from: &Netns, to: &Netns) -> Result<Moved, RdmaError>;
    /// Creates soft RDMA device `device` of `link_type` (`rxe`, `siw`) over
    /// netdev `netdev` of `ns`, sent from a thread inside `ns` (what `ip
    /// netns exec NS rdma link add DEVICE type TYPE netdev NETDEV` does).
    fn add_link(
        &mut self,
        ns: &Netns,
        device: &str,
        link_type: &str,
        netdev: &str,
    ) -> Result<(), RdmaError>;
}

/// How long a NEWLINK waits for the name to be free: the kernel unregisters
/// an rxe whose netdev left its netns from a work queue, so the old device
/// of that name can still exist for a moment after the move.
const NAME_FREE_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// One NETLINK_RDMA socket. Only the thread that opened it sends on it:
/// the kernel judges some requests by the sending thread's netns.
pub trait RdmaSocket: Send {
    /// Sends `msg`; the reply payloads (see [`NlSocket::request`]).
    fn request(&mut self, msg: &MsgBuilder) -> Result<Vec<Vec<u8>>, NlError>;
}

/// Where NETLINK_RDMA sockets come from: `open` makes one in the calling
/// thread's netns. `Send`: it is used from a helper thread inside the netns
/// a request is about.
pub trait RdmaSockets: Send {
    fn open(&mut self) -> Result<Box<dyn RdmaSocket + '_>, NlError>;
}

impl RdmaSocket for NlSocket {
    fn request(&mut self, msg: &MsgBuilder) -> Result<Vec<Vec<u8>>, NlError> {
        NlSocket::request(self, msg)
    }
}

/// The kernel's NETLINK_RDMA.
#[derive(Debug, Clone, Copy, Default)]
pub struct KernelRdmaSockets;

impl RdmaSockets for KernelRdmaSockets {
    fn open(&mut self) -> Result<Box<dyn RdmaSocket + '_>, NlError> {
        Ok(Box::new(NlSocket::open(SockProtocol::NetlinkRDMA)?))
    }
}

impl<S: RdmaSockets + ?Sized> RdmaSockets for &mut S {
    fn open(&mut self) -> Result<Box<dyn RdmaSocket + '_>, NlError> {
        (**self).open()
    }
}

/// The implementation: every request is sent from a thread inside the
/// netns it is about, on a socket that thread opened.
#[derive(Debug)]
pub struct NetlinkRdma<S = KernelRdmaSockets> {
    host: Option<Netns>,
    sockets: S,
}

impl NetlinkRdma {
    /// `host`: where the netns mode is asked (`None`: the calling thread's).
    pub fn new(host: Option<Netns>) -> NetlinkRdma {
        NetlinkRdma::with_sockets(host, KernelRdmaSockets)
    }
}

/// Runs `f` on a thread in `ns` (the calling thread when it is there).
fn in_netns<T: Send>(
    ns: Option<&Netns>,
    f: impl FnOnce() -> Result<T, RdmaError> + Send,
) -> Result<T, RdmaError> {
    match ns {
        None => f(),
        Some(ns) => ns
            .run_in(|| Ok(f()))
            .map_err(|source| RdmaError::EnterNetns {
                netns: ns.path().display().to_string(),
                source,
            })?,
    }
}

fn label(ns: Option<&Netns>) -> String {
    ns.map(|n| n.path().display().to_string())
        .unwrap_or_else(|| "of this process".into())
}

impl<S: RdmaSockets> NetlinkRdma<S> {
    pub fn with_sockets(host: Option<Netns>, sockets: S) -> NetlinkRdma<S> {
        NetlinkRdma { host, sockets }
    }

    pub fn sockets(&self) -> &S {
        &self.sockets
    }

    fn socket<'s>(
        sockets: &'s mut S,
        ns: Option<&Netns>,
    ) -> Result<Box<dyn RdmaSocket + 's>, RdmaError> {
        sockets.open().map_err(|source| RdmaError::Unavailable {
            netns: label(ns),
            source,
        })
    }

    fn find(sock: &mut dyn RdmaSocket, device: &str) -> Result<Option<u32>, RdmaError> {
        let replies = sock
            .request(&msgs::dump_devices())
            .map_err(|source| RdmaError::Netlink {
                op: "list devices to find".into(),
                device: device.into(),
                source,
            })?;
        for p in replies {
            let (index, name) = msgs::parse_device(&p).map_err(|e| RdmaError::Netlink {
                op: "decode".into(),
                device: device.into(),
                source: e.into(),
            })?;
            if name == device {
                return Ok(Some(index));
            }
        }
        Ok(None)
    }
}

impl<S: RdmaSockets> RdmaControl for NetlinkRdma<S> {
    fn netns_mode(&mut self) -> Result<RdmaNetnsMode, RdmaError> {
        let host = self.host.as_ref();
        let sockets = &mut self.sockets;
        in_netns(host, || {
            let mut sock = Self::socket(sockets, host)?;
            let replies = sock
                .request(&msgs::sys_get())
                .map_err(|source| RdmaError::Netlink {
                    op: "read the netns mode (SYS_GET) for".into(),
                    device: "(system)".into(),
                    source,
                })?;
            let first = replies.first().ok_or_else(|| RdmaError::Netlink {
                op: "read the netns mode (SYS_GET) for".into(),
                device: "(system)".into(),
                source: NlError::Kernel(Errno::ENODATA),
            })?;
            msgs::parse_netns_mode(first).map_err(|e| RdmaError::Netlink {
                op: "decode the netns mode for".into(),
                device: "(system)".into(),
                source: e.into(),
            })
        })
    }

    fn present(&mut self, ns: &Netns, device: &str) -> Result<bool, RdmaError> {
        let sockets = &mut self.sockets;
        in_netns(Some(ns), || {
            let mut sock = Self::socket(sockets, Some(ns))?;
            Ok(Self::find(sock.as_mut(), device)?.is_some())
        })
    }

    fn add_link(
        &mut self,
        ns: &Netns,
        device: &str,
        link_type: &str,
        netdev: &str,
    ) -> Result<(), RdmaError> {
        let sockets = &mut self.sockets;
        in_netns(Some(ns), || {
            let mut sock = Self::socket(sockets, Some(ns))?;
            let msg = msgs::new_link(device, link_type, netdev);
            let start = std::time::Instant::now();
            loop {
                match sock.request(&msg) {
                    Ok(_) => return Ok(()),
                    Err(NlError::Kernel(Errno::EEXIST | Errno::ENFILE))
                        if start.elapsed() < NAME_FREE_WAIT =>
                    {
                        std::thread::sleep(std::time::Duration::from_millis(50));
                    }
                    Err(source) => {
                        return Err(RdmaError::Netlink {
                            op: format!(
                                "create (type {link_type}, netdev {netdev}, netns {})",
                                ns.path().display()
                            ),
                            device: device.into(),
                            source,
                        });
                    }
                }
            }
        })
    }

    fn move_device(&mut self, device: &str, from: &Netns, to: &Netns) -> Result<Moved, RdmaError> {
        let fd = u32::try_from(to.fd().as_raw_fd()).unwrap_or_default();
        let sockets = &mut self.sockets;
        // The kernel looks the device up in the socket's netns and then
        // (nldev_set_doit -> ib_device_set_netns_put ->
        // rdma_dev_change_netns(dev, current->nsproxy->net_ns, net)) refuses
        // with ENODEV unless the SENDING THREAD is in the device's current
        // netns. So the lookup and the move both run on a thread inside
        // `from`, as `ip netns exec FROM rdma dev set DEV netns TO` does;
        // a socket opened there but written from the host thread only
        // works for host -> pod.
        in_netns(Some(from), || {
            let mut sock = Self::socket(sockets, Some(from))?;
            let Some(index) = Self::find(sock.as_mut(), device)? else {
                return Ok(Moved::NotFound);
            };
            sock.request(&msgs::set_netns(index, fd))
                .map(|_| Moved::Yes)
                .map_err(|source| RdmaError::Netlink {
                    op: format!("move to netns {}", to.path().display()),
                    device: device.into(),
                    source,
                })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Answers NEWLINK with the scripted errnos, then success.
    struct Scripted {
        errnos: Vec<Errno>,
        sent: Vec<Vec<u8>>,
    }
    struct ScriptedSocket<'a>(&'a mut Scripted);
    impl RdmaSocket for ScriptedSocket<'_> {
        fn request(&mut self, msg: &MsgBuilder) -> Result<Vec<Vec<u8>>, NlError> {
            self.0.sent.push(msg.payload().to_vec());
            match self.0.errnos.pop() {
                Some(e) => Err(NlError::Kernel(e)),
                None => Ok(Vec::new()),
            }
        }
    }
    impl RdmaSockets for Scripted {
        fn open(&mut self) -> Result<Box<dyn RdmaSocket + '_>, NlError> {
            Ok(Box::new(ScriptedSocket(self)))
        }
    }

    /// The kernel unregisters the rxe whose netdev moved from a work queue:
    /// for a moment its name is still taken (ENFILE), and NEWLINK waits for
    /// it; any other refusal fails at once, naming the device and netdev.
    #[test]
    fn new_link_waits_for_the_old_name_to_be_free() {
        let here = Netns::current().unwrap();
        let mut r = NetlinkRdma::with_sockets(
            None,
            Scripted {
                errnos: vec![Errno::ENFILE, Errno::ENFILE],
                sent: Vec::new(),
            },
        );
        r.add_link(&here, "rxe_vf0", "rxe", "net1").unwrap();
        assert_eq!(r.sockets().sent.len(), 3);
        assert_eq!(
            r.sockets().sent[0],
            msgs::new_link("rxe_vf0", "rxe", "net1").payload()
        );
        let mut r = NetlinkRdma::with_sockets(
            None,
            Scripted {
                errnos: vec![Errno::ENODEV],
                sent: Vec::new(),
            },
        );
        let e = r.add_link(&here, "rxe_vf0", "rxe", "net1").unwrap_err();
        assert_eq!(r.sockets().sent.len(), 1);
        let m = e.to_string();
        assert!(m.contains("rxe_vf0") && m.contains("net1"), "{m}");
    }
}
