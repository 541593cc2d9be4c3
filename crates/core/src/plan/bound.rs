//! A provable lower bound on the $/hour of new nodes needed for a set of pods, to judge packing.
//!
//! **The covering LP.** A *node type* `k` is a template at one price of its available offerings
//! (price `P_k`, capacity `C_kr` per resource dimension `r`). Pods with the same demand `d_r` and
//! the same node types that can host them form a class `c` of `n_c` pods. Any packing of the pods
//! onto `x_k` nodes of type `k`, `y_ck` pods of class `c` on them, satisfies
//!
//! ```text
//!   sum_k y_ck >= n_c                                   for every class c
//!   sum_c d_cr y_ck <= C_kr x_k                         for every type k and dimension r
//!   sum_c u_j(d_cr / C_kr) y_ck <= x_k                  for every k, r and j = 1, 2, 3
//!   sum_k x_k >= 1                                      (when there is a pod at all)
//! ```
//!
//! where `u_j` are the dual-feasible functions of Fekete and Schepers (`u_j(x) = x` when `(j+1)x`
//! is an integer, else `floor((j+1)x) / j`): on one node the pods' fractions of a dimension sum to
//! at most 1, so their `u_j` do too. These rows are what integrality adds cheaply: with `u_1`, two
//! pods that each take more than half a node's GPUs never share it; with `u_2`, three pods of 3
//! GPUs never share an 8-GPU node. The cost `sum_k P_k x_k` of any packing is at least the
//! minimum of this LP, which by LP duality is at least the value of *any* feasible solution of its
//! dual:
//!
//! ```text
//!   maximise sum_c n_c v_c + nu
//!   v_c <= sum_r d_cr lambda_kr + sum_{j,r} u_j(d_cr / C_kr) mu_kjr     for every type k hosting c
//!   sum_r C_kr lambda_kr + sum_{j,r} mu_kjr + nu <= P_k                 for every type k
//!   lambda, mu, nu >= 0
//! ```
//!
//! Feasibility of `(lambda, mu, nu)` does not depend on the pods, so one dual solution bounds every
//! set of pods: each pod costs `v_p = min_k (...)` over the types that can host it, the bound is
//! `nu + sum_p v_p` (`nu` only when some pod can be hosted), a sum over pods. A set that changes
//! over time (the simulator) keeps one running sum per dual solution and takes the largest; the
//! dual solutions come from solving this LP ([`microlp`]) at a few instants, repaired to exact
//! feasibility by scaling, plus the single-weight-vector solutions (`lambda_kr = P_k w_r / C_kr`)
//! the bound used before. The price of the cheapest node that can host the most demanding pod
//! present is a bound too, and the largest of all is taken at every instant.
//!
//! The devices a pod's ResourceClaims take are one more dimension, against *all* of a template's
//! predicted devices: a device is allocated to one request only, so the pods of a node take at
//! most its device count together, whatever kinds they select. A pod with claims counts only
//! templates with at least that many devices (a superset of those whose devices satisfy its
//! selectors, which keeps the minimum a lower one).

use crate::hash::HashMap;

use microlp::{ComparisonOp, OptimizationDirection, Problem, Variable};

use crate::model::dra::DeviceCount;
use crate::model::Pod;

use super::templates::Template;

/// The dimension of the devices a pod's ResourceClaims take, against all of a template's
/// predicted devices.
const DEVICES: &str = "dra/devices";

/// The dual-feasible functions `u_j` used as cuts, by `j`.
const DFF: [i64; 3] = [1, 2, 3];

/// Devices a pod's claims take at the least: per request, the smallest count among its
/// alternatives (`allocationMode: All` takes at least one). Claims already allocated, or carried
/// by another pod, take none here.
fn claimed_devices(p: &Pod) -> i64 {
    p.claims
        .iter()
        .filter(|c| c.needs_devices())
        .flat_map(|c| c.spec.requests.iter())
        .filter_map(|r| {
            r.alternatives
                .iter()
                .map(|a| match a.count {
                    DeviceCount::Exact(n) => n as i64,
                    DeviceCount::All => 1,
                })
                .min()
        })
        .sum()
}

fn dims(p: &Pod) -> Vec<(String, i64)> {
    let mut d: Vec<(String, i64)> = p
        .requests
        .dimensions()
        .into_iter()
        .filter(|(_, v)| *v > 0)
        .map(|(n, v)| (n.to_string(), v))
        .collect();
    if let Some(s) = &p.share {
        d.push(("share/mem".into(), s.mem_gib));
        d.push(("share/core".into(), s.core_pct));
    }
    let devices = claimed_devices(p);
    if devices > 0 {
        d.push((DEVICES.into(), devices));
    }
    d
}

