//! What the tests and benchmarks of every crate share, in one place: [`moto`] (a `moto_server`
//! EC2 emulator per test, network set-up through the SDK, and a fault-injecting relay in front
//! of it), [`ess`] (a local fake of Alibaba Cloud's ESS, ECS, VPC and STS endpoints that checks
//! every signature), [`counting_alloc`] (a global allocator counting live heap bytes and their
//! peak, for memory figures), [`cluster`] (the real Kubernetes control plane with kwok),
//! [`dra_driver`] (NVIDIA's DRA driver's DeviceClasses and ResourceSlices for kwok Nodes), [`hpa`]
//! (the GPU HPA chain: a dcgm-exporter stand-in, the real prometheus-adapter, and the chain
//! started on a cluster), [`prometheus`] (a real Prometheus), [`provisioner`] (a CSI
//! external-provisioner's stand-in: volumes for `WaitForFirstConsumer` claims in their selected
//! node's zone). Test code only: no product crate
//! depends on it.

#[cfg(feature = "cluster")]
pub mod cluster;
pub mod counting_alloc;
#[cfg(feature = "cluster")]
pub mod dra_driver;
#[cfg(feature = "ess")]
pub mod ess;
#[cfg(feature = "cluster")]
pub mod hpa;
#[cfg(feature = "moto")]
pub mod moto;
#[cfg(feature = "cluster")]
pub mod prometheus;
#[cfg(feature = "cluster")]
pub mod provisioner;

/// Where a test tool built by one of the repository's scripts is: `$env_var` when set (as
/// scripts/test.sh sets it), else what `bash scripts/SCRIPT print_flag` prints (the script only
/// prints, it builds nothing).
pub fn tool_path(env_var: &str, script: &str, print_flag: &str) -> std::path::PathBuf {
    match std::env::var_os(env_var) {
        Some(p) => std::path::PathBuf::from(p),
        None => {
            let out = std::process::Command::new("bash")
                .arg(format!(
                    "{}/../../scripts/{script}",
                    env!("CARGO_MANIFEST_DIR")
                ))
                .arg(print_flag)
                .output()
                .unwrap_or_else(|e| panic!("bash scripts/{script} {print_flag}: {e}"));
            std::path::PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
        }
    }
}
