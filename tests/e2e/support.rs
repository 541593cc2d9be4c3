//! The end-to-end harness: a `moto_server` (EC2), the real Kubernetes control plane (see
//! [`crate::cluster`]) with kwok as the kubelets, the EC2 bridge registering the instances as
//! Nodes the way their kubelets would, the real `gpu-node-autoscaler run` binary running as its
//! ServiceAccount with the RBAC of `deploy/`, and the real `kubectl`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::cluster::{Cluster, ClusterOptions, KubeNodes};
use crate::kube_proxy::KubeFaultProxy;
use kube_sim::nodes::{CloudBridge, NodeStyle};

use serde_json::Value;

pub use gpu_node_autoscaler_test_support::moto as aws;

pub use aws::proxy::FaultProxy;
use aws::{Moto, Network};

pub const CLUSTER: &str = "e2e";

/// One test's world. Everything started is stopped when it is dropped.
pub struct Env {
    pub rt: tokio::runtime::Runtime,
    pub moto: Moto,
    pub ec2: aws_sdk_ec2::Client,
    pub net: Network,
    pub cluster: Cluster,
    bridges: Vec<BridgeThread>,
    pub dir: PathBuf,
    pub proxy: Option<FaultProxy>,
    /// Between the controllers and the API server, when asked for.
    pub kube_proxy: Option<KubeFaultProxy>,
    controller_kubeconfig: PathBuf,
    controllers: Vec<(String, Child, u16)>,
    controller_env: Vec<(String, String)>,
}

#[derive(Default)]
pub struct Options {
    /// Put a fault-injecting proxy between the controller and moto.
    pub proxy: bool,
    /// How long an instance takes to become a Node (default 2 s).
    pub boot_delay: Option<Duration>,
    /// Also run the ESS bridge (Alibaba Cloud scaling groups, e.g. the provider's fake).
    pub ess: Option<kube_sim::EssConfig>,
    /// The control plane's set-up (e.g. an RBAC rule taken out).
    pub cluster: ClusterOptions,
    /// Put a fault-injecting relay between the controllers and the API server.
    pub kube_proxy: bool,
    /// More environment for the controllers (e.g. Alibaba Cloud credentials).
    pub controller_env: Vec<(String, String)>,
    /// The kubelets' `--register-with-taints` (`key=value:Effect`), as a launch template gives.
    pub register_with_taints: Vec<String>,
    /// CPU the kubelets reserve (`--kube-reserved=cpu=...`), in milli.
    pub kube_reserved_cpu_milli: u64,
}

use crate::cluster::free_port;

/// The pod annotation after which kwok completes a running pod (crates/test-support/kwok-stages.yaml).
pub const RUN_DURATION: &str = "gpu-node-autoscaler.io/e2e-run-duration";

