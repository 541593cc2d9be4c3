//! The EC2 bridge against a real `moto_server`: instances become Nodes, GPUs appear after the
//! device-plugin delay, terminated instances take their Nodes (and pods) with them.

use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::{eventually, get, post, start_with, Watch};
use crate::moto::{ec2, Moto, REGION};
use aws_sdk_ec2::types::{
    InstanceMarketOptionsRequest, InstanceType, MarketType, Placement, ResourceType, Tag,
    TagSpecification,
};
use aws_sdk_ec2::Client;
use serde_json::json;

const CLUSTER: &str = "kube-sim-test";

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Launches one instance with `tags` in us-east-1b; returns its id.
async fn launch(client: &Client, instance_type: &str, spot: bool, tags: &[(&str, &str)]) -> String {
    let images = client
        .describe_images()
        .owners("amazon")
        .send()
        .await
        .expect("DescribeImages");
    let ami = images
        .images()
        .iter()
        .find_map(|i| i.image_id())
        .expect("moto ships AMIs");
    let tag_list: Vec<Tag> = tags
        .iter()
        .map(|(k, v)| Tag::builder().key(*k).value(*v).build())
        .collect();
    let mut req = client
        .run_instances()
        .image_id(ami)
        .instance_type(InstanceType::from(instance_type))
        .min_count(1)
        .max_count(1)
        .placement(Placement::builder().availability_zone("us-east-1b").build())
        .tag_specifications(
            TagSpecification::builder()
                .resource_type(ResourceType::Instance)
                .set_tags(Some(tag_list))
                .build(),
        );
    if spot {
        req = req.instance_market_options(
            InstanceMarketOptionsRequest::builder()
                .market_type(MarketType::Spot)
                .build(),
        );
    }
    let out = req.send().await.expect("RunInstances");
    out.instances()[0].instance_id().unwrap().to_string()
}

