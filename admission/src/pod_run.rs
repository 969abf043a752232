//! The in-pod side of an admission test run, as data: the arguments of
//! `kroce-perftest-run` (built by the operator, parsed in the pod — one
//! type, so both ends agree), how the runner finds its RDMA device from
//! the device plugin's environment, the sectioned log it prints, and the
//! verdict the operator draws from that log.
//!
//! The GID table follows the VF's addresses, which the CNI configures in the
//! pod's network namespace: the `-x` index is only known there. The runner
//! resolves it with [`crate::command::resolve_endpoint`] against the pod's
//! `/sys`, prints the endpoint, runs the same perftest options on both
//! sides, and prints each tool's output under a marker line.

use crate::command::{
    CommandError, CommandLine, Endpoint, PerftestSpec, PerftestTool, client_command, server_command,
};
use crate::lifecycle::RunOutcome;
use crate::perftest::{self, PerftestReport};
use crate::thresholds::{AdmissionThresholds, Measurement, evaluate};
use serde::{Deserialize, Serialize};
use sriov_helpers::CpuList;
use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::PathBuf;

/// The runner binary's name (the perftest image puts it on `PATH`).
pub const RUNNER_BINARY: &str = "kroce-perftest-run";
/// perftest's default out-of-band TCP port, for the bandwidth test.
pub const DEFAULT_BW_PORT: u16 = 18515;
/// The latency test's port: both servers listen at once.
pub const DEFAULT_LAT_PORT: u16 = 18516;
/// Marker lines: `### kroce-perftest-run: <section> ###`.
const SECTION_PREFIX: &str = "### kroce-perftest-run: ";
const SECTION_SUFFIX: &str = " ###";
/// Section with the resolved endpoint as JSON.
pub const ENDPOINT_SECTION: &str = "endpoint";
/// Section with why the runner gave up.
pub const ERROR_SECTION: &str = "error";
/// Client messages that mean "server not listening yet" (perftest_communication.c).
const NOT_LISTENING: &[&str] = &["Couldn't connect", "Unable to init the socket connection"];

/// Server or client side of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Server,
    Client,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Server => "server",
            Role::Client => "client",
        }
    }
}

/// A `--bw-tool` / `--lat-tool` value that names no perftest tool.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown perftest tool {0:?} (ib_write_bw, ib_read_bw, ib_send_bw, ib_write_lat, ib_read_lat, ib_send_lat)"
)]
pub struct UnknownTool(pub String);

fn parse_tool(s: &str) -> Result<PerftestTool, UnknownTool> {
    PerftestTool::from_binary(s).ok_or_else(|| UnknownTool(s.to_string()))
}

/// `kroce-perftest-run`: runs one side of a kroce admission test in a test
/// pod. Finds the pod's RDMA device (from the device plugin's
/// `PCIDEVICE_*_INFO` env), resolves the RoCE v2 GID index of its IPv4
/// address, pins to its NUMA-local CPUs within the pod's cpuset, and runs
/// a bandwidth test then a latency test with the same options as the other
/// side, printing perftest's output between marker lines.
#[derive(Debug, Clone, PartialEq, clap::Parser)]
#[command(name = "kroce-perftest-run", version)]
pub struct RunnerArgs {
    /// Which side this pod is.
    #[arg(value_enum)]
    pub role: Role,
    /// The server's IPv4 address on the RDMA network (client only).
    #[arg(long, required_if_eq("role", "client"))]
    pub server_ip: Option<Ipv4Addr>,
    /// RDMA device to test (default: the one in PCIDEVICE_*_INFO).
    #[arg(long)]
    pub device: Option<String>,
    /// Bandwidth tool.
    #[arg(long, default_value = "ib_write_bw", value_parser = parse_tool)]
    pub bw_tool: PerftestTool,
    /// Bandwidth test duration (-D), seconds.
    #[arg(long, default_value_t = 10)]
    pub duration: u32,
    /// Bandwidth message size (-s), bytes.
    #[arg(long, default_value_t = 65536)]
    pub size: u64,
    /// Bandwidth queue pairs (-q).
    #[arg(long, default_value_t = 4)]
    pub qps: u32,
    /// Latency tool.
    #[arg(long, default_value = "ib_read_lat", value_parser = parse_tool)]
    pub lat_tool: PerftestTool,
    /// Latency iterations (-n, at least 5).
    #[arg(long, default_value_t = 10_000)]
    pub iterations: u32,
    /// Latency message size (-s), bytes.
    #[arg(long, default_value_t = 2)]
    pub lat_size: u64,
    /// TCP port of the bandwidth test.
    #[arg(long, default_value_t = DEFAULT_BW_PORT)]
    pub bw_port: u16,
    /// TCP port of the latency test.
    #[arg(long, default_value_t = DEFAULT_LAT_PORT)]
    pub lat_port: u16,
    /// How long to wait for the RoCE v2 GID of the pod's address, seconds.
    #[arg(long, default_value_t = 30)]
    pub gid_wait: u32,
    /// Client: how long to retry while the server is not listening, seconds.
    #[arg(long, default_value_t = 60)]
    pub connect_wait: u32,
    /// sysfs as the pod sees it.
    #[arg(long, default_value = "/sys")]
    pub sys_root: PathBuf,
    /// procfs as the pod sees it (`self/status` gives the pod's cpuset).
    #[arg(long, default_value = "/proc")]
    pub proc_root: PathBuf,
}

