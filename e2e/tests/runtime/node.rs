//! The node around the runtime: a scratch dir, a fixture ConnectX-6 Dx
//! whose VFs are veths in the node netns (no SR-IOV in this kernel), the
//! CNI plugins in containerd's bin dir, kroce-nri's sync.

use super::containerd::Containerd;
use super::{BUSYBOX, image};
use crate::rig_process::Daemon;
use kroce_cni::testing::NetnsGuard;
use kroce_cni::testing::testbed::CNI_BIN_DIR;
use serde_json::Value;
use sriov_helpers::PciAddress;
use sriov_helpers::fixture::{FixtureHost, PfSpec};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// A dir under /tmp kept after the test (containerd's root and logs, for a
/// look after a failure).
pub fn kept_dir(prefix: &str) -> PathBuf {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in("/tmp")
        .unwrap()
        .keep()
}

/// One ConnectX-6 Dx PF, 0000:3b:00.0 (ens1f0) with 2 VFs, on NUMA node 0.
pub fn fixture_pf() -> (FixtureHost, PciAddress) {
    let mut fixture = FixtureHost::new().unwrap();
    fixture.add_numa_node(0, "0-15").unwrap();
    fixture
        .add_pf(PfSpec::connectx6dx("0000:3b:00.0", "ens1f0", Some(0), 2))
        .unwrap();
    (fixture, "0000:3b:00.0".parse().unwrap())
}

/// VF `i` of `pf` played by a veth in `node` with the VF's name
/// (`ens1f0v<i>`) and MAC from the fixture's sysfs and MTU `mtu`, its peer
/// `peer` up: the VF's PCI address, name and MAC.
pub fn veth_vf(
    node: &NetnsGuard,
    fixture: &FixtureHost,
    pf: &PciAddress,
    i: u32,
    peer: &str,
    mtu: u32,
) -> (PciAddress, String, String) {
    let pci = fixture.vf_address(pf, i).unwrap();
    let name = format!("ens1f0v{i}");
    let sysfs = fixture.path().join("sys");
    let mac = std::fs::read_to_string(sysfs.join("class/net").join(&name).join("address"))
        .unwrap()
        .trim()
        .to_string();
    node.ip(&[
        "link",
        "add",
        &name,
        "address",
        &mac,
        "mtu",
        &mtu.to_string(),
        "type",
        "veth",
        "peer",
        "name",
        peer,
    ])
    .unwrap();
    node.ip(&["link", "set", peer, "up"]).unwrap();
    (pci, name, mac)
}

/// kroce-cni (`cni`) and Debian's host-local and loopback in containerd's
/// CNI bin dir.
pub fn link_cni_plugins(ctd: &Containerd, cni: &Path) {
    std::os::unix::fs::symlink(cni, ctd.cni_bin.join("kroce-cni")).unwrap();
    for p in ["host-local", "loopback"] {
        std::os::unix::fs::symlink(Path::new(CNI_BIN_DIR).join(p), ctd.cni_bin.join(p)).unwrap();
    }
}

/// Starts containerd and imports the busybox image (built in `dir/image`).
pub fn start_with_image(ctd: &mut Containerd, dir: &Path) {
    ctd.start().unwrap();
    let archive = image::build(&dir.join("image"), Path::new(BUSYBOX)).unwrap();
    ctd.import(&archive).unwrap();
}

/// Waits until kroce-nri has synchronized with the runtime `n` times (once
/// per connection).
pub fn wait_synchronized(nri: &Daemon, ctd: &Containerd, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(40);
    while nri.log_text().matches("synchronized").count() < n {
        assert!(
            Instant::now() < deadline,
            "kroce-nri never synchronized with containerd ({n}):\n{}\n--- containerd\n{}",
            nri.log_text(),
            ctd.log_tail()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `ip -j <args>` in the caller's netns, parsed (null when it printed none).
pub fn ip_json(args: &[&str]) -> Value {
    let out = Command::new("ip")
        .arg("-j")
        .args(args)
        .output()
        .expect("ip");
    serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
}
