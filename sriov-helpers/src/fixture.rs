//! Fixture hosts: sysfs/dev/proc trees laid out the way a real kernel lays
//! them out, so the host model is tested on the same awkwardness:
//! `sys/bus/pci/devices/<bdf>`, `sys/class/net/<if>` and
//! `sys/class/infiniband/<dev>` are relative symlinks into `sys/devices/…`;
//! Ethernet-mode ConnectX has no `issm`; rxe lives under `sys/devices/virtual`.
//!
//! Char devices under `dev/infiniband` are plain files unless
//! [`FixtureHost::make_real_char_devices`] is asked for (needs root).

use crate::pci::PciAddress;
use crate::root::HostRoot;
use std::io;
use std::net::Ipv4Addr;
use std::path::{Component, Path, PathBuf};

pub const MELLANOX: u16 = 0x15b3;
pub const CX6DX_PF: u16 = 0x101d;
pub const CX6DX_VF: u16 = 0x101e;
pub const ETHERNET_CLASS: u32 = 0x020000;
pub const INTEL: u16 = 0x8086;
/// Intel 82576 (`igb`), the NIC QEMU's `igb` device emulates, and its VF (`igbvf`).
pub const I82576_PF: u16 = 0x10c9;
pub const I82576_VF: u16 = 0x10ca;

/// Which link layer the RDMA ports report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkLayer {
    Ethernet,
    InfiniBand,
}

/// One physical function to lay out.
#[derive(Debug, Clone)]
pub struct PfSpec {
    pub address: PciAddress,
    pub ifname: String,
    /// `None` writes `-1` (unknown), as firmware without SRAT/_PXM does.
    pub numa_node: Option<u32>,
    pub local_cpus: String,
    pub vendor: u16,
    pub pf_device: u16,
    pub vf_device: u16,
    pub driver: String,
    /// The VFs' driver (`mlx5_core` binds both; Intel's VFs have `igbvf`).
    pub vf_driver: String,
    pub total_vfs: u32,
    pub num_vfs: u32,
    /// Give the PF and each VF an `mlx5_N` RDMA device with char devices.
    pub rdma: bool,
    pub link_layer: LinkLayer,
    /// First VF's function offset from the PF (ConnectX dual-port cards: 2).
    pub vf_offset: u32,
    /// Routing-ID distance between VFs (`sriov_stride`).
    pub vf_stride: u32,
    pub mtu: u32,
    pub rate: String,
}

impl PfSpec {
    /// A ConnectX-6 Dx port with `num_vfs` VFs.
    pub fn connectx6dx(address: &str, ifname: &str, numa: Option<u32>, num_vfs: u32) -> PfSpec {
        PfSpec {
            address: address.parse().unwrap_or(PciAddress::new(0, 0x3b, 0, 0)),
            ifname: ifname.to_string(),
            numa_node: numa,
            local_cpus: match numa {
                Some(0) => "0-15".into(),
                Some(1) => "16-31".into(),
                _ => "0-31".into(),
            },
            vendor: MELLANOX,
            pf_device: CX6DX_PF,
            vf_device: CX6DX_VF,
            driver: "mlx5_core".into(),
            vf_driver: "mlx5_core".into(),
            total_vfs: 127,
            num_vfs,
            rdma: true,
            link_layer: LinkLayer::Ethernet,
            vf_offset: 2,
            vf_stride: 1,
            mtu: 9000,
            rate: "100 Gb/sec (2X HDR)".into(),
        }
    }

    /// An Intel 82576 port as QEMU's `igb` emulates it: up to 8 VFs at
    /// offset 0x80, stride 2, bound to `igbvf`, no RDMA device of their own
    /// (an rxe on a VF netdev gives them one: [`FixtureHost::add_rxe_on_vf`]).
    pub fn igb(address: &str, ifname: &str, numa: Option<u32>, num_vfs: u32) -> PfSpec {
        PfSpec {
            vendor: INTEL,
            pf_device: I82576_PF,
            vf_device: I82576_VF,
            driver: "igb".into(),
            vf_driver: "igbvf".into(),
            total_vfs: 8,
            rdma: false,
            vf_offset: 0x80,
            vf_stride: 2,
            mtu: 1500,
            rate: String::new(),
            ..PfSpec::connectx6dx(address, ifname, numa, num_vfs)
        }
    }
}

/// A host tree under a directory. Owns its temp dir (if it made one) and
/// removes it on drop.
#[derive(Debug)]
pub struct FixtureHost {
    path: PathBuf,
    _tmp: Option<tempfile::TempDir>,
    specs: Vec<PfSpec>,
    next_irq: u32,
}

