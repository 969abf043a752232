//! perftest command lines as data: the same options on the server and the
//! client, an explicit `-x` GID index for the VF's IPv4 RoCE v2 GID (looked
//! up in the host model, never hard-coded), `-d` for the RDMA device, and a
//! `taskset -c` prefix that pins the test to the NIC's NUMA-local CPUs.
//!
//! The GID table is filled by the kernel from the netdev's addresses, so the
//! index is only known where the VF has its IPv4 address: inside the test
//! pod. [`resolve_endpoint`] is meant to run there, on the pod's view of
//! sysfs; [`server_command`] / [`client_command`] then give the argv.

use serde::{Deserialize, Serialize};
use sriov_helpers::rdma::roce_v2_gid_index;
use sriov_helpers::{CpuList, Host};
use std::net::Ipv4Addr;

/// perftest's limits (`perftest_parameters.h`): `MIN_ITER`/`MAX_ITER`,
/// `MAX_QP_NUM`, and `-s` up to `UINT_MAX / 2`.
const MIN_ITERATIONS: u32 = 5;
const MAX_ITERATIONS: u32 = 100_000_000;
const MAX_QPS: u32 = 16_384;
const MAX_SIZE: u64 = (u32::MAX / 2) as u64;
/// A test longer than an hour is a mistake, not an admission test.
const MAX_DURATION_SECS: u32 = 3_600;

/// The perftest binaries kroce runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PerftestTool {
    IbWriteBw,
    IbReadBw,
    IbSendBw,
    IbWriteLat,
    IbReadLat,
    IbSendLat,
}

impl PerftestTool {
    pub fn binary(self) -> &'static str {
        match self {
            PerftestTool::IbWriteBw => "ib_write_bw",
            PerftestTool::IbReadBw => "ib_read_bw",
            PerftestTool::IbSendBw => "ib_send_bw",
            PerftestTool::IbWriteLat => "ib_write_lat",
            PerftestTool::IbReadLat => "ib_read_lat",
            PerftestTool::IbSendLat => "ib_send_lat",
        }
    }

    /// The tool for a binary name (`ib_write_bw`), as `binary` spells it.
    pub fn from_binary(name: &str) -> Option<PerftestTool> {
        [
            PerftestTool::IbWriteBw,
            PerftestTool::IbReadBw,
            PerftestTool::IbSendBw,
            PerftestTool::IbWriteLat,
            PerftestTool::IbReadLat,
            PerftestTool::IbSendLat,
        ]
        .into_iter()
        .find(|t| t.binary() == name)
    }

    pub fn is_bandwidth(self) -> bool {
        matches!(
            self,
            PerftestTool::IbWriteBw | PerftestTool::IbReadBw | PerftestTool::IbSendBw
        )
    }
}

/// What to run, identical on both sides.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PerftestSpec {
    pub tool: PerftestTool,
    /// `-s`: message size in bytes.
    pub size_bytes: u64,
    /// `-D`: seconds (bandwidth tests).
    pub duration_secs: Option<u32>,
    /// `-q`: queue pairs (bandwidth tests).
    pub qps: Option<u32>,
    /// `-n`: iterations (latency tests; percentiles need many).
    pub iterations: Option<u32>,
    /// `-p`: TCP port of perftest's out-of-band exchange.
    pub tcp_port: u16,
}

impl PerftestSpec {
    /// The bandwidth run admission uses: `-D secs -s size -q qps --report_gbits -F`.
    pub fn bandwidth(
        tool: PerftestTool,
        duration_secs: u32,
        size_bytes: u64,
        qps: u32,
        tcp_port: u16,
    ) -> Self {
        PerftestSpec {
            tool,
            size_bytes,
            duration_secs: Some(duration_secs),
            qps: Some(qps),
            iterations: None,
            tcp_port,
        }
    }

    /// The latency run: `-n iterations -s size -F`.
    pub fn latency(tool: PerftestTool, iterations: u32, size_bytes: u64, tcp_port: u16) -> Self {
        PerftestSpec {
            tool,
            size_bytes,
            duration_secs: None,
            qps: None,
            iterations: Some(iterations),
            tcp_port,
        }
    }

