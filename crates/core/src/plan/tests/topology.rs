//! Rules across nodes that kube-scheduler enforces: host ports, required pod (anti-)affinity
//! and topology spread. Each test also plans the same cluster without the rule, which is how
//! the planner saw it before it modelled the rule, to show what the rule changes.

use std::collections::{BTreeMap, BTreeSet};

use super::*;
use crate::model::topology::{
    AffinityTerm, HostPort, PodSelector, PodTopology, Preferences, PreferredTerm, Spread, HOSTNAME,
};
use crate::model::{labels, Pod};

/// One A10G pool over three zones: g5.xlarge (1 GPU) and g5.12xlarge (4 GPUs), spot first.
pub(super) const THREE_ZONES: &str = r#"
zones: [us-east-1a, us-east-1b, us-east-1c]
pools:
  - name: a10g
    instanceTypes: [g5.xlarge, g5.12xlarge]
    capacityTypes: [spot, on-demand]
    maxNodes: 50
"#;

fn app(value: &str) -> PodSelector {
    crate::fixtures::app_selector("default", value)
}

fn term(value: &str, key: &str) -> AffinityTerm {
    AffinityTerm {
        selector: app(value),
        topology_key: key.into(),
    }
}

fn port(p: i32, ip: &str) -> HostPort {
    HostPort {
        port: p,
        protocol: "TCP".into(),
        ip: ip.into(),
    }
}

/// A 1-GPU pod labelled `app`.
fn replica(name: &str, app: &str) -> PodBuilder {
    gpu_pod(name, 1).label("app", app)
}

/// A Ready g5.12xlarge (4 GPUs) of pool a10g in `zone`.
fn big_node(name: &str, zone: &str) -> crate::model::Node {
    big(name, zone).build()
}

fn big(name: &str, zone: &str) -> NodeBuilder {
    NodeBuilder::new(name)
        .pool("a10g", "g5.12xlarge", zone)
        .gpus(4)
        .cpu_milli(47_000)
        .memory_gib(180)
}

/// Zone of each pod placed on a new node.
fn zones_of_new(plan: &Plan) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for su in &plan.scale_ups {
        for p in &su.pods {
            out.insert(p.key.clone(), su.offerings[0].zone.clone());
        }
    }
    out
}

fn new_nodes(plan: &Plan) -> u32 {
    plan.scale_ups.iter().map(|s| s.count).sum()
}

/// Plans of the cluster without the pods' rules across nodes (as the planner saw it before it
/// modelled them) and with them.
fn before_and_after(pods: &[Pod], nodes: &[crate::model::Node], policy: &str) -> (Plan, Plan) {
    let before = run(&snap(without_rules(pods.to_vec()), nodes.to_vec()), policy);
    let after = run(&snap(pods.to_vec(), nodes.to_vec()), policy);
    (before, after)
}

fn without_rules(pods: Vec<Pod>) -> Vec<Pod> {
    pods.into_iter()
        .map(|mut p| {
            let mut c = (*p.constraints).clone();
            c.topology = None;
            p.constraints = std::sync::Arc::new(c);
            p
        })
        .collect()
}

#[test]
fn a_pod_whose_host_port_is_taken_on_a_node_gets_another_node() {
    let ports = |p: i32, ip: &str| PodTopology {
        host_ports: vec![port(p, ip)],
        ..Default::default()
    };
    let running = replica("agent-0", "agent")
        .topology(ports(9400, ""))
        .on("n1")
        .build();
    let pending = replica("agent-1", "agent")
        .topology(ports(9400, "10.0.0.5"))
        .build();
    let nodes = vec![big_node("n1", "us-east-1a")];
    // Without the port, the pod fits the free GPUs of n1: where the planner used to put it.
    let (before, after) = before_and_after(&[running.clone(), pending], &nodes, THREE_ZONES);
    assert_eq!(targets(&before).get("default/agent-1"), Some(&"n1"));
    assert!(after.existing_capacity.is_empty(), "{after:#?}");
    assert_eq!(new_nodes(&after), 1);
    // Another port, or the same port on another protocol, shares the node.
    let mut udp = ports(9400, "");
    udp.host_ports[0].protocol = "UDP".into();
    for t in [ports(9401, ""), udp] {
        let other = replica("agent-2", "agent").topology(t).build();
        let plan = run(
            &snap(vec![running.clone(), other], nodes.clone()),
            THREE_ZONES,
        );
        assert_eq!(targets(&plan).get("default/agent-2"), Some(&"n1"));
    }
}

