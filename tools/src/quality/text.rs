//! The text of `bench quality` as the model sees it: tokenized with the model file's own tokenizer
//! (built as the worker's `Info` describes it and the router builds it) and cut into windows.
//!
//! A window is `window` tokens of model input, run from position 0 with nothing before it. When the
//! model's tokenizer asks for a beginning-of-sequence token (`tokenizer.ggml.add_bos_token`, e.g.
//! Gemma 3), each window is that token followed by `window - 1` text tokens, and every text token
//! of the window is scored; otherwise a window is `window` text tokens and its first token is not
//! scored (nothing predicts it). The text's tokens run through the windows in order without
//! overlap; a remainder shorter than a window is left out, as `llama-perplexity` leaves it.
//!
//! [`WindowLayout::LlamaPerplexity`] cuts the windows exactly as llama.cpp's `llama-perplexity`
//! does instead (`tools/perplexity/perplexity.cpp`, `perplexity()`, llama.cpp 0.3.36), so that its
//! perplexity and ours are over the same scored tokens: the text is tokenized with the BOS in front
//! (when the model asks for one), cut into consecutive `window`-token chunks, and each chunk's first
//! token is replaced by the BOS (one text token per chunk after the first is lost, as there).
//! `llama-perplexity` scores the second half of each chunk: the logits at positions
//! `window/2 .. window-2` against the tokens after them, which is our `score_from = window/2 + 1`
//! ([`WindowLayout::default_score_from`]).

use std::path::Path;

use gguf::{GgufFile, TokenizerMetadata};
use inference_proto::worker::TokenizerSpec;
use tokenizer::TextTokenizer;

use super::QualityError;

/// The model's tokenizer and the beginning-of-sequence token each window starts with, if any.
pub struct ModelTokenizer {
    tokenizer: TextTokenizer,
    bos: Option<u32>,
}

impl ModelTokenizer {
    /// Builds the tokenizer of the model opened from `path` as `file` (a GGUF file, or the GGUF
    /// view of a Hugging Face folder, whose `tokenizer.json` is then used as the worker passes it).
    ///
    /// Errors: [`QualityError::Tokenizer`] for missing or malformed `tokenizer.ggml.*` metadata or
    /// a vocabulary the tokenizer cannot build.
    pub fn from_model(path: &Path, file: &GgufFile) -> Result<ModelTokenizer, QualityError> {
        let tok = TokenizerMetadata::from_gguf(file)
            .map_err(|e| QualityError::Tokenizer(e.to_string()))?;
        let tokenizer_json = path
            .is_dir()
            .then(|| std::fs::read_to_string(path.join("tokenizer.json")).ok())
            .flatten()
            .unwrap_or_default();
        let bos = tok.bos_token_id.filter(|_| tok.add_bos_token);
        let spec = TokenizerSpec {
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
        };
        let tokenizer =
            TextTokenizer::from_spec(&spec).map_err(|e| QualityError::Tokenizer(e.to_string()))?;
        Ok(ModelTokenizer { tokenizer, bos })
    }

    /// The token each window starts with (`None` when the model does not ask for one).
    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    /// The ids of `text`, with no special token added and special-token text read as plain text.
    ///
    /// Errors: [`QualityError::Tokenizer`] when the tokenizer fails.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, QualityError> {
        self.tokenizer
            .encode_plain(text, false)
            .map_err(|e| QualityError::Tokenizer(e.to_string()))
    }
}

/// How a text's tokens become windows (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum WindowLayout {
    /// Consecutive text tokens, each window with the BOS in front when the model asks for one
    /// ([`windows`]).
    #[default]
    Consecutive,
    /// As llama.cpp's `llama-perplexity` ([`llama_perplexity_windows`]).
    LlamaPerplexity,
}

impl WindowLayout {
    /// `ids` (the text's tokens, no BOS) cut into windows of `window` tokens of model input.
    ///
    /// Errors: those of [`windows`].
    pub fn cut(
        self,
        ids: &[u32],
        window: usize,
        bos: Option<u32>,
    ) -> Result<Vec<Vec<u32>>, QualityError> {
        match self {
            WindowLayout::Consecutive => windows(ids, window, bos),
            WindowLayout::LlamaPerplexity => llama_perplexity_windows(ids, window, bos),
        }
    }

