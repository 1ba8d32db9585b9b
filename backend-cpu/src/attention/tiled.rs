//! The tiled kernel: blocks of consecutive queries of one sequence against blocks of keys (see
//! the module docs of [`super`] for why its arithmetic is bitwise the per-query kernel's).

use std::cell::RefCell;

use super::super::aligned::AlignedVec;
use super::super::kv_store::PagedLayer;
use super::super::matmul::{add_scaled_rows_with, add_scaled_with, dot_block_scaled_with};
use super::super::pool;
use super::super::SimdPath;
use super::inputs::{softcap_in_place, At, AttnOptions, HeadShape, QueryPos};
use super::keys::{key_offsets, NARROW_KEYS, WIDE_KEYS};
#[cfg(target_arch = "x86_64")]
use super::simd;
use super::softmax::softmax_rows;

/// Keys per key block: the block's K (or V) rows, 16 KiB in f32 at head_dim 64, stay in L1
/// while every query row of the task uses them. A multiple of [`WIDE_KEYS`] and
/// [`NARROW_KEYS`], so value calls never straddle a block.
pub(super) const KEY_BLOCK: usize = 64;
const _: () = assert!(KEY_BLOCK.is_multiple_of(WIDE_KEYS) && KEY_BLOCK.is_multiple_of(NARROW_KEYS));

/// Most queries per block (96 query rows at 3 heads per KV head: their query rows, 24 KiB at
/// head_dim 64, and a key block fit L1 together).
const MAX_QUERY_BLOCK: usize = 32;

/// Bytes of score rows a task may hold between the score pass, the softmax and the value pass.
/// Larger than L2 on purpose: at long contexts a bigger query block (more reuse of each K/V row)
/// beats keeping the score rows L2-resident. Measured on the 2-core test VM (2 MiB L2 per core),
/// 512-token prefill after 7,680 positions: 1 MiB (query blocks of ~10) 163-169 tok/s, 3 MiB
/// 180, 6 MiB (blocks of 32) 189; 512 KiB 135. Per thread, grown only as a task needs it.
const SCORE_BYTES: usize = 6 << 20;

/// One task: queries `first..first + n` (consecutive positions of one sequence) and KV head
/// `kv_head` (all its query heads).
#[derive(Debug, Clone, Copy)]
pub(super) struct Task {
    first: usize,
    n: usize,
    kv_head: usize,
}

/// The tiled tasks of a call, most expensive first (the pool hands tasks out in order, so the
/// long ones start early and the short ones fill the gaps).
pub(super) struct Plan {
    pub(super) tasks: Vec<Task>,
    /// Queries per task's output chunk (the largest block).
    block: usize,
}

/// Queries per block for a run whose last query sees `n_keys` keys: as many as keep the
/// `block * group` score rows within [`SCORE_BYTES`] (at least 1, at most
/// [`MAX_QUERY_BLOCK`]), fewer when that leaves fewer than two tasks per thread.
pub(super) fn query_block(
    run: usize,
    n_keys: usize,
    group: usize,
    n_kv_heads: usize,
    threads: usize,
) -> usize {
    let by_cache = (SCORE_BYTES / (group * n_keys * 4)).clamp(1, MAX_QUERY_BLOCK);
    let blocks_wanted = (2 * threads).div_ceil(n_kv_heads);
    by_cache.min(run.div_ceil(blocks_wanted)).max(1)
}

