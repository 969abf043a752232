//! The one max-unavailable grammar (how many nodes kroce may have cordoned
//! at once during a rollout): a count (`3`) or a percentage of the nodes in
//! scope (`10%`). The controller's `--drain-max-unavailable` flag and an
//! `RdmaNetwork`'s `spec.maxUnavailable` both use it.
//!
//! A count carries at most [`MAX_COUNT_DIGITS`] digits, a percentage is 1
//! to 100, and zero and leading zeros are refused (a budget of 0 would
//! stop every drain: turn `--drain-held-vfs` off instead), so the CRD's
//! pattern ([`crd_pattern`], generated from the same constants) and the
//! parser give the same verdict on every string.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// A disruption budget, before it meets a node count.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MaxUnavailable {
    /// At most this many nodes.
    Count(u32),
    /// At most this percentage (1..=100) of the nodes in scope, rounded
    /// down, but at least one node.
    Percent(u8),
}

/// One node at a time: kroce's behaviour before budgets existed.
impl Default for MaxUnavailable {
    fn default() -> Self {
        MaxUnavailable::Count(1)
    }
}

/// Most digits of a count: 99,999 nodes is above any cluster and keeps
/// every value inside `u32`.
pub const MAX_COUNT_DIGITS: usize = 5;

/// Why a value is not a budget. The message names the value; the caller
/// adds the field or flag it came from.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MaxUnavailableError {
    #[error(
        "{value:?} is not a max-unavailable value: expected a whole number of nodes (e.g. \"3\") or a percentage of them (e.g. \"10%\")"
    )]
    Syntax { value: String },
    #[error(
        "{value:?} is zero or starts with 0: a budget of 0 stops every drain (turn draining off instead)"
    )]
    Zero { value: String },
    #[error("{value:?} is too large: at most {MAX_COUNT_DIGITS} digits, or 100%")]
    TooLarge { value: String },
}

impl MaxUnavailable {
    /// The number of nodes this budget allows out of `nodes` in scope:
    /// a percentage rounds down but is at least 1, so a small pool still
    /// makes progress.
    pub fn resolve(self, nodes: usize) -> usize {
        match self {
            MaxUnavailable::Count(n) => n as usize,
            MaxUnavailable::Percent(p) => (nodes * usize::from(p) / 100).max(1),
        }
    }
}

impl FromStr for MaxUnavailable {
    type Err = MaxUnavailableError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (digits, percent) = match s.strip_suffix('%') {
            Some(d) => (d, true),
            None => (s, false),
        };
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(MaxUnavailableError::Syntax { value: s.into() });
        }
        if digits.starts_with('0') {
            return Err(MaxUnavailableError::Zero { value: s.into() });
        }
        let too_large = || MaxUnavailableError::TooLarge { value: s.into() };
        if digits.len() > MAX_COUNT_DIGITS {
            return Err(too_large());
        }
        let n: u32 = digits.parse().map_err(|_| too_large())?;
        if percent {
            u8::try_from(n)
                .ok()
                .filter(|p| *p <= 100)
                .map(MaxUnavailable::Percent)
                .ok_or_else(too_large)
        } else {
            Ok(MaxUnavailable::Count(n))
        }
    }
}

/// Canonical form, which parses back to the same value.
impl fmt::Display for MaxUnavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MaxUnavailable::Count(n) => write!(f, "{n}"),
            MaxUnavailable::Percent(p) => write!(f, "{p}%"),
        }
    }
}

