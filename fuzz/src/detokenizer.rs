//! Token ids through the router's streaming detokenizer ([`IncrementalDetokenizer`], both its
//! strategies) and stop-string matcher ([`StopMatcher`]), fed one id at a time as the router's
//! response stream feeds them, on the tiny test tokenizer ([`crate::tiny_model`]).
//!
//! Properties: the streamed text equals the one-shot decode ([`tokenizer::TextTokenizer::decode`]);
//! with stop strings, the text let through never contains a stop string, and it is the decode cut
//! just before the stop string that matched (or the whole decode when none matched, which then
//! contains none). And text prompts: the plain-text encoding of any text decodes back to it.

use std::sync::Arc;

use router::stop::StopMatcher;
use tokenizer::{IncrementalDetokenizer, TextTokenizer};

use crate::input::Input;
use crate::tiny_model;

/// Most stop strings an input sets (the router's default `max_stop_sequences` is 8).
const MAX_STOPS: u8 = 4;

/// `detokenizer`. The input: a flags byte (bit 0: skip special tokens; bits 1-3: the number of stop
/// strings, at most [`MAX_STOPS`]); each stop string as a kind byte and two bytes (even kind: a piece
/// of the decoded text, from character `a`, `1 + b % 8` characters long; odd kind: the next `b % 8 + 1`
/// bytes as UTF-8, lossily); then token ids, two bytes each, modulo the vocabulary size. A second
/// pass takes the whole input, lossily, as prompt text.
pub fn detokenizer(data: &[u8]) {
    let model = tiny_model::model();
    let tokenizer = &model.tokenizer;
    let mut input = Input::new(data);
    let flags = input.byte();
    let skip_special = flags & 1 == 1;
    let n_stops = ((flags >> 1) & 7).min(MAX_STOPS);
    let stop_specs: Vec<(u8, u8, u8, Vec<u8>)> = (0..n_stops)
        .map(|_| {
            let (kind, a, b) = (input.byte(), input.byte(), input.byte());
            let raw = match kind % 2 {
                0 => Vec::new(),
                _ => input.bytes(b as usize % 8 + 1).to_vec(),
            };
            (kind, a, b, raw)
        })
        .collect();
    let vocab = tokenizer.vocab_size() as u32;
    let mut ids = Vec::new();
    while !input.is_empty() {
        ids.push(u32::from(input.u16()) % vocab);
    }
    let full = tokenizer.decode(&ids, skip_special);

    for windowed in [false, true] {
        let streamed = stream(tokenizer, &ids, skip_special, windowed);
        assert_eq!(
            streamed, full,
            "streamed text differs from the one-shot decode (windowed: {windowed}, ids: {ids:?})"
        );
    }

    let stops: Vec<String> = stop_specs
        .iter()
        .map(|(kind, a, b, raw)| match kind % 2 {
            0 => full
                .chars()
                .skip(*a as usize)
                .take(1 + *b as usize % 8)
                .collect(),
            _ => String::from_utf8_lossy(raw).into_owned(),
        })
        .filter(|s: &String| !s.is_empty())
        .collect();
    if !stops.is_empty() {
        check_stops(tokenizer, &ids, skip_special, &stops, &full);
    }

    let text = String::from_utf8_lossy(data);
    if let Ok(encoded) = tokenizer.encode_plain(&text, false) {
        assert!(
            encoded.iter().all(|&id| id < vocab),
            "an id outside the vocabulary"
        );
        assert_eq!(
            tokenizer.decode(&encoded, false),
            text,
            "plain text does not survive encode and decode"
        );
    }
}

/// The text a detokenizer streams for `ids`, then releases at the end.
fn stream(
    tokenizer: &Arc<TextTokenizer>,
    ids: &[u32],
    skip_special: bool,
    windowed: bool,
) -> String {
    let mut detokenizer = match windowed {
        false => IncrementalDetokenizer::new(tokenizer.clone(), skip_special),
        true => IncrementalDetokenizer::new_windowed(tokenizer.clone(), skip_special),
    };
    let mut text: String = ids.iter().map(|&id| detokenizer.push(id)).collect();
    text.push_str(&detokenizer.finish());
    text
}

/// Streams `ids` through the detokenizer and a stop matcher for `stops`, as the router does (the
/// last id ends the sequence), and checks what is let through against `full`.
fn check_stops(
    tokenizer: &Arc<TextTokenizer>,
    ids: &[u32],
    skip_special: bool,
    stops: &[String],
    full: &str,
) {
    let mut detokenizer = IncrementalDetokenizer::new(tokenizer.clone(), skip_special);
    let mut matcher = StopMatcher::new(stops.to_vec());
    let mut emitted = String::new();
    let mut matched = None;
    for &id in ids {
        let outcome = matcher.push(&detokenizer.push(id));
        emitted.push_str(&outcome.emit);
        if outcome.matched.is_some() {
            matched = outcome.matched;
            break;
        }
    }
    if matched.is_none() {
        let outcome = matcher.push(&detokenizer.finish());
        emitted.push_str(&outcome.emit);
        matched = outcome.matched;
        if matched.is_none() {
            emitted.push_str(&matcher.finish());
        }
    }
    for stop in stops {
        assert!(
            !emitted.contains(stop.as_str()),
            "stop string {stop:?} emitted in {emitted:?}"
        );
    }
    match matched {
        Some(stop) => {
            assert!(stops.contains(&stop), "matched {stop:?}, not a stop string");
            assert!(
                full.starts_with(&format!("{emitted}{stop}")),
                "emitted {emitted:?} + stop {stop:?} is not the start of {full:?}"
            );
        }
        None => assert_eq!(emitted, full, "text lost or changed without a stop match"),
    }
}
