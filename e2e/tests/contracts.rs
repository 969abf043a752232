//! The contracts between kroce's crates, checked on real outputs: what the
//! operator writes must be what the device plugin and the CNI accept, and the
//! annotations the device plugin sets must be what the NRI plugin reads.
//! Each crate is tested alone elsewhere; these fail when two of them drift.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use kroce_operator::crd::{ObservedPf, RdmaNetworkSpec};
use kroce_operator::plan::{NetworkInput, NodeInput, plan_cluster};
use std::collections::BTreeMap;
use std::path::PathBuf;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// An RdmaNetwork manifest's spec, as the operator reads it.
fn network(path: &str) -> NetworkInput {
    let text = std::fs::read_to_string(repo().join(path)).unwrap();
    let doc: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
    let spec: RdmaNetworkSpec =
        serde_json::from_value(doc["spec"].clone()).unwrap_or_else(|e| panic!("{path}: {e}"));
    NetworkInput {
        name: doc["metadata"]["name"].as_str().unwrap().to_string(),
        spec,
    }
}

fn node(labels: &[(&str, &str)]) -> NodeInput {
    NodeInput {
        name: "worker-1".into(),
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<BTreeMap<_, _>>(),
        inventory: Some(vec![ObservedPf {
            pci_address: "0000:3b:00.0".into(),
            if_name: Some("ens1f0".into()),
            vendor: "15b3".into(),
            device_id: "101d".into(),
            total_vfs: 127,
            numa_node: Some(0),
            ..Default::default()
        }]),
    }
}

#[test]
fn operator_pool_configs_are_accepted_by_the_device_plugin() {
    let cases = [
        (
            "charts/kroce/examples/rdmanetwork-connectx.yaml",
            node(&[("feature.node.kubernetes.io/network-sriov.capable", "true")]),
        ),
        (
            "e2e/kind/rdmanetwork-rxe.yaml",
            node(&[("kroce.io/e2e", "true")]),
        ),
    ];
    for (path, n) in cases {
        let plan = plan_cluster(&[n], &[network(path)]);
        assert!(plan.invalid.is_empty(), "{path}: {:?}", plan.invalid);
        let np = &plan.nodes[0];
        assert!(np.conflicts.is_empty(), "{path}: {:?}", np.conflicts);
        let yaml = np
            .device_plugin
            .as_ref()
            .unwrap_or_else(|| panic!("{path}: no device plugin config"))
            .to_yaml()
            .unwrap();
        let cfg =
            kroce_device_plugin::config::parse(&yaml, kroce_device_plugin::config::Format::Yaml)
                .unwrap_or_else(|e| panic!("{path}: the device plugin refuses\n{yaml}\n{e}"));
        assert_eq!(cfg.pools.len(), 1, "{path}");
        assert_eq!(cfg.pools[0].resource.to_string(), "rdma/vf", "{path}");
    }
}

#[test]
fn operator_network_configs_are_accepted_by_the_cni() {
    // deviceID as Multus passes it: the device plugin's device ID (a VF's
    // PCI address, a soft device's RDMA device name).
    for (path, device_id) in [
        (
            "charts/kroce/examples/rdmanetwork-connectx.yaml",
            "0000:3b:00.2",
        ),
        ("e2e/kind/rdmanetwork-rxe.yaml", "rxe_kvf0"),
    ] {
        let net = network(path);
        let mut conf = kroce_operator::plan::nad::cni_config(&net.name, &net.spec);
        conf["deviceID"] = device_id.into();
        let bytes = serde_json::to_vec(&conf).unwrap();
        let args = kroce_cni::protocol::env::CniArgs::parse("").unwrap();
        kroce_cni::config::parse(&bytes, &args)
            .unwrap_or_else(|e| panic!("{path}: kroce-cni refuses {conf}: {e}"));
    }
}

#[test]
fn device_plugin_annotations_are_what_the_nri_plugin_reads() {
    for resource in ["rdma/vf", "rdma/hca", "example.com/rdma_a"] {
        let res = kroce_device_plugin::resource_name::ResourceName::parse(resource).unwrap();
        let facts = kroce_nri::policy::ContainerFacts {
            id: "c".into(),
            sandbox_id: "s".into(),
            annotations: [
                (res.devices_annotation(), "0000:3b:00.2".to_string()),
                (
                    res.memlock_annotation(),
                    kroce_device_plugin::config::Memlock::Bytes(1 << 30).to_string(),
                ),
            ]
            .into_iter()
            .collect(),
            ..Default::default()
        };
        let d = kroce_nri::policy::decide(
            &facts,
            None,
            &Default::default(),
            kroce_nri::Memlock::Bytes(1),
        );
        assert!(d.warnings.is_empty(), "{resource}: {:?}", d.warnings);
        assert!(
            d.evidence.iter().any(|e| matches!(e,
                kroce_nri::policy::Evidence::DevicesAnnotation { key, .. } if *key == res.devices_annotation())),
            "{resource}: {d:?}"
        );
        assert!(
            d.evidence.iter().any(|e| matches!(e,
                kroce_nri::policy::Evidence::MemlockAnnotation { value, .. } if *value == kroce_nri::Memlock::Bytes(1 << 30))),
            "{resource}: {d:?}"
        );
    }
}

