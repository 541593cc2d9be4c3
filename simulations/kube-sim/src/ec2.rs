//! The cloud bridge to an EC2 endpoint (real EC2 or `moto_server`): the cluster's instances
//! become Nodes, and Nodes go away when their instances do (see [`crate::nodes`]).
//!
//! Every poll lists the instances tagged `gpu-node-autoscaler.io/cluster=<cluster>` in state
//! `pending` or `running` (DescribeInstances, every page); instance types are learned once each
//! (DescribeInstanceTypes). This module is the only one that uses the AWS SDK.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use aws_config::{BehaviorVersion, Region};
use aws_sdk_ec2::error::DisplayErrorContext;
use aws_sdk_ec2::types::{Filter, Instance, InstanceLifecycleType, InstanceType};
use aws_sdk_ec2::Client;
use gpu_node_autoscaler_core::model::gpu::nvidia_product_label;
use tokio::time::Instant;

/// The cluster identity tag (the launching cluster's kube-system Namespace UID).
pub const TAG_CLUSTER_ID: &str = "gpu-node-autoscaler.io/cluster-id";

pub use crate::nodes::{
    delete_node_and_pods, TAG_CLUSTER, TAG_LAUNCH_ID, TAG_POOL, TAG_TEMPLATE_LABEL,
    TAG_TEMPLATE_TAINT,
};
pub use crate::nodes::{CloudBridge, NodeApi, NodeStyle};
use crate::nodes::{InstanceView, Registrar, TypeInfo};
use crate::server::App;

/// Where the bridge finds EC2 and which instances are the cluster's.
#[derive(Debug, Clone)]
pub struct Ec2Config {
    /// The endpoint URL, e.g. `http://127.0.0.1:5000`.
    pub endpoint: String,
    pub region: String,
    /// The value of the `gpu-node-autoscaler.io/cluster` tag.
    pub cluster_name: String,
    /// The cluster's identity (`gpu-node-autoscaler.io/cluster-id` tag), when known: an instance
    /// tagged with another belongs to another cluster (same name) and never joins this one.
    pub cluster_id: Option<String>,
    /// How long after kube-sim first sees an instance its Node registers.
    pub boot_delay: Duration,
    /// How long after the Node registers its GPUs are advertised.
    pub device_plugin_delay: Duration,
    /// How often instances are listed.
    pub poll: Duration,
    /// Taints every Node registers with (the kubelet's `--register-with-taints`,
    /// `key=value:Effect`), as a launch template's bootstrap would give them.
    pub register_with_taints: Vec<String>,
    /// CPU every Node's kubelet reserves (`--kube-reserved=cpu=...`), in milli.
    pub kube_reserved_cpu_milli: u64,
}

impl Ec2Config {
    pub fn new(endpoint: &str, region: &str, cluster_name: &str) -> Self {
        Ec2Config {
            endpoint: endpoint.to_string(),
            region: region.to_string(),
            cluster_name: cluster_name.to_string(),
            cluster_id: None,
            boot_delay: Duration::from_secs(3),
            device_plugin_delay: Duration::from_secs(2),
            poll: Duration::from_secs(1),
            register_with_taints: Vec::new(),
            kube_reserved_cpu_milli: 0,
        }
    }
}

/// The bridge's view of an EC2 instance.
fn view(i: &Instance, region: &str) -> Option<InstanceView> {
    let id = i.instance_id()?.to_string();
    let zone = i
        .placement()
        .and_then(|p| p.availability_zone())
        .unwrap_or("")
        .to_string();
    Some(InstanceView {
        provider_id: format!("aws:///{zone}/{id}"),
        id,
        instance_type: i.instance_type().map(|t| t.as_str().to_string())?,
        zone,
        private_dns: i.private_dns_name().unwrap_or("").to_string(),
        private_ip: i.private_ip_address().unwrap_or("").to_string(),
        spot: i.instance_lifecycle() == Some(&InstanceLifecycleType::Spot),
        tags: i
            .tags()
            .iter()
            .filter_map(|t| Some((t.key()?.to_string(), t.value().unwrap_or("").to_string())))
            .collect(),
        region: region.to_string(),
    })
}

/// The bridge: lists the cluster's instances, learns their types, registers their Nodes.
/// kube-sim runs one against its own store; the end-to-end tests run one against a real API
/// server (with [`NodeStyle::Kubelet`]).
pub struct Bridge {
    config: Ec2Config,
    client: Client,
    types: HashMap<String, TypeInfo>,
    registrar: Registrar,
}

async fn client(config: &Ec2Config) -> Client {
    let mut loader = aws_config::defaults(BehaviorVersion::latest())
        .region(Region::new(config.region.clone()))
        .endpoint_url(&config.endpoint);
    if std::env::var_os("AWS_ACCESS_KEY_ID").is_none() {
        loader = loader.credentials_provider(aws_sdk_ec2::config::Credentials::new(
            "kube-sim", "kube-sim", None, None, "kube-sim",
        ));
    }
    Client::new(&loader.load().await)
}

