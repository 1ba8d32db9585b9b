//! `bench quality`: what a numerics setting of the CPU backend costs in model quality, measured on
//! a text (issue 26, "Quality, measured").
//!
//! For one model file, one text and two numerics settings (the baseline, `exact` by default, and
//! the candidate, `fast`), the text is tokenized with the model's own tokenizer and cut into
//! windows of 512 tokens ([`text`]); each window runs through the real forward pass of
//! [`backend_cpu::CpuModel`] in both settings, in-process, with the logits of every position
//! ([`score`]); every position that predicts a text token is scored ([`metrics`]): the perplexity
//! of each setting, the mean and p99 KL divergence of the candidate's next-token distributions
//! against the baseline's, and top-1 agreement. [`evaluate`] does it all; [`cli`] is the command
//! line; [`report`] the table and the JSON. [`prompts`] compares greedy decoding of the project's
//! reference prompts in both settings. [`api`] measures two servers through their HTTP APIs
//! instead (`--api URL --candidate-api URL`), with the same windows and metrics but no KL.
//!
//! What is scored: within a window, each token given the window's tokens before it; a window's
//! first token is not scored (a window that starts with the model's BOS token scores all its text
//! tokens, see [`text`]). This is not `llama-perplexity`'s figure: it scores only the second half
//! of each window, so its perplexity is lower for the same model and text; `--score-from 256`
//! scores as it does.

pub mod api;
pub mod cli;
pub mod evaluate;
pub mod metrics;
pub mod prompts;
pub mod report;
pub mod score;
#[cfg(test)]
mod tests;
pub mod text;

pub use evaluate::{evaluate, QualityRun};

use engine::backend::ModelError;

/// Why a quality run cannot go on.
#[derive(Debug, thiserror::Error)]
pub enum QualityError {
    /// Opening or loading the model failed, or the backend refused a step.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// Reading the text or the reference file failed.
    #[error("reading {path}")]
    Read {
        /// The file.
        path: std::path::PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The reference file is not a reference's JSON.
    #[error("{path} is not a reference file ({{\"prompts\": [{{\"name\", \"prompt_ids\", \"greedy_ids\"}}]}})")]
    Reference {
        /// The file.
        path: std::path::PathBuf,
        /// The JSON error.
        source: serde_json::Error,
    },
    /// The model's tokenizer could not be built or failed on the text.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// The window is longer than the model's context.
    #[error("a window of {window} tokens is longer than the model's context of {context}")]
    WindowPastContext {
        /// Tokens per window.
        window: usize,
        /// The model's context length.
        context: usize,
    },
    /// Scoring from this token on leaves nothing of a window to score.
    #[error("--score-from {score_from} leaves nothing of a {window}-token window to score")]
    ScoreFromPastWindow {
        /// The first token scored.
        score_from: usize,
        /// Tokens per window.
        window: usize,
    },
    /// A window of fewer than 2 tokens scores nothing.
    #[error("a window must hold at least 2 tokens, not {window}")]
    WindowTooSmall {
        /// Tokens per window.
        window: usize,
    },
    /// The text does not fill one window.
    #[error("the text has {tokens} tokens, fewer than one window's {window} text tokens")]
    TextTooShort {
        /// Tokens of the text.
        tokens: usize,
        /// Text tokens per window.
        window: usize,
    },
    /// The tokenizer produced an id outside the model's vocabulary.
    #[error("token id {id} is outside the model's vocabulary of {vocab}")]
    TokenOutOfVocab {
        /// The id.
        id: u32,
        /// The model's vocabulary size.
        vocab: usize,
    },
    /// The two settings' models have different vocabularies.
    #[error("the baseline's vocabulary ({baseline}) differs from the candidate's ({candidate})")]
    VocabMismatch {
        /// Baseline vocabulary size.
        baseline: usize,
        /// Candidate vocabulary size.
        candidate: usize,
    },
}
