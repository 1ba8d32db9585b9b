//! Token sampling for one sequence: logit bias, repetition/frequency/presence penalties, greedy or
//! temperature sampling with top-k, top-p and min-p, a counter-based random stream, and logprobs.
//!
//! # Pipeline
//!
//! [`Sampler::sample`] turns the model's logits for one position into a token, in this order (the
//! order vLLM and Hugging Face use):
//!
//! 1. `logit_bias`: add each entry's bias to its token's logit.
//! 2. `repetition_penalty` (CTRL, Keskar et al. 2019): for every distinct id in the prompt or the
//!    generated tokens, `logit > 0 ? logit / p : logit * p`.
//! 3. `frequency_penalty`, `presence_penalty` (OpenAI): `logit -= f * count + p * (count > 0)`, with
//!    `count` the id's occurrences among the generated tokens only.
//! 4. Greedy (`temperature <= 0`, or `top_k == 1`): the argmax of these logits, lowest id on ties.
//!    Nothing below runs and no random number is used.
//! 5. `temperature`: probabilities `∝ exp((logit - max) / temperature)`.
//! 6. `top_k`: keep the `k` highest (ties: lower ids first).
//! 7. `top_p`: keep the smallest prefix of the remaining tokens, most likely first (ties: lower ids
//!    first), whose mass reaches `top_p` of the remaining mass.
//! 8. `min_p`: keep the tokens with probability `>= min_p *` the most likely one's.
//! 9. Renormalise, and draw by inverse CDF: with `u` the request's uniform number for this position,
//!    the first kept token in ascending id order whose cumulative probability exceeds `u`.
//!
//! With an allowed-token mask (structured output, [`Sampler::sample_masked`]), every token the mask
//! does not allow gets `-inf` after step 3, so steps 4-9 only ever see allowed tokens; without one
//! the steps run exactly as above (an unconstrained sequence is bitwise unaffected by the feature).
//!
//! NaN logits count as `-inf` (probability 0). Tokens whose weight underflows to 0 in step 5 are
//! never drawn. When the highest processed logit is not finite (all `-inf`, or a `+inf`), the result
//! is the greedy one.
//!
//! # Random stream
//!
//! The uniform number for generated token `n` (`n = generated.len()`, 0-based) is
//! [`uniform`]`(&`[`stream_key`]`(seed), n)`: a pure function of `(seed, n)` (ChaCha8, stream `n`).
//! The sampler keeps no random state, so a request resumed at any position, after a preemption or on
//! another worker, with a fresh `Sampler`, draws exactly what an uninterrupted run would have.
//!
//! # Logprobs
//!
//! [`SampledToken::logprob`] and [`SampledToken::top_logprobs`] come from the raw model distribution:
//! `log_softmax(logits)` of the logits as given, at temperature 1, before any of the steps above.
//! They describe what the model predicted, not the processed distribution the token was drawn from.
//!
//! # Cost per step
//!
//! No step allocates or sorts a vocabulary-sized array. With no bias and no penalty the logits are
//! read in place; otherwise they are copied once into a scratch buffer. Scratch buffers are per
//! thread (not per sequence), so a sampler's own memory is its config and penalty counts. Greedy is one
//! argmax; top-k keeps a running top list (a selection for `k > 256`); top-p finds its cut by a
//! weighted quickselect among the tokens above a weight threshold that already holds the wanted mass;
//! min-p and the draw are linear passes; top-logprobs keeps a running top-N. Penalty counts are kept
//! incrementally (see `penalties.rs`). Every step also computes one log-sum-exp over the vocabulary
//! for `logprob`. Exponentials use a vectorized f32 `exp` (relative error < 3e-7); sums are in f64,
//! in a fixed order, so results are deterministic.

mod mask;
mod math;
mod penalties;
mod rng;
#[cfg(test)]
mod tests;

use std::cell::RefCell;
use std::cmp::Ordering;

pub use mask::apply_mask;
pub use rng::{stream_key, uniform};
/// One request's sampling parameters and their range check: the `sampling-limits` crate's, the
/// shape the router's validation yields too. The engine checks them again
/// ([`SamplingConfig::validate`], [`SamplingConfig::check_vocab`]) because it does not trust its
/// callers.
pub use sampling_limits::{SamplingConfig, SamplingError};

