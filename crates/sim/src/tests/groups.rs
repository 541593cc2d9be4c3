//! Pools backed by Auto Scaling groups in the simulated cloud: the same decisions as pools
//! launched with `CreateFleet`, the cloud's side only differing.

use crate::report::Metrics;
use crate::{engine, SimInput, StrategyKind};

/// A one-GPU workload (four pods for an hour, then a gang of two at 20 minutes) that needs the
/// label `team: ml`, spot short in us-east-1a for the first half hour; `pool` is the pool's
/// entry and `groups` the scenario's `autoScalingGroups`, both in flow style.
fn input(zones: &str, pool: &str, groups: &str) -> SimInput {
    crate::test_input(&format!(
        "name: t\n\
         timing: {{bootMin: 60s, bootMax: 120s, devicePluginDelay: 30s}}\n\
         policy:\n  clusterName: sim\n{zones}  pools:\n    - {pool}\n\
         {groups}\
         events:\n\
         \x20 - insufficientCapacity: {{from: 0s, until: 30m, zone: us-east-1a, capacityType: spot}}\n\
         jobs:\n\
         \x20 - name: serve\n    arrival: 0s\n    duration: 1h\n    pods:\n\
         \x20     - name: w\n        replicas: 4\n        nodeSelector: {{team: ml}}\n\
         \x20       requests: {{cpu: \"2\", memory: 8Gi, nvidia.com/gpu: 1}}\n\
         \x20 - name: train\n    arrival: 20m\n    duration: 40m\n    gang: true\n    pods:\n\
         \x20     - name: w\n        replicas: 2\n        nodeSelector: {{team: ml}}\n\
         \x20       requests: {{cpu: \"2\", memory: 8Gi, nvidia.com/gpu: 1}}\n"
    ))
}

fn run(input: &SimInput, k: StrategyKind) -> Metrics {
    let mut s = k.build(input);
    engine::run(input, s.as_mut())
}

#[test]
fn asg_pools_give_the_same_figures_as_create_fleet_pools_with_the_same_offerings() {
    let fleet = input(
        "  zones: [us-east-1a, us-east-1b]\n",
        "{name: a10g, instanceTypes: [g5.xlarge], capacityTypes: [spot, on-demand], \
         labels: {team: ml}, maxNodes: 10, scaleDown: {unneededTime: 2m}}",
        "",
    );
    // The same pool as groups: its instance types, zones, capacity types and labels from
    // them (their Cluster Autoscaler tags), none in the policy.
    let label = "k8s.io/cluster-autoscaler/node-template/label/team: ml";
    let groups = input(
        "",
        "{name: a10g, maxNodes: 10, scaleDown: {unneededTime: 2m}, \
         aws: {autoScalingGroups: {names: [gpu-spot-a, gpu-spot-b, gpu-od]}}}",
        &format!(
            "autoScalingGroups:\n\
             \x20 - {{name: gpu-spot-a, instanceTypes: [g5.xlarge], zones: [us-east-1a], \
             capacityType: spot, maxSize: 20, tags: {{{label}}}}}\n\
             \x20 - {{name: gpu-spot-b, instanceTypes: [g5.xlarge], zones: [us-east-1b], \
             capacityType: spot, maxSize: 20, tags: {{{label}}}}}\n\
             \x20 - {{name: gpu-od, instanceTypes: [g5.xlarge], zones: [us-east-1a, us-east-1b], \
             maxSize: 20, tags: {{{label}}}}}\n"
        ),
    );
    let pool = groups.policy.pool("a10g").unwrap();
    assert!(pool.instance_types.is_none() && pool.cloud_templates.len() == 3);
    assert_eq!(groups.groups.pools["a10g"], [0, 1, 2]);
    for k in StrategyKind::ALL {
        let a = run(&fleet, k);
        let b = run(&groups, k);
        assert_eq!(a.pods_never_placed, 0, "{}", k.name());
        assert!(a.nodes_launched >= 6, "{}: {}", k.name(), a.nodes_launched);
        // Every figure but the run's own wall time and the calls to the cloud (a launch into
        // groups is a call per group grown).
        let figures = |m: &Metrics| {
            let mut v = serde_json::to_value(m).unwrap();
            let o = v.as_object_mut().unwrap();
            o.remove("wall_s");
            o.remove("provider_calls");
            v
        };
        assert_eq!(figures(&a), figures(&b), "{}: the figures differ", k.name());
    }
    // Spot nodes despite the shortage in us-east-1a: the groups of the other zone grew.
    let m = run(&groups, StrategyKind::Ours);
    let spot: usize = m
        .cost_by_offering
        .iter()
        .filter(|o| o.capacity_type == "spot")
        .map(|o| o.nodes)
        .sum();
    assert!(spot > 0, "{:?}", m.cost_by_offering);
}

