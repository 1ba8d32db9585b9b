//! Every architecture of `model_desc` on the CPU backend against independent references,
//! through [`CpuModel::forward_batch`] over a paged KV cache (prefill in one entry, then one
//! token per step, greedy, no EOS stop):
//!
//! - the tiny random-weight models of `fixtures/tiny-arch/` (qwen2, qwen3, llama with llama3
//!   RoPE scaling, gemma2, phi3; GGUF files written by llama.cpp's converter) against Hugging
//!   Face transformers in float32: 10 greedy ids exact and the last position's top-5 logits
//!   within 1e-3 from the F32 file and from the Hugging Face folders it was converted from (F32
//!   and BF16 safetensors, read through `model-files`); the same greedy ids from the BF16 file;
//! - Gemma 3 270M Q4_K_M against `fixtures/gemma3-270m.json` (an independent float32 numpy
//!   implementation on the exactly dequantized weights): 20 greedy ids exact and the top-5 logits
//!   of the first generated position, for six prompts, one of 634 tokens (beyond the 512-token
//!   sliding window);
//! - Gemma 3 batch invariance: 32 sequences (the reference prompts, sliding window included)
//!   prefilled in one step and decoded together give bitwise the logits each gives alone.

use std::path::{Path, PathBuf};

use backend_cpu::CpuModel;
use engine::backend::BatchEntry;
use engine::sampler::argmax;
use serde_json::Value;

const BLOCK: usize = 16;

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures")
        .join(rel)
}