    /// The first token scored when none is asked for: every token but the first
    /// (`Consecutive`), the second half as `llama-perplexity` scores it (`window / 2 + 1`).
    pub fn default_score_from(self, window: usize) -> usize {
        match self {
            WindowLayout::Consecutive => 0,
            WindowLayout::LlamaPerplexity => window / 2 + 1,
        }
    }
}

/// `ids` cut as `llama-perplexity` cuts them (see the module docs): `bos` (when given) then `ids`,
/// in chunks of `window`, each chunk's first token set to `bos`.
///
/// Errors: as [`windows`].
pub fn llama_perplexity_windows(
    ids: &[u32],
    window: usize,
    bos: Option<u32>,
) -> Result<Vec<Vec<u32>>, QualityError> {
    check_window(window)?;
    let all: Vec<u32> = bos.into_iter().chain(ids.iter().copied()).collect();
    let out: Vec<Vec<u32>> = all
        .chunks_exact(window)
        .map(|chunk| {
            let mut w = chunk.to_vec();
            if let Some(b) = bos {
                w[0] = b;
            }
            w
        })
        .collect();
    at_least_one(out, ids.len(), window)
}

/// [`QualityError::WindowTooSmall`] for a window of fewer than 2 tokens (nothing to score).
fn check_window(window: usize) -> Result<(), QualityError> {
    if window < 2 {
        return Err(QualityError::WindowTooSmall { window });
    }
    Ok(())
}

/// `out`, or [`QualityError::TextTooShort`] (`tokens` of text, `window` of them per window) when
/// the text filled no window.
fn at_least_one(
    out: Vec<Vec<u32>>,
    tokens: usize,
    window: usize,
) -> Result<Vec<Vec<u32>>, QualityError> {
    if out.is_empty() {
        return Err(QualityError::TextTooShort { tokens, window });
    }
    Ok(out)
}

/// `ids` cut into windows of `window` tokens of model input, each starting with `bos` when given
/// (see the module docs). Returns the windows in text order.
///
/// Errors: [`QualityError::WindowTooSmall`] when a window holds fewer than 2 tokens (nothing
/// would be scored), [`QualityError::TextTooShort`] when `ids` does not fill one window.
pub fn windows(
    ids: &[u32],
    window: usize,
    bos: Option<u32>,
) -> Result<Vec<Vec<u32>>, QualityError> {
    check_window(window)?;
    let text_per_window = window - usize::from(bos.is_some());
    let out: Vec<Vec<u32>> = ids
        .chunks_exact(text_per_window)
        .map(|chunk| bos.into_iter().chain(chunk.iter().copied()).collect())
        .collect();
    at_least_one(out, ids.len(), text_per_window)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_without_bos_drop_the_remainder() {
        let ids: Vec<u32> = (0..10).collect();
        let w = windows(&ids, 4, None).unwrap();
        assert_eq!(w, [vec![0, 1, 2, 3], vec![4, 5, 6, 7]]);
    }

    #[test]
    fn windows_with_bos_start_with_it() {
        let ids: Vec<u32> = (10..17).collect();
        let w = windows(&ids, 4, Some(1)).unwrap();
        assert_eq!(w, [vec![1, 10, 11, 12], vec![1, 13, 14, 15]]);
    }

    #[test]
    fn llama_perplexity_windows_put_bos_over_each_chunks_first_token() {
        let ids: Vec<u32> = (10..20).collect();
        // BOS + 10 text tokens = 11, two chunks of 4 (the BOS, 10, 11, 12 | BOS over 13, 14..16).
        let w = llama_perplexity_windows(&ids, 4, Some(1)).unwrap();
        assert_eq!(w, [vec![1, 10, 11, 12], vec![1, 14, 15, 16]]);
        let w = llama_perplexity_windows(&ids, 4, None).unwrap();
        assert_eq!(w, [vec![10, 11, 12, 13], vec![14, 15, 16, 17]]);
        assert_eq!(WindowLayout::LlamaPerplexity.default_score_from(512), 257);
        assert_eq!(WindowLayout::Consecutive.default_score_from(512), 0);
    }

    #[test]
    fn refuses_short_texts_and_tiny_windows() {
        assert!(matches!(
            windows(&[1, 2, 3], 4, None),
            Err(QualityError::TextTooShort {
                tokens: 3,
                window: 4
            })
        ));
        assert!(matches!(
            windows(&[1, 2, 3], 1, None),
            Err(QualityError::WindowTooSmall { window: 1 })
        ));
    }
}
