//! A real container runtime for the tests: containerd 2.x (CRI, its
//! embedded libcni, NRI) with runc, started in a throwaway netns with its
//! own root, state, sockets and CNI/NRI directories, plus a busybox image
//! made here (no registry) and a CRI client.
//!
//! Where the peers come from: `ci/real-peers.sh` unpacks Debian unstable's
//! containerd into a cache and prints `KROCE_CONTAINERD_BIN`; runc 1.1.5 and
//! busybox-static are bookworm packages (`.ci/run` installs them).

pub mod containerd;
pub mod image;
pub mod kubelet;
pub mod node;

use std::path::{Path, PathBuf};

/// The directory holding `containerd`, `ctr` and `containerd-shim-runc-v2`.
pub const CONTAINERD_BIN_ENV: &str = "KROCE_CONTAINERD_BIN";
pub const RUNC: &str = "/usr/sbin/runc";
pub const BUSYBOX: &str = "/bin/busybox";

/// The real peers this machine has, or why not.
#[derive(Debug, Clone)]
pub struct Peers {
    pub containerd_bin: PathBuf,
}

impl Peers {
    pub fn find() -> Result<Peers, String> {
        let bin = std::env::var_os(CONTAINERD_BIN_ENV).map(PathBuf::from).ok_or_else(|| {
            format!("{CONTAINERD_BIN_ENV} is not set (run `eval \"$(ci/real-peers.sh)\"` and export it)")
        })?;
        for exe in ["containerd", "ctr", "containerd-shim-runc-v2"] {
            if !bin.join(exe).is_file() {
                return Err(format!("{} missing", bin.join(exe).display()));
            }
        }
        for f in [RUNC, BUSYBOX] {
            if !Path::new(f).is_file() {
                return Err(format!("{f} missing (apt-get install runc busybox-static)"));
            }
        }
        Ok(Peers {
            containerd_bin: bin,
        })
    }
}

/// `None` when the test may run; `Some(reason)` to skip. In CI a missing
/// peer is a failure, not a skip: a suite that skips its real peers would
/// prove nothing.
pub fn skip_reason(test: &str) -> Option<String> {
    let why = match kroce_cni::testing::testbed::netns_capable() {
        Err(why) => Some(format!("needs root/netns: {why}")),
        Ok(()) => Peers::find().err(),
    };
    let why = why?;
    if std::env::var_os("CI").is_some() {
        panic!("{test}: a real-peer test cannot run in CI: {why}");
    }
    println!("skipped: {test}: {why}");
    Some(why)
}
