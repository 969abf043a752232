//! A kube client whose core-kind requests (Nodes, Pods, ConfigMaps,
//! Events, Leases: what the CRD server does not serve) go to a small stub
//! here, and everything else (kroce.io, NetworkAttachmentDefinitions) to
//! the real server over HTTPS. The stub lists the Nodes it was given,
//! answers reads of anything else 404, and echoes writes back; it records
//! every request it served.

use super::CrdServer;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use kube::client::{Body, ClientBuilder};
use serde_json::{Value, json};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use tower::BoxError;

type Out = Response<Box<kube::client::DynBody>>;

/// The stub's state: the Nodes it lists, the requests it saw.
#[derive(Debug, Default)]
pub struct CoreStub {
    pub nodes: Vec<Value>,
    pub seen: Mutex<Vec<String>>,
}

/// Paths the CRD server does not serve.
fn is_core(path: &str) -> bool {
    path.starts_with("/api/")
        || path.starts_with("/apis/coordination.k8s.io/")
        || path.starts_with("/apis/events.k8s.io/")
        || path.starts_with("/apis/policy/")
}

fn never(n: std::convert::Infallible) -> BoxError {
    match n {}
}

fn body(code: u16, v: &Value) -> Out {
    let full = Full::new(Bytes::from(v.to_string())).map_err(never);
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Box::new(full) as Box<kube::client::DynBody>)
        .unwrap_or_else(|_| {
            Response::new(Box::new(Full::new(Bytes::new()).map_err(|n| match n {})))
        })
}

impl CoreStub {
    async fn answer(&self, req: Request<Body>) -> Out {
        let method = req.method().to_string();
        let path = req.uri().path().to_string();
        self.seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(format!("{method} {path}"));
        let sent: Value = match req.into_body().collect().await {
            Ok(b) => serde_json::from_slice(&b.to_bytes()).unwrap_or(Value::Null),
            Err(_) => Value::Null,
        };
        let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
        let name = segs.last().copied().unwrap_or_default();
        // After /api/v1 or /apis/<group>/<version>: `res`, `res/name`,
        // `namespaces/ns/res` or `namespaces/ns/res/name`; odd is a list.
        let base = if segs.first() == Some(&"api") { 2 } else { 3 };
        let is_list = segs.len().saturating_sub(base) % 2 == 1;
        match method.as_str() {
            "GET" if path == "/api/v1/nodes" => body(
                200,
                &json!({"apiVersion": "v1", "kind": "NodeList",
                        "metadata": {"resourceVersion": "1"}, "items": self.nodes}),
            ),
            "GET" if is_list => body(
                200,
                &json!({"apiVersion": "v1", "kind": "List",
                            "metadata": {"resourceVersion": "1"}, "items": []}),
            ),
            "GET" => body(
                404,
                &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                        "reason": "NotFound", "code": 404,
                        "message": format!("{name} not found (core stub)")}),
            ),
            "DELETE" => body(
                200,
                &json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}),
            ),
            _ => {
                let mut obj = if sent.is_object() { sent } else { json!({}) };
                if obj["metadata"]["name"].is_null() {
                    obj["metadata"]["name"] = name.into();
                }
                obj["metadata"]["resourceVersion"] = "1".into();
                body(if method == "POST" { 201 } else { 200 }, &obj)
            }
        }
    }
}

/// The routing service over kube's own stack (`real`).
pub struct Split<S> {
    real: S,
    stub: Arc<CoreStub>,
}

impl<S> tower::Service<Request<Body>> for Split<S>
where
    S: tower::Service<Request<Body>, Response = Out, Error = BoxError>,
    S::Future: Send + 'static,
{
    type Response = Out;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Out, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.real.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        if is_core(req.uri().path()) {
            let stub = self.stub.clone();
            Box::pin(async move { Ok(stub.answer(req).await) })
        } else {
            Box::pin(self.real.call(req))
        }
    }
}

impl CrdServer {
    /// A client for the real server with core kinds served by `stub`.
    pub async fn split_client(&self, stub: Arc<CoreStub>) -> kube::Client {
        super::install_crypto_provider();
        let kc = kube::config::Kubeconfig::read_from(&self.kubeconfig).expect("kubeconfig");
        let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .expect("client config");
        let builder = ClientBuilder::try_from(config).expect("client builder");
        let layer = tower::layer::layer_fn(move |real| Split {
            real,
            stub: stub.clone(),
        });
        builder.with_layer(&layer).build()
    }
}
