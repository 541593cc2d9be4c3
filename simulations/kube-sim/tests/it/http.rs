//! HTTP-level API semantics: conflicts, validation, bad bodies, selectors, pagination, watch.

use crate::common::{get, patch, post, put, request, start, start_with, Watch};
use serde_json::{json, Value};

fn cm(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": "v"}})
}

fn pod(name: &str, labels: Value, node: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]}})
}

fn assert_status(body: &Value, code: u16, reason: &str) {
    assert_eq!(body["kind"], "Status", "{body}");
    assert_eq!(body["apiVersion"], "v1");
    assert_eq!(body["status"], "Failure");
    assert_eq!(body["code"], code, "{body}");
    assert_eq!(body["reason"], reason, "{body}");
    assert!(body["message"].as_str().is_some_and(|m| !m.is_empty()));
}

fn rv(obj: &Value) -> u64 {
    obj["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap()
}

const CMS: &str = "/api/v1/namespaces/default/configmaps";
const PODS: &str = "/api/v1/namespaces/default/pods";

#[test]
fn discovery_documents() {
    let a = start();
    let (c, v) = get(a, "/version");
    assert_eq!((c, v["major"].as_str()), (200, Some("1")));
    assert_eq!(get(a, "/api").1["versions"], json!(["v1"]));
    let groups = get(a, "/apis").1;
    let names: Vec<&str> = groups["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "policy",
            "coordination.k8s.io",
            "events.k8s.io",
            "apps",
            "storage.k8s.io"
        ]
    );
    let core = get(a, "/api/v1").1;
    let pods = core["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "pods")
        .unwrap();
    assert_eq!(pods["shortNames"], json!(["po"]));
    assert_eq!(pods["namespaced"], true);
    assert_eq!(pods["kind"], "Pod");
    let pdb = get(a, "/apis/policy/v1").1;
    assert_eq!(pdb["resources"][0]["shortNames"], json!(["pdb"]));
    assert_eq!(
        get(a, "/apis/coordination.k8s.io/v1").1["resources"][0]["name"],
        "leases"
    );
    let (c, body) = get(a, "/apis/batch/v1");
    assert_eq!(c, 404);
    assert_status(&body, 404, "NotFound");
}

#[test]
fn server_sets_metadata_and_stale_updates_conflict() {
    let a = start();
    let (c, created) = post(a, CMS, &cm("c1"));
    assert_eq!(c, 201, "{created}");
    let m = &created["metadata"];
    assert_eq!(m["namespace"], "default");
    assert_eq!(m["generation"], 1);
    assert!(m["uid"].is_string() && m["creationTimestamp"].is_string());
    let rv1 = rv(&created);

    let mut next = created.clone();
    next["data"]["k"] = json!("v2");
    let (c, updated) = put(a, &format!("{CMS}/c1"), &next);
    assert_eq!(c, 200, "{updated}");
    assert!(rv(&updated) > rv1);
    assert_eq!(updated["metadata"]["uid"], created["metadata"]["uid"]);

    // `next` still carries the old resourceVersion.
    next["data"]["k"] = json!("v3");
    let (c, body) = put(a, &format!("{CMS}/c1"), &next);
    assert_status(&body, 409, "Conflict");
    assert_eq!(c, 409);
    assert!(body["message"]
        .as_str()
        .unwrap()
        .contains("the object has been modified"));
    assert_eq!(
        get(a, &format!("{CMS}/c1")).1["data"]["k"],
        "v2",
        "nothing half-applied"
    );

    // A stale resourceVersion in a patch is a precondition too.
    let p = json!({"metadata": {"resourceVersion": rv1.to_string()}, "data": {"k": "x"}});
    let (c, body) = patch(a, &format!("{CMS}/c1"), "application/merge-patch+json", &p);
    assert_eq!(c, 409, "{body}");

    let (c, body) = post(a, CMS, &cm("c1"));
    assert_eq!(c, 409);
    assert_status(&body, 409, "AlreadyExists");

    // Monotonic, global resourceVersions.
    let (_, other) = post(a, CMS, &cm("c2"));
    assert!(rv(&other) > rv(&updated));
}

#[test]
fn invalid_names_and_objects_are_422_and_not_stored() {
    let a = start();
    let (c, body) = post(a, CMS, &cm("Bad_Name"));
    assert_eq!(c, 422);
    assert_status(&body, 422, "Invalid");
    assert_eq!(body["details"]["causes"][0]["field"], "metadata.name");
    assert_eq!(get(a, &format!("{CMS}/Bad_Name")).0, 404);

    let (c, body) = post(
        a,
        "/api/v1/namespaces",
        &json!({"metadata": {"name": "a.b"}}),
    );
    assert_eq!(c, 422, "namespace names are DNS labels: {body}");
    let (c, _) = post(a, CMS, &json!({"metadata": {}}));
    assert_eq!(c, 422);
    let (c, body) = post(
        a,
        PODS,
        &json!({"metadata": {"name": "p"}, "spec": {"containers": []}}),
    );
    assert_eq!(c, 422, "{body}");
    let (c, body) = post(
        a,
        "/api/v1/nodes",
        &json!({"metadata": {"name": "n"}, "spec": {"taints": [{"key": "k", "effect": "Bad"}]}}),
    );
    assert_eq!(c, 422, "{body}");
    let (c, _) = post(
        a,
        CMS,
        &json!({"metadata": {"name": "x", "labels": {"a": "not valid!"}}}),
    );
    assert_eq!(c, 422);
    assert_eq!(get(a, CMS).1["items"], json!([]));

    // generateName.
    let (c, body) = post(a, CMS, &json!({"metadata": {"generateName": "gen-"}}));
    assert_eq!(c, 201);
    assert!(body["metadata"]["name"]
        .as_str()
        .unwrap()
        .starts_with("gen-"));
    assert_eq!(body["metadata"]["name"].as_str().unwrap().len(), 9);

    // Invalid update: nothing changes.
    let (_, n) = post(a, "/api/v1/nodes", &json!({"metadata": {"name": "n1"}}));
    let bad = json!({"spec": {"taints": [{"key": "k", "effect": "Nope"}]}});
    let (c, _) = patch(a, "/api/v1/nodes/n1", "application/merge-patch+json", &bad);
    assert_eq!(c, 422);
    assert_eq!(get(a, "/api/v1/nodes/n1").1, n);
}

#[test]
fn bad_bodies_and_unknown_resources() {
    let a = start();
    let (c, body) = request(a, "POST", CMS, "application/json", "{\"metadata\": ");
    assert_eq!(c, 400);
    assert_status(&body, 400, "BadRequest");
    let (c, body) = request(a, "POST", CMS, "application/yaml", "metadata: [unclosed");
    assert_eq!(c, 400);
    assert_status(&body, 400, "BadRequest");
    let (c, _) = request(a, "POST", CMS, "application/json", "[1, 2]");
    assert_eq!(c, 400);
    let (c, _) = request(a, "POST", CMS, "application/json", "");
    assert_eq!(c, 400);
    let (c, body) = request(a, "POST", CMS, "text/plain", "x");
    assert_eq!(c, 415);
    assert_status(&body, 415, "UnsupportedMediaType");
    let (c, _) = post(
        a,
        CMS,
        &json!({"apiVersion": "v2", "kind": "ConfigMap", "metadata": {"name": "x"}}),
    );
    assert_eq!(c, 400);
    let (c, _) = post(
        a,
        CMS,
        &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "x"}}),
    );
    assert_eq!(c, 400);
    let (c, _) = post(
        a,
        "/api/v1/namespaces/other/configmaps",
        &json!({"metadata": {"name": "x", "namespace": "default"}}),
    );
    assert_eq!(c, 400);

    // YAML bodies are accepted.
    let (c, body) = request(
        a,
        "POST",
        CMS,
        "application/yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: y\ndata:\n  a: b\n",
    );
    assert_eq!(c, 201, "{body}");
    assert_eq!(body["data"]["a"], "b");

    for path in [
        "/api/v1/deployments",
        "/apis/apps/v1/namespaces/default/deployments",
        "/apis/batch/v1/jobs",
        "/api/v1/namespaces/default/pods/x/log",
        "/nope",
    ] {
        let (c, body) = get(a, path);
        assert_eq!(c, 404, "{path}");
        assert_status(&body, 404, "NotFound");
    }
    let (c, body) = get(a, &format!("{CMS}/missing"));
    assert_status(&body, 404, "NotFound");
    assert_eq!(c, 404);
    assert_eq!(body["details"]["name"], "missing");
    assert_eq!(body["message"], "configmaps \"missing\" not found");
    let (c, _) = post(a, "/api/v1/namespaces/nope/configmaps", &cm("x"));
    assert_eq!(c, 404);
    let (c, _) = request(
        a,
        "PATCH",
        &format!("{CMS}/y"),
        "application/merge-patch+json",
        "{not json",
    );
    assert_eq!(c, 400);
    let (c, _) = request(
        a,
        "PATCH",
        &format!("{CMS}/y"),
        "application/apply-patch+yaml",
        "{}",
    );
    assert_eq!(c, 415);
}

