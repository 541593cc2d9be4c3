//! Cron schedules of disruption budgets, as Karpenter writes them: five fields (minute, hour, day
//! of month, month, day of week) in UTC, or one of the macros `@yearly` (`@annually`),
//! `@monthly`, `@weekly`, `@daily` (`@midnight`) and `@hourly`. A field is `*`, a number, a
//! name (`jan`..`dec`, `sun`..`sat`), a range `a-b`, any of these with a step `/n`, or a
//! comma-separated list of them. When both day of month and day of week are restricted, a day
//! matching either matches (as cron does).

use std::fmt;
use std::time::Duration;

use chrono::{Datelike, Timelike};

use crate::model::Time;

/// A parsed schedule: the minutes, hours, days, months and weekdays it matches.
#[derive(Clone, PartialEq, Eq)]
pub struct Cron {
    /// As written, for messages.
    pub text: String,
    minutes: u64,
    hours: u64,
    days: u64,
    months: u64,
    weekdays: u64,
    day_any: bool,
    weekday_any: bool,
}

impl fmt::Debug for Cron {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Cron({:?})", self.text)
    }
}

const MONTHS: [&str; 12] = [
    "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
];
const WEEKDAYS: [&str; 7] = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"];

struct Field {
    name: &'static str,
    min: u32,
    max: u32,
    names: &'static [&'static str],
}

const FIELDS: [Field; 5] = [
    Field {
        name: "minute",
        min: 0,
        max: 59,
        names: &[],
    },
    Field {
        name: "hour",
        min: 0,
        max: 23,
        names: &[],
    },
    Field {
        name: "day of month",
        min: 1,
        max: 31,
        names: &[],
    },
    Field {
        name: "month",
        min: 1,
        max: 12,
        names: &MONTHS,
    },
    Field {
        name: "day of week",
        min: 0,
        max: 7,
        names: &WEEKDAYS,
    },
];

impl Field {
    fn value(&self, s: &str) -> Result<u32, String> {
        let lower = s.to_ascii_lowercase();
        if let Some(i) = self.names.iter().position(|n| *n == lower) {
            return Ok(i as u32 + self.min);
        }
        let v: u32 = s.parse().map_err(|_| {
            format!(
                "{} field: {s:?} is not a number{}",
                self.name,
                if self.names.is_empty() {
                    ""
                } else {
                    " or a name"
                }
            )
        })?;
        if v < self.min || v > self.max {
            return Err(format!(
                "{} field: {v} is outside {}-{}",
                self.name, self.min, self.max
            ));
        }
        Ok(v)
    }

    /// The bit set of one field; whether it was `*` (unrestricted).
    fn parse(&self, s: &str) -> Result<(u64, bool), String> {
        let mut bits = 0u64;
        let mut any = false;
        for part in s.split(',') {
            let (range, step) = match part.split_once('/') {
                Some((r, st)) => {
                    let st: u32 = st
                        .parse()
                        .map_err(|_| format!("{} field: step {st:?} is not a number", self.name))?;
                    if st == 0 {
                        return Err(format!("{} field: a step must be at least 1", self.name));
                    }
                    (r, Some(st))
                }
                None => (part, None),
            };
            let (lo, hi) = if range == "*" {
                any |= step.is_none();
                (self.min, self.max)
            } else if let Some((a, b)) = range.split_once('-') {
                let (a, b) = (self.value(a)?, self.value(b)?);
                if a > b {
                    return Err(format!(
                        "{} field: range {range:?} ends before it starts",
                        self.name
                    ));
                }
                (a, b)
            } else {
                let a = self.value(range)?;
                // `5/15`: from 5 to the end, every 15.
                (a, if step.is_some() { self.max } else { a })
            };
            let step = step.unwrap_or(1);
            let mut v = lo;
            while v <= hi {
                bits |= 1 << v;
                v += step;
            }
        }
        Ok((bits, any))
    }
}

impl Cron {
    /// Parses a schedule; the error says which field is wrong and why.
    pub fn parse(text: &str) -> Result<Cron, String> {
        let expanded = match text.trim() {
            "@yearly" | "@annually" => "0 0 1 1 *",
            "@monthly" => "0 0 1 * *",
            "@weekly" => "0 0 * * 0",
            "@daily" | "@midnight" => "0 0 * * *",
            "@hourly" => "0 * * * *",
            t if t.starts_with('@') => {
                return Err(format!(
                    "unknown macro {t:?} (@yearly, @annually, @monthly, @weekly, @daily, \
                     @midnight, @hourly)"
                ))
            }
            t => t,
        };
        let parts: Vec<&str> = expanded.split_whitespace().collect();
        if parts.len() != 5 {
            return Err(format!(
                "a schedule has 5 fields (minute hour day-of-month month day-of-week), got {}",
                parts.len()
            ));
        }
        let mut sets = [(0u64, false); 5];
        for (i, (f, p)) in FIELDS.iter().zip(&parts).enumerate() {
            sets[i] = f.parse(p)?;
        }
        // Sunday is 0 or 7.
        let mut weekdays = sets[4].0;
        if weekdays & (1 << 7) != 0 {
            weekdays |= 1;
        }
        Ok(Cron {
            text: text.to_string(),
            minutes: sets[0].0,
            hours: sets[1].0,
            days: sets[2].0,
            months: sets[3].0,
            weekdays,
            day_any: sets[2].1,
            weekday_any: sets[4].1,
        })
    }

