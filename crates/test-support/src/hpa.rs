//! The GPU HPA chain of a real cluster, for the end-to-end tests: a dcgm-exporter stand-in
//! ([`DcgmExporter`]) serving the real exporter's metric names and labels for the pods running on
//! the cluster's kwok GPU Nodes, driven by a load the test sets; and the real prometheus-adapter
//! ([`PrometheusAdapter`], built pinned by `scripts/prometheus-adapter.sh`) serving them as the
//! `custom.metrics.k8s.io` API through the kube-apiserver's aggregation layer, on loopback.
//!
//! dcgm-exporter is the one stand-in: it needs a GPU and NVIDIA's driver, neither of which is
//! here. Prometheus (scraping it), the adapter, the aggregator and the HPA controller of
//! kube-controller-manager are the real programs.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::cluster::{free_port, Cluster};

/// dcgm-exporter's driver-version label on every series (the exposition of the e2e testdata).
const DRIVER_VERSION: &str = "570.172.08";

/// A GPU (or MIG slice, or share of a GPU) held by a running pod, as dcgm-exporter reports it.
#[derive(Debug, Clone, PartialEq)]
struct Device {
    node: String,
    gpu: u32,
    /// `GPU_I_PROFILE`, `GPU_I_ID` for a MIG slice.
    mig: Option<(String, u32)>,
    model: String,
    namespace: String,
    pod: String,
    container: String,
    /// The pod's `app` label: what the load is set by.
    app: String,
}

/// Per (namespace, `app` label): the work the test sets, in GPUs' worth; every running pod of
/// that app reports an equal share of it (as behind a load balancer), at most 100 %.
type Load = BTreeMap<(String, String), f64>;

/// A dcgm-exporter stand-in on a loopback port: `/metrics` answers with `DCGM_FI_DEV_GPU_UTIL`,
/// `DCGM_FI_DEV_FB_USED` and `DCGM_FI_PROF_GR_ENGINE_ACTIVE` for every GPU, MIG slice or GPU share
/// that a Running pod holds on a kwok Node, with the exporter's labels (`gpu`, `UUID`,
/// `pci_bus_id`, `device`, `modelName`, `Hostname`, `DCGM_FI_DRIVER_VERSION`, `container`,
/// `namespace`, `pod`, and `GPU_I_PROFILE`, `GPU_I_ID` on a MIG slice). The pods are read from the
/// API server every second (dcgm-exporter reads the kubelet's pod-resources API).
pub struct DcgmExporter {
    pub port: u16,
    load: Arc<Mutex<Load>>,
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl DcgmExporter {
    pub fn start(cluster: &Cluster) -> DcgmExporter {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let load = Arc::new(Mutex::new(Load::new()));
        let devices = Arc::new(Mutex::new(Vec::<Device>::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        {
            let (devices, stop) = (devices.clone(), stop.clone());
            let admin = cluster.admin.clone();
            let cache = cluster.dir.join("dcgm-kubectl-cache");
            threads.push(std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if let Some(d) = read_devices(&admin, &cache) {
                        *devices.lock().unwrap() = d;
                    }
                    for _ in 0..10 {
                        if stop.load(Ordering::Relaxed) {
                            break;
                        }
                        std::thread::sleep(Duration::from_millis(100));
                    }
                }
            }));
        }
        {
            let (devices, load, stop) = (devices.clone(), load.clone(), stop.clone());
            threads.push(std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((conn, _)) => {
                            let body = exposition(
                                &devices.lock().unwrap().clone(),
                                &load.lock().unwrap().clone(),
                            );
                            let _ = serve_exposition(conn, &body);
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(20)),
                    }
                }
            }));
        }
        DcgmExporter {
            port,
            load,
            stop,
            threads,
        }
    }

    /// Sets the work of the pods labelled `app` in `namespace`, in GPUs' worth (e.g. 1.0: one GPU
    /// busy in all; two running pods then report 50 % each).
    pub fn set_load(&self, namespace: &str, app: &str, gpus: f64) {
        self.load
            .lock()
            .unwrap()
            .insert((namespace.to_string(), app.to_string()), gpus);
    }
}

