//! The lower bound of a replay: at every instant, the covering LP's bound (`plan::bound`) for the
//! pods that would be running had every pod started the moment it arrived, integrated over time.
//!
//! It depends only on the input (and on where the run ends, for pods with no end of their own), so
//! every strategy gets the same figure. The bound at an instant is the largest of: `nu + sum_p v_p`
//! under each dual solution the model holds, and the price of the cheapest node that can host the
//! most demanding pod present. Each dual solution is feasible for every set of pods, so the figure
//! is a lower bound whichever solutions are used; the LP is solved for the pods running at
//! [`SAMPLES`] instants spread evenly over the span (and the single-weight solutions are kept), so
//! between those instants the bound is as good as the nearest mix's solution makes it.

use std::collections::{BTreeMap, HashMap};

use gpu_node_autoscaler_core::model::{Snapshot, Time};
use gpu_node_autoscaler_core::plan::bound::{BoundModel, Profile};
use gpu_node_autoscaler_core::plan::templates::build_templates;

use super::{Ms, SimInput, HOUR};

/// Instants at which the covering LP is solved for the pods running then.
pub const SAMPLES: usize = 48;

/// The lower bound in USD of `input` over its span, up to `end` (the run's end: pods with
/// neither a duration nor a deletion run until then).
pub fn lower_bound_usd(input: &SimInput, end: Ms) -> f64 {
    let (templates, _) =
        build_templates(&input.policy, &input.catalog, &Snapshot::default(), Time(0));
    let mut model = BoundModel::new(input.pods.iter().map(|w| &w.pod), &templates);
    let horizon = input.until.map_or(end, |u| u.min(end));
    let mut ids: HashMap<Profile, usize> = HashMap::new();
    let mut classes: Vec<Profile> = Vec::new();
    // (time, +1 or -1, class); at one time, ends before starts.
    let mut events: Vec<(Ms, i8, usize)> = Vec::new();
    for w in &input.pods {
        let stop = match (w.duration, w.deleted_at) {
            (Some(d), Some(del)) => (w.arrival + d).min(del),
            (Some(d), None) => w.arrival + d,
            (None, Some(del)) => del,
            (None, None) => horizon,
        }
        .min(horizon);
        if stop <= w.arrival {
            continue;
        }
        let profile = model.profile(&w.pod, &templates);
        if !profile.hostable() {
            continue;
        }
        let id = match ids.get(&profile) {
            Some(id) => *id,
            None => {
                classes.push(profile.clone());
                ids.insert(profile, classes.len() - 1);
                classes.len() - 1
            }
        };
        events.push((w.arrival, 1, id));
        events.push((stop, -1, id));
    }
    if events.is_empty() {
        return 0.0;
    }
    events.sort_unstable();

    // The mixes running at the sample instants, then one dual solution per distinct mix.
    let (t0, t1) = (events[0].0, events[events.len() - 1].0);
    let mut mixes: Vec<Vec<(usize, i64)>> = Vec::new();
    let mut counts = vec![0i64; classes.len()];
    let mut next = 0;
    for i in 0..SAMPLES {
        let at = t0 + ((t1 - t0) as f64 * (i as f64 + 0.5) / SAMPLES as f64) as Ms;
        while next < events.len() && events[next].0 <= at {
            counts[events[next].2] += events[next].1 as i64;
            next += 1;
        }
        let mix: Vec<(usize, i64)> = counts
            .iter()
            .enumerate()
            .filter(|(_, n)| **n > 0)
            .map(|(c, n)| (c, *n))
            .collect();
        if !mix.is_empty() && !mixes.contains(&mix) {
            mixes.push(mix);
        }
    }
    for mix in &mixes {
        let list: Vec<(&Profile, f64)> =
            mix.iter().map(|(c, n)| (&classes[*c], *n as f64)).collect();
        model.add_dual_for(&list);
    }

    // Capacity reservations a pool selects are free up to their count: any solution that uses
    // k of them costs at least the market bound less k nodes of their type at its cheapest
    // market price (put back at that price, it is a market solution). Their starts and ends
    // split the integration (events of no class).
    let reserved = reserved_credit(input, &templates);
    if !reserved.is_empty() {
        for (r, _) in &reserved {
            for t in [r.start_ms, r.end_ms].into_iter().flatten() {
                events.push((t, 0, usize::MAX));
            }
        }
        events.sort_unstable();
    }

    // Integrate: one running sum per dual solution, and the dearest single-pod node present.
    let costs: Vec<Vec<f64>> = classes.iter().map(|p| model.costs(p)).collect();
    let singles: Vec<u64> = classes
        .iter()
        .map(|p| model.single_node_price(p).to_bits())
        .collect();
    let nus = model.nus();
    let mut sums = vec![0.0; nus.len()];
    let mut present: BTreeMap<u64, i64> = BTreeMap::new();
    let mut running = 0i64;
    let mut total = 0.0;
    let mut prev = t0;
    for &(t, delta, c) in &events {
        if t > prev && running > 0 {
            let single = present
                .keys()
                .next_back()
                .map_or(0.0, |b| f64::from_bits(*b));
            let at = sums
                .iter()
                .zip(&nus)
                .map(|(s, nu)| s + nu)
                .fold(single, f64::max);
            let at = match reserved.iter().try_fold(0.0, |credit, (r, price)| {
                match (r.active_at(prev), price) {
                    (false, _) => Some(credit),
                    (true, Some(p)) => Some(credit + f64::from(r.total) * p),
                    // A type with no market price: no market solution to compare with.
                    (true, None) => None,
                }
            }) {
                Some(credit) => (at - credit).max(0.0),
                None => 0.0,
            };
            total += at * (t - prev) as f64 / HOUR as f64;
        }
        prev = t;
        if c == usize::MAX {
            continue;
        }
        running += delta as i64;
        let d = delta as f64;
        for (s, v) in sums.iter_mut().zip(&costs[c]) {
            *s += d * v;
        }
        let e = present.entry(singles[c]).or_default();
        *e += delta as i64;
        if *e == 0 {
            present.remove(&singles[c]);
        }
        if running == 0 {
            // No drift carried across an empty spell.
            sums.iter_mut().for_each(|s| *s = 0.0);
        }
    }
    total
}

/// The reservations some pool selects, each with the cheapest market price (available, not
/// reserved) of its instance type among the templates; `None` where the market has none.
fn reserved_credit<'a>(
    input: &'a SimInput,
    templates: &[gpu_node_autoscaler_core::plan::Template],
) -> Vec<(&'a gpu_node_autoscaler_provider::Reservation, Option<f64>)> {
    input
        .reservations
        .iter()
        .filter(|r| input.policy.pools.iter().any(|p| p.selects_reservation(r)))
        .map(|r| {
            let price = templates
                .iter()
                .filter(|t| t.instance_type == r.instance_type)
                .flat_map(|t| &t.offerings)
                .filter(|o| {
                    o.available
                        && o.key.capacity_type
                            != gpu_node_autoscaler_provider::CapacityType::Reserved
                })
                .map(|o| o.price)
                .min_by(f64::total_cmp);
            (r, price)
        })
        .collect()
}
