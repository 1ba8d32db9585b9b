//! Compiling and following constraints over the tiny test model's byte-level vocabulary.

use crate::vocab::{token_bytes, VocabKind};
use crate::{
    ConstraintCompiler, ConstraintError, ConstraintSpec, MatchError, Progress, VocabSource,
};

/// The tiny model's vocabulary (`<|endoftext|>`, `<|im_start|>`, `<|im_end|>` control, the 256
/// byte symbols, merges), EOS 2.
pub(crate) struct Tiny {
    pub(crate) tokens: Vec<String>,
    types: Vec<i32>,
}

pub(crate) const EOS: u32 = 2;

pub(crate) fn tiny() -> Tiny {
    let dir = std::env::temp_dir().join(format!("structured-tests-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("tiny-{:?}.gguf", std::thread::current().id()));
    gguf::testing::write_tiny_llama(&path, 1).unwrap();
    let file = gguf::GgufFile::open(&path).unwrap();
    let meta = gguf::TokenizerMetadata::from_gguf(&file).unwrap();
    let _ = std::fs::remove_file(&path);
    Tiny {
        tokens: meta.tokens,
        types: meta.token_types,
    }
}

pub(crate) fn compiler(t: &Tiny) -> ConstraintCompiler {
    ConstraintCompiler::new(VocabSource {
        model: "gpt2",
        tokens: &t.tokens,
        token_types: &t.types,
        vocab_size: t.tokens.len() + 5,
        eos_token_ids: &[EOS],
    })
    .unwrap()
}

#[derive(Debug)]
/// An owned constraint, the tests' stand-in for the proto's `Constraint.kind`.
enum Kind {
    JsonSchema(String),
    JsonObject,
    Regex(String),
    Lark(String),
    Choice(Vec<String>),
}

impl Kind {
    fn spec(&self) -> ConstraintSpec<'_> {
        match self {
            Kind::JsonSchema(text) => ConstraintSpec::JsonSchema(text),
            Kind::JsonObject => ConstraintSpec::JsonObject,
            Kind::Regex(regex) => ConstraintSpec::Regex(regex),
            Kind::Lark(grammar) => ConstraintSpec::Lark(grammar),
            Kind::Choice(choices) => ConstraintSpec::Choice(choices),
        }
    }
}

/// `kind` as the constraint of a request.
fn constraint(kind: Kind) -> Kind {
    kind
}

/// Follows `c` choosing, at each step, an allowed token by a fixed pseudo-random rule (EOS only
/// when nothing else is allowed); returns the text and how it ended.
fn walk(t: &Tiny, c: &Kind, seed: u64, max_tokens: usize) -> (String, Vec<u32>, bool) {
    let bytes = token_bytes(VocabKind::ByteLevelBpe, &t.tokens, &t.types, t.tokens.len()).unwrap();
    let mut state = compiler(t).compile(c.spec()).unwrap();
    let (mut text, mut ids, mut x) = (Vec::new(), Vec::new(), seed);
    for _ in 0..max_tokens {
        let mask = state.compute_mask().unwrap();
        let allowed: Vec<u32> = (0..t.tokens.len() as u32)
            .filter(|&id| mask.allows(id) && id != EOS)
            .collect();
        if allowed.is_empty() {
            assert!(mask.allows(EOS), "nothing allowed, not even EOS");
            return (String::from_utf8(text).unwrap(), ids, true);
        }
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let id = allowed[(x >> 33) as usize % allowed.len()];
        text.extend_from_slice(&bytes[id as usize]);
        ids.push(id);
        if state.advance(id).unwrap() == Progress::Complete {
            return (String::from_utf8(text).unwrap(), ids, true);
        }
    }
    (String::from_utf8(text).unwrap(), ids, false)
}

#[test]
fn regex_output_matches() {
    let t = tiny();
    let c = constraint(Kind::Regex("[0-9]{3}-(ab|cd)".into()));
    for seed in 0..5 {
        let (text, _, done) = walk(&t, &c, seed, 50);
        assert!(done, "{text:?}");
        let (digits, rest) = text.split_at(3);
        assert!(digits.bytes().all(|b| b.is_ascii_digit()), "{text:?}");
        assert!(rest == "-ab" || rest == "-cd", "{text:?}");
    }
}

#[test]
fn choice_gives_one_of_the_strings() {
    let t = tiny();
    let choices = vec!["yes".to_string(), "no (x)".into(), "maybe.*".into()];
    let c = constraint(Kind::Choice(choices.clone()));
    for seed in 0..6 {
        let (text, _, done) = walk(&t, &c, seed, 20);
        assert!(done && choices.contains(&text), "{text:?}");
    }
}

#[test]
fn json_schema_output_parses_and_fits() {
    let t = tiny();
    let schema = r#"{"type":"object","properties":{"n":{"type":"integer","minimum":0,"maximum":9},
        "tag":{"enum":["a","b"]}},"required":["n","tag"],"additionalProperties":false}"#;
    let c = constraint(Kind::JsonSchema(schema.into()));
    for seed in 0..4 {
        let (text, _, done) = walk(&t, &c, seed, 400);
        assert!(done, "{text:?}");
        assert!(!text.contains([' ', '\n']), "compact by default: {text:?}");
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let n = v["n"].as_i64().unwrap();
        assert!((0..=9).contains(&n), "{text}");
        assert!(v["tag"] == "a" || v["tag"] == "b", "{text}");
    }
    let (text, _, done) = walk(&t, &constraint(Kind::JsonObject), 7, 400);
    assert!(
        !done
            || serde_json::from_str::<serde_json::Value>(&text)
                .unwrap()
                .is_object()
    );
}

