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
use crate::protocol::{CniEnv, CniError, CniVersion, Command, code};
use crate::rdma::RdmaControl;
use crate::state::{DEFAULT_STATE_DIR, StateDir};
use crate::vf::DeviceKey;
use crate::vf_config::VfConfig;
use kroce_contracts::cni_env;
use kroce_netlink::netns::Netns;
use sriov_helpers::HostRoot;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use release::{ReleaseIpam, Seen, find_host_link, is_our_link};

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

/// Where the node is: sysfs, procfs, `/dev`, the state dir and the log
/// file. From the plugin's environment (set by whoever installs it) or the
/// compiled-in defaults; never from the network config, which is tenant
/// input. kroce-nri builds one from its own flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Roots {
    pub sysfs: PathBuf,
    pub proc: PathBuf,
    pub dev: PathBuf,
    pub state_dir: PathBuf,
    /// Where `logLevel` lines go besides stderr; `None`: stderr only.
    pub log_file: Option<PathBuf>,
}

impl Default for Roots {
    /// The real node: `/sys`, `/proc`, `/dev`, `/var/lib/cni/kroce`.
    fn default() -> Roots {
        Roots::under(Path::new("/"))
    }
}

impl Roots {
    /// `sys/`, `proc/`, `dev/` under `host`; the default state dir.
    pub fn under(host: &Path) -> Roots {
        Roots {
            sysfs: host.join("sys"),
            proc: host.join("proc"),
            dev: host.join("dev"),
            state_dir: PathBuf::from(DEFAULT_STATE_DIR),
            log_file: None,
        }
    }

    /// From `KROCE_CNI_*` (see [`kroce_contracts::cni_env`]), defaults for
    /// those unset. A set variable that is not an absolute path is an
    /// error naming it (code 4), not a silent default.
    pub fn from_env(env: impl Fn(&str) -> Option<String>) -> Result<Roots, CniError> {
        let get = |key: &str| -> Result<Option<PathBuf>, CniError> {
            match env(key) {
                None => Ok(None),
                Some(v) if v.starts_with('/') && !v.contains('\0') => Ok(Some(PathBuf::from(v))),
                Some(v) => Err(CniError::new(
                    code::INVALID_ENV,
                    format!("{key} {v:?} must be an absolute path"),
                )),
            }
        };
        let host = get(cni_env::HOST_ROOT)?.unwrap_or_else(|| PathBuf::from("/"));
        let mut r = Roots::under(&host);
        if let Some(p) = get(cni_env::SYSFS_ROOT)? {
            r.sysfs = p;
        }
        if let Some(p) = get(cni_env::PROC_ROOT)? {
            r.proc = p;
        }
        if let Some(p) = get(cni_env::STATE_DIR)? {
            r.state_dir = p;
        }
        r.log_file = get(cni_env::LOG_FILE)?;
        Ok(r)
    }
}

impl Node {
    /// The node at `roots`; `host_netns` is the plugin's own netns.
    pub fn new(roots: &Roots, host_netns: Netns) -> Node {
        Node {
            host_root: HostRoot::with_paths(
                roots.sysfs.clone(),
                roots.proc.clone(),
                roots.dev.clone(),
            ),
            state: StateDir::new(roots.state_dir.clone()),
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
    /// The IPAM plugin releases run in this call (see [`ReleaseIpam`]).
    pub fn release_ipam(&self) -> ReleaseIpam<'_> {
        ReleaseIpam {
            plugin: self.conf.ipam.as_ref().map(|i| i.plugin.as_str()),
            path: &self.env.path,
        }
    }

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
    if req.env.command == Command::Version {
        return Ok(Some(CniVersion::version_info()));
    }
    if req.conf.ipam.is_some() && req.env.path.is_empty() {
        return Err(CniError::new(
            code::INVALID_ENV,
            "CNI_PATH is required to find the IPAM plugin",
        ));
    }
    // Before anything in it is read or written: claims say what a release
    // restores, so only root may write where they are.
    let not_private = |e: crate::state::StateError| {
        let c = if req.env.command == Command::Status {
            code::NOT_AVAILABLE
        } else {
            code::IO
        };
        CniError::new(c, e.to_string())
    };
    node.state.ensure_private().map_err(not_private)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn roots_come_from_the_environment_or_the_defaults() {
        let none = Roots::from_env(|_| None).unwrap();
        assert_eq!(none, Roots::default());
        assert_eq!(none.sysfs, Path::new("/sys"));
        assert_eq!(none.state_dir, Path::new(DEFAULT_STATE_DIR));
        assert_eq!(none.log_file, None);
        let env: HashMap<&str, &str> = HashMap::from([
            (cni_env::HOST_ROOT, "/host"),
            (cni_env::PROC_ROOT, "/p"),
            (cni_env::STATE_DIR, "/s"),
            (cni_env::LOG_FILE, "/l/kroce-cni.log"),
        ]);
        let r = Roots::from_env(|k| env.get(k).map(|v| v.to_string())).unwrap();
        assert_eq!(r.sysfs, Path::new("/host/sys"));
        assert_eq!(r.dev, Path::new("/host/dev"));
        assert_eq!(r.proc, Path::new("/p"));
        assert_eq!(r.state_dir, Path::new("/s"));
        assert_eq!(r.log_file.as_deref(), Some(Path::new("/l/kroce-cni.log")));
        for key in cni_env::ALL {
            let e =
                Roots::from_env(|k| (k == *key).then(|| "relative/dir".to_string())).unwrap_err();
            assert_eq!(e.code, code::INVALID_ENV, "{key}: {e}");
            assert!(e.msg.contains(key) && e.msg.contains("relative/dir"), "{e}");
        }
    }
}
