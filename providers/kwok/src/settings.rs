//! A pool's `kwok:` section: the capacity reservations a kwok cluster stands in for (a cloud
//! account's On-Demand Capacity Reservations and Capacity Blocks, which a kwok cluster has no
//! other place for). The pool still selects what it launches into with `capacityReservations`,
//! as on a cloud; the section only says what the "account" holds.
//!
//! ```yaml
//! kwok:
//!   reservations:
//!     - {id: cr-0block1, kind: capacity-block, instanceType: p5.48xlarge, zone: us-east-1a,
//!        total: 2, startMs: 1796000000000, endMs: 1796003600000}
//! ```
//!
//! Each entry is a [`Reservation`] as `plan --reservations` reads it, without `available`: the
//! provider counts that from the Nodes launched into it.

use std::collections::BTreeMap;

use gpu_node_autoscaler_provider::policy::{
    decode_section, is_resource_id, FieldError, PathKey, PoolFacts, PoolSection, ProviderPolicy,
    Value,
};
use gpu_node_autoscaler_provider::{Reservation, ReservationKind};

/// The provider's name in policies (`provider: kwok`) and the key of its pool section.
pub const NAME: &str = "kwok";

/// The fields of one reservation in the section.
const FIELDS: [&str; 9] = [
    "id",
    "kind",
    "instanceType",
    "zone",
    "total",
    "startMs",
    "endMs",
    "tags",
    "pricePerHour",
];

/// The kwok provider's part of the policy: `provider: kwok` and its `kwok:` section.
#[derive(Clone, Copy, Debug)]
pub struct KwokPolicy;

/// The reservations of a pool's `kwok:` section (each with `available` = `total`; the provider
/// counts what is taken), or the first error, with its path inside the pool.
pub fn reservations(section: &Value) -> Result<Vec<Reservation>, FieldError> {
    let mut errors = Vec::new();
    let out = decode(section, None, &mut errors);
    match errors.into_iter().next() {
        None => Ok(out),
        Some(e) => Err(e),
    }
}

fn at(path: Vec<PathKey>, message: impl Into<String>) -> FieldError {
    let mut p = vec![PathKey::from(NAME)];
    p.extend(path);
    FieldError {
        path: p,
        message: message.into(),
    }
}

fn key(k: &str) -> PathKey {
    PathKey::from(k)
}

/// The section's reservations, with every error found (paths inside the pool); `pool` is `None`
/// when only the section itself is checked.
fn decode(
    section: &Value,
    pool: Option<&PoolFacts<'_>>,
    errors: &mut Vec<FieldError>,
) -> Vec<Reservation> {
    let mut out = Vec::new();
    if let Some(pool) = pool {
        if pool.provider != NAME {
            errors.push(at(
                Vec::new(),
                format!(
                    "`kwok` settings need `provider: kwok` (the pool's provider is {})",
                    pool.provider
                ),
            ));
        }
    }
    let Some(map) = section.as_object() else {
        errors.push(at(Vec::new(), "expected a mapping with `reservations`"));
        return out;
    };
    for k in map.keys().filter(|k| *k != "reservations") {
        errors.push(at(
            vec![key(k)],
            format!("unknown field `{k}`, expected `reservations`"),
        ));
    }
    let Some(list) = map.get("reservations") else {
        return out;
    };
    let Some(list) = list.as_array() else {
        errors.push(at(vec![key("reservations")], "expected a list"));
        return out;
    };
    for (i, entry) in list.iter().enumerate() {
        let here = |rest: &[&str]| {
            let mut p = vec![key("reservations"), PathKey::Index(i)];
            p.extend(rest.iter().map(|k| key(k)));
            p
        };
        let Some(fields) = entry.as_object() else {
            errors.push(at(here(&[]), "expected a mapping"));
            continue;
        };
        if let Some(k) = fields.keys().find(|k| !FIELDS.contains(&k.as_str())) {
            let message = if k == "available" {
                "not written: the kwok provider counts what is available from the Nodes \
                 launched into the reservation"
                    .to_string()
            } else {
                format!("unknown field `{k}`, expected one of {}", FIELDS.join(", "))
            };
            errors.push(at(here(&[k]), message));
            continue;
        }
        let mut with_available = fields.clone();
        if let Some(total) = fields.get("total") {
            with_available.insert("available".into(), total.clone());
        }
        let r: Reservation = match decode_section(&Value::Object(with_available)) {
            Ok(r) => r,
            Err(e) => {
                let mut p = here(&[]);
                p.extend(e.path);
                errors.push(at(p, e.message));
                continue;
            }
        };
        if !is_resource_id(&r.id, "cr-") {
            errors.push(at(
                here(&["id"]),
                format!("{:?} is not a capacity reservation id (cr-...)", r.id),
            ));
        }
        if out.iter().any(|o: &Reservation| o.id == r.id) {
            errors.push(at(
                here(&["id"]),
                format!("duplicate capacity reservation {:?}", r.id),
            ));
        }
        if r.total == 0 {
            errors.push(at(here(&["total"]), "must be at least 1"));
        }
        if let Some(pool) = pool {
            if !pool.zones.contains(&r.zone) {
                errors.push(at(
                    here(&["zone"]),
                    format!(
                        "{} is not one of the pool's zones ({})",
                        r.zone,
                        pool.zones.join(", ")
                    ),
                ));
            }
        }
        if r.kind == ReservationKind::CapacityBlock && r.end_ms.is_none() {
            errors.push(at(
                here(&[]),
                "a capacity-block needs `endMs` (when the cloud takes its instances back)",
            ));
        }
        if let (Some(s), Some(e)) = (r.start_ms, r.end_ms) {
            if e <= s {
                errors.push(at(here(&["endMs"]), "must be after `startMs`"));
            }
        }
        out.push(r);
    }
    out
}