use penalties::Penalties;

/// A sampled token with its log-probability and the most likely alternatives.
#[derive(Debug, Clone, PartialEq)]
pub struct SampledToken {
    /// The chosen token id.
    pub token_id: u32,
    /// `log_softmax(logits)[token_id]` of the raw logits (temperature 1, before bias, penalties and
    /// filters), in nats. `-inf` for a NaN or `-inf` logit.
    pub logprob: f32,
    /// The config's `top_logprobs` most likely `(token id, logprob)` of the same raw distribution (all
    /// of them when the vocabulary is smaller), most likely first, ties lower id first. Empty when
    /// `top_logprobs` is 0. The chosen token is not necessarily among them.
    pub top_logprobs: Vec<(u32, f32)>,
}

/// A sampler for one sequence: its config, the key of its counter-based random stream and cached
/// penalty counts.
///
/// Everything a draw depends on is `(config, seed, logits, prompt, generated)`: two samplers with the
/// same config and seed give the same token for the same arguments, whatever either sampled before.
#[derive(Debug, Clone)]
pub struct Sampler {
    config: SamplingConfig,
    seed: u64,
    key: [u8; 32],
    penalties: Penalties,
}

/// Per-step buffers, reused across steps and sequences (one set per thread).
#[derive(Debug, Default)]
struct Scratch {
    /// The processed logits (when bias or a penalty is on).
    work: Vec<f32>,
    /// Per-token weights (sampling without top-k); dropped tokens have weight 0.
    weights: Vec<f32>,
    /// Candidate `(id, score or weight)` pairs.
    cand: Vec<(u32, f32)>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Runs `f` with this thread's scratch buffers.
fn with_scratch<R>(f: impl FnOnce(&mut Scratch) -> R) -> R {
    SCRATCH.with(|scratch| match scratch.try_borrow_mut() {
        Ok(mut scratch) => f(&mut scratch),
        // Not reached (nothing here re-enters), but never panic over a buffer.
        Err(_) => f(&mut Scratch::default()),
    })
}

/// What [`Sampler::prepare`] decided.
enum Choice {
    /// This id, without a draw.
    Token(usize),
    /// Draw from `Scratch::cand` (ids ascending, unnormalised weights summing to `total`).
    Draw { total: f64 },
    /// Draw from `Scratch::weights` (every id, dropped ones at weight 0), summing to `total`.
    DrawAll { total: f64 },
}

impl Sampler {
    /// A sampler whose draws are fully determined by `seed` and the draw position. The config is used
    /// as is (see [`SamplingConfig::validate`]).
    pub fn new(config: SamplingConfig, seed: u64) -> Sampler {
        Sampler {
            config,
            seed,
            key: stream_key(seed),
            penalties: Penalties::default(),
        }
    }

    /// The sampling config.
    pub fn config(&self) -> &SamplingConfig {
        &self.config
    }

    /// The seed of the random stream.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Picks generated token number `generated.len()` from `logits` (`[vocab]`, f32, unnormalised), for
    /// a sequence with this `prompt` and these `generated` tokens so far (see the [module docs](self)
    /// for the steps, the random stream and the logprobs).
    ///
    /// Panics if `logits` is empty.
    pub fn sample(&mut self, logits: &[f32], prompt: &[u32], generated: &[u32]) -> SampledToken {
        self.sample_masked(logits, prompt, generated, None)
    }

