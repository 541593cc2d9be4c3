//! The Alibaba Cloud provider's configuration from the scaling policy (behind the `alibaba`
//! feature).

use gpu_node_autoscaler_alibaba::settings::AlibabaPoolSettings;
use gpu_node_autoscaler_alibaba::{
    AlibabaConfig, AlibabaPool, AlibabaProvider, ChainOverrides, CredentialSource,
};
use std::sync::Arc;

use gpu_node_autoscaler_provider::{CapacityType, Catalog, CloudProvider};

use crate::provider_build::{BuildContext, Building};
use gpu_node_autoscaler_core::plan::templates::pool_types_and_prices;
use gpu_node_autoscaler_core::policy::Policy;

/// The Alibaba Cloud provider of the policy's `provider: alibaba` pools (the registry's
/// `build`).
pub fn build<'a>(cx: &'a BuildContext<'a>) -> Building<'a> {
    Box::pin(async move {
        let region = cx
            .policy
            .region
            .clone()
            .or_else(|| std::env::var("ALIBABA_CLOUD_REGION_ID").ok())
            .ok_or("no region: set `region` in the policy or ALIBABA_CLOUD_REGION_ID")?;
        let mut config = config_from_policy(
            cx.policy,
            cx.catalog,
            &region,
            cx.args.alibaba_endpoint_url.clone(),
        )
        .map_err(|e| e.join("\n"))?;
        config.cluster_id = Some(cx.cluster_id.to_string());
        Ok(Arc::new(provider(config)?) as Arc<dyn CloudProvider>)
    })
}

/// Pools with `provider: alibaba` become provider pools: their `alibaba` section (scaling groups,
/// vSwitches), their instance types (listed, or resolved from `catalog` by their requirements)
/// and on-demand prices (the pool's `prices`, else the catalog's list price: the price file).
/// `endpoint_url` replaces the ESS, ECS and VPC endpoints (an emulator). Errors name the pool
/// and field.
pub fn config_from_policy(
    policy: &Policy,
    catalog: &Catalog,
    region: &str,
    endpoint_url: Option<String>,
) -> Result<AlibabaConfig, Vec<String>> {
    let mut config = AlibabaConfig::new(region);
    config.ess_endpoint = endpoint_url.clone();
    config.ecs_endpoint = endpoint_url.clone();
    config.vpc_endpoint = endpoint_url;
    let mut errors = Vec::new();
    for pool in policy.pools.iter().filter(|p| p.provider == "alibaba") {
        let ali = match pool
            .settings
            .as_ref()
            .map(AlibabaPoolSettings::from_section)
        {
            Some(Ok(ali)) => ali,
            Some(Err(e)) => {
                errors.push(format!("pool {}: {e}", pool.name));
                continue;
            }
            None => {
                errors.push(format!(
                    "pool {}: alibaba: missing (scalingGroupId and vSwitches are needed to launch)",
                    pool.name
                ));
                continue;
            }
        };
        let (types, prices) = match pool_types_and_prices(pool, catalog) {
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

/// Checks the policy's Alibaba Cloud pools against the account (scaling groups and their
/// vSwitches, vSwitch zones, instance types offered per zone). Returns every problem found.
pub fn check_against_account(config: AlibabaConfig) -> Result<Vec<String>, String> {
    provider(config)?.validate_blocking()
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpu_node_autoscaler_core::catalog::{offerings_from_list_prices, parse_csv};
    use gpu_node_autoscaler_core::policy::parse_policy;

    const POLICY: &str = "region: cn-hangzhou
zones: [cn-hangzhou-i]
pools:
  - name: spot
    provider: alibaba
    instanceTypes: [ecs.gn7i-c8g1.2xlarge, ecs.gn6i-c4g1.xlarge]
    capacityTypes: [spot, on-demand]
    maxNodes: 4
    prices: {ecs.gn7i-c8g1.2xlarge: {onDemand: 2.5}}
    alibaba:
      scalingGroupId: asg-spot
      onDemandScalingGroupId: asg-od
      vSwitches: {cn-hangzhou-i: vsw-1}
  - name: od
    provider: alibaba
    instanceTypes: [ecs.gn6i-c4g1.xlarge]
    maxNodes: 2
    alibaba: {scalingGroupId: asg-od2, vSwitches: {cn-hangzhou-i: vsw-1}}
  - name: elsewhere
    provider: memory
    instanceTypes: [ecs.gn6i-c4g1.xlarge]
    maxNodes: 1
";

    /// The price file: a catalog CSV.
    const PRICES: &str =
        "instance_type,gpu_model,gpu_count,gpu_memory_mib,vcpu,memory_mib,on_demand_usd_per_hour
ecs.gn7i-c8g1.2xlarge,A10,1,24576,8,30720,1.9
ecs.gn6i-c4g1.xlarge,T4,1,16384,4,15360,1.2
";

    #[test]
    fn pools_map_onto_groups_with_prices_from_the_policy_then_the_price_file() {
        let policy = parse_policy(POLICY, "policy.yaml").unwrap();
        let catalog = offerings_from_list_prices(&policy, parse_csv(PRICES, "prices.csv").unwrap());
        let c =
            config_from_policy(&policy, &catalog, "cn-hangzhou", Some("http://x".into())).unwrap();
        assert_eq!(c.ess_endpoint.as_deref(), Some("http://x"));
        assert_eq!(c.vpc_endpoint.as_deref(), Some("http://x"));
        assert_eq!(c.pools.len(), 2, "only the alibaba pools");
        let spot = &c.pools[0];
        assert_eq!(
            (spot.scaling_group.as_str(), spot.capacity_type),
            ("asg-spot", CapacityType::Spot)
        );
        assert_eq!(spot.on_demand_group.as_deref(), Some("asg-od"));
        // The policy's price wins over the price file's.
        assert_eq!(spot.on_demand_prices["ecs.gn7i-c8g1.2xlarge"], 2.5);
        assert_eq!(spot.on_demand_prices["ecs.gn6i-c4g1.xlarge"], 1.2);
        let od = &c.pools[1];
        assert_eq!(
            (od.scaling_group.as_str(), od.capacity_type),
            ("asg-od2", CapacityType::OnDemand)
        );
        assert_eq!(od.vswitches["cn-hangzhou-i"], "vsw-1");
    }

    #[test]
    fn types_without_a_price_are_named() {
        let policy = parse_policy(POLICY, "policy.yaml").unwrap();
        let e = config_from_policy(&policy, &Catalog::default(), "cn-hangzhou", None).unwrap_err();
        assert_eq!(
            e,
            [
                "pool spot: prices.ecs.gn6i-c4g1.xlarge.onDemand: no on-demand price for \
                 ecs.gn6i-c4g1.xlarge (the ECS API has none: set it in the pool's prices or give \
                 a --catalog price file with it)",
                "pool od: prices.ecs.gn6i-c4g1.xlarge.onDemand: no on-demand price for \
                 ecs.gn6i-c4g1.xlarge (the ECS API has none: set it in the pool's prices or give \
                 a --catalog price file with it)",
            ]
        );
    }
}
