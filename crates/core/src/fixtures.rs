//! Builders for pods, nodes and snapshots, for tests, benchmarks and generated workloads:
//! `PodBuilder::new("ns", "p").gpus(2).gang("job-a", 4).build()`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use gpu_node_autoscaler_provider::rng::Rng;

use crate::model::constraints::{Effect, Operator, Requirement, Taint, Term, Toleration};
use crate::model::dra::{
    ClaimSpec, DeviceClass, DeviceCount, DeviceRequest, PodClaim, SubRequest, NVIDIA_GPU_CLASS,
    NVIDIA_MIG_CLASS,
};
use crate::model::resources::{GpuShare, Resources, SharedGpu, MIG_PREFIX};
use crate::model::{
    labels, Constraints, GangRef, Node, Owner, OwnerKind, Pod, PodPhase, PodRef, Time,
};

/// The DeviceClasses NVIDIA's DRA driver installs: whole GPUs and MIG devices.
pub fn nvidia_device_classes() -> BTreeMap<String, DeviceClass> {
    [(NVIDIA_GPU_CLASS, "gpu"), (NVIDIA_MIG_CLASS, "mig")]
        .into_iter()
        .map(|(name, ty)| {
            (
                name.to_string(),
                DeviceClass {
                    name: name.to_string(),
                    selectors: vec![format!(
                        "device.driver == 'gpu.nvidia.com' && \
                         device.attributes['gpu.nvidia.com'].type == '{ty}'"
                    )],
                },
            )
        })
        .collect()
}

/// A claim spec of one `exactly` request per `(class, selectors, count)`.
pub fn claim_spec(requests: &[(&str, &[&str], u32)]) -> Arc<ClaimSpec> {
    Arc::new(ClaimSpec {
        requests: requests
            .iter()
            .enumerate()
            .map(|(i, (class, selectors, count))| DeviceRequest {
                name: format!("req-{i}"),
                alternatives: vec![SubRequest {
                    class: class.to_string(),
                    selectors: selectors.iter().map(|s| s.to_string()).collect(),
                    count: DeviceCount::Exact(*count),
                }],
            })
            .collect(),
    })
}

pub const GIB: i64 = 1 << 30;

#[derive(Clone)]
pub struct PodBuilder {
    pod: Pod,
    constraints: Constraints,
}

impl PodBuilder {
    /// A pending pod owned by a ReplicaSet, requesting 100m CPU and 256Mi.
    pub fn new(namespace: &str, name: &str) -> PodBuilder {
        PodBuilder {
            pod: Pod {
                id: PodRef::new(namespace, name),
                uid: format!("uid-{namespace}-{name}"),
                labels: Default::default(),
                annotations: Default::default(),
                requests: Resources {
                    cpu_milli: 100,
                    memory: 256 << 20,
                    pods: 1,
                    ..Default::default()
                },
                share: None,
                constraints: Arc::new(Constraints::default()),
                node_name: None,
                phase: PodPhase::Pending,
                owner: Some(Owner {
                    kind: OwnerKind::ReplicaSet,
                    name: format!("{name}-rs"),
                    uid: format!("rs-{name}"),
                }),
                gang: None,
                priority: 0,
                created: Time::EPOCH,
                started: None,
                deleting: false,
                unschedulable: true,
                scheduler_message: None,
                local_storage: false,
                shared_gpu_index: None,
                nominated_node: None,
                problem: None,
                claims: Vec::new(),
                volumes: Vec::new(),
                waiting: None,
            },
            constraints: Constraints::default(),
        }
    }

    pub fn cpu_milli(mut self, m: i64) -> Self {
        self.pod.requests.cpu_milli = m;
        self
    }

    pub fn memory_gib(mut self, g: i64) -> Self {
        self.pod.requests.memory = g * GIB;
        self
    }

    pub fn gpus(mut self, n: i64) -> Self {
        self.pod.requests.gpu = n;
        self
    }

    pub fn amd_gpus(mut self, n: i64) -> Self {
        self.pod.requests.amd_gpu = n;
        self
    }

    pub fn mig(mut self, profile: &str, n: i64) -> Self {
        self.pod.requests.set(&format!("{MIG_PREFIX}{profile}"), n);
        self
    }

