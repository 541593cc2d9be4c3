//! Device selectors: the CEL expressions of DeviceClasses and requests, evaluated against one
//! device as the scheduler does (`device.driver`, `device.attributes[domain].name`,
//! `device.capacity[domain].name`), with Kubernetes' `quantity` and `semver` libraries.
//!
//! Evaluation uses the `cel` crate. An expression it cannot parse, a function it does not know
//! or a runtime error (such as an attribute the device does not have) is an error with the
//! interpreter's reason, never a guess.

use std::cmp::Ordering;
use std::collections::HashMap;
use std::sync::Arc;

use cel::extractors::This;
use cel::objects::{Key, Map, Opaque, Value};
use cel::{Context, Env, ExecutionError, Program};

use crate::model::dra::{AttrValue, Device};
use crate::model::quantity::{parse_quantity, Quantity};

/// A Kubernetes quantity inside CEL.
#[derive(Debug, PartialEq, Eq)]
struct CelQuantity(Quantity);

impl Opaque for CelQuantity {
    fn runtime_type_name(&self) -> &str {
        "kubernetes.Quantity"
    }
}

/// A semantic version inside CEL (`major.minor.patch[-pre]`).
#[derive(Debug, PartialEq, Eq)]
struct CelSemver {
    major: u64,
    minor: u64,
    patch: u64,
    pre: String,
}

impl Opaque for CelSemver {
    fn runtime_type_name(&self) -> &str {
        "kubernetes.Semver"
    }
}

impl CelSemver {
    fn parse(s: &str) -> Option<CelSemver> {
        let s = s.strip_prefix('v').unwrap_or(s);
        let core = s.split('+').next()?;
        let (nums, pre) = match core.split_once('-') {
            Some((n, p)) => (n, p.to_string()),
            None => (core, String::new()),
        };
        let mut parts = nums.split('.');
        let mut next = || -> Option<u64> {
            let p = parts.next()?;
            if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            p.parse().ok()
        };
        let (major, minor, patch) = (next()?, next()?, next()?);
        if parts.next().is_some() {
            return None;
        }
        Some(CelSemver {
            major,
            minor,
            patch,
            pre,
        })
    }

    fn order(&self, o: &CelSemver) -> Ordering {
        (self.major, self.minor, self.patch)
            .cmp(&(o.major, o.minor, o.patch))
            .then_with(|| match (self.pre.is_empty(), o.pre.is_empty()) {
                (true, true) => Ordering::Equal,
                (true, false) => Ordering::Greater,
                (false, true) => Ordering::Less,
                (false, false) => self.pre.cmp(&o.pre),
            })
    }
}

/// Orders two quantities or two versions.
fn compare(name: &str, a: &Value, b: &Value) -> Result<Ordering, ExecutionError> {
    if let (Value::Opaque(a), Value::Opaque(b)) = (a, b) {
        if let (Some(a), Some(b)) = (
            a.downcast_ref::<CelQuantity>(),
            b.downcast_ref::<CelQuantity>(),
        ) {
            return Ok(a.0.cmp(&b.0));
        }
        if let (Some(a), Some(b)) = (a.downcast_ref::<CelSemver>(), b.downcast_ref::<CelSemver>()) {
            return Ok(a.order(b));
        }
    }
    Err(ExecutionError::function_error(
        name,
        "takes two quantities or two semantic versions",
    ))
}

fn quantity_of(name: &str, v: &Value) -> Result<Quantity, ExecutionError> {
    match v {
        Value::Opaque(o) => o
            .downcast_ref::<CelQuantity>()
            .map(|q| q.0.clone())
            .ok_or_else(|| ExecutionError::function_error(name, "not a quantity")),
        _ => Err(ExecutionError::function_error(name, "not a quantity")),
    }
}

fn semver_of(name: &str, v: &Value) -> Result<(u64, u64, u64), ExecutionError> {
    match v {
        Value::Opaque(o) => o
            .downcast_ref::<CelSemver>()
            .map(|s| (s.major, s.minor, s.patch))
            .ok_or_else(|| ExecutionError::function_error(name, "not a semantic version")),
        _ => Err(ExecutionError::function_error(
            name,
            "not a semantic version",
        )),
    }
}

fn quantity_value(q: Quantity) -> Value {
    Value::Opaque(Arc::new(CelQuantity(q)))
}

