//! The quality metrics of `bench quality`, over the scored positions of a text: perplexity of each
//! numerics setting, KL divergence of the candidate's next-token distributions against the
//! baseline's, and top-1 agreement.
//!
//! Definitions (natural logarithms throughout, computed in f64 from the f32 logits):
//!
//! - log-softmax of a logits row `x`: `lp_i = x_i - lse(x)`, `lse(x) = m + ln sum_i exp(x_i - m)`
//!   with `m = max_i x_i`;
//! - negative log-likelihood of a position whose next text token is `t`: `-lp_t`;
//! - perplexity: `exp(mean NLL)` over all scored positions (the standard definition, as
//!   llama.cpp's `llama-perplexity` and Hugging Face's evaluation guide use it);
//! - KL divergence of the candidate `Q` from the baseline `P` at one position:
//!   `KL(P || Q) = sum_i p_i (lp_i - lq_i)`, computed as
//!   `sum_i p_i (x_i - y_i) + (lse(y) - lse(x)) sum_i p_i` (so equal logits give exactly 0); a
//!   rounding residue below 0 is reported as 0;
//! - top-1 agreement: the share of positions where both settings' largest logit is the same token
//!   ([`engine::sampler::argmax`], ties to the lower id, as greedy decoding picks).

use serde::Serialize;

use crate::bench::stats::percentile;
use engine::sampler::argmax;

/// `lse(x) = ln sum_i exp(x_i)` of a logits row, in f64, and the row's maximum. Returns
/// `(lse, max)`; an empty row gives `(-inf, -inf)`.
pub fn log_sum_exp(row: &[f32]) -> (f64, f64) {
    let max = row
        .iter()
        .fold(f64::NEG_INFINITY, |m, &v| m.max(f64::from(v)));
    if max == f64::NEG_INFINITY {
        return (f64::NEG_INFINITY, max);
    }
    let sum: f64 = row.iter().map(|&v| (f64::from(v) - max).exp()).sum();
    (max + sum.ln(), max)
}

/// Negative log-likelihood (nats) of token `target` under the softmax of `row`.
///
/// Panics if `target` is outside `row`.
pub fn nll(row: &[f32], target: u32) -> f64 {
    log_sum_exp(row).0 - f64::from(row[target as usize])
}

/// `KL(P || Q)` in nats, `P` the softmax of `baseline`, `Q` the softmax of `candidate` (see the
/// module docs for the formula); at least 0.
///
/// Panics if the rows differ in length.
pub fn kl_divergence(baseline: &[f32], candidate: &[f32]) -> f64 {
    compare(baseline, candidate).kl
}

/// One position's two rows compared: each setting's `lse` and the KL divergence.
struct Compared {
    lse_baseline: f64,
    lse_candidate: f64,
    kl: f64,
}

/// [`log_sum_exp`] of both rows and [`kl_divergence`], with one `exp` per element and row: the
/// baseline's `exp(x_i - max)` serve both its sum and the KL's weights.
fn compare(baseline: &[f32], candidate: &[f32]) -> Compared {
    assert_eq!(
        baseline.len(),
        candidate.len(),
        "kl_divergence: row lengths"
    );
    let max_p = baseline
        .iter()
        .fold(f64::NEG_INFINITY, |m, &v| m.max(f64::from(v)));
    let (lse_q, _) = log_sum_exp(candidate);
    let (mut weighted_diff, mut mass) = (0.0f64, 0.0f64);
    for (&x, &y) in baseline.iter().zip(candidate) {
        let p = (f64::from(x) - max_p).exp();
        weighted_diff += p * (f64::from(x) - f64::from(y));
        mass += p;
    }
    let lse_p = max_p + mass.ln();
    // The `p` above are `exp(x_i - max)`: divide by their sum to normalise.
    let kl = weighted_diff / mass + (lse_q - lse_p);
    Compared {
        lse_baseline: lse_p,
        lse_candidate: lse_q,
        kl: kl.max(0.0),
    }
}

/// The per-position measurements of a text, added position by position ([`QualityTally::add`]
/// from two logits rows, or [`QualityTally::add_scores`] from what a server reports).
#[derive(Debug, Clone, Default)]
pub struct QualityTally {
    scored: usize,
    nll_baseline: f64,
    nll_candidate: f64,
    kl: Vec<f64>,
    top1_agree: usize,
}

impl QualityTally {
    /// An empty tally.
    pub fn new() -> QualityTally {
        QualityTally::default()
    }

