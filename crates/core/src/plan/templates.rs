//! Node templates: what a new node of a pool's instance type would look like (labels, taints,
//! allocatable after reservations and DaemonSet pods) and the offerings it can be bought as.

use crate::hash::HashMap;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use gpu_node_autoscaler_provider::{CapacityType, Catalog, GpuVendor, InstanceType, OfferingKey};

use crate::model::constraints::Taint;
use crate::model::gpu::{self, parse_mig_profile};
use crate::model::labels;
use crate::model::mig::{self, LayoutError, MigGpu};
use crate::model::resources::{Resources, SharedGpu, MIG_PREFIX};
use crate::model::{Node, Pod, Snapshot, Time};
use crate::policy::{GpuMode, Policy, PolicyError, Pool};

/// One way to buy a node of a template.
#[derive(Clone, Debug, PartialEq)]
pub struct TemplateOffering {
    pub key: OfferingKey,
    pub price: f64,
    /// The cloud has it and it is not in the insufficient-capacity cache.
    pub available: bool,
    /// Every label a node bought this way carries.
    pub labels: Arc<BTreeMap<String, String>>,
}

/// A pool × instance type.
#[derive(Clone, Debug, PartialEq)]
pub struct Template {
    pub pool: usize,
    pub pool_name: String,
    pub priority: i32,
    pub instance_type: String,
    /// What pods can use on a new node: capacity less reservations and DaemonSet pods.
    pub allocatable: Resources,
    /// The registered node whose CPU, memory and pods `allocatable` was learned from, when
    /// registered nodes of this pool and type offer other than the catalog and the pool's
    /// reservations say.
    pub learned_from: Option<String>,
    /// Shared-GPU pools: one entry per GPU.
    pub shared: Vec<SharedGpu>,
    /// Physical GPUs per node, for GPU limits.
    pub gpus: u32,
    pub taints: Vec<Taint>,
    /// In preference order: the pool's capacity-type order, then price, then zone.
    pub offerings: Vec<TemplateOffering>,
    /// Devices a new node publishes in ResourceSlices (pools with `dra`), predicted.
    pub devices: Arc<Vec<crate::model::dra::Device>>,
}

impl Template {
    /// Indices of offerings in preference order that are set in `mask`.
    pub fn offerings_in(&self, mask: u64) -> impl Iterator<Item = &TemplateOffering> {
        self.offerings
            .iter()
            .enumerate()
            .filter(move |(i, _)| mask & (1u64 << i) != 0)
            .map(|(_, o)| o)
    }

    /// Price of the preferred offering in `mask`.
    pub fn price(&self, mask: u64) -> f64 {
        if mask == 0 {
            return f64::INFINITY;
        }
        self.offerings[mask.trailing_zeros() as usize].price
    }

    /// Its offerings in capacity reservations.
    pub fn reserved_mask(&self) -> u64 {
        self.offerings
            .iter()
            .enumerate()
            .filter(|(_, o)| o.key.capacity_type == CapacityType::Reserved)
            .fold(0, |m, (i, _)| m | (1u64 << i))
    }

    pub fn available_mask(&self) -> u64 {
        self.offerings
            .iter()
            .enumerate()
            .filter(|(_, o)| o.available)
            .fold(0, |m, (i, _)| m | (1u64 << i))
    }

    pub fn zone_mask(&self, zone: &str) -> u64 {
        self.offerings
            .iter()
            .enumerate()
            .filter(|(_, o)| o.key.zone == zone)
            .fold(0, |m, (i, _)| m | (1u64 << i))
    }
}

/// The template a registered node was launched from (its pool and instance-type labels).
pub fn template_of_node(node: &crate::model::Node, templates: &[Template]) -> Option<usize> {
    let pool = node.pool()?;
    let it = node.instance_type()?;
    templates
        .iter()
        .position(|t| t.pool_name == pool && t.instance_type == it)
}

/// A provider pool's instance type names (listed, or resolved from `catalog` by the pool's
/// requirements) and the on-demand price of each that has one (the pool's `prices`, else the
/// catalog's list price).
pub fn pool_types_and_prices(
    pool: &Pool,
    catalog: &Catalog,
) -> Result<(Vec<String>, BTreeMap<String, f64>), String> {
    let types: Vec<String> = match &pool.instance_types {
        Some(listed) => listed.clone(),
        None => pool_instance_types(pool, catalog)?
            .into_iter()
            .map(|t| t.name.clone())
            .collect(),
    };
    let prices = types
        .iter()
        .filter_map(|t| {
            pool.prices
                .get(t)
                .and_then(|p| p.on_demand)
                .or_else(|| catalog.instance_type(t).and_then(|i| i.on_demand_price))
                .map(|p| (t.clone(), p))
        })
        .collect();
    Ok((types, prices))
}

