//! What the kroce controller and node agent share: the `RdmaNetwork` and
//! `RdmaNodeState` resources (and their CRDs), the pure planning that turns
//! networks into per-node desired state, the names both write under, and
//! the `/metrics` + `/health` endpoint both serve.

pub mod crd;
pub mod http;
pub mod logging;
pub mod names;
pub mod plan;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
