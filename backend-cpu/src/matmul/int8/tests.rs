use gguf::GgmlType;

use super::acts::{QuantActs, QK};
use super::reference;
use super::*;
use crate::matmul::matmul_with;

/// Every format with integer kernels.
const BLOCK_FORMATS: [GgmlType; 8] = [
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

/// Activations of mixed magnitudes (so scales differ per block), with zeros, ties and an all-zero
/// block.
fn data(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let h = (i as u32)
                .wrapping_mul(2_654_435_761)
                .wrapping_add(seed * 97);
            let v = ((h >> 8) % 2001) as f32 / 1000.0 - 1.0;
            match (i / 32) % 5 {
                0 => v * 30.0,
                1 => v * 1e-3,
                2 if i % 64 < 32 => 0.0,
                3 => (v * 8.0).round() * 0.5,
                _ => v,
            }
        })
        .collect()
}

/// `[rows, cols]` random weights in `format` (random bytes: every code and scale pattern).
fn matrix(format: GgmlType, rows: usize, cols: usize, seed: u64) -> QMatrix {
    let bytes = gguf::testing::random_encoding(format, rows * cols, seed);
    QMatrix::from_bytes(format, rows, cols, &bytes).unwrap()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

/// `w` and, for the formats that have one, its interleaved copy ([`QMatrix::interleave`]): the
/// kernels must give the same bits from either.
fn layouts(w: QMatrix) -> Vec<QMatrix> {
    let mut il = w.clone();
    il.interleave();
    match il.interleaved() {
        Some(_) => vec![w, il],
        None => vec![w],
    }
}

/// The scalar reference of the whole product, element by element.
fn reference_matmul(x: &[f32], n: usize, k: usize, w: &QMatrix) -> Vec<f32> {
    let mut acts = QuantActs::default();
    acts.quantize(x, n, k);
    let mut y = vec![0.0; n * w.rows()];
    for t in 0..n {
        for r in 0..w.rows() {
            let row = w.row_encoded(r);
            y[t * w.rows() + r] = match (Fmt32::of(w.format()), FmtK::of(w.format())) {
                (Some(f), _) => reference::dot32(f, row, acts.row(t), k / 32),
                (_, Some(f)) => reference::dot_k(f, row, acts.row(t), k / 256),
                _ => unreachable!(),
            };
        }
    }
    y
}

fn fast(path: IntPath, x: &[f32], n: usize, k: usize, parts: &[QMatrix]) -> Vec<f32> {
    let mut y = Vec::new();
    assert!(matmul_into_with(path, x, n, k, parts, &mut y));
    y
}

/// Every format on every path this CPU has (and the portable one) gives bitwise the scalar
/// reference, for row counts 1..67 (every token-tile remainder, several tiles), lengths with a
/// partial group of 8 blocks (k = 288, 96: not multiples of 256) and output rows split over
/// several pool tasks.
#[test]
fn every_path_and_format_equals_the_scalar_reference_bitwise() {
    let paths = IntPath::available();
    eprintln!("integer paths: {paths:?}");
    for (i, format) in BLOCK_FORMATS.into_iter().enumerate() {
        let shapes: &[(usize, usize)] = match format.block_size() {
            Some(256) => &[(7, 256), (5, 768), (130, 512)],
            _ => &[(7, 32), (9, 96), (15, 160), (5, 288), (130, 576)],
        };
        for &(rows, k) in shapes {
            let w = matrix(format, rows, k, 100 + i as u64);
            for n in (1..=9).chain([15, 16, 17, 31, 33, 64, 67]) {
                if rows > 100 && n > 9 {
                    continue;
                }
                let x = data(n * k, (n + k) as u32);
                let want = reference_matmul(&x, n, k, &w);
                for w in layouts(w.clone()) {
                    let il = w.interleaved().is_some();
                    for &path in &paths {
                        let got = fast(path, &x, n, k, std::slice::from_ref(&w));
                        assert_eq!(
                            bits(&got),
                            bits(&want),
                            "{format} {path:?} interleaved={il} rows={rows} k={k} n={n}"
                        );
                    }
                }
            }
        }
    }
}

/// A row's outputs do not depend on its batch-mates: each token alone gives the same bits as
/// inside a batch of 67, and the parts of a split matrix give the columns of the whole.
#[test]
fn rows_are_independent_of_their_batch_and_parts() {
    for (i, format) in BLOCK_FORMATS.into_iter().enumerate() {
        let k = if format.block_size() == Some(256) {
            512
        } else {
            160
        };
        let (n, rows) = (67, 20);
        let plain = matrix(format, rows, k, 7 + i as u64);
        let x = data(n * k, 3);
        for (w, path) in layouts(plain).into_iter().flat_map(|w| {
            IntPath::available()
                .into_iter()
                .map(move |p| (w.clone(), p))
        }) {
            let batch = fast(path, &x, n, k, std::slice::from_ref(&w));
            for t in [0, 1, 5, 33, 66] {
                let solo = fast(path, &x[t * k..(t + 1) * k], 1, k, std::slice::from_ref(&w));
                assert_eq!(
                    bits(&solo),
                    bits(&batch[t * rows..(t + 1) * rows]),
                    "{format} {path:?} t={t}"
                );
            }
            // Rows 0..8 and 8..20 as two parts.
            let bytes = |r0: usize, r1: usize| w.rows_encoded(r0, r1 - r0).to_vec();
            let mut parts = [
                QMatrix::from_bytes(format, 8, k, &bytes(0, 8)).unwrap(),
                QMatrix::from_bytes(format, 12, k, &bytes(8, 20)).unwrap(),
            ];
            if w.interleaved().is_some() {
                parts.iter_mut().for_each(QMatrix::interleave);
            }
            assert_eq!(
                bits(&fast(path, &x, n, k, &parts)),
                bits(&batch),
                "{format} {path:?} parts"
            );
        }
    }
}

/// The fast product is close to the exact one: each output within 1 % of `Σ |w·x|` (8-bit
/// activations: a relative error of at most 1/254 per value), and the typical error far smaller.
#[test]
fn fast_is_close_to_exact() {
    for (i, format) in BLOCK_FORMATS.into_iter().enumerate() {
        let (n, rows, k) = (5, 24, 512);
        let w = matrix(format, rows, k, 50 + i as u64);
        let x: Vec<f32> = data(n * k, 9);
        let exact = matmul_with(SimdPath::Portable, &x, n, k, std::slice::from_ref(&w));
        let mut dense = vec![0.0; rows * k];
        w.dequantize_rows(0, &mut dense);
        let y = fast(IntPath::detect(), &x, n, k, std::slice::from_ref(&w));
        let mut rel = 0.0f64;
        for t in 0..n {
            for r in 0..rows {
                let mag: f32 = (0..k)
                    .map(|j| (x[t * k + j] * dense[r * k + j]).abs())
                    .sum();
                let err = (y[t * rows + r] - exact[t * rows + r]).abs();
                assert!(err <= 0.01 * mag, "{format} t={t} r={r}: {err} of {mag}");
                rel += f64::from(err / mag.max(1e-30));
            }
        }
        let mean = rel / (n * rows) as f64;
        assert!(mean < 2e-3, "{format}: mean relative error {mean}");
    }
}

/// Quantization: `d · q` is within `d / 2` of each value, the block and half-block sums are those
/// of the codes, and no code is −128.
#[test]
fn activation_blocks_round_to_nearest_and_sum_their_codes() {
    let (n, k) = (3, 512);
    let x = data(n * k, 1);
    let mut acts = QuantActs::default();
    acts.quantize(&x, n, k);
    for t in 0..n {
        let row = acts.row(t);
        assert_eq!(row.d.len(), k / QK);
        for (b, d) in row.d.iter().enumerate() {
            let xs = &x[t * k + b * QK..t * k + (b + 1) * QK];
            let qs = &row.qs[b * QK..(b + 1) * QK];
            for (&v, &q) in xs.iter().zip(qs) {
                assert!(q != -128);
                assert!(
                    (d * f32::from(q) - v).abs() <= d * 0.5 * (1.0 + 1e-5) + 1e-30,
                    "{v} {q} {d}"
                );
            }
            let sum = |q: &[i8]| q.iter().map(|&q| i32::from(q)).sum::<i32>();
            assert_eq!(row.sums[b], sum(qs));
            assert_eq!(row.dsums[b].to_bits(), (d * sum(qs) as f32).to_bits());
            assert_eq!(i32::from(row.bsums[2 * b]), sum(&qs[..16]));
            assert_eq!(i32::from(row.bsums[2 * b + 1]), sum(&qs[16..]));
        }
    }
}

/// The AVX2 build of the quantization gives bitwise the portable one's codes, scales and sums,
/// ties (`x / d` exactly half-way, rounded to even) included.
#[test]
fn activation_quantization_is_the_same_on_every_path() {
    let (n, k) = (5, 768);
    let mut x = data(n * k, 9);
    // A block whose maximum is 127, so that `1 / d` is 1 and the half-integers are ties.
    for (i, v) in x[256..288].iter_mut().enumerate() {
        *v = if i == 0 {
            127.0
        } else {
            (i as f32 - 16.0) + 0.5
        };
    }
    // Blocks the arithmetic finds hard: a NaN, infinities, a scale so small that `1 / d` is
    // infinite, all zeros, negative zeros.
    x[288 + 5] = f32::NAN;
    x[320 + 1] = f32::INFINITY;
    x[352 + 2] = f32::NEG_INFINITY;
    x[352 + 3] = f32::NAN;
    for (i, v) in x[384..416].iter_mut().enumerate() {
        *v = if i % 3 == 0 { -1e-44 } else { 1e-45 * i as f32 };
    }
    x[416..448].fill(0.0);
    x[448..480].fill(-0.0);
    let (mut portable, mut simd) = (QuantActs::default(), QuantActs::default());
    portable.quantize_with(&x, n, k, false);
    simd.quantize_with(&x, n, k, true);
    for t in 0..n {
        let (a, b) = (portable.row(t), simd.row(t));
        assert_eq!(a.qs, b.qs, "row {t}");
        assert_eq!(bits(a.d), bits(b.d));
        assert_eq!(a.sums, b.sums);
        assert_eq!(bits(a.dsums), bits(b.dsums));
        assert_eq!(a.bsums, b.bsums);
    }
    let row = {
        let mut acts = QuantActs::default();
        acts.quantize_with(&x[..k], 1, k, false);
        acts.row(0).qs[256..260].to_vec()
    };
    // -14.5, -13.5, -12.5 round to the even -14, -14, -12.
    assert_eq!(row, [127, -14, -14, -12]);
}

/// A step large enough to be quantized on several pool threads (split by rows) gives every row
/// exactly what quantizing that row alone gives, on both paths.
#[test]
fn rows_quantized_together_equal_each_row_alone() {
    let (n, k) = (67, 768);
    let x = data(n * k, 11);
    for simd in [false, true] {
        let mut all = QuantActs::default();
        all.quantize_with(&x, n, k, simd);
        for t in 0..n {
            let mut one = QuantActs::default();
            one.quantize_with(&x[t * k..(t + 1) * k], 1, k, simd);
            let (a, b) = (all.row(t), one.row(0));
            assert_eq!(a.qs, b.qs, "simd={simd} row {t}");
            assert_eq!(bits(a.d), bits(b.d));
            assert_eq!(a.sums, b.sums);
            assert_eq!(bits(a.dsums), bits(b.dsums));
            assert_eq!(a.bsums, b.bsums);
        }
    }
}

/// Float weights have no integer kernel: the call says so and leaves the output alone.
#[test]
fn float_weights_are_left_to_the_exact_path() {
    for format in [GgmlType::F32, GgmlType::F16, GgmlType::BF16] {
        assert!(!supports(format));
        let w = matrix(format, 4, 64, 1);
        let mut y = vec![7.0];
        assert!(!matmul_into_with(
            IntPath::Portable,
            &data(64, 1),
            1,
            64,
            &[w],
            &mut y
        ));
        assert_eq!(y, [7.0]);
    }
}
