//! The AWS [`CloudProvider`](gpu_node_autoscaler_provider::CloudProvider): EC2 `CreateFleet`
//! (type `instant`) for launches (`RunInstances` targeted by id into the capacity reservations
//! a launch of `reserved` offerings names), the `Describe*` APIs for the catalog, tags for finding our
//! instances again after a restart. Pools backed by existing Auto Scaling groups
//! (`aws.autoScalingGroups`) are grown with `SetDesiredCapacity` and shrunk with
//! `TerminateInstanceInAutoScalingGroup` instead ([`groups`] decides, the client's `asg` module
//! calls).
//!
//! - Credentials come from the SDK's default chain (environment, web identity / IRSA, ECS, IMDSv2).
//!   They are never logged: this crate logs nothing and its `Debug` output shows no client.
//! - Every API has its own client-side rate limit (`governor`), and a throttled call
//!   (`RequestLimitExceeded`) is retried with jittered exponential back-off before
//!   [`ProviderError::Throttled`](gpu_node_autoscaler_provider::ProviderError::Throttled) is
//!   returned. The SDK's own retries are off, so that these are the only ones.
//! - A launch is idempotent per launch id: instances already tagged with it are counted first and
//!   only the missing ones are launched (a `ClientToken` alone is not enough: its window is
//!   limited and emulators ignore it).
//!
//! Without the `client` feature (on by default) the crate is its [`settings`] only: the pool
//! section of the policy and its checks, with no cloud SDK, for programs that only read policies.

#[cfg(feature = "client")]
pub mod build;
#[cfg(feature = "client")]
pub mod errors;
pub mod groups;
#[cfg(feature = "client")]
pub mod interruptions;
#[cfg(feature = "client")]
pub mod plan;
pub mod settings;

#[cfg(feature = "client")]
mod client;
#[cfg(feature = "client")]
pub use client::*;

/// The AWS provider as the registry lists it.
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
        #[cfg(feature = "client")]
        interruptions: Some(interruptions::open),
        #[cfg(not(feature = "client"))]
        interruptions: None,
    };
