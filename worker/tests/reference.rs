//! End-to-end checks of the f32 llama forward pass.
//!
//! - Against `fixtures/reference.json` (an independent float32 numpy
//!   implementation of SmolLM2-135M-Instruct with exactly dequantized weights):
//!   20 greedy steps (prefill, then one token at a time, no EOS stop) and the
//!   top-5 logits at the first generated position.
//! - On a tiny random model: prefill-then-decode equals token-by-token.

use std::path::PathBuf;

use serde_json::Value;
use worker::model::LlamaModel;
use worker::sampler::argmax;

fn real_model_path() -> PathBuf {
    let path = gguf::testing::default_model_path();
    assert!(
        path.is_file(),
        "model file {} not found: run scripts/fetch-model (or set SMOLLM_MODEL)",
        path.display()
    );
    path
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("array of ids")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

#[test]
fn matches_numpy_reference() {
    let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/reference.json");
    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture).expect("reading reference.json"))
            .expect("parsing reference.json");
    let model = LlamaModel::load(&real_model_path()).expect("loading the model");
    let prompts = json["prompts"].as_array().expect("prompts");
    assert_eq!(prompts.len(), 8);
    let mut max_err = 0.0f32;
    for p in prompts {
        let name = p["name"].as_str().unwrap_or("?");
        let prompt = ids(&p["prompt_ids"]);
        let want = ids(&p["greedy_ids"]);
        let mut cache = model.new_cache();
        let mut logits = model.forward(&prompt, &mut cache).expect("prefill");

        // top-5 at the first generated position
        let mut order: Vec<usize> = (0..logits.len()).collect();
        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
        for (rank, entry) in p["top5_first"].as_array().expect("top5").iter().enumerate() {
            let id = entry[0].as_u64().unwrap() as usize;
            let value = entry[1].as_f64().unwrap() as f32;
            assert_eq!(order[rank], id, "{name}: top-5 rank {rank}");
            let err = (logits[id] - value).abs();
            max_err = max_err.max(err);
            assert!(
                err <= 1e-3,
                "{name}: logit of {id} is {}, reference {value}",
                logits[id]
            );
        }

        let mut got = Vec::with_capacity(want.len());
        for step in 0..want.len() {
            let next = argmax(&logits) as u32;
            got.push(next);
            if step + 1 < want.len() {
                logits = model.forward(&[next], &mut cache).expect("decode");
            }
        }
        assert_eq!(got, want, "{name}: greedy ids");
        assert_eq!(cache.len(), prompt.len() + want.len() - 1);
    }
    eprintln!("max |logit - reference| over top-5 entries: {max_err:e}");
}

#[test]
fn tiny_prefill_then_decode_equals_one_by_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    let info = gguf::testing::write_tiny_llama(&path, 3).unwrap();
    let model = LlamaModel::load(&path).unwrap();
    assert_eq!(model.config().vocab_size, info.vocab_size());
    let tokens: Vec<u32> = (0..40u32)
        .map(|i| (i * 37 + 11) % info.vocab_size() as u32)
        .collect();

    let mut one = model.new_cache();
    let mut stepwise = Vec::new();
    for &t in &tokens {
        stepwise.push(model.forward(&[t], &mut one).unwrap());
    }

    for split in [1usize, 10, 39] {
        let mut cache = model.new_cache();
        let mut logits = model.forward(&tokens[..split], &mut cache).unwrap();
        assert_close(&logits, &stepwise[split - 1], split);
        for (i, &t) in tokens.iter().enumerate().skip(split) {
            logits = model.forward(&[t], &mut cache).unwrap();
            assert_close(&logits, &stepwise[i], i);
        }
        assert_eq!(cache.len(), tokens.len());
    }
}

fn assert_close(a: &[f32], b: &[f32], at: usize) {
    assert_eq!(a.len(), b.len());
    let err = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max);
    assert!(err <= 1e-5, "position {at}: max difference {err}");
}
