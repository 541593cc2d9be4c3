//! Pods with ResourceClaims in the simulated cluster: where they run, what their claims hold,
//! and what each strategy does for them.

use crate::engine::*;
use crate::{baselines, ours, MINUTE, SECOND};

/// Three pools from zero: A100 80GB and H100 nodes with NVIDIA's DRA driver, A10G nodes with the
/// device plugin. `jobs` is appended as the scenario's jobs.
fn input(jobs: &str) -> SimInput {
    let text = format!(
        "name: t\n\
         timing: {{bootMin: 60s, bootMax: 60s, devicePluginDelay: 30s}}\n\
         policy:\n\
         \x20 clusterName: sim\n\
         \x20 zones: [us-east-1a]\n\
         \x20 pools:\n\
         \x20   - {{name: a100, instanceTypes: [p4de.24xlarge], capacityTypes: [on-demand], maxNodes: 2, dra: {{}}}}\n\
         \x20   - {{name: h100, instanceTypes: [p5.48xlarge], capacityTypes: [on-demand], maxNodes: 2, dra: {{}}}}\n\
         \x20   - {{name: a10g, instanceTypes: [g5.xlarge], capacityTypes: [on-demand], maxNodes: 2}}\n\
         jobs:\n{jobs}"
    );
    crate::test_input(&text)
}

/// A job of one pod claiming `count` GPUs whose product name starts with `product`.
fn claim_job(name: &str, arrival: &str, product: &str, count: u32) -> String {
    claim_gang(name, arrival, product, count, 1)
}

/// A job of `replicas` pods, a gang when more than one, each claiming `count` GPUs whose product
/// name starts with `product`.
fn claim_gang(name: &str, arrival: &str, product: &str, count: u32, replicas: u32) -> String {
    let gang = replicas > 1;
    format!(
        "  - name: {name}\n    arrival: {arrival}\n    duration: 30m\n    gang: {gang}\n    pods:\n\
         \x20     - name: w\n        replicas: {replicas}\n        requests: {{cpu: \"4\", memory: 16Gi}}\n        claims:\n\
         \x20         - name: gpu\n            requests:\n\
         \x20             - name: gpus\n                deviceClassName: gpu.nvidia.com\n\
         \x20               count: {count}\n                selectors:\n\
         \x20                 - device.attributes['gpu.nvidia.com'].productName.startsWith('{product}')\n"
    )
}

const PLAIN_JOB: &str = "  - name: plain\n    arrival: 0s\n    duration: 30m\n    pods:\n\
                         \x20     - name: w\n        requests: {cpu: \"2\", memory: 8Gi, nvidia.com/gpu: 1}\n";

/// Handles every event up to `t`, scheduling after each instant, as `run` does without a
/// strategy.
pub(super) fn run_until(w: &mut World, t: Ms) {
    while let Some(at) = w.next_event_time().filter(|&at| at <= t) {
        w.advance(at);
        while w.next_event_time() == Some(w.now) {
            let Some(Reverse((_, _, e))) = w.events.pop() else {
                break;
            };
            w.handle(e);
        }
        w.schedule();
    }
}

/// Launches one node of `pool` (its first offering).
fn launch(w: &mut World, pool: &str) {
    launch_where(w, pool, |_| true);
}

/// Launches one node of `pool`'s first offering that `wanted` accepts.
pub(super) fn launch_where(
    w: &mut World,
    pool: &str,
    wanted: impl Fn(&gpu_node_autoscaler_provider::OfferingKey) -> bool,
) {
    let key = w
        .templates()
        .iter()
        .filter(|t| t.pool_name == pool)
        .flat_map(|t| &t.offerings)
        .map(|o| &o.key)
        .find(|k| wanted(k))
        .cloned()
        .unwrap();
    let req = LaunchRequest {
        launch_id: format!("test-{pool}-{}", w.instances.len()),
        pool: pool.into(),
        count: 1,
        offerings: vec![key],
        tags: BTreeMap::new(),
        reservations: Vec::new(),
        atomic: false,
    };
    assert_eq!(w.launch(&req).unwrap().launched.len(), 1);
}

#[test]
fn a_claim_pod_runs_only_on_published_devices_that_satisfy_its_selector_and_frees_them() {
    let input = input(&claim_job("train", "3m", "NVIDIA H100", 2));
    let mut w = World::new(&input);
    // The A100 node comes first in creation order: first fit would take it if devices did not
    // matter.
    launch(&mut w, "a100");
    launch(&mut w, "h100");
    // Registered at 60 s, devices published 30 s later.
    run_until(&mut w, 70 * SECOND);
    assert!(w.snapshot().dra.slices.is_empty());
    assert_eq!(w.nodes.iter().map(|n| n.node.dra_devices).sum::<i64>(), 0);
    run_until(&mut w, 3 * MINUTE);
    let s = w.snapshot();
    assert_eq!(s.dra.slices.len(), 2);
    assert!(s.nodes.iter().all(|n| n.dra_devices == 8), "{:?}", s.nodes);
    let ni = w.pods[0].node.expect("the pod runs");
    let node = &w.nodes[ni];
    assert_eq!(node.offering.instance_type, "p5.48xlarge");
    assert_eq!(node.taken.iter().filter(|t| **t).count(), 2);
    // The claim's allocation, as the scheduler writes it and a watch store joins it.
    let s = w.snapshot();
    let a = s.pods[0].claims[0].allocation.as_ref().unwrap();
    assert_eq!(a.node.as_deref(), Some(node.node.name.as_str()));
    assert_eq!(a.devices.len(), 2);
    assert_eq!(s.dra.allocated[&node.node.name], a.devices);
    assert!(!s.pods[0].needs_devices());
    // Two H100s: two GPUs running.
    assert_eq!(w.running_gpus, 2.0);
    // It ends: the claim is deallocated and its devices are free again.
    run_until(&mut w, 34 * MINUTE);
    assert!(w.pods[0].done);
    assert!(w.nodes[ni].taken.iter().all(|t| !t));
    assert!(w.dra.claims.is_empty());
    assert!(w.snapshot().dra.allocated.is_empty());
    assert_eq!(w.running_gpus, 0.0);
}

