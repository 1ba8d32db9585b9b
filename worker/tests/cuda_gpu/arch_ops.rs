//! The per-architecture kernels and models on a GPU (part of `cuda_gpu`; `#[ignore]`d, run by
//! `scripts/gpu-check`):
//!
//! - `arch_kernels_against_cpu`: GeGLU, Q/K/V bias, per-head q/k RMSNorm, half-split RoPE with
//!   frequency factors and position scale, logit soft-cap, the post-norm residual (`rmsnorm` with
//!   `accumulate`) and the embedding scale against the CPU's functions, both numeric modes.
//! - `tiny_architectures_against_cpu`: the tiny models of `fixtures/tiny-arch/` (qwen2, qwen3,
//!   llama3 RoPE, gemma2, phi3; F32 GGUF) through the CPU model and the CUDA model: greedy ids equal
//!   and first logits within 1e-4 in exact mode, batched bitwise equal to alone.
//! - `gemma3_270m_reference_exact`: Gemma 3 270M Q4_K_M (k-quants, sliding window, head size 256)
//!   against `fixtures/gemma3-270m.json` in exact mode: greedy ids token-exact, top-5 logits
//!   within 1e-3, alone and batched.

use backend_cpu::ops::{
    gated_into, rms_norm, rms_norm_chunks_in_place, softcap_in_place, RopeTable,
};
use backend_cpu::{AlignedVec, CpuModel};
use backend_cuda::{CudaModel, Numerics};
use cudarc::driver::{LaunchConfig, PushKernelArg};
use engine::backend::BatchModel;
use gguf::GgmlType;
use model_desc::{Activation, RopeStyle};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde_json::Value;

use super::common::{cases_from, gpu, options, random, rel_err, rows_cfg, run_greedy, Kernels};
use super::formats::weight_bytes;

fn elementwise(total: usize) -> LaunchConfig {
    backend_cuda::launch::elementwise(total)
}

