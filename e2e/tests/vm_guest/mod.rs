//! The whole-node flow of `e2e/tests/node.rs`, run a second time inside the
//! real-kernel VM on igb VFs instead of macvlans (issue 25, 2(e)), with the
//! shipped binaries and nothing simulated but the kubelet:
//!
//! no VFs → `kroce-device-plugin` registers an empty pool → `kroce-node-agent
//! apply` creates the VFs through the real `sriov_numvfs` → an rxe on each VF
//! netdev makes it an RDMA VF, and the running plugin lists it (no restart)
//! with NUMA node 1 → Allocate gives the rxe's `/dev/infiniband` nodes, env
//! and the device-info file → `kroce-cni` ADD from the device-info file
//! (no `deviceID`, as Multus calls it) moves each VF into its pod with its
//! rxe → the pods ping each other through the NIC → CHECK → DEL (twice)
//! puts VF, rxe and claims back → the agent releases the VFs and the plugin
//! follows → SIGTERM.
//!
//! `e2e/vm/guest.sh` runs this test binary in the guest with
//! `KROCE_VM_GUEST_CHECKS` naming its checks file; each step appends one
//! `PASS node-e2e-<step> ...` line, the first failure a `FAIL` line, and
//! `real_kernel_vm_tier` on the host requires every step.

use crate::rig::bins::Binaries;
use crate::rig::icmp;
use crate::rig::process::{Daemon, Ran, run_in_netns};
use kroce_cni::testing::NetnsGuard;
use kroce_device_plugin::api;
use kroce_device_plugin::testing::{KubeletStandIn, PodResourcesStandIn};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::io::Write;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// The env var guest.sh sets to the checks file; its absence means "not in
/// the VM".
pub const CHECKS_ENV: &str = "KROCE_VM_GUEST_CHECKS";

/// The step names, in order (the host requires each one).
pub const STEPS: &[&str] = &[
    "node-e2e-plugin-registers",
    "node-e2e-agent-creates-vfs",
    "node-e2e-plugin-lists-rxe-vfs",
    "node-e2e-allocate",
    "node-e2e-cni-add",
    "node-e2e-ping",
    "node-e2e-cni-check",
    "node-e2e-cni-del",
    "node-e2e-agent-releases",
    "node-e2e-plugin-stops",
];

const RESOURCE: &str = "rdma/vf";
const NETWORK: &str = "vm-node-e2e";
const HOST_NETNS: &str = "/proc/1/ns/net";
const WAIT: Duration = Duration::from_secs(60);
const DEVICE_PLUGIN_CONFIG: &str = "pools:
- resourceName: vf
  memlock: unlimited
  selectors:
    vendors: [\"8086\"]
    devices: [\"10ca\"]
    isRdma: true
";

type Step = Result<String, String>;

struct Checks(PathBuf);

impl Checks {
    /// Records the step; `Err` ends the run.
    fn record(&self, name: &str, r: Step) -> Result<(), String> {
        let line = match &r {
            Ok(detail) => format!("PASS {name} {detail}"),
            Err(e) => format!("FAIL {name} {}", e.replace('\n', " | ")),
        };
        println!("{line}");
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.0)
            .map_err(|e| format!("{}: {e}", self.0.display()))?;
        writeln!(f, "{line}").map_err(|e| format!("{}: {e}", self.0.display()))?;
        r.map(|_| ())
    }
}

fn sysfs(path: impl AsRef<Path>) -> String {
    std::fs::read_to_string(path.as_ref())
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

fn pci_dev(addr: &str) -> PathBuf {
    Path::new("/sys/bus/pci/devices").join(addr)
}

fn first_entry(dir: &Path) -> Option<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v.into_iter().next()
}

fn files_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

fn sh(args: &[&str]) -> Result<String, String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|e| format!("{}: {e}", args.join(" ")))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(text)
    } else {
        Err(format!("{} ({}): {text}", args.join(" "), out.status))
    }
}

/// The char devices the kernel made for RDMA device `dev` (uverbs, umad),
/// read from their class dirs: an rxe has no PCI `device` to list them under.
fn char_devices_of(dev: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for class in ["infiniband_verbs", "infiniband_mad"] {
        let dir = Path::new("/sys/class").join(class);
        for n in files_in(&dir) {
            if sysfs(dir.join(&n).join("ibdev")) == dev {
                out.insert(format!("/dev/infiniband/{n}"));
            }
        }
    }
    out
}

struct Pod {
    name: &'static str,
    netns: NetnsGuard,
    vf: String,
    vf_netdev: String,
    rxe: String,
    devinfo: PathBuf,
    ip: Option<Ipv4Addr>,
}

