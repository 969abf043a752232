//! kroce's kubelet device plugin: advertises RDMA-capable SR-IOV VFs, soft
//! RDMA devices and shared HCAs as extended resources.
//!
//! Pure core: [`config`], [`resource_name`], [`inventory`], [`selection`],
//! [`health`], [`snapshot`], [`preferred`], [`allocation`], [`device_info`],
//! [`cdi`], [`in_use`], [`kubelet_checkpoint`], [`discover`]. Edges:
//! [`host_view`] (host reads), [`files`], [`uds`], [`server`] (gRPC
//! service), [`registration`], [`pod_resources`] (what pods hold),
//! [`pool_server`] (socket life), [`watcher`] (inotify),
//! [`kernel_events`] (rtnetlink and uevents) and [`plugin`], which
//! runs it all with the state in [`shared`]. `testing` (feature `testing`)
//! holds the kubelet stand-ins (registration and PodResources).

pub mod allocation;
pub mod api;
pub mod cdi;
pub mod config;
pub mod device_info;
pub mod discover;
pub mod files;
pub mod grpc_uds;
pub mod health;
pub mod host_view;
pub mod hpack;
pub mod in_use;
pub mod inventory;
pub mod kernel_events;
pub mod kubelet_checkpoint;
pub mod plugin;
pub mod pod_resources;
pub mod pool_server;
pub mod preferred;
pub mod registration;
pub mod resource_name;
pub mod selection;
pub mod server;
pub mod shared;
pub mod snapshot;
pub mod uds;
pub mod watcher;

#[cfg(any(test, feature = "testing"))]
pub mod testing;
