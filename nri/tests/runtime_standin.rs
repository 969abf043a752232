#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The plugin against a runtime stand-in that speaks the runtime side of NRI
//! (mux + ttrpc + NRI protobuf) over a unix socket in a tempdir.
//!
//! The real runtime is in `e2e/tests/containerd.rs` (containerd 2.1.9's NRI
//! drives kroce-nri there). This stand-in stays for what a real runtime does
//! not produce on demand: malformed frames and messages, a registration
//! that is never acknowledged, unknown methods, a runtime that vanishes at a
//! chosen point of the protocol, and the exact bytes of each exchange.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use kroce_nri::Memlock;
use kroce_nri::cni_requests::StateDir;
use kroce_nri::handler::Handler;
use kroce_nri::mux;
use kroce_nri::proto::{PLUGIN_SERVICE, api, envelope};
use kroce_nri::session::{self, Backoff, PluginState, SessionOptions};
use kroce_nri::testing::{FakeRuntime, PluginConn};
use kroce_nri::ttrpc::{self, Reply, code};
use prost::Message;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

const MIB: u64 = 1 << 20;
const DEFAULT: u64 = 64 * MIB;

struct Plugin {
    state: watch::Receiver<PluginState>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl Plugin {
    /// Starts the plugin's reconnect loop against `socket`.
    fn start(socket: &Path, state_dir: &Path, registration_timeout: Duration) -> Plugin {
        let _ = tracing_subscriber::fmt()
            .with_env_filter("kroce_nri=debug")
            .with_test_writer()
            .try_init();
        let options = SessionOptions::new("kroce-memlock", "50", registration_timeout)
            .unwrap()
            .with_proc_root(raising_runtime_proc(state_dir));
        let handler = Handler::new(Memlock::Bytes(DEFAULT), StateDir::new(state_dir));
        let (tx, rx) = watch::channel(PluginState::Connecting { last_error: None });
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let socket = socket.to_owned();
        let backoff = Backoff {
            initial: Duration::from_millis(20),
            max: Duration::from_millis(100),
        };
        let task = tokio::spawn(async move {
            let shutdown = async {
                let _ = stop_rx.await;
            };
            session::run(&socket, &options, backoff, &handler, &tx, shutdown).await;
        });
        Plugin {
            state: rx,
            stop: Some(stop_tx),
            task,
        }
    }

    async fn wait_state(&mut self, want: impl Fn(&PluginState) -> bool) -> PluginState {
        tokio::time::timeout(Duration::from_secs(10), self.state.wait_for(|s| want(s)))
            .await
            .expect("plugin state timeout")
            .expect("plugin state channel closed")
            .clone()
    }

    async fn stop(mut self) {
        self.stop.take().unwrap().send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("plugin did not stop")
            .unwrap();
    }
}

/// A proc root in which the peer of the NRI socket (this process: the
/// stand-in runs in it) may raise its limits, so these protocol tests see
/// limits as requested; capping has its own tests (`runtime_limits.rs`,
/// `memlock_e2e.rs`, the policy table).
fn raising_runtime_proc(dir: &Path) -> PathBuf {
    let root = dir.join("fake-proc");
    let pid_dir = root.join(std::process::id().to_string());
    std::fs::create_dir_all(&pid_dir).unwrap();
    std::fs::write(pid_dir.join("status"), "CapEff:\t000001ffffffffff\n").unwrap();
    std::fs::write(
        pid_dir.join("limits"),
        "Max locked memory         unlimited            unlimited            bytes\n",
    )
    .unwrap();
    std::fs::write(pid_dir.join("uid_map"), "0 0 4294967295\n").unwrap();
    root
}

struct Fixture {
    _dir: tempfile::TempDir,
    socket: PathBuf,
    state_dir: PathBuf,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("nri.sock");
    let state_dir = dir.path().join("cni-state");
    std::fs::create_dir_all(state_dir.join("memlock")).unwrap();
    std::fs::write(
        state_dir.join("memlock/sb-cni.json"),
        r#"{"version":1,"containerID":"sb-cni","netns":"/var/run/netns/cni-1","ifname":"net1","memlock":268435456,"network":"rdma-a"}"#,
    )
    .unwrap();
    std::fs::write(state_dir.join("memlock/sb-broken.json"), "{not json").unwrap();
    Fixture {
        _dir: dir,
        socket,
        state_dir,
    }
}

/// Accepts the plugin and drives it through registration and configuration.
async fn handshake(rt: &FakeRuntime) -> PluginConn {
    let mut conn = rt.accept().await.unwrap();
    let reg = conn.expect_register().await.unwrap();
    assert_eq!(reg.plugin_name, "kroce-memlock");
    assert_eq!(reg.plugin_idx, "50");
    let cfg = conn
        .configure(api::ConfigureRequest {
            runtime_name: "fake-runtime".into(),
            runtime_version: "1.0".into(),
            registration_timeout: 5000,
            request_timeout: 2000,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(cfg.events, 1 << (api::Event::CreateContainer as i32 - 1));
    conn
}

fn pod(id: &str) -> api::PodSandbox {
    api::PodSandbox {
        id: id.into(),
        name: format!("pod-{id}"),
        namespace: "default".into(),
        ..Default::default()
    }
}

fn container(
    id: &str,
    sandbox: &str,
    annotations: &[(&str, &str)],
    devices: &[&str],
) -> api::Container {
    api::Container {
        id: id.into(),
        pod_sandbox_id: sandbox.into(),
        name: id.into(),
        annotations: annotations
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect::<BTreeMap<_, _>>(),
        linux: Some(api::LinuxContainer {
            devices: devices
                .iter()
                .map(|p| api::LinuxDevice {
                    path: (*p).into(),
                    r#type: "c".into(),
                    major: 231,
                    minor: 192,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The RLIMIT_MEMLOCK (soft, hard) a response sets, None if it sets none.
fn memlock_of(resp: &api::CreateContainerResponse) -> Option<(u64, u64)> {
    let adjust = resp.adjust.as_ref()?;
    assert!(resp.update.is_empty() && resp.evict.is_empty());
    let rlimits: Vec<_> = adjust
        .rlimits
        .iter()
        .filter(|r| r.r#type == "RLIMIT_MEMLOCK")
        .collect();
    assert!(rlimits.len() <= 1, "{rlimits:?}");
    assert_eq!(
        adjust.rlimits.len(),
        rlimits.len(),
        "only memlock is ever set"
    );
    assert!(adjust.annotations.is_empty());
    rlimits.first().map(|r| (r.soft, r.hard))
}

async fn create(conn: &mut PluginConn, sandbox: &str, c: api::Container) -> Option<(u64, u64)> {
    let resp = conn.create_container(pod(sandbox), c).await.unwrap();
    memlock_of(&resp)
}

#[tokio::test]
async fn registers_synchronizes_and_adjusts_only_rdma_containers() {
    let fx = fixture();
    let rt = FakeRuntime::bind(&fx.socket).unwrap();
    let mut plugin = Plugin::start(&fx.socket, &fx.state_dir, Duration::from_secs(5));
    let mut conn = handshake(&rt).await;
    let state = plugin
        .wait_state(|s| matches!(s, PluginState::Configured { .. }))
        .await;
    assert_eq!(
        state,
        PluginState::Configured {
            runtime_name: "fake-runtime".into(),
            runtime_version: "1.0".into()
        }
    );

    // A split sync: the plugin must echo `more`, then finish.
    let first = conn
        .synchronize(api::SynchronizeRequest {
            pods: vec![pod("sb-old")],
            containers: vec![container(
                "old",
                "sb-old",
                &[],
                &["/dev/infiniband/uverbs0"],
            )],
            more: true,
        })
        .await
        .unwrap();
    assert!(first.more && first.update.is_empty());
    let last = conn
        .synchronize(api::SynchronizeRequest {
            more: false,
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(!last.more && last.update.is_empty());

    // Device-plugin annotation, no memlock asked: the default.
    let got = create(
        &mut conn,
        "sb-1",
        container(
            "annotated",
            "sb-1",
            &[("kroce.io/rdma-devices.rdma_vf", "0000:3b:00.2")],
            &[],
        ),
    )
    .await;
    assert_eq!(got, Some((DEFAULT, DEFAULT)));

    // Annotation asking for more than the default: the larger wins.
    let got = create(
        &mut conn,
        "sb-1",
        container(
            "annotated-1g",
            "sb-1",
            &[
                ("kroce.io/rdma-devices.rdma_vf", "0000:3b:00.2,0000:3b:00.3"),
                ("kroce.io/memlock.rdma_vf", "1073741824"),
            ],
            &[],
        ),
    )
    .await;
    assert_eq!(got, Some((1 << 30, 1 << 30)));

    // "unlimited" is RLIM_INFINITY = u64::MAX, as runc expects.
    let got = create(
        &mut conn,
        "sb-1",
        container(
            "annotated-unlimited",
            "sb-1",
            &[
                ("kroce.io/rdma-devices.rdma_vf", "0000:3b:00.2"),
                ("kroce.io/memlock.rdma_vf", "unlimited"),
            ],
            &[],
        ),
    )
    .await;
    assert_eq!(got, Some((u64::MAX, u64::MAX)));

    // /dev/infiniband device nodes alone.
    let got = create(
        &mut conn,
        "sb-2",
        container(
            "devnodes",
            "sb-2",
            &[],
            &["/dev/infiniband/uverbs3", "/dev/infiniband/rdma_cm"],
        ),
    )
    .await;
    assert_eq!(got, Some((DEFAULT, DEFAULT)));

    // A sandbox kroce-cni recorded 256 MiB for: every container of it, larger than the default.
    let got = create(
        &mut conn,
        "sb-cni",
        container("cni-app", "sb-cni", &[], &[]),
    )
    .await;
    assert_eq!(got, Some((256 * MIB, 256 * MIB)));
    let got = create(
        &mut conn,
        "sb-cni",
        container("cni-sidecar", "sb-cni", &[], &[]),
    )
    .await;
    assert_eq!(got, Some((256 * MIB, 256 * MIB)));

    // Nothing RDMA about it: never touched.
    let got = create(
        &mut conn,
        "sb-3",
        container("plain", "sb-3", &[("app", "web")], &["/dev/fuse"]),
    )
    .await;
    assert_eq!(got, None);

    // A broken request file is skipped (logged), not fatal: plain container untouched,
    // an RDMA container of that sandbox still gets the default.
    let got = create(
        &mut conn,
        "sb-broken",
        container("b1", "sb-broken", &[], &[]),
    )
    .await;
    assert_eq!(got, None);
    let got = create(
        &mut conn,
        "sb-broken",
        container("b2", "sb-broken", &[], &["/dev/infiniband/uverbs1"]),
    )
    .await;
    assert_eq!(got, Some((DEFAULT, DEFAULT)));

    // A container ID that would be a path never reaches the file system; still answered.
    let got = create(
        &mut conn,
        "../../etc",
        container("evil", "../../etc", &[], &[]),
    )
    .await;
    assert_eq!(got, None);

    conn.shutdown().await.unwrap();
    assert!(conn.unconsumed().is_empty(), "{:?}", conn.unconsumed());
    plugin.stop().await;
}

#[tokio::test]
async fn reconnects_after_the_runtime_restarts() {
    let fx = fixture();
    let rt = FakeRuntime::bind(&fx.socket).unwrap();
    let mut plugin = Plugin::start(&fx.socket, &fx.state_dir, Duration::from_secs(5));
    let conn = handshake(&rt).await;
    plugin
        .wait_state(|s| matches!(s, PluginState::Configured { .. }))
        .await;

    // The runtime goes away (connection and socket).
    drop(conn);
    drop(rt);
    std::fs::remove_file(&fx.socket).unwrap();
    let state = plugin
        .wait_state(|s| {
            matches!(s, PluginState::Connecting { last_error: Some(e) } if e.contains("connecting to NRI socket"))
        })
        .await;
    println!("while the runtime is down: {state:?}");

    // It comes back on the same path: the plugin registers again and serves.
    let rt = FakeRuntime::bind(&fx.socket).unwrap();
    let mut conn = handshake(&rt).await;
    plugin
        .wait_state(|s| matches!(s, PluginState::Configured { .. }))
        .await;
    let got = create(
        &mut conn,
        "sb-1",
        container("after-restart", "sb-1", &[], &["/dev/infiniband/uverbs0"]),
    )
    .await;
    assert_eq!(got, Some((DEFAULT, DEFAULT)));
    plugin.stop().await;
}

#[tokio::test]
async fn rejected_or_unanswered_registration_is_retried() {
    let fx = fixture();
    let rt = FakeRuntime::bind(&fx.socket).unwrap();
    let mut plugin = Plugin::start(&fx.socket, &fx.state_dir, Duration::from_millis(300));

    // 1. The runtime refuses the registration.
    let mut conn = rt.accept().await.unwrap();
    let (stream_id, req) = conn.expect_request().await.unwrap();
    assert_eq!(req.method, "RegisterPlugin");
    conn.reply_runtime(
        stream_id,
        &Reply::error(code::INVALID_ARGUMENT, "invalid plugin index"),
    )
    .await
    .unwrap();
    conn.expect_closed().await.unwrap();
    let state = plugin
        .wait_state(|s| matches!(s, PluginState::Connecting { last_error: Some(e) } if e.contains("rejected")))
        .await;
    assert!(
        format!("{state:?}").contains("invalid plugin index"),
        "{state:?}"
    );

    // 2. The runtime never answers: the plugin gives up after the timeout and reconnects.
    let mut conn = rt.accept().await.unwrap();
    let (_, req) = conn.expect_request().await.unwrap();
    assert_eq!(req.method, "RegisterPlugin");
    conn.expect_closed().await.unwrap();

    // 3. Third time lucky.
    let mut conn = handshake(&rt).await;
    let got = create(&mut conn, "sb-cni", container("c", "sb-cni", &[], &[])).await;
    assert_eq!(got, Some((256 * MIB, 256 * MIB)));
    plugin.stop().await;
}

#[tokio::test]
async fn malformed_messages_do_not_stop_the_plugin() {
    let fx = fixture();
    let rt = FakeRuntime::bind(&fx.socket).unwrap();
    let plugin = Plugin::start(&fx.socket, &fx.state_dir, Duration::from_secs(5));
    let mut conn = handshake(&rt).await;

    // ttrpc Request whose envelope is not protobuf: an InvalidArgument reply on its stream.
    let id = conn.next_stream_id();
    conn.send_plugin_frame(
        &ttrpc::encode_frame(id, ttrpc::TYPE_REQUEST, 0, &[0xff, 0xff, 0xff]).unwrap(),
    )
    .await
    .unwrap();
    match conn.expect_response(id).await.unwrap() {
        Reply::Err { code, message } => {
            assert_eq!(code, code::INVALID_ARGUMENT);
            assert!(message.contains("undecodable"), "{message}");
        }
        other => panic!("expected an error, got {other:?}"),
    }

    // Good envelope, garbage CreateContainer payload: never fail the container; empty adjustment.
    let reply = conn
        .call("CreateContainer", vec![0xff, 0xff, 0xff])
        .await
        .unwrap();
    let Reply::Ok(payload) = reply else {
        panic!("CreateContainer must not fail: {reply:?}")
    };
    let resp = api::CreateContainerResponse::decode(payload.as_slice()).unwrap();
    assert_eq!(memlock_of(&resp), None);

    // Unknown method, unknown service: Unimplemented.
    let reply = conn.call("NoSuchMethod", vec![]).await.unwrap();
    assert!(
        matches!(
            reply,
            Reply::Err {
                code: code::UNIMPLEMENTED,
                ..
            }
        ),
        "{reply:?}"
    );
    let id = conn.next_stream_id();
    let request = envelope::Request {
        service: "some.Other".into(),
        method: "CreateContainer".into(),
        ..Default::default()
    };
    conn.send_plugin_frame(
        &ttrpc::encode_frame(id, ttrpc::TYPE_REQUEST, 0, &request.encode_to_vec()).unwrap(),
    )
    .await
    .unwrap();
    assert!(matches!(
        conn.expect_response(id).await.unwrap(),
        Reply::Err {
            code: code::UNIMPLEMENTED,
            ..
        }
    ));

    // Frames nobody should send: Data on a unary stream, an unknown type, an unknown mux conn.
    let id = conn.next_stream_id();
    conn.send_plugin_frame(&ttrpc::encode_frame(id, ttrpc::TYPE_DATA, 1, b"data").unwrap())
        .await
        .unwrap();
    conn.send_plugin_frame(&ttrpc::encode_frame(id, 0x7f, 0, b"??").unwrap())
        .await
        .unwrap();
    conn.send_raw(&mux::encode(9, b"to nobody")).await.unwrap();

    // A ttrpc message over 4 MiB: ResourceExhausted, its bytes skipped, stream stays in sync.
    let id = conn.next_stream_id();
    let len = ttrpc::MAX_DATA_LEN + 1;
    let header = ttrpc::Header {
        length: len as u32,
        stream_id: id,
        kind: ttrpc::TYPE_REQUEST,
        flags: 0,
    };
    let mut oversized = header.encode().to_vec();
    oversized.extend(std::iter::repeat_n(0u8, len));
    conn.send_plugin_frame(&oversized).await.unwrap();
    assert!(matches!(
        conn.expect_response(id).await.unwrap(),
        Reply::Err {
            code: code::RESOURCE_EXHAUSTED,
            ..
        }
    ));

    // A request split over many small mux frames, as Go's bufio may write it.
    let id = conn.next_stream_id();
    let request = api::CreateContainerRequest {
        pod: Some(pod("sb-1")),
        container: Some(container(
            "split",
            "sb-1",
            &[],
            &["/dev/infiniband/uverbs2"],
        )),
    };
    let frame = ttrpc::encode_request(
        id,
        PLUGIN_SERVICE,
        "CreateContainer",
        request.encode_to_vec(),
    )
    .unwrap();
    for chunk in frame.chunks(7) {
        conn.send_raw(&mux::encode(mux::PLUGIN_SERVICE_CONN, chunk))
            .await
            .unwrap();
    }
    let Reply::Ok(payload) = conn.expect_response(id).await.unwrap() else {
        panic!("split request failed")
    };
    let resp = api::CreateContainerResponse::decode(payload.as_slice()).unwrap();
    assert_eq!(memlock_of(&resp), Some((DEFAULT, DEFAULT)));

    // Still the same connection, still serving.
    let got = create(
        &mut conn,
        "sb-1",
        container(
            "after-garbage",
            "sb-1",
            &[("kroce.io/rdma-devices.rdma_vf", "x")],
            &[],
        ),
    )
    .await;
    assert_eq!(got, Some((DEFAULT, DEFAULT)));
    assert!(
        conn.unconsumed().is_empty(),
        "no reply to Data/unknown frames: {:?}",
        conn.unconsumed()
    );

    // A trunk that cannot be parsed (mux length far over the maximum): the plugin
    // drops this connection and comes back with a fresh registration.
    conn.send_raw(&[0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff])
        .await
        .unwrap();
    conn.expect_closed().await.unwrap();
    let mut conn = handshake(&rt).await;
    let got = create(
        &mut conn,
        "sb-1",
        container("after-reconnect", "sb-1", &[], &["/dev/infiniband/uverbs0"]),
    )
    .await;
    assert_eq!(got, Some((DEFAULT, DEFAULT)));
    plugin.stop().await;
}

/// Start-up (as `kroce-nri` runs it): the first connection the runtime sees is
/// the registration — no probe connection that registers nothing, which
/// containerd logs as an error on every start — and the registration carries
/// the plugin's version (else containerd logs "NRI version unknown").
#[tokio::test]
async fn start_up_makes_no_probe_connection_and_registers_with_a_version() {
    let fx = fixture();
    let rt = FakeRuntime::bind(&fx.socket).unwrap();
    let options = SessionOptions::new("kroce-memlock", "50", Duration::from_secs(5))
        .unwrap()
        .with_proc_root(raising_runtime_proc(&fx.state_dir));
    let handler = Handler::new(Memlock::Bytes(DEFAULT), StateDir::new(&fx.state_dir));
    let (state, mut rx) = watch::channel(PluginState::Connecting { last_error: None });
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let socket = fx.socket.clone();
    let task = tokio::spawn(async move {
        let shutdown = async {
            let _ = stop_rx.await;
        };
        session::start(
            &socket,
            &options,
            Backoff::default(),
            &handler,
            &state,
            shutdown,
        )
        .await;
    });

    let mut conn = rt.accept().await.unwrap();
    let reg = conn
        .expect_register()
        .await
        .expect("the first connection must be the registration, not a probe");
    assert_eq!(reg.plugin_name, "kroce-memlock");
    assert_eq!(
        reg.nri_version,
        session::NRI_VERSION,
        "the registration names the plugin's version"
    );
    assert!(
        reg.nri_version.starts_with("kroce-nri/") && reg.nri_version.len() > "kroce-nri/".len(),
        "{:?}",
        reg.nri_version
    );
    conn.configure(api::ConfigureRequest::default())
        .await
        .unwrap();
    tokio::time::timeout(
        Duration::from_secs(10),
        rx.wait_for(|s| matches!(s, PluginState::Configured { .. })),
    )
    .await
    .unwrap()
    .unwrap();
    // No second connection follows either.
    let extra = rt.accept_within(Duration::from_millis(300)).await;
    assert!(
        matches!(extra, Err(kroce_nri::testing::FakeError::Timeout(_))),
        "unexpected extra connection: {extra:?}"
    );

    stop_tx.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .unwrap()
        .unwrap();
}
