//! One autoscaler on one fresh cluster: set up, replay the workload, observe, measure.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};

use gpu_node_autoscaler_core::model::constraints::Operator;
use gpu_node_autoscaler_core::model::gpu::nvidia_product_label;
use gpu_node_autoscaler_core::model::labels::{NVIDIA_PRODUCT, ZONE};
use gpu_node_autoscaler_core::model::resources::{ALIYUN_GPU_CORE, ALIYUN_GPU_MEM};
use gpu_node_autoscaler_core::model::topology::{AffinityTerm, PodSelector, PodTopology};
use gpu_node_autoscaler_core::model::{OwnerKind, Pod};
use gpu_node_autoscaler_provider::{CapacityType, Catalog, GpuVendor};
use gpu_node_autoscaler_sim::scenario::Scenario;
use gpu_node_autoscaler_sim::CloudEvent;
use gpu_node_autoscaler_test_support::cluster::{
    free_port, Cluster, ClusterOptions, KWOK_STAGES, REPO,
};
use gpu_node_autoscaler_test_support::hpa::Chain;
use gpu_node_autoscaler_test_support::{dra_driver, provisioner};

use crate::config;

/// The pod annotation after which kwok completes a running pod (the kwok Stages' `pod-complete`).
pub const RUN_DURATION: &str = "gpu-node-autoscaler.io/e2e-run-duration";
/// The namespace of the workload.
const NAMESPACE: &str = "default";
/// The CPU node outside the pools.
const SYSTEM_NODE: &str = "system-0";
/// How often the cluster is looked at (wall time).
const POLL: Duration = Duration::from_millis(500);

/// The autoscalers' binaries and versions.
pub struct Binaries {
    pub ours: Option<PathBuf>,
    pub karpenter: Option<(PathBuf, PathBuf)>,
    pub cluster_autoscaler: Option<PathBuf>,
    pub versions: BTreeMap<&'static str, String>,
    /// What each was built from: the source commit where known, and how (release or debug).
    pub builds: BTreeMap<&'static str, Value>,
}

/// The repository's commit (with `-dirty` when tracked files differ from it): what our binary is
/// taken to be built from.
fn repo_commit() -> String {
    let git = |args: &[&str]| {
        Command::new("git")
            .arg("-C")
            .arg(REPO)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    match git(&["rev-parse", "--short=12", "HEAD"]) {
        None => "unknown (not a git checkout)".to_string(),
        Some(c) => match git(&["status", "--porcelain", "--untracked-files=no"]) {
            Some(st) if !st.is_empty() => format!("{c}-dirty"),
            _ => c,
        },
    }
}

fn script_value(script: &str, key: &str) -> String {
    std::fs::read_to_string(format!("{REPO}/scripts/{script}"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .map(|v| v.split_whitespace().next().unwrap_or("").to_string())
        .unwrap_or_default()
}

impl Binaries {
    /// Finds what `wanted` needs; a missing one is an error that says how to build it.
    pub fn find(wanted: &[String], ours: Option<PathBuf>) -> Result<Binaries> {
        let mut b = Binaries {
            ours: None,
            karpenter: None,
            cluster_autoscaler: None,
            versions: BTreeMap::new(),
            builds: BTreeMap::new(),
        };
        let anchors_bin = || -> Result<PathBuf> {
            let out = Command::new("bash")
                .arg(format!("{REPO}/scripts/anchors.sh"))
                .arg("--print-bin")
                .output()
                .context("bash scripts/anchors.sh --print-bin")?;
            Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
        };
        for w in wanted {
            match w.as_str() {
                "gpu-node-autoscaler" => {
                    let target = std::env::var("CARGO_TARGET_DIR")
                        .map(PathBuf::from)
                        .unwrap_or_else(|_| PathBuf::from(REPO).join("target"));
                    let p = ours
                        .clone()
                        .unwrap_or_else(|| target.join("debug/gpu-node-autoscaler"));
                    if !p.is_file() {
                        bail!(
                            "{} is missing: build it with `cargo build --features controller` or pass --ours-bin",
                            p.display()
                        );
                    }
                    b.versions
                        .insert("gpu-node-autoscaler", env!("CARGO_PKG_VERSION").to_string());
                    let profile = if p.components().any(|c| c.as_os_str() == "release") {
                        "release"
                    } else {
                        "debug (or not under a release directory)"
                    };
                    b.builds.insert(
                        "gpu-node-autoscaler",
                        json!({"version": env!("CARGO_PKG_VERSION"), "commit": repo_commit(),
                               "profile": profile, "binary": p.display().to_string()}),
                    );
                    b.ours = Some(p);
                }
                "karpenter" => {
                    let bin = anchors_bin()?;
                    let k = bin.join("karpenter-kwok");
                    let crds = bin.parent().unwrap_or(Path::new("/")).join("crds");
                    if !k.is_file() || !crds.join("karpenter.sh_nodepools.yaml").is_file() {
                        bail!(
                            "Karpenter's kwok provider is not built in {}: run `bash scripts/anchors.sh karpenter`",
                            bin.display()
                        );
                    }
                    // Its disruption timers are constants; the harness's build divides them by
                    // GNA_TIME_SCALE (scripts/anchors.sh).
                    require_scaled(
                        &k,
                        ".karpenter-waits-scaled",
                        "disruption timers",
                        "karpenter",
                    )?;
                    b.versions
                        .insert("karpenter", script_value("anchors.sh", "KARPENTER_VERSION"));
                    b.builds.insert(
                        "karpenter",
                        json!({"version": script_value("anchors.sh", "KARPENTER_VERSION"),
                               "commit": format!("tag {} of github.com/kubernetes-sigs/karpenter (its kwok provider)", script_value("anchors.sh", "KARPENTER_VERSION")),
                               "profile": "release (go build, scripts/anchors.sh)"}),
                    );
                    b.karpenter = Some((k, crds));
                }
                "cluster-autoscaler" => {
                    let c = anchors_bin()?.join("cluster-autoscaler");
                    if !c.is_file() {
                        bail!(
                            "the Cluster Autoscaler is not built ({} is missing): `bash scripts/anchors.sh \
                             cluster-autoscaler` builds it from the Go module proxy, which has refused its release \
                             commits (403 \"This module version is not available\" for \
                             k8s.io/autoscaler/cluster-autoscaler@{}), or, with GNA_CA_SOURCE set to a clone of \
                             github.com/kubernetes/autoscaler, from commit {}; or leave it out with \
                             --autoscalers gpu-node-autoscaler,karpenter",
                            c.display(),
                            script_value("anchors.sh", "CA_PSEUDO"),
                            script_value("anchors.sh", "CA_COMMIT")
                        );
                    }
                    // Its two scale-up holds are constants; the harness's build divides them by
                    // GNA_TIME_SCALE (scripts/anchors.sh).
                    require_scaled(
                        &c,
                        ".cluster-autoscaler-holds-scaled",
                        "scale-up holds",
                        "cluster-autoscaler",
                    )?;
                    b.versions.insert(
                        "cluster-autoscaler",
                        script_value("anchors.sh", "CA_VERSION"),
                    );
                    b.builds.insert(
                        "cluster-autoscaler",
                        json!({"version": script_value("anchors.sh", "CA_VERSION"),
                               "commit": script_value("anchors.sh", "CA_COMMIT"),
                               "profile": "release (go build, kwok provider only, scripts/anchors.sh)"}),
                    );
                    b.cluster_autoscaler = Some(c);
                }
                _ => unreachable!(),
            }
        }
        Ok(b)
    }
}

/// A product's binary must be the harness's build, whose hard-coded timers read the time scale:
/// `scripts/anchors.sh` marks it with a stamp file beside it.
fn require_scaled(bin: &Path, stamp: &str, timers: &str, script_arg: &str) -> Result<()> {
    if !bin.with_file_name(stamp).is_file() {
        bail!(
            "{} was built without its {timers} scaled by the time scale: \
             `bash scripts/anchors.sh {script_arg}` builds it again",
            bin.display()
        );
    }
    Ok(())
}

/// One pod of the workload, in wall time from the start of the replay.
pub struct WorkPod {
    pub name: String,
    /// Its controller: a Job, or a ReplicaSet for a Deployment's replica.
    pub object: Value,
    /// `job/NAME` or `replicaset/NAME`, for kubectl.
    pub resource: String,
    pub arrival: Duration,
    pub delete_at: Option<Duration>,
    /// A ReplicaSet's: deleted once its pods have run this long in all.
    pub run_for: Option<Duration>,
    /// GPU equivalents, as `simulate` counts them (a MIG slice by its compute share, a shared
    /// GPU's part by the larger of its memory and core share).
    pub gpus: f64,
    /// Its pod has PersistentVolumeClaims.
    pub volumes: bool,
}

/// What every run of one scenario shares.
pub struct Setup {
    pub scale: f64,
    pub pods: Vec<WorkPod>,
    pub catalog: Catalog,
    pub our_policy: String,
    pub karpenter_types: Value,
    pub karpenter_objects: Value,
    pub ca: config::ClusterAutoscalerSetup,
    /// kwok's Stages with the nodes' boot time (Ready this long after the Node is created).
    pub stages: String,
    /// Wall time after which the run stops whatever remains.
    pub deadline: Duration,
    /// The scenario's time a node takes to be Ready (boot and device plugin).
    pub boot: Duration,
    pub scan_interval: Duration,
    pub not_replayed: Vec<String>,
    /// The DeviceClasses and ResourceClaimTemplates the pods' claims need (in the workload
    /// namespace), created before the autoscaler starts.
    pub dra_objects: Vec<Value>,
    /// The StorageClasses, static PersistentVolumes and PersistentVolumeClaims of the pods'
    /// volumes (in the workload namespace), created before the autoscaler starts; the
    /// provisioner stand-in makes the volumes of the `WaitForFirstConsumer` claims as the
    /// scheduler selects their nodes.
    pub storage_objects: Vec<Value>,
    /// The pools whose Nodes get a ResourceSlice from the DRA driver stand-in once Ready, with
    /// the MIG layout their GPUs are partitioned into.
    pub dra_pools: BTreeMap<String, Option<Vec<(String, u32)>>>,
    /// With `--hpa real`: the scenario's services, scaled by the real HPA chain instead of
    /// replaying the model's replicas.
    pub hpa: Option<RealHpa>,
}

/// The real HPA chain of a replay: kube-controller-manager's HPA controller, the real
/// Prometheus and prometheus-adapter, the dcgm-exporter stand-in driven by each service's load.
pub struct RealHpa {
    pub services: Vec<RealService>,
    /// kube-controller-manager's flags: the HPA's sync period and tolerance, scaled.
    pub controller_manager_args: Vec<String>,
    /// Prometheus's scrape interval and the adapter's relist interval (wall time).
    pub scrape: Duration,
    pub relist: Duration,
    /// What the simulator's HPA model made of the same services (the replicas not replayed),
    /// for comparison: replicas, replica-hours, most at once.
    pub model: HpaModelSeen,
}

/// The replicas of the simulator's HPA model for a scenario's services.
#[derive(Clone, Copy, Debug, Default)]
pub struct HpaModelSeen {
    pub replicas: usize,
    pub replica_hours: f64,
    pub peak: usize,
}

/// A service whose replicas come from a real HPA: its Deployment (starting at `minReplicas`)
/// and HorizontalPodAutoscaler, its load in GPUs' worth from each (wall) time on, and when it
/// ends (both deleted).
pub struct RealService {
    pub name: String,
    pub deployment: Value,
    pub hpa: Value,
    pub load: Vec<(Duration, f64)>,
    pub until: Duration,
    /// GPU equivalents of one replica.
    pub gpus: f64,
}

impl RealService {
    /// The load at `t` (wall time from the start).
    pub fn load_at(&self, t: Duration) -> f64 {
        self.load
            .iter()
            .take_while(|(at, _)| *at <= t)
            .last()
            .or(self.load.first())
            .map_or(0.0, |x| x.1)
    }
}

/// The label on a real-HPA service's replicas naming the service.
const SERVICE: &str = "anchors.gpu-node-autoscaler.io/service";

/// A scenario's service as a Deployment and an `autoscaling/v2` HPA on the pods' GPU
/// utilisation (`DCGM_FI_DEV_GPU_UTIL` through `deploy/examples/gpu-hpa`'s adapter rule), its
/// behaviour as kube-controller-manager's defaults and the model's parameters say, every
/// duration divided by `scale` (whole seconds where the API takes seconds, at least 1).
fn real_service(
    svc: &gpu_node_autoscaler_sim::scenario::Service,
    wall: &dyn Fn(i64) -> Duration,
    scale: f64,
) -> Result<RealService> {
    let name = dns_name(&svc.name);
    let mut pod = pod_object(&svc.template, None)?;
    pod["metadata"]["labels"]["app"] = json!(name);
    pod["metadata"]["labels"][SERVICE] = json!(name);
    pod["spec"]["restartPolicy"] = json!("Always");
    let deployment = json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "replicas": svc.min_replicas,
            "selector": {"matchLabels": {SERVICE: name}},
            "template": pod,
        },
    });
    let secs = |ms: i64| ((ms as f64 / 1000.0 / scale).round() as i64).max(1);
    // The default scale-up behaviour (100 % or 4 pods per 15 s, the larger) and scale-down
    // (100 % per 15 s after the stabilisation window).
    let period = secs(15_000);
    let hpa = json!({
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
            "minReplicas": svc.min_replicas,
            "maxReplicas": svc.max_replicas,
            "metrics": [{"type": "Pods", "pods": {
                "metric": {"name": "DCGM_FI_DEV_GPU_UTIL"},
                "target": {"type": "AverageValue",
                           "averageValue": format!("{}", (svc.target_utilization * 100.0).round() as i64)},
            }}],
            "behavior": {
                "scaleUp": {"stabilizationWindowSeconds": 0, "selectPolicy": "Max", "policies": [
                    {"type": "Percent", "value": 100, "periodSeconds": period},
                    {"type": "Pods", "value": 4, "periodSeconds": period},
                ]},
                "scaleDown": {
                    "stabilizationWindowSeconds": if svc.scale_down_stabilization > 0 { secs(svc.scale_down_stabilization) } else { 0 },
                    "policies": [{"type": "Percent", "value": 100, "periodSeconds": period}],
                },
            },
        },
    });
    // The model serves `gpusPerReplica` GPUs of demand with a replica at 100 %; the exporter
    // stand-in reports a pod's share of the load against its own GPUs.
    let gpus = svc.template.gpu_equivalents();
    if (gpus - svc.gpus_per_replica).abs() > 1e-9 {
        bail!(
            "service {}: gpusPerReplica {} differs from the GPUs a replica requests ({gpus}); \
             the real chain measures utilisation against the replica's own GPUs",
            svc.name,
            svc.gpus_per_replica
        );
    }
    Ok(RealService {
        name,
        deployment,
        hpa,
        load: svc.load.iter().map(|&(at, g)| (wall(at), g)).collect(),
        until: wall(svc.until),
        gpus,
    })
}

