//! Auto Scaling groups in the in-memory cloud: a scenario's `autoScalingGroups`, the pools whose
//! `aws.autoScalingGroups` name or discover them, and what a launch or a termination does to
//! them. The rules are the AWS provider's own ([`gpu_node_autoscaler_aws::groups`]: which groups
//! a launch grows and by how much, when an instance may leave its group, what a group's template
//! says), so that a pool of groups runs the same decision core as a `CreateFleet` pool and only
//! the cloud's side differs:
//!
//! - a launch raises the desired capacity of the groups [`asg::allocate`] picks, in the request's
//!   order of offerings and the pool's order of groups; what a group could not launch (the
//!   offering short, the account's quota) is given back at once and the group is skipped for the
//!   rest of the launch, as a failed scaling activity;
//! - an instance leaves its group with its desired capacity decremented
//!   (`TerminateInstanceInAutoScalingGroup`), refused for a group at its minimum size;
//! - an instance the cloud takes back (a spot interruption) leaves its group too: the simulated
//!   group does not launch a replacement on its own, as a real one would.

use std::collections::{BTreeMap, BTreeSet};

use gpu_node_autoscaler_aws::groups::{self as asg, Group, GroupInstance};
use gpu_node_autoscaler_aws::settings::{cluster_autoscaler_tags, AutoScalingGroups};
use gpu_node_autoscaler_core::policy::Policy;
use gpu_node_autoscaler_memory::MemoryProvider;
use gpu_node_autoscaler_provider::{
    GroupTemplate, Instance, LaunchRequest, LaunchResult, ProviderError,
};

/// The account's Auto Scaling groups and the pools they back.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Groups {
    pub groups: Vec<Group>,
    /// Pool → its groups (indices into `groups`), in its order of preference.
    pub pools: BTreeMap<String, Vec<usize>>,
    /// Instances each launch id got, so that a launch repeated with its id launches no more.
    launched: BTreeMap<String, u32>,
    /// Instance id → its group.
    of_instance: BTreeMap<String, usize>,
    /// Scaling activities so far (each launches with an id of its own).
    activities: u64,
}

impl Groups {
    /// The groups, and each pool of `policy` backed by groups with those its section names (in
    /// that order) or discovers by their tags (spot groups first, then by name). Errors: a
    /// message per pool whose section does not read or names a group that does not exist, and
    /// a group two pools would scale, each with its path in the policy.
    pub fn new(groups: Vec<Group>, policy: &Policy) -> (Groups, Vec<(Vec<String>, String)>) {
        let mut out = Groups {
            groups,
            ..Groups::default()
        };
        let mut errors = Vec::new();
        let mut owner: BTreeMap<usize, String> = BTreeMap::new();
        for (pi, pool) in policy.pools.iter().enumerate() {
            if !pool.templates_from_cloud {
                continue;
            }
            let at = |rest: &[&str]| {
                let mut p = vec!["pools".to_string(), pi.to_string(), "aws".to_string()];
                p.extend(rest.iter().map(|s| s.to_string()));
                p
            };
            let section = pool.settings.clone().unwrap_or(serde_json::Value::Null);
            let settings =
                match gpu_node_autoscaler_aws::settings::AwsPoolSettings::from_section(&section) {
                    Ok(s) => s,
                    Err(e) => {
                        errors.push((at(&["autoScalingGroups"]), e.message));
                        continue;
                    }
                };
            let mut mine: Vec<usize> = Vec::new();
            match settings.auto_scaling_groups {
                Some(AutoScalingGroups::Named(names)) => {
                    for (j, n) in names.iter().enumerate() {
                        match out.groups.iter().position(|g| &g.name == n) {
                            Some(i) => mine.push(i),
                            None => errors.push((
                                at(&["autoScalingGroups", "names", &j.to_string()]),
                                format!(
                                    "no Auto Scaling group {n:?} in the scenario's \
                                     `autoScalingGroups`"
                                ),
                            )),
                        }
                    }
                }
                Some(AutoScalingGroups::Discovered(tags)) => {
                    let wanted = if tags.is_empty() {
                        cluster_autoscaler_tags(&policy.cluster_name)
                    } else {
                        tags
                    };
                    let mut found: Vec<Group> = out
                        .groups
                        .iter()
                        .filter(|g| asg::matches(&g.tags, &wanted))
                        .cloned()
                        .collect();
                    asg::order(&mut found, None);
                    mine.extend(
                        found
                            .iter()
                            .filter_map(|f| out.groups.iter().position(|g| g.name == f.name)),
                    );
                    if mine.is_empty() {
                        errors.push((
                            at(&["autoScalingGroups", "autoDiscovery"]),
                            "no Auto Scaling group of the scenario carries its tags".to_string(),
                        ));
                    }
                }
                None => continue,
            }
            for &i in &mine {
                if let Some(other) = owner.insert(i, pool.name.clone()) {
                    errors.push((
                        at(&["autoScalingGroups"]),
                        format!(
                            "Auto Scaling group {} is already scaled by pool {other}",
                            out.groups[i].name
                        ),
                    ));
                }
            }
            out.pools.insert(pool.name.clone(), mine);
        }
        (out, errors)
    }

