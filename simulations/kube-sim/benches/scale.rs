//! Scale benchmark: 5,000 nodes and 100,000 pods loaded over HTTP, then a full pod list, four
//! concurrent watchers following 10,000 pod status changes, four watchers starting from scratch,
//! and the process's peak RSS (server and client share the process).
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

fn peak_rss_mib() -> (f64, f64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
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

/// Creates `items` with `conns` concurrent keep-alive connections.
async fn load(addr: SocketAddr, conns: usize, items: Vec<(String, Value)>) {
    let per = items.len().div_ceil(conns);
    let mut tasks = Vec::new();
    let mut items = items.into_iter();
    for _ in 0..conns {
        let chunk: Vec<(String, Value)> = items.by_ref().take(per).collect();
        tasks.push(tokio::spawn(async move {
            let mut c = connect(addr).await;
            for (path, obj) in chunk {
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

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let nodes = args.first().copied().unwrap_or(5_000);
    let pods = args.get(1).copied().unwrap_or(100_000);
    let changes = args.get(2).copied().unwrap_or(10_000);

    let addr = kube_sim::spawn_background(kube_sim::Config::api_only()).expect("kube-sim");
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
        load(addr, 4, (0..nodes).map(|i| ("/api/v1/nodes".to_string(), node(i))).collect()).await;
        let node_load = t.elapsed();
        let t = Instant::now();
        let items = (0..pods)
            .map(|i| (format!("/api/v1/namespaces/team-{}/pods", i % 10), pod(i, nodes)))
            .collect();
        load(addr, 4, items).await;
        let pod_load = t.elapsed();
        println!("kube-sim scale benchmark: {nodes} nodes, {pods} pods, {changes} changes");
        println!(
            "load: {nodes} nodes in {:.2} s, {pods} pods in {:.2} s ({:.0} creates/s, 4 connections)",
            node_load.as_secs_f64(),
            pod_load.as_secs_f64(),
            pods as f64 / pod_load.as_secs_f64()
        );
        let (_, rss_loaded) = peak_rss_mib();
        println!("RSS after loading: {rss_loaded:.0} MiB");

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
            let (_, body) = call(&mut c, "GET", &path, "", Vec::new()).await;
            let list: Value = serde_json::from_slice(&body).unwrap();
            pages += 1;
            match list["metadata"]["continue"].as_str() {
                Some(next) => cont = next.to_string(),
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
        let (peak, now) = peak_rss_mib();
        println!("peak RSS (VmHWM, server and client in one process): {peak:.0} MiB; RSS now {now:.0} MiB");
    });
}
