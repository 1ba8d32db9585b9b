//! How long a draft should be: the measured costs of target steps and draft passes, and the choice
//! of `k` that maximizes the tokens a step commits per second. "Draft" means the proposals of
//! either proposer: the n-gram lookup (whose proposals cost no pass) and the draft model.
//!
//! The gain of speculation is the expected-speedup analysis of Leviathan et al. (ICML 2023,
//! section 3.3): with each proposal accepted with probability `a` (a sequence's recent acceptance
//! rate), `k` proposals commit `(1 - a^(k+1)) / (1 - a)` tokens on average. Its price is measured
//! here, not assumed: a target step's time is kept as a [`CostCurve`] by the tokens it runs (on a
//! CPU a step of one decode is bound by reading the weights, while 8 sequences times 6 positions
//! are bound by arithmetic, so verifying is not free), and a draft pass's time by the sequences it
//! runs. Where the curve cannot say what a step costs, the step explores: a plain step first, then
//! (a single measured size saying nothing of growth) one that proposes the most it may. Otherwise a worker speculates only
//! where its own measurements say it pays, and by at least [`MIN_GAIN`]: a predicted gain smaller
//! than the measurements' noise could be a loss.
//!
//! A target step's time runs from the forward pass to the end of the sampling of every verified
//! position (each position is sampled, accepted or not), so the sampler's part of verification is
//! in the price.

/// Measured seconds by size (a step's tokens, a pass's sequences): a mean per size (exponential
/// moving average, each new point weighing [`CURVE_WEIGHT`], clipped to within a factor 2 of the
/// size's mean so that one stalled step moves it little), and between and beyond the measured
/// sizes a piecewise line through them. Sizes are kept apart so that many steps of one size never
/// wash out what the others cost (a single-stream worker decodes far more plain steps than it
/// verifies drafts).
#[derive(Debug, Clone, Default)]
pub struct CostCurve {
    /// `means[x]`: the mean seconds at size `x`, `None` where never measured.
    means: Vec<Option<f64>>,
}

/// Weight of a new point in a [`CostCurve`]'s mean at its size.
pub const CURVE_WEIGHT: f64 = 0.1;

/// Largest size a [`CostCurve`] keeps (larger points are not recorded).
pub const CURVE_SIZES: usize = 256;

impl CostCurve {
    /// Adds a measurement of `secs` seconds at size `x` (ignored when `x` is 0 or above
    /// [`CURVE_SIZES`]).
    pub fn observe(&mut self, x: usize, secs: f64) {
        if x == 0 || x > CURVE_SIZES || !secs.is_finite() || secs <= 0.0 {
            return;
        }
        if self.means.len() <= x {
            self.means.resize(x + 1, None);
        }
        self.means[x] = Some(match self.means[x] {
            None => secs,
            Some(m) => (1.0 - CURVE_WEIGHT) * m + CURVE_WEIGHT * secs.clamp(0.5 * m, 2.0 * m),
        });
    }

    /// The predicted seconds at size `x`: the mean there, else the line through the nearest
    /// measured sizes on either side, else (above the measured range) the line through the two
    /// largest measured sizes (never falling with size). `None` below the smallest measured size
    /// (nothing says what a smaller step saves), and when fewer than two sizes were measured and
    /// `x` is not one of them (nothing says how cost grows).
    pub fn predict(&self, x: usize) -> Option<f64> {
        if let Some(Some(m)) = self.means.get(x) {
            return Some(*m);
        }
        let known = self.known();
        if known.len() < 2 || x < known[0].0 {
            return None;
        }
        let after = known.iter().position(|&(i, _)| i > x);
        let (a, b) = match after {
            Some(j) => (known[j - 1], known[j]),
            None => (known[known.len() - 2], known[known.len() - 1]),
        };
        let slope = ((b.1 - a.1) / (b.0 - a.0) as f64).max(0.0);
        let anchor = if x > b.0 { b } else { a };
        Some(anchor.1 + slope * (x as f64 - anchor.0 as f64))
    }

    /// The largest mean measured at a size of at most `x`: a lower bound of the cost at `x` where
    /// [`CostCurve::predict`] has none (cost does not fall with size); `None` when no such size
    /// was measured.
    pub fn floor(&self, x: usize) -> Option<f64> {
        self.known()
            .into_iter()
            .filter(|&(i, _)| i <= x)
            .map(|(_, m)| m)
            .reduce(f64::max)
    }

    /// The measured sizes and their means, smallest first.
    fn known(&self) -> Vec<(usize, f64)> {
        self.means
            .iter()
            .enumerate()
            .filter_map(|(i, m)| m.map(|m| (i, m)))
            .collect()
    }
}

