//! Elementwise and per-row building blocks of the forward pass (all f32).

use super::aligned::AlignedVec;
use super::kernels::SimdPath;
use super::vexp;
use model_desc::{Activation, RopeStyle};

/// RMSNorm (Zhang & Sennrich 2019, as in Hugging Face `LlamaRMSNorm`) of every
/// row of `x` (`[n, dim]` row-major, `dim = weight.len()`):
/// `out = (x / sqrt(mean(x²) + eps)) * weight`. The mean of squares is
/// accumulated sequentially in f64 per row (deterministic, batch-independent).
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32) -> Vec<f32> {
    let mut out = AlignedVec::new();
    rms_norm_into(x, weight, eps, &mut out);
    out.to_vec()
}

/// Rows per [`rms_norm_into`] task (the sequential f64 sum takes ~1 µs a row).
const RMS_NORM_ROWS: usize = 8;

/// [`rms_norm`] into `out` (resized to `x.len()`; its allocation is reused),
/// in parallel over blocks of rows on the [`super::pool`] (rows are independent).
pub fn rms_norm_into(x: &[f32], weight: &[f32], eps: f32, out: &mut AlignedVec) {
    let dim = weight.len();
    out.resize(x.len(), 0.0);
    let block = dim * RMS_NORM_ROWS;
    super::pool::global().for_each_chunk_mut(out, block, |i, outs| {
        let rows = &x[i * block..i * block + outs.len()];
        for (row, o) in rows.chunks_exact(dim).zip(outs.chunks_exact_mut(dim)) {
            let scale = rms_scale(row, eps);
            for ((o, &v), &w) in o.iter_mut().zip(row).zip(weight) {
                *o = (v * scale) * w;
            }
        }
    });
}

/// `1 / sqrt(mean(x²) + eps)` of one row, the mean accumulated sequentially in f64.
fn rms_scale(row: &[f32], eps: f32) -> f32 {
    let ms = row.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / row.len() as f64;
    (1.0 / (ms + eps as f64).sqrt()) as f32
}

/// [`rms_norm`] of each `weight.len()`-wide chunk of `x` in place (the per-head Q/K norm of
/// Qwen 3 and Gemma 3: `x` is one token's heads, `weight` is `[head_dim]`).
pub fn rms_norm_chunks_in_place(x: &mut [f32], weight: &[f32], eps: f32) {
    for head in x.chunks_exact_mut(weight.len()) {
        let scale = rms_scale(head, eps);
        for (v, &w) in head.iter_mut().zip(weight) {
            *v = (*v * scale) * w;
        }
    }
}

/// `x = cap * tanh(x / cap)` for every element (Gemma 2's final logit soft-capping).
pub fn softcap_in_place(x: &mut [f32], cap: f32) {
    for v in x {
        *v = (*v / cap).tanh() * cap;
    }
}

/// Rotary position embedding tables for a list of positions.
///
/// For position `p` and pair `i < head_dim / 2` the angle is
/// `p * base^(-2i / head_dim)` (Su et al. 2021, RoFormer), computed in f64
/// and rounded to f32 cos/sin; [`RopeTable::with_options`] also divides each
/// frequency by a factor (Llama 3's `rope_freqs.weight`) and scales positions
/// (linear RoPE scaling). The values for a position do not depend on the
/// other positions in the table.
#[derive(Debug, Clone)]
pub struct RopeTable {
    half: usize,
    /// `cos[t * half + i]` for the `t`-th position of the table.
    cos: Vec<f32>,
    /// `sin[t * half + i]`.
    sin: Vec<f32>,
}

impl RopeTable {
    /// Tables for positions `start..start + n` with the given head width
    /// (even) and base θ.
    pub fn new(start: usize, n: usize, head_dim: usize, base: f32) -> RopeTable {
        RopeTable::at_positions(start..start + n, head_dim, base)
    }

    /// Tables for the given positions, in order (entry `t` is `positions[t]`),
    /// with the given head width (even) and base θ.
    pub fn at_positions(
        positions: impl IntoIterator<Item = usize>,
        head_dim: usize,
        base: f32,
    ) -> RopeTable {
        RopeTable::with_options(positions, head_dim, base, 1.0, None)
    }

    /// Tables for the given positions with frequency `base^(-2i / head_dim) / factors[i]`
    /// (`factors`: `[head_dim / 2]`, `None` for all ones) at position `p * position_scale`.
    pub fn with_options(
        positions: impl IntoIterator<Item = usize>,
        head_dim: usize,
        base: f32,
        position_scale: f32,
        factors: Option<&[f32]>,
    ) -> RopeTable {
        let half = head_dim / 2;
        let inv_freq: Vec<f64> = (0..half)
            .map(|i| {
                let f = (base as f64).powf(-2.0 * i as f64 / head_dim as f64);
                match factors {
                    Some(d) => f / d[i] as f64,
                    None => f,
                }
            })
            .collect();
        let scale = position_scale as f64;
        let (mut cos, mut sin) = (Vec::new(), Vec::new());
        for p in positions {
            for &f in &inv_freq {
                let a = p as f64 * scale * f;
                cos.push(a.cos() as f32);
                sin.push(a.sin() as f32);
            }
        }
        RopeTable { half, cos, sin }
    }

