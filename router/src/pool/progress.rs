//! Is a worker busy or stalled? The rule that takes a connected worker out of rotation for lack of
//! progress.
//!
//! A busy worker is not a down one: a CPU engine step (a long prefill) can take seconds, and a
//! health probe that gets no answer in time says nothing about the engine. A worker leaves rotation
//! only when its stream breaks, when its `Health` answer says not ready, or, decided here, when it
//! **has work** (this router has requests in flight on it, or its last `Health` answer said
//! `has_work`) and has shown **no progress** for `stall_timeout` (a hung engine: vLLM #40926's
//! failure, health 200 while nothing moves; or a stopped process). Progress is
//!
//! - a step message on the worker's stream,
//! - a `Health` answer: the worker's own `millis_since_progress` places its last finished step (or
//!   the moment its work arrived) in the router's clock, and an idle worker (`has_work` false) is
//!   progressing by definition,
//! - this router sending the first request to a worker it believed idle (the clock starts then, not
//!   at the worker's last step before it went idle).
//!
//! Once stalled a worker stays out until a `Health` answer or a step message shows it moving again:
//! a stopped process that answers nothing is never put back because the router's own requests on
//! it were failed over and it no longer "has work" from the router's side.

use std::time::{Duration, Instant};

use inference_proto::worker::HealthResponse;

/// One worker's progress, as seen by the router.
#[derive(Debug, Clone)]
pub struct Progress {
    timeout: Duration,
    /// The latest moment the worker was seen making progress.
    last_progress: Instant,
    /// Its last `Health` answer said it has running or waiting sequences.
    worker_has_work: bool,
    stalled: bool,
}

/// What a check or an observation changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Nothing.
    None,
    /// The worker just became stalled: take it out of rotation and fail its requests over.
    Stalled,
    /// A stalled worker moves again: it may rejoin.
    Moving,
}

impl Progress {
    /// A worker that just connected (progress now, not stalled) judged with `timeout`.
    pub fn new(now: Instant, timeout: Duration) -> Self {
        Self {
            timeout,
            last_progress: now,
            worker_has_work: false,
            stalled: false,
        }
    }

    /// Whether the worker is stalled (out of rotation).
    pub fn is_stalled(&self) -> bool {
        self.stalled
    }

