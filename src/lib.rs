//! gpu-node-autoscaler: a Kubernetes node autoscaler for GPU node pools.
//!
//! The crates by weight: `gpu-node-autoscaler-core` (the model, the policy, the planner and the
//! decision core: no I/O), `gpu-node-autoscaler-sim` (the simulator, behind the `simulator`
//! feature), `gpu-node-autoscaler-controller` (the controller and the cloud providers' glue,
//! behind `controller`). This crate is the binary and re-exports them under one name.

pub use gpu_node_autoscaler_core::{
    autoscaler, catalog, convert, model, plan, policy, provider, yaml,
};

#[cfg(feature = "controller")]
pub use gpu_node_autoscaler_controller as controller;
#[cfg(feature = "simulator")]
pub use gpu_node_autoscaler_sim as sim;

/// The providers' parts of the policy this build checks pools against: the registry's, the
/// same with or without the controller.
pub fn provider_policies() -> Vec<&'static dyn policy::ProviderPolicy> {
    gpu_node_autoscaler_registry::policies()
}
