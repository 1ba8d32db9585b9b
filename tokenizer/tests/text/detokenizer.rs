//! `IncrementalDetokenizer`: the deltas of a stream concatenate to the full
//! decode, and no delta carries a broken character.

use std::sync::Arc;

use tokenizer::IncrementalDetokenizer;
use tokenizer::TextTokenizer;

use crate::common::*;

#[derive(Clone, Copy, Debug)]
enum Strategy {
    Auto,
    Windowed,
}

/// Streams `ids`; returns the deltas (the last one from `finish`).
fn stream(tok: &Arc<TextTokenizer>, ids: &[u32], skip: bool, strategy: Strategy) -> Vec<String> {
    let mut d = match strategy {
        Strategy::Auto => IncrementalDetokenizer::new(tok.clone(), skip),
        Strategy::Windowed => IncrementalDetokenizer::new_windowed(tok.clone(), skip),
    };
    let mut deltas: Vec<String> = ids.iter().map(|&id| d.push(id)).collect();
    deltas.push(d.finish());
    deltas
}

/// Checks the invariant for every strategy and skip setting.
fn check_invariant(tok: &Arc<TextTokenizer>, ids: &[u32], what: &str) {
    for strategy in [Strategy::Auto, Strategy::Windowed] {
        for skip in [false, true] {
            let full = tok.decode(ids, skip);
            let deltas = stream(tok, ids, skip, strategy);
            assert_eq!(
                deltas.concat(),
                full,
                "{what}: {strategy:?} skip={skip} deltas {deltas:?}"
            );
            if !full.contains('\u{FFFD}') {
                assert!(
                    deltas.iter().all(|d| !d.contains('\u{FFFD}')),
                    "{what}: {strategy:?} broken char in {deltas:?}"
                );
            }
        }
    }
}

#[test]
fn emoji_held_until_complete() {
    let tok = synthetic_tokenizer();
    let ids = tok.encode("a🙂b", false).unwrap();
    assert_eq!(ids.len(), 6, "{ids:?}");
    for strategy in [Strategy::Auto, Strategy::Windowed] {
        assert_eq!(
            stream(&tok, &ids, false, strategy),
            ["a", "", "", "", "🙂", "b", ""],
            "{strategy:?}"
        );
    }
}

#[test]
fn cjk_across_merged_and_byte_tokens() {
    let tok = synthetic_tokenizer();
    let ids = tok.encode("你好", false).unwrap();
    assert_eq!(ids.len(), 4, "{ids:?}");
    assert_eq!(
        stream(&tok, &ids, false, Strategy::Auto),
        ["你", "", "", "好", ""]
    );
    check_invariant(&tok, &ids, "你好");
}

#[test]
fn special_tokens_skipped_or_included() {
    let tok = synthetic_tokenizer();
    let ids = tok.encode("<|im_start|>hé<|im_end|>", false).unwrap();
    assert_eq!(stream(&tok, &ids, true, Strategy::Auto).concat(), "hé");
    assert_eq!(
        stream(&tok, &ids, false, Strategy::Auto),
        ["<|im_start|>", "h", "é", "<|im_end|>", ""]
    );
    // A skipped special token inside a split character does not break it.
    let e_acute = "é".as_bytes();
    let ids = [u32::from(e_acute[0]), SYN_IM_END, u32::from(e_acute[1])];
    assert_eq!(stream(&tok, &ids, true, Strategy::Auto), ["", "", "é", ""]);
    check_invariant(&tok, &ids, "split é around a special");
}

#[test]
fn finish_flushes_incomplete_character_lossily() {
    let tok = synthetic_tokenizer();
    for strategy in [Strategy::Auto, Strategy::Windowed] {
        assert_eq!(
            stream(&tok, &[u32::from(b'x'), 0xF0, 0x9F], false, strategy),
            ["x", "", "", "\u{FFFD}"]
        );
    }
    check_invariant(
        &tok,
        &[0xF0, 0x9F, b'a'.into(), 0x80, 0xC3, 0xC3, 0xA9, 0xE2],
        "invalid bytes",
    );
}

#[test]
fn synthetic_invariant_on_pseudo_random_ids() {
    let tok = synthetic_tokenizer();
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    for case in 0..200 {
        let ids: Vec<u32> = (0..40)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state % tok.vocab_size() as u64) as u32
            })
            .collect();
        check_invariant(&tok, &ids, &format!("random case {case}"));
    }
}

#[test]
fn real_vocab_reference_streams() {
    let tok = real_tokenizer();
    for (text, ids) in tokenizer_cases() {
        check_invariant(&tok, &ids, &text);
    }
    for p in reference()["prompts"].as_array().unwrap() {
        check_invariant(&tok, &ids(&p["prompt_ids"]), p["name"].as_str().unwrap());
        check_invariant(&tok, &ids(&p["greedy_ids"]), p["name"].as_str().unwrap());
    }
    // The flag emoji arrive over several tokens each and come out whole.
    let (text, ids) = tokenizer_cases()
        .into_iter()
        .find(|(t, _)| t.contains("flags"))
        .unwrap();
    let deltas = stream(&tok, &ids, false, Strategy::Auto);
    assert!(deltas.iter().any(|d| d.contains("🇫")), "{deltas:?}");
    assert_eq!(deltas.concat(), text);
}

#[test]
fn real_vocab_pseudo_random_ids() {
    let tok = real_tokenizer();
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    for case in 0..50 {
        let ids: Vec<u32> = (0..64)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                // Mostly multi-byte-heavy low ids (byte symbols), some specials.
                (state % if case % 2 == 0 { 300 } else { 49152 }) as u32
            })
            .collect();
        check_invariant(&tok, &ids, &format!("random case {case}"));
    }
}

/// A SentencePiece-style `tokenizer.json` (Metaspace, byte fallback, strip of
/// the first space), whose text depends on the left context: only the window
/// strategy applies.
#[test]
fn window_strategy_with_context_dependent_decoder() {
    let mut vocab = serde_json::Map::new();
    for (i, t) in ["<unk>", "<s>", "</s>"].iter().enumerate() {
        vocab.insert(t.to_string(), i.into());
    }
    for b in 0..=255u32 {
        vocab.insert(format!("<0x{b:02X}>"), (3 + b).into());
    }
    vocab.insert("▁Hello".into(), 259.into());
    vocab.insert("▁world".into(), 260.into());
    let json = serde_json::json!({
        "version": "1.0",
        "added_tokens": [
            {"id": 2, "content": "</s>", "single_word": false, "lstrip": false, "rstrip": false,
             "normalized": false, "special": true}
        ],
        "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": false},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}
        ]},
        "model": {"type": "BPE", "unk_token": "<unk>", "fuse_unk": true, "byte_fallback": true,
                  "vocab": vocab, "merges": []}
    });
    let mut spec = synthetic_spec("smollm");
    spec.tokenizer_json = json.to_string();
    let tok = Arc::new(TextTokenizer::from_spec(&spec).unwrap());
    assert!(!tok.is_byte_level());
    let smile: Vec<u32> = "🙂".bytes().map(|b| 3 + u32::from(b)).collect();
    let mut ids = vec![259, 260];
    ids.extend(&smile);
    ids.extend([2, 260]);
    assert_eq!(tok.decode(&ids, true), "Hello world🙂 world");
    assert_eq!(
        stream(&tok, &ids, true, Strategy::Auto),
        ["Hello", " world", "", "", "", "🙂", "", " world", ""]
    );
    check_invariant(&tok, &ids, "metaspace");
}