    pub fn extended(mut self, name: &str, n: i64) -> Self {
        self.pod.requests.set(name, n);
        self
    }

    pub fn share(mut self, mem_gib: i64, core_pct: i64) -> Self {
        self.pod.share = Some(GpuShare { mem_gib, core_pct });
        self
    }

    pub fn selector(mut self, key: &str, value: &str) -> Self {
        self.constraints
            .node_selector
            .insert(key.to_string(), value.to_string());
        self
    }

    /// Adds a required node affinity term (terms are ORed).
    pub fn affinity(mut self, key: &str, op: Operator, values: &[&str]) -> Self {
        self.constraints
            .affinity
            .get_or_insert_with(Vec::new)
            .push(Term {
                requirements: vec![Requirement {
                    key: key.to_string(),
                    operator: op,
                    values: values.iter().map(|s| s.to_string()).collect(),
                }],
                node_names: None,
            });
        self
    }

    pub fn tolerate(mut self, key: &str) -> Self {
        self.constraints.tolerations.push(Toleration {
            key: Some(key.to_string()),
            exists: true,
            value: String::new(),
            effect: None,
        });
        self
    }

    pub fn tolerate_all(mut self) -> Self {
        self.constraints.tolerations.push(Toleration {
            key: None,
            exists: true,
            value: String::new(),
            effect: None,
        });
        self
    }

    pub fn gang(mut self, key: &str, min_member: u32) -> Self {
        self.pod.gang = Some(GangRef {
            key: format!("{}/{key}", self.pod.id.namespace),
            min_member: Some(min_member),
        });
        self
    }

    pub fn priority(mut self, p: i32) -> Self {
        self.pod.priority = p;
        self
    }

    pub fn created(mut self, t: Time) -> Self {
        self.pod.created = t;
        self
    }

    /// When its node's kubelet started it (`status.startTime`).
    pub fn started(mut self, t: Time) -> Self {
        self.pod.started = Some(t);
        self
    }

    pub fn label(mut self, k: &str, v: &str) -> Self {
        std::sync::Arc::make_mut(&mut self.pod.labels).insert(k.to_string(), v.to_string());
        self
    }

    pub fn annotation(mut self, k: &str, v: &str) -> Self {
        std::sync::Arc::make_mut(&mut self.pod.annotations).insert(k.to_string(), v.to_string());
        self
    }

    pub fn owner(mut self, kind: OwnerKind, name: &str) -> Self {
        self.pod.owner = Some(Owner {
            kind,
            name: name.to_string(),
            uid: format!("uid-{name}"),
        });
        self
    }

    pub fn bare(mut self) -> Self {
        self.pod.owner = None;
        self
    }

    pub fn daemonset(self, name: &str) -> Self {
        self.owner(OwnerKind::DaemonSet, name)
    }

    pub fn local_storage(mut self) -> Self {
        self.pod.local_storage = true;
        self
    }

    /// Bound to `node` and Running.
    pub fn on(mut self, node: &str) -> Self {
        self.pod.node_name = Some(node.to_string());
        self.pod.phase = PodPhase::Running;
        self.pod.unschedulable = false;
        self
    }

    pub fn problem(mut self, p: &str) -> Self {
        self.pod.problem = Some(p.to_string());
        self
    }

    /// Uses a ResourceClaim of its own (as from a claim template) with these requests.
    pub fn claim(mut self, entry: &str, spec: &Arc<ClaimSpec>) -> Self {
        let claim = format!("{}/{}-{entry}", self.pod.id.namespace, self.pod.id.name);
        self.pod.claims.push(PodClaim {
            name: entry.to_string(),
            claim,
            template: None,
            spec: spec.clone(),
            allocation: None,
            counted_here: true,
        });
        self
    }

    /// Its rules across nodes (host ports, pod affinity, spread).
    pub fn topology(mut self, t: crate::model::PodTopology) -> Self {
        self.constraints.topology = Some(Arc::new(t));
        self
    }

    pub fn build(mut self) -> Pod {
        self.pod.constraints = Arc::new(self.constraints);
        self.pod
    }
}

#[derive(Clone)]
pub struct NodeBuilder {
    node: Node,
}

