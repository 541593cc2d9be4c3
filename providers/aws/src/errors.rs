//! How EC2 error codes become typed [`ProviderError`]s. Pure: no SDK types, so every mapping is
//! unit-tested.

use std::time::Duration;

use gpu_node_autoscaler_provider::{OfferingKey, ProviderError};

/// Codes meaning "this offering has no capacity now" (in `CreateFleet`'s `Errors[]`).
pub const INSUFFICIENT_CAPACITY_CODES: [&str; 4] = [
    "InsufficientInstanceCapacity",
    "MaxSpotInstanceCountExceeded",
    "UnfulfillableCapacity",
    "InsufficientFreeAddressesInSubnet",
];

/// Codes of a `RunInstances` into a targeted capacity reservation meaning the reservation has
/// no room for the launch now: used up by others since it was read
/// (`ReservationCapacityExceeded`), EC2 short of the capacity it holds, or gone (ended or
/// cancelled since it was read).
pub const RESERVATION_SHORT_CODES: [&str; 2] = [
    "ReservationCapacityExceeded",
    "InvalidCapacityReservationId.NotFound",
];

/// Whether a targeted launch's error means its reservation has no room now (one of
/// [`RESERVATION_SHORT_CODES`] or [`INSUFFICIENT_CAPACITY_CODES`]).
pub fn is_reservation_short(code: Option<&str>) -> bool {
    code.is_some_and(|c| {
        RESERVATION_SHORT_CODES.contains(&c) || INSUFFICIENT_CAPACITY_CODES.contains(&c)
    })
}

/// Codes meaning an account limit was hit.
pub const QUOTA_CODES: [&str; 2] = ["VcpuLimitExceeded", "InstanceLimitExceeded"];

/// Codes meaning the API throttled us.
pub const THROTTLE_CODES: [&str; 4] = [
    "RequestLimitExceeded",
    "Throttling",
    "ThrottlingException",
    "RequestThrottled",
];

/// Codes of `TerminateInstances` meaning the instance is already gone.
pub const GONE_CODES: [&str; 1] = ["InvalidInstanceID.NotFound"];

pub fn is_throttle(code: Option<&str>) -> bool {
    code.is_some_and(|c| THROTTLE_CODES.contains(&c))
}

/// An EC2 error as the API reported it: its code (when it has one) and message.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    pub operation: &'static str,
    pub code: Option<String>,
    pub message: String,
    /// Set once the provider gave up retrying a throttled call: the last back-off it used.
    pub throttled_after: Option<Duration>,
}

impl ApiError {
    /// The error of a whole API call (not of one offering).
    pub fn into_provider_error(self) -> ProviderError {
        let code = self.code.as_deref();
        if self.throttled_after.is_some() || is_throttle(code) {
            return ProviderError::Throttled {
                retry_after: self.throttled_after,
            };
        }
        let text = match code {
            Some(c) => format!("{} failed: {c}: {}", self.operation, self.message),
            None => format!("{} failed: {}", self.operation, self.message),
        };
        match code {
            Some(c) if QUOTA_CODES.contains(&c) => ProviderError::QuotaExceeded { message: text },
            Some(c)
                if c.starts_with("InvalidParameter")
                    || c.starts_with("InvalidLaunchTemplate")
                    || c == "InvalidInstanceType"
                    || c == "MissingParameter"
                    || c == "InvalidSubnetID.NotFound"
                    || c == "UnauthorizedOperation" =>
            {
                ProviderError::InvalidRequest { message: text }
            }
            _ => ProviderError::Other { message: text },
        }
    }
}

/// Maps one item of `CreateFleet`'s `Errors[]` to the error of the offering it names.
pub fn fleet_error(offering: &OfferingKey, code: &str, message: &str) -> ProviderError {
    if INSUFFICIENT_CAPACITY_CODES.contains(&code) {
        ProviderError::InsufficientCapacity {
            offering: offering.clone(),
        }
    } else if QUOTA_CODES.contains(&code) {
        ProviderError::QuotaExceeded {
            message: format!("{code}: {message} ({offering})"),
        }
    } else if THROTTLE_CODES.contains(&code) {
        ProviderError::Throttled { retry_after: None }
    } else {
        ProviderError::Other {
            message: format!("CreateFleet {offering}: {code}: {message}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpu_node_autoscaler_provider::CapacityType;

    fn key() -> OfferingKey {
        OfferingKey {
            instance_type: "g5.xlarge".into(),
            zone: "us-east-1b".into(),
            capacity_type: CapacityType::Spot,
        }
    }

    #[test]
    fn capacity_codes_name_the_offering() {
        for code in INSUFFICIENT_CAPACITY_CODES {
            assert_eq!(
                fleet_error(&key(), code, "no room"),
                ProviderError::InsufficientCapacity { offering: key() }
            );
        }
    }

    #[test]
    fn a_reservation_without_room_is_told_by_its_capacity_codes_only() {
        for code in [
            "ReservationCapacityExceeded",
            "InvalidCapacityReservationId.NotFound",
            "InsufficientInstanceCapacity",
        ] {
            assert!(is_reservation_short(Some(code)), "{code}");
        }
        for code in [
            "VcpuLimitExceeded",
            "RequestLimitExceeded",
            "InvalidParameterValue",
            "UnauthorizedOperation",
        ] {
            assert!(!is_reservation_short(Some(code)), "{code}");
        }
        assert!(!is_reservation_short(None));
    }

    #[test]
    fn quota_throttle_and_other_codes() {
        for code in QUOTA_CODES {
            let e = fleet_error(&key(), code, "You have requested more vCPU capacity");
            assert_eq!(e.metric_label(), "quota_exceeded");
            assert!(e.to_string().contains(code), "{e}");
        }
        assert_eq!(
            fleet_error(&key(), "RequestLimitExceeded", "slow down"),
            ProviderError::Throttled { retry_after: None }
        );
        let e = fleet_error(&key(), "InvalidFleetConfiguration", "bad AMI");
        assert_eq!(e.metric_label(), "other");
        assert!(e.to_string().contains("InvalidFleetConfiguration: bad AMI"));
        assert!(e.to_string().contains("g5.xlarge/us-east-1b/spot"));
    }

    #[test]
    fn whole_call_errors_keep_code_and_message() {
        let api = |code: Option<&str>| ApiError {
            operation: "CreateFleet",
            code: code.map(str::to_string),
            message: "details".into(),
            throttled_after: None,
        };
        assert_eq!(
            api(Some("RequestLimitExceeded")).into_provider_error(),
            ProviderError::Throttled { retry_after: None }
        );
        assert_eq!(
            api(Some("VcpuLimitExceeded"))
                .into_provider_error()
                .metric_label(),
            "quota_exceeded"
        );
        assert_eq!(
            api(Some("InvalidLaunchTemplateName.NotFoundException"))
                .into_provider_error()
                .metric_label(),
            "invalid_request"
        );
        assert_eq!(
            api(Some("InternalError")).into_provider_error(),
            ProviderError::Other {
                message: "CreateFleet failed: InternalError: details".into()
            }
        );
        let mut gave_up = api(Some("RequestLimitExceeded"));
        gave_up.throttled_after = Some(Duration::from_secs(2));
        assert_eq!(
            gave_up.into_provider_error(),
            ProviderError::Throttled {
                retry_after: Some(Duration::from_secs(2))
            }
        );
    }
}
