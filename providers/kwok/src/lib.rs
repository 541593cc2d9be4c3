//! A [`CloudProvider`] for clusters whose kubelets are played by kwok (`sigs.k8s.io/kwok`): a
//! launch creates the Nodes themselves, with the offering's instance type, zone, capacity and
//! providerID, and kwok (started with `--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake`)
//! makes them Ready and runs their pods; terminating an instance deletes its Node. This is what the
//! Cluster Autoscaler's and Karpenter's kwok providers do, so that the three autoscalers can be run
//! side by side on one real control plane, and so that a user can try the controller on any kwok
//! cluster without a cloud account.
//!
//! The Nodes are the instances: [`CloudProvider::list`] reads them back from the API server (the
//! truth after a restart). A Node is registered as a kubelet would register it (the cloud's labels,
//! no pool label): the controller finds its pool from the instance, as on a real cloud. Ownership
//! is the cluster identity label ([`LABEL_CLUSTER_ID`], the kube-system Namespace UID) and the
//! cluster name; a Node without both is never listed and never deleted.
//!
//! Capacity reservations are declared in the pools' `kwok:` sections ([`settings`]): launches of
//! `reserved` offerings go into those the launch names (the ones its pool selects) up to their
//! count (counted from the Nodes launched into each), and a reservation that has ended takes its Nodes back (deleted at the next listing),
//! as a cloud takes a Capacity Block's instances back at its end.
//!
//! What it does not model: boot time and the device plugin's start (the Node has its GPUs from
//! creation; kwok's node stages decide when it turns Ready), and capacity shortages beyond the
//! fixed set of unavailable offerings in [`KwokConfig::unavailable`] and the reservations' counts.
//!
//! Without the `client` feature (on by default) the crate is its policy part only (`provider:
//! kwok`), for programs that only read policies.

pub mod settings;

#[cfg(feature = "client")]
pub mod build;
#[cfg(feature = "client")]
mod client;
#[cfg(feature = "client")]
pub use client::*;

/// The annotation by which kwok manages a Node (its `--manage-nodes-with-annotation-selector`).
pub const KWOK_ANNOTATION: &str = "kwok.x-k8s.io/node";
/// Its value, as the Cluster Autoscaler's and Karpenter's kwok providers set it.
pub const KWOK_ANNOTATION_VALUE: &str = "fake";
/// Label: the cluster identity (kube-system Namespace UID) of the controller that created it.
pub const LABEL_CLUSTER_ID: &str = "kwok.gpu-node-autoscaler.io/cluster-id";
/// Annotations: what the instance tags carry on a cloud.
pub const ANNOTATION_CLUSTER: &str = "kwok.gpu-node-autoscaler.io/cluster";
pub const ANNOTATION_POOL: &str = "kwok.gpu-node-autoscaler.io/pool";
pub const ANNOTATION_LAUNCH_ID: &str = "kwok.gpu-node-autoscaler.io/launch-id";
pub const ANNOTATION_CAPACITY_TYPE: &str = "kwok.gpu-node-autoscaler.io/capacity-type";
/// The capacity reservation (of the pools' `kwok.reservations`) a Node was launched into.
pub const ANNOTATION_RESERVATION_ID: &str = "kwok.gpu-node-autoscaler.io/capacity-reservation-id";
/// The providerID scheme of the Nodes: `kwok://<node name>`.
pub const PROVIDER_ID_PREFIX: &str = "kwok://";
/// Pods a Node admits (the kubelet's default `--max-pods`).
pub const MAX_PODS: u32 = 110;
/// The most Nodes one launch creates (a guard against a runaway request).
pub const MAX_LAUNCH: u32 = 500;

/// The kwok provider's part of the scaling policy: `provider: kwok` and its `kwok:` section
/// (the capacity reservations the cluster stands in for).
pub static POLICY: settings::KwokPolicy = settings::KwokPolicy;

/// The kwok provider as the registry lists it.
pub static PROVIDER: gpu_node_autoscaler_provider::spec::Provider =
    gpu_node_autoscaler_provider::spec::Provider {
        policy: &POLICY,
        #[cfg(feature = "client")]
        build: Some(build::build),
        #[cfg(not(feature = "client"))]
        build: None,
        check: None,
        interruptions: None,
    };
