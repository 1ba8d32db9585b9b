//! Causal grouped-query attention over the paged KV cache (Ainslie et al. 2023, "GQA"; scaled
//! dot-product attention from Vaswani et al. 2017; paged K/V layout from Kwon et al. 2023,
//! "PagedAttention").
//!
//! # Two kernels, one arithmetic
//!
//! - [`tiled`]: a run of consecutive positions of one sequence in a step (a prefill chunk) is cut
//!   into blocks of queries; a task takes one query block and one KV head (all its query heads)
//!   and walks the keys in blocks of [`tiled::KEY_BLOCK`], so each K or V row is loaded (and an
//!   f16 row widened) once per query block and used from L1 by all its query rows, instead of
//!   once per query. The scores of a block against a key block are register tiles of dot
//!   products ([`super::matmul::dot_tile_with`]), as in a GEMM. This is the query/key tiling of
//!   FlashAttention-2 (Dao 2023, "FlashAttention-2: Faster Attention with Better Parallelism and
//!   Work Partitioning").
//! - [`per_query`]: one task per (token, head) or (token, KV head), a full pass over the keys per
//!   query: the tokens that are not in such a run (decode tokens), where there is nothing to
//!   share a key row with, and the reference the tiled kernel is tested against. When such
//!   tokens are too few to fill the threads and their context outgrows L2, [`split`] spreads each
//!   one's scores, softmax and values over the threads instead, with the per-query arithmetic.
//!
//! Which kernel runs which queries is decided here ([`attention_into_with`],
//! [`attention_untiled`]); the kernels share their inputs ([`inputs`]) and key layout ([`keys`]).
//!
//! Both compute every query's output with the same floating-point operations in the same order,
//! so they are bitwise equal (tested on every SIMD path, f32 and f16 caches): each score is one
//! [`super::matmul::dot_with`] of the query and key rows (same lane accumulators and reduction
//! tree, whatever tile it is computed in) times `1 / sqrt(head_dim)`; the softmax is
//! [`softmax_in_place`](super::ops::softmax_in_place) over the query's whole score row
//! `0..=pos` (computed bitwise by [`softmax::softmax_rows`], with glibc's `expf` vectorised),
//! materialised (at most the context length in floats per query head); the output is
//! `Σ p_j v_j` accumulated into a zeroed row in increasing `j`, a product then a sum per element
//! (never fused), so the grouping of keys into kernel calls cannot change a bit: the per-query
//! kernel and the tiled kernel's edge rows use [`add_scaled_rows`](super::matmul::add_scaled_rows)
//! over groups of [`WIDE_KEYS`](keys::WIDE_KEYS) / [`NARROW_KEYS`](keys::NARROW_KEYS) keys
//! aligned to the absolute key index, the tiled kernel's other rows a register-blocked kernel over
//! a whole key block (`simd`).
//!
//! Why not FlashAttention's online softmax: it rescales the running output and sum at every key
//! block boundary, which rounds differently from the one-shot softmax of the reference (the
//! reference prompts would no longer be token-exact against the numpy float32 reference), and
//! it would make a query's rounding depend on where its key blocks start. The exact two-pass form
//! (scores, softmax, values) keeps every query's arithmetic a function of its own position and
//! inputs only; the price is the materialised score rows, kept L2-sized by choosing the query
//! block size from the context length ([`tiled::query_block`]).
//!
//! # Options: scale, soft-cap, sliding window
//!
//! [`AttnOptions`] set the score scale (`1 / sqrt(head_dim)` unless the architecture says
//! otherwise), an optional soft-cap of each scaled score `s -> c * tanh(s / c)` (Gemma 2; applied
//! to each score alone, so both kernels apply it identically) and an optional sliding window: a
//! query at `pos` then sees only keys `pos + 1 - window ..= pos` ([`AttnOptions::keys`]). The
//! window's first key is a function of the query's position alone; the per-query kernel scores,
//! softmaxes and sums exactly that range in increasing order, and the tiled kernel, whose key
//! blocks stay at absolute multiples of [`tiled::KEY_BLOCK`], gives each row the same range (a
//! row's softmax and value sums start at its own first key), so the two stay bitwise equal and
//! batch invariant with a window too.
//!
//! # Batch invariance
//!
//! A query's output depends only on its query row, its position and the K/V values of
//! its key range: never on the other queries, their number, how the prompt was chunked,
//! which kernel ran it, which queries shared its tile, or how the work was split between threads.

mod inputs;
mod keys;
mod per_query;
#[cfg(target_arch = "x86_64")]
mod simd;
mod softmax;
mod split;
mod tiled;

#[cfg(test)]
mod tests;

use std::cell::RefCell;

use super::aligned::AlignedVec;
use super::kv_store::PagedLayer;
use super::pool;
use super::SimdPath;
use inputs::At;
pub use inputs::{AttnOptions, HeadShape, QueryPos};

/// Shortest run of consecutive positions of one sequence that goes to the tiled kernel (a
/// single query has no one to share its key rows with; the per-query kernel can also split its
/// heads over threads).
const MIN_RUN: usize = 2;

/// K and V bytes of one token's context (all KV heads, f32) past which the untiled queries go to
/// the split kernel when they are too few to fill the threads, and else the per-query kernel's
/// tasks take all the query heads of a KV head even for a lone decode token: 2 MiB, a core's L2
/// on the test machine, reached at 1,366 positions for SmolLM2 (`kv_dim` 192). Measured, 2
/// threads, one stream at 8,064 positions: 9 one-head tasks each stream their KV head's 4 MiB
/// (3 × the traffic).
const SHARED_KV_BYTES: usize = 2 << 20;