/// The costs a speculating worker has measured.
#[derive(Debug, Clone, Default)]
pub struct DraftCosts {
    /// Seconds of a target step of decodes only, by the tokens it runs (decodes plus proposals).
    pub step: CostCurve,
    /// Seconds of a draft-model pass of one token per sequence, by the sequences it runs (no
    /// points with the n-gram proposer: its proposals cost no pass).
    pub pass: CostCurve,
    /// Seconds per committed token a draft model catches up over (its first pass of a step, run
    /// over the tokens it has not seen: a prefill), a moving average; `None` before the first.
    pub catch_up_per_token: Option<f64>,
    /// The proposer's per-token acceptance over all sequences, as decayed sums (accepted,
    /// trials) of [`token_trials`]: the rate a sequence is assumed to have before its own
    /// first verification.
    pub acceptance: (f64, f64),
    /// Decode steps planned since one last proposed anything of the proposer's.
    pub steps_since_speculation: u64,
}

/// Decay per verification of [`DraftCosts::acceptance`] (a memory of about 20 verifications).
pub const PRIOR_DECAY: f64 = 0.95;

/// Most a probe's draft-model catch-up may cost, as a share of the time since the worker last
/// speculated: a probe catches up over every token its sequence decoded since the draft last ran,
/// so where that is costly (a draft prefilling at a quarter of a decode step per token) probes
/// come only as rarely as keeps their price within this share.
pub const PROBE_CATCH_UP_SHARE: f64 = 0.05;

impl DraftCosts {
    /// Records a verification's [`token_trials`] in the worker-wide acceptance.
    pub fn observe_acceptance(&mut self, proposed: usize, forced: usize, accepted: usize) {
        if let Some((accepted, trials)) = token_trials(proposed, forced, accepted) {
            let (acc, all) = self.acceptance;
            self.acceptance = (PRIOR_DECAY * acc + accepted, PRIOR_DECAY * all + trials);
        }
    }

    /// The worker's recent per-token acceptance over all sequences; 1 before any verification
    /// (a new worker starts optimistic and measures).
    pub fn prior_acceptance(&self) -> f64 {
        let (acc, trials) = self.acceptance;
        if trials <= 0.0 {
            1.0
        } else {
            acc / trials
        }
    }

    /// Whether a sequence whose draft model is `backlog` tokens behind may probe, when a plain
    /// step takes `plain_secs`: the catch-up at the measured cost per token must be at most
    /// [`PROBE_CATCH_UP_SHARE`] of the steps since the worker last speculated (true before the
    /// catch-up cost was measured).
    pub fn probe_catch_up_pays(&self, backlog: usize, plain_secs: f64) -> bool {
        let since = self.steps_since_speculation.max(1) as f64 * plain_secs;
        self.catch_up_per_token
            .is_none_or(|per_token| backlog as f64 * per_token <= PROBE_CATCH_UP_SHARE * since)
    }

    /// Records a draft pass that caught up over `tokens` tokens in `secs` seconds.
    pub fn observe_catch_up(&mut self, tokens: usize, secs: f64) {
        if tokens == 0 || !secs.is_finite() || secs <= 0.0 {
            return;
        }
        let per_token = secs / tokens as f64;
        self.catch_up_per_token = Some(match self.catch_up_per_token {
            None => per_token,
            Some(m) => (1.0 - CURVE_WEIGHT) * m + CURVE_WEIGHT * per_token.clamp(0.5 * m, 2.0 * m),
        });
    }
}

/// What a verification of `proposed` tokens, the first `forced` of them forced, the first
/// `accepted` accepted, says of the proposer's per-token acceptance: (accepted, trials), where
/// the trials are the proposer's accepted tokens plus one rejection when the verification stopped
/// at one; `None` when the proposer proposed nothing.
pub fn token_trials(proposed: usize, forced: usize, accepted: usize) -> Option<(f64, f64)> {
    let proposer_proposed = proposed.saturating_sub(forced);
    (proposer_proposed > 0).then(|| {
        let proposer_accepted = accepted.saturating_sub(forced);
        let rejected = usize::from(proposer_accepted < proposer_proposed);
        (
            proposer_accepted as f64,
            (proposer_accepted + rejected) as f64,
        )
    })
}

/// Most committed tokens ahead over which a draft model's catch-up is weighed against what
/// speculating would save ([`catch_up_pays`]): a request's `max_new_tokens` is only a bound on
/// its length, so a longer horizon would credit savings that an early stop never delivers.
pub const CATCH_UP_HORIZON: usize = 256;

