//! Shared fixtures: the real models' tokenizer specs (SmolLM2, Gemma 3), their reference files and
//! a small synthetic byte-level vocabulary. The router's chat template tests include this file too.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use inference_proto::worker::TokenizerSpec;
use serde_json::Value;
use tokenizer::TextTokenizer;

/// `fixtures/reference.json`.
pub fn reference() -> &'static Value {
    static REF: OnceLock<Value> = OnceLock::new();
    REF.get_or_init(|| {
        let path = PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../fixtures/reference.json"
        ));
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        serde_json::from_str(&text).expect("reference.json is valid JSON")
    })
}

/// `(text, ids)` of every `tokenizer_cases` entry.
pub fn tokenizer_cases() -> Vec<(String, Vec<u32>)> {
    reference()["tokenizer_cases"]
        .as_array()
        .expect("tokenizer_cases")
        .iter()
        .map(|c| (c["text"].as_str().unwrap().to_string(), ids(&c["ids"])))
        .collect()
}

/// The reference prompt named `name`.
pub fn prompt(name: &str) -> &'static Value {
    reference()["prompts"]
        .as_array()
        .expect("prompts")
        .iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("no reference prompt {name:?}"))
}

/// A JSON array of ids.
pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("id array")
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// The real model's tokenizer metadata, read with the gguf crate. Panics
/// (the test fails, it is not skipped) when the model file is missing.
pub fn real_metadata() -> &'static gguf::TokenizerMetadata {
    static META: OnceLock<gguf::TokenizerMetadata> = OnceLock::new();
    META.get_or_init(|| {
        metadata_at(
            &gguf::testing::default_model_path(),
            "scripts/fetch-model (or set SMOLLM_MODEL)",
        )
    })
}

/// The tokenizer metadata of the model file at `path`. Panics (the test fails, it is not skipped)
/// when the file is missing, naming `fetch` (how to get it).
pub fn metadata_at(path: &std::path::Path, fetch: &str) -> gguf::TokenizerMetadata {
    assert!(
        path.exists(),
        "model file {} is missing: run {fetch} first",
        path.display()
    );
    let file = gguf::GgufFile::open(path)
        .unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()));
    gguf::TokenizerMetadata::from_gguf(&file).expect("tokenizer metadata")
}

/// What a worker would send for `meta`.
pub fn spec_from_metadata(meta: &gguf::TokenizerMetadata) -> TokenizerSpec {
    TokenizerSpec {
        model: meta.model.clone(),
        pre: meta.pre.clone(),
        tokens: meta.tokens.clone(),
        merges: meta.merges.clone(),
        token_types: meta.token_types.clone(),
        bos_token_id: meta.bos_token_id,
        add_bos_token: meta.add_bos_token,
        tokenizer_json: String::new(),
        scores: meta.scores.clone(),
        add_space_prefix: meta.add_space_prefix,
    }
}

/// The real SmolLM2 tokenizer (built once).
pub fn real_tokenizer() -> Arc<TextTokenizer> {
    static TOK: OnceLock<Arc<TextTokenizer>> = OnceLock::new();
    TOK.get_or_init(|| {
        Arc::new(
            TextTokenizer::from_spec(&spec_from_metadata(real_metadata()))
                .expect("real tokenizer builds"),
        )
    })
    .clone()
}

/// Id of the first special token in [`synthetic_spec`] (`<|im_start|>`);
/// `<|im_end|>` follows.
pub const SYN_IM_START: u32 = 256;
/// `<|im_end|>` in [`synthetic_spec`].
pub const SYN_IM_END: u32 = 257;

/// A tiny byte-level vocabulary: the 256 GPT-2 byte symbols (id = byte
/// value), `<|im_start|>` and `<|im_end|>` (control), then one token per
/// merge.
pub fn synthetic_spec(pre: &str) -> TokenizerSpec {
    let bytes = tokenizer::byte_level::byte_to_unicode();
    let mut tokens: Vec<String> = bytes.iter().map(|c| c.to_string()).collect();
    let mut token_types = vec![1; 256];
    for special in ["<|im_start|>", "<|im_end|>"] {
        tokens.push(special.to_string());
        token_types.push(3);
    }
    // "é" is C3 A9 = "Ã©"; "你" is E4 BD A0 = "ä½ł".
    let merges = ["Ġ t", "h e", "Ġt he", "1 2", "Ã ©", "ä ½", "ä½ ł"];
    for m in merges {
        tokens.push(m.replace(' ', ""));
        token_types.push(1);
    }
    TokenizerSpec {
        model: "gpt2".into(),
        pre: pre.into(),
        tokens,
        merges: merges.iter().map(|m| m.to_string()).collect(),
        token_types,
        bos_token_id: Some(SYN_IM_START),
        add_bos_token: false,
        tokenizer_json: String::new(),
        ..Default::default()
    }
}

/// The synthetic tokenizer with the `smollm` pre-tokenizer.
pub fn synthetic_tokenizer() -> Arc<TextTokenizer> {
    Arc::new(
        TextTokenizer::from_spec(&synthetic_spec("smollm")).expect("synthetic tokenizer builds"),
    )
}

/// `fixtures/gemma3-270m.json`.
pub fn gemma_reference() -> &'static Value {
    static REF: OnceLock<Value> = OnceLock::new();
    REF.get_or_init(|| {
        let text = include_str!("../../../fixtures/gemma3-270m.json");
        serde_json::from_str(text).expect("gemma3-270m.json is valid JSON")
    })
}

/// The Gemma 3 tokenizer built from the real file. Panics (the test fails, it is not skipped)
/// when the model file is missing.
pub fn gemma_tokenizer() -> Arc<TextTokenizer> {
    static TOK: OnceLock<Arc<TextTokenizer>> = OnceLock::new();
    TOK.get_or_init(|| {
        let meta = metadata_at(
            &gguf::testing::gemma3_model_path(),
            "scripts/fetch-model gemma3-270m",
        );
        assert_eq!(meta.model, "llama");
        Arc::new(TextTokenizer::from_spec(&spec_from_metadata(&meta)).expect("gemma tokenizer"))
    })
    .clone()
}