#[test]
#[ignore = "needs an NVIDIA GPU (scripts/gpu-check)"]
fn arch_kernels_against_cpu() {
    let gpu = gpu();
    for numerics in [Numerics::Exact, Numerics::Fast] {
        let k = Kernels::load(&gpu, numerics);
        let mode = numerics.as_str();
        let exact = numerics == Numerics::Exact;
        let tol = if exact { 1e-5 } else { 2e-2 };
        // In exact mode these kernels use the CPU's operations in the CPU's order: bitwise.
        let report = |name: &str, got: &[f32], want: &[f32], bitwise: bool| {
            let err = rel_err(got, want);
            println!("{mode:<6} {name:<22} {err:>12.3e}");
            if exact && bitwise {
                let same = got
                    .iter()
                    .zip(want)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(
                    same,
                    "{mode} {name}: not bitwise the CPU's (rel. error {err})"
                );
            }
            assert!(err <= tol, "{mode} {name}: relative error {err} > {tol}");
        };
        let mut rng = ChaCha8Rng::seed_from_u64(13);
        let (nh, nkv, hd, rows) = (8usize, 2usize, 128usize, 5usize);
        let width = (nh + 2 * nkv) * hd;
        let (n, w_i, a, b_, c) = (rows as i32, width as i32, nh as i32, nkv as i32, hd as i32);

        // GeGLU.
        let ffn = 1000usize;
        let gu = k.round(&random(&mut rng, rows * 2 * ffn, 6.0));
        let (dg, out) = (k.act(&gu), k.act(&vec![0.0; rows * ffn]));
        let f = ffn as i32;
        let mut b = k.stream.launch_builder(&k.funcs["geglu"]);
        b.arg(&dg).arg(&n).arg(&f).arg(&out);
        unsafe { b.launch(elementwise(rows * ffn)) }.unwrap();
        let mut want = AlignedVec::new();
        gated_into(&gu, ffn, Activation::GeluTanh, &mut want);
        // expf on the GPU and f32::exp may differ in the last bit: not bitwise.
        report(
            "geglu",
            &k.read_act(&out, rows * ffn),
            &k.round(&want),
            false,
        );

        // Q/K/V bias.
        let qkv = k.round(&random(&mut rng, rows * width, 2.0));
        let bias = random(&mut rng, width, 0.5);
        let (dq, dbias) = (k.act(&qkv), k.stream.clone_htod(&bias).unwrap());
        let mut b = k.stream.launch_builder(&k.funcs["bias_add"]);
        b.arg(&dq).arg(&dbias).arg(&n).arg(&w_i);
        unsafe { b.launch(elementwise(rows * width)) }.unwrap();
        let want: Vec<f32> = qkv
            .iter()
            .enumerate()
            .map(|(i, x)| x + bias[i % width])
            .collect();
        report(
            "bias_add",
            &k.read_act(&dq, want.len()),
            &k.round(&want),
            true,
        );

        // Per-head q/k RMSNorm (V untouched).
        let qkv = k.round(&random(&mut rng, rows * width, 3.0));
        let (qn, kn) = (random(&mut rng, hd, 1.5), random(&mut rng, hd, 1.5));
        let dq = k.act(&qkv);
        let (dqn, dkn) = (
            k.stream.clone_htod(&qn).unwrap(),
            k.stream.clone_htod(&kn).unwrap(),
        );
        let eps = 1e-6f32;
        let mut b = k.stream.launch_builder(&k.funcs["head_rmsnorm"]);
        b.arg(&dq)
            .arg(&dqn)
            .arg(&dkn)
            .arg(&n)
            .arg(&w_i)
            .arg(&a)
            .arg(&b_)
            .arg(&c)
            .arg(&eps);
        unsafe { b.launch(backend_cuda::launch::head_rmsnorm(rows)) }.unwrap();
        let mut want = qkv.clone();
        for row in want.chunks_exact_mut(width) {
            rms_norm_chunks_in_place(&mut row[..nh * hd], &qn, eps);
            rms_norm_chunks_in_place(&mut row[nh * hd..(nh + nkv) * hd], &kn, eps);
        }
        report(
            "head_rmsnorm",
            &k.read_act(&dq, want.len()),
            &k.round(&want),
            true,
        );

        // Half-split RoPE with frequency factors and a position scale (and adjacent pairs with
        // factors), against RopeTable::with_options.
        for style in [RopeStyle::Neox, RopeStyle::Interleaved] {
            let positions = [0i32, 5, 77, 4000, 131_000];
            let qkv = k.round(&random(&mut rng, positions.len() * width, 2.0));
            let factors: Vec<f32> = (0..hd / 2).map(|i| 1.0 + (i % 7) as f32 * 1.5).collect();
            let (base, pos_scale) = (500_000f32, 0.25f32);
            let neox = i32::from(style == RopeStyle::Neox);
            let dq = k.act(&qkv);
            let dp = k.stream.clone_htod(&positions).unwrap();
            let df = k.stream.clone_htod(&factors).unwrap();
            let np = positions.len() as i32;
            let mut b = k.stream.launch_builder(&k.funcs["rope"]);
            b.arg(&dq)
                .arg(&dp)
                .arg(&np)
                .arg(&w_i)
                .arg(&a)
                .arg(&b_)
                .arg(&c);
            b.arg(&base).arg(&pos_scale).arg(&df).arg(&neox);
            unsafe { b.launch(rows_cfg(positions.len(), 128, 0)) }.unwrap();
            let table = RopeTable::with_options(
                positions.iter().map(|&p| p as usize),
                hd,
                base,
                pos_scale,
                Some(&factors),
            );
            let mut want = qkv.clone();
            for (t, row) in want.chunks_exact_mut(width).enumerate() {
                table.apply_style(style, &mut row[..(nh + nkv) * hd], t);
            }
            let name = format!("rope {style:?} factors");
            // The angle goes through f64 pow/cos/sin, which may round differently by an ulp.
            report(&name, &k.read_act(&dq, want.len()), &k.round(&want), false);
        }

        // Final logit soft-cap (f32 logits in both modes).
        let logits = random(&mut rng, 3 * 5000, 80.0);
        let dl = k.stream.clone_htod(&logits).unwrap();
        let (total, cap) = (logits.len() as i32, 30.0f32);
        let mut b = k.stream.launch_builder(&k.funcs["softcap"]);
        b.arg(&dl).arg(&total).arg(&cap);
        unsafe { b.launch(elementwise(logits.len())) }.unwrap();
        let mut want = logits.clone();
        softcap_in_place(&mut want, cap);
        let got = k.stream.clone_dtoh(&dl).unwrap();
        let err = rel_err(&got, &want);
        println!("{mode:<6} {:<22} {err:>12.3e}", "softcap");
        assert!(err <= 1e-6, "softcap: relative error {err}");

        // Post-norm residual: x += rmsnorm(y) * w.
        let hidden = 640usize;
        let x = k.round(&random(&mut rng, rows * hidden, 2.0));
        let y = k.round(&random(&mut rng, rows * hidden, 5.0));
        let wt = random(&mut rng, hidden, 1.0);
        let (dx, dy, dw) = (k.act(&x), k.act(&y), k.stream.clone_htod(&wt).unwrap());
        let (dim, eps, acc) = (hidden as i32, 1e-6f32, 1i32);
        let mut b = k.stream.launch_builder(&k.funcs["rmsnorm"]);
        b.arg(&dy)
            .arg(&dw)
            .arg(&n)
            .arg(&dim)
            .arg(&eps)
            .arg(&dx)
            .arg(&acc);
        unsafe { b.launch(backend_cuda::launch::rmsnorm(rows)) }.unwrap();
        let normed = rms_norm(&y, &wt, eps);
        let want: Vec<f32> = x.iter().zip(&normed).map(|(a, b)| a + b).collect();
        report(
            "rmsnorm accumulate",
            &k.read_act(&dx, want.len()),
            &k.round(&want),
            false,
        );

        // Embedding scale (Gemma: sqrt(hidden)), one product after the decode.
        let table = weight_bytes(GgmlType::Q6_K, &mut rng, 4, 768);
        let tokens = [3u32, 0, 1];
        let (dt, dtok) = (
            k.stream.clone_htod(&table).unwrap(),
            k.stream.clone_htod(&tokens).unwrap(),
        );
        let out = k.act(&vec![0.0; 3 * 768]);
        let (nt, fmt, h, scale) = (3i32, GgmlType::Q6_K.id() as i32, 768i32, (640f32).sqrt());
        let mut b = k.stream.launch_builder(&k.funcs["embedding"]);
        b.arg(&dtok)
            .arg(&nt)
            .arg(&dt)
            .arg(&fmt)
            .arg(&h)
            .arg(&scale)
            .arg(&out);
        unsafe { b.launch(rows_cfg(3, 128, 0)) }.unwrap();
        let all = gguf::dequantize_to_vec(GgmlType::Q6_K, &table, 4 * 768).unwrap();
        let want: Vec<f32> = tokens
            .iter()
            .flat_map(|&t| {
                all[t as usize * 768..(t as usize + 1) * 768]
                    .iter()
                    .map(|v| v * scale)
            })
            .collect();
        report(
            "embedding scale",
            &k.read_act(&out, want.len()),
            &k.round(&want),
            true,
        );
    }
}