impl Drop for DcgmExporter {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn kubectl_json(admin: &Path, cache: &Path, args: &[&str]) -> Option<Value> {
    let out = Command::new("kubectl")
        .env("KUBECONFIG", "/dev/null")
        .arg(format!("--kubeconfig={}", admin.display()))
        .arg(format!("--cache-dir={}", cache.display()))
        .args(args)
        .args(["-o", "json"])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    serde_json::from_slice(&out.stdout).ok()
}

/// The devices the running pods hold on kwok Nodes: whole GPUs (`nvidia.com/gpu`), MIG slices
/// (`nvidia.com/mig-<profile>`) and GPU shares (`aliyun.com/gpu-mem`, reported on GPU 0 as the
/// share's owner), numbered per Node in the order of the pods' names.
fn read_devices(admin: &Path, cache: &Path) -> Option<Vec<Device>> {
    let nodes = kubectl_json(admin, cache, &["get", "nodes"])?;
    let pods = kubectl_json(admin, cache, &["get", "pods", "-A"])?;
    let mut models = BTreeMap::new();
    for n in nodes["items"].as_array()? {
        if n["metadata"]["annotations"]["kwok.x-k8s.io/node"] != "fake" {
            continue;
        }
        // The GPU feature discovery label, e.g. NVIDIA-A10G, as the exporter names it: NVIDIA A10G.
        if let Some(product) = n["metadata"]["labels"]["nvidia.com/gpu.product"].as_str() {
            let name = n["metadata"]["name"].as_str()?.to_string();
            models.insert(name, product.replace('-', " "));
        }
    }
    let mut pods: Vec<&Value> = pods["items"]
        .as_array()?
        .iter()
        .filter(|p| {
            p["status"]["phase"] == "Running"
                && p["metadata"]["deletionTimestamp"].is_null()
                && p["spec"]["nodeName"]
                    .as_str()
                    .is_some_and(|n| models.contains_key(n))
        })
        .collect();
    pods.sort_by_key(|p| {
        (
            p["spec"]["nodeName"].as_str().unwrap_or("").to_string(),
            p["metadata"]["name"].as_str().unwrap_or("").to_string(),
        )
    });
    let mut next_gpu: BTreeMap<String, u32> = BTreeMap::new();
    let mut next_mig: BTreeMap<String, u32> = BTreeMap::new();
    let mut out = Vec::new();
    for p in pods {
        let node = p["spec"]["nodeName"].as_str()?.to_string();
        let model = models[&node].clone();
        for c in p["spec"]["containers"].as_array()? {
            let limits = &c["resources"]["limits"];
            let requests = &c["resources"]["requests"];
            let amount = |r: &str| -> u32 {
                limits[r]
                    .as_str()
                    .or(requests[r].as_str())
                    .and_then(|q| q.parse().ok())
                    .unwrap_or(0)
            };
            let mut held: Vec<(u32, Option<(String, u32)>)> = Vec::new();
            for _ in 0..amount("nvidia.com/gpu") {
                let g = next_gpu.entry(node.clone()).or_default();
                held.push((*g, None));
                *g += 1;
            }
            let resources = limits
                .as_object()
                .into_iter()
                .chain(requests.as_object())
                .flat_map(|m| m.keys().cloned())
                .collect::<std::collections::BTreeSet<String>>();
            for r in resources {
                let Some(profile) = r.strip_prefix("nvidia.com/mig-") else {
                    continue;
                };
                for _ in 0..amount(&r) {
                    let i = next_mig.entry(node.clone()).or_default();
                    // Slices of one profile fill GPU 0 first, seven 1g slices to a GPU.
                    held.push((*i / 7, Some((profile.to_string(), *i % 7))));
                    *i += 1;
                }
            }
            if amount("aliyun.com/gpu-mem") > 0 {
                held.push((0, None));
            }
            for (gpu, mig) in held {
                out.push(Device {
                    node: node.clone(),
                    gpu,
                    mig,
                    model: model.clone(),
                    namespace: p["metadata"]["namespace"].as_str()?.to_string(),
                    pod: p["metadata"]["name"].as_str()?.to_string(),
                    container: c["name"].as_str()?.to_string(),
                    app: p["metadata"]["labels"]["app"]
                        .as_str()
                        .unwrap_or("")
                        .to_string(),
                });
            }
        }
    }
    Some(out)
}

/// A stable GPU UUID for a Node's GPU, in NVIDIA's format.
fn uuid(node: &str, gpu: u32) -> String {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in node.bytes().chain(gpu.to_le_bytes()) {
        h = (h ^ u64::from(b)).wrapping_mul(0x100000001b3);
    }
    let x = format!("{h:016x}{:016x}", h.rotate_left(29) ^ 0x9e3779b97f4a7c15);
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &x[0..8],
        &x[8..12],
        &x[12..16],
        &x[16..20],
        &x[20..32]
    )
}

