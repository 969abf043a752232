//! Which device IDs the kubelet has handed to pods, from its checkpoint file
//! `<kubelet-dir>/kubelet_internal_checkpoint`. Only a fallback for when the
//! PodResources API cannot be reached: the checkpoint keeps a deleted pod's
//! devices until the kubelet's next allocation.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

pub const FILE_NAME: &str = "kubelet_internal_checkpoint";

/// Allocated device IDs per resource name.
pub type Allocated = BTreeMap<String, BTreeSet<String>>;

/// Parses the checkpoint JSON. `DeviceIDs` is a list in old kubelets and a
/// map of NUMA node to list since 1.20; both are accepted.
pub fn parse(text: &str) -> Allocated {
    let mut out = Allocated::new();
    let Ok(v) = serde_json::from_str::<serde_json::Value>(text) else {
        return out;
    };
    let entries = v
        .pointer("/Data/PodDeviceEntries")
        .and_then(|e| e.as_array())
        .cloned()
        .unwrap_or_default();
    for e in entries {
        let Some(res) = e.get("ResourceName").and_then(|r| r.as_str()) else {
            continue;
        };
        let ids = out.entry(res.to_string()).or_default();
        let mut push_all = |list: &serde_json::Value| {
            for id in list.as_array().into_iter().flatten() {
                if let Some(s) = id.as_str() {
                    ids.insert(s.to_string());
                }
            }
        };
        match e.get("DeviceIDs") {
            Some(serde_json::Value::Object(per_numa)) => per_numa.values().for_each(&mut push_all),
            Some(list) => push_all(list),
            None => {}
        }
    }
    out
}

/// Leniently: an unreadable file means "none known".
pub fn read(kubelet_dir: &Path) -> Allocated {
    try_read(kubelet_dir).unwrap_or_default()
}

/// `None` when the file is missing, unreadable or not a checkpoint (then
/// nothing can be said about what pods hold).
pub fn try_read(kubelet_dir: &Path) -> Option<Allocated> {
    let text = std::fs::read_to_string(kubelet_dir.join(FILE_NAME)).ok()?;
    let v = serde_json::from_str::<serde_json::Value>(&text).ok()?;
    v.pointer("/Data/PodDeviceEntries")?;
    Some(parse(&text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_both_formats() {
        let new = r#"{"Data":{"PodDeviceEntries":[
            {"PodUID":"a","ContainerName":"c","ResourceName":"rdma/vf",
             "DeviceIDs":{"0":["0000:3b:00.2"],"1":["0000:86:00.2"]},"AllocResp":""},
            {"PodUID":"b","ContainerName":"c","ResourceName":"nvidia.com/gpu",
             "DeviceIDs":{"-1":["GPU-1"]},"AllocResp":""}],
            "RegisteredDevices":{}},"Checksum":1}"#;
        let a = parse(new);
        assert_eq!(
            a["rdma/vf"].iter().collect::<Vec<_>>(),
            ["0000:3b:00.2", "0000:86:00.2"]
        );
        assert!(a["nvidia.com/gpu"].contains("GPU-1"));
        let old = r#"{"Data":{"PodDeviceEntries":[{"ResourceName":"rdma/vf","DeviceIDs":["x"]}]}}"#;
        assert!(parse(old)["rdma/vf"].contains("x"));
        assert!(parse("not json").is_empty());
    }

    #[test]
    fn try_read_tells_unknown_from_empty() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(try_read(d.path()), None);
        std::fs::write(d.path().join(FILE_NAME), "garbage").unwrap();
        assert_eq!(try_read(d.path()), None);
        std::fs::write(
            d.path().join(FILE_NAME),
            r#"{"Data":{"PodDeviceEntries":[],"RegisteredDevices":{}},"Checksum":1}"#,
        )
        .unwrap();
        assert_eq!(try_read(d.path()), Some(Allocated::new()));
    }
}
