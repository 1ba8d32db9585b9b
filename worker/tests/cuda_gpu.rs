//! Checks of the CUDA backend on a real GPU. All `#[ignore]`d: they need an NVIDIA GPU (compute
//! capability 8.0+), its driver, and NVRTC or a filled module cache. `scripts/gpu-check` runs them:
//!
//!   cargo test --release -p worker --test cuda_gpu -- --ignored --nocapture --test-threads 1
//!
//! - `kernels_against_cpu`: every kernel on random inputs against the CPU implementation (or a
//!   float64 reference for attention), both numeric modes; prints the relative error per kernel. The
//!   weight decoders of all 11 formats must match gguf's scalar decoder (and the llama.cpp blocks
//!   of `fixtures/quant-blocks.json`) bit for bit. In exact mode the GEMV and GEMM kernels must give
//!   bitwise the same rows, whatever the row count.
//! - `reference_prompts_exact`: the 8 prompts of `fixtures/reference.json` through [`CudaModel`]
//!   in exact mode, greedy ids token-exact (alone, then batched), top-5 logits within 1e-3.
//! - `batch_invariance_64_streams`: 64 sequences decoded together (graph bucket 64) give bitwise the
//!   logits of each sequence alone (no graphs), in exact mode.
//! - `fast_mode_divergence`: the reference prompts in fast mode; prints how many greedy ids match
//!   and the largest top-5 logit error (reported, not asserted).
//! - `tiny_model_against_cpu`: the tiny random model (Q8_0 / Q4_1 / F16 / F32 tensors, no download
//!   needed) through the CPU model and the CUDA model: 64 streams, logits within 1e-4 in exact mode,
//!   64 together (graphs) bitwise equal to each alone (no graphs); fast mode's error reported.
//! - `arch_kernels_against_cpu`, `tiny_architectures_against_cpu`, `gemma3_270m_reference_exact`:
//!   the per-architecture kernels and models (see [`arch_ops`]).

use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;
use gguf::GgmlType;
use half::{bf16, f16};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::Value;
use worker::cuda::cache::{cache_dir, ModuleCache};
use worker::cuda::kernels::FILES;
use worker::cuda::{probe, CudaModel, CudaOptions, GpuInfo, Numerics};
use worker::engine::{BatchEntry, BatchModel};
use worker::model::matmul::matmul;
use worker::model::ops::{rms_norm, swiglu, RopeTable};
use worker::model::QMatrix;
use worker::sampler::argmax;

#[path = "cuda_gpu/arch_ops.rs"]
mod arch_ops;
#[path = "common/attention_ref.rs"]
mod attention_ref;
use attention_ref::attention_ref;

const BLOCK: usize = 16;

/// Every weight format the CUDA kernels decode.
const ALL_FORMATS: [GgmlType; 11] = [
    GgmlType::Q4_1,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::F32,
];

fn gpu() -> GpuInfo {
    probe(0).unwrap_or_else(|e| panic!("these tests need a GPU: {e}"))
}

fn options(numerics: Numerics, graphs: bool) -> CudaOptions {
    CudaOptions {
        numerics,
        graphs,
        cache_dir: cache_dir(&std::env::var("WORKER_CUDA_CACHE_DIR").unwrap_or_default()),
        max_decode_batch: 64,
    }
}

/// The kernels of every file, compiled (or cached) for this GPU in `numerics`.
struct Kernels {
    stream: Arc<CudaStream>,
    funcs: std::collections::HashMap<&'static str, CudaFunction>,
    numerics: Numerics,
}

impl Kernels {
    fn load(gpu: &GpuInfo, numerics: Numerics) -> Kernels {
        let cache = ModuleCache::new(options(numerics, false).cache_dir);
        let stream = gpu.ctx.new_stream().unwrap();
        let mut funcs = std::collections::HashMap::new();
        for f in FILES {
            let (cubin, _) = cache.load_or_compile(f, &gpu.arch, numerics).unwrap();
            let module = gpu.ctx.load_module(Ptx::from_binary(cubin)).unwrap();
            for &k in f.kernels {
                funcs.insert(k, module.load_function(k).unwrap());
            }
        }
        Kernels {
            stream,
            funcs,
            numerics,
        }
    }

    fn act(&self, v: &[f32]) -> CudaSlice<u8> {
        let bytes: Vec<u8> = match self.numerics {
            Numerics::Exact => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Numerics::Fast => v
                .iter()
                .flat_map(|x| bf16::from_f32(*x).to_le_bytes())
                .collect(),
        };
        self.stream.clone_htod(&bytes).unwrap()
    }

