//! Edge: the DevicePlugin gRPC service of one pool. Answers from the latest
//! snapshot; the decisions themselves are in [`crate::allocation`] and
//! [`crate::preferred`].

use crate::allocation::{self, ContainerAllocation};
use crate::api::{self, device_plugin_server::DevicePlugin};
use crate::config::Mode;
use crate::files;
use crate::preferred::{self, Strategy, Topology};
use crate::resource_name::ResourceName;
use crate::shared::Shared;
use futures::{Stream, StreamExt};
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use tokio::sync::watch;
use tokio_stream::wrappers::WatchStream;
use tonic::{Request, Response, Status};

#[derive(Debug, Clone)]
pub struct DevicePluginService {
    resource: ResourceName,
    shared: Arc<Shared>,
    /// Ends every ListAndWatch stream so the server can shut down.
    stop: watch::Receiver<bool>,
}

impl DevicePluginService {
    pub fn new(resource: ResourceName, shared: Arc<Shared>, stop: watch::Receiver<bool>) -> Self {
        DevicePluginService {
            resource,
            shared,
            stop,
        }
    }
}

/// What this plugin tells the kubelet at registration and on request.
pub fn plugin_options() -> api::DevicePluginOptions {
    api::DevicePluginOptions {
        pre_start_required: false,
        get_preferred_allocation_available: true,
    }
}

fn to_api(a: ContainerAllocation) -> api::ContainerAllocateResponse {
    api::ContainerAllocateResponse {
        envs: a.envs.into_iter().collect(),
        mounts: Vec::new(),
        devices: a
            .devices
            .into_iter()
            .map(|d| api::DeviceSpec {
                container_path: d.container_path,
                host_path: d.host_path,
                permissions: d.permissions,
            })
            .collect(),
        annotations: a.annotations.into_iter().collect(),
        cdi_devices: a
            .cdi_devices
            .into_iter()
            .map(|name| api::CdiDevice { name })
            .collect(),
    }
}

