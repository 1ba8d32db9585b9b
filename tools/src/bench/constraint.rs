//! Structured-output load (`--constraint SPEC`, `--constrained-fraction F`): which requests carry a
//! constraint, how it is sent on each path, and whether an output satisfies it.
//!
//! - SPEC is `json-object`, `json-schema:PATH` (a JSON Schema document in a file), `regex:RE` (the
//!   whole output matches RE) or `choice:A,B,...` (exactly one of the comma-separated strings);
//! - request i of a phase (warmup and measured phases counted separately) is constrained when
//!   `floor((i + 1) F) > floor(i F)`: exactly `floor(n F)` of the first n requests, spread evenly
//!   (F = 0.5 constrains the odd indices), the same on every run and every path;
//! - gRPC (router and `--worker`): `GenerateRequest.constraint` / `AddRequest.constraint`; OpenAI:
//!   `response_format` (`json_object`, `json_schema`) or the vLLM extensions `guided_regex`,
//!   `guided_choice`;
//! - a constrained request is always sent with `ignore_eos` off (the router refuses the
//!   combination: a complete structured output ends with EOS), so it may end before its
//!   `max_new_tokens`; its generated tokens are counted as the server reports them;
//! - [`OutputCheck`] decides whether a finished output satisfies the constraint (JSON parsed with
//!   serde_json and validated with the `jsonschema` crate, regexes matched whole with the `regex`
//!   crate), so the report can say how many constrained outputs are valid.

use std::path::PathBuf;

use inference_proto::inference::v1::{constraint::Kind, ChoiceList, Constraint};
use serde::Serialize;
use serde_json::{json, Value};

/// Why a `--constraint` value is refused (the bench's command line prints the message). The
/// messages name the offending part of the value and hold the cause's text (so the error has no
/// separate source).
#[derive(Debug, thiserror::Error)]
pub enum ConstraintSpecError {
    /// The kind is none of those the [module docs](self) list (or `json-object` with a value,
    /// `regex` without one).
    #[error("{spec:?} is not json-object, json-schema:PATH, regex:RE or choice:A,B,...")]
    UnknownKind {
        /// The whole value.
        spec: String,
    },
    /// The schema file of `json-schema:PATH` cannot be read.
    #[error("json-schema:{path}: cannot read the file: {error}")]
    SchemaUnreadable {
        /// PATH, as given.
        path: String,
        /// The I/O error.
        error: std::io::Error,
    },
    /// The schema file is not JSON.
    #[error("json-schema:{path}: not JSON: {error}")]
    SchemaNotJson {
        /// PATH, as given.
        path: String,
        /// The parse error.
        error: serde_json::Error,
    },
    /// The schema is JSON but the `jsonschema` crate rejects it.
    #[error("json-schema:{path}: not a valid JSON Schema: {error}")]
    SchemaInvalid {
        /// PATH, as given.
        path: String,
        /// What the `jsonschema` crate found wrong.
        error: Box<jsonschema::ValidationError<'static>>,
    },
    /// The `regex` crate rejects the expression.
    #[error("regex:{regex}: {error}")]
    Regex {
        /// The expression.
        regex: String,
        /// Why it does not compile.
        error: regex::Error,
    },
    /// `choice:` with an empty list or an empty alternative.
    #[error("choice:{choices}: give comma-separated, non-empty alternatives")]
    EmptyChoice {
        /// The comma-separated alternatives, as given.
        choices: String,
    },
}

/// One `--constraint` value.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ConstraintSpec {
    /// Any JSON object.
    JsonObject,
    /// A JSON Schema document read from `path`.
    JsonSchema {
        /// The file it was read from.
        path: PathBuf,
        /// The schema.
        schema: Value,
    },
    /// A regular expression the whole output matches.
    Regex {
        /// The expression.
        regex: String,
    },
    /// Exactly one of these strings.
    Choice {
        /// The alternatives (at least one, none empty).
        choices: Vec<String>,
    },
}

