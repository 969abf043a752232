//! One VF claim, node side, both front ends in one run (interleaved, same
//! host, same backends), in real network namespaces:
//!
//! - DRA: prepare (DriverState::prepare: CDI spec, device-info, the
//!   network-attach request, checkpoint) + attach (kroce-nri's PodNetwork at
//!   RunPodSandbox: kroce-cni ADD in-process, result file); release
//!   (PodNetwork::release: kroce-cni DEL in-process) + unprepare.
//! - Device plugin + CNI: Allocate (the pure decision for one VF) + kroce-cni
//!   ADD, in-process and as the binary a runtime/Multus executes; DEL the
//!   same two ways.
//!
//! The VF is a veth stand-in (kroce-cni's test bed), PF and RDMA backends
//! record instead of touching hardware, IPAM is Debian's host-local. Needs
//! root; prints why and exits otherwise. A bench binary (not criterion): each
//! sample is one full cycle, and the phases are what is compared.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use k8s_openapi::api::resource::v1::ResourceClaimConsumerReference;
use kroce_cni::protocol::{CniEnv, CniError};
use kroce_cni::testing::testbed::CNI_BIN_DIR;
use kroce_cni::testing::{Faults, Kit, RecordingRdma, TestBed, skip_without_netns};
use kroce_device_plugin::snapshot::Snapshot;
use kroce_dra::claims::ClaimRef;
use kroce_dra::config::{CONFIG_API_VERSION, CONFIG_KIND, ConfigSource};
use kroce_dra::driver::DRIVER_NAME;
use kroce_dra::driver_state::DriverState;
use kroce_dra::facts::HostFacts;
use kroce_dra::prepare::Paths;
use kroce_dra::testing::{ConfigEntry, InMemoryClaims, allocated_claim};
use kroce_inventory::config::{Format, parse};
use kroce_inventory::host_view::HostView;
use kroce_inventory::inventory::{Memory, candidates};
use kroce_netlink::rdma::RdmaNetnsMode;
use kroce_nri::network::{CniOptions, CniRunner, PodFacts, PodNetwork};
use serde_json::{Value, json};
use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

const SAMPLES: usize = 40;

struct BedCni<'a> {
    bed: &'a TestBed,
    kit: RefCell<Kit>,
}

fn env_map(env: &CniEnv) -> HashMap<String, String> {
    let mut m = HashMap::new();
    m.insert("CNI_COMMAND".to_string(), env.command.as_str().to_string());
    m.insert(
        "CNI_CONTAINERID".into(),
        env.container_id.clone().unwrap_or_default(),
    );
    if let Some(n) = &env.netns {
        m.insert("CNI_NETNS".into(), n.display().to_string());
    }
    m.insert("CNI_IFNAME".into(), env.ifname.clone().unwrap_or_default());
    m.insert(
        "CNI_PATH".into(),
        std::env::join_paths(&env.path)
            .unwrap()
            .to_string_lossy()
            .into_owned(),
    );
    m.insert("CNI_ARGS".into(), env.args.to_env_string());
    m
}

impl CniRunner for BedCni<'_> {
    fn run(&self, env: &CniEnv, config: &Value) -> Result<Option<Value>, CniError> {
        self.bed
            .call(
                &mut self.kit.borrow_mut(),
                &Faults::none(),
                &env_map(env),
                config,
            )
            .result
    }
}

struct Stats(Vec<Duration>);

impl Stats {
    fn line(&mut self, what: &str) -> String {
        self.0.sort();
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let n = self.0.len();
        format!(
            "{what:<58} median {:>7.2} ms   p90 {:>7.2} ms   (n={n})",
            ms(self.0[n / 2]),
            ms(self.0[n * 9 / 10])
        )
    }
}

fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let t = Instant::now();
    let r = f();
    (r, t.elapsed())
}