type DeviceStream = Pin<Box<dyn Stream<Item = Result<api::ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl DevicePlugin for DevicePluginService {
    async fn get_device_plugin_options(
        &self,
        _: Request<api::Empty>,
    ) -> Result<Response<api::DevicePluginOptions>, Status> {
        Ok(Response::new(plugin_options()))
    }

    type ListAndWatchStream = DeviceStream;

    /// Sends the full list at once (every new stream, e.g. after a kubelet
    /// restart), then again on every change.
    async fn list_and_watch(
        &self,
        _: Request<api::Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let resource = self.resource.clone();
        let mut stop = self.stop.clone();
        let mut last: Option<Vec<api::Device>> = None;
        let stream = WatchStream::new(self.shared.snapshot.clone())
            .map(move |snap| snap.pool(&resource).map(|p| p.api_devices()))
            // The pool was removed by a config reload: end the stream.
            .take_while(|devices| std::future::ready(devices.is_some()))
            .filter_map(move |devices| {
                let changed = devices != last;
                if changed {
                    last.clone_from(&devices);
                }
                std::future::ready(if changed { devices } else { None })
            })
            .map(|devices| Ok(api::ListAndWatchResponse { devices }))
            .take_until(async move {
                let _ = stop.wait_for(|s| *s).await;
            });
        tracing::debug!(resource = %self.resource, "ListAndWatch stream opened");
        Ok(Response::new(Box::pin(stream)))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<api::PreferredAllocationRequest>,
    ) -> Result<Response<api::PreferredAllocationResponse>, Status> {
        let snap = self.shared.latest();
        let pool = snap
            .pool(&self.resource)
            .ok_or_else(|| Status::unavailable(format!("pool {} is gone", self.resource)))?;
        let topology = |id: &str| match pool.devices.get(id) {
            Some(d) => Topology {
                numa: d.candidate.numa,
                group: d.candidate.pack_group(),
            },
            None => Topology {
                numa: None,
                group: id.to_string(),
            },
        };
        let strategy = match pool.pool.mode {
            Mode::Exclusive => Strategy::Pack,
            Mode::Shared { .. } => Strategy::Spread,
        };
        let mut out = Vec::new();
        for r in request.into_inner().container_requests {
            let ids = preferred::preferred(
                &r.available_device_i_ds,
                &r.must_include_device_i_ds,
                i64::from(r.allocation_size),
                &topology,
                strategy,
            )
            .map_err(|e| {
                tracing::debug!(resource = %self.resource, error = %e, "GetPreferredAllocation refused");
                Status::invalid_argument(format!("{}: preferred allocation: {e}", self.resource))
            })?;
            tracing::debug!(
                resource = %self.resource,
                strategy = strategy.as_str(),
                size = r.allocation_size,
                available = r.available_device_i_ds.len(),
                must_include = ?r.must_include_device_i_ds,
                chosen = ?ids,
                numa = ?ids.iter().map(|id| topology(id).numa).collect::<Vec<_>>(),
                "GetPreferredAllocation"
            );
            out.push(api::ContainerPreferredAllocationResponse { device_i_ds: ids });
        }
        Ok(Response::new(api::PreferredAllocationResponse {
            container_responses: out,
        }))
    }

    async fn allocate(
        &self,
        request: Request<api::AllocateRequest>,
    ) -> Result<Response<api::AllocateResponse>, Status> {
        let snap = self.shared.latest();
        let pool = snap
            .pool(&self.resource)
            .ok_or_else(|| Status::unavailable(format!("pool {} is gone", self.resource)))?;
        let requests = request.into_inner().container_requests;
        // Every container's request is checked before any file is written.
        let mut allocations = Vec::with_capacity(requests.len());
        for r in &requests {
            let a = allocation::allocate(pool, &r.devices_ids, self.shared.cdi).map_err(|e| {
                tracing::warn!(resource = %self.resource, error = %e, "Allocate rejected");
                Status::invalid_argument(e.to_string())
            })?;
            allocations.push(a);
        }
        // In the book before the files exist: a rescan's tidy that read
        // what pods hold before this Allocate checks the book again before
        // removing a device-info file (plugin.rs, rescan_with).
        {
            let mut book = self.shared.allocations();
            let now = std::time::Instant::now();
            for r in &requests {
                book.record(&self.resource, r.devices_ids.iter().cloned(), now);
            }
        }
        let mut written: Vec<PathBuf> = Vec::new();
        for a in &allocations {
            for (name, info) in &a.device_infos {
                let path = self.shared.devinfo_dir.join(name);
                let json = info.to_bytes();
                if let Err(e) = files::write_atomic(&path, &json) {
                    for p in &written {
                        let _ = files::remove(p);
                    }
                    tracing::error!(resource = %self.resource, error = %e, "Allocate failed");
                    return Err(Status::internal(e.to_string()));
                }
                written.push(path);
            }
        }
        for r in &requests {
            tracing::info!(resource = %self.resource, devices = ?r.devices_ids, "allocated");
        }
        Ok(Response::new(api::AllocateResponse {
            container_responses: allocations.into_iter().map(to_api).collect(),
        }))
    }

    async fn pre_start_container(
        &self,
        _: Request<api::PreStartContainerRequest>,
    ) -> Result<Response<api::PreStartContainerResponse>, Status> {
        Ok(Response::new(api::PreStartContainerResponse {}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Format, parse};
    use crate::host_view::HostView;
    use crate::inventory::{Memory, candidates};
    use crate::snapshot::Snapshot;
    use crate::testing::CapturedLogs;

    /// `rdma/hca: 2` from a shared pool: two HCAs (one per NUMA node here,
    /// since each node has one), and the decision logged at debug.
    #[test]
    fn shared_pool_preferred_allocation_spreads_and_is_logged() {
        let (_dir, fx) = crate::testing::connectx_pair();
        let cfg = parse(
            "pools:\n- resourceName: hca\n  mode: shared\n  sharedCount: 4\n  selectors: {devices: [\"101d\"]}\n",
            Format::Yaml,
        )
        .unwrap();
        let c = candidates(&HostView::scan(&fx.root()), &mut Memory::default());
        let snap = Snapshot::build(&cfg, c, &|_, _| false);
        let all: Vec<String> = snap.pools[0].devices.keys().cloned().collect();
        let (_tx, rx) = watch::channel(Arc::new(snap));
        let shared = Arc::new(Shared::new(rx, false, PathBuf::from("/nonexistent")));
        let (_stop_tx, stop) = watch::channel(false);
        let svc = DevicePluginService::new(cfg.pools[0].resource.clone(), shared, stop);
        let out = CapturedLogs::default();
        let subscriber = out.subscriber(tracing::Level::DEBUG);
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let ask = |avail: Vec<String>, size| api::PreferredAllocationRequest {
            container_requests: vec![api::ContainerPreferredAllocationRequest {
                available_device_i_ds: avail,
                must_include_device_i_ds: Vec::new(),
                allocation_size: size,
            }],
        };
        let got = tracing::subscriber::with_default(subscriber, || {
            rt.block_on(svc.get_preferred_allocation(Request::new(ask(all.clone(), 2))))
        })
        .unwrap()
        .into_inner();
        // One HCA per NUMA node on this host: two HCAs need both nodes, and
        // two shares of one HCA is not what `rdma/hca: 2` means.
        assert_eq!(
            got.container_responses[0].device_i_ds,
            ["0000:3b:00.0-0", "0000:86:00.0-0"]
        );
        let text = out.text();
        let line = text
            .lines()
            .find(|l| l.contains("GetPreferredAllocation"))
            .unwrap_or_else(|| panic!("no decision logged: {text}"));
        assert!(line.contains("DEBUG"), "{line}");
        assert!(
            line.contains("strategy=\"spread\"") || line.contains("strategy=spread"),
            "{line}"
        );
        assert!(line.contains("0000:86:00.0-0"), "{line}");
    }
}
