#![allow(clippy::unwrap_used, clippy::expect_used)]
//! DRA network attachment under a REAL container runtime: containerd 2.1.9
//! (CRI, NRI) with runc 1.1.5, driven over CRI as a kubelet drives it, with
//! the kroce-nri binary attaching the VF of a DRA network-attach request
//! (as the DRA plugin writes it at NodePrepareResources) at RunPodSandbox
//! and releasing it at StopPodSandbox.
//!
//! The "VFs" are veths in the node netns named and addressed as the VFs of
//! a fixture ConnectX-6 Dx (no SR-IOV in this kernel): VF 1 carries the
//! pod's primary network (kroce-cni through containerd's libcni, eth0),
//! VF 0 is the claim's. IPAM is Debian's real host-local. No PF-side
//! settings (VLAN, PF-side MAC): the PF does not exist here.
//!
//! Checked: RunPodSandbox gives the pod `net1` (the VF with the claim's
//! MTU and an address from the claim's IPAM) and the result file with the
//! networkData; StopPodSandbox gives the VF back (name, MAC, MTU), releases
//! its lease and removes the result, the primary network untouched by it;
//! a request whose IPAM plugin does not exist fails RunPodSandbox with the
//! node as before; cycles leak nothing. Memlock: a container given the
//! claim's CDI device (the spec the DRA plugin writes, with its
//! `KROCE_DRA_CLAIM_<UID>` env) runs with the claim's memlock request
//! (`<state>/dra-memlock/<uid>.json`) as RLIMIT_MEMLOCK, read from
//! `/proc/<pid>/limits` of its process; a container of the same pod without
//! the device keeps the runtime's default.
//!
//! Needs root, netns, and the peers of `ci/real-peers.sh`; skips without
//! them, except in CI, where a skip is a failure.

#[allow(dead_code)]
#[path = "rig/process.rs"]
mod rig_process;
#[allow(dead_code)]
mod runtime;

use kroce_cni::testing::NetnsGuard;
use kroce_cni::testing::testbed::unique_tag;
use kroce_e2e::cri;
use rig_process::Daemon;
use runtime::containerd::Containerd;
// The CRI calls and node setup both containerd tests make.
use runtime::kubelet::*;
use runtime::node::*;
use runtime::{Peers, skip_reason};
use serde_json::{Value, json};
use sriov_helpers::PciAddress;
use sriov_helpers::fixture::FixtureHost;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const PRIMARY: &str = "kroce-ctd-primary";
const VF_MTU: u32 = 1500;
const CLAIM_MTU: u32 = 4000;
const CLAIM_SUBNET: &str = "10.79.0.0/24";
/// The claim's memlock request: under this machine's 8 MiB hard limit
/// (root without CAP_SYS_RESOURCE), so it is granted as asked.
const CLAIM_MEMLOCK: u64 = 4 << 20;
/// The DRA network's CNI name (host-local's lease dir): the contract's
/// `CNI_NETWORK_NAME`, and the request dir `<state>/dra-attach`, written
/// literally here: this test checks the files as the plugins exchange them.
const DRA_NETWORK: &str = "rdma.kroce.io";

struct Rig {
    node: NetnsGuard,
    fixture: FixtureHost,
    ctd: Containerd,
    nri: Daemon,
    dir: PathBuf,
    state_dir: PathBuf,
    ipam_dir: PathBuf,
    vf: [(PciAddress, String, String); 2],
}

/// A kroce binary next to the test executable (`<target>/<profile>/`) or
/// in KROCE_BIN_DIR.
fn bin(name: &str) -> PathBuf {
    let dir = std::env::var_os("KROCE_BIN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let exe = std::env::current_exe().unwrap();
            exe.parent().unwrap().parent().unwrap().to_path_buf()
        });
    let p = dir.join(name);
    assert!(
        p.is_file(),
        "{} not found: run `cargo build -p kroce-nri -p kroce-cni --bins` first",
        p.display()
    );
    p
}

