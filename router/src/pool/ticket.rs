//! An admitted request's place ([`Ticket`]: sent at once, or waiting in the admission queue until a
//! worker has room) and a request sent to one worker ([`Dispatched`]).

use std::sync::Arc;
use std::time::Instant;

use super::{WorkerEvent, WorkerLink, WorkerPool};
use crate::route_error::RouteError;
use tokio::sync::{mpsc, oneshot};

/// A request sent to a worker. Dropping it before the worker finished the request cancels the
/// request on the worker (client gone, stop string matched, deadline passed).
pub struct Dispatched {
    /// Events from the worker for this request.
    pub events: mpsc::UnboundedReceiver<WorkerEvent>,
    pub(super) pool: Arc<WorkerPool>,
    pub(super) link: Arc<WorkerLink>,
    pub(super) internal_id: String,
}

impl Dispatched {
    /// The worker serving the request.
    pub fn worker_address(&self) -> &str {
        &self.link.address
    }
}

impl Drop for Dispatched {
    fn drop(&mut self) {
        // No-op when the worker already finished the request (its entry is gone).
        if self.link.cancel(&self.internal_id) {
            self.pool.pump();
        }
    }
}

/// An admitted request's place: already sent to a worker, or waiting in the queue. Dropping it
/// gives up the place.
pub struct Ticket {
    pool: Arc<WorkerPool>,
    dispatched: Option<Dispatched>,
    queued: Option<(u64, oneshot::Receiver<Dispatched>)>,
}

impl Ticket {
    pub(super) fn dispatched(pool: Arc<WorkerPool>, dispatched: Dispatched) -> Self {
        Self {
            pool,
            dispatched: Some(dispatched),
            queued: None,
        }
    }

    pub(super) fn queued(
        pool: Arc<WorkerPool>,
        id: u64,
        rx: oneshot::Receiver<Dispatched>,
    ) -> Self {
        Self {
            pool,
            dispatched: None,
            queued: Some((id, rx)),
        }
    }

    /// Waits until the request is sent to a worker.
    ///
    /// Errors: [`RouteError::NoWorkerInTime`] when no worker was ready for the pool's failover
    /// timeout.
    pub async fn wait(&mut self) -> Result<Dispatched, RouteError> {
        if let Some(dispatched) = self.dispatched.take() {
            return Ok(dispatched);
        }
        let Some((_, rx)) = self.queued.as_mut() else {
            return Err(RouteError::Internal("the ticket was already used".into()));
        };
        let timeout = self.pool.settings.failover_timeout;
        let mut ready = self.pool.ready_watch();
        let mut no_worker_since: Option<Instant> = None;
        let outcome = loop {
            let none_ready = *ready.borrow_and_update() == 0;
            let give_up_at = if none_ready {
                Some(*no_worker_since.get_or_insert_with(Instant::now) + timeout)
            } else {
                no_worker_since = None;
                None
            };
            let give_up = async {
                match give_up_at {
                    Some(at) => tokio::time::sleep_until(at.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                result = &mut *rx => break result.ok(),
                changed = ready.changed() => if changed.is_err() { break None },
                () = give_up => break None,
            }
        };
        if let Some(dispatched) = outcome {
            self.queued = None;
            return Ok(dispatched);
        }
        self.leave_queue();
        Err(RouteError::NoWorkerInTime {
            ready: self.pool.ready_workers(),
            configured: self.pool.configured_workers(),
            waited_ms: timeout.as_millis(),
        })
    }

    /// Gives up the place in the queue, if any.
    fn leave_queue(&mut self) {
        if let Some((id, rx)) = self.queued.take() {
            let removed = self.pool.queue.lock().expect("queue lock").remove(id);
            drop(removed);
            // A request sent meanwhile is cancelled when its `Dispatched` drops with `rx`.
            drop(rx);
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.leave_queue();
    }
}
