//! The tiled kernel: blocks of consecutive queries of one sequence against blocks of keys (see
//! the module docs of [`super`] for why its arithmetic is bitwise the per-query kernel's).

use std::cell::RefCell;

use super::super::aligned::AlignedVec;
use super::super::kv_cache::PagedLayer;
use super::super::matmul::{add_scaled_rows_with, add_scaled_with, dot_block_scaled_with};
use super::super::pool;
use super::super::SimdPath;
#[cfg(target_arch = "x86_64")]
use super::simd;
use super::softmax::softmax_rows;
use super::{key_offsets, HeadShape, QueryPos, MIN_RUN, NARROW_KEYS, WIDE_KEYS};

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

/// Finds the runs of at least [`MIN_RUN`] queries of one sequence (the same block table) at
/// consecutive positions, marks their queries in `tiled`, and cuts them into tasks.
pub(super) fn plan(
    queries: &[QueryPos<'_>],
    s: HeadShape,
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
        if j - i >= MIN_RUN {
            tiled[i..j].fill(true);
            let b = query_block(j - i, queries[j - 1].pos + 1, group, s.n_kv_heads, threads);
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
    // Cost ~ keys × queries; the last position of a task stands for its keys.
    tasks.sort_by_key(|t| std::cmp::Reverse((queries[t.first + t.n - 1].pos + 1) * t.n));
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
#[allow(clippy::too_many_arguments)]
pub(super) fn run(
    path: SimdPath,
    plan: &Plan,
    q: &[f32],
    queries: &[QueryPos<'_>],
    layer: &PagedLayer,
    block_size: usize,
    s: HeadShape,
    buf: &mut AlignedVec,
    out: &mut [f32],
) {
    let hd = s.head_dim;
    let group = s.n_heads / s.n_kv_heads;
    let chunk = plan.block * group * hd;
    buf.clear();
    buf.resize(plan.tasks.len() * chunk, 0.0);
    pool::global().for_each_chunk_mut(buf, chunk, |i, o| {
        let task = plan.tasks[i];
        SCRATCH.with_borrow_mut(|scratch| {
            let t = TaskRun {
                path,
                q,
                queries,
                layer,
                block_size,
                s,
                task,
            };
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
    q: &'a [f32],
    queries: &'a [QueryPos<'a>],
    layer: &'a PagedLayer,
    block_size: usize,
    s: HeadShape,
    task: Task,
}

impl TaskRun<'_> {
    /// Query row `r` of the task (`r = i * group + h`: query `first + i`, head `h` of the KV
    /// head), `[head_dim]`.
    fn q_row(&self, r: usize) -> &[f32] {
        let hd = self.s.head_dim;
        let group = self.s.n_heads / self.s.n_kv_heads;
        let (i, h) = (r / group, r % group);
        let at = (self.task.first + i) * self.s.n_heads * hd + (self.task.kv_head * group + h) * hd;
        &self.q[at..at + hd]
    }

    /// Writes the task's output into `o` (`[n, group, head_dim]`, the order of its query rows).
    fn run(&self, scratch: &mut Scratch, o: &mut [f32]) {
        let Scratch {
            scores,
            rows,
            offsets,
            qs,
        } = scratch;
        let s = self.s;
        let hd = s.head_dim;
        let group = s.n_heads / s.n_kv_heads;
        let first_pos = self.queries[self.task.first].pos;
        let n_rows = self.task.n * group;
        // Keys of the last query; earlier queries use a prefix of them (the scores past a
        // query's position are computed with the block but never read).
        let n_keys = first_pos + self.task.n;
        let kv_dim = s.n_kv_heads * hd;
        key_offsets(
            self.queries[self.task.first].block_table,
            self.block_size,
            kv_dim,
            self.task.kv_head * hd,
            n_keys,
            offsets,
        );
        rows.resize(KEY_BLOCK * hd, 0.0);
        scores.clear();
        scores.resize(n_rows * n_keys, 0.0);
        // Keys of row r: 0..=pos of its query.
        let row_keys = |r: usize| first_pos + r / group + 1;

        qs.clear();
        for r in 0..n_rows {
            qs.extend_from_slice(self.q_row(r));
        }
        // Scores, key block by key block.
        let scale = 1.0 / (hd as f32).sqrt();
        for kb in (0..n_keys).step_by(KEY_BLOCK) {
            let kn = KEY_BLOCK.min(n_keys - kb);
            let ks = block_rows(
                self.layer,
                PagedLayer::key_row,
                &offsets[kb..kb + kn],
                rows,
                hd,
            );
            dot_block_scaled_with(
                self.path,
                qs,
                hd,
                &ks[..kn],
                scale,
                &mut scores[kb..],
                n_keys,
            );
        }
        // Each row over its own keys: `softmax_in_place` (bitwise).
        softmax_rows(self.path, scores, n_keys, n_rows, row_keys);
        // Σ p_j v_j, key block by key block, each row in increasing j.
        o.fill(0.0);
        for kb in (0..n_keys).step_by(KEY_BLOCK) {
            let kn = KEY_BLOCK.min(n_keys - kb);
            let vs = block_rows(
                self.layer,
                PagedLayer::value_row,
                &offsets[kb..kb + kn],
                rows,
                hd,
            );
            // Rows whose keys cover the whole block (a suffix: positions grow with the row)
            // go through the register-blocked kernel on AVX-512, the others key by key.
            let mut full = (0..n_rows)
                .find(|&r| row_keys(r) >= kb + kn)
                .unwrap_or(n_rows);
            #[cfg(target_arch = "x86_64")]
            if self.path == SimdPath::Avx512 && hd.is_multiple_of(16) {
                let vs = &vs[..kn];
                let p = |r: usize| &scores[r * n_keys + kb..r * n_keys + kb + kn];
                // SAFETY: the AVX-512 path was detected with AVX-512F; `values_from` gets
                // the kernel's shapes.
                unsafe { values_from(&mut o[..n_rows * hd], full, &p, vs, hd) };
            } else {
                full = n_rows;
            }
            #[cfg(not(target_arch = "x86_64"))]
            {
                full = n_rows;
            }
            for (r, (p, or)) in scores
                .chunks_exact(n_keys)
                .zip(o.chunks_exact_mut(hd))
                .enumerate()
                .take(full)
            {
                let end = row_keys(r).min(kb + kn);
                if end <= kb {
                    continue;
                }
                match self.path {
                    SimdPath::Avx512 => {
                        add_values::<WIDE_KEYS>(self.path, or, &p[kb..end], &vs[..end - kb])
                    }
                    _ => add_values::<NARROW_KEYS>(self.path, or, &p[kb..end], &vs[..end - kb]),
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
