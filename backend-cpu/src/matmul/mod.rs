//! Batched matrix multiply `y[n, out] = x[n, in] · W[out, in]ᵀ` of f32
//! activations by weights in their file format ([`QMatrix`]: Q8_0, Q4_0,
//! Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, F16, BF16, F32), and the f32 dot product used by attention.
//!
//! Determinism: every output element is computed by the same sequence of
//! floating-point operations regardless of `n`, the tile it falls in, or the
//! thread that computes it: `L` independent lane accumulators over `k = 0, L,
//! 2L, ...` (lane `l` sums elements `k + l` in increasing `k`), a fixed
//! pairwise lane reduction, then a sequential scalar tail for `in % L`
//! elements. `L` is 8 on the portable path (separate multiply and add) and
//! the AVX2 path (fused multiply-add), and 16 on the AVX-512 path (FMA). The
//! path is selected once at run time ([`SimdPath::detect`]), so results are
//! bit-identical for a token alone or in a batch, and reproducible per
//! machine, not across machines.
//!
//! Weights, steps of up to `FUSED_MAX_TOKENS` (8) tokens (decode): the fused
//! kernels decode each weight block in registers and use it for up to 4
//! tokens at once (AVX-512, every block format: [`fused`]). Larger steps: a task decodes
//! up to [`BLOCK_BYTES`] of whole groups of `G` weight rows at a time (`G` = 4 on AVX-512 for
//! steps of more than 8 tokens, else [`TILE_R`]) into a per-thread f32
//! scratch block (L2 resident, reused across calls: no allocation in the hot
//! path) with the format's SIMD decoder, while the next block is prefetched from memory
//! ([`Prefetch`]); F32 weights are used in place. Every
//! decoder gives exactly the reference's dequantized values (see
//! [`super::kernels`]), so the products are those of the float32 reference;
//! only the summation order differs from it.
//!
//! Blocking: tasks of the [`pool`] own at least [`ROWS_PER_TASK`] weight rows (one scratch
//! block for prefill-sized steps, a few tasks per thread of several blocks for decode steps:
//! see `rows_per_task`) and write their
//! columns of `y` in place; inside a task, register tiles walk the shared
//! dimension, the token tile staying in L1 while the decoded block streams
//! past it: on AVX-512, 4 tokens × 4 rows (16 accumulators, one transposed
//! reduction) for steps of more than 8 tokens, and 8 × 3 for steps of up to 8
//! tokens whose format has no fused kernel; 4 × 3 on the other paths. Activations and the scratch block start on
//! 64-byte boundaries ([`AlignedVec`]), so the 16-float loads are aligned.

use std::cell::RefCell;

use super::aligned::AlignedVec;
use super::kernels::QMatrix;
pub use super::kernels::SimdPath;
use super::pool;

/// Weight rows per pool task.
pub const ROWS_PER_TASK: usize = 48;
/// Tokens per register tile.
const TILE_T: usize = 4;
/// Weight rows per register tile (and per decoded scratch tile).
pub const TILE_R: usize = 3;

mod dot;
#[cfg(target_arch = "x86_64")]
mod fused;
pub mod int8;
mod out_cols;
mod prefetch;
mod simd;
#[cfg(test)]
mod tests;

pub use dot::{
    add_scaled, add_scaled_rows, add_scaled_rows_with, add_scaled_with, dot, dot_block_scaled_with,
    dot_rows, dot_tile_with, dot_with,
};
pub use int8::{IntPath, Numerics};
use out_cols::OutCols;
use prefetch::Prefetch;
use simd::tile_portable;
#[cfg(target_arch = "x86_64")]
use simd::{avx2, avx512};

/// Whether [`fused_rows`] has a kernel for `path` and `format` (AVX-512 with any block format).
fn has_fused(path: SimdPath, format: gguf::GgmlType) -> bool {
    #[cfg(target_arch = "x86_64")]
    if path == SimdPath::Avx512 {
        return fused::supports(format);
    }
    let _ = (path, format);
    false
}

