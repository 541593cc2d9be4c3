//! Devices of Dynamic Resource Allocation in the planner.
//!
//! Devices that are alike (same driver, attributes and capacity, apart from what identifies one
//! device: `uuid`, `index`, `minor`, `pcieBusID`, `parentUUID`) form a *kind*, and every kind is
//! one more countable dimension of the resource vectors the packer already works with: a
//! template offers its predicted devices by kind, a registered node what it publishes less what
//! claims hold. A pod's claims become, per request, the kinds its selectors (the DeviceClass's and
//! the request's) accept, in `firstAvailable` order, with the count it takes. Selectors are
//! evaluated once per kind, not per device or pod, so pods without claims pay nothing and pods
//! with claims a lookup.

use crate::hash::HashMap;
use std::sync::Arc;

use crate::dra::Selectors;
use crate::model::dra::{Device, DeviceCount, PodClaim};
use crate::model::{Resources, Snapshot};

use super::templates::Template;

/// Attributes that tell one device from its siblings rather than describe it.
const IDENTITY_ATTRIBUTES: [&str; 5] = ["uuid", "index", "minor", "pcieBusID", "parentUUID"];

/// Prefix of the resource dimensions that count devices of a kind.
pub(super) const DIM_PREFIX: &str = "dra:";

/// One alternative of a request: the count, and the dimensions (kinds) that satisfy it.
#[derive(Debug, PartialEq)]
struct Alternative {
    count: DeviceCount,
    dims: Vec<String>,
}

/// What a pod's claims take from a node, request by request.
#[derive(Debug, PartialEq)]
pub(super) struct DeviceDemand {
    requests: Vec<Vec<Alternative>>,
    /// Devices taken, for ordering pods by size.
    pub devices: f64,
}

impl DeviceDemand {
    /// Takes one pod's devices from `free`; false (and `free` partly taken) when they do not fit.
    fn take_one(&self, free: &mut Resources) -> bool {
        'requests: for alts in &self.requests {
            for alt in alts {
                let avail: i64 = alt.dims.iter().map(|d| free.get(d).max(0)).sum();
                let want = match alt.count {
                    DeviceCount::Exact(n) => n as i64,
                    DeviceCount::All => avail,
                };
                if avail == 0 || avail < want {
                    continue;
                }
                let mut left = want;
                for d in &alt.dims {
                    let have = free.get(d).max(0);
                    let t = have.min(left);
                    if t > 0 {
                        free.set(d, have - t);
                        left -= t;
                    }
                }
                continue 'requests;
            }
            return false;
        }
        true
    }

    /// How many pods' devices fit into `free`, up to `max`.
    pub fn copies(&self, free: &Resources, max: i64) -> i64 {
        if max <= 0 {
            return 0;
        }
        let avail =
            |alt: &Alternative| -> i64 { alt.dims.iter().map(|d| free.get(d).max(0)).sum() };
        // One request of one alternative of n devices (most claims): n from the kinds together.
        if let [alts] = self.requests.as_slice() {
            if let [alt @ Alternative {
                count: DeviceCount::Exact(n),
                ..
            }] = alts.as_slice()
            {
                let have = avail(alt);
                return match *n {
                    // As `take_one`: a request fits only where a device of its kinds is left.
                    0 if have > 0 => max,
                    0 => 0,
                    n => (have / n as i64).min(max),
                };
            }
        }
        // Most nodes have none of the kinds wanted: tell without a copy.
        let one_fits = self.requests.iter().all(|alts| {
            alts.iter().any(|a| {
                let have = avail(a);
                match a.count {
                    DeviceCount::Exact(n) => have > 0 && have >= n as i64,
                    DeviceCount::All => have > 0,
                }
            })
        });
        if !one_fits {
            return 0;
        }
        // One scratch copy: what a take that fails leaves behind is never read.
        let mut f = free.clone();
        for k in 0..max {
            if !self.take_one(&mut f) {
                return k;
            }
        }
        max
    }

    /// Takes `k` pods' devices from `free` (they fit: see [`DeviceDemand::copies`]).
    pub fn apply(&self, free: &mut Resources, k: i64) {
        for _ in 0..k {
            self.take_one(free);
        }
    }

    /// The largest share of a node's devices of the kinds it wants that one pod takes.
    pub fn share_of(&self, allocatable: &Resources) -> f64 {
        let mut s: f64 = 0.0;
        for alts in &self.requests {
            let Some(alt) = alts
                .iter()
                .find(|a| a.dims.iter().any(|d| allocatable.get(d) > 0))
            else {
                continue;
            };
            let total: i64 = alt.dims.iter().map(|d| allocatable.get(d)).sum();
            let share = match alt.count {
                DeviceCount::Exact(n) => n as f64 / total as f64,
                DeviceCount::All => 1.0,
            };
            s = s.max(share);
        }
        s
    }
}

