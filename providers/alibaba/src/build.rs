//! The provider built from its spec: pools with `provider: alibaba` become [`AlibabaPool`]s
//! (their `alibaba` section: scaling groups and vSwitches; their instance types and on-demand
//! prices as the core resolved them), and the account check of `check-policy --provider
//! alibaba`.

use std::sync::Arc;

use gpu_node_autoscaler_provider::spec::{
    AccountProblems, Building, CheckFailed, Checking, ProviderSpec,
};
use gpu_node_autoscaler_provider::{CapacityType, CloudProvider};

use crate::settings::AlibabaPoolSettings;
use crate::{AlibabaConfig, AlibabaPool, AlibabaProvider, ChainOverrides, CredentialSource};

/// The Alibaba Cloud provider of the spec's pools (the registry's `build`); the region is the
/// spec's, else `ALIBABA_CLOUD_REGION_ID`.
pub fn build<'a>(spec: &'a ProviderSpec<'a>) -> Building<'a> {
    Box::pin(async move {
        let region = spec
            .region
            .clone()
            .or_else(|| std::env::var("ALIBABA_CLOUD_REGION_ID").ok())
            .ok_or("no region: set `region` in the policy or ALIBABA_CLOUD_REGION_ID")?;
        let config = config_from_spec(spec, &region).map_err(|e| e.join("\n"))?;
        Ok(Arc::new(provider(config)?) as Arc<dyn CloudProvider>)
    })
}

/// Checks the spec's pools against the account (scaling groups and their vSwitches, vSwitch
/// zones, instance types offered per zone): every problem found. The spec needs a region.
pub fn check<'a>(spec: &'a ProviderSpec<'a>) -> Checking<'a> {
    Box::pin(async move {
        let Some(region) = spec.region.as_deref() else {
            return Err(CheckFailed::Cloud(
                "--provider alibaba needs the policy's `region`".into(),
            ));
        };
        let config = config_from_spec(spec, region).map_err(CheckFailed::Spec)?;
        let problems = provider(config)
            .map_err(CheckFailed::Cloud)?
            .validate()
            .await
            .map_err(|e| CheckFailed::Cloud(format!("Alibaba Cloud: {e}")))?;
        Ok(AccountProblems {
            reservations: Vec::new(),
            account: "Alibaba Cloud",
            problems,
            found: Vec::new(),
        })
    })
}

/// The spec's pools as provider pools. The spec's `endpoint_url` replaces the ESS, ECS and VPC
/// endpoints (an emulator). Errors name the pool and field.
pub fn config_from_spec(
    spec: &ProviderSpec<'_>,
    region: &str,
) -> Result<AlibabaConfig, Vec<String>> {
    let mut config = AlibabaConfig::new(region);
    config.ess_endpoint = spec.endpoint_url.clone();
    config.ecs_endpoint = spec.endpoint_url.clone();
    config.vpc_endpoint = spec.endpoint_url.clone();
    config.cluster_id = spec.cluster_id.clone();
    let mut errors = Vec::new();
    for pool in &spec.pools {
        let (ali, types, prices) = match pool.resolve(
            "alibaba",
            AlibabaPoolSettings::from_section,
            "scalingGroupId and vSwitches are needed to launch",
        ) {
            Ok(x) => x,
            Err(e) => {
                errors.push(e);
                continue;
            }
        };
        for t in types.iter().filter(|t| !prices.contains_key(*t)) {
            errors.push(format!(
                "pool {}: prices.{t}.onDemand: no on-demand price for {t} (the ECS API has \
                 none: set it in the pool's prices or give a --catalog price file with it)",
                pool.name
            ));
        }
        // The policy checked that the groups fit the capacity types: with spot among them,
        // `scalingGroupId` is the spot group.
        let spot = pool.capacity_types.contains(&CapacityType::Spot);
        config.pools.push(AlibabaPool {
            name: pool.name.clone(),
            scaling_group: ali.scaling_group_id,
            capacity_type: if spot {
                CapacityType::Spot
            } else {
                CapacityType::OnDemand
            },
            compensate_with_on_demand: ali.compensate_with_on_demand,
            on_demand_group: ali.on_demand_scaling_group_id,
            instance_types: types,
            vswitches: ali.vswitches,
            on_demand_prices: prices,
        });
    }
    errors.extend(config.problems());
    if errors.is_empty() {
        Ok(config)
    } else {
        Err(errors)
    }
}

