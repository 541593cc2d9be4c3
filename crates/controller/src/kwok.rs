//! The kwok provider's configuration from the scaling policy: pools with `provider: kwok` launch
//! Nodes that kwok plays the kubelets of (see `gpu-node-autoscaler-kwok`).

use std::collections::BTreeMap;
use std::sync::Arc;

use gpu_node_autoscaler_kwok::KwokConfig;
use gpu_node_autoscaler_provider::{Catalog, CloudProvider};

use crate::provider_build::{BuildContext, Building};
use gpu_node_autoscaler_core::model::gpu::nvidia_product_label;
use gpu_node_autoscaler_core::model::labels;
use gpu_node_autoscaler_core::plan::templates::{advertised_gpu_resources, pool_types_and_prices};
use gpu_node_autoscaler_core::policy::Policy;

/// The kwok provider of the policy's `provider: kwok` pools (the registry's `build`): Nodes on
/// this very cluster, played by kwok. The client's credentials need create/delete on Nodes
/// (deploy/overlays/kwok grants them).
pub fn build<'a>(cx: &'a BuildContext<'a>) -> Building<'a> {
    Box::pin(async move {
        let config =
            config_from_policy(cx.policy, cx.catalog, cx.cluster_id).map_err(|e| e.join("\n"))?;
        let provider = gpu_node_autoscaler_kwok::KwokProvider::new(cx.client.clone(), config)
            .map_err(|e| e.to_string())?;
        Ok(Arc::new(provider) as Arc<dyn CloudProvider>)
    })
}

/// The region kwok Nodes are labelled with when the policy names none.
pub const DEFAULT_REGION: &str = "kwok";

/// The kwok provider's configuration: the catalog's instance types of the kwok pools with their
/// offerings (prices from the pool's `prices`, else the catalog), the GPU product label of NVIDIA
/// types, each pool's `startupTaints` as the taints its Nodes register with, and the GPU
/// resources a pool's Node advertises (whole GPUs, MIG slices or shared GPUs as its `gpuMode`
/// says, none where a DRA driver publishes them).
pub fn config_from_policy(
    policy: &Policy,
    catalog: &Catalog,
    cluster_id: &str,
) -> Result<KwokConfig, Vec<String>> {
    let mut config = KwokConfig {
        cluster: policy.cluster_name.clone(),
        cluster_id: cluster_id.to_string(),
        region: policy
            .region
            .clone()
            .unwrap_or_else(|| DEFAULT_REGION.to_string()),
        ..KwokConfig::default()
    };
    let mut errors = Vec::new();
    for pool in policy.pools.iter().filter(|p| p.provider == "kwok") {
        let (types, prices) = match pool_types_and_prices(pool, catalog) {
            Ok(x) => x,
            Err(e) => {
                errors.push(e);
                continue;
            }
        };
        for name in &types {
            let Some(t) = catalog.instance_type(name) else {
                errors.push(format!(
                    "pool {}: instance type {name} is not in the catalog",
                    pool.name
                ));
                continue;
            };
            match advertised_gpu_resources(pool, t) {
                Ok(gpus) => {
                    config
                        .gpu_resources
                        .insert((pool.name.clone(), name.clone()), gpus);
                }
                Err(e) => errors.push(e),
            }
            if config.catalog.instance_type(name).is_none() {
                config.catalog.instance_types.push(t.clone());
                if let Some(g) = &t.gpu {
                    let mut l = BTreeMap::new();
                    if g.vendor == gpu_node_autoscaler_provider::GpuVendor::Nvidia {
                        l.insert(
                            labels::NVIDIA_PRODUCT.to_string(),
                            nvidia_product_label(&g.model, g.memory_mib),
                        );
                        l.insert(labels::NVIDIA_COUNT.to_string(), g.count.to_string());
                    }
                    config.type_labels.insert(name.clone(), l);
                }
            }
            for o in catalog.offerings.iter().filter(|o| {
                o.key.instance_type == *name
                    && pool.zones.contains(&o.key.zone)
                    && pool.capacity_types.contains(&o.key.capacity_type)
            }) {
                if config.catalog.offerings.iter().any(|x| x.key == o.key) {
                    continue;
                }
                let mut o = o.clone();
                if let (Some(p), gpu_node_autoscaler_provider::CapacityType::OnDemand) =
                    (prices.get(name), o.key.capacity_type)
                {
                    o.price_per_hour = *p;
                }
                config.catalog.offerings.push(o);
            }
        }
        config.register_taints.insert(
            pool.name.clone(),
            pool.startup_taints
                .iter()
                .map(|t| {
                    (
                        t.key.clone(),
                        t.value.clone(),
                        t.effect.as_str().to_string(),
                    )
                })
                .collect(),
        );
    }
    if errors.is_empty() {
        Ok(config)
    } else {
        Err(errors)
    }
}
