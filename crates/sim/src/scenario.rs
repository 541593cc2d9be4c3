//! Scenario files (`simulations/scenarios/*.yaml`): a policy, a catalog, a workload of jobs and
//! HPA-scaled services, and cloud events. See `docs/simulation.md` for the format.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{json, Value};

use gpu_node_autoscaler_provider::CapacityType;

use crate::convert::Converter;
use crate::policy::duration::parse_duration;
use crate::policy::source_map::{display_path, path_from_serde, PathSeg, SourceMap};
use crate::policy::{parse_policy_at, Policy};
use crate::yaml::{self, YamlError};

use super::{CloudEvent, ClusterTiming, Ms, WorkloadPod, MINUTE};

/// The scenario `gpu-node-autoscaler simulate` runs without arguments.
pub const DEFAULT_NAME: &str = "arena-mpi-training.yaml";
pub const DEFAULT: &str = include_str!("../../../simulations/scenarios/arena-mpi-training.yaml");

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawScenario {
    name: String,
    #[serde(default)]
    description: String,
    #[serde(default)]
    seed: u64,
    until: Option<String>,
    #[serde(default)]
    timing: RawTiming,
    /// `builtin` (default) or a catalog CSV path relative to the scenario file.
    catalog: Option<String>,
    /// Decoded separately, with positions in this file.
    #[allow(dead_code)]
    policy: Value,
    #[serde(default)]
    jobs: Vec<RawJob>,
    #[serde(default)]
    services: Vec<RawService>,
    #[serde(default)]
    events: Vec<RawEvent>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawTiming {
    boot_min: Option<String>,
    boot_max: Option<String>,
    device_plugin_delay: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawJob {
    name: String,
    arrival: String,
    #[serde(default)]
    repeat: Option<RawRepeat>,
    duration: String,
    #[serde(default)]
    gang: bool,
    #[serde(default)]
    priority: i32,
    pods: Vec<RawPodGroup>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRepeat {
    count: u32,
    every: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawPodGroup {
    name: String,
    #[serde(default = "one")]
    replicas: u32,
    requests: BTreeMap<String, Value>,
    #[serde(default)]
    node_selector: BTreeMap<String, String>,
    #[serde(default)]
    tolerations: Vec<Value>,
    #[serde(default)]
    affinity: Option<Value>,
}

fn one() -> u32 {
    1
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawService {
    name: String,
    requests: BTreeMap<String, Value>,
    #[serde(default)]
    node_selector: BTreeMap<String, String>,
    #[serde(default)]
    tolerations: Vec<Value>,
    hpa: RawHpa,
    /// GPUs of demand over time (steps).
    load: Vec<RawLoad>,
    until: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawHpa {
    min_replicas: u32,
    max_replicas: u32,
    /// Target GPU utilisation of a replica, in (0, 1].
    target_utilization: f64,
    /// GPU demand one replica serves at 100 % utilisation.
    gpus_per_replica: f64,
    /// HPA sync period (default 1m) and scale-down stabilisation window (default 5m).
    sync: Option<String>,
    scale_down_stabilization: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLoad {
    at: String,
    gpus: f64,
}

/// One event: exactly one of the fields.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawEvent {
    insufficient_capacity: Option<RawIce>,
    spot_interruption: Option<RawSpot>,
    gpu_failure: Option<RawGpuFailure>,
    quota: Option<RawQuota>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawGpuFailure {
    at: String,
    fraction: f64,
    pool: Option<String>,
    xid: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawIce {
    from: String,
    until: String,
    zone: Option<String>,
    capacity_type: Option<String>,
    #[serde(default)]
    instance_types: Vec<String>,
    max_instances: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawSpot {
    at: String,
    fraction: f64,
    pool: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawQuota {
    at: String,
    max_instances: Option<u32>,
    max_gpus: Option<u32>,
}

/// A parsed scenario, ready to run.
pub struct Scenario {
    pub name: String,
    pub description: String,
    pub seed: u64,
    pub until: Option<Ms>,
    pub timing: ClusterTiming,
    /// `None` for the built-in catalog, else a path relative to the scenario file.
    pub catalog: Option<String>,
    pub policy: Policy,
    pub pods: Vec<WorkloadPod>,
    pub events: Vec<CloudEvent>,
}

struct Errs<'a> {
    file: &'a str,
    map: &'a SourceMap,
    out: Vec<String>,
}

impl Errs<'_> {
    fn at(&mut self, path: &[PathSeg], msg: impl std::fmt::Display) {
        let loc = self.map.locate_nearest(path);
        let p = display_path(path);
        self.out.push(format!(
            "{}:{}:{}: {p}: {msg}",
            self.file, loc.line, loc.col
        ));
    }

    fn dur(&mut self, path: &[PathSeg], s: &str) -> Ms {
        match parse_duration(s) {
            Ok(d) => d.as_millis() as Ms,
            Err(e) => {
                self.at(path, e);
                0
            }
        }
    }
}

fn k(s: &str) -> PathSeg {
    PathSeg::Key(s.to_string())
}

fn i(n: usize) -> PathSeg {
    PathSeg::Index(n)
}

fn path(parts: &[PathSeg]) -> Vec<PathSeg> {
    parts.to_vec()
}

/// Builds a pod through the same conversion the controller uses for API objects.
#[allow(clippy::too_many_arguments)]
fn make_pod(
    conv: &mut Converter,
    name: &str,
    requests: &BTreeMap<String, Value>,
    node_selector: &BTreeMap<String, String>,
    tolerations: &[Value],
    affinity: Option<&Value>,
    gang: Option<(&str, usize)>,
    priority: i32,
) -> Result<crate::model::Pod, String> {
    let mut annotations = serde_json::Map::new();
    if let Some((g, n)) = gang {
        annotations.insert("gpu-node-autoscaler.io/gang".into(), json!(g));
        annotations.insert(
            "gpu-node-autoscaler.io/gang-min-member".into(),
            json!(n.to_string()),
        );
    }
    let reqs: serde_json::Map<String, Value> = requests
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let mut spec = json!({
        "containers": [{"name": "main", "resources": {"requests": reqs}}],
        "nodeSelector": node_selector,
        "tolerations": tolerations,
        "priority": priority,
    });
    if let Some(a) = affinity {
        spec["affinity"] = a.clone();
    }
    let obj = json!({
        "metadata": {
            "name": name, "namespace": "sim", "annotations": annotations,
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": name, "controller": true}],
        },
        "spec": spec,
        "status": {"phase": "Pending"},
    });
    let pod = conv.pod(obj)?;
    match &pod.problem {
        Some(p) => Err(p.clone()),
        None => Ok(pod),
    }
}

/// Parses a scenario. Errors name the file, line, column and field; every error found is listed.
pub fn parse_scenario(text: &str, file: &str) -> Result<Scenario, String> {
    let invalid =
        |e: YamlError| format!("{file}:{}:{}: invalid YAML: {}", e.line, e.col, e.message);
    let map = SourceMap::parse(text).map_err(invalid)?;
    let doc = yaml::parse(text).map_err(invalid)?;
    let mut errs = Errs {
        file,
        map: &map,
        out: Vec::new(),
    };
    let raw: RawScenario = match serde_path_to_error::deserialize(doc) {
        Ok(r) => r,
        Err(e) => {
            let p = path_from_serde(e.path());
            errs.at(&p, e.inner().to_string());
            return Err(errs.out.join("\n"));
        }
    };
    let policy = match parse_policy_at(text, file, &[k("policy")]) {
        Ok(p) => Some(p),
        Err(e) => {
            errs.out.push(e.to_string());
            None
        }
    };
    let timing = ClusterTiming {
        boot_min: raw
            .timing
            .boot_min
            .as_deref()
            .map_or(ClusterTiming::default().boot_min, |s| {
                errs.dur(&path(&[k("timing"), k("bootMin")]), s)
            }),
        boot_max: raw
            .timing
            .boot_max
            .as_deref()
            .map_or(ClusterTiming::default().boot_max, |s| {
                errs.dur(&path(&[k("timing"), k("bootMax")]), s)
            }),
        device_plugin_delay: raw
            .timing
            .device_plugin_delay
            .as_deref()
            .map_or(ClusterTiming::default().device_plugin_delay, |s| {
                errs.dur(&path(&[k("timing"), k("devicePluginDelay")]), s)
            }),
    };
    if timing.boot_min > timing.boot_max {
        errs.at(
            &[k("timing"), k("bootMin")],
            "bootMin must not exceed bootMax",
        );
    }
    let until = raw.until.as_deref().map(|s| errs.dur(&[k("until")], s));
    let mut conv = Converter::new();
    let mut pods = Vec::new();
    for (ji, j) in raw.jobs.iter().enumerate() {
        let at = |f: &str| path(&[k("jobs"), i(ji), k(f)]);
        let arrival = errs.dur(&at("arrival"), &j.arrival);
        let duration = errs.dur(&at("duration"), &j.duration);
        if duration <= 0 {
            errs.at(&at("duration"), "must be positive");
        }
        let (count, every) = match &j.repeat {
            Some(r) => (
                r.count,
                errs.dur(
                    &path(&[k("jobs"), i(ji), k("repeat"), k("every")]),
                    &r.every,
                ),
            ),
            None => (1, 0),
        };
        if j.pods.is_empty() {
            errs.at(&at("pods"), "a job needs at least one pod group");
        }
        let size: usize = j.pods.iter().map(|g| g.replicas as usize).sum();
        for n in 0..count {
            let instance = if count > 1 {
                format!("{}-{n}", j.name)
            } else {
                j.name.clone()
            };
            for (gi, g) in j.pods.iter().enumerate() {
                for r in 0..g.replicas {
                    let name = format!("{instance}-{}-{r}", g.name);
                    match make_pod(
                        &mut conv,
                        &name,
                        &g.requests,
                        &g.node_selector,
                        &g.tolerations,
                        g.affinity.as_ref(),
                        j.gang.then_some((instance.as_str(), size)),
                        j.priority,
                    ) {
                        Ok(pod) => pods.push(WorkloadPod {
                            pod,
                            arrival: arrival + n as Ms * every,
                            duration: Some(duration),
                            deleted_at: None,
                        }),
                        Err(e) => {
                            errs.at(
                                &path(&[k("jobs"), i(ji), k("pods"), i(gi), k("requests")]),
                                e,
                            );
                            break;
                        }
                    }
                }
            }
        }
    }
    for (si, s) in raw.services.iter().enumerate() {
        let at = |f: &str| path(&[k("services"), i(si), k(f)]);
        let h = &s.hpa;
        if !(h.target_utilization > 0.0 && h.target_utilization <= 1.0) {
            errs.at(
                &[k("services"), i(si), k("hpa"), k("targetUtilization")],
                "must be in (0, 1]",
            );
            continue;
        }
        if h.min_replicas > h.max_replicas || h.max_replicas == 0 {
            errs.at(
                &[k("services"), i(si), k("hpa"), k("minReplicas")],
                "need 0 < minReplicas <= maxReplicas",
            );
            continue;
        }
        if !(h.gpus_per_replica.is_finite() && h.gpus_per_replica > 0.0) {
            errs.at(
                &[k("services"), i(si), k("hpa"), k("gpusPerReplica")],
                "must be a positive number",
            );
            continue;
        }
        let sync = h
            .sync
            .as_deref()
            .map_or(MINUTE, |x| {
                errs.dur(&[k("services"), i(si), k("hpa"), k("sync")], x)
            })
            .max(1000);
        let stab = h
            .scale_down_stabilization
            .as_deref()
            .map_or(5 * MINUTE, |x| {
                errs.dur(
                    &[k("services"), i(si), k("hpa"), k("scaleDownStabilization")],
                    x,
                )
            });
        let end = errs.dur(&at("until"), &s.until);
        let mut load: Vec<(Ms, f64)> = Vec::new();
        for (li, l) in s.load.iter().enumerate() {
            load.push((
                errs.dur(
                    &path(&[k("services"), i(si), k("load"), i(li), k("at")]),
                    &l.at,
                ),
                l.gpus,
            ));
        }
        load.sort_by_key(|x| x.0);
        if load.is_empty() {
            errs.at(&at("load"), "needs at least one point");
            continue;
        }
        let template = match make_pod(
            &mut conv,
            &s.name,
            &s.requests,
            &s.node_selector,
            &s.tolerations,
            None,
            None,
            0,
        ) {
            Ok(p) => p,
            Err(e) => {
                errs.at(&at("requests"), e);
                continue;
            }
        };
        // The HPA: desired = ceil(load / (gpusPerReplica × target)), clamped; scale-in only to
        // the highest recommendation of the stabilisation window.
        let mut desired_at: Vec<(Ms, u32)> = Vec::new();
        let mut t = load[0].0;
        while t < end {
            let demand = load
                .iter()
                .take_while(|(a, _)| *a <= t)
                .last()
                .map_or(0.0, |x| x.1);
            let want = (demand / (h.gpus_per_replica * h.target_utilization))
                .ceil()
                .max(0.0) as u32;
            desired_at.push((t, want.clamp(h.min_replicas, h.max_replicas)));
            t += sync;
        }
        let mut replicas: Vec<(Ms, u32)> = Vec::new();
        for (idx, &(t, want)) in desired_at.iter().enumerate() {
            let window_max = desired_at[..=idx]
                .iter()
                .rev()
                .take_while(|(x, _)| t - *x <= stab)
                .map(|x| x.1)
                .max()
                .unwrap_or(want);
            let cur = replicas.last().map_or(0, |x| x.1);
            let next = if want >= cur {
                want
            } else {
                window_max.min(cur)
            };
            if replicas.last().is_none_or(|x| x.1 != next) {
                replicas.push((t, next));
            }
        }
        // Replica r lives while the count exceeds r.
        let max = replicas.iter().map(|x| x.1).max().unwrap_or(0);
        for r in 0..max {
            let mut start: Option<Ms> = None;
            let mut serial = 0;
            for (idx, &(t, n)) in replicas.iter().enumerate() {
                let alive = n > r;
                match (alive, start) {
                    (true, None) => start = Some(t),
                    (false, Some(st)) => {
                        push_replica(&mut pods, &template, &s.name, r, serial, st, t);
                        serial += 1;
                        start = None;
                    }
                    _ => {}
                }
                if idx + 1 == replicas.len() {
                    if let Some(st) = start.take() {
                        push_replica(&mut pods, &template, &s.name, r, serial, st, end);
                    }
                }
            }
        }
    }
    let mut events = Vec::new();
    for (ei, e) in raw.events.iter().enumerate() {
        let set = [
            e.insufficient_capacity.is_some(),
            e.spot_interruption.is_some(),
            e.gpu_failure.is_some(),
            e.quota.is_some(),
        ];
        if set.iter().filter(|x| **x).count() != 1 {
            errs.at(
                &path(&[k("events"), i(ei)]),
                "an event is exactly one of insufficientCapacity, spotInterruption, gpuFailure, \
                 quota",
            );
            continue;
        }
        if let Some(ice) = &e.insufficient_capacity {
            let ct = match ice.capacity_type.as_deref() {
                None => None,
                Some(c) => match CapacityType::parse(c) {
                    Some(c) => Some(c),
                    None => {
                        errs.at(
                            &path(&[
                                k("events"),
                                i(ei),
                                k("insufficientCapacity"),
                                k("capacityType"),
                            ]),
                            format!("unknown capacity type {c:?} (expected spot or on-demand)"),
                        );
                        None
                    }
                },
            };
            let p = |f: &str| path(&[k("events"), i(ei), k("insufficientCapacity"), k(f)]);
            events.push(CloudEvent::InsufficientCapacity {
                at: errs.dur(&p("from"), &ice.from),
                until: errs.dur(&p("until"), &ice.until),
                zone: ice.zone.clone(),
                capacity_type: ct,
                instance_types: ice.instance_types.clone(),
                max_instances: ice.max_instances,
            });
        }
        if let Some(sp) = &e.spot_interruption {
            let p = |f: &str| path(&[k("events"), i(ei), k("spotInterruption"), k(f)]);
            if !(sp.fraction > 0.0 && sp.fraction <= 1.0) {
                errs.at(&p("fraction"), "fraction must be in (0, 1]");
            }
            events.push(CloudEvent::SpotInterruption {
                at: errs.dur(&p("at"), &sp.at),
                fraction: sp.fraction,
                pool: sp.pool.clone(),
            });
        }
        if let Some(g) = &e.gpu_failure {
            let p = |f: &str| path(&[k("events"), i(ei), k("gpuFailure"), k(f)]);
            if !(g.fraction > 0.0 && g.fraction <= 1.0) {
                errs.at(&p("fraction"), "fraction must be in (0, 1]");
            }
            if g.xid == Some(0) {
                errs.at(
                    &p("xid"),
                    "an XID is a positive number (79: fallen off the bus)",
                );
            }
            events.push(CloudEvent::GpuFailure {
                at: errs.dur(&p("at"), &g.at),
                fraction: g.fraction,
                pool: g.pool.clone(),
                xid: g.xid.unwrap_or(79),
            });
        }
        if let Some(q) = &e.quota {
            events.push(CloudEvent::Quota {
                at: errs.dur(&path(&[k("events"), i(ei), k("quota"), k("at")]), &q.at),
                max_instances: q.max_instances,
                max_gpus: q.max_gpus,
            });
        }
    }
    if pods.is_empty() && errs.out.is_empty() {
        errs.at(&[], "the scenario has no jobs or services");
    }
    match (policy, errs.out.is_empty()) {
        (Some(policy), true) => Ok(Scenario {
            name: raw.name,
            description: raw.description,
            seed: raw.seed,
            until,
            timing,
            catalog: raw.catalog.filter(|c| c != "builtin"),
            policy,
            pods,
            events,
        }),
        _ => Err(errs.out.join("\n")),
    }
}

fn push_replica(
    pods: &mut Vec<WorkloadPod>,
    template: &crate::model::Pod,
    service: &str,
    r: u32,
    serial: u32,
    from: Ms,
    to: Ms,
) {
    let mut pod = template.clone();
    pod.id.name = format!("{service}-{r}-{serial}");
    pod.uid = pod.id.name.clone();
    pod.owner = Some(crate::model::Owner {
        kind: crate::model::OwnerKind::ReplicaSet,
        name: service.to_string(),
        uid: service.to_string(),
    });
    pods.push(WorkloadPod {
        pod,
        arrival: from,
        duration: None,
        deleted_at: Some(to),
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_scenario_parses() {
        let s = parse_scenario(DEFAULT, DEFAULT_NAME).unwrap();
        assert!(!s.pods.is_empty());
        assert!(s.pods.iter().any(|p| p.pod.gang.is_some()));
    }

    #[test]
    fn errors_name_file_line_and_field() {
        let text = "name: x\npolicy:\n  zones: [a]\n  pools:\n    - name: p\n      instanceTypes: [g5.xlarge]\n      maxNodes: 1\n      minNodes: 3\njobs:\n  - name: j\n    arrival: 5q\n    duration: 1h\n    pods:\n      - name: w\n        requests: {nvidia.com/gpu: abc}\n";
        let e = parse_scenario(text, "s.yaml").err().unwrap();
        assert!(
            e.contains(
                "s.yaml:8:7: policy.pools[0].minNodes: minNodes (3) is greater than maxNodes (1)"
            ),
            "{e}"
        );
        assert!(
            e.contains("s.yaml:11:5: jobs[0].arrival: invalid duration \"5q\""),
            "{e}"
        );
        assert!(e.contains("s.yaml:15:9: jobs[0].pods[0].requests:"), "{e}");
        let e = parse_scenario("name: x\npolicy: {}\nbogus: 1\n", "t.yaml")
            .err()
            .unwrap();
        assert!(
            e.starts_with("t.yaml:3:1: bogus: unknown field `bogus`"),
            "{e}"
        );
    }

    #[test]
    fn hpa_replicas_follow_the_load_with_stabilised_scale_in() {
        let text = "name: x\npolicy:\n  zones: [a]\n  pools:\n    - {name: p, instanceTypes: [g5.xlarge], maxNodes: 9}\nservices:\n  - name: chat\n    requests: {nvidia.com/gpu: 1}\n    hpa: {minReplicas: 1, maxReplicas: 10, targetUtilization: 0.5, gpusPerReplica: 1}\n    load: [{at: 0s, gpus: 0.5}, {at: 10m, gpus: 2}, {at: 20m, gpus: 0.5}]\n    until: 40m\n";
        let s = parse_scenario(text, "h.yaml").unwrap();
        // 0.5 GPU → 1 replica; 2 GPUs at 50 % → 4 replicas from 10m; back to 1 only after the
        // 5-minute stabilisation window following 20m.
        let mut spans: Vec<(Ms, Option<Ms>)> =
            s.pods.iter().map(|p| (p.arrival, p.deleted_at)).collect();
        spans.sort();
        assert_eq!(spans[0], (0, Some(40 * MINUTE)));
        assert_eq!(spans.len(), 4);
        for sp in &spans[1..] {
            assert_eq!(*sp, (10 * MINUTE, Some(25 * MINUTE)));
        }
    }
}
