//! The Alibaba GPU cluster trace format (`openb_pod_list_*.csv`) and the built-in policy that maps
//! its GPU models onto catalog instance types.
//!
//! Columns: `name,cpu_milli,memory_mib,num_gpu,gpu_milli` and, optionally,
//! `gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time` (seconds from the trace
//! start). A pod per row:
//! - arrives at `creation_time` and runs for `deletion_time - scheduled_time` once placed;
//! - `num_gpu == 1 && gpu_milli < 1000` is a shared-GPU fraction, requested as
//!   `aliyun.com/gpu-core.percentage` (rounded up to a multiple of 5);
//! - `gpu_spec` (`|`-separated models) is a constraint on the node label
//!   `trace.gpu-node-autoscaler.io/model`.
//!
//! Rows left out, and counted in the report: CPU-only tasks (`num_gpu == 0`: not a GPU
//! autoscaler's job), tasks that never ran in the traced cluster (empty `scheduled_time`: their
//! run time is unknown) and rows whose deletion precedes their scheduling. Files without time
//! columns (the `multigpu*` samples) are a burst: every pod arrives at 0 and runs for the given
//! default duration.

use std::collections::BTreeMap;
use std::sync::Arc;

use gpu_node_autoscaler_core::model::constraints::{Constraints, Operator, Requirement, Term};
use gpu_node_autoscaler_core::model::resources::{GpuShare, Resources};
use gpu_node_autoscaler_core::model::{Owner, OwnerKind, Pod, PodPhase, PodRef, Time};
use gpu_node_autoscaler_core::policy::Policy;

use super::{Ms, WorkloadPod, SECOND};

/// The node label pools carry to say which trace GPU model they stand for.
pub const MODEL_LABEL: &str = "trace.gpu-node-autoscaler.io/model";

/// Trace GPU model → catalog instance types, in the built-in trace policy. P100 and the
/// undisclosed G2/G3 have no AWS equivalent: they map to the nearest generation offered.
pub const MODEL_MAP: [(&str, &str, &[&str]); 7] = [
    (
        "T4",
        "t4",
        &[
            "g4dn.xlarge",
            "g4dn.2xlarge",
            "g4dn.4xlarge",
            "g4dn.8xlarge",
            "g4dn.12xlarge",
            "g4dn.16xlarge",
            "g4dn.metal",
        ],
    ),
    ("P100", "p100", &["p3.2xlarge", "p3.8xlarge", "p3.16xlarge"]),
    (
        "V100M16",
        "v100m16",
        &["p3.2xlarge", "p3.8xlarge", "p3.16xlarge"],
    ),
    ("V100M32", "v100m32", &["p3dn.24xlarge"]),
    (
        "A10",
        "a10",
        &[
            "g5.xlarge",
            "g5.2xlarge",
            "g5.4xlarge",
            "g5.8xlarge",
            "g5.12xlarge",
            "g5.16xlarge",
            "g5.24xlarge",
            "g5.48xlarge",
        ],
    ),
    (
        "G2",
        "g2",
        &[
            "g6.xlarge",
            "g6.2xlarge",
            "g6.4xlarge",
            "g6.12xlarge",
            "g6.24xlarge",
            "g6.48xlarge",
        ],
    ),
    ("G3", "g3", &["g6e.xlarge", "g6e.12xlarge", "g6e.48xlarge"]),
];

/// The built-in policy for traces: per trace model a whole-GPU pool and a shared-GPU pool
/// (on-demand, two zones), labelled with the model; idle GPU nodes go after 3 minutes.
pub fn default_trace_policy() -> String {
    let mut s = String::from(
        "apiVersion: gpu-node-autoscaler.io/v1alpha1\nkind: ScalingPolicy\nclusterName: trace\nzones: [us-east-1a, us-east-1b]\npools:\n",
    );
    for (model, pool, types) in MODEL_MAP {
        for shared in [false, true] {
            s.push_str(&format!(
                "  - name: {pool}{}\n    instanceTypes: [{}]\n    capacityTypes: [on-demand]\n    maxNodes: 2000\n    labels: {{{MODEL_LABEL}: {model}}}\n    scaleDown: {{unneededTime: 3m, cooldownAfterScaleUp: 3m}}\n    consolidation: {{enabled: true, moveJobs: true}}\n",
                if shared { "-shared" } else { "" },
                types.join(", ")
            ));
            if shared {
                s.push_str("    gpuMode: shared\n");
            }
        }
    }
    s
}

/// The trace models a policy maps (values of [`MODEL_LABEL`] on its pools).
pub fn mapped_models(policy: &Policy) -> Vec<String> {
    let mut m: Vec<String> = policy
        .pools
        .iter()
        .filter_map(|p| p.labels.get(MODEL_LABEL).cloned())
        .collect();
    m.sort();
    m.dedup();
    m
}

pub struct Trace {
    pub pods: Vec<WorkloadPod>,
    pub skipped: Vec<(String, usize)>,
}

