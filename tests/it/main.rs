//! All integration tests in one binary, a module per area.

#[cfg(feature = "alibaba")]
mod alibaba;
#[cfg(feature = "aws")]
mod aws;
mod cli;
mod deploy;
mod docs;
mod helm;
mod project;
/// `moto_server` (EC2): the AWS provider's test support, shared.
#[cfg(feature = "aws")]
use gpu_node_autoscaler_test_support::moto;
mod sim;

use std::path::PathBuf;
use std::process::{Command, Output};

pub fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_gpu-node-autoscaler"));
    c.current_dir(root());
    c
}

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn run(args: &[&str]) -> Output {
    bin().args(args).output().expect("run gpu-node-autoscaler")
}

/// `cargo ARGS` in the workspace, with the cargo that runs the tests: its output, or a failure
/// with its errors.
pub fn cargo(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO"))
        .current_dir(root())
        .args(args)
        .output()
        .expect("run cargo");
    assert!(out.status.success(), "cargo {args:?}: {}", stderr(&out));
    stdout(&out)
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Writes `text` to a fresh temporary file and returns its path.
pub fn temp_file(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "gna-it-{}-{}",
        std::process::id(),
        name.replace('/', "_")
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}
