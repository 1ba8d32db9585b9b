//! The tool-call grammars followed byte by byte over the tiny model's vocabulary, and the parser.

use serde_json::json;

use super::*;
use crate::vocab::{token_bytes, VocabKind};
use crate::{ConstraintCompiler, ConstraintSpec, ConstraintState, Progress, VocabSource};

const EOS: u32 = 2;

struct Vocab {
    compiler: ConstraintCompiler,
    /// Token id of each single byte.
    byte_ids: Vec<Option<u32>>,
    bytes: Vec<Vec<u8>>,
}

fn vocab() -> Vocab {
    let dir = std::env::temp_dir().join(format!("tool-call-tests-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("tiny-{:?}.gguf", std::thread::current().id()));
    gguf::testing::write_tiny_llama(&path, 1).unwrap();
    let file = gguf::GgufFile::open(&path).unwrap();
    let meta = gguf::TokenizerMetadata::from_gguf(&file).unwrap();
    let _ = std::fs::remove_file(&path);
    let compiler = ConstraintCompiler::new(VocabSource {
        model: "gpt2",
        tokens: &meta.tokens,
        token_types: &meta.token_types,
        vocab_size: meta.tokens.len(),
        eos_token_ids: &[EOS],
    })
    .unwrap();
    let bytes = token_bytes(
        VocabKind::ByteLevelBpe,
        &meta.tokens,
        &meta.token_types,
        meta.tokens.len(),
    )
    .unwrap();
    let mut byte_ids = vec![None; 256];
    for (id, b) in bytes.iter().enumerate() {
        if b.len() == 1 && meta.token_types[id] == 1 {
            byte_ids[b[0] as usize] = Some(id as u32);
        }
    }
    Vocab {
        compiler,
        byte_ids,
        bytes,
    }
}

fn state(v: &Vocab, grammar: &str) -> ConstraintState {
    v.compiler.check(ConstraintSpec::Lark(grammar)).unwrap();
    v.compiler.compile(ConstraintSpec::Lark(grammar)).unwrap()
}

/// Whether the grammar accepts exactly `text` (fed one byte token at a time, then EOS).
fn accepts(v: &Vocab, grammar: &str, text: &str) -> bool {
    let mut s = state(v, grammar);
    for (i, b) in text.bytes().enumerate() {
        let id = v.byte_ids[b as usize].unwrap();
        let mask = s.compute_mask().unwrap();
        if !mask.allows(id) {
            return false;
        }
        if s.advance(id).unwrap() == Progress::Complete {
            return i + 1 == text.len();
        }
    }
    s.compute_mask().unwrap().allows(EOS)
}

/// Follows the grammar choosing allowed tokens pseudo-randomly (EOS only when nothing else is).
fn walk(v: &Vocab, grammar: &str, seed: u64, max_tokens: usize) -> Option<String> {
    let mut s = state(v, grammar);
    let (mut text, mut x) = (Vec::new(), seed);
    for _ in 0..max_tokens {
        let mask = s.compute_mask().unwrap();
        let allowed: Vec<u32> = (0..v.bytes.len() as u32)
            .filter(|&id| mask.allows(id) && id != EOS)
            .collect();
        if allowed.is_empty() {
            return Some(String::from_utf8(text).unwrap());
        }
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let id = allowed[(x >> 33) as usize % allowed.len()];
        text.extend_from_slice(&v.bytes[id as usize]);
        if s.advance(id).unwrap() == Progress::Complete {
            return Some(String::from_utf8(text).unwrap());
        }
    }
    None
}

fn weather() -> serde_json::Value {
    json!({"type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
        "unit": {"enum": ["c", "f"]}}, "required": ["city", "unit"], "additionalProperties": false})
}

fn count() -> serde_json::Value {
    json!({"type": "object", "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 3}},
        "required": ["n"], "additionalProperties": false})
}

#[test]
fn every_trigger_starts_its_first_call() {
    for syntax in ToolSyntax::ALL {
        let first = format!(
            "{}{}{}",
            syntax.section_prefix,
            syntax.call_prefix,
            ToolSyntax::NAME_OPEN
        );
        assert!(first.starts_with(syntax.trigger), "{}", syntax.name);
    }
}

#[test]
fn required_grammar_accepts_exactly_the_family_syntax() {
    let v = vocab();
    let (w, c) = (weather(), count());
    let functions = [
        FunctionSchema {
            name: "get_weather",
            parameters: &w,
        },
        FunctionSchema {
            name: "count",
            parameters: &c,
        },
    ];
    for syntax in ToolSyntax::ALL {
        let one = tool_call_grammar(&syntax, &functions, CallMode::Required, false).unwrap();
        let many = tool_call_grammar(&syntax, &functions, CallMode::Required, true).unwrap();
        let a = syntax.write(&[("get_weather", r#"{"city":"Oslo","unit":"c"}"#)]);
        let ab = syntax.write(&[
            ("get_weather", r#"{"city":"Oslo","unit":"c"}"#),
            ("count", r#"{"n":2}"#),
        ]);
        assert!(accepts(&v, &one, &a), "{}: {a:?}", syntax.name);
        assert!(!accepts(&v, &one, &ab), "{}: one call only", syntax.name);
        assert!(accepts(&v, &many, &ab), "{}: {ab:?}", syntax.name);
        let bad_value = syntax.write(&[("count", r#"{"n":7}"#)]);
        assert!(!accepts(&v, &many, &bad_value), "{}: bounds", syntax.name);
        let unknown = syntax.write(&[("other", r#"{"n":1}"#)]);
        assert!(
            !accepts(&v, &many, &unknown),
            "{}: unknown name",
            syntax.name
        );
        assert!(!accepts(&v, &one, "hello"), "{}: no text", syntax.name);
    }
}

#[test]
fn auto_grammar_allows_text_then_calls() {
    let v = vocab();
    let c = count();
    let functions = [FunctionSchema {
        name: "count",
        parameters: &c,
    }];
    let syntax = ToolSyntax::builtin();
    let auto = tool_call_grammar(&syntax, &functions, CallMode::Auto, true).unwrap();
    assert!(accepts(&v, &auto, "Just text, no call."));
    assert!(accepts(&v, &auto, ""));
    let call = syntax.write(&[("count", r#"{"n":1}"#)]);
    assert!(accepts(&v, &auto, &call));
    assert!(accepts(&v, &auto, &format!("Let me count.\n{call}")));
    assert!(
        !accepts(&v, &auto, "text <tool_call>\nnot a call"),
        "after the trigger only a call"
    );
    assert!(!accepts(&v, &auto, &format!("{call} and text after")));
}

#[test]
fn sampled_calls_parse_and_fit_their_schemas() {
    let v = vocab();
    let (w, c) = (weather(), count());
    let functions = [
        FunctionSchema {
            name: "get_weather",
            parameters: &w,
        },
        FunctionSchema {
            name: "count",
            parameters: &c,
        },
    ];
    for syntax in ToolSyntax::ALL {
        for (mode, seed) in [
            (CallMode::Required, 1),
            (CallMode::Required, 2),
            (CallMode::Auto, 3),
        ] {
            let grammar = tool_call_grammar(&syntax, &functions, mode, true).unwrap();
            let Some(text) = walk(&v, &grammar, seed, 400) else {
                continue; // a long free-text walk under `auto`
            };
            let parsed = parse_tool_calls(&syntax, &text);
            if mode == CallMode::Required {
                assert!(!parsed.calls.is_empty(), "{}: {text:?}", syntax.name);
            }
            for call in &parsed.calls {
                let args: serde_json::Value = serde_json::from_str(&call.arguments).unwrap();
                match call.name.as_str() {
                    "count" => assert!((1..=3).contains(&args["n"].as_i64().unwrap())),
                    "get_weather" => assert!(args["unit"] == "c" || args["unit"] == "f"),
                    other => panic!("unknown function {other}"),
                }
            }
        }
    }
}

#[test]
fn parse_splits_content_and_calls() {
    let s = ToolSyntax::builtin();
    let text = format!(
        "Sure.\n{}",
        s.write(&[("a", r#"{"x":"}\"{"}"#), ("b", "{}")])
    );
    let parsed = parse_tool_calls(&s, &text);
    assert_eq!(parsed.content.as_deref(), Some("Sure."));
    assert_eq!(
        parsed.calls,
        vec![
            ParsedCall {
                name: "a".into(),
                arguments: r#"{"x":"}\"{"}"#.into()
            },
            ParsedCall {
                name: "b".into(),
                arguments: "{}".into()
            }
        ]
    );
    let only = parse_tool_calls(&s, &s.write(&[("a", "{}")]));
    assert_eq!(only.content, None);
    let plain = parse_tool_calls(&s, "no calls <tool_ here");
    assert_eq!(plain.content.as_deref(), Some("no calls <tool_ here"));
    assert!(plain.calls.is_empty());
    let cut = parse_tool_calls(&s, "x <tool_call>\n{\"name\": \"a\", \"argu");
    assert!(cut.calls.is_empty());
    assert_eq!(
        cut.content.as_deref(),
        Some("x <tool_call>\n{\"name\": \"a\", \"argu")
    );
    // Arguments cut (a stop string, the length limit): no call. Arguments whole, the closing
    // text cut: the call, as the stream gave it.
    let cut = "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"city\":\"";
    assert!(parse_tool_calls(&s, cut).calls.is_empty());
    let closing_cut =
        "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"city\":\"Paris\"}}\n</tool_";
    let parsed = parse_tool_calls(&s, closing_cut);
    assert_eq!(parsed.calls.len(), 1, "{parsed:?}");
    assert_eq!(parsed.calls[0].arguments, "{\"city\":\"Paris\"}");
    assert_eq!(parsed.content, None);
    let mut stream = StreamingCalls::new(s);
    stream.push(cut);
    assert!(stream.has_calls() && !stream.has_complete_calls());
    let mut stream = StreamingCalls::new(s);
    stream.push(closing_cut);
    assert!(stream.has_complete_calls());
}

#[test]
fn streaming_pieces_assemble_to_the_whole_parse() {
    for syntax in ToolSyntax::ALL {
        let text = format!(
            "Thinking <tool it over.  \n{}",
            syntax.write(&[("f", r#"{"a":[1,{"b":"]}"}]}"#), ("g", r#"{"c":true}"#)])
        );
        for width in [1, 2, 3, 7, 64] {
            let mut stream = StreamingCalls::new(syntax);
            let mut deltas = Vec::new();
            let chars: Vec<char> = text.chars().collect();
            for piece in chars.chunks(width) {
                deltas.extend(stream.push(&piece.iter().collect::<String>()));
            }
            deltas.extend(stream.finish());
            let (mut content, mut calls) = (String::new(), Vec::<(String, String)>::new());
            for d in deltas {
                match d {
                    CallDelta::Content(t) => content.push_str(&t),
                    CallDelta::Start { index, name } => {
                        assert_eq!(index, calls.len());
                        calls.push((name, String::new()));
                    }
                    CallDelta::Arguments { index, fragment } => calls[index].1.push_str(&fragment),
                }
            }
            let whole = parse_tool_calls(&syntax, &text);
            assert_eq!(
                Some(content),
                whole.content,
                "{} width {width}",
                syntax.name
            );
            let whole: Vec<_> = whole
                .calls
                .into_iter()
                .map(|c| (c.name, c.arguments))
                .collect();
            assert_eq!(calls, whole, "{} width {width}", syntax.name);
        }
    }
    let mut plain = StreamingCalls::new(ToolSyntax::builtin());
    let mut out = plain.push("a <tool");
    assert_eq!(out, vec![CallDelta::Content("a".into())]);
    out = plain.finish();
    assert_eq!(out, vec![CallDelta::Content(" <tool".into())]);
}