thread_local! {
    /// The tiled tasks' outputs before they are copied into place (reused across calls).
    static TILED_OUT: RefCell<AlignedVec> = const { RefCell::new(AlignedVec::new()) };
}

/// Attention for `queries.len()` tokens (of any number of sequences) whose keys/values, and those
/// of all earlier positions of their sequences, are already in `layer`.
///
/// `q` is `[n, n_heads * head_dim]` (RoPE applied), row `t` belonging to `queries[t]`. Query `t`
/// attends to its sequence's positions `opts.keys(pos)` (`0..=pos` without a window), read
/// through its block table from `layer` (`[num_slots, n_kv_heads * head_dim]`, slots of
/// `block_size` tokens per block). Scores are `q·k * opts.scale` (with
/// [`dot`](super::matmul::dot)), soft-capped if `opts.softcap`, softmax in f32 over all of the
/// query's scores at once, output `Σ p_j v_j` accumulated in increasing `j`. Returns
/// `[n, n_heads * head_dim]`.
///
/// Consecutive queries of one sequence at consecutive positions (a prefill chunk, as the model
/// lists them) are computed by the tiled kernel, the others one by one; the result is bitwise
/// the same either way and independent of the batch (see the module docs).
pub fn attention(
    q: &[f32],
    queries: &[QueryPos<'_>],
    layer: &PagedLayer,
    block_size: usize,
    s: HeadShape,
    opts: AttnOptions,
) -> Vec<f32> {
    let mut out = AlignedVec::new();
    attention_into(q, queries, layer, block_size, s, opts, &mut out);
    out.to_vec()
}

/// [`attention`] into `out` (resized to `[n, n_heads * head_dim]`; its allocation is reused).
pub fn attention_into(
    q: &[f32],
    queries: &[QueryPos<'_>],
    layer: &PagedLayer,
    block_size: usize,
    s: HeadShape,
    opts: AttnOptions,
    out: &mut AlignedVec,
) {
    attention_into_with(
        SimdPath::detect(),
        q,
        queries,
        layer,
        block_size,
        s,
        opts,
        out,
    )
}

/// [`attention_into`] on a given SIMD path (tests force each one).
#[allow(clippy::too_many_arguments)]
fn attention_into_with(
    path: SimdPath,
    q: &[f32],
    queries: &[QueryPos<'_>],
    layer: &PagedLayer,
    block_size: usize,
    s: HeadShape,
    opts: AttnOptions,
    out: &mut AlignedVec,
) {
    let n = queries.len();
    let q_dim = s.n_heads * s.head_dim;
    debug_assert_eq!(q.len(), n * q_dim);
    out.clear();
    out.resize(n * q_dim, 0.0);
    let mut tiled_rows = vec![false; n];
    let plan = tiled::plan(
        queries,
        s,
        opts,
        MIN_RUN,
        pool::global().threads(),
        &mut tiled_rows,
    );
    let at = At {
        q,
        queries,
        layer,
        block_size,
        s,
        opts,
    };
    if !plan.tasks.is_empty() {
        TILED_OUT.with_borrow_mut(|buf| tiled::run(path, &plan, &at, buf, out));
    }
    attention_untiled(path, &at, out, &tiled_rows);
}

/// Attention of every query `t` with `skip[t] == false` into its row of `out` (`[n, n_heads *
/// head_dim]`, zero on entry; the other rows are left alone), on `path`: by the [`split`] kernel
/// when there are fewer (token, KV head) pairs than pool threads and the deepest query's K/V rows
/// outgrow [`SHARED_KV_BYTES`], else by the [`per_query`] kernel (told whether they outgrow it).
fn attention_untiled(path: SimdPath, at: &At<'_>, out: &mut [f32], skip: &[bool]) {
    let live = skip.iter().filter(|&&x| !x).count();
    if live == 0 {
        return;
    }
    let s = at.s;
    let deepest = at
        .queries
        .iter()
        .zip(skip)
        .filter(|(_, &skip)| !skip)
        .map(|(q, _)| at.opts.keys(q.pos).len())
        .max()
        .unwrap_or(0);
    let kv_past_l2 = deepest * s.n_kv_heads * s.head_dim * 4 * 2 > SHARED_KV_BYTES;
    let threads = pool::global().threads();
    if threads > 1 && live * s.n_kv_heads < threads && kv_past_l2 {
        split::attention_split(path, at, out, skip)
    } else {
        per_query::attention_per_query(path, at, out, skip, live, kv_past_l2)
    }
}

/// The untiled reference on a given path: every query by [`attention_untiled`] (the per-query
/// kernel, or the split kernel for lone deep tokens), none tiled.
#[cfg(test)]
fn attention_per_query_with(
    path: SimdPath,
    q: &[f32],
    queries: &[QueryPos<'_>],
    layer: &PagedLayer,
    block_size: usize,
    s: HeadShape,
    opts: AttnOptions,
) -> Vec<f32> {
    let mut out = vec![0.0; queries.len() * s.n_heads * s.head_dim];
    let skip = vec![false; queries.len()];
    let at = At {
        q,
        queries,
        layer,
        block_size,
        s,
        opts,
    };
    attention_untiled(path, &at, &mut out, &skip);
    out
}
