//! The providers this controller knows: one line each in [`REGISTRY`], gated by its feature.
//! A line gives the provider's part of the policy (its name, its pool section and that
//! section's checks, from its own crate) and, for a provider the controller can run, how it is
//! built from the policy in force. `build_providers` and policy reloads go through this list
//! only.

use gpu_node_autoscaler_provider::policy::ProviderPolicy;

use crate::provider_build::Build;

/// One provider of the registry.
pub struct Provider {
    /// Its part of the policy.
    pub policy: &'static dyn ProviderPolicy,
    /// How it is built; `None` for one that pools may name but this controller does not run
    /// (`memory`, the simulator's).
    pub build: Option<Build>,
}

/// `Some(build)` when the feature `$feature` of this crate is on, else `None`: a provider whose
/// pools every build checks, and that only builds with its feature run.
macro_rules! built_with {
    ($feature:literal, $build:path) => {{
        #[cfg(feature = $feature)]
        let build: Option<Build> = Some($build);
        #[cfg(not(feature = $feature))]
        let build: Option<Build> = None;
        build
    }};
}

/// Every provider this controller knows, in the order policy errors list their names. Every
/// build checks every provider's pools; a provider without its feature is not run ("cannot be
/// run by this controller").
pub static REGISTRY: &[Provider] = &[
    Provider {
        policy: &gpu_node_autoscaler_aws::settings::POLICY,
        build: built_with!("aws", crate::aws::build),
    },
    Provider {
        policy: &gpu_node_autoscaler_alibaba::settings::POLICY,
        build: built_with!("alibaba", crate::alibaba::build),
    },
    Provider {
        policy: &gpu_node_autoscaler_kwok::POLICY,
        build: built_with!("kwok", crate::kwok::build),
    },
    Provider {
        policy: &gpu_node_autoscaler_memory::POLICY,
        build: None,
    },
];

/// The providers' parts of the policy, for `parse_policy_with`.
pub fn policies() -> Vec<&'static dyn ProviderPolicy> {
    REGISTRY.iter().map(|p| p.policy).collect()
}

/// The registry's line of the provider named `name`.
pub fn find(name: &str) -> Option<&'static Provider> {
    REGISTRY.iter().find(|p| p.policy.name() == name)
}

/// The names of the providers this controller runs, for messages: `aws, alibaba, kwok`.
pub fn runnable() -> String {
    REGISTRY
        .iter()
        .filter(|p| p.build.is_some())
        .map(|p| p.policy.name())
        .collect::<Vec<_>>()
        .join(", ")
}
