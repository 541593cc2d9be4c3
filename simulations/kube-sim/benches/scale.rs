//! Scale benchmark: 5,000 nodes and 100,000 pods loaded over HTTP, then a full pod list, four
//! concurrent watchers following 10,000 pod status changes, four watchers starting from scratch,
//! and peak RSS. The server is the `kube-sim` binary (scheduler and kubelets off) in a child
//! process, so that its memory (`VmHWM` in `/proc/<pid>/status`) is the server's alone.
//!
//! `cargo bench -p kube-sim --bench scale` (optional arguments: NODES PODS CHANGES).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::Request;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};

type Conn = SendRequest<Full<Bytes>>;

async fn connect(addr: SocketAddr) -> Conn {
    let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    stream.set_nodelay(true).ok();
    let (send, conn) = http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    send
}

async fn call(conn: &mut Conn, method: &str, path: &str, ct: &str, body: Vec<u8>) -> (u16, Bytes) {
    conn.ready().await.expect("connection ready");
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "kube-sim")
        .header("content-type", ct)
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let resp = conn.send_request(req).await.expect("request");
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    (status, body)
}

fn node(i: usize) -> Value {
    json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": format!("node-{i:05}"), "labels": {
            "node.kubernetes.io/instance-type": "p4d.24xlarge",
            "topology.kubernetes.io/zone": format!("us-east-1{}", ["a", "b", "c"][i % 3]),
            "gpu-node-autoscaler.io/pool": "gpu", "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}},
        "spec": {"providerID": format!("aws:///us-east-1a/i-{i:017x}")},
        "status": {
            "capacity": {"cpu": "96", "memory": "1152Gi", "pods": "110", "nvidia.com/gpu": "8"},
            "allocatable": {"cpu": "96", "memory": "1152Gi", "pods": "110", "nvidia.com/gpu": "8"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]}})
}

/// Pod `i`, bound round-robin to one of `nodes` nodes.
fn pod(i: usize, nodes: usize) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("train-{i:06}"), "namespace": format!("team-{}", i % 10),
            "labels": {"app": "train", "job": format!("job-{}", i / 20)},
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": format!("job-{}", i / 20),
                "uid": format!("00000000-0000-0000-0000-{:012}", i / 20), "controller": true}]},
        "spec": {"nodeName": format!("node-{:05}", i % nodes),
            "containers": [{"name": "main", "image": "registry.example/trainer:1.0",
                "resources": {"requests": {"cpu": "4", "memory": "32Gi"}, "limits": {"nvidia.com/gpu": "1"}}}],
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}})
}

/// (VmHWM, VmRSS) of a process in MiB.
fn rss_mib(pid: &str) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib = |field: &str| {
        status
            .lines()
            .find(|l| l.starts_with(field))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (kib("VmHWM:") / 1024.0, kib("VmRSS:") / 1024.0)
}

