//! Reading a pool's cloud groups again while its policy stays in force (an Auto Scaling group
//! tagged for discovery after start, a group's `node-template` tags, instance types, zones or
//! sizes changed): when a read is due, how the templates just read replace the last ones, and
//! what changed, for the log and Events. Pure: the controller reads the cloud on a period and
//! applies [`reread`] to the policy as parsed (its last good one).
//!
//! A group that is no longer found keeps its last template (its pool is still planned with it,
//! and nothing of it is terminated for that): it is reported, not forgotten, until the policy is
//! applied again.

use std::collections::{BTreeMap, BTreeSet};

use gpu_node_autoscaler_provider::{Catalog, GroupTemplate, Offering};

use crate::policy::Policy;

/// What changed in one group of a pool since the last read.
#[derive(Clone, Debug, PartialEq)]
pub enum GroupChange {
    /// A group read for the first time (discovered after start).
    Added { pool: String, group: String },
    /// A group whose template changed: what changed, for people (`labels`, `taints`, ...).
    Changed {
        pool: String,
        group: String,
        what: Vec<&'static str>,
    },
    /// A group no longer found: its last template is kept.
    Gone { pool: String, group: String },
    /// An instance type of a group that no offering of the catalog prices: it is not planned.
    Unpriced {
        pool: String,
        group: String,
        instance_type: String,
    },
}

impl GroupChange {
    /// Whether it is worth a warning (a group gone, an instance type not planned).
    pub fn is_warning(&self) -> bool {
        matches!(
            self,
            GroupChange::Gone { .. } | GroupChange::Unpriced { .. }
        )
    }

    /// The Event's reason.
    pub fn reason(&self) -> &'static str {
        match self {
            GroupChange::Added { .. } => "CloudGroupFound",
            GroupChange::Changed { .. } => "CloudGroupChanged",
            GroupChange::Gone { .. } => "CloudGroupGone",
            GroupChange::Unpriced { .. } => "CloudGroupTypeUnpriced",
        }
    }

    /// One line for the log and the Event.
    pub fn message(&self) -> String {
        match self {
            GroupChange::Added { pool, group } => {
                format!("pool {pool}: group {group} found: planned from its template from now on")
            }
            GroupChange::Changed { pool, group, what } => format!(
                "pool {pool}: group {group} changed ({}): planned from its new template",
                what.join(", ")
            ),
            GroupChange::Gone { pool, group } => format!(
                "pool {pool}: group {group} is no longer found: its last template is kept until \
                 the policy is applied again, and nothing of it is terminated for that"
            ),
            GroupChange::Unpriced {
                pool,
                group,
                instance_type,
            } => format!(
                "pool {pool}: group {group} launches instance type {instance_type}, which has no \
                 price (neither in the catalog nor in the pool's `prices`): it is not planned; \
                 set prices.{instance_type}.onDemand in the pool"
            ),
        }
    }
}

/// The groups in force: each pool's templates (those no longer found kept last), and which of
/// them are no longer found (reported once).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Groups {
    pub templates: BTreeMap<String, Vec<GroupTemplate>>,
    /// `(pool, group)` of the groups no longer found.
    pub gone: BTreeSet<(String, String)>,
}

/// The outcome of a read: the policy to plan with, the catalog with the offerings of groups
/// found since, the groups in force (to compare the next read with) and what changed.
#[derive(Clone, Debug)]
pub struct Reread {
    pub policy: Policy,
    pub catalog: Catalog,
    pub groups: Groups,
    pub changes: Vec<GroupChange>,
}

/// The fields of a template that differ from another's, for people.
fn differences(old: &GroupTemplate, new: &GroupTemplate) -> Vec<&'static str> {
    let mut out = Vec::new();
    if old.instance_types != new.instance_types {
        out.push("instance types");
    }
    if old.zones != new.zones {
        out.push("zones");
    }
    if old.capacity_type != new.capacity_type {
        out.push("capacity type");
    }
    if old.labels != new.labels {
        out.push("labels");
    }
    if old.taints != new.taints {
        out.push("taints");
    }
    if old.resources != new.resources {
        out.push("resources");
    }
    out
}