#[test]
fn a_gang_of_claim_pods_is_bound_only_once_every_member_gets_devices() {
    // Two members of 6 H100s each: one p5 (8 GPUs) holds one of them, so neither is bound until
    // a second node publishes its devices.
    let input = input(&claim_gang("pair", "2m", "NVIDIA H100", 6, 2));
    let mut w = World::new(&input);
    launch(&mut w, "h100");
    run_until(&mut w, 3 * MINUTE);
    assert!(w
        .pods
        .iter()
        .all(|p| p.node.is_none() && p.pod.unschedulable));
    assert!(w.nodes.iter().all(|n| n.taken.iter().all(|t| !t)));
    launch(&mut w, "h100");
    run_until(&mut w, 6 * MINUTE);
    assert!(w.pods.iter().all(|p| p.node.is_some()));
    assert_ne!(w.pods[0].node, w.pods[1].node);
    for n in &w.nodes {
        assert_eq!(n.taken.iter().filter(|t| **t).count(), 6);
    }
}

#[test]
fn a_claim_no_pool_satisfies_is_reported_with_the_core_reason_and_never_gets_a_node() {
    let input = input(&claim_job("b200", "0s", "NVIDIA B200", 1));
    let mut s = ours::Ours::new(&input);
    let m = run(&input, &mut s);
    assert_eq!(m.pods_never_placed, 1);
    assert_eq!(m.nodes_launched, 0);
    let plan = s.last_plan().unwrap();
    assert_eq!(plan.unschedulable.len(), 1, "{plan:?}");
    let u = &plan.unschedulable[0];
    assert!(u.permanent, "{u:?}");
    assert!(
        u.reason.contains("request gpus")
            && u.reason
                .contains("no pool's devices and no node's published devices match"),
        "{u:?}"
    );
}

#[test]
fn ours_places_claim_pods_and_the_baselines_leave_them_pending_from_zero() {
    let jobs = format!("{}{PLAIN_JOB}", claim_job("train", "0s", "NVIDIA H100", 1));
    let input = input(&jobs);
    let mut ours = ours::Ours::new(&input);
    let m = run(&input, &mut ours);
    assert_eq!(m.pods_never_placed, 0);
    assert!(m
        .cost_by_offering
        .iter()
        .any(|o| o.instance_type == "p5.48xlarge"));
    assert!(!m
        .cost_by_offering
        .iter()
        .any(|o| o.instance_type == "p4de.24xlarge"));
    // Karpenter ignores pods with ResourceClaims; the Cluster Autoscaler's AWS templates carry
    // no devices, so no empty group can host them. The device-plugin pod runs under both.
    let mut karpenter = baselines::KarpenterLike::new(&input);
    let mut ca = baselines::CaLike::new(&input);
    for m in [run(&input, &mut karpenter), run(&input, &mut ca)] {
        assert_eq!(m.pods_never_placed, 1, "{}", m.strategy);
        assert!(
            m.cost_by_offering.iter().all(|o| o.pool == "a10g"),
            "{}: {:?}",
            m.strategy,
            m.cost_by_offering
        );
        assert!(m.nodes_launched > 0, "{}", m.strategy);
    }
}

#[test]
fn ca_like_scales_a_group_for_claims_once_it_has_a_node_whose_devices_it_copies() {
    let jobs = format!(
        "{}{}",
        claim_job("a", "0s", "NVIDIA H100", 8),
        claim_job("b", "5m", "NVIDIA H100", 8)
    );
    let input = input(&jobs);
    let mut w = World::new(&input);
    launch(&mut w, "h100");
    run_until(&mut w, 5 * MINUTE);
    assert!(w.pods[0].node.is_some() && w.pods[1].node.is_none());
    // Karpenter does not provision for it; the Cluster Autoscaler templates the group on its
    // node, devices included, and adds one.
    let mut karpenter = baselines::KarpenterLike::new(&input);
    karpenter.run(&mut w);
    assert!(w.unregistered().is_empty());
    let mut ca = baselines::CaLike::new(&input);
    ca.run(&mut w);
    let launched = w.unregistered();
    assert_eq!(launched.len(), 1);
    assert_eq!(launched[0].1.instance_type, "p5.48xlarge");
}