    /// Time since the worker was last seen making progress, at `now`.
    pub fn since_progress(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.last_progress)
    }

    /// Records progress at `at`; a stalled worker moves again.
    fn progressed(&mut self, at: Instant) -> Change {
        self.last_progress = self.last_progress.max(at);
        if std::mem::replace(&mut self.stalled, false) {
            Change::Moving
        } else {
            Change::None
        }
    }

    /// A step message arrived at `now`.
    pub fn on_step(&mut self, now: Instant) -> Change {
        self.progressed(now)
    }

    /// This router sends a request at `now` while it had `inflight_before` requests on the worker:
    /// when the worker seemed idle, the stall clock starts now.
    pub fn on_dispatch(&mut self, now: Instant, inflight_before: usize) {
        if inflight_before == 0 && !self.worker_has_work {
            self.last_progress = self.last_progress.max(now);
        }
    }

    /// A `Health` answer arrived at `now`. A worker that says it is not ready stays stalled if it
    /// was (it leaves rotation through `ready` anyway).
    pub fn on_health(&mut self, now: Instant, answer: &HealthResponse) -> Change {
        self.worker_has_work = answer.has_work;
        if !answer.has_work {
            return self.progressed(now);
        }
        let age = Duration::from_millis(answer.millis_since_progress);
        let at = now.checked_sub(age).unwrap_or(self.last_progress);
        if age <= self.timeout && !answer.stalled {
            self.progressed(at)
        } else {
            // An old step: it moves our estimate forward but does not end a stall.
            self.last_progress = self.last_progress.max(at);
            Change::None
        }
    }

    /// Applies the rule at `now` with `inflight` requests of this router on the worker: returns
    /// [`Change::Stalled`] when the worker has work and has shown no progress for the timeout.
    pub fn check(&mut self, now: Instant, inflight: usize) -> Change {
        let has_work = inflight > 0 || self.worker_has_work;
        if !self.stalled && has_work && self.since_progress(now) > self.timeout {
            self.stalled = true;
            return Change::Stalled;
        }
        Change::None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMEOUT: Duration = Duration::from_millis(1_000);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn answer(has_work: bool, millis_since_progress: u64) -> HealthResponse {
        HealthResponse {
            ready: true,
            engine_alive: true,
            has_work,
            millis_since_progress,
            ..Default::default()
        }
    }

    #[test]
    fn an_idle_worker_never_stalls() {
        let t0 = Instant::now();
        let mut p = Progress::new(t0, TIMEOUT);
        assert_eq!(p.check(t0 + ms(60_000), 0), Change::None);
        assert!(!p.is_stalled());
    }

    #[test]
    fn a_busy_worker_whose_probes_time_out_but_steps_arrive_is_not_stalled() {
        let t0 = Instant::now();
        let mut p = Progress::new(t0, TIMEOUT);
        p.on_dispatch(t0, 0);
        for i in 1..=20 {
            // One step message every 900 ms, no health answer at all.
            p.on_step(t0 + ms(900 * i));
            assert_eq!(p.check(t0 + ms(900 * i + 500), 3), Change::None);
        }
    }

    #[test]
    fn a_long_step_reported_by_health_is_progress_until_the_timeout() {
        let t0 = Instant::now();
        let mut p = Progress::new(t0, TIMEOUT);
        // The worker is prefilling for another router: no step messages here, health says it works.
        assert_eq!(p.on_health(t0 + ms(500), &answer(true, 400)), Change::None);
        assert_eq!(p.check(t0 + ms(1_050), 0), Change::None);
        assert_eq!(
            p.on_health(t0 + ms(1_500), &answer(true, 300)),
            Change::None
        );
        assert_eq!(p.check(t0 + ms(2_150), 0), Change::None);
        // Its answers now say the last step is old: stalled once that age passes the timeout.
        assert_eq!(
            p.on_health(t0 + ms(2_500), &answer(true, 1_300)),
            Change::None
        );
        assert_eq!(p.check(t0 + ms(2_600), 0), Change::Stalled);
        assert!(p.is_stalled());
    }

    #[test]
    fn silence_with_requests_in_flight_stalls_and_only_movement_ends_it() {
        let t0 = Instant::now();
        let mut p = Progress::new(t0, TIMEOUT);
        // Idle for a minute; the first request starts the clock then, not at the connect.
        let t1 = t0 + ms(60_000);
        p.on_dispatch(t1, 0);
        assert_eq!(p.check(t1 + ms(900), 1), Change::None);
        // Then nothing: no step, no health answer (a stopped process).
        assert_eq!(p.check(t1 + ms(1_001), 1), Change::Stalled);
        assert_eq!(p.check(t1 + ms(1_500), 1), Change::None, "reported once");
        // Its requests failed over: no work from this router, and still no answer: stays out.
        assert_eq!(p.check(t1 + ms(5_000), 0), Change::None);
        assert!(p.is_stalled());
        // An answer with an old step does not end it; one that shows progress does.
        assert_eq!(
            p.on_health(t1 + ms(6_000), &answer(true, 5_500)),
            Change::None
        );
        assert!(p.is_stalled());
        assert_eq!(
            p.on_health(t1 + ms(6_100), &answer(true, 20)),
            Change::Moving
        );
        assert!(!p.is_stalled());
        assert_eq!(p.check(t1 + ms(6_500), 0), Change::None);
    }

    #[test]
    fn an_idle_answer_or_a_step_ends_a_stall() {
        let t0 = Instant::now();
        let mut p = Progress::new(t0, TIMEOUT);
        assert_eq!(p.check(t0 + ms(1_500), 2), Change::Stalled);
        assert_eq!(
            p.on_health(t0 + ms(2_000), &answer(false, 0)),
            Change::Moving
        );
        assert_eq!(p.check(t0 + ms(4_000), 0), Change::None);
        assert_eq!(p.check(t0 + ms(4_000), 1), Change::Stalled);
        assert_eq!(p.on_step(t0 + ms(4_100)), Change::Moving);
    }

    #[test]
    fn the_worker_saying_stalled_is_not_progress() {
        let t0 = Instant::now();
        let mut p = Progress::new(t0, TIMEOUT);
        assert_eq!(p.check(t0 + ms(1_100), 1), Change::Stalled);
        let mut a = answer(true, 10);
        a.stalled = true;
        assert_eq!(p.on_health(t0 + ms(1_200), &a), Change::None);
        assert!(p.is_stalled());
    }
}
