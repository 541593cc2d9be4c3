//! The in-memory object store: CRUD with resourceVersions, list, watch history, eviction.

use std::collections::{BTreeMap, VecDeque};
use std::ops::Bound;
use std::sync::Arc;

use bytes::Bytes;
use gpu_node_autoscaler_provider::rng::SplitMix64;
use serde_json::{json, Map, Value};
use tokio::sync::broadcast;

use crate::resources::{ResourceDef, NAMESPACES, NODES, PDBS, PODS, RESOURCES};
use crate::selector::{FieldSelector, LabelSelector};
use crate::status::{self, ApiError, ApiResult};
use crate::validation;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One change, kept in the bounded history and broadcast to watchers.
#[derive(Debug)]
pub struct WatchEvent {
    pub rv: u64,
    pub res: usize,
    pub namespace: String,
    pub kind: EventType,
    pub object: Value,
    /// `object` as JSON, serialized once for every watcher.
    pub json: Bytes,
    pub prev: Option<Value>,
}

/// A stored object and its JSON, kept side by side: lists and watches copy the bytes instead of
/// cloning and serializing the object again.
#[derive(Debug, Clone)]
struct Stored {
    value: Value,
    json: Bytes,
}

fn to_json(v: &Value) -> Bytes {
    Bytes::from(serde_json::to_vec(v).expect("serializable"))
}

impl Stored {
    fn new(value: Value) -> Self {
        let json = to_json(&value);
        Stored { value, json }
    }
}

/// One watch event line: `{"type":"ADDED","object":{...}}` and a newline.
pub fn event_line(kind: &str, object_json: &[u8]) -> Bytes {
    let mut b = Vec::with_capacity(object_json.len() + 32);
    b.extend_from_slice(b"{\"type\":\"");
    b.extend_from_slice(kind.as_bytes());
    b.extend_from_slice(b"\",\"object\":");
    b.extend_from_slice(object_json);
    b.extend_from_slice(b"}\n");
    Bytes::from(b)
}

/// A list response with its items still as separate JSON documents (joined outside the lock).
pub struct JsonList {
    head: Value,
    items: Vec<Bytes>,
}

impl JsonList {
    /// The `<Kind>List` document, newline-terminated.
    pub fn to_bytes(&self) -> Bytes {
        // `head` is an object without `items`: drop its closing brace and append them.
        let head = serde_json::to_vec(&self.head).expect("serializable");
        let size: usize = self.items.iter().map(|i| i.len() + 1).sum();
        let mut b = Vec::with_capacity(head.len() + size + 16);
        b.extend_from_slice(&head[..head.len() - 1]);
        b.extend_from_slice(b",\"items\":[");
        for (i, item) in self.items.iter().enumerate() {
            if i > 0 {
                b.push(b',');
            }
            b.extend_from_slice(item);
        }
        b.extend_from_slice(b"]}\n");
        Bytes::from(b)
    }
}

/// What a watcher filters on.
#[derive(Debug, Clone)]
pub struct WatchFilter {
    pub res: usize,
    pub namespace: Option<String>,
    pub labels: LabelSelector,
    pub fields: FieldSelector,
}

impl WatchFilter {
    fn matches(&self, obj: &Value) -> bool {
        self.labels.matches(obj.pointer("/metadata/labels")) && self.fields.matches(obj)
    }

    /// The event type and object JSON a watcher with this filter sees for `ev`, if any.
    pub fn event(&self, ev: &WatchEvent) -> Option<(EventType, Bytes)> {
        if ev.res != self.res
            || self
                .namespace
                .as_ref()
                .is_some_and(|ns| *ns != ev.namespace)
        {
            return None;
        }
        let now = self.matches(&ev.object);
        let kind = match ev.kind {
            EventType::Added | EventType::Deleted => now.then_some(ev.kind)?,
            EventType::Modified => match (ev.prev.as_ref().is_some_and(|p| self.matches(p)), now) {
                (true, true) => EventType::Modified,
                (false, true) => EventType::Added,
                (true, false) => EventType::Deleted,
                (false, false) => return None,
            },
        };
        Some((kind, ev.json.clone()))
    }
}