/// Reads a trace. `default_duration` applies to files without time columns.
pub fn load_trace(
    text: &str,
    file: &str,
    policy: &Policy,
    default_duration: Ms,
) -> Result<Trace, String> {
    let mut rdr = csv::ReaderBuilder::new()
        .trim(csv::Trim::All)
        .from_reader(text.as_bytes());
    let headers = rdr
        .headers()
        .map_err(|e| format!("{file}:1: cannot read the header: {e}"))?
        .clone();
    let col = |name: &str| headers.iter().position(|h| h == name);
    let need = |name: &str| col(name).ok_or_else(|| format!("{file}:1: missing column `{name}`"));
    let (c_name, c_cpu, c_mem, c_gpu, c_milli) = (
        need("name")?,
        need("cpu_milli")?,
        need("memory_mib")?,
        need("num_gpu")?,
        need("gpu_milli")?,
    );
    let c_spec = col("gpu_spec");
    let times = match (
        col("creation_time"),
        col("deletion_time"),
        col("scheduled_time"),
    ) {
        (Some(c), Some(d), Some(s)) => Some((c, d, s)),
        _ => None,
    };
    let models = mapped_models(policy);
    let mut constraints: BTreeMap<String, Arc<Constraints>> = BTreeMap::new();
    let none = Arc::new(Constraints::default());
    let mut pods = Vec::new();
    let mut skipped: BTreeMap<&'static str, usize> = BTreeMap::new();
    for rec in rdr.records() {
        let rec =
            rec.map_err(|e| format!("{file}:{}: {e}", e.position().map_or(0, |p| p.line())))?;
        let line = rec.position().map_or(0, |p| p.line());
        let field = |i: usize, name: &str| -> Result<i64, String> {
            let v = rec.get(i).unwrap_or("");
            v.parse::<i64>().ok().filter(|x| *x >= 0).ok_or_else(|| {
                format!("{file}:{line}: field `{name}`: expected a non-negative integer, got {v:?}")
            })
        };
        let seconds = |v: i64, name: &str| {
            v.checked_mul(SECOND).ok_or_else(|| {
                format!("{file}:{line}: field `{name}`: {v} seconds is out of range")
            })
        };
        let num_gpu = field(c_gpu, "num_gpu")?;
        let gpu_milli = field(c_milli, "gpu_milli")?;
        let cpu = field(c_cpu, "cpu_milli")?;
        let mem = field(c_mem, "memory_mib")?;
        if num_gpu == 0 {
            *skipped.entry("CPU-only task (num_gpu 0)").or_default() += 1;
            continue;
        }
        let (arrival, duration) = match times {
            None => (0, default_duration),
            Some((c, d, s)) => {
                if rec.get(s).unwrap_or("").is_empty() {
                    *skipped
                        .entry("never ran in the traced cluster (no scheduled_time)")
                        .or_default() += 1;
                    continue;
                }
                let (created, deleted, scheduled) = (
                    field(c, "creation_time")?,
                    field(d, "deletion_time")?,
                    field(s, "scheduled_time")?,
                );
                if deleted < scheduled {
                    *skipped
                        .entry("deleted before it was scheduled")
                        .or_default() += 1;
                    continue;
                }
                (
                    seconds(created, "creation_time")?,
                    seconds(deleted - scheduled, "deletion_time")?.max(SECOND),
                )
            }
        };
        let mut requests = Resources {
            cpu_milli: cpu,
            memory: mem.checked_mul(1 << 20).ok_or_else(|| {
                format!("{file}:{line}: field `memory_mib`: {mem} is out of range")
            })?,
            pods: 1,
            ..Default::default()
        };
        let mut share = None;
        if num_gpu == 1 && gpu_milli < 1000 {
            let pct = (gpu_milli + 9) / 10;
            share = Some(GpuShare {
                mem_gib: 0,
                core_pct: ((pct + 4) / 5 * 5).clamp(5, 100),
            });
        } else {
            requests.gpu = num_gpu;
        }
        let spec = c_spec.and_then(|i| rec.get(i)).unwrap_or("");
        let cons = if spec.is_empty() {
            none.clone()
        } else {
            let mut wanted: Vec<String> = spec.split('|').map(str::to_string).collect();
            wanted.sort();
            wanted.dedup();
            for m in &wanted {
                if !models.contains(m) {
                    return Err(format!(
                        "{file}:{line}: field `gpu_spec`: GPU model {m:?} is not mapped by the policy (it maps: {}; pools carry the label {MODEL_LABEL})",
                        models.join(", ")
                    ));
                }
            }
            constraints
                .entry(wanted.join("|"))
                .or_insert_with(|| {
                    Arc::new(Constraints {
                        affinity: Some(vec![Term {
                            requirements: vec![Requirement {
                                key: MODEL_LABEL.into(),
                                operator: Operator::In,
                                values: wanted.clone(),
                            }],
                            node_names: None,
                        }]),
                        ..Default::default()
                    })
                })
                .clone()
        };
        let name = rec.get(c_name).unwrap_or("").to_string();
        pods.push(WorkloadPod {
            pod: Pod {
                id: PodRef::new("trace", name.clone()),
                uid: name.clone(),
                labels: Default::default(),
                annotations: Default::default(),
                requests,
                share,
                constraints: cons,
                node_name: None,
                phase: PodPhase::Pending,
                owner: Some(Owner {
                    kind: OwnerKind::Job,
                    name,
                    uid: String::new(),
                }),
                gang: None,
                priority: 0,
                created: Time(arrival),
                started: None,
                deleting: false,
                unschedulable: false,
                scheduler_message: None,
                local_storage: false,
                shared_gpu_index: None,
                nominated_node: None,
                claims: Vec::new(),
                volumes: Vec::new(),
                waiting: None,
                problem: None,
            },
            arrival,
            duration: Some(duration),
            deleted_at: None,
        });
    }
    Ok(Trace {
        pods,
        skipped: skipped
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpu_node_autoscaler_core::policy::parse_policy;

    fn policy() -> Policy {
        parse_policy(&default_trace_policy(), "builtin").unwrap()
    }

    const HEADER: &str = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n";

    #[test]
    fn rows_become_pods() {
        let text = format!(
            "{HEADER}a,12000,16384,1,1000,,LS,Running,10,110,20\nb,6000,12288,1,460,,LS,Running,5,50,5\nc,1000,1024,0,0,,BE,Running,0,9,0\nd,1000,1024,2,1000,T4|V100M32,LS,Pending,0,,\ne,88000,327680,8,1000,V100M16|V100M32,LS,Failed,100,200,150\n"
        );
        let t = load_trace(&text, "t.csv", &policy(), 3600 * SECOND).unwrap();
        assert_eq!(t.pods.len(), 3);
        let a = &t.pods[0];
        assert_eq!((a.arrival, a.duration), (10 * SECOND, Some(90 * SECOND)));
        assert_eq!(a.pod.requests.gpu, 1);
        assert_eq!(a.pod.requests.cpu_milli, 12000);
        assert_eq!(a.pod.requests.memory, 16384 << 20);
        let b = &t.pods[1];
        assert_eq!(b.pod.requests.gpu, 0);
        assert_eq!(
            b.pod.share,
            Some(GpuShare {
                mem_gib: 0,
                core_pct: 50
            })
        );
        let e = &t.pods[2];
        assert_eq!(e.pod.requests.gpu, 8);
        let terms = e.pod.constraints.affinity.as_ref().unwrap();
        assert_eq!(terms[0].requirements[0].values, vec!["V100M16", "V100M32"]);
        assert_eq!(
            t.skipped,
            vec![
                ("CPU-only task (num_gpu 0)".to_string(), 1),
                (
                    "never ran in the traced cluster (no scheduled_time)".to_string(),
                    1
                )
            ]
        );
    }

    #[test]
    fn files_without_times_are_a_burst() {
        let text = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\nx,4000,8192,4,1000\n";
        let t = load_trace(text, "m.csv", &policy(), 1800 * SECOND).unwrap();
        assert_eq!(
            (t.pods[0].arrival, t.pods[0].duration),
            (0, Some(1800 * SECOND))
        );
    }

    #[test]
    fn bad_rows_name_file_line_and_field() {
        let text = format!("{HEADER}a,12000,16384,one,1000,,LS,Running,10,110,20\n");
        let e = load_trace(&text, "t.csv", &policy(), 0).err().unwrap();
        assert_eq!(
            e,
            "t.csv:2: field `num_gpu`: expected a non-negative integer, got \"one\""
        );
        let text = format!("{HEADER}a,12000,16384,1,1000,H200,LS,Running,10,110,20\n");
        let e = load_trace(&text, "t.csv", &policy(), 0).err().unwrap();
        assert!(e.starts_with("t.csv:2: field `gpu_spec`: GPU model \"H200\" is not mapped by the policy (it maps: A10, G2, G3, P100, T4, V100M16, V100M32"), "{e}");
        let e = load_trace("name,cpu_milli\n", "x.csv", &policy(), 0)
            .err()
            .unwrap();
        assert_eq!(e, "x.csv:1: missing column `memory_mib`");
    }

    #[test]
    fn the_default_trace_policy_is_valid_against_the_builtin_catalog() {
        let p = policy();
        assert_eq!(p.pools.len(), 14);
        let types = gpu_node_autoscaler_core::catalog::parse_csv(
            gpu_node_autoscaler_core::catalog::BUILTIN_AWS,
            "b",
        )
        .unwrap();
        let cat = gpu_node_autoscaler_core::catalog::offerings_from_list_prices(&p, types);
        let (t, errors) =
            gpu_node_autoscaler_core::plan::build_templates(&p, &cat, &Default::default(), Time(0));
        assert!(errors.is_empty(), "{errors:?}");
        assert!(t.len() > 40);
    }
}
