//! `check-policy --provider aws` against `moto_server`, a real EC2 API emulator (installed,
//! pinned, by scripts/test.sh).

use crate::moto::Moto;
use crate::{bin, stderr, temp_file};

#[test]
fn check_policy_with_provider_aws_names_what_the_account_lacks() {
    let m = Moto::start();
    let policy = temp_file(
        "aws-policy.yaml",
        "region: us-east-1\nzones: [us-east-1a]\npools:\n  - name: a10g\n    instanceTypes: [g5.xlarge]\n    maxNodes: 4\n    aws:\n      launchTemplate: {name: gpu-nodes}\n      subnets: {us-east-1a: subnet-0123456789abcdef0}\n",
    );
    let o = bin()
        .args([
            "check-policy",
            policy.to_str().unwrap(),
            "--provider",
            "aws",
        ])
        .args(["--aws-endpoint-url", &m.url()])
        .env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env_remove("AWS_PROFILE")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    let file = policy.display().to_string();
    assert!(
        err.contains(&format!(
            "{file}: pool a10g: aws.subnets.us-east-1a: subnet subnet-0123456789abcdef0 not found"
        )),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "{file}: pool a10g: aws.launchTemplate: launch template gpu-nodes not found"
        )),
        "{err}"
    );
    assert!(err.contains("2 problem(s) with the AWS account"), "{err}");
}

#[test]
fn check_policy_with_provider_aws_needs_a_region() {
    let policy = temp_file(
        "aws-noregion.yaml",
        "zones: [us-east-1a]\npools:\n  - {name: a10g, instanceTypes: [g5.xlarge], maxNodes: 4}\n",
    );
    let o = bin()
        .args([
            "check-policy",
            policy.to_str().unwrap(),
            "--provider",
            "aws",
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("--provider aws needs a region"),
        "{}",
        stderr(&o)
    );
}

/// `check-policy --provider aws` on a pool backed by Auto Scaling groups discovered by the
/// Cluster Autoscaler's tags: each group found is printed with its template, and what the pool
/// needs that its groups lack is a problem.
#[test]
fn check_policy_with_provider_aws_lists_each_asg_and_what_the_pool_lacks() {
    use crate::moto::{autoscaling, create_group, ec2, network, GroupSpec};
    let m = Moto::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let net = network(&ec2(&m.url()).await).await;
        let asg = autoscaling(&m.url()).await;
        create_group(
            &asg,
            &net,
            &GroupSpec {
                name: "gpu-spot-a",
                zones: &["us-east-1a"],
                types: &["g5.xlarge"],
                spot: true,
                launch_template: "gpu-nodes",
                min: 0,
                max: 8,
                desired: 0,
                tags: &[
                    ("k8s.io/cluster-autoscaler/enabled", "true"),
                    ("k8s.io/cluster-autoscaler/prod-gpu", "owned"),
                    (
                        "k8s.io/cluster-autoscaler/node-template/taint/nvidia.com/gpu",
                        "present:NoSchedule",
                    ),
                ],
            },
        )
        .await;
    });
    let policy = temp_file(
        "aws-asg-policy.yaml",
        "clusterName: prod-gpu\nregion: us-east-1\nzones: [us-east-1a, us-east-1b]\npools:\n  - name: a10g\n    provider: aws\n    instanceTypes: [g5.xlarge]\n    capacityTypes: [spot]\n    maxNodes: 8\n    aws:\n      autoScalingGroups: {autoDiscovery: {}}\n",
    );
    let o = bin()
        .args([
            "check-policy",
            policy.to_str().unwrap(),
            "--provider",
            "aws",
        ])
        .args(["--aws-endpoint-url", &m.url()])
        .env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env_remove("AWS_PROFILE")
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{out}\n{err}");
    assert!(
        out.contains(
            "pool a10g: group gpu-spot-a: MixedInstancesPolicy [g5.xlarge] in us-east-1a (spot), \
             size 0..8 (desired 0), taints nvidia.com/gpu=present:NoSchedule"
        ),
        "{out}"
    );
    let file = policy.display().to_string();
    assert!(
        err.contains(&format!(
            "{file}: pool a10g: aws.autoScalingGroups: zone us-east-1b has none of its groups"
        )),
        "{err}"
    );
    assert!(err.contains("1 problem(s) with the AWS account"), "{err}");
}

