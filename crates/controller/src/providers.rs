//! The providers this controller knows: one line each in [`REGISTRY`], gated by its feature.
//! A line gives, from the provider's own crate, its part of the policy (its name, its pool
//! section and that section's checks) and, for a provider the controller can run, how it is
//! built from its spec (the core's [`provider_spec`] of the policy in force) and how its pools
//! are checked against the account (`check-policy --provider`). Provider builds, policy reloads
//! and account checks go through this list only.

use std::sync::Arc;

use gpu_node_autoscaler_core::plan::templates::provider_spec;
use gpu_node_autoscaler_core::policy::Policy;
use gpu_node_autoscaler_provider::interruptions::Open;
use gpu_node_autoscaler_provider::policy::ProviderPolicy;
use gpu_node_autoscaler_provider::spec::{
    AccountProblems, Build, Check, CheckFailed, ProviderSpec,
};
use gpu_node_autoscaler_provider::{Catalog, CloudProvider};
use kube::Client;

/// One provider of the registry.
pub struct Provider {
    /// Its part of the policy.
    pub policy: &'static dyn ProviderPolicy,
    /// How it is built; `None` for one that pools may name but this controller does not run
    /// (`memory`, the simulator's, or one built without its feature).
    pub build: Option<Build>,
    /// How its pools are checked against the cloud account, for a cloud that has one.
    pub check: Option<Check>,
    /// How its interruption notices are read (the policy's `interruptionQueue`), for a cloud
    /// that delivers them.
    pub interruptions: Option<Open>,
}

/// `Some($item)` when the feature `$feature` of this crate is on, else `None`: a provider whose
/// pools every build checks, and that only builds with its feature run.
macro_rules! with {
    ($feature:literal, $item:path) => {{
        #[cfg(feature = $feature)]
        let item = Some($item as _);
        #[cfg(not(feature = $feature))]
        let item = None;
        item
    }};
}

/// Every provider this controller knows, in the order policy errors list their names. Every
/// build checks every provider's pools; a provider without its feature is not run ("cannot be
/// run by this controller").
pub static REGISTRY: &[Provider] = &[
    Provider {
        policy: &gpu_node_autoscaler_aws::settings::POLICY,
        build: with!("aws", gpu_node_autoscaler_aws::build::build),
        check: with!("aws", gpu_node_autoscaler_aws::build::check),
        interruptions: with!("aws", gpu_node_autoscaler_aws::interruptions::open),
    },
    Provider {
        policy: &gpu_node_autoscaler_alibaba::settings::POLICY,
        build: with!("alibaba", gpu_node_autoscaler_alibaba::build::build),
        check: with!("alibaba", gpu_node_autoscaler_alibaba::build::check),
        interruptions: None,
    },
    Provider {
        policy: &gpu_node_autoscaler_kwok::POLICY,
        build: with!("kwok", gpu_node_autoscaler_kwok::build::build),
        check: None,
        interruptions: None,
    },
    Provider {
        policy: &gpu_node_autoscaler_memory::POLICY,
        build: None,
        check: None,
        interruptions: None,
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

/// The provider that reads the policy's `interruptionQueue` (the first of the registry that
/// can), with how it opens one.
pub fn interruptions() -> Option<(&'static str, Open)> {
    REGISTRY
        .iter()
        .find_map(|p| Some((p.policy.name(), p.interruptions?)))
}

/// What the process gives a provider besides its pools.
pub struct Host<'a> {
    /// The cluster's identity (the kube-system Namespace UID).
    pub cluster_id: &'a str,
    /// The API server, for a provider whose machines are its Nodes.
    pub client: &'a Client,
    /// The endpoint that replaces the provider's cloud (`--aws-endpoint-url`, ...).
    pub endpoint_url: Option<String>,
}

/// The provider named `name` for the pools of `policy` that name it.
pub async fn build(
    name: &str,
    policy: &Policy,
    catalog: &Catalog,
    host: Host<'_>,
) -> Result<Arc<dyn CloudProvider>, String> {
    let Some(build) = find(name).and_then(|p| p.build) else {
        return Err(format!(
            "provider {name:?} cannot be run by this controller (built with: {})",
            runnable()
        ));
    };
    let mut spec = provider_spec(policy, catalog, name);
    spec.cluster_id = Some(host.cluster_id.to_string());
    spec.endpoint_url = host.endpoint_url;
    spec.kube_client = Some(host.client);
    build(&spec).await
}

/// Checks the pools of `policy` that name `name` against its cloud account (`region` and
/// `endpoint_url` replace the policy's region and the cloud's endpoint), on a runtime of its
/// own: every problem found.
pub fn check_against_account(
    name: &str,
    policy: &Policy,
    catalog: &Catalog,
    region: Option<String>,
    endpoint_url: Option<String>,
) -> Result<AccountProblems, CheckFailed> {
    let Some(check) = find(name).and_then(|p| p.check) else {
        return Err(CheckFailed::Cloud(format!(
            "this build has no {name} support (built without the `{name}` feature)"
        )));
    };
    let mut spec: ProviderSpec<'_> = provider_spec(policy, catalog, name);
    spec.region = region.or(spec.region);
    spec.endpoint_url = endpoint_url;
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CheckFailed::Cloud(format!("cannot start the async runtime: {e}")))?
        .block_on(check(&spec))
}
