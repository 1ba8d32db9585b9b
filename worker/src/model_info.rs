//! The model's description sent to routers in `Info`: architecture, limits, EOS ids, chat template and
//! the tokenizer spec (the router builds its tokenizer from it; the worker never handles text).

use std::path::Path;

use gguf::{GgufFile, TokenizerMetadata};
use inference_proto::worker::{InfoResponse, TokenizerSpec};

/// `name` as a model id for requests' `model` field: lower case, each run of characters other than
/// ASCII letters, digits, `.`, `_` and `-` replaced by one `-`, no `-` at either end
/// (`"SmolLM2 135M Instruct"` -> `"smollm2-135m-instruct"`).
pub fn model_id(name: &str) -> String {
    let mut id = String::with_capacity(name.len());
    for c in name.chars() {
        if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
            id.push(c.to_ascii_lowercase());
        } else if !id.ends_with('-') {
            id.push('-');
        }
    }
    id.trim_matches('-').to_string()
}

/// Builds the static part of `Info` from the model file (`served_model_name` is the model's name
/// made an id, [`model_id`]; the worker's `served_model_name` setting replaces it). `backend` is
/// `"cpu"` and `numerics` empty: the worker sets both to the backend and numeric mode it runs.
///
/// `eos_token_ids` holds every end-of-sequence id the model declares (`eos`, `eot`) plus
/// the end-of-turn tokens of the known chat formats when the vocabulary has them (`<|im_end|>`,
/// `<|endoftext|>`, `<|eot_id|>`, `<|end_of_text|>`, Gemma's `<end_of_turn>`, Phi-3's `<|end|>`),
/// since chat models end turns with them and not every file declares its `eot`.
/// A `tokenizer.json` beside the model file (or in the model's Hugging Face folder) is passed
/// along verbatim and takes precedence; a folder's `eos_token_id` list is carried by
/// `tokenizer.ggml.eos_token_ids`.
///
/// Errors: missing or malformed `tokenizer.ggml.*` metadata.
pub fn model_info(
    path: &Path,
    file: &GgufFile,
    context_length: usize,
    vocab_size: usize,
) -> anyhow::Result<InfoResponse> {
    let tok = TokenizerMetadata::from_gguf(file)?;
    let mut eos: Vec<u32> = [tok.eos_token_id, tok.eot_token_id]
        .into_iter()
        .flatten()
        .chain(tok.eos_token_ids.iter().copied())
        .collect();
    for name in [
        "<|im_end|>",
        "<|endoftext|>",
        "<|eot_id|>",
        "<|end_of_text|>",
        "<end_of_turn>", // Gemma: a chat turn ends with it; the file declares only <eos>
        "<|end|>",       // Phi-3
    ] {
        if let Some(id) = tok.tokens.iter().position(|t| t == name) {
            eos.push(id as u32);
        }
    }
    eos.sort_unstable();
    eos.dedup();
    let dir = match path.is_dir() {
        true => Some(path),
        false => path.parent(),
    };
    let tokenizer_json = dir
        .map(|dir| dir.join("tokenizer.json"))
        .and_then(|p| std::fs::read_to_string(p).ok())
        .unwrap_or_default();
    let model_name = file
        .get_str("general.name")
        .ok()
        .map(str::to_string)
        .unwrap_or_else(|| {
            path.file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default()
        });
    Ok(InfoResponse {
        served_model_name: model_id(&model_name),
        model_name,
        architecture: file.get_str("general.architecture")?.to_string(),
        context_length: context_length as u32,
        vocab_size: vocab_size as u32,
        eos_token_ids: eos,
        chat_template: tok.chat_template.clone().unwrap_or_default(),
        bos_token_id: tok.bos_token_id,
        eot_token_id: tok.eot_token_id,
        backend: "cpu".into(),
        numerics: String::new(),
        stats: None,
        tokenizer: Some(TokenizerSpec {
            model: tok.model,
            pre: tok.pre,
            tokens: tok.tokens,
            merges: tok.merges,
            token_types: tok.token_types,
            bos_token_id: tok.bos_token_id,
            add_bos_token: tok.add_bos_token,
            tokenizer_json,
            scores: tok.scores,
            add_space_prefix: tok.add_space_prefix,
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::model_id;

    #[test]
    fn model_ids_are_lower_case_without_spaces() {
        assert_eq!(model_id("SmolLM2 135M Instruct"), "smollm2-135m-instruct");
        assert_eq!(model_id("  Qwen2.5 (0.5B) / chat "), "qwen2.5-0.5b-chat");
        assert_eq!(model_id("tiny_llama-v1"), "tiny_llama-v1");
        assert_eq!(model_id("***"), "");
    }
}
