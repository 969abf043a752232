#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The config parser against random input, in the normal test suite (the
//! cargo-fuzz target in cni/fuzz does the same, longer): it never panics,
//! every error maps to a spec code and names a field, and whatever it
//! accepts obeys the documented ranges and names no host path or program
//! (issue 19). The claim-file reader gets the same treatment: random bytes
//! and mutated claims never panic it, and what it cannot read is an error
//! naming the file.

use kroce_cni::config::{ConfigError, parse};
use kroce_cni::protocol::CniArgs;
use proptest::prelude::*;
use serde_json::{Value, json};

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        (0u64..5000).prop_map(|n| json!(n)),
        any::<f64>().prop_map(|f| json!(f)),
        "[a-zA-Z0-9:./_ -]{0,20}".prop_map(Value::String),
        prop_oneof![
            Just("unlimited"),
            Just("802.1ad"),
            Just("802.1Q"),
            Just("on"),
            Just("off"),
            Just("auto"),
            Just("enable"),
            Just("0000:3b:00.2"),
            Just("02:00:00:00:00:01"),
            Just("64Mi"),
            Just("1.1.0"),
            Just("../x"),
            Just("host-local"),
            Just("/tmp/payload.sh"),
            Just("..")
        ]
        .prop_map(|s| Value::String(s.into())),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[a-zA-Z_]{1,8}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

const KEYS: &[&str] = &[
    "cniVersion",
    "name",
    "type",
    "deviceID",
    "pciBusID",
    "runtimeConfig",
    "vlan",
    "vlanQoS",
    "vlanProto",
    "mac",
    "mtu",
    "spoofchk",
    "trust",
    "link_state",
    "min_tx_rate",
    "max_tx_rate",
    "rdma",
    "memlock",
    "ipam",
    "dns",
    "logLevel",
    "logFile",
    "stateDir",
    "hostRoot",
    "sysfsRoot",
    "procRoot",
    "prevResult",
    "cni.dev/valid-attachments",
];

fn mutated_config() -> impl Strategy<Value = Value> {
    (
        prop::collection::vec((0..KEYS.len(), json_value()), 0..6),
        prop::collection::vec((0..KEYS.len(), json_value()), 0..3),
        json_value(),
    )
        .prop_map(|(edits, rc_edits, ipam_type)| {
            let mut c = json!({"cniVersion": "1.0.0", "name": "n", "type": "kroce-cni", "deviceID": "0000:3b:00.2"});
            for (k, v) in edits {
                c[KEYS[k]] = v;
            }
            // runtimeConfig carries the same keys sometimes.
            if !rc_edits.is_empty() {
                let mut rc = json!({});
                for (k, v) in rc_edits {
                    rc[KEYS[k]] = v;
                }
                c["runtimeConfig"] = rc;
            }
            if c["ipam"].is_object() {
                c["ipam"]["type"] = ipam_type;
            }
            c
        })
}

const REFUSED: &[&str] = &["hostRoot", "sysfsRoot", "procRoot", "stateDir", "logFile"];

fn check(bytes: &[u8]) {
    match parse(bytes, &CniArgs::default()) {
        Ok(n) => {
            // Accepted: no key names a host path.
            for k in REFUSED {
                assert!(n.raw.get(k).is_none(), "accepted {k}");
                assert!(
                    n.raw["runtimeConfig"].get(k).is_none(),
                    "accepted runtimeConfig.{k}"
                );
            }
            if let Some(v) = n.vf.vlan {
                assert!(v <= 4094);
            }
            if let Some(q) = n.vf.vlan_qos {
                assert!(q <= 7);
                assert!(q == 0 || n.vf.vlan.unwrap_or(0) != 0);
            }
            if n.vf.vlan_proto.is_some() {
                assert!(n.vf.vlan.is_some());
            }
            if let Some(m) = n.mtu {
                assert!(kroce_contracts::link_limits::MTU_RANGE.contains(&m));
            }
            if let (Some(min), Some(max)) = (n.vf.min_tx_rate, n.vf.max_tx_rate) {
                assert!(max == 0 || min <= max);
            }
            if let Some(mac) = n.mac {
                assert!(!mac.is_multicast() && !mac.is_zero());
            }
            if let Some(i) = &n.ipam {
                assert!(kroce_cni::ipam::is_bare_name(&i.plugin), "{}", i.plugin);
            }
        }
        Err(e) => {
            assert!([1, 6, 7].contains(&e.code()), "{e}");
            assert!(!e.to_string().is_empty());
            if let ConfigError::Invalid { field, .. } = &e {
                assert!(!field.is_empty());
            }
        }
    }
}

