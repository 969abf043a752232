//! A mock API server for the kube edges' tests (`mod common;`): every
//! request a `kube::Client` sends is recorded and answered by a closure.

use http::{Request, Response};
use kube::client::Body;
use serde_json::Value;
use std::sync::{Arc, Mutex};

/// One request as the API server saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub query: String,
    pub content_type: String,
    pub body: Value,
}

/// The status code and JSON body that answer a request.
pub type Answer = Box<dyn Fn(&Seen) -> (u16, Value) + Send + Sync>;

/// A client whose every request is recorded and answered by `answer`.
pub fn mock(answer: Answer) -> (kube::Client, Arc<Mutex<Vec<Seen>>>) {
    let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let log = seen.clone();
    tokio::spawn(async move {
        while let Some((req, send)) = handle.next_request().await {
            let (parts, body) = req.into_parts();
            let bytes = body.collect_bytes().await.unwrap_or_default();
            let s = Seen {
                method: parts.method.to_string(),
                path: parts.uri.path().to_string(),
                query: parts.uri.query().unwrap_or("").to_string(),
                content_type: parts
                    .headers
                    .get("content-type")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_string(),
                body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
            };
            let (code, v) = answer(&s);
            log.lock().unwrap().push(s);
            let resp = Response::builder()
                .status(code)
                .header("content-type", "application/json")
                .body(Body::from(serde_json::to_vec(&v).unwrap()))
                .unwrap();
            send.send_response(resp);
        }
    });
    (kube::Client::new(svc, "default"), seen)
}
