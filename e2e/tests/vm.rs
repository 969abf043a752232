#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The real-kernel tier: the shipped binaries (`KROCE_BIN_DIR`) inside a
//! QEMU VM running Debian's Linux 7.3 with an emulated igb (82576) SR-IOV PF
//! on NUMA node 1, real igbvf VFs and soft-RoCE (`ci/vm.sh` boots it,
//! `e2e/vm/guest.sh` runs the checks inside and writes one line per check).
//!
//! `ci/test.sh` boots the VM once as its own step and exports
//! `KROCE_VM_RESULTS`; this test then reads those results. Without it, the
//! test boots the VM itself (root, `KROCE_BIN_DIR`, QEMU and the kernel from
//! `ci/vm-peers.sh`). It skips with the reason outside CI and fails in CI.

use kroce_netlink::rdma::{RdmaNetnsMode, sys_set_netns_mode};
use std::path::{Path, PathBuf};
use std::process::Command;

// The guest's whole-node flow uses part of the simulated node's rig.
#[allow(dead_code)]
mod rig;
mod vm_guest;

/// guest.sh runs this test binary (`guest_whole_node`) inside the VM.
const GUEST_TEST_ENV: &str = "KROCE_VM_GUEST_TEST";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Why the VM cannot run here, if it cannot.
fn cannot_run() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("needs root (9p share of /, netns and SR-IOV inside the VM)".into());
    }
    match std::env::var_os("KROCE_BIN_DIR") {
        None => {
            return Some(
                "needs KROCE_BIN_DIR (the shipped release binaries; ci/test.sh sets it)".into(),
            );
        }
        Some(d) if !Path::new(&d).join("kroce-cni").is_file() => {
            return Some(format!(
                "no kroce-cni in KROCE_BIN_DIR={}",
                Path::new(&d).display()
            ));
        }
        Some(_) => {}
    }
    if std::env::var_os("KROCE_VM_QEMU").is_none() {
        return Some("needs KROCE_VM_QEMU etc. (eval \"$(ci/setup.sh)\" or ci/vm-peers.sh)".into());
    }
    None
}

