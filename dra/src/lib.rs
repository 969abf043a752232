//! kroce's DRA (Dynamic Resource Allocation, resource.k8s.io/v1) kubelet
//! plugin: a second front end over the same host model as the device plugin.
//!
//! Pure core: [`slice`] (ResourceSlice content, pool generation). Edges:
//! [`facts`] (host reads).
pub mod api;
pub mod driver;
pub mod facts;
pub mod slice;
