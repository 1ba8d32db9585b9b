//! The router's bounded admission queue.
//!
//! # What waits, and the limits
//!
//! A request is **in flight** on a worker from the moment the router sends it there until its last
//! token, its error, its cancellation or the loss of the worker. Each worker takes at most
//! `max_inflight_per_worker` requests from this router at once (the worker queues and batches those
//! itself and reports them as running/waiting sequences).
//!
//! A request is **waiting** when it was accepted (valid, tokenized) but no ready worker has room for
//! it yet. Waiting requests form one FIFO queue in the router, bounded by
//! - `max_waiting_requests`: requests in the queue, and
//! - `max_waiting_tokens`: the sum over the queue of each request's prompt tokens plus the tokens it
//!   already generated (failover), i.e. the prefill work the queue holds.
//!
//! A new request that would take the queue past either limit is refused at once with
//! [`QueueFull`] (`RESOURCE_EXHAUSTED` / HTTP 429) naming the limit. A request goes straight to a
//! worker, without queueing or counting against the limits, when the queue is empty and a worker
//! has room.
//!
//! Requests resuming after a worker failure (failover) were already admitted: they go ahead of new
//! requests (after earlier failovers) and are never refused for the limits, though they count
//! against them while they wait, so they make new requests wait or be refused sooner. Memory is
//! bounded either way: failovers are at most the requests that were in flight.

use std::collections::VecDeque;

/// The queue limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdmissionLimits {
    /// Most requests waiting.
    pub max_waiting_requests: usize,
    /// Most tokens (prompt plus already generated) over all waiting requests.
    pub max_waiting_tokens: u64,
}

/// Why a new request was refused: it would take the queue past a limit (answered with
/// `RESOURCE_EXHAUSTED` / HTTP 429; the message names the limit and its value).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueueFull {
    /// `max_waiting_requests` requests already wait.
    #[error(
        "the router is at capacity: {waiting} requests are already waiting for a worker \
         (max_waiting_requests = {max}); retry later"
    )]
    Requests {
        /// Requests waiting.
        waiting: usize,
        /// The `max_waiting_requests` limit.
        max: usize,
    },
    /// The request's tokens would take the waiting tokens past `max_waiting_tokens`.
    #[error(
        "the router is at capacity: {waiting} tokens are waiting for a worker and this request \
         adds {adding} (max_waiting_tokens = {max}); retry later"
    )]
    Tokens {
        /// Tokens waiting.
        waiting: u64,
        /// The request's tokens (prompt plus already generated).
        adding: u64,
        /// The `max_waiting_tokens` limit.
        max: u64,
    },
}

/// One waiting request.
#[derive(Debug)]
pub struct Entry<T> {
    /// The queue's id for it.
    pub id: u64,
    /// Its prompt plus already generated tokens.
    pub tokens: u64,
    /// Whether it resumes a request that was already running (failover).
    pub resumed: bool,
    /// What the owner keeps with it.
    pub item: T,
}

/// A bounded FIFO of waiting requests; resumed requests go before new ones.
#[derive(Debug)]
pub struct AdmissionQueue<T> {
    limits: AdmissionLimits,
    entries: VecDeque<Entry<T>>,
    tokens: u64,
    next_id: u64,
}

impl<T> AdmissionQueue<T> {
    /// An empty queue with `limits`.
    pub fn new(limits: AdmissionLimits) -> Self {
        Self {
            limits,
            entries: VecDeque::new(),
            tokens: 0,
            next_id: 1,
        }
    }

    /// The limits.
    pub fn limits(&self) -> AdmissionLimits {
        self.limits
    }

    /// Requests waiting.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Tokens held by the waiting requests.
    pub fn tokens(&self) -> u64 {
        self.tokens
    }

    /// Appends a new request; returns its id.
    ///
    /// Errors: [`QueueFull`] when it would take the queue past a limit.
    pub fn push_new(&mut self, tokens: u64, item: T) -> Result<u64, QueueFull> {
        let l = self.limits;
        if self.entries.len() >= l.max_waiting_requests {
            return Err(QueueFull::Requests {
                waiting: self.entries.len(),
                max: l.max_waiting_requests,
            });
        }
        if self.tokens + tokens > l.max_waiting_tokens {
            return Err(QueueFull::Tokens {
                waiting: self.tokens,
                adding: tokens,
                max: l.max_waiting_tokens,
            });
        }
        Ok(self.insert(self.entries.len(), tokens, false, item))
    }

    /// Queues a resumed request after earlier resumed ones and before every new one, whatever the
    /// limits; returns its id.
    pub fn push_resumed(&mut self, tokens: u64, item: T) -> u64 {
        let at = self
            .entries
            .iter()
            .position(|e| !e.resumed)
            .unwrap_or(self.entries.len());
        self.insert(at, tokens, true, item)
    }

    fn insert(&mut self, at: usize, tokens: u64, resumed: bool, item: T) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.tokens += tokens;
        self.entries.insert(
            at,
            Entry {
                id,
                tokens,
                resumed,
                item,
            },
        );
        id
    }

    /// The request to serve next.
    pub fn front(&self) -> Option<&Entry<T>> {
        self.entries.front()
    }

    /// Removes and returns the request to serve next.
    pub fn pop_front(&mut self) -> Option<Entry<T>> {
        let entry = self.entries.pop_front()?;
        self.tokens -= entry.tokens;
        Some(entry)
    }

    /// Removes request `id` (it gave up waiting); `None` when it is no longer queued.
    pub fn remove(&mut self, id: u64) -> Option<Entry<T>> {
        let at = self.entries.iter().position(|e| e.id == id)?;
        let entry = self.entries.remove(at)?;
        self.tokens -= entry.tokens;
        Some(entry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue() -> AdmissionQueue<&'static str> {
        AdmissionQueue::new(AdmissionLimits {
            max_waiting_requests: 3,
            max_waiting_tokens: 100,
        })
    }

    #[test]
    fn request_limit_refuses_with_the_number() {
        let mut q = queue();
        for name in ["a", "b", "c"] {
            q.push_new(10, name).unwrap();
        }
        let err = q.push_new(1, "d").unwrap_err();
        assert_eq!(err, QueueFull::Requests { waiting: 3, max: 3 });
        assert_eq!((q.len(), q.tokens()), (3, 30));
    }

    #[test]
    fn token_limit_refuses_with_the_number() {
        let mut q = queue();
        q.push_new(60, "a").unwrap();
        let err = q.push_new(41, "b").unwrap_err();
        assert_eq!(
            err,
            QueueFull::Tokens {
                waiting: 60,
                adding: 41,
                max: 100
            }
        );
        q.push_new(40, "c").unwrap();
        assert_eq!(q.tokens(), 100);
    }

    #[test]
    fn fifo_with_resumed_first_and_removal() {
        let mut q = queue();
        q.push_new(1, "n1").unwrap();
        let n2 = q.push_new(2, "n2").unwrap();
        q.push_resumed(50, "r1");
        q.push_resumed(60, "r2");
        // Resumed requests ignore the limits but count against them.
        assert_eq!((q.len(), q.tokens()), (4, 113));
        assert!(q.push_new(1, "n3").is_err());
        assert_eq!(q.remove(n2).unwrap().item, "n2");
        assert!(q.remove(n2).is_none());
        let order: Vec<_> = std::iter::from_fn(|| q.pop_front().map(|e| e.item)).collect();
        assert_eq!(order, ["r1", "r2", "n1"]);
        assert_eq!((q.len(), q.tokens()), (0, 0));
        assert!(q.is_empty());
    }
}
