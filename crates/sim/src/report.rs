//! What a run measured, and how it is shown: a table for people, JSON for machines.

use std::fmt::Write;

use serde::Serialize;

pub use super::plot::SeriesPoint;

/// Everything one strategy's run measured.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Metrics {
    pub strategy: String,
    pub scenario: String,
    pub span_s: f64,
    pub cost_usd: f64,
    pub lower_bound_usd: f64,
    pub cost_over_lower_bound: f64,
    pub gpu_hours_provisioned: f64,
    pub gpu_hours_requested: f64,
    pub gpu_allocation_ratio: f64,
    pub pods_total: usize,
    pub pods_never_placed: usize,
    pub wait_p50_s: f64,
    pub wait_p95_s: f64,
    pub wait_p99_s: f64,
    pub scale_ups: usize,
    pub nodes_launched: usize,
    pub nodes_removed: usize,
    pub evictions: usize,
    pub spot_interruptions: usize,
    /// Nodes whose GPU broke.
    pub gpu_failures: usize,
    /// GPU-hours of work lost to interruptions and broken GPUs: per disrupted pod, its GPUs ×
    /// the time from the notice or the failure to it running again (or to the end).
    pub lost_gpu_hours: f64,
    /// GPUs of the pods whose work was disrupted (each disruption counted once).
    pub disrupted_gpus: f64,
    /// `lost_gpu_hours` per disrupted GPU, in seconds: how long a disruption lasts on average
    /// (comparable across strategies whose failures hit different nodes).
    pub recovery_s_per_gpu: f64,
    /// Idle GPU-hours (provisioned, not requested), split: GPUs of instances from launch until
    /// their node advertised them (booting, device plugin starting)...
    pub idle_gpu_hours_booting: f64,
    /// ...GPUs of nodes holding no pod but DaemonSet pods (waiting for scale-down)...
    pub idle_gpu_hours_empty: f64,
    /// ...and the rest: free GPUs on nodes that run pods (fragmentation).
    pub idle_gpu_hours_fragmented: f64,
    /// What the capacity reservations cost over the run, used or not: sunk, so not in
    /// `cost_usd` (reserved nodes cost nothing more there); reported for the whole picture.
    #[serde(skip_serializing_if = "is_zero_f")]
    pub reserved_cost_usd: f64,
    /// What the capacity held for CapacityBuffers cost (included in `cost_usd`): each chunk's
    /// share of its node's price while it holds it.
    #[serde(skip_serializing_if = "is_zero_f")]
    pub buffer_cost_usd: f64,
    /// Pods still running on a node when its capacity reservation ended (their work is lost).
    #[serde(skip_serializing_if = "is_zero")]
    pub pods_on_ended_reservations: usize,
    /// Cost per pool × instance type × capacity type.
    pub cost_by_offering: Vec<OfferingCost>,
    pub provider_calls: usize,
    /// Nodes replaced because they were drifted (launched before their pool's template
    /// changed) or expired: drained and removed.
    #[serde(skip_serializing_if = "is_zero")]
    pub lifecycle_replacements: usize,
    /// Pod-hours the pods evicted by those replacements spent pending until they ran again.
    #[serde(skip_serializing_if = "is_zero_f")]
    pub disrupted_pod_hours: f64,
    /// The most nodes being replaced for drift or expiry at once.
    #[serde(skip_serializing_if = "is_zero")]
    pub peak_nodes_disrupted: usize,
    pub wall_s: f64,
    /// Input rows left out, with why and how many.
    pub skipped: Vec<(String, usize)>,
    #[serde(skip)]
    pub waits_s: Vec<f64>,
    #[serde(skip)]
    pub series: Vec<SeriesPoint>,
}

/// What one pool × instance type × capacity type cost over a run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct OfferingCost {
    pub pool: String,
    pub instance_type: String,
    pub capacity_type: String,
    /// Instances launched.
    pub nodes: usize,
    pub cost_usd: f64,
    pub gpu_hours: f64,
}

fn is_zero(v: &usize) -> bool {
    *v == 0
}

