//! Label and field selectors, parsed the way kube-apiserver reads them.

use serde_json::Value;

use crate::status::{ApiError, ApiResult};

#[derive(Debug, Clone, PartialEq)]
enum LabelReq {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed `labelSelector`; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector(Vec<LabelReq>);

/// Splits at commas outside parentheses.
fn split_top_level(s: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0i32, 0usize);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
}

fn valid_key(k: &str) -> bool {
    !k.is_empty()
        && k.len() <= 317
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
}

fn valid_value(v: &str) -> bool {
    v.len() <= 63
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

fn parse_set(key: &str, rest: &str, raw: &str) -> ApiResult<(String, Vec<String>)> {
    let rest = rest.trim();
    let inner = rest
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| bad(raw, "expected a parenthesised set of values"))?;
    let values: Vec<String> = inner
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect();
    if values.is_empty() || !values.iter().all(|v| valid_value(v)) {
        return Err(bad(raw, "invalid set of values"));
    }
    Ok((key.to_string(), values))
}

fn bad(raw: &str, why: &str) -> ApiError {
    ApiError::bad_request(format!("unable to parse requirement: {why}: {raw:?}"))
}

impl LabelSelector {
    pub fn parse(s: &str) -> ApiResult<Self> {
        let mut reqs = Vec::new();
        if s.trim().is_empty() {
            return Ok(LabelSelector(reqs));
        }
        for raw in split_top_level(s) {
            let part = raw.trim();
            if part.is_empty() {
                return Err(bad(raw, "empty requirement"));
            }
            let req = if let Some(key) = part.strip_prefix('!') {
                LabelReq::NotExists(key.trim().to_string())
            } else if let Some((k, v)) = part.split_once("!=") {
                LabelReq::NotEq(k.trim().to_string(), v.trim().to_string())
            } else if let Some((k, v)) = part.split_once("==") {
                LabelReq::Eq(k.trim().to_string(), v.trim().to_string())
            } else if let Some((k, v)) = part.split_once('=') {
                LabelReq::Eq(k.trim().to_string(), v.trim().to_string())
            } else if let Some((k, rest)) = part.split_once(" notin ") {
                let (k, vs) = parse_set(k.trim(), rest, raw)?;
                LabelReq::NotIn(k, vs)
            } else if let Some((k, rest)) = part.split_once(" in ") {
                let (k, vs) = parse_set(k.trim(), rest, raw)?;
                LabelReq::In(k, vs)
            } else {
                LabelReq::Exists(part.to_string())
            };
            let (key, value) = match &req {
                LabelReq::Eq(k, v) | LabelReq::NotEq(k, v) => (k, Some(v)),
                LabelReq::In(k, _)
                | LabelReq::NotIn(k, _)
                | LabelReq::Exists(k)
                | LabelReq::NotExists(k) => (k, None),
            };
            if !valid_key(key) || value.is_some_and(|v| !valid_value(v)) {
                return Err(bad(raw, "invalid label key or value"));
            }
            reqs.push(req);
        }
        Ok(LabelSelector(reqs))
    }

    pub fn matches(&self, labels: Option<&Value>) -> bool {
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.0.iter().all(|r| match r {
            LabelReq::Eq(k, v) => get(k) == Some(v.as_str()),
            LabelReq::NotEq(k, v) => get(k) != Some(v.as_str()),
            LabelReq::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            LabelReq::NotIn(k, vs) => get(k).is_none_or(|x| !vs.iter().any(|v| v == x)),
            LabelReq::Exists(k) => get(k).is_some(),
            LabelReq::NotExists(k) => get(k).is_none(),
        })
    }

    /// Builds a selector from a `metav1.LabelSelector` object (`matchLabels` + `matchExpressions`).
    pub fn from_object(sel: &Value) -> Option<Self> {
        let mut reqs = Vec::new();
        if let Some(m) = sel.get("matchLabels").and_then(Value::as_object) {
            for (k, v) in m {
                reqs.push(LabelReq::Eq(k.clone(), v.as_str()?.to_string()));
            }
        }
        if let Some(exprs) = sel.get("matchExpressions").and_then(Value::as_array) {
            for e in exprs {
                let key = e.get("key")?.as_str()?.to_string();
                let values: Vec<String> = e
                    .get("values")
                    .and_then(Value::as_array)
                    .map(|a| {
                        a.iter()
                            .filter_map(|v| v.as_str().map(str::to_string))
                            .collect()
                    })
                    .unwrap_or_default();
                reqs.push(match e.get("operator")?.as_str()? {
                    "In" => LabelReq::In(key, values),
                    "NotIn" => LabelReq::NotIn(key, values),
                    "Exists" => LabelReq::Exists(key),
                    "DoesNotExist" => LabelReq::NotExists(key),
                    _ => return None,
                });
            }
        }
        Some(LabelSelector(reqs))
    }
}