/// The provider for `config`, with credentials from the chain (environment, RRSA/OIDC, ECS
/// instance RAM role; fetched at the first call).
pub fn provider(config: AlibabaConfig) -> Result<AlibabaProvider, String> {
    let source = CredentialSource::from_env(&ChainOverrides::default())?;
    AlibabaProvider::new(config, source).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use gpu_node_autoscaler_provider::policy::Value;
    use gpu_node_autoscaler_provider::spec::PoolSpec;
    use gpu_node_autoscaler_provider::Catalog;

    use super::*;

    fn pool(name: &str, section: &str, types: &[(&str, Option<f64>)], spot: bool) -> PoolSpec {
        let names = types.iter().map(|(t, _)| t.to_string()).collect();
        let prices = types
            .iter()
            .filter_map(|(t, p)| Some((t.to_string(), (*p)?)))
            .collect();
        PoolSpec {
            name: name.into(),
            settings: Some(serde_json::from_str::<Value>(section).unwrap()),
            zones: vec!["cn-hangzhou-i".into()],
            capacity_types: if spot {
                vec![CapacityType::Spot, CapacityType::OnDemand]
            } else {
                vec![CapacityType::OnDemand]
            },
            types: Ok((names, prices)),
            startup_taints: Vec::new(),
            gpu_resources: BTreeMap::new(),
        }
    }

    fn spec<'a>(catalog: &'a Catalog, pools: Vec<PoolSpec>) -> ProviderSpec<'a> {
        ProviderSpec {
            cluster_name: "c".into(),
            cluster_id: Some("uid-1".into()),
            region: Some("cn-hangzhou".into()),
            endpoint_url: Some("http://x".into()),
            catalog,
            type_labels: BTreeMap::new(),
            pools,
            max_node_provision_time: std::time::Duration::from_secs(900),
            kube_client: None,
        }
    }

    #[test]
    fn pools_map_onto_groups_with_their_prices_and_the_endpoint() {
        let catalog = Catalog::default();
        let s = spec(
            &catalog,
            vec![
                pool(
                    "spot",
                    r#"{"scalingGroupId": "asg-spot", "onDemandScalingGroupId": "asg-od",
                        "vSwitches": {"cn-hangzhou-i": "vsw-1"}}"#,
                    &[("ecs.gn7i-c8g1.2xlarge", Some(2.5))],
                    true,
                ),
                pool(
                    "od",
                    r#"{"scalingGroupId": "asg-od2", "vSwitches": {"cn-hangzhou-i": "vsw-1"}}"#,
                    &[("ecs.gn6i-c4g1.xlarge", Some(1.2))],
                    false,
                ),
            ],
        );
        let c = config_from_spec(&s, "cn-hangzhou").unwrap();
        assert_eq!(c.ess_endpoint.as_deref(), Some("http://x"));
        assert_eq!(c.vpc_endpoint.as_deref(), Some("http://x"));
        assert_eq!(c.cluster_id.as_deref(), Some("uid-1"));
        let spot = &c.pools[0];
        assert_eq!(
            (spot.scaling_group.as_str(), spot.capacity_type),
            ("asg-spot", CapacityType::Spot)
        );
        assert_eq!(spot.on_demand_group.as_deref(), Some("asg-od"));
        assert_eq!(spot.on_demand_prices["ecs.gn7i-c8g1.2xlarge"], 2.5);
        let od = &c.pools[1];
        assert_eq!(
            (od.scaling_group.as_str(), od.capacity_type),
            ("asg-od2", CapacityType::OnDemand)
        );
        assert_eq!(od.vswitches["cn-hangzhou-i"], "vsw-1");
    }

    #[test]
    fn types_without_a_price_are_named() {
        let catalog = Catalog::default();
        let s = spec(
            &catalog,
            vec![pool(
                "spot",
                r#"{"scalingGroupId": "asg-spot", "onDemandScalingGroupId": "asg-od",
                    "vSwitches": {"cn-hangzhou-i": "vsw-1"}}"#,
                &[
                    ("ecs.gn7i-c8g1.2xlarge", Some(2.5)),
                    ("ecs.gn6i-c4g1.xlarge", None),
                ],
                true,
            )],
        );
        assert_eq!(
            config_from_spec(&s, "cn-hangzhou").unwrap_err(),
            [
                "pool spot: prices.ecs.gn6i-c4g1.xlarge.onDemand: no on-demand price for \
                 ecs.gn6i-c4g1.xlarge (the ECS API has none: set it in the pool's prices or give \
                 a --catalog price file with it)"
            ]
        );
    }

    #[test]
    fn a_pool_without_its_section_or_types_is_named() {
        let catalog = Catalog::default();
        let mut bare = pool("bare", "{}", &[], false);
        bare.settings = None;
        let mut unresolved = pool(
            "unresolved",
            r#"{"scalingGroupId": "asg-1", "vSwitches": {"cn-hangzhou-i": "vsw-1"}}"#,
            &[],
            false,
        );
        unresolved.types = Err("pool unresolved: no instance type matches".into());
        let s = spec(&catalog, vec![bare, unresolved]);
        assert_eq!(
            config_from_spec(&s, "cn-hangzhou").unwrap_err(),
            [
                "pool bare: alibaba: missing (scalingGroupId and vSwitches are needed to launch)",
                "pool unresolved: no instance type matches",
            ]
        );
    }
}