/// Most offerings one template may have (zones × capacity types).
pub const MAX_OFFERINGS: usize = 64;

/// The instance types of `catalog` a pool may use, in catalog order.
pub fn pool_instance_types<'a>(
    pool: &Pool,
    catalog: &'a Catalog,
) -> Result<Vec<&'a InstanceType>, String> {
    let mut out = Vec::new();
    match &pool.instance_types {
        Some(names) => {
            for n in names {
                let t = catalog.instance_type(n).ok_or_else(|| {
                    format!(
                        "pool {}: instance type {n:?} is not in the catalog",
                        pool.name
                    )
                })?;
                if let Some(r) = &pool.requirements {
                    if !r.admits(t) {
                        continue;
                    }
                }
                out.push(t);
            }
        }
        // The types its groups launch (that its requirements admit, if any).
        None if !pool.cloud_templates.is_empty() => {
            let r = pool.requirements.as_ref();
            out.extend(catalog.instance_types.iter().filter(|t| {
                pool.cloud_templates
                    .iter()
                    .any(|g| g.instance_types.contains(&t.name))
                    && r.is_none_or(|r| r.admits(t))
            }));
        }
        None => {
            let r = pool.requirements.as_ref();
            out.extend(
                catalog
                    .instance_types
                    .iter()
                    .filter(|t| r.is_some_and(|r| r.admits(t))),
            );
        }
    }
    if out.is_empty() && !pool.cloud_templates.is_empty() && pool.instance_types.is_none() {
        return Err(format!(
            "pool {}: no instance type its groups launch ({}) is in the catalog{}",
            pool.name,
            cloud_types(pool).join(", "),
            if pool.requirements.is_some() {
                " and admitted by its requirements"
            } else {
                ""
            }
        ));
    }
    if out.is_empty() {
        return Err(format!(
            "pool {}: no instance type of the catalog matches its instanceTypes/requirements",
            pool.name
        ));
    }
    Ok(out)
}

/// Every instance type a pool's groups launch, in their order.
fn cloud_types(pool: &Pool) -> Vec<&str> {
    let mut out: Vec<&str> = Vec::new();
    for t in pool.cloud_templates.iter().flat_map(|g| &g.instance_types) {
        if !out.contains(&t.as_str()) {
            out.push(t);
        }
    }
    out
}

/// Whether a pool's instance types are still to be read from the cloud: its templates come from
/// there, none was read yet, and its policy neither lists types nor gives requirements (it plans
/// nothing until then, without an error).
pub fn awaits_cloud_templates(pool: &Pool) -> bool {
    pool.templates_from_cloud
        && pool.cloud_templates.is_empty()
        && pool.instance_types.is_none()
        && pool.requirements.is_none()
}

/// The taints of a pool's nodes of instance type `t`: the pool's `taints`, else (its templates
/// from the cloud) those of every group launching `t`, each once.
fn template_taints(pool: &Pool, t: &str) -> Vec<Taint> {
    if !pool.taints.is_empty() {
        return pool.taints.clone();
    }
    let mut out: Vec<Taint> = Vec::new();
    for g in pool
        .cloud_templates
        .iter()
        .filter(|g| g.instance_types.iter().any(|x| x == t))
    {
        for (key, value, effect) in &g.taints {
            let Some(effect) = crate::model::constraints::Effect::parse(effect) else {
                continue;
            };
            let taint = Taint {
                key: key.clone(),
                value: value.clone(),
                effect,
            };
            if !out.contains(&taint) {
                out.push(taint);
            }
        }
    }
    out
}

