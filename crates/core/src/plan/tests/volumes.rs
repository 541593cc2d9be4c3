//! Volume topology as the scheduler applies it (`crate::model::volumes`), through what `plan`
//! reads: a snapshot file with PersistentVolumeClaims, PersistentVolumes and StorageClasses.

use std::collections::BTreeSet;

use super::topology::THREE_ZONES;
use super::*;
use crate::convert::load_cluster_file;

/// A pending 1-GPU pod with one claim, as `kubectl get -o yaml` prints it.
fn claim_pod(name: &str, claim: &str) -> String {
    format!(
        r#"- apiVersion: v1
  kind: Pod
  metadata: {{name: {name}, namespace: ml, uid: u-{name}}}
  spec:
    containers:
    - name: main
      image: cuda
      resources: {{requests: {{nvidia.com/gpu: "1", cpu: "1", memory: 4Gi}}, limits: {{nvidia.com/gpu: "1"}}}}
    volumes:
    - name: data
      persistentVolumeClaim: {{claimName: {claim}}}
  status:
    phase: Pending
    conditions: [{{type: PodScheduled, status: "False", reason: Unschedulable}}]
"#
    )
}

const STORAGE: &str = r#"- apiVersion: v1
  kind: PersistentVolume
  metadata: {name: pv-checkpoints}
  spec:
    capacity: {storage: 100Gi}
    accessModes: [ReadWriteOnce]
    nodeAffinity:
      required:
        nodeSelectorTerms:
        - matchExpressions:
          - {key: topology.kubernetes.io/zone, operator: In, values: [us-east-1b]}
- apiVersion: v1
  kind: PersistentVolumeClaim
  metadata: {name: checkpoints, namespace: ml}
  spec: {storageClassName: gp3, volumeName: pv-checkpoints, accessModes: [ReadWriteOnce]}
- apiVersion: v1
  kind: PersistentVolumeClaim
  metadata: {name: cache, namespace: ml}
  spec: {storageClassName: gp3-c, accessModes: [ReadWriteOnce]}
- apiVersion: v1
  kind: PersistentVolumeClaim
  metadata: {name: scratch, namespace: ml}
  spec: {storageClassName: io2-immediate, accessModes: [ReadWriteOnce]}
- apiVersion: storage.k8s.io/v1
  kind: StorageClass
  metadata: {name: gp3}
  provisioner: ebs.csi.aws.com
  volumeBindingMode: WaitForFirstConsumer
- apiVersion: storage.k8s.io/v1
  kind: StorageClass
  metadata: {name: gp3-c}
  provisioner: ebs.csi.aws.com
  volumeBindingMode: WaitForFirstConsumer
  allowedTopologies:
  - matchLabelExpressions:
    - {key: topology.kubernetes.io/zone, values: [us-east-1c]}
- apiVersion: storage.k8s.io/v1
  kind: StorageClass
  metadata: {name: io2-immediate}
  provisioner: ebs.csi.aws.com
"#;

fn load(items: &str) -> Snapshot {
    let text = format!("apiVersion: v1\nkind: List\nitems:\n{items}");
    let loaded = load_cluster_file(&text, "cluster.yaml").unwrap();
    loaded.snapshot
}

#[test]
fn volume_zones_keep_each_pod_and_its_fallbacks_in_its_volumes_zone() {
    let with = load(&format!(
        "{}{}{}",
        claim_pod("trainer", "checkpoints"),
        claim_pod("server", "cache"),
        STORAGE
    ));
    // The same pods with their storage unknown: how the planner saw them before.
    let without = load(&format!(
        "{}{}",
        claim_pod("trainer", "checkpoints"),
        claim_pod("server", "cache")
    ));
    let before = run(&without, THREE_ZONES);
    let after = run(&with, THREE_ZONES);
    let zones = |plan: &Plan, pod: &str| -> BTreeSet<String> {
        plan.scale_ups
            .iter()
            .filter(|s| s.pods.iter().any(|p| p.key == format!("ml/{pod}")))
            .flat_map(|s| s.offerings.iter().map(|o| o.zone.clone()))
            .collect()
    };
    // Before, each could be launched in any zone (its fallbacks went across all three).
    assert!(zones(&before, "trainer").len() > 1, "{before:?}");
    // Now the bound volume's zone, and the class's allowed zone, with spot then on-demand there.
    assert_eq!(
        zones(&after, "trainer"),
        BTreeSet::from(["us-east-1b".to_string()])
    );
    assert_eq!(
        zones(&after, "server"),
        BTreeSet::from(["us-east-1c".to_string()])
    );
    assert!(after.unschedulable.is_empty(), "{:?}", after.unschedulable);
}

#[test]
fn volume_an_immediate_claim_not_yet_bound_gets_a_reason_and_no_launch() {
    let s = load(&format!("{}{}", claim_pod("eval", "scratch"), STORAGE));
    let plan = run(&s, THREE_ZONES);
    assert!(plan.scale_ups.is_empty(), "{:?}", plan.scale_ups);
    let u = plan
        .unschedulable
        .iter()
        .find(|u| u.pod == "ml/eval")
        .unwrap_or_else(|| panic!("{:?}", plan.unschedulable));
    assert!(
        u.reason
            .starts_with("waiting: its PersistentVolumeClaim ml/scratch is not bound yet")
            && !u.permanent,
        "{}",
        u.reason
    );
}