impl ConstraintSpec {
    /// Parses a `--constraint` value (see the [module docs](self)); reads and parses the schema file
    /// of `json-schema:PATH`.
    ///
    /// Errors: [`ConstraintSpecError`]: an unknown kind, an unreadable file, a schema that is not
    /// JSON or not a valid JSON Schema, an invalid regex, an empty choice list or choice.
    pub fn parse(spec: &str) -> Result<ConstraintSpec, ConstraintSpecError> {
        let (kind, value) = spec.split_once(':').unwrap_or((spec, ""));
        let parsed = match kind {
            "json-object" if value.is_empty() => ConstraintSpec::JsonObject,
            "json-schema" => {
                let path = PathBuf::from(value);
                let text = std::fs::read_to_string(&path).map_err(|error| {
                    ConstraintSpecError::SchemaUnreadable {
                        path: value.to_string(),
                        error,
                    }
                })?;
                let schema = serde_json::from_str(&text).map_err(|error| {
                    ConstraintSpecError::SchemaNotJson {
                        path: value.to_string(),
                        error,
                    }
                })?;
                ConstraintSpec::JsonSchema { path, schema }
            }
            "regex" if !value.is_empty() => ConstraintSpec::Regex {
                regex: value.to_string(),
            },
            "choice" => {
                let choices: Vec<String> = value.split(',').map(str::to_string).collect();
                if choices.iter().any(String::is_empty) {
                    return Err(ConstraintSpecError::EmptyChoice {
                        choices: value.to_string(),
                    });
                }
                ConstraintSpec::Choice { choices }
            }
            _ => {
                return Err(ConstraintSpecError::UnknownKind {
                    spec: spec.to_string(),
                })
            }
        };
        // The checker compiles the schema or regex: reject bad ones before any request.
        OutputCheck::new(&parsed)?;
        Ok(parsed)
    }

    /// The constraint as the gRPC APIs carry it (public `GenerateRequest` and worker `AddRequest`).
    pub fn to_proto(&self) -> Constraint {
        let kind = match self {
            ConstraintSpec::JsonObject => Kind::JsonObject(true),
            ConstraintSpec::JsonSchema { schema, .. } => Kind::JsonSchema(schema.to_string()),
            ConstraintSpec::Regex { regex } => Kind::Regex(regex.clone()),
            ConstraintSpec::Choice { choices } => Kind::Choice(ChoiceList {
                choices: choices.clone(),
            }),
        };
        Constraint { kind: Some(kind) }
    }

    /// Adds the constraint to an OpenAI request body (`response_format` or a vLLM `guided_*`
    /// field).
    pub fn add_to_openai_body(&self, body: &mut Value) {
        match self {
            ConstraintSpec::JsonObject => {
                body["response_format"] = json!({"type": "json_object"});
            }
            ConstraintSpec::JsonSchema { schema, .. } => {
                body["response_format"] = json!({"type": "json_schema", "json_schema": {
                    "name": "bench", "schema": schema, "strict": true}});
            }
            ConstraintSpec::Regex { regex } => body["guided_regex"] = json!(regex),
            ConstraintSpec::Choice { choices } => body["guided_choice"] = json!(choices),
        }
    }
}

/// Whether request `index` of a phase is constrained at `fraction` (see the [module docs](self)).
pub fn is_constrained(index: usize, fraction: f64) -> bool {
    ((index + 1) as f64 * fraction).floor() > (index as f64 * fraction).floor()
}

/// Checks finished outputs against a [`ConstraintSpec`].
#[derive(Debug)]
pub enum OutputCheck {
    /// Parses as a JSON object.
    JsonObject,
    /// Parses as JSON and validates against the schema.
    JsonSchema(Box<jsonschema::Validator>),
    /// The whole output matches (the expression wrapped in `^(?:...)$`).
    Regex(regex::Regex),
    /// Equals one of the alternatives.
    Choice(Vec<String>),
}

impl OutputCheck {
    /// The checker of `spec`.
    ///
    /// Errors: [`ConstraintSpecError::SchemaInvalid`] for a schema the `jsonschema` crate rejects,
    /// [`ConstraintSpecError::Regex`] for a regex the `regex` crate rejects.
    pub fn new(spec: &ConstraintSpec) -> Result<OutputCheck, ConstraintSpecError> {
        Ok(match spec {
            ConstraintSpec::JsonObject => OutputCheck::JsonObject,
            ConstraintSpec::JsonSchema { path, schema } => {
                let validator = jsonschema::validator_for(schema).map_err(|error| {
                    ConstraintSpecError::SchemaInvalid {
                        path: path.display().to_string(),
                        error: Box::new(error),
                    }
                })?;
                OutputCheck::JsonSchema(Box::new(validator))
            }
            ConstraintSpec::Regex { regex } => {
                let whole = regex::Regex::new(&format!("^(?:{regex})$")).map_err(|error| {
                    ConstraintSpecError::Regex {
                        regex: regex.clone(),
                        error,
                    }
                })?;
                OutputCheck::Regex(whole)
            }
            ConstraintSpec::Choice { choices } => OutputCheck::Choice(choices.clone()),
        })
    }

