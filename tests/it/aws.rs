//! `check-policy --provider aws` against `moto_server`, a real EC2 API emulator (installed,
//! pinned, by scripts/test.sh).

use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{bin, stderr, temp_file};

struct Moto(Child, String);

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `python3 -m moto.server` on a free loopback port; the test fails without moto.
fn moto() -> Moto {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new("python3")
        .args([
            "-m",
            "moto.server",
            "-H",
            "127.0.0.1",
            "-p",
            &port.to_string(),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("python3 -m moto.server (scripts/test.sh installs moto[server])");
    let m = Moto(child, format!("http://127.0.0.1:{port}"));
    let deadline = Instant::now() + Duration::from_secs(60);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "moto_server did not start");
        std::thread::sleep(Duration::from_millis(100));
    }
    m
}

#[test]
fn check_policy_with_provider_aws_names_what_the_account_lacks() {
    let m = moto();
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
        .args(["--aws-endpoint-url", &m.1])
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
