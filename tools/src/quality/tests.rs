//! End-to-end runs of [`evaluate`] on the tiny random-weight llama of `gguf::testing` (context 256,
//! byte-level BPE vocabulary: about one token per character).

use std::path::{Path, PathBuf};

use backend_cpu::{CpuModel, Numerics};
use engine::backend::BatchEntry;

use super::metrics::nll;
use super::prompts::{greedy_agreement, read_reference};
use super::text::{windows, ModelTokenizer, WindowLayout};
use super::{evaluate, QualityError, QualityRun};

const TEXT: &str = "It is a truth universally acknowledged, that a single man in possession \
of a good fortune, must be in want of a wife. However little known the feelings or views of \
such a man may be on his first entering a neighbourhood, this truth is so well fixed in the \
minds of the surrounding families, that he is considered as the rightful property of some one \
or other of their daughters.";

/// The tiny model and the text in a temporary folder.
fn fixture() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny.gguf");
    gguf::testing::write_tiny_llama(&model, 7).unwrap();
    let text = dir.path().join("text.txt");
    std::fs::write(&text, TEXT).unwrap();
    (dir, model, text)
}

fn quality_run<'a>(model: &'a Path, text: &'a Path, candidate: Numerics) -> QualityRun<'a> {
    QualityRun {
        model,
        text,
        baseline: Numerics::Exact,
        candidate,
        window: 64,
        chunk: 16,
        score_from: 0,
        max_windows: None,
        layout: WindowLayout::Consecutive,
    }
}

/// The mean NLL of `windows` under `model`, each window in ONE pass with the logits of all its
/// positions (no chunking), summed in the same order as the tally.
fn mean_nll_in_one_pass(model: &CpuModel, windows: &[Vec<u32>]) -> f64 {
    let (mut sum, mut n) = (0.0f64, 0usize);
    for w in windows {
        let input = &w[..w.len() - 1];
        let table: Vec<u32> = (0..w.len().div_ceil(16) as u32).collect();
        let mut kv = model.new_kv(table.len(), 16);
        let entry = BatchEntry {
            tokens: input,
            start_pos: 0,
            block_table: &table,
            logit_tokens: input.len(),
        };
        let rows = model.forward_batch(&[entry], &mut kv).unwrap();
        for (row, &target) in rows.iter().zip(&w[1..]) {
            sum += nll(row, target);
            n += 1;
        }
    }
    sum / n as f64
}

#[test]
fn exact_against_exact_agrees_everywhere() {
    let (_dir, model, text) = fixture();
    let report = evaluate(&quality_run(&model, &text, Numerics::Exact), &mut |_| {}).unwrap();
    let s = report.summary;
    let file = model_files::open(&model).unwrap();
    let ids = ModelTokenizer::from_model(&model, &file)
        .unwrap()
        .encode(TEXT)
        .unwrap();
    assert_eq!(report.run.text_tokens, ids.len());
    assert!(report.run.windows >= 3, "{} windows", report.run.windows);
    assert_eq!(report.run.text_tokens_used, report.run.windows * 64);
    // No BOS for this tokenizer: each window's first token is not scored.
    assert_eq!(report.run.bos, None);
    assert_eq!(s.scored, report.run.windows * 63);
    assert_eq!(s.kl_mean, Some(0.0));
    assert_eq!(s.kl_p99, Some(0.0));
    assert_eq!(s.kl_max, Some(0.0));
    assert_eq!(s.top1_agree, s.scored);
    assert_eq!(s.top1_agreement, 1.0);
    assert_eq!(s.perplexity_baseline, s.perplexity_candidate);
    assert_eq!(s.perplexity_change_pct, 0.0);

    // The chunked run scores what one pass per window scores, position for position.
    let cpu = CpuModel::load(&model).unwrap();
    let expected = mean_nll_in_one_pass(&cpu, &windows(&ids, 64, None).unwrap());
    assert_eq!(s.mean_nll_baseline, expected);
    assert_eq!(s.perplexity_baseline, expected.exp());
    // A random model is far from the text: perplexity well above 1.
    assert!(s.perplexity_baseline > 2.0, "{}", s.perplexity_baseline);
}