/// The bed's kit with VF 0's RDMA device known to the recording backend.
fn kit(bed: &TestBed) -> Kit {
    let dev = kroce_cni::vf::resolve(&bed.fixture.root(), bed.vf_pci(0).parse().unwrap())
        .unwrap()
        .rdma
        .unwrap();
    let mut k = bed.kit();
    k.rdma = RecordingRdma::new(Ok(RdmaNetnsMode::Exclusive)).with_device(
        &dev,
        7,
        &bed.host.open().unwrap(),
    );
    k
}

fn main() {
    if skip_without_netns("dra attach bench") {
        return;
    }
    let bed = TestBed::new(1).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let root = bed.fixture.root();
    let vf_pci = bed.vf_pci(0);

    // --- DRA side: the driver state over the bed's fixture host. ---
    let work = tempfile::tempdir().unwrap();
    let network_dir = kroce_contracts::network_attach::dir(bed.state.path());
    let paths = Paths {
        cdi_dir: work.path().join("cdi"),
        devinfo_dir: work.path().join("devinfo"),
        memlock_dir: None,
        network_dir: Some(network_dir),
        dev_infiniband: None,
    };
    let claims = Arc::new(InMemoryClaims::default());
    let state = DriverState::open(
        "node-a",
        paths,
        claims.clone(),
        work.path().join("checkpoint.json"),
    )
    .unwrap();
    let facts = HostFacts::scan(&root, &mut Memory::default());
    let published = kroce_dra::slice::devices(&facts, &BTreeSet::new());
    let device = published
        .iter()
        .find(|p| p.candidate.pci.map(|a| a.to_string()) == Some(vf_pci.clone()))
        .expect("VF 0 published")
        .device
        .name
        .clone();
    state.set_inventory(published);
    let claim = ClaimRef {
        namespace: "default".into(),
        name: "bench".into(),
        uid: "6c1d3e0a-0000-4000-8000-0000000000bf".into(),
    };
    let ipam = json!({"type": "host-local", "dataDir": bed.ipam_data.path(),
        "ranges": [[{"subnet": "10.77.0.0/24", "gateway": "10.77.0.1"}]],
        "routes": [{"dst": "10.78.0.0/16"}]});
    let mut rc = allocated_claim(
        &claim,
        DRIVER_NAME,
        "node-a",
        &[("vf", &device)],
        &[ConfigEntry {
            source: ConfigSource::FromClass,
            requests: vec![],
            driver: DRIVER_NAME.into(),
            parameters: json!({"apiVersion": CONFIG_API_VERSION, "kind": CONFIG_KIND,
                "mtu": 9000, "ipam": ipam}),
        }],
    );
    rc.status.as_mut().unwrap().reserved_for = Some(vec![ResourceClaimConsumerReference {
        api_group: None,
        resource: "pods".into(),
        name: "bench".into(),
        uid: "pod-bench".into(),
    }]);
    claims.insert(rc);
    let net = PodNetwork::new(
        CniOptions {
            state_dir: bed.state.path().to_path_buf(),
            host_root: Some(bed.fixture.path().to_path_buf()),
            cni_path: vec![PathBuf::from(CNI_BIN_DIR)],
        },
        BedCni {
            bed: &bed,
            kit: RefCell::new(kit(&bed)),
        },
    );
    let pod = PodFacts {
        sandbox_id: "sb-dra".into(),
        uid: "pod-bench".into(),
        namespace: "default".into(),
        name: "bench".into(),
        netns: Some(bed.pod.path.clone()),
    };

    // --- Device plugin + CNI side. ---
    let dp_config = parse(
        "pools:\n- resourceName: vf\n  selectors: {devices: [\"101e\"], isRdma: true}\n",
        Format::Yaml,
    )
    .unwrap();
    let view = HostView::scan(&root);
    let snap = Snapshot::build(
        &dp_config,
        candidates(&view, &mut Memory::default()),
        &|_, _| false,
    );
    let dp_pool = &snap.pools[0];
    let dp_ids = vec![vf_pci.clone()];
    let cni_cfg = bed.config(json!({"mtu": 9000}));
    let mut kit = kit(&bed);
    let cni_bin = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent()?.parent().map(|d| d.join("kroce-cni")))
        .filter(|p| p.is_file());

    let host_before = bed.host.links().unwrap();
    let mut s: Vec<Stats> = (0..9).map(|_| Stats(Vec::new())).collect();
    for i in 0..SAMPLES + 3 {
        let keep = i >= 3; // warm-up
        // DRA.
        let (r, prep) = timed(|| {
            rt.block_on(state.prepare(&claim))
                .map(|_| ())
                .map_err(|e| e.to_string())
        });
        r.unwrap();
        let (r, att) = timed(|| net.attach(&pod));
        assert_eq!(r.unwrap(), 1);
        let (errs, rel) = timed(|| net.release(&pod));
        assert!(errs.is_empty(), "{errs:?}");
        let (r, unp) = timed(|| rt.block_on(state.unprepare(&claim)));
        r.unwrap();
        // Device plugin + kroce-cni in-process.
        let (r, alloc) =
            timed(|| kroce_device_plugin::allocation::allocate(dp_pool, &dp_ids, false));
        r.unwrap();
        let (r, add) = timed(|| {
            bed.call(
                &mut kit,
                &Faults::none(),
                &bed.env("ADD", "sb-dp", "net1"),
                &cni_cfg,
            )
        });
        r.ok();
        let (r, del) = timed(|| {
            bed.call(
                &mut kit,
                &Faults::none(),
                &bed.env("DEL", "sb-dp", "net1"),
                &cni_cfg,
            )
        });
        r.ok();
        // kroce-cni as the binary libcni/Multus executes.
        let bin_times = cni_bin.as_ref().map(|b| {
            let stdin = serde_json::to_vec(&cni_cfg).unwrap();
            let (o, add) = timed(|| {
                bed.run_binary(b, &bed.env("ADD", "sb-bin", "net1"), &stdin)
                    .unwrap()
            });
            assert_eq!(o.code, 0, "{}", o.stdout);
            let (o, del) = timed(|| {
                bed.run_binary(b, &bed.env("DEL", "sb-bin", "net1"), &stdin)
                    .unwrap()
            });
            assert_eq!(o.code, 0, "{}", o.stdout);
            (add, del)
        });
        if keep {
            s[0].0.push(prep + att);
            s[1].0.push(prep);
            s[2].0.push(att);
            s[3].0.push(rel + unp);
            s[4].0.push(alloc + add);
            s[5].0.push(del);
            if let Some((a, d)) = bin_times {
                s[6].0.push(alloc + a);
                s[7].0.push(d);
            }
        }
    }
    assert_eq!(bed.host.links().unwrap(), host_before, "host not as before");
    println!("one VF claim, {SAMPLES} interleaved cycles (veth VF stand-in, host-local IPAM):");
    println!(
        "{}",
        s[0].line("DRA prepare + attach (kroce-nri, kroce-cni in-process)")
    );
    println!(
        "{}",
        s[1].line("  of which prepare (CDI, device-info, request, checkpoint)")
    );
    println!("{}", s[2].line("  of which attach (ADD + result file)"));
    println!("{}", s[3].line("DRA release + unprepare"));
    println!(
        "{}",
        s[4].line("device plugin Allocate + kroce-cni ADD (in-process)")
    );
    println!("{}", s[5].line("kroce-cni DEL (in-process)"));
    if cni_bin.is_some() {
        println!(
            "{}",
            s[6].line("device plugin Allocate + kroce-cni ADD (binary exec)")
        );
        println!("{}", s[7].line("kroce-cni DEL (binary exec)"));
    } else {
        println!(
            "(kroce-cni binary not next to the bench: `cargo build --release -p kroce-cni` for the exec rows)"
        );
    }
}
