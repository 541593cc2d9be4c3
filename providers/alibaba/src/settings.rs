//! A pool's `alibaba:` section of the scaling policy: its serde type and its validation, for the
//! core's policy parser (through [`POLICY`]) and the controller's provider factory.

use std::collections::BTreeMap;

use gpu_node_autoscaler_provider::policy::{
    decode_section, is_resource_id, FieldError, PoolFacts, PoolSection, ProviderPolicy, Value,
};
use gpu_node_autoscaler_provider::CapacityType;
use serde::Deserialize;

/// The provider's name in policies (`provider: alibaba`) and the key of its pool section.
pub const NAME: &str = "alibaba";

/// The Alibaba Cloud provider's part of the policy: `provider: alibaba` and the `alibaba:`
/// section.
pub static POLICY: AlibabaPolicy = AlibabaPolicy;

/// A pool's `alibaba:` section: the ESS scaling group(s) its nodes come from.
#[derive(Clone, Debug, PartialEq)]
pub struct AlibabaPoolSettings {
    /// The group scaled first (`asg-...`): a spot group when the pool's `capacityTypes` include
    /// `spot`, else an on-demand one.
    pub scaling_group_id: String,
    /// A second, on-demand group for what spot cannot deliver.
    pub on_demand_scaling_group_id: Option<String>,
    /// The spot group itself makes up for missing spot with on-demand instances.
    pub compensate_with_on_demand: bool,
    /// Zone → vSwitch id; every zone of the pool has one.
    pub vswitches: BTreeMap<String, String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawAlibabaPool {
    scaling_group_id: Option<String>,
    on_demand_scaling_group_id: Option<String>,
    compensate_with_on_demand: Option<bool>,
    #[serde(default)]
    v_switches: BTreeMap<String, String>,
}

impl AlibabaPoolSettings {
    /// The settings of a pool's `alibaba:` section that the policy parser accepted.
    pub fn from_section(section: &Value) -> Result<AlibabaPoolSettings, FieldError> {
        let a: RawAlibabaPool = decode_section(section).map_err(in_section)?;
        Ok(AlibabaPoolSettings {
            scaling_group_id: a.scaling_group_id.unwrap_or_default(),
            on_demand_scaling_group_id: a.on_demand_scaling_group_id,
            compensate_with_on_demand: a.compensate_with_on_demand.unwrap_or(false),
            vswitches: a.v_switches,
        })
    }
}

/// The path of an error inside the section, as a path inside the pool.
fn in_section(mut e: FieldError) -> FieldError {
    e.path.insert(0, NAME.into());
    e
}

/// The Alibaba Cloud provider's part of the policy.
#[derive(Clone, Copy, Debug)]
pub struct AlibabaPolicy;

impl ProviderPolicy for AlibabaPolicy {
    fn name(&self) -> &'static str {
        NAME
    }

