//! Pods that claim devices through Dynamic Resource Allocation.

use std::collections::BTreeMap;

use super::*;
use crate::fixtures::{claim_spec, nvidia_device_classes};
use crate::model::dra::{AttrValue, Device, DeviceCount, DeviceRequest, SubRequest};
use crate::model::quantity::parse_quantity;

const DRA_POLICY: &str = r#"
zones: [us-east-1a, us-east-1b]
pools:
  - name: h100
    instanceTypes: [p5.48xlarge]
    capacityTypes: [on-demand]
    maxNodes: 4
    dra: {attributes: {driverVersion: "580.82.07"}}
  - name: a100
    instanceTypes: [p4d.24xlarge, p4de.24xlarge]
    capacityTypes: [on-demand]
    maxNodes: 4
    dra: {}
  - name: a10g
    instanceTypes: [g5.xlarge, g5.12xlarge]
    capacityTypes: [on-demand]
    maxNodes: 10
    dra: {}
  - name: mig
    instanceTypes: [p4d.24xlarge]
    capacityTypes: [on-demand]
    zones: [us-east-1a]
    gpuMode: mig
    migLayout: {1g.5gb: 7}
    maxNodes: 2
    dra: {}
"#;

/// An H100 with 80 GB: NVML reports 81559 MiB, so `80Gi` (81920 MiB) would match no H100.
const H100_80G: &[&str] = &[
    "device.attributes['gpu.nvidia.com'].productName.startsWith('NVIDIA H100')",
    "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('80G')) >= 0",
];

fn dra_snap(pods: Vec<Pod>, nodes: Vec<crate::model::Node>) -> Snapshot {
    let mut s = snap(pods, nodes);
    s.dra.classes = nvidia_device_classes();
    s
}

fn claiming(name: &str, requests: &[(&str, &[&str], u32)]) -> PodBuilder {
    PodBuilder::new("ml", name)
        .cpu_milli(1000)
        .memory_gib(4)
        .claim("gpu", &claim_spec(requests))
}

fn types(plan: &Plan) -> Vec<(String, u32)> {
    plan.scale_ups
        .iter()
        .map(|s| (s.offerings[0].instance_type.clone(), s.count))
        .collect()
}

#[test]
fn a_claim_for_an_h100_with_80gb_gets_a_p5() {
    let s = dra_snap(
        vec![claiming("train", &[("gpu.nvidia.com", H100_80G, 1)]).build()],
        vec![],
    );
    let plan = run(&s, DRA_POLICY);
    assert!(plan.unschedulable.is_empty(), "{:?}", plan.unschedulable);
    assert_eq!(types(&plan), vec![("p5.48xlarge".to_string(), 1)]);
}

#[test]
fn claims_share_a_node_up_to_its_published_devices() {
    let pods = (0..9)
        .map(|i| claiming(&format!("p{i}"), &[("gpu.nvidia.com", H100_80G, 1)]).build())
        .collect();
    let plan = run(&dra_snap(pods, vec![]), DRA_POLICY);
    assert_eq!(types(&plan), vec![("p5.48xlarge".to_string(), 2)]);
    assert_eq!(plan.scale_ups[0].pods_per_node, vec![8, 1]);
}

#[test]
fn the_cheapest_offering_whose_devices_match_wins() {
    // Any GPU with at least 20 GiB: an A10G (24 GiB) is far cheaper than an H100 or A100.
    let s = dra_snap(
        vec![claiming(
            "infer",
            &[(
                "gpu.nvidia.com",
                &["device.capacity['gpu.nvidia.com'].memory.isGreaterThan(quantity('20Gi'))"],
                1,
            )],
        )
        .build()],
        vec![],
    );
    let plan = run(&s, DRA_POLICY);
    assert_eq!(types(&plan), vec![("g5.xlarge".to_string(), 1)]);
    // Two A100s of 80 GB: only the p4de has them.
    let s = dra_snap(
        vec![claiming(
            "big",
            &[(
                "gpu.nvidia.com",
                &["device.attributes['gpu.nvidia.com'].productName == 'NVIDIA A100-SXM4-80GB'"],
                2,
            )],
        )
        .build()],
        vec![],
    );
    let plan = run(&s, DRA_POLICY);
    assert_eq!(types(&plan), vec![("p4de.24xlarge".to_string(), 1)]);
}

