//! The contracts between kroce's components, each defined once.
//!
//! A value one component writes and another reads (a memlock size in a CRD,
//! a disruption budget, the MTU and VLAN ranges, a pool config, a CNI config and an annotation; annotation names; the
//! memlock request file; CDI spec and device-info files and the device facts a pod reads
//! from its env; the one atomic (and durable) file write all of them go through; the DRA driver's name, claim env and checkpoint; kroce-nri's status file and the
//! NRI reachability check; the MAC grammar and an interface address with its prefix; default paths; resource names; what `--log-level` means) lives here, so the
//! writer and every reader share one parser and cannot drift.

pub mod annotations;
pub mod atomic_file;
pub mod cdi;
pub mod cni_env;
pub mod device_facts;
pub mod device_info;
pub mod dra;
pub mod dra_checkpoint;
pub mod ip_net;
pub mod link_limits;
pub mod log;
pub mod mac;
pub mod max_unavailable;
pub mod memlock;
pub mod memlock_file;
pub mod network_attach;
pub mod nri_reachability;
pub mod nri_status;
pub mod resource_name;

pub use memlock::{Memlock, MemlockError};
pub use memlock_file::DEFAULT_STATE_DIR;
pub use resource_name::{ResourceName, ResourceNameError};
