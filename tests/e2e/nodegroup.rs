//! A pool backed by an Auto Scaling group on the real control plane: the controller grows the
//! group with `SetDesiredCapacity`, the group's instance (moto's) registers as a kwok Node, a GPU
//! pod runs there, and once it has ended the node is drained and its instance taken out of the
//! group with `TerminateInstanceInAutoScalingGroup(ShouldDecrementDesiredCapacity=true)`.

use std::collections::BTreeMap;

use crate::support::{aws, gpu_pod, Env, Options, CLUSTER};
use crate::MIN;

#[test]
fn nodegroup_asg_instance_becomes_a_node_runs_the_pod_and_leaves_its_group_with_a_decrement() {
    // The relay in front of moto counts the controller's calls.
    let mut env = Env::start(
        "asg",
        Options {
            proxy: true,
            ..Options::default()
        },
    );
    let asg = env.rt.block_on(aws::autoscaling(&env.moto.url()));
    env.rt.block_on(async {
        aws::typed_launch_template(&env.ec2, "lt-asg-g5", "g5.xlarge").await;
        aws::create_group(
            &asg,
            &env.net,
            &aws::GroupSpec {
                name: "gpu-od-a",
                zones: &["us-east-1a"],
                types: &[],
                spot: false,
                launch_template: "lt-asg-g5",
                min: 0,
                max: 3,
                desired: 0,
                // The group's instances carry the cluster's tag (propagated at launch), which is
                // what the harness's EC2 bridge registers as Nodes: the stand-in for a node
                // group's kubelets joining the cluster with its bootstrap.
                tags: &[
                    ("gpu-node-autoscaler.io/cluster", CLUSTER),
                    (
                        "k8s.io/cluster-autoscaler/node-template/label/gpu-type",
                        "a10g",
                    ),
                ],
            },
        )
        .await;
    });
    // The pool names its group and nothing else: instance type and zone come from the group.
    let policy = format!(
        "clusterName: {CLUSTER}\nregion: us-east-1\nbatching: {{idle: 1s, max: 3s}}\n\
         maxNodeProvisionTime: 2m\npools:\n- name: asg\n  provider: aws\n  maxNodes: 3\n  \
         scaleDown: {{cooldownAfterScaleUp: 5s, unneededTime: 5s}}\n  aws:\n    \
         autoScalingGroups: {{names: [gpu-od-a]}}\n"
    );
    env.create(&env.policy_configmap(&policy));
    env.start_controller("r1", &[]);
    env.wait_for("the controller to become ready", MIN, || {
        env.http_get("r1", "/readyz").filter(|(c, _)| *c == 200)
    });
    env.create(&gpu_pod(
        "default",
        "trainer",
        &BTreeMap::new(),
        Some("20s"),
    ));

    // The group grown from zero by one, and its instance a Node of the pool.
    let (desired, ids) = env.wait_for("the group to have an instance", 2 * MIN, || {
        let (d, ids) = env.rt.block_on(aws::group_state(&asg, "gpu-od-a"));
        (!ids.is_empty()).then_some((d, ids))
    });
    assert_eq!((desired, ids.len()), (1, 1), "{ids:?}");
    let instance = ids[0].clone();
    env.wait_for("the pod to run", 3 * MIN, || {
        (env.pod_phase("default", "trainer") == "Running").then_some(())
    });
    let node = env.get_json(&["get", "pod", "trainer", "-n", "default"])["spec"]["nodeName"]
        .as_str()
        .unwrap()
        .to_string();
    let n = env.get_json(&["get", "node", &node]);
    assert!(
        n["spec"]["providerID"]
            .as_str()
            .unwrap()
            .ends_with(&format!("/{instance}")),
        "{n}"
    );
    env.wait_for("the controller to put the Node in its pool", MIN, || {
        let n = env.get_json(&["get", "node", &node]);
        (n["metadata"]["labels"]["gpu-node-autoscaler.io/pool"] == "asg").then_some(())
    });
    assert_eq!(
        env.rt.block_on(aws::group_state(&asg, "gpu-od-a")).0,
        1,
        "nothing beyond the pod's node"
    );

    // The pod ends: the node is drained and removed, its instance out of the group, and the
    // group's desired capacity back to zero (decremented with the termination, not lowered
    // for the group to choose an instance).
    env.wait_for("the pod to finish", 2 * MIN, || {
        (env.pod_phase("default", "trainer") == "Succeeded").then_some(())
    });
    env.wait_for("the group to be back at zero", 3 * MIN, || {
        let (d, ids) = env.rt.block_on(aws::group_state(&asg, "gpu-od-a"));
        (d == 0 && ids.is_empty()).then_some(())
    });
    env.wait_for("the node to be deleted", 2 * MIN, || {
        env.kubectl(&["get", "node", &node])
            .status
            .code()
            .filter(|c| *c != 0)
    });
    let downs = env.events("ScaleDown");
    assert!(downs.iter().any(|e| e.contains(&node)), "{downs:?}");
    let proxy = env.proxy.as_ref().unwrap();
    assert_eq!(proxy.calls_of("TerminateInstanceInAutoScalingGroup"), 1);
    assert_eq!(proxy.calls_of("SetDesiredCapacity"), 1);
    assert_eq!(proxy.calls_of("CreateFleet"), 0);
    assert_eq!(proxy.calls_of("TerminateInstances"), 0);
    let log = env.log("r1");
    assert!(
        !log.contains("not terminated"),
        "no refused termination: {log}"
    );
}

