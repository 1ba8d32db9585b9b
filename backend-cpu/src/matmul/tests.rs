use gguf::GgmlType;

use super::*;

fn data(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let h = (i as u32)
                .wrapping_mul(2_654_435_761)
                .wrapping_add(seed * 97);
            ((h >> 8) % 2001) as f32 / 1000.0 - 1.0
        })
        .collect()
}

/// The transposed 16-way reduction gives bitwise the per-vector lane sums,
/// including for values whose sum depends on the association order.
#[cfg(target_arch = "x86_64")]
#[test]
fn reduce16_is_bitwise_hsum() {
    if !SimdPath::available().contains(&SimdPath::Avx512) {
        return;
    }
    use std::arch::x86_64::*;
    // Mixed magnitudes, so a different association would round differently.
    let v: Vec<f32> = data(256, 7)
        .iter()
        .enumerate()
        .map(|(i, &x)| x * [1.0, 1e7, 3e-3, 1e4][i % 4])
        .collect();
    // SAFETY: AVX-512F was detected above; every load reads 16 of the 256 floats.
    unsafe {
        let vs: [__m512; 16] = std::array::from_fn(|i| _mm512_loadu_ps(v[16 * i..].as_ptr()));
        let mut sums = [0.0f32; 16];
        _mm512_storeu_ps(sums.as_mut_ptr(), avx512::reduce16(&vs));
        for (i, &s) in sums.iter().enumerate() {
            let mut one = [[0.0f32; 1]; 1];
            avx512::tile::<1, 1>(&[&v[16 * i..16 * i + 16]], &[&[1.0; 16]], 16, &mut one);
            assert_eq!(s.to_bits(), one[0][0].to_bits(), "vector {i}");
        }
    }
}

/// On every path this CPU has, `add_scaled_rows` is bitwise `add_scaled` row after row, and both
/// are the scalar product-then-sum, for lengths with and without a vector tail.
#[test]
fn add_scaled_rows_is_bitwise_add_scaled_in_order() {
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    for path in SimdPath::available() {
        for len in [1, 7, 8, 15, 16, 17, 64, 67, 256] {
            let rows: Vec<Vec<f32>> = (0..4).map(|i| data(len, 10 + i)).collect();
            let a = [0.3, -1.7e3, 2.5e-4, 0.9];
            let mut expected = data(len, 3);
            let mut got = expected.clone();
            for (x, &ai) in rows.iter().zip(&a) {
                add_scaled_with(path, &mut expected, ai, x);
            }
            add_scaled_rows_with::<4>(path, &mut got, &a, std::array::from_fn(|i| &rows[i][..]));
            assert_eq!(bits(&got), bits(&expected), "{path:?}, len {len}");
            let scalar: Vec<f32> = (0..len)
                .map(|j| (0..4).fold(data(len, 3)[j], |y, i| y + a[i] * rows[i][j]))
                .collect();
            assert_eq!(
                bits(&got),
                bits(&scalar),
                "{path:?}, len {len} against scalar"
            );
        }
    }
}

fn f32_matrix(rows: usize, cols: usize, seed: u32) -> QMatrix {
    QMatrix::from_f32(rows, cols, data(rows * cols, seed))
}

/// `[rows, cols]` random weights encoded in `format`.
fn encoded(format: GgmlType, rows: usize, cols: usize, seed: u32) -> QMatrix {
    let w = data(rows * cols, seed);
    let bytes = match format {
        GgmlType::Q8_0 => gguf::quantize_q8_0(&w).unwrap(),
        GgmlType::Q4_1 => gguf::quantize_q4_1(&w).unwrap(),
        GgmlType::F16 => gguf::quant::quantize_f16(&w),
        GgmlType::BF16 => w
            .iter()
            .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
            .collect(),
        GgmlType::F32 => gguf::quant::encode_f32(&w),
        _ => gguf::testing::random_encoding(format, rows * cols, seed as u64),
    };
    QMatrix::from_bytes(format, rows, cols, &bytes).unwrap()
}

/// Scalar f64 reference over the reference-dequantized weights.
fn naive(x: &[f32], n: usize, parts: &[QMatrix]) -> Vec<f64> {
    let k = parts[0].cols();
    let mut w = Vec::new();
    for p in parts {
        let mut d = vec![0.0; p.rows() * k];
        p.dequantize_rows_with(SimdPath::Portable, 0, &mut d);
        w.extend(d);
    }
    let out = w.len() / k;
    let mut y = vec![0.0; n * out];
    for t in 0..n {
        for o in 0..out {
            y[t * out + o] = (0..k)
                .map(|i| x[t * k + i] as f64 * w[o * k + i] as f64)
                .sum();
        }
    }
    y
}