/// The reference sequences of `fixtures/tiny-arch/{arch}/reference.json` (input ids).
fn tiny_prompts(arch: &str) -> Vec<Vec<u32>> {
    let path = format!(
        "{}/../fixtures/tiny-arch/{arch}/reference.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let json: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    json["sequences"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            s["input_ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect()
        })
        .collect()
}

#[test]
#[ignore = "needs an NVIDIA GPU (scripts/gpu-check)"]
fn tiny_architectures_against_cpu() {
    for arch in ["qwen2", "qwen3", "llama3rope", "gemma2", "phi3"] {
        let path = std::path::PathBuf::from(format!(
            "{}/../fixtures/tiny-arch/{arch}/{arch}-f32.gguf",
            env!("CARGO_MANIFEST_DIR")
        ));
        let cpu = CpuModel::load(&path).unwrap();
        let mut prompts = tiny_prompts(arch);
        // Also a prompt longer than gemma2's sliding window.
        let vocab = cpu.vocab_size() as u32;
        prompts.push((0..200u32).map(|i| (i * 7919) % vocab).collect());
        let steps = 10;
        let want = run_greedy(&cpu, &prompts, steps, true);
        for numerics in [Numerics::Exact, Numerics::Fast] {
            let model = CudaModel::load(&path, gpu(), options(numerics, true))
                .unwrap_or_else(|e| panic!("{arch}: {e:#}"));
            let together = run_greedy(&model, &prompts, steps, true);
            let (mut worst, mut same_ids) = (0.0f32, 0);
            for (g, w) in together.iter().zip(&want) {
                worst = worst.max(rel_err(&g.1, &w.1));
                same_ids += usize::from(g.0 == w.0);
            }
            println!(
                "tiny {arch}, {}: first logits max rel err {worst:.2e} vs CPU, {same_ids}/{} sequences with the CPU's ids",
                numerics.as_str(),
                prompts.len()
            );
            if numerics == Numerics::Exact {
                assert!(
                    worst <= 1e-4,
                    "{arch}: logits differ from the CPU by {worst}"
                );
                assert_eq!(
                    same_ids,
                    prompts.len(),
                    "{arch}: greedy ids differ from the CPU"
                );
                let alone = run_greedy(&model, &prompts, steps, false);
                for (i, (t, a)) in together.iter().zip(&alone).enumerate() {
                    assert!(
                        t.0 == a.0 && t.1 == a.1,
                        "{arch} sequence {i}: batched != alone"
                    );
                }
            }
        }
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU (scripts/gpu-check)"]
fn gemma3_270m_reference_exact() {
    let path = gguf::testing::gemma3_model_path();
    assert!(path.is_file(), "run scripts/fetch-model gemma3-270m first");
    let cases = cases_from("gemma3-270m.json");
    let model = CudaModel::load(&path, gpu(), options(Numerics::Exact, true)).unwrap();
    let prompts: Vec<Vec<u32>> = cases.iter().map(|c| c.1.clone()).collect();
    let steps = cases[0].2.len();
    let alone = run_greedy(&model, &prompts, steps, false);
    let batched = run_greedy(&model, &prompts, steps, true);
    let mut max_err = 0.0f32;
    for (i, ((case, a), b)) in cases.iter().zip(&alone).zip(&batched).enumerate() {
        for &(id, value) in &case.3 {
            max_err = max_err.max((a.1[id] - value).abs());
        }
        assert_eq!(a.0, case.2, "{} ({i}): greedy ids (alone)", case.0);
        assert_eq!(b.0, case.2, "{} ({i}): greedy ids (batched)", case.0);
        assert!(
            a.1 == b.1,
            "{}: first logits differ batched vs alone",
            case.0
        );
    }
    println!(
        "gemma3 270M, exact: {}/{} prompts token-exact alone and batched, max top-5 logit error {max_err:.2e}",
        cases.len(),
        cases.len()
    );
    assert!(max_err <= 1e-3, "top-5 logit error {max_err}");
}