    /// Whether the minute that starts at `t` (UTC) matches.
    pub fn matches(&self, t: Time) -> bool {
        let Some(d) = chrono::DateTime::from_timestamp_millis(t.0) else {
            return false;
        };
        let bit = |set: u64, v: u32| set & (1 << v) != 0;
        if !bit(self.minutes, d.minute()) || !bit(self.hours, d.hour()) {
            return false;
        }
        if !bit(self.months, d.month()) {
            return false;
        }
        let day = bit(self.days, d.day());
        let weekday = bit(self.weekdays, d.weekday().num_days_from_sunday());
        match (self.day_any, self.weekday_any) {
            (true, true) => true,
            (true, false) => weekday,
            (false, true) => day,
            (false, false) => day || weekday,
        }
    }

    /// The latest time the schedule fired at or before `now`, looking back at most `within`
    /// (whole minutes).
    pub fn last_fired(&self, now: Time, within: Duration) -> Option<Time> {
        let minute = 60_000;
        let start = now.0.div_euclid(minute) * minute;
        let steps = (within.as_millis() as i64).div_euclid(minute);
        (0..=steps)
            .map(|k| Time(start - k * minute))
            .find(|t| self.matches(*t))
    }

    /// Whether a window of `duration` opened by the schedule is open at `now`: the schedule
    /// fired at `t <= now` with `now < t + duration`.
    pub fn open_at(&self, now: Time, duration: Duration) -> Option<Time> {
        self.last_fired(now, duration)
            .filter(|t| *t + duration > now)
    }

    /// The next time at or after `now` the schedule fires, looking ahead at most `within`.
    pub fn next_fire(&self, now: Time, within: Duration) -> Option<Time> {
        let minute = 60_000;
        let start = (now.0 + minute - 1).div_euclid(minute) * minute;
        let steps = (within.as_millis() as i64).div_euclid(minute);
        (0..=steps)
            .map(|k| Time(start + k * minute))
            .find(|t| self.matches(*t))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Time {
        Time::parse_rfc3339(s).unwrap()
    }

    #[test]
    fn budget_schedules_match_minutes_as_cron_does() {
        let c = Cron::parse("0 9 * * mon-fri").unwrap();
        // Friday 2026-11-27 09:00 UTC.
        assert!(c.matches(at("2026-11-27T09:00:00Z")));
        assert!(!c.matches(at("2026-11-27T09:01:00Z")));
        // Saturday.
        assert!(!c.matches(at("2026-11-28T09:00:00Z")));
        let every = Cron::parse("*/15 * * * *").unwrap();
        assert!(every.matches(at("2026-11-28T03:45:00Z")));
        assert!(!every.matches(at("2026-11-28T03:44:00Z")));
        // Day of month or day of week when both are restricted: the 1st, or any Sunday.
        let either = Cron::parse("0 0 1 * 0").unwrap();
        assert!(either.matches(at("2026-12-01T00:00:00Z")));
        assert!(either.matches(at("2026-11-29T00:00:00Z")));
        assert!(!either.matches(at("2026-11-30T00:00:00Z")));
        // Sunday as 7, names in any case, lists and steps.
        assert!(Cron::parse("0 0 * * 7")
            .unwrap()
            .matches(at("2026-11-29T00:00:00Z")));
        let list = Cron::parse("5,10-20/5 0 * DEC *").unwrap();
        assert!(list.matches(at("2026-12-02T00:15:00Z")));
        assert!(!list.matches(at("2026-11-02T00:15:00Z")));
        assert_eq!(
            Cron::parse("@daily").unwrap().minutes,
            Cron::parse("0 0 * * *").unwrap().minutes
        );
    }

    #[test]
    fn budget_windows_open_when_the_schedule_fires_and_close_after_their_duration() {
        let c = Cron::parse("0 9 * * *").unwrap();
        let d = Duration::from_secs(8 * 3600);
        assert_eq!(c.open_at(at("2026-11-27T08:59:00Z"), d), None);
        assert_eq!(
            c.open_at(at("2026-11-27T09:00:00Z"), d),
            Some(at("2026-11-27T09:00:00Z"))
        );
        assert!(c.open_at(at("2026-11-27T16:59:59Z"), d).is_some());
        assert_eq!(c.open_at(at("2026-11-27T17:00:00Z"), d), None);
        assert_eq!(
            c.next_fire(at("2026-11-27T17:00:00Z"), Duration::from_secs(86_400)),
            Some(at("2026-11-28T09:00:00Z"))
        );
    }

    #[test]
    fn bad_budget_schedules_say_which_field_is_wrong() {
        let e = |s: &str| Cron::parse(s).unwrap_err();
        assert!(e("0 9 * *").contains("5 fields"), "{}", e("0 9 * *"));
        assert!(e("60 * * * *").contains("minute field: 60 is outside 0-59"));
        assert!(e("0 25 * * *").contains("hour field"));
        assert!(e("0 0 * * fun").contains("day of week field"));
        assert!(e("0 0 5-1 * *").contains("ends before it starts"));
        assert!(e("*/0 * * * *").contains("step must be at least 1"));
        assert!(e("@sometimes").contains("unknown macro"));
    }
}
