use std::collections::{BTreeMap, BTreeSet};

use gpu_node_autoscaler_provider::{CapacityType, Catalog, OfferingKey};
use proptest::prelude::*;

use super::*;
use crate::catalog;
use crate::fixtures::{NodeBuilder, PodBuilder};
use crate::model::constraints::Operator;
use crate::model::resources::place_share;
use crate::model::{labels, Effect, InFlight, Pod, Snapshot, Taint, Time};
use crate::policy::{parse_policy, Policy};

const NOW: Time = Time(1_800_000_000_000);

/// Two pools on A10G/L4 (spot first), an on-demand A100 pool, a MIG pool and a shared T4 pool.
const POLICY: &str = r#"
zones: [us-east-1a, us-east-1b]
pools:
  - name: a10g
    instanceTypes: [g5.xlarge, g5.2xlarge, g5.4xlarge, g5.12xlarge, g5.48xlarge]
    capacityTypes: [spot, on-demand]
    maxNodes: 100
  - name: l4
    instanceTypes: [g6.xlarge, g6.12xlarge]
    capacityTypes: [spot, on-demand]
    maxNodes: 100
  - name: a100
    instanceTypes: [p4d.24xlarge]
    capacityTypes: [on-demand]
    maxNodes: 10
    taints: [{key: nvidia.com/gpu, value: "true", effect: NoSchedule}]
  - name: mig
    instanceTypes: [p4d.24xlarge]
    zones: [us-east-1a]
    maxNodes: 2
    gpuMode: mig
    migLayout: {1g.5gb: 7}
  - name: t4-shared
    instanceTypes: [g4dn.xlarge, g4dn.12xlarge]
    capacityTypes: [spot, on-demand]
    maxNodes: 20
    gpuMode: shared
    labels: {gpu-sharing: "true"}
"#;

fn policy(text: &str) -> Policy {
    parse_policy(text, "test.yaml").unwrap_or_else(|e| panic!("{e}"))
}

fn catalog_for(p: &Policy) -> Catalog {
    let types = catalog::parse_csv(catalog::BUILTIN_AWS, "builtin").unwrap();
    catalog::offerings_from_list_prices(p, types)
}

fn snap(pods: Vec<Pod>, nodes: Vec<crate::model::Node>) -> Snapshot {
    Snapshot {
        pods,
        nodes,
        ..Default::default()
    }
}

fn run(s: &Snapshot, text: &str) -> Plan {
    let p = policy(text);
    let c = catalog_for(&p);
    let plan = plan(s, &c, &p, NOW);
    check_invariants(s, &c, &p, &plan);
    plan
}

fn gpu_pod(name: &str, gpus: i64) -> PodBuilder {
    PodBuilder::new("default", name)
        .gpus(gpus)
        .cpu_milli(1000)
        .memory_gib(4)
}

fn first(su: &ScaleUp) -> (&str, &str, &str) {
    let o = &su.offerings[0];
    (
        o.instance_type.as_str(),
        o.zone.as_str(),
        o.capacity_type.as_str(),
    )
}

/// Checks what every plan must satisfy: no resource over-committed on any new or existing node,
/// every pod on a new node admitted by every offering of its fallback list, gangs whole and in
/// one zone, pool and cluster limits kept, every pending GPU pod accounted for exactly once.
fn check_invariants(s: &Snapshot, catalog: &Catalog, policy: &Policy, plan: &Plan) {
    let (templates, _) = build_templates(policy, catalog, s, NOW);
    let by_name: BTreeMap<String, &Pod> = s.pods.iter().map(|p| (p.id.to_string(), p)).collect();
    let mut seen = BTreeSet::new();
    let mut gang_zones: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut new_nodes: BTreeMap<&str, i64> = BTreeMap::new();
    let mut new_gpus: BTreeMap<&str, i64> = BTreeMap::new();
    for su in &plan.scale_ups {
        let (it, _, _) = first(su);
        let t = templates
            .iter()
            .find(|t| t.pool_name == su.pool && t.instance_type == it)
            .expect("scale-up of a known template");
        assert_eq!(su.pods_per_node.len(), su.count as usize);
        assert!(su.offerings.iter().all(|o| o.instance_type == it));
        let mut i = 0;
        for &n in &su.pods_per_node {
            let mut free = t.allocatable.clone();
            let mut shared = t.shared.clone();
            for name in &su.pods[i..i + n] {
                let p = by_name[name.as_str()];
                free.sub(&p.requests);
                if let Some(sh) = &p.share {
                    assert!(
                        place_share(&mut shared, sh).is_some(),
                        "{name}: share does not fit"
                    );
                }
                assert!(p.constraints.tolerates(&t.taints), "{name} on tainted {it}");
                for o in &su.offerings {
                    let labels = &t
                        .offerings
                        .iter()
                        .find(|x| x.key == o.key())
                        .expect("offering of the template")
                        .labels;
                    assert!(p.constraints.matches_node(labels, None), "{name} vs {o:?}");
                }
                if let Some(g) = &p.gang {
                    gang_zones
                        .entry(g.key.clone())
                        .or_default()
                        .extend(su.offerings.iter().map(|o| o.zone.clone()));
                }
                assert!(seen.insert(name.key.clone()), "{name} placed twice");
            }
            assert!(!free.has_negative(), "over-committed new {it}: {free:?}");
            // Devices claimed (exact counts) within the devices the node will publish.
            let claimed: u32 = su.pods[i..i + n]
                .iter()
                .flat_map(|name| by_name[name.as_str()].claims.iter())
                .filter(|c| c.needs_devices())
                .flat_map(|c| c.spec.requests.iter())
                .map(|r| match r.alternatives[0].count {
                    crate::model::dra::DeviceCount::Exact(k) => k,
                    crate::model::dra::DeviceCount::All => 1,
                })
                .sum();
            assert!(
                claimed == 0 || claimed as usize <= t.devices.len(),
                "{claimed} devices claimed on a new {it} publishing {}",
                t.devices.len()
            );
            i += n;
        }
        assert_eq!(i, su.pods.len());
        *new_nodes.entry(su.pool.as_str()).or_default() += su.count as i64;
        *new_gpus.entry(su.pool.as_str()).or_default() += su.count as i64 * t.gpus as i64;
    }
    // Existing nodes: bound pods plus placed pods within allocatable.
    let mut load: BTreeMap<&str, crate::model::Resources> = BTreeMap::new();
    for p in &s.pods {
        if let (true, Some(n)) = (p.is_bound_active(), &p.node_name) {
            load.entry(n.as_str()).or_default().add(&p.requests);
        }
    }
    for pl in &plan.existing_capacity {
        assert!(seen.insert(pl.pod.clone()), "{} placed twice", pl.pod);
        let p = by_name[&pl.pod];
        if let Some(node) = s.nodes.iter().find(|n| n.name == pl.target) {
            load.entry(node.name.as_str()).or_default().add(&p.requests);
            // A starting node's not-ready (and the like) taints go once it is Ready.
            assert!(p
                .constraints
                .admits(&node.labels, &node.lasting_taints(), Some(&node.name)));
            if let Some(g) = &p.gang {
                gang_zones
                    .entry(g.key.clone())
                    .or_default()
                    .insert(node.zone().unwrap_or("").to_string());
            }
        }
    }
    // Evicted pods land on nodes that stay.
    let removed: BTreeSet<&str> = plan.scale_downs.iter().map(|d| d.node.as_str()).collect();
    for d in &plan.scale_downs {
        for e in &d.evict {
            assert!(
                !removed.contains(e.to.as_str()),
                "{} evicted onto removed {}",
                e.pod,
                e.to
            );
            let p = by_name[&e.pod];
            let node = s.nodes.iter().find(|n| n.name == e.to).unwrap();
            assert!(p
                .constraints
                .admits(&node.labels, &node.taints, Some(&node.name)));
            load.entry(node.name.as_str()).or_default().add(&p.requests);
        }
    }
    for n in &s.nodes {
        if n.ready && n.advertised_gpus() > 0 {
            if let Some(l) = load.get(n.name.as_str()) {
                let mut free = n.allocatable.clone();
                free.sub(l);
                assert!(!free.has_negative(), "over-committed {}: {free:?}", n.name);
            }
        }
    }
    for u in &plan.unschedulable {
        assert!(
            seen.insert(u.pod.clone()),
            "{} both placed and unschedulable",
            u.pod
        );
        assert!(!u.reason.is_empty());
    }
    for p in &s.pods {
        if is_planned_pod(p) {
            assert!(
                seen.contains(&p.id.to_string()),
                "{} not accounted for",
                p.id
            );
        }
    }
    // Gangs: all or nothing, one zone.
    for (g, zones) in &gang_zones {
        assert_eq!(zones.len(), 1, "gang {g} spans zones {zones:?}");
        for p in s
            .pods
            .iter()
            .filter(|p| p.gang.as_ref().is_some_and(|x| &x.key == g))
        {
            if is_planned_pod(p) {
                assert!(
                    !plan.unschedulable.iter().any(|u| u.pod == p.id.to_string()),
                    "gang {g} split"
                );
            }
        }
    }
    // Limits.
    for pool in &policy.pools {
        let existing = s
            .nodes
            .iter()
            .filter(|n| n.pool() == Some(pool.name.as_str()))
            .count() as i64
            + s.in_flight
                .iter()
                .filter(|f| f.pool == pool.name)
                .map(|f| f.count as i64)
                .sum::<i64>();
        let added = new_nodes.get(pool.name.as_str()).copied().unwrap_or(0);
        if added > 0 {
            assert!(
                existing + added <= pool.max_nodes as i64,
                "pool {} over max",
                pool.name
            );
        }
        if let Some(mg) = pool.max_gpus {
            assert!(new_gpus.get(pool.name.as_str()).copied().unwrap_or(0) <= mg as i64);
        }
    }
    if let Some(mg) = policy.limits.max_gpus {
        assert!(new_gpus.values().sum::<i64>() <= mg as i64);
    }
}