#[test]
fn pending_pods_with_one_host_port_get_a_node_each() {
    let pods: Vec<Pod> = (0..3)
        .map(|i| {
            replica(&format!("w-{i}"), "w")
                .topology(PodTopology {
                    host_ports: vec![port(8080, "")],
                    ..Default::default()
                })
                .build()
        })
        .collect();
    let only_big = THREE_ZONES.replace("[g5.xlarge, g5.12xlarge]", "[g5.12xlarge]");
    let (before, after) = before_and_after(&pods, &[], &only_big);
    assert_eq!(
        new_nodes(&before),
        1,
        "one 4-GPU node held all three: {before:#?}"
    );
    assert_eq!(new_nodes(&after), 3, "{after:#?}");
    assert!(after
        .scale_ups
        .iter()
        .all(|s| s.pods_per_node.iter().all(|&n| n == 1)));
    // Host ports alone bind no zone: the fallbacks still span the zones.
    let zones: BTreeSet<&str> = after.scale_ups[0]
        .offerings
        .iter()
        .map(|o| o.zone.as_str())
        .collect();
    assert_eq!(zones.len(), 3);
}

#[test]
fn hostname_anti_affinity_keeps_replicas_off_a_node_with_one() {
    let anti = PodTopology {
        anti_affinity: vec![term("serve", HOSTNAME)],
        ..Default::default()
    };
    let running = replica("serve-0", "serve")
        .topology(anti.clone())
        .on("n1")
        .build();
    let mut pods = vec![running];
    for i in 1..4 {
        pods.push(
            replica(&format!("serve-{i}"), "serve")
                .topology(anti.clone())
                .build(),
        );
    }
    let nodes = vec![big_node("n1", "us-east-1a")];
    let (before, after) = before_and_after(&pods, &nodes, THREE_ZONES);
    assert_eq!(before.existing_capacity.len(), 3, "{before:#?}");
    assert!(after.existing_capacity.is_empty(), "{after:#?}");
    assert_eq!(new_nodes(&after), 3);
    assert!(after
        .scale_ups
        .iter()
        .all(|s| s.pods_per_node.iter().all(|&n| n == 1)));
}

#[test]
fn a_running_pods_anti_affinity_repels_a_pod_without_rules() {
    // The running pod refuses company labelled app=noisy on its node; the pending pod has no
    // rule of its own.
    let running = replica("quiet", "quiet")
        .topology(PodTopology {
            anti_affinity: vec![term("noisy", HOSTNAME)],
            ..Default::default()
        })
        .on("n1")
        .build();
    let noisy = replica("noisy", "noisy").build();
    let nodes = vec![big_node("n1", "us-east-1a")];
    let (before, after) = before_and_after(&[running, noisy], &nodes, THREE_ZONES);
    assert_eq!(targets(&before).get("default/noisy"), Some(&"n1"));
    assert!(after.existing_capacity.is_empty(), "{after:#?}");
    assert_eq!(new_nodes(&after), 1);
}

/// Zone spread of the pods labelled app=`app`, maxSkew 1.
fn zone_spread(app_label: &str) -> Spread {
    Spread {
        max_skew: 1,
        topology_key: labels::ZONE.into(),
        selector: app(app_label),
        min_domains: 1,
        honor_node_affinity: true,
        honor_taints: false,
    }
}

fn serving(i: usize) -> Pod {
    replica(&format!("llm-{i}"), "llm")
        .topology(PodTopology {
            anti_affinity: vec![term("llm", HOSTNAME)],
            spread: vec![zone_spread("llm")],
            ..Default::default()
        })
        .build()
}