/// A Ready g5.12xlarge (4 GPUs) of pool a10g in us-east-1a, with a 1-GPU pod `first` running on
/// it whose claim is bound to an EBS volume, and a StorageClass `gp3` whose claims wait for
/// their first consumer.
const ONE_NODE_ONE_VOLUME: &str = r#"- apiVersion: v1
  kind: Node
  metadata:
    name: n1
    labels:
      gpu-node-autoscaler.io/pool: a10g
      node.kubernetes.io/instance-type: g5.12xlarge
      topology.kubernetes.io/zone: us-east-1a
      kubernetes.io/hostname: n1
  status:
    capacity: {cpu: "48", memory: 192Gi, pods: "110", nvidia.com/gpu: "4"}
    allocatable: {cpu: "47", memory: 180Gi, pods: "110", nvidia.com/gpu: "4"}
    conditions: [{type: Ready, status: "True"}]
- apiVersion: v1
  kind: Pod
  metadata: {name: first, namespace: ml, uid: u-first}
  spec:
    nodeName: n1
    containers:
    - name: main
      image: cuda
      resources: {requests: {nvidia.com/gpu: "1", cpu: "1", memory: 4Gi}, limits: {nvidia.com/gpu: "1"}}
    volumes:
    - name: data
      persistentVolumeClaim: {claimName: data-first}
  status: {phase: Running}
- apiVersion: v1
  kind: PersistentVolumeClaim
  metadata: {name: data-first, namespace: ml}
  spec: {storageClassName: gp3, volumeName: pv-first, accessModes: [ReadWriteOnce]}
- apiVersion: v1
  kind: PersistentVolume
  metadata: {name: pv-first}
  spec:
    capacity: {storage: 100Gi}
    accessModes: [ReadWriteOnce]
    claimRef: {namespace: ml, name: data-first}
    csi: {driver: ebs.csi.aws.com, volumeHandle: vol-first}
- apiVersion: storage.k8s.io/v1
  kind: StorageClass
  metadata: {name: gp3}
  provisioner: ebs.csi.aws.com
  volumeBindingMode: WaitForFirstConsumer
"#;

/// n1's CSINode: the EBS driver attaches at most `count` volumes there.
fn csi_node(count: u32) -> String {
    format!(
        r#"- apiVersion: storage.k8s.io/v1
  kind: CSINode
  metadata: {{name: n1}}
  spec:
    drivers:
    - {{name: ebs.csi.aws.com, nodeID: i-n1, allocatable: {{count: {count}}}}}
    - {{name: efs.csi.aws.com, nodeID: i-n1}}
"#
    )
}

/// An unbound claim of class gp3 for each name.
fn gp3_claims(names: &[&str]) -> String {
    names
        .iter()
        .map(|n| {
            format!(
                "- apiVersion: v1\n  kind: PersistentVolumeClaim\n  metadata: {{name: {n}, namespace: ml}}\n  \
                 spec: {{storageClassName: gp3, accessModes: [ReadWriteOnce]}}\n"
            )
        })
        .collect()
}

#[test]
fn volume_attach_limit_a_node_at_its_csi_limit_takes_no_pod_with_another_volume() {
    let pods = format!(
        "{ONE_NODE_ONE_VOLUME}{}{}",
        gp3_claims(&["data-second"]),
        claim_pod("second", "data-second")
    );
    // Without the CSINode (as the planner saw it before it read attach limits): the pod fits
    // n1's three free GPUs, where kube-scheduler's NodeVolumeLimits would refuse it.
    let before = run(&load(&pods), THREE_ZONES);
    assert_eq!(
        targets(&before).get("ml/second"),
        Some(&"n1"),
        "{before:#?}"
    );
    let after = run(&load(&format!("{pods}{}", csi_node(1))), THREE_ZONES);
    assert!(targets(&after).is_empty(), "{after:#?}");
    assert_eq!(
        after.scale_ups.iter().map(|s| s.count).sum::<u32>(),
        1,
        "{after:#?}"
    );
    // Room for a second volume: n1 again.
    let roomy = run(&load(&format!("{pods}{}", csi_node(2))), THREE_ZONES);
    assert_eq!(targets(&roomy).get("ml/second"), Some(&"n1"), "{roomy:#?}");
}

#[test]
fn volume_attach_limit_counts_a_volume_two_pods_share_once() {
    // `second` mounts the volume `first` already attached on n1: no new attachment there.
    let pods = format!("{ONE_NODE_ONE_VOLUME}{}", claim_pod("second", "data-first"));
    let plan = run(&load(&format!("{pods}{}", csi_node(1))), THREE_ZONES);
    assert_eq!(targets(&plan).get("ml/second"), Some(&"n1"), "{plan:#?}");
}

#[test]
fn volume_attach_limit_of_an_instance_type_holds_for_its_nodes_not_launched_yet() {
    // Two pending pods with a volume each, n1 full: g5.12xlarge nodes attach one EBS volume (as
    // n1's CSINode says), so two new nodes, not one 4-GPU node for both.
    let only_big = THREE_ZONES.replace("[g5.xlarge, g5.12xlarge]", "[g5.12xlarge]");
    let pods = format!(
        "{ONE_NODE_ONE_VOLUME}{}{}{}",
        gp3_claims(&["data-a", "data-b"]),
        claim_pod("a", "data-a"),
        claim_pod("b", "data-b")
    );
    let new_nodes = |plan: &Plan| plan.scale_ups.iter().map(|s| s.count).sum::<u32>();
    let before = run(&load(&format!("{pods}{}", csi_node(3))), &only_big);
    assert_eq!(new_nodes(&before), 0, "n1 holds both: {before:#?}");
    let after = run(&load(&format!("{pods}{}", csi_node(1))), &only_big);
    assert_eq!(new_nodes(&after), 2, "{after:#?}");
    assert!(after
        .scale_ups
        .iter()
        .all(|s| s.pods_per_node.iter().all(|&n| n == 1)));
}
