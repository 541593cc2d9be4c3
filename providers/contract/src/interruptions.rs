//! The interruption-notice capability: a source of [`Notice`]s a cloud delivers about its
//! instances (EC2's EventBridge events in SQS), read by the controller every pass and
//! acknowledged once acted on. A provider that has one offers an [`Open`] function in its
//! registry line; the policy's `interruptionQueue` is its address.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::spec::ProviderSpec;
use crate::Notice;

/// What one message says: a notice, nothing for the autoscaler (an instance starting, another
/// service's health event), or a body that is not an event the source knows.
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed {
    Notice(Notice),
    Irrelevant(String),
}

/// One message received: its receipt (to delete it) and what it says.
#[derive(Debug)]
pub struct Received {
    pub message_id: String,
    pub receipt: String,
    pub parsed: Result<Parsed, String>,
}

/// A source of interruption notices. Errors are one line for a log, naming the source.
#[async_trait::async_trait]
pub trait InterruptionSource: Send + Sync {
    /// Its address (a queue URL), for messages and to tell a changed policy.
    fn address(&self) -> &str;
    /// The messages waiting now, up to `max` of them, without waiting for more.
    async fn receive(&self, max: usize) -> Result<Vec<Received>, String>;
    /// Deletes the message of `receipt`: it was acted on, or is no notice.
    async fn delete(&self, receipt: &str) -> Result<(), String>;
}

/// A source being opened.
pub type Opening<'a> =
    Pin<Box<dyn Future<Output = Result<Arc<dyn InterruptionSource>, String>> + Send + 'a>>;

/// Opens the interruption source at `address` for the provider of `spec` (its region and
/// endpoint).
pub type Open = for<'a> fn(&'a ProviderSpec<'a>, &'a str) -> Opening<'a>;
