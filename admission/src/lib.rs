//! kroce admission: the pure core of "no node serves RDMA pods until it has
//! proved itself".
//!
//! - [`perftest`]: parse perftest's bandwidth and latency output.
//! - [`command`]: build perftest command lines (same options on both sides,
//!   explicit GID index, NUMA-local pinning).
//! - [`thresholds`]: judge measured numbers against a network's thresholds.
//! - [`lifecycle`]: the admission state machine as one plan function.
//! - [`doctor`]: RoCE health checks against a host root, as a table or JSON.
//! - [`pod_run`]: the in-pod runner's arguments, its log, and the verdict
//!   on a run (the `kroce-perftest-run` binary is its I/O).
//! - [`counters`]: RDMA/Ethernet counter snapshots, Prometheus text, rates
//!   and the congestion condition.
//!
//! Everything here is plain functions over plain data; the operator does the
//! API calls, pod creation and log collection.

pub mod command;
pub mod counters;
pub mod doctor;
pub mod lifecycle;
pub mod perftest;
pub mod pod_run;
pub mod thresholds;