/// Finds the runs of at least `min_run` queries of one sequence (the same block table) at
/// consecutive positions, marks their queries in `tiled`, and cuts them into tasks.
pub(super) fn plan(
    queries: &[QueryPos<'_>],
    s: HeadShape,
    opts: AttnOptions,
    min_run: usize,
    threads: usize,
    tiled: &mut [bool],
) -> Plan {
    let group = s.n_heads / s.n_kv_heads;
    let mut tasks = Vec::new();
    let mut block = 0;
    let mut i = 0;
    while i < queries.len() {
        let mut j = i + 1;
        while j < queries.len()
            && std::ptr::eq(queries[j].block_table, queries[i].block_table)
            && queries[j].pos == queries[j - 1].pos + 1
        {
            j += 1;
        }
        if j - i >= min_run {
            tiled[i..j].fill(true);
            // A task's score rows span the first query's keys to the last query's.
            let last = queries[j - 1].pos;
            let widest = match opts.window {
                Some(w) => (last + 1).min(w + MAX_QUERY_BLOCK),
                None => last + 1,
            };
            let b = query_block(j - i, widest, group, s.n_kv_heads, threads);
            block = block.max(b);
            for first in (i..j).step_by(b) {
                for kv_head in 0..s.n_kv_heads {
                    tasks.push(Task {
                        first,
                        n: b.min(j - first),
                        kv_head,
                    });
                }
            }
        }
        i = j;
    }
    // Cost ~ keys × queries; the last query's keys stand for the task's.
    tasks.sort_by_key(|t| std::cmp::Reverse(opts.keys(queries[t.first + t.n - 1].pos).len() * t.n));
    Plan { tasks, block }
}

/// Per-thread buffers of a task, reused across calls.
#[derive(Default)]
struct Scratch {
    /// Scores, then probabilities, `[query rows, n_keys]`.
    scores: Vec<f32>,
    /// A key block's K or V rows widened from an f16 cache, `[KEY_BLOCK, head_dim]`.
    rows: AlignedVec,
    /// Offset of the KV head's row of each position `0..n_keys` in the layer.
    offsets: Vec<usize>,
    /// The task's query rows, `[rows, head_dim]` (row `i * group + h`: query `first + i`, head
    /// `h` of the KV head).
    qs: AlignedVec,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Runs `plan`'s tasks on the pool into `buf` (scratch, `[tasks, block, group, head_dim]`), then
/// copies each into its queries' rows of `out` (`[n, n_heads * head_dim]`).
pub(super) fn run(path: SimdPath, plan: &Plan, at: &At<'_>, buf: &mut AlignedVec, out: &mut [f32]) {
    let s = at.s;
    let hd = s.head_dim;
    let group = s.n_heads / s.n_kv_heads;
    let chunk = plan.block * group * hd;
    buf.clear();
    buf.resize(plan.tasks.len() * chunk, 0.0);
    pool::global().for_each_chunk_mut(buf, chunk, |i, o| {
        let task = plan.tasks[i];
        SCRATCH.with_borrow_mut(|scratch| {
            let t = TaskRun { path, at, task };
            t.run(scratch, &mut o[..task.n * group * hd]);
        });
    });
    let q_dim = s.n_heads * hd;
    let width = group * hd;
    for (task, o) in plan.tasks.iter().zip(buf.chunks_exact(chunk)) {
        for (i, row) in o[..task.n * width].chunks_exact(width).enumerate() {
            let at = (task.first + i) * q_dim + task.kv_head * width;
            out[at..at + width].copy_from_slice(row);
        }
    }
}

/// One task with everything it reads.
struct TaskRun<'a> {
    path: SimdPath,
    at: &'a At<'a>,
    task: Task,
}

impl TaskRun<'_> {
    /// Query row `r` of the task (`r = i * group + h`: query `first + i`, head `h` of the KV
    /// head), `[head_dim]`.
    fn q_row(&self, r: usize) -> &[f32] {
        let s = self.at.s;
        let hd = s.head_dim;
        let group = s.n_heads / s.n_kv_heads;
        let (i, h) = (r / group, r % group);
        let at = (self.task.first + i) * s.n_heads * hd + (self.task.kv_head * group + h) * hd;
        &self.at.q[at..at + hd]
    }

    /// Writes the task's output into `o` (`[n, group, head_dim]`, the order of its query rows).
    fn run(&self, scratch: &mut Scratch, o: &mut [f32]) {
        let Scratch {
            scores,
            rows,
            offsets,
            qs,
        } = scratch;
        let At {
            queries,
            layer,
            block_size,
            s,
            opts,
            ..
        } = *self.at;
        let hd = s.head_dim;
        let group = s.n_heads / s.n_kv_heads;
        let first_pos = queries[self.task.first].pos;
        let n_rows = self.task.n * group;
        // The task's keys: from the first query's first key to the last query's position. Score
        // columns are relative to `k0`; a row's scores outside its own key range are computed
        // with the block but never read.
        let k0 = opts.keys(first_pos).start;
        let k_end = first_pos + self.task.n;
        let n_keys = k_end - k0;
        let kv_dim = s.n_kv_heads * hd;
        key_offsets(
            queries[self.task.first].block_table,
            block_size,
            kv_dim,
            self.task.kv_head * hd,
            k0..k_end,
            offsets,
        );
        rows.resize(KEY_BLOCK * hd, 0.0);
        scores.clear();
        scores.resize(n_rows * n_keys, 0.0);
        // Keys of row r (query `first + r / group`), relative to `k0`; both ends grow with r.
        let row_keys = |r: usize| {
            let k = opts.keys(first_pos + r / group);
            k.start - k0..k.end - k0
        };
        // Key blocks at absolute multiples of KEY_BLOCK, clipped to the task's keys (relative).
        let key_blocks = || {
            (k0 / KEY_BLOCK * KEY_BLOCK..k_end)
                .step_by(KEY_BLOCK)
                .map(move |kb| kb.max(k0) - k0..(kb + KEY_BLOCK).min(k_end) - k0)
        };

        qs.clear();
        for r in 0..n_rows {
            qs.extend_from_slice(self.q_row(r));
        }
        // Scores, key block by key block.
        for b in key_blocks() {
            let ks = block_rows(layer, PagedLayer::key_row, &offsets[b.clone()], rows, hd);
            dot_block_scaled_with(
                self.path,
                qs,
                hd,
                &ks[..b.len()],
                opts.scale,
                &mut scores[b.start..],
                n_keys,
            );
        }
        if let Some(cap) = opts.softcap {
            for r in 0..n_rows {
                let k = row_keys(r);
                softcap_in_place(&mut scores[r * n_keys + k.start..r * n_keys + k.end], cap);
            }
        }
        // Each row over its own keys: `softmax_in_place` (bitwise).
        softmax_rows(self.path, scores, n_keys, n_rows, row_keys);
        // Σ p_j v_j, key block by key block, each row in increasing j.
        o.fill(0.0);
        for b in key_blocks() {
            let kn = b.len();
            let vs = block_rows(layer, PagedLayer::value_row, &offsets[b.clone()], rows, hd);
            // Rows whose keys cover the whole block (a contiguous band: both ends of a row's
            // keys grow with the row) go through the register-blocked kernel on AVX-512, the
            // others key by key over their part of the block.
            let full_from = (0..n_rows)
                .find(|&r| row_keys(r).end >= b.end)
                .unwrap_or(n_rows);
            let full_to = (full_from..n_rows)
                .find(|&r| row_keys(r).start > b.start)
                .unwrap_or(n_rows);
            #[allow(unused_mut)]
            let mut full = full_from..full_from;
            #[cfg(target_arch = "x86_64")]
            if self.path == SimdPath::Avx512 && hd.is_multiple_of(16) {
                let vs = &vs[..kn];
                let p = |r: usize| &scores[r * n_keys + b.start..r * n_keys + b.end];
                // SAFETY: the AVX-512 path was detected with AVX-512F; `values_from` gets
                // the kernel's shapes.
                unsafe { values_from(&mut o[..full_to * hd], full_from, &p, vs, hd) };
                full = full_from..full_to;
            }
            for (r, (p, or)) in scores
                .chunks_exact(n_keys)
                .zip(o.chunks_exact_mut(hd))
                .enumerate()
                .take(n_rows)
            {
                if full.contains(&r) {
                    continue;
                }
                let k = row_keys(r);
                let (lo, hi) = (k.start.max(b.start), k.end.min(b.end));
                if hi <= lo {
                    continue;
                }
                let vs = &vs[lo - b.start..hi - b.start];
                match self.path {
                    SimdPath::Avx512 => add_values::<WIDE_KEYS>(self.path, or, &p[lo..hi], vs),
                    _ => add_values::<NARROW_KEYS>(self.path, or, &p[lo..hi], vs),
                }
            }
        }
    }
}