#[test]
fn replay_rebuilds_the_same_state() {
    let t = tiny();
    let c = constraint(Kind::Regex("(ab|cd)+x".into()));
    let (_, ids, _) = walk(&t, &c, 3, 6);
    let comp = compiler(&t);
    let mut original = comp.compile(c.spec()).unwrap();
    for &id in &ids {
        original.compute_mask().unwrap();
        original.advance(id).unwrap();
    }
    let mut replayed = comp.compile(c.spec()).unwrap();
    replayed.replay(&ids).unwrap();
    assert_eq!(replayed.generated(), ids.len());
    assert_eq!(
        original.compute_mask().unwrap().words(),
        replayed.compute_mask().unwrap().words()
    );
    // A token the constraint does not allow is refused with its index.
    let mut fresh = comp.compile(c.spec()).unwrap();
    let z = t.tokens.iter().position(|s| s == "z").unwrap() as u32;
    assert!(matches!(
        fresh.replay(&[z]),
        Err(MatchError::Rejected { index: 0, token, .. }) if token == z
    ));
}

#[test]
fn eos_only_where_complete_and_never_past_the_vocabulary() {
    let t = tiny();
    let comp = compiler(&t);
    assert_eq!(comp.vocab_size(), t.tokens.len() + 5);
    let mut s = comp.compile(Kind::Regex("a+".into()).spec()).unwrap();
    let a = t.tokens.iter().position(|s| s == "a").unwrap() as u32;
    let m = s.compute_mask().unwrap();
    assert!(m.allows(a) && !m.allows(EOS));
    assert!(!m.allows(t.tokens.len() as u32 + 1));
    assert_eq!(s.advance(a).unwrap(), Progress::Open);
    let m = s.compute_mask().unwrap();
    assert!(m.allows(a) && m.allows(EOS));
    // The special tokens other than EOS are never text.
    assert!(!m.allows(1) && !m.allows(0));
}

