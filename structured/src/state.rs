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