impl NodeBuilder {
    /// A Ready node with 8 CPUs, 32 GiB and 110 pods, no GPUs, no labels.
    pub fn new(name: &str) -> NodeBuilder {
        NodeBuilder {
            node: Node {
                name: name.to_string(),
                labels: Default::default(),
                annotations: Default::default(),
                taints: Vec::new(),
                allocatable: Resources {
                    cpu_milli: 8000,
                    memory: 32 * GIB,
                    pods: 110,
                    ..Default::default()
                },
                shared_gpus: Vec::new(),
                ready: true,
                conditions: BTreeMap::new(),
                unschedulable: false,
                created: Time::EPOCH,
                provider_id: Some(format!("aws:///zone/i-{name}")),
                deleting: false,
                dra_devices: 0,
            },
        }
    }

    /// Labels the node as a node of `pool` bought as `instance_type` in `zone`.
    pub fn pool(mut self, pool: &str, instance_type: &str, zone: &str) -> Self {
        let l = Arc::make_mut(&mut self.node.labels);
        l.insert(labels::POOL.into(), pool.into());
        l.insert(labels::INSTANCE_TYPE.into(), instance_type.into());
        l.insert(labels::ZONE.into(), zone.into());
        self
    }

    pub fn label(mut self, k: &str, v: &str) -> Self {
        Arc::make_mut(&mut self.node.labels).insert(k.into(), v.into());
        self
    }

    pub fn annotation(mut self, k: &str, v: &str) -> Self {
        Arc::make_mut(&mut self.node.annotations).insert(k.into(), v.into());
        self
    }

    pub fn cpu_milli(mut self, m: i64) -> Self {
        self.node.allocatable.cpu_milli = m;
        self
    }

    pub fn memory_gib(mut self, g: i64) -> Self {
        self.node.allocatable.memory = g * GIB;
        self
    }

    pub fn gpus(mut self, n: i64) -> Self {
        self.node.allocatable.gpu = n;
        self
    }

    pub fn mig(mut self, profile: &str, n: i64) -> Self {
        self.node
            .allocatable
            .set(&format!("{MIG_PREFIX}{profile}"), n);
        self
    }

    pub fn shared(mut self, gpus: usize, mem_gib: i64) -> Self {
        self.node.shared_gpus = vec![SharedGpu::full(mem_gib); gpus];
        self
    }

    pub fn taint(mut self, key: &str, effect: Effect) -> Self {
        self.node.taints.push(Taint {
            key: key.into(),
            value: "true".into(),
            effect,
        });
        self
    }

    pub fn condition(mut self, type_: &str, status: &str) -> Self {
        self.node.conditions.insert(type_.into(), status.into());
        self
    }

    pub fn not_ready(mut self) -> Self {
        self.node.ready = false;
        self
    }

    pub fn cordoned(mut self) -> Self {
        self.node.unschedulable = true;
        self
    }

    pub fn created(mut self, t: Time) -> Self {
        self.node.created = t;
        self
    }

    pub fn build(self) -> Node {
        self.node
    }
}

/// Zones of the generated benchmark cluster.
pub const BENCH_ZONES: [&str; 6] = [
    "us-east-1a",
    "us-east-1b",
    "us-east-1c",
    "us-east-1d",
    "us-east-1e",
    "us-east-1f",
];

/// Extra synthetic instance types (CSV rows in the built-in catalog's columns) added to it by the
/// benchmark, to reach ~400 offerings.
pub const SYNTHETIC_TYPES_CSV: &str = "\
x1.a10g-2,A10G,2,23028,24,98304,2.9,synthetic type of the benchmarks,\n\
x1.l4-2,L4,2,23034,24,98304,2.4,synthetic type of the benchmarks,\n\
x1.t4-2,T4,2,15360,16,65536,1.1,synthetic type of the benchmarks,\n";

