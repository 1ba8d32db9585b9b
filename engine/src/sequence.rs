//! One request's state inside the engine: its tokens, how many are in the KV cache, its block table,
//! its sampler, its structured-output constraint and its stop policy.

use std::collections::HashSet;

use structured_output::{ConstraintState, MatchError, Progress, TokenMask};

use crate::kv::SequenceBlocks;
use crate::sampler::{SampledToken, Sampler};
use crate::speculation::SequenceSpeculation;

use super::ConnId;

/// Why the worker ended a sequence by itself (the router may also end it, by cancelling).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// One of the request's stop token ids (EOS ids) was generated.
    StopToken,
    /// `max_new_tokens` tokens were generated.
    Length,
    /// Prompt plus generated tokens reached the model's context length.
    ContextFull,
    /// The request's constraint is complete: nothing may follow.
    ConstraintComplete,
}

/// Prompt logprobs (the `prompt_logprobs` module): what a sequence asked for and how far it got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PromptScoring {
    /// Most likely alternatives to report per prompt token (0: the logprob alone).
    pub top_n: usize,
    /// Prompt positions whose logits have been scored so far: tokens `1 ..= scored` have their
    /// logprobs sent. Scoring is done at `prompt_len - 1`.
    pub scored: usize,
}

/// A request being generated.
///
/// Invariant: the KV cache holds exactly `tokens[..computed]`, in the blocks of `blocks` (`None`
/// while the sequence waits for admission, including after a preemption).
pub struct Sequence {
    /// Which router connection owns it.
    pub conn: ConnId,
    /// The router's id for the request (unique per connection).
    pub request_id: String,
    /// Prompt tokens followed by the generated ones.
    pub tokens: Vec<u32>,
    /// Length of the prompt within `tokens`.
    pub prompt_len: usize,
    /// Tokens whose K/V are in the cache.
    pub computed: usize,
    /// The block table, while admitted.
    pub blocks: Option<SequenceBlocks>,
    /// Structured output: the constraint's state, advanced by every generated token (`None` =
    /// unconstrained). It lives with the tokens, so a preemption (which keeps them) keeps it too.
    pub constraint: Option<Box<ConstraintState>>,
    /// The tokens the constraint allows at the next position (or why they could not be computed),
    /// computed for the step that samples it.
    pub mask: Option<Result<TokenMask, MatchError>>,
    /// The root of its prefix-cache block chain (block 0's parent hash): `block_hash::SEED`, or
    /// the salted seed of its cache salt (prefix-cache isolation).
    pub prefix_root: u64,
    /// Prompt logprobs: what the request asked for and how far the scoring got (`None`: not
    /// asked for).
    pub prompt_scoring: Option<PromptScoring>,
    /// Speculative decoding: whether the request allows it, this step's draft, its counters.
    pub speculation: SequenceSpeculation,
    sampler: Sampler,
    max_new_tokens: usize,
    stop_token_ids: HashSet<u32>,
    context_length: usize,
}

impl Sequence {
    /// A waiting sequence that has computed nothing yet.
    ///
    /// The caller has validated: `prompt` non-empty and shorter than `context_length`,
    /// `max_new_tokens >= 1`.
    pub fn new(
        conn: ConnId,
        request_id: String,
        prompt: Vec<u32>,
        sampler: Sampler,
        max_new_tokens: usize,
        stop_token_ids: impl IntoIterator<Item = u32>,
        context_length: usize,
    ) -> Self {
        Self {
            conn,
            request_id,
            prompt_len: prompt.len(),
            tokens: prompt,
            computed: 0,
            blocks: None,
            constraint: None,
            mask: None,
            prefix_root: block_hash::SEED,
            prompt_scoring: None,
            speculation: SequenceSpeculation::new(true),
            sampler,
            max_new_tokens,
            stop_token_ids: stop_token_ids.into_iter().collect(),
            context_length,
        }
    }

    /// Tokens generated so far.
    pub fn generated(&self) -> &[u32] {
        &self.tokens[self.prompt_len..]
    }

    /// Known tokens not yet in the KV cache.
    pub fn remaining(&self) -> usize {
        self.tokens.len() - self.computed
    }

