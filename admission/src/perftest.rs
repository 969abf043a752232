//! Parser for the text output of perftest's `ib_{write,read,send}_bw` and
//! `ib_{write,read,send}_lat`: the `key : value` header perftest prints
//! before the run and the results table after it.
//!
//! Formats accepted (from perftest's `perftest_parameters.{h,c}`):
//! - bandwidth tables headed `BW peak[Gb/sec]` (`--report_gbits`),
//!   `BW peak[MB/sec]` (perftest before 2024) or `BW peak[MiB/sec]` (after
//!   linux-rdma/perftest#257 relabelled the same numbers), with optional
//!   `#sl`, per-port and `CPU_Util[%]` columns;
//! - rows printed with 2 decimals (`REPORT_FMT`) or 6 decimals
//!   (`REPORT_FMT_EXT`, used when the Gb/s average is below 0.1);
//! - `-D` duration runs, where perftest computes no peak and prints 0;
//! - all-sizes (`-a`) tables, one row per message size;
//! - latency tables with `t_min`, `t_max`, `t_typical`, `t_avg`, `t_stdev`,
//!   `99% percentile`, `99.9% percentile` (older releases print fewer of
//!   these: missing columns are `None`) and the duration form `t_avg[usec]
//!   tps average`.
//!
//! The header's two-column lines parse whether the columns are separated by
//! tabs (as perftest prints them) or by runs of spaces (the same output after
//! `expand`, a terminal copy or an issue tracker); result rows are strict.
//!
//! A table that is opened but never closed by perftest's dashed line, a row
//! that does not parse, or a header field with a malformed value is an error
//! naming the line number and its content. Lines of three dots are a
//! publisher's elision and are skipped; other text lines inside the table
//! (perftest interleaves warnings such as "Conflicting CPU frequency values
//! detected") are kept as notes.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One Gbit in bytes: perftest's `--report_gbits` divides bytes/s by
/// 125,000,000 (`format_factor` in `print_report_bw`), i.e. Gb = 10^9 bits.
const BYTES_PER_GBIT: f64 = 125_000_000.0;
/// perftest's "MB" is 2^20 bytes: `format_factor = 0x100000` for MBS in
/// `print_report_bw`, and its `--report_gbits` help says "MB=2^20 byte, while
/// Gb=10^9 bits". perftest#257 (2024) renamed the header `MiB/sec` without
/// changing the number, so `MB/sec` and `MiB/sec` convert identically.
const BYTES_PER_PERFTEST_MB: f64 = 1_048_576.0;

/// Longest line content quoted in an error.
const MAX_QUOTE: usize = 160;

/// The unit of a bandwidth table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum BandwidthUnit {
    /// `Gb/sec`: 10^9 bits per second.
    #[serde(rename = "Gb/sec")]
    GbitPerSec,
    /// `MB/sec` as perftest prints it: 2^20 bytes per second.
    #[serde(rename = "MB/sec")]
    MBPerSec,
    /// `MiB/sec`: 2^20 bytes per second.
    #[serde(rename = "MiB/sec")]
    MiBPerSec,
}

impl BandwidthUnit {
    fn from_label(unit: &str) -> Option<BandwidthUnit> {
        match unit {
            "Gb/sec" => Some(BandwidthUnit::GbitPerSec),
            "MB/sec" => Some(BandwidthUnit::MBPerSec),
            "MiB/sec" => Some(BandwidthUnit::MiBPerSec),
            _ => None,
        }
    }

    /// Converts a value in this unit to Gbit/s (10^9 bits per second).
    pub fn to_gbps(self, value: f64) -> f64 {
        match self {
            BandwidthUnit::GbitPerSec => value,
            BandwidthUnit::MBPerSec | BandwidthUnit::MiBPerSec => {
                value * BYTES_PER_PERFTEST_MB / BYTES_PER_GBIT
            }
        }
    }
}

/// The RDMA operation a test measures (from the title line).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Verb {
    Send,
    Write,
    Read,
    Atomic,
}

/// Iteration-count runs (`-n`) or fixed-duration runs (`-D`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum TestMode {
    Iterations,
    Duration,
}

