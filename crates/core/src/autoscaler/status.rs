//! The status ConfigMap (`kube-system/gpu-node-autoscaler-status`): per pool, what is ready, in
//! flight and targeted, the last scale-up and scale-down, the cooldown, and the offerings
//! currently avoided. Rendered as text for people (`status`) and JSON for tools (`status.json`).

use std::collections::BTreeMap;
use std::fmt::Write;

use gpu_node_autoscaler_provider::{CapacityType, Instance, InstanceState, OfferingKey};
use serde::{Deserialize, Serialize};

use crate::model::{InFlight, Node, Time};
use crate::plan::Plan;
use crate::policy::Policy;

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct PoolStatus {
    pub name: String,
    pub ready_nodes: u32,
    pub ready_gpus: i64,
    /// Launched and not yet a node with GPUs.
    pub in_flight_nodes: u32,
    /// The GPUs those will bring (by their instance types).
    pub in_flight_gpus: i64,
    /// Ready + in flight + what this pass decided to launch, minus what it drains.
    pub target_nodes: u32,
    pub target_gpus: i64,
    pub draining_nodes: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_scale_up: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_scale_down: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_scale_down_failure: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cooldown_until: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Status {
    pub time: String,
    pub leader: String,
    pub dry_run: bool,
    pub policy_valid: bool,
    pub pending_gpu_pods: usize,
    pub pools: Vec<PoolStatus>,
    /// Offering (`type/zone/capacity`) → unavailable until.
    pub unavailable_offerings: BTreeMap<String, String>,
    /// Launch ids given up (never became nodes, or a gang's partial launch given back) → when:
    /// a new leader plans those pods under a new launch id.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub given_up_launches: BTreeMap<String, String>,
    /// Nodes of ours seen unhealthy, not replaced yet → since when and what.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub unhealthy_nodes: BTreeMap<String, String>,
    /// Nodes being replaced → why (`unhealthy: ...`, `interrupted: ...`).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub replacing_nodes: BTreeMap<String, String>,
    /// Instances of ours whose pool is no longer in the policy (`orphans`) → their pool and
    /// Node. A new leader lists these pools too.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub orphans: BTreeMap<String, OrphanStatus>,
    /// Instances launched and not listed by the cloud yet (its listing lags) → what they are: a
    /// new leader counts them as in flight before its first plan, so that it does not launch for
    /// the same pods again under another launch id.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub launched_unlisted: BTreeMap<String, LaunchedStatus>,
    /// Launches asked of the cloud and not answered yet → what they are for: written before
    /// the launches are sent, so that a new leader that takes over before their answer is
    /// recorded does not launch for the same pods again (it holds the pool's launches until the
    /// cloud lists them, or for 5 minutes).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub launching: BTreeMap<String, LaunchingStatus>,
    /// Nodes of ours drifted or expired → what changed, and what keeps them if something does.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub drifted_nodes: BTreeMap<String, String>,
}

/// An instance launched and not listed yet.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct LaunchedStatus {
    pub pool: String,
    pub launch_id: String,
    pub provider_id: String,
    pub instance_type: String,
    pub zone: String,
    pub capacity_type: String,
    pub launched_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reservation_id: Option<String>,
}

impl LaunchedStatus {
    pub fn of(i: &Instance) -> LaunchedStatus {
        LaunchedStatus {
            pool: i.pool.clone(),
            launch_id: i.launch_id.clone(),
            provider_id: i.provider_id.clone(),
            instance_type: i.offering.instance_type.clone(),
            zone: i.offering.zone.clone(),
            capacity_type: i.offering.capacity_type.as_str().to_string(),
            launched_at: Time(i.launched_at_ms).to_rfc3339(),
            reservation_id: i.reservation_id.clone(),
        }
    }
}

/// A launch asked of the cloud, not answered yet.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct LaunchingStatus {
    pub pool: String,
    /// Instances asked for.
    pub count: u32,
    pub asked_at: String,
}

/// A launch a previous leader asked for and may not have seen answered.
#[derive(Clone, Debug, PartialEq)]
pub struct Launching {
    pub pool: String,
    pub count: u32,
    pub asked_at: Time,
}

