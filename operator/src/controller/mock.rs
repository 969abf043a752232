//! An in-memory Kubernetes API server behind a `tower_test` mock service:
//! it answers the requests kube makes (list, get, create, server-side
//! apply, merge and JSON patches, delete with finalizers) from a store the
//! tests seed and inspect. Scenarios drive `reconcile` against it.

use http::{Method, Request, Response, StatusCode};
use kube::client::Body;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// `(api prefix, plural)`, e.g. `("/apis/kroce.io/v1alpha1", "rdmanetworks")`.
type Kind = (String, String);
/// `(namespace or "", name)`.
type Key = (String, String);

#[derive(Clone, Default, Debug)]
pub struct ApiServer {
    pub store: Arc<Mutex<BTreeMap<Kind, BTreeMap<Key, Value>>>>,
    /// `METHOD path` of every request, in order.
    pub log: Arc<Mutex<Vec<String>>>,
    rv: Arc<Mutex<u64>>,
    /// Container logs by `(namespace, pod)`, served at `pods/<name>/log`.
    pub pod_logs: Arc<Mutex<BTreeMap<Key, String>>>,
    /// `namespace/name` of pods whose eviction a PodDisruptionBudget refuses (429).
    pub refuse_eviction: Arc<Mutex<Vec<String>>>,
}

struct Target {
    kind: Kind,
    namespace: Option<String>,
    name: Option<String>,
    sub: Option<String>,
}

fn parse_path(path: &str) -> Option<Target> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (prefix, rest) = match *segs.first()? {
        "api" => (format!("/api/{}", segs.get(1)?), &segs[2..]),
        "apis" => (
            format!("/apis/{}/{}", segs.get(1)?, segs.get(2)?),
            &segs[3..],
        ),
        _ => return None,
    };
    let (namespace, rest) = if rest.len() >= 3 && rest[0] == "namespaces" {
        (Some(rest[1].to_string()), &rest[2..])
    } else {
        (None, rest)
    };
    Some(Target {
        kind: (prefix, rest.first()?.to_string()),
        namespace,
        name: rest.get(1).map(|s| s.to_string()),
        sub: rest.get(2).map(|s| s.to_string()),
    })
}

fn query(uri: &http::Uri, key: &str) -> Option<String> {
    uri.query()?.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == key).then(|| percent_decode(v))
    })
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 3 <= b.len()
            && let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16)
        {
            out.push(v);
            i += 3;
            continue;
        }
        out.push(if b[i] == b'+' { b' ' } else { b[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn status(code: u16, reason: &str, message: &str) -> Response<Body> {
    let body = json!({
        "apiVersion": "v1", "kind": "Status", "status": "Failure",
        "message": message, "reason": reason, "code": code, "metadata": {}
    });
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string().into_bytes()))
        .unwrap_or_else(|_| Response::new(Body::empty()))
}

fn ok(v: &Value) -> Response<Body> {
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/json")
        .body(Body::from(v.to_string().into_bytes()))
        .unwrap_or_else(|_| Response::new(Body::empty()))
}

/// JSON merge patch (RFC 7386), also good enough for server-side apply of
/// the objects these tests use (maps merge, lists replace).
fn merge(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        (t, p) => *t = p.clone(),
    }
}

fn labels_match(obj: &Value, selector: &str) -> bool {
    selector.split(',').filter(|s| !s.is_empty()).all(|kv| {
        let Some((k, v)) = kv.split_once('=') else {
            return true;
        };
        obj.pointer("/metadata/labels")
            .and_then(|l| l.get(k))
            .and_then(Value::as_str)
            == Some(v)
    })
}

impl ApiServer {
    /// A kube client talking to a fresh server.
    pub fn start() -> (kube::Client, ApiServer) {
        let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let server = ApiServer::default();
        let s = server.clone();
        tokio::spawn(async move {
            while let Some((req, send)) = handle.next_request().await {
                let resp = s.handle(req).await;
                send.send_response(resp);
            }
        });
        (kube::Client::new(svc, "default"), server)
    }

    fn next_rv(&self) -> String {
        let mut rv = self.rv.lock().unwrap_or_else(|e| e.into_inner());
        *rv += 1;
        rv.to_string()
    }

    /// Seeds an object given as JSON (must carry apiVersion, kind, metadata.name).
    pub fn insert(&self, prefix: &str, plural: &str, obj: Value) {
        let ns = obj
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let name = obj
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let mut obj = obj;
        self.stamp_new(&mut obj);
        let mut store = self.store.lock().unwrap_or_else(|e| e.into_inner());
        store
            .entry((prefix.to_string(), plural.to_string()))
            .or_default()
            .insert((ns, name), obj);
    }

    pub fn get(&self, prefix: &str, plural: &str, ns: &str, name: &str) -> Option<Value> {
        let store = self.store.lock().unwrap_or_else(|e| e.into_inner());
        store
            .get(&(prefix.to_string(), plural.to_string()))?
            .get(&(ns.to_string(), name.to_string()))
            .cloned()
    }

