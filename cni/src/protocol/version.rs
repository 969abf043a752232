//! CNI spec versions this plugin speaks.

use std::fmt;

/// The spec versions kroce-cni answers. Results are rendered in the version
/// the configuration asked for (a runtime on libcni 1.1 cannot parse a 1.1.0
/// result).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CniVersion {
    V0_4_0,
    V1_0_0,
    V1_1_0,
}

impl CniVersion {
    pub const SUPPORTED: [CniVersion; 3] =
        [CniVersion::V0_4_0, CniVersion::V1_0_0, CniVersion::V1_1_0];
    pub const LATEST: CniVersion = CniVersion::V1_1_0;

    pub fn parse(s: &str) -> Option<CniVersion> {
        match s {
            "0.4.0" => Some(CniVersion::V0_4_0),
            "1.0.0" => Some(CniVersion::V1_0_0),
            "1.1.0" => Some(CniVersion::V1_1_0),
            _ => None,
        }
    }

    pub fn as_str(&self) -> &'static str {
        match self {
            CniVersion::V0_4_0 => "0.4.0",
            CniVersion::V1_0_0 => "1.0.0",
            CniVersion::V1_1_0 => "1.1.0",
        }
    }

    /// The `VERSION` command's answer.
    pub fn version_info() -> serde_json::Value {
        serde_json::json!({
            "cniVersion": CniVersion::LATEST.as_str(),
            "supportedVersions": CniVersion::SUPPORTED.iter().map(|v| v.as_str()).collect::<Vec<_>>(),
        })
    }

    /// The best version both sides speak, from a delegate's
    /// `supportedVersions`: the highest one not above `self`.
    pub fn negotiate<'a>(&self, theirs: impl IntoIterator<Item = &'a str>) -> Option<CniVersion> {
        theirs
            .into_iter()
            .filter_map(CniVersion::parse)
            .filter(|v| v <= self)
            .max()
    }
}

impl fmt::Display for CniVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_negotiate() {
        assert_eq!(CniVersion::parse("1.0.0"), Some(CniVersion::V1_0_0));
        assert_eq!(CniVersion::parse("0.3.1"), None);
        assert_eq!(CniVersion::parse("1.1"), None);
        let host_local = ["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0"];
        assert_eq!(
            CniVersion::V1_1_0.negotiate(host_local),
            Some(CniVersion::V1_0_0)
        );
        assert_eq!(
            CniVersion::V0_4_0.negotiate(host_local),
            Some(CniVersion::V0_4_0)
        );
        assert_eq!(CniVersion::V1_1_0.negotiate(["0.3.1"]), None);
    }

    #[test]
    fn version_info_lists_all() {
        let v = CniVersion::version_info();
        assert_eq!(v["cniVersion"], "1.1.0");
        assert_eq!(
            v["supportedVersions"],
            serde_json::json!(["0.4.0", "1.0.0", "1.1.0"])
        );
    }
}
