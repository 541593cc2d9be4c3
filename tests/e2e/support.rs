//! The end-to-end harness: a `moto_server` (EC2), kube-sim with its scheduler, kubelets and EC2
//! bridge, the real `gpu-node-autoscaler run` binary, and the real `kubectl`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

#[path = "../../providers/aws/tests/support/mod.rs"]
#[allow(dead_code)]
pub mod aws;

pub use aws::proxy::FaultProxy;
use aws::{Moto, Network};

pub const CLUSTER: &str = "e2e";

/// One test's world. Everything started is stopped when it is dropped.
pub struct Env {
    pub rt: tokio::runtime::Runtime,
    pub moto: Moto,
    pub ec2: aws_sdk_ec2::Client,
    pub net: Network,
    pub kube: SocketAddr,
    pub dir: PathBuf,
    pub proxy: Option<FaultProxy>,
    controllers: Vec<(String, Child, u16)>,
    controller_env: Vec<(String, String)>,
}

#[derive(Default)]
pub struct Options {
    /// Put a fault-injecting proxy between the controller and moto.
    pub proxy: bool,
    /// How long an instance takes to become a Node (default 2 s).
    pub boot_delay: Option<Duration>,
    /// Also run kube-sim's ESS bridge (Alibaba Cloud scaling groups, e.g. the provider's fake).
    pub ess: Option<kube_sim::EssConfig>,
    /// More environment for the controllers (e.g. Alibaba Cloud credentials).
    pub controller_env: Vec<(String, String)>,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
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
        let mut bridge = kube_sim::Ec2Config::new(&moto.url(), aws::REGION, CLUSTER);
        bridge.boot_delay = opts.boot_delay.unwrap_or(Duration::from_secs(2));
        bridge.device_plugin_delay = Duration::from_secs(1);
        let kube = kube_sim::spawn_background(kube_sim::Config {
            ec2: Some(bridge),
            ess: opts.ess.clone(),
            ..kube_sim::Config::default()
        })
        .expect("kube-sim");
        let dir = std::env::temp_dir().join(format!("gna-e2e-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("kubeconfig"),
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: sim\n  cluster: {{server: \"http://{kube}\"}}\n\
                 contexts:\n- name: sim\n  context: {{cluster: sim, user: u}}\ncurrent-context: sim\n\
                 users:\n- name: u\n  user: {{}}\n"
            ),
        )
        .unwrap();
        let env = Env {
            rt,
            moto,
            ec2,
            net,
            kube,
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

    pub fn policy_configmap(&self, policy: &str) -> String {
        let indented: String = policy.lines().map(|l| format!("    {l}\n")).collect();
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: gpu-node-autoscaler-policy\n  namespace: kube-system\ndata:\n  policy.yaml: |\n{indented}"
        )
    }

    pub fn kubectl(&self, args: &[&str]) -> Output {
        Command::new("kubectl")
            .env("KUBECONFIG", "/dev/null")
            .arg(format!("--server=http://{}", self.kube))
            .arg(format!("--cache-dir={}", self.dir.join("cache").display()))
            .args(args)
            .output()
            .expect("kubectl (on the machine image)")
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

    /// Runs kubectl until it succeeds (the API server may be failing requests on purpose).
    pub fn kubectl_retry(&self, args: &[&str]) -> String {
        for _ in 0..60 {
            let out = self.kubectl(args);
            if out.status.success() {
                return String::from_utf8_lossy(&out.stdout).into_owned();
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        panic!("kubectl {args:?} kept failing");
    }

    /// `kubectl create -f` of a YAML text, retried.
    pub fn create_retry(&self, yaml: &str) {
        let f = self.dir.join(format!("obj-{}.yaml", free_port()));
        std::fs::write(&f, yaml).unwrap();
        for _ in 0..60 {
            let out = self.kubectl(&["create", "-f", f.to_str().unwrap()]);
            let err = String::from_utf8_lossy(&out.stderr);
            if out.status.success() || err.contains("AlreadyExists") {
                return;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        panic!("kubectl create kept failing");
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
            .env("KUBECONFIG", self.dir.join("kubeconfig"))
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
                panic!("timed out waiting for {what}\n{logs}");
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

    /// Events (core/v1) with this reason, as "object: message" lines.
    pub fn events(&self, reason: &str) -> Vec<String> {
        let mut out = Vec::new();
        for api in ["events", "events.v1.events.k8s.io"] {
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

    pub fn set_kube_faults(&self, json: &str) {
        let out = Command::new("curl")
            .args([
                "-sf",
                "-X",
                "PUT",
                "-H",
                "content-type: application/json",
                "--data",
                json,
            ])
            .arg(format!("http://{}/admin/faults", self.kube))
            .output()
            .expect("curl");
        assert!(out.status.success(), "PUT /admin/faults failed");
    }

    pub fn close_watches(&self) {
        let out = Command::new("curl")
            .args(["-sf", "-X", "POST"])
            .arg(format!("http://{}/admin/watches/close", self.kube))
            .output()
            .expect("curl");
        assert!(out.status.success(), "POST /admin/watches/close failed");
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        for (_, c, _) in &mut self.controllers {
            let _ = c.kill();
            let _ = c.wait();
        }
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
        .map(|d| format!("  annotations:\n    kube-sim.gpu-node-autoscaler.io/run-duration: {d}\n"))
        .unwrap_or_default();
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {ns}\n  labels:\n    app: gpu\n{labels}{ann}\
         spec:\n  tolerations:\n  - {{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}}\n  containers:\n  - name: main\n    image: cuda:12\n    resources:\n      requests: {{cpu: \"1\", memory: 2Gi, nvidia.com/gpu: \"1\"}}\n      limits: {{nvidia.com/gpu: \"1\"}}\n"
    )
}
