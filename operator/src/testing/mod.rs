//! Test support for the controller's and the node agent's tests (the
//! `testing` feature): never in a release binary.

pub mod mock;