/// The CEL value of a device, as `device` in selectors.
fn device_value(d: &Device) -> Value {
    let mut attributes: HashMap<Key, Value> = HashMap::new();
    for (domain, attrs) in &d.attributes {
        let m: HashMap<Key, Value> = attrs
            .iter()
            .map(|(k, v)| {
                let v = match v {
                    AttrValue::Int(i) => Value::Int(*i),
                    AttrValue::Bool(b) => Value::Bool(*b),
                    AttrValue::String(s) => Value::from(s.as_str()),
                    AttrValue::Version(s) => match CelSemver::parse(s) {
                        Some(v) => Value::Opaque(Arc::new(v)),
                        None => Value::from(s.as_str()),
                    },
                };
                (Key::from(k.as_str()), v)
            })
            .collect();
        attributes.insert(Key::from(domain.as_str()), Value::Map(Map::from(m)));
    }
    let mut capacity: HashMap<Key, Value> = HashMap::new();
    for (domain, caps) in &d.capacity {
        let m: HashMap<Key, Value> = caps
            .iter()
            .map(|(k, q)| (Key::from(k.as_str()), quantity_value(q.clone())))
            .collect();
        capacity.insert(Key::from(domain.as_str()), Value::Map(Map::from(m)));
    }
    let mut dev: HashMap<Key, Value> = HashMap::new();
    dev.insert(Key::from("driver"), Value::from(d.driver.as_str()));
    dev.insert(Key::from("attributes"), Value::Map(Map::from(attributes)));
    dev.insert(Key::from("capacity"), Value::Map(Map::from(capacity)));
    dev.insert(Key::from("allowMultipleAllocations"), Value::Bool(false));
    Value::Map(Map::from(dev))
}

fn register(ctx: &mut Context<'static, 'static>) -> Result<(), cel::DeclarationError> {
    ctx.add_function(
        "quantity",
        |s: Arc<String>| -> Result<Value, ExecutionError> {
            parse_quantity(&s)
                .map(quantity_value)
                .map_err(|e| ExecutionError::function_error("quantity", e.to_string()))
        },
    )?;
    ctx.add_function("isQuantity", |s: Arc<String>| -> bool {
        parse_quantity(&s).is_ok()
    })?;
    ctx.add_function(
        "semver",
        |s: Arc<String>| -> Result<Value, ExecutionError> {
            CelSemver::parse(&s)
                .map(|v| Value::Opaque(Arc::new(v)))
                .ok_or_else(|| {
                    ExecutionError::function_error("semver", format!("invalid version {s:?}"))
                })
        },
    )?;
    ctx.add_function("isSemver", |s: Arc<String>| -> bool {
        CelSemver::parse(&s).is_some()
    })?;
    ctx.add_function(
        "compareTo",
        |This(a): This<Value>, b: Value| -> Result<i64, ExecutionError> {
            Ok(compare("compareTo", &a, &b)? as i64)
        },
    )?;
    ctx.add_function(
        "isGreaterThan",
        |This(a): This<Value>, b: Value| -> Result<bool, ExecutionError> {
            Ok(compare("isGreaterThan", &a, &b)? == Ordering::Greater)
        },
    )?;
    ctx.add_function(
        "isLessThan",
        |This(a): This<Value>, b: Value| -> Result<bool, ExecutionError> {
            Ok(compare("isLessThan", &a, &b)? == Ordering::Less)
        },
    )?;
    ctx.add_function(
        "asInteger",
        |This(a): This<Value>| -> Result<i64, ExecutionError> {
            let q = quantity_of("asInteger", &a)?;
            q.to_units_ceil()
                .ok()
                .filter(|v| parse_quantity(&v.to_string()).is_ok_and(|p| p == q))
                .ok_or_else(|| {
                    ExecutionError::function_error("asInteger", "not an integer within int64")
                })
        },
    )?;
    ctx.add_function(
        "isInteger",
        |This(a): This<Value>| -> Result<bool, ExecutionError> {
            let q = quantity_of("isInteger", &a)?;
            Ok(q.to_units_ceil()
                .is_ok_and(|v| parse_quantity(&v.to_string()).is_ok_and(|p| p == q)))
        },
    )?;
    ctx.add_function(
        "asApproximateFloat",
        |This(a): This<Value>| -> Result<f64, ExecutionError> {
            Ok(quantity_of("asApproximateFloat", &a)?.as_f64())
        },
    )?;
    ctx.add_function(
        "sign",
        |This(a): This<Value>| -> Result<i64, ExecutionError> {
            let q = quantity_of("sign", &a)?;
            Ok(if q.is_zero() {
                0
            } else if q.is_negative() {
                -1
            } else {
                1
            })
        },
    )?;
    ctx.add_function(
        "major",
        |This(a): This<Value>| -> Result<i64, ExecutionError> {
            Ok(semver_of("major", &a)?.0 as i64)
        },
    )?;
    ctx.add_function(
        "minor",
        |This(a): This<Value>| -> Result<i64, ExecutionError> {
            Ok(semver_of("minor", &a)?.1 as i64)
        },
    )?;
    ctx.add_function(
        "patch",
        |This(a): This<Value>| -> Result<i64, ExecutionError> {
            Ok(semver_of("patch", &a)?.2 as i64)
        },
    )?;
    Ok(())
}

/// Compiles selector expressions once and evaluates them against devices.
pub struct Selectors {
    env: Arc<Env>,
    base: Context<'static, 'static>,
    programs: HashMap<String, Result<Arc<Program>, String>>,
}

impl Default for Selectors {
    fn default() -> Self {
        Selectors::new()
    }
}

