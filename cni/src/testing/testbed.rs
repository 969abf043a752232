//! A throwaway node for tests and the bench: a fixture sysfs host (ConnectX-6
//! Dx pair) whose VF netdevs are real veths in a private "host" netns, a
//! pod netns, a state dir and a host-local data dir in temp dirs. Unique
//! names per bed, so tests run in parallel; everything goes on drop.

use super::faults::{Faults, FaultyIpam, FaultyOpener, FaultyRdma, FaultyVf};
use super::recording::{RecordingRdma, RecordingVfConfig};
use crate::commands::{self, Backends, Node, Request, Roots};
use crate::ipam::ExecIpam;
use crate::links::RtnlOpener;
use crate::log::Logger;
use crate::protocol::{CniEnv, CniError};
use kroce_contracts::cni_env;
use kroce_netlink::netns::Netns;
use serde_json::{Value, json};
use sriov_helpers::fixture::FixtureHost;
use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// Where Debian's containernetworking-plugins live.
pub const CNI_BIN_DIR: &str = "/usr/lib/cni";

/// `Err(reason)` when this process cannot create network namespaces.
pub fn netns_capable() -> Result<(), String> {
    if !nix::unistd::geteuid().is_root() {
        return Err("not root".into());
    }
    let name = format!("kcprobe{}", unique_tag());
    let ns = NetnsGuard::create(&name).map_err(|e| format!("ip netns add: {e}"))?;
    drop(ns);
    if !Path::new(CNI_BIN_DIR).join("host-local").is_file() {
        return Err(format!(
            "{CNI_BIN_DIR}/host-local missing (apt-get install containernetworking-plugins)"
        ));
    }
    Ok(())
}

/// Prints the standard skip line and returns true when the test must skip.
/// In CI (`CI` set, as `.ci/run` has it) a netns test that cannot run is a
/// failure: CI is where they must run.
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

