//! CapacityBuffers: conversion from the API's objects, how many chunks, and the room a pass
//! keeps for them.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{json, Value};

use super::*;
use crate::catalog;
use crate::convert::{scalable_key, Converter};
use crate::fixtures::{NodeBuilder, PodBuilder};
use crate::model::{labels, Node};
use crate::plan::{plan_with, Templates};
use crate::policy::parse_policy;

const NOW: Time = Time(1_800_000_000);
const MIN: Duration = Duration::from_secs(60);

const POLICY: &str = r#"
zones: [us-east-1a]
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

fn world() -> World {
    let policy = parse_policy(POLICY, "test.yaml").unwrap_or_else(|e| panic!("{e}"));
    let types = catalog::parse_csv(catalog::BUILTIN_AWS, "builtin").unwrap();
    let catalog = catalog::offerings_from_list_prices(&policy, types);
    let templates = Templates::new(&policy, &catalog);
    World { policy, templates }
}

fn pod_template_spec(gpus: u32) -> Value {
    let mut requests = json!({"cpu": "2", "memory": "8Gi"});
    if gpus > 0 {
        requests["nvidia.com/gpu"] = json!(gpus.to_string());
    }
    json!({
        "metadata": {"labels": {"app": "inference"}},
        "spec": {"containers": [{"name": "srv", "image": "x", "resources": {"requests": requests}}]}
    })
}

fn templates(gpus: u32) -> BTreeMap<String, Value> {
    [(
        "serve/warm".to_string(),
        json!({"apiVersion": "v1", "kind": "PodTemplate",
               "metadata": {"name": "warm", "namespace": "serve"},
               "template": pod_template_spec(gpus)}),
    )]
    .into_iter()
    .collect()
}

fn buffer_json(spec: Value) -> Value {
    json!({
        "apiVersion": "autoscaling.x-k8s.io/v1beta1", "kind": "CapacityBuffer",
        "metadata": {"name": "warm", "namespace": "serve", "uid": "uid-warm", "generation": 1,
                     "creationTimestamp": (NOW - 5 * MIN).to_rfc3339()},
        "spec": spec
    })
}

fn buffer(spec: Value) -> CapacityBuffer {
    Converter::new()
        .capacity_buffer(&buffer_json(spec), &templates(1), &BTreeMap::new())
        .unwrap_or_else(|e| panic!("{e}"))
}

fn gpu_node(name: &str) -> NodeBuilder {
    NodeBuilder::new(name)
        .pool("a10g", "g5.12xlarge", "us-east-1a")
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

fn condition<'a>(a: &'a Assessment, kind: &str) -> Option<(&'a str, &'a str)> {
    a.updates
        .first()
        .and_then(|u| u.condition(kind))
        .map(|c| (c.status.as_str(), c.reason.as_str()))
}

fn real_pod(name: &str) -> PodBuilder {
    PodBuilder::new("serve", name)
        .gpus(1)
        .cpu_milli(2000)
        .memory_gib(8)
}

