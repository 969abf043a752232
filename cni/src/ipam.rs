//! The IPAM delegate: `ipam.type` found on `CNI_PATH`, executed with the
//! request's environment and the full configuration on stdin. Versions are
//! negotiated when the delegate is older than the config (Debian's
//! host-local speaks up to 1.0.0).

use crate::protocol::{CniArgs, CniError, CniResult, CniVersion, Command};
use serde_json::Value;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;

/// One delegate invocation.
#[derive(Debug, Clone)]
pub struct IpamRequest<'a> {
    pub command: Command,
    pub plugin: &'a str,
    pub config: &'a Value,
    pub container_id: Option<&'a str>,
    pub netns: Option<&'a Path>,
    pub ifname: Option<&'a str>,
    pub args: &'a CniArgs,
    pub path: &'a [PathBuf],
}

#[derive(Debug, thiserror::Error)]
pub enum IpamError {
    #[error("IPAM plugin {plugin:?} not found in CNI_PATH {path:?}")]
    NotFound { plugin: String, path: String },
    #[error("cannot run IPAM plugin {plugin}: {source}")]
    Exec {
        plugin: String,
        #[source]
        source: std::io::Error,
    },
    #[error("IPAM plugin {plugin} {command} failed: {error}")]
    Plugin {
        plugin: String,
        command: &'static str,
        error: CniError,
    },
    #[error("IPAM plugin {plugin} {command}: {reason}")]
    BadOutput {
        plugin: String,
        command: &'static str,
        reason: String,
    },
}

impl IpamError {
    /// The delegate's own error code, when it answered with one.
    pub fn delegate_code(&self) -> Option<u32> {
        match self {
            IpamError::Plugin { error, .. } => Some(error.code),
            _ => None,
        }
    }
}

