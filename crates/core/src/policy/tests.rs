//! Policy parsing and validation: the example file, defaults, and a `FILE:LINE:COL: message`
//! for every class of error.

use std::time::Duration;

use super::*;
use gpu_node_autoscaler_alibaba::settings::AlibabaPoolSettings;
use gpu_node_autoscaler_aws::settings::{AwsPoolSettings, LaunchTemplate, LaunchTemplateBy};

/// The providers these tests validate with: each with its checks, as the programs that read
/// policies (the CLI, the controller) do.
static PROVIDERS: &[&dyn ProviderPolicy] = &[
    &gpu_node_autoscaler_aws::settings::POLICY,
    &gpu_node_autoscaler_alibaba::settings::POLICY,
    &NameOnly::with_section("kwok", "kwok"),
    &NameOnly::new("memory"),
];

/// [`super::parse_policy`] with every provider's checks ([`PROVIDERS`]).
fn parse_policy(text: &str, file: &str) -> Result<Policy, PolicyErrors> {
    parse_policy_with(text, file, PROVIDERS)
}

/// A pool's `aws:` section, as the AWS provider reads it.
fn aws_of(pool: &Pool) -> Option<AwsPoolSettings> {
    let s = pool.settings.as_ref().filter(|_| pool.provider == "aws")?;
    Some(AwsPoolSettings::from_section(s).unwrap())
}

/// A pool's `alibaba:` section, as the Alibaba Cloud provider reads it.
fn alibaba_of(pool: &Pool) -> Option<AlibabaPoolSettings> {
    let s = pool
        .settings
        .as_ref()
        .filter(|_| pool.provider == "alibaba")?;
    Some(AlibabaPoolSettings::from_section(s).unwrap())
}

const FILE: &str = "policy.yaml";
const EXAMPLE: &str = include_str!("../../../../docs/examples/policy.yaml");

/// Joins lines with `\n`, so that `lines[i]` is line `i + 1` of the text.
fn yaml(lines: &[&str]) -> String {
    let mut s = lines.join("\n");
    s.push('\n');
    s
}

fn parse_ok(text: &str) -> Policy {
    parse_policy(text, FILE).unwrap_or_else(|e| panic!("expected a valid policy, got:\n{e}"))
}

fn parse_err(text: &str) -> PolicyErrors {
    match parse_policy(text, FILE) {
        Ok(p) => panic!("expected errors, got {p:#?}"),
        Err(e) => {
            assert_eq!(e.file, FILE);
            e
        }
    }
}

/// `(line, col, message)` of every error.
fn positions(e: &PolicyErrors) -> Vec<(usize, usize, &str)> {
    e.errors
        .iter()
        .map(|e| (e.line, e.col, e.message.as_str()))
        .collect()
}