/// The register-blocked value kernel for rows `r0..` of `o` (`[rows, hd]`), in bands of 8
/// rows, then one band of 4, 2 and 1 for the rest (a task's 3 × block rows rarely divide by 8).
///
/// # Safety
/// The CPU must support AVX-512F; `hd` a multiple of 16, each `p(r)` as long as `vs`.
#[cfg(target_arch = "x86_64")]
unsafe fn values_from<'p>(
    o: &mut [f32],
    r0: usize,
    p: &impl Fn(usize) -> &'p [f32],
    vs: &[&[f32]],
    hd: usize,
) {
    let mut r = r0;
    band::<8>(o, &mut r, p, vs, hd);
    band::<4>(o, &mut r, p, vs, hd);
    band::<2>(o, &mut r, p, vs, hd);
    band::<1>(o, &mut r, p, vs, hd);
}

/// [`values_from`]'s bands of `ROWS` rows from row `*r` while they fit; advances `*r`.
///
/// # Safety
/// As [`values_from`].
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn band<'p, const ROWS: usize>(
    o: &mut [f32],
    r: &mut usize,
    p: &impl Fn(usize) -> &'p [f32],
    vs: &[&[f32]],
    hd: usize,
) {
    let n_rows = o.len() / hd;
    while *r + ROWS <= n_rows {
        let at = *r;
        let ps = std::array::from_fn(|i| p(at + i));
        simd::add_values_rows::<ROWS>(&mut o[at * hd..(at + ROWS) * hd], ps, vs, hd);
        *r += ROWS;
    }
}

