//! Rate limit of the "worker unreachable" log: a router whose worker cannot be reached says so when
//! it first fails (WARN, with the address and the error), then at most once per period (a minute)
//! while the outage lasts, and at INFO when the worker is reached again; the retries in between
//! (every backoff step) log at debug only.

use std::time::{Duration, Instant};

/// What to log about a failed connection attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unreachable {
    /// The first failure since the worker was last reachable (or since start).
    First,
    /// Still failing; `attempts` failures over `down_for`.
    Still {
        /// Failed attempts since the first one of this outage, that one included.
        attempts: u64,
        /// Time since the first failure of this outage.
        down_for: Duration,
    },
}

/// Rate limit of the "worker unreachable" log: the first failure of an outage, then at most once
/// per `every` while it lasts; [`UnreachableLog::reached`] ends the outage.
#[derive(Debug, Clone)]
pub struct UnreachableLog {
    every: Duration,
    /// First failure of the current outage, last logged failure, failures so far.
    outage: Option<(Instant, Instant, u64)>,
}

impl UnreachableLog {
    /// No outage yet; repeats at most once per `every`.
    pub fn new(every: Duration) -> Self {
        Self {
            every,
            outage: None,
        }
    }

    /// A connection attempt failed at `now`: what to log, if anything.
    pub fn failed(&mut self, now: Instant) -> Option<Unreachable> {
        let Some((first, logged, attempts)) = self.outage.as_mut() else {
            self.outage = Some((now, now, 1));
            return Some(Unreachable::First);
        };
        *attempts += 1;
        if now.saturating_duration_since(*logged) < self.every {
            return None;
        }
        *logged = now;
        Some(Unreachable::Still {
            attempts: *attempts,
            down_for: now.saturating_duration_since(*first),
        })
    }

    /// The worker was reached at `now`: ends an outage; returns its length and failed attempts
    /// when there was one.
    pub fn reached(&mut self, now: Instant) -> Option<(Duration, u64)> {
        self.outage
            .take()
            .map(|(first, _, attempts)| (now.saturating_duration_since(first), attempts))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unreachable_is_logged_first_then_at_most_once_per_period_then_back() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut log = UnreachableLog::new(s(60));
        assert_eq!(log.reached(t0), None, "no outage, nothing to report");
        assert_eq!(log.failed(t0), Some(Unreachable::First));
        // Backoff retries every few seconds: silent until a minute passed since the last line.
        for i in 1..=11 {
            assert_eq!(log.failed(t0 + s(5 * i)), None, "attempt at {}s", 5 * i);
        }
        assert_eq!(
            log.failed(t0 + s(60)),
            Some(Unreachable::Still {
                attempts: 13,
                down_for: s(60)
            })
        );
        assert_eq!(log.failed(t0 + s(100)), None);
        assert_eq!(
            log.failed(t0 + s(121)),
            Some(Unreachable::Still {
                attempts: 15,
                down_for: s(121)
            })
        );
        assert_eq!(log.reached(t0 + s(130)), Some((s(130), 15)));
        assert_eq!(log.reached(t0 + s(131)), None);
        // A new outage starts over with a WARN at once.
        assert_eq!(log.failed(t0 + s(200)), Some(Unreachable::First));
    }
}
