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
//! (`NL_CFG_F_NONROOT_RECV`).
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

// Through rtnetlink's re-exports: one set of netlink crate versions.
use rtnetlink::packet_core::{NetlinkMessage, NetlinkPayload};
use rtnetlink::packet_route::RouteNetlinkMessage;
use rtnetlink::packet_route::link::{LinkAttribute, LinkMessage};
use rtnetlink::sys::{AsyncSocket, AsyncSocketExt, SocketAddr, TokioSocket, protocols};
use std::collections::BTreeSet;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

/// `RTNLGRP_LINK`, `RTNLGRP_IPV4_IFADDR`, `RTNLGRP_IPV6_IFADDR`
/// (include/uapi/linux/rtnetlink.h). Addresses make RoCE v2 GIDs.
const RTNL_GROUPS: [u32; 3] = [1, 5, 9];
/// The kernel's uevent multicast group (udev re-broadcasts on group 2).
const UEVENT_KERNEL_GROUP: u32 = 1;
/// Room for a burst between two reads; a full buffer loses events (ENOBUFS),
/// which itself triggers a rescan.
const RCVBUF: usize = 1 << 20;
const READ_BUF: usize = 64 * 1024;
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

fn link_event(m: &LinkMessage, change: Change, from_dump: bool) -> LinkEvent {
    let mut ev = LinkEvent {
        change,
        ifindex: m.header.index,
        name: None,
        parent_bus: None,
        from_dump,
    };
    for a in &m.attributes {
        match a {
            LinkAttribute::IfName(n) => ev.name = Some(n.clone()),
            LinkAttribute::ParentDevBusName(b) => ev.parent_bus = Some(b.clone()),
            _ => {}
        }
    }
    ev
}

/// The link and address events in one datagram (it may hold several messages). An error
/// names the offset of what could not be decoded; the caller rescans then.
pub fn parse_links(buf: &[u8]) -> Result<Vec<LinkEvent>, String> {
    let mut out = Vec::new();
    let mut off = 0;
    while off + 4 <= buf.len() {
        let mut len_bytes = [0u8; 4];
        len_bytes.copy_from_slice(&buf[off..off + 4]);
        let len = u32::from_ne_bytes(len_bytes) as usize;
        if len < 16 || off + len > buf.len() {
            return Err(format!("netlink message at offset {off}: length {len}"));
        }
        let msg = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&buf[off..off + len])
            .map_err(|e| format!("netlink message at offset {off}: {e}"))?;
        let from_dump = msg.header.sequence_number == DUMP_SEQ;
        match msg.payload {
            NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(m)) => {
                out.push(link_event(&m, Change::NewLink, from_dump))
            }
            NetlinkPayload::InnerMessage(RouteNetlinkMessage::DelLink(m)) => {
                out.push(link_event(&m, Change::DelLink, from_dump))
            }
            NetlinkPayload::InnerMessage(
                RouteNetlinkMessage::NewAddress(m) | RouteNetlinkMessage::DelAddress(m),
            ) => out.push(LinkEvent {
                change: Change::Address,
                ifindex: m.header.index,
                name: None,
                parent_bus: None,
                from_dump,
            }),
            _ => {}
        }
        off += (len + 3) & !3;
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

/// The listening tasks; dropping this stops them.
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

fn open(protocol: isize, groups: &[u32], what: &'static str) -> Result<TokioSocket, EventsError> {
    let fail = |source| EventsError { what, source };
    let mut sock = TokioSocket::new(protocol).map_err(fail)?;
    let s = sock.socket_mut();
    s.bind(&SocketAddr::new(0, 0)).map_err(fail)?;
    for g in groups {
        s.add_membership(*g).map_err(fail)?;
    }
    // Best effort: capped at net.core.rmem_max without CAP_NET_ADMIN.
    if let Err(e) = s.set_rx_buf_sz(RCVBUF) {
        tracing::debug!(what, error = %e, "cannot raise the netlink receive buffer");
    }
    Ok(sock)
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    Link,
    Uevent,
}

