//! rdma-core and pciutils, real tools written against real kernels, reading
//! our fixture trees: if they see the devices we laid out, the fixtures are
//! shaped like a real host and not only like what our own reader expects.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use sriov_helpers::fixture::FixtureHost;
use std::process::Command;

fn tool(name: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {name}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Skipping is for developers' machines; CI installs the tools and runs as
/// root, so there a missing prerequisite is a failure.
fn skip(why: &str) {
    assert!(
        std::env::var_os("CI").is_none(),
        "CI must run this test: {why}"
    );
    eprintln!("skipped: {why}");
}

fn is_root() -> bool {
    nix::unistd::Uid::effective().is_root()
}

#[test]
fn ibv_devices_enumerates_the_fixture_rdma_devices() {
    if !is_root() || !tool("ibv_devices") || !tool("unshare") {
        skip("needs root, ibv_devices (ibverbs-utils) and unshare");
        return;
    }
    let fx = FixtureHost::connectx6dx_pair().unwrap();
    fx.make_real_char_devices().unwrap();
    // A private mount namespace with a fresh /dev holding only the fixture's
    // char devices; SYSFS_PATH points libibverbs at the fixture's sysfs.
    let out = Command::new("unshare")
        .args([
            "-m",
            "sh",
            "-c",
            "mount --make-rprivate / && mount -t tmpfs none /dev && mkdir /dev/infiniband \
             && mount --bind \"$1/dev/infiniband\" /dev/infiniband \
             && SYSFS_PATH=\"$1/sys\" ibv_devices",
            "sh",
        ])
        .arg(fx.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "ibv_devices failed:\n{stdout}\n{stderr}"
    );
    for i in 0..18 {
        assert!(
            stdout
                .lines()
                .any(|l| l.split_whitespace().next() == Some(&format!("mlx5_{i}"))),
            "mlx5_{i} missing from ibv_devices:\n{stdout}\n{stderr}"
        );
    }
}

#[test]
fn lspci_decodes_the_fixture_pfs_and_vfs() {
    if !tool("lspci") {
        skip("needs lspci (pciutils)");
        return;
    }
    let fx = FixtureHost::connectx6dx_pair().unwrap();
    let out = Command::new("lspci")
        .args(["-A", "linux-sysfs", "-O"])
        .arg(format!(
            "sysfs.path={}",
            fx.path().join("sys/bus/pci").display()
        ))
        .args(["-n", "-D"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pfs = stdout.lines().filter(|l| l.contains("15b3:101d")).count();
    let vfs = stdout.lines().filter(|l| l.contains("15b3:101e")).count();
    assert_eq!((pfs, vfs), (2, 16), "{stdout}");
    assert!(stdout.contains("0000:3b:01.1 0200: 15b3:101e"), "{stdout}");
}
