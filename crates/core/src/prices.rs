//! Refreshing the cloud's prices while a policy stays in force: when a refresh is due (time
//! passed in), and how freshly read prices replace the ones in force. A read that failed changes
//! nothing: the last good prices stay.

use std::collections::BTreeMap;
use std::time::Duration;

use gpu_node_autoscaler_provider::{Catalog, OfferingKey};

use crate::model::time::Time;

/// When the prices are read again: `interval` after the last read, failed or not (a failed read
/// is not retried sooner, so that an API in trouble is not asked more often). A zero interval
/// never refreshes: the prices read with the policy stay.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PriceSchedule {
    interval: Duration,
    last_read: Option<Time>,
}

impl PriceSchedule {
    pub fn new(interval: Duration) -> PriceSchedule {
        PriceSchedule {
            interval,
            last_read: None,
        }
    }

    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// Whether the prices are to be read at `now`. Nothing is due before a first read (the
    /// policy's own, recorded with [`PriceSchedule::read_at`]).
    pub fn due(&self, now: Time) -> bool {
        !self.interval.is_zero() && self.last_read.is_some_and(|at| now >= at + self.interval)
    }

    /// The prices were read (or a read was tried) at `now`.
    pub fn read_at(&mut self, now: Time) {
        self.last_read = Some(now);
    }
}

/// One offering whose price changed.
#[derive(Clone, Debug, PartialEq)]
pub struct PriceChange {
    pub key: OfferingKey,
    pub from: f64,
    pub to: f64,
}

/// The catalog in force with the prices of `fresh` where it has the same offering; offerings
/// `fresh` lacks keep their price, and offerings only `fresh` has are left out (the offerings
/// in force are the policy's, and only a policy change changes them). Availability is the one
/// in force (it is learnt from launches, not from a price list). Returns what changed.
pub fn merge(current: &Catalog, fresh: &Catalog) -> (Catalog, Vec<PriceChange>) {
    let fresh_prices: BTreeMap<&OfferingKey, f64> = fresh
        .offerings
        .iter()
        .filter(|o| o.price_per_hour.is_finite() && o.price_per_hour > 0.0)
        .map(|o| (&o.key, o.price_per_hour))
        .collect();
    let mut merged = current.clone();
    let mut changes = Vec::new();
    for o in &mut merged.offerings {
        if let Some(&p) = fresh_prices.get(&o.key) {
            if p != o.price_per_hour {
                changes.push(PriceChange {
                    key: o.key.clone(),
                    from: o.price_per_hour,
                    to: p,
                });
                o.price_per_hour = p;
            }
        }
    }
    (merged, changes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpu_node_autoscaler_provider::{CapacityType, Offering};

    fn offering(t: &str, zone: &str, ct: CapacityType, price: f64, available: bool) -> Offering {
        Offering {
            key: OfferingKey {
                instance_type: t.into(),
                zone: zone.into(),
                capacity_type: ct,
            },
            price_per_hour: price,
            available,
        }
    }

    #[test]
    fn due_an_interval_after_the_last_read_failed_or_not() {
        let t0 = Time::from_secs(1_000);
        let mut s = PriceSchedule::new(Duration::from_secs(300));
        assert!(!s.due(t0), "nothing is due before the policy's own read");
        s.read_at(t0);
        assert!(!s.due(t0 + Duration::from_secs(299)));
        assert!(s.due(t0 + Duration::from_secs(300)));
        // A read tried at 300 s (whatever came of it): the next is due at 600 s.
        s.read_at(t0 + Duration::from_secs(300));
        assert!(!s.due(t0 + Duration::from_secs(599)));
        assert!(s.due(t0 + Duration::from_secs(600)));

        let mut never = PriceSchedule::new(Duration::ZERO);
        never.read_at(t0);
        assert!(!never.due(t0 + Duration::from_secs(86_400)));
    }

    #[test]
    fn fresh_prices_replace_those_in_force_offering_by_offering() {
        use CapacityType::{OnDemand, Spot};
        let current = Catalog {
            instance_types: Vec::new(),
            offerings: vec![
                offering("g5.xlarge", "us-east-1a", Spot, 0.40, true),
                offering("g5.xlarge", "us-east-1b", Spot, 0.45, false),
                offering("g5.xlarge", "us-east-1a", OnDemand, 1.006, true),
            ],
        };
        let fresh = Catalog {
            instance_types: Vec::new(),
            offerings: vec![
                // Changed, and its availability in force is kept.
                offering("g5.xlarge", "us-east-1a", Spot, 0.31, false),
                // Unchanged.
                offering("g5.xlarge", "us-east-1a", OnDemand, 1.006, true),
                // Not in force: left out.
                offering("g5.xlarge", "us-east-1c", Spot, 0.10, true),
                // Not a price: ignored.
                offering("g5.xlarge", "us-east-1b", Spot, 0.0, true),
            ],
        };
        let (merged, changes) = merge(&current, &fresh);
        assert_eq!(
            merged.offerings,
            vec![
                offering("g5.xlarge", "us-east-1a", Spot, 0.31, true),
                offering("g5.xlarge", "us-east-1b", Spot, 0.45, false),
                offering("g5.xlarge", "us-east-1a", OnDemand, 1.006, true),
            ]
        );
        assert_eq!(changes.len(), 1);
        assert_eq!((changes[0].from, changes[0].to), (0.40, 0.31));

        // Nothing read (the cloud answered nothing for these types): the prices in force stay.
        let (same, none) = merge(&current, &Catalog::default());
        assert_eq!(same.offerings, current.offerings);
        assert!(none.is_empty());
    }
}