#[test]
fn a_claim_no_offering_satisfies_gets_a_reason() {
    let s = dra_snap(
        vec![
            claiming(
                "b200",
                &[(
                    "gpu.nvidia.com",
                    &["device.attributes['gpu.nvidia.com'].productName == 'NVIDIA B200'"],
                    1,
                )],
            )
            .build(),
            claiming("nine", &[("gpu.nvidia.com", H100_80G, 9)]).build(),
            // 80 GiB is more than an H100 has (81559 MiB).
            claiming(
                "gibi",
                &[(
                    "gpu.nvidia.com",
                    &["device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('80Gi')) >= 0 \
                       && device.attributes['gpu.nvidia.com'].productName.startsWith('NVIDIA H100')"],
                    1,
                )],
            )
            .build(),
            claiming("noclass", &[("tpu.example.com", &[], 1)]).build(),
            claiming(
                "uneval",
                &[(
                    "gpu.nvidia.com",
                    &["device.capacity['gpu.nvidia.com'].memory >= quantity('80Gi')"],
                    1,
                )],
            )
            .build(),
            claiming(
                "uuid",
                &[(
                    "gpu.nvidia.com",
                    &["device.attributes['gpu.nvidia.com'].uuid == 'GPU-1234'"],
                    1,
                )],
            )
            .build(),
        ],
        vec![],
    );
    let plan = run(&s, DRA_POLICY);
    assert!(plan.scale_ups.is_empty(), "{:?}", plan.scale_ups);
    let reason = |p: &str| {
        plan.unschedulable
            .iter()
            .find(|u| u.pod == format!("ml/{p}"))
            .unwrap_or_else(|| panic!("{p} has no reason"))
            .clone()
    };
    let b200 = reason("b200");
    assert!(b200.permanent);
    assert!(
        b200.reason
            .contains("no pool's devices and no node's published devices match")
            && b200.reason.contains("NVIDIA B200"),
        "{}",
        b200.reason
    );
    assert!(
        reason("gibi").reason.contains("no pool's devices"),
        "{}",
        reason("gibi").reason
    );
    // Nine H100s exist on no single node.
    assert!(
        reason("nine").reason.contains("no pool can ever host it"),
        "{}",
        reason("nine").reason
    );
    assert!(
        reason("noclass")
            .reason
            .contains("DeviceClass tpu.example.com does not exist"),
        "{}",
        reason("noclass").reason
    );
    let uneval = reason("uneval").reason;
    assert!(uneval.contains("cannot be evaluated"), "{uneval}");
    // What only a booted node knows is not predicted: the reason says what was missing.
    let uuid = reason("uuid").reason;
    assert!(uuid.contains("uuid"), "{uuid}");
}

#[test]
fn mig_claims_take_mig_devices() {
    let pods = (0..10)
        .map(|i| {
            claiming(
                &format!("m{i}"),
                &[(
                    "mig.nvidia.com",
                    &["device.attributes['gpu.nvidia.com'].profile == '1g.5gb'"],
                    1,
                )],
            )
            .build()
        })
        .collect();
    let plan = run(&dra_snap(pods, vec![]), DRA_POLICY);
    assert!(plan.unschedulable.is_empty(), "{:?}", plan.unschedulable);
    assert_eq!(plan.scale_ups.len(), 1);
    assert_eq!(plan.scale_ups[0].pool, "mig");
    assert_eq!(plan.scale_ups[0].count, 1, "56 MIG devices on one p4d");
}

#[test]
fn a_gang_of_claims_lands_in_one_zone_or_not_at_all() {
    let pods: Vec<Pod> = (0..3)
        .map(|i| {
            claiming(&format!("w{i}"), &[("gpu.nvidia.com", H100_80G, 8)])
                .gang("llm", 3)
                .build()
        })
        .collect();
    let plan = run(&dra_snap(pods.clone(), vec![]), DRA_POLICY);
    assert_eq!(types(&plan), vec![("p5.48xlarge".to_string(), 3)]);
    assert_eq!(plan.scale_ups[0].gang.as_deref(), Some("ml/llm"));
    // Five members need five p5 nodes; the pool has four: none is launched.
    let pods: Vec<Pod> = (0..5)
        .map(|i| {
            claiming(&format!("w{i}"), &[("gpu.nvidia.com", H100_80G, 8)])
                .gang("llm", 5)
                .build()
        })
        .collect();
    let plan = run(&dra_snap(pods, vec![]), DRA_POLICY);
    assert!(plan.scale_ups.is_empty());
    assert_eq!(plan.unschedulable.len(), 5);
}

