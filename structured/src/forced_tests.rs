//! [`ConstraintState::forced_tokens`]: the tokens a constraint forces, over a vocabulary of single
//! characters (where forced text is forced tokens) and over the tiny model's byte-level BPE
//! vocabulary (where it often is not: several tokenizations of the forced text are allowed).

use std::time::Instant;

use crate::tests::{compiler, tiny, Tiny, EOS};
use crate::{ConstraintCompiler, ConstraintSpec, ConstraintState, Progress};

/// `<eos>` (id 0) and every printable ASCII character but the space, one token each (id
/// `c - 0x20`).
fn chars_compiler() -> ConstraintCompiler {
    crate::testing::single_char_compiler((0x21u8..=0x7e).map(char::from))
}

fn ids(text: &str) -> Vec<u32> {
    text.bytes().map(|b| u32::from(b - 0x20)).collect()
}

fn text(ids: &[u32]) -> String {
    ids.iter().map(|&i| char::from(i as u8 + 0x20)).collect()
}

/// `state`'s next mask, computed on a replayed copy (so `state` itself is not touched).
fn mask_words(c: &ConstraintCompiler, spec: ConstraintSpec<'_>, tokens: &[u32]) -> Vec<u32> {
    let mut s = c.compile(spec).unwrap();
    s.replay(tokens).unwrap();
    s.compute_mask().unwrap().words().to_vec()
}

/// Asserts that `forced_tokens(max)` of `state` (advanced by `tokens`) are each the only token
/// the mask allows there, that it left `state` as it was, and returns them.
fn checked_forced(
    c: &ConstraintCompiler,
    spec: ConstraintSpec<'_>,
    state: &mut ConstraintState,
    tokens: &[u32],
    max: usize,
) -> Vec<u32> {
    let forced = state.forced_tokens(max);
    assert!(forced.len() <= max);
    assert_eq!(state.generated(), tokens.len());
    let mut replay = c.compile(spec).unwrap();
    replay.replay(tokens).unwrap();
    for &t in &forced {
        let mask = replay.compute_mask().unwrap();
        assert_eq!(
            (mask.num_allowed(), mask.allows(t)),
            (1, true),
            "{forced:?}"
        );
        replay.advance(t).unwrap();
    }
    // Unchanged: the next mask is the replayed state's.
    assert_eq!(
        state.compute_mask().unwrap().words(),
        mask_words(c, spec, tokens)
    );
    forced
}

#[test]
fn a_regex_forces_its_literal_prefix() {
    let c = chars_compiler();
    let spec = ConstraintSpec::Regex("abc[0-9]");
    let mut s = c.compile(spec).unwrap();
    assert_eq!(text(&checked_forced(&c, spec, &mut s, &[], 10)), "abc");
    assert_eq!(text(&checked_forced(&c, spec, &mut s, &[], 2)), "ab");
    assert!(checked_forced(&c, spec, &mut s, &[], 0).is_empty());
    let mut done = Vec::new();
    for (i, t) in ids("abc").into_iter().enumerate() {
        s.compute_mask().unwrap();
        s.advance(t).unwrap();
        done.push(t);
        let rest = &"abc"[i + 1..];
        assert_eq!(text(&checked_forced(&c, spec, &mut s, &done, 10)), rest);
    }
    // A digit is free, and after it the output is complete: nothing is forced.
    assert!(checked_forced(&c, spec, &mut s, &done, 10).is_empty());
    s.compute_mask().unwrap();
    assert_eq!(s.advance(ids("7")[0]).unwrap(), Progress::Complete);
    assert!(s.forced_tokens(10).is_empty());
}

