//! CPU lists in the kernel's `0-3,8-11` form (`cpulist`, `local_cpulist`,
//! `smp_affinity_list`).

use crate::error::ParseError;
use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

/// Refuses absurd ranges so a typo cannot allocate gigabytes.
const MAX_CPU: u32 = 65_535;

#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct CpuList(BTreeSet<u32>);

impl CpuList {
    pub fn from_cpus(cpus: impl IntoIterator<Item = u32>) -> Self {
        CpuList(cpus.into_iter().collect())
    }
    pub fn cpus(&self) -> impl Iterator<Item = u32> + '_ {
        self.0.iter().copied()
    }
    pub fn contains(&self, cpu: u32) -> bool {
        self.0.contains(&cpu)
    }
    pub fn len(&self) -> usize {
        self.0.len()
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    pub fn is_subset(&self, other: &CpuList) -> bool {
        self.0.is_subset(&other.0)
    }
    pub fn difference(&self, other: &CpuList) -> CpuList {
        CpuList(self.0.difference(&other.0).copied().collect())
    }
}

/// Parses the kernel's `0-3,8,10-11` index-list syntax (CPU lists, VF
/// ranges) into a set; `what` names the items in errors ("CPU", "VF index").
pub(crate) fn parse_index_list(text: &str, what: &str, max: u32) -> Result<BTreeSet<u32>, String> {
    let mut set = BTreeSet::new();
    for part in text.split(',') {
        let (lo, hi) = part.split_once('-').unwrap_or((part, part));
        let bad = || format!("{part:?} is not a {what} or range");
        let lo: u32 = lo.trim().parse().map_err(|_| bad())?;
        let hi: u32 = hi.trim().parse().map_err(|_| bad())?;
        if lo > hi {
            return Err(format!("range {part:?} is backwards"));
        }
        if hi > max {
            return Err(format!("{what} {hi} is above {max}"));
        }
        set.extend(lo..=hi);
    }
    Ok(set)
}

impl FromStr for CpuList {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        if t.is_empty() {
            return Ok(CpuList(BTreeSet::new()));
        }
        parse_index_list(t, "CPU", MAX_CPU)
            .map(CpuList)
            .map_err(|reason| ParseError::CpuList {
                value: s.to_string(),
                reason,
            })
    }
}

impl fmt::Display for CpuList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        let mut iter = self.0.iter().copied().peekable();
        while let Some(start) = iter.next() {
            let mut end = start;
            while iter.peek() == Some(&(end + 1)) {
                end += 1;
                iter.next();
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if start == end {
                write!(f, "{start}")?;
            } else {
                write!(f, "{start}-{end}")?;
            }
        }
        Ok(())
    }
}

crate::serde_via_str!(CpuList);

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_ranges_and_singles() {
        let c: CpuList = "0-3,8,10-11".parse().unwrap();
        assert_eq!(c.cpus().collect::<Vec<_>>(), vec![0, 1, 2, 3, 8, 10, 11]);
        assert_eq!(c.to_string(), "0-3,8,10-11");
        assert!("".parse::<CpuList>().unwrap().is_empty());
    }

    #[test]
    fn rejects_garbage() {
        for bad in ["3-1", "a", "1,,2", "0-99999999"] {
            let e = bad.parse::<CpuList>().unwrap_err();
            assert!(e.to_string().contains(bad), "{e}");
        }
    }

    proptest! {
        #[test]
        fn display_parse_round_trip(cpus in proptest::collection::btree_set(0u32..256, 0..64)) {
            let c = CpuList(cpus);
            let back: CpuList = c.to_string().parse().unwrap();
            prop_assert_eq!(back, c);
        }
    }
}
