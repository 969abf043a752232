#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The chart's RoCE alert rules (charts/kroce/files/kroce-rules.yaml) and
//! Grafana dashboard (charts/kroce/files/kroce-dashboard.json) use only
//! metric and label names the node agent's `/metrics` exports
//! (`state_metrics::exported_metric_names`, rendered by the exporting code
//! itself): a rename on either side breaks this test instead of silently
//! emptying an alert or a panel.

use kroce_node_agent::state_metrics::exported_metric_names;
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};

#[derive(Deserialize)]
struct RuleFile {
    groups: Vec<Group>,
}

#[derive(Deserialize)]
struct Group {
    rules: Vec<Rule>,
}

#[derive(Deserialize)]
struct Rule {
    alert: String,
    expr: String,
    annotations: BTreeMap<String, String>,
}

fn chart_file(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../charts/kroce/files")
        .join(name)
}

fn rules_path() -> std::path::PathBuf {
    chart_file("kroce-rules.yaml")
}

/// The file is a Helm template: drop the `{{- ... -}}` header actions and
/// replace every inline `{{ ... }}` (thresholds, `for`, Prometheus'
/// escaped `{{`) by `0`, leaving the YAML and PromQL around them.
fn untemplate(text: &str) -> String {
    let mut out = String::new();
    let mut in_comment = false;
    for line in text.lines() {
        let t = line.trim_start();
        if in_comment {
            in_comment = !t.contains("*/");
            continue;
        }
        if t.starts_with("{{- /*") {
            in_comment = !t.contains("*/");
            continue;
        }
        if t.starts_with("{{-") {
            continue;
        }
        let mut rest = line;
        while let Some(start) = rest.find("{{") {
            out.push_str(&rest[..start]);
            match rest[start..].find("}}") {
                Some(end) => {
                    out.push('0');
                    rest = &rest[start + end + 2..];
                }
                None => {
                    rest = &rest[start..];
                    break;
                }
            }
        }
        out.push_str(rest);
        out.push('\n');
    }
    out
}

#[derive(Debug, PartialEq)]
enum Tok {
    Ident(String),
    Str(String),
    Punct(char),
}

/// PromQL tokens: identifiers (metric, function, label names), string
/// literals and single punctuation; numbers and durations are identifiers
/// starting with a digit and are ignored by the callers.
fn tokens(expr: &str) -> Vec<Tok> {
    let mut out = Vec::new();
    let mut chars = expr.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_whitespace() {
            continue;
        }
        if c == '"' || c == '\'' || c == '`' {
            let mut s = String::new();
            while let Some(d) = chars.next() {
                if d == '\\' {
                    if let Some(e) = chars.next() {
                        s.push(e);
                    }
                } else if d == c {
                    break;
                } else {
                    s.push(d);
                }
            }
            out.push(Tok::Str(s));
        } else if c.is_ascii_alphanumeric() || c == '_' || c == ':' || c == '.' {
            let mut s = c.to_string();
            while let Some(&d) = chars.peek() {
                if d.is_ascii_alphanumeric() || d == '_' || d == ':' || d == '.' {
                    s.push(d);
                    chars.next();
                } else {
                    break;
                }
            }
            out.push(Tok::Ident(s));
        } else {
            out.push(Tok::Punct(c));
        }
    }
    out
}

#[derive(Default, Debug)]
struct Used {
    metrics: BTreeSet<String>,
    labels: BTreeSet<String>,
    /// Labels the rule creates itself (`label_replace`'s destination).
    created: BTreeSet<String>,
}