/// Labels of a node of this pool and type bought as `key` (pool labels win, then the labels of
/// the first of its cloud groups that launches `key`).
fn node_labels(
    pool: &Pool,
    t: &InstanceType,
    key: &OfferingKey,
    region: Option<&str>,
) -> BTreeMap<String, String> {
    let mut l = BTreeMap::new();
    l.insert(labels::INSTANCE_TYPE.into(), t.name.clone());
    l.insert(labels::ZONE.into(), key.zone.clone());
    if let Some(r) = region {
        l.insert(labels::REGION.into(), r.to_string());
    }
    l.insert(labels::POOL.into(), pool.name.clone());
    l.insert(
        labels::CAPACITY_TYPE.into(),
        key.capacity_type.as_str().into(),
    );
    l.insert(
        labels::KARPENTER_CAPACITY_TYPE.into(),
        key.capacity_type.as_str().into(),
    );
    l.insert(labels::ARCH.into(), "amd64".into());
    l.insert(labels::OS.into(), "linux".into());
    if let Some(g) = &t.gpu {
        l.insert(labels::GPU_MODEL.into(), g.model.clone());
        if g.vendor == GpuVendor::Nvidia {
            l.insert(
                labels::NVIDIA_PRODUCT.into(),
                gpu::nvidia_product_label(&g.model, g.memory_mib),
            );
            l.insert(labels::NVIDIA_COUNT.into(), g.count.to_string());
            l.insert(
                labels::AWS_ACCELERATOR.into(),
                gpu::aws_accelerator_label(&g.model),
            );
        }
    }
    if let Some(g) = pool.cloud_templates.iter().find(|g| g.serves(key)) {
        for (k, v) in &g.labels {
            l.insert(k.clone(), v.clone());
        }
    }
    for (k, v) in &pool.labels {
        l.insert(k.clone(), v.clone());
    }
    l
}

/// The resources a pool's cloud groups launching `t` advertise besides the instance type's
/// (their `node-template/resources` tags): each that the instance type does not give already,
/// from the first such group; cpu, memory and pods stay the instance type's.
fn add_group_resources(pool: &Pool, t: &str, alloc: &mut Resources) {
    use crate::model::resources::{CPU, MEMORY, PODS};
    for g in pool
        .cloud_templates
        .iter()
        .filter(|g| g.instance_types.iter().any(|x| x == t))
    {
        for (name, q) in &g.resources {
            if [CPU, MEMORY, PODS].contains(&name.as_str()) || alloc.get(name) != 0 {
                continue;
            }
            if let Ok(n) = crate::model::quantity::parse_quantity(q).and_then(|q| q.to_units_ceil())
            {
                if n > 0 {
                    alloc.set(name, n);
                }
            }
        }
    }
}

/// Allocatable of an empty node, before DaemonSet pods.
fn base_allocatable(pool: &Pool, t: &InstanceType) -> Result<(Resources, Vec<SharedGpu>), String> {
    let mut r = Resources {
        cpu_milli: (t.vcpu as i64 * 1000 - pool.reserved_cpu_milli).max(0),
        memory: ((t.memory_mib as i64) << 20)
            .saturating_sub(pool.reserved_memory)
            .max(0),
        pods: pool.max_pods as i64,
        ..Default::default()
    };
    let mut shared = Vec::new();
    if let Some(g) = &t.gpu {
        match &pool.gpu_mode {
            // Published as devices in ResourceSlices instead (see `dra::predicted_devices`).
            GpuMode::Whole if pool.dra.is_some() => {}
            GpuMode::Whole => match g.vendor {
                GpuVendor::Nvidia => r.gpu = g.count as i64,
                GpuVendor::Amd => r.amd_gpu = g.count as i64,
            },
            GpuMode::Mig(layout) => {
                if !gpu::supports_mig(&g.model) {
                    return Err(format!(
                        "pool {}: {} has {} GPUs, which do not support MIG",
                        pool.name, t.name, g.model
                    ));
                }
                if let Some(table) = mig::mig_gpu(&g.model, g.memory_mib) {
                    if let Err(e) = table.check(&layout_map(layout)) {
                        return Err(format!(
                            "pool {}: migLayout: {}",
                            pool.name,
                            mig_layout_message(&e, table, &t.name)
                        ));
                    }
                } else {
                    // A model without a table: its profiles' gigabytes within the GPU's.
                    let gb: u32 = layout
                        .iter()
                        .filter_map(|(p, n)| parse_mig_profile(p).map(|p| p.memory_gb * n))
                        .sum();
                    let have = (g.memory_mib / 1024) as u32;
                    if gb > have + have / 10 {
                        return Err(format!(
                            "pool {}: MIG layout needs {gb} GB per GPU but a {} GPU of {} has {have} GB",
                            pool.name, g.model, t.name
                        ));
                    }
                }
                for (profile, n) in layout {
                    if pool.dra.is_none() {
                        r.set(
                            &format!("{MIG_PREFIX}{profile}"),
                            *n as i64 * g.count as i64,
                        );
                    }
                }
            }
            GpuMode::Shared { core_percentage } => {
                let mem_gib = (g.memory_mib / 1024) as i64;
                shared = (0..g.count)
                    .map(|_| SharedGpu {
                        mem_gib,
                        core_pct: *core_percentage as i64,
                    })
                    .collect();
            }
        }
    }
    Ok((r, shared))
}