#[test]
fn exact_against_fast_on_the_tiny_model() {
    let (_dir, model, text) = fixture();
    let report = evaluate(&quality_run(&model, &text, Numerics::Fast), &mut |_| {}).unwrap();
    let s = report.summary;
    assert_eq!((report.baseline, report.candidate), ("exact", "fast"));
    // The baseline is the same exact run as in the test above.
    let cpu = CpuModel::load(&model).unwrap();
    let file = model_files::open(&model).unwrap();
    let ids = ModelTokenizer::from_model(&model, &file)
        .unwrap()
        .encode(TEXT)
        .unwrap();
    let expected = mean_nll_in_one_pass(&cpu, &windows(&ids, 64, None).unwrap());
    assert_eq!(s.mean_nll_baseline, expected);
    // Layer 0's Q4_1 matrices run on 8-bit activations: close to exact, not equal.
    let fast = CpuModel::load(&model)
        .unwrap()
        .with_numerics(Numerics::Fast);
    let fast_nll = mean_nll_in_one_pass(&fast, &windows(&ids, 64, None).unwrap());
    assert_eq!(s.mean_nll_candidate, fast_nll);
    let (mean, p99, max) = (s.kl_mean.unwrap(), s.kl_p99.unwrap(), s.kl_max.unwrap());
    assert!(mean >= 0.0 && p99 <= max);
    assert!(mean < 0.05, "KL mean {mean}");
    assert!(s.top1_agreement > 0.5, "top-1 {}", s.top1_agreement);
    assert!(
        s.perplexity_change_pct.abs() < 5.0,
        "{}",
        s.perplexity_change_pct
    );
}

#[test]
fn refuses_a_window_past_the_context_and_a_short_text() {
    let (_dir, model, text) = fixture();
    let mut run = quality_run(&model, &text, Numerics::Fast);
    run.window = 300;
    let err = evaluate(&run, &mut |_| {}).unwrap_err();
    assert!(
        matches!(
            err,
            QualityError::WindowPastContext {
                window: 300,
                context: 256
            }
        ),
        "{err}"
    );
    run.window = 64;
    let short = text.with_file_name("short.txt");
    std::fs::write(&short, "A short text.").unwrap();
    run.text = &short;
    let err = evaluate(&run, &mut |_| {}).unwrap_err();
    assert!(matches!(err, QualityError::TextTooShort { .. }), "{err}");
    assert!(err.to_string().contains("fewer than one window"), "{err}");
}

#[test]
fn max_windows_limits_the_run() {
    let (_dir, model, text) = fixture();
    let mut run = quality_run(&model, &text, Numerics::Exact);
    run.max_windows = Some(2);
    let mut seen = Vec::new();
    let report = evaluate(&run, &mut |p| seen.push((p.done, p.total))).unwrap();
    assert_eq!(report.run.windows, 2);
    assert_eq!(report.summary.scored, 2 * 63);
    assert_eq!(seen, [(1, 2), (2, 2)]);
}

/// Checks that `ids` is the greedy continuation of `prompt` under `model` with ONE pass over
/// `prompt + ids` (the logits of every position at once): each id is its position's argmax.
fn assert_greedy(model: &CpuModel, prompt: &[u32], ids: &[u32]) {
    let all: Vec<u32> = prompt.iter().chain(ids).copied().collect();
    let input = &all[..all.len() - 1];
    let table: Vec<u32> = (0..all.len().div_ceil(16) as u32).collect();
    let mut kv = model.new_kv(table.len(), 16);
    let entry = BatchEntry {
        tokens: input,
        start_pos: 0,
        block_table: &table,
        logit_tokens: ids.len(),
    };
    let rows = model.forward_batch(&[entry], &mut kv).unwrap();
    let argmaxes: Vec<u32> = rows
        .iter()
        .map(|r| engine::sampler::argmax(r) as u32)
        .collect();
    assert_eq!(argmaxes, ids);
}

