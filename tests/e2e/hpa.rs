//! The GPU HPA chain on the real control plane: a dcgm-exporter stand-in (the one mock: it needs a
//! GPU) → the real Prometheus scraping it → the real prometheus-adapter serving
//! `custom.metrics.k8s.io` through the kube-apiserver's aggregation layer → the real HPA controller
//! of kube-controller-manager scaling an inference Deployment → our controller (kwok provider)
//! giving its Pending replicas GPU nodes and taking the emptied ones back. The adapter's rule,
//! RBAC, APIServices and the HPA are `deploy/examples/gpu-hpa/`, applied as they are.

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gpu_node_autoscaler_core::policy::duration::parse_duration;

use gpu_node_autoscaler_core::yaml;
use gpu_node_autoscaler_test_support::hpa::Chain;
use serde_json::Value;

use crate::cluster::{ClusterOptions, REPO};
use crate::support::{Env, Options};
use crate::MIN;

const EXAMPLES: &str = "deploy/examples/gpu-hpa";
/// The HPA's namespace and Deployment in `hpa.yaml`.
const NS: &str = "inference";
const APP: &str = "triton";

/// The pool the replicas land on: one GPU per node, so a node per replica; the pool's scale-down
/// timers (5 s after a launch, 10 s empty) much shorter than the HPA's 60 s stabilization window.
const POLICY: &str = "clusterName: e2e\nzones: [us-east-1a]\n\
batching: {idle: 1s, max: 3s}\nmaxNodeProvisionTime: 2m\n\
pools:\n- name: kwok-a10g\n  provider: kwok\n  instanceTypes: [g5.xlarge]\n\
\x20 capacityTypes: [on-demand]\n  maxNodes: 8\n\
\x20 taints:\n  - {key: nvidia.com/gpu, value: \"true\", effect: NoSchedule}\n\
\x20 scaleDown: {cooldownAfterScaleUp: 5s, unneededTime: 10s}\n";