impl Launching {
    /// As `status.json` carries it.
    pub fn to_status(&self) -> LaunchingStatus {
        LaunchingStatus {
            pool: self.pool.clone(),
            count: self.count,
            asked_at: self.asked_at.to_rfc3339(),
        }
    }
}

/// The launches a previous leader asked for without recording their answer, by launch id, from
/// `status.json` (entries that do not read back are skipped).
pub fn launching_of(status_json: &str) -> Vec<(String, Launching)> {
    let Ok(s) = serde_json::from_str::<Status>(status_json) else {
        return Vec::new();
    };
    s.launching
        .into_iter()
        .filter_map(|(launch_id, l)| {
            let asked_at = Time::parse_rfc3339(&l.asked_at).ok()?;
            Some((
                launch_id,
                Launching {
                    pool: l.pool,
                    count: l.count,
                    asked_at,
                },
            ))
        })
        .collect()
}

/// The instances a previous leader launched and the cloud did not list yet, from `status.json`
/// (entries that do not read back are skipped).
pub fn launched_unlisted_of(status_json: &str) -> Vec<Instance> {
    let Ok(s) = serde_json::from_str::<Status>(status_json) else {
        return Vec::new();
    };
    s.launched_unlisted
        .into_iter()
        .filter_map(|(id, l)| {
            Some(Instance {
                id,
                provider_id: l.provider_id,
                pool: l.pool,
                launch_id: l.launch_id,
                offering: OfferingKey {
                    instance_type: l.instance_type,
                    zone: l.zone,
                    capacity_type: CapacityType::parse(&l.capacity_type)?,
                },
                state: InstanceState::Pending,
                launched_at_ms: Time::parse_rfc3339(&l.launched_at).ok()?.0,
                reservation_id: l.reservation_id,
                launch_fingerprint: None,
                unclaimed: false,
            })
        })
        .collect()
}

/// An instance of ours of a pool no longer in the policy.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct OrphanStatus {
    pub pool: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

/// The pools of the orphans a previous leader listed in `status.json`.
pub fn orphan_pools_of(status_json: &str) -> std::collections::BTreeSet<String> {
    serde_json::from_str::<Status>(status_json)
        .map(|s| s.orphans.into_values().map(|o| o.pool).collect())
        .unwrap_or_default()
}

/// What the controller remembers per pool for the status.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PoolHistory {
    pub last_scale_up: Option<Time>,
    pub last_scale_down: Option<Time>,
    /// Starts the pool's scale-down back-off.
    pub last_scale_down_failure: Option<Time>,
}

/// The launch ids a previous leader gave up, from `status.json`.
pub fn given_up_of(status_json: &str) -> Vec<(String, Time)> {
    let Ok(s) = serde_json::from_str::<Status>(status_json) else {
        return Vec::new();
    };
    s.given_up_launches
        .iter()
        .filter_map(|(id, at)| Time::parse_rfc3339(at).ok().map(|t| (id.clone(), t)))
        .collect()
}

/// The history a previous leader wrote into `status.json`, so that cooldowns and back-offs
/// survive a restart or a failover. Unknown or unreadable values are skipped.
pub fn history_of(status_json: &str) -> BTreeMap<String, PoolHistory> {
    let Ok(s) = serde_json::from_str::<Status>(status_json) else {
        return BTreeMap::new();
    };
    let t = |v: &Option<String>| v.as_deref().and_then(|s| Time::parse_rfc3339(s).ok());
    s.pools
        .iter()
        .map(|p| {
            (
                p.name.clone(),
                PoolHistory {
                    last_scale_up: t(&p.last_scale_up),
                    last_scale_down: t(&p.last_scale_down),
                    last_scale_down_failure: t(&p.last_scale_down_failure),
                },
            )
        })
        .collect()
}

