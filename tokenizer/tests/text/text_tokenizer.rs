//! `TextTokenizer`: synthetic vocabulary behaviour, and exact agreement with
//! the original SmolLM2 tokenizer on the reference cases.

use tokenizer::{TextTokenizer, TokenizerError};

use crate::common::*;

fn byte_ids(s: &str) -> Vec<u32> {
    s.bytes().map(u32::from).collect()
}

#[test]
fn is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<TextTokenizer>();
}

#[test]
fn synthetic_merges_and_first_word() {
    let tok = synthetic_tokenizer();
    let the = tok.token_id("he").unwrap();
    let space_the = tok.token_id("Ġthe").unwrap();
    assert_eq!(
        tok.encode("the the", false).unwrap(),
        vec![u32::from(b't'), the, space_the]
    );
    let (ids, pieces) = tok.encode_with_pieces("the the", false).unwrap();
    assert_eq!(ids, vec![u32::from(b't'), the, space_the]);
    assert_eq!(pieces, vec!["t", "he", "Ġthe"]);
    assert_eq!(tok.encode("", false).unwrap(), Vec::<u32>::new());
    assert_eq!(tok.vocab_size(), 258 + 7);
}

#[test]
fn smollm_splits_digits_gpt2_does_not() {
    let smollm = synthetic_tokenizer();
    assert_eq!(smollm.encode("12", false).unwrap(), byte_ids("12"));
    let gpt2 = TextTokenizer::from_spec(&synthetic_spec("gpt-2")).unwrap();
    assert_eq!(
        gpt2.encode("12", false).unwrap(),
        vec![gpt2.token_id("12").unwrap()]
    );
}

#[test]
fn llama_bpe_groups_digits_by_three() {
    let tok = TextTokenizer::from_spec(&synthetic_spec("llama-bpe")).unwrap();
    let twelve = tok.token_id("12").unwrap();
    // "1212" -> pre-tokens "121" + "2" -> [12, 1] + [2].
    assert_eq!(tok.encode("1212", false).unwrap(), vec![twelve, 49, 50]);
    let space_the = tok.token_id("Ġthe").unwrap();
    let mut expected = byte_ids("I");
    expected.push(space_the);
    expected.extend(byte_ids("'S"));
    assert_eq!(tok.encode("I the'S", false).unwrap(), expected);
}

#[test]
fn special_tokens_match_only_whole() {
    let tok = synthetic_tokenizer();
    let mut expected = vec![SYN_IM_START];
    expected.extend(byte_ids("hi"));
    expected.push(SYN_IM_END);
    assert_eq!(
        tok.encode("<|im_start|>hi<|im_end|>", false).unwrap(),
        expected
    );
    assert_eq!(
        tok.encode("<|im_start|", false).unwrap(),
        byte_ids("<|im_start|")
    );
    assert!(tok.is_special(SYN_IM_START) && tok.is_special(SYN_IM_END));
    assert!(!tok.is_special(u32::from(b'a')));
    assert_eq!(tok.token_id("<|im_end|>"), Some(SYN_IM_END));
}

#[test]
fn plain_encoding_reads_special_token_text_as_text() {
    let tok = synthetic_tokenizer();
    assert_eq!(
        tok.encode_plain("<|im_start|>hi<|im_end|>", false).unwrap(),
        byte_ids("<|im_start|>hi<|im_end|>")
    );
    assert_eq!(
        tok.encode_plain("the the", false).unwrap(),
        tok.encode("the the", false).unwrap()
    );
    assert!(tok.contains_special_text("user<|im_end|>"));
    assert!(!tok.contains_special_text("user <|im_end|"));
}

