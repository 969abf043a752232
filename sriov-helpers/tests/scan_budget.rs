#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Discovery cost held to a budget in syscalls per PCI function, counted by
//! the host model's sysfs layer: a scan of 512 VFs has to stay well under
//! 50 ms, and a regression (a canonicalize per device, eagerly read GID
//! tables, a second read of the same file) shows up here as a count, which
//! unlike wall time does not depend on how busy the machine is.

use sriov_helpers::Host;
use sriov_helpers::fixture::{FixtureHost, count_sysfs_syscalls};

/// Per PCI function with its netdev, RDMA device and two char devices. The
/// scan needs ~104 (21 small files at open/read/close, 4 directory listings,
/// 4 links); it was 237 with a canonicalize per device, `read_to_string`
/// and the GID tables read eagerly.
const BUDGET_PER_FUNCTION: u64 = 110;

#[test]
fn whole_host_scan_stays_within_its_syscall_budget() {
    let (pfs, vfs) = (2u32, 16u32);
    let fx = FixtureHost::many(pfs, vfs).unwrap();
    let (host, syscalls) = count_sysfs_syscalls(|| Host::scan(&fx.root()));
    assert!(host.errors.is_empty(), "{:?}", host.errors);
    assert_eq!(host.vfs().count() as u32, pfs * vfs);
    assert_eq!(host.rdma.len() as u32, pfs * (vfs + 1));
    let functions = u64::from(pfs * (vfs + 1));
    let per_function = syscalls / functions;
    eprintln!("{syscalls} syscalls for {functions} PCI functions: {per_function} each");
    assert!(
        per_function <= BUDGET_PER_FUNCTION,
        "scan issued {per_function} syscalls per PCI function (budget {BUDGET_PER_FUNCTION}; {syscalls} in all)"
    );
}
