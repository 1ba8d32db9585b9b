//! The `fast` numerics of the CPU backend ([`Numerics::Fast`]): matrix multiplications of
//! block-quantized weights with 8-bit activations and integer dot products, as llama.cpp's CPU
//! kernels do (`ggml_vec_dot_q4_1_q8_1`, `ggml_vec_dot_q4_K_q8_K`, ...), but batch invariant.
//!
//! Weights: [`crate::CpuModel::with_numerics`] keeps a copy of every block-format matrix but
//! Q5_K interleaved 8 rows per block ([`crate::kernels::Interleaved8`]), which the SIMD kernels
//! read ([`x86`]); the file's row-major bytes serve the portable path (the reference) and any
//! matrix without the copy. Either layout gives the same bits.
//!
//! Each step's activation rows are quantized once per matmul call ([`acts`]) in blocks of 32: an
//! f32 scale, the block's integer sum and the scale times it, and the integer sums of its halves.
//! Every weight format reads the same blocks, the k-quants (Q4_K, Q5_K, Q6_K) too: 8 scales per
//! super-block of 256 instead of ggml's one (`Q8_K`), which halved `fast`'s perplexity cost on
//! Gemma 3 (BENCHMARKS.md, 2026-12-06). A call covers every part of one logical matrix (Q, K, V;
//! gate, up), so the parts that read the same input share one quantization. Scratch: per call
//! `n * k` bytes of codes plus 16 bytes per 32 values, e.g. 864 bytes per token for SmolLM2's
//! 576-wide input, in a per-thread buffer reused across steps. F16, BF16 and F32 weights (and any
//! call with such a part) take the exact f32 path.
//!
//! # Batch invariance (the contract of [`super`] kept in `fast`)
//!
//! An output element `y[t][r]` is a function of activation row `t` and weight row `r` alone,
//! computed by the same operations whatever the batch, tile, thread or SIMD path:
//!
//! 1. Quantizing a row reads only that row: each block's scale is its own `max|x| / 127` and each
//!    code `round_ties_even(x * (1 / d))`, in scalar code shared by every path.
//! 2. A block's products are summed in i32. Integer addition is exact and associative, so the sum
//!    does not depend on how a path splits it into lanes (`vpmaddubsw` pairs, `vpdpbusd` quads, the
//!    scalar loop) or reduces them (no sum can overflow: a Q6_K group's, two scaled sub-blocks,
//!    is at most 2 · 128 · 16 · 63 · 127 < 2³¹, the others' less).
//! 3. A block's f32 term is one fixed formula of that block's scales and integer sum
//!    ([`reference::term32`]: separate multiplies and adds; [`reference::add_group_k`]: fused
//!    multiply-adds where it says so, `f32::mul_add` in the reference and `vfmadd` in the kernels,
//!    each rounded once), and lane-wise SIMD arithmetic rounds each lane exactly as the scalar
//!    operation does.
//! 4. Terms are accumulated in a fixed order set by the row length only: blocks of 32 of the
//!    legacy formats in 8 lanes (block `b` into lane `b % 8`, in increasing `b`) then
//!    [`reference::reduce8`]; the k-quants' groups of 32 sequentially, into the accumulator.
//!
//! So every path gives bitwise the result of the portable reference ([`reference`]), which the
//! tests check for every format, path, tile height and row count; results are therefore also
//! reproducible across machines (unlike the exact path, whose f32 lane count follows the CPU).

mod acts;
mod reference;
#[cfg(test)]
mod tests;
#[cfg(target_arch = "x86_64")]
mod x86;

use std::cell::RefCell;
use std::ops::Range;

use gguf::GgmlType;
use serde::{Deserialize, Serialize};

use super::out_cols::OutCols;
use crate::kernels::{Interleaved8, QMatrix, SimdPath, GROUP_ROWS};
use crate::pool;
use acts::{QRow, QuantActs};
use reference::{Fmt32, FmtK};

/// How the CPU backend multiplies quantized weights (the worker's `numerics` setting).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Numerics {
    /// f32 activations against exactly decoded weights: the float32 reference up to summation
    /// order (the default).
    #[default]
    Exact,
    /// 8-bit activations and integer dot products for block-quantized weights (see [`self`]);
    /// still deterministic and batch invariant, not equal to the f32 reference.
    Fast,
}

impl Numerics {
    /// `"exact"` or `"fast"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Numerics::Exact => "exact",
            Numerics::Fast => "fast",
        }
    }
}

