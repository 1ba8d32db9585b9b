//! Tests of the text tokenizer and the streaming detokenizer, on a synthetic vocabulary and on the
//! real SmolLM2 and Gemma 3 vocabularies checked against `fixtures/reference.json` and
//! `fixtures/gemma3-270m.json`.

mod common;
mod detokenizer;
mod gemma_tokenizer;
mod text_tokenizer;