/// `T` tokens against `R` encoded rows with a fused kernel, if there is one
/// for this path and format ([`has_fused`]); `None` otherwise.
#[inline(always)]
fn fused_rows<const T: usize, const R: usize>(
    path: SimdPath,
    format: gguf::GgmlType,
    x: [&[f32]; T],
    rows: [&[u8]; R],
    k: usize,
) -> Option<[[f32; R]; T]> {
    #[cfg(target_arch = "x86_64")]
    if has_fused(path, format) {
        // SAFETY: `Avx512` comes only from `SimdPath::available`, which
        // detected AVX-512F, AVX2, FMA and F16C; `QMatrix` validated the row
        // lengths (whole blocks) and each `x[t]` holds `k` floats.
        return Some(unsafe { fused::rows::<T, R>(format, x, rows, k) });
    }
    let _ = (path, format, x, rows, k);
    None
}

#[inline(always)]
fn tile<const T: usize, const R: usize>(
    path: SimdPath,
    x: &[&[f32]; T],
    w: &[&[f32]; R],
    k: usize,
    out: &mut [[f32; R]; T],
) {
    #[cfg(target_arch = "x86_64")]
    match path {
        // SAFETY: non-portable paths come only from `SimdPath::available`,
        // which detected the features; callers pass rows of length `k`.
        SimdPath::Avx512 => return unsafe { avx512::tile::<T, R>(x, w, k, out) },
        SimdPath::Avx2 => return unsafe { avx2::tile::<T, R>(x, w, k, out) },
        SimdPath::Portable => {}
    }
    let _ = path;
    tile_portable::<T, R>(x, w, k, out)
}

/// Computes the `groups * R` weight rows of `w_rows` (each `k` long, decoded
/// f32) against all `n` tokens of `x`, writing `y[t][r]` through `out`
/// (column `r` of the block); `fetch` is spread over the block's register tiles.
///
/// Loop order: token tiles outermost, then the row groups of the block, so a
/// tile of `T` token rows stays in L1 while the block's decoded rows (up to
/// [`BLOCK_BYTES`], in L2) stream past it; `T` is 8 for 3-row
/// groups on AVX-512 (24 accumulators of 32 registers), else 4 (4 × 4 = 16 of
/// 32 on AVX-512, 4 × 3 = 12 of 16 elsewhere). Tried: 6 × 4 tiles (24
/// accumulators) are about 10 % faster on one thread (`matmul_report`) but
/// were 3-8 % slower in Gemma 3's prefill and 32-stream decode on 2 threads
/// (alternating A/B runs of `throughput_report`); 12 × 2 was slower still.
fn rows_block<const R: usize>(
    path: SimdPath,
    x: &[f32],
    n: usize,
    k: usize,
    w_rows: &[f32],
    out: &mut OutCols<'_>,
    fetch: &mut Prefetch,
) {
    let groups = w_rows.len() / (R * k);
    let wide = if path == SimdPath::Avx512 && R == TILE_R {
        8
    } else {
        TILE_T
    };
    // Token tiles of `wide`, then of `TILE_T`, then single tokens (`wide` is a multiple of
    // `TILE_T`), each swept over every group.
    let tiles = n / wide + n % wide / TILE_T + n % TILE_T;
    fetch.spread_over(tiles * groups);
    let mut t = 0;
    if wide == 8 {
        t = token_tiles::<8, R>(path, x, n, k, t, w_rows, groups, out, fetch);
    }
    t = token_tiles::<TILE_T, R>(path, x, n, k, t, w_rows, groups, out, fetch);
    token_tiles::<1, R>(path, x, n, k, t, w_rows, groups, out, fetch);
}

/// The [`rows_block`] sweep with tiles of `T` tokens, from token `t0` while a
/// whole tile fits; returns the first token not done.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn token_tiles<const T: usize, const R: usize>(
    path: SimdPath,
    x: &[f32],
    n: usize,
    k: usize,
    t0: usize,
    w_rows: &[f32],
    groups: usize,
    out: &mut OutCols<'_>,
    fetch: &mut Prefetch,
) -> usize {
    let mut t = t0;
    while t + T <= n {
        let xs: [&[f32]; T] = std::array::from_fn(|i| &x[(t + i) * k..(t + i + 1) * k]);
        for g in 0..groups {
            fetch.step();
            let wg = &w_rows[g * R * k..(g + 1) * R * k];
            let w: [&[f32]; R] = std::array::from_fn(|r| &wg[r * k..(r + 1) * k]);
            let mut o = [[0.0; R]; T];
            tile::<T, R>(path, &xs, &w, k, &mut o);
            out.put(t, g * R, &o);
        }
        t += T;
    }
    t
}