#[test]
fn buffer_planned_when_nothing_pending() {
    let w = world();
    let b = buffer(json!({"podTemplateRef": {"name": "warm"}, "replicas": 2}));
    let s = snapshot(vec![], vec![]);
    // Nothing pending: no plan launches anything.
    assert!(plan_with(&s, &w.templates, &w.policy, NOW)
        .scale_ups
        .is_empty());

    let a = assess(&s, &w.templates, &w.policy, std::slice::from_ref(&b), NOW);
    assert_eq!(a.inject.len(), 2);
    assert!(a.inject.iter().all(|p| p.priority == BUFFER_PRIORITY
        && buffer_of(p) == Some("warm")
        && p.requests.whole_gpus() == 1
        && p.node_name.is_none()));
    assert_eq!(
        a.pod_keys().into_iter().collect::<Vec<_>>(),
        vec![
            "serve/capacity-buffer.warm.0",
            "serve/capacity-buffer.warm.1"
        ]
    );
    let plan = plan_with(&a.snapshot(&s), &w.templates, &w.policy, NOW);
    assert_eq!(plan.scale_ups.len(), 1, "{plan:?}");
    assert_eq!(plan.scale_ups[0].count, 1);
    assert_eq!(plan.scale_ups[0].pods.len(), 2);

    // Status as the Cluster Autoscaler writes it.
    let u = &a.updates[0];
    assert_eq!(u.status.replicas, Some(2));
    assert_eq!(u.status.pod_template.as_deref(), Some("warm"));
    assert_eq!(u.status.strategy.as_deref(), Some(STRATEGY_ACTIVE));
    assert_eq!(
        condition(&a, READY_FOR_PROVISIONING),
        Some(("True", REASON_ATTRIBUTES_SET))
    );
    assert_eq!(condition(&a, PROVISIONING), Some(("True", REASON_INJECTED)));
    // Reported: both chunks on their way, priced as half... a quarter of a 4-GPU node each.
    let r = &a.report[0];
    assert_eq!(
        (r.replicas, r.gpus, r.ready, r.provisioning, r.unplaced),
        (2, 2, 0, 2, 0)
    );
    let node_price = plan.scale_ups[0].cost_per_hour();
    assert!(
        (r.cost_per_hour - node_price / 2.0).abs() < 1e-9,
        "{r:?} {node_price}"
    );

    // Once written, the same status is not written again.
    let mut written = b.clone();
    written.status = u.status.clone();
    let again = assess(&s, &w.templates, &w.policy, &[written], NOW + MIN);
    assert!(again.updates.is_empty(), "{again:?}");
    assert_eq!(again.inject.len(), 2);
}

#[test]
fn buffer_room_taken_by_real_pod_is_replenished() {
    let w = world();
    let b = buffer(json!({"podTemplateRef": {"name": "warm"}, "replicas": 4}));
    let nodes = vec![gpu_node("n1").build()];
    // The warm node holds the whole buffer: nothing to launch.
    let s = snapshot(vec![], nodes.clone());
    let a = assess(&s, &w.templates, &w.policy, std::slice::from_ref(&b), NOW);
    let plan = plan_with(&a.snapshot(&s), &w.templates, &w.policy, NOW);
    assert!(plan.scale_ups.is_empty(), "{plan:?}");
    assert_eq!(plan.existing_capacity.len(), 4);
    assert_eq!(a.report[0].ready, 4);

    // A real pod arrives, pending: it takes the warm room (planned first, onto n1), and the
    // buffer's displaced chunk gets a new node.
    let pending = real_pod("burst-0").build();
    let s = snapshot(vec![pending], nodes.clone());
    let a = assess(&s, &w.templates, &w.policy, std::slice::from_ref(&b), NOW);
    let plan = plan_with(&a.snapshot(&s), &w.templates, &w.policy, NOW);
    assert!(
        plan.existing_capacity
            .iter()
            .any(|p| p.pod == "serve/burst-0" && p.target == "n1"),
        "{plan:?}"
    );
    assert_eq!(plan.scale_ups.len(), 1, "{plan:?}");
    assert_eq!(plan.scale_ups[0].pods.len(), 1);
    assert!(plan.scale_ups[0].pods[0]
        .as_str()
        .starts_with("serve/capacity-buffer.warm."));

    // The scheduler bound it to n1 at once (the virtual pods hold nothing): the buffer is
    // replenished with a new node all the same.
    let bound = real_pod("burst-0").on("n1").build();
    let s = snapshot(vec![bound], nodes);
    let a = assess(&s, &w.templates, &w.policy, std::slice::from_ref(&b), NOW);
    let plan = plan_with(&a.snapshot(&s), &w.templates, &w.policy, NOW);
    assert_eq!(plan.scale_ups.len(), 1, "{plan:?}");
    assert_eq!(plan.scale_ups[0].count, 1);
    let r = &a.report[0];
    assert_eq!((r.ready, r.provisioning), (3, 1), "{r:?}");
}

