#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The perftest parser on the published outputs in ../shared/fixtures/perftest
//! and on constructed outputs for every documented format variant.

use kroce_admission::perftest::{
    BandwidthUnit, PerftestError, PerftestResults, TestMode, Verb, parse,
};
use proptest::prelude::*;
use std::path::PathBuf;

/// The shared fixtures are part of CI: their absence is a failure, not a skip.
fn fixture(name: &str) -> String {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/fixtures/perftest");
    assert!(
        dir.is_dir(),
        "perftest fixtures missing: {} does not exist (the repository's ../shared must be checked out beside the workspace)",
        dir.display()
    );
    let path = dir.join(name);
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read fixture {}: {e}", path.display()))
}

const ALL_SIZES: &str = "ib_write_bw-all-sizes-gbits-azure-aks.txt";
const READ_LAT: &str = "ib_read_lat-client-azure-aks.txt";

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[test]
fn published_all_sizes_write_bw_in_gbits() {
    let r = parse(&fixture(ALL_SIZES)).unwrap();
    let PerftestResults::Bandwidth { unit, rows } = &r.results else {
        panic!("not a bandwidth table: {r:?}");
    };
    assert_eq!(*unit, BandwidthUnit::GbitPerSec);
    assert_eq!(rows.len(), 23);
    assert_eq!(r.mode, TestMode::Iterations);
    // Sizes 2 .. 8 MiB, doubling.
    let sizes: Vec<u64> = rows.iter().map(|r| r.bytes).collect();
    let expected: Vec<u64> = (1..=23).map(|i| 1u64 << i).collect();
    assert_eq!(sizes, expected);
    assert!(rows.iter().all(|r| r.iterations == 5000));
    // The 6-decimal small-size rows.
    assert!(close(rows[0].peak_gbps, 0.045656), "{:?}", rows[0]);
    assert!(close(rows[0].average_gbps, 0.045526));
    assert!(close(rows[0].msg_rate_mpps, 2.845402));
    assert!(close(rows[1].average_gbps, 0.091284));
    // Then 2 decimals.
    assert!(close(rows[2].average_gbps, 0.18));
    assert!(close(rows[12].peak_gbps, 178.27) && close(rows[12].average_gbps, 147.61));
    assert!(close(rows[22].average_gbps, 196.55));
    assert!(close(rows[22].msg_rate_mpps, 0.002929));
    assert_eq!(r.best_average_gbps(), Some(196.64));
    // Rows carry their line numbers; the table header is line 5.
    assert_eq!(r.table_line, 5);
    assert_eq!(rows[0].line, 6);
    assert_eq!(rows[22].line, 28);
    // The header was elided by the publisher.
    assert_eq!(r.header.device, None);
    assert!(r.notes.is_empty());
}

#[test]
fn published_read_lat_with_percentiles() {
    let r = parse(&fixture(READ_LAT)).unwrap();
    let rows = r.latency_rows();
    assert_eq!(rows.len(), 1);
    let row = &rows[0];
    assert_eq!((row.bytes, row.iterations), (2, 1000));
    assert_eq!(row.t_min_us, Some(5.35));
    assert_eq!(row.t_max_us, Some(11.78));
    assert_eq!(row.t_typical_us, Some(5.49));
    assert_eq!(row.t_avg_us, Some(5.50));
    assert_eq!(row.t_stdev_us, Some(0.18));
    assert_eq!(row.p99_us, Some(5.74));
    assert_eq!(row.p999_us, Some(11.78));
    assert_eq!(row.tps, None);
    assert_eq!(r.mode, TestMode::Iterations);
    // Published pass criterion: t_avg < 6 usec.
    assert!(row.t_avg_us.unwrap() < 6.0);
}

#[test]
fn every_truncation_of_the_published_table_is_an_error_naming_the_last_line() {
    let text = fixture(ALL_SIZES);
    let lines: Vec<&str> = text.lines().collect();
    let closing = lines.iter().rposition(|l| l.starts_with("-----")).unwrap();
    // Cut after the table header and after every row.
    for keep in 5..=closing {
        let prefix = lines[..keep].join("\n");
        match parse(&prefix) {
            Err(PerftestError::Truncated {
                table_line,
                line,
                content,
            }) => {
                assert_eq!(table_line, 5);
                assert_eq!(line, keep, "cut after {keep} lines");
                assert_eq!(content, lines[keep - 1].trim_end());
            }
            other => panic!("cut after {keep} lines: expected Truncated, got {other:?}"),
        }
    }
    // Before the table there is nothing to report.
    assert!(matches!(
        parse(&lines[..4].join("\n")),
        Err(PerftestError::NoResults { lines: 4 })
    ));
    // With the closing line it parses.
    assert!(parse(&lines[..=closing].join("\n")).is_ok());
}