    /// Every option in range and each present only where perftest takes it.
    pub fn validate(&self) -> Result<(), CommandError> {
        let bad = |field: &'static str, value: String, reason: &'static str| {
            Err(CommandError::InvalidOption {
                field,
                value,
                reason,
            })
        };
        if self.size_bytes == 0 || self.size_bytes > MAX_SIZE {
            return bad(
                "sizeBytes",
                self.size_bytes.to_string(),
                "must be 1..=2147483647",
            );
        }
        if self.tcp_port == 0 {
            return bad("tcpPort", "0".into(), "must be 1..=65535");
        }
        if self.tool.is_bandwidth() {
            match self.duration_secs {
                Some(d) if (1..=MAX_DURATION_SECS).contains(&d) => {}
                Some(d) => return bad("durationSecs", d.to_string(), "must be 1..=3600"),
                None => return bad("durationSecs", "unset".into(), "bandwidth tests need -D"),
            }
            match self.qps {
                Some(q) if (1..=MAX_QPS).contains(&q) => {}
                Some(q) => return bad("qps", q.to_string(), "must be 1..=16384"),
                None => return bad("qps", "unset".into(), "bandwidth tests need -q"),
            }
            if let Some(n) = self.iterations {
                return bad(
                    "iterations",
                    n.to_string(),
                    "bandwidth tests run for -D seconds, not -n iterations",
                );
            }
        } else {
            match self.iterations {
                Some(n) if (MIN_ITERATIONS..=MAX_ITERATIONS).contains(&n) => {}
                Some(n) => return bad("iterations", n.to_string(), "must be 5..=100000000"),
                None => return bad("iterations", "unset".into(), "latency tests need -n"),
            }
            if let Some(d) = self.duration_secs {
                return bad(
                    "durationSecs",
                    d.to_string(),
                    "latency tests with -D print no percentiles",
                );
            }
            if let Some(q) = self.qps {
                return bad("qps", q.to_string(), "latency tests use one QP");
            }
        }
        Ok(())
    }
}

/// One side of a test, as seen where it runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Endpoint {
    pub rdma_device: String,
    pub ib_port: u32,
    pub netdev: String,
    pub gid_index: u32,
    /// The IPv4 address behind the GID (the client connects to the server's).
    pub ipv4: Ipv4Addr,
    /// CPUs to pin to; `None` runs unpinned (soft devices have no NUMA node).
    pub cpus: Option<CpuList>,
}

/// A program and its arguments.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandLine {
    pub program: String,
    pub args: Vec<String>,
}

impl CommandLine {
    /// `program` followed by `args`, ready for a container's `command`.
    pub fn argv(&self) -> Vec<String> {
        std::iter::once(self.program.clone())
            .chain(self.args.iter().cloned())
            .collect()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommandError {
    #[error("perftest option {field} = {value}: {reason}")]
    InvalidOption {
        field: &'static str,
        value: String,
        reason: &'static str,
    },
    #[error("RDMA device {0:?} not found")]
    NoSuchDevice(String),
    #[error("no RDMA device with a RoCE v2 IPv4 GID found (candidates: {0})")]
    NoRoceDevice(String),
    #[error("several RDMA devices have a RoCE v2 IPv4 GID ({0}); name the one to test")]
    AmbiguousDevice(String),
    #[error("RDMA device {device} has no netdev in this network namespace")]
    NoNetdev { device: String },
    #[error(
        "RDMA device {device} has no RoCE v2 GID for an IPv4 address of {netdev}: is the address configured and RoCE v2 enabled?"
    )]
    NoRoceV2Gid { device: String, netdev: String },
    #[error("RDMA device {device}: cannot read its GID table: {error}")]
    GidTable { device: String, error: String },
}

fn netdev_of_device<'a>(host: &'a Host, dev: &'a sriov_helpers::RdmaDevice) -> Option<&'a str> {
    match &dev.pci {
        Some(pci) => host.netdev_of(pci),
        None => dev.parent_netdev.as_deref(),
    }
}

