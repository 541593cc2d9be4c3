//! gpu-node-autoscaler: a Kubernetes node autoscaler for GPU node pools.
//!
//! The pure core is [`model`], [`policy`] and [`plan`]: no I/O, time passed in. [`convert`] turns
//! Kubernetes objects into model values; [`catalog`] reads instance catalogs.

#[cfg(feature = "alibaba")]
pub mod alibaba;
pub mod autoscaler;
#[cfg(feature = "aws")]
pub mod aws;
pub mod catalog;
#[cfg(feature = "controller")]
pub mod controller;
pub mod convert;
pub mod fixtures;
pub mod model;
pub mod plan;
pub mod policy;
pub mod sim;

pub use gpu_node_autoscaler_provider as provider;
