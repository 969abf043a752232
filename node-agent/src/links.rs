//! Netdev MTU. Setting it is a netlink operation (`RTM_SETLINK` with
//! `IFLA_MTU`), not a sysfs write, so it sits behind [`LinkControl`].

use std::io;

#[derive(Debug, thiserror::Error)]
#[error("cannot set MTU {mtu} on {ifname}: {source}")]
pub struct LinkError {
    pub ifname: String,
    pub mtu: u32,
    #[source]
    pub source: io::Error,
}

pub trait LinkControl: Send + Sync {
    fn set_mtu(&self, ifname: &str, mtu: u32) -> Result<(), LinkError>;
}

/// The real thing: rtnetlink on its own current-thread runtime, so it can
/// be called from the agent's blocking apply thread.
#[derive(Debug)]
pub struct RtnetlinkLinks {
    /// Always `Some` until drop.
    rt: Option<tokio::runtime::Runtime>,
}

impl Drop for RtnetlinkLinks {
    /// The node agent drops this inside its async runtime (when the loop
    /// ends on SIGTERM), where dropping a runtime panics ("Cannot drop a
    /// runtime in a context where blocking is not allowed"); shutting it
    /// down in the background is allowed anywhere.
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

impl RtnetlinkLinks {
    pub fn new() -> io::Result<Self> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()?;
        Ok(RtnetlinkLinks { rt: Some(rt) })
    }
}

impl LinkControl for RtnetlinkLinks {
    fn set_mtu(&self, ifname: &str, mtu: u32) -> Result<(), LinkError> {
        let err = |source| LinkError {
            ifname: ifname.to_string(),
            mtu,
            source,
        };
        let Some(rt) = self.rt.as_ref() else {
            return Err(err(io::Error::other("netlink runtime already shut down")));
        };
        rt.block_on(async {
            let (conn, handle, _) = rtnetlink::new_connection().map_err(err)?;
            let task = tokio::spawn(conn);
            let msg = rtnetlink::LinkUnspec::new_with_name(ifname)
                .mtu(mtu)
                .build();
            let r = handle.link().set(msg).execute().await;
            task.abort();
            r.map_err(|e| match e {
                rtnetlink::Error::NetlinkError(m) => err(m.to_io()),
                other => err(io::Error::other(other.to_string())),
            })
        })
    }
}

/// Test double for fixture hosts: writes `sys/class/net/<if>/mtu` as the
/// kernel would after the netlink call, and records the calls.
#[cfg(any(test, feature = "testing"))]
#[derive(Debug)]
pub struct FixtureLinks {
    pub sys: std::path::PathBuf,
    pub calls: std::sync::Mutex<Vec<(String, u32)>>,
}

#[cfg(any(test, feature = "testing"))]
impl FixtureLinks {
    pub fn new(sys: impl Into<std::path::PathBuf>) -> Self {
        FixtureLinks {
            sys: sys.into(),
            calls: std::sync::Mutex::new(Vec::new()),
        }
    }
    pub fn calls(&self) -> Vec<(String, u32)> {
        self.calls.lock().map(|c| c.clone()).unwrap_or_default()
    }
}

#[cfg(any(test, feature = "testing"))]
impl LinkControl for FixtureLinks {
    fn set_mtu(&self, ifname: &str, mtu: u32) -> Result<(), LinkError> {
        if let Ok(mut c) = self.calls.lock() {
            c.push((ifname.to_string(), mtu));
        }
        let path = self.sys.join("class/net").join(ifname).join("mtu");
        if !path.exists() {
            return Err(LinkError {
                ifname: ifname.to_string(),
                mtu,
                source: io::Error::from_raw_os_error(libc::ENODEV),
            });
        }
        std::fs::write(&path, format!("{mtu}\n")).map_err(|source| LinkError {
            ifname: ifname.to_string(),
            mtu,
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str]) -> bool {
        std::process::Command::new("ip")
            .args(args)
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    }

    /// The real rtnetlink path on a real veth pair (needs root).
    #[test]
    fn rtnetlink_sets_mtu_on_a_real_veth() {
        // CI runs as root with veth: there a skip would hide a failure.
        let ci = std::env::var_os("CI").is_some();
        if !nix::unistd::Uid::effective().is_root() {
            assert!(!ci, "CI must run this test as root");
            println!("skipped: needs root to create a veth pair");
            return;
        }
        let (a, b) = ("krocemtu0", "krocemtu1");
        let _ = run(&["link", "del", a]);
        if !run(&["link", "add", a, "type", "veth", "peer", "name", b]) {
            assert!(!ci, "CI must be able to create a veth pair");
            println!("skipped: cannot create veth here");
            return;
        }
        let links = RtnetlinkLinks::new().unwrap();
        let r = links.set_mtu(a, 4000);
        let mtu = std::fs::read_to_string(format!("/sys/class/net/{a}/mtu")).unwrap_or_default();
        let missing = links.set_mtu("krocenope0", 1500);
        let _ = run(&["link", "del", a]);
        r.unwrap();
        assert_eq!(mtu.trim(), "4000");
        let e = missing.unwrap_err();
        assert_eq!(e.source.raw_os_error(), Some(libc::ENODEV), "{e}");
        assert!(e.to_string().contains("krocenope0"));
    }
}

#[cfg(test)]
mod drop_tests {
    use super::*;

    /// The node agent's loop ends (SIGTERM) with the edges dropped inside
    /// its async runtime: that must not panic.
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn dropping_the_links_inside_an_async_runtime_does_not_panic() {
        let links = std::sync::Arc::new(RtnetlinkLinks::new().unwrap());
        let inside = tokio::spawn(async move { drop(links) }).await;
        assert!(inside.is_ok(), "{inside:?}");
    }
}