/// A policy over every family of the built-in catalog in six zones, spot first: whole GPUs for
/// the A10G/L4/L40S/V100/H100 families, MIG on A100-40GB, shared T4s.
pub fn bench_policy() -> String {
    let zones = BENCH_ZONES.join(", ");
    format!(
        r#"zones: [{zones}]
pools:
  - name: a10g
    requirements: {{gpuModels: [A10G]}}
    capacityTypes: [spot, on-demand]
    maxNodes: 20000
  - name: l4
    requirements: {{gpuModels: [L4, L40S]}}
    capacityTypes: [spot, on-demand]
    maxNodes: 20000
  - name: big
    requirements: {{gpuModels: [V100, H100, A100], gpuCount: {{min: 1, max: 8}}}}
    instanceTypes: [p3.2xlarge, p3.8xlarge, p3.16xlarge, p3dn.24xlarge, p5.48xlarge, p4de.24xlarge]
    capacityTypes: [spot, on-demand]
    maxNodes: 20000
  - name: mig
    instanceTypes: [p4d.24xlarge]
    capacityTypes: [on-demand, spot]
    maxNodes: 20000
    gpuMode: mig
    migLayout: {{1g.5gb: 7}}
  - name: t4
    requirements: {{gpuModels: [T4]}}
    capacityTypes: [spot, on-demand]
    maxNodes: 20000
    gpuMode: shared
    labels: {{gpu-sharing: "true"}}
"#
    )
}

/// A generated cluster: `nodes` existing A10G/L4 nodes (partly used) and `pods` pending pods:
/// 1/2/4/8-GPU pods, shared-GPU fractions, MIG slices, gangs of 2–16 workers, ~30 % with a
/// GPU-model selector.
pub fn generated_cluster(pods: usize, nodes: usize, seed: u64) -> crate::model::Snapshot {
    let mut rng = Rng::new(seed);
    let mut out = crate::model::Snapshot::default();
    for i in 0..nodes {
        let zone = BENCH_ZONES[i % BENCH_ZONES.len()];
        let (pool, it, gpus) = if i % 2 == 0 {
            ("a10g", "g5.12xlarge", 4)
        } else {
            ("l4", "g6.12xlarge", 4)
        };
        let name = format!("node-{i:05}");
        out.nodes.push(
            NodeBuilder::new(&name)
                .pool(pool, it, zone)
                .cpu_milli(47_000)
                .memory_gib(180)
                .gpus(gpus)
                .build(),
        );
        // Three of four GPUs busy.
        for j in 0..3 {
            out.pods.push(
                PodBuilder::new("run", &format!("r-{i:05}-{j}"))
                    .gpus(1)
                    .cpu_milli(4000)
                    .memory_gib(16)
                    .on(&name)
                    .build(),
            );
        }
    }
    let models = ["A10G", "L4", "V100", "H100"];
    let mut i = 0;
    while i < pods {
        let name = format!("p-{i:06}");
        let roll = rng.below(100);
        if roll < 8 && pods - i >= 2 {
            // A gang of 2–16 workers with 1–8 GPUs each.
            let size = (2 + rng.below(15) as usize).min(pods - i);
            let g = [1, 2, 4, 8][rng.below(4) as usize];
            for w in 0..size {
                out.pods.push(
                    PodBuilder::new("train", &format!("{name}-w{w}"))
                        .gpus(g)
                        .cpu_milli(4000 * g)
                        .memory_gib(16 * g)
                        .gang(&name, size as u32)
                        .build(),
                );
            }
            i += size;
            continue;
        }
        let mut b = PodBuilder::new("gen", &name);
        b = match roll {
            8..=47 => b.gpus(1).cpu_milli(2000).memory_gib(8),
            48..=62 => b.gpus(2).cpu_milli(8000).memory_gib(32),
            63..=72 => b.gpus(4).cpu_milli(16000).memory_gib(64),
            73..=77 => b.gpus(8).cpu_milli(32000).memory_gib(128),
            78..=89 => b
                .share(2 + rng.below(6) as i64, 5 * (1 + rng.below(10) as i64))
                .selector("gpu-sharing", "true")
                .cpu_milli(1000)
                .memory_gib(4),
            _ => b
                .mig("1g.5gb", 1 + rng.below(2) as i64)
                .cpu_milli(1000)
                .memory_gib(4),
        };
        if (8..=77).contains(&roll) && rng.below(10) < 3 {
            b = b.selector(
                labels::GPU_MODEL,
                models[rng.below(models.len() as u64) as usize],
            );
        }
        out.pods.push(b.created(Time(i as i64)).build());
        i += 1;
    }
    out
}

