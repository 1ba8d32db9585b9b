//! How long a draft should be: the measured costs of target steps and draft passes, and the choice
//! of `k` that maximizes the tokens a step commits per second.
//!
//! The gain of speculation is the expected-speedup analysis of Leviathan et al. (ICML 2023,
//! section 3.3): with each proposal accepted with probability `a` (a sequence's recent acceptance
//! rate), `k` proposals commit `(1 - a^(k+1)) / (1 - a)` tokens on average. Its price is measured
//! here, not assumed: a target step's time is fitted as a line in the tokens it runs (on a CPU a
//! step of one decode is bound by reading the weights, while 8 sequences times 6 positions are
//! bound by arithmetic, so verifying is not free), and a draft pass's time as a line in the
//! sequences it runs. Until a line has two distinct points it is taken as proportional to its
//! input (the pessimistic reading: verification costs as much per token as decoding), so a
//! worker speculates only where its own measurements say it pays.

/// A line `t = intercept + slope * x` fitted by least squares with exponential forgetting (each
/// new point weighs [`FIT_WEIGHT`]), both coefficients at least 0.
#[derive(Debug, Clone, Copy, Default)]
pub struct LinearFit {
    points: u32,
    mean_x: f64,
    mean_t: f64,
    mean_xx: f64,
    mean_xt: f64,
}

/// Weight of a new point in a [`LinearFit`].
pub const FIT_WEIGHT: f64 = 0.1;

impl LinearFit {
    /// Adds the point (`x`, `t`).
    pub fn observe(&mut self, x: f64, t: f64) {
        let w = if self.points == 0 { 1.0 } else { FIT_WEIGHT };
        let mix = |m: f64, v: f64| (1.0 - w) * m + w * v;
        self.mean_x = mix(self.mean_x, x);
        self.mean_t = mix(self.mean_t, t);
        self.mean_xx = mix(self.mean_xx, x * x);
        self.mean_xt = mix(self.mean_xt, x * t);
        self.points = self.points.saturating_add(1);
    }

    /// The fitted `t` at `x`; `None` before the first point.
    pub fn predict(&self, x: f64) -> Option<f64> {
        if self.points == 0 {
            return None;
        }
        let var = self.mean_xx - self.mean_x * self.mean_x;
        let proportional = self.mean_t / self.mean_x.max(f64::MIN_POSITIVE);
        if var <= 1e-6 * self.mean_x * self.mean_x {
            return Some(proportional * x);
        }
        let slope = ((self.mean_xt - self.mean_x * self.mean_t) / var).max(0.0);
        let intercept = self.mean_t - slope * self.mean_x;
        Some(match intercept < 0.0 {
            true => proportional * x,
            false => intercept + slope * x,
        })
    }
}

/// The costs a draft-model worker has measured.
#[derive(Debug, Clone, Copy, Default)]
pub struct DraftCosts {
    /// Seconds of a target step of decodes only, by the tokens it runs (decodes plus proposals).
    pub step: LinearFit,
    /// Seconds of a draft pass of one token per sequence, by the sequences it runs.
    pub pass: LinearFit,
}

/// Expected tokens committed by a sequence that proposes `k` tokens, each accepted with
/// probability `a`: `1 + a + ... + a^k`.
fn expected_tokens(a: f64, k: usize) -> f64 {
    let a = a.clamp(0.0, 0.999);
    (0..=k).map(|i| a.powi(i as i32)).sum()
}

/// The draft length for a decode step of `plain` sequences that do not speculate and the
/// `speculating` ones, each (recent acceptance rate, most tokens it may propose): the `k` (each
/// sequence proposing `min(k, its cap)`) that maximizes expected committed tokens per second
/// under `costs`; 0 when no `k` beats plain decoding. Before any target step was measured, the
/// largest cap (the first step measures).
pub fn best_draft_length(speculating: &[(f64, usize)], plain: usize, costs: &DraftCosts) -> usize {
    let most = speculating.iter().map(|&(_, cap)| cap).max().unwrap_or(0);
    let step = |tokens: usize| costs.step.predict(tokens as f64);
    let Some(plain_secs) = step(plain + speculating.len()) else {
        return most;
    };
    let mut best = (0, (plain + speculating.len()) as f64 / plain_secs.max(1e-9));
    for k in 1..=most {
        let drafting = speculating.iter().filter(|&&(_, cap)| cap > 0).count();
        let proposals: usize = speculating.iter().map(|&(_, cap)| cap.min(k)).sum();
        let tokens: f64 = plain as f64
            + speculating
                .iter()
                .map(|&(a, cap)| expected_tokens(a, cap.min(k)))
                .sum::<f64>();
        let step_secs = step(plain + speculating.len() + proposals).unwrap_or(plain_secs);
        let pass_secs = costs.pass.predict(drafting as f64).unwrap_or(0.0);
        let rate = tokens / (step_secs + k as f64 * pass_secs).max(1e-9);
        if rate > best.1 * (1.0 + 1e-9) {
            best = (k, rate);
        }
    }
    best.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn costs(step: &[(f64, f64)], pass: &[(f64, f64)]) -> DraftCosts {
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
    fn a_fit_recovers_a_line_and_falls_back_to_proportional() {
        let mut f = LinearFit::default();
        assert_eq!(f.predict(3.0), None);
        f.observe(2.0, 4.0);
        assert_eq!(f.predict(3.0), Some(6.0), "one point: proportional");
        for _ in 0..50 {
            f.observe(1.0, 10.5);
            f.observe(9.0, 14.5);
        }
        let at = f.predict(5.0).unwrap();
        assert!((at - 12.5).abs() < 0.3, "{at}");
    }

    #[test]
    fn the_draft_length_follows_the_measured_costs() {
        // Memory-bound target (10 ms a step, +0.1 ms a token), draft pass 2 ms: one stream that
        // is accepted 80 % of the time drafts long (4: 3.36 tokens in 18.4 ms beats 3.69 in 20.5).
        let memory_bound = costs(&[(1.0, 10.0), (6.0, 10.5)], &[(1.0, 2.0)]);
        assert_eq!(best_draft_length(&[(0.8, 5)], 0, &memory_bound), 4);
        assert_eq!(best_draft_length(&[(0.95, 5)], 0, &memory_bound), 5);
        // Nothing accepted: no speculation.
        assert_eq!(best_draft_length(&[(0.0, 5)], 0, &memory_bound), 0);
        // Compute-bound target (each token costs as much as the step): 8 streams never pay.
        let compute_bound = costs(&[(8.0, 16.0), (48.0, 96.0)], &[(8.0, 4.0)]);
        assert_eq!(best_draft_length(&[(0.9, 5); 8], 0, &compute_bound), 0);
        // A draft pass as costly as a target step: no speculation even at 99 %.
        let costly = costs(&[(1.0, 10.0), (6.0, 10.5)], &[(1.0, 10.0)]);
        assert_eq!(best_draft_length(&[(0.99, 5)], 0, &costly), 0);
        // Nothing measured: the first step speculates fully (and measures).
        assert_eq!(best_draft_length(&[(0.5, 3)], 1, &DraftCosts::default()), 3);
        // One point of the target (proportional): verification looks as costly as decoding.
        let one_point = costs(&[(1.0, 10.0)], &[(1.0, 1.0)]);
        assert_eq!(best_draft_length(&[(0.9, 5)], 0, &one_point), 0);
    }
}
