//! Registration as the real kubelet does it, on the wire: its plugin watcher
//! dials the registration socket with the bare path as the gRPC target, so
//! grpc-go sends the percent-encoded path as `:authority`, which h2 alone
//! refuses (RST_STREAM PROTOCOL_ERROR; issue 24 item 1).
//!
//! Two clients: hand-written HTTP/2 frames (always run), and the real
//! grpc-go (`tests/go/kroce-kubelet-grpc`, built in GOPATH mode: needs
//! `KROCE_GOROOT` and `KROCE_GRPC_GOPATH`, Debian's golang-google-grpc-dev
//! closure; skipped without them except in CI).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use kroce_dra::api::registration;
use kroce_dra::driver::{self, DRIVER_NAME};
use kroce_dra::testing::PluginRig;
use kroce_kubelet_uds::grpc_uds::frames::raw_grpc_calls;
use prost::Message;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const NODE: &str = "node-a";

fn percent_encoded(p: &Path) -> Vec<u8> {
    p.to_string_lossy().replace('/', "%2F").into_bytes()
}

#[tokio::test]
async fn kubelet_sequence_with_the_percent_encoded_socket_path_as_authority() {
    let rig = PluginRig::new(NODE).unwrap();
    let plugin = rig.plugin().await.unwrap();
    let reg = driver::registration_socket(&rig.opts.kubelet_dir);
    let status = registration::RegistrationStatus {
        plugin_registered: true,
        error: String::new(),
    };
    let calls = [
        ("/pluginregistration.Registration/GetInfo", Vec::new()),
        (
            "/pluginregistration.Registration/NotifyRegistrationStatus",
            status.encode_to_vec(),
        ),
    ];
    let res = tokio::time::timeout(
        Duration::from_secs(10),
        raw_grpc_calls(&reg, &percent_encoded(&reg), &calls),
    )
    .await
    .unwrap()
    .unwrap();
    for r in &res {
        assert_eq!(r.reset, None, "stream reset: {r:?}");
        assert_eq!(r.grpc_status().as_deref(), Some("0"), "{r:?}");
    }
    let info = registration::PluginInfo::decode(res[0].message().unwrap()).unwrap();
    assert_eq!(info.name, DRIVER_NAME);
    assert_eq!(info.r#type, "DRAPlugin");
    let mut st = plugin.registration.clone();
    let s = tokio::time::timeout(Duration::from_secs(5), st.wait_for(|s| s.registered))
        .await
        .unwrap()
        .unwrap()
        .clone();
    assert_eq!((s.registered, s.notifications), (true, 1));
    plugin.stop().await;
}

/// Builds the grpc-go driver; `Err` says what is missing.
fn build_driver(out_dir: &Path) -> Result<PathBuf, String> {
    let goroot = std::env::var_os("KROCE_GOROOT").ok_or("KROCE_GOROOT is not set")?;
    let gopath = std::env::var_os("KROCE_GRPC_GOPATH").ok_or("KROCE_GRPC_GOPATH is not set")?;
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/go/kroce-kubelet-grpc/main.go");
    let exe = out_dir.join("kroce-kubelet-grpc");
    let out = Command::new(Path::new(&goroot).join("bin/go"))
        .args(["build", "-o"])
        .arg(&exe)
        .arg(&src)
        .env("GOROOT", &goroot)
        .env("GOPATH", &gopath)
        .env("GO111MODULE", "off")
        .env("GOFLAGS", "")
        .env("GOTOOLCHAIN", "local")
        .env("GOPROXY", "off")
        .env("GOCACHE", std::env::temp_dir().join("kroce-gocache"))
        .output()
        .map_err(|e| format!("go build: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "go build {}: {}",
            src.display(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(exe)
}

/// The driver, or `None` (printed why) when Go or grpc-go are not there.
async fn driver_or_skip(test: &str, dir: &Path) -> Option<PathBuf> {
    let dir = dir.to_path_buf();
    match tokio::task::spawn_blocking(move || build_driver(&dir))
        .await
        .unwrap()
    {
        Ok(d) => Some(d),
        Err(why) if std::env::var_os("CI").is_some() => panic!("{test}: CI must run it: {why}"),
        Err(why) => {
            println!("skipped: {test}: {why}");
            None
        }
    }
}

async fn run_driver(driver: &Path, mode: &str, socket: &Path) -> std::process::Output {
    let (driver, mode, socket) = (driver.to_path_buf(), mode.to_string(), socket.to_path_buf());
    tokio::task::spawn_blocking(move || Command::new(&driver).arg(mode).arg(&socket).output())
        .await
        .unwrap()
        .unwrap()
}

#[tokio::test]
async fn real_grpc_go_registers_like_the_kubelet() {
    let scratch = tempfile::tempdir().unwrap();
    let Some(driver) =
        driver_or_skip("real_grpc_go_registers_like_the_kubelet", scratch.path()).await
    else {
        return;
    };
    let rig = PluginRig::new(NODE).unwrap();
    let plugin = rig.plugin().await.unwrap();
    let reg = driver::registration_socket(&rig.opts.kubelet_dir);
    let out = run_driver(&driver, "register", &reg).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "grpc-go: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let service = driver::service_socket(&rig.opts.kubelet_dir);
    assert_eq!(
        stdout,
        format!(
            "type=DRAPlugin name={DRIVER_NAME} endpoint={} versions=v1.DRAPlugin\nnotified\n",
            service.display()
        )
    );
    let mut st = plugin.registration.clone();
    let s = tokio::time::timeout(Duration::from_secs(5), st.wait_for(|s| s.registered))
        .await
        .unwrap()
        .unwrap()
        .clone();
    assert!(s.registered);
    plugin.stop().await;
}

/// The device plugin's own socket, dialed the same way (the kubelet itself
/// uses `localhost` there, but nothing of kroce's may depend on it).
#[tokio::test]
async fn real_grpc_go_reaches_the_device_plugin_by_socket_path() {
    use kroce_device_plugin::pool_server::PoolTask;
    use kroce_device_plugin::resource_name::ResourceName;
    use kroce_device_plugin::shared::Shared;
    use kroce_device_plugin::snapshot::Snapshot;
    use std::sync::Arc;
    use tokio::sync::watch;

    let scratch = tempfile::tempdir().unwrap();
    let Some(driver) = driver_or_skip(
        "real_grpc_go_reaches_the_device_plugin_by_socket_path",
        scratch.path(),
    )
    .await
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (_snap_tx, snap_rx) = watch::channel(Arc::new(Snapshot::default()));
    let (_events_tx, events_rx) = watch::channel(0u64);
    let (stop_tx, stop_rx) = watch::channel(false);
    let resource = ResourceName::parse("rdma/vf").unwrap();
    let socket = dir.path().join(resource.socket_name());
    let task = PoolTask {
        resource,
        shared: Arc::new(Shared::new(snap_rx, false, dir.path().join("devinfo"))),
        kubelet_dir: dir.path().to_path_buf(),
        kubelet_events: events_rx,
        stop: stop_rx,
    };
    let run = tokio::spawn(task.run());
    for _ in 0..250 {
        if socket.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let out = run_driver(&driver, "deviceplugin", &socket).await;
    assert!(
        out.status.success(),
        "grpc-go: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "options ok\n");
    stop_tx.send(true).unwrap();
    run.await.unwrap();
}
