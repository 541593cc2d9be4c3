//! ProvisioningRequests (`autoscaling.x-k8s.io/v1`) and the PodTemplates their pod sets name →
//! [`crate::provisioning::ProvisioningRequest`], with one pending pod per requested pod.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{json, Value};

use super::{parse_time, Converter};
use crate::model::GangRef;
use crate::provisioning::{self, Condition, ProvisioningRequest};

/// The metadata of a custom object (a ProvisioningRequest, a CapacityBuffer) that is read.
#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
pub(super) struct Meta {
    pub(super) name: String,
    pub(super) namespace: Option<String>,
    pub(super) uid: String,
    pub(super) generation: i64,
    pub(super) creation_timestamp: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct Spec {
    provisioning_class_name: String,
    pod_sets: Vec<PodSet>,
    parameters: BTreeMap<String, String>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct PodSet {
    pod_template_ref: Ref,
    count: i64,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Ref {
    name: String,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Status {
    conditions: Vec<RawCondition>,
}

/// A condition of a ProvisioningRequest's or a CapacityBuffer's status, as the API server has it.
#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
pub(super) struct RawCondition {
    #[serde(rename = "type")]
    kind: String,
    status: String,
    reason: String,
    message: String,
    last_transition_time: Option<String>,
    observed_generation: i64,
}

impl RawCondition {
    pub(super) fn condition(&self) -> Condition {
        Condition {
            kind: self.kind.clone(),
            status: self.status.clone(),
            reason: self.reason.clone(),
            message: self.message.clone(),
            since: parse_time(&self.last_transition_time),
            observed_generation: self.observed_generation,
        }
    }
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Raw {
    metadata: Meta,
    spec: Spec,
    status: Status,
}

/// The parameter of the API that bounds how long an unprovisioned request is tried (seconds
/// since its creation).
pub const VALID_UNTIL_SECONDS: &str = "ValidUntilSeconds";

impl Converter {
    /// A ProvisioningRequest, its pod sets' pods made from the PodTemplates named (`templates`:
    /// `namespace/name` → the PodTemplate object). An object that is not a ProvisioningRequest is
    /// an error; a request whose templates are missing or cannot be understood is converted, with
    /// the problem in `pods` (its conditions say so).
    pub fn provisioning_request(
        &mut self,
        v: &Value,
        templates: &BTreeMap<String, Value>,
    ) -> Result<ProvisioningRequest, String> {
        let raw: Raw = serde_json::from_value(v.clone())
            .map_err(|e| format!("not a ProvisioningRequest: {e}"))?;
        let m = &raw.metadata;
        if m.name.is_empty() {
            return Err("ProvisioningRequest without metadata.name".into());
        }
        let namespace = m.namespace.clone().unwrap_or_else(|| "default".into());
        let created = parse_time(&m.creation_timestamp);
        let conditions = raw
            .status
            .conditions
            .iter()
            .map(RawCondition::condition)
            .collect();
        let mut valid_until = None;
        let mut problem = None;
        if let Some(s) = raw.spec.parameters.get(VALID_UNTIL_SECONDS) {
            match s.trim().parse::<u64>() {
                Ok(n) => valid_until = Some(Duration::from_secs(n)),
                Err(_) => {
                    problem = Some(format!(
                    "spec.parameters.{VALID_UNTIL_SECONDS}: {s:?} is not a whole number of seconds"
                ))
                }
            }
        }
        let pods = match problem {
            Some(p) => Err(p),
            None => self.request_pods(&raw, &namespace, created, templates),
        };
        Ok(ProvisioningRequest {
            namespace,
            name: m.name.clone(),
            uid: m.uid.clone(),
            generation: m.generation,
            class_name: raw.spec.provisioning_class_name.clone(),
            created,
            valid_until,
            pods,
            conditions,
        })
    }

    fn request_pods(
        &mut self,
        raw: &Raw,
        namespace: &str,
        created: crate::model::Time,
        templates: &BTreeMap<String, Value>,
    ) -> Result<Vec<crate::model::Pod>, String> {
        let name = &raw.metadata.name;
        if raw.spec.pod_sets.is_empty() {
            return Err("spec.podSets is empty".into());
        }
        let total: i64 = raw.spec.pod_sets.iter().map(|s| s.count.max(0)).sum();
        let gang = GangRef {
            key: format!("{namespace}/{}", provisioning::gang_name(name)),
            min_member: Some(total as u32),
        };
        let mut pods = Vec::new();
        for (i, set) in raw.spec.pod_sets.iter().enumerate() {
            let field = format!("spec.podSets[{i}]");
            if set.count < 1 {
                return Err(format!("{field}.count: {} is below 1", set.count));
            }
            let t = &set.pod_template_ref.name;
            let Some(template) = templates.get(&format!("{namespace}/{t}")) else {
                return Err(format!(
                    "{field}.podTemplateRef: PodTemplate {namespace}/{t} not found"
                ));
            };
            let Some(spec) = template.pointer("/template/spec") else {
                return Err(format!("PodTemplate {namespace}/{t} has no template.spec"));
            };
            let labels = template
                .pointer("/template/metadata/labels")
                .cloned()
                .unwrap_or(json!({}));
            for j in 0..set.count {
                let pod_name = provisioning::pod_name(name, i, j as usize);
                let pod = json!({
                    "metadata": {
                        "name": pod_name,
                        "namespace": namespace,
                        "uid": format!("{}/{i}/{j}", raw.metadata.uid),
                        "labels": labels,
                        "annotations": {provisioning::REQUEST_ANNOTATION: name},
                        "creationTimestamp": created.to_rfc3339(),
                    },
                    "spec": spec,
                    "status": {
                        "phase": "Pending",
                        "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}],
                    },
                });
                let mut p = self
                    .pod(pod)
                    .map_err(|e| format!("PodTemplate {namespace}/{t}: {e}"))?;
                if let Some(problem) = p.problem.take() {
                    return Err(format!("PodTemplate {namespace}/{t}: {problem}"));
                }
                p.gang = Some(gang.clone());
                p.unschedulable = true;
                pods.push(p);
            }
        }
        Ok(pods)
    }
}