/// Each case's lines, put into a policy by `policy`, give exactly one error, at `(line, col)`,
/// containing the phrase.
fn assert_one_error_each(
    cases: Vec<(Vec<&str>, (usize, usize), &str)>,
    policy: fn(&[&str]) -> String,
) {
    let mut failures = Vec::new();
    for (lines, at, phrase) in cases {
        let e = parse_err(&policy(&lines));
        let got = positions(&e);
        if !matches!(got.as_slice(), [(l, c, m)] if (*l, *c) == at && m.contains(phrase)) {
            failures.push(format!(
                "want one error at {at:?} containing {phrase:?}, got:\n{e}"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

fn mins(m: u64) -> Duration {
    Duration::from_secs(60 * m)
}

/// A valid one-pool policy; `extra` lines go into the pool, starting on line 6.
fn one_pool(extra: &[&str]) -> String {
    let mut lines = vec![
        "zones: [us-east-1a]",            // 1
        "pools:",                         // 2
        "  - name: a",                    // 3
        "    instanceTypes: [g5.xlarge]", // 4
        "    maxNodes: 3",                // 5
    ];
    lines.extend_from_slice(extra);
    yaml(&lines)
}

// ---- the example file and defaults ----

#[test]
fn example_policy_parses_with_defaults_applied() {
    let p = parse_ok(EXAMPLE);
    assert_eq!(p.cluster_name, "ml-prod");
    assert_eq!(p.region.as_deref(), Some("us-east-1"));
    assert_eq!(
        p.limits,
        Limits {
            max_gpus: Some(256),
            max_nodes: Some(200)
        }
    );
    assert_eq!(
        p.batching,
        Batching {
            idle: Duration::from_secs(1),
            max: Duration::from_secs(10)
        }
    );
    assert_eq!(p.max_node_provision_time, mins(15));
    assert_eq!(p.insufficient_capacity_ttl, mins(3));
    assert_eq!(p.max_concurrent_drains, 5);
    assert_eq!(p.spot_price_ratio, 0.4);

    let names: Vec<&str> = p.pools.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["a10g", "a100-train", "a100-mig", "t4-shared"]);
    let all_zones = ["us-east-1a", "us-east-1b", "us-east-1c"];
    let gpu_taint = Taint {
        key: "nvidia.com/gpu".into(),
        value: "true".into(),
        effect: Effect::NoSchedule,
    };

    // Every pool gets the scale-down defaults it does not override.
    for pool in &p.pools {
        assert_eq!(pool.provider, "aws", "{}", pool.name);
        assert!(pool.scale_down.enabled, "{}", pool.name);
        assert_eq!(
            pool.scale_down.cooldown_after_scale_up,
            mins(10),
            "{}",
            pool.name
        );
        assert_eq!(pool.scale_down.utilization_threshold, 0.5, "{}", pool.name);
        assert_eq!(
            pool.scale_down.backoff_after_failure,
            mins(3),
            "{}",
            pool.name
        );
        assert_eq!(pool.reserved_cpu_milli, 200, "{}", pool.name);
        assert_eq!(pool.reserved_memory, 1 << 30, "{}", pool.name);
        assert_eq!(pool.max_pods, 110, "{}", pool.name);
    }

    let a10g = p.pool("a10g").unwrap();
    assert_eq!(
        a10g.instance_types.as_deref(),
        Some(&["g5.xlarge", "g5.2xlarge", "g5.12xlarge", "g5.48xlarge"].map(String::from)[..])
    );
    assert_eq!(a10g.zones, all_zones);
    assert_eq!(
        a10g.capacity_types,
        [CapacityType::Spot, CapacityType::OnDemand]
    );
    assert_eq!(
        (a10g.min_nodes, a10g.max_nodes, a10g.max_gpus),
        (0, 40, Some(96))
    );
    assert_eq!(a10g.labels.get("workload").map(String::as_str), Some("gpu"));
    assert_eq!(a10g.taints, std::slice::from_ref(&gpu_taint));
    assert_eq!(a10g.gpu_mode, GpuMode::Whole);
    assert_eq!(a10g.scale_down.unneeded_time, mins(10));

    // The pool that lists nothing optional, compared in full.
    let train = p.pool("a100-train").unwrap();
    assert_eq!(
        *train,
        Pool {
            name: "a100-train".into(),
            provider: "aws".into(),
            instance_types: None,
            requirements: Some(Requirements {
                gpu_models: vec!["A100".into()],
                min_gpus: 8,
                max_gpus: 8,
                families: vec![],
            }),
            zones: vec!["us-east-1a".into(), "us-east-1b".into()],
            capacity_types: vec![CapacityType::OnDemand],
            min_nodes: 0,
            max_nodes: 8,
            max_gpus: None,
            labels: BTreeMap::new(),
            taints: vec![gpu_taint.clone()],
            startup_taints: Vec::new(),
            node_selector: BTreeMap::new(),
            gpu_mode: GpuMode::Whole,
            prices: BTreeMap::new(),
            reserved_cpu_milli: 200,
            reserved_memory: 1 << 30,
            max_pods: 110,
            priority: 0,
            scale_down: ScaleDown {
                enabled: true,
                cooldown_after_scale_up: mins(10),
                unneeded_time: mins(10),
                empty_unneeded_time: mins(10),
                utilization_threshold: 0.5,
                backoff_after_failure: mins(3),
            },
            consolidation: Consolidation::default(),
            replace_on_rebalance: false,
            spot_max_wait: Duration::ZERO,
            capacity_reservations: Vec::new(),
            keep_reserved_warm: false,
            capacity_block_drain_lead: mins(30),
            expected_run_time: None,
            templates_from_cloud: false,
            cloud_templates: Vec::new(),
            health: Health {
                enabled: true,
                conditions: vec![HealthCondition {
                    type_: "AcceleratedHardwareReady".into(),
                    status: "False".into(),
                    grace: mins(10),
                }],
                missing_gpus_grace: mins(10),
                max_replacing_share: 0.2,
                xid_codes: vec![48, 63, 64, 74, 79, 94, 95],
                xid_grace: mins(2),
            },
            disruption: Disruption::default(),
            settings: None,
            dra: None,
        }
    );

    let mig = p.pool("a100-mig").unwrap();
    assert_eq!(mig.gpu_mode, GpuMode::Mig(vec![("1g.5gb".into(), 7)]));
    assert_eq!(mig.zones, ["us-east-1a"]);
    assert_eq!(mig.max_nodes, 2);

    let shared = p.pool("t4-shared").unwrap();
    assert_eq!(
        shared.gpu_mode,
        GpuMode::Shared {
            core_percentage: 100
        }
    );
    assert_eq!(shared.zones, all_zones);
    assert_eq!(shared.scale_down.unneeded_time, mins(5));
    assert_eq!(
        shared.labels.get("gpu-sharing").map(String::as_str),
        Some("true")
    );
}

#[test]
fn minimal_policy_gets_every_default() {
    let p = parse_ok(&one_pool(&[]));
    assert_eq!(p.cluster_name, "default");
    assert_eq!(p.region, None);
    assert_eq!(p.limits, Limits::default());
    assert_eq!(p.batching.idle, defaults::BATCH_IDLE);
    assert_eq!(p.batching.max, defaults::BATCH_MAX);
    assert_eq!(p.max_node_provision_time, mins(15));
    assert_eq!(p.insufficient_capacity_ttl, mins(3));
    assert_eq!(p.max_concurrent_drains, 10);
    assert_eq!(p.spot_price_ratio, 0.4);
    let pool = &p.pools[0];
    assert_eq!(pool.provider, "aws");
    assert_eq!(pool.zones, ["us-east-1a"]);
    assert_eq!(pool.capacity_types, [CapacityType::OnDemand]);
    assert_eq!(pool.gpu_mode, GpuMode::Whole);
    assert_eq!((pool.min_nodes, pool.max_nodes), (0, 3));
    assert_eq!(
        pool.scale_down,
        ScaleDown {
            enabled: true,
            cooldown_after_scale_up: mins(10),
            unneeded_time: mins(10),
            empty_unneeded_time: mins(10),
            utilization_threshold: 0.5,
            backoff_after_failure: mins(3),
        }
    );
}

#[test]
fn optional_pool_fields_are_read() {
    let p = parse_ok(&one_pool(&[
        "    provider: alibaba",
        "    alibaba: {scalingGroupId: asg-1, vSwitches: {z1: vsw-1, z2: vsw-2}}",
        "    requirements: {gpuModels: [T4, A10], gpuCount: {min: 2}, families: [ecs]}",
        "    zones: [z1, z2]",
        "    gpuMode: shared",
        "    sharedGpu: {corePercentage: 50}",
        "    prices: {g5.xlarge: {onDemand: 1.5, spot: 0.5}}",
        "    reserved: {cpu: 500m, memory: 2Gi}",
        "    maxPods: 58",
        "    priority: -3",
        "    scaleDown: {enabled: false, backoffAfterFailure: 1m30s, utilizationThreshold: 0}",
    ]));
    let pool = &p.pools[0];
    assert_eq!(pool.provider, "alibaba");
    let req = pool.requirements.as_ref().unwrap();
    assert_eq!(req.gpu_models, ["T4", "A10"]);
    assert_eq!((req.min_gpus, req.max_gpus), (2, u32::MAX));
    assert_eq!(req.families, ["ecs"]);
    assert_eq!(
        pool.zones,
        ["z1", "z2"],
        "pool zones replace the top-level ones"
    );
    assert_eq!(
        pool.gpu_mode,
        GpuMode::Shared {
            core_percentage: 50
        }
    );
    assert_eq!(
        pool.prices.get("g5.xlarge"),
        Some(&PriceOverride {
            on_demand: Some(1.5),
            spot: Some(0.5)
        })
    );
    assert_eq!(pool.reserved_cpu_milli, 500);
    assert_eq!(pool.reserved_memory, 2 << 30);
    assert_eq!(pool.max_pods, 58);
    assert_eq!(pool.priority, -3);
    assert!(!pool.scale_down.enabled);
    assert_eq!(
        pool.scale_down.backoff_after_failure,
        Duration::from_secs(90)
    );
    assert_eq!(pool.scale_down.utilization_threshold, 0.0);
}

#[test]
fn reserved_capacity_type_with_capacity_reservations_parses() {
    let p = parse_ok(&one_pool(&[
        "    capacityTypes: [reserved, spot, on-demand]",
        "    capacityReservations: [{id: cr-0abc}, {tags: {team: ml, kind: block}}]",
        "    keepReservedWarm: true",
        "    capacityBlockDrainLead: 45m",
        "    expectedRunTime: 6h",
    ]));
    let pool = &p.pools[0];
    assert_eq!(
        pool.capacity_types,
        [
            CapacityType::Reserved,
            CapacityType::Spot,
            CapacityType::OnDemand
        ]
    );
    assert_eq!(
        pool.capacity_reservations,
        [
            ReservationSelector::Id("cr-0abc".into()),
            ReservationSelector::Tags(BTreeMap::from([
                ("kind".to_string(), "block".to_string()),
                ("team".to_string(), "ml".to_string())
            ]))
        ]
    );
    assert!(pool.keep_reserved_warm);
    assert_eq!(pool.capacity_block_drain_lead, Duration::from_secs(45 * 60));
    assert_eq!(pool.expected_run_time, Some(Duration::from_secs(6 * 3600)));
    // Defaults.
    let p = parse_ok(&one_pool(&[
        "    capacityTypes: [reserved]",
        "    capacityReservations: [{id: cr-0abc}]",
    ]));
    assert!(!p.pools[0].keep_reserved_warm);
    assert_eq!(p.pools[0].expected_run_time, None);
    assert_eq!(
        p.pools[0].capacity_block_drain_lead,
        Duration::from_secs(30 * 60)
    );
}

#[test]
fn reservation_report_lists_each_selected_reservation_and_what_matches_none() {
    use gpu_node_autoscaler_provider::{Reservation, ReservationKind};
    let p = parse_ok(&one_pool(&[
        "    capacityTypes: [reserved, on-demand]",
        "    capacityReservations: [{id: cr-0odcr}, {tags: {team: ml}}, {id: cr-0gone}]",
    ]));
    let r = |id: &str, kind, t: &str, zone: &str, tags: &[(&str, &str)]| Reservation {
        id: id.into(),
        kind,
        instance_type: t.into(),
        zone: zone.into(),
        total: 4,
        available: 3,
        start_ms: None,
        end_ms: None,
        tags: tags
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        price_per_hour: None,
    };
    let mut block = r(
        "cr-0block",
        ReservationKind::CapacityBlock,
        "g5.xlarge",
        "us-east-1a",
        &[("team", "ml")],
    );
    block.start_ms = Some(1_796_000_000_000);
    block.end_ms = Some(1_796_086_400_000);
    let account = [
        r(
            "cr-0odcr",
            ReservationKind::Default,
            "g5.xlarge",
            "us-east-1a",
            &[],
        ),
        block,
        r(
            "cr-0other",
            ReservationKind::Default,
            "p5.48xlarge",
            "us-east-1b",
            &[("team", "ml")],
        ),
        r(
            "cr-0notselected",
            ReservationKind::Default,
            "g5.xlarge",
            "us-east-1a",
            &[],
        ),
    ];
    let (lines, problems) = reservation_report(&p, "aws", &account);
    assert_eq!(
        lines,
        [
            "pool a: reservation cr-0odcr (default): g5.xlarge in us-east-1a, 3/4 available, \
             from now until no end",
            "pool a: reservation cr-0block (capacity-block): g5.xlarge in us-east-1a, 3/4 \
             available, from 2026-11-30T00:53:20Z until 2026-12-01T00:53:20Z",
            "pool a: reservation cr-0other (default): p5.48xlarge in us-east-1b, 3/4 available, \
             from now until no end",
        ]
    );
    assert_eq!(
        problems,
        [
            "pool a: capacityReservations[1]: reservation cr-0other is p5.48xlarge in \
             us-east-1b, which the pool does not launch (instanceTypes, zones): it is never used",
            "pool a: capacityReservations[2]: no capacity reservation cr-0gone in the account",
        ]
    );
    // Another provider's pools are not this provider's to report.
    assert_eq!(reservation_report(&p, "kwok", &account), (vec![], vec![]));
}

#[test]
fn reserved_quantities_accept_numbers_and_round_up() {
    let p = parse_ok(&one_pool(&["    reserved: {cpu: 0.25, memory: 1000}"]));
    assert_eq!(p.pools[0].reserved_cpu_milli, 250);
    assert_eq!(p.pools[0].reserved_memory, 1000);
    let p = parse_ok(&one_pool(&["    reserved: {cpu: 1.0001, memory: 0.5}"]));
    assert_eq!(p.pools[0].reserved_cpu_milli, 1001);
    assert_eq!(p.pools[0].reserved_memory, 1);
}

// ---- one error per class, with its exact position ----

struct Case {
    what: &'static str,
    text: String,
    /// Position of the offending key (or item).
    at: (usize, usize),
    /// A phrase the message must contain.
    phrase: &'static str,
}

fn case(what: &'static str, text: String, at: (usize, usize), phrase: &'static str) -> Case {
    Case {
        what,
        text,
        at,
        phrase,
    }
}

fn error_cases() -> Vec<Case> {
    vec![
        case(
            "interruption queue that is no URL",
            one_pool(&["interruptionQueue: prod-gpu-interruptions"]),
            (6, 1),
            "is not a queue URL",
        ),
        case(
            "empty unneeded time longer than unneeded time",
            one_pool(&["    scaleDown: {unneededTime: 5m, emptyUnneededTime: 10m}"]),
            (6, 35),
            "longer than unneededTime",
        ),
        case(
            "spot max wait without spot",
            one_pool(&["    spotMaxWait: 10m"]),
            (6, 5),
            "needs capacityTypes with both spot and on-demand",
        ),
        case(
            "consolidation saving out of range",
            one_pool(&["    consolidation: {enabled: true, minSaving: 1.5}"]),
            (6, 36),
            "pools[0].consolidation.minSaving: must be a share in (0, 1), got 1.5",
        ),
        case(
            "consolidation of no node",
            one_pool(&["    consolidation:", "      maxNodes: 0"]),
            (7, 7),
            "pools[0].consolidation.maxNodes: must be at least 1",
        ),
        case(
            "consolidation restart cost",
            one_pool(&["    consolidation: {restartCost: ten minutes}"]),
            (6, 21),
            "pools[0].consolidation.restartCost: invalid duration \"ten minutes\"",
        ),
        case(
            "gpu metrics without a URL",
            one_pool(&["gpuMetrics: {prometheusUrl: prometheus:9090}"]),
            (6, 14),
            "is not the base URL of a Prometheus",
        ),
        case(
            "gpu metrics selector in braces",
            one_pool(&["gpuMetrics: {prometheusUrl: http://p:9090, selector: '{job=\"x\"}'}"]),
            (6, 44),
            "label matchers without braces",
        ),
        case(
            "gpu metrics node label",
            one_pool(&["gpuMetrics: {prometheusUrl: http://p:9090, nodeLabel: node-name}"]),
            (6, 44),
            "is not a Prometheus label name",
        ),
        case(
            "health condition on Ready",
            one_pool(&["    health: {conditions: [{type: Ready, status: \"False\"}]}"]),
            (6, 28),
            "a condition type other than Ready",
        ),
        case(
            "health condition status",
            one_pool(&["    health: {conditions: [{type: GpuDown, status: \"Bad\"}]}"]),
            (6, 43),
            "must be True, False or Unknown",
        ),
        case(
            "interruption condition status",
            one_pool(&["interruptionConditions: [{type: InstanceExpired, status: \"Yes\"}]"]),
            (6, 50),
            "must be True, False or Unknown",
        ),
        case(
            "interruption condition on Ready",
            one_pool(&["interruptionConditions: [{type: Ready, status: \"True\"}]"]),
            (6, 27),
            "a condition type other than Ready",
        ),
        case(
            "health share out of range",
            one_pool(&["    health: {maxReplacingShare: 1.5}"]),
            (6, 14),
            "must be in (0, 1]",
        ),
        case(
            "unknown top-level field",
            one_pool(&["scaledown: {enabled: false}"]),
            (6, 1),
            "scaledown: unknown field `scaledown`, expected one of",
        ),
        case(
            "unknown nested top-level field",
            one_pool(&["batching: {idle: 1s, maxWait: 5s}"]),
            (6, 22),
            "batching.maxWait: unknown field `maxWait`",
        ),
        case(
            "unknown pool field (typo)",
            yaml(&[
                "zones: [us-east-1a]",
                "pools:",
                "  - name: a",
                "    instanceTypes: [g5.xlarge]",
                "    maxNode: 3",
            ]),
            (5, 5),
            "pools[0].maxNode: unknown field `maxNode`, expected one of",
        ),
        case(
            "unknown field in scaleDown",
            one_pool(&["    scaleDown:", "      unneded: 5m"]),
            (7, 7),
            "pools[0].scaleDown.unneded: unknown field `unneded`",
        ),
        case(
            "min > max",
            yaml(&[
                "zones: [us-east-1a]",
                "pools:",
                "  - name: a",
                "    instanceTypes: [g5.xlarge]",
                "    minNodes: 5",
                "    maxNodes: 2",
            ]),
            (5, 5),
            "pools[0].minNodes: minNodes (5) is greater than maxNodes (2)",
        ),
        case(
            "gpu-core percentage not a multiple of 5",
            one_pool(&["    gpuMode: shared", "    sharedGpu: {corePercentage: 33}"]),
            (7, 17),
            "pools[0].sharedGpu.corePercentage: gpu-core percentage must be a multiple of 5 in \
             5..=100, got 33",
        ),
        case(
            "gpu-core percentage over 100",
            one_pool(&[
                "    gpuMode: shared",
                "    sharedGpu: {corePercentage: 105}",
            ]),
            (7, 17),
            "got 105",
        ),
        case(
            "gpu-core percentage zero",
            one_pool(&["    gpuMode: shared", "    sharedGpu: {corePercentage: 0}"]),
            (7, 17),
            "got 0",
        ),
        case(
            "unknown capacity type",
            one_pool(&["    capacityTypes: [spot, dedicated]"]),
            (6, 27),
            "pools[0].capacityTypes[1]: unknown capacity type \"dedicated\" (expected spot, \
             on-demand or reserved)",
        ),
        case(
            "reserved capacity without reservations",
            one_pool(&["    capacityTypes: [reserved, on-demand]"]),
            (6, 21),
            "pools[0].capacityTypes[0]: reserved needs `capacityReservations`",
        ),
        case(
            "capacity reservations without reserved capacity",
            one_pool(&["    capacityReservations: [{id: cr-0abc}]"]),
            (6, 5),
            "pools[0].capacityReservations: needs `reserved` in `capacityTypes`",
        ),
        case(
            "capacity reservation id that is no reservation",
            one_pool(&[
                "    capacityTypes: [reserved]",
                "    capacityReservations:",
                "      - {tags: {team: ml}}",
                "      - {id: i-0abc}",
            ]),
            (9, 10),
            "pools[0].capacityReservations[1].id: \"i-0abc\" is not a capacity reservation id",
        ),
        case(
            "capacity reservation selector with both id and tags",
            one_pool(&[
                "    capacityTypes: [reserved]",
                "    capacityReservations: [{id: cr-1, tags: {team: ml}}]",
            ]),
            (7, 28),
            "pools[0].capacityReservations[0]: give exactly one of `id` or `tags`",
        ),
        case(
            "capacity reservation selector with no tags",
            one_pool(&[
                "    capacityTypes: [reserved]",
                "    capacityReservations: [{tags: {}}]",
            ]),
            (7, 29),
            "pools[0].capacityReservations[0].tags: must name at least one tag",
        ),
        case(
            "capacity block drain lead that is no duration",
            one_pool(&[
                "    capacityTypes: [reserved]",
                "    capacityReservations: [{id: cr-1}]",
                "    capacityBlockDrainLead: half an hour",
            ]),
            (8, 5),
            "pools[0].capacityBlockDrainLead: invalid duration",
        ),
        case(
            "expected run time that is no duration",
            one_pool(&[
                "    capacityTypes: [reserved]",
                "    capacityReservations: [{id: cr-1}]",
                "    expectedRunTime: two hours",
            ]),
            (8, 5),
            "pools[0].expectedRunTime: invalid duration",
        ),
        case(
            "expected run time of zero",
            one_pool(&[
                "    capacityTypes: [reserved]",
                "    capacityReservations: [{id: cr-1}]",
                "    expectedRunTime: 0s",
            ]),
            (8, 5),
            "pools[0].expectedRunTime: must be longer than 0s",
        ),
        case(
            "expected run time without reserved capacity",
            one_pool(&["    expectedRunTime: 2h"]),
            (6, 5),
            "pools[0].expectedRunTime: needs `reserved` in `capacityTypes`",
        ),
        case(
            "keep reserved warm without reserved capacity",
            one_pool(&["    keepReservedWarm: true"]),
            (6, 5),
            "pools[0].keepReservedWarm: needs `reserved` in `capacityTypes`",
        ),
        case(
            "duplicate capacity type",
            one_pool(&["    capacityTypes: [spot, spot]"]),
            (6, 27),
            "pools[0].capacityTypes[1]: duplicate capacity type \"spot\"",
        ),
        case(
            "empty capacity types",
            one_pool(&["    capacityTypes: []"]),
            (6, 5),
            "must list at least one of spot, on-demand, reserved",
        ),
        case(
            "duration with a day unit",
            one_pool(&["    scaleDown:", "      unneededTime: 10d"]),
            (7, 7),
            "pools[0].scaleDown.unneededTime: invalid duration \"10d\": unknown unit \"d\" (use \
             ms, s, m or h; e.g. 24h for one day)",
        ),
        case(
            "duration that is a word",
            one_pool(&["    scaleDown:", "      cooldownAfterScaleUp: ten"]),
            (7, 7),
            "pools[0].scaleDown.cooldownAfterScaleUp: invalid duration \"ten\"",
        ),
        case(
            "duration without unit",
            one_pool(&["    scaleDown: {backoffAfterFailure: \"30\"}"]),
            (6, 17),
            "missing unit after \"30\"",
        ),
        case(
            "duration as a bare number",
            one_pool(&["    scaleDown: {backoffAfterFailure: 30}"]),
            (6, 17),
            "invalid type: integer `30`, expected a string",
        ),
        case(
            "bad top-level duration",
            one_pool(&["maxNodeProvisionTime: 15 min"]),
            (6, 1),
            "maxNodeProvisionTime: invalid duration \"15 min\": whitespace is not allowed",
        ),
        case(
            "bad taint effect",
            one_pool(&["    taints:", "      - {key: k, effect: NoSchedul}"]),
            (7, 18),
            "pools[0].taints[0].effect: unknown taint effect \"NoSchedul\" (expected \
             NoSchedule, PreferNoSchedule or NoExecute)",
        ),
        case(
            "bad startup taint effect",
            one_pool(&["    startupTaints:", "      - {key: k, effect: Never}"]),
            (7, 18),
            "pools[0].startupTaints[0].effect: unknown taint effect \"Never\" (expected \
             NoSchedule, PreferNoSchedule or NoExecute)",
        ),
        case(
            "a startup taint that is also a pool taint",
            one_pool(&[
                "    taints: [{key: k, effect: NoSchedule}]",
                "    startupTaints:",
                "      - {key: k, effect: NoSchedule}",
            ]),
            (8, 10),
            "pools[0].startupTaints[0].key: k:NoSchedule is also one of the pool's taints; a \
             startup taint is removed once the node is registered, a pool taint stays",
        ),
        case(
            "empty taint key",
            one_pool(&["    taints:", "      - {key: \"\", effect: NoSchedule}"]),
            (7, 10),
            "pools[0].taints[0].key: taint key must not be empty",
        ),
        case(
            "taint without effect",
            one_pool(&["    taints:", "      - {key: k}"]),
            (7, 9),
            "pools[0].taints[0]: missing field `effect`",
        ),
        case(
            "invalid MIG profile",
            one_pool(&["    gpuMode: mig", "    migLayout:", "      1g.5g: 7"]),
            (8, 7),
            "pools[0].migLayout[\"1g.5g\"]: invalid MIG profile \"1g.5g\" (expected <g>g.<m>gb, \
             e.g. 1g.5gb)",
        ),
        case(
            "MIG layout over 7 compute slices",
            one_pool(&[
                "    gpuMode: mig",
                "    migLayout:",
                "      3g.20gb: 2",
                "      1g.5gb: 2",
            ]),
            (7, 5),
            "pools[0].migLayout: MIG layout uses 8 compute slices, a GPU has 7",
        ),
        case(
            "MIG count zero",
            one_pool(&["    gpuMode: mig", "    migLayout: {1g.5gb: 0}"]),
            (7, 17),
            "count must be at least 1",
        ),
        case(
            "huge MIG count does not overflow",
            one_pool(&["    gpuMode: mig", "    migLayout: {2g.10gb: 4294967295}"]),
            (7, 5),
            "compute slices, a GPU has 7",
        ),
        case(
            "migLayout without gpuMode mig",
            one_pool(&["    migLayout: {1g.5gb: 7}"]),
            (6, 5),
            "pools[0].migLayout: migLayout needs `gpuMode: mig`",
        ),
        case(
            "migLayout with gpuMode shared",
            one_pool(&["    gpuMode: shared", "    migLayout: {1g.5gb: 7}"]),
            (7, 5),
            "migLayout needs `gpuMode: mig`",
        ),
        case(
            "gpuMode mig without migLayout",
            one_pool(&["    gpuMode: mig"]),
            (6, 5),
            "`gpuMode: mig` needs a `migLayout`",
        ),
        case(
            "unknown gpuMode",
            one_pool(&["    gpuMode: fractional"]),
            (6, 5),
            "unknown gpuMode \"fractional\" (expected whole, mig or shared)",
        ),
        case(
            "sharedGpu without gpuMode shared",
            one_pool(&["    sharedGpu: {corePercentage: 50}"]),
            (6, 5),
            "sharedGpu needs `gpuMode: shared`",
        ),
        case(
            "missing maxNodes points at the pool",
            yaml(&[
                "zones: [us-east-1a]",
                "pools:",
                "  - name: a",
                "    instanceTypes: [g5.xlarge]",
            ]),
            (3, 5),
            "pools[0]: missing field `maxNodes`",
        ),
        case(
            "missing name points at the pool",
            yaml(&[
                "zones: [us-east-1a]",
                "pools:",
                "  - instanceTypes: [g5.xlarge]",
                "    maxNodes: 1",
            ]),
            (3, 5),
            "pools[0]: missing field `name`",
        ),
        case(
            "no zones anywhere",
            yaml(&[
                "pools:",
                "  - name: a",
                "    instanceTypes: [g5.xlarge]",
                "    maxNodes: 3",
            ]),
            (2, 5),
            "pools[0]: no zones: set `zones` on the pool or at the top level",
        ),
        case(
            "empty pool zones",
            one_pool(&["    zones: []"]),
            (3, 5),
            "no zones",
        ),
        case(
            "duplicate pool zone",
            one_pool(&["    zones: [a, b, a]"]),
            (6, 19),
            "pools[0].zones[2]: duplicate zone \"a\"",
        ),
        case(
            "empty top-level zone",
            yaml(&[
                "zones: [us-east-1a, \"\"]",
                "pools:",
                "  - name: a",
                "    instanceTypes: [g5.xlarge]",
                "    maxNodes: 3",
            ]),
            (1, 21),
            "zones[1]: zone name must not be empty",
        ),
        case(
            "pools not a list",
            yaml(&["zones: [a]", "pools: {name: a, maxNodes: 1}"]),
            (2, 1),
            "pools: `pools` must be a list",
        ),
        case(
            "empty pools",
            yaml(&["zones: [a]", "pools: []"]),
            (2, 1),
            "pools: at least one pool is required",
        ),
        case(
            "null pools",
            yaml(&["zones: [a]", "pools:"]),
            (2, 1),
            "pools: missing field `pools`",
        ),
        case(
            "pool item not a mapping",
            yaml(&["zones: [a]", "pools:", "  - a10g"]),
            (3, 5),
            "pools[0]: invalid type: string \"a10g\", expected struct RawPool",
        ),
        case(
            "non-mapping document (list)",
            yaml(&["- name: a", "- name: b"]),
            (1, 1),
            "a policy must be a YAML mapping with a `pools` list",
        ),
        case(
            "non-mapping document (scalar)",
            yaml(&["# comment", "just some text"]),
            (1, 1),
            "a policy must be a YAML mapping with a `pools` list",
        ),
        case(
            "empty document",
            String::new(),
            (1, 1),
            "a policy must be a YAML mapping with a `pools` list",
        ),
        case(
            "wrong type for maxNodes",
            yaml(&[
                "zones: [us-east-1a]",
                "pools:",
                "  - name: a",
                "    instanceTypes: [g5.xlarge]",
                "    maxNodes: \"many\"",
            ]),
            (5, 5),
            "pools[0].maxNodes: invalid type: string \"many\", expected u32",
        ),
        case(
            "negative minNodes",
            one_pool(&["    minNodes: -1"]),
            (6, 5),
            "pools[0].minNodes: invalid value: integer `-1`, expected u32",
        ),
        case(
            "wrong type at top level",
            one_pool(&["maxConcurrentDrains: lots"]),
            (6, 1),
            "maxConcurrentDrains: invalid type: string \"lots\", expected u32",
        ),
        case(
            "spotPriceRatio above 1",
            one_pool(&["spotPriceRatio: 1.5"]),
            (6, 1),
            "spotPriceRatio: must be in (0, 1], got 1.5",
        ),
        case(
            "spotPriceRatio zero",
            one_pool(&["spotPriceRatio: 0"]),
            (6, 1),
            "must be in (0, 1], got 0",
        ),
        case(
            // Not a number JSON can hold: a YAML error at the value.
            "spotPriceRatio NaN",
            one_pool(&["spotPriceRatio: .nan"]),
            (6, 17),
            "invalid YAML: value `.nan` is not a finite number",
        ),
        case(
            "utilizationThreshold above 1",
            one_pool(&["    scaleDown:", "      utilizationThreshold: 1.5"]),
            (7, 7),
            "pools[0].scaleDown.utilizationThreshold: must be between 0 and 1, got 1.5",
        ),
        case(
            "utilizationThreshold negative",
            one_pool(&["    scaleDown: {utilizationThreshold: -0.1}"]),
            (6, 17),
            "must be between 0 and 1, got -0.1",
        ),
        case(
            "malformed reserved.memory",
            one_pool(&["    reserved: {memory: 2GB}"]),
            (6, 16),
            "pools[0].reserved.memory: malformed quantity \"2GB\"",
        ),
        case(
            "negative reserved.cpu",
            one_pool(&["    reserved:", "      cpu: -100m"]),
            (7, 7),
            "pools[0].reserved.cpu: must not be negative",
        ),
        case(
            "out-of-range reserved.memory",
            one_pool(&["    reserved: {memory: 1e30}"]),
            (6, 16),
            "pools[0].reserved.memory: quantity \"1e+30\" is out of range",
        ),
        case(
            "reserved.memory of the wrong type",
            one_pool(&["    reserved: {memory: [1Gi]}"]),
            (6, 16),
            "pools[0].reserved.memory: expected a quantity such as \"500m\" or \"2Gi\"",
        ),
        case(
            "unsupported apiVersion",
            one_pool(&["apiVersion: v1"]),
            (6, 1),
            "apiVersion: unsupported apiVersion \"v1\" (expected \
             \"gpu-node-autoscaler.io/v1alpha1\")",
        ),
        case(
            "wrong kind",
            one_pool(&["kind: ConfigMap"]),
            (6, 1),
            "kind: kind must be \"ScalingPolicy\", not \"ConfigMap\"",
        ),
        case(
            "batching idle longer than max",
            one_pool(&["batching: {idle: 20s, max: 10s}"]),
            (6, 12),
            "batching.idle: idle must not be longer than max",
        ),
        case(
            "maxConcurrentDrains zero",
            one_pool(&["maxConcurrentDrains: 0"]),
            (6, 1),
            "maxConcurrentDrains: must be at least 1",
        ),
        case(
            "orphans neither keep nor drain",
            one_pool(&["orphans: delete"]),
            (6, 1),
            "orphans: unknown value \"delete\" (expected keep or drain)",
        ),
        case(
            "pool name not a DNS label",
            yaml(&[
                "zones: [us-east-1a]",
                "pools:",
                "  - name: A10G_pool",
                "    instanceTypes: [g5.xlarge]",
                "    maxNodes: 3",
            ]),
            (3, 5),
            "pools[0].name: pool name \"A10G_pool\" must be a DNS label",
        ),
        case(
            "unknown provider",
            one_pool(&["    provider: gcp"]),
            (6, 5),
            "pools[0].provider: unknown provider \"gcp\" (expected one of aws, alibaba, kwok, memory)",
        ),
        case(
            "neither instanceTypes nor requirements",
            yaml(&[
                "zones: [us-east-1a]",
                "pools:",
                "  - name: a",
                "    maxNodes: 3",
            ]),
            (3, 5),
            "pools[0]: a pool needs `instanceTypes` or `requirements`",
        ),
        case(
            "empty instanceTypes",
            yaml(&[
                "zones: [us-east-1a]",
                "pools:",
                "  - name: a",
                "    instanceTypes: []",
                "    maxNodes: 3",
            ]),
            (4, 5),
            "pools[0].instanceTypes: must list at least one instance type",
        ),
        case(
            "duplicate instance type",
            yaml(&[
                "zones: [us-east-1a]",
                "pools:",
                "  - name: a",
                "    instanceTypes: [g5.xlarge, g5.xlarge]",
                "    maxNodes: 3",
            ]),
            (4, 32),
            "pools[0].instanceTypes[1]: duplicate instance type \"g5.xlarge\"",
        ),
        case(
            "requirements min > max",
            one_pool(&["    requirements:", "      gpuCount: {min: 8, max: 4}"]),
            (7, 18),
            "pools[0].requirements.gpuCount.min: min (8) is greater than max (4)",
        ),
        case(
            "label key with whitespace",
            one_pool(&["    labels: {\"bad key\": x}"]),
            (6, 5),
            "pools[0].labels: invalid label key \"bad key\"",
        ),
        case(
            "label value too long",
            one_pool(&[
                "    labels:",
                "      team: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
            ]),
            (7, 7),
            "pools[0].labels.team: label values are at most 63 characters",
        ),
        case(
            "negative price",
            one_pool(&["    prices:", "      g5.xlarge: {spot: -1}"]),
            (7, 19),
            "pools[0].prices[\"g5.xlarge\"].spot: price must be a non-negative number, got -1",
        ),
        case(
            "maxPods zero",
            one_pool(&["    maxPods: 0"]),
            (6, 5),
            "pools[0].maxPods: must be at least 1",
        ),
    ]
}

#[test]
fn each_error_class_is_reported_at_the_offending_key() {
    let mut failures = Vec::new();
    for c in error_cases() {
        let errs = match parse_policy(&c.text, FILE) {
            Ok(_) => {
                failures.push(format!("{}: parsed without errors", c.what));
                continue;
            }
            Err(e) => e,
        };
        let got = positions(&errs);
        let ok =
            matches!(got.as_slice(), [(l, col, m)] if (*l, *col) == c.at && m.contains(c.phrase));
        if !ok {
            failures.push(format!(
                "{}: want one error at {:?} containing {:?}, got:\n{errs}",
                c.what, c.at, c.phrase
            ));
            continue;
        }
        // Display renders FILE:LINE:COL: message.
        let e = &errs.errors[0];
        assert_eq!(
            errs.to_string(),
            format!("{FILE}:{}:{}: {}", e.line, e.col, e.message),
            "{}",
            c.what
        );
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn full_messages() {
    let cases = [
        (
            yaml(&[
                "zones: [us-east-1a]",
                "pools:",
                "  - name: a",
                "    instanceTypes: [g5.xlarge]",
                "    minNodes: 5",
                "    maxNodes: 2",
            ]),
            "policy.yaml:5:5: pools[0].minNodes: minNodes (5) is greater than maxNodes (2)",
        ),
        (
            one_pool(&["    scaleDown:", "      unneededTime: 10d"]),
            "policy.yaml:7:7: pools[0].scaleDown.unneededTime: invalid duration \"10d\": unknown \
             unit \"d\" (use ms, s, m or h; e.g. 24h for one day)",
        ),
        (
            one_pool(&["    gpuMode: shared", "    sharedGpu: {corePercentage: 33}"]),
            "policy.yaml:7:17: pools[0].sharedGpu.corePercentage: gpu-core percentage must be a \
             multiple of 5 in 5..=100, got 33",
        ),
        (
            yaml(&[
                "zones: [us-east-1a]",
                "pools:",
                "  - name: a",
                "    instanceTypes: [g5.xlarge]",
            ]),
            "policy.yaml:3:5: pools[0]: missing field `maxNodes`",
        ),
        (
            yaml(&["- a"]),
            "policy.yaml:1:1: a policy must be a YAML mapping with a `pools` list",
        ),
        (
            one_pool(&["    capacityTypes: [spot, dedicated]"]),
            "policy.yaml:6:27: pools[0].capacityTypes[1]: unknown capacity type \"dedicated\" \
             (expected spot, on-demand or reserved)",
        ),
    ];
    for (text, want) in cases {
        assert_eq!(parse_err(&text).to_string(), want);
    }
}

#[test]
fn unknown_field_message_lists_the_known_fields() {
    let e = parse_err(&yaml(&[
        "zones: [us-east-1a]",
        "pools:",
        "  - name: a",
        "    instanceTypes: [g5.xlarge]",
        "    maxNode: 3",
    ]));
    let msg = &e.errors[0].message;
    assert!(msg.contains("`maxNodes`"), "{msg}");
    assert!(msg.contains("`minNodes`"), "{msg}");
    // The position is the error's own, not repeated in its message.
    assert!(!msg.contains(" line "), "{msg}");
    assert_eq!(e.errors[0].path, "pools[0].maxNode");
}

#[test]
fn provider_sections_are_listed_for_a_pools_own_fields_only() {
    let pool_level = parse_err(&yaml(&[
        "zones: [us-east-1a]",
        "pools:",
        "  - name: a",
        "    instanceTypes: [g5.xlarge]",
        "    maxNode: 3",
    ]));
    let msg = &pool_level.errors[0].message;
    assert!(msg.ends_with("`aws`, `alibaba`, `kwok`"), "{msg}");
    let nested = parse_err(&yaml(&[
        "zones: [us-east-1a]",
        "pools:",
        "  - name: a",
        "    instanceTypes: [g5.xlarge]",
        "    maxNodes: 3",
        "    requirements: {zzz: 1}",
    ]));
    let msg = &nested.errors[0].message;
    assert!(
        msg.ends_with("`gpuModels`, `gpuCount`, `families`"),
        "{msg}"
    );
    assert_eq!(nested.errors[0].path, "pools[0].requirements.zzz");
}

#[test]
fn yaml_syntax_errors_have_a_position() {
    let cases = [
        // An unterminated flow sequence runs on into the next line, where `:` is illegal.
        (yaml(&["zones: [us-east-1a", "pools: []"]), 2, 6),
        // A quoted string running on into the next line, reported where it starts.
        (yaml(&["zones: [\"us-east-1a]", "pools: []"]), 1, 9),
        // A tab where indentation is expected: just past the tab.
        (yaml(&["pools:", "\t- name: a"]), 2, 2),
    ];
    for (text, line, col) in cases {
        let e = parse_err(&text);
        assert_eq!(e.errors.len(), 1, "{e}");
        let err = &e.errors[0];
        assert!(err.message.starts_with("invalid YAML: "), "{e}");
        assert_eq!((err.line, err.col), (line, col), "{text:?}: {e}");
        assert!(
            e.to_string()
                .starts_with(&format!("{FILE}:{line}:{col}: invalid YAML: ")),
            "{e}"
        );
    }
}

#[test]
fn duplicate_keys_are_yaml_errors_at_the_repeated_key() {
    let e = parse_err(&yaml(&["zones: [a]", "pools: []", "zones: [b]"]));
    assert_eq!(
        e.to_string(),
        "policy.yaml:3:1: invalid YAML: duplicate mapping key `zones` is not allowed here"
    );
    let e = parse_err(&yaml(&["pools:", "  - name: a", "    name: b"]));
    assert_eq!(positions(&e).len(), 1, "{e}");
    assert_eq!((e.errors[0].line, e.errors[0].col), (3, 5), "{e}");
    assert!(
        e.errors[0].message.contains("duplicate mapping key `name`"),
        "{e}"
    );
}

// ---- several errors at once ----

#[test]
fn every_error_is_reported_sorted_by_line() {
    let text = yaml(&[
        "zones: [us-east-1a]",                // 1
        "pools:",                             // 2
        "  - name: a",                        // 3
        "    instanceTypes: [g5.xlarge]",     // 4
        "    maxNodes: 3",                    // 5
        "    capacityTypes: [spot, bidding]", // 6
        "  - name: b",                        // 7
        "    instanceTypes: [g5.xlarge]",     // 8
        "    maxNode: 3",                     // 9
        "  - name: c",                        // 10
        "    instanceTypes: [g5.xlarge]",     // 11
        "    maxNodes: 3",                    // 12
        "    scaleDown: {unneededTime: 10d}", // 13
        "  - name: ok",                       // 14
        "    instanceTypes: [g5.xlarge]",     // 15
        "    maxNodes: 3",                    // 16
        "spotPriceRatio: 2",                  // 17
    ]);
    let e = parse_err(&text);
    let got: Vec<(usize, usize)> = e.errors.iter().map(|e| (e.line, e.col)).collect();
    assert_eq!(got, [(6, 27), (9, 5), (13, 17), (17, 1)], "{e}");
    let paths: Vec<&str> = e.errors.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "pools[0].capacityTypes[1]",
            "pools[1].maxNode",
            "pools[2].scaleDown.unneededTime",
            "spotPriceRatio"
        ]
    );
    // Display: one line per error, each `FILE:LINE:COL: message`.
    let shown = e.to_string();
    let lines: Vec<&str> = shown.lines().collect();
    assert_eq!(lines.len(), 4, "{shown}");
    for (line, err) in lines.iter().zip(&e.errors) {
        assert_eq!(
            *line,
            format!("{FILE}:{}:{}: {}", err.line, err.col, err.message)
        );
    }
    assert!(!shown.ends_with('\n'));
}

#[test]
fn a_bad_top_level_field_does_not_hide_pool_errors() {
    let text = yaml(&[
        "zones: [us-east-1a]",               // 1
        "pools:",                            // 2
        "  - name: a",                       // 3
        "    instanceTypes: [g5.xlarge]",    // 4
        "    minNodes: 4",                   // 5
        "    maxNodes: 3",                   // 6
        "  - name: b",                       // 7
        "    instanceTypes: [g5.xlarge]",    // 8
        "    maxNodes: 3",                   // 9
        "    taints: [{key: k, effect: x}]", // 10
        "scaledown: {enabled: false}",       // 11
        "maxConcurrentDrains: many",         // 12
    ]);
    let e = parse_err(&text);
    let got: Vec<(usize, usize, &str)> = positions(&e);
    assert_eq!(got.len(), 4, "{e}");
    assert_eq!((got[0].0, got[0].1), (5, 5), "{e}");
    assert!(got[0]
        .2
        .contains("minNodes (4) is greater than maxNodes (3)"));
    assert_eq!((got[1].0, got[1].1), (10, 23), "{e}");
    assert!(got[1].2.contains("unknown taint effect \"x\""));
    assert_eq!((got[2].0, got[2].1), (11, 1), "{e}");
    assert!(got[2].2.contains("unknown field `scaledown`"));
    assert_eq!((got[3].0, got[3].1), (12, 1), "{e}");
    assert!(got[3].2.contains("maxConcurrentDrains: invalid type"));
}

#[test]
fn malformed_top_level_zones_do_not_cascade_into_pools() {
    let text = yaml(&[
        "zones: us-east-1a",
        "pools:",
        "  - name: a",
        "    instanceTypes: [g5.xlarge]",
        "    maxNodes: 3",
    ]);
    let e = parse_err(&text);
    assert_eq!(e.errors.len(), 1, "{e}");
    assert_eq!((e.errors[0].line, e.errors[0].col), (1, 1));
    assert!(
        e.errors[0].message.starts_with("zones: invalid type"),
        "{e}"
    );
}

#[test]
fn several_errors_in_one_pool_are_all_reported() {
    let e = parse_err(&one_pool(&[
        "    minNodes: 9",
        "    capacityTypes: [spot, spot]",
        "    gpuMode: shared",
        "    sharedGpu: {corePercentage: 7}",
        "    scaleDown: {utilizationThreshold: 2}",
    ]));
    let got: Vec<(usize, usize)> = e.errors.iter().map(|e| (e.line, e.col)).collect();
    assert_eq!(got, [(6, 5), (7, 27), (9, 17), (10, 17)], "{e}");
}

#[test]
fn duplicate_pool_names_point_at_the_later_pools() {
    let pool = |name: &'static str| -> [&'static str; 3] {
        [name, "    instanceTypes: [g5.xlarge]", "    maxNodes: 1"]
    };
    let mut lines = vec!["zones: [z]", "pools:"];
    lines.extend(pool("  - name: x")); // 3
    lines.extend(pool("  - name: a")); // 6
    lines.extend(pool("  - name: a")); // 9
    lines.extend(pool("  - name: b")); // 12
    lines.extend(pool("  - name: a")); // 15
    let e = parse_err(&yaml(&lines));
    assert_eq!(
        positions(&e),
        [
            (9, 5, "pools[2].name: duplicate pool name \"a\""),
            (15, 5, "pools[4].name: duplicate pool name \"a\""),
        ],
        "{e}"
    );
}

#[test]
fn duplicate_pool_name_is_reported_even_when_the_first_pool_has_errors() {
    let e = parse_err(&yaml(&[
        "zones: [z]",
        "pools:",
        "  - name: a",
        "    instanceTypes: [g5.xlarge]",
        "    maxNodes: 1",
        "    provider: gcp",
        "  - name: a",
        "    instanceTypes: [g5.xlarge]",
        "    maxNodes: 1",
    ]));
    let got: Vec<(usize, usize)> = e.errors.iter().map(|e| (e.line, e.col)).collect();
    assert_eq!(got, [(6, 5), (7, 5)], "{e}");
    assert!(e.errors[1].message.contains("duplicate pool name \"a\""));
}

#[test]
fn errors_at_the_same_place_are_not_repeated() {
    // Two invalid label keys are reported at the same `labels` key, with different messages.
    let e = parse_err(&one_pool(&["    labels: {\"a b\": x, \"c d\": y}"]));
    assert_eq!(e.errors.len(), 2, "{e}");
    assert!(e.errors.iter().all(|e| (e.line, e.col) == (6, 5)));
}

// ---- summary ----

#[test]
fn summary_has_one_line_per_pool() {
    let p = parse_ok(EXAMPLE);
    assert_eq!(
        summary(&p),
        [
            "pool a10g: aws [g5.xlarge,g5.2xlarge,g5.12xlarge,g5.48xlarge] in \
             us-east-1a,us-east-1b,us-east-1c (spot > on-demand), nodes 0..40, max 96 GPUs, \
             whole GPUs, priority 0, scale-down after 10m unneeded",
            "pool a100-train: aws [A100 with 8-8 GPUs] in us-east-1a,us-east-1b (on-demand), \
             nodes 0..8, whole GPUs, priority 0, scale-down after 10m unneeded",
            "pool a100-mig: aws [p4d.24xlarge] in us-east-1a (on-demand), nodes 0..2, \
             MIG 7x1g.5gb, priority 0, scale-down after 10m unneeded",
            "pool t4-shared: aws [g4dn.xlarge,g4dn.12xlarge] in us-east-1a,us-east-1b,us-east-1c \
             (spot > on-demand), nodes 0..10, shared GPUs, priority 0, scale-down after 5m \
             unneeded",
        ]
    );
}

#[test]
fn summary_of_open_requirements_and_disabled_scale_down() {
    let p = parse_ok(&yaml(&[
        "zones: [z]",
        "pools:",
        "  - name: any",
        "    requirements: {}",
        "    minNodes: 1",
        "    maxNodes: 4",
        "    priority: 7",
        "    gpuMode: mig",
        "    migLayout: {1g.5gb: 3, 2g.10gb: 2}",
        "    scaleDown: {enabled: false}",
    ]));
    assert_eq!(
        summary(&p),
        [
            "pool any: aws [any GPU with >=1 GPUs] in z (on-demand), nodes 1..4, \
          MIG 3x1g.5gb+2x2g.10gb, priority 7, scale-down disabled"
        ]
    );
}

// ---- requirements ----

#[test]
fn requirements_admit_instance_types() {
    use gpu_node_autoscaler_provider::{GpuInfo, GpuVendor, InstanceType};
    let t = |name: &str, gpu: Option<(&str, u32)>| InstanceType {
        name: name.into(),
        vcpu: 8,
        memory_mib: 32768,
        gpu: gpu.map(|(model, count)| GpuInfo {
            model: model.into(),
            vendor: GpuVendor::Nvidia,
            count,
            memory_mib: 24576,
        }),
        on_demand_price: None,
    };
    let p = parse_ok(&yaml(&[
        "zones: [z]",
        "pools:",
        "  - name: any",
        "    requirements: {}",
        "    maxNodes: 1",
        "  - name: a10g-big",
        "    requirements: {gpuModels: [A10G], gpuCount: {min: 4, max: 8}, families: [g5]}",
        "    maxNodes: 1",
    ]));
    let any = p.pool("any").unwrap().requirements.as_ref().unwrap();
    let big = p.pool("a10g-big").unwrap().requirements.as_ref().unwrap();
    assert!(any.admits(&t("g5.xlarge", Some(("A10G", 1)))));
    assert!(!any.admits(&t("m5.xlarge", None)), "GPU-less types never");
    assert!(big.admits(&t("g5.12xlarge", Some(("A10G", 4)))));
    assert!(big.admits(&t("g5.48xlarge", Some(("A10G", 8)))));
    assert!(!big.admits(&t("g5.xlarge", Some(("A10G", 1)))), "too few");
    assert!(!big.admits(&t("g6.12xlarge", Some(("A10G", 4)))), "family");
    assert!(!big.admits(&t("g5.12xlarge", Some(("L4", 4)))), "model");
}

// ---- aws ----

/// A one-pool policy in two zones with `provider: aws`; `aws` lines go into the pool from line 7.
fn aws_pool(aws: &[&str]) -> String {
    let mut lines = vec![
        "zones: [us-east-1a, us-east-1b]", // 1
        "pools:",                          // 2
        "  - name: a",                     // 3
        "    provider: aws",               // 4
        "    instanceTypes: [g5.xlarge]",  // 5
        "    maxNodes: 3",                 // 6
    ];
    lines.extend_from_slice(aws);
    yaml(&lines)
}

#[test]
fn aws_section_is_optional() {
    let p = parse_ok(&aws_pool(&[]));
    assert_eq!(aws_of(&p.pools[0]), None);
}

#[test]
fn aws_section_is_read_with_default_version() {
    let p = parse_ok(&aws_pool(&[
        "    aws:",
        "      launchTemplate: {name: gpu-nodes}",
        "      subnets:",
        "        us-east-1a: subnet-0a1",
        "        us-east-1b: subnet-0b2",
    ]));
    let aws = aws_of(&p.pools[0]).unwrap();
    assert_eq!(
        aws.launch_template,
        LaunchTemplate {
            by: LaunchTemplateBy::Name("gpu-nodes".into()),
            version: "$Default".into(),
        }
    );
    assert_eq!(aws.subnets["us-east-1b"], "subnet-0b2");

    let p = parse_ok(&aws_pool(&[
        "    aws:",
        "      launchTemplate: {id: lt-0abc, version: \"3\"}",
        "      subnets: {us-east-1a: subnet-1, us-east-1b: subnet-2}",
    ]));
    let lt = &aws_of(&p.pools[0]).unwrap().launch_template;
    assert_eq!(lt.by, LaunchTemplateBy::Id("lt-0abc".into()));
    assert_eq!(lt.version, "3");
}

#[test]
fn aws_errors_name_the_field_and_position() {
    let subnets = "      subnets: {us-east-1a: subnet-1, us-east-1b: subnet-2}";
    let cases: Vec<(Vec<&str>, (usize, usize), &str)> = vec![
        (
            vec![
                "    aws:",
                "      launchTemplate: {name: lt}",
                "      subnets: {us-east-1a: subnet-1}",
            ],
            (9, 7),
            "pools[0].aws.subnets: zone us-east-1b has no subnet in aws.subnets",
        ),
        (
            vec![
                "    aws:",
                "      launchTemplate: {name: lt}",
                "      subnets: {us-east-1a: subnet-1, us-east-1b: sn-2}",
            ],
            (9, 39),
            "pools[0].aws.subnets.us-east-1b: \"sn-2\" is not a subnet id (subnet-...)",
        ),
        (
            vec!["    aws:", "      launchTemplate: {name: \"\"}", subnets],
            (8, 24),
            "pools[0].aws.launchTemplate.name: launch template name must not be empty",
        ),
        (
            vec!["    aws:", "      launchTemplate: {id: nope}", subnets],
            (8, 24),
            "pools[0].aws.launchTemplate.id: \"nope\" is not a launch template id (lt-...)",
        ),
        (
            vec![
                "    aws:",
                "      launchTemplate: {version: \"2\"}",
                subnets,
            ],
            (8, 7),
            "pools[0].aws.launchTemplate: needs the launch template's `name` or `id`",
        ),
        (
            vec![
                "    aws:",
                "      launchTemplate: {name: a, id: lt-1}",
                subnets,
            ],
            (8, 7),
            "not both",
        ),
        (
            vec![
                "    aws:",
                "      launchTemplate: {name: a, version: newest}",
                subnets,
            ],
            (8, 33),
            "must be a number, $Default or $Latest",
        ),
        (
            vec!["    aws:", subnets],
            (7, 5),
            "pools[0].aws: missing `launchTemplate` (give its `name` or `id`)",
        ),
        (
            vec![
                "    aws:",
                "      launchTemplate: {name: a}",
                subnets,
                "      subnetIds: []",
            ],
            (10, 7),
            "pools[0].aws.subnetIds: unknown field `subnetIds`",
        ),
    ];
    assert_one_error_each(cases, aws_pool);
}

#[test]
fn aws_auto_scaling_groups_are_named_or_discovered() {
    use gpu_node_autoscaler_aws::settings::{AutoScalingGroups, TagMatch};
    let p = parse_ok(&aws_pool(&[
        "    aws:",
        "      autoScalingGroups:",
        "        names: [gpu-spot-a, gpu-od-a]",
    ]));
    let aws = aws_of(&p.pools[0]).unwrap();
    assert_eq!(
        aws.auto_scaling_groups,
        Some(AutoScalingGroups::Named(vec![
            "gpu-spot-a".into(),
            "gpu-od-a".into()
        ]))
    );
    // No subnet per zone is needed: the groups have theirs.
    assert!(aws.subnets.is_empty());
    let p = parse_ok(&aws_pool(&[
        "    aws:",
        "      autoScalingGroups: {autoDiscovery: {}}",
    ]));
    assert_eq!(
        aws_of(&p.pools[0]).unwrap().auto_scaling_groups,
        Some(AutoScalingGroups::Discovered(Vec::new()))
    );
    let p = parse_ok(&aws_pool(&[
        "    aws:",
        "      autoScalingGroups:",
        "        autoDiscovery:",
        "          tags: [k8s.io/cluster-autoscaler/enabled, team=ml]",
    ]));
    assert_eq!(
        aws_of(&p.pools[0]).unwrap().auto_scaling_groups,
        Some(AutoScalingGroups::Discovered(vec![
            TagMatch {
                key: "k8s.io/cluster-autoscaler/enabled".into(),
                value: None
            },
            TagMatch {
                key: "team".into(),
                value: Some("ml".into())
            },
        ]))
    );
}

#[test]
fn aws_auto_scaling_group_errors_name_the_field_and_position() {
    let cases: Vec<(Vec<&str>, (usize, usize), &str)> = vec![
        (
            vec![
                "    aws:",
                "      autoScalingGroups: {names: [a], autoDiscovery: {}}",
            ],
            (8, 7),
            "pools[0].aws.autoScalingGroups: give the groups' `names` or `autoDiscovery`, not both",
        ),
        (
            vec!["    aws:", "      autoScalingGroups: {}"],
            (8, 7),
            "pools[0].aws.autoScalingGroups: needs the groups' `names`, or `autoDiscovery`",
        ),
        (
            vec!["    aws:", "      autoScalingGroups: {names: []}"],
            (8, 27),
            "pools[0].aws.autoScalingGroups.names: names no group",
        ),
        (
            vec![
                "    aws:",
                "      autoScalingGroups:",
                "        names: [a, \"\", b]",
            ],
            (9, 20),
            "pools[0].aws.autoScalingGroups.names[1]: an Auto Scaling group name must not be empty",
        ),
        (
            vec![
                "    aws:",
                "      autoScalingGroups:",
                "        names: [a, b, a]",
            ],
            (9, 23),
            "pools[0].aws.autoScalingGroups.names[2]: group a is named twice",
        ),
        (
            vec![
                "    aws:",
                "      autoScalingGroups:",
                "        autoDiscovery:",
                "          tags: [k8s.io/cluster-autoscaler/enabled, =x]",
            ],
            (10, 53),
            "pools[0].aws.autoScalingGroups.autoDiscovery.tags[1]: \"=x\" has no tag key",
        ),
        (
            vec![
                "    aws:",
                "      autoScalingGroups: {autoDiscovery: {tag: [a]}}",
            ],
            (8, 43),
            "unknown field `tag`",
        ),
        (
            vec![
                "    aws:",
                "      launchTemplate: {name: gpu}",
                "      autoScalingGroups: {names: [a]}",
            ],
            (8, 7),
            "pools[0].aws.launchTemplate: a pool backed by Auto Scaling groups launches from the \
             groups' own launch templates",
        ),
        (
            vec![
                "    aws:",
                "      subnets: {us-east-1a: subnet-1}",
                "      autoScalingGroups: {names: [a]}",
            ],
            (8, 7),
            "pools[0].aws.subnets: a pool backed by Auto Scaling groups launches into the groups' \
             own subnets",
        ),
    ];
    assert_one_error_each(cases, aws_pool);
}

#[test]
fn a_pool_of_auto_scaling_groups_with_reserved_capacity_is_refused() {
    let e = parse_err(&aws_pool(&[
        "    capacityTypes: [reserved, on-demand]",
        "    capacityReservations: [{id: cr-0abc}]",
        "    aws:",
        "      autoScalingGroups: {names: [gpu-od-a]}",
    ]));
    assert_eq!(
        e.to_string(),
        "policy.yaml:7:5: pools[0].capacityTypes: a pool backed by Auto Scaling groups cannot \
         list `reserved` (pool a): a group launches what its own launch template says, so a \
         launch cannot be targeted at the reservations the pool selects nor held to their count; \
         give the reserved capacity its own pool with `aws.launchTemplate` and `aws.subnets`"
    );
    // The same pool launching from a launch template into subnets may.
    parse_ok(&aws_pool(&[
        "    capacityTypes: [reserved, on-demand]",
        "    capacityReservations: [{id: cr-0abc}]",
        "    aws:",
        "      launchTemplate: {name: gpu}",
        "      subnets: {us-east-1a: subnet-1, us-east-1b: subnet-2}",
    ]));
}

#[test]
fn aws_section_needs_provider_aws() {
    let text = aws_pool(&[
        "    aws:",
        "      launchTemplate: {name: a}",
        "      subnets: {us-east-1a: subnet-1, us-east-1b: subnet-2}",
    ])
    .replace("provider: aws", "provider: memory");
    let e = parse_err(&text);
    assert_eq!(
        e.to_string(),
        "policy.yaml:7:5: pools[0].aws: `aws` settings need `provider: aws` (the pool's provider \
         is memory)"
    );
}

// ---- alibaba ----

/// A one-pool policy in two zones with `provider: alibaba` buying spot then on-demand;
/// `alibaba` lines go into the pool from line 8.
fn alibaba_pool(alibaba: &[&str]) -> String {
    let mut lines = vec![
        "zones: [cn-hangzhou-i, cn-hangzhou-j]",      // 1
        "pools:",                                     // 2
        "  - name: a10",                              // 3
        "    provider: alibaba",                      // 4
        "    instanceTypes: [ecs.gn7i-c8g1.2xlarge]", // 5
        "    capacityTypes: [spot, on-demand]",       // 6
        "    maxNodes: 3",                            // 7
    ];
    lines.extend_from_slice(alibaba);
    yaml(&lines)
}

const VSWITCHES: &str = "      vSwitches: {cn-hangzhou-i: vsw-bp1a, cn-hangzhou-j: vsw-bp1b}";

#[test]
fn alibaba_section_is_read() {
    let p = parse_ok(&alibaba_pool(&[
        "    alibaba:",
        "      scalingGroupId: asg-bp1spot",
        "      onDemandScalingGroupId: asg-bp1od",
        VSWITCHES,
    ]));
    assert_eq!(
        alibaba_of(&p.pools[0]),
        Some(AlibabaPoolSettings {
            scaling_group_id: "asg-bp1spot".into(),
            on_demand_scaling_group_id: Some("asg-bp1od".into()),
            compensate_with_on_demand: false,
            vswitches: [
                ("cn-hangzhou-i".to_string(), "vsw-bp1a".to_string()),
                ("cn-hangzhou-j".to_string(), "vsw-bp1b".to_string()),
            ]
            .into(),
        })
    );
    let p = parse_ok(&alibaba_pool(&[
        "    alibaba:",
        "      scalingGroupId: asg-bp1spot",
        "      compensateWithOnDemand: true",
        VSWITCHES,
    ]));
    assert!(alibaba_of(&p.pools[0]).unwrap().compensate_with_on_demand);
    // An on-demand-only pool: its one group is on-demand.
    let od_only = alibaba_pool(&["    alibaba:", "      scalingGroupId: asg-bp1od", VSWITCHES])
        .replace("[spot, on-demand]", "[on-demand]");
    assert_eq!(
        parse_ok(&od_only).pools[0].capacity_types,
        [CapacityType::OnDemand]
    );
}

#[test]
fn alibaba_section_is_required_with_provider_alibaba() {
    let e = parse_err(&alibaba_pool(&[]));
    assert_eq!(
        e.to_string(),
        "policy.yaml:3:5: pools[0]: `provider: alibaba` needs an `alibaba` section \
         (scalingGroupId, vSwitches)"
    );
}

#[test]
fn alibaba_errors_name_the_field_and_position() {
    let cases: Vec<(Vec<&str>, (usize, usize), &str)> = vec![
        (
            vec!["    alibaba:", "      compensateWithOnDemand: true", VSWITCHES],
            (8, 5),
            "pools[0].alibaba: missing `scalingGroupId` (the ESS scaling group, asg-...)",
        ),
        (
            vec![
                "    alibaba:",
                "      scalingGroupId: sg-1",
                "      compensateWithOnDemand: true",
                VSWITCHES,
            ],
            (9, 7),
            "pools[0].alibaba.scalingGroupId: \"sg-1\" is not a scaling group id (asg-...)",
        ),
        (
            vec![
                "    alibaba:",
                "      scalingGroupId: asg-1",
                "      onDemandScalingGroupId: asg-1",
                VSWITCHES,
            ],
            (10, 7),
            "pools[0].alibaba.onDemandScalingGroupId: must differ from scalingGroupId",
        ),
        (
            vec!["    alibaba:", "      scalingGroupId: asg-1", VSWITCHES],
            (8, 5),
            "pools[0].alibaba: `capacityTypes` include spot and on-demand: set \
             `onDemandScalingGroupId` or `compensateWithOnDemand: true`",
        ),
        (
            vec![
                "    alibaba:",
                "      scalingGroupId: asg-1",
                "      compensateWithOnDemand: true",
                "      vSwitches: {cn-hangzhou-i: vsw-a}",
            ],
            (11, 7),
            "pools[0].alibaba.vSwitches: zone cn-hangzhou-j has no vSwitch in alibaba.vSwitches",
        ),
        (
            vec![
                "    alibaba:",
                "      scalingGroupId: asg-1",
                "      compensateWithOnDemand: true",
                "      vSwitches: {cn-hangzhou-i: vsw-a, cn-hangzhou-j: subnet-b}",
            ],
            (11, 41),
            "pools[0].alibaba.vSwitches.cn-hangzhou-j: \"subnet-b\" is not a vSwitch id (vsw-...)",
        ),
        (
            vec![
                "    alibaba:",
                "      scalingGroupId: asg-1",
                "      compensateWithOnDemand: true",
                "      vSwitches: {cn-hangzhou-i: vsw-a, cn-hangzhou-j: vsw-b, cn-hangzhou-k: vsw-c}",
            ],
            (11, 63),
            "pools[0].alibaba.vSwitches.cn-hangzhou-k: cn-hangzhou-k is not a zone of the pool \
             (cn-hangzhou-i, cn-hangzhou-j)",
        ),
        (
            vec![
                "    alibaba:",
                "      scalingGroupId: asg-1",
                "      compensateWithOnDemand: yes please",
                VSWITCHES,
            ],
            (10, 7),
            "pools[0].alibaba.compensateWithOnDemand: invalid type: string \"yes please\", expected a boolean",
        ),
        (
            vec![
                "    alibaba:",
                "      scalingGroupId: asg-1",
                "      compensateWithOnDemand: true",
                VSWITCHES,
                "      vswitchIds: []",
            ],
            (12, 7),
            "pools[0].alibaba.vswitchIds: unknown field `vswitchIds`",
        ),
    ];
    assert_one_error_each(cases, alibaba_pool);
}

#[test]
fn alibaba_groups_must_fit_the_capacity_types() {
    let od_only = |extra: &str| {
        alibaba_pool(&[
            "    alibaba:",
            "      scalingGroupId: asg-1",
            extra,
            VSWITCHES,
        ])
        .replace("[spot, on-demand]", "[on-demand]")
    };
    let e = parse_err(&od_only("      onDemandScalingGroupId: asg-2"));
    assert!(
        e.to_string().contains(
            "a second, on-demand group needs `capacityTypes` with both spot and on-demand"
        ),
        "{e}"
    );
    let e = parse_err(&od_only("      compensateWithOnDemand: true"));
    assert!(
        e.to_string()
            .contains("pools[0].alibaba.compensateWithOnDemand: on-demand compensation needs"),
        "{e}"
    );
    // And `alibaba` only with `provider: alibaba`.
    let text = alibaba_pool(&[
        "    alibaba:",
        "      scalingGroupId: asg-1",
        "      compensateWithOnDemand: true",
        VSWITCHES,
    ])
    .replace("provider: alibaba", "provider: memory");
    assert_eq!(
        parse_err(&text).to_string(),
        "policy.yaml:8:5: pools[0].alibaba: `alibaba` settings need `provider: alibaba` (the \
         pool's provider is memory)"
    );
}

#[test]
fn a_scaling_group_belongs_to_one_pool() {
    let text = yaml(&[
        "zones: [z1]",                                                  // 1
        "pools:",                                                       // 2
        "  - name: a",                                                  // 3
        "    provider: alibaba",                                        // 4
        "    instanceTypes: [t]",                                       // 5
        "    maxNodes: 1",                                              // 6
        "    alibaba: {scalingGroupId: asg-1, vSwitches: {z1: vsw-1}}", // 7
        "  - name: b",                                                  // 8
        "    provider: alibaba",                                        // 9
        "    instanceTypes: [t]",                                       // 10
        "    capacityTypes: [spot, on-demand]",                         // 11
        "    maxNodes: 1",                                              // 12
        "    alibaba:",                                                 // 13
        "      scalingGroupId: asg-2",                                  // 14
        "      onDemandScalingGroupId: asg-1",                          // 15
        "      vSwitches: {z1: vsw-1}",                                 // 16
    ]);
    assert_eq!(
        parse_err(&text).to_string(),
        "policy.yaml:15:7: pools[1].alibaba.onDemandScalingGroupId: scaling group asg-1 is \
         already used by pool a"
    );
}

#[test]
fn a_cluster_name_left_at_its_default_is_warned_about() {
    let pool =
        "pools:\n- name: a\n  instanceTypes: [g5.xlarge]\n  maxNodes: 1\n  zones: [us-east-1a]\n";
    let unnamed = parse_ok(pool);
    assert_eq!(unnamed.cluster_name, "default");
    assert_eq!(unnamed.warnings().len(), 1);
    assert!(unnamed.warnings()[0].contains("clusterName"));
    let named = parse_ok(&format!("clusterName: ml-prod\n{pool}"));
    assert!(named.warnings().is_empty());
}

#[test]
fn startup_taints_are_parsed_apart_from_the_pools_taints() {
    let p = parse_ok(&one_pool(&[
        "    taints: [{key: nvidia.com/gpu, value: \"true\", effect: NoSchedule}]",
        "    startupTaints: [{key: gpu-node-autoscaler.io/registering, effect: NoExecute}]",
    ]));
    let pool = &p.pools[0];
    assert_eq!(pool.taints.len(), 1);
    assert_eq!(pool.startup_taints.len(), 1);
    assert_eq!(
        pool.startup_taints[0].key,
        "gpu-node-autoscaler.io/registering"
    );
    assert_eq!(pool.startup_taints[0].effect, Effect::NoExecute);
}

#[test]
fn a_node_selector_adopts_node_groups_and_may_not_name_the_pool_label() {
    let p = parse_ok(&one_pool(&[
        "    nodeSelector: {eks.amazonaws.com/nodegroup: gpu-a10g}",
    ]));
    assert_eq!(
        p.pools[0].node_selector,
        BTreeMap::from([(
            "eks.amazonaws.com/nodegroup".to_string(),
            "gpu-a10g".to_string()
        )])
    );
    assert_one_error_each(
        vec![
            (
                vec!["    nodeSelector:", "      gpu-node-autoscaler.io/pool: a"],
                (7, 7),
                "nodeSelector adopts nodes without it",
            ),
            (
                vec!["    nodeSelector: {\"bad key\": x}"],
                (6, 5),
                "invalid label key",
            ),
        ],
        one_pool,
    );
}

#[test]
fn an_interruption_queue_and_rebalance_replacement_are_read() {
    let mut text = one_pool(&["    replaceOnRebalance: true"]);
    text.push_str("interruptionQueue: https://sqs.us-east-1.amazonaws.com/123456789012/q\n");
    let p = parse_ok(&text);
    assert_eq!(
        p.interruption_queue.as_deref(),
        Some("https://sqs.us-east-1.amazonaws.com/123456789012/q")
    );
    assert!(p.pools[0].replace_on_rebalance);
    let p = parse_ok(&one_pool(&[]));
    assert_eq!(p.interruption_queue, None);
    assert!(!p.pools[0].replace_on_rebalance);
}

#[test]
fn gpu_metrics_and_xid_errors_are_read_with_their_defaults() {
    let mut text = one_pool(&["    health: {xidErrors: {codes: [79], gracePeriod: 30s}}"]);
    text.push_str("gpuMetrics: {prometheusUrl: 'http://prometheus.monitoring:9090/', selector: 'job=\"dcgm-exporter\"'}\n");
    let p = parse_ok(&text);
    let g = p.gpu_metrics.expect("gpuMetrics");
    assert_eq!(g.prometheus_url, "http://prometheus.monitoring:9090");
    assert_eq!(g.selector, r#"job="dcgm-exporter""#);
    assert_eq!(g.node_label, "Hostname");
    assert_eq!(g.interval, Duration::from_secs(30));
    assert_eq!(p.pools[0].health.xid_codes, [79]);
    assert_eq!(p.pools[0].health.xid_grace, Duration::from_secs(30));
    let p = parse_ok(&one_pool(&[]));
    assert_eq!(p.gpu_metrics, None);
    assert_eq!(p.pools[0].health.xid_codes, [48, 63, 64, 74, 79, 94, 95]);
}

#[test]
fn orphans_are_kept_unless_the_policy_says_drain() {
    let parse = |text: &str| parse_policy(text, "p.yaml").unwrap();
    assert_eq!(parse(&one_pool(&[])).orphans, Orphans::Keep);
    assert_eq!(parse(&one_pool(&["orphans: keep"])).orphans, Orphans::Keep);
    assert_eq!(
        parse(&one_pool(&["orphans: drain"])).orphans,
        Orphans::Drain
    );
}

#[test]
fn orphan_making_changes_of_cluster_name_or_region_are_named_on_reload() {
    let parse = |text: &str| parse_policy(text, "p.yaml").unwrap();
    let old = parse(&one_pool(&["clusterName: ml-prod", "region: us-east-1"]));
    assert_eq!(old.identity_change(&old), None);
    let same_but_pools = parse(&one_pool(&[
        "clusterName: ml-prod",
        "region: us-east-1",
        "maxConcurrentDrains: 3",
    ]));
    assert_eq!(same_but_pools.identity_change(&old), None);
    let renamed = parse(&one_pool(&["clusterName: ml-dev", "region: us-east-1"]));
    let why = renamed.identity_change(&old).expect("refused");
    assert!(
        why.starts_with("clusterName changed from \"ml-prod\" to \"ml-dev\""),
        "{why}"
    );
    let moved = parse(&one_pool(&["clusterName: ml-prod", "region: us-west-2"]));
    let why = moved.identity_change(&old).expect("refused");
    assert!(
        why.starts_with("region changed from us-east-1 to us-west-2"),
        "{why}"
    );
}

#[test]
fn disruption_budgets_expiry_and_grace_are_read() {
    let p = parse_ok(&one_pool(&[
        "    disruption:",
        "      expireAfter: 720h",
        "      terminationGracePeriod: 2h",
        "      budgets:",
        "        - nodes: \"10%\"",
        "        - nodes: 0",
        "          reasons: [Drifted, Underutilized]",
        "          schedule: \"0 9 * * mon-fri\"",
        "          duration: 8h",
        "        - nodes: \"3\"",
        "          reasons: [Empty]",
    ]));
    let d = &p.pools[0].disruption;
    assert_eq!(d.expire_after, Some(Duration::from_secs(720 * 3600)));
    assert_eq!(d.termination_grace_period, Some(mins(120)));
    assert_eq!(d.budgets.len(), 3);
    assert_eq!(d.budgets[0].nodes, BudgetNodes::Percent(10));
    assert!(d.budgets[0].reasons.is_empty() && d.budgets[0].schedule.is_none());
    assert_eq!(d.budgets[1].nodes, BudgetNodes::Count(0));
    assert_eq!(
        d.budgets[1].reasons,
        [Reason::Drifted, Reason::Underutilized]
    );
    let (cron, window) = d.budgets[1].schedule.as_ref().unwrap();
    assert_eq!(
        (cron.text.as_str(), *window),
        ("0 9 * * mon-fri", mins(480))
    );
    assert_eq!(d.budgets[2].nodes, BudgetNodes::Count(3));
    // `Never` and nothing: no expiry.
    let never = parse_ok(&one_pool(&["    disruption: {expireAfter: Never}"]));
    assert_eq!(never.pools[0].disruption, Disruption::default());
}

#[test]
fn bad_disruption_budgets_are_reported_at_their_field() {
    let cases = vec![
        (
            vec!["    disruption:", "      budgets:", "        - nodes: \"110%\""],
            (8, 11),
            "pools[0].disruption.budgets[0].nodes: must be a number of nodes (0 or more) or a \
             percentage from \"0%\" to \"100%\", got \"110%\"",
        ),
        (
            vec!["    disruption:", "      budgets:", "        - nodes: ten"],
            (8, 11),
            "budgets[0].nodes: must be a number of nodes",
        ),
        (
            vec![
                "    disruption:",
                "      budgets:",
                "        - nodes: 1",
                "          schedule: \"0 25 * * *\"",
                "          duration: 1h",
            ],
            (9, 11),
            "pools[0].disruption.budgets[0].schedule: invalid schedule \"0 25 * * *\": hour field: \
             25 is outside 0-23",
        ),
        (
            vec![
                "    disruption:",
                "      budgets:",
                "        - nodes: 1",
                "          schedule: \"@daily\"",
            ],
            (9, 11),
            "budgets[0].schedule: a schedule needs a duration",
        ),
        (
            vec![
                "    disruption:",
                "      budgets:",
                "        - nodes: 1",
                "          reasons: [Drifted, Sideways]",
            ],
            (9, 30),
            "budgets[0].reasons[1]: unknown reason \"Sideways\"",
        ),
        (
            vec!["    disruption: {expireAfter: 30 days}"],
            (6, 18),
            "pools[0].disruption.expireAfter: invalid duration",
        ),
        (
            vec!["    disruption: {terminationGracePeriod: soon}"],
            (6, 18),
            "pools[0].disruption.terminationGracePeriod: invalid duration",
        ),
    ];
    assert_one_error_each(cases, one_pool);
}

/// A pool backed by Auto Scaling groups and nothing else: its instance types, zones, capacity
/// types, labels and taints come from its groups' templates; what the policy gives wins.
#[test]
fn asg_group_templates_fill_what_the_policy_leaves_out_and_the_policy_wins() {
    use crate::plan::templates::Templates;
    use gpu_node_autoscaler_provider::{CapacityType, GroupTemplate};
    let p = parse_ok(&yaml(&[
        "pools:",
        "  - name: tagged",
        "    provider: aws",
        "    maxNodes: 4",
        "    aws: {autoScalingGroups: {autoDiscovery: {}}}",
        "  - name: pinned",
        "    provider: aws",
        "    instanceTypes: [g5.xlarge]",
        "    zones: [us-east-1b]",
        "    capacityTypes: [on-demand]",
        "    labels: {team: from-policy}",
        "    taints: [{key: policy, value: x, effect: NoSchedule}]",
        "    maxNodes: 4",
        "    aws: {autoScalingGroups: {names: [a10g-spot-a, l4-od-b]}}",
    ]));
    let tagged = &p.pools[0];
    assert!(tagged.templates_from_cloud && tagged.instance_types.is_none());
    assert!(tagged.zones.is_empty());
    assert_eq!(
        tagged.capacity_types,
        [CapacityType::Spot, CapacityType::OnDemand]
    );
    // Not read yet: the pool plans nothing, and that is no error.
    let types = crate::catalog::parse_csv(crate::catalog::BUILTIN_AWS, "builtin").unwrap();
    let before = Templates::new(
        &p,
        &crate::catalog::offerings_from_list_prices(&p, types.clone()),
    );
    assert!(before.errors.is_empty(), "{:?}", before.errors);
    assert!(before
        .for_snapshot(&Default::default(), crate::model::Time(0))
        .iter()
        .all(|t| t.pool_name != "tagged"));

    let groups = vec![
        GroupTemplate {
            group: "a10g-spot-a".into(),
            instance_types: vec!["g5.xlarge".into(), "g5.2xlarge".into()],
            zones: vec!["us-east-1a".into()],
            capacity_type: Some(CapacityType::Spot),
            labels: [(
                "nvidia.com/gpu.product".to_string(),
                "NVIDIA-A10G".to_string(),
            )]
            .into(),
            taints: vec![(
                "nvidia.com/gpu".into(),
                "present".into(),
                "NoSchedule".into(),
            )],
            resources: [("example.com/fpga".to_string(), "2".to_string())].into(),
        },
        GroupTemplate {
            group: "l4-od-b".into(),
            instance_types: vec!["g6.xlarge".into(), "g5.xlarge".into()],
            zones: vec!["us-east-1b".into()],
            capacity_type: Some(CapacityType::OnDemand),
            labels: [("team".to_string(), "ml".to_string())].into(),
            taints: Vec::new(),
            resources: BTreeMap::new(),
        },
    ];
    let found: BTreeMap<String, Vec<GroupTemplate>> = [
        ("tagged".to_string(), groups.clone()),
        ("pinned".to_string(), groups.clone()),
    ]
    .into();
    let merged = p.with_cloud_templates(&found);
    let tagged = &merged.pools[0];
    assert_eq!(tagged.zones, ["us-east-1a", "us-east-1b"]);
    assert_eq!(
        tagged.capacity_types,
        [CapacityType::Spot, CapacityType::OnDemand]
    );
    // The pinned pool keeps what its policy says.
    assert_eq!(merged.pools[1].zones, ["us-east-1b"]);
    assert_eq!(merged.pools[1].capacity_types, [CapacityType::OnDemand]);

    let catalog = crate::catalog::offerings_from_list_prices(&merged, types);
    let t = Templates::new(&merged, &catalog);
    assert!(t.errors.is_empty(), "{:?}", t.errors);
    let all = t.for_snapshot(&Default::default(), crate::model::Time(0));
    let of = |pool: &str, it: &str| {
        all.iter()
            .find(|t| t.pool_name == pool && t.instance_type == it)
            .unwrap_or_else(|| panic!("no template {pool}/{it}"))
    };
    let mut tagged_types: Vec<&str> = all
        .iter()
        .filter(|t| t.pool_name == "tagged")
        .map(|t| t.instance_type.as_str())
        .collect();
    tagged_types.sort();
    assert_eq!(tagged_types, ["g5.2xlarge", "g5.xlarge", "g6.xlarge"]);
    // g5.xlarge: spot in 1a from the first group, on-demand in 1b from the second; each
    // offering with the labels of its group; the taints of every group launching the type.
    let g5 = of("tagged", "g5.xlarge");
    let keys: Vec<String> = g5.offerings.iter().map(|o| o.key.to_string()).collect();
    assert_eq!(
        keys,
        [
            "g5.xlarge/us-east-1a/spot",
            "g5.xlarge/us-east-1b/on-demand"
        ]
    );
    assert_eq!(
        g5.offerings[0].labels["nvidia.com/gpu.product"],
        "NVIDIA-A10G"
    );
    assert!(!g5.offerings[0].labels.contains_key("team"));
    assert_eq!(g5.offerings[1].labels["team"], "ml");
    assert_eq!(g5.taints.len(), 1);
    assert_eq!(g5.taints[0].key, "nvidia.com/gpu");
    assert_eq!(g5.gpus, 1, "GPUs from the instance type");
    assert_eq!(g5.allocatable.get("example.com/fpga"), 2);
    let g6 = of("tagged", "g6.xlarge");
    assert!(g6.taints.is_empty());
    assert_eq!(g6.allocatable.get("example.com/fpga"), 0);
    // The pinned pool: its types, zones, capacity types, labels and taints win.
    let pinned_all: Vec<&crate::plan::templates::Template> =
        all.iter().filter(|t| t.pool_name == "pinned").collect();
    assert_eq!(pinned_all.len(), 1);
    let pinned = pinned_all[0];
    assert_eq!(pinned.instance_type, "g5.xlarge");
    let keys: Vec<String> = pinned.offerings.iter().map(|o| o.key.to_string()).collect();
    assert_eq!(keys, ["g5.xlarge/us-east-1b/on-demand"]);
    assert_eq!(pinned.offerings[0].labels["team"], "from-policy");
    assert_eq!(pinned.taints.len(), 1);
    assert_eq!(pinned.taints[0].key, "policy");
}