/// Devices resolved for one plan.
#[derive(Default)]
pub(super) struct Devices {
    /// Per template: the devices it offers, by kind dimension.
    pub template_devices: Vec<Resources>,
    /// Per node index with published devices: free devices by kind dimension.
    pub node_devices: HashMap<usize, Resources>,
    /// Per pending pod index with claims needing devices: its demand, or why none can be found.
    pub demands: HashMap<usize, Result<Arc<DeviceDemand>, String>>,
    /// The kind dimension of every published device, by `(node, driver, pool, device)`.
    pub published: HashMap<(String, String, String, String), String>,
    /// Per running pod (by UID) whose allocated claims are all made from ResourceClaimTemplates:
    /// what its claims take when it is moved. Its claims go with it, and the claims made for
    /// its replacement are allocated afresh, from any devices their requests accept.
    pub moving: HashMap<String, Arc<DeviceDemand>>,
}

impl Devices {
    /// What the claims of a pod moved off its node take where it goes: the claims made for its
    /// replacement from the same templates (any devices their requests accept), else the very
    /// kinds of devices they hold on `node` (a claim of its own lives on, shared or not).
    pub(super) fn moved_claims(&self, pod: &crate::model::Pod, node: &str) -> MovedClaims<'_> {
        match self.moving.get(&pod.uid) {
            Some(d) => MovedClaims::Fresh(d),
            None => MovedClaims::Held(self.held_on(pod, node)),
        }
    }

    /// The devices (by kind dimension) that the claims of `pod` hold on `node`: what must be
    /// found again on another node for the pod to move there.
    pub fn held_on(&self, pod: &crate::model::Pod, node: &str) -> Resources {
        let mut r = Resources::default();
        let mut seen = crate::hash::HashSet::default();
        for c in &pod.claims {
            let Some(a) = &c.allocation else { continue };
            if a.node.as_deref() != Some(node) || !seen.insert(&c.claim) {
                continue;
            }
            for (driver, pool, device) in &a.devices {
                let key = (
                    node.to_string(),
                    driver.clone(),
                    pool.clone(),
                    device.clone(),
                );
                if let Some(d) = self.published.get(&key) {
                    r.set(d, r.get(d) + 1);
                }
            }
        }
        r
    }
}

/// What a moved pod's claims need on the node it goes to.
pub(super) enum MovedClaims<'a> {
    /// Claims made afresh for its replacement: devices of any kind their requests accept.
    Fresh(&'a DeviceDemand),
    /// Claims of its own that keep their allocation: the kinds of devices they hold.
    Held(Resources),
}

impl MovedClaims<'_> {
    /// Whether the claims fit into `free`.
    pub fn fits_in(&self, free: &Resources) -> bool {
        match self {
            MovedClaims::Fresh(d) => d.copies(free, 1) == 1,
            MovedClaims::Held(r) => r.fits_in(free),
        }
    }

    /// Takes the claims' devices from `free` (they fit).
    pub fn take_from(&self, free: &mut Resources) {
        match self {
            MovedClaims::Fresh(d) => d.apply(free, 1),
            MovedClaims::Held(r) => free.sub(r),
        }
    }

    /// Whether the pod's claims need devices at all.
    pub fn any(&self) -> bool {
        match self {
            MovedClaims::Fresh(d) => !d.requests.is_empty(),
            MovedClaims::Held(r) => !r.is_zero(),
        }
    }
}

/// The key of a device's kind.
fn kind_key(d: &Device, keep_identity: bool) -> Device {
    let mut k = d.clone();
    k.name.clear();
    if !keep_identity {
        for attrs in k.attributes.values_mut() {
            for a in IDENTITY_ATTRIBUTES {
                attrs.remove(a);
            }
        }
    }
    k
}

struct Kinds {
    keep_identity: bool,
    index: HashMap<Device, usize>,
    /// A representative device per kind (the first seen, identity and all).
    devices: Vec<Device>,
}

impl Kinds {
    fn of(&mut self, d: &Device) -> usize {
        let key = kind_key(d, self.keep_identity);
        let n = self.devices.len();
        let k = *self.index.entry(key).or_insert(n);
        if k == n {
            self.devices.push(d.clone());
        }
        k
    }
}