fn setup(peers: &Peers, tag: &str) -> Rig {
    let dir = kept_dir("kroce-ctd-dra-");
    let node = NetnsGuard::create(&format!("kroce-dra-{tag}")).unwrap();
    let (fixture, pf) = fixture_pf();
    let sysfs = fixture.path().join("sys");
    let vf = [0u32, 1].map(|i| veth_vf(&node, &fixture, &pf, i, &format!("kdrapeer{i}"), VF_MTU));

    let mut ctd = Containerd::prepare(peers, &dir, &node.path).unwrap();
    link_cni_plugins(&ctd, &bin("kroce-cni"));
    let state_dir = dir.join("kroce-state");
    let ipam_dir = dir.join("ipam");
    // The primary network: kroce-cni on VF 1 as eth0.
    let primary = json!({"cniVersion": "1.1.0", "name": PRIMARY, "plugins": [{
        "type": "kroce-cni",
        "deviceID": vf[1].0.to_string(),
        "rdma": false,
        "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.77.0.0/24"}]], "dataDir": ipam_dir},
    }]});
    std::fs::write(ctd.cni_conf.join("10-kroce.conflist"), primary.to_string()).unwrap();
    // kroce-cni's roots come from containerd's environment (passed on to
    // the plugins it runs), never from the config.
    ctd.env = vec![
        (
            kroce_cni::cni_env::SYSFS_ROOT.into(),
            sysfs.display().to_string(),
        ),
        (
            kroce_cni::cni_env::STATE_DIR.into(),
            state_dir.display().to_string(),
        ),
    ];
    start_with_image(&mut ctd, &dir);

    let nri = start_nri(&node.path, &ctd, &state_dir, fixture.path(), &dir);
    Rig {
        node,
        fixture,
        ctd,
        nri,
        dir,
        state_dir,
        ipam_dir,
        vf,
    }
}

/// Starts the kroce-nri binary on containerd's NRI socket and waits until
/// it has synchronized.
fn start_nri(
    netns: &Path,
    ctd: &Containerd,
    state_dir: &Path,
    host_root: &Path,
    dir: &Path,
) -> Daemon {
    let mut cmd = Command::new(bin("kroce-nri"));
    cmd.arg("--socket")
        .arg(&ctd.nri_socket)
        .arg("--state-dir")
        .arg(state_dir)
        .arg("--host-root")
        .arg(host_root)
        .arg("--cni-bin-dir")
        .arg(&ctd.cni_bin)
        .env("RUST_LOG", "info");
    let nri = Daemon::start("kroce-nri", netns, cmd, &dir.join("kroce-nri.log")).unwrap();
    wait_synchronized(&nri, ctd, 1);
    nri
}

impl Rig {
    fn attach_dir(&self) -> PathBuf {
        self.state_dir.join("dra-attach")
    }

    /// The request the DRA plugin writes at prepare for claim `uid`.
    fn write_request(&self, uid: &str, pod_uid: &str, range: Value) {
        std::fs::create_dir_all(self.attach_dir()).unwrap();
        let (pci, netdev, _) = &self.vf[0];
        let req = json!({
            "version": 1, "claimUid": uid, "claimNamespace": "default",
            "claimName": format!("claim-{uid}"), "podUids": [pod_uid],
            "devices": [{
                "device": "vf-0000-3b-00-2", "pool": "node-a", "request": "vf",
                "pciAddress": pci.to_string(), "netdev": netdev,
                "mtu": CLAIM_MTU, "rdma": false,
                "ipam": {"type": "host-local", "ranges": [[range]],
                    "dataDir": self.ipam_dir},
            }],
        });
        std::fs::write(
            self.attach_dir().join(format!("{uid}.json")),
            req.to_string(),
        )
        .unwrap();
    }

    /// What the DRA plugin writes at prepare for a claim with `memlock`:
    /// the CDI spec (its device's env names the claim; no device nodes,
    /// this kernel has no /dev/infiniband) and the memlock request, both
    /// literally as the plugin writes them.
    fn write_memlock_claim(&self, uid: &str, env: &str) -> String {
        let device = format!("{uid}-vf-0000-3b-00-2");
        let spec = json!({"cdiVersion": "0.6.0", "kind": "rdma.kroce.io/claim",
            "devices": [{"name": device, "containerEdits": {
                "env": [format!("{env}=default/claim-{uid}"),
                    format!("KROCE_DRA_VF_0000_3B_00_2_PCI_ADDRESS={}", self.vf[0].0)],
                "deviceNodes": []}}]});
        std::fs::write(
            self.ctd
                .dir
                .join("cdi")
                .join(format!("rdma.kroce.io-claim_{uid}.json")),
            spec.to_string(),
        )
        .unwrap();
        let dir = self.state_dir.join("dra-memlock");
        std::fs::create_dir_all(&dir).unwrap();
        let req = json!({"version": 1, "containerID": uid, "netns": "",
            "ifname": "vf-0000-3b-00-2", "memlock": CLAIM_MEMLOCK, "network": "vf",
            "attachments": {"vf-0000-3b-00-2": {"memlock": CLAIM_MEMLOCK, "network": "vf"}}});
        std::fs::write(dir.join(format!("{uid}.json")), req.to_string()).unwrap();
        format!("rdma.kroce.io/claim={device}")
    }