/// The instruction-set path of the integer kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntPath {
    /// Portable scalar code ([`reference`]).
    Portable,
    /// AVX2: `vpmaddubsw` + `vpmaddwd`.
    Avx2,
    /// AVX-512 VNNI (with VL and BW): `vpdpbusd` on 256-bit vectors for blocks of 32.
    Vnni,
}

impl IntPath {
    /// Every path this CPU can run, slowest first (always starts with `Portable`).
    pub fn available() -> Vec<IntPath> {
        let mut out = vec![IntPath::Portable];
        if SimdPath::available().contains(&SimdPath::Avx2) {
            out.push(IntPath::Avx2);
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bw")
                && std::arch::is_x86_feature_detected!("avx512vl")
                && std::arch::is_x86_feature_detected!("avx512vnni")
            {
                out.push(IntPath::Vnni);
            }
        }
        out
    }

    /// The path that goes with the f32 kernels' [`SimdPath::detect`] (so `WORKER_SIMD=portable` or
    /// `avx2` forces the portable or AVX2 integer path too): VNNI where [`SimdPath::Avx512`] runs
    /// and the CPU has it, else AVX2 or portable.
    pub fn detect() -> IntPath {
        let all = IntPath::available();
        match SimdPath::detect() {
            SimdPath::Portable => IntPath::Portable,
            SimdPath::Avx2 => IntPath::Avx2,
            SimdPath::Avx512 => *all.last().expect("portable is always available"),
        }
    }

    /// `"portable"`, `"avx2"` or `"avx512-vnni"`.
    pub fn as_str(self) -> &'static str {
        match self {
            IntPath::Portable => "portable",
            IntPath::Avx2 => "avx2",
            IntPath::Vnni => "avx512-vnni",
        }
    }
}

/// Whether `format` has integer kernels (every block format; not F16, BF16, F32).
pub fn supports(format: GgmlType) -> bool {
    Fmt32::of(format).is_some() || FmtK::of(format).is_some()
}

