//! The simulated kubelets (one loop stands in for the kubelet of every node).
//!
//! - A pod bound to an existing node turns `Running` (Initialized, ContainersReady and Ready
//!   conditions, container statuses, `startTime`, `podIP`, `hostIP`) `pod_start_delay` after the
//!   kubelet first saw it bound.
//! - A Running pod annotated [`RUN_DURATION_ANNOTATION`] turns `Succeeded` that long after its
//!   `startTime`.
//! - A node without a `Ready` condition gets `Ready=True` (the kubelet registering its status);
//!   every `heartbeat` the Ready condition's `lastHeartbeatTime` is refreshed (its status,
//!   reason and message are kept, so a client may mark a node NotReady).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::broadcast::error::RecvError;
use tokio::time::Instant;

use crate::resources::{NODES, PODS, RUN_DURATION_ANNOTATION};
use crate::server::App;
use crate::store::{now_timestamp, EventType, Store, WatchEvent};
use gpu_node_autoscaler_core::policy::duration::parse_duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Action {
    Start,
    Finish,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Timer {
    at: Instant,
    action: Action,
    ns: String,
    name: String,
    uid: String,
}

fn str_at<'a>(v: &'a Value, ptr: &str) -> &'a str {
    v.pointer(ptr).and_then(Value::as_str).unwrap_or("")
}

struct Kubelet {
    pod_start_delay: Duration,
    timers: BinaryHeap<Reverse<Timer>>,
    /// Pods (by uid) with a timer set, so that each gets one.
    armed: HashSet<(String, Action)>,
    /// Pods bound to a node that does not exist (yet), by node name: (ns, name).
    waiting: HashMap<String, HashSet<(String, String)>>,
    next_ip: u32,
}

impl Kubelet {
    fn arm(&mut self, at: Instant, action: Action, pod: &Value) {
        let uid = str_at(pod, "/metadata/uid").to_string();
        if self.armed.insert((uid.clone(), action)) {
            self.timers.push(Reverse(Timer {
                at,
                action,
                ns: str_at(pod, "/metadata/namespace").to_string(),
                name: str_at(pod, "/metadata/name").to_string(),
                uid,
            }));
        }
    }

    /// Looks at one pod's current state and arms what it needs.
    fn observe_pod(&mut self, store: &Store, pod: &Value) {
        if pod.pointer("/metadata/deletionTimestamp").is_some() {
            return;
        }
        let node = str_at(pod, "/spec/nodeName");
        match str_at(pod, "/status/phase") {
            "Pending" | "" if !node.is_empty() => {
                if store.contains(NODES, "", node) {
                    self.arm(Instant::now() + self.pod_start_delay, Action::Start, pod);
                } else {
                    self.waiting.entry(node.to_string()).or_default().insert((
                        str_at(pod, "/metadata/namespace").to_string(),
                        str_at(pod, "/metadata/name").to_string(),
                    ));
                }
            }
            "Running" => {
                let Some(run) = pod
                    .pointer("/metadata/annotations")
                    .and_then(|a| a.get(RUN_DURATION_ANNOTATION))
                    .and_then(Value::as_str)
                    .and_then(|d| parse_duration(d).ok())
                else {
                    return;
                };
                let started =
                    chrono::DateTime::parse_from_rfc3339(str_at(pod, "/status/startTime"))
                        .map(|t| t.with_timezone(&chrono::Utc))
                        .unwrap_or_else(|_| chrono::Utc::now());
                let elapsed = (chrono::Utc::now() - started).to_std().unwrap_or_default();
                self.arm(
                    Instant::now() + run.saturating_sub(elapsed),
                    Action::Finish,
                    pod,
                );
            }
            _ => {}
        }
    }

