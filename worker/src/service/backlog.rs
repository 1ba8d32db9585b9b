//! The bound on what one router stream may leave unread ([`Backlog`]).
//!
//! The engine never waits for a router: it hands each step's message to the stream's channel and
//! goes on. A router that stops reading (a stopped or frozen process, a stuck event loop, a network
//! that holds the connection open but moves nothing) would let that channel grow for as long as it
//! stays away, with every step's load report and KV cache events. The backlog counts the encoded
//! bytes queued and not yet taken by the stream; past the worker's `router_backlog_kib` the engine
//! drops that connection (its sequences are cancelled, as when the router goes away), and the
//! stream ends with `RESOURCE_EXHAUSTED` as soon as it is read again. The router then fails its
//! requests over with the tokens it has, reconnects, and resyncs its index from the new stream's
//! snapshot. Other routers' streams are not touched.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use futures::{Stream, StreamExt as _};
use tonic::Status;

/// Unread bytes of one router stream against its limit (see the module).
#[derive(Debug)]
pub struct Backlog {
    /// Most unread bytes; 0 = no limit.
    limit_bytes: usize,
    /// Encoded bytes queued and not yet taken by the stream.
    unread: AtomicUsize,
    /// The limit was passed: the engine dropped the connection, the stream ends.
    overflowed: AtomicBool,
}

impl Backlog {
    /// A backlog of at most `limit_bytes` unread bytes (0 = no limit).
    pub fn new(limit_bytes: usize) -> Arc<Self> {
        Arc::new(Self {
            limit_bytes,
            unread: AtomicUsize::new(0),
            overflowed: AtomicBool::new(false),
        })
    }

    /// Queues a message of `bytes` from the engine; false (and overflowed from then on) when it
    /// would take the unread bytes past the limit. Only the engine thread reserves, so the check
    /// and the add need no compare-and-swap.
    pub fn reserve(&self, bytes: usize) -> bool {
        if self.overflowed() {
            return false;
        }
        let unread = self.unread.load(Ordering::Acquire);
        if self.limit_bytes > 0 && unread.saturating_add(bytes) > self.limit_bytes {
            self.overflowed.store(true, Ordering::Release);
            tracing::warn!(
                limit_kib = self.limit_bytes / 1024,
                "a router left more than router_backlog_kib of step messages unread (stopped or \
                 stuck): closing its stream and cancelling its requests"
            );
            return false;
        }
        self.unread.fetch_add(bytes, Ordering::AcqRel);
        true
    }

    /// Queues a message of `bytes` that must go out whatever the backlog (a refusal answering the
    /// router's own message).
    pub fn count(&self, bytes: usize) {
        self.unread.fetch_add(bytes, Ordering::AcqRel);
    }

    /// The stream took a message of `bytes`.
    pub fn read(&self, bytes: usize) {
        // Saturating: never below zero, whatever the order of a count and its read.
        let _ = self
            .unread
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                Some(u.saturating_sub(bytes))
            });
    }

    /// Whether the limit was passed.
    pub fn overflowed(&self) -> bool {
        self.overflowed.load(Ordering::Acquire)
    }

    /// Unread bytes now.
    pub fn unread(&self) -> usize {
        self.unread.load(Ordering::Acquire)
    }

    /// The status the stream ends with after an overflow.
    fn overflow_status(&self) -> Status {
        Status::resource_exhausted(format!(
            "this router left more than {} KiB of step messages unread (worker setting \
             router_backlog_kib): the worker closed its stream and cancelled its requests; \
             reconnect for a fresh snapshot",
            self.limit_bytes / 1024
        ))
    }
}

/// `messages` until `backlog` overflows, then one `RESOURCE_EXHAUSTED` and the end (what was still
/// queued is dropped with the stream: the router resyncs from a new snapshot).
pub fn ending_on_overflow<T: Send + 'static>(
    messages: impl Stream<Item = Result<T, Status>> + Send + 'static,
    backlog: Arc<Backlog>,
) -> impl Stream<Item = Result<T, Status>> + Send + 'static {
    let messages: Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>> = Box::pin(messages);
    futures::stream::unfold(
        (messages, backlog, false),
        |(mut messages, backlog, ended)| async move {
            if ended {
                return None;
            }
            if backlog.overflowed() {
                let status = backlog.overflow_status();
                return Some((Err(status), (messages, backlog, true)));
            }
            let message = messages.next().await?;
            Some((message, (messages, backlog, false)))
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_counts_unread_bytes_and_an_overflow_stays() {
        let b = Backlog::new(100);
        assert!(b.reserve(60));
        assert!(b.reserve(40));
        assert_eq!(b.unread(), 100);
        b.read(60);
        assert!(b.reserve(50), "read bytes make room again");
        assert!(!b.reserve(11), "past the limit");
        assert!(b.overflowed());
        b.read(90);
        assert!(
            !b.reserve(1),
            "an overflow is final: the engine dropped the connection"
        );
        // Refusals are counted, never refused; reads never go below zero.
        b.count(7);
        b.read(1_000);
        assert_eq!(b.unread(), 0);
        let unlimited = Backlog::new(0);
        assert!(unlimited.reserve(usize::MAX / 2));
        assert!(unlimited.reserve(usize::MAX / 2));
        assert!(!unlimited.overflowed());
    }

    #[tokio::test]
    async fn the_stream_ends_with_resource_exhausted_once_overflowed() {
        let b = Backlog::new(10);
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Result<u32, Status>>();
        let mut s = Box::pin(ending_on_overflow(
            tokio_stream::wrappers::UnboundedReceiverStream::new(rx),
            b.clone(),
        ));
        tx.send(Ok(1)).unwrap();
        assert_eq!(s.next().await.unwrap().unwrap(), 1);
        tx.send(Ok(2)).unwrap();
        assert!(!b.reserve(11));
        let end = s.next().await.unwrap().unwrap_err();
        assert_eq!(end.code(), tonic::Code::ResourceExhausted);
        assert!(end.message().contains("router_backlog_kib"), "{end:?}");
        assert!(s.next().await.is_none(), "nothing after the status");
    }
}
