//! A token bucket (the classic rate limiter, as Envoy's local rate limit has it): `capacity`
//! tokens at most, refilled continuously at `rate_per_s`; a request costs some tokens and passes
//! only when the bucket holds them. Pure: every call takes the current time, so the arithmetic is
//! tested without sleeping.
//!
//! The retry hint ([`TokenBucket::wait_for`]) is computed from the bucket: the time until the
//! refill brings the level up to the cost, given what is in it now. It is exact for a bucket
//! nobody else draws from meanwhile, and a lower bound otherwise.

use std::time::{Duration, Instant};

/// One token bucket. Levels are fractional (a rate of 20 per second adds 0.02 per ms).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenBucket {
    capacity: f64,
    rate_per_s: f64,
    level: f64,
    updated: Instant,
}

impl TokenBucket {
    /// A full bucket of `capacity` tokens refilled at `rate_per_s` tokens per second (both > 0).
    pub fn new(capacity: f64, rate_per_s: f64, now: Instant) -> Self {
        Self {
            capacity,
            rate_per_s,
            level: capacity,
            updated: now,
        }
    }

    /// The bucket's size.
    pub fn capacity(&self) -> f64 {
        self.capacity
    }

    /// The refill rate, in tokens per second.
    pub fn rate_per_s(&self) -> f64 {
        self.rate_per_s
    }

    /// Tokens in the bucket at `now`.
    pub fn level(&mut self, now: Instant) -> f64 {
        self.refill(now);
        self.level
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.updated).as_secs_f64();
        self.level = (self.level + elapsed * self.rate_per_s).min(self.capacity);
        self.updated = self.updated.max(now);
    }

    /// How long until the bucket holds `cost` tokens: zero when it does now, `None` when it never
    /// will (`cost` above the capacity).
    pub fn wait_for(&mut self, cost: f64, now: Instant) -> Option<Duration> {
        if cost > self.capacity {
            return None;
        }
        self.refill(now);
        let missing = (cost - self.level).max(0.0);
        Some(Duration::from_secs_f64(missing / self.rate_per_s))
    }

    /// Takes `cost` tokens when the bucket holds them.
    ///
    /// Errors: the wait until it would (see [`Self::wait_for`]; `None`: never); nothing is taken.
    pub fn take(&mut self, cost: f64, now: Instant) -> Result<(), Option<Duration>> {
        match self.wait_for(cost, now) {
            Some(wait) if wait.is_zero() => {
                self.level -= cost;
                Ok(())
            }
            other => Err(other),
        }
    }

    /// Puts `tokens` back (the unused part of a reservation), up to the capacity.
    pub fn give_back(&mut self, tokens: f64, now: Instant) {
        self.refill(now);
        self.level = (self.level + tokens).min(self.capacity);
    }

    /// Changes the size and rate (a reloaded limit) from `now` on: a larger bucket gains the
    /// difference at once (a raised limit takes effect immediately), a smaller one keeps at most
    /// its new capacity.
    pub fn reconfigure(&mut self, capacity: f64, rate_per_s: f64, now: Instant) {
        self.refill(now);
        let grown = (capacity - self.capacity).max(0.0);
        self.capacity = capacity;
        self.rate_per_s = rate_per_s;
        self.level = (self.level + grown).min(capacity);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn takes_while_full_then_waits_for_the_refill() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(2.0, 10.0, t0);
        assert_eq!(b.take(1.0, t0), Ok(()));
        assert_eq!(b.take(1.0, t0), Ok(()));
        // Empty: one token comes back after 100 ms at 10 per second.
        let wait = b.take(1.0, t0).unwrap_err().unwrap();
        assert!((wait.as_secs_f64() - 0.1).abs() < 1e-9, "{wait:?}");
        let wait = b.take(1.0, t0 + ms(40)).unwrap_err().unwrap();
        assert!((wait.as_secs_f64() - 0.06).abs() < 1e-9, "{wait:?}");
        // Honouring the hint succeeds.
        assert_eq!(b.take(1.0, t0 + ms(40) + wait), Ok(()));
        // Never more than the capacity, however long it rests.
        assert_eq!(b.level(t0 + ms(60_000)), 2.0);
    }

    #[test]
    fn a_cost_above_the_capacity_never_passes() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(100.0, 1.0, t0);
        assert_eq!(b.take(101.0, t0), Err(None));
        assert_eq!(b.level(t0), 100.0);
    }

    #[test]
    fn given_back_tokens_return_up_to_the_capacity() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(100.0, 1.0, t0);
        b.take(80.0, t0).unwrap();
        b.give_back(30.0, t0);
        assert_eq!(b.level(t0), 50.0);
        b.give_back(500.0, t0);
        assert_eq!(b.level(t0), 100.0);
    }

    #[test]
    fn reconfiguring_raises_at_once_and_lowers_to_the_new_size() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(1.0, 1.0, t0);
        b.take(1.0, t0).unwrap();
        b.reconfigure(100.0, 100.0, t0);
        assert_eq!(b.level(t0), 99.0);
        assert_eq!((b.capacity(), b.rate_per_s()), (100.0, 100.0));
        b.reconfigure(5.0, 5.0, t0);
        assert_eq!(b.level(t0), 5.0);
    }
}