impl Selectors {
    pub fn new() -> Selectors {
        let mut env = Env::stdlib();
        // Kubernetes' CEL has the strings extension (lowerAscii, split, ...); registering it on
        // a fresh environment cannot conflict.
        let _ = env.add_extension(cel::extensions::strings);
        let env = Arc::new(env);
        let mut base = Context::with_env(env.clone());
        register(&mut base).expect("selector functions do not clash with the standard library");
        Selectors {
            env,
            base,
            programs: HashMap::new(),
        }
    }

    fn program(&mut self, expr: &str) -> Result<Arc<Program>, String> {
        if let Some(p) = self.programs.get(expr) {
            return p.clone();
        }
        let p = self
            .env
            .compile(expr)
            .map(Arc::new)
            .map_err(|e| format!("CEL expression {expr:?} does not parse: {e}"));
        self.programs.insert(expr.to_string(), p.clone());
        p
    }

    /// Whether the expression can be parsed (checked before any device is seen).
    pub fn check(&mut self, expr: &str) -> Result<(), String> {
        self.program(expr).map(|_| ())
    }

    /// Evaluates every expression against `device`: true when all hold. An error names the
    /// expression and why it could not be evaluated.
    pub fn all_match(&mut self, exprs: &[String], device: &Device) -> Result<bool, String> {
        if exprs.is_empty() {
            return Ok(true);
        }
        let programs: Vec<(Arc<Program>, &String)> = exprs
            .iter()
            .map(|e| self.program(e).map(|p| (p, e)))
            .collect::<Result<_, _>>()?;
        let mut scope = self.base.new_inner_scope();
        scope.add_variable_from_value("device", device_value(device));
        for (p, e) in programs {
            match p.execute(&scope) {
                Ok(Value::Bool(true)) => {}
                Ok(Value::Bool(false)) => return Ok(false),
                Ok(other) => {
                    return Err(format!(
                        "CEL expression {e:?} gives {other:?}, not a boolean"
                    ))
                }
                Err(err) => {
                    return Err(format!(
                        "CEL expression {e:?} cannot be evaluated for device {} ({}): {err}",
                        device.name, device.driver
                    ))
                }
            }
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h100() -> Device {
        crate::fixtures::h100_device()
    }

    fn eval(expr: &str) -> Result<bool, String> {
        Selectors::new().all_match(&[expr.to_string()], &h100())
    }

    #[test]
    fn attribute_capacity_and_library_functions() {
        let d = r#"device.attributes["gpu.nvidia.com"]"#;
        let c = r#"device.capacity["gpu.nvidia.com"]"#;
        for (expr, want) in [
            (r#"device.driver == "gpu.nvidia.com""#.to_string(), true),
            (format!(r#"{d}.type == "gpu""#), true),
            (
                format!(r#"{d}.productName.startsWith("NVIDIA H100")"#),
                true,
            ),
            (
                format!(r#"{d}.productName.lowerAscii().contains("h100")"#),
                true,
            ),
            (
                format!(r#"{d}.productName in ["NVIDIA A100", "NVIDIA H100 80GB HBM3"]"#),
                true,
            ),
            (format!(r#"{d}.productName.matches("A100")"#), false),
            (
                format!(r#"{c}.memory.compareTo(quantity("80Gi")) >= 0"#),
                false,
            ),
            (
                format!(r#"{c}.memory.compareTo(quantity("79Gi")) >= 0"#),
                true,
            ),
            (
                format!(r#"{c}.memory.isGreaterThan(quantity("40Gi"))"#),
                true,
            ),
            (format!(r#"{c}.memory.isLessThan(quantity("40Gi"))"#), false),
            (format!(r#"{c}.memory == quantity("81559Mi")"#), true),
            (
                format!(r#"{d}.cudaComputeCapability.isGreaterThan(semver("8.9.0"))"#),
                true,
            ),
            (format!(r#"{d}.cudaComputeCapability.major() == 9"#), true),
            (format!(r#"{d}.index < 4 && {d}.index >= 0 || false"#), true),
            (format!(r#""uuid" in {d}"#), false),
            (format!(r#"has({d}.productName)"#), true),
        ] {
            assert_eq!(eval(&expr), Ok(want), "{expr}");
        }
    }

    #[test]
    fn what_cannot_be_evaluated_is_an_error() {
        let missing = eval(r#"device.attributes["gpu.nvidia.com"].uuid == "GPU-1""#).unwrap_err();
        assert!(missing.contains("cannot be evaluated"), "{missing}");
        assert!(missing.contains("uuid"), "{missing}");
        let parse = eval("device.driver ==").unwrap_err();
        assert!(parse.contains("does not parse"), "{parse}");
        let unknown = eval("nosuchfunction(device.driver)").unwrap_err();
        assert!(unknown.contains("cannot be evaluated"), "{unknown}");
        let bad_quantity = eval(r#"quantity("80 Gi") == quantity("1")"#).unwrap_err();
        assert!(bad_quantity.contains("80 Gi"), "{bad_quantity}");
        let not_bool = eval("device.driver").unwrap_err();
        assert!(not_bool.contains("not a boolean"), "{not_bool}");
    }
}