fn dns_name(s: &str) -> String {
    let mut n: String = s
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '-'
            }
        })
        .collect();
    n.truncate(63);
    n.trim_matches(|c| c == '-' || c == '.').to_string()
}

/// The label that ties a workload's pods to it.
const WORKLOAD: &str = "anchors.gpu-node-autoscaler.io/workload";

/// The controller of one workload pod, as users run them (a bare Pod is one no autoscaler may
/// drain): a `batch/v1` Job of one pod (completed by kwok after its run time), or for a
/// Deployment's replica a ReplicaSet of one (deleted when its time is up).
fn workload_object(p: &Pod, name: &str, run: Option<Duration>, replica_set: bool) -> Result<Value> {
    let mut pod = pod_object(p, if replica_set { None } else { run })?;
    pod["metadata"]["labels"][WORKLOAD] = json!(name);
    let selector = json!({"matchLabels": {WORKLOAD: name}});
    Ok(if replica_set {
        pod["spec"]["restartPolicy"] = json!("Always");
        json!({
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"replicas": 1, "selector": selector, "template": pod},
        })
    } else {
        json!({
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": name, "namespace": NAMESPACE},
            // A pod evicted from a node being removed is a failure to the Job controller, which
            // makes a new one (after its back-off, 10 s doubling, not scaled).
            "spec": {"parallelism": 1, "completions": 1, "backoffLimit": 1000, "template": pod},
        })
    })
}

