//! An in-memory Kubernetes API server behind a `tower_test` mock service:
//! it answers the requests kube makes (list and watch with label and field
//! selectors, get, create, server-side apply with per-manager field
//! ownership, merge and JSON patches, delete with finalizers) from a store
//! the tests seed and inspect. Every request is recorded; chosen ones can be
//! made to fail. Scenarios drive `reconcile` and the node agent's loop
//! against it.

use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody, combinators::UnsyncBoxBody};
use hyper::body::{Bytes, Frame};
use kube::client::Body;
use serde_json::{Map, Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use tokio::sync::{Notify, mpsc};

/// `(api prefix, plural)`, e.g. `("/apis/kroce.io/v1alpha1", "rdmanetworks")`.
type Kind = (String, String);
/// `(namespace or "", name)`.
type Key = (String, String);
/// Response bodies: whole for everything but watches, which stream.
type MockBody = UnsyncBoxBody<Bytes, Infallible>;
/// A field path of a server-side apply, e.g. `["status", "syncState"]`.
type FieldPath = Vec<String>;

/// One request as the server saw it.
#[derive(Clone, Debug)]
pub struct Call {
    pub method: String,
    pub path: String,
    /// The raw (percent-encoded) query string, "" when none.
    pub query: String,
    pub content_type: String,
    /// The body as JSON; `Null` when empty or not JSON.
    pub body: Value,
}

impl Call {
    /// A decoded query parameter.
    pub fn param(&self, key: &str) -> Option<String> {
        query_param(&self.query, key)
    }
}

type Matcher = Box<dyn Fn(&Call) -> bool + Send>;

/// Requests to answer with an error instead of serving them.
struct Fault {
    code: u16,
    remaining: usize,
    matches: Matcher,
}

impl std::fmt::Debug for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fault")
            .field("code", &self.code)
            .field("remaining", &self.remaining)
            .finish_non_exhaustive()
    }
}

/// One change of the store, as a watch reports it.
#[derive(Clone, Debug)]
struct Event {
    rv: u64,
    kind: Kind,
    namespace: String,
    type_: &'static str,
    object: Value,
}

/// What a watch asked for.
struct WatchFilter {
    kind: Kind,
    namespace: Option<String>,
    labels: String,
    fields: String,
}

impl WatchFilter {
    fn matches(&self, e: &Event) -> bool {
        e.kind == self.kind
            && self.namespace.as_ref().is_none_or(|n| *n == e.namespace)
            && labels_match(&e.object, &self.labels)
            && fields_match(&e.object, &self.fields)
    }
}