/// dcgm-exporter's exposition for `devices` under `load`.
fn exposition(devices: &[Device], load: &Load) -> String {
    // Running pods per app: the work is shared among them.
    let mut pods_of: BTreeMap<(String, String), std::collections::BTreeSet<&str>> = BTreeMap::new();
    for d in devices {
        pods_of
            .entry((d.namespace.clone(), d.app.clone()))
            .or_default()
            .insert(&d.pod);
    }
    let util = |d: &Device| -> f64 {
        let key = (d.namespace.clone(), d.app.clone());
        let work = load.get(&key).copied().unwrap_or(0.0);
        let n = pods_of.get(&key).map_or(1, |s| s.len().max(1)) as f64;
        (100.0 * work / n).clamp(0.0, 100.0)
    };
    let labels = |d: &Device| -> String {
        let mig = d
            .mig
            .as_ref()
            .map(|(profile, id)| format!(",GPU_I_PROFILE=\"{profile}\",GPU_I_ID=\"{id}\""))
            .unwrap_or_default();
        format!(
            "gpu=\"{gpu}\",UUID=\"{uuid}\",pci_bus_id=\"00000000:{bus:02X}:00.0\",device=\"nvidia{gpu}\",\
             modelName=\"{model}\",Hostname=\"{node}\",DCGM_FI_DRIVER_VERSION=\"{DRIVER_VERSION}\"{mig},\
             container=\"{container}\",namespace=\"{ns}\",pod=\"{pod}\"",
            gpu = d.gpu,
            uuid = uuid(&d.node, d.gpu),
            bus = 0x1E + d.gpu,
            model = d.model,
            node = d.node,
            container = d.container,
            ns = d.namespace,
            pod = d.pod,
        )
    };
    let mut out = String::new();
    // A MIG slice has no DCGM_FI_DEV_GPU_UTIL (DCGM reports it per GPU, not per GPU instance):
    // the profiling field is what measures a slice.
    out.push_str(
        "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).\n# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n",
    );
    for d in devices.iter().filter(|d| d.mig.is_none()) {
        out.push_str(&format!(
            "DCGM_FI_DEV_GPU_UTIL{{{}}} {}\n",
            labels(d),
            util(d).round()
        ));
    }
    out.push_str(
        "# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).\n\
         # TYPE DCGM_FI_DEV_FB_USED gauge\n",
    );
    for d in devices {
        // Model weights resident, plus activations growing with the load.
        out.push_str(&format!(
            "DCGM_FI_DEV_FB_USED{{{}}} {}\n",
            labels(d),
            (4096.0 + 40.0 * util(d)).round()
        ));
    }
    out.push_str(
        "# HELP DCGM_FI_PROF_GR_ENGINE_ACTIVE Ratio of time the graphics engine is active.\n\
         # TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge\n",
    );
    for d in devices {
        out.push_str(&format!(
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{}}} {:.6}\n",
            labels(d),
            util(d) / 100.0
        ));
    }
    out
}