/// A label selector as the API writes it; `None` when the selector selects no pod (the API's
/// absent `labelSelector`).
fn label_selector(pod: &Pod, sel: &PodSelector) -> Result<Option<Value>> {
    let Some(reqs) = &sel.labels else {
        return Ok(None);
    };
    let exprs = reqs
        .iter()
        .map(|r| {
            let op = match r.operator {
                Operator::In => "In",
                Operator::NotIn => "NotIn",
                Operator::Exists => "Exists",
                Operator::DoesNotExist => "DoesNotExist",
                Operator::Gt | Operator::Lt => {
                    bail!("pod {}: a label selector has no {:?}", pod.id, r.operator)
                }
            };
            let mut e = json!({"key": r.key, "operator": op});
            if !r.values.is_empty() {
                e["values"] = json!(r.values);
            }
            Ok(e)
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Some(json!({"matchExpressions": exprs})))
}

/// A pod's rules across nodes as kube-scheduler reads them: host ports on its container,
/// required pod (anti-)affinity terms, `DoNotSchedule` topology spread. The pods of the replay
/// all live in [`NAMESPACE`], so a term over the pod's own namespace names that one.
fn topology_into(spec: &mut Value, pod: &Pod, t: &PodTopology) -> Result<()> {
    if !t.host_ports.is_empty() {
        let ports: Vec<Value> = t
            .host_ports
            .iter()
            .map(|h| {
                let mut v =
                    json!({"containerPort": h.port, "hostPort": h.port, "protocol": h.protocol});
                if !h.ip.is_empty() {
                    v["hostIP"] = json!(h.ip);
                }
                v
            })
            .collect();
        spec["containers"][0]["ports"] = json!(ports);
    }
    let namespaces = |sel: &PodSelector| -> Result<Value> {
        match &sel.namespaces {
            None => Ok(json!({"namespaceSelector": {}})),
            Some(ns) if ns.iter().all(|n| *n == pod.id.namespace) => {
                Ok(json!({"namespaces": [NAMESPACE]}))
            }
            Some(ns) => bail!(
                "pod {}: a term over other namespaces ({ns:?}) cannot be replayed (every pod of the replay is in {NAMESPACE})",
                pod.id
            ),
        }
    };
    let terms = |terms: &[AffinityTerm]| -> Result<Vec<Value>> {
        terms
            .iter()
            .map(|term| {
                let mut v = namespaces(&term.selector)?;
                v["topologyKey"] = json!(term.topology_key);
                if let Some(sel) = label_selector(pod, &term.selector)? {
                    v["labelSelector"] = sel;
                }
                Ok(v)
            })
            .collect()
    };
    if !t.affinity.is_empty() {
        spec["affinity"]["podAffinity"] =
            json!({"requiredDuringSchedulingIgnoredDuringExecution": terms(&t.affinity)?});
    }
    if !t.anti_affinity.is_empty() {
        spec["affinity"]["podAntiAffinity"] =
            json!({"requiredDuringSchedulingIgnoredDuringExecution": terms(&t.anti_affinity)?});
    }
    if !t.spread.is_empty() {
        let spread = t
            .spread
            .iter()
            .map(|sp| {
                let mut v = json!({
                    "maxSkew": sp.max_skew,
                    "topologyKey": sp.topology_key,
                    "whenUnsatisfiable": "DoNotSchedule",
                });
                if sp.min_domains > 1 {
                    v["minDomains"] = json!(sp.min_domains);
                }
                if let Some(sel) = label_selector(pod, &sp.selector)? {
                    v["labelSelector"] = sel;
                }
                Ok(v)
            })
            .collect::<Result<Vec<_>>>()?;
        spec["topologySpreadConstraints"] = json!(spread);
    }
    Ok(())
}

/// The pod template of a workload pod.
fn pod_object(p: &Pod, run: Option<Duration>) -> Result<Value> {
    // The replay's Nodes publish no CSINode attach limits: a pod counted against one would be
    // another workload than the scenario's.
    if p.constraints
        .topology
        .as_ref()
        .is_some_and(|t| !t.attachments.is_empty())
    {
        anyhow::bail!(
            "pod {}: attach-limited volumes cannot be replayed by anchors yet",
            p.id
        );
    }
    // Its PersistentVolumeClaims (created with the scenario's storage before the pods).
    let mut volumes = Vec::new();
    for (n, v) in p.volumes.iter().enumerate() {
        if v.ephemeral_class.is_some() {
            bail!(
                "pod {}: generic ephemeral volumes cannot be replayed by anchors yet",
                p.id
            );
        }
        volumes.push(
            json!({"name": format!("v{n}"), "persistentVolumeClaim": {"claimName": v.claim}}),
        );
    }
    let r = &p.requests;
    let mut requests = json!({
        "cpu": format!("{}m", r.cpu_milli),
        "memory": r.memory.to_string(),
    });
    let mut limits = json!({});
    // A shared-GPU request as Alibaba's device plugin reads it (the kwok Nodes of a shared pool
    // advertise its GPUs' memory and cores; see `advertised_gpu_resources`).
    let share = p.share.map_or(vec![], |s| {
        vec![(ALIYUN_GPU_MEM, s.mem_gib), (ALIYUN_GPU_CORE, s.core_pct)]
    });
    // MIG slices are extended resources (`nvidia.com/mig-<profile>`).
    for (k, v) in [("nvidia.com/gpu", r.gpu), ("amd.com/gpu", r.amd_gpu)]
        .into_iter()
        .chain(share)
        .chain(r.extended.iter().map(|(k, v)| (k.as_str(), *v)))
    {
        if v > 0 {
            requests[k] = json!(v.to_string());
            limits[k] = json!(v.to_string());
        }
    }
    let c = &p.constraints;
    let tolerations: Vec<Value> = c
        .tolerations
        .iter()
        .map(|t| {
            let mut v = json!({"operator": if t.exists { "Exists" } else { "Equal" }});
            if let Some(k) = &t.key {
                v["key"] = json!(k);
            }
            if !t.exists {
                v["value"] = json!(t.value);
            }
            if let Some(e) = t.effect {
                v["effect"] = json!(e.as_str());
            }
            v
        })
        .collect();
    // Its ResourceClaims, each made from the scenario's template (created before the pods),
    // and the container's references to them.
    let mut claim_refs = Vec::new();
    let mut container_claims = Vec::new();
    for c in &p.claims {
        let Some(template) = c.template.as_deref() else {
            bail!(
                "pod {}: claim {} is not made from a ResourceClaimTemplate",
                p.id.name,
                c.name
            );
        };
        let template = template.rsplit('/').next().unwrap_or(template);
        claim_refs.push(json!({"name": c.name, "resourceClaimTemplateName": template}));
        container_claims.push(json!({"name": c.name}));
    }
    let mut resources = json!({"requests": requests, "limits": limits});
    if !claim_refs.is_empty() {
        resources["claims"] = json!(container_claims);
    }
    let mut spec = json!({
        "containers": [{"name": "main", "image": "workload", "resources": resources}],
        "nodeSelector": c.node_selector,
        "tolerations": tolerations,
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 0,
    });
    if !claim_refs.is_empty() {
        spec["resourceClaims"] = json!(claim_refs);
    }
    if !volumes.is_empty() {
        spec["volumes"] = json!(volumes);
    }
    if let Some(t) = c.topology.as_deref() {
        topology_into(&mut spec, p, t)?;
    }
    if let Some(terms) = &c.affinity {
        let terms: Vec<Value> = terms
            .iter()
            .map(|t| {
                let exprs: Vec<Value> = t
                    .requirements
                    .iter()
                    .map(|r| json!({"key": r.key, "operator": format!("{:?}", r.operator), "values": r.values}))
                    .collect();
                json!({"matchExpressions": exprs})
            })
            .collect();
        spec["affinity"]["nodeAffinity"] =
            json!({"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}});
    }
    let mut annotations: BTreeMap<String, String> = (*p.annotations).clone();
    if let Some(d) = run {
        annotations.insert(RUN_DURATION.into(), format!("{}ms", d.as_millis().max(1)));
    }
    Ok(json!({
        "metadata": {"labels": p.labels.as_ref(), "annotations": annotations},
        "spec": spec,
    }))
}

impl Setup {
    pub fn new(
        s: &Scenario,
        raw_policy: &serde_json::Value,
        catalog: Catalog,
        scale: f64,
        max_time: Option<Duration>,
        real_hpa: bool,
    ) -> Result<Setup> {
        // The kwok providers of the three products have no capacity reservations: a replay
        // without them would compare another workload than the scenario's.
        if !s.reservations.is_empty() {
            anyhow::bail!(
                "capacity reservations ({}) cannot be replayed by anchors yet",
                s.reservations.len()
            );
        }
        // Kueue and CapacityBuffers are not installed in the replay's clusters: their jobs'
        // pods would be created at once, another workload than the scenario's.
        if !s.kueue_jobs.is_empty() || !s.buffers.is_empty() {
            anyhow::bail!(
                "Kueue-admitted jobs ({}) and CapacityBuffers ({}) cannot be replayed by anchors yet",
                s.kueue_jobs.len(),
                s.buffers.len()
            );
        }
        let wall = |ms: i64| Duration::from_secs_f64(ms.max(0) as f64 / 1000.0 / scale);
        let mut pods = Vec::new();
        let mut end = Duration::ZERO;
        let hpa = if real_hpa {
            if s.services.is_empty() {
                bail!("--hpa real: the scenario has no HPA-scaled services");
            }
            let tolerance = s.services[0].tolerance;
            if s.services.iter().any(|x| x.tolerance != tolerance) {
                bail!("--hpa real: the services' HPA tolerances differ (kube-controller-manager has one)");
            }
            let sync = s.services[0].sync;
            if s.services.iter().any(|x| x.sync != sync) {
                bail!("--hpa real: the services' HPA sync periods differ (kube-controller-manager has one)");
            }
            let services = s
                .services
                .iter()
                .map(|x| real_service(x, &wall, scale))
                .collect::<Result<Vec<_>>>()?;
            for x in &services {
                end = end.max(x.until);
            }
            let every = |ms: i64| format!("{}ms", (wall(ms).as_millis()).max(1));
            Some(RealHpa {
                services,
                controller_manager_args: vec![
                    format!("--horizontal-pod-autoscaler-sync-period={}", every(sync)),
                    format!("--horizontal-pod-autoscaler-tolerance={tolerance}"),
                ],
                // A 15 s scrape and a 30 s relist of the adapter's series, scaled.
                scrape: wall(15_000).max(Duration::from_millis(250)),
                relist: wall(30_000).max(Duration::from_millis(500)),
                model: HpaModelSeen::default(),
            })
        } else {
            None
        };
        let real = hpa.is_some();
        let from_service = |wp: &gpu_node_autoscaler_sim::WorkloadPod| {
            real && wp.pod.owner.as_ref().is_some_and(|o| {
                o.kind == OwnerKind::ReplicaSet && s.services.iter().any(|x| x.name == o.name)
            })
        };
        let mut hpa = hpa;
        if let Some(h) = hpa.as_mut() {
            let modelled: Vec<(i64, i64)> = s
                .pods
                .iter()
                .filter(|wp| from_service(wp))
                .map(|wp| (wp.arrival, wp.deleted_at.unwrap_or(wp.arrival)))
                .collect();
            let mut changes: Vec<(i64, i32)> = modelled
                .iter()
                .flat_map(|&(a, d)| [(a, 1), (d, -1)])
                .collect();
            changes.sort();
            let (mut now, mut peak) = (0i32, 0i32);
            for (_, c) in changes {
                now += c;
                peak = peak.max(now);
            }
            h.model = HpaModelSeen {
                replicas: modelled.len(),
                replica_hours: modelled.iter().map(|&(a, d)| (d - a) as f64).sum::<f64>()
                    / 3_600_000.0,
                peak: peak.max(0) as usize,
            };
        }
        for (i, wp) in s
            .pods
            .iter()
            .enumerate()
            .filter(|(_, wp)| !from_service(wp))
        {
            let name = dns_name(&format!("{}-{i}", wp.pod.id.name));
            let run = wp.duration.map(wall);
            let replica_set = wp
                .pod
                .owner
                .as_ref()
                .is_some_and(|o| o.kind == OwnerKind::ReplicaSet);
            let object = workload_object(&wp.pod, &name, run, replica_set)?;
            let arrival = wall(wp.arrival);
            let delete_at = wp.deleted_at.map(wall);
            end = end
                .max(arrival + run.unwrap_or_default())
                .max(delete_at.unwrap_or_default());
            pods.push(WorkPod {
                resource: format!("{}/{name}", if replica_set { "replicaset" } else { "job" }),
                name,
                object,
                arrival,
                delete_at,
                // A replica runs until its ReplicaSet is deleted: once it has run its time.
                run_for: run.filter(|_| replica_set),
                gpus: wp.pod.gpu_equivalents(),
                volumes: !wp.pod.volumes.is_empty(),
            });
        }
        pods.sort_by_key(|p| p.arrival);
        let not_replayed = s
            .events
            .iter()
            .map(|e| match e {
                CloudEvent::InsufficientCapacity { .. } => "insufficientCapacity (kwok has no capacity shortages for Karpenter's and the Cluster Autoscaler's providers)".to_string(),
                CloudEvent::SpotInterruption { .. } => "spotInterruption (no interruption notices on kwok)".to_string(),
                other => format!("{other:?}"),
            })
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        let t = &s.timing;
        let boot_ms = (t.boot_min + t.boot_max) / 2 + t.device_plugin_delay;
        let boot = Duration::from_millis(boot_ms.max(0) as u64);
        let stages = std::fs::read_to_string(KWOK_STAGES).context(KWOK_STAGES)?;
        let stages = with_node_delay(&stages, config::scaled_duration(boot, scale))?;
        let policy = &s.policy;
        let tail = policy
            .pools
            .iter()
            .map(|p| {
                p.scale_down
                    .cooldown_after_scale_up
                    .max(p.scale_down.unneeded_time)
            })
            .max()
            .unwrap_or_default()
            * 2
            + boot
            + Duration::from_secs(600);
        let deadline = match max_time.or(s.until.map(|u| Duration::from_millis(u.max(0) as u64))) {
            Some(m) => config::scaled_duration(m, scale),
            None => end + config::scaled_duration(tail, scale),
        };
        let dra_objects: Vec<Value> = s
            .dra_objects
            .iter()
            .map(|o| {
                let mut o = o.clone();
                if o["kind"] == "ResourceClaimTemplate" {
                    o["metadata"]["namespace"] = json!(NAMESPACE);
                }
                o
            })
            .collect();
        let storage_objects: Vec<Value> = s
            .storage_objects
            .iter()
            .map(|o| {
                let mut o = o.clone();
                if o["kind"] == "PersistentVolumeClaim" {
                    o["metadata"]["namespace"] = json!(NAMESPACE);
                }
                if o["spec"]["claimRef"].is_object() {
                    o["spec"]["claimRef"]["namespace"] = json!(NAMESPACE);
                }
                o
            })
            .collect();
        let dra_pools = policy
            .pools
            .iter()
            .filter(|p| p.dra.is_some())
            .map(|p| {
                let mig = match &p.gpu_mode {
                    gpu_node_autoscaler_core::policy::GpuMode::Mig(layout) => Some(layout.clone()),
                    _ => None,
                };
                (p.name.clone(), mig)
            })
            .collect();
        let mut ca = config::cluster_autoscaler(policy, &catalog, scale)?;
        if !dra_objects.is_empty() {
            // As its users of DRA run it (its simulation then allocates the pods' claims).
            ca.args
                .push("--enable-dynamic-resource-allocation=true".to_string());
        }
        Ok(Setup {
            scale,
            pods,
            dra_objects,
            storage_objects,
            dra_pools,
            hpa,
            our_policy: config::our_policy(raw_policy, policy, scale)?,
            karpenter_types: config::karpenter_instance_types(policy, &catalog)?,
            karpenter_objects: config::karpenter_objects(policy, &catalog, scale)?,
            ca,
            catalog,
            stages,
            deadline,
            boot,
            scan_interval: config::scaled_duration(Duration::from_secs(10), scale)
                .max(Duration::from_millis(500)),
            not_replayed,
        })
    }
}

/// kwok's Stages with the nodes' boot time, whoever created the Node: a new Node without a Ready
/// condition is made NotReady at once (`node-boot`, weighted over `node-initialize`, which matches it
/// too), so that the node lifecycle controller keeps the not-ready taint on it, and `node-initialize`
/// makes it Ready `delay` after its creation. After its creation, not after its last update: kwok
/// starts a Stage's delay again on every update of the object, and an autoscaler updates the Nodes
/// it launched (labels, taints, annotations) at times of its own; with the delay alone a Node was
/// Ready 9.8 s after its creation for the Cluster Autoscaler, 10.4 s for us and 10.9 s for
/// Karpenter (medians at 20×), and up to 20 s for a few Nodes of ours and Karpenter's (until
/// 2026-11-26). The time is the creation's, in whole seconds as the API server keeps it, so a Node
/// is Ready up to a second before `delay` has passed.
pub fn with_node_delay(stages: &str, delay: Duration) -> Result<String> {
    let mut out = String::new();
    let mut in_init = false;
    let mut done = false;
    for line in stages.lines() {
        out.push_str(line);
        out.push('\n');
        if line.trim() == "name: node-initialize" {
            in_init = true;
        } else if in_init && line == "spec:" {
            let ms = delay.as_millis();
            out.push_str(&format!(
                "  delay:\n    durationMilliseconds: {ms}\n    durationFrom:\n      jq:\n        \
                 expression: '\"\\(((.metadata.creationTimestamp | fromdate) * 1000 + {ms} - now * 1000) \
                 | floor)ms\"'\n"
            ));
            in_init = false;
            done = true;
        }
    }
    if !done {
        bail!("{KWOK_STAGES}: no `node-initialize` Stage with a `spec:` to give a delay");
    }
    out.push_str(NODE_BOOT_STAGE);
    Ok(out)
}

/// A Node without a Ready condition (as its creator made it) is NotReady while it boots.
const NODE_BOOT_STAGE: &str = r#"---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: node-boot
spec:
  resourceRef:
    apiGroup: v1
    kind: Node
  selector:
    matchExpressions:
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: 'DoesNotExist'
  weight: 1
  next:
    statusTemplate: |
      conditions:
      - lastHeartbeatTime: {{ Now | Quote }}
        lastTransitionTime: {{ Now | Quote }}
        message: booting
        reason: KubeletNotReady
        status: "False"
        type: Ready
"#;

/// One Node's life as seen.
struct NodeSeen {
    instance_type: String,
    zone: Option<String>,
    capacity_type: Option<CapacityType>,
    gpus: i64,
    first: Duration,
    last: Duration,
    gone: bool,
}

#[derive(Default)]
struct PodSeen {
    created: Option<Duration>,
    /// The first look that found one of its pods running.
    running: Option<Duration>,
    finished: Option<Duration>,
    /// How long its pods ran in all (an evicted pod's replacement runs again), and whether one
    /// ran at the last look.
    ran: Duration,
    running_at: Option<Duration>,
    /// GPU equivalents of the devices allocated to its ResourceClaims (the most seen).
    claimed_gpus: f64,
    /// The Node its first pod was found running on.
    node: Option<String>,
}

/// What one autoscaler did with one workload, in the scenario's time.
pub struct Measured {
    pub autoscaler: String,
    pub cost_usd: f64,
    pub wait_p50_s: f64,
    pub wait_p95_s: f64,
    pub wait_p99_s: f64,
    /// The [`LONGEST_WAITS`] longest waits, longest first.
    pub longest_waits: Vec<LongWait>,
    pub gpu_allocation: f64,
    pub first_node_s: Option<f64>,
    pub nodes_launched: usize,
    pub pods: usize,
    pub pods_never_placed: usize,
    /// With a real HPA: what its replicas were.
    pub hpa_replicas: Option<HpaSeen>,
    pub cost_by_offering: BTreeMap<String, f64>,
    pub wall_s: f64,
    pub unpriced_nodes: Vec<String>,
    /// The workloads whose pods have volumes, by the zone of the Node their first pod ran on.
    pub volume_pods_by_zone: BTreeMap<String, usize>,
    /// The volumes the provisioner stand-in made, by zone.
    pub volumes_by_zone: BTreeMap<String, usize>,
    /// The machine's highest 1-minute load average during the run (`/proc/loadavg`; `None`
    /// where there is none), the run's own cluster included.
    pub load_avg_max: Option<f64>,
}

/// The 1-minute load average (`/proc/loadavg`'s first field), where the machine has one.
fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The replicas a real HPA made over a run, in the scenario's time.
pub struct HpaSeen {
    pub made: usize,
    /// Never ran: scaled in before a node came, or waiting when the service ended.
    pub never_ran: usize,
    /// The replicas' lives summed (from the first look that saw each to the last).
    pub replica_hours: f64,
    /// The most replicas at one look.
    pub peak: usize,
}

/// How many of the longest waits a run reports.
pub const LONGEST_WAITS: usize = 5;

/// One of a run's longest waits: the workload (Job or ReplicaSet), its wait in the scenario's
/// time, and the Node its first pod ran on.
pub struct LongWait {
    pub workload: String,
    pub wait_s: f64,
    pub node: String,
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn kubectl(cluster: &Cluster, args: &[&str]) -> Result<String> {
    cluster.kubectl(args).map_err(|e| anyhow!(e))
}

fn apply_json(cluster: &Cluster, dir: &Path, name: &str, v: &Value) -> Result<()> {
    let f = dir.join(name);
    std::fs::write(&f, serde_json::to_string(v)?)?;
    kubectl(cluster, &["apply", "-f", f.to_str().unwrap()])?;
    Ok(())
}

fn http_ok(port: u16, path: &str) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if write!(s, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").is_err() {
        return false;
    }
    let mut buf = String::new();
    let _ = s.read_to_string(&mut buf);
    buf.starts_with("HTTP/1.1 200") || buf.starts_with("HTTP/1.0 200")
}

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_autoscaler(
    setup: &Setup,
    which: &str,
    bins: &Binaries,
    cluster: &Cluster,
    dir: &Path,
) -> Result<(Proc, u16, &'static str)> {
    let log = std::fs::File::create(dir.join(format!("{which}.log")))?;
    let port = free_port();
    let scaled = |d: Duration| config::scaled(d, setup.scale);
    match which {
        "gpu-node-autoscaler" => {
            let cm = json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "gpu-node-autoscaler-policy", "namespace": "kube-system"},
                "data": {"policy.yaml": setup.our_policy},
            });
            std::fs::write(dir.join("policy.yaml"), &setup.our_policy)?;
            apply_json(cluster, dir, "policy-configmap.json", &cm)?;
            let child = Command::new(bins.ours.as_ref().unwrap())
                .args([
                    "run",
                    "--identity",
                    "anchors",
                    "--listen",
                    &format!("127.0.0.1:{port}"),
                    "--scan-interval",
                    &format!("{}ms", setup.scan_interval.as_millis()),
                    "--lease-duration",
                    "15s",
                    "--lease-retry",
                    "2s",
                ])
                .env("KUBECONFIG", &cluster.controller)
                .env("RUST_LOG", "info,kube=warn,hyper=warn")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .context("starting gpu-node-autoscaler")?;
            Ok((Proc(child), port, "/readyz"))
        }
        "karpenter" => {
            let (bin, crds) = bins.karpenter.as_ref().unwrap();
            kubectl(cluster, &["apply", "-f", crds.to_str().unwrap()])?;
            for crd in [
                "nodepools.karpenter.sh",
                "nodeclaims.karpenter.sh",
                "kwoknodeclasses.karpenter.kwok.sh",
            ] {
                kubectl(
                    cluster,
                    &[
                        "wait",
                        "--for=condition=Established",
                        "--timeout=60s",
                        &format!("crd/{crd}"),
                    ],
                )?;
            }
            apply_json(
                cluster,
                dir,
                "karpenter-objects.json",
                &setup.karpenter_objects,
            )?;
            let types = dir.join("instance-types.json");
            std::fs::write(
                &types,
                serde_json::to_string_pretty(&setup.karpenter_types)?,
            )?;
            let child = Command::new(bin)
                .env("KUBECONFIG", &cluster.admin)
                .env("DISABLE_LEADER_ELECTION", "true")
                .env("INSTANCE_TYPES_FILE_PATH", &types)
                .env("SYSTEM_NAMESPACE", "kube-system")
                .env("METRICS_PORT", free_port().to_string())
                .env("HEALTH_PROBE_PORT", port.to_string())
                .env("BATCH_IDLE_DURATION", scaled(Duration::from_secs(1)))
                .env("BATCH_MAX_DURATION", scaled(Duration::from_secs(10)))
                // Its disruption controller's polling, validation and retry waits, divided like
                // every other duration.
                .env("GNA_TIME_SCALE", setup.scale.to_string())
                .env("LOG_LEVEL", "info")
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .spawn()
                .context("starting karpenter-kwok")?;
            Ok((Proc(child), port, "/readyz"))
        }
        "cluster-autoscaler" => {
            let bin = bins.cluster_autoscaler.as_ref().unwrap();
            apply_json(
                cluster,
                dir,
                "cluster-autoscaler-objects.json",
                &setup.ca.objects,
            )?;
            let child = Command::new(bin)
                .arg(format!("--kubeconfig={}", cluster.admin.display()))
                .arg(format!("--address=127.0.0.1:{port}"))
                .args(&setup.ca.args)
                .arg("--v=2")
                // The kwok provider reads its ConfigMaps from this namespace, through KUBECONFIG.
                .env("POD_NAMESPACE", "kube-system")
                .env("KWOK_PROVIDER_MODE", "local")
                // Its 2 s and 30 s scale-up holds, divided like every other duration.
                .env("GNA_TIME_SCALE", setup.scale.to_string())
                .env("KUBECONFIG", &cluster.admin)
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .spawn()
                .context("starting cluster-autoscaler")?;
            Ok((Proc(child), port, "/health-check"))
        }
        other => bail!("no such autoscaler: {other}"),
    }
}

