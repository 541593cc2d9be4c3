//! End to end with the Alibaba Cloud provider: kube-sim with its ESS bridge, the provider's local
//! fake of the ESS and ECS endpoints (which checks every request's signature) and the real
//! `gpu-node-autoscaler run` binary with a `provider: alibaba` pool, driven with kubectl.

#![cfg(feature = "alibaba")]

use gpu_node_autoscaler_test_support::ess as fake;

use std::collections::BTreeMap;
use std::time::Duration;

use fake::{Fake, KEY_ID, REGION, SECRET, TOKEN};
use kube_sim::alibaba_rpc::Credentials;

use crate::support::{gpu_pod, Env, Options};

const MIN: Duration = Duration::from_secs(60);
const SPOT: &str = "asg-bp1spot";
const ON_DEMAND: &str = "asg-bp1od";
const A10: &str = "ecs.gn7i-c8g1.2xlarge";

/// A spot group with a second, on-demand group, one zone; test-short delays.
fn policy() -> String {
    format!(
        "region: {REGION}\nzones: [cn-hangzhou-i]\nbatching: {{idle: 1s, max: 3s}}\n\
         maxNodeProvisionTime: 2m\ninsufficientCapacityTtl: 3m\npools:\n- name: a10\n  provider: alibaba\n\
         \x20 instanceTypes: [{A10}]\n  capacityTypes: [spot, on-demand]\n  maxNodes: 4\n\
         \x20 prices: {{{A10}: {{onDemand: 2.0}}}}\n\
         \x20 scaleDown: {{cooldownAfterScaleUp: 5s, unneededTime: 5s, backoffAfterFailure: 10m}}\n\
         \x20 alibaba:\n    scalingGroupId: {SPOT}\n    onDemandScalingGroupId: {ON_DEMAND}\n\
         \x20   vSwitches: {{cn-hangzhou-i: vsw-0}}\n"
    )
}

