//! Fault injection: flags, the admin endpoint, failing shares of requests, watch closes, delays.

use std::time::{Duration, Instant};

use crate::common::{get, post, put, request_full, start, start_with, Watch};
use serde_json::json;

const CMS: &str = "/api/v1/namespaces/default/configmaps";

fn with_faults(faults: kube_sim::Faults) -> std::net::SocketAddr {
    start_with(kube_sim::Config {
        faults,
        ..kube_sim::Config::api_only()
    })
}

#[test]
fn admin_endpoint_reads_and_replaces_the_settings() {
    let a = start();
    let (c, f) = get(a, "/admin/faults");
    assert_eq!(c, 200);
    assert_eq!(
        f,
        json!({"errorRate": 0.0, "errorCode": 500, "watchCloseAfterSeconds": 0.0, "delayMs": 0.0})
    );
    let want = json!({"errorRate": 0.2, "errorCode": 429, "watchCloseAfterSeconds": 5.0, "delayMs": 200.0});
    let (c, f) = put(a, "/admin/faults", &want);
    assert_eq!((c, &f), (200, &want));
    assert_eq!(get(a, "/admin/faults").1, want);
    // Omitted fields are off: a PUT replaces everything.
    let (c, f) = put(a, "/admin/faults", &json!({"delayMs": 1}));
    assert_eq!(c, 200);
    assert_eq!(f["errorRate"], 0.0);
    assert_eq!(f["watchCloseAfterSeconds"], 0.0);
    assert_eq!(f["delayMs"], 1.0);

    for (bad, why) in [
        (json!({"errorRate": 1.5}), "errorRate"),
        (json!({"errorCode": 404}), "errorCode"),
        (json!({"delayMs": "slow"}), "delayMs"),
        (json!({"errorRatio": 0.5}), "unknown field"),
    ] {
        let (c, body) = put(a, "/admin/faults", &bad);
        assert_eq!(c, 400, "{bad}: {body}");
        assert_eq!(body["kind"], "Status");
        assert!(body["message"].as_str().unwrap().contains(why), "{body}");
    }
    let (c, _, body) = request_full(a, "PUT", "/admin/faults", "application/json", "{not json");
    assert_eq!(c, 400, "{body}");
    let (c, _) = post(a, "/admin/faults", &json!({}));
    assert_eq!(c, 405);
    assert_eq!(get(a, "/admin/nothing").0, 404);
    // The failed PUTs left the last good settings.
    assert_eq!(get(a, "/admin/faults").1["delayMs"], 1.0);
}

#[test]
fn every_api_request_fails_at_rate_one_but_admin_and_health_do_not() {
    let a = with_faults(kube_sim::Faults {
        error_rate: 1.0,
        ..Default::default()
    });
    for path in ["/api/v1/pods", "/version", "/api", "/api/v1/nodes/x"] {
        let (c, body) = get(a, path);
        assert_eq!(c, 500, "{path}");
        assert_eq!(body["kind"], "Status");
        assert_eq!(body["reason"], "InternalError");
        assert_eq!(body["code"], 500);
    }
    let (c, _) = post(a, CMS, &json!({"metadata": {"name": "c"}}));
    assert_eq!(c, 500);
    let (c, _, _) = request_full(a, "GET", "/healthz", "", "");
    assert_eq!(c, 200);
    assert_eq!(get(a, "/admin/faults").0, 200);

    // 429 carries Retry-After: 1.
    put(
        a,
        "/admin/faults",
        &json!({"errorRate": 1, "errorCode": 429}),
    );
    let (c, headers, body) = request_full(a, "GET", "/api/v1/pods", "", "");
    assert_eq!(c, 429);
    assert_eq!(body["reason"], "TooManyRequests");
    assert!(
        headers.iter().any(|(k, v)| k == "retry-after" && v == "1"),
        "{headers:?}"
    );

    // Off again: the write that failed was never applied.
    put(a, "/admin/faults", &json!({}));
    assert_eq!(get(a, &format!("{CMS}/c")).0, 404);
    assert_eq!(post(a, CMS, &json!({"metadata": {"name": "c"}})).0, 201);
}

