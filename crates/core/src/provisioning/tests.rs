//! ProvisioningRequests: conversion from the API's objects, and the conditions and pods a pass
//! decides, on a virtual clock.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde_json::{json, Value};

use super::*;
use crate::catalog;
use crate::convert::Converter;
use crate::fixtures::{NodeBuilder, PodBuilder};
use crate::model::{labels, Node};
use crate::plan::Templates;
use crate::policy::parse_policy;

const NOW: Time = Time(1_800_000_000);
const MIN: Duration = Duration::from_secs(60);

const POLICY: &str = r#"
zones: [us-east-1a, us-east-1b]
pools:
  - name: a10g
    instanceTypes: [g5.12xlarge]
    capacityTypes: [on-demand]
    maxNodes: 10
    scaleDown: {unneededTime: 1m, cooldownAfterScaleUp: 0s}
"#;

struct World {
    policy: Policy,
    templates: Templates,
}

fn world(text: &str) -> World {
    let policy = parse_policy(text, "test.yaml").unwrap_or_else(|e| panic!("{e}"));
    let types = catalog::parse_csv(catalog::BUILTIN_AWS, "builtin").unwrap();
    let catalog = catalog::offerings_from_list_prices(&policy, types);
    let templates = Templates::new(&policy, &catalog);
    World { policy, templates }
}