/// The ResourceSlice NVIDIA's DRA driver would publish for `node` now: once it is Ready, if it
/// belongs to a pool whose GPUs the driver publishes (its pool label, as all three autoscalers'
/// Nodes carry it from their pool's or node group's labels, else our kwok provider's pool
/// annotation, there from its creation).
fn driver_slice(setup: &Setup, node: &Value) -> Result<Option<Value>> {
    let m = &node["metadata"];
    let pool = m["labels"][gpu_node_autoscaler_core::model::labels::POOL]
        .as_str()
        .or(m["annotations"]["kwok.gpu-node-autoscaler.io/pool"].as_str());
    let Some(mig) = pool.and_then(|p| setup.dra_pools.get(p)) else {
        return Ok(None);
    };
    let ready = node["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True");
    if !ready {
        return Ok(None);
    }
    let name = m["name"].as_str().unwrap_or_default();
    let it = m["labels"]["node.kubernetes.io/instance-type"]
        .as_str()
        .unwrap_or_default();
    let devices =
        dra_driver::devices(name, it, mig.as_deref()).map_err(|e| anyhow!("{name}: {e}"))?;
    Ok(Some(dra_driver::resource_slice(
        name,
        m["uid"].as_str().unwrap_or_default(),
        devices,
    )))
}

/// The GPU equivalents of a slice's devices by (pool, device), as an allocation names them: a
/// whole GPU is one, a MIG device its profile's share, as `simulate` counts them.
fn slice_gpus<'a>(
    pool: &'a str,
    slice: &'a Value,
) -> impl Iterator<Item = ((String, String), f64)> + 'a {
    slice["spec"]["devices"]
        .as_array()
        .into_iter()
        .flatten()
        .map(move |d| {
            let share = d["attributes"]["profile"]["string"]
                .as_str()
                .and_then(gpu_node_autoscaler_core::model::gpu::parse_mig_profile)
                .map_or(1.0, |p| p.gpu_share());
            let device = d["name"].as_str().unwrap_or_default().to_string();
            ((pool.to_string(), device), share)
        })
}

