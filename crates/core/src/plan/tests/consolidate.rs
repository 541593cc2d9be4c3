//! GPU-aware consolidation: which running pods are planned again, onto what, and when not.

use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::model::{Node, OwnerKind, Pdb};
use crate::plan::consolidate::{consolidate, Consolidation};

const MIN: Duration = Duration::from_secs(60);

/// T4 nodes, on-demand only, one zone: one pod of 1 GPU and 10 CPUs takes a g4dn.4xlarge
/// ($1.204/h) alone; four of them fit a g4dn.12xlarge ($3.912/h).
const POLICY: &str = r#"
zones: [us-east-1a]
pools:
  - name: t4
    instanceTypes: [g4dn.4xlarge, g4dn.12xlarge]
    capacityTypes: [on-demand]
    maxNodes: 100
    consolidation: {enabled: true, consolidateAfter: 30m}
"#;

fn t4_node(name: &str) -> NodeBuilder {
    NodeBuilder::new(name)
        .pool("t4", "g4dn.4xlarge", "us-east-1a")
        .label(labels::CAPACITY_TYPE, "on-demand")
        .cpu_milli(15_800)
        .memory_gib(62)
        .gpus(1)
        .created(NOW - 240 * MIN)
}

fn server(name: &str, node: &str) -> PodBuilder {
    PodBuilder::new("serve", name)
        .gpus(1)
        .cpu_milli(10_000)
        .memory_gib(30)
        .created(NOW - 180 * MIN)
        .on(node)
}

fn four_alone(pod: impl Fn(&str, &str) -> PodBuilder) -> Snapshot {
    let names = ["n1", "n2", "n3", "n4"];
    snap(
        names
            .iter()
            .enumerate()
            .map(|(i, n)| pod(&format!("p{i}"), n).build())
            .collect(),
        names.iter().map(|n| t4_node(n).build()).collect(),
    )
}

fn run_consolidate(s: &Snapshot, text: &str) -> Result<Consolidation, String> {
    let p = policy(text);
    let c = catalog_for(&p);
    let templates = Templates::new(&p, &c).for_snapshot(s, NOW);
    consolidate(s, &templates, &p, &p.pools[0], NOW, 0)
}

#[test]
fn four_one_gpu_nodes_are_repacked_onto_one_four_gpu_node() {
    let c = run_consolidate(&four_alone(server), POLICY).unwrap();
    assert_eq!(c.nodes, ["n1", "n2", "n3", "n4"]);
    assert_eq!(c.pods.len(), 4);
    assert_eq!(c.launches, ["1 × g4dn.12xlarge us-east-1a on-demand"]);
    assert!((c.old_per_hour - 4.0 * 1.204).abs() < 1e-9, "{c:?}");
    assert!((c.new_per_hour - 3.912).abs() < 1e-9, "{c:?}");
    assert_eq!(c.horizon, 180 * MIN);
    assert!(
        c.describe().contains("saves $0.90/h (19%)"),
        "{}",
        c.describe()
    );
}

#[test]
fn three_do_not_pay_and_the_reason_says_so() {
    let s = four_alone(server);
    let mut three = s.clone();
    three.nodes.retain(|n| n.name != "n4");
    three.pods.retain(|p| p.node_name.as_deref() != Some("n4"));
    let why = run_consolidate(&three, POLICY).unwrap_err();
    assert!(why.contains("less than minSaving 10%"), "{why}");
}

#[test]
fn pods_that_have_not_run_long_enough_stay() {
    let s = four_alone(|p, n| server(p, n).created(NOW - 20 * MIN));
    let why = run_consolidate(&s, POLICY).unwrap_err();
    assert!(why.contains("run long enough"), "{why}");
}

/// A pod created long ago that started on its node only lately (it waited, or it was placed again
/// after its node went) has not run long enough, and its run so far counts from its start.
#[test]
fn a_pods_run_counts_from_its_start_on_its_node() {
    let s = four_alone(|p, n| server(p, n).started(NOW - 20 * MIN));
    let why = run_consolidate(&s, POLICY).unwrap_err();
    assert!(why.contains("run long enough"), "{why}");
    let s = four_alone(|p, n| server(p, n).started(NOW - 100 * MIN));
    let c = run_consolidate(&s, POLICY).unwrap();
    assert_eq!(c.horizon, 100 * MIN);
}

#[test]
fn job_pods_move_only_if_the_pool_moves_jobs_or_they_are_restartable() {
    let job = |p: &str, n: &str| server(p, n).owner(OwnerKind::Job, "train");
    assert!(run_consolidate(&four_alone(job), POLICY).is_err());
    let moves_jobs = POLICY.replace(
        "consolidateAfter: 30m",
        "consolidateAfter: 30m, moveJobs: true",
    );
    assert!(run_consolidate(&four_alone(job), &moves_jobs).is_ok());
    let restartable = |p: &str, n: &str| job(p, n).annotation(labels::RESTARTABLE, "true");
    assert!(run_consolidate(&four_alone(restartable), POLICY).is_ok());
    // A gang member is a job's pod too.
    let gang = |p: &str, n: &str| server(p, n).gang("serve/mpi", 4);
    assert!(run_consolidate(&four_alone(gang), POLICY).is_err());
}

#[test]
fn unmovable_pods_and_opted_out_nodes_stay() {
    let dnd = |p: &str, n: &str| {
        let b = server(p, n);
        if p == "p0" {
            b.annotation(labels::KARPENTER_DO_NOT_DISRUPT, "true")
        } else {
            b
        }
    };
    // Without n1, the other three do not pay.
    let why = run_consolidate(&four_alone(dnd), POLICY).unwrap_err();
    assert!(why.contains("minSaving"), "{why}");
    let mut s = four_alone(server);
    Arc::make_mut(&mut s.nodes[0].annotations)
        .insert(labels::SCALE_DOWN_DISABLED.into(), "true".into());
    assert!(run_consolidate(&s, POLICY)
        .unwrap_err()
        .contains("minSaving"));
}

