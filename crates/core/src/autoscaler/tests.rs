//! Timelines of the decision core on a virtual clock, against a scripted cloud: every rule that
//! used to be reachable only end to end.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use gpu_node_autoscaler_provider::{
    CapacityType, Instance, InstanceState, LaunchRequest, LaunchResult, Notice, NoticeKind,
    OfferingKey, ProviderError,
};

use super::*;
use crate::catalog;
use crate::fixtures::{NodeBuilder, PodBuilder};
use crate::model::constraints::Effect;
use crate::model::{labels, Node, Pod, Time};
use crate::policy::parse_policy;

const T0: Time = Time(1_800_000_000_000);

const POLICY: &str = r#"
zones: [us-east-1a, us-east-1b]
maxNodeProvisionTime: 10m
insufficientCapacityTtl: 5m
pools:
  - name: a10g
    instanceTypes: [g5.xlarge, g5.12xlarge]
    capacityTypes: [spot, on-demand]
    maxNodes: 20
    scaleDown: {unneededTime: 3m, cooldownAfterScaleUp: 3m}
"#;

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn key(instance_type: &str, zone: &str, ct: CapacityType) -> OfferingKey {
    OfferingKey {
        instance_type: instance_type.into(),
        zone: zone.into(),
        capacity_type: ct,
    }
}

/// A cloud that launches what it has capacity for, offering by offering, and answers with
/// scripted errors.
#[derive(Default)]
struct Cloud {
    instances: Vec<Instance>,
    /// Capacity per offering (unlimited when absent).
    capacity: BTreeMap<OfferingKey, u32>,
    /// The next launches fail with these, whatever they ask for.
    fail_next: Vec<ProviderError>,
    /// Terminations fail with this (an IAM condition that denies them), leaving the instance.
    terminate_fails: Option<ProviderError>,
    /// Instances younger than this are not listed yet (an eventually consistent listing).
    listing_lag: Option<Duration>,
    /// Idempotent per launch id: every instance ever created under an id counts, terminated
    /// ones included, and only the rest is launched.
    remembers_launch_ids: bool,
    /// Launches answer with no instance, as an Auto Scaling group's raise whose instances are
    /// not listed yet: they come (are listed) after `listing_lag`.
    answers_late: bool,
    next_id: u32,
}

impl Cloud {
    fn launch(&mut self, req: &LaunchRequest, now: Time) -> Result<LaunchResult, ProviderError> {
        if !self.fail_next.is_empty() {
            return Err(self.fail_next.remove(0));
        }
        let mut res = LaunchResult::default();
        let mut remaining = req.count;
        if self.remembers_launch_ids {
            let made = self
                .instances
                .iter()
                .filter(|i| i.launch_id == req.launch_id)
                .count() as u32;
            remaining = remaining.saturating_sub(made);
        }
        for k in &req.offerings {
            if remaining == 0 {
                break;
            }
            let cap = self.capacity.get(k).copied().unwrap_or(u32::MAX);
            let n = remaining.min(cap);
            if n == 0 {
                res.failures.push((
                    k.clone(),
                    ProviderError::InsufficientCapacity {
                        offering: k.clone(),
                    },
                ));
                continue;
            }
            if let Some(c) = self.capacity.get_mut(k) {
                *c -= n;
            }
            for _ in 0..n {
                self.next_id += 1;
                let id = format!("i-{}", self.next_id);
                let i = Instance {
                    provider_id: format!("aws:///{}/{id}", k.zone),
                    id,
                    pool: req.pool.clone(),
                    launch_id: req.launch_id.clone(),
                    offering: k.clone(),
                    state: InstanceState::Pending,
                    launched_at_ms: now.0,
                    // As EC2 says of an instance in a reservation: the one the request
                    // names first for the offering.
                    reservation_id: req
                        .reservations
                        .iter()
                        .find(|r| r.offering() == *k)
                        .map(|r| r.id.clone()),
                    // As EC2 keeps the launch's tags.
                    launch_fingerprint: req.tags.get(labels::LAUNCH_FINGERPRINT).cloned(),
                    unclaimed: false,
                };
                self.instances.push(i.clone());
                if !self.answers_late {
                    res.launched.push(i);
                }
            }
            remaining -= n;
        }
        Ok(res)
    }

    fn live(&self) -> Vec<Instance> {
        self.instances
            .iter()
            .filter(|i| i.state != InstanceState::Terminated)
            .cloned()
            .collect()
    }

    /// Terminates `id`, or fails as scripted.
    fn try_terminate(&mut self, id: &str) -> Result<(), ProviderError> {
        if let Some(e) = &self.terminate_fails {
            return Err(e.clone());
        }
        self.terminate(id);
        Ok(())
    }

    fn terminate(&mut self, id: &str) {
        for i in &mut self.instances {
            if i.id == id {
                i.state = InstanceState::Terminated;
            }
        }
    }
}

/// The core, the cloud and the cluster it looks at, and every action it took.
struct Run {
    core: Autoscaler,
    cloud: Cloud,
    pods: Vec<Pod>,
    nodes: Vec<Node>,
    actions: Vec<Action>,
    /// Notices for the next pass.
    notices: Vec<Notice>,
    /// XIDs read for the next pass.
    gpu_xids: Option<BTreeMap<String, Vec<GpuXid>>>,
    /// The account's capacity reservations, as the cloud reports them each pass.
    reservations: Vec<gpu_node_autoscaler_provider::Reservation>,
    /// What the pools' moving launch template versions resolve to, as the cloud reports it
    /// each pass.
    launch_versions: BTreeMap<String, String>,
}

impl Run {
    fn new(config: Config) -> Run {
        Run::with_policy(config, POLICY)
    }

    fn with_policy(config: Config, text: &str) -> Run {
        let policy = parse_policy(text, "policy.yaml").unwrap_or_else(|e| panic!("{e}"));
        let types = catalog::parse_csv(catalog::BUILTIN_AWS, "builtin").unwrap();
        let mut catalog = catalog::offerings_from_list_prices(&policy, types);
        for o in &mut catalog.offerings {
            o.available = true;
        }
        let mut core = Autoscaler::new(config);
        core.set_policy(Arc::new(policy), catalog);
        core.restore(None);
        Run {
            core,
            cloud: Cloud::default(),
            pods: Vec::new(),
            nodes: Vec::new(),
            actions: Vec::new(),
            notices: Vec::new(),
            gpu_xids: None,
            reservations: Vec::new(),
            launch_versions: BTreeMap::new(),
        }
    }

    fn observation(&self, now: Time) -> Observation {
        Observation {
            now,
            snapshot: Snapshot {
                pods: self.pods.clone(),
                nodes: self.nodes.clone(),
                reservations: self.reservations.clone(),
                launch_versions: self.launch_versions.clone(),
                ..Default::default()
            },
            instances: Some(Arc::new(
                self.cloud
                    .live()
                    .into_iter()
                    .filter(|i| {
                        self.cloud
                            .listing_lag
                            .is_none_or(|lag| Time(i.launched_at_ms) + lag <= now)
                    })
                    .collect(),
            )),
            other_provider_ids: Vec::new(),
            policy_valid: true,
            notices: Vec::new(),
            gpu_xids: None,
        }
    }

    /// One whole pass at `now`; returns its actions (also kept in `self.actions`).
    fn pass(&mut self, now: Time) -> Vec<Action> {
        let mut all = Vec::new();
        let mut obs = self.observation(now);
        obs.notices = std::mem::take(&mut self.notices);
        obs.gpu_xids = self.gpu_xids.take();
        let mut actions = self.core.pass(obs);
        let mut steps = 0;
        while !actions.is_empty() {
            steps += 1;
            assert!(steps < 10, "the pass does not end");
            let mut feedback = Vec::new();
            for a in &actions {
                match a {
                    Action::Launch { request, .. } => feedback.push(Feedback::Launched {
                        launch_id: request.launch_id.clone(),
                        result: self.cloud.launch(request, now),
                    }),
                    Action::Terminate { instance_id, .. } => feedback.push(Feedback::Terminated {
                        instance_id: instance_id.clone(),
                        result: self.cloud.try_terminate(instance_id),
                    }),
                    Action::Taint {
                        node,
                        taint,
                        present,
                    } => {
                        if let Some(n) = self.nodes.iter_mut().find(|n| &n.name == node) {
                            n.taints.retain(|t| t.key != taint.key);
                            if *present {
                                n.taints.push(taint.clone());
                            }
                        }
                    }
                    Action::Annotate { node, key, value } => {
                        if let Some(n) = self.nodes.iter_mut().find(|n| &n.name == node) {
                            match value {
                                Some(v) => Arc::make_mut(&mut n.annotations)
                                    .insert(key.to_string(), v.clone()),
                                None => Arc::make_mut(&mut n.annotations).remove(*key),
                            };
                        }
                    }
                    Action::Register(r) => {
                        if let Some(n) = self.nodes.iter_mut().find(|n| n.name == r.node) {
                            r.apply(n);
                        }
                        feedback.push(Feedback::Registered {
                            node: r.node.clone(),
                            changed: true,
                        });
                    }
                    _ => {}
                }
            }
            all.extend(actions);
            actions = self.core.resume(feedback);
        }
        self.actions.extend(all.iter().cloned());
        all
    }

    /// Gives the last node pushed an instance of ours (launched before this process started).
    fn with_our_instance(&mut self) {
        let n = self.nodes.last_mut().expect("a node");
        let (zone, instance_type) = (n.zone().unwrap(), n.instance_type().unwrap());
        let id = format!("i-{}", n.name);
        let i = Instance {
            provider_id: format!("aws:///{zone}/{id}"),
            pool: n.pool().unwrap().to_string(),
            launch_id: format!("before-{id}"),
            offering: key(instance_type, zone, CapacityType::OnDemand),
            state: InstanceState::Running,
            launched_at_ms: n.created.0,
            reservation_id: None,
            launch_fingerprint: None,
            unclaimed: false,
            id,
        };
        n.provider_id = Some(i.provider_id.clone());
        Arc::make_mut(&mut n.labels).insert(labels::LAUNCH_ID.into(), i.launch_id.clone());
        self.cloud.instances.push(i);
    }

    /// The instance registers as a Ready node of its pool with its GPUs advertised.
    fn register(&mut self, instance_id: &str, gpus: i64, created: Time) {
        let i = self
            .cloud
            .instances
            .iter()
            .find(|i| i.id == instance_id)
            .unwrap()
            .clone();
        // As registration leaves it: with the GPU model label of its type, too.
        let model = self
            .core
            .catalog()
            .instance_type(&i.offering.instance_type)
            .and_then(|t| t.gpu.as_ref())
            .map_or(String::new(), |g| g.model.clone());
        let mut n = NodeBuilder::new(&format!("node-{instance_id}"))
            .pool("a10g", &i.offering.instance_type, &i.offering.zone)
            .label(labels::GPU_MODEL, &model)
            .label(labels::CAPACITY_TYPE, i.offering.capacity_type.as_str())
            .label(
                labels::KARPENTER_CAPACITY_TYPE,
                i.offering.capacity_type.as_str(),
            )
            .label(labels::LAUNCH_ID, &i.launch_id)
            .annotation(labels::GPUS_ADVERTISED, "true")
            .cpu_milli(4000)
            .memory_gib(16)
            .gpus(gpus)
            .created(created)
            .build();
        n.provider_id = Some(i.provider_id.clone());
        self.nodes.push(n);
    }
}

fn launches(actions: &[Action]) -> Vec<&LaunchRequest> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Launch { request, .. } => Some(request),
            _ => None,
        })
        .collect()
}

fn terminated(actions: &[Action]) -> Vec<&str> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Terminate { instance_id, .. } => Some(instance_id.as_str()),
            _ => None,
        })
        .collect()
}

fn drains(actions: &[Action]) -> Vec<&DrainOrder> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Drain(d) => Some(d),
            _ => None,
        })
        .collect()
}

fn status(actions: &[Action]) -> Option<&Status> {
    actions.iter().rev().find_map(|a| match a {
        Action::Status(s) => Some(&**s),
        _ => None,
    })
}

fn gpu_pod(name: &str, gpus: i64) -> Pod {
    PodBuilder::new("ml", name).gpus(gpus).build()
}

#[test]
fn no_decision_before_the_last_leaders_history_is_read() {
    let mut run = Run::new(Config::default());
    run.core.leadership_lost(&[]);
    run.pods.push(gpu_pod("p", 1));
    assert!(run.core.needs_restore());
    assert!(run.pass(T0).is_empty());
    run.core.restore(None);
    assert_eq!(launches(&run.pass(T0)).len(), 1);
}

#[test]
fn an_offering_out_of_capacity_is_avoided_and_the_rest_planned_again_at_once() {
    let mut run = Run::new(Config::default());
    for z in ["us-east-1a", "us-east-1b"] {
        for ct in [CapacityType::Spot, CapacityType::OnDemand] {
            run.cloud.capacity.insert(key("g5.xlarge", z, ct), 0);
        }
    }
    run.pods.push(gpu_pod("p", 1));
    let actions = run.pass(T0);
    let l = launches(&actions);
    assert_eq!(l.len(), 2, "the same pass plans again: {l:?}");
    assert_eq!(l[0].offerings[0].instance_type, "g5.xlarge");
    assert_eq!(l[1].offerings[0].instance_type, "g5.12xlarge");
    assert_ne!(l[0].launch_id, l[1].launch_id);
    assert_eq!(run.cloud.live().len(), 1);
    let st = status(&actions).expect("a status");
    assert_eq!(st.unavailable_offerings.len(), 4, "{st:?}");
    // The next pass sees the launch in flight: nothing more.
    assert!(launches(&run.pass(T0 + secs(10))).is_empty());
    // Once the cache expires and the instance is gone, g5.xlarge is tried again.
    run.cloud.terminate("i-1");
    run.cloud.capacity.clear();
    let l = run.pass(T0 + secs(301));
    assert_eq!(launches(&l)[0].offerings[0].instance_type, "g5.xlarge");
}

#[test]
fn planning_stops_after_three_rounds_when_every_offering_runs_out() {
    let mut run = Run::new(Config::default());
    for t in ["g5.xlarge", "g5.12xlarge"] {
        for z in ["us-east-1a", "us-east-1b"] {
            for ct in [CapacityType::Spot, CapacityType::OnDemand] {
                run.cloud.capacity.insert(key(t, z, ct), 0);
            }
        }
    }
    run.pods.push(gpu_pod("p", 1));
    let actions = run.pass(T0);
    assert_eq!(launches(&actions).len(), 2, "then nothing is left to try");
    assert!(run.core.last_plan().unwrap().scale_ups.is_empty());
    assert!(run.core.last_plan().unwrap().unschedulable[0]
        .reason
        .contains("capacity"));
}

#[test]
fn a_gang_launched_in_part_is_given_back_and_planned_again_under_a_new_id() {
    let mut run = Run::new(Config::default());
    // Two 4-GPU workers: one g5.12xlarge each, in one zone. Only one is to be had anywhere.
    for z in ["us-east-1a", "us-east-1b"] {
        for ct in [CapacityType::Spot, CapacityType::OnDemand] {
            run.cloud.capacity.insert(key("g5.12xlarge", z, ct), 0);
        }
    }
    run.cloud
        .capacity
        .insert(key("g5.12xlarge", "us-east-1a", CapacityType::Spot), 1);
    for w in ["w-0", "w-1"] {
        run.pods
            .push(PodBuilder::new("ml", w).gpus(4).gang("job", 2).build());
    }
    let actions = run.pass(T0);
    let first = launches(&actions)[0].clone();
    assert_eq!(first.count, 2);
    assert_eq!(
        terminated(&actions),
        ["i-1"],
        "the partial launch is given back"
    );
    assert!(run.cloud.live().is_empty());
    assert!(actions.iter().any(|a| matches!(a,
        Action::Event(Note { reason: "NotTriggerScaleUp", message, .. })
            if message.contains("given back"))));
    let st = status(&actions).unwrap();
    assert!(st.given_up_launches.contains_key(&first.launch_id));
    // Capacity comes back after the cache expires: the gang gets a new launch, whole.
    run.cloud.capacity.clear();
    let actions = run.pass(T0 + secs(301));
    let again = launches(&actions);
    assert_eq!(again.len(), 1);
    assert_ne!(again[0].launch_id, first.launch_id);
    assert_eq!(run.cloud.live().len(), 2);
}

#[test]
fn a_gang_short_of_spot_in_its_zone_moves_to_the_next_zones_spot_not_to_on_demand() {
    let mut run = Run::new(Config::default());
    run.cloud
        .capacity
        .insert(key("g5.12xlarge", "us-east-1a", CapacityType::Spot), 0);
    for w in ["w-0", "w-1"] {
        run.pods
            .push(PodBuilder::new("ml", w).gpus(4).gang("job", 2).build());
    }
    let mut asked = Vec::new();
    for t in 0..6 {
        for l in launches(&run.pass(T0 + secs(t * 10))) {
            asked.push(l.clone());
        }
    }
    // Planned first where spot is short; that launch falls back only within spot (the next
    // zone's spot is cheaper than on-demand here). The next launch goes there.
    assert_eq!(asked.len(), 2, "{asked:?}");
    assert_eq!(
        asked[0].offerings,
        [key("g5.12xlarge", "us-east-1a", CapacityType::Spot)]
    );
    assert_eq!(
        asked[1].offerings[0],
        key("g5.12xlarge", "us-east-1b", CapacityType::Spot)
    );
    let live = run.cloud.live();
    assert_eq!(live.len(), 2, "{live:?}");
    assert!(live
        .iter()
        .all(|i| i.offering == key("g5.12xlarge", "us-east-1b", CapacityType::Spot)));
}