    pub fn is_empty(&self) -> bool {
        self.pools.is_empty()
    }

    /// Whether `pool` is backed by groups.
    pub fn backs(&self, pool: &str) -> bool {
        self.pools.contains_key(pool)
    }

    /// What the cloud says of each pool's groups ([`CloudProvider::templates`]): their
    /// templates, in the pool's order, with only the instance types the pool lists, if it does.
    ///
    /// [`CloudProvider::templates`]: gpu_node_autoscaler_provider::CloudProvider::templates
    pub fn templates(&self, policy: &Policy) -> BTreeMap<String, Vec<GroupTemplate>> {
        self.pools
            .iter()
            .map(|(pool, idx)| {
                let types = policy
                    .pool(pool)
                    .and_then(|p| p.instance_types.clone())
                    .unwrap_or_default();
                let t = idx
                    .iter()
                    .map(|&i| asg::group_template(&self.groups[i], &types, None))
                    .collect();
                (pool.clone(), t)
            })
            .collect()
    }

    /// Grows the pool's groups for a launch (see the module's documentation): each step a
    /// launch of the cloud for the step's offering alone, its instances put in the group.
    pub fn launch(
        &mut self,
        cloud: &MemoryProvider,
        req: &LaunchRequest,
    ) -> Result<LaunchResult, ProviderError> {
        let idx = self.pools.get(&req.pool).cloned().unwrap_or_default();
        let got = self.launched.get(&req.launch_id).copied().unwrap_or(0);
        let mut remaining = req.count.saturating_sub(got);
        let mut result = LaunchResult::default();
        let mut skip: BTreeSet<String> = BTreeSet::new();
        let mut quota = false;
        for _round in 0..idx.len().max(1) {
            if remaining == 0 || quota {
                break;
            }
            let gs: Vec<Group> = idx.iter().map(|&i| self.groups[i].clone()).collect();
            let (steps, _) = asg::allocate(&gs, &req.offerings, remaining, &skip);
            if steps.is_empty() {
                break;
            }
            let mut failed_now = false;
            for step in steps {
                let gi = idx[step.group];
                // The group's desired capacity raised by the step, its activity launching it.
                self.groups[gi].desired += step.count;
                self.activities += 1;
                let seq = self.activities;
                let activity = LaunchRequest {
                    launch_id: format!("{}/{}/{seq}", req.launch_id, self.groups[gi].name),
                    pool: req.pool.clone(),
                    count: step.count,
                    offerings: vec![step.offering.clone()],
                    tags: req.tags.clone(),
                    reservations: Vec::new(),
                    // A group's activity launches what it can, like the group itself.
                    atomic: false,
                };
                let r = cloud.launch_now(&activity)?;
                let n = r.launched.len() as u32;
                for mut inst in r.launched {
                    inst.launch_id = req.launch_id.clone();
                    self.join(gi, &inst);
                    result.launched.push(inst);
                }
                remaining = remaining.saturating_sub(n);
                if n < step.count {
                    // The activity failed for the rest: given back, the group skipped.
                    self.groups[gi].desired -= step.count - n;
                    failed_now = true;
                    skip.insert(self.groups[gi].name.clone());
                    quota |= r
                        .failures
                        .iter()
                        .any(|(_, e)| matches!(e, ProviderError::QuotaExceeded { .. }));
                    result.failures.extend(r.failures);
                    if quota {
                        break;
                    }
                }
            }
            if !failed_now {
                break;
            }
        }
        *self.launched.entry(req.launch_id.clone()).or_insert(0) += result.launched.len() as u32;
        if remaining > 0 && !quota {
            // No group with room serves the rest.
            for o in &req.offerings {
                let failed = result.failures.iter().any(|(k, _)| k == o);
                let room = idx.iter().any(|&i| {
                    asg::serves(&self.groups[i], o) && asg::headroom(&self.groups[i]) > 0
                });
                if !failed && !room {
                    result.failures.push((
                        o.clone(),
                        ProviderError::InsufficientCapacity {
                            offering: o.clone(),
                        },
                    ));
                }
            }
        }
        Ok(result)
    }

    /// Puts an instance in group `gi`.
    pub fn join(&mut self, gi: usize, inst: &Instance) {
        self.groups[gi].instances.push(GroupInstance {
            id: inst.id.clone(),
            zone: inst.offering.zone.clone(),
            instance_type: inst.offering.instance_type.clone(),
            lifecycle: "InService".to_string(),
            protected_from_scale_in: false,
        });
        self.of_instance.insert(inst.id.clone(), gi);
    }

    /// Why the instance may not leave its group now (its group at its minimum size), if it is in
    /// one.
    pub fn refuse(&self, id: &str) -> Option<String> {
        let g = &self.groups[*self.of_instance.get(id)?];
        let i = g.instances.iter().find(|i| i.id == id)?;
        asg::refuse_termination(g, i)
    }

    /// The instance left its group: the group's desired capacity decremented.
    pub fn left(&mut self, id: &str) {
        if let Some(gi) = self.of_instance.remove(id) {
            let g = &mut self.groups[gi];
            g.instances.retain(|i| i.id != id);
            g.desired = g.desired.saturating_sub(1);
        }
    }
}
