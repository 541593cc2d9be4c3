//! Object validation: names, labels, annotations and a few per-kind rules (422 causes).

use serde_json::Value;

use crate::resources::{ResourceDef, RUN_DURATION_ANNOTATION};
use gpu_node_autoscaler_core::model::quantity::{parse_quantity, QuantityError};
use gpu_node_autoscaler_core::policy::duration::parse_duration;

const SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const QUANTITY_MSG: &str =
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'";
const LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";

fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

pub fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns_label)
}

fn is_qualified_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
}

fn is_qualified_name(s: &str) -> bool {
    match s.split_once('/') {
        Some((prefix, name)) => is_dns_subdomain(prefix) && is_qualified_name_part(name),
        None => is_qualified_name_part(s),
    }
}

fn is_label_value(s: &str) -> bool {
    s.is_empty() || is_qualified_name_part(s)
}

fn quoted(v: &Value) -> String {
    match v {
        Value::String(s) => format!("{s:?}"),
        other => other.to_string(),
    }
}

type Causes = Vec<(String, String)>;

/// Checks `metadata.name` (RFC 1123 subdomain, or label for namespaces).
pub fn name_cause(res: &ResourceDef, name: &str) -> Option<(String, String)> {
    let ok = if res.name_is_label {
        is_dns_label(name)
    } else {
        is_dns_subdomain(name)
    };
    (!ok).then(|| {
        let msg = if res.name_is_label {
            LABEL_MSG
        } else {
            SUBDOMAIN_MSG
        };
        (
            "metadata.name".to_string(),
            format!("Invalid value: {name:?}: {msg}"),
        )
    })
}

fn validate_metadata(obj: &Value, causes: &mut Causes) {
    let meta = &obj["metadata"];
    if let Some(labels) = meta.get("labels").filter(|l| !l.is_null()) {
        match labels.as_object() {
            None => causes.push((
                "metadata.labels".into(),
                "Invalid value: must be a map of strings".into(),
            )),
            Some(m) => {
                for (k, v) in m {
                    if !is_qualified_name(k) {
                        causes.push(("metadata.labels".into(), format!("Invalid value: {k:?}: name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character")));
                    }
                    if !v.as_str().is_some_and(is_label_value) {
                        causes.push((format!("metadata.labels.{k}"), format!("Invalid value: {}: a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character", quoted(v))));
                    }
                }
            }
        }
    }
    if let Some(ann) = meta.get("annotations").filter(|a| !a.is_null()) {
        match ann.as_object() {
            None => causes.push((
                "metadata.annotations".into(),
                "Invalid value: must be a map of strings".into(),
            )),
            Some(m) => {
                for (k, v) in m {
                    if !is_qualified_name(k) {
                        causes.push((
                            "metadata.annotations".into(),
                            format!("Invalid value: {k:?}: invalid annotation key"),
                        ));
                    }
                    if !v.is_string() {
                        causes.push((
                            format!("metadata.annotations.{k}"),
                            format!("Invalid value: {}: must be a string", quoted(v)),
                        ));
                    }
                }
            }
        }
    }
}

fn validate_pod(obj: &Value, causes: &mut Causes) {
    match obj.pointer("/spec/containers").and_then(Value::as_array) {
        None => causes.push(("spec.containers".into(), "Required value".into())),
        Some(cs) if cs.is_empty() => {
            causes.push(("spec.containers".into(), "Required value".into()))
        }
        Some(cs) => {
            for (i, c) in cs.iter().enumerate() {
                let name = c.get("name").and_then(Value::as_str).unwrap_or("");
                if !is_dns_label(name) {
                    causes.push((
                        format!("spec.containers[{i}].name"),
                        format!("Invalid value: {name:?}: {LABEL_MSG}"),
                    ));
                }
                if c.get("image")
                    .and_then(Value::as_str)
                    .is_none_or(|s| s.trim().is_empty())
                {
                    causes.push((
                        format!("spec.containers[{i}].image"),
                        "Required value".into(),
                    ));
                }
            }
        }
    }
}