    fn read_act(&self, d: &CudaSlice<u8>, n: usize) -> Vec<f32> {
        let bytes = self.stream.clone_dtoh(d).unwrap();
        match self.numerics {
            Numerics::Exact => bytes
                .chunks_exact(4)
                .take(n)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            Numerics::Fast => bytes
                .chunks_exact(2)
                .take(n)
                .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
        }
    }

    /// Rounds host values the way an activation buffer stores them.
    fn round(&self, v: &[f32]) -> Vec<f32> {
        match self.numerics {
            Numerics::Exact => v.to_vec(),
            Numerics::Fast => v.iter().map(|x| bf16::from_f32(*x).to_f32()).collect(),
        }
    }
}

fn random(rng: &mut ChaCha8Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-scale..scale)).collect()
}

/// max |a - b| / max |b|.
fn rel_err(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let num = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max);
    let den = b.iter().map(|y| y.abs()).fold(1e-30f32, f32::max);
    num / den
}

/// Encodes `w` (`[rows, cols]`) in `format` as a GGUF tensor would store it.
fn encode(format: GgmlType, w: &[f32]) -> Vec<u8> {
    match format {
        GgmlType::F32 => gguf::quant::encode_f32(w),
        GgmlType::F16 => gguf::quant::quantize_f16(w),
        GgmlType::BF16 => w
            .iter()
            .flat_map(|x| bf16::from_f32(*x).to_le_bytes())
            .collect(),
        GgmlType::Q8_0 => gguf::quantize_q8_0(w).unwrap(),
        GgmlType::Q4_1 => gguf::quantize_q4_1(w).unwrap(),
        GgmlType::Q4_0 => w
            .chunks_exact(32)
            .flat_map(|b| {
                let amax = b.iter().fold(0.0f32, |m, x| m.max(x.abs()));
                let d = amax / 8.0;
                let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
                let q = |x: f32| ((x * inv + 8.5) as i32).clamp(0, 15) as u8;
                let mut out = f16::from_f32(d).to_le_bytes().to_vec();
                out.extend((0..16).map(|j| q(b[j]) | (q(b[j + 16]) << 4)));
                out
            })
            .collect(),
        // No quantizer for these here: [`weight_bytes`] writes random blocks instead.
        GgmlType::Q5_0
        | GgmlType::Q5_1
        | GgmlType::Q4_K
        | GgmlType::Q5_K
        | GgmlType::Q6_K
        | GgmlType::Unsupported(_) => unreachable!("no encoder for {format}"),
    }
}

/// Byte offsets of the f16 scales (d, and dmin or m) in one block of the formats encoded as random
/// blocks, and the block size in bytes.
fn scale_fields(format: GgmlType) -> Option<(&'static [usize], usize)> {
    Some(match format {
        GgmlType::Q5_0 => (&[0], 22),
        GgmlType::Q5_1 => (&[0, 2], 24),
        GgmlType::Q4_K => (&[0, 2], 144),
        GgmlType::Q5_K => (&[0, 2], 176),
        GgmlType::Q6_K => (&[208], 210),
        _ => return None,
    })
}

/// A `[rows, cols]` weight matrix in `format` as a GGUF tensor stores it: the formats with an
/// encoder quantize random values; the 5-bit formats and k-quants get random blocks (every quant,
/// scale and high bit random) whose f16 scales are set to random finite values in [2^-10, 2^-4),
/// so every bit pattern of the layout is exercised.
fn weight_bytes(format: GgmlType, rng: &mut ChaCha8Rng, rows: usize, cols: usize) -> Vec<u8> {
    let Some((scales, block)) = scale_fields(format) else {
        return encode(format, &random(rng, rows * cols, 0.5));
    };
    let n = format.byte_size((rows * cols) as u64).unwrap() as usize;
    let mut bytes: Vec<u8> = (0..n).map(|_| rng.random()).collect();
    for b in bytes.chunks_exact_mut(block) {
        for &at in scales {
            let v = f16::from_f32(rng.random_range(1.0f32 / 1024.0..1.0 / 16.0));
            b[at..at + 2].copy_from_slice(&v.to_le_bytes());
        }
    }
    bytes
}