fn node_names(a: SocketAddr) -> Vec<String> {
    let (c, list) = get(a, "/api/v1/nodes");
    assert_eq!(c, 200);
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["metadata"]["name"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn instances_become_nodes_with_labels_taints_and_late_gpus_and_leave_with_them() {
    let moto = Moto::start();
    let rt = runtime();
    let client = rt.block_on(ec2(&moto.url()));
    let a = start_with(kube_sim::Config {
        ec2: Some(kube_sim::Ec2Config {
            boot_delay: Duration::from_millis(300),
            device_plugin_delay: Duration::from_millis(700),
            poll: Duration::from_millis(200),
            ..kube_sim::Ec2Config::new(&moto.url(), REGION, CLUSTER)
        }),
        pod_start_delay: Duration::from_millis(100),
        ..kube_sim::Config::default()
    });
    let mut nodes = Watch::open(a, "/api/v1/nodes?watch=1");

    // Another cluster's instance never becomes a Node.
    rt.block_on(launch(
        &client,
        "g5.xlarge",
        false,
        &[("gpu-node-autoscaler.io/cluster", "someone-else")],
    ));
    let id = rt.block_on(launch(
        &client,
        "g5.xlarge",
        true,
        &[
            ("gpu-node-autoscaler.io/cluster", CLUSTER),
            ("gpu-node-autoscaler.io/pool", "gpu"),
            ("gpu-node-autoscaler.io/launch-id", "launch-1"),
            (
                "k8s.io/cluster-autoscaler/node-template/label/workload",
                "training",
            ),
            (
                "k8s.io/cluster-autoscaler/node-template/taint/nvidia.com/gpu",
                "present:NoSchedule",
            ),
        ],
    ));

    let node = nodes.next_of("ADDED");
    let name = node["metadata"]["name"].as_str().unwrap().to_string();
    let described = rt
        .block_on(client.describe_instances().instance_ids(&id).send())
        .unwrap();
    let inst = &described.reservations()[0].instances()[0];
    assert_eq!(Some(name.as_str()), inst.private_dns_name());
    assert_eq!(
        node["spec"]["providerID"],
        format!("aws:///us-east-1b/{id}")
    );
    let labels = &node["metadata"]["labels"];
    for (k, v) in [
        ("node.kubernetes.io/instance-type", "g5.xlarge"),
        ("topology.kubernetes.io/zone", "us-east-1b"),
        ("topology.kubernetes.io/region", "us-east-1"),
        ("kubernetes.io/hostname", name.as_str()),
        ("kubernetes.io/arch", "amd64"),
        ("kubernetes.io/os", "linux"),
        ("gpu-node-autoscaler.io/pool", "gpu"),
        ("gpu-node-autoscaler.io/launch-id", "launch-1"),
        ("nvidia.com/gpu.product", "NVIDIA-A10G"),
        ("workload", "training"),
    ] {
        assert_eq!(labels[k], v, "label {k}: {labels}");
    }
    // moto reports the spot market request as the instance's lifecycle.
    assert_eq!(
        inst.instance_lifecycle(),
        Some(&aws_sdk_ec2::types::InstanceLifecycleType::Spot)
    );
    let lifecycle = "spot";
    assert_eq!(labels["karpenter.sh/capacity-type"], lifecycle);
    assert_eq!(labels["gpu-node-autoscaler.io/capacity-type"], lifecycle);
    assert_eq!(
        node["spec"]["taints"],
        json!([{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}])
    );
    let st = &node["status"];
    assert_eq!(st["capacity"]["cpu"], "4");
    assert_eq!(st["capacity"]["memory"], "16384Mi");
    assert_eq!(st["allocatable"]["pods"], "110");
    assert!(
        st["allocatable"].get("nvidia.com/gpu").is_none(),
        "no GPUs before the device plugin starts: {st}"
    );
    assert!(st["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .any(|c| c["type"] == "Ready" && c["status"] == "True"));

    // The device plugin advertises the GPU.
    let with_gpus = loop {
        let n = nodes.next_of("MODIFIED");
        if n["status"]["allocatable"].get("nvidia.com/gpu").is_some() {
            break n;
        }
    };
    assert_eq!(with_gpus["status"]["allocatable"]["nvidia.com/gpu"], "1");
    assert_eq!(with_gpus["status"]["capacity"]["nvidia.com/gpu"], "1");

    // A GPU pod tolerating the taint runs there.
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "train"},
        "spec": {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
            "containers": [{"name": "c", "image": "i", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}});
    assert_eq!(post(a, "/api/v1/namespaces/default/pods", &pod).0, 201);
    eventually(30, "the pod to run on the new node", || {
        let (_, p) = get(a, "/api/v1/namespaces/default/pods/train");
        (p["status"]["phase"] == "Running" && p["spec"]["nodeName"] == name.as_str()).then_some(())
    });

    // Terminating the instance removes the Node and the pods bound to it.
    rt.block_on(client.terminate_instances().instance_ids(&id).send())
        .expect("TerminateInstances");
    let gone = nodes.next_of("DELETED");
    assert_eq!(gone["metadata"]["name"], name.as_str());
    eventually(30, "the pod to be deleted", || {
        (get(a, "/api/v1/namespaces/default/pods/train").0 == 404).then_some(())
    });
    assert!(
        node_names(a).is_empty(),
        "the other cluster's instance has no Node: {:?}",
        node_names(a)
    );
}

#[test]
fn a_node_deleted_by_a_client_stays_deleted_and_ec2_errors_delete_nothing() {
    let moto = Moto::start();
    let rt = runtime();
    let client = rt.block_on(ec2(&moto.url()));
    let a = start_with(kube_sim::Config {
        ec2: Some(kube_sim::Ec2Config {
            boot_delay: Duration::ZERO,
            device_plugin_delay: Duration::ZERO,
            poll: Duration::from_millis(100),
            ..kube_sim::Ec2Config::new(&moto.url(), REGION, CLUSTER)
        }),
        ..kube_sim::Config::api_only()
    });
    rt.block_on(launch(
        &client,
        "g4ad.xlarge",
        false,
        &[("gpu-node-autoscaler.io/cluster", CLUSTER)],
    ));
    let name = eventually(30, "the node", || node_names(a).pop());
    let (_, node) = get(a, &format!("/api/v1/nodes/{name}"));
    assert_eq!(
        node["metadata"]["labels"]["karpenter.sh/capacity-type"],
        "on-demand"
    );
    // No device-plugin delay: AMD GPUs at once; no pool tag, no pool label.
    assert_eq!(node["status"]["allocatable"]["amd.com/gpu"], "1");
    assert!(node["metadata"]["labels"]
        .get("gpu-node-autoscaler.io/pool")
        .is_none());
    assert!(node["metadata"]["labels"]
        .get("nvidia.com/gpu.product")
        .is_none());

    let (c, _) = crate::common::request(a, "DELETE", &format!("/api/v1/nodes/{name}"), "", "");
    assert_eq!(c, 200);
    // A second instance registering proves the bridge polled after the deletion; the first
    // Node did not come back.
    rt.block_on(launch(
        &client,
        "g5.xlarge",
        false,
        &[("gpu-node-autoscaler.io/cluster", CLUSTER)],
    ));
    let second = eventually(30, "the second node", || node_names(a).pop());
    assert_ne!(second, name);
    assert_eq!(node_names(a), std::slice::from_ref(&second));

    // EC2 going away is an error to log, not a reason to delete Nodes.
    drop(moto);
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(node_names(a), [second]);
}

#[test]
fn the_binary_takes_the_bridge_flags() {
    let moto = Moto::start();
    let rt = runtime();
    let client = rt.block_on(ec2(&moto.url()));
    let port = crate::common::free_port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_kube-sim"))
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--ec2-endpoint", &moto.url(), "--ec2-region", REGION])
        .args(["--cluster-name", "from-flags", "--boot-delay", "0"])
        .args(["--device-plugin-delay", "0", "--ec2-poll", "100ms"])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let a: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    rt.block_on(launch(
        &client,
        "p4d.24xlarge",
        false,
        &[("gpu-node-autoscaler.io/cluster", "from-flags")],
    ));
    let node = std::panic::catch_unwind(|| {
        let name = eventually(30, "a node from the binary's bridge", || {
            TcpStream::connect(a).ok()?;
            node_names(a).pop()
        });
        get(a, &format!("/api/v1/nodes/{name}")).1
    });
    let _ = child.kill();
    let _ = child.wait();
    let node = node.expect("the node registered");
    let st = &node["status"]["allocatable"];
    assert_eq!(st["nvidia.com/gpu"], "8");
    assert_eq!(st["cpu"], "96");
    assert_eq!(
        node["metadata"]["labels"]["nvidia.com/gpu.product"],
        "NVIDIA-A100-SXM4-40GB"
    );
}