impl Serialize for MaxUnavailable {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for MaxUnavailable {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// The grammar as an RE2/ECMA regular expression, for the CRD schema
/// (`pattern`). Generated from [`MAX_COUNT_DIGITS`], so it accepts exactly
/// what `MaxUnavailable::from_str` accepts.
pub fn crd_pattern() -> String {
    format!(
        "^([1-9][0-9]{{0,{}}}|[1-9][0-9]?%|100%)$",
        MAX_COUNT_DIGITS - 1
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn accepts_counts_and_percentages() {
        for (text, want) in [
            ("1", MaxUnavailable::Count(1)),
            ("250", MaxUnavailable::Count(250)),
            ("99999", MaxUnavailable::Count(99_999)),
            ("1%", MaxUnavailable::Percent(1)),
            ("10%", MaxUnavailable::Percent(10)),
            ("100%", MaxUnavailable::Percent(100)),
        ] {
            assert_eq!(text.parse::<MaxUnavailable>(), Ok(want), "{text}");
        }
    }

    #[test]
    fn refuses_other_spellings_naming_the_value() {
        for bad in [
            "", "0", "0%", "00", "010", "05%", "101%", "1000%", "100000", "-1", "+1", "1.5",
            "1.5%", "%", "10 %", " 10%", "10%%", "ten", "1e3", "50%x",
        ] {
            let err = bad.parse::<MaxUnavailable>().expect_err(bad);
            assert!(err.to_string().contains(&format!("{bad:?}")), "{err}");
        }
        assert!(matches!(
            "0".parse::<MaxUnavailable>(),
            Err(MaxUnavailableError::Zero { .. })
        ));
    }

    #[test]
    fn resolve_rounds_percentages_down_but_never_below_one() {
        let cases = [
            (MaxUnavailable::Count(1), 5_000, 1),
            (MaxUnavailable::Count(7), 3, 7),
            (MaxUnavailable::Percent(10), 5_000, 500),
            (MaxUnavailable::Percent(25), 5_000, 1_250),
            (MaxUnavailable::Percent(10), 19, 1),
            (MaxUnavailable::Percent(10), 9, 1),
            (MaxUnavailable::Percent(10), 0, 1),
            (MaxUnavailable::Percent(33), 10, 3),
            (MaxUnavailable::Percent(100), 7, 7),
        ];
        for (budget, nodes, want) in cases {
            assert_eq!(budget.resolve(nodes), want, "{budget} of {nodes}");
        }
        assert_eq!(MaxUnavailable::default(), MaxUnavailable::Count(1));
    }

    #[test]
    fn serde_is_the_string_form() {
        let v = serde_json::to_value([MaxUnavailable::Count(3), MaxUnavailable::Percent(10)])
            .expect("ser");
        assert_eq!(v, serde_json::json!(["3", "10%"]));
        let back: Vec<MaxUnavailable> = serde_json::from_value(v).expect("de");
        assert_eq!(
            back,
            [MaxUnavailable::Count(3), MaxUnavailable::Percent(10)]
        );
        assert!(serde_json::from_value::<MaxUnavailable>(serde_json::json!("0")).is_err());
    }

    fn pattern() -> regex::Regex {
        regex::Regex::new(&crd_pattern()).expect("pattern compiles")
    }

    fn verdicts_agree(s: &str) {
        assert_eq!(
            pattern().is_match(s),
            s.parse::<MaxUnavailable>().is_ok(),
            "pattern and parser disagree on {s:?} (pattern {})",
            crd_pattern()
        );
    }

    #[test]
    fn pattern_agrees_on_the_edges() {
        for s in [
            "1", "0", "99999", "100000", "1%", "0%", "9%", "99%", "100%", "101%", "010", "%", "",
            "1%%", "100",
        ] {
            verdicts_agree(s);
        }
    }

    proptest! {
        #[test]
        fn pattern_agrees_with_parser(
            digits in "[0-9]{0,7}",
            suffix in "(|%|%%| %|x|\\.5)",
        ) {
            verdicts_agree(&format!("{digits}{suffix}"));
        }

        #[test]
        fn display_parses_back(m in prop_oneof![
            (1u32..100_000).prop_map(MaxUnavailable::Count),
            (1u8..=100).prop_map(MaxUnavailable::Percent),
        ]) {
            prop_assert_eq!(m.to_string().parse::<MaxUnavailable>(), Ok(m));
        }
    }
}