#[test]
fn first_available_and_all_mode() {
    let spec = std::sync::Arc::new(crate::model::dra::ClaimSpec {
        requests: vec![DeviceRequest {
            name: "gpu".into(),
            alternatives: vec![
                SubRequest {
                    class: "gpu.nvidia.com".into(),
                    selectors: vec![
                        "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA B200'".into(),
                    ],
                    count: DeviceCount::Exact(1),
                },
                SubRequest {
                    class: "gpu.nvidia.com".into(),
                    selectors: vec![
                        "device.attributes['gpu.nvidia.com'].architecture == 'Ampere'".into(),
                    ],
                    count: DeviceCount::All,
                },
            ],
        }],
    });
    let pods = (0..2)
        .map(|i| {
            PodBuilder::new("ml", &format!("all{i}"))
                .cpu_milli(1000)
                .claim("gpu", &spec)
                .build()
        })
        .collect();
    let plan = run(&dra_snap(pods, vec![]), DRA_POLICY);
    assert!(plan.unschedulable.is_empty(), "{:?}", plan.unschedulable);
    // Every Ampere GPU of a node for each pod: the smallest such node, one per pod.
    assert_eq!(types(&plan), vec![("g5.xlarge".to_string(), 2)]);
}

fn published(node: &str, n: usize) -> Vec<(String, Device)> {
    (0..n)
        .map(|i| {
            let attrs = BTreeMap::from([
                ("type".to_string(), AttrValue::String("gpu".into())),
                (
                    "productName".to_string(),
                    AttrValue::String("NVIDIA H100 80GB HBM3".into()),
                ),
                (
                    "uuid".to_string(),
                    AttrValue::String(format!("GPU-{node}-{i}")),
                ),
            ]);
            let caps = BTreeMap::from([("memory".to_string(), parse_quantity("81559Mi").unwrap())]);
            (
                node.to_string(),
                Device {
                    driver: "gpu.nvidia.com".into(),
                    name: format!("gpu-{i}"),
                    attributes: BTreeMap::from([("gpu.nvidia.com".to_string(), attrs)]),
                    capacity: BTreeMap::from([("gpu.nvidia.com".to_string(), caps)]),
                },
            )
        })
        .collect()
}

#[test]
fn published_devices_of_existing_nodes_are_used_first() {
    let node = NodeBuilder::new("p5-a")
        .pool("h100", "p5.48xlarge", "us-east-1a")
        .cpu_milli(190_000)
        .memory_gib(2000)
        .build();
    let pods = (0..3)
        .map(|i| {
            claiming(
                &format!("p{i}"),
                &[(
                    "gpu.nvidia.com",
                    &["device.attributes['gpu.nvidia.com'].productName.startsWith('NVIDIA H100')"],
                    1,
                )],
            )
            .build()
        })
        .collect();
    let mut s = dra_snap(pods, vec![node]);
    s.dra.slices.insert("p5-a".into(), published("p5-a", 8));
    // Six of its eight GPUs are allocated to claims.
    s.dra.allocated.insert(
        "p5-a".into(),
        (0..6)
            .map(|i| ("gpu.nvidia.com".into(), "p5-a".into(), format!("gpu-{i}")))
            .collect(),
    );
    let plan = run(&s, DRA_POLICY);
    assert_eq!(
        plan.existing_capacity.len(),
        2,
        "{:?}",
        plan.existing_capacity
    );
    assert!(plan.existing_capacity.iter().all(|p| p.target == "p5-a"));
    assert_eq!(types(&plan), vec![("p5.48xlarge".to_string(), 1)]);
}

#[test]
fn a_node_without_published_slices_is_still_coming() {
    // Registered and Ready, but its driver has not published devices yet: it counts at its
    // template's devices, so no second node is launched for the pod.
    let node = NodeBuilder::new("p5-new")
        .pool("h100", "p5.48xlarge", "us-east-1a")
        .cpu_milli(190_000)
        .memory_gib(2000)
        .created(NOW)
        .build();
    let s = dra_snap(
        vec![claiming("train", &[("gpu.nvidia.com", H100_80G, 1)]).build()],
        vec![node],
    );
    let plan = run(&s, DRA_POLICY);
    assert!(plan.scale_ups.is_empty(), "{:?}", plan.scale_ups);
    assert_eq!(plan.existing_capacity.len(), 1);
}