    fn observe(&mut self, store: &mut Store, ev: &WatchEvent) {
        match (ev.res, ev.kind) {
            (PODS, EventType::Deleted) => {
                let uid = str_at(&ev.object, "/metadata/uid").to_string();
                self.armed.remove(&(uid.clone(), Action::Start));
                self.armed.remove(&(uid, Action::Finish));
            }
            (PODS, _) => self.observe_pod(store, &ev.object),
            (NODES, EventType::Deleted) => {}
            (NODES, _) => {
                register_ready(store, &ev.object);
                let name = str_at(&ev.object, "/metadata/name");
                for (ns, pod) in self.waiting.remove(name).unwrap_or_default() {
                    if let Ok(p) = store.get(PODS, &ns, &pod) {
                        self.observe_pod(store, &p);
                    }
                }
            }
            _ => {}
        }
    }

    fn rescan(&mut self, store: &mut Store) {
        self.waiting.clear();
        let nodes: Vec<Value> = store.iter(NODES).cloned().collect();
        for n in &nodes {
            register_ready(store, n);
        }
        let pods: Vec<Value> = store.iter(PODS).cloned().collect();
        for p in &pods {
            self.observe_pod(store, p);
        }
    }

    fn fire(&mut self, store: &mut Store, t: Timer) {
        self.armed.remove(&(t.uid.clone(), t.action));
        let Ok(pod) = store.get(PODS, &t.ns, &t.name) else {
            return;
        };
        if str_at(&pod, "/metadata/uid") != t.uid {
            return;
        }
        let next = match t.action {
            Action::Start => {
                let node_name = str_at(&pod, "/spec/nodeName");
                let Ok(node) = store.get(NODES, "", node_name) else {
                    return;
                };
                if !matches!(str_at(&pod, "/status/phase"), "Pending" | "") {
                    return;
                }
                self.next_ip = self.next_ip.wrapping_add(1);
                let ip = format!(
                    "10.244.{}.{}",
                    (self.next_ip >> 8) & 0xff,
                    self.next_ip & 0xff
                );
                running(&pod, &node, &ip)
            }
            Action::Finish => {
                if str_at(&pod, "/status/phase") != "Running" {
                    return;
                }
                succeeded(&pod)
            }
        };
        let (ns, name) = (t.ns, t.name);
        if let Ok(updated) = store.update(PODS, &ns, &name, next, true, false) {
            self.observe_pod(store, &updated);
        }
    }
}

fn condition(kind: &str, status: bool, now: &str) -> Value {
    json!({"type": kind, "status": if status { "True" } else { "False" },
        "lastProbeTime": null, "lastTransitionTime": now})
}

fn containers(pod: &Value) -> impl Iterator<Item = &Value> {
    pod.pointer("/spec/containers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
}

fn container_status(c: &Value, state: Value, ready: bool) -> Value {
    let name = str_at(c, "/name");
    json!({"name": name, "image": str_at(c, "/image"), "imageID": "",
        "containerID": format!("containerd://kube-sim-{name}"), "ready": ready,
        "started": ready, "restartCount": 0, "state": state})
}

/// The status a kubelet reports once every container of `pod` runs on `node`.
fn running(pod: &Value, node: &Value, ip: &str) -> Value {
    let now = now_timestamp();
    let mut next = pod.clone();
    let scheduled = pod
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|cs| cs.iter().find(|c| c["type"] == "PodScheduled").cloned())
        .unwrap_or_else(|| condition("PodScheduled", true, &now));
    let host_ip = node
        .pointer("/status/addresses")
        .and_then(Value::as_array)
        .and_then(|a| a.iter().find(|x| x["type"] == "InternalIP"))
        .and_then(|x| x["address"].as_str())
        .unwrap_or("10.0.0.1");
    let statuses: Vec<Value> = containers(pod)
        .map(|c| container_status(c, json!({"running": {"startedAt": now}}), true))
        .collect();
    let s = &mut next["status"];
    s["phase"] = json!("Running");
    s["conditions"] = json!([
        condition("Initialized", true, &now),
        condition("Ready", true, &now),
        condition("ContainersReady", true, &now),
        scheduled
    ]);
    s["containerStatuses"] = json!(statuses);
    s["startTime"] = json!(now);
    s["podIP"] = json!(ip);
    s["podIPs"] = json!([{"ip": ip}]);
    s["hostIP"] = json!(host_ip);
    s["hostIPs"] = json!([{"ip": host_ip}]);
    next
}

