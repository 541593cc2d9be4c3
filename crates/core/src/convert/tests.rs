//! Kubernetes objects into model values: quantities and effective requests, shared GPUs, MIG,
//! constraints, gangs, owners, nodes, PDBs and whole cluster files.

use serde_json::{json, Value};

use super::*;
use crate::model::labels::{GANG_KEYS, GANG_MIN_MEMBER_KEYS};
use crate::model::OwnerKind;

const GI: i64 = 1 << 30;
const MI: i64 = 1 << 20;
const CLUSTER_EXAMPLE: &str = include_str!("../../../../docs/examples/cluster.yaml");

// ---- builders ----

/// A container with these `resources.requests` and `resources.limits`.
fn container(requests: Value, limits: Value) -> Value {
    json!({"name": "c", "resources": {"requests": requests, "limits": limits}})
}

fn requesting(requests: Value) -> Value {
    container(requests, json!({}))
}

fn limited(limits: Value) -> Value {
    container(json!({}), limits)
}

/// A pending pod `ns/p` with these containers.
fn pod_json(containers: Vec<Value>) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ns", "uid": "uid-p"},
        "spec": {"containers": containers},
        "status": {"phase": "Pending"},
    })
}

/// `base` with `patch` merged in: objects are merged key by key, anything else is replaced.
fn merge(mut base: Value, patch: Value) -> Value {
    match (&mut base, patch) {
        (Value::Object(b), Value::Object(p)) => {
            for (k, v) in p {
                let merged = merge(b.remove(&k).unwrap_or(Value::Null), v);
                b.insert(k, merged);
            }
            base
        }
        (_, p) => p,
    }
}

/// A pod with one empty container, patched.
fn pod_with(patch: Value) -> Value {
    merge(pod_json(vec![requesting(json!({}))]), patch)
}

fn convert(v: Value) -> Pod {
    Converter::new().pod(v).expect("converts")
}

/// Converts a pod written in YAML (as a cluster file would be read), so that bare numbers are
/// YAML numbers.
fn convert_yaml(text: &str) -> Pod {
    convert(crate::yaml::parse(text).expect("valid YAML"))
}

fn node_json(patch: Value) -> Value {
    merge(
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}),
        patch,
    )
}

fn node(patch: Value) -> Node {
    Converter::new().node(node_json(patch)).expect("converts")
}

/// Resources with just `pods: 1`, plus what `f` sets.
fn res(f: impl FnOnce(&mut Resources)) -> Resources {
    let mut r = Resources {
        pods: 1,
        ..Default::default()
    };
    f(&mut r);
    r
}