pub fn unique_tag() -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{:x}x{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

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

/// A named netns (`/run/netns/<name>`), deleted on drop.
#[derive(Debug)]
pub struct NetnsGuard {
    pub name: String,
    pub path: PathBuf,
    deleted: bool,
}

impl NetnsGuard {
    pub fn create(name: &str) -> io::Result<NetnsGuard> {
        ip(&["netns", "add", name])?;
        Ok(NetnsGuard {
            name: name.into(),
            path: PathBuf::from("/run/netns").join(name),
            deleted: false,
        })
    }

    pub fn open(&self) -> io::Result<Netns> {
        Netns::open(&self.path)
    }

    /// `ip -n <name> <args>`.
    pub fn ip(&self, args: &[&str]) -> io::Result<String> {
        let mut a = vec!["-n", self.name.as_str()];
        a.extend_from_slice(args);
        ip(&a)
    }

    /// Deletes the netns now (a pod going away under the runtime).
    pub fn delete(&mut self) -> io::Result<()> {
        self.deleted = true;
        ip(&["netns", "del", &self.name]).map(|_| ())
    }

    /// Links as iproute2 shows them, normalized for comparison.
    pub fn links(&self) -> io::Result<Vec<LinkView>> {
        let v: Value =
            serde_json::from_str(&self.ip(&["-j", "link", "show"])?).map_err(io::Error::other)?;
        let mut out: Vec<LinkView> = v
            .as_array()
            .map(|a| a.iter().map(LinkView::from_ip_json).collect())
            .unwrap_or_default();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    pub fn link(&self, name: &str) -> Option<LinkView> {
        self.links().ok()?.into_iter().find(|l| l.name == name)
    }

    /// `ip -j addr show dev <ifname>` addresses as `a.b.c.d/len`.
    pub fn addresses(&self, ifname: &str) -> io::Result<Vec<String>> {
        let v: Value = serde_json::from_str(&self.ip(&["-j", "addr", "show", "dev", ifname])?)
            .map_err(io::Error::other)?;
        let mut out = Vec::new();
        for l in v.as_array().into_iter().flatten() {
            for a in l["addr_info"].as_array().into_iter().flatten() {
                if a["scope"] == "link" {
                    continue;
                }
                out.push(format!(
                    "{}/{}",
                    a["local"].as_str().unwrap_or_default(),
                    a["prefixlen"].as_u64().unwrap_or_default()
                ));
            }
        }
        Ok(out)
    }

    /// `ip -j route show dev <ifname>` destinations with their gateways.
    pub fn routes(&self, ifname: &str) -> io::Result<Vec<String>> {
        let v: Value = serde_json::from_str(&self.ip(&["-j", "route", "show", "dev", ifname])?)
            .map_err(io::Error::other)?;
        Ok(v.as_array()
            .into_iter()
            .flatten()
            .map(|r| match r["gateway"].as_str() {
                Some(g) => format!("{} via {g}", r["dst"].as_str().unwrap_or_default()),
                None => r["dst"].as_str().unwrap_or_default().to_string(),
            })
            .collect())
    }
}

impl Drop for NetnsGuard {
    fn drop(&mut self) {
        if !self.deleted {
            let _ = ip(&["netns", "del", &self.name]);
        }
    }
}

/// The comparable part of a link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkView {
    pub name: String,
    pub ifindex: u64,
    pub mac: String,
    pub mtu: u64,
    pub up: bool,
    pub altnames: Vec<String>,
}

impl LinkView {
    fn from_ip_json(v: &Value) -> LinkView {
        LinkView {
            name: v["ifname"].as_str().unwrap_or_default().into(),
            ifindex: v["ifindex"].as_u64().unwrap_or_default(),
            mac: v["address"].as_str().unwrap_or_default().into(),
            mtu: v["mtu"].as_u64().unwrap_or_default(),
            up: v["flags"]
                .as_array()
                .is_some_and(|f| f.iter().any(|x| x == "UP")),
            altnames: v["altnames"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|x| x.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default(),
        }
    }
}

/// The backends of in-process calls: real netlink and host-local, recording
/// PF and RDMA.
#[derive(Debug)]
pub struct Kit {
    pub links: RtnlOpener,
    pub vf: RecordingVfConfig,
    pub rdma: RecordingRdma,
    pub ipam: ExecIpam,
}

/// What an in-process call gave.
#[derive(Debug)]
pub struct CallResult {
    pub result: Result<Option<Value>, CniError>,
    pub warnings: Vec<String>,
}

impl CallResult {
    pub fn ok(self) -> Option<Value> {
        match self.result {
            Ok(v) => v,
            Err(e) => panic!("call failed: {e}"),
        }
    }

    pub fn err(self) -> CniError {
        match self.result {
            Ok(v) => panic!("call succeeded: {v:?}"),
            Err(e) => e,
        }
    }
}

/// Output of the binary.
#[derive(Debug)]
pub struct BinOutput {
    pub stdout: String,
    pub stderr: String,
    pub code: i32,
}

impl BinOutput {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or(Value::Null)
    }
}

#[derive(Debug)]
pub struct TestBed {
    pub fixture: FixtureHost,
    pub host: NetnsGuard,
    pub pod: NetnsGuard,
    pub state: tempfile::TempDir,
    pub ipam_data: tempfile::TempDir,
    pub network: String,
}

impl TestBed {
    /// `stand_ins` veths `ens1f0v0..` (peers `peer0..`, up) in the host
    /// netns; `ens1f0v0` carries the udev-style altname `enp59s0f0v0`.
    pub fn new(stand_ins: u32) -> io::Result<TestBed> {
        let fixture = FixtureHost::connectx6dx_pair()?;
        let tag = unique_tag();
        let host = NetnsGuard::create(&format!("kch{tag}"))?;
        let pod = NetnsGuard::create(&format!("kcp{tag}"))?;
        for i in 0..stand_ins {
            let name = format!("ens1f0v{i}");
            let peer = format!("peer{i}");
            host.ip(&["link", "add", &name, "type", "veth", "peer", "name", &peer])?;
            host.ip(&[
                "link",
                "set",
                &name,
                "address",
                &format!("02:00:3b:00:{:02x}:42", i + 2),
            ])?;
            host.ip(&["link", "set", &peer, "up"])?;
        }
        if stand_ins > 0 {
            host.ip(&[
                "link",
                "property",
                "add",
                "dev",
                "ens1f0v0",
                "altname",
                "enp59s0f0v0",
            ])?;
        }
        Ok(TestBed {
            fixture,
            host,
            pod,
            state: tempfile::Builder::new()
                .prefix("kroce-cni-state-")
                .tempdir()?,
            ipam_data: tempfile::Builder::new()
                .prefix("kroce-cni-ipam-")
                .tempdir()?,
            network: "kroce-test".into(),
        })
    }

    /// PCI address of VF `i` of ens1f0.
    pub fn vf_pci(&self, i: u32) -> String {
        self.fixture
            .vf_address(
                &"0000:3b:00.0"
                    .parse()
                    .unwrap_or(sriov_helpers::PciAddress::new(0, 0x3b, 0, 0)),
                i,
            )
            .map(|a| a.to_string())
            .unwrap_or_default()
    }

    /// A config for VF 0 with host-local IPAM (10.77.0.0/24, gateway .1,
    /// a route to 10.78.0.0/16); `extra` keys are merged (null removes).
    pub fn config(&self, extra: Value) -> Value {
        let mut c = json!({
            "cniVersion": "1.0.0",
            "name": self.network,
            "type": "kroce-cni",
            "deviceID": self.vf_pci(0),
            "ipam": {
                "type": "host-local",
                "dataDir": self.ipam_data.path(),
                "ranges": [[{"subnet": "10.77.0.0/24", "gateway": "10.77.0.1"}]],
                "routes": [{"dst": "10.78.0.0/16"}]
            }
        });
        if let Some(m) = extra.as_object() {
            for (k, v) in m {
                if v.is_null() {
                    c.as_object_mut().map(|o| o.remove(k));
                } else {
                    c[k] = v.clone();
                }
            }
        }
        c
    }

    /// Makes sysfs also know `name` as VF `i`'s netdev
    /// (`class/net/<name>` -> its netdev dir): the kernel's sysfs follows a
    /// rename (a VF back from a dead netns as `devN` or under its pod
    /// name), the fixture's does not, and release checks sysfs before it
    /// touches a host link.
    pub fn sysfs_alias(&self, name: &str, i: u32) -> io::Result<()> {
        let dir = self
            .fixture
            .path()
            .join("sys/bus/pci/devices")
            .join(self.vf_pci(i));
        let netdev = std::fs::read_dir(std::fs::canonicalize(&dir)?.join("net"))?
            .flatten()
            .next()
            .map(|e| e.path())
            .ok_or_else(|| io::Error::other(format!("{} has no netdev", dir.display())))?;
        std::os::unix::fs::symlink(netdev, self.fixture.path().join("sys/class/net").join(name))
    }

    /// The node kroce-cni sees: the fixture's sysfs and `dev/`, the real
    /// `/proc`, this bed's state dir.
    pub fn roots(&self) -> Roots {
        Roots {
            proc: PathBuf::from("/proc"),
            state_dir: self.state.path().to_path_buf(),
            ..Roots::under(self.fixture.path())
        }
    }

    /// [`Self::roots`] as the plugin binary reads them: the runtime's
    /// environment (`KROCE_CNI_*`).
    pub fn root_env(&self) -> HashMap<String, String> {
        let r = self.roots();
        let mut m = HashMap::new();
        m.insert(
            cni_env::HOST_ROOT.into(),
            self.fixture.path().display().to_string(),
        );
        m.insert(cni_env::PROC_ROOT.into(), r.proc.display().to_string());
        m.insert(cni_env::STATE_DIR.into(), r.state_dir.display().to_string());
        m
    }

    /// The `CNI_*` environment of one call, plus [`Self::root_env`].
    pub fn env(&self, command: &str, cid: &str, ifname: &str) -> HashMap<String, String> {
        let mut m = self.root_env();
        m.insert("CNI_COMMAND".into(), command.into());
        m.insert("CNI_CONTAINERID".into(), cid.into());
        m.insert("CNI_NETNS".into(), self.pod.path.display().to_string());
        m.insert("CNI_IFNAME".into(), ifname.into());
        m.insert("CNI_PATH".into(), CNI_BIN_DIR.into());
        m.insert("CNI_ARGS".into(), "IgnoreUnknown=1;K8S_POD_NAME=p".into());
        m
    }

    pub fn kit(&self) -> Kit {
        Kit {
            links: RtnlOpener,
            vf: RecordingVfConfig::connectx6dx_pair(),
            rdma: RecordingRdma::new(Ok(kroce_netlink::rdma::RdmaNetnsMode::Exclusive)),
            ipam: ExecIpam::default(),
        }
    }

    /// Runs one command in-process with `kit`'s backends (wrapped by
    /// `faults`) and this bed's host netns as the node's.
    pub fn call(
        &self,
        kit: &mut Kit,
        faults: &Faults,
        env: &HashMap<String, String>,
        config: &Value,
    ) -> CallResult {
        let log = Logger::quiet();
        let result = (|| {
            let cni_env = CniEnv::parse(|k| env.get(k).cloned())?;
            let bytes = serde_json::to_vec(config).map_err(|e| CniError::new(6, e.to_string()))?;
            let conf = crate::config::parse(&bytes, &cni_env.args)?;
            let host = self
                .host
                .open()
                .map_err(|e| CniError::new(5, e.to_string()))?;
            let mut node = Node::new(&self.roots(), host);
            node.runtime_pids = vec!["self".into()];
            node.lock_timeout = std::time::Duration::from_secs(10);
            let req = Request { env: cni_env, conf };
            let mut links = FaultyOpener {
                inner: &mut kit.links,
                faults: faults.clone(),
            };
            let mut vf = FaultyVf {
                inner: &mut kit.vf,
                faults: faults.clone(),
            };
            let mut rdma = FaultyRdma {
                inner: &mut kit.rdma,
                faults: faults.clone(),
            };
            let mut ipam = FaultyIpam {
                inner: &mut kit.ipam,
                faults: faults.clone(),
            };
            let mut b = Backends {
                links: &mut links,
                vf: &mut vf,
                rdma: &mut rdma,
                ipam: &mut ipam,
            };
            commands::run(&req, &node, &mut b, &log)
        })();
        CallResult {
            result,
            warnings: log.warnings(),
        }
    }

    /// IP leases host-local holds for this network.
    pub fn leases(&self) -> Vec<String> {
        let mut out: Vec<String> = std::fs::read_dir(self.ipam_data.path().join(&self.network))
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.parse::<std::net::IpAddr>().is_ok())
                    .collect()
            })
            .unwrap_or_default();
        out.sort();
        out
    }

    /// Files under the state dir (relative), lock files included; not
    /// `ipam-versions.json`, which is about the node's delegates, not an
    /// attachment, and stays.
    pub fn state_files(&self) -> Vec<String> {
        fn walk(dir: &Path, base: &Path, out: &mut Vec<String>) {
            for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                let p = e.path();
                if p.is_dir() {
                    walk(&p, base, out);
                } else {
                    out.push(p.strip_prefix(base).unwrap_or(&p).display().to_string());
                }
            }
        }
        let mut out = Vec::new();
        walk(self.state.path(), self.state.path(), &mut out);
        out.retain(|f| f != crate::state::IPAM_VERSIONS_FILE);
        out.sort();
        out
    }

    /// Runs the plugin binary the way a runtime does, from a thread inside
    /// this bed's host netns.
    pub fn run_binary(
        &self,
        bin: &Path,
        env: &HashMap<String, String>,
        stdin: &[u8],
    ) -> io::Result<BinOutput> {
        run_in_netns(&self.host.path, bin, env, stdin)
    }
}

/// Spawns `bin` with exactly `env` (plus PATH) from a helper thread that
/// entered the netns at `netns`, feeding `stdin`.
pub fn run_in_netns(
    netns: &Path,
    bin: &Path,
    env: &HashMap<String, String>,
    stdin: &[u8],
) -> io::Result<BinOutput> {
    use std::io::Write;
    let ns = Netns::open(netns)?;
    std::thread::scope(|s| {
        s.spawn(|| -> io::Result<BinOutput> {
            nix::sched::setns(ns.fd(), nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(io::Error::from)?;
            let mut child = Command::new(bin)
                .env_clear()
                .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
                .envs(env)
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()?;
            if let Some(mut i) = child.stdin.take() {
                i.write_all(stdin)?;
            }
            let out = child.wait_with_output()?;
            Ok(BinOutput {
                stdout: String::from_utf8_lossy(&out.stdout).trim().to_string(),
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
                code: out.status.code().unwrap_or(-1),
            })
        })
        .join()
        .map_err(|_| io::Error::other("runner thread panicked"))?
    })
}