struct Scene {
    plugin: Option<Daemon>,
    kubelet: KubeletStandIn,
    pod_resources: PodResourcesStandIn,
    rt: tokio::runtime::Runtime,
    bins: Binaries,
    work: PathBuf,
    pf_pci: String,
    pf: String,
}

impl Scene {
    fn dir(&self, name: &str) -> PathBuf {
        self.work.join(name)
    }

    fn plugin_log(&self) -> String {
        self.plugin
            .as_ref()
            .map(Daemon::log_text)
            .unwrap_or_default()
    }

    fn vfs(&self) -> Vec<String> {
        (0..8)
            .map_while(|i| {
                std::fs::read_link(pci_dev(&self.pf_pci).join(format!("virtfn{i}")))
                    .ok()
                    .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            })
            .collect()
    }

    fn apply(&self, name: &str, num_vfs: Option<u32>) -> Result<Ran, String> {
        let pfs = match num_vfs {
            Some(n) => json!([{
                "pciAddress": self.pf_pci, "ifName": self.pf, "numVfs": n, "mtu": 1500,
                "vfGroups": [{"network": NETWORK, "resourceName": RESOURCE, "vfRange": format!("0-{}", n.saturating_sub(1))}],
                "irqAffinity": {"policy": "numaLocal"}
            }]),
            None => json!([]),
        };
        let file = self.dir(&format!("{name}.json"));
        std::fs::write(&file, json!({"nodeName": "vm", "pfs": pfs}).to_string())
            .map_err(|e| format!("{}: {e}", file.display()))?;
        let state = self.dir("agent-state");
        let file_s = file.display().to_string();
        let state_s = state.display().to_string();
        let mut args = vec![
            "apply",
            "--spec-file",
            &file_s,
            "--vf-wait-seconds",
            "60",
            "--state-dir",
            &state_s,
        ];
        if num_vfs.is_none() {
            args.extend(["--managed", &self.pf_pci]);
        }
        run_in_netns(
            Path::new(HOST_NETNS),
            &self.bins.node_agent,
            &args,
            &[],
            b"",
        )
        .map_err(|e| format!("kroce-node-agent apply: {e}"))
    }