#[test]
fn label_and_field_selectors() {
    let a = start();
    post(
        a,
        PODS,
        &pod("a", json!({"app": "web", "tier": "front"}), "n1"),
    );
    post(a, PODS, &pod("b", json!({"app": "web"}), "n2"));
    post(a, PODS, &pod("c", json!({"app": "db"}), "n1"));
    post(
        a,
        "/api/v1/namespaces",
        &json!({"metadata": {"name": "other"}}),
    );
    post(
        a,
        "/api/v1/namespaces/other/pods",
        &pod("d", json!({"app": "web"}), "n1"),
    );
    patch(
        a,
        &format!("{PODS}/a/status"),
        "application/merge-patch+json",
        &json!({"status": {"phase": "Running"}}),
    );

    let names = |q: &str| -> Vec<String> {
        let (c, body) = get(a, &format!("/api/v1/pods?{q}"));
        assert_eq!(c, 200, "{q}: {body}");
        body["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["metadata"]["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(names(""), ["a", "b", "c", "d"]);
    assert_eq!(names("labelSelector=app%3Dweb"), ["a", "b", "d"]);
    assert_eq!(names("labelSelector=app%3D%3Dweb,tier"), ["a"]);
    assert_eq!(names("labelSelector=app!%3Dweb"), ["c"]);
    assert_eq!(names("labelSelector=app+in+(db,cache)"), ["c"]);
    assert_eq!(names("labelSelector=app+notin+(db)"), ["a", "b", "d"]);
    assert_eq!(names("labelSelector=!tier"), ["b", "c", "d"]);
    assert_eq!(names("fieldSelector=spec.nodeName%3Dn1"), ["a", "c", "d"]);
    assert_eq!(
        names("fieldSelector=spec.nodeName%3Dn1,metadata.namespace!%3Dother"),
        ["a", "c"]
    );
    assert_eq!(names("fieldSelector=status.phase%3DRunning"), ["a"]);
    assert_eq!(names("fieldSelector=metadata.name%3Db"), ["b"]);
    assert_eq!(
        names("fieldSelector=status.phase!%3DRunning&labelSelector=app%3Dweb"),
        ["b", "d"]
    );

    let (c, body) = get(a, "/api/v1/pods?fieldSelector=spec.bogus%3Dx");
    assert_eq!(c, 400);
    assert_status(&body, 400, "BadRequest");
    let (c, _) = get(a, "/api/v1/pods?labelSelector=app+in+web");
    assert_eq!(c, 400);
    let (_, ns_only) = get(a, "/api/v1/namespaces/other/pods");
    assert_eq!(ns_only["items"].as_array().unwrap().len(), 1);
    assert_eq!(ns_only["kind"], "PodList");
}

#[test]
fn limit_and_continue() {
    let a = start();
    for i in 0..5 {
        post(a, CMS, &cm(&format!("cm-{i}")));
    }
    post(a, "/api/v1/namespaces/kube-system/configmaps", &cm("other"));
    let mut seen = Vec::new();
    let mut path = format!("{CMS}?limit=2");
    let mut pages = 0;
    loop {
        let (c, body) = get(a, &path);
        assert_eq!(c, 200, "{body}");
        pages += 1;
        assert!(
            body["metadata"]["resourceVersion"]
                .as_str()
                .unwrap()
                .parse::<u64>()
                .unwrap()
                > 0
        );
        let items = body["items"].as_array().unwrap();
        assert!(items.len() <= 2);
        seen.extend(
            items
                .iter()
                .map(|i| i["metadata"]["name"].as_str().unwrap().to_string()),
        );
        match body["metadata"]["continue"].as_str() {
            Some(tok) => path = format!("{CMS}?limit=2&continue={tok}"),
            None => break,
        }
    }
    assert_eq!(pages, 3);
    assert_eq!(seen, ["cm-0", "cm-1", "cm-2", "cm-3", "cm-4"]);
    // Across namespaces too.
    let (_, all) = get(a, "/api/v1/configmaps?limit=5");
    let tok = all["metadata"]["continue"].as_str().unwrap().to_string();
    let (_, rest) = get(a, &format!("/api/v1/configmaps?limit=5&continue={tok}"));
    assert_eq!(rest["items"][0]["metadata"]["name"], "other");
    assert!(rest["metadata"].get("continue").is_none());
    let (c, _) = get(a, &format!("{CMS}?limit=2&continue=garbage"));
    assert_eq!(c, 400);
}

#[test]
fn watch_streams_changes_from_a_resource_version() {
    let a = start();
    post(a, PODS, &pod("old", json!({"app": "web"}), "n1"));
    let (_, list) = get(a, PODS);
    let list_rv = list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();

    let mut w = Watch::open(a, &format!("{PODS}?watch=1&resourceVersion={list_rv}"));
    assert_eq!(w.status, 200);
    let mut sel = Watch::open(
        a,
        &format!("{PODS}?watch=true&resourceVersion={list_rv}&labelSelector=app%3Ddb"),
    );

    post(a, PODS, &pod("new", json!({"app": "web"}), "n1"));
    post(a, CMS, &cm("unrelated"));
    patch(
        a,
        &format!("{PODS}/new"),
        "application/merge-patch+json",
        &json!({"metadata": {"labels": {"app": "db"}}}),
    );
    request(a, "DELETE", &format!("{PODS}/new"), "application/json", "");

    let mut events = Vec::new();
    for _ in 0..3 {
        let e = w.next().expect("event");
        events.push((
            e["type"].as_str().unwrap().to_string(),
            e["object"]["metadata"]["name"]
                .as_str()
                .unwrap()
                .to_string(),
        ));
    }
    assert_eq!(
        events,
        [
            ("ADDED".into(), "new".into()),
            ("MODIFIED".into(), "new".to_string()),
            ("DELETED".into(), "new".into())
        ]
    );

    // A label-selected watch sees the object enter the selection as ADDED.
    let e = sel.next().unwrap();
    assert_eq!(
        (
            e["type"].as_str(),
            e["object"]["metadata"]["labels"]["app"].as_str()
        ),
        (Some("ADDED"), Some("db"))
    );
    assert_eq!(sel.next().unwrap()["type"], "DELETED");

    // Without a resourceVersion: synthetic ADDED for what exists, then changes.
    let mut fresh = Watch::open(a, &format!("{PODS}?watch=1"));
    let e = fresh.next().unwrap();
    assert_eq!(
        (e["type"].as_str(), e["object"]["metadata"]["name"].as_str()),
        (Some("ADDED"), Some("old"))
    );

    // Resuming from an older resourceVersion replays history.
    let mut replay = Watch::open(a, &format!("{PODS}?watch=1&resourceVersion={list_rv}"));
    assert_eq!(replay.next().unwrap()["type"], "ADDED");

    // timeoutSeconds ends the stream.
    let mut short = Watch::open(
        a,
        &format!("{CMS}?watch=1&resourceVersion={list_rv}&timeoutSeconds=1"),
    );
    assert_eq!(
        short.next().unwrap()["object"]["metadata"]["name"],
        "unrelated"
    );
    assert!(short.next().is_none());
}

#[test]
fn too_old_resource_version_is_410_gone() {
    let a = start_with(kube_sim::Config {
        watch_history: 3,
        ..kube_sim::Config::api_only()
    });
    for i in 0..10 {
        post(a, CMS, &cm(&format!("c{i}")));
    }
    let mut w = Watch::open(a, &format!("{CMS}?watch=1&resourceVersion=2"));
    let e = w.next().unwrap();
    assert_eq!(e["type"], "ERROR");
    assert_status(&e["object"], 410, "Expired");
    assert!(w.next().is_none(), "the stream ends after the error");

    // A recent one still works.
    let (_, list) = get(a, CMS);
    let rv = list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let mut ok = Watch::open(a, &format!("{CMS}?watch=1&resourceVersion={rv}"));
    post(a, CMS, &cm("later"));
    assert_eq!(ok.next().unwrap()["type"], "ADDED");
}

#[test]
fn patch_types_and_status_subresource() {
    let a = start();
    post(
        a,
        "/api/v1/nodes",
        &json!({"metadata": {"name": "n1", "labels": {"a": "1"}}, "status": {"capacity": {"cpu": "4"}}}),
    );
    let smp = json!({"metadata": {"labels": {"a": null, "b": "2"}}, "spec": {"unschedulable": true, "taints": [{"key": "k", "effect": "NoSchedule"}]}});
    let (c, n) = patch(
        a,
        "/api/v1/nodes/n1",
        "application/strategic-merge-patch+json",
        &smp,
    );
    assert_eq!(c, 200, "{n}");
    assert_eq!(n["metadata"]["labels"], json!({"b": "2"}));
    assert_eq!(n["spec"]["unschedulable"], true);
    assert_eq!(
        n["metadata"]["generation"], 2,
        "a spec change bumps generation"
    );

    let jp = json!([{"op": "add", "path": "/metadata/labels/c", "value": "3"}, {"op": "remove", "path": "/spec/taints"}]);
    let (c, n) = patch(a, "/api/v1/nodes/n1", "application/json-patch+json", &jp);
    assert_eq!(c, 200, "{n}");
    assert_eq!(n["metadata"]["labels"]["c"], "3");
    assert!(n["spec"].get("taints").is_none());
    let (c, _) = patch(
        a,
        "/api/v1/nodes/n1",
        "application/json-patch+json",
        &json!([{"op": "remove", "path": "/nope"}]),
    );
    assert_eq!(c, 422);

    // Main-resource writes keep status; the status subresource changes only status.
    let (_, n) = patch(
        a,
        "/api/v1/nodes/n1",
        "application/merge-patch+json",
        &json!({"status": {"capacity": {"cpu": "99"}}}),
    );
    assert_eq!(n["status"]["capacity"]["cpu"], "4");
    let (c, n) = patch(
        a,
        "/api/v1/nodes/n1/status",
        "application/merge-patch+json",
        &json!({"status": {"capacity": {"cpu": "8"}}, "metadata": {"labels": {"ignored": "x"}}}),
    );
    assert_eq!(c, 200);
    assert_eq!(n["status"]["capacity"]["cpu"], "8");
    assert!(n["metadata"]["labels"].get("ignored").is_none());
    assert_eq!(
        get(a, "/api/v1/nodes/n1/status").1["status"]["capacity"]["cpu"],
        "8"
    );

    // Pod specs are immutable except for a few fields.
    post(a, PODS, &pod("p", json!({}), ""));
    let (c, _) = patch(
        a,
        &format!("{PODS}/p"),
        "application/merge-patch+json",
        &json!({"spec": {"nodeName": "n1"}}),
    );
    assert_eq!(c, 422);

    // Binding assigns a node once.
    let b = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p"}, "target": {"kind": "Node", "name": "n1"}});
    assert_eq!(post(a, &format!("{PODS}/p/binding"), &b).0, 201);
    assert_eq!(get(a, &format!("{PODS}/p")).1["spec"]["nodeName"], "n1");
    assert_eq!(post(a, &format!("{PODS}/p/binding"), &b).0, 409);
}

#[test]
fn eviction_honours_pod_disruption_budgets() {
    let a = start();
    for name in ["w1", "w2"] {
        post(a, PODS, &pod(name, json!({"app": "web"}), "n1"));
        patch(
            a,
            &format!("{PODS}/{name}/status"),
            "application/merge-patch+json",
            &json!({"status": {"phase": "Running"}}),
        );
    }
    let pdb = json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "web"},
        "spec": {"minAvailable": "50%", "selector": {"matchLabels": {"app": "web"}}}});
    assert_eq!(
        post(
            a,
            "/apis/policy/v1/namespaces/default/poddisruptionbudgets",
            &pdb
        )
        .0,
        201
    );
    let ev = |name: &str| {
        post(
            a,
            &format!("{PODS}/{name}/eviction"),
            &json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": "default"}}),
        )
    };
    let (c, body) = ev("w1");
    assert_eq!(c, 201, "{body}");
    assert_eq!(body["status"], "Success");
    assert_eq!(get(a, &format!("{PODS}/w1")).0, 404);
    let (c, body) = ev("w2");
    assert_eq!(c, 429);
    assert_status(&body, 429, "TooManyRequests");
    assert_eq!(body["details"]["causes"][0]["reason"], "DisruptionBudget");
    assert_eq!(get(a, &format!("{PODS}/w2")).0, 200);
    assert_eq!(ev("missing").0, 404);
    // Pending pods are not protected.
    post(a, PODS, &pod("w3", json!({"app": "web"}), ""));
    assert_eq!(ev("w3").0, 201);
}