    /// [`sample`](Self::sample) restricted to the tokens `allowed` allows: a bitset, token `i`
    /// allowed iff bit `i % 32` of `allowed[i / 32]` is set (ids past the words are not allowed).
    /// The logprobs stay those of the raw distribution. `None` is [`sample`](Self::sample).
    ///
    /// Panics if `logits` is empty.
    pub fn sample_masked(
        &mut self,
        logits: &[f32],
        prompt: &[u32],
        generated: &[u32],
        allowed: Option<&[u32]>,
    ) -> SampledToken {
        assert!(!logits.is_empty(), "sample: empty logits");
        let token_id = with_scratch(|scratch| {
            match self.prepare(scratch, logits, prompt, generated, allowed) {
                Choice::Token(id) => id,
                Choice::Draw { total } => {
                    let u = uniform(&self.key, generated.len() as u64);
                    pick(scratch.cand.iter().copied(), u * total)
                }
                Choice::DrawAll { total } => {
                    let u = uniform(&self.key, generated.len() as u64);
                    let weights = scratch.weights.iter().enumerate();
                    pick(weights.map(|(i, &w)| (i as u32, w)), u * total)
                }
            }
        });
        score_token(logits, token_id as u32, self.config.top_logprobs as usize)
    }

    /// The distribution [`sample`](Self::sample) would draw from for the same arguments: `(id,
    /// probability)` of every token it can pick, ids ascending, probabilities summing to 1. Greedy
    /// gives the one chosen token with probability 1.
    ///
    /// Panics if `logits` is empty.
    pub fn distribution(
        &mut self,
        logits: &[f32],
        prompt: &[u32],
        generated: &[u32],
    ) -> Vec<(u32, f64)> {
        assert!(!logits.is_empty(), "distribution: empty logits");
        with_scratch(
            |scratch| match self.prepare(scratch, logits, prompt, generated, None) {
                Choice::Token(id) => vec![(id as u32, 1.0)],
                Choice::Draw { total } => scratch
                    .cand
                    .iter()
                    .map(|&(id, w)| (id, w as f64 / total))
                    .collect(),
                Choice::DrawAll { total } => scratch
                    .weights
                    .iter()
                    .enumerate()
                    .filter(|(_, &w)| w > 0.0)
                    .map(|(i, &w)| (i as u32, w as f64 / total))
                    .collect(),
            },
        )
    }