#[test]
fn pods_sharing_an_allocated_or_counted_claim_are_not_planned_again() {
    let spec = claim_spec(&[("gpu.nvidia.com", H100_80G, 1)]);
    let mut owner = claiming("a", &[]).build();
    owner.claims[0].spec = spec.clone();
    let mut follower = owner.clone();
    follower.id = PodRef::new("ml", "b");
    follower.claims[0].counted_here = false;
    let plan = run(&dra_snap(vec![owner, follower], vec![]), DRA_POLICY);
    assert_eq!(types(&plan), vec![("p5.48xlarge".to_string(), 1)]);
    assert_eq!(plan.scale_ups[0].pods.len(), 1);
}

/// A p5 node publishing its eight H100s, `allocated` of them held by the claims of pod `pod`.
fn dra_node_with_pod(node: &str, pod: &str, allocated: usize) -> (crate::model::Node, Pod) {
    let n = NodeBuilder::new(node)
        .pool("h100", "p5.48xlarge", "us-east-1a")
        .cpu_milli(190_000)
        .memory_gib(2000)
        .build();
    let mut p = claiming(pod, &[("gpu.nvidia.com", H100_80G, allocated as u32)])
        .on(node)
        .build();
    p.claims[0].allocation = Some(crate::model::dra::Allocation {
        node: Some(node.to_string()),
        devices: (0..allocated)
            .map(|i| ("gpu.nvidia.com".into(), node.into(), format!("gpu-{i}")))
            .collect(),
    });
    (n, p)
}

/// Why the plan keeps `node`.
fn kept_reason<'a>(plan: &'a Plan, node: &str) -> &'a str {
    plan.kept
        .iter()
        .find(|k| k.node == node)
        .map(|k| k.reason.as_str())
        .unwrap_or_else(|| panic!("{node} not kept: {:?}", plan.kept))
}

fn with_slices(mut s: Snapshot) -> Snapshot {
    for n in s.nodes.clone() {
        s.dra.slices.insert(n.name.clone(), published(&n.name, 8));
    }
    for p in &s.pods {
        for c in &p.claims {
            if let Some(a) = &c.allocation {
                s.dra
                    .allocated
                    .entry(a.node.clone().unwrap())
                    .or_default()
                    .extend(a.devices.iter().cloned());
            }
        }
    }
    s.count_published_devices();
    s
}

const SCALE_DOWN: &str = "\n    scaleDown: {cooldownAfterScaleUp: 0s, unneededTime: 0s}\n";

#[test]
fn dra_nodes_are_as_used_as_their_allocated_devices_and_kept_when_claims_cannot_move() {
    let policy = DRA_POLICY.replacen(
        "    dra: {attributes: {driverVersion: \"580.82.07\"}}\n",
        &format!("    dra: {{attributes: {{driverVersion: \"580.82.07\"}}}}{SCALE_DOWN}"),
        1,
    );
    // One GPU of eight in use on each of two nodes: both are unneeded (12.5 %), and one pod
    // moves to the other node, whose free H100s take its claim.
    let (a, pa) = dra_node_with_pod("p5-a", "pa", 1);
    let (b, pb) = dra_node_with_pod("p5-b", "pb", 1);
    let s = with_slices(dra_snap(vec![pa, pb], vec![a, b]));
    let plan = run(&s, &policy);
    assert_eq!(
        plan.scale_downs.len(),
        1,
        "{:?} {:?}",
        plan.scale_downs,
        plan.kept
    );
    assert_eq!(plan.scale_downs[0].evict.len(), 1);
    // Every H100 of the other node is held: no node that remains has a device for the idle
    // node's pod, so the idle node stays.
    let (a, pa) = dra_node_with_pod("p5-a", "pa", 1);
    let (b, pb) = dra_node_with_pod("p5-b", "pb", 8);
    let s = with_slices(dra_snap(vec![pa, pb], vec![a, b]));
    let plan = run(&s, &policy);
    assert!(plan.scale_downs.is_empty(), "{:?}", plan.scale_downs);
    let kept = kept_reason(&plan, "p5-a");
    assert!(
        kept.contains("no node that remains has the devices its ResourceClaims need"),
        "{kept}"
    );
}

