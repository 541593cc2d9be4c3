//! An in-memory [`CloudProvider`] for the simulator and for tests.
//!
//! Everything is deterministic: time is a virtual clock set with [`MemoryProvider::set_now`],
//! instance ids and spot-interruption picks come from a seeded generator, and nothing happens in
//! the background. State changes that depend on time (an interrupted spot instance terminating)
//! are applied lazily whenever the provider is used.
//!
//! Besides the trait, the provider offers knobs to shape the simulated cloud (insufficient-capacity
//! windows, quotas, API throttling, injected failures, spot interruptions) and a log of every API
//! call it served.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use gpu_node_autoscaler_provider::rng::SplitMix64;
use gpu_node_autoscaler_provider::{
    CapacityType, Catalog, CloudProvider, Instance, InstanceState, LaunchRequest, LaunchResult,
    OfferingKey, ProviderError, Reservation, LAUNCH_FINGERPRINT_TAG,
};

/// Tag carrying the cluster name.
pub const TAG_CLUSTER: &str = "gpu-node-autoscaler.io/cluster";
/// Tag carrying the pool name.
pub const TAG_POOL: &str = "gpu-node-autoscaler.io/pool";
/// Tag carrying the launch id.
pub const TAG_LAUNCH_ID: &str = "gpu-node-autoscaler.io/launch-id";
/// Time between a spot interruption notice and the instance's termination.
pub const SPOT_NOTICE_MS: i64 = 120_000;
/// The API operations, as named in the call log and in [`MemoryProvider::fail_next`].
pub const OPS: [&str; 4] = ["catalog", "launch", "terminate", "list"];

/// A period during which the cloud lacks capacity for the offerings it matches.
#[derive(Clone, Debug, PartialEq)]
pub struct CapacityWindow {
    /// Start of the window (inclusive), ms since epoch on the virtual clock.
    pub from_ms: i64,
    /// End of the window (exclusive).
    pub until_ms: i64,
    /// Only this zone; `None` = every zone.
    pub zone: Option<String>,
    /// Only this capacity type; `None` = both.
    pub capacity_type: Option<CapacityType>,
    /// Only these instance types; empty = all.
    pub instance_types: Vec<String>,
    /// `None`: no capacity at all. `Some(n)`: at most `n` more instances may launch into the
    /// matching offerings while the window is active.
    pub max_instances: Option<u32>,
}

impl CapacityWindow {
    fn active_at(&self, now_ms: i64) -> bool {
        self.from_ms <= now_ms && now_ms < self.until_ms
    }

    fn matches(&self, key: &OfferingKey) -> bool {
        self.zone.as_ref().is_none_or(|z| *z == key.zone)
            && self.capacity_type.is_none_or(|c| c == key.capacity_type)
            && (self.instance_types.is_empty() || self.instance_types.contains(&key.instance_type))
    }
}

/// A spot interruption announced by [`MemoryProvider::interrupt_spot`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interruption {
    pub instance_id: String,
    pub notice_at_ms: i64,
    /// `notice_at_ms` + 120 s; the instance is `Terminated` from then on.
    pub terminate_at_ms: i64,
}

/// One API call served (or refused) by the provider.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    pub at_ms: i64,
    /// One of [`OPS`].
    pub op: &'static str,
    /// The call's arguments, human-readable.
    pub detail: String,
    /// `ok…` or `error(<metric label>): <message>`.
    pub outcome: String,
}

/// The memory provider's part of the scaling policy: `provider: memory`, no section of its own.
pub static POLICY: gpu_node_autoscaler_provider::policy::NameOnly =
    gpu_node_autoscaler_provider::policy::NameOnly::new("memory");

/// The memory provider as the registry lists it: pools may name it; the simulator builds it
/// itself, so the controller does not run it.
pub static PROVIDER: gpu_node_autoscaler_provider::spec::Provider =
    gpu_node_autoscaler_provider::spec::Provider {
        policy: &POLICY,
        build: None,
        check: None,
        interruptions: None,
    };

/// The in-memory cloud. `Send + Sync`; every method takes `&self`.
#[derive(Debug)]
pub struct MemoryProvider {
    state: Mutex<State>,
}

#[derive(Debug)]
struct Window {
    spec: CapacityWindow,
    /// Instances launched into matching offerings while the window was active.
    launched: u32,
}

