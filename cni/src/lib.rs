//! kroce-cni: the CNI plugin that gives a pod an SR-IOV VF with its VLAN,
//! MAC, MTU, IP addresses and RDMA device, and records its memlock request.
//!
//! Pure core: [`protocol`], [`config`], [`plan`]; the netlink messages are
//! kroce-netlink's (`netlink/`). Side effects behind narrow traits with real
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
pub mod plan;
pub mod protocol;
pub mod rdma;
pub mod state;
pub mod vf;
pub mod vf_config;

#[cfg(feature = "testing")]
pub mod testing;

/// Network namespace handles (kroce-netlink opens its sockets in them).
pub use kroce_netlink::netns;
/// PF-side VF attributes, as the route codec sends and reads them.
pub use kroce_netlink::vf_attrs;

/// The environment variables kroce-cni takes its roots from.
pub use kroce_contracts::cni_env;
