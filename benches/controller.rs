//! Controller benchmark against kube-sim and moto_server, with the release binary:
//!
//! 1. reaction: 1,000 nodes and 10,000 pending GPU pods; the pods are created, then all marked
//!    unschedulable at once (as kube-scheduler would, through the status subresource: kube-sim's
//!    own scheduler is off so that its speed is not measured); time from the last pod marked to
//!    the first `CreateFleet` request reaching EC2 (seen by a relay in front of moto), over
//!    several runs;
//! 2. memory: 5,000 nodes and 100,000 pods in the cluster; the controller's peak RSS once its
//!    caches are synced and it has made a decision.
//!
//! 3. with `real`: the reaction on the real control plane (kube-apiserver, kube-scheduler marking
//!    the pods, kube-controller-manager, kwok playing the nodes' kubelets) with 1,000 nodes and
//!    10,000 pods, the controller with the RBAC `deploy/` grants, and its peak RSS.
//!
//! `cargo bench --features controller --bench controller [-- RUNS]` (moto_server must be installed: scripts/test.sh);
//! `cargo bench --features controller --bench controller -- real [RUNS]` (and the control plane:
//! `bash scripts/control-plane.sh`, or `GNA_CONTROL_PLANE_BIN`).

use gpu_node_autoscaler_test_support::moto as aws;

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

const BIN: &str = env!("CARGO_BIN_EXE_gpu-node-autoscaler");

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn client(addr: SocketAddr) -> kube::Client {
    let mut config = kube::Config::new(format!("http://{addr}").parse().unwrap());
    config.default_retry = false;
    kube::Client::try_from(config).unwrap()
}

fn policy(cluster: &str, net: &aws::Network) -> String {
    format!(
        "clusterName: {cluster}\nregion: us-east-1\nzones: [us-east-1a]\n\
         pools:\n- name: a10g\n  instanceTypes: [g5.xlarge]\n  capacityTypes: [spot, on-demand]\n  maxNodes: 50\n\
         \x20 aws:\n    launchTemplate: {{name: {}}}\n    subnets: {{us-east-1a: {}}}\n",
        net.launch_template, net.subnets["us-east-1a"]
    )
}

async fn create_all<K, F>(api: Api<K>, n: usize, make: F)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
    F: Fn(usize) -> K,
{
    let api = Arc::new(api);
    futures::stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            let obj = make(i);
            async move {
                api.create(&PostParams::default(), &obj)
                    .await
                    .expect("create");
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<()>>()
        .await;
}

fn node(i: usize, gpu: bool) -> Node {
    let mut labels = json!({"kubernetes.io/hostname": format!("node-{i:05}")});
    let mut alloc = json!({"cpu": "96", "memory": "768Gi", "pods": "110"});
    if gpu {
        labels["gpu-node-autoscaler.io/pool"] = json!("a10g");
        labels["node.kubernetes.io/instance-type"] = json!("g5.48xlarge");
        labels["topology.kubernetes.io/zone"] = json!("us-east-1a");
        alloc["nvidia.com/gpu"] = json!("8");
    }
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": format!("node-{i:05}"), "labels": labels},
        "spec": {"providerID": format!("aws:///us-east-1a/i-{i:017x}")},
        "status": {"capacity": alloc, "allocatable": alloc,
            "conditions": [{"type": "Ready", "status": "True"}]}
    }))
    .unwrap()
}

fn gpu_pod(i: usize, node: Option<String>) -> Pod {
    let mut spec = json!({
        "containers": [{"name": "main", "image": "trainer:1",
            "resources": {"requests": {"cpu": "1", "memory": "4Gi", "nvidia.com/gpu": "1"},
                "limits": {"nvidia.com/gpu": "1"}}}],
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]});
    if let Some(n) = node {
        spec["nodeName"] = json!(n);
    }
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("train-{i:06}"), "namespace": format!("team-{}", i % 10),
            "labels": {"app": "train", "job": format!("job-{}", i / 20)},
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job",
                "name": format!("job-{}", i / 20), "uid": format!("uid-{}", i / 20), "controller": true}]},
        "spec": spec
    }))
    .unwrap()
}

