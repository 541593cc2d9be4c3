//! HTTP front end: routing, body decoding, discovery, watch streaming.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use gpu_node_autoscaler_core::yaml;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{json, Value};
use tokio::sync::{broadcast, mpsc};

use crate::faults::{FaultState, Faults};
use crate::patch;
use crate::resources::{self, PODS, RESOURCES};
use crate::selector::{FieldSelector, LabelSelector};
use crate::status::{ApiError, ApiResult};
use crate::store::{event_line, ListOptions, Store, WatchFilter, WatchStart};

pub type Body = UnsyncBoxBody<Bytes, Infallible>;

/// The largest request body accepted (kube-apiserver's limit is 3 MiB).
const MAX_BODY: usize = 3 * 1024 * 1024;

pub struct App {
    pub store: Mutex<Store>,
    pub addr: SocketAddr,
    pub bookmark_interval: Duration,
    pub faults: Mutex<FaultState>,
    /// Bumped to end every open watch (`POST /admin/watches/close`).
    pub close_watches: tokio::sync::watch::Sender<u64>,
}

impl App {
    pub fn new(
        store: Store,
        addr: SocketAddr,
        bookmark_interval: Duration,
        faults: Faults,
        seed: u64,
    ) -> Self {
        App {
            store: Mutex::new(store),
            addr,
            bookmark_interval,
            faults: Mutex::new(FaultState::new(faults, seed)),
            close_watches: tokio::sync::watch::Sender::new(0),
        }
    }

    pub fn store(&self) -> MutexGuard<'_, Store> {
        // A panic while holding the lock leaves consistent data: every write is applied at once.
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn faults(&self) -> MutexGuard<'_, FaultState> {
        self.faults.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn json_response(code: u16, v: &Value) -> Response<Body> {
    let mut bytes = serde_json::to_vec(v).expect("serializable");
    bytes.push(b'\n');
    bytes_response(code, Bytes::from(bytes))
}

/// A response with a JSON body that is already serialized.
fn bytes_response(code: u16, bytes: Bytes) -> Response<Body> {
    let mut r = Response::new(Full::new(bytes).boxed_unsync());
    *r.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

fn error_response(e: &ApiError) -> Response<Body> {
    json_response(e.code, &e.to_status())
}

/// Serves one request. A handler that panics answers 500 with a `Status`; the store is left as it
/// was, because every write is applied only after all its checks have passed.
pub async fn handle(app: Arc<App>, req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let result = tokio::spawn(async move { serve_request(&app, req).await }).await;
    Ok(match result {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => error_response(&e),
        Err(_) => error_response(&ApiError::new(
            500,
            "InternalError",
            "an internal error occurred while serving the request",
        )),
    })
}

/// Admin requests are never faulted; health checks neither; every other request may be delayed
/// and may fail, as the fault settings say.
async fn serve_request(app: &Arc<App>, req: Request<Incoming>) -> ApiResult<Response<Body>> {
    let path = req.uri().path().trim_end_matches('/').to_string();
    if path == "/admin" || path.starts_with("/admin/") {
        return admin(app, req, &path).await;
    }
    if !matches!(path.as_str(), "/healthz" | "/readyz" | "/livez") {
        let (delay, injected) = {
            let mut f = app.faults();
            (f.faults.delay, f.roll())
        };
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        if let Some(e) = injected {
            let mut r = error_response(&e);
            if e.code == 429 {
                r.headers_mut()
                    .insert("Retry-After", HeaderValue::from_static("1"));
            }
            return Ok(r);
        }
    }
    route(app, req).await
}

/// `GET`/`PUT /admin/faults`, `POST /admin/watches/close`.
async fn admin(app: &Arc<App>, req: Request<Incoming>, path: &str) -> ApiResult<Response<Body>> {
    match (req.method().clone(), path) {
        (Method::GET, "/admin/faults") => Ok(json_response(200, &app.faults().faults.to_json())),
        (Method::PUT, "/admin/faults") => {
            let bytes = read_body(req).await?;
            let body: Value = serde_json::from_slice(&bytes)
                .map_err(|e| ApiError::bad_request(format!("the body must be JSON: {e}")))?;
            let faults = Faults::from_json(&body)?;
            app.faults().faults = faults;
            Ok(json_response(200, &faults.to_json()))
        }
        (Method::POST, "/admin/watches/close") => {
            let open = app.close_watches.receiver_count();
            app.close_watches.send_modify(|n| *n += 1);
            Ok(json_response(200, &json!({"closedWatches": open})))
        }
        (_, "/admin/faults" | "/admin/watches/close") => Err(ApiError::method_not_allowed(path)),
        _ => Err(ApiError::path_not_found(path)),
    }
}

struct Target {
    res: usize,
    namespace: Option<String>,
    name: Option<String>,
    sub: Option<String>,
}

/// Parses `/api/v1/...` and `/apis/<g>/<v>/...` resource paths.
fn parse_target(group: &str, version: &str, rest: &[&str], path: &str) -> ApiResult<Target> {
    let not_found = || ApiError::path_not_found(path);
    let find = |plural: &str| resources::find(group, version, plural).ok_or_else(not_found);
    let (res, namespace, rest) = if rest.len() >= 3 && rest[0] == "namespaces" {
        match resources::find(group, version, rest[2]) {
            Some(r) if RESOURCES[r].namespaced => (r, Some(rest[1].to_string()), &rest[3..]),
            _ if group.is_empty() => (find("namespaces")?, None, &rest[1..]),
            _ => return Err(not_found()),
        }
    } else {
        let r = find(rest.first().ok_or_else(not_found)?)?;
        (r, None, &rest[1..])
    };
    let (name, sub) = match rest {
        [] => (None, None),
        [n] => (Some(n.to_string()), None),
        [n, s] => (Some(n.to_string()), Some(s.to_string())),
        _ => return Err(not_found()),
    };
    if namespace.is_none() && name.is_some() && RESOURCES[res].namespaced {
        return Err(not_found());
    }
    Ok(Target {
        res,
        namespace,
        name,
        sub,
    })
}

fn decode_body(bytes: &[u8], content_type: &str) -> ApiResult<Value> {
    let mime = content_type.split(';').next().unwrap_or("").trim();
    let value: Value = match mime {
        "application/yaml" | "application/x-yaml" | "text/yaml" => yaml::parse_slice(bytes)
            .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?,
        _ => serde_json::from_slice(bytes).map_err(|e| {
            ApiError::bad_request(format!("couldn't get version/kind; json parse error: {e}"))
        })?,
    };
    Ok(value)
}

fn object_body(bytes: &[u8], content_type: &str) -> ApiResult<Value> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::bad_request("the request body is empty"));
    }
    match content_type.split(';').next().unwrap_or("").trim() {
        "" | "application/json" | "application/yaml" | "application/x-yaml" | "text/yaml"
        | "*/*" => {}
        other => return Err(ApiError::unsupported_media_type(other)),
    }
    let v = decode_body(bytes, content_type)?;
    if !v.is_object() {
        return Err(ApiError::bad_request(
            "the body of the request must be a JSON or YAML object",
        ));
    }
    Ok(v)
}

