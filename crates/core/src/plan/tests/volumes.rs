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