#[derive(Clone, Default, Debug)]
pub struct ApiServer {
    pub store: Arc<Mutex<BTreeMap<Kind, BTreeMap<Key, Value>>>>,
    /// Every request, in order.
    pub calls: Arc<Mutex<Vec<Call>>>,
    rv: Arc<Mutex<u64>>,
    /// Container logs by `(namespace, pod)`, served at `pods/<name>/log`.
    pub pod_logs: Arc<Mutex<BTreeMap<Key, String>>>,
    /// `namespace/name` of pods whose eviction a PodDisruptionBudget refuses (429).
    pub refuse_eviction: Arc<Mutex<Vec<String>>>,
    faults: Arc<Mutex<Vec<Fault>>>,
    /// Requests that get no answer at all (a hung API server or network):
    /// `(method, path substring)`.
    pub hang: Arc<Mutex<Vec<(String, String)>>>,
    /// Plurals this server does not serve (their CRD is not installed): a
    /// plain-text "404 page not found", as kube-apiserver answers.
    pub unserved: Arc<Mutex<BTreeSet<String>>>,
    /// When set, the namespaces that exist: writes into any other one are a
    /// 404 `namespaces "<ns>" not found`.
    pub namespaces: Arc<Mutex<Option<BTreeSet<String>>>>,
    /// Every change since the start, for watches.
    events: Arc<Mutex<Vec<Event>>>,
    events_changed: Arc<Notify>,
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

fn query_param(query: &str, key: &str) -> Option<String> {
    query.split('&').find_map(|kv| {
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

fn full(bytes: Vec<u8>) -> MockBody {
    Full::new(Bytes::from(bytes)).boxed_unsync()
}

fn respond(code: u16, ctype: &str, body: MockBody) -> Response<MockBody> {
    Response::builder()
        .status(code)
        .header("content-type", ctype)
        .body(body)
        .unwrap_or_else(|_| Response::new(full(Vec::new())))
}

fn status(code: u16, reason: &str, message: &str) -> Response<MockBody> {
    let body = json!({
        "apiVersion": "v1", "kind": "Status", "status": "Failure",
        "message": message, "reason": reason, "code": code, "metadata": {}
    });
    respond(
        code,
        "application/json",
        full(body.to_string().into_bytes()),
    )
}

fn ok(v: &Value) -> Response<MockBody> {
    respond(
        StatusCode::OK.as_u16(),
        "application/json",
        full(v.to_string().into_bytes()),
    )
}

/// JSON merge patch (RFC 7386); server-side apply merges the same way
/// (maps merge, lists replace: CRD lists without a list type are atomic)
/// after dropping the fields its manager no longer sets.
fn merge(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    // RFC 7386: an object patched onto a non-object starts from `{}`, so
    // the patch's nulls delete, never land.
    if !target.is_object() {
        *target = Value::Object(Default::default());
    }
    if let Value::Object(t) = target {
        for (k, v) in p {
            if v.is_null() {
                t.remove(k);
            } else {
                merge(t.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
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

/// `metadata.name=n1,spec.nodeName!=n2`: dotted paths compared as strings.
fn fields_match(obj: &Value, selector: &str) -> bool {
    selector.split(',').filter(|s| !s.is_empty()).all(|term| {
        let (path, want, equal) = if let Some((k, v)) = term.split_once("!=") {
            (k, v, false)
        } else if let Some((k, v)) = term.split_once("==") {
            (k, v, true)
        } else if let Some((k, v)) = term.split_once('=') {
            (k, v, true)
        } else {
            return true;
        };
        let got = obj
            .pointer(&format!("/{}", path.replace('.', "/")))
            .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_string))
            .unwrap_or_default();
        (got == want) == equal
    })
}

fn rv_of(obj: &Value) -> u64 {
    obj.pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// The leaf paths of an applied configuration: maps recurse, anything else
/// (scalars, atomic lists, empty maps) is owned whole.
fn leaf_paths(v: &Value, prefix: &mut FieldPath, out: &mut BTreeSet<FieldPath>) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, c) in m {
                prefix.push(k.clone());
                leaf_paths(c, prefix, out);
                prefix.pop();
            }
        }
        _ => {
            out.insert(prefix.clone());
        }
    }
}

/// The fields an apply request sets: the status subresource owns `status`
/// only, the main resource everything else but identity.
fn applied_paths(patch: &Value, status_sub: bool) -> BTreeSet<FieldPath> {
    let mut out = BTreeSet::new();
    if status_sub {
        if let Some(s) = patch.get("status") {
            leaf_paths(s, &mut vec!["status".into()], &mut out);
        }
        return out;
    }
    let mut p = patch.clone();
    if let Some(m) = p.as_object_mut() {
        for k in ["apiVersion", "kind", "status"] {
            m.remove(k);
        }
    }
    if let Some(m) = p.get_mut("metadata").and_then(Value::as_object_mut) {
        for k in ["name", "namespace", "resourceVersion", "managedFields"] {
            m.remove(k);
        }
    }
    leaf_paths(&p, &mut Vec::new(), &mut out);
    out.retain(|f| !f.is_empty() && f != &["metadata".to_string()]);
    out
}

/// `fieldsV1` as the API server writes it: `{"f:status": {"f:syncState": {}}}`.
fn to_fields_v1(paths: &BTreeSet<FieldPath>) -> Value {
    let mut root = Value::Object(Map::new());
    for p in paths {
        let mut at = &mut root;
        for seg in p {
            let Some(m) = at.as_object_mut() else {
                break;
            };
            at = m.entry(format!("f:{seg}")).or_insert_with(|| json!({}));
        }
    }
    root
}

fn from_fields_v1(v: &Value, prefix: &mut FieldPath, out: &mut BTreeSet<FieldPath>) {
    let children: Vec<(&String, &Value)> = v
        .as_object()
        .map(|m| m.iter().filter(|(k, _)| k.starts_with("f:")).collect())
        .unwrap_or_default();
    if children.is_empty() {
        if !prefix.is_empty() {
            out.insert(prefix.clone());
        }
        return;
    }
    for (k, c) in children {
        prefix.push(k.trim_start_matches("f:").to_string());
        from_fields_v1(c, prefix, out);
        prefix.pop();
    }
}

/// Removes a field, and the maps it leaves empty.
fn remove_path(v: &mut Value, path: &[String]) {
    let Some((first, rest)) = path.split_first() else {
        return;
    };
    let Some(m) = v.as_object_mut() else {
        return;
    };
    if rest.is_empty() {
        m.remove(first);
        return;
    }
    if let Some(child) = m.get_mut(first) {
        remove_path(child, rest);
        if child.as_object().is_some_and(Map::is_empty) {
            m.remove(first);
        }
    }
}

/// Server-side apply of `patch` by `manager` to `obj`: fields the manager
/// set last time and sets no more (and no other manager owns) go, then the
/// patch merges, then the manager's `managedFields` entry records what it
/// now owns. Conflicts between managers are not modelled (every caller
/// forces).
fn server_side_apply(obj: &mut Value, patch: &Value, manager: &str, status_sub: bool) {
    let sub = status_sub.then_some("status");
    let entries: Vec<Value> = obj
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let is_mine = |e: &Value| {
        e.get("manager").and_then(Value::as_str) == Some(manager)
            && e.get("operation").and_then(Value::as_str) == Some("Apply")
            && e.get("subresource").and_then(Value::as_str) == sub
    };
    let mut old = BTreeSet::new();
    let mut others = BTreeSet::new();
    for e in &entries {
        let set = if is_mine(e) { &mut old } else { &mut others };
        from_fields_v1(
            e.get("fieldsV1").unwrap_or(&Value::Null),
            &mut Vec::new(),
            set,
        );
    }
    let new = applied_paths(patch, status_sub);
    for gone in old.difference(&new) {
        let shared = others
            .iter()
            .any(|o| o.starts_with(gone) || gone.starts_with(o));
        if !shared {
            remove_path(obj, gone);
        }
    }
    if status_sub {
        if let Some(s) = patch.get("status") {
            merge(&mut obj["status"], s);
        }
    } else {
        let mut p = patch.clone();
        if let Some(m) = p.as_object_mut() {
            m.remove("status");
        }
        merge(obj, &p);
    }
    let mut entries: Vec<Value> = entries.into_iter().filter(|e| !is_mine(e)).collect();
    let mut entry = json!({
        "manager": manager,
        "operation": "Apply",
        "apiVersion": patch.get("apiVersion").cloned().unwrap_or(Value::Null),
        "fieldsType": "FieldsV1",
        "fieldsV1": to_fields_v1(&new),
    });
    if let Some(s) = sub {
        entry["subresource"] = s.into();
    }
    entries.push(entry);
    obj["metadata"]["managedFields"] = Value::Array(entries);
}

impl ApiServer {
    /// A kube client talking to a fresh server.
    pub fn start() -> (kube::Client, ApiServer) {
        let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<MockBody>>();
        let server = ApiServer::default();
        let s = server.clone();
        tokio::spawn(async move {
            // Unanswered requests stay here, so their callers wait forever.
            let mut held = Vec::new();
            while let Some((req, send)) = handle.next_request().await {
                if s.hangs(req.method().as_str(), req.uri().path()) {
                    if let Ok(mut l) = s.calls.lock() {
                        l.push(Call {
                            method: req.method().to_string(),
                            path: req.uri().path().to_string(),
                            query: req.uri().query().unwrap_or("").to_string(),
                            content_type: String::new(),
                            body: Value::Null,
                        });
                    }
                    held.push(send);
                    continue;
                }
                let resp = s.handle(req).await;
                send.send_response(resp);
            }
        });
        (kube::Client::new(svc, "default"), server)
    }

    /// Serves this server over plain HTTP/1 on `listener` (a kubeconfig
    /// with `server: http://<addr>`), for a shipped binary in another
    /// process. Runs until the task is aborted.
    pub async fn serve_http(self, listener: tokio::net::TcpListener) {
        use hyper::service::service_fn;
        use hyper_util::rt::TokioIo;
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let server = self.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<hyper::body::Incoming>| {
                    let server = server.clone();
                    async move {
                        let (parts, body) = req.into_parts();
                        let bytes = body
                            .collect()
                            .await
                            .map(|b| b.to_bytes().to_vec())
                            .unwrap_or_default();
                        let req = Request::from_parts(parts, Body::from(bytes));
                        Ok::<_, Infallible>(server.handle(req).await)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    }

    fn next_rv(&self) -> String {
        let mut rv = self.rv.lock().unwrap_or_else(|e| e.into_inner());
        *rv += 1;
        rv.to_string()
    }

    fn current_rv(&self) -> u64 {
        *self.rv.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Tells watchers of `kind` about `obj` (carrying its new resourceVersion).
    fn emit(&self, kind: &Kind, type_: &'static str, obj: &Value) {
        let namespace = obj
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let mut events = self.events.lock().unwrap_or_else(|e| e.into_inner());
        events.push(Event {
            rv: rv_of(obj),
            kind: kind.clone(),
            namespace,
            type_,
            object: obj.clone(),
        });
        drop(events);
        self.events_changed.notify_waiters();
    }

    /// From now on, `method` requests whose path contains `path` are never
    /// answered.
    pub fn hang_on(&self, method: &str, path: &str) {
        if let Ok(mut h) = self.hang.lock() {
            h.push((method.to_string(), path.to_string()));
        }
    }

    fn hangs(&self, method: &str, path: &str) -> bool {
        self.hang.lock().is_ok_and(|h| {
            h.iter()
                .any(|(m, p)| m == method && path.contains(p.as_str()))
        })
    }

    /// The next `times` requests `matches` accepts are answered with `code`
    /// (a Kubernetes `Status`) and change nothing.
    pub fn fail(&self, code: u16, times: usize, matches: impl Fn(&Call) -> bool + Send + 'static) {
        let mut faults = self.faults.lock().unwrap_or_else(|e| e.into_inner());
        faults.push(Fault {
            code,
            remaining: times,
            matches: Box::new(matches),
        });
    }

    fn injected_fault(&self, call: &Call) -> Option<u16> {
        let mut faults = self.faults.lock().unwrap_or_else(|e| e.into_inner());
        let f = faults
            .iter_mut()
            .find(|f| f.remaining > 0 && (f.matches)(call))?;
        f.remaining -= 1;
        Some(f.code)
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
        let kind = (prefix.to_string(), plural.to_string());
        let mut store = self.store.lock().unwrap_or_else(|e| e.into_inner());
        let existed = store
            .entry(kind.clone())
            .or_default()
            .insert((ns, name), obj.clone())
            .is_some();
        self.emit(&kind, if existed { "MODIFIED" } else { "ADDED" }, &obj);
    }

    pub fn get(&self, prefix: &str, plural: &str, ns: &str, name: &str) -> Option<Value> {
        let store = self.store.lock().unwrap_or_else(|e| e.into_inner());
        store
            .get(&(prefix.to_string(), plural.to_string()))?
            .get(&(ns.to_string(), name.to_string()))
            .cloned()
    }

    /// Modifies a stored object in place, bypassing the API: no new
    /// resourceVersion, no generation bump, watchers are not told. For
    /// setting up states; [`ApiServer::update`] is another client's write.
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

    /// A write by another client (kubectl, the controller): a new
    /// resourceVersion, the generation bumped when the spec changed, and a
    /// `MODIFIED` event for watchers. False when there is no such object.
    pub fn update(
        &self,
        prefix: &str,
        plural: &str,
        ns: &str,
        name: &str,
        f: impl FnOnce(&mut Value),
    ) -> bool {
        let kind = (prefix.to_string(), plural.to_string());
        let mut store = self.store.lock().unwrap_or_else(|e| e.into_inner());
        let Some(o) = store
            .get_mut(&kind)
            .and_then(|m| m.get_mut(&(ns.to_string(), name.to_string())))
        else {
            return false;
        };
        let before_spec = o.get("spec").cloned();
        f(o);
        if o.get("spec").cloned() != before_spec {
            let g = o
                .pointer("/metadata/generation")
                .and_then(Value::as_i64)
                .unwrap_or(1);
            o["metadata"]["generation"] = (g + 1).into();
        }
        o["metadata"]["resourceVersion"] = self.next_rv().into();
        let o = o.clone();
        self.emit(&kind, "MODIFIED", &o);
        true
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

    /// `METHOD path` of every request, in order.
    pub fn requests(&self) -> Vec<String> {
        self.calls()
            .iter()
            .map(|c| format!("{} {}", c.method, c.path))
            .collect()
    }

    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().map(|l| l.clone()).unwrap_or_default()
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

    /// A watch: events after `since` (or, without one, the objects there are
    /// now as `ADDED`), then every matching change, one JSON line each,
    /// until the client hangs up.
    fn watch(
        &self,
        filter: WatchFilter,
        since: Option<u64>,
        coll: &BTreeMap<Key, Value>,
    ) -> Response<MockBody> {
        let (tx, rx) = mpsc::unbounded_channel::<Bytes>();
        let cursor = match since {
            Some(rv) => rv,
            None => {
                for ((ns, _), obj) in coll {
                    let e = Event {
                        rv: rv_of(obj),
                        kind: filter.kind.clone(),
                        namespace: ns.clone(),
                        type_: "ADDED",
                        object: obj.clone(),
                    };
                    if filter.matches(&e) {
                        let _ = tx.send(watch_line(&e));
                    }
                }
                self.current_rv()
            }
        };
        let s = self.clone();
        tokio::spawn(async move { s.stream_events(filter, cursor, tx).await });
        let frames = futures::stream::unfold(rx, |mut rx| async move {
            let b = rx.recv().await?;
            Some((Ok::<_, Infallible>(Frame::data(b)), rx))
        });
        respond(
            200,
            "application/json",
            StreamBody::new(frames).boxed_unsync(),
        )
    }

    async fn stream_events(
        self,
        filter: WatchFilter,
        mut cursor: u64,
        tx: mpsc::UnboundedSender<Bytes>,
    ) {
        loop {
            // Registered before reading, so no change slips between.
            let changed = self.events_changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let batch: Vec<Bytes> = {
                let events = self.events.lock().unwrap_or_else(|e| e.into_inner());
                let fresh: Vec<&Event> = events.iter().filter(|e| e.rv > cursor).collect();
                cursor = fresh.iter().map(|e| e.rv).max().unwrap_or(cursor);
                fresh
                    .into_iter()
                    .filter(|e| filter.matches(e))
                    .map(watch_line)
                    .collect()
            };
            for line in batch {
                if tx.send(line).is_err() {
                    return;
                }
            }
            if tx.is_closed() {
                return;
            }
            changed.await;
        }
    }

    async fn handle(&self, req: Request<Body>) -> Response<MockBody> {
        let (parts, body) = req.into_parts();
        let body = body
            .collect_bytes()
            .await
            .map(|b| b.to_vec())
            .unwrap_or_default();
        let path = parts.uri.path().to_string();
        let ctype = parts
            .headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let call = Call {
            method: parts.method.to_string(),
            path: path.clone(),
            query: parts.uri.query().unwrap_or("").to_string(),
            content_type: ctype.clone(),
            body: serde_json::from_slice(&body).unwrap_or(Value::Null),
        };
        if let Ok(mut l) = self.calls.lock() {
            l.push(call.clone());
        }
        if let Some(code) = self.injected_fault(&call) {
            return status(
                code,
                "InternalError",
                &format!("injected failure of {path}"),
            );
        }
        let Some(t) = parse_path(&path) else {
            return status(404, "NotFound", &format!("no route {path}"));
        };
        if self
            .unserved
            .lock()
            .is_ok_and(|u| u.contains(t.kind.1.as_str()))
        {
            return respond(404, "text/plain", full(b"404 page not found".to_vec()));
        }
        // The API server refuses label values over 63 characters (a selector
        // built from a longer name).
        if let Some(sel) = call.param("labelSelector")
            && sel.split(',').any(|term| {
                term.split_once('=')
                    .is_some_and(|(_, v)| v.trim_start_matches('=').len() > 63)
            })
        {
            return status(
                400,
                "BadRequest",
                &format!("unable to parse requirement: {sel}: must be no more than 63 characters"),
            );
        }
        if parts.method != Method::GET
            && parts.method != Method::DELETE
            && let Some(ns) = &t.namespace
            && self
                .namespaces
                .lock()
                .is_ok_and(|n| n.as_ref().is_some_and(|n| !n.contains(ns)))
        {
            let body = json!({
                "apiVersion": "v1", "kind": "Status", "status": "Failure",
                "message": format!("namespaces \"{ns}\" not found"), "reason": "NotFound",
                "details": {"name": ns, "kind": "namespaces"}, "code": 404, "metadata": {}
            });
            return respond(404, "application/json", full(body.to_string().into_bytes()));
        }
        let ns = t.namespace.clone().unwrap_or_default();
        let mut store = self.store.lock().unwrap_or_else(|e| e.into_inner());
        let coll = store.entry(t.kind.clone()).or_default();
        match (&parts.method, &t.name) {
            (&Method::GET, None) => {
                let labels = call.param("labelSelector").unwrap_or_default();
                let fields = call.param("fieldSelector").unwrap_or_default();
                if call.param("watch").as_deref() == Some("true") {
                    let since = call
                        .param("resourceVersion")
                        .and_then(|v| v.parse().ok())
                        .filter(|v| *v != 0);
                    let filter = WatchFilter {
                        kind: t.kind.clone(),
                        namespace: t.namespace.clone(),
                        labels,
                        fields,
                    };
                    return self.watch(filter, since, coll);
                }
                let items: Vec<Value> = coll
                    .iter()
                    .filter(|((ons, _), _)| t.namespace.is_none() || *ons == ns)
                    .map(|(_, v)| v.clone())
                    .filter(|v| labels_match(v, &labels) && fields_match(v, &fields))
                    .collect();
                let rv = self.current_rv().to_string();
                ok(
                    &json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": rv}, "items": items}),
                )
            }
            (&Method::GET, Some(name)) if t.sub.as_deref() == Some("log") => {
                if !coll.contains_key(&(ns.clone(), name.clone())) {
                    return status(404, "NotFound", &format!("pod {name} not found"));
                }
                let logs = self.pod_logs.lock().unwrap_or_else(|e| e.into_inner());
                let text = logs.get(&(ns, name.clone())).cloned().unwrap_or_default();
                respond(200, "text/plain", full(text.into_bytes()))
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
                let Some(mut gone) = coll.remove(&(ns, name.clone())) else {
                    return status(404, "NotFound", &format!("pods {name} not found"));
                };
                gone["metadata"]["resourceVersion"] = self.next_rv().into();
                self.emit(&t.kind, "DELETED", &gone);
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
                self.emit(&t.kind, "MODIFIED", &obj);
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
                self.emit(&t.kind, "ADDED", &obj);
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
                let status_sub = t.sub.as_deref() == Some("status");
                if apply {
                    let Some(manager) = call.param("fieldManager") else {
                        return status(422, "Invalid", "fieldManager is required for apply patch");
                    };
                    server_side_apply(&mut obj, &patch, &manager, status_sub);
                } else if ctype.starts_with("application/json-patch") {
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
                } else if status_sub {
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
                    self.emit(&t.kind, "DELETED", &obj);
                } else {
                    coll.insert(key, obj.clone());
                    self.emit(&t.kind, if exists { "MODIFIED" } else { "ADDED" }, &obj);
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
                obj["metadata"]["resourceVersion"] = self.next_rv().into();
                if has_finalizers {
                    obj["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:01Z".into();
                    coll.insert(key, obj.clone());
                    self.emit(&t.kind, "MODIFIED", &obj);
                } else {
                    coll.remove(&key);
                    self.emit(&t.kind, "DELETED", &obj);
                }
                ok(&obj)
            }
            _ => status(405, "MethodNotAllowed", &format!("{} {path}", parts.method)),
        }
    }
}

fn watch_line(e: &Event) -> Bytes {
    let mut line = json!({"type": e.type_, "object": e.object}).to_string();
    line.push('\n');
    Bytes::from(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apply_drops_what_its_manager_no_longer_sets_and_keeps_the_others() {
        let mut obj = json!({"metadata": {"name": "n1"}, "status": {}});
        let p1 = json!({"status": {"syncState": "Failed", "lastError": "boom", "pfs": [1, 2]}});
        server_side_apply(&mut obj, &p1, "agent", true);
        let other = json!({"status": {"admissionPhase": "Admitted"}});
        server_side_apply(&mut obj, &other, "admission", true);
        let p2 = json!({"status": {"syncState": "Succeeded", "pfs": [1]}});
        server_side_apply(&mut obj, &p2, "agent", true);
        assert_eq!(
            obj["status"],
            json!({"syncState": "Succeeded", "pfs": [1], "admissionPhase": "Admitted"})
        );
        let entries = obj["metadata"]["managedFields"].as_array().unwrap();
        assert_eq!(entries.len(), 2, "{entries:#?}");
        // Another manager's field the agent stops setting stays.
        let p3 = json!({"status": {"syncState": "Succeeded", "pfs": [1], "admissionPhase": "x"}});
        server_side_apply(&mut obj, &p3, "agent", true);
        server_side_apply(&mut obj, &p2, "agent", true);
        assert_eq!(obj["status"]["admissionPhase"], "x");
    }

    #[test]
    fn field_selectors_compare_dotted_paths() {
        let pod = json!({"metadata": {"name": "p"}, "spec": {"nodeName": "n1"}});
        assert!(fields_match(&pod, "spec.nodeName=n1"));
        assert!(fields_match(&pod, "spec.nodeName==n1,metadata.name=p"));
        assert!(!fields_match(&pod, "spec.nodeName=n2"));
        assert!(fields_match(&pod, "spec.nodeName!=n2"));
        assert!(fields_match(&pod, ""));
    }
}