async fn setup(addr: SocketAddr, cluster: &str, net: &aws::Network) -> kube::Client {
    let c = client(addr).await;
    for i in 0..10 {
        let ns: k8s_openapi::api::core::v1::Namespace =
            serde_json::from_value(json!({"metadata": {"name": format!("team-{i}")}})).unwrap();
        let _ = Api::all(c.clone())
            .create(&PostParams::default(), &ns)
            .await;
    }
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "gpu-node-autoscaler-policy", "namespace": "kube-system"},
        "data": {"policy.yaml": policy(cluster, net)}
    }))
    .unwrap();
    Api::<ConfigMap>::namespaced(c.clone(), "kube-system")
        .create(&PostParams::default(), &cm)
        .await
        .unwrap();
    c
}

struct Controller {
    child: Child,
    port: u16,
}

impl Controller {
    /// The controller of kube-sim at `addr` (no authentication).
    fn start(
        addr: SocketAddr,
        endpoint: &str,
        dir: &std::path::Path,
        extra: &[&str],
    ) -> Controller {
        let kubeconfig = dir.join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: s\n  cluster: {{server: \"http://{addr}\"}}\n\
                 contexts:\n- name: s\n  context: {{cluster: s, user: u}}\ncurrent-context: s\nusers:\n- name: u\n  user: {{}}\n"
            ),
        )
        .unwrap();
        Controller::start_with(&kubeconfig, endpoint, dir, extra)
    }

