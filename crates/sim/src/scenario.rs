//! Scenario files (`simulations/scenarios/*.yaml`): a policy, a catalog, a workload of jobs and
//! HPA-scaled services, and cloud events. See `docs/simulation.md` for the format.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{json, Value};

use gpu_node_autoscaler_aws::groups::Group;
use gpu_node_autoscaler_provider::CapacityType;

use gpu_node_autoscaler_core::convert::Converter;
use gpu_node_autoscaler_core::dra::Selectors;
use gpu_node_autoscaler_core::model::dra::{
    DeviceClass, DraObjects, NVIDIA_GPU_CLASS, NVIDIA_GPU_DRIVER, NVIDIA_MIG_CLASS,
};
use gpu_node_autoscaler_core::policy::duration::parse_duration;
use gpu_node_autoscaler_core::policy::source_map::{
    display_path, path_from_serde, PathSeg, SourceMap,
};
use gpu_node_autoscaler_core::policy::{parse_policy_at_with, Policy};
use gpu_node_autoscaler_core::yaml::{self, YamlError};

use super::{CloudEvent, ClusterTiming, Ms, WorkloadPod, MINUTE, SECOND};

mod volumes;

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
    /// DeviceClasses besides (or replacing, by name) NVIDIA's two.
    #[serde(default)]
    device_classes: Vec<RawDeviceClass>,
    /// The account's capacity reservations (ODCRs and Capacity Blocks).
    #[serde(default)]
    reservations: Vec<RawReservation>,
    /// CapacityBuffers: spare chunks shaped as one replica of a service.
    #[serde(default)]
    buffers: Vec<RawBuffer>,
    /// The account's Auto Scaling groups, for pools backed by them (`aws.autoScalingGroups`).
    #[serde(default)]
    auto_scaling_groups: Vec<RawGroup>,
    /// StorageClasses the pods' claims and the static volumes name.
    #[serde(default)]
    storage_classes: Vec<volumes::RawStorageClass>,
    /// Static PersistentVolumes, each in one zone.
    #[serde(default)]
    persistent_volumes: Vec<volumes::RawPersistentVolume>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawGroup {
    name: String,
    instance_types: Vec<String>,
    zones: Vec<String>,
    /// `on-demand` (the default) or `spot`.
    capacity_type: Option<String>,
    #[serde(default)]
    min_size: u32,
    max_size: u32,
    #[serde(default)]
    desired_capacity: u32,
    #[serde(default)]
    tags: BTreeMap<String, String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawBuffer {
    /// The service whose replica is one chunk (the buffer's `scalableRef`).
    service: String,
    replicas: u32,
}

/// A job's `admission`: Kueue with a ProvisioningRequest admission check.
const ADMISSION_PROVISIONING_REQUEST: &str = "provisioningRequest";

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawReservation {
    id: String,
    /// `default` (an ODCR, the default) or `capacity-block`.
    #[serde(rename = "type")]
    kind: Option<String>,
    instance_type: String,
    zone: String,
    count: u32,
    start: Option<String>,
    end: Option<String>,
    price_per_hour: Option<f64>,
    #[serde(default)]
    tags: BTreeMap<String, String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDeviceClass {
    name: String,
    #[serde(default)]
    selectors: Vec<String>,
}

/// A ResourceClaim a pod gets from a template of its own (`spec.resourceClaims`).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawClaim {
    name: String,
    requests: Vec<RawDeviceRequest>,
}

/// A request: `exactly` (its fields given here) or `firstAvailable` (alternatives of the same
/// form, which do not nest).
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawDeviceRequest {
    name: String,
    device_class_name: Option<String>,
    count: Option<i64>,
    allocation_mode: Option<String>,
    #[serde(default)]
    selectors: Vec<String>,
    #[serde(default)]
    first_available: Vec<RawDeviceRequest>,
}

impl RawDeviceRequest {
    /// Has fields of an `exactly` request.
    fn is_exactly(&self) -> bool {
        self.device_class_name.is_some()
            || self.count.is_some()
            || self.allocation_mode.is_some()
            || !self.selectors.is_empty()
    }

    /// Its `exactly` fields as a Kubernetes `ExactDeviceRequest` (or `DeviceSubRequest`).
    fn exactly_json(&self) -> Value {
        let mut v = json!({
            "selectors": self.selectors.iter().map(|e| json!({"cel": {"expression": e}})).collect::<Vec<_>>(),
        });
        if let Some(c) = &self.device_class_name {
            v["deviceClassName"] = json!(c);
        }
        if let Some(n) = self.count {
            v["count"] = json!(n);
        }
        if let Some(m) = &self.allocation_mode {
            v["allocationMode"] = json!(m);
        }
        v
    }
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
    /// What owns the pods: `Job` (default: a batch Job, whose pods lose their work when moved
    /// unless they checkpoint) or `Deployment` (long-lived replicas, through a ReplicaSet,
    /// which an autoscaler may move like any such pod).
    kind: Option<String>,
    /// The pods' `gpu-node-autoscaler.io/expected-run-time` annotation: a duration, or
    /// `duration` for the job's own. Without it the pods carry none (as most pods of a real
    /// cluster): only the decision core reads it.
    expected_run_time: Option<String>,
    /// `provisioningRequest`: queued by Kueue behind a ProvisioningRequest admission check (each
    /// instance's pods are created once it is admitted).
    admission: Option<String>,
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
    #[serde(default)]
    claims: Vec<RawClaim>,
    /// How the pods place themselves against other pods, in the Pod's own words: their labels,
    /// `topologySpreadConstraints` and their container's `ports` (with `hostPort`).
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    topology_spread_constraints: Vec<Value>,
    #[serde(default)]
    ports: Vec<Value>,
    /// PersistentVolumeClaims: one the pods share, or one per replica (`volumes::RawPodVolume`).
    #[serde(default)]
    volumes: Vec<volumes::RawPodVolume>,
}

/// A pod group's labels, spread constraints, container ports and volumes ([`RawPodGroup`]).
#[derive(Default)]
struct Placement<'a> {
    labels: Option<&'a BTreeMap<String, String>>,
    topology_spread_constraints: &'a [Value],
    ports: &'a [Value],
    /// (volume name, PersistentVolumeClaim name).
    volumes: &'a [(String, String)],
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
    #[serde(default)]
    claims: Vec<RawClaim>,
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
    /// HPA sync period (default 15s, kube-controller-manager's
    /// `--horizontal-pod-autoscaler-sync-period`) and scale-down stabilisation window (default
    /// 5m, the HPA's).
    sync: Option<String>,
    scale_down_stabilization: Option<String>,
    /// The HPA's tolerance (default 0.1, `--horizontal-pod-autoscaler-tolerance`): no rescale
    /// while the usage ratio is within it of 1.
    tolerance: Option<f64>,
    /// How old the utilisation the HPA reads is (default 30s: dcgm-exporter's collect interval,
    /// then Prometheus's scrape; the adapter queries Prometheus live).
    metric_delay: Option<String>,
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
    drift: Option<RawDrift>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawDrift {
    at: String,
    pool: String,
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
    /// DeviceClasses by name: NVIDIA's and the scenario's.
    pub device_classes: BTreeMap<String, DeviceClass>,
    /// What a replay on a real cluster creates before the pods when they claim devices, as
    /// Kubernetes objects (`resource.k8s.io/v1`): the DeviceClasses, then every
    /// ResourceClaimTemplate, named as the pods' `resourceClaimTemplateName` and without a
    /// namespace. Empty when no pod claims devices.
    pub dra_objects: Vec<Value>,
    /// The account's capacity reservations, times on the run's clock.
    pub reservations: Vec<gpu_node_autoscaler_provider::Reservation>,
    /// The account's Auto Scaling groups and the pools they back (the policy's pools of groups
    /// already planned from their templates).
    pub groups: crate::groups::Groups,
    /// The HPA-scaled services as declared (their replicas, as the model scales them, are in
    /// `pods`): what a replay with a real HPA runs instead of those replicas.
    pub services: Vec<Service>,
    /// The Kueue-admitted jobs (their pods' indices in `pods`).
    pub kueue_jobs: Vec<super::KueueJob>,
    /// The services' replica pods, by service name (what a buffer's chunk is shaped as).
    pub service_templates: BTreeMap<String, gpu_node_autoscaler_core::model::Pod>,
    pub buffers: Vec<super::SimBuffer>,
    /// The PersistentVolumeClaims, PersistentVolumes and StorageClasses (the pods are joined
    /// with them already).
    pub storage: gpu_node_autoscaler_core::model::volumes::Storage,
    /// The same as Kubernetes objects, for a replay on a real cluster: the StorageClasses, the
    /// static PersistentVolumes (pre-bound to their claims), the claims (namespace `sim`).
    pub storage_objects: Vec<Value>,
}

/// An HPA-scaled service of a scenario, with the model's defaults filled in.
#[derive(Clone, Debug)]
pub struct Service {
    pub name: String,
    /// A replica as it is created (its name and owner are the model's first replica's).
    pub template: gpu_node_autoscaler_core::model::Pod,
    pub min_replicas: u32,
    pub max_replicas: u32,
    /// Target GPU utilisation of a replica, in (0, 1].
    pub target_utilization: f64,
    /// GPU demand one replica serves at 100 % utilisation.
    pub gpus_per_replica: f64,
    pub sync: Ms,
    pub scale_down_stabilization: Ms,
    pub tolerance: f64,
    pub metric_delay: Ms,
    /// GPUs of demand from each time on (steps, sorted).
    pub load: Vec<(Ms, f64)>,
    /// The service ends (every replica is deleted) at this time.
    pub until: Ms,
}

/// The providers a scenario's pools may name: the AWS provider's section checked as the
/// controller checks it (a pool of Auto Scaling groups takes its templates from the scenario's
/// groups), the others by name.
static PROVIDERS: [&dyn gpu_node_autoscaler_provider::policy::ProviderPolicy; 4] = [
    &gpu_node_autoscaler_aws::settings::POLICY,
    &gpu_node_autoscaler_provider::policy::NameOnly::with_section("alibaba", "alibaba"),
    &gpu_node_autoscaler_provider::policy::NameOnly::with_section("kwok", "kwok"),
    &gpu_node_autoscaler_provider::policy::NameOnly::new("memory"),
];

struct Errs<'a> {
    file: &'a str,
    map: &'a SourceMap,
    out: Vec<String>,
}

