//! The provider built from its spec: pools with `provider: aws` become [`AwsPool`]s (their `aws`
//! section, their instance types and on-demand prices as the core resolved them), and the
//! account check of `check-policy --provider aws`.

use std::sync::Arc;

use gpu_node_autoscaler_provider::spec::{
    AccountProblems, Building, CheckFailed, Checking, ProviderSpec,
};
use gpu_node_autoscaler_provider::{CapacityType, CloudProvider};

use crate::settings::{AwsPoolSettings, LaunchTemplateBy};
use crate::{
    AsgPool, AwsConfig, AwsPool, AwsProvider, LaunchTemplateRef, OnDemandAllocation, SpotAllocation,
};

/// The spec's `region`, else the AWS SDK's environment.
pub fn region(spec: &ProviderSpec<'_>) -> Result<String, String> {
    spec.region
        .clone()
        .or_else(|| std::env::var("AWS_REGION").ok())
        .or_else(|| std::env::var("AWS_DEFAULT_REGION").ok())
        .ok_or_else(|| "no region: set `region` in the policy or AWS_REGION".to_string())
}

/// The AWS provider of the spec's pools (the registry's `build`).
pub fn build<'a>(spec: &'a ProviderSpec<'a>) -> Building<'a> {
    Box::pin(async move {
        let region = region(spec)?;
        let config = config_from_spec(spec, &region).map_err(|e| e.join("\n"))?;
        let provider = AwsProvider::new(config).await.map_err(|e| e.to_string())?;
        Ok(Arc::new(provider) as Arc<dyn CloudProvider>)
    })
}

/// Checks the spec's pools against the account (instance types offered in their zones, subnets,
/// launch templates): every problem found, and the account's capacity reservations when a pool
/// lists `reserved`. The spec needs a region.
pub fn check<'a>(spec: &'a ProviderSpec<'a>) -> Checking<'a> {
    Box::pin(async move {
        let Some(region) = spec.region.as_deref() else {
            return Err(CheckFailed::Cloud(
                "--provider aws needs a region: --aws-region or the policy's `region`".into(),
            ));
        };
        let config = config_from_spec(spec, region).map_err(CheckFailed::Spec)?;
        let provider = AwsProvider::new(config)
            .await
            .map_err(|e| CheckFailed::Cloud(e.to_string()))?;
        let mut problems = provider
            .validate()
            .await
            .map_err(|e| CheckFailed::Cloud(format!("EC2: {e}")))?;
        let (found, group_problems) = provider
            .group_report()
            .await
            .map_err(|e| CheckFailed::Cloud(format!("Auto Scaling: {e}")))?;
        problems.extend(group_problems);
        // The reservations, where a pool launches into some (DescribeCapacityReservations).
        let reservations = if spec
            .pools
            .iter()
            .any(|p| p.capacity_types.contains(&CapacityType::Reserved))
        {
            provider
                .reservations()
                .await
                .map_err(|e| CheckFailed::Cloud(format!("EC2: {e}")))?
        } else {
            Vec::new()
        };
        Ok(AccountProblems {
            account: "AWS",
            problems,
            found,
            reservations,
        })
    })
}

/// The spec's pools as provider pools: their `aws` section, instance types and on-demand prices.
/// Errors name the pool and field.
pub fn config_from_spec(spec: &ProviderSpec<'_>, region: &str) -> Result<AwsConfig, Vec<String>> {
    let mut config = AwsConfig::new(region, spec.cluster_name.clone());
    config.endpoint_url = spec.endpoint_url.clone();
    config.cluster_id = spec.cluster_id.clone();
    config.group_provision_time = spec.max_node_provision_time;
    let mut errors = Vec::new();
    for pool in &spec.pools {
        let (aws, types, prices) = match pool.resolve(
            "aws",
            AwsPoolSettings::from_section,
            "launchTemplate and subnets are needed to launch",
        ) {
            Ok(x) => x,
            Err(e) => {
                errors.push(e);
                continue;
            }
        };
        if let Some(groups) = &aws.auto_scaling_groups {
            config.group_pools.push(AsgPool {
                name: pool.name.clone(),
                groups: groups.clone(),
                instance_types: types,
                on_demand_prices: prices,
                zones: pool.zones.clone(),
                capacity_types: pool.capacity_types.clone(),
            });
            continue;
        }
        let id_or_name = match &aws.launch_template.by {
            LaunchTemplateBy::Name(n) | LaunchTemplateBy::Id(n) => n.clone(),
        };
        config.pools.push(AwsPool {
            name: pool.name.clone(),
            launch_template: LaunchTemplateRef {
                id_or_name,
                version: aws.launch_template.version.clone(),
            },
            subnets: aws.subnets.clone(),
            instance_types: types,
            on_demand_prices: prices,
            on_demand_allocation: OnDemandAllocation::Prioritized,
            spot_allocation: SpotAllocation::PriceCapacityOptimized,
        });
    }
    if errors.is_empty() {
        Ok(config)
    } else {
        Err(errors)
    }
}