/// Where a watch starts.
pub enum WatchStart {
    /// The requested resourceVersion is older than the history (410 Gone).
    Expired(ApiError),
    Stream {
        /// Events (type, object JSON) to send first.
        initial: Vec<(EventType, Bytes)>,
        rx: broadcast::Receiver<Arc<WatchEvent>>,
    },
}

/// Options that list/get/update requests carry.
#[derive(Debug, Clone, Default)]
pub struct ListOptions {
    pub labels: LabelSelector,
    pub fields: FieldSelector,
    pub limit: Option<usize>,
    pub continue_token: Option<String>,
}

type Key = (String, String);

pub struct Store {
    rv: u64,
    objects: Vec<BTreeMap<Key, Stored>>,
    history: VecDeque<Arc<WatchEvent>>,
    history_cap: usize,
    /// Events with a resourceVersion at or below this one may have left the history.
    compacted_rv: u64,
    tx: broadcast::Sender<Arc<WatchEvent>>,
    rng: SplitMix64,
}

/// The current time as the API server writes timestamps (RFC 3339, seconds).
pub fn now_timestamp() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<String> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect();
    String::from_utf8(bytes?).ok()
}

fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    obj.get("metadata")?.get(field)?.as_str()
}

fn int_or_percent(v: &Value, total: i64, round_up: bool) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => match s.strip_suffix('%') {
            Some(p) => {
                let p: i64 = p.parse().ok()?;
                let x = total * p;
                Some(if round_up { (x + 99) / 100 } else { x / 100 })
            }
            None => s.parse().ok(),
        },
        _ => None,
    }
}

fn pod_healthy(pod: &Value) -> bool {
    if pod.pointer("/status/phase").and_then(Value::as_str) != Some("Running") {
        return false;
    }
    match pod.pointer("/status/conditions").and_then(Value::as_array) {
        Some(conds) => conds
            .iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True"),
        None => true,
    }
}

fn pod_terminal(pod: &Value) -> bool {
    matches!(
        pod.pointer("/status/phase").and_then(Value::as_str),
        Some("Succeeded") | Some("Failed")
    )
}

/// The parts of a pod spec an update may change.
fn pod_spec_mutable_stripped(spec: &Value) -> Value {
    let mut s = spec.clone();
    if let Some(m) = s.as_object_mut() {
        for f in [
            "activeDeadlineSeconds",
            "tolerations",
            "terminationGracePeriodSeconds",
        ] {
            m.remove(f);
        }
        for list in ["containers", "initContainers"] {
            if let Some(cs) = m.get_mut(list).and_then(Value::as_array_mut) {
                for c in cs {
                    c.as_object_mut().map(|c| c.remove("image"));
                }
            }
        }
    }
    s
}

