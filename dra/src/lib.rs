//! kroce's DRA (Dynamic Resource Allocation, resource.k8s.io/v1) kubelet
//! plugin: a second front end over the same host model as the device plugin.
pub mod api;
