//! The providers gpu-node-autoscaler knows: one line each in [`PROVIDERS`], each its crate's
//! [`Provider`] (its part of the policy, and what its build can do). Every build checks every
//! provider's pools; a provider runs (`build`), checks an account (`check`) or reads
//! interruption notices (`interruptions`) only with its feature, which turns on its crate's
//! client. The controller, `check-policy` and builds without the controller all read this list.

use gpu_node_autoscaler_provider::policy::ProviderPolicy;
use gpu_node_autoscaler_provider::spec::Provider;

/// Every provider, in the order policy errors list their names.
pub static PROVIDERS: &[&Provider] = &[
    &gpu_node_autoscaler_aws::PROVIDER,
    &gpu_node_autoscaler_alibaba::PROVIDER,
    &gpu_node_autoscaler_kwok::PROVIDER,
    &gpu_node_autoscaler_memory::PROVIDER,
];

/// The providers' parts of the policy, for `parse_policy_with`.
pub fn policies() -> Vec<&'static dyn ProviderPolicy> {
    PROVIDERS.iter().map(|p| p.policy).collect()
}

/// The provider named `name`.
pub fn find(name: &str) -> Option<&'static Provider> {
    PROVIDERS.iter().copied().find(|p| p.policy.name() == name)
}

/// The names of the providers this build runs, for messages: `aws, alibaba, kwok`.
pub fn runnable() -> String {
    PROVIDERS
        .iter()
        .filter(|p| p.build.is_some())
        .map(|p| p.policy.name())
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_provider_is_listed_once_by_its_name() {
        let mut names: Vec<&str> = PROVIDERS.iter().map(|p| p.policy.name()).collect();
        assert_eq!(names, ["aws", "alibaba", "kwok", "memory"]);
        names.sort();
        names.dedup();
        assert_eq!(names.len(), PROVIDERS.len());
        // The simulator builds its memory provider itself: pools may name it, nothing runs it.
        assert!(find("memory").unwrap().build.is_none());
    }
}