#[test]
fn a_row_cut_mid_line_is_garbled_with_its_line() {
    let text = fixture(ALL_SIZES);
    let lines: Vec<&str> = text.lines().collect();
    // Row for 2097152 bytes (line 26) loses its last two fields.
    let mut broken: Vec<String> = lines.iter().map(|s| s.to_string()).collect();
    broken[25] = " 2097152    5000             196.38".into();
    let e = parse(&broken.join("\n")).unwrap_err();
    match &e {
        PerftestError::GarbledRow { line, content, .. } => {
            assert_eq!(*line, 26);
            assert!(content.contains("2097152"), "{e}");
        }
        other => panic!("{other:?}"),
    }
    assert!(e.to_string().contains("line 26"), "{e}");
}

#[test]
fn garbled_values_name_line_and_content() {
    let text = fixture(READ_LAT);
    for (bad, why) in [
        (
            " 2       1000          5.35           11.78        5.49               abc            0.18            5.74                   11.78",
            "t_avg",
        ),
        (
            " 2       1000          5.35           11.78        5.49               NaN            0.18            5.74                   11.78",
            "finite",
        ),
        (
            " 2       1000          5.35           11.78        5.49               -5.50          0.18            5.74                   11.78",
            "finite",
        ),
        (
            " 2       1000          5.35           11.78        5.49               5.50           0.18            5.74                   11.78   9",
            "fields",
        ),
        (
            " 2x      1000          5.35           11.78        5.49               5.50           0.18            5.74                   11.78",
            "#bytes",
        ),
    ] {
        let t = text.replacen(
            " 2       1000          5.35           11.78        5.49               5.50           0.18            5.74                   11.78",
            bad,
            1,
        );
        let e = parse(&t).unwrap_err();
        let msg = e.to_string();
        assert!(
            matches!(e, PerftestError::GarbledRow { line: 7, .. }),
            "{msg}"
        );
        assert!(msg.contains(why), "{msg}");
        assert!(msg.contains(bad.trim_end()), "{msg}");
    }
    // A line that is neither a row nor text inside the table.
    let t = text.replacen(
        "---------------------------------------------------------------------------------------\n...",
        "%%%% corrupted\n---------------------------------------------------------------------------------------\n...",
        1,
    );
    let e = parse(&t).unwrap_err();
    assert!(
        matches!(&e, PerftestError::GarbledRow { line: 8, content, .. } if content == "%%%% corrupted"),
        "{e:?}"
    );
}

/// A complete client output as perftest 4.5/24.x prints it for RoCE.
const WRITE_BW_DURATION_GBITS: &str = "\
---------------------------------------------------------------------------------------
                    RDMA_Write BW Test
 Dual-port       : OFF\t\tDevice         : mlx5_2
 Number of qps   : 4\t\tTransport type : IB
 Connection type : RC\t\tUsing SRQ      : OFF
 PCIe relax order: ON\t\tLock-free      : OFF
 ibv_wr* API     : ON\t\tUsing DDP      : OFF
 TX depth        : 128
 CQ Moderation   : 100
 CQE Poll Batch  : 16
 Mtu             : 4096[B]
 Link type       : Ethernet
 GID index       : 3
 Max inline data : 0[B]
 rdma_cm QPs\t : OFF
 Data ex. method : Ethernet
---------------------------------------------------------------------------------------
 local address: LID 0000 QPN 0x0108 PSN 0x2f4a1b RKey 0x1fff00 VAddr 0x007f8a4d200000
 GID: 00:00:00:00:00:00:00:00:00:00:255:255:10:00:00:02
 remote address: LID 0000 QPN 0x0109 PSN 0x8c31d2 RKey 0x1fff00 VAddr 0x007f1c3e600000
 GID: 00:00:00:00:00:00:00:00:00:00:255:255:10:00:00:01
