#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The runtime's limits as kroce-nri learns them: the pid of the peer of a
//! real unix socket (SO_PEERCRED), then that process's /proc. Here the peer
//! is this very process, so the answer can be checked against the kernel.
//!
//! This machine's root lacks CAP_SYS_RESOURCE and has an 8 MiB hard memlock
//! limit: an "unlimited" request must be capped at 8 MiB.

use std::path::Path;
use std::process::Command;

use kroce_nri::Memlock;
use kroce_nri::policy::{self, Action, ContainerFacts};
use kroce_nri::runtime::{self, RuntimeLimitsError};
use nix::sys::resource::{Resource, getrlimit};

/// Whether this process may raise its hard memlock limit, asked of the kernel
/// itself (a child shell inherits our credentials and limits and tries).
fn kernel_says_can_raise() -> bool {
    Command::new("sh")
        .args(["-c", "ulimit -H -l unlimited"])
        .status()
        .is_ok_and(|s| s.success())
}

#[tokio::test]
async fn peer_pid_from_so_peercred_and_limits_from_its_proc() {
    let (ours, theirs) = tokio::net::UnixStream::pair().unwrap();
    let pid = runtime::peer_pid(&ours).unwrap();
    assert_eq!(pid, std::process::id(), "the peer of a socket pair is us");
    assert_eq!(runtime::peer_pid(&theirs).unwrap(), pid);

    let limits = runtime::read(Path::new("/proc"), pid).unwrap();
    println!("this process as the runtime: {limits:?}");
    let (soft, hard) = getrlimit(Resource::RLIMIT_MEMLOCK).unwrap();
    assert_eq!(limits.memlock_soft, Memlock::from_rlimit(soft));
    assert_eq!(limits.memlock_hard, Memlock::from_rlimit(hard));
    let can_raise = kernel_says_can_raise();
    // A hard limit already at infinity needs no raising whatever the caps.
    if limits.memlock_hard != Memlock::Unlimited {
        assert_eq!(
            limits.can_raise(),
            can_raise,
            "CapEff/uid_map disagree with the kernel: {limits:?}"
        );
    }

    // What an RDMA container asking for unlimited gets from this runtime.
    let container = ContainerFacts {
        id: "rdma-app".into(),
        device_paths: vec!["/dev/infiniband/uverbs0".into()],
        ..Default::default()
    };
    let d = policy::decide_for_runtime(
        &container,
        None,
        &Default::default(),
        Memlock::Unlimited,
        Some(&limits),
    );
    if can_raise || limits.memlock_hard == Memlock::Unlimited {
        assert_eq!(d.action, Action::Set(Memlock::Unlimited));
    } else {
        // Here: no CAP_SYS_RESOURCE, hard 8 MiB → capped at 8 MiB.
        assert_eq!(
            d.action,
            Action::Capped {
                requested: Memlock::Unlimited,
                granted: Memlock::Bytes(hard),
            }
        );
        let adj = d.adjustment();
        assert_eq!((adj.rlimits[0].soft, adj.rlimits[0].hard), (hard, hard));
        println!("capped at {hard} bytes");
    }
}

#[test]
fn a_pid_that_is_gone_is_an_error_naming_the_file() {
    // pid_max is at most 2^22; this pid cannot exist.
    let err = runtime::read(Path::new("/proc"), 9_999_999).unwrap_err();
    assert!(matches!(err, RuntimeLimitsError::Read { .. }), "{err}");
    assert!(err.to_string().contains("/proc/9999999/status"), "{err}");
}
