//! `pfNames` selectors: `ens1f0`, `ens1f0#0-3,6`.

use crate::error::ParseError;
use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

/// Largest VF index accepted; ConnectX parts top out well below this.
const MAX_VF_INDEX: u32 = 4095;

/// A PF name, optionally restricted to some of its VF indices.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PfSelector {
    pub pf_name: String,
    /// `None`: every VF of the PF.
    pub vfs: Option<BTreeSet<u32>>,
}

impl PfSelector {
    pub fn matches(&self, pf_name: &str, vf_index: Option<u32>) -> bool {
        if self.pf_name != pf_name {
            return false;
        }
        match (&self.vfs, vf_index) {
            (None, _) => true,
            (Some(set), Some(i)) => set.contains(&i),
            (Some(_), None) => false,
        }
    }

    /// True when the two selectors can select a common VF.
    pub fn overlaps(&self, other: &PfSelector) -> bool {
        if self.pf_name != other.pf_name {
            return false;
        }
        match (&self.vfs, &other.vfs) {
            (Some(a), Some(b)) => !a.is_disjoint(b),
            _ => true,
        }
    }
}

impl FromStr for PfSelector {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |reason: String| ParseError::VfRange {
            value: s.to_string(),
            reason,
        };
        let (name, ranges) = match s.split_once('#') {
            Some((n, r)) => (n, Some(r)),
            None => (s, None),
        };
        if name.is_empty() || name.len() > 15 {
            return Err(err("PF name must be 1-15 characters".into()));
        }
        if name
            .chars()
            .any(|c| c == '/' || c == ':' || c.is_whitespace() || c == '#')
        {
            return Err(err(format!("PF name {name:?} is not an interface name")));
        }
        let vfs = match ranges {
            None => None,
            Some("") => return Err(err("empty range after '#'".into())),
            Some(r) => {
                Some(crate::cpulist::parse_index_list(r, "VF index", MAX_VF_INDEX).map_err(err)?)
            }
        };
        Ok(PfSelector {
            pf_name: name.to_string(),
            vfs,
        })
    }
}

impl fmt::Display for PfSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.pf_name)?;
        if let Some(set) = &self.vfs {
            let list = crate::cpulist::CpuList::from_cpus(set.iter().copied());
            write!(f, "#{list}")?;
        }
        Ok(())
    }
}

crate::serde_via_str!(PfSelector);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_name_and_ranges() {
        let s: PfSelector = "ens1f0#0-3,6".parse().unwrap();
        assert_eq!(s.pf_name, "ens1f0");
        assert_eq!(
            s.vfs.clone().unwrap().into_iter().collect::<Vec<_>>(),
            vec![0, 1, 2, 3, 6]
        );
        assert!(s.matches("ens1f0", Some(6)));
        assert!(!s.matches("ens1f0", Some(4)));
        assert!(!s.matches("ens1f1", Some(0)));
        assert_eq!(s.to_string(), "ens1f0#0-3,6");
        let all: PfSelector = "ens2f0".parse().unwrap();
        assert!(all.matches("ens2f0", Some(63)));
        assert!(!all.overlaps(&s));
        let other: PfSelector = "ens1f0#3-5".parse().unwrap();
        assert!(other.overlaps(&s));
        let disjoint: PfSelector = "ens1f0#4-5".parse().unwrap();
        assert!(!disjoint.overlaps(&s));
    }

    #[test]
    fn rejects_bad_ranges_naming_the_value() {
        for bad in [
            "ens1f0#",
            "ens1f0#3-1",
            "ens1f0#a",
            "ens1f0#1,,2",
            "#0-3",
            "ens1/f0",
            "ens1f0#0-99999",
            "averyveryverylongname#1",
        ] {
            let e = bad.parse::<PfSelector>().unwrap_err();
            assert!(e.to_string().contains(&format!("{bad:?}")), "{e}");
        }
    }
}