#[test]
fn six_replicas_spread_over_zones_get_two_nodes_per_zone_with_fallbacks_in_their_zone() {
    let pods: Vec<Pod> = (0..6).map(serving).collect();
    let (before, after) = before_and_after(&pods, &[], THREE_ZONES);
    let before_zones: BTreeSet<String> = zones_of_new(&before).into_values().collect();
    assert_eq!(
        before_zones.len(),
        1,
        "all in the cheapest zone: {before:#?}"
    );
    let mut per_zone: BTreeMap<String, usize> = BTreeMap::new();
    for z in zones_of_new(&after).into_values() {
        *per_zone.entry(z).or_default() += 1;
    }
    assert_eq!(
        per_zone.values().copied().collect::<Vec<_>>(),
        vec![2, 2, 2],
        "{after:#?}"
    );
    assert_eq!(new_nodes(&after), 6);
    for su in &after.scale_ups {
        assert!(su.pods_per_node.iter().all(|&n| n == 1), "{su:?}");
        // Fallbacks stay in the zone: spot, then on-demand there.
        let zones: BTreeSet<&str> = su.offerings.iter().map(|o| o.zone.as_str()).collect();
        assert_eq!(zones.len(), 1, "{su:?}");
        let types: Vec<CapacityType> = su.offerings.iter().map(|o| o.capacity_type).collect();
        assert_eq!(
            types,
            vec![CapacityType::Spot, CapacityType::OnDemand],
            "{su:?}"
        );
    }
}

#[test]
fn zone_spread_counts_running_replicas_and_skips_room_in_the_crowded_zone() {
    // Two replicas run in zone a on n1, which has room for two more.
    let spread_only = |name: &str| {
        replica(name, "llm").topology(PodTopology {
            spread: vec![zone_spread("llm")],
            ..Default::default()
        })
    };
    let pods = vec![
        spread_only("llm-0").on("n1").build(),
        spread_only("llm-1").on("n1").build(),
        spread_only("llm-2").build(),
        spread_only("llm-3").build(),
    ];
    let nodes = vec![big_node("n1", "us-east-1a")];
    let (before, after) = before_and_after(&pods, &nodes, THREE_ZONES);
    assert_eq!(before.existing_capacity.len(), 2, "{before:#?}");
    assert!(after.existing_capacity.is_empty(), "{after:#?}");
    let zones = zones_of_new(&after);
    assert_eq!(zones.len(), 2);
    assert!(zones.values().all(|z| z != "us-east-1a"), "{zones:?}");
}

#[test]
fn required_pod_affinity_follows_the_selected_pods_zone() {
    let cache = replica("cache", "cache").on("n2").build();
    let user = replica("user", "user")
        .topology(PodTopology {
            affinity: vec![term("cache", labels::ZONE)],
            ..Default::default()
        })
        .build();
    // n1 in zone a has room; n2 in zone b, where the cache runs, is full.
    let n2 = NodeBuilder::new("n2")
        .pool("a10g", "g5.xlarge", "us-east-1b")
        .gpus(1)
        .cpu_milli(3_000)
        .memory_gib(14)
        .build();
    let nodes = vec![big_node("n1", "us-east-1a"), n2];
    let (before, after) = before_and_after(&[cache, user.clone()], &nodes, THREE_ZONES);
    assert_eq!(targets(&before).get("default/user"), Some(&"n1"));
    assert!(after.existing_capacity.is_empty(), "{after:#?}");
    assert_eq!(after.scale_ups.len(), 1);
    assert!(after.scale_ups[0]
        .offerings
        .iter()
        .all(|o| o.zone == "us-east-1b"));
    // With no pod it selects anywhere, a pod whose affinity does not select itself waits.
    let alone = run(&snap(vec![user], vec![]), THREE_ZONES);
    assert!(alone.scale_ups.is_empty(), "{alone:#?}");
    assert!(
        alone.unschedulable[0]
            .reason
            .contains("required pod affinity"),
        "{alone:#?}"
    );
}

#[test]
fn the_first_of_a_group_whose_affinity_selects_itself_starts_it_and_the_rest_follow() {
    let pods: Vec<Pod> = (0..3)
        .map(|i| {
            replica(&format!("ring-{i}"), "ring")
                .topology(PodTopology {
                    affinity: vec![term("ring", labels::ZONE)],
                    ..Default::default()
                })
                .build()
        })
        .collect();
    let plan = run(&snap(pods, vec![]), THREE_ZONES);
    let zones: BTreeSet<String> = zones_of_new(&plan).into_values().collect();
    assert_eq!(zones.len(), 1, "{plan:#?}");
    assert_eq!(zones_of_new(&plan).len(), 3);
}

