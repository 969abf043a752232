#![allow(clippy::unwrap_used, clippy::expect_used)]
//! kroce-cni and kroce-nri under a REAL container runtime: containerd 2.1.9
//! (CRI; its embedded libcni 1.3 runs kroce-cni; its NRI 0.8 calls
//! kroce-nri) with runc 1.1.5, driven over CRI as a kubelet drives it.
//!
//! The "VF" is a veth in the node netns whose name and MAC are those of a
//! ConnectX-6 Dx VF of a fixture sysfs tree (no SR-IOV in this kernel).
//! IPAM is Debian's real host-local.
//!
//! Checked: RunPodSandbox makes libcni call kroce-cni ADD (the VF is in the
//! pod netns with the IP and MTU); NetworkReady; a pod whose network asks
//! for 4 MiB of memlock gets RLIMIT_MEMLOCK = 4 MiB from kroce-nri in the
//! OCI spec and the container really starts with it (/proc/self/limits); a
//! container of a pod without a request gets no rlimit; one with the device
//! plugin's annotation asking `unlimited` is capped at the runtime's hard
//! limit (this machine's root lacks CAP_SYS_RESOURCE, as rootless and nested
//! runtimes do) and starts; removing the sandbox runs DEL and gives the VF,
//! its MAC and MTU back and removes claim, lease and memlock file; cycles
//! leak nothing; containerd killed -9 with a pod running, and in the middle
//! of an ADD, and kroce-nri restarted: everything converges.
//!
//! Needs root, netns, and the peers of `ci/real-peers.sh`; skips without
//! them, except in CI, where a skip is a failure.

#[allow(dead_code)]
#[path = "rig/bins.rs"]
mod rig_bins;
#[allow(dead_code)]
#[path = "rig/process.rs"]
mod rig_process;
#[allow(dead_code)]
mod runtime;

use kroce_cni::testing::NetnsGuard;
use kroce_cni::testing::testbed::{CNI_BIN_DIR, unique_tag};
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
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const NETWORK: &str = "kroce-ctd";
const SUBNET: &str = "10.77.0.0/24";
const VF_MTU: u32 = 1500;
const POD_MTU: u32 = 1400;
const MEMLOCK_4MI: u64 = 4 << 20;

struct Rig {
    node: NetnsGuard,
    _fixture: FixtureHost,
    ctd: Containerd,
    nri: Daemon,
    dir: PathBuf,
    state_dir: PathBuf,
    ipam_dir: PathBuf,
    /// Where the kroce binaries under test are (KROCE_BIN_DIR in CI).
    bin_dir: PathBuf,
    vf_pci: PciAddress,
    vf_ifname: String,
    vf_mac: String,
}

fn conflist(rig: &Rig, memlock: Option<&str>) -> String {
    let mut plugin = json!({
        "type": "kroce-cni",
        "deviceID": rig.vf_pci.to_string(),
        "mtu": POD_MTU,
        "rdma": false,
        "ipam": {"type": "host-local", "ranges": [[{"subnet": SUBNET}]], "dataDir": rig.ipam_dir},
    });
    if let Some(m) = memlock {
        plugin["memlock"] = json!(m);
    }
    json!({"cniVersion": "1.1.0", "name": NETWORK, "plugins": [plugin]}).to_string()
}

