//! The cloud bridge to Alibaba Cloud ESS (a real account, or the Alibaba Cloud provider's local
//! fake of the ESS and ECS endpoints): the instances of the configured scaling groups become
//! Nodes as ACK registers them, and Nodes go away when their instances leave the groups.
//!
//! Every poll lists each group's scaling instances (`DescribeScalingInstances`, every page).
//! Instances `Pending`, `Pending:Wait`, `InService`, `Protected` or `Standby` are live; what ECS
//! `DescribeInstances` says of each (type, spot strategy, host name, private IP, tags) is asked
//! once per instance, and each type's shape once (`DescribeInstanceTypes`). The shared
//! [`Registrar`] does the rest as for the other bridges: a Node `boot_delay` after kube-sim first
//! saw the instance, its GPUs `device_plugin_delay` after that, the Node and its pods deleted when
//! the instance leaves the listing (or is `Removing`). A failed listing changes nothing. Requests
//! are signed by kube-sim's own RPC client ([`crate::alibaba_rpc`]); the tests run it against the
//! local fake, which checks every signature as it checks the provider's.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use gpu_node_autoscaler_core::model::gpu::nvidia_product_label;
use gpu_node_autoscaler_provider::GpuVendor;
use serde_json::{json, Value};
use tokio::time::Instant;

use crate::alibaba_rpc::{Client, Credentials};
use crate::nodes::{
    sleep_until_next_poll, CloudBridge, InstanceView, NodeApi, NodeStyle, Registrar, TypeInfo,
    TAG_POOL,
};
use crate::server::App;

/// Where the bridge finds ESS and which scaling groups are the cluster's.
#[derive(Debug, Clone)]
pub struct EssConfig {
    /// Replaces the ESS and ECS endpoints (e.g. the provider's local fake); `None`: Alibaba
    /// Cloud's (`https://ess.aliyuncs.com`, `https://ecs.<region>.aliyuncs.com`).
    pub endpoint: Option<String>,
    pub region: String,
    /// The scaling groups (`asg-...`) whose instances become Nodes.
    pub scaling_groups: Vec<String>,
    /// Scaling group → the `gpu-node-autoscaler.io/pool` label of its Nodes, for instances
    /// without a `gpu-node-autoscaler.io/pool` tag.
    pub pools: BTreeMap<String, String>,
    pub credentials: Credentials,
    /// How long after kube-sim first sees an instance its Node registers.
    pub boot_delay: Duration,
    /// How long after the Node registers its GPUs are advertised.
    pub device_plugin_delay: Duration,
    /// How often the scaling groups are listed.
    pub poll: Duration,
}

impl EssConfig {
    pub fn new(region: &str, scaling_groups: &[&str], credentials: Credentials) -> Self {
        EssConfig {
            endpoint: None,
            region: region.to_string(),
            scaling_groups: scaling_groups.iter().map(|g| g.to_string()).collect(),
            pools: BTreeMap::new(),
            credentials,
            boot_delay: Duration::from_secs(3),
            device_plugin_delay: Duration::from_secs(2),
            poll: Duration::from_secs(1),
        }
    }
}

/// `GROUP=POOL` of `--ess-pool`.
pub fn parse_pool_mapping(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((g, p)) if !g.trim().is_empty() && !p.trim().is_empty() => {
            Ok((g.trim().to_string(), p.trim().to_string()))
        }
        _ => Err(format!("expected SCALING_GROUP=POOL, got {s:?}")),
    }
}

/// Lifecycle states of a scaling instance that has (or will have) a Node.
pub fn has_node(lifecycle: &str) -> bool {
    matches!(
        lifecycle,
        "Pending" | "Pending:Wait" | "InService" | "Protected" | "Standby"
    )
}

/// One scaling instance, as `DescribeScalingInstances` lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct ScalingInstance {
    pub id: String,
    pub group: String,
    pub zone: String,
    pub lifecycle: String,
}

