//! Dynamic Resource Allocation (`resource.k8s.io/v1`) as the planner sees it: devices that nodes
//! publish in ResourceSlices (or that a new node of a pool will publish), DeviceClasses, and the
//! device requests of pods' ResourceClaims.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::quantity::Quantity;

/// The driver name of NVIDIA's DRA driver for GPUs, and the domain of its attributes.
pub const NVIDIA_GPU_DRIVER: &str = "gpu.nvidia.com";
/// The DeviceClass NVIDIA's driver installs for whole GPUs.
pub const NVIDIA_GPU_CLASS: &str = "gpu.nvidia.com";
/// The DeviceClass NVIDIA's driver installs for MIG devices.
pub const NVIDIA_MIG_CLASS: &str = "mig.nvidia.com";

/// A device attribute's value (`DeviceAttribute`: exactly one of int, bool, string, version).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AttrValue {
    Int(i64),
    Bool(bool),
    String(String),
    /// A semantic version (`1.2.3`).
    Version(String),
}

/// One device of a ResourceSlice. Attribute and capacity names are kept by domain: an
/// unqualified name in the slice belongs to the driver's domain, as in CEL's
/// `device.attributes["gpu.nvidia.com"].productName`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Device {
    pub driver: String,
    pub name: String,
    /// domain → attribute name → value.
    pub attributes: BTreeMap<String, BTreeMap<String, AttrValue>>,
    /// domain → capacity name → quantity.
    pub capacity: BTreeMap<String, BTreeMap<String, Quantity>>,
}

impl Device {
    /// The attribute `name` of the driver's own domain.
    pub fn attribute(&self, name: &str) -> Option<&AttrValue> {
        self.attributes.get(&self.driver).and_then(|a| a.get(name))
    }
}

/// A DeviceClass: its CEL selectors, all of which a device must satisfy.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct DeviceClass {
    pub name: String,
    pub selectors: Vec<String>,
}

/// How many devices a request takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceCount {
    Exact(u32),
    /// `allocationMode: All`: every matching device of the node.
    All,
}

/// One way of satisfying a request: `exactly`, or one entry of `firstAvailable`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SubRequest {
    pub class: String,
    pub selectors: Vec<String>,
    pub count: DeviceCount,
}

/// A request of a claim: `exactly` (one alternative) or `firstAvailable` (tried in order).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct DeviceRequest {
    pub name: String,
    pub alternatives: Vec<SubRequest>,
}

/// A ResourceClaim's `spec.devices`, as far as placement goes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct ClaimSpec {
    pub requests: Vec<DeviceRequest>,
}

/// Where a claim is allocated: the node its devices are on (`status.allocation`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Allocation {
    /// The node the allocation's node selector names (none for devices reachable from any node).
    pub node: Option<String>,
    /// `(driver, pool, device)` of every allocated device.
    pub devices: Vec<(String, String, String)>,
}

/// A claim a pod uses (`spec.resourceClaims`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PodClaim {
    /// The entry's name in the pod.
    pub name: String,
    /// `namespace/name` of the ResourceClaim; for a claim template, the claim generated for the
    /// pod once it exists, else `namespace/pod-entry` (unique to the pod).
    pub claim: String,
    /// `namespace/name` of the ResourceClaimTemplate the claim is made from, if it is.
    pub template: Option<String>,
    pub spec: Arc<ClaimSpec>,
    pub allocation: Option<Allocation>,
    /// Whether this pod carries the claim's devices in a plan: false for every pod but one that
    /// shares a ResourceClaim with others (the devices are allocated once, for all of them).
    pub counted_here: bool,
}

impl PodClaim {
    /// Needs devices allocated by a plan: not allocated yet, and carried by this pod.
    pub fn needs_devices(&self) -> bool {
        self.allocation.is_none() && self.counted_here && !self.spec.requests.is_empty()
    }
}

/// The DRA objects of the cluster that planning reads.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DraState {
    pub classes: BTreeMap<String, DeviceClass>,
    /// Devices published per node (ResourceSlices with `spec.nodeName`), with the pool each
    /// belongs to.
    pub slices: BTreeMap<String, Vec<(String, Device)>>,
    /// `(driver, pool, device)` of every device allocated to a claim, per node.
    pub allocated: BTreeMap<String, Vec<(String, String, String)>>,
}

