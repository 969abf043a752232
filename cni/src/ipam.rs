//! The IPAM delegate: `ipam.type` found on `CNI_PATH`, executed with the
//! request's environment and the full configuration on stdin. The delegate
//! is called once, in the best version both sides speak (Debian's host-local
//! speaks up to 1.0.0): its `supportedVersions` are asked once per binary and
//! remembered, keyed by the binary's path, size and mtime.

use crate::protocol::{CniArgs, CniError, CniResult, CniVersion, Command};
use crate::state::write_atomic;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
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

    /// Starts `req` without waiting for it, so the caller can move the
    /// netdev meanwhile (a delegate is a process start; a netns move waits
    /// on the kernel: neither needs the other). Default: runs it now.
    fn start(&mut self, req: &IpamRequest<'_>) -> Pending {
        Pending::done(self.exec(req))
    }

    /// `req.plugin`'s `supportedVersions` from an earlier `VERSION`, when
    /// the binary has not changed since. `None`: ask it.
    fn known_versions(&mut self, _req: &IpamRequest<'_>) -> Option<Vec<String>> {
        None
    }

    /// Remembers what `req.plugin` answered to `VERSION`.
    fn remember_versions(&mut self, _req: &IpamRequest<'_>, _versions: &[String]) {}
}

/// A delegate call started by [`IpamDelegate::start`]: [`Pending::wait`]
/// gives its output as [`IpamDelegate::exec`] would have.
pub struct Pending(Box<dyn FnOnce() -> Result<Vec<u8>, IpamError>>);

impl Pending {
    /// A call that already finished.
    pub fn done(r: Result<Vec<u8>, IpamError>) -> Pending {
        Pending(Box::new(move || r))
    }

    /// A call whose outcome `f` waits for.
    pub fn later(f: impl FnOnce() -> Result<Vec<u8>, IpamError> + 'static) -> Pending {
        Pending(Box::new(f))
    }

    pub fn wait(self) -> Result<Vec<u8>, IpamError> {
        (self.0)()
    }
}

impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Pending")
    }
}

/// Delegates known not to touch the interface, so they may run while it
/// moves. `dhcp` is not one: it runs DHCP on `CNI_IFNAME` inside the pod's
/// netns, so ADD waits for the link to be there (and DEL for it to leave).
pub fn runs_without_the_link(plugin: &str) -> bool {
    matches!(plugin, "host-local" | "static" | "whereabouts")
}

/// Whether `plugin` is a bare file name (no `/`, not `.` or `..`): what
/// may be looked up on `CNI_PATH`. `Path::join` with an absolute name
/// would replace the directory.
pub fn is_bare_name(plugin: &str) -> bool {
    !plugin.is_empty()
        && !plugin.contains('/')
        && !plugin.contains('\0')
        && plugin != "."
        && plugin != ".."
}

/// Finds `plugin` (a bare file name, else not found) on `path`.
pub fn find_plugin(plugin: &str, path: &[PathBuf]) -> Result<PathBuf, IpamError> {
    if !is_bare_name(plugin) {
        return Err(IpamError::NotFound {
            plugin: plugin.into(),
            path: "(not a bare file name: never looked up)".into(),
        });
    }
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

/// What identifies a delegate binary's build: a replaced binary (package
/// upgrade) differs in size or mtime and is asked again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Stamp {
    size: u64,
    mtime_sec: i64,
    mtime_nsec: i64,
}

impl Stamp {
    fn of(bin: &Path) -> Option<Stamp> {
        let m = std::fs::metadata(bin).ok()?;
        Some(Stamp {
            size: m.size(),
            mtime_sec: m.mtime(),
            mtime_nsec: m.mtime_nsec(),
        })
    }
}

/// One entry of the versions cache file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct KnownVersions {
    #[serde(flatten)]
    stamp: Stamp,
    supported_versions: Vec<String>,
}

