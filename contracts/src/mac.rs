//! The one MAC address grammar: `aa:bb:cc:dd:ee:ff`, six two-digit hex
//! bytes in either case, written lower-case. kroce-cni's network config,
//! the DRA plugin's claim config and the network-attach files between the
//! DRA plugin and kroce-nri all parse it here, so a MAC one accepts is
//! never refused by the next. In JSON a MAC is its string.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::str::FromStr;

/// An Ethernet MAC address; the default is all zeros.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Mac(pub [u8; 6]);

impl Mac {
    pub const ZERO: Mac = Mac([0; 6]);

    pub fn is_multicast(&self) -> bool {
        self.0[0] & 1 == 1
    }

    pub fn is_zero(&self) -> bool {
        self.0 == [0; 6]
    }

    /// The first 6 bytes of a netlink hardware address attribute.
    pub fn from_slice(b: &[u8]) -> Option<Mac> {
        let six: [u8; 6] = b.get(..6)?.try_into().ok()?;
        Some(Mac(six))
    }

    /// A MAC that can name one interface: not multicast, not all zeros
    /// (what a config may set). The error says why, for the caller to
    /// prefix with the field and the value.
    pub fn parse_unicast(s: &str) -> Result<Mac, MacError> {
        let m: Mac = s.parse()?;
        if m.is_multicast() {
            return Err(MacError::Multicast);
        }
        if m.is_zero() {
            return Err(MacError::Zero);
        }
        Ok(m)
    }
}

/// Why a string is not a MAC (or not one that can name an interface). The
/// text says why only: the caller prefixes the field and the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MacError {
    #[error("{SYNTAX}")]
    Syntax,
    #[error("{SYNTAX}: byte {index} ({part:?}) is not two hex digits")]
    Byte { index: usize, part: String },
    #[error("a multicast address cannot name one interface")]
    Multicast,
    #[error("all zeros is not an address")]
    Zero,
}

impl fmt::Display for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            b[0], b[1], b[2], b[3], b[4], b[5]
        )
    }
}

const SYNTAX: &str = "expected six hex bytes separated by ':' (aa:bb:cc:dd:ee:ff)";

impl FromStr for Mac {
    type Err = MacError;

    /// `aa:bb:cc:dd:ee:ff`, hex digits in either case. Only hex digits: no
    /// sign (`u8::from_str_radix` alone would take `+a`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let parts: Vec<&str> = s.split(':').collect();
        if parts.len() != 6 {
            return Err(MacError::Syntax);
        }
        let mut out = [0u8; 6];
        for (i, p) in parts.iter().enumerate() {
            let not_hex = || MacError::Byte {
                index: i + 1,
                part: p.to_string(),
            };
            if p.len() != 2 || !p.chars().all(|c| c.is_ascii_hexdigit()) {
                return Err(not_hex());
            }
            out[i] = u8::from_str_radix(p, 16).map_err(|_| not_hex())?;
        }
        Ok(Mac(out))
    }
}

impl Serialize for Mac {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Mac {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse()
            .map_err(|e| serde::de::Error::custom(format!("{s:?}: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_either_case_and_writes_lower_case() {
        let m: Mac = "02:AB:cd:00:11:ff".parse().unwrap();
        assert_eq!(m, Mac([0x02, 0xab, 0xcd, 0x00, 0x11, 0xff]));
        assert_eq!(m.to_string(), "02:ab:cd:00:11:ff");
        assert_eq!(
            serde_json::to_value(m).unwrap(),
            serde_json::json!("02:ab:cd:00:11:ff")
        );
        assert_eq!(
            serde_json::from_value::<Mac>(serde_json::json!("02:AB:cd:00:11:ff")).unwrap(),
            m
        );
        assert!(!m.is_multicast());
        assert_eq!(Mac::from_slice(&[2, 0xab, 0xcd, 0, 0x11, 0xff, 9]), Some(m));
        assert_eq!(Mac::from_slice(&[2, 0]), None);
    }

    #[test]
    fn refuses_what_is_not_six_hex_bytes() {
        for bad in [
            "",
            "02:ab:cd:00:11",
            "02:ab:cd:00:11:ff:00",
            "0g:00:00:00:00:00",
            "2:0:0:0:0:0",
            // A sign passes u8::from_str_radix: the dra parser once took it.
            "+2:00:00:00:00:01",
            "02-00-00-00-00-01",
        ] {
            let e = bad.parse::<Mac>().unwrap_err();
            assert!(
                e.to_string().contains("expected six hex bytes"),
                "{bad}: {e}"
            );
        }
        let e = serde_json::from_value::<Mac>(serde_json::json!("02:00")).unwrap_err();
        assert!(e.to_string().contains("\"02:00\""), "{e}");
    }

    #[test]
    fn unicast_refuses_multicast_and_zero() {
        assert_eq!(
            Mac::parse_unicast("02:00:00:00:00:01"),
            Ok(Mac([2, 0, 0, 0, 0, 1]))
        );
        let e = Mac::parse_unicast("03:00:00:00:00:01").unwrap_err();
        assert!(e.to_string().contains("a multicast address"), "{e}");
        let e = Mac::parse_unicast("00:00:00:00:00:00").unwrap_err();
        assert!(e.to_string().contains("all zeros"), "{e}");
        let e = Mac::parse_unicast("02:00:00:00:01").unwrap_err();
        assert!(e.to_string().contains("expected six hex bytes"), "{e}");
    }
}