#[test]
fn greedy_agreement_on_reference_prompts() {
    let (dir, model, _text) = fixture();
    let reference = dir.path().join("reference.json");
    std::fs::write(
        &reference,
        r#"{"model": "tiny", "prompts": [
            {"name": "one", "prompt_ids": [40, 41, 42, 43, 44], "greedy_ids": [0, 0, 0, 0, 0, 0, 0, 0]},
            {"name": "two", "prompt_ids": [100, 7, 250, 3], "greedy_ids": [0, 0, 0, 0, 0, 0]}
        ]}"#,
    )
    .unwrap();
    let mut prompts = read_reference(&reference).unwrap();
    let exact = CpuModel::load(&model).unwrap();
    let rows = greedy_agreement(&exact, &exact, &prompts).unwrap();
    assert_eq!(rows.len(), 2);
    for (r, p) in rows.iter().zip(&prompts) {
        assert_eq!(r.steps, p.greedy_ids.len());
        assert_eq!(r.agreeing_prefix, r.steps);
        assert_eq!(r.baseline_ids, r.candidate_ids);
        assert_eq!(r.baseline_margin_at_difference, None);
        assert_eq!(r.baseline_matches_reference, r.baseline_ids == p.greedy_ids);
        assert_greedy(&exact, &p.prompt_ids, &r.baseline_ids);
    }
    // With the baseline's own ids as the reference, the baseline matches it.
    for (p, r) in prompts.iter_mut().zip(&rows) {
        p.greedy_ids = r.baseline_ids.clone();
    }
    let fast = CpuModel::load(&model)
        .unwrap()
        .with_numerics(Numerics::Fast);
    let rows = greedy_agreement(&exact, &fast, &prompts).unwrap();
    for (r, p) in rows.iter().zip(&prompts) {
        assert!(r.baseline_matches_reference, "{}", r.name);
        assert_greedy(&fast, &p.prompt_ids, &r.candidate_ids);
        let shared = r
            .baseline_ids
            .iter()
            .zip(&r.candidate_ids)
            .take_while(|(a, b)| a == b)
            .count();
        assert_eq!(r.agreeing_prefix, shared);
        assert_eq!(
            r.baseline_margin_at_difference.is_some(),
            shared < r.steps,
            "{}",
            r.name
        );
    }
}

#[test]
fn refuses_a_file_that_is_not_a_reference() {
    let (dir, _model, text) = fixture();
    let err = read_reference(&text).unwrap_err();
    assert!(matches!(err, QualityError::Reference { .. }), "{err}");
    let err = read_reference(&dir.path().join("missing.json")).unwrap_err();
    assert!(matches!(err, QualityError::Read { .. }), "{err}");
}

#[test]
fn scores_from_a_given_token_as_llama_perplexity_does() {
    let (_dir, model, text) = fixture();
    let mut run = quality_run(&model, &text, Numerics::Exact);
    // Half the window, not a multiple of the chunk: rows start mid-chunk.
    run.score_from = 37;
    let report = evaluate(&run, &mut |_| {}).unwrap();
    assert_eq!(report.run.score_from, 37);
    assert_eq!(report.summary.scored, report.run.windows * (64 - 37));
    // The same positions from one pass per window with every row.
    let cpu = CpuModel::load(&model).unwrap();
    let file = model_files::open(&model).unwrap();
    let ids = ModelTokenizer::from_model(&model, &file)
        .unwrap()
        .encode(TEXT)
        .unwrap();
    let (mut sum, mut n) = (0.0f64, 0usize);
    for w in windows(&ids, 64, None).unwrap() {
        let table: Vec<u32> = (0..4).collect();
        let mut kv = cpu.new_kv(4, 16);
        let entry = BatchEntry {
            tokens: &w[..63],
            start_pos: 0,
            block_table: &table,
            logit_tokens: 63,
        };
        let rows = cpu.forward_batch(&[entry], &mut kv).unwrap();
        for j in 37..64 {
            sum += nll(&rows[j - 1], w[j]);
            n += 1;
        }
    }
    assert_eq!(report.summary.mean_nll_baseline, sum / n as f64);
    run.score_from = 64;
    let err = evaluate(&run, &mut |_| {}).unwrap_err();
    assert!(
        matches!(
            err,
            QualityError::ScoreFromPastWindow {
                score_from: 64,
                window: 64
            }
        ),
        "{err}"
    );
}

#[test]
fn the_llama_perplexity_layout_scores_the_second_half_of_each_chunk() {
    let (_dir, model, text) = fixture();
    let mut run = quality_run(&model, &text, Numerics::Fast);
    run.layout = WindowLayout::LlamaPerplexity;
    run.score_from = WindowLayout::LlamaPerplexity.default_score_from(run.window);
    let report = evaluate(&run, &mut |_| {}).unwrap();
    // llama-perplexity: logits at positions 32..=62 of each 64-token chunk, 31 per chunk.
    assert_eq!(report.summary.scored, report.run.windows * 31);
    assert!(report.run.windows >= 2);
}
