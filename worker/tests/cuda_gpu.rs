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
use worker::backend::cpu::matmul::matmul;
use worker::backend::cpu::ops::{rms_norm, swiglu, RopeTable};
use worker::backend::cpu::QMatrix;
use worker::backend::cuda::cache::{cache_dir, ModuleCache};
use worker::backend::cuda::kernels::FILES;
use worker::backend::cuda::{probe, CudaModel, CudaOptions, GpuInfo, Numerics};
use worker::backend::{BatchEntry, BatchModel, Logits};
use worker::sampler::argmax;

#[path = "cuda_gpu/arch_ops.rs"]
mod arch_ops;
#[path = "cuda_gpu/formats.rs"]
mod formats;
#[path = "cuda_gpu/kernels.rs"]
mod kernels;
use formats::{embed_tokens, encode, fixture_blocks, run_embedding, weight_bytes, ALL_FORMATS};
#[path = "common/attention_ref.rs"]
mod attention_ref;
use attention_ref::attention_ref;

const BLOCK: usize = 16;

fn gpu() -> GpuInfo {
    probe(0).unwrap_or_else(|e| panic!("these tests need a GPU: {e}"))
}

fn options(numerics: Numerics, graphs: bool) -> CudaOptions {
    CudaOptions {
        verified_only: false,
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
    let suffix = worker::backend::cuda::weights::format_suffix(format).unwrap();
    let kind = if prefix == "gemv" {
        worker::backend::cuda::launch::MatmulKernel::Gemv
    } else {
        worker::backend::cuda::launch::MatmulKernel::Gemm
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
        let mut logits = Logits::new();
        model
            .forward_batch(&entries, &mut kv, &mut logits)
            .expect("prefill");
        for (&i, l) in group.iter().zip(logits.iter()) {
            out[i].1 = l.to_vec();
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
            model
                .forward_batch(&entries, &mut kv, &mut logits)
                .expect("decode");
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
    let cpu = worker::backend::cpu::CpuModel::load(&path).unwrap();
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