    fn result(&self, uid: &str) -> Option<Value> {
        std::fs::read(self.attach_dir().join(format!("{uid}.result.json")))
            .ok()
            .map(|b| serde_json::from_slice(&b).unwrap())
    }

    fn dra_leases(&self) -> Vec<String> {
        std::fs::read_dir(self.ipam_dir.join(DRA_NETWORK))
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.starts_with("10.79."))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The claim's VF in the node netns as it was, its lease gone, no
    /// kroce-cni claim for it.
    fn assert_vf_home(&self, when: &str) {
        let (pci, name, mac) = &self.vf[0];
        let link = self.node.link(name);
        assert_eq!(
            link.as_ref().map(|l| (l.mac.as_str(), l.mtu)),
            Some((mac.as_str(), u64::from(VF_MTU))),
            "{when}: VF {name} not back: {link:?}\n--- kroce-nri\n{}",
            self.nri.log_text()
        );
        assert!(
            self.dra_leases().is_empty(),
            "{when}: {:?}",
            self.dra_leases()
        );
        let claim = self
            .state_dir
            .join("vf")
            .join(format!("{}.json", pci.to_string().replace(':', "_")));
        let claims: Vec<String> = std::fs::read_dir(self.state_dir.join("vf"))
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.ends_with(".json"))
                    .collect()
            })
            .unwrap_or_default();
        assert!(
            claims.iter().all(|c| !c.contains(&pci.to_string()[5..])),
            "{when}: kroce-cni still claims {pci}: {claims:?} ({})",
            claim.display()
        );
    }
}

async fn run_pod(cri: &mut Cri, rig: &Rig, name: &str) -> Result<(String, String), String> {
    let id = run_sandbox(cri, &sandbox_config(name, &rig.dir.join("logs"))).await?;
    let (netns, _) = sandbox_netns(cri, &id).await;
    Ok((id, netns))
}