---------------------------------------------------------------------------------------
 #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]
 65536      1696410          0.00               92.61  \t\t   0.176636
---------------------------------------------------------------------------------------
";

#[test]
fn duration_run_with_full_roce_header() {
    let r = parse(WRITE_BW_DURATION_GBITS).unwrap();
    let h = &r.header;
    assert_eq!(h.title.as_deref(), Some("RDMA_Write BW Test"));
    assert_eq!(h.verb, Some(Verb::Write));
    assert!(!h.bidirectional);
    assert_eq!(h.device.as_deref(), Some("mlx5_2"));
    assert_eq!(h.gid_index, Some(3));
    assert_eq!(h.mtu, Some(4096));
    assert_eq!(h.link_type.as_deref(), Some("Ethernet"));
    assert_eq!(h.transport.as_deref(), Some("IB"));
    assert_eq!(h.connection.as_deref(), Some("RC"));
    assert_eq!(h.qps, Some(4));
    assert_eq!(h.fields.get("rdma_cm QPs").map(String::as_str), Some("OFF"));
    assert_eq!(h.fields.get("Using DDP").map(String::as_str), Some("OFF"));
    assert_eq!(r.mode, TestMode::Duration);
    let row = &r.bandwidth_rows()[0];
    assert_eq!(row.peak_gbps, 0.0);
    assert_eq!(row.average_gbps, 92.61);
    assert_eq!(row.iterations, 1696410);
}

#[test]
fn mib_and_mb_headers_are_converted_identically() {
    // perftest >= 2024 prints MiB/sec; the same numbers were labelled MB/sec before.
    let mib = "\
                    RDMA_Write BW Test
 Dual-port       : OFF\t\tDevice         : mlx5_1
---------------------------------------------------------------------------------------
 #bytes     #iterations    BW peak[MiB/sec]    BW average[MiB/sec]   MsgRate[Mpps]
Conflicting CPU frequency values detected: 5008.116000 != 3295.212000. CPU Frequency is not max.
 65536      5000             11030.78            11030.45\t\t     0.176487
---------------------------------------------------------------------------------------
";
    let mb = mib.replace("MiB/sec", "MB/sec");
    let a = parse(mib).unwrap();
    let b = parse(&mb).unwrap();
    assert!(matches!(
        a.results,
        PerftestResults::Bandwidth {
            unit: BandwidthUnit::MiBPerSec,
            ..
        }
    ));
    assert!(matches!(
        b.results,
        PerftestResults::Bandwidth {
            unit: BandwidthUnit::MBPerSec,
            ..
        }
    ));
    let ga = a.bandwidth_rows()[0].average_gbps;
    assert_eq!(ga, b.bandwidth_rows()[0].average_gbps);
    // 11030.45 * 2^20 bytes/s * 8 bits = 92.530 Gbit/s.
    assert!(
        (ga - 11030.45 * 1_048_576.0 * 8.0 / 1e9).abs() < 1e-9,
        "{ga}"
    );
    assert!((ga - 92.53).abs() < 0.01, "{ga}");
    // The interleaved warning is kept as a note with its line.
    assert_eq!(a.notes.len(), 1);
    assert_eq!(a.notes[0].0, 5);
    assert!(a.notes[0].1.starts_with("Conflicting CPU frequency"));
    assert_eq!(a.mode, TestMode::Iterations);
}

#[test]
fn duration_run_in_mib_with_zero_peak() {
    let t = "\
 #bytes     #iterations    BW peak[MiB/sec]    BW average[MiB/sec]   MsgRate[Mpps]
 65536      279928           0.00               5830.79               0.093293
---------------------------------------------------------------------------------------
";
    let r = parse(t).unwrap();
    assert_eq!(r.mode, TestMode::Duration);
    let row = &r.bandwidth_rows()[0];
    assert_eq!(row.peak_gbps, 0.0);
    assert!(
        (row.average_gbps - 48.912).abs() < 1e-3,
        "{}",
        row.average_gbps
    );
}

