//! EC2 interruption and maintenance notices, as EventBridge delivers them to an SQS queue: spot
//! interruption warnings, rebalance recommendations, instance state changes and AWS Health
//! scheduled changes. Parsing is pure; [`InterruptionQueue`] is the thin SQS edge.

use std::time::Duration;

use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_config::{BehaviorVersion, Region};
use gpu_node_autoscaler_provider::interruptions::{InterruptionSource, Opening};
use gpu_node_autoscaler_provider::spec::ProviderSpec;
use gpu_node_autoscaler_provider::{Notice, NoticeKind};
use serde_json::Value;

pub use gpu_node_autoscaler_provider::interruptions::{Parsed, Received};

/// Reads an EventBridge event (the message body as EventBridge puts it on the queue).
pub fn parse_event(message_id: &str, body: &str) -> Result<Parsed, String> {
    let v: Value =
        serde_json::from_str(body).map_err(|e| format!("not an EventBridge event (JSON): {e}"))?;
    let detail_type = v["detail-type"]
        .as_str()
        .ok_or("not an EventBridge event: no detail-type")?;
    let source = v["source"].as_str().unwrap_or("");
    let detail = &v["detail"];
    let instance = || -> Result<Vec<String>, String> {
        detail["instance-id"]
            .as_str()
            .filter(|s| !s.is_empty())
            .map(|s| vec![s.to_string()])
            .ok_or_else(|| format!("{detail_type}: detail.instance-id missing"))
    };
    // The event's time (RFC 3339); an event without a readable one is still a notice, acted on
    // as if sent when read.
    let sent_at_ms = v["time"].as_str().and_then(|t| {
        aws_sdk_sqs::primitives::DateTime::from_str(
            t,
            aws_sdk_sqs::primitives::DateTimeFormat::DateTime,
        )
        .ok()
        .and_then(|d| d.to_millis().ok())
    });
    let notice = |kind, instance_ids| {
        Ok(Parsed::Notice(Notice {
            message_id: message_id.to_string(),
            kind,
            instance_ids,
            sent_at_ms,
        }))
    };
    match (source, detail_type) {
        ("aws.ec2", "EC2 Spot Instance Interruption Warning") => {
            notice(NoticeKind::SpotInterruption, instance()?)
        }
        ("aws.ec2", "EC2 Instance Rebalance Recommendation") => {
            notice(NoticeKind::Rebalance, instance()?)
        }
        ("aws.ec2", "EC2 Instance State-change Notification") => {
            let state = detail["state"]
                .as_str()
                .ok_or_else(|| format!("{detail_type}: detail.state missing"))?;
            match state {
                "stopping" | "stopped" | "shutting-down" | "terminated" => {
                    notice(NoticeKind::Stopping, instance()?)
                }
                other => Ok(Parsed::Irrelevant(format!("instance state {other}"))),
            }
        }
        ("aws.health", "AWS Health Event") => {
            let service = detail["service"].as_str().unwrap_or("");
            let category = detail["eventTypeCategory"].as_str().unwrap_or("");
            if service != "EC2" || category != "scheduledChange" {
                return Ok(Parsed::Irrelevant(format!(
                    "AWS Health event of {service} ({category})"
                )));
            }
            let ids: Vec<String> = detail["affectedEntities"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|e| e["entityValue"].as_str())
                .filter(|s| s.starts_with("i-"))
                .map(str::to_string)
                .collect();
            if ids.is_empty() {
                return Err(format!(
                    "{detail_type}: no instance in detail.affectedEntities"
                ));
            }
            notice(NoticeKind::ScheduledChange, ids)
        }
        _ => Err(format!(
            "an event this queue should not receive: source {source:?}, detail-type {detail_type:?}"
        )),
    }
}

/// The SQS queue EventBridge delivers the notices to.
#[derive(Clone, Debug)]
pub struct InterruptionQueue {
    client: aws_sdk_sqs::Client,
    url: String,
}