async fn read_body(req: Request<Incoming>) -> ApiResult<Bytes> {
    let limited = http_body_util::Limited::new(req.into_body(), MAX_BODY);
    match limited.collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(_) => Err(ApiError::new(
            413,
            "RequestEntityTooLarge",
            "the request body is too large or could not be read",
        )),
    }
}

fn list_options(q: &HashMap<String, String>, kind: &str) -> ApiResult<ListOptions> {
    let limit = match q.get("limit").map(|l| l.parse::<i64>()) {
        None => None,
        Some(Ok(l)) if l > 0 => Some(l as usize),
        Some(Ok(_)) => None,
        Some(Err(_)) => return Err(ApiError::bad_request("limit must be an integer")),
    };
    Ok(ListOptions {
        labels: LabelSelector::parse(q.get("labelSelector").map_or("", String::as_str))?,
        fields: FieldSelector::parse(q.get("fieldSelector").map_or("", String::as_str), kind)?,
        limit,
        continue_token: q.get("continue").filter(|c| !c.is_empty()).cloned(),
    })
}

async fn route(app: &Arc<App>, req: Request<Incoming>) -> ApiResult<Response<Body>> {
    let path = req.uri().path().trim_end_matches('/').to_string();
    let query: HashMap<String, String> = req
        .uri()
        .query()
        .map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
        .unwrap_or_default();
    let method = req.method().clone();
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();

    let get_only = |v: Value| -> ApiResult<Response<Body>> {
        if method == Method::GET {
            Ok(json_response(200, &v))
        } else {
            Err(ApiError::method_not_allowed(&path))
        }
    };
    match segs.as_slice() {
        ["version"] => return get_only(resources::version()),
        ["healthz"] | ["readyz"] | ["livez"] => {
            let mut r = Response::new(Full::new(Bytes::from_static(b"ok")).boxed_unsync());
            r.headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
            return Ok(r);
        }
        ["api"] => return get_only(resources::core_versions(&app.addr.to_string())),
        ["api", "v1"] => return get_only(resources::resource_list("", "v1")),
        ["apis"] => return get_only(resources::group_list()),
        ["apis", g] => {
            return resources::group(g)
                .map_or_else(|| Err(ApiError::path_not_found(&path)), get_only)
        }
        ["openapi", "v3"] => return get_only(resources::openapi_v3_root()),
        ["openapi", "v3", rest @ ..] => {
            return resources::openapi_v3_doc(&rest.join("/"))
                .map_or_else(|| Err(ApiError::path_not_found(&path)), get_only)
        }
        ["apis", g, v] if resources::group_version_known(g, v) => {
            return get_only(resources::resource_list(g, v))
        }
        _ => {}
    }
    let target = match segs.as_slice() {
        ["api", "v1", rest @ ..] if !rest.is_empty() => parse_target("", "v1", rest, &path)?,
        ["apis", g, v, rest @ ..] if !rest.is_empty() => parse_target(g, v, rest, &path)?,
        _ => return Err(ApiError::path_not_found(&path)),
    };
    let content_type = req
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let dry_run = query.get("dryRun").is_some_and(|d| d == "All");
    let res = target.res;
    let def = &RESOURCES[res];
    let ns = target.namespace.clone().unwrap_or_default();

    match (&method, target.name.as_deref(), target.sub.as_deref()) {
        (&Method::GET, None, None) => {
            if query.get("watch").is_some_and(|w| w == "1" || w == "true") {
                return watch(app, &target, &query);
            }
            let opts = list_options(&query, def.kind)?;
            let list = app
                .store()
                .list_json(res, target.namespace.as_deref(), &opts)?;
            Ok(bytes_response(200, list.to_bytes()))
        }
        (&Method::POST, None, None) => {
            if !def.namespaced && target.namespace.is_some() {
                return Err(ApiError::path_not_found(&path));
            }
            let body = object_body(&read_body(req).await?, &content_type)?;
            let obj = app.store().create(res, &ns, body, dry_run)?;
            Ok(json_response(201, &obj))
        }
        (&Method::DELETE, None, None) => {
            let opts = list_options(&query, def.kind)?;
            let mut store = app.store();
            let list = store.list(res, target.namespace.as_deref(), &opts)?;
            let mut items = Vec::new();
            for o in list["items"].as_array().into_iter().flatten() {
                let ons = o
                    .pointer("/metadata/namespace")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                let name = o
                    .pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                items.push(store.delete(res, ons, name, None, dry_run)?);
            }
            let mut out = list;
            out["items"] = json!(items);
            Ok(json_response(200, &out))
        }
        (&Method::GET, Some(name), None | Some("status"))
            if target.sub.is_none() || def.has_status =>
        {
            Ok(json_response(200, &app.store().get(res, &ns, name)?))
        }
        (&Method::PUT, Some(name), None | Some("status"))
            if target.sub.is_none() || def.has_status =>
        {
            let body = object_body(&read_body(req).await?, &content_type)?;
            let obj = app
                .store()
                .update(res, &ns, name, body, target.sub.is_some(), dry_run)?;
            Ok(json_response(200, &obj))
        }
        (&Method::PATCH, Some(name), None | Some("status"))
            if target.sub.is_none() || def.has_status =>
        {
            let bytes = read_body(req).await?;
            let mime = content_type
                .split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_string();
            let patch_body = decode_body(&bytes, "application/json")?;
            let mut store = app.store();
            let current = store.get(res, &ns, name)?;
            let next = match mime.as_str() {
                "application/merge-patch+json" => {
                    let mut t = current;
                    patch::merge_patch(&mut t, &patch_body);
                    t
                }
                "application/strategic-merge-patch+json" => {
                    let mut t = current;
                    patch::strategic_merge_patch(&mut t, &patch_body)?;
                    t
                }
                "application/json-patch+json" => patch::json_patch(&current, &patch_body)?,
                "application/apply-patch+yaml" => {
                    return Err(ApiError::unsupported_media_type(
                        "application/apply-patch+yaml (server-side apply is not implemented)",
                    ))
                }
                other => return Err(ApiError::unsupported_media_type(other)),
            };
            // A resourceVersion in the patch is a precondition; otherwise the patch applies to
            // the current version.
            let obj = store.update(res, &ns, name, next, target.sub.is_some(), dry_run)?;
            Ok(json_response(200, &obj))
        }
        (&Method::DELETE, Some(name), None) => {
            let bytes = read_body(req).await?;
            let opts = if bytes.iter().all(u8::is_ascii_whitespace) {
                None
            } else {
                Some(decode_body(&bytes, &content_type)?)
            };
            let obj = app.store().delete(res, &ns, name, opts.as_ref(), dry_run)?;
            Ok(json_response(200, &obj))
        }
        (&Method::POST, Some(name), Some("eviction")) if res == PODS => {
            let body = object_body(&read_body(req).await?, &content_type)?;
            let st = app.store().evict(&ns, name, &body)?;
            Ok(json_response(201, &st))
        }
        (&Method::POST, Some(name), Some("binding")) if res == PODS => {
            let body = object_body(&read_body(req).await?, &content_type)?;
            let st = app.store().bind(&ns, name, &body)?;
            Ok(json_response(201, &st))
        }
        (_, _, Some(sub)) if !matches!(sub, "status" | "eviction" | "binding") => {
            Err(ApiError::path_not_found(&path))
        }
        _ => Err(ApiError::method_not_allowed(&path)),
    }
}