/// Runs `embedding` over `table` (`[rows, cols]` in `format`) for every row; returns the decoded
/// rows as the activation buffer stores them.
fn run_embedding(
    k: &Kernels,
    format: GgmlType,
    table: &[u8],
    rows: usize,
    cols: usize,
) -> Vec<f32> {
    let tokens: Vec<u32> = (0..rows as u32).collect();
    let d_table = k.stream.clone_htod(table).unwrap();
    let d_tokens = k.stream.clone_htod(&tokens).unwrap();
    let out = k.act(&vec![0.0; rows * cols]);
    let (n, fmt, h, one) = (rows as i32, format.id() as i32, cols as i32, 1.0f32);
    let mut b = k.stream.launch_builder(&k.funcs["embedding"]);
    b.arg(&d_tokens)
        .arg(&n)
        .arg(&d_table)
        .arg(&fmt)
        .arg(&h)
        .arg(&one)
        .arg(&out);
    unsafe { b.launch(rows_cfg(rows, 128, 0)) }.unwrap();
    k.read_act(&out, rows * cols)
}

/// The raw blocks of `fixtures/quant-blocks.json` (written by llama.cpp) with their exact f32
/// values: `(format, block elements, bytes of all blocks, values of all blocks)`.
fn fixture_blocks() -> Vec<(GgmlType, usize, Vec<u8>, Vec<f32>)> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/quant-blocks.json");
    let json: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let types = json["types"].as_object().unwrap();
    let format = |name: &str| match name {
        "Q4_1" => GgmlType::Q4_1,
        "Q8_0" => GgmlType::Q8_0,
        "Q5_0" => GgmlType::Q5_0,
        "Q5_1" => GgmlType::Q5_1,
        "Q4_K" => GgmlType::Q4_K,
        "Q5_K" => GgmlType::Q5_K,
        "Q6_K" => GgmlType::Q6_K,
        other => panic!("fixture type {other}"),
    };
    types
        .iter()
        .map(|(name, t)| {
            let elems = t["block_elems"].as_u64().unwrap() as usize;
            let (mut bytes, mut values) = (Vec::new(), Vec::new());
            for b in t["blocks"].as_array().unwrap() {
                let hex = b["hex"].as_str().unwrap();
                bytes.extend(
                    (0..hex.len())
                        .step_by(2)
                        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()),
                );
                values.extend(
                    b["values"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|v| v.as_f64().unwrap() as f32),
                );
            }
            (format(name), elems, bytes, values)
        })
        .collect()
}

fn rows_cfg(n: usize, threads: u32, smem: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n as u32, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: smem,
    }
}

/// Runs `gemv_*` or `gemm_*` for `m` rows; returns `[m, n_out]`.
#[allow(clippy::too_many_arguments)]
fn run_matmul(
    k: &Kernels,
    prefix: &str,
    format: GgmlType,
    w: &CudaSlice<u8>,
    n_out: usize,
    cols: usize,
    x: &CudaSlice<u8>,
    m: usize,
) -> Vec<f32> {
    let suffix = worker::cuda::weights::format_suffix(format).unwrap();
    let kind = if prefix == "gemv" {
        worker::cuda::launch::MatmulKernel::Gemv
    } else {
        worker::cuda::launch::MatmulKernel::Gemm
    };
    let out: CudaSlice<f32> = k.stream.alloc_zeros(m * n_out).unwrap();
    let (n_i, k_i, xs, m_i, os, oo, acc, f32o) = (
        n_out as i32,
        cols as i32,
        cols as i32,
        m as i32,
        n_out as i32,
        0i32,
        0i32,
        1i32,
    );
    let f = &k.funcs[format!("{prefix}_{suffix}").as_str()];
    let mut b = k.stream.launch_builder(f);
    b.arg(w).arg(&n_i).arg(&k_i).arg(x).arg(&xs).arg(&m_i);
    b.arg(&out).arg(&os).arg(&oo).arg(&acc).arg(&f32o);
    unsafe { b.launch(kind.shape(m, n_out)) }.unwrap();
    k.stream.clone_dtoh(&out).unwrap()
}

