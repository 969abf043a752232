//! The spec's error object and the codes kroce-cni uses.

use serde_json::json;
use std::fmt;

/// Error codes: 1-99 are the spec's well-known codes, 100+ kroce-cni's own.
pub mod code {
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    pub const UNSUPPORTED_FIELD: u32 = 2;
    pub const UNKNOWN_CONTAINER: u32 = 3;
    pub const INVALID_ENV: u32 = 4;
    pub const IO: u32 = 5;
    pub const DECODE: u32 = 6;
    pub const INVALID_CONFIG: u32 = 7;
    pub const TRY_AGAIN: u32 = 11;
    pub const NOT_AVAILABLE: u32 = 50;
    pub const NOT_AVAILABLE_LIMITED: u32 = 51;
    /// A netlink request on a netdev failed.
    pub const NETLINK: u32 = 100;
    /// The VF could not be resolved from sysfs (missing, not a VF, no netdev).
    pub const VF_LOOKUP: u32 = 101;
    /// A PF-side VF attribute could not be read or set.
    pub const VF_CONFIG: u32 = 102;
    /// The RDMA device could not be moved or its netns mode read.
    pub const RDMA: u32 = 103;
    /// The IPAM delegate could not be run or its result used.
    pub const IPAM: u32 = 104;
    /// CHECK found the attachment different from its result.
    pub const CHECK_FAILED: u32 = 105;
    /// CNI_IFNAME already exists in the pod netns.
    pub const IFNAME_IN_USE: u32 = 106;
    /// DEL or GC could not undo everything (details list what is left).
    pub const CLEANUP: u32 = 107;
}

/// What the plugin prints on failure (with a non-zero exit).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CniError {
    pub code: u32,
    pub msg: String,
    pub details: Option<String>,
}

impl CniError {
    pub fn new(code: u32, msg: impl Into<String>) -> CniError {
        CniError {
            code,
            msg: msg.into(),
            details: None,
        }
    }

    pub fn with_details(mut self, details: impl Into<String>) -> CniError {
        self.details = Some(details.into());
        self
    }

    pub fn to_json(&self, version: &str) -> serde_json::Value {
        let mut v = json!({"cniVersion": version, "code": self.code, "msg": self.msg});
        if let Some(d) = &self.details {
            v["details"] = json!(d);
        }
        v
    }
}

impl fmt::Display for CniError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}] {}", self.code, self.msg)?;
        if let Some(d) = &self.details {
            write!(f, " ({d})")?;
        }
        Ok(())
    }
}

impl std::error::Error for CniError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_shape() {
        let e = CniError::new(code::INVALID_CONFIG, "bad vlan").with_details("vlan 5000");
        assert_eq!(
            e.to_json("1.0.0"),
            json!({"cniVersion":"1.0.0","code":7,"msg":"bad vlan","details":"vlan 5000"})
        );
        let e = CniError::new(code::TRY_AGAIN, "busy");
        assert!(e.to_json("1.1.0").get("details").is_none());
    }
}
