#![allow(clippy::unwrap_used, clippy::expect_used)]
//! GC through the REAL libcni (Debian's golang-github-appc-cni-dev 1.3.0,
//! the libcni containerd 2.x embeds), not a hand-written request: a small Go
//! driver (`tests/go/kroce-libcni-gc`) built here in GOPATH mode calls
//! `GCNetworkList`. When no attachment is valid, libcni 1.3 sends
//! `"cni.dev/valid-attachments": null` (api.go: `inject[...] =
//! args.ValidAttachments` with a nil slice); kroce-cni must take that as an
//! empty list and release its stale attachments.
//!
//! Needs root/netns and `KROCE_GOROOT` + `KROCE_LIBCNI_GOPATH` (printed by
//! `ci/real-peers.sh`); skips without them except in CI.

use kroce_cni::testing::{TestBed, skip_without_netns};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The plugin under test: `KROCE_BIN_DIR/kroce-cni` when set (CI points it
/// at the shipped release build), else this package's build.
fn plugin_bin() -> PathBuf {
    std::env::var_os("KROCE_BIN_DIR").map_or_else(
        || PathBuf::from(env!("CARGO_BIN_EXE_kroce-cni")),
        |d| PathBuf::from(d).join("kroce-cni"),
    )
}

/// Builds the driver with the cached Go and libcni; `Err` says what is missing.
fn build_driver(out_dir: &Path) -> Result<PathBuf, String> {
    let goroot = std::env::var_os("KROCE_GOROOT").ok_or("KROCE_GOROOT is not set")?;
    let gopath = std::env::var_os("KROCE_LIBCNI_GOPATH").ok_or("KROCE_LIBCNI_GOPATH is not set")?;
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/go/kroce-libcni-gc/main.go");
    let exe = out_dir.join("kroce-libcni-gc");
    let out = Command::new(Path::new(&goroot).join("bin/go"))
        .args(["build", "-o"])
        .arg(&exe)
        .arg(&src)
        .env("GOROOT", &goroot)
        .env("GOPATH", &gopath)
        .env("GO111MODULE", "off")
        .env("GOFLAGS", "")
        .env("GOTOOLCHAIN", "local")
        .env("GOPROXY", "off")
        .env("GOCACHE", std::env::temp_dir().join("kroce-gocache"))
        .output()
        .map_err(|e| format!("go build: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "go build {}: {}",
            src.display(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(exe)
}

#[test]
fn real_libcni_gc_with_no_valid_attachment_releases_stale_ones() {
    let test = "real_libcni_gc_with_no_valid_attachment_releases_stale_ones";
    if skip_without_netns(test) {
        return;
    }
    let scratch = tempfile::tempdir().unwrap();
    let driver = match build_driver(scratch.path()) {
        Ok(d) => d,
        Err(why) if std::env::var_os("CI").is_some() => panic!("{test}: CI must run it: {why}"),
        Err(why) => {
            println!("skipped: {test}: {why}");
            return;
        }
    };
    let bin = plugin_bin();
    let bed = TestBed::new(1).unwrap();
    // An attachment the runtime's libcni cache does not know (as after a
    // runtime lost its cache): only kroce-cni's GC can release it.
    let cfg = bed.config(json!({"cniVersion": "1.1.0"}));
    let add = bed
        .run_binary(
            &bin,
            &bed.env("ADD", "stale1", "net1"),
            &serde_json::to_vec(&cfg).unwrap(),
        )
        .unwrap();
    assert_eq!(add.code, 0, "ADD: {}\n{}", add.stdout, add.stderr);
    assert!(bed.pod.link("net1").is_some());
    assert!(!bed.leases().is_empty());

    let mut plugin = cfg.clone();
    let obj = plugin.as_object_mut().unwrap();
    obj.remove("cniVersion");
    obj.remove("name");
    let conflist = scratch.path().join("kroce.conflist");
    std::fs::write(
        &conflist,
        json!({"cniVersion": "1.1.0", "name": bed.network, "plugins": [plugin]}).to_string(),
    )
    .unwrap();
    let bin_dirs = format!("{}:/usr/lib/cni", bin.parent().unwrap().display());
    let cache = scratch.path().join("libcni-cache");
    let gc = run_libcni_gc(&bed, &driver, &conflist, &bin_dirs, &cache, "null");
    assert_eq!(
        gc.0, 0,
        "libcni GC with valid-attachments null failed:\n--- stderr\n{}",
        gc.1
    );
    assert!(bed.pod.link("net1").is_none(), "the VF left the pod");
    assert!(
        bed.host.link("ens1f0v0").is_some(),
        "the VF is back on the host"
    );
    assert!(
        bed.leases().is_empty(),
        "lease released: {:?}",
        bed.leases()
    );
    let claims: Vec<String> = bed
        .state_files()
        .into_iter()
        .filter(|f| f.starts_with("vf/") || f.starts_with("memlock/"))
        .collect();
    assert!(claims.is_empty(), "claims left: {claims:?}");
}

/// Runs the driver from a thread inside the bed's host netns (where
/// kroce-cni must run); returns (exit code, stderr).
fn run_libcni_gc(
    bed: &TestBed,
    driver: &Path,
    conflist: &Path,
    bin_dirs: &str,
    cache: &Path,
    valid: &str,
) -> (i32, String) {
    let ns = std::fs::File::open(&bed.host.path).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            let out = Command::new(driver)
                .arg(conflist)
                .arg(bin_dirs)
                .arg(cache)
                .arg(valid)
                .env_clear()
                .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
                // libcni runs plugins with its own environment plus CNI_*:
                // kroce-cni's roots, as a runtime's would carry them.
                .envs(bed.root_env())
                .output()
                .unwrap();
            (
                out.status.code().unwrap_or(-1),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            )
        })
        .join()
        .unwrap()
    })
}
