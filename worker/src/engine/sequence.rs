//! One request's state inside the engine: its tokens, KV cache, sampler and stop policy.

use std::collections::HashSet;

use crate::sampler::{SampledToken, Sampler};

/// Why the worker ended a sequence by itself (the router may also end it, by cancelling).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// One of the request's stop token ids (EOS ids) was generated.
    StopToken,
    /// `max_new_tokens` tokens were generated.
    Length,
    /// Prompt plus generated tokens reached the model's context length.
    ContextFull,
}

/// A request being generated.
///
/// Invariant: `cache` holds K/V for exactly `computed` tokens of `prompt_ids ++ generated`.
pub struct Sequence<C> {
    /// Which router connection owns it.
    pub conn: u64,
    /// The router's id for the request (unique per connection).
    pub request_id: String,
    /// Prompt token ids (never empty).
    pub prompt_ids: Vec<u32>,
    /// Tokens generated so far.
    pub generated: Vec<u32>,
    /// The sequence's KV cache.
    pub cache: C,
    /// Tokens whose K/V are in `cache`.
    pub computed: usize,
    sampler: Sampler,
    max_new_tokens: usize,
    stop_token_ids: HashSet<u32>,
    context_length: usize,
}

impl<C> Sequence<C> {
    /// Creates a sequence that has computed nothing yet.
    ///
    /// The caller has validated: `prompt_ids` non-empty and shorter than `context_length`,
    /// `max_new_tokens >= 1`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        conn: u64,
        request_id: String,
        prompt_ids: Vec<u32>,
        cache: C,
        sampler: Sampler,
        max_new_tokens: usize,
        stop_token_ids: impl IntoIterator<Item = u32>,
        context_length: usize,
    ) -> Self {
        Self {
            conn,
            request_id,
            prompt_ids,
            generated: Vec::new(),
            cache,
            computed: 0,
            sampler,
            max_new_tokens,
            stop_token_ids: stop_token_ids.into_iter().collect(),
            context_length,
        }
    }

    /// Tokens this step must feed the model: the whole prompt on the first step (prefill), then the
    /// last generated token (decode).
    pub fn pending_tokens(&self) -> &[u32] {
        if self.computed < self.prompt_ids.len() {
            &self.prompt_ids[self.computed..]
        } else {
            let start = self.computed - self.prompt_ids.len();
            &self.generated[start..]
        }
    }

    /// Total tokens in the sequence (prompt + generated).
    pub fn len(&self) -> usize {
        self.prompt_ids.len() + self.generated.len()
    }

    /// True when the sequence has no tokens (never the case for a valid request).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Samples the next token from `logits` (`[vocab]` f32) and applies the stop policy.
    ///
    /// Returns the token and, when the sequence is finished, why. Order of checks: a stop token wins
    /// over the length limit, which wins over the context limit.
    pub fn accept_logits(&mut self, logits: &[f32]) -> (SampledToken, Option<StopReason>) {
        self.computed = self.len();
        let sampled = self.sampler.sample(logits);
        self.generated.push(sampled.token_id);
        let reason = if self.stop_token_ids.contains(&sampled.token_id) {
            Some(StopReason::StopToken)
        } else if self.generated.len() >= self.max_new_tokens {
            Some(StopReason::Length)
        } else if self.len() >= self.context_length {
            Some(StopReason::ContextFull)
        } else {
            None
        };
        (sampled, reason)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::SamplingConfig;

    fn seq(max_new: usize, ctx: usize) -> Sequence<()> {
        let greedy = SamplingConfig {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
        };
        Sequence::new(
            1,
            "r".into(),
            vec![5, 6, 7],
            (),
            Sampler::new(greedy, 0),
            max_new,
            [2],
            ctx,
        )
    }

    fn logits_for(id: usize) -> Vec<f32> {
        let mut l = vec![0.0; 10];
        l[id] = 5.0;
        l
    }

    #[test]
    fn prefill_then_decode_pending_tokens() {
        let mut s = seq(5, 100);
        assert_eq!(s.pending_tokens(), &[5, 6, 7]);
        let (t, r) = s.accept_logits(&logits_for(4));
        assert_eq!((t.token_id, r), (4, None));
        assert_eq!(s.pending_tokens(), &[4]);
        s.accept_logits(&logits_for(3));
        assert_eq!(s.pending_tokens(), &[3]);
    }

    #[test]
    fn stop_token_wins_over_length() {
        let mut s = seq(1, 100);
        let (_, r) = s.accept_logits(&logits_for(2));
        assert_eq!(r, Some(StopReason::StopToken));
    }

    #[test]
    fn length_then_context() {
        let mut s = seq(2, 100);
        assert_eq!(s.accept_logits(&logits_for(4)).1, None);
        assert_eq!(s.accept_logits(&logits_for(4)).1, Some(StopReason::Length));
        let mut s = seq(10, 5);
        assert_eq!(s.accept_logits(&logits_for(4)).1, None);
        assert_eq!(
            s.accept_logits(&logits_for(4)).1,
            Some(StopReason::ContextFull)
        );
    }
}
