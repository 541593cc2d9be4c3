//! `resource.k8s.io/v1` objects → model: ResourceClaims, ResourceClaimTemplates, DeviceClasses,
//! ResourceSlices, and the claims a Pod names. Part of [`super`], the one module that knows
//! Kubernetes field names.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::Value;

use crate::model::dra::{
    Allocation, AttrValue, Claim, ClaimSpec, Device, DeviceClass, DeviceCount, DeviceRequest,
    PodClaim, Slice, SubRequest,
};
use crate::model::quantity::parse_quantity;

use super::Converter;

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct Meta {
    name: String,
    namespace: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct CelSelector {
    cel: Option<Cel>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Cel {
    expression: String,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct RawSub {
    name: String,
    device_class_name: String,
    selectors: Vec<CelSelector>,
    allocation_mode: Option<String>,
    count: Option<i64>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct RawRequest {
    name: String,
    exactly: Option<RawSub>,
    first_available: Vec<RawSub>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RawDevices {
    requests: Vec<RawRequest>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RawClaimSpec {
    devices: RawDevices,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RawResult {
    driver: String,
    pool: String,
    device: String,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RawAllocatedDevices {
    results: Vec<RawResult>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct RawAllocation {
    devices: RawAllocatedDevices,
    node_selector: Option<Value>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RawClaimStatus {
    allocation: Option<RawAllocation>,
}

#[derive(Deserialize)]
struct RawClaim {
    metadata: Meta,
    #[serde(default)]
    spec: RawClaimSpec,
    #[serde(default)]
    status: RawClaimStatus,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RawTemplateSpec {
    spec: RawClaimSpec,
}

#[derive(Deserialize)]
struct RawTemplate {
    metadata: Meta,
    #[serde(default)]
    spec: RawTemplateSpec,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RawClassSpec {
    selectors: Vec<CelSelector>,
}

#[derive(Deserialize)]
struct RawClass {
    metadata: Meta,
    #[serde(default)]
    spec: RawClassSpec,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct RawAttr {
    int: Option<i64>,
    bool: Option<bool>,
    string: Option<String>,
    version: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RawCapacity {
    value: Option<Value>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RawDevice {
    name: String,
    attributes: BTreeMap<String, RawAttr>,
    capacity: BTreeMap<String, RawCapacity>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RawPool {
    name: String,
    generation: i64,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct RawSliceSpec {
    driver: String,
    pool: RawPool,
    node_name: Option<String>,
    devices: Vec<RawDevice>,
}

#[derive(Deserialize)]
struct RawSlice {
    metadata: Meta,
    #[serde(default)]
    spec: RawSliceSpec,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
pub(super) struct PodClaimRef {
    name: String,
    resource_claim_name: Option<String>,
    resource_claim_template_name: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
pub(super) struct PodClaimStatus {
    name: String,
    resource_claim_name: Option<String>,
}

fn selectors(list: &[CelSelector], at: &str) -> Result<Vec<String>, String> {
    list.iter()
        .enumerate()
        .map(|(i, s)| match &s.cel {
            Some(c) if !c.expression.is_empty() => Ok(c.expression.clone()),
            _ => Err(format!(
                "{at}.selectors[{i}]: only `cel` selectors are known"
            )),
        })
        .collect()
}

fn sub_request(s: &RawSub, at: &str) -> Result<SubRequest, String> {
    if s.device_class_name.is_empty() {
        return Err(format!("{at}.deviceClassName is missing"));
    }
    let count = match s.allocation_mode.as_deref().unwrap_or("ExactCount") {
        "ExactCount" => {
            let n = s.count.unwrap_or(1);
            if n < 1 || n > u32::MAX as i64 {
                return Err(format!("{at}.count {n} is not a positive count"));
            }
            DeviceCount::Exact(n as u32)
        }
        "All" => DeviceCount::All,
        other => {
            return Err(format!(
                "{at}.allocationMode {other:?} is not ExactCount or All"
            ))
        }
    };
    Ok(SubRequest {
        class: s.device_class_name.clone(),
        selectors: selectors(&s.selectors, at)?,
        count,
    })
}

fn claim_spec(raw: &RawClaimSpec) -> Result<ClaimSpec, String> {
    let mut requests = Vec::new();
    for (i, r) in raw.devices.requests.iter().enumerate() {
        let at = format!("spec.devices.requests[{i}]");
        let alternatives = match (&r.exactly, r.first_available.is_empty()) {
            (Some(e), true) => vec![sub_request(e, &format!("{at}.exactly"))?],
            (None, false) => r
                .first_available
                .iter()
                .enumerate()
                .map(|(j, s)| sub_request(s, &format!("{at}.firstAvailable[{j}] ({})", s.name)))
                .collect::<Result<_, _>>()?,
            _ => {
                return Err(format!(
                    "{at}: exactly one of `exactly` and `firstAvailable`"
                ))
            }
        };
        requests.push(DeviceRequest {
            name: r.name.clone(),
            alternatives,
        });
    }
    Ok(ClaimSpec { requests })
}

/// The node an allocation's node selector names (`matchFields` `metadata.name In [node]`, as
/// the scheduler writes it), if it names one.
fn allocated_node(sel: &Value) -> Option<String> {
    let terms = sel.get("nodeSelectorTerms")?.as_array()?;
    terms.iter().find_map(|t| {
        t.get("matchFields")?.as_array()?.iter().find_map(|e| {
            let key = e.get("key")?.as_str()?;
            let op = e.get("operator")?.as_str()?;
            let values = e.get("values")?.as_array()?;
            (key == "metadata.name" && op == "In" && values.len() == 1)
                .then(|| values[0].as_str().map(str::to_string))
                .flatten()
        })
    })
}

fn namespaced(m: &Meta) -> String {
    format!("{}/{}", m.namespace.as_deref().unwrap_or("default"), m.name)
}

/// An attribute or capacity name of a device: `domain/name`, or the driver's domain for an
/// unqualified name.
fn qualified<'a>(name: &'a str, driver: &'a str) -> (&'a str, &'a str) {
    name.split_once('/').unwrap_or((driver, name))
}

impl Converter {
    fn intern_spec(&mut self, spec: ClaimSpec) -> Arc<ClaimSpec> {
        self.claim_specs
            .entry(spec.clone())
            .or_insert_with(|| Arc::new(spec))
            .clone()
    }

    /// A ResourceClaim, by `namespace/name`.
    pub fn resource_claim(&mut self, v: Value) -> Result<(String, Claim), String> {
        let raw: RawClaim =
            serde_json::from_value(v).map_err(|e| format!("not a ResourceClaim: {e}"))?;
        let spec = self.intern_spec(claim_spec(&raw.spec)?);
        let allocation = raw.status.allocation.map(|a| Allocation {
            node: a.node_selector.as_ref().and_then(allocated_node),
            devices: a
                .devices
                .results
                .into_iter()
                .map(|r| (r.driver, r.pool, r.device))
                .collect(),
        });
        Ok((namespaced(&raw.metadata), Claim { spec, allocation }))
    }

    /// A ResourceClaimTemplate, by `namespace/name`: the spec of the claims made from it.
    pub fn resource_claim_template(
        &mut self,
        v: Value,
    ) -> Result<(String, Arc<ClaimSpec>), String> {
        let raw: RawTemplate =
            serde_json::from_value(v).map_err(|e| format!("not a ResourceClaimTemplate: {e}"))?;
        let spec = self.intern_spec(claim_spec(&raw.spec.spec)?);
        Ok((namespaced(&raw.metadata), spec))
    }

    /// A DeviceClass.
    pub fn device_class(&mut self, v: Value) -> Result<DeviceClass, String> {
        let raw: RawClass =
            serde_json::from_value(v).map_err(|e| format!("not a DeviceClass: {e}"))?;
        Ok(DeviceClass {
            selectors: selectors(&raw.spec.selectors, "spec")?,
            name: raw.metadata.name,
        })
    }

    /// A ResourceSlice of one node, by name; `None` for slices of devices reachable from
    /// several nodes (`nodeSelector`, `allNodes`), which are not planned with.
    pub fn resource_slice(&mut self, v: Value) -> Result<Option<(String, Slice)>, String> {
        let raw: RawSlice =
            serde_json::from_value(v).map_err(|e| format!("not a ResourceSlice: {e}"))?;
        let spec = raw.spec;
        let Some(node) = spec.node_name.filter(|n| !n.is_empty()) else {
            return Ok(None);
        };
        let mut devices = Vec::new();
        for (i, d) in spec.devices.into_iter().enumerate() {
            let mut attributes: BTreeMap<String, BTreeMap<String, AttrValue>> = BTreeMap::new();
            for (name, a) in d.attributes {
                let value = match (a.int, a.bool, a.string, a.version) {
                    (Some(i), None, None, None) => AttrValue::Int(i),
                    (None, Some(b), None, None) => AttrValue::Bool(b),
                    (None, None, Some(s), None) => AttrValue::String(s),
                    (None, None, None, Some(v)) => AttrValue::Version(v),
                    _ => {
                        return Err(format!(
                            "spec.devices[{i}] ({}): attribute {name} needs exactly one of int, \
                             bool, string, version",
                            d.name
                        ))
                    }
                };
                let (domain, id) = qualified(&name, &spec.driver);
                attributes
                    .entry(domain.to_string())
                    .or_default()
                    .insert(id.to_string(), value);
            }
            let mut capacity: BTreeMap<String, BTreeMap<String, _>> = BTreeMap::new();
            for (name, c) in d.capacity {
                let q = match &c.value {
                    Some(Value::String(s)) => parse_quantity(s).map_err(|e| e.to_string()),
                    Some(Value::Number(n)) => {
                        parse_quantity(&n.to_string()).map_err(|e| e.to_string())
                    }
                    _ => Err("no value".to_string()),
                }
                .map_err(|e| format!("spec.devices[{i}] ({}): capacity {name}: {e}", d.name))?;
                let (domain, id) = qualified(&name, &spec.driver);
                capacity
                    .entry(domain.to_string())
                    .or_default()
                    .insert(id.to_string(), q);
            }
            devices.push(Device {
                driver: spec.driver.clone(),
                name: d.name,
                attributes,
                capacity,
            });
        }
        Ok(Some((
            raw.metadata.name,
            Slice {
                node,
                driver: spec.driver,
                pool: spec.pool.name,
                generation: spec.pool.generation,
                devices,
            },
        )))
    }
}

/// The claims a pod names (`spec.resourceClaims`), with the claim made for it from a template
/// once `status.resourceClaimStatuses` says which. Their specs are filled in when joined with
/// the cluster's claims ([`crate::model::dra::DraObjects::join`]).
pub(super) fn pod_claims(
    namespace: &str,
    pod: &str,
    refs: &[PodClaimRef],
    statuses: &[PodClaimStatus],
) -> Vec<PodClaim> {
    refs.iter()
        .map(|r| {
            let generated = statuses
                .iter()
                .find(|s| s.name == r.name)
                .and_then(|s| s.resource_claim_name.clone());
            let claim = match (&r.resource_claim_name, &generated) {
                (Some(c), _) | (None, Some(c)) => format!("{namespace}/{c}"),
                (None, None) => format!("{namespace}/{pod}/{}", r.name),
            };
            PodClaim {
                name: r.name.clone(),
                claim,
                template: r
                    .resource_claim_template_name
                    .as_ref()
                    .map(|t| format!("{namespace}/{t}")),
                spec: Arc::new(ClaimSpec::default()),
                allocation: None,
                counted_here: true,
            }
        })
        .collect()
}