#[test]
fn pieces_parse_special_tokens_in_markup_only() {
    use tokenizer::TemplatePiece::{Content, Markup};
    let tok = synthetic_tokenizer();
    let pieces = [
        Markup("<|im_start|>user\n".into()),
        Content("a<|im_end|>b".into()),
        Markup("<|im_end|>\n<|im_start|>x".into()),
    ];
    let mut expected = vec![SYN_IM_START];
    expected.extend(byte_ids("user\na<|im_end|>b"));
    expected.push(SYN_IM_END);
    expected.extend(byte_ids("\n"));
    expected.push(SYN_IM_START);
    expected.extend(byte_ids("x"));
    assert_eq!(tok.encode_pieces(&pieces).unwrap(), expected);
    // Markup alone encodes as `encode` does.
    let markup = "<|im_start|>the the<|im_end|>";
    assert_eq!(
        tok.encode_pieces(&[Markup(markup.into())]).unwrap(),
        tok.encode(markup, false).unwrap()
    );
}

#[test]
fn bos_only_with_add_special_tokens_and_add_bos() {
    let mut spec = synthetic_spec("smollm");
    spec.add_bos_token = true;
    let tok = TextTokenizer::from_spec(&spec).unwrap();
    assert_eq!(tok.encode("a", true).unwrap(), vec![SYN_IM_START, 97]);
    assert_eq!(tok.encode("a", false).unwrap(), vec![97]);
    let (ids, pieces) = tok.encode_with_pieces("a", true).unwrap();
    assert_eq!(
        (ids, pieces),
        (
            vec![SYN_IM_START, 97],
            vec!["<|im_start|>".to_string(), "a".to_string()]
        )
    );
    // add_bos_token false: never.
    assert_eq!(synthetic_tokenizer().encode("a", true).unwrap(), vec![97]);
}

#[test]
fn decode_round_trip_and_skip_special() {
    let tok = synthetic_tokenizer();
    let text = "<|im_start|>the café 你好 🙂 12\n<|im_end|>";
    let ids = tok.encode(text, false).unwrap();
    assert!(
        ids.contains(&tok.token_id("Ã©").unwrap()) && ids.contains(&tok.token_id("ä½ł").unwrap())
    );
    assert_eq!(tok.decode(&ids, false), text);
    assert_eq!(tok.decode(&ids, true), "the café 你好 🙂 12\n");
    assert_eq!(
        tok.decode(&[u32::from(b'a'), 10_000], false),
        "a",
        "unknown ids are ignored"
    );
}

#[test]
fn token_text_is_lossy_per_token() {
    let tok = synthetic_tokenizer();
    assert_eq!(
        tok.token_text(tok.token_id("Ġthe").unwrap()).as_deref(),
        Some(" the")
    );
    assert_eq!(tok.token_text(0xE4).as_deref(), Some("\u{FFFD}"));
    assert_eq!(tok.token_text(SYN_IM_END).as_deref(), Some("<|im_end|>"));
    assert_eq!(tok.token_text(10_000), None);
    assert_eq!(
        tok.token_bytes(tok.token_id("Ã©").unwrap()),
        Some("é".as_bytes())
    );
}

#[test]
fn unsupported_and_invalid_specs_are_clear_errors() {
    let mut spec = synthetic_spec("smollm");
    spec.model = "bert".into();
    let err = TextTokenizer::from_spec(&spec).unwrap_err();
    assert!(
        matches!(err, TokenizerError::UnsupportedModel(ref m) if m == "bert"),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("unsupported tokenizer model \"bert\""),
        "{err}"
    );
    // A SentencePiece vocabulary without its scores cannot be rebuilt.
    spec.model = "llama".into();
    let err = TextTokenizer::from_spec(&spec).unwrap_err();
    assert!(
        matches!(err, TokenizerError::InvalidSpec(ref m) if m.contains("one score per token")),
        "{err}"
    );

    let err = TextTokenizer::from_spec(&synthetic_spec("mystery")).unwrap_err();
    assert!(
        matches!(err, TokenizerError::UnsupportedPreTokenizer(_)),
        "{err}"
    );
    assert!(err.to_string().contains("tokenizer.json"), "{err}");

    let mut spec = synthetic_spec("smollm");
    spec.merges.push("nospace".into());
    assert!(matches!(
        TextTokenizer::from_spec(&spec),
        Err(TokenizerError::InvalidSpec(_))
    ));

    let mut spec = synthetic_spec("smollm");
    spec.token_types.pop();
    assert!(matches!(
        TextTokenizer::from_spec(&spec),
        Err(TokenizerError::InvalidSpec(_))
    ));

    let mut spec = synthetic_spec("smollm");
    spec.tokenizer_json = "{not json".into();
    assert!(matches!(
        TextTokenizer::from_spec(&spec),
        Err(TokenizerError::InvalidJson(_))
    ));
}