/// The GPU resources a Node of `t` in `pool` advertises through its device plugins, by resource
/// name: `nvidia.com/gpu` or `amd.com/gpu` for whole GPUs; `nvidia.com/mig-<profile>` per MIG
/// profile of the pool's layout; `aliyun.com/gpu-mem` (GiB), `aliyun.com/gpu-count` and
/// `aliyun.com/gpu-core.percentage` for shared GPUs; nothing where a DRA driver publishes the GPUs
/// instead. The Node that [`crate::convert`] reads back from these has the GPUs of the pool's
/// template: one source for what a kwok Node, a peer's node template and our template offer.
pub fn advertised_gpu_resources(
    pool: &Pool,
    t: &InstanceType,
) -> Result<BTreeMap<String, i64>, String> {
    use crate::model::resources::{
        ALIYUN_GPU_CORE, ALIYUN_GPU_COUNT, ALIYUN_GPU_MEM, AMD_GPU, NVIDIA_GPU,
    };
    let (r, shared) = base_allocatable(pool, t)?;
    let mut out: BTreeMap<String, i64> = r
        .mig_slices()
        .map(|(profile, n)| (format!("{MIG_PREFIX}{profile}"), n))
        .collect();
    for (k, v) in [(NVIDIA_GPU, r.gpu), (AMD_GPU, r.amd_gpu)] {
        if v > 0 {
            out.insert(k.to_string(), v);
        }
    }
    if !shared.is_empty() {
        out.insert(
            ALIYUN_GPU_MEM.to_string(),
            shared.iter().map(|g| g.mem_gib).sum(),
        );
        out.insert(ALIYUN_GPU_COUNT.to_string(), shared.len() as i64);
        out.insert(
            ALIYUN_GPU_CORE.to_string(),
            shared.iter().map(|g| g.core_pct).sum(),
        );
    }
    Ok(out)
}

/// One representative pod per DaemonSet seen in the cluster (the largest request wins).
pub fn daemonset_pods(snapshot: &Snapshot) -> Vec<&Pod> {
    let mut by_owner: BTreeMap<(&str, &str), &Pod> = BTreeMap::new();
    for p in &snapshot.pods {
        let Some(o) = &p.owner else { continue };
        if !p.is_daemonset() || p.phase.is_terminal() {
            continue;
        }
        let k = (p.id.namespace.as_str(), o.name.as_str());
        let e = by_owner.entry(k).or_insert(p);
        if p.requests > e.requests {
            *e = p;
        }
    }
    by_owner.into_values().collect()
}

/// Every template of every pool as the policy and catalog define them: built once, corrected by
/// what registered nodes offer ([`Templates::learn_from`]), then adjusted per plan for DaemonSets
/// and availability ([`Templates::for_snapshot`]).
#[derive(Clone, Debug)]
pub struct Templates {
    templates: Vec<Template>,
    /// Allocatable of each template as the catalog and the policy give it.
    from_catalog: Vec<Resources>,
    pub errors: Vec<String>,
    /// The last plan's templates and what made them (see [`Templates::for_snapshot`]).
    memo: Memo,
    /// Per pool that lists `reserved`: its reservation selectors and Capacity Block drain lead.
    reserving: BTreeMap<usize, Pool>,
    /// Each template's index by pool and instance type (the list never changes after
    /// [`Templates::new`]).
    by_name: HashMap<String, HashMap<String, usize>>,
}

/// Whether `pool` may launch into reservation `r` at `now`: it selects it, it has started, and,
/// a Capacity Block, it is not within the pool's `capacityBlockDrainLead` of its end (a node
/// launched then would be drained at once).
pub fn launchable(pool: &Pool, r: &gpu_node_autoscaler_provider::Reservation, now: Time) -> bool {
    if !pool.selects_reservation(r) {
        return false;
    }
    let lead = i64::try_from(pool.capacity_block_drain_lead.as_millis()).unwrap_or(i64::MAX);
    let end = match (r.kind, r.end_ms) {
        (gpu_node_autoscaler_provider::ReservationKind::CapacityBlock, Some(e)) => {
            Some(e.saturating_sub(lead))
        }
        (_, e) => e,
    };
    r.start_ms.is_none_or(|s| s <= now.0) && end.is_none_or(|e| now.0 < e)
}