/// A parsed `fieldSelector` (`=`, `==`, `!=` on supported fields).
#[derive(Debug, Clone, Default)]
pub struct FieldSelector(Vec<(String, bool, String)>);

/// Fields each kind supports in field selectors (besides `metadata.name` and `metadata.namespace`).
fn supported_fields(kind: &str) -> &'static [&'static str] {
    match kind {
        "Pod" => &[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ],
        "Node" => &["spec.unschedulable"],
        "Namespace" => &["status.phase"],
        "Event" => &[
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
            "regarding.kind",
            "regarding.name",
            "regarding.namespace",
        ],
        _ => &[],
    }
}

fn field_value(obj: &Value, path: &str) -> String {
    let path = if path == "source" {
        "source.component"
    } else {
        path
    };
    let mut cur = obj;
    for seg in path.split('.') {
        match cur.get(seg) {
            Some(v) => cur = v,
            None => return String::new(),
        }
    }
    match cur {
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        _ => String::new(),
    }
}

impl FieldSelector {
    pub fn parse(s: &str, kind: &str) -> ApiResult<Self> {
        let mut reqs = Vec::new();
        if s.trim().is_empty() {
            return Ok(FieldSelector(reqs));
        }
        for raw in s.split(',') {
            let (field, eq, value) = if let Some((f, v)) = raw.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = raw.split_once("==") {
                (f, true, v)
            } else if let Some((f, v)) = raw.split_once('=') {
                (f, true, v)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid field selector: {raw:?}"
                )));
            };
            let field = field.trim();
            if !matches!(field, "metadata.name" | "metadata.namespace")
                && !supported_fields(kind).contains(&field)
            {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {field}"
                )));
            }
            reqs.push((field.to_string(), eq, value.trim().to_string()));
        }
        Ok(FieldSelector(reqs))
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.0
            .iter()
            .all(|(f, eq, v)| (field_value(obj, f) == *v) == *eq)
    }

    /// True when the selector has no requirement.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn m(sel: &str, labels: Value) -> bool {
        LabelSelector::parse(sel).unwrap().matches(Some(&labels))
    }

    #[test]
    fn label_operators() {
        let l = json!({"app": "web", "tier": "gpu"});
        assert!(m("app=web", l.clone()));
        assert!(m("app==web", l.clone()));
        assert!(!m("app!=web", l.clone()));
        assert!(m("app!=db", l.clone()));
        assert!(m("app in (db, web)", l.clone()));
        assert!(!m("app notin (db,web)", l.clone()));
        assert!(m("zone notin (a)", l.clone()));
        assert!(m("tier", l.clone()));
        assert!(m("!zone", l.clone()));
        assert!(!m("!tier", l.clone()));
        assert!(m("app in (web),tier=gpu,!zone", l.clone()));
        assert!(!m("app in (web),tier=cpu", l));
        assert!(m("", json!({})));
    }

    #[test]
    fn bad_label_selectors_are_rejected() {
        for s in ["app in web", "a=b,,c", "app=we b", "app in ()"] {
            let e = LabelSelector::parse(s).unwrap_err();
            assert_eq!(e.code, 400, "{s}");
        }
    }

    #[test]
    fn label_selector_objects() {
        let s = LabelSelector::from_object(&json!({
            "matchLabels": {"app": "web"},
            "matchExpressions": [{"key": "tier", "operator": "In", "values": ["gpu"]}]
        }))
        .unwrap();
        assert!(s.matches(Some(&json!({"app": "web", "tier": "gpu"}))));
        assert!(!s.matches(Some(&json!({"app": "web"}))));
        assert!(LabelSelector::from_object(&json!({}))
            .unwrap()
            .matches(None));
    }

    #[test]
    fn field_selectors() {
        let pod = json!({"metadata": {"name": "p", "namespace": "ns"}, "spec": {"nodeName": "n1"}, "status": {"phase": "Running"}});
        let f = |s: &str| FieldSelector::parse(s, "Pod").unwrap().matches(&pod);
        assert!(f("spec.nodeName=n1"));
        assert!(f("spec.nodeName==n1,status.phase=Running"));
        assert!(!f("status.phase!=Running"));
        assert!(f("metadata.name=p,metadata.namespace=ns"));
        assert!(f("spec.schedulerName="));
        assert_eq!(
            FieldSelector::parse("spec.foo=x", "Pod").unwrap_err().code,
            400
        );
        assert_eq!(
            FieldSelector::parse("spec.nodeName=x", "ConfigMap")
                .unwrap_err()
                .code,
            400
        );
    }
}