/// The real delegate: exec. Versions are remembered for the life of the
/// value and, with [`ExecIpam::with_versions_file`], across calls in a
/// small JSON file (`{binary path: {size, mtimeSec, mtimeNsec,
/// supportedVersions}}`); a missing, corrupt or unwritable file only costs
/// a `VERSION` run.
#[derive(Debug, Default)]
pub struct ExecIpam {
    file: Option<PathBuf>,
    memo: BTreeMap<PathBuf, KnownVersions>,
}

impl ExecIpam {
    /// Remembers versions in `file` (kroce-cni: `<stateDir>/ipam-versions.json`).
    pub fn with_versions_file(file: impl Into<PathBuf>) -> ExecIpam {
        ExecIpam {
            file: Some(file.into()),
            memo: BTreeMap::new(),
        }
    }

    /// The cache file's entries; a corrupt file counts as empty (it is
    /// rewritten by the next `remember_versions`).
    fn load(&self) -> BTreeMap<PathBuf, KnownVersions> {
        self.file
            .as_deref()
            .and_then(|f| std::fs::read(f).ok())
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    }
}

impl IpamDelegate for ExecIpam {
    fn known_versions(&mut self, req: &IpamRequest<'_>) -> Option<Vec<String>> {
        let bin = find_plugin(req.plugin, req.path).ok()?;
        let stamp = Stamp::of(&bin)?;
        let fresh = |k: &KnownVersions| k.stamp == stamp;
        if let Some(k) = self.memo.get(&bin).filter(|k| fresh(k)) {
            return Some(k.supported_versions.clone());
        }
        let k = self.load().remove(&bin).filter(fresh)?;
        let v = k.supported_versions.clone();
        self.memo.insert(bin, k);
        Some(v)
    }

    fn remember_versions(&mut self, req: &IpamRequest<'_>, versions: &[String]) {
        let Ok(bin) = find_plugin(req.plugin, req.path) else {
            return;
        };
        let Some(stamp) = Stamp::of(&bin) else {
            return;
        };
        let k = KnownVersions {
            stamp,
            supported_versions: versions.to_vec(),
        };
        self.memo.insert(bin.clone(), k.clone());
        if let Some(file) = &self.file {
            let mut all = self.load();
            all.insert(bin, k);
            // Best effort: without the file the next call asks VERSION again.
            if let Ok(bytes) = serde_json::to_vec_pretty(&all) {
                let _ = write_atomic(file, &bytes);
            }
        }
    }

    fn exec(&mut self, req: &IpamRequest<'_>) -> Result<Vec<u8>, IpamError> {
        spawn(req)?.finish()
    }

    fn start(&mut self, req: &IpamRequest<'_>) -> Pending {
        match spawn(req) {
            Ok(running) => Pending::later(move || running.finish()),
            Err(e) => Pending::done(Err(e)),
        }
    }
}

/// A delegate process with its config written to its stdin.
struct Running {
    child: std::process::Child,
    plugin: String,
    command: &'static str,
}

fn spawn(req: &IpamRequest<'_>) -> Result<Running, IpamError> {
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
    let input = serde_json::to_vec(req.config).map_err(|e| exec_err(std::io::Error::other(e)))?;
    let mut child = cmd.spawn().map_err(exec_err)?;
    // The config is far below a pipe's buffer: this write does not wait
    // for the delegate to read it.
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
    Ok(Running {
        child,
        plugin: req.plugin.into(),
        command: req.command.as_str(),
    })
}

impl Running {
    fn finish(self) -> Result<Vec<u8>, IpamError> {
        let plugin = self.plugin;
        let out = self
            .child
            .wait_with_output()
            .map_err(|source| IpamError::Exec {
                plugin: plugin.clone(),
                source,
            })?;
        if out.status.success() {
            return Ok(out.stdout);
        }
        let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
        match serde_json::from_slice::<Value>(&out.stdout) {
            Ok(v) if v.get("code").and_then(Value::as_u64).is_some() => Err(IpamError::Plugin {
                plugin,
                command: self.command,
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
                plugin,
                command: self.command,
                reason: format!(
                    "exited with {} and no error object (stdout {:?}, stderr {stderr:?})",
                    out.status,
                    String::from_utf8_lossy(&out.stdout)
                ),
            }),
        }
    }
}