/// Until when the nodes `pool` would launch now into reserved offering `key` may run: the
/// latest of the reservations it may launch into that have room, where a Capacity Block's nodes
/// run until its `capacityBlockDrainLead` before its end and any other reservation's run on
/// (`None`: without end, or no such reservation). Launches name the reservations of an offering
/// latest end first ([`crate::autoscaler::fleet::launch_reservations`]).
pub fn reserved_until(
    pool: &Pool,
    reservations: &[gpu_node_autoscaler_provider::Reservation],
    key: &OfferingKey,
    now: Time,
) -> Option<i64> {
    let lead = i64::try_from(pool.capacity_block_drain_lead.as_millis()).unwrap_or(i64::MAX);
    reservations
        .iter()
        .filter(|r| r.available > 0 && r.offering() == *key && launchable(pool, r, now))
        .map(|r| match (r.kind, r.end_ms) {
            (gpu_node_autoscaler_provider::ReservationKind::CapacityBlock, Some(e)) => {
                e.saturating_sub(lead)
            }
            _ => i64::MAX,
        })
        .max()
        .filter(|&e| e < i64::MAX)
}

/// How many instances of each reserved offering the policy's pools may still launch at `now`
/// (the reservations they select, counted once each).
pub fn reserved_counts(
    policy: &Policy,
    snapshot: &Snapshot,
    now: Time,
) -> BTreeMap<OfferingKey, i64> {
    let mut out = BTreeMap::new();
    for r in &snapshot.reservations {
        if r.available > 0 && policy.pools.iter().any(|p| launchable(p, r, now)) {
            *out.entry(r.offering()).or_insert(0) += i64::from(r.available);
        }
    }
    out
}

/// Per template, what a plan adjusts: the DaemonSet requests taken from its allocatable and
/// the mask of its offerings that are unavailable.
type Adjustments = Vec<(Resources, u64)>;

/// The templates of the last plan, by the adjustments that made them: most passes see the same
/// DaemonSets and unavailable offerings as the one before, and share its templates instead of
/// copying them again. A clone starts empty (its templates may learn apart).
#[derive(Default)]
struct Memo(std::sync::Mutex<Option<(Adjustments, Arc<Vec<Template>>)>>);

impl Clone for Memo {
    fn clone(&self) -> Memo {
        Memo::default()
    }
}

impl std::fmt::Debug for Memo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Memo")
    }
}

/// What a template learned from registered nodes.
#[derive(Clone, Debug, PartialEq)]
pub struct Learned {
    pub pool: String,
    pub instance_type: String,
    pub node: String,
    /// Allocatable before and after.
    pub was: Resources,
    pub now: Resources,
}