fn cap(t: &Template, name: &str) -> i64 {
    match name {
        "share/mem" => t.shared.iter().map(|g| g.mem_gib).sum(),
        "share/core" => t.shared.iter().map(|g| g.core_pct).sum(),
        DEVICES => t.devices.len() as i64,
        n => t.allocatable.get(n),
    }
}

/// Whether `p` fits a new node of `t` at all (resources, shared GPUs, devices, taints).
fn fits(p: &Pod, t: &Template) -> bool {
    p.requests.fits_in(&t.allocatable)
        && p.share
            .is_none_or(|s| crate::model::resources::share_copies(&t.shared, &s) > 0)
        && claimed_devices(p) <= t.devices.len() as i64
        && p.constraints.tolerates(&t.taints)
}

/// `u_j(d / c)`: `d / c` when `(j+1) d / c` is an integer, else `floor((j+1) d / c) / j`.
fn dff(j: i64, d: i64, c: i64) -> f64 {
    if d <= 0 || c <= 0 {
        return 0.0;
    }
    let (d, c, j) = (d as i128, c as i128, j as i128);
    if ((j + 1) * d) % c == 0 {
        d as f64 / c as f64
    } else {
        (((j + 1) * d) / c) as f64 / j as f64
    }
}

/// A template at one price of its available offerings.
struct NodeType {
    price: f64,
    /// Per dimension of the model.
    cap: Vec<i64>,
}

/// What the bound needs of a pod: its demand per dimension of the model and the node types that
/// can host it (none: the pod is left out of the bound). Pods with equal profiles form a class.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Profile {
    demand: Vec<i64>,
    types: Vec<u32>,
}

impl Profile {
    /// Some node type can host the pod.
    pub fn hostable(&self) -> bool {
        !self.types.is_empty()
    }
}

/// A feasible solution of the dual LP.
struct Dual {
    /// Per type × dimension.
    lambda: Vec<f64>,
    /// Per type × dimension × [`DFF`].
    mu: Vec<f64>,
    nu: f64,
}

/// The node types, dimensions and dual solutions of the bound; see the module's documentation.
pub struct BoundModel {
    dims: Vec<String>,
    types: Vec<NodeType>,
    /// Per template, its node types as (price, type index).
    by_template: Vec<Vec<(f64, u32)>>,
    duals: Vec<Dual>,
    /// The largest capacity per dimension: the LP's unit, for its numerics.
    scale: Vec<f64>,
}

