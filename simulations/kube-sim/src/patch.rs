//! JSON merge patch (RFC 7396) and JSON patch (RFC 6902) through the `json-patch` crate, and a
//! pragmatic strategic merge patch of our own: no maintained crate implements Kubernetes'
//! strategic merge patch (it needs each field's patch strategy and merge key, which kube-sim
//! keeps in `merge_key`).

use serde_json::{Map, Value};

use crate::status::{ApiError, ApiResult};

/// RFC 7396 JSON merge patch (the `json-patch` crate): objects merge recursively, `null` deletes,
/// anything else replaces.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    json_patch::merge(target, patch);
}

/// The merge key of the lists Kubernetes merges by key (`patchMergeKey`), by field name.
/// `spec.taints` and `spec.tolerations` have no patch strategy upstream: they are replaced whole
/// (this is what `kubectl taint` relies on).
fn merge_key(field: &str) -> Option<&'static str> {
    Some(match field {
        "conditions" | "addresses" => "type",
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "env"
        | "imagePullSecrets"
        | "resourceClaims" => "name",
        "volumeMounts" => "mountPath",
        "volumeDevices" => "devicePath",
        "ports" => "containerPort",
        "ownerReferences" => "uid",
        _ => return None,
    })
}

/// Lists of scalars that strategic merge patch unions rather than replaces.
fn merges_primitives(field: &str) -> bool {
    matches!(field, "finalizers")
}

/// Strategic merge patch for the fields kubectl and the controller touch: maps merge recursively
/// (null deletes), lists with a known merge key merge element-wise (with `$patch: delete`),
/// `$patch: replace|delete` on maps, `$deleteFromPrimitiveList/`, and `$setElementOrder/` (ignored).
pub fn strategic_merge_patch(target: &mut Value, patch: &Value) -> ApiResult<()> {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return Ok(());
    };
    match p.get("$patch").and_then(Value::as_str) {
        Some("replace") => {
            let mut p = p.clone();
            p.remove("$patch");
            *target = Value::Object(p);
            return Ok(());
        }
        Some("delete") => {
            *target = Value::Null;
            return Ok(());
        }
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "unknown patch type {other:?}"
            )))
        }
        None => {}
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let t = target.as_object_mut().expect("object");
    for (k, v) in p {
        if k.starts_with("$setElementOrder/") || k == "$retainKeys" {
            continue;
        }
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(items)), Some(del)) = (t.get_mut(field), v.as_array()) {
                items.retain(|i| !del.contains(i));
            }
            continue;
        }
        if v.is_null() {
            t.remove(k);
            continue;
        }
        match v {
            Value::Object(_) => {
                let slot = t.entry(k.clone()).or_insert(Value::Null);
                strategic_merge_patch(slot, v)?;
                if slot.is_null() {
                    t.remove(k);
                }
            }
            Value::Array(items) => {
                let existing = t
                    .get(k)
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                let merged = if let Some(key) = merge_key(k) {
                    merge_keyed_list(existing, items, key)?
                } else if merges_primitives(k) {
                    let mut out = existing;
                    for i in items {
                        if !out.contains(i) {
                            out.push(i.clone());
                        }
                    }
                    out
                } else {
                    items.clone()
                };
                t.insert(k.clone(), Value::Array(merged));
            }
            _ => {
                t.insert(k.clone(), v.clone());
            }
        }
    }
    Ok(())
}

fn merge_keyed_list(mut existing: Vec<Value>, patch: &[Value], key: &str) -> ApiResult<Vec<Value>> {
    if patch
        .iter()
        .any(|i| i.get("$patch").and_then(Value::as_str) == Some("replace"))
    {
        return Ok(patch
            .iter()
            .filter(|i| i.get("$patch").is_none())
            .cloned()
            .collect());
    }
    for item in patch {
        let Some(kv) = item.get(key) else {
            return Err(ApiError::bad_request(format!(
                "map: {item} does not contain declared merge key: {key}"
            )));
        };
        let pos = existing.iter().position(|e| e.get(key) == Some(kv));
        let delete = item.get("$patch").and_then(Value::as_str) == Some("delete");
        match (pos, delete) {
            (Some(i), true) => {
                existing.remove(i);
            }
            (None, true) => {}
            (Some(i), false) => strategic_merge_patch(&mut existing[i], item)?,
            (None, false) => existing.push(item.clone()),
        }
    }
    Ok(existing)
}

