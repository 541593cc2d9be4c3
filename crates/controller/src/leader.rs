//! Leader election on a coordination.k8s.io/v1 Lease, so that two replicas are safe: only the
//! holder acts. The rule is client-go's: a Lease may be taken when it has no holder, is ours, or
//! its holder has not renewed it within its duration. Updates carry the `resourceVersion` read,
//! so of two replicas racing for an expired Lease exactly one wins (the other gets a 409).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};
use kube::Client;
use tracing::{info, warn};

use gpu_node_autoscaler_core::model::Time;

/// May `me` take or keep the Lease described by `spec`, which has not changed for `unchanged`
/// (by our own clock: comparing the holder's `renewTime` with our clock would trust two clocks)?
pub fn may_hold(spec: &LeaseSpec, me: &str, unchanged: Duration) -> bool {
    let holder = spec.holder_identity.as_deref().unwrap_or("");
    if holder.is_empty() || holder == me || spec.renew_time.is_none() {
        return true;
    }
    let duration = Duration::from_secs(spec.lease_duration_seconds.unwrap_or(15).max(1) as u64);
    unchanged >= duration
}

/// The spec `me` writes to take or renew the Lease.
pub fn held_spec(old: &LeaseSpec, me: &str, duration: Duration, now: Time) -> LeaseSpec {
    let ours = old.holder_identity.as_deref() == Some(me);
    LeaseSpec {
        holder_identity: Some(me.to_string()),
        lease_duration_seconds: Some(duration.as_secs().max(1) as i32),
        acquire_time: if ours {
            old.acquire_time.clone()
        } else {
            Some(time_to_micro(now))
        },
        renew_time: Some(time_to_micro(now)),
        lease_transitions: Some(old.lease_transitions.unwrap_or(0) + i32::from(!ours)),
        ..old.clone()
    }
}

pub fn micro_to_time(t: &MicroTime) -> Time {
    Time(t.0.as_millisecond())
}

pub fn time_to_micro(t: Time) -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::from_millisecond(t.0).unwrap_or_default())
}

/// Elects and keeps leadership; [`Elector::is_leader`] is what actions check.
#[derive(Clone)]
pub struct Elector {
    api: Api<Lease>,
    name: String,
    identity: String,
    duration: Duration,
    leader: Arc<AtomicBool>,
    /// Milliseconds since `epoch` of the last successful renewal.
    renewed_ms: Arc<AtomicU64>,
    epoch: tokio::time::Instant,
    /// The Lease's resourceVersion as last read, and when it was first read so.
    observed: Arc<std::sync::Mutex<Option<(String, tokio::time::Instant)>>>,
}

impl Elector {
    pub fn new(
        client: Client,
        namespace: &str,
        name: &str,
        identity: &str,
        duration: Duration,
    ) -> Elector {
        Elector {
            api: Api::namespaced(client, namespace),
            name: name.to_string(),
            identity: identity.to_string(),
            duration,
            leader: Arc::new(AtomicBool::new(false)),
            renewed_ms: Arc::new(AtomicU64::new(0)),
            epoch: tokio::time::Instant::now(),
            observed: Arc::default(),
        }
    }

