//! One constrained sequence's llguidance state: which tokens may come next, and advancing by the
//! token that was chosen.

use llguidance::api::StopReason;
use llguidance::toktrie::SimpleVob;
use llguidance::Matcher;

use crate::error::MatchError;

/// The tokens allowed at one position: a bitset over the vocabulary, bit `i % 32` of word `i / 32`
/// set when token `i` is allowed.
#[derive(Debug, Clone)]
pub struct TokenMask(SimpleVob);

impl TokenMask {
    /// The bitset words (token `i` allowed iff `words[i / 32] >> (i % 32) & 1 == 1`; ids past the
    /// words are not allowed).
    pub fn words(&self) -> &[u32] {
        self.0.as_slice()
    }

    /// Whether token `id` is allowed.
    pub fn allows(&self, id: u32) -> bool {
        (id as usize) < self.0.len() && self.0.is_allowed(id)
    }

    /// How many tokens are allowed.
    pub fn num_allowed(&self) -> usize {
        self.0.num_set()
    }
}

/// What the constraint says after a token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// More tokens may (or must) follow.
    Open,
    /// The output is complete and nothing may follow: the sequence ends here.
    Complete,
}

/// A constrained sequence's state (llguidance's matcher), advanced one token at a time.
///
/// Everything it holds is a function of the constraint and the tokens it was advanced by, so a
/// state rebuilt by [`ConstraintState::replay`] of the same tokens (after a failover) allows exactly
/// what the original did.
pub struct ConstraintState {
    matcher: Matcher,
    /// Tokens advanced by so far.
    generated: usize,
}

impl std::fmt::Debug for ConstraintState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConstraintState")
            .field("generated", &self.generated)
            .finish_non_exhaustive()
    }
}

impl ConstraintState {
    pub(crate) fn new(matcher: Matcher) -> Self {
        Self {
            matcher,
            generated: 0,
        }
    }

    /// Tokens advanced by so far.
    pub fn generated(&self) -> usize {
        self.generated
    }

    /// Advances by `tokens`, already generated elsewhere (`AddRequest.generated_ids` on a failover).
    ///
    /// Errors: [`MatchError::Rejected`] for a token the constraint does not allow,
    /// [`MatchError::CompleteEarly`] when the output was complete before the last token.
    pub fn replay(&mut self, tokens: &[u32]) -> Result<(), MatchError> {
        for &token in tokens {
            if self.matcher.is_stopped() {
                return Err(MatchError::CompleteEarly(self.generated));
            }
            self.advance(token)?;
        }
        Ok(())
    }

    /// The tokens allowed next. Where the output is complete only the EOS ids are allowed (and they
    /// are allowed wherever it may end).
    ///
    /// Errors: [`MatchError::Internal`] when llguidance fails or allows nothing.
    pub fn compute_mask(&mut self) -> Result<TokenMask, MatchError> {
        if let Some(message) = self.failure() {
            return Err(MatchError::Internal(message));
        }
        let mask = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| MatchError::Internal(e.to_string()))?;
        if mask.is_zero() {
            return Err(MatchError::Internal(format!(
                "no token can continue the output after {} generated tokens",
                self.generated
            )));
        }
        Ok(TokenMask(mask))
    }

    /// Advances by the chosen `token` (not an EOS id: a sequence ends at its stop token without
    /// telling the constraint).
    ///
    /// Errors: [`MatchError::Rejected`] when the constraint does not allow `token` (a caller that
    /// sampled under [`compute_mask`](Self::compute_mask)'s mask never sees it),
    /// [`MatchError::Internal`] when llguidance stops for a reason other than a complete output.
    pub fn advance(&mut self, token: u32) -> Result<Progress, MatchError> {
        let index = self.generated;
        self.matcher
            .consume_token(token)
            .map_err(|e| MatchError::Rejected {
                token,
                index,
                message: e.to_string(),
            })?;
        self.generated += 1;
        if let Some(message) = self.failure() {
            return Err(MatchError::Internal(message));
        }
        Ok(match self.matcher.is_stopped() {
            true => Progress::Complete,
            false => Progress::Open,
        })
    }

    /// The tokens the constraint forces next, at most `max`: token `i` is the only token the mask
    /// allows after the tokens advanced by so far followed by tokens `0..i`. The run ends at the
    /// first position that allows more than one token, or only an EOS id, or where the output is
    /// complete. A sampler restricted to those masks can only choose these tokens, which makes them
    /// free speculative proposals that are always accepted.
    ///
    /// This state is not changed: the lookahead runs on a clone of the matcher (llguidance's
    /// `Matcher::clone`, which copies the parser's rows and shares its lexer cache; the caches only
    /// speed up later masks, never change them). llguidance's own fast-forward tokens
    /// (`Matcher::compute_ff_tokens`, llguidance 1.9.1 `src/matcher.rs`, `src/tokenparser.rs`) are
    /// not used: they are empty for a non-canonical tokenizer environment, which is what
    /// [`crate::ConstraintCompiler`] builds (`ApproximateTokEnv`), and where the tokenizer is
    /// canonical they force bytes into the parser (`TokenParser::force_bytes`).
    ///
    /// Costs a clone of the matcher and, only where llguidance finds forced bytes, one mask per
    /// returned token plus one; a state with no forced bytes (most positions of free text) costs
    /// the clone and a walk of the parser, no mask.
    ///
    /// Shapes: an empty vector for `max == 0`, a complete output, or nothing forced. Errors: none
    /// are returned; where llguidance fails on the clone the run ends before that position (the
    /// same failure then surfaces from [`compute_mask`](Self::compute_mask) on this state).
    pub fn forced_tokens(&self, max: usize) -> Vec<u32> {
        let mut forced = Vec::new();
        if max == 0 || self.matcher.is_stopped() || self.failure().is_some() {
            return forced;
        }
        let mut lookahead = self.matcher.clone();
        // No forced byte: at least two bytes may follow, each a token of its own in a byte-level
        // vocabulary, so no token is forced and no mask needs computing.
        if lookahead.compute_ff_bytes().is_empty() {
            return forced;
        }
        // The clone's parser now has its forced bytes pushed; start over from a fresh clone so the
        // masks below are computed exactly as on this state.
        let mut lookahead = self.matcher.clone();
        let Ok(env) = lookahead.tok_env() else {
            return forced;
        };
        let eos = env.tok_trie().eos_token_set();
        while forced.len() < max {
            let Ok(mask) = lookahead.compute_mask() else {
                break;
            };
            if mask.num_set() != 1 {
                break;
            }
            let Some(only) = mask.first_bit_set().map(|id| id as u32) else {
                break;
            };
            if eos.is_allowed(only) || lookahead.consume_token(only).is_err() {
                break;
            }
            forced.push(only);
            if lookahead.is_stopped() {
                break;
            }
        }
        forced
    }

    /// Why the matcher stopped, when it stopped for a reason other than a complete output.
    fn failure(&self) -> Option<String> {
        if let Some(error) = self.matcher.get_error() {
            return Some(error);
        }
        match self.matcher.stop_reason() {
            StopReason::NotStopped
            | StopReason::NoExtension
            | StopReason::NoExtensionBias
            | StopReason::EndOfSentence => None,
            other => Some(format!("llguidance stopped: {other}")),
        }
    }
}
