//! Faults and operator mistakes that must lose no work and leave nothing running unmanaged:
//! a pool taken out of the policy by a reload (its nodes and instances are orphans), a change of
//! the cluster's name refused on reload, a cloud that stops answering (the loop stays alive).

use std::time::Duration;

use crate::support::{gpu_pod, Env, Options};

const MIN: Duration = Duration::from_secs(60);

fn no_labels() -> std::collections::BTreeMap<&'static str, &'static str> {
    std::collections::BTreeMap::new()
}

/// Seconds of the last pass, as the leader exports it.
fn last_pass(env: &Env) -> f64 {
    env.metric("r1", "gpu_node_autoscaler_last_pass_timestamp_seconds ")
        .unwrap_or(0.0)
}

#[test]
fn orphan_pool_removed_by_a_reload_is_kept_and_reported_then_drained_with_orphans_drain() {
    let mut env = Env::start("orphans", Options::default());
    let policy = env.policy(&["us-east-1a"], "");
    env.create(&env.policy_configmap(&policy));
    env.start_controller("r1", &[]);
    // A node of pool a10g, idle once its pod has finished.
    env.create(&gpu_pod("default", "short", &no_labels(), Some("5s")));
    let node = env.wait_for("the pod to run on a node of a10g", 3 * MIN, || {
        let v = env.get_json(&["get", "pod", "-n", "default", "short"]);
        v["spec"]["nodeName"].as_str().map(str::to_string)
    });
    let instance = env.wait_for("the instance", MIN, || env.live_instances().pop());
    env.wait_for("the pod to finish", 2 * MIN, || {
        (env.pod_phase("default", "short") == "Succeeded").then_some(())
    });

    // The pool is renamed by a reload: its node and instance are orphans, kept and reported.
    let renamed = policy.replace("- name: a10g", "- name: l4");
    assert_ne!(renamed, policy);
    env.apply(&env.policy_configmap(&renamed));
    let event = env.wait_for("a PoolOrphaned Event", MIN, || {
        env.events("PoolOrphaned").pop()
    });
    assert!(
        event.contains(&node) && event.contains("orphans: keep"),
        "{event}"
    );
    let status = env.wait_for("the status to list the orphan", MIN, || {
        let s = env.status_json();
        s["orphans"][&instance.0].is_object().then_some(s)
    });
    assert_eq!(status["orphans"][&instance.0]["pool"], "a10g", "{status}");
    assert_eq!(
        status["orphans"][&instance.0]["node"],
        node.as_str(),
        "{status}"
    );
    assert!(
        status["pools"]
            .as_array()
            .is_some_and(|p| p.iter().all(|p| p["name"] != "a10g")),
        "{status}"
    );
    // Well past the old pool's unneeded time (5 s) and several passes: still there.
    let from = last_pass(&env);
    env.wait_for("five passes", 2 * MIN, || {
        (last_pass(&env) >= from + 10.0).then_some(())
    });
    assert_eq!(env.live_instances().len(), 1, "the orphan was terminated");
    assert!(env.get_json(&["get", "nodes"])["items"]
        .as_array()
        .unwrap()
        .iter()
        .any(|n| n["metadata"]["name"] == node.as_str()));
    assert_eq!(env.events("PoolOrphaned").len(), 1, "reported once");

    // A new clusterName would lose them: refused, the last good policy stays in force.
    env.apply(&env.policy_configmap(&renamed.replace("clusterName: e2e", "clusterName: e2e-2")));
    let refused = env.wait_for("the clusterName change refused", MIN, || {
        env.events("PolicyInvalid")
            .into_iter()
            .find(|e| e.contains("clusterName changed"))
    });
    assert!(
        refused.contains("the last good policy stays in force"),
        "{refused}"
    );

    // With `orphans: drain` the node is drained and removed, and its instance terminated.
    env.apply(&env.policy_configmap(&format!("orphans: drain\n{renamed}")));
    env.wait_for("the orphan instance to be terminated", 3 * MIN, || {
        env.live_instances().is_empty().then_some(())
    });
    env.wait_for("the orphan node to be deleted", MIN, || {
        env.get_json(&["get", "nodes"])["items"]
            .as_array()
            .unwrap()
            .iter()
            .all(|n| n["metadata"]["name"] != node.as_str())
            .then_some(())
    });
    assert!(
        env.events("ScaleDown").iter().any(|e| e.starts_with(&node)),
        "{:?}",
        env.events("ScaleDown")
    );
}

