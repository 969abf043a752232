//! Edge: inotify on the directories whose changes must be seen at once —
//! the kubelet plugin dir (our socket deleted, `kubelet.sock` re-created),
//! the config file's directory (a ConfigMap update swaps the `..data`
//! symlink, so watching the file itself would miss it) and
//! `<dev>/infiniband`. sysfs sends no inotify events; it is rescanned on a tick.

use futures::StreamExt;
use inotify::{Inotify, WatchDescriptor, WatchMask};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Trigger {
    Kubelet,
    Config,
    Dev,
}

/// One wake-up per directory. A `Notify` keeps a single pending permit, so
/// bursts of events coalesce and no kind of event can crowd out another.
#[derive(Debug, Clone, Default)]
pub struct Triggers {
    pub kubelet_dir: Arc<Notify>,
    pub config_dir: Arc<Notify>,
    pub dev_dir: Arc<Notify>,
}

#[derive(Debug, thiserror::Error)]
#[error("cannot watch {path}: {source}")]
pub struct WatchError {
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// Starts watching until the returned task is aborted. `dev_dir` is
/// optional (a node may have no RDMA devices yet).
pub fn spawn(
    kubelet_dir: &Path,
    config_dir: &Path,
    dev_dir: Option<&Path>,
) -> Result<(Triggers, JoinHandle<()>), WatchError> {
    let fail = |path: &Path| {
        let path = path.to_path_buf();
        move |source| WatchError { path, source }
    };
    let inotify = Inotify::init().map_err(fail(kubelet_dir))?;
    let dir_mask = WatchMask::CREATE
        | WatchMask::DELETE
        | WatchMask::MOVED_FROM
        | WatchMask::MOVED_TO
        | WatchMask::DELETE_SELF
        | WatchMask::MOVE_SELF;
    let mut map: HashMap<WatchDescriptor, Trigger> = HashMap::new();
    let wd = inotify
        .watches()
        .add(kubelet_dir, dir_mask)
        .map_err(fail(kubelet_dir))?;
    map.insert(wd, Trigger::Kubelet);
    let wd = inotify
        .watches()
        .add(
            config_dir,
            dir_mask | WatchMask::CLOSE_WRITE | WatchMask::MODIFY,
        )
        .map_err(fail(config_dir))?;
    map.insert(wd, Trigger::Config);
    if let Some(dev) = dev_dir {
        match inotify.watches().add(dev, dir_mask) {
            Ok(wd) => {
                map.insert(wd, Trigger::Dev);
            }
            Err(e) => {
                tracing::info!(path = %dev.display(), error = %e, "not watching the dev dir; the rescan tick covers it");
            }
        }
    }
    let mut events = inotify
        .into_event_stream(vec![0u8; 8192])
        .map_err(fail(kubelet_dir))?;
    let triggers = Triggers::default();
    let t = triggers.clone();
    let task = tokio::spawn(async move {
        while let Some(ev) = events.next().await {
            match ev {
                Ok(ev) => match map.get(&ev.wd) {
                    Some(Trigger::Kubelet) => t.kubelet_dir.notify_one(),
                    Some(Trigger::Config) => t.config_dir.notify_one(),
                    Some(Trigger::Dev) => t.dev_dir.notify_one(),
                    None => {}
                },
                Err(e) => tracing::warn!(error = %e, "inotify read failed"),
            }
        }
    });
    Ok((triggers, task))
}