fn dim(kind: usize) -> String {
    format!("{DIM_PREFIX}{kind}")
}

/// Whether a selector reads an identity attribute, so that devices must not be merged by kind.
fn reads_identity(expr: &str) -> bool {
    IDENTITY_ATTRIBUTES.iter().any(|a| expr.contains(a))
}

/// Resolves devices and claims for one plan; `pending` are the pods the plan places.
pub(super) fn resolve(snapshot: &Snapshot, templates: &[Template], pending: &[usize]) -> Devices {
    let mut out = Devices {
        template_devices: vec![Resources::default(); templates.len()],
        ..Devices::default()
    };
    let has_templates = templates.iter().any(|t| !t.devices.is_empty());
    let claimers: Vec<usize> = pending
        .iter()
        .copied()
        .filter(|&i| snapshot.pods[i].needs_devices())
        .collect();
    if !has_templates && snapshot.dra.slices.is_empty() && claimers.is_empty() {
        return out;
    }
    // Running pods whose claims, all made from templates, hold devices: a scale-down may move
    // them.
    let movers: Vec<usize> = snapshot
        .pods
        .iter()
        .enumerate()
        .filter(|(_, p)| {
            p.is_bound_active()
                && p.claims.iter().any(|c| c.allocation.is_some())
                && p.claims
                    .iter()
                    .all(|c| c.template.is_some() || c.spec.requests.is_empty())
        })
        .map(|(i, _)| i)
        .collect();
    let dra = &snapshot.dra;
    let keep_identity = dra
        .classes
        .values()
        .flat_map(|c| c.selectors.iter())
        .chain(claimers.iter().chain(&movers).flat_map(|&i| {
            snapshot.pods[i].claims.iter().flat_map(|c| {
                c.spec
                    .requests
                    .iter()
                    .flat_map(|r| r.alternatives.iter().flat_map(|a| a.selectors.iter()))
            })
        }))
        .any(|e| reads_identity(e));
    let mut kinds = Kinds {
        keep_identity,
        index: HashMap::default(),
        devices: Vec::new(),
    };
    for (ti, t) in templates.iter().enumerate() {
        let r = &mut out.template_devices[ti];
        for d in t.devices.iter() {
            let k = dim(kinds.of(d));
            r.set(&k, r.get(&k) + 1);
        }
    }
    let node_index: HashMap<&str, usize> = snapshot
        .nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.name.as_str(), i))
        .collect();
    for (node, devices) in &dra.slices {
        let Some(&ni) = node_index.get(node.as_str()) else {
            continue;
        };
        let allocated: Vec<&(String, String, String)> = dra
            .allocated
            .get(node)
            .map(|v| v.iter().collect())
            .unwrap_or_default();
        let r = out.node_devices.entry(ni).or_default();
        for (pool, d) in devices {
            let taken = allocated
                .iter()
                .any(|(dr, p, n)| dr == &d.driver && p == pool && n == &d.name);
            let k = dim(kinds.of(d));
            if !taken {
                r.set(&k, r.get(&k) + 1);
            }
            out.published.insert(
                (node.clone(), d.driver.clone(), pool.clone(), d.name.clone()),
                k,
            );
        }
    }
    let mut selectors = Selectors::new();
    // (selectors of class + request) → per kind: matches, or the error.
    let mut matches: HashMap<Vec<String>, Vec<Result<bool, String>>> = HashMap::default();
    // One demand per set of claim specs (pods of one template share theirs).
    let mut by_claims: HashMap<
        Vec<*const crate::model::dra::ClaimSpec>,
        Result<Arc<DeviceDemand>, String>,
    > = HashMap::default();
    let mut demand_for = |claims: Vec<&PodClaim>| {
        let key: Vec<_> = claims.iter().map(|c| Arc::as_ptr(&c.spec)).collect();
        by_claims
            .entry(key)
            .or_insert_with(|| demand_of(&claims, dra, &kinds, &mut selectors, &mut matches))
            .clone()
    };
    for &pi in &claimers {
        let claims = snapshot.pods[pi]
            .claims
            .iter()
            .filter(|c| c.needs_devices());
        out.demands.insert(pi, demand_for(claims.collect()));
    }
    for &pi in &movers {
        let pod = &snapshot.pods[pi];
        let claims = pod.claims.iter().filter(|c| !c.spec.requests.is_empty());
        // A claim no device accepts any more stays where it is: held, as it is.
        if let Ok(d) = demand_for(claims.collect()) {
            out.moving.insert(pod.uid.clone(), d);
        }
    }
    out
}