#[test]
#[ignore = "needs an NVIDIA GPU (scripts/gpu-check)"]
fn kernels_against_cpu() {
    let gpu = gpu();
    println!("GPU: {} ({})", gpu.name, gpu.arch);
    println!("{:<6} {:<22} {:>12}", "mode", "kernel", "rel. error");
    for numerics in [Numerics::Exact, Numerics::Fast] {
        let k = Kernels::load(&gpu, numerics);
        let mode = numerics.as_str();
        let tol = if numerics == Numerics::Exact {
            1e-5
        } else {
            2e-2
        };
        let report = |name: &str, err: f32, limit: f32| {
            println!("{mode:<6} {name:<22} {err:>12.3e}");
            assert!(
                err <= limit,
                "{mode} {name}: relative error {err} > {limit}"
            );
        };
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let (hidden, ffn, vocab) = (576usize, 1536usize, 300usize);

        // Embedding lookup (Q8_0 table), exact values.
        let table = random(&mut rng, vocab * hidden, 1.0);
        let bytes = encode(GgmlType::Q8_0, &table);
        let qm = QMatrix::from_bytes(GgmlType::Q8_0, vocab, hidden, &bytes).unwrap();
        let tokens = [3u32, 299, 0, 41];
        let d_table = k.stream.clone_htod(&bytes).unwrap();
        let d_tokens = k.stream.clone_htod(&tokens).unwrap();
        let out = k.act(&vec![0.0; tokens.len() * hidden]);
        let (n, fmt, h, one) = (tokens.len() as i32, 8i32, hidden as i32, 1.0f32);
        let mut b = k.stream.launch_builder(&k.funcs["embedding"]);
        b.arg(&d_tokens)
            .arg(&n)
            .arg(&d_table)
            .arg(&fmt)
            .arg(&h)
            .arg(&one)
            .arg(&out);
        unsafe { b.launch(rows_cfg(tokens.len(), 128, 0)) }.unwrap();
        let mut want = vec![0.0; tokens.len() * hidden];
        for (t, row) in tokens.iter().zip(want.chunks_exact_mut(hidden)) {
            qm.dequantize_rows(*t as usize, row);
        }
        report(
            "embedding(q8_0)",
            rel_err(&k.read_act(&out, want.len()), &k.round(&want)),
            0.0,
        );

        // RMSNorm.
        let rows = 5;
        let x = random(&mut rng, rows * hidden, 3.0);
        let wt = random(&mut rng, hidden, 1.0);
        let dx = k.act(&x);
        let dw = k.stream.clone_htod(&wt).unwrap();
        let out = k.act(&vec![0.0; rows * hidden]);
        let (n, dim, eps, acc) = (rows as i32, hidden as i32, 1e-5f32, 0i32);
        let mut b = k.stream.launch_builder(&k.funcs["rmsnorm"]);
        b.arg(&dx)
            .arg(&dw)
            .arg(&n)
            .arg(&dim)
            .arg(&eps)
            .arg(&out)
            .arg(&acc);
        unsafe { b.launch(rows_cfg(rows, 256, 256 * 8)) }.unwrap();
        let want = rms_norm(&k.round(&x), &wt, 1e-5);
        report(
            "rmsnorm",
            rel_err(&k.read_act(&out, want.len()), &want),
            tol,
        );

        // RoPE on Q and K heads (9 + 3 heads of 64), V untouched.
        let (nh, nkv, hd) = (9usize, 3usize, 64usize);
        let width = (nh + 2 * nkv) * hd;
        let positions = [0i32, 7, 1000];
        let qkv = k.round(&random(&mut rng, positions.len() * width, 2.0));
        let dq = k.act(&qkv);
        let dp = k.stream.clone_htod(&positions).unwrap();
        let (n, w, a, b_, c, base) = (
            3i32,
            width as i32,
            nh as i32,
            nkv as i32,
            hd as i32,
            10000f32,
        );
        let (pos_scale, neox) = (1.0f32, 0i32);
        let ones = k.stream.clone_htod(&vec![1.0f32; hd / 2]).unwrap();
        let mut b = k.stream.launch_builder(&k.funcs["rope"]);
        b.arg(&dq)
            .arg(&dp)
            .arg(&n)
            .arg(&w)
            .arg(&a)
            .arg(&b_)
            .arg(&c)
            .arg(&base)
            .arg(&pos_scale)
            .arg(&ones)
            .arg(&neox);
        unsafe { b.launch(rows_cfg(3, 128, 0)) }.unwrap();
        let rope = RopeTable::at_positions(positions.iter().map(|&p| p as usize), hd, 10000.0);
        let mut want = qkv.clone();
        for (t, row) in want.chunks_exact_mut(width).enumerate() {
            rope.apply(&mut row[..(nh + nkv) * hd], t);
        }
        report("rope", rel_err(&k.read_act(&dq, want.len()), &want), tol);

        // SwiGLU.
        let gu = k.round(&random(&mut rng, 4 * 2 * ffn, 4.0));
        let dg = k.act(&gu);
        let out = k.act(&vec![0.0; 4 * ffn]);
        let (n, f) = (4i32, ffn as i32);
        let mut b = k.stream.launch_builder(&k.funcs["swiglu"]);
        b.arg(&dg).arg(&n).arg(&f).arg(&out);
        unsafe { b.launch(worker::cuda::launch::elementwise(4 * ffn)) }.unwrap();
        let want = swiglu(&gu, ffn);
        report("swiglu", rel_err(&k.read_act(&out, want.len()), &want), tol);

        // Weight decoders, bitwise: the fixture's llama.cpp blocks against their stored values, and
        // random rows of every format against gguf's scalar decoder (through `embedding`, which
        // only decodes).
        for (format, elems, bytes, values) in fixture_blocks() {
            let got = run_embedding(&k, format, &bytes, values.len() / elems, elems);
            let want = k.round(&values);
            assert!(
                got.iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{mode}: {format} fixture blocks decode differently on the GPU"
            );
        }
        for format in ALL_FORMATS {
            let (rows, cols) = (7usize, 768usize);
            let bytes = weight_bytes(format, &mut rng, rows, cols);
            let got = run_embedding(&k, format, &bytes, rows, cols);
            let want = k.round(&gguf::dequantize_to_vec(format, &bytes, rows * cols).unwrap());
            let same = got
                .iter()
                .zip(&want)
                .filter(|(a, b)| a.to_bits() == b.to_bits());
            assert_eq!(
                same.count(),
                want.len(),
                "{mode}: {format} decodes differently"
            );
        }
        println!(
            "{mode:<6} {:<22} {:>12}",
            "decoders (all formats)", "bitwise"
        );

        // Matrix kernels, every format, several row counts; GEMV == GEMM bitwise in exact mode.
        for format in ALL_FORMATS {
            // 768: whole k-quant super-blocks, and 3 GEMM slabs.
            let (n_out, cols) = (96usize, 768usize);
            let bytes = weight_bytes(format, &mut rng, n_out, cols);
            let qm = QMatrix::from_bytes(format, n_out, cols, &bytes).unwrap();
            let dw = k.stream.clone_htod(&bytes).unwrap();
            let x = k.round(&random(&mut rng, 33 * cols, 1.0));
            let dx = k.act(&x);
            let suffix = worker::cuda::weights::format_suffix(format).unwrap();
            let mut first_rows: Vec<Vec<f32>> = Vec::new();
            for m in [1usize, 3, 8, 9, 33] {
                let want = matmul(&x[..m * cols], m, cols, std::slice::from_ref(&qm));
                let prefix = if m <= 8 { "gemv" } else { "gemm" };
                let got = run_matmul(&k, prefix, format, &dw, n_out, cols, &dx, m);
                report(
                    &format!("{prefix}_{suffix} m={m}"),
                    rel_err(&got, &want),
                    tol,
                );
                first_rows.push(got[..n_out].to_vec());
                if numerics == Numerics::Exact && m == 8 {
                    let other = run_matmul(&k, "gemm", format, &dw, n_out, cols, &dx, m);
                    assert_eq!(got, other, "{suffix}: gemv and gemm differ at m = 8");
                }
            }
            if numerics == Numerics::Exact {
                assert!(
                    first_rows.windows(2).all(|w| w[0] == w[1]),
                    "{suffix}: row 0 depends on the number of rows"
                );
            }
        }

        // Paged attention (decode kernel for every query; prefill kernel on one tile) against f64:
        // plain, then with a score soft-cap and a 37-key sliding window (Gemma 2).
        for (softcap, window) in [(0.0f32, 0i32), (5.0, 37)] {
            let label = if window > 0 { " cap+window" } else { "" };
            let (bs, n_blocks) = (16usize, 8usize);
            let kv_dim = nkv * hd;
            let slots = bs * n_blocks;
            let kc = k.round(&random(&mut rng, slots * kv_dim, 1.0));
            let vc = k.round(&random(&mut rng, slots * kv_dim, 1.0));
            let table: Vec<u32> = vec![5, 2, 7, 0, 1, 3, 6, 4];
            let dk = k.act(&kc);
            let dv = k.act(&vc);
            let dt = k.stream.clone_htod(&table).unwrap();
            let nq = 12usize;
            let pos0 = 90usize;
            let q = k.round(&random(&mut rng, nq * width, 1.0));
            let dq = k.act(&q);
            let positions: Vec<i32> = (0..nq).map(|i| (pos0 + i) as i32).collect();
            let dp = k.stream.clone_htod(&positions).unwrap();
            let dti = k.stream.clone_htod(&vec![0i32; nq]).unwrap();
            let head_kv = |j: usize, h: usize, c: &[f32]| -> Vec<f32> {
                let slot = table[j / bs] as usize * bs + j % bs;
                let off = slot * kv_dim + (h / (nh / nkv)) * hd;
                c[off..off + hd].to_vec()
            };
            let mut want = vec![0.0f32; nq * nh * hd];
            for t in 0..nq {
                for h in 0..nh {
                    let keys: Vec<Vec<f32>> = (0..=pos0 + t).map(|j| head_kv(j, h, &kc)).collect();
                    let vals: Vec<Vec<f32>> = (0..=pos0 + t).map(|j| head_kv(j, h, &vc)).collect();
                    let qh = &q[t * width + h * hd..t * width + (h + 1) * hd];
                    let pos = pos0 + t;
                    let first = if window > 0 {
                        (pos + 1).saturating_sub(window as usize)
                    } else {
                        0
                    };
                    let o = attention_ref(qh, &keys, &vals, first, pos, softcap);
                    want[(t * nh + h) * hd..(t * nh + h + 1) * hd].copy_from_slice(&o);
                }
            }
            let scale = 1.0 / (hd as f32).sqrt();
            let (w_i, stride, bs_i, a, b_, c, n) = (
                width as i32,
                n_blocks as i32,
                bs as i32,
                nh as i32,
                nkv as i32,
                hd as i32,
                nq as i32,
            );
            let out = k.act(&vec![0.0; nq * nh * hd]);
            let cfg =
                worker::cuda::launch::attention_decode(nq, nh, hd, pos0 + nq, 48 * 1024).unwrap();
            let mut b = k.stream.launch_builder(&k.funcs["attention_decode"]);
            b.arg(&dq)
                .arg(&w_i)
                .arg(&dp)
                .arg(&dti)
                .arg(&dt)
                .arg(&stride)
                .arg(&dk)
                .arg(&dv);
            b.arg(&bs_i)
                .arg(&a)
                .arg(&b_)
                .arg(&c)
                .arg(&scale)
                .arg(&out)
                .arg(&n)
                .arg(&softcap)
                .arg(&window);
            unsafe { b.launch(cfg) }.unwrap();
            report(
                &format!("attention_decode{label}"),
                rel_err(&k.read_act(&out, want.len()), &want),
                tol.max(1e-4),
            );
            let tiles = [0i32, nq as i32, pos0 as i32, 0];
            let dtiles = k.stream.clone_htod(&tiles).unwrap();
            let out = k.act(&vec![0.0; nq * nh * hd]);
            let mut b = k.stream.launch_builder(&k.funcs["attention_prefill"]);
            b.arg(&dq)
                .arg(&w_i)
                .arg(&dtiles)
                .arg(&dt)
                .arg(&stride)
                .arg(&dk)
                .arg(&dv);
            b.arg(&bs_i).arg(&a).arg(&b_).arg(&c).arg(&scale).arg(&out);
            b.arg(&softcap).arg(&window);
            unsafe { b.launch(worker::cuda::launch::attention_prefill(1, nh)) }.unwrap();
            report(
                &format!("attention_prefill{label}"),
                rel_err(&k.read_act(&out, want.len()), &want),
                tol.max(1e-4),
            );
        }

        // Selection: argmax and top-8 of f32 logits, ties to the lower id.
        let mut logits = random(&mut rng, 3 * 5000, 10.0);
        logits[5000 + 17] = 50.0;
        logits[5000 + 4000] = 50.0;
        let dl = k.stream.clone_htod(&logits).unwrap();
        let ids: CudaSlice<i32> = k.stream.alloc_zeros(3).unwrap();
        let (n, v) = (3i32, 5000i32);
        let mut b = k.stream.launch_builder(&k.funcs["argmax"]);
        b.arg(&dl).arg(&n).arg(&v).arg(&ids);
        unsafe { b.launch(rows_cfg(3, 1024, 0)) }.unwrap();
        let got = k.stream.clone_dtoh(&ids).unwrap();
        let want: Vec<i32> = logits.chunks(5000).map(|r| argmax(r) as i32).collect();
        assert_eq!(got, want, "argmax");
        assert_eq!(got[1], 17);
        let kk = 8i32;
        let tids: CudaSlice<i32> = k.stream.alloc_zeros(24).unwrap();
        let tvals: CudaSlice<f32> = k.stream.alloc_zeros(24).unwrap();
        let mut b = k.stream.launch_builder(&k.funcs["topk"]);
        b.arg(&dl).arg(&n).arg(&v).arg(&kk).arg(&tids).arg(&tvals);
        unsafe { b.launch(rows_cfg(3, 1024, 0)) }.unwrap();
        let got = k.stream.clone_dtoh(&tids).unwrap();
        for (r, row) in logits.chunks(5000).enumerate() {
            let mut order: Vec<usize> = (0..row.len()).collect();
            order.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
            let want: Vec<i32> = order[..8].iter().map(|&i| i as i32).collect();
            assert_eq!(&got[r * 8..r * 8 + 8], &want[..], "topk row {r}");
        }
        println!("{mode:<6} {:<22} {:>12}", "argmax/topk", "exact");
    }
}