/// Runs `which` on a fresh cluster in `dir` and measures it.
pub fn run_one(setup: &Setup, which: &str, bins: &Binaries, dir: &Path) -> Result<Measured> {
    let started = Instant::now();
    let stages = dir.join("kwok-stages.yaml");
    std::fs::write(&stages, &setup.stages)?;
    let cluster = Cluster::start(
        dir,
        &ClusterOptions {
            rbac_from: Some("overlays/kwok"),
            kwok_stages: Some(stages),
            quiet: true,
            // The node lifecycle controller takes the not-ready taint off a Node that turned Ready
            // at its next look: every second instead of five.
            controller_manager_args: std::iter::once("--node-monitor-period=1s".to_string())
                .chain(
                    setup
                        .hpa
                        .iter()
                        .flat_map(|h| h.controller_manager_args.iter().cloned()),
                )
                .collect(),
            // kube-scheduler's retry back-off (1 s, doubling to 10 s) scaled like every other
            // duration, as far as its whole seconds allow (1 s at the least).
            scheduler_backoff_s: Some(config::scheduler_backoff_s(setup.scale)),
            ..Default::default()
        },
    );
    // A CPU node outside every pool, for what asks for no GPU (an MPI launcher): the same for
    // every autoscaler, and not measured.
    apply_json(
        &cluster,
        dir,
        "system-node.json",
        &json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": SYSTEM_NODE, "labels": {"kubernetes.io/hostname": SYSTEM_NODE, "node-role": "system"},
                         "annotations": {"kwok.x-k8s.io/node": "fake"}},
            "status": {"capacity": {"cpu": "64", "memory": "256Gi", "pods": "110"}},
        }),
    )?;
    if !setup.dra_objects.is_empty() {
        apply_json(
            &cluster,
            dir,
            "dra-objects.json",
            &json!({"apiVersion": "v1", "kind": "List", "items": setup.dra_objects}),
        )?;
    }
    if !setup.storage_objects.is_empty() {
        apply_json(
            &cluster,
            dir,
            "storage-objects.json",
            &json!({"apiVersion": "v1", "kind": "List", "items": setup.storage_objects}),
        )?;
    }
    let chain = match &setup.hpa {
        Some(h) => Some(
            Chain::start(&cluster, dir, h.scrape, h.relist)
                .map_err(|e| anyhow!("the HPA chain: {e}"))?,
        ),
        None => None,
    };
    let (mut proc, port, ready) = start_autoscaler(setup, which, bins, &cluster, dir)?;
    let ready_by = Instant::now() + Duration::from_secs(120);
    while !http_ok(port, ready) {
        if let Ok(Some(status)) = proc.0.try_wait() {
            bail!("{which} exited ({status}) before it was ready");
        }
        if Instant::now() > ready_by {
            bail!("{which} was not ready after 2 minutes");
        }
        std::thread::sleep(Duration::from_millis(250));
    }

    let t0 = Instant::now();
    // The real-HPA services: their load from the start, their Deployment and HPA created now.
    let services: &[RealService] = setup.hpa.as_ref().map_or(&[], |h| &h.services);
    let mut services_ended = vec![false; services.len()];
    if let Some(chain) = &chain {
        let mut items = Vec::new();
        for x in services {
            chain
                .exporter
                .set_load(NAMESPACE, &x.name, x.load_at(Duration::ZERO));
            items.push(x.deployment.clone());
            items.push(x.hpa.clone());
        }
        apply_json(
            &cluster,
            dir,
            "services.json",
            &json!({"apiVersion": "v1", "kind": "List", "items": items}),
        )?;
    }
    // The real HPA's replicas by pod name: what was seen of each, and its service.
    let mut replicas: BTreeMap<String, (PodSeen, usize)> = BTreeMap::new();
    // The replicas of the last look (not being deleted), and those still waiting for a node
    // when their service ended.
    let mut replicas_present: HashSet<String> = HashSet::new();
    let mut peak_replicas = 0usize;
    let mut waiting_at_end: HashSet<String> = HashSet::new();
    let mut next_create = 0usize;
    let mut deleted: Vec<bool> = vec![false; setup.pods.len()];
    let index: HashMap<&str, usize> = setup
        .pods
        .iter()
        .enumerate()
        .map(|(i, p)| (p.name.as_str(), i))
        .collect();
    let mut pods: Vec<PodSeen> = (0..setup.pods.len()).map(|_| PodSeen::default()).collect();
    let mut nodes: BTreeMap<String, NodeSeen> = BTreeMap::new();
    let mut failed_looks = 0u32;
    // The machine's 1-minute load average at its highest during the run (the cluster's and the
    // autoscaler's own processes included): how alone the run was.
    let mut load_avg_max: Option<f64> = None;
    // Nodes the DRA driver stand-in has published a ResourceSlice for, and the GPU equivalents
    // of their devices by (pool, device) as an allocation names them.
    let mut published: HashSet<String> = HashSet::new();
    let mut device_gpus: HashMap<(String, String), f64> = HashMap::new();
    // The volumes the provisioner stand-in made (by name), and how many in each zone.
    let mut provisioned: HashSet<String> = HashSet::new();
    let mut volumes_by_zone: BTreeMap<String, usize> = BTreeMap::new();
    let kinds = match (
        setup.dra_objects.is_empty(),
        setup.storage_objects.is_empty(),
    ) {
        (true, true) => "nodes,pods",
        (false, true) => "nodes,pods,resourceclaims",
        (true, false) => "nodes,pods,persistentvolumeclaims",
        (false, false) => "nodes,pods,resourceclaims,persistentvolumeclaims",
    };
    loop {
        let now = t0.elapsed();
        if let Ok(Some(status)) = proc.0.try_wait() {
            bail!("{which} exited ({status}) during the replay");
        }
        if let Some(c) = cluster.exited() {
            bail!("the control plane's {c} exited during the replay");
        }
        // Arrivals, in one create per batch.
        let mut batch = Vec::new();
        while next_create < setup.pods.len() && setup.pods[next_create].arrival <= now {
            batch.push(setup.pods[next_create].object.clone());
            pods[next_create].created = Some(t0.elapsed());
            next_create += 1;
        }
        if !batch.is_empty() {
            let f = dir.join("arrivals.json");
            std::fs::write(
                &f,
                json!({"apiVersion": "v1", "kind": "List", "items": batch}).to_string(),
            )?;
            kubectl(&cluster, &["create", "-f", f.to_str().unwrap()])?;
        }
        // The services' load now; a service past its end is deleted with its HPA.
        if let Some(chain) = &chain {
            for (k, x) in services.iter().enumerate() {
                if services_ended[k] {
                    continue;
                }
                if now >= x.until {
                    kubectl(
                        &cluster,
                        &[
                            "delete",
                            "-n",
                            NAMESPACE,
                            "--wait=false",
                            "--ignore-not-found",
                            &format!("hpa/{}", x.name),
                            &format!("deployment/{}", x.name),
                        ],
                    )?;
                    chain.exporter.set_load(NAMESPACE, &x.name, 0.0);
                    services_ended[k] = true;
                    for (name, (p, svc)) in &replicas {
                        if *svc == k && p.running.is_none() && replicas_present.contains(name) {
                            waiting_at_end.insert(name.clone());
                        }
                    }
                } else {
                    chain.exporter.set_load(NAMESPACE, &x.name, x.load_at(now));
                }
            }
        }
        // Replicas removed (an HPA scaling in, or a replica that has run its time).
        let due: Vec<usize> = (0..next_create)
            .filter(|&i| {
                let w = &setup.pods[i];
                !deleted[i]
                    && (w.delete_at.is_some_and(|d| d <= now)
                        || w.run_for.is_some_and(|r| pods[i].ran >= r))
            })
            .collect();
        if !due.is_empty() {
            let mut args = vec![
                "delete",
                "-n",
                NAMESPACE,
                "--wait=false",
                "--ignore-not-found",
            ];
            args.extend(due.iter().map(|&i| setup.pods[i].resource.as_str()));
            kubectl(&cluster, &args)?;
            for i in due {
                deleted[i] = true;
                pods[i].finished.get_or_insert(t0.elapsed());
            }
        }
        // What the API server shows.
        let seen_at = t0.elapsed();
        if let Some(l) = load_average() {
            load_avg_max = Some(load_avg_max.map_or(l, |m: f64| m.max(l)));
        }
        // A loaded API server sometimes fails a list (a TLS handshake timeout): that look is
        // skipped, and only a run of failures (10 s of wall time) ends the run.
        let listed = kubectl(&cluster, &["get", kinds, "-n", NAMESPACE, "-o", "json"])
            .and_then(|out| Ok(serde_json::from_str::<Value>(&out)?));
        let v = match listed {
            Ok(v) => {
                failed_looks = 0;
                v
            }
            Err(e) => {
                failed_looks += 1;
                if failed_looks * POLL >= Duration::from_secs(10) {
                    return Err(e.context(format!(
                        "{failed_looks} looks at the API server in a row failed"
                    )));
                }
                std::thread::sleep(POLL);
                continue;
            }
        };
        let mut present = HashSet::new();
        let mut running_now = vec![false; setup.pods.len()];
        let mut running_replicas: HashSet<String> = HashSet::new();
        let mut to_label: Vec<(String, String)> = Vec::new();
        replicas_present.clear();
        let mut slices = Vec::new();
        let mut pod_index: HashMap<String, usize> = HashMap::new();
        for o in v["items"].as_array().into_iter().flatten() {
            let name = o["metadata"]["name"].as_str().unwrap_or("").to_string();
            if o["kind"] == "Node" && name != SYSTEM_NODE {
                present.insert(name.clone());
                if !published.contains(&name) {
                    if let Some(slice) = driver_slice(setup, o)? {
                        device_gpus.extend(slice_gpus(&name, &slice));
                        slices.push(slice);
                        published.insert(name.clone());
                    }
                }
                let labels = &o["metadata"]["labels"];
                let ct = [
                    &labels["karpenter.sh/capacity-type"],
                    &labels["gpu-node-autoscaler.io/capacity-type"],
                    &o["metadata"]["annotations"]["kwok.gpu-node-autoscaler.io/capacity-type"],
                ]
                .iter()
                .find_map(|v| v.as_str().and_then(CapacityType::parse));
                let instance_type = labels["node.kubernetes.io/instance-type"]
                    .as_str()
                    .unwrap_or("")
                    .to_string();
                // With the real HPA chain, GPU feature discovery's product label on every NVIDIA
                // GPU Node, whoever launched it (the dcgm-exporter stand-in reports the GPUs of
                // labelled Nodes, as the real exporter runs on the GPU Nodes GFD labelled).
                if setup.hpa.is_some() && labels[NVIDIA_PRODUCT].is_null() {
                    if let Some(g) = setup
                        .catalog
                        .instance_type(&instance_type)
                        .and_then(|t| t.gpu.as_ref())
                        .filter(|g| g.vendor == GpuVendor::Nvidia)
                    {
                        to_label.push((name.clone(), nvidia_product_label(&g.model, g.memory_mib)));
                    }
                }
                // The instance type's GPUs (Karpenter's kwok Nodes advertise only what their
                // NodeClaim asked for as capacity), else what the Node advertises.
                let gpus: i64 = match setup.catalog.instance_type(&instance_type) {
                    Some(t) => t.gpu.as_ref().map_or(0, |g| i64::from(g.count)),
                    None => ["nvidia.com/gpu", "amd.com/gpu"]
                        .iter()
                        .filter_map(|r| o["status"]["capacity"][r].as_str()?.parse::<i64>().ok())
                        .sum(),
                };
                let zone = labels[ZONE].as_str().map(str::to_string);
                let n = nodes.entry(name).or_insert_with(|| NodeSeen {
                    instance_type,
                    zone,
                    capacity_type: ct,
                    gpus,
                    first: seen_at,
                    last: seen_at,
                    gone: false,
                });
                n.last = seen_at;
                n.capacity_type = n.capacity_type.or(ct);
                n.gpus = n.gpus.max(gpus);
            } else if let (true, Some(k)) = (
                o["kind"] == "Pod",
                o["metadata"]["labels"][SERVICE]
                    .as_str()
                    .and_then(|svc| services.iter().position(|x| x.name == svc)),
            ) {
                // A replica of the real HPA: waited for from the first look that saw it.
                let (p, _) = replicas.entry(name.clone()).or_insert_with(|| {
                    (
                        PodSeen {
                            created: Some(seen_at),
                            ..PodSeen::default()
                        },
                        k,
                    )
                });
                let phase = o["status"]["phase"].as_str().unwrap_or("");
                if phase == "Running" {
                    p.running.get_or_insert(seen_at);
                    if p.node.is_none() {
                        p.node = o["spec"]["nodeName"].as_str().map(str::to_string);
                    }
                }
                if o["metadata"]["deletionTimestamp"].is_null() {
                    // `finished` is a replica's last look.
                    p.finished = Some(seen_at);
                    replicas_present.insert(name.clone());
                    if phase == "Running" {
                        running_replicas.insert(name.clone());
                    }
                }
            } else if let (true, Some(&i)) = (
                o["kind"] == "Pod",
                o["metadata"]["labels"][WORKLOAD]
                    .as_str()
                    .and_then(|w| index.get(w)),
            ) {
                if let Some(pod) = o["metadata"]["name"].as_str() {
                    pod_index.insert(pod.to_string(), i);
                }
                let phase = o["status"]["phase"].as_str().unwrap_or("");
                let p = &mut pods[i];
                if phase == "Running" || phase == "Succeeded" {
                    p.running.get_or_insert(seen_at);
                    if p.node.is_none() {
                        p.node = o["spec"]["nodeName"].as_str().map(str::to_string);
                    }
                }
                if phase == "Running" && o["metadata"]["deletionTimestamp"].is_null() {
                    running_now[i] = true;
                }
                // A Job's pod that completed ends the Job (an evicted one is replaced).
                if phase == "Succeeded" {
                    p.finished.get_or_insert(seen_at);
                }
            }
        }
        // The provisioner stand-in: a volume in its node's zone for each claim the scheduler
        // selected a node for.
        let mut volumes = Vec::new();
        for (claim, node) in provisioner::selected_claims(&v) {
            let zone = v["items"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|o| o["kind"] == "Node" && o["metadata"]["name"] == node)
                .and_then(|o| o["metadata"]["labels"][ZONE].as_str());
            let Some(zone) = zone else { continue };
            if let Some(pv) = provisioner::volume_for(claim, zone) {
                let name = pv["metadata"]["name"].as_str().unwrap_or("").to_string();
                if provisioned.insert(name) {
                    *volumes_by_zone.entry(zone.to_string()).or_default() += 1;
                    volumes.push(pv);
                }
            }
        }
        if !volumes.is_empty() {
            let f = dir.join("volumes.json");
            std::fs::write(
                &f,
                json!({"apiVersion": "v1", "kind": "List", "items": volumes}).to_string(),
            )?;
            kubectl(&cluster, &["create", "-f", f.to_str().unwrap()])?;
        }
        // The devices allocated to the claims of the pods they are reserved for.
        for c in v["items"].as_array().into_iter().flatten() {
            if c["kind"] != "ResourceClaim" {
                continue;
            }
            let gpus: f64 = c["status"]["allocation"]["devices"]["results"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|r| {
                    let key = (
                        r["pool"].as_str()?.to_string(),
                        r["device"].as_str()?.to_string(),
                    );
                    device_gpus.get(&key)
                })
                .sum();
            for r in c["status"]["reservedFor"].as_array().into_iter().flatten() {
                if let Some(&i) = r["name"].as_str().and_then(|n| pod_index.get(n)) {
                    pods[i].claimed_gpus = pods[i].claimed_gpus.max(gpus);
                }
            }
        }
        if !slices.is_empty() {
            let f = dir.join("slices.json");
            std::fs::write(
                &f,
                json!({"apiVersion": "v1", "kind": "List", "items": slices}).to_string(),
            )?;
            kubectl(&cluster, &["create", "-f", f.to_str().unwrap()])?;
        }
        for (node, product) in to_label {
            // A Node deleted meanwhile is no error.
            let _ = kubectl(
                &cluster,
                &[
                    "label",
                    "node",
                    &node,
                    &format!("{NVIDIA_PRODUCT}={product}"),
                ],
            );
        }
        for (name, n) in nodes.iter_mut() {
            if !present.contains(name) {
                n.gone = true;
            }
        }
        for (i, p) in pods.iter_mut().enumerate().take(next_create) {
            if running_now[i] && p.finished.is_none() {
                if let Some(t) = p.running_at {
                    p.ran += seen_at.saturating_sub(t);
                }
                p.running_at = Some(seen_at);
            } else {
                p.running_at = None;
            }
        }
        peak_replicas = peak_replicas.max(replicas_present.len());
        for (name, (p, _)) in replicas.iter_mut() {
            if running_replicas.contains(name) {
                if let Some(t) = p.running_at {
                    p.ran += seen_at.saturating_sub(t);
                }
                p.running_at = Some(seen_at);
            } else {
                p.running_at = None;
            }
        }
        let all_done = next_create == setup.pods.len()
            && pods.iter().all(|p| p.finished.is_some())
            && services_ended.iter().all(|&e| e);
        let fleet_gone = nodes.values().all(|n| n.gone);
        if (all_done && fleet_gone && !nodes.is_empty()) || now > setup.deadline {
            break;
        }
        std::thread::sleep(
            POLL.saturating_sub(seen_at.saturating_sub(now))
                .max(Duration::from_millis(50)),
        );
    }
    let end = t0.elapsed();
    drop(proc);

    // Measures, in the scenario's time.
    let model = |d: Duration| d.as_secs_f64() * setup.scale;
    let mut cost = 0.0;
    let mut by_offering: BTreeMap<String, f64> = BTreeMap::new();
    let mut unpriced = Vec::new();
    let mut node_gpu_s = 0.0;
    for (name, n) in &nodes {
        let life = model(if n.gone { n.last } else { end }.saturating_sub(n.first));
        node_gpu_s += life * n.gpus as f64;
        let ct = n.capacity_type.unwrap_or(CapacityType::OnDemand);
        match config::price(&setup.catalog, &n.instance_type, ct) {
            Some(p) => {
                let c = p * life / 3600.0;
                cost += c;
                *by_offering
                    .entry(format!("{}/{}", n.instance_type, ct))
                    .or_default() += c;
            }
            None => unpriced.push(name.clone()),
        }
    }
    // Every pod measured: the workload's, then the real HPA's replicas, with their GPUs.
    let all: Vec<(&str, &PodSeen, f64)> = setup
        .pods
        .iter()
        .zip(&pods)
        .map(|(w, p)| (w.name.as_str(), p, w.gpus + p.claimed_gpus))
        .chain(
            replicas
                .iter()
                .map(|(name, (p, k))| (name.as_str(), p, services[*k].gpus)),
        )
        .collect();
    let mut waited: Vec<(f64, usize)> = all
        .iter()
        .enumerate()
        .filter_map(|(i, (_, p, _))| Some((model(p.running?.saturating_sub(p.created?)), i)))
        .collect();
    waited.sort_by(|a, b| a.0.total_cmp(&b.0));
    let waits: Vec<f64> = waited.iter().map(|w| w.0).collect();
    // The longest waits, for finding out why (the tail is a few pods in a hundred).
    let longest_waits = waited
        .iter()
        .rev()
        .take(LONGEST_WAITS)
        .map(|&(w, i)| LongWait {
            workload: all[i].0.to_string(),
            wait_s: w,
            node: all[i].1.node.clone().unwrap_or_default(),
        })
        .collect();
    let mut volume_pods_by_zone: BTreeMap<String, usize> = BTreeMap::new();
    for (w, p) in setup.pods.iter().zip(&pods) {
        let zone = p
            .node
            .as_ref()
            .and_then(|n| nodes.get(n))
            .and_then(|n| n.zone.clone());
        if let (true, Some(z)) = (w.volumes, zone) {
            *volume_pods_by_zone.entry(z).or_default() += 1;
        }
    }
    let pod_gpu_s: f64 = all.iter().map(|(_, p, g)| model(p.ran) * g).sum();
    let first_pod = all.iter().filter_map(|(_, p, _)| p.created).min();
    let first_node = nodes.values().map(|n| n.first).min();
    Ok(Measured {
        autoscaler: which.to_string(),
        cost_usd: cost,
        wait_p50_s: percentile(&waits, 0.50),
        wait_p95_s: percentile(&waits, 0.95),
        wait_p99_s: percentile(&waits, 0.99),
        longest_waits,
        gpu_allocation: if node_gpu_s > 0.0 {
            pod_gpu_s / node_gpu_s
        } else {
            0.0
        },
        first_node_s: match (first_pod, first_node) {
            (Some(p), Some(n)) => Some(model(n.saturating_sub(p))),
            _ => None,
        },
        nodes_launched: nodes.len(),
        pods: all.len(),
        // A replica the HPA removed before it ran was demand that went away, not a pod left
        // without a node; one that still waited when its service ended was not placed.
        pods_never_placed: pods.iter().filter(|p| p.running.is_none()).count()
            + waiting_at_end.len(),
        hpa_replicas: (!services.is_empty()).then(|| HpaSeen {
            made: replicas.len(),
            never_ran: replicas
                .values()
                .filter(|(p, _)| p.running.is_none())
                .count(),
            replica_hours: replicas
                .values()
                .filter_map(|(p, _)| Some(model(p.finished?.saturating_sub(p.created?))))
                .sum::<f64>()
                / 3600.0,
            peak: peak_replicas,
        }),
        cost_by_offering: by_offering,
        wall_s: started.elapsed().as_secs_f64(),
        unpriced_nodes: unpriced,
        volume_pods_by_zone,
        volumes_by_zone,
        load_avg_max,
    })
}