/// What kroce-cni writes for a sandbox is what kroce-nri reads for it, at
/// the default state dir layout both take from the contracts crate.
#[test]
fn cni_memlock_requests_are_what_the_nri_plugin_reads() {
    use kroce_nri::cni_requests::MemlockRequests;
    let dir = tempfile::tempdir().unwrap();
    let writer = kroce_cni::memlock::MemlockDir::new(dir.path());
    let reader = kroce_nri::cni_requests::StateDir::new(dir.path());
    let sandbox = "4f1c0a9e8b7d";
    let gib: kroce_cni::memlock::Memlock = "1Gi".parse().unwrap();
    writer
        .record(sandbox, "/run/netns/p", "net1", "rdma-a", gib)
        .unwrap();
    assert_eq!(reader.lookup(sandbox).unwrap(), Some(gib));
    writer
        .record(
            sandbox,
            "/run/netns/p",
            "net2",
            "rdma-b",
            "unlimited".parse().unwrap(),
        )
        .unwrap();
    assert_eq!(
        reader.lookup(sandbox).unwrap(),
        Some(kroce_nri::Memlock::Unlimited)
    );
    writer.forget(sandbox, "net2").unwrap();
    assert_eq!(reader.lookup(sandbox).unwrap(), Some(gib));
    writer.forget(sandbox, "net1").unwrap();
    assert_eq!(reader.lookup(sandbox).unwrap(), None);
    assert_eq!(
        kroce_cni::state::DEFAULT_STATE_DIR,
        kroce_nri::cni_requests::DEFAULT_STATE_DIR
    );
}