#[test]
fn failures_other_than_capacity_back_the_pool_off() {
    let mut run = Run::new(Config::default());
    run.pods.push(gpu_pod("p", 1));
    run.cloud.fail_next = vec![ProviderError::QuotaExceeded {
        message: "vCPU limit".into(),
    }];
    let actions = run.pass(T0);
    assert_eq!(launches(&actions).len(), 1, "one try, no re-plan");
    assert!(actions.iter().any(|a| matches!(
        a,
        Action::Count(Count::FailedLaunch {
            reason: "quota_exceeded",
            ..
        })
    )));
    // The first back-off is 2.5–5 s.
    assert!(launches(&run.pass(T0 + secs(2))).is_empty());
    assert_eq!(launches(&run.pass(T0 + secs(5))).len(), 1);
    assert_eq!(run.cloud.live().len(), 1);
}

#[test]
fn the_back_off_doubles_with_each_failure_in_a_row() {
    let mut run = Run::new(Config::default());
    run.pods.push(gpu_pod("p", 1));
    run.cloud.fail_next = vec![
        ProviderError::Other {
            message: "boom".into(),
        };
        3
    ];
    let mut tries = Vec::new();
    for s in 0..60 {
        if !launches(&run.pass(T0 + secs(s))).is_empty() {
            tries.push(s);
        }
    }
    assert_eq!(tries.len(), 4, "three failures, then the launch: {tries:?}");
    let waits: Vec<u64> = tries.windows(2).map(|w| w[1] - w[0]).collect();
    // Drawn from [d/2, d] for d = 5, 10, 20 s (passes are 1 s apart).
    assert!((3..=5).contains(&waits[0]), "{waits:?}");
    assert!((5..=10).contains(&waits[1]), "{waits:?}");
    assert!((10..=20).contains(&waits[2]), "{waits:?}");
    assert_eq!(run.cloud.live().len(), 1);
}

#[test]
fn a_launch_that_never_becomes_a_node_is_given_up_and_planned_elsewhere() {
    let mut run = Run::new(Config::default());
    run.pods.push(gpu_pod("p", 1));
    let first = launches(&run.pass(T0))[0].clone();
    assert!(launches(&run.pass(T0 + secs(599))).is_empty(), "in flight");
    let actions = run.pass(T0 + secs(600));
    assert_eq!(terminated(&actions), ["i-1"]);
    assert!(actions.iter().any(|a| matches!(
        a,
        Action::Count(Count::FailedLaunch {
            reason: "provision_timeout",
            ..
        })
    )));
    let again = launches(&actions);
    assert_eq!(again.len(), 1, "planned again in the same pass");
    assert_ne!(again[0].launch_id, first.launch_id);
    assert_ne!(
        again[0].offerings[0], first.offerings[0],
        "the offering that did not come up is avoided"
    );
}

#[test]
fn a_launch_id_the_cloud_used_before_is_planned_again_under_a_new_id() {
    // The launch id the pod's scale-up gets.
    let mut scratch = Run::new(Config::default());
    scratch.pods.push(gpu_pod("p", 1));
    let used = launches(&scratch.pass(T0))[0].launch_id.clone();
    // A cloud that remembers it: an instance launched under it three hours ago, terminated two
    // hours ago (longer than this process remembers launch ids it gave up).
    let mut run = Run::new(Config::default());
    run.cloud.remembers_launch_ids = true;
    run.cloud.instances.push(Instance {
        id: "i-old".into(),
        provider_id: "aws:///us-east-1a/i-old".into(),
        pool: "a10g".into(),
        launch_id: used.clone(),
        offering: key("g5.xlarge", "us-east-1a", CapacityType::Spot),
        state: InstanceState::Terminated,
        launched_at_ms: (T0 - secs(3 * 3600)).0,
        reservation_id: None,
        launch_fingerprint: None,
        unclaimed: false,
    });
    run.pods.push(gpu_pod("p", 1));
    // Asked under it at every pass, the cloud launching nothing, for the max node provision time
    // (10m): an answer without instances may be a launch still under way.
    for s in (0..600).step_by(10) {
        let actions = run.pass(T0 + secs(s));
        let ids: Vec<&str> = launches(&actions)
            .iter()
            .map(|l| l.launch_id.as_str())
            .collect();
        assert_eq!(ids, [used.as_str()], "{s}s");
        assert!(
            run.cloud.live().is_empty(),
            "{s}s: the cloud launched nothing"
        );
    }
    // Then it is given up (asked once more), and the next pass launches the pod's node under
    // another id.
    run.pass(T0 + secs(600));
    assert!(run.cloud.live().is_empty());
    let next = run.pass(T0 + secs(610));
    let again = launches(&next);
    assert_eq!(again.len(), 1);
    assert_ne!(again[0].launch_id, used);
    assert_eq!(run.cloud.live().len(), 1);
    assert!(launches(&run.pass(T0 + secs(620))).is_empty(), "in flight");
    assert_eq!(run.cloud.live().len(), 1);
}

#[test]
fn a_launch_the_cloud_answers_late_is_asked_again_under_its_id_and_launched_once() {
    // An Auto Scaling group's raise: the answer has no instance, the instance is listed 3
    // minutes later. Passes every 10 s for 9 minutes (within the max node provision time, after
    // which an instance that is no Node is given up).
    let mut run = Run::new(Config::default());
    run.cloud.remembers_launch_ids = true;
    run.cloud.answers_late = true;
    run.cloud.listing_lag = Some(secs(180));
    run.pods.push(gpu_pod("p", 1));
    let mut ids = std::collections::BTreeSet::new();
    for s in (0..540).step_by(10) {
        let actions = run.pass(T0 + secs(s));
        ids.extend(launches(&actions).iter().map(|l| l.launch_id.clone()));
    }
    assert_eq!(ids.len(), 1, "one launch id: {ids:?}");
    assert_eq!(run.cloud.live().len(), 1, "one instance");
}

/// A registered on-demand g5.xlarge of pool a10g in `zone`, two hours old and unneeded for one.
fn idle_on_demand_a10g(name: &str, zone: &str) -> crate::model::Node {
    NodeBuilder::new(name)
        .pool("a10g", "g5.xlarge", zone)
        .label(labels::GPU_MODEL, "A10G")
        .gpus(1)
        .annotation(labels::GPUS_ADVERTISED, "true")
        .annotation(labels::UNNEEDED_SINCE, &(T0 - secs(3600)).to_rfc3339())
        .created(T0 - secs(7200))
        .label(labels::CAPACITY_TYPE, "on-demand")
        .label(labels::KARPENTER_CAPACITY_TYPE, "on-demand")
        .build()
}

#[test]
fn orphan_instances_with_our_name_but_no_identity_are_reported_once_and_never_touched() {
    let mut run = Run::new(Config::default());
    // An idle node of the pool whose instance carries our name but no identity, unneeded for
    // an hour, and an instance of the same kind without a Node, launched an hour ago.
    run.nodes
        .push(idle_on_demand_a10g("stranger", "us-east-1b"));
    run.with_our_instance();
    let lone = Instance {
        id: "i-lone".into(),
        provider_id: "aws:///us-east-1a/i-lone".into(),
        pool: "a10g".into(),
        launch_id: String::new(),
        offering: key("g5.xlarge", "us-east-1a", CapacityType::OnDemand),
        state: InstanceState::Running,
        launched_at_ms: (T0 - secs(3600)).0,
        reservation_id: None,
        launch_fingerprint: None,
        unclaimed: true,
    };
    run.cloud.instances.push(lone);
    for i in &mut run.cloud.instances {
        i.unclaimed = true;
    }
    // Two hours of passes, a minute apart.
    for minute in 0..120 {
        let actions = run.pass(T0 + secs(60 * minute));
        assert!(
            terminated(&actions).is_empty(),
            "minute {minute}: {actions:?}"
        );
        assert!(drains(&actions).is_empty(), "minute {minute}: {actions:?}");
    }
    // Reported once each, on the pool.
    let reported = events(&run.actions, "InstanceUnclaimed");
    assert_eq!(reported.len(), 2, "{reported:?}");
    assert!(reported[0]
        .message
        .contains("neither managed nor terminated"));
    assert!(reported
        .iter()
        .all(|n| n.subject == Subject::Pool("a10g".into())));
    assert!(!run.actions.iter().any(|a| matches!(
        a,
        Action::Count(Count::FailedLaunch { .. } | Count::GiveUpTerminateFailed { .. })
    )));
    // Its offering is not short: a pod that fits it gets it first.
    assert!(
        run.core.launches.ice.is_empty(),
        "{:?}",
        run.core.launches.ice
    );
    run.pods.push(
        PodBuilder::new("ml", "p")
            .gpus(1)
            .selector(labels::ZONE, "us-east-1a")
            .selector(labels::CAPACITY_TYPE, "on-demand")
            .build(),
    );
    let actions = run.pass(T0 + secs(60 * 120));
    let l = launches(&actions);
    assert_eq!(l.len(), 1, "{actions:?}");
    assert_eq!(
        l[0].offerings[0],
        key("g5.xlarge", "us-east-1a", CapacityType::OnDemand)
    );
    // Unclaimed instances do not count as the pool's in-flight capacity either.
    assert_eq!(run.cloud.live().len(), 3);
}

/// Policies where two g5.xlarge (one GPU each) are the most: by the pool's `maxNodes`, its
/// `maxGpus`, the cluster's `maxNodes`, the cluster's `maxGpus`.
const AT_MOST_TWO: [&str; 4] = [
    "pools: [{name: a10g, instanceTypes: [g5.xlarge], capacityTypes: [on-demand], maxNodes: 2}]",
    "pools: [{name: a10g, instanceTypes: [g5.xlarge], capacityTypes: [on-demand], maxNodes: 20, \
     maxGpus: 2}]",
    "limits: {maxNodes: 2}\n\
     pools: [{name: a10g, instanceTypes: [g5.xlarge], capacityTypes: [on-demand], maxNodes: 20}]",
    "limits: {maxGpus: 2}\n\
     pools: [{name: a10g, instanceTypes: [g5.xlarge], capacityTypes: [on-demand], maxNodes: 20}]",
];

#[test]
fn overrun_instances_that_never_join_and_cannot_be_terminated_hold_the_limits() {
    for limits in AT_MOST_TWO {
        let text =
            format!("zones: [us-east-1a, us-east-1b]\nmaxNodeProvisionTime: 10m\n{limits}\n");
        let mut run = Run::with_policy(Config::default(), &text);
        run.cloud.terminate_fails = Some(ProviderError::Other {
            message: "UnauthorizedOperation: an explicit deny in a service control policy".into(),
        });
        for p in ["p1", "p2", "p3", "p4"] {
            run.pods.push(gpu_pod(p, 1));
        }
        // No instance ever joins. A pass a minute for three hours, terminations denied.
        let mut tries = Vec::new();
        for minute in 0..180 {
            let actions = run.pass(T0 + secs(60 * minute));
            if terminated(&actions).contains(&"i-1") {
                tries.push(minute);
            }
            let live = run.cloud.live().len();
            assert!(live <= 2, "{limits}: {live} instances at minute {minute}");
        }
        assert_eq!(run.cloud.instances.len(), 2, "{limits}: launched once");
        // Given up at 10 minutes, then tried again with a growing wait, up to 10 minutes.
        let gaps: Vec<u64> = tries.windows(2).map(|w| w[1] - w[0]).collect();
        assert_eq!(tries[0], 10, "{limits}");
        assert_eq!(gaps[..6], [1, 1, 2, 4, 8, 10], "{limits}: {tries:?}");
        assert!(gaps[6..].iter().all(|g| *g == 10), "{limits}: {tries:?}");
        // Each failure reported and counted; the give-up itself counted once per instance.
        let failed = 2 * tries.len();
        assert_eq!(events(&run.actions, "GiveUpTerminateFailed").len(), failed);
        let counted = |f: &dyn Fn(&Count) -> bool| {
            run.actions
                .iter()
                .filter(|a| matches!(a, Action::Count(c) if f(c)))
                .count()
        };
        assert_eq!(
            counted(&|c| matches!(c, Count::GiveUpTerminateFailed { pool } if pool == "a10g")),
            failed
        );
        assert_eq!(
            counted(&|c| matches!(
                c,
                Count::FailedLaunch {
                    reason: "provision_timeout",
                    ..
                }
            )),
            2
        );
        // Once terminations go through (at the next try, minute 186), the instances go and the
        // pods are launched for again (those never join either, and are given up at 196).
        run.cloud.terminate_fails = None;
        let mut relaunched = 0;
        for minute in 180..195 {
            let actions = run.pass(T0 + secs(60 * minute));
            relaunched += launches(&actions).iter().map(|l| l.count).sum::<u32>();
            assert!(run.cloud.live().len() <= 2, "{limits}: at minute {minute}");
        }
        assert_eq!(relaunched, 2, "{limits}");
        assert!(
            run.cloud
                .live()
                .iter()
                .all(|i| i.id != "i-1" && i.id != "i-2"),
            "{limits}"
        );
    }
}

#[test]
fn a_node_that_never_advertises_its_gpus_is_given_up_but_one_that_loses_them_is_kept() {
    let mut run = Run::new(Config::default());
    run.pods.push(gpu_pod("p", 1));
    run.pass(T0);
    run.register("i-1", 0, T0 + secs(100));
    Arc::make_mut(&mut run.nodes[0].annotations).remove(labels::GPUS_ADVERTISED);
    let actions = run.pass(T0 + secs(600));
    assert_eq!(terminated(&actions), ["i-1"]);
    assert!(actions
        .iter()
        .any(|a| matches!(a, Action::DeleteNode { node } if node == "node-i-1")));

    let mut run = Run::new(Config::default());
    run.pods.push(gpu_pod("p", 1));
    run.pass(T0);
    run.register("i-1", 0, T0 + secs(100));
    let actions = run.pass(T0 + secs(7200));
    assert!(terminated(&actions).is_empty());
    assert!(actions.iter().any(|a| matches!(
        a,
        Action::Event(Note {
            reason: "GPUsUnavailable",
            ..
        })
    )));
    assert!(actions
        .iter()
        .any(|a| matches!(a, Action::Count(Count::NodesGpusLost(1)))));
}

#[test]
fn an_instance_that_is_gone_does_not_lend_its_launch_id_to_the_same_pods() {
    let mut run = Run::new(Config::default());
    run.pods.push(gpu_pod("p", 1));
    let first = launches(&run.pass(T0))[0].clone();
    run.pass(T0 + secs(10));
    // Interrupted before it registered; the same pod is planned again.
    run.cloud.terminate("i-1");
    let again = launches(&run.pass(T0 + secs(20)))[0].clone();
    assert_ne!(again.launch_id, first.launch_id);
}

#[test]
fn a_node_of_ours_without_its_pool_labels_is_registered_before_anything_is_planned() {
    let mut run = Run::new(Config::default());
    run.pods.push(gpu_pod("p", 1));
    run.pass(T0);
    run.register("i-1", 1, T0 + secs(100));
    let n = &mut run.nodes[0];
    Arc::make_mut(&mut n.labels).remove(labels::POOL);
    Arc::make_mut(&mut n.labels).remove(labels::LAUNCH_ID);
    run.pods.push(gpu_pod("q", 1));
    let actions = run.core.pass(run.observation(T0 + secs(120)));
    assert!(
        actions.iter().all(|a| matches!(a, Action::Register(_))),
        "{actions:?}"
    );
    let Action::Register(r) = &actions[0] else {
        unreachable!()
    };
    assert_eq!(r.labels[labels::POOL], "a10g");
    // Written: the pass ends there, and the next one plans on the registered node.
    let rest = run.core.resume(vec![Feedback::Registered {
        node: r.node.clone(),
        changed: true,
    }]);
    assert!(launches(&rest).is_empty() && !run.core.in_pass());
    // A registration that cannot be written does not stop scaling.
    let actions = run.core.pass(run.observation(T0 + secs(130)));
    assert!(matches!(actions[0], Action::Register(_)));
    let rest = run.core.resume(vec![Feedback::Registered {
        node: r.node.clone(),
        changed: false,
    }]);
    assert_eq!(launches(&rest).len(), 1, "q is planned: {rest:?}");
}

#[test]
fn an_idle_node_is_drained_after_its_unneeded_time_and_the_outcome_recorded() {
    let mut run = Run::new(Config::default());
    run.pods.push(gpu_pod("p", 1));
    run.pass(T0);
    run.register("i-1", 1, T0 + secs(100));
    // The pod ran and finished.
    run.pods.clear();
    let a = run.pass(T0 + secs(200));
    assert!(drains(&a).is_empty());
    assert!(a.iter().any(|a| matches!(
        a,
        Action::Annotate {
            key: labels::UNNEEDED_SINCE,
            value: Some(_),
            ..
        }
    )));
    let since = T0 + secs(200);
    Arc::make_mut(&mut run.nodes[0].annotations)
        .insert(labels::UNNEEDED_SINCE.into(), since.to_rfc3339());
    assert!(
        drains(&run.pass(T0 + secs(300))).is_empty(),
        "unneeded 100 s"
    );
    let a = run.pass(T0 + secs(381));
    let d = drains(&a);
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].instance_id.as_deref(), Some("i-1"));
    assert_eq!(d[0].deadline, T0 + secs(381) + secs(600));
    assert_eq!(d[0].kind, DrainKind::Voluntary, "a scale-down is a choice");
    assert!(run.core.draining("node-i-1"));
    // Not drained twice.
    assert!(drains(&run.pass(T0 + secs(391))).is_empty());
    let out = run
        .core
        .drain_finished("node-i-1", DrainOutcome::Removed, T0 + secs(420));
    assert_eq!(
        out,
        [Action::Count(Count::ScaleDown {
            pool: "a10g".into()
        })]
    );
    assert!(!run.core.draining("node-i-1"));
}

