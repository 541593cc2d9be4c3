//! The provider built from its spec: the catalog's instance types of the kwok pools with their
//! offerings (prices from the pool's `prices`, else the catalog), the GPU labels of their types,
//! each pool's startup taints as the taints its Nodes register with, the GPU resources a
//! pool's Node advertises, and the capacity reservations of the pools' `kwok:` sections.

use std::sync::Arc;

use gpu_node_autoscaler_provider::spec::{Building, ProviderSpec};
use gpu_node_autoscaler_provider::{CapacityType, CloudProvider};
use kube::Client;

use crate::{KwokConfig, KwokProvider};

/// The region kwok Nodes are labelled with when the policy names none.
pub const DEFAULT_REGION: &str = "kwok";

/// The kwok provider of the spec's pools (the registry's `build`): Nodes on the controller's own
/// cluster, played by kwok. The spec's client needs create/delete on Nodes (deploy/overlays/kwok
/// grants them).
pub fn build<'a>(spec: &'a ProviderSpec<'a>) -> Building<'a> {
    Box::pin(async move {
        let client = spec
            .kube_client
            .and_then(|c| c.downcast_ref::<Client>())
            .ok_or("the kwok provider needs the controller's Kubernetes client")?;
        let config = config_from_spec(spec).map_err(|e| e.join("\n"))?;
        let provider = KwokProvider::new(client.clone(), config).map_err(|e| e.to_string())?;
        Ok(Arc::new(provider) as Arc<dyn CloudProvider>)
    })
}

/// The kwok provider's configuration from its spec. Errors name the pool and field.
pub fn config_from_spec(spec: &ProviderSpec<'_>) -> Result<KwokConfig, Vec<String>> {
    let catalog = spec.catalog;
    let mut config = KwokConfig {
        cluster: spec.cluster_name.clone(),
        cluster_id: spec.cluster_id.clone().unwrap_or_default(),
        region: spec
            .region
            .clone()
            .unwrap_or_else(|| DEFAULT_REGION.to_string()),
        ..KwokConfig::default()
    };
    let mut errors = Vec::new();
    for pool in &spec.pools {
        let (types, prices) = match &pool.types {
            Ok(x) => x,
            Err(e) => {
                errors.push(e.clone());
                continue;
            }
        };
        for name in types {
            let Some(t) = catalog.instance_type(name) else {
                errors.push(format!(
                    "pool {}: instance type {name} is not in the catalog",
                    pool.name
                ));
                continue;
            };
            match pool.gpu_resources.get(name) {
                Some(Ok(gpus)) => {
                    config
                        .gpu_resources
                        .insert((pool.name.clone(), name.clone()), gpus.clone());
                }
                Some(Err(e)) => errors.push(e.clone()),
                None => {}
            }
            if config.catalog.instance_type(name).is_none() {
                config.catalog.instance_types.push(t.clone());
                if let Some(l) = spec.type_labels.get(name) {
                    config.type_labels.insert(name.clone(), l.clone());
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
                if let (Some(p), CapacityType::OnDemand) = (prices.get(name), o.key.capacity_type) {
                    o.price_per_hour = *p;
                }
                config.catalog.offerings.push(o);
            }
        }
        config
            .register_taints
            .insert(pool.name.clone(), pool.startup_taints.clone());
        // The reservations it declares (one of the account's, however many pools declare it).
        if let Some(section) = &pool.settings {
            match crate::settings::reservations(section) {
                Ok(list) => {
                    for r in list {
                        if !config.reservations.iter().any(|x| x.id == r.id) {
                            config.reservations.push(r);
                        }
                    }
                }
                Err(e) => errors.push(format!("pool {}: {e}", pool.name)),
            }
        }
    }
    if errors.is_empty() {
        Ok(config)
    } else {
        Err(errors)
    }
}