/// Bytes of decoded f32 weight rows a task holds at once (its scratch block, L2 resident beside
/// the token tile in L1): each token tile is loaded once per block, so larger blocks stream the
/// activations from L3 fewer times. See [`block_groups`].
const BLOCK_BYTES: usize = 512 * 1024;

/// Row groups of `g` rows of `k` floats decoded together into a scratch block of at most
/// [`BLOCK_BYTES`] (at least one group): e.g. 48 groups of 4 rows (192 rows) for `k` = 640, 16
/// for `k` = 2048.
fn block_groups(g: usize, k: usize) -> usize {
    (BLOCK_BYTES / (4 * k * g)).max(1)
}

thread_local! {
    /// Per-thread decoded weight block, `block_groups(G, in) * G * in` floats (about
    /// [`BLOCK_BYTES`]); grows to the largest block seen.
    static SCRATCH: RefCell<AlignedVec> = const { RefCell::new(AlignedVec::new()) };
}

/// Computes rows `r0..r0 + out.len() / n` of `w` against all `n` tokens of
/// `x`, writing `y[t][r]` through `out` (column `r`, relative to `r0`).
///
/// `next`: the first row of the task this thread probably computes next (`threads` tasks on, in
/// the same matrix), whose first block is prefetched while this task's last block is computed.
fn rows_task(
    path: SimdPath,
    x: &[f32],
    n: usize,
    w: &QMatrix,
    r0: usize,
    next: Option<usize>,
    mut out: OutCols<'_>,
) {
    // AVX-512 with the scratch path: 4-row groups under 4 × 4 register tiles,
    // whose 16 accumulators take one `reduce16`. Measured on the 2-core test
    // machine, one thread, the whole matmul (Q4_1 [576, 1536] decoded to the
    // scratch block, then the tiles, both with `reduce16`) at 512 tokens:
    // 86 GFLOP/s with 8 × 3 tiles, 103 with 4 × 4.
    if path == SimdPath::Avx512 && n > FUSED_MAX_TOKENS {
        rows_task_g::<4>(path, x, n, w, r0, next, &mut out)
    } else {
        rows_task_g::<TILE_R>(path, x, n, w, r0, next, &mut out)
    }
}

/// Most tokens of a step that take the fused decode-in-registers kernels, in
/// tiles of up to [`FUSED_TILE_T`] tokens (more reuse each decoded weight
/// block from the scratch path instead). Measured on the 2-core test machine,
/// Q4_1 `[3072, 576]`, one thread, GFLOP/s per CPU-second, scratch path ->
/// fused: 4 tokens 41 -> 64-76, 6 tokens 40 -> 64, 8 tokens 64 -> 68.
const FUSED_MAX_TOKENS: usize = 8;

/// Tokens per fused kernel call.
const FUSED_TILE_T: usize = 4;

/// [`rows_task_g`] for the first `T` tokens of `x` (`[_, k]`) with the fused kernels:
/// rows in groups of `G`, the last `rows % G` one at a time.
fn fused_task<const T: usize, const G: usize>(
    path: SimdPath,
    x: &[f32],
    w: &QMatrix,
    r0: usize,
    out: &mut OutCols<'_>,
) {
    let k = w.cols();
    let rows = out.cols;
    let xs: [&[f32]; T] = std::array::from_fn(|t| &x[t * k..(t + 1) * k]);
    let mut r = 0;
    while r < rows {
        if r + G <= rows {
            let enc = std::array::from_fn(|i| w.row_encoded(r0 + r + i));
            let y = fused_rows::<T, G>(path, w.format(), xs, enc, k).expect("checked");
            out.put(0, r, &y);
            r += G;
        } else {
            let enc = [w.row_encoded(r0 + r)];
            let y = fused_rows::<T, 1>(path, w.format(), xs, enc, k).expect("checked");
            out.put(0, r, &y);
            r += 1;
        }
    }
}

