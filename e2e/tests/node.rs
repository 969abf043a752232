#![allow(clippy::unwrap_used, clippy::expect_used)]
//! A whole kroce node without Kubernetes, with the compiled binaries:
//!
//! 1. the node: a netns with real PF netdevs (veths `ens1f0`, `ens2f0`), a
//!    fixture sysfs tree with the same PFs at 0 VFs, and a simulated kernel
//!    that turns `sriov_numvfs` writes into fixture VFs plus real macvlan
//!    netdevs (see `rig/kernel.rs`);
//! 2. `kroce-device-plugin` registered with the kubelet stand-in, serving an
//!    empty `rdma/vf` pool;
//! 3. `kroce-node-agent apply` with an `RdmaNodeState`: VFs appear, MTUs are
//!    set on the real netdevs, IRQs land on NUMA-local CPUs; a second pass
//!    changes nothing; QoS is reported as failing (no DCB on a veth);
//! 4. ListAndWatch shows the VFs healthy with their NUMA node; Allocate for
//!    two "pods" gives device specs, env, annotations, device-info files;
//! 5. `kroce-cni` as Multus calls it for each pod (netns), with the
//!    device-info file: VLAN is refused without SR-IOV and changes nothing;
//!    ADD moves the VF in with its MAC, the MTU and a host-local address;
//!    the pods ping each other; CHECK passes; DEL (twice) puts everything
//!    back;
//! 6. a PF leaving the spec goes back to 0 VFs and the plugin drops them;
//!    SIGTERM makes the plugin remove its socket and device-info files.

mod rig;

use kroce_cni::testing::NetnsGuard;
use kroce_cni::testing::testbed::{LinkView, unique_tag};
use kroce_device_plugin::api;
use kroce_device_plugin::testing::{KubeletStandIn, PodResourcesStandIn, scratch_dir};
use rig::bins::Binaries;
use rig::icmp;
use rig::kernel::{KernelEvent, fixture_mac};
use rig::node::{INITIAL_PF_MTU, Node, PFS, PfPlan};
use rig::process::{Daemon, Ran, run_in_netns};
use serde_json::{Value, json};
use sriov_helpers::{CpuList, Host, PciAddress};
use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const RESOURCE: &str = "rdma/vf";
const NETWORK: &str = "rdma-e2e";
const SUBNET_PREFIX: &str = "10.56.0.";
const CNI_BIN_DIR: &str = "/usr/lib/cni";
const PF_MTU: u32 = 9000;
const POD_MTU: u32 = 9000;
/// VFs per PF the node agent is asked for.
const NUM_VFS: [u32; 2] = [4, 2];
const RESERVED_CPUS: &str = "0-1,16-17";
const WAIT: Duration = Duration::from_secs(10);

