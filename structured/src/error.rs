//! The crate's errors: building a vocabulary's token environment ([`VocabError`]), compiling a
//! request's constraint ([`ConstraintError`], the client's fault) and following it during generation
//! ([`MatchError`]).

/// The model's vocabulary cannot serve structured output.
#[derive(Debug, thiserror::Error)]
pub enum VocabError {
    /// A tokenizer model other than GGUF `"gpt2"` or `"llama"`.
    #[error("unsupported tokenizer model {0:?} (supported: \"gpt2\" byte-level BPE, \"llama\" SentencePiece)")]
    UnsupportedTokenizer(String),
    /// A SentencePiece byte token (type 6) that is not `<0xNN>`.
    #[error("byte token {id} is {token:?}, not <0xNN>")]
    BadByteToken {
        /// Its id.
        id: u32,
        /// Its string.
        token: String,
    },
    /// No end-of-sequence id inside the vocabulary.
    #[error("the model declares no end-of-sequence token inside its vocabulary of {0} tokens")]
    NoEos(usize),
    /// The model's description (a worker's `Info`) has no tokenizer.
    #[error("cannot build the token environment: the model's Info has no tokenizer")]
    NoTokenizer,
    /// llguidance refused the token environment.
    #[error("cannot build the token environment: {0}")]
    Environment(String),
}

/// A request's constraint is invalid (the message names the field and the problem).
#[derive(Debug, thiserror::Error)]
pub enum ConstraintError {
    /// `Constraint` with no kind set (raised where the proto is converted).
    #[error("constraint is empty: set one of json_schema, json_object, regex, lark, choice")]
    Empty,
    /// `json_schema` is not JSON.
    #[error("constraint.json_schema is not valid JSON: {0}")]
    SchemaNotJson(String),
    /// `choice` with no choices.
    #[error("constraint.choice needs at least one choice")]
    NoChoices,
    /// An empty string among the choices.
    #[error("constraint.choice.choices[{0}] is empty")]
    EmptyChoice(usize),
    /// llguidance cannot compile the schema, regex or grammar.
    #[error("constraint.{field} is invalid: {message}")]
    Invalid {
        /// `json_schema`, `json_object`, `regex`, `lark` or `choice`.
        field: &'static str,
        /// llguidance's explanation.
        message: String,
    },
}

/// A constrained sequence cannot go on (llguidance's state for it failed).
#[derive(Debug, thiserror::Error)]
pub enum MatchError {
    /// A token (replayed from `generated_ids`, or sampled) that the constraint does not allow.
    #[error(
        "token {token} at generated index {index} is not allowed by the constraint: {message}"
    )]
    Rejected {
        /// The token id.
        token: u32,
        /// Its index among the generated tokens.
        index: usize,
        /// llguidance's explanation.
        message: String,
    },
    /// The constraint was already complete before the end of `generated_ids`.
    #[error("the constraint was complete after {0} generated tokens; more were given")]
    CompleteEarly(usize),
    /// llguidance failed computing the allowed tokens, or stopped for a reason other than a
    /// complete output (e.g. a lexer or parser too complex for its limits).
    #[error("structured output failed: {0}")]
    Internal(String),
}