/// kube-sim bridging the fake's two groups, and controllers with credentials the fake accepts.
fn start(name: &str, fake: &Fake) -> Env {
    let mut credentials = Credentials::new(KEY_ID, SECRET);
    credentials.security_token = Some(TOKEN.to_string());
    let mut ess = kube_sim::EssConfig::new(REGION, &[SPOT, ON_DEMAND], credentials);
    ess.endpoint = Some(fake.url.clone());
    ess.pools = [(SPOT, "a10"), (ON_DEMAND, "a10")]
        .into_iter()
        .map(|(g, p)| (g.to_string(), p.to_string()))
        .collect();
    ess.boot_delay = Duration::from_secs(2);
    ess.device_plugin_delay = Duration::from_secs(1);
    let controller_env = [
        ("ALIBABA_CLOUD_ACCESS_KEY_ID", KEY_ID),
        ("ALIBABA_CLOUD_ACCESS_KEY_SECRET", SECRET),
        ("ALIBABA_CLOUD_SECURITY_TOKEN", TOKEN),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    Env::start(
        name,
        Options {
            ess: Some(ess),
            controller_env,
            ..Options::default()
        },
    )
}

/// Waits for the first instance of `group` in the fake, its Node (ACK's providerID) and the pod
/// `default/<pod>` running there; returns the instance id and the Node.
fn instance_node_and_running_pod(
    env: &Env,
    fake: &Fake,
    group: &str,
    pod: &str,
) -> (String, serde_json::Value) {
    let id = env.wait_for(&format!("an instance in {group}"), 2 * MIN, || {
        fake.with(|s| s.groups[group].instances.first().map(|i| i.id.clone()))
    });
    let provider_id = format!("{REGION}.{id}");
    let node = env.wait_for("the instance's Node", 2 * MIN, || {
        env.pool_nodes()
            .into_iter()
            .find(|n| n["spec"]["providerID"] == provider_id.as_str())
    });
    let labels = &node["metadata"]["labels"];
    assert_eq!(labels["gpu-node-autoscaler.io/pool"], "a10");
    assert_eq!(labels["node.kubernetes.io/instance-type"], A10);
    assert_eq!(labels["topology.kubernetes.io/zone"], "cn-hangzhou-i");
    assert_eq!(labels["topology.kubernetes.io/region"], REGION);
    env.wait_for("the pod to run", 2 * MIN, || {
        (env.pod_phase("default", pod) == "Running").then_some(())
    });
    let p = env.get_json(&["get", "pod", "-n", "default", pod]);
    assert_eq!(p["spec"]["nodeName"], node["metadata"]["name"]);
    (id, node)
}

fn assert_no_bad_requests(fake: &Fake) {
    let violations = fake.with(|s| s.violations.clone());
    assert!(violations.is_empty(), "bad requests: {violations:#?}");
}

#[test]
fn a_gpu_pod_gets_a_spot_instance_from_ess_which_is_removed_by_its_id_after_the_pod_goes() {
    let fake = Fake::start_blocking(&[(SPOT, &["cn-hangzhou-i"]), (ON_DEMAND, &["cn-hangzhou-i"])]);
    let mut env = start("alibaba", &fake);
    env.create(&env.policy_configmap(&policy()));
    env.start_controller("r1", &["--alibaba-endpoint-url", &fake.url]);
    env.create(&gpu_pod("default", "train", &BTreeMap::new(), None));

    let (id, node) = instance_node_and_running_pod(&env, &fake, SPOT, "train");
    // One scale-out of one, on the spot group.
    let scale = fake.with(|s| s.calls_of("ScaleWithAdjustment"));
    assert_eq!(scale.len(), 1, "{scale:#?}");
    assert_eq!(scale[0]["ScalingGroupId"], SPOT);
    assert_eq!(scale[0]["AdjustmentValue"], "1");
    assert!(
        scale[0]["ActivityMetadata"].contains("gpu-node-autoscaler.io/launch-id"),
        "{scale:#?}"
    );
    // The instance carries the cluster's identity (the kube-system Namespace UID).
    let tags = fake.with(|s| {
        s.groups[SPOT]
            .instances
            .iter()
            .find(|i| i.id == id)
            .map(|i| i.tags.clone())
            .unwrap_or_default()
    });
    assert_eq!(
        tags.get("gpu-node-autoscaler.io/cluster-id"),
        Some(&env.cluster.identity()),
        "{tags:?}"
    );
    assert_eq!(
        node["metadata"]["labels"]["karpenter.sh/capacity-type"],
        "spot"
    );
    let name = node["metadata"]["name"].as_str().unwrap().to_string();

    // The pod goes: after the cooldown and unneeded time the node is drained and its instance
    // removed by id, and the Node goes with it.
    env.kubectl_ok(&["delete", "pod", "-n", "default", "train", "--wait=false"]);
    let removal = env.wait_for("RemoveInstances", 3 * MIN, || {
        fake.with(|s| s.calls_of("RemoveInstances").first().cloned())
    });
    assert_eq!(removal["InstanceIds.1"], id);
    assert_eq!(removal["ScalingGroupId"], SPOT);
    assert_eq!(removal["RemovePolicy"], "release");
    env.wait_for("the Node to be deleted", 2 * MIN, || {
        env.pool_nodes().is_empty().then_some(())
    });
    assert!(env
        .events("ScaleDown")
        .iter()
        .any(|e| e.starts_with(&format!("{name}:"))));

    let (removals, scale, left) = fake.with(|s| {
        (
            s.calls_of("RemoveInstances").len(),
            s.calls_of("ScaleWithAdjustment").len(),
            s.groups.values().map(|g| g.instances.len()).sum::<usize>(),
        )
    });
    assert_eq!(removals, 1);
    assert_eq!(
        scale, 1,
        "no other scale-out, and none on the on-demand group"
    );
    assert_eq!(left, 0);
    assert_no_bad_requests(&fake);
}

#[test]
fn without_spot_stock_the_pod_gets_an_instance_of_the_on_demand_group() {
    let fake = Fake::start_blocking(&[(SPOT, &["cn-hangzhou-i"]), (ON_DEMAND, &["cn-hangzhou-i"])]);
    fake.with(|s| s.groups.get_mut(SPOT).unwrap().no_stock = true);
    let mut env = start("alibaba-od", &fake);
    env.create(&env.policy_configmap(&policy()));
    env.start_controller("r1", &["--alibaba-endpoint-url", &fake.url]);
    env.create(&gpu_pod("default", "train", &BTreeMap::new(), None));

    let (_, node) = instance_node_and_running_pod(&env, &fake, ON_DEMAND, "train");
    assert_eq!(
        node["metadata"]["labels"]["karpenter.sh/capacity-type"],
        "on-demand"
    );
    // The spot group was asked first and had nothing; the on-demand group gave the one instance.
    let scale: Vec<String> = fake.with(|s| {
        s.calls_of("ScaleWithAdjustment")
            .iter()
            .map(|c| c["ScalingGroupId"].clone())
            .collect()
    });
    assert_eq!(scale.first().map(String::as_str), Some(SPOT), "{scale:?}");
    assert!(scale.iter().any(|g| g == ON_DEMAND), "{scale:?}");
    assert!(fake.with(|s| s.groups[SPOT].instances.is_empty()));
    assert_eq!(env.pool_nodes().len(), 1);
    assert_no_bad_requests(&fake);
}