/// Resource quantities in containers and the kube-sim run-duration annotation.
fn validate_pod_quantities(obj: &Value, causes: &mut Causes) {
    for list in ["containers", "initContainers"] {
        let cs = obj
            .pointer(&format!("/spec/{list}"))
            .and_then(Value::as_array);
        for (i, c) in cs.into_iter().flatten().enumerate() {
            for kind in ["requests", "limits"] {
                let Some(m) = c
                    .pointer(&format!("/resources/{kind}"))
                    .and_then(Value::as_object)
                else {
                    continue;
                };
                for (r, q) in m {
                    let text = match q {
                        Value::String(s) => s.clone(),
                        Value::Number(n) => n.to_string(),
                        other => other.to_string(),
                    };
                    let e = match parse_quantity(&text) {
                        Ok(_) => continue,
                        // The API server's words.
                        Err(QuantityError::Malformed { .. }) => QUANTITY_MSG.to_string(),
                        Err(e) => e.to_string(),
                    };
                    causes.push((
                        format!("spec.{list}[{i}].resources.{kind}[{r}]"),
                        format!("Invalid value: {}: {e}", quoted(q)),
                    ));
                }
            }
        }
    }
    if let Some(d) = obj
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(RUN_DURATION_ANNOTATION))
        .and_then(Value::as_str)
    {
        if let Err(e) = parse_duration(d) {
            causes.push((
                format!("metadata.annotations[{RUN_DURATION_ANNOTATION}]"),
                format!("Invalid value: {d:?}: {e}"),
            ));
        }
    }
}

fn validate_node(obj: &Value, causes: &mut Causes) {
    if let Some(taints) = obj.pointer("/spec/taints").and_then(Value::as_array) {
        for (i, t) in taints.iter().enumerate() {
            if !t
                .get("key")
                .and_then(Value::as_str)
                .is_some_and(is_qualified_name)
            {
                causes.push((
                    format!("spec.taints[{i}].key"),
                    "Invalid value: a taint key must be a qualified name".into(),
                ));
            }
            let effect = t.get("effect").and_then(Value::as_str).unwrap_or("");
            if !matches!(effect, "NoSchedule" | "PreferNoSchedule" | "NoExecute") {
                causes.push((format!("spec.taints[{i}].effect"), format!("Unsupported value: {effect:?}: supported values: \"NoSchedule\", \"PreferNoSchedule\", \"NoExecute\"")));
            }
        }
    }
}

fn validate_pdb(obj: &Value, causes: &mut Causes) {
    let spec = &obj["spec"];
    if spec.get("minAvailable").is_some() && spec.get("maxUnavailable").is_some() {
        causes.push((
            "spec".into(),
            "Invalid value: minAvailable and maxUnavailable cannot be both set".into(),
        ));
    }
}

fn validate_configmap(obj: &Value, causes: &mut Causes) {
    if let Some(data) = obj.get("data").and_then(Value::as_object) {
        for (k, v) in data {
            if !v.is_string() {
                causes.push((
                    format!("data[{k}]"),
                    format!("Invalid value: {}: must be a string", quoted(v)),
                ));
            }
        }
    }
}

/// Every cause that makes `obj` invalid (empty when valid).
pub fn validate(res: &ResourceDef, obj: &Value) -> Causes {
    let mut causes = Vec::new();
    validate_metadata(obj, &mut causes);
    match (res.group, res.kind) {
        ("", "Pod") => {
            validate_pod(obj, &mut causes);
            validate_pod_quantities(obj, &mut causes);
        }
        ("", "Node") => validate_node(obj, &mut causes),
        ("", "ConfigMap") => validate_configmap(obj, &mut causes),
        ("policy", _) => validate_pdb(obj, &mut causes),
        _ => {}
    }
    causes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::{NAMESPACES, PODS, RESOURCES};
    use serde_json::json;

    #[test]
    fn names() {
        assert!(is_dns_subdomain("gpu-node.a1"));
        assert!(!is_dns_subdomain("Bad_Name"));
        assert!(!is_dns_subdomain("-a"));
        assert!(!is_dns_subdomain(""));
        assert!(name_cause(&RESOURCES[NAMESPACES], "a.b").is_some());
        assert!(name_cause(&RESOURCES[PODS], "a.b").is_none());
    }

    #[test]
    fn labels_and_pods() {
        let pod = json!({"metadata": {"labels": {"ok/x": "v", "bad key": "v", "k": 1}}, "spec": {"containers": [{"name": "c"}]}});
        let causes = validate(&RESOURCES[PODS], &pod);
        let fields: Vec<&str> = causes.iter().map(|c| c.0.as_str()).collect();
        assert_eq!(
            fields,
            [
                "metadata.labels",
                "metadata.labels.k",
                "spec.containers[0].image"
            ]
        );
        let good = json!({"metadata": {"labels": {"app": "x"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}});
        assert!(validate(&RESOURCES[PODS], &good).is_empty());
        let bad = json!({"metadata": {"annotations": {RUN_DURATION_ANNOTATION: "soon"}}, "spec": {"containers": [{"name": "c", "image": "i", "resources": {"limits": {"nvidia.com/gpu": "one"}}}]}});
        let fields: Vec<String> = validate(&RESOURCES[PODS], &bad)
            .into_iter()
            .map(|c| c.0)
            .collect();
        assert_eq!(
            fields,
            [
                "spec.containers[0].resources.limits[nvidia.com/gpu]",
                "metadata.annotations[kube-sim.gpu-node-autoscaler.io/run-duration]"
            ]
        );
    }
}
