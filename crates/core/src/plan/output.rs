//! Rendering a plan: the JSON schema documented in `docs/plan-output.md`, and a table for people.

use std::fmt::Write;

use super::Plan;

pub fn to_json(plan: &Plan) -> String {
    serde_json::to_string_pretty(plan).expect("a plan always serializes")
}

pub fn to_table(plan: &Plan) -> String {
    let mut s = String::new();
    if plan.scale_ups.is_empty() {
        s.push_str("No scale-up.\n");
    } else {
        let _ = writeln!(
            s,
            "{:<20} {:>5}  {:<16} {:<12} {:<10} {:>9}  PODS",
            "SCALE-UP POOL", "COUNT", "INSTANCE TYPE", "ZONE", "CAPACITY", "$/HOUR"
        );
        for u in &plan.scale_ups {
            let first = u.offerings.first();
            let pods = if u.pods.len() > 3 {
                format!("{}, ... ({} pods)", u.pods[..3].join(", "), u.pods.len())
            } else {
                u.pods.join(", ")
            };
            let _ = writeln!(
                s,
                "{:<20} {:>5}  {:<16} {:<12} {:<10} {:>9.3}  {}{}",
                u.pool,
                u.count,
                first.map_or("-", |o| o.instance_type.as_str()),
                first.map_or("-", |o| o.zone.as_str()),
                first.map_or("-", |o| o.capacity_type.as_str()),
                u.cost_per_hour(),
                pods,
                u.gang
                    .as_ref()
                    .map(|g| format!(" [gang {g}]"))
                    .unwrap_or_default()
            );
            if u.offerings.len() > 1 {
                let fb: Vec<String> = u.offerings[1..]
                    .iter()
                    .map(|o| format!("{}/{}", o.zone, o.capacity_type))
                    .collect();
                let _ = writeln!(s, "{:<28}fallback: {}", "", fb.join(" > "));
            }
        }
        let _ = writeln!(s, "Added cost: ${:.3}/hour", plan.added_cost_per_hour);
    }
    if !plan.scale_downs.is_empty() {
        let _ = writeln!(
            s,
            "\n{:<32} {:<20} {:>9}  REASON",
            "SCALE-DOWN NODE", "POOL", "SAVES/H"
        );
        for d in &plan.scale_downs {
            let _ = writeln!(
                s,
                "{:<32} {:<20} {:>9.3}  {}",
                d.node, d.pool, d.saves_per_hour, d.reason
            );
            for e in &d.evict {
                let _ = writeln!(s, "{:<32} evict {} -> {}", "", e.pod, e.to);
            }
        }
    }
    if !plan.unneeded.is_empty() {
        let _ = writeln!(s, "\n{:<32} SINCE", "UNNEEDED NODE");
        for u in &plan.unneeded {
            let _ = writeln!(s, "{:<32} {}", u.node, u.since);
        }
    }
    if !plan.kept.is_empty() {
        let _ = writeln!(s, "\n{:<32} KEPT BECAUSE", "IDLE NODE");
        for k in &plan.kept {
            let _ = writeln!(s, "{:<32} {}", k.node, k.reason);
        }
    }
    if !plan.existing_capacity.is_empty() {
        let _ = writeln!(
            s,
            "\n{} pending pod(s) fit existing or incoming capacity.",
            plan.existing_capacity.len()
        );
    }
    if !plan.unschedulable.is_empty() {
        let _ = writeln!(s, "\n{:<40} REASON", "UNSCHEDULABLE POD");
        for u in &plan.unschedulable {
            let _ = writeln!(s, "{:<40} {}", u.pod, u.reason);
        }
    }
    for w in &plan.warnings {
        let _ = writeln!(s, "warning: {w}");
    }
    s
}