/// Answers one HTTP request on `conn` with `body` as Prometheus' text exposition format, then
/// closes it (what a scrape target does for one scrape).
pub fn serve_exposition(mut conn: TcpStream, body: &str) -> std::io::Result<()> {
    conn.set_nonblocking(false)?;
    conn.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = conn.read(&mut buf)?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    write!(
        conn,
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// The prometheus-adapter binary: `$GNA_PROMETHEUS_ADAPTER_BIN`, else where
/// `scripts/prometheus-adapter.sh` builds it. A missing binary fails with the command that builds it.
pub fn adapter_bin() -> PathBuf {
    let bin = crate::tool_path(
        "GNA_PROMETHEUS_ADAPTER_BIN",
        "prometheus-adapter.sh",
        "--print-bin",
    );
    assert!(
        bin.is_file(),
        "{} is missing: the GPU HPA tests run the real prometheus-adapter; build it with \
         `bash scripts/prometheus-adapter.sh` (scripts/test.sh does)",
        bin.display()
    );
    bin
}

/// The real prometheus-adapter on a loopback port, with a rule file, reading Prometheus at a URL
/// and the cluster with a kubeconfig (its ServiceAccount's). Stopped on drop.
pub struct PrometheusAdapter {
    child: Child,
    pub port: u16,
    dir: PathBuf,
}

impl PrometheusAdapter {
    /// Starts it with `config` (the adapter's rules, the `config.yaml` of its ConfigMap), its
    /// files in `dir`; returns once its `/healthz` answers.
    pub fn start(
        dir: &Path,
        kubeconfig: &Path,
        prometheus_url: &str,
        config: &str,
    ) -> PrometheusAdapter {
        // Series discovery every 2 s (default 10 m), so a new pod's metric is served soon.
        PrometheusAdapter::start_relisting(
            dir,
            kubeconfig,
            prometheus_url,
            config,
            Duration::from_secs(2),
        )
    }

    /// [`PrometheusAdapter::start`] with the series relisted every `relist`.
    pub fn start_relisting(
        dir: &Path,
        kubeconfig: &Path,
        prometheus_url: &str,
        config: &str,
        relist: Duration,
    ) -> PrometheusAdapter {
        let dir = dir.join("prometheus-adapter");
        std::fs::create_dir_all(&dir).unwrap();
        let config_file = dir.join("config.yaml");
        std::fs::write(&config_file, config).unwrap();
        let port = free_port();
        let kc = kubeconfig.display().to_string();
        let log = std::fs::File::create(dir.join("adapter.log")).unwrap();
        let child = Command::new(adapter_bin())
            .args([
                "--bind-address=127.0.0.1",
                &format!("--secure-port={port}"),
                &format!("--cert-dir={}", dir.join("certs").display()),
                &format!("--lister-kubeconfig={kc}"),
                &format!("--authentication-kubeconfig={kc}"),
                &format!("--authorization-kubeconfig={kc}"),
                &format!("--prometheus-url={prometheus_url}"),
                &format!("--config={}", config_file.display()),
                &format!("--metrics-relist-interval={}ms", relist.as_millis().max(1)),
                "--v=2",
            ])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting prometheus-adapter: {e}"));
        let mut a = PrometheusAdapter { child, port, dir };
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            if let Ok(Some(status)) = a.child.try_wait() {
                panic!("prometheus-adapter exited ({status}): {}", a.log());
            }
            let out = Command::new("curl")
                .args(["-sk", "--max-time", "5"])
                .arg(format!("https://127.0.0.1:{port}/healthz"))
                .output();
            if out.is_ok_and(|o| o.stdout == b"ok") {
                return a;
            }
            assert!(
                Instant::now() < deadline,
                "prometheus-adapter not healthy after 90 s: {}",
                a.log()
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("adapter.log")).unwrap_or_default()
    }
}

impl Drop for PrometheusAdapter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let log = self.log();
            let lines: Vec<&str> = log.lines().collect();
            eprintln!(
                "--- prometheus-adapter\n{}",
                lines[lines.len().saturating_sub(40)..].join("\n")
            );
        }
    }
}

/// The Service an APIService names, made to reach a server on this machine's loopback: an
/// `ExternalName` Service for `localhost`, which the aggregator resolves to `localhost:<the
/// APIService's port>` (a ClusterIP would need a Service network this machine has not).
pub fn loopback_service(namespace: &str, name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: {namespace}\n\
         spec:\n  type: ExternalName\n  externalName: localhost\n"
    )
}

/// The repository's `deploy/examples/gpu-hpa/prometheus-adapter.yaml`: the adapter's RBAC, its
/// rule ConfigMap, its Deployment and Service, and the two APIServices.
pub const ADAPTER_EXAMPLE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../deploy/examples/gpu-hpa/prometheus-adapter.yaml"
);

/// The chain of a cluster, running until dropped: the exporter stand-in, the real Prometheus
/// scraping it and the real prometheus-adapter serving it as `custom.metrics.k8s.io`.
pub struct Chain {
    pub exporter: DcgmExporter,
    pub prometheus: crate::prometheus::Prometheus,
    pub adapter: PrometheusAdapter,
}