#[test]
fn invalid_constraints_name_the_problem() {
    let t = tiny();
    let comp = compiler(&t);
    let err = |kind: Kind| comp.compile(kind.spec()).unwrap_err();
    let e = err(Kind::JsonSchema("{not json".into()));
    assert!(matches!(e, ConstraintError::SchemaNotJson(_)), "{e}");
    let e = err(Kind::JsonSchema(r##"{"$ref":"#/$defs/missing"}"##.into()));
    assert!(
        e.to_string()
            .starts_with("constraint.json_schema is invalid: "),
        "{e}"
    );
    let e = err(Kind::JsonSchema(
        r#"{"type":"integer","minimum":5,"maximum":1}"#.into(),
    ));
    assert!(e.to_string().contains("json_schema"), "{e}");
    let e = err(Kind::Regex("(unclosed".into()));
    assert!(
        e.to_string().starts_with("constraint.regex is invalid: "),
        "{e}"
    );
    let e = err(Kind::Lark("start: undefined_rule".into()));
    assert!(
        e.to_string().starts_with("constraint.lark is invalid: "),
        "{e}"
    );
    let e = err(Kind::Choice(vec![]));
    assert!(matches!(e, ConstraintError::NoChoices));
    let e = err(Kind::Choice(vec!["a".into(), String::new()]));
    assert!(matches!(e, ConstraintError::EmptyChoice(1)));
}

#[test]
fn a_model_without_eos_or_with_another_tokenizer_is_refused() {
    let t = tiny();
    let source = |model, eos: &'static [u32]| VocabSource {
        model,
        tokens: &t.tokens,
        token_types: &t.types,
        vocab_size: t.tokens.len(),
        eos_token_ids: eos,
    };
    let e = ConstraintCompiler::new(source("gpt2", &[])).unwrap_err();
    assert!(e.to_string().contains("no end-of-sequence token"), "{e}");
    let e = ConstraintCompiler::new(source("bert", &[2])).unwrap_err();
    assert!(e.to_string().contains("unsupported tokenizer model"), "{e}");
}

/// Constraints that compile but cannot produce a first token are refused by `check`, naming the
/// field; ordinary ones pass.
#[test]
fn check_refuses_constraints_that_cannot_start() {
    let t = tiny();
    let c = compiler(&t);
    let bad = [
        (Kind::JsonSchema(r##"{"$ref": "#"}"##.into()), "json_schema"),
        (
            Kind::JsonSchema(
                r##"{"$ref": "#/definitions/a", "definitions": {"a": {"$ref": "#/definitions/a"}}}"##
                    .into(),
            ),
            "json_schema",
        ),
        (Kind::Regex(r"[^\x00-\x{10FFFF}]".into()), "regex"),
        (Kind::Lark("start: x\nx: x".into()), "lark"),
    ];
    for (kind, field) in bad {
        let what = format!("{kind:?}");
        let err = c.check(kind.spec()).expect_err(&what);
        assert!(
            err.to_string()
                .starts_with(&format!("constraint.{field} is invalid")),
            "{what}: {err}"
        );
    }
    for kind in [
        Kind::JsonSchema(r#"{"type": "object"}"#.into()),
        Kind::Regex("[a-z]+".into()),
        Kind::Lark("start: \"yes\" | \"no\"".into()),
    ] {
        c.check(kind.spec()).unwrap();
    }
}

/// A schema with 500 optional properties and additional properties allowed (the default), which
/// llguidance's default Earley row limit of 2,000 items refused after `{` ("Current row has 2007
/// items"), takes a whole object byte by byte; and a random walk of it with additional properties
/// off ends in a valid object.
#[test]
fn wide_schemas_fit_the_parser_limits() {
    let t = tiny();
    let bytes = token_bytes(VocabKind::ByteLevelBpe, &t.tokens, &t.types, t.tokens.len()).unwrap();
    let id = |b: u8| {
        bytes
            .iter()
            .position(|w| w == &[b])
            .expect("a one-byte token") as u32
    };
    let props: Vec<String> = (0..500)
        .map(|i| format!("\"field_{i}\": {{\"type\": \"boolean\"}}"))
        .collect();
    let schema = |extra: &str| {
        let body = props.join(", ");
        format!("{{\"type\": \"object\", \"properties\": {{{body}}}{extra}}}")
    };
    let open = constraint(Kind::JsonSchema(schema("")));
    let mut state = compiler(&t).compile(open.spec()).unwrap();
    let text = br#"{"field_0":true,"field_499":false,"other":1}"#;
    for (i, &b) in text.iter().enumerate() {
        let mask = state
            .compute_mask()
            .unwrap_or_else(|e| panic!("byte {i}: {e}"));
        assert!(mask.allows(id(b)), "byte {i} refused");
        let progress = state.advance(id(b)).unwrap();
        assert_eq!(
            progress == Progress::Complete,
            i + 1 == text.len(),
            "byte {i}"
        );
    }
    let closed = constraint(Kind::JsonSchema(schema(
        ", \"required\": [\"field_0\"], \"additionalProperties\": false",
    )));
    compiler(&t).check(closed.spec()).unwrap();
    for seed in [1, 2] {
        let (text, _, complete) = walk(&t, &closed, seed, 2_000);
        assert!(complete, "seed {seed}: not complete: {text}");
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        let object = value.as_object().expect("an object");
        assert!(object.contains_key("field_0"), "{text}");
        for (key, v) in object {
            let i: usize = key.strip_prefix("field_").expect(key).parse().expect(key);
            assert!(i < 500 && v.is_boolean(), "{text}");
        }
    }
}