/// A cloud bridge polling in a thread of its own until dropped.
struct BridgeThread {
    stop: Arc<AtomicBool>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Drop for BridgeThread {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// Runs a cloud bridge (made by `make` in the thread's runtime) against the real API server:
/// every instance of the cluster becomes a kwok Node as its kubelet would register it (no pool
/// label, no pool taints).
fn spawn_bridge<B: CloudBridge>(
    make: impl FnOnce(&tokio::runtime::Runtime) -> B + Send + 'static,
    admin: PathBuf,
) -> BridgeThread {
    let stop = Arc::new(AtomicBool::new(false));
    let stopped = stop.clone();
    let handle = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let mut bridge = make(&rt);
        let mut nodes = KubeNodes::new(&admin);
        while !stopped.load(Ordering::Relaxed) {
            let started = Instant::now();
            let due = rt
                .block_on(bridge.observe())
                .and_then(|(instances, known)| bridge.reconcile(&mut nodes, &instances, known));
            let next = due
                .map(|d| d.into_std())
                .unwrap_or(started + bridge.poll_interval())
                .min(started + bridge.poll_interval());
            while Instant::now() < next && !stopped.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    });
    BridgeThread {
        stop,
        handle: Some(handle),
    }
}

impl Env {
    pub fn start(name: &str, opts: Options) -> Env {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let moto = Moto::start();
        let ec2 = rt.block_on(aws::ec2(&moto.url()));
        let net = rt.block_on(aws::network(&ec2));
        let proxy = opts
            .proxy
            .then(|| rt.block_on(FaultProxy::start(moto.addr)));
        let dir = std::env::temp_dir().join(format!("gna-e2e-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let cluster = Cluster::start(&dir, &opts.cluster);
        let mut bridge = kube_sim::Ec2Config::new(&moto.url(), aws::REGION, CLUSTER);
        // Another cluster's instances (same name, another identity) never join this one.
        bridge.cluster_id = Some(cluster.identity());
        bridge.boot_delay = opts.boot_delay.unwrap_or(Duration::from_secs(2));
        bridge.device_plugin_delay = Duration::from_secs(1);
        bridge.register_with_taints = opts.register_with_taints.clone();
        bridge.kube_reserved_cpu_milli = opts.kube_reserved_cpu_milli;
        let mut bridges = vec![spawn_bridge(
            move |rt| rt.block_on(kube_sim::ec2::Bridge::new(bridge, NodeStyle::Kubelet)),
            cluster.admin.clone(),
        )];
        if let Some(ess) = opts.ess.clone() {
            bridges.push(spawn_bridge(
                move |_| kube_sim::ess::Bridge::new(ess, NodeStyle::Kubelet).expect("ESS bridge"),
                cluster.admin.clone(),
            ));
        }
        let kube_proxy = opts
            .kube_proxy
            .then(|| KubeFaultProxy::start(&rt, cluster.addr(), &cluster.ca));
        let controller_kubeconfig = match &kube_proxy {
            Some(p) => cluster.controller_kubeconfig_via(&p.url()),
            None => cluster.controller.clone(),
        };
        let env = Env {
            kube_proxy,
            controller_kubeconfig,
            rt,
            moto,
            ec2,
            net,
            cluster,
            bridges,
            dir,
            proxy,
            controllers: Vec::new(),
            controller_env: opts.controller_env,
        };
        // A CPU node for what runs outside the GPU pools (an MPI launcher, a web pod).
        env.create(
            r#"
apiVersion: v1
kind: Node
metadata:
  name: system-0
  labels: {kubernetes.io/hostname: system-0, node-role: system}
  annotations: {kwok.x-k8s.io/node: fake}
status:
  capacity: {cpu: "8", memory: 32Gi, pods: "110"}
  allocatable: {cpu: "8", memory: 32Gi, pods: "110"}
  conditions:
  - {type: Ready, status: "True"}
"#,
        );
        env
    }

    /// The policy, for `zones`, with test-short delays.
    pub fn policy(&self, zones: &[&str], extra_pool: &str) -> String {
        let subnets: Vec<String> = zones
            .iter()
            .map(|z| format!("{z}: {}", self.net.subnets[*z]))
            .collect();
        format!(
            "clusterName: {CLUSTER}\nregion: us-east-1\nzones: [{zones}]\n\
             batching: {{idle: 1s, max: 3s}}\nmaxNodeProvisionTime: 2m\ninsufficientCapacityTtl: 3m\n\
             pools:\n- name: a10g\n  instanceTypes: [g5.xlarge]\n  capacityTypes: [spot, on-demand]\n  maxNodes: 6\n\
             {extra_pool}  taints:\n  - {{key: nvidia.com/gpu, value: \"true\", effect: NoSchedule}}\n\
             \x20 scaleDown: {{cooldownAfterScaleUp: 5s, unneededTime: 5s, backoffAfterFailure: 10m}}\n\
             \x20 aws:\n    launchTemplate: {{name: {lt}}}\n    subnets: {{{subnets}}}\n",
            zones = zones.join(", "),
            lt = self.net.launch_template,
            subnets = subnets.join(", "),
        )
    }

    /// An SQS queue in moto (the interruption queue a policy names): a client and its URL.
    pub fn sqs_queue(&self, name: &str) -> (aws_sdk_sqs::Client, String) {
        let sqs = self.rt.block_on(async {
            let sdk = aws_config::defaults(aws_config::BehaviorVersion::latest())
                .region(aws_config::Region::new(aws::REGION))
                .endpoint_url(self.moto.url())
                .load()
                .await;
            aws_sdk_sqs::Client::new(&sdk)
        });
        let url = self.rt.block_on(async {
            sqs.create_queue()
                .queue_name(name)
                .send()
                .await
                .expect("CreateQueue")
                .queue_url()
                .unwrap()
                .to_string()
        });
        (sqs, url)
    }

    pub fn policy_configmap(&self, policy: &str) -> String {
        let indented: String = policy.lines().map(|l| format!("    {l}\n")).collect();
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: gpu-node-autoscaler-policy\n  namespace: kube-system\ndata:\n  policy.yaml: |\n{indented}"
        )
    }

    pub fn kubectl(&self, args: &[&str]) -> Output {
        Command::new("kubectl")
            .env("KUBECONFIG", "/dev/null")
            .arg(format!("--kubeconfig={}", self.cluster.admin.display()))
            .arg(format!("--cache-dir={}", self.dir.join("cache").display()))
            .args(args)
            .output()
            .expect("kubectl (scripts/test.sh installs it)")
    }

    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// `kubectl create -f` of a YAML text.
    pub fn create(&self, yaml: &str) {
        let f = self.dir.join(format!("obj-{}.yaml", free_port()));
        std::fs::write(&f, yaml).unwrap();
        self.kubectl_ok(&["create", "-f", f.to_str().unwrap()]);
    }

    pub fn apply(&self, yaml: &str) {
        let f = self.dir.join(format!("obj-{}.yaml", free_port()));
        std::fs::write(&f, yaml).unwrap();
        self.kubectl_ok(&["apply", "-f", f.to_str().unwrap()]);
    }

    pub fn get_json(&self, args: &[&str]) -> Value {
        let mut a = args.to_vec();
        a.extend(["-o", "json"]);
        serde_json::from_str(&self.kubectl_ok(&a)).unwrap()
    }

    /// Starts `gpu-node-autoscaler run` as `identity`; its log goes to `<dir>/<identity>.log`.
    pub fn start_controller(&mut self, identity: &str, extra: &[&str]) {
        let port = free_port();
        let endpoint = match &self.proxy {
            Some(p) => p.url(),
            None => self.moto.url(),
        };
        let log = std::fs::File::create(self.dir.join(format!("{identity}.log"))).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_gpu-node-autoscaler"))
            .args([
                "run",
                "--identity",
                identity,
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--aws-endpoint-url",
                &endpoint,
            ])
            // Test-short defaults, unless the test sets them.
            .args(
                [
                    ("--resync", "2s"),
                    ("--lease-duration", "4s"),
                    ("--lease-retry", "1s"),
                ]
                .into_iter()
                .filter(|(flag, _)| !extra.contains(flag))
                .flat_map(|(flag, value)| [flag, value]),
            )
            .args(extra)
            // The controller's ServiceAccount token: only what deploy/ grants.
            .env("KUBECONFIG", &self.controller_kubeconfig)
            .env("AWS_ACCESS_KEY_ID", "testing")
            .env("AWS_SECRET_ACCESS_KEY", "testing")
            .env("AWS_SESSION_TOKEN", "testing")
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .envs(self.controller_env.clone())
            .env("RUST_LOG", "info,kube=warn,aws=warn,hyper=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("the gpu-node-autoscaler binary");
        self.controllers.push((identity.to_string(), child, port));
    }

    pub fn log(&self, identity: &str) -> String {
        std::fs::read_to_string(self.dir.join(format!("{identity}.log"))).unwrap_or_default()
    }

    /// `kill -9` of a controller.
    pub fn kill(&mut self, identity: &str) {
        if let Some(i) = self.controllers.iter().position(|(n, _, _)| n == identity) {
            let (_, mut c, _) = self.controllers.remove(i);
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM to a controller, and wait for it to exit.
    pub fn terminate(&mut self, identity: &str) {
        if let Some(i) = self.controllers.iter().position(|(n, _, _)| n == identity) {
            let (_, mut c, _) = self.controllers.remove(i);
            let ok = Command::new("kill")
                .args(["-TERM", &c.id().to_string()])
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "kill -TERM");
            let deadline = Instant::now() + Duration::from_secs(30);
            while c.try_wait().ok().flatten().is_none() {
                assert!(
                    Instant::now() < deadline,
                    "{identity} did not exit on SIGTERM"
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }

    /// A controller's endpoint (`/metrics`, `/readyz`, ...), or None when it does not answer.
    pub fn http_get(&self, identity: &str, path: &str) -> Option<(u16, String)> {
        let port = self
            .controllers
            .iter()
            .find(|(n, _, _)| n == identity)
            .map(|(_, _, p)| *p)?;
        http_get(&format!("127.0.0.1:{port}"), path)
    }

    pub fn metric(&self, identity: &str, line_prefix: &str) -> Option<f64> {
        let (_, body) = self.http_get(identity, "/metrics")?;
        body.lines()
            .find(|l| l.starts_with(line_prefix))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
    }

    /// Polls `f` until it returns Some, failing with `what` and the controllers' logs after
    /// `timeout`.
    pub fn wait_for<T>(
        &self,
        what: &str,
        timeout: Duration,
        mut f: impl FnMut() -> Option<T>,
    ) -> T {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(t) = f() {
                return t;
            }
            if Instant::now() > deadline {
                let logs: String = self
                    .controllers
                    .iter()
                    .map(|(n, _, _)| format!("--- {n}\n{}", tail(&self.log(n), 60)))
                    .collect();
                let world = self
                    .kubectl(&["get", "nodes,pods,pdb", "-A", "-o", "wide"])
                    .stdout;
                panic!(
                    "timed out waiting for {what}\n{logs}\n--- cluster\n{}",
                    String::from_utf8_lossy(&world)
                );
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Every instance of the cluster that EC2 knows (all states), as (id, view).
    pub fn instances(&self) -> Vec<(String, aws::Ec2View)> {
        self.rt.block_on(async {
            let r = self
                .ec2
                .describe_instances()
                .filters(
                    aws_sdk_ec2::types::Filter::builder()
                        .name("tag:gpu-node-autoscaler.io/cluster")
                        .values(CLUSTER)
                        .build(),
                )
                .send()
                .await
                .expect("DescribeInstances");
            let mut out = Vec::new();
            for res in r.reservations() {
                for i in res.instances() {
                    let id = i.instance_id().unwrap_or_default().to_string();
                    out.push((id.clone(), aws::describe(&self.ec2, &id).await));
                }
            }
            out
        })
    }

    pub fn live_instances(&self) -> Vec<(String, aws::Ec2View)> {
        self.instances()
            .into_iter()
            .filter(|(_, v)| v.state == "pending" || v.state == "running")
            .collect()
    }

    /// Events with this reason, as "object: message" lines.
    pub fn events(&self, reason: &str) -> Vec<String> {
        let mut out = Vec::new();
        // One store behind both APIs on a real API server: read it once.
        for api in ["events.v1.events.k8s.io"] {
            let v = self.get_json(&["get", api, "-A"]);
            for e in v["items"].as_array().into_iter().flatten() {
                if e["reason"] == reason {
                    let obj = if e["regarding"].is_object() {
                        &e["regarding"]
                    } else {
                        &e["involvedObject"]
                    };
                    let msg = e["note"].as_str().or(e["message"].as_str()).unwrap_or("");
                    out.push(format!("{}: {msg}", obj["name"].as_str().unwrap_or("")));
                }
            }
        }
        out
    }

    pub fn pod_phase(&self, ns: &str, name: &str) -> String {
        let v = self.get_json(&["get", "pod", "-n", ns, name]);
        v["status"]["phase"].as_str().unwrap_or("").to_string()
    }

    /// Nodes of the GPU pool.
    pub fn pool_nodes(&self) -> Vec<Value> {
        let v = self.get_json(&["get", "nodes", "-l", "gpu-node-autoscaler.io/pool"]);
        v["items"].as_array().cloned().unwrap_or_default()
    }

    /// The status ConfigMap's `status.json` (Null until it exists).
    pub fn status_json(&self) -> Value {
        let out = self.kubectl(&[
            "get",
            "configmap",
            "-n",
            "kube-system",
            "gpu-node-autoscaler-status",
            "-o",
            "jsonpath={.data.status\\.json}",
        ]);
        serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        for (_, c, _) in &mut self.controllers {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.bridges.clear();
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A minimal HTTP/1.0 GET.
pub fn http_get(addr: &str, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    let code = buf.split(' ').nth(1)?.parse().ok()?;
    let body = buf
        .split_once("\r\n\r\n")
        .map(|x| x.1)
        .unwrap_or("")
        .to_string();
    Some((code, body))
}

/// A bare GPU pod (1 × nvidia.com/gpu), tolerating the pool's taint.
pub fn gpu_pod(
    ns: &str,
    name: &str,
    labels: &BTreeMap<&str, &str>,
    run_for: Option<&str>,
) -> String {
    let labels: String = labels
        .iter()
        .map(|(k, v)| format!("    {k}: \"{v}\"\n"))
        .collect();
    let ann = run_for
        .map(|d| format!("  annotations:\n    {RUN_DURATION}: {d}\n"))
        .unwrap_or_default();
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {ns}\n  labels:\n    app: gpu\n{labels}{ann}\
         spec:\n  tolerations:\n  - {{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}}\n  containers:\n  - name: main\n    image: cuda:12\n    resources:\n      requests: {{cpu: \"1\", memory: 2Gi, nvidia.com/gpu: \"1\"}}\n      limits: {{nvidia.com/gpu: \"1\"}}\n"
    )
}
