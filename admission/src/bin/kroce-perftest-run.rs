//! `kroce-perftest-run`: one side of a kroce admission test, inside the
//! test pod. See `kroce_admission::pod_run` for the contract with the
//! operator; this file is only the I/O.

use clap::Parser;
use kroce_admission::command::{
    CommandError, CommandLine, Endpoint, PerftestTool, resolve_endpoint,
};
use kroce_admission::pod_run::{
    ENDPOINT_SECTION, ERROR_SECTION, EndpointReport, Role, RunnerArgs, allowed_cpus,
    device_from_env, section_marker, server_not_listening,
};
use sriov_helpers::{Host, HostRoot};
use std::process::{Command, ExitCode, Output};
use std::time::{Duration, Instant};

fn fail(msg: &str) -> ExitCode {
    println!("{}", section_marker(ERROR_SECTION));
    println!("{msg}");
    eprintln!("kroce-perftest-run: {msg}");
    ExitCode::from(2)
}

fn spawn(cmd: &CommandLine) -> std::io::Result<std::process::Child> {
    Command::new(&cmd.program)
        .args(&cmd.args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
}

fn text(o: &Output) -> String {
    let mut s = String::from_utf8_lossy(&o.stdout).into_owned();
    s.push_str(&String::from_utf8_lossy(&o.stderr));
    s
}

/// Prints the tool's section; a failure message when it failed.
fn print_section(tool: PerftestTool, o: &Output) -> Option<String> {
    let t = text(o);
    println!("{}", section_marker(tool.binary()));
    print!("{t}");
    if o.status.success() {
        return None;
    }
    let last: Vec<&str> = t.lines().filter(|l| !l.trim().is_empty()).collect();
    Some(format!(
        "{} failed ({}): {}",
        tool.binary(),
        o.status,
        last[last.len().saturating_sub(3)..].join(" | ")
    ))
}

/// Waits for the RoCE v2 GID of the pod's address: the kernel adds it
/// shortly after the CNI configures the address.
fn endpoint(args: &RunnerArgs, device: &str) -> Result<(Endpoint, Option<f64>), String> {
    let status_path = args.proc_root.join("self/status");
    let status = std::fs::read_to_string(&status_path)
        .map_err(|e| format!("{}: {e}", status_path.display()))?;
    let cpus =
        allowed_cpus(&status, &status_path.display().to_string()).map_err(|e| e.to_string())?;
    let root = HostRoot::with_paths(args.sys_root.clone(), args.proc_root.clone(), "/dev".into());
    let deadline = Instant::now() + Duration::from_secs(args.gid_wait.into());
    loop {
        let host = Host::scan(&root);
        match resolve_endpoint(&host, Some(device), Some(&cpus)) {
            Ok(ep) => {
                let rate = host
                    .rdma
                    .get(device)
                    .and_then(|d| d.ports.iter().find(|p| p.num == ep.ib_port))
                    .and_then(|p| p.rate_gbps());
                return Ok((ep, rate));
            }
            Err(e @ (CommandError::NoRoceV2Gid { .. } | CommandError::NoNetdev { .. }))
                if Instant::now() < deadline =>
            {
                eprintln!("kroce-perftest-run: {e}; waiting");
                std::thread::sleep(Duration::from_secs(1));
            }
            Err(e) => return Err(e.to_string()),
        }
    }
}

fn run_server(cmds: &[(PerftestTool, CommandLine)]) -> Result<Vec<String>, String> {
    // Both servers listen at once (distinct ports): the client runs its
    // tests back to back and must find each listening.
    let mut children = Vec::new();
    for (tool, cmd) in cmds {
        let child = spawn(cmd).map_err(|e| format!("cannot run {}: {e}", cmd.program))?;
        children.push((*tool, child));
    }
    let mut failed = Vec::new();
    for (tool, child) in children {
        let out = child
            .wait_with_output()
            .map_err(|e| format!("{}: {e}", tool.binary()))?;
        failed.extend(print_section(tool, &out));
    }
    Ok(failed)
}

fn run_client(
    cmds: &[(PerftestTool, CommandLine)],
    connect_wait: u32,
) -> Result<Vec<String>, String> {
    let mut failed = Vec::new();
    for (tool, cmd) in cmds {
        let deadline = Instant::now() + Duration::from_secs(connect_wait.into());
        let out = loop {
            let out = spawn(cmd)
                .and_then(|c| c.wait_with_output())
                .map_err(|e| format!("cannot run {}: {e}", cmd.program))?;
            if out.status.success()
                || !server_not_listening(&text(&out))
                || Instant::now() >= deadline
            {
                break out;
            }
            std::thread::sleep(Duration::from_secs(1));
        };
        failed.extend(print_section(*tool, &out));
    }
    Ok(failed)
}

fn main() -> ExitCode {
    let args = RunnerArgs::parse();
    if let Err(e) = args.validate() {
        return fail(&e.to_string());
    }
    let device = match &args.device {
        Some(d) => d.clone(),
        None => match device_from_env(std::env::vars()) {
            Ok(d) => d,
            Err(e) => return fail(&e.to_string()),
        },
    };
    let (ep, rate) = match endpoint(&args, &device) {
        Ok(x) => x,
        Err(e) => return fail(&e),
    };
    let report = EndpointReport {
        role: args.role,
        endpoint: ep.clone(),
        port_rate_gbps: rate,
    };
    println!("{}", section_marker(ENDPOINT_SECTION));
    match serde_json::to_string(&report) {
        Ok(j) => println!("{j}"),
        Err(e) => return fail(&format!("cannot encode the endpoint: {e}")),
    }
    let cmds = match args.commands(&ep) {
        Ok(c) => c,
        Err(e) => return fail(&e.to_string()),
    };
    for (_, c) in &cmds {
        eprintln!("kroce-perftest-run: {}", c.argv().join(" "));
    }
    let result = match args.role {
        Role::Server => run_server(&cmds),
        Role::Client => run_client(&cmds, args.connect_wait),
    };
    match result {
        Ok(failed) if failed.is_empty() => ExitCode::SUCCESS,
        Ok(failed) => fail(&failed.join("; ")),
        Err(e) => fail(&e),
    }
}