fn watch(
    app: &Arc<App>,
    target: &Target,
    query: &HashMap<String, String>,
) -> ApiResult<Response<Body>> {
    let def = &RESOURCES[target.res];
    let opts = list_options(query, def.kind)?;
    let filter = WatchFilter {
        res: target.res,
        namespace: target.namespace.clone().filter(|_| def.namespaced),
        labels: opts.labels,
        fields: opts.fields,
    };
    let rv = match query.get("resourceVersion").filter(|r| !r.is_empty()) {
        None => None,
        Some(r) => Some(
            r.parse::<u64>()
                .map_err(|_| ApiError::bad_request(format!("invalid resource version: {r:?}")))?,
        ),
    };
    let timeout = query
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .filter(|t| *t > 0)
        .map(Duration::from_secs);
    let bookmarks = query
        .get("allowWatchBookmarks")
        .is_some_and(|b| b == "true" || b == "1");
    // A streaming list (client-go's WatchListClient, on in kubectl 1.35+): the current objects
    // as ADDED events, then a BOOKMARK marked `k8s.io/initial-events-end`.
    let initial_events_end = query
        .get("sendInitialEvents")
        .is_some_and(|b| b == "true" || b == "1");
    // A fault setting may end the watch earlier than the client asked.
    let close_after = app.faults().faults.watch_close_after;
    let timeout = match (timeout, close_after) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    let mut close = app.close_watches.subscribe();
    let start = app.store().watch(&filter, rv);
    let (tx, rx) = mpsc::channel::<Bytes>(256);
    let line = |v: &Value| {
        let mut b = serde_json::to_vec(v).expect("serializable");
        b.push(b'\n');
        Bytes::from(b)
    };
    let app2 = app.clone();
    match start {
        WatchStart::Expired(e) => {
            let _ = tx.try_send(line(&json!({"type": "ERROR", "object": e.to_status()})));
        }
        WatchStart::Stream { initial, mut rx } => {
            let kind = def.kind;
            let api_version = def.api_version();
            tokio::spawn(async move {
                for (kind, obj) in &initial {
                    if tx.send(event_line(kind.as_str(), obj)).await.is_err() {
                        return;
                    }
                }
                if initial_events_end {
                    let rv = app2.store().resource_version();
                    let b = json!({"type": "BOOKMARK", "object": {
                        "kind": kind, "apiVersion": api_version,
                        "metadata": {"resourceVersion": rv.to_string(),
                            "annotations": {"k8s.io/initial-events-end": "true"}}}});
                    if tx.send(line(&b)).await.is_err() {
                        return;
                    }
                }
                let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
                let mut tick =
                    tokio::time::interval(app2.bookmark_interval.max(Duration::from_millis(10)));
                tick.tick().await;
                loop {
                    let sleep = crate::store::sleep_until(deadline);
                    tokio::select! {
                        ev = rx.recv() => match ev {
                            Ok(ev) => {
                                if let Some((kind, obj)) = filter.event(&ev) {
                                    if tx.send(event_line(kind.as_str(), &obj)).await.is_err() {
                                        return;
                                    }
                                }
                            }
                            Err(broadcast::error::RecvError::Lagged(_)) => {
                                let e = ApiError::expired("the watcher fell too far behind; relist");
                                let _ = tx.send(line(&json!({"type": "ERROR", "object": e.to_status()}))).await;
                                return;
                            }
                            Err(broadcast::error::RecvError::Closed) => return,
                        },
                        _ = tick.tick(), if bookmarks => {
                            let rv = app2.store().resource_version();
                            let b = json!({"type": "BOOKMARK", "object": {
                                "kind": kind, "apiVersion": api_version,
                                "metadata": {"resourceVersion": rv.to_string()}}});
                            if tx.send(line(&b)).await.is_err() {
                                return;
                            }
                        }
                        _ = tx.closed() => return,
                        _ = sleep => return,
                        _ = close.changed() => return,
                    }
                }
            });
        }
    }
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
    });
    let mut r = Response::new(StreamBody::new(stream).boxed_unsync());
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    Ok(r)
}
