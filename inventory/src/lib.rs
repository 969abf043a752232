//! kroce's device inventory: what both kubelet front ends (the device plugin
//! and the DRA plugin) offer from the host model, and what a container gets
//! for one device.
//!
//! Pure core: [`config`] (the pool config file both read), [`inventory`]
//! (one candidate per PCI function and soft RDMA device), [`selection`]
//! (which pool takes a candidate), [`health`], [`device_nodes`] and
//! [`device_info`] (what a container gets for a candidate: device nodes,
//! the facts in its env, its device-info file). Edge: [`host_view`] (one
//! read of the host).
//!
//! Why a crate of its own: this is neither the host model (`sriov-helpers`
//! reads sysfs and knows nothing of pools, selectors or health) nor a file
//! format shared between components (`kroce-contracts`), and it is not the
//! device plugin's either: the DRA plugin offers the same candidates, so it
//! depends on this instead of on the device plugin (and its kubelet
//! v1beta1 API, sockets and watchers).

pub mod config;
pub mod device_info;
pub mod device_nodes;
pub mod health;
pub mod host_view;
pub mod inventory;
pub mod selection;

#[cfg(test)]
mod testing;