impl RunnerArgs {
    /// The arguments the operator runs in a test pod with the defaults of
    /// the host paths and waits.
    pub fn new(role: Role, bandwidth: &PerftestSpec, latency: &PerftestSpec) -> RunnerArgs {
        RunnerArgs {
            role,
            server_ip: None,
            device: None,
            bw_tool: bandwidth.tool,
            duration: bandwidth.duration_secs.unwrap_or(10),
            size: bandwidth.size_bytes,
            qps: bandwidth.qps.unwrap_or(1),
            lat_tool: latency.tool,
            iterations: latency.iterations.unwrap_or(1000),
            lat_size: latency.size_bytes,
            bw_port: bandwidth.tcp_port,
            lat_port: latency.tcp_port,
            gid_wait: 30,
            connect_wait: 60,
            sys_root: PathBuf::from("/sys"),
            proc_root: PathBuf::from("/proc"),
        }
    }

    pub fn bandwidth_spec(&self) -> PerftestSpec {
        PerftestSpec::bandwidth(
            self.bw_tool,
            self.duration,
            self.size,
            self.qps,
            self.bw_port,
        )
    }

    pub fn latency_spec(&self) -> PerftestSpec {
        PerftestSpec::latency(self.lat_tool, self.iterations, self.lat_size, self.lat_port)
    }

    /// Both specs valid, each tool of the right kind, distinct ports.
    pub fn validate(&self) -> Result<(), CommandError> {
        let bad = |field, value: String, reason| {
            Err(CommandError::InvalidOption {
                field,
                value,
                reason,
            })
        };
        if !self.bw_tool.is_bandwidth() {
            return bad(
                "bwTool",
                self.bw_tool.binary().into(),
                "must be a bandwidth test",
            );
        }
        if self.lat_tool.is_bandwidth() {
            return bad(
                "latTool",
                self.lat_tool.binary().into(),
                "must be a latency test",
            );
        }
        if self.bw_port == self.lat_port {
            return bad(
                "latPort",
                self.lat_port.to_string(),
                "must differ from bwPort (both servers listen at once)",
            );
        }
        self.bandwidth_spec().validate()?;
        self.latency_spec().validate()
    }

    /// The argv after the binary name; `clap` parses it back to `self`.
    pub fn to_args(&self) -> Vec<String> {
        let mut a = vec![self.role.as_str().to_string()];
        let mut kv = |k: &str, v: String| {
            a.push(format!("--{k}"));
            a.push(v);
        };
        if let Some(ip) = self.server_ip {
            kv("server-ip", ip.to_string());
        }
        if let Some(d) = &self.device {
            kv("device", d.clone());
        }
        kv("bw-tool", self.bw_tool.binary().into());
        kv("duration", self.duration.to_string());
        kv("size", self.size.to_string());
        kv("qps", self.qps.to_string());
        kv("lat-tool", self.lat_tool.binary().into());
        kv("iterations", self.iterations.to_string());
        kv("lat-size", self.lat_size.to_string());
        kv("bw-port", self.bw_port.to_string());
        kv("lat-port", self.lat_port.to_string());
        kv("gid-wait", self.gid_wait.to_string());
        kv("connect-wait", self.connect_wait.to_string());
        kv("sys-root", self.sys_root.display().to_string());
        kv("proc-root", self.proc_root.display().to_string());
        a
    }

