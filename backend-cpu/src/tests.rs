//! Batch-invariance and validation tests of [`CpuModel::forward_batch`] on the tiny random model
//! (2 layers, hidden 64, 4 query / 2 KV heads of 16, context 256).

use super::{CpuModel, KvDtype, Numerics, PagedKvCache};
use engine::backend::BatchEntry;
use engine::backend::ModelError;

fn tiny() -> (tempfile::TempDir, CpuModel) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    gguf::testing::write_tiny_llama(&path, 42).unwrap();
    let model = CpuModel::load(&path).unwrap();
    (dir, model)
}

fn entry<'a>(tokens: &'a [u32], start_pos: usize, table: &'a [u32], want: bool) -> BatchEntry<'a> {
    BatchEntry {
        tokens,
        start_pos,
        block_table: table,
        logit_tokens: usize::from(want),
    }
}

/// Runs `prompt` alone in consecutive chunks of the given sizes (which must sum to its length)
/// and returns the logits of the last token.
fn run_chunked(
    model: &CpuModel,
    kv: &mut PagedKvCache,
    prompt: &[u32],
    chunks: &[usize],
    table: &[u32],
) -> Vec<f32> {
    assert_eq!(chunks.iter().sum::<usize>(), prompt.len());
    let mut start = 0;
    let mut last = Vec::new();
    for &c in chunks {
        let want = start + c == prompt.len();
        let mut out = model
            .forward_batch(&[entry(&prompt[start..start + c], start, table, want)], kv)
            .unwrap();
        assert_eq!(out.len(), usize::from(want));
        if want {
            last = out.pop().unwrap();
        }
        start += c;
    }
    last
}

/// The keys and values of positions `0..len` of a sequence, all layers, in logical order.
fn seq_kv(kv: &PagedKvCache, table: &[u32], len: usize) -> Vec<f32> {
    let mut out = Vec::new();
    for l in 0..kv.n_layers() {
        for pos in 0..len {
            out.extend(kv.key(l, kv.slot(table, pos)));
            out.extend(kv.value(l, kv.slot(table, pos)));
        }
    }
    out
}

/// Bit patterns, so that comparisons are exact even for NaN or signed zeros.
fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn snapshot(kv: &PagedKvCache) -> Vec<u32> {
    (0..kv.n_layers())
        .flat_map(|l| {
            let (k, v) = kv.layer(l).to_f32();
            bits(&k).into_iter().chain(bits(&v))
        })
        .collect()
}

/// Whether an error is the expected one.
type ErrorCheck = fn(&ModelError) -> bool;

const PROMPT: [u32; 10] = [1, 40, 77, 100, 200, 5, 9, 250, 255, 33];

fn chunking_is_bitwise_invariant_with(model: &CpuModel) {
    let table = [0u32, 1, 2];
    let mut whole = model.new_kv(3, 4);
    let a = run_chunked(model, &mut whole, &PROMPT, &[10], &table);
    let mut split = model.new_kv(3, 4);
    let b = run_chunked(model, &mut split, &PROMPT, &[4, 6], &table);
    let mut one = model.new_kv(3, 4);
    let c = run_chunked(model, &mut one, &PROMPT, &[1; 10], &table);
    assert_eq!(bits(&a), bits(&b));
    assert_eq!(bits(&a), bits(&c));
    assert_eq!(snapshot(&whole), snapshot(&split));
    assert_eq!(snapshot(&whole), snapshot(&one));

    // Every position's logits: token by token vs a prefix prefill followed by one decode step.
    let mut stepwise = Vec::new();
    let mut kv = model.new_kv(3, 4);
    for (p, t) in PROMPT.iter().enumerate() {
        let out = model
            .forward_batch(&[entry(std::slice::from_ref(t), p, &table, true)], &mut kv)
            .unwrap();
        stepwise.push(bits(&out[0]));
    }
    for split in 1..PROMPT.len() {
        let mut kv = model.new_kv(3, 4);
        let mut chunks = vec![split];
        chunks.extend(std::iter::repeat_n(1, PROMPT.len() - split));
        let prefill = run_chunked(model, &mut kv, &PROMPT[..split], &[split], &table);
        assert_eq!(bits(&prefill), stepwise[split - 1], "prefill of {split}");
        let last = run_chunked(model, &mut model.new_kv(3, 4), &PROMPT, &chunks, &table);
        assert_eq!(bits(&last), stepwise[PROMPT.len() - 1], "split {split}");
    }

    // Several positions scored in one pass (speculative verification, prompt logprobs): each row
    // is that position's stepwise logits, whether the entry runs alone or beside another one.
    for start in [0, 3, 7] {
        for n in 1..=PROMPT.len() - start {
            let mut kv = model.new_kv(6, 4);
            run_chunked(
                model,
                &mut kv,
                &PROMPT[..start.max(1)],
                &[start.max(1)],
                &table,
            );
            let (tokens, pos) = if start == 0 {
                (&PROMPT[..], 0)
            } else {
                (&PROMPT[start..], start)
            };
            let mut e = entry(tokens, pos, &table, true);
            e.logit_tokens = n;
            let other = entry(&PROMPT[..5], 0, &[3, 4], true);
            let out = model.forward_batch(&[other, e], &mut kv).unwrap();
            assert_eq!(out.len(), n + 1, "start {start}, {n} rows");
            for (i, row) in out[1..].iter().enumerate() {
                let p = pos + tokens.len() - n + i;
                assert_eq!(
                    bits(row),
                    stepwise[p],
                    "start {start}, {n} rows, position {p}"
                );
            }
        }
    }
}