fn io_ctx(path: &Path, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

fn write(path: &Path, content: &str) -> io::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|e| io_ctx(parent, e))?;
    }
    std::fs::write(path, content).map_err(|e| io_ctx(path, e))
}

fn mkdir(path: &Path) -> io::Result<()> {
    std::fs::create_dir_all(path).map_err(|e| io_ctx(path, e))
}

/// A relative symlink at `link` pointing at `target` (both absolute), the way
/// sysfs writes them (`../../../devices/pci0000:3a/…`).
fn rel_symlink(target: &Path, link: &Path) -> io::Result<()> {
    let parent = link.parent().unwrap_or(Path::new("/"));
    mkdir(parent)?;
    let t: Vec<Component> = target.components().collect();
    let p: Vec<Component> = parent.components().collect();
    let mut common = t.iter().zip(p.iter()).take_while(|(a, b)| a == b).count();
    // Like sysfs, name the target even when it is an ancestor (`../../../0000:3b:00.0`).
    if common == t.len() {
        common -= 1;
    }
    let mut rel = PathBuf::new();
    for _ in common..p.len() {
        rel.push("..");
    }
    for c in &t[common..] {
        rel.push(c);
    }
    let _ = std::fs::remove_file(link);
    std::os::unix::fs::symlink(&rel, link).map_err(|e| io_ctx(link, e))
}

fn remove_path(path: &Path) -> io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_ctx(path, e)),
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(path).map_err(|e| io_ctx(path, e)),
        Ok(_) => std::fs::remove_file(path).map_err(|e| io_ctx(path, e)),
    }
}

/// MAC for a PCI function: locally administered, derived from its address.
fn mac_for(addr: &PciAddress) -> String {
    format!(
        "02:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
        (addr.domain & 0xff) as u8,
        addr.bus,
        addr.device,
        addr.function,
        0x42
    )
}

fn vf_address(pf: &PciAddress, offset: u32, index: u32) -> PciAddress {
    vf_address_strided(pf, offset, 1, index)
}

fn vf_address_strided(pf: &PciAddress, offset: u32, stride: u32, index: u32) -> PciAddress {
    let f = u32::from(pf.device) * 8 + u32::from(pf.function) + offset + index * stride;
    PciAddress::new(pf.domain, pf.bus, ((f / 8) & 0x1f) as u8, (f % 8) as u8)
}

impl FixtureHost {
    /// An empty host in a new temp dir.
    pub fn new() -> io::Result<FixtureHost> {
        let tmp = tempfile::Builder::new().prefix("kroce-host-").tempdir()?;
        let mut h = FixtureHost::at(tmp.path())?;
        h._tmp = Some(tmp);
        Ok(h)
    }

