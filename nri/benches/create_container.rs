#![allow(clippy::expect_used)] // bench setup, like the integration tests
//! Cost of answering one CreateContainer request (decode, decide, encode),
//! i.e. what the plugin adds to every container creation on the node.

use std::collections::BTreeMap;
use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use kroce_nri::Memlock;
use kroce_nri::cni_requests::StateDir;
use kroce_nri::handler::Handler;
use kroce_nri::mux;
use kroce_nri::proto::{PLUGIN_SERVICE, api};
use kroce_nri::ttrpc;
use prost::Message;

fn request(sandbox: &str, rdma: bool) -> Vec<u8> {
    let mut annotations: BTreeMap<String, String> = (0..20)
        .map(|i| (format!("io.kubernetes.example/{i}"), "x".repeat(40)))
        .collect();
    let mut devices = vec![api::LinuxDevice {
        path: "/dev/fuse".into(),
        ..Default::default()
    }];
    if rdma {
        annotations.insert(
            "kroce.io/rdma-devices.rdma_vf".into(),
            "0000:3b:00.2".into(),
        );
        devices.push(api::LinuxDevice {
            path: "/dev/infiniband/uverbs0".into(),
            ..Default::default()
        });
    }
    api::CreateContainerRequest {
        pod: Some(api::PodSandbox {
            id: sandbox.into(),
            ..Default::default()
        }),
        container: Some(api::Container {
            id: "c0ffee".into(),
            pod_sandbox_id: sandbox.into(),
            annotations,
            env: (0..30).map(|i| format!("VAR{i}=value{i}")).collect(),
            linux: Some(api::LinuxContainer {
                devices,
                ..Default::default()
            }),
            ..Default::default()
        }),
    }
    .encode_to_vec()
}

fn bench(c: &mut Criterion) {
    let in_memory = Handler::new(Memlock::Unlimited, BTreeMap::<String, Memlock>::new());
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(dir.path().join("memlock")).expect("mkdir");
    std::fs::write(
        dir.path().join("memlock/sb-cni.json"),
        r#"{"version":1,"containerID":"sb-cni","memlock":"unlimited"}"#,
    )
    .expect("write");
    let on_disk = Handler::new(Memlock::Unlimited, StateDir::new(dir.path()));

    let plain = request("sb-plain", false);
    let rdma = request("sb-rdma", true);
    let cni = request("sb-cni", false);

    c.bench_function("create_container/plain/in_memory", |b| {
        b.iter(|| in_memory.handle(PLUGIN_SERVICE, "CreateContainer", black_box(&plain)))
    });
    c.bench_function("create_container/rdma/in_memory", |b| {
        b.iter(|| in_memory.handle(PLUGIN_SERVICE, "CreateContainer", black_box(&rdma)))
    });
    c.bench_function("create_container/cni_file/state_dir", |b| {
        b.iter(|| on_disk.handle(PLUGIN_SERVICE, "CreateContainer", black_box(&cni)))
    });
    let frame = mux::encode(
        mux::PLUGIN_SERVICE_CONN,
        &ttrpc::encode_request(1, PLUGIN_SERVICE, "CreateContainer", rdma.clone()).expect("frame"),
    );
    c.bench_function("wire/demux_and_deframe", |b| {
        b.iter(|| {
            let mut trunk = mux::Decoder::new();
            trunk.push(black_box(&frame));
            let mut conn = ttrpc::Decoder::new();
            while let Ok(Some(f)) = trunk.next_frame() {
                conn.push(&f.payload);
            }
            conn.next_message()
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