fn batched_sequences_match_running_alone_with(model: &CpuModel) {
    let a: Vec<u32> = (0..7).map(|i| (i * 31 + 4) % 259).collect();
    let b: Vec<u32> = (0..12).map(|i| (i * 17 + 90) % 259).collect();
    let (ta, tb) = ([0u32, 1], [2u32, 3, 4]);
    // Alone, each in its own cache.
    let mut kv_a = model.new_kv(5, 4);
    let alone_a = run_chunked(model, &mut kv_a, &a, &[7], &ta);
    let next_a = model
        .forward_batch(&[entry(&[8], 7, &ta, true)], &mut kv_a)
        .unwrap();
    let mut kv_b = model.new_kv(5, 4);
    let alone_b = run_chunked(model, &mut kv_b, &b, &[12], &tb);

    // Together: step 1 = A's prefill beside the first 5 tokens of B (no logits wanted for B);
    // step 2 = A's decode beside B's remaining 7 tokens.
    let mut kv = model.new_kv(5, 4);
    let out = model
        .forward_batch(
            &[entry(&b[..5], 0, &tb, false), entry(&a, 0, &ta, true)],
            &mut kv,
        )
        .unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(bits(&out[0]), bits(&alone_a));
    let out = model
        .forward_batch(
            &[entry(&[8], 7, &ta, true), entry(&b[5..], 5, &tb, true)],
            &mut kv,
        )
        .unwrap();
    assert_eq!(out.len(), 2);
    assert_eq!(bits(&out[0]), bits(&next_a[0]));
    assert_eq!(bits(&out[1]), bits(&alone_b));
    assert_eq!(seq_kv(&kv, &ta, 8), seq_kv(&kv_a, &ta, 8));
    assert_eq!(seq_kv(&kv, &tb, 12), seq_kv(&kv_b, &tb, 12));
}

fn shared_prefix_blocks_give_identical_results_with(model: &CpuModel) {
    let prompt: Vec<u32> = (0..11).map(|i| (i * 53 + 7) % 259).collect();
    // Reference: the second sequence computes everything itself, in its own cache.
    let mut own = model.new_kv(3, 4);
    let want = run_chunked(model, &mut own, &prompt, &[11], &[0, 1, 2]);

    // A computes the whole prompt; B shares A's two full blocks (positions 0..8) and runs only
    // positions 8..11 in its own third block.
    let (ta, tb) = ([5u32, 2, 7], [5u32, 2, 9]);
    let mut kv = model.new_kv(10, 4);
    let a = run_chunked(model, &mut kv, &prompt, &[11], &ta);
    let b = model
        .forward_batch(&[entry(&prompt[8..], 8, &tb, true)], &mut kv)
        .unwrap();
    assert_eq!(bits(&a), bits(&want));
    assert_eq!(bits(&b[0]), bits(&want));
    assert_eq!(seq_kv(&kv, &tb, 11), seq_kv(&own, &[0, 1, 2], 11));

    // Sharing blocks that another entry of the same batch is writing in this very step.
    let mut kv = model.new_kv(10, 4);
    let out = model
        .forward_batch(
            &[
                entry(&prompt[..8], 0, &ta, true),
                entry(&prompt[8..], 8, &tb, true),
            ],
            &mut kv,
        )
        .unwrap();
    assert_eq!(bits(&out[1]), bits(&want));
    let mut alone8 = model.new_kv(3, 4);
    let a8 = run_chunked(model, &mut alone8, &prompt[..8], &[8], &[0, 1, 2]);
    assert_eq!(bits(&out[0]), bits(&a8));
}

