//! Tokenizer description stored in GGUF metadata (`tokenizer.ggml.*` keys,
//! as written by llama.cpp's `convert_hf_to_gguf.py`).

use crate::error::{GgufError, Result};
use crate::GgufFile;

/// The tokenizer-related metadata of a GGUF model.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenizerMetadata {
    /// `tokenizer.ggml.model`, e.g. `"gpt2"` (byte-level BPE) or `"llama"` (SentencePiece).
    pub model: String,
    /// `tokenizer.ggml.pre`, the pre-tokenizer name (e.g. `"smollm"`); empty if absent.
    pub pre: String,
    /// `tokenizer.ggml.tokens`: token strings indexed by id.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.merges`: BPE merges as `"left right"`, highest priority
    /// first; empty if absent.
    pub merges: Vec<String>,
    /// `tokenizer.ggml.scores` per token (SentencePiece piece scores: the higher, the earlier a
    /// merge producing the piece applies); empty if absent.
    pub scores: Vec<f32>,
    /// `tokenizer.ggml.add_space_prefix` (SentencePiece: prepend a space to the text before
    /// encoding); `None` if absent (llama.cpp then assumes `true` for `"llama"` vocabularies).
    pub add_space_prefix: Option<bool>,
    /// `tokenizer.ggml.token_type` per token (1 normal, 2 unknown, 3 control,
    /// 4 user-defined, 5 unused, 6 byte); all 1 if absent.
    pub token_types: Vec<i32>,
    /// `tokenizer.ggml.bos_token_id`.
    pub bos_token_id: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`.
    pub eos_token_id: Option<u32>,
    /// `tokenizer.ggml.eot_token_id` (end of turn).
    pub eot_token_id: Option<u32>,
    /// `tokenizer.ggml.eos_token_ids`: every end-of-generation id, where the model declares
    /// several (not a llama.cpp key: written by the `model-files` crate for Hugging Face folders
    /// whose `config.json` lists several `eos_token_id`s); empty if absent.
    pub eos_token_ids: Vec<u32>,
    /// `tokenizer.ggml.add_bos_token`; `false` if absent.
    pub add_bos_token: bool,
    /// `tokenizer.chat_template` (a Jinja template), if present.
    pub chat_template: Option<String>,
}

impl TokenizerMetadata {
    /// Reads the tokenizer metadata from `file`.
    ///
    /// Errors: `MissingKey` if `tokenizer.ggml.model` or
    /// `tokenizer.ggml.tokens` is absent, `TypeMismatch` for values of the wrong
    /// type, `SizeMismatch` if `token_type` does not have one entry per token
    /// or a special token id is out of range.
    pub fn from_gguf(file: &GgufFile) -> Result<Self> {
        let tokens = file.get_str_array("tokenizer.ggml.tokens")?.to_vec();
        let token_types = file
            .get_opt_i32_array("tokenizer.ggml.token_type")?
            .unwrap_or_else(|| vec![1; tokens.len()]);
        if token_types.len() != tokens.len() {
            return Err(GgufError::SizeMismatch(format!(
                "tokenizer.ggml.token_type has {} entries for {} tokens",
                token_types.len(),
                tokens.len()
            )));
        }
        let scores = file
            .get_opt_f32_array("tokenizer.ggml.scores")?
            .unwrap_or_default();
        if !scores.is_empty() && scores.len() != tokens.len() {
            return Err(GgufError::SizeMismatch(format!(
                "tokenizer.ggml.scores has {} entries for {} tokens",
                scores.len(),
                tokens.len()
            )));
        }
        let special = |key: &str| -> Result<Option<u32>> {
            let id = file.get_opt_u32(key)?;
            match id {
                Some(id) if id as usize >= tokens.len() => Err(GgufError::SizeMismatch(format!(
                    "{key} = {id} is out of range for {} tokens",
                    tokens.len()
                ))),
                _ => Ok(id),
            }
        };
        Ok(TokenizerMetadata {
            model: file.get_str("tokenizer.ggml.model")?.to_string(),
            pre: file
                .get_opt_str("tokenizer.ggml.pre")?
                .unwrap_or_default()
                .to_string(),
            merges: file
                .get_opt_str_array("tokenizer.ggml.merges")?
                .map(<[String]>::to_vec)
                .unwrap_or_default(),
            bos_token_id: special("tokenizer.ggml.bos_token_id")?,
            eos_token_id: special("tokenizer.ggml.eos_token_id")?,
            eot_token_id: special("tokenizer.ggml.eot_token_id")?,
            eos_token_ids: match file.get_opt_i32_array("tokenizer.ggml.eos_token_ids")? {
                None => Vec::new(),
                Some(ids) => ids
                    .into_iter()
                    .map(|id| match u32::try_from(id) {
                        Ok(id) if (id as usize) < tokens.len() => Ok(id),
                        _ => Err(GgufError::SizeMismatch(format!(
                            "tokenizer.ggml.eos_token_ids: {id} is out of range for {} tokens",
                            tokens.len()
                        ))),
                    })
                    .collect::<Result<_>>()?,
            },
            add_bos_token: file
                .get_opt_bool("tokenizer.ggml.add_bos_token")?
                .unwrap_or(false),
            chat_template: file
                .get_opt_str("tokenizer.chat_template")?
                .map(str::to_string),
            add_space_prefix: file.get_opt_bool("tokenizer.ggml.add_space_prefix")?,
            tokens,
            scores,
            token_types,
        })
    }
}