    /// Rotates every head in `x` (`n_heads * head_dim` values, one token) in
    /// place for the `t`-th position of the table, in the *adjacent-pair* form
    /// used by llama.cpp for GGUF llama weights: pair `(x[2i], x[2i+1])` of
    /// each head is rotated by angle `i`.
    pub fn apply(&self, x: &mut [f32], t: usize) {
        self.apply_interleaved(x, t)
    }

    /// Rotates every head in `x` in place in `style`'s pairing.
    pub fn apply_style(&self, style: RopeStyle, x: &mut [f32], t: usize) {
        match style {
            RopeStyle::Interleaved => self.apply_interleaved(x, t),
            RopeStyle::Neox => self.apply_neox(x, t),
        }
    }

    /// Rotates every head in `x` in place in the *half-split* (GPT-NeoX, Hugging Face
    /// `rotate_half`) form: pair `(x[i], x[i + head_dim/2])` of each head by angle `i`.
    pub fn apply_neox(&self, x: &mut [f32], t: usize) {
        let cos = &self.cos[t * self.half..(t + 1) * self.half];
        let sin = &self.sin[t * self.half..(t + 1) * self.half];
        for head in x.chunks_exact_mut(2 * self.half) {
            let (lo, hi) = head.split_at_mut(self.half);
            for i in 0..self.half {
                let (a, b) = (lo[i], hi[i]);
                lo[i] = a * cos[i] - b * sin[i];
                hi[i] = b * cos[i] + a * sin[i];
            }
        }
    }

    fn apply_interleaved(&self, x: &mut [f32], t: usize) {
        let cos = &self.cos[t * self.half..(t + 1) * self.half];
        let sin = &self.sin[t * self.half..(t + 1) * self.half];
        for head in x.chunks_exact_mut(2 * self.half) {
            for (i, pair) in head.chunks_exact_mut(2).enumerate() {
                let (a, b) = (pair[0], pair[1]);
                pair[0] = a * cos[i] - b * sin[i];
                pair[1] = a * sin[i] + b * cos[i];
            }
        }
    }
}