/// What ECS `DescribeInstances` says of an instance (fixed for its life).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EcsInstance {
    pub instance_type: String,
    pub zone: String,
    /// `SpotStrategy` is `SpotWithPriceLimit` or `SpotAsPriceGo`.
    pub spot: bool,
    pub host_name: String,
    pub private_ip: String,
    pub tags: BTreeMap<String, String>,
}

/// The items of an ESS/ECS list, which wraps them as `{"Outer": {"Inner": [...]}}`.
fn items<'a>(v: &'a Value, outer: &str, inner: &str) -> &'a [Value] {
    v.get(outer)
        .and_then(|o| o.get(inner))
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

fn text(v: &Value, key: &str) -> String {
    v.get(key).and_then(Value::as_str).unwrap_or("").to_string()
}

/// A JSON number, or a number in a string (ECS gives both).
fn number(v: &Value, key: &str) -> f64 {
    match v.get(key) {
        Some(Value::Number(n)) => n.as_f64().unwrap_or(0.0),
        Some(Value::String(s)) => s.parse().unwrap_or(0.0),
        _ => 0.0,
    }
}

/// One page of `DescribeScalingInstances` of `group`.
pub fn parse_scaling_instances(page: &Value, group: &str) -> Vec<ScalingInstance> {
    items(page, "ScalingInstances", "ScalingInstance")
        .iter()
        .map(|i| ScalingInstance {
            id: text(i, "InstanceId"),
            group: group.to_string(),
            zone: text(i, "ZoneId"),
            lifecycle: text(i, "LifecycleState"),
        })
        .filter(|i| !i.id.is_empty())
        .collect()
}

/// ECS `DescribeInstances`: instance id → what the Node needs.
pub fn parse_ecs_instances(v: &Value) -> BTreeMap<String, EcsInstance> {
    items(v, "Instances", "Instance")
        .iter()
        .map(|i| {
            let private_ip = i
                .pointer("/VpcAttributes/PrivateIpAddress/IpAddress/0")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            let tags = items(i, "Tags", "Tag")
                .iter()
                .map(|t| (text(t, "TagKey"), text(t, "TagValue")))
                .filter(|(k, _)| !k.is_empty())
                .collect();
            let spot = matches!(
                text(i, "SpotStrategy").as_str(),
                "SpotWithPriceLimit" | "SpotAsPriceGo"
            );
            let ecs = EcsInstance {
                instance_type: text(i, "InstanceType"),
                zone: text(i, "ZoneId"),
                spot,
                host_name: text(i, "HostName"),
                private_ip,
                tags,
            };
            (text(i, "InstanceId"), ecs)
        })
        .filter(|(id, _)| !id.is_empty())
        .collect()
}

/// ECS `DescribeInstanceTypes`: type → shape. `GPUAmount` GPUs of the `GPUSpec` vendor;
/// `GPUMemorySize` is per GPU, in GiB.
pub fn parse_instance_types(v: &Value) -> BTreeMap<String, TypeInfo> {
    items(v, "InstanceTypes", "InstanceType")
        .iter()
        .map(|t| {
            let count = number(t, "GPUAmount") as i64;
            let (vendor, model) = GpuVendor::split_name(&text(t, "GPUSpec"));
            let gpu_memory_mib = (number(t, "GPUMemorySize") * 1024.0).round() as u64;
            let (gpus, product) = match (count, vendor) {
                (0, _) => (None, None),
                (n, GpuVendor::Nvidia) => (
                    Some(("nvidia.com/gpu", n)),
                    Some(nvidia_product_label(&model, gpu_memory_mib)),
                ),
                (n, GpuVendor::Amd) => (Some(("amd.com/gpu", n)), None),
            };
            let shape = TypeInfo {
                vcpus: number(t, "CpuCoreCount") as i64,
                memory_mib: (number(t, "MemorySize") * 1024.0).round() as i64,
                gpus,
                product,
            };
            (text(t, "InstanceTypeId"), shape)
        })
        .filter(|(name, _)| !name.is_empty())
        .collect()
}

/// ACK's providerID of an instance: `<region>.<instance-id>`.
pub fn provider_id(region: &str, instance_id: &str) -> String {
    format!("{region}.{instance_id}")
}

