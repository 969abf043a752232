//! What `--log-level` / `KROCE_LOG_LEVEL` means for every kroce binary.
//!
//! A plain level (`debug`) is for kroce's own crates: turning on debug must
//! not also turn on h2, hyper, tower and kube's frame-by-frame logs (one
//! registration was ~90 lines of h2 frames). Other crates stay at `info`,
//! or at the given level when that is quieter. A full tracing filter (it
//! contains `=` or `,`) is for experts and is used as it is.

/// The environment variable every kroce binary reads for its log level.
pub const LOG_LEVEL_ENV: &str = "KROCE_LOG_LEVEL";

/// The library and binary crates that are kroce's own (tracing targets are
/// module paths, so a crate name covers all its modules).
pub const KROCE_TARGETS: &[&str] = &[
    "kroce_admission",
    "kroce_cni",
    "kroce_contracts",
    "kroce_controller",
    "kroce_device_plugin",
    "kroce_dra",
    "kroce_dra_plugin",
    "kroce_e2e",
    "kroce_inventory",
    "kroce_kubelet_uds",
    "kroce_netlink",
    "kroce_node_agent",
    "kroce_nri",
    "kroce_operator",
    "kroce_perftest_run",
    "sriov_helpers",
];

const LEVELS: &[&str] = &["off", "error", "warn", "info", "debug", "trace"];

/// A level that is neither a known level nor a filter.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "log level {value:?} is not one of off, error, warn, info, debug, trace, nor a tracing filter such as \"info,kroce_cni=trace\""
)]
pub struct LogLevelError {
    pub value: String,
}

/// The tracing `EnvFilter` directives for a `--log-level` value.
pub fn env_filter_directives(level: &str) -> Result<String, LogLevelError> {
    let level = level.trim();
    if level.contains('=') || level.contains(',') {
        return Ok(level.to_owned());
    }
    let lower = level.to_ascii_lowercase();
    let Some(rank) = LEVELS.iter().position(|l| *l == lower) else {
        return Err(LogLevelError {
            value: level.to_owned(),
        });
    };
    let info = LEVELS.iter().position(|l| *l == "info").unwrap_or(3);
    let others = LEVELS[rank.min(info)];
    let mut directives = vec![others.to_owned()];
    directives.extend(KROCE_TARGETS.iter().map(|t| format!("{t}={lower}")));
    Ok(directives.join(","))
}

/// The directives a binary starts with: its `--log-level` (env
/// [`LOG_LEVEL_ENV`]) by [`env_filter_directives`]; without one, `RUST_LOG`
/// as it is (the tracing convention, for experts); else `info` by the same
/// rule.
pub fn resolve(level: Option<&str>, rust_log: Option<&str>) -> Result<String, LogLevelError> {
    match (level, rust_log) {
        (Some(level), _) => env_filter_directives(level),
        (None, Some(filter)) if !filter.trim().is_empty() => Ok(filter.to_owned()),
        (None, _) => env_filter_directives("info"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every crate of the workspace (library and binary targets are named
    /// after the package) is in [`KROCE_TARGETS`]: a crate left out would
    /// stay at info under `--log-level debug`.
    #[test]
    fn every_workspace_crate_is_a_kroce_target() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let manifest = std::fs::read_to_string(root.join("Cargo.toml")).expect("workspace");
        let members = manifest
            .split("members = [")
            .nth(1)
            .and_then(|m| m.split(']').next())
            .expect("members");
        for dir in members.split(',').map(|m| m.trim().trim_matches('"')) {
            if dir.is_empty() {
                continue;
            }
            let text = std::fs::read_to_string(root.join(dir).join("Cargo.toml")).expect(dir);
            let mut names: Vec<String> = text
                .lines()
                .filter_map(|l| l.trim().strip_prefix("name = \""))
                .filter_map(|l| l.strip_suffix('"'))
                .map(|n| n.replace('-', "_"))
                .collect();
            names.dedup();
            for n in names {
                if n == "discovery" || !(n.starts_with("kroce") || n.starts_with("sriov")) {
                    continue; // benches and examples
                }
                assert!(KROCE_TARGETS.contains(&n.as_str()), "{dir}: {n} missing");
            }
        }
    }

    #[test]
    fn debug_is_for_kroce_crates_only() {
        let d = env_filter_directives("debug").expect("debug");
        let parts: Vec<&str> = d.split(',').collect();
        assert_eq!(parts[0], "info", "{d}");
        assert!(parts.contains(&"kroce_device_plugin=debug"), "{d}");
        assert!(parts.contains(&"sriov_helpers=debug"), "{d}");
        assert!(!d.contains("h2"), "{d}");
    }

    #[test]
    fn quieter_levels_apply_to_everyone() {
        assert!(
            env_filter_directives("warn")
                .expect("warn")
                .starts_with("warn,")
        );
        assert!(
            env_filter_directives("ERROR")
                .expect("error")
                .starts_with("error,")
        );
    }

    #[test]
    fn level_wins_then_rust_log_then_info() {
        let debug = env_filter_directives("debug").expect("debug");
        assert_eq!(resolve(Some("debug"), Some("trace")), Ok(debug));
        assert_eq!(resolve(None, Some("h2=trace")), Ok("h2=trace".to_owned()));
        assert_eq!(resolve(None, Some(" ")), env_filter_directives("info"));
        assert_eq!(resolve(None, None), env_filter_directives("info"));
        assert!(resolve(Some("loud"), None).is_err());
    }

    #[test]
    fn filters_pass_through_and_nonsense_is_refused() {
        assert_eq!(
            env_filter_directives("info,h2=trace").expect("filter"),
            "info,h2=trace"
        );
        assert_eq!(
            env_filter_directives("kroce_cni=trace").expect("filter"),
            "kroce_cni=trace"
        );
        let err = env_filter_directives("verbose").expect_err("verbose");
        assert!(err.to_string().contains("\"verbose\""), "{err}");
    }
}