/// Applies a read of the cloud's groups: `parsed` is the policy as parsed (never one already
/// merged with templates, whose zones and capacity types were narrowed by them), `last` the
/// groups in force ([`Groups::default`] for the first read), `fresh` what was just read (pool → its groups in its order of
/// preference); `catalog` is the one in force and `fresh_catalog` what the provider offers now.
///
/// - A group in `fresh` replaces its last template (reported as added, found again or changed);
///   a group of `last` missing from `fresh` is kept after the fresh ones (reported gone, once).
///   A pool missing from `fresh` keeps its last templates unreported.
/// - The catalog gains the offerings and instance types of `fresh_catalog` it lacks (available:
///   availability is learnt by failing); nothing is taken out of it, prices are left to the
///   price refresh.
/// - An instance type of an added or changed group that no offering prices is reported once.
pub fn reread(
    parsed: &Policy,
    last: &Groups,
    fresh: &BTreeMap<String, Vec<GroupTemplate>>,
    catalog: &Catalog,
    fresh_catalog: &Catalog,
) -> Reread {
    let mut templates = last.templates.clone();
    let mut gone = last.gone.clone();
    let mut changes = Vec::new();
    let mut touched: Vec<(String, GroupTemplate)> = Vec::new();
    for (pool, groups) in fresh {
        let before = last.templates.get(pool).cloned().unwrap_or_default();
        let mut now = groups.clone();
        for g in groups {
            let back = gone.remove(&(pool.clone(), g.group.clone()));
            match before.iter().find(|b| b.group == g.group) {
                Some(_) if back => {
                    changes.push(GroupChange::Added {
                        pool: pool.clone(),
                        group: g.group.clone(),
                    });
                    touched.push((pool.clone(), g.clone()));
                }
                None => {
                    changes.push(GroupChange::Added {
                        pool: pool.clone(),
                        group: g.group.clone(),
                    });
                    touched.push((pool.clone(), g.clone()));
                }
                Some(b) => {
                    let what = differences(b, g);
                    if !what.is_empty() {
                        changes.push(GroupChange::Changed {
                            pool: pool.clone(),
                            group: g.group.clone(),
                            what,
                        });
                        touched.push((pool.clone(), g.clone()));
                    }
                }
            }
        }
        for b in &before {
            if !groups.iter().any(|g| g.group == b.group) {
                if gone.insert((pool.clone(), b.group.clone())) {
                    changes.push(GroupChange::Gone {
                        pool: pool.clone(),
                        group: b.group.clone(),
                    });
                }
                now.push(b.clone());
            }
        }
        templates.insert(pool.clone(), now);
    }

    let mut merged = catalog.clone();
    for t in &fresh_catalog.instance_types {
        if merged.instance_type(&t.name).is_none() {
            merged.instance_types.push(t.clone());
        }
    }
    let known: BTreeSet<_> = merged.offerings.iter().map(|o| o.key.clone()).collect();
    for o in &fresh_catalog.offerings {
        if !known.contains(&o.key) && o.price_per_hour.is_finite() && o.price_per_hour > 0.0 {
            merged.offerings.push(Offering {
                key: o.key.clone(),
                price_per_hour: o.price_per_hour,
                available: true,
            });
        }
    }

    let priced: BTreeSet<&str> = merged
        .offerings
        .iter()
        .map(|o| o.key.instance_type.as_str())
        .collect();
    for (pool, g) in &touched {
        for t in &g.instance_types {
            if !priced.contains(t.as_str()) {
                changes.push(GroupChange::Unpriced {
                    pool: pool.clone(),
                    group: g.group.clone(),
                    instance_type: t.clone(),
                });
            }
        }
    }

    Reread {
        policy: parsed.with_cloud_templates(&templates),
        catalog: merged,
        groups: Groups { templates, gone },
        changes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::templates::Templates;
    use gpu_node_autoscaler_provider::{CapacityType, OfferingKey};

    fn group(name: &str, t: &str, zone: &str, label: &str) -> GroupTemplate {
        GroupTemplate {
            group: name.into(),
            instance_types: vec![t.into()],
            zones: vec![zone.into()],
            capacity_type: Some(CapacityType::OnDemand),
            labels: [("team".to_string(), label.to_string())].into(),
            taints: Vec::new(),
            resources: BTreeMap::new(),
        }
    }

    fn offering(t: &str, zone: &str, price: f64) -> Offering {
        Offering {
            key: OfferingKey {
                instance_type: t.into(),
                zone: zone.into(),
                capacity_type: CapacityType::OnDemand,
            },
            price_per_hour: price,
            available: false,
        }
    }

    /// What the planner would launch for the pool: (instance type, zone, label `team`).
    fn planned(r: &Reread) -> Vec<(String, String, String)> {
        let t = Templates::new(&r.policy, &r.catalog);
        assert!(t.errors.is_empty(), "{:?}", t.errors);
        let mut out: Vec<_> = t
            .for_snapshot(&Default::default(), crate::model::Time(0))
            .iter()
            .flat_map(|t| {
                t.offerings.iter().map(|o| {
                    (
                        o.key.instance_type.clone(),
                        o.key.zone.clone(),
                        o.labels.get("team").cloned().unwrap_or_default(),
                    )
                })
            })
            .collect();
        out.sort();
        out.dedup();
        out
    }

    #[test]
    fn a_reread_plans_a_group_found_after_start_and_a_changed_one_anew_and_keeps_one_gone() {
        let parsed = crate::policy::parse_policy_with(
            "pools:\n  - name: tagged\n    provider: aws\n    maxNodes: 4\n    \
             aws: {autoScalingGroups: {autoDiscovery: {}}}\n",
            "policy.yaml",
            &[&gpu_node_autoscaler_aws::settings::POLICY],
        )
        .unwrap();
        let types = crate::catalog::parse_csv(crate::catalog::BUILTIN_AWS, "builtin").unwrap();
        let a = group("a10g-a", "g5.xlarge", "us-east-1a", "one");
        let first: BTreeMap<String, Vec<GroupTemplate>> =
            [("tagged".to_string(), vec![a.clone()])].into();
        let start_catalog = Catalog {
            instance_types: types.clone(),
            offerings: vec![offering("g5.xlarge", "us-east-1a", 1.006)],
        };
        let start = reread(
            &parsed,
            &Groups::default(),
            &first,
            &Catalog::default(),
            &start_catalog,
        );
        assert_eq!(
            start.changes,
            [GroupChange::Added {
                pool: "tagged".into(),
                group: "a10g-a".into()
            }]
        );
        assert_eq!(
            planned(&start),
            [("g5.xlarge".into(), "us-east-1a".into(), "one".into())]
        );

        // Later: a group tagged for discovery (another type and zone), the first one's label
        // changed, and a group whose type nothing prices.
        let mut a2 = a.clone();
        a2.labels.insert("team".into(), "two".into());
        let l4 = group("l4-b", "g6.xlarge", "us-east-1b", "l4");
        let odd = group("odd-b", "x9.unpriced", "us-east-1b", "odd");
        let fresh: BTreeMap<String, Vec<GroupTemplate>> =
            [("tagged".to_string(), vec![a2, l4, odd])].into();
        let fresh_catalog = Catalog {
            instance_types: types.clone(),
            offerings: vec![
                offering("g5.xlarge", "us-east-1a", 1.006),
                offering("g6.xlarge", "us-east-1b", 0.805),
            ],
        };
        let later = reread(
            &parsed,
            &start.groups,
            &fresh,
            &start.catalog,
            &fresh_catalog,
        );
        assert_eq!(
            later.changes,
            [
                GroupChange::Changed {
                    pool: "tagged".into(),
                    group: "a10g-a".into(),
                    what: vec!["labels"],
                },
                GroupChange::Added {
                    pool: "tagged".into(),
                    group: "l4-b".into()
                },
                GroupChange::Added {
                    pool: "tagged".into(),
                    group: "odd-b".into()
                },
                GroupChange::Unpriced {
                    pool: "tagged".into(),
                    group: "odd-b".into(),
                    instance_type: "x9.unpriced".into(),
                },
            ]
        );
        assert!(later.changes[3]
            .message()
            .contains("prices.x9.unpriced.onDemand"));
        assert!(later.catalog.offerings.iter().all(|o| o.available));
        assert_eq!(
            planned(&later),
            [
                ("g5.xlarge".into(), "us-east-1a".into(), "two".into()),
                ("g6.xlarge".into(), "us-east-1b".into(), "l4".into()),
            ]
        );
        assert_eq!(
            later.policy.pools[0].zones,
            ["us-east-1a", "us-east-1b"],
            "from the policy as parsed, not narrowed by the first read"
        );

        // The first group gone: kept, reported, still planned; the same read again is quiet.
        let gone: BTreeMap<String, Vec<GroupTemplate>> = [(
            "tagged".to_string(),
            later.groups.templates["tagged"][1..].to_vec(),
        )]
        .into();
        let after = reread(
            &parsed,
            &later.groups,
            &gone,
            &later.catalog,
            &Catalog::default(),
        );
        assert_eq!(
            after.changes,
            [GroupChange::Gone {
                pool: "tagged".into(),
                group: "a10g-a".into()
            }]
        );
        assert!(after.changes[0].is_warning());
        assert_eq!(planned(&after), planned(&later));
        let again = reread(
            &parsed,
            &after.groups,
            &gone,
            &after.catalog,
            &Catalog::default(),
        );
        assert!(again.changes.is_empty(), "{:?}", again.changes);
        assert_eq!(again.policy, after.policy);
        // Found again: reported, planned from what it says now.
        let back = reread(
            &parsed,
            &again.groups,
            &later.groups.templates,
            &again.catalog,
            &Catalog::default(),
        );
        assert_eq!(
            back.changes,
            [GroupChange::Added {
                pool: "tagged".into(),
                group: "a10g-a".into()
            }]
        );
        assert!(back.groups.gone.is_empty());
        assert_eq!(planned(&back), planned(&later));
    }
}