    /// Steps 1-8 of the pipeline: a greedy token, or the kept tokens and their weights in `scratch`.
    fn prepare(
        &mut self,
        scratch: &mut Scratch,
        logits: &[f32],
        prompt: &[u32],
        generated: &[u32],
        allowed: Option<&[u32]>,
    ) -> Choice {
        let Sampler {
            config, penalties, ..
        } = self;
        let Scratch {
            work,
            weights,
            cand,
        } = scratch;
        let scores: &[f32] = if config.processes_logits() || allowed.is_some() {
            work.clear();
            work.extend_from_slice(logits);
            for &(id, bias) in &config.logit_bias {
                if let Some(v) = work.get_mut(id as usize) {
                    *v += bias;
                }
            }
            penalties.apply(config, work, prompt, generated);
            if let Some(allowed) = allowed {
                apply_mask(work, allowed);
            }
            work
        } else {
            logits
        };
        if config.is_greedy() {
            return Choice::Token(argmax(scores));
        }
        let max = max_ignoring_nan(scores);
        if !max.is_finite() {
            return Choice::Token(argmax(scores));
        }
        // Weights relative to the most likely token, which gets exactly 1.
        let t = config.temperature;
        let k = config.top_k as usize;
        let top_p = config.top_p as f64;
        let top_p_on = top_p > 0.0 && top_p < 1.0;
        // The most likely token keeps weight 1 through top-k and top-p, so this is min_p times its
        // probability.
        let min_p = (config.min_p > 0.0).then_some(config.min_p.min(1.0));
        if k > 0 && k < scores.len() {
            if k <= RUNNING_TOP_MAX {
                top_n_into(cand, scores, k);
            } else {
                cand.clear();
                cand.extend(
                    scores
                        .iter()
                        .enumerate()
                        .map(|(i, &s)| (i as u32, if s.is_nan() { f32::NEG_INFINITY } else { s })),
                );
                cand.select_nth_unstable_by(k - 1, by_value_desc);
                cand.truncate(k);
            }
            for c in cand.iter_mut() {
                c.1 = math::exp((c.1 - max) / t);
            }
            cand.retain(|c| c.1 > 0.0);
            if top_p_on {
                let total: f64 = cand.iter().map(|c| c.1 as f64).sum();
                nucleus_cut(cand, top_p * total);
            }
            if let Some(threshold) = min_p {
                cand.retain(|c| c.1 >= threshold);
            }
            cand.sort_unstable_by_key(|c| c.0);
            let total = cand.iter().map(|c| c.1 as f64).sum();
            return Choice::Draw { total };
        }
        // Without top-k: filter in place over the whole vocabulary, setting dropped weights to 0.
        math::exp_into(weights, scores, max, t);
        if top_p_on {
            let target = top_p * math::sum(weights);
            nucleus_candidates(cand, weights, target);
            nucleus_cut(cand, target);
            // The nucleus is the prefix of the order that ends at its last token `(last, w_last)`.
            let &(last, w_last) = cand
                .iter()
                .max_by(|a, b| by_value_desc(a, b))
                .expect("the nucleus holds the most likely token");
            for (id, w) in weights.iter_mut().enumerate() {
                if *w < w_last || (*w == w_last && id as u32 > last) {
                    *w = 0.0;
                }
            }
        }
        if let Some(threshold) = min_p {
            for w in weights.iter_mut() {
                if *w < threshold {
                    *w = 0.0;
                }
            }
        }
        Choice::DrawAll {
            total: math::sum(weights),
        }
    }
}

/// Largest `k` for which top-k keeps a running top list instead of selecting over a copy of the
/// vocabulary.
const RUNNING_TOP_MAX: usize = 256;

/// `(value desc, id asc)`: most likely first, ties to the lower id.
fn by_value_desc(a: &(u32, f32), b: &(u32, f32)) -> Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// Fills `cand` with the `(id, weight)` of every token whose weight is at or above a threshold whose
/// tokens hold at least `target` of the mass: a superset of the nucleus, usually small.
///
/// The tokens at or above any threshold form a prefix of the `(weight desc, id asc)` order, so when
/// they hold `target` the nucleus lies among them. The threshold starts at 1e-3 of the most likely
/// token's weight and drops by 1e-3 until it holds enough (then 0: every token with a weight).
fn nucleus_candidates(cand: &mut Vec<(u32, f32)>, weights: &[f32], target: f64) {
    let mut threshold = 1e-3f32;
    while threshold > 0.0 {
        let mass = math::sum_at_least(weights, threshold);
        if mass >= target {
            break;
        }
        threshold = if threshold < 1e-30 {
            0.0
        } else {
            threshold * 1e-3
        };
    }
    cand.clear();
    cand.extend(
        weights
            .iter()
            .enumerate()
            .filter(|(_, &w)| w > 0.0 && w >= threshold)
            .map(|(i, &w)| (i as u32, w)),
    );
}

/// Keeps (in no particular order) the smallest `(weight desc, id asc)` prefix of `cand` whose weight
/// reaches `target`, or all of `cand` when rounding never gets there: a weighted quickselect, expected
/// linear time, no full sort.
fn nucleus_cut(cand: &mut Vec<(u32, f32)>, target: f64) {
    // Invariant: cand[..lo] precede cand[lo..hi] in the order and hold `before` of the mass, less than
    // `target`; the cut lies in lo..hi.
    let (mut lo, mut hi, mut before) = (0, cand.len(), 0.0f64);
    while hi - lo > 32 {
        let mid = lo + (hi - lo) / 2;
        cand[lo..hi].select_nth_unstable_by(mid - lo, by_value_desc);
        let upper: f64 = cand[lo..=mid].iter().map(|c| c.1 as f64).sum();
        if before + upper >= target {
            hi = mid + 1;
        } else {
            before += upper;
            lo = mid + 1;
        }
    }
    cand[lo..hi].sort_unstable_by(by_value_desc);
    let mut mass = before;
    for i in lo..hi {
        mass += cand[i].1 as f64;
        if mass >= target {
            cand.truncate(i + 1);
            return;
        }
    }
    cand.truncate(hi);
}

/// Inverse CDF over `(id, weight)` in order: the first candidate whose cumulative weight exceeds `x`
/// (the last one with a positive weight when rounding leaves `x` at the end). A zero weight is never
/// picked.
fn pick(cand: impl Iterator<Item = (u32, f32)>, x: f64) -> usize {
    let mut acc = 0.0;
    let mut last = 0;
    for (id, w) in cand {
        if w > 0.0 {
            acc += w as f64;
            last = id as usize;
            if x < acc {
                return last;
            }
        }
    }
    last
}

/// The largest non-NaN value (`-inf` when there is none).
fn max_ignoring_nan(values: &[f32]) -> f32 {
    math::max(values)
}

/// Fills `out` with the `n` largest `(id, value)` of `values`, largest first, ties lower id first,
/// NaN as `-inf`: a running sorted list, one comparison for most entries.
fn top_n_into(out: &mut Vec<(u32, f32)>, values: &[f32], n: usize) {
    out.clear();
    if n == 0 {
        return;
    }
    for (i, &v) in values.iter().enumerate() {
        let v = if v.is_nan() { f32::NEG_INFINITY } else { v };
        // Later ids lose ties, so only a strictly greater value enters a full list.
        if out.len() == n && out[n - 1].1 >= v {
            continue;
        }
        let at = out.partition_point(|&(_, w)| w >= v);
        if out.len() == n {
            out.pop();
        }
        out.insert(at, (i as u32, v));
    }
}

/// `log_softmax` of raw logits: the max and the log of the normaliser, computed once per step.
struct RawDistribution {
    max: f32,
    /// `ln(sum(exp(v - max)))` over the non-NaN logits, in f64.
    log_z: f64,
}

impl RawDistribution {
    fn of(logits: &[f32]) -> Self {
        let max = max_ignoring_nan(logits);
        let log_z = if max.is_finite() {
            math::sum_exp(logits, max).ln()
        } else {
            0.0
        };
        RawDistribution { max, log_z }
    }

