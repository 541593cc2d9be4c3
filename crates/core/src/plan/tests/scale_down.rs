//! Scale-down rules, one table row or test each, on a virtual clock.

use std::time::Duration;

use super::*;
use crate::model::snapshot::PoolState;
use crate::model::{Pdb, Requirement};

const MIN: Duration = Duration::from_secs(60);

fn mins(m: u64) -> Duration {
    Duration::from_secs(60 * m)
}

const SD_POLICY: &str = r#"
zones: [us-east-1a, us-east-1b]
maxConcurrentDrains: 10
pools:
  - name: a10g
    instanceTypes: [g5.xlarge, g5.12xlarge]
    capacityTypes: [spot, on-demand]
    maxNodes: 100
  - name: keep
    instanceTypes: [g6.12xlarge]
    maxNodes: 10
    scaleDown: {enabled: false}
"#;

/// A 4-GPU a10g node, created an hour ago, unneeded since `since` minutes ago (if given).
fn node(name: &str, since_min: Option<u64>) -> NodeBuilder {
    let mut b = NodeBuilder::new(name)
        .pool("a10g", "g5.12xlarge", "us-east-1a")
        .label(labels::CAPACITY_TYPE, "spot")
        .cpu_milli(47_000)
        .memory_gib(180)
        .gpus(4)
        .created(NOW - 60 * MIN);
    if let Some(m) = since_min {
        b = b.annotation(labels::UNNEEDED_SINCE, &(NOW - mins(m)).to_rfc3339());
    }
    b
}

fn on(name: &str, node: &str, gpus: i64) -> PodBuilder {
    PodBuilder::new("ml", name)
        .gpus(gpus)
        .cpu_milli(1000)
        .memory_gib(4)
        .on(node)
}

fn sd(s: &Snapshot) -> Plan {
    run(s, SD_POLICY)
}

fn removed(p: &Plan) -> Vec<&str> {
    p.scale_downs.iter().map(|d| d.node.as_str()).collect()
}

fn kept_reason<'a>(p: &'a Plan, node: &str) -> &'a str {
    p.kept
        .iter()
        .find(|k| k.node == node)
        .map(|k| k.reason.as_str())
        .unwrap_or_else(|| panic!("{node} not kept: {p:?}"))
}

#[test]
fn unneeded_time_must_pass() {
    // (minutes unneeded, removed?)
    for (since, gone) in [
        (Some(11), true),
        (Some(10), true),
        (Some(5), false),
        (None, false),
    ] {
        let p = sd(&snap(vec![], vec![node("n", since).build()]));
        assert_eq!(removed(&p) == ["n"], gone, "since {since:?}: {p:?}");
        if !gone {
            assert!(kept_reason(&p, "n").contains("removable after"));
        }
        // Unneeded since: the annotation, or now when it is new.
        let want = since.map_or(NOW, |m| NOW - mins(m)).to_rfc3339();
        assert_eq!(
            p.unneeded,
            vec![Unneeded {
                node: "n".into(),
                since: want
            }]
        );
    }
}

#[test]
fn an_empty_node_waits_its_own_shorter_delay_and_a_busy_one_the_whole_unneeded_time() {
    let policy = SD_POLICY.replace(
        "    maxNodes: 100\n",
        "    maxNodes: 100\n    scaleDown: {unneededTime: 10m, emptyUnneededTime: 1m}\n",
    );
    let dcgm = || {
        PodBuilder::new("kube-system", "dcgm")
            .daemonset("dcgm")
            .cpu_milli(100)
            .on("empty")
    };
    // Unneeded for 2 minutes: the node with only a DaemonSet pod goes, the one with a 1-GPU
    // pod (25 % used) waits for its 10 minutes.
    let s = snap(
        vec![dcgm().build(), on("w", "busy", 1).build()],
        vec![
            node("empty", Some(2)).build(),
            node("busy", Some(2)).build(),
        ],
    );
    let p = run(&s, &policy);
    assert_eq!(removed(&p), ["empty"], "{p:?}");
    assert!(kept_reason(&p, "busy").contains("removable after"));
    // Without emptyUnneededTime, the empty node waits as long as any.
    assert!(removed(&sd(&s)).is_empty());
}

#[test]
fn unneeded_is_judged_on_gpu_requests_only() {
    // (GPUs requested of 4, DaemonSet CPU, unneeded?)
    for (gpus, unneeded) in [(0, true), (1, true), (2, false), (4, false)] {
        let mut pods = vec![PodBuilder::new("kube-system", "dcgm")
            .daemonset("dcgm")
            .cpu_milli(30_000)
            .memory_gib(100)
            .on("n")
            .build()];
        if gpus > 0 {
            pods.push(on("w", "n", gpus).build());
        }
        let p = sd(&snap(
            pods,
            vec![
                node("n", Some(30)).build(),
                node("spare", None).gpus(4).build(),
            ],
        ));
        assert_eq!(
            p.unneeded.iter().any(|u| u.node == "n"),
            unneeded,
            "{gpus} GPUs: {p:?}"
        );
    }
}

