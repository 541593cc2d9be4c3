//! PersistentVolumeClaims, PersistentVolumes and StorageClasses into [`crate::model::volumes`],
//! and the claims a pod's volumes name.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

use super::{requirement, Converter, Meta, SelectorTerm, Volume as RawPodVolume};
use crate::model::constraints::Term;
use crate::model::volumes::{Binding, Claim, PodVolume, StorageClass, Volume};

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
pub(super) struct ClaimSource {
    claim_name: String,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
pub(super) struct Ephemeral {
    volume_claim_template: Option<ClaimTemplate>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct ClaimTemplate {
    spec: ClaimSpec,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct ClaimSpec {
    storage_class_name: Option<String>,
    volume_name: Option<String>,
    access_modes: Vec<String>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct RawClaim {
    metadata: Meta,
    spec: ClaimSpec,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct RawVolume {
    metadata: Meta,
    spec: VolumeSpec,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct VolumeSpec {
    node_affinity: Option<VolumeNodeAffinity>,
    claim_ref: Option<ClaimRef>,
    csi: Option<CsiSource>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct CsiSource {
    driver: String,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct RawCsiNode {
    metadata: Meta,
    spec: CsiNodeSpec,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct CsiNodeSpec {
    drivers: Vec<CsiNodeDriver>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct CsiNodeDriver {
    name: String,
    allocatable: Option<CsiAllocatable>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct CsiAllocatable {
    count: Option<i64>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct ClaimRef {
    namespace: String,
    name: String,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct VolumeNodeAffinity {
    required: Option<Selector>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct Selector {
    node_selector_terms: Vec<SelectorTerm>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct RawClass {
    metadata: Meta,
    provisioner: String,
    volume_binding_mode: Option<String>,
    allowed_topologies: Vec<TopologyTerm>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct TopologyTerm {
    match_label_expressions: Vec<LabelValues>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct LabelValues {
    key: String,
    values: Vec<String>,
}

/// The claims a pod's volumes come from: `persistentVolumeClaim` volumes, and generic ephemeral
/// volumes, whose claim is named `<pod>-<volume>`.
pub(super) fn pod_volumes(pod: &str, volumes: &[RawPodVolume]) -> Vec<PodVolume> {
    volumes
        .iter()
        .filter_map(|v| {
            if let Some(c) = &v.persistent_volume_claim {
                return (!c.claim_name.is_empty()).then(|| PodVolume {
                    claim: c.claim_name.clone(),
                    ephemeral_class: None,
                });
            }
            let t = v.ephemeral.as_ref()?.volume_claim_template.as_ref()?;
            Some(PodVolume {
                claim: format!("{pod}-{}", v.name),
                ephemeral_class: t.spec.storage_class_name.clone(),
            })
        })
        .collect()
}

fn terms(selector: &[SelectorTerm], at: &str) -> Result<Vec<Term>, String> {
    selector
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let requirements = t
                .match_expressions
                .iter()
                .map(requirement)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("{at}[{i}]: {e}"))?;
            Ok(Term {
                requirements,
                node_names: None,
            })
        })
        .collect()
}

impl Converter {
    pub fn persistent_volume_claim(&mut self, v: Value) -> Result<Claim, String> {
        let raw: RawClaim =
            serde_json::from_value(v).map_err(|e| format!("not a PersistentVolumeClaim: {e}"))?;
        if raw.metadata.name.is_empty() {
            return Err("PersistentVolumeClaim without metadata.name".into());
        }
        Ok(Claim {
            namespace: raw.metadata.namespace.unwrap_or_else(|| "default".into()),
            name: raw.metadata.name,
            class: raw.spec.storage_class_name.filter(|c| !c.is_empty()),
            volume: raw.spec.volume_name.filter(|v| !v.is_empty()),
            read_write_once_pod: raw
                .spec
                .access_modes
                .iter()
                .any(|m| m == "ReadWriteOncePod"),
        })
    }

    pub fn persistent_volume(&mut self, v: Value) -> Result<Volume, String> {
        let raw: RawVolume =
            serde_json::from_value(v).map_err(|e| format!("not a PersistentVolume: {e}"))?;
        if raw.metadata.name.is_empty() {
            return Err("PersistentVolume without metadata.name".into());
        }
        let node_affinity = match raw.spec.node_affinity.and_then(|a| a.required) {
            Some(sel) => Some(terms(
                &sel.node_selector_terms,
                "spec.nodeAffinity.required.nodeSelectorTerms",
            )?),
            None => None,
        };
        Ok(Volume {
            name: raw.metadata.name,
            claim: raw
                .spec
                .claim_ref
                .filter(|c| !c.name.is_empty())
                .map(|c| format!("{}/{}", c.namespace, c.name)),
            node_affinity,
            driver: raw.spec.csi.map(|c| c.driver).filter(|d| !d.is_empty()),
        })
    }

    /// A CSINode: its node's name and the attach limit of each driver that publishes one
    /// (`spec.drivers[].allocatable.count`).
    pub fn csi_node(&mut self, v: Value) -> Result<(String, BTreeMap<String, u32>), String> {
        let raw: RawCsiNode =
            serde_json::from_value(v).map_err(|e| format!("not a CSINode: {e}"))?;
        if raw.metadata.name.is_empty() {
            return Err("CSINode without metadata.name".into());
        }
        let mut limits = BTreeMap::new();
        for (i, d) in raw.spec.drivers.iter().enumerate() {
            let Some(count) = d.allocatable.as_ref().and_then(|a| a.count) else {
                continue;
            };
            let count = u32::try_from(count).map_err(|_| {
                format!("spec.drivers[{i}].allocatable.count: {count} is not a count of volumes")
            })?;
            if d.name.is_empty() {
                return Err(format!("spec.drivers[{i}]: no name"));
            }
            limits.insert(d.name.clone(), count);
        }
        Ok((raw.metadata.name, limits))
    }

    pub fn storage_class(&mut self, v: Value) -> Result<StorageClass, String> {
        let raw: RawClass =
            serde_json::from_value(v).map_err(|e| format!("not a StorageClass: {e}"))?;
        if raw.metadata.name.is_empty() {
            return Err("StorageClass without metadata.name".into());
        }
        let binding = match raw.volume_binding_mode.as_deref() {
            None | Some("Immediate") => Binding::Immediate,
            Some("WaitForFirstConsumer") => Binding::WaitForFirstConsumer,
            Some(other) => return Err(format!("volumeBindingMode: unknown {other:?}")),
        };
        let allowed = (!raw.allowed_topologies.is_empty()).then(|| {
            raw.allowed_topologies
                .iter()
                .map(|t| Term {
                    requirements: t
                        .match_label_expressions
                        .iter()
                        .map(|e| crate::model::constraints::Requirement {
                            key: e.key.clone(),
                            operator: crate::model::constraints::Operator::In,
                            values: e.values.clone(),
                        })
                        .collect(),
                    node_names: None,
                })
                .collect()
        });
        Ok(StorageClass {
            name: raw.metadata.name,
            provisioner: raw.provisioner,
            binding,
            allowed,
        })
    }
}