/// The header perftest prints before the run. Every field is optional: the
/// header is absent under `--output` modes and publishers often elide it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PerftestHeader {
    /// e.g. `RDMA_Write BW Test`.
    pub title: Option<String>,
    pub verb: Option<Verb>,
    pub bidirectional: bool,
    pub device: Option<String>,
    pub gid_index: Option<u32>,
    /// Path MTU in bytes (`Mtu : 4096[B]`).
    pub mtu: Option<u32>,
    /// `Ethernet` or `IB`.
    pub link_type: Option<String>,
    /// `IB` (RDMA transport) or `IW`.
    pub transport: Option<String>,
    /// `RC`, `UC`, `UD`, ...
    pub connection: Option<String>,
    pub qps: Option<u32>,
    /// Every `key : value` pair seen, keys as printed (trimmed).
    pub fields: BTreeMap<String, String>,
}

/// One row of a bandwidth table, normalised to Gbit/s.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BandwidthRow {
    pub bytes: u64,
    pub iterations: u64,
    /// 0 for `-D` runs (perftest computes no peak then).
    pub peak_gbps: f64,
    pub average_gbps: f64,
    pub msg_rate_mpps: f64,
    /// 1-based line number in the input.
    pub line: usize,
}

/// One row of a latency table, in microseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LatencyRow {
    pub bytes: u64,
    pub iterations: u64,
    pub t_min_us: Option<f64>,
    pub t_max_us: Option<f64>,
    /// The median.
    pub t_typical_us: Option<f64>,
    pub t_avg_us: Option<f64>,
    pub t_stdev_us: Option<f64>,
    pub p99_us: Option<f64>,
    pub p999_us: Option<f64>,
    /// Transactions per second (duration runs only).
    pub tps: Option<f64>,
    pub line: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum PerftestResults {
    Bandwidth {
        /// The unit the table was printed in (rows are already in Gbit/s).
        unit: BandwidthUnit,
        rows: Vec<BandwidthRow>,
    },
    Latency {
        rows: Vec<LatencyRow>,
    },
}

/// A parsed perftest run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PerftestReport {
    pub header: PerftestHeader,
    pub results: PerftestResults,
    /// Inferred: perftest does not print `-D` in its header. Duration when
    /// the latency table has the `t_avg`/`tps average` form, or when every
    /// bandwidth peak is 0 (what `-D` prints; `-N`/`--noPeak` prints the same).
    pub mode: TestMode,
    /// Line of the `#bytes` table header.
    pub table_line: usize,
    /// Text lines perftest interleaved into the table, with line numbers.
    pub notes: Vec<(usize, String)>,
}

impl PerftestReport {
    pub fn bandwidth_rows(&self) -> &[BandwidthRow] {
        match &self.results {
            PerftestResults::Bandwidth { rows, .. } => rows,
            PerftestResults::Latency { .. } => &[],
        }
    }

    pub fn latency_rows(&self) -> &[LatencyRow] {
        match &self.results {
            PerftestResults::Latency { rows } => rows,
            PerftestResults::Bandwidth { .. } => &[],
        }
    }

    /// The highest average bandwidth over all rows (the only row of a
    /// single-size run; the plateau of an all-sizes run).
    pub fn best_average_gbps(&self) -> Option<f64> {
        self.bandwidth_rows()
            .iter()
            .map(|r| r.average_gbps)
            .fold(None, |m, v| Some(m.map_or(v, |m: f64| m.max(v))))
    }
}

/// Why perftest output was refused. Every variant names the line.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PerftestError {
    #[error("no perftest results table (no `#bytes` header) in {lines} lines of output")]
    NoResults { lines: usize },
    #[error(
        "perftest output truncated: the results table opened at line {table_line} is not closed; last line {line}: {content:?}"
    )]
    Truncated {
        table_line: usize,
        line: usize,
        content: String,
    },
    #[error("perftest results table at line {table_line} has no rows (closed at line {line})")]
    EmptyTable { table_line: usize, line: usize },
    #[error("line {line}: garbled perftest row {content:?}: {reason}")]
    GarbledRow {
        line: usize,
        content: String,
        reason: String,
    },
    #[error("line {line}: unsupported perftest table header {content:?}: {reason}")]
    BadTableHeader {
        line: usize,
        content: String,
        reason: String,
    },
    #[error("line {line}: perftest header field {field:?} has malformed value {value:?}")]
    BadHeaderField {
        line: usize,
        field: String,
        value: String,
    },
    #[error(
        "line {line}: a second results table starts (the first at line {first}); interleaved output? {content:?}"
    )]
    SecondTable {
        line: usize,
        first: usize,
        content: String,
    },
}