fn template(name: &str, gpus: u32) -> (String, Value) {
    (
        format!("team/{name}"),
        json!({
            "apiVersion": "v1", "kind": "PodTemplate",
            "metadata": {"name": name, "namespace": "team"},
            "template": {
                "metadata": {"labels": {"app": "trainer"}},
                "spec": {"containers": [{"name": "w", "image": "x",
                    "resources": {"requests": {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": gpus.to_string()}}}]}
            }
        }),
    )
}

fn request_json(name: &str, class: &str, sets: &[(&str, u32)], conditions: Value) -> Value {
    let sets: Vec<Value> = sets
        .iter()
        .map(|(t, n)| json!({"podTemplateRef": {"name": t}, "count": n}))
        .collect();
    json!({
        "apiVersion": "autoscaling.x-k8s.io/v1", "kind": "ProvisioningRequest",
        "metadata": {"name": name, "namespace": "team", "uid": format!("uid-{name}"), "generation": 1,
                     "creationTimestamp": (NOW - 5 * MIN).to_rfc3339()},
        "spec": {"provisioningClassName": class, "podSets": sets},
        "status": {"conditions": conditions}
    })
}

fn request(v: &Value) -> ProvisioningRequest {
    let templates: BTreeMap<String, Value> = [template("worker", 4)].into_iter().collect();
    Converter::new()
        .provisioning_request(v, &templates)
        .unwrap_or_else(|e| panic!("{e}"))
}

fn provisioned_since(t: Time) -> Value {
    json!([
        {"type": "Accepted", "status": "True", "reason": "Accepted", "message": "", "lastTransitionTime": (t - MIN).to_rfc3339()},
        {"type": "Provisioned", "status": "True", "reason": "CapacityIsProvisioned", "message": "", "lastTransitionTime": t.to_rfc3339()}
    ])
}

fn gpu_node(name: &str, zone: &str) -> NodeBuilder {
    NodeBuilder::new(name)
        .pool("a10g", "g5.12xlarge", zone)
        .label(labels::CAPACITY_TYPE, "on-demand")
        .cpu_milli(47_000)
        .memory_gib(180)
        .gpus(4)
        .created(NOW - 60 * MIN)
}

fn snapshot(pods: Vec<Pod>, nodes: Vec<Node>) -> Snapshot {
    Snapshot {
        pods,
        nodes,
        ..Default::default()
    }
}

fn status<'a>(a: &'a Assessment, kind: &str) -> Option<(&'a str, &'a str)> {
    a.updates
        .first()
        .and_then(|u| u.condition(kind))
        .map(|c| (c.status.as_str(), c.reason.as_str()))
}

#[test]
fn provisioning_request_pods_come_from_pod_templates_with_counts() {
    let templates: BTreeMap<String, Value> = [template("worker", 4), template("driver", 1)]
        .into_iter()
        .collect();
    let v = request_json(
        "job",
        CLASS_ATOMIC,
        &[("worker", 3), ("driver", 1)],
        json!([]),
    );
    let mut v = v;
    v["spec"]["parameters"] = json!({"ValidUntilSeconds": "900"});
    let r = Converter::new()
        .provisioning_request(&v, &templates)
        .unwrap();
    assert_eq!(r.class(), Some(Class::AtomicScaleUp));
    assert_eq!(r.valid_until, Some(Duration::from_secs(900)));
    let pods = r.pods.as_ref().unwrap();
    assert_eq!(pods.len(), 4);
    assert_eq!(
        pods.iter()
            .map(|p| p.requests.whole_gpus())
            .collect::<Vec<_>>(),
        vec![4, 4, 4, 1]
    );
    // One gang of all four, pending and unschedulable, named after the request.
    assert!(pods
        .iter()
        .all(|p| p.gang.as_ref().map(|g| (g.key.as_str(), g.min_member))
            == Some(("team/provisioning-request.job", Some(4)))));
    assert!(pods.iter().all(|p| p.is_pending() && p.unschedulable));
    assert_eq!(pods[3].id.to_string(), "team/provisioning-request.job.1.0");
    assert_eq!(
        pods[0].labels.get("app").map(String::as_str),
        Some("trainer")
    );

    // A missing template or a bad parameter is the request's problem, not a conversion error.
    let v = request_json("gone", CLASS_ATOMIC, &[("nope", 1)], json!([]));
    let r = Converter::new()
        .provisioning_request(&v, &templates)
        .unwrap();
    assert!(r
        .pods
        .unwrap_err()
        .contains("PodTemplate team/nope not found"));
    let mut v = request_json("bad", CLASS_ATOMIC, &[("worker", 1)], json!([]));
    v["spec"]["parameters"] = json!({"ValidUntilSeconds": "soon"});
    let r = Converter::new()
        .provisioning_request(&v, &templates)
        .unwrap();
    assert!(r
        .pods
        .unwrap_err()
        .contains("spec.parameters.ValidUntilSeconds"));
    // Not a ProvisioningRequest at all.
    assert!(Converter::new()
        .provisioning_request(&json!({"spec": 3}), &templates)
        .is_err());
}

#[test]
fn provisioning_request_atomic_is_one_gang_in_one_zone_then_provisioned_on_ready_nodes() {
    let w = world(POLICY);
    let r = request(&request_json(
        "job",
        CLASS_ATOMIC,
        &[("worker", 2)],
        json!([]),
    ));
    let s = snapshot(vec![], vec![]);
    let a = assess(&s, &w.templates, &w.policy, std::slice::from_ref(&r), NOW);
    assert_eq!(status(&a, ACCEPTED), Some(("True", "Accepted")));
    assert_eq!(
        status(&a, PROVISIONED),
        Some(("False", "CapacityIsProvisioning"))
    );
    // The decision core plans the gang: two 4-GPU nodes, one launch, one zone.
    assert_eq!(a.inject.len(), 2);
    let plan = plan_with(&a.snapshot(&s), &w.templates, &w.policy, NOW);
    assert_eq!(plan.scale_ups.len(), 1, "{plan:?}");
    assert_eq!(plan.scale_ups[0].count, 2);
    assert_eq!(
        plan.scale_ups[0].gang.as_deref(),
        Some("team/provisioning-request.job")
    );
    let zones: BTreeSet<&str> = plan.scale_ups[0]
        .offerings
        .iter()
        .map(|o| o.zone.as_str())
        .collect();
    assert_eq!(zones.len(), 1, "{plan:?}");

    // Still booting: accepted, not provisioned, nothing changes.
    let mut r = r;
    r.conditions = a.updates[0].conditions.clone();
    let booting = snapshot(
        vec![],
        vec![
            gpu_node("n1", "us-east-1a").not_ready().build(),
            gpu_node("n2", "us-east-1a").not_ready().build(),
        ],
    );
    let a = assess(
        &booting,
        &w.templates,
        &w.policy,
        std::slice::from_ref(&r),
        NOW + MIN,
    );
    assert!(a.updates.is_empty(), "{a:?}");
    assert_eq!(a.inject.len(), 2);

    // Both Ready: provisioned, and booked from now on.
    let ready = snapshot(
        vec![],
        vec![
            gpu_node("n1", "us-east-1a").build(),
            gpu_node("n2", "us-east-1a").build(),
        ],
    );
    let later = NOW + 2 * MIN;
    let a = assess(
        &ready,
        &w.templates,
        &w.policy,
        std::slice::from_ref(&r),
        later,
    );
    assert_eq!(
        status(&a, PROVISIONED),
        Some(("True", "CapacityIsProvisioned"))
    );
    let c = a.updates[0].condition(PROVISIONED).unwrap();
    assert_eq!(c.since, later);
    assert_eq!(a.inject.len(), 2);
    assert!(a.inject.iter().all(|p| p.gang.is_none()));
    let plan = plan_with(&a.snapshot(&ready), &w.templates, &w.policy, later);
    assert!(plan.scale_ups.is_empty(), "{plan:?}");
}

#[test]
fn provisioning_request_that_cannot_be_placed_whole_fails_and_launches_nothing() {
    // One node allowed: a gang of two cannot be had, so none of it is launched.
    let w = world(&POLICY.replace("maxNodes: 10", "maxNodes: 1"));
    let r = request(&request_json(
        "big",
        CLASS_ATOMIC,
        &[("worker", 2)],
        json!([]),
    ));
    let s = snapshot(vec![], vec![]);
    let a = assess(&s, &w.templates, &w.policy, &[r], NOW);
    assert_eq!(status(&a, FAILED), Some(("True", "CapacityIsNotFound")));
    let msg = &a.updates[0].condition(FAILED).unwrap().message;
    assert!(
        msg.contains("cannot be given nodes all at once, even in an empty cluster"),
        "{msg}"
    );
    assert!(a.inject.is_empty());
    let plan = plan_with(&a.snapshot(&s), &w.templates, &w.policy, NOW);
    assert!(plan.scale_ups.is_empty());

    // Failed is final: asked again, nothing changes and nothing is planned.
    let mut r = request(&request_json(
        "big",
        CLASS_ATOMIC,
        &[("worker", 2)],
        json!([]),
    ));
    r.conditions = a.updates[0].conditions.clone();
    let w = world(POLICY);
    let a = assess(&s, &w.templates, &w.policy, &[r], NOW + MIN);
    assert_eq!(a, Assessment::default());
}

#[test]
fn provisioning_request_without_room_now_is_not_provisioned_and_tried_again_not_failed() {
    // Two nodes allowed, one of them busy: the gang of two cannot be had now, but could be in
    // the pool once the busy node goes. Provisioned=False, nothing launched, not Failed.
    let w = world(&POLICY.replace("maxNodes: 10", "maxNodes: 2"));
    let busy = snapshot(
        vec![PodBuilder::new("other", "train-0")
            .gpus(4)
            .cpu_milli(4000)
            .memory_gib(16)
            .on("n1")
            .build()],
        vec![gpu_node("n1", "us-east-1a").build()],
    );
    let r = request(&request_json(
        "job",
        CLASS_ATOMIC,
        &[("worker", 2)],
        json!([]),
    ));
    let a = assess(
        &busy,
        &w.templates,
        &w.policy,
        std::slice::from_ref(&r),
        NOW,
    );
    assert_eq!(status(&a, FAILED), None, "{a:?}");
    assert_eq!(
        status(&a, PROVISIONED),
        Some(("False", "CapacityIsNotFound"))
    );
    let msg = &a.updates[0].condition(PROVISIONED).unwrap().message;
    assert!(msg.contains("tried again"), "{msg}");
    assert!(a.inject.is_empty(), "nothing launched for part of it");
    let plan = plan_with(&a.snapshot(&busy), &w.templates, &w.policy, NOW);
    assert!(plan.scale_ups.is_empty(), "{plan:?}");

    // The busy node goes: the next pass launches the whole gang.
    let mut r = r;
    r.conditions = a.updates[0].conditions.clone();
    let s = snapshot(vec![], vec![]);
    let a = assess(&s, &w.templates, &w.policy, &[r], NOW + MIN);
    assert_eq!(
        status(&a, PROVISIONED),
        Some(("False", "CapacityIsProvisioning"))
    );
    assert_eq!(a.inject.len(), 2);
    let plan = plan_with(&a.snapshot(&s), &w.templates, &w.policy, NOW + MIN);
    assert_eq!(plan.scale_ups.len(), 1, "{plan:?}");
    assert_eq!(plan.scale_ups[0].count, 2);
}

#[test]
fn provisioning_request_not_provisioned_within_valid_until_seconds_fails() {
    let w = world(POLICY);
    let mut v = request_json("slow", CLASS_ATOMIC, &[("worker", 1)], json!([]));
    v["spec"]["parameters"] = json!({"ValidUntilSeconds": "600"});
    let r = request(&v);
    let s = snapshot(vec![], vec![]);
    // Created 5 minutes before NOW: still tried at NOW, failed 5 minutes later.
    let a = assess(&s, &w.templates, &w.policy, std::slice::from_ref(&r), NOW);
    assert_eq!(a.inject.len(), 1);
    let a = assess(&s, &w.templates, &w.policy, &[r], NOW + 5 * MIN);
    assert_eq!(status(&a, FAILED), Some(("True", "Expired")));
    assert!(a.inject.is_empty());
}

#[test]
fn provisioning_request_check_capacity_answers_from_existing_capacity_without_launching() {
    let w = world(POLICY);
    let r = request(&request_json(
        "probe",
        CLASS_CHECK_CAPACITY,
        &[("worker", 2)],
        json!([]),
    ));
    // One free node: not enough, and nothing is launched for it.
    let one = snapshot(vec![], vec![gpu_node("n1", "us-east-1a").build()]);
    let a = assess(&one, &w.templates, &w.policy, std::slice::from_ref(&r), NOW);
    assert_eq!(
        status(&a, PROVISIONED),
        Some(("False", "CapacityIsNotFound"))
    );
    assert!(a.inject.is_empty());
    // Two free nodes in one zone (one of them still starting): found.
    let two = snapshot(
        vec![],
        vec![
            gpu_node("n1", "us-east-1a").build(),
            gpu_node("n2", "us-east-1a")
                .not_ready()
                .created(NOW - MIN)
                .build(),
        ],
    );
    let a = assess(&two, &w.templates, &w.policy, std::slice::from_ref(&r), NOW);
    assert_eq!(status(&a, PROVISIONED), Some(("True", "CapacityIsFound")));
    assert!(a.inject.is_empty());
    // Two free nodes in two zones do not hold a gang.
    let split = snapshot(
        vec![],
        vec![
            gpu_node("n1", "us-east-1a").build(),
            gpu_node("n2", "us-east-1b").build(),
        ],
    );
    let a = assess(&split, &w.templates, &w.policy, &[r], NOW);
    assert_eq!(
        status(&a, PROVISIONED),
        Some(("False", "CapacityIsNotFound"))
    );
}

#[test]
fn provisioning_request_booking_keeps_its_nodes_until_pods_arrive_or_it_expires() {
    let w = world(POLICY);
    let since = NOW - 2 * MIN;
    let r = request(&request_json(
        "job",
        CLASS_ATOMIC,
        &[("worker", 2)],
        provisioned_since(since),
    ));
    let unneeded = (NOW - 30 * MIN).to_rfc3339();
    let nodes = vec![
        gpu_node("n1", "us-east-1a")
            .annotation(labels::UNNEEDED_SINCE, &unneeded)
            .build(),
        gpu_node("n2", "us-east-1a")
            .annotation(labels::UNNEEDED_SINCE, &unneeded)
            .build(),
    ];
    let s = snapshot(vec![], nodes.clone());
    // Without the booking both empty nodes would go.
    let plain = plan_with(&s, &w.templates, &w.policy, NOW);
    assert_eq!(plain.scale_downs.len(), 2, "{plain:?}");
    let a = assess(&s, &w.templates, &w.policy, std::slice::from_ref(&r), NOW);
    assert!(a.updates.is_empty(), "{a:?}");
    assert_eq!(a.inject.len(), 2);
    let plan = plan_with(&a.snapshot(&s), &w.templates, &w.policy, NOW);
    assert!(plan.scale_downs.is_empty(), "{plan:?}");
    assert!(plan.scale_ups.is_empty(), "{plan:?}");

    // A pending pod of another job does not take a booked node: it gets a node of its own.
    let other = PodBuilder::new("team", "other")
        .gpus(4)
        .cpu_milli(1000)
        .memory_gib(4)
        .build();
    let with_other = snapshot(vec![other], nodes.clone());
    let a = assess(
        &with_other,
        &w.templates,
        &w.policy,
        std::slice::from_ref(&r),
        NOW,
    );
    let plan = plan_with(&a.snapshot(&with_other), &w.templates, &w.policy, NOW);
    assert_eq!(plan.scale_ups.len(), 1, "{plan:?}");
    assert_eq!(plan.scale_ups[0].pods, vec!["team/other"]);

    // One of its pods arrived (bound to n1): one pod left booked.
    let arrived = PodBuilder::new("team", "job-worker-0")
        .gpus(4)
        .cpu_milli(4000)
        .memory_gib(16)
        .annotation(CONSUME_ANNOTATION, "job")
        .on("n1")
        .build();
    let s1 = snapshot(vec![arrived], nodes.clone());
    let a = assess(&s1, &w.templates, &w.policy, std::slice::from_ref(&r), NOW);
    assert_eq!(a.inject.len(), 1);

    // The booking runs out: BookingExpired, nothing booked, the nodes may go.
    let a = assess(&s, &w.templates, &w.policy, &[r], since + BOOKING);
    assert_eq!(
        status(&a, BOOKING_EXPIRED),
        Some(("True", "CapacityReservationTimeExpired"))
    );
    assert!(a.inject.is_empty());
}

#[test]
fn provisioning_request_capacity_revoked_when_its_nodes_are_gone() {
    let w = world(POLICY);
    let r = request(&request_json(
        "job",
        CLASS_ATOMIC,
        &[("worker", 2)],
        provisioned_since(NOW - MIN),
    ));
    // One of the two nodes is gone: the booking cannot hold, and nothing is launched for it.
    let s = snapshot(vec![], vec![gpu_node("n1", "us-east-1a").build()]);
    let a = assess(&s, &w.templates, &w.policy, &[r], NOW);
    assert_eq!(
        status(&a, CAPACITY_REVOKED),
        Some(("True", "CapacityRevoked"))
    );
    assert!(a.inject.is_empty());
}

#[test]
fn provisioning_request_of_other_classes_is_left_alone() {
    let w = world(POLICY);
    let r = request(&request_json(
        "queued",
        "queued-provisioning.gke.io",
        &[("worker", 2)],
        json!([]),
    ));
    let a = assess(
        &snapshot(vec![], vec![]),
        &w.templates,
        &w.policy,
        &[r],
        NOW,
    );
    assert_eq!(a, Assessment::default());
}