/// In-place softmax of `x` in f32: subtracts the max, exponentiates, divides by the
/// sequentially accumulated sum. Empty input is left unchanged.
pub fn softmax_in_place(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f32;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// SwiGLU activation (Shazeer 2020) for each row of `gate_up`
/// (`[n, 2 * ffn]`, gate half first): returns `[n, ffn]` with
/// `silu(g) * u`, `silu(g) = g / (1 + e^-g)`.
pub fn swiglu(gate_up: &[f32], ffn: usize) -> Vec<f32> {
    let mut out = AlignedVec::new();
    swiglu_into(gate_up, ffn, &mut out);
    out.to_vec()
}

/// Elements of a [`swiglu_into`] task (the exponentials dominate: 1536 per
/// token per layer for SmolLM2, so one decode token makes 2 tasks and a
/// 32-token step 48).
const SWIGLU_CHUNK: usize = 1024;

/// [`swiglu`] into `out` (replacing its contents; its allocation is reused),
/// in parallel over chunks of elements on the [`super::pool`] (each element
/// has one formula, so the split changes no value).
pub fn swiglu_into(gate_up: &[f32], ffn: usize, out: &mut AlignedVec) {
    gated_into(gate_up, ffn, Activation::Silu, out)
}

/// The gated feed-forward activation `act(g) * u` of each row of `gate_up` (`[n, 2 * ffn]`,
/// gate half first) into `out` (`[n, ffn]`): SwiGLU for [`Activation::Silu`] (exactly
/// [`swiglu_into`]), GeGLU with the tanh GELU for [`Activation::GeluTanh`].
///
/// Both are `g / (1 + e^z) * u` with `z = -g` ([`silu`]) or `z = -2 β (g + κ g³)`
/// ([`gelu_tanh`]); the exponentials run through [`vexp`](super::vexp), which gives
/// `f32::exp`'s bits 16 at a time on AVX-512, so every path computes bitwise what the scalar
/// functions do.
pub fn gated_into(gate_up: &[f32], ffn: usize, act: Activation, out: &mut AlignedVec) {
    assert_eq!(
        gate_up.len() % (2 * ffn),
        0,
        "gated activation: gate_up is not whole rows of 2 * ffn"
    );
    out.clear();
    out.resize(gate_up.len() / 2, 0.0);
    let vector = SimdPath::detect() == SimdPath::Avx512 && vexp::vector_exp_ok();
    super::pool::global().for_each_chunk_mut(out, SWIGLU_CHUNK, |c, o| {
        // The chunk's elements, cut where they cross from one row to the next.
        let (mut at, mut done) = (c * SWIGLU_CHUNK, 0);
        while done < o.len() {
            let (row, col) = (at / ffn, at % ffn);
            let len = (ffn - col).min(o.len() - done);
            let g = &gate_up[row * 2 * ffn + col..][..len];
            let u = &gate_up[row * 2 * ffn + ffn + col..][..len];
            gated_segment(vector, act, g, u, &mut o[done..done + len]);
            (at, done) = (at + len, done + len);
        }
    });
}

/// `o[i] = g[i] / (1 + e^z(g[i])) * u[i]` (see [`gated_into`]); `vector`: the AVX-512
/// exponential.
fn gated_segment(vector: bool, act: Activation, g: &[f32], u: &[f32], o: &mut [f32]) {
    for (o, &g) in o.iter_mut().zip(g) {
        *o = match act {
            Activation::Silu => -g,
            Activation::GeluTanh => gelu_exponent(g),
        };
    }
    vexp::exp_sub(vector, o, 0.0);
    for ((o, &g), &u) in o.iter_mut().zip(g).zip(u) {
        *o = g / (1.0 + *o) * u;
    }
}

/// SiLU, `g / (1 + e^-g)`.
#[inline(always)]
pub fn silu(g: f32) -> f32 {
    g / (1.0 + (-g).exp())
}

/// The exponent `z = -2 β (x + κ x³)` of [`gelu_tanh`] (`β = sqrt(2/π)`, `κ = 0.044715`).
#[inline(always)]
fn gelu_exponent(x: f32) -> f32 {
    const BETA: f32 = 0.797_884_6; // sqrt(2 / π)
    const KAPPA: f32 = 0.044715;
    -2.0 * (BETA * (x + KAPPA * (x * x * x)))
}

/// GELU, tanh approximation (`gelu(approximate="tanh")` of PyTorch):
/// `0.5 x (1 + tanh(u))` with `u = sqrt(2/π) (x + 0.044715 x³)`, computed as the equal
/// `x / (1 + e^(-2u))` (since `(1 + tanh u) / 2 = 1 / (1 + e^(-2u))`): one exponential, no
/// cancellation for negative `u`; within a few ulp of the tanh form.
#[inline(always)]
pub fn gelu_tanh(x: f32) -> f32 {
    x / (1.0 + gelu_exponent(x).exp())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_unit_rows() {
        let x = [3.0, 4.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0];
        let y = rms_norm(&x, &[1.0, 2.0, 1.0, 1.0], 0.0);
        let s = 1.0 / (25.0f32 / 4.0).sqrt();
        assert!((y[0] - 3.0 * s).abs() < 1e-6 && (y[1] - 8.0 * s).abs() < 1e-6);
        assert_eq!(&y[4..], &[1.0, 2.0, 1.0, 1.0]);
    }

    #[test]
    fn rope_rotates_pairs_and_keeps_norm() {
        let table = RopeTable::new(3, 2, 4, 10000.0);
        let mut x = [1.0, 0.0, 0.0, 1.0];
        table.apply(&mut x, 0); // position 3
        assert!((x[0] - 3.0f32.cos()).abs() < 1e-6 && (x[1] - 3.0f32.sin()).abs() < 1e-6);
        let a = 3.0f64 * 0.01; // 10000^(-2/4) = 0.01
        assert!((x[2] + a.sin() as f32).abs() < 1e-6 && (x[3] - a.cos() as f32).abs() < 1e-6);
        let mut y = [1.0, 2.0, 3.0, 4.0];
        RopeTable::new(0, 1, 4, 10000.0).apply(&mut y, 0);
        assert_eq!(y, [1.0, 2.0, 3.0, 4.0]);
        // Scattered positions give the same rotation as a run.
        let scattered = RopeTable::at_positions([9, 3], 4, 10000.0);
        let mut z = [1.0, 0.0, 0.0, 1.0];
        scattered.apply(&mut z, 1);
        assert_eq!(z, x);
    }

    #[test]
    fn softmax_sums_to_one() {
        let mut x = [1.0, 2.0, 3.0, 1000.0, -1000.0];
        softmax_in_place(&mut x);
        assert!((x.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(x[3] > 0.99 && x[4] == 0.0);
    }

    #[test]
    fn neox_rope_rotates_half_split_pairs() {
        let table = RopeTable::new(3, 1, 4, 10000.0);
        let mut x = [1.0, 0.0, 0.0, 1.0];
        table.apply_neox(&mut x, 0);
        // Pair 0 is (x[0], x[2]) at angle 3; pair 1 is (x[1], x[3]) at angle 0.03.
        assert!((x[0] - 3.0f32.cos()).abs() < 1e-6 && (x[2] - 3.0f32.sin()).abs() < 1e-6);
        let a = 0.03f64;
        assert!((x[1] + a.sin() as f32).abs() < 1e-6 && (x[3] - a.cos() as f32).abs() < 1e-6);
    }

    #[test]
    fn rope_factors_and_scale_divide_frequencies() {
        let plain = RopeTable::at_positions([8], 4, 10000.0);
        let scaled = RopeTable::with_options([16], 4, 10000.0, 0.5, None);
        assert_eq!(plain.cos, scaled.cos);
        let factors = RopeTable::with_options([8], 4, 10000.0, 1.0, Some(&[1.0, 2.0]));
        let half = RopeTable::at_positions([4], 4, 10000.0);
        assert_eq!(factors.cos[0], plain.cos[0]);
        assert!((factors.cos[1] - half.cos[1]).abs() < 1e-7);
    }

    #[test]
    fn gated_activations() {
        let gu = [0.5, -1.0, 2.0, 3.0];
        assert_eq!(gated_with_act(&gu, Activation::Silu), swiglu(&gu, 2));
        let y = gated_with_act(&gu, Activation::GeluTanh);
        // torch.nn.functional.gelu(torch.tensor([0.5, -1.0]), approximate="tanh")
        assert!((y[0] - 0.345_714_3 * 2.0).abs() < 1e-6, "{}", y[0]);
        assert!((y[1] + 0.158_808 * 3.0).abs() < 1e-6, "{}", y[1]);
    }

    /// The chunked, vectorised activations are bitwise the scalar formulas, for rows that cross
    /// chunk boundaries and inputs over the whole range (exponent special cases included); the
    /// GELU's exponential form stays within a few ulp of the tanh form.
    #[test]
    fn gated_activations_are_bitwise_the_scalar_formulas() {
        let ffn = 1000 + 37; // rows cross the 1024-element chunks
        let n = 5;
        let gu: Vec<f32> = (0..n * 2 * ffn)
            .map(|i| {
                let h = (i as u32).wrapping_mul(2_654_435_761) >> 8;
                (h % 20001) as f32 / 100.0 - 100.0 // [-100, 100]
            })
            .collect();
        for act in [Activation::Silu, Activation::GeluTanh] {
            let got = {
                let mut out = AlignedVec::new();
                gated_into(&gu, ffn, act, &mut out);
                out.to_vec()
            };
            for (i, &y) in got.iter().enumerate() {
                let (row, col) = (i / ffn, i % ffn);
                let (g, u) = (gu[row * 2 * ffn + col], gu[row * 2 * ffn + ffn + col]);
                let f = match act {
                    Activation::Silu => silu(g),
                    Activation::GeluTanh => gelu_tanh(g),
                };
                assert_eq!(y.to_bits(), (f * u).to_bits(), "{act:?} element {i}: g {g}");
            }
        }
        for i in -4000..4000 {
            let x = i as f32 / 400.0;
            let inner = 0.797_884_6f32 * (x + 0.044715 * (x * x * x));
            let tanh_form = 0.5 * x * (1.0 + inner.tanh());
            let diff = (gelu_tanh(x) - tanh_form).abs();
            assert!(
                diff <= 4.0 * f32::EPSILON * x.abs().max(1e-3),
                "{x}: {diff}"
            );
        }
    }

    fn gated_with_act(gu: &[f32], act: Activation) -> Vec<f32> {
        let mut out = AlignedVec::new();
        gated_into(gu, 2, act, &mut out);
        out.to_vec()
    }

    #[test]
    fn per_head_norm_and_softcap() {
        let mut x = [3.0, 4.0, 1.0, 1.0];
        rms_norm_chunks_in_place(&mut x, &[1.0, 2.0], 0.0);
        let s = 1.0 / 12.5f32.sqrt();
        assert!((x[0] - 3.0 * s).abs() < 1e-6 && (x[1] - 8.0 * s).abs() < 1e-6);
        assert_eq!(&x[2..], &[1.0, 2.0]);
        let mut z = [0.0, 30.0, -1e6];
        softcap_in_place(&mut z, 30.0);
        assert_eq!(z[0], 0.0);
        assert!((z[1] - 30.0 * 1f32.tanh()).abs() < 1e-5 && z[2] == -30.0);
    }

    #[test]
    fn swiglu_values() {
        let y = swiglu(&[0.0, 1.0, 2.0, 3.0], 2);
        assert_eq!(y[0], 0.0);
        assert!((y[1] - 3.0 / (1.0 + (-1.0f32).exp())).abs() < 1e-6);
    }
}
