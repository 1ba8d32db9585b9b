//! Graceful drain: once draining, new calls are refused ([`RouteError::Draining`], `UNAVAILABLE` /
//! HTTP 503) while the running ones finish; the process waits for them (up to a timeout) before it
//! exits.
//!
//! When the timeout passes with calls still running, [`Drain::expire`] cuts them off: each front
//! ends every call it still runs with [`RouteError::DrainTimeout`] (`UNAVAILABLE` / HTTP 503 with
//! OpenAI's error object; a streamed response gets it as its last event) as soon as its
//! [`ActiveCall::cut_off`] resolves, so a client hears a definite, retryable status instead of a
//! connection that breaks when the process exits.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use crate::route_error::RouteError;

/// The router's drain state: a flag and the count of running `Generate` calls.
#[derive(Debug, Default)]
pub struct Drain {
    draining: AtomicBool,
    active: AtomicUsize,
    idle: Notify,
    /// Set by [`Drain::expire`]: the drain timeout (in milliseconds) that passed.
    expired_after_ms: AtomicU64,
    expired: AtomicBool,
    cut_off: Notify,
}

/// Held by one running `Generate` call; dropping it ends the call's count.
#[derive(Debug)]
pub struct ActiveCall(Arc<Drain>);

/// Resolves with [`RouteError::DrainTimeout`] once the drain timeout has passed
/// ([`ActiveCall::cut_off`]).
pub type CutOff = Pin<Box<dyn Future<Output = RouteError> + Send>>;

impl ActiveCall {
    /// Resolves, with the error to end the call with, once the drain timeout has passed with this
    /// call still running ([`Drain::expire`]); never before. Pollable from a `Stream`.
    pub fn cut_off(&self) -> CutOff {
        let drain = self.0.clone();
        Box::pin(async move {
            loop {
                let notified = drain.cut_off.notified();
                if let Some(error) = drain.expiry() {
                    return error;
                }
                notified.await;
            }
        })
    }
}

impl Drop for ActiveCall {
    fn drop(&mut self) {
        if self.0.active.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

impl Drain {
    /// A router that is serving (not draining).
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Whether the router is draining (readiness should say NOT_SERVING).
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// Starts draining: every later [`Drain::admit`] fails.
    pub fn start(&self) {
        self.draining.store(true, Ordering::Release);
    }

    /// Running `Generate` calls.
    pub fn active(&self) -> usize {
        self.active.load(Ordering::Acquire)
    }

    /// Counts a new call, or refuses it while draining.
    ///
    /// Errors: [`RouteError::Draining`] when the router is draining.
    pub fn admit(self: &Arc<Self>) -> Result<ActiveCall, RouteError> {
        self.active.fetch_add(1, Ordering::AcqRel);
        let call = ActiveCall(self.clone());
        if self.is_draining() {
            return Err(RouteError::Draining);
        }
        Ok(call)
    }

    /// The drain timeout (`timeout`) has passed: every call still running is ended with
    /// [`RouteError::DrainTimeout`] by its front (see [`ActiveCall::cut_off`]).
    pub fn expire(&self, timeout: Duration) {
        self.expired_after_ms
            .store(timeout.as_millis() as u64, Ordering::Release);
        self.expired.store(true, Ordering::Release);
        self.cut_off.notify_waiters();
    }

    /// The error running calls end with, once [`Drain::expire`] has been called.
    fn expiry(&self) -> Option<RouteError> {
        self.expired
            .load(Ordering::Acquire)
            .then(|| RouteError::DrainTimeout {
                timeout_ms: self.expired_after_ms.load(Ordering::Acquire),
            })
    }

    /// Waits until no call runs or `timeout` passes; returns whether all calls finished.
    pub async fn wait_idle(&self, timeout: Duration) -> bool {
        let wait = async {
            loop {
                let notified = self.idle.notified();
                if self.active() == 0 {
                    return;
                }
                notified.await;
            }
        };
        tokio::time::timeout(timeout, wait).await.is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn refuses_new_calls_and_waits_for_running_ones() {
        let drain = Drain::new();
        let call = drain.admit().unwrap();
        assert!(!drain.wait_idle(Duration::from_millis(1)).await);
        drain.start();
        assert!(drain.is_draining());
        let err = drain.admit().unwrap_err();
        assert_eq!(err, RouteError::Draining);
        assert_eq!(drain.active(), 1);
        let waiter = {
            let drain = drain.clone();
            tokio::spawn(async move { drain.wait_idle(Duration::from_secs(5)).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(call);
        assert!(waiter.await.unwrap());
        assert_eq!(drain.active(), 0);
    }

    #[tokio::test]
    async fn expiry_cuts_off_running_calls_and_later_ones_at_once() {
        let drain = Drain::new();
        let call = drain.admit().unwrap();
        let mut cut_off = call.cut_off();
        let pending = tokio::time::timeout(Duration::from_millis(20), &mut cut_off).await;
        assert!(pending.is_err(), "cut off before the drain timeout");
        drain.start();
        drain.expire(Duration::from_millis(1500));
        let error = RouteError::DrainTimeout { timeout_ms: 1500 };
        assert_eq!(cut_off.await, error);
        // A call whose cut-off is asked for after the expiry gets it at once.
        assert_eq!(call.cut_off().await, error);
    }
}
