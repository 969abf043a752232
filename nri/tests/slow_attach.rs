#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Issue 21: a slow DRA attach at RunPodSandbox never holds up another
//! container's CreateContainer (memlock) answer, and an attach past its
//! deadline fails only its own sandbox, before the runtime's NRI request
//! timeout, and is rolled back when it completes: nothing leaks.
//!
//! The plugin runs as `kroce-nri` runs it: on its own current-thread
//! runtime (its own thread here, as the runtime is another process).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kroce_nri::Memlock;
use kroce_nri::cni_requests::StateDir;
use kroce_nri::handler::Handler;
use kroce_nri::network::{AttachError, PodFacts, PodNetworkHook, ReleaseFailure};
use kroce_nri::proto::{PLUGIN_SERVICE, api};
use kroce_nri::session::{self, Backoff, PluginState, SessionOptions};
use kroce_nri::testing::{FakeRuntime, PluginConn};
use kroce_nri::ttrpc::{self, Reply, code};
use prost::Message;
use tokio::sync::{oneshot, watch};

/// The slow attach: longer than the deadline, shorter than the test.
const SLOW: Duration = Duration::from_millis(1500);
const DEADLINE: Duration = Duration::from_millis(400);

/// Attaches one VF per sandbox, slowly for `sb-slow`; records what is attached.
#[derive(Debug, Default)]
struct Recorder {
    attached: Mutex<Vec<String>>,
    /// Every release, in order (a sandbox may be released twice).
    released: Mutex<Vec<String>>,
}

#[derive(Debug)]
struct SlowHook(Arc<Recorder>);

impl PodNetworkHook for SlowHook {
    fn attach(&self, pod: &PodFacts) -> Result<usize, AttachError> {
        if pod.sandbox_id == "sb-slow" {
            std::thread::sleep(SLOW);
        }
        self.0.attached.lock().unwrap().push(pod.sandbox_id.clone());
        Ok(1)
    }

    fn release(&self, pod: &PodFacts) -> Vec<ReleaseFailure> {
        self.0.released.lock().unwrap().push(pod.sandbox_id.clone());
        self.0
            .attached
            .lock()
            .unwrap()
            .retain(|s| *s != pod.sandbox_id);
        Vec::new()
    }
}

fn pod(id: &str) -> api::PodSandbox {
    api::PodSandbox {
        id: id.into(),
        name: format!("pod-{id}"),
        namespace: "default".into(),
        ..Default::default()
    }
}

/// Sends a Plugin-service request without waiting for its answer.
async fn send(conn: &mut PluginConn, method: &str, payload: Vec<u8>) -> u32 {
    let id = conn.next_stream_id();
    let frame = ttrpc::encode_request(id, PLUGIN_SERVICE, method, payload).unwrap();
    conn.send_plugin_frame(&frame).await.unwrap();
    id
}

fn run_pod_sandbox(id: &str) -> Vec<u8> {
    api::RunPodSandboxRequest { pod: Some(pod(id)) }.encode_to_vec()
}

/// The plugin as `kroce-nri` runs it, with the slow hook, connected to a
/// runtime stand-in that has configured it (2 s request timeout).
async fn start_plugin() -> (
    tempfile::TempDir,
    Arc<Recorder>,
    PluginConn,
    oneshot::Sender<()>,
    std::thread::JoinHandle<()>,
) {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("nri.sock");
    let rt = FakeRuntime::bind(&socket).unwrap();
    let recorder = Arc::new(Recorder::default());
    let handler = Handler::new(Memlock::Unlimited, StateDir::new(dir.path().join("state")))
        .with_network(Box::new(SlowHook(recorder.clone())));
    let options = SessionOptions::new("kroce-memlock", "50", Duration::from_secs(5))
        .unwrap()
        .with_proc_root(dir.path().join("no-proc"))
        .with_attach_deadline(DEADLINE);
    let (state, _) = watch::channel(PluginState::Connecting { last_error: None });
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let backoff = Backoff {
        initial: Duration::from_millis(20),
        max: Duration::from_millis(100),
    };
    let plugin = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let shutdown = async {
                let _ = stop_rx.await;
            };
            session::run(&socket, &options, backoff, &handler, &state, shutdown).await;
        });
    });

    let mut conn = rt.accept().await.unwrap();
    conn.expect_register().await.unwrap();
    conn.configure(api::ConfigureRequest {
        runtime_name: "fake-runtime".into(),
        runtime_version: "1.0".into(),
        registration_timeout: 5000,
        request_timeout: 2000,
        ..Default::default()
    })
    .await
    .unwrap();

    (dir, recorder, conn, stop_tx, plugin)
}