fn quote(s: &str) -> String {
    let t = s.trim_end();
    if t.chars().count() <= MAX_QUOTE {
        t.to_string()
    } else {
        let mut q: String = t.chars().take(MAX_QUOTE).collect();
        q.push('…');
        q
    }
}

fn is_rule(trimmed: &str) -> bool {
    trimmed.len() >= 10 && trimmed.bytes().all(|b| b == b'-')
}

fn is_elision(trimmed: &str) -> bool {
    trimmed == "..." || trimmed == "…"
}

/// What each column of a table holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Column {
    Bytes,
    Iterations,
    ServiceLevel,
    BwPeak,
    BwAverage,
    MsgRate,
    TMin,
    TMax,
    TTypical,
    TAvg,
    TStdev,
    P99,
    P999,
    Tps,
    /// Known but unused (per-port columns, CPU utilisation).
    Other,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TableKind {
    Bandwidth(BandwidthUnit),
    Latency,
}

#[derive(Debug, Clone)]
struct TableLayout {
    kind: TableKind,
    columns: Vec<Column>,
}

/// Splits a table header into column labels. Labels contain spaces
/// (`BW peak[Gb/sec]`, `99% percentile[usec]`): a label ends at a token
/// ending in `]` or at a `#` token; trailing words form the last label
/// (`tps average`).
fn header_labels(line: &str) -> Vec<String> {
    let mut labels = Vec::new();
    let mut cur: Vec<&str> = Vec::new();
    for tok in line.split_whitespace() {
        if tok.starts_with('#') {
            if !cur.is_empty() {
                labels.push(cur.join(" "));
                cur.clear();
            }
            labels.push(tok.to_string());
            continue;
        }
        cur.push(tok);
        if tok.ends_with(']') {
            labels.push(cur.join(" "));
            cur.clear();
        }
    }
    if !cur.is_empty() {
        labels.push(cur.join(" "));
    }
    labels
}

/// `BW peak[Gb/sec]` -> (`bw peak`, `Gb/sec`).
fn split_unit(label: &str) -> (String, Option<&str>) {
    match label.split_once('[') {
        Some((name, rest)) => (
            name.trim().to_ascii_lowercase(),
            rest.strip_suffix(']').map(str::trim),
        ),
        None => (label.trim().to_ascii_lowercase(), None),
    }
}

fn parse_table_header(line_no: usize, line: &str) -> Result<TableLayout, PerftestError> {
    let bad = |reason: String| PerftestError::BadTableHeader {
        line: line_no,
        content: quote(line),
        reason,
    };
    let mut columns = Vec::new();
    let mut bw_unit: Option<BandwidthUnit> = None;
    let mut latency = false;
    for label in header_labels(line) {
        let (name, unit) = split_unit(&label);
        let col = match name.as_str() {
            "#bytes" => Column::Bytes,
            "#iterations" => Column::Iterations,
            "#sl" => Column::ServiceLevel,
            "bw peak" | "bw average" => {
                let unit = unit.unwrap_or_default();
                let u = BandwidthUnit::from_label(unit)
                    .ok_or_else(|| bad(format!("unknown bandwidth unit {unit:?} in {label:?}")))?;
                if bw_unit.is_some_and(|b| b != u) {
                    return Err(bad("bandwidth columns in two different units".into()));
                }
                bw_unit = Some(u);
                if name == "bw peak" {
                    Column::BwPeak
                } else {
                    Column::BwAverage
                }
            }
            "msgrate" => Column::MsgRate,
            "t_min" | "t_max" | "t_typical" | "t_avg" | "t_stdev" | "99% percentile"
            | "99.9% percentile" => {
                latency = true;
                if unit != Some("usec") {
                    return Err(bad(format!(
                        "latency column {label:?} is not in usec (run without --report-cycles)"
                    )));
                }
                match name.as_str() {
                    "t_min" => Column::TMin,
                    "t_max" => Column::TMax,
                    "t_typical" => Column::TTypical,
                    "t_avg" => Column::TAvg,
                    "t_stdev" => Column::TStdev,
                    "99% percentile" => Column::P99,
                    _ => Column::P999,
                }
            }
            "tps average" => Column::Tps,
            n if n.starts_with("bw port") || n.starts_with("msgrate port") => Column::Other,
            "cpu_util" => Column::Other,
            _ => return Err(bad(format!("unknown column {label:?}"))),
        };
        columns.push(col);
    }
    if columns.first() != Some(&Column::Bytes) {
        return Err(bad("first column is not #bytes".into()));
    }
    if !columns.contains(&Column::Iterations) {
        return Err(bad("no #iterations column".into()));
    }
    let kind = match (bw_unit, latency) {
        (Some(u), false) => {
            if !columns.contains(&Column::BwAverage) {
                return Err(bad("bandwidth table without a BW average column".into()));
            }
            TableKind::Bandwidth(u)
        }
        (None, true) => TableKind::Latency,
        (Some(_), true) => return Err(bad("both bandwidth and latency columns".into())),
        (None, false) => return Err(bad("neither bandwidth nor latency columns".into())),
    };
    Ok(TableLayout { kind, columns })
}