const DEVICE_PLUGIN_CONFIG: &str = "pools:
- resourceName: vf
  memlock: unlimited
  selectors:
    vendors: [\"15b3\"]
    devices: [\"101e\"]
    isRdma: true
";

fn pci(s: &str) -> PciAddress {
    s.parse().unwrap()
}

/// The node's `RdmaNodeState`, as the controller would write it: both PFs,
/// VF groups of `rdma/vf`, NUMA-local IRQs. `ens1f0`'s group leaves the VF
/// MTU to the CNI; `ens2f0`'s asks the agent for it.
fn node_state(pfs: &[(&PfPlan, u32)], qos: Option<Value>) -> Value {
    let pfs: Vec<Value> = pfs
        .iter()
        .map(|(p, num)| {
            let mut group = json!({
                "network": NETWORK,
                "resourceName": RESOURCE,
                "vfRange": format!("0-{}", num - 1),
            });
            if p.ifname == "ens2f0" {
                group["mtu"] = json!(PF_MTU);
            }
            let mut pf = json!({
                "pciAddress": p.pci,
                "ifName": p.ifname,
                "numVfs": num,
                "mtu": PF_MTU,
                "vfGroups": [group],
                "irqAffinity": {
                    "policy": "numaLocal",
                    "reservedCpus": RESERVED_CPUS,
                    "reservedCpusMode": "exclude"
                }
            });
            if let Some(q) = &qos {
                pf["qos"] = q.clone();
            }
            pf
        })
        .collect();
    json!({
        "apiVersion": "kroce.io/v1alpha1",
        "kind": "RdmaNodeState",
        "metadata": {"name": "e2e-node"},
        "spec": {"nodeName": "e2e-node", "pfs": pfs}
    })
}

fn all_pfs() -> Vec<(&'static PfPlan, u32)> {
    PFS.iter().zip(NUM_VFS).collect()
}

/// One "pod": its netns, sandbox ID and the VF the kubelet gave it.
#[derive(Debug)]
struct Pod {
    name: &'static str,
    netns: NetnsGuard,
    container_id: String,
    vf: String,
    /// The VF's netdev name in the node netns.
    vf_netdev: String,
    devinfo: PathBuf,
}

/// Everything the scene owns. Field order is drop order: plugin, kubelet,
/// runtime, pods, node (netns, fixture), scratch dir.
struct Scene {
    plugin: Option<Daemon>,
    kubelet: Option<KubeletStandIn>,
    /// What pods hold, as the kubelet's PodResources API tells the plugin.
    pod_resources: Option<PodResourcesStandIn>,
    rt: tokio::runtime::Runtime,
    pods: Vec<Pod>,
    node: Node,
    bins: Binaries,
    work: tempfile::TempDir,
}

impl Scene {
    fn dir(&self, name: &str) -> PathBuf {
        self.work.path().join(name)
    }

    fn kubelet(&self) -> &KubeletStandIn {
        self.kubelet.as_ref().unwrap()
    }

    fn pod_resources(&self) -> &PodResourcesStandIn {
        self.pod_resources.as_ref().unwrap()
    }

    fn plugin_log(&self) -> String {
        self.plugin
            .as_ref()
            .map(Daemon::log_text)
            .unwrap_or_default()
    }

    /// Panics with the plugin's log attached.
    fn wait<T>(&self, r: Result<T, String>) -> T {
        r.unwrap_or_else(|e| panic!("{e}\n--- device plugin log\n{}", self.plugin_log()))
    }

    fn start_device_plugin(&mut self) {
        for d in ["kubelet", "devinfo", "cdi", "configfs"] {
            std::fs::create_dir_all(self.dir(d)).unwrap();
        }
        std::fs::write(self.dir("device-plugin.yaml"), DEVICE_PLUGIN_CONFIG).unwrap();
        let kubelet = self
            .rt
            .block_on(KubeletStandIn::start(&self.dir("kubelet")))
            .unwrap();
        self.kubelet = Some(kubelet);
        let pod_resources = self
            .rt
            .block_on(PodResourcesStandIn::start(
                &self.dir("pod-resources/kubelet.sock"),
            ))
            .unwrap();
        self.pod_resources = Some(pod_resources);
        let mut cmd = Command::new(&self.bins.device_plugin);
        cmd.env_clear()
            .arg("--config")
            .arg(self.dir("device-plugin.yaml"))
            .arg("--host-root")
            .arg(self.node.fixture_root())
            .arg("--kubelet-dir")
            .arg(self.dir("kubelet"))
            .arg("--devinfo-dir")
            .arg(self.dir("devinfo"))
            .arg("--cdi-dir")
            .arg(self.dir("cdi"))
            .arg("--pod-resources-socket")
            .arg(self.dir("pod-resources/kubelet.sock"))
            .args(["--rescan-ms", "100", "--log-level", "info"]);
        let plugin = Daemon::start(
            "kroce-device-plugin",
            &self.node.netns.path,
            cmd,
            &self.dir("device-plugin.log"),
        )
        .unwrap();
        self.plugin = Some(plugin);
    }

    /// `kroce-node-agent apply` in the node netns with the spec in `spec`.
    fn apply(&self, name: &str, spec: &Value, managed: &[&str]) -> Ran {
        let file = self.dir(&format!("{name}.json"));
        std::fs::write(&file, serde_json::to_vec_pretty(spec).unwrap()).unwrap();
        let root = self.node.fixture_root();
        let configfs = self.dir("configfs");
        let managed = managed.join(",");
        let mut args = vec![
            "apply",
            "--spec-file",
            file.to_str().unwrap(),
            "--host-root",
            root.to_str().unwrap(),
            "--configfs",
            configfs.to_str().unwrap(),
            "--vf-wait-seconds",
            "10",
        ];
        if !managed.is_empty() {
            args.extend(["--managed", managed.as_str()]);
        }
        run_in_netns(
            &self.node.netns.path,
            &self.bins.node_agent,
            &args,
            &[],
            b"",
        )
        .unwrap()
    }

    fn cni_env(&self, pod: &Pod, command: &str) -> Vec<(String, String)> {
        use kroce_cni::cni_env;
        vec![
            // The node's roots: the runtime's environment, as an installer
            // sets it (never the network config).
            (
                cni_env::HOST_ROOT.into(),
                self.node.fixture_root().display().to_string(),
            ),
            (cni_env::PROC_ROOT.into(), "/proc".into()),
            (
                cni_env::STATE_DIR.into(),
                self.dir("cni-state").display().to_string(),
            ),
            ("CNI_COMMAND".into(), command.into()),
            ("CNI_CONTAINERID".into(), pod.container_id.clone()),
            (
                "CNI_NETNS".into(),
                format!("/var/run/netns/{}", pod.netns.name),
            ),
            ("CNI_IFNAME".into(), "net1".into()),
            ("CNI_PATH".into(), CNI_BIN_DIR.into()),
            (
                "CNI_ARGS".into(),
                format!(
                    "IgnoreUnknown=true;K8S_POD_NAMESPACE=default;K8S_POD_NAME={};K8S_POD_INFRA_CONTAINER_ID={}",
                    pod.name, pod.container_id
                ),
            ),
        ]
    }

    /// The delegate config Multus hands kroce-cni for this pod: the
    /// network's attachment definition plus `runtimeConfig` with the
    /// device-info file; `with_device_id` adds `deviceID` too, as Multus
    /// does when it knows the allocated device.
    fn cni_config(&self, pod: &Pod, with_device_id: bool, extra: Value) -> Value {
        let mut c = json!({
            "cniVersion": "1.0.0",
            "name": NETWORK,
            "type": "kroce-cni",
            "mtu": POD_MTU,
            "memlock": "unlimited",
            "ipam": {
                "type": "host-local",
                "dataDir": self.dir("ipam"),
                "ranges": [[{"subnet": format!("{SUBNET_PREFIX}0/24")}]]
            },
            "runtimeConfig": {"CNIDeviceInfoFile": pod.devinfo}
        });
        if with_device_id {
            c["deviceID"] = json!(pod.vf);
        }
        for (k, v) in extra.as_object().into_iter().flatten() {
            c[k] = v.clone();
        }
        c
    }

    fn cni(&self, pod: &Pod, command: &str, config: &Value) -> Ran {
        let env = self.cni_env(pod, command);
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        run_in_netns(
            &self.node.netns.path,
            &self.bins.cni,
            &[],
            &env,
            &serde_json::to_vec(config).unwrap(),
        )
        .unwrap()
    }

    /// host-local's leases for the network (file names that are addresses).
    fn leases(&self) -> BTreeMap<String, String> {
        std::fs::read_dir(self.dir("ipam").join(NETWORK))
            .map(|rd| {
                rd.flatten()
                    .filter_map(|e| {
                        let name = e.file_name().to_string_lossy().into_owned();
                        name.parse::<std::net::IpAddr>().ok()?;
                        Some((name, std::fs::read_to_string(e.path()).unwrap_or_default()))
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Files under the CNI state dir, relative.
    fn state_files(&self) -> Vec<String> {
        fn walk(dir: &Path, base: &Path, out: &mut Vec<String>) {
            for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                let p = e.path();
                if p.is_dir() {
                    walk(&p, base, out);
                } else {
                    out.push(p.strip_prefix(base).unwrap().display().to_string());
                }
            }
        }
        let mut out = Vec::new();
        walk(&self.dir("cni-state"), &self.dir("cni-state"), &mut out);
        // About the node's IPAM delegates, not an attachment: it stays.
        out.retain(|f| f != kroce_cni::state::IPAM_VERSIONS_FILE);
        out.sort();
        out
    }

    fn node_links(&self) -> Vec<LinkView> {
        self.node.netns.links().unwrap()
    }
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

fn pf_status<'a>(status: &'a Value, pci: &str) -> &'a Value {
    status["pfs"]
        .as_array()
        .and_then(|a| a.iter().find(|p| p["pciAddress"] == pci))
        .unwrap_or_else(|| panic!("no PF {pci} in status {status:#}"))
}

fn condition<'a>(status: &'a Value, t: &str) -> &'a Value {
    status["conditions"]
        .as_array()
        .and_then(|a| a.iter().find(|c| c["type"] == t))
        .unwrap_or_else(|| panic!("no {t} condition in {status:#}"))
}

fn changes(r: &Ran) -> Vec<&str> {
    r.stderr
        .lines()
        .filter_map(|l| l.strip_prefix("changed: "))
        .collect()
}

/// `ip -d -j link` of the node: name -> (kind, macvlan mode, link index).
fn link_kinds(node: &Node) -> BTreeMap<String, (String, String)> {
    let v: Value =
        serde_json::from_str(&node.netns.ip(&["-d", "-j", "link", "show"]).unwrap()).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .map(|l| {
            (
                l["ifname"].as_str().unwrap_or_default().to_string(),
                (
                    l["linkinfo"]["info_kind"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    l["linkinfo"]["info_data"]["mode"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                ),
            )
        })
        .collect()
}

#[test]
fn a_whole_node_without_kubernetes() {
    if kroce_cni::testing::testbed::skip_without_netns("a_whole_node_without_kubernetes") {
        return;
    }
    let bins = Binaries::locate().unwrap_or_else(|e| panic!("{e}"));
    assert!(
        Path::new(CNI_BIN_DIR).join("host-local").is_file(),
        "{CNI_BIN_DIR}/host-local missing: apt-get install containernetworking-plugins"
    );
    let tag = unique_tag();
    let work = scratch_dir("kroce-e2e-").unwrap();
    let node = Node::new(&tag, work.path()).unwrap_or_else(|e| panic!("building the node: {e}"));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut s = Scene {
        plugin: None,
        kubelet: None,
        pod_resources: None,
        rt,
        pods: Vec::new(),
        node,
        bins,
        work,
    };

    // 2. The device plugin registers and serves an empty pool.
    s.start_device_plugin();
    let reg = s.wait(s.rt.block_on(s.kubelet().wait_registered(RESOURCE, 1, WAIT)));
    assert_eq!(reg.version, "v1beta1");
    assert_eq!(reg.endpoint, "kroce-rdma_vf.sock");
    let empty = s.wait(
        s.rt.block_on(
            s.kubelet()
                .wait_devices(RESOURCE, WAIT, "an empty list", |d| d.is_empty()),
        ),
    );
    assert!(empty.is_empty());

    // 3. The node agent applies the node state.
    node_agent_creates_vfs_mtus_and_irqs(&s);

    // 4. The plugin sees the new VFs; the kubelet allocates one per pod.
    let devices = s.wait(
        s.rt.block_on(
            s.kubelet()
                .wait_devices(RESOURCE, WAIT, "6 VFs", |d| d.len() == 6),
        ),
    );
    let host = Host::scan(&s.node.host_root());
    let mut listed = BTreeMap::new();
    for d in &devices {
        let numa: Vec<i64> = d
            .topology
            .as_ref()
            .map(|t| t.nodes.iter().map(|n| n.id).collect())
            .unwrap_or_default();
        listed.insert(d.id.clone(), (d.health.clone(), numa));
    }
    let mut want = BTreeMap::new();
    for (p, num) in all_pfs() {
        for (_, vf) in &host.pci[&pci(p.pci)].sriov.as_ref().unwrap().vfs[..num as usize] {
            want.insert(
                vf.to_string(),
                ("Healthy".to_string(), vec![i64::from(p.numa)]),
            );
        }
    }
    assert_eq!(listed, want, "ListAndWatch: (health, NUMA) per VF");

    // Both pods get a VF of ens1f0: their macvlans share a parent.
    let ens1f0_vfs = host.pci[&pci(PFS[0].pci)].sriov.clone().unwrap().vfs;
    for (name, (_, vf)) in ["pod-a", "pod-b"].into_iter().zip(ens1f0_vfs) {
        let pod = allocate(&s, name, &tag, vf);
        s.pods.push(pod);
    }

    // 5. The CNI as Multus calls it.
    cni_add_ping_check_del(&s);

    // 6. A PF leaving the spec goes back to its VF count before kroce (0);
    //    the plugin follows.
    let r = s.apply(
        "node-state-ens1f0-only",
        &node_state(&[(&PFS[0], NUM_VFS[0])], None),
        &[PFS[0].pci, PFS[1].pci],
    );
    assert_eq!(r.code, 0, "{r}");
    assert_eq!(r.json()["managedPfs"], json!([PFS[0].pci]), "{r}");
    assert!(
        changes(&r).contains(
            &"PF ens2f0 (0000:86:00.0): sriov_numvfs 2 -> 0 (released: its VF count before kroce)"
        ),
        "{r}"
    );
    // A real write returns once the VFs are gone; the simulated kernel may
    // still be removing them while this pass reports, so the VF count is
    // read from the agent's next pass (its periodic resync on a node).
    assert_eq!(
        s.node.wait_kernel_events(3, WAIT),
        [
            KernelEvent::NumVfs {
                pf: PFS[0].pci.into(),
                from: 0,
                to: 4
            },
            KernelEvent::NumVfs {
                pf: PFS[1].pci.into(),
                from: 0,
                to: 2
            },
            KernelEvent::NumVfs {
                pf: PFS[1].pci.into(),
                from: 2,
                to: 0
            },
        ]
    );
    let r = s.apply(
        "node-state-ens1f0-only-again",
        &node_state(&[(&PFS[0], NUM_VFS[0])], None),
        &[PFS[0].pci],
    );
    assert_eq!(r.code, 0, "{r}");
    assert!(changes(&r).is_empty(), "{r}");
    let status = r.json();
    assert_eq!(pf_status(&status, PFS[1].pci)["numVfs"], 0, "{status:#}");
    assert_eq!(
        pf_status(&status, PFS[1].pci)["vfs"],
        json!([]),
        "{status:#}"
    );
    assert_eq!(pf_status(&status, PFS[0].pci)["numVfs"], 4, "{status:#}");
    let names: Vec<String> = s.node_links().into_iter().map(|l| l.name).collect();
    assert!(!names.iter().any(|n| n.starts_with("ens2f0v")), "{names:?}");
    assert!(names.contains(&"ens1f0v3".to_string()), "{names:?}");
    let left = s.wait(s.rt.block_on(s.kubelet().wait_devices(
        RESOURCE,
        WAIT,
        "the 4 VFs of ens1f0 only",
        |d| {
            d.len() == 4
                && d.iter()
                    .all(|x| x.id.starts_with("0000:3b:") && x.health == api::HEALTHY)
        },
    )));
    assert_eq!(left.len(), 4);

    // The pods are gone from PodResources: once its own Allocates are past
    // their grace, the running plugin removes their device-info files.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !files_in(&s.dir("devinfo")).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "device-info files of released VFs stay: {:?}\n{}",
            files_in(&s.dir("devinfo")),
            s.plugin_log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // SIGTERM: the plugin removes its socket and the device-info files of
    // devices no pod holds (none left here).
    let mut plugin = s.plugin.take().unwrap();
    assert!(
        plugin.exited().is_none(),
        "plugin died:\n{}",
        plugin.log_text()
    );
    let status = plugin.terminate(Duration::from_secs(10)).unwrap();
    assert!(status.success(), "{status}\n{}", plugin.log_text());
    assert!(
        files_in(&s.dir("devinfo")).is_empty(),
        "{:?}\n{}",
        files_in(&s.dir("devinfo")),
        plugin.log_text()
    );
    assert_eq!(files_in(&s.dir("kubelet")), ["kubelet.sock"]);
}

/// Step 3: `kroce-node-agent apply`: VFs, MTU, IRQs; idempotent; QoS fails
/// on interfaces without DCB.
fn node_agent_creates_vfs_mtus_and_irqs(s: &Scene) {
    let r = s.apply("node-state", &node_state(&all_pfs(), None), &[]);
    assert_eq!(r.code, 0, "{r}");
    let status = r.json();
    assert_eq!(status["syncState"], "Succeeded", "{status:#}");
    assert_eq!(condition(&status, "Ready")["status"], "True");
    assert_eq!(condition(&status, "Degraded")["status"], "False");
    assert_eq!(status["configuredPfs"], 2);
    assert_eq!(status["managedPfs"], json!([PFS[0].pci, PFS[1].pci]));
    assert_eq!(
        s.node.kernel_events(),
        [
            KernelEvent::NumVfs {
                pf: PFS[0].pci.into(),
                from: 0,
                to: 4
            },
            KernelEvent::NumVfs {
                pf: PFS[1].pci.into(),
                from: 0,
                to: 2
            },
        ],
        "simulated kernel"
    );
    let host = Host::scan(&s.node.host_root());
    let kinds = link_kinds(&s.node);
    let links: BTreeMap<String, LinkView> = s
        .node_links()
        .into_iter()
        .map(|l| (l.name.clone(), l))
        .collect();
    let changed = changes(&r);
    for (p, num) in all_pfs() {
        let pfs = pf_status(&status, p.pci);
        assert_eq!(pfs["ifName"], p.ifname);
        assert_eq!(pfs["numVfs"], num);
        assert_eq!(pfs["numaNode"], p.numa);
        // The agent set the PF MTU through netlink; sysfs (linked to the
        // real interface) reads it back.
        assert_eq!(pfs["mtu"], PF_MTU, "{pfs:#}");
        assert_eq!(links[p.ifname].mtu, u64::from(PF_MTU));
        assert!(
            changed.contains(&format!("{}: MTU {INITIAL_PF_MTU} -> {PF_MTU}", p.ifname).as_str()),
            "{r}"
        );
        assert!(
            changed.contains(
                &format!("PF {} ({}): sriov_numvfs 0 -> {num}", p.ifname, p.pci).as_str()
            ),
            "{r}"
        );
        let vfs = pfs["vfs"].as_array().unwrap();
        assert_eq!(vfs.len(), num as usize);
        // ens2f0's group asks the agent for the VF MTU; ens1f0's leaves it.
        let vf_mtu = if p.ifname == "ens2f0" { PF_MTU } else { 1500 };
        for (i, v) in vfs.iter().enumerate() {
            let name = format!("{}v{i}", p.ifname);
            let addr = host.pci[&pci(p.pci)].sriov.as_ref().unwrap().vfs[i].1;
            assert_eq!(v["pciAddress"], addr.to_string());
            assert_eq!(v["netdev"], name.as_str());
            assert_eq!(v["numaNode"], p.numa);
            assert_eq!(v["mtu"], vf_mtu, "{v:#}");
            assert!(
                v["rdmaDevice"].as_str().unwrap().starts_with("mlx5_"),
                "{v:#}"
            );
            // The VF netdev is a real macvlan over the PF with the fixture's MAC.
            let real = links
                .get(&name)
                .unwrap_or_else(|| panic!("{name} missing: {links:#?}"));
            assert_eq!(real.mac, fixture_mac(&addr));
            assert_eq!(real.mac, s.node.netdev_attr(&name, "address"));
            assert_eq!(real.mtu, u64::from(vf_mtu), "{name}");
            assert_eq!(
                kinds[&name],
                ("macvlan".to_string(), "bridge".to_string()),
                "{name}"
            );
        }
    }
    irqs_are_numa_local(s, &status);

    // A second pass finds nothing to change.
    let again = s.apply("node-state-again", &node_state(&all_pfs(), None), &[]);
    assert_eq!(again.code, 0, "{again}");
    assert!(
        changes(&again).is_empty(),
        "second pass changed things:\n{again}"
    );
    assert_eq!(s.node.kernel_events().len(), 2);

    // QoS needs DCB netlink, which a veth does not have (EOPNOTSUPP, as
    // igb answers): reported as unsupported by the driver, naming the PF,
    // not a failed DCB write; the VFs left alone. (The pass still fails:
    // this host's configfs has no rdma_cm for the RoCE defaults.)
    let qos = json!({"trust": "dscp", "pfcPriority": 3, "ecn": false});
    let r = s.apply("node-state-qos", &node_state(&all_pfs(), Some(qos)), &[]);
    assert_eq!(r.code, 2, "{r}");
    let status = r.json();
    assert_eq!(status["syncState"], "Failed", "{status:#}");
    let unsupported = condition(&status, "QosUnsupported");
    assert_eq!(unsupported["status"], "True", "{unsupported:#}");
    assert_eq!(
        unsupported["reason"], "NotSupportedByDriver",
        "{unsupported:#}"
    );
    assert!(
        unsupported["message"].as_str().unwrap().contains("ens1f0"),
        "{unsupported:#}"
    );
    let degraded = condition(&status, "Degraded");
    assert_eq!(degraded["status"], "True");
    assert_ne!(degraded["reason"], "QosFailed", "{degraded:#}");
    assert_eq!(
        s.node.kernel_events().len(),
        2,
        "QoS pass touched sriov_numvfs"
    );
    assert_eq!(pf_status(&status, PFS[0].pci)["numVfs"], 4);
}

/// IRQ affinity files: every MSI-X vector but the first of each function
/// (PF and VFs) on one CPU of its NUMA node outside the reserved CPUs,
/// spread round-robin; the first vector untouched.
fn irqs_are_numa_local(s: &Scene, status: &Value) {
    let root = s.node.host_root();
    let host = Host::scan(&root);
    let reserved: CpuList = RESERVED_CPUS.parse().unwrap();
    let mut placed = 0;
    for p in &PFS {
        let local: CpuList = p.local_cpus.parse().unwrap();
        let allowed = local.difference(&reserved);
        let pf = &host.pci[&pci(p.pci)];
        let mut functions = vec![pf];
        functions.extend(
            pf.sriov
                .as_ref()
                .unwrap()
                .vfs
                .iter()
                .map(|(_, a)| &host.pci[a]),
        );
        let mut cpus_used = BTreeSet::new();
        let mut vectors = 0;
        for f in functions {
            let (first, rest) = f.msi_irqs.split_first().unwrap();
            let aff = sriov_helpers::irq::read_affinity(&root, *first).unwrap();
            assert_eq!(aff, local, "control vector {first} of {} moved", f.address);
            for irq in rest {
                let aff = sriov_helpers::irq::read_affinity(&root, *irq).unwrap();
                let cpus: Vec<u32> = aff.cpus().collect();
                assert_eq!(cpus.len(), 1, "IRQ {irq} of {}: {aff}", f.address);
                assert!(
                    allowed.contains(cpus[0]),
                    "IRQ {irq} of {} on CPU {} (allowed {allowed})",
                    f.address,
                    cpus[0]
                );
                cpus_used.insert(cpus[0]);
                vectors += 1;
            }
        }
        assert_eq!(
            cpus_used.len(),
            vectors.min(allowed.len()),
            "{} IRQs not spread: {cpus_used:?}",
            p.ifname
        );
        placed += vectors;
    }
    let placements = status["irqPlacement"].as_array().unwrap();
    assert_eq!(placements.len(), placed);
    for pl in placements {
        assert!(pl.get("error").is_none(), "{pl:#}");
        let irq = u32::try_from(pl["irq"].as_u64().unwrap()).unwrap();
        let now = sriov_helpers::irq::read_affinity(&root, irq).unwrap();
        assert_eq!(pl["cpus"], now.to_string(), "{pl:#}");
    }
    assert_eq!(condition(status, "IrqsRefused")["status"], "False");
}

/// Step 4 for one pod: Allocate through the kubelet's client, then what the
/// container would get and the device-info file Multus hands the CNI.
fn allocate(s: &Scene, name: &'static str, tag: &str, vf: PciAddress) -> Pod {
    let host = Host::scan(&s.node.host_root());
    let dev = &host.pci[&vf];
    let vf_s = vf.to_string();
    let mut client = s.kubelet().client(RESOURCE).unwrap();
    let resp =
        s.rt.block_on(client.allocate(api::AllocateRequest {
            container_requests: vec![api::ContainerAllocateRequest {
                devices_ids: vec![vf_s.clone()],
            }],
        }))
        .unwrap_or_else(|e| panic!("Allocate {vf}: {e}\n{}", s.plugin_log()))
        .into_inner();
    // The kubelet lists the pod's device once the container is created.
    s.pod_resources().run_pod(name, RESOURCE, &[&vf_s]);
    assert_eq!(resp.container_responses.len(), 1);
    let c = &resp.container_responses[0];
    // Device specs: exactly the VF's char devices plus rdma_cm.
    let dir = s
        .node
        .fixture_root()
        .join("sys/bus/pci/devices")
        .join(&vf_s);
    let mut want: BTreeSet<String> = ["infiniband_verbs", "infiniband_mad"]
        .iter()
        .flat_map(|sub| files_in(&dir.join(sub)))
        .map(|n| format!("/dev/infiniband/{n}"))
        .collect();
    want.insert("/dev/infiniband/rdma_cm".into());
    assert_eq!(want.len(), 3, "{want:?}");
    let got: BTreeSet<String> = c.devices.iter().map(|d| d.host_path.clone()).collect();
    assert_eq!(got, want);
    assert!(
        c.devices
            .iter()
            .all(|d| d.container_path == d.host_path && d.permissions == "rw")
    );
    assert!(c.cdi_devices.is_empty());
    // Env and annotations.
    assert_eq!(c.envs["PCIDEVICE_RDMA_VF"], vf_s);
    let info: Value = serde_json::from_str(&c.envs["PCIDEVICE_RDMA_VF_INFO"]).unwrap();
    let netdev = dev.netdevs[0].clone();
    assert_eq!(info[&vf_s]["netdev"], netdev.as_str());
    assert_eq!(info[&vf_s]["pfPciAddress"], PFS[0].pci);
    assert_eq!(info[&vf_s]["rdmaDevice"], dev.rdma_devices[0].as_str());
    assert_eq!(info[&vf_s]["numaNode"], 0);
    assert_eq!(c.annotations["kroce.io/rdma-devices.rdma_vf"], vf_s);
    assert_eq!(c.annotations["kroce.io/memlock.rdma_vf"], "unlimited");
    // The device-info file (device-info-spec 1.1.0) where Multus looks.
    let devinfo = s.dir("devinfo").join(format!("rdma-vf-{vf_s}-device.json"));
    let di: Value = serde_json::from_slice(&std::fs::read(&devinfo).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; devinfo dir: {:?}",
            devinfo.display(),
            files_in(&s.dir("devinfo"))
        )
    }))
    .unwrap();
    assert_eq!(di["type"], "pci");
    assert_eq!(di["version"], "1.1.0");
    assert_eq!(di["pci"]["pci-address"], vf_s.as_str());
    assert_eq!(di["pci"]["pf-pci-address"], PFS[0].pci);
    assert_eq!(di["pci"]["rdma-device"], dev.rdma_devices[0].as_str());
    Pod {
        name,
        netns: NetnsGuard::create(&format!("kroce-e2e-{name}-{tag}")).unwrap(),
        container_id: format!("{name}-{tag}-0123456789abcdef"),
        vf: vf_s,
        vf_netdev: netdev,
        devinfo,
    }
}

/// Step 5: VLAN refused, ADD, ping, CHECK, DEL twice, everything back.
fn cni_add_ping_check_del(s: &Scene) {
    let (a, b) = (&s.pods[0], &s.pods[1]);
    let before = s.node_links();

    // VLAN is a PF-side VF attribute: a veth PF has no VFs to set it on,
    // so kroce-cni refuses before changing anything.
    let r = s.cni(a, "ADD", &s.cni_config(a, false, json!({"vlan": 100})));
    assert_ne!(r.code, 0, "{r}");
    assert_eq!(r.json()["code"], 102, "{r}");
    assert!(r.stdout.contains("ens1f0"), "{r}");
    assert_eq!(s.node_links(), before, "a refused ADD changed the node");
    assert!(s.leases().is_empty(), "{:?}", s.leases());
    assert!(s.state_files().is_empty(), "{:?}", s.state_files());
    assert!(a.netns.link("net1").is_none());

    // ADD for both pods: pod A with only the device-info file, pod B with
    // deviceID too.
    let mut results = Vec::new();
    for (pod, with_id) in [(a, false), (b, true)] {
        let cfg = s.cni_config(pod, with_id, json!({}));
        let r = s.cni(pod, "ADD", &cfg);
        assert_eq!(r.code, 0, "ADD {}: {r}", pod.name);
        let res = r.json();
        let mac = fixture_mac(&pci(&pod.vf));
        assert_eq!(res["cniVersion"], "1.0.0");
        let iface = &res["interfaces"][0];
        assert_eq!(iface["name"], "net1", "{res:#}");
        assert_eq!(iface["mac"], mac.as_str(), "{res:#}");
        assert_eq!(
            iface["sandbox"],
            format!("/var/run/netns/{}", pod.netns.name)
        );
        let addr = res["ips"][0]["address"].as_str().unwrap().to_string();
        assert!(
            addr.starts_with(SUBNET_PREFIX) && addr.ends_with("/24"),
            "{addr}"
        );
        // In the pod: the VF under CNI_IFNAME with its MAC, the MTU, up,
        // the address.
        let net1 = pod
            .netns
            .link("net1")
            .unwrap_or_else(|| panic!("no net1 in {}", pod.name));
        assert_eq!(net1.mac, mac);
        assert_eq!(net1.mtu, u64::from(POD_MTU));
        assert!(net1.up);
        assert_eq!(
            pod.netns.addresses("net1").unwrap(),
            std::slice::from_ref(&addr)
        );
        assert!(
            s.node.netns.link(&pod.vf_netdev).is_none(),
            "{} still in the node",
            pod.vf_netdev
        );
        // The lease is this sandbox's; the memlock request is recorded.
        let ip = addr.trim_end_matches("/24").to_string();
        let leases = s.leases();
        assert!(
            leases
                .get(&ip)
                .is_some_and(|l| l.contains(&pod.container_id)),
            "{leases:?}"
        );
        let memlock: Value = serde_json::from_slice(
            &std::fs::read(
                s.dir("cni-state")
                    .join("memlock")
                    .join(format!("{}.json", pod.container_id)),
            )
            .unwrap_or_else(|e| {
                panic!(
                    "memlock file of {}: {e}; state: {:?}",
                    pod.name,
                    s.state_files()
                )
            }),
        )
        .unwrap();
        assert_eq!(memlock["memlock"], "unlimited", "{memlock:#}");
        assert_eq!(memlock["ifname"], "net1");
        assert_eq!(memlock["network"], NETWORK);
        assert_eq!(memlock["containerID"], pod.container_id.as_str());
        results.push((cfg, res, ip.parse::<Ipv4Addr>().unwrap()));
    }
    assert_ne!(results[0].2, results[1].2);

    // The pods reach each other over the VFs' shared parent.
    for (from, to) in [(a, results[1].2), (b, results[0].2)] {
        let rtt = icmp::ping(&from.netns.path, to, 0x4b52, Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("{} -> {to}: {e}", from.name));
        assert!(rtt < Duration::from_secs(1), "{rtt:?}");
    }

    // CHECK with the ADD result as prevResult.
    for (pod, (cfg, res, _)) in [a, b].into_iter().zip(&results) {
        let mut check = cfg.clone();
        check["prevResult"] = res.clone();
        let r = s.cni(pod, "CHECK", &check);
        assert_eq!(
            (r.code, r.stdout.as_str()),
            (0, ""),
            "CHECK {}: {r}",
            pod.name
        );
    }

    // DEL twice each: the second finds nothing and still succeeds.
    for (pod, (cfg, res, _)) in [a, b].into_iter().zip(&results) {
        let mut del = cfg.clone();
        del["prevResult"] = res.clone();
        for n in 1..=2 {
            let r = s.cni(pod, "DEL", &del);
            assert_eq!(
                (r.code, r.stdout.as_str()),
                (0, ""),
                "DEL #{n} {}: {r}",
                pod.name
            );
        }
        assert!(pod.netns.link("net1").is_none());
        s.pod_resources().delete_pod(pod.name);
    }
    // Back as before: names, ifindexes, MACs, MTUs, up/down of every link.
    assert_eq!(s.node_links(), before);
    assert!(s.leases().is_empty(), "{:?}", s.leases());
    assert!(s.state_files().is_empty(), "{:?}", s.state_files());
    // And the plugin still has every VF healthy.
    let all = s.wait(
        s.rt.block_on(
            s.kubelet()
                .wait_devices(RESOURCE, WAIT, "6 healthy VFs", |d| {
                    d.len() == 6 && d.iter().all(|x| x.health == api::HEALTHY)
                }),
        ),
    );
    assert_eq!(all.len(), 6);
}
