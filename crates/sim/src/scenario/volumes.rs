//! A scenario's volumes: its StorageClasses, its static PersistentVolumes and the claims of its
//! pod groups (a named claim, or per-replica claims as a StatefulSet's `volumeClaimTemplates`
//! make them). Each is written as the Kubernetes object a cluster would hold and read through
//! the core's conversion, so the pods are joined with them as `plan` and the controller join
//! theirs ([`Storage::join`]).

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{json, Value};

use gpu_node_autoscaler_core::convert::Converter;
use gpu_node_autoscaler_core::model::labels::ZONE;
use gpu_node_autoscaler_core::model::quantity::parse_quantity;
use gpu_node_autoscaler_core::model::volumes::Storage;
use gpu_node_autoscaler_core::policy::source_map::PathSeg;

use super::{i, k, Errs};

/// The namespace of the scenario's pods, and so of their claims.
const NAMESPACE: &str = "sim";

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct RawStorageClass {
    name: String,
    /// The CSI driver that provisions and attaches its volumes (`ebs.csi.aws.com`).
    provisioner: String,
    /// `WaitForFirstConsumer` or `Immediate`.
    volume_binding_mode: String,
    /// The zones of its `allowedTopologies` (none: any zone).
    #[serde(default)]
    allowed_zones: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct RawPersistentVolume {
    name: String,
    zone: String,
    storage_class: String,
    size: String,
}

/// One volume of a pod group: `claim` (one claim all its pods share, bound to the static
/// `volume` or provisioned by a `WaitForFirstConsumer` `storageClass`) or `template` (a claim per
/// replica, `<template>-<job>-<group>-<replica>`, provisioned by `storageClass`).
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct RawPodVolume {
    claim: Option<String>,
    template: Option<String>,
    volume: Option<String>,
    storage_class: Option<String>,
    size: Option<String>,
}

struct Class {
    provisioner: String,
    wait_for_first_consumer: bool,
}

struct StaticVolume {
    zone: String,
    class: String,
    size: String,
    /// The claim it is bound to (`namespace/name`).
    claim: Option<String>,
}

/// Where a claim's volume comes from: a static volume, or a class with a size.
#[derive(Clone, PartialEq, Eq, Debug)]
enum Source {
    Volume(String),
    Class(String, String),
}

/// A pod group's volume, checked: its name in the pod, per replica or not, and its source.
pub(super) struct GroupVolume {
    name: String,
    per_replica: bool,
    source: Source,
}

/// The scenario's storage while parsing: what it declares and the claims its pods name.
pub(super) struct Volumes {
    classes: BTreeMap<String, Class>,
    class_objects: Vec<Value>,
    statics: BTreeMap<String, StaticVolume>,
    /// Claim name → its source, in the order they were first named.
    claims: BTreeMap<String, Source>,
    claim_order: Vec<String>,
}

fn valid_size(s: &str) -> bool {
    parse_quantity(s).is_ok_and(|q| !q.is_negative() && !q.is_zero())
}

impl Volumes {
    /// Checks the StorageClasses and PersistentVolumes (their zones against the policy's when it
    /// parsed).
    pub(super) fn new(
        raw_classes: &[RawStorageClass],
        raw_volumes: &[RawPersistentVolume],
        zones: Option<&[String]>,
        errs: &mut Errs,
    ) -> Volumes {
        let mut v = Volumes {
            classes: BTreeMap::new(),
            class_objects: Vec::new(),
            statics: BTreeMap::new(),
            claims: BTreeMap::new(),
            claim_order: Vec::new(),
        };
        let zones = zones.filter(|z| !z.is_empty());
        let unknown_zone = |z: &str| zones.is_some_and(|zs| !zs.iter().any(|x| x == z));
        let zone_list = || zones.unwrap_or_default().join(", ");
        for (ci, c) in raw_classes.iter().enumerate() {
            let at = |f: &str| vec![k("storageClasses"), i(ci), k(f)];
            if c.name.is_empty() || v.classes.contains_key(&c.name) {
                errs.at(
                    &at("name"),
                    format!("{:?}: a StorageClass's name is given and unique", c.name),
                );
                continue;
            }
            if c.provisioner.is_empty() {
                errs.at(&at("provisioner"), "names the CSI driver (ebs.csi.aws.com)");
            }
            let wffc = match c.volume_binding_mode.as_str() {
                "WaitForFirstConsumer" => true,
                "Immediate" => false,
                other => {
                    errs.at(
                        &at("volumeBindingMode"),
                        format!("unknown {other:?} (expected WaitForFirstConsumer or Immediate)"),
                    );
                    continue;
                }
            };
            for (zi, z) in c.allowed_zones.iter().enumerate() {
                if unknown_zone(z) {
                    errs.at(
                        &[k("storageClasses"), i(ci), k("allowedZones"), i(zi)],
                        format!("{z:?} is not one of the policy's zones ({})", zone_list()),
                    );
                }
            }
            let mut object = json!({
                "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                "metadata": {"name": c.name},
                "provisioner": c.provisioner,
                "volumeBindingMode": c.volume_binding_mode,
            });
            if !c.allowed_zones.is_empty() {
                object["allowedTopologies"] = json!([{"matchLabelExpressions": [
                    {"key": ZONE, "values": c.allowed_zones}
                ]}]);
            }
            v.class_objects.push(object);
            v.classes.insert(
                c.name.clone(),
                Class {
                    provisioner: c.provisioner.clone(),
                    wait_for_first_consumer: wffc,
                },
            );
        }
        for (vi, pv) in raw_volumes.iter().enumerate() {
            let at = |f: &str| vec![k("persistentVolumes"), i(vi), k(f)];
            if pv.name.is_empty() || v.statics.contains_key(&pv.name) {
                errs.at(
                    &at("name"),
                    format!(
                        "{:?}: a PersistentVolume's name is given and unique",
                        pv.name
                    ),
                );
                continue;
            }
            if pv.zone.is_empty() || unknown_zone(&pv.zone) {
                errs.at(
                    &at("zone"),
                    format!(
                        "{:?} is not one of the policy's zones ({})",
                        pv.zone,
                        zone_list()
                    ),
                );
            }
            if !v.classes.contains_key(&pv.storage_class) {
                errs.at(
                    &at("storageClass"),
                    format!("no StorageClass {:?} in storageClasses", pv.storage_class),
                );
            }
            if !valid_size(&pv.size) {
                errs.at(
                    &at("size"),
                    format!("{:?} is not a positive quantity (100Gi)", pv.size),
                );
            }
            v.statics.insert(
                pv.name.clone(),
                StaticVolume {
                    zone: pv.zone.clone(),
                    class: pv.storage_class.clone(),
                    size: pv.size.clone(),
                    claim: None,
                },
            );
        }
        v
    }

    /// Checks a pod group's volumes (`at`: the group's path); `None` when one is wrong.
    pub(super) fn group(
        &self,
        raw: &[RawPodVolume],
        group_at: &[PathSeg],
        errs: &mut Errs,
    ) -> Option<Vec<GroupVolume>> {
        let mut out = Vec::new();
        let before = errs.out.len();
        for (vi, r) in raw.iter().enumerate() {
            let entry = [group_at, &[k("volumes"), i(vi)]].concat();
            let at = |f: &str| [&entry[..], &[k(f)]].concat();
            let (name, per_replica) = match (&r.claim, &r.template) {
                (Some(c), None) => (c, false),
                (None, Some(t)) => (t, true),
                _ => {
                    errs.at(
                        &entry,
                        "a volume is exactly one of claim (one claim the group's pods share) and \
                         template (a claim per replica)",
                    );
                    continue;
                }
            };
            if name.is_empty() {
                errs.at(
                    &at(if per_replica { "template" } else { "claim" }),
                    "needs a name",
                );
                continue;
            }
            let source = match (&r.volume, &r.storage_class) {
                (Some(pv), None) if !per_replica => {
                    if !self.statics.contains_key(pv) {
                        errs.at(
                            &at("volume"),
                            format!("no PersistentVolume {pv:?} in persistentVolumes"),
                        );
                        continue;
                    }
                    if r.size.is_some() {
                        errs.at(
                            &at("size"),
                            "a claim of a static volume has its volume's size",
                        );
                        continue;
                    }
                    Source::Volume(pv.clone())
                }
                (Some(_), None) => {
                    errs.at(
                        &at("volume"),
                        "a template's claims are provisioned, one per replica: give its \
                         storageClass, not a volume",
                    );
                    continue;
                }
                (None, Some(class)) => {
                    match self.classes.get(class) {
                        None => {
                            errs.at(
                                &at("storageClass"),
                                format!("no StorageClass {class:?} in storageClasses"),
                            );
                            continue;
                        }
                        Some(c) if !c.wait_for_first_consumer => {
                            errs.at(
                                &at("storageClass"),
                                format!(
                                    "StorageClass {class:?} binds Immediately: its volumes are \
                                     made before the pod is scheduled, in a zone the scenario \
                                     does not know (use a WaitForFirstConsumer class, or a static \
                                     volume)"
                                ),
                            );
                            continue;
                        }
                        Some(_) => {}
                    }
                    let Some(size) = &r.size else {
                        errs.at(&at("size"), "a provisioned claim needs its size (100Gi)");
                        continue;
                    };
                    if !valid_size(size) {
                        errs.at(
                            &at("size"),
                            format!("{size:?} is not a positive quantity (100Gi)"),
                        );
                        continue;
                    }
                    Source::Class(class.clone(), size.clone())
                }
                _ => {
                    errs.at(
                        &entry,
                        "a volume's claim is bound to a static volume or provisioned by a \
                         storageClass: exactly one of the two",
                    );
                    continue;
                }
            };
            if out.iter().any(|g: &GroupVolume| &g.name == name) {
                errs.at(
                    &at(if per_replica { "template" } else { "claim" }),
                    format!("{name:?} twice in the group"),
                );
                continue;
            }
            out.push(GroupVolume {
                name: name.clone(),
                per_replica,
                source,
            });
        }
        (errs.out.len() == before).then_some(out)
    }

    /// The volumes of replica `replica` of the StatefulSet-like set `set` (`<job>-<group>`) as
    /// (volume name, claim name), its claims recorded; an error (at `at`, the group's volumes)
    /// when a claim of that name was declared otherwise, or a static volume is claimed twice.
    pub(super) fn claims_of(
        &mut self,
        group: &[GroupVolume],
        set: &str,
        replica: u32,
        at: &[PathSeg],
        errs: &mut Errs,
    ) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for (vi, g) in group.iter().enumerate() {
            let claim = if g.per_replica {
                format!("{}-{set}-{replica}", g.name)
            } else {
                g.name.clone()
            };
            let field = if g.per_replica { "template" } else { "claim" };
            let at = [at, &[k("volumes"), i(vi), k(field)]].concat();
            match self.claims.get(&claim) {
                Some(s) if *s != g.source => {
                    errs.at(
                        &at,
                        format!(
                            "claim {claim:?} is declared twice, from different volumes or classes"
                        ),
                    );
                    continue;
                }
                Some(_) => {}
                None => {
                    if let Source::Volume(pv) = &g.source {
                        let key = format!("{NAMESPACE}/{claim}");
                        let st = self.statics.get_mut(pv).expect("checked in group()");
                        match &st.claim {
                            Some(other) if *other != key => {
                                errs.at(
                                    &at,
                                    format!(
                                        "PersistentVolume {pv:?} is claimed by {other} already"
                                    ),
                                );
                                continue;
                            }
                            _ => st.claim = Some(key),
                        }
                    }
                    self.claims.insert(claim.clone(), g.source.clone());
                    self.claim_order.push(claim.clone());
                }
            }
            out.push((g.name.clone(), claim));
        }
        out
    }

    /// The storage as the API server would hold it before the first pod (StorageClasses,
    /// PersistentVolumes, PersistentVolumeClaims in [`NAMESPACE`]), read through the core's
    /// conversion; and the same objects, for a replay on a real cluster.
    pub(super) fn finish(self, conv: &mut Converter) -> Result<(Storage, Vec<Value>), String> {
        let mut objects = self.class_objects;
        for (name, pv) in &self.statics {
            let provisioner = self
                .classes
                .get(&pv.class)
                .map_or("", |c| c.provisioner.as_str());
            let mut spec = json!({
                "capacity": {"storage": pv.size},
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": pv.class,
                "persistentVolumeReclaimPolicy": "Retain",
                "csi": {"driver": provisioner, "volumeHandle": name},
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": ZONE, "operator": "In", "values": [pv.zone]}
                ]}]}},
            });
            if let Some((ns, claim)) = pv.claim.as_deref().and_then(|c| c.split_once('/')) {
                spec["claimRef"] = json!({"namespace": ns, "name": claim});
            }
            objects.push(json!({
                "apiVersion": "v1", "kind": "PersistentVolume",
                "metadata": {"name": name}, "spec": spec,
            }));
        }
        for claim in &self.claim_order {
            let (class, size, volume) = match &self.claims[claim] {
                Source::Volume(pv) => {
                    let st = &self.statics[pv];
                    (st.class.clone(), st.size.clone(), Some(pv.clone()))
                }
                Source::Class(class, size) => (class.clone(), size.clone(), None),
            };
            let mut spec = json!({
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": class,
                "resources": {"requests": {"storage": size}},
            });
            if let Some(pv) = volume {
                spec["volumeName"] = json!(pv);
            }
            objects.push(json!({
                "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": claim, "namespace": NAMESPACE}, "spec": spec,
            }));
        }
        let mut storage = Storage::default();
        for o in &objects {
            let what = format!("{} {}", o["kind"], o["metadata"]["name"]);
            let fail = |e: String| format!("{what}: {e}");
            match o["kind"].as_str() {
                Some("StorageClass") => {
                    let c = conv.storage_class(o.clone()).map_err(fail)?;
                    storage.classes.insert(c.name.clone(), c);
                }
                Some("PersistentVolume") => {
                    let v = conv.persistent_volume(o.clone()).map_err(fail)?;
                    storage.volumes.insert(v.name.clone(), v);
                }
                _ => {
                    let c = conv.persistent_volume_claim(o.clone()).map_err(fail)?;
                    storage
                        .claims
                        .insert(format!("{}/{}", c.namespace, c.name), c);
                }
            }
        }
        storage.complete = !storage.claims.is_empty();
        Ok((storage, objects))
    }
}