/// Every available path, every format, awkward sizes, against the scalar
/// reference; and per path, each row alone gives bitwise its batched result.
#[test]
fn every_path_and_format_matches_reference_and_is_batch_invariant() {
    for path in SimdPath::available() {
        for format in crate::kernels::SERVED_FORMATS {
            let shapes: &[(usize, [usize; 2])] = if format.block_size() == Some(256) {
                &[(256, [1, 5]), (512, [3, 17])]
            } else {
                &[(32, [1, 5]), (96, [50, 7]), (576, [3, 97])]
            };
            for &(k, outs) in shapes {
                let parts: Vec<QMatrix> = outs
                    .iter()
                    .enumerate()
                    .map(|(i, &o)| encoded(format, o, k, 10 + i as u32))
                    .collect();
                let out: usize = outs.iter().sum();
                for n in [1usize, 2, 3, 5, 8, 17, 64] {
                    let x = data(n * k, n as u32);
                    let y = matmul_with(path, &x, n, k, &parts);
                    let want = naive(&x, n, &parts);
                    for (i, (&g, &w)) in y.iter().zip(&want).enumerate() {
                        assert!(
                            (g as f64 - w).abs() < 1e-4 * (1.0 + w.abs()) * (k as f64).sqrt(),
                            "{path:?} {format} n={n} k={k} elem {i}: {g} vs {w}"
                        );
                    }
                    for t in [0, n / 2, n - 1] {
                        let single = matmul_with(path, &x[t * k..(t + 1) * k], 1, k, &parts);
                        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                        assert_eq!(
                            bits(&single),
                            bits(&y[t * out..(t + 1) * out]),
                            "{path:?} {format} n={n} k={k} row {t}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn matches_naive_f32_odd_widths() {
    for path in SimdPath::available() {
        for &(n, k, out) in &[(1, 8, 1), (5, 37, 7), (9, 64, 100), (3, 577, 50)] {
            let x = data(n * k, 1);
            let w = [f32_matrix(out, k, 2)];
            let y = matmul_with(path, &x, n, k, &w);
            let want = naive(&x, n, &w);
            for (&g, &w) in y.iter().zip(&want) {
                assert!(
                    (g as f64 - w).abs() < 1e-4 * (1.0 + w.abs()),
                    "{path:?} {g} {w}"
                );
            }
        }
    }
}

#[test]
fn batch_invariant_bitwise() {
    let (n, k, out) = (11, 200, 131);
    let x = data(n * k, 3);
    let wv = data(out * k, 4);
    let w = [QMatrix::from_f32(out, k, wv.clone())];
    for path in SimdPath::available() {
        let y = matmul_with(path, &x, n, k, &w);
        for t in 0..n {
            let single = matmul_with(path, &x[t * k..(t + 1) * k], 1, k, &w);
            assert_eq!(single, y[t * out..(t + 1) * out], "token {t}");
            for o in 0..out {
                assert_eq!(
                    dot_with(path, &x[t * k..(t + 1) * k], &wv[o * k..(o + 1) * k]),
                    single[o]
                );
            }
        }
    }
}

#[test]
fn task_sizes() {
    assert_eq!(rows_per_task(32, 49152, 640, 2), 3072);
    assert_eq!(rows_per_task(1, 49152, 640, 2), 3072);
    assert_eq!(rows_per_task(1, 960, 576, 2), 60);
    assert_eq!(rows_per_task(3, 576, 576, 2), ROWS_PER_TASK);
    // Prefill: one scratch block per task, within a quarter of the rows per thread.
    assert_eq!(rows_per_task(65, 49152, 640, 2), 204);
    assert_eq!(rows_per_task(512, 2048, 2048, 2), 60);
    assert_eq!(rows_per_task(512, 1536, 640, 2), 192);
    assert_eq!(rows_per_task(512, 640, 640, 2), 72);
    assert_eq!(rows_per_task(512, 100, 640, 2), ROWS_PER_TASK);
    for (n, out, k, threads) in [(1, 100_000, 640, 0), (512, 7000, 123, 3), (9, 50, 4096, 2)] {
        assert_eq!(rows_per_task(n, out, k, threads) % 12, 0);
    }
}

#[test]
fn empty() {
    assert!(matmul(&[], 0, 4, &[f32_matrix(2, 4, 1)]).is_empty());
}

#[test]
fn portable_matches_simd_closely() {
    let k = 77;
    let (a, b) = (data(k, 5), data(k, 6));
    for path in SimdPath::available() {
        let p = dot_with(SimdPath::Portable, &a, &b);
        assert!((p - dot_with(path, &a, &b)).abs() < 1e-5);
    }
}

/// A benchmark, not a check: GFLOP/s of whole matmuls of Gemma 3's and SmolLM2's shapes on one
/// thread of the detected path (`cargo test --release -p worker --lib matmul_report --
/// --ignored --nocapture`). The figures in the module docs come from it.
#[test]
#[ignore]
fn matmul_report() {
    let env = |name: &str, default: f64| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let threads = env("MATMUL_REPORT_THREADS", 1.0) as usize;
    let total = env("MATMUL_REPORT_GFLOP", 4.0) * 1e9;
    crate::pool::set_threads(threads);
    let path = SimdPath::detect();
    for (format, rows, k, n) in [
        (GgmlType::F32, 2048, 640, 512),
        (GgmlType::Q5_0, 2048, 640, 512),
        (GgmlType::Q6_K, 640, 2048, 512),
        (GgmlType::Q8_0, 49152, 640, 32),
        (GgmlType::Q8_0, 262144, 640, 32),
        (GgmlType::Q5_0, 4096, 640, 32),
        (GgmlType::Q4_1, 1536, 576, 512),
    ] {
        let w = [encoded(format, rows, k, 3)];
        let mut x = crate::aligned::AlignedVec::new();
        x.extend_from_slice(&data(n * k, 1));
        let x = &x[..];
        assert_eq!(x.as_ptr() as usize % 64, 0);
        let mut y = Vec::new();
        matmul_into_with(path, x, n, k, &w, &mut y);
        let reps = (total / (2.0 * (rows * k * n) as f64)).ceil() as usize;
        let t = std::time::Instant::now();
        for _ in 0..reps {
            matmul_into_with(path, x, n, k, &w, &mut y);
        }
        let s = t.elapsed().as_secs_f64();
        let gflops = 2.0 * (rows * k * n * reps) as f64 / s / 1e9;
        println!("{format} [{rows}, {k}] x {n} tokens: {gflops:.1} GFLOP/s ({path:?}, {threads} threads)");
    }
}