/// `bench_policy()` with a twin of every NVIDIA pool whose nodes run NVIDIA's DRA driver
/// (`<pool>-dra`, `dra: {}`): they offer predicted devices instead of extended resources.
pub fn bench_policy_with_dra() -> String {
    let mut p = bench_policy();
    for (name, fields) in [
        ("a10g", "    requirements: {gpuModels: [A10G]}\n"),
        ("l4", "    requirements: {gpuModels: [L4, L40S]}\n"),
        (
            "big",
            "    requirements: {gpuModels: [V100, H100, A100], gpuCount: {min: 1, max: 8}}\n    \
             instanceTypes: [p3.2xlarge, p3.8xlarge, p3.16xlarge, p3dn.24xlarge, p5.48xlarge, p4de.24xlarge]\n",
        ),
        (
            "mig",
            "    instanceTypes: [p4d.24xlarge]\n    gpuMode: mig\n    migLayout: {1g.5gb: 7}\n",
        ),
    ] {
        p += &format!(
            "  - name: {name}-dra\n{fields}    capacityTypes: [spot, on-demand]\n    \
             maxNodes: 20000\n    dra: {{}}\n"
        );
    }
    p
}

/// [`generated_cluster`] in which about `claim_percent` % of the pending pods that ask for whole
/// GPUs or MIG slices ask for them through a ResourceClaim instead (for a pool of
/// [`bench_policy_with_dra`]): whole GPUs as `count` devices of `gpu.nvidia.com` (with a
/// `productName` selector where the pod selected a GPU model), MIG slices as devices of
/// `mig.nvidia.com` with that `profile`.
pub fn generated_cluster_with_claims(
    pods: usize,
    nodes: usize,
    claim_percent: u64,
    seed: u64,
) -> crate::model::Snapshot {
    let mut out = generated_cluster(pods, nodes, seed);
    out.dra.classes = nvidia_device_classes();
    let mut rng = Rng::new(seed ^ 0xd7a);
    let mut specs: BTreeMap<(String, String, u32), Arc<ClaimSpec>> = BTreeMap::new();
    for p in out.pods.iter_mut().filter(|p| p.is_pending()) {
        let whole = p.requests.whole_gpus();
        let mig: Option<(String, i64)> = p
            .requests
            .mig_slices()
            .next()
            .map(|(profile, n)| (profile.to_string(), n));
        if (whole == 0 && mig.is_none()) || rng.below(100) >= claim_percent {
            continue;
        }
        let (class, selector, count) = match mig {
            Some((profile, n)) => {
                p.requests.set(&format!("{MIG_PREFIX}{profile}"), 0);
                (
                    NVIDIA_MIG_CLASS,
                    format!("device.attributes['gpu.nvidia.com'].profile == '{profile}'"),
                    n as u32,
                )
            }
            None => {
                p.requests.set(crate::model::resources::NVIDIA_GPU, 0);
                let model = p
                    .constraints
                    .node_selector
                    .get(labels::GPU_MODEL)
                    .cloned()
                    .unwrap_or_default();
                let selector = if model.is_empty() {
                    String::new()
                } else {
                    format!("device.attributes['gpu.nvidia.com'].productName.contains('{model}')")
                };
                (NVIDIA_GPU_CLASS, selector, whole as u32)
            }
        };
        let spec = specs
            .entry((class.to_string(), selector.clone(), count))
            .or_insert_with(|| {
                let selectors: Vec<&str> = [selector.as_str()]
                    .into_iter()
                    .filter(|s| !s.is_empty())
                    .collect();
                claim_spec(&[(class, &selectors, count)])
            })
            .clone();
        let claim = format!("{}/{}-gpu", p.id.namespace, p.id.name);
        p.claims.push(PodClaim {
            name: "gpu".into(),
            claim,
            template: None,
            spec,
            allocation: None,
            counted_here: true,
        });
    }
    out
}

