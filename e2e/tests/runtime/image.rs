//! A container image without a registry: busybox-static in an OCI image
//! layout, archived with tar and imported with `ctr images import`. Used as
//! the pod sandbox ("pause") image too: `sleep infinity` does what pause does.

use std::fs;
use std::io;
use std::path::Path;
use std::process::Command;

pub const IMAGE: &str = "kroce.test/busybox:1";

fn sha256(path: &Path) -> io::Result<String> {
    let out = Command::new("sha256sum").arg(path).output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace()
        .next()
        .map(str::to_owned)
        .ok_or_else(|| io::Error::other(format!("sha256sum {}: no output", path.display())))
}

fn run(cmd: &mut Command) -> io::Result<()> {
    let out = cmd.output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "{cmd:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )))
    }
}

/// Puts `blob` into the layout's blob store; returns (digest, size).
fn add_blob(layout: &Path, blob: &Path) -> io::Result<(String, u64)> {
    let digest = sha256(blob)?;
    let size = fs::metadata(blob)?.len();
    fs::copy(blob, layout.join("blobs/sha256").join(&digest))?;
    Ok((digest, size))
}

/// Writes `<dir>/image.tar`: an OCI layout with one layer holding
/// `/bin/busybox` and the applet links the tests use.
pub fn build(dir: &Path, busybox: &Path) -> io::Result<std::path::PathBuf> {
    let rootfs = dir.join("rootfs");
    let layout = dir.join("layout");
    for d in ["bin", "proc", "sys", "dev", "etc", "tmp"] {
        fs::create_dir_all(rootfs.join(d))?;
    }
    fs::create_dir_all(layout.join("blobs/sha256"))?;
    fs::copy(busybox, rootfs.join("bin/busybox"))?;
    for applet in ["sh", "sleep", "cat", "grep", "ip", "ls"] {
        std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(applet))?;
    }
    let layer = dir.join("layer.tar");
    run(Command::new("tar")
        .args([
            "--sort=name",
            "--mtime=@0",
            "--owner=0",
            "--group=0",
            "--numeric-owner",
            "-C",
        ])
        .arg(&rootfs)
        .arg("-cf")
        .arg(&layer)
        .arg("."))?;
    let (layer_digest, layer_size) = add_blob(&layout, &layer)?;
    let config = dir.join("config.json");
    fs::write(
        &config,
        serde_json::json!({
            "architecture": "amd64", "os": "linux",
            "config": {"Entrypoint": ["/bin/sleep", "infinity"]},
            "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{layer_digest}")]},
        })
        .to_string(),
    )?;
    let (config_digest, config_size) = add_blob(&layout, &config)?;
    let manifest = dir.join("manifest.json");
    fs::write(
        &manifest,
        serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                       "digest": format!("sha256:{config_digest}"), "size": config_size},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                        "digest": format!("sha256:{layer_digest}"), "size": layer_size}],
        })
        .to_string(),
    )?;
    let (manifest_digest, manifest_size) = add_blob(&layout, &manifest)?;
    fs::write(
        layout.join("index.json"),
        serde_json::json!({
            "schemaVersion": 2,
            "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                           "digest": format!("sha256:{manifest_digest}"), "size": manifest_size,
                           "annotations": {"io.containerd.image.name": IMAGE,
                                           "org.opencontainers.image.ref.name": "1"}}],
        })
        .to_string(),
    )?;
    fs::write(
        layout.join("oci-layout"),
        r#"{"imageLayoutVersion":"1.0.0"}"#,
    )?;
    let archive = dir.join("image.tar");
    run(Command::new("tar")
        .arg("-C")
        .arg(&layout)
        .arg("-cf")
        .arg(&archive)
        .arg("."))?;
    Ok(archive)
}