#[test]
fn asg_group_launch_grows_the_groups_in_order_and_gives_back_what_could_not_launch() {
    use gpu_node_autoscaler_provider::{CapacityType, LaunchRequest, OfferingKey, ProviderError};
    let label = "k8s.io/cluster-autoscaler/node-template/label/team: ml";
    let input = input(
        "",
        "{name: a10g, maxNodes: 10, aws: {autoScalingGroups: {names: [gpu-spot-a, gpu-od]}}}",
        &format!(
            "autoScalingGroups:\n\
             \x20 - {{name: gpu-spot-a, instanceTypes: [g5.xlarge], zones: [us-east-1a], \
             capacityType: spot, maxSize: 20, tags: {{{label}}}}}\n\
             \x20 - {{name: gpu-od, instanceTypes: [g5.xlarge], zones: [us-east-1a], \
             minSize: 1, desiredCapacity: 1, maxSize: 3, tags: {{{label}}}}}\n"
        ),
    );
    let mut world = engine::World::new(&input);
    let key = |ct| OfferingKey {
        instance_type: "g5.xlarge".into(),
        zone: "us-east-1a".into(),
        capacity_type: ct,
    };
    // The on-demand group's own instance at the start, not launched by anyone's request.
    assert_eq!(world.groups.groups[1].instances.len(), 1);
    assert_eq!(world.instances()[0].launch_id, "");
    // The account has room for two more instances.
    world.provider.set_quota(Some(3), None);
    let req = LaunchRequest {
        launch_id: "l1".into(),
        pool: "a10g".into(),
        count: 4,
        offerings: vec![key(CapacityType::Spot), key(CapacityType::OnDemand)],
        tags: Default::default(),
        reservations: Vec::new(),
        atomic: false,
    };
    // The spot group, first, is raised by 4, launches 2 and gives the other 2 back.
    let r = world.launch(&req).unwrap();
    assert_eq!(r.launched.len(), 2, "{r:?}");
    assert!(r.launched.iter().all(|i| i.launch_id == "l1"));
    assert!(r
        .failures
        .iter()
        .any(|(_, e)| matches!(e, ProviderError::QuotaExceeded { .. })));
    let desired = |w: &engine::World| (w.groups.groups[0].desired, w.groups.groups[1].desired);
    assert_eq!(desired(&world), (2, 1));
    // The same launch again launches nothing more than its four.
    world.provider.set_quota(None, None);
    let again = world.launch(&req).unwrap();
    assert_eq!(again.launched.len(), 2);
    assert_eq!(desired(&world), (4, 1));
    assert!(world.launch(&req).unwrap().launched.is_empty());
    // An instance leaves its group with a decrement; none of a group at its minimum size.
    let spot = world.groups.groups[0].instances[0].id.clone();
    world.terminate_instance(&spot).unwrap();
    assert_eq!(desired(&world), (3, 1));
    let od = world.groups.groups[1].instances[0].id.clone();
    let refused = world.terminate_instance(&od).unwrap_err();
    assert!(refused.contains("minimum size"), "{refused}");
    assert_eq!(desired(&world), (3, 1));
}