/// The status of a pod whose containers all exited 0.
fn succeeded(pod: &Value) -> Value {
    let now = now_timestamp();
    let mut next = pod.clone();
    let started = str_at(pod, "/status/startTime").to_string();
    let statuses: Vec<Value> = containers(pod)
        .map(|c| {
            container_status(
                c,
                json!({"terminated": {"exitCode": 0, "reason": "Completed",
                    "startedAt": started, "finishedAt": now}}),
                false,
            )
        })
        .collect();
    let s = &mut next["status"];
    s["phase"] = json!("Succeeded");
    if let Some(conds) = s["conditions"].as_array_mut() {
        for c in conds.iter_mut() {
            if c["type"] == "Ready" || c["type"] == "ContainersReady" {
                c["status"] = json!("False");
                c["reason"] = json!("PodCompleted");
                c["lastTransitionTime"] = json!(now);
            }
        }
    }
    s["containerStatuses"] = json!(statuses);
    next
}

fn ready_condition(now: &str) -> Value {
    json!({"type": "Ready", "status": "True", "reason": "KubeletReady",
        "message": "kubelet is posting ready status", "lastHeartbeatTime": now,
        "lastTransitionTime": now})
}

/// Adds `Ready=True` to a node that has no Ready condition.
fn register_ready(store: &mut Store, node: &Value) {
    let conds = node.pointer("/status/conditions").and_then(Value::as_array);
    if conds.is_some_and(|cs| cs.iter().any(|c| c["type"] == "Ready")) {
        return;
    }
    let mut next = node.clone();
    let mut list = conds.cloned().unwrap_or_default();
    list.push(ready_condition(&now_timestamp()));
    if !next.get("status").is_some_and(Value::is_object) {
        next["status"] = json!({});
    }
    next["status"]["conditions"] = json!(list);
    let name = str_at(node, "/metadata/name").to_string();
    let _ = store.update(NODES, "", &name, next, true, false);
}

/// Refreshes every node's Ready `lastHeartbeatTime`.
fn heartbeat(store: &mut Store) {
    let now = now_timestamp();
    let nodes: Vec<Value> = store.iter(NODES).cloned().collect();
    for node in nodes {
        let mut next = node.clone();
        let Some(conds) = next
            .pointer_mut("/status/conditions")
            .and_then(Value::as_array_mut)
        else {
            continue;
        };
        let Some(ready) = conds.iter_mut().find(|c| c["type"] == "Ready") else {
            continue;
        };
        ready["lastHeartbeatTime"] = json!(now);
        let name = str_at(&node, "/metadata/name").to_string();
        let _ = store.update(NODES, "", &name, next, true, false);
    }
}

/// Runs the kubelets until the server goes away.
pub async fn run(app: Arc<App>, pod_start_delay: Duration, heartbeat_every: Duration) {
    let mut rx = app.store().subscribe();
    let mut k = Kubelet {
        pod_start_delay,
        timers: BinaryHeap::new(),
        armed: HashSet::new(),
        waiting: HashMap::new(),
        next_ip: 1,
    };
    k.rescan(&mut app.store());
    let mut beat = tokio::time::interval(heartbeat_every.max(Duration::from_millis(100)));
    beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    beat.tick().await;
    loop {
        let sleep = crate::store::sleep_until(k.timers.peek().map(|t| t.0.at));
        tokio::select! {
            ev = rx.recv() => match ev {
                Ok(ev) => k.observe(&mut app.store(), &ev),
                Err(RecvError::Lagged(_)) => k.rescan(&mut app.store()),
                Err(RecvError::Closed) => return,
            },
            _ = sleep => {
                let mut store = app.store();
                while k.timers.peek().is_some_and(|t| t.0.at <= Instant::now()) {
                    let t = k.timers.pop().expect("peeked").0;
                    k.fire(&mut store, t);
                }
            }
            _ = beat.tick() => heartbeat(&mut app.store()),
        }
    }
}
