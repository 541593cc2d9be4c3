//! What a provider of the registry ([`crate::providers`]) is built from, and the shape of its
//! `build` function, apart from the registry so that the providers' modules and the registry do
//! not import each other.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use gpu_node_autoscaler_core::policy::Policy;
use gpu_node_autoscaler_provider::{Catalog, CloudProvider};
use kube::Client;

use crate::RunArgs;

/// What a provider is built from: the policy in force (its pools that name the provider), the
/// price file's catalog, the controller's flags, the cluster's identity and the API server.
pub struct BuildContext<'a> {
    pub policy: &'a Policy,
    pub catalog: &'a Catalog,
    pub args: &'a RunArgs,
    pub cluster_id: &'a str,
    pub client: &'a Client,
}

/// A provider being built.
pub type Building<'a> =
    Pin<Box<dyn Future<Output = Result<Arc<dyn CloudProvider>, String>> + Send + 'a>>;

/// Builds a provider for the pools of the policy that name it; errors name the pool and field.
pub type Build = for<'a> fn(&'a BuildContext<'a>) -> Building<'a>;