    /// Tokens this sequence may still generate before `max_new_tokens` or the context ends it.
    pub fn tokens_left(&self) -> usize {
        let by_length = self.max_new_tokens.saturating_sub(self.generated().len());
        by_length.min(self.context_length.saturating_sub(self.tokens.len()))
    }

    /// True while more than one known token is uncomputed (a prompt, or a recompute after
    /// preemption); false when only the last sampled token is pending (decode).
    pub fn in_prefill(&self) -> bool {
        self.remaining() > 1
    }

    /// Samples the next token from `logits` (`[vocab]` f32, of the last known token), restricted to
    /// the constraint's `mask` when the sequence is constrained, advances the constraint, and
    /// applies the stop policy. Returns the token and, when the sequence is finished, why.
    ///
    /// Order of checks: a stop token wins over a complete constraint, which wins over the length
    /// limit, which wins over the context limit. The draw depends only on (seed, number of generated
    /// tokens, mask), so a recomputed sequence draws exactly what it would have drawn.
    ///
    /// Errors: a constrained sequence without a computed mask, or llguidance failing to advance.
    pub fn accept_logits(
        &mut self,
        logits: &[f32],
    ) -> Result<(SampledToken, Option<StopReason>), MatchError> {
        let mask = match (self.mask.take(), &self.constraint) {
            (Some(mask), _) => Some(mask?),
            (None, Some(_)) => {
                return Err(MatchError::Internal(
                    "no token mask was computed for this step".into(),
                ))
            }
            (None, None) => None,
        };
        let (prompt, generated) = self.tokens.split_at(self.prompt_len);
        let allowed = mask.as_ref().map(TokenMask::words);
        let sampled = self
            .sampler
            .sample_masked(logits, prompt, generated, allowed);
        self.tokens.push(sampled.token_id);
        let generated = self.tokens.len() - self.prompt_len;
        let stop_token = self.stop_token_ids.contains(&sampled.token_id);
        let complete = match self.constraint.as_mut() {
            // A stop token ends the sequence; the constraint allowed it only where complete.
            Some(constraint) if !stop_token => {
                constraint.advance(sampled.token_id)? == Progress::Complete
            }
            _ => false,
        };
        let reason = if stop_token {
            Some(StopReason::StopToken)
        } else if complete {
            Some(StopReason::ConstraintComplete)
        } else if generated >= self.max_new_tokens {
            Some(StopReason::Length)
        } else if self.tokens.len() >= self.context_length {
            Some(StopReason::ContextFull)
        } else {
            None
        };
        Ok((sampled, reason))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::SamplingConfig;

    fn seq(max_new: usize, ctx: usize) -> Sequence {
        let sampler = Sampler::new(SamplingConfig::default(), 0);
        Sequence::new(1, "r".into(), vec![5, 6, 7], sampler, max_new, [2], ctx)
    }

    fn logits_for(id: usize) -> Vec<f32> {
        let mut l = vec![0.0; 10];
        l[id] = 5.0;
        l
    }

    #[test]
    fn phases() {
        let mut s = seq(5, 100);
        assert!(s.in_prefill());
        s.computed = 3;
        let (t, r) = s.accept_logits(&logits_for(4)).unwrap();
        assert_eq!((t.token_id, r), (4, None));
        assert!(!s.in_prefill());
        assert_eq!(s.generated(), &[4]);
    }

    #[test]
    fn stop_token_wins_over_length() {
        let mut s = seq(1, 100);
        assert_eq!(
            s.accept_logits(&logits_for(2)).unwrap().1,
            Some(StopReason::StopToken)
        );
    }

    #[test]
    fn length_then_context() {
        let mut s = seq(2, 100);
        assert_eq!(s.accept_logits(&logits_for(4)).unwrap().1, None);
        assert_eq!(
            s.accept_logits(&logits_for(4)).unwrap().1,
            Some(StopReason::Length)
        );
        let mut s = seq(10, 5);
        assert_eq!(s.accept_logits(&logits_for(4)).unwrap().1, None);
        assert_eq!(
            s.accept_logits(&logits_for(4)).unwrap().1,
            Some(StopReason::ContextFull)
        );
    }
}
