//! What a provider is built from: the policy's pools that name it, as the core resolved them
//! (instance types, prices, taints, the GPU resources and labels of their Nodes), and what the
//! process around it gives (the cluster's identity, an endpoint override, the API server's
//! client). The core computes a [`ProviderSpec`] once from the policy and the catalog; each
//! provider crate turns it into its own configuration and its [`CloudProvider`] with a function
//! of the shape [`Build`], so that a provider is added in its own crate plus one registry line.

use std::any::Any;
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::interruptions::Open;
use crate::policy::{ProviderPolicy, Value};
use crate::{CapacityType, Catalog, CloudProvider};

/// One pool of the policy as its provider builds it.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolSpec {
    pub name: String,
    /// The pool's section of its provider (`aws:`, `alibaba:`), as the provider's policy check
    /// accepted it; `None` when the pool has none.
    pub settings: Option<Value>,
    pub zones: Vec<String>,
    pub capacity_types: Vec<CapacityType>,
    /// The pool's instance types (listed, or resolved from the catalog by its requirements) and
    /// their on-demand prices (the pool's `prices`, else the catalog's list price; a type
    /// without either has none), or why they could not be resolved (the message names the pool).
    pub types: Result<(Vec<String>, BTreeMap<String, f64>), String>,
    /// The taints its Nodes register with, as `(key, value, effect)`.
    pub startup_taints: Vec<(String, String, String)>,
    /// The GPU extended resources a Node of each of its catalog's instance types advertises
    /// (whole GPUs, MIG slices or shared GPUs as its `gpuMode` says, none where a DRA driver
    /// publishes them), or why they cannot be told (the message names the pool).
    pub gpu_resources: BTreeMap<String, Result<BTreeMap<String, i64>, String>>,
}

/// A provider as its crate offers it to the registry: its part of the policy, and what its
/// build can do (`None` where the crate is built without its client, or has no such thing).
pub struct Provider {
    /// Its part of the policy: its name, its pool section and that section's checks.
    pub policy: &'static dyn ProviderPolicy,
    /// How it is built from its spec.
    pub build: Option<Build>,
    /// How its pools are checked against the cloud account (`check-policy --provider`).
    pub check: Option<Check>,
    /// How its interruption notices are read (the policy's `interruptionQueue`).
    pub interruptions: Option<Open>,
}

/// A pool ready to build: its section as the provider reads it, its instance types and their
/// on-demand prices.
pub type Resolved<T> = (T, Vec<String>, BTreeMap<String, f64>);

impl PoolSpec {
    /// The pool's section read back with `read` (the provider's settings type), with its
    /// resolved instance types and prices; else what is wrong, naming the pool (`missing` tells
    /// what the section is needed for when the pool has none).
    pub fn resolve<T>(
        &self,
        section: &str,
        read: impl FnOnce(&Value) -> Result<T, crate::policy::FieldError>,
        missing: &str,
    ) -> Result<Resolved<T>, String> {
        let settings = match self.settings.as_ref().map(read) {
            Some(Ok(s)) => s,
            Some(Err(e)) => return Err(format!("pool {}: {e}", self.name)),
            None => {
                return Err(format!(
                    "pool {}: {section}: missing ({missing})",
                    self.name
                ))
            }
        };
        let (types, prices) = self.types.clone()?;
        Ok((settings, types, prices))
    }
}

/// A provider's pools and what it is built with.
pub struct ProviderSpec<'a> {
    /// The policy's `clusterName`.
    pub cluster_name: String,
    /// The cluster's identity (the kube-system Namespace UID), tagged on every instance; `None`
    /// where no cluster is at hand (a policy checked against an account).
    pub cluster_id: Option<String>,
    /// The policy's `region` (or the one a command line gave).
    pub region: Option<String>,
    /// An endpoint that replaces the cloud's (an emulator).
    pub endpoint_url: Option<String>,
    /// The price file's catalog: instance shapes and list prices.
    pub catalog: &'a Catalog,
    /// The labels a Node of an instance type carries besides the well-known ones (the GPU
    /// product and count labels GPU feature discovery puts there), for providers that register
    /// Nodes themselves.
    pub type_labels: BTreeMap<String, BTreeMap<String, String>>,
    /// The pools that name the provider, in policy order.
    pub pools: Vec<PoolSpec>,
    /// The policy's `maxNodeProvisionTime`: how long a launch may take before what has not come
    /// counts as never coming (a provider that launches asynchronously gives it back then).
    pub max_node_provision_time: std::time::Duration,
    /// The controller's Kubernetes client (a `kube::Client`), for a provider whose machines are
    /// the cluster's own objects (kwok); `None` outside the controller.
    pub kube_client: Option<&'a (dyn Any + Send + Sync)>,
}

/// A provider being built.
pub type Building<'a> =
    Pin<Box<dyn Future<Output = Result<Arc<dyn CloudProvider>, String>> + Send + 'a>>;

/// Builds a provider from its spec; errors name the pool and field, one per line.
pub type Build = for<'a> fn(&'a ProviderSpec<'a>) -> Building<'a>;

/// Why a check against the account could not be made.
#[derive(Clone, Debug, PartialEq)]
pub enum CheckFailed {
    /// Errors in the spec itself (they name the pool and field), before any call.
    Spec(Vec<String>),
    /// The cloud could not be asked.
    Cloud(String),
}

/// What a check against the account found.
#[derive(Clone, Debug, PartialEq)]
pub struct AccountProblems {
    /// The account, for people: `AWS`, `Alibaba Cloud`.
    pub account: &'static str,
    /// Every problem found; none when the pools can launch.
    pub problems: Vec<String>,
    /// What was found for the pools, for people (e.g. each Auto Scaling group a pool scales and
    /// its template), one line each.
    pub found: Vec<String>,
    /// The account's capacity reservations, read when a pool lists `reserved` (the caller
    /// matches them against the pools' selectors); none otherwise.
    pub reservations: Vec<crate::Reservation>,
}

/// A check of the spec's pools against the cloud account, under way.
pub type Checking<'a> =
    Pin<Box<dyn Future<Output = Result<AccountProblems, CheckFailed>> + Send + 'a>>;

/// Checks a provider's pools against its account (instance types offered in their zones,
/// subnets or scaling groups, launch templates).
pub type Check = for<'a> fn(&'a ProviderSpec<'a>) -> Checking<'a>;
