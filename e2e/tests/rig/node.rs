//! One node: a "node" netns holding the PF netdevs (one end of a veth pair
//! each, the other end up too so the PF has carrier), a fixture sysfs tree
//! with the same PFs at 0 VFs, and the simulated kernel watching the PFs'
//! `sriov_numvfs`. Everything goes on drop, in order, even after a failed
//! assertion: kernel thread, sysfs viewer, netns (with every interface in
//! it), fixture tree.

use super::kernel::{KernelEvent, SimKernel, WatchedPf, link_mtu};
use super::process::Daemon;
use kroce_cni::testing::NetnsGuard;
use sriov_helpers::fixture::{FixtureHost, PfSpec};
use sriov_helpers::{HostRoot, PciAddress};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// A PF of the simulated node.
#[derive(Debug, Clone)]
pub struct PfPlan {
    pub pci: &'static str,
    pub ifname: &'static str,
    pub numa: u32,
    /// The PF's `local_cpulist` (the fixture's NUMA node CPUs).
    pub local_cpus: &'static str,
}

/// Two ConnectX-6 Dx ports on different NUMA nodes, as in
/// `FixtureHost::connectx6dx_pair`, but starting with no VFs.
pub const PFS: [PfPlan; 2] = [
    PfPlan {
        pci: "0000:3b:00.0",
        ifname: "ens1f0",
        numa: 0,
        local_cpus: "0-15",
    },
    PfPlan {
        pci: "0000:86:00.0",
        ifname: "ens2f0",
        numa: 1,
        local_cpus: "16-31",
    },
];

/// The PFs' MTU before the agent runs (the fixture's default is 9000; a
/// lower one makes the agent's PF MTU step visible).
pub const INITIAL_PF_MTU: u32 = 1500;

#[derive(Debug)]
pub struct Node {
    kernel: Option<SimKernel>,
    /// `ip netns exec <node> sleep`: its mount namespace has a sysfs of the
    /// node netns, reachable from here as `/proc/<pid>/root/sys`.
    sysfs_viewer: Option<Daemon>,
    pub netns: NetnsGuard,
    fixture_dir: tempfile::TempDir,
}

fn pci(s: &str) -> PciAddress {
    s.parse().expect("PCI address constant")
}

impl Node {
    /// Builds the node; `tag` makes every name unique to this run.
    pub fn new(tag: &str, scratch: &Path) -> Result<Node, String> {
        let err = |what: &str| {
            let what = what.to_string();
            move |e: std::io::Error| format!("{what}: {e}")
        };
        let netns =
            NetnsGuard::create(&format!("kroce-e2e-node-{tag}")).map_err(err("node netns"))?;
        let fixture_dir = kroce_device_plugin::testing::scratch_dir("kroce-e2e-host-")
            .map_err(err("fixture dir"))?;
        let mut fx = FixtureHost::at(fixture_dir.path()).map_err(err("fixture"))?;
        fx.add_numa_node(0, "0-15").map_err(err("fixture NUMA 0"))?;
        fx.add_numa_node(1, "16-31")
            .map_err(err("fixture NUMA 1"))?;
        fx.add_rdma_cm().map_err(err("fixture rdma_cm"))?;
        for p in &PFS {
            let mut spec = PfSpec::connectx6dx(p.pci, p.ifname, Some(p.numa), 0);
            spec.mtu = INITIAL_PF_MTU;
            fx.add_pf(spec).map_err(err(p.ifname))?;
        }
        let mut node = Node {
            kernel: None,
            sysfs_viewer: None,
            netns,
            fixture_dir,
        };
        node.netns
            .ip(&["link", "set", "lo", "up"])
            .map_err(err("lo up"))?;
        for p in &PFS {
            let wire = format!("{}w", p.ifname);
            let mac = std::fs::read_to_string(
                node.fixture_root()
                    .join("sys/class/net")
                    .join(p.ifname)
                    .join("address"),
            )
            .map_err(err("fixture PF MAC"))?;
            let mtu = INITIAL_PF_MTU.to_string();
            for args in [
                vec![
                    "link", "add", p.ifname, "type", "veth", "peer", "name", &wire,
                ],
                vec!["link", "set", p.ifname, "address", mac.trim(), "mtu", &mtu],
                vec!["link", "set", &wire, "mtu", "9000", "up"],
                vec!["link", "set", p.ifname, "up"],
            ] {
                node.netns.ip(&args).map_err(err(p.ifname))?;
            }
        }
        let mut viewer = Command::new("ip");
        viewer.args(["netns", "exec", &node.netns.name, "sleep", "3600"]);
        let viewer = Daemon::start(
            "sysfs viewer",
            &node.netns.path,
            viewer,
            &scratch.join("sysfs-viewer.log"),
        )
        .map_err(err("sysfs viewer"))?;
        let view = PathBuf::from(format!(
            "/proc/{}/root/sys/class/net",
            viewer.pid().unwrap_or_default()
        ));
        node.sysfs_viewer = Some(viewer);
        // `ip netns exec` mounts its sysfs after the fork: wait for it.
        let deadline = Instant::now() + Duration::from_secs(5);
        while !view.join(PFS[0].ifname).exists() {
            if Instant::now() >= deadline {
                return Err(format!("{} never showed {}", view.display(), PFS[0].ifname));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        for p in &PFS {
            link_mtu(node.fixture_dir.path(), &view, p.ifname).map_err(err("PF mtu link"))?;
        }
        let watched = PFS
            .iter()
            .map(|p| WatchedPf {
                pci: pci(p.pci),
                ifname: p.ifname.to_string(),
            })
            .collect();
        node.kernel = Some(SimKernel::start(fx, &node.netns.name, &view, watched));
        Ok(node)
    }

    pub fn fixture_root(&self) -> PathBuf {
        self.fixture_dir.path().to_path_buf()
    }

    pub fn host_root(&self) -> HostRoot {
        HostRoot::new(self.fixture_dir.path())
    }

    pub fn kernel_events(&self) -> Vec<KernelEvent> {
        self.kernel
            .as_ref()
            .map(SimKernel::events)
            .unwrap_or_default()
    }

    /// Waits until the simulated kernel has acted on `n` writes: a real
    /// `sriov_numvfs` write returns when the kernel is done, this one's
    /// work runs on after the agent's write returns.
    pub fn wait_kernel_events(&self, n: usize, timeout: Duration) -> Vec<KernelEvent> {
        let deadline = Instant::now() + timeout;
        loop {
            let ev = self.kernel_events();
            if ev.len() >= n || Instant::now() >= deadline {
                return ev;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// A fixture sysfs attribute of a netdev, trimmed (`""` when unreadable).
    pub fn netdev_attr(&self, ifname: &str, attr: &str) -> String {
        std::fs::read_to_string(
            self.fixture_root()
                .join("sys/class/net")
                .join(ifname)
                .join(attr),
        )
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(mut k) = self.kernel.take() {
            let _ = k.stop();
        }
        // The viewer's mount namespace pins nothing, but it is our child.
        self.sysfs_viewer.take();
        // `netns` (and with it every veth and macvlan) and the fixture dir
        // go when the fields drop.
    }
}
