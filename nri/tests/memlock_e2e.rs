#![allow(clippy::unwrap_used, clippy::expect_used)]
//! End to end: the limit the plugin returns over NRI, applied as runc applies
//! it (setrlimit in the container's init, then the switch to the container
//! user), turns a failing `mlock` into a succeeding one.
//!
//! The child is this test binary re-executed to run only `mlock_child`: it
//! sets RLIMIT_MEMLOCK, drops from root to nobody (65534) — which also drops
//! CAP_IPC_LOCK, so the limit applies — and tries to lock 4 MiB.
//!
//! The child applies the adjustment as runc does, with no fallback: where the
//! hard limit cannot be raised (root here lacks CAP_SYS_RESOURCE and the
//! hard memlock limit is 8 MiB), an adjustment above it fails with EPERM —
//! runc's "error setting rlimit type 8: operation not permitted". The plugin
//! must therefore ask for no more than the runtime (here: this test process,
//! the peer of the NRI socket) can set.

use std::process::Command;
use std::time::Duration;

use kroce_nri::Memlock;
use kroce_nri::cni_requests::StateDir;
use kroce_nri::handler::Handler;
use kroce_nri::proto::api;
use kroce_nri::session::{self, Backoff, PluginState, SessionOptions};
use kroce_nri::status::{self, StatusPath};
use kroce_nri::testing::FakeRuntime;
use nix::sys::resource::{Resource, getrlimit, setrlimit};
use nix::unistd::{Gid, Uid, geteuid, setgid, setgroups, setuid};

const MIB: u64 = 1 << 20;
const LOCK_BYTES: u64 = 4 * MIB;
const NOBODY: u32 = 65534;

const ENV_CHILD: &str = "KROCE_MLOCK_CHILD";
const ENV_SOFT: &str = "KROCE_MLOCK_SOFT";
const ENV_HARD: &str = "KROCE_MLOCK_HARD";
const PREFIX: &str = "KROCE_PROBE";

/// What the child reports.
#[derive(Debug, PartialEq, Eq)]
struct Probe {
    /// `setrlimit` as runc calls it: "ok" or the errno.
    setrlimit: Result<(), String>,
    soft: u64,
    hard: u64,
    euid: u32,
    mlock: Result<(), String>,
}