    /// The perftest command lines of this side, bandwidth first.
    pub fn commands(
        &self,
        ep: &Endpoint,
    ) -> Result<Vec<(PerftestTool, CommandLine)>, CommandError> {
        self.validate()?;
        let specs = [self.bandwidth_spec(), self.latency_spec()];
        specs
            .iter()
            .map(|spec| {
                let cmd = match (self.role, self.server_ip) {
                    (Role::Server, _) => server_command(spec, ep)?,
                    (Role::Client, Some(ip)) => client_command(spec, ep, ip)?,
                    (Role::Client, None) => {
                        return Err(CommandError::InvalidOption {
                            field: "serverIp",
                            value: "unset".into(),
                            reason: "the client needs the server's address",
                        });
                    }
                };
                Ok((spec.tool, cmd))
            })
            .collect()
    }
}

/// Whether a failed client run means "the server is not listening yet".
pub fn server_not_listening(output: &str) -> bool {
    NOT_LISTENING.iter().any(|m| output.contains(m))
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PodRunError {
    #[error(
        "no PCIDEVICE_*_INFO variable in the environment: does the pod request an rdma/ resource?"
    )]
    NoDeviceInfo,
    #[error("several PCIDEVICE_*_INFO variables ({0}): pass --device")]
    SeveralResources(String),
    #[error("{var} is not device-plugin JSON ({reason}): {value:?}")]
    BadDeviceInfo {
        var: String,
        reason: String,
        value: String,
    },
    #[error("{var} names {count} RDMA devices ({devices}): pass --device")]
    DeviceCount {
        var: String,
        count: usize,
        devices: String,
    },
    #[error("{path}: no Cpus_allowed_list line")]
    NoCpuset { path: String },
}

/// The RDMA device of the pod's one kroce resource, from the
/// `PCIDEVICE_<RESOURCE>_INFO` JSON the device plugin sets in `Allocate`
/// (keyed by device ID; `rdmaDevice` per entry).
pub fn device_from_env(
    vars: impl IntoIterator<Item = (String, String)>,
) -> Result<String, PodRunError> {
    let infos: Vec<(String, String)> = vars
        .into_iter()
        .filter(|(k, _)| k.starts_with("PCIDEVICE_") && k.ends_with("_INFO"))
        .collect();
    let (var, value) = match infos.as_slice() {
        [] => return Err(PodRunError::NoDeviceInfo),
        [one] => one.clone(),
        many => {
            let mut names: Vec<&str> = many.iter().map(|(k, _)| k.as_str()).collect();
            names.sort_unstable();
            return Err(PodRunError::SeveralResources(names.join(", ")));
        }
    };
    let bad = |reason: &str| PodRunError::BadDeviceInfo {
        var: var.clone(),
        reason: reason.to_string(),
        value: value.clone(),
    };
    let parsed: serde_json::Value =
        serde_json::from_str(&value).map_err(|e| bad(&e.to_string()))?;
    let entries = parsed.as_object().ok_or_else(|| bad("not an object"))?;
    let mut devices: Vec<String> = entries
        .values()
        .filter_map(|e| e.get("rdmaDevice").and_then(|d| d.as_str()))
        .map(str::to_string)
        .collect();
    devices.sort_unstable();
    devices.dedup();
    match devices.len() {
        1 => Ok(devices.remove(0)),
        count => Err(PodRunError::DeviceCount {
            var,
            count,
            devices: devices.join(", "),
        }),
    }
}

/// The pod's cpuset from `/proc/self/status` text (`Cpus_allowed_list`).
pub fn allowed_cpus(status_text: &str, path: &str) -> Result<CpuList, PodRunError> {
    status_text
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| PodRunError::NoCpuset {
            path: path.to_string(),
        })
}

/// What the runner prints about its side before the tests.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointReport {
    pub role: Role,
    #[serde(flatten)]
    pub endpoint: Endpoint,
    /// `ports/<n>/rate` of the tested port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port_rate_gbps: Option<f64>,
}

/// The marker line that opens a section.
pub fn section_marker(name: &str) -> String {
    format!("{SECTION_PREFIX}{name}{SECTION_SUFFIX}")
}