enum ParsedRow {
    Bandwidth(BandwidthRow),
    Latency(LatencyRow),
}

fn parse_row(layout: &TableLayout, line_no: usize, line: &str) -> Result<ParsedRow, PerftestError> {
    let garbled = |reason: String| PerftestError::GarbledRow {
        line: line_no,
        content: quote(line),
        reason,
    };
    let fields: Vec<&str> = line.split_whitespace().collect();
    if fields.len() != layout.columns.len() {
        return Err(garbled(format!(
            "{} fields, the table header has {} columns",
            fields.len(),
            layout.columns.len()
        )));
    }
    let int = |i: usize, what: &str| -> Result<u64, PerftestError> {
        fields[i]
            .parse::<u64>()
            .map_err(|_| garbled(format!("{what} {:?} is not an integer", fields[i])))
    };
    let num = |i: usize, what: &str| -> Result<f64, PerftestError> {
        let v = fields[i]
            .parse::<f64>()
            .map_err(|_| garbled(format!("{what} {:?} is not a number", fields[i])))?;
        if !v.is_finite() || v < 0.0 {
            return Err(garbled(format!(
                "{what} {:?} is not a finite non-negative number",
                fields[i]
            )));
        }
        Ok(v)
    };
    match layout.kind {
        TableKind::Bandwidth(unit) => {
            let mut row = BandwidthRow {
                bytes: 0,
                iterations: 0,
                peak_gbps: 0.0,
                average_gbps: 0.0,
                msg_rate_mpps: 0.0,
                line: line_no,
            };
            for (i, col) in layout.columns.iter().enumerate() {
                match col {
                    Column::Bytes => row.bytes = int(i, "#bytes")?,
                    Column::Iterations => row.iterations = int(i, "#iterations")?,
                    Column::ServiceLevel => {
                        int(i, "#sl")?;
                    }
                    Column::BwPeak => row.peak_gbps = unit.to_gbps(num(i, "BW peak")?),
                    Column::BwAverage => row.average_gbps = unit.to_gbps(num(i, "BW average")?),
                    Column::MsgRate => row.msg_rate_mpps = num(i, "MsgRate")?,
                    _ => {
                        num(i, "column")?;
                    }
                }
            }
            if row.bytes == 0 {
                return Err(garbled("#bytes is 0".into()));
            }
            Ok(ParsedRow::Bandwidth(row))
        }
        TableKind::Latency => {
            let mut row = LatencyRow {
                line: line_no,
                ..LatencyRow::default()
            };
            for (i, col) in layout.columns.iter().enumerate() {
                match col {
                    Column::Bytes => row.bytes = int(i, "#bytes")?,
                    Column::Iterations => row.iterations = int(i, "#iterations")?,
                    Column::TMin => row.t_min_us = Some(num(i, "t_min")?),
                    Column::TMax => row.t_max_us = Some(num(i, "t_max")?),
                    Column::TTypical => row.t_typical_us = Some(num(i, "t_typical")?),
                    Column::TAvg => row.t_avg_us = Some(num(i, "t_avg")?),
                    Column::TStdev => row.t_stdev_us = Some(num(i, "t_stdev")?),
                    Column::P99 => row.p99_us = Some(num(i, "99% percentile")?),
                    Column::P999 => row.p999_us = Some(num(i, "99.9% percentile")?),
                    Column::Tps => row.tps = Some(num(i, "tps average")?),
                    _ => {
                        num(i, "column")?;
                    }
                }
            }
            if row.bytes == 0 {
                return Err(garbled("#bytes is 0".into()));
            }
            Ok(ParsedRow::Latency(row))
        }
    }
}