#[test]
fn pending_pods_fit_free_capacity_first() {
    let node = NodeBuilder::new("n1")
        .pool("a10g", "g5.12xlarge", "us-east-1a")
        .cpu_milli(47_000)
        .memory_gib(180)
        .gpus(4)
        .build();
    let pods = vec![
        gpu_pod("running", 1).on("n1").build(),
        gpu_pod("p1", 1).build(),
        gpu_pod("p2", 2).build(),
    ];
    let plan = run(&snap(pods, vec![node]), POLICY);
    assert!(plan.scale_ups.is_empty(), "{plan:?}");
    assert_eq!(plan.existing_capacity.len(), 2);
    assert!(plan.existing_capacity.iter().all(|p| p.target == "n1"));
    assert_eq!(plan.added_cost_per_hour, 0.0);
}

#[test]
fn nodes_whose_gpus_are_not_advertised_yet_count_at_full_capacity() {
    // Registered, Ready, but the device plugin has not advertised GPUs: no second scale-up.
    let booting = NodeBuilder::new("booting")
        .pool("a10g", "g5.12xlarge", "us-east-1a")
        .cpu_milli(47_000)
        .memory_gib(180)
        .created(NOW - std::time::Duration::from_secs(120))
        .build();
    let pods = (0..4)
        .map(|i| gpu_pod(&format!("p{i}"), 1).build())
        .collect();
    let plan = run(&snap(pods, vec![booting.clone()]), POLICY);
    assert!(plan.scale_ups.is_empty(), "{plan:?}");
    assert_eq!(plan.existing_capacity.len(), 4);

    // Not Ready yet (still joining) counts as well.
    let mut joining = booting.clone();
    joining.ready = false;
    let pods: Vec<Pod> = (0..4)
        .map(|i| gpu_pod(&format!("p{i}"), 1).build())
        .collect();
    let plan = run(&snap(pods.clone(), vec![joining.clone()]), POLICY);
    assert!(plan.scale_ups.is_empty());

    // Its not-ready taint (which the node lifecycle controller keeps on it until it is Ready) is
    // no reason to launch again for pods that do not tolerate it; a lasting taint is.
    let mut tainted = joining.clone();
    tainted.taints.push(Taint {
        key: "node.kubernetes.io/not-ready".into(),
        value: String::new(),
        effect: Effect::NoSchedule,
    });
    let plan = run(&snap(pods.clone(), vec![tainted.clone()]), POLICY);
    assert!(plan.scale_ups.is_empty(), "{plan:?}");
    tainted.taints.push(Taint {
        key: "dedicated".into(),
        value: "team-a".into(),
        effect: Effect::NoSchedule,
    });
    let plan = run(&snap(pods.clone(), vec![tainted]), POLICY);
    assert_eq!(
        plan.scale_ups.iter().map(|s| s.pods.len()).sum::<usize>(),
        4
    );

    // ... but not once it is older than the max node provision time.
    joining.created = NOW - std::time::Duration::from_secs(20 * 60);
    let plan = run(&snap(pods, vec![joining]), POLICY);
    assert_eq!(
        plan.scale_ups.iter().map(|s| s.pods.len()).sum::<usize>(),
        4
    );
}

#[test]
fn a_node_just_ready_whose_not_ready_taint_is_still_on_takes_its_pods() {
    // Two nodes launched for two pods turned Ready; the node lifecycle controller has taken the
    // not-ready taint off the first and not yet off the second (a moment later it will). The
    // second node is no reason to launch a third.
    let node = |name: &str| {
        NodeBuilder::new(name)
            .pool("a10g", "g5.xlarge", "us-east-1b")
            .cpu_milli(3_920)
            .memory_gib(15)
            .gpus(1)
            .created(NOW - std::time::Duration::from_secs(70))
    };
    let nodes = vec![
        node("n0").build(),
        node("n1")
            .taint("node.kubernetes.io/not-ready", Effect::NoSchedule)
            .build(),
    ];
    let pods = vec![gpu_pod("p0", 1).build(), gpu_pod("p1", 1).build()];
    let plan = run(&snap(pods.clone(), nodes.clone()), POLICY);
    assert!(plan.scale_ups.is_empty(), "{plan:?}");
    assert_eq!(
        targets(&plan).values().copied().collect::<BTreeSet<_>>(),
        BTreeSet::from(["n0", "n1"])
    );

    // Once past the max node provision time, a taint it still carries is no passing state.
    let old: Vec<_> = nodes
        .into_iter()
        .map(|mut n| {
            n.created = NOW - std::time::Duration::from_secs(20 * 60);
            n
        })
        .collect();
    let plan = run(&snap(pods, old), POLICY);
    assert_eq!(
        plan.scale_ups.iter().map(|s| s.pods.len()).sum::<usize>(),
        1
    );
}

#[test]
fn launches_in_flight_absorb_pending_pods() {
    let mut s = snap(
        (0..3)
            .map(|i| gpu_pod(&format!("p{i}"), 1).build())
            .collect(),
        vec![],
    );
    s.in_flight.push(InFlight {
        launch_id: "l-1".into(),
        pool: "a10g".into(),
        offering: OfferingKey {
            instance_type: "g5.xlarge".into(),
            zone: "us-east-1a".into(),
            capacity_type: CapacityType::Spot,
        },
        count: 2,
        launched_at: NOW,
    });
    let plan = run(&s, POLICY);
    assert_eq!(plan.existing_capacity.len(), 2);
    assert!(plan
        .existing_capacity
        .iter()
        .all(|p| p.target == "launch/l-1"));
    assert_eq!(plan.scale_ups.len(), 1);
    assert_eq!(plan.scale_ups[0].count, 1);
}