pub struct StatusInput<'a> {
    pub now: Time,
    pub leader: &'a str,
    pub dry_run: bool,
    pub policy_valid: bool,
    pub policy: &'a Policy,
    pub nodes: &'a [&'a Node],
    pub in_flight: &'a [InFlight],
    /// GPUs of one instance of a type (0 when unknown).
    pub gpus_of: &'a dyn Fn(&str) -> i64,
    pub plan: &'a Plan,
    pub history: &'a BTreeMap<String, PoolHistory>,
    pub unavailable: &'a BTreeMap<OfferingKey, Time>,
    pub given_up: &'a crate::hash::HashMap<String, Time>,
    pub replacements: &'a super::replace::Replacements,
    /// Drifted or expired nodes → as the status shows them.
    pub lifecycle: &'a BTreeMap<String, String>,
}

pub fn build(i: &StatusInput) -> Status {
    let mut pools = Vec::new();
    for p in &i.policy.pools {
        let mut s = PoolStatus {
            name: p.name.clone(),
            ..Default::default()
        };
        let mut down_gpus: i64 = 0;
        let down_nodes: Vec<&str> = i
            .plan
            .scale_downs
            .iter()
            .filter(|d| d.pool == p.name)
            .map(|d| d.node.as_str())
            .collect();
        for n in i.nodes.iter().filter(|n| n.pool() == Some(p.name.as_str())) {
            let gpus = match n.advertised_gpus() {
                0 => n.instance_type().map_or(0, |t| (i.gpus_of)(t)),
                g => g,
            };
            // GPU sums saturate: a Node reporting an absurd count must not wrap them.
            if down_nodes.contains(&n.name.as_str()) {
                down_gpus = down_gpus.saturating_add(gpus);
            }
            if n.is_being_deleted() {
                s.draining_nodes += 1;
            } else if n.ready && n.advertised_gpus() > 0 {
                s.ready_nodes += 1;
                s.ready_gpus = s.ready_gpus.saturating_add(gpus);
            } else {
                s.in_flight_nodes += 1;
                s.in_flight_gpus = s.in_flight_gpus.saturating_add(gpus);
            }
        }
        for f in i.in_flight.iter().filter(|f| f.pool == p.name) {
            s.in_flight_nodes += f.count;
            s.in_flight_gpus = s.in_flight_gpus.saturating_add(
                i64::from(f.count).saturating_mul((i.gpus_of)(&f.offering.instance_type)),
            );
        }
        let ups = i.plan.scale_ups.iter().filter(|u| u.pool == p.name);
        let up: u32 = ups.clone().map(|u| u.count).sum();
        let up_gpus: i64 = ups
            .map(|u| {
                i64::from(u.count)
                    * u.offerings
                        .first()
                        .map_or(0, |o| (i.gpus_of)(&o.instance_type))
            })
            .sum();
        let down = down_nodes.len() as u32;
        s.target_nodes = (s.ready_nodes + s.in_flight_nodes + up).saturating_sub(down);
        s.target_gpus = s
            .ready_gpus
            .saturating_add(s.in_flight_gpus)
            .saturating_add(up_gpus)
            .saturating_sub(down_gpus)
            .max(0);
        if let Some(h) = i.history.get(&p.name) {
            s.last_scale_up = h.last_scale_up.map(Time::to_rfc3339);
            s.last_scale_down = h.last_scale_down.map(Time::to_rfc3339);
            s.last_scale_down_failure = h.last_scale_down_failure.map(Time::to_rfc3339);
            s.cooldown_until = h
                .last_scale_up
                .map(|t| t + p.scale_down.cooldown_after_scale_up)
                .filter(|t| *t > i.now)
                .map(Time::to_rfc3339);
        }
        pools.push(s);
    }
    Status {
        time: i.now.to_rfc3339(),
        leader: i.leader.to_string(),
        dry_run: i.dry_run,
        policy_valid: i.policy_valid,
        // Real pods only: a CapacityBuffer's chunks are not pods that wait.
        pending_gpu_pods: {
            let real = |k: &str| !crate::buffer::is_virtual_key(k);
            i.plan
                .scale_ups
                .iter()
                .flat_map(|u| &u.pods)
                .filter(|p| real(p.as_str()))
                .count()
                + i.plan.unschedulable.iter().filter(|u| real(&u.pod)).count()
                + i.plan
                    .existing_capacity
                    .iter()
                    .filter(|p| real(&p.pod))
                    .count()
        },
        pools,
        unavailable_offerings: i
            .unavailable
            .iter()
            .filter(|(_, until)| **until > i.now)
            .map(|(k, until)| (k.to_string(), until.to_rfc3339()))
            .collect(),
        given_up_launches: i
            .given_up
            .iter()
            .map(|(id, at)| (id.clone(), at.to_rfc3339()))
            .collect(),
        unhealthy_nodes: i
            .replacements
            .unhealthy_nodes()
            .filter(|(n, _, _)| !i.replacements.replacing.contains_key(*n))
            .map(|(n, since, what)| {
                (
                    n.to_string(),
                    format!("{what} since {}", since.to_rfc3339()),
                )
            })
            .collect(),
        replacing_nodes: i
            .replacements
            .replacing
            .iter()
            .map(|(n, r)| (n.clone(), format!("{}: {}", r.cause.as_str(), r.why)))
            .collect(),
        orphans: BTreeMap::new(),
        launched_unlisted: BTreeMap::new(),
        launching: BTreeMap::new(),
        drifted_nodes: i.lifecycle.clone(),
    }
}

