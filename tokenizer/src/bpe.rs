//! GGUF byte-level BPE vocabularies (`tokenizer.ggml.model = "gpt2"`) reproduced with the
//! `tokenizers` crate.
//!
//! The tokenizer is a byte-level BPE (Radford et al. 2019,
//! <https://github.com/openai/gpt-2/blob/master/src/encoder.py>) assembled so that it reproduces the
//! original Hugging Face `tokenizer.json` of the model family named by `tokenizer.ggml.pre`:
//!
//! - `smollm`, `starcoder`, `refact`: `Digits(individual_digits)` then `ByteLevel` with the GPT-2
//!   regex (SmolLM2 / StarCoder; llama.cpp's `\p{N}` split then the GPT-2 regex);
//! - `gpt-2`, `gpt2`: `ByteLevel` with the GPT-2 regex;
//! - `llama-bpe`, `llama3`: the Llama 3 `Split` regex then `ByteLevel` without regex, and a BPE
//!   with `ignore_merges`.
//!
//! Control (GGUF token type 3) and user-defined (type 4) tokens become *special added tokens*,
//! matched verbatim in input text before pre-tokenization. Byte symbols missing from the vocabulary
//! are dropped while encoding (no unknown token), exactly as the Hugging Face BPE model does when
//! `unk_token` is null.

use std::collections::HashSet;

use inference_proto::worker::TokenizerSpec;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior, Tokenizer};

use crate::error::TokenizerError;

/// GGUF token type of control tokens (`<|im_start|>` …).
const TOKEN_TYPE_CONTROL: i32 = 3;
/// GGUF token type of user-defined tokens.
const TOKEN_TYPE_USER_DEFINED: i32 = 4;

/// The Llama 3 pre-tokenization regex (from Meta-Llama-3 `tokenizer.json`,
/// identical to llama.cpp's `LLAMA_VOCAB_PRE_TYPE_LLAMA3`).
const LLAMA3_SPLIT_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// A byte-level BPE vocabulary assembled as a `tokenizers` tokenizer.
pub(crate) struct BpeTokenizer {
    /// The tokenizer (pre-tokenizer, BPE, special added tokens, `ByteLevel` decoder).
    pub tokenizer: Tokenizer,
    /// Ids of control and user-defined tokens.
    pub special_ids: HashSet<u32>,
}

/// Builds the tokenizer of a `"gpt2"` (byte-level BPE) GGUF vocabulary.
///
/// # Errors
/// [`TokenizerError::UnsupportedPreTokenizer`] for a `pre` not listed in the [module docs](self),
/// [`TokenizerError::InvalidSpec`] for an empty vocabulary, token types whose count differs from
/// the tokens', a merge without a space, or a vocabulary the BPE cannot be built from.
pub(crate) fn build(spec: &TokenizerSpec) -> Result<BpeTokenizer, TokenizerError> {
    if spec.tokens.is_empty() {
        return Err(TokenizerError::InvalidSpec("empty token list".into()));
    }
    if !spec.token_types.is_empty() && spec.token_types.len() != spec.tokens.len() {
        return Err(TokenizerError::InvalidSpec(format!(
            "{} token types for {} tokens",
            spec.token_types.len(),
            spec.tokens.len()
        )));
    }
    let (pre_tokenizer, ignore_merges) = pre_tokenizer_for(&spec.pre)?;

    // Vocabulary: token string -> index. On duplicate strings the first id wins.
    let mut vocab = Vocab::with_capacity(spec.tokens.len());
    for (id, token) in spec.tokens.iter().enumerate() {
        vocab.entry(token.clone()).or_insert(id as u32);
    }
    let merges = spec
        .merges
        .iter()
        .map(|m| {
            m.split_once(' ')
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .ok_or_else(|| {
                    TokenizerError::InvalidSpec(format!("merge {m:?} has no space separator"))
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .ignore_merges(ignore_merges)
        .build()
        .map_err(|e| TokenizerError::InvalidSpec(e.to_string()))?;

    let mut tokenizer = Tokenizer::new(bpe);
    tokenizer.with_pre_tokenizer(Some(pre_tokenizer));
    tokenizer.with_decoder(Some(ByteLevelDecoder::new(false, true, true)));

    let mut special_ids = HashSet::new();
    let mut added = Vec::new();
    for (id, ty) in spec.token_types.iter().enumerate() {
        if matches!(*ty, TOKEN_TYPE_CONTROL | TOKEN_TYPE_USER_DEFINED)
            && !spec.tokens[id].is_empty()
        {
            special_ids.insert(id as u32);
            added.push(AddedToken::from(spec.tokens[id].clone(), true));
        }
    }
    tokenizer.add_special_tokens(&added);
    Ok(BpeTokenizer {
        tokenizer,
        special_ids,
    })
}

/// Returns the pre-tokenizer for `tokenizer.ggml.pre`, and whether the BPE
/// model must take whole pre-tokens found in the vocabulary as-is
/// (`ignore_merges`, Llama 3).
fn pre_tokenizer_for(pre: &str) -> Result<(PreTokenizerWrapper, bool), TokenizerError> {
    let byte_level = |use_regex| ByteLevel::new(false, true, use_regex);
    match pre {
        // llama.cpp: `\p{N}` then the GPT-2 regex; HF: Digits(individual) + ByteLevel.
        "smollm" | "starcoder" | "refact" => Ok((
            Sequence::new(vec![Digits::new(true).into(), byte_level(true).into()]).into(),
            false,
        )),
        "gpt-2" | "gpt2" => Ok((byte_level(true).into(), false)),
        "llama-bpe" | "llama3" => {
            let split = Split::new(
                SplitPattern::Regex(LLAMA3_SPLIT_REGEX.to_string()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(|e| TokenizerError::InvalidSpec(e.to_string()))?;
            Ok((
                Sequence::new(vec![split.into(), byte_level(false).into()]).into(),
                true,
            ))
        }
        other => Err(TokenizerError::UnsupportedPreTokenizer(other.to_string())),
    }
}
