//! The start-up check of `speculation = draft`: the draft model's vocabulary must be the model's,
//! id for id, because its proposals are token ids that the model verifies (issue 28). A mismatch
//! is a bad setting: the worker exits with code 2 and one line naming the first difference.

use gguf::TokenizerMetadata;

/// How the draft model's vocabulary differs from the model's (the first difference found).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VocabularyMismatch {
    /// The tokenizers are of different kinds (`tokenizer.ggml.model`), so equal strings would not
    /// mean equal bytes.
    #[error("draft_model's tokenizer is {draft:?}, the model's is {model:?}")]
    TokenizerKind {
        /// The model's `tokenizer.ggml.model`.
        model: String,
        /// The draft model's.
        draft: String,
    },
    /// Different numbers of token ids, in the tokenizer or in the logits.
    #[error("draft_model has {draft} {what}, the model has {model}")]
    Size {
        /// `"tokens"` (the tokenizer's list) or `"logits per position"` (the output layer's width).
        what: &'static str,
        /// The model's count.
        model: usize,
        /// The draft model's count.
        draft: usize,
    },
    /// One id's token text (its bytes) differs.
    #[error("draft_model's token {id} is {draft:?}, the model's is {model:?}")]
    Token {
        /// The first id that differs.
        id: usize,
        /// The model's token.
        model: String,
        /// The draft model's token.
        draft: String,
    },
}

/// Checks that `draft` (the draft model's tokenizer metadata, `draft_logits` its output width)
/// has the same vocabulary as `model` (with `model_logits`): same tokenizer kind, same number of
/// tokens and logits, and the same bytes for every id.
///
/// Errors: the first [`VocabularyMismatch`], in that order of checks.
pub fn check_same_vocabulary(
    model: &TokenizerMetadata,
    model_logits: usize,
    draft: &TokenizerMetadata,
    draft_logits: usize,
) -> Result<(), VocabularyMismatch> {
    if model.model != draft.model {
        return Err(VocabularyMismatch::TokenizerKind {
            model: model.model.clone(),
            draft: draft.model.clone(),
        });
    }
    if model.tokens.len() != draft.tokens.len() {
        return Err(VocabularyMismatch::Size {
            what: "tokens",
            model: model.tokens.len(),
            draft: draft.tokens.len(),
        });
    }
    if model_logits != draft_logits {
        return Err(VocabularyMismatch::Size {
            what: "logits per position",
            model: model_logits,
            draft: draft_logits,
        });
    }
    let differs = model
        .tokens
        .iter()
        .zip(&draft.tokens)
        .position(|(m, d)| m.as_bytes() != d.as_bytes());
    match differs {
        Some(id) => Err(VocabularyMismatch::Token {
            id,
            model: model.tokens[id].clone(),
            draft: draft.tokens[id].clone(),
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vocab(kind: &str, tokens: &[&str]) -> TokenizerMetadata {
        TokenizerMetadata {
            model: kind.into(),
            pre: String::new(),
            tokens: tokens.iter().map(|t| t.to_string()).collect(),
            merges: Vec::new(),
            scores: Vec::new(),
            add_space_prefix: None,
            token_types: Vec::new(),
            bos_token_id: None,
            eos_token_id: None,
            eot_token_id: None,
            eos_token_ids: Vec::new(),
            add_bos_token: false,
            chat_template: None,
        }
    }

    #[test]
    fn the_first_difference_is_named() {
        let m = vocab("gpt2", &["a", "b", "Ġc"]);
        assert_eq!(check_same_vocabulary(&m, 3, &m.clone(), 3), Ok(()));
        let kind = check_same_vocabulary(&m, 3, &vocab("llama", &["a", "b", "Ġc"]), 3);
        assert_eq!(
            kind.unwrap_err().to_string(),
            "draft_model's tokenizer is \"llama\", the model's is \"gpt2\""
        );
        let size = check_same_vocabulary(&m, 3, &vocab("gpt2", &["a", "b"]), 3);
        assert_eq!(
            size.unwrap_err().to_string(),
            "draft_model has 2 tokens, the model has 3"
        );
        let logits = check_same_vocabulary(&m, 3, &m.clone(), 4);
        assert_eq!(
            logits.unwrap_err().to_string(),
            "draft_model has 4 logits per position, the model has 3"
        );
        let token = check_same_vocabulary(&m, 3, &vocab("gpt2", &["a", "B", "Ġd"]), 3);
        assert_eq!(
            token.unwrap_err().to_string(),
            "draft_model's token 1 is \"B\", the model's is \"b\""
        );
    }
}
