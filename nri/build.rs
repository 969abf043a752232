//! Generates the NRI and ttrpc message types from `proto/nri/*.proto` with
//! protox (pure Rust, no system `protoc`) and prost.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Read at run time, not compiled in: a build script built for one
    // checkout is reused by cargo for another with the same sources.
    let dir = std::path::PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../proto/nri");
    let files = [dir.join("api.proto"), dir.join("ttrpc.proto")];
    for file in &files {
        println!("cargo:rerun-if-changed={}", file.display());
    }
    let fds = protox::compile(&files, [&dir])?;
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(false)
        .build_transport(false)
        .btree_map(".")
        .compile_fds(fds)?;
    Ok(())
}