/// Whether a draft model should catch up over `backlog` committed tokens it has not seen, for a
/// sequence that may generate `tokens_left` more, when the step's [`DraftChoice`] is `choice`: the
/// catch-up (`backlog` times [`DraftCosts::catch_up_per_token`]; free before it was measured)
/// must cost less than speculating saves over the next `min(tokens_left, CATCH_UP_HORIZON)`
/// tokens (each saves a plain step's time times `1 - 1 / gain`). A catch-up blocks the whole
/// step, so it is weighed against the batch's time.
pub fn catch_up_pays(
    backlog: usize,
    tokens_left: usize,
    choice: &DraftChoice,
    costs: &DraftCosts,
) -> bool {
    let Some(per_token) = costs.catch_up_per_token else {
        return true;
    };
    let horizon = tokens_left.min(CATCH_UP_HORIZON) as f64;
    let saving = horizon * choice.plain_secs * (1.0 - 1.0 / choice.gain.max(1.0));
    backlog as f64 * per_token <= saving
}

/// Idle steps (steps in which a sequence proposed nothing of the proposer's, its expected gain not
/// paying) after which it probes: it proposes up to two tokens again, so that a change in its
/// acceptance rate (or, from a draft model's second, catch-up-free pass, in the draft's cost) is
/// seen. Each probe after which speculation still does not pay doubles the sequence's interval,
/// up to [`REMEASURE_AFTER_STEPS`], so probes that keep failing cost little.
pub const PROBE_AFTER_STEPS: u32 = 8;

/// The longest probe interval, and the interval when the draft costs so much that not even a
/// draft that is always right would pay: the probe then only re-measures that cost (a draft
/// model's catch-up over the tokens it missed is the probe's price).
pub const REMEASURE_AFTER_STEPS: u32 = 256;

/// Least predicted gain in committed tokens per second, over plain decoding, for which a step
/// speculates (1.05: at least 5 % faster).
pub const MIN_GAIN: f64 = 1.05;

/// Expected tokens committed by a sequence that proposes `k` tokens, each accepted with
/// probability `a`: `1 + a + ... + a^k`.
fn expected_tokens(a: f64, k: usize) -> f64 {
    let a = a.clamp(0.0, 0.999);
    (0..=k).map(|i| a.powi(i as i32)).sum()
}

/// A step's choice of draft length, and what the cost model expects of it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DraftChoice {
    /// Proposals per sequence (each proposes `min(k, its cap)`).
    pub k: usize,
    /// Predicted seconds of the step without speculation (0 when unknown).
    pub plain_secs: f64,
    /// Predicted committed tokens per second at `k` over those without speculation (1 at `k` = 0
    /// or when the costs are unknown and the step explores).
    pub gain: f64,
    /// The costs could not predict the step: it explores (`k` is 0 to measure plain decoding, or
    /// the largest cap to measure a verification).
    pub explore: bool,
}

/// The draft length for a decode step of `plain` sequences that do not speculate and the
/// `speculating` ones, each (recent acceptance rate, most tokens it may propose): the `k` (each
/// sequence proposing `min(k, its cap)`) that maximizes expected committed tokens per second
/// under `costs`; 0 when no `k` beats plain decoding by [`MIN_GAIN`]. Where the step curve cannot
/// predict a step's cost (see [`CostCurve::predict`]) the step explores: 0 when it is plain
/// decoding's cost that is unknown, else the largest cap (that step measures it).
pub fn best_draft_length(speculating: &[(f64, usize)], plain: usize, costs: &DraftCosts) -> usize {
    choose_draft_length(speculating, plain, 0, costs).k
}