    /// `log p` of a token with raw logit `v`; NaN and `-inf` logits give `-inf`. When the max is not
    /// finite, the tokens equal to it get 0 and the others `-inf`.
    fn logprob(&self, v: f32) -> f32 {
        if v.is_nan() || v == f32::NEG_INFINITY {
            f32::NEG_INFINITY
        } else if !self.max.is_finite() {
            if v == self.max {
                0.0
            } else {
                f32::NEG_INFINITY
            }
        } else {
            ((v - self.max) as f64 - self.log_z) as f32
        }
    }

    /// The `n` most likely `(id, logprob)`, most likely first, ties lower id first (a running top-n,
    /// not a sort of the vocabulary).
    fn top(&self, logits: &[f32], n: usize) -> Vec<(u32, f32)> {
        let mut top = Vec::with_capacity(n);
        top_n_into(&mut top, logits, n);
        for t in &mut top {
            t.1 = self.logprob(t.1);
        }
        top
    }
}

/// Index of the largest logit; ties go to the lowest index, NaN is ignored (input with no value above
/// `-inf` gives 0).
pub fn argmax(logits: &[f32]) -> usize {
    let max = math::max(logits);
    if max == f32::NEG_INFINITY {
        return 0;
    }
    logits.iter().position(|&v| v == max).unwrap_or(0)
}

/// `token`'s log-probability under the raw distribution of `logits` (`[vocab]` f32, temperature 1)
/// and the `top_n` most likely `(id, logprob)` of it, most likely first, ties lower id first: what a
/// sampled token reports ([`Sampler::sample`] calls it) and what a prompt token reports (its
/// position's logits scored against the prompt's next token), so both are bitwise the same for the
/// same logits. Panics if `token` is outside `logits`.
pub fn score_token(logits: &[f32], token: u32, top_n: usize) -> SampledToken {
    let raw = RawDistribution::of(logits);
    SampledToken {
        token_id: token,
        logprob: raw.logprob(logits[token as usize]),
        top_logprobs: raw.top(logits, top_n),
    }
}

/// `log_softmax(logits)[i]`: `logits[i] - max - ln(sum(exp(logits - max)))`, NaN logits ignored in the
/// sum, the sum in f64.
pub fn log_softmax_at(logits: &[f32], i: usize) -> f32 {
    RawDistribution::of(logits).logprob(logits[i])
}