fn labels(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
    kv.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn problem(p: &Pod) -> &str {
    p.problem
        .as_deref()
        .unwrap_or_else(|| panic!("no problem on {p:#?}"))
}

// ---- quantities and requests ----

#[test]
fn quantities_in_requests() {
    // (resource, quantity, resource read back, value)
    let cases: Vec<(&str, Value, &str, i64)> = vec![
        ("cpu", json!("500m"), "cpu", 500),
        ("cpu", json!("0.5"), "cpu", 500),
        ("cpu", json!(0.5), "cpu", 500),
        ("cpu", json!("2"), "cpu", 2000),
        ("cpu", json!(2), "cpu", 2000),
        ("cpu", json!("1e3"), "cpu", 1_000_000),
        ("cpu", json!("100u"), "cpu", 1),
        ("memory", json!("16Gi"), "memory", 16 * GI),
        ("memory", json!("1.5Gi"), "memory", 3 * GI / 2),
        ("memory", json!("129M"), "memory", 129_000_000),
        ("memory", json!("1e3"), "memory", 1000),
        ("memory", json!("128974848"), "memory", 128_974_848),
        ("memory", json!(128974848), "memory", 128_974_848),
        ("memory", json!("0.5"), "memory", 1),
        ("nvidia.com/gpu", json!(1), "nvidia.com/gpu", 1),
        ("nvidia.com/gpu", json!("2"), "nvidia.com/gpu", 2),
        ("amd.com/gpu", json!(1), "amd.com/gpu", 1),
        ("example.com/rdma", json!("3"), "example.com/rdma", 3),
        (
            "nvidia.com/mig-1g.5gb",
            json!(2),
            "nvidia.com/mig-1g.5gb",
            2,
        ),
    ];
    for (name, q, read, want) in cases {
        let p = convert(pod_json(vec![requesting(json!({ name: q.clone() }))]));
        assert_eq!(p.problem, None, "{name}: {q}");
        assert_eq!(p.requests.get(read), want, "{name}: {q}");
        assert_eq!(p.requests.pods, 1, "{name}: {q}");
        assert_eq!(p.share, None, "{name}: {q}");
    }
}

#[test]
fn bare_yaml_numbers_are_quantities() {
    let p = convert_yaml(
        "metadata: {name: p}
spec:
  containers:
  - name: c
    resources:
      requests: {cpu: 0.5, memory: 1073741824}
      limits: {nvidia.com/gpu: 1, example.com/fpga: 1e3}
",
    );
    assert_eq!(p.problem, None);
    assert_eq!(
        p.requests,
        res(|r| {
            r.cpu_milli = 500;
            r.memory = GI;
            r.gpu = 1;
            r.set("example.com/fpga", 1000);
        })
    );
}

#[test]
fn limits_stand_in_for_absent_requests() {
    let p = convert(pod_json(vec![container(
        json!({"cpu": "1"}),
        json!({"cpu": "2", "memory": "4Gi", "nvidia.com/gpu": 1, "nvidia.com/mig-2g.10gb": 1}),
    )]));
    assert_eq!(
        p.requests,
        res(|r| {
            r.cpu_milli = 1000; // the request, not the limit
            r.memory = 4 * GI;
            r.gpu = 1;
            r.set("nvidia.com/mig-2g.10gb", 1);
        })
    );
    assert!(p.wants_gpu());
}

#[test]
fn effective_requests_are_max_of_containers_and_init_containers_plus_overhead() {
    let mut v = pod_json(vec![
        requesting(json!({"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": 1})),
        requesting(json!({"cpu": "2", "memory": "1Gi"})),
    ]);
    v["spec"]["initContainers"] = json!([
        requesting(json!({"cpu": "4", "memory": "512Mi"})),
        limited(json!({"nvidia.com/gpu": 1, "memory": "1Gi"})),
    ]);
    v["spec"]["overhead"] = json!({"cpu": "250m", "memory": "64Mi"});
    let p = convert(v);
    assert_eq!(p.problem, None);
    assert_eq!(
        p.requests,
        res(|r| {
            r.cpu_milli = 4000 + 250; // the first init container beats 1 + 2
            r.memory = 2 * GI + 64 * MI; // the two containers beat every init container
            r.gpu = 1; // not 2: init containers run before the app containers
        })
    );
}

#[test]
fn restartable_init_containers_are_added_to_the_sum() {
    let sidecar = |cpu: &str| {
        let mut c = requesting(json!({"cpu": cpu, "memory": "1Gi"}));
        c["restartPolicy"] = json!("Always");
        c
    };
    // A sidecar, then a regular init container that runs alongside it.
    let mut v = pod_json(vec![requesting(json!({"cpu": "1", "memory": "1Gi"}))]);
    v["spec"]["initContainers"] = json!([
        sidecar("500m"),
        requesting(json!({"cpu": "3", "memory": "1Gi"}))
    ]);
    let p = convert(v);
    assert_eq!(
        p.requests,
        res(|r| {
            r.cpu_milli = 3500; // init 3 + sidecar 0.5 beats app 1 + sidecar 0.5
            r.memory = 2 * GI; // app + sidecar (init + sidecar is also 2Gi)
        })
    );

    // A regular init container before the sidecar does not run alongside it.
    let mut v = pod_json(vec![requesting(json!({"cpu": "1500m"}))]);
    v["spec"]["initContainers"] = json!([requesting(json!({"cpu": "2"})), sidecar("1")]);
    let p = convert(v);
    assert_eq!(p.requests.cpu_milli, 2500); // app 1.5 + sidecar 1 beats init 2
    assert_eq!(p.requests.memory, GI);

    // restartPolicy other than Always is an ordinary init container.
    let mut v = pod_json(vec![requesting(json!({"cpu": "1"}))]);
    let mut not_sidecar = requesting(json!({"cpu": "500m"}));
    not_sidecar["restartPolicy"] = json!("OnFailure");
    v["spec"]["initContainers"] = json!([not_sidecar]);
    assert_eq!(convert(v).requests.cpu_milli, 1000);
}

#[test]
fn ephemeral_storage_is_ignored() {
    let p = convert(pod_json(vec![container(
        json!({"cpu": "1", "ephemeral-storage": "10Gi"}),
        json!({"ephemeral-storage": "20Gi"}),
    )]));
    assert_eq!(p.problem, None);
    assert_eq!(p.requests, res(|r| r.cpu_milli = 1000));
    assert!(p.requests.extended.is_empty());
}

#[test]
fn a_pod_without_requests_still_takes_a_pod_slot() {
    let p = convert(pod_json(vec![]));
    assert_eq!(p.requests, res(|_| {}));
    assert!(!p.wants_gpu());
}

// ---- shared GPUs and MIG ----

#[test]
fn shared_gpu_units_go_into_the_share() {
    let p = convert(pod_json(vec![limited(json!({
        "aliyun.com/gpu-mem": 6,
        "aliyun.com/gpu-core.percentage": 30,
        "cpu": "1",
        "memory": "4Gi",
    }))]));
    assert_eq!(p.problem, None);
    assert_eq!(
        p.share,
        Some(GpuShare {
            mem_gib: 6,
            core_pct: 30
        })
    );
    assert_eq!(
        p.requests,
        res(|r| {
            r.cpu_milli = 1000;
            r.memory = 4 * GI;
        })
    );
    assert!(p.wants_gpu());

    // Memory only; two containers add up.
    let p = convert(pod_json(vec![
        requesting(json!({"aliyun.com/gpu-mem": "3"})),
        requesting(json!({"aliyun.com/gpu-mem": 4})),
    ]));
    assert_eq!(
        p.share,
        Some(GpuShare {
            mem_gib: 7,
            core_pct: 0
        })
    );
    assert!(p.requests.extended.is_empty());

    // gpu-count on a pod is meaningless and dropped.
    let p = convert(pod_json(vec![requesting(
        json!({"aliyun.com/gpu-count": 1}),
    )]));
    assert_eq!(p.share, None);
    assert_eq!(p.requests, res(|_| {}));
}

#[test]
fn huge_shares_saturate_instead_of_overflowing() {
    let huge = json!({"aliyun.com/gpu-mem": "9e18", "aliyun.com/gpu-core.percentage": "9e18"});
    let p = convert(pod_json(vec![requesting(huge.clone()), requesting(huge)]));
    assert_eq!(
        p.share,
        Some(GpuShare {
            mem_gib: i64::MAX,
            core_pct: i64::MAX
        })
    );
}

#[test]
fn gpu_core_percentage_must_be_a_multiple_of_5() {
    let p = convert(pod_json(vec![limited(json!({
        "aliyun.com/gpu-mem": 4,
        "aliyun.com/gpu-core.percentage": 33,
    }))]));
    assert_eq!(
        problem(&p),
        "aliyun.com/gpu-core.percentage must be a multiple of 5, got 33"
    );
    assert_eq!(
        p.share,
        Some(GpuShare {
            mem_gib: 4,
            core_pct: 33
        })
    );
}

#[test]
fn node_shared_gpus_split_the_advertised_memory() {
    let n = node(json!({"status": {"allocatable": {
        "cpu": "4", "memory": "16Gi", "pods": "110",
        "aliyun.com/gpu-mem": 30, "aliyun.com/gpu-count": 2,
    }}}));
    assert_eq!(n.shared_gpus, [SharedGpu::full(15), SharedGpu::full(15)]);
    assert_eq!(n.allocatable.cpu_milli, 4000);
    assert_eq!(n.allocatable.memory, 16 * GI);
    assert_eq!(n.allocatable.pods, 110);
    assert!(n.allocatable.extended.is_empty(), "{:?}", n.allocatable);
    assert_eq!(n.advertised_gpus(), 2);

    // Advertised core percentage is split too; a missing count means one GPU.
    let n = node(json!({"status": {"allocatable": {
        "aliyun.com/gpu-mem": "32", "aliyun.com/gpu-count": "4",
        "aliyun.com/gpu-core.percentage": 400,
    }}}));
    assert_eq!(n.shared_gpus, vec![SharedGpu::full(8); 4]);
    let n = node(json!({"status": {"allocatable": {"aliyun.com/gpu-mem": 15}}}));
    assert_eq!(n.shared_gpus, [SharedGpu::full(15)]);

    // No gpu-mem: not a shared-GPU node.
    let n = node(json!({"status": {"allocatable": {"aliyun.com/gpu-count": 2}}}));
    assert!(n.shared_gpus.is_empty());
}

#[test]
fn an_absurd_gpu_count_on_a_node_is_an_error_not_an_allocation() {
    let v = node_json(json!({"status": {"allocatable": {
        "aliyun.com/gpu-mem": 80, "aliyun.com/gpu-count": "1e15",
    }}}));
    let e = Converter::new().node(v).unwrap_err();
    assert!(
        e.contains("status.allocatable.aliyun.com/gpu-count") && e.contains("more than 64"),
        "{e}"
    );
    // The most a node may have still converts.
    let n = node(json!({"status": {"allocatable": {
        "aliyun.com/gpu-mem": 64 * 80, "aliyun.com/gpu-count": 64,
    }}}));
    assert_eq!(n.shared_gpus.len(), 64);
}

#[test]
fn mig_resources_are_extended_resources() {
    let p = convert(pod_json(vec![limited(json!({"nvidia.com/mig-1g.5gb": 1}))]));
    assert_eq!(
        p.requests.extended,
        [("nvidia.com/mig-1g.5gb".to_string(), 1)]
    );
    assert_eq!(p.requests.mig_slices().collect::<Vec<_>>(), [("1g.5gb", 1)]);
    assert_eq!(p.requests.whole_gpus(), 0);
    assert!(p.wants_gpu());

    let n = node(json!({"status": {"allocatable": {
        "nvidia.com/mig-1g.5gb": "7", "nvidia.com/mig-2g.10gb": 0,
    }}}));
    assert_eq!(
        n.allocatable.extended,
        [("nvidia.com/mig-1g.5gb".to_string(), 7)]
    );
    assert_eq!(n.advertised_gpus(), 7);
}

// ---- problems ----

#[test]
fn bad_quantities_set_a_problem_naming_the_field() {
    let cases: Vec<(Value, &str)> = vec![
        (
            pod_json(vec![requesting(json!({"cpu": "abc"}))]),
            "spec.containers[0].resources.requests.cpu: malformed quantity \"abc\": expected a \
             number, found 'a'",
        ),
        (
            pod_json(vec![requesting(json!({"memory": "-1Gi"}))]),
            "spec.containers[0].resources.requests.memory: negative quantity \"-1Gi\"",
        ),
        (
            pod_json(vec![requesting(json!({"memory": "1e30"}))]),
            "spec.containers[0].resources.requests.memory: quantity \"1e30\" is out of range",
        ),
        (
            // Fits in i64 as units, not as milli-units.
            pod_json(vec![requesting(json!({"cpu": "1e17"}))]),
            "spec.containers[0].resources.requests.cpu: quantity \"1e17\" is out of range",
        ),
        (
            pod_json(vec![requesting(json!({"cpu": [1]}))]),
            "spec.containers[0].resources.requests.cpu: expected a quantity, got [1]",
        ),
        (
            pod_json(vec![
                requesting(json!({"cpu": "1"})),
                requesting(json!({"nvidia.com/gpu": "1x"})),
            ]),
            "spec.containers[1].resources.requests.nvidia.com/gpu: malformed quantity \"1x\"",
        ),
        (
            pod_json(vec![limited(json!({"memory": "lots"}))]),
            "spec.containers[0].resources.limits.memory: malformed quantity \"lots\"",
        ),
        (
            merge(
                pod_json(vec![]),
                json!({"spec": {"initContainers": [{}, requesting(json!({"cpu": "-1"}))]}}),
            ),
            "spec.initContainers[1].resources.requests.cpu: negative quantity \"-1\"",
        ),
        (
            merge(
                pod_json(vec![]),
                json!({"spec": {"overhead": {"memory": "1Qi"}}}),
            ),
            "spec.overhead.memory: malformed quantity \"1Qi\": unknown suffix \"Qi\"",
        ),
    ];
    for (v, want) in cases {
        let p = convert(v);
        let got = problem(&p);
        assert!(got.starts_with(want), "want {want:?}, got {got:?}");
        // The pod still converts, with requests that at least hold its slot.
        assert_eq!(p.id, PodRef::new("ns", "p"));
        assert_eq!(p.requests, res(|_| {}));
        assert_eq!(p.share, None);
    }
}

#[test]
fn bare_yaml_out_of_range_quantity() {
    let p = convert_yaml(
        "metadata: {name: p}
spec:
  containers:
  - resources: {requests: {memory: 1e30}}
",
    );
    let got = problem(&p);
    assert!(
        got.starts_with("spec.containers[0].resources.requests.memory: quantity ")
            && got.ends_with("is out of range"),
        "{got}"
    );
}

#[test]
fn a_problem_does_not_stop_the_rest_of_the_pod() {
    let mut v = pod_with(json!({
        "metadata": {"labels": {"app": "x"}},
        "spec": {"nodeSelector": {"gpu": "t4"}, "priority": 10},
    }));
    v["spec"]["containers"] = json!([requesting(json!({"cpu": "abc"}))]);
    let p = convert(v);
    assert!(p.problem.is_some());
    assert_eq!(*p.labels, labels(&[("app", "x")]));
    assert_eq!(p.constraints.node_selector, labels(&[("gpu", "t4")]));
    assert_eq!(p.priority, 10);
}

// ---- constraints ----

#[test]
fn node_selector() {
    let p = convert(pod_with(json!({"spec": {"nodeSelector": {
        "nvidia.com/gpu.product": "NVIDIA-A10G", "workload": "gpu",
    }}})));
    assert_eq!(
        p.constraints.node_selector,
        labels(&[
            ("nvidia.com/gpu.product", "NVIDIA-A10G"),
            ("workload", "gpu")
        ])
    );
    assert_eq!(p.constraints.affinity, None);
}

fn affinity(terms: Value) -> Value {
    pod_with(json!({"spec": {"affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms},
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 1, "preference": {"matchExpressions": [
                {"key": "ignored", "operator": "Exists"}
            ]}}
        ],
    }}}}))
}

