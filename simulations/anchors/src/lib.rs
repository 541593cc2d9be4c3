//! `anchors`: one workload, replayed on a fresh real Kubernetes control plane (etcd,
//! kube-apiserver, kube-controller-manager, kube-scheduler, kwok as the kubelets) once per
//! autoscaler, one at a time, and measured alike from what the API server shows.
//!
//! Each workload pod is created by a controller (a Job, or a ReplicaSet for a Deployment's replica).
//!
//! - `gpu-node-autoscaler`: the `run` binary with the scenario's pools on its kwok provider, as its
//!   ServiceAccount with the RBAC of `deploy/overlays/kwok`;
//! - `karpenter`: Karpenter's kwok provider (`scripts/anchors.sh`), a NodePool per pool and the
//!   catalog's shapes and prices as its instance types;
//! - `cluster-autoscaler`: the Cluster Autoscaler's kwok provider, when `scripts/anchors.sh` could
//!   build it (the run fails with the reason when it could not).
//!
//! Time is compressed by `--time-scale`: every duration of the workload (arrivals, run times), of
//! the nodes (boot) and of the configuration (delays, cooldowns, batching) is divided by it alike;
//! figures are reported in the scenario's own time. What a scenario holds that cannot be replayed on
//! kwok (cloud events: capacity shortages, interruptions, broken GPUs; shared GPUs and MIG slices) is
//! refused or listed, never silently left out.

pub mod config;
pub mod replay;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};

use gpu_node_autoscaler_core::{catalog, yaml};
use gpu_node_autoscaler_sim::scenario::parse_scenario;

pub use replay::{Binaries, Measured, Report};

pub const AUTOSCALERS: [&str; 3] = ["gpu-node-autoscaler", "karpenter", "cluster-autoscaler"];

/// What to run.
pub struct Options {
    pub scenarios: Vec<PathBuf>,
    /// Every duration is divided by this.
    pub time_scale: f64,
    pub autoscalers: Vec<String>,
    /// The `gpu-node-autoscaler` binary (built with `--features controller`); default
    /// `target/debug/gpu-node-autoscaler`.
    pub ours_bin: Option<PathBuf>,
    /// Where the clusters' directories and the autoscalers' logs go (kept).
    pub work_dir: PathBuf,
    /// Stop a run after this long of the scenario's time even if pods remain.
    pub max_time: Option<Duration>,
    /// The scenario's services scaled by the real HPA chain (kube-controller-manager's HPA
    /// controller, Prometheus, prometheus-adapter, the dcgm-exporter stand-in) instead of the
    /// replicas of the simulator's model.
    pub real_hpa: bool,
    /// Runs per autoscaler and scenario (one cluster at a time, the autoscalers taking turns).
    pub repeat: usize,
}

/// A scenario file and what replaying it takes: an error naming the file (and the pod) when it
/// holds what kwok nodes cannot offer.
pub fn load(
    path: &Path,
    time_scale: f64,
    max_time: Option<Duration>,
    real_hpa: bool,
) -> Result<(gpu_node_autoscaler_sim::scenario::Scenario, replay::Setup)> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let file = path.display().to_string();
    let scenario = parse_scenario(&text, &file).map_err(|e| anyhow::anyhow!(e))?;
    let raw = yaml::parse(&text)?;
    let types = match &scenario.catalog {
        None => catalog::parse_csv(catalog::BUILTIN_AWS, catalog::BUILTIN_AWS_NAME)?,
        Some(rel) => {
            let p = path.parent().unwrap_or(Path::new(".")).join(rel);
            let t = std::fs::read_to_string(&p)
                .with_context(|| format!("reading the catalog {}", p.display()))?;
            catalog::parse_csv(&t, &p.display().to_string())?
        }
    };
    let cat = catalog::offerings_from_list_prices(&scenario.policy, types);
    let setup = replay::Setup::new(
        &scenario,
        &raw["policy"],
        cat,
        time_scale,
        max_time,
        real_hpa,
    )
    .with_context(|| format!("{file}: cannot be replayed"))?;
    Ok((scenario, setup))
}

