//! Messages generated from `proto/nri/*.proto` (upstream field numbers).

/// NRI v1alpha1 API subset (`nri.pkg.api.v1alpha1`).
#[allow(missing_debug_implementations, clippy::all, clippy::pedantic)]
pub mod api {
    include!(concat!(env!("OUT_DIR"), "/nri.pkg.api.v1alpha1.rs"));
}

/// ttrpc request/response envelope (`ttrpc`).
#[allow(missing_debug_implementations, clippy::all, clippy::pedantic)]
pub mod envelope {
    include!(concat!(env!("OUT_DIR"), "/ttrpc.rs"));
}

/// Fully qualified ttrpc service names, as the Go runtime registers them.
pub const RUNTIME_SERVICE: &str = "nri.pkg.api.v1alpha1.Runtime";
pub const PLUGIN_SERVICE: &str = "nri.pkg.api.v1alpha1.Plugin";
