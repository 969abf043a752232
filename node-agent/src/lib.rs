//! The node agent (and `doctor`, its checks run by hand): applies an `RdmaNodeState` spec to a host (roots given
//! as values) and reports what it found. Side effects go through narrow
//! traits ([`VfControl`], [`LinkControl`], [`Dcb`]) and plain file writes
//! under the given sysfs/procfs/configfs roots; [`run`] is the Kubernetes
//! loop around it.

pub mod apply;
pub mod baseline;
pub mod counters;
pub mod dcb;
pub mod doctor;
pub mod holders;
pub mod host_files;
pub mod links;
pub mod netns_mode;
pub mod node_checks;
pub mod pf_record;
pub mod pod_resources;
pub mod reboot;
pub mod run;
pub mod soft;
pub mod state_metrics;
pub mod vfs;

pub use apply::{Agent, AgentConfig, ApplyOutcome};
pub use dcb::Dcb;
pub use holders::{Holder, HolderSources, NodeHolders, VfHolders};
pub use links::LinkControl;
pub use vfs::VfControl;

#[cfg(test)]
mod run_tests;
#[cfg(test)]
mod tests;
