//! A real link behind a fixture VF netdev, for the kernel-event tests and
//! the latency bench: a throwaway network namespace holding a veth named
//! like the fixture's VF netdev, whose `operstate`, `carrier` and `flags`
//! files in the fixture tree become links to the real ones. The plugin runs
//! in that namespace (see [`VethHost::enter`]), so its netlink sockets hear
//! the veth, and its sysfs reads see the veth's real state.
//!
//! The real files come from a sysfs mounted in the namespace by a holder
//! process (`ip netns exec <ns> sleep`, which remounts `/sys` in a private
//! mount namespace) and are reached through `/proc/<holder>/root/sys`, so
//! nothing is mounted in the test's own mount namespace.

use sriov_helpers::fixture::FixtureHost;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Runs `ip` and returns stdout; an error carries stderr.
pub fn ip(args: &[&str]) -> io::Result<String> {
    let out = Command::new("ip").args(args).output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Unique per process and call: tests run in parallel.
fn unique() -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{:x}x{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// `Err(reason)` when this process cannot create network namespaces.
pub fn netns_capable() -> Result<(), String> {
    if !nix::unistd::geteuid().is_root() {
        return Err("not root".into());
    }
    let name = format!("kdpprobe{}", unique());
    ip(&["netns", "add", &name]).map_err(|e| e.to_string())?;
    ip(&["netns", "del", &name]).map_err(|e| e.to_string())?;
    Ok(())
}

/// Prints the standard skip line and returns true when the test must skip.
/// With `CI` set a netns test that cannot run is a failure: CI is where it
/// must run.
pub fn skip_without_netns(test: &str) -> bool {
    match netns_capable() {
        Ok(()) => false,
        Err(why) if std::env::var_os("CI").is_some() => {
            panic!("{test} needs root/netns and CI must run it: {why}")
        }
        Err(why) => {
            println!("skipped: needs root/netns ({test}: {why})");
            true
        }
    }
}

/// The namespace, the veth `<ifname>` (peer `<peer>`, both up) and the
/// holder process. Everything goes on drop.
#[derive(Debug)]
pub struct VethHost {
    pub netns: String,
    pub ifname: String,
    pub peer: String,
    holder: Child,
}

impl VethHost {
    /// Creates the namespace and veth and backs `fx`'s netdev `ifname`
    /// with it.
    pub fn create(fx: &FixtureHost, ifname: &str) -> io::Result<VethHost> {
        let netns = format!("kdp{}", unique());
        ip(&["netns", "add", &netns])?;
        let peer = "vfpeer".to_string();
        // From here on, drop cleans up whatever was made.
        let holder = match Command::new("ip")
            .args(["netns", "exec", &netns, "sleep", "3600"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
        {
            Ok(c) => c,
            Err(e) => {
                let _ = ip(&["netns", "del", &netns]);
                return Err(e);
            }
        };
        let v = VethHost {
            netns,
            ifname: ifname.to_string(),
            peer,
            holder,
        };
        // No IPv6: its link-local address (and DAD finishing a second
        // later) would be address events on the VF netdev at "idle".
        let out = Command::new("ip")
            .args(["netns", "exec", &v.netns, "sh", "-c"])
            .arg("echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6 && echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6")
            .output()?;
        if !out.status.success() {
            return Err(io::Error::other(format!(
                "disabling IPv6 in {}: {}",
                v.netns,
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        v.ip(&[
            "link", "add", ifname, "type", "veth", "peer", "name", &v.peer,
        ])?;
        v.ip(&["link", "set", ifname, "up"])?;
        v.ip(&["link", "set", &v.peer, "up"])?;
        let real = v.real_dir();
        let deadline = Instant::now() + Duration::from_secs(5);
        while !real.join("operstate").exists() {
            if Instant::now() > deadline {
                return Err(io::Error::other(format!(
                    "{} did not appear within 5 s",
                    real.display()
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let dir = std::fs::canonicalize(fx.path().join("sys/class/net").join(ifname))?;
        for f in ["operstate", "carrier", "flags"] {
            let link = dir.join(f);
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(real.join(f), &link)?;
        }
        Ok(v)
    }

    /// The veth's sysfs dir as the namespace sees it.
    pub fn real_dir(&self) -> PathBuf {
        Path::new("/proc")
            .join(self.holder.id().to_string())
            .join("root/sys/class/net")
            .join(&self.ifname)
    }

    /// `ip -n <netns> <args>`.
    pub fn ip(&self, args: &[&str]) -> io::Result<String> {
        let mut a = vec!["-n", self.netns.as_str()];
        a.extend_from_slice(args);
        ip(&a)
    }

    /// Moves the calling thread into the namespace. Threads it creates
    /// afterwards (a tokio runtime's workers) start there too.
    pub fn enter(&self) -> io::Result<()> {
        let f = std::fs::File::open(Path::new("/run/netns").join(&self.netns))?;
        nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNET).map_err(io::Error::from)
    }

    /// The peer down (the VF netdev loses carrier: `lowerlayerdown`, still
    /// admin-up, so unhealthy) or up again.
    pub fn set_peer(&self, up: bool) -> io::Result<()> {
        let state = if up { "up" } else { "down" };
        self.ip(&["link", "set", &self.peer, state]).map(|_| ())
    }

    /// The VF netdev's operstate as the kernel has it.
    pub fn operstate(&self) -> io::Result<String> {
        Ok(std::fs::read_to_string(self.real_dir().join("operstate"))?
            .trim()
            .to_string())
    }
}

impl Drop for VethHost {
    fn drop(&mut self) {
        let _ = self.holder.kill();
        let _ = self.holder.wait();
        if let Err(e) = ip(&["netns", "del", &self.netns]) {
            eprintln!("cannot delete netns {}: {e}", self.netns);
        }
    }
}
