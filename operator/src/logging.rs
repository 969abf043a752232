//! The operator's log filter: `--log-level` / `KROCE_LOG_LEVEL` by the rule
//! every kroce binary shares (`kroce_contracts::log`): a level is for
//! kroce's own crates (others stay at info or quieter), a full filter
//! string is used as it is. Without either, `RUST_LOG` as it is, else info.

pub use kroce_contracts::log::LogLevelError;
/// `EnvFilter` directives from the `--log-level` value and `RUST_LOG`.
pub use kroce_contracts::log::resolve as directives;

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Capture(Arc<Mutex<Vec<u8>>>);

    impl Write for Capture {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            if let Ok(mut v) = self.0.lock() {
                v.extend_from_slice(b);
            }
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// What a subscriber with these directives prints of debug events from
    /// kroce's crates and from the libraries under them.
    fn printed(directives: &str) -> String {
        let out = Capture::default();
        let w = out.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::try_new(directives).unwrap())
            .with_writer(move || w.clone())
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::debug!(target: "kroce_operator::controller", "kroce-operator-debug");
            tracing::debug!(target: "sriov_helpers::host", "sriov-helpers-debug");
            tracing::debug!(target: "h2::codec::framed_read", "h2-frame-debug");
            tracing::debug!(target: "kube_client::client", "kube-client-debug");
            tracing::info!(target: "kube_runtime::controller", "kube-runtime-info");
            tracing::warn!(target: "hyper_util::client", "hyper-warn");
        });
        let v = out.0.lock().map(|v| v.clone()).unwrap_or_default();
        String::from_utf8_lossy(&v).into_owned()
    }

    #[test]
    fn debug_is_debug_for_kroce_and_info_for_the_rest() {
        let d = directives(Some("debug"), None).unwrap();
        let out = printed(&d);
        for want in [
            "kroce-operator-debug",
            "sriov-helpers-debug",
            "kube-runtime-info",
            "hyper-warn",
        ] {
            assert!(out.contains(want), "{want} missing with {d:?}:\n{out}");
        }
        for quiet in ["h2-frame-debug", "kube-client-debug"] {
            assert!(!out.contains(quiet), "{quiet} printed with {d:?}:\n{out}");
        }
        // The level wins over RUST_LOG.
        assert_eq!(directives(Some("debug"), Some("trace")).unwrap(), d);
    }

    #[test]
    fn a_full_filter_is_used_as_it_is_and_quieter_levels_apply_to_all() {
        let f = "info,h2=debug";
        assert_eq!(directives(Some(f), None).unwrap(), f);
        assert!(printed(f).contains("h2-frame-debug"));
        assert_eq!(directives(None, Some("kube=debug")).unwrap(), "kube=debug");
        let warn = printed(&directives(Some("warn"), None).unwrap());
        assert!(
            warn.contains("hyper-warn") && !warn.contains("kube-runtime-info"),
            "{warn}"
        );
        let default = directives(None, None).unwrap();
        assert!(!printed(&default).contains("kroce-operator-debug"));
        let e = directives(Some("loud"), None).unwrap_err();
        assert!(e.to_string().contains("\"loud\""), "{e}");
    }
}