fn shuffled_block_ids_match_contiguous_with(model: &CpuModel) {
    let prompt: Vec<u32> = (0..14).map(|i| (i * 71 + 3) % 259).collect();
    let mut contiguous = model.new_kv(5, 3);
    let want = run_chunked(model, &mut contiguous, &prompt, &[6, 8], &[0, 1, 2, 3, 4]);
    let shuffled = [7u32, 0, 12, 3, 9];
    let mut kv = model.new_kv(13, 3);
    let got = run_chunked(model, &mut kv, &prompt, &[5, 1, 8], &shuffled);
    assert_eq!(bits(&got), bits(&want));
    assert_eq!(
        seq_kv(&kv, &shuffled, 14),
        seq_kv(&contiguous, &[0, 1, 2, 3, 4], 14)
    );
    // Blocks outside the table are untouched.
    for block in [1usize, 2, 4, 5, 6, 8, 10, 11] {
        for s in block * 3..(block + 1) * 3 {
            assert!(kv.key(0, s).iter().all(|&v| v == 0.0));
        }
    }
}

#[test]
fn validation_errors_leave_the_cache_untouched() {
    let (_dir, model) = tiny();
    let (vocab, ctx) = (
        model.config().vocab_size as u32,
        model.config().context_length,
    );
    let table = [0u32, 1];
    let mut kv = model.new_kv(4, 4);
    run_chunked(&model, &mut kv, &[1, 2, 3], &[3], &table);
    let before = snapshot(&kv);
    let ok = entry(&[4], 3, &table, true);
    let long_table: Vec<u32> = (0..=(ctx / 4) as u32).collect();
    let mut big = model.new_kv(ctx / 4 + 1, 4);
    let bad_token = [5, vocab];
    let cases: Vec<(Vec<BatchEntry<'_>>, ErrorCheck)> = vec![
        (vec![ok, entry(&[], 4, &[2], true)], |e| {
            matches!(e, ModelError::EmptyInput { entry: 1 })
        }),
        (
            vec![BatchEntry {
                logit_tokens: 2,
                ..ok
            }],
            |e| {
                matches!(
                    e,
                    ModelError::TooManyLogitTokens {
                        entry: 0,
                        logit_tokens: 2,
                        tokens: 1
                    }
                )
            },
        ),
        (
            vec![ok, entry(&bad_token, 0, &[2], true)],
            |e| matches!(e, ModelError::TokenOutOfRange { entry: 1, token, vocab_size } if *token as usize == *vocab_size),
        ),
        (vec![ok, entry(&[5; 5], 0, &[2], true)], |e| {
            matches!(
                e,
                ModelError::BlockTableTooShort {
                    entry: 1,
                    needed: 2,
                    have: 1
                }
            )
        }),
        (vec![ok, entry(&[5], 4, &[2, 4], true)], |e| {
            matches!(
                e,
                ModelError::BlockOutOfRange {
                    entry: 1,
                    block: 4,
                    num_blocks: 4
                }
            )
        }),
        (vec![ok, entry(&[5], 3, &[0], true)], |e| {
            matches!(
                e,
                ModelError::SlotConflict {
                    slot: 3,
                    first: 0,
                    second: 1
                }
            )
        }),
        (vec![entry(&[5; 5], 0, &[3, 3], true)], |e| {
            matches!(e, ModelError::SlotConflict { slot: 12, .. })
        }),
    ];
    for (i, (batch, check)) in cases.iter().enumerate() {
        let err = model.forward_batch(batch, &mut kv).unwrap_err();
        assert!(check(&err), "case {i}: {err}");
        assert_eq!(snapshot(&kv), before, "case {i} wrote to the cache");
    }

    // Positions past the context: checked before the block table.
    let err = model
        .forward_batch(&[entry(&[5, 6], ctx - 1, &long_table, true)], &mut big)
        .unwrap_err();
    assert!(
        matches!(err, ModelError::ContextOverflow { entry: 0, needed, .. } if needed == ctx + 1),
        "{err}"
    );
    assert!(snapshot(&big).iter().all(|&b| b == 0));
    // Exactly filling the context is allowed.
    let fill = vec![3u32; ctx];
    let out = model
        .forward_batch(&[entry(&fill, 0, &long_table, true)], &mut big)
        .unwrap();
    assert_eq!(out.len(), 1);

    // A cache of another shape.
    let mut other = PagedKvCache::new(2, 8, 4, 4);
    let err = model.forward_batch(&[ok], &mut other).unwrap_err();
    assert!(matches!(err, ModelError::CacheMismatch(_)), "{err}");

    // The valid entry alone still runs.
    assert_eq!(model.forward_batch(&[ok], &mut kv).unwrap().len(), 1);
}