impl InterruptionQueue {
    pub async fn new(region: &str, endpoint_url: Option<String>, url: &str) -> InterruptionQueue {
        let mut loader = aws_config::defaults(BehaviorVersion::latest())
            .region(Region::new(region.to_string()))
            .retry_config(RetryConfig::standard().with_max_attempts(2))
            .timeout_config(
                TimeoutConfig::builder()
                    .connect_timeout(Duration::from_secs(5))
                    .operation_attempt_timeout(Duration::from_secs(20))
                    .build(),
            );
        if let Some(e) = endpoint_url {
            loader = loader.endpoint_url(e);
        }
        let sdk = loader.load().await;
        InterruptionQueue {
            client: aws_sdk_sqs::Client::new(&sdk),
            url: url.to_string(),
        }
    }

    pub fn url(&self) -> &str {
        &self.url
    }
}

/// Opens the queue at `url` in the spec's region (else the SDK's environment's), through the
/// spec's endpoint (the registry's `interruptions`).
pub fn open<'a>(spec: &'a ProviderSpec<'a>, url: &'a str) -> Opening<'a> {
    Box::pin(async move {
        let region = crate::build::region(spec)?;
        let queue = InterruptionQueue::new(&region, spec.endpoint_url.clone(), url).await;
        Ok(std::sync::Arc::new(queue) as std::sync::Arc<dyn InterruptionSource>)
    })
}

#[async_trait::async_trait]
impl InterruptionSource for InterruptionQueue {
    fn address(&self) -> &str {
        &self.url
    }

    /// The messages waiting now (no long poll: the control loop calls this every pass), up to
    /// `max` of them.
    async fn receive(&self, max: usize) -> Result<Vec<Received>, String> {
        let mut out = Vec::new();
        while out.len() < max {
            let r = self
                .client
                .receive_message()
                .queue_url(&self.url)
                .max_number_of_messages(10)
                .wait_time_seconds(0)
                .send()
                .await
                .map_err(|e| format!("SQS ReceiveMessage on {}: {}", self.url, error_text(&e)))?;
            let msgs = r.messages();
            if msgs.is_empty() {
                break;
            }
            for m in msgs {
                let (Some(id), Some(receipt)) = (m.message_id(), m.receipt_handle()) else {
                    continue;
                };
                out.push(Received {
                    message_id: id.to_string(),
                    receipt: receipt.to_string(),
                    parsed: parse_event(id, m.body().unwrap_or("")),
                });
            }
        }
        Ok(out)
    }

    async fn delete(&self, receipt: &str) -> Result<(), String> {
        self.client
            .delete_message()
            .queue_url(&self.url)
            .receipt_handle(receipt)
            .send()
            .await
            .map(|_| ())
            .map_err(|e| format!("SQS DeleteMessage on {}: {}", self.url, error_text(&e)))
    }
}

