//! CapacityBuffers (`autoscaling.x-k8s.io/v1beta1`), the PodTemplates and scalable objects
//! (Deployments, StatefulSets) they name → [`crate::buffer::CapacityBuffer`], with
//! one chunk's pod.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{json, Value};

use super::provisioning::{Meta, RawCondition};
use super::{add_resource_list, parse_time, Converter};
use crate::buffer::{self, CapacityBuffer, Source, Status};
use crate::model::resources::{GpuShare, Resources};
use crate::model::Pod;

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct Spec {
    provisioning_strategy: Option<String>,
    pod_template_ref: Option<Ref>,
    scalable_ref: Option<ScalableRef>,
    replicas: Option<i32>,
    percentage: Option<i32>,
    limits: Option<BTreeMap<String, Value>>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Ref {
    name: String,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct ScalableRef {
    api_group: String,
    kind: String,
    name: String,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct RawStatus {
    replicas: Option<i32>,
    pod_template_ref: Option<Ref>,
    pod_template_generation: Option<i64>,
    provisioning_strategy: Option<String>,
    conditions: Vec<RawCondition>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Raw {
    metadata: Meta,
    spec: Spec,
    status: RawStatus,
}

/// The key of a scalable object in the map [`Converter::capacity_buffer`] reads:
/// `group/Kind/namespace/name` (group empty for the core group).
pub fn scalable_key(api_group: &str, kind: &str, namespace: &str, name: &str) -> String {
    format!("{api_group}/{kind}/{namespace}/{name}")
}

impl Converter {
    /// A CapacityBuffer, its chunk's pod made from the PodTemplate (`templates`:
    /// `namespace/name` → PodTemplate) or the scalable object (`scalables`, keyed by
    /// [`scalable_key`]: an object with `spec.template` and replicas) it names. An object that is
    /// not a CapacityBuffer is an error; a buffer whose source is missing or not understood is
    /// converted with the problem in `chunk` (its conditions say so).
    pub fn capacity_buffer(
        &mut self,
        v: &Value,
        templates: &BTreeMap<String, Value>,
        scalables: &BTreeMap<String, Value>,
    ) -> Result<CapacityBuffer, String> {
        let raw: Raw =
            serde_json::from_value(v.clone()).map_err(|e| format!("not a CapacityBuffer: {e}"))?;
        let m = &raw.metadata;
        if m.name.is_empty() {
            return Err("CapacityBuffer without metadata.name".into());
        }
        let namespace = m.namespace.clone().unwrap_or_else(|| "default".into());
        let created = parse_time(&m.creation_timestamp);
        let strategy = raw
            .spec
            .provisioning_strategy
            .clone()
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| buffer::STRATEGY_ACTIVE.to_string());
        let mut scalable_replicas = None;
        let mut template_generation = None;
        let mut scalable_template = None;
        let mut own_template = None;
        let (source, chunk) = match (&raw.spec.pod_template_ref, &raw.spec.scalable_ref) {
            (Some(t), None) => {
                let pt = templates.get(&format!("{namespace}/{}", t.name));
                template_generation = pt
                    .and_then(|pt| pt.pointer("/metadata/generation"))
                    .and_then(Value::as_i64);
                let chunk = match pt {
                    None => Err(format!(
                        "spec.podTemplateRef: PodTemplate {namespace}/{} not found",
                        t.name
                    )),
                    Some(pt) => match pt.get("template") {
                        Some(spec) => self
                            .chunk(&raw, &namespace, created, spec)
                            .map_err(|e| format!("PodTemplate {namespace}/{}: {e}", t.name)),
                        None => Err(format!(
                            "PodTemplate {namespace}/{} has no template",
                            t.name
                        )),
                    },
                };
                (Source::PodTemplate(t.name.clone()), chunk)
            }
            (None, Some(s)) => {
                let what = format!("{} {namespace}/{}", s.kind, s.name);
                let chunk = match scalables.get(&scalable_key(
                    &s.api_group,
                    &s.kind,
                    &namespace,
                    &s.name,
                )) {
                    None if !matches!(
                        (s.api_group.as_str(), s.kind.as_str()),
                        ("apps", "Deployment" | "StatefulSet")
                    ) =>
                    {
                        Err(format!(
                            "spec.scalableRef: kind {}/{} is not supported (apps Deployment and \
                             StatefulSet are)",
                            s.api_group, s.kind
                        ))
                    }
                    None => Err(format!("spec.scalableRef: {what} not found")),
                    Some(obj) => {
                        scalable_replicas = obj
                            .pointer("/status/replicas")
                            .or_else(|| obj.pointer("/spec/replicas"))
                            .and_then(Value::as_i64)
                            .map(|n| n.clamp(0, i64::from(i32::MAX)) as i32)
                            .or(Some(1));
                        scalable_template = obj.pointer("/spec/template").cloned();
                        match obj.pointer("/spec/template") {
                            Some(spec) => self
                                .chunk(&raw, &namespace, created, spec)
                                .map_err(|e| format!("{what}: {e}")),
                            None => Err(format!("{what} has no spec.template")),
                        }
                    }
                };
                own_template = templates
                    .get(&format!(
                        "{namespace}/{}",
                        buffer::own_template_name(&m.name)
                    ))
                    .map(|t| buffer::OwnTemplate {
                        generation: t.pointer("/metadata/generation").and_then(Value::as_i64),
                        owned: !m.uid.is_empty()
                            && t.pointer("/metadata/ownerReferences")
                                .and_then(Value::as_array)
                                .is_some_and(|refs| {
                                    refs.iter().any(|r| r["uid"].as_str() == Some(&m.uid))
                                }),
                        source_hash: t
                            .pointer("/metadata/annotations")
                            .and_then(|a| a.get(buffer::SOURCE_HASH_ANNOTATION))
                            .and_then(Value::as_str)
                            .map(str::to_string),
                    });
                (
                    Source::Scalable {
                        api_group: s.api_group.clone(),
                        kind: s.kind.clone(),
                        name: s.name.clone(),
                    },
                    chunk,
                )
            }
            (Some(_), Some(_)) => (
                Source::PodTemplate(String::new()),
                Err(
                    "spec: podTemplateRef and scalableRef are both set (one of them must be)"
                        .into(),
                ),
            ),
            (None, None) => (
                Source::PodTemplate(String::new()),
                Err("spec: neither podTemplateRef nor scalableRef is set".into()),
            ),
        };
        let mut limits = None;
        let mut limit_names = Vec::new();
        let mut chunk = chunk;
        if let Some(l) = &raw.spec.limits {
            limit_names = l.keys().cloned().collect();
            let mut res = Resources::default();
            let mut share = GpuShare::default();
            match add_resource_list(l, "spec.limits", &mut res, &mut share) {
                Ok(()) => limits = Some(res),
                Err(e) => chunk = Err(e),
            }
        }
        let conditions = raw
            .status
            .conditions
            .iter()
            .map(RawCondition::condition)
            .collect();
        Ok(CapacityBuffer {
            namespace,
            name: m.name.clone(),
            uid: m.uid.clone(),
            generation: m.generation,
            created,
            strategy,
            source,
            replicas: raw.spec.replicas,
            percentage: raw.spec.percentage,
            limits,
            limit_names,
            chunk,
            scalable_replicas,
            template_generation,
            scalable_template,
            own_template,
            status: Status {
                replicas: raw.status.replicas,
                pod_template: raw.status.pod_template_ref.as_ref().map(|r| r.name.clone()),
                pod_template_generation: raw.status.pod_template_generation,
                strategy: raw.status.provisioning_strategy.clone(),
                conditions,
            },
        })
    }

    /// One chunk's pending pod from a PodTemplateSpec (`metadata`, `spec`).
    fn chunk(
        &mut self,
        raw: &Raw,
        namespace: &str,
        created: crate::model::Time,
        template: &Value,
    ) -> Result<Pod, String> {
        let Some(spec) = template.get("spec") else {
            return Err("the pod template has no spec".into());
        };
        let labels = template
            .pointer("/metadata/labels")
            .cloned()
            .unwrap_or(json!({}));
        let pod = json!({
            "metadata": {
                "name": buffer::pod_name(&raw.metadata.name, 0),
                "namespace": namespace,
                "uid": format!("{}/0", raw.metadata.uid),
                "labels": labels,
                "annotations": {buffer::BUFFER_ANNOTATION: raw.metadata.name},
                "creationTimestamp": created.to_rfc3339(),
            },
            "spec": spec,
            "status": {
                "phase": "Pending",
                "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}],
            },
        });
        let mut p = self.pod(pod)?;
        if let Some(problem) = p.problem.take() {
            return Err(problem);
        }
        p.unschedulable = true;
        Ok(p)
    }
}