#[test]
fn logits_are_finite_and_vary_and_follow_want_logits() {
    let (_dir, model) = tiny();
    let mut kv = model.new_kv(4, 4);
    assert!(model.forward_batch(&[], &mut kv).unwrap().is_empty());
    let logits = model
        .forward_batch(&[entry(&[1, 72, 105], 0, &[0], true)], &mut kv)
        .unwrap();
    assert_eq!(logits.len(), 1);
    let logits = &logits[0];
    assert_eq!(logits.len(), model.config().vocab_size);
    assert!(logits.iter().all(|v| v.is_finite()));
    let max = logits.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let min = logits.iter().fold(f32::INFINITY, |a, &b| a.min(b));
    assert!(max - min > 0.1, "spread {}", max - min);
    // No entry wants logits: K/V are still written.
    let none = model
        .forward_batch(&[entry(&[9, 10], 0, &[1], false)], &mut kv)
        .unwrap();
    assert!(none.is_empty());
    assert!(kv.key(1, 5).iter().any(|&v| v != 0.0));
}

#[test]
fn chunking_is_bitwise_invariant() {
    let (_dir, model) = tiny();
    chunking_is_bitwise_invariant_with(&model);
}

/// The same invariance with an f16 KV cache: rounding on write is per element, so it holds bitwise.
#[test]
fn chunking_is_bitwise_invariant_f16_kv() {
    let (_dir, model) = tiny();
    chunking_is_bitwise_invariant_with(&model.with_kv_dtype(KvDtype::F16));
}

#[test]
fn batched_sequences_match_running_alone() {
    let (_dir, model) = tiny();
    batched_sequences_match_running_alone_with(&model);
}

/// The same invariance with an f16 KV cache: rounding on write is per element, so it holds bitwise.
#[test]
fn batched_sequences_match_running_alone_f16_kv() {
    let (_dir, model) = tiny();
    batched_sequences_match_running_alone_with(&model.with_kv_dtype(KvDtype::F16));
}

#[test]
fn shared_prefix_blocks_give_identical_results() {
    let (_dir, model) = tiny();
    shared_prefix_blocks_give_identical_results_with(&model);
}

/// The same invariance with an f16 KV cache: rounding on write is per element, so it holds bitwise.
#[test]
fn shared_prefix_blocks_give_identical_results_f16_kv() {
    let (_dir, model) = tiny();
    shared_prefix_blocks_give_identical_results_with(&model.with_kv_dtype(KvDtype::F16));
}

#[test]
fn shuffled_block_ids_match_contiguous() {
    let (_dir, model) = tiny();
    shuffled_block_ids_match_contiguous_with(&model);
}

/// The same invariance with an f16 KV cache: rounding on write is per element, so it holds bitwise.
#[test]
fn shuffled_block_ids_match_contiguous_f16_kv() {
    let (_dir, model) = tiny();
    shuffled_block_ids_match_contiguous_with(&model.with_kv_dtype(KvDtype::F16));
}

/// The tiny random-weight models of `fixtures/tiny-arch/` (GGUF f32 files from llama.cpp's
/// converter; vocabulary 384).
fn tiny_arch(arch: &str) -> CpuModel {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/tiny-arch")
        .join(arch)
        .join(format!("{arch}-f32.gguf"));
    CpuModel::load(&path).unwrap_or_else(|e| panic!("{arch}: {e}"))
}

