#![allow(clippy::unwrap_used, clippy::expect_used)]
//! A real kube `Client` over real TLS: the server is Python's `ssl`
//! (OpenSSL) with a test CA (`tests/fixtures/tls`), so the only rustls in
//! the test is the client's. Without a crypto provider chosen, building the
//! client panics ("Could not automatically determine the process-level
//! CryptoProvider"), which is what kube-apiserver 1.36 showed. Skipped, and
//! said so, when `python3` is missing.

#[allow(dead_code)]
#[path = "rig/bins.rs"]
mod rig_bins;

use rig_bins::Binaries;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tls")
}

/// The Python TLS server, killed on drop.
struct Server {
    child: Child,
    port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_server() -> Option<Server> {
    let mut child = match Command::new("python3")
        .arg(fixtures().join("server.py"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("SKIPPED: no python3 to serve TLS ({e})");
            return None;
        }
    };
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port = line.trim().parse().expect("server.py prints its port");
    Some(Server { child, port })
}

/// A kubeconfig for `https://127.0.0.1:<port>` trusting the test CA.
fn kubeconfig(dir: &Path, port: u16) -> PathBuf {
    let ca = std::fs::read_to_string(fixtures().join("ca.crt")).unwrap();
    let ca_data = base64(ca.as_bytes());
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: t\n  cluster:\n    server: https://127.0.0.1:{port}\n    certificate-authority-data: {ca_data}\nusers:\n- name: u\n  user:\n    token: kroce-test\ncontexts:\n- name: c\n  context:\n    cluster: t\n    user: u\n    namespace: default\ncurrent-context: c\n"
    );
    let path = dir.join("kubeconfig");
    std::fs::write(&path, text).unwrap();
    path
}

fn base64(data: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(A[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[tokio::test]
async fn a_real_client_from_a_kubeconfig_talks_tls_to_an_https_server() {
    let Some(server) = start_server() else { return };
    let dir = tempfile::tempdir().unwrap();
    let path = kubeconfig(dir.path(), server.port);
    let kc = kube::config::Kubeconfig::read_from(&path).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    let client = kube::Client::try_from(config).unwrap();
    let version = client.apiserver_version().await.unwrap();
    assert_eq!(version.git_version, "v1.36.0-kroce-tls-test");
}

fn bins() -> Binaries {
    Binaries::locate().unwrap_or_else(|e| panic!("{e}"))
}

fn controller() -> Command {
    Command::new(bins().controller)
}

fn node_agent() -> Command {
    Command::new(bins().node_agent)
}

/// Waits for `child` to exit, up to `limit`; kills it after that.
fn wait_exit(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if let Some(st) = child.try_wait().unwrap() {
            return Some(st);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

fn stderr_of(child: &mut Child) -> String {
    let mut s = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut s);
    }
    s
}

/// The shipped `controller` against an https:// API server without kroce's
/// CRDs: no panic, a clear error that the server answered (over TLS).
#[test]
fn the_controller_binary_reaches_an_https_api_server_without_panicking() {
    let Some(server) = start_server() else { return };
    let dir = tempfile::tempdir().unwrap();
    let path = kubeconfig(dir.path(), server.port);
    let mut child = controller()
        .args(["run", "--leader-election=false", "--listen", "127.0.0.1:0"])
        .env("KUBECONFIG", &path)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = wait_exit(&mut child, Duration::from_secs(30));
    let stderr = stderr_of(&mut child);
    assert!(!stderr.contains("panicked"), "{stderr}");
    let status = status.expect("the controller stops on the missing CRDs");
    assert_eq!(status.code(), Some(1), "{stderr}");
    // The error is the API server's 404, so the TLS request went through.
    assert!(
        stderr.contains("cannot list rdmanetworks.kroce.io") && stderr.contains("404"),
        "{stderr}"
    );
}

/// The shipped `node-agent`: reaches its steady state ("no RdmaNodeState
/// yet") over TLS, then SIGTERM (what every rollout sends) ends it with 0.
#[test]
fn the_node_agent_binary_runs_over_tls_and_exits_0_on_sigterm() {
    let Some(server) = start_server() else { return };
    let dir = tempfile::tempdir().unwrap();
    let path = kubeconfig(dir.path(), server.port);
    let host = dir.path().join("host");
    std::fs::create_dir_all(host.join("sys/class/net")).unwrap();
    std::fs::create_dir_all(host.join("proc")).unwrap();
    let mut child = node_agent()
        .args(["run", "--node-name", "n1", "--listen", "127.0.0.1:0"])
        .arg("--host-root")
        .arg(&host)
        .arg("--configfs")
        .arg(dir.path().join("configfs"))
        .env("KUBECONFIG", &path)
        .env("RUST_LOG", "info")
        .env_remove("KROCE_LOG_LEVEL")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Read stderr until the steady state shows, on a thread (it blocks).
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut all = String::new();
        let mut line = String::new();
        let mut told = false;
        while err.read_line(&mut line).unwrap_or(0) > 0 {
            all.push_str(&line);
            if !told && line.contains("no RdmaNodeState yet") {
                told = tx.send(None).is_ok();
            }
            line.clear();
        }
        let _ = tx.send(Some(all));
    });
    let first = rx.recv_timeout(Duration::from_secs(30));
    let steady = matches!(first, Ok(None));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = wait_exit(&mut child, Duration::from_secs(30));
    let stderr = match first {
        Ok(Some(all)) => all,
        _ => rx
            .recv_timeout(Duration::from_secs(5))
            .ok()
            .flatten()
            .unwrap_or_default(),
    };
    assert!(steady, "never reached its steady state:\n{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let status = status.expect("SIGTERM ends the agent");
    assert_eq!(status.code(), Some(0), "{stderr}");
}

/// `KROCE_LOG_LEVEL=debug` is debug for kroce's crates only: the
/// controller's own debug lines show, none from kube, hyper, h2, rustls.
#[test]
fn kroce_log_level_debug_is_debug_for_kroce_crates_only() {
    let Some(server) = start_server() else { return };
    let dir = tempfile::tempdir().unwrap();
    let path = kubeconfig(dir.path(), server.port);
    let out = controller()
        .args(["run", "--leader-election=false", "--listen", "127.0.0.1:0"])
        .env("KUBECONFIG", &path)
        .env("KROCE_LOG_LEVEL", "debug")
        .env_remove("RUST_LOG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let debug: Vec<&str> = stderr.lines().filter(|l| l.contains(" DEBUG ")).collect();
    assert!(
        debug
            .iter()
            .any(|l| l.contains("kroce_controller") && l.contains("log filter")),
        "no kroce debug line:\n{stderr}"
    );
    let foreign: Vec<&&str> = debug
        .iter()
        .filter(|l| !(l.contains(" kroce_") || l.contains(" sriov_helpers")))
        .collect();
    assert!(
        foreign.is_empty(),
        "debug lines of other crates:\n{foreign:#?}"
    );
}