#[test]
fn scale_down_keeps_a_node_whose_pod_anti_affinity_allows_nowhere_else() {
    let anti = PodTopology {
        anti_affinity: vec![term("serve", HOSTNAME)],
        ..Default::default()
    };
    // Two half-used 4-GPU nodes, one replica each: without the rule either could take the
    // other's replica.
    let pods = vec![
        replica("serve-0", "serve")
            .topology(anti.clone())
            .on("n1")
            .build(),
        replica("serve-1", "serve").topology(anti).on("n2").build(),
    ];
    let mut nodes = vec![big_node("n1", "us-east-1a"), big_node("n2", "us-east-1a")];
    for n in &mut nodes {
        std::sync::Arc::make_mut(&mut n.annotations)
            .insert(labels::UNNEEDED_SINCE.into(), Time(0).to_rfc3339());
    }
    let policy_text = format!("{THREE_ZONES}    minNodes: 0\n");
    let (before, after) = before_and_after(&pods, &nodes, &policy_text);
    assert_eq!(before.scale_downs.len(), 1, "{before:#?}");
    assert!(after.scale_downs.is_empty(), "{after:#?}");
    assert!(
        after
            .kept
            .iter()
            .all(|k| k.reason.contains("would not fit on the nodes that remain")),
        "{after:#?}"
    );
}

/// A pod labelled app=`app` preferring (weight `w`; negative: preferring not) the nodes or
/// zones (`key`) of the pods labelled app=`other`.
fn preferring(name: &str, app_label: &str, w: i32, other: &str, key: &str) -> PodBuilder {
    replica(name, app_label).topology(PodTopology {
        preferences: Preferences {
            pods: vec![PreferredTerm {
                weight: w,
                term: term(other, key),
            }],
            ..Default::default()
        },
        ..Default::default()
    })
}

#[test]
fn preferred_anti_affinity_picks_the_node_without_a_replica_among_those_with_room() {
    let pods = vec![
        preferring("serve-0", "serve", -100, "serve", HOSTNAME)
            .on("n1")
            .build(),
        preferring("serve-1", "serve", -100, "serve", HOSTNAME).build(),
    ];
    let nodes = vec![big_node("n1", "us-east-1a"), big_node("n2", "us-east-1a")];
    let (before, after) = before_and_after(&pods, &nodes, THREE_ZONES);
    assert_eq!(targets(&before).get("default/serve-1"), Some(&"n1"));
    assert_eq!(targets(&after).get("default/serve-1"), Some(&"n2"));
    assert!(after.scale_ups.is_empty(), "{after:#?}");
}

#[test]
fn a_running_pods_preferred_affinity_draws_the_pods_it_selects_to_its_node() {
    // The trainer on n2 prefers the cache on its node; the cache pod itself has no preference.
    // kube-scheduler scores the placed pods' terms too (symmetric `InterPodAffinity`): n2.
    let pods = vec![
        preferring("trainer", "trainer", 100, "cache", HOSTNAME)
            .on("n2")
            .build(),
        replica("cache-0", "cache").build(),
    ];
    let nodes = vec![big_node("n1", "us-east-1a"), big_node("n2", "us-east-1a")];
    let (before, after) = before_and_after(&pods, &nodes, THREE_ZONES);
    assert_eq!(targets(&before).get("default/cache-0"), Some(&"n1"));
    assert_eq!(
        targets(&after).get("default/cache-0"),
        Some(&"n2"),
        "{after:#?}"
    );
    assert!(after.scale_ups.is_empty(), "{after:#?}");
}

