#![no_main]
//! The network configuration parser (and the small parsers around it, and
//! the claim-file reader's decoding) on arbitrary bytes: no panic, whatever
//! the input.

use kroce_cni::protocol::{CniArgs, CniResult};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = kroce_cni::config::parse(data, &CniArgs::default());
    let _ = kroce_cni::device_info::parse(data);
    let _ = serde_json::from_slice::<kroce_cni::state::Claim>(data);
    if let Ok(s) = std::str::from_utf8(data) {
        if let Ok(args) = CniArgs::parse(s) {
            let _ = kroce_cni::config::parse(br#"{"cniVersion":"1.0.0","name":"n","type":"kroce-cni"}"#, &args);
        }
        let _ = s.parse::<kroce_cni::addr::IpNet>();
        let _ = s.parse::<kroce_cni::addr::Mac>();
    }
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) {
        let _ = CniResult::parse(&v);
    }
});
