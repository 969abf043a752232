//! The multicast path against the real kernel: sockets subscribed to
//! `RTNLGRP_LINK` in a throwaway netns see the veth `ip` creates there, set
//! up and deletes; a socket subscribed in the test's own netns sees none of
//! it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use kroce_netlink::netns::Netns;
use kroce_netlink::route::{LinkInfo, RTM_DELLINK, RTM_NEWLINK, RTNLGRP_LINK, parse_link};
use kroce_netlink::{NlSocket, SockProtocol, split_messages};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// A named netns, deleted on drop (with whatever links are left in it).
struct TempNetns(String);

impl Drop for TempNetns {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.0]);
    }
}

/// The link notifications (`RTM_NEWLINK`/`RTM_DELLINK`, sequence 0) `sock`
/// receives until `until` says stop or `within` passes.
fn listen(
    sock: &mut NlSocket,
    within: Duration,
    mut until: impl FnMut(u16, &LinkInfo) -> bool,
) -> Vec<(u16, LinkInfo)> {
    let deadline = Instant::now() + within;
    let mut seen = Vec::new();
    while Instant::now() < deadline {
        let Some(datagram) = sock.recv_unsolicited().unwrap() else {
            continue;
        };
        for m in split_messages(datagram).unwrap() {
            if m.seq != 0 || !matches!(m.msg_type, RTM_NEWLINK | RTM_DELLINK) {
                continue;
            }
            let link = parse_link(m.payload).unwrap();
            let stop = until(m.msg_type, &link);
            seen.push((m.msg_type, link));
            if stop {
                return seen;
            }
        }
    }
    seen
}

#[test]
fn link_events_of_a_throwaway_netns_reach_its_subscriber_only() {
    if !nix::unistd::Uid::effective().is_root() {
        println!("skipped: needs root to create a netns and a veth pair");
        return;
    }
    let name = format!("kroce-nl-mc-{}", std::process::id());
    if let Err(e) = ip(&["netns", "add", &name]) {
        println!("skipped: cannot create a netns here: {e}");
        return;
    }
    let _cleanup = TempNetns(name.clone());
    let ns = Netns::open(&PathBuf::from(format!("/run/netns/{name}"))).unwrap();
    let poll = Duration::from_millis(100);
    let mut sub =
        NlSocket::subscribe_in(&ns, SockProtocol::NetlinkRoute, &[RTNLGRP_LINK], poll).unwrap();
    let mut host = NlSocket::subscribe(SockProtocol::NetlinkRoute, &[RTNLGRP_LINK], poll).unwrap();
    let (a, b) = ("krocemc0", "krocemc1");
    let within = Duration::from_secs(10);

    ip(&[
        "-n", &name, "link", "add", a, "type", "veth", "peer", "name", b,
    ])
    .unwrap();
    let seen = listen(&mut sub, within, |t, l| t == RTM_NEWLINK && l.name == a);
    let (_, created) = seen.last().expect("a notification");
    assert_eq!(created.name, a, "{seen:?}");
    assert!(!created.up);

    ip(&["-n", &name, "link", "set", a, "up"]).unwrap();
    let seen = listen(&mut sub, within, |t, l| {
        t == RTM_NEWLINK && l.name == a && l.up
    });
    assert!(
        seen.iter()
            .any(|(t, l)| *t == RTM_NEWLINK && l.name == a && l.up && l.index == created.index),
        "no RTM_NEWLINK with IFF_UP for {a}: {seen:?}"
    );

    ip(&["-n", &name, "link", "del", a]).unwrap();
    let seen = listen(&mut sub, within, |t, l| t == RTM_DELLINK && l.name == a);
    assert!(
        seen.iter()
            .any(|(t, l)| *t == RTM_DELLINK && l.index == created.index),
        "no RTM_DELLINK for {a}: {seen:?}"
    );

    // The same events never reached the test's own netns.
    let elsewhere = listen(&mut host, Duration::from_millis(300), |_, _| false);
    assert!(
        !elsewhere.iter().any(|(_, l)| l.name == a || l.name == b),
        "{elsewhere:?}"
    );
}