    /// Scores one position: the baseline's and the candidate's logits rows (`[vocab]` each) and
    /// the text's next token `target`.
    ///
    /// Panics if the rows differ in length or `target` is outside them.
    pub fn add(&mut self, baseline: &[f32], candidate: &[f32], target: u32) {
        let c = compare(baseline, candidate);
        let t = target as usize;
        self.add_scores(
            c.lse_baseline - f64::from(baseline[t]),
            c.lse_candidate - f64::from(candidate[t]),
            Some(c.kl),
            argmax(baseline) == argmax(candidate),
        );
    }

    /// Scores one position from its measurements: each setting's negative log-likelihood (nats)
    /// of the text's next token, the KL divergence when known (`None` where only each side's
    /// top tokens are known, e.g. through an API; then the summary has no KL), and whether both
    /// settings' most likely token is the same.
    pub fn add_scores(
        &mut self,
        nll_baseline: f64,
        nll_candidate: f64,
        kl: Option<f64>,
        top1_agree: bool,
    ) {
        self.scored += 1;
        self.nll_baseline += nll_baseline;
        self.nll_candidate += nll_candidate;
        self.kl.extend(kl);
        self.top1_agree += usize::from(top1_agree);
    }

    /// Positions scored so far.
    pub fn scored(&self) -> usize {
        self.scored
    }

    /// The summary of the positions scored so far (`None` when there are none). The KL figures
    /// are `None` unless every position had its KL.
    pub fn summary(&self) -> Option<QualitySummary> {
        let n = self.scored();
        if n == 0 {
            return None;
        }
        let mut kl = self.kl.clone();
        kl.sort_by(f64::total_cmp);
        let kl_known = kl.len() == n;
        let mean_nll_baseline = self.nll_baseline / n as f64;
        let mean_nll_candidate = self.nll_candidate / n as f64;
        let ppl_baseline = mean_nll_baseline.exp();
        let ppl_candidate = mean_nll_candidate.exp();
        Some(QualitySummary {
            scored: n,
            mean_nll_baseline,
            mean_nll_candidate,
            perplexity_baseline: ppl_baseline,
            perplexity_candidate: ppl_candidate,
            perplexity_change_pct: (ppl_candidate / ppl_baseline - 1.0) * 100.0,
            kl_mean: kl_known.then(|| kl.iter().sum::<f64>() / n as f64),
            kl_p99: kl_known.then(|| percentile(&kl, 99.0).unwrap_or(0.0)),
            kl_max: kl_known.then(|| kl[n - 1]),
            top1_agree: self.top1_agree,
            top1_agreement: self.top1_agree as f64 / n as f64,
        })
    }
}

