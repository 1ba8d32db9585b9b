//! Structured output in the engine step: the allowed-token masks of the constrained sequences that
//! sample in a step, computed on a helper thread while the step's forward pass runs on the engine
//! thread (a mask depends only on the sequence's constraint and generated tokens, all known before
//! the forward pass). Unconstrained sequences never wait for a mask beyond the overlap; a step with
//! no constrained sequence starts no thread.
//!
//! Every mask's computation time is recorded in [`mask_seconds`] (the worker's
//! `worker_constraint_mask_seconds` histogram).

use std::collections::HashMap;
use std::sync::LazyLock;
use std::time::Instant;

use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use structured_output::{ConstraintState, MatchError, TokenMask};

use super::scheduler::{Chunk, SeqId};
use super::sequence::Sequence;

/// Lowest bucket bound of [`MASK_SECONDS`] (5 µs), the ratio of consecutive bounds (2^(1/4), four
/// buckets per doubling) and the number of bounds (58: the highest is ~97 ms).
const MASK_BUCKET_START: f64 = 5e-6;
const MASK_BUCKET_FACTOR: f64 = 1.189_207_115_002_721; // 2^(1/4)
const MASK_BUCKETS: u16 = 58;

/// Seconds to compute one sequence's allowed-token mask. Log-spaced buckets from 5 µs to ~97 ms,
/// each ~19% wider than the previous, so a median or p99 interpolated within its bucket (as
/// `histogram_quantile` and `bench --worker-metrics` do) is off by less than ~19%.
static MASK_SECONDS: LazyLock<Histogram> = LazyLock::new(|| {
    Histogram::new(exponential_buckets(
        MASK_BUCKET_START,
        MASK_BUCKET_FACTOR,
        MASK_BUCKETS,
    ))
});

/// The process-wide histogram of mask computation times, in seconds (shared: clones observe into
/// the same buckets).
pub fn mask_seconds() -> Histogram {
    MASK_SECONDS.clone()
}

/// The constraint states lent to the helper thread for one step.
pub(super) struct MaskJobs(Vec<(SeqId, Box<ConstraintState>)>);

/// A lent state back from the helper thread with its mask.
pub(super) struct MaskOutcome {
    seq: SeqId,
    state: Box<ConstraintState>,
    mask: Result<TokenMask, MatchError>,
}

impl MaskJobs {
    /// Takes the constraint states of the constrained sequences that sample in this step (their
    /// chunk reaches the end of their known tokens).
    pub(super) fn take(chunks: &[Chunk], seqs: &mut HashMap<SeqId, Sequence>) -> Self {
        let mut jobs = Vec::new();
        for chunk in chunks {
            let Some(seq) = seqs.get_mut(&chunk.seq) else {
                continue;
            };
            if seq.computed + chunk.num_tokens != seq.tokens.len() {
                continue;
            }
            if let Some(state) = seq.constraint.take() {
                jobs.push((chunk.seq, state));
            }
        }
        Self(jobs)
    }

    /// The sequences whose states are lent.
    pub(super) fn ids(&self) -> Vec<SeqId> {
        self.0.iter().map(|(id, _)| *id).collect()
    }

    /// Runs `forward` on this thread while the masks are computed on a scoped helper thread (none
    /// when there are no jobs); returns `forward`'s result and the outcomes.
    pub(super) fn overlap<R>(self, forward: impl FnOnce() -> R) -> (R, Vec<MaskOutcome>) {
        if self.0.is_empty() {
            return (forward(), Vec::new());
        }
        std::thread::scope(|scope| {
            let helper = std::thread::Builder::new()
                .name("constraint-masks".into())
                .spawn_scoped(scope, move || self.compute());
            match helper {
                Ok(helper) => {
                    let result = forward();
                    // llguidance catches its own panics; a panic here is ours, and loses the
                    // states: those sequences fail in `restore`.
                    (result, helper.join().unwrap_or_default())
                }
                // No thread to be had (the states went with the closure): this step's constrained
                // sequences fail in `restore`, the others go on.
                Err(e) => {
                    tracing::error!(error = %e, "cannot start the constraint-mask thread");
                    (forward(), Vec::new())
                }
            }
        })
    }

    fn compute(self) -> Vec<MaskOutcome> {
        self.0
            .into_iter()
            .map(|(seq, mut state)| {
                let started = Instant::now();
                let mask = state.compute_mask();
                MASK_SECONDS.observe(started.elapsed().as_secs_f64());
                MaskOutcome { seq, state, mask }
            })
            .collect()
    }
}

/// Gives the states back to their sequences with their masks. A sequence whose state did not come
/// back (a panic on the helper thread) gets an error mask, so it fails instead of sampling freely.
pub(super) fn restore(
    outcomes: Vec<MaskOutcome>,
    lent: &[SeqId],
    seqs: &mut HashMap<SeqId, Sequence>,
) {
    let mut back = std::collections::HashSet::new();
    for outcome in outcomes {
        back.insert(outcome.seq);
        if let Some(seq) = seqs.get_mut(&outcome.seq) {
            seq.constraint = Some(outcome.state);
            seq.mask = Some(outcome.mask);
        }
    }
    for id in lent.iter().filter(|id| !back.contains(id)) {
        if let Some(seq) = seqs.get_mut(id) {
            seq.mask = Some(Err(MatchError::Internal(
                "computing the token mask failed (helper thread)".into(),
            )));
        }
    }
}

#[cfg(test)]
mod bucket_tests {
    use super::*;

    #[test]
    fn mask_buckets_are_log_spaced_from_5_us_to_about_100_ms() {
        let bounds: Vec<f64> =
            exponential_buckets(MASK_BUCKET_START, MASK_BUCKET_FACTOR, MASK_BUCKETS).collect();
        assert_eq!(bounds[0], 5e-6);
        let last = *bounds.last().unwrap();
        assert!((0.09..0.1).contains(&last), "{last}");
        // Four buckets per doubling.
        for w in bounds.windows(5) {
            assert!((w[4] / w[0] - 2.0).abs() < 1e-9, "{w:?}");
        }
    }
}
