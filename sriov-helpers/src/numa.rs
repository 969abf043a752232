//! NUMA nodes under `sys/devices/system/node/node<N>`.

use crate::cpulist::CpuList;
use crate::error::HostError;
use crate::root::HostRoot;
use crate::sysfs_io::{dir_names, read_string};
use serde::Serialize;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NumaNode {
    pub id: u32,
    pub cpus: CpuList,
}

/// Every `node<N>` directory, sorted by id. A node whose `cpulist` is bad is
/// an error naming the file; the others are still returned in `Ok`.
pub fn read_numa_nodes(root: &HostRoot) -> (Vec<NumaNode>, Vec<HostError>) {
    let base = root.numa_nodes();
    let mut nodes = Vec::new();
    let mut errors = Vec::new();
    let names = match dir_names(&base) {
        Ok(n) => n,
        Err(e) => return (nodes, vec![e]),
    };
    for name in names {
        let Some(id) = name
            .strip_prefix("node")
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let path = base.join(&name).join("cpulist");
        match read_string(&path) {
            Ok(s) => match s.parse::<CpuList>() {
                Ok(cpus) => nodes.push(NumaNode { id, cpus }),
                Err(e) => errors.push(HostError::Malformed {
                    path,
                    what: "CPU list",
                    value: e.to_string(),
                }),
            },
            Err(e) => errors.push(e),
        }
    }
    nodes.sort_by_key(|n| n.id);
    (nodes, errors)
}
