//! The device plugin end to end on this machine, no hardware or cluster:
//! a fixture host with two ConnectX-6 Dx PFs (8 VFs each) under a temp dir,
//! the plugin serving it, and a kubelet stand-in that registers it, asks for
//! a preferred allocation of two VFs and allocates them, and a PodResources
//! stand-in that lists the pod. Prints what the pod would get, deletes the
//! pod (its device-info files go), stops everything and checks nothing is
//! left behind.
//!
//! cargo run -p kroce-device-plugin --example demo

use anyhow::{Context, bail};
use kroce_device_plugin::api;
use kroce_device_plugin::plugin::{self, Options};
use kroce_device_plugin::testing::{KubeletStandIn, PodResourcesStandIn};
use sriov_helpers::fixture::FixtureHost;
use std::path::Path;
use std::time::Duration;

const CONFIG: &str = "pools:
- resourceName: vf            # becomes rdma/vf
  memlock: unlimited
  selectors:
    vendors: [\"15b3\"]
    devices: [\"101e\"]         # ConnectX-6 Dx VF
    isRdma: true
";

fn main() -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let leftovers = rt.block_on(demo())?;
    if !leftovers.is_empty() {
        bail!("left behind: {leftovers:?}");
    }
    println!("\nEverything removed; nothing left behind.");
    Ok(())
}

fn list(dir: &Path) -> Vec<String> {
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

/// Runs the demo; returns the paths that still exist afterwards.
async fn demo() -> anyhow::Result<Vec<String>> {
    let host = FixtureHost::connectx6dx_pair().context("building the fixture host")?;
    // The first VF already has an IPv4 address: the kernel put its RoCE v2
    // GID at index 3 (after the two link-local GIDs and the v1 one); the
    // plugin reads it from the table instead of assuming it.
    host.add_ipv4_gid(
        "mlx5_1",
        2,
        std::net::Ipv4Addr::new(192, 168, 100, 10),
        "ens1f0v0",
    )
    .context("adding a GID")?;
    let work = tempfile::Builder::new().prefix("kroce-demo-").tempdir()?;
    let kubelet_dir = work.path().join("device-plugins");
    let devinfo_dir = work.path().join("devinfo");
    let config_path = work.path().join("config.yaml");
    std::fs::create_dir_all(&kubelet_dir)?;
    std::fs::write(&config_path, CONFIG)?;
    println!("Fixture host: {}", host.path().display());
    println!("Config:\n{CONFIG}");

    let kubelet = KubeletStandIn::start(&kubelet_dir).await?;
    let pod_resources_socket = work.path().join("pod-resources/kubelet.sock");
    let mut pods = PodResourcesStandIn::start(&pod_resources_socket).await?;
    let mut opts = Options::new(host.root(), config_path);
    opts.pod_resources_socket = pod_resources_socket;
    opts.allocation_grace = Duration::from_millis(200);
    opts.kubelet_dir = kubelet_dir.clone();
    opts.devinfo_dir = devinfo_dir.clone();
    opts.cdi_dir = work.path().join("cdi");
    // A fixture tree sends no kernel events: rescan as often as a node
    // without them would, so the deleted pod's files go within a second.
    opts.rescan_interval = plugin::FALLBACK_RESCAN;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let plugin = tokio::spawn(plugin::run(opts, async move {
        let _ = stopped.await;
    }));

    let wait = Duration::from_secs(5);
    let reg = kubelet
        .wait_registered("rdma/vf", 1, wait)
        .await
        .map_err(anyhow::Error::msg)?;
    println!(
        "Registered: resource {} on socket {} (API {})",
        reg.resource_name, reg.endpoint, reg.version
    );
    let devices = kubelet
        .wait_devices("rdma/vf", wait, "16 VFs", |d| d.len() == 16)
        .await
        .map_err(anyhow::Error::msg)?;
    println!("ListAndWatch: {} devices", devices.len());
    for d in &devices {
        let numa = d
            .topology
            .as_ref()
            .and_then(|t| t.nodes.first())
            .map_or("-".to_string(), |n| n.id.to_string());
        println!("  {}  {}  NUMA {numa}", d.id, d.health);
    }

    let mut client = kubelet
        .client("rdma/vf")
        .context("the stand-in has no connection to the plugin")?;
    let preferred = client
        .get_preferred_allocation(api::PreferredAllocationRequest {
            container_requests: vec![api::ContainerPreferredAllocationRequest {
                available_device_i_ds: devices.iter().map(|d| d.id.clone()).collect(),
                must_include_device_i_ds: vec![],
                allocation_size: 2,
            }],
        })
        .await?
        .into_inner();
    let chosen = preferred
        .container_responses
        .first()
        .map(|r| r.device_i_ds.clone())
        .unwrap_or_default();
    println!("\nGetPreferredAllocation(2): {chosen:?} (same NUMA node, same PF)");

    // The kubelet lists the pod with its devices (PodResources).
    let ids: Vec<&str> = chosen.iter().map(String::as_str).collect();
    pods.run_pod("demo", "rdma/vf", &ids);
    let resp = client
        .allocate(api::AllocateRequest {
            container_requests: vec![api::ContainerAllocateRequest {
                devices_ids: chosen.clone(),
            }],
        })
        .await?
        .into_inner();
    let c = resp
        .container_responses
        .first()
        .context("empty Allocate response")?;
    println!("\nAllocate({chosen:?}) — what the pod gets:");
    println!("  device specs:");
    for d in &c.devices {
        println!(
            "    {} <- {} ({})",
            d.container_path, d.host_path, d.permissions
        );
    }
    println!("  env:");
    let mut envs: Vec<_> = c.envs.iter().collect();
    envs.sort();
    for (k, v) in envs {
        println!("    {k}={v}");
    }
    println!("  annotations:");
    let mut ann: Vec<_> = c.annotations.iter().collect();
    ann.sort();
    for (k, v) in ann {
        println!("    {k}: {v}");
    }
    for id in &chosen {
        let file = devinfo_dir.join(format!("rdma-vf-{id}-device.json"));
        let text = std::fs::read_to_string(&file)
            .with_context(|| format!("reading {}", file.display()))?;
        println!("  device-info file {}:\n{text}", file.display());
    }

    // The pod is deleted: PodResources stops listing it, and the plugin
    // removes its device-info files (a running pod's would stay, also across
    // a plugin restart).
    pods.delete_pod("demo");
    let gone = async {
        while !list(&devinfo_dir).is_empty() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(wait, gone)
        .await
        .context("device-info files of the deleted pod were not removed")?;
    println!("\nPod deleted: its device-info files are gone.");

    let _ = stop.send(());
    plugin.await??;
    kubelet.stop().await;
    pods.stop().await;
    let mut left: Vec<String> = list(&kubelet_dir);
    left.extend(list(&devinfo_dir));
    let paths = [host.path().to_path_buf(), work.path().to_path_buf()];
    drop(host);
    work.close()?;
    left.extend(
        paths
            .iter()
            .filter(|p| p.exists())
            .map(|p| p.display().to_string()),
    );
    Ok(left)
}