#[test]
fn buffer_room_keeps_its_node_from_scale_down() {
    let w = world();
    let unneeded = (NOW - 30 * MIN).to_rfc3339();
    let nodes = vec![
        gpu_node("n1")
            .annotation(labels::UNNEEDED_SINCE, &unneeded)
            .build(),
        gpu_node("n2")
            .annotation(labels::UNNEEDED_SINCE, &unneeded)
            .build(),
    ];
    let s = snapshot(vec![], nodes);
    let plain = plan_with(&s, &w.templates, &w.policy, NOW);
    assert_eq!(plain.scale_downs.len(), 2, "{plain:?}");

    // A buffer of 3 one-GPU chunks fits n1: n1 stays, n2 (no buffer room wanted) goes.
    let b = buffer(json!({"podTemplateRef": {"name": "warm"}, "replicas": 3}));
    let a = assess(&s, &w.templates, &w.policy, std::slice::from_ref(&b), NOW);
    let plan = plan_with(&a.snapshot(&s), &w.templates, &w.policy, NOW);
    assert!(plan.scale_ups.is_empty(), "{plan:?}");
    assert_eq!(
        plan.scale_downs
            .iter()
            .map(|d| d.node.as_str())
            .collect::<Vec<_>>(),
        vec!["n2"],
        "{plan:?}"
    );
    let r = &a.report[0];
    assert_eq!((r.ready, r.provisioning, r.unplaced), (3, 0, 0));
    assert!(r.cost_per_hour > 0.0);

    // Deleted (no buffer any more): both go.
    let a = assess(&s, &w.templates, &w.policy, &[], NOW);
    assert!(a.inject.is_empty() && a.report.is_empty());
}

#[test]
fn buffer_percentage_of_scalable_object() {
    let deployment = |replicas: i64| {
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
               "metadata": {"name": "llm", "namespace": "serve"},
               "spec": {"replicas": replicas, "template": pod_template_spec(1)},
               "status": {"replicas": replicas}})
    };
    let convert = |spec: Value, replicas: i64| {
        let scalables: BTreeMap<String, Value> = [(
            scalable_key("apps", "Deployment", "serve", "llm"),
            deployment(replicas),
        )]
        .into_iter()
        .collect();
        Converter::new()
            .capacity_buffer(&buffer_json(spec), &BTreeMap::new(), &scalables)
            .unwrap()
    };
    let by_ref = json!({"apiGroup": "apps", "kind": "Deployment", "name": "llm"});
    // 25% of 10 replicas, rounded up: 3.
    let b = convert(json!({"scalableRef": by_ref, "percentage": 25}), 10);
    assert_eq!(b.scalable_replicas, Some(10));
    let chunk = b.chunk.as_ref().unwrap();
    assert_eq!(chunk.requests.whole_gpus(), 1);
    assert_eq!(b.desired_replicas(chunk), Ok(3));
    // The larger of replicas and the percentage.
    let b = convert(
        json!({"scalableRef": by_ref, "percentage": 25, "replicas": 5}),
        10,
    );
    assert_eq!(b.desired_replicas(b.chunk.as_ref().unwrap()), Ok(5));
    let b = convert(
        json!({"scalableRef": by_ref, "percentage": 50, "replicas": 1}),
        3,
    );
    assert_eq!(b.desired_replicas(b.chunk.as_ref().unwrap()), Ok(2));
    // The Deployment scaled to 0: no chunk from the percentage.
    let b = convert(json!({"scalableRef": by_ref, "percentage": 25}), 0);
    assert_eq!(b.desired_replicas(b.chunk.as_ref().unwrap()), Ok(0));
    let w = world();
    let a = assess(
        &snapshot(vec![], vec![]),
        &w.templates,
        &w.policy,
        &[b],
        NOW,
    );
    assert!(a.inject.is_empty());
    assert_eq!(condition(&a, PROVISIONING), Some(("False", REASON_EMPTY)));

    // A missing Deployment: not ready, with why.
    let b = Converter::new()
        .capacity_buffer(
            &buffer_json(json!({"scalableRef": by_ref, "percentage": 25})),
            &BTreeMap::new(),
            &BTreeMap::new(),
        )
        .unwrap();
    let a = assess(
        &snapshot(vec![], vec![]),
        &w.templates,
        &w.policy,
        &[b],
        NOW,
    );
    assert!(a.inject.is_empty());
    assert_eq!(
        condition(&a, READY_FOR_PROVISIONING),
        Some(("False", REASON_ERROR))
    );
    let msg = &a.updates[0]
        .condition(READY_FOR_PROVISIONING)
        .unwrap()
        .message;
    assert!(msg.contains("Deployment serve/llm not found"), "{msg}");
}