/// The CPUs local to the device: its PCI function's `local_cpulist`, else
/// its NUMA node's `cpulist`; intersected with `allowed` (the container's
/// cpuset) when given. `None` when nothing is known or the intersection is
/// empty (pinning outside the cpuset would fail).
fn local_cpus(
    host: &Host,
    dev: &sriov_helpers::RdmaDevice,
    allowed: Option<&CpuList>,
) -> Option<CpuList> {
    let pci = host.pci.get(dev.pci.as_ref()?)?;
    let local = pci.local_cpus.clone().or_else(|| {
        pci.numa_node
            .and_then(|n| host.numa_node(n))
            .map(|n| n.cpus.clone())
    })?;
    let cpus = match allowed {
        Some(a) => CpuList::from_cpus(local.cpus().filter(|c| a.contains(*c))),
        None => local,
    };
    (!cpus.is_empty()).then_some(cpus)
}

fn endpoint_for(
    host: &Host,
    dev: &sriov_helpers::RdmaDevice,
    allowed: Option<&CpuList>,
) -> Result<Endpoint, CommandError> {
    let netdev = netdev_of_device(host, dev).ok_or_else(|| CommandError::NoNetdev {
        device: dev.name.clone(),
    })?;
    let gid_table = |e: sriov_helpers::HostError| CommandError::GidTable {
        device: dev.name.clone(),
        error: e.to_string(),
    };
    let (gid_index, ipv4) = roce_v2_gid_index(dev, netdev)
        .map_err(gid_table)?
        .ok_or_else(|| CommandError::NoRoceV2Gid {
            device: dev.name.clone(),
            netdev: netdev.to_string(),
        })?;
    // The port that holds the GID (ConnectX VFs have one).
    let mut ib_port = 1;
    for p in &dev.ports {
        if p.gids()
            .map_err(gid_table)?
            .iter()
            .any(|g| g.index == gid_index)
        {
            ib_port = p.num;
            break;
        }
    }
    Ok(Endpoint {
        rdma_device: dev.name.clone(),
        ib_port,
        netdev: netdev.to_string(),
        gid_index,
        ipv4,
        cpus: local_cpus(host, dev, allowed),
    })
}