#[test]
fn a_seeded_share_of_requests_fails_the_same_way_every_time() {
    let outcomes = |seed: u64| -> Vec<u16> {
        let a = start_with(kube_sim::Config {
            faults: kube_sim::Faults {
                error_rate: 0.3,
                error_code: 503,
                ..Default::default()
            },
            fault_seed: seed,
            ..kube_sim::Config::api_only()
        });
        (0..200).map(|_| get(a, "/api/v1/pods").0).collect()
    };
    let first = outcomes(42);
    assert_eq!(first, outcomes(42), "same seed, same failures");
    assert_ne!(first, outcomes(43), "another seed fails other requests");
    let failed = first.iter().filter(|c| **c == 503).count();
    assert!(
        (30..=90).contains(&failed),
        "{failed} of 200 failed at rate 0.3"
    );
    assert!(first.iter().all(|c| *c == 503 || *c == 200));
}

#[test]
fn watches_close_after_the_set_time_and_on_demand() {
    let a = with_faults(kube_sim::Faults {
        watch_close_after: Some(Duration::from_millis(300)),
        ..Default::default()
    });
    post(a, CMS, &json!({"metadata": {"name": "c"}}));
    let mut w = Watch::open(a, &format!("{CMS}?watch=1"));
    assert_eq!(w.next().unwrap()["type"], "ADDED");
    assert!(
        w.ends(),
        "the server ends the watch (before the 10 s read timeout)"
    );

    // Off: a watch stays open until an admin closes it.
    put(a, "/admin/faults", &json!({}));
    let mut w1 = Watch::open(a, &format!("{CMS}?watch=1"));
    let mut w2 = Watch::open(a, "/api/v1/pods?watch=1&allowWatchBookmarks=true");
    assert_eq!(w1.next().unwrap()["type"], "ADDED");
    post(a, CMS, &json!({"metadata": {"name": "d"}}));
    assert_eq!(w1.next().unwrap()["object"]["metadata"]["name"], "d");
    let (c, body) = post(a, "/admin/watches/close", &json!({}));
    assert_eq!(c, 200);
    assert!(body["closedWatches"].as_u64().unwrap() >= 2, "{body}");
    assert!(w1.ends());
    assert!(w2.ends());
    // New watches work as before.
    let mut w3 = Watch::open(a, &format!("{CMS}?watch=1"));
    assert_eq!(w3.next().unwrap()["type"], "ADDED");
}

#[test]
fn responses_are_delayed() {
    let a = with_faults(kube_sim::Faults {
        delay: Duration::from_millis(300),
        ..Default::default()
    });
    let t = Instant::now();
    assert_eq!(get(a, "/api/v1/pods").0, 200);
    assert!(
        t.elapsed() >= Duration::from_millis(300),
        "{:?}",
        t.elapsed()
    );
    put(a, "/admin/faults", &json!({"delayMs": 0}));
    assert_eq!(get(a, "/admin/faults").1["delayMs"], 0.0);
}

#[test]
fn the_binary_takes_fault_flags_and_rejects_bad_ones() {
    let port = crate::common::free_port();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_kube-sim"))
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--fault-error-rate", "1", "--fault-error-code", "429"])
        .args(["--fault-watch-close-after", "5s", "--fault-delay", "10ms"])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    crate::common::eventually(20, "kube-sim to listen", || {
        std::net::TcpStream::connect(addr).ok().map(|_| ())
    });
    let faults = get(addr, "/admin/faults");
    let pods = get(addr, "/api/v1/pods").0;
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(
        faults.1,
        json!({"errorRate": 1.0, "errorCode": 429, "watchCloseAfterSeconds": 5.0, "delayMs": 10.0})
    );
    assert_eq!(pods, 429);

    for args in [
        &["--fault-error-rate", "2"][..],
        &["--fault-error-code", "404"],
        &["--fault-delay", "soon"],
        &["--pod-start-delay", "1"],
        &["--ec2-endpoint", "http://127.0.0.1:1"],
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_kube-sim"))
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?} should be rejected");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("error"), "{args:?}: {err}");
    }
}