#[test]
fn check_policy_with_provider_aws_lists_each_selected_capacity_reservation() {
    use crate::moto::proxy::{FakeReservation, FaultProxy};
    let m = Moto::start();
    // moto has no capacity reservation call: the fault relay in front of it answers
    // DescribeCapacityReservations (docs/testing.md).
    let rt = tokio::runtime::Runtime::new().unwrap();
    let net = rt.block_on(async { crate::moto::network(&crate::moto::ec2(&m.url()).await).await });
    let proxy = rt.block_on(FaultProxy::start(m.addr));
    let fake = |id: &str, kind: &str, t: &str, zone: &str, state: &str| FakeReservation {
        id: id.into(),
        reservation_type: kind.into(),
        instance_type: t.into(),
        zone: zone.into(),
        total: 4,
        available: 1,
        state: state.into(),
        ..Default::default()
    };
    let mut block = fake(
        "cr-0block1",
        "capacity-block",
        "g5.xlarge",
        "us-east-1b",
        "scheduled",
    );
    block.start = Some("2026-12-01T11:30:00.000Z".into());
    block.end = Some("2026-12-03T11:30:00.000Z".into());
    block.tags = vec![("team".into(), "ml".into())];
    proxy.set_capacity_reservations(vec![
        fake("cr-0odcr1", "default", "g5.xlarge", "us-east-1a", "active"),
        block,
        fake(
            "cr-0expired1",
            "default",
            "g5.xlarge",
            "us-east-1a",
            "expired",
        ),
    ]);
    let policy = temp_file(
        "aws-reserved-policy.yaml",
        &format!(
            "region: us-east-1\nzones: [us-east-1a, us-east-1b]\npools:\n  - name: a10g\n    \
             instanceTypes: [g5.xlarge]\n    maxNodes: 4\n    capacityTypes: [reserved, on-demand]\n    \
             capacityReservations: [{{id: cr-0odcr1}}, {{tags: {{team: ml}}}}, {{id: cr-0expired1}}]\n    \
             aws:\n      launchTemplate: {{name: {}}}\n      subnets: {{us-east-1a: {}, us-east-1b: {}}}\n",
            net.launch_template, net.subnets["us-east-1a"], net.subnets["us-east-1b"]
        ),
    );
    let o = bin()
        .args([
            "check-policy",
            policy.to_str().unwrap(),
            "--provider",
            "aws",
        ])
        .args(["--aws-endpoint-url", &proxy.url()])
        .env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env_remove("AWS_PROFILE")
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    let err = stderr(&o);
    assert!(
        out.contains(
            "pool a10g: reservation cr-0odcr1 (default): g5.xlarge in us-east-1a, 1/4 available, \
             from now until no end"
        ),
        "{out}\n{err}"
    );
    assert!(
        out.contains(
            "pool a10g: reservation cr-0block1 (capacity-block): g5.xlarge in us-east-1b, 1/4 \
             available, from 2026-12-01T11:30:00Z until 2026-12-03T11:30:00Z"
        ),
        "{out}\n{err}"
    );
    // An expired reservation is not the account's to launch into: its selector matches none.
    let file = policy.display().to_string();
    assert!(
        err.contains(&format!(
            "{file}: pool a10g: capacityReservations[2]: no capacity reservation cr-0expired1 in \
             the account"
        )),
        "{out}\n{err}"
    );
    assert!(err.contains("1 problem(s) with the AWS account"), "{err}");
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(proxy.calls_of("DescribeCapacityReservations"), 1);
}

