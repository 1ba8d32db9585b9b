//! How the router picks a worker for a request, as plain code (no I/O, no async runtime, no locks
//! held across calls), so that the router and the fleet simulator run the same policy.
//!
//! - [`affinity`]: rendezvous hashing of the prompt's first tokens with a load bound (`routing =
//!   affinity`, the default).
//! - [`round_robin`]: each request to the next worker with room (`routing = round_robin`, the
//!   baseline of the comparisons).
//! - [`kv_aware`]: the cost of each worker from its real KV cache (tokens to prefill) and its real
//!   load in tokens (`routing = kv_aware`).
//! - [`index`]: one worker's KV block index, fed by the worker's cache events.
//! - [`Routing`]: the `routing` setting.
//!
//! The block hash chain is the `block-hash` crate's (re-exported here): the worker's prefix cache
//! and the router's index compute the same hashes from the same tokens.

pub mod affinity;
pub mod index;
pub mod kv_aware;
pub mod round_robin;

pub use block_hash::{block_hashes, block_hashes_from, chain_hash, salted_seed};

use serde::{Deserialize, Serialize};

/// The `routing` setting: which policy picks the worker of each request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Routing {
    /// Prefix affinity on the first `affinity_prefix_tokens` tokens with a load bound
    /// ([`affinity`]).
    #[default]
    Affinity,
    /// The next worker with room, in turn ([`round_robin`]).
    RoundRobin,
    /// Lowest cost from the workers' reported KV caches and loads ([`kv_aware`]).
    KvAware,
}

impl std::fmt::Display for Routing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Routing::Affinity => "affinity",
            Routing::RoundRobin => "round_robin",
            Routing::KvAware => "kv_aware",
        })
    }
}