#[test]
fn a_pod_whose_claim_comes_from_a_template_moves_to_any_device_its_claim_accepts() {
    let policy = DRA_POLICY.replacen(
        "    dra: {attributes: {driverVersion: \"580.82.07\"}}\n",
        &format!("    dra: {{attributes: {{driverVersion: \"580.82.07\"}}}}{SCALE_DOWN}"),
        1,
    );
    // One GPU with at least 80G, held on a p5 (one H100 of eight); a p4de beside it has an
    // A100 80GB free, and the pod's evaluation would take either.
    const ANY_80G: &[&str] =
        &["device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('80G')) >= 0"];
    let cluster = |template: Option<&str>| {
        let (p5, mut eval) = dra_node_with_pod("p5-a", "eval", 1);
        eval.claims[0].spec = claim_spec(&[("gpu.nvidia.com", ANY_80G, 1)]);
        eval.claims[0].template = template.map(str::to_string);
        let p4de = NodeBuilder::new("p4de-b")
            .pool("a100", "p4de.24xlarge", "us-east-1a")
            .cpu_milli(95_000)
            .memory_gib(1100)
            .build();
        let (_, busy) = dra_node_with_pod("p4de-b", "busy", 0);
        let mut s = with_slices(dra_snap(vec![eval, busy], vec![p5, p4de]));
        let a100: Vec<(String, Device)> = published("p4de-b", 8)
            .into_iter()
            .map(|(pool, mut d)| {
                let attrs = d.attributes.get_mut("gpu.nvidia.com").unwrap();
                attrs.insert(
                    "productName".into(),
                    AttrValue::String("NVIDIA A100-SXM4-80GB".into()),
                );
                let caps = d.capacity.get_mut("gpu.nvidia.com").unwrap();
                caps.insert("memory".into(), parse_quantity("81920Mi").unwrap());
                (pool, d)
            })
            .collect();
        s.dra.slices.insert("p4de-b".into(), a100);
        s.count_published_devices();
        s
    };

    // Made from a template: the claim goes with the pod, and its replacement's claim takes an
    // A100 on the p4de; the p5 is removed.
    let plan = run(&cluster(Some("ml/eval-gpu")), &policy);
    let p5 = plan.scale_downs.iter().find(|d| d.node == "p5-a");
    let p5 = p5.unwrap_or_else(|| panic!("{:?} {:?}", plan.scale_downs, plan.kept));
    assert_eq!(p5.evict.len(), 1);
    assert_eq!(p5.evict[0].to, "p4de-b");

    // A claim of its own keeps its H100 wherever the pod goes: no node that remains has one.
    let plan = run(&cluster(None), &policy);
    assert!(
        plan.scale_downs.iter().all(|d| d.node != "p5-a"),
        "{:?}",
        plan.scale_downs
    );
    let kept = kept_reason(&plan, "p5-a");
    assert!(kept.contains("ResourceClaims need"), "{kept}");
}

#[test]
fn the_benchmark_mix_with_claims_puts_every_claiming_pod_on_a_dra_pool() {
    use crate::fixtures::{
        bench_policy, bench_policy_with_dra, generated_cluster, generated_cluster_with_claims,
    };
    let plain = generated_cluster(600, 20, 7);
    let s = generated_cluster_with_claims(600, 20, 30, 7);
    let gpu_pods = plain
        .pods
        .iter()
        .filter(|p| p.is_pending() && p.wants_gpu() && p.share.is_none())
        .count();
    let claiming: BTreeMap<String, &Pod> = s
        .pods
        .iter()
        .filter(|p| !p.claims.is_empty())
        .map(|p| (PlannedPod::of(p).key, p))
        .collect();
    let share = claiming.len() as f64 / gpu_pods as f64;
    assert!(
        (0.2..0.4).contains(&share),
        "{} of {gpu_pods}",
        claiming.len()
    );
    for p in claiming.values() {
        assert_eq!(
            p.requests.whole_gpus(),
            0,
            "{}: asks through its claim only",
            p.id
        );
        assert!(p.requests.mig_slices().next().is_none(), "{}", p.id);
    }
    let plan = run(&s, &bench_policy_with_dra());
    let mut planned = 0;
    for up in &plan.scale_ups {
        for pp in &up.pods {
            let claims = claiming.contains_key(&pp.key);
            planned += usize::from(claims);
            assert_eq!(
                up.pool.ends_with("-dra"),
                claims,
                "{} on pool {}",
                pp.key,
                up.pool
            );
        }
    }
    // Asking through a claim loses no pod: those the plan refuses are refused without claims too.
    let refused_plain: std::collections::BTreeSet<String> = run(&plain, &bench_policy())
        .unschedulable
        .into_iter()
        .map(|u| u.pod)
        .collect();
    let refused: Vec<&crate::plan::Unschedulable> = plan
        .unschedulable
        .iter()
        .filter(|u| claiming.contains_key(&u.pod))
        .collect();
    for u in &refused {
        assert!(refused_plain.contains(&u.pod), "{}: {}", u.pod, u.reason);
    }
    assert_eq!(planned + refused.len(), claiming.len());
    assert!(planned > 0);
}