#[test]
fn node_affinity_with_every_operator() {
    let p = convert(affinity(json!([
        {"matchExpressions": [
            {"key": "gpu", "operator": "In", "values": ["A100", "H100"]},
            {"key": "zone", "operator": "NotIn", "values": ["us-east-1c"]},
            {"key": "nvidia.com/gpu.present", "operator": "Exists"},
            {"key": "spot", "operator": "DoesNotExist"},
            {"key": "gpu-count", "operator": "Gt", "values": ["3"]},
            {"key": "gpu-count", "operator": "Lt", "values": ["9"]},
        ]},
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-1"]}]},
    ])));
    assert_eq!(p.problem, None);
    let r = |key: &str, operator, values: &[&str]| Requirement {
        key: key.into(),
        operator,
        values: values.iter().map(|s| s.to_string()).collect(),
    };
    assert_eq!(
        p.constraints.affinity,
        Some(vec![
            Term {
                requirements: vec![
                    r("gpu", Operator::In, &["A100", "H100"]),
                    r("zone", Operator::NotIn, &["us-east-1c"]),
                    r("nvidia.com/gpu.present", Operator::Exists, &[]),
                    r("spot", Operator::DoesNotExist, &[]),
                    r("gpu-count", Operator::Gt, &["3"]),
                    r("gpu-count", Operator::Lt, &["9"]),
                ],
                node_names: None,
            },
            Term {
                requirements: vec![],
                node_names: Some(vec!["node-1".into()]),
            },
        ])
    );
    let good = labels(&[
        ("gpu", "A100"),
        ("zone", "us-east-1a"),
        ("nvidia.com/gpu.present", "true"),
        ("gpu-count", "8"),
    ]);
    assert!(p.constraints.matches_node(&good, None));
    assert!(p.constraints.matches_node(&labels(&[]), Some("node-1")));
    assert!(!p.constraints.matches_node(&labels(&[]), Some("node-2")));
}

#[test]
fn match_fields_other_than_metadata_name_in_are_ignored() {
    let p = convert(affinity(json!([
        {"matchFields": [
            {"key": "metadata.name", "operator": "NotIn", "values": ["node-1"]},
            {"key": "spec.unschedulable", "operator": "In", "values": ["false"]},
        ]},
    ])));
    assert_eq!(
        p.constraints.affinity,
        Some(vec![Term {
            requirements: vec![],
            node_names: None
        }])
    );
}

#[test]
fn unknown_affinity_operator_sets_a_problem() {
    let p = convert(affinity(json!([
        {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["T4"]}]},
        {"matchExpressions": [
            {"key": "gpu", "operator": "In", "values": ["A100"]},
            {"key": "gpu", "operator": "Contains", "values": ["A"]},
        ]},
    ])));
    let got = problem(&p);
    assert!(got.contains("nodeSelectorTerms[1]"), "{got}");
    assert!(
        got.ends_with("unknown operator \"Contains\" for key \"gpu\""),
        "{got}"
    );
}

#[test]
fn tolerations() {
    let p = convert(pod_with(json!({"spec": {"tolerations": [
        {"key": "nvidia.com/gpu", "operator": "Equal", "value": "true", "effect": "NoSchedule"},
        {"key": "dedicated", "operator": "Exists"},
        {"operator": "Exists"},
        {"key": "", "operator": "Exists", "effect": "NoExecute"},
        {"key": "team", "value": "ml"},
        {"key": "soft", "operator": "Exists", "effect": "", "tolerationSeconds": 30},
        {"key": "x", "effect": "PreferNoSchedule"},
    ]}})));
    assert_eq!(p.problem, None);
    let t = |key: Option<&str>, exists, value: &str, effect| Toleration {
        key: key.map(String::from),
        exists,
        value: value.into(),
        effect,
    };
    assert_eq!(
        p.constraints.tolerations,
        [
            t(
                Some("nvidia.com/gpu"),
                false,
                "true",
                Some(Effect::NoSchedule)
            ),
            t(Some("dedicated"), true, "", None),
            t(None, true, "", None),
            t(None, true, "", Some(Effect::NoExecute)),
            t(Some("team"), false, "ml", None),
            t(Some("soft"), true, "", None),
            t(Some("x"), false, "", Some(Effect::PreferNoSchedule)),
        ]
    );
}

#[test]
fn unknown_toleration_operator_or_effect_sets_a_problem() {
    let cases = [
        (
            json!([{"key": "a", "operator": "Exists"}, {"key": "b", "operator": "Gt"}]),
            "spec.tolerations[1].operator: unknown \"Gt\"",
        ),
        (
            json!([{"key": "a", "effect": "NoScheduel"}]),
            "spec.tolerations[0].effect: unknown \"NoScheduel\"",
        ),
    ];
    for (tols, want) in cases {
        let p = convert(pod_with(json!({"spec": {"tolerations": tols}})));
        assert_eq!(p.problem.as_deref(), Some(want));
        assert!(p.constraints.tolerations.is_empty());
    }
}