    fn start_with(
        kubeconfig: &std::path::Path,
        endpoint: &str,
        dir: &std::path::Path,
        extra: &[&str],
    ) -> Controller {
        let port = free_port();
        let child = Command::new(BIN)
            .args(["run", "--identity", "bench", "--listen"])
            .arg(format!("127.0.0.1:{port}"))
            .args(["--aws-endpoint-url", endpoint])
            .args(extra)
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join(format!("controller-{port}.log"))).unwrap())
            .spawn()
            .expect("the controller binary");
        Controller { child, port }
    }

    fn get(&self, path: &str) -> Option<(u16, String)> {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        write!(s, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").ok()?;
        let mut buf = String::new();
        s.read_to_string(&mut buf).ok()?;
        let code = buf.split(' ').nth(1)?.parse().ok()?;
        Some((code, buf.split_once("\r\n\r\n")?.1.to_string()))
    }

    fn wait_leader(&self) {
        let deadline = Instant::now() + Duration::from_secs(120);
        while Instant::now() < deadline {
            if let Some((200, body)) = self.get("/metrics") {
                // Leading, with a policy, and its first decision made.
                if body.contains("gpu_node_autoscaler_leader 1")
                    && body.contains("gpu_node_autoscaler_policy_valid 1")
                    && !body.contains("gpu_node_autoscaler_plan_duration_seconds_count 0")
                    && body.contains("gpu_node_autoscaler_plan_duration_seconds_count")
                {
                    return;
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("the controller did not become a ready leader");
    }

    /// (peak, current) resident set in MiB.
    fn rss_mib(&self) -> (f64, f64) {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .unwrap_or_default();
        let kib = |f: &str| {
            status
                .lines()
                .find(|l| l.starts_with(f))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        (kib("VmHWM:") / 1024.0, kib("VmRSS:") / 1024.0)
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The benchmark's runtime, and moto with the network (VPC, subnets, launch template) the
/// policy names.
fn runtime_and_moto() -> (tokio::runtime::Runtime, aws::Moto, aws::Network) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let moto = aws::Moto::start();
    let ec2 = rt.block_on(aws::ec2(&moto.url()));
    let net = rt.block_on(aws::network(&ec2));
    (rt, moto, net)
}

fn main() {
    let runs: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(5);
    if std::env::args().any(|a| a == "real") {
        return real_control_plane(runs);
    }
    let (rt, moto, net) = runtime_and_moto();
    let dir = std::env::temp_dir().join(format!("gna-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();

    println!("reaction: 1,000 nodes, 10,000 pending GPU pods created at once ({runs} runs)");
    let mut reactions = Vec::new();
    for run in 0..runs {
        let proxy = rt.block_on(aws::proxy::FaultProxy::start(moto.addr));
        let addr = kube_sim::spawn_background(kube_sim::Config::api_only()).unwrap();
        let cluster = format!("bench-{run}-{}", std::process::id());
        let c = rt.block_on(setup(addr, &cluster, &net));
        rt.block_on(create_all(Api::all(c.clone()), 1_000, |i| node(i, false)));
        // No periodic pass during the run: only the pods becoming unschedulable trigger one.
        let ctl = Controller::start(addr, &proxy.url(), &dir, &["--resync", "10m"]);
        ctl.wait_leader();
        let before = proxy.calls_of("CreateFleet");
        let api_for = |i: usize| Api::<Pod>::namespaced(c.clone(), &format!("team-{}", i % 10));
        rt.block_on(async {
            futures::stream::iter(0..10_000usize)
                .map(|i| {
                    let api = api_for(i);
                    async move {
                        api.create(&PostParams::default(), &gpu_pod(i, None))
                            .await
                            .expect("create pod");
                    }
                })
                .buffer_unordered(32)
                .collect::<Vec<()>>()
                .await;
        });
        assert_eq!(
            proxy.calls_of("CreateFleet"),
            before,
            "launched before any pod was unschedulable"
        );
        let t0 = Instant::now();
        let unschedulable = json!({"status": {"conditions": [{"type": "PodScheduled",
            "status": "False", "reason": "Unschedulable",
            "message": "0/1000 nodes are available: 1000 Insufficient nvidia.com/gpu."}]}});
        rt.block_on(async {
            futures::stream::iter(0..10_000usize)
                .map(|i| {
                    let api = api_for(i);
                    let patch = unschedulable.clone();
                    async move {
                        api.patch_status(
                            &format!("train-{i:06}"),
                            &PatchParams::default(),
                            &Patch::Merge(&patch),
                        )
                        .await
                        .expect("mark unschedulable");
                    }
                })
                .buffer_unordered(32)
                .collect::<Vec<()>>()
                .await;
        });
        let created = Instant::now();
        let deadline = created + Duration::from_secs(120);
        while proxy.calls_of("CreateFleet") == before {
            assert!(Instant::now() < deadline, "no launch within 120 s");
            std::thread::sleep(Duration::from_millis(2));
        }
        let launched = Instant::now();
        let r = launched.duration_since(created).as_secs_f64();
        println!(
            "  run {run}: 10,000 pods marked unschedulable in {:.2} s; first CreateFleet {:.3} s after the last",
            created.duration_since(t0).as_secs_f64(),
            r
        );
        reactions.push(r);
        drop(ctl);
    }
    reactions.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let p50 = reactions[reactions.len() / 2];
    let max = *reactions.last().unwrap();
    println!(
        "  first launch after the last pod marked: p50 {p50:.3} s, max (p99 of {runs}) {max:.3} s"
    );

    println!("memory: 5,000 nodes, 100,000 pods");
    let addr = kube_sim::spawn_background(kube_sim::Config::api_only()).unwrap();
    let cluster = format!("bench-rss-{}", std::process::id());
    let c = rt.block_on(setup(addr, &cluster, &net));
    let t = Instant::now();
    rt.block_on(create_all(Api::all(c.clone()), 5_000, |i| node(i, true)));
    rt.block_on(async {
        futures::stream::iter(0..100_000usize)
            .map(|i| {
                let api = Api::<Pod>::namespaced(c.clone(), &format!("team-{}", i % 10));
                async move {
                    api.create(
                        &PostParams::default(),
                        &gpu_pod(i, Some(format!("node-{:05}", i % 5_000))),
                    )
                    .await
                    .expect("create pod");
                }
            })
            .buffer_unordered(32)
            .collect::<Vec<()>>()
            .await;
    });
    println!("  loaded in {:.1} s", t.elapsed().as_secs_f64());
    let proxy = rt.block_on(aws::proxy::FaultProxy::start(moto.addr));
    let t = Instant::now();
    let ctl = Controller::start(addr, &proxy.url(), &dir, &[]);
    ctl.wait_leader();
    // Synced and leading; let it make a few decisions (resync every 10 s).
    let deadline = Instant::now() + Duration::from_secs(120);
    while proxy.calls_of("DescribeInstances") < 2 {
        assert!(Instant::now() < deadline, "no decision within 120 s");
        std::thread::sleep(Duration::from_millis(100));
    }
    println!(
        "  synced and deciding after {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let (peak, now) = ctl.rss_mib();
    println!("  controller RSS: peak {peak:.0} MiB, now {now:.0} MiB");
    drop(ctl);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Nodes and pods of the run on the real control plane.
const REAL_NODES: usize = 1_000;
const REAL_PODS: usize = 10_000;

/// A CPU node kwok plays the kubelet of (it keeps it Ready and renews its Lease).
fn kwok_node(i: usize) -> Node {
    let mut n = node(i, false);
    n.metadata.annotations = Some(
        [("kwok.x-k8s.io/node".to_string(), "fake".to_string())]
            .into_iter()
            .collect(),
    );
    n
}

/// The seconds from `t0` to each instant, sorted.
fn sorted_secs(v: &[f64]) -> Vec<f64> {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v
}

/// The reaction on the real control plane: etcd, kube-apiserver, kube-controller-manager,
/// kube-scheduler and kwok (test-support's `Cluster`, the binaries `scripts/control-plane.sh`
/// builds), `REAL_NODES` kwok CPU nodes, and the controller with the RBAC `deploy/` grants.
/// `REAL_PODS` one-GPU pods are created; kube-scheduler marks each `Unschedulable` (no node has
/// a GPU). Measured from the last pod marked (as the benchmark's own watch sees it) to the first
/// `CreateFleet` reaching the relay; and the controller's peak RSS.
fn real_control_plane(runs: usize) {
    use gpu_node_autoscaler_test_support::cluster::{Cluster, ClusterOptions};
    use kube::runtime::watcher;
    use std::collections::HashSet;

    let (rt, moto, net) = runtime_and_moto();
    let dir = std::env::temp_dir().join(format!("gna-bench-real-{}", std::process::id()));
    println!(
        "reaction on the real control plane: {REAL_NODES} kwok nodes, {REAL_PODS} pending GPU \
         pods marked by kube-scheduler ({runs} runs)"
    );
    let (mut reactions, mut spans, mut peaks) = (Vec::new(), Vec::new(), Vec::new());
    for run in 0..runs {
        let run_dir = dir.join(format!("run-{run}"));
        std::fs::create_dir_all(&run_dir).unwrap();
        let cluster = Cluster::start(
            &run_dir,
            &ClusterOptions {
                quiet: true,
                ..ClusterOptions::default()
            },
        );
        let proxy = Arc::new(rt.block_on(aws::proxy::FaultProxy::start(moto.addr)));
        let admin = rt.block_on(async {
            let kc = kube::config::Kubeconfig::read_from(&cluster.admin).unwrap();
            let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .unwrap();
            kube::Client::try_from(config).unwrap()
        });
        for i in 0..10 {
            let ns: k8s_openapi::api::core::v1::Namespace =
                serde_json::from_value(json!({"metadata": {"name": format!("team-{i}")}})).unwrap();
            rt.block_on(Api::all(admin.clone()).create(&PostParams::default(), &ns))
                .expect("namespace");
        }
        // The batching window closes once no new unschedulable pod arrived for 1 s; its
        // maximum is long enough not to close while kube-scheduler is still marking.
        let name = format!("bench-real-{run}-{}", std::process::id());
        let pol =
            policy(&name, &net).replacen("pools:", "batching: {idle: 1s, max: 10m}\npools:", 1);
        let cm: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": "gpu-node-autoscaler-policy", "namespace": "kube-system"},
            "data": {"policy.yaml": pol}
        }))
        .unwrap();
        rt.block_on(
            Api::<ConfigMap>::namespaced(admin.clone(), "kube-system")
                .create(&PostParams::default(), &cm),
        )
        .expect("policy");
        let t = Instant::now();
        rt.block_on(create_all(Api::all(admin.clone()), REAL_NODES, kwok_node));
        let nodes_s = t.elapsed().as_secs_f64();
        let ctl = Controller::start_with(
            &cluster.controller,
            &proxy.url(),
            &run_dir,
            &["--resync", "10m"],
        );
        ctl.wait_leader();
        let before = proxy.calls_of("CreateFleet");

        // The first CreateFleet, as the relay sees it.
        let launched = {
            let proxy = proxy.clone();
            rt.spawn(async move {
                while proxy.calls_of("CreateFleet") == before {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                Instant::now()
            })
        };
        // Every pod marked unschedulable, as a watch sees it: (first, last).
        let marked = rt.spawn({
            let pods = Api::<Pod>::all(admin.clone());
            async move {
                let mut seen = HashSet::new();
                let mut first = None;
                let mut stream = std::pin::pin!(watcher(pods, watcher::Config::default()));
                while let Some(ev) = stream.next().await {
                    let ps = match ev {
                        Ok(watcher::Event::Apply(p)) | Ok(watcher::Event::InitApply(p)) => vec![p],
                        _ => continue,
                    };
                    for p in ps {
                        let unschedulable = p
                            .status
                            .as_ref()
                            .and_then(|s| s.conditions.as_ref())
                            .is_some_and(|cs| {
                                cs.iter().any(|c| {
                                    c.type_ == "PodScheduled"
                                        && c.status == "False"
                                        && c.reason.as_deref() == Some("Unschedulable")
                                })
                            });
                        if unschedulable && seen.insert(p.metadata.name.clone().unwrap()) {
                            first.get_or_insert_with(Instant::now);
                            if seen.len() == REAL_PODS {
                                return (first.unwrap(), Instant::now());
                            }
                        }
                    }
                }
                panic!("the pod watch ended");
            }
        });
        let t0 = Instant::now();
        rt.block_on(async {
            futures::stream::iter(0..REAL_PODS)
                .map(|i| {
                    let api = Api::<Pod>::namespaced(admin.clone(), &format!("team-{}", i % 10));
                    let mut pod = gpu_pod(i, None);
                    // Bare pods: the garbage collector would delete pods of Jobs that do not
                    // exist.
                    pod.metadata.owner_references = None;
                    async move {
                        api.create(&PostParams::default(), &pod)
                            .await
                            .expect("create pod");
                    }
                })
                .buffer_unordered(32)
                .collect::<Vec<()>>()
                .await;
        });
        let created_s = t0.elapsed().as_secs_f64();
        let (first, last) = rt
            .block_on(async { tokio::time::timeout(Duration::from_secs(600), marked).await })
            .expect("every pod marked unschedulable within 600 s")
            .unwrap();
        let launched = rt
            .block_on(async { tokio::time::timeout(Duration::from_secs(120), launched).await })
            .expect("a launch within 120 s of the last pod marked")
            .unwrap();
        // Negative when the window closed before kube-scheduler marked the last pod.
        let r = if launched >= last {
            launched.duration_since(last).as_secs_f64()
        } else {
            -last.duration_since(launched).as_secs_f64()
        };
        let (peak, now) = ctl.rss_mib();
        println!(
            "  run {run}: {REAL_NODES} nodes created in {nodes_s:.1} s; {REAL_PODS} pods created \
             in {created_s:.1} s, marked unschedulable over {:.1} s (first {:.1} s after the \
             first creation); first CreateFleet {r:.3} s after the last; controller RSS peak \
             {peak:.0} MiB, now {now:.0} MiB",
            last.duration_since(first).as_secs_f64(),
            first.duration_since(t0).as_secs_f64(),
        );
        reactions.push(r);
        spans.push(last.duration_since(first).as_secs_f64());
        peaks.push(peak);
        drop(ctl);
        drop(cluster);
        let _ = std::fs::remove_dir_all(&run_dir);
    }
    let r = sorted_secs(&reactions);
    let pct = |v: &[f64], q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    println!(
        "  first launch after the last pod marked: p50 {:.3} s, p99 {:.3} s (of {runs}); \
         marking took {:.1}–{:.1} s; controller peak RSS {:.0}–{:.0} MiB",
        pct(&r, 0.5),
        pct(&r, 0.99),
        sorted_secs(&spans)[0],
        sorted_secs(&spans)[spans.len() - 1],
        sorted_secs(&peaks)[0],
        sorted_secs(&peaks)[peaks.len() - 1],
    );
    let _ = std::fs::remove_dir_all(&dir);
}
