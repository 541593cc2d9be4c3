//! The bridge to an in-memory provider (`gpu-node-autoscaler-memory`), for tests that need no
//! EC2: the provider's `Pending` and `Running` instances become Nodes, and Nodes go away when
//! their instances shut down or terminate (see [`crate::nodes`]).
//!
//! The bridge reads the provider with its non-API accessors (`instances`, `tags`), so it neither
//! shows in the provider's call log nor meets its throttling or injected failures; instance shapes
//! come from the catalog given with the provider. kube-sim's clock times the boot and
//! device-plugin delays, not the provider's virtual one.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use gpu_node_autoscaler_memory::MemoryProvider;
use gpu_node_autoscaler_provider::{CapacityType, Catalog, GpuVendor, InstanceState};
use tokio::time::Instant;

use crate::nodes::{InstanceView, Registrar, TypeInfo};
use crate::server::App;
use gpu_node_autoscaler_core::model::gpu::nvidia_product_label;

/// The provider to follow, and the delays.
#[derive(Debug, Clone)]
pub struct MemoryBridgeConfig {
    pub provider: Arc<MemoryProvider>,
    /// The shapes of the provider's instance types (the catalog it was made with).
    pub catalog: Catalog,
    /// The region label of the Nodes.
    pub region: String,
    /// How long after kube-sim first sees an instance its Node registers.
    pub boot_delay: Duration,
    /// How long after the Node registers its GPUs are advertised.
    pub device_plugin_delay: Duration,
    /// How often the provider's instances are read.
    pub poll: Duration,
}

impl MemoryBridgeConfig {
    /// Follows `provider` (made with `catalog`), with the same default delays as the EC2 bridge
    /// (boot 3 s, device plugin 2 s, poll 1 s) and region `us-east-1`.
    pub fn new(provider: Arc<MemoryProvider>, catalog: Catalog) -> Self {
        MemoryBridgeConfig {
            provider,
            catalog,
            region: "us-east-1".to_string(),
            boot_delay: Duration::from_secs(3),
            device_plugin_delay: Duration::from_secs(2),
            poll: Duration::from_secs(1),
        }
    }
}

/// What each catalog instance type offers a Node.
fn types(catalog: &Catalog) -> HashMap<String, TypeInfo> {
    catalog
        .instance_types
        .iter()
        .map(|t| {
            let gpu = t.gpu.as_ref().filter(|g| g.count > 0);
            let info = TypeInfo {
                vcpus: i64::from(t.vcpu),
                memory_mib: t.memory_mib as i64,
                gpus: gpu.map(|g| (g.vendor.resource(), i64::from(g.count))),
                product: gpu
                    .filter(|g| g.vendor == GpuVendor::Nvidia)
                    .map(|g| nvidia_product_label(&g.model, g.memory_mib)),
            };
            (t.name.clone(), info)
        })
        .collect()
}

/// The provider's live instances.
fn live_instances(config: &MemoryBridgeConfig) -> Vec<InstanceView> {
    config
        .provider
        .instances()
        .into_iter()
        .filter(|i| matches!(i.state, InstanceState::Pending | InstanceState::Running))
        .map(|i| InstanceView {
            tags: config.provider.tags(&i.id).unwrap_or_default(),
            instance_type: i.offering.instance_type.clone(),
            zone: i.offering.zone.clone(),
            private_dns: String::new(),
            private_ip: String::new(),
            spot: i.offering.capacity_type == CapacityType::Spot,
            provider_id: i.provider_id.clone(),
            region: config.region.clone(),
            id: i.id,
        })
        .collect()
}

/// Runs the bridge until the server goes away.
pub async fn run(app: Arc<App>, config: MemoryBridgeConfig) {
    let types = types(&config.catalog);
    let mut registrar = Registrar::new("memory", config.boot_delay, config.device_plugin_delay);
    loop {
        let started = Instant::now();
        let instances = live_instances(&config);
        registrar.track(&instances);
        let due = registrar.reconcile(&mut *app.store(), &instances, &types, true);
        crate::nodes::sleep_until_next_poll(started, config.poll, due).await;
    }
}