#[test]
fn pods_go_back_to_the_in_flight_nodes_their_launch_was_for() {
    // A g5.2xlarge was launched for `wide` (6 vCPU) and, later, a g5.xlarge for `small`. Packed
    // again first-fit, `small` (the older pod) takes the g5.2xlarge and `wide` fits nothing in
    // flight: another launch. With the launches' plans, each goes back where it was planned.
    let small = gpu_pod("small", 1)
        .selector(labels::POOL, "a10g")
        .created(Time(NOW.0 - 60_000))
        .build();
    let wide = gpu_pod("wide", 1)
        .selector(labels::POOL, "a10g")
        .cpu_milli(6000)
        .created(Time(NOW.0 - 1_000))
        .build();
    let mut s = snap(vec![small, wide], vec![]);
    for (id, it, at) in [
        ("l-wide", "g5.2xlarge", 10_000),
        ("l-small", "g5.xlarge", 0),
    ] {
        s.in_flight.push(InFlight {
            launch_id: id.into(),
            pool: "a10g".into(),
            offering: OfferingKey {
                instance_type: it.into(),
                zone: "us-east-1a".into(),
                capacity_type: CapacityType::Spot,
            },
            count: 1,
            launched_at: Time(NOW.0 - at),
        });
    }
    let first_fit = run(&s, POLICY);
    assert_eq!(first_fit.scale_ups.len(), 1, "{first_fit:?}");
    s.planned.insert(
        "l-wide".into(),
        std::sync::Arc::new(vec![vec!["default/wide".to_string()]]),
    );
    s.planned.insert(
        "l-small".into(),
        std::sync::Arc::new(vec![vec!["default/small".to_string()]]),
    );
    let plan = run(&s, POLICY);
    assert!(plan.scale_ups.is_empty(), "{plan:?}");
    let targets: BTreeMap<&str, &str> = plan
        .existing_capacity
        .iter()
        .map(|p| (p.pod.as_str(), p.target.as_str()))
        .collect();
    assert_eq!(targets["default/wide"], "launch/l-wide");
    assert_eq!(targets["default/small"], "launch/l-small");
}

/// One A10G pool of 1- and 4-GPU nodes, spot, for the gang-and-single-pod tests.
const A10G: &str = r#"
zones: [us-east-1a, us-east-1b]
pools:
  - name: a10g
    instanceTypes: [g5.xlarge, g5.12xlarge]
    capacityTypes: [spot]
    maxNodes: 20
"#;

fn spot(instance_type: &str, zone: &str) -> OfferingKey {
    OfferingKey {
        instance_type: instance_type.into(),
        zone: zone.into(),
        capacity_type: CapacityType::Spot,
    }
}

#[test]
fn a_gang_launched_while_a_single_pod_waits_for_a_new_node_gets_one_node_more() {
    // The scheduler binds `serve` to the first node that has room for it; two times in three
    // that is one of the gang's, and the gang would wait for another launch and boot.
    let mut pods: Vec<Pod> = (0..2)
        .map(|i| gpu_pod(&format!("w{i}"), 4).gang("train", 2).build())
        .collect();
    pods.push(gpu_pod("serve", 1).build());
    let plan = run(&snap(pods.clone(), vec![]), A10G);
    let gang = plan
        .scale_ups
        .iter()
        .find(|s| s.gang.is_some())
        .expect("a launch for the gang");
    assert_eq!(first(gang).0, "g5.12xlarge");
    assert_eq!(gang.count, 3, "{plan:?}");
    assert_eq!(gang.pods_per_node, vec![1, 1, 0]);
    let single = plan.scale_ups.iter().find(|s| s.gang.is_none()).unwrap();
    assert_eq!((first(single).0, single.count), ("g5.xlarge", 1));

    // Alone, the gang gets what it needs and no more.
    let plan = run(&snap(pods[..2].to_vec(), vec![]), A10G);
    assert_eq!(plan.scale_ups.len(), 1);
    assert_eq!(plan.scale_ups[0].count, 2);
}

/// A gang's launch of two g5.12xlarge: one has registered (`g1`, its GPUs not advertised yet),
/// the other is still booting; `serve`'s g5.xlarge is still booting too.
fn gang_and_serve_with_one_gang_node_registered() -> Snapshot {
    let mut pods: Vec<Pod> = (0..2)
        .map(|i| gpu_pod(&format!("w{i}"), 4).gang("train", 2).build())
        .collect();
    pods.push(gpu_pod("serve", 1).build());
    let registered = NodeBuilder::new("g1")
        .pool("a10g", "g5.12xlarge", "us-east-1b")
        .label(labels::LAUNCH_ID, "l-gang")
        .cpu_milli(47_000)
        .memory_gib(180)
        .created(Time(NOW.0 - 100_000))
        .build();
    let mut s = snap(pods, vec![registered]);
    for (id, it, count) in [("l-gang", "g5.12xlarge", 1), ("l-serve", "g5.xlarge", 1)] {
        s.in_flight.push(InFlight {
            launch_id: id.into(),
            pool: "a10g".into(),
            offering: spot(it, "us-east-1b"),
            count,
            launched_at: Time(NOW.0 - 100_000),
        });
    }
    s.planned.insert(
        "l-gang".into(),
        std::sync::Arc::new(vec![
            vec!["default/w0".to_string()],
            vec!["default/w1".to_string()],
        ]),
    );
    s.planned.insert(
        "l-serve".into(),
        std::sync::Arc::new(vec![vec!["default/serve".to_string()]]),
    );
    s
}

fn targets(plan: &Plan) -> BTreeMap<&str, &str> {
    plan.existing_capacity
        .iter()
        .map(|p| (p.pod.as_str(), p.target.as_str()))
        .collect()
}

#[test]
fn a_single_pod_is_expected_on_the_first_registered_node_of_a_gangs_launch() {
    // `serve` will be bound to the registered node as soon as it advertises its GPUs, so the
    // gang needs another node now.
    let plan = run(&gang_and_serve_with_one_gang_node_registered(), A10G);
    assert_eq!(targets(&plan)["default/serve"], "g1", "{plan:?}");
    assert_eq!(plan.scale_ups.len(), 1, "{plan:?}");
    let su = &plan.scale_ups[0];
    assert_eq!(su.gang.as_deref(), Some("default/train"));
    assert_eq!(
        (first(su).0, first(su).1, su.count),
        ("g5.12xlarge", "us-east-1b", 1)
    );
}

#[test]
fn a_pod_nominated_to_a_registered_node_keeps_it_from_single_pods() {
    // The same, with the gang's first member nominated to the registered node: the scheduler
    // tries it there first and keeps its room from `serve`, which waits for its own node.
    let mut s = gang_and_serve_with_one_gang_node_registered();
    s.pods[0].nominated_node = Some("g1".into());
    let plan = run(&s, A10G);
    let t = targets(&plan);
    assert_eq!(t["default/w0"], "g1", "{plan:?}");
    assert_eq!(t["default/w1"], "launch/l-gang", "{plan:?}");
    assert_eq!(t["default/serve"], "launch/l-serve", "{plan:?}");
    assert!(plan.scale_ups.is_empty(), "{plan:?}");
    // A nomination to a node in another zone than the gang's does not split the gang.
    let mut s = gang_and_serve_with_one_gang_node_registered();
    let other = NodeBuilder::new("g2")
        .pool("a10g", "g5.12xlarge", "us-east-1a")
        .cpu_milli(47_000)
        .memory_gib(180)
        .created(Time(NOW.0 - 100_000))
        .build();
    s.nodes.push(other);
    s.pods[0].nominated_node = Some("g2".into());
    s.pods[1].nominated_node = Some("g1".into());
    let plan = run(&s, A10G);
    let t = targets(&plan);
    let (on_g2, on_g1) = (
        t.get("default/w0") == Some(&"g2"),
        t.get("default/w1") == Some(&"g1"),
    );
    assert!(on_g2 != on_g1, "one nomination is kept, not both: {plan:?}");
}

#[test]
fn chooses_the_cheapest_mix_of_sizes() {
    // Eight 1-GPU pods: eight g5.xlarge spot ($0.40 each) beat one g5.48xlarge ($6.52).
    let a10g = |p: PodBuilder| p.selector(labels::POOL, "a10g").build();
    let pods = (0..8).map(|i| a10g(gpu_pod(&format!("p{i}"), 1))).collect();
    let plan = run(&snap(pods, vec![]), POLICY);
    assert_eq!(plan.scale_ups.len(), 1);
    assert_eq!(
        first(&plan.scale_ups[0]),
        ("g5.xlarge", "us-east-1a", "spot")
    );
    assert_eq!(plan.scale_ups[0].count, 8);
    assert!((plan.added_cost_per_hour - 8.0 * 1.006 * 0.4).abs() < 1e-9);

    // Four 2-GPU pods need multi-GPU nodes: two g5.12xlarge ($2.27) beat one g5.48xlarge ($6.52).
    let pods = (0..4).map(|i| a10g(gpu_pod(&format!("q{i}"), 2))).collect();
    let plan = run(&snap(pods, vec![]), POLICY);
    assert_eq!(first(&plan.scale_ups[0]).0, "g5.12xlarge");
    assert_eq!(plan.scale_ups[0].count, 2);

    // A CPU-heavy GPU pod does not fit g5.xlarge (4 vCPU): the next size up.
    let pods = vec![a10g(gpu_pod("heavy", 1).cpu_milli(6000).memory_gib(24))];
    let plan = run(&snap(pods, vec![]), POLICY);
    assert_eq!(first(&plan.scale_ups[0]).0, "g5.2xlarge");
}

