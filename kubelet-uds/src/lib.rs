//! gRPC with the kubelet over unix sockets, for both of kroce's kubelet
//! front ends (the device plugin and the DRA plugin): [`uds`] binds a plugin
//! socket with mode 0600 and dials one as a tonic client; [`grpc_uds`]
//! accepts the kubelet's grpc-go whatever `:authority` it sends, through
//! [`hpack`].
//!
//! A crate of its own (not `kroce-inventory`, not `kroce-contracts`): it is
//! the tokio/tonic edge both front ends share and neither the host model nor
//! the file formats need, so those stay free of an async runtime.

pub mod grpc_uds;
pub mod hpack;
pub mod uds;
