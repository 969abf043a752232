//! Generates the CRI v1 RuntimeService client (the subset in
//! `proto/cri/v1/api.proto`) with protox, so no system `protoc` is needed.
//! The tests drive a real containerd through it.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let proto_root = manifest.join("../proto");
    let proto = proto_root.join("cri/v1/api.proto");
    println!("cargo:rerun-if-changed={}", proto.display());
    let fds = protox::compile([&proto], [&proto_root])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(false)
        .compile_fds(fds)?;
    Ok(())
}