#[derive(Debug)]
struct Record {
    instance: Instance,
    tags: BTreeMap<String, String>,
    /// Set while an interrupted spot instance is shutting down.
    terminate_at_ms: Option<i64>,
    /// The capacity reservation it was launched into.
    reservation: Option<String>,
}

/// Token bucket in thousandths of a call: `rate` calls per second, burst of `rate`.
#[derive(Debug)]
struct Bucket {
    rate: u32,
    milli_tokens: u64,
    refilled_at_ms: i64,
}

#[derive(Debug)]
struct State {
    catalog: Catalog,
    cluster: String,
    seed: u64,
    now_ms: i64,
    windows: Vec<Window>,
    max_instances: Option<u32>,
    max_gpus: Option<u32>,
    throttle: Option<Bucket>,
    /// Every instance ever launched, terminated ones included, by id.
    instances: BTreeMap<String, Record>,
    /// The ids of those not terminated (what `list` and the quota look at).
    live: BTreeSet<String>,
    /// The ids of interrupted instances shutting down (what `advance` looks at).
    shutting_down: BTreeSet<String>,
    /// Per launch id: its pool and how many instances it ever created.
    launches: HashMap<String, (String, u32)>,
    next_id: u64,
    pick_rng: SplitMix64,
    calls: Vec<Call>,
    injected: HashMap<&'static str, VecDeque<ProviderError>>,
    launched_total: u64,
    terminated_total: u64,
    /// Instances younger than this (ms) are not listed yet: an eventually consistent listing.
    listing_lag_ms: Option<i64>,
    /// The account's capacity reservations (their `available` is computed from the live
    /// instances in each).
    reservations: Vec<Reservation>,
}

fn error_outcome(e: &ProviderError) -> String {
    format!("error({}): {e}", e.metric_label())
}

impl State {
    /// Applies time-driven transitions: interrupted spot instances whose notice has run out.
    fn advance(&mut self) {
        let now = self.now_ms;
        let mut due: Vec<String> = self
            .shutting_down
            .iter()
            .filter(|id| {
                self.instances
                    .get(*id)
                    .is_some_and(|r| r.terminate_at_ms.is_some_and(|t| now >= t))
            })
            .cloned()
            .collect();
        // A reservation that has ended takes its instances back.
        let ended: Vec<&str> = self
            .reservations
            .iter()
            .filter(|r| r.end_ms.is_some_and(|e| now >= e))
            .map(|r| r.id.as_str())
            .collect();
        if !ended.is_empty() {
            due.extend(
                self.live
                    .iter()
                    .filter(|id| {
                        self.instances.get(*id).is_some_and(|r| {
                            r.reservation.as_deref().is_some_and(|x| ended.contains(&x))
                        })
                    })
                    .cloned(),
            );
        }
        for id in due {
            self.terminated(&id);
        }
    }

    /// Marks an instance terminated (it was not).
    fn terminated(&mut self, id: &str) {
        if let Some(rec) = self.instances.get_mut(id) {
            rec.instance.state = InstanceState::Terminated;
            rec.terminate_at_ms = None;
            self.terminated_total += 1;
        }
        self.live.remove(id);
        self.shutting_down.remove(id);
    }

    fn take_token(&mut self) -> Result<(), ProviderError> {
        let now = self.now_ms;
        let Some(b) = self.throttle.as_mut() else {
            return Ok(());
        };
        if b.rate == 0 {
            return Err(ProviderError::Throttled { retry_after: None });
        }
        let rate = u64::from(b.rate);
        if now > b.refilled_at_ms {
            // `rate` calls per second = `rate` thousandths of a call per ms.
            let elapsed = (now - b.refilled_at_ms) as u64;
            b.milli_tokens = b
                .milli_tokens
                .saturating_add(elapsed.saturating_mul(rate))
                .min(rate * 1000);
            b.refilled_at_ms = now;
        }
        if b.milli_tokens >= 1000 {
            b.milli_tokens -= 1000;
            Ok(())
        } else {
            let wait_ms = (1000 - b.milli_tokens).div_ceil(rate);
            Err(ProviderError::Throttled {
                retry_after: Some(Duration::from_millis(wait_ms)),
            })
        }
    }