#[test]
fn the_lower_bound_counts_claimed_devices_against_a_templates_devices() {
    let p = policy(DRA_POLICY);
    let c = catalog_for(&p);
    // Two pods, each claiming eight H100s: two whole p5.48xlarge at least, whatever the CPU.
    let s = dra_snap(
        (0..2)
            .map(|i| claiming(&format!("w{i}"), &[("gpu.nvidia.com", H100_80G, 8)]).build())
            .collect(),
        vec![],
    );
    let (templates, _) = build_templates(&p, &c, &s, NOW);
    let refs: Vec<&Pod> = s.pods.iter().collect();
    let lb = bound::lower_bound(&refs, &templates);
    let plan = run(&s, DRA_POLICY);
    assert_eq!(types(&plan), vec![("p5.48xlarge".to_string(), 2)]);
    // Under the devices' own weight each pod costs at least its share of the devices of the
    // cheapest template that has eight or more (MIG devices count: the bound reads no selector).
    let per_pod = templates
        .iter()
        .filter(|t| t.devices.len() >= 8)
        .flat_map(|t| {
            let share = 8.0 / t.devices.len() as f64;
            t.offerings
                .iter()
                .filter(|o| o.available)
                .map(move |o| o.price * share)
        })
        .fold(f64::INFINITY, f64::min);
    assert!(lb >= 2.0 * per_pod - 1e-9, "{lb} vs {per_pod} per pod");
    // Without the devices' dimension, the pods' CPU on the cheapest node would be all it saw.
    assert!(lb > 5.0, "{lb}");
    assert!(lb <= plan.added_cost_per_hour + 1e-9);
    // Allocated claims take nothing new.
    let mut allocated = s.clone();
    for pod in &mut allocated.pods {
        pod.claims[0].allocation = Some(crate::model::dra::Allocation {
            node: Some("n".into()),
            devices: vec![],
        });
    }
    let refs: Vec<&Pod> = allocated.pods.iter().collect();
    assert!(bound::lower_bound(&refs, &templates) < lb / 10.0);
}

#[test]
fn mig_devices_of_an_h100_carry_its_real_sizes_so_a_claim_for_9900mi_fits_a_1g_10gb() {
    let text = DRA_POLICY.replace(
        "    migLayout: {1g.5gb: 7}\n    maxNodes: 2\n",
        "    migLayout: {1g.10gb: 7}\n    maxNodes: 2\n",
    );
    let text = text.replace(
        "  - name: mig\n    instanceTypes: [p4d.24xlarge]",
        "  - name: mig\n    instanceTypes: [p5.48xlarge]",
    );
    // NVML reports 9984 MiB for a 1g.10gb of an H100 80GB: the name's `10G` (9537 MiB) would
    // refuse this claim although the real device takes it.
    let pod = claiming(
        "m",
        &[(
            "mig.nvidia.com",
            &[
                "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'",
                "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('9900Mi')) >= 0",
                "device.capacity['gpu.nvidia.com'].multiprocessors.compareTo(quantity('16')) >= 0",
            ],
            1,
        )],
    )
    .build();
    let plan = run(&dra_snap(vec![pod], vec![]), &text);
    assert!(plan.unschedulable.is_empty(), "{:?}", plan.unschedulable);
    assert_eq!(types(&plan), [("p5.48xlarge".to_string(), 1)]);
}