#[test]
fn drains_of_a_previous_leader_are_resumed_within_their_deadline_and_rolled_back_after() {
    let mut run = Run::new(Config::default());
    let tainted = |name: &str, started: Time| {
        NodeBuilder::new(name)
            .pool("a10g", "g5.xlarge", "us-east-1a")
            .gpus(1)
            .taint(labels::TO_BE_DELETED_TAINT, Effect::NoSchedule)
            .annotation(labels::DRAIN_STARTED, &started.to_rfc3339())
            .build()
    };
    run.nodes.push(tainted("recent", T0 - secs(300)));
    run.nodes.push(tainted("old", T0 - secs(900)));
    let a = run.pass(T0);
    let d = drains(&a);
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].node, "recent");
    assert_eq!(d[0].deadline, T0 + secs(300), "the first leader's deadline");
    assert!(a
        .iter()
        .any(|a| matches!(a, Action::RollBack { node, .. } if node == "old")));
    run.core.drain_finished(
        "old",
        DrainOutcome::RolledBack("past its deadline".into()),
        T0 + secs(1),
    );
    let st = run.pass(T0 + secs(20));
    let pool = &status(&st).unwrap().pools[0];
    assert!(pool.last_scale_down_failure.is_some(), "{pool:?}");
}

#[test]
fn a_new_leader_keeps_the_last_ones_cooldowns_and_given_up_launches() {
    // A pod that only zone b can take, so that an idle node in zone a is of no use to it.
    let zonal = || {
        PodBuilder::new("ml", "p")
            .gpus(1)
            .selector(labels::ZONE, "us-east-1b")
            .build()
    };
    // Leader A launches for it, gives the launch up after 10 minutes and launches again; its
    // status carries the scale-up and the given-up id.
    let mut a = Run::new(Config::default());
    a.pods.push(zonal());
    let first = launches(&a.pass(T0))[0].clone();
    let actions = a.pass(T0 + secs(600));
    assert_eq!(launches(&actions).len(), 1);
    let written = status(&actions).unwrap().clone();
    let json = serde_json::to_string(&written).unwrap();
    assert!(json.contains(&first.launch_id));
    // The relaunch is in flight, not listed yet: a new leader counts it (it launches nothing).
    assert_eq!(written.launched_unlisted.len(), 1, "{written:?}");
    // Without it (its launch failed), the new leader launches under a new id.
    let json_no_flight = serde_json::to_string(&Status {
        launched_unlisted: BTreeMap::new(),
        ..written
    })
    .unwrap();

    // Leader B takes over a minute later, with an idle node of the pool unneeded for an hour.
    let new_leader = |history: Option<&str>| {
        let mut b = Run::new(Config::default());
        b.core.leadership_lost(&[]);
        b.core.restore(history);
        b.nodes.push(idle_on_demand_a10g("idle", "us-east-1a"));
        b.with_our_instance();
        b.pods.push(zonal());
        b.pass(T0 + secs(660))
    };
    let in_flight = new_leader(Some(&json));
    assert!(launches(&in_flight).is_empty(), "{in_flight:?}");
    let restored = new_leader(Some(&json_no_flight));
    assert!(
        drains(&restored).is_empty(),
        "within the 3 m cooldown of A's last scale-up"
    );
    assert_ne!(
        launches(&restored)[0].launch_id,
        first.launch_id,
        "A gave that id up"
    );
    let forgetful = new_leader(None);
    assert_eq!(drains(&forgetful).len(), 1, "no cooldown known");
    assert_eq!(
        launches(&forgetful)[0].launch_id,
        first.launch_id,
        "the given-up id would be used again"
    );
}

#[test]
fn leadership_lost_mid_pass_drops_the_pass_and_leaves_no_drain_behind() {
    let mut run = Run::new(Config::default());
    run.nodes.push(
        NodeBuilder::new("recent")
            .pool("a10g", "g5.xlarge", "us-east-1a")
            .gpus(1)
            .taint(labels::TO_BE_DELETED_TAINT, Effect::NoSchedule)
            .annotation(labels::DRAIN_STARTED, &T0.to_rfc3339())
            .build(),
    );
    run.pods.push(gpu_pod("p", 1));
    let actions = run.core.pass(run.observation(T0 + secs(1)));
    assert!(launches(&actions).len() == 1 && drains(&actions).len() == 1);
    assert!(run.core.in_pass(), "waiting for the launch");
    // The executor lost the Lease before doing anything.
    run.core.leadership_lost(&actions);
    assert!(!run.core.in_pass());
    assert_eq!(
        run.core.drains(),
        0,
        "the drain that never started is not held"
    );
    assert!(run.core.resume(vec![]).is_empty());
    assert!(run.core.needs_restore());
    assert!(run.core.pass(run.observation(T0 + secs(2))).is_empty());
}

#[test]
fn dry_run_decides_and_reports_but_changes_nothing() {
    let mut run = Run::new(Config {
        dry_run: true,
        ..Config::default()
    });
    run.pods.push(gpu_pod("p", 1));
    run.nodes.push(
        NodeBuilder::new("idle")
            .pool("a10g", "g5.xlarge", "us-east-1a")
            .gpus(1)
            .annotation(labels::UNNEEDED_SINCE, &(T0 - secs(3600)).to_rfc3339())
            .created(T0 - secs(7200))
            .build(),
    );
    run.pods[0] = PodBuilder::new("ml", "p")
        .gpus(1)
        .selector(labels::ZONE, "us-east-1b")
        .build();
    let actions = run.pass(T0);
    for a in &actions {
        assert!(
            matches!(
                a,
                Action::Event(_) | Action::Log { .. } | Action::Count(_) | Action::Status(_)
            ),
            "dry-run acted: {a:?}"
        );
    }
    let reasons: Vec<&str> = actions
        .iter()
        .filter_map(|a| match a {
            Action::Event(n) => Some(n.message.as_str()),
            _ => None,
        })
        .collect();
    assert!(
        reasons.iter().any(|m| m.starts_with("would launch")),
        "{reasons:?}"
    );
    assert!(
        reasons.iter().any(|m| m.starts_with("would drain")),
        "{reasons:?}"
    );
    // Reasons of its own, not the Cluster Autoscaler's.
    let kinds: Vec<&str> = actions
        .iter()
        .filter_map(|a| match a {
            Action::Event(n) => Some(n.reason),
            _ => None,
        })
        .collect();
    assert!(kinds.contains(&"DryRunScaleUp"), "{kinds:?}");
    assert!(kinds.contains(&"DryRunScaleDown"), "{kinds:?}");
    for theirs in ["TriggeredScaleUp", "NotTriggerScaleUp", "ScaleDown"] {
        assert!(!kinds.contains(&theirs), "{kinds:?}");
    }
}

#[test]
fn the_batching_window_and_the_next_timed_change() {
    let mut run = Run::new(Config::default());
    assert_eq!(run.core.batch_deadline(), None);
    run.core.unschedulable_seen(T0);
    run.core.unschedulable_seen(T0 + secs(1));
    assert_eq!(run.core.batch_deadline(), Some(T0 + secs(2)));
    run.pods.push(gpu_pod("p", 1));
    run.pass(T0 + secs(2));
    assert_eq!(run.core.batch_deadline(), None, "a pass closes the window");
    run.register("i-1", 1, T0 + secs(100));
    run.pods.clear();
    Arc::make_mut(&mut run.nodes[0].annotations)
        .insert(labels::UNNEEDED_SINCE.into(), (T0 + secs(200)).to_rfc3339());
    run.pass(T0 + secs(210));
    // Next: the cooldown after the node's creation (T0+100 s + 3 m), then its unneeded time.
    assert_eq!(run.core.next_change(T0 + secs(210)), Some(T0 + secs(280)));
    assert_eq!(run.core.next_change(T0 + secs(280)), Some(T0 + secs(380)));
}

#[test]
fn a_launch_whose_capacity_goes_to_other_pods_is_not_asked_for_again_under_its_id() {
    // Pod a's launch is in flight. Pod b, larger, arrives and the plan gives it that capacity; a
    // is planned again, for the same instance type: under its old launch id the provider would
    // answer with the instance already there and launch nothing.
    let mut run = Run::new(Config::default());
    run.pods.push(gpu_pod("a", 1));
    let first = launches(&run.pass(T0))[0].clone();
    run.pods.push(
        PodBuilder::new("ml", "b")
            .gpus(1)
            .cpu_milli(3000)
            .priority(100)
            .build(),
    );
    let actions = run.pass(T0 + secs(10));
    let plan = run.core.last_plan().unwrap();
    assert!(
        plan.existing_capacity
            .iter()
            .any(|p| p.pod == "ml/b" && p.target == format!("launch/{}", first.launch_id)),
        "{plan:?}"
    );
    assert_eq!(plan.scale_ups[0].pods, ["ml/a"]);
    let again = launches(&actions);
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].offerings[0].instance_type, "g5.xlarge");
    assert_ne!(again[0].launch_id, first.launch_id);
    // A launch the plan does not use keeps its id (after a crash the provider finds its
    // instances by it and launches nothing new).
    let mut restarted = Run::new(Config::default());
    restarted.pods.push(gpu_pod("a", 1));
    assert_eq!(
        launches(&restarted.pass(T0 + secs(1)))[0].launch_id,
        first.launch_id
    );
}

#[test]
fn pods_planned_onto_launches_in_flight_stay_planned_there() {
    // Five pods of two shapes on two instance types: the next pass, with both launches in
    // flight and nothing registered, puts each pod back on its launch and launches nothing.
    let mut run = Run::new(Config::default());
    for i in 0..3 {
        run.pods.push(
            PodBuilder::new("ml", &format!("small-{i}"))
                .gpus(1)
                .created(Time(T0.0 - 60_000 + i))
                .build(),
        );
    }
    for i in 0..2 {
        run.pods.push(
            PodBuilder::new("ml", &format!("wide-{i}"))
                .gpus(1)
                .cpu_milli(6000)
                .created(Time(T0.0 - 1_000 + i))
                .build(),
        );
    }
    let first = run.pass(T0);
    let first: Vec<LaunchRequest> = launches(&first).into_iter().cloned().collect();
    assert!(first.len() >= 2, "{first:?}");
    let again = run.pass(T0 + secs(10));
    assert!(launches(&again).is_empty(), "{again:?}");
    let plan = run.core.last_plan().unwrap();
    assert_eq!(plan.existing_capacity.len(), 5, "{plan:?}");
    let wide_launches: BTreeSet<&str> = plan
        .existing_capacity
        .iter()
        .filter(|p| p.pod.starts_with("ml/wide"))
        .map(|p| p.target.as_str())
        .collect();
    for l in &first {
        let target = format!("launch/{}", l.launch_id);
        let it = &l.offerings[0].instance_type;
        assert_eq!(
            wide_launches.contains(target.as_str()),
            it != "g5.xlarge",
            "{it}"
        );
    }
}

fn spot_available_taint(actions: &[Action], node: &str) -> Option<bool> {
    actions.iter().rev().find_map(|a| match a {
        Action::Taint {
            node: n,
            taint,
            present,
        } if n == node && taint.key == labels::SPOT_AVAILABLE_TAINT => Some(*present),
        _ => None,
    })
}

/// A run whose A10G pool prefers spot and consolidates.
fn spot_first_consolidating_run() -> Run {
    let text = POLICY.replace(
        "    scaleDown: {unneededTime: 3m, cooldownAfterScaleUp: 3m}\n",
        "    scaleDown: {unneededTime: 3m, cooldownAfterScaleUp: 3m}\n    consolidation: {enabled: true}\n",
    );
    Run::with_policy(Config::default(), &text)
}

/// An on-demand node of the A10G pool, an hour old.
fn old_on_demand_node(name: &str, instance_type: &str, gpus: i64) -> crate::model::Node {
    NodeBuilder::new(name)
        .pool("a10g", instance_type, "us-east-1a")
        .label(labels::CAPACITY_TYPE, "on-demand")
        .cpu_milli(48_000)
        .memory_gib(192)
        .gpus(gpus)
        .created(Time(T0.0 - 3_600_000))
        .build()
}

#[test]
fn an_empty_on_demand_node_is_kept_free_while_spot_is_to_be_had() {
    // A pool that prefers spot and consolidates: its empty on-demand node (bought while spot
    // was short) would take the next pods the scheduler binds, and a Job's pod never leaves.
    let mut run = spot_first_consolidating_run();
    let empty_on_demand = |name: &str| old_on_demand_node(name, "g5.12xlarge", 4);
    run.nodes.push(empty_on_demand("od"));
    run.with_our_instance();
    // The same, but adopted (its instance is not ours): never kept free, it would sit idle.
    run.nodes.push(empty_on_demand("adopted"));
    run.pass(T0); // registers it in its pool
    let a = run.pass(T0 + secs(10));
    assert_eq!(spot_available_taint(&a, "od"), Some(true), "{a:?}");
    assert_eq!(spot_available_taint(&a, "adopted"), None, "{a:?}");
    assert!(launches(&a).is_empty());
    // Nothing new while it qualifies.
    let a = run.pass(T0 + secs(20));
    assert_eq!(spot_available_taint(&a, "od"), None, "{a:?}");
    // A pod that must run on on-demand: the node is for it, untainted, and nothing is launched.
    run.pods.push(
        PodBuilder::new("ml", "on-demand-only")
            .gpus(1)
            .selector(labels::CAPACITY_TYPE, "on-demand")
            .build(),
    );
    let a = run.pass(T0 + secs(30));
    assert_eq!(spot_available_taint(&a, "od"), Some(false), "{a:?}");
    assert!(launches(&a).is_empty(), "{a:?}");
    let a = run.pass(T0 + secs(40));
    assert!(launches(&a).is_empty(), "{a:?}");
    assert_eq!(spot_available_taint(&a, "od"), None, "{a:?}");
}

#[test]
fn an_on_demand_node_with_every_gpu_taken_is_kept_free_while_spot_is_to_be_had() {
    // A Job's pod holds the one GPU of an on-demand node bought while spot was short: when it
    // ends, the next pod would take the GPU at once and keep the node on-demand. Tainted now, it
    // loses no room. An on-demand node with a GPU free keeps taking pods.
    let mut run = spot_first_consolidating_run();
    run.nodes.push(old_on_demand_node("full", "g5.xlarge", 1));
    run.with_our_instance();
    run.nodes.push(old_on_demand_node("room", "g5.12xlarge", 4));
    run.with_our_instance();
    for (pod, node) in [("a", "full"), ("b", "room")] {
        let mut p = PodBuilder::new("ml", pod)
            .gpus(1)
            .owner(crate::model::OwnerKind::Job, pod)
            .build();
        p.node_name = Some(node.into());
        p.phase = crate::model::PodPhase::Running;
        run.pods.push(p);
    }
    let first = run.pass(T0); // registers them in their pool
    assert_eq!(spot_available_taint(&first, "full"), None, "{first:?}");
    let a = run.pass(T0 + secs(10));
    assert_eq!(spot_available_taint(&a, "full"), Some(true), "{a:?}");
    assert_eq!(spot_available_taint(&a, "room"), None, "{a:?}");
    assert!(launches(&a).is_empty(), "{a:?}");
    assert!(
        events(&a, "KeptFreeForSpot").iter().any(|n| n
            .message
            .contains("full is an on-demand node with every GPU taken")),
        "{a:?}"
    );
}

#[test]
fn a_startup_taint_goes_once_the_node_is_registered_in_its_pool() {
    let text = POLICY.replace(
        "    maxNodes: 20\n",
        "    maxNodes: 20\n    startupTaints: [{key: example.com/registering, effect: NoExecute}]\n",
    );
    let mut run = Run::with_policy(Config::default(), &text);
    run.pods.push(gpu_pod("p", 1));
    let first = launches(&run.pass(T0))[0].clone();
    assert!(
        first
            .tags
            .contains_key("k8s.io/cluster-autoscaler/node-template/taint/example.com/registering"),
        "bootstrap scripts learn the startup taint from the tags: {:?}",
        first.tags
    );
    // The node registers as its kubelet flags say: the startup taint, no pool label.
    run.register("i-1", 1, T0 + secs(100));
    let n = &mut run.nodes[0];
    Arc::make_mut(&mut n.labels).remove(labels::POOL);
    n.taints.push(crate::model::Taint {
        key: "example.com/registering".into(),
        value: String::new(),
        effect: Effect::NoExecute,
    });
    run.pods.push(gpu_pod("q", 1));
    let actions = run.core.pass(run.observation(T0 + secs(110)));
    let [Action::Register(r)] = actions.as_slice() else {
        panic!("{actions:?}")
    };
    assert_eq!(r.labels[labels::POOL], "a10g");
    assert_eq!(r.remove_taints.len(), 1);
    assert_eq!(r.remove_taints[0].key, "example.com/registering");
    // Written: the pass ends, and the next one plans on the registered, untainted node.
    assert!(run
        .core
        .resume(vec![Feedback::Registered {
            node: r.node.clone(),
            changed: true,
        }])
        .iter()
        .all(|a| !matches!(a, Action::Launch { .. })));
    r.apply(&mut run.nodes[0]);
    assert!(run.nodes[0].taints.is_empty(), "{:?}", run.nodes[0].taints);
    assert_eq!(run.nodes[0].pool(), Some("a10g"));
    let actions = run.pass(T0 + secs(120));
    assert!(!actions.iter().any(|a| matches!(a, Action::Register(_))));
}

