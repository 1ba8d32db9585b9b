//! The engine: owns the model, the KV cache and every live sequence on one dedicated thread, and runs
//! the continuously batched loop (schedule, execute one batched forward, update).
//!
//! RPC handlers talk to it only through [`EngineHandle`] (commands over a channel), so the hot path has
//! no locks and cancelling is just a message. It speaks its own language, not the wire's: it takes
//! [`EngineRequest`]s, sends [`EngineOutput`]s to each connection's [`OutputSink`], fails requests
//! with an [`EngineError`] of an [`EngineErrorKind`] and counts in [`EngineStats`]; the gRPC service
//! (the `worker` crate's `service`) converts at its edge. Health, `Info` and metrics read the state the engine
//! publishes after every step and command batch ([`EngineSnapshot`], see `monitor`), so they never
//! wait for a step.
//!
//! The crate also holds what the loop is made of: the paged KV block manager ([`kv`]), the sampler
//! ([`sampler`]) and the seam every backend implements ([`backend`]: `BatchModel` and its types).
//! It must not depend on `inference-proto`, `tonic` or a backend crate: the `worker` binary wires
//! a backend to the engine and speaks gRPC, so Cargo keeps the engine from reaching into either.

pub mod backend;
pub mod kv;
pub mod sampler;
pub mod speculation;

mod core;
mod error;
mod masks;
mod monitor;
mod output;
mod prefill_budget;
mod priority;
mod prompt_logprobs;
mod request;
mod scheduler;
mod sequence;
mod stats;
mod tenant_share;

use std::sync::atomic::{AtomicU64, Ordering};

use structured_output::ConstraintState;
use tokio::sync::{mpsc, oneshot, watch};

pub use self::core::{spawn_engine, spawn_engine_with_draft, EngineConfig};
pub use error::{EngineError, EngineErrorKind};
pub use masks::mask_seconds;
pub use monitor::EngineSnapshot;
pub use output::{
    CacheReport, EngineLoad, EngineOutput, GeneratedToken, OutputSink, PromptLogprobs,
    RequestFailure, DECODE_HORIZON_TOKENS,
};
pub use priority::Priority;
pub use request::{ConnId, EngineRequest};
pub use scheduler::{Chunk, Schedule, Scheduler, SchedulerConfig, SeqId};
pub use sequence::{Sequence, StopReason};
pub use stats::EngineStats;
pub use tenant_share::{DEFAULT_TENANT, MAX_IDLE_TENANTS};

/// Messages from RPC handlers to the engine thread.
pub enum Command {
    /// Admit a request; the connection's outputs go to `out` (from now on, for all its requests).
    /// `constraint` is its compiled structured-output constraint, already advanced by its
    /// `generated_ids` (compiled off the engine thread).
    Add {
        conn: ConnId,
        request: Box<EngineRequest>,
        constraint: Option<Box<ConstraintState>>,
        out: Box<dyn OutputSink>,
    },
    /// Register a connection's output before its first request: it gets the prefix cache's
    /// snapshot at once, then every step's cache changes and load (so a router knows the worker's
    /// cache and load before it sends anything).
    Connect {
        conn: ConnId,
        out: Box<dyn OutputSink>,
    },
    /// Drop one request (no further output is sent for it).
    Cancel { conn: ConnId, request_id: String },
    /// Take one request out of the batch until [`Command::Resume`]: its client stopped reading
    /// (flow control). It is preempted by recompute (its full blocks stay in the prefix cache) and
    /// generates nothing meanwhile; its output, once resumed, is exactly what it would have been.
    /// Ignored for an id the engine does not run or already holds.
    Hold { conn: ConnId, request_id: String },
    /// Queue a held request again (ignored when it is not held).
    Resume { conn: ConnId, request_id: String },
    /// Drop every request of a connection (the stream closed).
    CloseConnection { conn: ConnId },
    /// Report the engine's counters, in order with the other commands (answered between steps; use
    /// [`EngineHandle::snapshot`] where a step must not delay the answer).
    Stats(oneshot::Sender<EngineStats>),
    /// Report every block hash the prefix cache holds, ascending, and the block size (answered
    /// between steps, after the outputs of the steps before).
    CachedBlocks(oneshot::Sender<(Vec<u64>, usize)>),
}

/// Cloneable handle to the engine thread.
#[derive(Clone)]
pub struct EngineHandle {
    tx: mpsc::UnboundedSender<Command>,
    state: watch::Receiver<EngineSnapshot>,
}

static NEXT_CONN: AtomicU64 = AtomicU64::new(1);

impl EngineHandle {
    /// A fresh connection id.
    pub fn new_connection(&self) -> ConnId {
        NEXT_CONN.fetch_add(1, Ordering::Relaxed)
    }

    /// Sends a command; returns false when the engine thread is gone.
    pub fn send(&self, command: Command) -> bool {
        self.tx.send(command).is_ok()
    }

    /// Every block hash the prefix cache holds (ascending) and the block size, answered by the
    /// engine thread between steps; `None` when the engine thread is gone.
    pub async fn cached_blocks(&self) -> Option<(Vec<u64>, usize)> {
        let (tx, rx) = oneshot::channel();
        if !self.send(Command::CachedBlocks(tx)) {
            return None;
        }
        rx.await.ok()
    }

    /// The state the engine published last (after its last step or command batch); returns at once,
    /// also while a step runs. `alive` is false once the engine thread has ended.
    pub fn snapshot(&self) -> EngineSnapshot {
        self.state.borrow().clone()
    }

    /// The engine's counters, answered by the engine thread after the commands sent before this
    /// call (so it waits for a running step to finish); `None` when the engine thread is gone.
    pub async fn stats(&self) -> Option<EngineStats> {
        let (tx, rx) = oneshot::channel();
        if !self.send(Command::Stats(tx)) {
            return None;
        }
        rx.await.ok()
    }
}

#[cfg(test)]
mod tests;