/// `out[r][t] = Σ_k W_r[k] · x_t[k]` for the consecutive encoded rows `rows` of `format`
/// (`out.len()` rows of `k` values) against `T` activation rows.
#[inline(always)]
fn rows_t<const T: usize>(
    path: IntPath,
    format: GgmlType,
    rows: &[u8],
    xs: [QRow<'_>; T],
    k: usize,
    out: &mut [[f32; T]],
) {
    match path {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Avx2` comes only from `IntPath::available`, which detected AVX2, FMA and F16C;
        // `QMatrix` validated the rows (whole blocks of `k` values) and `xs` were quantized from
        // rows of `k` values in this format's blocks.
        IntPath::Avx2 => unsafe { x86::rows_avx2::<T>(format, rows, xs, k, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above; `Vnni` also comes only from `IntPath::available`, after detecting
        // AVX-512F/BW/VL/VNNI.
        IntPath::Vnni => unsafe { x86::rows_vnni::<T>(format, rows, xs, k, out) },
        _ => {
            let (f32, fk) = (Fmt32::of(format), FmtK::of(format));
            let rb = rows.len() / out.len();
            for (r, o) in out.iter_mut().enumerate() {
                let row = &rows[r * rb..(r + 1) * rb];
                *o = std::array::from_fn(|t| match (f32, fk) {
                    (Some(f), _) => reference::dot32(f, row, xs[t], k / 32),
                    (None, Some(f)) => reference::dot_k(f, row, xs[t], k / 256),
                    (None, None) => unreachable!("int8: format without an integer kernel"),
                });
            }
        }
    }
}

/// [`rows_t`] for rows interleaved at load time ([`Interleaved8`]): `n_rows` rows (at most
/// [`CHUNK_R`]) from group `g0` on, into `tile` token by token (`tile[t][r]`). SIMD paths only
/// (the portable one reads the row-major bytes).
#[inline(always)]
fn interleaved_t<const T: usize>(
    path: IntPath,
    il: &Interleaved8,
    g0: usize,
    xs: &[QRow<'_>; T],
    n_rows: usize,
    tile: &mut [[f32; CHUNK_R]; T],
) {
    let tiles = il.groups(g0, n_rows.div_ceil(GROUP_ROWS));
    let (f, tile_bytes, nb) = (il.format(), il.tile_bytes(), il.blocks());
    match path {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Avx2` comes only from `IntPath::available`, which detected AVX2, FMA and F16C;
        // `tiles` holds the groups of the `n_rows` rows and `xs` were quantized from rows of `nb`
        // blocks of the format.
        IntPath::Avx2 => unsafe {
            x86::interleaved_avx2::<T>(f, tiles, tile_bytes, nb, xs, n_rows, tile)
        },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above, after detecting AVX-512F/BW/VL/VNNI.
        IntPath::Vnni => unsafe {
            x86::interleaved_vnni::<T>(f, tiles, tile_bytes, nb, xs, n_rows, tile)
        },
        _ => unreachable!("int8: interleaved rows on the portable path"),
    }
}

/// Tokens per kernel call: the SIMD kernels load (and for the row-major blocks of 32, decode and
/// transpose) each weight block once per tile, so a taller tile spreads that work over more
/// tokens. 16 measured 3-5 % faster than 8 for prefill and 32-stream decode on the VNNI path
/// (Gemma 3, SmolLM2; BENCHMARKS.md, 2026-12-06) and no slower on the AVX2 path.
const TILE_T: usize = 16;

/// Weight rows per kernel call (the interleaved kernels' token tile width).
const CHUNK_R: usize = 16;
#[cfg(target_arch = "x86_64")]
const _: () = assert!(CHUNK_R == x86::TILE_ROWS);
const _: () = assert!(CHUNK_R.is_multiple_of(GROUP_ROWS));

/// Task columns `cols` (rows `r0 + cols` of `w`) against the `T` quantized rows from `t0`, in
/// chunks of [`CHUNK_R`] rows.
fn token_tile<const T: usize>(
    path: IntPath,
    x: &QuantActs,
    t0: usize,
    w: &QMatrix,
    r0: usize,
    cols: Range<usize>,
    out: &mut OutCols<'_>,
) {
    let xs: [QRow<'_>; T] = std::array::from_fn(|i| x.row(t0 + i));
    // The chunk's outputs token by token (`tile[t][i]`: row `r + i` against token `t0 + t`); the
    // interleaved kernels store them so, the row-major ones through `by_row` and a transposition.
    let mut tile = [[0.0f32; CHUNK_R]; T];
    // The interleaved copy where there is one (SIMD paths; the portable one is the reference),
    // except for Q8_0 tiles of 4+ tokens on AVX2, where the row-major kernel measured 10 % faster
    // at 32 streams (16 vector registers; BENCHMARKS.md, 2026-12-06).
    let interleaved = w.interleaved().filter(|_| {
        path == IntPath::Vnni || (path == IntPath::Avx2 && (T < 4 || w.format() != GgmlType::Q8_0))
    });
    let mut r = cols.start;
    while r < cols.end {
        let count = (cols.end - r).min(CHUNK_R);
        match interleaved {
            Some(il) => {
                // Tasks and sweeps start at multiples of CHUNK_R, a multiple of the group.
                assert!(
                    (r0 + r).is_multiple_of(GROUP_ROWS),
                    "int8: row not at a group"
                );
                let g0 = (r0 + r) / GROUP_ROWS;
                interleaved_t::<T>(path, il, g0, &xs, count, &mut tile);
            }
            None => {
                let mut by_row = [[0.0f32; T]; CHUNK_R];
                let rows = w.rows_encoded(r0 + r, count);
                rows_t::<T>(path, w.format(), rows, xs, w.cols(), &mut by_row[..count]);
                for (i, v) in by_row[..count].iter().enumerate() {
                    for t in 0..T {
                        tile[t][i] = v[t];
                    }
                }
            }
        }
        if count == CHUNK_R {
            // One bounds check and T contiguous runs of CHUNK_R outputs.
            out.put(t0, r, &tile);
        } else {
            for (i, c) in (r..r + count).enumerate() {
                let col: [[f32; 1]; T] = std::array::from_fn(|t| [tile[t][i]]);
                out.put(t0, c, &col);
            }
        }
        r += count;
    }
}

/// Encoded weight bytes that the token tiles sweep at a time (they stay in L2 between tiles).
const SWEEP_BYTES: usize = 128 << 10;

/// Rows `r0..r0 + out.cols` of `w` against every row of the quantized `x`, `y[t][r]` through
/// `out`: the task's rows in sweeps of about [`SWEEP_BYTES`] (read from memory once, then from
/// L2), each swept by token tiles of [`TILE_T`] (whose codes stay in L1).
fn rows_task(
    path: IntPath,
    x: &QuantActs,
    n: usize,
    w: &QMatrix,
    r0: usize,
    out: &mut OutCols<'_>,
) {
    let row_bytes = w.rows_encoded(r0, 1).len().max(1);
    let sweep = (SWEEP_BYTES / row_bytes / CHUNK_R).max(1) * CHUNK_R;
    let mut c0 = 0;
    while c0 < out.cols {
        let cols = c0..(c0 + sweep).min(out.cols);
        let mut t0 = 0;
        while t0 < n {
            // Tiles of 8, then 4, 3, 2, 1 for the rest (the tile changes no value).
            let tile = match n - t0 {
                r if r >= TILE_T => TILE_T,
                r => r.min(4),
            };
            let c = cols.clone();
            match tile {
                1 => token_tile::<1>(path, x, t0, w, r0, c, out),
                2 => token_tile::<2>(path, x, t0, w, r0, c, out),
                3 => token_tile::<3>(path, x, t0, w, r0, c, out),
                4 => token_tile::<4>(path, x, t0, w, r0, c, out),
                _ => token_tile::<TILE_T>(path, x, t0, w, r0, c, out),
            }
            t0 += tile;
        }
        c0 = cols.end;
    }
}

/// Tasks per thread of a matmul (enough for load balance when a helper is descheduled).
const TASKS_PER_THREAD: usize = 8;

/// Weight rows per pool task for `out_dim` rows on `threads` threads: whole [`CHUNK_R`] chunks,
/// about [`TASKS_PER_THREAD`] tasks per thread ([`rows_task`] sweeps large ones in L2-sized
/// pieces). Task sizes change no value.
fn rows_per_task(out_dim: usize, threads: usize) -> usize {
    let rows = out_dim.div_ceil(threads.max(1) * TASKS_PER_THREAD);
    rows.div_ceil(CHUNK_R).max(1) * CHUNK_R
}

thread_local! {
    /// The calling thread's quantized activations.
    static ACTS: RefCell<QuantActs> = RefCell::new(Default::default());
}

/// `y[n, out] = x[n, in] · W[out, in]ᵀ` (`W` the row-wise concatenation of `parts`, as
/// [`super::matmul`]) with 8-bit activations on `path`, when every part has integer kernels
/// ([`supports`]); returns `false` and leaves `y` alone otherwise (the caller then runs the exact
/// path). Bit-identical per element for any `n`, tile, thread count and path (module docs).
///
/// Panics if `x.len() != n * in_dim` or a part does not have `in_dim` columns.
pub fn matmul_into_with(
    path: IntPath,
    x: &[f32],
    n: usize,
    in_dim: usize,
    parts: &[QMatrix],
    y: &mut Vec<f32>,
) -> bool {
    if !parts.iter().all(|p| supports(p.format())) {
        return false;
    }
    assert_eq!(x.len(), n * in_dim, "matmul: x has wrong length");
    assert!(
        parts.iter().all(|p| p.cols() == in_dim),
        "matmul: weight width differs from in_dim"
    );
    let out_dim: usize = parts.iter().map(QMatrix::rows).sum();
    y.resize(n * out_dim, 0.0);
    if n == 0 {
        return true;
    }
    let mut run = |acts: &mut QuantActs| {
        acts.quantize(x, n, in_dim);
        let pool = pool::global();
        let per_task = rows_per_task(out_dim, pool.threads());
        let n_tasks = parts.iter().map(|w| w.rows().div_ceil(per_task)).sum();
        let all = OutCols::new(y, n, out_dim);
        let acts = &*acts;
        pool.run(n_tasks, &|mut i| {
            let mut col = 0;
            for w in parts {
                let here = w.rows().div_ceil(per_task);
                if i < here {
                    let r0 = i * per_task;
                    // SAFETY: task i alone writes these columns (blocks of distinct tasks do not
                    // overlap), and `run` calls each task once.
                    let mut out =
                        unsafe { all.task_columns(col + r0, per_task.min(w.rows() - r0)) };
                    return rows_task(path, acts, n, w, r0, &mut out);
                }
                i -= here;
                col += w.rows();
            }
            unreachable!("matmul: task index past the last part")
        });
    };
    ACTS.with(|cell| match cell.try_borrow_mut() {
        Ok(mut acts) => run(&mut acts),
        Err(_) => run(&mut Default::default()),
    });
    true
}
