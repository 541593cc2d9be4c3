//! How Alibaba Cloud (ESS / ECS) error codes and failed scaling activities become typed
//! [`ProviderError`]s. Pure, so every mapping is unit-tested.

use std::time::Duration;

use gpu_node_autoscaler_provider::{OfferingKey, ProviderError};

/// Codes meaning the API throttled us (flow control).
pub const THROTTLE_CODES: [&str; 3] = ["Throttling", "Throttling.User", "Throttling.Api"];

/// Codes meaning the zone/type has no inventory now.
pub const NO_STOCK_CODES: [&str; 4] = [
    "OperationDenied.NoStock",
    "NoStock",
    "InvalidResourceType.NotSupported",
    "Zone.NotOnSale",
];

/// Codes of `RemoveInstances` / `DescribeScalingInstances` meaning the instance is gone already.
pub const GONE_CODES: [&str; 3] = [
    "InvalidInstanceId.NotFound",
    "InvalidInstanceId.NotExist",
    "InstanceNotFound",
];

/// Codes meaning the scaling group cannot take the call now: another scaling activity is in
/// progress, or the group is not `Active` for the moment. Worth waiting for.
pub const BUSY_CODES: [&str; 2] = ["ScalingActivityInProgress", "IncorrectScalingGroupStatus"];

pub fn is_busy(code: &str) -> bool {
    BUSY_CODES.contains(&code)
}

pub fn is_throttle(code: &str) -> bool {
    THROTTLE_CODES.contains(&code)
}

/// Whether a code or message says the cloud has no stock (inventory) for what was asked.
pub fn is_no_stock(code: &str, message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    NO_STOCK_CODES.contains(&code)
        || code.contains("NoStock")
        || m.contains("nostock")
        || m.contains("no stock")
        || m.contains("out of stock")
        || m.contains("inventory")
        || m.contains("resource is not enough")
}

/// Whether a code or message says an account quota is exhausted.
pub fn is_quota(code: &str, message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    code.starts_with("QuotaExceed")
        || code.starts_with("QuotaExceeded")
        || code.contains("Quota")
        || m.contains("quota")
}

/// An error answer of the RPC API: `{"Code", "Message", "RequestId", ...}` with its HTTP status.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    pub operation: &'static str,
    /// `None` for transport errors and answers that were not Alibaba errors.
    pub code: Option<String>,
    pub message: String,
    pub http_status: Option<u16>,
    pub request_id: Option<String>,
    /// Set once the provider gave up retrying a throttled call: the last back-off it used.
    pub throttled_after: Option<Duration>,
}

impl ApiError {
    pub fn is_throttle(&self) -> bool {
        self.code.as_deref().is_some_and(is_throttle)
    }

    fn text(&self) -> String {
        let rid = self
            .request_id
            .as_deref()
            .map(|r| format!(" (RequestId {r})"))
            .unwrap_or_default();
        match &self.code {
            Some(c) => format!("{} failed: {c}: {}{rid}", self.operation, self.message),
            None => format!("{} failed: {}{rid}", self.operation, self.message),
        }
    }

    /// The error of a whole API call, not naming an offering (no-stock becomes `Other` here:
    /// [`offering_error`] is the place that knows which offering it hit).
    pub fn into_provider_error(self) -> ProviderError {
        if self.throttled_after.is_some() || self.is_throttle() {
            return ProviderError::Throttled {
                retry_after: self.throttled_after,
            };
        }
        let code = self.code.clone().unwrap_or_default();
        let text = self.text();
        if is_quota(&code, "") {
            ProviderError::QuotaExceeded { message: text }
        } else if code.ends_with(".NotFound") || code.ends_with(".NotExist") {
            ProviderError::NotFound { id: text }
        } else if code.starts_with("InvalidParameter")
            || code.starts_with("MissingParameter")
            || code.starts_with("Invalid")
            || code.starts_with("Forbidden")
            || code == "SignatureDoesNotMatch"
            || code == "IncompleteSignature"
        {
            ProviderError::InvalidRequest { message: text }
        } else {
            ProviderError::Other { message: text }
        }
    }
}

/// `<operation> failed: <code>: <message> (RequestId ...)`; never the request URL.
impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text())
    }
}

/// The error of one offering, from a code and message (of an API error or a failed scaling
/// activity's `StatusCode` / `StatusMessage`).
pub fn offering_error(offering: &OfferingKey, code: &str, message: &str) -> ProviderError {
    if is_no_stock(code, message) {
        ProviderError::InsufficientCapacity {
            offering: offering.clone(),
        }
    } else if is_throttle(code) {
        ProviderError::Throttled { retry_after: None }
    } else if is_quota(code, message) {
        ProviderError::QuotaExceeded {
            message: format!("{code}: {message} ({offering})"),
        }
    } else {
        ProviderError::Other {
            message: format!("scaling {offering}: {code}: {message}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpu_node_autoscaler_provider::CapacityType;

    fn key() -> OfferingKey {
        OfferingKey {
            instance_type: "ecs.gn7i-c8g1.2xlarge".into(),
            zone: "cn-hangzhou-i".into(),
            capacity_type: CapacityType::Spot,
        }
    }

    fn api(code: &str) -> ApiError {
        ApiError {
            operation: "ScaleWithAdjustment",
            code: Some(code.into()),
            message: "m".into(),
            http_status: Some(400),
            request_id: Some("R-1".into()),
            throttled_after: None,
        }
    }

    #[test]
    fn throttle_codes_become_throttled() {
        for c in THROTTLE_CODES {
            assert_eq!(
                api(c).into_provider_error(),
                ProviderError::Throttled { retry_after: None }
            );
        }
        let mut e = api("Throttling.User");
        e.throttled_after = Some(Duration::from_secs(2));
        assert_eq!(
            e.into_provider_error(),
            ProviderError::Throttled {
                retry_after: Some(Duration::from_secs(2))
            }
        );
    }

    #[test]
    fn quota_invalid_and_other_keep_code_and_message() {
        let q = api("QuotaExceed.ElasticQuota").into_provider_error();
        assert_eq!(q.metric_label(), "quota_exceeded");
        assert!(q.to_string().contains("QuotaExceed.ElasticQuota: m"));
        assert!(q.to_string().contains("R-1"));
        assert_eq!(
            api("InvalidParameter.Conflict")
                .into_provider_error()
                .metric_label(),
            "invalid_request"
        );
        assert_eq!(
            api("InvalidScalingGroupId.NotFound")
                .into_provider_error()
                .metric_label(),
            "not_found"
        );
        let o = api("IncorrectScalingGroupStatus").into_provider_error();
        assert_eq!(o.metric_label(), "other");
        assert!(o
            .to_string()
            .contains("ScaleWithAdjustment failed: IncorrectScalingGroupStatus"));
    }

    #[test]
    fn no_stock_by_code_or_message_names_the_offering() {
        assert_eq!(
            offering_error(
                &key(),
                "OperationDenied.NoStock",
                "The requested resource is sold out"
            ),
            ProviderError::InsufficientCapacity { offering: key() }
        );
        assert_eq!(
            offering_error(
                &key(),
                "",
                "Instance creation failed: insufficient inventory in zone"
            ),
            ProviderError::InsufficientCapacity { offering: key() }
        );
        assert_eq!(
            offering_error(&key(), "QuotaExceed.PostPaidInstance", "quota").metric_label(),
            "quota_exceeded"
        );
        assert_eq!(
            offering_error(&key(), "InvalidImageId.NotFound", "image").metric_label(),
            "other"
        );
    }
}
