//! containerd 2.x as a kubelet meets it: CRI over its socket, its embedded
//! libcni calling the CNI plugins of a bin dir with the first conflist of a
//! conf dir, NRI plugins on its NRI socket, runc with cgroupfs.
//!
//! `restrict_oom_score_adj = true`: root here lacks CAP_SYS_RESOURCE, so
//! runc could not write the sandbox's oom_score_adj otherwise. Native
//! snapshotter: works on any filesystem.

use super::image;
use super::{Peers, RUNC};
use kroce_e2e::cri::runtime_service_client::RuntimeServiceClient;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use std::collections::BTreeSet;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tonic::transport::Channel;

#[derive(Debug)]
pub struct Containerd {
    pub dir: PathBuf,
    pub socket: PathBuf,
    pub nri_socket: PathBuf,
    pub cni_bin: PathBuf,
    pub cni_conf: PathBuf,
    pub log: PathBuf,
    /// Extra environment for containerd, which it passes on to the CNI
    /// plugins it runs (kroce-cni's `KROCE_CNI_*` roots).
    pub env: Vec<(String, String)>,
    bin: PathBuf,
    netns: PathBuf,
    child: Option<Child>,
    /// Pod netns (`/run/netns/cni-*`) that existed before: the others are
    /// containerd's for this test and go with it, even after a failure.
    pod_netns_before: BTreeSet<String>,
}

/// containerd's pod network namespaces (`cni-<uuid>` under /run/netns).
fn pod_netns() -> BTreeSet<String> {
    fs::read_dir("/run/netns")
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().to_str().map(str::to_owned))
                .filter(|n| n.starts_with("cni-"))
                .collect()
        })
        .unwrap_or_default()
}

fn config(dir: &Path, cni_bin: &Path, cni_conf: &Path, nri_socket: &Path) -> String {
    let d = dir.display();
    format!(
        r#"version = 3
root = "{d}/root"
state = "{d}/state"
[grpc]
  address = "{d}/containerd.sock"
[ttrpc]
  address = "{d}/containerd.sock.ttrpc"
[plugins."io.containerd.cri.v1.runtime"]
  restrict_oom_score_adj = true
  enable_cdi = true
  cdi_spec_dirs = ["{d}/cdi"]
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "{RUNC}"
[plugins."io.containerd.cri.v1.runtime".cni]
  bin_dirs = ["{cni_bin}"]
  conf_dir = "{cni_conf}"
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "native"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{image}"
[plugins."io.containerd.nri.v1.nri"]
  disable = false
  socket_path = "{nri}"
  plugin_path = "{d}/nri-plugins"
  plugin_config_path = "{d}/nri-conf"
"#,
        cni_bin = cni_bin.display(),
        cni_conf = cni_conf.display(),
        nri = nri_socket.display(),
        image = image::IMAGE,
    )
}

impl Containerd {
    /// Lays out `dir` (config, CNI bin and conf dirs) without starting.
    pub fn prepare(peers: &Peers, dir: &Path, netns: &Path) -> io::Result<Containerd> {
        let cni_bin = dir.join("cni-bin");
        let cni_conf = dir.join("cni-conf");
        let nri_socket = dir.join("nri.sock");
        for d in [&cni_bin, &cni_conf, &dir.join("cdi")] {
            fs::create_dir_all(d)?;
        }
        fs::write(
            dir.join("config.toml"),
            config(dir, &cni_bin, &cni_conf, &nri_socket),
        )?;
        Ok(Containerd {
            dir: dir.to_path_buf(),
            socket: dir.join("containerd.sock"),
            nri_socket,
            cni_bin,
            cni_conf,
            log: dir.join("containerd.log"),
            env: Vec::new(),
            bin: peers.containerd_bin.clone(),
            netns: netns.to_path_buf(),
            child: None,
            pod_netns_before: pod_netns(),
        })
    }

    /// Starts containerd (log appended) and waits for its CRI socket.
    pub fn start(&mut self) -> Result<(), String> {
        let out = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|e| format!("{}: {e}", self.log.display()))?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let path = format!("{}:/usr/sbin:/usr/bin:/sbin:/bin", self.bin.display());
        let mut cmd = Command::new(self.bin.join("containerd"));
        cmd.arg("--config")
            .arg(self.dir.join("config.toml"))
            .env("PATH", path)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err));
        let child = crate::rig_process::spawn_in_netns(&self.netns, &mut cmd)
            .map_err(|e| format!("start containerd: {e}"))?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if self.socket.exists() {
                return Ok(());
            }
            if let Some(c) = self.child.as_mut()
                && let Ok(Some(status)) = c.try_wait()
            {
                return Err(format!("containerd exited {status}:\n{}", self.log_tail()));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(format!(
            "containerd socket never appeared:\n{}",
            self.log_tail()
        ))
    }

    /// SIGKILL, as a crash would (the shims live on, as they do then).
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = fs::remove_file(&self.socket);
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// `ctr -n k8s.io images import <archive>`.
    pub fn import(&self, archive: &Path) -> Result<(), String> {
        let out = Command::new(self.bin.join("ctr"))
            .arg("--address")
            .arg(&self.socket)
            .args(["-n", "k8s.io", "images", "import"])
            .arg(archive)
            .output()
            .map_err(|e| format!("ctr: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "ctr images import: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }

    pub async fn cri(&self) -> Result<RuntimeServiceClient<Channel>, String> {
        kroce_device_plugin::uds::connect(&self.socket)
            .await
            .map(RuntimeServiceClient::new)
            .map_err(|e| e.to_string())
    }

    /// The last 60 lines of containerd's log, for failure messages.
    pub fn log_tail(&self) -> String {
        let text = fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(60)..].join("\n")
    }
}

/// Every process whose command line names `dir` (containerd, its shims and
/// their containers' runc): what must go when the test ends, pass or fail.
fn processes_under(dir: &Path) -> Vec<i32> {
    let needle = dir.to_string_lossy().into_owned();
    let me = std::process::id() as i32;
    let Ok(rd) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| *pid != me)
        .filter(|pid| {
            fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains(&needle))
                .unwrap_or(false)
        })
        .collect()
}

impl Drop for Containerd {
    fn drop(&mut self) {
        self.kill9();
        // Shims outlive containerd by design; their containers die with them.
        for pid in processes_under(&self.dir) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(200));
        // Rootfs and sandbox mounts left by a test that failed half-way.
        let mounts = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let mut points: Vec<&str> = mounts
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .filter(|p| p.starts_with(&*self.dir.to_string_lossy()))
            .collect();
        points.sort_by_key(|p| std::cmp::Reverse(p.len()));
        for p in points {
            let _ = Command::new("umount").args(["-l", p]).status();
        }
        for ns in pod_netns().difference(&self.pod_netns_before) {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}