/// What a text's scored positions give (see the module docs for the definitions).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct QualitySummary {
    /// Positions scored.
    pub scored: usize,
    /// Mean negative log-likelihood of the baseline, nats per token.
    pub mean_nll_baseline: f64,
    /// Mean negative log-likelihood of the candidate, nats per token.
    pub mean_nll_candidate: f64,
    /// Perplexity of the baseline: `exp(mean_nll_baseline)`.
    pub perplexity_baseline: f64,
    /// Perplexity of the candidate.
    pub perplexity_candidate: f64,
    /// `(perplexity_candidate / perplexity_baseline - 1) * 100`.
    pub perplexity_change_pct: f64,
    /// Mean of the per-position `KL(baseline || candidate)`, nats (`None`, JSON `null`, when the
    /// distributions were not known, as through an API).
    pub kl_mean: Option<f64>,
    /// 99th percentile of the per-position KL (linear interpolation between ranks, as
    /// [`percentile`]), nats.
    pub kl_p99: Option<f64>,
    /// Largest per-position KL, nats.
    pub kl_max: Option<f64>,
    /// Positions where both settings' top-1 token is the same.
    pub top1_agree: usize,
    /// `top1_agree / scored`, in `[0, 1]`.
    pub top1_agreement: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol
    }

    #[test]
    fn nll_of_hand_computed_softmax() {
        // Uniform over 4: -ln(1/4) = ln 4.
        assert!(close(nll(&[0.0; 4], 2), 4f64.ln(), 1e-12));
        // [ln 1, ln 2, ln 3, ln 4] -> softmax [0.1, 0.2, 0.3, 0.4].
        let row = [1f32.ln(), 2f32.ln(), 3f32.ln(), 4f32.ln()];
        assert!(close(nll(&row, 3), -(0.4f64.ln()), 1e-7));
        assert!(close(nll(&row, 0), -(0.1f64.ln()), 1e-7));
        // Large logits do not overflow: [1000, 1000] is uniform over 2.
        assert!(close(nll(&[1000.0, 1000.0], 1), 2f64.ln(), 1e-12));
    }

    #[test]
    fn kl_of_hand_computed_distributions() {
        // P = [0.5, 0.5], Q = [0.25, 0.75]: KL = 0.5 ln 2 + 0.5 ln(2/3) = 0.5 ln(4/3).
        let p = [0.0f32, 0.0];
        let q = [0.25f32.ln(), 0.75f32.ln()];
        assert!(close(
            kl_divergence(&p, &q),
            0.5 * (4.0f64 / 3.0).ln(),
            1e-7
        ));
        // And the other way round: 0.25 ln(0.5) + 0.75 ln(1.5).
        let back = 0.25 * 0.5f64.ln() + 0.75 * 1.5f64.ln();
        assert!(close(kl_divergence(&q, &p), back, 1e-7));
        // A constant shift of the logits is the same distribution.
        let shifted = [3.0f32, 3.0];
        assert_eq!(kl_divergence(&p, &shifted), 0.0);
        // Equal rows: exactly 0.
        let row = [0.3f32, -1.5, 2.25, 0.0];
        assert_eq!(kl_divergence(&row, &row), 0.0);
    }

    #[test]
    fn tally_summarises_perplexity_kl_and_top1() {
        let mut t = QualityTally::new();
        assert!(t.summary().is_none());
        let uniform = [0.0f32; 4];
        let skewed = [1f32.ln(), 2f32.ln(), 3f32.ln(), 4f32.ln()]; // [0.1, 0.2, 0.3, 0.4]
                                                                   // Position 1: baseline uniform, candidate skewed, target 3 (argmax 0 vs 3: disagree).
        t.add(&uniform, &skewed, 3);
        // Position 2: both skewed, target 1 (argmax 3 and 3: agree).
        t.add(&skewed, &skewed, 1);
        let s = t.summary().unwrap();
        assert_eq!(s.scored, 2);
        // Baseline NLL: ln 4 and -ln 0.2; candidate: -ln 0.4 and -ln 0.2.
        let nll_b = (4f64.ln() - 0.2f64.ln()) / 2.0;
        let nll_c = (-(0.4f64.ln()) - 0.2f64.ln()) / 2.0;
        assert!(close(s.mean_nll_baseline, nll_b, 1e-7));
        assert!(close(s.mean_nll_candidate, nll_c, 1e-7));
        // exp of the mean NLL: sqrt(4 * 5) and sqrt(2.5 * 5).
        assert!(close(s.perplexity_baseline, 20f64.sqrt(), 1e-6));
        assert!(close(s.perplexity_candidate, 12.5f64.sqrt(), 1e-6));
        let change = ((12.5f64 / 20.0).sqrt() - 1.0) * 100.0;
        assert!(close(s.perplexity_change_pct, change, 1e-5));
        // KL(uniform || [.1 .2 .3 .4]) = sum 0.25 ln(0.25 / q_i); the second position is 0.
        let kl1: f64 = [0.1f64, 0.2, 0.3, 0.4]
            .iter()
            .map(|q| 0.25 * (0.25 / q).ln())
            .sum();
        assert!(close(s.kl_mean.unwrap(), kl1 / 2.0, 1e-7));
        assert!(close(s.kl_max.unwrap(), kl1, 1e-7));
        // p99 of [0, kl1] by linear interpolation: 0.99 * kl1.
        assert!(close(s.kl_p99.unwrap(), 0.99 * kl1, 1e-7));
        assert_eq!(s.top1_agree, 1);
        assert_eq!(s.top1_agreement, 0.5);
    }

    #[test]
    fn scores_without_kl_summarise_perplexity_and_top1_only() {
        let mut t = QualityTally::new();
        t.add_scores(4f64.ln(), 2f64.ln(), None, true);
        t.add_scores(1f64.ln(), 2f64.ln(), None, false);
        t.add_scores(4f64.ln(), 2f64.ln(), None, true);
        let s = t.summary().unwrap();
        assert_eq!(s.scored, 3);
        // exp(mean(ln 4, 0, ln 4)) = 16^(1/3); the candidate's is 2.
        assert!(close(s.perplexity_baseline, 16f64.powf(1.0 / 3.0), 1e-12));
        assert!(close(s.perplexity_candidate, 2.0, 1e-12));
        assert_eq!((s.kl_mean, s.kl_p99, s.kl_max), (None, None, None));
        assert_eq!(s.top1_agree, 2);
        assert!(close(s.top1_agreement, 2.0 / 3.0, 1e-15));
        // One position with a KL among positions without: still no KL figure.
        t.add(&[0.0; 2], &[0.0; 2], 0);
        assert_eq!(t.summary().unwrap().kl_mean, None);
    }
}
