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