fn run_child(soft: u64, hard: u64) -> Probe {
    let exe = std::env::current_exe().unwrap();
    let out = Command::new(exe)
        .args([
            "--exact",
            "mlock_child",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ENV_CHILD, "1")
        .env(ENV_SOFT, soft.to_string())
        .env(ENV_HARD, hard.to_string())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "child failed: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let mut fields = std::collections::BTreeMap::new();
    // The harness prints "test mlock_child ... " on the first report line.
    for line in stdout
        .lines()
        .filter_map(|l| l.find(PREFIX).map(|at| &l[at + PREFIX.len()..]))
    {
        let (k, v) = line.trim().split_once('=').unwrap();
        fields.insert(k.to_owned(), v.to_owned());
    }
    let get = |k: &str| {
        fields
            .get(k)
            .unwrap_or_else(|| panic!("child did not report {k}:\n{stdout}"))
            .clone()
    };
    if get("setrlimit") != "ok" {
        return Probe {
            setrlimit: Err(get("setrlimit")),
            soft: 0,
            hard: 0,
            euid: 0,
            mlock: Err("not run".into()),
        };
    }
    Probe {
        setrlimit: Ok(()),
        soft: get("soft").parse().unwrap(),
        hard: get("hard").parse().unwrap(),
        euid: get("euid").parse().unwrap(),
        mlock: match get("mlock").as_str() {
            "ok" => Ok(()),
            err => Err(err.to_owned()),
        },
    }
}

/// The child side: only does something when re-executed by `run_child`.
#[test]
#[ignore = "helper: run by adjustment_turns_failing_mlock_into_succeeding_one"]
fn mlock_child() {
    if std::env::var_os(ENV_CHILD).is_none() {
        return;
    }
    let soft: u64 = std::env::var(ENV_SOFT).unwrap().parse().unwrap();
    let hard: u64 = std::env::var(ENV_HARD).unwrap().parse().unwrap();

    // As runc: rlimits first, while still root; a refusal fails the container.
    if let Err(err) = setrlimit(Resource::RLIMIT_MEMLOCK, soft, hard) {
        println!("{PREFIX} setrlimit={err:?}");
        return;
    }
    println!("{PREFIX} setrlimit=ok");
    // Then the container user; this drops every capability, CAP_IPC_LOCK included.
    setgroups(&[]).unwrap();
    setgid(Gid::from_raw(NOBODY)).unwrap();
    setuid(Uid::from_raw(NOBODY)).unwrap();
    let (soft_now, hard_now) = getrlimit(Resource::RLIMIT_MEMLOCK).unwrap();

    let mut buf = vec![1u8; LOCK_BYTES as usize];
    let addr = std::ptr::NonNull::new(buf.as_mut_ptr().cast::<std::ffi::c_void>()).unwrap();
    #[allow(unsafe_code)]
    // SAFETY: `addr` points into `buf`, a live allocation of LOCK_BYTES bytes
    // that outlives the call; mlock only pins those pages and does not touch
    // their contents or Rust's ownership of them.
    let locked = unsafe { nix::sys::mman::mlock(addr, LOCK_BYTES as usize) };
    let mlock = match locked {
        Ok(()) => "ok".to_owned(),
        Err(err) => format!("{err:?}"),
    };
    let _ = nix::sys::mman::munlockall();
    drop(buf);

    println!("{PREFIX} soft={soft_now}");
    println!("{PREFIX} hard={hard_now}");
    println!("{PREFIX} euid={}", geteuid().as_raw());
    println!("{PREFIX} mlock={mlock}");
}

/// The adjustment the plugin returns over NRI for a container holding a
/// /dev/infiniband device, with the default `--default-memlock unlimited`.
fn adjustment_from_plugin() -> api::PosixRlimit {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("nri.sock");
        let runtime = FakeRuntime::bind(&socket).unwrap();
        let options = SessionOptions::new("kroce-memlock", "50", Duration::from_secs(5)).unwrap();
        let status_file = StatusPath::in_state_dir(dir.path());
        let handler = Handler::new(Memlock::Unlimited, StateDir::new(dir.path()))
            .with_status(Box::new(status_file.clone()));
        let (state, _) = tokio::sync::watch::channel(PluginState::Connecting { last_error: None });
        let plugin = session::run(
            &socket,
            &options,
            Backoff::default(),
            &handler,
            &state,
            std::future::pending(),
        );
        let runtime_side = async {
            let mut conn = runtime.accept().await.unwrap();
            conn.expect_register().await.unwrap();
            conn.configure(api::ConfigureRequest::default())
                .await
                .unwrap();
            let container = api::Container {
                id: "rdma-app".into(),
                pod_sandbox_id: "sb".into(),
                linux: Some(api::LinuxContainer {
                    devices: vec![api::LinuxDevice {
                        path: "/dev/infiniband/uverbs0".into(),
                        r#type: "c".into(),
                        major: 231,
                        minor: 192,
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
                ..Default::default()
            };
            let resp = conn
                .create_container(
                    api::PodSandbox {
                        id: "sb".into(),
                        ..Default::default()
                    },
                    container,
                )
                .await
                .unwrap();
            let mut rlimits = resp.adjust.unwrap().rlimits;
            assert_eq!(rlimits.len(), 1);
            let rlimit = rlimits.remove(0);
            // What the node agent and doctor read: this process as the runtime,
            // and the capped request when the adjustment was capped.
            let status = status::read(&status_file.0).unwrap().unwrap();
            println!("status file: {}", serde_json::to_string(&status).unwrap());
            let runtime = status.runtime.expect("runtime limits read from /proc");
            assert_eq!(runtime.pid, std::process::id());
            match status.last_capped {
                Some(capped) => {
                    assert_eq!(capped.container, "rdma-app");
                    assert_eq!(capped.requested, Memlock::Unlimited);
                    assert_eq!(capped.granted, Memlock::from_rlimit(rlimit.hard));
                    assert_eq!(capped.granted, runtime.memlock_hard);
                }
                None => assert_eq!(rlimit.hard, u64::MAX),
            }
            rlimit
        };
        tokio::select! {
            () = plugin => unreachable!("the plugin loop only ends on shutdown"),
            rlimit = runtime_side => rlimit,
        }
    })
}

#[test]
fn adjustment_turns_failing_mlock_into_succeeding_one() {
    if !geteuid().is_root() {
        let why = format!("needs root (setrlimit then setuid to {NOBODY}, as runc does)");
        // CI runs as root: a skip there would pass without testing anything.
        assert!(
            std::env::var_os("CI").is_none(),
            "CI is set but the test {why}"
        );
        eprintln!("SKIPPED: {why}");
        return;
    }
    let (soft_now, hard_now) = getrlimit(Resource::RLIMIT_MEMLOCK).unwrap();
    if hard_now != u64::MAX && hard_now < LOCK_BYTES + MIB {
        eprintln!(
            "SKIPPED: hard memlock limit {hard_now} leaves no room to lock {LOCK_BYTES} bytes"
        );
        return;
    }
    println!("this process: RLIMIT_MEMLOCK soft={soft_now} hard={hard_now}");

    // Before: the container's limit is small (here 1 MiB soft), mlock of 4 MiB fails.
    let before = run_child(MIB, hard_now);
    println!("before: {before:?}");
    assert_eq!(
        before.euid, NOBODY,
        "child must run as the unprivileged user"
    );
    assert_eq!(before.soft, MIB);
    assert!(
        before.mlock.is_err(),
        "mlock of 4 MiB under a 1 MiB limit must fail without CAP_IPC_LOCK: {before:?}"
    );

    // The plugin's adjustment for an RDMA container (default `unlimited`).
    let rlimit = adjustment_from_plugin();
    assert_eq!(rlimit.r#type, "RLIMIT_MEMLOCK");
    println!("adjustment: soft={} hard={}", rlimit.soft, rlimit.hard);
    assert_eq!(rlimit.soft, rlimit.hard);

    // After: applied exactly as runc applies it. Where the hard limit cannot be
    // raised (here), the plugin asked for at most the runtime's hard limit, so
    // setrlimit succeeds; an "unlimited" adjustment would fail with EPERM.
    let after = run_child(rlimit.soft, rlimit.hard);
    println!("after: {after:?}");
    assert_eq!(
        after.setrlimit,
        Ok(()),
        "runc would fail this container: the adjustment ({}, {}) exceeds what the runtime can set (hard {hard_now})",
        rlimit.soft,
        rlimit.hard
    );
    assert!(
        rlimit.hard <= hard_now || runtime_can_raise(),
        "adjustment hard {} above the runtime's hard limit {hard_now}",
        rlimit.hard
    );
    assert_eq!(after.euid, NOBODY);
    assert_eq!((after.soft, after.hard), (rlimit.soft, rlimit.hard));
    assert_eq!(
        after.mlock,
        Ok(()),
        "mlock must succeed under the adjusted limit: {after:?}"
    );
}

/// Whether this process (the "runtime" here) may raise its hard memlock
/// limit, asked of the kernel itself: a shell that tries.
fn runtime_can_raise() -> bool {
    Command::new("sh")
        .args(["-c", "ulimit -H -l unlimited"])
        .status()
        .is_ok_and(|s| s.success())
}
