//! kube-sim's integration tests, in one binary: the HTTP API, the real kubectl, kube-rs
//! watchers, the simulated controllers, the EC2 bridge against moto_server, the in-memory
//! provider bridge, fault injection.

mod common;
mod controllers;
mod ec2;
mod faults;
mod http;
mod kube_rs;
mod kubectl;
mod memory;

/// `moto_server` (EC2) for the bridge's tests: the AWS provider's test support, shared.
use gpu_node_autoscaler_test_support::moto;
