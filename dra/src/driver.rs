//! The driver's name and the kubelet paths derived from it, defined once.

use std::path::{Path, PathBuf};

/// The DRA driver name: in ResourceSlices, DeviceClasses' selectors
/// (`device.driver == "rdma.kroce.io"`), claim allocation results, opaque
/// configuration and the CDI vendor. Defined in `kroce_contracts::dra`,
/// shared with the operator's DeviceClasses.
pub use kroce_contracts::dra::DRIVER_NAME;
/// Field manager and `app.kubernetes.io/managed-by` of what the plugin writes.
pub const MANAGER: &str = "kroce-dra";
/// The kubelet's root directory.
pub const DEFAULT_KUBELET_DIR: &str = "/var/lib/kubelet";
/// Where the kubelet's plugin watcher looks for registration sockets.
pub const PLUGINS_REGISTRY: &str = "plugins_registry";
/// Where plugins keep their service sockets.
pub const PLUGINS: &str = "plugins";
/// The DRA service socket's file name in `<kubelet>/plugins/<driver>/`.
pub const SERVICE_SOCKET: &str = "dra.sock";

/// `<kubelet>/plugins_registry/rdma.kroce.io-reg.sock`: what the kubelet's
/// plugin watcher finds (by inotify) and calls GetInfo on.
pub fn registration_socket(kubelet_dir: &Path) -> PathBuf {
    kubelet_dir
        .join(PLUGINS_REGISTRY)
        .join(format!("{DRIVER_NAME}-reg.sock"))
}

/// `<kubelet>/plugins/rdma.kroce.io/dra.sock`: the DRAPlugin service,
/// named in `PluginInfo.endpoint`.
pub fn service_socket(kubelet_dir: &Path) -> PathBuf {
    kubelet_dir
        .join(PLUGINS)
        .join(DRIVER_NAME)
        .join(SERVICE_SOCKET)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubelet_paths() {
        let k = Path::new(DEFAULT_KUBELET_DIR);
        assert_eq!(
            registration_socket(k),
            Path::new("/var/lib/kubelet/plugins_registry/rdma.kroce.io-reg.sock")
        );
        assert_eq!(
            service_socket(k),
            Path::new("/var/lib/kubelet/plugins/rdma.kroce.io/dra.sock")
        );
    }
}