impl Templates {
    /// Errors (a pool naming a type the catalog lacks, a MIG layout that does not fit the GPU,
    /// ...) are kept per pool; the other pools still plan.
    pub fn new(policy: &Policy, catalog: &Catalog) -> Templates {
        let mut prices: BTreeMap<&OfferingKey, (f64, bool)> = BTreeMap::new();
        for o in &catalog.offerings {
            prices.insert(&o.key, (o.price_per_hour, o.available));
        }
        let mut out = Vec::new();
        let mut errors = Vec::new();
        for (pi, pool) in policy.pools.iter().enumerate() {
            if awaits_cloud_templates(pool) {
                continue;
            }
            let types = match pool_instance_types(pool, catalog) {
                Ok(t) => t,
                Err(e) => {
                    errors.push(e);
                    continue;
                }
            };
            for t in types {
                let (mut alloc, shared) = match base_allocatable(pool, t) {
                    Ok(x) => x,
                    Err(e) => {
                        errors.push(e);
                        continue;
                    }
                };
                add_group_resources(pool, &t.name, &mut alloc);
                let mut offerings = Vec::new();
                let zones: BTreeSet<&String> = pool.zones.iter().collect();
                for (rank, ct) in pool.capacity_types.iter().enumerate() {
                    for z in &zones {
                        let key = OfferingKey {
                            instance_type: t.name.clone(),
                            zone: (*z).clone(),
                            capacity_type: *ct,
                        };
                        // A pool of cloud groups buys only what one of its groups launches.
                        if !pool.cloud_templates.is_empty()
                            && *ct != CapacityType::Reserved
                            && !pool.cloud_templates.iter().any(|g| g.serves(&key))
                        {
                            continue;
                        }
                        let over = pool.prices.get(&t.name).and_then(|p| match ct {
                            CapacityType::Spot => p.spot,
                            CapacityType::OnDemand => p.on_demand,
                            CapacityType::Reserved => None,
                        });
                        // A reserved offering is paid for already (zero marginal cost); it is
                        // available only while a reservation the pool selects has room
                        // (`Templates::for_snapshot`).
                        let (cat_price, cat_avail) = if *ct == CapacityType::Reserved {
                            (0.0, false)
                        } else {
                            match prices.get(&key) {
                                Some(&x) => x,
                                None => continue,
                            }
                        };
                        let labels = Arc::new(node_labels(pool, t, &key, policy.region.as_deref()));
                        offerings.push((
                            rank,
                            TemplateOffering {
                                key,
                                price: over.unwrap_or(cat_price),
                                available: cat_avail,
                                labels,
                            },
                        ));
                    }
                }
                if offerings.is_empty() {
                    errors.push(format!(
                        "pool {}: the catalog has no offering of {} in zones {}",
                        pool.name,
                        t.name,
                        pool.zones.join(",")
                    ));
                    continue;
                }
                offerings.sort_by(|(ra, a), (rb, b)| {
                    ra.cmp(rb)
                        .then(a.price.total_cmp(&b.price))
                        .then(a.key.zone.cmp(&b.key.zone))
                });
                offerings.truncate(MAX_OFFERINGS);
                out.push(Template {
                    pool: pi,
                    pool_name: pool.name.clone(),
                    priority: pool.priority,
                    instance_type: t.name.clone(),
                    allocatable: alloc,
                    learned_from: None,
                    shared,
                    gpus: t.gpu.as_ref().map_or(0, |g| g.count),
                    taints: template_taints(pool, &t.name),
                    offerings: offerings.into_iter().map(|(_, o)| o).collect(),
                    devices: Arc::new(crate::dra::predicted_devices(pool, t)),
                });
            }
        }
        let mut by_name: HashMap<String, HashMap<String, usize>> = HashMap::default();
        for (i, t) in out.iter().enumerate() {
            by_name
                .entry(t.pool_name.clone())
                .or_default()
                .insert(t.instance_type.clone(), i);
        }
        Templates {
            by_name,
            from_catalog: out.iter().map(|t| t.allocatable.clone()).collect(),
            templates: out,
            errors,
            memo: Memo::default(),
            reserving: policy
                .pools
                .iter()
                .enumerate()
                .filter(|(_, p)| p.capacity_types.contains(&CapacityType::Reserved))
                .map(|(i, p)| (i, p.clone()))
                .collect(),
        }
    }

    /// The template of a pool's node (by its instance-type label).
    pub fn find(&self, pool: &str, node: &Node) -> Option<&Template> {
        let it = node.instance_type()?;
        self.templates
            .iter()
            .find(|t| t.pool_name == pool && t.instance_type == it)
    }

    /// Corrects templates by what their registered, Ready nodes allocate: the kubelet's
    /// reservations, the ENI pod limit (e.g. 58 pods on a g5.xlarge on EKS) and the AMI are known
    /// only there. A template with nodes among `nodes` takes the smallest CPU, memory and pod
    /// count any of them allocates (GPUs stay as the catalog says: a node missing GPUs is a
    /// health matter, not a shape); one without keeps what it learned last. Returns what changed.
    pub fn learn_from(&mut self, nodes: &[Node]) -> Vec<Learned> {
        let mut seen: BTreeMap<usize, (Resources, &str)> = BTreeMap::new();
        for n in nodes {
            if !n.ready || n.deleting {
                continue;
            }
            let (Some(pool), Some(it)) = (n.pool(), n.instance_type()) else {
                continue;
            };
            let Some(&ti) = self.by_name.get(pool).and_then(|types| types.get(it)) else {
                continue;
            };
            let a = &n.allocatable;
            match seen.get_mut(&ti) {
                None => {
                    seen.insert(ti, (a.clone(), n.name.as_str()));
                }
                Some((min, from)) => {
                    if (a.cpu_milli, a.memory, a.pods) < (min.cpu_milli, min.memory, min.pods) {
                        *from = n.name.as_str();
                    }
                    min.cpu_milli = min.cpu_milli.min(a.cpu_milli);
                    min.memory = min.memory.min(a.memory);
                    min.pods = min.pods.min(a.pods);
                }
            }
        }
        let mut changed = Vec::new();
        for (ti, (min, node)) in seen {
            let t = &mut self.templates[ti];
            let mut now = self.from_catalog[ti].clone();
            now.cpu_milli = min.cpu_milli;
            now.memory = min.memory;
            now.pods = min.pods;
            if now == t.allocatable {
                continue;
            }
            let learned = (now != self.from_catalog[ti]).then(|| node.to_string());
            changed.push(Learned {
                pool: t.pool_name.clone(),
                instance_type: t.instance_type.clone(),
                node: node.to_string(),
                was: std::mem::replace(&mut t.allocatable, now.clone()),
                now,
            });
            t.learned_from = learned;
        }
        if !changed.is_empty() {
            self.memo = Memo::default();
        }
        changed
    }

