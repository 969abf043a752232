//! kroce's kubelet device plugin: advertises RDMA-capable SR-IOV VFs, soft
//! RDMA devices and shared HCAs as extended resources.
//!
//! Pure core: [`config`], [`resource_name`], [`inventory`], [`selection`],
//! [`health`], [`snapshot`], [`preferred`], [`allocation`], [`device_info`],
//! [`cdi`], [`kubelet_checkpoint`], [`discover`]. Edges: [`host_view`] (host
//! reads), [`files`], [`uds`], [`server`] (gRPC service), [`registration`],
//! [`pool_server`] (socket life), [`watcher`] (inotify) and [`plugin`], which
//! runs it all with the state in [`shared`]. `testing` (feature `testing`)
//! holds the kubelet stand-in.

pub mod allocation;
pub mod api;
pub mod cdi;
pub mod config;
pub mod device_info;
pub mod discover;
pub mod files;
pub mod health;
pub mod host_view;
pub mod inventory;
pub mod kubelet_checkpoint;
pub mod plugin;
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
