//! kroce's DRA (Dynamic Resource Allocation, resource.k8s.io/v1) kubelet
//! plugin: a second front end over the same host model as the device plugin.
//!
//! Pure core: [`slice`] (ResourceSlice content, pool generation),
//! [`config`] (opaque claim configuration), [`prepare`] (what a claim's
//! preparation writes and answers). Edges: [`facts`] (host reads),
//! [`claims`] (ResourceClaims from the API server), [`publish`]
//! (ResourceSlices to it), [`sharing`] (which HCAs are shared, from
//! the device plugin's config), [`checkpoint`], [`driver_state`] (prepare and
//! unprepare, all-or-nothing), [`server`] (gRPC services) and [`plugin`]
//! (sockets, rescans, re-registration). `testing` (feature `testing`) holds
//! the kubelet DRA stand-in, an in-memory claim store and a recording
//! slice publisher.

pub mod api;
pub mod checkpoint;
pub mod claims;
pub mod config;
pub mod driver;
pub mod driver_state;
pub mod facts;
pub mod network;
pub mod plugin;
pub mod prepare;
pub mod publish;
pub mod server;
pub mod sharing;
pub mod slice;

#[cfg(any(test, feature = "testing"))]
pub mod testing;
