//! What the binary does with one invocation: environment and stdin in,
//! stdout text and exit code out, with the real backends.

use crate::commands::{self, Backends, Node, Request, Roots};
use crate::config::{self, peek_version};
use crate::ipam::ExecIpam;
use crate::links::RtnlOpener;
use crate::log::{LogLevel, Logger};
use crate::protocol::{CniEnv, CniError, CniVersion, Command, code};
use crate::rdma::NetlinkRdma;
use crate::vf_config::RtnlVfConfig;
use kroce_netlink::netns::Netns;

/// The result of one invocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub stdout: String,
    pub exit_code: i32,
}

fn error_outcome(e: &CniError, version: CniVersion) -> Outcome {
    Outcome {
        stdout: e.to_json(version.as_str()).to_string(),
        exit_code: 1,
    }
}

/// Parses the request and runs it with the real (netlink, exec) backends
/// in the calling thread's netns, which is the host netns.
pub fn execute(env: &dyn Fn(&str) -> Option<String>, stdin: &[u8]) -> Outcome {
    let version = peek_version(stdin).unwrap_or(CniVersion::LATEST);
    let cni_env = match CniEnv::parse(env) {
        Ok(e) => e,
        Err(e) => return error_outcome(&e, version),
    };
    if cni_env.command == Command::Version {
        return Outcome {
            stdout: CniVersion::version_info().to_string(),
            exit_code: 0,
        };
    }
    let conf = match config::parse(stdin, &cni_env.args) {
        Ok(c) => c,
        Err(e) => return error_outcome(&e.into(), version),
    };
    let version = conf.cni_version;
    // Roots and the log file come from the environment the runtime gives
    // its plugins (set by the installer), never from the config.
    let roots = match Roots::from_env(env) {
        Ok(r) => r,
        Err(e) => return error_outcome(&e, version),
    };
    let mut log = match Logger::new(conf.log_level, roots.log_file.as_deref(), true) {
        Ok(l) => l,
        Err(e) => {
            let fallback =
                Logger::new(LogLevel::Warn, None, true).unwrap_or_else(|_| Logger::quiet());
            fallback.warn(&format!(
                "cannot open {} {}: {e}",
                kroce_contracts::cni_env::LOG_FILE,
                roots
                    .log_file
                    .as_deref()
                    .unwrap_or(std::path::Path::new(""))
                    .display()
            ));
            fallback
        }
    };
    log.set_context(format!(
        "{} {}/{}",
        cni_env.command.as_str(),
        cni_env.container_id.as_deref().unwrap_or("-"),
        cni_env.ifname.as_deref().unwrap_or("-")
    ));
    let host_netns = match Netns::current() {
        Ok(n) => n,
        Err(e) => {
            return error_outcome(
                &CniError::new(code::IO, format!("cannot open this process's netns: {e}")),
                version,
            );
        }
    };
    let node = Node::new(&roots, host_netns);
    let req = Request { env: cni_env, conf };
    let mut links = RtnlOpener;
    let mut vf = RtnlVfConfig::new(None);
    let mut rdma = NetlinkRdma::new(None);
    let mut ipam =
        ExecIpam::with_versions_file(node.state.root().join(crate::state::IPAM_VERSIONS_FILE));
    let mut b = Backends {
        links: &mut links,
        vf: &mut vf,
        rdma: &mut rdma,
        ipam: &mut ipam,
    };
    match commands::run(&req, &node, &mut b, &log) {
        Ok(Some(v)) => Outcome {
            stdout: v.to_string(),
            exit_code: 0,
        },
        Ok(None) => Outcome {
            stdout: String::new(),
            exit_code: 0,
        },
        Err(e) => {
            log.error(&e.to_string());
            error_outcome(&e, version)
        }
    }
}