impl Store {
    pub fn new(history_cap: usize) -> Self {
        let (tx, _) = broadcast::channel(history_cap.clamp(16, 65_536));
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1);
        let mut s = Store {
            rv: 0,
            objects: RESOURCES.iter().map(|_| BTreeMap::new()).collect(),
            history: VecDeque::new(),
            history_cap: history_cap.max(1),
            compacted_rv: 0,
            tx,
            rng: SplitMix64::new(seed | 1),
        };
        for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
            s.create(NAMESPACES, "", json!({"metadata": {"name": ns}}), false)
                .expect("built-in namespace");
        }
        s
    }

    pub fn resource_version(&self) -> u64 {
        self.rv
    }

    fn next_random(&mut self) -> u64 {
        self.rng.next_u64()
    }

    fn new_uid(&mut self) -> String {
        let (a, b) = (self.next_random(), self.next_random());
        format!(
            "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
            a >> 32,
            (a >> 16) & 0xffff,
            a & 0xfff,
            0x8000 | (b >> 48) & 0x3fff,
            b & 0xffff_ffff_ffff
        )
    }

    fn name_suffix(&mut self) -> String {
        const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
        let mut r = self.next_random();
        (0..5)
            .map(|_| {
                let c = ALPHABET[(r % ALPHABET.len() as u64) as usize] as char;
                r /= ALPHABET.len() as u64;
                c
            })
            .collect()
    }

    fn record(
        &mut self,
        res: usize,
        namespace: &str,
        kind: EventType,
        object: Stored,
        prev: Option<Value>,
    ) {
        let ev = Arc::new(WatchEvent {
            rv: self.rv,
            res,
            namespace: namespace.to_string(),
            kind,
            object: object.value,
            json: object.json,
            prev,
        });
        if self.history.len() == self.history_cap {
            if let Some(old) = self.history.pop_front() {
                self.compacted_rv = old.rv;
            }
        }
        self.history.push_back(ev.clone());
        // No receiver is fine.
        let _ = self.tx.send(ev);
    }

    fn key(res: &ResourceDef, ns: &str, name: &str) -> Key {
        let ns = if res.namespaced { ns } else { "" };
        (ns.to_string(), name.to_string())
    }

    pub fn get(&self, res: usize, ns: &str, name: &str) -> ApiResult<Value> {
        let def = &RESOURCES[res];
        self.objects[res]
            .get(&Self::key(def, ns, name))
            .map(|s| s.value.clone())
            .ok_or_else(|| ApiError::not_found(def, name))
    }

    /// Whether an object exists (without copying it).
    pub fn contains(&self, res: usize, ns: &str, name: &str) -> bool {
        self.objects[res].contains_key(&Self::key(&RESOURCES[res], ns, name))
    }

    /// Creates an object in `ns` (ignored for cluster-scoped resources).
    pub fn create(
        &mut self,
        res: usize,
        ns: &str,
        mut obj: Value,
        dry_run: bool,
    ) -> ApiResult<Value> {
        let def = &RESOURCES[res];
        check_type(def, &obj)?;
        let meta = obj
            .as_object_mut()
            .expect("checked")
            .entry("metadata")
            .or_insert_with(|| json!({}));
        if !meta.is_object() {
            return Err(ApiError::bad_request("metadata must be an object"));
        }
        let name = match meta_str(&obj, "name").filter(|n| !n.is_empty()) {
            Some(n) => n.to_string(),
            None => match meta_str(&obj, "generateName").filter(|n| !n.is_empty()) {
                Some(prefix) => format!("{prefix}{}", self.name_suffix()),
                None => {
                    return Err(ApiError::invalid(
                        def,
                        "",
                        &[(
                            "metadata.name".into(),
                            "Required value: name or generateName is required".into(),
                        )],
                    ))
                }
            },
        };
        if def.namespaced {
            if let Some(body_ns) = meta_str(&obj, "namespace").filter(|n| !n.is_empty()) {
                if body_ns != ns {
                    return Err(ApiError::bad_request("the namespace of the provided object does not match the namespace sent on the request"));
                }
            }
            if !self.objects[NAMESPACES].contains_key(&(String::new(), ns.to_string())) {
                return Err(ApiError::not_found(&RESOURCES[NAMESPACES], ns));
            }
        }
        if let Some(cause) = validation::name_cause(def, &name) {
            return Err(ApiError::invalid(def, &name, &[cause]));
        }
        let causes = validation::validate(def, &obj);
        if !causes.is_empty() {
            return Err(ApiError::invalid(def, &name, &causes));
        }
        let key = Self::key(def, ns, &name);
        if self.objects[res].contains_key(&key) {
            return Err(ApiError::already_exists(def, &name));
        }
        let uid = self.new_uid();
        let rv = self.rv + 1;
        {
            let o = obj.as_object_mut().expect("checked");
            o.insert("apiVersion".into(), json!(def.api_version()));
            o.insert("kind".into(), json!(def.kind));
            let m = o["metadata"].as_object_mut().expect("checked");
            m.insert("name".into(), json!(name));
            if def.namespaced {
                m.insert("namespace".into(), json!(ns));
            } else {
                m.remove("namespace");
            }
            m.insert("uid".into(), json!(uid));
            m.insert("resourceVersion".into(), json!(rv.to_string()));
            m.insert("creationTimestamp".into(), json!(now_timestamp()));
            m.insert("generation".into(), json!(1));
            m.remove("deletionTimestamp");
            m.remove("deletionGracePeriodSeconds");
            apply_create_defaults(res, o);
        }
        if dry_run {
            return Ok(obj);
        }
        self.rv = rv;
        let stored = Stored::new(obj.clone());
        self.objects[res].insert(key.clone(), stored.clone());
        self.record(res, &key.0, EventType::Added, stored, None);
        Ok(obj)
    }

    /// Replaces an object (PUT, or the result of a PATCH). `status_only` for the status subresource.
    pub fn update(
        &mut self,
        res: usize,
        ns: &str,
        name: &str,
        mut new: Value,
        status_only: bool,
        dry_run: bool,
    ) -> ApiResult<Value> {
        let def = &RESOURCES[res];
        check_type(def, &new)?;
        let key = Self::key(def, ns, name);
        let old = self.objects[res]
            .get(&key)
            .map(|s| s.value.clone())
            .ok_or_else(|| ApiError::not_found(def, name))?;
        if !new.get("metadata").is_none_or(Value::is_object) {
            return Err(ApiError::bad_request("metadata must be an object"));
        }
        if let Some(n) = meta_str(&new, "name").filter(|n| !n.is_empty()) {
            if n != name {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({n}) does not match the name on the URL ({name})"
                )));
            }
        }
        if def.namespaced {
            if let Some(n) = meta_str(&new, "namespace").filter(|n| !n.is_empty()) {
                if n != ns {
                    return Err(ApiError::bad_request("the namespace of the provided object does not match the namespace sent on the request"));
                }
            }
        }
        let old_rv = meta_str(&old, "resourceVersion").unwrap_or("").to_string();
        if let Some(rv) = meta_str(&new, "resourceVersion").filter(|r| !r.is_empty()) {
            if rv != old_rv {
                return Err(ApiError::conflict(def, name, "the object has been modified; please apply your changes to the latest version and try again"));
            }
        }
        if let Some(uid) = meta_str(&new, "uid").filter(|u| !u.is_empty()) {
            let old_uid = meta_str(&old, "uid").unwrap_or("");
            if uid != old_uid {
                return Err(ApiError::conflict(def, name, &format!("Precondition failed: UID in precondition: {uid}, UID in object meta: {old_uid}")));
            }
        }
        let mut next = if status_only {
            let mut n = old.clone();
            match new.get("status") {
                Some(s) => n["status"] = s.clone(),
                None => {
                    n.as_object_mut().map(|o| o.remove("status"));
                }
            }
            n
        } else {
            let o = new.as_object_mut().expect("checked");
            if def.has_status {
                match old.get("status") {
                    Some(s) => o.insert("status".into(), s.clone()),
                    None => o.remove("status"),
                };
            }
            new
        };
        {
            let o = next.as_object_mut().expect("checked");
            o.insert("apiVersion".into(), json!(def.api_version()));
            o.insert("kind".into(), json!(def.kind));
            let m = o.entry("metadata").or_insert_with(|| json!({}));
            let m = m.as_object_mut().expect("checked");
            m.insert("name".into(), json!(name));
            if def.namespaced {
                m.insert("namespace".into(), json!(ns));
            }
            for f in [
                "uid",
                "creationTimestamp",
                "generation",
                "deletionTimestamp",
            ] {
                match old["metadata"].get(f) {
                    Some(v) => m.insert(f.into(), v.clone()),
                    None => m.remove(f),
                };
            }
            m.insert("resourceVersion".into(), json!(old_rv));
        }
        let causes = validation::validate(def, &next);
        if !causes.is_empty() {
            return Err(ApiError::invalid(def, name, &causes));
        }
        if res == PODS && !status_only {
            let (a, b) = (
                old.get("spec").unwrap_or(&Value::Null),
                next.get("spec").unwrap_or(&Value::Null),
            );
            if pod_spec_mutable_stripped(a) != pod_spec_mutable_stripped(b) {
                return Err(ApiError::invalid(def, name, &[(
                    "spec".into(),
                    "Forbidden: pod updates may not change fields other than `spec.containers[*].image`, `spec.initContainers[*].image`, `spec.activeDeadlineSeconds`, `spec.tolerations` (only additions to existing tolerations), `spec.terminationGracePeriodSeconds`".into(),
                )]));
            }
        }
        if next == old {
            return Ok(old);
        }
        let spec_changed =
            if def.has_status || old.get("spec").is_some() || next.get("spec").is_some() {
                old.get("spec") != next.get("spec")
            } else {
                false
            };
        if spec_changed {
            let g = old
                .pointer("/metadata/generation")
                .and_then(Value::as_i64)
                .unwrap_or(1);
            next["metadata"]["generation"] = json!(g + 1);
        }
        let rv = self.rv + 1;
        next["metadata"]["resourceVersion"] = json!(rv.to_string());
        if dry_run {
            return Ok(next);
        }
        self.rv = rv;
        let stored = Stored::new(next.clone());
        self.objects[res].insert(key.clone(), stored.clone());
        self.record(res, &key.0, EventType::Modified, stored, Some(old));
        Ok(next)
    }

    /// Deletes an object; `options` is a `DeleteOptions` body (preconditions honoured).
    pub fn delete(
        &mut self,
        res: usize,
        ns: &str,
        name: &str,
        options: Option<&Value>,
        dry_run: bool,
    ) -> ApiResult<Value> {
        let def = &RESOURCES[res];
        let key = Self::key(def, ns, name);
        let old = &self.objects[res]
            .get(&key)
            .ok_or_else(|| ApiError::not_found(def, name))?
            .value;
        if let Some(pre) = options.and_then(|o| o.get("preconditions")) {
            for (field, what) in [("uid", "UID"), ("resourceVersion", "ResourceVersion")] {
                if let Some(want) = pre.get(field).and_then(Value::as_str) {
                    let have = meta_str(old, field).unwrap_or("");
                    if want != have {
                        return Err(ApiError::conflict(def, name, &format!(
                            "Precondition failed: {what} in precondition: {want}, {what} in object meta: {have}"
                        )));
                    }
                }
            }
        }
        if dry_run {
            return Ok(old.clone());
        }
        let mut gone = self.objects[res].remove(&key).expect("present").value;
        self.rv += 1;
        gone["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        self.record(
            res,
            &key.0,
            EventType::Deleted,
            Stored::new(gone.clone()),
            None,
        );
        if res == NAMESPACES {
            for r in (0..RESOURCES.len()).filter(|r| RESOURCES[*r].namespaced) {
                let names: Vec<String> = self.objects[r]
                    .range((name.to_string(), String::new())..)
                    .take_while(|((n, _), _)| n == name)
                    .map(|((_, o), _)| o.clone())
                    .collect();
                for o in names {
                    self.delete(r, name, &o, None, false)?;
                }
            }
        }
        Ok(gone)
    }

    /// The objects a list selects (all namespaces when `ns` is None), and the continue token when
    /// `limit` cut the list short.
    fn select(
        &self,
        res: usize,
        ns: Option<&str>,
        opts: &ListOptions,
    ) -> ApiResult<(Vec<&Stored>, Option<String>)> {
        let def = &RESOURCES[res];
        let ns = ns.filter(|_| def.namespaced);
        let start: Bound<Key> = match &opts.continue_token {
            Some(tok) => {
                let bad = || ApiError::bad_request("continue key is not valid");
                let mut parts = tok.splitn(3, '.');
                let (_rv, kns, kname) = (
                    parts.next(),
                    parts.next().ok_or_else(bad)?,
                    parts.next().ok_or_else(bad)?,
                );
                Bound::Excluded((unhex(kns).ok_or_else(bad)?, unhex(kname).ok_or_else(bad)?))
            }
            None => match ns {
                Some(ns) => Bound::Included((ns.to_string(), String::new())),
                None => Bound::Unbounded,
            },
        };
        let mut items: Vec<&Stored> = Vec::new();
        let mut more = false;
        for ((kns, _), stored) in self.objects[res].range((start, Bound::Unbounded)) {
            if ns.is_some_and(|ns| ns != kns) {
                break;
            }
            let obj = &stored.value;
            if !opts.labels.matches(obj.pointer("/metadata/labels")) || !opts.fields.matches(obj) {
                continue;
            }
            if opts.limit.is_some_and(|l| items.len() >= l) {
                more = true;
                break;
            }
            items.push(stored);
        }
        // The continue token names the last returned item; the next page starts after it.
        let token = more.then(|| {
            let last = &items.last().expect("limit >= 1").value;
            format!(
                "{}.{}.{}",
                self.rv,
                hex(meta_str(last, "namespace")
                    .filter(|_| def.namespaced)
                    .unwrap_or("")),
                hex(meta_str(last, "name").unwrap_or(""))
            )
        });
        Ok((items, token))
    }

    fn list_head(&self, res: usize, token: Option<String>) -> Value {
        let def = &RESOURCES[res];
        let mut meta = Map::new();
        meta.insert("resourceVersion".into(), json!(self.rv.to_string()));
        if let Some(tok) = token {
            meta.insert("continue".into(), json!(tok));
        }
        json!({
            "kind": format!("{}List", def.kind),
            "apiVersion": def.api_version(),
            "metadata": meta,
        })
    }

    /// Lists objects (all namespaces when `ns` is None) as a `<Kind>List`.
    pub fn list(&self, res: usize, ns: Option<&str>, opts: &ListOptions) -> ApiResult<Value> {
        let (items, token) = self.select(res, ns, opts)?;
        let items: Vec<Value> = items.into_iter().map(|s| s.value.clone()).collect();
        let mut list = self.list_head(res, token);
        list["items"] = Value::Array(items);
        Ok(list)
    }

    /// The same list as [`Store::list`], with the items as their stored JSON: cheap to take under
    /// the lock, joined into one document by [`JsonList::to_bytes`] after it.
    pub fn list_json(
        &self,
        res: usize,
        ns: Option<&str>,
        opts: &ListOptions,
    ) -> ApiResult<JsonList> {
        let (items, token) = self.select(res, ns, opts)?;
        Ok(JsonList {
            items: items.into_iter().map(|s| s.json.clone()).collect(),
            head: self.list_head(res, token),
        })
    }

    /// Starts a watch: the events a watcher must see first, and a receiver for later ones.
    pub fn watch(&self, filter: &WatchFilter, rv: Option<u64>) -> WatchStart {
        let rx = self.tx.subscribe();
        let initial = match rv {
            None | Some(0) => {
                let opts = ListOptions {
                    labels: filter.labels.clone(),
                    fields: filter.fields.clone(),
                    ..Default::default()
                };
                let (items, _) = self
                    .select(filter.res, filter.namespace.as_deref(), &opts)
                    .expect("no continue token");
                items
                    .into_iter()
                    .map(|s| (EventType::Added, s.json.clone()))
                    .collect()
            }
            Some(rv) => {
                if rv < self.compacted_rv {
                    return WatchStart::Expired(ApiError::expired(format!(
                        "too old resource version: {rv} ({})",
                        self.compacted_rv + 1
                    )));
                }
                self.history
                    .iter()
                    .filter(|e| e.rv > rv)
                    .filter_map(|e| filter.event(e))
                    .collect()
            }
        };
        WatchStart::Stream { initial, rx }
    }

    /// The eviction subresource: honours PodDisruptionBudgets, else deletes the pod.
    pub fn evict(&mut self, ns: &str, name: &str, body: &Value) -> ApiResult<Value> {
        if let Some(n) = meta_str(body, "name").filter(|n| !n.is_empty()) {
            if n != name {
                return Err(ApiError::bad_request(format!(
                    "name in URL does not match name in Eviction object ({n} != {name})"
                )));
            }
        }
        let pod = self.get(PODS, ns, name)?;
        let opts = body.get("deleteOptions").filter(|o| o.is_object());
        let dry_run = opts
            .and_then(|o| o.get("dryRun"))
            .and_then(Value::as_array)
            .is_some_and(|d| !d.is_empty());
        let bypass = pod.pointer("/metadata/deletionTimestamp").is_some()
            || matches!(
                pod.pointer("/status/phase").and_then(Value::as_str),
                Some("Succeeded") | Some("Failed") | Some("Pending") | None
            );
        if !bypass {
            let labels = pod.pointer("/metadata/labels");
            let pdbs: Vec<&Value> = self.objects[PDBS]
                .range((ns.to_string(), String::new())..)
                .take_while(|((n, _), _)| n == ns)
                .map(|(_, p)| &p.value)
                .filter(|p| {
                    p.pointer("/spec/selector")
                        .and_then(LabelSelector::from_object)
                        .is_some_and(|s| s.matches(labels))
                })
                .collect();
            if pdbs.len() > 1 {
                return Err(ApiError::new(500, "InternalError", "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."));
            }
            if let Some(pdb) = pdbs.first() {
                let selector = pdb
                    .pointer("/spec/selector")
                    .and_then(LabelSelector::from_object)
                    .expect("matched above");
                let pods: Vec<&Value> = self.objects[PODS]
                    .range((ns.to_string(), String::new())..)
                    .take_while(|((n, _), _)| n == ns)
                    .map(|(_, p)| &p.value)
                    .filter(|p| selector.matches(p.pointer("/metadata/labels")))
                    .filter(|p| {
                        !pod_terminal(p) && p.pointer("/metadata/deletionTimestamp").is_none()
                    })
                    .collect();
                let expected = pods.len() as i64;
                let healthy = pods.iter().filter(|p| pod_healthy(p)).count() as i64;
                let spec = &pdb["spec"];
                let desired = if let Some(min) = spec.get("minAvailable") {
                    int_or_percent(min, expected, true).unwrap_or(expected)
                } else if let Some(max) = spec.get("maxUnavailable") {
                    expected - int_or_percent(max, expected, true).unwrap_or(0)
                } else {
                    1
                };
                let allowed = healthy - desired;
                let unhealthy_ok = !pod_healthy(&pod) && healthy >= desired;
                if allowed <= 0 && !unhealthy_ok {
                    let pdb_name = meta_str(pdb, "name").unwrap_or("");
                    return Err(ApiError::too_many_requests(
                        "Cannot evict pod as it would violate the pod's disruption budget.",
                        json!([{
                            "reason": "DisruptionBudget",
                            "message": format!("The disruption budget {pdb_name} needs {desired} healthy pods and has {healthy} currently"),
                        }]),
                    ));
                }
            }
        }
        self.delete(PODS, ns, name, opts, dry_run)?;
        Ok(status::success(201, None))
    }

    /// The binding subresource: assigns a pod to a node.
    pub fn bind(&mut self, ns: &str, name: &str, body: &Value) -> ApiResult<Value> {
        let def = &RESOURCES[PODS];
        let Some(node) = body
            .pointer("/target/name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
        else {
            return Err(ApiError::invalid(
                def,
                name,
                &[("target.name".into(), "Required value".into())],
            ));
        };
        let pod = self.get(PODS, ns, name)?;
        if let Some(cur) = pod
            .pointer("/spec/nodeName")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
        {
            return Err(ApiError::conflict(
                def,
                name,
                &format!("pod {name} is already assigned to node {cur:?}"),
            ));
        }
        let mut next = pod.clone();
        next["spec"]["nodeName"] = json!(node);
        let conds = next["status"]
            .as_object_mut()
            .map(|s| s.entry("conditions").or_insert_with(|| json!([])));
        if let Some(Value::Array(conds)) = conds {
            conds.retain(|c| c["type"] != "PodScheduled");
            conds.push(json!({"type": "PodScheduled", "status": "True", "lastTransitionTime": now_timestamp()}));
        }
        let key = Self::key(def, ns, name);
        self.rv += 1;
        next["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        let stored = Stored::new(next);
        self.objects[PODS].insert(key.clone(), stored.clone());
        self.record(PODS, &key.0, EventType::Modified, stored, Some(pod));
        Ok(status::success(201, None))
    }

    /// Every stored object of a resource, in key order.
    pub fn iter(&self, res: usize) -> impl Iterator<Item = &Value> {
        self.objects[res].values().map(|s| &s.value)
    }

    /// A receiver for every later change (the simulated controllers follow the store with it).
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<WatchEvent>> {
        self.tx.subscribe()
    }

    /// The number of stored objects of a resource (for tests and metrics).
    pub fn count(&self, res: usize) -> usize {
        self.objects[res].len()
    }
}

/// Waits up to `timeout` for a change to one of `resources`. A receiver that fell behind counts as
/// a change (the caller rescans anyway). Returns false once the store is gone.
pub async fn wait_for_change(
    rx: &mut broadcast::Receiver<Arc<WatchEvent>>,
    resources: &[usize],
    timeout: std::time::Duration,
) -> bool {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Err(_) => return true,
            Ok(Ok(ev)) if resources.contains(&ev.res) => return true,
            Ok(Ok(_)) => {}
            Ok(Err(broadcast::error::RecvError::Lagged(_))) => return true,
            Ok(Err(broadcast::error::RecvError::Closed)) => return false,
        }
    }
}