/// The checks file of a finished run: the one ci/test.sh made, or a new boot.
fn results() -> Option<(PathBuf, Option<tempfile::TempDir>)> {
    if let Some(d) = std::env::var_os("KROCE_VM_RESULTS") {
        return Some((PathBuf::from(d), None));
    }
    if let Some(why) = cannot_run() {
        assert!(
            std::env::var_os("CI").is_none(),
            "the real-kernel VM tier cannot run in CI: {why}"
        );
        println!("skipped: real-kernel VM tier: {why}");
        return None;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let exe = std::env::current_exe().expect("test executable");
    let status = Command::new(repo().join("ci/vm.sh"))
        .arg(dir.path())
        .env(GUEST_TEST_ENV, exe)
        .status()
        .expect("run ci/vm.sh");
    println!("ci/vm.sh: {status}");
    Some((dir.path().to_path_buf(), Some(dir)))
}

/// Checks the guest must have passed (more may be reported: all must pass).
const REQUIRED: &[&str] = &[
    "igb-pf",
    "netns-mode-exclusive-applied-live",
    "netns-mode-reboot-required-with-netns",
    "netns-mode-doctor-live-vs-boot",
    "netns-mode-unmanaged-removes-file",
    "agent-apply-vfs",
    "agent-pf-irqs-numa-local",
    "agent-vf-irqs-pinned-when-open",
    "vfs-created",
    "cni-add",
    "cni-add-in-pod",
    "cni-add-pf-side",
    "cni-del-with-mac",
    "cni-del-restores",
    "cni-del-idempotent",
    "cni-refused-vlan-proto-802.1ad",
    "cni-refused-min-tx-rate",
    "cni-refused-link-state",
    "vf-mac-settable-after-refusals",
    "dp-rxe-on-vf-is-the-vfs-rdma-device",
    "cni-rxe-on-vf-made-again-in-pod",
    "cni-rxe-on-vf-back-on-host",
    "cni-rxe-plain-made-again-in-pod",
    "cni-rxe-plain-back-on-host",
    "perftest-runner",
    // Issue 22: the agent's reboot, on the real kernel over two boots.
    "reboot-refused-without-flag",
    "reboot-asked-once-through-nsenter",
    "guest-finished",
    "reboot-new-boot",
    "reboot-mode-live-from-file",
    "reboot-applied-not-again",
    "guest-finished-after-reboot",
];

/// The whole-node flow inside the VM (`vm_guest`): runs only there, where
/// guest.sh sets `KROCE_VM_GUEST_CHECKS`; `real_kernel_vm_tier` requires
/// its steps on the host.
#[test]
fn guest_whole_node() {
    let Some(checks) = std::env::var_os(vm_guest::CHECKS_ENV) else {
        println!(
            "not in the VM: guest.sh runs this inside it, real_kernel_vm_tier asserts its steps"
        );
        return;
    };
    if let Err(e) = vm_guest::run(Path::new(&checks)) {
        panic!("whole node in the VM: {e}");
    }
}

#[test]
fn real_kernel_vm_tier() {
    let Some((dir, _keep)) = results() else {
        return;
    };
    let mut log = std::fs::read_to_string(dir.join("guest.log")).unwrap_or_default();
    if let Ok(second) = std::fs::read_to_string(dir.join("after-reboot.log")) {
        log.push_str("\n----- after the reboot (after-reboot.sh)\n");
        log.push_str(&second);
    }
    let checks = std::fs::read_to_string(dir.join("checks")).unwrap_or_else(|e| {
        let console = std::fs::read_to_string(dir.join("console.log")).unwrap_or_default();
        panic!(
            "no checks from the VM in {}: {e}\nguest log:\n{log}\nconsole:\n{console}",
            dir.display()
        )
    });
    println!("{checks}");
    let mut failed = Vec::new();
    let mut passed = Vec::new();
    for line in checks.lines() {
        let mut w = line.splitn(3, ' ');
        match (w.next(), w.next()) {
            (Some("PASS"), Some(name)) => passed.push(name.to_string()),
            (Some("KNOWN"), Some(_)) => println!("known open defect: {line}"),
            _ => failed.push(line.to_string()),
        }
    }
    let missing: Vec<_> = REQUIRED
        .iter()
        .chain(vm_guest::STEPS)
        .filter(|r| !passed.iter().any(|p| p == *r))
        .collect();
    // (d): the admission runner's real ib_write_bw / ib_send_lat output,
    // read by its parser and judged by its thresholds. Under TCG RDMA runs at
    // emulation speed (~0.1 Gb/s, ~ms latency): the thresholds test the
    // verdict path, not the speed.
    let client = std::fs::read_to_string(dir.join("perftest-client.log")).unwrap_or_default();
    let server = std::fs::read_to_string(dir.join("perftest-server.log")).ok();
    let thresholds = kroce_admission::thresholds::AdmissionThresholds {
        min_bandwidth_gbps: Some(0.001),
        max_latency_us: Some(1_000_000.0),
        ..Default::default()
    };
    let outcome = kroce_admission::pod_run::judge(
        &client,
        server.as_deref(),
        kroce_admission::command::PerftestTool::IbWriteBw,
        kroce_admission::command::PerftestTool::IbSendLat,
        &thresholds,
    );
    println!(
        "perftest verdict: passed {} ({}) {:?}",
        outcome.passed, outcome.message, outcome.measurement
    );
    if !outcome.passed {
        failed.push(format!("perftest verdict: {}", outcome.message));
    }
    // Issue 22: iproute2's `rdma system set netns MODE` request, captured in
    // the VM with strace, is byte for byte the node agent's (sequence
    // number aside).
    for mode in [RdmaNetnsMode::Exclusive, RdmaNetnsMode::Shared] {
        let file = dir.join(format!("rdma-sys-set-{mode}.strace"));
        let trace = std::fs::read_to_string(&file).unwrap_or_default();
        let ours = sys_set_netns_mode(mode).finish(0);
        match sys_set_request(&trace) {
            Some(mut theirs) if theirs.len() >= 12 => {
                theirs[8..12].fill(0);
                if theirs != ours {
                    failed.push(format!(
                        "{}: iproute2 sent {theirs:02x?}, kroce sends {ours:02x?}",
                        file.display()
                    ));
                } else {
                    println!(
                        "rdma system set netns {mode}: iproute2's bytes = kroce's {ours:02x?}"
                    );
                }
            }
            _ => failed.push(format!(
                "{}: no SYS_SET request in the strace",
                file.display()
            )),
        }
    }
    assert!(
        failed.is_empty() && missing.is_empty(),
        "real-kernel VM checks failed: {failed:#?}\nnot passed: {missing:?}\nguest log:\n{log}"
    );
}

/// The bytes of the first RDMA_NLDEV_CMD_SYS_SET (type 0x1407) in an
/// `strace -xx` log: strace decodes the netlink header (`{nlmsg_len=24,
/// nlmsg_type=0x1407, nlmsg_flags=NLM_F_REQUEST|NLM_F_ACK, nlmsg_seq=..,
/// nlmsg_pid=0}`) and prints the attributes as `"\x.."`; the header is
/// rebuilt from its fields (native endian, as sent).
fn sys_set_request(trace: &str) -> Option<Vec<u8>> {
    let line = trace.lines().find(|l| l.contains("nlmsg_type=0x1407"))?;
    let field = |name: &str| -> Option<&str> {
        let rest = &line[line.find(&format!("{name}="))? + name.len() + 1..];
        Some(&rest[..rest.find([',', '}'])?])
    };
    let len: u32 = field("nlmsg_len")?.parse().ok()?;
    let mut flags = 0u16;
    for f in field("nlmsg_flags")?.split('|') {
        flags |= match f {
            "NLM_F_REQUEST" => 0x1,
            "NLM_F_MULTI" => 0x2,
            "NLM_F_ACK" => 0x4,
            "NLM_F_ECHO" => 0x8,
            "NLM_F_ROOT" => 0x100,
            "NLM_F_MATCH" => 0x200,
            hex => u16::from_str_radix(hex.strip_prefix("0x")?, 16).ok()?,
        };
    }
    let seq: u32 = field("nlmsg_seq")?.parse().ok()?;
    let pid: u32 = field("nlmsg_pid")?.parse().ok()?;
    let mut b = Vec::new();
    b.extend_from_slice(&len.to_ne_bytes());
    b.extend_from_slice(&0x1407u16.to_ne_bytes());
    b.extend_from_slice(&flags.to_ne_bytes());
    b.extend_from_slice(&seq.to_ne_bytes());
    b.extend_from_slice(&pid.to_ne_bytes());
    let payload = line.split('"').nth(1)?;
    for h in payload.split("\\x").skip(1) {
        b.push(u8::from_str_radix(h, 16).ok()?);
    }
    (b.len() == len as usize).then_some(b)
}

/// The line as strace 6.x printed it in the VM (iproute2 6.1, `rdma system
/// set netns exclusive`).
#[test]
fn sys_set_request_is_found_in_an_strace_line() {
    let line = r#"219   sendto(4, [{nlmsg_len=24, nlmsg_type=0x1407 /* NLMSG_??? */, nlmsg_flags=NLM_F_REQUEST|NLM_F_ACK, nlmsg_seq=1796460736, nlmsg_pid=0}, "\x05\x00\x42\x00\x00\x00\x00\x00"], 24, 0, {sa_family=AF_NETLINK, nl_pid=0, nl_groups=00000000}, 12) = 24"#;
    let mut b = sys_set_request(line).unwrap();
    b[8..12].fill(0);
    assert_eq!(b, sys_set_netns_mode(RdmaNetnsMode::Exclusive).finish(0));
    assert_ne!(b, sys_set_netns_mode(RdmaNetnsMode::Shared).finish(0));
    assert_eq!(
        sys_set_request(&line.replace("nlmsg_len=24", "nlmsg_len=28")),
        None,
        "a length that does not match the bytes"
    );
    assert_eq!(sys_set_request("sendto(3, {nlmsg_type=0x1401}"), None);
}
