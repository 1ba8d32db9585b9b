//! Completions' `echo` (what evaluation harnesses such as lm-evaluation-harness score): the
//! response's text starts with the prompt and, with `logprobs: N`, its `logprobs` start with the
//! prompt tokens' log probabilities and top-N alternatives (the first token's are `null`, as
//! OpenAI's were), computed by the worker's prefill (the gRPC `prompt_logprobs`).
//!
//! `max_tokens: 0` with `echo` scores the prompt without generating: the worker runs the request
//! with one new token (the engine always samples after a prefill) and the router drops it, so the
//! choice is the prompt alone, `finish_reason` `length` and `completion_tokens` 0.
//!
//! `echo` is served on `/v1/completions`, not streamed (a streamed echo is refused with 400, like
//! `echo` on chat).

use super::error::{ApiError, Endpoint};

/// What an echoing request asks of every one of its choices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Echo {
    /// Each prompt's text as given (`None` for a prompt of token ids: its decoded ids are echoed).
    pub prompt_texts: Vec<Option<String>>,
    /// Whether generated text follows (false for `max_tokens: 0`).
    pub generate: bool,
}

/// One choice's echo: the prompt's text, and whether the generated text follows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EchoPrompt {
    /// The prompt's text.
    pub text: String,
    /// Whether generated text follows (false for `max_tokens: 0`).
    pub generate: bool,
}

/// Checks an `echo: true` request's other fields: the endpoint (completions only), no
/// streaming.
///
/// Errors: 400 naming `echo` on chat or with `stream: true`.
pub fn check(endpoint: Endpoint, stream: bool) -> Result<(), ApiError> {
    if endpoint == Endpoint::Chat {
        return Err(ApiError::invalid(
            "echo",
            "echo is served on /v1/completions only",
        ));
    }
    if stream {
        return Err(ApiError::invalid(
            "echo",
            "echo is not served with stream: true; ask without streaming",
        ));
    }
    Ok(())
}

/// The `max_new_tokens` a request with `max_tokens` asks the workers for, and whether the
/// generated text is shown: an echo with `max_tokens: 0` runs one token and hides it.
pub fn max_new_tokens(max_tokens: u32, echo: bool) -> (u32, bool) {
    match (max_tokens, echo) {
        (0, true) => (1, false),
        (n, _) => (n, true),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_tokens_run_one_hidden_only_with_echo() {
        assert_eq!(max_new_tokens(0, true), (1, false));
        assert_eq!(max_new_tokens(0, false), (0, true));
        assert_eq!(max_new_tokens(5, true), (5, true));
        assert!(check(Endpoint::Completions, false).is_ok());
        assert!(check(Endpoint::Chat, false).is_err());
        assert!(check(Endpoint::Completions, true).is_err());
    }
}
