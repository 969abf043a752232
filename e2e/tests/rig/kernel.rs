//! The simulated kernel: what a real kernel does when the node agent writes
//! a PF's `sriov_numvfs`. It lays out the VF entries in the fixture sysfs
//! tree ([`FixtureHost::set_num_vfs`]) and creates the VF netdevs as real
//! macvlan interfaces (mode bridge) over the PF's real netdev in the node
//! netns, named and addressed as the fixture names them. Each VF netdev's
//! `mtu` file in the fixture becomes a link to the real interface's
//! (see [`link_mtu`]), so an MTU the agent sets through netlink reads back
//! through sysfs as it would on a host.
//!
//! Why polling (every 10 ms) rather than inotify: the thread must compare
//! the file's content with the count it last acted on anyway, because (a)
//! laying out the fixture rewrites the same file (its own write must not
//! look like a new request), (b) two back-to-back writes ("0" then "N")
//! may show up as one event or be read only after both, and only the last
//! value counts, and (c) the thread must stop promptly when the test ends,
//! which a blocking inotify read would not. A 10 ms read of one small file
//! per PF does all three without event bookkeeping; the agent polls for
//! the new VFs every 500 ms, so the delay never shows.
//!
//! Unlike a real kernel, the write returns before the work is done: the
//! agent waits for new VFs anyway, but a pass that removes VFs may report
//! the PF mid-removal (the file briefly holds the old count again, since
//! `set_num_vfs` reads the current count from it), so the test waits for
//! the [`KernelEvent`] and reads the count from the next pass. A write
//! landing while the thread lays out the previous one can be overwritten
//! by it; the agent never writes while it waits for VFs, so this does not
//! happen in the test. VFs removed while their netdev is in a pod netns
//! are reported as `Failed` (the real kernel would destroy the netdev
//! wherever it is).

use kroce_cni::testing::testbed::ip;
use sriov_helpers::PciAddress;
use sriov_helpers::fixture::FixtureHost;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

const TICK: Duration = Duration::from_millis(10);

/// What the simulated kernel did, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KernelEvent {
    /// A write of `sriov_numvfs` acted on: `pf` went from `from` to `to` VFs.
    NumVfs { pf: String, from: u32, to: u32 },
    /// Something it could not do (the test fails on any).
    Failed(String),
}

/// One PF the kernel watches: its PCI address and real netdev name.
#[derive(Debug, Clone)]
pub struct WatchedPf {
    pub pci: PciAddress,
    pub ifname: String,
}

#[derive(Debug)]
pub struct SimKernel {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<FixtureHost>>,
    events: Arc<Mutex<Vec<KernelEvent>>>,
}

/// Replaces the fixture's `mtu` file of `ifname` with a symlink to the real
/// interface's, `view` being the node netns' `sys/class/net` as seen from
/// outside (through a process whose mount namespace has that sysfs). While
/// the interface is in another netns the link dangles and the MTU reads as
/// unknown, as sysfs of the node netns would not list it either.
pub fn link_mtu(fixture_root: &Path, view: &Path, ifname: &str) -> std::io::Result<()> {
    let file = fixture_root.join("sys/class/net").join(ifname).join("mtu");
    std::fs::remove_file(&file)?;
    std::os::unix::fs::symlink(view.join(ifname).join("mtu"), &file)
}

/// The MAC the fixture gives a PCI function (`02:<domain>:<bus>:<dev>:<fn>:42`).
/// Predicted so the real netdev can exist before the fixture shows the VF;
/// checked against the fixture's `address` file right after.
pub fn fixture_mac(a: &PciAddress) -> String {
    format!(
        "02:{:02x}:{:02x}:{:02x}:{:02x}:42",
        (a.domain & 0xff) as u8,
        a.bus,
        a.device,
        a.function
    )
}

fn numvfs_path(fx: &FixtureHost, pf: &PciAddress) -> PathBuf {
    fx.root()
        .pci_devices()
        .join(pf.to_string())
        .join("sriov_numvfs")
}

fn read_count(path: &Path) -> Option<u32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// The netdev names the fixture lists under a PCI function.
fn fixture_netdevs(fx: &FixtureHost, pci: &PciAddress) -> Vec<String> {
    let mut v: Vec<String> =
        std::fs::read_dir(fx.root().pci_devices().join(pci.to_string()).join("net"))
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
    v.sort();
    v
}

struct Ctx<'a> {
    netns: &'a str,
    view: &'a Path,
}

