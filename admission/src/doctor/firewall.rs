//! Does a host firewall ruleset let RoCE v2 (UDP destination port 4791)
//! through? Reads the text of `iptables-save` or `nft list ruleset`.
//!
//! This is a first-match walk of the filter chains on the input and output
//! hooks, following jumps to user chains, for a UDP packet to port 4791 on a
//! non-loopback interface. A rule that also matches on anything else
//! (addresses, interfaces, conntrack state, marks, named sets) may or may not
//! apply: a drop there makes the result "may block", and an accept there
//! cannot be counted on. Other tables (raw, mangle) are not read.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// RoCE v2's IANA UDP port.
pub const ROCE_V2_UDP_PORT: u32 = 4791;
const MAX_JUMP_DEPTH: usize = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum FirewallVerdict {
    Open,
    Unrecognized,
    MayBlock,
    Blocked,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FirewallFinding {
    pub verdict: FirewallVerdict,
    /// `iptables` or `nftables` when recognised.
    pub format: Option<String>,
    /// The deciding rule or policy, with its line number.
    pub evidence: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    Accept,
    Drop,
    Jump(String),
    Goto(String),
    Return,
    /// LOG, counter-only rules and the like: the walk continues.
    Continue,
}

#[derive(Debug, Clone)]
struct Rule {
    line: usize,
    text: String,
    /// The rule cannot match a UDP/4791 packet.
    excludes: bool,
    /// The rule matches on something else too.
    conditional: bool,
    target: Target,
}

#[derive(Debug, Clone, Default)]
struct Chain {
    /// `Some(true)` when the policy accepts (base chains only).
    policy_accept: Option<bool>,
    policy_line: usize,
    base: bool,
    rules: Vec<Rule>,
}

/// Splits on whitespace, keeping `"quoted strings"` whole and making `{`,
/// `}`, `,` and `;` tokens of their own (nft syntax).
fn tokens(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    for ch in line.chars() {
        if quoted {
            cur.push(ch);
            if ch == '"' {
                quoted = false;
            }
            continue;
        }
        match ch {
            '"' => {
                cur.push(ch);
                quoted = true;
            }
            '{' | '}' | ',' | ';' => {
                if !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
                out.push(ch.to_string());
            }
            c if c.is_whitespace() => {
                if !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
            }
            c => cur.push(c),
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// `4791`, `4000:5000` (iptables) or `4000-5000` (nft).
fn port_spec_includes(spec: &str, port: u32) -> Option<bool> {
    let (lo, hi) = match spec.split_once([':', '-']) {
        Some((a, b)) => (a, b),
        None => (spec, spec),
    };
    let lo: u32 = if lo.is_empty() { 0 } else { lo.parse().ok()? };
    let hi: u32 = if hi.is_empty() {
        65535
    } else {
        hi.parse().ok()?
    };
    Some(lo <= port && port <= hi)
}

fn is_loopback(name: &str) -> bool {
    name.trim_matches('"') == "lo"
}

fn parse_iptables_rule(line: usize, text: &str, toks: &[String]) -> Rule {
    let mut excludes = false;
    let mut conditional = false;
    let mut target = Target::Continue;
    let mut i = 2; // after `-A CHAIN`
    while i < toks.len() {
        let t = toks[i].as_str();
        let arg = toks.get(i + 1).map(String::as_str).unwrap_or("");
        match t {
            "!" => {
                conditional = true;
                i += 1;
                continue;
            }
            "-p" | "--protocol" => {
                if !(arg == "udp" || arg == "17" || arg == "all") {
                    excludes = true;
                }
                i += 2;
            }
            "--dport" | "--destination-port" | "--dports" | "--destination-ports" => {
                let any = arg
                    .split(',')
                    .any(|s| port_spec_includes(s, ROCE_V2_UDP_PORT) == Some(true));
                if !any {
                    excludes = true;
                }
                i += 2;
            }
            "-m" | "--match" => {
                // `-m udp` / `-m multiport` only enable the options above;
                // other modules add conditions.
                if !(arg == "udp" || arg == "multiport" || arg == "comment") {
                    conditional = true;
                }
                i += 2;
            }
            "--comment" => i += 2,
            "-i" | "--in-interface" | "-o" | "--out-interface" => {
                if is_loopback(arg) {
                    excludes = true;
                } else {
                    conditional = true;
                }
                i += 2;
            }
            "-j" | "--jump" | "-g" | "--goto" => {
                target = match arg {
                    "ACCEPT" => Target::Accept,
                    "DROP" | "REJECT" => Target::Drop,
                    "RETURN" => Target::Return,
                    "LOG" | "NFLOG" | "MARK" | "CONNMARK" | "TRACE" | "AUDIT" => Target::Continue,
                    chain if t == "-g" || t == "--goto" => Target::Goto(chain.to_string()),
                    chain => Target::Jump(chain.to_string()),
                };
                i += 2;
            }
            // Options of a target (`--reject-with ...`, `--log-prefix ...`).
            o if o.starts_with("--") && target != Target::Continue => i += 2,
            _ => {
                conditional = true;
                i += 1;
            }
        }
    }
    Rule {
        line,
        text: text.trim().to_string(),
        excludes,
        conditional,
        target,
    }
}

fn parse_iptables(text: &str) -> BTreeMap<String, Chain> {
    let mut chains: BTreeMap<String, Chain> = BTreeMap::new();
    let mut table = String::new();
    for (idx, line) in text.lines().enumerate() {
        let line_no = idx + 1;
        let t = line.trim();
        if let Some(name) = t.strip_prefix('*') {
            table = name.to_string();
            continue;
        }
        if table != "filter" {
            continue;
        }
        if let Some(rest) = t.strip_prefix(':') {
            let mut parts = rest.split_whitespace();
            let (Some(name), Some(policy)) = (parts.next(), parts.next()) else {
                continue;
            };
            let c = chains.entry(name.to_string()).or_default();
            if policy != "-" {
                c.base = true;
                c.policy_accept = Some(policy == "ACCEPT");
                c.policy_line = line_no;
            }
            continue;
        }
        let toks = tokens(t);
        if toks.len() >= 2 && (toks[0] == "-A" || toks[0] == "--append") {
            let rule = parse_iptables_rule(line_no, t, &toks);
            chains.entry(toks[1].clone()).or_default().rules.push(rule);
        }
    }
    chains
}

fn parse_nft_rule(line: usize, text: &str, toks: &[String]) -> Rule {
    let mut excludes = false;
    let mut conditional = false;
    let mut target = Target::Continue;
    let mut i = 0;
    while i < toks.len() {
        let t = toks[i].as_str();
        let next = toks.get(i + 1).map(String::as_str).unwrap_or("");
        match t {
            "udp" | "th" if next == "dport" => {
                let (vals, used) = value_list(&toks[i + 2..]);
                let any = vals
                    .iter()
                    .any(|v| port_spec_includes(v, ROCE_V2_UDP_PORT) == Some(true));
                if vals.iter().any(|v| v.starts_with('@')) {
                    conditional = true;
                } else if !any {
                    excludes = true;
                }
                i += 2 + used;
            }
            "tcp" | "sctp" | "dccp" | "icmp" | "icmpv6" | "udplite" => {
                excludes = true;
                i += 1;
            }
            "meta" if next == "l4proto" => {
                let (vals, used) = value_list(&toks[i + 2..]);
                if !vals.iter().any(|v| v == "udp" || v == "17") {
                    excludes = true;
                }
                i += 2 + used;
            }
            "ip" | "ip6" if next == "protocol" || next == "nexthdr" => {
                let (vals, used) = value_list(&toks[i + 2..]);
                if !vals.iter().any(|v| v == "udp" || v == "17") {
                    excludes = true;
                }
                i += 2 + used;
            }
            "iif" | "iifname" | "oif" | "oifname" => {
                if is_loopback(next) {
                    excludes = true;
                } else {
                    conditional = true;
                }
                i += 2;
            }
            "comment" => i += 2,
            "counter" | "log" | "limit" | "notrack" => {
                // Statements, not matches: `counter packets 0 bytes 0`.
                i += 1;
                while i < toks.len()
                    && matches!(toks[i].as_str(), "packets" | "bytes" | "prefix" | "level")
                {
                    i += 2;
                }
            }
            "accept" => {
                target = Target::Accept;
                i += 1;
            }
            "drop" | "reject" => {
                target = Target::Drop;
                break;
            }
            "return" => {
                target = Target::Return;
                i += 1;
            }
            "jump" => {
                target = Target::Jump(next.to_string());
                i += 2;
            }
            "goto" => {
                target = Target::Goto(next.to_string());
                i += 2;
            }
            _ => {
                conditional = true;
                i += 1;
            }
        }
    }
    Rule {
        line,
        text: text.trim().to_string(),
        excludes,
        conditional,
        target,
    }
}

/// A single value or a `{ a, b }` set; returns the values and tokens used.
fn value_list(toks: &[String]) -> (Vec<String>, usize) {
    match toks.first().map(String::as_str) {
        Some("{") => {
            let mut vals = Vec::new();
            let mut used = 1;
            for t in &toks[1..] {
                used += 1;
                match t.as_str() {
                    "}" => break,
                    "," => {}
                    v => vals.push(v.to_string()),
                }
            }
            (vals, used)
        }
        Some(v) => (vec![v.to_string()], 1),
        None => (Vec::new(), 0),
    }
}

fn parse_nft(text: &str) -> BTreeMap<String, Chain> {
    let mut chains: BTreeMap<String, Chain> = BTreeMap::new();
    let mut table = String::new();
    let mut chain: Option<String> = None;
    let mut depth = 0usize;
    for (idx, line) in text.lines().enumerate() {
        let line_no = idx + 1;
        let t = line.trim();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        let toks = tokens(t);
        let opens = toks.iter().filter(|x| *x == "{").count();
        let closes = toks.iter().filter(|x| *x == "}").count();
        if depth == 0 && toks.first().map(String::as_str) == Some("table") {
            table = toks[1..toks.len().saturating_sub(1)].join(" ");
        } else if depth == 1 && toks.first().map(String::as_str) == Some("chain") {
            if let Some(name) = toks.get(1) {
                let key = format!("{table}/{name}");
                chains.entry(key.clone()).or_default();
                chain = Some(key);
            }
        } else if depth == 2
            && let Some(key) = &chain
        {
            let c = chains.entry(key.clone()).or_default();
            if toks.first().map(String::as_str) == Some("type") {
                let hook = toks
                    .iter()
                    .position(|x| x == "hook")
                    .and_then(|p| toks.get(p + 1))
                    .map(String::as_str);
                let is_filter = toks.get(1).map(String::as_str) == Some("filter");
                if is_filter && matches!(hook, Some("input") | Some("output")) {
                    c.base = true;
                    c.policy_accept = Some(true);
                    c.policy_line = line_no;
                }
                if let Some(p) = toks.iter().position(|x| x == "policy")
                    && c.base
                {
                    c.policy_accept = Some(toks.get(p + 1).map(String::as_str) != Some("drop"));
                }
            } else if toks.first().map(String::as_str) == Some("policy") {
                c.policy_accept = Some(toks.get(1).map(String::as_str) != Some("drop"));
                c.policy_line = line_no;
            } else if opens == closes {
                // Balanced braces are an anonymous set (`{ 4791, 5000 }`).
                c.rules.push(parse_nft_rule(line_no, t, &toks));
            }
        }
        depth = (depth + opens).saturating_sub(closes);
        if depth < 2 {
            chain = None;
        }
    }
    chains
}

#[derive(Debug, Default)]
struct Walk {
    may_block: Option<(usize, String)>,
    may_accept: bool,
}

/// First decisive rule for a UDP/4791 packet: `Some((accepted, line, text))`.
fn walk(
    chains: &BTreeMap<String, Chain>,
    name: &str,
    depth: usize,
    w: &mut Walk,
) -> Option<(bool, usize, String)> {
    if depth > MAX_JUMP_DEPTH {
        return None;
    }
    let chain = chains.get(name)?;
    for r in &chain.rules {
        if r.excludes {
            continue;
        }
        match &r.target {
            Target::Continue => {}
            Target::Accept if r.conditional => w.may_accept = true,
            Target::Drop if r.conditional => {
                if w.may_block.is_none() {
                    w.may_block = Some((r.line, r.text.clone()));
                }
            }
            Target::Accept => return Some((true, r.line, r.text.clone())),
            Target::Drop => return Some((false, r.line, r.text.clone())),
            Target::Return => {
                if !r.conditional {
                    return None;
                }
            }
            Target::Jump(to) | Target::Goto(to) => {
                let jumped = chain_key(chains, name, to);
                if let Some(d) = walk(chains, &jumped, depth + 1, w) {
                    if r.conditional {
                        // Only taken for some packets.
                        if d.0 {
                            w.may_accept = true;
                        } else if w.may_block.is_none() {
                            w.may_block = Some((d.1, d.2));
                        }
                    } else {
                        return Some(d);
                    }
                }
                if matches!(r.target, Target::Goto(_)) && !r.conditional {
                    return None;
                }
            }
        }
    }
    None
}

/// nft chains are keyed `table/chain`; a jump stays in its table.
fn chain_key(chains: &BTreeMap<String, Chain>, from: &str, to: &str) -> String {
    match from.rsplit_once('/') {
        Some((table, _)) => {
            let k = format!("{table}/{to}");
            if chains.contains_key(&k) {
                k
            } else {
                to.to_string()
            }
        }
        None => to.to_string(),
    }
}

fn judge(chains: &BTreeMap<String, Chain>, bases: &[String], format: &str) -> FirewallFinding {
    let mut worst = FirewallFinding {
        verdict: FirewallVerdict::Open,
        format: Some(format.to_string()),
        evidence: "no rule or policy drops UDP port 4791".into(),
    };
    let raise = |f: FirewallFinding, worst: &mut FirewallFinding| {
        if f.verdict > worst.verdict {
            *worst = f;
        }
    };
    for b in bases {
        let Some(chain) = chains.get(b) else { continue };
        let mut w = Walk::default();
        let decided = walk(chains, b, 0, &mut w);
        let may_block = |line: usize, text: &str| FirewallFinding {
            verdict: FirewallVerdict::MayBlock,
            format: Some(format.into()),
            evidence: format!("chain {b}, line {line} drops some UDP 4791 traffic: {text}"),
        };
        let f = match decided {
            Some((false, line, text)) => FirewallFinding {
                verdict: FirewallVerdict::Blocked,
                format: Some(format.into()),
                evidence: format!("chain {b}, line {line}: {text}"),
            },
            Some((true, ..)) => match &w.may_block {
                Some((line, text)) => may_block(*line, text),
                None => continue,
            },
            None if chain.policy_accept == Some(false) => FirewallFinding {
                verdict: if w.may_accept {
                    FirewallVerdict::MayBlock
                } else {
                    FirewallVerdict::Blocked
                },
                format: Some(format.into()),
                evidence: format!(
                    "chain {b} policy drop (line {}) and no rule accepts UDP port 4791{}",
                    chain.policy_line,
                    if w.may_accept { " unconditionally" } else { "" }
                ),
            },
            None => match &w.may_block {
                Some((line, text)) => may_block(*line, text),
                None => continue,
            },
        };
        raise(f, &mut worst);
    }
    worst
}

/// Judges a ruleset text (`iptables-save` or `nft list ruleset` output).
pub fn analyze(ruleset: &str) -> FirewallFinding {
    let looks_iptables = ruleset
        .lines()
        .any(|l| l.trim_start().starts_with("*filter") || l.trim_start().starts_with("-A "));
    let looks_nft = ruleset
        .lines()
        .any(|l| l.trim_start().starts_with("table "));
    if looks_iptables {
        let chains = parse_iptables(ruleset);
        let bases: Vec<String> = ["INPUT", "OUTPUT"].iter().map(|s| s.to_string()).collect();
        judge(&chains, &bases, "iptables")
    } else if looks_nft {
        let chains = parse_nft(ruleset);
        let bases: Vec<String> = chains
            .iter()
            .filter(|(_, c)| c.base)
            .map(|(k, _)| k.clone())
            .collect();
        judge(&chains, &bases, "nftables")
    } else {
        FirewallFinding {
            verdict: FirewallVerdict::Unrecognized,
            format: None,
            evidence: "ruleset is neither iptables-save nor nft list ruleset output".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iptables_explicit_drop_is_blocked_with_its_line() {
        let r = "*filter\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n-A INPUT -p udp -m udp --dport 4791 -j DROP\nCOMMIT\n";
        let f = analyze(r);
        assert_eq!(f.verdict, FirewallVerdict::Blocked, "{f:?}");
        assert!(f.evidence.contains("line 4"), "{f:?}");
    }

    #[test]
    fn iptables_policy_drop_with_accept_is_open() {
        let r = "*filter\n:INPUT DROP [0:0]\n:OUTPUT ACCEPT [0:0]\n-A INPUT -i lo -j ACCEPT\n-A INPUT -p udp -m multiport --dports 4000:5000 -j ACCEPT\nCOMMIT\n";
        assert_eq!(analyze(r).verdict, FirewallVerdict::Open);
        let r = "*filter\n:INPUT DROP [0:0]\n-A INPUT -p tcp --dport 22 -j ACCEPT\nCOMMIT\n";
        let f = analyze(r);
        assert_eq!(f.verdict, FirewallVerdict::Blocked);
        assert!(f.evidence.contains("policy drop"), "{f:?}");
    }

    #[test]
    fn iptables_follows_user_chains_and_flags_conditional_drops() {
        let r = "*filter\n:INPUT ACCEPT [0:0]\n:KUBE-FIREWALL - [0:0]\n-A INPUT -j KUBE-FIREWALL\n-A KUBE-FIREWALL -m mark --mark 0x8000/0x8000 -j DROP\nCOMMIT\n";
        let f = analyze(r);
        assert_eq!(f.verdict, FirewallVerdict::MayBlock, "{f:?}");
        let r = "*filter\n:INPUT ACCEPT [0:0]\n:BLOCK - [0:0]\n-A INPUT -j BLOCK\n-A BLOCK -p udp -j REJECT --reject-with icmp-port-unreachable\nCOMMIT\n";
        assert_eq!(analyze(r).verdict, FirewallVerdict::Blocked);
    }

    #[test]
    fn nft_rules_sets_and_policies() {
        let open = "table inet filter {\n\tchain input {\n\t\ttype filter hook input priority filter; policy drop;\n\t\tiif \"lo\" accept\n\t\tudp dport { 4791, 5000-5100 } accept\n\t}\n}\n";
        assert_eq!(analyze(open).verdict, FirewallVerdict::Open);
        let blocked = "table inet filter {\n\tchain input {\n\t\ttype filter hook input priority filter; policy accept;\n\t\tudp dport 4791 counter packets 0 bytes 0 drop\n\t}\n}\n";
        let f = analyze(blocked);
        assert_eq!(f.verdict, FirewallVerdict::Blocked, "{f:?}");
        assert!(f.evidence.contains("line 4"), "{f:?}");
        let policy = "table ip filter {\n\tchain output {\n\t\ttype filter hook output priority 0; policy drop;\n\t\ttcp dport 443 accept\n\t}\n}\n";
        assert_eq!(analyze(policy).verdict, FirewallVerdict::Blocked);
        let jump = "table inet fw {\n\tchain input {\n\t\ttype filter hook input priority 0; policy accept;\n\t\tjump roce\n\t}\n\tchain roce {\n\t\tmeta l4proto udp drop\n\t}\n}\n";
        assert_eq!(analyze(jump).verdict, FirewallVerdict::Blocked);
    }

    #[test]
    fn unknown_text_is_unrecognized() {
        assert_eq!(analyze("hello").verdict, FirewallVerdict::Unrecognized);
    }
}