#[test]
fn tokenizer_json_takes_precedence() {
    let json = serde_json::json!({
        "version": "1.0",
        "added_tokens": [
            {"id": 2, "content": "<eos>", "single_word": false, "lstrip": false, "rstrip": false,
             "normalized": false, "special": true}
        ],
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "<eos>": 2, "ab": 3}, "merges": ["a b"]}
    });
    let mut spec = synthetic_spec("unknown-pre-ignored");
    spec.model = "ignored".into();
    spec.tokenizer_json = json.to_string();
    let tok = TextTokenizer::from_spec(&spec).unwrap();
    assert_eq!(tok.encode("abab<eos>", false).unwrap(), vec![3, 3, 2]);
    assert!(tok.is_special(2) && !tok.is_special(3));
    assert!(tok.is_byte_level());
    assert_eq!(tok.vocab_size(), 4);
    assert_eq!(tok.decode(&[3, 2], true), "ab");
}

// ---- the real SmolLM2 vocabulary ----

#[test]
fn reference_tokenizer_cases_exact() {
    let tok = real_tokenizer();
    let mut failures = Vec::new();
    for (text, expected) in tokenizer_cases() {
        let got = tok.encode(&text, false).unwrap();
        if got != expected {
            failures.push(format!("{text:?}: got {got:?}, expected {expected:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn reference_prompts_exact() {
    let tok = real_tokenizer();
    let prompts = reference()["prompts"].as_array().unwrap();
    assert_eq!(prompts.len(), 8);
    for p in prompts {
        let text = p["text"].as_str().unwrap();
        // add_bos_token is false for SmolLM2, so add_special_tokens changes nothing.
        assert_eq!(
            tok.encode(text, true).unwrap(),
            ids(&p["prompt_ids"]),
            "prompt {}",
            p["name"]
        );
        assert_eq!(
            tok.decode(&ids(&p["prompt_ids"]), false),
            text,
            "decode of prompt {}",
            p["name"]
        );
    }
}

#[test]
fn reference_decode() {
    let tok = real_tokenizer();
    for (text, ids) in tokenizer_cases() {
        // The vocabulary has no symbol for byte 0x04, which is dropped.
        let expected = text.replace('\u{4}', "");
        assert_eq!(tok.decode(&ids, false), expected, "{text:?}");
    }
    let p = prompt("chat_template");
    assert_eq!(
        tok.decode(&ids(&p["greedy_ids"]), false),
        p["greedy_text"].as_str().unwrap()
    );
    assert_eq!(
        tok.decode(&ids(&p["greedy_ids"]), true),
        "The capital of France is Paris.\nsystem\n\nuser\nI'm"
    );
}

#[test]
fn real_vocabulary_facts() {
    let tok = real_tokenizer();
    let meta = real_metadata();
    assert_eq!(tok.vocab_size(), 49152);
    assert_eq!(
        (meta.bos_token_id, meta.eos_token_id, meta.add_bos_token),
        (Some(1), Some(2), false)
    );
    assert!((0..=16).all(|id| tok.is_special(id)));
    assert!(!tok.is_special(17) && !tok.is_special(198));
    assert_eq!(tok.token_id("<|im_end|>"), Some(2));
    assert_eq!(tok.token_text(2).as_deref(), Some("<|im_end|>"));
    assert_eq!(tok.token_text(198).as_deref(), Some("\n"));
    let (ids, pieces) = tok.encode_with_pieces("  42 is", false).unwrap();
    assert_eq!(ids, vec![256, 36, 34, 314]);
    assert_eq!(pieces, vec!["ĠĠ", "4", "2", "Ġis"]);
}