#[test]
fn buffer_limits_cap_the_chunks() {
    // Replicas capped by limits: 3 GPUs hold 3 one-GPU chunks.
    let b = buffer(json!({"podTemplateRef": {"name": "warm"}, "replicas": 5,
                          "limits": {"nvidia.com/gpu": "3"}}));
    assert_eq!(b.desired_replicas(b.chunk.as_ref().unwrap()), Ok(3));
    // Limits alone: as many as fit, the tightest resource deciding (5 CPUs / 2 per chunk).
    let b = buffer(json!({"podTemplateRef": {"name": "warm"},
                          "limits": {"nvidia.com/gpu": "8", "cpu": "5"}}));
    assert_eq!(b.desired_replicas(b.chunk.as_ref().unwrap()), Ok(2));
    // Below the limits, replicas stand.
    let b = buffer(json!({"podTemplateRef": {"name": "warm"}, "replicas": 2,
                          "limits": {"nvidia.com/gpu": "8"}}));
    assert_eq!(b.desired_replicas(b.chunk.as_ref().unwrap()), Ok(2));
    // Limits on nothing the chunk asks for, and no count at all: not ready, with why.
    let w = world();
    for (spec, says) in [
        (
            json!({"podTemplateRef": {"name": "warm"}, "limits": {"amd.com/gpu": "8"}}),
            "spec.limits",
        ),
        (json!({"podTemplateRef": {"name": "warm"}}), "spec.replicas"),
        (
            json!({"podTemplateRef": {"name": "warm"}, "limits": {"nvidia.com/gpu": "lots"}}),
            "spec.limits.nvidia.com/gpu",
        ),
    ] {
        let b = buffer(spec);
        let a = assess(
            &snapshot(vec![], vec![]),
            &w.templates,
            &w.policy,
            &[b],
            NOW,
        );
        assert!(a.inject.is_empty());
        assert_eq!(
            condition(&a, READY_FOR_PROVISIONING),
            Some(("False", REASON_ERROR))
        );
        assert_eq!(
            condition(&a, PROVISIONING),
            Some(("False", REASON_NOT_READY))
        );
        let msg = &a.updates[0]
            .condition(READY_FOR_PROVISIONING)
            .unwrap()
            .message;
        assert!(msg.contains(says), "{msg}");
    }
}

#[test]
fn buffer_limit_at_zero_keeps_no_chunk() {
    // A limit of zero GPUs, alone: as many chunks as fit, which is none (not "no limit").
    let b = buffer(json!({"podTemplateRef": {"name": "warm"},
                          "limits": {"nvidia.com/gpu": "0"}}));
    assert_eq!(b.desired_replicas(b.chunk.as_ref().unwrap()), Ok(0));
    // With replicas and another limit: the zero caps them all the same.
    let b = buffer(json!({"podTemplateRef": {"name": "warm"}, "replicas": 3,
                          "limits": {"nvidia.com/gpu": "0", "cpu": "10"}}));
    assert_eq!(b.desired_replicas(b.chunk.as_ref().unwrap()), Ok(0));
    let w = world();
    let a = assess(
        &snapshot(vec![], vec![]),
        &w.templates,
        &w.policy,
        &[b],
        NOW,
    );
    assert!(a.inject.is_empty());
    assert_eq!(a.updates[0].status.replicas, Some(0));
    assert_eq!(condition(&a, PROVISIONING), Some(("False", REASON_EMPTY)));
}

#[test]
fn buffer_of_another_strategy_or_without_gpus_is_left_alone() {
    let w = world();
    let other = buffer(json!({"podTemplateRef": {"name": "warm"}, "replicas": 2,
                              "provisioningStrategy": "example.com/stand-by"}));
    let cpu_only = Converter::new()
        .capacity_buffer(
            &buffer_json(json!({"podTemplateRef": {"name": "warm"}, "replicas": 2})),
            &templates(0),
            &BTreeMap::new(),
        )
        .unwrap();
    let a = assess(
        &snapshot(vec![], vec![]),
        &w.templates,
        &w.policy,
        &[other, cpu_only],
        NOW,
    );
    assert_eq!(a, Assessment::default());
}