    fn section(&self) -> Option<&'static str> {
        Some(NAME)
    }

    fn decode(&self, section: &Value) -> Result<(), FieldError> {
        decode_section::<RawAlibabaPool>(section).map(|_| ())
    }

    /// `asg-...` scaling groups that fit the pool's capacity types, a `vsw-...` for every zone.
    fn validate_pool(&self, section: Option<&Value>, pool: &PoolFacts<'_>) -> Vec<FieldError> {
        let mut errors = Vec::new();
        let Some(section) = section else {
            if pool.provider == NAME {
                errors.push(FieldError::at(
                    &[],
                    "`provider: alibaba` needs an `alibaba` section (scalingGroupId, vSwitches)",
                ));
            }
            return errors;
        };
        let a = match decode_section::<RawAlibabaPool>(section) {
            Ok(a) => a,
            Err(e) => return vec![in_section(e)],
        };
        let mut at = |rest: &[&str], message: String| {
            let mut p = vec![NAME];
            p.extend_from_slice(rest);
            errors.push(FieldError::at(&p, message));
        };
        let provider = pool.provider;
        if provider != NAME {
            at(
                &[],
                format!(
                    "`alibaba` settings need `provider: alibaba` (the pool's provider is {provider})"
                ),
            );
        }
        let spot = pool.capacity_types.contains(&CapacityType::Spot);
        let on_demand = pool.capacity_types.contains(&CapacityType::OnDemand);
        if pool.capacity_types.contains(&CapacityType::Reserved) {
            at(
                &[],
                "capacity type `reserved` is not supported by the alibaba provider (its \
                 scaling groups buy spot and on-demand)"
                    .to_string(),
            );
        }
        let group = a.scaling_group_id.unwrap_or_default();
        if group.is_empty() {
            at(
                &[],
                "missing `scalingGroupId` (the ESS scaling group, asg-...)".to_string(),
            );
        } else if !is_resource_id(&group, "asg-") {
            at(
                &["scalingGroupId"],
                format!("{group:?} is not a scaling group id (asg-...)"),
            );
        }
        if let Some(od) = &a.on_demand_scaling_group_id {
            if !is_resource_id(od, "asg-") {
                at(
                    &["onDemandScalingGroupId"],
                    format!("{od:?} is not a scaling group id (asg-...)"),
                );
            } else if *od == group {
                at(
                    &["onDemandScalingGroupId"],
                    "must differ from scalingGroupId".to_string(),
                );
            } else if !(spot && on_demand) {
                at(
                    &["onDemandScalingGroupId"],
                    "a second, on-demand group needs `capacityTypes` with both spot and on-demand"
                        .to_string(),
                );
            }
        }
        let compensate = a.compensate_with_on_demand.unwrap_or(false);
        if compensate && !(spot && on_demand) {
            at(
                &["compensateWithOnDemand"],
                "on-demand compensation needs `capacityTypes` with both spot and on-demand"
                    .to_string(),
            );
        }
        if spot && on_demand && a.on_demand_scaling_group_id.is_none() && !compensate {
            at(
                &[],
                "`capacityTypes` include spot and on-demand: set `onDemandScalingGroupId` or \
                 `compensateWithOnDemand: true`"
                    .to_string(),
            );
        }
        for (zone, vsw) in &a.v_switches {
            if !is_resource_id(vsw, "vsw-") {
                at(
                    &["vSwitches", zone],
                    format!("{vsw:?} is not a vSwitch id (vsw-...)"),
                );
            } else if !pool.zones.contains(zone) {
                at(
                    &["vSwitches", zone],
                    format!(
                        "{zone} is not a zone of the pool ({})",
                        pool.zones.join(", ")
                    ),
                );
            }
        }
        if provider == NAME {
            for zone in pool.zones {
                if !a.v_switches.contains_key(zone) {
                    at(
                        &["vSwitches"],
                        format!("zone {zone} has no vSwitch in alibaba.vSwitches"),
                    );
                }
            }
        }
        errors
    }

    /// A scaling group belongs to one pool: ESS would mix their nodes.
    fn validate_pools(&self, pools: &[PoolSection<'_>]) -> Vec<(usize, FieldError)> {
        let mut errors = Vec::new();
        let mut groups: BTreeMap<String, &str> = BTreeMap::new();
        for pool in pools {
            let Ok(a) = AlibabaPoolSettings::from_section(pool.section) else {
                continue;
            };
            let ids = [
                ("scalingGroupId", Some(a.scaling_group_id)),
                ("onDemandScalingGroupId", a.on_demand_scaling_group_id),
            ];
            for (field, id) in ids {
                let Some(id) = id else { continue };
                if let Some(other) = groups.insert(id.clone(), pool.name) {
                    errors.push((
                        pool.index,
                        FieldError::at(
                            &[NAME, field],
                            format!("scaling group {id} is already used by pool {other}"),
                        ),
                    ));
                }
            }
        }
        errors
    }
}
