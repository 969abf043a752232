//! `discover`: what the plugin sees on this host and which pool each device
//! lands in, as a table or JSON. The first thing to run on a new node.

use crate::config::Config;
use crate::health::{self, Health};
use crate::host_view::HostView;
use crate::inventory::{self, Candidate, Memory};
use crate::kubelet_checkpoint::Allocated;
use crate::snapshot::Snapshot;
use serde::Serialize;
use std::fmt::Write;

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Row {
    pub device: Candidate,
    /// The pool's resource name, if a pool takes it.
    pub pool: Option<String>,
    /// Device IDs advertised for it (one, or sharedCount for a shared pool).
    pub ids: usize,
    pub health: Health,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub devices: Vec<Row>,
    pub host_errors: Vec<String>,
}

/// Builds the report from one scan. Without a config every device is "no pool".
pub fn report(view: &HostView, config: Option<&Config>, allocated: &Allocated) -> Report {
    let candidates = inventory::candidates(view, &mut Memory::default());
    let empty = Config { pools: Vec::new() };
    let cfg = config.unwrap_or(&empty);
    let in_use = |r: &crate::resource_name::ResourceName, id: &str| {
        allocated.get(r.as_str()).is_some_and(|s| s.contains(id))
    };
    let snap = Snapshot::build(cfg, candidates, &in_use);
    let mut rows: Vec<Row> = Vec::new();
    for ps in &snap.pools {
        let mut by_base: Vec<(&str, usize, &Health, &Candidate)> = Vec::new();
        for d in ps.devices.values() {
            match by_base.iter_mut().find(|(id, ..)| *id == d.candidate.id) {
                Some(e) => e.1 += 1,
                None => by_base.push((&d.candidate.id, 1, &d.health, &d.candidate)),
            }
        }
        rows.extend(by_base.into_iter().map(|(_, n, h, c)| Row {
            device: c.clone(),
            pool: Some(ps.pool.resource.to_string()),
            ids: n,
            health: h.clone(),
        }));
    }
    rows.extend(snap.unassigned.iter().map(|c| Row {
        device: (**c).clone(),
        pool: None,
        ids: 0,
        health: health::evaluate(c, false),
    }));
    rows.sort_by(|a, b| a.device.id.cmp(&b.device.id));
    Report {
        devices: rows,
        host_errors: view.host.errors.iter().map(|e| e.to_string()).collect(),
    }
}

fn dash(s: Option<String>) -> String {
    s.unwrap_or_else(|| "-".into())
}

/// A fixed-width table, one line per device, then any host scan problems.
pub fn table(r: &Report) -> String {
    let header = [
        "DEVICE", "KIND", "PF", "VF", "NETDEV", "RDMA", "NUMA", "DRIVER", "ID", "LINK", "POOL",
        "HEALTH",
    ];
    let mut lines: Vec<Vec<String>> = vec![header.iter().map(|h| h.to_string()).collect()];
    for row in &r.devices {
        let c = &row.device;
        lines.push(vec![
            c.id.clone(),
            c.kind.as_str().to_string(),
            dash(c.pf_name.clone()),
            dash(c.vf_index.map(|i| i.to_string())),
            dash(c.netdev.as_ref().map(|n| n.name.clone())),
            dash(c.rdma.as_ref().map(|r| r.name.clone())),
            dash(c.numa.map(|n| n.to_string())),
            dash(c.driver.clone()),
            dash(
                c.vendor
                    .zip(c.device)
                    .map(|(v, d)| format!("{v:04x}:{d:04x}")),
            ),
            dash(c.link_type.map(|l| l.as_str().to_string())),
            match (&row.pool, row.ids) {
                (Some(p), 1) => p.clone(),
                (Some(p), n) => format!("{p} (x{n})"),
                (None, _) => "-".into(),
            },
            match &row.health {
                Health::Healthy => "healthy".into(),
                Health::Unhealthy(r) => format!("unhealthy: {}", r.join("; ")),
            },
        ]);
    }
    let widths: Vec<usize> = (0..header.len())
        .map(|i| lines.iter().map(|l| l[i].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for l in &lines {
        let cells: Vec<String> = l
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        let _ = writeln!(out, "{}", cells.join("  ").trim_end());
    }
    for e in &r.host_errors {
        let _ = writeln!(out, "problem: {e}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Format, parse};
    use sriov_helpers::fixture::FixtureHost;

    #[test]
    fn table_shows_pool_and_problems() {
        let (fx, broken) = FixtureHost::broken().unwrap();
        let cfg = parse(
            "pools:\n- resourceName: vf\n  selectors: {pfNames: [ens2f0]}\n- resourceName: hca\n  mode: shared\n  sharedCount: 4\n  selectors: {devices: [\"101d\"]}\n",
            Format::Yaml,
        )
        .unwrap();
        let r = report(&HostView::scan(&fx.root()), Some(&cfg), &Allocated::new());
        let t = table(&r);
        let line = |id: &str| t.lines().find(|l| l.starts_with(id)).unwrap().to_string();
        assert!(line("0000:86:00.2").contains("rdma/vf"), "{t}");
        assert!(line("0000:3b:00.0").contains("rdma/hca (x4)"), "{t}");
        assert!(line("0000:3b:00.2").contains(" - "), "{t}");
        // The damaged VFs are reported as problems, the rest still listed.
        assert!(t.contains(&broken.no_vendor_vf.to_string()), "{t}");
        assert!(t.contains("problem: "), "{t}");
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["devices"][0]["device"]["id"], "0000:3b:00.0");
    }
}
