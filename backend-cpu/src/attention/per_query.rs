//! The per-query kernel: one pool task per (token, head) or (token, KV head) pair, one full pass
//! over the keys `0..=pos` each. Runs the tokens that are not part of a run of consecutive
//! positions (decode tokens), and is the reference the tiled kernel is tested against bitwise.

use std::cell::RefCell;

use super::super::aligned::AlignedVec;
use super::super::kv_store::PagedLayer;
use super::super::matmul::{add_scaled_rows_with, add_scaled_with, dot_tile_with, dot_with};
use super::super::pool;
use super::super::SimdPath;
use super::inputs::{softcap_in_place, At, QueryPos};
use super::keys::{key_offsets, NARROW_KEYS, WIDE_KEYS};
use super::softmax::softmax_rows;

/// Per-thread buffers of one (token, head) task, reused across calls: no allocation per task.
#[derive(Default)]
struct Scratch {
    /// Attention scores, then probabilities, `[heads per task, pos + 1]` (grows to the longest context seen).
    scores: Vec<f32>,
    /// Widened K/V rows of an f16 cache, `[keys per call, head_dim]`.
    rows: AlignedVec,
    /// Offset in the layer of the head's K/V row for each position `0..=pos`.
    offsets: Vec<usize>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Attention of every query `t` with `skip[t] == false` into its row of `out`
/// (`[n, n_heads * head_dim]`, zero on entry; the other rows are left alone), on `path`. Shapes
/// and formulas as [`super::attention`]; `live` is the number of those queries, `kv_past_l2`
/// whether the deepest one's K/V rows outgrow L2 (see [`super::attention_untiled`]).
///
/// Each (token, head) output is computed by one pool task in one full pass over the query's keys
/// (`opts.keys(pos)`) in increasing order (a task takes one head, or all heads of a KV head when
/// there are enough tasks; the operations per head are the same either way).
pub(super) fn attention_per_query(
    path: SimdPath,
    at: &At<'_>,
    out: &mut [f32],
    skip: &[bool],
    live: usize,
    kv_past_l2: bool,
) {
    let At {
        q,
        queries,
        layer,
        block_size,
        s,
        opts,
    } = *at;
    let n = queries.len();
    let hd = s.head_dim;
    let q_dim = s.n_heads * hd;
    let kv_dim = s.n_kv_heads * hd;
    let group = s.n_heads / s.n_kv_heads;
    debug_assert_eq!(q.len(), n * q_dim);
    debug_assert_eq!(out.len(), n * q_dim);
    let wide = path == SimdPath::Avx512;
    let pool = pool::global();
    // Query heads per task: all the heads that share a KV head, so each K/V row
    // is loaded once and used from L1 by all of them, when that still leaves
    // two tasks per thread, or when a context's K/V rows outgrow L2 (then each
    // pass over them is a trip to memory, and one pass for all the heads beats
    // spreading the heads over threads); else one head per task (a single
    // decode token at a short context).
    let per_task = if live * s.n_kv_heads >= 2 * pool.threads() || kv_past_l2 {
        group
    } else {
        1
    };
    let tasks_per_token = s.n_heads / per_task;
    pool.for_each_chunk_mut(out, per_task * hd, |idx, o| {
        let (t, h0) = (idx / tasks_per_token, (idx % tasks_per_token) * per_task);
        if skip[t] {
            return;
        }
        let QueryPos { pos, block_table } = queries[t];
        let kv_off = (h0 / group) * hd;
        let qs = &q[t * q_dim + h0 * hd..t * q_dim + (h0 + per_task) * hd];
        let keys = opts.keys(pos);
        let n_keys = keys.len();
        SCRATCH.with_borrow_mut(
            |Scratch {
                 scores: p,
                 rows,
                 offsets,
             }| {
                p.clear();
                p.resize(per_task * n_keys, 0.0);
                key_offsets(block_table, block_size, kv_dim, kv_off, keys, offsets);
                let task = HeadsTask {
                    path,
                    layer,
                    offsets,
                    qs,
                    head_dim: hd,
                    scale: opts.scale,
                    softcap: opts.softcap,
                };
                if wide {
                    task.run::<WIDE_KEYS>(p, rows, o);
                } else {
                    task.run::<NARROW_KEYS>(p, rows, o);
                }
            },
        );
    });
}

/// [`PagedLayer::key_row`] or [`PagedLayer::value_row`].
type RowReader = for<'a> fn(&'a PagedLayer, usize, &'a mut [f32]) -> &'a [f32];

/// Query heads of one token that share a KV head, for [`attention_per_query`]:
/// their query rows and where their keys and values are.
struct HeadsTask<'a> {
    path: SimdPath,
    layer: &'a PagedLayer,
    /// Offset of the KV head's row for each position `j` in `layer`.
    offsets: &'a [usize],
    /// The queries, `[heads, head_dim]`.
    qs: &'a [f32],
    head_dim: usize,
    /// Score scale.
    scale: f32,
    /// Score soft-cap.
    softcap: Option<f32>,
}