#[test]
fn delete_preconditions_and_other_resources() {
    let a = start();
    let (_, c1) = post(a, CMS, &cm("c1"));
    let bad = json!({"preconditions": {"uid": "nope"}});
    let (c, body) = request(
        a,
        "DELETE",
        &format!("{CMS}/c1"),
        "application/json",
        &bad.to_string(),
    );
    assert_eq!(c, 409, "{body}");
    let good = json!({"preconditions": {"uid": c1["metadata"]["uid"]}});
    let (c, body) = request(
        a,
        "DELETE",
        &format!("{CMS}/c1"),
        "application/json",
        &good.to_string(),
    );
    assert_eq!(c, 200);
    assert_eq!(body["metadata"]["name"], "c1");

    let lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "gpu-node-autoscaler"},
        "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15}});
    let path = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases";
    let (c, l) = post(a, path, &lease);
    assert_eq!(c, 201, "{l}");
    let mut take = l.clone();
    take["spec"]["holderIdentity"] = json!("b");
    assert_eq!(put(a, &format!("{path}/gpu-node-autoscaler"), &take).0, 200);
    take["spec"]["holderIdentity"] = json!("c");
    assert_eq!(
        put(a, &format!("{path}/gpu-node-autoscaler"), &take).0,
        409,
        "leader election relies on this"
    );

    let ev = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "e1"}, "reason": "X"});
    assert_eq!(
        post(a, "/apis/events.k8s.io/v1/namespaces/default/events", &ev).0,
        201
    );
    assert_eq!(
        get(a, "/apis/events.k8s.io/v1/events").1["items"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    // deletecollection with a selector
    post(
        a,
        CMS,
        &json!({"metadata": {"name": "l1", "labels": {"x": "1"}}}),
    );
    post(a, CMS, &json!({"metadata": {"name": "l2"}}));
    assert_eq!(
        request(
            a,
            "DELETE",
            &format!("{CMS}?labelSelector=x"),
            "application/json",
            ""
        )
        .0,
        200
    );
    let left: Vec<Value> = get(a, CMS).1["items"].as_array().unwrap().clone();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0]["metadata"]["name"], "l2");
    // Namespaces are cluster-scoped; a namespaced path to a cluster resource is 404.
    assert_eq!(get(a, "/api/v1/namespaces/default/nodes").0, 404);
    assert_eq!(request(a, "PUT", CMS, "application/json", "{}").0, 405);
}

