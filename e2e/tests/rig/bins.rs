//! The compiled kroce binaries the test runs. Cargo builds a test only with
//! its own package's binaries, so the others are looked up next to the test
//! executable (`<target>/<profile>/deps/node-*` → `<target>/<profile>/`) or
//! in `KROCE_BIN_DIR`.

use std::path::{Path, PathBuf};

pub const BIN_DIR_ENV: &str = "KROCE_BIN_DIR";

#[derive(Debug, Clone)]
pub struct Binaries {
    pub controller: PathBuf,
    pub node_agent: PathBuf,
    pub device_plugin: PathBuf,
    pub cni: PathBuf,
}

impl Binaries {
    /// `Err` says which binary is missing where, and how to build it.
    pub fn locate() -> Result<Binaries, String> {
        let dir = match std::env::var_os(BIN_DIR_ENV) {
            Some(d) => PathBuf::from(d),
            None => {
                let exe = std::env::current_exe()
                    .map_err(|e| format!("cannot find the test executable: {e}"))?;
                exe.parent()
                    .and_then(Path::parent)
                    .map(Path::to_path_buf)
                    .ok_or_else(|| format!("{} has no grandparent dir", exe.display()))?
            }
        };
        let find = |name: &str| -> Result<PathBuf, String> {
            let p = dir.join(name);
            if p.is_file() {
                Ok(p)
            } else {
                Err(format!(
                    "{} not found: run `cargo build --workspace --bins` first (same target dir \
                     and profile as the test), or point {BIN_DIR_ENV} at the directory holding \
                     kroce-controller, kroce-node-agent, kroce-device-plugin and kroce-cni",
                    p.display()
                ))
            }
        };
        Ok(Binaries {
            controller: find("kroce-controller")?,
            node_agent: find("kroce-node-agent")?,
            device_plugin: find("kroce-device-plugin")?,
            cni: find("kroce-cni")?,
        })
    }
}