impl Bridge {
    async fn describe(&self) -> Result<Vec<InstanceView>, String> {
        let mut pages = self
            .client
            .describe_instances()
            .filters(
                Filter::builder()
                    .name(format!("tag:{TAG_CLUSTER}"))
                    .values(&self.config.cluster_name)
                    .build(),
            )
            .filters(
                Filter::builder()
                    .name("instance-state-name")
                    .values("pending")
                    .values("running")
                    .build(),
            )
            .into_paginator()
            .send();
        let mut out = Vec::new();
        while let Some(page) = pages.next().await {
            let page =
                page.map_err(|e| format!("DescribeInstances: {}", DisplayErrorContext(&e)))?;
            for r in page.reservations() {
                out.extend(
                    r.instances()
                        .iter()
                        .filter_map(|i| view(i, &self.config.region))
                        .filter(
                            |v| match (&self.config.cluster_id, v.tags.get(TAG_CLUSTER_ID)) {
                                (Some(ours), Some(theirs)) => ours == theirs,
                                _ => true,
                            },
                        ),
                );
            }
        }
        Ok(out)
    }

    /// Fetches the instance types not yet cached.
    async fn learn_types(&mut self, wanted: &HashSet<String>) -> Result<(), String> {
        let missing: Vec<&String> = wanted
            .iter()
            .filter(|t| !self.types.contains_key(*t))
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        let out = self
            .client
            .describe_instance_types()
            .set_instance_types(Some(
                missing
                    .iter()
                    .map(|t| InstanceType::from(t.as_str()))
                    .collect(),
            ))
            .send()
            .await
            .map_err(|e| format!("DescribeInstanceTypes: {}", DisplayErrorContext(&e)))?;
        for t in out.instance_types() {
            let Some(name) = t.instance_type().map(|n| n.as_str().to_string()) else {
                continue;
            };
            let mut gpus = None;
            let mut product = None;
            for g in t.gpu_info().map(|g| g.gpus()).unwrap_or_default() {
                let count = i64::from(g.count().unwrap_or(0));
                let resource = match g.manufacturer().unwrap_or("").to_ascii_uppercase().as_str() {
                    "NVIDIA" => "nvidia.com/gpu",
                    "AMD" => "amd.com/gpu",
                    _ => continue,
                };
                if resource == "nvidia.com/gpu" {
                    let mem = g.memory_info().and_then(|m| m.size_in_mib()).unwrap_or(0);
                    let mem = u64::try_from(mem).unwrap_or(0);
                    product = Some(nvidia_product_label(g.name().unwrap_or(""), mem));
                }
                let (_, n) = gpus.get_or_insert((resource, 0));
                *n += count;
            }
            self.types.insert(
                name,
                TypeInfo {
                    vcpus: i64::from(t.v_cpu_info().and_then(|v| v.default_v_cpus()).unwrap_or(0)),
                    memory_mib: t.memory_info().and_then(|m| m.size_in_mib()).unwrap_or(0),
                    gpus,
                    product,
                },
            );
        }
        Ok(())
    }

    pub async fn new(config: Ec2Config, style: NodeStyle) -> Bridge {
        Bridge {
            client: client(&config).await,
            registrar: Registrar::new("ec2", config.boot_delay, config.device_plugin_delay)
                .with_style(style)
                .with_register_taints(config.register_with_taints.clone())
                .with_kube_reserved_cpu(config.kube_reserved_cpu_milli),
            config,
            types: HashMap::new(),
        }
    }

    /// One poll against kube-sim's store.
    async fn poll(&mut self, app: &App) -> Option<Instant> {
        let (instances, types_known) = self.observe().await?;
        self.reconcile(&mut *app.store(), &instances, types_known)
    }
}

impl CloudBridge for Bridge {
    fn poll_interval(&self) -> Duration {
        self.config.poll
    }

    /// Lists the instances and learns the types of those due to register.
    async fn observe(&mut self) -> Option<(Vec<InstanceView>, bool)> {
        let instances = match self.describe().await {
            Ok(i) => i,
            Err(e) => {
                eprintln!("kube-sim: ec2 bridge: {e}");
                return None;
            }
        };
        let due_types = self.registrar.track(&instances);
        let types_known = match self.learn_types(&due_types).await {
            Ok(()) => true,
            Err(e) => {
                eprintln!("kube-sim: ec2 bridge: {e}");
                false
            }
        };
        Some((instances, types_known))
    }

    fn reconcile(
        &mut self,
        api: &mut dyn NodeApi,
        instances: &[InstanceView],
        types_known: bool,
    ) -> Option<Instant> {
        self.registrar
            .reconcile(api, instances, &self.types, types_known)
    }
}

/// Runs the bridge until the server goes away.
pub async fn run(app: Arc<App>, config: Ec2Config) {
    let mut bridge = Bridge::new(config, NodeStyle::KubeSim).await;
    loop {
        let started = Instant::now();
        let due = bridge.poll(&app).await;
        crate::nodes::sleep_until_next_poll(started, bridge.config.poll, due).await;
    }
}