    /// Modifies a stored object in place (as another client would).
    pub fn edit(
        &self,
        prefix: &str,
        plural: &str,
        ns: &str,
        name: &str,
        f: impl FnOnce(&mut Value),
    ) {
        let mut store = self.store.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(o) = store
            .get_mut(&(prefix.to_string(), plural.to_string()))
            .and_then(|m| m.get_mut(&(ns.to_string(), name.to_string())))
        {
            f(o);
        }
    }

    /// Sets what `GET .../pods/<name>/log` returns.
    pub fn set_pod_log(&self, ns: &str, name: &str, text: &str) {
        let mut logs = self.pod_logs.lock().unwrap_or_else(|e| e.into_inner());
        logs.insert((ns.to_string(), name.to_string()), text.to_string());
    }

    /// Every stored object of a kind, as JSON.
    pub fn list(&self, prefix: &str, plural: &str) -> Vec<Value> {
        let store = self.store.lock().unwrap_or_else(|e| e.into_inner());
        store
            .get(&(prefix.to_string(), plural.to_string()))
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default()
    }

    pub fn requests(&self) -> Vec<String> {
        self.log.lock().map(|l| l.clone()).unwrap_or_default()
    }

    fn stamp_new(&self, obj: &mut Value) {
        let rv = self.next_rv();
        let name = obj
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let meta = &mut obj["metadata"];
        if meta.get("uid").is_none() {
            meta["uid"] = format!("uid-{name}-{rv}").into();
        }
        if meta.get("generation").is_none() {
            meta["generation"] = 1.into();
        }
        if meta.get("creationTimestamp").is_none() {
            meta["creationTimestamp"] = "2026-01-01T00:00:00Z".into();
        }
        meta["resourceVersion"] = rv.into();
    }

