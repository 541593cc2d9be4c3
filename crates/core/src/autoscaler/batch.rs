//! The batching window of scale-up decisions.

use std::time::Duration;

use crate::model::Time;

/// A batching window: it opens at the first unschedulable pod and closes `idle` after the last
/// one, or `max` after it opened, whichever comes first.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Batch {
    first: Option<Time>,
    last: Option<Time>,
}

impl Batch {
    pub fn add(&mut self, now: Time) {
        self.first.get_or_insert(now);
        self.last = Some(now);
    }

    /// When the window closes; `None` when it is not open.
    pub fn deadline(&self, idle: Duration, max: Duration) -> Option<Time> {
        Some((self.last? + idle).min(self.first? + max))
    }

    pub fn clear(&mut self) {
        *self = Batch::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_closes_idle_after_the_last_pod_or_max_after_the_first() {
        let (idle, max) = (Duration::from_secs(1), Duration::from_secs(10));
        let mut b = Batch::default();
        assert_eq!(b.deadline(idle, max), None);
        b.add(Time::from_secs(0));
        assert_eq!(b.deadline(idle, max), Some(Time::from_secs(1)));
        for s in 1..20 {
            b.add(Time::from_secs(s));
        }
        assert_eq!(b.deadline(idle, max), Some(Time::from_secs(10)));
        b.clear();
        assert_eq!(b.deadline(idle, max), None);
    }
}
