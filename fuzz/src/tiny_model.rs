//! The served model the request targets validate against: the tiny test model of
//! [`gguf::testing::write_tiny_llama`] (the vocabulary the router's tests use: 3 special tokens,
//! the 256 GPT-2 byte symbols and a few merges), described to the router as a worker describes it
//! in `Info`, with SmolLM2's chat template, and turned into the router's [`ModelContext`] by
//! [`ModelContext::from_info`] (tokenizer, chat template, structured-output compiler).

use std::sync::{Arc, OnceLock};

use inference_proto::worker::{InfoResponse, TokenizerSpec};
use router::model_context::ModelContext;

/// Context length of the tiny model, in tokens.
pub const CONTEXT_LENGTH: u32 = 256;

/// The tiny model's `Info`, as its worker sends it (built once; writes the model file to a
/// temporary folder and removes it).
pub fn info() -> &'static InfoResponse {
    static INFO: OnceLock<InfoResponse> = OnceLock::new();
    INFO.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("fuzz-tiny-model-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temporary folder for the tiny model");
        let tiny = gguf::testing::write_tiny_llama(&dir.join("tiny.gguf"), 1)
            .expect("the tiny model is written");
        let _ = std::fs::remove_dir_all(&dir);
        let mut token_types = vec![3; 3];
        token_types.resize(tiny.tokens.len(), 1);
        InfoResponse {
            model_name: "tiny".into(),
            architecture: "llama".into(),
            context_length: CONTEXT_LENGTH,
            vocab_size: tiny.tokens.len() as u32,
            eos_token_ids: vec![tiny.eos_token_id],
            bos_token_id: Some(tiny.bos_token_id),
            chat_template: gguf::testing::SMOLLM2_CHAT_TEMPLATE.into(),
            tokenizer: Some(TokenizerSpec {
                model: "gpt2".into(),
                pre: "smollm".into(),
                tokens: tiny.tokens.clone(),
                merges: tiny.merges.clone(),
                token_types,
                bos_token_id: Some(tiny.bos_token_id),
                add_bos_token: false,
                ..Default::default()
            }),
            ..Default::default()
        }
    })
}

/// The router's view of the tiny model (built once, shared by every input).
pub fn model() -> &'static Arc<ModelContext> {
    static MODEL: OnceLock<Arc<ModelContext>> = OnceLock::new();
    MODEL.get_or_init(|| {
        let model = ModelContext::from_info(info(), None).expect("the tiny model's context");
        // Wait for the structured-output compiler here, once, so no input pays for it.
        model
            .constraints
            .wait()
            .expect("structured output for the tiny model");
        Arc::new(model)
    })
}
