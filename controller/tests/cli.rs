#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The compiled binary: `crd` prints the committed CRDs; `run` checks its
//! flags before it touches the API.

use std::process::Command;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kroce-controller"))
}

#[test]
fn crd_subcommand_prints_the_committed_yaml() {
    let out = bin().arg("crd").output().unwrap();
    assert!(out.status.success());
    let committed = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../charts/kroce/crds/kroce.io_crds.yaml"),
    )
    .unwrap();
    assert_eq!(String::from_utf8(out.stdout).unwrap(), committed);
}

#[test]
fn controller_leader_election_needs_an_identity_and_flags_parse() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-kubeconfig");
    let run = |args: &[&str]| {
        let out = bin()
            .arg("run")
            .args(args)
            .env_remove("POD_NAME")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env("KUBECONFIG", &missing)
            .output()
            .unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    // On by default: without POD_NAME it refuses before touching the API.
    let err = run(&[]);
    assert!(err.contains("POD_NAME"), "{err}");
    // With an identity, or with election off, it gets as far as the client
    // configuration (none here): every new flag parsed.
    for args in [
        &[
            "--leader-identity",
            "pod-a",
            "--lease-name",
            "x",
            "--lease-duration-seconds",
            "30",
        ][..],
        &["--leader-election=false", "--drain-held-vfs"][..],
        &["--leader-election", "false", "--drain-held-vfs=true"][..],
        &[
            "--leader-election=false",
            "--drain-held-vfs",
            "--drain-max-unavailable=10%",
            "--drain-timeout-seconds=600",
        ][..],
    ] {
        let err = run(args);
        assert!(
            err.contains("no Kubernetes client configuration"),
            "{args:?}: {err}"
        );
    }
    let err = run(&["--drain-held-vfs=maybe", "--leader-election=false"]);
    assert!(err.contains("maybe"), "{err}");
    // The budget's grammar is kroce_contracts::max_unavailable's.
    let err = run(&["--drain-max-unavailable=0%", "--leader-election=false"]);
    assert!(
        err.contains("--drain-max-unavailable") && err.contains("\"0%\" is zero"),
        "{err}"
    );
    let err = run(&["--drain-timeout-seconds=5", "--leader-election=false"]);
    assert!(err.contains("--drain-timeout-seconds"), "{err}");
    // The chart's operator.perftest values reach these flags.
    let err = run(&[
        "--perftest-cpus=4",
        "--perftest-memory=2Gi",
        "--leader-election=false",
    ]);
    assert!(err.contains("no Kubernetes client configuration"), "{err}");
    let err = run(&["--perftest-memory=lots", "--leader-election=false"]);
    assert!(
        err.contains("--perftest-memory") && err.contains("not a memory quantity"),
        "{err}"
    );
}

/// The chart's `operator.drainMaxUnavailable` (values.schema.json) admits
/// exactly the grammar `--drain-max-unavailable` parses
/// (`kroce_contracts::max_unavailable`), and the template passes it on.
#[test]
fn chart_drain_values_are_the_flags_grammar() {
    let chart = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/kroce");
    let schema: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(chart.join("values.schema.json")).unwrap())
            .unwrap();
    let op = &schema["properties"]["operator"]["properties"];
    assert_eq!(
        op["drainMaxUnavailable"]["pattern"],
        kroce_contracts::max_unavailable::crd_pattern().as_str()
    );
    // Integers (`--set operator.drainMaxUnavailable=3`) within the count's digits.
    let max = 10u64.pow(kroce_contracts::max_unavailable::MAX_COUNT_DIGITS as u32) - 1;
    assert_eq!(op["drainMaxUnavailable"]["maximum"], max);
    assert_eq!(op["drainMaxUnavailable"]["minimum"], 1);
    // The flag's own range.
    assert_eq!(op["drainTimeoutSeconds"]["minimum"], 60);
    assert_eq!(op["drainTimeoutSeconds"]["maximum"], 604_800);
    let template = std::fs::read_to_string(chart.join("templates/operator.yaml")).unwrap();
    for arg in [
        "--drain-max-unavailable={{ .Values.operator.drainMaxUnavailable }}",
        "--drain-timeout-seconds={{ .Values.operator.drainTimeoutSeconds }}",
    ] {
        assert!(template.contains(arg), "{arg}");
    }
}