#[test]
fn fallback_list_is_spot_across_zones_then_on_demand() {
    let plan = run(&snap(vec![gpu_pod("p", 1).build()], vec![]), POLICY);
    let order: Vec<(String, String)> = plan.scale_ups[0]
        .offerings
        .iter()
        .map(|o| (o.zone.clone(), o.capacity_type.as_str().to_string()))
        .collect();
    let want = [
        ("us-east-1a", "spot"),
        ("us-east-1b", "spot"),
        ("us-east-1a", "on-demand"),
        ("us-east-1b", "on-demand"),
    ];
    assert_eq!(
        order,
        want.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect::<Vec<_>>()
    );
}

#[test]
fn selectors_narrow_the_offerings() {
    let pods = vec![
        gpu_pod("od", 1)
            .selector(labels::CAPACITY_TYPE, "on-demand")
            .build(),
        gpu_pod("zone-b", 1)
            .affinity(labels::ZONE, Operator::In, &["us-east-1b"])
            .build(),
        gpu_pod("l4", 1)
            .selector(labels::NVIDIA_PRODUCT, "NVIDIA-L4")
            .build(),
    ];
    let plan = run(&snap(pods, vec![]), POLICY);
    let su = |pod: &str| {
        plan.scale_ups
            .iter()
            .find(|s| s.pods.iter().any(|p| p.as_str().ends_with(pod)))
            .unwrap()
    };
    assert!(su("/od")
        .offerings
        .iter()
        .all(|o| o.capacity_type == CapacityType::OnDemand));
    assert!(su("/zone-b")
        .offerings
        .iter()
        .all(|o| o.zone == "us-east-1b"));
    assert_eq!(su("/l4").pool, "l4");
    assert_eq!(first(su("/l4")).0, "g6.xlarge");
}

#[test]
fn taints_must_be_tolerated() {
    // The A100 pool is tainted; an A100 pod without the toleration cannot go there.
    let pods = vec![
        gpu_pod("no-tol", 8)
            .selector(labels::GPU_MODEL, "A100")
            .build(),
        gpu_pod("tol", 8)
            .selector(labels::GPU_MODEL, "A100")
            .tolerate("nvidia.com/gpu")
            .build(),
    ];
    let plan = run(&snap(pods, vec![]), POLICY);
    assert_eq!(plan.scale_ups.len(), 1);
    assert_eq!(plan.scale_ups[0].pool, "a100");
    assert_eq!(plan.unschedulable.len(), 1);
    assert!(
        plan.unschedulable[0]
            .reason
            .contains("tainted nvidia.com/gpu=true:NoSchedule"),
        "{}",
        plan.unschedulable[0].reason
    );
}

#[test]
fn mig_slices_go_to_the_mig_pool() {
    let pods = (0..10)
        .map(|i| {
            PodBuilder::new("nb", &format!("m{i}"))
                .mig("1g.5gb", 1)
                .build()
        })
        .collect();
    let plan = run(&snap(pods, vec![]), POLICY);
    assert_eq!(plan.scale_ups.len(), 1);
    assert_eq!(plan.scale_ups[0].pool, "mig");
    assert_eq!(plan.scale_ups[0].count, 1); // 56 slices on one p4d
    let pods = vec![PodBuilder::new("nb", "big").mig("3g.20gb", 1).build()];
    let plan = run(&snap(pods, vec![]), POLICY);
    assert!(plan.scale_ups.is_empty());
    assert!(
        plan.unschedulable[0]
            .reason
            .contains("no matching pool offers nvidia.com/mig-3g.20gb"),
        "{}",
        plan.unschedulable[0].reason
    );
}

#[test]
fn shared_gpu_pods_fit_on_one_physical_gpu() {
    // 8 GiB shares on 15 GiB T4s: one per GPU. Three single-T4 nodes ($0.21 each) beat one
    // g4dn.12xlarge with four T4s ($1.56).
    let pods: Vec<Pod> = (0..3)
        .map(|i| {
            PodBuilder::new("inf", &format!("s{i}"))
                .share(8, 20)
                .selector("gpu-sharing", "true")
                .build()
        })
        .collect();
    let plan = run(&snap(pods, vec![]), POLICY);
    assert_eq!(plan.scale_ups.len(), 1);
    assert_eq!(first(&plan.scale_ups[0]).0, "g4dn.xlarge");
    assert_eq!(plan.scale_ups[0].count, 3);
    // 5 GiB shares: three per GPU.
    let pods: Vec<Pod> = (0..3)
        .map(|i| {
            PodBuilder::new("inf", &format!("t{i}"))
                .share(5, 30)
                .selector("gpu-sharing", "true")
                .build()
        })
        .collect();
    let plan = run(&snap(pods, vec![]), POLICY);
    assert_eq!(plan.scale_ups[0].count, 1);
    // A share larger than one GPU never fits, whatever the node's total.
    let pods = vec![PodBuilder::new("inf", "huge").share(20, 50).build()];
    let plan = run(&snap(pods, vec![]), POLICY);
    assert!(plan.scale_ups.is_empty());
    assert!(plan.unschedulable[0].reason.contains("on one node"));
}

#[test]
fn existing_shared_gpu_nodes_respect_per_gpu_room() {
    let node = NodeBuilder::new("t4")
        .pool("t4-shared", "g4dn.12xlarge", "us-east-1a")
        .label("gpu-sharing", "true")
        .cpu_milli(47_000)
        .memory_gib(180)
        .shared(4, 15)
        .build();
    // Four 10 GiB shares already there, one per GPU: a fifth 10 GiB share needs a new node even
    // though 20 GiB are free in total.
    let mut pods: Vec<Pod> = (0..4)
        .map(|i| {
            PodBuilder::new("inf", &format!("r{i}"))
                .share(10, 10)
                .on("t4")
                .build()
        })
        .collect();
    pods.push(
        PodBuilder::new("inf", "new")
            .share(10, 10)
            .selector("gpu-sharing", "true")
            .build(),
    );
    pods.push(
        PodBuilder::new("inf", "small")
            .share(5, 10)
            .selector("gpu-sharing", "true")
            .build(),
    );
    let plan = run(&snap(pods, vec![node]), POLICY);
    assert_eq!(plan.existing_capacity.len(), 1);
    assert_eq!(plan.existing_capacity[0].pod, "inf/small");
    assert_eq!(plan.scale_ups.len(), 1);
    assert_eq!(plan.scale_ups[0].pods, vec!["inf/new"]);
}

#[test]
fn gangs_get_everything_in_one_zone_or_nothing() {
    // Three 8-GPU workers: three p4d.24xlarge in one zone.
    let pods: Vec<Pod> = (0..3)
        .map(|i| {
            gpu_pod(&format!("w{i}"), 8)
                .selector(labels::GPU_MODEL, "A100")
                .tolerate("nvidia.com/gpu")
                .gang("bert", 3)
                .build()
        })
        .collect();
    let plan = run(&snap(pods.clone(), vec![]), POLICY);
    assert_eq!(plan.scale_ups.len(), 1);
    assert_eq!(plan.scale_ups[0].count, 3);
    assert_eq!(plan.scale_ups[0].gang.as_deref(), Some("default/bert"));
    let zones: BTreeSet<&str> = plan.scale_ups[0]
        .offerings
        .iter()
        .map(|o| o.zone.as_str())
        .collect();
    assert_eq!(zones.len(), 1);

    // The pool allows only 2 more nodes: nothing is launched, every member says why.
    let tight = POLICY.replace("maxNodes: 10", "maxNodes: 2");
    let plan = run(&snap(pods.clone(), vec![]), &tight);
    assert!(plan.scale_ups.is_empty(), "{plan:?}");
    assert_eq!(plan.unschedulable.len(), 3);
    assert!(plan.unschedulable[0].reason.contains("gang default/bert"));

    // min-member 4 with 3 members: wait for the fourth.
    let pods: Vec<Pod> = (0..3)
        .map(|i| {
            gpu_pod(&format!("w{i}"), 8)
                .tolerate("nvidia.com/gpu")
                .gang("big", 4)
                .build()
        })
        .collect();
    let plan = run(&snap(pods, vec![]), POLICY);
    assert!(plan.scale_ups.is_empty());
    assert!(plan.unschedulable[0]
        .reason
        .contains("incomplete: 3 of its 4"));
}