/// RFC 6902 JSON patch (the `json-patch` crate), applied to a copy so a failing operation changes
/// nothing. A body that is not a list of operations is a bad request; an operation that does not
/// apply (a missing path, a failed `test`) is invalid, as the apiserver answers.
pub fn json_patch(target: &Value, ops: &Value) -> ApiResult<Value> {
    if !ops.is_array() {
        return Err(ApiError::bad_request(
            "a JSON patch must be an array of operations",
        ));
    }
    let ops: json_patch::Patch = serde_json::from_value(ops.clone())
        .map_err(|e| ApiError::bad_request(format!("invalid JSON patch: {e}")))?;
    let mut doc = target.clone();
    json_patch::patch(&mut doc, &ops).map_err(|e| {
        ApiError::new(
            422,
            "Invalid",
            format!("the server rejected our request due to an error in our request: {e}"),
        )
    })?;
    Ok(doc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_deletes_with_null() {
        let mut t = json!({"metadata": {"labels": {"a": "1", "b": "2"}}, "spec": {"x": [1, 2]}});
        merge_patch(
            &mut t,
            &json!({"metadata": {"labels": {"a": null, "c": "3"}}, "spec": {"x": [3]}}),
        );
        assert_eq!(
            t,
            json!({"metadata": {"labels": {"b": "2", "c": "3"}}, "spec": {"x": [3]}})
        );
    }

    #[test]
    fn strategic_merges_conditions_by_type_and_replaces_taints() {
        let mut t = json!({"spec": {"taints": [{"key": "a", "effect": "NoSchedule"}, {"key": "b", "effect": "NoExecute"}]},
            "status": {"conditions": [{"type": "Ready", "status": "False"}, {"type": "MemoryPressure", "status": "False"}]}});
        strategic_merge_patch(
            &mut t,
            &json!({
                "spec": {"taints": [{"key": "b", "effect": "NoExecute"}], "unschedulable": true},
                "status": {
                    "$setElementOrder/conditions": [{"type": "Ready"}, {"type": "DiskPressure"}],
                    "conditions": [
                        {"type": "Ready", "status": "True"},
                        {"type": "MemoryPressure", "$patch": "delete"},
                        {"type": "DiskPressure", "status": "False"}
                    ]
                }
            }),
        )
        .unwrap();
        assert_eq!(
            t,
            json!({"spec": {"unschedulable": true, "taints": [{"key": "b", "effect": "NoExecute"}]},
                "status": {"conditions": [{"type": "Ready", "status": "True"}, {"type": "DiskPressure", "status": "False"}]}})
        );
    }

    #[test]
    fn strategic_patch_directives() {
        let mut t = json!({"metadata": {"finalizers": ["x"], "labels": {"a": "1"}}, "spec": {"tolerations": [{"key": "a"}]}});
        strategic_merge_patch(
            &mut t,
            &json!({
                "metadata": {"finalizers": ["y"], "labels": {"$patch": "replace", "z": "9"}},
                "spec": {"tolerations": [{"key": "b"}]}
            }),
        )
        .unwrap();
        assert_eq!(t["metadata"]["finalizers"], json!(["x", "y"]));
        assert_eq!(t["metadata"]["labels"], json!({"z": "9"}));
        assert_eq!(t["spec"]["tolerations"], json!([{"key": "b"}]));
        strategic_merge_patch(
            &mut t,
            &json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["x"]}}),
        )
        .unwrap();
        assert_eq!(t["metadata"]["finalizers"], json!(["y"]));
        assert!(
            strategic_merge_patch(&mut t, &json!({"spec": {"containers": [{"image": "x"}]}}))
                .is_err()
        );
    }

    #[test]
    fn json_patch_ops_and_atomicity() {
        let t = json!({"a": {"b": [1, 2]}, "c": "x"});
        let out = json_patch(
            &t,
            &json!([
                {"op": "add", "path": "/a/b/-", "value": 3},
                {"op": "replace", "path": "/c", "value": "y"},
                {"op": "copy", "from": "/c", "path": "/d"},
                {"op": "move", "from": "/d", "path": "/e~1f"},
                {"op": "remove", "path": "/a/b/0"},
                {"op": "test", "path": "/c", "value": "y"}
            ]),
        )
        .unwrap();
        assert_eq!(out, json!({"a": {"b": [2, 3]}, "c": "y", "e/f": "y"}));
        let err = json_patch(&t, &json!([{"op": "replace", "path": "/c", "value": 1}, {"op": "remove", "path": "/nope"}])).unwrap_err();
        assert_eq!(err.code, 422);
        assert!(err.message.contains("/nope"), "{}", err.message);
        let err = json_patch(&t, &json!([{"op": "test", "path": "/c", "value": "z"}])).unwrap_err();
        assert_eq!(err.code, 422);
        assert_eq!(json_patch(&t, &json!({"op": "add"})).unwrap_err().code, 400);
        assert_eq!(
            json_patch(&t, &json!([{"op": "add"}])).unwrap_err().code,
            400
        );
        assert_eq!(
            json_patch(&t, &json!([{"op": "frobnicate", "path": "/c"}]))
                .unwrap_err()
                .code,
            400
        );
    }
}