#[test]
fn buffer_that_no_pool_can_hold_is_not_provisioning() {
    let w = world();
    let mut t = templates(1);
    t.get_mut("serve/warm").unwrap()["template"]["spec"]["nodeSelector"] =
        json!({"node.kubernetes.io/instance-type": "p5.48xlarge"});
    let b = Converter::new()
        .capacity_buffer(
            &buffer_json(json!({"podTemplateRef": {"name": "warm"}, "replicas": 1})),
            &t,
            &BTreeMap::new(),
        )
        .unwrap();
    let a = assess(
        &snapshot(vec![], vec![]),
        &w.templates,
        &w.policy,
        &[b],
        NOW,
    );
    assert_eq!(
        condition(&a, PROVISIONING),
        Some(("False", REASON_CANNOT_PROVISION))
    );
    assert_eq!(a.report[0].unplaced, 1);
}

/// `status.podTemplateGeneration` is the generation of the PodTemplate the chunk was made from,
/// as the Cluster Autoscaler reports it, and follows the template's changes.
#[test]
fn buffer_reports_the_pod_template_generation() {
    let w = world();
    let mut t = templates(1);
    t.get_mut("serve/warm").unwrap()["metadata"]["generation"] = json!(3);
    let spec = json!({"podTemplateRef": {"name": "warm"}, "replicas": 1});
    let b = Converter::new()
        .capacity_buffer(&buffer_json(spec.clone()), &t, &BTreeMap::new())
        .unwrap();
    let s = snapshot(vec![], vec![]);
    let a = assess(&s, &w.templates, &w.policy, std::slice::from_ref(&b), NOW);
    assert_eq!(a.updates[0].status.pod_template_generation, Some(3));
    // Written back and read again: nothing to write until the template changes.
    let mut written = buffer_json(spec.clone());
    written["status"] = json!({"replicas": 1, "podTemplateRef": {"name": "warm"},
        "podTemplateGeneration": 3, "provisioningStrategy": STRATEGY_ACTIVE});
    let mut again = Converter::new()
        .capacity_buffer(&written, &t, &BTreeMap::new())
        .unwrap();
    again.status.conditions = a.updates[0].status.conditions.clone();
    assert!(assess(
        &s,
        &w.templates,
        &w.policy,
        std::slice::from_ref(&again),
        NOW
    )
    .updates
    .is_empty());
    t.get_mut("serve/warm").unwrap()["metadata"]["generation"] = json!(4);
    let mut changed = Converter::new()
        .capacity_buffer(&written, &t, &BTreeMap::new())
        .unwrap();
    changed.status.conditions = a.updates[0].status.conditions.clone();
    let a = assess(&s, &w.templates, &w.policy, &[changed], NOW);
    assert_eq!(a.updates[0].status.pod_template_generation, Some(4));
}

/// A buffer the pool's `maxNodes` caps: the chunks without room are reported `LimitedByQuotas`
/// with the planner's reason; once the limit leaves room for all of them, the condition goes
/// `False`.
#[test]
fn buffer_capped_by_the_pools_limits_is_limited_by_quotas() {
    let w = world();
    // Ten g5.12xlarge nodes at most, four GPUs each: 40 one-GPU chunks fit, 44 do not.
    let b = buffer(json!({"podTemplateRef": {"name": "warm"}, "replicas": 44}));
    let s = snapshot(vec![], vec![]);
    let a = assess(&s, &w.templates, &w.policy, std::slice::from_ref(&b), NOW);
    assert_eq!(a.report[0].unplaced, 4, "{:?}", a.report);
    let c = a.updates[0]
        .condition(LIMITED_BY_QUOTAS)
        .expect("the condition");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("True", REASON_POOL_LIMITS)
    );
    assert!(
        c.message.starts_with("4 of the buffer's 44 chunks have no room under the pools' limits: limits reached: pool a10g (max 10 nodes)"),
        "{}",
        c.message
    );
    // Still provisioning what fits.
    assert_eq!(condition(&a, PROVISIONING), Some(("True", REASON_INJECTED)));

    // Within the limits again: False.
    let mut b = buffer(json!({"podTemplateRef": {"name": "warm"}, "replicas": 40}));
    b.status = a.updates[0].status.clone();
    let a = assess(&s, &w.templates, &w.policy, &[b], NOW + MIN);
    assert_eq!(a.report[0].unplaced, 0);
    assert_eq!(
        condition(&a, LIMITED_BY_QUOTAS),
        Some(("False", REASON_WITHIN_LIMITS))
    );
    // A buffer never limited gets no such condition.
    let a = assess(
        &s,
        &w.templates,
        &w.policy,
        &[buffer(
            json!({"podTemplateRef": {"name": "warm"}, "replicas": 2}),
        )],
        NOW,
    );
    assert_eq!(condition(&a, LIMITED_BY_QUOTAS), None);
}