#[test]
fn gang_uses_existing_capacity_in_its_zone_and_new_nodes_in_the_same_zone() {
    // A free 4-GPU node in us-east-1b: the gang of 2 × 4 GPUs takes it and one new node there.
    let node = NodeBuilder::new("b1")
        .pool("a10g", "g5.12xlarge", "us-east-1b")
        .cpu_milli(47_000)
        .memory_gib(180)
        .gpus(4)
        .build();
    let pods: Vec<Pod> = (0..2)
        .map(|i| gpu_pod(&format!("w{i}"), 4).gang("job", 2).build())
        .collect();
    let plan = run(&snap(pods, vec![node]), POLICY);
    assert_eq!(plan.existing_capacity.len(), 1);
    assert_eq!(plan.scale_ups.len(), 1);
    assert!(plan.scale_ups[0]
        .offerings
        .iter()
        .all(|o| o.zone == "us-east-1b"));
}

#[test]
fn a_gang_tries_spot_in_the_next_zone_before_on_demand_in_its_own() {
    // A scale-up's whole fallback list failed: its offerings are short for a while.
    let short = |s: &mut Snapshot, su: &ScaleUp| {
        for o in &su.offerings {
            let key = OfferingKey {
                instance_type: o.instance_type.clone(),
                zone: o.zone.clone(),
                capacity_type: o.capacity_type,
            };
            s.unavailable
                .insert(key, NOW + std::time::Duration::from_secs(180));
        }
    };
    // Two 4-GPU workers, spot in both zones: the launch's fallback list stays in its zone and
    // on spot (on-demand here costs more than moving the gang to the other zone's spot).
    let pods: Vec<Pod> = (0..2)
        .map(|i| {
            gpu_pod(&format!("w{i}"), 4)
                .selector(labels::INSTANCE_TYPE, "g5.12xlarge")
                .gang("job", 2)
                .build()
        })
        .collect();
    let mut s = snap(pods, vec![]);
    let plan = run(&s, POLICY);
    assert_eq!(plan.scale_ups.len(), 1, "{plan:?}");
    let su = &plan.scale_ups[0];
    let (_, zone, ct) = first(su);
    assert_eq!(ct, "spot");
    let zone = zone.to_string();
    assert!(
        su.offerings
            .iter()
            .all(|o| o.zone == zone && o.capacity_type == CapacityType::Spot),
        "{:?}",
        su.offerings
    );
    // Spot short there (the launch failed over its list): the gang goes to the other zone's
    // spot, whole.
    short(&mut s, su);
    let plan = run(&s, POLICY);
    let su = &plan.scale_ups[0];
    let (_, other, ct) = first(su);
    eprintln!("{su:?}");
    assert_eq!((ct, su.count), ("spot", 2), "{su:?}");
    assert_ne!(other, zone);
    // Spot short everywhere: on-demand, with the whole list of the cheapest zone.
    short(&mut s, su);
    let plan = run(&s, POLICY);
    assert_eq!(first(&plan.scale_ups[0]).2, "on-demand", "{plan:?}");
}

#[test]
fn pool_and_cluster_limits_are_never_exceeded() {
    let text = POLICY.replace("maxNodes: 100\n  - name: l4", "maxNodes: 3\n  - name: l4");
    let pods = (0..6)
        .map(|i| {
            gpu_pod(&format!("p{i}"), 1)
                .selector(labels::POOL, "a10g")
                .build()
        })
        .collect();
    let plan = run(&snap(pods, vec![]), &text);
    assert_eq!(plan.scale_ups[0].count, 3);
    assert_eq!(plan.unschedulable.len(), 3);
    assert!(plan.unschedulable[0]
        .reason
        .contains("limits reached: pool a10g (max 3 nodes)"));

    let text = format!("limits: {{maxGpus: 5}}\n{POLICY}");
    let pods = (0..8)
        .map(|i| gpu_pod(&format!("p{i}"), 1).build())
        .collect();
    let plan = run(&snap(pods, vec![]), &text);
    assert_eq!(plan.scale_ups.iter().map(|s| s.count).sum::<u32>(), 5);
    assert!(plan.unschedulable[0].reason.contains("cluster limits"));
}

#[test]
fn overrun_a_node_reporting_i64_max_gpus_fills_the_gpu_limits_instead_of_wrapping_them() {
    // Both cordoned (no room to place on, only counted). Of a type no pool has, a node counts
    // with the GPUs it reports; of a pool's type, with its template's (4 for a g5.12xlarge).
    let cordoned = |name: &str, instance_type: &str, gpus: i64| {
        let node = NodeBuilder::new(name).pool("a10g", instance_type, "us-east-1a");
        node.gpus(gpus).cordoned().build()
    };
    let absurd = cordoned("absurd", "x9.metal", i64::MAX);
    let other = cordoned("n1", "g5.12xlarge", 4);
    let snapshot = snap(
        vec![gpu_pod("p", 1).selector(labels::POOL, "a10g").build()],
        vec![absurd, other],
    );
    // The cluster's maxGpus, then the pool's: both already reached, no launch.
    let pool_limit = POLICY.replace(
        "maxNodes: 100\n  - name: l4",
        "maxNodes: 100\n    maxGpus: 64\n  - name: l4",
    );
    for text in [format!("limits: {{maxGpus: 64}}\n{POLICY}"), pool_limit] {
        let plan = run(&snapshot, &text);
        assert!(plan.scale_ups.is_empty(), "{plan:?}");
        assert_eq!(plan.unschedulable.len(), 1, "{plan:?}");
        assert!(
            plan.unschedulable[0].reason.contains("limits"),
            "{:?}",
            plan.unschedulable[0]
        );
    }
    // Without a GPU limit, only maxNodes counts: the pod gets its node.
    let plan = run(&snapshot, POLICY);
    assert_eq!(plan.scale_ups.len(), 1, "{plan:?}");
}

#[test]
fn higher_priority_pools_are_used_first() {
    // l4 is cheaper per GPU than a10g for 1-GPU pods (spot $0.32 vs $0.40); with a10g at
    // priority 10 the pods go there anyway, until it is full.
    let text = POLICY.replace(
        "maxNodes: 100\n  - name: l4",
        "maxNodes: 2\n    priority: 10\n  - name: l4",
    );
    let pods = (0..3)
        .map(|i| gpu_pod(&format!("p{i}"), 1).build())
        .collect();
    let plan = run(&snap(pods, vec![]), &text);
    let by_pool: BTreeMap<&str, u32> = plan
        .scale_ups
        .iter()
        .map(|s| (s.pool.as_str(), s.count))
        .collect();
    assert_eq!(by_pool.get("a10g"), Some(&2));
    assert_eq!(by_pool.get("l4"), Some(&1));
}

#[test]
fn unavailable_offerings_are_skipped_and_reported() {
    let mut s = snap(
        vec![gpu_pod("p", 1).selector(labels::POOL, "l4").build()],
        vec![],
    );
    let key = |z: &str, ct| OfferingKey {
        instance_type: "g6.xlarge".into(),
        zone: z.into(),
        capacity_type: ct,
    };
    s.unavailable.insert(
        key("us-east-1a", CapacityType::Spot),
        NOW + std::time::Duration::from_secs(60),
    );
    // Expired entries do not count.
    s.unavailable.insert(
        key("us-east-1b", CapacityType::Spot),
        NOW - std::time::Duration::from_secs(1),
    );
    let plan = run(&s, POLICY);
    let su = &plan.scale_ups[0];
    assert_eq!(first(su), ("g6.xlarge", "us-east-1b", "spot"));
    assert!(!su
        .offerings
        .iter()
        .any(|o| o.zone == "us-east-1a" && o.capacity_type == CapacityType::Spot));

    // Every offering of the only matching pool unavailable: a clear reason.
    let mut s = snap(
        vec![gpu_pod("p", 8)
            .selector(labels::POOL, "a100")
            .tolerate_all()
            .build()],
        vec![],
    );
    for z in ["us-east-1a", "us-east-1b"] {
        s.unavailable.insert(
            OfferingKey {
                instance_type: "p4d.24xlarge".into(),
                zone: z.into(),
                capacity_type: CapacityType::OnDemand,
            },
            NOW + std::time::Duration::from_secs(60),
        );
    }
    let plan = run(&s, POLICY);
    assert!(plan.scale_ups.is_empty());
    assert!(plan.unschedulable[0]
        .reason
        .contains("currently unavailable (insufficient capacity)"));
}

