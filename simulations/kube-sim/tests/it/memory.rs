//! The bridge to the in-memory provider: launched instances become Nodes (GPUs after the
//! device-plugin delay), terminated and interrupted ones take their Nodes with them.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use gpu_node_autoscaler_memory::MemoryProvider;
use gpu_node_autoscaler_provider::{
    CapacityType, Catalog, GpuInfo, GpuVendor, InstanceType, LaunchRequest, Offering, OfferingKey,
};
use serde_json::json;

use crate::common::{eventually, get, start_with, Watch};

fn key(capacity_type: CapacityType) -> OfferingKey {
    OfferingKey {
        instance_type: "p4d.24xlarge".into(),
        zone: "us-east-1c".into(),
        capacity_type,
    }
}

fn catalog() -> Catalog {
    Catalog {
        instance_types: vec![InstanceType {
            name: "p4d.24xlarge".into(),
            vcpu: 96,
            memory_mib: 1_179_648,
            gpu: Some(GpuInfo {
                model: "A100".into(),
                vendor: GpuVendor::Nvidia,
                count: 8,
                memory_mib: 40_960,
            }),
            on_demand_price: Some(32.77),
        }],
        offerings: CapacityType::ALL
            .iter()
            .map(|c| Offering {
                key: key(*c),
                price_per_hour: 10.0,
                available: true,
            })
            .collect(),
    }
}

fn launch(provider: &MemoryProvider, id: &str, capacity_type: CapacityType) -> String {
    let tags: BTreeMap<String, String> = [(
        "k8s.io/cluster-autoscaler/node-template/taint/nvidia.com/gpu".to_string(),
        "present:NoSchedule".to_string(),
    )]
    .into();
    let out = provider
        .launch_now(&LaunchRequest {
            launch_id: id.into(),
            pool: "a100".into(),
            count: 1,
            offerings: vec![key(capacity_type)],
            tags,
            reservations: Vec::new(),
            atomic: false,
        })
        .expect("launch");
    out.launched[0].id.clone()
}

#[test]
fn memory_provider_instances_become_nodes_and_leave_with_them() {
    let provider = Arc::new(MemoryProvider::new(catalog(), "mem", 3));
    let a = start_with(kube_sim::Config {
        memory: Some(kube_sim::MemoryBridgeConfig {
            boot_delay: Duration::from_millis(200),
            device_plugin_delay: Duration::from_millis(400),
            poll: Duration::from_millis(100),
            ..kube_sim::MemoryBridgeConfig::new(provider.clone(), catalog())
        }),
        ..kube_sim::Config::api_only()
    });
    let mut nodes = Watch::open(a, "/api/v1/nodes?watch=1");
    let id = launch(&provider, "launch-1", CapacityType::Spot);

    let node = nodes.next_of("ADDED");
    assert_eq!(node["metadata"]["name"], id.as_str());
    assert_eq!(
        node["spec"]["providerID"],
        format!("memory:///us-east-1c/{id}")
    );
    let labels = &node["metadata"]["labels"];
    for (k, v) in [
        ("node.kubernetes.io/instance-type", "p4d.24xlarge"),
        ("topology.kubernetes.io/zone", "us-east-1c"),
        ("topology.kubernetes.io/region", "us-east-1"),
        ("karpenter.sh/capacity-type", "spot"),
        ("gpu-node-autoscaler.io/pool", "a100"),
        ("gpu-node-autoscaler.io/launch-id", "launch-1"),
        ("nvidia.com/gpu.product", "NVIDIA-A100-SXM4-40GB"),
    ] {
        assert_eq!(labels[k], v, "label {k}: {labels}");
    }
    assert_eq!(
        node["spec"]["taints"],
        json!([{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}])
    );
    assert_eq!(node["status"]["allocatable"]["cpu"], "96");
    assert!(node["status"]["allocatable"]
        .get("nvidia.com/gpu")
        .is_none());
    let with_gpus = loop {
        let n = nodes.next_of("MODIFIED");
        if n["status"]["allocatable"].get("nvidia.com/gpu").is_some() {
            break n;
        }
    };
    assert_eq!(with_gpus["status"]["allocatable"]["nvidia.com/gpu"], "8");

    // Terminated: the Node goes.
    provider.terminate_now(&id).expect("terminate");
    assert_eq!(nodes.next_of("DELETED")["metadata"]["name"], id.as_str());

    // A spot interruption shuts the instance down: its Node goes too.
    let spot = launch(&provider, "launch-2", CapacityType::Spot);
    let od = launch(&provider, "launch-3", CapacityType::OnDemand);
    eventually(30, "two nodes", || {
        let (_, list) = get(a, "/api/v1/nodes");
        (list["items"].as_array()?.len() == 2).then_some(())
    });
    let interrupted = provider.interrupt_spot(1.0, None);
    assert_eq!(interrupted.len(), 1);
    assert_eq!(nodes.next_of("DELETED")["metadata"]["name"], spot.as_str());
    let (_, list) = get(a, "/api/v1/nodes");
    assert_eq!(list["items"][0]["metadata"]["name"], od.as_str());
    assert_eq!(
        list["items"][0]["metadata"]["labels"]["karpenter.sh/capacity-type"],
        "on-demand"
    );
}
