//! kroce operator: the `RdmaNetwork` and `RdmaNodeState` resources, the
//! pure planning that turns networks into per-node desired state, the
//! cluster controller and the per-node agent.

pub mod agent;
pub mod controller;
pub mod crd;
pub mod doctor;
pub mod logging;
pub mod plan;
