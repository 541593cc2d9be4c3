//! A provable lower bound on the $/hour of new nodes needed for a set of pods, to judge packing.
//!
//! For any weights `w_r >= 0` with `sum w_r = 1` over resource dimensions, a node of type `t`
//! holding pods `P` satisfies `sum_{p in P} req_pr <= cap_tr` for every `r`, hence
//! `price_t >= sum_{p in P} price_t * sum_r w_r * req_pr / cap_tr`. Summing over nodes, the cost
//! of any feasible packing is at least `sum_p min_t price_t * sum_r w_r * req_pr / cap_tr`, the
//! minimum taken over the offerings that can host `p` at all. This is the LP relaxation of the
//! covering problem, evaluated at a handful of weight vectors; the best of them is returned.
//!
//! The devices a pod's ResourceClaims take are one more dimension, against *all* of a template's
//! predicted devices: a device is allocated to one request only, so the pods of a node take at
//! most its device count together, whatever kinds they select. A pod with claims counts only
//! templates with at least that many devices (a superset of those whose devices satisfy its
//! selectors, which keeps the minimum a lower one).

use crate::model::dra::DeviceCount;
use crate::model::Pod;

use super::templates::Template;

/// The dimension of the devices a pod's ResourceClaims take, against all of a template's
/// predicted devices.
const DEVICES: &str = "dra/devices";

/// Devices a pod's claims take at the least: per request, the smallest count among its
/// alternatives (`allocationMode: All` takes at least one). Claims already allocated, or carried
/// by another pod, take none here.
fn claimed_devices(p: &Pod) -> f64 {
    p.claims
        .iter()
        .filter(|c| c.needs_devices())
        .flat_map(|c| c.spec.requests.iter())
        .filter_map(|r| {
            r.alternatives
                .iter()
                .map(|a| match a.count {
                    DeviceCount::Exact(n) => n as f64,
                    DeviceCount::All => 1.0,
                })
                .min_by(f64::total_cmp)
        })
        .sum()
}

fn dims(p: &Pod) -> Vec<(String, f64)> {
    let mut d: Vec<(String, f64)> = p
        .requests
        .dimensions()
        .into_iter()
        .map(|(n, v)| (n.to_string(), v as f64))
        .collect();
    if let Some(s) = &p.share {
        d.push(("share/mem".into(), s.mem_gib as f64));
        d.push(("share/core".into(), s.core_pct as f64));
    }
    let devices = claimed_devices(p);
    if devices > 0.0 {
        d.push((DEVICES.into(), devices));
    }
    d
}

fn cap(t: &Template, name: &str) -> f64 {
    match name {
        "share/mem" => t.shared.iter().map(|g| g.mem_gib).sum::<i64>() as f64,
        "share/core" => t.shared.iter().map(|g| g.core_pct).sum::<i64>() as f64,
        DEVICES => t.devices.len() as f64,
        n => t.allocatable.get(n) as f64,
    }
}

/// Cheapest available price of an offering of `t` that admits `p`, if `p` fits `t` at all.
fn price_for(p: &Pod, t: &Template) -> Option<f64> {
    let fits = p.requests.fits_in(&t.allocatable)
        && p.share
            .is_none_or(|s| crate::model::resources::share_copies(&t.shared, &s) > 0)
        && claimed_devices(p) <= t.devices.len() as f64;
    if !fits || !p.constraints.tolerates(&t.taints) {
        return None;
    }
    t.offerings
        .iter()
        .filter(|o| o.available && p.constraints.matches_node(&o.labels, None))
        .map(|o| o.price)
        .min_by(f64::total_cmp)
}

/// The bound's weight vectors and per-pod costs. For a fixed weight vector the bound is a sum
/// over pods, so a set that changes over time (the simulator) keeps one running sum per vector
/// and takes the largest.
pub struct BoundModel<'a> {
    templates: &'a [Template],
    weights: Vec<Vec<(String, f64)>>,
}

impl<'a> BoundModel<'a> {
    /// Weight vectors for every resource dimension `pods` use: unit vectors, plus GPU-heavy mixes
    /// with cpu and memory.
    pub fn new<'p>(pods: impl IntoIterator<Item = &'p Pod>, templates: &'a [Template]) -> Self {
        let mut names: Vec<String> = pods.into_iter().flat_map(dims).map(|(n, _)| n).collect();
        names.sort();
        names.dedup();
        let mut weights: Vec<Vec<(String, f64)>> =
            names.iter().map(|n| vec![(n.clone(), 1.0)]).collect();
        for gpu in names.iter().filter(|n| {
            n.contains("gpu")
                || n.contains("mig")
                || n.starts_with("share/")
                || n.as_str() == DEVICES
        }) {
            for other in ["cpu", "memory"] {
                for a in [0.5, 0.8] {
                    weights.push(vec![(gpu.clone(), a), (other.to_string(), 1.0 - a)]);
                }
            }
        }
        BoundModel { templates, weights }
    }

    pub fn weight_count(&self) -> usize {
        self.weights.len()
    }

    /// $/hour this pod contributes under each weight vector (all zero when nothing can host it).
    pub fn pod_costs(&self, p: &Pod) -> Vec<f64> {
        let d = dims(p);
        let cands: Vec<(f64, &Template)> = self
            .templates
            .iter()
            .filter_map(|t| price_for(p, t).map(|price| (price, t)))
            .collect();
        self.weights
            .iter()
            .map(|w| {
                cands
                    .iter()
                    .map(|(price, t)| {
                        let s: f64 = w
                            .iter()
                            .map(|(n, wr)| {
                                let req = d.iter().find(|(x, _)| x == n).map_or(0.0, |(_, v)| *v);
                                let c = cap(t, n);
                                if req > 0.0 && c > 0.0 {
                                    wr * req / c
                                } else {
                                    0.0
                                }
                            })
                            .sum();
                        price * s
                    })
                    .min_by(f64::total_cmp)
                    .unwrap_or(0.0)
            })
            .collect()
    }
}

/// Lower bound in $/hour for hosting all of `pods` on new nodes of `templates`. Pods no template
/// can host are left out.
pub fn lower_bound(pods: &[&Pod], templates: &[Template]) -> f64 {
    let model = BoundModel::new(pods.iter().copied(), templates);
    let mut sums = vec![0.0; model.weight_count()];
    for p in pods {
        for (s, c) in sums.iter_mut().zip(model.pod_costs(p)) {
            *s += c;
        }
    }
    sums.into_iter().fold(0.0, f64::max)
}
