//! The memlock limit value: `unlimited` or a number of bytes.

use std::fmt;
use std::str::FromStr;

/// A `RLIMIT_MEMLOCK` value. Ordered: any byte count < `Unlimited`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Memlock {
    /// A finite limit in bytes (never `u64::MAX`, which is `Unlimited`).
    Bytes(u64),
    /// `RLIM_INFINITY`.
    Unlimited,
}

/// The spelling of an infinite limit in annotations, CNI files and flags.
pub const UNLIMITED: &str = "unlimited";

/// `RLIM_INFINITY` as the OCI runtime spec and runc carry it (`uint64` all ones).
pub const RLIM_INFINITY: u64 = u64::MAX;

/// A value that is neither `unlimited` nor decimal bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("memlock value {value:?} is not \"unlimited\" or a decimal number of bytes")]
pub struct MemlockParseError {
    pub value: String,
}

impl Memlock {
    /// From a raw rlimit value: `u64::MAX` is infinity.
    pub fn from_rlimit(value: u64) -> Self {
        if value == RLIM_INFINITY {
            Memlock::Unlimited
        } else {
            Memlock::Bytes(value)
        }
    }

    /// The value to put in an OCI/NRI `POSIXRlimit` (`hard` and `soft`).
    pub fn rlimit_value(self) -> u64 {
        match self {
            Memlock::Bytes(bytes) => bytes,
            Memlock::Unlimited => RLIM_INFINITY,
        }
    }
}

impl FromStr for Memlock {
    type Err = MemlockParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let trimmed = s.trim();
        if trimmed == UNLIMITED {
            return Ok(Memlock::Unlimited);
        }
        // Digits only: no sign, no suffix, no hex; u64::from_str would accept "+5".
        if trimmed.is_empty() || !trimmed.bytes().all(|b| b.is_ascii_digit()) {
            return Err(MemlockParseError {
                value: s.to_owned(),
            });
        }
        trimmed
            .parse::<u64>()
            .map(Memlock::from_rlimit)
            .map_err(|_| MemlockParseError {
                value: s.to_owned(),
            })
    }
}

impl fmt::Display for Memlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Memlock::Bytes(bytes) => write!(f, "{bytes}"),
            Memlock::Unlimited => f.write_str(UNLIMITED),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_unlimited_and_bytes() {
        assert_eq!("unlimited".parse::<Memlock>(), Ok(Memlock::Unlimited));
        assert_eq!(" unlimited\n".parse::<Memlock>(), Ok(Memlock::Unlimited));
        assert_eq!("0".parse::<Memlock>(), Ok(Memlock::Bytes(0)));
        assert_eq!(
            "68719476736".parse::<Memlock>(),
            Ok(Memlock::Bytes(68_719_476_736))
        );
        // u64::MAX spelled out is infinity, so a round trip through OCI is stable.
        assert_eq!(
            "18446744073709551615".parse::<Memlock>(),
            Ok(Memlock::Unlimited)
        );
    }

    #[test]
    fn rejects_everything_else_naming_the_value() {
        for bad in [
            "",
            "-1",
            "+5",
            "64Mi",
            "1e9",
            "0x10",
            "Unlimited",
            "infinity",
            "18446744073709551616",
        ] {
            let err = bad.parse::<Memlock>().unwrap_err();
            assert_eq!(err.value, bad);
            assert!(err.to_string().contains(&format!("{bad:?}")), "{err}");
        }
    }

    #[test]
    fn unlimited_is_largest_and_maps_to_rlim_infinity() {
        assert!(Memlock::Unlimited > Memlock::Bytes(u64::MAX - 1));
        assert!(Memlock::Bytes(2) > Memlock::Bytes(1));
        assert_eq!(Memlock::Unlimited.rlimit_value(), u64::MAX);
        assert_eq!(Memlock::Bytes(4096).rlimit_value(), 4096);
        assert_eq!(Memlock::from_rlimit(u64::MAX), Memlock::Unlimited);
    }

    proptest! {
        #[test]
        fn display_parse_round_trip(n in any::<u64>()) {
            let m = Memlock::from_rlimit(n);
            prop_assert_eq!(m.to_string().parse::<Memlock>(), Ok(m));
            prop_assert_eq!(m.rlimit_value(), n);
        }
    }
}
