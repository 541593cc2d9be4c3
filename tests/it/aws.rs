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