#[test]
fn nodes_adopted_by_a_pools_node_selector_count_in_the_pool_and_are_only_reported_when_unneeded() {
    let policy = POLICY.replace("maxNodes: 20", "maxNodes: 2").replace(
        "    scaleDown:",
        "    nodeSelector: {eks.amazonaws.com/nodegroup: gpu-a10g}\n    scaleDown:",
    );
    let mut run = Run::with_policy(Config::default(), &policy);
    // Two nodes of an EKS managed node group: no pool label, instances not ours.
    for (name, unneeded) in [("ng-busy", false), ("ng-idle", true)] {
        let mut b = NodeBuilder::new(name)
            .label(labels::INSTANCE_TYPE, "g5.xlarge")
            .label(labels::ZONE, "us-east-1a")
            .label("eks.amazonaws.com/nodegroup", "gpu-a10g")
            .cpu_milli(4000)
            .memory_gib(16)
            .gpus(1)
            .created(T0 - secs(7200));
        if unneeded {
            b = b.annotation(labels::UNNEEDED_SINCE, &(T0 - secs(3600)).to_rfc3339());
        }
        let mut n = b.build();
        n.provider_id = Some(format!("aws:///us-east-1a/i-{name}"));
        run.nodes.push(n);
    }
    run.pods.push(
        PodBuilder::new("ml", "running")
            .gpus(1)
            .on("ng-busy")
            .build(),
    );
    // A node of another node group is left out of the pool.
    let mut other = NodeBuilder::new("cpu-0")
        .label("eks.amazonaws.com/nodegroup", "cpu")
        .cpu_milli(4000)
        .memory_gib(16)
        .created(T0 - secs(7200))
        .build();
    other.provider_id = Some("aws:///us-east-1a/i-cpu-0".into());
    run.nodes.push(other);

    let a = run.pass(T0);
    assert!(drains(&a).is_empty(), "{a:?}");
    assert!(terminated(&a).is_empty());
    let reported: Vec<&Note> = a
        .iter()
        .filter_map(|x| match x {
            Action::Event(n) if n.reason == "ScaleDownNotOwned" => Some(n),
            _ => None,
        })
        .collect();
    assert_eq!(reported.len(), 1, "{a:?}");
    assert_eq!(reported[0].subject, Subject::Node("ng-idle".into()));
    assert!(
        reported[0].message.contains("pool a10g"),
        "{}",
        reported[0].message
    );
    let st = serde_json::to_value(status(&a).unwrap()).unwrap();
    assert_eq!(st["pools"][0]["readyNodes"], 2, "{st}");
    // Reported once, not every pass.
    let a = run.pass(T0 + secs(10));
    assert!(!a
        .iter()
        .any(|x| matches!(x, Action::Event(n) if n.reason == "ScaleDownNotOwned")));

    // The two adopted nodes are the pool's maxNodes: a pod that needs a third launches nothing.
    run.pods.push(gpu_pod("more", 1));
    run.pods.push(gpu_pod("more2", 1));
    let a = run.pass(T0 + secs(20));
    assert_eq!(
        launches(&a).iter().map(|l| l.count).sum::<u32>(),
        0,
        "{a:?}"
    );
}

#[test]
fn a_pod_that_did_not_fit_the_node_launched_for_it_is_not_launched_for_again() {
    let policy = POLICY.replace("[g5.xlarge, g5.12xlarge]", "[g5.xlarge]");
    let mut run = Run::with_policy(Config::default(), &policy);
    // 3.8 CPUs fit the template (4 vCPUs less the pool's 200m reserve).
    let big = || {
        PodBuilder::new("ml", "big")
            .gpus(1)
            .cpu_milli(3800)
            .memory_gib(2)
            .build()
    };
    run.pods.push(big());
    assert_eq!(launches(&run.pass(T0)).len(), 1);
    // The node's kubelet reserves more than the pool says.
    run.register("i-1", 1, T0 + secs(60));
    run.nodes[0].allocatable.cpu_milli = 3500;
    let a = run.pass(T0 + secs(70));
    assert!(launches(&a).is_empty(), "launched again: {a:?}");
    let warned = a.iter().any(|x| {
        matches!(x, Action::Log { level: Level::Warn, message }
            if message.contains("g5.xlarge nodes of pool a10g allocate")
                && message.contains("node-i-1"))
    });
    assert!(warned, "{a:?}");
    let why: Vec<&str> = a
        .iter()
        .filter_map(|x| match x {
            Action::Event(n) if n.reason == "NotTriggerScaleUp" => Some(n.message.as_str()),
            _ => None,
        })
        .collect();
    assert!(
        why.iter()
            .any(|m| m.contains("as its registered node node-i-1 shows")),
        "{why:?}"
    );
    // Later passes launch nothing either; the node is learned from even once it is gone.
    run.nodes.clear();
    run.cloud.terminate("i-1");
    assert!(launches(&run.pass(T0 + secs(200))).is_empty());

    // A smaller pod still fits the node type as it really is.
    run.pods = vec![PodBuilder::new("ml", "small")
        .gpus(1)
        .cpu_milli(3000)
        .build()];
    assert_eq!(launches(&run.pass(T0 + secs(300))).len(), 1);
}

fn events<'a>(actions: &'a [Action], reason: &str) -> Vec<&'a Note> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Event(n) if n.reason == reason => Some(n),
            _ => None,
        })
        .collect()
}

fn tainted_replacing(actions: &[Action]) -> Vec<&str> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Taint {
                node,
                taint,
                present: true,
            } if taint.key == labels::REPLACING_TAINT => Some(node.as_str()),
            _ => None,
        })
        .collect()
}

/// A node of ours running one GPU pod, registered at T0.
fn run_with_busy_node() -> Run {
    run_with_busy_node_and_policy(POLICY)
}

fn run_with_busy_node_and_policy(text: &str) -> Run {
    let mut run = Run::with_policy(Config::default(), text);
    run.pods.push(gpu_pod("p", 1));
    run.pass(T0);
    run.register("i-1", 1, T0);
    run.pods[0].node_name = Some("node-i-1".into());
    run.pods[0].phase = crate::model::PodPhase::Running;
    run
}

#[test]
fn an_unhealthy_node_is_replaced_after_its_grace_period_and_drained_once_its_pod_has_a_place() {
    let mut run = run_with_busy_node();
    run.nodes[0]
        .conditions
        .insert("AcceleratedHardwareReady".into(), "False".into());
    // Seen: the clock starts (and is kept on the node), nothing else.
    let a = run.pass(T0 + secs(60));
    assert!(tainted_replacing(&a).is_empty());
    assert_eq!(
        run.nodes[0].annotations.get(labels::UNHEALTHY_SINCE),
        Some(&(T0 + secs(60)).to_rfc3339())
    );
    let st = status(&a).expect("a status");
    assert!(
        st.unhealthy_nodes["node-i-1"]
            .starts_with("condition AcceleratedHardwareReady=False since "),
        "{st:?}"
    );
    assert!(tainted_replacing(&run.pass(T0 + secs(600))).is_empty());
    // 10 minutes after it was first seen: tainted, and its pod planned elsewhere.
    let a = run.pass(T0 + secs(660));
    assert_eq!(tainted_replacing(&a), ["node-i-1"]);
    assert_eq!(events(&a, "ReplacingUnhealthyNode").len(), 1);
    assert_eq!(launches(&a).len(), 1, "a replacement for its pod: {a:?}");
    assert!(drains(&a).is_empty(), "not before the replacement is there");
    let st = status(&a).expect("a status");
    assert!(st.unhealthy_nodes.is_empty(), "{st:?}");
    assert!(
        st.replacing_nodes["node-i-1"]
            .starts_with("unhealthy: condition AcceleratedHardwareReady=False"),
        "{st:?}"
    );
    // The replacement registers: the old node is drained.
    let new_id = run.cloud.instances.last().unwrap().id.clone();
    run.register(&new_id, 1, T0 + secs(700));
    let a = run.pass(T0 + secs(710));
    let d = drains(&a);
    assert_eq!(d.len(), 1, "{a:?}");
    assert_eq!(d[0].node, "node-i-1");
    assert_eq!(d[0].kind, DrainKind::Forced, "a broken node goes anyway");
    assert!(
        d[0].reason.contains("AcceleratedHardwareReady=False"),
        "{}",
        d[0].reason
    );
    assert!(launches(&a).is_empty());
    assert_replaced_when_drained(&mut run, "node-i-1", T0 + secs(720));
}

/// The drain of `node` reports back: counted as a replacement of an unhealthy a10g node.
fn assert_replaced_when_drained(run: &mut Run, node: &str, at: Time) {
    let out = run.core.drain_finished(node, DrainOutcome::Removed, at);
    assert_eq!(
        out,
        [Action::Count(Count::Replaced {
            pool: "a10g".into(),
            cause: "unhealthy"
        })]
    );
}

#[test]
fn a_replaced_node_deleted_before_its_drain_reports_back_counts_as_replaced() {
    let mut run = run_with_busy_node();
    run.nodes[0]
        .conditions
        .insert("AcceleratedHardwareReady".into(), "False".into());
    run.pass(T0 + secs(60));
    assert_eq!(tainted_replacing(&run.pass(T0 + secs(660))), ["node-i-1"]);
    let new_id = run.cloud.instances.last().unwrap().id.clone();
    run.register(&new_id, 1, T0 + secs(700));
    assert_eq!(drains(&run.pass(T0 + secs(710))).len(), 1);
    // The drain deletes the Node; a pass runs before the drain's task is collected.
    run.nodes.retain(|n| n.name != "node-i-1");
    run.pass(T0 + secs(715));
    assert_replaced_when_drained(&mut run, "node-i-1", T0 + secs(720));
}

#[test]
fn a_gpu_that_reported_a_fatal_xid_gets_its_node_replaced_after_the_xid_grace_period() {
    let mut run = run_with_busy_node();
    let xid = |code: u32| {
        Some(BTreeMap::from([(
            "node-i-1".to_string(),
            vec![GpuXid {
                gpu: "0".into(),
                xid: code,
            }],
        )]))
    };
    // XID 13 (a graphics engine exception) is the application's: not a broken GPU.
    run.gpu_xids = xid(13);
    run.pass(T0 + secs(60));
    assert!(tainted_replacing(&run.pass(T0 + secs(600))).is_empty());
    assert!(!run.nodes[0]
        .annotations
        .contains_key(labels::UNHEALTHY_SINCE));
    // XID 79, the GPU fell off the bus: seen, and the reading stands while none is taken.
    run.gpu_xids = xid(79);
    let a = run.pass(T0 + secs(620));
    let st = status(&a).expect("a status");
    assert!(
        st.unhealthy_nodes["node-i-1"].starts_with("GPU 0 reported XID 79 since "),
        "{st:?}"
    );
    assert!(tainted_replacing(&run.pass(T0 + secs(700))).is_empty());
    // Two minutes (health.xidErrors.gracePeriod by default) after it was first seen.
    let a = run.pass(T0 + secs(740));
    assert_eq!(tainted_replacing(&a), ["node-i-1"]);
    assert_eq!(launches(&a).len(), 1, "a replacement for its pod: {a:?}");
}

#[test]
fn a_ready_node_advertising_fewer_gpus_than_its_shape_is_replaced_after_the_grace_period() {
    // g5.12xlarge nodes: four A10Gs each.
    let text = POLICY.replace("[g5.xlarge, g5.12xlarge]", "[g5.12xlarge]");
    let mut run = Run::with_policy(Config::default(), &text);
    run.pods.push(gpu_pod("p", 1));
    run.pass(T0);
    run.register("i-1", 4, T0);
    run.pods[0].node_name = Some("node-i-1".into());
    run.pods[0].phase = crate::model::PodPhase::Running;
    // All four advertised: healthy.
    run.pass(T0 + secs(30));
    assert!(!run.nodes[0]
        .annotations
        .contains_key(labels::UNHEALTHY_SINCE));
    // One GPU drops out of allocatable; the node stays Ready.
    run.nodes[0].allocatable.gpu = 3;
    assert!(run.nodes[0].ready);
    let a = run.pass(T0 + secs(60));
    assert!(tainted_replacing(&a).is_empty());
    let st = status(&a).expect("a status");
    assert!(
        st.unhealthy_nodes["node-i-1"].starts_with("advertises 3 of its 4 GPUs since "),
        "{st:?}"
    );
    // Within health.missingGpusGracePeriod (10 minutes): nothing but the clock.
    let a = run.pass(T0 + secs(600));
    assert!(tainted_replacing(&a).is_empty());
    assert!(launches(&a).is_empty());
    assert!(drains(&a).is_empty());
    // After it: tainted (nothing new lands on it) and its pod's replacement launched; the node
    // is not drained before the replacement is there.
    let a = run.pass(T0 + secs(660));
    assert_eq!(tainted_replacing(&a), ["node-i-1"]);
    let ev = events(&a, "ReplacingUnhealthyNode");
    assert!(
        ev[0].message.contains("advertises 3 of its 4 GPUs"),
        "{ev:?}"
    );
    let l = launches(&a);
    assert_eq!(l.len(), 1, "{a:?}");
    assert_eq!(l[0].offerings[0].instance_type, "g5.12xlarge");
    assert!(drains(&a).is_empty());
    // The replacement registers with all its GPUs: the broken node is drained (cordoned,
    // evicted) and its own instance terminated by the drain.
    let new_id = run.cloud.instances.last().unwrap().id.clone();
    run.register(&new_id, 4, T0 + secs(700));
    let a = run.pass(T0 + secs(710));
    let d = drains(&a);
    assert_eq!(d.len(), 1, "{a:?}");
    assert_eq!(d[0].node, "node-i-1");
    assert_eq!(d[0].instance_id.as_deref(), Some("i-1"));
    assert!(
        d[0].reason.contains("advertises 3 of its 4 GPUs"),
        "{}",
        d[0].reason
    );
    assert!(launches(&a).is_empty(), "one replacement, not two");
    assert_replaced_when_drained(&mut run, "node-i-1", T0 + secs(720));
}

#[test]
fn a_flapping_condition_does_not_restart_the_clock_and_a_healthy_node_is_forgotten() {
    let mut run = run_with_busy_node();
    let set = |run: &mut Run, status: &str| {
        run.nodes[0]
            .conditions
            .insert("AcceleratedHardwareReady".into(), status.into());
    };
    set(&mut run, "False");
    run.pass(T0 + secs(60));
    set(&mut run, "True");
    assert!(tainted_replacing(&run.pass(T0 + secs(300))).is_empty());
    set(&mut run, "False");
    assert!(tainted_replacing(&run.pass(T0 + secs(500))).is_empty());
    // Ten minutes after it was first seen, though it was healthy for a while in between.
    assert_eq!(tainted_replacing(&run.pass(T0 + secs(660))), ["node-i-1"]);

    // Another node, healthy for its whole grace period after a glitch: the clock goes.
    let mut run = run_with_busy_node();
    set(&mut run, "False");
    run.pass(T0 + secs(60));
    set(&mut run, "True");
    run.pass(T0 + secs(120));
    let a = run.pass(T0 + secs(60 + 600));
    assert!(tainted_replacing(&a).is_empty());
    assert!(!run.nodes[0]
        .annotations
        .contains_key(labels::UNHEALTHY_SINCE));
    set(&mut run, "False");
    run.pass(T0 + secs(700));
    assert!(
        tainted_replacing(&run.pass(T0 + secs(1200))).is_empty(),
        "a new clock from 700 s"
    );
    assert_eq!(tainted_replacing(&run.pass(T0 + secs(1300))), ["node-i-1"]);
}

#[test]
fn at_most_a_fifth_of_a_pool_is_replaced_for_health_at_once() {
    let mut run = Run::new(Config::default());
    for i in 0..10 {
        run.nodes.push(
            NodeBuilder::new(&format!("n{i}"))
                .pool("a10g", "g5.xlarge", "us-east-1a")
                .label(labels::GPU_MODEL, "A10G")
                .label(labels::CAPACITY_TYPE, "on-demand")
                .label(labels::KARPENTER_CAPACITY_TYPE, "on-demand")
                .annotation(labels::GPUS_ADVERTISED, "true")
                .condition("AcceleratedHardwareReady", "False")
                .cpu_milli(4000)
                .memory_gib(16)
                .gpus(1)
                .created(T0 - secs(3600))
                .build(),
        );
        run.with_our_instance();
        run.pods.push(
            PodBuilder::new("ml", &format!("p{i}"))
                .gpus(1)
                .on(&format!("n{i}"))
                .build(),
        );
    }
    run.pass(T0);
    let a = run.pass(T0 + secs(600));
    assert_eq!(tainted_replacing(&a).len(), 2, "20 % of 10: {a:?}");
    assert_eq!(events(&a, "ReplacementDeferred").len(), 8);
    // Reported once.
    let a = run.pass(T0 + secs(610));
    assert!(tainted_replacing(&a).is_empty());
    assert!(events(&a, "ReplacementDeferred").is_empty());
}

#[test]
fn an_interruption_notice_drains_at_once_while_the_replacement_launches() {
    let mut run = run_with_busy_node();
    run.nodes[0].taints.push(crate::model::Taint {
        key: "aws-node-termination-handler/spot-itn".into(),
        value: "1".into(),
        effect: Effect::NoSchedule,
    });
    let a = run.pass(T0 + secs(60));
    assert_eq!(tainted_replacing(&a), ["node-i-1"]);
    assert_eq!(events(&a, "ReplacingInterruptedNode").len(), 1);
    assert_eq!(launches(&a).len(), 1, "its pod's new node: {a:?}");
    let d = drains(&a);
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].instance_id.as_deref(), Some("i-1"));
    let out = run
        .core
        .drain_finished("node-i-1", DrainOutcome::Removed, T0 + secs(90));
    assert_eq!(
        out,
        [Action::Count(Count::Replaced {
            pool: "a10g".into(),
            cause: "interrupted"
        })]
    );
}