/// The human-readable form.
pub fn to_text(s: &Status) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "gpu-node-autoscaler status at {} (leader {}{}){}",
        s.time,
        s.leader,
        if s.dry_run { ", DRY RUN" } else { "" },
        if s.policy_valid {
            ""
        } else {
            "\nWARNING: the latest policy is invalid; the last good one is in force"
        }
    );
    let _ = writeln!(out, "Pending GPU pods: {}\n", s.pending_gpu_pods);
    let _ = writeln!(
        out,
        "{:<20} {:>6} {:>6} {:>9} {:>7} {:>7} {:>8} {:>9}  {:<20} {:<20} COOLDOWN UNTIL",
        "POOL",
        "READY",
        "GPUS",
        "IN-FLIGHT",
        "(GPUS)",
        "TARGET",
        "(GPUS)",
        "DRAINING",
        "LAST SCALE-UP",
        "LAST SCALE-DOWN"
    );
    for p in &s.pools {
        let _ = writeln!(
            out,
            "{:<20} {:>6} {:>6} {:>9} {:>7} {:>7} {:>8} {:>9}  {:<20} {:<20} {}",
            p.name,
            p.ready_nodes,
            p.ready_gpus,
            p.in_flight_nodes,
            p.in_flight_gpus,
            p.target_nodes,
            p.target_gpus,
            p.draining_nodes,
            p.last_scale_up.as_deref().unwrap_or("-"),
            p.last_scale_down.as_deref().unwrap_or("-"),
            p.cooldown_until.as_deref().unwrap_or("-"),
        );
    }
    if !s.replacing_nodes.is_empty() {
        let _ = writeln!(out, "\nNodes being replaced:");
        for (n, why) in &s.replacing_nodes {
            let _ = writeln!(out, "  {n}: {why}");
        }
    }
    if !s.drifted_nodes.is_empty() {
        let _ = writeln!(out, "\nNodes drifted or expired:");
        for (n, what) in &s.drifted_nodes {
            let _ = writeln!(out, "  {n}: {what}");
        }
    }
    if !s.unhealthy_nodes.is_empty() {
        let _ = writeln!(out, "\nNodes seen unhealthy (within their grace period):");
        for (n, what) in &s.unhealthy_nodes {
            let _ = writeln!(out, "  {n}: {what}");
        }
    }
    if !s.orphans.is_empty() {
        let _ = writeln!(out, "\nOrphans (pool no longer in the policy):");
        for (i, o) in &s.orphans {
            let _ = writeln!(
                out,
                "  {i}: pool {}, {}",
                o.pool,
                o.node
                    .as_deref()
                    .map_or("no Node".into(), |n| format!("node {n}"))
            );
        }
    }
    if !s.unavailable_offerings.is_empty() {
        let _ = writeln!(out, "\nUnavailable offerings (insufficient capacity):");
        for (k, until) in &s.unavailable_offerings {
            let _ = writeln!(out, "  {k} until {until}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::NodeBuilder;
    use crate::model::labels;
    use crate::policy::parse_policy;
    use gpu_node_autoscaler_provider::CapacityType;

    /// What a pass knows besides the nodes and the launches in flight.
    #[derive(Default)]
    struct Known {
        history: BTreeMap<String, PoolHistory>,
        unavailable: BTreeMap<OfferingKey, Time>,
        given_up: crate::hash::HashMap<String, Time>,
    }

    /// The status at 200 s under `policy` (g5.xlarge: one GPU), with nothing planned.
    fn status_of(policy: &str, nodes: &[&Node], in_flight: &[InFlight], known: &Known) -> Status {
        let policy = parse_policy(policy, "p.yaml").unwrap();
        build(&StatusInput {
            now: Time::from_secs(200),
            leader: "r1",
            dry_run: false,
            policy_valid: true,
            policy: &policy,
            nodes,
            in_flight,
            gpus_of: &|t| i64::from(t == "g5.xlarge"),
            plan: &Plan::default(),
            history: &known.history,
            unavailable: &known.unavailable,
            given_up: &known.given_up,
            replacements: &Default::default(),
            lifecycle: &BTreeMap::new(),
        })
    }

    /// A node of pool `a` advertising `gpus`.
    fn node_of_a(name: &str, gpus: i64) -> Node {
        NodeBuilder::new(name)
            .label(labels::POOL, "a")
            .gpus(gpus)
            .build()
    }

    #[test]
    fn pools_count_ready_in_flight_and_target() {
        let ready = node_of_a("n1", 1);
        let booting = NodeBuilder::new("n2").label(labels::POOL, "a").build();
        let nodes = [&ready, &booting];
        let flights = [InFlight {
            launch_id: "L".into(),
            pool: "a".into(),
            offering: OfferingKey {
                instance_type: "g5.xlarge".into(),
                zone: "z".into(),
                capacity_type: CapacityType::Spot,
            },
            count: 2,
            launched_at: Time(0),
        }];
        let mut known = Known::default();
        known.history.insert(
            "a".to_string(),
            PoolHistory {
                last_scale_up: Some(Time::from_secs(100)),
                last_scale_down: None,
                last_scale_down_failure: Some(Time::from_secs(150)),
            },
        );
        known
            .unavailable
            .insert(flights[0].offering.clone(), Time::from_secs(400));
        known
            .given_up
            .insert("a-123".to_string(), Time::from_secs(160));
        let s = status_of(
            "clusterName: c\nzones: [z]\npools:\n- name: a\n  instanceTypes: [g5.xlarge]\n  maxNodes: 5\n  scaleDown: {cooldownAfterScaleUp: 10m}\n",
            &nodes,
            &flights,
            &known,
        );
        let history = &known.history;
        let p = &s.pools[0];
        assert_eq!((p.ready_nodes, p.ready_gpus, p.in_flight_nodes), (1, 1, 3));
        assert_eq!(p.target_nodes, 4);
        // The booting node has no instance-type label in this fixture: its GPUs are unknown.
        assert_eq!((p.in_flight_gpus, p.target_gpus), (2, 3));
        assert_eq!(p.cooldown_until.as_deref(), Some("1970-01-01T00:11:40Z"));
        assert_eq!(s.unavailable_offerings.len(), 1);
        let text = to_text(&s);
        assert!(
            text.contains("g5.xlarge/z/spot until 1970-01-01T00:06:40Z"),
            "{text}"
        );
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["pools"][0]["inFlightNodes"], 3);
        // What a new leader reads back.
        let back = history_of(&json.to_string());
        assert_eq!(back["a"], history["a"]);
        assert_eq!(
            given_up_of(&json.to_string()),
            [("a-123".to_string(), Time::from_secs(160))]
        );
        assert!(history_of("not json").is_empty());
    }

    #[test]
    fn overrun_a_node_reporting_i64_max_gpus_saturates_the_pools_gpu_figures() {
        let (absurd, other) = (node_of_a("n1", i64::MAX), node_of_a("n2", 1));
        let s = status_of(
            "zones: [z]\npools:\n- name: a\n  instanceTypes: [g5.xlarge]\n  maxNodes: 5\n",
            &[&absurd, &other],
            &[],
            &Known::default(),
        );
        let p = &s.pools[0];
        assert_eq!(
            (p.ready_nodes, p.ready_gpus, p.target_gpus),
            (2, i64::MAX, i64::MAX)
        );
    }
}