/// Writes the conflist and waits until containerd's CNI syncer loaded it
/// (CRI Status carries the loaded config in its verbose info).
async fn use_conflist(rig: &Rig, cri: &mut Cri, text: &str) {
    let tmp = rig.ctd.cni_conf.join(".10-kroce.tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, rig.ctd.cni_conf.join("10-kroce.conflist")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let st = cri
            .status(cri::StatusRequest { verbose: true })
            .await
            .unwrap()
            .into_inner();
        // The verbose info carries the loaded conflist (quotes escaped).
        let marker = |v: &str, key: &str| v.contains(key) == text.contains(key);
        let loaded = st.info.values().any(|v| {
            v.contains(&rig.vf_pci.to_string()) && marker(v, "memlock") && marker(v, "no-such-ipam")
        });
        if loaded {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "containerd never loaded the conflist {text}\n{}",
            rig.ctd.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// containerd's NetworkReady condition, which follows the CNI STATUS of the
/// loaded network (CNI 1.1.0).
async fn network_ready(cri: &mut Cri) -> cri::RuntimeCondition {
    let st = cri
        .status(cri::StatusRequest { verbose: false })
        .await
        .unwrap()
        .into_inner();
    st.status
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.r#type == "NetworkReady")
        .expect("NetworkReady condition")
}

struct Pod {
    id: String,
    config: cri::PodSandboxConfig,
    netns: String,
    ip: String,
}

async fn run_pod(rig: &Rig, cri: &mut Cri, name: &str) -> Pod {
    let config = sandbox_config(name, &rig.dir.join("logs"));
    let id = match run_sandbox(cri, &config).await {
        Ok(id) => id,
        Err(e) => panic!(
            "RunPodSandbox {name}: {e}\n--- containerd\n{}",
            rig.ctd.log_tail()
        ),
    };
    let (netns, status) = sandbox_netns(cri, &id).await;
    let ip = status.network.unwrap().ip;
    Pod {
        id,
        config,
        netns,
        ip,
    }
}

async fn remove_pod(rig: &Rig, cri: &mut Cri, pod: &Pod) {
    if let Err(e) = remove_sandbox(cri, &pod.id).await {
        panic!("{e}\n{}", rig.ctd.log_tail());
    }
}

struct Started {
    id: String,
    /// RLIMIT_MEMLOCK in the OCI spec the runtime built: (soft, hard).
    memlock: Option<(u64, u64)>,
}

/// Creates and starts a container printing its locked-memory limit.
async fn start_container(
    cri: &mut Cri,
    pod: &Pod,
    name: &str,
    annotations: BTreeMap<String, String>,
) -> Result<Started, String> {
    let config = cri::ContainerConfig {
        annotations: annotations.into_iter().collect(),
        ..container_config(
            name,
            "grep 'Max locked memory' /proc/self/limits; exec sleep 3600",
        )
    };
    let id = create_container(cri, &pod.id, &pod.config, config).await?;
    let info = container_info(cri, &id).await?;
    let memlock = info["runtimeSpec"]["process"]["rlimits"]
        .as_array()
        .and_then(|l| l.iter().find(|r| r["type"] == "RLIMIT_MEMLOCK"))
        .map(|r| (r["soft"].as_u64().unwrap(), r["hard"].as_u64().unwrap()));
    cri.start_container(cri::StartContainerRequest {
        container_id: id.clone(),
    })
    .await
    .map_err(|e| {
        format!(
            "StartContainer {name} (spec RLIMIT_MEMLOCK {memlock:?}): {}",
            e.message()
        )
    })?;
    Ok(Started { id, memlock })
}

/// The container's `Max locked memory` line, once it printed it.
fn limits_line(rig: &Rig, pod: &str, container: &str) -> String {
    let log = rig
        .dir
        .join("logs")
        .join(pod)
        .join(format!("{container}.log"));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if let Some(l) = text.lines().find(|l| l.contains("Max locked memory")) {
            return l.to_owned();
        }
        assert!(
            Instant::now() < deadline,
            "{} never printed its limits",
            log.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The pod's eth0 as `ip -j` shows it.
fn pod_link(pod: &Pod) -> Value {
    ip_json(&["-n", &pod.netns, "-d", "addr", "show", "dev", "eth0"])[0].clone()
}

fn files_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = walk(dir)
        .into_iter()
        .map(|p| p.strip_prefix(dir).unwrap().display().to_string())
        .collect();
    v.sort();
    v
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
}

/// What must be back after every pod is gone: the VF in the node netns
/// under its own name, MAC and MTU; no claim, lock, memlock file or lease.
fn assert_node_clean(rig: &Rig, when: &str) {
    let link = rig.node.link(&rig.vf_ifname);
    let back = link.as_ref().map(|l| (l.mac.as_str(), l.mtu));
    assert_eq!(
        back,
        Some((rig.vf_mac.as_str(), u64::from(VF_MTU))),
        "{when}: VF {} not back with its MAC and MTU: {link:?}",
        rig.vf_ifname
    );
    let state: Vec<String> = files_in(&rig.state_dir)
        .into_iter()
        .filter(|f| f.starts_with("vf/") || f.starts_with("memlock/"))
        .collect();
    assert!(state.is_empty(), "{when}: kroce-cni state left: {state:?}");
    let leases: Vec<String> = files_in(&rig.ipam_dir)
        .into_iter()
        .filter(|f| f.contains("10.77.0."))
        .collect();
    assert!(
        leases.is_empty(),
        "{when}: host-local leases left: {leases:?}"
    );
}

fn setup(peers: &Peers, tag: &str) -> Rig {
    let dir = kept_dir("kroce-ctd-");
    let node = NetnsGuard::create(&format!("kroce-ctd-{tag}")).unwrap();
    let (fixture, pf) = fixture_pf();
    let (vf_pci, vf_ifname, vf_mac) = veth_vf(&node, &fixture, &pf, 0, "kctdpeer0", VF_MTU);
    let sysfs = fixture.path().join("sys");

    let mut ctd = Containerd::prepare(peers, &dir, &node.path).unwrap();
    let bins = rig_bins::Binaries::locate().unwrap();
    let bin_dir = bins.cni.parent().unwrap().to_path_buf();
    link_cni_plugins(&ctd, &bins.cni);
    let state_dir = dir.join("kroce-state");
    let ipam_dir = dir.join("ipam");
    // kroce-cni's roots: containerd's environment, which it passes on to
    // the plugins it runs (as an installer would set it), never the config.
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

    let nri = start_nri(
        &bin_dir,
        &node.path,
        &ctd,
        &state_dir,
        &dir.join("kroce-nri.log"),
    );
    Rig {
        node,
        _fixture: fixture,
        ctd,
        nri,
        dir,
        state_dir,
        ipam_dir,
        bin_dir,
        vf_pci,
        vf_ifname,
        vf_mac,
    }
}

/// Starts kroce-nri on containerd's NRI socket and waits until it has
/// registered and synchronized.
fn start_nri(
    bin_dir: &Path,
    netns: &Path,
    ctd: &Containerd,
    state_dir: &Path,
    log: &Path,
) -> Daemon {
    let mut cmd = Command::new(bin_dir.join("kroce-nri"));
    cmd.arg("--socket")
        .arg(&ctd.nri_socket)
        .arg("--state-dir")
        .arg(state_dir)
        .env("RUST_LOG", "info");
    let nri = Daemon::start("kroce-nri", netns, cmd, log).unwrap();
    wait_synchronized(&nri, ctd, 1);
    nri
}

/// The runtime's RLIMIT_MEMLOCK hard limit, from its /proc.
fn runtime_memlock_hard(pid: u32) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with("Max locked memory"))
        .unwrap();
    let hard = line.split_whitespace().nth(4).unwrap();
    if hard == "unlimited" {
        u64::MAX
    } else {
        hard.parse().unwrap()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containerd_runs_kroce_cni_and_kroce_nri() {
    let test = "containerd_runs_kroce_cni_and_kroce_nri";
    if skip_reason(test).is_some() {
        return;
    }
    let peers = Peers::find().unwrap();
    let tag = unique_tag();
    let mut rig = setup(&peers, &tag);
    let mut cri = rig.ctd.cri().await.unwrap();

    // 1. A pod whose network asks for 4 MiB of locked memory.
    // 0. A broken IPAM shows in NetworkReady (kroce-cni STATUS, code 50).
    let mut broken: Value = serde_json::from_str(&conflist(&rig, None)).unwrap();
    broken["plugins"][0]["ipam"]["type"] = json!("no-such-ipam");
    use_conflist(&rig, &mut cri, &broken.to_string()).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut ready = network_ready(&mut cri).await;
    while ready.status && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        ready = network_ready(&mut cri).await;
    }
    assert!(
        !ready.status && ready.message.contains("no-such-ipam"),
        "NetworkReady must be false naming the missing IPAM plugin: {ready:?}"
    );

    use_conflist(&rig, &mut cri, &conflist(&rig, Some("4Mi"))).await;
    let network_ready = network_ready(&mut cri).await;
    assert!(
        network_ready.status,
        "NetworkReady false: {network_ready:?}"
    );

    let pod = run_pod(&rig, &mut cri, "p1").await;
    assert!(pod.ip.starts_with("10.77.0."), "sandbox IP {:?}", pod.ip);
    let eth0 = pod_link(&pod);
    assert_eq!(
        eth0["address"], rig.vf_mac,
        "the VF is the pod's eth0: {eth0}"
    );
    assert_eq!(eth0["mtu"], POD_MTU, "{eth0}");
    let addrs: Vec<String> = eth0["addr_info"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| format!("{}/{}", a["local"].as_str().unwrap(), a["prefixlen"]))
        .collect();
    assert!(addrs.contains(&format!("{}/24", pod.ip)), "{addrs:?}");
    assert!(
        rig.node.link(&rig.vf_ifname).is_none(),
        "the VF left the node netns"
    );
    assert!(
        rig.state_dir
            .join("memlock")
            .join(format!("{}.json", pod.id))
            .is_file(),
        "kroce-cni recorded the pod's memlock request: {:?}",
        files_in(&rig.state_dir)
    );

    let c1 = start_container(&mut cri, &pod, "c1", BTreeMap::new())
        .await
        .unwrap_or_else(|e| panic!("{e}\n--- kroce-nri\n{}", rig.nri.log_text()));
    assert_eq!(
        c1.memlock,
        Some((MEMLOCK_4MI, MEMLOCK_4MI)),
        "kroce-nri gives the pod's containers the 4 MiB its network asked for"
    );
    let line = limits_line(&rig, "p1", "c1");
    assert!(
        line.split_whitespace().filter(|w| *w == "4194304").count() == 2,
        "the container runs with it: {line}"
    );
    remove_container(&mut cri, &c1.id).await;
    remove_pod(&rig, &mut cri, &pod).await;
    assert_node_clean(&rig, "after the first pod");

    // 2. A network without a request: a plain container gets no rlimit; one
    //    with the device plugin's annotation asking for `unlimited` gets the
    //    runtime's hard limit (it cannot raise it) and starts.
    use_conflist(&rig, &mut cri, &conflist(&rig, None)).await;
    let pod = run_pod(&rig, &mut cri, "p2").await;
    let plain = start_container(&mut cri, &pod, "plain", BTreeMap::new())
        .await
        .unwrap();
    assert_eq!(
        plain.memlock, None,
        "a container without RDMA is not touched"
    );
    let hard = runtime_memlock_hard(rig.ctd.pid().unwrap());
    let annotations = BTreeMap::from([
        (
            "kroce.io/rdma-devices.rdma_vf".to_string(),
            rig.vf_pci.to_string(),
        ),
        (
            "kroce.io/memlock.rdma_vf".to_string(),
            "unlimited".to_string(),
        ),
    ]);
    let rdma = start_container(&mut cri, &pod, "rdma", annotations)
        .await
        .unwrap_or_else(|e| panic!("{e}\n--- kroce-nri\n{}", rig.nri.log_text()));
    if hard == u64::MAX {
        assert_eq!(rdma.memlock, Some((u64::MAX, u64::MAX)));
    } else {
        assert_eq!(
            rdma.memlock,
            Some((hard, hard)),
            "capped at the runtime's hard limit {hard}"
        );
        let line = limits_line(&rig, "p2", "rdma");
        assert!(line.contains(&hard.to_string()), "{line}");
    }
    remove_container(&mut cri, &plain.id).await;
    remove_container(&mut cri, &rdma.id).await;
    remove_pod(&rig, &mut cri, &pod).await;
    assert_node_clean(&rig, "after the second pod");

    // 3. Pod churn leaks nothing.
    use_conflist(&rig, &mut cri, &conflist(&rig, Some("4Mi"))).await;
    let netns_before = files_in(Path::new("/run/netns"));
    for i in 0..20 {
        let pod = run_pod(&rig, &mut cri, &format!("cycle{i}")).await;
        let c = start_container(&mut cri, &pod, "c", BTreeMap::new())
            .await
            .unwrap();
        remove_container(&mut cri, &c.id).await;
        remove_pod(&rig, &mut cri, &pod).await;
        assert_node_clean(&rig, &format!("after cycle {i}"));
    }
    assert_eq!(
        files_in(Path::new("/run/netns")),
        netns_before,
        "no pod netns left"
    );

    // 4. Crashes: containerd killed -9 with a pod running and restarted
    //    (kroce-nri reconnects by itself), then kroce-nri restarted. Limits
    //    still come, and removing the pod still cleans up.
    let pod = run_pod(&rig, &mut cri, "crash").await;
    rig.ctd.kill9();
    rig.ctd.start().unwrap();
    let mut cri = rig.ctd.cri().await.unwrap();
    wait_synchronized(&rig.nri, &rig.ctd, 2);
    let c = start_container(&mut cri, &pod, "after-containerd", BTreeMap::new())
        .await
        .unwrap_or_else(|e| panic!("{e}\n--- kroce-nri\n{}", rig.nri.log_text()));
    assert_eq!(
        c.memlock,
        Some((MEMLOCK_4MI, MEMLOCK_4MI)),
        "after containerd restarted"
    );
    remove_container(&mut cri, &c.id).await;
    rig.nri.terminate(Duration::from_secs(5)).unwrap();
    rig.nri = start_nri(
        &rig.bin_dir,
        &rig.node.path,
        &rig.ctd,
        &rig.state_dir,
        &rig.dir.join("kroce-nri-2.log"),
    );
    let c = start_container(&mut cri, &pod, "after-nri", BTreeMap::new())
        .await
        .unwrap_or_else(|e| panic!("{e}\n--- kroce-nri\n{}", rig.nri.log_text()));
    assert_eq!(
        c.memlock,
        Some((MEMLOCK_4MI, MEMLOCK_4MI)),
        "after kroce-nri restarted"
    );
    remove_container(&mut cri, &c.id).await;
    remove_pod(&rig, &mut cri, &pod).await;
    assert_node_clean(&rig, "after the crashes");

    // 5. containerd killed -9 in the middle of kroce-cni's ADD (an IPAM
    //    delegate that takes 2 s gives the time): the orphaned ADD finishes
    //    on its own; after the restart the test plays the kubelet (lists the
    //    sandboxes, stops and removes those not ready, runs the pod again).
    let slow = rig.ctd.cni_bin.join("slow-host-local");
    std::fs::write(
        &slow,
        format!(
            "#!/bin/sh\n[ \"$CNI_COMMAND\" = ADD ] && sleep 2\nexec {CNI_BIN_DIR}/host-local \"$@\"\n"
        ),
    )
    .unwrap();
    std::fs::set_permissions(
        &slow,
        <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o755),
    )
    .unwrap();
    let mut slow_conf: Value = serde_json::from_str(&conflist(&rig, Some("4Mi"))).unwrap();
    slow_conf["plugins"][0]["ipam"]["type"] = json!("slow-host-local");
    use_conflist(&rig, &mut cri, &slow_conf.to_string()).await;
    let mut in_flight = cri.clone();
    let config = sandbox_config("crash-add", &rig.dir.join("logs"));
    let run = tokio::spawn(async move {
        in_flight
            .run_pod_sandbox(cri::RunPodSandboxRequest {
                config: Some(config),
                runtime_handler: String::new(),
            })
            .await
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while !files_in(&rig.state_dir)
        .iter()
        .any(|f| f.starts_with("vf/"))
    {
        assert!(Instant::now() < deadline, "kroce-cni ADD never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    rig.ctd.kill9();
    assert!(
        run.await.unwrap().is_err(),
        "RunPodSandbox cannot succeed: containerd died"
    );
    // The orphaned kroce-cni (and its delegate) finish by themselves.
    tokio::time::sleep(Duration::from_secs(4)).await;
    rig.ctd.start().unwrap();
    let mut cri = rig.ctd.cri().await.unwrap();
    wait_synchronized(&rig.nri, &rig.ctd, 2);
    use_conflist(&rig, &mut cri, &conflist(&rig, Some("4Mi"))).await;
    let sandboxes = cri
        .list_pod_sandbox(cri::ListPodSandboxRequest {})
        .await
        .unwrap()
        .into_inner()
        .items;
    // containerd recorded the sandbox before networking it: it comes back
    // not ready, and the kubelet's stop/remove runs CNI DEL.
    assert!(
        sandboxes.iter().any(
            |sb| sb.metadata.as_ref().is_some_and(|m| m.name == "crash-add")
                && sb.state == cri::PodSandboxState::SandboxNotready as i32
        ),
        "the interrupted sandbox is listed not ready: {sandboxes:?}"
    );
    for sb in sandboxes {
        let id = sb.id.clone();
        let _ = cri
            .stop_pod_sandbox(cri::StopPodSandboxRequest {
                pod_sandbox_id: id.clone(),
            })
            .await;
        let _ = cri
            .remove_pod_sandbox(cri::RemovePodSandboxRequest { pod_sandbox_id: id })
            .await;
    }
    assert_node_clean(&rig, "after the kubelet's clean-up of the interrupted ADD");
    let pod = run_pod(&rig, &mut cri, "crash-add").await;
    remove_pod(&rig, &mut cri, &pod).await;
    assert_node_clean(&rig, "after a crash during ADD");
    let _ = std::fs::remove_dir_all(&rig.dir);
}
