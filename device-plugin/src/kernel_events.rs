//! Edge: the kernel's own change notifications, so health and rediscovery
//! follow the host within milliseconds instead of waiting for a rescan tick.
//!
//! Two netlink sockets, opened in the network namespace of the thread that
//! calls [`spawn`] (the host's: the chart runs the plugin with `hostNetwork`):
//! - `NETLINK_ROUTE` bound to `RTNLGRP_LINK`: `RTM_NEWLINK` / `RTM_DELLINK`
//!   for links going up or down (carrier, operstate, flags), renamed or gone,
//!   and `RTNLGRP_IPV4_IFADDR`/`RTNLGRP_IPV6_IFADDR` (RoCE v2 GIDs follow
//!   a netdev's addresses);
//! - `NETLINK_KOBJECT_UEVENT` group 1 (the kernel's uevents, not udev's):
//!   PCI functions added, removed, bound or changed (`sriov_numvfs`), RDMA
//!   devices and their char devices (`infiniband`, `infiniband_verbs`,
//!   `infiniband_mad`) and `net` devices added, removed or renamed (`move`).
//!
//! Neither needs a capability: both families let any process listen
//! (`NL_CFG_F_NONROOT_RECV`). Both are kroce-netlink's blocking sockets,
//! each read on a thread of its own that hands what it receives to an async
//! task over a channel; the task judges and wakes.
//!
//! Which uevents a namespace gets (lib/kobject_uevent.c,
//! `kobject_uevent_net_broadcast`): an event of a device whose class is
//! tagged with a network namespace — `net` devices, and `infiniband` devices
//! (drivers/infiniband/core/device.c `ib_class`: their RDMA netns, the
//! initial one unless moved in exclusive mode) — goes only to that
//! namespace's socket (`uevent_net_broadcast_tagged`); every other event
//! (PCI functions, uverbs/umad char devices) goes to every namespace owned by
//! the initial user namespace (`uevent_net_broadcast_untagged` over
//! `uevent_sock_list`, which `uevent_net_init` fills only with such
//! namespaces). The host netns is the initial one, so there the plugin sees
//! every event it needs; a VF netdev moved into a pod's netns is no longer
//! ours to watch anyway. Inside a user namespace (not the chart's setup) no
//! uevent would arrive: the safety rescan covers that.
//!
//! Whether an event concerns us is decided by pure functions ([`parse_uevent`],
//! [`uevent_concerns`], [`parse_links`], [`link_concerns`]) against the
//! [`Interest`] the last scan left; each event that does wakes one
//! [`Notify`], so a burst (64 VFs appearing) costs one or two rescans.

use kroce_netlink::route::{
    IFLA_IFNAME, IFLA_PARENT_DEV_BUS_NAME, RTM_DELADDR, RTM_DELLINK, RTM_NEWADDR, RTM_NEWLINK,
    RTNLGRP_IPV4_IFADDR, RTNLGRP_IPV6_IFADDR, RTNLGRP_LINK,
};
use kroce_netlink::{DecodeError, NlError, NlSocket, SockProtocol, attrs, read_str, read_u32};
use std::collections::BTreeSet;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::{Notify, mpsc, watch};
use tokio::task::JoinHandle;

/// Links and addresses (include/uapi/linux/rtnetlink.h). Addresses make
/// RoCE v2 GIDs.
const RTNL_GROUPS: [u32; 3] = [RTNLGRP_LINK, RTNLGRP_IPV4_IFADDR, RTNLGRP_IPV6_IFADDR];
/// The kernel's uevent multicast group (udev re-broadcasts on group 2).
const UEVENT_KERNEL_GROUP: u32 = 1;
/// Room for a burst between two reads; a full buffer loses events (ENOBUFS),
/// which itself triggers a rescan.
const RCVBUF: usize = 1 << 20;
/// How long a reader thread waits for a datagram before it checks whether
/// the listener is gone (then it ends).
const POLL: Duration = Duration::from_secs(1);
/// Datagrams in flight from a reader thread to its task. A task that falls
/// behind blocks the thread, the kernel's buffer fills and overruns: a
/// rescan, as for a burst.
const CHANNEL: usize = 64;
/// The sequence number of our own link dump request: kernel notifications
/// carry 0, so the dump's answers are told apart by it.
const DUMP_SEQ: u32 = 0x6b72_6f63;