fn used_names(expr: &str) -> Used {
    let toks = tokens(expr);
    let mut used = Used::default();
    let mut i = 0;
    while i < toks.len() {
        match &toks[i] {
            Tok::Ident(id) if id.starts_with("kroce_") => {
                used.metrics.insert(id.clone());
            }
            // Grouping: by/without/on/ignoring/group_left/group_right (a, b).
            Tok::Ident(id)
                if matches!(
                    id.as_str(),
                    "by" | "without" | "on" | "ignoring" | "group_left" | "group_right"
                ) && toks.get(i + 1) == Some(&Tok::Punct('(')) =>
            {
                i += 2;
                while i < toks.len() && toks[i] != Tok::Punct(')') {
                    if let Tok::Ident(l) = &toks[i] {
                        used.labels.insert(l.clone());
                    }
                    i += 1;
                }
            }
            // Matchers: {label="v", label!~"v"}.
            Tok::Punct('{') => {
                i += 1;
                while i < toks.len() && toks[i] != Tok::Punct('}') {
                    if let (Tok::Ident(l), Some(Tok::Punct('=' | '!'))) =
                        (&toks[i], toks.get(i + 1))
                    {
                        used.labels.insert(l.clone());
                    }
                    i += 1;
                }
            }
            // label_replace(v, "dst", "replacement", "src", "regex").
            Tok::Ident(id) if id == "label_replace" => {
                let mut depth = 0;
                let mut commas = 0;
                let mut j = i + 1;
                while j < toks.len() {
                    match &toks[j] {
                        Tok::Punct('(') => depth += 1,
                        Tok::Punct(')') => {
                            depth -= 1;
                            if depth == 0 {
                                break;
                            }
                        }
                        Tok::Punct(',') if depth == 1 => commas += 1,
                        Tok::Str(s) if depth == 1 && commas == 1 => {
                            used.created.insert(s.clone());
                        }
                        Tok::Str(s) if depth == 1 && commas == 3 && !s.is_empty() => {
                            used.labels.insert(s.clone());
                        }
                        _ => {}
                    }
                    j += 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    used
}

/// `$labels.name` in an annotation.
fn annotation_labels(text: &str) -> BTreeSet<String> {
    text.split("$labels.")
        .skip(1)
        .map(|r| {
            r.chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect()
        })
        .collect()
}

fn load_rules() -> Vec<Rule> {
    let path = rules_path();
    let text = std::fs::read_to_string(&path).expect("read rules file");
    let file: RuleFile = serde_saphyr::from_str(&untemplate(&text))
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    file.groups.into_iter().flat_map(|g| g.rules).collect()
}

#[test]
fn every_metric_and_label_in_the_alert_rules_is_exported() {
    let (metrics, labels) = exported_metric_names();
    let rules = load_rules();
    assert!(
        rules.len() >= 11,
        "expected the RoCE alerts, got {}",
        rules.len()
    );
    let mut problems = Vec::new();
    for r in &rules {
        let used = used_names(&r.expr);
        if used.metrics.is_empty() {
            problems.push(format!(
                "{}: no kroce_ metric found in {:?}",
                r.alert, r.expr
            ));
        }
        for m in used.metrics.difference(&metrics) {
            problems.push(format!("{}: metric {m} is not exported", r.alert));
        }
        for l in used.labels.difference(&labels) {
            problems.push(format!("{}: label {l} is not exported", r.alert));
        }
        for (k, v) in &r.annotations {
            for l in annotation_labels(v) {
                if !labels.contains(&l) && !used.created.contains(&l) {
                    problems.push(format!(
                        "{}: annotation {k} uses label {l} the alert does not carry",
                        r.alert
                    ));
                }
            }
        }
        for k in ["summary", "description", "runbook"] {
            if !r.annotations.contains_key(k) {
                problems.push(format!("{}: no {k} annotation", r.alert));
            }
        }
    }
    // Every runbook annotation is the one `$runbook` line, which points at
    // the doctor and the README's Troubleshooting.
    let raw = std::fs::read_to_string(rules_path()).expect("read rules file");
    let runbook_def = raw
        .lines()
        .find(|l| l.contains("$runbook :="))
        .unwrap_or_default();
    if !runbook_def.contains("kroce-node-agent doctor") || !runbook_def.contains("Troubleshooting")
    {
        problems.push(format!(
            "$runbook does not point at doctor and Troubleshooting: {runbook_def}"
        ));
    }
    let uses = raw.matches("runbook: {{ $runbook | quote }}").count();
    if uses != rules.len() {
        problems.push(format!("{uses} of {} rules use $runbook", rules.len()));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_tokenizer_finds_names_and_labels() {
    let u = used_names(
        r#"sum by (node, port) (rate(kroce_rdma_pause_frames_total{direction="rx",priority!~"a,}b"}[5m])) > 3
           and on (device) label_replace(kroce_x_total, "counter", "v", "", "")"#,
    );
    assert_eq!(
        u.metrics,
        BTreeSet::from([
            "kroce_rdma_pause_frames_total".into(),
            "kroce_x_total".into()
        ])
    );
    assert_eq!(
        u.labels,
        ["node", "port", "direction", "priority", "device"]
            .into_iter()
            .map(String::from)
            .collect()
    );
    assert_eq!(u.created, BTreeSet::from(["counter".to_string()]));
    // The exported list itself: a pause family with its labels, a hw
    // counter, the pool gauge.
    let (m, l) = exported_metric_names();
    assert!(m.contains("kroce_rdma_pause_frames_total"), "{m:?}");
    assert!(m.contains("kroce_rdma_hw_rp_cnp_handled_total"), "{m:?}");
    assert!(m.contains("kroce_vf_pool_vfs"), "{m:?}");
    assert!(l.contains("priority") && l.contains("netdev"), "{l:?}");
    assert!(!m.contains("kroce_rdma_port_no_such_total"));
}

/// `{{label}}` in a legend.
fn legend_labels(text: &str) -> BTreeSet<String> {
    text.split("{{")
        .skip(1)
        .filter_map(|r| r.split_once("}}"))
        .map(|(l, _)| l.trim().to_string())
        .collect()
}

/// (where, PromQL, legend).
type Query = (String, String, String);

/// Every query of the dashboard, and the label each
/// `label_values(query, label)` variable reads (with where).
fn dashboard_queries() -> (Vec<Query>, Vec<(String, String)>) {
    let path = chart_file("kroce-dashboard.json");
    let text = std::fs::read_to_string(&path).expect("read dashboard");
    let dash: serde_json::Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut queries = Vec::new();
    for p in dash["panels"].as_array().expect("panels") {
        for t in p["targets"].as_array().into_iter().flatten() {
            queries.push((
                format!("panel {:?} {}", p["title"], t["refId"]),
                t["expr"].as_str().unwrap_or_default().to_string(),
                t["legendFormat"].as_str().unwrap_or_default().to_string(),
            ));
        }
    }
    let mut var_labels = Vec::new();
    for v in dash["templating"]["list"].as_array().expect("templating") {
        let Some(q) = v["query"]["query"].as_str() else {
            continue;
        };
        let inner = q
            .strip_prefix("label_values(")
            .and_then(|r| r.strip_suffix(')'))
            .unwrap_or_else(|| panic!("variable {}: not label_values(...): {q}", v["name"]));
        let (expr, label) = inner.rsplit_once(',').expect("label_values(expr, label)");
        let at = format!("variable {}", v["name"]);
        queries.push((at.clone(), expr.to_string(), String::new()));
        var_labels.push((at, label.trim().to_string()));
    }
    (queries, var_labels)
}

#[test]
fn every_metric_and_label_in_the_dashboard_is_exported() {
    let (metrics, labels) = exported_metric_names();
    let (queries, var_labels) = dashboard_queries();
    assert!(queries.len() >= 20, "{queries:?}");
    let mut problems = Vec::new();
    for (at, expr, legend) in &queries {
        let used = used_names(expr);
        if used.metrics.is_empty() {
            problems.push(format!("{at}: no kroce_ metric in {expr:?}"));
        }
        for m in used.metrics.difference(&metrics) {
            problems.push(format!("{at}: metric {m} is not exported"));
        }
        for l in used.labels.difference(&labels) {
            problems.push(format!("{at}: label {l} is not exported"));
        }
        for l in legend_labels(legend) {
            if !labels.contains(&l) {
                problems.push(format!("{at}: legend uses label {l}, not exported"));
            }
        }
    }
    for (at, l) in &var_labels {
        if !labels.contains(l) {
            problems.push(format!("{at}: reads label {l}, not exported"));
        }
    }
    let vars: BTreeSet<&str> = var_labels
        .iter()
        .filter_map(|(at, _)| at.strip_prefix("variable "))
        .map(|n| n.trim_matches('"'))
        .collect();
    assert_eq!(
        vars,
        BTreeSet::from(["node", "device", "port"]),
        "dashboard variables"
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn a_renamed_metric_or_label_is_caught() {
    let (metrics, labels) = exported_metric_names();
    let u = used_names(
        r#"rate(kroce_rdma_pause_frame_total{node=~"$node",prio="3"}[$__rate_interval])"#,
    );
    assert!(!u.metrics.is_subset(&metrics), "{u:?}");
    assert!(!u.labels.is_subset(&labels), "{u:?}");
    assert_eq!(
        legend_labels("{{direction}} prio {{ priority }}"),
        BTreeSet::from(["direction".into(), "priority".into()])
    );
}
