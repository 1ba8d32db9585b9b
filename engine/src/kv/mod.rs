//! The KV block manager; the K/V values live in each backend's `kv_store` (host or device memory).
//!
//! The paged KV cache's bookkeeping (the PagedAttention design, Kwon et al., SOSP 2023): a pool of
//! fixed-size blocks with a free list, reference counts and per-sequence block tables, plus prefix
//! caching of full blocks addressed by a hash chained over their tokens (the `block-hash` crate's
//! documented chain, which the router computes too), and the journal of what that cache stores
//! and evicts ([`CacheEvents`]), which the worker reports to its routers.
//!
//! This module only decides which physical block holds which positions; the K/V numbers themselves
//! live in the backend's storage (`BatchModel::Kv`). It is shared by every backend.

mod block_pool;
mod cache_events;

pub use block_hash::{block_hashes, chain_hash, salted_seed};
pub use block_pool::{BlockPool, BlockPoolStats, NoFreeBlocks, SequenceBlocks};
pub use cache_events::CacheEvents;
