//! Process-wide speculation metrics, labelled by proposer (the configured one's name, and
//! [`FORCED_LABEL`] for tokens a constraint forces), observed by the engine at every verification
//! and registered by the worker (`worker_speculative_draft_tokens_total`,
//! `worker_speculative_accepted_tokens_total`, `worker_speculative_accepted_per_step`).

use std::sync::LazyLock;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;

use super::Proposer;

/// The label set: `proposer` = [`Proposer::name`].
pub type ProposerLabels = Vec<(String, String)>;

/// A counter per proposer.
pub type CounterFamily = Family<ProposerLabels, Counter>;

/// A histogram per proposer.
pub type HistogramFamily = Family<ProposerLabels, Histogram, fn() -> Histogram>;

/// Bounds of the accepted-per-step histogram: 0, 1, 2, ... 16 accepted tokens (the cap of
/// `num_speculative_tokens`).
fn accepted_buckets() -> Histogram {
    Histogram::new((0..=super::MAX_SPECULATIVE_TOKENS).map(|n| n as f64))
}

static DRAFT_TOKENS: LazyLock<CounterFamily> = LazyLock::new(Family::default);
static ACCEPTED_TOKENS: LazyLock<CounterFamily> = LazyLock::new(Family::default);
static ACCEPTED_PER_STEP: LazyLock<HistogramFamily> =
    LazyLock::new(|| Family::new_with_constructor(accepted_buckets as fn() -> Histogram));

/// The `proposer` label of the tokens a structured-output constraint forces (they are counted
/// apart from the configured proposer's: they are always accepted).
pub const FORCED_LABEL: &str = "grammar";

fn labels(proposer: &str) -> ProposerLabels {
    vec![("proposer".to_owned(), proposer.to_owned())]
}

/// Records one verification: `proposed` draft tokens, the first `forced` of them forced by the
/// constraint, of which the first `accepted` were accepted. The forced part counts under
/// [`FORCED_LABEL`], the rest under the proposer's name; a part with no tokens is not observed.
pub(crate) fn observe(proposer: Proposer, proposed: usize, forced: usize, accepted: usize) {
    let forced_accepted = accepted.min(forced);
    if forced > 0 {
        observe_part(FORCED_LABEL, forced, forced_accepted);
    }
    if proposed > forced {
        observe_part(
            proposer.name(),
            proposed - forced,
            accepted - forced_accepted,
        );
    }
}

fn observe_part(proposer: &str, proposed: usize, accepted: usize) {
    let labels = labels(proposer);
    DRAFT_TOKENS.get_or_create(&labels).inc_by(proposed as u64);
    ACCEPTED_TOKENS
        .get_or_create(&labels)
        .inc_by(accepted as u64);
    ACCEPTED_PER_STEP
        .get_or_create(&labels)
        .observe(accepted as f64);
}

/// Draft tokens proposed, per proposer (shared: clones count into the same counters).
pub fn draft_tokens() -> CounterFamily {
    DRAFT_TOKENS.clone()
}

/// Draft tokens accepted, per proposer.
pub fn accepted_tokens() -> CounterFamily {
    ACCEPTED_TOKENS.clone()
}

/// Tokens accepted per verification of one sequence, per proposer.
pub fn accepted_per_step() -> HistogramFamily {
    ACCEPTED_PER_STEP.clone()
}
