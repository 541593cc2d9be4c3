use serde_json::Value;

use crate::{root, run, stderr, stdout, temp_file};

const EXAMPLE: [&str; 7] = [
    "plan",
    "--cluster",
    "docs/examples/cluster.yaml",
    "--policy",
    "docs/examples/policy.yaml",
    "--now",
    "2026-11-21T10:00:00Z",
];

#[test]
fn plan_on_the_example_cluster_as_json() {
    let mut args = EXAMPLE.to_vec();
    args.extend(["--format", "json"]);
    let o = run(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_str(&stdout(&o)).expect("JSON output");
    let ups = v["scale_ups"].as_array().unwrap();
    // The MPI job's two 4-GPU workers on one 8×A100 node, as a gang.
    let gang = ups
        .iter()
        .find(|u| u["gang"] == "team-nlp/bert-large")
        .expect("gang scale-up");
    assert_eq!(gang["pool"], "a100-train");
    assert_eq!(gang["count"], 1);
    assert_eq!(gang["offerings"][0]["instance_type"], "p4d.24xlarge");
    // The shared-GPU pods share one T4, spot first.
    let shared = ups.iter().find(|u| u["pool"] == "t4-shared").unwrap();
    assert_eq!(shared["count"], 1);
    assert_eq!(shared["offerings"][0]["capacity_type"], "spot");
    assert_eq!(shared["pods"].as_array().unwrap().len(), 2);
    // Three chat replicas fit the half-empty A10G node: no scale-up for them.
    let placed = v["existing_capacity"].as_array().unwrap();
    assert_eq!(placed.len(), 3);
    assert!(placed
        .iter()
        .all(|p| p["target"] == "ip-10-0-1-17.ec2.internal"));
    let uns = v["unschedulable"].as_array().unwrap();
    assert_eq!(uns.len(), 1);
    assert_eq!(uns[0]["pod"], "research/too-big");
    // The A10G node unneeded since 09:40 goes at 10:00; the one unneeded since 09:55 stays.
    let downs = v["scale_downs"].as_array().unwrap();
    assert_eq!(downs.len(), 1);
    assert_eq!(downs[0]["node"], "ip-10-0-2-33.ec2.internal");
    assert_eq!(downs[0]["pool"], "a10g");
    assert!(downs[0]["evict"].as_array().unwrap().is_empty());
    assert_eq!(v["kept"][0]["node"], "ip-10-0-3-51.ec2.internal");
    assert!(v["kept"][0]["reason"]
        .as_str()
        .unwrap()
        .contains("removable after 2026-11-21T10:05:00Z"));
    assert_eq!(v["unneeded"].as_array().unwrap().len(), 2);
    let cost = v["added_cost_per_hour"].as_f64().unwrap();
    let sum: f64 = ups
        .iter()
        .map(|u| {
            u["count"].as_f64().unwrap() * u["offerings"][0]["price_per_hour"].as_f64().unwrap()
        })
        .sum();
    assert!((cost - sum).abs() < 1e-9);
}

#[test]
fn plan_is_deterministic_and_prints_a_table() {
    let a = run(&EXAMPLE);
    let b = run(&EXAMPLE);
    assert!(a.status.success(), "{}", stderr(&a));
    assert_eq!(stdout(&a), stdout(&b));
    let t = stdout(&a);
    assert!(t.contains("SCALE-UP POOL"), "{t}");
    assert!(t.contains("[gang team-nlp/bert-large]"), "{t}");
    assert!(t.contains("research/too-big"), "{t}");
    assert!(t.contains("Added cost: $"), "{t}");
}

#[test]
fn now_decides_what_the_scale_down_delay_allows() {
    let at = |now: &str| {
        let o = run(&[
            "plan",
            "--cluster",
            "docs/examples/cluster.yaml",
            "--policy",
            "docs/examples/policy.yaml",
            "--format",
            "json",
            "--now",
            now,
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
        v["scale_downs"].as_array().unwrap().len()
    };
    assert_eq!(at("2026-11-21T09:45:00Z"), 0);
    assert_eq!(at("2026-11-21T10:00:00Z"), 1);
    assert_eq!(at("2026-11-21T10:06:00Z"), 2);
}

#[test]
fn check_policy_summarises_each_pool() {
    let o = run(&["check-policy", "docs/examples/policy.yaml"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert_eq!(out.lines().count(), 4, "{out}");
    assert!(out.lines().all(|l| l.starts_with("pool ")));
}

#[test]
fn check_policy_warns_when_cluster_name_is_left_at_its_default() {
    let example = std::fs::read_to_string(root().join("docs/examples/policy.yaml")).unwrap();
    assert!(example.contains("\nclusterName: ml-prod\n"));
    let p = temp_file(
        "default-cluster-name.yaml",
        &example.replace("\nclusterName: ml-prod\n", "\n"),
    );
    let o = run(&["check-policy", p.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains(&format!(
            "warning: {}: clusterName is left at its default \"default\"",
            p.display()
        )),
        "{err}"
    );
    // The example names its cluster: no warning.
    let o = run(&["check-policy", "docs/examples/policy.yaml"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!stderr(&o).contains("clusterName"), "{}", stderr(&o));
}

#[test]
fn check_policy_warns_when_the_region_has_no_builtin_catalog_and_names_the_fallback() {
    let example = std::fs::read_to_string(root().join("docs/examples/policy.yaml")).unwrap();
    assert!(example.contains("\nregion: us-east-1\n"));
    let p = temp_file(
        "other-region.yaml",
        &example.replace("\nregion: us-east-1\n", "\nregion: eu-west-1\n"),
    );
    let o = run(&["check-policy", p.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains(
            "warning: no built-in catalog for region eu-west-1: the built-in aws us-east-1 list \
             prices are used instead (<built-in aws-gpu-us-east-1.csv>)"
        ),
        "{err}"
    );
    // us-east-1 has its own: no warning; nor with a catalog file of one's own.
    let o = run(&["check-policy", "docs/examples/policy.yaml"]);
    assert!(!stderr(&o).contains("built-in catalog"), "{}", stderr(&o));
    let o = run(&[
        "check-policy",
        p.to_str().unwrap(),
        "--catalog",
        "data/aws-gpu-us-east-1.csv",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!stderr(&o).contains("built-in catalog"), "{}", stderr(&o));
}

#[test]
fn check_policy_reports_every_error_with_its_position() {
    let p = temp_file(
        "bad-policy.yaml",
        "zones: [a]\npools:\n  - name: one\n    instanceTypes: [g5.xlarge]\n    maxNodes: 2\n    minNodes: 5\n  - name: two\n    instanceTypes: [g5.xlarge]\n    maxNodes: 2\n    capacityTypes: [spot, dedicated]\n    scaleDown: {unneededTime: 10d}\n",
    );
    let o = run(&["check-policy", p.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    let file = p.display().to_string();
    assert!(
        err.contains(&format!(
            "{file}:6:5: pools[0].minNodes: minNodes (5) is greater than maxNodes (2)"
        )),
        "{err}"
    );
    assert!(
        err.contains(&format!("{file}:10:")) && err.contains("unknown capacity type \"dedicated\""),
        "{err}"
    );
    assert!(err.contains("invalid duration \"10d\""), "{err}");
    assert!(stdout(&o).is_empty());
}

#[test]
fn check_policy_checks_instance_types_against_the_catalog() {
    let p = temp_file(
        "unknown-type.yaml",
        "zones: [a]\npools:\n  - name: one\n    instanceTypes: [g5.xlarge, g42.huge]\n    maxNodes: 2\n",
    );
    let o = run(&["check-policy", p.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("pool one: instance type \"g42.huge\" is not in the catalog"));
}

#[test]
fn a_cluster_file_that_is_not_a_list_is_a_clear_error() {
    let p = temp_file(
        "pod.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\n",
    );
    let o = run(&[
        "plan",
        "--cluster",
        p.to_str().unwrap(),
        "--policy",
        "docs/examples/policy.yaml",
    ]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(err.contains("expected a Kubernetes List"), "{err}");
    assert!(err.contains("kind \"Pod\""), "{err}");
    assert!(!err.contains("panicked"));
}

#[test]
fn bad_objects_are_warnings_and_the_rest_still_plans() {
    let p = temp_file(
        "list.yaml",
        r#"apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Pod
  metadata: {name: bad, namespace: ml}
  spec:
    containers:
    - name: c
      resources: {limits: {nvidia.com/gpu: "one"}}
- apiVersion: v1
  kind: Pod
  metadata: {name: good, namespace: ml}
  spec:
    tolerations: [{operator: Exists}]
    containers:
    - name: c
      resources: {limits: {nvidia.com/gpu: 1}}
"#,
    );
    let o = run(&[
        "plan",
        "--cluster",
        p.to_str().unwrap(),
        "--policy",
        "docs/examples/policy.yaml",
        "--format",
        "json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("items[0] Pod ml/bad: spec.containers[0].resources.limits.nvidia.com/gpu"),
        "{err}"
    );
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["scale_ups"][0]["pods"][0], "ml/good");
    assert_eq!(v["unschedulable"][0]["pod"], "ml/bad");
}

#[test]
fn malformed_inputs_never_panic() {
    let catalog = temp_file("bad.csv", "instance_type,gpu_model\ng5.xlarge,A10G\n");
    let cases: Vec<Vec<String>> = vec![
        vec![
            "plan".into(),
            "--cluster".into(),
            "docs/examples/cluster.yaml".into(),
            "--policy".into(),
            "docs/examples/policy.yaml".into(),
            "--now".into(),
            "yesterday".into(),
        ],
        vec![
            "plan".into(),
            "--cluster".into(),
            "docs/examples/cluster.yaml".into(),
            "--policy".into(),
            "docs/examples/policy.yaml".into(),
            "--catalog".into(),
            catalog.display().to_string(),
        ],
        vec![
            "plan".into(),
            "--cluster".into(),
            "missing.yaml".into(),
            "--policy".into(),
            "docs/examples/policy.yaml".into(),
        ],
        vec!["check-policy".into(), "docs/examples/cluster.yaml".into()],
    ];
    for args in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = run(&args);
        assert_eq!(o.status.code(), Some(1), "{args:?}");
        let err = stderr(&o);
        assert!(err.starts_with("error: "), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

#[test]
fn plan_reads_resource_claims_from_a_cluster_file_and_plans_their_devices() {
    // A claim template and a pending pod claiming from it, both called `name`.
    let claimed = |name: &str, selector: &str| {
        format!(
            "- apiVersion: resource.k8s.io/v1
  kind: ResourceClaimTemplate
  metadata: {{name: {name}, namespace: ml}}
  spec:
    spec:
      devices:
        requests:
        - name: gpu
          exactly:
            deviceClassName: gpu.nvidia.com
            selectors:
            - cel: {{expression: \"{selector}\"}}
- apiVersion: v1
  kind: Pod
  metadata: {{name: {name}, namespace: ml}}
  spec:
    containers: [{{name: c, resources: {{requests: {{cpu: \"4\"}}, claims: [{{name: gpu}}]}}}}]
    resourceClaims: [{{name: gpu, resourceClaimTemplateName: {name}}}]
  status:
    phase: Pending
    conditions: [{{type: PodScheduled, status: \"False\", reason: Unschedulable}}]
"
        )
    };
    let cluster = temp_file(
        "dra-cluster.yaml",
        &format!(
            "apiVersion: v1
kind: List
items:
- apiVersion: resource.k8s.io/v1
  kind: DeviceClass
  metadata: {{name: gpu.nvidia.com}}
  spec:
    selectors:
    - cel: {{expression: \"device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'\"}}
{}{}",
            claimed(
                "train",
                "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('80G')) >= 0"
            ),
            claimed(
                "blackwell",
                "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA B200'"
            ),
        ),
    );
    let policy = temp_file(
        "dra-policy.yaml",
        "zones: [us-east-1a]\npools:\n  - name: a10g\n    instanceTypes: [g5.xlarge]\n    \
         maxNodes: 4\n    dra: {}\n  - name: h100\n    instanceTypes: [p5.48xlarge]\n    \
         maxNodes: 2\n    dra: {}\n",
    );
    let o = run(&[
        "plan",
        "--cluster",
        cluster.to_str().unwrap(),
        "--policy",
        policy.to_str().unwrap(),
        "--format",
        "json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    let ups = v["scale_ups"].as_array().unwrap();
    assert_eq!(ups.len(), 1, "{v}");
    assert_eq!(ups[0]["pool"], "h100", "{v}");
    assert_eq!(
        ups[0]["offerings"][0]["instance_type"], "p5.48xlarge",
        "{v}"
    );
    assert_eq!(ups[0]["pods"], serde_json::json!(["ml/train"]), "{v}");
    let u = &v["unschedulable"][0];
    assert_eq!(u["pod"], "ml/blackwell", "{v}");
    let reason = u["reason"].as_str().unwrap();
    assert!(
        reason.contains("request gpu") && reason.contains("no pool's devices"),
        "{reason}"
    );
}

#[test]
fn check_policy_refuses_a_mig_layout_an_h100_does_not_offer_at_its_position() {
    let p = temp_file(
        "h100-mig.yaml",
        "clusterName: ml-prod
region: us-east-1
zones: [us-east-1a]
pools:
  - name: h100-mig
    instanceTypes: [p5.48xlarge]
    maxNodes: 2
    gpuMode: mig
    migLayout: {1g.5gb: 7}
",
    );
    let o = run(&["check-policy", p.to_str().unwrap()]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(
        err.contains(&format!(
            "{}:9:17: pools[0].migLayout[\"1g.5gb\"]: no MIG profile 1g.5gb on the NVIDIA H100 \
             80GB HBM3 GPUs of p5.48xlarge (they offer 1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, \
             3g.40gb, 4g.40gb, 7g.80gb)",
            p.display()
        )),
        "{err}"
    );
    // The H100's own profiles pass.
    let ok = temp_file(
        "h100-mig-ok.yaml",
        &std::fs::read_to_string(&p)
            .unwrap()
            .replace("{1g.5gb: 7}", "{1g.10gb: 7}"),
    );
    let o = run(&["check-policy", ok.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn plan_fills_the_capacity_reservations_a_pool_selects_first_at_no_cost() {
    let policy = temp_file(
        "reserved-policy.yaml",
        "zones: [us-east-1a, us-east-1b]\n\
         pools:\n\
         \x20 - name: h100\n\
         \x20   instanceTypes: [p5.48xlarge]\n\
         \x20   capacityTypes: [reserved, on-demand]\n\
         \x20   capacityReservations: [{id: cr-0odcr}, {tags: {kind: capacity-block}}]\n\
         \x20   maxNodes: 12\n\
         \x20   aws: {launchTemplate: {name: gpu}, subnets: {us-east-1a: subnet-0a, us-east-1b: subnet-0b}}\n",
    );
    let mut pods = String::from("apiVersion: v1\nkind: List\nitems:\n");
    for i in 0..7 {
        pods.push_str(&format!(
            "- apiVersion: v1\n  kind: Pod\n  metadata: {{name: train-{i}, namespace: ml, uid: u{i}}}\n  \
             spec:\n    containers:\n    - name: c\n      resources:\n        requests: \
             {{cpu: \"100\", memory: 1000Gi, nvidia.com/gpu: \"8\"}}\n  status:\n    phase: Pending\n    \
             conditions: [{{type: PodScheduled, status: \"False\", reason: Unschedulable}}]\n"
        ));
    }
    let cluster = temp_file("reserved-cluster.yaml", &pods);
    // An ODCR of 2 in us-east-1a; a Capacity Block of 4 in us-east-1b running at --now.
    let reservations = temp_file(
        "reservations.yaml",
        "- {id: cr-0odcr, kind: default, instanceType: p5.48xlarge, zone: us-east-1a, total: 2, available: 2}\n\
         - {id: cr-0block, kind: capacity-block, instanceType: p5.48xlarge, zone: us-east-1b, total: 4,\n\
         \x20  available: 4, startMs: 1795000000000, endMs: 1796000000000, tags: {kind: capacity-block}}\n",
    );
    let o = run(&[
        "plan",
        "--cluster",
        cluster.to_str().unwrap(),
        "--policy",
        policy.to_str().unwrap(),
        "--reservations",
        reservations.to_str().unwrap(),
        "--now",
        "2026-11-21T10:00:00Z",
        "--format",
        "json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_str(&stdout(&o)).expect("JSON output");
    let mut got: Vec<(String, String, u64, f64)> = v["scale_ups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| {
            let o = &u["offerings"][0];
            (
                o["capacity_type"].as_str().unwrap().to_string(),
                o["zone"].as_str().unwrap().to_string(),
                u["count"].as_u64().unwrap(),
                o["price_per_hour"].as_f64().unwrap(),
            )
        })
        .collect();
    got.sort_by(|a, b| a.partial_cmp(b).unwrap());
    assert_eq!(got.len(), 3, "{got:?}");
    assert_eq!(got[0].0, "on-demand");
    assert_eq!(got[0].2, 1, "{got:?}");
    assert_eq!(
        got[1..],
        [
            ("reserved".to_string(), "us-east-1a".to_string(), 2, 0.0),
            ("reserved".to_string(), "us-east-1b".to_string(), 4, 0.0)
        ]
    );
    assert!((v["added_cost_per_hour"].as_f64().unwrap() - 55.04).abs() < 1e-9);
}

/// `plan` shows a node adopted into a pool by its `nodeSelector` as the controller sees it:
/// unneeded since its annotation, and then kept as not ours (`ScaleDownNotOwned`), or, in a pool
/// backed by its Auto Scaling group, scaled down.
#[test]
fn plan_shows_an_adopted_nodegroup_node_as_unneeded_and_kept_as_not_ours_or_scaled_down_with_its_asg(
) {
    let cluster = temp_file(
        "adopted-cluster.yaml",
        "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Node\n  metadata:\n    \
         name: ip-10-0-9-9.ec2.internal\n    creationTimestamp: \"2026-11-21T08:00:00Z\"\n    \
         annotations: {gpu-node-autoscaler.io/unneeded-since: \"2026-11-21T09:30:00Z\"}\n    \
         labels:\n      node.kubernetes.io/instance-type: g5.xlarge\n      \
         topology.kubernetes.io/zone: us-east-1a\n      eks.amazonaws.com/nodegroup: gpu-ng\n  \
         spec:\n    providerID: aws:///us-east-1a/i-0a1b2c3d4e5f69999\n  status:\n    \
         allocatable: {cpu: 3800m, memory: 15Gi, pods: \"58\", nvidia.com/gpu: \"1\"}\n    \
         conditions:\n    - {type: Ready, status: \"True\"}\n",
    );
    let plan_with = |name: &str, aws: &str| {
        let policy = temp_file(
            name,
            &format!(
                "clusterName: prod\nregion: us-east-1\nzones: [us-east-1a]\npools:\n  - name: ng\n    \
                 provider: aws\n    instanceTypes: [g5.xlarge]\n    maxNodes: 4\n    \
                 nodeSelector: {{eks.amazonaws.com/nodegroup: gpu-ng}}\n{aws}"
            ),
        );
        let o = run(&[
            "plan",
            "--cluster",
            cluster.to_str().unwrap(),
            "--policy",
            policy.to_str().unwrap(),
            "--format",
            "json",
            "--now",
            "2026-11-21T10:00:00Z",
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        serde_json::from_str::<Value>(&stdout(&o)).unwrap()
    };
    let node = "ip-10-0-9-9.ec2.internal";
    let adopted = plan_with("adopted-policy.yaml", "");
    assert_eq!(adopted["unneeded"][0]["node"], node, "{adopted:#}");
    assert_eq!(adopted["unneeded"][0]["since"], "2026-11-21T09:30:00Z");
    assert!(
        adopted["scale_downs"].as_array().unwrap().is_empty(),
        "{adopted:#}"
    );
    assert_eq!(adopted["kept"][0]["node"], node, "{adopted:#}");
    let why = adopted["kept"][0]["reason"].as_str().unwrap();
    assert!(why.contains("not ours (ScaleDownNotOwned)"), "{why}");
    assert!(why.contains("scale its node group down"), "{why}");

    let with_asg = plan_with(
        "adopted-asg-policy.yaml",
        "    aws: {autoScalingGroups: {names: [gpu-ng]}}\n",
    );
    assert_eq!(with_asg["unneeded"][0]["node"], node, "{with_asg:#}");
    assert!(
        with_asg["kept"].as_array().unwrap().is_empty(),
        "{with_asg:#}"
    );
    assert_eq!(with_asg["scale_downs"][0]["node"], node, "{with_asg:#}");
    assert_eq!(with_asg["scale_downs"][0]["pool"], "ng");
}