#[test]
fn an_interruption_handlers_taint_or_condition_marks_the_reclaimed_spot_offering_short() {
    // A handler that reports a condition (ACK's node-problem-detector, a handler of one's own).
    let text =
        format!("interruptionConditions: [{{type: InstanceExpired, status: \"True\"}}]\n{POLICY}");
    fn taint(n: &mut Node) {
        n.taints.push(crate::model::Taint {
            key: "aws-node-termination-handler/spot-itn".into(),
            value: "1".into(),
            effect: Effect::NoSchedule,
        })
    }
    fn condition(n: &mut Node) {
        n.conditions.insert("InstanceExpired".into(), "True".into());
    }
    type Mark = fn(&mut Node);
    let cases: [(&str, Mark); 2] = [
        ("aws-node-termination-handler/spot-itn", taint),
        ("condition InstanceExpired=True", condition),
    ];
    for (what, mark) in cases {
        let mut run = run_with_busy_node_and_policy(&text);
        let reclaimed = run.cloud.instances[0].offering.clone();
        assert_eq!(reclaimed.capacity_type, CapacityType::Spot);
        mark(&mut run.nodes[0]);
        let a = run.pass(T0 + secs(60));
        assert_eq!(tainted_replacing(&a), ["node-i-1"], "{what}");
        let ev = events(&a, "ReplacingInterruptedNode");
        assert!(ev[0].message.contains(what), "{ev:?}");
        // Its replacement goes elsewhere, as with a notice from the queue.
        let l = launches(&a);
        assert_eq!(l.len(), 1, "{what}: {a:?}");
        assert!(
            !l[0].offerings.contains(&reclaimed),
            "{what}: {:?}",
            l[0].offerings
        );
        assert!(
            l[0].offerings[0].capacity_type == CapacityType::Spot,
            "{what}"
        );
        assert_eq!(drains(&a).len(), 1, "{what}");
    }
    // A condition that does not match the status the policy names: nothing.
    let mut run = run_with_busy_node_and_policy(&text);
    run.nodes[0]
        .conditions
        .insert("InstanceExpired".into(), "False".into());
    assert!(tainted_replacing(&run.pass(T0 + secs(60))).is_empty());
}

#[test]
fn an_interrupted_spot_nodes_drain_fits_in_the_notice_window() {
    use drain::{grace_within, GraceCut};
    use replace::SPOT_NOTICE;
    // A spot interruption warning sent 30 s before the pass reads it: the instance goes two
    // minutes after it was sent, not after it was read.
    let mut run = run_with_busy_node();
    run.notices = vec![Notice {
        message_id: "m-1".into(),
        kind: NoticeKind::SpotInterruption,
        instance_ids: vec!["i-1".into()],
        sent_at_ms: Some((T0 + secs(30)).0),
    }];
    let now = T0 + secs(60);
    let a = run.pass(now);
    let goes = T0 + secs(30) + SPOT_NOTICE;
    let d = drains(&a);
    assert_eq!(d.len(), 1, "{a:?}");
    assert_eq!(d[0].kind, DrainKind::Forced);
    assert_eq!(
        d[0].deadline, goes,
        "not maxGracefulTermination (10 minutes) from now"
    );
    // A checkpointing trainer asks for 600 s: it gets what is left less the margin for the
    // instance's termination (150 - 60 - 15 = 75 s), and the Event says so.
    let cut = grace_within(600, now, goes).expect("cut");
    assert_eq!(
        cut,
        GraceCut {
            asked: 600,
            given: 75
        }
    );
    let m = drain::grace_cut_message("ml/p", "node-i-1", cut, goes, &d[0].reason);
    assert!(m.contains("cut from 600s to 75s"), "{m}");
    assert!(m.contains("spot interruption notice"), "{m}");
    assert!(m.contains(&goes.to_rfc3339()), "{m}");
    // A pod whose grace fits keeps it; once the window is over, nothing is left.
    assert_eq!(grace_within(30, now, goes), None);
    assert_eq!(grace_within(75, now, goes), None);
    assert_eq!(
        grace_within(30, goes, goes),
        Some(GraceCut {
            asked: 30,
            given: 0
        })
    );
    // What a drain that runs out of window says about the pods left.
    let left: Vec<(String, &str)> = (0..7)
        .map(|i| (format!("ml/w{i}"), "PodDisruptionBudget"))
        .collect();
    let m = drain::window_closed_message("node-i-1", goes, &d[0].reason, &left);
    assert!(m.contains("7 pod(s)"), "{m}");
    assert!(m.contains("ml/w0 (PodDisruptionBudget)"), "{m}");
    assert!(m.ends_with(" and 2 more"), "{m}");

    // An interruption handler's taint on a spot node: the window counts from when it is seen.
    let mut run = run_with_busy_node();
    run.nodes[0].taints.push(crate::model::Taint {
        key: "aws-node-termination-handler/spot-itn".into(),
        value: "1".into(),
        effect: Effect::NoSchedule,
    });
    let d = run.pass(now);
    let d = drains(&d);
    assert_eq!(d[0].kind, DrainKind::Forced);
    assert_eq!(d[0].deadline, now + SPOT_NOTICE);

    // An on-demand node (a scheduled retirement, days ahead): the usual deadline, no window.
    let text = POLICY.replace("[spot, on-demand]", "[on-demand]");
    let mut run = run_with_busy_node_and_policy(&text);
    run.nodes[0].taints.push(crate::model::Taint {
        key: "aws-node-termination-handler/scheduled-maintenance".into(),
        value: "1".into(),
        effect: Effect::NoSchedule,
    });
    let d = run.pass(now);
    let d = drains(&d);
    assert_eq!(d[0].kind, DrainKind::Forced);
    assert_eq!(
        d[0].deadline,
        now + Config::default().max_graceful_termination
    );
}

#[test]
fn interrupt_and_health_drains_evict_the_pods_a_scale_down_leaves_its_node_for() {
    use drain::{GraceCut, PodFate};
    let budgets = Snapshot::default();
    let on = |b: PodBuilder| b.gpus(1).on("node-i-1").build();
    // What keeps a node from a voluntary drain: a trainer with an emptyDir at /dev/shm, a bare
    // pod, safe-to-evict "false", do-not-disrupt, a kube-system pod without a budget.
    let kept = [
        on(PodBuilder::new("ml", "shm").local_storage()),
        on(PodBuilder::new("ml", "bare").bare()),
        on(PodBuilder::new("ml", "pinned").annotation(labels::SAFE_TO_EVICT, "false")),
        on(PodBuilder::new("ml", "busy").annotation(labels::KARPENTER_DO_NOT_DISRUPT, "true")),
        on(PodBuilder::new("kube-system", "dns")),
    ];
    for p in &kept {
        let voluntary = DrainKind::Voluntary.fate(p, &budgets);
        assert!(
            matches!(&voluntary, PodFate::KeepsNode(why) if why.contains(&p.id.to_string())),
            "{}: {voluntary:?}",
            p.id
        );
        assert_eq!(
            DrainKind::Forced.fate(p, &budgets),
            PodFate::Evict,
            "{}",
            p.id
        );
    }
    // Alike for both: what goes with the node and what finished are left, a pod being deleted
    // is waited for, a pod of a controller is evicted.
    let daemon = on(PodBuilder::new("ml", "agent").daemonset("agent"));
    let mirror =
        on(PodBuilder::new("kube-system", "etcd").annotation("kubernetes.io/config.mirror", "1"));
    let mut done = on(PodBuilder::new("ml", "done"));
    done.phase = crate::model::PodPhase::Succeeded;
    let mut going = on(PodBuilder::new("ml", "going").bare());
    going.deleting = true;
    let worker = on(PodBuilder::new("ml", "worker"));
    for kind in [DrainKind::Voluntary, DrainKind::Forced] {
        assert_eq!(kind.fate(&daemon, &budgets), PodFate::Leave, "{kind:?}");
        assert_eq!(kind.fate(&mirror, &budgets), PodFate::Leave, "{kind:?}");
        assert_eq!(kind.fate(&done, &budgets), PodFate::Leave, "{kind:?}");
        assert_eq!(kind.fate(&going, &budgets), PodFate::Wait, "{kind:?}");
        assert_eq!(kind.fate(&worker, &budgets), PodFate::Evict, "{kind:?}");
    }
    // A pod that cannot be read: nothing says it may be moved, but the node goes anyway.
    assert_eq!(
        DrainKind::Voluntary.fate_unread("ml/x", "bad quantity"),
        PodFate::KeepsNode("pod ml/x cannot be read (bad quantity)".into())
    );
    assert_eq!(
        DrainKind::Forced.fate_unread("ml/x", "bad quantity"),
        PodFate::Evict
    );
    // Grace periods: a pod's own in a voluntary drain; cut to end before a forced drain's
    // deadline (less the margin for terminating the instance), with as much as is left.
    let deadline = T0 + secs(120);
    assert_eq!(DrainKind::Voluntary.grace(600, T0, deadline), None);
    assert_eq!(
        DrainKind::Forced.grace(600, T0, deadline),
        Some(GraceCut {
            asked: 600,
            given: 105
        })
    );
    assert_eq!(DrainKind::Forced.grace(30, T0, deadline), None);
}

#[test]
fn interrupt_and_health_drains_of_a_previous_leader_are_finished_past_their_deadline_not_rolled_back(
) {
    let mut run = Run::new(Config::default());
    // Drains a crashed leader started 15 minutes ago (their deadline, 10 minutes, has passed).
    let started = T0 - secs(900);
    let tainted = |name: &str, replacing: Option<&str>| {
        let mut n = NodeBuilder::new(name)
            .pool("a10g", "g5.xlarge", "us-east-1a")
            .gpus(1)
            .taint(labels::TO_BE_DELETED_TAINT, Effect::NoSchedule)
            .annotation(labels::DRAIN_STARTED, &started.to_rfc3339())
            .build();
        if let Some(cause) = replacing {
            n.taints.push(crate::model::Taint {
                key: labels::REPLACING_TAINT.into(),
                value: cause.into(),
                effect: Effect::NoSchedule,
            });
        }
        n
    };
    run.nodes.push(tainted("interrupted", Some("interrupted")));
    run.nodes.push(tainted("unhealthy", Some("unhealthy")));
    run.nodes
        .push(tainted("consolidated", Some("consolidating")));
    run.nodes.push(tainted("unneeded", None));
    let a = run.pass(T0);
    let rolled_back: Vec<&str> = a
        .iter()
        .filter_map(|a| match a {
            Action::RollBack { node, .. } => Some(node.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(rolled_back, ["consolidated", "unneeded"], "{a:?}");
    let d = drains(&a);
    let resumed: Vec<&str> = d.iter().map(|d| d.node.as_str()).collect();
    assert_eq!(resumed, ["interrupted", "unhealthy"], "{a:?}");
    for d in d {
        assert_eq!(d.kind, DrainKind::Forced, "{d:?}");
        assert_eq!(
            d.deadline,
            started + secs(600),
            "its own deadline, passed: the node goes with what is left"
        );
    }
}

/// The account's GPU quota is used up: the next `n` launches fail.
fn quota_used_up(run: &mut Run, n: usize) {
    run.cloud.fail_next = (0..n)
        .map(|_| ProviderError::QuotaExceeded {
            message: "You have requested more vCPU capacity than your current vCPU limit".into(),
        })
        .collect();
}

#[test]
fn a_broken_node_is_not_drained_while_its_replacement_cannot_be_launched() {
    let mut run = run_with_busy_node();
    run.nodes[0]
        .conditions
        .insert("AcceleratedHardwareReady".into(), "False".into());
    run.pass(T0 + secs(60));
    quota_used_up(&mut run, 100);
    let a = run.pass(T0 + secs(660));
    assert_eq!(tainted_replacing(&a), ["node-i-1"]);
    assert_eq!(launches(&a).len(), 1, "its replacement is tried: {a:?}");
    assert!(drains(&a).is_empty());
    assert!(events(&a, "ReplacementNotLaunched").is_empty());
    // Launch after launch fails: the node keeps its pod.
    let mut tries = 1;
    for t in (670..=2400).step_by(30) {
        let a = run.pass(T0 + secs(t));
        tries += launches(&a).len();
        assert!(drains(&a).is_empty(), "drained at {t} s: {a:?}");
    }
    assert!(tries > 2, "launched again after the back-off ({tries})");
    assert!(run.cloud.live().len() == 1, "nothing launched");
    // Quota again: the replacement is launched, registers, and only then the node is drained.
    run.cloud.fail_next.clear();
    let mut at = 2400;
    while run.cloud.live().len() == 1 {
        at += 30;
        assert!(at < 4000, "no launch after the quota came back");
        assert!(drains(&run.pass(T0 + secs(at))).is_empty());
    }
    let new_id = run.cloud.instances.last().unwrap().id.clone();
    run.register(&new_id, 1, T0 + secs(at + 30));
    let d = run.pass(T0 + secs(at + 40));
    assert_eq!(drains(&d).len(), 1, "{d:?}");
}

#[test]
fn an_interrupted_node_is_drained_even_when_its_replacement_cannot_be_launched_which_is_reported() {
    // The launch fails outright (quota).
    let mut run = run_with_busy_node();
    quota_used_up(&mut run, 100);
    run.notices = vec![Notice {
        message_id: "m-1".into(),
        kind: NoticeKind::SpotInterruption,
        instance_ids: vec!["i-1".into()],
        sent_at_ms: None,
    }];
    let a = run.pass(T0 + secs(60));
    assert_eq!(launches(&a).len(), 1, "its replacement is tried: {a:?}");
    assert_eq!(
        drains(&a).len(),
        1,
        "the instance goes anyway: its pods are drained"
    );
    let ev = events(&a, "ReplacementNotLaunched");
    assert_eq!(ev.len(), 1, "{a:?}");
    assert!(ev[0].message.contains("pod ml/p"), "{ev:?}");
    assert!(ev[0].message.contains("quota exceeded"), "{ev:?}");
    assert_eq!(ev[0].subject, Subject::Node("node-i-1".into()));

    // No capacity left in any offering: the plan finds no place for the pod.
    let mut run = run_with_busy_node();
    let offerings: Vec<OfferingKey> = ["g5.xlarge", "g5.12xlarge"]
        .iter()
        .flat_map(|t| {
            ["us-east-1a", "us-east-1b"].into_iter().flat_map(move |z| {
                [CapacityType::Spot, CapacityType::OnDemand]
                    .into_iter()
                    .map(move |c| key(t, z, c))
            })
        })
        .collect();
    for k in offerings {
        run.cloud.capacity.insert(k, 0);
    }
    run.nodes[0].taints.push(crate::model::Taint {
        key: "aws-node-termination-handler/spot-itn".into(),
        value: "1".into(),
        effect: Effect::NoSchedule,
    });
    let a = run.pass(T0 + secs(60));
    assert_eq!(drains(&a).len(), 1, "{a:?}");
    let ev = events(&a, "ReplacementNotLaunched");
    assert_eq!(ev.len(), 1, "{a:?}");
    assert!(ev[0].message.contains("pod ml/p"), "{ev:?}");
}

fn acked(actions: &[Action]) -> Vec<&str> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::AckNotice { message_id } => Some(message_id.as_str()),
            _ => None,
        })
        .collect()
}

#[test]
fn a_queue_notice_replaces_the_node_and_is_acknowledged_after_the_taint() {
    let notice = |id: &str, kind, instance: &str| Notice {
        message_id: id.into(),
        kind,
        instance_ids: vec![instance.into()],
        sent_at_ms: None,
    };
    let mut run = run_with_busy_node();
    // A rebalance recommendation: the pool does not replace on one; acknowledged all the same.
    // A notice about an instance of another cluster: acknowledged, nothing else.
    run.notices = vec![
        notice("m-1", NoticeKind::Rebalance, "i-1"),
        notice("m-2", NoticeKind::SpotInterruption, "i-0ther"),
    ];
    let a = run.pass(T0 + secs(60));
    assert!(tainted_replacing(&a).is_empty());
    assert_eq!(acked(&a), ["m-1", "m-2"]);
    // The interruption warning: tainted, replacement launched, drained at once, then acked.
    run.notices = vec![notice("m-3", NoticeKind::SpotInterruption, "i-1")];
    let a = run.pass(T0 + secs(70));
    assert_eq!(tainted_replacing(&a), ["node-i-1"]);
    let ev = events(&a, "ReplacingInterruptedNode");
    assert!(ev[0].message.contains("spot interruption notice"), "{ev:?}");
    assert_eq!(launches(&a).len(), 1);
    // Not where spot is being reclaimed.
    let reclaimed = &run.cloud.instances[0].offering;
    assert_eq!(reclaimed.capacity_type, CapacityType::Spot);
    assert!(
        !launches(&a)[0].offerings.contains(reclaimed),
        "{:?}",
        launches(&a)[0].offerings
    );
    assert_eq!(drains(&a).len(), 1);
    let taint_at = a
        .iter()
        .position(|x| matches!(x, Action::Taint { present: true, .. }))
        .unwrap();
    let ack_at = a
        .iter()
        .position(|x| matches!(x, Action::AckNotice { .. }))
        .unwrap();
    assert!(taint_at < ack_at, "acknowledged only after the taint");
    assert_eq!(acked(&a), ["m-3"]);
    // Delivered again (the delete was lost): acknowledged, nothing new.
    run.notices = vec![notice("m-3", NoticeKind::SpotInterruption, "i-1")];
    let a = run.pass(T0 + secs(80));
    assert!(tainted_replacing(&a).is_empty());
    assert!(launches(&a).is_empty());
    assert_eq!(acked(&a), ["m-3"]);

    // A pool that replaces on rebalance recommendations.
    let text = POLICY.replace(
        "    maxNodes: 20\n",
        "    maxNodes: 20\n    replaceOnRebalance: true\n",
    );
    let mut run = run_with_busy_node_and_policy(&text);
    run.notices = vec![notice("m-4", NoticeKind::Rebalance, "i-1")];
    let a = run.pass(T0 + secs(60));
    assert_eq!(tainted_replacing(&a), ["node-i-1"]);
    let ev = events(&a, "ReplacingInterruptedNode");
    assert!(ev[0].message.contains("rebalance notice"), "{ev:?}");
}

#[test]
fn dry_run_neither_acts_on_nor_acknowledges_notices() {
    let mut run = Run::new(Config {
        dry_run: true,
        ..Config::default()
    });
    run.notices = vec![Notice {
        message_id: "m-1".into(),
        kind: NoticeKind::SpotInterruption,
        instance_ids: vec!["i-1".into()],
        sent_at_ms: None,
    }];
    let a = run.pass(T0 + secs(60));
    assert!(tainted_replacing(&a).is_empty());
    assert!(acked(&a).is_empty());
}

