//! Lone deep decode tokens: when a step has fewer (token, KV head) pairs than the pool has
//! threads and the context's K/V rows outgrow L2, one [`per_query`](super::per_query) task per
//! pair would stream the whole K/V through one core while the others wait (Gemma 3 270M has one
//! KV head: one stream at 4,096 positions used one of two cores). Here the pair's work is split
//! into three parallel regions instead, each reading a share of the K/V:
//!
//! 1. scores, by ranges of keys: `p[h][j] = dot(q_h, k_j) · scale` (then the soft-cap), for every
//!    query head `h` of the KV head;
//! 2. the softmax of each head's score row;
//! 3. `Σ p_j v_j` in increasing `j`, by ranges of the head dimension.
//!
//! Bitwise the per-query kernel's result: each score is the same [`dot_with`] (a score does not
//! depend on the others), each softmax row the same [`softmax_rows`] call, and each output element
//! the same products and sums in the same order ([`add_scaled_rows_with`] works element by
//! element, so a range of elements is computed exactly as inside the whole row).

use std::cell::RefCell;

use super::super::aligned::AlignedVec;
use super::super::kv_store::PagedLayer;
use super::super::matmul::{add_scaled_rows_with, add_scaled_with, dot_with};
use super::super::pool::{self, DisjointSlice};
use super::super::SimdPath;
use super::inputs::{softcap_in_place, At, QueryPos};
use super::keys::{key_offsets, NARROW_KEYS, WIDE_KEYS};
use super::softmax::softmax_rows;

/// Keys per score task (a multiple of every path's key group).
const KEYS_PER_TASK: usize = 512;

/// Head-dimension elements per value task (a multiple of 16, the widest lane count).
const DIMS_PER_TASK: usize = 64;

/// Buffers of the calling thread: scores `[heads, n_keys]` and the key offsets.
#[derive(Default)]
struct Scratch {
    scores: Vec<f32>,
    offsets: Vec<usize>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
    /// A widened f16 row per pool thread.
    static ROW: RefCell<AlignedVec> = const { RefCell::new(AlignedVec::new()) };
}

/// Attention of every query `t` with `skip[t] == false` into its row of `out` (`[n, n_heads *
/// head_dim]`, zero on entry), one (token, KV head) pair at a time, each in the three parallel
/// regions of the module docs. Bitwise [`super::per_query::attention_per_query`].
pub(super) fn attention_split(path: SimdPath, at: &At<'_>, out: &mut [f32], skip: &[bool]) {
    let s = at.s;
    let hd = s.head_dim;
    let q_dim = s.n_heads * hd;
    let kv_dim = s.n_kv_heads * hd;
    let group = s.n_heads / s.n_kv_heads;
    for (t, &QueryPos { pos, block_table }) in at.queries.iter().enumerate() {
        if skip[t] {
            continue;
        }
        let keys = at.opts.keys(pos);
        let n_keys = keys.len();
        for g in 0..s.n_kv_heads {
            SCRATCH.with_borrow_mut(|Scratch { scores, offsets }| {
                key_offsets(
                    block_table,
                    at.block_size,
                    kv_dim,
                    g * hd,
                    keys.clone(),
                    offsets,
                );
                scores.clear();
                scores.resize(group * n_keys, 0.0);
                let qs = &at.q[t * q_dim + g * group * hd..t * q_dim + (g + 1) * group * hd];
                let o = &mut out[t * q_dim + g * group * hd..t * q_dim + (g + 1) * group * hd];
                let pair = Pair {
                    path,
                    layer: at.layer,
                    offsets,
                    qs,
                    head_dim: hd,
                    heads: group,
                };
                pair.scores(scores, at.opts.scale, at.opts.softcap);
                softmax_rows(path, scores, n_keys, group, |_| 0..n_keys);
                pair.values(scores, o);
            });
        }
    }
}

