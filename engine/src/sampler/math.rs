//! A branch-free `exp` for f32 that the compiler vectorizes: the sampler takes one or two
//! exponentials per vocabulary entry per step, and `f32::exp` (a libm call each) dominated that.

/// `e^x` for f32, with relative error below 3e-7 over the normal range (Cephes' `expf` polynomial
/// after reduction by `ln 2`). Inputs below -87 (including `-inf`) and NaN give 0; inputs above 88
/// give `e^88` (the sampler only passes values `<= 0`).
#[inline]
pub(crate) fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split in two so that n * LN2_HI is exact.
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // 1.5 * 2^23: adding it rounds to an integer, which then sits in the low mantissa bits.
    const ROUND: f32 = 12_582_912.0;
    let xc = x.clamp(-87.0, 88.0);
    let t = xc * LOG2E + ROUND;
    let n = t - ROUND;
    let n_bits = (t.to_bits() as i32).wrapping_sub(ROUND.to_bits() as i32);
    let r = xc - n * LN2_HI - n * LN2_LO;
    let p = 1.987_569_1e-4f32;
    let p = p * r + 1.398_199_9e-3;
    let p = p * r + 8.333_452e-3;
    let p = p * r + 4.166_579_6e-2;
    let p = p * r + 1.666_666_5e-1;
    let p = p * r + 0.5;
    let y = p * r * r + r + 1.0;
    let scale = f32::from_bits(((n_bits + 127) as u32) << 23);
    // `x >= -87.0` is false for NaN too.
    if x >= -87.0 {
        y * scale
    } else {
        0.0
    }
}

/// `out[i] = exp((values[i] - shift) / t)` for every `i` (resizing `out`), vectorized.
pub(crate) fn exp_into(out: &mut Vec<f32>, values: &[f32], shift: f32, t: f32) {
    out.clear();
    out.resize(values.len(), 0.0);
    for (o, &v) in out.iter_mut().zip(values) {
        *o = exp((v - shift) / t);
    }
}

/// `sum(exp(values[i] - shift))` in f64 (NaN values add 0): exponentials in vectorized chunks, the sum
/// in four f64 accumulators (a fixed order, so the result is deterministic).
pub(crate) fn sum_exp(values: &[f32], shift: f32) -> f64 {
    const CHUNK: usize = 512;
    let mut buf = [0f32; CHUNK];
    let mut acc = [0f64; 4];
    for chunk in values.chunks(CHUNK) {
        let buf = &mut buf[..chunk.len()];
        for (o, &v) in buf.iter_mut().zip(chunk) {
            *o = exp(v - shift);
        }
        let mut quads = buf.chunks_exact(4);
        for q in &mut quads {
            for (a, &w) in acc.iter_mut().zip(q) {
                *a += w as f64;
            }
        }
        for (a, &w) in acc.iter_mut().zip(quads.remainder()) {
            *a += w as f64;
        }
    }
    (acc[0] + acc[1]) + (acc[2] + acc[3])
}

/// `sum(values)` in f64, in four accumulators (a fixed order: deterministic).
pub(crate) fn sum(values: &[f32]) -> f64 {
    let mut acc = [0f64; 4];
    let mut quads = values.chunks_exact(4);
    for q in &mut quads {
        for (a, &w) in acc.iter_mut().zip(q) {
            *a += w as f64;
        }
    }
    for (a, &w) in acc.iter_mut().zip(quads.remainder()) {
        *a += w as f64;
    }
    (acc[0] + acc[1]) + (acc[2] + acc[3])
}

/// `sum(values[i] >= threshold ? values[i] : 0)` in f64, like [`sum`].
pub(crate) fn sum_at_least(values: &[f32], threshold: f32) -> f64 {
    let mut acc = [0f64; 4];
    let mut quads = values.chunks_exact(4);
    let keep = |w: f32| if w >= threshold { w as f64 } else { 0.0 };
    for q in &mut quads {
        for (a, &w) in acc.iter_mut().zip(q) {
            *a += keep(w);
        }
    }
    for (a, &w) in acc.iter_mut().zip(quads.remainder()) {
        *a += keep(w);
    }
    (acc[0] + acc[1]) + (acc[2] + acc[3])
}

/// The largest non-NaN value (`-inf` when there is none), in eight vectorizable lanes.
pub(crate) fn max(values: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; 8];
    let mut chunks = values.chunks_exact(8);
    for c in &mut chunks {
        for (m, &v) in lanes.iter_mut().zip(c) {
            // False for NaN, which keeps the lane.
            *m = if v > *m { v } else { *m };
        }
    }
    for &v in chunks.remainder() {
        lanes[0] = if v > lanes[0] { v } else { lanes[0] };
    }
    lanes
        .iter()
        .fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m })
}

#[cfg(test)]
mod tests {
    #[test]
    fn matches_f64_exp() {
        let mut worst = 0.0f64;
        let mut x = -87.0f32;
        while x <= 88.0 {
            let want = (x as f64).exp();
            let got = super::exp(x) as f64;
            worst = worst.max((got - want).abs() / want);
            x += 0.000_731;
        }
        assert!(worst < 3e-7, "worst relative error {worst}");
        assert_eq!(super::exp(0.0), 1.0);
        assert_eq!(super::exp(-100.0), 0.0);
        assert_eq!(super::exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(super::exp(f32::NAN), 0.0);
    }

    #[test]
    fn sums_and_fills() {
        let values: Vec<f32> = (0..1500).map(|i| (i % 17) as f32 * -0.5).collect();
        let want: f64 = values.iter().map(|&v| ((v - 1.0) as f64).exp()).sum();
        assert!((super::sum_exp(&values, 1.0) - want).abs() < 1e-6 * want);
        assert_eq!(super::sum_exp(&[f32::NAN, 0.0], 0.0), 1.0);
        let mut out = vec![7.0; 3];
        super::exp_into(&mut out, &values[..1000], 0.0, 2.0);
        assert_eq!(out.len(), 1000);
        assert!((out[5] as f64 - (-1.25f64).exp()).abs() < 1e-7);
        assert_eq!(
            super::sum(&out[..3]),
            out[..3].iter().map(|&w| w as f64).sum::<f64>()
        );
        let w = [0.5f32, 0.1, 0.25, 0.05, 1.0];
        assert_eq!(super::sum_at_least(&w, 0.25), 1.75);
        let mut v = vec![f32::NAN; 21];
        assert_eq!(super::max(&v), f32::NEG_INFINITY);
        v[13] = -3.0;
        v[20] = -4.0;
        assert_eq!(super::max(&v), -3.0);
        v[20] = f32::INFINITY;
        assert_eq!(super::max(&v), f32::INFINITY);
    }
}