/// The versions the delegate speaks: remembered, or asked (and remembered).
pub fn delegate_versions(
    d: &mut dyn IpamDelegate,
    req: &IpamRequest<'_>,
) -> Result<Vec<String>, IpamError> {
    match d.known_versions(req) {
        Some(v) => Ok(v),
        None => ask_versions(d, req),
    }
}

/// Runs the delegate's `VERSION` and remembers the answer.
fn ask_versions(d: &mut dyn IpamDelegate, req: &IpamRequest<'_>) -> Result<Vec<String>, IpamError> {
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
    let versions: Vec<String> = v
        .get("supportedVersions")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    d.remember_versions(req, &versions);
    Ok(versions)
}

/// Runs `req` once, in the highest version both the config and the
/// delegate speak (the result is read in any layout). The delegate's
/// versions are remembered ones or asked once; when a remembered list turns
/// out wrong (the delegate refuses, code 1) it is asked again and the call
/// retried.
pub fn exec_negotiated(
    d: &mut dyn IpamDelegate,
    req: &IpamRequest<'_>,
) -> Result<Vec<u8>, IpamError> {
    let started = start_negotiated(d, req);
    finish_negotiated(d, req, started)
}

/// [`exec_negotiated`] started: the delegate runs while the caller works.
#[derive(Debug)]
pub struct Started {
    pending: Pending,
    /// The version it was started in, when that came from a remembered
    /// list (which a refusal proves stale).
    retry_unless: Option<Option<CniVersion>>,
}

fn config_version(req: &IpamRequest<'_>) -> CniVersion {
    req.config
        .get("cniVersion")
        .and_then(Value::as_str)
        .and_then(CniVersion::parse)
        .unwrap_or(CniVersion::LATEST)
}

/// `req` in version `v` (the config as it is when `v` is its own).
fn start_in(d: &mut dyn IpamDelegate, req: &IpamRequest<'_>, v: Option<CniVersion>) -> Pending {
    match v {
        Some(v) if v != config_version(req) => {
            let mut cfg = req.config.clone();
            cfg["cniVersion"] = Value::String(v.as_str().into());
            d.start(&IpamRequest {
                config: &cfg,
                ..req.clone()
            })
        }
        _ => d.start(req),
    }
}

/// Starts `req` in the best common version (asking `VERSION` first only
/// when the delegate's versions are not remembered).
pub fn start_negotiated(d: &mut dyn IpamDelegate, req: &IpamRequest<'_>) -> Started {
    let ours = config_version(req);
    let (theirs, remembered) = match d.known_versions(req) {
        Some(v) => (v, true),
        // A delegate that cannot say (or is missing) gets the config as is
        // and its own error, if any, tells why.
        None => match ask_versions(d, req) {
            Ok(v) => (v, false),
            Err(_) => {
                return Started {
                    pending: d.start(req),
                    retry_unless: None,
                };
            }
        },
    };
    let best = ours.negotiate(theirs.iter().map(String::as_str));
    Started {
        pending: start_in(d, req, best),
        retry_unless: remembered.then_some(best),
    }
}

/// Waits for a [`start_negotiated`] call (same `req`), retrying once when
/// a remembered version list proved stale.
pub fn finish_negotiated(
    d: &mut dyn IpamDelegate,
    req: &IpamRequest<'_>,
    started: Started,
) -> Result<Vec<u8>, IpamError> {
    match (started.pending.wait(), started.retry_unless) {
        (Err(e), Some(best))
            if e.delegate_code() == Some(crate::protocol::code::INCOMPATIBLE_VERSION) =>
        {
            let theirs = ask_versions(d, req)?;
            let again = config_version(req).negotiate(theirs.iter().map(String::as_str));
            if again == best {
                return Err(e);
            }
            start_in(d, req, again).wait()
        }
        (other, _) => other,
    }
}