    async fn handle(&self, req: Request<Body>) -> Response<Body> {
        let (parts, body) = req.into_parts();
        let body = body
            .collect_bytes()
            .await
            .map(|b| b.to_vec())
            .unwrap_or_default();
        let path = parts.uri.path().to_string();
        if let Ok(mut l) = self.log.lock() {
            l.push(format!("{} {}", parts.method, path));
        }
        let Some(t) = parse_path(&path) else {
            return status(404, "NotFound", &format!("no route {path}"));
        };
        let ctype = parts
            .headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let ns = t.namespace.clone().unwrap_or_default();
        let mut store = self.store.lock().unwrap_or_else(|e| e.into_inner());
        let coll = store.entry(t.kind.clone()).or_default();
        match (&parts.method, &t.name) {
            (&Method::GET, None) => {
                if query(&parts.uri, "watch").as_deref() == Some("true") {
                    return status(405, "MethodNotAllowed", "watch not supported by the mock");
                }
                let sel = query(&parts.uri, "labelSelector").unwrap_or_default();
                let items: Vec<Value> = coll
                    .iter()
                    .filter(|((ons, _), _)| t.namespace.is_none() || *ons == ns)
                    .map(|(_, v)| v.clone())
                    .filter(|v| labels_match(v, &sel))
                    .collect();
                ok(
                    &json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": "1"}, "items": items}),
                )
            }
            (&Method::GET, Some(name)) if t.sub.as_deref() == Some("log") => {
                if !coll.contains_key(&(ns.clone(), name.clone())) {
                    return status(404, "NotFound", &format!("pod {name} not found"));
                }
                let logs = self.pod_logs.lock().unwrap_or_else(|e| e.into_inner());
                let text = logs.get(&(ns, name.clone())).cloned().unwrap_or_default();
                Response::builder()
                    .status(StatusCode::OK)
                    .header("content-type", "text/plain")
                    .body(Body::from(text.into_bytes()))
                    .unwrap_or_else(|_| Response::new(Body::empty()))
            }
            (&Method::GET, Some(name)) => match coll.get(&(ns, name.clone())) {
                Some(v) => ok(v),
                None => status(404, "NotFound", &format!("{} {name} not found", t.kind.1)),
            },
            // policy/v1 Eviction: the pod goes (no grace period here), unless refused.
            (&Method::POST, Some(name)) if t.sub.as_deref() == Some("eviction") => {
                let refused = self
                    .refuse_eviction
                    .lock()
                    .map(|r| r.contains(&format!("{ns}/{name}")))
                    .unwrap_or(false);
                if refused {
                    return status(
                        429,
                        "TooManyRequests",
                        "Cannot evict pod as it would violate the pod's disruption budget.",
                    );
                }
                if coll.remove(&(ns, name.clone())).is_none() {
                    return status(404, "NotFound", &format!("pods {name} not found"));
                }
                ok(
                    &json!({"apiVersion": "v1", "kind": "Status", "status": "Success", "metadata": {}, "code": 201}),
                )
            }
            // Replace, with optimistic concurrency on metadata.resourceVersion.
            (&Method::PUT, Some(name)) => {
                let Ok(mut obj) = serde_json::from_slice::<Value>(&body) else {
                    return status(400, "BadRequest", "body is not JSON");
                };
                let key = (ns.clone(), name.clone());
                let Some(cur) = coll.get(&key) else {
                    return status(404, "NotFound", &format!("{name} not found"));
                };
                let cur_rv = cur
                    .pointer("/metadata/resourceVersion")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string();
                if let Some(rv) = obj
                    .pointer("/metadata/resourceVersion")
                    .and_then(Value::as_str)
                    && rv != cur_rv
                {
                    return status(
                        409,
                        "Conflict",
                        &format!(
                            "Operation cannot be fulfilled on {} {name}: the object has been modified",
                            t.kind.1
                        ),
                    );
                }
                for k in ["uid", "creationTimestamp", "generation"] {
                    if let Some(v) = cur["metadata"].get(k) {
                        obj["metadata"][k] = v.clone();
                    }
                }
                if let Some(n) = &t.namespace {
                    obj["metadata"]["namespace"] = n.clone().into();
                }
                obj["metadata"]["resourceVersion"] = self.next_rv().into();
                coll.insert(key, obj.clone());
                ok(&obj)
            }
            (&Method::POST, _) => {
                let Ok(mut obj) = serde_json::from_slice::<Value>(&body) else {
                    return status(400, "BadRequest", "body is not JSON");
                };
                let name = obj
                    .pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .map(str::to_string)
                    .unwrap_or_else(|| format!("gen-{}", self.next_rv()));
                obj["metadata"]["name"] = name.clone().into();
                if let Some(n) = &t.namespace {
                    obj["metadata"]["namespace"] = n.clone().into();
                }
                if coll.contains_key(&(ns.clone(), name.clone())) {
                    return status(409, "AlreadyExists", &format!("{name} exists"));
                }
                self.stamp_new(&mut obj);
                coll.insert((ns, name), obj.clone());
                ok(&obj)
            }
            (&Method::PATCH, Some(name)) => {
                let Ok(patch) = serde_json::from_slice::<Value>(&body) else {
                    return status(400, "BadRequest", "patch is not JSON");
                };
                let key = (ns.clone(), name.clone());
                let exists = coll.contains_key(&key);
                let apply = ctype.starts_with("application/apply-patch");
                if !exists && !apply {
                    return status(404, "NotFound", &format!("{name} not found"));
                }
                let mut obj = coll
                    .get(&key)
                    .cloned()
                    .unwrap_or_else(|| json!({"metadata": {"name": name}}));
                let before_spec = obj.get("spec").cloned();
                if ctype.starts_with("application/json-patch") {
                    let Ok(p) = serde_json::from_value::<json_patch::Patch>(patch) else {
                        return status(400, "BadRequest", "bad JSON patch");
                    };
                    // The API server's JSON patch reads an absent field as null
                    // (kube's finalizer helper tests `finalizers == null`).
                    let absent = obj.pointer("/metadata/finalizers").is_none();
                    if absent {
                        obj["metadata"]["finalizers"] = Value::Null;
                    }
                    if let Err(e) = json_patch::patch(&mut obj, &p) {
                        return status(422, "Invalid", &e.to_string());
                    }
                    if obj
                        .pointer("/metadata/finalizers")
                        .is_some_and(Value::is_null)
                        && let Some(m) = obj["metadata"].as_object_mut()
                    {
                        m.remove("finalizers");
                    }
                } else if t.sub.as_deref() == Some("status") {
                    if let Some(s) = patch.get("status") {
                        merge(&mut obj["status"], s);
                    }
                } else {
                    let mut p = patch.clone();
                    if let Some(m) = p.as_object_mut() {
                        m.remove("status");
                    }
                    merge(&mut obj, &p);
                }
                if let Some(n) = &t.namespace {
                    obj["metadata"]["namespace"] = n.clone().into();
                }
                if !exists {
                    self.stamp_new(&mut obj);
                } else {
                    obj["metadata"]["resourceVersion"] = self.next_rv().into();
                    if obj.get("spec").cloned() != before_spec {
                        let g = obj
                            .pointer("/metadata/generation")
                            .and_then(Value::as_i64)
                            .unwrap_or(1);
                        obj["metadata"]["generation"] = (g + 1).into();
                    }
                }
                // The last finalizer gone from an object being deleted: it goes.
                let deleting = obj.pointer("/metadata/deletionTimestamp").is_some();
                let no_finalizers = obj
                    .pointer("/metadata/finalizers")
                    .and_then(Value::as_array)
                    .is_none_or(|f| f.is_empty());
                if deleting && no_finalizers {
                    coll.remove(&key);
                } else {
                    coll.insert(key, obj.clone());
                }
                ok(&obj)
            }
            (&Method::DELETE, Some(name)) => {
                let key = (ns, name.clone());
                let Some(mut obj) = coll.get(&key).cloned() else {
                    return status(404, "NotFound", &format!("{name} not found"));
                };
                let has_finalizers = obj
                    .pointer("/metadata/finalizers")
                    .and_then(Value::as_array)
                    .is_some_and(|f| !f.is_empty());
                if has_finalizers {
                    obj["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:01Z".into();
                    coll.insert(key, obj.clone());
                } else {
                    coll.remove(&key);
                }
                ok(&obj)
            }
            _ => status(405, "MethodNotAllowed", &format!("{} {path}", parts.method)),
        }
    }
}