/// One scenario's results.
pub struct Report {
    pub scenario: String,
    pub time_scale: f64,
    /// Runs per autoscaler.
    pub repetitions: usize,
    /// The services were scaled by the real HPA chain (else their replicas are the model's):
    /// what the model made of them, for comparison.
    pub real_hpa: Option<HpaModelSeen>,
    /// The scenario's time from a Node's creation to its being Ready with its GPUs.
    pub boot_s: f64,
    pub not_replayed: Vec<String>,
    pub results: Vec<Measured>,
    /// Autoscalers whose run failed, with the reason (the others' results are kept).
    pub failed: Vec<(String, String)>,
}

fn round(x: f64, places: i32) -> f64 {
    let f = 10f64.powi(places);
    (x * f).round() / f
}

/// The shape of `simulate --format json`: per scenario, `"strategies"` with `cost_usd`,
/// `wait_p95_s`, ...
pub fn to_json(reports: &[Report], bins: &Binaries) -> Value {
    json!({
        "versions": bins.versions,
        "builds": bins.builds,
        "control_plane": gpu_node_autoscaler_test_support::cluster::KUBERNETES_VERSION,
        "scenarios": reports.iter().map(|r| json!({
            "name": r.scenario,
            "time_scale": r.time_scale,
            "repetitions": r.repetitions,
            "hpa": if r.real_hpa.is_some() { "real" } else { "model" },
            "hpa_model": r.real_hpa.map(|m| json!({
                "replicas": m.replicas,
                "replica_hours": round(m.replica_hours, 2),
                "peak_replicas": m.peak,
            })),
            "node_ready_after_s": r.boot_s,
            "not_replayed": r.not_replayed,
            "failed": r.failed.iter().map(|(a, e)| json!({"strategy": a, "error": e})).collect::<Vec<_>>(),
            "strategies": strategies_json(&r.results),
        })).collect::<Vec<_>>(),
    })
}