#[test]
fn nodegroup_a_group_tagged_after_start_is_read_again_and_grown_for_the_pod_only_it_fits() {
    let mut env = Env::start(
        "asg-reread",
        Options {
            proxy: true,
            ..Options::default()
        },
    );
    let asg = env.rt.block_on(aws::autoscaling(&env.moto.url()));
    // Both groups are tagged for discovery; only the second one is in us-east-1b.
    let tags_a = [
        ("gpu-node-autoscaler.io/cluster", CLUSTER),
        ("k8s.io/cluster-autoscaler/enabled", "true"),
        (
            "k8s.io/cluster-autoscaler/node-template/label/gpu-type",
            "a10g",
        ),
    ];
    let tags_b = [
        ("gpu-node-autoscaler.io/cluster", CLUSTER),
        ("k8s.io/cluster-autoscaler/enabled", "true"),
        (
            "k8s.io/cluster-autoscaler/node-template/label/gpu-type",
            "a10g",
        ),
    ];
    let group = |name, zones, tags| aws::GroupSpec {
        name,
        zones,
        types: &[],
        spot: false,
        launch_template: "lt-asg-g5",
        min: 0,
        max: 3,
        desired: 0,
        tags,
    };
    env.rt.block_on(async {
        aws::typed_launch_template(&env.ec2, "lt-asg-g5", "g5.xlarge").await;
        aws::create_group(&asg, &env.net, &group("gpu-od-a", &["us-east-1a"], &tags_a)).await;
    });
    let policy = format!(
        "clusterName: {CLUSTER}\nregion: us-east-1\nbatching: {{idle: 1s, max: 3s}}\n\
         maxNodeProvisionTime: 2m\npools:\n- name: asg\n  provider: aws\n  maxNodes: 3\n  \
         scaleDown: {{cooldownAfterScaleUp: 5s, unneededTime: 5s}}\n  aws:\n    \
         autoScalingGroups: {{autoDiscovery: {{tags: [k8s.io/cluster-autoscaler/enabled]}}}}\n"
    );
    env.create(&env.policy_configmap(&policy));
    env.start_controller("r1", &["--group-refresh-interval", "3s"]);
    env.wait_for("the controller to become ready", MIN, || {
        env.http_get("r1", "/readyz").filter(|(c, _)| *c == 200)
    });
    // A pod only a group not created yet fits (its zone): no launch can help it.
    let selector: BTreeMap<&str, &str> = BTreeMap::new();
    let pod = gpu_pod("default", "late", &selector, Some("20s")).replace(
        "spec:\n",
        "spec:\n  nodeSelector: {topology.kubernetes.io/zone: us-east-1b}\n",
    );
    assert!(pod.contains("zone: us-east-1b"), "{pod}");
    env.create(&pod);
    env.wait_for("a NotTriggerScaleUp for the pod", 2 * MIN, || {
        env.events("NotTriggerScaleUp")
            .into_iter()
            .find(|e| e.starts_with("late:"))
    });
    // The group is created and tagged for discovery after start: read again, it is planned
    // from its tags and grown from zero for the pod, with no restart and no policy change.
    env.rt.block_on(aws::create_group(
        &asg,
        &env.net,
        &group("gpu-od-b", &["us-east-1b"], &tags_b),
    ));
    env.wait_for("a CloudGroupFound Event for the new group", 2 * MIN, || {
        env.events("CloudGroupFound")
            .into_iter()
            .find(|e| e.contains("gpu-od-b"))
    });
    env.wait_for("the pod to run", 3 * MIN, || {
        (env.pod_phase("default", "late") == "Running").then_some(())
    });
    let (desired, ids) = env.rt.block_on(aws::group_state(&asg, "gpu-od-b"));
    assert_eq!((desired, ids.len()), (1, 1), "{ids:?}");
    assert_eq!(env.rt.block_on(aws::group_state(&asg, "gpu-od-a")).0, 0);
}