/// Whether the delegate speaks 1.1.0 (GC and STATUS exist there only).
pub fn speaks_1_1(d: &mut dyn IpamDelegate, req: &IpamRequest<'_>) -> Result<bool, IpamError> {
    Ok(delegate_versions(d, req)?.iter().any(|v| v == "1.1.0"))
}

/// ADD: the delegate's result.
pub fn add(d: &mut dyn IpamDelegate, req: &IpamRequest<'_>) -> Result<CniResult, IpamError> {
    let started = start_negotiated(d, req);
    finish_add(d, req, started)
}

/// ADD started with [`start_negotiated`]: the delegate's result.
pub fn finish_add(
    d: &mut dyn IpamDelegate,
    req: &IpamRequest<'_>,
    started: Started,
) -> Result<CniResult, IpamError> {
    let out = finish_negotiated(d, req, started)?;
    let v: Value = serde_json::from_slice(&out).map_err(|e| IpamError::BadOutput {
        plugin: req.plugin.into(),
        command: "ADD",
        reason: format!("result is not JSON: {e}"),
    })?;
    CniResult::parse(&v).map_err(|e| IpamError::BadOutput {
        plugin: req.plugin.into(),
        command: "ADD",
        reason: e.to_string(),
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
        // Asked once (nothing remembered here), then one run in 1.0.0.
        assert_eq!(d.0, vec!["VERSION:1.1.0", "ADD:1.0.0"]);
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
            return skip_without_host_local();
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
        let out = ExecIpam::default().exec(&req).unwrap();
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert!(v["supportedVersions"].is_array(), "{v}");
    }

    #[test]
    fn only_bare_names_are_looked_up() {
        // Path::join with an absolute name would give that name back.
        let path = vec![PathBuf::from("/usr/lib/cni")];
        for bad in ["/bin/sh", "../../bin/sh", "..", ".", "", "a/b"] {
            let e = find_plugin(bad, &path).unwrap_err();
            assert!(matches!(e, IpamError::NotFound { .. }), "{bad}: {e}");
            assert!(e.to_string().contains("bare"), "{bad}: {e}");
        }
        assert!(is_bare_name("host-local"));
    }

    #[test]
    fn missing_plugin_is_named() {
        let e = find_plugin("nope-ipam", &[PathBuf::from("/nonexistent")]).unwrap_err();
        assert!(e.to_string().contains("nope-ipam") && e.to_string().contains("/nonexistent"));
    }

    /// Without Debian's host-local the delegate tests cannot run: said
    /// outside CI, a failure under `CI` (ci/setup.sh installs it there).
    fn skip_without_host_local() {
        let why = "needs /usr/lib/cni/host-local (containernetworking-plugins)";
        assert!(
            std::env::var_os("CI").is_none(),
            "CI is set but the test {why}"
        );
        println!("skipped: {why}");
    }

    /// A CNI_PATH whose `host-local` is a script that logs each run's
    /// CNI_COMMAND and execs Debian's host-local.
    struct Wrapped {
        dir: tempfile::TempDir,
        real: PathBuf,
    }

    impl Wrapped {
        fn new() -> Option<Wrapped> {
            let real = find_plugin("host-local", &[PathBuf::from("/usr/lib/cni")]).ok()?;
            let w = Wrapped {
                dir: tempfile::tempdir().unwrap(),
                real,
            };
            std::fs::create_dir(w.dir.path().join("bin")).unwrap();
            w.install("");
            Some(w)
        }

        /// (Re)places the wrapper; `extra` changes its size. `install` writes
        /// it in a child process, so no fd of ours open for writing can make
        /// a concurrent spawn fail with ETXTBSY.
        fn install(&self, extra: &str) {
            let src = self.dir.path().join("wrapper.src");
            let script = format!(
                "#!/bin/sh\n{extra}echo \"$CNI_COMMAND\" >> {}\nexec {} \"$@\"\n",
                self.dir.path().join("runs.log").display(),
                self.real.display()
            );
            std::fs::write(&src, script).unwrap();
            let st = std::process::Command::new("install")
                .args(["-m", "0755"])
                .arg(&src)
                .arg(self.dir.path().join("bin/host-local"))
                .status()
                .unwrap();
            assert!(st.success());
        }

        fn path(&self) -> Vec<PathBuf> {
            vec![self.dir.path().join("bin")]
        }

        fn cache(&self) -> PathBuf {
            self.dir.path().join("state/ipam-versions.json")
        }

        /// The runs since the last call.
        fn runs(&self) -> Vec<String> {
            let log = self.dir.path().join("runs.log");
            let s = std::fs::read_to_string(&log).unwrap_or_default();
            let _ = std::fs::remove_file(&log);
            s.lines().map(str::to_string).collect()
        }

        fn config(&self) -> Value {
            serde_json::json!({
                "cniVersion": "1.1.0", "name": "n", "type": "kroce-cni",
                "ipam": {
                    "type": "host-local",
                    "dataDir": self.dir.path().join("leases"),
                    "ranges": [[{"subnet": "10.99.0.0/24"}]],
                },
            })
        }

        /// ADD then DEL of `container` with a fresh `ExecIpam` each (as
        /// each kroce-cni process has): the runs of each.
        fn add_del(&self, container: &str) -> (Vec<String>, Vec<String>) {
            let cfg = self.config();
            let args = CniArgs::default();
            let path = self.path();
            let netns = PathBuf::from("/proc/self/ns/net");
            let mut req = IpamRequest {
                command: Command::Add,
                plugin: "host-local",
                config: &cfg,
                container_id: Some(container),
                netns: Some(&netns),
                ifname: Some("net1"),
                args: &args,
                path: &path,
            };
            let r = add(&mut ExecIpam::with_versions_file(self.cache()), &req).unwrap();
            assert!(
                r.ips[0].address.to_string().starts_with("10.99.0."),
                "{r:?}"
            );
            let add_runs = self.runs();
            req.command = Command::Del;
            exec_negotiated(&mut ExecIpam::with_versions_file(self.cache()), &req).unwrap();
            (add_runs, self.runs())
        }
    }

    #[test]
    fn one_delegate_run_per_ipam_call_once_versions_are_known() {
        let Some(w) = Wrapped::new() else {
            return skip_without_host_local();
        };
        // Unknown binary: asked once, then called once in 1.0.0.
        let (a, d) = w.add_del("c1");
        assert_eq!(a, ["VERSION", "ADD"]);
        assert_eq!(d, ["DEL"]);
        // Known from the file, by later processes: one run per call.
        for c in ["c2", "c3"] {
            let (a, d) = w.add_del(c);
            assert_eq!(a, ["ADD"], "{c}");
            assert_eq!(d, ["DEL"], "{c}");
        }
        let cache: Value = serde_json::from_slice(&std::fs::read(w.cache()).unwrap()).unwrap();
        let bin = w.path()[0].join("host-local").display().to_string();
        assert!(
            cache[&bin]["supportedVersions"]
                .as_array()
                .is_some_and(|a| a.iter().any(|v| v == "1.0.0")),
            "{cache}"
        );
    }

    #[test]
    fn a_replaced_delegate_is_asked_again() {
        let Some(w) = Wrapped::new() else {
            return skip_without_host_local();
        };
        assert_eq!(w.add_del("c1").0, ["VERSION", "ADD"]);
        assert_eq!(w.add_del("c2").0, ["ADD"]);
        // Another size (and mtime): another build, whatever it speaks.
        w.install("# upgraded\n");
        let (a, d) = w.add_del("c3");
        assert_eq!(a, ["VERSION", "ADD"]);
        assert_eq!(d, ["DEL"]);
        assert_eq!(w.add_del("c4").0, ["ADD"]);
    }

    #[test]
    fn a_corrupt_versions_file_is_ignored_and_rewritten() {
        let Some(w) = Wrapped::new() else {
            return skip_without_host_local();
        };
        std::fs::create_dir_all(w.cache().parent().unwrap()).unwrap();
        std::fs::write(w.cache(), b"{\"/usr/lib/cni/host-local\": [tr").unwrap();
        let (a, d) = w.add_del("c1");
        assert_eq!(a, ["VERSION", "ADD"]);
        assert_eq!(d, ["DEL"]);
        let cache: Value = serde_json::from_slice(&std::fs::read(w.cache()).unwrap()).unwrap();
        assert!(cache.is_object(), "{cache}");
        assert_eq!(w.add_del("c2").0, ["ADD"]);
        // An entry of the wrong shape for this binary is a stale one.
        let bin = w.path()[0].join("host-local").display().to_string();
        std::fs::write(
            w.cache(),
            serde_json::json!({ bin: {"size": "big"} }).to_string(),
        )
        .unwrap();
        assert_eq!(w.add_del("c3").0, ["VERSION", "ADD"]);
    }

    /// Remembers in memory; refuses what it does not speak.
    struct Remembering {
        speaks: Vec<String>,
        known: Option<Vec<String>>,
        runs: Vec<String>,
    }
    impl IpamDelegate for Remembering {
        fn exec(&mut self, req: &IpamRequest<'_>) -> Result<Vec<u8>, IpamError> {
            let v = req.config["cniVersion"].as_str().unwrap_or_default();
            self.runs.push(format!("{}:{v}", req.command.as_str()));
            if req.command == Command::Version {
                return Ok(serde_json::to_vec(
                    &serde_json::json!({"cniVersion": "1.0.0", "supportedVersions": self.speaks}),
                )
                .unwrap());
            }
            if !self.speaks.iter().any(|s| s == v) {
                return Err(IpamError::Plugin {
                    plugin: "r".into(),
                    command: req.command.as_str(),
                    error: CniError::new(1, "incompatible"),
                });
            }
            Ok(br#"{"cniVersion":"1.0.0","ips":[{"address":"10.0.0.2/24"}]}"#.to_vec())
        }
        fn known_versions(&mut self, _: &IpamRequest<'_>) -> Option<Vec<String>> {
            self.known.clone()
        }
        fn remember_versions(&mut self, _: &IpamRequest<'_>, v: &[String]) {
            self.known = Some(v.to_vec());
        }
    }

    #[test]
    fn a_wrong_remembered_list_is_asked_again_and_retried() {
        let mut d = Remembering {
            speaks: vec!["0.4.0".into(), "1.0.0".into()],
            known: Some(vec!["1.1.0".into()]),
            runs: Vec::new(),
        };
        let cfg =
            serde_json::json!({"cniVersion":"1.1.0","name":"n","type":"x","ipam":{"type":"r"}});
        let args = CniArgs::default();
        let req = IpamRequest {
            command: Command::Add,
            plugin: "r",
            config: &cfg,
            container_id: Some("c"),
            netns: None,
            ifname: Some("net1"),
            args: &args,
            path: &[],
        };
        add(&mut d, &req).unwrap();
        assert_eq!(d.runs, ["ADD:1.1.0", "VERSION:1.1.0", "ADD:1.0.0"]);
        assert_eq!(d.known.as_deref(), Some(&d.speaks[..]));
        d.runs.clear();
        add(&mut d, &req).unwrap();
        assert_eq!(d.runs, ["ADD:1.0.0"]);
    }
}