/// A pool that names its Auto Scaling groups only (no instance types, zones or labels in the
/// policy): the groups' templates, read from the account as the controller reads them when it
/// applies a policy, are what the planner plans from. A pod selecting a `node-template` label of
/// one group is planned onto that group's instance type and zone, and the launch grows that
/// group from zero, not the cheaper other one.
#[test]
fn asg_a_pool_of_named_groups_alone_is_planned_from_their_tag_templates_and_scaled_from_zero() {
    use crate::moto::{
        autoscaling, create_group, ec2, group_state, network, typed_launch_template, GroupSpec,
    };
    use gpu_node_autoscaler::convert::load_cluster_file;
    use gpu_node_autoscaler::model::Time;
    use gpu_node_autoscaler::plan::templates::provider_spec;
    use gpu_node_autoscaler::provider::LaunchRequest;
    let m = Moto::start();
    crate::moto::set_test_credentials();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let client = ec2(&m.url()).await;
        let net = network(&client).await;
        typed_launch_template(&client, "lt-g5", "g5.xlarge").await;
        typed_launch_template(&client, "lt-g6", "g6.xlarge").await;
        let asg = autoscaling(&m.url()).await;
        let label = "k8s.io/cluster-autoscaler/node-template/label/gpu-type";
        let taint = "k8s.io/cluster-autoscaler/node-template/taint/nvidia.com/gpu";
        for (name, lt, zone, gpu) in [
            ("gpu-a10g-b", "lt-g5", "us-east-1b", "a10g"),
            ("gpu-l4-a", "lt-g6", "us-east-1a", "l4"),
        ] {
            create_group(
                &asg,
                &net,
                &GroupSpec {
                    name,
                    zones: &[zone],
                    types: &[],
                    spot: false,
                    launch_template: lt,
                    min: 0,
                    max: 4,
                    desired: 0,
                    tags: &[(label, gpu), (taint, "present:NoSchedule")],
                },
            )
            .await;
        }

        let text = "clusterName: test-cluster\nregion: us-east-1\npools:\n  - name: gpu\n    \
                    provider: aws\n    maxNodes: 4\n    aws:\n      autoScalingGroups: \
                    {names: [gpu-l4-a, gpu-a10g-b]}\n";
        let providers = gpu_node_autoscaler::provider_policies();
        let policy = gpu_node_autoscaler::policy::parse_policy_with(text, "p.yaml", &providers)
            .unwrap_or_else(|e| panic!("{e}"));
        let (types, _) = gpu_node_autoscaler::catalog::load(None, Some("us-east-1")).unwrap();
        let file_catalog = gpu_node_autoscaler::catalog::offerings_from_list_prices(&policy, types);
        let mut spec = provider_spec(&policy, &file_catalog, "aws");
        spec.endpoint_url = Some(m.url());
        spec.cluster_id = Some("uid-test".into());
        let build = gpu_node_autoscaler_registry::find("aws")
            .and_then(|p| p.build)
            .expect("built with aws");
        let provider = build(&spec).await.unwrap_or_else(|e| panic!("{e}"));

        // What the controller does when it applies the policy.
        let found = provider.templates().await.unwrap();
        assert_eq!(
            found["gpu"]
                .iter()
                .map(|g| g.group.as_str())
                .collect::<Vec<_>>(),
            ["gpu-l4-a", "gpu-a10g-b"]
        );
        let policy = policy.with_cloud_templates(&found);
        let catalog = provider.catalog().await.unwrap();

        let cluster = "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Pod\n  \
                       metadata: {name: trainer, namespace: ml}\n  spec:\n    nodeSelector: \
                       {gpu-type: a10g}\n    tolerations:\n    - {key: nvidia.com/gpu, operator: \
                       Exists, effect: NoSchedule}\n    containers:\n    - name: main\n      \
                       resources:\n        requests: {cpu: '2', memory: 8Gi}\n        limits: \
                       {nvidia.com/gpu: 1}\n  status:\n    phase: Pending\n    conditions:\n    \
                       - {type: PodScheduled, status: 'False', reason: Unschedulable}\n";
        let loaded = load_cluster_file(cluster, "cluster.yaml").unwrap();
        let now = Time(chrono::Utc::now().timestamp_millis());
        let plan = gpu_node_autoscaler::plan::plan(&loaded.snapshot, &catalog, &policy, now);
        assert!(plan.warnings.is_empty(), "{:?}", plan.warnings);
        assert!(plan.unschedulable.is_empty(), "{:?}", plan.unschedulable);
        assert_eq!(plan.scale_ups.len(), 1, "{plan:#?}");
        let su = &plan.scale_ups[0];
        assert_eq!((su.pool.as_str(), su.count), ("gpu", 1));
        let first = &su.offerings[0];
        assert_eq!(
            (first.instance_type.as_str(), first.zone.as_str()),
            ("g5.xlarge", "us-east-1b"),
            "the group whose template label the pod selects"
        );
        assert!(
            su.offerings.iter().all(|o| o.instance_type == "g5.xlarge"),
            "{:?}",
            su.offerings
        );

        let request = LaunchRequest {
            launch_id: "asg-tag-only".into(),
            pool: su.pool.clone(),
            count: su.count,
            offerings: su.offerings.iter().map(|o| o.key()).collect(),
            tags: Default::default(),
            reservations: Vec::new(),
            atomic: false,
        };
        let r = provider.launch(&request).await.unwrap();
        assert!(r.failures.is_empty(), "{:?}", r.failures);
        assert_eq!(r.launched.len(), 1);
        assert_eq!(r.launched[0].offering.zone, "us-east-1b");
        assert_eq!(group_state(&asg, "gpu-a10g-b").await.0, 1);
        assert_eq!(
            group_state(&asg, "gpu-l4-a").await.0,
            0,
            "the other group untouched"
        );
    });
}