/// Opens both sockets in the calling thread's network namespace and starts
/// listening. `interest` is read at every event. Fails when either socket
/// cannot be opened; the caller then falls back to a fast rescan tick.
pub fn spawn(interest: watch::Receiver<Interest>) -> Result<Listener, EventsError> {
    let link = open(protocols::NETLINK_ROUTE, &RTNL_GROUPS, "rtnetlink")?;
    let uevent = open(
        protocols::NETLINK_KOBJECT_UEVENT,
        &[UEVENT_KERNEL_GROUP],
        "kobject uevent",
    )?;
    let changed = Arc::new(Notify::new());
    let relevant = Arc::new(AtomicU64::new(0));
    let tasks = [(link, Kind::Link), (uevent, Kind::Uevent)]
        .into_iter()
        .map(|(sock, kind)| {
            tokio::spawn(listen(
                sock,
                kind,
                interest.clone(),
                changed.clone(),
                relevant.clone(),
            ))
        })
        .collect();
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
async fn request_link_dump(sock: &TokioSocket) {
    use rtnetlink::packet_core::{NLM_F_DUMP, NLM_F_REQUEST};
    let mut header = rtnetlink::packet_core::NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    header.sequence_number = DUMP_SEQ;
    let mut msg = NetlinkMessage::new(
        header,
        NetlinkPayload::from(RouteNetlinkMessage::GetLink(LinkMessage::default())),
    );
    msg.finalize();
    let mut buf = vec![0u8; msg.buffer_len()];
    msg.serialize(&mut buf);
    if let Err(e) = sock.send_to(&buf, &SocketAddr::new(0, 0)).await {
        tracing::debug!(error = %e, "cannot ask for the link list; address events fall back to ifindexes");
    }
}

async fn listen(
    sock: TokioSocket,
    kind: Kind,
    interest: watch::Receiver<Interest>,
    changed: Arc<Notify>,
    relevant: Arc<AtomicU64>,
) {
    let mut buf: Vec<u8> = Vec::with_capacity(READ_BUF);
    let mut links = LinkFilter::default();
    if matches!(kind, Kind::Link) {
        request_link_dump(&sock).await;
    }
    let wake = || {
        relevant.fetch_add(1, Ordering::Relaxed);
        changed.notify_one();
    };
    loop {
        buf.clear();
        match sock.recv(&mut buf).await {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                // Events were dropped: we cannot tell which, so rescan.
                tracing::debug!(?kind, "netlink receive buffer overran; rescanning");
                wake();
                // Link events were lost with it: learn the names afresh.
                if matches!(kind, Kind::Link) {
                    request_link_dump(&sock).await;
                }
                continue;
            }
            Err(e) => {
                // Rescan and retry, at most once a second: as the old tick.
                tracing::warn!(?kind, error = %e, "netlink read failed; rescanning");
                wake();
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        }
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
    use rtnetlink::packet_core::NetlinkHeader;
    use rtnetlink::packet_route::link::LinkHeader;

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

    fn link_msg(index: u32, attrs: Vec<LinkAttribute>, del: bool) -> Vec<u8> {
        let mut m = LinkMessage::default();
        m.header = LinkHeader {
            index,
            ..Default::default()
        };
        m.attributes = attrs;
        let inner = if del {
            RouteNetlinkMessage::DelLink(m)
        } else {
            RouteNetlinkMessage::NewLink(m)
        };
        emit(inner)
    }

    fn emit(inner: RouteNetlinkMessage) -> Vec<u8> {
        let mut msg = NetlinkMessage::new(NetlinkHeader::default(), NetlinkPayload::from(inner));
        msg.finalize();
        let mut buf = vec![0u8; msg.buffer_len()];
        msg.serialize(&mut buf);
        buf
    }

    #[test]
    fn parses_link_events_several_per_datagram() {
        let mut buf = link_msg(
            12,
            vec![
                LinkAttribute::IfName("ens1f0v1".into()),
                LinkAttribute::ParentDevBusName("pci".into()),
            ],
            false,
        );
        buf.extend(link_msg(
            13,
            vec![LinkAttribute::IfName("veth9".into())],
            true,
        ));
        let mut addr = rtnetlink::packet_route::address::AddressMessage::default();
        addr.header.index = 12;
        buf.extend(emit(RouteNetlinkMessage::NewAddress(addr)));
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
        let mut m = LinkMessage::default();
        m.header.index = 8;
        m.attributes = vec![LinkAttribute::IfName("ens1f0v1".into())];
        let mut header = NetlinkHeader::default();
        header.sequence_number = DUMP_SEQ;
        let mut msg = NetlinkMessage::new(
            header,
            NetlinkPayload::from(RouteNetlinkMessage::NewLink(m)),
        );
        msg.finalize();
        let mut buf = vec![0u8; msg.buffer_len()];
        msg.serialize(&mut buf);
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
}