#[test]
fn cooldown_after_scale_up_and_backoff_after_failure() {
    // A node created 5 minutes ago means the pool scaled up 5 minutes ago.
    let young = node("young", None).created(NOW - 5 * MIN).build();
    let p = sd(&snap(vec![], vec![node("old", Some(30)).build(), young]));
    assert!(removed(&p).is_empty());
    assert!(kept_reason(&p, "old").contains("cooldown after a scale-up until"));

    // Launches in flight count as a scale-up too.
    let mut s = snap(vec![], vec![node("old", Some(30)).build()]);
    s.in_flight.push(InFlight {
        launch_id: "l".into(),
        pool: "a10g".into(),
        offering: OfferingKey {
            instance_type: "g5.xlarge".into(),
            zone: "us-east-1a".into(),
            capacity_type: CapacityType::Spot,
        },
        count: 1,
        launched_at: NOW - 2 * MIN,
    });
    assert!(kept_reason(&sd(&s), "old").contains("cooldown"));

    // A failed scale-down 1 minute ago: back off for 3.
    let mut s = snap(vec![], vec![node("old", Some(30)).build()]);
    s.pools.insert(
        "a10g".into(),
        PoolState {
            last_scale_up: None,
            last_scale_down_failure: Some(NOW - MIN),
        },
    );
    assert!(kept_reason(&sd(&s), "old").contains("backing off after a failed scale-down"));
    s.pools.get_mut("a10g").unwrap().last_scale_down_failure = Some(NOW - 4 * MIN);
    assert_eq!(removed(&sd(&s)), ["old"]);
}

#[test]
fn scale_down_can_be_disabled_per_pool_and_per_node() {
    for key in [labels::SCALE_DOWN_DISABLED, labels::CA_SCALE_DOWN_DISABLED] {
        let n = node("n", Some(30)).annotation(key, "true").build();
        let p = sd(&snap(vec![], vec![n]));
        assert!(
            kept_reason(&p, "n").contains("scale-down-disabled"),
            "{key}"
        );
    }
    let n = NodeBuilder::new("k")
        .pool("keep", "g6.12xlarge", "us-east-1a")
        .gpus(4)
        .annotation(labels::UNNEEDED_SINCE, &(NOW - 30 * MIN).to_rfc3339())
        .build();
    assert!(kept_reason(&sd(&snap(vec![], vec![n])), "k").contains("disabled for pool keep"));
}

#[test]
fn only_movable_pods_are_evicted() {
    // (pod, movable?)
    let cases: Vec<(PodBuilder, bool)> = vec![
        (on("rs", "n", 1), true),
        (
            on("job", "n", 1).owner(crate::model::OwnerKind::Job, "j"),
            true,
        ),
        (
            on("mpi", "n", 1).owner(crate::model::OwnerKind::Kubeflow("MPIJob".into()), "m"),
            true,
        ),
        (on("bare", "n", 1).bare(), false),
        (
            on("ours", "n", 1).annotation(labels::SAFE_TO_EVICT, "false"),
            false,
        ),
        (
            on("ca", "n", 1).annotation(labels::CA_SAFE_TO_EVICT, "false"),
            false,
        ),
        (on("scratch", "n", 1).local_storage(), false),
        (
            on("kept-by-karpenter", "n", 1).annotation(labels::KARPENTER_DO_NOT_DISRUPT, "true"),
            false,
        ),
        (
            on("scratch-ok", "n", 1)
                .local_storage()
                .annotation(labels::CA_SAFE_TO_EVICT, "true"),
            true,
        ),
        (
            on("bare-ok", "n", 1)
                .bare()
                .annotation(labels::SAFE_TO_EVICT, "true"),
            true,
        ),
    ];
    for (pod, movable) in cases {
        let pod = pod.build();
        let name = pod.id.to_string();
        let nodes = vec![node("n", Some(30)).build(), node("spare", None).build()];
        let p = sd(&snap(vec![pod], nodes));
        if movable {
            assert_eq!(removed(&p), ["n"], "{name}");
            assert_eq!(
                p.scale_downs[0].evict,
                vec![Eviction {
                    pod: name,
                    to: "spare".into()
                }]
            );
        } else {
            assert!(removed(&p).is_empty(), "{name}");
            assert!(
                kept_reason(&p, "n").contains(&name),
                "{name}: {}",
                kept_reason(&p, "n")
            );
        }
    }
    // kube-system pods need a PDB to be moved.
    let sys = PodBuilder::new("kube-system", "coredns")
        .label("k8s-app", "dns")
        .on("n")
        .build();
    let nodes = vec![node("n", Some(30)).build(), node("spare", None).build()];
    let mut s = snap(vec![sys], nodes);
    assert!(kept_reason(&sd(&s), "n").contains("kube-system pod without a PodDisruptionBudget"));
    s.pdbs.push(pdb("kube-system", "dns", "k8s-app", "dns", 1));
    assert_eq!(removed(&sd(&s)), ["n"]);
}