/// Sleeps until `at`, or forever when there is no `at` (a `select!` branch that may never fire).
pub async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Drops the changes already queued on `rx` (the caller is about to rescan).
pub fn drain(rx: &mut broadcast::Receiver<Arc<WatchEvent>>) {
    while !matches!(
        rx.try_recv(),
        Err(broadcast::error::TryRecvError::Empty | broadcast::error::TryRecvError::Closed)
    ) {}
}

fn check_type(def: &ResourceDef, obj: &Value) -> ApiResult<()> {
    if !obj.is_object() {
        return Err(ApiError::bad_request(
            "the body of the request must be a JSON or YAML object",
        ));
    }
    if let Some(av) = obj
        .get("apiVersion")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
    {
        if av != def.api_version() {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({av}) does not match the expected API version ({})",
                def.api_version()
            )));
        }
    }
    if let Some(k) = obj
        .get("kind")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
    {
        if k != def.kind {
            return Err(ApiError::bad_request(format!(
                "the kind in the data ({k}) does not match the expected kind ({})",
                def.kind
            )));
        }
    }
    Ok(())
}

/// Server-side defaults and status resets on create, as the apiserver's strategies do.
fn apply_create_defaults(res: usize, o: &mut Map<String, Value>) {
    match res {
        PODS => {
            o.insert(
                "status".into(),
                json!({"phase": "Pending", "qosClass": "BestEffort"}),
            );
            let spec = o.entry("spec").or_insert_with(|| json!({}));
            if let Some(s) = spec.as_object_mut() {
                for (k, v) in [
                    ("restartPolicy", json!("Always")),
                    ("schedulerName", json!("default-scheduler")),
                    ("terminationGracePeriodSeconds", json!(30)),
                    ("dnsPolicy", json!("ClusterFirst")),
                ] {
                    s.entry(k).or_insert(v);
                }
            }
        }
        NAMESPACES => {
            o.insert("status".into(), json!({"phase": "Active"}));
        }
        PDBS => {
            o.insert("status".into(), json!({"disruptionsAllowed": 0, "currentHealthy": 0, "desiredHealthy": 0, "expectedPods": 0}));
        }
        NODES => {}
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::CONFIGMAPS;

    #[test]
    fn json_lists_match_value_lists() {
        let mut s = Store::new(100);
        for i in 0..5 {
            let cm = json!({"metadata": {"name": format!("c{i}"), "labels": {"n": i.to_string()}}, "data": {"k": "v"}});
            s.create(CONFIGMAPS, "default", cm, false).unwrap();
        }
        for opts in [
            ListOptions::default(),
            ListOptions {
                limit: Some(2),
                ..Default::default()
            },
            ListOptions {
                labels: LabelSelector::parse("n in (1,3)").unwrap(),
                ..Default::default()
            },
            ListOptions {
                labels: LabelSelector::parse("n=9").unwrap(),
                ..Default::default()
            },
        ] {
            let want = s.list(CONFIGMAPS, Some("default"), &opts).unwrap();
            let got: Value = serde_json::from_slice(
                &s.list_json(CONFIGMAPS, Some("default"), &opts)
                    .unwrap()
                    .to_bytes(),
            )
            .unwrap();
            assert_eq!(got, want);
        }
    }
}