impl ProviderPolicy for KwokPolicy {
    fn name(&self) -> &'static str {
        NAME
    }

    fn section(&self) -> Option<&'static str> {
        Some(NAME)
    }

    fn decode(&self, section: &Value) -> Result<(), FieldError> {
        reservations(section).map(|_| ())
    }

    fn validate_pool(&self, section: Option<&Value>, pool: &PoolFacts<'_>) -> Vec<FieldError> {
        let mut errors = Vec::new();
        if let Some(section) = section {
            decode(section, Some(pool), &mut errors);
        }
        errors
    }

    /// A reservation declared by two pools is declared alike (it is one of the account's).
    fn validate_pools(&self, pools: &[PoolSection<'_>]) -> Vec<(usize, FieldError)> {
        let mut seen: BTreeMap<String, (Reservation, &str)> = BTreeMap::new();
        let mut out = Vec::new();
        for p in pools {
            let Ok(list) = reservations(p.section) else {
                continue;
            };
            for (i, r) in list.into_iter().enumerate() {
                match seen.get(&r.id) {
                    Some((first, name)) if *first != r => out.push((
                        p.index,
                        at(
                            vec![key("reservations"), PathKey::Index(i)],
                            format!(
                                "reservation {} is declared differently by pool {name}",
                                r.id
                            ),
                        ),
                    )),
                    Some(_) => {}
                    None => {
                        seen.insert(r.id.clone(), (r, p.name));
                    }
                }
            }
        }
        out
    }
}

#[cfg(all(test, feature = "client"))]
mod tests {
    use super::*;
    use gpu_node_autoscaler_provider::CapacityType;

    fn section(yaml: &str) -> Value {
        serde_json::from_str(yaml).unwrap()
    }

    fn facts<'a>(zones: &'a [String]) -> PoolFacts<'a> {
        PoolFacts {
            name: "h100",
            provider: "kwok",
            zones,
            capacity_types: &[CapacityType::Reserved, CapacityType::OnDemand],
        }
    }

    #[test]
    fn a_kwok_reservation_is_read_with_its_count_available() {
        let s = section(
            r#"{"reservations": [{"id": "cr-0block1", "kind": "capacity-block",
                "instanceType": "p5.48xlarge", "zone": "us-east-1a", "total": 2,
                "startMs": 1000, "endMs": 5000}]}"#,
        );
        let r = reservations(&s).unwrap();
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].kind, ReservationKind::CapacityBlock);
        assert_eq!((r[0].total, r[0].available), (2, 2));
        assert_eq!((r[0].start_ms, r[0].end_ms), (Some(1000), Some(5000)));
        let zones = vec!["us-east-1a".to_string()];
        assert!(KwokPolicy
            .validate_pool(Some(&s), &facts(&zones))
            .is_empty());
    }

    #[test]
    fn kwok_reservation_errors_name_the_field() {
        let zones = vec!["us-east-1a".to_string()];
        let errors = |s: &str| -> Vec<String> {
            KwokPolicy
                .validate_pool(Some(&section(s)), &facts(&zones))
                .iter()
                .map(ToString::to_string)
                .collect()
        };
        let e = errors(
            r#"{"reservations": [{"id": "block", "kind": "capacity-block",
                "instanceType": "p5.48xlarge", "zone": "us-west-2a", "total": 0}]}"#,
        );
        assert!(
            e.contains(
                &"kwok.reservations[0].id: \"block\" is not a capacity reservation id (cr-...)"
                    .to_string()
            ),
            "{e:?}"
        );
        assert!(
            e.iter()
                .any(|x| x.starts_with("kwok.reservations[0].zone: us-west-2a is not one of")),
            "{e:?}"
        );
        assert!(
            e.contains(&"kwok.reservations[0].total: must be at least 1".to_string()),
            "{e:?}"
        );
        assert!(
            e.iter()
                .any(|x| x.starts_with("kwok.reservations[0]: a capacity-block needs `endMs`")),
            "{e:?}"
        );
        let e = errors(
            r#"{"reservations": [{"id": "cr-1", "instanceType": "p5.48xlarge",
                "zone": "us-east-1a", "total": 1, "available": 1}]}"#,
        );
        assert!(
            e[0].starts_with("kwok.reservations[0].available: not written"),
            "{e:?}"
        );
        let e = errors(
            r#"{"reservations": [{"id": "cr-1", "kind": "default",
                "instanceType": "p5.48xlarge", "zone": "us-east-1a"}]}"#,
        );
        assert!(e[0].starts_with("kwok.reservations[0]"), "{e:?}");
        assert!(e[0].contains("total"), "{e:?}");
        let e = errors(r#"{"reservation": []}"#);
        assert_eq!(
            e,
            ["kwok.reservation: unknown field `reservation`, expected `reservations`"]
        );
    }
}
