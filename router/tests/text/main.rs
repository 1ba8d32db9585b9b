//! Tests of the router's text pipeline: tokenizer, streaming detokenizer
//! and chat template, on a synthetic vocabulary and on the real SmolLM2
//! vocabulary checked against `fixtures/reference.json`.

mod chat_template;
mod common;
mod detokenizer;
mod gemma_tokenizer;
mod tokenizer;