#[test]
fn equal_constraints_are_shared() {
    let mut conv = Converter::new();
    let v = pod_with(json!({"spec": {"nodeSelector": {"gpu": "t4"}}}));
    let a = conv.pod(v.clone()).unwrap();
    let b = conv
        .pod(merge(v, json!({"metadata": {"name": "q"}})))
        .unwrap();
    let c = conv.pod(pod_with(json!({}))).unwrap();
    assert!(Arc::ptr_eq(&a.constraints, &b.constraints));
    assert!(!Arc::ptr_eq(&a.constraints, &c.constraints));
}

// ---- gangs, owners, storage, status ----

#[test]
fn gang_from_every_key_in_labels_or_annotations() {
    for key in GANG_KEYS {
        for place in ["labels", "annotations"] {
            let p = convert(pod_with(json!({"metadata": {place: {key: "job-1"}}})));
            assert_eq!(
                p.gang,
                Some(GangRef {
                    key: "ns/job-1".into(),
                    min_member: None
                }),
                "{place} {key}"
            );
        }
    }
}

#[test]
fn gang_min_member_from_every_key() {
    for key in GANG_MIN_MEMBER_KEYS {
        let p = convert(pod_with(json!({"metadata": {
            "labels": {GANG_KEYS[0]: "g"},
            "annotations": {key: "4"},
        }})));
        assert_eq!(
            p.gang,
            Some(GangRef {
                key: "ns/g".into(),
                min_member: Some(4)
            }),
            "{key}"
        );
    }
    // Unparsable: no minimum.
    let p = convert(pod_with(json!({"metadata": {"annotations": {
        "mpi-job-name": "g", "scheduling.k8s.io/group-min-member": "three",
    }}})));
    assert_eq!(p.gang.unwrap().min_member, None);
    // A min member without a group is no gang.
    let p = convert(pod_with(json!({"metadata": {"annotations": {
        "scheduling.k8s.io/group-min-member": "3",
    }}})));
    assert_eq!(p.gang, None);
}

#[test]
fn gang_keys_are_looked_up_in_order() {
    let p = convert(pod_with(json!({"metadata": {
        "labels": {GANG_KEYS[2]: "from-label"},
        "annotations": {GANG_KEYS[0]: "from-annotation"},
    }})));
    assert_eq!(p.gang.unwrap().key, "ns/from-annotation");
    // Pods without a namespace are in `default`.
    let mut v = pod_with(json!({"metadata": {"labels": {GANG_KEYS[1]: "g"}}}));
    v["metadata"].as_object_mut().unwrap().remove("namespace");
    let p = convert(v);
    assert_eq!(p.id, PodRef::new("default", "p"));
    assert_eq!(p.gang.unwrap().key, "default/g");
}

fn owned_by(refs: Value) -> Pod {
    convert(pod_with(json!({"metadata": {"ownerReferences": refs}})))
}

#[test]
fn owner_kinds() {
    let cases = [
        ("apps/v1", "ReplicaSet", OwnerKind::ReplicaSet),
        (
            "v1",
            "ReplicationController",
            OwnerKind::ReplicationController,
        ),
        ("apps/v1", "StatefulSet", OwnerKind::StatefulSet),
        ("apps/v1", "DaemonSet", OwnerKind::DaemonSet),
        ("batch/v1", "Job", OwnerKind::Job),
        (
            "kubeflow.org/v2beta1",
            "MPIJob",
            OwnerKind::Kubeflow("MPIJob".into()),
        ),
        (
            "kubeflow.org/v1",
            "PyTorchJob",
            OwnerKind::Kubeflow("PyTorchJob".into()),
        ),
        (
            "example.com/v1",
            "MPIJob",
            OwnerKind::Other("MPIJob".into()),
        ),
    ];
    for (api_version, kind, want) in cases {
        let p = owned_by(json!([{
            "apiVersion": api_version, "kind": kind, "name": "o", "uid": "o-1", "controller": true,
        }]));
        assert_eq!(
            p.owner,
            Some(Owner {
                kind: want.clone(),
                name: "o".into(),
                uid: "o-1".into()
            }),
            "{api_version} {kind}"
        );
        assert_eq!(p.is_daemonset(), want == OwnerKind::DaemonSet);
    }
}

#[test]
fn the_controller_is_the_owner() {
    let p = owned_by(json!([
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "cm", "uid": "1"},
        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "2", "controller": true},
    ]));
    assert_eq!(p.owner.unwrap().name, "rs");
    // Without a controlling reference nothing recreates the pod: it has no owner (and is not
    // movable by a scale-down).
    let p = owned_by(json!([
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "cm", "uid": "1", "controller": false},
        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "2"},
    ]));
    assert_eq!(p.owner, None);
    assert_eq!(owned_by(json!([])).owner, None);
}

#[test]
fn local_storage_from_empty_dir_or_host_path() {
    let cases = [
        (json!([{"name": "scratch", "emptyDir": {}}]), true),
        (
            json!([{"name": "shm", "emptyDir": {"medium": "Memory"}}]),
            true,
        ),
        (
            json!([{"name": "logs", "hostPath": {"path": "/var/log"}}]),
            true,
        ),
        (
            json!([{"name": "cfg", "configMap": {"name": "c"}}, {"name": "pvc", "persistentVolumeClaim": {"claimName": "x"}}]),
            false,
        ),
        (json!([]), false),
    ];
    for (volumes, want) in cases {
        let p = convert(pod_with(json!({"spec": {"volumes": volumes.clone()}})));
        assert_eq!(p.local_storage, want, "{volumes}");
    }
    // The Cluster Autoscaler's safe-to-evict-local-volumes: named local volumes may be lost.
    let volumes =
        json!([{"name": "scratch", "emptyDir": {}}, {"name": "logs", "hostPath": {"path": "/l"}}]);
    for (may_lose, want) in [("scratch", true), ("scratch, logs", false), ("", true)] {
        let p = convert(pod_with(json!({
            "metadata": {"annotations": {"cluster-autoscaler.kubernetes.io/safe-to-evict-local-volumes": may_lose}},
            "spec": {"volumes": volumes.clone()},
        })));
        assert_eq!(p.local_storage, want, "{may_lose:?}");
    }
}