    /// Throttling first (a throttled call reaches nothing), then injected failures.
    fn admit(&mut self, op: &'static str) -> Result<(), ProviderError> {
        self.take_token()?;
        match self.injected.get_mut(op).and_then(VecDeque::pop_front) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn gpus_of(&self, instance_type: &str) -> u32 {
        self.catalog
            .instance_type(instance_type)
            .and_then(|t| t.gpu.as_ref())
            .map_or(0, |g| g.count)
    }

    /// Instances that can still be launched into reservation `r` now (none outside its window).
    fn reservation_room(&self, r: &Reservation) -> u32 {
        if !r.active_at(self.now_ms) {
            return 0;
        }
        let used = self
            .live
            .iter()
            .filter_map(|id| self.instances.get(id))
            .filter(|x| x.reservation.as_deref() == Some(r.id.as_str()))
            .count() as u32;
        r.total.saturating_sub(used)
    }

    /// The reservations as the cloud reports them now.
    fn reservations(&self) -> Vec<Reservation> {
        self.reservations
            .iter()
            .map(|r| Reservation {
                available: self.reservation_room(r),
                ..r.clone()
            })
            .collect()
    }

    /// How many more instances the cloud has room for at `key` now; `u32::MAX` = unlimited.
    fn capacity(&self, key: &OfferingKey) -> u32 {
        if key.capacity_type == CapacityType::Reserved {
            // Reserved capacity is what the reservations of the offering still hold.
            return self
                .reservations
                .iter()
                .filter(|r| r.offering() == *key)
                .map(|r| self.reservation_room(r))
                .sum();
        }
        let listed = self
            .catalog
            .offerings
            .iter()
            .any(|o| o.key == *key && o.available);
        if !listed {
            return 0;
        }
        self.windows
            .iter()
            .filter(|w| w.spec.active_at(self.now_ms) && w.spec.matches(key))
            .map(|w| {
                w.spec
                    .max_instances
                    .map_or(0, |n| n.saturating_sub(w.launched))
            })
            .min()
            .unwrap_or(u32::MAX)
    }

    /// Instances and GPUs counted against the quota (running and pending).
    fn quota_usage(&self) -> (u32, u32) {
        self.live
            .iter()
            .filter_map(|id| self.instances.get(id))
            .map(|r| &r.instance)
            .filter(|i| matches!(i.state, InstanceState::Running | InstanceState::Pending))
            .fold((0, 0), |(n, g), i| {
                (n + 1, g + self.gpus_of(&i.offering.instance_type))
            })
    }

    /// How many more instances with `gpus` GPUs each the quota allows; `u32::MAX` = unlimited.
    fn quota_room(&self, gpus: u32) -> u32 {
        let (used_instances, used_gpus) = self.quota_usage();
        let mut room = u32::MAX;
        if let Some(max) = self.max_instances {
            room = room.min(max.saturating_sub(used_instances));
        }
        if let Some(max) = self.max_gpus {
            // Instance types without GPUs are not limited by the GPU quota.
            if let Some(n) = max.saturating_sub(used_gpus).checked_div(gpus) {
                room = room.min(n);
            }
        }
        room
    }

    fn quota_error(&self, key: &OfferingKey) -> ProviderError {
        let (n, g) = self.quota_usage();
        ProviderError::QuotaExceeded {
            message: format!(
                "no room for {key}: {n} instances and {g} GPUs running or pending \
                 (max instances {:?}, max GPUs {:?})",
                self.max_instances, self.max_gpus
            ),
        }
    }

    fn new_id(&mut self) -> String {
        let n = self.next_id;
        self.next_id += 1;
        // Distinct counters give distinct inputs, and splitmix64's output function is a
        // bijection: ids never repeat.
        format!("i-{:016x}", SplitMix64::at(self.seed, n))
    }

    fn next_pick(&mut self) -> u64 {
        self.pick_rng.next_u64()
    }

    fn catalog(&self) -> Catalog {
        let mut catalog = self.catalog.clone();
        for o in &mut catalog.offerings {
            o.available = self.capacity(&o.key) > 0;
        }
        catalog
    }

    fn launch(&mut self, req: &LaunchRequest) -> Result<LaunchResult, ProviderError> {
        if req.count == 0 {
            return Err(ProviderError::InvalidRequest {
                message: "count must be at least 1".into(),
            });
        }
        if req.offerings.is_empty() {
            return Err(ProviderError::InvalidRequest {
                message: "no offerings to launch".into(),
            });
        }
        if req.launch_id.is_empty() {
            return Err(ProviderError::InvalidRequest {
                message: "empty launch id".into(),
            });
        }
        // Everything ever created for this launch id counts, terminated instances included.
        let mut existing = 0u32;
        if let Some((pool, n)) = self.launches.get(&req.launch_id) {
            if *pool != req.pool {
                return Err(ProviderError::InvalidRequest {
                    message: format!("launch id {} already used for pool {pool}", req.launch_id),
                });
            }
            existing = *n;
        }
        let mut remaining = req.count.saturating_sub(existing);
        let mut result = LaunchResult::default();
        // An atomic request (a gang's nodes), as EC2's fleet with `MinTargetCapacity`,
        // `SingleAvailabilityZone` and `SingleInstanceType`: every remaining instance on one
        // offering, the first in order with room for all of them, or none at all. Reserved
        // offerings are not atomic (as on AWS): they are walked as below.
        if req.atomic
            && remaining > 0
            && req
                .offerings
                .iter()
                .all(|k| k.capacity_type != CapacityType::Reserved)
        {
            for key in &req.offerings {
                let cap = self.capacity(key);
                if cap < remaining {
                    result.failures.push((
                        key.clone(),
                        ProviderError::InsufficientCapacity {
                            offering: key.clone(),
                        },
                    ));
                    continue;
                }
                let gpus = self.gpus_of(&key.instance_type);
                if self.quota_room(gpus) < remaining {
                    result.failures.push((key.clone(), self.quota_error(key)));
                    break;
                }
                for _ in 0..remaining {
                    let inst = self.create(req, key);
                    result.launched.push(inst);
                }
                let now = self.now_ms;
                for w in &mut self.windows {
                    if w.spec.active_at(now) && w.spec.matches(key) {
                        w.launched = w.launched.saturating_add(remaining);
                    }
                }
                break;
            }
            return Ok(result);
        }
        for key in &req.offerings {
            if remaining == 0 {
                break;
            }
            let cap = if key.capacity_type == CapacityType::Reserved {
                self.targets(req, key)
                    .iter()
                    .map(|r| self.reservation_room(r))
                    .sum()
            } else {
                self.capacity(key)
            };
            if cap == 0 {
                let e = ProviderError::InsufficientCapacity {
                    offering: key.clone(),
                };
                result.failures.push((key.clone(), e));
                continue;
            }
            let quota = self.quota_room(self.gpus_of(&key.instance_type));
            if quota == 0 {
                result.failures.push((key.clone(), self.quota_error(key)));
                break;
            }
            let n = remaining.min(cap).min(quota);
            for _ in 0..n {
                let inst = self.create(req, key);
                result.launched.push(inst);
            }
            let now = self.now_ms;
            for w in &mut self.windows {
                if w.spec.active_at(now) && w.spec.matches(key) {
                    w.launched = w.launched.saturating_add(n);
                }
            }
            remaining -= n;
            if remaining > 0 {
                if n == cap {
                    let e = ProviderError::InsufficientCapacity {
                        offering: key.clone(),
                    };
                    result.failures.push((key.clone(), e));
                }
                if n == quota {
                    result.failures.push((key.clone(), self.quota_error(key)));
                    break;
                }
            }
        }
        Ok(result)
    }

    /// The account's reservations a request may launch `key` into: those it names for that
    /// offering, in its order (none named, none: a reserved offering without them has no
    /// capacity).
    fn targets(&self, req: &LaunchRequest, key: &OfferingKey) -> Vec<Reservation> {
        req.reservations
            .iter()
            .filter(|named| named.offering() == *key)
            .filter_map(|named| self.reservations.iter().find(|r| r.id == named.id))
            .cloned()
            .collect()
    }

    fn create(&mut self, req: &LaunchRequest, key: &OfferingKey) -> Instance {
        // Into the first reservation the request names for the offering that has room.
        let reservation = (key.capacity_type == CapacityType::Reserved)
            .then(|| {
                self.targets(req, key)
                    .into_iter()
                    .find(|r| self.reservation_room(r) > 0)
                    .map(|r| r.id)
            })
            .flatten();
        let id = self.new_id();
        let instance = Instance {
            provider_id: format!("memory:///{}/{}", key.zone, id),
            id: id.clone(),
            pool: req.pool.clone(),
            launch_id: req.launch_id.clone(),
            offering: key.clone(),
            state: InstanceState::Running,
            launched_at_ms: self.now_ms,
            reservation_id: reservation.clone(),
            launch_fingerprint: req.tags.get(LAUNCH_FINGERPRINT_TAG).cloned(),
            unclaimed: false,
        };
        let mut tags = req.tags.clone();
        tags.insert(TAG_CLUSTER.into(), self.cluster.clone());
        tags.insert(TAG_POOL.into(), req.pool.clone());
        tags.insert(TAG_LAUNCH_ID.into(), req.launch_id.clone());
        self.live.insert(id.clone());
        self.launches
            .entry(req.launch_id.clone())
            .or_insert_with(|| (req.pool.clone(), 0))
            .1 += 1;
        self.instances.insert(
            id,
            Record {
                instance: instance.clone(),
                tags,
                terminate_at_ms: None,
                reservation,
            },
        );
        self.launched_total += 1;
        instance
    }

    fn terminate(&mut self, id: &str) -> Result<&'static str, ProviderError> {
        let rec = self
            .instances
            .get_mut(id)
            .ok_or_else(|| ProviderError::NotFound { id: id.into() })?;
        if rec.instance.state == InstanceState::Terminated {
            return Ok("ok (already terminated)");
        }
        self.terminated(id);
        Ok("ok")
    }