/// [`rows_task`] with weight-row groups (decoded tile and register tile) of `G` rows.
fn rows_task_g<const G: usize>(
    path: SimdPath,
    x: &[f32],
    n: usize,
    w: &QMatrix,
    r0: usize,
    next: Option<usize>,
    out: &mut OutCols<'_>,
) {
    let k = w.cols();
    let rows = out.cols;
    if n <= FUSED_MAX_TOKENS && has_fused(path, w.format()) {
        // Few tokens: decode in registers (bitwise the same as the tile path).
        for t0 in (0..n).step_by(FUSED_TILE_T) {
            let (xt, mut o) = (&x[t0 * k..], out.rows_from(t0));
            match (n - t0).min(FUSED_TILE_T) {
                1 => fused_task::<1, G>(path, xt, w, r0, &mut o),
                2 => fused_task::<2, G>(path, xt, w, r0, &mut o),
                3 => fused_task::<3, G>(path, xt, w, r0, &mut o),
                _ => fused_task::<4, G>(path, xt, w, r0, &mut o),
            }
        }
        return;
    }
    // A block of whole groups from row `r` of the task, or else the last rows one at a time.
    let block_at = |r: usize| {
        let groups = ((rows - r) / G).min(block_groups(G, k));
        (groups, if groups > 0 { groups * G } else { 1 })
    };
    let mut run = |scratch: &mut AlignedVec| {
        let mut r = 0;
        while r < rows {
            let (groups, count) = block_at(r);
            let wr: &[f32] = match w.f32_rows(r0 + r, count) {
                Some(v) => v,
                None => {
                    let s = &mut scratch[..count * k];
                    w.dequantize_rows_with(path, r0 + r, s);
                    s
                }
            };
            // The next block (this task's, or else the next task's first) is fetched into L2
            // while this one is computed.
            let ahead = match r + count {
                r1 if r1 < rows => w.rows_encoded(r0 + r1, block_at(r1).1),
                _ => next.map_or(&[][..], |r| w.rows_encoded(r, count.min(w.rows() - r))),
            };
            let mut fetch = Prefetch::new(ahead);
            let mut o = out.columns(r, count);
            if groups > 0 {
                rows_block::<G>(path, x, n, k, wr, &mut o, &mut fetch);
            } else {
                rows_block::<1>(path, x, n, k, wr, &mut o, &mut fetch);
            }
            r += count;
        }
    };
    SCRATCH.with_borrow_mut(|s| {
        let len = block_groups(G, k) * G * k;
        if s.len() < len {
            s.resize(len, 0.0);
        }
        run(s)
    });
}

/// `y[n, out] = x[n, in] · W[out, in]ᵀ` where `W` is the row-wise
/// concatenation of `parts` (rows of `parts[0]`, then `parts[1]`, ...; each
/// `[out_i, in]`, `out = Σ out_i`), on the detected path. `x` is row-major
/// (`n * in` floats); returns `y` row-major (`n * out` floats).
///
/// Parallel over blocks of output rows ([`pool::global`]). Bit-identical per element for
/// any `n` (see the module docs).
///
/// Panics if `x.len() != n * in_dim` or a part does not have `in_dim` columns.
pub fn matmul(x: &[f32], n: usize, in_dim: usize, parts: &[QMatrix]) -> Vec<f32> {
    matmul_with(SimdPath::detect(), x, n, in_dim, parts)
}

/// [`matmul`] into `y` (resized to `n * out`, every element overwritten; its
/// allocation is reused, so a step's buffers are not allocated again).
pub fn matmul_into(x: &[f32], n: usize, in_dim: usize, parts: &[QMatrix], y: &mut Vec<f32>) {
    matmul_into_with(SimdPath::detect(), x, n, in_dim, parts, y)
}