    /// An empty host under `path` (kept after drop).
    pub fn at(path: &Path) -> io::Result<FixtureHost> {
        for d in [
            "sys/bus/pci/devices",
            "sys/bus/pci/drivers",
            "sys/class/net",
            "sys/class/infiniband",
            "sys/class/infiniband_verbs",
            "sys/class/infiniband_mad",
            "sys/devices/system/node",
            "sys/devices/virtual/net",
            "proc/irq",
            "dev/infiniband",
        ] {
            mkdir(&path.join(d))?;
        }
        write(&path.join("sys/class/infiniband_verbs/abi_version"), "6\n")?;
        write(&path.join("sys/class/infiniband_mad/abi_version"), "5\n")?;
        Ok(FixtureHost {
            path: path.to_path_buf(),
            _tmp: None,
            specs: Vec::new(),
            next_irq: 100,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn root(&self) -> HostRoot {
        HostRoot::new(&self.path)
    }

    fn sys(&self) -> PathBuf {
        self.path.join("sys")
    }

    /// Two ConnectX-6 Dx PFs, `ens1f0` on NUMA 0 and `ens2f0` on NUMA 1, 8 VFs
    /// each, every function with its `mlx5_N` device; `rdma_cm` present.
    pub fn connectx6dx_pair() -> io::Result<FixtureHost> {
        let mut h = FixtureHost::new()?;
        h.populate_connectx6dx_pair()?;
        Ok(h)
    }

    pub fn populate_connectx6dx_pair(&mut self) -> io::Result<()> {
        self.add_numa_node(0, "0-15")?;
        self.add_numa_node(1, "16-31")?;
        self.add_rdma_cm()?;
        self.add_pf(PfSpec::connectx6dx("0000:3b:00.0", "ens1f0", Some(0), 8))?;
        self.add_pf(PfSpec::connectx6dx("0000:86:00.0", "ens2f0", Some(1), 8))?;
        Ok(())
    }

    /// A host whose firmware reports no NUMA affinity (`numa_node` = -1).
    pub fn unknown_numa() -> io::Result<FixtureHost> {
        let mut h = FixtureHost::new()?;
        h.add_numa_node(0, "0-7")?;
        h.add_rdma_cm()?;
        h.add_pf(PfSpec::connectx6dx("0000:05:00.0", "enp5s0f0np0", None, 4))?;
        Ok(h)
    }

    /// `pfs` PFs with `vfs` VFs each, spread over two NUMA nodes (bench size).
    pub fn many(pfs: u32, vfs: u32) -> io::Result<FixtureHost> {
        let mut h = FixtureHost::new()?;
        h.add_numa_node(0, "0-31")?;
        h.add_numa_node(1, "32-63")?;
        h.add_rdma_cm()?;
        for i in 0..pfs {
            let mut spec = PfSpec::connectx6dx(
                &format!("0000:{:02x}:00.0", 0x10 + i * 2),
                &format!("ens{}f0", i + 1),
                Some(i % 2),
                vfs,
            );
            spec.total_vfs = vfs.max(spec.total_vfs);
            spec.vf_offset = 1;
            h.add_pf(spec)?;
        }
        Ok(h)
    }

    /// A ConnectX pair with damage: a dangling `virtfn` link, a VF without a
    /// `vendor` file, a garbage `numa_node`, a dangling `class/net` link and
    /// a `uverbs` entry without `ibdev`. Returns what was broken.
    pub fn broken() -> io::Result<(FixtureHost, BrokenParts)> {
        let h = FixtureHost::connectx6dx_pair()?;
        let root = h.path().to_path_buf();
        let sys = root.join("sys");
        // 1. VF 3 of ens1f0: its device directory vanished, links dangle.
        let gone = vf_address(&PciAddress::new(0, 0x3b, 0, 0), 2, 3);
        let gone_dir = std::fs::canonicalize(sys.join("bus/pci/devices").join(gone.to_string()))?;
        remove_path(&gone_dir)?;
        // 2. VF 1 of ens2f0 lost its vendor file.
        let no_vendor = vf_address(&PciAddress::new(0, 0x86, 0, 0), 2, 1);
        remove_path(
            &sys.join("bus/pci/devices")
                .join(no_vendor.to_string())
                .join("vendor"),
        )?;
        // 3. VF 2 of ens2f0 has a garbage numa_node.
        let bad_numa = vf_address(&PciAddress::new(0, 0x86, 0, 0), 2, 2);
        write(
            &sys.join("bus/pci/devices")
                .join(bad_numa.to_string())
                .join("numa_node"),
            "banana\n",
        )?;
        // 4. A netdev whose device dir is gone.
        rel_symlink(
            &sys.join("devices/virtual/net/ghost0"),
            &sys.join("class/net/ghost0"),
        )?;
        // 5. A uverbs entry with no ibdev file.
        mkdir(&sys.join("devices/virtual/infiniband_verbs/uverbs99"))?;
        rel_symlink(
            &sys.join("devices/virtual/infiniband_verbs/uverbs99"),
            &sys.join("class/infiniband_verbs/uverbs99"),
        )?;
        Ok((
            h,
            BrokenParts {
                dangling_vf: gone,
                no_vendor_vf: no_vendor,
                bad_numa_vf: bad_numa,
                dangling_netdev: "ghost0".into(),
                no_ibdev_uverbs: "uverbs99".into(),
            },
        ))
    }

    pub fn add_numa_node(&mut self, id: u32, cpus: &str) -> io::Result<()> {
        write(
            &self
                .sys()
                .join(format!("devices/system/node/node{id}/cpulist")),
            &format!("{cpus}\n"),
        )
    }

    pub fn add_rdma_cm(&mut self) -> io::Result<()> {
        write(&self.path.join("dev/infiniband/rdma_cm"), "")
    }

    fn device_dir(&self, addr: &PciAddress) -> PathBuf {
        // Real hosts hang endpoints below a root port: pci0000:3a/0000:3a:02.0/0000:3b:00.0
        let upstream = addr.bus.saturating_sub(1);
        self.sys()
            .join(format!("devices/pci{:04x}:{:02x}", addr.domain, upstream))
            .join(format!("{:04x}:{:02x}:02.0", addr.domain, upstream))
            .join(addr.to_string())
    }

    fn next_index(&self, class_dir: &str, prefix: &str) -> u32 {
        let mut max: Option<u32> = None;
        if let Ok(rd) = std::fs::read_dir(self.sys().join(class_dir)) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if let Some(n) = name
                    .strip_prefix(prefix)
                    .and_then(|n| n.parse::<u32>().ok())
                {
                    max = Some(max.map_or(n, |m| m.max(n)));
                }
            }
        }
        max.map_or(0, |m| m + 1)
    }

    fn alloc_irqs(&mut self, dir: &Path, count: u32, cpus: &str) -> io::Result<()> {
        for _ in 0..count {
            let irq = self.next_irq;
            self.next_irq += 1;
            write(&dir.join("msi_irqs").join(irq.to_string()), "msix\n")?;
            write(
                &self
                    .path
                    .join("proc/irq")
                    .join(irq.to_string())
                    .join("smp_affinity_list"),
                &format!("{cpus}\n"),
            )?;
        }
        Ok(())
    }

    /// Lays out one PCI function: identity files, driver, NUMA, bus link.
    fn add_function(
        &mut self,
        addr: &PciAddress,
        spec: &PfSpec,
        device: u16,
        driver: &str,
        irqs: u32,
    ) -> io::Result<PathBuf> {
        let dir = self.device_dir(addr);
        mkdir(&dir)?;
        write(&dir.join("vendor"), &format!("0x{:04x}\n", spec.vendor))?;
        write(&dir.join("device"), &format!("0x{device:04x}\n"))?;
        write(&dir.join("class"), &format!("0x{ETHERNET_CLASS:06x}\n"))?;
        write(
            &dir.join("subsystem_vendor"),
            &format!("0x{:04x}\n", spec.vendor),
        )?;
        write(&dir.join("subsystem_device"), "0x0016\n")?;
        write(&dir.join("revision"), "0x00\n")?;
        // What rdma-core's provider matching and udev read first.
        write(
            &dir.join("modalias"),
            &format!(
                "pci:v{:08X}d{:08X}sv{:08X}sd{:08X}bc{:02X}sc{:02X}i{:02X}\n",
                spec.vendor,
                device,
                spec.vendor,
                0x0016,
                (ETHERNET_CLASS >> 16) & 0xff,
                (ETHERNET_CLASS >> 8) & 0xff,
                ETHERNET_CLASS & 0xff
            ),
        )?;
        let numa = spec.numa_node.map_or(-1i64, i64::from);
        write(&dir.join("numa_node"), &format!("{numa}\n"))?;
        write(
            &dir.join("local_cpulist"),
            &format!("{}\n", spec.local_cpus),
        )?;
        let drv = self.sys().join("bus/pci/drivers").join(driver);
        mkdir(&drv)?;
        rel_symlink(&drv, &dir.join("driver"))?;
        rel_symlink(
            &dir,
            &self.sys().join("bus/pci/devices").join(addr.to_string()),
        )?;
        self.alloc_irqs(&dir, irqs, &spec.local_cpus.clone())?;
        Ok(dir)
    }

    fn add_pci_netdev(
        &mut self,
        dev_dir: &Path,
        ifname: &str,
        mac: &str,
        mtu: u32,
    ) -> io::Result<()> {
        let nd = dev_dir.join("net").join(ifname);
        let ifindex = self.next_index("class/net", "") + 2 + self.count_netdevs();
        write(&nd.join("operstate"), "up\n")?;
        write(&nd.join("carrier"), "1\n")?;
        write(&nd.join("address"), &format!("{mac}\n"))?;
        write(&nd.join("mtu"), &format!("{mtu}\n"))?;
        write(&nd.join("ifindex"), &format!("{ifindex}\n"))?;
        rel_symlink(dev_dir, &nd.join("device"))?;
        rel_symlink(&nd, &self.sys().join("class/net").join(ifname))
    }

    fn count_netdevs(&self) -> u32 {
        std::fs::read_dir(self.sys().join("class/net"))
            .map(|rd| rd.count() as u32)
            .unwrap_or(0)
    }

    /// An RDMA device with one port under `parent_dir`, linked from
    /// `class/infiniband`, with its uverbs/umad (and issm on InfiniBand).
    fn add_rdma(&mut self, parent_dir: &Path, r: RdmaLayout<'_>) -> io::Result<()> {
        let RdmaLayout {
            name,
            netdev,
            mac,
            link_layer,
            rate,
            pci,
        } = r;
        let ib = parent_dir.join("infiniband").join(name);
        if pci {
            rel_symlink(parent_dir, &ib.join("device"))?;
        } else {
            write(&ib.join("parent"), &format!("{netdev}\n"))?;
        }
        write(&ib.join("node_type"), "1: CA\n")?;
        let guid = node_guid(mac);
        write(&ib.join("node_guid"), &format!("{guid}\n"))?;
        write(&ib.join("sys_image_guid"), &format!("{guid}\n"))?;
        if pci {
            write(&ib.join("fw_ver"), "22.39.1002\n")?;
            write(&ib.join("hca_type"), "MT4125\n")?;
        } else {
            // ib_core's fw_ver is empty without a driver hook (rxe has none),
            // and hca_type is mlx5's own attribute.
            write(&ib.join("fw_ver"), "\n")?;
            write(&ib.join("node_desc"), &format!("{name}\n"))?;
        }
        let port = ib.join("ports/1");
        write(&port.join("state"), "4: ACTIVE\n")?;
        write(&port.join("phys_state"), "5: LinkUp\n")?;
        let ll = match link_layer {
            LinkLayer::Ethernet => "Ethernet",
            LinkLayer::InfiniBand => "InfiniBand",
        };
        write(&port.join("link_layer"), &format!("{ll}\n"))?;
        write(&port.join("rate"), &format!("{rate}\n"))?;
        // GID 0/1: link-local from the MAC (RoCE v1 and v2); the rest empty.
        let eui = link_local_gid(mac);
        for i in 0..8u32 {
            let gid = if i < 2 {
                eui.clone()
            } else {
                "0000:0000:0000:0000:0000:0000:0000:0000".to_string()
            };
            write(&port.join("gids").join(i.to_string()), &format!("{gid}\n"))?;
            if i < 2 {
                let ty = if i == 0 { "IB/RoCE v1" } else { "RoCE v2" };
                write(
                    &port.join("gid_attrs/types").join(i.to_string()),
                    &format!("{ty}\n"),
                )?;
                write(
                    &port.join("gid_attrs/ndevs").join(i.to_string()),
                    &format!("{netdev}\n"),
                )?;
            }
        }
        rel_symlink(&ib, &self.sys().join("class/infiniband").join(name))?;
        // uverbs under the same parent, as the kernel does.
        let n = self.next_index("class/infiniband_verbs", "uverbs");
        let uv = parent_dir
            .join("infiniband_verbs")
            .join(format!("uverbs{n}"));
        write(&uv.join("ibdev"), &format!("{name}\n"))?;
        // The uverbs ABI libibverbs checks against its provider (mlx5: 1).
        write(&uv.join("abi_version"), "1\n")?;
        write(&uv.join("dev"), &format!("231:{}\n", 192 + n))?;
        rel_symlink(
            &uv,
            &self
                .sys()
                .join("class/infiniband_verbs")
                .join(format!("uverbs{n}")),
        )?;
        write(&self.path.join(format!("dev/infiniband/uverbs{n}")), "")?;
        let m = self.next_index("class/infiniband_mad", "umad");
        let um = parent_dir.join("infiniband_mad").join(format!("umad{m}"));
        write(&um.join("ibdev"), &format!("{name}\n"))?;
        write(&um.join("port"), "1\n")?;
        write(&um.join("dev"), &format!("231:{m}\n"))?;
        rel_symlink(
            &um,
            &self
                .sys()
                .join("class/infiniband_mad")
                .join(format!("umad{m}")),
        )?;
        write(&self.path.join(format!("dev/infiniband/umad{m}")), "")?;
        if link_layer == LinkLayer::InfiniBand {
            let is = parent_dir.join("infiniband_mad").join(format!("issm{m}"));
            write(&is.join("ibdev"), &format!("{name}\n"))?;
            write(&is.join("port"), "1\n")?;
            write(&is.join("dev"), &format!("231:{}\n", 64 + m))?;
            rel_symlink(
                &is,
                &self
                    .sys()
                    .join("class/infiniband_mad")
                    .join(format!("issm{m}")),
            )?;
            write(&self.path.join(format!("dev/infiniband/issm{m}")), "")?;
        }
        Ok(())
    }

    /// Adds a PF with `spec.num_vfs` VFs (as the kernel would after writing
    /// `sriov_numvfs`).
    pub fn add_pf(&mut self, spec: PfSpec) -> io::Result<()> {
        let addr = spec.address;
        let dir = self.add_function(&addr, &spec, spec.pf_device, &spec.driver, 8)?;
        write(
            &dir.join("sriov_totalvfs"),
            &format!("{}\n", spec.total_vfs),
        )?;
        write(&dir.join("sriov_numvfs"), "0\n")?;
        write(&dir.join("sriov_offset"), &format!("{}\n", spec.vf_offset))?;
        write(&dir.join("sriov_stride"), &format!("{}\n", spec.vf_stride))?;
        let mac = mac_for(&addr);
        self.add_pci_netdev(&dir, &spec.ifname, &mac, spec.mtu)?;
        if spec.rdma {
            let name = format!("mlx5_{}", self.next_index("class/infiniband", "mlx5_"));
            self.add_rdma(
                &dir,
                RdmaLayout {
                    name: &name,
                    netdev: &spec.ifname,
                    mac: &mac,
                    link_layer: spec.link_layer,
                    rate: &spec.rate,
                    pci: true,
                },
            )?;
        }
        let n = spec.num_vfs;
        self.specs.push(spec);
        self.set_num_vfs(&addr, n)
    }

    fn spec(&self, pf: &PciAddress) -> io::Result<PfSpec> {
        self.specs
            .iter()
            .find(|s| s.address == *pf)
            .cloned()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no PF {pf}")))
    }

    /// What the kernel does on a write to `sriov_numvfs`: create or remove VF
    /// functions with their netdevs, RDMA devices and char devices.
    pub fn set_num_vfs(&mut self, pf: &PciAddress, num: u32) -> io::Result<()> {
        let spec = self.spec(pf)?;
        let pf_dir = self.device_dir(pf);
        let current: u32 = std::fs::read_to_string(pf_dir.join("sriov_numvfs"))
            .map_err(|e| io_ctx(&pf_dir, e))?
            .trim()
            .parse()
            .unwrap_or(0);
        for i in num..current {
            self.remove_vf(pf, &spec, i)?;
        }
        for i in current..num {
            self.add_vf(pf, &spec, i)?;
        }
        write(&pf_dir.join("sriov_numvfs"), &format!("{num}\n"))
    }

    fn add_vf(&mut self, pf: &PciAddress, spec: &PfSpec, index: u32) -> io::Result<()> {
        let vf = vf_address_strided(pf, spec.vf_offset, spec.vf_stride, index);
        let dir = self.add_function(&vf, spec, spec.vf_device, &spec.vf_driver, 3)?;
        let pf_dir = self.device_dir(pf);
        rel_symlink(&pf_dir, &dir.join("physfn"))?;
        rel_symlink(&dir, &pf_dir.join(format!("virtfn{index}")))?;
        let ifname = format!("{}v{index}", spec.ifname);
        let mac = mac_for(&vf);
        self.add_pci_netdev(&dir, &ifname, &mac, 1500)?;
        if spec.rdma {
            let name = format!("mlx5_{}", self.next_index("class/infiniband", "mlx5_"));
            self.add_rdma(
                &dir,
                RdmaLayout {
                    name: &name,
                    netdev: &ifname,
                    mac: &mac,
                    link_layer: spec.link_layer,
                    rate: &spec.rate,
                    pci: true,
                },
            )?;
        }
        Ok(())
    }

    fn remove_vf(&mut self, pf: &PciAddress, spec: &PfSpec, index: u32) -> io::Result<()> {
        let vf = vf_address_strided(pf, spec.vf_offset, spec.vf_stride, index);
        let dir = self.device_dir(&vf);
        self.remove_function_links(&dir)?;
        remove_path(&self.device_dir(pf).join(format!("virtfn{index}")))?;
        remove_path(&self.sys().join("bus/pci/devices").join(vf.to_string()))?;
        remove_path(&dir)
    }

    /// Removes the class links and dev nodes that point into `dir`.
    fn remove_function_links(&self, dir: &Path) -> io::Result<()> {
        for (sub, class) in [
            ("net", "class/net"),
            ("infiniband", "class/infiniband"),
            ("infiniband_verbs", "class/infiniband_verbs"),
            ("infiniband_mad", "class/infiniband_mad"),
        ] {
            if let Ok(rd) = std::fs::read_dir(dir.join(sub)) {
                for e in rd.flatten() {
                    let name = e.file_name();
                    remove_path(&self.sys().join(class).join(&name))?;
                    if sub.starts_with("infiniband_") {
                        remove_path(&self.path.join("dev/infiniband").join(&name))?;
                    }
                }
            }
        }
        if let Ok(rd) = std::fs::read_dir(dir.join("msi_irqs")) {
            for e in rd.flatten() {
                remove_path(&self.path.join("proc/irq").join(e.file_name()))?;
            }
        }
        Ok(())
    }

    /// A plain (virtual) netdev under `sys/devices/virtual/net`.
    pub fn add_virtual_netdev(&mut self, ifname: &str, mac: &str, mtu: u32) -> io::Result<()> {
        let nd = self.sys().join("devices/virtual/net").join(ifname);
        let ifindex = 2 + self.count_netdevs();
        write(&nd.join("operstate"), "up\n")?;
        write(&nd.join("carrier"), "1\n")?;
        write(&nd.join("address"), &format!("{mac}\n"))?;
        write(&nd.join("mtu"), &format!("{mtu}\n"))?;
        write(&nd.join("ifindex"), &format!("{ifindex}\n"))?;
        rel_symlink(&nd, &self.sys().join("class/net").join(ifname))
    }

    /// An rxe soft RDMA device over `netdev` (created as a virtual netdev if
    /// it does not exist), under `sys/devices/virtual/infiniband`.
    pub fn add_rxe(&mut self, name: &str, netdev: &str) -> io::Result<()> {
        if std::fs::symlink_metadata(self.sys().join("class/net").join(netdev)).is_err() {
            let mac = format!("02:00:00:00:{:02x}:01", self.count_netdevs() as u8);
            self.add_virtual_netdev(netdev, &mac, 1500)?;
        }
        let mac =
            std::fs::read_to_string(self.sys().join("class/net").join(netdev).join("address"))
                .unwrap_or_else(|_| "02:00:00:00:00:01".into());
        let virt = self.sys().join("devices/virtual");
        self.add_rdma(
            &virt,
            RdmaLayout {
                name,
                netdev,
                mac: mac.trim(),
                link_layer: LinkLayer::Ethernet,
                rate: "10 Gb/sec (1X QDR)",
                pci: false,
            },
        )
    }

    /// An rxe created on VF `index` of `pf` (`rdma link add <name> type rxe
    /// netdev <VF netdev>`), laid out as the kernel does: under
    /// `sys/devices/virtual/infiniband/<name>` with no `device` link, its
    /// netdev named in `parent` (rxe's own attribute), `node_type` `1: CA`,
    /// one Ethernet port whose GIDs 0/1 are the netdev's link-local address
    /// (RoCE v1, RoCE v2) with `gid_attrs/ndevs` naming the netdev, and
    /// uverbs/umad under `devices/virtual` too (ib_uverbs and ib_umad parent
    /// their char devices to the RDMA device's parent, which rxe has none
    /// of). Returns the VF netdev's name.
    pub fn add_rxe_on_vf(&mut self, name: &str, pf: &PciAddress, index: u32) -> io::Result<String> {
        let vf = self.vf_address(pf, index)?;
        let net = self.device_dir(&vf).join("net");
        let ifname = std::fs::read_dir(&net)
            .map_err(|e| io_ctx(&net, e))?
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .next()
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("VF {vf} has no netdev under {}", net.display()),
                )
            })?;
        self.add_rxe(name, &ifname)?;
        Ok(ifname)
    }

    /// Adds the IPv4 GIDs (RoCE v1 at `index`, RoCE v2 at `index + 1`) the
    /// kernel creates when `ip` is configured on the device's netdev.
    pub fn add_ipv4_gid(
        &self,
        rdma_dev: &str,
        index: u32,
        ip: Ipv4Addr,
        netdev: &str,
    ) -> io::Result<()> {
        let port = self
            .sys()
            .join("class/infiniband")
            .join(rdma_dev)
            .join("ports/1");
        let o = ip.octets();
        let gid = format!(
            "0000:0000:0000:0000:0000:ffff:{:02x}{:02x}:{:02x}{:02x}",
            o[0], o[1], o[2], o[3]
        );
        for (i, ty) in [(index, "IB/RoCE v1"), (index + 1, "RoCE v2")] {
            write(&port.join("gids").join(i.to_string()), &format!("{gid}\n"))?;
            write(
                &port.join("gid_attrs/types").join(i.to_string()),
                &format!("{ty}\n"),
            )?;
            write(
                &port.join("gid_attrs/ndevs").join(i.to_string()),
                &format!("{netdev}\n"),
            )?;
        }
        Ok(())
    }

    pub fn set_operstate(&self, ifname: &str, state: &str) -> io::Result<()> {
        let dir = self.sys().join("class/net").join(ifname);
        write(&dir.join("operstate"), &format!("{state}\n"))?;
        write(
            &dir.join("carrier"),
            if state == "up" { "1\n" } else { "0\n" },
        )
    }

    pub fn set_port_state(&self, rdma_dev: &str, state: &str) -> io::Result<()> {
        write(
            &self
                .sys()
                .join("class/infiniband")
                .join(rdma_dev)
                .join("ports/1/state"),
            &format!("{state}\n"),
        )
    }

    /// Removes `dev/infiniband/<name>` (e.g. `uverbs3`), as when a driver
    /// unbinds or udev has not created it yet.
    pub fn remove_char_device(&self, name: &str) -> io::Result<()> {
        remove_path(&self.path.join("dev/infiniband").join(name))
    }

    pub fn restore_char_device(&self, name: &str) -> io::Result<()> {
        write(&self.path.join("dev/infiniband").join(name), "")
    }

    /// Removes a netdev's class link (as when it is moved into another netns).
    pub fn remove_netdev(&self, ifname: &str) -> io::Result<()> {
        remove_path(&self.sys().join("class/net").join(ifname))
    }

    /// Turns every `dev/infiniband` file into a real char device with the
    /// major:minor from sysfs (needs CAP_MKNOD), so rdma-core's tools can
    /// enumerate the tree.
    pub fn make_real_char_devices(&self) -> io::Result<()> {
        for class in ["class/infiniband_verbs", "class/infiniband_mad"] {
            let Ok(rd) = std::fs::read_dir(self.sys().join(class)) else {
                continue;
            };
            for e in rd.flatten() {
                let Ok(dev) = std::fs::read_to_string(e.path().join("dev")) else {
                    continue;
                };
                let Some((maj, min)) = dev.trim().split_once(':') else {
                    continue;
                };
                let target = self.path.join("dev/infiniband").join(e.file_name());
                remove_path(&target)?;
                let status = std::process::Command::new("mknod")
                    .arg("-m")
                    .arg("0666")
                    .arg(&target)
                    .arg("c")
                    .arg(maj)
                    .arg(min)
                    .status()?;
                if !status.success() {
                    return Err(io::Error::other(format!(
                        "mknod {} failed",
                        target.display()
                    )));
                }
            }
        }
        Ok(())
    }

    /// The VF address for `index` on `pf` (per its spec's offset).
    pub fn vf_address(&self, pf: &PciAddress, index: u32) -> io::Result<PciAddress> {
        let spec = self.spec(pf)?;
        Ok(vf_address_strided(
            pf,
            spec.vf_offset,
            spec.vf_stride,
            index,
        ))
    }
}