/// A generated busy cluster for scale-down: `nodes` 4-GPU nodes in two pools and six zones with
/// `pods_per_node` running pods each (one GPU pod per GPU in use, the rest CPU side-cars and
/// DaemonSet pods). About a fifth of the nodes are under-used and have been unneeded for an hour;
/// some of their pods cannot move (bare, local storage), and a PDB covers one app.
pub fn generated_busy_cluster(
    nodes: usize,
    pods_per_node: usize,
    now: Time,
    seed: u64,
) -> crate::model::Snapshot {
    let mut rng = Rng::new(seed);
    let mut out = crate::model::Snapshot::default();
    let long_ago = now - std::time::Duration::from_secs(24 * 3600);
    for i in 0..nodes {
        let zone = BENCH_ZONES[i % BENCH_ZONES.len()];
        let (pool, it) = if i % 2 == 0 {
            ("a10g", "g5.12xlarge")
        } else {
            ("l4", "g6.12xlarge")
        };
        let name = format!("node-{i:05}");
        let idle = rng.below(5) == 0;
        let mut b = NodeBuilder::new(&name)
            .pool(pool, it, zone)
            .label(labels::CAPACITY_TYPE, "spot")
            .cpu_milli(47_000)
            .memory_gib(180)
            .gpus(4)
            .created(long_ago);
        if idle {
            b = b.annotation(
                labels::UNNEEDED_SINCE,
                &(now - std::time::Duration::from_secs(3600)).to_rfc3339(),
            );
        }
        out.nodes.push(b.build());
        let gpu_pods = if idle { rng.below(2) } else { 2 + rng.below(3) } as usize;
        for j in 0..pods_per_node {
            let pname = format!("r-{i:05}-{j:02}");
            let p = if j == 0 {
                PodBuilder::new("kube-system", &format!("dcgm-{i:05}"))
                    .daemonset("dcgm-exporter")
                    .cpu_milli(100)
                    .memory_gib(1)
            } else if j <= gpu_pods {
                let mut p = PodBuilder::new("train", &pname)
                    .gpus(1)
                    .cpu_milli(4000)
                    .memory_gib(16)
                    .label("app", &format!("app-{}", rng.below(50)));
                match rng.below(20) {
                    0 => p = p.bare(),
                    1 => p = p.local_storage(),
                    _ => {}
                }
                p
            } else {
                PodBuilder::new("svc", &pname)
                    .cpu_milli(50)
                    .memory_gib(0)
                    .label("app", "sidecar")
            };
            out.pods.push(p.on(&name).build());
        }
    }
    out.pdbs.push(crate::model::Pdb {
        namespace: "train".into(),
        name: "app-7".into(),
        selector: vec![crate::model::Requirement {
            key: "app".into(),
            operator: crate::model::Operator::In,
            values: vec!["app-7".into()],
        }],
        disruptions_allowed: 1,
    });
    out
}

/// The pods of `namespace` labelled `app: <app>`.
pub fn app_selector(namespace: &str, app: &str) -> crate::model::topology::PodSelector {
    crate::model::topology::PodSelector {
        labels: Some(vec![Requirement {
            key: "app".into(),
            operator: Operator::In,
            values: vec![app.into()],
        }]),
        namespaces: Some(vec![namespace.into()]),
        namespace_selector: None,
    }
}

