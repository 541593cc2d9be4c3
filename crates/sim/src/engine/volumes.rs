//! Volumes in the simulated cluster: the pods carry their claims' rules (the core's
//! [`Storage::join`], as the controller's watch store joins them), so the scheduler binds a pod
//! only where its volumes allow; and the provisioner's part: a `WaitForFirstConsumer` claim gets
//! a PersistentVolume in the zone of the node its first consumer is bound to, as the CSI
//! driver's external-provisioner makes it on the scheduler's `volume.kubernetes.io/selected-node`.
//! The volume stays bound to the claim when the pod goes, so the claim's later pods (a
//! StatefulSet's pod made again, an evicted pod) go back to that zone.
//!
//! [`Storage::join`]: gpu_node_autoscaler_core::model::volumes::Storage::join

use gpu_node_autoscaler_core::model::constraints::{Operator, Requirement, Term};
use gpu_node_autoscaler_core::model::volumes::{Binding, Volume};

use super::{labels, World};

impl World {
    /// Joins every pod that has volumes with the storage as it is now.
    pub(super) fn join_volumes(&mut self) {
        if self.storage.claims.is_empty() {
            return;
        }
        for &i in &self.volume_pods {
            self.storage
                .join(std::slice::from_mut(&mut self.pods[i].pod));
        }
    }

    /// Pod `p` was bound to node `ni`: each of its claims that waits for its first consumer gets
    /// a volume in the node's zone, bound to it.
    pub(super) fn provision(&mut self, p: usize, ni: usize) {
        let zone = self.nodes[ni].node.labels.get(labels::ZONE).cloned();
        self.volume_binds.push((p, zone.clone()));
        let namespace = self.pods[p].pod.id.namespace.clone();
        let mut made = false;
        for v in &self.pods[p].pod.volumes {
            let key = format!("{namespace}/{}", v.claim);
            let Some(claim) = self.storage.claims.get(&key) else {
                continue;
            };
            if claim.volume.is_some()
                || self
                    .storage
                    .volumes
                    .values()
                    .any(|pv| pv.claim.as_deref() == Some(key.as_str()))
            {
                continue;
            }
            let Some(class) = claim
                .class
                .as_ref()
                .and_then(|c| self.storage.classes.get(c))
                .filter(|c| c.binding == Binding::WaitForFirstConsumer)
            else {
                continue;
            };
            let name = format!("pvc-{}-{}", claim.namespace, claim.name);
            let volume = Volume {
                name: name.clone(),
                claim: Some(key.clone()),
                node_affinity: zone.as_ref().map(|z| {
                    vec![Term {
                        requirements: vec![Requirement {
                            key: labels::ZONE.to_string(),
                            operator: Operator::In,
                            values: vec![z.clone()],
                        }],
                        node_names: None,
                    }]
                }),
                driver: Some(class.provisioner.clone()),
            };
            self.storage.volumes.insert(name.clone(), volume);
            if let Some(c) = self.storage.claims.get_mut(&key) {
                c.volume = Some(name);
            }
            made = true;
        }
        if made {
            self.join_volumes();
        }
    }
}
