//! The CNI commands over explicit side-effect backends. Everything a command
//! touches comes in through [`Node`] (roots, state dir, host netns) and
//! [`Backends`] (netlink, PF, RDMA, IPAM).

mod add;
mod check;
mod del;
mod gc;
mod release;
mod status;

use crate::config::{DeviceRef, NetConf};
use crate::ipam::{IpamDelegate, IpamRequest};
use crate::links::LinksOpener;
use crate::log::Logger;
use crate::netns::Netns;
use crate::protocol::{CniEnv, CniError, CniVersion, Command, code};
use crate::rdma::RdmaControl;
use crate::state::{DEFAULT_STATE_DIR, StateDir};
use crate::vf::DeviceKey;
use crate::vf_config::VfConfig;
use sriov_helpers::HostRoot;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use release::{find_host_link, is_our_link};

/// How long a call waits for another call holding the same VF.
pub const LOCK_TIMEOUT: Duration = Duration::from_secs(20);

/// The node as a value: where sysfs/procfs are, the state dir, the host
/// netns (the one the plugin was started in).
#[derive(Debug)]
pub struct Node {
    pub host_root: HostRoot,
    pub state: StateDir,
    pub host_netns: Netns,
    pub lock_timeout: Duration,
    /// pids whose RLIMIT_MEMLOCK stands for the runtime's process tree:
    /// the process that executed the plugin. Never the plugin itself: its
    /// own short-lived limit is inherited by no container.
    pub runtime_pids: Vec<String>,
}

/// Env overrides for roots (used when a config key is absent).
pub const ENV_HOST_ROOT: &str = "KROCE_HOST_ROOT";
pub const ENV_SYSFS_ROOT: &str = "KROCE_SYSFS_ROOT";
pub const ENV_PROC_ROOT: &str = "KROCE_PROC_ROOT";
pub const ENV_STATE_DIR: &str = "KROCE_STATE_DIR";

impl Node {
    /// Roots from the config keys, then `KROCE_*` env, then defaults (`/`,
    /// `/var/lib/cni/kroce`). `host_netns` is the plugin's own netns.
    pub fn from_conf(
        conf: &NetConf,
        env: impl Fn(&str) -> Option<String>,
        host_netns: Netns,
    ) -> Node {
        let pick = |c: &Option<PathBuf>, key: &str| -> Option<PathBuf> {
            c.clone()
                .or_else(|| env(key).filter(|v| v.starts_with('/')).map(PathBuf::from))
        };
        let host = pick(&conf.host_root, ENV_HOST_ROOT).unwrap_or_else(|| PathBuf::from("/"));
        let sys = pick(&conf.sysfs_root, ENV_SYSFS_ROOT).unwrap_or_else(|| host.join("sys"));
        let proc = pick(&conf.proc_root, ENV_PROC_ROOT).unwrap_or_else(|| host.join("proc"));
        let state = pick(&conf.state_dir, ENV_STATE_DIR)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_STATE_DIR));
        Node {
            host_root: HostRoot::with_paths(sys, proc, host.join("dev")),
            state: StateDir::new(state),
            host_netns,
            lock_timeout: LOCK_TIMEOUT,
            runtime_pids: vec![nix::unistd::getppid().to_string()],
        }
    }
}

/// The side-effect backends of one call.
pub struct Backends<'a> {
    pub links: &'a mut dyn LinksOpener,
    pub vf: &'a mut dyn VfConfig,
    pub rdma: &'a mut dyn RdmaControl,
    pub ipam: &'a mut dyn IpamDelegate,
}

impl std::fmt::Debug for Backends<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Backends")
    }
}

/// A parsed request.
#[derive(Debug, Clone)]
pub struct Request {
    pub env: CniEnv,
    pub conf: NetConf,
}

impl Request {
    fn ipam_request<'a>(&'a self, command: Command, plugin: &'a str) -> IpamRequest<'a> {
        IpamRequest {
            command,
            plugin,
            config: &self.conf.raw,
            container_id: self.env.container_id.as_deref(),
            netns: self.env.netns.as_deref(),
            ifname: self.env.ifname.as_deref(),
            args: &self.env.args,
            path: &self.env.path,
        }
    }
}

/// Runs one command. `Ok(Some(json))` is printed on stdout.
pub fn run(
    req: &Request,
    node: &Node,
    b: &mut Backends<'_>,
    log: &Logger,
) -> Result<Option<serde_json::Value>, CniError> {
    if req.conf.ipam.is_some() && req.env.path.is_empty() && req.env.command != Command::Version {
        return Err(CniError::new(
            code::INVALID_ENV,
            "CNI_PATH is required to find the IPAM plugin",
        ));
    }
    match req.env.command {
        Command::Add => add::add(req, node, b, log).map(|r| Some(r.render(req.conf.cni_version))),
        Command::Del => del::del(req, node, b, log).map(|_| None),
        Command::Check => check::check(req, node, b, log).map(|_| None),
        Command::Status => status::status(req, node, b, log).map(|_| None),
        Command::Gc => gc::gc(req, node, b, log).map(|_| None),
        Command::Version => Ok(Some(CniVersion::version_info())),
    }
}

/// The device a config names (VF or soft RDMA device), reading the
/// device-info file if that is where it is. Errors are config errors (code 7).
pub fn device_key(conf: &NetConf) -> Result<DeviceKey, CniError> {
    match &conf.device {
        DeviceRef::Pci { addr, .. } => Ok(DeviceKey::Pci(*addr)),
        DeviceRef::Soft { name, .. } => Ok(DeviceKey::Soft(name.clone())),
        DeviceRef::InfoFile(path) => crate::device_info::read(path)
            .map(|d| DeviceKey::Pci(d.pci_address))
            .map_err(|e| {
                CniError::new(
                    code::INVALID_CONFIG,
                    format!("runtimeConfig.CNIDeviceInfoFile: {e}"),
                )
            }),
        DeviceRef::Missing => Err(CniError::new(
            code::INVALID_CONFIG,
            "no VF given: set deviceID (a VF PCI address or a soft RDMA device name; or runtimeConfig.deviceID, pciBusID, runtimeConfig.CNIDeviceInfoFile)",
        )),
    }
}

/// Opens a netns named by the runtime; errors name the path.
fn open_netns(path: &Path) -> Result<Netns, CniError> {
    Netns::open(path).map_err(|e| CniError::new(code::INVALID_ENV, format!("CNI_NETNS: {e}")))
}