impl DraState {
    pub fn is_empty(&self) -> bool {
        self.slices.is_empty() && self.allocated.is_empty()
    }

    /// Devices a node publishes.
    pub fn published(&self, node: &str) -> usize {
        self.slices.get(node).map_or(0, Vec::len)
    }
}

/// A ResourceClaim: its requests and where it is allocated.
#[derive(Clone, Debug, PartialEq)]
pub struct Claim {
    pub spec: Arc<ClaimSpec>,
    pub allocation: Option<Allocation>,
}

/// A ResourceSlice of a node: the devices of one pool of one driver.
#[derive(Clone, Debug, PartialEq)]
pub struct Slice {
    pub node: String,
    pub driver: String,
    pub pool: String,
    pub generation: i64,
    pub devices: Vec<Device>,
}

/// The DRA objects of a cluster as read (by key), before they are joined with its pods.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DraObjects {
    /// `namespace/name` → claim.
    pub claims: BTreeMap<String, Claim>,
    /// `namespace/name` → the spec claims made from the template get.
    pub templates: BTreeMap<String, Arc<ClaimSpec>>,
    pub classes: BTreeMap<String, DeviceClass>,
    /// Slice name → slice (slices not bound to one node are not read).
    pub slices: BTreeMap<String, Slice>,
}

impl DraObjects {
    /// Fills in the claims of `pods` (spec, allocation, which pod carries a shared claim) and
    /// the state planning reads: classes, devices published per node (the newest generation of
    /// each pool), devices allocated per node. A pod whose claim or template does not exist gets
    /// a `problem` saying so.
    pub fn join(&self, pods: &mut [super::Pod]) -> DraState {
        let mut state = DraState {
            classes: self.classes.clone(),
            ..DraState::default()
        };
        let mut newest: BTreeMap<(&str, &str), i64> = BTreeMap::new();
        for s in self.slices.values() {
            let g = newest.entry((&s.driver, &s.pool)).or_insert(s.generation);
            *g = (*g).max(s.generation);
        }
        for s in self.slices.values() {
            if newest[&(s.driver.as_str(), s.pool.as_str())] != s.generation {
                continue;
            }
            let devices = state.slices.entry(s.node.clone()).or_default();
            devices.extend(s.devices.iter().map(|d| (s.pool.clone(), d.clone())));
        }
        for c in self.claims.values() {
            if let Some(Allocation {
                node: Some(node),
                devices,
            }) = &c.allocation
            {
                state
                    .allocated
                    .entry(node.clone())
                    .or_default()
                    .extend(devices.iter().cloned());
            }
        }
        // A ResourceClaim shared by pending pods is carried by the first of them.
        let mut order: Vec<usize> = (0..pods.len()).collect();
        order.sort_by(|&a, &b| (pods[a].created, &pods[a].id).cmp(&(pods[b].created, &pods[b].id)));
        let mut carried: crate::hash::HashSet<String> = crate::hash::HashSet::default();
        for i in order {
            let pod = &mut pods[i];
            if pod.claims.is_empty() {
                continue;
            }
            let pending = pod.is_pending();
            let mut missing = Vec::new();
            for c in &mut pod.claims {
                if let Some(claim) = self.claims.get(&c.claim) {
                    c.spec = claim.spec.clone();
                    c.allocation = claim.allocation.clone();
                } else if let Some(t) = &c.template {
                    match self.templates.get(t) {
                        Some(spec) => c.spec = spec.clone(),
                        None => missing.push(format!("ResourceClaimTemplate {t} does not exist")),
                    }
                } else {
                    missing.push(format!("ResourceClaim {} does not exist", c.claim));
                }
                c.counted_here =
                    c.template.is_some() || !pending || carried.insert(c.claim.clone());
            }
            if !missing.is_empty() && pod.problem.is_none() {
                pod.problem = Some(missing.join("; "));
            }
        }
        state
    }
}