/// A well-formed claim file (what ADD writes), as JSON.
fn claim_template() -> Value {
    json!({
        "version": 1,
        "vf": {"pci": "0000:3b:00.2", "pfPci": "0000:3b:00.0", "vfIndex": 0,
               "pfIfname": "ens1f0", "netdev": "ens1f0v0", "rdma": null, "driver": "mlx5_core"},
        "containerID": "c1", "ifname": "net1", "netns": "/run/netns/x", "network": "n",
        "phase": "attached",
        "original": {"link": {"index": 7, "name": "ens1f0v0", "mac": "02:00:00:00:00:01",
                              "mtu": 1500, "up": false, "altnames": [], "parentDev": null},
                     "vf": null},
        "planned": {"vfSettings": [], "mac": null, "mtu": null, "rdmaDevice": null},
        "podIfindex": null, "result": null,
        "config": {"cniVersion": "1.0.0", "name": "n", "type": "kroce-cni",
                   "ipam": {"type": "host-local"}},
        "cniArgs": "", "cniPath": ["/opt/cni/bin"]
    })
}

const CLAIM_KEYS: &[&str] = &[
    "version",
    "vf",
    "containerID",
    "ifname",
    "netns",
    "network",
    "phase",
    "original",
    "planned",
    "podIfindex",
    "result",
    "config",
    "cniArgs",
    "cniPath",
];

/// JSON equality, floats to within a relative 1e-12.
fn same_json(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) if x.is_f64() || y.is_f64() => {
            let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
            x == y || (x - y).abs() <= 1e-12 * x.abs().max(y.abs())
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same_json(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| same_json(v, w)))
        }
        _ => a == b,
    }
}

/// Reads `bytes` as the claim file of VF 0000:3b:00.2 in a fresh state dir.
fn read_claim(bytes: &[u8]) {
    let dir = tempfile::tempdir().unwrap();
    let state = kroce_cni::state::StateDir::new(dir.path());
    let key = kroce_cni::vf::DeviceKey::Pci("0000:3b:00.2".parse().unwrap());
    let path = state.claim_path(&key);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, bytes).unwrap();
    match state.read_claim(&key) {
        Ok(Some(c)) => {
            // What the reader gives back round-trips (floats inside the
            // opaque `result`/`config` to within serde_json's parsing,
            // which may land one ULP off without `float_roundtrip`).
            let again = serde_json::to_vec(&c).unwrap();
            std::fs::write(&path, &again).unwrap();
            let back = state.read_claim(&key).unwrap().expect("written again");
            let (a, b) = (
                serde_json::to_value(&back).unwrap(),
                serde_json::to_value(&c).unwrap(),
            );
            assert!(same_json(&a, &b), "{a}\n!=\n{b}");
        }
        Ok(None) => panic!("a present file read as absent"),
        Err(e) => assert!(e.to_string().contains(&path.display().to_string()), "{e}"),
    }
    let (claims, errors) = state.claims();
    assert_eq!(claims.len() + errors.len(), 1);
}

#[test]
fn the_claim_template_reads() {
    let dir = tempfile::tempdir().unwrap();
    let state = kroce_cni::state::StateDir::new(dir.path());
    let key = kroce_cni::vf::DeviceKey::Pci("0000:3b:00.2".parse().unwrap());
    std::fs::create_dir_all(dir.path().join("vf")).unwrap();
    std::fs::write(state.claim_path(&key), claim_template().to_string()).unwrap();
    assert!(state.read_claim(&key).unwrap().is_some());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        check(&bytes);
    }

    #[test]
    fn random_json_never_panics(v in json_value()) {
        check(&serde_json::to_vec(&v).unwrap());
    }

    #[test]
    fn mutated_configs_hold_their_invariants(v in mutated_config()) {
        check(&serde_json::to_vec(&v).unwrap());
    }
}

proptest! {
    // Each case writes a file: fewer of them.
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn random_claim_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        read_claim(&bytes);
    }

    #[test]
    fn mutated_claims_never_panic(
        edits in prop::collection::vec((0..CLAIM_KEYS.len(), json_value()), 0..4),
    ) {
        let mut c = claim_template();
        for (k, v) in edits {
            c[CLAIM_KEYS[k]] = v;
        }
        read_claim(&serde_json::to_vec(&c).unwrap());
    }
}

/// serde_json (without `float_roundtrip`) may parse a float one ULP off:
/// the value proptest found (in the opaque `result`) still reads back.
#[test]
fn a_claim_with_a_large_float_in_its_result_reads_back() {
    let mut c = claim_template();
    c["result"] = json!(-8.087409816666244e275);
    read_claim(&serde_json::to_vec(&c).unwrap());
}