#[test]
fn send_bw_server_side_with_cpu_util_and_read_bw_outstanding_reads() {
    let send = "\
************************************
* Waiting for client to connect... *
************************************
---------------------------------------------------------------------------------------
                    Send BW Test
 Dual-port       : OFF\t\tDevice         : rxe0
 Number of qps   : 1\t\tTransport type : IB
 Connection type : RC\t\tUsing SRQ      : OFF
 RX depth        : 512
 CQ Moderation   : 100
 Mtu             : 1024[B]
 Link type       : Ethernet
 GID index       : 1
 Max inline data : 0[B]
 rdma_cm QPs\t : OFF
 Data ex. method : Ethernet
---------------------------------------------------------------------------------------
 #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]    CPU_Util[%]
 65536      1000             0.00               2.35   \t\t   0.004482\t    43.10
---------------------------------------------------------------------------------------
";
    let r = parse(send).unwrap();
    assert_eq!(r.header.verb, Some(Verb::Send));
    assert_eq!(r.header.device.as_deref(), Some("rxe0"));
    assert_eq!(r.header.mtu, Some(1024));
    assert_eq!(r.bandwidth_rows()[0].average_gbps, 2.35);

    let read = "\
                    RDMA_Read Bidirectional BW Test
 Dual-port       : OFF\t\tDevice         : mlx5_0
 Outstand reads  : 16
 #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]
 1048576    5000             180.12             179.90             0.021446
---------------------------------------------------------------------------------------
";
    let r = parse(read).unwrap();
    assert_eq!(r.header.verb, Some(Verb::Read));
    assert!(r.header.bidirectional);
    assert_eq!(
        r.header.fields.get("Outstand reads").map(String::as_str),
        Some("16")
    );
}

#[test]
fn qos_and_per_port_tables() {
    let qos = "\
 #bytes    #sl      #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]
 65536    3           5000           97.10            96.80                  0.184631
---------------------------------------------------------------------------------------
";
    let r = parse(qos).unwrap();
    assert_eq!(r.bandwidth_rows()[0].iterations, 5000);
    assert_eq!(r.bandwidth_rows()[0].average_gbps, 96.80);
    let per_port = "\
 #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]   BW Port1[MB/sec]   MsgRate Port1[Mpps]   BW Port2[MB/sec]   MsgRate Port2[Mpps]
 65536      5000           11000.00            10000.00\t\t   0.160000        5000.00            0.080000              5000.00            0.080000
---------------------------------------------------------------------------------------
";
    let r = parse(per_port).unwrap();
    assert!((r.bandwidth_rows()[0].average_gbps - 83.886).abs() < 1e-3);
}

#[test]
fn older_latency_formats() {
    // perftest 3.x: three latency columns only.
    let old = "\
                    RDMA_Write Latency Test
 Dual-port       : OFF\t\tDevice         : mlx5_0
 Mtu             : 4096B
 #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]
 2       1000          0.95           4.37         0.98
---------------------------------------------------------------------------------------
";
    let r = parse(old).unwrap();
    assert_eq!(r.header.verb, Some(Verb::Write));
    assert_eq!(r.header.mtu, Some(4096));
    let row = &r.latency_rows()[0];
    assert_eq!(row.t_typical_us, Some(0.98));
    assert_eq!(row.t_avg_us, None);
    assert_eq!(row.p99_us, None);

    // Duration latency (-D): average and transactions per second.
    let dur = "\
                    Send Latency Test
 #bytes        #iterations       t_avg[usec]    tps average
 2             3623017           1.38           724603.40
---------------------------------------------------------------------------------------
";
    let r = parse(dur).unwrap();
    assert_eq!(r.mode, TestMode::Duration);
    let row = &r.latency_rows()[0];
    assert_eq!(row.t_avg_us, Some(1.38));
    assert_eq!(row.tps, Some(724603.40));
}

