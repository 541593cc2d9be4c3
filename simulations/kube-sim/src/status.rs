//! API errors rendered as `Status` objects, as kube-apiserver does.

use serde_json::{json, Value};

use crate::resources::ResourceDef;

#[derive(Debug, Clone)]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Value>,
}

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    pub fn not_found(res: &ResourceDef, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} \"{}\" not found", res.qualified(), name),
        )
        .with_details(details(res, name))
    }

    pub fn path_not_found(path: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("the server could not find the requested resource ({path})"),
        )
    }

    pub fn already_exists(res: &ResourceDef, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{}\" already exists", res.qualified(), name),
        )
        .with_details(details(res, name))
    }

    pub fn conflict(res: &ResourceDef, name: &str, why: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{}\": {}",
                res.qualified(),
                name,
                why
            ),
        )
        .with_details(details(res, name))
    }

    /// 422 with one cause per `(field, message)`.
    pub fn invalid(res: &ResourceDef, name: &str, causes: &[(String, String)]) -> Self {
        let summary: Vec<String> = causes.iter().map(|(f, m)| format!("{f}: {m}")).collect();
        let message = if summary.len() == 1 {
            format!("{} \"{}\" is invalid: {}", res.kind, name, summary[0])
        } else {
            format!(
                "{} \"{}\" is invalid: [{}]",
                res.kind,
                name,
                summary.join(", ")
            )
        };
        let causes: Vec<Value> = causes
            .iter()
            .map(|(f, m)| json!({"reason": "FieldValueInvalid", "message": m, "field": f}))
            .collect();
        let mut d = json!({"name": name, "group": res.group, "kind": res.kind, "causes": causes});
        if res.group.is_empty() {
            d.as_object_mut().map(|o| o.remove("group"));
        }
        Self::new(422, "Invalid", message).with_details(d)
    }

    pub fn method_not_allowed(what: &str) -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            format!("the server does not allow this method on the requested resource ({what})"),
        )
    }

    pub fn unsupported_media_type(ct: &str) -> Self {
        Self::new(415, "UnsupportedMediaType", format!("the body of the request was in an unknown format - accepted media types include: application/json, application/yaml (got {ct:?})"))
    }

    pub fn too_many_requests(message: impl Into<String>, causes: Value) -> Self {
        Self::new(429, "TooManyRequests", message).with_details(json!({"causes": causes}))
    }

    pub fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    pub fn to_status(&self) -> Value {
        let mut v = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(d) = &self.details {
            v["details"] = d.clone();
        }
        v
    }
}

fn details(res: &ResourceDef, name: &str) -> Value {
    let mut d = json!({"name": name, "kind": res.plural});
    if !res.group.is_empty() {
        d["group"] = json!(res.group);
    }
    d
}

/// A `Status` with `status: Success`.
pub fn success(code: u16, details: Option<Value>) -> Value {
    let mut v = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": code});
    if let Some(d) = details {
        v["details"] = d;
    }
    v
}

pub type ApiResult<T> = Result<T, ApiError>;