#[tokio::test(flavor = "current_thread")]
async fn a_slow_attach_holds_up_no_memlock_answer_and_fails_only_its_sandbox() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("kroce_nri=debug")
        .with_test_writer()
        .try_init();
    let (_dir, recorder, mut conn, stop_tx, plugin) = start_plugin().await;

    // The slow sandbox's attach starts; another pod's RDMA container is
    // created meanwhile: its memlock answer must not wait for the attach.
    let t0 = Instant::now();
    let slow = send(&mut conn, "RunPodSandbox", run_pod_sandbox("sb-slow")).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let asked = Instant::now();
    let created = conn
        .create_container(
            pod("sb-other"),
            api::Container {
                id: "c1".into(),
                pod_sandbox_id: "sb-other".into(),
                name: "c1".into(),
                annotations: BTreeMap::from([(
                    "kroce.io/rdma-devices.rdma_vf".to_owned(),
                    "0000:3b:00.2".to_owned(),
                )]),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let memlock_after = asked.elapsed();
    let rlimit = created
        .adjust
        .as_ref()
        .and_then(|a| a.rlimits.iter().find(|r| r.r#type == "RLIMIT_MEMLOCK"))
        .expect("memlock set");
    assert_eq!(rlimit.soft, u64::MAX);
    assert!(
        memlock_after < Duration::from_millis(300),
        "the memlock answer waited {memlock_after:?} behind an attach"
    );
    // A fast sandbox attaches meanwhile, in parallel.
    let fast = send(&mut conn, "RunPodSandbox", run_pod_sandbox("sb-fast")).await;
    assert_eq!(
        conn.expect_response(fast).await.unwrap(),
        Reply::Ok(Vec::new())
    );

    // The slow one fails at its deadline, well before the runtime's 2 s.
    let reply = conn.expect_response(slow).await.unwrap();
    let answered = t0.elapsed();
    match &reply {
        Reply::Err { code: c, message } => {
            assert_eq!(*c, code::DEADLINE_EXCEEDED, "{message}");
            assert!(
                message.contains("sb-slow") && message.contains("did not finish within"),
                "{message}"
            );
        }
        other => panic!("the slow attach was answered {other:?}"),
    }
    assert!(
        answered >= DEADLINE && answered < Duration::from_millis(1200),
        "answered after {answered:?}"
    );
    assert_eq!(*recorder.attached.lock().unwrap(), ["sb-fast"]);

    // When the slow attach completes, it is rolled back: nothing is left
    // attached to a sandbox the runtime failed.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let attached = recorder.attached.lock().unwrap().clone();
        if t0.elapsed() > SLOW + Duration::from_millis(200) {
            assert_eq!(attached, ["sb-fast"], "the late attach was not rolled back");
            break;
        }
        assert!(Instant::now() < deadline);
    }
    // Its release (the runtime cleaning up) is still answered.
    let stop = send(
        &mut conn,
        "StopPodSandbox",
        api::StopPodSandboxRequest {
            pod: Some(pod("sb-slow")),
        }
        .encode_to_vec(),
    )
    .await;
    assert_eq!(
        conn.expect_response(stop).await.unwrap(),
        Reply::Ok(Vec::new())
    );

    stop_tx.send(()).unwrap();
    tokio::task::spawn_blocking(move || plugin.join())
        .await
        .unwrap()
        .unwrap();
}

/// containerd holds one lock over every NRI call on the node while it waits
/// for a plugin's answer: the release of a sandbox whose attach missed its
/// deadline (the runtime cleaning up the sandbox it failed) must not wait
/// for that attach too, or every other pod's start stalls a second
/// deadline. It is answered at once and runs after the late attach.
#[tokio::test(flavor = "current_thread")]
async fn the_release_of_a_late_sandbox_is_answered_at_once_and_runs_after_the_attach() {
    let (_dir, recorder, mut conn, stop_tx, plugin) = start_plugin().await;
    let t0 = Instant::now();
    let slow = send(&mut conn, "RunPodSandbox", run_pod_sandbox("sb-slow")).await;
    let reply = conn.expect_response(slow).await.unwrap();
    assert!(
        matches!(&reply, Reply::Err { code: c, .. } if *c == code::DEADLINE_EXCEEDED),
        "{reply:?}"
    );
    for method in ["StopPodSandbox", "RemovePodSandbox"] {
        let asked = Instant::now();
        let id = send(
            &mut conn,
            method,
            api::StopPodSandboxRequest {
                pod: Some(pod("sb-slow")),
            }
            .encode_to_vec(),
        )
        .await;
        assert_eq!(
            conn.expect_response(id).await.unwrap(),
            Reply::Ok(Vec::new())
        );
        let waited = asked.elapsed();
        assert!(
            waited < DEADLINE / 2,
            "{method} of the late sandbox waited {waited:?} (the attach still runs)"
        );
    }
    assert!(
        t0.elapsed() < SLOW,
        "the attach should still be running: {:?}",
        t0.elapsed()
    );
    // The late attach ends, rolls itself back; the releases run after it.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let released = recorder.released.lock().unwrap().clone();
        if released.len() >= 3 {
            // The rollback, then Stop's and Remove's own releases.
            assert!(released.iter().all(|s| s == "sb-slow"), "{released:?}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "releases after the late attach: {released:?}"
        );
    }
    assert!(
        t0.elapsed() >= SLOW,
        "no release ran before the attach ended"
    );
    assert!(recorder.attached.lock().unwrap().is_empty());

    stop_tx.send(()).unwrap();
    tokio::task::spawn_blocking(move || plugin.join())
        .await
        .unwrap()
        .unwrap();
}

#[test]
fn the_deadline_stays_below_the_runtimes_timeout() {
    let flag = Duration::from_millis(1500);
    assert_eq!(session::effective_deadline(flag, None), flag);
    assert_eq!(
        session::effective_deadline(flag, Some(Duration::from_secs(2))),
        flag
    );
    assert_eq!(
        session::effective_deadline(flag, Some(Duration::from_secs(1))),
        Duration::from_millis(750)
    );
    assert_eq!(
        session::effective_deadline(flag, Some(Duration::ZERO)),
        flag
    );
}