/// Splits a header line into its columns: at tabs (as perftest prints
/// them) or at runs of two or more spaces (the same output after `expand`,
/// a terminal copy or an issue tracker). Single spaces stay inside keys and
/// values (`Number of qps`, `LID 0000 QPN 0x0108`).
fn header_columns(line: &str) -> Vec<&str> {
    let mut cols = Vec::new();
    let bytes = line.as_bytes();
    let mut start = 0;
    let mut i = 0;
    while i < bytes.len() {
        let sep_len = match bytes[i] {
            b'\t' => 1,
            b' ' if bytes.get(i + 1).is_some_and(|b| *b == b' ' || *b == b'\t') => 2,
            _ => 0,
        };
        if sep_len == 0 {
            i += 1;
            continue;
        }
        cols.push(&line[start..i]);
        // Swallow the whole run of blanks.
        i += sep_len;
        while i < bytes.len() && (bytes[i] == b' ' || bytes[i] == b'\t') {
            i += 1;
        }
        start = i;
    }
    cols.push(&line[start..]);
    cols.into_iter()
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect()
}

/// Splits a header line into `key : value` pairs. perftest prints two pairs
/// per line separated by tabs (`Dual-port : OFF\t\tDevice : mlx5_1`), pads
/// keys to align the colons (`Mtu             : 4096[B]`), and has one key
/// with a tab inside (`rdma_cm QPs\t : OFF`). The header is informational:
/// both the tabbed and the space-expanded layout give the same pairs.
fn header_pairs(line: &str) -> Vec<(String, String)> {
    let cols = header_columns(line);
    let mut segments: Vec<String> = Vec::new();
    for (i, t) in cols.iter().enumerate() {
        let next_is_colon = cols.get(i + 1).is_some_and(|n| n.starts_with(':'));
        match segments.last_mut() {
            // A key padded away from its colon: `Mtu` + `: 4096[B]`.
            Some(prev) if t.starts_with(':') && !prev.contains(':') => {
                prev.push(' ');
                prev.push_str(t);
            }
            // Neither a pair nor a key: a value that itself had a wide gap.
            Some(prev) if !t.contains(':') && !next_is_colon && prev.contains(':') => {
                prev.push(' ');
                prev.push_str(t);
            }
            _ => segments.push((*t).to_string()),
        }
    }
    segments
        .iter()
        .filter_map(|s| {
            let (k, v) = s.split_once(':')?;
            let k = k.trim();
            if k.is_empty() {
                return None;
            }
            Some((k.to_string(), v.trim().to_string()))
        })
        .collect()
}

