//! The one memlock grammar: `unlimited`, a byte count, or a count with a
//! Kubernetes quantity suffix (`Ki`, `Mi`, `Gi`, `Ti` = 1024ⁿ; `k`, `M`,
//! `G`, `T` = 1000ⁿ, spelled exactly as Kubernetes spells them, so `64g`
//! and `64K` are refused as they are in a pod's `resources`).
//!
//! Each suffix has a digit limit that keeps every accepted value inside
//! 64 bits, so the CRD's pattern ([`crd_pattern`], generated from the same
//! table) and the parser give the same verdict on every string. Zero and
//! leading zeros are refused: a zero limit forbids every registration.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// A `RLIMIT_MEMLOCK` size. Ordered: any byte count < `Unlimited`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Memlock {
    /// A finite limit in bytes.
    Bytes(u64),
    /// `RLIM_INFINITY`.
    Unlimited,
}

/// The spelling of an infinite limit everywhere.
pub const UNLIMITED: &str = "unlimited";

/// `RLIM_INFINITY` as the kernel, the OCI runtime spec and runc carry it.
pub const RLIM_INFINITY: u64 = u64::MAX;

/// The suffixes, their multipliers and how many digits each may carry.
/// 10^18 bytes (the plain limit) and 10^15 KiB … 10^6 TiB all stay below
/// 2^64, so no accepted value overflows.
pub const UNITS: &[Unit] = &[
    Unit {
        suffix: "",
        multiplier: 1,
        max_digits: 18,
    },
    Unit {
        suffix: "Ki",
        multiplier: 1 << 10,
        max_digits: 15,
    },
    Unit {
        suffix: "Mi",
        multiplier: 1 << 20,
        max_digits: 12,
    },
    Unit {
        suffix: "Gi",
        multiplier: 1 << 30,
        max_digits: 9,
    },
    Unit {
        suffix: "Ti",
        multiplier: 1 << 40,
        max_digits: 6,
    },
    Unit {
        suffix: "k",
        multiplier: 1_000,
        max_digits: 15,
    },
    Unit {
        suffix: "M",
        multiplier: 1_000_000,
        max_digits: 12,
    },
    Unit {
        suffix: "G",
        multiplier: 1_000_000_000,
        max_digits: 9,
    },
    Unit {
        suffix: "T",
        multiplier: 1_000_000_000_000,
        max_digits: 6,
    },
];

/// One suffix of the grammar.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unit {
    pub suffix: &'static str,
    pub multiplier: u64,
    pub max_digits: usize,
}

/// Why a value is not a memlock size. The message names the value; the
/// caller adds the field it came from.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MemlockError {
    #[error(
        "{value:?} is not a memlock size: expected \"unlimited\" or a whole number of bytes, optionally with Ki, Mi, Gi, Ti (x1024) or k, M, G, T (x1000), e.g. \"64Gi\""
    )]
    Syntax { value: String },
    #[error(
        "{value:?} has unknown unit {unit:?}: use Ki, Mi, Gi, Ti (x1024) or k, M, G, T (x1000), spelled as in Kubernetes quantities"
    )]
    Unit { value: String, unit: String },
    #[error(
        "{value:?} is zero or starts with 0: a memlock limit of 0 forbids every memory registration"
    )]
    Zero { value: String },
    #[error("{value:?} has more than {max_digits} digits before {unit:?}: too large")]
    TooLarge {
        value: String,
        unit: String,
        max_digits: usize,
    },
    #[error("{value} is not a whole number of bytes between 1 and 10^18")]
    Number { value: String },
}

impl Memlock {
    /// From a raw rlimit value (what `/proc/PID/limits`, `getrlimit` or an
    /// OCI spec carry): `u64::MAX` is infinity. Not the user grammar.
    pub fn from_rlimit(value: u64) -> Self {
        if value == RLIM_INFINITY {
            Memlock::Unlimited
        } else {
            Memlock::Bytes(value)
        }
    }