/// The documents of an example file.
fn example(file: &str) -> Vec<Value> {
    let path = format!("{REPO}/{EXAMPLES}/{file}");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    yaml::parse_all(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn apply_list(env: &Env, docs: &[Value]) {
    let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": docs});
    let f = env
        .dir
        .join(format!("list-{}.json", crate::cluster::free_port()));
    std::fs::write(&f, list.to_string()).unwrap();
    env.kubectl_ok(&["apply", "-f", f.to_str().unwrap()]);
}

/// A kwok world whose kube-controller-manager runs the HPA controller every 2 s (default 15 s).
fn hpa_env(name: &str) -> Env {
    Env::start(
        name,
        Options {
            cluster: ClusterOptions {
                rbac_from: Some("overlays/kwok"),
                controller_manager_args: vec![
                    "--horizontal-pod-autoscaler-sync-period=2s".to_string()
                ],
                ..Default::default()
            },
            ..Default::default()
        },
    )
}

/// The chain of `deploy/examples/gpu-hpa/prometheus-adapter.yaml` (Prometheus scraping every
/// second, the adapter relisting every 2 s); returns once the aggregator serves its API.
fn start_chain(env: &Env) -> Chain {
    Chain::start(
        &env.cluster,
        &env.dir,
        Duration::from_secs(1),
        Duration::from_secs(2),
    )
    .unwrap_or_else(|e| panic!("the HPA chain: {e}"))
}

/// The HPA's current average of the metric (as a number), once it has one.
fn hpa_metric(env: &Env, app: &str) -> Option<f64> {
    let hpa = env.get_json(&["get", "hpa", "-n", NS, app]);
    let v = hpa["status"]["currentMetrics"][0]["pods"]["current"]["averageValue"].as_str()?;
    parse_quantity(v)
}

fn parse_quantity(q: &str) -> Option<f64> {
    match q.strip_suffix('m') {
        Some(milli) => milli.parse::<f64>().ok().map(|m| m / 1000.0),
        None => q.parse().ok(),
    }
}

/// The Nodes our kwok provider launched for the pool (from the moment they exist, before the
/// controller registers them with the pool's label).
fn launched_nodes(env: &Env, pool: &str) -> Vec<String> {
    let nodes = env.get_json(&["get", "nodes"]);
    nodes["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["metadata"]["annotations"]["kwok.gpu-node-autoscaler.io/pool"] == pool)
        .map(|n| n["metadata"]["name"].as_str().unwrap().to_string())
        .collect()
}

/// (spec.replicas, pods Running, pods Pending) of the Deployment.
fn replicas(env: &Env, app: &str) -> (u64, usize, usize) {
    let d = env.get_json(&["get", "deployment", "-n", NS, app]);
    let pods = env.get_json(&["get", "pods", "-n", NS, "-l", &format!("app={app}")]);
    let pods: Vec<&Value> = pods["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .collect();
    let phase = |ph: &str| pods.iter().filter(|p| p["status"]["phase"] == ph).count();
    (
        d["spec"]["replicas"].as_u64().unwrap_or(0),
        phase("Running"),
        phase("Pending"),
    )
}

/// The world of (a) and (b): the controller, the chain, and the example HPA's Deployment with one
/// replica Running at a low load (15 % of its GPU, under the HPA's 50 % target).
fn start_world(name: &str) -> (Env, Chain) {
    let mut env = hpa_env(name);
    env.create(&env.policy_configmap(POLICY));
    env.start_controller("r1", &[]);
    env.wait_for("the controller to become ready", MIN, || {
        env.http_get("r1", "/readyz").filter(|(c, _)| *c == 200)
    });
    let chain = start_chain(&env);
    chain.exporter.set_load(NS, APP, 0.15);
    apply_list(&env, &example("hpa.yaml"));
    env.wait_for(
        "the first replica to run on a node we launched",
        3 * MIN,
        || (replicas(&env, APP).1 == 1).then_some(()),
    );
    let m = env.wait_for(
        "the HPA to read the replica's GPU utilisation through the adapter",
        3 * MIN,
        || hpa_metric(&env, APP),
    );
    assert!((m - 15.0).abs() < 1.0, "DCGM_FI_DEV_GPU_UTIL of 15 %: {m}");
    assert_eq!(replicas(&env, APP).0, 1, "under the target: one replica");
    assert_eq!(launched_nodes(&env, "kwok-a10g").len(), 1);
    // Each link: Prometheus holds the exporter's series with its labels, and the adapter serves it
    // as the pod's custom metric.
    let series = chain.prometheus.query("DCGM_FI_DEV_GPU_UTIL");
    for label in [
        "\"namespace\":\"inference\"",
        "\"container\":\"triton\"",
        "\"modelName\":\"NVIDIA A10G\"",
        "\"gpu\":\"0\"",
        "\"UUID\":\"GPU-",
    ] {
        assert!(series.contains(label), "{label} in {series}");
    }
    let served = env.kubectl_ok(&[
        "get",
        "--raw",
        "/apis/custom.metrics.k8s.io/v1beta2/namespaces/inference/pods/*/DCGM_FI_DEV_GPU_UTIL",
    ]);
    assert!(served.contains("\"value\":\"15\""), "{served}");
    assert!(
        chain.adapter.log().contains("Serving securely"),
        "{}",
        chain.adapter.log()
    );
    (env, chain)
}

/// A `kubectl get --watch` of one kind, its lines (one per event, printed by `jsonpath`) kept with
/// the moment each arrived; stopped on drop.
struct Watch {
    child: std::process::Child,
    lines: Arc<Mutex<Vec<(Instant, String)>>>,
}

impl Watch {
    fn start(env: &Env, args: &[&str], jsonpath: &str) -> Watch {
        let mut child = std::process::Command::new("kubectl")
            .env("KUBECONFIG", "/dev/null")
            .arg(format!("--kubeconfig={}", env.cluster.admin.display()))
            .args(["get", "--watch"])
            .args(args)
            .arg(format!("-o=jsonpath={jsonpath}{{\"\\n\"}}"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("kubectl");
        let out = child.stdout.take().unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let kept = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                kept.lock().unwrap().push((Instant::now(), line));
            }
        });
        Watch { child, lines }
    }

    /// Seconds from `t0` to the first line after `t0` that `f` accepts.
    fn first(&self, t0: Instant, f: impl Fn(&[&str]) -> bool) -> Option<f64> {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .filter(|(at, _)| *at >= t0)
            .find(|(_, l)| f(&l.split_whitespace().collect::<Vec<_>>()))
            .map(|(at, _)| at.duration_since(t0).as_secs_f64())
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// When each link of the chain moved after the load step, in seconds: the sample with the new
/// value in Prometheus (its own scrape timestamp), the adapter serving it, the Deployment's
/// replicas raised by the HPA, the first new replica marked Unschedulable by kube-scheduler, our
/// first Node (the kwok provider's launch creates it), that Node Ready, the first new replica
/// Running. Seen through watches (and a poll of the adapter), not by polling every object.
#[derive(Debug, Clone, Copy)]
struct Split {
    scraped: f64,
    served: f64,
    replicas_raised: f64,
    unschedulable: f64,
    launched: f64,
    node_ready: f64,
    running: f64,
}

/// Load rises to two GPUs' worth: the HPA (target 50 %) goes 1 → 2 → 4 replicas (each running
/// replica at 100 % asks for twice as many); every replica it adds goes Pending on nvidia.com/gpu
/// and gets a node of its own, never more nodes than replicas. Returns the split of the way to the
/// first new replica Running ([`Split`]) and the seconds until all four run.
fn scale_up_to_four(env: &Env, chain: &Chain) -> (Split, f64) {
    let before: Vec<String> = launched_nodes(env, "kwok-a10g");
    let first_pod = env.kubectl_ok(&[
        "get",
        "pods",
        "-n",
        NS,
        "-l",
        &format!("app={APP}"),
        "-o=jsonpath={.items[0].metadata.name}",
    ]);
    let deployment = Watch::start(env, &["deployment", "-n", NS, APP], "{.spec.replicas}");
    let pods = Watch::start(
        env,
        &["pods", "-n", NS, "-l", &format!("app={APP}")],
        "{.metadata.name} {.status.phase} \
         {.status.conditions[?(@.type==\"PodScheduled\")].reason}_",
    );
    let nodes = Watch::start(
        env,
        &["nodes"],
        "{.metadata.name} {.metadata.annotations.kwok\\.gpu-node-autoscaler\\.io/pool} \
         {.status.conditions[?(@.type==\"Ready\")].status}_",
    );
    // The watches have listed what exists before the step.
    std::thread::sleep(Duration::from_secs(2));
    let served_path =
        "/apis/custom.metrics.k8s.io/v1beta2/namespaces/inference/pods/*/DCGM_FI_DEV_GPU_UTIL";
    let wall = std::time::SystemTime::now();
    let step = Instant::now();
    chain.exporter.set_load(NS, APP, 2.0);
    // The adapter, polled: its answer is a live query of Prometheus.
    let served = env.wait_for("the adapter to serve the new value", MIN, || {
        let out = env.kubectl(&["get", "--raw", served_path]);
        let t = step.elapsed().as_secs_f64();
        String::from_utf8_lossy(&out.stdout)
            .contains("\"value\":\"100\"")
            .then_some(t)
    });
    let (mut hpa_at, mut launch_at, mut first_at) = (None, None, None);
    let all_at = env.wait_for("four replicas Running on four nodes", 6 * MIN, || {
        // Nodes first: the HPA only adds replicas here, so they are never read ahead of them.
        let nodes = launched_nodes(env, "kwok-a10g").len();
        let (want, running, pending) = replicas(env, APP);
        let t = step.elapsed().as_secs_f64();
        assert!(
            nodes as u64 <= want.max(1),
            "{nodes} nodes for {want} replicas of one GPU each"
        );
        if want > 1 && hpa_at.is_none() {
            hpa_at = Some(t);
        }
        if nodes > 1 && launch_at.is_none() {
            launch_at = Some(t);
        }
        if running > 1 && first_at.is_none() {
            first_at = Some(t);
        }
        (want == 4 && running == 4 && pending == 0 && nodes == 4).then_some(t)
    });
    assert!(hpa_at.is_some() && launch_at.is_some() && first_at.is_some());
    // Prometheus's own timestamp of the first sample at 100 %.
    let window = (step.elapsed().as_secs() + 30).to_string();
    let range = chain.prometheus.query(&format!(
        "DCGM_FI_DEV_GPU_UTIL{{namespace=\"{NS}\",pod=\"{first_pod}\"}}[{window}s]"
    ));
    let range: Value = serde_json::from_str(&range).unwrap();
    let step_unix = wall
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let scraped = range["data"]["result"][0]["values"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v[1] == "100")
        .filter_map(|v| v[0].as_f64())
        .map(|ts| ts - step_unix)
        .find(|d| *d >= 0.0)
        .unwrap_or_else(|| panic!("a sample at 100 % after the step: {range}"));
    let new_pod = |l: &[&str]| l.first().is_some_and(|n| *n != first_pod);
    let new_node =
        |l: &[&str]| l.len() >= 2 && l[1] == "kwok-a10g" && !before.iter().any(|b| b == l[0]);
    let split = Split {
        scraped,
        served,
        replicas_raised: deployment
            .first(step, |l| l.first().is_some_and(|r| *r != "1"))
            .expect("the watch saw the replicas raised"),
        unschedulable: pods
            .first(step, |l| new_pod(l) && l.last() == Some(&"Unschedulable_"))
            .expect("the watch saw a new replica Unschedulable"),
        launched: nodes
            .first(step, new_node)
            .expect("the watch saw our first Node"),
        node_ready: nodes
            .first(step, |l| new_node(l) && l.last() == Some(&"True_"))
            .expect("the watch saw our first Node Ready"),
        running: pods
            .first(step, |l| new_pod(l) && l.get(1) == Some(&"Running"))
            .expect("the watch saw a new replica Running"),
    };
    // The new replicas waited for GPUs: the scheduler found none.
    let unschedulable = env.events("FailedScheduling");
    assert!(
        unschedulable
            .iter()
            .any(|e| e.starts_with(APP) && e.contains("nvidia.com/gpu")),
        "{unschedulable:?}"
    );
    let triggered = env.events("TriggeredScaleUp");
    assert!(
        triggered.iter().any(|e| e.starts_with(APP)),
        "{triggered:?}"
    );
    // Stays at four: 4 × 50 % is the target.
    std::thread::sleep(Duration::from_secs(10));
    assert_eq!(replicas(env, APP), (4, 4, 0));
    assert_eq!(launched_nodes(env, "kwok-a10g").len(), 4);
    let m = hpa_metric(env, APP).unwrap();
    assert!((m - 50.0).abs() < 1.0, "four replicas at 50 %: {m}");
    (split, all_at)
}

#[test]
fn hpa_adds_gpu_replicas_on_load_and_we_launch_exactly_their_nodes() {
    let (env, chain) = start_world("hpa-up");
    let (s, all) = scale_up_to_four(&env, &chain);
    // The measurement docs/benchmarks.md publishes (the HPA chain's timing split).
    eprintln!(
        "hpa split from the load step (s): scraped {:.2}, adapter serves {:.2}, replicas raised \
         {:.2}, new replica Unschedulable {:.2}, our first launch {:.2}, its Node Ready {:.2}, \
         new replica Running {:.2}, four Running {all:.2}",
        s.scraped,
        s.served,
        s.replicas_raised,
        s.unschedulable,
        s.launched,
        s.node_ready,
        s.running
    );
    // Every launch was for a replica: four nodes, each running one.
    let nodes: Vec<String> = env
        .pool_nodes()
        .iter()
        .map(|n| n["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    let pods = env.get_json(&["get", "pods", "-n", NS]);
    let mut on: Vec<String> = pods["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["spec"]["nodeName"].as_str().unwrap_or("").to_string())
        .collect();
    on.sort();
    let mut nodes_sorted = nodes.clone();
    nodes_sorted.sort();
    assert_eq!(on, nodes_sorted, "one replica on each node we launched");
    drop(chain);
}

#[test]
fn hpa_scale_in_hands_back_emptied_nodes_only_after_the_window_and_the_pool_delay() {
    let (env, chain) = start_world("hpa-down");
    scale_up_to_four(&env, &chain);
    // Load falls to 0.3 GPUs' worth (7.5 % a replica: the HPA recommends one replica) and, within
    // the HPA's 60 s stabilization window, comes back: no replica goes, so no node goes.
    chain.exporter.set_load(NS, APP, 0.3);
    env.wait_for("the HPA to see the load fall", MIN, || {
        hpa_metric(&env, APP).filter(|m| *m < 10.0)
    });
    let mut stabilized = false;
    let hold = Instant::now();
    let holds = |stabilized: &mut bool| {
        assert_eq!(
            replicas(&env, APP),
            (4, 4, 0),
            "the window holds four replicas"
        );
        assert_eq!(
            launched_nodes(&env, "kwok-a10g").len(),
            4,
            "and their four nodes"
        );
        let hpa = env.get_json(&["get", "hpa", "-n", NS, APP]);
        *stabilized |= hpa["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["reason"] == "ScaleDownStabilized");
    };
    while hold.elapsed() < Duration::from_secs(15) {
        holds(&mut stabilized);
        std::thread::sleep(Duration::from_secs(1));
    }
    chain.exporter.set_load(NS, APP, 2.0);
    env.wait_for("the HPA to see the load back", MIN, || {
        hpa_metric(&env, APP).filter(|m| *m > 40.0)
    });
    holds(&mut stabilized);
    assert!(
        stabilized,
        "the HPA held the replicas by its stabilization window (ScaleDownStabilized)"
    );

    // It falls for good: the HPA scales in once the window has only low recommendations; until
    // then every node stays.
    chain.exporter.set_load(NS, APP, 0.3);
    let fell = Instant::now();
    let before = launched_nodes(&env, "kwok-a10g");
    env.wait_for("the HPA to scale in to one replica", 4 * MIN, || {
        let (want, _, _) = replicas(&env, APP);
        if want == 4 {
            assert_eq!(
                launched_nodes(&env, "kwok-a10g"),
                before,
                "no node removed while the HPA holds four replicas"
            );
        }
        (want == 1).then_some(())
    });
    let scaled_in = fell.elapsed().as_secs_f64();
    // The three emptied nodes go after the pool's 10 s unneeded time; the one with the remaining
    // replica stays.
    let left = env.wait_for("three nodes removed", 3 * MIN, || {
        let nodes = launched_nodes(&env, "kwok-a10g");
        (nodes.len() == 1).then_some(nodes)
    });
    eprintln!(
        "hpa timings from the load fall: HPA scale-in {scaled_in:.1} s, three nodes removed {:.1} s",
        fell.elapsed().as_secs_f64()
    );
    env.wait_for("one replica Running", MIN, || {
        (replicas(&env, APP) == (1, 1, 0)).then_some(())
    });
    let pods = env.get_json(&["get", "pods", "-n", NS, "-l", &format!("app={APP}")]);
    let on: Vec<&str> = pods["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .filter_map(|p| p["spec"]["nodeName"].as_str())
        .collect();
    assert_eq!(on, [left[0].as_str()], "the replica's node stays");
    let events = env.events("ScaleDown");
    let ours: Vec<&String> = events
        .iter()
        .filter(|e| before.iter().any(|n| e.starts_with(&format!("{n}:"))))
        .collect();
    let removed: std::collections::BTreeSet<&str> =
        ours.iter().filter_map(|e| e.split(':').next()).collect();
    assert_eq!(removed.len(), 3, "{events:?}");
    assert!(!removed.contains(left[0].as_str()), "{events:?}");
    for e in ours {
        let idle = idle_for(e);
        assert!(
            idle >= Duration::from_secs(10),
            "removed only after the pool's unneeded time: {e}"
        );
    }
}

/// How long a node removed by a scale-down had been unneeded, from its `ScaleDown` Event: empty
/// ("empty (no GPU pods) for 17s") or, when the HPA took its last replicas off after our look,
/// under-used with its pods fitting elsewhere ("GPU utilization 4% below 50% for 1m28s; ...").
fn idle_for(event: &str) -> Duration {
    event
        .split(" for ")
        .nth(1)
        .and_then(|d| {
            let d = d.split_whitespace().next()?.trim_end_matches([';', ',']);
            parse_duration(d).ok()
        })
        .unwrap_or_else(|| panic!("{event}"))
}

/// After a load fall that takes `app` back to one replica: its Deployment runs one replica on
/// the one node of `pool` left; every other node of `before` was removed by us once, after the
/// pool's 10 s unneeded time.
fn scaled_in_to_one_node(env: &Env, app: &str, pool: &str, before: &[String]) {
    let left = env.wait_for("one replica Running and one node left", 4 * MIN, || {
        let nodes = launched_nodes(env, pool);
        (replicas(env, app) == (1, 1, 0) && nodes.len() == 1).then_some(nodes)
    });
    let pods = env.get_json(&["get", "pods", "-n", NS, "-l", &format!("app={app}")]);
    let on: Vec<&str> = pods["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .filter_map(|p| p["spec"]["nodeName"].as_str())
        .collect();
    assert_eq!(on, [left[0].as_str()], "the replica's node stays");
    let events = env.events("ScaleDown");
    for gone in before.iter().filter(|n| **n != left[0]) {
        let removed: Vec<&String> = events
            .iter()
            .filter(|e| e.starts_with(&format!("{gone}:")))
            .collect();
        assert_eq!(removed.len(), 1, "{gone}: {events:?}");
        let idle = idle_for(removed[0]);
        assert!(
            idle >= Duration::from_secs(10),
            "removed only after the pool's unneeded time: {}",
            removed[0]
        );
    }
}

/// An H100 pool whose GPUs are each partitioned into a 1g.10gb, a 2g.20gb and a 3g.40gb slice
/// (`hpa-mig.yaml`'s Deployment asks for one 1g.10gb slice a replica): eight replicas to a
/// p5.48xlarge, so a ninth needs a second node.
const MIG_POLICY: &str = "clusterName: e2e\nzones: [us-east-1a]\n\
batching: {idle: 1s, max: 3s}\nmaxNodeProvisionTime: 2m\n\
pools:\n- name: kwok-h100\n  provider: kwok\n  instanceTypes: [p5.48xlarge]\n\
\x20 capacityTypes: [on-demand]\n  maxNodes: 2\n  gpuMode: mig\n  migLayout: {1g.10gb: 1, 2g.20gb: 1, 3g.40gb: 1}\n\
\x20 taints:\n  - {key: nvidia.com/gpu, value: \"true\", effect: NoSchedule}\n\
\x20 scaleDown: {cooldownAfterScaleUp: 5s, unneededTime: 10s}\n";

#[test]
fn hpa_scales_mig_slice_replicas_on_their_slices_activity_onto_h100_nodes_we_launch_and_hands_the_emptied_one_back(
) {
    const MIG_APP: &str = "triton-mig";
    let mut env = hpa_env("hpa-mig");
    env.create(&env.policy_configmap(MIG_POLICY));
    env.start_controller("r1", &[]);
    env.wait_for("the controller to become ready", MIN, || {
        env.http_get("r1", "/readyz").filter(|(c, _)| *c == 200)
    });
    let chain = start_chain(&env);
    chain.exporter.set_load(NS, MIG_APP, 0.15);
    apply_list(&env, &example("hpa-mig.yaml"));
    env.wait_for(
        "the first replica to run on a node we launched",
        3 * MIN,
        || (replicas(&env, MIG_APP).1 == 1).then_some(()),
    );
    let unschedulable = env.events("FailedScheduling");
    assert!(
        unschedulable
            .iter()
            .any(|e| e.starts_with(MIG_APP) && e.contains("nvidia.com/mig-1g.10gb")),
        "{unschedulable:?}"
    );
    let nodes = launched_nodes(&env, "kwok-h100");
    assert_eq!(nodes.len(), 1, "one p5.48xlarge: eight 1g.10gb slices");
    let node = env.get_json(&["get", "node", &nodes[0]]);
    assert_eq!(
        node["status"]["capacity"]["nvidia.com/mig-1g.10gb"], "8",
        "{node}"
    );
    // The slice's activity, per MIG instance, through Prometheus and the adapter.
    let m = env.wait_for(
        "the HPA to read the slice's activity through the adapter",
        3 * MIN,
        || hpa_metric(&env, MIG_APP),
    );
    assert!((m - 0.15).abs() < 0.01, "0.15 of the slice: {m}");
    let series = chain.prometheus.query("DCGM_FI_PROF_GR_ENGINE_ACTIVE");
    assert!(
        series.contains("\"GPU_I_PROFILE\":\"1g.10gb\"")
            && series.contains("\"modelName\":\"NVIDIA H100 80GB HBM3\""),
        "{series}"
    );

    // Load rises to two slices' worth: the HPA (target 0.5) goes 1 → 2 → 4 replicas; they fit
    // on the slices of the node already there, so no node is launched.
    chain.exporter.set_load(NS, MIG_APP, 2.0);
    env.wait_for("four replicas Running", 6 * MIN, || {
        let nodes = launched_nodes(&env, "kwok-h100").len();
        assert_eq!(nodes, 1, "the replicas fit the slices of the node there");
        (replicas(&env, MIG_APP) == (4, 4, 0)).then_some(())
    });
    std::thread::sleep(Duration::from_secs(10));
    assert_eq!(replicas(&env, MIG_APP), (4, 4, 0));
    assert_eq!(launched_nodes(&env, "kwok-h100").len(), 1);
    let m = hpa_metric(&env, MIG_APP).unwrap();
    assert!((m - 0.5).abs() < 0.01, "four replicas at half a slice: {m}");

    // 4.5 slices' worth: 4 → 8 → 9 replicas; the ninth finds no 1g.10gb slice free and we
    // launch a second node for it.
    chain.exporter.set_load(NS, MIG_APP, 4.5);
    let two = env.wait_for("nine replicas Running on two nodes", 6 * MIN, || {
        let nodes = launched_nodes(&env, "kwok-h100");
        assert!(nodes.len() <= 2, "eight slices a node: {nodes:?}");
        (replicas(&env, MIG_APP) == (9, 9, 0) && nodes.len() == 2).then_some(nodes)
    });

    // Load falls to 0.3 of a slice: after its 60 s window the HPA goes back to one replica; the
    // node left without one goes after the pool's 10 s unneeded time, the other stays.
    chain.exporter.set_load(NS, MIG_APP, 0.3);
    scaled_in_to_one_node(&env, MIG_APP, "kwok-h100", &two);
}

/// Every manifest of `deploy/examples/gpu-hpa/` passes the API server's own validation, field by
/// field (`kubectl apply --dry-run=server --validate=strict`: an unknown or misspelt field is an
/// error), with the admin's kubeconfig; the Namespaces they use are created first.
#[test]
fn hpa_examples_validate_against_the_api_server() {
    let dir = std::env::temp_dir().join(format!("gna-e2e-hpa-examples-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let cluster = crate::cluster::Cluster::start(&dir, &ClusterOptions::default());
    let mut files: Vec<String> = std::fs::read_dir(format!("{REPO}/{EXAMPLES}"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|f| f.ends_with(".yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 3, "{files:?}");
    let mut kinds = std::collections::BTreeSet::new();
    for f in &files {
        for d in example(f) {
            let kind = d["kind"].as_str().unwrap_or("").to_string();
            if kind == "Namespace" {
                let name = d["metadata"]["name"].as_str().unwrap();
                if cluster.kubectl(&["get", "namespace", name]).is_err() {
                    cluster
                        .kubectl(&["create", "namespace", name, "--save-config"])
                        .unwrap();
                }
            }
            kinds.insert(kind);
        }
    }
    for f in &files {
        let path = format!("{REPO}/{EXAMPLES}/{f}");
        let out = cluster
            .kubectl(&[
                "apply",
                "--dry-run=server",
                "--validate=strict",
                "-f",
                &path,
            ])
            .unwrap_or_else(|e| panic!("{EXAMPLES}/{f} does not validate: {e}"));
        assert!(out.contains("(server dry run)"), "{f}: {out}");
    }
    for k in [
        "APIService",
        "ConfigMap",
        "Deployment",
        "HorizontalPodAutoscaler",
        "Service",
        "ClusterRole",
        "RoleBinding",
    ] {
        assert!(kinds.contains(k), "the examples hold a {k}: {kinds:?}");
    }
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
}

/// An A10G pool shared by GPU memory (`aliyun.com/gpu-mem`: 22 whole GiB of the A10G's 22.5 a
/// node): two 8 GiB replicas of `hpa-shared.yaml` to a node.
const SHARED_POLICY: &str = "clusterName: e2e\nzones: [us-east-1a]\n\
batching: {idle: 1s, max: 3s}\nmaxNodeProvisionTime: 2m\n\
pools:\n- name: kwok-shared\n  provider: kwok\n  instanceTypes: [g5.xlarge]\n\
\x20 capacityTypes: [on-demand]\n  maxNodes: 4\n  gpuMode: shared\n\
\x20 taints:\n  - {key: nvidia.com/gpu, value: \"true\", effect: NoSchedule}\n\
\x20 scaleDown: {cooldownAfterScaleUp: 5s, unneededTime: 10s}\n";

#[test]
fn hpa_scales_shared_gpu_replicas_and_we_launch_a_node_only_when_the_shares_run_out_and_hand_it_back_on_scale_in(
) {
    const SHARED_APP: &str = "triton-shared";
    let mut env = hpa_env("hpa-shared");
    env.create(&env.policy_configmap(SHARED_POLICY));
    env.start_controller("r1", &[]);
    env.wait_for("the controller to become ready", MIN, || {
        env.http_get("r1", "/readyz").filter(|(c, _)| *c == 200)
    });
    let chain = start_chain(&env);
    chain.exporter.set_load(NS, SHARED_APP, 0.15);
    apply_list(&env, &example("hpa-shared.yaml"));
    env.wait_for(
        "the first replica to run on a node we launched",
        3 * MIN,
        || (replicas(&env, SHARED_APP).1 == 1).then_some(()),
    );
    let first = launched_nodes(&env, "kwok-shared");
    assert_eq!(first.len(), 1);
    let node = env.get_json(&["get", "node", &first[0]]);
    assert_eq!(
        node["status"]["capacity"]["aliyun.com/gpu-mem"], "22",
        "{node}"
    );
    let m = env.wait_for(
        "the HPA to read the replica's GPU utilisation through the adapter",
        3 * MIN,
        || hpa_metric(&env, SHARED_APP),
    );
    assert!((m - 15.0).abs() < 1.0, "15 %: {m}");

    // Two GPUs' worth of work: 1 → 2 → 4 replicas; the second shares the first node's GPU, the
    // third and fourth get one second node between them, and no third is launched.
    chain.exporter.set_load(NS, SHARED_APP, 2.0);
    env.wait_for("four replicas Running", 6 * MIN, || {
        let nodes = launched_nodes(&env, "kwok-shared");
        assert!(nodes.len() <= 2, "two 8 GiB replicas a node: {nodes:?}");
        (replicas(&env, SHARED_APP) == (4, 4, 0) && nodes.len() == 2).then_some(())
    });
    let unschedulable = env.events("FailedScheduling");
    assert!(
        unschedulable
            .iter()
            .any(|e| e.starts_with(SHARED_APP) && e.contains("aliyun.com/gpu-mem")),
        "{unschedulable:?}"
    );
    std::thread::sleep(Duration::from_secs(10));
    assert_eq!(replicas(&env, SHARED_APP), (4, 4, 0));
    assert_eq!(launched_nodes(&env, "kwok-shared").len(), 2);
    let pods = env.get_json(&["get", "pods", "-n", NS, "-l", "app=triton-shared"]);
    let on_first = pods["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["spec"]["nodeName"] == first[0].as_str())
        .count();
    assert_eq!(on_first, 2, "two replicas share the first node's GPU");

    // Load falls to 0.3 GPUs' worth: after its 60 s window the HPA goes back to one replica.
    // Three of the four shares go, so one node is left with none: it goes after the pool's 10 s
    // unneeded time, and the node with the remaining replica stays.
    let two = launched_nodes(&env, "kwok-shared");
    chain.exporter.set_load(NS, SHARED_APP, 0.3);
    scaled_in_to_one_node(&env, SHARED_APP, "kwok-shared", &two);
}