    fn cni(&self, pod: &Pod, command: &str) -> Result<Ran, String> {
        use kroce_cni::cni_env;
        let config = json!({
            "cniVersion": "1.0.0",
            "name": NETWORK,
            "type": "kroce-cni",
            "mtu": 1500,
            "rdma": true,
            "ipam": {
                "type": "host-local",
                "dataDir": self.dir("ipam"),
                "ranges": [[{"subnet": "10.57.0.0/24"}]]
            },
            "runtimeConfig": {"CNIDeviceInfoFile": pod.devinfo}
        });
        let state = self.dir("cni-state").display().to_string();
        let netns = pod.netns.path.display().to_string();
        let env = [
            (cni_env::STATE_DIR, state.as_str()),
            ("CNI_COMMAND", command),
            ("CNI_CONTAINERID", pod.name),
            ("CNI_NETNS", netns.as_str()),
            ("CNI_IFNAME", "net1"),
            ("CNI_PATH", "/usr/lib/cni"),
            ("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
        ];
        run_in_netns(
            Path::new(HOST_NETNS),
            &self.bins.cni,
            &[],
            &env,
            config.to_string().as_bytes(),
        )
        .map_err(|e| format!("kroce-cni {command}: {e}"))
    }

    fn claims(&self) -> Vec<String> {
        files_in(&self.dir("cni-state").join("vf"))
    }
}

/// Runs every step; the first failure is recorded and returned.
pub fn run(checks: &Path) -> Result<(), String> {
    let c = Checks(checks.to_path_buf());
    let bins = Binaries::locate()?;
    let pf_pci = files_in(Path::new("/sys/bus/pci/devices"))
        .into_iter()
        .find(|d| pci_dev(d).join("sriov_totalvfs").is_file())
        .ok_or("no SR-IOV PF in the guest")?;
    let pf = first_entry(&pci_dev(&pf_pci).join("net")).ok_or("the PF has no netdev")?;
    let work = PathBuf::from("/tmp/kroce-node-e2e");
    let _ = std::fs::remove_dir_all(&work);
    for d in ["kubelet", "devinfo", "cdi", "configfs", "pod-resources"] {
        std::fs::create_dir_all(work.join(d)).map_err(|e| format!("{d}: {e}"))?;
    }
    // The node starts with no VFs: the plugin must pick them up as they come.
    std::fs::write(pci_dev(&pf_pci).join("sriov_numvfs"), "0")
        .map_err(|e| format!("sriov_numvfs 0 on {pf_pci}: {e}"))?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let kubelet = rt
        .block_on(KubeletStandIn::start(&work.join("kubelet")))
        .map_err(|e| e.to_string())?;
    let pod_resources = rt
        .block_on(PodResourcesStandIn::start(
            &work.join("pod-resources/kubelet.sock"),
        ))
        .map_err(|e| e.to_string())?;
    let mut s = Scene {
        plugin: None,
        kubelet,
        pod_resources,
        rt,
        bins,
        work,
        pf_pci,
        pf,
    };

    c.record("node-e2e-plugin-registers", start_plugin(&mut s))?;
    c.record("node-e2e-agent-creates-vfs", agent_creates_vfs(&s))?;
    let mut pods = Vec::new();
    c.record(
        "node-e2e-plugin-lists-rxe-vfs",
        rxe_vfs_listed(&s, &mut pods),
    )?;
    c.record("node-e2e-allocate", allocate_all(&s, &pods))?;
    c.record("node-e2e-cni-add", cni_add(&s, &mut pods))?;
    c.record("node-e2e-ping", ping(&pods))?;
    c.record("node-e2e-cni-check", cni_check(&s, &pods))?;
    c.record("node-e2e-cni-del", cni_del(&s, &pods))?;
    for p in &pods {
        s.pod_resources.delete_pod(p.name);
    }
    drop(pods);
    c.record("node-e2e-agent-releases", agent_releases(&s))?;
    c.record("node-e2e-plugin-stops", plugin_stops(&mut s))?;
    Ok(())
}

fn start_plugin(s: &mut Scene) -> Step {
    std::fs::write(s.dir("device-plugin.yaml"), DEVICE_PLUGIN_CONFIG).map_err(|e| e.to_string())?;
    let mut cmd = Command::new(&s.bins.device_plugin);
    cmd.env_clear()
        .arg("--config")
        .arg(s.dir("device-plugin.yaml"))
        .arg("--kubelet-dir")
        .arg(s.dir("kubelet"))
        .arg("--devinfo-dir")
        .arg(s.dir("devinfo"))
        .arg("--cdi-dir")
        .arg(s.dir("cdi"))
        .arg("--pod-resources-socket")
        .arg(s.dir("pod-resources/kubelet.sock"))
        .args(["--rescan-ms", "200", "--log-level", "info"]);
    s.plugin = Some(
        Daemon::start(
            "kroce-device-plugin",
            Path::new(HOST_NETNS),
            cmd,
            &s.dir("device-plugin.log"),
        )
        .map_err(|e| e.to_string())?,
    );
    let reg =
        s.rt.block_on(s.kubelet.wait_registered(RESOURCE, 1, WAIT))
            .map_err(|e| format!("{e}\n{}", s.plugin_log()))?;
    s.rt.block_on(
        s.kubelet
            .wait_devices(RESOURCE, WAIT, "an empty pool", |d| d.is_empty()),
    )
    .map_err(|e| format!("{e}\n{}", s.plugin_log()))?;
    Ok(format!(
        "{} registered ({}), empty pool with 0 VFs",
        reg.resource_name, reg.endpoint
    ))
}

fn agent_creates_vfs(s: &Scene) -> Step {
    let r = s.apply("node-state", Some(2))?;
    let numvfs = sysfs(pci_dev(&s.pf_pci).join("sriov_numvfs"));
    let status = r.json();
    if r.code != 0 || numvfs != "2" || status["syncState"] != "Succeeded" {
        return Err(format!("apply exit {}, sriov_numvfs {numvfs}: {r}", r.code));
    }
    // The VF netdevs appear once igbvf has probed.
    for _ in 0..150 {
        if s.vfs().len() == 2
            && s.vfs()
                .iter()
                .all(|v| first_entry(&pci_dev(v).join("net")).is_some())
        {
            return Ok(format!(
                "sriov_numvfs 0 -> 2 on {} ({}), VFs {:?}",
                s.pf,
                s.pf_pci,
                s.vfs()
            ));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Err(format!("VF netdevs did not appear: {:?}", s.vfs()))
}

/// An rxe over each VF netdev (what a kind node with soft-RoCE has): the
/// running plugin lists the VFs as RDMA VFs, healthy, on NUMA node 1.
fn rxe_vfs_listed(s: &Scene, pods: &mut Vec<Pod>) -> Step {
    let vfs = s.vfs();
    for (i, (name, vf)) in ["node-e2e-a", "node-e2e-b"]
        .into_iter()
        .zip(&vfs)
        .enumerate()
    {
        let netdev = first_entry(&pci_dev(vf).join("net")).ok_or(format!("{vf}: no netdev"))?;
        let rxe = format!("rxe_ne{i}");
        sh(&["ip", "link", "set", &netdev, "up"])?;
        sh(&[
            "rdma", "link", "add", &rxe, "type", "rxe", "netdev", &netdev,
        ])?;
        pods.push(Pod {
            name,
            netns: NetnsGuard::create(name).map_err(|e| format!("netns {name}: {e}"))?,
            vf: vf.clone(),
            vf_netdev: netdev,
            rxe,
            devinfo: s.dir("devinfo").join(format!("rdma-vf-{vf}-device.json")),
            ip: None,
        });
    }
    let want: BTreeSet<&str> = vfs.iter().map(String::as_str).collect();
    let numa = sysfs(pci_dev(&s.pf_pci).join("numa_node"));
    let numa: i64 = numa.parse().map_err(|_| format!("PF numa_node {numa:?}"))?;
    let devices =
        s.rt.block_on(s.kubelet.wait_devices(
            RESOURCE,
            WAIT,
            "both VFs, healthy, on the PF's NUMA node",
            |d| {
                d.iter().map(|x| x.id.as_str()).collect::<BTreeSet<_>>() == want
                    && d.iter().all(|x| {
                        x.health == api::HEALTHY
                            && x.topology
                                .as_ref()
                                .is_some_and(|t| t.nodes.iter().map(|n| n.id).eq([numa]))
                    })
            },
        ))
        .map_err(|e| format!("{e}\n{}", s.plugin_log()))?;
    Ok(format!(
        "{} VFs listed healthy on NUMA node {numa} without a restart: {:?}",
        devices.len(),
        devices.iter().map(|d| d.id.as_str()).collect::<Vec<_>>()
    ))
}

fn allocate_all(s: &Scene, pods: &[Pod]) -> Step {
    let mut detail = Vec::new();
    for p in pods {
        let mut client = s
            .kubelet
            .client(RESOURCE)
            .ok_or("no client for the plugin")?;
        let resp =
            s.rt.block_on(client.allocate(api::AllocateRequest {
                container_requests: vec![api::ContainerAllocateRequest {
                    devices_ids: vec![p.vf.clone()],
                }],
            }))
            .map_err(|e| format!("Allocate {}: {e}\n{}", p.vf, s.plugin_log()))?
            .into_inner();
        s.pod_resources.run_pod(p.name, RESOURCE, &[&p.vf]);
        let c = resp
            .container_responses
            .first()
            .ok_or("no container response")?;
        let mut want = char_devices_of(&p.rxe);
        if want.is_empty() {
            return Err(format!("{} has no uverbs/umad char devices", p.rxe));
        }
        want.insert("/dev/infiniband/rdma_cm".into());
        let got: BTreeSet<String> = c.devices.iter().map(|d| d.host_path.clone()).collect();
        if got != want {
            return Err(format!(
                "{}: device specs {got:?}, the kernel's for {}: {want:?}",
                p.vf, p.rxe
            ));
        }
        if c.envs.get("PCIDEVICE_RDMA_VF") != Some(&p.vf) {
            return Err(format!("{}: env {:?}", p.vf, c.envs));
        }
        let info: Value = c
            .envs
            .get("PCIDEVICE_RDMA_VF_INFO")
            .and_then(|i| serde_json::from_str(i).ok())
            .unwrap_or(Value::Null);
        let i = &info[&p.vf];
        if i["rdmaDevice"] != p.rxe.as_str() || i["netdev"] != p.vf_netdev.as_str() {
            return Err(format!("{}: INFO {info}", p.vf));
        }
        let di: Value = std::fs::read(&p.devinfo)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .ok_or_else(|| {
                format!(
                    "{}: no device-info file (dir: {:?})",
                    p.devinfo.display(),
                    files_in(&s.dir("devinfo"))
                )
            })?;
        if di["pci"]["pci-address"] != p.vf.as_str() {
            return Err(format!("{}: device-info {di}", p.devinfo.display()));
        }
        detail.push(format!("{} -> {:?}", p.vf, got));
    }
    Ok(format!(
        "specs = the rxe's own char devices + rdma_cm, env, INFO, device-info: {}",
        detail.join("; ")
    ))
}

fn cni_add(s: &Scene, pods: &mut [Pod]) -> Step {
    let mut detail = Vec::new();
    for p in pods.iter_mut() {
        let r = s.cni(p, "ADD")?;
        if r.code != 0 {
            return Err(format!("ADD {}: {r}", p.name));
        }
        let res = r.json();
        let ip: Ipv4Addr = res["ips"][0]["address"]
            .as_str()
            .and_then(|a| a.split('/').next())
            .and_then(|a| a.parse().ok())
            .ok_or_else(|| format!("ADD {}: no IPv4 in {res}", p.name))?;
        p.ip = Some(ip);
        let in_pod = p
            .netns
            .ip(&["-j", "link", "show", "net1"])
            .unwrap_or_default();
        let rdma = sh(&["ip", "netns", "exec", &p.netns.name, "rdma", "link", "show"])?;
        let on_host = sh(&["rdma", "link", "show"])?;
        if !in_pod.contains("\"UP\"") || !rdma.contains(&format!("{}/1", p.rxe)) {
            return Err(format!("{}: net1 {in_pod}; rdma in pod: {rdma}", p.name));
        }
        if on_host.contains(&p.rxe) {
            return Err(format!("{} still on the host: {on_host}", p.rxe));
        }
        detail.push(format!("{} {ip} with {} in the pod", p.name, p.rxe));
    }
    Ok(format!(
        "from the device-info file (no deviceID): {}",
        detail.join(", ")
    ))
}

fn ping(pods: &[Pod]) -> Step {
    let (a, b) = (&pods[0], &pods[1]);
    let dst = b.ip.ok_or("pod b has no IP")?;
    let rtt = icmp::ping(&a.netns.path, dst, 0x4b52, Duration::from_secs(20))
        .map_err(|e| format!("{} -> {dst}: {e}", a.name))?;
    Ok(format!(
        "{} -> {} {dst} through the igb VFs: {rtt:?}",
        a.name, b.name
    ))
}

fn cni_check(s: &Scene, pods: &[Pod]) -> Step {
    for p in pods {
        let r = s.cni(p, "CHECK")?;
        if r.code != 0 {
            return Err(format!("CHECK {}: {r}", p.name));
        }
    }
    Ok("CHECK exit 0 for both pods".into())
}

fn cni_del(s: &Scene, pods: &[Pod]) -> Step {
    for p in pods {
        for n in 1..=2 {
            let r = s.cni(p, "DEL")?;
            if r.code != 0 {
                return Err(format!("DEL #{n} {}: {r}", p.name));
            }
        }
        let now = first_entry(&pci_dev(&p.vf).join("net"));
        if now.as_deref() != Some(p.vf_netdev.as_str()) {
            return Err(format!(
                "{}: netdev {now:?} after DEL, was {}",
                p.vf, p.vf_netdev
            ));
        }
        let on_host = sh(&["rdma", "link", "show"])?;
        if !on_host.contains(&format!("{}/1", p.rxe)) || !on_host.contains(&p.vf_netdev) {
            return Err(format!(
                "{} not back over {}: {on_host}",
                p.rxe, p.vf_netdev
            ));
        }
    }
    if !s.claims().is_empty() {
        return Err(format!("claims left: {:?}", s.claims()));
    }
    Ok("DEL twice each: VF netdevs and their rxe back on the host, no claims".into())
}

fn agent_releases(s: &Scene) -> Step {
    let r = s.apply("node-state-none", None)?;
    let numvfs = sysfs(pci_dev(&s.pf_pci).join("sriov_numvfs"));
    if r.code != 0 || numvfs != "0" {
        return Err(format!("apply exit {}, sriov_numvfs {numvfs}: {r}", r.code));
    }
    s.rt.block_on(
        s.kubelet
            .wait_devices(RESOURCE, WAIT, "an empty pool again", |d| d.is_empty()),
    )
    .map_err(|e| format!("{e}\n{}", s.plugin_log()))?;
    Ok("PF left the spec: sriov_numvfs 2 -> 0, the plugin lists none".into())
}

fn plugin_stops(s: &mut Scene) -> Step {
    let mut plugin = s.plugin.take().ok_or("no plugin")?;
    if let Some(st) = plugin.exited() {
        return Err(format!("plugin died: {st}\n{}", plugin.log_text()));
    }
    let st = plugin
        .terminate(Duration::from_secs(20))
        .map_err(|e| e.to_string())?;
    let left = files_in(&s.dir("kubelet"));
    if !st.success() || left != ["kubelet.sock"] {
        return Err(format!(
            "SIGTERM: {st}, kubelet dir {left:?}\n{}",
            plugin.log_text()
        ));
    }
    Ok(format!("SIGTERM: {st}, its socket removed"))
}