#[test]
fn unschedulable_only_from_pod_scheduled_false_unschedulable() {
    let cases = [
        (
            json!([{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]),
            true,
        ),
        (
            json!([{"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}]),
            false,
        ),
        (json!([{"type": "PodScheduled", "status": "False"}]), false),
        (json!([{"type": "PodScheduled", "status": "True"}]), false),
        (
            json!([{"type": "Ready", "status": "False", "reason": "Unschedulable"}]),
            false,
        ),
        (json!([]), false),
    ];
    for (conditions, want) in cases {
        let p = convert(pod_with(
            json!({"status": {"conditions": conditions.clone()}}),
        ));
        assert_eq!(p.unschedulable, want, "{conditions}");
    }
}

#[test]
fn phase_deletion_binding_and_metadata() {
    for (phase, want) in [
        ("Pending", PodPhase::Pending),
        ("", PodPhase::Pending),
        ("Running", PodPhase::Running),
        ("Succeeded", PodPhase::Succeeded),
        ("Failed", PodPhase::Failed),
        ("Evicted", PodPhase::Unknown),
    ] {
        let p = convert(pod_with(json!({"status": {"phase": phase}})));
        assert_eq!(p.phase, want, "{phase:?}");
    }
    let mut v = pod_with(json!({}));
    v.as_object_mut().unwrap().remove("status");
    assert_eq!(convert(v).phase, PodPhase::Pending);

    let p = convert(pod_with(json!({
        "metadata": {
            "deletionTimestamp": "2026-11-21T10:05:00Z",
            "creationTimestamp": "2026-11-21T10:00:00Z",
            "annotations": {"ALIYUN_COM_GPU_MEM_IDX": "1", "note": "x"},
        },
        "spec": {"nodeName": "n1", "priority": -5},
        "status": {"phase": "Running", "startTime": "2026-11-21T10:02:00Z"},
    })));
    assert!(p.deleting);
    assert_eq!(p.started, Time::parse_rfc3339("2026-11-21T10:02:00Z").ok());
    assert_eq!(
        p.created,
        Time::parse_rfc3339("2026-11-21T10:00:00Z").unwrap()
    );
    assert_eq!(p.node_name.as_deref(), Some("n1"));
    assert_eq!(p.priority, -5);
    assert_eq!(p.uid, "uid-p");
    assert_eq!(p.shared_gpu_index, Some(1));
    assert_eq!(p.annotations.get("note").map(String::as_str), Some("x"));
    assert!(p.is_bound_active());
    assert!(!p.is_pending());

    let p = convert(pod_with(json!({"spec": {"nodeName": ""}})));
    assert!(!p.deleting);
    assert_eq!(p.node_name, None);
    assert_eq!(p.created, Time::EPOCH);
    assert_eq!(p.started, None);
    assert_eq!(p.priority, 0);
    assert!(p.is_pending());
}

#[test]
fn pods_that_cannot_be_converted() {
    let mut conv = Converter::new();
    let mut v = pod_with(json!({}));
    v["metadata"].as_object_mut().unwrap().remove("name");
    assert_eq!(conv.pod(v).unwrap_err(), "Pod without metadata.name");
    let e = conv
        .pod(json!({"spec": {"containers": "none"}}))
        .unwrap_err();
    assert!(e.starts_with("not a Pod: "), "{e}");
    assert!(conv.pod(json!([1])).unwrap_err().starts_with("not a Pod: "));
}

// ---- nodes ----

#[test]
fn node_fields() {
    let n = node(json!({
        "metadata": {
            "creationTimestamp": "2026-11-21T08:00:00Z",
            "labels": {
                "gpu-node-autoscaler.io/pool": "a10g",
                "node.kubernetes.io/instance-type": "g5.12xlarge",
                "topology.kubernetes.io/zone": "us-east-1a",
            },
            "annotations": {"a": "b"},
        },
        "spec": {
            "providerID": "aws:///us-east-1a/i-0123",
            "taints": [
                {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"},
                {"key": "soft", "effect": "PreferNoSchedule"},
                {"key": "gone", "effect": "NoExecute", "timeAdded": "2026-11-21T08:00:00Z"},
                {"key": "weird", "effect": "Sometimes"},
            ],
        },
        "status": {
            "allocatable": {"cpu": "47800m", "memory": "190Gi", "pods": "110",
                            "nvidia.com/gpu": "4", "ephemeral-storage": "100Gi"},
            "conditions": [
                {"type": "MemoryPressure", "status": "False"},
                {"type": "Ready", "status": "True", "reason": "KubeletReady"},
            ],
        },
    }));
    assert_eq!(n.name, "n1");
    assert_eq!(n.pool(), Some("a10g"));
    assert_eq!(n.instance_type(), Some("g5.12xlarge"));
    assert_eq!(n.zone(), Some("us-east-1a"));
    assert_eq!(*n.annotations, labels(&[("a", "b")]));
    assert_eq!(n.provider_id.as_deref(), Some("aws:///us-east-1a/i-0123"));
    assert_eq!(
        n.created,
        Time::parse_rfc3339("2026-11-21T08:00:00Z").unwrap()
    );
    let taint = |key: &str, value: &str, effect| Taint {
        key: key.into(),
        value: value.into(),
        effect,
    };
    // A taint with an unknown effect is dropped.
    assert_eq!(
        n.taints,
        [
            taint("nvidia.com/gpu", "true", Effect::NoSchedule),
            taint("soft", "", Effect::PreferNoSchedule),
            taint("gone", "", Effect::NoExecute),
        ]
    );
    assert_eq!(
        n.allocatable,
        Resources {
            cpu_milli: 47_800,
            memory: 190 * GI,
            pods: 110,
            gpu: 4,
            ..Default::default()
        }
    );
    assert!(n.ready);
    assert!(!n.unschedulable);
    assert!(!n.deleting);
    assert!(n.is_schedulable());
    assert!(n.shared_gpus.is_empty());
}

#[test]
fn node_readiness_cordon_and_deletion() {
    for (conditions, want) in [
        (json!([{"type": "Ready", "status": "True"}]), true),
        (json!([{"type": "Ready", "status": "False"}]), false),
        (json!([{"type": "Ready", "status": "Unknown"}]), false),
        (
            json!([{"type": "NetworkUnavailable", "status": "True"}]),
            false,
        ),
        (json!([]), false),
    ] {
        let n = node(json!({"status": {"conditions": conditions.clone()}}));
        assert_eq!(n.ready, want, "{conditions}");
    }
    let n = node(json!({
        "metadata": {"deletionTimestamp": "2026-11-21T08:00:00Z"},
        "spec": {"unschedulable": true},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }));
    assert!(n.unschedulable);
    assert!(n.deleting);
    assert!(!n.is_schedulable());
    assert_eq!(n.provider_id, None);
    assert!(n.labels.is_empty());
}

#[test]
fn nodes_that_cannot_be_converted() {
    let mut conv = Converter::new();
    assert_eq!(
        conv.node(json!({"metadata": {}})).unwrap_err(),
        "Node without metadata.name"
    );
    let e = conv
        .node(node_json(
            json!({"status": {"allocatable": {"cpu": "4", "memory": "lots"}}}),
        ))
        .unwrap_err();
    assert_eq!(
        e,
        "Node n1: status.allocatable.memory: malformed quantity \"lots\": expected a number, \
         found 'l'"
    );
    let e = conv.node(json!({"spec": "x"})).unwrap_err();
    assert!(e.starts_with("not a Node: "), "{e}");
}

// ---- PDBs ----

fn pdb_json(namespace: &str, selector: Value) -> Value {
    json!({
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "budget", "namespace": namespace},
        "spec": {"minAvailable": 1, "selector": selector},
        "status": {"disruptionsAllowed": 2, "currentHealthy": 3},
    })
}

fn pod_in(namespace: &str, kv: &[(&str, &str)]) -> Pod {
    let l: BTreeMap<String, String> = labels(kv);
    convert(pod_with(
        json!({"metadata": {"namespace": namespace, "labels": l}}),
    ))
}

#[test]
fn pdb_selector_and_status() {
    let pdb = Converter::new()
        .pdb(pdb_json(
            "inference",
            json!({
                "matchLabels": {"app": "chat"},
                "matchExpressions": [
                    {"key": "tier", "operator": "NotIn", "values": ["canary"]},
                    {"key": "track", "operator": "Exists"},
                ],
            }),
        ))
        .unwrap();
    assert_eq!(
        pdb,
        Pdb {
            namespace: "inference".into(),
            name: "budget".into(),
            selector: vec![
                Requirement {
                    key: "app".into(),
                    operator: Operator::In,
                    values: vec!["chat".into()]
                },
                Requirement {
                    key: "tier".into(),
                    operator: Operator::NotIn,
                    values: vec!["canary".into()]
                },
                Requirement {
                    key: "track".into(),
                    operator: Operator::Exists,
                    values: vec![]
                },
            ],
            disruptions_allowed: 2,
        }
    );
    assert!(pdb.selects(&pod_in(
        "inference",
        &[("app", "chat"), ("track", "stable")]
    )));
    assert!(!pdb.selects(&pod_in(
        "inference",
        &[("app", "chat"), ("track", "stable"), ("tier", "canary")]
    )));
    assert!(!pdb.selects(&pod_in("inference", &[("app", "chat")])));
    assert!(!pdb.selects(&pod_in("inference", &[("app", "ocr"), ("track", "x")])));
    // Same labels, other namespace.
    assert!(!pdb.selects(&pod_in("default", &[("app", "chat"), ("track", "stable")])));
}

#[test]
fn pdb_with_an_empty_selector_selects_its_whole_namespace() {
    let pdb = Converter::new().pdb(pdb_json("ns", json!({}))).unwrap();
    assert!(pdb.selector.is_empty());
    assert!(pdb.selects(&pod_in("ns", &[("anything", "x")])));
    assert!(!pdb.selects(&pod_in("other", &[])));
}

#[test]
fn pdb_defaults_and_errors() {
    let mut conv = Converter::new();
    let pdb = conv
        .pdb(
            json!({"kind": "PodDisruptionBudget", "metadata": {"name": "b"},
                    "spec": {"selector": {}}}),
        )
        .unwrap();
    assert_eq!(pdb.namespace, "default");
    assert_eq!(pdb.disruptions_allowed, 0);
    let e = conv
        .pdb(pdb_json(
            "ns",
            json!({"matchExpressions": [{"key": "a", "operator": "Like"}]}),
        ))
        .unwrap_err();
    assert_eq!(e, "unknown operator \"Like\" for key \"a\"");
}

#[test]
fn pdb_without_a_selector_selects_no_pods() {
    // policy/v1: a null selector selects nothing, unlike `{}`; such a budget is left out rather
    // than read as protecting its whole namespace.
    let mut conv = Converter::new();
    for v in [
        pdb_json("ns", Value::Null),
        json!({"kind": "PodDisruptionBudget", "metadata": {"name": "b", "namespace": "ns"},
               "spec": {"maxUnavailable": 0}, "status": {"disruptionsAllowed": 0}}),
    ] {
        let e = conv.pdb(v).unwrap_err();
        assert_eq!(e, "no spec.selector, so it selects no pods");
    }
}

// ---- cluster files ----

#[test]
fn example_cluster_file_loads() {
    let loaded = load_cluster_file(CLUSTER_EXAMPLE, "docs/examples/cluster.yaml").unwrap();
    assert_eq!(loaded.warnings, Vec::<String>::new());
    let s = &loaded.snapshot;
    assert_eq!(s.nodes.len(), 3);
    assert_eq!(s.pods.len(), 14);
    assert_eq!(s.pdbs.len(), 1);
    assert!(s.in_flight.is_empty());

    let n = &s.nodes[0];
    assert_eq!(n.name, "ip-10-0-1-17.ec2.internal");
    assert!(n.is_schedulable());
    assert_eq!(n.allocatable.gpu, 4);
    assert_eq!(n.allocatable.pods, 110);

    let pod = |name: &str| s.pods.iter().find(|p| p.id.name == name).unwrap();
    assert!(pod("nvidia-device-plugin-7xk2p").is_daemonset());
    assert_eq!(
        pod("chat-7d9f-abcde").requests,
        res(|r| {
            r.cpu_milli = 4000;
            r.memory = 24 * GI;
            r.gpu = 1;
        })
    );
    assert!(pod("chat-7d9f-fghij").unschedulable);
    let worker = pod("bert-large-worker-0");
    assert_eq!(
        worker.gang,
        Some(GangRef {
            key: "team-nlp/bert-large".into(),
            min_member: Some(3)
        })
    );
    assert_eq!(
        worker.owner.as_ref().unwrap().kind,
        OwnerKind::Kubeflow("MPIJob".into())
    );
    assert_eq!(
        pod("notebook-ana")
            .requests
            .mig_slices()
            .collect::<Vec<_>>(),
        [("1g.5gb", 1)]
    );
    assert_eq!(
        pod("ocr-0").share,
        Some(GpuShare {
            mem_gib: 6,
            core_pct: 30
        })
    );
    assert_eq!(pod("too-big").requests.gpu, 16);
    let pending = s.pods.iter().filter(|p| p.is_pending()).count();
    assert_eq!(pending, 10);

    let pdb = &s.pdbs[0];
    assert_eq!(
        (pdb.namespace.as_str(), pdb.name.as_str()),
        ("inference", "chat")
    );
    assert!(pdb.selects(pod("chat-7d9f-abcde")));
    assert_eq!(pdb.disruptions_allowed, 0);
}

#[test]
fn json_cluster_files_load_too() {
    let list = crate::yaml::parse(CLUSTER_EXAMPLE).unwrap();
    let text = serde_json::to_string_pretty(&list).unwrap();
    let from_json = load_cluster_file(&text, "cluster.json").unwrap();
    let from_yaml = load_cluster_file(CLUSTER_EXAMPLE, "cluster.yaml").unwrap();
    assert!(from_json.warnings.is_empty());
    assert_eq!(from_json.snapshot, from_yaml.snapshot);

    // Typed lists (`kubectl get pods -o json`) are lists too.
    let text = json!({"apiVersion": "v1", "kind": "PodList", "items": [
        merge(pod_json(vec![]), json!({"kind": "Pod"})),
    ]})
    .to_string();
    let loaded = load_cluster_file(&text, "pods.json").unwrap();
    assert_eq!(loaded.snapshot.pods.len(), 1);
}

#[test]
fn non_list_documents_are_errors() {
    let cases = [
        (
            "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n",
            "pod.yaml: expected a Kubernetes List with `items` (what `kubectl get \
             pods,nodes,pdb,pvc,pv,storageclass,csinode,namespaces -A -o yaml` prints), got kind \"Pod\"",
        ),
        (
            "items: []\n",
            "pod.yaml: expected a Kubernetes List with `items` (what `kubectl get \
             pods,nodes,pdb,pvc,pv,storageclass,csinode,namespaces -A -o yaml` prints), got no `kind`",
        ),
        ("kind: List\nitems: {}\n", "got kind \"List\""),
        ("kind: List\n", "got kind \"List\""),
        ("", "got no `kind`"),
        ("[1, 2]", "got no `kind`"),
    ];
    for (text, want) in cases {
        let e = load_cluster_file(text, "pod.yaml").unwrap_err();
        assert!(
            e.starts_with("pod.yaml: ") && e.ends_with(want),
            "{text:?}: {e}"
        );
    }
    // An empty List is fine.
    let loaded = load_cluster_file("kind: List\nitems: []\n", "empty.yaml").unwrap();
    assert_eq!(loaded.snapshot, Snapshot::default());
}

#[test]
fn invalid_yaml_names_file_line_and_column() {
    let cases = [
        // Where the unclosed sequence opens.
        (
            "kind: List\nitems: [\n",
            "c.yaml:2:8: not valid YAML or JSON: unclosed bracket",
        ),
        // Where the key without its `:` starts.
        (
            "kind: List\nitems:\n- a: 1\n  b\n",
            "c.yaml:4:3: not valid YAML or JSON: ",
        ),
        (
            "{\"kind\": \"List\", \"items\": [}",
            "c.yaml:1:27: not valid YAML or JSON: mismatched bracket '[' closed by '}'",
        ),
    ];
    for (text, want) in cases {
        let e = load_cluster_file(text, "c.yaml").unwrap_err();
        assert!(e.starts_with(want), "{text:?}: {e}");
    }
}

#[test]
fn unknown_kinds_and_broken_objects_are_warnings() {
    let text = json!({"kind": "List", "items": [
        {"kind": "Node", "metadata": {"name": "n1"}},
        {"kind": "Service", "metadata": {"name": "svc", "namespace": "web"}},
        {"kind": "Pod", "metadata": {"namespace": "ns"}, "spec": {}},
        merge(pod_json(vec![requesting(json!({"cpu": "abc"}))]), json!({"kind": "Pod"})),
        {"kind": "Node", "metadata": {"name": "n2"}, "status": {"allocatable": {"cpu": "x"}}},
        {"kind": "PodDisruptionBudget", "metadata": {"name": "b", "namespace": "ns"},
         "spec": {"selector": {"matchExpressions": [{"key": "a", "operator": "Like"}]}}},
        {"metadata": {"name": "kindless"}},
        {"kind": "Pod", "metadata": {"name": "ok", "namespace": "ns"}},
        {"kind": "PodDisruptionBudget", "metadata": {"name": "b2", "namespace": "ns"},
         "spec": {"selector": {"matchLabels": {"app": "x"}}}},
        {"kind": "PodDisruptionBudget", "metadata": {"name": "b3", "namespace": "ns"}},
    ]})
    .to_string();
    let loaded = load_cluster_file(&text, "c.json").unwrap();
    assert_eq!(loaded.warnings.len(), 7, "{:#?}", loaded.warnings);
    assert_eq!(
        loaded.warnings[..5],
        [
            "c.json: items[1] Service web/svc: ignored (only Pods, Nodes, PodDisruptionBudgets, \
             ResourceClaims, ResourceClaimTemplates, DeviceClasses, ResourceSlices, \
             PersistentVolumeClaims, PersistentVolumes, StorageClasses, CSINodes and Namespaces \
             are read)",
            "c.json: items[2] Pod ns/?: skipped: Pod without metadata.name",
            "c.json: items[3] Pod ns/p: spec.containers[0].resources.requests.cpu: malformed \
             quantity \"abc\": expected a number, found 'a'",
            "c.json: items[4] Node n2: skipped: Node n2: status.allocatable.cpu: malformed \
             quantity \"x\": expected a number, found 'x'",
            "c.json: items[5] PodDisruptionBudget ns/b: skipped: unknown operator \"Like\" for \
             key \"a\"",
        ]
    );
    let kindless = &loaded.warnings[5];
    assert!(
        kindless.starts_with("c.json: items[6] ")
            && kindless.ends_with(
                "kindless: ignored (only Pods, Nodes, PodDisruptionBudgets, ResourceClaims, \
                 ResourceClaimTemplates, DeviceClasses, ResourceSlices, PersistentVolumeClaims, \
                 PersistentVolumes, StorageClasses, CSINodes and Namespaces are read)"
            ),
        "{kindless}"
    );
    assert_eq!(
        loaded.warnings[6],
        "c.json: items[9] PodDisruptionBudget ns/b3: skipped: no spec.selector, so it selects \
         no pods"
    );
    let s = &loaded.snapshot;
    let names = |v: Vec<&str>| v.join(",");
    assert_eq!(
        names(s.nodes.iter().map(|n| n.name.as_str()).collect()),
        "n1"
    );
    // The pod with a problem is kept, so the planner can report it.
    assert_eq!(
        names(s.pods.iter().map(|p| p.id.name.as_str()).collect()),
        "p,ok"
    );
    assert!(s.pods[0].problem.is_some());
    assert_eq!(
        names(s.pdbs.iter().map(|p| p.name.as_str()).collect()),
        "b2"
    );
}

/// Pods with claims, the claims, their template, DeviceClasses and a node's ResourceSlice, as
/// `kubectl get ... -o yaml` prints them (`resource.k8s.io/v1`).
const DRA_CLUSTER: &str = r#"
apiVersion: v1
kind: List
items:
- apiVersion: resource.k8s.io/v1
  kind: DeviceClass
  metadata: {name: gpu.nvidia.com}
  spec:
    selectors:
    - cel: {expression: "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"}
- apiVersion: resource.k8s.io/v1
  kind: ResourceClaimTemplate
  metadata: {name: h100, namespace: ml}
  spec:
    spec:
      devices:
        requests:
        - name: gpu
          exactly:
            deviceClassName: gpu.nvidia.com
            count: 2
            selectors:
            - cel: {expression: "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H100 80GB HBM3'"}
- apiVersion: resource.k8s.io/v1
  kind: ResourceClaim
  metadata: {name: shared, namespace: ml}
  spec:
    devices:
      requests:
      - name: any
        firstAvailable:
        - {name: big, deviceClassName: gpu.nvidia.com, allocationMode: All}
        - {name: one, deviceClassName: gpu.nvidia.com}
  status:
    allocation:
      devices:
        results:
        - {request: any/one, driver: gpu.nvidia.com, pool: node-a, device: gpu-0}
      nodeSelector:
        nodeSelectorTerms:
        - matchFields:
          - {key: metadata.name, operator: In, values: [node-a]}
- apiVersion: resource.k8s.io/v1
  kind: ResourceSlice
  metadata: {name: node-a-gpu-xyz}
  spec:
    driver: gpu.nvidia.com
    nodeName: node-a
    pool: {name: node-a, generation: 1, resourceSliceCount: 1}
    devices:
    - name: gpu-0
      attributes:
        type: {string: gpu}
        productName: {string: NVIDIA H100 80GB HBM3}
        cudaComputeCapability: {version: 9.0.0}
        resource.kubernetes.io/pcieRoot: {string: pci0000:00}
      capacity:
        memory: {value: 81559Mi}
    - name: gpu-1
      attributes:
        type: {string: gpu}
        productName: {string: NVIDIA H100 80GB HBM3}
      capacity:
        memory: {value: 81559Mi}
- apiVersion: resource.k8s.io/v1
  kind: ResourceSlice
  metadata: {name: node-a-gpu-old}
  spec:
    driver: gpu.nvidia.com
    nodeName: node-a
    pool: {name: node-a, generation: 0, resourceSliceCount: 1}
    devices:
    - name: gpu-9
      attributes: {type: {string: gpu}}
- apiVersion: v1
  kind: Node
  metadata: {name: node-a}
  status:
    allocatable: {cpu: "8", memory: 32Gi, pods: "110"}
    conditions: [{type: Ready, status: "True"}]
- apiVersion: v1
  kind: Pod
  metadata: {name: train, namespace: ml}
  spec:
    containers: [{name: c, resources: {claims: [{name: gpus}]}}]
    resourceClaims: [{name: gpus, resourceClaimTemplateName: h100}]
  status:
    phase: Pending
    resourceClaimStatuses: [{name: gpus, resourceClaimName: train-gpus-abcde}]
- apiVersion: v1
  kind: Pod
  metadata: {name: s1, namespace: ml, creationTimestamp: "2026-01-01T00:00:00Z"}
  spec:
    containers: [{name: c}]
    resourceClaims: [{name: g, resourceClaimName: shared}]
  status: {phase: Pending}
- apiVersion: v1
  kind: Pod
  metadata: {name: lost, namespace: ml}
  spec:
    containers: [{name: c}]
    resourceClaims: [{name: g, resourceClaimName: nowhere}]
  status: {phase: Pending}
"#;

#[test]
fn dra_objects_are_read_and_joined_with_pods() {
    use crate::model::dra::{AttrValue, DeviceCount};
    let loaded = load_cluster_file(DRA_CLUSTER, "dra.yaml").unwrap();
    let s = &loaded.snapshot;
    assert_eq!(
        loaded.warnings,
        ["dra.yaml: Pod ml/lost: ResourceClaim ml/nowhere does not exist"]
    );
    let pod = |n: &str| s.pods.iter().find(|p| p.id.name == n).unwrap();
    let train = &pod("train").claims[0];
    assert_eq!(train.claim, "ml/train-gpus-abcde");
    assert_eq!(train.template.as_deref(), Some("ml/h100"));
    assert!(train.needs_devices());
    let r = &train.spec.requests[0];
    assert_eq!(r.alternatives[0].count, DeviceCount::Exact(2));
    assert_eq!(r.alternatives[0].class, "gpu.nvidia.com");
    assert_eq!(r.alternatives[0].selectors.len(), 1);
    let shared = &pod("s1").claims[0];
    assert_eq!(shared.spec.requests[0].alternatives.len(), 2);
    assert_eq!(
        shared.spec.requests[0].alternatives[0].count,
        DeviceCount::All
    );
    assert_eq!(
        shared.allocation.as_ref().unwrap().node.as_deref(),
        Some("node-a")
    );
    assert!(!shared.needs_devices(), "allocated already");
    assert!(pod("lost")
        .problem
        .as_deref()
        .unwrap()
        .contains("ml/nowhere"));
    // Only the newest generation of the pool; attributes by domain.
    let devices = &s.dra.slices["node-a"];
    assert_eq!(devices.len(), 2);
    let gpu0 = &devices[0].1;
    assert_eq!(
        gpu0.attribute("cudaComputeCapability"),
        Some(&AttrValue::Version("9.0.0".into()))
    );
    assert_eq!(
        gpu0.attributes["resource.kubernetes.io"]["pcieRoot"],
        AttrValue::String("pci0000:00".into())
    );
    assert_eq!(
        s.dra.allocated["node-a"],
        [(
            "gpu.nvidia.com".to_string(),
            "node-a".to_string(),
            "gpu-0".to_string()
        )]
    );
    assert_eq!(s.nodes[0].dra_devices, 2);
    assert_eq!(s.nodes[0].advertised_gpus(), 2);
}

#[test]
fn malformed_dra_objects_say_which_field() {
    let mut c = Converter::new();
    let e = c
        .resource_claim(
            json!({"metadata": {"name": "c", "namespace": "ml"}, "spec": {"devices":
            {"requests": [{"name": "r", "exactly": {"deviceClassName": "x", "count": 0}}]}}}),
        )
        .unwrap_err();
    assert_eq!(
        e,
        "spec.devices.requests[0].exactly.count 0 is not a positive count"
    );
    let e = c
        .resource_claim(json!({"metadata": {"name": "c"}, "spec": {"devices":
            {"requests": [{"name": "r", "exactly": {"deviceClassName": "x",
              "allocationMode": "Some"}}]}}}))
        .unwrap_err();
    assert!(e.contains("allocationMode \"Some\""), "{e}");
    let e = c
        .resource_slice(json!({"metadata": {"name": "s"}, "spec": {"driver": "d", "nodeName": "n",
            "pool": {"name": "p"}, "devices": [{"name": "g", "capacity": {"memory": {"value": "lots"}}}]}}))
        .unwrap_err();
    assert!(
        e.starts_with("spec.devices[0] (g): capacity memory: malformed quantity"),
        "{e}"
    );
    // Devices reachable from several nodes are not read.
    assert!(c
        .resource_slice(
            json!({"metadata": {"name": "s"}, "spec": {"driver": "d", "allNodes": true,
            "pool": {"name": "p"}, "devices": []}})
        )
        .unwrap()
        .is_none());
}

#[test]
fn a_pods_nominated_node_is_read_and_an_empty_one_is_none() {
    let p = convert(pod_with(json!({"status": {"nominatedNodeName": "node-7"}})));
    assert_eq!(p.nominated_node.as_deref(), Some("node-7"));
    let p = convert(pod_with(json!({"status": {"nominatedNodeName": ""}})));
    assert_eq!(p.nominated_node, None);
    assert_eq!(convert(pod_with(json!({}))).nominated_node, None);
}

#[test]
fn host_ports_pod_affinity_and_spread_are_read_with_the_schedulers_defaults() {
    let p = convert_yaml(
        r#"
metadata: {name: llm-0, namespace: serve, labels: {app: llm, pod-template-hash: abc}}
spec:
  containers:
    - name: main
      ports:
        - {containerPort: 80}
        - {containerPort: 9400, hostPort: 9400}
        - {containerPort: 53, hostPort: 53, protocol: UDP, hostIP: 0.0.0.0}
        - {containerPort: 8080, hostPort: 8080, hostIP: 10.0.0.5}
  affinity:
    podAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
        - topologyKey: topology.kubernetes.io/zone
          labelSelector: {matchLabels: {app: cache}}
          namespaces: [data]
    podAntiAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
        - topologyKey: kubernetes.io/hostname
          labelSelector:
            matchExpressions: [{key: app, operator: In, values: [llm]}]
        - topologyKey: kubernetes.io/hostname
          labelSelector: {matchLabels: {app: noisy}}
          namespaceSelector: {}
      preferredDuringSchedulingIgnoredDuringExecution:
        - weight: 1
          podAffinityTerm: {topologyKey: kubernetes.io/hostname, labelSelector: {}}
  topologySpreadConstraints:
    - {maxSkew: 1, topologyKey: topology.kubernetes.io/zone, whenUnsatisfiable: DoNotSchedule,
       labelSelector: {matchLabels: {app: llm}}, matchLabelKeys: [pod-template-hash], minDomains: 3}
    - {maxSkew: 2, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: ScheduleAnyway,
       labelSelector: {matchLabels: {app: llm}}, nodeAffinityPolicy: Ignore, nodeTaintsPolicy: Honor}
status: {phase: Pending}
"#,
    );
    assert_eq!(p.problem, None);
    let t = p.constraints.topology.as_ref().expect("rules across nodes");
    let port = |port, protocol: &str, ip: &str| HostPort {
        port,
        protocol: protocol.into(),
        ip: ip.into(),
    };
    assert_eq!(
        t.host_ports,
        vec![
            port(9400, "TCP", ""),
            port(53, "UDP", ""),
            port(8080, "TCP", "10.0.0.5")
        ]
    );
    let app = |v: &str| Requirement {
        key: "app".into(),
        operator: Operator::In,
        values: vec![v.into()],
    };
    // Listed namespaces; the pod's own when none are; `namespaceSelector: {}` is every one.
    assert_eq!(t.affinity.len(), 1);
    assert_eq!(t.affinity[0].selector.labels, Some(vec![app("cache")]));
    assert_eq!(t.affinity[0].selector.namespaces, Some(vec!["data".into()]));
    assert_eq!(t.affinity[0].topology_key, labels::ZONE);
    assert_eq!(t.anti_affinity.len(), 2, "preferred terms are apart");
    // Preferred terms are preferences, anti-affinity with a negative weight; an empty selector
    // selects every pod.
    assert_eq!(t.preferences.pods.len(), 1);
    assert_eq!(t.preferences.pods[0].weight, -1);
    assert_eq!(
        t.preferences.pods[0].term.topology_key,
        crate::model::topology::HOSTNAME
    );
    assert_eq!(t.preferences.pods[0].term.selector.labels, Some(vec![]));
    assert_eq!(
        t.anti_affinity[0].selector.namespaces,
        Some(vec!["serve".into()])
    );
    assert_eq!(t.anti_affinity[1].selector.namespaces, None);
    // ScheduleAnyway is a preference. matchLabelKeys adds the pod's own value.
    assert_eq!(t.spread.len(), 1);
    assert_eq!(t.preferences.spread.len(), 1);
    assert_eq!(t.preferences.spread[0].max_skew, 2);
    assert_eq!(
        t.preferences.spread[0].topology_key,
        crate::model::topology::HOSTNAME
    );
    let s = &t.spread[0];
    assert_eq!((s.max_skew, s.min_domains), (1, 3));
    // The node inclusion policies: Honor and Ignore by default, or as set.
    assert_eq!((s.honor_node_affinity, s.honor_taints), (true, false));
    assert_eq!(
        (
            t.preferences.spread[0].honor_node_affinity,
            t.preferences.spread[0].honor_taints
        ),
        (false, true)
    );
    assert_eq!(
        s.selector.labels,
        Some(vec![
            app("llm"),
            Requirement {
                key: "pod-template-hash".into(),
                operator: Operator::In,
                values: vec!["abc".into()],
            }
        ])
    );
    assert_eq!(s.selector.namespaces, Some(vec!["serve".into()]));
    // A pod without any of these has no rules across nodes.
    assert_eq!(convert(pod_with(json!({}))).constraints.topology, None);
}

#[test]
fn malformed_spread_and_affinity_are_reported_on_the_pod() {
    let cases = [
        (
            json!({"topologySpreadConstraints": [{"maxSkew": 0, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}]}),
            "spec.topologySpreadConstraints[0].maxSkew",
        ),
        (
            json!({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "Sometimes"}]}),
            "whenUnsatisfiable",
        ),
        (
            json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"labelSelector": {}}]}}}),
            "topologyKey: required",
        ),
        (
            json!({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule", "nodeTaintsPolicy": "Always"}]}),
            "spec.topologySpreadConstraints[0].nodeTaintsPolicy: unknown \"Always\" (Honor or Ignore)",
        ),
        (
            json!({"affinity": {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 0, "podAffinityTerm": {"topologyKey": "zone"}}]}}}),
            "spec.affinity.podAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].weight: must be 1 to 100, got 0",
        ),
        (
            json!({"affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 5, "podAffinityTerm": {}}]}}}),
            "spec.affinity.podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].podAffinityTerm.topologyKey: required",
        ),
        (
            json!({"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference": {"matchExpressions": [{"key": "zone", "operator": "Near"}]}}]}}}),
            "spec.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].preference",
        ),
    ];
    for (spec, want) in cases {
        let p = convert(pod_with(json!({ "spec": spec })));
        assert!(problem(&p).contains(want), "{}", problem(&p));
    }
}