#[test]
fn a_running_pods_preferred_anti_affinity_keeps_the_pods_it_selects_off_its_zone() {
    // The trainer in zone a prefers no batch pod in its zone; n1 (zone a) comes first, n2 (zone
    // b) has room too: the batch pod goes to n2. A required affinity of a running pod scores
    // the pods it selects toward it too (weight 1), which the second case shows.
    let pods = vec![
        preferring("trainer", "trainer", -50, "batch", labels::ZONE)
            .on("n1")
            .build(),
        replica("batch-0", "batch").build(),
    ];
    let nodes = vec![big_node("n1", "us-east-1a"), big_node("n2", "us-east-1b")];
    let (before, after) = before_and_after(&pods, &nodes, THREE_ZONES);
    assert_eq!(targets(&before).get("default/batch-0"), Some(&"n1"));
    assert_eq!(
        targets(&after).get("default/batch-0"),
        Some(&"n2"),
        "{after:#?}"
    );

    let pods = vec![
        replica("proxy", "proxy")
            .topology(PodTopology {
                affinity: vec![term("cache", labels::ZONE)],
                ..Default::default()
            })
            .on("n2")
            .build(),
        replica("cache-1", "cache").on("n2").build(),
        replica("cache-2", "cache").build(),
    ];
    let (before, after) = before_and_after(&pods, &nodes, THREE_ZONES);
    assert_eq!(targets(&before).get("default/cache-2"), Some(&"n1"));
    assert_eq!(
        targets(&after).get("default/cache-2"),
        Some(&"n2"),
        "{after:#?}"
    );
}

#[test]
fn preferred_anti_affinity_is_never_a_reason_to_launch() {
    // Four replicas that prefer not to share a node, and one node with room for all four: kube-
    // scheduler binds them all there, so no node is launched for them.
    let pods: Vec<Pod> = (0..4)
        .map(|i| preferring(&format!("serve-{i}"), "serve", -100, "serve", HOSTNAME).build())
        .collect();
    let plan = run(&snap(pods, vec![big_node("n1", "us-east-1a")]), THREE_ZONES);
    assert!(plan.scale_ups.is_empty(), "{plan:#?}");
    assert_eq!(targets(&plan).len(), 4, "{plan:#?}");
}

#[test]
fn schedule_anyway_zone_spread_puts_pods_on_the_nodes_of_the_emptier_zone_first() {
    let soft = |name: &str| {
        replica(name, "llm").topology(PodTopology {
            preferences: Preferences {
                spread: vec![zone_spread("llm")],
                ..Default::default()
            },
            ..Default::default()
        })
    };
    // Two replicas run in zone a on n1; n1 and n2 (zone b) have room for two more each.
    let pods = vec![
        soft("llm-0").on("n1").build(),
        soft("llm-1").on("n1").build(),
        soft("llm-2").build(),
        soft("llm-3").build(),
    ];
    let nodes = vec![big_node("n1", "us-east-1a"), big_node("n2", "us-east-1b")];
    let (before, after) = before_and_after(&pods, &nodes, THREE_ZONES);
    assert_eq!(targets(&before).get("default/llm-2"), Some(&"n1"));
    let t = targets(&after);
    assert_eq!(
        (t.get("default/llm-2"), t.get("default/llm-3")),
        (Some(&"n2"), Some(&"n2")),
        "{after:#?}"
    );
    assert!(after.scale_ups.is_empty(), "{after:#?}");
}

#[test]
fn schedule_anyway_spread_counts_only_the_nodes_its_node_selector_admits() {
    // Team a's replicas spread over zones as a preference. One runs on n1 (zone a); two run in
    // zone b on x1, a node the pod's nodeSelector does not admit, which kube-scheduler does not
    // count (`nodeAffinityPolicy: Honor`, the default): zone b is the emptier, n2.
    let soft = |name: &str| {
        replica(name, "llm")
            .selector("team", "a")
            .topology(PodTopology {
                preferences: Preferences {
                    spread: vec![zone_spread("llm")],
                    ..Default::default()
                },
                ..Default::default()
            })
    };
    let pods = vec![
        soft("llm-0").on("n1").build(),
        soft("llm-1").on("x1").build(),
        soft("llm-2").on("x1").build(),
        soft("llm-3").build(),
    ];
    let team = |n: NodeBuilder| n.label("team", "a").build();
    let nodes = vec![
        team(big("n1", "us-east-1a")),
        team(big("n2", "us-east-1b")),
        big_node("x1", "us-east-1b"),
    ];
    let (before, after) = before_and_after(&pods, &nodes, THREE_ZONES);
    assert_eq!(targets(&before).get("default/llm-3"), Some(&"n1"));
    assert_eq!(
        targets(&after).get("default/llm-3"),
        Some(&"n2"),
        "{after:#?}"
    );
}