/// The batch-invariance checks above on every architecture: biases, q/k norms, half-split RoPE,
/// RoPE frequency factors, post-norms, GeGLU, soft-caps, fused projections, and Gemma 2's
/// 8-token sliding window (its prompts here run to 14 tokens, chunked across the window's edge).
#[test]
fn every_architecture_is_batch_invariant() {
    for arch in ["qwen2", "qwen3", "llama3rope", "gemma2", "phi3"] {
        eprintln!("{arch}");
        let model = tiny_arch(arch);
        chunking_is_bitwise_invariant_with(&model);
        batched_sequences_match_running_alone_with(&model);
        shared_prefix_blocks_give_identical_results_with(&model);
        shuffled_block_ids_match_contiguous_with(&model);
        let f16 = model.with_kv_dtype(KvDtype::F16);
        chunking_is_bitwise_invariant_with(&f16);
        batched_sequences_match_running_alone_with(&f16);
    }
}

/// The checks above in `fast` numerics on the tiny model: its first layer is Q4_1 and its tied LM
/// head Q8_0, so those matmuls run the 8-bit integer kernels (the F16/F32 layer stays exact).
#[test]
fn fast_numerics_is_batch_invariant() {
    let (_dir, model) = tiny();
    let model = model.with_numerics(Numerics::Fast);
    chunking_is_bitwise_invariant_with(&model);
    batched_sequences_match_running_alone_with(&model);
    shared_prefix_blocks_give_identical_results_with(&model);
    shuffled_block_ids_match_contiguous_with(&model);
}

/// `fast` numerics changes the logits of quantized layers (it is not silently the exact path) and
/// keeps them close to the exact ones.
#[test]
fn fast_numerics_stays_close_to_exact() {
    let (_dir, model) = tiny();
    let prompt: Vec<u32> = (0..9).map(|i| (i * 29 + 3) % 259).collect();
    let table = [0u32, 1, 2];
    let exact = run_chunked(&model, &mut model.new_kv(3, 4), &prompt, &[9], &table);
    let model = model.with_numerics(Numerics::Fast);
    let fast = run_chunked(&model, &mut model.new_kv(3, 4), &prompt, &[9], &table);
    assert_ne!(bits(&fast), bits(&exact));
    let scale = exact.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let worst = fast
        .iter()
        .zip(&exact)
        .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(worst < 0.05 * scale, "{worst} of {scale}");
}

/// A tiny architecture's f32 weights re-encoded block-wise (every matrix in `format`), so every
/// matmul of `fast` runs the integer kernels.
fn tiny_arch_quantized(arch: &str, format: gguf::GgmlType) -> CpuModel {
    use model_desc::ModelDesc;
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/tiny-arch")
        .join(arch)
        .join(format!("{arch}-f32.gguf"));
    let file = gguf::GgufFile::open(&path).unwrap();
    let desc = ModelDesc::from_source(&file).unwrap();
    let weights = crate::load_weights(&file, &desc).unwrap();
    let encode = |m: &crate::QMatrix| {
        let mut x = vec![0.0; m.rows() * m.cols()];
        m.dequantize_rows(0, &mut x);
        let bytes = match format {
            gguf::GgmlType::Q8_0 => gguf::quantize_q8_0(&x).unwrap(),
            _ => gguf::quantize_q4_1(&x).unwrap(),
        };
        crate::QMatrix::from_bytes(format, m.rows(), m.cols(), &bytes)
    };
    let weights = weights.try_map(encode, |v| Ok(v.clone())).unwrap();
    CpuModel::from_parts(desc, weights).with_numerics(Numerics::Fast)
}

/// The batch-invariance checks in `fast` numerics on every tiny architecture, all matrices Q8_0
/// or Q4_1 (the integer kernels in every matmul, the LM head included).
#[test]
fn fast_numerics_every_architecture_is_batch_invariant() {
    for (i, arch) in ["qwen2", "qwen3", "llama3rope", "gemma2", "phi3"]
        .into_iter()
        .enumerate()
    {
        eprintln!("{arch}");
        let format = [gguf::GgmlType::Q8_0, gguf::GgmlType::Q4_1][i % 2];
        let model = tiny_arch_quantized(arch, format);
        chunking_is_bitwise_invariant_with(&model);
        batched_sequences_match_running_alone_with(&model);
        shared_prefix_blocks_give_identical_results_with(&model);
    }
}