    fn list(&self, pool: &str) -> Vec<Instance> {
        // BTreeSet iteration is already sorted by id; `live` holds no terminated instance.
        self.live
            .iter()
            .filter_map(|id| self.instances.get(id))
            .map(|r| &r.instance)
            .filter(|i| i.pool == pool)
            .filter(|i| {
                self.listing_lag_ms
                    .is_none_or(|lag| i.launched_at_ms.saturating_add(lag) <= self.now_ms)
            })
            .cloned()
            .collect()
    }
}

impl MemoryProvider {
    /// A provider selling `catalog`'s offerings at their listed prices, tagging instances with
    /// `cluster`. `seed` drives instance ids and interruption picks. The clock starts at 0.
    pub fn new(catalog: Catalog, cluster: &str, seed: u64) -> MemoryProvider {
        MemoryProvider {
            state: Mutex::new(State {
                catalog,
                cluster: cluster.to_string(),
                seed,
                now_ms: 0,
                windows: Vec::new(),
                max_instances: None,
                max_gpus: None,
                throttle: None,
                instances: BTreeMap::new(),
                live: BTreeSet::new(),
                shutting_down: BTreeSet::new(),
                launches: HashMap::new(),
                next_id: 0,
                pick_rng: SplitMix64::new(seed ^ 0xD1B5_4A32_D192_ED03),
                calls: Vec::new(),
                injected: HashMap::new(),
                launched_total: 0,
                terminated_total: 0,
                listing_lag_ms: None,
                reservations: Vec::new(),
            }),
        }
    }