/// [`best_draft_length`] with the step's predicted plain time and gain, for a step that also
/// verifies `fixed` tokens whatever `k` is (tokens a constraint forces).
pub fn choose_draft_length(
    speculating: &[(f64, usize)],
    plain: usize,
    fixed: usize,
    costs: &DraftCosts,
) -> DraftChoice {
    let most = speculating.iter().map(|&(_, cap)| cap).max().unwrap_or(0);
    let explore = |k, plain_secs| DraftChoice {
        k,
        plain_secs,
        gain: 1.0,
        explore: true,
    };
    let step = |tokens: usize| costs.step.predict(fixed + tokens);
    let Some(plain_secs) = step(plain + speculating.len()) else {
        return explore(0, 0.0);
    };
    let plain_rate = (plain + speculating.len()) as f64 / plain_secs.max(1e-9);
    let mut best = (0, plain_rate * MIN_GAIN);
    for k in 1..=most {
        let drafting = speculating.iter().filter(|&&(_, cap)| cap > 0).count();
        let proposals: usize = speculating.iter().map(|&(_, cap)| cap.min(k)).sum();
        let tokens: f64 = plain as f64
            + speculating
                .iter()
                .map(|&(a, cap)| expected_tokens(a, cap.min(k)))
                .sum::<f64>();
        let Some(step_secs) = step(plain + speculating.len() + proposals) else {
            return explore(most, plain_secs);
        };
        // A measured larger step never costs less than a plain one (a stale mean may say so).
        let step_secs = step_secs.max(plain_secs);
        // An unmeasured pass size costs at least the largest smaller one measured.
        let pass_secs = costs
            .pass
            .predict(drafting)
            .or_else(|| costs.pass.floor(drafting))
            .unwrap_or(0.0);
        let rate = tokens / (step_secs + k as f64 * pass_secs).max(1e-9);
        if rate > best.1 * (1.0 + 1e-9) {
            best = (k, rate);
        }
    }
    DraftChoice {
        k: best.0,
        plain_secs,
        gain: if best.0 == 0 {
            1.0
        } else {
            best.1 / plain_rate
        },
        explore: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn costs(step: &[(usize, f64)], pass: &[(usize, f64)]) -> DraftCosts {
        let mut c = DraftCosts::default();
        for &(x, t) in step {
            c.step.observe(x, t);
        }
        for &(x, t) in pass {
            c.pass.observe(x, t);
        }
        c
    }

    #[test]
    fn a_curve_interpolates_between_sizes_and_keeps_them_apart() {
        let mut c = CostCurve::default();
        assert_eq!(c.predict(3), None);
        c.observe(1, 10.0);
        assert_eq!(c.predict(1), Some(10.0));
        assert_eq!(c.predict(3), None, "one size says nothing of growth");
        c.observe(5, 14.0);
        assert_eq!(c.predict(3), Some(12.0), "between: the line");
        assert_eq!(c.predict(9), Some(18.0), "beyond: the last two sizes' line");
        assert_eq!(c.floor(9), Some(14.0));
        assert_eq!(c.floor(4), Some(10.0));
        assert_eq!(c.floor(0), None);
        // Thousands of plain steps do not wash out what a larger step costs.
        for _ in 0..5000 {
            c.observe(1, 10.0);
        }
        assert_eq!(c.predict(5), Some(14.0));
        // One stalled step moves a mean by at most 10 % (clipped to twice the mean).
        c.observe(1, 1000.0);
        assert!((c.predict(1).unwrap() - 11.0).abs() < 1e-9);
        // Extrapolated cost never falls with size; nothing is predicted below the smallest size;
        // sizes past the curve's range, size 0 and times of 0 are not kept.
        let mut d = CostCurve::default();
        d.observe(2, 10.0);
        d.observe(4, 8.0);
        assert_eq!(d.predict(8), Some(8.0));
        assert_eq!(d.predict(1), None);
        d.observe(CURVE_SIZES + 1, 1.0);
        d.observe(0, 1.0);
        d.observe(6, 0.0);
        assert_eq!(d.predict(CURVE_SIZES + 1), Some(8.0));
        assert_eq!(d.predict(6), Some(8.0));
    }

    #[test]
    fn the_draft_length_follows_the_measured_costs() {
        // Memory-bound target (10 ms a step, +0.1 ms a token), draft pass 2 ms: one stream that
        // is accepted 80 % of the time drafts long (4: 3.36 tokens in 18.4 ms beats 3.69 in 20.5).
        let memory_bound = costs(&[(1, 10.0), (6, 10.5)], &[(1, 2.0)]);
        assert_eq!(best_draft_length(&[(0.8, 5)], 0, &memory_bound), 4);
        assert_eq!(best_draft_length(&[(0.95, 5)], 0, &memory_bound), 5);
        // Nothing accepted: no speculation.
        assert_eq!(best_draft_length(&[(0.0, 5)], 0, &memory_bound), 0);
        // A gain under MIN_GAIN: no speculation (one token at 4 %: 1.04 tokens in 12.1 ms).
        assert_eq!(best_draft_length(&[(0.04, 5)], 0, &memory_bound), 0);
        // Compute-bound target (each token costs as much as the step): 8 streams never pay.
        let compute_bound = costs(&[(8, 16.0), (48, 96.0)], &[(8, 4.0)]);
        assert_eq!(best_draft_length(&[(0.9, 5); 8], 0, &compute_bound), 0);
        // A draft pass as costly as a target step: no speculation even at 99 %.
        let costly = costs(&[(1, 10.0), (6, 10.5)], &[(1, 10.0)]);
        assert_eq!(best_draft_length(&[(0.99, 5)], 0, &costly), 0);
        // Nothing measured: the first step measures plain decoding.
        assert_eq!(best_draft_length(&[(0.5, 3)], 1, &DraftCosts::default()), 0);
        // Only plain steps measured: nothing says what verification costs, so the step explores.
        let one_size = costs(&[(1, 10.0)], &[(1, 1.0)]);
        assert_eq!(best_draft_length(&[(0.9, 5)], 0, &one_size), 5);
        // A stale mean of a verification size below the plain step's does not make speculation
        // look free: at 0 % acceptance nothing pays.
        let stale = costs(&[(1, 10.0), (3, 9.0), (6, 9.5)], &[]);
        assert_eq!(best_draft_length(&[(0.0, 5)], 0, &stale), 0);
        // Two streams when only one-stream passes were measured: each pass costs at least that.
        let one_pass = costs(&[(1, 10.0), (2, 10.2), (12, 11.0)], &[(1, 10.0)]);
        assert_eq!(best_draft_length(&[(0.8, 5), (0.8, 5)], 0, &one_pass), 0);
    }

    #[test]
    fn the_worker_wide_acceptance_is_a_new_sequences_prior() {
        let mut c = DraftCosts::default();
        assert_eq!(c.prior_acceptance(), 1.0, "optimistic before any");
        // 1 of 5 accepted (a rejection at the second), then all 4 of 4 after 2 forced tokens.
        c.observe_acceptance(5, 0, 1);
        assert_eq!(c.prior_acceptance(), 0.5);
        c.observe_acceptance(6, 2, 6);
        let (acc, trials) = (0.95 * 1.0 + 4.0, 0.95 * 2.0 + 4.0);
        assert!((c.prior_acceptance() - acc / trials).abs() < 1e-12);
        // Forced tokens alone say nothing.
        c.observe_acceptance(3, 3, 3);
        assert!((c.prior_acceptance() - acc / trials).abs() < 1e-12);
        let mut s = crate::speculation::SequenceSpeculation::new(true);
        assert_eq!(s.token_acceptance_rate(0.3), 0.3);
        s.record(4, 0, 4);
        assert_eq!(s.token_acceptance_rate(0.3), 1.0);
    }

    #[test]
    fn a_probe_catches_up_within_a_share_of_the_time_since_the_last() {
        let mut c = DraftCosts::default();
        assert!(c.probe_catch_up_pays(1000, 0.010), "unmeasured");
        // 0.4 ms a token, 10 ms steps, 100 steps since the worker speculated (50 ms at 5 %).
        c.observe_catch_up(10, 0.004);
        c.steps_since_speculation = 100;
        assert!(c.probe_catch_up_pays(100, 0.010), "40 ms");
        assert!(!c.probe_catch_up_pays(200, 0.010), "80 ms");
        // 1.7 ms a token, as SmolLM2 Q4_0 on AVX2: a sequence as far behind as the time since
        // the worker last speculated never probes.
        let mut c = DraftCosts::default();
        c.observe_catch_up(10, 0.017);
        c.steps_since_speculation = 300;
        assert!(!c.probe_catch_up_pays(300, 0.011));
        assert!(
            c.probe_catch_up_pays(90, 0.011),
            "a new sequence after a long idle time"
        );
    }

    #[test]
    fn a_catch_up_must_pay_for_itself_within_the_horizon() {
        // 10 ms steps, speculation 1.25x faster: each token ahead saves 2 ms.
        let choice = DraftChoice {
            k: 3,
            plain_secs: 0.010,
            gain: 1.25,
            explore: false,
        };
        let mut c = DraftCosts::default();
        assert!(catch_up_pays(1500, 10, &choice, &c), "unmeasured: free");
        c.observe_catch_up(100, 0.1); // 1 ms a token
        assert!(
            catch_up_pays(40, 100, &choice, &c),
            "40 ms for 200 ms saved"
        );
        assert!(
            !catch_up_pays(1500, 100, &choice, &c),
            "1.5 s for 200 ms saved"
        );
        assert!(
            !catch_up_pays(1500, 100_000, &choice, &c),
            "the horizon caps the saving at 256 tokens: 512 ms"
        );
        assert!(catch_up_pays(500, 100_000, &choice, &c));
        let no_gain = DraftChoice {
            gain: 1.0,
            ..choice
        };
        assert!(!catch_up_pays(1, 100, &no_gain, &c));
        assert!(catch_up_pays(0, 100, &no_gain, &c));
    }
}
