//! gpu-node-autoscaler's decisions, with no I/O: [`model`] (pods, nodes, resources as values),
//! [`policy`] (the scaling policy, parsed and validated), [`plan`] (the planner: a pure function
//! from a snapshot to a plan), and [`autoscaler`] (the decision core that the controller and the
//! simulator both execute: state, passes, actions). [`convert`] turns Kubernetes objects (JSON)
//! into model values; [`catalog`] reads instance catalogs; [`prices`] refreshes their prices;
//! `fixtures` builds test values (`cfg(test)` or the `test-fixtures` feature); [`yaml`] reads
//! and writes YAML.

pub mod autoscaler;
pub mod buffer;
pub mod catalog;
pub mod cloud_groups;
pub mod convert;
pub mod dra;
#[cfg(any(test, feature = "test-fixtures"))]
pub mod fixtures;
#[cfg(any(test, feature = "test-fixtures"))]
pub mod fuzz;
pub mod hash;
pub mod model;
pub mod plan;
pub mod policy;
pub mod prices;
pub mod provisioning;
pub mod yaml;

pub use gpu_node_autoscaler_provider as provider;