impl HeadsTask<'_> {
    /// Key or value rows of positions `j..j + K` (`read`: [`PagedLayer::key_row`] or
    /// [`PagedLayer::value_row`]); `rows` holds them widened for an f16 cache.
    fn rows_at<'s, const K: usize>(
        &'s self,
        read: RowReader,
        j: usize,
        rows: &'s mut AlignedVec,
    ) -> [&'s [f32]; K] {
        let mut bufs = rows.chunks_exact_mut(self.head_dim);
        std::array::from_fn(|i| {
            read(
                self.layer,
                self.offsets[j + i],
                bufs.next().expect("K row buffers"),
            )
        })
    }

    /// For each head `h`: scores all `n_keys` keys (the query's key range) into `p[h]` (`p` is
    /// `[heads, n_keys]`), softmaxes them in place and adds `Σ p_j v_j` to
    /// `o[h]` (`o` is `[heads, head_dim]`), `K` keys or values per kernel call,
    /// each row loaded once for all heads. Every value is bitwise the same for
    /// any `K` and any number of heads per task (each score is [`dot_with`];
    /// each value row is one [`add_scaled_with`] per head, in increasing `j`). `rows` is
    /// scratch for widened f16 rows.
    fn run<const K: usize>(&self, p: &mut [f32], rows: &mut AlignedVec, o: &mut [f32]) {
        let hd = self.head_dim;
        let n_keys = self.offsets.len();
        let row = |j: usize| self.offsets[j];
        let q = |h: usize| &self.qs[h * hd..(h + 1) * hd];
        // Row buffers for an f16 cache (an f32 cache lends its rows directly).
        rows.resize(K * hd, 0.0);
        let mut j = 0;
        while j + K <= n_keys {
            let ks = self.rows_at::<K>(PagedLayer::key_row, j, rows);
            for (h, ph) in p.chunks_exact_mut(n_keys).enumerate() {
                for (i, d) in dot_tile_with::<1, K>(self.path, [q(h)], ks)[0]
                    .into_iter()
                    .enumerate()
                {
                    ph[j + i] = d * self.scale;
                }
            }
            j += K;
        }
        let buf = &mut rows[..hd];
        for jj in j..n_keys {
            let k = self.layer.key_row(row(jj), buf);
            for (h, ph) in p.chunks_exact_mut(n_keys).enumerate() {
                ph[jj] = dot_with(self.path, q(h), k) * self.scale;
            }
        }
        if let Some(cap) = self.softcap {
            softcap_in_place(p, cap);
        }
        // Each row: `softmax_in_place` (bitwise).
        softmax_rows(self.path, p, n_keys, p.len() / n_keys, |_| 0..n_keys);
        // Σ p_j v_j in increasing j.
        let mut j = 0;
        while j + K <= n_keys {
            let vs = self.rows_at::<K>(PagedLayer::value_row, j, rows);
            for (ph, oh) in p.chunks_exact(n_keys).zip(o.chunks_exact_mut(hd)) {
                let pj = ph[j..j + K].try_into().expect("K weights");
                add_scaled_rows_with::<K>(self.path, oh, pj, vs);
            }
            j += K;
        }
        let buf = &mut rows[..hd];
        for jj in j..n_keys {
            let v = self.layer.value_row(row(jj), buf);
            for (ph, oh) in p.chunks_exact(n_keys).zip(o.chunks_exact_mut(hd)) {
                add_scaled_with(self.path, oh, ph[jj], v);
            }
        }
    }
}