    /// Whether `text` (a whole output) satisfies the constraint.
    pub fn accepts(&self, text: &str) -> bool {
        match self {
            OutputCheck::JsonObject => {
                serde_json::from_str::<Value>(text).is_ok_and(|v| v.is_object())
            }
            OutputCheck::JsonSchema(validator) => {
                serde_json::from_str::<Value>(text).is_ok_and(|v| validator.is_valid(&v))
            }
            OutputCheck::Regex(whole) => whole.is_match(text),
            OutputCheck::Choice(choices) => choices.iter().any(|c| c == text),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fraction_picks_an_even_deterministic_subset() {
        let picked =
            |f: f64, n: usize| -> Vec<usize> { (0..n).filter(|&i| is_constrained(i, f)).collect() };
        assert_eq!(picked(0.5, 8), vec![1, 3, 5, 7]);
        assert!(picked(0.0, 100).is_empty());
        assert_eq!(picked(1.0, 5), vec![0, 1, 2, 3, 4]);
        assert_eq!(picked(0.25, 8), vec![3, 7]);
        for (f, n) in [(0.3, 10), (0.3, 100), (0.7, 33)] {
            let want = (n as f64 * f).floor() as usize;
            assert_eq!(picked(f, n).len(), want, "{f} of {n}");
        }
    }

    #[test]
    fn specs_parse_and_check_outputs() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("schema.json");
        let schema = json!({"type": "object", "properties": {"n": {"type": "integer"}},
                            "required": ["n"]});
        std::fs::write(&path, schema.to_string()).unwrap();
        let spec = ConstraintSpec::parse(&format!("json-schema:{}", path.display())).unwrap();
        let check = OutputCheck::new(&spec).unwrap();
        assert!(check.accepts(r#"{"n": 3}"#));
        assert!(!check.accepts(r#"{"n": "3"}"#));
        assert!(!check.accepts(r#"{"n": 3"#));
        assert_eq!(
            spec.to_proto().kind,
            Some(Kind::JsonSchema(schema.to_string()))
        );
        let mut body = json!({});
        spec.add_to_openai_body(&mut body);
        assert_eq!(body["response_format"]["json_schema"]["schema"], schema);

        let check = OutputCheck::new(&ConstraintSpec::parse("json-object").unwrap()).unwrap();
        assert!(check.accepts(" {\"a\": [1]}"));
        assert!(!check.accepts("[1]"));

        let spec = ConstraintSpec::parse("regex:[0-9]{2}-x").unwrap();
        let check = OutputCheck::new(&spec).unwrap();
        assert!(check.accepts("12-x") && !check.accepts("12-xy") && !check.accepts("a12-x"));
        let mut body = json!({});
        spec.add_to_openai_body(&mut body);
        assert_eq!(body["guided_regex"], "[0-9]{2}-x");

        let spec = ConstraintSpec::parse("choice:yes,no").unwrap();
        let check = OutputCheck::new(&spec).unwrap();
        assert!(check.accepts("no") && !check.accepts("yes,no"));
        assert_eq!(
            spec.to_proto().kind,
            Some(Kind::Choice(ChoiceList {
                choices: vec!["yes".into(), "no".into()]
            }))
        );
    }

    #[test]
    fn bad_specs_are_refused_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let not_json = dir.path().join("bad.json");
        std::fs::write(&not_json, "{\"type\": ").unwrap();
        let bad_schema = dir.path().join("bad-schema.json");
        std::fs::write(&bad_schema, r#"{"type": "no-such-type"}"#).unwrap();
        for (spec, says) in [
            ("yaml", "is not json-object"),
            ("json-object:x", "is not json-object"),
            ("regex:", "is not json-object"),
            ("regex:[a-", "regex:[a-"),
            ("choice:a,,b", "non-empty"),
            ("json-schema:/nonexistent/s.json", "cannot read"),
            (&format!("json-schema:{}", not_json.display()), "not JSON"),
            (
                &format!("json-schema:{}", bad_schema.display()),
                "not a valid JSON Schema",
            ),
        ] {
            let error = ConstraintSpec::parse(spec).unwrap_err().to_string();
            assert!(error.contains(says), "{spec}: {error}");
        }
    }
}
