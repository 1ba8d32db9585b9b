//! Tests of the router's chat templates with the real SmolLM2 and Gemma 3 vocabularies, checked
//! against `fixtures/reference.json` and `fixtures/gemma3-270m.json` (the tokenizer and
//! detokenizer tests are the tokenizer crate's).

mod chat_template;
/// The tokenizer crate's shared fixtures (reference file, real SmolLM2 tokenizer); the chat
/// template tests use part of them.
#[allow(dead_code)]
#[path = "../../../tokenizer/tests/text/common.rs"]
mod common;
mod gemma_chat_template;