/// Runs every autoscaler on every scenario, one at a time, each on a fresh cluster.
pub fn measure(o: &Options) -> Result<(Vec<Report>, Binaries)> {
    if o.repeat == 0 {
        bail!("--repeat must be at least 1");
    }
    if o.time_scale.is_nan() || o.time_scale < 1.0 {
        bail!("--time-scale must be at least 1 (got {})", o.time_scale);
    }
    for a in &o.autoscalers {
        if !AUTOSCALERS.contains(&a.as_str()) {
            bail!(
                "--autoscalers: unknown {a:?} (expected {})",
                AUTOSCALERS.join(", ")
            );
        }
    }
    std::fs::create_dir_all(&o.work_dir).with_context(|| format!("{}", o.work_dir.display()))?;
    let bins = Binaries::find(&o.autoscalers, o.ours_bin.clone())?;
    let mut reports = Vec::new();
    for path in &o.scenarios {
        let (scenario, setup) = load(path, o.time_scale, o.max_time, o.real_hpa)?;
        let mut results = Vec::new();
        let mut failed = Vec::new();
        for (rep, a) in (0..o.repeat.max(1)).flat_map(|r| o.autoscalers.iter().map(move |a| (r, a)))
        {
            eprintln!(
                "anchors: {}: {a}{} (time scale {}; {} pods{}; at most {:.0} min of wall time)",
                scenario.name,
                if o.repeat > 1 {
                    format!(", run {} of {}", rep + 1, o.repeat)
                } else {
                    String::new()
                },
                o.time_scale,
                setup.pods.len(),
                setup.hpa.as_ref().map_or(String::new(), |h| format!(
                    " and {} service(s) scaled by the real HPA",
                    h.services.len()
                )),
                setup.deadline.as_secs_f64() / 60.0
            );
            let dir = if o.repeat > 1 {
                o.work_dir
                    .join(format!("{}-{a}-{}", scenario.name, rep + 1))
            } else {
                o.work_dir.join(format!("{}-{a}", scenario.name))
            };
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir)?;
            // One failed run (a control plane that stopped answering) does not lose the others.
            match replay::run_one(&setup, a, &bins, &dir) {
                Ok(m) => results.push(m),
                Err(e) => {
                    let e = format!("{e:#} (logs in {})", dir.display());
                    eprintln!("anchors: {}: {a} failed: {e}", scenario.name);
                    failed.push((a.clone(), e));
                }
            }
        }
        reports.push(Report {
            scenario: scenario.name.clone(),
            time_scale: o.time_scale,
            repetitions: o.repeat.max(1),
            real_hpa: setup.hpa.as_ref().map(|h| h.model),
            boot_s: setup.boot.as_secs_f64(),
            not_replayed: setup.not_replayed.clone(),
            results,
            failed,
        });
    }
    Ok((reports, bins))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every scenario of `simulations/scenarios` is replayed, MIG slices, shared GPUs and
    /// ResourceClaims included.
    #[test]
    fn every_scenario_is_replayed() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios");
        let mut seen = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_stem().unwrap().to_string_lossy().to_string();
            let got = load(&path, 10.0, None, false);
            match name.as_str() {
                "mig-shared-mix" => {
                    // MIG slices and shared GPUs as the pods' extended resources.
                    let (_, setup) = got.unwrap_or_else(|e| panic!("{name}: {e:#}"));
                    let requests = |prefix: &str| {
                        setup
                            .pods
                            .iter()
                            .find(|p| p.name.starts_with(prefix))
                            .map(|p| {
                                p.object["spec"]["template"]["spec"]["containers"][0]["resources"]
                                    ["requests"]
                                    .clone()
                            })
                            .unwrap_or_else(|| panic!("no pod {prefix}"))
                    };
                    assert_eq!(requests("notebook")["nvidia.com/mig-2g.10gb"], "1");
                    let ocr = requests("ocr");
                    assert_eq!(ocr["aliyun.com/gpu-mem"], "5", "{ocr}");
                    assert_eq!(ocr["aliyun.com/gpu-core.percentage"], "30", "{ocr}");
                }
                "dra-claims" => {
                    // The claims from templates created before the pods; the driver stand-in
                    // publishes the devices of the DRA pools' Nodes.
                    let (_, setup) = got.unwrap_or_else(|e| panic!("{name}: {e:#}"));
                    let kinds: Vec<&str> = setup
                        .dra_objects
                        .iter()
                        .map(|o| o["kind"].as_str().unwrap())
                        .collect();
                    assert_eq!(kinds[..2], ["DeviceClass", "DeviceClass"], "{kinds:?}");
                    let finetune = setup
                        .dra_objects
                        .iter()
                        .find(|o| o["metadata"]["name"] == "finetune-worker-gpus")
                        .expect("the fine-tuning gang's template");
                    assert_eq!(finetune["metadata"]["namespace"], "default");
                    let h100 = &finetune["spec"]["spec"]["devices"]["requests"][0]["exactly"];
                    assert_eq!(h100["count"], 8, "{finetune}");
                    let pod = &setup
                        .pods
                        .iter()
                        .find(|p| p.name.starts_with("finetune"))
                        .unwrap()
                        .object["spec"]["template"]["spec"];
                    assert_eq!(
                        pod["resourceClaims"],
                        serde_json::json!([{"name": "gpus", "resourceClaimTemplateName": "finetune-worker-gpus"}])
                    );
                    assert_eq!(
                        pod["containers"][0]["resources"]["claims"],
                        serde_json::json!([{"name": "gpus"}])
                    );
                    assert_eq!(
                        setup.dra_pools.keys().collect::<Vec<_>>(),
                        ["a100-mig", "big-gpu", "l40s"]
                    );
                    assert!(setup
                        .ca
                        .args
                        .contains(&"--enable-dynamic-resource-allocation=true".to_string()));
                }
                "topology-serving" => {
                    // The rules across nodes, written as kube-scheduler reads them.
                    let (_, setup) = got.unwrap_or_else(|e| panic!("{name}: {e:#}"));
                    let spec = |prefix: &str| {
                        setup
                            .pods
                            .iter()
                            .find(|p| p.name.starts_with(prefix))
                            .map(|p| p.object["spec"]["template"]["spec"].clone())
                            .unwrap_or_else(|| panic!("no pod {prefix}"))
                    };
                    let llm = spec("llm");
                    let selector = serde_json::json!({"matchExpressions": [{"key": "app", "operator": "In", "values": ["llm"]}]});
                    assert_eq!(
                        llm["topologySpreadConstraints"],
                        serde_json::json!([{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                            "whenUnsatisfiable": "DoNotSchedule", "labelSelector": selector}]),
                        "{llm}"
                    );
                    assert_eq!(
                        llm["affinity"]["podAntiAffinity"]
                            ["requiredDuringSchedulingIgnoredDuringExecution"],
                        serde_json::json!([{"topologyKey": "kubernetes.io/hostname",
                            "labelSelector": selector, "namespaces": ["default"]}]),
                        "{llm}"
                    );
                    assert_eq!(
                        spec("agent")["containers"][0]["ports"],
                        serde_json::json!([{"containerPort": 9400, "hostPort": 9400, "protocol": "TCP"}])
                    );
                    assert!(spec("batch")["affinity"].is_null());
                    // The volumes: the claims and the static volume created before the pods
                    // (in the replay's namespace), each pod's template naming its claims.
                    let kinds: Vec<&str> = setup
                        .storage_objects
                        .iter()
                        .map(|o| o["kind"].as_str().unwrap())
                        .collect();
                    assert_eq!(
                        kinds[..3],
                        ["StorageClass", "StorageClass", "PersistentVolume"],
                        "{kinds:?}"
                    );
                    let pv = &setup.storage_objects[2];
                    assert_eq!(
                        pv["spec"]["claimRef"],
                        serde_json::json!({"namespace": "default", "name": "ckpt"}),
                        "{pv}"
                    );
                    let claims: Vec<&str> = setup
                        .storage_objects
                        .iter()
                        .filter(|o| o["kind"] == "PersistentVolumeClaim")
                        .inspect(|o| assert_eq!(o["metadata"]["namespace"], "default", "{o}"))
                        .map(|o| o["metadata"]["name"].as_str().unwrap())
                        .collect();
                    assert_eq!(
                        claims,
                        [
                            "data-cache-shard-0",
                            "data-cache-shard-1",
                            "data-cache-shard-2",
                            "ckpt"
                        ]
                    );
                    assert_eq!(
                        spec("cache-0-shard-1")["volumes"],
                        serde_json::json!([{"name": "v0", "persistentVolumeClaim": {"claimName": "data-cache-shard-1"}}])
                    );
                    assert!(spec("llm")["volumes"].is_null());
                }
                "reserved-h100" | "kueue-gangs" => {
                    // Refused loudly rather than replayed without its rules.
                    let e = got.err().map(|e| format!("{e:#}")).unwrap_or_default();
                    assert!(
                        e.contains("cannot be replayed by anchors yet"),
                        "{name}: {e}"
                    );
                }
                _ => {
                    let (_, setup) = got.unwrap_or_else(|e| panic!("{name}: {e:#}"));
                    assert!(!setup.pods.is_empty(), "{name}");
                    eprintln!(
                        "{name}: {} pods, {:.0} min of wall time at 10x",
                        setup.pods.len(),
                        setup.deadline.as_secs_f64() / 60.0
                    );
                }
            }
            seen += 1;
        }
        assert_eq!(seen, 14);
    }

    /// Generated scenarios (`simulate --generate SEED --write-scenario FILE`) replay as the
    /// shipped ones do: each of the first 20 seeds loads, with its pods, and with its cloud
    /// events listed as not replayed.
    #[test]
    fn generated_scenarios_are_replayed() {
        let dir = std::env::temp_dir().join(format!("gna-anchors-gen-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut with_events = 0;
        for seed in 1..=20 {
            let path = dir.join(gpu_node_autoscaler_sim::generate::file_name(seed));
            std::fs::write(&path, gpu_node_autoscaler_sim::generate::generate(seed)).unwrap();
            let (scenario, setup) =
                load(&path, 20.0, None, false).unwrap_or_else(|e| panic!("seed {seed}: {e:#}"));
            assert!(!setup.pods.is_empty(), "seed {seed}");
            if !scenario.events.is_empty() {
                assert!(!setup.not_replayed.is_empty(), "seed {seed}");
                with_events += 1;
            }
        }
        assert!(
            with_events > 0,
            "some generated scenarios have shortages or interruptions"
        );
        let _ = std::fs::remove_dir_all(dir);
    }

    /// With `--hpa real` a service's replicas are not replayed from the model: it becomes a
    /// Deployment at its minimum and an `autoscaling/v2` HPA on the pods' GPU utilisation, its
    /// windows and kube-controller-manager's sync scaled; the jobs are replayed as before.
    #[test]
    fn hpa_real_replaces_the_models_replicas_by_a_deployment_and_its_hpa() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
        let (_, model) = load(&dir.join("smoke-hpa.yaml"), 20.0, None, false).unwrap();
        assert!(model.hpa.is_none());
        assert!(model.pods.len() > 1, "the model's replicas are replayed");
        let (_, real) = load(&dir.join("smoke-hpa.yaml"), 20.0, None, true).unwrap();
        assert!(real.pods.is_empty(), "no replica of the model is replayed");
        let h = real.hpa.as_ref().unwrap();
        // The model's replicas, not replayed, are kept for comparison.
        assert_eq!(h.model.replicas, model.pods.len());
        assert!(
            h.model.peak >= 4 && h.model.replica_hours > 0.0,
            "{:?}",
            h.model
        );
        assert_eq!(
            h.controller_manager_args,
            [
                "--horizontal-pod-autoscaler-sync-period=750ms",
                "--horizontal-pod-autoscaler-tolerance=0.1"
            ]
        );
        let chat = &h.services[0];
        assert_eq!(chat.deployment["spec"]["replicas"], 1);
        let pod = &chat.deployment["spec"]["template"];
        assert_eq!(pod["metadata"]["labels"]["app"], "chat");
        assert_eq!(
            pod["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"],
            "1"
        );
        let spec = &chat.hpa["spec"];
        assert_eq!(spec["maxReplicas"], 6);
        assert_eq!(
            spec["metrics"][0]["pods"]["metric"]["name"],
            "DCGM_FI_DEV_GPU_UTIL"
        );
        assert_eq!(spec["metrics"][0]["pods"]["target"]["averageValue"], "50");
        // 2 m of stabilisation at 20x; the 15 s policy periods at their 1 s least.
        assert_eq!(
            spec["behavior"]["scaleDown"]["stabilizationWindowSeconds"],
            6
        );
        assert_eq!(
            spec["behavior"]["scaleUp"]["policies"][1]["periodSeconds"],
            1
        );
        // The load steps at 5 m and 15 m, in wall time.
        assert_eq!(chat.load_at(Duration::from_secs(14)), 0.3);
        assert_eq!(chat.load_at(Duration::from_secs(15)), 2.0);
        assert_eq!(chat.load_at(Duration::from_secs(45)), 0.3);
        assert_eq!(chat.until, Duration::from_secs(75));

        // A scenario with jobs beside its service keeps the jobs.
        let bursty = dir.join("../scenarios/bursty-inference-hpa.yaml");
        let (_, real) = load(&bursty, 20.0, None, true).unwrap();
        assert!(!real.pods.is_empty());
        assert!(real.pods.iter().all(|p| p.name.starts_with("embed-batch")));
        // One without services is refused with the reason.
        let e = load(&dir.join("smoke.yaml"), 20.0, None, true)
            .err()
            .unwrap();
        assert!(format!("{e:#}").contains("no HPA-scaled services"), "{e:#}");
    }
}