// ---- consolidation ----

const CONSOLIDATING: &str = r#"
zones: [us-east-1a]
pools:
  - name: a10g
    instanceTypes: [g5.4xlarge, g5.12xlarge]
    capacityTypes: [on-demand]
    maxNodes: 20
    consolidation: {enabled: true, consolidateAfter: 30m, restartCost: 1m}
"#;

/// Four g5.4xlarge nodes of ours, each running one 1-GPU, 10-CPU pod for three hours: together
/// the pods fit one g5.12xlarge ($5.672/h against 4 × $1.624/h).
fn four_small_nodes() -> Run {
    four_small_nodes_in(CONSOLIDATING)
}

/// [`four_small_nodes`] under another policy (its pool `a10g` with g5.4xlarge in us-east-1a).
fn four_small_nodes_in(policy: &str) -> Run {
    let mut run = Run::with_policy(Config::default(), policy);
    for i in 0..4 {
        let name = format!("small-{i}");
        run.nodes.push(
            NodeBuilder::new(&name)
                .pool("a10g", "g5.4xlarge", "us-east-1a")
                .label(labels::CAPACITY_TYPE, "on-demand")
                .annotation(labels::GPUS_ADVERTISED, "true")
                .cpu_milli(15_800)
                .memory_gib(62)
                .gpus(1)
                .created(T0 - secs(4 * 3600))
                .build(),
        );
        run.with_our_instance();
        let mut p = PodBuilder::new("serve", &format!("llm-{i}"))
            .gpus(1)
            .cpu_milli(10_000)
            .memory_gib(30)
            .created(T0 - secs(3 * 3600))
            .on(&name)
            .build();
        p.phase = crate::model::PodPhase::Running;
        run.pods.push(p);
    }
    run
}

#[test]
fn four_small_nodes_are_consolidated_onto_one_launched_for_their_pods_then_drained() {
    let mut run = four_small_nodes();
    run.pass(T0 - secs(10)); // registers the nodes in their pool
    let a = run.pass(T0);
    assert_eq!(
        tainted_replacing(&a),
        ["small-0", "small-1", "small-2", "small-3"]
    );
    let ev = events(&a, "Consolidating");
    assert_eq!(ev.len(), 4);
    assert!(
        ev[0]
            .message
            .contains("fit 1 × g5.12xlarge us-east-1a on-demand at $5.67/h")
            && ev[0].message.contains("saves $0.82/h"),
        "{}",
        ev[0].message
    );
    let l = launches(&a);
    assert_eq!(l.len(), 1, "{a:?}");
    assert_eq!(l[0].offerings[0].instance_type, "g5.12xlarge");
    assert!(drains(&a).is_empty(), "not before the new node is there");
    let st = status(&a).expect("a status");
    assert!(
        st.replacing_nodes["small-0"].starts_with("consolidating: 4 pod(s) on 4 node(s)"),
        "{st:?}"
    );
    // The new node registers: the four are drained, and each counts as consolidated.
    let id = run.cloud.instances.last().unwrap().id.clone();
    let i = run.cloud.instances.last().unwrap().clone();
    let mut big = NodeBuilder::new("big")
        .pool("a10g", "g5.12xlarge", "us-east-1a")
        .label(labels::CAPACITY_TYPE, "on-demand")
        .label(labels::LAUNCH_ID, &i.launch_id)
        .annotation(labels::GPUS_ADVERTISED, "true")
        .cpu_milli(47_000)
        .memory_gib(180)
        .gpus(4)
        .created(T0 + secs(120))
        .build();
    big.provider_id = Some(i.provider_id.clone());
    run.nodes.push(big);
    run.pass(T0 + secs(125)); // registers it
    let a = run.pass(T0 + secs(130));
    let d = drains(&a);
    assert_eq!(d.len(), 4, "{id}: {a:?}");
    assert!(d.iter().all(|d| d.kind == DrainKind::Voluntary), "{d:?}");
    assert!(
        d[0].reason.starts_with("replacing: 4 pod(s)"),
        "{}",
        d[0].reason
    );
    assert!(launches(&a).is_empty());
    let out = run
        .core
        .drain_finished("small-0", DrainOutcome::Removed, T0 + secs(200));
    assert_eq!(
        out,
        [Action::Count(Count::Replaced {
            pool: "a10g".into(),
            cause: "consolidating"
        })]
    );
}

#[test]
fn a_consolidation_whose_new_node_runs_short_is_called_off_and_nothing_else_moves_for_a_while() {
    let mut run = four_small_nodes();
    let big = key("g5.12xlarge", "us-east-1a", CapacityType::OnDemand);
    run.cloud.capacity.insert(big, 0);
    run.pass(T0 - secs(10));
    // Short of g5.12xlarge: the move is called off within the pass, before anything else is
    // launched for its pods; the nodes keep them.
    let a = run.pass(T0);
    assert_eq!(events(&a, "Consolidating").len(), 4);
    let off = events(&a, "ConsolidationCalledOff");
    assert_eq!(off.len(), 4, "{a:?}");
    assert!(
        off[0]
            .message
            .contains("g5.12xlarge us-east-1a on-demand ran short of capacity"),
        "{}",
        off[0].message
    );
    assert_eq!(launches(&a).len(), 1, "only the one that ran short: {a:?}");
    assert!(run
        .nodes
        .iter()
        .all(|n| n.taints.iter().all(|t| t.key != labels::REPLACING_TAINT)));
    assert!(drains(&a).is_empty());
    // Looked at again only after the pool's interval.
    let a = run.pass(T0 + secs(60));
    assert!(launches(&a).is_empty(), "{a:?}");
    assert!(tainted_replacing(&a).is_empty(), "{a:?}");
}

#[test]
fn a_consolidation_planned_onto_spot_launches_no_on_demand_when_spot_runs_short() {
    // The move pays on spot only: were spot short, its launch falling back to on-demand would buy
    // nodes for a move then called off (its planned offering ran short), left empty.
    let mut run = four_small_nodes_in(
        r#"
zones: [us-east-1a]
pools:
  - name: a10g
    instanceTypes: [g5.4xlarge, g5.12xlarge]
    capacityTypes: [spot, on-demand]
    maxNodes: 20
    consolidation: {enabled: true, consolidateAfter: 30m, restartCost: 1m}
"#,
    );
    for t in ["g5.4xlarge", "g5.12xlarge"] {
        run.cloud
            .capacity
            .insert(key(t, "us-east-1a", CapacityType::Spot), 0);
    }
    run.pass(T0 - secs(10));
    let a = run.pass(T0);
    assert_eq!(events(&a, "Consolidating").len(), 4, "{a:?}");
    let l = launches(&a);
    assert_eq!(l.len(), 1, "{a:?}");
    assert!(
        l[0].offerings
            .iter()
            .all(|o| o.capacity_type == CapacityType::Spot),
        "{:?}",
        l[0].offerings
    );
    assert_eq!(events(&a, "ConsolidationCalledOff").len(), 4, "{a:?}");
    assert_eq!(
        run.cloud.instances.len(),
        4,
        "nothing bought: {:?}",
        run.cloud.instances
    );
    assert!(drains(&a).is_empty(), "{a:?}");
}

#[test]
fn an_offering_a_consolidation_was_called_off_for_is_not_planned_onto_for_an_hour() {
    // The insufficient-capacity cache forgets g5.12xlarge after 3 minutes, but the offering is
    // still short: planning the same move onto it at every look would launch (and, on a real
    // cloud, fall back) for nothing each time.
    let mut run = four_small_nodes();
    let big = key("g5.12xlarge", "us-east-1a", CapacityType::OnDemand);
    run.cloud.capacity.insert(big, 0);
    run.pass(T0 - secs(10));
    let a = run.pass(T0);
    assert_eq!(events(&a, "ConsolidationCalledOff").len(), 4, "{a:?}");
    // Past the cache's 3 minutes and the pool's 5-minute interval: nothing is planned onto it.
    for t in [secs(10 * 60), secs(20 * 60), secs(50 * 60)] {
        let a = run.pass(T0 + t);
        assert!(events(&a, "Consolidating").is_empty(), "{t:?}: {a:?}");
        assert!(launches(&a).is_empty(), "{t:?}: {a:?}");
    }
    // An hour after the call-off (and after the fruitless look's hour), the move is tried again.
    let a = run.pass(T0 + secs(2 * 3600));
    assert_eq!(events(&a, "Consolidating").len(), 4, "{a:?}");
}

#[test]
fn nothing_is_consolidated_in_a_pool_without_it_or_in_dry_run() {
    let mut run = four_small_nodes();
    let off = CONSOLIDATING.replace("enabled: true", "enabled: false");
    let policy = parse_policy(&off, "policy.yaml").unwrap();
    let catalog = run.core.catalog().clone();
    run.core.set_policy(Arc::new(policy), catalog);
    assert!(tainted_replacing(&run.pass(T0)).is_empty());
    let mut dry = four_small_nodes();
    dry.core = {
        let mut c = Autoscaler::new(Config {
            dry_run: true,
            ..Config::default()
        });
        let policy = parse_policy(CONSOLIDATING, "policy.yaml").unwrap();
        c.set_policy(Arc::new(policy), run.core.catalog().clone());
        c.restore(None);
        c
    };
    let a = dry.pass(T0);
    assert!(
        tainted_replacing(&a).is_empty() && launches(&a).is_empty(),
        "{a:?}"
    );
}

fn nominations(actions: &[Action]) -> BTreeMap<&str, &str> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Nominate { pod, node, .. } => Some((pod.as_str(), node.as_str())),
            _ => None,
        })
        .collect()
}

/// A 4-GPU pod and a 1-GPU pod, their two nodes launched and registered (Ready, GPUs
/// advertised) while both pods still wait for the scheduler.
fn two_pods_and_their_nodes(config: Config) -> Run {
    let mut run = Run::new(config);
    run.pods.push(gpu_pod("wide", 4));
    run.pods.push(gpu_pod("small", 1));
    let first = run.pass(T0);
    assert_eq!(launches(&first).len(), 2, "{first:?}");
    assert!(nominations(&first).is_empty(), "no node to nominate yet");
    for id in ["i-1", "i-2"] {
        let i = run.cloud.instances.iter().find(|i| i.id == id).unwrap();
        let gpus = if i.offering.instance_type == "g5.xlarge" {
            1
        } else {
            4
        };
        run.register(id, gpus, T0 + secs(60));
    }
    run
}

#[test]
fn pending_pods_are_nominated_to_the_nodes_launched_for_them_once() {
    let mut run = two_pods_and_their_nodes(Config::default());
    let node_of = |run: &Run, instance_type: &str| {
        run.nodes
            .iter()
            .find(|n| n.instance_type() == Some(instance_type))
            .unwrap()
            .name
            .clone()
    };
    let (big, small) = (node_of(&run, "g5.12xlarge"), node_of(&run, "g5.xlarge"));
    let actions = run.pass(T0 + secs(70));
    let n = nominations(&actions);
    assert_eq!(n.get("ml/wide"), Some(&big.as_str()), "{actions:?}");
    assert_eq!(n.get("ml/small"), Some(&small.as_str()), "{actions:?}");
    assert_eq!(events(&actions, "Nominated").len(), 2);
    // The API server shows them nominated: nothing more to do.
    for p in &mut run.pods {
        let node = if p.id.name == "wide" { &big } else { &small };
        p.nominated_node = Some(node.clone());
    }
    assert!(nominations(&run.pass(T0 + secs(80))).is_empty());
    // The scheduler cleared one (the pod failed to schedule meanwhile): set again, no new Event.
    run.pods[1].nominated_node = None;
    let actions = run.pass(T0 + secs(90));
    assert_eq!(nominations(&actions).get("ml/small"), Some(&small.as_str()));
    assert!(events(&actions, "Nominated").is_empty());
}

#[test]
fn a_nomination_someone_else_made_is_left_alone_and_dry_run_nominates_nothing() {
    let mut run = two_pods_and_their_nodes(Config::default());
    // The scheduler nominated the small pod to a node of another group (a preemption there).
    run.nodes.push(
        NodeBuilder::new("other")
            .cpu_milli(4000)
            .memory_gib(16)
            .gpus(1)
            .build(),
    );
    run.pods[1].nominated_node = Some("other".into());
    let n = nominations(&run.pass(T0 + secs(70))).len();
    let actions = run.actions.clone();
    let all = nominations(&actions);
    assert_eq!(n, 1, "{all:?}");
    assert!(all.contains_key("ml/wide") && !all.contains_key("ml/small"));
    // Its node gone, the nomination is stale: the pod is nominated to the node launched for it.
    run.nodes.retain(|n| n.name != "other");
    assert!(nominations(&run.pass(T0 + secs(80))).contains_key("ml/small"));

    // A dry run only reports: a pending pod that fits a node of ours is not nominated there.
    for dry_run in [false, true] {
        let mut run = Run::new(Config {
            dry_run,
            ..Config::default()
        });
        run.nodes.push(
            NodeBuilder::new("ours")
                .pool("a10g", "g5.12xlarge", "us-east-1a")
                .cpu_milli(48_000)
                .memory_gib(192)
                .gpus(4)
                .created(T0)
                .build(),
        );
        run.with_our_instance();
        run.pods.push(gpu_pod("wide", 4));
        run.pass(T0 + secs(5)); // registers it in its pool
        let n = nominations(&run.pass(T0 + secs(10))).len();
        assert_eq!(n, usize::from(!dry_run), "dry run: {dry_run}");
    }
}

#[test]
fn a_nomination_the_scheduler_cleared_still_keeps_the_pods_node_in_the_plan() {
    // A one-pod gang's node has registered and the pod is nominated to it; the scheduler tried
    // the pod while the node was NotReady and cleared the nomination. Single pods arriving now
    // would be expected on that node (the first registered) and the gang on a new one; planned
    // as nominated, the gang keeps its node and the singles get their own.
    let mut run = Run::new(Config::default());
    run.pods
        .push(PodBuilder::new("ml", "w0").gpus(4).gang("job", 1).build());
    assert_eq!(launches(&run.pass(T0)).len(), 1);
    run.register("i-1", 4, T0 + secs(60));
    let node = run.nodes[0].name.clone();
    let n = nominations(&run.pass(T0 + secs(61))).len();
    assert_eq!(n, 1);
    for i in 0..3 {
        run.pods.push(gpu_pod(&format!("s{i}"), 1));
    }
    let actions = run.pass(T0 + secs(62));
    assert_eq!(nominations(&actions).get("ml/w0"), Some(&node.as_str()));
    let launched: Vec<&str> = launches(&actions)
        .iter()
        .map(|l| l.offerings[0].instance_type.as_str())
        .collect();
    assert!(
        !launched.contains(&"g5.12xlarge") && !launched.is_empty(),
        "{launched:?}"
    );
}

// ---- orphans: pools no longer in the policy ----

/// [`POLICY`] and a second pool, `old`, that a reload takes out.
const POLICY_WITH_OLD: &str = r#"
zones: [us-east-1a, us-east-1b]
maxNodeProvisionTime: 10m
insufficientCapacityTtl: 5m
pools:
  - name: a10g
    instanceTypes: [g5.xlarge, g5.12xlarge]
    capacityTypes: [spot, on-demand]
    maxNodes: 20
    scaleDown: {unneededTime: 3m, cooldownAfterScaleUp: 3m}
  - name: old
    instanceTypes: [g5.xlarge]
    maxNodes: 4
"#;

fn policy_of(text: &str) -> Arc<crate::policy::Policy> {
    Arc::new(parse_policy(text, "policy.yaml").unwrap_or_else(|e| panic!("{e}")))
}

/// Pool `old` with a registered, idle node (`node-i-old-1`, instance `i-old-1`) and an instance
/// without a Node (`i-old-2`), both launched long before; then a reload to `policy`.
fn orphaned_pool(policy: &str) -> Run {
    let mut run = Run::with_policy(Config::default(), POLICY_WITH_OLD);
    for (id, with_node) in [("i-old-1", true), ("i-old-2", false)] {
        let i = Instance {
            id: id.into(),
            provider_id: format!("aws:///us-east-1a/{id}"),
            pool: "old".into(),
            launch_id: "old-launch".into(),
            offering: key("g5.xlarge", "us-east-1a", CapacityType::OnDemand),
            state: InstanceState::Running,
            launched_at_ms: (T0 - secs(3600)).0,
            reservation_id: None,
            launch_fingerprint: None,
            unclaimed: false,
        };
        if with_node {
            let mut n = NodeBuilder::new(&format!("node-{id}"))
                .pool("old", "g5.xlarge", "us-east-1a")
                .label(labels::LAUNCH_ID, "old-launch")
                .annotation(labels::GPUS_ADVERTISED, "true")
                .cpu_milli(4000)
                .memory_gib(16)
                .gpus(1)
                .created(T0 - secs(3500))
                .build();
            n.provider_id = Some(i.provider_id.clone());
            run.nodes.push(n);
        }
        run.cloud.instances.push(i);
    }
    let catalog = run.core.catalog().clone();
    run.core.set_policy(policy_of(policy), catalog);
    run
}

