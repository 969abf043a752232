//! kroce's kubelet device plugin: advertises RDMA-capable SR-IOV VFs, soft
//! RDMA devices and shared HCAs as extended resources.
//!
//! Pure core: [`resource_name`], [`snapshot`], [`preferred`],
//! [`allocation`], [`device_info`], [`cdi`], [`in_use`],
//! [`kubelet_checkpoint`], [`discover`]; the host inventory both kubelet
//! front ends share ([`config`], [`inventory`], [`selection`], [`health`],
//! [`host_view`]) is `kroce_inventory`'s. Edges: [`files`], [`server`]
//! (gRPC service; the unix sockets, [`uds`] and [`grpc_uds`], are
//! `kroce_kubelet_uds`'s), [`registration`], [`pod_resources`] (what pods hold),
//! [`pool_server`] (socket life), [`watcher`] (inotify),
//! [`kernel_events`] (rtnetlink and uevents) and [`plugin`], which
//! runs it all with the state in [`shared`]. `testing` (feature `testing`)
//! holds the kubelet stand-ins (registration and PodResources).

// Shared with the DRA plugin: the inventory and the kubelet sockets live in
// their own crates; their modules keep their paths here.
pub use kroce_inventory::{config, health, host_view, inventory, selection};
pub use kroce_kubelet_uds::{grpc_uds, hpack, uds};

pub mod allocation;
pub mod api;
pub mod cdi;
pub mod device_info;
pub mod discover;
pub mod files;
pub mod in_use;
pub mod kernel_events;
pub mod kubelet_checkpoint;
pub mod plugin;
pub mod pod_resources;
pub mod pool_server;
pub mod preferred;
pub mod registration;
pub mod resource_name;
pub mod server;
pub mod shared;
pub mod snapshot;
pub mod watcher;

#[cfg(any(test, feature = "testing"))]
pub mod testing;