#[test]
fn a_spread_honouring_taints_leaves_out_the_zones_only_a_tainted_pool_offers() {
    // Pool a10g in zones a and b; pool team-c, tainted, the only one in zone c. The replicas
    // spread over zones with `nodeTaintsPolicy: Honor` and do not tolerate team-c's taint, so
    // kube-scheduler takes their domains from a and b only: one runs in each, a third may go
    // to either. Counting zone c (as untainted) would ask for it there, where no node it
    // tolerates can be launched.
    const POOLS: &str = r#"
zones: [us-east-1a, us-east-1b, us-east-1c]
pools:
  - name: a10g
    instanceTypes: [g5.xlarge]
    capacityTypes: [on-demand]
    zones: [us-east-1a, us-east-1b]
    maxNodes: 10
  - name: team-c
    instanceTypes: [g5.xlarge]
    capacityTypes: [on-demand]
    zones: [us-east-1c]
    maxNodes: 10
    taints: [{key: team, value: c, effect: NoSchedule}]
"#;
    let spread = Spread {
        honor_taints: true,
        ..zone_spread("llm")
    };
    let honouring = |name: &str| {
        replica(name, "llm").topology(PodTopology {
            spread: vec![spread.clone()],
            ..Default::default()
        })
    };
    let small = |name: &str, zone: &str| {
        NodeBuilder::new(name)
            .pool("a10g", "g5.xlarge", zone)
            .gpus(1)
            .cpu_milli(3_920)
            .memory_gib(15)
            .build()
    };
    let pods = vec![
        honouring("llm-0").on("n1").build(),
        honouring("llm-1").on("n2").build(),
        honouring("llm-2").build(),
    ];
    let nodes = vec![small("n1", "us-east-1a"), small("n2", "us-east-1b")];
    let plan = run(&snap(pods, nodes), POOLS);
    assert!(plan.unschedulable.is_empty(), "{plan:#?}");
    let zones = zones_of_new(&plan);
    assert_eq!(zones.len(), 1, "{plan:#?}");
    assert!(
        ["us-east-1a", "us-east-1b"].contains(&zones["default/llm-2"].as_str()),
        "{zones:?}"
    );
}

#[test]
fn preferred_pod_affinity_breaks_a_price_tie_between_zones_for_a_new_node() {
    // On-demand only, so a node costs the same in every zone; the cache runs in zone c on a
    // full node. The pod must have a node of its own (required hostname anti-affinity) and
    // prefers the cache's zone.
    let on_demand = THREE_ZONES.replace("[spot, on-demand]", "[on-demand]");
    let cache = replica("cache", "cache").on("n3").build();
    let n3 = NodeBuilder::new("n3")
        .pool("a10g", "g5.xlarge", "us-east-1c")
        .gpus(1)
        .cpu_milli(3_000)
        .memory_gib(14)
        .build();
    let mut user = PodTopology {
        anti_affinity: vec![term("user", HOSTNAME)],
        ..Default::default()
    };
    let plain = run(
        &snap(
            vec![
                cache.clone(),
                replica("user", "user").topology(user.clone()).build(),
            ],
            vec![n3.clone()],
        ),
        &on_demand,
    );
    assert_eq!(plain.scale_ups.len(), 1, "{plain:#?}");
    assert_eq!(plain.scale_ups[0].offerings[0].zone, "us-east-1a");
    user.preferences.pods = vec![PreferredTerm {
        weight: 50,
        term: term("cache", labels::ZONE),
    }];
    let plan = run(
        &snap(
            vec![cache, replica("user", "user").topology(user).build()],
            vec![n3],
        ),
        &on_demand,
    );
    assert_eq!(plan.scale_ups.len(), 1, "{plan:#?}");
    assert!(
        plan.scale_ups[0]
            .offerings
            .iter()
            .all(|o| o.zone == "us-east-1c"),
        "{plan:#?}"
    );
}

/// A pending llm replica with zone spread (maxSkew 1) under these node inclusion policies.
fn spread_with_policies(name: &str, honor_node_affinity: bool, honor_taints: bool) -> PodBuilder {
    replica(name, "llm").topology(PodTopology {
        spread: vec![Spread {
            honor_node_affinity,
            honor_taints,
            ..zone_spread("llm")
        }],
        ..Default::default()
    })
}