impl BoundModel {
    /// Node types of `templates` and the dimensions `pods` use; its first dual solutions are the
    /// single weight vectors (unit vectors, plus GPU-heavy mixes with cpu and memory).
    pub fn new<'p>(pods: impl IntoIterator<Item = &'p Pod>, templates: &[Template]) -> Self {
        let mut names: Vec<String> = pods.into_iter().flat_map(dims).map(|(n, _)| n).collect();
        names.sort();
        names.dedup();
        let mut types = Vec::new();
        let mut by_template = Vec::new();
        for t in templates {
            let mut prices: Vec<f64> = t
                .offerings
                .iter()
                .filter(|o| o.available)
                .map(|o| o.price)
                .collect();
            prices.sort_by(f64::total_cmp);
            prices.dedup();
            let caps: Vec<i64> = names.iter().map(|n| cap(t, n)).collect();
            by_template.push(
                prices
                    .into_iter()
                    .map(|price| {
                        types.push(NodeType {
                            price,
                            cap: caps.clone(),
                        });
                        (price, types.len() as u32 - 1)
                    })
                    .collect(),
            );
        }
        let scale = (0..names.len())
            .map(|r| types.iter().map(|k| k.cap[r]).max().unwrap_or(0).max(1) as f64)
            .collect();
        let mut model = BoundModel {
            dims: names,
            types,
            by_template,
            duals: Vec::new(),
            scale,
        };
        let n = model.dims.len();
        let mut weights: Vec<Vec<(usize, f64)>> = (0..n).map(|r| vec![(r, 1.0)]).collect();
        for (g, name) in model.dims.iter().enumerate() {
            let gpu_like = name.contains("gpu")
                || name.contains("mig")
                || name.starts_with("share/")
                || name.as_str() == DEVICES;
            if !gpu_like {
                continue;
            }
            for other in ["cpu", "memory"] {
                if let Some(o) = model.dims.iter().position(|x| x == other) {
                    for a in [0.5, 0.8] {
                        weights.push(vec![(g, a), (o, 1.0 - a)]);
                    }
                }
            }
        }
        for w in weights {
            let mut lambda = vec![0.0; model.types.len() * n];
            for (k, ty) in model.types.iter().enumerate() {
                for &(r, wr) in &w {
                    if ty.cap[r] > 0 {
                        lambda[k * n + r] = ty.price * wr / ty.cap[r] as f64;
                    }
                }
            }
            model.duals.push(Dual {
                lambda,
                mu: vec![0.0; model.types.len() * n * DFF.len()],
                nu: 0.0,
            });
        }
        model
    }

    /// The pod's demand on the model's dimensions and the node types that can host it.
    pub fn profile(&self, p: &Pod, templates: &[Template]) -> Profile {
        let d = dims(p);
        let demand = self
            .dims
            .iter()
            .map(|n| d.iter().find(|(x, _)| x == n).map_or(0, |(_, v)| *v))
            .collect();
        let mut types = Vec::new();
        for (t, kinds) in templates.iter().zip(&self.by_template) {
            if !fits(p, t) {
                continue;
            }
            for o in t
                .offerings
                .iter()
                .filter(|o| o.available && p.constraints.matches_node(&o.labels, None))
            {
                if let Some((_, k)) = kinds.iter().find(|(price, _)| *price == o.price) {
                    types.push(*k);
                }
            }
        }
        types.sort_unstable();
        types.dedup();
        Profile { demand, types }
    }

    pub fn dual_count(&self) -> usize {
        self.duals.len()
    }

    /// `nu` of each dual solution: what it adds once when some pod can be hosted.
    pub fn nus(&self) -> Vec<f64> {
        self.duals.iter().map(|d| d.nu).collect()
    }

    /// $/hour a pod of this profile contributes under each dual solution (all zero when nothing
    /// can host it).
    pub fn costs(&self, p: &Profile) -> Vec<f64> {
        self.duals.iter().map(|d| self.cost(d, p)).collect()
    }

    fn cost(&self, dual: &Dual, p: &Profile) -> f64 {
        let n = self.dims.len();
        p.types
            .iter()
            .map(|&k| {
                let k = k as usize;
                let cap = &self.types[k].cap;
                let mut s = 0.0;
                for (r, &d) in p.demand.iter().enumerate() {
                    if d <= 0 {
                        continue;
                    }
                    s += d as f64 * dual.lambda[k * n + r];
                    for (j, &jj) in DFF.iter().enumerate() {
                        let m = dual.mu[(k * n + r) * DFF.len() + j];
                        if m > 0.0 {
                            s += dff(jj, d, cap[r]) * m;
                        }
                    }
                }
                s
            })
            .min_by(f64::total_cmp)
            .unwrap_or(0.0)
    }

    /// The price of the cheapest node that can host a pod of this profile (0 when none can).
    pub fn single_node_price(&self, p: &Profile) -> f64 {
        p.types
            .iter()
            .map(|&k| self.types[k as usize].price)
            .min_by(f64::total_cmp)
            .unwrap_or(0.0)
    }

    /// Solves the dual LP for these classes (profile, pod count) and keeps its solution, made
    /// exactly feasible, as one more dual solution. Returns whether it did: a solver failure
    /// leaves the bound as it was (weaker, still valid).
    pub fn add_dual_for(&mut self, classes: &[(&Profile, f64)]) -> bool {
        let n = self.dims.len();
        let nd = DFF.len();
        let classes: Vec<&(&Profile, f64)> = classes
            .iter()
            .filter(|(p, c)| p.hostable() && *c > 0.0)
            .collect();
        if classes.is_empty() || self.types.is_empty() {
            return false;
        }
        let mut lp = Problem::new(OptimizationDirection::Maximize);
        let min_price = self
            .types
            .iter()
            .map(|k| k.price)
            .fold(f64::INFINITY, f64::min);
        let nu = lp.add_var(1.0, (0.0, min_price));
        // Variables only where a present class has demand: others would stay zero.
        let mut lambda: HashMap<usize, Variable> = HashMap::default();
        let mut mu: HashMap<usize, Variable> = HashMap::default();
        let mut rows: Vec<Vec<(Variable, f64)>> = Vec::new();
        for (p, count) in &classes {
            let v = lp.add_var(*count, (0.0, f64::INFINITY));
            for &k in &p.types {
                let k = k as usize;
                let mut row = vec![(v, 1.0)];
                for (r, &d) in p.demand.iter().enumerate() {
                    if d <= 0 {
                        continue;
                    }
                    let c = self.types[k].cap[r];
                    let l = *lambda
                        .entry(k * n + r)
                        .or_insert_with(|| lp.add_var(0.0, (0.0, f64::INFINITY)));
                    row.push((l, -(d as f64) / self.scale[r]));
                    for (j, &jj) in DFF.iter().enumerate() {
                        let f = dff(jj, d, c);
                        if f > 0.0 {
                            let m = *mu
                                .entry((k * n + r) * nd + j)
                                .or_insert_with(|| lp.add_var(0.0, (0.0, f64::INFINITY)));
                            row.push((m, -f));
                        }
                    }
                }
                rows.push(row);
            }
        }
        for row in rows {
            lp.add_constraint(row, ComparisonOp::Le, 0.0);
        }
        let mut per_type: Vec<Vec<(Variable, f64)>> = vec![vec![(nu, 1.0)]; self.types.len()];
        for (&i, &l) in &lambda {
            let (k, r) = (i / n, i % n);
            per_type[k].push((l, self.types[k].cap[r] as f64 / self.scale[r]));
        }
        for (&i, &m) in &mu {
            per_type[i / (n * nd)].push((m, 1.0));
        }
        for (k, row) in per_type.into_iter().enumerate() {
            if row.len() > 1 {
                lp.add_constraint(row, ComparisonOp::Le, self.types[k].price);
            }
        }
        let Ok(solution) = lp.solve() else {
            return false;
        };
        let Ok(solution) = solution.into_solution() else {
            return false;
        };
        let mut dual = Dual {
            lambda: vec![0.0; self.types.len() * n],
            mu: vec![0.0; self.types.len() * n * nd],
            nu: solution.var_value(nu).max(0.0),
        };
        for (&i, &l) in &lambda {
            dual.lambda[i] = solution.var_value(l).max(0.0) / self.scale[i % n];
        }
        for (&i, &m) in &mu {
            dual.mu[i] = solution.var_value(m).max(0.0);
        }
        // Exactly feasible: scale everything down by the worst ratio of a type's dual row to its
        // price (the rows are homogeneous in lambda, mu and nu).
        let mut factor: f64 = 1.0;
        for (k, ty) in self.types.iter().enumerate() {
            let mut s = dual.nu;
            for r in 0..n {
                s += ty.cap[r] as f64 * dual.lambda[k * n + r];
                for j in 0..nd {
                    s += dual.mu[(k * n + r) * nd + j];
                }
            }
            if s > ty.price {
                factor = factor.min(ty.price / s);
            }
        }
        if factor < 1.0 {
            // A hair below the exact ratio, against rounding in the products above.
            let f = factor * (1.0 - 1e-12);
            dual.nu *= f;
            dual.lambda.iter_mut().for_each(|x| *x *= f);
            dual.mu.iter_mut().for_each(|x| *x *= f);
        }
        self.duals.push(dual);
        true
    }
}