    /// The templates for one plan: DaemonSet pods seen in the cluster that would land on a new
    /// node take their share first, and offerings in the insufficient-capacity cache are
    /// unavailable.
    pub fn for_snapshot(&self, snapshot: &Snapshot, now: Time) -> Arc<Vec<Template>> {
        let daemonsets = daemonset_pods(snapshot);
        let adjustments: Adjustments = self
            .templates
            .iter()
            .map(|t| {
                let mut unavailable = 0u64;
                for (i, o) in t.offerings.iter().enumerate() {
                    let reserved_out = o.key.capacity_type == CapacityType::Reserved
                        && !self.reserving.get(&t.pool).is_some_and(|p| {
                            snapshot.reservations.iter().any(|r| {
                                r.available > 0 && r.offering() == o.key && launchable(p, r, now)
                            })
                        });
                    if reserved_out || snapshot.is_unavailable(&o.key, now) {
                        unavailable |= 1u64 << i;
                    }
                }
                let mut taken = Resources::default();
                let probe = &t.offerings[0].labels;
                for ds in &daemonsets {
                    let c = &ds.constraints;
                    let selects = c.node_selector.iter().all(|(k, v)| probe.get(k) == Some(v))
                        && c.affinity.as_ref().is_none_or(|terms| {
                            terms
                                .iter()
                                .any(|t| t.requirements.iter().all(|r| r.matches(probe)))
                        });
                    if selects && c.tolerates(&t.taints) {
                        taken.add(&ds.requests);
                    }
                }
                (taken, unavailable)
            })
            .collect();
        let mut memo = self.memo.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((made_by, templates)) = memo.as_ref() {
            if *made_by == adjustments {
                return templates.clone();
            }
        }
        let mut out = self.templates.clone();
        for (t, (taken, unavailable)) in out.iter_mut().zip(&adjustments) {
            for (i, o) in t.offerings.iter_mut().enumerate() {
                if unavailable & (1u64 << i) != 0 {
                    o.available = false;
                } else if o.key.capacity_type == CapacityType::Reserved {
                    o.available = true;
                }
            }
            t.allocatable.sub(taken);
        }
        let out = Arc::new(out);
        *memo = Some((adjustments, out.clone()));
        out
    }
}

/// Builds every template of every pool for one snapshot (see [`Templates`]).
pub fn build_templates(
    policy: &Policy,
    catalog: &Catalog,
    snapshot: &Snapshot,
    now: Time,
) -> (Vec<Template>, Vec<String>) {
    let t = Templates::new(policy, catalog);
    (
        Arc::unwrap_or_clone(t.for_snapshot(snapshot, now)),
        t.errors,
    )
}

