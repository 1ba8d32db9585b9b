//! Graceful drain: once draining, new calls are refused ([`RouteError::Draining`], `UNAVAILABLE` /
//! HTTP 503) while the running ones finish; the process waits for them (up to a timeout) before it
//! exits.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
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
}

/// Held by one running `Generate` call; dropping it ends the call's count.
#[derive(Debug)]
pub struct ActiveCall(Arc<Drain>);

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
}