#[test]
fn orphan_nodes_and_instances_of_a_removed_pool_are_reported_once_and_kept() {
    let mut run = orphaned_pool(POLICY);
    // Too large for the orphan node (which the scheduler may use: it stays a node).
    run.pods.push(gpu_pod("p", 4));
    let first = run.pass(T0);
    let reported = events(&first, "PoolOrphaned");
    assert_eq!(reported.len(), 1, "{first:?}");
    assert_eq!(reported[0].subject, Subject::Pool("old".into()));
    assert!(
        reported[0].message.contains("node-i-old-1") && reported[0].message.contains("keep"),
        "{}",
        reported[0].message
    );
    let st = status(&first).expect("a status");
    assert_eq!(st.orphans.len(), 2, "{st:?}");
    assert_eq!(st.orphans["i-old-1"].node.as_deref(), Some("node-i-old-1"));
    assert_eq!(st.orphans["i-old-2"].pool, "old");
    assert_eq!(
        status::orphan_pools_of(&serde_json::to_string(st).unwrap()),
        ["old".to_string()].into()
    );
    // Launches are for the policy's pools only.
    let l = launches(&first);
    assert!(l.iter().all(|r| r.pool == "a10g") && !l.is_empty(), "{l:?}");
    // Past maxNodeProvisionTime and the pools' unneeded times: nothing is drained, terminated or
    // given up, and the Event is not sent again.
    let mut later = Vec::new();
    for s in [60, 600, 1200, 2400] {
        later.extend(run.pass(T0 + secs(s)));
    }
    assert!(events(&later, "PoolOrphaned").is_empty(), "{later:?}");
    // (The pod's own launches never register here, and are given up as usual.)
    assert!(
        drains(&run.actions).is_empty(),
        "{:?}",
        drains(&run.actions)
    );
    let t = terminated(&run.actions);
    assert!(!t.iter().any(|i| i.starts_with("i-old")), "{t:?}");
    assert!(!run.actions.iter().any(|a| matches!(a,
        Action::DeleteNode { node } if node == "node-i-old-1")));
    assert!(!run.actions.iter().any(|a| matches!(a,
        Action::Count(Count::FailedLaunch { pool, .. }) if pool == "old")));
    assert!(launches(&run.actions).iter().all(|r| r.pool == "a10g"));
}

#[test]
fn orphans_drain_drains_the_nodes_and_terminates_the_instances_without_one() {
    let drain_policy = format!("orphans: drain\n{POLICY}");
    let mut run = orphaned_pool(&drain_policy);
    let actions = run.pass(T0);
    let d = drains(&actions);
    assert_eq!(d.len(), 1, "{actions:?}");
    assert_eq!(d[0].node, "node-i-old-1");
    assert_eq!(d[0].pool, "old");
    assert_eq!(d[0].instance_id.as_deref(), Some("i-old-1"));
    assert_eq!(d[0].kind, DrainKind::Voluntary);
    assert_eq!(terminated(&actions), ["i-old-2"]);
    assert!(events(&actions, "PoolOrphaned")[0]
        .message
        .contains("drain"));
    // The drain runs; the terminated instance is asked for again only after a while.
    let again = run.pass(T0 + secs(10));
    assert!(
        drains(&again).is_empty() && terminated(&again).is_empty(),
        "{again:?}"
    );
    // A drain given back is tried again after the retry time, not at every pass.
    run.core.drain_finished(
        "node-i-old-1",
        DrainOutcome::RolledBack("a pod cannot be moved".into()),
        T0 + secs(20),
    );
    assert!(drains(&run.pass(T0 + secs(30))).is_empty());
    let retried = run.pass(T0 + secs(20) + orphans::ORPHAN_RETRY);
    assert_eq!(drains(&retried).len(), 1, "{retried:?}");
}

#[test]
fn orphan_drains_stay_within_max_concurrent_drains() {
    let drain_policy = format!("orphans: drain\nmaxConcurrentDrains: 1\n{POLICY}");
    let mut run = orphaned_pool(&drain_policy);
    let mut n2 = run.nodes[0].clone();
    n2.name = "node-i-old-3".into();
    n2.provider_id = Some("aws:///us-east-1a/i-old-3".into());
    let mut i3 = run.cloud.instances[0].clone();
    i3.id = "i-old-3".into();
    i3.provider_id = "aws:///us-east-1a/i-old-3".into();
    run.nodes.push(n2);
    run.cloud.instances.push(i3);
    assert_eq!(drains(&run.pass(T0)).len(), 1);
}

// ---- a Node re-created for a running instance ----

/// An instance of pool a10g launched an hour before T0.
fn old_instance(run: &mut Run, id: &str) {
    run.cloud.instances.push(Instance {
        id: id.into(),
        provider_id: format!("aws:///us-east-1a/{id}"),
        pool: "a10g".into(),
        launch_id: "before".into(),
        offering: key("g5.xlarge", "us-east-1a", CapacityType::OnDemand),
        state: InstanceState::Running,
        launched_at_ms: (T0 - secs(3600)).0,
        reservation_id: None,
        launch_fingerprint: None,
        unclaimed: false,
    });
}

/// The Node its kubelet registers again: no GPUs advertised yet, none of our annotations.
fn recreated_node(instance_id: &str, created: Time) -> Node {
    let mut n = NodeBuilder::new(&format!("node-{instance_id}"))
        .pool("a10g", "g5.xlarge", "us-east-1a")
        .cpu_milli(4000)
        .memory_gib(16)
        .gpus(0)
        .created(created)
        .build();
    n.provider_id = Some(format!("aws:///us-east-1a/{instance_id}"));
    n
}

fn removed_without_drain(run: &Run, instance_id: &str) -> bool {
    let node = format!("node-{instance_id}");
    run.actions.iter().any(|a| {
        matches!(a, Action::Terminate { instance_id: i, .. } if i == instance_id)
            || matches!(a, Action::DeleteNode { node: n } if *n == node)
    })
}

#[test]
fn a_recreated_node_of_a_running_instance_is_not_terminated_while_its_gpus_come_up() {
    let mut run = Run::new(Config::default());
    old_instance(&mut run, "i-r");
    run.register("i-r", 1, T0 - secs(3500));
    run.pass(T0);
    // The Node is deleted (by hand, or by a node lifecycle controller) and its kubelet
    // registers it again, as a new Node whose device plugin has not started yet.
    run.nodes.clear();
    run.pass(T0 + secs(60));
    run.nodes.push(recreated_node("i-r", T0 + secs(90)));
    for s in [120, 180, 300, 500] {
        run.pass(T0 + secs(s));
    }
    assert!(
        !removed_without_drain(&run, "i-r"),
        "the instance of a re-created Node was removed: {:?}",
        run.actions
    );
    // Its GPUs come up: registered and kept for good.
    run.nodes[0].allocatable.gpu = 1;
    run.pass(T0 + secs(600));
    run.pass(T0 + secs(3600));
    assert!(!removed_without_drain(&run, "i-r"), "{:?}", run.actions);
}

#[test]
fn a_recreated_node_seen_first_by_a_new_leader_waits_from_its_creation() {
    let mut run = Run::new(Config::default());
    old_instance(&mut run, "i-r");
    run.nodes.push(recreated_node("i-r", T0 - secs(30)));
    run.pass(T0);
    run.pass(T0 + secs(500));
    assert!(!removed_without_drain(&run, "i-r"), "{:?}", run.actions);
    // A Node that never advertises its GPUs is still given up, counted from its creation.
    run.pass(T0 + secs(600));
    assert_eq!(terminated(&run.actions), ["i-r"]);
}

// ---- failover while the cloud's listing lags ----

#[test]
fn failover_while_the_listing_lags_launches_once_not_again_under_another_id() {
    let mut a = Run::new(Config {
        identity: "a".into(),
        ..Config::default()
    });
    // The cloud lists an instance two minutes after its launch.
    a.cloud.listing_lag = Some(secs(120));
    a.pods.push(gpu_pod("p", 1));
    let first = a.pass(T0);
    assert_eq!(launches(&first).len(), 1);
    let written = status(&first).expect("a status");
    assert_eq!(written.launched_unlisted.len(), 1, "{written:?}");
    let json = serde_json::to_string(written).unwrap();

    // The leader dies; the other replica takes over with the same cloud and cluster, reads the
    // status, and a second pod has arrived meanwhile: its plan (both pods) is not the first
    // leader's, so a launch for `p` would carry another launch id.
    let mut b = Run::new(Config {
        identity: "b".into(),
        ..Config::default()
    });
    b.core.leadership_lost(&[]);
    b.core.restore(Some(&json));
    b.cloud = std::mem::take(&mut a.cloud);
    b.pods = a.pods.clone();
    b.pods.push(gpu_pod("p2", 1));
    assert!(b.observation(T0 + secs(20)).instances.unwrap().is_empty());
    let second = b.pass(T0 + secs(20));
    let l = launches(&second);
    let launched: u32 = l.iter().map(|r| r.count).sum();
    assert_eq!(launched, 1, "only p2's node: {l:?}");
    assert_eq!(b.cloud.live().len(), 2, "p's node was launched twice");
    // Once listed, the instance is the cloud's to show: nothing more is launched.
    let third = b.pass(T0 + secs(200));
    assert!(launches(&third).is_empty(), "{third:?}");
    assert_eq!(b.cloud.live().len(), 2);
}

/// The status in force when a leader died right after its launches were answered, before the
/// status of their outcome was written: the one written before them.
fn status_before_launches(actions: &[Action]) -> String {
    let at = actions
        .iter()
        .position(|a| matches!(a, Action::Launch { .. }))
        .expect("a launch");
    let st = status(&actions[..at]).expect("a status written before the launches");
    serde_json::to_string(st).unwrap()
}

#[test]
fn failover_a_leader_killed_between_the_launch_answer_and_the_status_launches_once() {
    let mut a = Run::new(Config {
        identity: "a".into(),
        ..Config::default()
    });
    a.cloud.listing_lag = Some(secs(120));
    a.pods.push(gpu_pod("p", 1));
    let first = a.pass(T0);
    assert_eq!(launches(&first).len(), 1);
    let json = status_before_launches(&first);
    assert!(json.contains("\"launching\""), "{json}");

    // `a` dies once the cloud answered and before the status of the launch is written; `b`
    // reads the one written before it. A second pod makes `b`'s plan differ from `a`'s.
    let mut b = Run::new(Config {
        identity: "b".into(),
        ..Config::default()
    });
    b.core.leadership_lost(&[]);
    b.core.restore(Some(&json));
    b.cloud = std::mem::take(&mut a.cloud);
    b.pods = a.pods.clone();
    b.pods.push(gpu_pod("p2", 1));
    for t in [20, 60, 100] {
        let out = b.pass(T0 + secs(t));
        assert!(launches(&out).is_empty(), "at {t}s: {:?}", launches(&out));
        // What is still awaited goes on to a leader after `b`.
        let st = status(&out).expect("a status");
        assert_eq!(st.launching.len(), 1, "{st:?}");
    }
    assert_eq!(b.cloud.live().len(), 1);
    // Listed at last: p's instance is in flight, and only p2 gets a launch.
    let listed = b.pass(T0 + secs(130));
    let l = launches(&listed);
    assert_eq!(l.iter().map(|r| r.count).sum::<u32>(), 1, "{l:?}");
    assert!(status(&listed).expect("a status").launching.is_empty());
    b.pass(T0 + secs(200));
    assert_eq!(b.cloud.live().len(), 2, "p's node was launched twice");
}

#[test]
fn failover_a_launch_the_last_leader_asked_for_and_the_cloud_never_made_holds_its_pool_five_minutes(
) {
    let mut a = Run::new(Config {
        identity: "a".into(),
        ..Config::default()
    });
    a.pods.push(gpu_pod("p", 1));
    let first = a.pass(T0);
    let json = status_before_launches(&first);

    // The launch never reached the cloud (the leader died before sending it).
    let mut b = Run::new(Config {
        identity: "b".into(),
        ..Config::default()
    });
    b.core.leadership_lost(&[]);
    b.core.restore(Some(&json));
    b.pods = a.pods.clone();
    assert!(launches(&b.pass(T0 + secs(20))).is_empty());
    assert!(launches(&b.pass(T0 + secs(290))).is_empty());
    let after = b.pass(T0 + secs(301));
    assert_eq!(launches(&after).len(), 1, "{after:?}");
    assert_eq!(b.cloud.live().len(), 1);
}

#[test]
fn overrun_a_node_whose_instance_cannot_be_terminated_is_not_deleted_until_it_is() {
    let mut run = Run::new(Config::default());
    old_instance(&mut run, "i-n");
    // Registered an hour ago, never advertised its GPUs; terminations are denied.
    run.nodes.push(recreated_node("i-n", T0 - secs(3500)));
    run.cloud.terminate_fails = Some(ProviderError::Other {
        message: "UnauthorizedOperation".into(),
    });
    let deleted = |run: &Run| {
        run.actions
            .iter()
            .any(|a| matches!(a, Action::DeleteNode { node } if node == "node-i-n"))
    };
    run.pass(T0); // registers it in its pool
    let first = run.pass(T0 + secs(10));
    assert_eq!(terminated(&first), ["i-n"], "given up: {first:?}");
    // Retried with back-off, never deleting the Node of an instance still running.
    for m in 1..20 {
        run.pass(T0 + secs(60 * m));
    }
    assert!(terminated(&run.actions).len() > 1);
    assert!(!deleted(&run), "{:?}", run.actions);
    // The cloud accepts the termination: the Node goes with it, once.
    run.cloud.terminate_fails = None;
    for m in 20..40 {
        run.pass(T0 + secs(60 * m));
    }
    let deletes = run
        .actions
        .iter()
        .filter(|a| matches!(a, Action::DeleteNode { node } if node == "node-i-n"))
        .count();
    assert_eq!(deletes, 1, "{:?}", run.actions);
}
mod lifecycle;

// ---- capacity reservations ----

const RESERVED_POLICY: &str = r#"
zones: [us-east-1a, us-east-1b]
maxNodeProvisionTime: 10m
insufficientCapacityTtl: 5m
pools:
  - name: a10g
    instanceTypes: [g5.xlarge]
    capacityTypes: [reserved, on-demand]
    capacityReservations: [{id: cr-0block}]
    maxNodes: 20
    scaleDown: {unneededTime: 3m, cooldownAfterScaleUp: 3m}
"#;

/// A Capacity Block of `available` g5.xlarge in us-east-1a, from an hour before T0 to `end`.
fn capacity_block(available: u32, end: Time) -> gpu_node_autoscaler_provider::Reservation {
    gpu_node_autoscaler_provider::Reservation {
        id: "cr-0block".into(),
        kind: gpu_node_autoscaler_provider::ReservationKind::CapacityBlock,
        instance_type: "g5.xlarge".into(),
        zone: "us-east-1a".into(),
        total: 4,
        available,
        start_ms: Some(T0.0 - 3_600_000),
        end_ms: Some(end.0),
        tags: BTreeMap::new(),
        price_per_hour: None,
    }
}

fn reserved_key() -> OfferingKey {
    key("g5.xlarge", "us-east-1a", CapacityType::Reserved)
}

#[test]
fn reserved_capacity_is_filled_first_and_what_exceeds_its_count_goes_on_demand() {
    let mut run = Run::with_policy(Config::default(), RESERVED_POLICY);
    run.reservations = vec![capacity_block(2, T0 + secs(10 * 3600))];
    run.pods = (0..3).map(|i| gpu_pod(&format!("p{i}"), 1)).collect();
    let a = run.pass(T0);
    let l = launches(&a);
    let reserved: Vec<_> = l
        .iter()
        .filter(|r| r.offerings[0] == reserved_key())
        .collect();
    assert_eq!(reserved.len(), 1, "{l:?}");
    assert_eq!(reserved[0].count, 2, "the reservation's count: {l:?}");
    let rest: u32 = l
        .iter()
        .filter(|r| r.offerings[0].capacity_type == CapacityType::OnDemand)
        .map(|r| r.count)
        .sum();
    assert_eq!(rest, 1, "{l:?}");
    let launched: Vec<_> = run.cloud.live();
    assert_eq!(
        launched
            .iter()
            .filter(|i| i.offering.capacity_type == CapacityType::Reserved)
            .count(),
        2
    );
}

#[test]
fn a_reserved_launch_names_the_reservations_its_pool_selects_open_ended_first() {
    let mut run = Run::with_policy(
        Config::default(),
        &RESERVED_POLICY.replace("[{id: cr-0block}]", "[{id: cr-0block}, {id: cr-0odcr}]"),
    );
    let odcr = |id: &str, available| gpu_node_autoscaler_provider::Reservation {
        id: id.into(),
        kind: gpu_node_autoscaler_provider::ReservationKind::Default,
        end_ms: None,
        start_ms: None,
        available,
        ..capacity_block(0, T0)
    };
    run.reservations = vec![
        capacity_block(2, T0 + secs(10 * 3600)),
        // Not selected by the pool: never targeted, though of the same type and zone.
        odcr("cr-0other", 5),
        odcr("cr-0odcr", 1),
        // Selected but full.
        gpu_node_autoscaler_provider::Reservation {
            zone: "us-east-1b".into(),
            ..odcr("cr-0odcr", 0)
        },
    ];
    run.pods = (0..3).map(|i| gpu_pod(&format!("p{i}"), 1)).collect();
    let a = run.pass(T0);
    let l = launches(&a);
    let reserved: Vec<_> = l
        .iter()
        .filter(|r| r.offerings[0] == reserved_key())
        .collect();
    assert_eq!(reserved.len(), 1, "{l:?}");
    assert_eq!(reserved[0].count, 3, "{l:?}");
    let ids: Vec<&str> = reserved[0]
        .reservations
        .iter()
        .map(|r| r.id.as_str())
        .collect();
    assert_eq!(ids, ["cr-0odcr", "cr-0block"], "{l:?}");
    // A launch without reserved offerings names none.
    assert!(l
        .iter()
        .filter(|r| r
            .offerings
            .iter()
            .all(|o| o.capacity_type != CapacityType::Reserved))
        .all(|r| r.reservations.is_empty()));
}