/// Finds the device to test and its GID index. With `device` set, that
/// device; otherwise the only RDMA device with a RoCE v2 IPv4 GID (a test
/// pod sees exactly its VF).
pub fn resolve_endpoint(
    host: &Host,
    device: Option<&str>,
    allowed_cpus: Option<&CpuList>,
) -> Result<Endpoint, CommandError> {
    if let Some(name) = device {
        let dev = host
            .rdma
            .get(name)
            .ok_or_else(|| CommandError::NoSuchDevice(name.to_string()))?;
        return endpoint_for(host, dev, allowed_cpus);
    }
    let mut found = Vec::new();
    for dev in host.rdma.values() {
        if let Ok(ep) = endpoint_for(host, dev, allowed_cpus) {
            found.push(ep);
        }
    }
    match found.len() {
        1 => Ok(found.remove(0)),
        0 => Err(CommandError::NoRoceDevice(
            host.rdma.keys().cloned().collect::<Vec<_>>().join(", "),
        )),
        _ => Err(CommandError::AmbiguousDevice(
            found
                .iter()
                .map(|e| e.rdma_device.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        )),
    }
}

/// The perftest options both sides share.
pub fn perftest_args(spec: &PerftestSpec, ep: &Endpoint) -> Result<Vec<String>, CommandError> {
    spec.validate()?;
    let mut a = vec![
        "-d".to_string(),
        ep.rdma_device.clone(),
        "-i".into(),
        ep.ib_port.to_string(),
        "-x".into(),
        ep.gid_index.to_string(),
        "-p".into(),
        spec.tcp_port.to_string(),
        "-s".into(),
        spec.size_bytes.to_string(),
    ];
    if let Some(d) = spec.duration_secs {
        a.extend(["-D".into(), d.to_string()]);
    }
    if let Some(q) = spec.qps {
        a.extend(["-q".into(), q.to_string()]);
    }
    if let Some(n) = spec.iterations {
        a.extend(["-n".into(), n.to_string()]);
    }
    if spec.tool.is_bandwidth() {
        a.push("--report_gbits".into());
    }
    // Do not fail when the CPU frequency governor is not at max (pods cannot change it).
    a.push("-F".into());
    Ok(a)
}

fn wrap(spec: &PerftestSpec, ep: &Endpoint, mut args: Vec<String>) -> CommandLine {
    match &ep.cpus {
        Some(cpus) => {
            let mut full = vec![
                "-c".to_string(),
                cpus.to_string(),
                spec.tool.binary().into(),
            ];
            full.append(&mut args);
            CommandLine {
                program: "taskset".into(),
                args: full,
            }
        }
        None => CommandLine {
            program: spec.tool.binary().into(),
            args,
        },
    }
}

/// The server side: listens for the client.
pub fn server_command(spec: &PerftestSpec, ep: &Endpoint) -> Result<CommandLine, CommandError> {
    Ok(wrap(spec, ep, perftest_args(spec, ep)?))
}

/// The client side: the same options, then the server's address.
pub fn client_command(
    spec: &PerftestSpec,
    ep: &Endpoint,
    server: Ipv4Addr,
) -> Result<CommandLine, CommandError> {
    let mut args = perftest_args(spec, ep)?;
    args.push(server.to_string());
    Ok(wrap(spec, ep, args))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(cpus: Option<&str>) -> Endpoint {
        Endpoint {
            rdma_device: "mlx5_2".into(),
            ib_port: 1,
            netdev: "net1".into(),
            gid_index: 3,
            ipv4: Ipv4Addr::new(10, 0, 0, 2),
            cpus: cpus.map(|c| c.parse().unwrap()),
        }
    }

    #[test]
    fn bandwidth_args_are_the_same_on_both_sides_plus_server_address() {
        let spec = PerftestSpec::bandwidth(PerftestTool::IbWriteBw, 10, 65536, 4, 18515);
        let s = server_command(&spec, &ep(Some("0-15"))).unwrap();
        let c = client_command(&spec, &ep(Some("0-15")), Ipv4Addr::new(10, 0, 0, 1)).unwrap();
        assert_eq!(
            s.argv(),
            [
                "taskset",
                "-c",
                "0-15",
                "ib_write_bw",
                "-d",
                "mlx5_2",
                "-i",
                "1",
                "-x",
                "3",
                "-p",
                "18515",
                "-s",
                "65536",
                "-D",
                "10",
                "-q",
                "4",
                "--report_gbits",
                "-F"
            ]
        );
        assert_eq!(&c.argv()[..s.argv().len()], &s.argv()[..]);
        assert_eq!(c.argv().last().map(String::as_str), Some("10.0.0.1"));
    }

    #[test]
    fn latency_args_use_iterations_and_no_gbits() {
        let spec = PerftestSpec::latency(PerftestTool::IbReadLat, 10000, 2, 18516);
        let s = server_command(&spec, &ep(None)).unwrap();
        assert_eq!(s.program, "ib_read_lat");
        assert!(s.args.windows(2).any(|w| w == ["-n", "10000"]));
        assert!(!s.args.iter().any(|a| a == "--report_gbits" || a == "-D"));
    }

    #[test]
    fn invalid_options_name_the_field() {
        let mut spec = PerftestSpec::bandwidth(PerftestTool::IbWriteBw, 0, 65536, 1, 18515);
        let e = spec.validate().unwrap_err().to_string();
        assert!(e.contains("durationSecs") && e.contains('0'), "{e}");
        spec.duration_secs = Some(5);
        spec.qps = Some(20000);
        let e = spec.validate().unwrap_err().to_string();
        assert!(e.contains("qps") && e.contains("20000"), "{e}");
        let lat = PerftestSpec::latency(PerftestTool::IbWriteLat, 2, 2, 1);
        let e = lat.validate().unwrap_err().to_string();
        assert!(e.contains("iterations") && e.contains('2'), "{e}");
        assert!(server_command(&lat, &ep(None)).is_err());
    }
}