#[test]
fn structural_errors() {
    // No table at all.
    assert!(matches!(
        parse(" Device : mlx5_0\nCouldn't connect to 10.0.0.1:18515\n"),
        Err(PerftestError::NoResults { lines: 2 })
    ));
    // Header then closing line with no rows.
    let e = parse(" #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]\n---------------------------------------------------------------------------------------\n").unwrap_err();
    assert!(
        matches!(
            e,
            PerftestError::EmptyTable {
                table_line: 1,
                line: 2
            }
        ),
        "{e}"
    );
    // A malformed value in a header field we use.
    let e = parse(" GID index       : three\n").unwrap_err();
    assert!(
        matches!(&e, PerftestError::BadHeaderField { line: 1, field, value } if field == "GID index" && value == "three"),
        "{e}"
    );
    // Two result tables: interleaved outputs.
    let twice = format!(
        "{}{}",
        WRITE_BW_DURATION_GBITS,
        " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]\n"
    );
    let e = parse(&twice).unwrap_err();
    assert!(
        matches!(e, PerftestError::SecondTable { first: 23, .. }),
        "{e}"
    );
    // Unknown unit.
    let e =
        parse(" #bytes     #iterations    BW peak[Kb/sec]    BW average[Kb/sec]   MsgRate[Mpps]\n")
            .unwrap_err();
    assert!(
        matches!(e, PerftestError::BadTableHeader { line: 1, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("Kb/sec"), "{e}");
}

#[test]
fn crlf_output_parses() {
    let r = parse(&fixture(READ_LAT).replace('\n', "\r\n")).unwrap();
    assert_eq!(r.latency_rows()[0].t_avg_us, Some(5.50));
}

/// What `expand` (coreutils, tab stops every 8 columns) makes of perftest
/// output; also what issue trackers and many terminals show. Checked against
/// the real `expand` when it is installed.
fn expand_tabs(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let mut col = 0usize;
        for c in line.chars() {
            if c == '\t' {
                let n = 8 - col % 8;
                out.extend(std::iter::repeat_n(' ', n));
                col += n;
            } else {
                out.push(c);
                col += 1;
            }
        }
    }
    if let Ok(mut child) = std::process::Command::new("expand")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
    {
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
        let got = child.wait_with_output().unwrap();
        assert_eq!(
            String::from_utf8(got.stdout).unwrap(),
            out,
            "expand(1) disagrees"
        );
    }
    assert!(!out.contains('\t'));
    out
}

#[test]
fn space_expanded_header_parses_like_the_tabbed_one() {
    let tabbed = parse(WRITE_BW_DURATION_GBITS).unwrap();
    let spaced_text = expand_tabs(WRITE_BW_DURATION_GBITS);
    // The two-column line as the issue quotes it: 12 spaces, no tab.
    assert!(spaced_text.contains(" Number of qps   : 4            Transport type : IB\n"));
    let spaced = parse(&spaced_text).unwrap();
    assert_eq!(spaced.header, tabbed.header);
    assert_eq!(spaced.header.qps, Some(4));
    assert_eq!(spaced.header.device.as_deref(), Some("mlx5_2"));
    assert_eq!(spaced.header.transport.as_deref(), Some("IB"));
    assert_eq!(
        spaced.header.fields.get("Using SRQ").map(String::as_str),
        Some("OFF")
    );
    assert_eq!(
        spaced.header.fields.get("rdma_cm QPs").map(String::as_str),
        Some("OFF")
    );
    assert_eq!(spaced.results, tabbed.results);
}

/// The published all-sizes table behind a full header, the whole output
/// space-expanded (the fixture's own header was elided by its publisher).
#[test]
fn published_table_with_a_space_expanded_header() {
    let header_end = WRITE_BW_DURATION_GBITS.find(" local address").unwrap();
    let text = format!(
        "{}{}",
        &WRITE_BW_DURATION_GBITS[..header_end],
        fixture(ALL_SIZES)
    );
    let tabbed = parse(&text).unwrap();
    let spaced = parse(&expand_tabs(&text)).unwrap();
    assert_eq!(spaced.header, tabbed.header);
    assert_eq!(spaced.header.qps, Some(4));
    assert_eq!(spaced.results, tabbed.results);
    assert_eq!(spaced.bandwidth_rows().len(), 23);
}

/// Layout as posted in issue trackers: two columns separated by a run of
/// spaces of any width (not a tab-stop multiple), one key with a tab gone.
#[test]
fn space_separated_two_column_header_with_any_gap() {
    let text = "\
                    Atomic CMP_AND_SWAP BW Test
 Dual-port       : OFF          Device         : mlx5_7
 Number of qps   : 2   Transport type : IB
 Connection type : RC\t\tUsing SRQ      : ON
 Mtu             : 1024[B]
 rdma_cm QPs     : OFF
---------------------------------------------------------------------------------------
 #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]
 8          1000           1.70               1.67                 0.219031
---------------------------------------------------------------------------------------
";
    let r = parse(text).unwrap();
    let h = &r.header;
    assert_eq!(h.verb, Some(Verb::Atomic));
    assert_eq!(h.device.as_deref(), Some("mlx5_7"));
    assert_eq!(h.qps, Some(2));
    assert_eq!(h.transport.as_deref(), Some("IB"));
    assert_eq!(h.connection.as_deref(), Some("RC"));
    assert_eq!(h.mtu, Some(1024));
    assert_eq!(h.fields.get("Dual-port").map(String::as_str), Some("OFF"));
    assert_eq!(h.fields.get("Using SRQ").map(String::as_str), Some("ON"));
    assert_eq!(h.fields.get("rdma_cm QPs").map(String::as_str), Some("OFF"));
    assert_eq!(h.fields.len(), 8, "{:?}", h.fields);
}

/// Splitting the columns must not hide a malformed typed value, and result
/// rows stay strict whatever the header layout.
#[test]
fn space_layout_keeps_typed_fields_and_rows_strict() {
    let spaced = expand_tabs(WRITE_BW_DURATION_GBITS);
    let bad = spaced.replacen("Number of qps   : 4 ", "Number of qps   : x ", 1);
    let e = parse(&bad).unwrap_err();
    assert_eq!(
        e,
        PerftestError::BadHeaderField {
            line: 4,
            field: "Number of qps".into(),
            value: "x".into()
        },
        "{e}"
    );
    let garbled = spaced.replacen("92.61", "92.6l", 1);
    let e = parse(&garbled).unwrap_err();
    assert!(matches!(e, PerftestError::GarbledRow { .. }), "{e}");
    assert!(e.to_string().contains("92.6l"), "{e}");
}

fn fmt_bw(v: f64, six: bool) -> String {
    if six {
        format!("{v:.6}")
    } else {
        format!("{v:.2}")
    }
}

proptest! {
    /// Any table perftest could print (2- or 6-decimal rows, any unit)
    /// parses back to the printed values, converted to Gbit/s.
    #[test]
    fn generated_tables_round_trip(
        rows in proptest::collection::vec((1u32..24, 1u64..10_000_000, 0.0f64..400.0, 0.0f64..400.0, 0.0f64..10.0, any::<bool>()), 1..30),
        unit in prop_oneof![Just("Gb/sec"), Just("MB/sec"), Just("MiB/sec")],
    ) {
        let mut text = format!(" #bytes     #iterations    BW peak[{unit}]    BW average[{unit}]   MsgRate[Mpps]\n");
        for (exp, iters, peak, avg, rate, six) in &rows {
            text.push_str(&format!(" {:<7}    {:<10}       {:<7}            {:<7}\t\t   {:.6}\n",
                1u64 << exp, iters, fmt_bw(*peak, *six), fmt_bw(*avg, *six), rate));
        }
        text.push_str("---------------------------------------------------------------------------------------\n");
        let r = parse(&text).unwrap();
        let factor = if unit == "Gb/sec" { 1.0 } else { 1_048_576.0 * 8.0 / 1e9 };
        prop_assert_eq!(r.bandwidth_rows().len(), rows.len());
        for (got, (exp, iters, _, avg, _, six)) in r.bandwidth_rows().iter().zip(&rows) {
            prop_assert_eq!(got.bytes, 1u64 << exp);
            prop_assert_eq!(got.iterations, *iters);
            let printed: f64 = fmt_bw(*avg, *six).parse().unwrap();
            prop_assert!((got.average_gbps - printed * factor).abs() < 1e-9);
        }
    }

    /// Cutting the published output anywhere never panics; a cut inside the
    /// table is always an error, never a shorter result.
    #[test]
    fn cutting_anywhere_never_yields_a_partial_table(cut in 0usize..2079) {
        let text = fixture(ALL_SIZES);
        let cut = cut.min(text.len());
        // perftest's closing line is all dashes; 10 of them already close the table.
        let closing = text.rfind("\n-----").unwrap() + 1;
        let r = parse(&text[..cut]);
        if cut < closing + 10 {
            prop_assert!(r.is_err(), "cut at {cut} parsed: {:?}", r);
        } else {
            prop_assert_eq!(r.unwrap().bandwidth_rows().len(), 23);
        }
    }
}
