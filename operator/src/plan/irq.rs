//! IRQ placement: each device's MSI-X vectors except the first (the
//! control/async vector), round-robin over the device's NUMA-local CPUs
//! minus (or only) the reserved ones.

use crate::crd::{IrqAffinity, IrqPolicy, ReservedCpusMode};
use sriov_helpers::CpuList;
use std::collections::BTreeMap;

/// A device with IRQs, as read from sysfs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IrqDevice {
    /// Netdev name (or PCI address when it has none).
    pub name: String,
    /// From `msi_irqs`, sorted ascending.
    pub msi_irqs: Vec<u32>,
    /// `local_cpulist`; `None` when the file is missing.
    pub local_cpus: Option<CpuList>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IrqAssignment {
    pub irq: u32,
    pub device: String,
    pub cpu: u32,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IrqPlan {
    pub assignments: Vec<IrqAssignment>,
    /// Devices that could not be placed, with why.
    pub problems: Vec<String>,
}

/// Plans every device's IRQs. The round-robin cursor is kept per CPU set
/// across devices, so ten VFs with three IRQs each spread over the node
/// instead of all starting on its first CPU.
pub fn plan_irqs(devices: &[IrqDevice], affinity: &IrqAffinity, all_cpus: &CpuList) -> IrqPlan {
    let mut plan = IrqPlan::default();
    if affinity.policy == IrqPolicy::None {
        return plan;
    }
    let reserved: CpuList = affinity
        .reserved_cpus
        .as_deref()
        .and_then(|s| s.parse().ok())
        .unwrap_or_default();
    let mut cursors: BTreeMap<Vec<u32>, usize> = BTreeMap::new();
    for dev in devices {
        let Some(vectors) = dev.msi_irqs.get(1..) else {
            continue;
        };
        if vectors.is_empty() {
            continue;
        }
        let local = dev.local_cpus.as_ref().unwrap_or(all_cpus);
        let allowed = match affinity.reserved_cpus_mode {
            ReservedCpusMode::Exclude => local.difference(&reserved),
            ReservedCpusMode::Only => {
                CpuList::from_cpus(local.cpus().filter(|c| reserved.contains(*c)))
            }
        };
        let cpus: Vec<u32> = allowed.cpus().collect();
        if cpus.is_empty() {
            plan.problems.push(format!(
                "{}: no CPU left for its IRQs (local CPUs {local}, reservedCpus {reserved}, reservedCpusMode {})",
                dev.name,
                match affinity.reserved_cpus_mode {
                    ReservedCpusMode::Exclude => "exclude",
                    ReservedCpusMode::Only => "only",
                }
            ));
            continue;
        }
        let cursor = cursors.entry(cpus.clone()).or_insert(0);
        for irq in vectors {
            plan.assignments.push(IrqAssignment {
                irq: *irq,
                device: dev.name.clone(),
                cpu: cpus[*cursor % cpus.len()],
            });
            *cursor += 1;
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(name: &str, irqs: std::ops::Range<u32>, cpus: &str) -> IrqDevice {
        IrqDevice {
            name: name.into(),
            msi_irqs: irqs.collect(),
            local_cpus: Some(cpus.parse().unwrap()),
        }
    }

    fn aff(reserved: Option<&str>, mode: ReservedCpusMode) -> IrqAffinity {
        IrqAffinity {
            policy: IrqPolicy::NumaLocal,
            reserved_cpus: reserved.map(str::to_string),
            reserved_cpus_mode: mode,
        }
    }

    #[test]
    fn skips_control_vector_and_round_robins_minus_reserved() {
        let devs = [
            dev("ens1f0", 100..105, "0-3"),
            dev("ens1f0v0", 105..108, "0-3"),
        ];
        let p = plan_irqs(
            &devs,
            &aff(Some("0"), ReservedCpusMode::Exclude),
            &CpuList::default(),
        );
        let got: Vec<(u32, u32)> = p.assignments.iter().map(|a| (a.irq, a.cpu)).collect();
        // 100 and 105 are control vectors; CPUs 1,2,3 in turn, continuing across devices.
        assert_eq!(
            got,
            [(101, 1), (102, 2), (103, 3), (104, 1), (106, 2), (107, 3)]
        );
        assert!(p.problems.is_empty());
    }

    #[test]
    fn only_mode_keeps_irqs_on_reserved_local_cpus() {
        let devs = [dev("a", 0..4, "16-31")];
        let p = plan_irqs(
            &devs,
            &aff(Some("0-1,16-17"), ReservedCpusMode::Only),
            &CpuList::default(),
        );
        let cpus: Vec<u32> = p.assignments.iter().map(|a| a.cpu).collect();
        assert_eq!(cpus, [16, 17, 16]);
    }

    #[test]
    fn no_cpu_left_is_a_problem_naming_the_device_and_policy_none_does_nothing() {
        let devs = [dev("ens2f0", 0..4, "16-17")];
        let p = plan_irqs(
            &devs,
            &aff(Some("16-17"), ReservedCpusMode::Exclude),
            &CpuList::default(),
        );
        assert!(p.assignments.is_empty());
        assert!(p.problems[0].starts_with("ens2f0:"), "{:?}", p.problems);
        let none = IrqAffinity {
            policy: IrqPolicy::None,
            ..Default::default()
        };
        assert_eq!(
            plan_irqs(&devs, &none, &CpuList::default()),
            IrqPlan::default()
        );
    }

    #[test]
    fn missing_local_cpulist_falls_back_to_all_cpus() {
        let d = IrqDevice {
            name: "x".into(),
            msi_irqs: vec![1, 2, 3],
            local_cpus: None,
        };
        let p = plan_irqs(&[d], &IrqAffinity::default(), &"4-5".parse().unwrap());
        let cpus: Vec<u32> = p.assignments.iter().map(|a| a.cpu).collect();
        assert_eq!(cpus, [4, 5]);
    }
}