/// A reference prompt: name, prompt ids, greedy ids, top-5 `(id, logit)` at the first position.
type Case = (String, Vec<u32>, Vec<u32>, Vec<(usize, f32)>);

fn cases() -> Vec<Case> {
    cases_from("reference.json")
}

/// The prompts of a reference fixture (`fixtures/{name}`: `prompts[]` with `name`, `prompt_ids`,
/// `greedy_ids`, `top5_first`).
fn cases_from(name: &str) -> Vec<Case> {
    let fixture = format!("{}/../fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    let json: Value = serde_json::from_str(&std::fs::read_to_string(fixture).unwrap()).unwrap();
    let ids = |v: &Value| -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    };
    json["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let top5 = p["top5_first"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| {
                    (
                        e[0].as_u64().unwrap() as usize,
                        e[1].as_f64().unwrap() as f32,
                    )
                })
                .collect();
            (
                p["name"].as_str().unwrap_or("?").to_string(),
                ids(&p["prompt_ids"]),
                ids(&p["greedy_ids"]),
                top5,
            )
        })
        .collect()
}

fn load(numerics: Numerics, graphs: bool) -> CudaModel {
    let path = gguf::testing::default_model_path();
    assert!(path.is_file(), "run scripts/fetch-model first");
    CudaModel::load(&path, gpu(), options(numerics, graphs)).expect("loading the model on the GPU")
}

