//! Volume topology, as kube-scheduler's `VolumeBinding`, `VolumeZone` and `VolumeRestrictions`
//! apply it: where a pod's PersistentVolumeClaims let it run.
//!
//! - A claim bound to a PersistentVolume: the volume's `nodeAffinity` (a zonal EBS volume's zone,
//!   a local volume's node, any label).
//! - An unbound claim of a `WaitForFirstConsumer` StorageClass: the class's `allowedTopologies`
//!   (the volume is provisioned where the pod lands, so only there).
//! - An unbound claim of an `Immediate` class: the pod waits for the binding, so it gets a reason,
//!   not a node.
//! - A `ReadWriteOncePod` claim another pod uses: the pod cannot run anywhere until that pod goes.
//!
//! - Per-node attach limits (`NodeVolumeLimits`): a CSI driver's `allocatable.count` in a node's
//!   CSINode caps the distinct volumes of that driver its pods use. A pod's volumes of a limited
//!   driver become [`Attachment`]s of its cross-node rules, checked per node like host ports
//!   ([`crate::model::topology`]); a node not launched yet has the limit its instance type's
//!   registered nodes publish ([`AttachLimits`]).
//!
//! The claims' rules join the pod's own node affinity as more required terms ([`Constraints::volumes`]):
//! every check of a pod against a node or a template (planner, scale-down, consolidation, the
//! simulator's scheduler) then applies them. Pure: objects in, pods changed.

use crate::hash::HashMap;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::constraints::{Constraints, Term};
use super::pod::Pod;
use super::topology::Attachment;