    /// A raw rlimit as text (`/proc/PID/limits`, kroce-nri's status file):
    /// `unlimited` or any decimal `u64`, 0 included (a runtime's limit may
    /// really be 0). Not the user grammar, which refuses 0 and suffixes.
    pub fn parse_rlimit(text: &str) -> Option<Memlock> {
        if text == UNLIMITED {
            Some(Memlock::Unlimited)
        } else if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
            text.parse().ok().map(Memlock::from_rlimit)
        } else {
            None
        }
    }

    /// The raw rlimit value (for `setrlimit`, OCI `POSIXRlimit`).
    pub fn rlimit_value(self) -> u64 {
        match self {
            Memlock::Bytes(bytes) => bytes,
            Memlock::Unlimited => RLIM_INFINITY,
        }
    }

    /// A JSON value from a config file: a string in the grammar, or a
    /// number of bytes (what YAML gives for `memlock: 1048576`).
    pub fn from_json(value: &serde_json::Value) -> Result<Memlock, MemlockError> {
        match value {
            serde_json::Value::String(s) => s.parse(),
            serde_json::Value::Number(n) => match n.as_u64() {
                Some(0) => Err(MemlockError::Zero {
                    value: n.to_string(),
                }),
                Some(b) if b < 1_000_000_000_000_000_000 => Ok(Memlock::Bytes(b)),
                _ => Err(MemlockError::Number {
                    value: n.to_string(),
                }),
            },
            other => Err(MemlockError::Syntax {
                value: other.to_string(),
            }),
        }
    }
}

impl FromStr for Memlock {
    type Err = MemlockError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == UNLIMITED {
            return Ok(Memlock::Unlimited);
        }
        let digits_end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
        let (digits, suffix) = s.split_at(digits_end);
        if digits.is_empty() {
            return Err(MemlockError::Syntax {
                value: s.to_owned(),
            });
        }
        let Some(unit) = UNITS.iter().find(|u| u.suffix == suffix) else {
            // "1.5Gi", "64 Gi", "-1": not a unit problem but a shape one.
            if suffix.chars().all(|c| c.is_ascii_alphabetic()) {
                return Err(MemlockError::Unit {
                    value: s.to_owned(),
                    unit: suffix.to_owned(),
                });
            }
            return Err(MemlockError::Syntax {
                value: s.to_owned(),
            });
        };
        if digits.starts_with('0') {
            return Err(MemlockError::Zero {
                value: s.to_owned(),
            });
        }
        if digits.len() > unit.max_digits {
            return Err(MemlockError::TooLarge {
                value: s.to_owned(),
                unit: unit.suffix.to_owned(),
                max_digits: unit.max_digits,
            });
        }
        let n: u64 = digits.parse().map_err(|_| MemlockError::Syntax {
            value: s.to_owned(),
        })?;
        // The digit limits make this exact; checked all the same.
        n.checked_mul(unit.multiplier)
            .map(Memlock::Bytes)
            .ok_or_else(|| MemlockError::TooLarge {
                value: s.to_owned(),
                unit: unit.suffix.to_owned(),
                max_digits: unit.max_digits,
            })
    }
}

/// Canonical form: `unlimited` or the byte count, which parses back to the
/// same value.
impl fmt::Display for Memlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Memlock::Bytes(bytes) => write!(f, "{bytes}"),
            Memlock::Unlimited => f.write_str(UNLIMITED),
        }
    }
}

/// In files: `"unlimited"` or a number of bytes (memlock request file v1).
impl Serialize for Memlock {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Memlock::Unlimited => s.serialize_str(UNLIMITED),
            Memlock::Bytes(b) => s.serialize_u64(*b),
        }
    }
}

impl<'de> Deserialize<'de> for Memlock {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = serde_json::Value::deserialize(d)?;
        Memlock::from_json(&v).map_err(serde::de::Error::custom)
    }
}