    /// Locks the state (ignoring poisoning) and applies due time-driven transitions.
    fn lock(&self) -> MutexGuard<'_, State> {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.advance();
        s
    }

    /// Runs one API call: throttling, injected failures, the operation, the call log.
    fn api<T>(
        &self,
        op: &'static str,
        detail: String,
        f: impl FnOnce(&mut State) -> Result<T, ProviderError>,
        ok: impl FnOnce(&T) -> String,
    ) -> Result<T, ProviderError> {
        let mut s = self.lock();
        let result = s.admit(op).and_then(|()| f(&mut s));
        let outcome = match &result {
            Ok(v) => ok(v),
            Err(e) => error_outcome(e),
        };
        let at_ms = s.now_ms;
        s.calls.push(Call {
            at_ms,
            op,
            detail,
            outcome,
        });
        result
    }

    /// Sets the virtual clock, in ms since the Unix epoch.
    pub fn set_now(&self, now_ms: i64) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.now_ms = now_ms;
        s.advance();
    }

    pub fn now_ms(&self) -> i64 {
        self.lock().now_ms
    }

    /// Gives the account a capacity reservation (its `total` is what it holds; `available` is
    /// computed). A reservation that ends takes its instances back then.
    pub fn add_reservation(&self, r: Reservation) {
        self.lock().reservations.push(r);
    }

    /// The reservation an instance was launched into.
    pub fn reservation_of(&self, instance_id: &str) -> Option<String> {
        self.lock()
            .instances
            .get(instance_id)
            .and_then(|r| r.reservation.clone())
    }

    /// [`CloudProvider::reservations`] without an executor (not logged as a call: the
    /// simulator reads it every pass).
    pub fn reservations_now(&self) -> Vec<Reservation> {
        self.lock().reservations()
    }

    pub fn add_capacity_window(&self, w: CapacityWindow) {
        self.lock().windows.push(Window {
            spec: w,
            launched: 0,
        });
    }

    /// A fault mode: the listing shows an instance only once it is `lag` old (as a cloud whose
    /// reads are eventually consistent); `None` = listed at once. Launch answers and the test
    /// accessors ([`MemoryProvider::instances`]) are not affected.
    pub fn set_listing_lag(&self, lag: Option<std::time::Duration>) {
        self.lock().listing_lag_ms = lag.map(|d| d.as_millis().min(i64::MAX as u128) as i64);
    }

    /// Limits running + pending instances and their GPUs; `None` = no limit.
    pub fn set_quota(&self, max_instances: Option<u32>, max_gpus: Option<u32>) {
        let mut s = self.lock();
        s.max_instances = max_instances;
        s.max_gpus = max_gpus;
    }

    /// Limits API calls (all operations together) per second of virtual time, with a burst of
    /// the same size; the bucket starts full. `None` = unlimited; `Some(0)` = every call throttled.
    pub fn set_throttle(&self, max_calls_per_second: Option<u32>) {
        let mut s = self.lock();
        let now = s.now_ms;
        s.throttle = max_calls_per_second.map(|rate| Bucket {
            rate,
            milli_tokens: u64::from(rate) * 1000,
            refilled_at_ms: now,
        });
    }

    /// Makes the next call of `op` fail with `err` (queued: several calls queue several
    /// failures). A throttled call does not consume it.
    ///
    /// # Panics
    /// If `op` is not one of [`OPS`].
    pub fn fail_next(&self, op: &'static str, err: ProviderError) {
        assert!(
            OPS.contains(&op),
            "unknown op {op:?}, expected one of {OPS:?}"
        );
        self.lock().injected.entry(op).or_default().push_back(err);
    }

    /// The listed price of an offering, whatever its availability.
    pub fn price(&self, key: &OfferingKey) -> Option<f64> {
        self.lock()
            .catalog
            .offerings
            .iter()
            .find(|o| o.key == *key)
            .map(|o| o.price_per_hour)
    }

    /// Any instance ever launched, terminated ones included.
    pub fn instance(&self, id: &str) -> Option<Instance> {
        self.lock().instances.get(id).map(|r| r.instance.clone())
    }

    /// Every instance ever launched, terminated ones included, sorted by id.
    pub fn instances(&self) -> Vec<Instance> {
        self.lock()
            .instances
            .values()
            .map(|r| r.instance.clone())
            .collect()
    }

    /// The tags of an instance: the request's, plus cluster, pool and launch id.
    pub fn tags(&self, id: &str) -> Option<BTreeMap<String, String>> {
        self.lock().instances.get(id).map(|r| r.tags.clone())
    }

    /// Announces the interruption of `ceil(fraction × n)` of the n running spot instances (of
    /// `pool`, or of all pools), picked by the seeded generator. They shut down now and terminate
    /// [`SPOT_NOTICE_MS`] later. Not an API call: neither logged nor throttled. Sorted by id.
    pub fn interrupt_spot(&self, fraction: f64, pool: Option<&str>) -> Vec<Interruption> {
        let mut s = self.lock();
        let mut candidates: Vec<String> = s
            .live
            .iter()
            .filter_map(|id| s.instances.get(id))
            .map(|r| &r.instance)
            .filter(|i| {
                i.state == InstanceState::Running
                    && i.offering.capacity_type == CapacityType::Spot
                    && pool.is_none_or(|p| i.pool == p)
            })
            .map(|i| i.id.clone())
            .collect();
        let n = candidates.len();
        let k = if fraction > 0.0 {
            // The epsilon keeps e.g. 0.3 × 10 = 3.0000000000000004 from rounding up to 4.
            ((fraction.min(1.0) * n as f64 - 1e-9).ceil().max(0.0) as usize).min(n)
        } else {
            0
        };
        // Partial Fisher-Yates shuffle over the id-sorted candidates.
        for i in 0..k {
            let j = i + (s.next_pick() % (n - i) as u64) as usize;
            candidates.swap(i, j);
        }
        let mut picked = candidates[..k].to_vec();
        picked.sort();
        let now = s.now_ms;
        picked
            .into_iter()
            .map(|id| {
                let rec = s.instances.get_mut(&id).expect("candidate exists");
                rec.instance.state = InstanceState::ShuttingDown;
                rec.terminate_at_ms = Some(now + SPOT_NOTICE_MS);
                s.shutting_down.insert(id.clone());
                Interruption {
                    instance_id: id,
                    notice_at_ms: now,
                    terminate_at_ms: now + SPOT_NOTICE_MS,
                }
            })
            .collect()
    }

    /// Every API call so far, oldest first.
    pub fn calls(&self) -> Vec<Call> {
        self.lock().calls.clone()
    }

    /// How many API calls so far (without copying them, as [`MemoryProvider::calls`] does).
    pub fn call_count(&self) -> usize {
        self.lock().calls.len()
    }

    /// Instances created so far.
    pub fn launched_total(&self) -> u64 {
        self.lock().launched_total
    }

    /// Instances that became `Terminated` so far, by `terminate` or after an interruption.
    pub fn terminated_total(&self) -> u64 {
        self.lock().terminated_total
    }

    /// [`CloudProvider::catalog`] without an executor.
    pub fn catalog_now(&self) -> Result<Catalog, ProviderError> {
        self.api(
            "catalog",
            String::new(),
            |s| Ok(s.catalog()),
            |c| {
                let available = c.offerings.iter().filter(|o| o.available).count();
                format!("ok {available}/{} offerings available", c.offerings.len())
            },
        )
    }

    /// [`CloudProvider::launch`] without an executor.
    pub fn launch_now(&self, request: &LaunchRequest) -> Result<LaunchResult, ProviderError> {
        let offerings: Vec<String> = request.offerings.iter().map(|k| k.to_string()).collect();
        let detail = format!(
            "launch_id={} pool={} count={} offerings=[{}]",
            request.launch_id,
            request.pool,
            request.count,
            offerings.join(", ")
        );
        self.api(
            "launch",
            detail,
            |s| s.launch(request),
            |r| {
                format!(
                    "ok launched={} failures={}",
                    r.launched.len(),
                    r.failures.len()
                )
            },
        )
    }

    /// [`CloudProvider::terminate`] without an executor.
    pub fn terminate_now(&self, instance_id: &str) -> Result<(), ProviderError> {
        self.api(
            "terminate",
            instance_id.to_string(),
            |s| s.terminate(instance_id),
            |outcome| outcome.to_string(),
        )
        .map(|_| ())
    }

    /// [`CloudProvider::list`] without an executor.
    pub fn list_now(&self, pool: &str) -> Result<Vec<Instance>, ProviderError> {
        self.api(
            "list",
            format!("pool={pool}"),
            |s| Ok(s.list(pool)),
            |l| format!("ok {} instances", l.len()),
        )
    }
}

#[async_trait::async_trait]
impl CloudProvider for MemoryProvider {
    fn name(&self) -> &str {
        "memory"
    }

    async fn catalog(&self) -> Result<Catalog, ProviderError> {
        self.catalog_now()
    }

    async fn launch(&self, request: &LaunchRequest) -> Result<LaunchResult, ProviderError> {
        self.launch_now(request)
    }

    async fn terminate(&self, instance_id: &str) -> Result<(), ProviderError> {
        self.terminate_now(instance_id)
    }

    async fn list(&self, pool: &str) -> Result<Vec<Instance>, ProviderError> {
        self.list_now(pool)
    }

    async fn reservations(&self) -> Result<Vec<Reservation>, ProviderError> {
        Ok(self.reservations_now())
    }
}

#[cfg(test)]
mod tests;
