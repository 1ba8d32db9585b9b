//! The CPU backend: weights, paged KV cache and the f32 forward pass of every architecture
//! described by [`model_desc::ModelDesc`] (llama, qwen2, qwen3, gemma2, gemma3, phi3).
//!
//! A crate of its own so that Cargo enforces the seam: it depends on the engine (for the
//! `BatchModel` seam) and on `model-desc`, never on the CUDA backend, `inference-proto` or `tonic`.
//!
//! Entry point: [`CpuModel::load`], then [`CpuModel::forward_batch`] over a
//! [`PagedKvCache`] from [`CpuModel::new_kv`] (also available through
//! [`engine::backend::BatchModel`]).
//!
//! # Batch invariance
//!
//! An entry's logits and the K/V it writes are bitwise identical whether it
//! runs alone or beside other entries, however its prompt was chunked, and
//! whether its earlier positions were written by itself or by another
//! sequence with the same tokens (shared blocks). This holds because every
//! value of a token is produced by a fixed sequence of floating-point
//! operations that depends only on that token's own inputs:
//!
//! - Per-row operations (embedding lookup, RMSNorm, RoPE, SwiGLU, residual
//!   adds) touch one token's row at a time, with sequential reductions.
//! - Every linear layer is one [`matmul::matmul`] over all tokens of all entries;
//!   each output element is reduced in an order fixed by the shared dimension
//!   alone, independent of the number of rows, the register tile it falls in
//!   and the thread computing it (see [`matmul`]).
//! - RoPE angles are computed from the token's absolute position only.
//! - Attention for each (token, head) scores all the sequence's keys `0..=pos`
//!   (or, in a sliding-window layer, `pos + 1 - window..=pos`, a range fixed by the position)
//!   (each score one dot product), softmaxes the whole row at once and sums
//!   the values in increasing position order (no online softmax whose block
//!   boundaries would depend on chunking), reading them through the block
//!   table, so the physical block ids do not matter; whether a prefill chunk's
//!   queries are tiled together or run one by one changes no bit (see
//!   [`attention()`]).
//! - K/V of position `p` depend (by induction over layers and positions) only
//!   on tokens `0..=p`, so a block written by another sequence with the same
//!   prefix holds exactly the values this sequence would have written.
//!
//! The compute [`pool`] splits matmuls over weight-row blocks, attention over
//! (token, head) pairs or (query block, KV head) tiles and RMSNorm/SwiGLU
//! over rows or elements; no split changes any single value's reduction
//! order.
//! Results are reproducible per machine (the matmul uses 8-lane FMA with
//! AVX2+FMA, 16-lane FMA with AVX-512F, chosen once at run time), not across
//! machines.
//!
//! Weights are multiplied only in [`matmul::matmul`] (over the [`QMatrix`] parts
//! of one logical matrix, kept in the file's formats; see [`kernels`]), the one place
//! to change for other weight formats.

mod aligned;
mod attention;
mod batch_model;
mod execute;
mod forward;
pub mod kernels;
mod kv_store;
pub mod matmul;
pub mod ops;
pub mod pool;
#[cfg(test)]
mod tests;
mod vexp;
mod weights;
mod zeroed;

pub use aligned::AlignedVec;
pub use attention::{attention, attention_into, AttnOptions, HeadShape, QueryPos};
pub use forward::CpuModel;
pub use kernels::{QMatrix, SimdPath};
pub use kv_store::{KvDtype, PagedKvCache, PagedLayer};
pub use matmul::{IntPath, Numerics};
pub use weights::{load_weights, LayerWeights, ModelWeights};
