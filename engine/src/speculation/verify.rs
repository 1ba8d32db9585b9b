//! The acceptance rule that makes speculation exact: commit, position by position, the token plain
//! decoding emits there, while it equals the proposal.

use structured_output::MatchError;

use crate::sampler::SampledToken;
use crate::sequence::{Sequence, StopReason};

/// What one verification committed.
#[derive(Debug)]
pub(crate) struct Verified {
    /// The committed tokens in order (at least one unless the first sampling failed), each with
    /// the stop reason when it ends the sequence (then it is the last).
    pub tokens: Vec<(SampledToken, Option<StopReason>)>,
    /// Draft tokens accepted (committed tokens equal to their proposal).
    pub accepted: usize,
    /// Sampling or the constraint failed at the position after the committed tokens.
    pub error: Option<MatchError>,
}

/// Verifies `seq`'s `draft` against `rows` (the step's entry ran the last committed token, already
/// counted in `seq.computed`, and the draft): `rows[i]` (`[vocab]` f32) are the logits after the
/// sequence's last committed token followed by `draft[..i]`, so `rows.len() == draft.len() + 1`
/// (a plain decode is an empty draft and one row).
///
/// At each position the token is chosen exactly as plain decoding chooses it
/// ([`Sequence::accept_logits`]: the sampler's draw for that generated index, penalties over the
/// committed tokens, the constraint's mask in the state after them, the stop policy); it is
/// committed, and the next position is tried only when it equals the proposal there and did not
/// end the sequence. Afterwards `seq.computed` counts the K/V of the accepted proposals too
/// (their rows' K/V is plain decoding's), so the sequence again has exactly one uncomputed token;
/// an accepted proposal that ends the sequence stays uncomputed, as the last token of plain
/// decoding does, so the prefix cache ends exactly as plain decoding leaves it.
///
/// The first position's constraint mask is the one computed during the forward pass; later
/// positions compute theirs here, after the committed tokens advanced the constraint.
pub(crate) fn verify(seq: &mut Sequence, draft: &[u32], rows: &[&[f32]]) -> Verified {
    debug_assert_eq!(rows.len(), draft.len() + 1);
    let mut out = Verified {
        tokens: Vec::with_capacity(rows.len()),
        accepted: 0,
        error: None,
    };
    // The accepted proposals whose K/V now counts as computed (all but one that ends the sequence).
    let mut computed = 0;
    for (i, row) in rows.iter().enumerate() {
        if i > 0 {
            if let Some(constraint) = seq.constraint.as_mut() {
                seq.mask = Some(constraint.compute_mask());
            }
        }
        match seq.accept_logits(row) {
            Ok((sampled, stop)) => {
                let matches = draft.get(i) == Some(&sampled.token_id);
                out.tokens.push((sampled, stop));
                if !matches {
                    break;
                }
                out.accepted += 1;
                if stop.is_some() {
                    break;
                }
                computed += 1;
            }
            Err(e) => {
                out.error = Some(e);
                break;
            }
        }
    }
    seq.computed += computed;
    out
}