fn is_zero_f(v: &f64) -> bool {
    *v == 0.0
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

impl Metrics {
    /// Fills the derived fields (ratios, percentiles).
    pub fn finish(&mut self) {
        let mut w = self.waits_s.clone();
        w.sort_by(f64::total_cmp);
        self.wait_p50_s = percentile(&w, 0.50);
        self.wait_p95_s = percentile(&w, 0.95);
        self.wait_p99_s = percentile(&w, 0.99);
        self.cost_over_lower_bound = if self.lower_bound_usd > 0.0 {
            self.cost_usd / self.lower_bound_usd
        } else {
            0.0
        };
        self.recovery_s_per_gpu = if self.disrupted_gpus > 0.0 {
            self.lost_gpu_hours * 3600.0 / self.disrupted_gpus
        } else {
            0.0
        };
        self.idle_gpu_hours_fragmented = (self.gpu_hours_provisioned
            - self.gpu_hours_requested
            - self.idle_gpu_hours_booting
            - self.idle_gpu_hours_empty)
            .max(0.0);
        self.gpu_allocation_ratio = if self.gpu_hours_provisioned > 0.0 {
            self.gpu_hours_requested / self.gpu_hours_provisioned
        } else {
            0.0
        };
    }
}

#[derive(Serialize)]
struct Json<'a> {
    scenario: &'a str,
    strategies: &'a [Metrics],
}

pub fn to_json(scenario: &str, runs: &[Metrics]) -> String {
    serde_json::to_string_pretty(&Json {
        scenario,
        strategies: runs,
    })
    .expect("metrics serialize")
}

fn span(s: f64) -> String {
    if s >= 2.0 * 86400.0 {
        format!("{:.1}d", s / 86400.0)
    } else if s >= 3600.0 {
        format!("{:.1}h", s / 3600.0)
    } else {
        format!("{:.0}m", s / 60.0)
    }
}