#[test]
fn stall_a_cloud_listing_that_does_not_answer_is_given_up_and_the_loop_stays_alive() {
    let mut env = Env::start(
        "stall",
        Options {
            proxy: true,
            ..Options::default()
        },
    );
    env.create(&env.policy_configmap(&env.policy(&["us-east-1a"], "")));
    env.start_controller("r1", &[]);
    env.wait_for("a first pass", 2 * MIN, || {
        (last_pass(&env) > 0.0).then_some(())
    });
    // The next listing is held far longer than the liveness probe allows (60 s) and than the
    // SDK's own attempt time-out (60 s).
    let held = Duration::from_secs(120);
    env.proxy
        .as_ref()
        .unwrap()
        .hold_next("DescribeInstances", held);
    let timeouts = |env: &Env| {
        env.metric(
            "r1",
            "gpu_node_autoscaler_cloud_requests_total{provider=\"aws\",operation=\"list\",result=\"timeout\"}",
        )
        .unwrap_or(0.0)
    };
    // Polled while the call is held: the process stays alive throughout.
    let started = std::time::Instant::now();
    let mut timed_out = false;
    while started.elapsed() < Duration::from_secs(75) {
        assert_eq!(
            env.http_get("r1", "/healthz").map(|r| r.0),
            Some(200),
            "the loop stood still while the cloud did not answer:\n{}",
            env.log("r1")
        );
        timed_out |= timeouts(&env) >= 1.0;
        std::thread::sleep(Duration::from_secs(1));
    }
    assert!(timed_out, "no listing was given up:\n{}", env.log("r1"));
    let event = env.wait_for("a CloudCallTimedOut Event", MIN, || {
        env.events("CloudCallTimedOut").pop()
    });
    assert!(
        event.contains("list") && event.contains("did not answer within"),
        "{event}"
    );
    // Passes go on once the cloud answers: a pod still gets its node.
    env.create(&gpu_pod("default", "after-stall", &no_labels(), None));
    env.wait_for("the pod to run", 3 * MIN, || {
        (env.pod_phase("default", "after-stall") == "Running").then_some(())
    });
    assert_eq!(env.live_instances().len(), 1, "one launch");
}

