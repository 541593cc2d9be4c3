//! kube-rs watchers against kube-sim: they survive forced watch closes (resuming from their
//! resourceVersion) and a 410 Gone (re-listing), and keep seeing changes.

use std::net::SocketAddr;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, PostParams};
use kube::runtime::watcher::{self, watcher, Event};
use kube::runtime::WatchStreamExt;
use kube::Client;
use serde_json::json;
use tokio::sync::mpsc;

fn client(addr: SocketAddr) -> Client {
    let config = kube::Config::new(format!("http://{addr}").parse().unwrap());
    Client::try_from(config).expect("a kube client")
}

fn pod(name: &str) -> Pod {
    serde_json::from_value(json!({"metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "i"}]}}))
    .unwrap()
}

/// What the test sees of the watcher's events: "init", "init-apply a", "init-done", "apply a".
async fn next(rx: &mut mpsc::UnboundedReceiver<String>) -> String {
    tokio::time::timeout(Duration::from_secs(60), rx.recv())
        .await
        .expect("a watcher event within 60 s")
        .expect("the watcher runs")
}

/// Collects events until `want` shows up; returns everything seen before it.
async fn until(rx: &mut mpsc::UnboundedReceiver<String>, want: &str) -> Vec<String> {
    let mut seen = Vec::new();
    loop {
        let e = next(rx).await;
        if e == want {
            return seen;
        }
        seen.push(e);
    }
}

async fn admin_close_watches(addr: SocketAddr) {
    let (c, body) = tokio::task::spawn_blocking(move || {
        crate::common::post(addr, "/admin/watches/close", &json!({}))
    })
    .await
    .unwrap();
    assert_eq!(c, 200, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_watcher_survives_watch_closes_and_410_gone() {
    // A short history, and no bookmarks, so that the watcher's resourceVersion can fall out of it.
    let addr = kube_sim::spawn_background(kube_sim::Config {
        watch_history: 20,
        bookmark_interval: Duration::from_secs(3600),
        ..kube_sim::Config::api_only()
    })
    .unwrap();
    let client = client(addr);
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");

    let (tx, mut rx) = mpsc::unbounded_channel();
    let watched = pods.clone();
    tokio::spawn(async move {
        let mut stream = watcher(watched, watcher::Config::default())
            .default_backoff()
            .boxed();
        while let Some(ev) = stream.next().await {
            // Errors (the 410) are retried by the watcher itself after a back-off.
            let Ok(ev) = ev else { continue };
            let name = |p: &Pod| p.metadata.name.clone().unwrap_or_default();
            let text = match ev {
                Event::Init => "init".to_string(),
                Event::InitApply(p) => format!("init-apply {}", name(&p)),
                Event::InitDone => "init-done".to_string(),
                Event::Apply(p) => format!("apply {}", name(&p)),
                Event::Delete(p) => format!("delete {}", name(&p)),
            };
            if tx.send(text).is_err() {
                return;
            }
        }
    });
    assert_eq!(next(&mut rx).await, "init");
    assert_eq!(next(&mut rx).await, "init-done");

    pods.create(&PostParams::default(), &pod("a"))
        .await
        .unwrap();
    assert_eq!(next(&mut rx).await, "apply a");

    // A forced close: the watcher resumes from its resourceVersion, without re-listing.
    admin_close_watches(addr).await;
    pods.create(&PostParams::default(), &pod("b"))
        .await
        .unwrap();
    let before = until(&mut rx, "apply b").await;
    assert!(
        before.is_empty(),
        "no relist after a plain close: {before:?}"
    );

    // Enough other changes to push the watcher's resourceVersion out of the history, then a
    // close: the resumed watch gets 410 Gone and the watcher lists again.
    for i in 0..30 {
        let cm: ConfigMap =
            serde_json::from_value(json!({"metadata": {"name": format!("cm-{i}")}})).unwrap();
        cms.create(&PostParams::default(), &cm).await.unwrap();
    }
    admin_close_watches(addr).await;
    assert_eq!(until(&mut rx, "init").await, Vec::<String>::new());
    let relisted = until(&mut rx, "init-done").await;
    assert_eq!(relisted, ["init-apply a", "init-apply b"]);

    // And it keeps following changes.
    pods.create(&PostParams::default(), &pod("c"))
        .await
        .unwrap();
    assert_eq!(next(&mut rx).await, "apply c");
    pods.delete("a", &Default::default()).await.unwrap();
    assert_eq!(next(&mut rx).await, "delete a");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_rides_out_injected_errors_and_early_closes() {
    let addr = kube_sim::spawn_background(kube_sim::Config {
        faults: kube_sim::Faults {
            watch_close_after: Some(Duration::from_millis(300)),
            ..Default::default()
        },
        ..kube_sim::Config::api_only()
    })
    .unwrap();
    let client = client(addr);
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let (tx, mut rx) = mpsc::unbounded_channel();
    let watched = cms.clone();
    tokio::spawn(async move {
        let mut stream = watcher(watched, watcher::Config::default())
            .default_backoff()
            .applied_objects()
            .boxed();
        while let Some(ev) = stream.next().await {
            if let Ok(cm) = ev {
                if tx.send(cm.metadata.name.unwrap_or_default()).is_err() {
                    return;
                }
            }
        }
    });
    // Every watch ends after 300 ms and, from now on, half the requests fail: the watcher keeps
    // going and sees every object, some more than once (after re-lists).
    let (c, _) = tokio::task::spawn_blocking(move || {
        crate::common::put(
            addr,
            "/admin/faults",
            &json!({"errorRate": 0.5, "errorCode": 503, "watchCloseAfterSeconds": 0.3}),
        )
    })
    .await
    .unwrap();
    assert_eq!(c, 200);
    let mut created = Vec::new();
    for i in 0..5 {
        let name = format!("cm-{i}");
        let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
        // The test's own writes may hit an injected error too: retry them.
        loop {
            match cms.create(&PostParams::default(), &cm).await {
                Ok(_) => break,
                Err(kube::Error::Api(e)) if e.code == 503 => continue,
                Err(kube::Error::Api(e)) if e.code == 409 => break,
                Err(e) => panic!("create {name}: {e}"),
            }
        }
        created.push(name);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut seen = std::collections::BTreeSet::new();
    while seen.len() < created.len() {
        seen.insert(next(&mut rx).await);
    }
    assert_eq!(seen.into_iter().collect::<Vec<_>>(), created);
}