impl Ctx<'_> {
    fn ip(&self, args: &[&str]) -> Result<String, String> {
        let mut a = vec!["-n", self.netns];
        a.extend_from_slice(args);
        ip(&a).map_err(|e| e.to_string())
    }

    /// One acted-on write: `from` -> `to` VFs on `pf`.
    fn apply(
        &self,
        fx: &mut FixtureHost,
        pf: &WatchedPf,
        from: u32,
        to: u32,
    ) -> Result<(), String> {
        let going: Vec<String> = (to..from)
            .filter_map(|i| fx.vf_address(&pf.pci, i).ok())
            .flat_map(|vf| fixture_netdevs(fx, &vf))
            .collect();
        // New VF netdevs exist before the fixture shows the VFs: the agent
        // sets their MTU as soon as it sees them.
        let mut coming = Vec::new();
        for i in from..to {
            let vf = fx.vf_address(&pf.pci, i).map_err(|e| e.to_string())?;
            let name = format!("{}v{i}", pf.ifname);
            let mac = fixture_mac(&vf);
            self.ip(&[
                "link", "add", &name, "link", &pf.ifname, "address", &mac, "mtu", "1500", "type",
                "macvlan", "mode", "bridge",
            ])?;
            coming.push((vf, name, mac));
        }
        // `set_num_vfs` takes the current count from the file the agent
        // just overwrote: put back the count the fixture really has.
        let path = numvfs_path(fx, &pf.pci);
        std::fs::write(&path, format!("{from}\n"))
            .map_err(|e| format!("{}: {e}", path.display()))?;
        fx.set_num_vfs(&pf.pci, to)
            .map_err(|e| format!("fixture set_num_vfs({}, {to}): {e}", pf.pci))?;
        // Between `set_num_vfs` and the links below the VF `mtu` files are
        // plain "1500", which is also what the new real netdevs have; the
        // agent reads them only after its next 500 ms poll, long after.
        for (vf, name, mac) in coming {
            let listed = fixture_netdevs(fx, &vf);
            if listed != [name.clone()] {
                return Err(format!(
                    "fixture names the netdev of VF {vf} {listed:?}, the simulated kernel made {name}"
                ));
            }
            let addr = std::fs::read_to_string(
                fx.path().join("sys/class/net").join(&name).join("address"),
            )
            .unwrap_or_default();
            if addr.trim() != mac {
                return Err(format!(
                    "fixture gives {name} MAC {:?}, the simulated kernel used {mac}",
                    addr.trim()
                ));
            }
            link_mtu(fx.path(), self.view, &name).map_err(|e| format!("{name}: mtu link: {e}"))?;
        }
        for name in going {
            self.ip(&["link", "del", &name])?;
        }
        Ok(())
    }
}

impl SimKernel {
    /// Watches `pfs` of `fx`; VF netdevs go into the netns `netns`; `view`
    /// is the node netns' `sys/class/net` as seen from here.
    pub fn start(fx: FixtureHost, netns: &str, view: &Path, pfs: Vec<WatchedPf>) -> SimKernel {
        let stop = Arc::new(AtomicBool::new(false));
        let events = Arc::new(Mutex::new(Vec::new()));
        let (stop2, events2) = (stop.clone(), events.clone());
        let netns = netns.to_string();
        let view = view.to_path_buf();
        let thread = std::thread::Builder::new()
            .name("sim-kernel".into())
            .spawn(move || {
                let mut fx = fx;
                let ctx = Ctx {
                    netns: &netns,
                    view: &view,
                };
                let mut known: Vec<u32> = pfs
                    .iter()
                    .map(|p| read_count(&numvfs_path(&fx, &p.pci)).unwrap_or(0))
                    .collect();
                let record = |e: KernelEvent| {
                    if let Ok(mut v) = events2.lock() {
                        v.push(e);
                    }
                };
                while !stop2.load(Ordering::Relaxed) {
                    for (pf, known) in pfs.iter().zip(known.iter_mut()) {
                        let path = numvfs_path(&fx, &pf.pci);
                        // Unreadable or empty: caught mid-write, next tick.
                        let Some(want) = read_count(&path) else {
                            continue;
                        };
                        if want == *known {
                            continue;
                        }
                        match ctx.apply(&mut fx, pf, *known, want) {
                            Ok(()) => record(KernelEvent::NumVfs {
                                pf: pf.pci.to_string(),
                                from: *known,
                                to: want,
                            }),
                            Err(e) => record(KernelEvent::Failed(format!(
                                "{} {} -> {want}: {e}",
                                pf.pci, *known
                            ))),
                        }
                        *known = read_count(&path).unwrap_or(want);
                    }
                    std::thread::sleep(TICK);
                }
                fx
            })
            .expect("spawn the simulated kernel thread");
        SimKernel {
            stop,
            thread: Some(thread),
            events,
        }
    }

    pub fn events(&self) -> Vec<KernelEvent> {
        self.events.lock().map(|v| v.clone()).unwrap_or_default()
    }

    /// Stops the thread; gives the fixture back (dropped with it otherwise).
    pub fn stop(&mut self) -> Option<FixtureHost> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().and_then(|t| t.join().ok())
    }
}

impl Drop for SimKernel {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}
