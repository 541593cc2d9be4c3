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
//! `cargo bench --features controller --bench controller [-- RUNS]` (moto_server must be installed: scripts/test.sh).

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
        let port = free_port();
        let child = Command::new(BIN)
            .args(["run", "--identity", "bench", "--listen"])
            .arg(format!("127.0.0.1:{port}"))
            .args(["--aws-endpoint-url", endpoint])
            .args(extra)
            .env("KUBECONFIG", &kubeconfig)
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

fn main() {
    let runs: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(5);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let moto = aws::Moto::start();
    let ec2 = rt.block_on(aws::ec2(&moto.url()));
    let net = rt.block_on(aws::network(&ec2));
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
