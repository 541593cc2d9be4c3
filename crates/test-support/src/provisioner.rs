//! A stand-in for a CSI driver's external-provisioner (as the EBS CSI driver's would do it) on a
//! control plane whose Nodes run no CSI driver: every claim kube-scheduler selected a node for
//! (`volume.kubernetes.io/selected-node`, a `WaitForFirstConsumer` claim whose first pod was
//! scheduled) and that has no volume yet gets a PersistentVolume in that node's zone, pre-bound to
//! it; kube-controller-manager's PV controller then binds the claim and the scheduler binds the
//! pod. Used by the end-to-end tests and by the `anchors` harness, for every autoscaler alike.

use serde_json::{json, Value};

use crate::cluster::Cluster;

/// The zone label the volume's node affinity names.
const ZONE: &str = "topology.kubernetes.io/zone";

/// The PersistentVolume the provisioner makes for `claim` (a PersistentVolumeClaim as the API
/// returns it) in `zone`: named `pvc-<claim's uid>`, of the claim's class and size, attached by
/// the driver the PV controller named on the claim (`volume.kubernetes.io/storage-provisioner`,
/// the EBS CSI driver without it). `None` for a claim without a uid.
pub fn volume_for(claim: &Value, zone: &str) -> Option<Value> {
    let m = &claim["metadata"];
    let (ns, name, uid) = (
        m["namespace"].as_str()?,
        m["name"].as_str()?,
        m["uid"].as_str()?,
    );
    let driver = m["annotations"]["volume.kubernetes.io/storage-provisioner"]
        .as_str()
        .unwrap_or("ebs.csi.aws.com");
    let size = claim["spec"]["resources"]["requests"]["storage"]
        .as_str()
        .unwrap_or("1Gi");
    Some(json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": format!("pvc-{uid}"),
                     "annotations": {"pv.kubernetes.io/provisioned-by": driver}},
        "spec": {
            "capacity": {"storage": size},
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": claim["spec"]["storageClassName"],
            "persistentVolumeReclaimPolicy": "Delete",
            "claimRef": {"namespace": ns, "name": name, "uid": uid},
            "csi": {"driver": driver, "volumeHandle": format!("vol-{uid}")},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": ZONE, "operator": "In", "values": [zone]}
            ]}]}},
        },
    }))
}

/// The claims of `claims` (a List, of PersistentVolumeClaims among others) that wait for the provisioner: a
/// node selected, no volume yet. As (claim, selected node).
pub fn selected_claims(claims: &Value) -> Vec<(&Value, &str)> {
    claims["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["kind"] == "PersistentVolumeClaim")
        .filter(|c| {
            c["spec"]["volumeName"]
                .as_str()
                .is_none_or(|v| v.is_empty())
        })
        .filter_map(|c| {
            let node =
                c["metadata"]["annotations"]["volume.kubernetes.io/selected-node"].as_str()?;
            Some((c, node))
        })
        .collect()
}

/// One look of the provisioner at `cluster`: a volume for every claim that waits for one (see the
/// module). Returns how many it made.
pub fn provision_selected_claims(cluster: &Cluster) -> Result<usize, String> {
    let claims: Value =
        serde_json::from_str(&cluster.kubectl(&["get", "pvc", "-A", "-o", "json"])?)
            .map_err(|e| format!("kubectl get pvc: {e}"))?;
    let mut made = 0;
    for (claim, node) in selected_claims(&claims) {
        let n: Value =
            serde_json::from_str(&cluster.kubectl(&["get", "node", node, "-o", "json"])?)
                .map_err(|e| format!("kubectl get node {node}: {e}"))?;
        let Some(zone) = n["metadata"]["labels"][ZONE].as_str() else {
            return Err(format!("node {node} has no {ZONE} label"));
        };
        let Some(pv) = volume_for(claim, zone) else {
            continue;
        };
        let name = pv["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if cluster.kubectl(&["get", "pv", &name]).is_ok() {
            continue;
        }
        let f = cluster.dir.join(format!("{name}.json"));
        std::fs::write(&f, pv.to_string()).map_err(|e| format!("{}: {e}", f.display()))?;
        cluster.kubectl(&["create", "-f", f.to_str().unwrap_or_default()])?;
        made += 1;
    }
    Ok(made)
}