impl Errs<'_> {
    fn at(&mut self, path: &[PathSeg], msg: impl std::fmt::Display) {
        let loc = self.map.locate_nearest(path);
        let p = display_path(path);
        let e = format!("{}:{}:{}: {p}: {msg}", self.file, loc.line, loc.col);
        // Once (a pod group's claims are looked at for each of its replicas).
        if !self.out.contains(&e) {
            self.out.push(e);
        }
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

/// A pod's claims: its entry name → the ResourceClaimTemplate (`sim` namespace) it is made from.
type ClaimRefs = Vec<(String, String)>;

/// The DeviceClass NVIDIA's DRA driver installs for a device type (`gpu`, `mig`).
fn nvidia_class(name: &str, device_type: &str) -> Value {
    let expr = format!(
        "device.driver == '{NVIDIA_GPU_DRIVER}' && \
         device.attributes['{NVIDIA_GPU_DRIVER}'].type == '{device_type}'"
    );
    class_json(name, &[expr])
}

fn class_json(name: &str, selectors: &[String]) -> Value {
    json!({
        "metadata": {"name": name},
        "spec": {"selectors": selectors.iter().map(|e| json!({"cel": {"expression": e}})).collect::<Vec<_>>()},
    })
}

/// The DeviceClasses, the templates of the pods' claims and the CEL checks, while parsing.
struct ClaimContext {
    classes: BTreeMap<String, DeviceClass>,
    templates: DraObjects,
    selectors: Selectors,
    /// The DeviceClasses and templates as Kubernetes objects (see [`Scenario::dra_objects`]).
    class_objects: Vec<Value>,
    template_objects: Vec<Value>,
}

impl ClaimContext {
    /// NVIDIA's classes, then the scenario's (replacing one of the same name).
    fn new(conv: &mut Converter, raw: &[RawDeviceClass], errs: &mut Errs) -> ClaimContext {
        let mut c = ClaimContext {
            classes: BTreeMap::new(),
            templates: DraObjects::default(),
            selectors: Selectors::new(),
            class_objects: Vec::new(),
            template_objects: Vec::new(),
        };
        let nvidia = [
            nvidia_class(NVIDIA_GPU_CLASS, "gpu"),
            nvidia_class(NVIDIA_MIG_CLASS, "mig"),
        ];
        let given = raw.iter().map(|r| class_json(&r.name, &r.selectors));
        for (n, v) in nvidia
            .into_iter()
            .map(|v| (None, v))
            .chain(given.enumerate().map(|(n, v)| (Some(n), v)))
        {
            let at = |n: usize| path(&[k("deviceClasses"), i(n)]);
            let mut object = v.clone();
            match conv.device_class(v) {
                Ok(dc) => {
                    object["apiVersion"] = json!("resource.k8s.io/v1");
                    object["kind"] = json!("DeviceClass");
                    c.class_objects
                        .retain(|o| o["metadata"]["name"] != dc.name.as_str());
                    c.class_objects.push(object);
                    for (si, e) in dc.selectors.iter().enumerate() {
                        if let (Err(msg), Some(n)) = (c.selectors.check(e), n) {
                            errs.at(&[at(n), path(&[k("selectors"), i(si)])].concat(), msg);
                        }
                    }
                    c.classes.insert(dc.name.clone(), dc);
                }
                Err(e) => match n {
                    Some(n) => errs.at(&at(n), e),
                    None => unreachable!("NVIDIA's DeviceClasses convert: {e}"),
                },
            }
        }
        c
    }

    /// Checks the class and selectors of one way of satisfying a request.
    fn check_sub(
        &mut self,
        errs: &mut Errs,
        at: &[PathSeg],
        class: Option<&String>,
        selectors: &[String],
    ) {
        if let Some(class) = class.filter(|c| !self.classes.contains_key(*c)) {
            let known: Vec<&str> = self.classes.keys().map(String::as_str).collect();
            errs.at(
                &[at, &[k("deviceClassName")]].concat(),
                format!(
                    "DeviceClass {class:?} is not defined (defined: {})",
                    known.join(", ")
                ),
            );
        }
        for (si, e) in selectors.iter().enumerate() {
            if let Err(msg) = self.selectors.check(e) {
                errs.at(&[at, &[k("selectors"), i(si)]].concat(), msg);
            }
        }
    }

    /// Makes a ResourceClaimTemplate `<owner>-<claim>` for every claim of a pod type, through
    /// the core's conversion of the Kubernetes object; the pod's references to them.
    fn templates_of(
        &mut self,
        conv: &mut Converter,
        errs: &mut Errs,
        owner: &str,
        claims: &[RawClaim],
        at: &[PathSeg],
    ) -> ClaimRefs {
        let mut refs = Vec::new();
        for (ci, c) in claims.iter().enumerate() {
            let at_claim = [at, &[k("claims"), i(ci)]].concat();
            let mut requests = Vec::new();
            for (ri, r) in c.requests.iter().enumerate() {
                let at_req = [&at_claim[..], &[k("requests"), i(ri)]].concat();
                let mut v = json!({"name": r.name});
                if r.is_exactly() || r.first_available.is_empty() {
                    self.check_sub(errs, &at_req, r.device_class_name.as_ref(), &r.selectors);
                    v["exactly"] = r.exactly_json();
                }
                if !r.first_available.is_empty() {
                    let mut alts = Vec::new();
                    for (ai, a) in r.first_available.iter().enumerate() {
                        let at_alt = [&at_req[..], &[k("firstAvailable"), i(ai)]].concat();
                        if !a.first_available.is_empty() {
                            errs.at(
                                &[&at_alt[..], &[k("firstAvailable")]].concat(),
                                "firstAvailable alternatives do not nest",
                            );
                        }
                        self.check_sub(errs, &at_alt, a.device_class_name.as_ref(), &a.selectors);
                        let mut s = a.exactly_json();
                        s["name"] = json!(a.name);
                        alts.push(s);
                    }
                    v["firstAvailable"] = json!(alts);
                }
                requests.push(v);
            }
            let name = format!("{owner}-{}", c.name);
            let obj = json!({
                "metadata": {"name": name, "namespace": "sim"},
                "spec": {"spec": {"devices": {"requests": requests}}},
            });
            let object = json!({
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaimTemplate",
                "metadata": {"name": name},
                "spec": obj["spec"],
            });
            match conv.resource_claim_template(obj) {
                Ok((key, spec)) => {
                    self.templates.templates.insert(key, spec);
                    self.template_objects.push(object);
                    refs.push((c.name.clone(), name));
                }
                // The converter names the field of the Kubernetes object; here a request's
                // `exactly` fields stand in the request itself.
                Err(e) => errs.at(
                    &at_claim,
                    e.trim_start_matches("spec.devices.")
                        .replace(".exactly", ""),
                ),
            }
        }
        refs
    }
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
    placement: &Placement<'_>,
    gang: Option<(&str, usize)>,
    priority: i32,
    owner_kind: &str,
    claims: &ClaimRefs,
    dra: &DraObjects,
) -> Result<gpu_node_autoscaler_core::model::Pod, String> {
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
    if !placement.topology_spread_constraints.is_empty() {
        spec["topologySpreadConstraints"] = json!(placement.topology_spread_constraints);
    }
    if !placement.ports.is_empty() {
        spec["containers"][0]["ports"] = json!(placement.ports);
    }
    if !placement.volumes.is_empty() {
        spec["volumes"] = placement
            .volumes
            .iter()
            .map(|(v, c)| json!({"name": v, "persistentVolumeClaim": {"claimName": c}}))
            .collect();
    }
    if !claims.is_empty() {
        spec["resourceClaims"] = claims
            .iter()
            .map(|(entry, template)| json!({"name": entry, "resourceClaimTemplateName": template}))
            .collect();
        spec["containers"][0]["resources"]["claims"] = claims
            .iter()
            .map(|(entry, _)| json!({"name": entry}))
            .collect();
    }
    let obj = json!({
        "metadata": {
            "name": name, "namespace": "sim", "annotations": annotations,
            "labels": placement.labels.cloned().unwrap_or_default(),
            "ownerReferences": [{
                "apiVersion": if owner_kind == "Job" { "batch/v1" } else { "apps/v1" },
                "kind": owner_kind, "name": name, "uid": name, "controller": true,
            }],
        },
        "spec": spec,
        "status": {"phase": "Pending"},
    });
    let mut pod = conv.pod(obj)?;
    if !claims.is_empty() {
        // Its claims' specs, from their templates, as a watch store joins them.
        dra.join(std::slice::from_mut(&mut pod));
    }
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
    let policy = match parse_policy_at_with(text, file, &[k("policy")], &PROVIDERS) {
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
    let mut dra = ClaimContext::new(&mut conv, &raw.device_classes, &mut errs);
    // The zones the pools launch in (not known here for a pool whose zones come from its
    // Auto Scaling groups).
    let zones: Option<Vec<String>> = policy
        .as_ref()
        .filter(|p| p.pools.iter().all(|pool| !pool.zones.is_empty()))
        .map(|p| {
            let all: std::collections::BTreeSet<&String> =
                p.pools.iter().flat_map(|pool| &pool.zones).collect();
            all.into_iter().cloned().collect()
        });
    let mut storage = volumes::Volumes::new(
        &raw.storage_classes,
        &raw.persistent_volumes,
        zones.as_deref(),
        &mut errs,
    );
    let mut pods = Vec::new();
    let mut kueue_jobs: Vec<super::KueueJob> = Vec::new();
    let mut service_templates = BTreeMap::new();
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
        let owner_kind = match j.kind.as_deref() {
            None | Some("Job") => "Job",
            Some("Deployment") => {
                if j.gang {
                    errs.at(
                        &at("kind"),
                        "a gang is a Job's (a Deployment's replicas are not scheduled as one)",
                    );
                }
                "ReplicaSet"
            }
            Some(other) => {
                errs.at(
                    &at("kind"),
                    format!("unknown kind {other:?} (expected Job or Deployment)"),
                );
                "Job"
            }
        };
        let run_time = j.expected_run_time.as_deref().map(|v| {
            if v == "duration" {
                gpu_node_autoscaler_core::policy::duration::format_duration(
                    std::time::Duration::from_millis(duration.max(0) as u64),
                )
            } else {
                if errs.dur(&at("expectedRunTime"), v) <= 0 {
                    errs.at(
                        &at("expectedRunTime"),
                        "must be longer than 0s (or `duration`: the job's own)",
                    );
                }
                v.to_string()
            }
        });
        let kueue = match j.admission.as_deref() {
            None => false,
            Some(ADMISSION_PROVISIONING_REQUEST) => true,
            Some(other) => {
                errs.at(
                    &at("admission"),
                    format!(
                        "unknown admission {other:?} (expected {ADMISSION_PROVISIONING_REQUEST})"
                    ),
                );
                false
            }
        };
        let size: usize = j.pods.iter().map(|g| g.replicas as usize).sum();
        let claims: Vec<ClaimRefs> = j
            .pods
            .iter()
            .enumerate()
            .map(|(gi, g)| {
                let owner = format!("{}-{}", j.name, g.name);
                let at = path(&[k("jobs"), i(ji), k("pods"), i(gi)]);
                dra.templates_of(&mut conv, &mut errs, &owner, &g.claims, &at)
            })
            .collect();
        let group_volumes: Vec<Option<Vec<volumes::GroupVolume>>> = j
            .pods
            .iter()
            .enumerate()
            .map(|(gi, g)| {
                storage.group(
                    &g.volumes,
                    &path(&[k("jobs"), i(ji), k("pods"), i(gi)]),
                    &mut errs,
                )
            })
            .collect();
        for n in 0..count {
            let instance = if count > 1 {
                format!("{}-{n}", j.name)
            } else {
                j.name.clone()
            };
            let first = pods.len();
            for (gi, g) in j.pods.iter().enumerate() {
                let Some(group_volumes) = &group_volumes[gi] else {
                    continue;
                };
                for r in 0..g.replicas {
                    let name = format!("{instance}-{}-{r}", g.name);
                    // A StatefulSet `<job>-<group>`'s claims: every repeat of the job is its
                    // pods made again, and finds them (and where they are bound).
                    let pvcs = storage.claims_of(
                        group_volumes,
                        &format!("{}-{}", j.name, g.name),
                        r,
                        &path(&[k("jobs"), i(ji), k("pods"), i(gi)]),
                        &mut errs,
                    );
                    match make_pod(
                        &mut conv,
                        &name,
                        &g.requests,
                        &g.node_selector,
                        &g.tolerations,
                        g.affinity.as_ref(),
                        &Placement {
                            labels: Some(&g.labels),
                            topology_spread_constraints: &g.topology_spread_constraints,
                            ports: &g.ports,
                            volumes: &pvcs,
                        },
                        j.gang.then_some((instance.as_str(), size)),
                        j.priority,
                        owner_kind,
                        &claims[gi],
                        &dra.templates,
                    ) {
                        Ok(mut pod) => pods.push(WorkloadPod {
                            pod: {
                                if let Some(v) = &run_time {
                                    std::sync::Arc::make_mut(&mut pod.annotations).insert(
                                        gpu_node_autoscaler_core::model::labels::EXPECTED_RUN_TIME
                                            .into(),
                                        v.clone(),
                                    );
                                }
                                pod
                            },
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
            if kueue && pods.len() > first {
                kueue_jobs.push(super::KueueJob {
                    name: instance.clone(),
                    pods: (first..pods.len()).collect(),
                });
            }
        }
    }
    let mut services = Vec::new();
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
            .map_or(15 * SECOND, |x| {
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
        let tolerance = h.tolerance.unwrap_or(0.1);
        if !(tolerance.is_finite() && (0.0..1.0).contains(&tolerance)) {
            errs.at(
                &[k("services"), i(si), k("hpa"), k("tolerance")],
                "must be in [0, 1)",
            );
            continue;
        }
        let metric_delay = h.metric_delay.as_deref().map_or(30 * SECOND, |x| {
            errs.dur(&[k("services"), i(si), k("hpa"), k("metricDelay")], x)
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
        let claims = dra.templates_of(
            &mut conv,
            &mut errs,
            &s.name,
            &s.claims,
            &at("requests")[..2],
        );
        let template = match make_pod(
            &mut conv,
            &s.name,
            &s.requests,
            &s.node_selector,
            &s.tolerations,
            None,
            &Placement::default(),
            None,
            0,
            "ReplicaSet",
            &claims,
            &dra.templates,
        ) {
            Ok(p) => p,
            Err(e) => {
                errs.at(&at("requests"), e);
                continue;
            }
        };
        services.push(Service {
            name: s.name.clone(),
            template: template.clone(),
            min_replicas: h.min_replicas,
            max_replicas: h.max_replicas,
            target_utilization: h.target_utilization,
            gpus_per_replica: h.gpus_per_replica,
            sync,
            scale_down_stabilization: stab,
            tolerance,
            metric_delay,
            load: load.clone(),
            until: end,
        });
        service_templates.insert(s.name.clone(), template.clone());
        // The HPA, as kube-controller-manager's runs it on a `Pods` metric (GPU utilisation): every
        // sync it reads each replica's utilisation as it was `metricDelay` ago (the load shared
        // by the replicas, at most 100 % each: a GPU is never more than busy), recommends
        // ceil(replicas × utilisation ÷ target) unless that ratio is within the tolerance of 1,
        // clamped; scale-up goes at most to max(2 × replicas, replicas + 4) a sync (the HPA's
        // default `behavior.scaleUp`), scale-in only to the highest recommendation of the
        // stabilisation window. Replicas count as running once they exist (the real HPA counts a
        // Pending replica as idle while it scales up, so it waits for new replicas' nodes).
        let demand_at = |t: Ms| {
            load.iter()
                .take_while(|(a, _)| *a <= t)
                .last()
                .map_or(load[0].1, |x| x.1)
        };
        let mut desired_at: Vec<(Ms, u32)> = Vec::new();
        let mut replicas: Vec<(Ms, u32)> = Vec::new();
        let mut t = load[0].0;
        while t < end {
            let demand = demand_at(t - metric_delay).max(0.0);
            let cur = replicas.last().map_or(0, |x| x.1);
            let want = if cur == 0 {
                (demand / (h.gpus_per_replica * h.target_utilization)).ceil() as u32
            } else {
                let per_replica = (demand / (f64::from(cur) * h.gpus_per_replica)).min(1.0);
                let ratio = per_replica / h.target_utilization;
                if (ratio - 1.0).abs() <= tolerance {
                    cur
                } else {
                    (f64::from(cur) * ratio).ceil() as u32
                }
            }
            .clamp(h.min_replicas, h.max_replicas);
            desired_at.push((t, want));
            let window_max = desired_at
                .iter()
                .rev()
                .take_while(|(x, _)| t - *x <= stab)
                .map(|x| x.1)
                .max()
                .unwrap_or(want);
            let next = if cur == 0 {
                want
            } else if want >= cur {
                want.min((cur * 2).max(cur + 4))
            } else {
                window_max.min(cur)
            };
            if replicas.last().is_none_or(|x| x.1 != next) {
                replicas.push((t, next));
            }
            t += sync;
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
            e.drift.is_some(),
        ];
        if set.iter().filter(|x| **x).count() != 1 {
            errs.at(
                &path(&[k("events"), i(ei)]),
                "an event is exactly one of insufficientCapacity, spotInterruption, gpuFailure, \
                 quota, drift",
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
        if let Some(d) = &e.drift {
            let p = |f: &str| path(&[k("events"), i(ei), k("drift"), k(f)]);
            if policy
                .as_ref()
                .is_some_and(|pol: &Policy| pol.pool(&d.pool).is_none())
            {
                errs.at(
                    &p("pool"),
                    format!("no pool named {:?} in the policy", d.pool),
                );
            }
            events.push(CloudEvent::Drift {
                at: errs.dur(&p("at"), &d.at),
                pool: d.pool.clone(),
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
    let mut reservations = Vec::new();
    for (ri, r) in raw.reservations.iter().enumerate() {
        let at = |f: &str| path(&[k("reservations"), i(ri), k(f)]);
        let kind = match r.kind.as_deref() {
            None | Some("default") => gpu_node_autoscaler_provider::ReservationKind::Default,
            Some("capacity-block") => gpu_node_autoscaler_provider::ReservationKind::CapacityBlock,
            Some(other) => {
                errs.at(
                    &at("type"),
                    format!(
                        "unknown reservation type {other:?} (expected default or capacity-block)"
                    ),
                );
                gpu_node_autoscaler_provider::ReservationKind::Default
            }
        };
        if !r.id.starts_with("cr-")
            || reservations
                .iter()
                .any(|x: &gpu_node_autoscaler_provider::Reservation| x.id == r.id)
        {
            errs.at(
                &at("id"),
                format!("{:?}: a reservation id is cr-... and unique", r.id),
            );
        }
        if r.count == 0 {
            errs.at(&at("count"), "must be at least 1");
        }
        let start = r.start.as_deref().map(|d| errs.dur(&at("start"), d));
        let end = r.end.as_deref().map(|d| errs.dur(&at("end"), d));
        if kind == gpu_node_autoscaler_provider::ReservationKind::CapacityBlock && end.is_none() {
            errs.at(&at("end"), "a capacity block needs its end");
        }
        if let (Some(s0), Some(e0)) = (start, end) {
            if e0 <= s0 {
                errs.at(&at("end"), "must be after start");
            }
        }
        reservations.push(gpu_node_autoscaler_provider::Reservation {
            id: r.id.clone(),
            kind,
            instance_type: r.instance_type.clone(),
            zone: r.zone.clone(),
            total: r.count,
            available: r.count,
            start_ms: start,
            end_ms: end,
            tags: r.tags.clone(),
            price_per_hour: r.price_per_hour,
        });
    }
    let mut groups = Vec::new();
    for (gi, g) in raw.auto_scaling_groups.iter().enumerate() {
        let at = |f: &str| path(&[k("autoScalingGroups"), i(gi), k(f)]);
        if g.name.is_empty() || groups.iter().any(|x: &Group| x.name == g.name) {
            errs.at(
                &at("name"),
                format!("{:?}: a group's name is given and unique", g.name),
            );
        }
        if g.instance_types.is_empty() {
            errs.at(&at("instanceTypes"), "must list at least one instance type");
        }
        if g.zones.is_empty() {
            errs.at(&at("zones"), "must list at least one zone");
        }
        let capacity_type = match g.capacity_type.as_deref() {
            None => CapacityType::OnDemand,
            Some(c) => match CapacityType::parse(c) {
                Some(ct) if ct != CapacityType::Reserved => ct,
                _ => {
                    errs.at(
                        &at("capacityType"),
                        format!("unknown capacity type {c:?} (expected spot or on-demand)"),
                    );
                    CapacityType::OnDemand
                }
            },
        };
        if g.min_size > g.max_size {
            errs.at(&at("minSize"), "must not exceed maxSize");
        }
        if g.desired_capacity < g.min_size || g.desired_capacity > g.max_size {
            errs.at(&at("desiredCapacity"), "must be within minSize..maxSize");
        }
        groups.push(Group {
            name: g.name.clone(),
            min: g.min_size,
            max: g.max_size,
            desired: g.desired_capacity,
            instance_types: g.instance_types.clone(),
            zones: g.zones.clone(),
            capacity_type,
            tags: g.tags.clone(),
            instances: Vec::new(),
            source: "the scenario".to_string(),
        });
    }
    // The pools of groups, planned from the groups' templates as the controller plans them.
    let (groups, policy) = match policy {
        Some(p) => {
            let (groups, problems) = crate::groups::Groups::new(groups, &p);
            for (at, msg) in problems {
                let segs: Vec<PathSeg> = std::iter::once(k("policy"))
                    .chain(at.iter().map(|s| match s.parse::<usize>() {
                        Ok(n) => i(n),
                        Err(_) => k(s),
                    }))
                    .collect();
                errs.at(&segs, msg);
            }
            let filled = p.with_cloud_templates(&groups.templates(&p));
            (groups, Some(filled))
        }
        None => (crate::groups::Groups::default(), None),
    };
    if pods.is_empty() && errs.out.is_empty() {
        errs.at(&[], "the scenario has no jobs or services");
    }
    let mut buffers: Vec<super::SimBuffer> = Vec::new();
    for (bi, b) in raw.buffers.iter().enumerate() {
        match service_templates.get(&b.service) {
            Some(t) => buffers.push(super::SimBuffer {
                name: format!("{}-buffer", b.service),
                chunk: t.clone(),
                replicas: b.replicas,
            }),
            None => errs.at(
                &[k("buffers"), i(bi), k("service")],
                format!("no service named {:?} in this scenario", b.service),
            ),
        }
    }
    let (storage, storage_objects) = match storage.finish(&mut conv) {
        Ok(s) => s,
        Err(e) => {
            errs.at(&[k("persistentVolumes")], e);
            Default::default()
        }
    };
    // The pods with their claims' rules, as a watch store joins them.
    for w in pods.iter_mut().filter(|w| !w.pod.volumes.is_empty()) {
        storage.join(std::slice::from_mut(&mut w.pod));
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
            dra_objects: if dra.template_objects.is_empty() {
                Vec::new()
            } else {
                dra.class_objects
                    .into_iter()
                    .chain(dra.template_objects)
                    .collect()
            },
            device_classes: dra.classes,
            reservations,
            services,
            kueue_jobs,
            service_templates,
            buffers,
            groups,
            storage,
            storage_objects,
        }),
        _ => Err(errs.out.join("\n")),
    }
}

impl Scenario {
    /// The run's input, on `catalog`, with the scenario's seed unless `seed` is given.
    pub fn into_input(
        self,
        catalog: gpu_node_autoscaler_provider::Catalog,
        seed: Option<u64>,
    ) -> super::SimInput {
        super::SimInput {
            name: self.name,
            policy: self.policy,
            catalog,
            pods: self.pods,
            events: self.events,
            timing: self.timing,
            until: self.until,
            seed: seed.unwrap_or(self.seed),
            skipped: Vec::new(),
            device_classes: self.device_classes,
            reservations: self.reservations,
            kueue_jobs: self.kueue_jobs,
            buffers: self.buffers,
            groups: self.groups,
            storage: self.storage,
        }
    }

    /// Adds a CapacityBuffer of `replicas` chunks, each one replica of `service` (as a buffer
    /// whose `scalableRef` names the service's Deployment); replaces one of the same name.
    pub fn add_buffer(&mut self, service: &str, replicas: u32) -> Result<(), String> {
        let Some(t) = self.service_templates.get(service) else {
            return Err(format!(
                "no service {service:?} in scenario {} (services: {})",
                self.name,
                self.service_templates
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        };
        let name = format!("{service}-buffer");
        self.buffers.retain(|b| b.name != name);
        self.buffers.push(super::SimBuffer {
            name,
            chunk: t.clone(),
            replicas,
        });
        Ok(())
    }
}

fn push_replica(
    pods: &mut Vec<WorkloadPod>,
    template: &gpu_node_autoscaler_core::model::Pod,
    service: &str,
    r: u32,
    serial: u32,
    from: Ms,
    to: Ms,
) {
    let mut pod = template.clone();
    pod.id.name = format!("{service}-{r}-{serial}");
    pod.uid = pod.id.name.clone();
    // Each replica gets claims of its own from the templates (named as for any pod whose
    // generated claims are not known yet).
    for c in &mut pod.claims {
        c.claim = format!("{}/{}/{}", pod.id.namespace, pod.id.name, c.name);
    }
    pod.owner = Some(gpu_node_autoscaler_core::model::Owner {
        kind: gpu_node_autoscaler_core::model::OwnerKind::ReplicaSet,
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
    fn a_jobs_kind_is_job_or_deployment() {
        let job = |kind: &str, gang: bool| {
            format!("name: x\npolicy:\n  zones: [a]\n  pools:\n    - {{name: p, instanceTypes: [g5.xlarge], maxNodes: 2}}\njobs:\n  - name: j\n    kind: {kind}\n    gang: {gang}\n    arrival: 0s\n    duration: 1h\n    pods:\n      - name: w\n        requests: {{nvidia.com/gpu: 1}}\n")
        };
        let owner = |kind: &str| {
            let sc = parse_scenario(&job(kind, false), "s.yaml").unwrap();
            sc.pods[0].pod.owner.as_ref().map(|o| o.kind.clone())
        };
        assert_eq!(
            owner("Job"),
            Some(gpu_node_autoscaler_core::model::OwnerKind::Job)
        );
        assert_eq!(
            owner("Deployment"),
            Some(gpu_node_autoscaler_core::model::OwnerKind::ReplicaSet)
        );
        let e = parse_scenario(&job("StatefulSet", false), "s.yaml")
            .err()
            .unwrap();
        assert!(
            e.contains("s.yaml:8:5: jobs[0].kind: unknown kind \"StatefulSet\" (expected Job or Deployment)"),
            "{e}"
        );
        let e = parse_scenario(&job("Deployment", true), "s.yaml")
            .err()
            .unwrap();
        assert!(
            e.contains("s.yaml:8:5: jobs[0].kind: a gang is a Job's"),
            "{e}"
        );
    }

    #[test]
    fn a_jobs_expected_run_time_annotates_its_pods_for_capacity_blocks() {
        let job = |v: &str| {
            format!("name: x\npolicy:\n  zones: [a]\n  pools:\n    - {{name: p, instanceTypes: [g5.xlarge], maxNodes: 2}}\njobs:\n  - name: j\n    arrival: 0s\n    duration: 90m\n    expectedRunTime: {v}\n    pods:\n      - name: w\n        requests: {{nvidia.com/gpu: 1}}\n")
        };
        let run_time = |v: &str| {
            let sc = parse_scenario(&job(v), "s.yaml").unwrap();
            sc.pods[0].pod.expected_run_time()
        };
        let h = |m: u64| Ok(Some(std::time::Duration::from_secs(m * 60)));
        assert_eq!(run_time("2h"), h(120));
        assert_eq!(run_time("duration"), h(90), "the job's own duration");
        let e = parse_scenario(&job("soon"), "s.yaml").err().unwrap();
        assert!(
            e.contains("s.yaml:10:5: jobs[0].expectedRunTime: invalid duration"),
            "{e}"
        );
        let e = parse_scenario(&job("0s"), "s.yaml").err().unwrap();
        assert!(
            e.contains("jobs[0].expectedRunTime: must be longer than 0s"),
            "{e}"
        );
        // Without the field, no annotation.
        let plain = job("1h").replace("    expectedRunTime: 1h\n", "");
        let sc = parse_scenario(&plain, "s.yaml").unwrap();
        assert_eq!(sc.pods[0].pod.expected_run_time(), Ok(None));
    }

    const CLAIMS: &str = "name: x\npolicy:\n  zones: [a]\n  pools:\n    - {name: p, instanceTypes: [p5.48xlarge], maxNodes: 2, dra: {}}\njobs:\n  - name: j\n    arrival: 0s\n    duration: 1h\n    pods:\n      - name: w\n        replicas: 2\n        requests: {cpu: \"1\"}\n        claims:\n          - name: gpu\n            requests:\n              - name: one\n                firstAvailable:\n                  - {name: h100, deviceClassName: gpu.nvidia.com, selectors: [\"device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H100 80GB HBM3'\"]}\n                  - {name: any, deviceClassName: gpu.nvidia.com, count: 2}\n              - name: all\n                deviceClassName: mig.nvidia.com\n                allocationMode: All\nservices:\n  - name: chat\n    requests: {cpu: \"1\"}\n    claims:\n      - name: gpu\n        requests:\n          - {name: one, deviceClassName: gpu.nvidia.com}\n    hpa: {minReplicas: 2, maxReplicas: 2, targetUtilization: 1, gpusPerReplica: 1}\n    load: [{at: 0s, gpus: 1}]\n    until: 1h\n";

    #[test]
    fn claims_are_made_from_templates_through_the_core_converter() {
        use gpu_node_autoscaler_core::model::dra::DeviceCount;
        let s = parse_scenario(CLAIMS, "c.yaml").unwrap();
        assert_eq!(
            s.device_classes.keys().collect::<Vec<_>>(),
            ["gpu.nvidia.com", "mig.nvidia.com"]
        );
        let (a, b) = (&s.pods[0].pod, &s.pods[1].pod);
        assert!(a.wants_gpu() && a.needs_devices());
        let c = &a.claims[0];
        assert_eq!(c.template.as_deref(), Some("sim/j-w-gpu"));
        // Pods of one type share their claims' spec, and each has claims of its own.
        assert!(std::sync::Arc::ptr_eq(&c.spec, &b.claims[0].spec));
        assert_ne!(c.claim, b.claims[0].claim);
        let one = &c.spec.requests[0];
        assert_eq!(one.alternatives.len(), 2);
        assert_eq!(one.alternatives[0].selectors.len(), 1);
        assert_eq!(one.alternatives[1].count, DeviceCount::Exact(2));
        let all = &c.spec.requests[1].alternatives[0];
        assert_eq!(
            (all.class.as_str(), all.count),
            ("mig.nvidia.com", DeviceCount::All)
        );
        // HPA replicas, cloned from one pod, get claims of their own too.
        let chat: Vec<&str> = s.pods[2..]
            .iter()
            .map(|p| p.pod.claims[0].claim.as_str())
            .collect();
        assert_eq!(chat, ["sim/chat-0-0/gpu", "sim/chat-1-0/gpu"]);
    }

    #[test]
    fn claim_errors_name_file_line_and_field() {
        let bad = CLAIMS
            .replace(
                "deviceClassName: mig.nvidia.com",
                "deviceClassName: tpu.example.com",
            )
            .replace("productName == ", "productName === ")
            .replace("count: 2", "count: 0");
        let e = parse_scenario(&bad, "c.yaml").err().unwrap();
        assert!(
            e.contains("c.yaml:22:17: jobs[0].pods[0].claims[0].requests[1].deviceClassName: DeviceClass \"tpu.example.com\" is not defined (defined: gpu.nvidia.com, mig.nvidia.com)"),
            "{e}"
        );
        assert!(
            e.contains("jobs[0].pods[0].claims[0].requests[0].firstAvailable[0].selectors[0]: CEL expression"),
            "{e}"
        );
        assert!(
            e.contains("jobs[0].pods[0].claims[0]: requests[0].firstAvailable[1] (any).count 0 is not a positive count"),
            "{e}"
        );
        let e = parse_scenario(
            &CLAIMS.replace("allocationMode: All", "mode: All"),
            "c.yaml",
        )
        .err()
        .unwrap();
        assert!(
            e.contains(
                "c.yaml:23:17: jobs[0].pods[0].claims[0].requests[1].mode: unknown field `mode`"
            ),
            "{e}"
        );
    }

    const VOLUMES: &str = "name: x\npolicy:\n  zones: [us-east-1a, us-east-1b]\n  pools:\n    - {name: p, instanceTypes: [g5.xlarge], maxNodes: 2}\nstorageClasses:\n  - {name: gp3-b, provisioner: ebs.csi.aws.com, volumeBindingMode: WaitForFirstConsumer, allowedZones: [us-east-1b]}\n  - {name: manual, provisioner: ebs.csi.aws.com, volumeBindingMode: Immediate}\npersistentVolumes:\n  - {name: ckpt-a, zone: us-east-1a, storageClass: manual, size: 100Gi}\njobs:\n  - name: db\n    arrival: 0s\n    duration: 1h\n    pods:\n      - name: r\n        replicas: 2\n        requests: {nvidia.com/gpu: 1}\n        volumes:\n          - {template: data, storageClass: gp3-b, size: 50Gi}\n          - {claim: ckpt, volume: ckpt-a}\n";

    #[test]
    fn volume_claims_are_made_through_the_core_converter_and_join_the_pods() {
        use gpu_node_autoscaler_core::model::labels::ZONE;
        let s = parse_scenario(VOLUMES, "v.yaml").unwrap();
        let zone = |z: &str| BTreeMap::from([(ZONE.to_string(), z.to_string())]);
        let claims: Vec<Vec<&str>> = s
            .pods
            .iter()
            .map(|p| p.pod.volumes.iter().map(|v| v.claim.as_str()).collect())
            .collect();
        assert_eq!(
            claims,
            [["data-db-r-0", "ckpt"], ["data-db-r-1", "ckpt"]],
            "a claim per replica, and the one they share"
        );
        assert_eq!(
            s.storage.claims["sim/ckpt"].volume.as_deref(),
            Some("ckpt-a")
        );
        // The class allows us-east-1b, the static volume is in us-east-1a: no zone holds both.
        let c = &s.pods[0].pod.constraints;
        assert_eq!(c.volumes.len(), 2);
        assert!(!c.matches_node(&zone("us-east-1a"), None));
        assert!(!c.matches_node(&zone("us-east-1b"), None));
        let kinds: Vec<&str> = s
            .storage_objects
            .iter()
            .map(|o| o["kind"].as_str().unwrap())
            .collect();
        assert_eq!(
            kinds,
            [
                "StorageClass",
                "StorageClass",
                "PersistentVolume",
                "PersistentVolumeClaim",
                "PersistentVolumeClaim",
                "PersistentVolumeClaim"
            ]
        );
    }

    #[test]
    fn volume_errors_name_file_line_and_field() {
        let bad = VOLUMES
            .replace("zone: us-east-1a,", "zone: eu-west-1a,")
            .replace("allowedZones: [us-east-1b]", "allowedZones: [us-east-1z]")
            .replace(
                "storageClass: gp3-b, size: 50Gi",
                "storageClass: manual, size: 50Gi",
            );
        let e = parse_scenario(&bad, "v.yaml").err().unwrap();
        assert!(
            e.contains("v.yaml:7:105: storageClasses[0].allowedZones[0]: \"us-east-1z\" is not one of the policy's zones (us-east-1a, us-east-1b)"),
            "{e}"
        );
        assert!(
            e.contains("v.yaml:10:20: persistentVolumes[0].zone: \"eu-west-1a\" is not one of the policy's zones"),
            "{e}"
        );
        assert!(
            e.contains("v.yaml:20:30: jobs[0].pods[0].volumes[0].storageClass: StorageClass \"manual\" binds Immediately"),
            "{e}"
        );
        let e = parse_scenario(
            &VOLUMES
                .replace(
                    "{claim: ckpt, volume: ckpt-a}",
                    "{claim: ckpt, template: x, volume: ckpt-a}",
                )
                .replace("size: 50Gi", "size: lots"),
            "v.yaml",
        )
        .err()
        .unwrap();
        assert!(
            e.contains("v.yaml:20:51: jobs[0].pods[0].volumes[0].size: \"lots\" is not a positive quantity"),
            "{e}"
        );
        assert!(
            e.contains(
                "v.yaml:21:13: jobs[0].pods[0].volumes[1]: a volume is exactly one of claim"
            ),
            "{e}"
        );
        let e = parse_scenario(
            &VOLUMES.replace("volume: ckpt-a}", "volume: ckpt-z}"),
            "v.yaml",
        )
        .err()
        .unwrap();
        assert!(
            e.contains("v.yaml:21:27: jobs[0].pods[0].volumes[1].volume: no PersistentVolume \"ckpt-z\" in persistentVolumes"),
            "{e}"
        );
        // One static volume, two claims.
        let e = parse_scenario(
            &VOLUMES.replace(
                "{claim: ckpt, volume: ckpt-a}",
                "{claim: ckpt, volume: ckpt-a}\n          - {claim: logs, volume: ckpt-a}",
            ),
            "v.yaml",
        )
        .err()
        .unwrap();
        assert!(
            e.contains("v.yaml:22:14: jobs[0].pods[0].volumes[2].claim: PersistentVolume \"ckpt-a\" is claimed by sim/ckpt already"),
            "{e}"
        );
        let e = parse_scenario(
            &VOLUMES.replace("size: 50Gi}", "size: 50Gi, mode: RWX}"),
            "v.yaml",
        )
        .err()
        .unwrap();
        assert!(
            e.starts_with("v.yaml:20:63: jobs[0].pods[0].volumes[0].mode: unknown field `mode`"),
            "{e}"
        );
    }

    #[test]
    fn hpa_replicas_follow_the_load_with_stabilised_scale_in() {
        let text = "name: x\npolicy:\n  zones: [a]\n  pools:\n    - {name: p, instanceTypes: [g5.xlarge], maxNodes: 9}\nservices:\n  - name: chat\n    requests: {nvidia.com/gpu: 1}\n    hpa: {minReplicas: 1, maxReplicas: 10, targetUtilization: 0.5, gpusPerReplica: 1, sync: 1m, metricDelay: 0s}\n    load: [{at: 0s, gpus: 0.5}, {at: 10m, gpus: 2}, {at: 20m, gpus: 0.5}]\n    until: 40m\n";
        let s = parse_scenario(text, "h.yaml").unwrap();
        // 0.5 GPU → 1 replica; 2 GPUs: the one replica is saturated (100 %, twice the target), so
        // 2 replicas at 10m, 4 a sync later; back to 1 only after the 5-minute stabilisation
        // window following the last recommendation of 4 (at 19m).
        let mut spans: Vec<(Ms, Option<Ms>)> =
            s.pods.iter().map(|p| (p.arrival, p.deleted_at)).collect();
        spans.sort();
        assert_eq!(
            spans,
            [
                (0, Some(40 * MINUTE)),
                (10 * MINUTE, Some(25 * MINUTE)),
                (11 * MINUTE, Some(25 * MINUTE)),
                (11 * MINUTE, Some(25 * MINUTE)),
            ]
        );
    }

    #[test]
    fn hpa_model_reads_a_delayed_saturated_metric_with_the_real_hpas_tolerance_and_sync() {
        // kube-controller-manager's defaults: a sync every 15 s, a tolerance of 0.1; the
        // metric 30 s old (dcgm-exporter's collect interval, then the scrape).
        let text = "name: x\npolicy:\n  zones: [a]\n  pools:\n    - {name: p, instanceTypes: [g5.xlarge], maxNodes: 9}\nservices:\n  - name: chat\n    requests: {nvidia.com/gpu: 1}\n    hpa: {minReplicas: 1, maxReplicas: 10, targetUtilization: 0.5, gpusPerReplica: 1}\n    load: [{at: 0s, gpus: 0.5}, {at: 10m, gpus: 2}, {at: 20m, gpus: 0.5}, {at: 30m, gpus: 0.52}]\n    until: 40m\n";
        let s = parse_scenario(text, "h.yaml").unwrap();
        let mut spans: Vec<(Ms, Option<Ms>)> =
            s.pods.iter().map(|p| (p.arrival, p.deleted_at)).collect();
        spans.sort();
        let sec = |m: Ms, s: Ms| m * MINUTE + s * SECOND;
        assert_eq!(
            spans,
            [
                // 0.52 GPU on one replica at 50 %: 1.04 × the target, within the tolerance, so
                // no second replica from 30m30s.
                (0, Some(40 * MINUTE)),
                // The step seen 30 s late; saturated at 100 %: 1 → 2, then 2 → 4 a sync later.
                (sec(10, 30), Some(sec(25, 30))),
                (sec(10, 45), Some(sec(25, 30))),
                (sec(10, 45), Some(sec(25, 30))),
            ]
        );
        // Scale-up goes at most to max(2 × replicas, replicas + 4) a sync: at a 25 % target a
        // saturated replica asks for 4 times as many.
        let burst = text
            .replace(
                "maxReplicas: 10, targetUtilization: 0.5",
                "maxReplicas: 100, targetUtilization: 0.25",
            )
            .replace("{at: 10m, gpus: 2}", "{at: 10m, gpus: 15}");
        let s = parse_scenario(&burst, "h.yaml").unwrap();
        let at = |t: Ms| {
            s.pods
                .iter()
                .filter(|p| p.arrival <= t && p.deleted_at.is_none_or(|d| d > t))
                .count()
        };
        // 2 → 6 (not 8), 6 → 12 (not 24), 12 → 24, 24 → 48 (not 60), 48 → 60 (15 GPUs at 25 %).
        assert_eq!(
            [
                sec(10, 15),
                sec(10, 30),
                sec(10, 45),
                sec(11, 0),
                sec(11, 15),
                sec(11, 30),
                sec(11, 45)
            ]
            .map(at),
            [2, 6, 12, 24, 48, 60, 60]
        );
        // Bad values name the field.
        let bad = text.replace("gpusPerReplica: 1}", "gpusPerReplica: 1, tolerance: 1.5}");
        let e = parse_scenario(&bad, "h.yaml").err().unwrap();
        assert!(
            e.contains("h.yaml:") && e.contains("services[0].hpa.tolerance: must be in [0, 1)"),
            "{e}"
        );
    }
}
