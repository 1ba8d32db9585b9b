//! An admitted request's handles: its place ([`Ticket`]: sent at once, or waiting in its model's
//! queue until a worker has room, or until a worker that just lost its stream is back), then the
//! request on one worker ([`Dispatched`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot, watch};

use super::link::{WorkerEvent, WorkerLink};
use crate::admission::QueueFull;
use crate::route_error::RouteError;

/// What tickets need of their pool (implemented by the worker pool; a trait, so that this module
/// does not depend on the pool's module, which creates tickets).
pub(super) trait TicketPool: Send + Sync {
    /// How long a queued request waits while no worker of its model is ready.
    fn failover_timeout(&self) -> Duration;
    /// Changes whenever any worker's readiness may have changed.
    fn watch_readiness(&self) -> watch::Receiver<u64>;
    /// Workers ready now that serve the model `model`.
    fn ready_workers_of(&self, model: &str) -> usize;
    /// Workers known to the router.
    fn configured_workers(&self) -> usize;
    /// Removes the waiting request `id` from the queue of `model`, if it is still there.
    fn leave_queue(&self, model: &str, id: u64);
    /// Sends waiting requests where a worker has room.
    fn pump_queues(self: Arc<Self>);
}

/// A request sent to a worker. Dropping it before the worker finished the request cancels the
/// request on the worker (client gone, stop string matched, deadline passed).
pub struct Dispatched {
    /// Events from the worker for this request.
    pub events: mpsc::UnboundedReceiver<WorkerEvent>,
    pool: Arc<dyn TicketPool>,
    link: Arc<WorkerLink>,
    internal_id: String,
}

impl Dispatched {
    pub(super) fn new(
        events: mpsc::UnboundedReceiver<WorkerEvent>,
        pool: Arc<dyn TicketPool>,
        link: Arc<WorkerLink>,
        internal_id: String,
    ) -> Self {
        Self {
            events,
            pool,
            link,
            internal_id,
        }
    }

    /// The worker serving the request.
    pub fn worker_address(&self) -> &str {
        &self.link.address
    }

    /// Flow control: the client stopped reading, so the worker holds the request (it generates
    /// nothing and takes no place in the batch; `HoldRequest` in worker.proto). A held request
    /// frees its place under `max_inflight_per_worker`, so the queue moves on.
    pub fn hold(&self) {
        if self.link.hold(&self.internal_id) {
            self.pool.clone().pump_queues();
        }
    }

    /// Flow control: the client reads again; the worker continues the request.
    pub fn resume(&self) {
        self.link.resume(&self.internal_id);
    }
}

impl Drop for Dispatched {
    fn drop(&mut self) {
        // No-op when the worker already finished the request (its entry is gone).
        if self.link.cancel(&self.internal_id) {
            self.pool.clone().pump_queues();
        }
    }
}

/// An admitted request's place: already sent to a worker, or waiting in the queue. Dropping it
/// gives up the place.
pub struct Ticket {
    pool: Arc<dyn TicketPool>,
    /// The id of the request's model.
    model: Arc<str>,
    dispatched: Option<Dispatched>,
    queued: Option<(u64, oneshot::Receiver<Result<Dispatched, QueueFull>>)>,
    /// A new request admitted while no worker of its model was ready, because one was reconnecting
    /// (`reconnect_grace_ms`): it gives up at this instant unless a worker is ready by then.
    reconnect_by: Option<Instant>,
}

impl Ticket {
    pub(super) fn dispatched(
        pool: Arc<dyn TicketPool>,
        model: &Arc<str>,
        dispatched: Dispatched,
    ) -> Self {
        Self {
            pool,
            model: model.clone(),
            dispatched: Some(dispatched),
            queued: None,
            reconnect_by: None,
        }
    }

    pub(super) fn queued(
        pool: Arc<dyn TicketPool>,
        model: &Arc<str>,
        id: u64,
        rx: oneshot::Receiver<Result<Dispatched, QueueFull>>,
    ) -> Self {
        Self {
            pool,
            model: model.clone(),
            dispatched: None,
            queued: Some((id, rx)),
            reconnect_by: None,
        }
    }

    /// This queued ticket waits for a worker that is reconnecting: until a worker of its model is
    /// first ready, it gives up at `by` (the end of the reconnect grace) rather than after the
    /// failover timeout.
    pub(super) fn waiting_for_reconnect(mut self, by: Instant) -> Self {
        self.reconnect_by = Some(by);
        self
    }

    /// The id of the request's model.
    pub fn model(&self) -> &Arc<str> {
        &self.model
    }

    /// Waits until the request is sent to a worker.
    ///
    /// Errors: [`RouteError::NoWorkerInTime`] when no worker of its model was ready for the pool's
    /// failover timeout, or (a request admitted while a worker reconnected) none was back by the
    /// end of the reconnect grace; [`RouteError::Overloaded`] when a request of a higher class
    /// displaced it.
    pub async fn wait(&mut self) -> Result<Dispatched, RouteError> {
        if let Some(dispatched) = self.dispatched.take() {
            return Ok(dispatched);
        }
        let Some((_, rx)) = self.queued.as_mut() else {
            return Err(RouteError::Internal("the ticket was already used".into()));
        };
        let timeout = self.pool.failover_timeout();
        let mut readiness = self.pool.watch_readiness();
        let mut no_worker_since: Option<Instant> = None;
        let outcome = loop {
            readiness.borrow_and_update();
            let none_ready = self.pool.ready_workers_of(&self.model) == 0;
            let give_up_at = if none_ready {
                let since = *no_worker_since.get_or_insert_with(Instant::now);
                Some(match self.reconnect_by {
                    Some(by) => by.min(since + timeout),
                    None => since + timeout,
                })
            } else {
                // A worker is back: from here on the request waits as any queued one does.
                self.reconnect_by = None;
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
                changed = readiness.changed() => if changed.is_err() { break None },
                () = give_up => break None,
            }
        };
        if let Some(outcome) = outcome {
            self.queued = None;
            return outcome.map_err(RouteError::Overloaded);
        }
        self.leave_queue();
        Err(RouteError::NoWorkerInTime {
            ready: self.pool.ready_workers_of(&self.model),
            configured: self.pool.configured_workers(),
            waited_ms: no_worker_since.map_or(0, |since| since.elapsed().as_millis()),
        })
    }

    /// Gives up the place in the queue, if any.
    fn leave_queue(&mut self) {
        if let Some((id, rx)) = self.queued.take() {
            self.pool.leave_queue(&self.model, id);
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