/// One run's figures.
fn run_json(m: &Measured) -> Value {
    let mut v = json!({
                "strategy": m.autoscaler,
                "cost_usd": round(m.cost_usd, 2),
                "wait_p50_s": round(m.wait_p50_s, 1),
                "wait_p95_s": round(m.wait_p95_s, 1),
                "wait_p99_s": round(m.wait_p99_s, 1),
                "longest_waits": m.longest_waits.iter().map(|w| json!({
                    "workload": w.workload, "wait_s": round(w.wait_s, 1), "node": w.node,
                })).collect::<Vec<_>>(),
                "gpu_allocation": round(m.gpu_allocation, 3),
                "first_node_s": m.first_node_s.map(|x| round(x, 1)),
                "nodes_launched": m.nodes_launched,
                "pods": m.pods,
                "pods_never_placed": m.pods_never_placed,
                "hpa_replicas": m.hpa_replicas.as_ref().map(|r| r.made),
                "hpa_replicas_never_running": m.hpa_replicas.as_ref().map(|r| r.never_ran),
                "hpa_replica_hours": m.hpa_replicas.as_ref().map(|r| round(r.replica_hours, 2)),
                "hpa_peak_replicas": m.hpa_replicas.as_ref().map(|r| r.peak),
                "cost_by_offering": m.cost_by_offering.iter().map(|(k, v)| (k.clone(), round(*v, 2))).collect::<BTreeMap<_, _>>(),
                "unpriced_nodes": m.unpriced_nodes,
                "wall_s": round(m.wall_s, 1),
                "load_avg_max": m.load_avg_max.map(|l| round(l, 2)),
    });
    // Only for a workload with volumes.
    if !(m.volume_pods_by_zone.is_empty() && m.volumes_by_zone.is_empty()) {
        v["volume_pods_by_zone"] = json!(m.volume_pods_by_zone);
        v["volumes_by_zone"] = json!(m.volumes_by_zone);
    }
    v
}

/// The runs of each autoscaler (in the order they first ran): one run as it is; several as the
/// mean of every figure (a count stays an integer when every run had the same), the least and
/// the most of the main figures (`cost_usd_min`, `cost_usd_max`, ...), and every run under `runs`.
pub fn strategies_json(results: &[Measured]) -> Vec<Value> {
    let mut order: Vec<&str> = Vec::new();
    for m in results {
        if !order.contains(&m.autoscaler.as_str()) {
            order.push(&m.autoscaler);
        }
    }
    order
        .into_iter()
        .map(|a| {
            let runs: Vec<Value> = results
                .iter()
                .filter(|m| m.autoscaler == a)
                .map(run_json)
                .collect();
            aggregate(&runs)
        })
        .collect()
}

fn aggregate(runs: &[Value]) -> Value {
    let mut out = runs[0].clone();
    out["repetitions"] = json!(runs.len());
    if runs.len() == 1 {
        return out;
    }
    let obj = out.as_object_mut().unwrap();
    for (k, v) in obj.iter_mut() {
        let nums: Vec<&Value> = runs.iter().map(|r| &r[k.as_str()]).collect();
        if k == "cost_by_offering" {
            let mut sum: BTreeMap<String, f64> = BTreeMap::new();
            for r in &nums {
                for (o, c) in r.as_object().into_iter().flatten() {
                    *sum.entry(o.clone()).or_default() += c.as_f64().unwrap_or(0.0);
                }
            }
            *v = json!(sum
                .into_iter()
                .map(|(o, c)| (o, round(c / runs.len() as f64, 2)))
                .collect::<BTreeMap<_, _>>());
        } else if nums.iter().all(|x| x.is_number()) {
            let f: Vec<f64> = nums.iter().filter_map(|x| x.as_f64()).collect();
            let same_int = nums.iter().all(|x| x.is_u64() && *x == nums[0]);
            if !same_int {
                *v = json!(round(f.iter().sum::<f64>() / f.len() as f64, 3));
            }
        }
    }
    for k in [
        "cost_usd",
        "wait_p50_s",
        "wait_p95_s",
        "wait_p99_s",
        "gpu_allocation",
        "nodes_launched",
        "pods_never_placed",
        "load_avg_max",
    ] {
        let f: Vec<f64> = runs.iter().filter_map(|r| r[k].as_f64()).collect();
        if f.len() == runs.len() {
            out[format!("{k}_min")] = json!(f.iter().copied().fold(f64::INFINITY, f64::min));
            out[format!("{k}_max")] = json!(f.iter().copied().fold(f64::NEG_INFINITY, f64::max));
        }
    }
    out["runs"] = json!(runs);
    out
}

pub fn to_table(reports: &[Report], bins: &Binaries) -> String {
    let mut out = String::new();
    let versions: Vec<String> = bins
        .versions
        .iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    out.push_str(&format!(
        "real control plane {}; {}\n",
        gpu_node_autoscaler_test_support::cluster::KUBERNETES_VERSION,
        versions.join(", ")
    ));
    for r in reports {
        out.push_str(&format!(
            "\n{} (time compressed {}x; nodes Ready {:.0} s after creation; {}; figures in the scenario's time)\n",
            r.scenario,
            r.time_scale,
            r.boot_s,
            if r.real_hpa.is_some() {
                "services scaled by the real HPA"
            } else {
                "the services' replicas from the simulator's HPA model"
            }
        ));
        out.push_str(&format!(
            "{:<22} {:>10} {:>9} {:>9} {:>9} {:>8} {:>11} {:>6} {:>8}\n",
            "autoscaler",
            "cost $",
            "wait p50",
            "wait p95",
            "wait p99",
            "GPU use",
            "first node",
            "nodes",
            "unplaced"
        ));
        for m in &r.results {
            out.push_str(&format!(
                "{:<22} {:>10.2} {:>8.0}s {:>8.0}s {:>8.0}s {:>7.1}% {:>10} {:>6} {:>8}\n",
                m.autoscaler,
                m.cost_usd,
                m.wait_p50_s,
                m.wait_p95_s,
                m.wait_p99_s,
                m.gpu_allocation * 100.0,
                m.first_node_s.map_or("-".into(), |s| format!("{s:.0}s")),
                m.nodes_launched,
                m.pods_never_placed,
            ));
            if let Some(h) = &m.hpa_replicas {
                out.push_str(&format!(
                    "{:<22} the HPA made {} replicas (at most {} at once, {:.2} replica-hours); {} never ran (scaled in before a node came, or waiting at the service's end)\n",
                    "", h.made, h.peak, h.replica_hours, h.never_ran
                ));
            }
        }
        if let Some(m) = &r.real_hpa {
            out.push_str(&format!(
                "  the simulator's HPA model made {} replicas of the same services (at most {} at once, {:.2} replica-hours)\n",
                m.replicas, m.peak, m.replica_hours
            ));
        }
        for n in &r.not_replayed {
            out.push_str(&format!("  not replayed: {n}\n"));
        }
        for (a, e) in &r.failed {
            out.push_str(&format!("  failed: {a}: {e}\n"));
        }
    }
    out
}

/// The runs an entry of `"strategies"` holds: those under `runs` when it sums up several, else
/// the entry itself.
fn runs_of(entry: &Value) -> Vec<Value> {
    match entry["runs"].as_array() {
        Some(runs) => runs.clone(),
        None => {
            let mut run = entry.clone();
            if let Some(o) = run.as_object_mut() {
                o.remove("repetitions");
            }
            vec![run]
        }
    }
}

/// Several `anchors --format json` outputs (file name, JSON) as one: a round run a scenario or a
/// repetition at a time. A scenario (by name, time scale and HPA) that several files hold gets
/// all their runs, summed up as `--repeat` sums them up. The files must come from the same builds
/// and control plane, else the error names the two that differ.
pub fn merge(files: &[(String, Value)]) -> Result<Value> {
    let Some((first_name, first)) = files.first() else {
        bail!("no file to make the table from");
    };
    for (name, v) in files {
        if v["builds"].is_null() {
            bail!("{name}: no \"builds\" (an output of an older anchors?)");
        }
        for key in ["builds", "control_plane"] {
            if v[key] != first[key] {
                bail!(
                    "{first_name} and {name} come from different {}: {} against {}",
                    if key == "builds" {
                        "builds"
                    } else {
                        "control planes"
                    },
                    first[key],
                    v[key]
                );
            }
        }
    }
    // Per scenario: its first entry, per autoscaler (in the order they first ran) its runs, and
    // the runs that failed.
    type Key = (String, String, String);
    type Runs = Vec<(String, Vec<Value>)>;
    let mut order: Vec<Key> = Vec::new();
    let mut merged: BTreeMap<Key, (Value, Runs, Vec<Value>)> = BTreeMap::new();
    for (name, v) in files {
        let scenarios = v["scenarios"]
            .as_array()
            .ok_or_else(|| anyhow!("{name}: no \"scenarios\""))?;
        for sc in scenarios {
            let key = (
                sc["name"].as_str().unwrap_or("?").to_string(),
                sc["time_scale"].to_string(),
                sc["hpa"].as_str().unwrap_or("model").to_string(),
            );
            let (_, strategies, failed) = merged.entry(key.clone()).or_insert_with(|| {
                order.push(key.clone());
                (sc.clone(), Vec::new(), Vec::new())
            });
            for entry in sc["strategies"].as_array().into_iter().flatten() {
                let who = entry["strategy"].as_str().unwrap_or("?").to_string();
                let runs = runs_of(entry);
                match strategies.iter_mut().find(|(a, _)| *a == who) {
                    Some((_, r)) => r.extend(runs),
                    None => strategies.push((who, runs)),
                }
            }
            failed.extend(sc["failed"].as_array().into_iter().flatten().cloned());
        }
    }
    let scenarios: Vec<Value> = order
        .iter()
        .map(|k| {
            let (sc, strategies, failed) = &merged[k];
            let mut sc = sc.clone();
            let runs = strategies.iter().map(|(_, r)| r.len()).max().unwrap_or(0);
            sc["repetitions"] = json!(runs);
            sc["strategies"] = json!(strategies
                .iter()
                .map(|(_, r)| aggregate(r))
                .collect::<Vec<_>>());
            sc["failed"] = json!(failed);
            sc
        })
        .collect();
    Ok(json!({
        "versions": first["versions"],
        "builds": first["builds"],
        "control_plane": first["control_plane"],
        "scenarios": scenarios,
    }))
}