#[test]
fn buffer_scalable_ref_gets_a_pod_template_of_its_own_and_its_status_names_it() {
    let deployment = |gpus: u32| {
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
               "metadata": {"name": "llm", "namespace": "serve"},
               "spec": {"replicas": 4, "template": pod_template_spec(gpus)},
               "status": {"replicas": 4}})
    };
    let own = |owner: &str, hash: &str| {
        json!({"apiVersion": "v1", "kind": "PodTemplate",
               "metadata": {"name": "capacitybuffer-warm-pod-template", "namespace": "serve",
                            "generation": 2,
                            "annotations": {SOURCE_HASH_ANNOTATION: hash},
                            "ownerReferences": [{"apiVersion": "autoscaling.x-k8s.io/v1beta1",
                                "kind": "CapacityBuffer", "name": "warm", "uid": owner}]},
               "template": pod_template_spec(1)})
    };
    let w = world();
    let spec = json!({"scalableRef": {"apiGroup": "apps", "kind": "Deployment", "name": "llm"},
                      "replicas": 1});
    let run = |gpus: u32, own: Option<Value>| {
        let scalables: BTreeMap<String, Value> = [(
            scalable_key("apps", "Deployment", "serve", "llm"),
            deployment(gpus),
        )]
        .into_iter()
        .collect();
        let templates: BTreeMap<String, Value> = own
            .map(|t| ("serve/capacitybuffer-warm-pod-template".to_string(), t))
            .into_iter()
            .collect();
        let b = Converter::new()
            .capacity_buffer(&buffer_json(spec.clone()), &templates, &scalables)
            .unwrap();
        assess(
            &snapshot(vec![], vec![]),
            &w.templates,
            &w.policy,
            &[b],
            NOW,
        )
    };

    // No template of its own yet: one is created from the Deployment's pod template; the status
    // names none yet.
    let a = run(1, None);
    assert_eq!(a.templates.len(), 1, "{:?}", a.templates);
    let t = &a.templates[0];
    assert_eq!(
        (t.namespace.as_str(), t.name.as_str(), t.buffer.as_str()),
        ("serve", "capacitybuffer-warm-pod-template", "warm")
    );
    assert_eq!(t.buffer_uid, "uid-warm");
    assert!(t.create);
    assert_eq!(t.template, pod_template_spec(1));
    assert_eq!(t.hash, template_hash(&pod_template_spec(1)));
    assert_eq!(a.updates[0].status.pod_template, None);
    assert_eq!(a.inject.len(), 1, "the chunk is planned all the same");

    // Written and seen: nothing to write, the status names it and its generation.
    let hash = template_hash(&pod_template_spec(1));
    let a = run(1, Some(own("uid-warm", &hash)));
    assert!(a.templates.is_empty(), "{:?}", a.templates);
    let st = &a.updates[0].status;
    assert_eq!(
        st.pod_template.as_deref(),
        Some("capacitybuffer-warm-pod-template")
    );
    assert_eq!(st.pod_template_generation, Some(2));

    // The Deployment's pod template changes: ours is rewritten from it.
    let a = run(2, Some(own("uid-warm", &hash)));
    assert_eq!(a.templates.len(), 1);
    assert!(!a.templates[0].create);
    assert_eq!(a.templates[0].template, pod_template_spec(2));

    // A PodTemplate of that name the buffer does not own is never written nor named.
    let a = run(2, Some(own("someone-else", "x")));
    assert!(a.templates.is_empty());
    assert_eq!(a.updates[0].status.pod_template, None);
}