#[test]
fn stall_a_pass_of_slow_but_answered_cloud_calls_keeps_healthz_passing() {
    let mut env = Env::start(
        "stall-slow",
        Options {
            proxy: true,
            ..Options::default()
        },
    );
    let (_sqs, url) = env.sqs_queue("gna-slow");
    let policy = format!(
        "interruptionQueue: {url}\n{}",
        env.policy(&["us-east-1a"], "")
    );
    env.create(&env.policy_configmap(&policy));
    // Prices read on every pass: the catalog is one of its calls.
    env.start_controller("r1", &["--price-refresh-interval", "1s"]);
    env.wait_for("a first pass", 2 * MIN, || {
        (last_pass(&env) > 0.0).then_some(())
    });
    // Every call answers, each within its own time-out (listing 20 s, catalog 30 s, the
    // queue's attempt 20 s), but one pass now takes over a minute: longer than /healthz allows
    // between two beats (60 s).
    let proxy = env.proxy.as_ref().unwrap();
    for (action, secs) in [
        ("DescribeInstances", 18),
        ("DescribeInstanceTypes", 14),
        ("DescribeSpotPriceHistory", 14),
        ("ReceiveMessage", 18),
    ] {
        proxy.hold_every(action, Duration::from_secs(secs));
    }
    let listed = proxy.calls_of("DescribeInstances");
    let passes_before = last_pass(&env);
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_secs(160) {
        assert_eq!(
            env.http_get("r1", "/healthz").map(|r| r.0),
            Some(200),
            "the loop counted as stuck while every call answered:\n{}",
            env.log("r1")
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    // Passes ran during the slow stretch (it cannot pass by doing nothing), and no call was
    // given up.
    assert!(
        proxy.calls_of("DescribeInstances") >= listed + 2,
        "listed {} times during the slow stretch",
        proxy.calls_of("DescribeInstances") - listed
    );
    assert!(last_pass(&env) > passes_before, "no pass ended");
    let timeouts = env
        .metric(
            "r1",
            "gpu_node_autoscaler_cloud_requests_total{provider=\"aws\",operation=\"list\",result=\"timeout\"}",
        )
        .unwrap_or(0.0);
    assert_eq!(timeouts, 0.0, "a listing was given up:\n{}", env.log("r1"));
    proxy.release();
    // Passes go on at speed: a pod gets its node.
    env.create(&gpu_pod("default", "after-slow", &no_labels(), None));
    env.wait_for("the pod to run", 3 * MIN, || {
        (env.pod_phase("default", "after-slow") == "Running").then_some(())
    });
}

/// Passes that reached a decision, as the leader counts them.
fn passes(env: &Env) -> f64 {
    env.metric("r1", "gpu_node_autoscaler_plan_duration_seconds_count")
        .unwrap_or(0.0)
}

#[test]
fn stall_interruption_queue_deletes_that_never_answer_hold_up_no_pass() {
    let mut env = Env::start(
        "stall-sqs",
        Options {
            proxy: true,
            ..Options::default()
        },
    );
    let (sqs, url) = env.sqs_queue("gna-stall");
    let policy = format!(
        "interruptionQueue: {url}\n{}",
        env.policy(&["us-east-1a"], "")
    );
    env.create(&env.policy_configmap(&policy));
    env.start_controller("r1", &[]);
    env.wait_for("a first pass", 2 * MIN, || {
        (passes(&env) > 0.0).then_some(())
    });
    // No DeleteMessage answers; each SQS call gives up only after 2 × 20 s of its own.
    let proxy = env.proxy.as_ref().unwrap();
    proxy.hold_every("DeleteMessage", Duration::from_secs(600));
    // Eight messages that are no notice (an instance starting), each deleted as soon as read:
    // one after the other, 8 × 40 s in one pass.
    for n in 0..8 {
        let body = format!(
            r#"{{"version":"0","id":"{n}","detail-type":"EC2 Instance State-change Notification","source":"aws.ec2","account":"123456789012","time":"2026-11-24T12:00:00Z","region":"us-east-1","resources":[],"detail":{{"instance-id":"i-0{n}","state":"running"}}}}"#
        );
        env.rt.block_on(async {
            sqs.send_message()
                .queue_url(&url)
                .message_body(body)
                .send()
                .await
                .expect("SendMessage");
        });
    }
    let before = passes(&env);
    env.create(&gpu_pod("default", "during-stall", &no_labels(), None));
    // Polled while every delete is held: the loop turns, passes end, the pod gets its node.
    let mut healthy_polls = 0;
    env.wait_for(
        "the pod to run and three passes while the deletes hang",
        5 * MIN,
        || {
            assert_eq!(
                env.http_get("r1", "/healthz").map(|r| r.0),
                Some(200),
                "the loop stood still on the interruption queue:\n{}",
                env.log("r1")
            );
            healthy_polls += 1;
            (env.pod_phase("default", "during-stall") == "Running" && passes(&env) >= before + 3.0)
                .then_some(())
        },
    );
    assert!(
        proxy.held_calls_of("DeleteMessage") >= 1,
        "no DeleteMessage was held"
    );
    let cut = env
        .metric(
            "r1",
            "gpu_node_autoscaler_cloud_requests_total{provider=\"aws\",operation=\"interruption_queue\",result=\"timeout\"}",
        )
        .unwrap_or(0.0);
    assert!(cut >= 1.0, "no queue budget ran out:\n{}", env.log("r1"));
    let event = env.wait_for("a CloudCallTimedOut Event", MIN, || {
        env.events("CloudCallTimedOut")
            .into_iter()
            .find(|e| e.contains("interruption queue"))
    });
    assert!(event.contains("passes go on"), "{event}");
    assert!(healthy_polls > 0);
    proxy.release();
    // Once SQS answers again, the messages are deleted.
    env.wait_for("the queue to be emptied", 3 * MIN, || {
        let left = env.rt.block_on(async {
            sqs.get_queue_attributes()
                .queue_url(&url)
                .attribute_names(
                    aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessages,
                )
                .attribute_names(
                    aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessagesNotVisible,
                )
                .send()
                .await
                .expect("GetQueueAttributes")
        });
        let n = |a| {
            left.attributes()
                .and_then(|m| m.get(&a))
                .and_then(|v| v.parse::<u32>().ok())
                .unwrap_or(1)
        };
        (n(aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessages)
            + n(aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
            == 0)
            .then_some(())
    });
}

#[test]
fn interrupt_drain_of_a_node_with_no_known_instance_evicts_its_pods_and_keeps_it_cordoned() {
    let mut env = Env::start("unknown-instance", Options::default());
    env.create(&env.policy_configmap(&env.policy(&["us-east-1a"], "")));
    // A Node of pool a10g being replaced for an interruption when the last leader stopped (its
    // taints and drain start say so), whose providerID names no instance of ours.
    let started = std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H:%M:%SZ"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap();
    env.create(&format!(
        r#"
apiVersion: v1
kind: Node
metadata:
  name: gone-gpu
  labels:
    gpu-node-autoscaler.io/pool: a10g
    node.kubernetes.io/instance-type: g5.xlarge
    topology.kubernetes.io/zone: us-east-1a
    kubernetes.io/hostname: gone-gpu
  annotations:
    kwok.x-k8s.io/node: fake
    gpu-node-autoscaler.io/drain-started: "{started}"
spec:
  providerID: aws:///us-east-1a/i-0123456789abcdef0
  unschedulable: true
  taints:
  - {{key: gpu-node-autoscaler.io/replacing, value: interrupted, effect: NoSchedule}}
  - {{key: gpu-node-autoscaler.io/to-be-deleted, value: "1", effect: NoSchedule}}
status:
  allocatable: {{cpu: "4", memory: 16Gi, pods: "110", nvidia.com/gpu: "1"}}
  capacity: {{cpu: "4", memory: 16Gi, pods: "110", nvidia.com/gpu: "1"}}
  conditions:
  - {{type: Ready, status: "True"}}
"#
    ));
    // A bare pod with an emptyDir on it: a voluntary drain would keep the node for it.
    env.create(
        r#"
apiVersion: v1
kind: Pod
metadata: {name: stranded, namespace: default}
spec:
  nodeName: gone-gpu
  terminationGracePeriodSeconds: 1
  tolerations:
  - {operator: Exists}
  containers:
  - name: main
    image: cuda:12
    resources: {requests: {cpu: "1", memory: 1Gi}}
    volumeMounts: [{name: shm, mountPath: /dev/shm}]
  volumes: [{name: shm, emptyDir: {medium: Memory}}]
"#,
    );
    env.wait_for("the pod to run", MIN, || {
        (env.pod_phase("default", "stranded") == "Running").then_some(())
    });
    env.start_controller("r1", &[]);
    let event = env.wait_for("an InstanceUnknown Event", 2 * MIN, || {
        env.events("InstanceUnknown").pop()
    });
    assert!(event.starts_with("gone-gpu: "), "{event}");
    env.wait_for("the pod to be evicted", MIN, || {
        let out = env.kubectl(&["get", "pod", "-n", "default", "stranded"]);
        (!out.status.success()).then_some(())
    });
    // Not given back: still cordoned and tainted, not deleted.
    let n = env.get_json(&["get", "node", "gone-gpu"]);
    assert_eq!(n["spec"]["unschedulable"], true, "{n}");
    assert!(
        n["spec"]["taints"]
            .to_string()
            .contains("gpu-node-autoscaler.io/to-be-deleted"),
        "{n}"
    );
    assert!(env.events("ScaleDownFailed").is_empty());
}

#[test]
fn overrun_a_gangs_partial_launch_is_given_back_not_kept_idle() {
    let mut env = Env::start(
        "gang-partial",
        Options {
            proxy: true,
            ..Options::default()
        },
    );
    // Spot only, so that the part of the gang spot cannot give has no other offering in the
    // same launch; the shortage is remembered 30 s.
    let policy = env
        .policy(&["us-east-1a"], "")
        .replace("capacityTypes: [spot, on-demand]", "capacityTypes: [spot]")
        .replace(
            "insufficientCapacityTtl: 3m",
            "insufficientCapacityTtl: 30s",
        );
    assert!(policy.contains("capacityTypes: [spot]\n"), "{policy}");
    env.create(&env.policy_configmap(&policy));
    // EC2 fills one of the gang's two spot instances.
    env.proxy.as_ref().unwrap().cap_spot(1);
    env.start_controller("r1", &[]);
    let proxy = env.proxy.as_ref().unwrap();
    let gang: std::collections::BTreeMap<&str, &str> = [
        ("pod-group.scheduling.sigs.k8s.io", "trainer"),
        ("pod-group.scheduling.sigs.k8s.io/min-available", "2"),
    ]
    .into();
    for w in ["worker-0", "worker-1"] {
        env.create(&gpu_pod("default", w, &gang, None));
    }
    let event = env.wait_for("the partial launch to be given back", 2 * MIN, || {
        env.events("NotTriggerScaleUp")
            .into_iter()
            .find(|e| e.contains("could not be launched whole"))
    });
    assert!(event.contains("1 instance(s) were given back"), "{event}");
    // The instance launched for half the gang was terminated, not kept waiting idle.
    env.wait_for("the given-back instance to be terminated", MIN, || {
        env.live_instances().is_empty().then_some(())
    });
    let launched = env.instances();
    assert!(!launched.is_empty());
    assert!(proxy.calls_of("TerminateInstances") >= 1);
    assert!(
        env.pool_nodes().is_empty(),
        "no node joined for half a gang"
    );
    for w in ["worker-0", "worker-1"] {
        assert_eq!(env.pod_phase("default", w), "Pending");
    }

    // Capacity comes back: the gang is launched again, whole, under a new launch.
    proxy.cap_spot(10);
    env.wait_for("the gang to run", 3 * MIN, || {
        ["worker-0", "worker-1"]
            .iter()
            .all(|w| env.pod_phase("default", w) == "Running")
            .then_some(())
    });
    let live: Vec<String> = env.live_instances().into_iter().map(|(id, _)| id).collect();
    assert_eq!(live.len(), 2, "{live:?}");
    assert!(
        live.iter()
            .all(|id| launched.iter().all(|(old, _)| old != id)),
        "a given-back instance came back: {live:?}"
    );
}

#[test]
fn failover_no_launch_is_sent_before_the_status_recording_it_is_written() {
    let mut env = Env::start("launch-record", Options::default());
    env.create(&env.policy_configmap(&env.policy(&["us-east-1a"], "")));
    env.start_controller("r1", &[]);
    env.wait_for("the first status", MIN, || {
        (!env.status_json().is_null()).then_some(())
    });
    // The status ConfigMap goes; the Role from deploy/ may not create it again, so a launch
    // could not be recorded before it is sent.
    env.kubectl_ok(&[
        "delete",
        "configmap",
        "-n",
        "kube-system",
        "gpu-node-autoscaler-status",
    ]);
    env.create(&gpu_pod("default", "train", &no_labels(), None));
    let refusals = |env: &Env| {
        env.log("r1")
            .matches("not launching: the status recording the launch was not written")
            .count()
    };
    env.wait_for("two passes that would launch", 2 * MIN, || {
        (refusals(&env) >= 2).then_some(())
    });
    assert!(
        env.instances().is_empty(),
        "launched without a record: {:?}",
        env.instances().iter().map(|i| &i.0).collect::<Vec<_>>()
    );
    env.wait_for("a LaunchNotRecorded Event", MIN, || {
        env.events("LaunchNotRecorded").pop()
    });
    assert!(
        env.metric(
            "r1",
            "gpu_node_autoscaler_failed_launches_total{pool=\"a10g\",reason=\"not_recorded\"}"
        )
        .unwrap_or(0.0)
            >= 2.0
    );
    // Back as deploy/ ships it: the launch is recorded, sent, and recorded as answered.
    env.create(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: gpu-node-autoscaler-status\n  \
         namespace: kube-system\n",
    );
    env.wait_for("train to run", 3 * MIN, || {
        (env.pod_phase("default", "train") == "Running").then_some(())
    });
    let ids: Vec<String> = env.instances().into_iter().map(|i| i.0).collect();
    assert_eq!(ids.len(), 1, "{ids:?}");
    env.wait_for("no launch left awaited in the status", MIN, || {
        let s = env.status_json();
        (!s.is_null() && s.get("launching").is_none()).then_some(())
    });
}