#[test]
fn a_pod_waits_for_spot_up_to_the_pools_spot_max_wait_then_gets_on_demand() {
    let text = POLICY.replacen(
        "    capacityTypes: [spot, on-demand]\n    maxNodes: 100\n  - name: l4",
        "    capacityTypes: [spot, on-demand]\n    maxNodes: 100\n    spotMaxWait: 10m\n  - name: l4",
        1,
    );
    assert_ne!(text, POLICY);
    let mins = |m: u64| std::time::Duration::from_secs(60 * m);
    let pod = |name: &str, age: u64| {
        gpu_pod(name, 1)
            .selector(labels::POOL, "a10g")
            .created(NOW - mins(age))
            .build()
    };
    // Spot available: a young pod's scale-up lists spot offerings only.
    let plan = run(&snap(vec![pod("young", 2)], vec![]), &text);
    let su = &plan.scale_ups[0];
    assert!(su
        .offerings
        .iter()
        .all(|o| o.capacity_type == CapacityType::Spot));
    assert_eq!(plan.spot_wait_until, Some(NOW + mins(8)));
    // Spot short everywhere: the young pod waits with a reason, the one pending for 11 minutes
    // gets on-demand.
    let mut s = snap(vec![pod("young", 2), pod("old", 11)], vec![]);
    for it in [
        "g5.xlarge",
        "g5.2xlarge",
        "g5.4xlarge",
        "g5.12xlarge",
        "g5.48xlarge",
    ] {
        for z in ["us-east-1a", "us-east-1b"] {
            s.unavailable.insert(
                OfferingKey {
                    instance_type: it.into(),
                    zone: z.into(),
                    capacity_type: CapacityType::Spot,
                },
                NOW + mins(5),
            );
        }
    }
    let plan = run(&s, &text);
    assert_eq!(plan.scale_ups.len(), 1, "{plan:?}");
    assert_eq!(plan.scale_ups[0].pods[0].key, "default/old");
    assert!(plan.scale_ups[0]
        .offerings
        .iter()
        .all(|o| o.capacity_type == CapacityType::OnDemand));
    let u = &plan.unschedulable[0];
    assert_eq!(u.pod, "default/young");
    assert!(
        u.reason.contains("waiting for spot (spotMaxWait)"),
        "{}",
        u.reason
    );
    assert!(!u.permanent);
    // Without spotMaxWait both get on-demand at once.
    assert_eq!(run(&s, POLICY).scale_ups[0].count, 2);
}

#[test]
fn daemonsets_reduce_what_a_new_node_offers() {
    // A DaemonSet taking 3 CPUs on every node: a 1-CPU GPU pod no longer fits g5.xlarge
    // (4 vCPU less 200m reserved less 3 CPUs).
    let ds = PodBuilder::new("kube-system", "dcgm-abc")
        .daemonset("dcgm")
        .cpu_milli(3000)
        .tolerate_all()
        .on("other")
        .build();
    let plan = run(&snap(vec![ds, gpu_pod("p", 1).build()], vec![]), POLICY);
    assert_eq!(first(&plan.scale_ups[0]).0, "g5.2xlarge");
    // A DaemonSet selecting other nodes does not count.
    let ds = PodBuilder::new("kube-system", "cpu-only-abc")
        .daemonset("cpu-only")
        .cpu_milli(3000)
        .selector("kind", "cpu")
        .on("other")
        .build();
    let plan = run(&snap(vec![ds, gpu_pod("p", 1).build()], vec![]), POLICY);
    assert_eq!(first(&plan.scale_ups[0]).0, "g6.xlarge");
}

#[test]
fn every_pod_the_plan_cannot_help_has_a_reason() {
    let pods = vec![
        gpu_pod("sixteen", 16).tolerate_all().build(),
        gpu_pod("h100", 1)
            .selector(labels::NVIDIA_PRODUCT, "NVIDIA-H100-80GB-HBM3")
            .build(),
        gpu_pod("amd", 0).amd_gpus(1).build(),
        gpu_pod("bad", 1)
            .problem("spec.containers[0].resources.requests.cpu: malformed")
            .build(),
    ];
    let plan = run(&snap(pods, vec![]), POLICY);
    let reason = |p: &str| {
        plan.unschedulable
            .iter()
            .find(|u| u.pod == format!("default/{p}"))
            .map(|u| u.reason.clone())
            .unwrap()
    };
    assert!(reason("sixteen").contains("no matching instance type can fit"));
    assert!(reason("h100").contains("no pool offers nodes matching"));
    assert!(reason("amd").contains("amd.com/gpu"));
    assert!(reason("bad").starts_with("invalid pod spec: spec.containers[0]"));
    assert!(plan.scale_ups.is_empty());
}

#[test]
fn non_gpu_and_bound_pods_are_not_planned() {
    let pods = vec![
        PodBuilder::new("default", "cpu-only").build(),
        gpu_pod("ds", 1).daemonset("x").build(),
    ];
    let plan = run(&snap(pods, vec![]), POLICY);
    assert_eq!(plan, Plan::default());
}

#[test]
fn policy_pointing_at_unknown_types_is_a_warning_and_other_pools_still_plan() {
    let text = POLICY.replace("[g6.xlarge, g6.12xlarge]", "[g6.xlarge, g9.huge]");
    let plan = run(&snap(vec![gpu_pod("p", 1).build()], vec![]), &text);
    assert_eq!(
        plan.warnings,
        vec!["pool l4: instance type \"g9.huge\" is not in the catalog"]
    );
    assert_eq!(plan.scale_ups.len(), 1);
}

fn arb_pod(i: usize) -> impl Strategy<Value = Pod> {
    let shapes = prop_oneof![
        Just((1, 1000, 4)),
        Just((1, 3000, 12)),
        Just((2, 4000, 16)),
        Just((4, 8000, 64)),
        Just((8, 16000, 128)),
        Just((1, 12000, 48)),
    ];
    (shapes, 0..10u8).prop_map(move |((g, cpu, mem), sel)| {
        let mut b = PodBuilder::new("gen", &format!("p{i:04}"))
            .gpus(g)
            .cpu_milli(cpu)
            .memory_gib(mem);
        // ~30 % constrained to a GPU model or a zone.
        b = match sel {
            0 => b.selector(labels::GPU_MODEL, "L4"),
            1 => b.selector(labels::GPU_MODEL, "A10G"),
            2 => b.affinity(labels::ZONE, Operator::In, &["us-east-1b"]),
            _ => b,
        };
        b.build()
    })
}

