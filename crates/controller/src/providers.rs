//! The controller's side of the providers' registry (`gpu-node-autoscaler-registry`, one line
//! per provider): building the providers of the policy in force from their spec (the core's
//! [`provider_spec`]), checking pools against an account (`check-policy --provider`) and finding
//! the provider that reads interruption notices. Provider builds, policy reloads and account
//! checks go through the registry only.

use std::sync::Arc;

use gpu_node_autoscaler_core::plan::templates::provider_spec;
use gpu_node_autoscaler_core::policy::Policy;
use gpu_node_autoscaler_provider::interruptions::Open;
use gpu_node_autoscaler_provider::spec::{AccountProblems, CheckFailed, ProviderSpec};
use gpu_node_autoscaler_provider::{Catalog, CloudProvider};
pub use gpu_node_autoscaler_registry::{find, policies, runnable, PROVIDERS};
use kube::Client;

/// The provider that reads the policy's `interruptionQueue` (the first of the registry that
/// can), with how it opens one.
pub fn interruptions() -> Option<(&'static str, Open)> {
    PROVIDERS
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
