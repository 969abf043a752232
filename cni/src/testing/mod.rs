//! Test support (feature `testing`, never in the release binary): recording
//! PF/RDMA backends, failure injection, and the netns test bed.

pub mod faults;
pub mod recording;
pub mod testbed;

pub use faults::Faults;
pub use recording::{IgbModel, RdmaCall, RecordingRdma, RecordingVfConfig, Sent};
pub use testbed::{BinOutput, CallResult, Kit, NetnsGuard, TestBed, skip_without_netns};

/// Bytes as space-separated hex, for comparing netlink messages with the
/// layouts the tests write out from the uapi structs.
pub fn hex(b: &[u8]) -> String {
    b.iter()
        .map(|x| format!("{x:02x}"))
        .collect::<Vec<_>>()
        .join(" ")
}