/// The ESS and ECS APIs: their `Version`s.
const ESS_VERSION: &str = "2014-08-28";
const ECS_VERSION: &str = "2014-05-26";

/// The instance as the Node registrar needs it: ACK's providerID `<region>.<instance-id>`, named
/// after the ECS host name (lower-cased), else the instance id; the pool label from the instance's
/// `gpu-node-autoscaler.io/pool` tag, else from its group's entry in `config.pools`.
pub fn instance_view(
    inst: &ScalingInstance,
    ecs: &EcsInstance,
    config: &EssConfig,
) -> InstanceView {
    let mut tags = ecs.tags.clone();
    if let Some(pool) = config.pools.get(&inst.group) {
        tags.entry(TAG_POOL.to_string())
            .or_insert_with(|| pool.clone());
    }
    InstanceView {
        id: inst.id.clone(),
        instance_type: ecs.instance_type.clone(),
        zone: if inst.zone.is_empty() {
            ecs.zone.clone()
        } else {
            inst.zone.clone()
        },
        private_dns: ecs.host_name.to_ascii_lowercase(),
        private_ip: ecs.private_ip.clone(),
        spot: ecs.spot,
        tags,
        provider_id: provider_id(&config.region, &inst.id),
        region: config.region.clone(),
    }
}

/// The bridge: lists the scaling groups' instances, asks ECS about them, registers their Nodes.
pub struct Bridge {
    config: EssConfig,
    client: Client,
    /// Where ESS and ECS answer.
    ess_endpoint: String,
    ecs_endpoint: String,
    /// ECS's answers, per instance id (asked once per instance).
    ecs: HashMap<String, EcsInstance>,
    /// ECS's instance types (asked once per type).
    types: HashMap<String, TypeInfo>,
    registrar: Registrar,
}

