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

use std::time::Instant;

use backend_cuda::{CudaModel, Numerics};
use engine::backend::BatchModel;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

#[path = "cuda_gpu/arch_ops.rs"]
mod arch_ops;
#[path = "common/attention_ref.rs"]
mod attention_ref;
#[path = "cuda_gpu/common.rs"]
mod common;
#[path = "cuda_gpu/formats.rs"]
mod formats;
#[path = "cuda_gpu/kernels.rs"]
mod kernels;
use common::{cases, gpu, load, options, rel_err, run_greedy};

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
    let cpu = backend_cpu::CpuModel::load(&path).unwrap();
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
