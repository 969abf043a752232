//! Extended resource names (`rdma/vf`) and every name derived from one (env
//! vars, annotation keys, device-info files, socket, CDI kind). Defined in
//! [`kroce_contracts::resource_name`], which the operator (the writer of
//! `rdma/<resourceName>`) and kroce-nri (the reader of the annotations)
//! share, so no two components derive a name differently.

pub use kroce_contracts::resource_name::*;