/// A runner log cut at its marker lines: section name -> text. Text before
/// the first marker (kubelet or shell noise) is dropped; a repeated
/// section keeps its last text.
pub fn split_sections(log: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut current: Option<(String, String)> = None;
    for line in log.lines() {
        let l = line.strip_suffix('\r').unwrap_or(line);
        if let Some(name) = l
            .strip_prefix(SECTION_PREFIX)
            .and_then(|r| r.strip_suffix(SECTION_SUFFIX))
        {
            if let Some((n, t)) = current.take() {
                out.insert(n, t);
            }
            current = Some((name.trim().to_string(), String::new()));
        } else if let Some((_, t)) = current.as_mut() {
            t.push_str(l);
            t.push('\n');
        }
    }
    if let Some((n, t)) = current {
        out.insert(n, t);
    }
    out
}

/// The endpoint a runner log reports, if it got that far.
pub fn endpoint_of(sections: &BTreeMap<String, String>) -> Option<EndpointReport> {
    serde_json::from_str(sections.get(ENDPOINT_SECTION)?.trim()).ok()
}

fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(n)..].join(" | ")
}

/// Why a tool's table could not be read from the client's log.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ClientLogError {
    #[error("the client log has no {tool} output")]
    Missing { tool: &'static str },
    #[error("{tool} output: {source}")]
    Parse {
        tool: &'static str,
        #[source]
        source: perftest::PerftestError,
    },
}

fn report_of(
    sections: &BTreeMap<String, String>,
    tool: PerftestTool,
) -> Result<PerftestReport, ClientLogError> {
    let tool = tool.binary();
    let text = sections.get(tool).ok_or(ClientLogError::Missing { tool })?;
    perftest::parse(text).map_err(|source| ClientLogError::Parse { tool, source })
}

/// The verdict on a finished run from the client's log (which has both
/// tables) and, when readable, the server's (for its port rate): the
/// slower port's rate is what `minBandwidthFraction` is judged against.
pub fn judge(
    client_log: &str,
    server_log: Option<&str>,
    bw_tool: PerftestTool,
    lat_tool: PerftestTool,
    thresholds: &AdmissionThresholds,
) -> RunOutcome {
    let client = split_sections(client_log);
    if let Some(e) = client.get(ERROR_SECTION) {
        return RunOutcome::error(format!("client: {}", e.trim()));
    }
    if client.is_empty() {
        return RunOutcome::error(format!(
            "the client log is not kroce-perftest-run output: {:?}",
            last_lines(client_log, 3)
        ));
    }
    let bw = match report_of(&client, bw_tool) {
        Ok(r) => r,
        Err(e) => return RunOutcome::error(e.to_string()),
    };
    let lat = match report_of(&client, lat_tool) {
        Ok(r) => r,
        Err(e) => return RunOutcome::error(e.to_string()),
    };
    let server = server_log.map(split_sections);
    let rates = [
        endpoint_of(&client).and_then(|e| e.port_rate_gbps),
        server
            .as_ref()
            .and_then(endpoint_of)
            .and_then(|e| e.port_rate_gbps),
    ];
    let rate = rates
        .into_iter()
        .flatten()
        .fold(None, |m: Option<f64>, r| Some(m.map_or(r, |m| m.min(r))));
    let m = Measurement::from_reports(Some(&bw), Some(&lat), rate);
    match evaluate(thresholds, &m) {
        Ok(v) => RunOutcome::from_verdict(&v, m),
        Err(e) => RunOutcome::error(e.to_string()),
    }
}

