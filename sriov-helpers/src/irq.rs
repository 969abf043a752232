//! IRQ affinity under `proc/irq/<n>/smp_affinity_list`.

use crate::cpulist::CpuList;
use crate::error::HostError;
use crate::root::HostRoot;
use crate::sysfs_io::{read_string, write_string};

pub fn read_affinity(root: &HostRoot, irq: u32) -> Result<CpuList, HostError> {
    let path = root
        .proc_irq()
        .join(irq.to_string())
        .join("smp_affinity_list");
    let s = read_string(&path)?;
    s.parse()
        .map_err(|e: crate::error::ParseError| HostError::Malformed {
            path,
            what: "CPU list",
            value: e.to_string(),
        })
}

pub fn write_affinity(root: &HostRoot, irq: u32, cpus: &CpuList) -> Result<(), HostError> {
    let path = root
        .proc_irq()
        .join(irq.to_string())
        .join("smp_affinity_list");
    write_string(&path, &cpus.to_string())
}