/// [`generated_cluster`] in which about `percent` % of the pending pods (all of them single
/// pods, none of a gang) belong to one of 40 services whose pods carry rules across nodes, in turn: spread
/// over zones (maxSkew 1), one per node (hostname anti-affinity), both, or required affinity to
/// their service's zone; one running pod of each service is labelled so that the counts start
/// from it. And about `volume_percent` % of the pending single pods (of those without such rules)
/// claim a zonal volume: a PersistentVolume bound in one of the nodes' zones, as
/// [`crate::model::volumes::Storage::join`] gives it (the pod may run in that zone only).
pub fn generated_cluster_with_topology(
    pods: usize,
    nodes: usize,
    percent: u64,
    volume_percent: u64,
    seed: u64,
) -> crate::model::Snapshot {
    use crate::model::topology::{AffinityTerm, PodTopology, Spread, HOSTNAME};
    const SERVICES: usize = 40;
    let mut out = generated_cluster(pods, nodes, seed);
    let mut rng = Rng::new(seed ^ 0x7090);
    let selector = |app: &str| app_selector("gen", app);
    let rules: Vec<Arc<PodTopology>> = (0..SERVICES)
        .map(|s| {
            let app = format!("svc-{s}");
            let spread = Spread {
                max_skew: 1,
                topology_key: labels::ZONE.into(),
                selector: selector(&app),
                min_domains: 1,
                honor_node_affinity: true,
                honor_taints: false,
            };
            let term = |key: &str| AffinityTerm {
                selector: selector(&app),
                topology_key: key.into(),
            };
            Arc::new(match s % 4 {
                0 => PodTopology {
                    spread: vec![spread],
                    ..Default::default()
                },
                1 => PodTopology {
                    anti_affinity: vec![term(HOSTNAME)],
                    ..Default::default()
                },
                2 => PodTopology {
                    spread: vec![spread],
                    anti_affinity: vec![term(HOSTNAME)],
                    ..Default::default()
                },
                _ => PodTopology {
                    affinity: vec![term(labels::ZONE)],
                    ..Default::default()
                },
            })
        })
        .collect();
    let mut constraints: BTreeMap<(usize, Arc<Constraints>), Arc<Constraints>> = BTreeMap::new();
    let mut running = 0;
    // Of the pending pods not in gangs, enough for `percent` % of all pending pods.
    let eligible = out
        .pods
        .iter()
        .filter(|p| p.is_pending() && p.gang.is_none())
        .count()
        .max(1) as u64;
    let per_mille = (pods as u64 * percent * 10 / eligible).min(1000);
    let zones: Vec<String> = out
        .nodes
        .iter()
        .filter_map(|n| n.zone().map(str::to_string))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let zonal: Vec<Vec<Term>> = zones
        .iter()
        .map(|z| {
            vec![Term {
                requirements: vec![Requirement {
                    key: labels::ZONE.into(),
                    operator: Operator::In,
                    values: vec![z.clone()],
                }],
                node_names: None,
            }]
        })
        .collect();
    for p in out.pods.iter_mut() {
        if !p.is_pending() {
            if running < SERVICES && p.node_name.is_some() && p.id.namespace == "run" {
                // The first running pods, one per service, move to its namespace and label.
                p.id.namespace = "gen".into();
                Arc::make_mut(&mut p.labels).insert("app".into(), format!("svc-{running}"));
                running += 1;
            }
            continue;
        }
        if p.gang.is_some() || rng.below(1000) >= per_mille {
            continue;
        }
        let s = rng.below(SERVICES as u64) as usize;
        Arc::make_mut(&mut p.labels).insert("app".into(), format!("svc-{s}"));
        p.constraints = constraints
            .entry((s, p.constraints.clone()))
            .or_insert_with(|| {
                let mut c = (*p.constraints).clone();
                c.topology = Some(rules[s].clone());
                Arc::new(c)
            })
            .clone();
    }
    // Of the pending single pods without rules, enough for `volume_percent` % of all.
    let free = out
        .pods
        .iter()
        .filter(|p| p.is_pending() && p.gang.is_none() && p.constraints.topology.is_none())
        .count()
        .max(1) as u64;
    let volume_per_mille = (pods as u64 * volume_percent * 10 / free).min(1000);
    let mut volumes = Rng::new(seed ^ 0x701e);
    for p in out.pods.iter_mut() {
        if p.is_pending()
            && p.gang.is_none()
            && p.constraints.topology.is_none()
            && !zonal.is_empty()
            && volumes.below(1000) < volume_per_mille
        {
            let z = volumes.below(zonal.len() as u64) as usize;
            let mut c = (*p.constraints).clone();
            c.volumes = vec![zonal[z].clone()];
            p.constraints = Arc::new(c);
        }
    }
    out
}

/// One H100 as NVIDIA's DRA driver publishes it in a ResourceSlice (`gpu-3`): type, product
/// name, CUDA compute capability, index and memory.
pub fn h100_device() -> crate::model::dra::Device {
    use crate::model::dra::AttrValue;
    let attrs = BTreeMap::from([
        ("type".to_string(), AttrValue::String("gpu".into())),
        (
            "productName".to_string(),
            AttrValue::String("NVIDIA H100 80GB HBM3".into()),
        ),
        (
            "cudaComputeCapability".to_string(),
            AttrValue::Version("9.0.0".into()),
        ),
        ("index".to_string(), AttrValue::Int(3)),
    ]);
    let memory = crate::model::quantity::parse_quantity("81559Mi").expect("a valid quantity");
    crate::model::dra::Device {
        driver: "gpu.nvidia.com".into(),
        name: "gpu-3".into(),
        attributes: BTreeMap::from([("gpu.nvidia.com".to_string(), attrs)]),
        capacity: BTreeMap::from([(
            "gpu.nvidia.com".to_string(),
            BTreeMap::from([("memory".to_string(), memory)]),
        )]),
    }
}