/// The memlock property's pattern in the generated CRD file, as the API
/// server applies it: the regex of its CEL rule (`self.matches('...')`,
/// which carries a readable message where a schema `pattern` could not).
fn crd_memlock_pattern() -> regex::Regex {
    let path = repo().join("charts/kroce/crds/kroce.io_crds.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let mut patterns = Vec::new();
    for doc in text.split("\n---") {
        if doc.trim().is_empty() {
            continue;
        }
        let crd: serde_json::Value = serde_saphyr::from_str(doc).unwrap();
        if crd["spec"]["names"]["kind"] != "RdmaNetwork" {
            continue;
        }
        for v in crd["spec"]["versions"].as_array().unwrap() {
            let memlock =
                &v["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["memlock"];
            let rules = memlock["x-kubernetes-validations"]
                .as_array()
                .unwrap_or_else(|| panic!("no memlock rules in {memlock}"));
            for r in rules {
                let rule = r["rule"].as_str().unwrap();
                if let Some(rest) = rule.strip_prefix("self.matches('") {
                    patterns.push(rest.strip_suffix("')").unwrap().to_owned());
                }
            }
        }
    }
    assert_eq!(patterns.len(), 1, "{}: {patterns:?}", path.display());
    regex::Regex::new(&patterns[0]).unwrap()
}

/// The chart's `node.nri.defaultMemlock` pattern (values.schema.json): what
/// `helm install` lets through to kroce-nri's `--default-memlock`.
fn chart_default_memlock_pattern() -> regex::Regex {
    let path = repo().join("charts/kroce/values.schema.json");
    let schema: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let p = schema["properties"]["node"]["properties"]["nri"]["properties"]["defaultMemlock"]
        ["pattern"]
        .as_str()
        .unwrap_or_else(|| panic!("{}: no defaultMemlock pattern", path.display()));
    regex::Regex::new(p).unwrap()
}

/// Memlock strings near every edge of the grammar: each suffix and its
/// near misses (case, spelling, spaces), leading zeros, zero, and digit
/// counts around the 64-bit limit of every suffix.
fn memlock_candidates() -> Vec<String> {
    let mut digits: Vec<String> = ["1", "7", "64", "0", "00", "064", "1024"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    for n in [
        5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 25,
    ] {
        digits.push("9".repeat(n));
        digits.push(format!("1{}", "0".repeat(n - 1)));
    }
    digits.push(u64::MAX.to_string());
    let suffixes = [
        "", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "k", "K", "M", "G", "T", "P", "E", "m", "g", "t",
        "ki", "KI", "mi", "gi", "GI", "KB", "MB", "GB", "Kib", "b", "B", "i", " ", " Gi", "Gi ",
        ".5Gi", ".0", "e3", "\n", "x",
    ];
    let mut out = Vec::new();
    for d in &digits {
        for s in suffixes {
            out.push(format!("{d}{s}"));
        }
        out.push(format!(" {d}"));
        out.push(format!("+{d}"));
        out.push(format!("-{d}"));
    }
    for s in [
        "unlimited",
        "Unlimited",
        "UNLIMITED",
        " unlimited",
        "unlimited ",
        "unlimited\n",
        "infinity",
        "max",
        "",
        " ",
        "Gi",
        "k",
        "0x10",
        "1e9",
        "1_000",
        "1,000",
        "64 Gi",
    ] {
        out.push(s.to_string());
    }
    out
}

/// `None`: refused; `Some(debug)`: accepted as this value.
type Verdict = Option<String>;

/// One memlock string through every place kroce reads it. Before the
/// grammar lived in one crate, `64g` passed the CRD and the operator and
/// then stopped the device plugin; `64Gi` was refused by the CRD although
/// the README used it.
#[test]
fn every_memlock_reader_gives_one_verdict() {
    let pattern = crd_memlock_pattern();
    let chart_pattern = chart_default_memlock_pattern();
    let base: RdmaNetworkSpec = serde_json::from_value(serde_json::json!({
        "nicSelector": {"pfNames": ["ens1f0"]},
        "numVfs": 8
    }))
    .unwrap();
    let args = kroce_cni::protocol::env::CniArgs::parse("").unwrap();
    let vf = kroce_device_plugin::resource_name::ResourceName::parse("vf").unwrap();
    let mut disagreements = Vec::new();
    let mut accepted = 0;
    let candidates = memlock_candidates();
    for value in &candidates {
        let mut verdicts: Vec<(&str, bool, Verdict)> = Vec::new();

        verdicts.push(("CRD pattern", pattern.is_match(value), None));
        verdicts.push((
            "chart defaultMemlock pattern",
            chart_pattern.is_match(value),
            None,
        ));
        let flag = value.parse::<kroce_nri::Memlock>();
        verdicts.push((
            "NRI --default-memlock",
            flag.is_ok(),
            flag.ok().map(|m| format!("{:?}", Some(m))),
        ));

        let mut spec = base.clone();
        spec.memlock = Some(value.clone());
        let op = kroce_operator::plan::validate_network("rdma-a", &spec);
        if let Err(errs) = &op {
            // Refusals name the field and the value.
            assert!(
                errs.iter()
                    .any(|e| e.to_string().starts_with("spec.memlock: ")
                        && e.to_string().contains(&format!("{value:?}"))),
                "{value:?}: {errs:?}"
            );
        }
        verdicts.push(("operator validation", op.is_ok(), None));

        let pool = serde_json::json!({"pools": [{
            "resourceName": "vf", "memlock": value, "selectors": {"isRdma": true}
        }]})
        .to_string();
        let dp =
            kroce_device_plugin::config::parse(&pool, kroce_device_plugin::config::Format::Json);
        verdicts.push((
            "device-plugin config",
            dp.is_ok(),
            dp.ok().map(|c| format!("{:?}", c.pools[0].memlock)),
        ));

        let mut conf = kroce_operator::plan::nad::cni_config("rdma-a", &base);
        conf["deviceID"] = "0000:3b:00.2".into();
        conf["memlock"] = value.as_str().into();
        let cni = kroce_cni::config::parse(&serde_json::to_vec(&conf).unwrap(), &args);
        verdicts.push((
            "CNI config",
            cni.is_ok(),
            cni.ok().map(|c| format!("{:?}", c.memlock)),
        ));

        let facts = kroce_nri::policy::ContainerFacts {
            id: "c".into(),
            sandbox_id: "s".into(),
            annotations: [
                (vf.devices_annotation(), "0000:3b:00.2".to_string()),
                (vf.memlock_annotation(), value.clone()),
            ]
            .into_iter()
            .collect(),
            ..Default::default()
        };
        let d = kroce_nri::policy::decide(
            &facts,
            None,
            &Default::default(),
            kroce_nri::Memlock::Bytes(1),
        );
        let nri = d.evidence.iter().find_map(|e| match e {
            kroce_nri::policy::Evidence::MemlockAnnotation { value, .. } => {
                Some(format!("{:?}", Some(value)))
            }
            _ => None,
        });
        verdicts.push(("NRI annotation", nri.is_some(), nri));

        let ok = verdicts[0].1;
        let values: Vec<&String> = verdicts.iter().filter_map(|v| v.2.as_ref()).collect();
        if verdicts.iter().any(|v| v.1 != ok) || values.windows(2).any(|w| w[0] != w[1]) {
            disagreements.push(format!("{value:?}: {verdicts:?}"));
        }
        accepted += usize::from(ok);
    }
    assert!(
        disagreements.is_empty(),
        "{} of {} memlock values get different verdicts:\n{}",
        disagreements.len(),
        candidates.len(),
        disagreements.join("\n")
    );
    // The generator reaches both sides.
    assert!(
        accepted > 50 && accepted < candidates.len() / 2,
        "{accepted}"
    );
}
