#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The config parser against random input, in the normal test suite (the
//! cargo-fuzz target in cni/fuzz does the same, longer): it never panics,
//! every error maps to a spec code and names a field, and whatever it
//! accepts obeys the documented ranges.

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
            Just("host-local")
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
    prop::collection::vec((0..KEYS.len(), json_value()), 0..6).prop_map(|edits| {
        let mut c = json!({"cniVersion": "1.0.0", "name": "n", "type": "kroce-cni", "deviceID": "0000:3b:00.2"});
        for (k, v) in edits {
            c[KEYS[k]] = v;
        }
        c
    })
}

fn check(bytes: &[u8]) {
    match parse(bytes, &CniArgs::default()) {
        Ok(n) => {
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
                assert!((68..=65535).contains(&m));
            }
            if let (Some(min), Some(max)) = (n.vf.min_tx_rate, n.vf.max_tx_rate) {
                assert!(max == 0 || min <= max);
            }
            if let Some(mac) = n.mac {
                assert!(!mac.is_multicast() && !mac.is_zero());
            }
            if let Some(i) = &n.ipam {
                assert!(!i.plugin.contains('/'));
            }
            for p in [&n.state_dir, &n.host_root, &n.log_file]
                .into_iter()
                .flatten()
            {
                assert!(p.is_absolute());
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