/// Runs every case greedily for `steps` tokens, all cases in one batch when `batched`, else alone.
/// Returns per case the ids and the logits of the first generated position.
fn run_greedy<M: BatchModel>(
    model: &M,
    prompts: &[Vec<u32>],
    steps: usize,
    batched: bool,
) -> Vec<(Vec<u32>, Vec<f32>)> {
    let tables: Vec<Vec<u32>> = prompts
        .iter()
        .scan(0u32, |first, p| {
            let n = (p.len() + steps).div_ceil(BLOCK) as u32;
            let t = (*first..*first + n).collect();
            *first += n;
            Some(t)
        })
        .collect();
    let num_blocks = tables.iter().map(Vec::len).sum();
    let groups: Vec<Vec<usize>> = if batched {
        vec![(0..prompts.len()).collect()]
    } else {
        (0..prompts.len()).map(|i| vec![i]).collect()
    };
    let mut out = vec![(Vec::new(), Vec::new()); prompts.len()];
    for group in groups {
        let mut kv = model.new_kv(num_blocks, BLOCK);
        let entries: Vec<BatchEntry<'_>> = group
            .iter()
            .map(|&i| BatchEntry {
                tokens: &prompts[i],
                start_pos: 0,
                block_table: &tables[i],
                want_logits: true,
            })
            .collect();
        let mut logits = model.forward_batch(&entries, &mut kv).expect("prefill");
        for (&i, l) in group.iter().zip(&logits) {
            out[i].1 = l.clone();
        }
        for step in 0..steps {
            let next: Vec<u32> = logits.iter().map(|l| argmax(l) as u32).collect();
            for (&i, &n) in group.iter().zip(&next) {
                out[i].0.push(n);
            }
            if step + 1 == steps {
                break;
            }
            let entries: Vec<BatchEntry<'_>> = group
                .iter()
                .zip(&next)
                .map(|(&i, n)| BatchEntry {
                    tokens: std::slice::from_ref(n),
                    start_pos: prompts[i].len() + step,
                    block_table: &tables[i],
                    want_logits: true,
                })
                .collect();
            logits = model.forward_batch(&entries, &mut kv).expect("decode");
        }
    }
    out
}