fn params(pairs: &[(&str, String)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

impl Bridge {
    pub fn new(config: EssConfig, style: NodeStyle) -> Result<Bridge, String> {
        let client = Client::new(&config.region, config.credentials.clone())?;
        let ess_endpoint =
            (config.endpoint.clone()).unwrap_or_else(|| "https://ess.aliyuncs.com".to_string());
        let ecs_endpoint = (config.endpoint.clone())
            .unwrap_or_else(|| format!("https://ecs.{}.aliyuncs.com", config.region));
        let registrar =
            Registrar::new("ess", config.boot_delay, config.device_plugin_delay).with_style(style);
        Ok(Bridge {
            config,
            client,
            ess_endpoint,
            ecs_endpoint,
            ecs: HashMap::new(),
            types: HashMap::new(),
            registrar,
        })
    }

    async fn ess(&self, action: &str, p: &[(&str, String)]) -> Result<Value, String> {
        (self.client)
            .call(&self.ess_endpoint, ESS_VERSION, action, &params(p))
            .await
    }

    async fn ecs(&self, action: &str, p: &[(String, String)]) -> Result<Value, String> {
        (self.client)
            .call(&self.ecs_endpoint, ECS_VERSION, action, p)
            .await
    }

    /// The scaling instances of every group (every page), those that have Nodes.
    async fn list(&self) -> Result<Vec<ScalingInstance>, String> {
        const PAGE: u32 = 50;
        let mut out = Vec::new();
        for group in &self.config.scaling_groups {
            for page in 1.. {
                let v = self
                    .ess(
                        "DescribeScalingInstances",
                        &[
                            ("ScalingGroupId", group.clone()),
                            ("PageNumber", page.to_string()),
                            ("PageSize", PAGE.to_string()),
                        ],
                    )
                    .await?;
                let found = parse_scaling_instances(&v, group);
                let n = found.len();
                out.extend(found.into_iter().filter(|i| has_node(&i.lifecycle)));
                if n == 0 || f64::from(page * PAGE) >= number(&v, "TotalCount") {
                    break;
                }
            }
        }
        Ok(out)
    }

    /// ECS `DescribeInstances` of the instances not yet known (≤ 100 per call).
    async fn learn_instances(&mut self, ids: &[String]) -> Result<(), String> {
        for chunk in ids.chunks(100) {
            let p = params(&[
                ("InstanceIds", json!(chunk).to_string()),
                ("PageSize", "100".to_string()),
            ]);
            let v = self.ecs("DescribeInstances", &p).await?;
            self.ecs.extend(parse_ecs_instances(&v));
        }
        Ok(())
    }

    /// ECS `DescribeInstanceTypes` of the types not yet known (≤ 10 per call).
    async fn learn_types(&mut self, types: &[String]) -> Result<(), String> {
        for chunk in types.chunks(10) {
            let mut p: Vec<(String, String)> = chunk
                .iter()
                .enumerate()
                .map(|(i, t)| (format!("InstanceTypes.{}", i + 1), t.clone()))
                .collect();
            p.push(("MaxResults".into(), "100".into()));
            let v = self.ecs("DescribeInstanceTypes", &p).await?;
            self.types.extend(parse_instance_types(&v));
        }
        Ok(())
    }

    /// One poll against kube-sim's store.
    async fn poll(&mut self, app: &App) -> Option<Instant> {
        let (views, types_known) = self.observe().await?;
        self.reconcile(&mut *app.store(), &views, types_known)
    }
}

impl CloudBridge for Bridge {
    fn poll_interval(&self) -> Duration {
        self.config.poll
    }

    /// The groups' instances and what ECS says of the new ones.
    async fn observe(&mut self) -> Option<(Vec<InstanceView>, bool)> {
        let listed = match self.list().await {
            Ok(i) => i,
            Err(e) => {
                eprintln!("kube-sim: ess bridge: {e}");
                return None;
            }
        };
        let unknown: Vec<String> = listed
            .iter()
            .filter(|i| !self.ecs.contains_key(&i.id))
            .map(|i| i.id.clone())
            .collect();
        if let Err(e) = self.learn_instances(&unknown).await {
            eprintln!("kube-sim: ess bridge: {e}");
        }
        // An instance ECS does not know yet is seen at a later poll: it has no Node so far.
        let views: Vec<InstanceView> = listed
            .iter()
            .filter_map(|i| Some(instance_view(i, self.ecs.get(&i.id)?, &self.config)))
            .collect();
        let due_types: Vec<String> = self
            .registrar
            .track(&views)
            .into_iter()
            .filter(|t| !self.types.contains_key(t))
            .collect();
        let types_known = match self.learn_types(&due_types).await {
            Ok(()) => true,
            Err(e) => {
                eprintln!("kube-sim: ess bridge: {e}");
                false
            }
        };
        let listed_ids: HashSet<&str> = listed.iter().map(|i| i.id.as_str()).collect();
        self.ecs.retain(|id, _| listed_ids.contains(id.as_str()));
        Some((views, types_known))
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
pub async fn run(app: Arc<App>, config: EssConfig) {
    let mut bridge = match Bridge::new(config, NodeStyle::KubeSim) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("kube-sim: ess bridge: {e}");
            return;
        }
    };
    loop {
        let started = Instant::now();
        let due = bridge.poll(&app).await;
        sleep_until_next_poll(started, bridge.config.poll, due).await;
    }
}

#[cfg(test)]
use gpu_node_autoscaler_test_support::ess as fake;

#[cfg(test)]
mod tests {
    use super::fake::{Fake, FakeInstance, KEY_ID, REGION, SECRET, TOKEN};
    use super::*;
    use crate::resources::{NODES, PODS};
    use crate::store::Store;

    fn credentials() -> Credentials {
        let mut c = Credentials::new(KEY_ID, SECRET);
        c.security_token = Some(TOKEN.to_string());
        c
    }

    #[test]
    fn provider_ids_and_gpu_names_read_as_the_provider_reads_them() {
        assert_eq!(
            provider_id(REGION, "i-abc"),
            gpu_node_autoscaler_alibaba::provider_id(REGION, "i-abc")
        );
        for spec in ["NVIDIA A10", "AMD MI300X", "T4", " nvidia  V100 "] {
            assert_eq!(
                GpuVendor::split_name(spec),
                gpu_node_autoscaler_alibaba::gpu_model(spec)
            );
        }
    }

    fn config() -> EssConfig {
        let mut c = EssConfig::new(REGION, &["asg-spot"], credentials());
        c.pools.insert("asg-spot".into(), "a10".into());
        c
    }

    #[test]
    fn listings_are_parsed() {
        let page = json!({"TotalCount": 2, "ScalingInstances": {"ScalingInstance": [
            {"InstanceId": "i-1", "ZoneId": "cn-hangzhou-i", "LifecycleState": "InService"},
            {"InstanceId": "i-2", "ZoneId": "cn-hangzhou-j", "LifecycleState": "Removing"},
        ]}});
        let found = parse_scaling_instances(&page, "asg-spot");
        assert_eq!(found.len(), 2);
        assert_eq!(found[1].zone, "cn-hangzhou-j");
        assert_eq!(found[0].group, "asg-spot");
        assert!(has_node(&found[0].lifecycle) && !has_node(&found[1].lifecycle));
        assert!(has_node("Pending:Wait") && !has_node("Stopped"));

        let ecs = parse_ecs_instances(&json!({"Instances": {"Instance": [
            {"InstanceId": "i-1", "InstanceType": "ecs.gn7i-c8g1.2xlarge", "ZoneId": "cn-hangzhou-i",
             "SpotStrategy": "SpotAsPriceGo", "HostName": "iZbp1Z",
             "VpcAttributes": {"PrivateIpAddress": {"IpAddress": ["192.168.0.7"]}},
             "Tags": {"Tag": [{"TagKey": TAG_POOL, "TagValue": "tagged"}]}},
            {"InstanceId": "i-2", "InstanceType": "ecs.g7.large", "SpotStrategy": "NoSpot"},
        ]}}));
        assert!(ecs["i-1"].spot && !ecs["i-2"].spot);
        assert_eq!(ecs["i-1"].private_ip, "192.168.0.7");
        assert_eq!(ecs["i-1"].tags[TAG_POOL], "tagged");
        assert_eq!(ecs["i-2"].host_name, "");

        let types = parse_instance_types(&json!({"InstanceTypes": {"InstanceType": [
            {"InstanceTypeId": "ecs.gn7i-c8g1.2xlarge", "CpuCoreCount": 8, "MemorySize": 30.0,
             "GPUAmount": 1, "GPUSpec": "NVIDIA A10", "GPUMemorySize": 24.0},
            {"InstanceTypeId": "ecs.gn8v.mi", "CpuCoreCount": "16", "MemorySize": "64",
             "GPUAmount": "2", "GPUSpec": "AMD MI308X"},
            {"InstanceTypeId": "ecs.g7.large", "CpuCoreCount": 2, "MemorySize": 8.0,
             "GPUAmount": 0, "GPUSpec": ""},
        ]}}));
        assert_eq!(
            types["ecs.gn7i-c8g1.2xlarge"].gpus,
            Some(("nvidia.com/gpu", 1))
        );
        assert_eq!(
            types["ecs.gn7i-c8g1.2xlarge"].product.as_deref(),
            Some("NVIDIA-A10")
        );
        assert_eq!(types["ecs.gn7i-c8g1.2xlarge"].memory_mib, 30 * 1024);
        assert_eq!(types["ecs.gn8v.mi"].gpus, Some(("amd.com/gpu", 2)));
        assert_eq!(types["ecs.gn8v.mi"].vcpus, 16);
        assert_eq!(types["ecs.g7.large"].gpus, None);
        assert_eq!(types["ecs.g7.large"].product, None);
    }

    #[test]
    fn view_of_a_scaling_instance() {
        let inst = ScalingInstance {
            id: "i-bp1abc".into(),
            group: "asg-spot".into(),
            zone: "cn-hangzhou-i".into(),
            lifecycle: "InService".into(),
        };
        let mut ecs = EcsInstance {
            instance_type: "ecs.gn7i-c8g1.2xlarge".into(),
            zone: "cn-hangzhou-j".into(),
            spot: true,
            ..EcsInstance::default()
        };
        let v = instance_view(&inst, &ecs, &config());
        assert_eq!(v.node_name(), "i-bp1abc");
        assert_eq!(v.provider_id, "cn-hangzhou.i-bp1abc");
        assert_eq!(v.zone, "cn-hangzhou-i", "the scaling listing's zone first");
        assert_eq!(v.region, "cn-hangzhou");
        assert_eq!(v.instance_type, "ecs.gn7i-c8g1.2xlarge");
        assert!(v.spot);
        assert_eq!(v.tags[TAG_POOL], "a10", "from the group's pool mapping");

        ecs.host_name = "iZbp1abcZ".into();
        ecs.private_ip = "192.168.0.7".into();
        ecs.tags.insert(TAG_POOL.into(), "tagged".into());
        let v = instance_view(&inst, &ecs, &config());
        assert_eq!(v.node_name(), "izbp1abcz");
        assert_eq!(v.private_ip, "192.168.0.7");
        assert_eq!(v.tags[TAG_POOL], "tagged", "the instance's tag first");
        // Neither a tag nor a mapping: no pool.
        ecs.tags.clear();
        let mut other = config();
        other.pools.clear();
        let v = instance_view(&inst, &ecs, &other);
        assert!(!v.tags.contains_key(TAG_POOL));
    }

    #[test]
    fn pool_mappings_parse() {
        assert_eq!(
            parse_pool_mapping("asg-1=a10"),
            Ok(("asg-1".to_string(), "a10".to_string()))
        );
        for bad in ["asg-1", "=a10", "asg-1=", ""] {
            assert!(parse_pool_mapping(bad).is_err(), "{bad:?}");
        }
    }

    fn instance(id: &str, zone: &str, spot: bool) -> FakeInstance {
        FakeInstance {
            id: id.into(),
            zone: zone.into(),
            activity: "asa-test".into(),
            instance_type: "ecs.gn7i-c8g1.2xlarge".into(),
            spot_strategy: if spot { "SpotAsPriceGo" } else { "NoSpot" }.into(),
            tags: Default::default(),
        }
    }

    fn node(app: &App, name: &str) -> Option<Value> {
        app.store().get(NODES, "", name).ok()
    }

    /// Polls `f` until it returns Some; fails after a generous timeout.
    async fn eventually<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(t) = f() {
                return t;
            }
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn scaling_instances_of_the_fake_become_nodes_and_go_with_their_instances() {
        let fake = Fake::start(&[
            ("asg-spot", &["cn-hangzhou-i", "cn-hangzhou-j"]),
            ("asg-od", &["cn-hangzhou-i"]),
            ("asg-other", &["cn-hangzhou-i"]),
        ])
        .await;
        fake.with(|s| {
            let g = s.groups.get_mut("asg-spot").unwrap();
            g.instances.push(instance("i-spot1", "cn-hangzhou-j", true));
            // Another group's instances: not the cluster's.
            for n in 0..3 {
                let other = s.groups.get_mut("asg-other").unwrap();
                other
                    .instances
                    .push(instance(&format!("i-other{n}"), "cn-hangzhou-i", true));
            }
        });
        let app = Arc::new(App::new(
            Store::new(1000),
            "127.0.0.1:0".parse().unwrap(),
            Duration::from_secs(30),
            crate::Faults::default(),
            1,
        ));
        let mut config = EssConfig::new(REGION, &["asg-spot", "asg-od"], credentials());
        config.endpoint = Some(fake.url.clone());
        config.pools.insert("asg-spot".into(), "a10".into());
        config.pools.insert("asg-od".into(), "a10".into());
        config.boot_delay = Duration::from_millis(300);
        config.device_plugin_delay = Duration::from_millis(300);
        config.poll = Duration::from_millis(100);
        let bridge = tokio::spawn(run(app.clone(), config));

        // The spot instance: a Node, then its GPU.
        let n = eventually("the spot instance's Node", || node(&app, "i-spot1")).await;
        assert_eq!(n["spec"]["providerID"], "cn-hangzhou.i-spot1");
        let l = &n["metadata"]["labels"];
        assert_eq!(l["topology.kubernetes.io/zone"], "cn-hangzhou-j");
        assert_eq!(l["topology.kubernetes.io/region"], "cn-hangzhou");
        assert_eq!(l["gpu-node-autoscaler.io/capacity-type"], "spot");
        assert_eq!(l["nvidia.com/gpu.product"], "NVIDIA-A10");
        assert_eq!(n["status"]["capacity"]["cpu"], "8");
        assert_eq!(n["status"]["capacity"]["memory"], "30720Mi");
        assert_eq!(l["karpenter.sh/capacity-type"], "spot");
        assert_eq!(l[TAG_POOL], "a10");
        assert_eq!(
            l["node.kubernetes.io/instance-type"],
            "ecs.gn7i-c8g1.2xlarge"
        );
        assert!(
            n["status"]["allocatable"].get("nvidia.com/gpu").is_none(),
            "GPUs only after the device-plugin delay: {n}"
        );
        eventually("the GPU to be advertised", || {
            node(&app, "i-spot1").filter(|n| n["status"]["allocatable"]["nvidia.com/gpu"] == "1")
        })
        .await;

        // A second group's on-demand instances, more than a page of them.
        fake.with(|s| {
            let g = s.groups.get_mut("asg-od").unwrap();
            for n in 1..=55 {
                g.instances
                    .push(instance(&format!("i-od{n}"), "cn-hangzhou-i", false));
            }
        });
        let od = eventually("the last on-demand instance's Node", || {
            node(&app, "i-od55")
        })
        .await;
        assert_eq!(
            od["metadata"]["labels"]["karpenter.sh/capacity-type"],
            "on-demand"
        );
        assert_eq!(app.store().count(NODES), 56, "only the configured groups");

        // A pod bound to the spot node goes with it.
        app.store()
            .create(
                PODS,
                "default",
                json!({"apiVersion": "v1", "kind": "Pod",
                       "metadata": {"name": "job", "namespace": "default"},
                       "spec": {"nodeName": "i-spot1",
                                "containers": [{"name": "main", "image": "cuda:12"}]}}),
                false,
            )
            .unwrap();

        // A failed poll (the group is unknown to ESS for a while) deletes nothing.
        let saved = fake.with(|s| s.groups.remove("asg-spot").unwrap());
        let calls = fake.with(|s| s.calls_of("DescribeScalingInstances").len());
        eventually("three more failed polls", || {
            let now = fake.with(|s| s.calls_of("DescribeScalingInstances").len());
            (now >= calls + 3).then_some(())
        })
        .await;
        assert!(node(&app, "i-spot1").is_some());
        assert!(node(&app, "i-od1").is_some());

        // The instance leaves its group (RemoveInstances): its Node and pod go.
        fake.with(|s| {
            let mut g = saved;
            g.instances.retain(|i| i.id != "i-spot1");
            s.groups.insert("asg-spot".into(), g);
        });
        eventually("the removed instance's Node to go", || {
            node(&app, "i-spot1").is_none().then_some(())
        })
        .await;
        assert!(app.store().get(PODS, "default", "job").is_err());
        assert!(node(&app, "i-od1").is_some());

        // Every request was signed and well-formed; ECS was asked once per instance and type.
        let (violations, described, typed) = fake.with(|s| {
            (
                s.violations.clone(),
                s.calls_of("DescribeInstances"),
                s.calls_of("DescribeInstanceTypes"),
            )
        });
        assert!(violations.is_empty(), "{violations:#?}");
        assert_eq!(described.len(), 2, "{described:?}");
        assert_eq!(typed.len(), 1, "{typed:?}");
        assert_eq!(typed[0]["InstanceTypes.1"], "ecs.gn7i-c8g1.2xlarge");
        bridge.abort();
    }
}
