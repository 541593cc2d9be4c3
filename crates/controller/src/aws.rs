//! The AWS provider's configuration from the scaling policy (behind the `aws` feature).

use gpu_node_autoscaler_aws::settings::{AwsPoolSettings, LaunchTemplateBy};
use gpu_node_autoscaler_aws::{
    AwsConfig, AwsPool, LaunchTemplateRef, OnDemandAllocation, SpotAllocation,
};
use std::sync::Arc;

use gpu_node_autoscaler_provider::{Catalog, CloudProvider};

use crate::provider_build::{BuildContext, Building};
use gpu_node_autoscaler_core::plan::templates::pool_types_and_prices;
use gpu_node_autoscaler_core::policy::Policy;

/// The policy's `region`, else the AWS SDK's environment.
pub fn region(policy: &Policy) -> Result<String, String> {
    policy
        .region
        .clone()
        .or_else(|| std::env::var("AWS_REGION").ok())
        .or_else(|| std::env::var("AWS_DEFAULT_REGION").ok())
        .ok_or_else(|| "no region: set `region` in the policy or AWS_REGION".to_string())
}

/// The AWS provider of the policy's `provider: aws` pools (the registry's `build`).
pub fn build<'a>(cx: &'a BuildContext<'a>) -> Building<'a> {
    Box::pin(async move {
        let region = region(cx.policy)?;
        let mut config = config_from_policy(
            cx.policy,
            cx.catalog,
            &region,
            cx.args.aws_endpoint_url.clone(),
        )
        .map_err(|e| e.join("\n"))?;
        config.cluster_id = Some(cx.cluster_id.to_string());
        let provider = gpu_node_autoscaler_aws::AwsProvider::new(config)
            .await
            .map_err(|e| e.to_string())?;
        Ok(Arc::new(provider) as Arc<dyn CloudProvider>)
    })
}

/// Pools with `provider: aws` become provider pools: their `aws` section, their instance types
/// (listed, or resolved from `catalog` by their requirements) and on-demand prices (the pool's
/// `prices`, else the catalog's list price). Errors name the pool and field.
pub fn config_from_policy(
    policy: &Policy,
    catalog: &Catalog,
    region: &str,
    endpoint_url: Option<String>,
) -> Result<AwsConfig, Vec<String>> {
    let mut config = AwsConfig::new(region, policy.cluster_name.clone());
    config.endpoint_url = endpoint_url;
    let mut errors = Vec::new();
    for pool in policy.pools.iter().filter(|p| p.provider == "aws") {
        let aws = match pool.settings.as_ref().map(AwsPoolSettings::from_section) {
            Some(Ok(aws)) => aws,
            Some(Err(e)) => {
                errors.push(format!("pool {}: {e}", pool.name));
                continue;
            }
            None => {
                errors.push(format!(
                    "pool {}: aws: missing (launchTemplate and subnets are needed to launch)",
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

/// Checks the policy's AWS pools against the account (instance types offered in their zones,
/// subnets, launch templates). Returns every problem found.
pub fn check_against_account(config: AwsConfig) -> Result<Vec<String>, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    rt.block_on(async {
        let provider = gpu_node_autoscaler_aws::AwsProvider::new(config)
            .await
            .map_err(|e| e.to_string())?;
        provider.validate().await.map_err(|e| format!("EC2: {e}"))
    })
}