    /// Holds the Lease now: the last renewal is younger than two thirds of its duration, so no
    /// other replica can have taken it (whatever the state of a renewal in progress).
    pub fn is_leader(&self) -> bool {
        if !self.leader.load(Ordering::SeqCst) {
            return false;
        }
        let renewed = Duration::from_millis(self.renewed_ms.load(Ordering::SeqCst));
        self.epoch.elapsed() < renewed + self.duration * 2 / 3
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// One attempt to take or renew the Lease. `Ok(true)`: we hold it now.
    async fn try_hold(&self) -> Result<bool, kube::Error> {
        let now = crate::wall_now();
        match self.api.get_opt(&self.name).await? {
            None => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        ..Default::default()
                    },
                    spec: Some(held_spec(
                        &LeaseSpec::default(),
                        &self.identity,
                        self.duration,
                        now,
                    )),
                };
                // deploy/ ships the Lease; creating it is for clusters set up otherwise, and
                // is refused with deploy/'s Role (which grants no `create`).
                match self.api.create(&PostParams::default(), &lease).await {
                    Ok(_) => Ok(true),
                    Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                    Err(kube::Error::Api(s)) if s.code == 403 => {
                        warn!(
                            lease = %self.name,
                            "the Lease does not exist and may not be created: apply deploy/ \
                             (it ships the Lease; the Role grants no create)"
                        );
                        Err(kube::Error::Api(s))
                    }
                    Err(e) => Err(e),
                }
            }
            Some(mut lease) => {
                let spec = lease.spec.clone().unwrap_or_default();
                let rv = lease.metadata.resource_version.clone().unwrap_or_default();
                let unchanged = {
                    let mut o = self.observed.lock().unwrap();
                    match o.as_ref() {
                        Some((seen, at)) if *seen == rv => at.elapsed(),
                        _ => {
                            *o = Some((rv, tokio::time::Instant::now()));
                            Duration::ZERO
                        }
                    }
                };
                if !may_hold(&spec, &self.identity, unchanged) {
                    return Ok(false);
                }
                lease.spec = Some(held_spec(&spec, &self.identity, self.duration, now));
                match self
                    .api
                    .replace(&self.name, &PostParams::default(), &lease)
                    .await
                {
                    Ok(_) => Ok(true),
                    Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                    Err(e) => Err(e),
                }
            }
        }
    }

    /// Runs until `stop` fires: renews every `retry` and steps down when a renewal has not
    /// succeeded within two thirds of the Lease duration (before anyone else may take it).
    pub async fn run(self, retry: Duration, mut stop: tokio::sync::watch::Receiver<bool>) {
        loop {
            let started = tokio::time::Instant::now();
            // A renewal that hangs must not keep us acting: it is given up after `retry`.
            let attempt = match tokio::time::timeout(
                retry.max(Duration::from_secs(1)),
                self.try_hold(),
            )
            .await
            {
                Ok(r) => r,
                Err(_) => Err(kube::Error::Service("renewing the Lease timed out".into())),
            };
            match attempt {
                Ok(true) => {
                    let was = self.is_leader();
                    // Valid from when the renewal was sent, not from when it returned.
                    self.renewed_ms.store(
                        started.duration_since(self.epoch).as_millis() as u64,
                        Ordering::SeqCst,
                    );
                    self.leader.store(true, Ordering::SeqCst);
                    if !was {
                        info!(identity = %self.identity, lease = %self.name, "became the leader");
                    }
                }
                Ok(false) => {
                    if self.is_leader() {
                        warn!(identity = %self.identity, "lost the Lease to another replica");
                    }
                    self.leader.store(false, Ordering::SeqCst);
                }
                Err(e) => {
                    warn!(error = %e, "cannot renew the Lease");
                    if self.leader.load(Ordering::SeqCst) && !self.is_leader() {
                        warn!("stepping down: the Lease was not renewed in time");
                        self.leader.store(false, Ordering::SeqCst);
                    }
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(retry) => {}
                _ = stop.changed() => break,
            }
        }
        self.release().await;
    }

    /// Gives the Lease up (on SIGTERM) so that another replica takes over at once.
    pub async fn release(&self) {
        if !self.leader.swap(false, Ordering::SeqCst) {
            return;
        }
        let Ok(Some(mut lease)) = self.api.get_opt(&self.name).await else {
            return;
        };
        let mut spec = lease.spec.clone().unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return;
        }
        spec.holder_identity = None;
        spec.renew_time = None;
        spec.acquire_time = None;
        lease.spec = Some(spec);
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => info!("released the Lease"),
            Err(e) => warn!(error = %e, "could not release the Lease"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(holder: Option<&str>, renewed_s: Option<i64>, duration: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: holder.map(str::to_string),
            renew_time: renewed_s.map(|s| time_to_micro(Time::from_secs(s))),
            lease_duration_seconds: Some(duration),
            ..Default::default()
        }
    }

    #[test]
    fn a_live_lease_of_another_is_respected_until_unchanged_for_its_duration() {
        let s = spec(Some("b"), Some(100), 15);
        assert!(!may_hold(&s, "a", Duration::ZERO));
        assert!(!may_hold(&s, "a", Duration::from_secs(14)));
        assert!(may_hold(&s, "a", Duration::from_secs(15)));
        assert!(may_hold(&s, "b", Duration::ZERO));
    }

    #[test]
    fn an_empty_or_released_lease_may_be_taken() {
        assert!(may_hold(&LeaseSpec::default(), "a", Duration::ZERO));
        assert!(may_hold(
            &spec(Some(""), Some(100), 15),
            "a",
            Duration::ZERO
        ));
        assert!(may_hold(&spec(Some("b"), None, 15), "a", Duration::ZERO));
    }

    #[test]
    fn taking_over_counts_a_transition_renewing_does_not() {
        let old = spec(Some("b"), Some(100), 15);
        let taken = held_spec(&old, "a", Duration::from_secs(15), Time::from_secs(200));
        assert_eq!(taken.holder_identity.as_deref(), Some("a"));
        assert_eq!(taken.lease_transitions, Some(1));
        assert_eq!(
            micro_to_time(taken.renew_time.as_ref().unwrap()),
            Time::from_secs(200)
        );
        let renewed = held_spec(&taken, "a", Duration::from_secs(15), Time::from_secs(202));
        assert_eq!(renewed.lease_transitions, Some(1));
        assert_eq!(renewed.acquire_time, taken.acquire_time);
    }
}
