//! kroce's end-to-end tests live in `tests/` (see `README.md`). This crate
//! ships nothing; its library holds the generated CRI client the tests
//! drive a real containerd with.

/// The CRI v1 RuntimeService client (`proto/cri/v1/api.proto`).
#[allow(clippy::all, missing_debug_implementations)]
pub mod cri {
    tonic::include_proto!("runtime.v1");
}
