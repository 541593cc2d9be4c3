//! Our strategy in the simulator: the same decision loop `run` uses — batching window, planner,
//! launch through the fallback list, insufficient-capacity cache, drains — on the virtual clock.

use std::collections::{BTreeMap, BTreeSet};

use gpu_node_autoscaler_provider::{LaunchRequest, OfferingKey, ProviderError};

use crate::model::snapshot::PoolState;
use crate::model::{labels, Time};
use crate::plan;
use crate::policy::Policy;

use super::engine::{Strategy, World};
use super::{earliest, Batch, Ms, SimInput, MINUTE, SECOND};

/// How often a controller with nothing to do looks again (periodic resync).
const RESYNC: Ms = 10 * SECOND;

pub struct Ours {
    policy: Policy,
    templates: plan::Templates,
    /// Offerings that failed for lack of capacity, unavailable until then.
    ice: BTreeMap<OfferingKey, Time>,
    pools: BTreeMap<String, PoolState>,
    batch: Batch,
    next: Option<Ms>,
    launches: u64,
}

impl Ours {
    pub fn new(input: &SimInput) -> Ours {
        // The planner learns availability by failing, as against a real cloud.
        let mut catalog = input.catalog.clone();
        for o in &mut catalog.offerings {
            o.available = true;
        }
        Ours {
            policy: input.policy.clone(),
            templates: plan::Templates::new(&input.policy, &catalog),
            ice: BTreeMap::new(),
            pools: BTreeMap::new(),
            batch: Batch::default(),
            next: None,
            launches: 0,
        }
    }

    /// When the plan could change without any new event: an unneeded node's delay or a pool's
    /// cooldown running out, an insufficient-capacity entry expiring while pods wait.
    fn next_interesting(&self, p: &plan::Plan, world: &World, now: Ms) -> Option<Ms> {
        let mut t: Option<Ms> = None;
        let mut consider = |x: Ms| {
            if x > now {
                t = Some(t.map_or(x, |y: Ms| y.min(x)));
            }
        };
        let mut pool_of: BTreeMap<&str, &str> = BTreeMap::new();
        let mut newest: BTreeMap<&str, Time> = BTreeMap::new();
        for n in world.live_nodes() {
            pool_of.insert(n.node.name.as_str(), n.pool.as_str());
            let e = newest.entry(n.pool.as_str()).or_insert(n.node.created);
            *e = (*e).max(n.node.created);
        }
        for u in &p.unneeded {
            let (Some(pool), Ok(since)) = (
                pool_of
                    .get(u.node.as_str())
                    .and_then(|pn| self.policy.pool(pn)),
                Time::parse_rfc3339(&u.since),
            ) else {
                continue;
            };
            consider((since + pool.scale_down.unneeded_time).0);
            // The cooldown, derived from the newest node of the pool.
            if let Some(t) = newest.get(pool.name.as_str()) {
                consider((*t + pool.scale_down.cooldown_after_scale_up).0);
            }
            if let Some(f) = self
                .pools
                .get(&pool.name)
                .and_then(|s| s.last_scale_down_failure)
            {
                consider((f + pool.scale_down.backoff_after_failure).0);
            }
        }
        if !p.unschedulable.is_empty() {
            for until in self.ice.values() {
                consider(until.0);
            }
        }
        t
    }
}

