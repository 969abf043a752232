//! The pieces of the simulated node the end-to-end test drives: where the
//! compiled binaries are, processes started inside a network namespace,
//! the node itself (netns, PF netdevs, fixture sysfs tree), the simulated
//! kernel that creates VFs when the agent writes `sriov_numvfs`, and an
//! ICMP echo between pods.

// Shared with tests that use other binaries of the set.
#[allow(dead_code)]
pub mod bins;
pub mod icmp;
pub mod kernel;
pub mod node;
pub mod process;