/// One volume of a pod that comes from a PersistentVolumeClaim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodVolume {
    /// The claim's name in the pod's namespace.
    pub claim: String,
    /// A generic ephemeral volume: the claim is created for the pod (`<pod>-<volume>`), from a
    /// template whose StorageClass is known before it exists.
    pub ephemeral_class: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Binding {
    Immediate,
    WaitForFirstConsumer,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StorageClass {
    pub name: String,
    /// `provisioner`: the CSI driver its volumes are attached by.
    pub provisioner: String,
    pub binding: Binding,
    /// `allowedTopologies`, as node selector terms (any one holds). `None`: anywhere.
    pub allowed: Option<Vec<Term>>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    pub namespace: String,
    pub name: String,
    pub class: Option<String>,
    /// `spec.volumeName`: the PersistentVolume it is (being) bound to.
    pub volume: Option<String>,
    pub read_write_once_pod: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Volume {
    pub name: String,
    /// `spec.claimRef` (`namespace/name`): the claim it is reserved for (a pre-bound volume),
    /// which the binder gives it even before the claim names it.
    pub claim: Option<String>,
    /// `spec.nodeAffinity.required`: node selector terms (any one holds). `None`: anywhere.
    pub node_affinity: Option<Vec<Term>>,
    /// `spec.csi.driver`: the CSI driver that attaches it; `None` for other volume sources.
    pub driver: Option<String>,
}

/// The CSI drivers' attach limits: per node, as its CSINode publishes them
/// (`spec.drivers[].allocatable.count`), driver → volumes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AttachLimits {
    pub by_node: BTreeMap<String, BTreeMap<String, u32>>,
}

impl AttachLimits {
    /// The drivers some node limits.
    pub fn drivers(&self) -> BTreeSet<String> {
        self.by_node
            .values()
            .flat_map(|d| d.keys().cloned())
            .collect()
    }

    /// Per instance type, the limits its registered nodes publish (the lowest where they differ):
    /// what a node of that type not launched yet will have.
    pub fn by_instance_type(
        &self,
        nodes: &[super::Node],
    ) -> HashMap<String, BTreeMap<String, u32>> {
        let mut out: HashMap<String, BTreeMap<String, u32>> = HashMap::default();
        for n in nodes {
            let (Some(t), Some(limits)) = (n.instance_type(), self.by_node.get(&n.name)) else {
                continue;
            };
            let e = out.entry(t.to_string()).or_default();
            for (driver, &count) in limits {
                e.entry(driver.clone())
                    .and_modify(|c| *c = (*c).min(count))
                    .or_insert(count);
            }
        }
        out
    }
}

/// The cluster's claims, volumes and classes, by key (`namespace/name` for claims).
#[derive(Clone, Debug, Default)]
pub struct Storage {
    /// The claims are all known (a watch of every PersistentVolumeClaim, or a snapshot that lists
    /// some): a claim missing from them does not exist yet. A snapshot without claims plans
    /// their pods as if their volumes could be anywhere.
    pub complete: bool,
    pub claims: BTreeMap<String, Claim>,
    pub volumes: BTreeMap<String, Volume>,
    pub classes: BTreeMap<String, StorageClass>,
    /// The CSI drivers some node's CSINode limits: a pod's volumes of these are attachments.
    pub limited_drivers: BTreeSet<String>,
}

/// What one claim does to the pods that use it.
enum Rule {
    Anywhere,
    Within(Vec<Term>),
    Waits(String),
}

impl Storage {
    fn rule(&self, namespace: &str, v: &PodVolume) -> Rule {
        let key = format!("{namespace}/{}", v.claim);
        let Some(claim) = self.claims.get(&key) else {
            // An ephemeral volume's claim is created with the pod, from its template.
            return match &v.ephemeral_class {
                Some(class) => self.unbound(&key, Some(class)),
                None if self.complete => {
                    Rule::Waits(format!("its PersistentVolumeClaim {key} does not exist"))
                }
                None => Rule::Anywhere,
            };
        };
        match &claim.volume {
            Some(pv) => match self.volumes.get(pv) {
                Some(Volume {
                    node_affinity: Some(terms),
                    ..
                }) => Rule::Within(terms.clone()),
                // Bound to a volume we do not see, or one without affinity: anywhere.
                _ => Rule::Anywhere,
            },
            None => match self
                .volumes
                .values()
                .find(|v| v.claim.as_deref() == Some(&key))
            {
                // Reserved for this claim: it will be bound there.
                Some(Volume {
                    node_affinity: Some(terms),
                    ..
                }) => Rule::Within(terms.clone()),
                Some(_) => Rule::Anywhere,
                None => self.unbound(&key, claim.class.as_deref()),
            },
        }
    }

    /// The volume a pod's claim attaches on its node, when its driver is limited: the bound
    /// (or reserved) PersistentVolume, or for a claim not bound yet the claim itself, attached
    /// by its class's provisioner (as kube-scheduler counts it).
    fn attachment(&self, namespace: &str, v: &PodVolume) -> Option<Attachment> {
        let key = format!("{namespace}/{}", v.claim);
        let claim = self.claims.get(&key);
        let bound = claim
            .and_then(|c| c.volume.as_ref())
            .and_then(|pv| self.volumes.get(pv))
            .or_else(|| {
                self.volumes
                    .values()
                    .find(|pv| pv.claim.as_deref() == Some(key.as_str()))
            });
        let (driver, volume) = match bound {
            Some(pv) => (pv.driver.clone()?, pv.name.clone()),
            None => {
                let class = claim
                    .and_then(|c| c.class.as_deref())
                    .or(v.ephemeral_class.as_deref())?;
                (self.classes.get(class)?.provisioner.clone(), key)
            }
        };
        self.limited_drivers
            .contains(&driver)
            .then_some(Attachment { driver, volume })
    }

    fn unbound(&self, key: &str, class: Option<&str>) -> Rule {
        match class.and_then(|c| self.classes.get(c)) {
            Some(StorageClass {
                binding: Binding::Immediate,
                name,
                ..
            }) => Rule::Waits(format!(
                "its PersistentVolumeClaim {key} is not bound yet (StorageClass {name} binds \
                 Immediately: the volume is made before the pod is scheduled)"
            )),
            Some(StorageClass {
                allowed: Some(terms),
                ..
            }) => Rule::Within(terms.clone()),
            _ => Rule::Anywhere,
        }
    }

    /// Joins the pods with their claims: each pod's constraints gain its volumes' node terms,
    /// and a pending pod whose claim keeps it from every node gets that as its problem.
    pub fn join(&self, pods: &mut [Pod]) {
        // Who uses each ReadWriteOncePod claim (pods that hold it: bound and not finished).
        let mut holders: HashMap<String, String> = HashMap::default();
        for p in pods.iter() {
            if p.volumes.is_empty() || !p.is_bound_active() {
                continue;
            }
            for v in &p.volumes {
                let key = format!("{}/{}", p.id.namespace, v.claim);
                if self.claims.get(&key).is_some_and(|c| c.read_write_once_pod) {
                    holders.insert(key, p.id.to_string());
                }
            }
        }
        let mut interned: HashMap<Constraints, Arc<Constraints>> = HashMap::default();
        for p in pods.iter_mut() {
            if p.volumes.is_empty() {
                continue;
            }
            let mut terms = Vec::new();
            let mut attachments = Vec::new();
            for v in &p.volumes {
                if !self.limited_drivers.is_empty() {
                    if let Some(a) = self.attachment(&p.id.namespace, v) {
                        if !attachments.contains(&a) {
                            attachments.push(a);
                        }
                    }
                }
                match self.rule(&p.id.namespace, v) {
                    Rule::Anywhere => {}
                    Rule::Within(t) => terms.push(t),
                    Rule::Waits(why) => {
                        if p.is_pending() {
                            p.waiting.get_or_insert(why);
                        }
                    }
                }
                let key = format!("{}/{}", p.id.namespace, v.claim);
                if p.is_pending() {
                    if let Some(holder) = holders.get(&key) {
                        p.waiting.get_or_insert(format!(
                            "its ReadWriteOncePod PersistentVolumeClaim {key} is in use by pod {holder}"
                        ));
                    }
                }
            }
            if terms.is_empty() && attachments.is_empty() {
                continue;
            }
            let mut c = (*p.constraints).clone();
            if !terms.is_empty() {
                c.volumes = terms;
            }
            if !attachments.is_empty() {
                attachments.sort();
                let mut t = c.topology.as_deref().cloned().unwrap_or_default();
                t.attachments = attachments;
                c.topology = Some(Arc::new(t));
            }
            p.constraints = interned
                .entry(c.clone())
                .or_insert_with(|| Arc::new(c))
                .clone();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use super::*;
    use crate::model::constraints::{Operator, Requirement};

    fn zone_terms(zones: &[&str]) -> Vec<Term> {
        vec![Term {
            requirements: vec![Requirement {
                key: "topology.kubernetes.io/zone".into(),
                operator: Operator::In,
                values: zones.iter().map(|z| z.to_string()).collect(),
            }],
            node_names: None,
        }]
    }

    fn pod(name: &str, claims: &[&str], node: Option<&str>) -> Pod {
        let mut b = crate::fixtures::PodBuilder::new("ml", name);
        if let Some(n) = node {
            b = b.on(n);
        }
        let mut p = b.build();
        p.volumes = claims
            .iter()
            .map(|c| PodVolume {
                claim: c.to_string(),
                ephemeral_class: None,
            })
            .collect();
        p
    }

    fn zone(z: &str) -> BTreeMap<String, String> {
        [("topology.kubernetes.io/zone".to_string(), z.to_string())].into()
    }

    fn storage() -> Storage {
        let claim = |name: &str, class: &str, volume: Option<&str>, rwop: bool| {
            (
                format!("ml/{name}"),
                Claim {
                    namespace: "ml".into(),
                    name: name.into(),
                    class: Some(class.into()),
                    volume: volume.map(str::to_string),
                    read_write_once_pod: rwop,
                },
            )
        };
        Storage {
            complete: true,
            claims: [
                claim("bound-b", "gp3", Some("pv-b"), false),
                claim("wffc", "gp3-c", None, false),
                claim("immediate", "fast", None, false),
                claim("rwop", "gp3", Some("pv-any"), true),
            ]
            .into(),
            volumes: [
                (
                    "pv-b".to_string(),
                    Volume {
                        name: "pv-b".into(),
                        claim: None,
                        node_affinity: Some(zone_terms(&["us-east-1b"])),
                        driver: Some("ebs.csi.aws.com".into()),
                    },
                ),
                (
                    "pv-any".to_string(),
                    Volume {
                        name: "pv-any".into(),
                        claim: None,
                        node_affinity: None,
                        driver: Some("ebs.csi.aws.com".into()),
                    },
                ),
            ]
            .into(),
            classes: [
                (
                    "gp3".to_string(),
                    StorageClass {
                        name: "gp3".into(),
                        provisioner: "ebs.csi.aws.com".into(),
                        binding: Binding::WaitForFirstConsumer,
                        allowed: None,
                    },
                ),
                (
                    "gp3-c".to_string(),
                    StorageClass {
                        name: "gp3-c".into(),
                        provisioner: "ebs.csi.aws.com".into(),
                        binding: Binding::WaitForFirstConsumer,
                        allowed: Some(zone_terms(&["us-east-1c"])),
                    },
                ),
                (
                    "fast".to_string(),
                    StorageClass {
                        name: "fast".into(),
                        provisioner: "ebs.csi.aws.com".into(),
                        binding: Binding::Immediate,
                        allowed: None,
                    },
                ),
            ]
            .into(),
            limited_drivers: BTreeSet::new(),
        }
    }

    #[test]
    fn volume_a_bound_claim_keeps_its_pod_in_the_volumes_zone() {
        let mut pods = vec![pod("p", &["bound-b"], None)];
        storage().join(&mut pods);
        let c = &pods[0].constraints;
        assert!(c.matches_node(&zone("us-east-1b"), None));
        assert!(!c.matches_node(&zone("us-east-1a"), None));
        assert!(pods[0].waiting.is_none());
    }

    #[test]
    fn volume_a_claim_a_volume_is_reserved_for_follows_that_volume_before_it_is_bound() {
        let mut s = storage();
        s.claims.insert(
            "ml/data-web-0".into(),
            Claim {
                namespace: "ml".into(),
                name: "data-web-0".into(),
                class: Some("manual".into()),
                volume: None,
                read_write_once_pod: false,
            },
        );
        s.volumes.insert(
            "pv-reserved".into(),
            Volume {
                name: "pv-reserved".into(),
                claim: Some("ml/data-web-0".into()),
                node_affinity: Some(zone_terms(&["us-east-1c"])),
                driver: Some("ebs.csi.aws.com".into()),
            },
        );
        let mut pods = vec![pod("web-0", &["data-web-0"], None)];
        s.join(&mut pods);
        assert!(pods[0].constraints.matches_node(&zone("us-east-1c"), None));
        assert!(!pods[0].constraints.matches_node(&zone("us-east-1a"), None));
    }

    #[test]
    fn volume_a_wait_for_first_consumer_claim_keeps_its_pod_in_the_allowed_topologies() {
        let mut pods = vec![pod("p", &["wffc", "bound-b"], None)];
        storage().join(&mut pods);
        // Both volumes' rules hold at once: no zone is both b and c.
        let c = &pods[0].constraints;
        assert!(!c.matches_node(&zone("us-east-1b"), None));
        assert!(!c.matches_node(&zone("us-east-1c"), None));
        let mut pods = vec![pod("p", &["wffc"], None)];
        storage().join(&mut pods);
        assert!(pods[0].constraints.matches_node(&zone("us-east-1c"), None));
        assert!(!pods[0].constraints.matches_node(&zone("us-east-1a"), None));
    }

    #[test]
    fn volume_an_immediate_unbound_or_missing_claim_is_a_reason_not_a_launch() {
        let mut pods = vec![pod("p", &["immediate"], None), pod("q", &["nope"], None)];
        storage().join(&mut pods);
        let why = pods[0].waiting.as_deref().unwrap();
        assert!(
            why.contains("ml/immediate is not bound yet") && why.contains("Immediately"),
            "{why}"
        );
        assert!(pods[1]
            .waiting
            .as_deref()
            .unwrap()
            .contains("ml/nope does not exist"));
    }

    #[test]
    fn volume_a_read_write_once_pod_claim_in_use_keeps_a_second_pod_off_every_node() {
        let mut pods = vec![
            pod("holder", &["rwop"], Some("n1")),
            pod("second", &["rwop"], None),
        ];
        storage().join(&mut pods);
        assert!(pods[0].waiting.is_none());
        let why = pods[1].waiting.as_deref().unwrap();
        assert!(why.contains("in use by pod ml/holder"), "{why}");
    }

    #[test]
    fn volume_an_ephemeral_claim_not_yet_created_follows_its_templates_class() {
        let mut p = pod("p", &[], None);
        p.volumes = vec![PodVolume {
            claim: "p-scratch".into(),
            ephemeral_class: Some("gp3-c".into()),
        }];
        let mut pods = vec![p];
        storage().join(&mut pods);
        assert!(pods[0].waiting.is_none());
        assert!(pods[0].constraints.matches_node(&zone("us-east-1c"), None));
        assert!(!pods[0].constraints.matches_node(&zone("us-east-1b"), None));
    }
}