#[test]
fn topology_spread_counts_only_pods_on_nodes_its_node_affinity_admits_unless_ignored() {
    // Two replicas run in zone a on a batch node; the pending one may only use serve nodes, of
    // which one is in zone a and one in zone b, both with room.
    let nodes = vec![
        big("batch-a", "us-east-1a")
            .label("workload", "batch")
            .build(),
        big("serve-a", "us-east-1a")
            .label("workload", "serve")
            .build(),
        big("serve-b", "us-east-1b")
            .label("workload", "serve")
            .build(),
    ];
    let plan = |honor: bool| {
        let pods = vec![
            spread_with_policies("llm-0", honor, false)
                .on("batch-a")
                .build(),
            spread_with_policies("llm-1", honor, false)
                .on("batch-a")
                .build(),
            spread_with_policies("llm-2", honor, false)
                .selector("workload", "serve")
                .build(),
        ];
        run(&snap(pods, nodes.clone()), THREE_ZONES)
    };
    // nodeAffinityPolicy: Honor (the default): the batch node's replicas are not counted, so
    // zone a is as empty as zone b and the first node with room takes it.
    let honored = plan(true);
    assert_eq!(
        targets(&honored).get("default/llm-2"),
        Some(&"serve-a"),
        "{honored:#?}"
    );
    // Ignore: they count, and zone a is two ahead.
    let ignored = plan(false);
    assert_eq!(
        targets(&ignored).get("default/llm-2"),
        Some(&"serve-b"),
        "{ignored:#?}"
    );
}

#[test]
fn topology_spread_honouring_taints_leaves_a_tainted_nodes_zone_out_of_its_domains() {
    // The pool launches in zone b only. Zone a has one node, tainted; zone b runs a replica
    // and has room for more.
    let zone_b = THREE_ZONES.replace(
        "zones: [us-east-1a, us-east-1b, us-east-1c]",
        "zones: [us-east-1b]",
    );
    let tainted = big("tainted-a", "us-east-1a")
        .taint("dedicated", crate::model::constraints::Effect::NoSchedule)
        .build();
    let nodes = vec![tainted, big_node("n-b", "us-east-1b")];
    let plan = |honor_taints: bool| {
        let pods = vec![
            spread_with_policies("llm-0", true, honor_taints)
                .on("n-b")
                .build(),
            spread_with_policies("llm-1", true, honor_taints).build(),
        ];
        run(&snap(pods, nodes.clone()), &zone_b)
    };
    // nodeTaintsPolicy: Ignore (the default): zone a counts as a domain with no replica, and
    // a second replica in zone b would make the skew 2: it cannot be placed anywhere.
    let ignored = plan(false);
    assert!(targets(&ignored).is_empty(), "{ignored:#?}");
    assert!(ignored.scale_ups.is_empty(), "{ignored:#?}");
    assert!(
        ignored.unschedulable[0].reason.contains("topology spread"),
        "{ignored:#?}"
    );
    // Honor: the tainted node's zone is no domain of the pod's.
    let honored = plan(true);
    assert_eq!(
        targets(&honored).get("default/llm-1"),
        Some(&"n-b"),
        "{honored:#?}"
    );
}