/// What the last scan found that link and `net` events can be about: the
/// netdevs of candidate devices and every netdev with a PCI function, by name
/// and ifindex (a rename keeps the ifindex).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Interest {
    pub names: BTreeSet<String>,
    pub ifindexes: BTreeSet<u32>,
}

impl Interest {
    /// `names`: the netdevs candidates use (a soft RDMA device's veth has no
    /// PCI function but is ours). Every PCI netdev of `host` is added.
    pub fn new<'a>(
        names: impl IntoIterator<Item = &'a str>,
        host: &sriov_helpers::Host,
    ) -> Interest {
        let mut names: BTreeSet<String> = names.into_iter().map(str::to_string).collect();
        names.extend(
            host.netdevs
                .values()
                .filter(|n| n.pci.is_some())
                .map(|n| n.name.clone()),
        );
        let ifindexes = names
            .iter()
            .filter_map(|n| host.netdevs.get(n).and_then(|d| d.ifindex))
            .collect();
        Interest { names, ifindexes }
    }
}

/// One kernel uevent: `ACTION@DEVPATH\0KEY=VALUE\0...`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Uevent {
    pub action: String,
    pub devpath: String,
    pub subsystem: String,
    /// `INTERFACE=` of a `net` event.
    pub interface: Option<String>,
    /// `DEVPATH_OLD=` of a `move` (rename) event.
    pub devpath_old: Option<String>,
}

/// `None` for what is not a kernel uevent (udev's `libudev` messages, or a
/// payload without ACTION, DEVPATH and SUBSYSTEM).
pub fn parse_uevent(buf: &[u8]) -> Option<Uevent> {
    let mut ev = Uevent::default();
    // The first field is the `action@devpath` summary; the keys follow.
    for field in buf.split(|b| *b == 0).skip(1) {
        let Ok(field) = std::str::from_utf8(field) else {
            continue;
        };
        let Some((key, value)) = field.split_once('=') else {
            continue;
        };
        match key {
            "ACTION" => ev.action = value.to_string(),
            "DEVPATH" => ev.devpath = value.to_string(),
            "SUBSYSTEM" => ev.subsystem = value.to_string(),
            "INTERFACE" => ev.interface = Some(value.to_string()),
            "DEVPATH_OLD" => ev.devpath_old = Some(value.to_string()),
            _ => {}
        }
    }
    let summary = buf.split(|b| *b == 0).next()?;
    if !summary.contains(&b'@') || ev.action.is_empty() || ev.devpath.is_empty() {
        return None;
    }
    if ev.subsystem.is_empty() {
        return None;
    }
    Some(ev)
}

