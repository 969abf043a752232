//! Test fixtures.

/// The two-port ConnectX-6 Dx host of [`FixtureHost::connectx6dx_pair`]
/// in a [`scratch_dir`]; keep the dir alive as long as the host.
///
/// [`FixtureHost::connectx6dx_pair`]: sriov_helpers::fixture::FixtureHost::connectx6dx_pair
/// [`scratch_dir`]: sriov_helpers::fixture::scratch_dir
#[allow(clippy::unwrap_used)]
pub fn connectx_pair() -> (tempfile::TempDir, sriov_helpers::fixture::FixtureHost) {
    let dir = sriov_helpers::fixture::scratch_dir("kroce-host-").unwrap();
    let mut fx = sriov_helpers::fixture::FixtureHost::at(dir.path()).unwrap();
    fx.populate_connectx6dx_pair().unwrap();
    (dir, fx)
}
