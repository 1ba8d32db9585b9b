//! Compiling a request's [`ConstraintSpec`] against one model's vocabulary.

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory};

use crate::error::{ConstraintError, VocabError};
use crate::spec::ConstraintSpec;
use crate::state::ConstraintState;
use crate::vocab::{token_bytes, VocabKind};

/// Most Earley items in one parser row (llguidance's `max_items_in_row`, default 2,000): each
/// optional property of an object schema adds about 4 items to the row after `{`, so this admits
/// about 5,000 optional properties (see [`ConstraintCompiler::new`]).
pub const MAX_ITEMS_IN_ROW: usize = 20_000;

/// What a model's vocabulary looks like: GGUF `tokenizer.ggml.*` metadata plus the ids that end a
/// sequence.
#[derive(Debug, Clone, Copy)]
pub struct VocabSource<'a> {
    /// `tokenizer.ggml.model` (`"gpt2"` or `"llama"`).
    pub model: &'a str,
    /// `tokenizer.ggml.tokens`.
    pub tokens: &'a [String],
    /// `tokenizer.ggml.token_type` (may be empty: all normal).
    pub token_types: &'a [i32],
    /// Width of the model's logits (at least `tokens.len()`; ids past the tokens are never allowed).
    pub vocab_size: usize,
    /// End-of-sequence ids: allowed exactly where the constraint is complete.
    pub eos_token_ids: &'a [u32],
}

/// One model's llguidance environment (token trie and parser factory), built once at load and
/// shared by every request; compiles constraints into per-sequence [`ConstraintState`]s.
pub struct ConstraintCompiler {
    factory: ParserFactory,
    vocab_size: usize,
}

impl std::fmt::Debug for ConstraintCompiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConstraintCompiler")
            .field("vocab_size", &self.vocab_size)
            .finish_non_exhaustive()
    }
}

impl ConstraintCompiler {
    /// Builds the token environment of `source` (see [`crate::vocab`] for the byte conversion).
    ///
    /// Errors: an unsupported tokenizer model or malformed byte token, no EOS id inside the
    /// vocabulary, or llguidance refusing the environment.
    pub fn new(source: VocabSource<'_>) -> Result<Self, VocabError> {
        let kind = VocabKind::from_gguf_model(source.model)?;
        let words = token_bytes(kind, source.tokens, source.token_types, source.vocab_size)?;
        let vocab_size = words.len();
        let eos: Vec<u32> = source
            .eos_token_ids
            .iter()
            .copied()
            .filter(|&id| (id as usize) < vocab_size)
            .collect();
        let Some(&first_eos) = eos.first() else {
            return Err(VocabError::NoEos(vocab_size));
        };
        let info = TokRxInfo::new(vocab_size as u32, first_eos);
        let trie = TokTrie::from(&info, &words).with_eos_tokens(&eos);
        let env: TokEnv = std::sync::Arc::new(ApproximateTokEnv::new(trie));
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| VocabError::Environment(e.to_string()))?;
        factory.quiet();
        // Errors name the problem, not the whole parser state and grammar.
        factory.limits_mut().verbose_errors = false;
        // Each optional property of an object adds about 4 items to the Earley row after `{`:
        // llguidance's default of 2,000 refused schemas of about 500 optional properties at
        // their first token. 20,000 admits about 5,000 (measured: a 3,000-property schema
        // compiles and takes its first tokens in about 1 s in all).
        factory.limits_mut().max_items_in_row = MAX_ITEMS_IN_ROW;
        Ok(Self {
            factory,
            vocab_size,
        })
    }

    /// Width of the masks this compiler's states produce (the model's logits width).
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Compiles `constraint` into a fresh state (nothing generated yet).
    ///
    /// - `json_schema`: a JSON Schema document (llguidance's supported subset: `$ref` within the
    ///   document, `anyOf`/`oneOf`, enums and consts, numeric and length bounds, formats, ...);
    /// - `json_object`: the schema `{"type": "object"}`;
    /// - `regex`: the whole output matches it (Rust `regex` syntax);
    /// - `lark`: llguidance's Lark dialect, from rule `start`;
    /// - `choice`: exactly one of the strings (compiled as an escaped regex alternation).
    ///
    /// Errors: [`ConstraintError`] naming the field and llguidance's explanation.
    pub fn compile(
        &self,
        constraint: ConstraintSpec<'_>,
    ) -> Result<ConstraintState, ConstraintError> {
        self.compile_field(constraint).map(|(_, state)| state)
    }

    /// [`Self::compile`], then the first mask: a constraint that compiles but can never produce a
    /// token (a schema that only refers to itself, a regex that matches no character, a grammar
    /// with no terminal) is an [`ConstraintError::Invalid`] here, before any work, instead of a
    /// failure at the first generated token.
    ///
    /// Errors: as [`Self::compile`].
    pub fn check(&self, constraint: ConstraintSpec<'_>) -> Result<(), ConstraintError> {
        let (field, mut state) = self.compile_field(constraint)?;
        state
            .compute_mask()
            .map(drop)
            .map_err(|e| ConstraintError::Invalid {
                field,
                message: format!("no output can satisfy it ({e})"),
            })
    }

    /// [`Self::compile`], with the name of the constraint's field.
    fn compile_field(
        &self,
        constraint: ConstraintSpec<'_>,
    ) -> Result<(&'static str, ConstraintState), ConstraintError> {
        let (field, grammar) = grammar_of(constraint)?;
        let invalid = |message: String| ConstraintError::Invalid { field, message };
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| invalid(e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(message) = matcher.get_error() {
            return Err(invalid(message));
        }
        Ok((field, ConstraintState::new(matcher)))
    }
}