#[test]
fn a_json_schema_forces_its_keys_and_the_rest_of_an_enum_value() {
    let c = chars_compiler();
    let schema = r#"{"type":"object","properties":{"name":{"type":"string"},
        "color":{"enum":["green","grey"]}},"required":["name","color"],
        "additionalProperties":false}"#;
    let spec = ConstraintSpec::JsonSchema(schema);
    let mut s = c.compile(spec).unwrap();
    assert_eq!(
        text(&checked_forced(&c, spec, &mut s, &[], 16)),
        r#"{"name":""#
    );
    // After the string value, the next key is forced, then the enum values' shared prefix `"gre`.
    let mut done = ids(r#"{"name":"x""#);
    s.replay(&done).unwrap();
    assert_eq!(
        text(&checked_forced(&c, spec, &mut s, &done, 16)),
        r#","color":"gre"#
    );
    // Choosing `grey`'s `y` forces the rest of the object.
    done.extend(ids(r#","color":"grey"#));
    s.replay(&ids(r#","color":"grey"#)).unwrap();
    assert_eq!(text(&checked_forced(&c, spec, &mut s, &done, 16)), r#""}"#);
}

#[test]
fn forced_tokens_are_sound_complete_and_change_nothing_on_a_bpe_vocabulary() {
    // Random walks: at every position the forced tokens are each the only allowed one, the state
    // is unchanged, and a position whose mask allows one (non-EOS) token is found.
    let t: Tiny = tiny();
    let c = compiler(&t);
    let schema = r#"{"type":"object","properties":{"name":{"type":"string","maxLength":4},
        "kind":{"enum":["alpha","beta"]}},"required":["name","kind"],"additionalProperties":false}"#;
    let specs = [
        ConstraintSpec::Regex("abc[0-9]{2}(xyz|xyw)"),
        ConstraintSpec::JsonSchema(schema),
    ];
    let mut forced_seen = 0;
    for spec in specs {
        for seed in 0..3u64 {
            let mut s = c.compile(spec).unwrap();
            let mut done = Vec::new();
            let mut x = seed;
            for _ in 0..60 {
                let forced = checked_forced(&c, spec, &mut s, &done, 8);
                forced_seen += forced.len();
                let mask = s.compute_mask().unwrap();
                let allowed: Vec<u32> = (0..t.tokens.len() as u32)
                    .filter(|&id| mask.allows(id) && id != EOS)
                    .collect();
                if allowed.is_empty() {
                    break;
                }
                if allowed.len() == 1 && !mask.allows(EOS) {
                    assert_eq!(forced.first(), Some(&allowed[0]), "missed a forced token");
                }
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let id = allowed[(x >> 33) as usize % allowed.len()];
                done.push(id);
                if s.advance(id).unwrap() == Progress::Complete {
                    break;
                }
            }
        }
    }
    eprintln!("forced tokens found on the BPE vocabulary: {forced_seen}");
}

#[test]
fn cost_of_forced_tokens_next_to_a_mask() {
    // Not a benchmark (a test build, the tiny vocabulary): prints what one call costs next to one
    // mask, where bytes are forced (after `{`) and in free text (inside the string).
    let t = tiny();
    let c = compiler(&t);
    let schema = r#"{"type":"object","properties":{"description":{"type":"string"},
        "count":{"type":"integer"}},"required":["description","count"]}"#;
    let spec = ConstraintSpec::JsonSchema(schema);
    let token = |s: &str| t.tokens.iter().position(|tok| tok == s).unwrap() as u32;
    let open = vec![token("{")];
    let mut in_string = open.clone();
    in_string.extend([token("\""), token("d")]);
    for (label, prefix) in [("after `{`", open), ("inside a string", in_string)] {
        let mut s = c.compile(spec).unwrap();
        if s.replay(&prefix).is_err() {
            continue;
        }
        let time = |f: &mut dyn FnMut()| {
            let started = Instant::now();
            for _ in 0..50 {
                f();
            }
            started.elapsed().as_secs_f64() / 50.0 * 1e6
        };
        let mut found = 0;
        let forced_us = time(&mut || found = s.forced_tokens(8).len());
        // A mask on a fresh state each time (a state caches its last mask).
        let mut mask_us = 0.0;
        for _ in 0..50 {
            let mut fresh = c.compile(spec).unwrap();
            fresh.replay(&prefix).unwrap();
            let started = Instant::now();
            fresh.compute_mask().unwrap();
            mask_us += started.elapsed().as_secs_f64() / 50.0 * 1e6;
        }
        eprintln!("{label}: forced_tokens {forced_us:.1} us ({found} found), mask {mask_us:.1} us");
    }
}
