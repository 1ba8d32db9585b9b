//! Prompt logprobs: the log-probability of each prompt token given the tokens before it (and the
//! most likely alternatives), computed from the prefill pass itself.
//!
//! A request that asks for them ([`EngineRequest::prompt_logprobs`](super::EngineRequest)) has
//! every prefill chunk run with `logit_tokens` covering the chunk's prompt positions still to score
//! (see [`logit_tokens`]), so the backend returns the logits of position `p`, from which prompt
//! token `p + 1` is scored by [`score_token`], the code that scores generated tokens: the
//! backend's rows are bitwise what a pass ending at `p` returns (batch and chunk invariance), so a
//! prompt token's logprob is bitwise the logprob the same token would get if it were generated
//! after `tokens[..=p]` (teacher forcing). The first prompt token has no logprob (nothing precedes
//! it).
//!
//! Prefix cache: a cached block's positions are never run, so they have no logits. A sequence that
//! still has prompt positions to score reuses cached blocks only up to its first unscored position
//! ([`reusable_prefix`]); its blocks are still registered for others as they fill. After a
//! preemption the positions already scored are not scored again.
//!
//! Memory: the step's logits buffer holds one `[vocab]` f32 row per scored position, so a chunk of
//! 512 scored positions of Gemma 3's 262,144-token vocabulary takes 512 MiB (SmolLM2's 49,152: 96
//! MiB); `max_batch_tokens` bounds it.

use crate::sampler::{score_token, SampledToken};

use super::output::PromptLogprobs;
use super::sequence::Sequence;

/// The first prompt position whose logits `seq` still needs, `None` when it needs none.
fn next_position(seq: &Sequence) -> Option<usize> {
    let scoring = seq.prompt_scoring?;
    (scoring.scored + 1 < seq.prompt_len).then_some(scoring.scored)
}

/// How many leading known tokens of `seq` may be taken from the prefix cache: all of them, or up
/// to its first prompt position still to score (whose logits must be computed).
pub fn reusable_prefix(seq: &Sequence) -> usize {
    next_position(seq).map_or(seq.tokens.len(), |p| p)
}

/// How many trailing tokens of the chunk `start .. end` of `seq`'s known tokens need logits: the
/// positions from the first prompt position still to score, and always the last known token (the
/// sampling row) when the chunk ends the known tokens.
pub fn logit_tokens(seq: &Sequence, start: usize, end: usize) -> usize {
    let last = usize::from(end == seq.tokens.len());
    match next_position(seq) {
        Some(p) => (end - p.clamp(start, end)).max(last),
        None => last,
    }
}

/// Consumes the `rows` (`[vocab]` f32 each) of a chunk of `seq` that ends at known token `end`
/// (as many as [`logit_tokens`] said, the chunk's last positions in order): scores the prompt tokens they predict and returns
/// them (`None` when there are none), and the sampling row when the chunk ends the known tokens.
pub fn consume<'a>(
    seq: &mut Sequence,
    end: usize,
    rows: &[&'a [f32]],
) -> (Option<PromptLogprobs>, Option<&'a [f32]>) {
    let sampling_row = (end == seq.tokens.len())
        .then(|| rows.last().copied())
        .flatten();
    let Some(first) = next_position(seq) else {
        return (None, sampling_row);
    };
    let first_row_pos = end - rows.len();
    let scoring = seq
        .prompt_scoring
        .as_mut()
        .expect("next_position checked it");
    let mut tokens: Vec<SampledToken> = Vec::new();
    for (i, row) in rows.iter().enumerate() {
        let p = first_row_pos + i;
        if p < first || p + 1 >= seq.prompt_len {
            continue;
        }
        tokens.push(score_token(row, seq.tokens[p + 1], scoring.top_n));
        scoring.scored = p + 1;
    }
    let out = (!tokens.is_empty()).then(|| PromptLogprobs {
        request_id: seq.request_id.clone(),
        first_index: first as u32 + 1,
        prompt_len: seq.prompt_len as u32,
        tokens,
    });
    (out, sampling_row)
}