/// The grammar as an RE2/ECMA regular expression, for the CRD schema
/// (`pattern`). Generated from [`UNITS`], so it accepts exactly what
/// `Memlock::from_str` accepts.
pub fn crd_pattern() -> String {
    let alternatives: Vec<String> = UNITS
        .iter()
        .map(|u| format!("[1-9][0-9]{{0,{}}}{}", u.max_digits - 1, u.suffix))
        .collect();
    format!("^({UNLIMITED}|{})$", alternatives.join("|"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn accepts_the_kubernetes_spellings() {
        let cases = [
            ("unlimited", Memlock::Unlimited),
            ("1", Memlock::Bytes(1)),
            ("68719476736", Memlock::Bytes(64 << 30)),
            ("64Gi", Memlock::Bytes(64 << 30)),
            ("512Mi", Memlock::Bytes(512 << 20)),
            ("8Ki", Memlock::Bytes(8 << 10)),
            ("2Ti", Memlock::Bytes(2 << 40)),
            ("64G", Memlock::Bytes(64_000_000_000)),
            ("10M", Memlock::Bytes(10_000_000)),
            ("3k", Memlock::Bytes(3_000)),
            ("999999Ti", Memlock::Bytes(999_999 << 40)),
            (
                "999999999999999999",
                Memlock::Bytes(999_999_999_999_999_999),
            ),
        ];
        for (text, want) in cases {
            assert_eq!(text.parse::<Memlock>(), Ok(want), "{text}");
        }
    }

    #[test]
    fn refuses_other_spellings_naming_the_value() {
        for bad in [
            "",
            "0",
            "00",
            "0Gi",
            "064Gi",
            "64g",
            "64K",
            "64gi",
            "64GB",
            "64 Gi",
            " 64Gi",
            "1.5Gi",
            "-1",
            "+5",
            "1e9",
            "0x10",
            "Unlimited",
            "infinity",
            "1000000Ti",
            "1000000000000000000",
            "18446744073709551615",
        ] {
            let err = bad.parse::<Memlock>().expect_err(bad);
            assert!(err.to_string().contains(&format!("{bad:?}")), "{err}");
        }
        let err = "64g".parse::<Memlock>().expect_err("64g");
        assert!(
            matches!(err, MemlockError::Unit { ref unit, .. } if unit == "g"),
            "{err}"
        );
    }

    #[test]
    fn json_numbers_are_bytes() {
        assert_eq!(
            Memlock::from_json(&serde_json::json!(1048576)),
            Ok(Memlock::Bytes(1 << 20))
        );
        assert_eq!(
            Memlock::from_json(&serde_json::json!("64Gi")),
            Ok(Memlock::Bytes(64 << 30))
        );
        for bad in [
            serde_json::json!(0),
            serde_json::json!(-1),
            serde_json::json!(1.5),
            serde_json::json!(true),
            serde_json::json!(null),
        ] {
            assert!(Memlock::from_json(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn serde_round_trip_in_files() {
        let v = serde_json::to_value([Memlock::Unlimited, Memlock::Bytes(5)]).expect("ser");
        assert_eq!(v, serde_json::json!(["unlimited", 5]));
        let back: Vec<Memlock> = serde_json::from_value(v).expect("de");
        assert_eq!(back, [Memlock::Unlimited, Memlock::Bytes(5)]);
    }

    #[test]
    fn raw_rlimits_take_zero_and_every_u64_but_no_grammar() {
        assert_eq!(Memlock::parse_rlimit("0"), Some(Memlock::Bytes(0)));
        assert_eq!(
            Memlock::parse_rlimit("8388608"),
            Some(Memlock::Bytes(8 << 20))
        );
        assert_eq!(Memlock::parse_rlimit("unlimited"), Some(Memlock::Unlimited));
        assert_eq!(
            Memlock::parse_rlimit("18446744073709551615"),
            Some(Memlock::Unlimited)
        );
        for bad in ["", "64Gi", "+5", "-1", " 1", "18446744073709551616"] {
            assert_eq!(Memlock::parse_rlimit(bad), None, "{bad:?}");
        }
        // Display writes what parse_rlimit reads, for every value.
        for m in [
            Memlock::Bytes(0),
            Memlock::Bytes(u64::MAX - 1),
            Memlock::Unlimited,
        ] {
            assert_eq!(Memlock::parse_rlimit(&m.to_string()), Some(m));
        }
    }

    #[test]
    fn rlimit_infinity_maps_to_unlimited() {
        assert_eq!(Memlock::from_rlimit(u64::MAX), Memlock::Unlimited);
        assert_eq!(Memlock::Unlimited.rlimit_value(), u64::MAX);
        assert!(Memlock::Bytes(u64::MAX - 1) < Memlock::Unlimited);
    }

    fn pattern() -> regex::Regex {
        regex::Regex::new(&crd_pattern()).expect("pattern compiles")
    }

    fn verdicts_agree(s: &str) {
        assert_eq!(
            pattern().is_match(s),
            s.parse::<Memlock>().is_ok(),
            "pattern and parser disagree on {s:?} (pattern {})",
            crd_pattern()
        );
    }

    #[test]
    fn pattern_agrees_on_the_edges() {
        for s in [
            "unlimited",
            "1",
            "64Gi",
            "64g",
            "0",
            "0Gi",
            "999999999999999999",
            "1000000000000000000",
            "999999Ti",
            "1000000Ti",
            "999999999Gi",
            "1000000000G",
            "1.5Gi",
            "unlimitedGi",
            "Gi",
            "-1",
        ] {
            verdicts_agree(s);
        }
    }

    proptest! {
        #[test]
        fn pattern_agrees_with_parser(
            digits in "[0-9]{0,21}",
            suffix in "(|Ki|Mi|Gi|Ti|Pi|k|K|M|G|T|g|m|ki|B|i| )",
        ) {
            verdicts_agree(&format!("{digits}{suffix}"));
        }

        #[test]
        fn display_parses_back(m in prop_oneof![
            Just(Memlock::Unlimited),
            (1u64..1_000_000_000_000_000_000).prop_map(Memlock::Bytes),
        ]) {
            prop_assert_eq!(m.to_string().parse::<Memlock>(), Ok(m));
        }
    }
}
