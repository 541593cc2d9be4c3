//! The Alibaba Cloud [`CloudProvider`]: ACK GPU node pools are ESS scaling groups. Launches are
//! `ScaleWithAdjustment` on the pool's first group (spot, or on-demand for an on-demand pool;
//! then its on-demand group when spot has no stock), followed through
//! `DescribeScalingActivities` / `DescribeScalingInstances`; removals are `RemoveInstances` with
//! the exact instance id; the catalog comes from ECS `DescribeInstanceTypes`,
//! `DescribeAvailableResource` (stock per zone) and `DescribeSpotPriceHistory`.
//!
//! - HTTP is plain RPC-style `GET` with the version 1.0 HMAC-SHA1 signature ([`sign`]).
//! - Credentials come from a chain ([`credentials`]: environment, RRSA/OIDC, ECS instance RAM
//!   role), temporary ones refreshed before they expire. They never reach a log: this crate logs
//!   nothing and every `Debug` redacts them.
//! - Each API class has a client-side rate limit (`governor`), and a throttled call
//!   (`Throttling`, `Throttling.User`, `Throttling.Api`) is retried with jittered exponential
//!   back-off before [`ProviderError::Throttled`] is returned.
//! - A launch is idempotent per launch id: the scaling activities started for it (found by their
//!   `ActivityMetadata`) count first, and the `ClientToken` of each `ScaleWithAdjustment` is
//!   derived from the launch id, the group and the count, so a retried call gets the first call's
//!   activity back.
//! - ESS runs one scaling activity per group at a time: a group's scale-outs and removals are
//!   queued in the process, and retried with back-off while ESS says the group is busy.
//!
//! Without the `client` feature (on by default) the crate is its [`settings`] only: the pool
//! section of the policy and its checks, with no cloud SDK, for programs that only read policies.

#[cfg(feature = "client")]
pub mod build;
#[cfg(feature = "client")]
pub mod credentials;
#[cfg(feature = "client")]
pub mod errors;
pub mod settings;
#[cfg(feature = "client")]
pub mod sign;

#[cfg(feature = "client")]
mod client;
#[cfg(feature = "client")]
pub use client::*;

/// The Alibaba Cloud provider as the registry lists it.
pub static PROVIDER: gpu_node_autoscaler_provider::spec::Provider =
    gpu_node_autoscaler_provider::spec::Provider {
        policy: &settings::POLICY,
        #[cfg(feature = "client")]
        build: Some(build::build),
        #[cfg(not(feature = "client"))]
        build: None,
        #[cfg(feature = "client")]
        check: Some(build::check),
        #[cfg(not(feature = "client"))]
        check: None,
        interruptions: None,
    };