fn arb_snapshot() -> impl Strategy<Value = Snapshot> {
    (1usize..60)
        .prop_flat_map(|n| (0..n).map(arb_pod).collect::<Vec<_>>())
        .prop_flat_map(|pods| {
            let n = pods.len();
            (
                Just(pods),
                proptest::collection::vec(0..6usize, n),
                0..3usize,
            )
        })
        .prop_map(|(mut pods, gang_of, nodes)| {
            // Some pods form gangs (those drawn 0 or 1 join gang g0/g1 with their size).
            let mut sizes = [0u32; 2];
            for (p, g) in pods.iter().zip(&gang_of) {
                if *g < 2 && p.requests.gpu <= 4 {
                    sizes[*g] += 1;
                }
            }
            for (p, g) in pods.iter_mut().zip(&gang_of) {
                if *g < 2 && p.requests.gpu <= 4 {
                    p.gang = Some(crate::model::GangRef {
                        key: format!("gen/g{g}"),
                        min_member: Some(sizes[*g]),
                    });
                }
            }
            let nodes = (0..nodes)
                .map(|i| {
                    NodeBuilder::new(&format!("n{i}"))
                        .pool("a10g", "g5.12xlarge", ["us-east-1a", "us-east-1b"][i % 2])
                        .cpu_milli(47_000)
                        .memory_gib(180)
                        .gpus(4)
                        .build()
                })
                .collect();
            snap(pods, nodes)
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn plans_keep_every_invariant_and_are_deterministic(s in arb_snapshot(), limit in 5u32..60) {
        let text = format!("limits: {{maxGpus: {limit}}}\n{POLICY}");
        let a = run(&s, &text);
        let mut shuffled = s.clone();
        shuffled.pods.reverse();
        let b = run(&shuffled, &text);
        prop_assert_eq!(a.scale_ups.len(), b.scale_ups.len());
        prop_assert_eq!(a.clone(), run(&s, &text));
        let pods_a: BTreeSet<_> = a.scale_ups.iter().flat_map(|s| s.pods.clone()).collect();
        let pods_b: BTreeSet<_> = b.scale_ups.iter().flat_map(|s| s.pods.clone()).collect();
        prop_assert_eq!(pods_a, pods_b);
        prop_assert!((a.added_cost_per_hour - b.added_cost_per_hour).abs() < 1e-6);
    }

    #[test]
    fn packing_stays_within_ten_percent_of_the_lower_bound(
        pods in (60usize..250).prop_flat_map(|n| (0..n).map(arb_pod).collect::<Vec<_>>())
    ) {
        let s = snap(pods, vec![]);
        let p = policy(&POLICY.replace("maxNodes: 100", "maxNodes: 1000"));
        let c = catalog_for(&p);
        let plan = plan(&s, &c, &p, NOW);
        // Pods no offering can host (an 8-GPU pod selecting L4) are left out of both sides.
        let (templates, _) = build_templates(&p, &c, &s, NOW);
        let planned: BTreeSet<&str> = plan
            .scale_ups
            .iter()
            .flat_map(|u| &u.pods)
            .map(|p| p.as_str())
            .collect();
        for u in &plan.unschedulable {
            prop_assert!(u.reason.starts_with("no pool can ever host it"), "{}", u.reason);
        }
        let refs: Vec<&Pod> = s.pods.iter().filter(|p| planned.contains(p.id.to_string().as_str())).collect();
        let lb = bound::lower_bound(&refs, &templates);
        prop_assert!(lb > 0.0);
        // A bound: no packing costs less (the plan's is one).
        prop_assert!(
            lb <= plan.added_cost_per_hour * (1.0 + 1e-9),
            "lower bound {} above the plan's cost {}", lb, plan.added_cost_per_hour
        );
        prop_assert!(
            plan.added_cost_per_hour <= 1.10 * lb,
            "cost {} vs lower bound {} ({:.3}x)", plan.added_cost_per_hour, lb, plan.added_cost_per_hour / lb
        );
    }
}

#[test]
fn lower_bound_is_exact_for_perfectly_packable_demand() {
    let p = policy(POLICY);
    let c = catalog_for(&p);
    let pods: Vec<Pod> = (0..8)
        .map(|i| gpu_pod(&format!("p{i}"), 1).build())
        .collect();
    let s = snap(pods, vec![]);
    let (templates, _) = build_templates(&p, &c, &s, NOW);
    let refs: Vec<&Pod> = s.pods.iter().collect();
    let lb = bound::lower_bound(&refs, &templates);
    // Cheapest per GPU: g6.xlarge spot at 0.4 × 0.8048.
    assert!((lb - 8.0 * 0.4 * 0.8048).abs() < 1e-6, "{lb}");
}

#[test]
fn the_lower_bound_knows_two_pods_of_three_gpus_never_share_a_four_gpu_node() {
    let p = policy(
        "zones: [us-east-1a]\npools:\n  - {name: a, instanceTypes: [g5.12xlarge], capacityTypes: [on-demand], maxNodes: 9}\n",
    );
    let c = catalog_for(&p);
    let pods: Vec<Pod> = (0..2)
        .map(|i| gpu_pod(&format!("p{i}"), 3).build())
        .collect();
    let s = snap(pods, vec![]);
    let (templates, _) = build_templates(&p, &c, &s, NOW);
    let price = templates[0].offerings[0].price;
    let refs: Vec<&Pod> = s.pods.iter().collect();
    // Fractionally 1.5 nodes; the half-node cut makes it 2.
    let lb = bound::lower_bound(&refs, &templates);
    assert!((lb - 2.0 * price).abs() < 1e-6, "{lb} vs {price}");
    // And one such pod needs a whole node, not three quarters of one.
    let lb = bound::lower_bound(&refs[..1], &templates);
    assert!((lb - price).abs() < 1e-6, "{lb} vs {price}");
}

#[test]
fn the_lower_bound_adds_demands_that_need_different_node_types() {
    // 4 one-GPU pods only the L4 pool can host, 4 only the A10G pool: the bound is the sum of
    // both pools' cheapest nodes for them, not the larger of the two.
    let p = policy(
        "zones: [us-east-1a]\npools:\n  - {name: a, instanceTypes: [g5.12xlarge], capacityTypes: [on-demand], maxNodes: 9, labels: {pool: a}}\n  - {name: l, instanceTypes: [g6.12xlarge], capacityTypes: [on-demand], maxNodes: 9, labels: {pool: l}}\n",
    );
    let c = catalog_for(&p);
    let pods: Vec<Pod> = (0..8)
        .map(|i| {
            gpu_pod(&format!("p{i}"), 1)
                .selector("pool", if i < 4 { "a" } else { "l" })
                .build()
        })
        .collect();
    let s = snap(pods, vec![]);
    let (templates, _) = build_templates(&p, &c, &s, NOW);
    let both: f64 = templates.iter().map(|t| t.offerings[0].price).sum();
    let refs: Vec<&Pod> = s.pods.iter().collect();
    let lb = bound::lower_bound(&refs, &templates);
    assert!((lb - both).abs() < 1e-6, "{lb} vs {both}");
}

#[test]
fn a_plans_templates_are_shared_until_daemonsets_or_unavailable_offerings_change() {
    let p = policy(POLICY);
    let c = catalog_for(&p);
    let mut t = Templates::new(&p, &c);
    let s = snap(vec![], vec![]);
    let a = t.for_snapshot(&s, NOW);
    assert!(std::sync::Arc::ptr_eq(&a, &t.for_snapshot(&s, NOW)));
    // An offering short of capacity: new templates, that offering unavailable.
    let key = a[0].offerings[0].key.clone();
    let mut short = snap(vec![], vec![]);
    short.unavailable.insert(key.clone(), Time(NOW.0 + 60_000));
    let b = t.for_snapshot(&short, NOW);
    assert!(!std::sync::Arc::ptr_eq(&a, &b));
    assert!(!b[0].offerings[0].available);
    assert!(a[0].offerings[0].available);
    // Its entry run out: as before.
    assert!(t.for_snapshot(&short, Time(NOW.0 + 60_000))[0].offerings[0].available);
    // A DaemonSet pod takes its share of every new node.
    let ds = PodBuilder::new("kube-system", "agent-x")
        .daemonset("agent")
        .cpu_milli(500)
        .on("n1")
        .build();
    let with_ds = snap(vec![ds], vec![]);
    let d = t.for_snapshot(&with_ds, NOW);
    assert_eq!(d[0].allocatable.cpu_milli, a[0].allocatable.cpu_milli - 500);
    assert!(std::sync::Arc::ptr_eq(&d, &t.for_snapshot(&with_ds, NOW)));
    // What registered nodes teach the templates is not hidden by the shared copy.
    let node = NodeBuilder::new("n1")
        .label(labels::POOL, &a[0].pool_name)
        .label(labels::INSTANCE_TYPE, &a[0].instance_type)
        .cpu_milli(a[0].allocatable.cpu_milli - 1000)
        .build();
    assert!(!t.learn_from(std::slice::from_ref(&node)).is_empty());
    let e = t.for_snapshot(&with_ds, NOW);
    assert_eq!(
        e[0].allocatable.cpu_milli,
        a[0].allocatable.cpu_milli - 1500
    );
}

mod consolidate;
mod dra;
mod reserved;
mod same_plans;
mod scale_down;
mod topology;
mod volumes;

#[test]
fn the_gpus_a_pools_node_advertises_read_back_as_its_templates() {
    use crate::convert::Converter;
    use crate::model::resources::SharedGpu;
    let text = format!(
        "{POLICY}  - name: dra\n    instanceTypes: [g6e.xlarge]\n    maxNodes: 2\n    dra: {{}}\n"
    );
    let p = policy(&text);
    let c = catalog_for(&p);
    let advertised = |pool: &str, t: &str| {
        let pool = p.pools.iter().find(|x| x.name == pool).unwrap();
        super::templates::advertised_gpu_resources(pool, c.instance_type(t).unwrap()).unwrap()
    };
    let expect = |pairs: &[(&str, i64)]| -> BTreeMap<String, i64> {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    };
    assert_eq!(
        advertised("a10g", "g5.12xlarge"),
        expect(&[("nvidia.com/gpu", 4)])
    );
    assert_eq!(
        advertised("mig", "p4d.24xlarge"),
        expect(&[("nvidia.com/mig-1g.5gb", 56)])
    );
    let shared = advertised("t4-shared", "g4dn.12xlarge");
    assert_eq!(
        shared,
        expect(&[
            ("aliyun.com/gpu-core.percentage", 400),
            ("aliyun.com/gpu-count", 4),
            ("aliyun.com/gpu-mem", 60),
        ])
    );
    // A DRA driver publishes the GPUs instead.
    assert_eq!(advertised("dra", "g6e.xlarge"), BTreeMap::new());

    // Read back by the converter as a registered Node: the template's GPUs.
    let node = |gpus: &BTreeMap<String, i64>| {
        let mut alloc = serde_json::json!({"cpu": "48", "memory": "192Gi", "pods": "110"});
        for (k, v) in gpus {
            alloc[k] = serde_json::json!(v.to_string());
        }
        Converter::new()
            .node(serde_json::json!({
                "apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"},
                "status": {"allocatable": alloc},
            }))
            .unwrap()
    };
    assert_eq!(node(&shared).shared_gpus, vec![SharedGpu::full(15); 4]);
    let mig = node(&advertised("mig", "p4d.24xlarge"));
    assert_eq!(
        mig.allocatable.mig_slices().collect::<Vec<_>>(),
        [("1g.5gb", 56)]
    );
    assert_eq!(mig.allocatable.gpu, 0);
    assert_eq!(node(&advertised("a10g", "g5.12xlarge")).allocatable.gpu, 4);
}

#[test]
fn a_providers_spec_holds_its_pools_resolved_once() {
    let text = "zones: [z1, z2]
pools:
  - name: listed
    provider: kwok
    instanceTypes: [g5.xlarge, g5.12xlarge]
    capacityTypes: [spot, on-demand]
    maxNodes: 4
    prices: {g5.xlarge: {onDemand: 0.5}}
    startupTaints: [{key: gpu-driver, value: loading, effect: NoSchedule}]
  - name: elsewhere
    provider: memory
    instanceTypes: [g5.xlarge]
    maxNodes: 1
  - name: mig
    provider: kwok
    instanceTypes: [p4d.24xlarge]
    zones: [z1]
    maxNodes: 1
    gpuMode: mig
    migLayout: {1g.5gb: 7}
";
    let p = policy(text);
    let c = catalog_for(&p);
    let spec = super::templates::provider_spec(&p, &c, "kwok");
    assert_eq!(
        spec.pools
            .iter()
            .map(|x| x.name.as_str())
            .collect::<Vec<_>>(),
        ["listed", "mig"],
        "only the pools that name the provider, in policy order"
    );
    let listed = &spec.pools[0];
    let (types, prices) = listed.types.as_ref().unwrap();
    assert_eq!(types, &["g5.xlarge", "g5.12xlarge"]);
    // The pool's price wins over the catalog's list price.
    assert_eq!(prices["g5.xlarge"], 0.5);
    assert_eq!(
        prices["g5.12xlarge"],
        c.instance_type("g5.12xlarge")
            .unwrap()
            .on_demand_price
            .unwrap()
    );
    assert_eq!(
        listed.startup_taints,
        [(
            "gpu-driver".to_string(),
            "loading".to_string(),
            "NoSchedule".to_string()
        )]
    );
    assert_eq!(listed.zones, ["z1", "z2"]);
    assert_eq!(
        listed.gpu_resources["g5.12xlarge"].as_ref().unwrap()["nvidia.com/gpu"],
        4
    );
    assert_eq!(
        spec.pools[1].gpu_resources["p4d.24xlarge"]
            .as_ref()
            .unwrap()
            .keys()
            .collect::<Vec<_>>(),
        ["nvidia.com/mig-1g.5gb"]
    );
    assert_eq!(
        spec.type_labels["g5.xlarge"]["nvidia.com/gpu.count"], "1",
        "the labels GPU feature discovery puts on a node of the type"
    );
    assert_eq!(
        spec.cluster_id, None,
        "what the process adds is the caller's"
    );
}

#[test]
fn mig_layouts_are_checked_against_the_gpus_of_their_instance_types_at_their_positions() {
    let text = "zones: [us-east-1a]
pools:
  - name: h100
    instanceTypes: [p5.48xlarge]
    maxNodes: 2
    gpuMode: mig
    migLayout: {1g.5gb: 7}
  - name: a100
    instanceTypes: [p4d.24xlarge]
    maxNodes: 2
    gpuMode: mig
    migLayout:
      3g.20gb: 2
      1g.5gb: 1
  - name: over
    instanceTypes: [p5.48xlarge]
    maxNodes: 2
    gpuMode: mig
    migLayout: {1g.20gb: 5}
  - name: valid
    instanceTypes: [p5.48xlarge]
    maxNodes: 2
    gpuMode: mig
    migLayout: {3g.40gb: 1, 2g.20gb: 1, 1g.10gb: 2}
";
    let p = policy(text);
    let c = catalog_for(&p);
    let errors = super::templates::check_mig_layouts(&p, &c);
    let shown: Vec<String> = errors
        .iter()
        .map(|e| format!("{}:{}: {}", e.line, e.col, e.message))
        .collect();
    assert_eq!(
        shown,
        [
            "7:17: pools[0].migLayout[\"1g.5gb\"]: no MIG profile 1g.5gb on the NVIDIA H100 80GB HBM3 \
             GPUs of p5.48xlarge (they offer 1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, \
             4g.40gb, 7g.80gb)",
            "12:5: pools[1].migLayout: the layout takes 9 memory slices, the GPU has 8 (the \
             NVIDIA A100-SXM4-40GB GPUs of p4d.24xlarge)",
            "19:17: pools[2].migLayout[\"1g.20gb\"]: 5 × 1g.20gb, at most 4 fit on one GPU (the NVIDIA \
             H100 80GB HBM3 GPUs of p5.48xlarge)",
        ]
    );
    // The planner refuses the same layouts: no template, the reason in its errors.
    let (_, template_errors) = super::build_templates(&p, &c, &Snapshot::default(), NOW);
    assert!(
        template_errors
            .iter()
            .any(|e| e.starts_with("pool h100: migLayout: no MIG profile 1g.5gb")),
        "{template_errors:?}"
    );
}

#[test]
fn a_media_extensions_profile_is_a_dra_pools_only() {
    let pool = |dra: &str| {
        format!(
            "zones: [us-east-1a]
pools:
  - name: h100
    instanceTypes: [p5.48xlarge]
    maxNodes: 2
    gpuMode: mig
    migLayout: {{1g.10gb+me: 1, 1g.10gb: 6}}
{dra}"
        )
    };
    let err = parse_policy(&pool(""), "p.yaml").unwrap_err().to_string();
    assert!(
        err.contains(
            "p.yaml:7:17: pools[0].migLayout[\"1g.10gb+me\"]: 1g.10gb+me is published only \
             through Dynamic Resource Allocation"
        ),
        "{err}"
    );
    let p = policy(&pool("    dra: {}\n"));
    let c = catalog_for(&p);
    assert_eq!(super::templates::check_mig_layouts(&p, &c), []);
    let t = c.instance_type("p5.48xlarge").unwrap();
    let devices = crate::dra::predicted_devices(&p.pools[0], t);
    let me: Vec<_> = devices
        .iter()
        .filter(|d| {
            d.attributes["gpu.nvidia.com"].get("profile")
                == Some(&crate::model::dra::AttrValue::String("1g.10gb+me".into()))
        })
        .collect();
    assert_eq!(me.len(), 8, "one per GPU");
    assert_eq!(
        me[0].capacity["gpu.nvidia.com"]["ofaEngines"],
        crate::model::quantity::parse_quantity("1").unwrap()
    );
}