struct RdmaLayout<'a> {
    name: &'a str,
    netdev: &'a str,
    mac: &'a str,
    link_layer: LinkLayer,
    rate: &'a str,
    pci: bool,
}

/// A temp dir under `/dev/shm` when it is usable, else the default temp
/// dir; removed on drop. Fixture hosts are thousands of small files, and a
/// busy disk makes tests crawl.
pub fn scratch_dir(prefix: &str) -> io::Result<tempfile::TempDir> {
    let shm = Path::new("/dev/shm");
    let on_shm = if shm.is_dir() {
        tempfile::Builder::new().prefix(prefix).tempdir_in(shm).ok()
    } else {
        None
    };
    match on_shm {
        Some(d) => Ok(d),
        None => tempfile::Builder::new().prefix(prefix).tempdir(),
    }
}

/// Runs `f` and returns with its result the number of syscalls the host
/// model's sysfs layer issued on this thread meanwhile: the measure scan
/// budgets are held to (wall time on a shared CI machine is too noisy).
pub fn count_sysfs_syscalls<T>(f: impl FnOnce() -> T) -> (T, u64) {
    let before = crate::sysfs_io::syscalls();
    let out = f();
    (out, crate::sysfs_io::syscalls() - before)
}

/// What [`FixtureHost::broken`] damaged.
#[derive(Debug, Clone)]
pub struct BrokenParts {
    pub dangling_vf: PciAddress,
    pub no_vendor_vf: PciAddress,
    pub bad_numa_vf: PciAddress,
    pub dangling_netdev: String,
    pub no_ibdev_uverbs: String,
}

/// The node GUID (EUI-64 of the MAC) in sysfs' `xxxx:xxxx:xxxx:xxxx` form.
fn node_guid(mac: &str) -> String {
    let b: Vec<u8> = mac
        .split(':')
        .filter_map(|x| u8::from_str_radix(x, 16).ok())
        .collect();
    if b.len() != 6 {
        return "0000:0000:0000:0001".into();
    }
    format!(
        "{:02x}{:02x}:{:02x}ff:fe{:02x}:{:02x}{:02x}",
        b[0], b[1], b[2], b[3], b[4], b[5]
    )
}

/// `fe80::<EUI-64 of mac>` in the kernel's 8x4-hex GID notation.
fn link_local_gid(mac: &str) -> String {
    let b: Vec<u8> = mac
        .split(':')
        .filter_map(|x| u8::from_str_radix(x, 16).ok())
        .collect();
    if b.len() != 6 {
        return "fe80:0000:0000:0000:0000:0000:0000:0001".into();
    }
    format!(
        "fe80:0000:0000:0000:{:02x}{:02x}:{:02x}ff:fe{:02x}:{:02x}{:02x}",
        b[0] ^ 2,
        b[1],
        b[2],
        b[3],
        b[4],
        b[5]
    )
}