#[test]
fn bookmarks_when_asked() {
    let a = start_with(kube_sim::Config {
        bookmark_interval: std::time::Duration::from_millis(50),
        ..kube_sim::Config::api_only()
    });
    post(a, CMS, &cm("c"));
    let mut w = Watch::open(
        a,
        &format!("{CMS}?watch=1&resourceVersion=0&allowWatchBookmarks=true"),
    );
    assert_eq!(w.next().unwrap()["type"], "ADDED");
    let b = w.next().unwrap();
    assert_eq!(b["type"], "BOOKMARK");
    assert_eq!(b["object"]["kind"], "ConfigMap");
    assert!(
        b["object"]["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse::<u64>()
            .unwrap()
            > 0
    );
}

#[test]
fn the_binary_serves_on_the_given_address() {
    let port = crate::common::free_port();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_kube-sim"))
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut up = false;
    for _ in 0..100 {
        if std::net::TcpStream::connect(addr).is_ok() {
            up = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let version = up.then(|| get(addr, "/version"));
    child.kill().unwrap();
    child.wait().unwrap();
    let (c, v) = version.expect("kube-sim listens");
    assert_eq!(c, 200);
    assert_eq!(v["gitVersion"], "v1.32.0-kube-sim");
}

#[test]
fn hostile_requests_never_crash_the_server() {
    let a = start();
    let setup = || {
        // Recreate what a previous DELETE removed (409s are fine).
        post(a, PODS, &pod("p", json!({"app": "x"}), ""));
        patch(
            a,
            &format!("{PODS}/p/status"),
            "application/merge-patch+json",
            &json!({"status": {"phase": "Running"}}),
        );
        post(a, "/api/v1/nodes", &json!({"metadata": {"name": "n1"}}));
        post(a, CMS, &cm("c"));
    };
    let paths = [
        PODS.to_string(),
        format!("{PODS}/p"),
        format!("{PODS}/p/status"),
        format!("{PODS}/p/eviction"),
        format!("{PODS}/p/binding"),
        "/api/v1/nodes/n1".to_string(),
        "/api/v1/nodes/n1/status".to_string(),
        format!("{CMS}/c"),
        "/api/v1/namespaces/default".to_string(),
        "/apis/policy/v1/namespaces/default/poddisruptionbudgets".to_string(),
        "/api/v1//namespaces//pods//".to_string(),
        "/apis/policy/v1/namespaces/default/poddisruptionbudgets/x/eviction".to_string(),
    ];
    let bodies = [
        "",
        "null",
        "[]",
        "\"s\"",
        "42",
        "{}",
        "{\"metadata\": 5}",
        "{\"metadata\": {\"name\": 7}}",
        "{\"metadata\": {\"labels\": [1]}}",
        "{\"spec\": \"x\"}",
        "{\"status\": []}",
        "{\"spec\": {\"containers\": [5]}}",
        "{\"spec\": {\"taints\": [null, 1]}}",
        "{\"$patch\": \"delete\"}",
        "{\"spec\": {\"containers\": [{\"$patch\": \"delete\"}]}}",
        "[{\"op\": \"remove\", \"path\": \"\"}]",
        "[{\"op\": \"replace\", \"path\": \"/metadata\", \"value\": 1}]",
        "[{\"op\": \"add\", \"path\": \"\", \"value\": []}]",
        "{\"target\": {\"name\": 5}}",
        "{\"deleteOptions\": 5, \"metadata\": {\"name\": \"p\"}}",
        "\u{0}\u{ff}",
        "---\n- a\n- b\n",
    ];
    let types = [
        "application/json",
        "application/yaml",
        "application/merge-patch+json",
        "application/strategic-merge-patch+json",
        "application/json-patch+json",
    ];
    for path in &paths {
        for body in bodies {
            for method in ["POST", "PUT", "PATCH", "DELETE", "GET"] {
                for ct in types {
                    setup();
                    let (c, resp) = request(a, method, path, ct, body);
                    assert!(c < 500, "{method} {path} {ct} {body:?} -> {c} {resp}");
                    if c >= 400 {
                        assert_eq!(resp["kind"], "Status", "{method} {path} {ct} {body:?}");
                    }
                }
            }
        }
    }
    assert_eq!(get(a, "/version").0, 200);
}
