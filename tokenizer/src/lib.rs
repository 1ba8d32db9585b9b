//! Text tokenization, shared by the router (prompts, streamed text), the `bench` tool (prompts
//! tokenized as the router would) and structured output (GPT-2's byte alphabet):
//!
//! - [`TextTokenizer`]: built from the `TokenizerSpec` a worker reports: a GGUF byte-level BPE
//!   (`"gpt2"`, `bpe.rs`) or SentencePiece-style (`"llama"`, `sentencepiece.rs`) vocabulary, or a
//!   `tokenizer.json`; encodes text (or a rendered chat's [`TemplatePiece`]s) and decodes ids.
//! - [`IncrementalDetokenizer`]: generated ids, one at a time, to text deltas that never split a
//!   UTF-8 character.
//! - [`byte_level`]: GPT-2's byte-to-unicode alphabet (the workspace's one copy).
//!
//! Feature `text` (on by default) brings everything but [`byte_level`], with the `tokenizers`
//! library and the worker protocol; without it the crate is the alphabet alone and has no
//! dependency (the worker's structured output and `gguf`'s test model use it so).

#![warn(missing_docs)]

pub mod byte_level;

#[cfg(feature = "text")]
mod bpe;
#[cfg(feature = "text")]
mod detokenizer;
#[cfg(feature = "text")]
mod error;
#[cfg(feature = "text")]
mod sentencepiece;
#[cfg(feature = "text")]
mod text_tokenizer;
#[cfg(feature = "text")]
mod token_bytes;

#[cfg(feature = "text")]
pub use detokenizer::IncrementalDetokenizer;
#[cfg(feature = "text")]
pub use error::TokenizerError;
#[cfg(feature = "text")]
pub use text_tokenizer::{TemplatePiece, TextTokenizer};