fn demand_of(
    claims: &[&PodClaim],
    dra: &crate::model::dra::DraState,
    kinds: &Kinds,
    selectors: &mut Selectors,
    matches: &mut HashMap<Vec<String>, Vec<Result<bool, String>>>,
) -> Result<Arc<DeviceDemand>, String> {
    let mut requests = Vec::new();
    let mut devices = 0.0;
    for c in claims {
        for r in &c.spec.requests {
            let mut alts = Vec::new();
            let mut errors: Vec<String> = Vec::new();
            for sub in &r.alternatives {
                let Some(class) = dra.classes.get(&sub.class) else {
                    errors.push(format!("DeviceClass {} does not exist", sub.class));
                    continue;
                };
                let exprs: Vec<String> = class
                    .selectors
                    .iter()
                    .chain(sub.selectors.iter())
                    .cloned()
                    .collect();
                if let Some(e) = exprs.iter().find_map(|e| selectors.check(e).err()) {
                    errors.push(e);
                    continue;
                }
                let per_kind = matches.entry(exprs.clone()).or_insert_with(|| {
                    kinds
                        .devices
                        .iter()
                        .map(|d| selectors.all_match(&exprs, d))
                        .collect()
                });
                let dims: Vec<String> = per_kind
                    .iter()
                    .enumerate()
                    .filter(|(_, m)| matches!(m, Ok(true)))
                    .map(|(k, _)| dim(k))
                    .collect();
                if dims.is_empty() {
                    if let Some(Err(e)) = per_kind.iter().find(|m| m.is_err()) {
                        errors.push(e.clone());
                    }
                    continue;
                }
                if alts.is_empty() {
                    devices += match sub.count {
                        DeviceCount::Exact(n) => n as f64,
                        DeviceCount::All => 1.0,
                    };
                }
                alts.push(Alternative {
                    count: sub.count,
                    dims,
                });
            }
            if alts.is_empty() {
                let what = r
                    .alternatives
                    .iter()
                    .map(|a| {
                        let count = match a.count {
                            DeviceCount::Exact(n) => n.to_string(),
                            DeviceCount::All => "all".into(),
                        };
                        if a.selectors.is_empty() {
                            format!("{count} of class {}", a.class)
                        } else {
                            format!(
                                "{count} of class {} with {}",
                                a.class,
                                a.selectors.join(" && ")
                            )
                        }
                    })
                    .collect::<Vec<_>>()
                    .join(", or ");
                let why = if errors.is_empty() {
                    "no pool's devices and no node's published devices match".to_string()
                } else {
                    errors.join("; ")
                };
                return Err(format!(
                    "claim {} request {} ({what}): {why}",
                    c.claim, r.name
                ));
            }
            requests.push(alts);
        }
    }
    Ok(Arc::new(DeviceDemand { requests, devices }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `copies` must answer: takes one pod at a time from a copy until one fails.
    fn one_by_one(d: &DeviceDemand, free: &Resources, max: i64) -> i64 {
        let mut f = free.clone();
        for k in 0..max {
            let mut g = f.clone();
            if !d.take_one(&mut g) {
                return k;
            }
            f = g;
        }
        max
    }

    #[test]
    fn copies_agree_with_taking_one_pod_at_a_time() {
        let alt = |count, dims: &[usize]| Alternative {
            count,
            dims: dims.iter().map(|&k| dim(k)).collect(),
        };
        let demands = [
            vec![vec![alt(DeviceCount::Exact(2), &[0, 1])]],
            vec![vec![alt(DeviceCount::Exact(1), &[2])]],
            vec![vec![alt(DeviceCount::All, &[0])]],
            vec![vec![
                alt(DeviceCount::Exact(4), &[0]),
                alt(DeviceCount::Exact(1), &[1]),
            ]],
            vec![
                vec![alt(DeviceCount::Exact(1), &[0])],
                vec![alt(DeviceCount::Exact(2), &[0, 1])],
            ],
        ];
        let mut rng = gpu_node_autoscaler_provider::rng::Rng::new(3);
        for requests in demands {
            let d = DeviceDemand {
                requests,
                devices: 1.0,
            };
            for _ in 0..200 {
                let mut free = Resources {
                    cpu_milli: 1000,
                    ..Resources::default()
                };
                for k in 0..3 {
                    free.set(&dim(k), rng.below(9) as i64);
                }
                let max = rng.below(12) as i64;
                assert_eq!(
                    d.copies(&free, max),
                    one_by_one(&d, &free, max),
                    "{d:?} in {free:?} up to {max}"
                );
            }
        }
    }
}