/// [`matmul_into`] in numeric mode `numerics`: [`Numerics::Fast`] multiplies block-quantized
/// weights with 8-bit activations on [`IntPath::detect`]'s path ([`int8`]); F16/BF16/F32 weights
/// and [`Numerics::Exact`] take the f32 path.
pub fn matmul_into_numerics(
    numerics: Numerics,
    x: &[f32],
    n: usize,
    in_dim: usize,
    parts: &[QMatrix],
    y: &mut Vec<f32>,
) {
    if numerics == Numerics::Fast
        && int8::matmul_into_with(IntPath::detect(), x, n, in_dim, parts, y)
    {
        return;
    }
    matmul_into(x, n, in_dim, parts, y)
}

/// [`matmul`] on a given path.
pub fn matmul_with(
    path: SimdPath,
    x: &[f32],
    n: usize,
    in_dim: usize,
    parts: &[QMatrix],
) -> Vec<f32> {
    let mut y = Vec::new();
    matmul_into_with(path, x, n, in_dim, parts, &mut y);
    y
}

/// [`matmul_into`] on a given path.
pub fn matmul_into_with(
    path: SimdPath,
    x: &[f32],
    n: usize,
    in_dim: usize,
    parts: &[QMatrix],
    y: &mut Vec<f32>,
) {
    assert_eq!(x.len(), n * in_dim, "matmul: x has wrong length");
    assert!(
        parts.iter().all(|p| p.cols() == in_dim),
        "matmul: weight width differs from in_dim"
    );
    let out_dim: usize = parts.iter().map(QMatrix::rows).sum();
    // Every element is written below, so only new elements are zeroed.
    y.resize(n * out_dim, 0.0);
    if n == 0 {
        return;
    }
    let pool = pool::global();
    let per_task = rows_per_task(n, out_dim, in_dim, pool.threads());
    // Task i: the i-th block of `per_task` rows, counting through the parts in order.
    let n_tasks = parts.iter().map(|w| w.rows().div_ceil(per_task)).sum();
    let all = OutCols::new(y, n, out_dim);
    pool.run(n_tasks, &|mut i| {
        let mut col = 0;
        for w in parts {
            let here = w.rows().div_ceil(per_task);
            if i < here {
                let r0 = i * per_task;
                // SAFETY: task i alone writes these columns (blocks of distinct
                // tasks do not overlap), and `run` calls each task once.
                let out = unsafe { all.task_columns(col + r0, per_task.min(w.rows() - r0)) };
                let next = Some(r0 + pool.threads() * per_task).filter(|&r| r < w.rows());
                return rows_task(path, x, n, w, r0, next, out);
            }
            i -= here;
            col += w.rows();
        }
        unreachable!("matmul: task index past the last part")
    });
}

/// Most tokens of a step whose matmuls are split into a few large tasks per thread (see
/// [`rows_per_task`]): few tokens per weight row, so the weights' stream from memory matters and
/// a task of several scratch blocks fetches each next block while it computes the current one.
const DECODE_MAX_TOKENS: usize = 64;

/// Tasks per thread a decode-sized matmul is split into (enough for load
/// balance, few enough that the per-task cost stays small).
const TASKS_PER_THREAD: usize = 8;

/// Weight rows per pool task for `n` tokens and `out_dim` output rows of `k` columns on
/// `threads` threads, always a multiple of 12 (whole groups of 3 and 4 rows) and at least
/// [`ROWS_PER_TASK`]:
/// - up to [`DECODE_MAX_TOKENS`] tokens: about `out_dim / (threads * TASKS_PER_THREAD)` (e.g.
///   3072 for the 49152-row LM head on 2 threads), several scratch blocks per task;
/// - more tokens: one scratch block ([`block_groups`] groups of 4 rows), but no more than a
///   quarter of the rows per thread, so the threads stay balanced.
///
/// Row grouping never changes a value (each output element has one fixed reduction order).
fn rows_per_task(n: usize, out_dim: usize, k: usize, threads: usize) -> usize {
    let threads = threads.max(1);
    let rows = if n > DECODE_MAX_TOKENS {
        (block_groups(4, k) * 4).min(out_dim.div_ceil(threads * 4))
    } else {
        out_dim.div_ceil(threads * TASKS_PER_THREAD)
    };
    // Whole 3-row and 4-row groups (the register tiles of both kernels).
    (rows / (TILE_R * 4) * (TILE_R * 4)).max(ROWS_PER_TASK)
}