fn leading_number(v: &str) -> Option<u32> {
    let digits: String = v.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

fn apply_header_pair(
    h: &mut PerftestHeader,
    line_no: usize,
    key: &str,
    value: &str,
) -> Result<(), PerftestError> {
    let bad = || PerftestError::BadHeaderField {
        line: line_no,
        field: key.to_string(),
        value: value.to_string(),
    };
    match key.to_ascii_lowercase().as_str() {
        "device" => h.device = Some(value.to_string()),
        "gid index" => h.gid_index = Some(value.parse().map_err(|_| bad())?),
        // `Mtu : 4096[B]` (older releases: `4096B`).
        "mtu" => h.mtu = Some(leading_number(value).ok_or_else(bad)?),
        "link type" => h.link_type = Some(value.to_string()),
        "transport type" => h.transport = Some(value.to_string()),
        "connection type" => h.connection = Some(value.to_string()),
        "number of qps" => h.qps = Some(value.parse().map_err(|_| bad())?),
        _ => {}
    }
    h.fields.insert(key.to_string(), value.to_string());
    Ok(())
}

/// `RDMA_Write BW Test`, `Send Latency Test`, `RDMA_Read Bidirectional BW Test`.
fn parse_title(trimmed: &str) -> Option<(Option<Verb>, bool)> {
    if !trimmed.ends_with("Test") || trimmed.contains(':') {
        return None;
    }
    if !(trimmed.contains(" BW ") || trimmed.contains(" Latency ")) {
        return None;
    }
    let verb = match trimmed.split_whitespace().next()? {
        "Send" => Some(Verb::Send),
        "RDMA_Write" => Some(Verb::Write),
        "RDMA_Read" => Some(Verb::Read),
        "Atomic" => Some(Verb::Atomic),
        _ => None,
    };
    Some((verb, trimmed.contains("Bidirectional")))
}

enum State {
    Preamble,
    InTable {
        layout: TableLayout,
        table_line: usize,
        bw: Vec<BandwidthRow>,
        lat: Vec<LatencyRow>,
    },
    Done,
}

/// Parses one perftest run's output (server or client side).
pub fn parse(text: &str) -> Result<PerftestReport, PerftestError> {
    let mut header = PerftestHeader::default();
    let mut notes = Vec::new();
    let mut state = State::Preamble;
    let mut finished: Option<(usize, TableLayout, Vec<BandwidthRow>, Vec<LatencyRow>)> = None;
    let mut last = (0usize, "");
    for (idx, raw) in text.lines().enumerate() {
        let line_no = idx + 1;
        let line = raw.strip_suffix('\r').unwrap_or(raw);
        last = (line_no, line);
        let trimmed = line.trim();
        if trimmed.is_empty() || is_elision(trimmed) {
            continue;
        }
        let starts_table = trimmed.starts_with("#bytes");
        state = match state {
            State::Preamble | State::Done if starts_table => {
                if let Some((first, ..)) = &finished {
                    return Err(PerftestError::SecondTable {
                        line: line_no,
                        first: *first,
                        content: quote(line),
                    });
                }
                State::InTable {
                    layout: parse_table_header(line_no, line)?,
                    table_line: line_no,
                    bw: Vec::new(),
                    lat: Vec::new(),
                }
            }
            State::Preamble => {
                if let Some((verb, bidi)) = parse_title(trimmed) {
                    header.title = Some(trimmed.to_string());
                    header.verb = verb;
                    header.bidirectional = bidi;
                } else if !is_rule(trimmed) {
                    for (k, v) in header_pairs(line) {
                        apply_header_pair(&mut header, line_no, &k, &v)?;
                    }
                }
                State::Preamble
            }
            State::InTable {
                layout,
                table_line,
                mut bw,
                mut lat,
            } => {
                if starts_table {
                    return Err(PerftestError::SecondTable {
                        line: line_no,
                        first: table_line,
                        content: quote(line),
                    });
                }
                if is_rule(trimmed) {
                    if bw.is_empty() && lat.is_empty() {
                        return Err(PerftestError::EmptyTable {
                            table_line,
                            line: line_no,
                        });
                    }
                    finished = Some((table_line, layout, bw, lat));
                    State::Done
                } else if trimmed.starts_with(|c: char| c.is_ascii_digit()) {
                    match parse_row(&layout, line_no, line)? {
                        ParsedRow::Bandwidth(r) => bw.push(r),
                        ParsedRow::Latency(r) => lat.push(r),
                    }
                    State::InTable {
                        layout,
                        table_line,
                        bw,
                        lat,
                    }
                } else if trimmed.starts_with(|c: char| c.is_ascii_alphabetic()) {
                    notes.push((line_no, trimmed.to_string()));
                    State::InTable {
                        layout,
                        table_line,
                        bw,
                        lat,
                    }
                } else {
                    return Err(PerftestError::GarbledRow {
                        line: line_no,
                        content: quote(line),
                        reason: "neither a results row nor the closing line".into(),
                    });
                }
            }
            State::Done => State::Done,
        };
    }
    if let State::InTable { table_line, .. } = state {
        return Err(PerftestError::Truncated {
            table_line,
            line: last.0,
            content: quote(last.1),
        });
    }
    let Some((table_line, layout, bw, lat)) = finished else {
        return Err(PerftestError::NoResults { lines: last.0 });
    };
    let (results, mode) = match layout.kind {
        TableKind::Bandwidth(unit) => {
            let mode = if bw.iter().all(|r| r.peak_gbps == 0.0) {
                TestMode::Duration
            } else {
                TestMode::Iterations
            };
            (PerftestResults::Bandwidth { unit, rows: bw }, mode)
        }
        TableKind::Latency => {
            let mode = if layout.columns.contains(&Column::Tps) {
                TestMode::Duration
            } else {
                TestMode::Iterations
            };
            (PerftestResults::Latency { rows: lat }, mode)
        }
    };
    Ok(PerftestReport {
        header,
        results,
        mode,
        table_line,
        notes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_conversions_follow_perftest_format_factor() {
        assert_eq!(BandwidthUnit::GbitPerSec.to_gbps(196.64), 196.64);
        // 11030.78 MiB/s = 11030.78 * 2^20 * 8 / 1e9 Gbit/s.
        let g = BandwidthUnit::MiBPerSec.to_gbps(11030.78);
        assert!((g - 92.5329).abs() < 1e-3, "{g}");
        assert_eq!(
            BandwidthUnit::MBPerSec.to_gbps(1000.0),
            BandwidthUnit::MiBPerSec.to_gbps(1000.0)
        );
        // perftest's own help: Gb = MB / 119.2.
        let factor = 1.0 / BandwidthUnit::MBPerSec.to_gbps(1.0);
        assert!((factor - 119.209).abs() < 1e-3, "{factor}");
    }

    #[test]
    fn header_labels_keep_spaced_names_together() {
        assert_eq!(
            header_labels(
                " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]"
            ),
            vec![
                "#bytes",
                "#iterations",
                "BW peak[Gb/sec]",
                "BW average[Gb/sec]",
                "MsgRate[Mpps]"
            ]
        );
        assert_eq!(
            header_labels(" #bytes        #iterations       t_avg[usec]    tps average"),
            vec!["#bytes", "#iterations", "t_avg[usec]", "tps average"]
        );
        let lat = header_labels(
            " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] ",
        );
        assert_eq!(lat.len(), 9);
        assert_eq!(lat[7], "99% percentile[usec]");
    }

    #[test]
    fn header_pairs_split_tabbed_pairs_and_tabbed_keys() {
        let p = header_pairs(" Dual-port       : OFF\t\tDevice         : mlx5_1");
        assert_eq!(
            p,
            vec![
                ("Dual-port".to_string(), "OFF".to_string()),
                ("Device".to_string(), "mlx5_1".to_string())
            ]
        );
        let p = header_pairs(" rdma_cm QPs\t : OFF");
        assert_eq!(p, vec![("rdma_cm QPs".to_string(), "OFF".to_string())]);
        let pairs = |l: &str| -> Vec<(String, String)> { header_pairs(l) };
        // The same lines after `expand`: runs of spaces separate the columns.
        assert_eq!(
            pairs(" Number of qps   : 1            Transport type : IB"),
            vec![
                ("Number of qps".to_string(), "1".to_string()),
                ("Transport type".to_string(), "IB".to_string())
            ]
        );
        assert_eq!(
            pairs(" rdma_cm QPs     : OFF"),
            vec![("rdma_cm QPs".to_string(), "OFF".to_string())]
        );
        // Single spaces and colons inside values stay.
        assert_eq!(
            pairs(" local address: LID 0000 QPN 0x0108 PSN 0x2f4a1b"),
            vec![(
                "local address".to_string(),
                "LID 0000 QPN 0x0108 PSN 0x2f4a1b".to_string()
            )]
        );
        assert_eq!(
            pairs(" GID: 00:00:00:00:00:00:00:00:00:00:255:255:10:00:00:02"),
            vec![(
                "GID".to_string(),
                "00:00:00:00:00:00:00:00:00:00:255:255:10:00:00:02".to_string()
            )]
        );
        assert!(pairs(" Starting RDMA client  'ib_write_bw'").is_empty());
    }

    #[test]
    fn cycles_latency_is_refused_with_the_line() {
        let text = " #bytes #iterations    t_min[cycles]    t_max[cycles]  t_typical[cycles]\n 2 1000 10 20 15\n----------\n";
        let e = parse(text).unwrap_err();
        assert!(
            matches!(e, PerftestError::BadTableHeader { line: 1, .. }),
            "{e}"
        );
        assert!(e.to_string().contains("report-cycles"), "{e}");
    }
}
