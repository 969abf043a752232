//! Admission's flags and settings: test namespace, perftest image and
//! resources, the clock (a value, so tests move time), the one-run lock.

use crate::Context;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Seconds since the Unix epoch; a value so tests can move time.
pub type Clock = Arc<dyn Fn() -> u64 + Send + Sync>;

pub fn system_clock() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The controller's admission flags.
#[derive(Clone)]
pub struct AdmissionSettings {
    /// Where test pods run (a test attachment definition is kept there).
    pub test_namespace: String,
    /// Default image with perftest and `kroce-perftest-run`.
    pub perftest_image: String,
    /// Whole CPUs per test pod (requests = limits: Guaranteed QoS, so the
    /// static CPU manager gives it exclusive cores).
    pub cpus: u32,
    /// Memory per test pod (requests = limits).
    pub memory: String,
    pub clock: Clock,
    pub(crate) lock: Arc<tokio::sync::Mutex<()>>,
    /// Runs whose pods the API refused to create, with why: the next pass
    /// fails them at once. Memory only: after a restart the run is tried
    /// again and fails the same way.
    pub(crate) create_failures: Arc<std::sync::Mutex<BTreeMap<String, String>>>,
}

impl AdmissionSettings {
    pub(crate) fn record_create_failure(&self, run: &str, why: String) {
        if let Ok(mut m) = self.create_failures.lock() {
            m.insert(run.to_string(), why);
        }
    }

    pub(crate) fn take_create_failure(&self, run: &str) -> Option<String> {
        self.create_failures.lock().ok()?.remove(run)
    }

    pub fn new(test_namespace: &str, perftest_image: &str) -> Self {
        AdmissionSettings {
            test_namespace: test_namespace.to_string(),
            perftest_image: perftest_image.to_string(),
            cpus: 2,
            memory: "1Gi".into(),
            clock: Arc::new(system_clock),
            lock: Arc::default(),
            create_failures: Arc::default(),
        }
    }
}

/// The controller's admission flags.
#[derive(Debug, Clone, clap::Args)]
pub struct AdmissionArgs {
    /// Namespace of the admission test pods (and their attachment definitions).
    /// Their own: not the namespace of the privileged node daemon (the
    /// controller may create pods here; the Helm chart creates it).
    #[arg(long, env = "KROCE_TEST_NAMESPACE", default_value = "kroce-perftest")]
    pub test_namespace: String,
    /// Image with perftest and kroce-perftest-run (a network's admission.image overrides it).
    #[arg(
        long,
        env = "KROCE_PERFTEST_IMAGE",
        default_value = "kroce-perftest:latest"
    )]
    pub perftest_image: String,
    /// Whole CPUs per test pod (requests = limits: Guaranteed QoS).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..))]
    pub perftest_cpus: u32,
    /// Memory per test pod (requests = limits), a quantity such as 1Gi or 512Mi.
    #[arg(long, default_value = "1Gi", value_parser = memory_quantity)]
    pub perftest_memory: String,
}

/// A whole memory quantity (`512Mi`, `1Gi`, `1000000000`): refused at
/// start, not by the API server at every test pod.
pub fn memory_quantity(s: &str) -> Result<String, MemoryQuantityError> {
    let digits = s.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let unit = &s[digits.len()..];
    let ok = !digits.is_empty()
        && !digits.starts_with('0')
        && digits.bytes().all(|b| b.is_ascii_digit())
        && ["", "Ki", "Mi", "Gi", "Ti", "k", "M", "G", "T"].contains(&unit);
    if ok {
        Ok(s.to_string())
    } else {
        Err(MemoryQuantityError(s.to_string()))
    }
}

/// A `--perftest-memory` value that is not a whole memory quantity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{0:?} is not a memory quantity: a whole number with an optional Ki, Mi, Gi, Ti, k, M, G or T (e.g. 1Gi, 512Mi)"
)]
pub struct MemoryQuantityError(pub String);

#[cfg(test)]
#[test]
fn perftest_memory_must_be_a_quantity() {
    for ok in ["1Gi", "512Mi", "2G", "1073741824"] {
        assert_eq!(memory_quantity(ok), Ok(ok.to_string()));
    }
    for bad in ["lots", "1gi", "", "0", "1.5Gi", "Gi", "-1Gi"] {
        let e = memory_quantity(bad).unwrap_err().to_string();
        assert!(e.contains("not a memory quantity"), "{bad}: {e}");
    }
}

impl AdmissionArgs {
    pub fn settings(&self) -> AdmissionSettings {
        let mut s = AdmissionSettings::new(&self.test_namespace, &self.perftest_image);
        s.cpus = self.perftest_cpus;
        s.memory = self.perftest_memory.clone();
        s
    }
}

impl Context {
    /// Replaces the admission settings (flags, or a test clock).
    pub fn with_admission(mut self, settings: AdmissionSettings) -> Self {
        self.admission = settings;
        self
    }
}

impl Default for AdmissionSettings {
    fn default() -> Self {
        AdmissionSettings::new("kroce-system", "kroce-perftest:latest")
    }
}

impl std::fmt::Debug for AdmissionSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdmissionSettings")
            .field("test_namespace", &self.test_namespace)
            .field("perftest_image", &self.perftest_image)
            .field("cpus", &self.cpus)
            .field("memory", &self.memory)
            .finish()
    }
}

// ---------------------------------------------------------------------------
// Pure parts.