#[test]
fn a_reservation_the_cloud_finds_used_up_is_insufficient_capacity_for_that_offering_only() {
    let mut run = Run::with_policy(Config::default(), RESERVED_POLICY);
    // The listing still counts 2, but others took them meanwhile.
    run.reservations = vec![capacity_block(2, T0 + secs(10 * 3600))];
    run.cloud.capacity.insert(reserved_key(), 0);
    run.pods = vec![gpu_pod("p0", 1)];
    let a = run.pass(T0);
    let live = run.cloud.live();
    assert_eq!(live.len(), 1, "{a:?}");
    assert_eq!(live[0].offering.capacity_type, CapacityType::OnDemand);
    // Another pod later: the reservation is not tried again while it is marked short, and
    // on-demand in the same zone is still offered.
    run.pods.push(gpu_pod("p1", 1));
    let a = run.pass(T0 + secs(30));
    let l = launches(&a);
    assert!(!l.is_empty(), "{a:?}");
    assert!(
        l.iter().all(|r| !r.offerings.contains(&reserved_key())),
        "{l:?}"
    );
    assert!(l[0]
        .offerings
        .contains(&key("g5.xlarge", "us-east-1a", CapacityType::OnDemand)));
}

#[test]
fn a_capacity_block_node_is_replaced_and_drained_before_the_block_ends() {
    let end = T0 + secs(4 * 3600);
    let mut run = Run::with_policy(Config::default(), RESERVED_POLICY);
    run.reservations = vec![capacity_block(2, end)];
    run.pods.push(gpu_pod("p", 1));
    run.pass(T0);
    assert_eq!(
        run.cloud.live()[0].offering.capacity_type,
        CapacityType::Reserved
    );
    run.register("i-1", 1, T0);
    run.pods[0].node_name = Some("node-i-1".into());
    run.pods[0].phase = crate::model::PodPhase::Running;
    run.pods[0].started = Some(T0);
    run.reservations = vec![capacity_block(1, end)];
    // More than the lead (30 minutes by default) before the end: nothing moves. The node is
    // labelled with its reservation (ours and Karpenter's label).
    let a = run.pass(end - secs(31 * 60));
    let reg = a
        .iter()
        .find_map(|x| match x {
            Action::Register(r) if r.node == "node-i-1" => Some(r),
            _ => None,
        })
        .expect("the reservation labels registered");
    for l in [
        labels::CAPACITY_RESERVATION_ID,
        labels::KARPENTER_CAPACITY_RESERVATION_ID,
    ] {
        assert_eq!(
            reg.labels.get(l).map(String::as_str),
            Some("cr-0block"),
            "{l}"
        );
    }
    assert!(tainted_replacing(&a).is_empty(), "{a:?}");
    assert!(drains(&a).is_empty(), "{a:?}");
    // At the lead: the node is tainted, its pod gets new capacity (not in the ending block), and
    // the node is drained as an interrupted one, its deadline no later than the end.
    let now = end - secs(30 * 60);
    let a = run.pass(now);
    assert_eq!(tainted_replacing(&a), ["node-i-1"]);
    let ev = events(&a, "CapacityBlockEnding");
    assert_eq!(ev.len(), 1, "{a:?}");
    let moved: Vec<f64> = a
        .iter()
        .filter_map(|x| match x {
            Action::Count(Count::CapacityBlockPodHoursMoved { pod_hours, .. }) => Some(*pod_hours),
            _ => None,
        })
        .collect();
    assert_eq!(moved.len(), 1, "{a:?}");
    assert!(
        (moved[0] - 3.5).abs() < 1e-9,
        "the pod ran from T0: {moved:?}"
    );
    assert!(ev[0].message.contains("cr-0block"), "{}", ev[0].message);
    let l = launches(&a);
    assert_eq!(l.len(), 1, "the pod's new node: {a:?}");
    assert!(!l[0].offerings.contains(&reserved_key()), "{l:?}");
    let d = drains(&a);
    assert_eq!(d.len(), 1, "{a:?}");
    assert_eq!(d[0].kind, DrainKind::Forced);
    assert!(d[0].deadline <= end, "{:?} after {end:?}", d[0].deadline);
    let out = run
        .core
        .drain_finished("node-i-1", DrainOutcome::Removed, now + secs(60));
    assert_eq!(
        out,
        [Action::Count(Count::Replaced {
            pool: "a10g".into(),
            cause: "interrupted"
        })]
    );
}

fn refused_events(actions: &[Action]) -> Vec<&str> {
    events(actions, "FailedScaleUp")
        .into_iter()
        .map(|n| n.message.as_str())
        .collect()
}

/// A 1-GPU pod, a g5.xlarge launched for it and registered (Ready, its GPU advertised) at 60 s,
/// and kube-scheduler still holding the pod `Unschedulable` for a rule the model does not know.
fn a_pod_the_scheduler_refuses() -> Run {
    let policy = POLICY.replace("[g5.xlarge, g5.12xlarge]", "[g5.xlarge]");
    let mut run = Run::with_policy(Config::default(), &policy);
    let mut pod = gpu_pod("server", 1);
    pod.scheduler_message = Some(
        "0/2 nodes are available: 1 node(s) didn't match pod anti-affinity rules, 1 \
         Insufficient nvidia.com/gpu."
            .into(),
    );
    run.pods.push(pod);
    assert_eq!(launches(&run.pass(T0)).len(), 1);
    run.register("i-1", 1, T0 + secs(60));
    run
}

#[test]
fn a_pod_refused_by_the_scheduler_on_a_ready_node_it_fits_gets_other_capacity_after_the_grace() {
    let mut run = a_pod_the_scheduler_refuses();
    // The node is its place: nothing launched while the scheduler may still take it there.
    for s in [70, 100, 159] {
        let a = run.pass(T0 + secs(s));
        assert!(launches(&a).is_empty(), "launched at {s} s: {a:?}");
        assert!(refused_events(&a).is_empty(), "{a:?}");
    }
    // 90 s after the plan first placed it on the Ready node: refused.
    let a = run.pass(T0 + secs(160));
    let why = refused_events(&a);
    assert_eq!(why.len(), 1, "{a:?}");
    assert!(
        why[0].contains("node node-i-1 for 90 s although it fits there")
            && why[0].contains("didn't match pod anti-affinity rules"),
        "{why:?}"
    );
    assert!(a.contains(&Action::Count(Count::Refused {
        pool: "a10g".into()
    })));
    // Planned again without that node: a new one is launched, the refusal said once.
    let a = run.pass(T0 + secs(170));
    assert_eq!(launches(&a).len(), 1, "{a:?}");
    assert!(refused_events(&a).is_empty());
    assert!(refused_events(&run.pass(T0 + secs(400))).is_empty());

    // Once the pod is placed (here: gone), what was refused is forgotten.
    run.pods.clear();
    run.pass(T0 + secs(410));
    assert!(run.core.refusals_is_empty());
}

#[test]
fn a_pod_not_yet_marked_unschedulable_or_on_a_node_not_ready_is_not_refused() {
    let mut run = a_pod_the_scheduler_refuses();
    run.pods[0].unschedulable = false;
    run.nodes[0].ready = false;
    for s in [70, 200, 400] {
        assert!(refused_events(&run.pass(T0 + secs(s))).is_empty());
    }
    // Ready from 400 s: the grace counts from then, and only while the scheduler refuses.
    run.nodes[0].ready = true;
    assert!(refused_events(&run.pass(T0 + secs(500))).is_empty());
    run.pods[0].unschedulable = true;
    assert!(refused_events(&run.pass(T0 + secs(510))).is_empty());
    assert_eq!(refused_events(&run.pass(T0 + secs(600))).len(), 1);
}

#[test]
fn a_pod_refused_on_three_nodes_waits_with_its_reason_instead_of_launching_more() {
    let mut run = a_pod_the_scheduler_refuses();
    let mut t = 70;
    for k in 1..=3 {
        run.pass(T0 + secs(t));
        assert_eq!(
            refused_events(&run.pass(T0 + secs(t + 90))).len(),
            1,
            "refusal {k}"
        );
        t += 100;
        let a = run.pass(T0 + secs(t));
        if k < 3 {
            assert_eq!(launches(&a).len(), 1, "after refusal {k}: {a:?}");
            let id = format!("i-{}", k + 1);
            run.register(&id, 1, T0 + secs(t + 5));
            t += 10;
        } else {
            assert!(launches(&a).is_empty(), "a fourth node: {a:?}");
            let said = a.iter().any(|x| {
                matches!(x, Action::Event(n) if n.reason == "NotTriggerScaleUp"
                    && n.message.contains("kube-scheduler refused it on 3 nodes"))
            });
            assert!(said, "{a:?}");
        }
    }
}

/// A CapacityBuffer of `replicas` one-GPU chunks in namespace `serve`.
fn one_gpu_buffer(replicas: i32) -> crate::buffer::CapacityBuffer {
    use crate::buffer::{CapacityBuffer, Source, Status, STRATEGY_ACTIVE};
    let mut chunk = PodBuilder::new("serve", "chunk")
        .gpus(1)
        .cpu_milli(1000)
        .memory_gib(2)
        .build();
    chunk.unschedulable = true;
    CapacityBuffer {
        namespace: "serve".into(),
        name: "warm".into(),
        uid: "uid-warm".into(),
        generation: 1,
        created: T0,
        strategy: STRATEGY_ACTIVE.into(),
        source: Source::PodTemplate("replica".into()),
        replicas: Some(replicas),
        percentage: None,
        limits: None,
        limit_names: Vec::new(),
        chunk: Ok(chunk),
        scalable_replicas: None,
        template_generation: None,
        scalable_template: None,
        own_template: None,
        status: Status::default(),
    }
}

impl Run {
    /// One pass with the buffers' virtual pods planned alongside the real ones, as the
    /// executors do.
    fn pass_with_buffers(
        &mut self,
        now: Time,
        buffers: &[crate::buffer::CapacityBuffer],
    ) -> Vec<Action> {
        let real: Vec<Pod> = self
            .pods
            .iter()
            .filter(|p| crate::buffer::buffer_of(p).is_none())
            .cloned()
            .collect();
        self.pods = real;
        let a = self
            .core
            .assess_buffers(&self.observation(now).snapshot, buffers, now);
        self.pods.extend(a.inject);
        self.pass(now)
    }
}

const BUFFER_POLICY: &str = r#"
zones: [us-east-1a]
maxNodeProvisionTime: 10m
pools:
  - name: a10g
    instanceTypes: [g5.xlarge]
    capacityTypes: [on-demand]
    maxNodes: 20
    scaleDown: {unneededTime: 3m, cooldownAfterScaleUp: 3m}
"#;

#[test]
fn buffer_timeline_warm_nodes_launched_kept_replenished_and_let_go() {
    let mut run = Run::with_policy(Config::default(), BUFFER_POLICY);
    let buffer = [one_gpu_buffer(2)];
    // No pod at all: two one-GPU nodes are launched for the buffer's two chunks.
    let a = run.pass_with_buffers(T0, &buffer);
    assert_eq!(
        launches(&a).iter().map(|l| l.count).sum::<u32>(),
        2,
        "{a:?}"
    );
    // Not pods that wait: the status counts none.
    assert_eq!(status(&a).map(|s| s.pending_gpu_pods), Some(0), "{a:?}");
    // Nothing more while they come up, nor once they are Ready.
    assert!(launches(&run.pass_with_buffers(T0 + secs(10), &buffer)).is_empty());
    let ids: Vec<String> = run.cloud.live().iter().map(|i| i.id.clone()).collect();
    assert_eq!(ids.len(), 2);
    for id in &ids {
        run.register(id, 1, T0 + secs(60));
    }
    assert!(launches(&run.pass_with_buffers(T0 + secs(70), &buffer)).is_empty());

    // Empty far past their unneeded time and the cooldown: kept, never drained.
    for t in [600, 1200, 1800] {
        let a = run.pass_with_buffers(T0 + secs(t), &buffer);
        assert!(drains(&a).is_empty(), "drained at {t}s: {a:?}");
        assert!(launches(&a).is_empty(), "launched at {t}s: {a:?}");
    }

    // A real pod takes one warm node (the scheduler bound it at once): one node more, for the
    // room it took.
    let node = run.nodes[0].name.clone();
    run.pods.push(
        PodBuilder::new("serve", "burst-0")
            .gpus(1)
            .cpu_milli(500)
            .memory_gib(1)
            .on(&node)
            .build(),
    );
    let a = run.pass_with_buffers(T0 + secs(1810), &buffer);
    assert_eq!(
        launches(&a).iter().map(|l| l.count).sum::<u32>(),
        1,
        "{a:?}"
    );

    // The buffer is deleted: its empty node is unneeded, and goes after its unneeded time.
    let a = run.pass_with_buffers(T0 + secs(1900), &[]);
    assert!(drains(&a).is_empty());
    let since = (T0 + secs(1900)).to_rfc3339();
    Arc::make_mut(&mut run.nodes[1].annotations).insert(labels::UNNEEDED_SINCE.into(), since);
    let a = run.pass_with_buffers(T0 + secs(2100), &[]);
    let d = drains(&a);
    assert_eq!(d.len(), 1, "{a:?}");
    assert_eq!(d[0].node, run.nodes[1].name);
}

#[test]
fn a_dry_run_reports_a_node_the_scheduler_refused_under_a_reason_of_its_own() {
    let mut run = Run::new(Config {
        dry_run: true,
        ..Config::default()
    });
    run.pods.push(gpu_pod("server", 1));
    run.nodes.push(
        NodeBuilder::new("ready")
            .pool("a10g", "g5.xlarge", "us-east-1a")
            .annotation(labels::GPUS_ADVERTISED, "true")
            .cpu_milli(4000)
            .memory_gib(16)
            .gpus(1)
            .created(T0 - secs(600))
            .build(),
    );
    assert!(events(&run.pass(T0), "DryRunFailedScaleUp").is_empty());
    let a = run.pass(T0 + secs(90));
    assert_eq!(events(&a, "DryRunFailedScaleUp").len(), 1, "{a:?}");
    assert!(events(&a, "FailedScaleUp").is_empty(), "{a:?}");
}

#[test]
fn a_pod_outliving_a_capacity_block_launches_elsewhere_and_a_bad_run_time_is_warned_once() {
    let end = T0 + secs(3 * 3600);
    let mut run = Run::with_policy(Config::default(), RESERVED_POLICY);
    run.reservations = vec![capacity_block(4, end)];
    let mut long = gpu_pod("long", 1);
    Arc::make_mut(&mut long.annotations).insert(labels::EXPECTED_RUN_TIME.into(), "5h".into());
    let mut bad = gpu_pod("bad", 1);
    Arc::make_mut(&mut bad.annotations)
        .insert(labels::EXPECTED_RUN_TIME.into(), "five hours".into());
    run.pods = vec![long, bad];
    let a = run.pass(T0);
    let l = launches(&a);
    let on = |ct: CapacityType| -> u32 {
        l.iter()
            .filter(|r| r.offerings[0].capacity_type == ct)
            .map(|r| r.count)
            .sum()
    };
    // The 5-hour pod on-demand; the one whose run time is no duration on the block.
    assert_eq!(
        (on(CapacityType::OnDemand), on(CapacityType::Reserved)),
        (1, 1),
        "{l:?}"
    );
    let ev = events(&a, "InvalidExpectedRunTime");
    assert_eq!(ev.len(), 1, "{a:?}");
    assert!(ev[0].warning);
    assert!(
        ev[0].message.contains("ml/bad")
            && ev[0].message.contains(labels::EXPECTED_RUN_TIME)
            && ev[0].message.contains("five hours"),
        "{}",
        ev[0].message
    );
    // Said once, not every pass.
    let a = run.pass(T0 + secs(10));
    assert!(events(&a, "InvalidExpectedRunTime").is_empty(), "{a:?}");
}

/// [`four_small_nodes`] and an empty one-GPU node of ours ("warm") a buffer's chunk has its room
/// on.
fn four_small_nodes_and_a_warm_one() -> Run {
    let mut run = four_small_nodes();
    run.nodes.push(
        NodeBuilder::new("warm")
            .pool("a10g", "g5.4xlarge", "us-east-1a")
            .label(labels::CAPACITY_TYPE, "on-demand")
            .annotation(labels::GPUS_ADVERTISED, "true")
            .cpu_milli(15_800)
            .memory_gib(62)
            .gpus(1)
            .created(T0 - secs(4 * 3600))
            .build(),
    );
    run.with_our_instance();
    run
}

#[test]
fn buffer_chunk_with_its_room_on_a_node_does_not_stop_consolidation_of_the_others() {
    let mut run = four_small_nodes_and_a_warm_one();
    let buffer = [one_gpu_buffer(1)];
    run.pass_with_buffers(T0 - secs(10), &buffer); // registers the nodes in their pool
    let a = run.pass_with_buffers(T0, &buffer);
    // The chunk's room is on "warm": kept there, and the four small nodes are consolidated.
    assert_eq!(
        tainted_replacing(&a),
        ["small-0", "small-1", "small-2", "small-3"],
        "{a:?}"
    );
    let l = launches(&a);
    assert_eq!(l.len(), 1, "{a:?}");
    assert_eq!(l[0].offerings[0].instance_type, "g5.12xlarge");
    // A moved pod may take the chunk's room (real pods come first); the buffer's room then
    // comes with the new node.
    let for_chunk = a.iter().any(|x| match x {
        Action::Launch { pods, .. } => pods.iter().any(|p| p == "serve/capacity-buffer.warm.0"),
        _ => false,
    });
    assert!(for_chunk, "{a:?}");
}

#[test]
fn buffer_chunk_with_no_room_anywhere_stops_consolidation_while_it_waits() {
    let mut run = four_small_nodes_and_a_warm_one();
    // Two chunks: one has its room on "warm", the other none (the small nodes' GPUs are taken).
    let buffer = [one_gpu_buffer(2)];
    run.pass_with_buffers(T0 - secs(10), &buffer);
    let a = run.pass_with_buffers(T0, &buffer);
    assert!(tainted_replacing(&a).is_empty(), "{a:?}");
    let said = a.iter().any(|x| match x {
        Action::Log { message, .. } => {
            message.contains("nothing to consolidate")
                && message.contains("capacity buffer serve/warm has a chunk")
        }
        _ => false,
    });
    assert!(said, "{a:?}");
}