fn pdb(ns: &str, name: &str, k: &str, v: &str, allowed: i32) -> Pdb {
    Pdb {
        namespace: ns.into(),
        name: name.into(),
        selector: vec![Requirement {
            key: k.into(),
            operator: Operator::In,
            values: vec![v.into()],
        }],
        disruptions_allowed: allowed,
    }
}

#[test]
fn evicted_pods_must_fit_on_nodes_that_stay() {
    // n1 holds one 1-GPU pod; the only other node is full: n1 stays.
    let pods = vec![on("a", "n1", 1).build(), on("full", "n2", 4).build()];
    let p = sd(&snap(
        pods.clone(),
        vec![node("n1", Some(30)).build(), node("n2", None).build()],
    ));
    assert!(removed(&p).is_empty());
    assert!(kept_reason(&p, "n1").contains("ml/a would not fit on the nodes that remain"));

    // Two quarter-used unneeded nodes: one drains onto the other, which then stays.
    let pods = vec![on("a", "n1", 1).build(), on("b", "n2", 1).build()];
    let p = sd(&snap(
        pods,
        vec![node("n1", Some(30)).build(), node("n2", Some(30)).build()],
    ));
    assert_eq!(p.scale_downs.len(), 1);
    let gone = p.scale_downs[0].node.clone();
    let other = if gone == "n1" { "n2" } else { "n1" };
    assert_eq!(p.scale_downs[0].evict[0].to, other);
    assert!(kept_reason(&p, other).contains("receives pods evicted"));
}

#[test]
fn pod_disruption_budgets_are_counted_across_the_plan() {
    let pods = vec![
        on("a", "n1", 1).label("app", "x").build(),
        on("b", "n2", 1).label("app", "x").build(),
    ];
    let nodes = vec![
        node("n1", Some(30)).build(),
        node("n2", Some(30)).build(),
        node("spare1", None).build(),
        node("spare2", None).build(),
    ];
    let mut s = snap(pods, nodes);
    s.pdbs.push(pdb("ml", "x", "app", "x", 1));
    let p = sd(&s);
    assert_eq!(p.scale_downs.len(), 1, "{p:?}");
    let left = if p.scale_downs[0].node == "n1" {
        "n2"
    } else {
        "n1"
    };
    assert!(kept_reason(&p, left).contains("PodDisruptionBudget ml/x allows 0 more disruption(s)"));
    // A PDB in another namespace does not apply.
    s.pdbs[0].namespace = "other".into();
    assert_eq!(sd(&s).scale_downs.len(), 2);
}

#[test]
fn never_below_min_and_at_most_max_concurrent_drains() {
    let nodes: Vec<_> = (0..4)
        .map(|i| node(&format!("n{i}"), Some(30)).build())
        .collect();
    let text = SD_POLICY.replace("maxNodes: 100", "maxNodes: 100\n    minNodes: 2");
    let p = run(&snap(vec![], nodes.clone()), &text);
    assert_eq!(p.scale_downs.len(), 2);
    assert_eq!(p.kept.len(), 2);
    assert!(p.kept[0].reason.contains("at its minimum of 2 nodes"));
    assert_eq!(
        p.held_for_drains, 0,
        "kept for the minimum, not for a drain slot"
    );

    // One drain already running (tainted), at most 2: one more.
    let mut nodes = nodes;
    nodes.push(
        node("draining", None)
            .taint(
                labels::TO_BE_DELETED_TAINT,
                crate::model::Effect::NoSchedule,
            )
            .build(),
    );
    let text = SD_POLICY.replace("maxConcurrentDrains: 10", "maxConcurrentDrains: 2");
    let p = run(&snap(vec![], nodes), &text);
    assert_eq!(p.scale_downs.len(), 1);
    assert!(kept_reason(&p, "n3").contains("2 drains are already running or planned"));
    // The three others wait for a drain slot only: a later pass removes them.
    assert_eq!(p.held_for_drains, 3);
}