fn error_text<E>(e: &aws_sdk_sqs::error::SdkError<E>) -> String
where
    E: std::error::Error + aws_sdk_sqs::error::ProvideErrorMetadata + 'static,
{
    match e {
        aws_sdk_sqs::error::SdkError::ServiceError(s) => {
            let m = s.err().meta();
            format!(
                "{}: {}",
                m.code().unwrap_or("error"),
                m.message().unwrap_or("")
            )
        }
        other => format!("{}", aws_sdk_sqs::error::DisplayErrorContext(other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Bodies as EventBridge delivers them (the examples of the EC2 and AWS Health user guides).
    const SPOT: &str = r#"{"version":"0","id":"12345678-1234-1234-1234-123456789012","detail-type":"EC2 Spot Instance Interruption Warning","source":"aws.ec2","account":"123456789012","time":"2026-11-24T12:00:00Z","region":"us-east-1","resources":["arn:aws:ec2:us-east-1b:instance/i-1234567890abcdef0"],"detail":{"instance-id":"i-1234567890abcdef0","instance-action":"terminate"}}"#;
    const REBALANCE: &str = r#"{"version":"0","id":"12345678-1234-1234-1234-123456789012","detail-type":"EC2 Instance Rebalance Recommendation","source":"aws.ec2","account":"123456789012","time":"2026-11-24T12:00:00Z","region":"us-east-1","resources":["arn:aws:ec2:us-east-1:123456789012:instance/i-1234567890abcdef0"],"detail":{"instance-id":"i-1234567890abcdef0"}}"#;
    const STATE: &str = r#"{"version":"0","id":"7bf73129-1428-4cd3-a780-95db273d1602","detail-type":"EC2 Instance State-change Notification","source":"aws.ec2","account":"123456789012","time":"2026-11-24T12:00:00Z","region":"us-east-1","resources":["arn:aws:ec2:us-east-1:123456789012:instance/i-abcd1111"],"detail":{"instance-id":"i-abcd1111","state":"shutting-down"}}"#;
    const HEALTH: &str = r#"{"version":"0","id":"121345678-1234-1234-1234-123456789012","detail-type":"AWS Health Event","source":"aws.health","account":"123456789012","time":"2026-11-24T12:00:00Z","region":"us-east-1","resources":["i-abcd1111"],"detail":{"eventArn":"arn:aws:health:us-east-1::event/EC2/EC2_INSTANCE_RETIREMENT_SCHEDULED/EC2_INSTANCE_RETIREMENT_SCHEDULED_ABC123-DEF456","service":"EC2","eventTypeCode":"EC2_INSTANCE_RETIREMENT_SCHEDULED","eventTypeCategory":"scheduledChange","startTime":"Sat, 05 Dec 2026 05:00:00 GMT","eventDescription":[{"language":"en_US","latestDescription":"EC2 has detected degradation of the underlying hardware hosting your Amazon EC2 instance."}],"affectedEntities":[{"entityValue":"i-abcd1111"},{"entityValue":"i-abcd2222"}]}}"#;

    fn notice(body: &str) -> Notice {
        match parse_event("m-1", body) {
            Ok(Parsed::Notice(n)) => n,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn ec2_and_health_events_become_notices() {
        let n = notice(SPOT);
        assert_eq!(n.kind, NoticeKind::SpotInterruption);
        assert_eq!(n.instance_ids, ["i-1234567890abcdef0"]);
        assert_eq!(n.message_id, "m-1");
        // 2026-11-24T12:00:00Z
        assert_eq!(n.sent_at_ms, Some(1_795_521_600_000));
        let no_time = SPOT.replace(r#""time":"2026-11-24T12:00:00Z","#, "");
        assert_eq!(
            parse_event("m", &no_time).map(|p| match p {
                Parsed::Notice(n) => n.sent_at_ms,
                _ => Some(0),
            }),
            Ok(None)
        );
        assert_eq!(notice(REBALANCE).kind, NoticeKind::Rebalance);
        assert_eq!(notice(STATE).kind, NoticeKind::Stopping);
        let h = notice(HEALTH);
        assert_eq!(h.kind, NoticeKind::ScheduledChange);
        assert_eq!(h.instance_ids, ["i-abcd1111", "i-abcd2222"]);
    }

    #[test]
    fn other_events_are_irrelevant_and_bad_bodies_are_errors() {
        let running = STATE.replace("shutting-down", "running");
        assert!(matches!(
            parse_event("m", &running),
            Ok(Parsed::Irrelevant(_))
        ));
        let issue = HEALTH.replace("scheduledChange", "issue");
        assert!(matches!(
            parse_event("m", &issue),
            Ok(Parsed::Irrelevant(_))
        ));
        let e = parse_event("m", "hello").unwrap_err();
        assert!(e.contains("JSON"), "{e}");
        let e =
            parse_event("m", r#"{"detail-type":"Object Created","source":"aws.s3"}"#).unwrap_err();
        assert!(e.contains("aws.s3"), "{e}");
        let e = parse_event("m", &SPOT.replace("\"instance-id\"", "\"instance\"")).unwrap_err();
        assert!(e.contains("detail.instance-id"), "{e}");
    }
}