/// Why a failed pod failed, for the run's error message: the runner's
/// error section if it printed one, else the log's last lines.
pub fn failure_message(role: Role, log: &str) -> String {
    let sections = split_sections(log);
    match sections.get(ERROR_SECTION) {
        Some(e) => format!("{} pod: {}", role.as_str(), e.trim()),
        None if log.trim().is_empty() => format!("{} pod failed with no output", role.as_str()),
        None => format!("{} pod failed: {}", role.as_str(), last_lines(log, 3)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn specs() -> (PerftestSpec, PerftestSpec) {
        (
            PerftestSpec::bandwidth(PerftestTool::IbWriteBw, 5, 65536, 2, DEFAULT_BW_PORT),
            PerftestSpec::latency(PerftestTool::IbReadLat, 1000, 2, DEFAULT_LAT_PORT),
        )
    }

    #[test]
    fn args_round_trip_through_the_parser() {
        let (bw, lat) = specs();
        let mut a = RunnerArgs::new(Role::Client, &bw, &lat);
        a.server_ip = Some(Ipv4Addr::new(10, 56, 0, 3));
        let argv = std::iter::once(RUNNER_BINARY.to_string()).chain(a.to_args());
        let back = RunnerArgs::try_parse_from(argv).unwrap();
        assert_eq!(back, a);
        assert_eq!(back.bandwidth_spec(), bw);
        assert_eq!(back.latency_spec(), lat);
        // A client without a server is refused by the parser.
        let e = RunnerArgs::try_parse_from([RUNNER_BINARY, "client"]).unwrap_err();
        assert!(e.to_string().contains("--server-ip"), "{e}");
        let e = RunnerArgs::try_parse_from([RUNNER_BINARY, "server", "--bw-tool", "ib_foo"])
            .unwrap_err();
        assert!(e.to_string().contains("ib_foo"), "{e}");
    }

    #[test]
    fn validation_names_the_field() {
        let (bw, lat) = specs();
        let mut a = RunnerArgs::new(Role::Server, &bw, &lat);
        a.iterations = 4;
        assert!(a.validate().unwrap_err().to_string().contains("iterations"));
        let mut a = RunnerArgs::new(Role::Server, &bw, &lat);
        a.lat_port = a.bw_port;
        assert!(a.validate().unwrap_err().to_string().contains("latPort"));
        let mut a = RunnerArgs::new(Role::Server, &bw, &lat);
        a.lat_tool = PerftestTool::IbSendBw;
        assert!(a.validate().unwrap_err().to_string().contains("latTool"));
    }

    #[test]
    fn device_comes_from_the_one_info_variable() {
        let info = r#"{"0000:3b:00.2":{"pciAddress":"0000:3b:00.2","rdmaDevice":"mlx5_2","netdev":"ens1f0v0"}}"#;
        let env = vec![
            ("PATH".to_string(), "/bin".to_string()),
            ("PCIDEVICE_RDMA_VF".to_string(), "0000:3b:00.2".to_string()),
            ("PCIDEVICE_RDMA_VF_INFO".to_string(), info.to_string()),
        ];
        assert_eq!(device_from_env(env.clone()).unwrap(), "mlx5_2");
        assert_eq!(
            device_from_env(vec![("PATH".into(), "/bin".into())]),
            Err(PodRunError::NoDeviceInfo)
        );
        let mut two = env.clone();
        two.push(("PCIDEVICE_RDMA_X_INFO".into(), info.into()));
        let e = device_from_env(two).unwrap_err().to_string();
        assert!(
            e.contains("PCIDEVICE_RDMA_VF_INFO") && e.contains("PCIDEVICE_RDMA_X_INFO"),
            "{e}"
        );
        let e = device_from_env(vec![("PCIDEVICE_RDMA_VF_INFO".into(), "{oops".into())])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("PCIDEVICE_RDMA_VF_INFO") && e.contains("{oops"),
            "{e}"
        );
        let e = device_from_env(vec![("PCIDEVICE_RDMA_VF_INFO".into(), "{}".into())])
            .unwrap_err()
            .to_string();
        assert!(e.contains("0 RDMA devices"), "{e}");
    }

    #[test]
    fn cpuset_from_proc_status() {
        let t = "Name:\tx\nCpus_allowed:\tff\nCpus_allowed_list:\t2-3,8\n";
        assert_eq!(allowed_cpus(t, "p").unwrap().to_string(), "2-3,8");
        assert!(allowed_cpus("Name: x\n", "/proc/self/status").is_err());
    }

    #[test]
    fn sections_split_at_markers_only() {
        let log = format!(
            "noise\n{}\n{{}}\n{}\nline a\nline b\n",
            section_marker("endpoint"),
            section_marker("ib_write_bw")
        );
        let s = split_sections(&log);
        assert_eq!(s.len(), 2);
        assert_eq!(s["ib_write_bw"], "line a\nline b\n");
        assert!(!s.values().any(|t| t.contains("noise")));
    }

    #[test]
    fn failure_message_prefers_the_error_section() {
        let log = format!(
            "{}\nno RoCE v2 GID on mlx5_2\n",
            section_marker(ERROR_SECTION)
        );
        assert_eq!(
            failure_message(Role::Client, &log),
            "client pod: no RoCE v2 GID on mlx5_2"
        );
        assert_eq!(
            failure_message(Role::Server, "a\nb\nc\nd\n"),
            "server pod failed: b | c | d"
        );
    }
}
