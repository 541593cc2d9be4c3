//! Capacity reservations as offerings: filled first at no marginal cost, up to their count,
//! Capacity Blocks only inside their window.

use std::collections::BTreeMap;

use gpu_node_autoscaler_provider::{Reservation, ReservationKind};

use super::*;

const RESERVED: &str = r#"
zones: [us-east-1a, us-east-1b]
pools:
  - name: h100
    instanceTypes: [p5.48xlarge]
    capacityTypes: [reserved, on-demand]
    capacityReservations: [{id: cr-0aaa}, {tags: {team: ml}}]
    maxNodes: 10
"#;

fn reservation(id: &str, kind: ReservationKind, zone: &str, available: u32) -> Reservation {
    Reservation {
        id: id.into(),
        kind,
        instance_type: "p5.48xlarge".into(),
        zone: zone.into(),
        total: available.max(4),
        available,
        start_ms: None,
        end_ms: None,
        tags: BTreeMap::new(),
        price_per_hour: Some(31.46),
    }
}

fn h100_pods(n: usize) -> Vec<Pod> {
    (0..n)
        .map(|i| gpu_pod(&format!("train-{i}"), 8).build())
        .collect()
}

fn with_reservations(n: usize, rs: Vec<Reservation>) -> Snapshot {
    Snapshot {
        reservations: rs,
        ..snap(h100_pods(n), Vec::new())
    }
}

