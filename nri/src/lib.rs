//! kroce's NRI plugin: gives every container that holds kroce RDMA devices the
//! `RLIMIT_MEMLOCK` that RDMA memory registration needs.
//!
//! No Rust NRI crate exists, so the protocol is implemented here from its
//! public definition: the NRI connection multiplexer ([`mux`]) carries two
//! ttrpc channels ([`ttrpc`]) whose payloads are the NRI protobuf messages in
//! [`proto`] (generated from `proto/nri/*.proto`).
//!
//! Layout, pure core first:
//! - [`memlock`]: the limit value (`unlimited` or bytes).
//! - [`policy`]: which containers get which limit — a plain function over plain data.
//! - [`cni_requests`]: the per-sandbox memlock request files kroce-cni writes.
//! - [`handler`]: answers the runtime's Plugin-service requests (bytes in, bytes out).
//! - [`session`]: one connection to the runtime, and the reconnect loop.
//! - [`reachability`]: "is NRI there?", for the node agent's condition and `doctor`.
//! - [`runtime`]: what the runtime at the socket's other end can grant (its
//!   capabilities and memlock limit, from `/proc/<peer pid>`).
//! - [`status`]: the status file kroce-nri keeps for the node agent and `doctor`.

pub mod cni_requests;
pub mod handler;
pub mod memlock;
pub mod mux;
pub mod network;
pub mod policy;
pub mod proto;
pub mod reachability;
pub mod runtime;
pub mod session;
pub mod status;
pub mod ttrpc;

#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use memlock::Memlock;
pub use reachability::{NriStatus, nri_reachable};

/// Where containerd and CRI-O listen for external NRI plugins by default.
pub const DEFAULT_NRI_SOCKET: &str = "/var/run/nri/nri.sock";
/// The name kroce registers under (NRI allows `[a-zA-Z0-9_.+-]`).
pub const DEFAULT_PLUGIN_NAME: &str = "kroce-memlock";
/// Plugins are called in ascending index order; 50 leaves room on both sides.
pub const DEFAULT_PLUGIN_INDEX: &str = "50";