#[test]
fn empty_nodes_first_then_most_dollars_per_idle_gpu() {
    let text = SD_POLICY.replace("maxConcurrentDrains: 10", "maxConcurrentDrains: 2");
    let small = NodeBuilder::new("small")
        .pool("a10g", "g5.xlarge", "us-east-1a")
        .label(labels::CAPACITY_TYPE, "spot")
        .gpus(1)
        .created(NOW - 60 * MIN)
        .annotation(labels::UNNEEDED_SINCE, &(NOW - 30 * MIN).to_rfc3339())
        .build();
    // big: $2.27/h with 3 idle GPUs ($0.76 per idle GPU); on-demand big: $5.67/h, 3 idle ($1.89).
    let od = node("big-od", Some(30))
        .label(labels::CAPACITY_TYPE, "on-demand")
        .build();
    let pods = vec![on("a", "big", 1).build(), on("b", "big-od", 1).build()];
    let nodes = vec![
        node("big", Some(30)).build(),
        od,
        small,
        node("spare", None).build(),
    ];
    let p = run(&snap(pods, nodes), &text);
    assert_eq!(removed(&p), ["small", "big-od"]);
    assert!((p.scale_downs[1].saves_per_hour - 5.672).abs() < 1e-9);
}

fn arb_cluster() -> impl Strategy<Value = Snapshot> {
    (
        2usize..12,
        proptest::collection::vec((0usize..12, 1i64..3, 0u8..4, 0u8..3), 0..24),
        proptest::collection::vec(0u64..40, 12),
        0i32..3,
    )
        .prop_map(|(n, pods, since, allowed)| {
            let nodes = (0..n)
                .map(|i| {
                    let b =
                        node(&format!("n{i}"), Some(since[i])).created(NOW - mins(since[i] * 3));
                    if i % 2 == 0 {
                        b.build()
                    } else {
                        b.pool("a10g", "g5.12xlarge", "us-east-1b").build()
                    }
                })
                .collect();
            // Bound pods never exceed their node's 4 GPUs.
            let mut used = vec![0i64; n];
            let pods = pods
                .into_iter()
                .enumerate()
                .filter(|(_, (on_node, gpus, _, _))| {
                    let u = &mut used[on_node % n];
                    *u += gpus;
                    *u <= 4
                })
                .map(|(i, (on_node, gpus, kind, app))| {
                    let mut b = on(&format!("p{i}"), &format!("n{}", on_node % n), gpus)
                        .label("app", &format!("a{app}"));
                    b = match kind {
                        0 => b.bare(),
                        1 => b.annotation(labels::SAFE_TO_EVICT, "false"),
                        _ => b,
                    };
                    b.build()
                })
                .collect();
            let mut s = snap(pods, nodes);
            s.pdbs = (0..3)
                .map(|a| pdb("ml", &format!("a{a}"), "app", &format!("a{a}"), allowed))
                .collect();
            s
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn scale_down_never_breaks_a_rule(s in arb_cluster(), min in 0u32..4) {
        let text = SD_POLICY.replace("maxNodes: 100", &format!("maxNodes: 100\n    minNodes: {min}"));
        let p = run(&s, &text); // also checks capacity on the nodes that receive pods
        let pol = policy(&text);
        let pool = pol.pool("a10g").unwrap();
        let gone: BTreeSet<&str> = p.scale_downs.iter().map(|d| d.node.as_str()).collect();
        // Never below min (a pool already below it loses nothing).
        prop_assert!(gone.is_empty() || s.nodes.len() - gone.len() >= min as usize);
        let newest = s.nodes.iter().map(|n| n.created).max().unwrap();
        for d in &p.scale_downs {
            let n = s.nodes.iter().find(|n| n.name == d.node).unwrap();
            let since = Time::parse_rfc3339(&n.annotations[labels::UNNEEDED_SINCE]).unwrap();
            prop_assert!(since + pool.scale_down.unneeded_time <= NOW, "inside the delay");
            prop_assert!(newest + pool.scale_down.cooldown_after_scale_up <= NOW, "inside cooldown");
            // Every workload pod of the node is evicted, and each is movable.
            for pod in s.pods.iter().filter(|x| x.node_name.as_deref() == Some(&d.node)) {
                prop_assert!(d.evict.iter().any(|e| e.pod == pod.id.to_string()));
                prop_assert!(crate::plan::scale_down::not_movable(pod, &s).is_none());
            }
        }
        for b in &s.pdbs {
            let evicted = p.scale_downs.iter().flat_map(|d| &d.evict)
                .filter(|e| s.pods.iter().any(|x| x.id.to_string() == e.pod && b.selects(x)))
                .count() as i32;
            prop_assert!(evicted <= b.disruptions_allowed.max(0), "PDB {} violated", b.name);
        }
    }
}