pub fn to_table(scenario: &str, runs: &[Metrics]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "Scenario: {scenario}");
    type Row = (&'static str, fn(&Metrics) -> String);
    let rows: Vec<Row> = vec![
        ("simulated span", |m| span(m.span_s)),
        ("total cost (USD)", |m| format!("{:.2}", m.cost_usd)),
        ("lower bound (USD)", |m| format!("{:.2}", m.lower_bound_usd)),
        ("cost / lower bound", |m| {
            format!("{:.3}", m.cost_over_lower_bound)
        }),
        ("GPU-hours provisioned", |m| {
            format!("{:.1}", m.gpu_hours_provisioned)
        }),
        ("GPU-hours requested", |m| {
            format!("{:.1}", m.gpu_hours_requested)
        }),
        ("GPU allocation ratio", |m| {
            format!("{:.3}", m.gpu_allocation_ratio)
        }),
        ("pods", |m| m.pods_total.to_string()),
        ("pods never placed", |m| m.pods_never_placed.to_string()),
        ("wait p50 (s)", |m| format!("{:.0}", m.wait_p50_s)),
        ("wait p95 (s)", |m| format!("{:.0}", m.wait_p95_s)),
        ("wait p99 (s)", |m| format!("{:.0}", m.wait_p99_s)),
        ("scale-ups", |m| m.scale_ups.to_string()),
        ("nodes launched", |m| m.nodes_launched.to_string()),
        ("nodes removed", |m| m.nodes_removed.to_string()),
        ("evictions", |m| m.evictions.to_string()),
        ("spot interruptions", |m| m.spot_interruptions.to_string()),
        ("idle GPU-h: booting", |m| {
            format!("{:.1}", m.idle_gpu_hours_booting)
        }),
        ("idle GPU-h: empty nodes", |m| {
            format!("{:.1}", m.idle_gpu_hours_empty)
        }),
        ("idle GPU-h: fragmented", |m| {
            format!("{:.1}", m.idle_gpu_hours_fragmented)
        }),
        ("GPU failures", |m| m.gpu_failures.to_string()),
        ("GPU-hours of work lost", |m| {
            format!("{:.2}", m.lost_gpu_hours)
        }),
        ("recovery per GPU (s)", |m| {
            format!("{:.0}", m.recovery_s_per_gpu)
        }),
        ("wall time (s)", |m| format!("{:.2}", m.wall_s)),
    ];
    let mut rows = rows;
    // Drift and expiry, only where there was some (other reports stay as they were).
    if runs
        .iter()
        .any(|m| m.lifecycle_replacements > 0 || m.peak_nodes_disrupted > 0)
    {
        let at = rows.len() - 1;
        let lifecycle: [Row; 3] = [
            ("drift/expiry replaced", |m| {
                m.lifecycle_replacements.to_string()
            }),
            ("disrupted pod-hours", |m| {
                format!("{:.2}", m.disrupted_pod_hours)
            }),
            ("peak nodes disrupted", |m| {
                m.peak_nodes_disrupted.to_string()
            }),
        ];
        rows.splice(at..at, lifecycle);
    }
    let _ = write!(s, "{:<24}", "");
    for m in runs {
        let _ = write!(s, " {:>20}", m.strategy);
    }
    s.push('\n');
    for (label, f) in rows {
        let _ = write!(s, "{label:<24}");
        for m in runs {
            let _ = write!(s, " {:>20}", f(m));
        }
        s.push('\n');
    }
    if runs
        .iter()
        .any(|m| m.reserved_cost_usd > 0.0 || m.pods_on_ended_reservations > 0)
    {
        let _ = write!(s, "{:<24}", "reservations (USD, sunk)");
        for m in runs {
            let _ = write!(s, " {:>20}", format!("{:.2}", m.reserved_cost_usd));
        }
        s.push('\n');
        let _ = write!(s, "{:<24}", "pods at reservation end");
        for m in runs {
            let _ = write!(s, " {:>20}", m.pods_on_ended_reservations);
        }
        s.push('\n');
    }
    if runs.iter().any(|m| m.buffer_cost_usd > 0.0) {
        let _ = write!(s, "{:<24}", "of which buffers (USD)");
        for m in runs {
            let _ = write!(s, " {:>20}", format!("{:.2}", m.buffer_cost_usd));
        }
        s.push('\n');
    }
    let _ = writeln!(s, "\ncost by pool, instance type and capacity type:");
    for m in runs {
        let mut lines: Vec<&OfferingCost> = m.cost_by_offering.iter().collect();
        lines.sort_by(|a, b| b.cost_usd.total_cmp(&a.cost_usd));
        for l in lines {
            let share = if m.cost_usd > 0.0 {
                100.0 * l.cost_usd / m.cost_usd
            } else {
                0.0
            };
            let _ = writeln!(
                s,
                "  {:<20} {:<12} {:<14} {:<10} {:>10.2} USD {:>5.1} % {:>5} nodes",
                m.strategy, l.pool, l.instance_type, l.capacity_type, l.cost_usd, share, l.nodes
            );
        }
    }
    if let Some(m) = runs.first() {
        for (why, n) in &m.skipped {
            let _ = writeln!(s, "skipped {n} input row(s): {why}");
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.5), 50.0);
        assert_eq!(percentile(&v, 0.95), 95.0);
        assert_eq!(percentile(&v, 0.99), 99.0);
        assert_eq!(percentile(&[], 0.5), 0.0);
        assert_eq!(percentile(&[7.0], 0.99), 7.0);
    }

    #[test]
    fn ratios_are_derived() {
        let mut m = Metrics {
            cost_usd: 110.0,
            lower_bound_usd: 100.0,
            gpu_hours_provisioned: 10.0,
            gpu_hours_requested: 8.0,
            waits_s: vec![3.0, 1.0, 2.0],
            ..Default::default()
        };
        m.finish();
        assert!((m.cost_over_lower_bound - 1.1).abs() < 1e-12);
        assert!((m.gpu_allocation_ratio - 0.8).abs() < 1e-12);
        assert_eq!(m.wait_p50_s, 2.0);
        let j = to_json("s", &[m]);
        assert!(j.contains("\"strategies\""));
        assert!(j.contains("\"wait_p95_s\""));
        assert!(j.contains("\"cost_usd\": 110.0"));
    }
}