/// The query heads of one token that share one KV head.
struct Pair<'a> {
    path: SimdPath,
    layer: &'a PagedLayer,
    /// Offset of the KV head's row for each key `j` of the query's range.
    offsets: &'a [usize],
    /// The query rows, `[heads, head_dim]`.
    qs: &'a [f32],
    head_dim: usize,
    heads: usize,
}

impl Pair<'_> {
    /// Region 1: `p[h][j] = dot(q_h, k_j) · scale`, soft-capped, for all heads, tasks over key
    /// ranges (`p` is `[heads, n_keys]`).
    fn scores(&self, p: &mut [f32], scale: f32, softcap: Option<f32>) {
        let n_keys = self.offsets.len();
        let hd = self.head_dim;
        let shared = DisjointSlice::new(p);
        pool::global().run(n_keys.div_ceil(KEYS_PER_TASK), &|i| {
            let range = i * KEYS_PER_TASK..((i + 1) * KEYS_PER_TASK).min(n_keys);
            ROW.with_borrow_mut(|row| {
                row.resize(hd, 0.0);
                for h in 0..self.heads {
                    let q = &self.qs[h * hd..(h + 1) * hd];
                    // SAFETY: task `i` alone writes keys `range` of each head's row.
                    let ph =
                        unsafe { shared.piece(h * n_keys + range.start..h * n_keys + range.end) };
                    for (pj, j) in ph.iter_mut().zip(range.clone()) {
                        let k = self.layer.key_row(self.offsets[j], row);
                        *pj = dot_with(self.path, q, k) * scale;
                    }
                    if let Some(cap) = softcap {
                        softcap_in_place(ph, cap);
                    }
                }
            });
        });
    }

    /// Region 3: `o[h] += Σ_j p[h][j] v_j` in increasing `j`, tasks over ranges of the head
    /// dimension (`o` is `[heads, head_dim]`).
    fn values(&self, p: &[f32], o: &mut [f32]) {
        let hd = self.head_dim;
        let shared = DisjointSlice::new(o);
        pool::global().run(hd.div_ceil(DIMS_PER_TASK), &|i| {
            let dims = i * DIMS_PER_TASK..((i + 1) * DIMS_PER_TASK).min(hd);
            ROW.with_borrow_mut(|row| {
                row.resize(WIDE_KEYS.max(NARROW_KEYS) * hd, 0.0);
                if self.path == SimdPath::Avx512 {
                    self.values_in::<WIDE_KEYS>(p, &shared, dims, row);
                } else {
                    self.values_in::<NARROW_KEYS>(p, &shared, dims, row);
                }
            });
        });
    }

    /// [`Self::values`] for elements `dims` of every head's output, `K` value rows per call.
    fn values_in<const K: usize>(
        &self,
        p: &[f32],
        o: &DisjointSlice<'_, f32>,
        dims: std::ops::Range<usize>,
        rows: &mut AlignedVec,
    ) {
        let n_keys = self.offsets.len();
        let hd = self.head_dim;
        // SAFETY (each `o.piece` below): this task alone writes elements `dims` of each head.
        let out = |h: usize| unsafe { o.piece(h * hd + dims.start..h * hd + dims.end) };
        let mut j = 0;
        while j + K <= n_keys {
            let mut bufs = rows.chunks_exact_mut(hd);
            let vs: [&[f32]; K] = std::array::from_fn(|i| {
                let v = self
                    .layer
                    .value_row(self.offsets[j + i], bufs.next().expect("K rows"));
                &v[dims.clone()]
            });
            for h in 0..self.heads {
                let pj = p[h * n_keys + j..h * n_keys + j + K]
                    .try_into()
                    .expect("K weights");
                add_scaled_rows_with::<K>(self.path, out(h), pj, vs);
            }
            j += K;
        }
        let buf = &mut rows[..hd];
        for jj in j..n_keys {
            let v = &self.layer.value_row(self.offsets[jj], buf)[dims.clone()];
            for h in 0..self.heads {
                add_scaled_with(self.path, out(h), p[h * n_keys + jj], v);
            }
        }
    }
}