/// `o += Σ p[j] vs[j]` in increasing `j`, `K` rows per call while `K` remain, then one by one:
/// the calls of the per-query kernel for these keys, since the block starts at a multiple of `K`
/// and ends at a block end (a multiple of `K`) or at the row's last key.
fn add_values<const K: usize>(path: SimdPath, o: &mut [f32], p: &[f32], vs: &[&[f32]]) {
    let mut j = 0;
    while j + K <= p.len() {
        let pj: &[f32; K] = p[j..j + K].try_into().expect("K weights");
        let rows: [&[f32]; K] = vs[j..j + K].try_into().expect("K rows");
        add_scaled_rows_with::<K>(path, o, pj, rows);
        j += K;
    }
    for (&pj, v) in p[j..].iter().zip(&vs[j..]) {
        add_scaled_with(path, o, pj, v);
    }
}

/// [`PagedLayer::key_row`] or [`PagedLayer::value_row`].
type RowReader = for<'a> fn(&'a PagedLayer, usize, &'a mut [f32]) -> &'a [f32];

/// The rows at `offsets` (at most [`KEY_BLOCK`]) as slices: borrowed from an f32 cache, widened
/// into `rows` (`[KEY_BLOCK, head_dim]`) from an f16 one. Entries past `offsets.len()` are
/// empty (unused).
fn block_rows<'a>(
    layer: &'a PagedLayer,
    read: RowReader,
    offsets: &[usize],
    rows: &'a mut AlignedVec,
    hd: usize,
) -> [&'a [f32]; KEY_BLOCK] {
    let mut bufs = rows.chunks_exact_mut(hd);
    let mut out: [&[f32]; KEY_BLOCK] = [&[]; KEY_BLOCK];
    for (slot, &off) in out.iter_mut().zip(offsets) {
        *slot = read(layer, off, bufs.next().expect("KEY_BLOCK row buffers"));
    }
    out
}
