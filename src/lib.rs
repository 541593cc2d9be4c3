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

/// The providers' parts of the policy this build checks pools against: the controller's
/// registry (`controller::providers`), else the same providers without the controller: the AWS
/// and Alibaba Cloud sections checked by their crates' settings, kwok and the simulator's memory
/// provider by name.
pub fn provider_policies() -> Vec<&'static dyn policy::ProviderPolicy> {
    #[cfg(feature = "controller")]
    {
        gpu_node_autoscaler_controller::providers::policies()
    }
    #[cfg(not(feature = "controller"))]
    {
        let checked: [&'static dyn policy::ProviderPolicy; 2] = [
            &gpu_node_autoscaler_aws::settings::POLICY,
            &gpu_node_autoscaler_alibaba::settings::POLICY,
        ];
        let by_name = policy::NAMES_ONLY
            .iter()
            .copied()
            .filter(|p| p.section().is_none());
        checked.into_iter().chain(by_name).collect()
    }
}