fn json(rel: &str) -> Value {
    let text = std::fs::read_to_string(fixture(rel)).expect("reading the fixture");
    serde_json::from_str(&text).expect("valid JSON")
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("array of ids")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

fn top5(v: &Value) -> Vec<(usize, f32)> {
    v.as_array()
        .expect("top-5")
        .iter()
        .map(|e| {
            (
                e[0].as_u64().unwrap() as usize,
                e[1].as_f64().unwrap() as f32,
            )
        })
        .collect()
}

fn table(first: usize, tokens: usize) -> Vec<u32> {
    (first..first + tokens.div_ceil(BLOCK))
        .map(|b| b as u32)
        .collect()
}

/// Prefills `prompt` in one entry and decodes `steps` greedy tokens one per call; returns the
/// logits after the prompt and the greedy ids.
fn greedy(model: &CpuModel, prompt: &[u32], steps: usize) -> (Vec<f32>, Vec<u32>) {
    let (first, ids, _) = greedy_traced(model, prompt, steps);
    (first, ids)
}

/// A fingerprint of a logits vector's bits (FNV-1a over the f32 bit patterns).
fn fingerprint(logits: &[f32]) -> u64 {
    logits.iter().fold(0xcbf2_9ce4_8422_2325, |h, x| {
        (h ^ x.to_bits() as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// [`greedy`], also returning the [`fingerprint`] of the logits of every step.
fn greedy_traced(model: &CpuModel, prompt: &[u32], steps: usize) -> (Vec<f32>, Vec<u32>, Vec<u64>) {
    let blocks = table(0, prompt.len() + steps);
    let mut kv = model.new_kv(blocks.len(), BLOCK);
    let run = |kv: &mut _, tokens: &[u32], start_pos| {
        let entry = BatchEntry {
            tokens,
            start_pos,
            block_table: &blocks,
            logit_tokens: 1,
        };
        model
            .forward_batch(&[entry], kv)
            .expect("forward")
            .remove(0)
    };
    let first = run(&mut kv, prompt, 0);
    let mut logits = first.clone();
    let mut out = Vec::with_capacity(steps);
    let mut prints = Vec::with_capacity(steps);
    for step in 0..steps {
        prints.push(fingerprint(&logits));
        let next = argmax(&logits) as u32;
        out.push(next);
        if step + 1 < steps {
            logits = run(&mut kv, &[next], prompt.len() + step);
        }
    }
    (first, out, prints)
}

/// Asserts the top-5 ids of `logits` and their values within `tol` of `want`; returns the largest
/// difference.
fn check_top5(logits: &[f32], want: &[(usize, f32)], tol: f32, what: &str) -> f32 {
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    let mut max_err = 0.0f32;
    for (rank, &(id, value)) in want.iter().enumerate() {
        assert_eq!(order[rank], id, "{what}: top-5 rank {rank}");
        let err = (logits[id] - value).abs();
        max_err = max_err.max(err);
        assert!(
            err <= tol,
            "{what}: logit of {id} is {}, reference {value}",
            logits[id]
        );
    }
    max_err
}

const TINY: [&str; 5] = ["qwen2", "qwen3", "llama3rope", "gemma2", "phi3"];

/// Checks the model at `fixtures/tiny-arch/{arch}/{source}` (a GGUF file or a Hugging Face
/// folder whose values equal the F32 file's) against transformers: greedy ids exact, top-5 logits
/// within 1e-3. Returns the largest top-5 logit difference.
fn matches_transformers_in_f32(arch: &str, source: &str) -> f32 {
    let reference = json(&format!("tiny-arch/{arch}/reference.json"));
    let path = fixture(&format!("tiny-arch/{arch}/{source}"));
    let model = CpuModel::load(&path).unwrap_or_else(|e| panic!("{arch} {source}: {e}"));
    let mut max_err = 0.0f32;
    for (i, seq) in reference["sequences"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
    {
        let what = format!("{arch} {source} sequence {i}");
        let want = ids(&seq["greedy_ids"]);
        let (first, got) = greedy(&model, &ids(&seq["input_ids"]), want.len());
        max_err = max_err.max(check_top5(
            &first,
            &top5(&seq["last_position_top5"]),
            1e-3,
            &what,
        ));
        assert_eq!(got, want, "{what}: greedy ids");
    }
    max_err
}

#[test]
fn tiny_architectures_match_transformers_in_f32() {
    for arch in TINY {
        let max_err = matches_transformers_in_f32(arch, &format!("{arch}-f32.gguf"));
        eprintln!("{arch}: max |logit - transformers| over top-5 entries {max_err:e}");
    }
}

/// The Hugging Face folders the GGUF files were converted from, read by `model-files`: every
/// weight is bf16-exact, so the F32 and BF16 folders both hold the F32 file's values.
#[test]
fn tiny_hugging_face_folders_match_transformers() {
    for arch in TINY {
        for folder in ["hf-f32", "hf-bf16"] {
            let max_err = matches_transformers_in_f32(arch, folder);
            eprintln!("{arch} {folder}: max |logit - transformers| over top-5 entries {max_err:e}");
        }
    }
}

#[test]
fn tiny_architectures_match_transformers_in_bf16() {
    for arch in TINY {
        let reference = json(&format!("tiny-arch/{arch}/reference.json"));
        let path = fixture(&format!("tiny-arch/{arch}/{arch}-bf16.gguf"));
        let model = CpuModel::load(&path).unwrap_or_else(|e| panic!("{arch}: {e}"));
        for (i, seq) in reference["sequences"]
            .as_array()
            .unwrap()
            .iter()
            .enumerate()
        {
            let want = ids(&seq["greedy_ids"]);
            let (_, got) = greedy(&model, &ids(&seq["input_ids"]), want.len());
            assert_eq!(got, want, "{arch} bf16 sequence {i}: greedy ids");
        }
    }
}

/// The Gemma 3 270M file; panics with the fix when it has not been fetched (the test fails, it
/// is not skipped).
fn gemma3() -> CpuModel {
    let path = gguf::testing::gemma3_model_path();
    assert!(
        path.is_file(),
        "{} not found: run scripts/fetch-model gemma3-270m",
        path.display()
    );
    CpuModel::load(&path).expect("loading Gemma 3 270M")
}

/// A reference prompt: name, prompt ids, greedy ids, top-5 `(id, logit)` at the first generated
/// position.
type Case = (String, Vec<u32>, Vec<u32>, Vec<(usize, f32)>);

/// The reference prompts of `fixtures/gemma3-270m.json`.
fn gemma3_cases() -> Vec<Case> {
    let reference = json("gemma3-270m.json");
    reference["prompts"]
        .as_array()
        .expect("prompts")
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap().to_string(),
                ids(&p["prompt_ids"]),
                ids(&p["greedy_ids"]),
                top5(&p["top5_first"]),
            )
        })
        .collect()
}

#[test]
fn gemma3_270m_matches_the_reference() {
    let model = gemma3();
    let cases = gemma3_cases();
    assert_eq!(cases.len(), 6);
    assert!(
        cases.iter().any(|c| c.1.len() > 512),
        "a prompt longer than the sliding window"
    );
    let mut max_err = 0.0f32;
    for (name, prompt, want, top) in &cases {
        let (first, got) = greedy(&model, prompt, want.len());
        max_err = max_err.max(check_top5(&first, top, 1e-3, name));
        assert_eq!(&got, want, "{name}: greedy ids");
    }
    eprintln!("Gemma 3 270M: max |logit - reference| over top-5 entries {max_err:e}");
}

/// 32 Gemma 3 sequences, prefilled together in one step and then decoded together, give bitwise
/// the logits (and so the ids) each gives alone: the six reference prompts, the short ones also
/// cut at several lengths, including the 634-token one whose decode steps see only the last 512
/// positions in the local layers.
#[test]
fn gemma3_32_sequences_together_match_each_alone() {
    const STEPS: usize = 4;
    let model = gemma3();
    let cases = gemma3_cases();
    let long = cases
        .iter()
        .find(|c| c.1.len() > 512)
        .expect("a long prompt");
    let short: Vec<&Case> = cases.iter().filter(|c| c.1.len() <= 512).collect();
    let mut prompts = vec![long.1.clone()];
    for i in 0..31 {
        let p = &short[i % short.len()].1;
        prompts.push(p[..p.len() - (i / short.len()) * 2].to_vec());
    }
    let alone: Vec<(Vec<u32>, Vec<u64>)> = prompts
        .iter()
        .map(|p| {
            let (_, ids, prints) = greedy_traced(&model, p, STEPS);
            (ids, prints)
        })
        .collect();

    // Together, in one cache, block tables interleaved and in reverse order.
    let blocks: Vec<usize> = prompts
        .iter()
        .map(|p| (p.len() + STEPS).div_ceil(BLOCK))
        .collect();
    let total: usize = blocks.iter().sum();
    let mut next_block = total;
    let tables: Vec<Vec<u32>> = blocks
        .iter()
        .map(|&n| {
            next_block -= n;
            (next_block..next_block + n)
                .rev()
                .map(|b| b as u32)
                .collect()
        })
        .collect();
    let mut kv = model.new_kv(total, BLOCK);
    let entries: Vec<BatchEntry> = prompts
        .iter()
        .zip(&tables)
        .map(|(p, t)| BatchEntry {
            tokens: p,
            start_pos: 0,
            block_table: t,
            logit_tokens: 1,
        })
        .collect();
    let mut logits = model.forward_batch(&entries, &mut kv).expect("prefill");
    for step in 0..STEPS {
        let next: Vec<u32> = logits.iter().map(|l| argmax(l) as u32).collect();
        for (s, (l, (ids, prints))) in logits.iter().zip(&alone).enumerate() {
            assert_eq!(
                fingerprint(l),
                prints[step],
                "sequence {s} step {step}: logits"
            );
            assert_eq!(next[s], ids[step], "sequence {s} step {step}: id");
        }
        if step + 1 == STEPS {
            break;
        }
        let entries: Vec<BatchEntry> = next
            .iter()
            .zip(&prompts)
            .zip(&tables)
            .map(|((t, p), table)| BatchEntry {
                tokens: std::slice::from_ref(t),
                start_pos: p.len() + step,
                block_table: table,
                logit_tokens: 1,
            })
            .collect();
        logits = model.forward_batch(&entries, &mut kv).expect("decode");
    }
}