/// The Markdown table of an `anchors --format json` output, as docs/benchmarks.md shows it: the
/// builds and the control plane first, then a row per scenario and autoscaler with the mean and,
/// over several repetitions, the least and the most.
pub fn markdown(json: &Value) -> Result<String> {
    let mut out = String::new();
    let builds = json["builds"]
        .as_object()
        .ok_or_else(|| anyhow!("no \"builds\" (an output of an older anchors?)"))?;
    out.push_str(&format!(
        "Control plane {}. Builds:\n\n",
        json["control_plane"].as_str().unwrap_or("?")
    ));
    for (name, b) in builds {
        out.push_str(&format!(
            "- {name} {}: {}; {}\n",
            b["version"].as_str().unwrap_or("?"),
            b["commit"].as_str().unwrap_or("?"),
            b["profile"].as_str().unwrap_or("?")
        ));
    }
    out.push_str(
        "\n| scenario | autoscaler | runs | cost | cost min–max | wait p50 | wait p95 | wait p95 min–max | GPU allocation | nodes | never placed |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    let scenarios = json["scenarios"]
        .as_array()
        .ok_or_else(|| anyhow!("no \"scenarios\""))?;
    for sc in scenarios {
        let name = sc["name"].as_str().unwrap_or("?");
        let hpa = if sc["hpa"] == "real" {
            " (real HPA)"
        } else {
            ""
        };
        let strategies = sc["strategies"].as_array().cloned().unwrap_or_default();
        let cheapest = strategies
            .iter()
            .filter_map(|m| m["cost_usd"].as_f64())
            .fold(f64::INFINITY, f64::min);
        for m in &strategies {
            let f = |k: &str| m[k].as_f64();
            let range = |k: &str, unit: &str, dp: usize| match (
                f(&format!("{k}_min")),
                f(&format!("{k}_max")),
            ) {
                (Some(a), Some(b)) => format!("{unit}{a:.dp$}–{unit}{b:.dp$}"),
                _ => "—".to_string(),
            };
            let cost = f("cost_usd").unwrap_or(f64::NAN);
            let bold = if cost == cheapest { "**" } else { "" };
            out.push_str(&format!(
                "| {name}{hpa} | {bold}{}{bold} | {} | {bold}${cost:.2}{bold} | {} | {:.0} s | {:.0} s | {} | {:.1} % | {} | {} |\n",
                m["strategy"].as_str().unwrap_or("?"),
                m["repetitions"].as_u64().unwrap_or(1),
                range("cost_usd", "$", 2),
                f("wait_p50_s").unwrap_or(f64::NAN),
                f("wait_p95_s").unwrap_or(f64::NAN),
                range("wait_p95_s", "", 0),
                f("gpu_allocation").unwrap_or(f64::NAN) * 100.0,
                m["nodes_launched"],
                m["pods_never_placed"],
            ));
        }
        for fl in sc["failed"].as_array().into_iter().flatten() {
            out.push_str(&format!(
                "| {name}{hpa} | {} | failed | {} | | | | | | | |\n",
                fl["strategy"].as_str().unwrap_or("?"),
                fl["error"].as_str().unwrap_or("?").replace('|', "/")
            ));
        }
    }
    // How alone the runs were: their highest 1-minute load averages.
    let loads: Vec<f64> = scenarios
        .iter()
        .flat_map(|sc| sc["strategies"].as_array().cloned().unwrap_or_default())
        .flat_map(|m| runs_of(&m))
        .filter_map(|r| r["load_avg_max"].as_f64())
        .collect();
    if !loads.is_empty() {
        out.push_str(&format!(
            "\nThe machine's highest 1-minute load average during a run (its own cluster and autoscaler included): {:.2} to {:.2} over {} runs.\n",
            loads.iter().copied().fold(f64::INFINITY, f64::min),
            loads.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            loads.len()
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_node_stage_gets_the_boot_delay() {
        let s = std::fs::read_to_string(KWOK_STAGES).unwrap();
        let out = with_node_delay(&s, Duration::from_millis(4500)).unwrap();
        let i = out.find("name: node-initialize").unwrap();
        assert!(out[i..].contains("spec:\n  delay:\n    durationMilliseconds: 4500\n"));
        // From the Node's creation: what is left of the 4.5 s, as kwok reads a duration.
        assert!(out[i..].contains(
            "    durationFrom:\n      jq:\n        expression: '\"\\(((.metadata.creationTimestamp | fromdate) * 1000 + 4500 - now * 1000) | floor)ms\"'\n"
        ), "{}", &out[i..]);
        let stages = gpu_node_autoscaler_core::yaml::parse_all(&out).unwrap();
        let init = stages
            .iter()
            .find(|d| d["metadata"]["name"] == "node-initialize")
            .unwrap();
        assert_eq!(
            init["spec"]["delay"]["durationFrom"]["jq"]["expression"],
            "\"\\(((.metadata.creationTimestamp | fromdate) * 1000 + 4500 - now * 1000) | floor)ms\""
        );
        assert!(with_node_delay("kind: Stage\n", Duration::ZERO).is_err());
    }

    /// Each workload pod is owned by a controller, as users run them: the Cluster Autoscaler
    /// drains no node with a bare Pod, and our consolidation moves only controller-owned pods.
    #[test]
    fn workload_pods_are_owned_by_a_job_or_a_replica_set() {
        let text = std::fs::read_to_string(
            Path::new(REPO).join("simulations/scenarios/bursty-inference-hpa.yaml"),
        )
        .unwrap();
        let s = gpu_node_autoscaler_sim::scenario::parse_scenario(&text, "b.yaml").unwrap();
        let job = s
            .pods
            .iter()
            .find(|w| w.pod.owner.as_ref().unwrap().kind == OwnerKind::Job)
            .unwrap();
        let o = workload_object(&job.pod, "j-0", Some(Duration::from_secs(30)), false).unwrap();
        assert_eq!(o["kind"], "Job");
        let t = &o["spec"]["template"];
        assert_eq!(t["metadata"]["labels"][WORKLOAD], "j-0");
        assert_eq!(t["metadata"]["annotations"][RUN_DURATION], "30000ms");
        assert_eq!(t["spec"]["restartPolicy"], "Never");
        let replica = s
            .pods
            .iter()
            .find(|w| w.pod.owner.as_ref().unwrap().kind == OwnerKind::ReplicaSet)
            .unwrap();
        let o = workload_object(&replica.pod, "r-0", Some(Duration::from_secs(30)), true).unwrap();
        assert_eq!(o["kind"], "ReplicaSet");
        assert_eq!(o["spec"]["selector"]["matchLabels"][WORKLOAD], "r-0");
        let t = &o["spec"]["template"];
        assert_eq!(t["metadata"]["labels"][WORKLOAD], "r-0");
        assert!(t["metadata"]["annotations"][RUN_DURATION].is_null());
        assert_eq!(t["spec"]["restartPolicy"], "Always");
    }

    #[test]
    fn a_product_built_without_its_timers_scaled_is_refused() {
        let dir = std::env::temp_dir().join(format!("gna-anchors-stamp-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let bin = dir.join("karpenter-kwok");
        std::fs::write(&bin, "").unwrap();
        let e = require_scaled(&bin, ".stamp", "disruption timers", "karpenter").unwrap_err();
        assert!(
            e.to_string()
                .contains("without its disruption timers scaled by the time scale: `bash scripts/anchors.sh karpenter`"),
            "{e}"
        );
        std::fs::write(dir.join(".stamp"), "").unwrap();
        require_scaled(&bin, ".stamp", "disruption timers", "karpenter").unwrap();
        std::fs::remove_dir_all(dir).unwrap();
    }

    fn measured(autoscaler: &str, cost: f64, p95: f64, nodes: usize) -> Measured {
        Measured {
            autoscaler: autoscaler.into(),
            cost_usd: cost,
            wait_p50_s: p95 / 2.0,
            wait_p95_s: p95,
            wait_p99_s: p95,
            longest_waits: Vec::new(),
            gpu_allocation: 0.9,
            first_node_s: Some(10.0),
            nodes_launched: nodes,
            pods: 6,
            pods_never_placed: 0,
            hpa_replicas: None,
            cost_by_offering: [("g5.xlarge/spot".to_string(), cost)].into(),
            wall_s: 100.0,
            unpriced_nodes: Vec::new(),
            volume_pods_by_zone: BTreeMap::new(),
            volumes_by_zone: BTreeMap::new(),
            load_avg_max: Some(1.5),
        }
    }

    /// Several runs of an autoscaler give each figure's mean (a count the runs agree on stays an
    /// integer), the least and the most of the main ones, and every run; the Markdown table is
    /// made from that JSON alone, the cheapest mean in bold, with the builds' commits.
    #[test]
    fn repeated_runs_are_summarised_and_the_table_is_made_from_the_json() {
        let runs = [
            measured("ours", 1.0, 100.0, 4),
            measured("peer", 5.0, 90.0, 3),
            measured("ours", 3.0, 120.0, 4),
        ];
        let s = strategies_json(&runs);
        assert_eq!(s.len(), 2);
        let ours = &s[0];
        assert_eq!(ours["strategy"], "ours");
        assert_eq!(ours["repetitions"], 2);
        assert_eq!(ours["cost_usd"], 2.0);
        assert_eq!(ours["cost_usd_min"], 1.0);
        assert_eq!(ours["cost_usd_max"], 3.0);
        assert_eq!(ours["wait_p95_s"], 110.0);
        assert_eq!(ours["nodes_launched"], 4, "a count the runs agree on");
        assert_eq!(ours["cost_by_offering"]["g5.xlarge/spot"], 2.0);
        assert_eq!(ours["runs"].as_array().unwrap().len(), 2);
        assert_eq!(s[1]["repetitions"], 1);
        assert!(s[1]["runs"].is_null() && s[1]["cost_usd_min"].is_null());

        let json = json!({
            "control_plane": "v1.37.2",
            "builds": {"ours": {"version": "0.1.0", "commit": "abc123", "profile": "release"}},
            "scenarios": [{"name": "smoke", "hpa": "real", "strategies": s, "failed": []}],
        });
        let md = markdown(&json).unwrap();
        assert!(md.contains("- ours 0.1.0: abc123; release"), "{md}");
        assert!(
            md.contains("| smoke (real HPA) | **ours** | 2 | **$2.00** | $1.00–$3.00 | 55 s | 110 s | 100–120 |"),
            "{md}"
        );
        assert!(
            md.contains("| smoke (real HPA) | peer | 1 | $5.00 | — |"),
            "{md}"
        );
        assert!(markdown(&json!({"scenarios": []})).is_err());
    }

    /// A round run a repetition at a time (one file each) makes one table: a scenario's runs from
    /// every file summed up as `--repeat` sums them, the highest load averages shown; files of
    /// other builds are refused, naming both.
    #[test]
    fn a_round_run_a_repetition_at_a_time_makes_one_table() {
        let file = |ours: f64, peer: f64, commit: &str, load: f64| {
            let mut runs = [
                measured("ours", ours, 100.0, 4),
                measured("peer", peer, 90.0, 3),
            ];
            runs[0].load_avg_max = Some(load);
            json!({
                "control_plane": "v1.37.2",
                "builds": {"ours": {"version": "0.1.0", "commit": commit, "profile": "release"}},
                "scenarios": [{"name": "smoke", "time_scale": 20.0, "hpa": "model", "repetitions": 1,
                               "strategies": strategies_json(&runs), "failed": []}],
            })
        };
        let files = [
            ("a.json".to_string(), file(1.0, 5.0, "abc123", 1.25)),
            ("b.json".to_string(), file(3.0, 7.0, "abc123", 2.5)),
        ];
        let merged = merge(&files).unwrap();
        let sc = &merged["scenarios"][0];
        assert_eq!(merged["scenarios"].as_array().unwrap().len(), 1);
        assert_eq!(sc["repetitions"], 2);
        let ours = &sc["strategies"][0];
        assert_eq!(
            (ours["strategy"].as_str(), ours["repetitions"].as_u64()),
            (Some("ours"), Some(2))
        );
        assert_eq!(
            (
                ours["cost_usd"].as_f64(),
                ours["cost_usd_min"].as_f64(),
                ours["cost_usd_max"].as_f64()
            ),
            (Some(2.0), Some(1.0), Some(3.0))
        );
        assert_eq!(sc["strategies"][1]["cost_usd"], 6.0);
        let md = markdown(&merged).unwrap();
        assert!(
            md.contains("| smoke | **ours** | 2 | **$2.00** | $1.00–$3.00 |"),
            "{md}"
        );
        assert!(md.contains("load average during a run (its own cluster and autoscaler included): 1.25 to 2.50 over 4 runs"), "{md}");
        // One file is its own table, as before.
        let one = merge(&files[..1]).unwrap();
        assert_eq!(one["scenarios"][0]["strategies"][0]["cost_usd"], 1.0);
        assert!(one["scenarios"][0]["strategies"][0]["runs"].is_null());

        let other = ("c.json".to_string(), file(2.0, 2.0, "def456", 1.0));
        let e = merge(&[files[0].clone(), other]).unwrap_err().to_string();
        assert!(
            e.starts_with("a.json and c.json come from different builds"),
            "{e}"
        );
        let e = merge(&[("d.json".to_string(), json!({"scenarios": []}))])
            .unwrap_err()
            .to_string();
        assert!(e.contains("d.json: no \"builds\""), "{e}");
    }

    #[test]
    fn percentiles_of_few_values() {
        assert_eq!(percentile(&[], 0.5), 0.0);
        assert_eq!(percentile(&[1.0, 2.0, 3.0], 0.5), 2.0);
        assert_eq!(percentile(&[1.0, 2.0, 3.0], 0.99), 3.0);
    }
}
