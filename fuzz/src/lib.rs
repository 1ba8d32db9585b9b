//! Fuzz targets of every parser that takes outside bytes (issue 31). Each target is a plain
//! function `fn(&[u8])` that drives the project's own code and asserts the target's properties: it
//! panics (a finding) only when the code under test panics or breaks a property, never on input that
//! is merely bad (bad input must come back as a typed error, which the target checks).
//!
//! The same functions run under libFuzzer (`fuzz_targets/NAME.rs`, built by `cargo fuzz` with the
//! `libfuzzer` feature: `scripts/fuzz NAME SECONDS`) and, on stable, over every file of
//! `fuzz/corpus/NAME/` and `fuzz/artifacts/NAME/` (the regression test `tests/corpus.rs`).
//!
//! The corpus: `seed-*` files made from the project's fixtures by `examples/write_seeds.rs` (and,
//! for `openai-json`, the JSON bodies of the router's and the integration tests), plus the inputs
//! of the first runs that added coverage (libFuzzer's `-merge=1`, named by their SHA-1; not for
//! `gguf` and `model-files`, whose inputs are large). The artifacts: every input that once failed
//! a target, kept after its fix.
//!
//! | target | input | module |
//! |---|---|---|
//! | `openai-json` | an OpenAI request body, through parsing and the router's one validation pass | [`requests`] |
//! | `generate-request` | a protobuf `GenerateRequest`, through conversion and validation | [`requests`] |
//! | `gguf` | a GGUF file: header, metadata, tensor table, tokenizer metadata | [`model_files`] |
//! | `model-files` | one file of a Hugging Face folder: `config.json`, `model.safetensors`, the index, `tokenizer.model` | [`model_files`] |
//! | `detokenizer` | token ids and stop strings, through the streaming detokenizer and stop matcher | [`detokenizer`] |
//! | `chat-template` | chat messages through every built-in template; a template source through the router's template environment | [`chat_template`] |
//! | `constraint` | a JSON schema, regex, Lark grammar or choice list through constraint checking and compilation | [`constraint`] |
//! | `router-stream` | a sequence of router messages (structured, and raw protobuf) through the worker's stream handling and engine on the tiny model | [`router_stream`] |

#![warn(missing_docs)]

pub mod chat_template;
pub mod constraint;
pub mod detokenizer;
mod input;
pub mod model_files;
pub mod requests;
pub mod router_stream;
pub mod tiny_model;

pub use chat_template::chat_template;
pub use constraint::constraint;
pub use detokenizer::detokenizer;
pub use model_files::{gguf, model_files};
pub use requests::{generate_request, openai_json};
pub use router_stream::router_stream;

/// A fuzz target's entry point: drives the code under test with one input; panics on a finding.
pub type Target = fn(&[u8]);

/// Every target, by the name `cargo fuzz` and `scripts/fuzz` use (the binary in `fuzz_targets/` and
/// the folders under `fuzz/corpus/` and `fuzz/artifacts/`).
pub const TARGETS: &[(&str, Target)] = &[
    ("openai-json", openai_json),
    ("generate-request", generate_request),
    ("gguf", gguf),
    ("model-files", model_files),
    ("detokenizer", detokenizer),
    ("chat-template", chat_template),
    ("constraint", constraint),
    ("router-stream", router_stream),
];
