//! The contracts between kroce's components, each defined once.
//!
//! A value one component writes and another reads (a memlock size in a CRD,
//! a pool config, a CNI config and an annotation; annotation names; the
//! memlock request file; default paths; what `--log-level` means) lives
//! here, so the writer and every reader share one parser and cannot drift.

pub mod log;
pub mod memlock;

pub use memlock::{Memlock, MemlockError};
