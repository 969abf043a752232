//! `/metrics` and `/health` over plain HTTP/1 (hyper), for the controller
//! and the node agent alike.

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use prometheus_client::registry::Registry;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Liveness: set false when the main loop dies so the kubelet restarts us.
#[derive(Debug, Default)]
pub struct Health {
    pub failed: AtomicBool,
}

/// More OpenMetrics families for `/metrics`, rendered per scrape (the node
/// agent's RDMA counters, read from sysfs at that moment).
pub type ExtraMetrics = Arc<dyn Fn() -> String + Send + Sync>;

/// Appends `extra` (OpenMetrics families, no `# EOF`) to the registry's
/// exposition, keeping `# EOF` last.
pub fn append_families(registry_text: &str, extra: &str) -> String {
    let body = registry_text
        .strip_suffix("# EOF\n")
        .unwrap_or(registry_text);
    format!("{body}{extra}# EOF\n")
}

fn respond(
    registry: &Registry,
    health: &Health,
    extra: Option<&ExtraMetrics>,
    path: &str,
) -> Response<Full<Bytes>> {
    let (status, body, ctype) = match path {
        "/health" | "/healthz" => {
            if health.failed.load(Ordering::Relaxed) {
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "failed\n".to_string(),
                    "text/plain",
                )
            } else {
                (StatusCode::OK, "ok\n".to_string(), "text/plain")
            }
        }
        "/metrics" => {
            let mut out = String::new();
            match prometheus_client::encoding::text::encode(&mut out, registry) {
                Ok(()) => (
                    StatusCode::OK,
                    match extra {
                        Some(f) => append_families(&out, &f()),
                        None => out,
                    },
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                ),
                Err(e) => (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    e.to_string(),
                    "text/plain",
                ),
            }
        }
        _ => (
            StatusCode::NOT_FOUND,
            "not found\n".to_string(),
            "text/plain",
        ),
    };
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    if let Ok(v) = http::HeaderValue::from_str(ctype) {
        r.headers_mut().insert(http::header::CONTENT_TYPE, v);
    }
    r
}

/// Serves until the task is dropped.
pub async fn serve(
    addr: SocketAddr,
    registry: Arc<Registry>,
    health: Arc<Health>,
) -> std::io::Result<()> {
    serve_with(addr, registry, health, None).await
}

/// [`serve`], with more families appended to `/metrics`.
pub async fn serve_with(
    addr: SocketAddr,
    registry: Arc<Registry>,
    health: Arc<Health>,
    extra: Option<ExtraMetrics>,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(%addr, "serving /metrics and /health");
    loop {
        let (stream, _) = listener.accept().await?;
        let registry = registry.clone();
        let health = health.clone();
        let extra = extra.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req: Request<hyper::body::Incoming>| {
                let r = respond(&registry, &health, extra.as_ref(), req.uri().path());
                async move { Ok::<_, std::convert::Infallible>(r) }
            });
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await
            {
                tracing::debug!(error = %e, "http connection ended");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn health_and_metrics_over_a_real_socket() {
        let reconciles = prometheus_client::metrics::counter::Counter::<u64>::default();
        let mut reg = Registry::default();
        reg.register("kroce_reconciles", "Reconciles", reconciles.clone());
        reconciles.inc();
        let health = Arc::new(Health::default());
        let probe = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = probe.local_addr().unwrap();
        drop(probe);
        let server = tokio::spawn(serve(addr, Arc::new(reg), health.clone()));
        let get = |path: &'static str| async move {
            for _ in 0..50 {
                if let Ok(mut s) = tokio::net::TcpStream::connect(addr).await {
                    let req =
                        format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
                    s.write_all(req.as_bytes()).await.unwrap();
                    let mut out = String::new();
                    s.read_to_string(&mut out).await.unwrap();
                    return out;
                }
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            panic!("server never came up");
        };
        let h = get("/health").await;
        assert!(h.starts_with("HTTP/1.1 200") && h.ends_with("ok\n"), "{h}");
        let m = get("/metrics").await;
        assert!(m.contains("kroce_reconciles_total 1"), "{m}");
        health.failed.store(true, Ordering::Relaxed);
        assert!(get("/health").await.starts_with("HTTP/1.1 503"));
        assert!(get("/nope").await.starts_with("HTTP/1.1 404"));
        server.abort();
    }
}