/// The llguidance grammar of `constraint`, with the name of the field it came from.
fn grammar_of(
    constraint: ConstraintSpec<'_>,
) -> Result<(&'static str, TopLevelGrammar), ConstraintError> {
    match constraint {
        ConstraintSpec::JsonSchema(text) => {
            let schema = serde_json::from_str(text)
                .map_err(|e| ConstraintError::SchemaNotJson(e.to_string()))?;
            Ok((
                "json_schema",
                TopLevelGrammar::from_json_schema(compact(schema)),
            ))
        }
        ConstraintSpec::JsonObject => Ok((
            "json_object",
            TopLevelGrammar::from_json_schema(compact(serde_json::json!({ "type": "object" }))),
        )),
        ConstraintSpec::Regex(regex) => Ok(("regex", TopLevelGrammar::from_regex(regex))),
        ConstraintSpec::Lark(grammar) => {
            Ok(("lark", TopLevelGrammar::from_lark(grammar.to_string())))
        }
        ConstraintSpec::Choice(choices) => {
            if choices.is_empty() {
                return Err(ConstraintError::NoChoices);
            }
            if let Some(i) = choices.iter().position(|c| c.is_empty()) {
                return Err(ConstraintError::EmptyChoice(i));
            }
            let alternatives: Vec<String> =
                choices.iter().map(|c| regex_syntax::escape(c)).collect();
            let regex = format!("({})", alternatives.join("|"));
            Ok(("choice", TopLevelGrammar::from_regex(&regex)))
        }
    }
}

/// Compact JSON by default: no whitespace between tokens (`{"a":1,"b":[2]}`), unless the schema sets
/// llguidance's own options (`"x-guidance": {"whitespace_flexible": true}` and the like). Free
/// whitespace lets a small model sampled at temperature 1 spend its whole budget on line breaks.
fn compact(mut schema: serde_json::Value) -> serde_json::Value {
    if let Some(object) = schema.as_object_mut() {
        object
            .entry("x-guidance")
            .or_insert_with(|| serde_json::json!({ "whitespace_flexible": false }));
    }
    schema
}