impl Strategy for Ours {
    fn name(&self) -> &'static str {
        "gpu-node-autoscaler"
    }

    fn pods_unschedulable(&mut self, now: Ms) {
        self.batch.add(now);
    }

    fn cluster_changed(&mut self, now: Ms) {
        // The periodic resync notices within one period.
        let t = now + RESYNC;
        self.next = Some(self.next.map_or(t, |n| n.min(t)));
    }

    fn next_run(&self) -> Option<Ms> {
        earliest(
            self.batch.deadline(
                self.policy.batching.idle.as_millis() as Ms,
                self.policy.batching.max.as_millis() as Ms,
            ),
            self.next,
        )
    }

    fn run(&mut self, world: &mut World) {
        let now = world.now;
        self.batch.clear();
        self.ice.retain(|_, until| until.0 > now);
        let mut snapshot = world.snapshot();
        snapshot.unavailable = self.ice.clone();
        snapshot.pools = self.pools.clone();
        let p = plan::plan_with(&snapshot, &self.templates, &self.policy, Time(now));
        let ttl = self.policy.insufficient_capacity_ttl;
        let mut follow_up = false;
        // A gang's scale-ups (one per instance type) stand or fall together.
        let mut gang_launched: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        let mut gang_short: BTreeSet<&str> = BTreeSet::new();
        for su in &p.scale_ups {
            self.launches += 1;
            let req = LaunchRequest {
                launch_id: format!("{}-{}", su.pool, self.launches),
                pool: su.pool.clone(),
                count: su.count,
                offerings: su.offerings.iter().map(|o| o.key()).collect(),
                tags: BTreeMap::new(),
            };
            let launched = match world.launch(&req) {
                Ok(res) => {
                    for (key, err) in &res.failures {
                        if matches!(err, ProviderError::InsufficientCapacity { .. }) {
                            self.ice.insert(key.clone(), Time(now) + ttl);
                        }
                    }
                    if su.gang.is_none() && !res.launched.is_empty() {
                        self.pools.entry(su.pool.clone()).or_default().last_scale_up =
                            Some(Time(now));
                    }
                    res.launched.into_iter().map(|i| i.id).collect()
                }
                Err(_) => Vec::new(),
            };
            if (launched.len() as u32) < su.count {
                follow_up = true;
                if let Some(g) = &su.gang {
                    gang_short.insert(g.as_str());
                }
            }
            if let Some(g) = &su.gang {
                gang_launched
                    .entry(g.as_str())
                    .or_default()
                    .extend(launched);
            }
        }
        for (g, ids) in gang_launched {
            if gang_short.contains(g) {
                // All or nothing: give back a gang's partial launch and plan it again.
                for id in ids {
                    world.terminate_instance(&id);
                }
            } else if !ids.is_empty() {
                for su in p.scale_ups.iter().filter(|s| s.gang.as_deref() == Some(g)) {
                    self.pools.entry(su.pool.clone()).or_default().last_scale_up = Some(Time(now));
                }
            }
        }
        for d in &p.scale_downs {
            world.drain_and_remove(&d.node);
        }
        // Keep "unneeded since" on the nodes.
        let unneeded: BTreeSet<&str> = p.unneeded.iter().map(|u| u.node.as_str()).collect();
        for u in &p.unneeded {
            world.annotate(&u.node, labels::UNNEEDED_SINCE, Some(&u.since));
        }
        let stale: Vec<String> = world
            .live_nodes()
            .filter(|n| n.node.annotations.contains_key(labels::UNNEEDED_SINCE))
            .filter(|n| !unneeded.contains(n.node.name.as_str()))
            .map(|n| n.node.name.clone())
            .collect();
        for n in stale {
            world.annotate(&n, labels::UNNEEDED_SINCE, None);
        }
        // Launches that never became nodes in time are given up and their offering avoided.
        let max = self.policy.max_node_provision_time.as_millis() as Ms;
        for (id, offering, launched) in world.unregistered() {
            if now - launched > max {
                world.terminate_instance(&id);
                self.ice.insert(offering, Time(now) + ttl);
            }
        }
        let waiting = p.unschedulable.iter().any(|u| !u.permanent);
        let pending = waiting || !p.scale_ups.is_empty() || follow_up;
        let mut next = self.next_interesting(&p, world, now);
        if pending || !world.unregistered().is_empty() {
            next = Some(next.map_or(now + RESYNC, |t| t.min(now + RESYNC)));
        }
        // Resyncs that cannot change the decision are skipped; an idle cluster is looked at
        // every 10 minutes.
        self.next = Some(next.unwrap_or(now + 10 * MINUTE));
    }
}