/// The spec a provider is built from: the pools of `policy` that name `provider`, resolved once
/// against `catalog` (instance types and prices, startup taints, the GPU resources their Nodes
/// advertise) and the GPU labels of the catalog's NVIDIA types. What the process adds (the
/// cluster's identity, an endpoint, the API client) is left empty for the caller to fill.
pub fn provider_spec<'a>(
    policy: &Policy,
    catalog: &'a Catalog,
    provider: &str,
) -> gpu_node_autoscaler_provider::spec::ProviderSpec<'a> {
    use gpu_node_autoscaler_provider::spec::{PoolSpec, ProviderSpec};
    let pools: Vec<PoolSpec> = policy
        .pools
        .iter()
        .filter(|p| p.provider == provider)
        .map(|pool| {
            // Instance types still to be read from the cloud: any of the catalog's, priced.
            let types = if awaits_cloud_templates(pool) {
                Ok((
                    Vec::new(),
                    catalog
                        .instance_types
                        .iter()
                        .filter_map(|t| Some((t.name.clone(), t.on_demand_price?)))
                        .chain(
                            pool.prices
                                .iter()
                                .filter_map(|(t, p)| Some((t.clone(), p.on_demand?))),
                        )
                        .collect(),
                ))
            } else {
                pool_types_and_prices(pool, catalog)
            };
            let gpu_resources = types
                .iter()
                .flat_map(|(names, _)| names)
                .filter_map(|name| catalog.instance_type(name))
                .map(|t| (t.name.clone(), advertised_gpu_resources(pool, t)))
                .collect();
            PoolSpec {
                name: pool.name.clone(),
                settings: pool.settings.clone(),
                zones: pool.zones.clone(),
                capacity_types: pool.capacity_types.clone(),
                types,
                startup_taints: pool
                    .startup_taints
                    .iter()
                    .map(|t| {
                        (
                            t.key.clone(),
                            t.value.clone(),
                            t.effect.as_str().to_string(),
                        )
                    })
                    .collect(),
                gpu_resources,
            }
        })
        .collect();
    let type_labels = catalog
        .instance_types
        .iter()
        .filter_map(|t| {
            let g = t.gpu.as_ref()?;
            let mut l = BTreeMap::new();
            if g.vendor == GpuVendor::Nvidia {
                l.insert(
                    labels::NVIDIA_PRODUCT.to_string(),
                    gpu::nvidia_product_label(&g.model, g.memory_mib),
                );
                l.insert(labels::NVIDIA_COUNT.to_string(), g.count.to_string());
            }
            Some((t.name.clone(), l))
        })
        .collect();
    ProviderSpec {
        cluster_name: policy.cluster_name.clone(),
        cluster_id: None,
        region: policy.region.clone(),
        endpoint_url: None,
        catalog,
        type_labels,
        pools,
        max_node_provision_time: policy.max_node_provision_time,
        kube_client: None,
    }
}

/// A layout as a map, profile → instances per GPU.
fn layout_map(layout: &[(String, u32)]) -> BTreeMap<String, u32> {
    layout.iter().cloned().collect()
}

/// What is wrong with a layout on the GPUs of `instance_type`, naming the GPU and, for a profile
/// it does not offer, the ones it does.
fn mig_layout_message(e: &LayoutError, table: &MigGpu, instance_type: &str) -> String {
    match e {
        LayoutError::UnknownProfile { .. } => format!(
            "{e} on the {} GPUs of {instance_type} (they offer {})",
            table.product,
            table.profile_names()
        ),
        _ => format!("{e} (the {} GPUs of {instance_type})", table.product),
    }
}

/// The MIG layouts of `policy` checked against the GPUs of their pools' instance types (NVIDIA's
/// profiles of each GPU model, their maximum counts, slices and placements: [`mig`]), each error
/// at the position of the profile it is about, else of the layout. Instance types that cannot be
/// resolved, and models without a table, are left to [`build_templates`]'s errors.
pub fn check_mig_layouts(policy: &Policy, catalog: &Catalog) -> Vec<PolicyError> {
    let mut out: Vec<PolicyError> = Vec::new();
    for (i, pool) in policy.pools.iter().enumerate() {
        let GpuMode::Mig(layout) = &pool.gpu_mode else {
            continue;
        };
        let Ok((types, _)) = pool_types_and_prices(pool, catalog) else {
            continue;
        };
        let layout = layout_map(layout);
        let mut seen = BTreeSet::new();
        for t in types.iter().filter_map(|t| catalog.instance_type(t)) {
            let Some(table) = t
                .gpu
                .as_ref()
                .and_then(|g| mig::mig_gpu(&g.model, g.memory_mib))
            else {
                continue;
            };
            let Err(e) = table.check(&layout) else {
                continue;
            };
            // One error per GPU model and problem, not one per instance type.
            if !seen.insert((table.product, format!("{e}"))) {
                continue;
            }
            let profile = match &e {
                LayoutError::UnknownProfile { profile } | LayoutError::TooMany { profile, .. } => {
                    Some(profile.clone())
                }
                _ => None,
            };
            let at = policy
                .positions
                .mig_layouts
                .get(&(i, profile))
                .or_else(|| policy.positions.mig_layouts.get(&(i, None)));
            let message = mig_layout_message(&e, table, &t.name);
            out.push(match at {
                Some(at) => at.error(message),
                None => PolicyError {
                    line: 0,
                    col: 0,
                    path: String::new(),
                    message: format!("pool {}: migLayout: {message}", pool.name),
                },
            });
        }
    }
    out
}
