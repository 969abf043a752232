//! Pure planning: plain functions over plain data, no I/O. The controller
//! feeds them what it listed from the API; the node agent feeds them what it
//! read from the host. Everything here is unit-tested and benchmarked.

pub mod device_class;
pub mod device_plugin;
pub mod irq;
pub mod merge;
pub mod nad;
pub mod qos;
pub mod validate;

pub use device_plugin::{DevicePluginConfig, Pool, Selectors};
pub use merge::{
    ClusterPlan, Conflict, NetworkInput, NodeInput, NodePlan, plan_cluster,
    plan_cluster_without_pools, plan_node,
};
pub use validate::{FieldError, validate_network};
