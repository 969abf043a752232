//! kroce-cni: the CNI plugin that gives a pod an SR-IOV VF with its VLAN,
//! MAC, MTU, IP addresses and RDMA device, and records its memlock request.
//!
//! Pure core: [`protocol`], [`config`], [`plan`], [`vf_attrs`], the netlink
//! codecs in [`netlink`]. Side effects behind narrow traits with real
//! implementations: [`links`] (netdevs, per netns), [`vf_config`] (PF-side
//! VF attributes), [`rdma`] (RDMA netns moves), [`ipam`] (the delegate).
//! [`commands`] runs ADD/DEL/CHECK/STATUS/GC over them; [`entry`] is what
//! the binary calls.

pub mod addr;
pub mod commands;
pub mod config;
pub mod device_info;
pub mod entry;
pub mod ipam;
pub mod links;
pub mod log;
pub mod memlock;
pub mod netlink;
pub mod netns;
pub mod plan;
pub mod protocol;
pub mod rdma;
pub mod state;
pub mod vf;
pub mod vf_attrs;
pub mod vf_config;

#[cfg(feature = "testing")]
pub mod testing;

/// The environment variables kroce-cni takes its roots from.
pub use kroce_contracts::cni_env;
