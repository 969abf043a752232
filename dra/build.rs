//! Generates the kubelet's DRA plugin API (dra/v1), its device health API
//! (dra-health/v1alpha1) and the plugin registration API
//! (pluginregistration/v1) with protox, so no system `protoc` is needed.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let proto_root = manifest.join("../proto");
    let protos = [
        proto_root.join("dra/v1/api.proto"),
        proto_root.join("pluginregistration/v1/api.proto"),
        proto_root.join("dra-health/v1alpha1/api.proto"),
    ];
    for p in &protos {
        println!("cargo:rerun-if-changed={}", p.display());
    }
    let fds = protox::compile(&protos, [&proto_root])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