#[test]
#[ignore = "needs an NVIDIA GPU (scripts/gpu-check)"]
fn reference_prompts_exact() {
    let model = load(Numerics::Exact, true);
    let cases = cases();
    let prompts: Vec<Vec<u32>> = cases.iter().map(|c| c.1.clone()).collect();
    let steps = cases[0].2.len();
    let started = Instant::now();
    let alone = run_greedy(&model, &prompts, steps, false);
    let batched = run_greedy(&model, &prompts, steps, true);
    let mut max_err = 0.0f32;
    for ((case, a), b) in cases.iter().zip(&alone).zip(&batched) {
        for &(id, value) in &case.3 {
            max_err = max_err.max((a.1[id] - value).abs());
        }
        assert_eq!(a.0, case.2, "{}: greedy ids (alone)", case.0);
        assert_eq!(b.0, case.2, "{}: greedy ids (batch of 8)", case.0);
    }
    println!(
        "reference prompts, exact: 8/8 token-exact alone and batched, max top-5 logit error {max_err:.2e}, {:.1}s",
        started.elapsed().as_secs_f32()
    );
    assert!(max_err <= 1e-3, "top-5 logit error {max_err}");
}

#[test]
#[ignore = "needs an NVIDIA GPU (scripts/gpu-check)"]
fn batch_invariance_64_streams() {
    let cases = cases();
    // 64 streams: the 8 prompts, each also cut short by 1..7 tokens.
    let prompts: Vec<Vec<u32>> = (0..64)
        .map(|i| {
            let p = &cases[i % 8].1;
            p[..p.len() - (i / 8).min(p.len() - 1)].to_vec()
        })
        .collect();
    let steps = 12;
    let graphs = load(Numerics::Exact, true);
    let together = run_greedy(&graphs, &prompts, steps, true);
    drop(graphs);
    let eager = load(Numerics::Exact, false);
    let alone = run_greedy(&eager, &prompts, steps, false);
    for (i, (t, a)) in together.iter().zip(&alone).enumerate() {
        assert_eq!(
            t.0, a.0,
            "stream {i}: ids differ between 64 together and alone"
        );
        assert!(
            t.1 == a.1,
            "stream {i}: first logits differ bitwise between 64 together and alone"
        );
    }
    println!("batch invariance, exact: 64 streams x {steps} steps bitwise equal to solo runs");
}

