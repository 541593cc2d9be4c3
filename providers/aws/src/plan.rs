//! Pure helpers for launching: idempotency tokens, grouping a request's offerings into fleets,
//! back-off delays, provider ids. No SDK types.

use std::hash::Hasher;

use gpu_node_autoscaler_provider::{CapacityType, OfferingKey};

/// The longest `ClientToken` EC2 accepts.
pub const MAX_CLIENT_TOKEN: usize = 64;

/// FNV-1a, 64 bits: stable across runs, platforms and Rust versions (unlike `DefaultHasher`).
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h = fnv::FnvHasher::default();
    h.write(bytes);
    h.finish()
}

/// The `ClientToken` of one `CreateFleet` call: derived from the launch id, the capacity type,
/// how many instances the call asks for and the offerings it may use, so that a retried identical
/// call is idempotent at EC2 while any different request gets a token of its own — a follow-up for
/// the remainder, or the same launch again once an offering was dropped for lack of capacity (EC2
/// rejects a reused token with different parameters). At most 64 ASCII characters.
pub fn client_token(
    launch_id: &str,
    capacity_type: CapacityType,
    count: u32,
    offerings: &[OfferingKey],
) -> String {
    let mut full = format!("{launch_id}/{capacity_type}/{count}");
    for o in offerings {
        full.push_str(&format!("/{o}"));
    }
    let readable: String = launch_id
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
        .take(32)
        .collect();
    let ct = match capacity_type {
        CapacityType::Spot => "s",
        CapacityType::OnDemand => "od",
        CapacityType::Reserved => "r",
    };
    let token = format!("gna-{readable}-{ct}{count}-{:016x}", fnv1a(full.as_bytes()));
    debug_assert!(token.len() <= MAX_CLIENT_TOKEN);
    token
}

/// The `ClientToken` of one `RunInstances` into capacity reservation `reservation`: derived
/// from the launch id, the reservation, how many of the launch's instances existed before the
/// call (`done`) and how many it asks for, so that a retried identical call is idempotent at EC2
/// and a follow-up for the remainder gets a token of its own. At most 64 ASCII characters.
pub fn reservation_client_token(
    launch_id: &str,
    reservation: &str,
    done: u32,
    count: u32,
) -> String {
    let full = format!("{launch_id}/reserved/{reservation}/{done}/{count}");
    let readable: String = launch_id
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
        .take(32)
        .collect();
    let token = format!("gna-{readable}-r{count}-{:016x}", fnv1a(full.as_bytes()));
    debug_assert!(token.len() <= MAX_CLIENT_TOKEN);
    token
}

/// The request's offerings grouped by capacity type, groups in the order their first offering
/// appears, offerings in request order within a group (duplicates dropped).
pub fn group_by_capacity_type(offerings: &[OfferingKey]) -> Vec<(CapacityType, Vec<OfferingKey>)> {
    let mut groups: Vec<(CapacityType, Vec<OfferingKey>)> = Vec::new();
    for o in offerings {
        match groups.iter_mut().find(|(ct, _)| *ct == o.capacity_type) {
            Some((_, list)) => {
                if !list.contains(o) {
                    list.push(o.clone())
                }
            }
            None => groups.push((o.capacity_type, vec![o.clone()])),
        }
    }
    groups
}

/// `aws:///<zone>/<instance-id>`, the `spec.providerID` of an EC2 node.
pub fn provider_id(zone: &str, instance_id: &str) -> String {
    format!("aws:///{zone}/{instance_id}")
}

/// The instance id in an instance id or an `aws:///<zone>/<id>` provider id.
pub fn instance_id_of(id: &str) -> &str {
    if id.starts_with("aws://") {
        id.rsplit('/').next().unwrap_or(id)
    } else {
        id
    }
}

/// Whether a string looks like an EC2 instance id (`i-` and hex digits).
pub fn is_instance_id(id: &str) -> bool {
    id.strip_prefix("i-")
        .is_some_and(|h| !h.is_empty() && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn o(t: &str, z: &str, ct: CapacityType) -> OfferingKey {
        OfferingKey {
            instance_type: t.into(),
            zone: z.into(),
            capacity_type: ct,
        }
    }

    #[test]
    fn client_tokens_are_short_stable_and_distinct() {
        let long = "x".repeat(200);
        let a = [
            o("g5.xlarge", "a", CapacityType::Spot),
            o("g5.xlarge", "b", CapacityType::Spot),
        ];
        let t = client_token(&long, CapacityType::Spot, 3, &a);
        assert!(t.len() <= MAX_CLIENT_TOKEN, "{t}");
        assert_eq!(t, client_token(&long, CapacityType::Spot, 3, &a));
        assert_ne!(t, client_token(&long, CapacityType::OnDemand, 3, &a));
        assert_ne!(t, client_token(&long, CapacityType::Spot, 2, &a));
        // The same launch without an offering found short of capacity is another request.
        assert_ne!(t, client_token(&long, CapacityType::Spot, 3, &a[1..]));
        let t = client_token("scale-up 42/ü", CapacityType::OnDemand, 10, &[]);
        assert!(t.is_ascii() && t.starts_with("gna-scale-up42-od10-"), "{t}");
        // EC2 keeps a token's request for hours: a token must not change between releases, or a
        // call retried across an upgrade would launch twice.
        assert_eq!(
            client_token("launch-1", CapacityType::Spot, 3, &a[..1]),
            "gna-launch-1-s3-e190fd7f5f3f8b62"
        );
    }

    #[test]
    fn reservation_client_tokens_are_short_stable_and_distinct() {
        let long = "x".repeat(200);
        let t = reservation_client_token(&long, "cr-0aaa", 0, 3);
        assert!(t.len() <= MAX_CLIENT_TOKEN, "{t}");
        assert_eq!(t, reservation_client_token(&long, "cr-0aaa", 0, 3));
        assert_ne!(t, reservation_client_token(&long, "cr-0bbb", 0, 3));
        assert_ne!(t, reservation_client_token(&long, "cr-0aaa", 1, 2));
        assert_ne!(t, reservation_client_token(&long, "cr-0aaa", 0, 2));
        // Never a fleet's token of the same launch.
        assert_ne!(t, client_token(&long, CapacityType::Reserved, 3, &[]));
    }

    #[test]
    fn groups_keep_request_order() {
        use CapacityType::*;
        let req = [
            o("g5.xlarge", "a", OnDemand),
            o("g5.xlarge", "a", Spot),
            o("g5.xlarge", "b", OnDemand),
            o("g5.xlarge", "a", OnDemand),
        ];
        let g = group_by_capacity_type(&req);
        assert_eq!(g.len(), 2);
        assert_eq!(g[0].0, OnDemand);
        assert_eq!(g[0].1, vec![req[0].clone(), req[2].clone()]);
        assert_eq!(g[1], (Spot, vec![req[1].clone()]));
    }

    #[test]
    fn provider_ids_round_trip() {
        let p = provider_id("us-east-1a", "i-0abc");
        assert_eq!(p, "aws:///us-east-1a/i-0abc");
        assert_eq!(instance_id_of(&p), "i-0abc");
        assert_eq!(instance_id_of("i-0abc"), "i-0abc");
        assert!(is_instance_id("i-0abc123"));
        assert!(!is_instance_id("i-"));
        assert!(!is_instance_id("vol-0abc"));
    }
}