impl Chain {
    /// Starts the exporter stand-in, Prometheus scraping it every `scrape`, and the adapter as
    /// its ServiceAccount with [`ADAPTER_EXAMPLE`]'s rule (series relisted every `relist`),
    /// registered as the custom.metrics.k8s.io APIService as the example writes it, its Service
    /// reaching the adapter's loopback port; returns once the aggregator serves that API. The
    /// files go to `dir`.
    pub fn start(
        cluster: &Cluster,
        dir: &Path,
        scrape: Duration,
        relist: Duration,
    ) -> Result<Chain, String> {
        let text = std::fs::read_to_string(ADAPTER_EXAMPLE)
            .map_err(|e| format!("{ADAPTER_EXAMPLE}: {e}"))?;
        let docs = gpu_node_autoscaler_core::yaml::parse_all(&text)
            .map_err(|e| format!("{ADAPTER_EXAMPLE}: {e}"))?;
        let exporter = DcgmExporter::start(cluster);
        let prometheus =
            crate::prometheus::Prometheus::start_every(dir, "dcgm-exporter", exporter.port, scrape);
        let kind = |d: &Value| d["kind"].as_str().unwrap_or("").to_string();
        let apply = |name: &str, items: &[Value]| -> Result<(), String> {
            let f = dir.join(format!("{name}-{}.json", free_port()));
            let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items});
            std::fs::write(&f, list.to_string()).map_err(|e| format!("{}: {e}", f.display()))?;
            cluster
                .kubectl(&["apply", "-f", f.to_str().unwrap()])
                .map(|_| ())
        };
        // Everything but the adapter's Deployment and Service (the adapter runs here, on
        // loopback) and the APIServices (once it serves).
        let rest: Vec<Value> = docs
            .iter()
            .filter(|d| !matches!(kind(d).as_str(), "Deployment" | "Service" | "APIService"))
            .cloned()
            .collect();
        apply("adapter-rbac", &rest)?;
        let config = docs
            .iter()
            .find(|d| kind(d) == "ConfigMap")
            .and_then(|d| d["data"]["config.yaml"].as_str())
            .ok_or_else(|| {
                format!("{ADAPTER_EXAMPLE}: no ConfigMap with the adapter's config.yaml")
            })?
            .to_string();
        let token = cluster.kubectl(&[
            "create",
            "token",
            "prometheus-adapter",
            "-n",
            "monitoring",
            "--duration=24h",
        ])?;
        let kubeconfig = cluster.kubeconfig_with_token("prometheus-adapter", token.trim());
        let adapter =
            PrometheusAdapter::start_relisting(dir, &kubeconfig, &prometheus.url, &config, relist);
        let mut apiservices = Vec::new();
        let mut services = Vec::new();
        for d in docs.iter().filter(|d| kind(d) == "APIService") {
            let mut d = d.clone();
            let svc = &d["spec"]["service"];
            let service = loopback_service(
                svc["namespace"].as_str().unwrap_or_default(),
                svc["name"].as_str().unwrap_or_default(),
            );
            services.push(
                gpu_node_autoscaler_core::yaml::parse(&service)
                    .map_err(|e| format!("the loopback Service: {e}"))?,
            );
            d["spec"]["service"]["port"] = serde_json::json!(adapter.port);
            apiservices.push(d);
        }
        if apiservices.len() != 2 {
            return Err(format!(
                "{ADAPTER_EXAMPLE}: expected the v1beta1 and v1beta2 APIServices, found {}",
                apiservices.len()
            ));
        }
        services.dedup();
        apply("adapter-services", &services)?;
        apply("adapter-apiservices", &apiservices)?;
        let deadline = Instant::now() + Duration::from_secs(120);
        while cluster
            .kubectl(&["get", "--raw", "/apis/custom.metrics.k8s.io/v1beta2"])
            .is_err()
        {
            if Instant::now() > deadline {
                return Err(format!(
                    "the aggregator does not serve custom.metrics.k8s.io/v1beta2 after 2 minutes: {}",
                    adapter.log()
                ));
            }
            std::thread::sleep(Duration::from_millis(300));
        }
        Ok(Chain {
            exporter,
            prometheus,
            adapter,
        })
    }
}