/// Creates and starts a sleeping container in `pod` with the CDI devices
/// given; returns its ID and the (soft, hard) `Max locked memory` of its
/// process, from the host's `/proc/<pid>/limits`.
async fn start_sleeper(
    cri: &mut Cri,
    rig: &Rig,
    pod: &str,
    name: &str,
    cdi: &[String],
) -> Result<(String, (String, String)), String> {
    let config = cri::ContainerConfig {
        cdi_devices: cdi
            .iter()
            .map(|n| cri::CdiDevice { name: n.clone() })
            .collect(),
        ..container_config(name, "exec sleep 3600")
    };
    let sandbox = sandbox_config("dra-pod", &rig.dir.join("logs"));
    let id = create_container(cri, pod, &sandbox, config).await?;
    cri.start_container(cri::StartContainerRequest {
        container_id: id.clone(),
    })
    .await
    .map_err(|e| format!("StartContainer {name}: {}", e.message()))?;
    let info = container_info(cri, &id).await?;
    let pid = info["pid"].as_u64().ok_or(format!("no pid: {info}"))?;
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits"))
        .map_err(|e| format!("/proc/{pid}/limits: {e}"))?;
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max locked memory"))
        .ok_or("no Max locked memory line")?;
    let w: Vec<&str> = line.split_whitespace().collect();
    Ok((id, (w[3].to_owned(), w[4].to_owned())))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dra_vf_attached_at_run_and_released_at_stop_through_containerd() {
    if skip_reason("dra_vf_attached_at_run_and_released_at_stop_through_containerd").is_some() {
        return;
    }
    let peers = Peers::find().unwrap();
    let mut rig = setup(&peers, &unique_tag());
    let mut cri = rig.ctd.cri().await.unwrap();
    let uid = "6c1d3e0a-0000-4000-8000-00000000dd01";

    for cycle in 0..2 {
        rig.write_request(uid, "uid-dra-pod", json!({"subnet": CLAIM_SUBNET}));
        let (id, netns) = match run_pod(&mut cri, &rig, "dra-pod").await {
            Ok(x) => x,
            Err(e) => panic!(
                "RunPodSandbox: {e}\n--- kroce-nri\n{}\n--- containerd\n{}",
                rig.nri.log_text(),
                rig.ctd.log_tail()
            ),
        };
        let net1 = ip_json(&["-n", &netns, "addr", "show", "dev", "net1"]);
        let net1 = &net1[0];
        assert_eq!(net1["mtu"], CLAIM_MTU, "cycle {cycle}: {net1}");
        assert_eq!(net1["address"], rig.vf[0].2.as_str(), "the VF's own MAC");
        let addr = net1["addr_info"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["family"] == "inet")
            .map(|a| format!("{}/{}", a["local"].as_str().unwrap(), a["prefixlen"]))
            .expect("an IPv4 address on net1");
        assert!(addr.starts_with("10.79.0."), "{addr}");
        // The primary network is there too, on the other VF.
        assert!(!ip_json(&["-n", &netns, "link", "show", "dev", "eth0"])[0].is_null());
        assert!(rig.node.link(&rig.vf[0].1).is_none(), "VF 0 left the node");
        let result = rig.result(uid).expect("result file");
        assert_eq!(result["podUid"], "uid-dra-pod");
        assert_eq!(result["sandboxId"], id.as_str());
        assert_eq!(
            result["devices"][0],
            json!({"device": "vf-0000-3b-00-2", "pool": "node-a", "interfaceName": "net1",
                "ips": [addr], "hardwareAddress": rig.vf[0].2})
        );
        assert_eq!(rig.dra_leases().len(), 1);

        if cycle == 0 {
            // The claim asks for 4 MiB of memlock: the container given its
            // CDI device runs with it, its sibling without the device not.
            let cdi = rig
                .write_memlock_claim(uid, "KROCE_DRA_CLAIM_6C1D3E0A_0000_4000_8000_00000000DD01");
            let (holder, limits) = start_sleeper(&mut cri, &rig, &id, "holder", &[cdi])
                .await
                .unwrap_or_else(|e| {
                    panic!(
                        "{e}\n--- kroce-nri\n{}\n--- containerd\n{}",
                        rig.nri.log_text(),
                        rig.ctd.log_tail()
                    )
                });
            let want = CLAIM_MEMLOCK.to_string();
            assert_eq!(
                limits,
                (want.clone(), want),
                "the claim's holder runs with the claim's memlock\n--- kroce-nri\n{}",
                rig.nri.log_text()
            );
            let (plain, plain_limits) = start_sleeper(&mut cri, &rig, &id, "plain", &[])
                .await
                .unwrap();
            assert_ne!(
                plain_limits.0,
                CLAIM_MEMLOCK.to_string(),
                "a container without the claim is not touched"
            );
            remove_container(&mut cri, &holder).await;
            remove_container(&mut cri, &plain).await;
        }

        if cycle == 1 {
            // kroce-nri restarted while the pod runs: the release works from
            // kroce-cni's state, not from the daemon's memory.
            rig.nri.terminate(Duration::from_secs(5)).unwrap();
            rig.nri = start_nri(
                &rig.node.path,
                &rig.ctd,
                &rig.state_dir,
                rig.fixture.path(),
                &rig.dir,
            );
        }
        remove_sandbox(&mut cri, &id).await.unwrap();
        rig.assert_vf_home(&format!("cycle {cycle}"));
        assert!(rig.result(uid).is_none(), "result removed at release");
        // The primary network's VF is back too (kroce-cni DEL via libcni).
        assert!(rig.node.link(&rig.vf[1].1).is_some());
    }

    // A claim whose one address is leased to someone else: IPAM fails in
    // the middle of the attach (the VF already in the pod), RunPodSandbox
    // fails, the VF is back on the node, nothing of ours is left.
    let foreign = rig.ipam_dir.join(DRA_NETWORK).join("10.79.0.5");
    std::fs::create_dir_all(foreign.parent().unwrap()).unwrap();
    std::fs::write(&foreign, "someone-else\r\neth0").unwrap();
    rig.write_request(
        uid,
        "uid-dra-bad",
        json!({"subnet": CLAIM_SUBNET, "rangeStart": "10.79.0.5", "rangeEnd": "10.79.0.5"}),
    );
    let e = run_pod(&mut cri, &rig, "dra-bad").await.unwrap_err();
    assert!(
        e.contains("vf-0000-3b-00-2") && e.contains("rolled back"),
        "{e}"
    );
    std::fs::remove_file(&foreign).unwrap();
    rig.assert_vf_home("failed RunPodSandbox");
    assert!(rig.result(uid).is_none());
    assert!(
        rig.node.link(&rig.vf[1].1).is_some(),
        "primary VF back after the failed sandbox"
    );
    let _ = &rig.fixture;
}