/// Runs a delegate. `Ok(stdout)` on success.
pub trait IpamDelegate {
    fn exec(&mut self, req: &IpamRequest<'_>) -> Result<Vec<u8>, IpamError>;
}

/// Finds `plugin` on `path`.
pub fn find_plugin(plugin: &str, path: &[PathBuf]) -> Result<PathBuf, IpamError> {
    path.iter()
        .map(|d| d.join(plugin))
        .find(|p| p.is_file())
        .ok_or_else(|| IpamError::NotFound {
            plugin: plugin.into(),
            path: path
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(":"),
        })
}

/// The real delegate: exec.
#[derive(Debug, Default)]
pub struct ExecIpam;

impl IpamDelegate for ExecIpam {
    fn exec(&mut self, req: &IpamRequest<'_>) -> Result<Vec<u8>, IpamError> {
        let bin = find_plugin(req.plugin, req.path)?;
        let exec_err = |source| IpamError::Exec {
            plugin: req.plugin.into(),
            source,
        };
        let mut cmd = std::process::Command::new(&bin);
        cmd.env("CNI_COMMAND", req.command.as_str())
            .env("CNI_ARGS", req.args.to_env_string())
            .env(
                "CNI_PATH",
                std::env::join_paths(req.path).map_err(|e| exec_err(std::io::Error::other(e)))?,
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in [
            ("CNI_CONTAINERID", req.container_id.map(str::to_string)),
            ("CNI_NETNS", req.netns.map(|p| p.display().to_string())),
            ("CNI_IFNAME", req.ifname.map(str::to_string)),
        ] {
            match v {
                Some(v) => cmd.env(k, v),
                None => cmd.env_remove(k),
            };
        }
        let mut child = cmd.spawn().map_err(exec_err)?;
        let input =
            serde_json::to_vec(req.config).map_err(|e| exec_err(std::io::Error::other(e)))?;
        if let Some(mut stdin) = child.stdin.take() {
            match stdin.write_all(&input) {
                Ok(()) => {}
                // A delegate need not read its config (host-local's VERSION
                // does not) and may have exited before we wrote it: its exit
                // status and output decide, as with Go's os/exec (which
                // ignores EPIPE on stdin) in libcni.
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
                Err(e) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(exec_err(e));
                }
            }
        }
        let out = child.wait_with_output().map_err(exec_err)?;
        if out.status.success() {
            return Ok(out.stdout);
        }
        let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
        match serde_json::from_slice::<Value>(&out.stdout) {
            Ok(v) if v.get("code").and_then(Value::as_u64).is_some() => Err(IpamError::Plugin {
                plugin: req.plugin.into(),
                command: req.command.as_str(),
                error: CniError {
                    code: v["code"]
                        .as_u64()
                        .and_then(|c| u32::try_from(c).ok())
                        .unwrap_or(999),
                    msg: v
                        .get("msg")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_string(),
                    details: v.get("details").and_then(Value::as_str).map(str::to_string),
                },
            }),
            _ => Err(IpamError::BadOutput {
                plugin: req.plugin.into(),
                command: req.command.as_str(),
                reason: format!(
                    "exited with {} and no error object (stdout {:?}, stderr {stderr:?})",
                    out.status,
                    String::from_utf8_lossy(&out.stdout)
                ),
            }),
        }
    }
}

/// The versions the delegate says it speaks.
pub fn delegate_versions(
    d: &mut dyn IpamDelegate,
    req: &IpamRequest<'_>,
) -> Result<Vec<String>, IpamError> {
    let probe = serde_json::json!({"cniVersion": req.config.get("cniVersion").cloned().unwrap_or(Value::Null)});
    let vreq = IpamRequest {
        command: Command::Version,
        config: &probe,
        container_id: None,
        netns: None,
        ifname: None,
        ..req.clone()
    };
    let out = d.exec(&vreq)?;
    let v: Value = serde_json::from_slice(&out).map_err(|e| IpamError::BadOutput {
        plugin: req.plugin.into(),
        command: "VERSION",
        reason: e.to_string(),
    })?;
    Ok(v.get("supportedVersions")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default())
}

/// Runs `req`; when the delegate refuses the config's version (code 1),
/// asks it which it speaks and retries with the best common one.
pub fn exec_negotiated(
    d: &mut dyn IpamDelegate,
    req: &IpamRequest<'_>,
) -> Result<Vec<u8>, IpamError> {
    match d.exec(req) {
        Err(e) if e.delegate_code() == Some(crate::protocol::code::INCOMPATIBLE_VERSION) => {
            let ours = req
                .config
                .get("cniVersion")
                .and_then(Value::as_str)
                .and_then(CniVersion::parse)
                .unwrap_or(CniVersion::LATEST);
            let theirs = delegate_versions(d, req)?;
            let Some(best) = ours.negotiate(theirs.iter().map(String::as_str)) else {
                return Err(e);
            };
            if best == ours {
                return Err(e);
            }
            let mut cfg = req.config.clone();
            cfg["cniVersion"] = Value::String(best.as_str().into());
            d.exec(&IpamRequest {
                config: &cfg,
                ..req.clone()
            })
        }
        other => other,
    }
}

/// Whether the delegate speaks 1.1.0 (GC and STATUS exist there only).
pub fn speaks_1_1(d: &mut dyn IpamDelegate, req: &IpamRequest<'_>) -> Result<bool, IpamError> {
    Ok(delegate_versions(d, req)?.iter().any(|v| v == "1.1.0"))
}

/// ADD: the delegate's result.
pub fn add(d: &mut dyn IpamDelegate, req: &IpamRequest<'_>) -> Result<CniResult, IpamError> {
    let out = exec_negotiated(d, req)?;
    let v: Value = serde_json::from_slice(&out).map_err(|e| IpamError::BadOutput {
        plugin: req.plugin.into(),
        command: "ADD",
        reason: format!("result is not JSON: {e}"),
    })?;
    CniResult::parse(&v).map_err(|reason| IpamError::BadOutput {
        plugin: req.plugin.into(),
        command: "ADD",
        reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A delegate that only speaks 1.0.0 and records the versions it got.
    struct Old(Vec<String>);
    impl IpamDelegate for Old {
        fn exec(&mut self, req: &IpamRequest<'_>) -> Result<Vec<u8>, IpamError> {
            let v = req.config["cniVersion"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            self.0.push(format!("{}:{v}", req.command.as_str()));
            if req.command == Command::Version {
                return Ok(
                    br#"{"cniVersion":"1.0.0","supportedVersions":["0.4.0","1.0.0"]}"#.to_vec(),
                );
            }
            if v != "1.0.0" && v != "0.4.0" {
                return Err(IpamError::Plugin {
                    plugin: "old".into(),
                    command: req.command.as_str(),
                    error: CniError::new(1, "incompatible"),
                });
            }
            Ok(br#"{"cniVersion":"1.0.0","ips":[{"address":"10.0.0.2/24"}]}"#.to_vec())
        }
    }

    #[test]
    fn negotiates_down_to_the_delegate() {
        let mut d = Old(Vec::new());
        let cfg =
            serde_json::json!({"cniVersion":"1.1.0","name":"n","type":"x","ipam":{"type":"old"}});
        let args = CniArgs::default();
        let req = IpamRequest {
            command: Command::Add,
            plugin: "old",
            config: &cfg,
            container_id: Some("c"),
            netns: None,
            ifname: Some("net1"),
            args: &args,
            path: &[],
        };
        let r = add(&mut d, &req).unwrap();
        assert_eq!(r.ips[0].address.to_string(), "10.0.0.2/24");
        assert_eq!(d.0, vec!["ADD:1.1.0", "VERSION:1.1.0", "ADD:1.0.0"]);
    }

    /// host-local answers VERSION without reading its stdin and exits; a
    /// write after that exit got EPIPE and failed the call (GC and STATUS
    /// ask VERSION first: exit code 1 on a loaded machine, where the plugin
    /// is descheduled between spawn and write). A config larger than the
    /// pipe buffer makes the write outlast the delegate every time.
    #[test]
    fn delegate_that_does_not_read_its_config_is_fine() {
        let path = [PathBuf::from("/usr/lib/cni")];
        if find_plugin("host-local", &path).is_err() {
            println!("skipped: needs /usr/lib/cni/host-local (containernetworking-plugins)");
            return;
        }
        let cfg = serde_json::json!({
            "cniVersion": "1.1.0", "name": "n", "type": "kroce-cni",
            "ipam": {"type": "host-local"},
            "padding": "x".repeat(1 << 20),
        });
        let args = CniArgs::default();
        let req = IpamRequest {
            command: Command::Version,
            plugin: "host-local",
            config: &cfg,
            container_id: None,
            netns: None,
            ifname: None,
            args: &args,
            path: &path,
        };
        let out = ExecIpam.exec(&req).unwrap();
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert!(v["supportedVersions"].is_array(), "{v}");
    }

    #[test]
    fn missing_plugin_is_named() {
        let e = find_plugin("nope-ipam", &[PathBuf::from("/nonexistent")]).unwrap_err();
        assert!(e.to_string().contains("nope-ipam") && e.to_string().contains("/nonexistent"));
    }
}
