//! The Gemma 3 SentencePiece vocabulary (GGUF `tokenizer.ggml.model = "llama"`, 262,144 pieces, no
//! merges) against `fixtures/gemma3-270m.json`: 30 tokenizer cases whose ids came from Hugging
//! Face's `GemmaTokenizer` and agree with llama.cpp.

use crate::common::{gemma_reference as fixture, gemma_tokenizer as gemma, ids};

#[test]
fn every_reference_case_encodes_exactly_with_and_without_bos() {
    let tok = gemma();
    let cases = fixture()["tokenizer_cases"].as_array().expect("cases");
    assert_eq!(cases.len(), 30);
    let mut failures = Vec::new();
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let with_bos = tok.encode(text, true).unwrap();
        let without = tok.encode(text, false).unwrap();
        if with_bos != ids(&case["ids"]) || without != ids(&case["ids_no_bos"]) {
            failures.push(format!(
                "{text:?}: got {without:?}, want {:?}",
                ids(&case["ids_no_bos"])
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} cases differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn every_reference_prompt_encodes_to_its_ids() {
    let tok = gemma();
    for p in fixture()["prompts"].as_array().expect("prompts") {
        let text = p["text"].as_str().expect("prompt text");
        assert_eq!(
            tok.encode(text, true).unwrap(),
            ids(&p["prompt_ids"]),
            "prompt {:?}",
            p["name"]
        );
    }
}

#[test]
fn decoding_returns_the_text_and_special_tokens_are_control_only() {
    let tok = gemma();
    assert!(
        tok.is_byte_level(),
        "add_space_prefix is false: pure per-token bytes"
    );
    for case in fixture()["tokenizer_cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let ids = tok.encode(text, false).unwrap();
        assert_eq!(tok.decode(&ids, false), text);
    }
    // <start_of_turn> (105) and <end_of_turn> (106) are control; "\n" (107) is user-defined text.
    assert!(tok.is_special(105) && tok.is_special(106) && tok.is_special(2));
    assert!(!tok.is_special(107));
    assert_eq!(tok.decode(&[105, 2364, 107, 2202, 106], true), "user\nhi");
    // As plain text (chat content, or a prompt with prompt_as_plain_text) a control token's text is
    // ordinary characters; user-defined tokens ("\n") stay what they are, since they are text.
    let plain = tok.encode_plain("<start_of_turn>user\n", false).unwrap();
    assert!(!plain.contains(&105), "{plain:?}");
    assert_eq!(tok.decode(&plain, false), "<start_of_turn>user\n");
    assert_eq!(plain.last(), Some(&107));
    // Byte fallback: a character outside the vocabulary decodes back through its bytes.
    let rare = "\u{10FFFD}";
    assert_eq!(tok.decode(&tok.encode(rare, false).unwrap(), false), rare);
}