/// (capacity type of the first offering, its price, count) of every scale-up.
fn launches(plan: &Plan) -> Vec<(String, f64, u32)> {
    let mut v: Vec<_> = plan
        .scale_ups
        .iter()
        .map(|s| {
            let o = &s.offerings[0];
            (
                o.capacity_type.as_str().to_string(),
                o.price_per_hour,
                s.count,
            )
        })
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

#[test]
fn reserved_offerings_are_filled_first_at_zero_cost_then_on_demand() {
    let s = with_reservations(
        3,
        vec![reservation(
            "cr-0aaa",
            ReservationKind::Default,
            "us-east-1b",
            2,
        )],
    );
    let plan = run(&s, RESERVED);
    let l = launches(&plan);
    assert_eq!(l.len(), 2, "{l:?}");
    assert_eq!(l[0].0, "on-demand");
    assert_eq!(l[0].2, 1, "one node beyond the reservation's count: {l:?}");
    assert_eq!((l[1].0.as_str(), l[1].1, l[1].2), ("reserved", 0.0, 2));
    let reserved = plan
        .scale_ups
        .iter()
        .find(|s| s.offerings[0].capacity_type == CapacityType::Reserved)
        .unwrap();
    assert_eq!(reserved.offerings[0].zone, "us-east-1b");
    // Only the on-demand node costs anything.
    assert!((plan.added_cost_per_hour - 55.04).abs() < 1e-6, "{plan:?}");
}

#[test]
fn a_reservation_used_up_or_not_selected_is_no_offering() {
    // Used up: nothing left to launch into.
    let s = with_reservations(
        2,
        vec![reservation(
            "cr-0aaa",
            ReservationKind::Default,
            "us-east-1a",
            0,
        )],
    );
    let l = launches(&run(&s, RESERVED));
    assert_eq!(l, vec![("on-demand".to_string(), 55.04, 2)]);
    // Another team's reservation (neither its id nor its tags selected).
    let mut other = reservation("cr-0bbb", ReservationKind::Default, "us-east-1a", 4);
    other.tags.insert("team".into(), "search".into());
    let l = launches(&run(&with_reservations(2, vec![other.clone()]), RESERVED));
    assert_eq!(l, vec![("on-demand".to_string(), 55.04, 2)]);
    // Selected by its tags: two counts of reservations of one offering add up.
    other.tags.insert("team".into(), "ml".into());
    let s = with_reservations(
        3,
        vec![
            other,
            reservation("cr-0aaa", ReservationKind::Default, "us-east-1a", 1),
        ],
    );
    let l = launches(&run(&s, RESERVED));
    assert_eq!(l, vec![("reserved".to_string(), 0.0, 3)]);
}

#[test]
fn a_pool_without_reserved_capacity_type_never_plans_a_reservation() {
    let s = with_reservations(
        1,
        vec![reservation(
            "cr-0aaa",
            ReservationKind::Default,
            "us-east-1a",
            4,
        )],
    );
    let l = launches(&run(
        &s,
        &RESERVED
            .replace("[reserved, on-demand]", "[on-demand]")
            .replace(
                "    capacityReservations: [{id: cr-0aaa}, {tags: {team: ml}}]\n",
                "",
            ),
    ));
    assert_eq!(l, vec![("on-demand".to_string(), 55.04, 1)]);
}

#[test]
fn a_capacity_block_is_offered_between_its_start_and_its_drain_lead_before_the_end() {
    let min = 60_000;
    let block = |start: i64, end: i64| {
        let mut r = reservation("cr-0aaa", ReservationKind::CapacityBlock, "us-east-1a", 2);
        r.start_ms = Some(start);
        r.end_ms = Some(end);
        r
    };
    let at = |r: Reservation| launches(&run(&with_reservations(1, vec![r]), RESERVED));
    let od = vec![("on-demand".to_string(), 55.04, 1)];
    let rsv = vec![("reserved".to_string(), 0.0, 1)];
    // Not started yet.
    assert_eq!(at(block(NOW.0 + min, NOW.0 + 600 * min)), od);
    // Started, ends in more than the default 30 minutes.
    assert_eq!(at(block(NOW.0 - min, NOW.0 + 31 * min)), rsv);
    // Within 30 minutes of its end: a node there would be drained at once.
    assert_eq!(at(block(NOW.0 - min, NOW.0 + 29 * min)), od);
    // An ODCR with an end date is offered to its end.
    let mut odcr = block(NOW.0 - min, NOW.0 + 29 * min);
    odcr.kind = ReservationKind::Default;
    assert_eq!(at(odcr), rsv);
}

/// An empty p5.48xlarge of the pool in a reservation, unneeded for an hour.
fn empty_reserved_node() -> crate::model::Node {
    NodeBuilder::new("reserved-1")
        .pool("h100", "p5.48xlarge", "us-east-1a")
        .label(labels::CAPACITY_TYPE, "reserved")
        .cpu_milli(191_000)
        .memory_gib(2000)
        .gpus(8)
        .created(Time(NOW.0 - 7_200_000))
        .annotation(
            labels::UNNEEDED_SINCE,
            &Time(NOW.0 - 3_600_000).to_rfc3339(),
        )
        .build()
}

#[test]
fn an_empty_reserved_node_is_removed_unless_its_pool_keeps_reserved_warm() {
    let s = Snapshot {
        reservations: vec![reservation(
            "cr-0aaa",
            ReservationKind::Default,
            "us-east-1a",
            0,
        )],
        ..snap(Vec::new(), vec![empty_reserved_node()])
    };
    let plan = run(&s, RESERVED);
    let removed: Vec<&str> = plan.scale_downs.iter().map(|d| d.node.as_str()).collect();
    assert_eq!(removed, ["reserved-1"], "{plan:?}");
    // Its reservation is paid anyway: nothing saved by removing it.
    assert_eq!(plan.scale_downs[0].saves_per_hour, 0.0);
    let warm = RESERVED.replace(
        "    maxNodes: 10\n",
        "    maxNodes: 10\n    keepReservedWarm: true\n",
    );
    let plan = run(&s, &warm);
    assert!(plan.scale_downs.is_empty(), "{plan:?}");
    assert!(
        plan.kept
            .iter()
            .any(|k| k.node == "reserved-1" && k.reason.contains("keepReservedWarm")),
        "{:?}",
        plan.kept
    );
}

/// A Capacity Block of 2 in `zone`, started an hour ago, ending in `hours` hours.
fn capacity_block_ending_in(hours: i64, zone: &str) -> Reservation {
    let mut r = reservation("cr-0aaa", ReservationKind::CapacityBlock, zone, 2);
    r.start_ms = Some(NOW.0 - 3_600_000);
    r.end_ms = Some(NOW.0 + hours * 3_600_000);
    r
}

/// One H100 training pod, annotated with its expected run time when given.
fn pod_running_for(run_time: Option<&str>) -> Pod {
    let p = gpu_pod("train-0", 8);
    match run_time {
        Some(v) => p.annotation(labels::EXPECTED_RUN_TIME, v),
        None => p,
    }
    .build()
}

fn plan_one(pod: Pod, rs: Vec<Reservation>, policy: &str) -> Vec<(String, f64, u32)> {
    let s = Snapshot {
        reservations: rs,
        ..snap(vec![pod], Vec::new())
    };
    launches(&run(&s, policy))
}

#[test]
fn a_pod_expected_to_outlive_a_capacity_block_is_planned_on_another_offering() {
    // The block ends in 3 h: its nodes are drained from 2 h 30 m (capacityBlockDrainLead 30m).
    let block = || vec![capacity_block_ending_in(3, "us-east-1a")];
    let od = vec![("on-demand".to_string(), 55.04, 1)];
    let rsv = vec![("reserved".to_string(), 0.0, 1)];
    // Done before the drain: the block.
    assert_eq!(
        plan_one(pod_running_for(Some("2h")), block(), RESERVED),
        rsv
    );
    // Still running at the drain: on-demand from the start, not moved later.
    assert_eq!(
        plan_one(pod_running_for(Some("2h45m")), block(), RESERVED),
        od
    );
    // No run time known: the block is preferred and the move planned at its end.
    assert_eq!(plan_one(pod_running_for(None), block(), RESERVED), rsv);
    // The pool's default, where the pod does not say; the pod's own run time comes first.
    let pool_default = RESERVED.replace(
        "    maxNodes: 10\n",
        "    maxNodes: 10\n    expectedRunTime: 4h\n",
    );
    assert_eq!(plan_one(pod_running_for(None), block(), &pool_default), od);
    assert_eq!(
        plan_one(pod_running_for(Some("1h")), block(), &pool_default),
        rsv
    );
    // Nothing else can take it: the block still does (and its end moves the pod).
    let reserved_only = RESERVED.replace("[reserved, on-demand]", "[reserved]");
    assert_eq!(
        plan_one(pod_running_for(Some("12h")), block(), &reserved_only),
        rsv
    );
}

#[test]
fn a_pod_outliving_a_capacity_block_goes_to_a_reservation_without_end() {
    // The block in us-east-1a ends too soon; the ODCR in us-east-1b runs on.
    let rs = vec![
        capacity_block_ending_in(3, "us-east-1a"),
        reservation("cr-0odcr", ReservationKind::Default, "us-east-1b", 1),
    ];
    let policy = RESERVED.replace("{id: cr-0aaa}", "{id: cr-0aaa}, {id: cr-0odcr}");
    let s = Snapshot {
        reservations: rs,
        ..snap(vec![pod_running_for(Some("6h"))], Vec::new())
    };
    let plan = run(&s, &policy);
    assert_eq!(plan.scale_ups.len(), 1, "{plan:?}");
    let o = &plan.scale_ups[0].offerings[0];
    assert_eq!(
        (o.capacity_type, o.zone.as_str()),
        (CapacityType::Reserved, "us-east-1b"),
        "{plan:?}"
    );
    // Both reservations in one offering: the one without end is launched into first.
    let mut odcr = reservation("cr-0odcr", ReservationKind::Default, "us-east-1a", 1);
    odcr.tags.insert("team".into(), "ml".into());
    assert_eq!(
        plan_one(
            pod_running_for(Some("6h")),
            vec![capacity_block_ending_in(3, "us-east-1a"), odcr],
            RESERVED
        ),
        vec![("reserved".to_string(), 0.0, 1)]
    );
}

#[test]
fn a_capacity_block_run_time_annotation_that_is_no_duration_is_planned_as_without_it() {
    let bad = pod_running_for(Some("two hours"));
    let err = bad.expected_run_time().unwrap_err();
    assert!(
        err.contains("gpu-node-autoscaler.io/expected-run-time") && err.contains("two hours"),
        "{err}"
    );
    assert!(pod_running_for(Some("0s")).expected_run_time().is_err());
    assert_eq!(
        pod_running_for(Some("90m")).expected_run_time(),
        Ok(Some(std::time::Duration::from_secs(5400)))
    );
    // Planned as without it: onto the block (not left out, not on-demand).
    assert_eq!(
        plan_one(
            bad,
            vec![capacity_block_ending_in(3, "us-east-1a")],
            RESERVED
        ),
        vec![("reserved".to_string(), 0.0, 1)]
    );
}
