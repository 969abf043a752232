//! The memlock limit value (`unlimited` or bytes) and its one grammar
//! (`64Gi`, `1G`, `1048576`, …), shared with the device plugin that writes
//! the `kroce.io/memlock.<res>` annotations, kroce-cni that writes the
//! request files, and the operator: see [`kroce_contracts::memlock`].

pub use kroce_contracts::memlock::*;