#[test]
fn affinity_namespace_selector_selects_the_namespaces_whose_labels_it_matches() {
    // A noisy trainer runs on n1 in namespace `train` (labelled team=ml); the pending server,
    // in `serve`, keeps off nodes running app=noisy pods of the namespaces labelled team=ml.
    let items = r#"apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Namespace
  metadata: {name: train, labels: {team: ml}}
- apiVersion: v1
  kind: Namespace
  metadata: {name: serve, labels: {team: web}}
- apiVersion: v1
  kind: Node
  metadata:
    name: n1
    labels: {topology.kubernetes.io/zone: us-east-1a, node.kubernetes.io/instance-type: g5.12xlarge, gpu-node-autoscaler.io/pool: a10g, kubernetes.io/hostname: n1}
  spec: {providerID: "aws:///us-east-1a/i-1"}
  status:
    allocatable: {cpu: "47", memory: 180Gi, pods: "110", nvidia.com/gpu: "4"}
    conditions: [{type: Ready, status: "True"}]
- apiVersion: v1
  kind: Pod
  metadata: {name: trainer, namespace: train, labels: {app: noisy}}
  spec:
    nodeName: n1
    containers: [{name: main, resources: {requests: {nvidia.com/gpu: "1", cpu: "1", memory: 4Gi}}}]
  status: {phase: Running}
- apiVersion: v1
  kind: Pod
  metadata: {name: server, namespace: serve, uid: u-server}
  spec:
    containers: [{name: main, resources: {requests: {nvidia.com/gpu: "1", cpu: "1", memory: 4Gi}}}]
    affinity:
      podAntiAffinity:
        requiredDuringSchedulingIgnoredDuringExecution:
        - topologyKey: kubernetes.io/hostname
          labelSelector: {matchLabels: {app: noisy}}
          namespaceSelector: {matchLabels: {team: ml}}
  status:
    phase: Pending
    conditions: [{type: PodScheduled, status: "False", reason: Unschedulable}]
"#;
    let with = crate::convert::load_cluster_file(items, "cluster.yaml")
        .unwrap()
        .snapshot;
    // Without the Namespaces the selector looks at the pod's own namespace only (how the planner
    // saw it before it read them): n1 takes the server.
    let without_namespaces = items.replace("kind: Namespace", "kind: ConfigMap");
    let without = crate::convert::load_cluster_file(&without_namespaces, "cluster.yaml")
        .unwrap()
        .snapshot;
    let before = run(&without, THREE_ZONES);
    assert_eq!(
        targets(&before).get("serve/server"),
        Some(&"n1"),
        "{before:#?}"
    );
    let after = run(&with, THREE_ZONES);
    assert!(after.existing_capacity.is_empty(), "{after:#?}");
    assert_eq!(new_nodes(&after), 1, "{after:#?}");
}

/// One A10G pool of 4-GPU nodes only, over three zones.
const BIG_ONLY: &str = r#"
zones: [us-east-1a, us-east-1b, us-east-1c]
pools:
  - name: a10g
    instanceTypes: [g5.12xlarge]
    capacityTypes: [spot, on-demand]
    maxNodes: 50
"#;

#[test]
fn a_gangs_workers_with_hostname_anti_affinity_get_a_new_node_each_and_are_counted_there() {
    // Four 1-GPU workers of one job, one per node (hostname anti-affinity among them), and a
    // pod that may not share a zone with them.
    let workers: Vec<Pod> = (0..4)
        .map(|i| {
            replica(&format!("w{i}"), "worker")
                .gang("job", 4)
                .topology(PodTopology {
                    anti_affinity: vec![term("worker", HOSTNAME)],
                    ..Default::default()
                })
                .build()
        })
        .collect();
    let (before, after) = before_and_after(&workers, &[], BIG_ONLY);
    // Without the rule the four share one 4-GPU node, which kube-scheduler would refuse to
    // three of them.
    assert_eq!(new_nodes(&before), 1, "{before:#?}");
    assert_eq!(new_nodes(&after), 4, "{after:#?}");
    assert!(after.scale_ups.iter().all(
        |s| s.gang.as_deref() == Some("default/job") && s.pods_per_node.iter().all(|&n| n == 1)
    ));
    let gang_zone: BTreeSet<String> = zones_of_new(&after).into_values().collect();
    assert_eq!(gang_zone.len(), 1, "a gang stays in one zone: {after:#?}");

    // The gang's pods count where they go: a pod whose anti-affinity keeps it out of the
    // workers' zone gets a node in another zone.
    let mut pods = workers.clone();
    pods.push(
        replica("apart", "apart")
            .topology(PodTopology {
                anti_affinity: vec![term("worker", labels::ZONE)],
                ..Default::default()
            })
            .build(),
    );
    let plan = run(&snap(pods, vec![]), BIG_ONLY);
    let zones = zones_of_new(&plan);
    assert_ne!(
        zones.get("default/apart"),
        zones.get("default/w0"),
        "{plan:#?}"
    );
    assert!(zones.contains_key("default/apart"), "{plan:#?}");
}
