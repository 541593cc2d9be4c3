//! Dynamic Resource Allocation in the simulated cluster: allocating a pod's ResourceClaims on the
//! devices a node publishes, as the kube-scheduler's DRA plugin does. Selectors (the
//! DeviceClass's and the request's) are evaluated with the core's CEL evaluation
//! ([`gpu_node_autoscaler_core::dra::Selectors`]); a device on which an expression cannot be evaluated does not
//! match.

use std::collections::{BTreeMap, HashMap};

use gpu_node_autoscaler_core::dra::Selectors;
use gpu_node_autoscaler_core::model::dra::{Device, DeviceClass, DeviceCount};
use gpu_node_autoscaler_core::model::gpu::parse_mig_profile;
use gpu_node_autoscaler_core::model::Pod;

/// The devices a pod's claims took on a node: per claim (`namespace/name` of the claim), the
/// indices of the node's devices.
pub type Allocated = Vec<(String, Vec<usize>)>;

/// Decides which devices of a node satisfy a pod's claims.
pub struct DeviceMatcher {
    classes: BTreeMap<String, DeviceClass>,
    selectors: Selectors,
    /// (expressions, device with its name cleared) → all hold.
    cache: HashMap<(Vec<String>, Device), bool>,
}

impl DeviceMatcher {
    pub fn new(classes: BTreeMap<String, DeviceClass>) -> DeviceMatcher {
        DeviceMatcher {
            classes,
            selectors: Selectors::new(),
            cache: HashMap::new(),
        }
    }

    fn matches(&mut self, exprs: &[String], d: &Device) -> bool {
        let mut kind = d.clone();
        kind.name.clear();
        let key = (exprs.to_vec(), kind);
        if let Some(&m) = self.cache.get(&key) {
            return m;
        }
        let m = self.selectors.all_match(exprs, d) == Ok(true);
        self.cache.insert(key, m);
        m
    }

    /// Allocates every claim of `pod` that needs devices on `devices`, of which those marked in
    /// `taken` are allocated already: per request the first alternative that fits, `count`
    /// devices (the first free ones that match), or with `allocationMode: All` every matching
    /// device of the node, all of which must be free. `None` when some request cannot be
    /// satisfied; an empty list for a pod without such claims.
    pub fn allocate(&mut self, pod: &Pod, devices: &[Device], taken: &[bool]) -> Option<Allocated> {
        let mut used = taken.to_vec();
        let mut out = Vec::new();
        for c in pod.claims.iter().filter(|c| c.needs_devices()) {
            let mut mine = Vec::new();
            'requests: for r in &c.spec.requests {
                for alt in &r.alternatives {
                    let Some(class) = self.classes.get(&alt.class) else {
                        continue;
                    };
                    let exprs: Vec<String> = class
                        .selectors
                        .iter()
                        .chain(&alt.selectors)
                        .cloned()
                        .collect();
                    let matching: Vec<usize> = (0..devices.len())
                        .filter(|&i| self.matches(&exprs, &devices[i]))
                        .collect();
                    let free: Vec<usize> = matching.iter().copied().filter(|&i| !used[i]).collect();
                    let take = match alt.count {
                        DeviceCount::Exact(n) if free.len() >= n as usize => {
                            free[..n as usize].to_vec()
                        }
                        DeviceCount::All
                            if !matching.is_empty() && free.len() == matching.len() =>
                        {
                            free
                        }
                        _ => continue,
                    };
                    for &i in &take {
                        used[i] = true;
                    }
                    mine.extend(take);
                    continue 'requests;
                }
                return None;
            }
            out.push((c.claim.clone(), mine));
        }
        Some(out)
    }
}

/// GPUs a device stands for: a whole GPU, or a MIG device's share of its GPU's compute.
pub fn gpu_equivalent(d: &Device) -> f64 {
    use gpu_node_autoscaler_core::model::dra::AttrValue;
    match (d.attribute("type"), d.attribute("profile")) {
        (Some(AttrValue::String(t)), Some(AttrValue::String(p))) if t == "mig" => {
            parse_mig_profile(p).map_or(1.0, |p| p.gpu_share())
        }
        _ => 1.0,
    }
}