/// Creates `make(0..n)` with `conns` concurrent keep-alive connections.
async fn load<F>(addr: SocketAddr, conns: usize, n: usize, make: F)
where
    F: Fn(usize) -> (String, Value) + Copy + Send + 'static,
{
    let mut tasks = Vec::new();
    for k in 0..conns {
        tasks.push(tokio::spawn(async move {
            let mut c = connect(addr).await;
            for i in (k..n).step_by(conns) {
                let (path, obj) = make(i);
                let (code, body) = call(
                    &mut c,
                    "POST",
                    &path,
                    "application/json",
                    obj.to_string().into_bytes(),
                )
                .await;
                assert_eq!(code, 201, "{}", String::from_utf8_lossy(&body));
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

/// Opens a watch and counts its events until it has seen `want` of them; returns the time taken.
async fn watch_count(addr: SocketAddr, path: String, want: usize, started: Instant) -> Duration {
    let mut c = connect(addr).await;
    c.ready().await.unwrap();
    let req = Request::builder()
        .uri(path)
        .header("host", "kube-sim")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let mut body = c.send_request(req).await.expect("watch").into_body();
    let mut seen = 0;
    while seen < want {
        let frame = body.frame().await.expect("watch open").expect("frame");
        if let Some(d) = frame.data_ref() {
            seen += d.iter().filter(|b| **b == b'\n').count();
        }
    }
    started.elapsed()
}

/// The list's `metadata.continue`, found in the head that precedes the items.
fn continue_token(body: &[u8]) -> Option<String> {
    let head = &body[..body.len().min(1024)];
    let key = b"\"continue\":\"";
    let at = head.windows(key.len()).position(|w| w == key)? + key.len();
    let end = head[at..].iter().position(|b| *b == b'"')?;
    Some(String::from_utf8_lossy(&head[at..at + end]).to_string())
}

/// The `kube-sim` binary on a free port, killed when dropped.
struct Server {
    child: std::process::Child,
    addr: SocketAddr,
}

impl Server {
    fn start() -> Server {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_kube-sim"))
            .args([
                "--listen",
                &addr.to_string(),
                "--no-scheduler",
                "--no-kubelet",
            ])
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start kube-sim");
        for _ in 0..200 {
            if std::net::TcpStream::connect(addr).is_ok() {
                return Server { child, addr };
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!("kube-sim did not listen on {addr}");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let nodes = args.first().copied().unwrap_or(5_000);
    let pods = args.get(1).copied().unwrap_or(100_000);
    let changes = args.get(2).copied().unwrap_or(10_000);
    assert!(
        pods >= changes && nodes > 0,
        "PODS must be at least CHANGES"
    );

    let server = Server::start();
    let addr = server.addr;
    let pid = server.child.id().to_string();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let mut c = connect(addr).await;
        for ns in 0..10 {
            let body = json!({"metadata": {"name": format!("team-{ns}")}}).to_string();
            call(&mut c, "POST", "/api/v1/namespaces", "application/json", body.into_bytes()).await;
        }
        let t = Instant::now();
        load(addr, 4, nodes, |i| ("/api/v1/nodes".to_string(), node(i))).await;
        let node_load = t.elapsed();
        let t = Instant::now();
        load(addr, 4, pods, move |i| {
            (format!("/api/v1/namespaces/team-{}/pods", i % 10), pod(i, nodes))
        })
        .await;
        let pod_load = t.elapsed();
        println!("kube-sim scale benchmark: {nodes} nodes, {pods} pods, {changes} changes");
        println!(
            "load: {nodes} nodes in {:.2} s, {pods} pods in {:.2} s ({:.0} creates/s, 4 connections)",
            node_load.as_secs_f64(),
            pod_load.as_secs_f64(),
            pods as f64 / pod_load.as_secs_f64()
        );
        let (_, rss_loaded) = rss_mib(&pid);
        println!("server RSS after loading: {rss_loaded:.0} MiB");

        let mut times = Vec::new();
        let mut rv = String::new();
        let mut size = 0;
        for _ in 0..3 {
            let t = Instant::now();
            let (code, body) = call(&mut c, "GET", "/api/v1/pods", "", Vec::new()).await;
            times.push(t.elapsed());
            assert_eq!(code, 200);
            size = body.len();
            let list: Value = serde_json::from_slice(&body).expect("a pod list");
            assert_eq!(list["items"].as_array().map(Vec::len), Some(pods));
            rv = list["metadata"]["resourceVersion"].as_str().unwrap().to_string();
        }
        let (peak_lists, _) = rss_mib(&pid);
        times.sort();
        println!(
            "full pod list (GET /api/v1/pods, JSON): {:.0} ms median, {:.0} ms best of 3, {:.1} MiB",
            times[1].as_secs_f64() * 1000.0,
            times[0].as_secs_f64() * 1000.0,
            size as f64 / (1024.0 * 1024.0)
        );
        let t = Instant::now();
        let mut pages = 0;
        let mut cont = String::new();
        loop {
            let path = format!("/api/v1/pods?limit=500&continue={cont}");
            let (code, body) = call(&mut c, "GET", &path, "", Vec::new()).await;
            assert_eq!(code, 200);
            pages += 1;
            match continue_token(&body) {
                Some(next) => cont = next,
                None => break,
            }
        }
        println!(
            "paginated pod list (limit=500, {pages} pages): {:.0} ms",
            t.elapsed().as_secs_f64() * 1000.0
        );

        // Four watchers from the list's resourceVersion, then status changes from 4 writers.
        let started = Instant::now();
        let watchers: Vec<_> = (0..4)
            .map(|_| {
                let path = format!("/api/v1/pods?watch=1&resourceVersion={rv}");
                tokio::spawn(watch_count(addr, path, changes, started))
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(200)).await;
        let t = Instant::now();
        let mut writers = Vec::new();
        for w in 0..4 {
            writers.push(tokio::spawn(async move {
                let mut c = connect(addr).await;
                for i in (w..changes).step_by(4) {
                    let path = format!("/api/v1/namespaces/team-{}/pods/train-{i:06}/status", i % 10);
                    let patch = json!({"status": {"phase": "Running"}}).to_string();
                    let (code, _) =
                        call(&mut c, "PATCH", &path, "application/merge-patch+json", patch.into_bytes()).await;
                    assert_eq!(code, 200);
                }
            }));
        }
        for w in writers {
            w.await.unwrap();
        }
        let writes = t.elapsed();
        let mut slowest = Duration::ZERO;
        for w in watchers {
            slowest = slowest.max(w.await.unwrap());
        }
        println!(
            "4 concurrent watchers: {changes} status patches in {:.2} s ({:.0} writes/s); every watcher had all {changes} events {:.2} s after the first write",
            writes.as_secs_f64(),
            changes as f64 / writes.as_secs_f64(),
            (slowest - Duration::from_millis(200)).as_secs_f64()
        );

        // Four watchers starting from scratch: each gets one ADDED per pod first.
        let started = Instant::now();
        let watchers: Vec<_> = (0..4)
            .map(|_| tokio::spawn(watch_count(addr, "/api/v1/pods?watch=1".to_string(), pods, started)))
            .collect();
        let mut slowest = Duration::ZERO;
        for w in watchers {
            slowest = slowest.max(w.await.unwrap());
        }
        println!(
            "4 concurrent watches without a resourceVersion: {pods} initial ADDED events each in {:.2} s",
            slowest.as_secs_f64()
        );
        let (peak, now) = rss_mib(&pid);
        println!(
            "server peak RSS (VmHWM): {peak_lists:.0} MiB after loading and three full lists, \
             {peak:.0} MiB at the end; RSS now {now:.0} MiB"
        );
    });
}