/// PCI functions (VFs appearing with `sriov_numvfs`, drivers binding), RDMA
/// devices and their char devices always; `net` devices when they sit on a
/// PCI function or are ones we know (by new or old name). Queues, virtual
/// netdevs of pods and every other subsystem do not.
pub fn uevent_concerns(ev: &Uevent, interest: &Interest) -> bool {
    match ev.subsystem.as_str() {
        "pci" | "infiniband" | "infiniband_verbs" | "infiniband_mad" => true,
        "net" => {
            let last = |p: &str| p.rsplit('/').next().map(str::to_string);
            let known = [
                ev.interface.clone(),
                last(&ev.devpath),
                ev.devpath_old.as_deref().and_then(last),
            ]
            .into_iter()
            .flatten()
            .any(|n| interest.names.contains(&n));
            ev.devpath.starts_with("/devices/pci") || known
        }
        _ => false,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    NewLink,
    /// Gone from this namespace: deleted or moved out.
    DelLink,
    /// An address added or removed: the RoCE GID table follows.
    Address,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkEvent {
    pub change: Change,
    pub ifindex: u32,
    pub name: Option<String>,
    /// `IFLA_PARENT_DEV_BUS_NAME` (kernel 5.14+): `pci` for a VF or PF netdev.
    pub parent_bus: Option<String>,
    /// An answer to our own link dump (the links there were at start), not
    /// a change: it only teaches names.
    pub from_dump: bool,
}

/// One `RTM_NEWLINK`/`RTM_DELLINK` (`ifinfomsg` + attributes) or
/// `RTM_NEWADDR`/`RTM_DELADDR` (`ifaddrmsg`): both headers carry the
/// ifindex at bytes 4..8.
fn link_event(payload: &[u8], change: Change, from_dump: bool) -> Result<LinkEvent, DecodeError> {
    let ifindex = payload
        .get(4..8)
        .and_then(read_u32)
        .ok_or_else(|| DecodeError(format!("short header of a {change:?} event")))?;
    let mut ev = LinkEvent {
        change,
        ifindex,
        name: None,
        parent_bus: None,
        from_dump,
    };
    if change == Change::Address {
        return Ok(ev);
    }
    let body = payload
        .get(16..)
        .ok_or_else(|| DecodeError("short ifinfomsg".into()))?;
    for a in attrs(body) {
        let (ty, p) = a?;
        match ty {
            IFLA_IFNAME => ev.name = Some(read_str(p)),
            IFLA_PARENT_DEV_BUS_NAME => ev.parent_bus = Some(read_str(p)),
            _ => {}
        }
    }
    Ok(ev)
}

/// The link and address events in one datagram (it may hold several
/// messages). An error names what could not be decoded; the caller rescans
/// then.
pub fn parse_links(buf: &[u8]) -> Result<Vec<LinkEvent>, DecodeError> {
    let mut out = Vec::new();
    for m in kroce_netlink::split_messages(buf)? {
        let change = match m.msg_type {
            RTM_NEWLINK => Change::NewLink,
            RTM_DELLINK => Change::DelLink,
            RTM_NEWADDR | RTM_DELADDR => Change::Address,
            _ => continue,
        };
        out.push(link_event(m.payload, change, m.seq == DUMP_SEQ)?);
    }
    Ok(out)
}

/// Whether link and address events concern us, judged by name wherever the
/// kernel gives one: a link event names its link, and the names this socket
/// learnt per ifindex (from a dump of the links at start, then from every
/// link event) name an address event's link too. The scan's ifindexes are
/// only the fallback for an address event on a link it never heard of (the
/// dump failed). An ifindex alone misjudges: the fixture trees tests and
/// simulations run on carry made-up ifindexes that collide with real links
/// (a bridge, a veth peer).
#[derive(Debug, Default)]
pub struct LinkFilter {
    /// The last name each ifindex had in a link event on this socket.
    names: std::collections::HashMap<u32, String>,
}

impl LinkFilter {
    /// A link we know (by its name, or by the name it had before a rename)
    /// or one on a PCI function (a new VF netdev); an address on a link we
    /// know. Pods' veths, their peers and bridges come and go without a
    /// rescan.
    pub fn concerns(&mut self, ev: &LinkEvent, interest: &Interest) -> bool {
        let known = |n: &String| interest.names.contains(n);
        if ev.from_dump {
            if let Some(name) = &ev.name {
                self.names.insert(ev.ifindex, name.clone());
            }
            return false;
        }
        match (ev.change, &ev.name) {
            (Change::Address, _) => match self.names.get(&ev.ifindex) {
                Some(n) => known(n),
                None => interest.ifindexes.contains(&ev.ifindex),
            },
            (change, Some(name)) => {
                let before = if change == Change::DelLink {
                    self.names.remove(&ev.ifindex)
                } else {
                    self.names.insert(ev.ifindex, name.clone())
                };
                known(name)
                    || before.as_ref().is_some_and(known)
                    || ev.parent_bus.as_deref() == Some("pci")
            }
            // No name (not sent by the kernel for links, but cheap to cover).
            (_, None) => {
                interest.ifindexes.contains(&ev.ifindex) || ev.parent_bus.as_deref() == Some("pci")
            }
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("cannot open the {what} netlink socket: {source}")]
pub struct EventsError {
    pub what: &'static str,
    #[source]
    pub source: io::Error,
}

/// The listening tasks; dropping this stops them (and their reader threads,
/// within `POLL`, once their channel is closed).
#[derive(Debug)]
pub struct Listener {
    pub changed: Arc<Notify>,
    /// Events that concerned us (and so woke `changed`).
    pub relevant: Arc<AtomicU64>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Listener {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// The socket error as the `io::Error` it is (a decode error cannot come
/// from opening or configuring a socket).
fn io_error(e: NlError) -> io::Error {
    match e {
        NlError::Socket(e) => e,
        other => io::Error::other(other.to_string()),
    }
}

fn open(
    protocol: SockProtocol,
    groups: &[u32],
    what: &'static str,
) -> Result<NlSocket, EventsError> {
    let fail = |e| EventsError {
        what,
        source: io_error(e),
    };
    let sock = NlSocket::subscribe(protocol, groups, POLL).map_err(fail)?;
    // Best effort: capped at net.core.rmem_max without CAP_NET_ADMIN.
    if let Err(e) = sock.set_recv_buffer(RCVBUF) {
        tracing::debug!(what, error = %e, "cannot raise the netlink receive buffer");
    }
    Ok(sock)
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    Link,
    Uevent,
}

impl Kind {
    fn what(self) -> &'static str {
        match self {
            Kind::Link => "rtnetlink",
            Kind::Uevent => "kobject uevent",
        }
    }
}

/// What a reader thread hands its task.
#[derive(Debug)]
enum Received {
    Datagram(Vec<u8>),
    /// The receive buffer overran: the kernel dropped notifications.
    Overrun,
    Failed(NlError),
}

/// Opens both sockets in the calling thread's network namespace and starts
/// listening. `interest` is read at every event. Fails when either socket
/// cannot be opened; the caller then falls back to a fast rescan tick.
pub fn spawn(interest: watch::Receiver<Interest>) -> Result<Listener, EventsError> {
    let link = open(SockProtocol::NetlinkRoute, &RTNL_GROUPS, Kind::Link.what())?;
    let uevent = open(
        SockProtocol::NetlinkKObjectUEvent,
        &[UEVENT_KERNEL_GROUP],
        Kind::Uevent.what(),
    )?;
    let changed = Arc::new(Notify::new());
    let relevant = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for (sock, kind) in [(link, Kind::Link), (uevent, Kind::Uevent)] {
        let (tx, rx) = mpsc::channel(CHANNEL);
        // Not joined: it ends by itself within `POLL` once the task (and so
        // the channel) is gone.
        std::thread::Builder::new()
            .name(format!("{}-events", kind.what().replace(' ', "-")))
            .spawn(move || read(sock, kind, tx))
            .map_err(|source| EventsError {
                what: kind.what(),
                source,
            })?;
        tasks.push(tokio::spawn(listen(
            rx,
            kind,
            interest.clone(),
            changed.clone(),
            relevant.clone(),
        )));
    }
    Ok(Listener {
        changed,
        relevant,
        tasks,
    })
}

/// Asks the kernel for every link of this namespace on the listening socket
/// itself: the answers (`from_dump`) arrive before any later notification
/// and teach the filter the names of links that existed before we listened.
/// Best effort: without it, address events fall back to the scan's ifindexes.
fn request_link_dump(sock: &NlSocket) {
    if let Err(e) = sock.send(&kroce_netlink::route::dump_links(), DUMP_SEQ) {
        tracing::debug!(error = %e, "cannot ask for the link list; address events fall back to ifindexes");
    }
}

/// The reader thread: blocking receives, each datagram (or overrun, or
/// failure) handed to the task. Ends when the task is gone.
fn read(mut sock: NlSocket, kind: Kind, tx: mpsc::Sender<Received>) {
    if matches!(kind, Kind::Link) {
        request_link_dump(&sock);
    }
    loop {
        let got = match sock.recv_unsolicited() {
            Ok(Some(datagram)) => Received::Datagram(datagram.to_vec()),
            Ok(None) if tx.is_closed() => return,
            Ok(None) => continue,
            Err(NlError::Socket(e)) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                // Link events were lost with it: learn the names afresh.
                if matches!(kind, Kind::Link) {
                    request_link_dump(&sock);
                }
                Received::Overrun
            }
            Err(e) => {
                if tx.blocking_send(Received::Failed(e)).is_err() {
                    return;
                }
                // Rescan and retry, at most once a second: as the old tick.
                std::thread::sleep(Duration::from_secs(1));
                continue;
            }
        };
        if tx.blocking_send(got).is_err() {
            return;
        }
    }
}

async fn listen(
    mut rx: mpsc::Receiver<Received>,
    kind: Kind,
    interest: watch::Receiver<Interest>,
    changed: Arc<Notify>,
    relevant: Arc<AtomicU64>,
) {
    let mut links = LinkFilter::default();
    let wake = || {
        relevant.fetch_add(1, Ordering::Relaxed);
        changed.notify_one();
    };
    while let Some(received) = rx.recv().await {
        let buf = match received {
            Received::Datagram(buf) => buf,
            Received::Overrun => {
                // Events were dropped: we cannot tell which, so rescan.
                tracing::debug!(?kind, "netlink receive buffer overran; rescanning");
                wake();
                continue;
            }
            Received::Failed(e) => {
                tracing::warn!(?kind, error = %e, "netlink read failed; rescanning");
                wake();
                continue;
            }
        };
        let concerns = {
            let interest = interest.borrow();
            match kind {
                Kind::Uevent => match parse_uevent(&buf) {
                    Some(ev) if uevent_concerns(&ev, &interest) => {
                        tracing::debug!(action = %ev.action, devpath = %ev.devpath, subsystem = %ev.subsystem, "uevent; rescanning");
                        true
                    }
                    _ => false,
                },
                Kind::Link => match parse_links(&buf) {
                    // Every event is judged (not just up to the first that
                    // concerns us): each one teaches the filter a name.
                    Ok(evs) => evs.iter().fold(false, |hit, ev| {
                        let concerns = links.concerns(ev, &interest);
                        if concerns && !hit {
                            tracing::debug!(change = ?ev.change, ifindex = ev.ifindex, name = ?ev.name, "link event; rescanning");
                        }
                        hit || concerns
                    }),
                    Err(e) => {
                        tracing::debug!(error = %e, "undecodable link event; rescanning");
                        true
                    }
                },
            }
        };
        if concerns {
            wake();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kroce_netlink::MsgBuilder;
    use kroce_netlink::route::ifinfomsg;

    fn interest() -> Interest {
        Interest {
            names: ["ens1f0v1", "ens1f0"]
                .into_iter()
                .map(String::from)
                .collect(),
            ifindexes: [7].into_iter().collect(),
        }
    }

    fn uevent(fields: &[&str]) -> Vec<u8> {
        let action = fields
            .iter()
            .find_map(|f| f.strip_prefix("ACTION="))
            .unwrap_or("");
        let devpath = fields
            .iter()
            .find_map(|f| f.strip_prefix("DEVPATH="))
            .unwrap_or("");
        let mut out = format!("{action}@{devpath}\0").into_bytes();
        for f in fields {
            out.extend_from_slice(f.as_bytes());
            out.push(0);
        }
        out
    }

    #[test]
    fn parses_a_kernel_uevent() {
        let buf = uevent(&[
            "ACTION=move",
            "DEVPATH=/devices/pci0000:00/0000:00:02.0/0000:3b:00.3/net/ens1f0v1",
            "SUBSYSTEM=net",
            "DEVPATH_OLD=/devices/pci0000:00/0000:00:02.0/0000:3b:00.3/net/eth0",
            "INTERFACE=ens1f0v1",
            "IFINDEX=12",
            "SEQNUM=4242",
        ]);
        let ev = parse_uevent(&buf).unwrap();
        assert_eq!(ev.action, "move");
        assert_eq!(ev.subsystem, "net");
        assert_eq!(ev.interface.as_deref(), Some("ens1f0v1"));
        assert!(ev.devpath_old.unwrap().ends_with("/net/eth0"));
    }

    #[test]
    fn udev_messages_and_garbage_are_not_uevents() {
        // udev's re-broadcast starts with "libudev\0" and a binary header.
        let mut udev = b"libudev\0\xfe\xed\xca\xfe".to_vec();
        udev.extend_from_slice(b"ACTION=add\0DEVPATH=/devices/x\0SUBSYSTEM=pci\0");
        assert_eq!(parse_uevent(&udev), None);
        assert_eq!(parse_uevent(b""), None);
        assert_eq!(parse_uevent(b"add@/devices/x\0ACTION=add\0"), None);
        assert_eq!(
            parse_uevent(b"add@/devices/x\0ACTION=add\0DEVPATH=/devices/x\0"),
            None
        );
    }

    #[test]
    fn which_uevents_concern_us() {
        let i = interest();
        let concerns =
            |fields: &[&str]| uevent_concerns(&parse_uevent(&uevent(fields)).unwrap(), &i);
        // A VF appears (sriov_numvfs), a driver binds, numvfs changes.
        assert!(concerns(&[
            "ACTION=add",
            "DEVPATH=/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.9",
            "SUBSYSTEM=pci"
        ]));
        assert!(concerns(&[
            "ACTION=change",
            "DEVPATH=/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0",
            "SUBSYSTEM=pci"
        ]));
        // RDMA devices and their char devices.
        assert!(concerns(&[
            "ACTION=remove",
            "DEVPATH=/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.3/infiniband/mlx5_3",
            "SUBSYSTEM=infiniband"
        ]));
        assert!(concerns(&[
            "ACTION=add",
            "DEVPATH=/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.3/infiniband_verbs/uverbs3",
            "SUBSYSTEM=infiniband_verbs"
        ]));
        // A PCI netdev appears; a known one is renamed or removed.
        assert!(concerns(&[
            "ACTION=add",
            "DEVPATH=/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.9/net/eth3",
            "SUBSYSTEM=net",
            "INTERFACE=eth3"
        ]));
        assert!(concerns(&[
            "ACTION=move",
            "DEVPATH=/devices/virtual/net/rxe-base",
            "SUBSYSTEM=net",
            "DEVPATH_OLD=/devices/virtual/net/ens1f0",
            "INTERFACE=rxe-base"
        ]));
        assert!(concerns(&[
            "ACTION=remove",
            "DEVPATH=/devices/virtual/net/ens1f0v1",
            "SUBSYSTEM=net",
            "INTERFACE=ens1f0v1"
        ]));
        // A pod's veth, its queues, a block device: no.
        assert!(!concerns(&[
            "ACTION=add",
            "DEVPATH=/devices/virtual/net/veth1234",
            "SUBSYSTEM=net",
            "INTERFACE=veth1234"
        ]));
        assert!(!concerns(&[
            "ACTION=add",
            "DEVPATH=/devices/virtual/net/veth1234/queues/rx-0",
            "SUBSYSTEM=queues"
        ]));
        assert!(!concerns(&[
            "ACTION=change",
            "DEVPATH=/devices/virtual/block/loop0",
            "SUBSYSTEM=block"
        ]));
    }

    /// An `RTM_NEWLINK`/`RTM_DELLINK` as the kernel sends it (sequence 0).
    fn link_msg(index: u32, name: &str, bus: Option<&str>, del: bool) -> Vec<u8> {
        let ty = if del { RTM_DELLINK } else { RTM_NEWLINK };
        let mut b = MsgBuilder::new(ty, 0).family_header(&ifinfomsg(index, 0, 0));
        b.attr_str(IFLA_IFNAME, name);
        if let Some(bus) = bus {
            b.attr_str(IFLA_PARENT_DEV_BUS_NAME, bus);
        }
        b.finish(0)
    }

    /// An `RTM_NEWADDR` without attributes: `ifaddrmsg` names the link.
    fn addr_msg(index: u32) -> Vec<u8> {
        let mut hdr = [0u8; 8];
        hdr[4..8].copy_from_slice(&index.to_ne_bytes());
        MsgBuilder::new(RTM_NEWADDR, 0)
            .family_header(&hdr)
            .finish(0)
    }

    #[test]
    fn parses_link_events_several_per_datagram() {
        let mut buf = link_msg(12, "ens1f0v1", Some("pci"), false);
        buf.extend(link_msg(13, "veth9", None, true));
        buf.extend(addr_msg(12));
        let evs = parse_links(&buf).unwrap();
        assert_eq!(
            evs,
            [
                LinkEvent {
                    change: Change::NewLink,
                    ifindex: 12,
                    name: Some("ens1f0v1".into()),
                    parent_bus: Some("pci".into()),
                    from_dump: false,
                },
                LinkEvent {
                    change: Change::DelLink,
                    ifindex: 13,
                    name: Some("veth9".into()),
                    parent_bus: None,
                    from_dump: false,
                },
                LinkEvent {
                    change: Change::Address,
                    ifindex: 12,
                    name: None,
                    parent_bus: None,
                    from_dump: false,
                }
            ]
        );
        // Truncated: an error, which makes the caller rescan.
        assert!(parse_links(&buf[..buf.len() - 3]).is_err());
    }

    #[test]
    fn which_link_events_concern_us() {
        let i = interest();
        let mut f = LinkFilter::default();
        let ev = |change, idx, name: &str, bus: Option<&str>| LinkEvent {
            change,
            ifindex: idx,
            name: Some(name.into()),
            parent_bus: bus.map(String::from),
            from_dump: false,
        };
        let new = |idx, name: &str| ev(Change::NewLink, idx, name, None);
        let addr = |idx| LinkEvent {
            change: Change::Address,
            ifindex: idx,
            name: None,
            parent_bus: None,
            from_dump: false,
        };
        // An address on a scanned ifindex before any link event named it.
        assert!(f.concerns(&addr(7), &i));
        assert!(!f.concerns(&addr(51), &i));
        assert!(f.concerns(&new(99, "ens1f0v1"), &i));
        // A new VF netdev on a kernel that names the parent bus.
        assert!(f.concerns(&ev(Change::NewLink, 50, "eth5", Some("pci")), &i));
        // A pod's veth, a bridge: no.
        assert!(!f.concerns(&new(51, "veth1234"), &i));
        assert!(!f.concerns(&new(52, "cni0"), &i));
        // Renamed: the name it had is known.
        assert!(f.concerns(&new(99, "renamed0"), &i));
    }

    /// The links there were at start, from our own dump: learnt, no rescan;
    /// an address on one of them is then judged by its name, not by a
    /// scanned ifindex it happens to share.
    #[test]
    fn dump_answers_teach_names_and_wake_nothing() {
        let i = interest();
        let mut f = LinkFilter::default();
        let dumped = |idx, name: &str| LinkEvent {
            change: Change::NewLink,
            ifindex: idx,
            name: Some(name.into()),
            parent_bus: None,
            from_dump: true,
        };
        assert!(!f.concerns(&dumped(7, "vfpeer"), &i));
        assert!(!f.concerns(&dumped(8, "ens1f0v1"), &i));
        let addr = |idx| LinkEvent {
            change: Change::Address,
            ifindex: idx,
            name: None,
            parent_bus: None,
            from_dump: false,
        };
        assert!(!f.concerns(&addr(7), &i));
        assert!(f.concerns(&addr(8), &i));
        // Our dump request is told from notifications by its sequence number.
        let mut m = MsgBuilder::new(RTM_NEWLINK, 0).family_header(&ifinfomsg(8, 0, 0));
        m.attr_str(IFLA_IFNAME, "ens1f0v1");
        let buf = m.finish(DUMP_SEQ);
        assert!(parse_links(&buf).unwrap()[0].from_dump);
    }

    /// Issue 24: a bridge and a veth peer whose ifindexes the scan also
    /// holds (a fixture tree's made-up ones, or a stale one) woke rescans.
    /// Judged by name, neither their links nor their addresses do.
    #[test]
    fn bridges_and_veth_peers_on_a_scanned_ifindex_do_not_concern_us() {
        let i = interest(); // ifindex 7 was scanned for a known netdev
        let mut f = LinkFilter::default();
        let link = |change, name: &str| LinkEvent {
            change,
            ifindex: 7,
            name: Some(name.into()),
            parent_bus: None,
            from_dump: false,
        };
        for name in ["cni0", "vfpeer", "veth1234"] {
            assert!(!f.concerns(&link(Change::NewLink, name), &i), "{name}");
            // Its addresses (IPv6 link-local, the bridge's gateway IP).
            let addr = LinkEvent {
                change: Change::Address,
                ifindex: 7,
                name: None,
                parent_bus: None,
                from_dump: false,
            };
            assert!(!f.concerns(&addr, &i), "{name}");
            assert!(!f.concerns(&link(Change::DelLink, name), &i), "{name}");
        }
        // The known link itself on that ifindex still does.
        assert!(f.concerns(&link(Change::NewLink, "ens1f0"), &i));
    }

    #[test]
    fn interest_holds_candidate_and_pci_netdevs() {
        let (_dir, fx) = crate::testing::connectx_pair();
        let host = sriov_helpers::Host::scan(&fx.root());
        let i = Interest::new(["rxe-veth"], &host);
        assert!(i.names.contains("rxe-veth"));
        assert!(i.names.contains("ens1f0v1"), "{:?}", i.names);
        assert!(i.names.contains("ens1f0"), "{:?}", i.names);
        let idx = host.netdevs["ens1f0v1"].ifindex.unwrap();
        assert!(i.ifindexes.contains(&idx));
    }

    fn ip(args: &[&str]) -> bool {
        std::process::Command::new("ip")
            .args(args)
            .status()
            .is_ok_and(|s| s.success())
    }

    /// A named netns, deleted on drop (with the veths in it).
    struct TempNetns(String);

    impl Drop for TempNetns {
        fn drop(&mut self) {
            ip(&["netns", "del", &self.0]);
        }
    }

    /// The whole edge against the real kernel: the listener opened in a
    /// throwaway netns (reader threads, channels, tasks) wakes when a veth
    /// it is interested in appears there, and not for one it does not know.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_known_link_appearing_wakes_the_listener_an_unknown_one_does_not() {
        if !nix::unistd::Uid::effective().is_root() {
            println!("skipped: needs root to create a netns and veths");
            return;
        }
        let name = format!("kroce-dp-ev-{}", std::process::id());
        if !ip(&["netns", "add", &name]) {
            println!("skipped: cannot create a netns here");
            return;
        }
        let _cleanup = TempNetns(name.clone());
        let ns =
            kroce_netlink::netns::Netns::open(std::path::Path::new(&format!("/run/netns/{name}")))
                .unwrap();
        let interest = Interest {
            names: ["krocedpev0".to_string()].into_iter().collect(),
            ifindexes: BTreeSet::new(),
        };
        let (_interest_tx, interest_rx) = watch::channel(interest);
        let rt = tokio::runtime::Handle::current();
        let listener = ns
            .run_in(|| {
                let _rt = rt.enter();
                spawn(interest_rx).map_err(io::Error::other)
            })
            .unwrap();

        let veth = |a: &str, b: &str| {
            ip(&[
                "-n", &name, "link", "add", a, "type", "veth", "peer", "name", b,
            ])
        };
        assert!(veth("krocedpx0", "krocedpx1"));
        // Its link events and uevents arrive and are judged: none concerns us.
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(listener.relevant.load(Ordering::Relaxed), 0);

        assert!(veth("krocedpev0", "krocedpev1"));
        tokio::time::timeout(Duration::from_secs(10), listener.changed.notified())
            .await
            .expect("no wake for a known link appearing in the listener's netns");
        assert!(listener.relevant.load(Ordering::Relaxed) >= 1);
    }
}