#[test]
#[ignore = "needs an NVIDIA GPU (scripts/gpu-check)"]
fn fast_mode_divergence() {
    let model = load(Numerics::Fast, true);
    let cases = cases();
    let prompts: Vec<Vec<u32>> = cases.iter().map(|c| c.1.clone()).collect();
    let steps = cases[0].2.len();
    let got = run_greedy(&model, &prompts, steps, true);
    let (mut same, mut total, mut max_err, mut exact_prompts) = (0, 0, 0.0f32, 0);
    for (case, g) in cases.iter().zip(&got) {
        let prefix = g.0.iter().zip(&case.2).take_while(|(a, b)| a == b).count();
        same += prefix;
        total += case.2.len();
        exact_prompts += usize::from(prefix == case.2.len());
        for &(id, value) in &case.3 {
            max_err = max_err.max((g.1[id] - value).abs());
        }
    }
    println!(
        "fast mode: {exact_prompts}/8 prompts token-exact, {same}/{total} ids before the first divergence, max top-5 logit error {max_err:.3}"
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU (scripts/gpu-check)"]
fn tiny_model_against_cpu() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    gguf::testing::write_tiny_llama(&path, 1).unwrap();
    let cpu = worker::model::CpuModel::load(&path).unwrap();
    let vocab = cpu.vocab_size() as u32;
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let prompts: Vec<Vec<u32>> = (0..64)
        .map(|_| {
            let n = rng.random_range(1..40);
            (0..n).map(|_| rng.random_range(0..vocab)).collect()
        })
        .collect();
    let steps = 8;
    let want = run_greedy(&cpu, &prompts, steps, true);
    for numerics in [Numerics::Exact, Numerics::Fast] {
        let model = CudaModel::load(&path, gpu(), options(numerics, true)).unwrap();
        let together = run_greedy(&model, &prompts, steps, true);
        let (mut worst, mut same_ids) = (0.0f32, 0);
        for (g, w) in together.iter().zip(&want) {
            worst = worst.max(rel_err(&g.1, &w.1));
            same_ids += usize::from(g.0 == w.0);
        }
        println!(
            "tiny model, {}: first-position logits max rel err {worst:.2e} vs CPU, {same_ids}/64 streams with the CPU's greedy ids",
            numerics.as_str()
        );
        if numerics == Numerics::Exact {
            assert!(
                worst <= 1e-4,
                "exact: logits differ from the CPU by {worst}"
            );
            drop(model);
            let eager = CudaModel::load(&path, gpu(), options(numerics, false)).unwrap();
            let alone = run_greedy(&eager, &prompts, steps, false);
            for (i, (t, a)) in together.iter().zip(&alone).enumerate() {
                assert!(
                    t.0 == a.0 && t.1 == a.1,
                    "tiny stream {i}: batch of 64 != alone"
                );
            }
        }
    }
}