/// Lower bound in $/hour for hosting all of `pods` on new nodes of `templates`: the covering LP
/// solved for them (see the module's documentation). Pods no template can host are left out.
pub fn lower_bound(pods: &[&Pod], templates: &[Template]) -> f64 {
    let mut model = BoundModel::new(pods.iter().copied(), templates);
    // Classes in the pods' order, so that the LP is the same from run to run.
    let mut index: HashMap<Profile, usize> = HashMap::default();
    let mut classes: Vec<(Profile, f64)> = Vec::new();
    for p in pods {
        let profile = model.profile(p, templates);
        match index.get(&profile) {
            Some(&i) => classes[i].1 += 1.0,
            None => {
                index.insert(profile.clone(), classes.len());
                classes.push((profile, 1.0));
            }
        }
    }
    let list: Vec<(&Profile, f64)> = classes.iter().map(|(p, c)| (p, *c)).collect();
    model.add_dual_for(&list);
    value(&model, &list)
}

/// The bound for these classes under the model's dual solutions and the single-node term.
fn value(model: &BoundModel, classes: &[(&Profile, f64)]) -> f64 {
    let any = classes.iter().any(|(p, c)| p.hostable() && *c > 0.0);
    if !any {
        return 0.0;
    }
    let mut sums = model.nus();
    let mut single: f64 = 0.0;
    for (p, c) in classes {
        if !p.hostable() || *c <= 0.0 {
            continue;
        }
        for (s, v) in sums.iter_mut().zip(model.costs(p)) {
            *s += c * v;
        }
        single = single.max(model.single_node_price(p));
    }
    sums.into_iter().fold(single, f64::max)
}