#[test]
fn nothing_moves_while_gpu_pods_wait_or_launches_are_in_flight() {
    let mut s = four_alone(server);
    s.pods.push(PodBuilder::new("serve", "new").gpus(1).build());
    assert!(run_consolidate(&s, POLICY)
        .unwrap_err()
        .contains("pod serve/new waits"));
}

#[test]
fn a_move_must_pay_for_the_work_it_loses() {
    // Pods 40 minutes old are expected to run 40 more: $0.90/h over 40 minutes is less than
    // the old and new nodes ($8.73/h) over the 10 minutes a move is assumed to cost.
    let s = four_alone(|p, n| server(p, n).created(NOW - 40 * MIN));
    let why = run_consolidate(&s, POLICY).unwrap_err();
    assert!(why.contains("does not pay for moving ($1.45)"), "{why}");
    let cheap_moves = POLICY.replace(
        "consolidateAfter: 30m",
        "consolidateAfter: 30m, restartCost: 1m",
    );
    assert!(run_consolidate(&s, &cheap_moves).is_ok());
}

/// A g4dn.12xlarge (4 GPUs, $3.912/h) of the pool, four hours old.
fn big_t4_node(name: &str) -> Node {
    NodeBuilder::new(name)
        .pool("t4", "g4dn.12xlarge", "us-east-1a")
        .label(labels::CAPACITY_TYPE, "on-demand")
        .cpu_milli(47_000)
        .memory_gib(180)
        .gpus(4)
        .created(NOW - 240 * MIN)
        .build()
}

#[test]
fn pods_that_fit_the_room_of_nodes_that_stay_need_no_launch() {
    // A 4-GPU node with 3 free GPUs takes the pods of three small nodes: nothing is launched.
    let mut s = four_alone(server);
    s.nodes.retain(|n| n.name != "n4");
    s.pods.retain(|p| p.node_name.as_deref() != Some("n4"));
    s.nodes.push(big_t4_node("big"));
    s.pods.push(server("busy", "big").build());
    let c = run_consolidate(&s, POLICY).unwrap();
    assert_eq!(c.nodes, ["n1", "n2", "n3"]);
    assert!(c.launches.is_empty());
    assert_eq!(c.new_per_hour, 0.0);
}

/// One small node's long-running pod, and a 4-GPU node with room for one more whose own three
/// pods started `big_pod_age` ago (replacing it by three small nodes saves less than
/// `minSaving`).
fn small_beside_big(big_pod_age: Duration) -> Snapshot {
    let mut s = four_alone(server);
    s.nodes.retain(|n| n.name == "n1");
    s.pods.retain(|p| p.node_name.as_deref() == Some("n1"));
    s.nodes.push(big_t4_node("big"));
    for i in 0..3 {
        s.pods.push(
            server(&format!("train-{i}"), "big")
                .created(NOW - big_pod_age)
                .build(),
        );
    }
    s
}

#[test]
fn room_on_a_node_its_own_pods_leave_soon_is_not_free() {
    // The pod on n1 has run 3 h, so it is expected to run 3 h more; the 4-GPU node's own pods
    // started 5 minutes ago (expected: consolidateAfter, 30 m). Moving onto its room would keep
    // the $3.91/h node 2.5 h longer ($9.78) to save the $1.20/h one: no move.
    let s = small_beside_big(5 * MIN);
    let why = run_consolidate(&s, POLICY).unwrap_err();
    assert!(
        why.contains("keeping the nodes that take the pods longer ($9.78)"),
        "{why}"
    );
    // When the big node's own pods have run as long, it stays anyway: the room is free.
    let s = small_beside_big(180 * MIN);
    let c = run_consolidate(&s, POLICY).unwrap();
    assert_eq!(c.nodes, ["n1"]);
    assert!(c.launches.is_empty());
    assert_eq!(c.kept_longer_usd, 0.0);
}

#[test]
fn pod_disruption_budgets_bound_what_moves_at_once() {
    let mut s = four_alone(|p, n| server(p, n).label("app", "llm"));
    s.pdbs.push(Pdb {
        namespace: "serve".into(),
        name: "llm".into(),
        selector: vec![crate::model::Requirement {
            key: "app".into(),
            operator: Operator::In,
            values: vec!["llm".into()],
        }],
        disruptions_allowed: 1,
    });
    let why = run_consolidate(&s, POLICY).unwrap_err();
    assert!(
        why.contains("PodDisruptionBudget serve/llm allows 1 disruption(s), moving needs 4"),
        "{why}"
    );
}

#[test]
fn replicas_one_per_node_by_anti_affinity_are_not_repacked_onto_one_node() {
    use crate::model::topology::{AffinityTerm, PodTopology, HOSTNAME};
    let anti = PodTopology {
        anti_affinity: vec![AffinityTerm {
            selector: crate::fixtures::app_selector("serve", "srv"),
            topology_key: HOSTNAME.into(),
        }],
        ..Default::default()
    };
    let replica = |name: &str, node: &str| {
        server(name, node)
            .label("app", "srv")
            .topology(anti.clone())
    };
    // The same four nodes without the rule are repacked onto one g4dn.12xlarge (the test
    // above); with it, each replica needs a node of its own: the best repack is the same four
    // nodes, which saves nothing.
    let err = run_consolidate(&four_alone(replica), POLICY).unwrap_err();
    assert!(err.contains("saves $0.00/h"), "{err}");
}
