//! Token sampling: greedy, temperature, top-k and top-p (nucleus, Holtzman et
//! al. 2019) with a seeded ChaCha RNG.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// How to pick the next token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingConfig {
    /// Softmax temperature; `<= 0` means greedy argmax (ties go to the lowest id).
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; 0 disables.
    pub top_k: u32,
    /// Keep the smallest set of most likely tokens whose probability mass is
    /// `>= top_p`; values `>= 1` (or `<= 0`) disable.
    pub top_p: f32,
}

impl Default for SamplingConfig {
    /// Greedy decoding.
    fn default() -> Self {
        SamplingConfig {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
        }
    }
}

/// A sampled token with its log-probability.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SampledToken {
    /// The chosen token id.
    pub token_id: u32,
    /// `log_softmax(logits)[token_id]` of the raw logits (temperature 1,
    /// before top-k/top-p), in nats.
    pub logprob: f32,
}

/// A sampler for one sequence: a config plus its own deterministic RNG.
#[derive(Debug, Clone)]
pub struct Sampler {
    config: SamplingConfig,
    rng: ChaCha8Rng,
}

impl Sampler {
    /// A sampler whose random draws are fully determined by `seed`.
    pub fn new(config: SamplingConfig, seed: u64) -> Sampler {
        Sampler {
            config,
            rng: ChaCha8Rng::seed_from_u64(seed),
        }
    }

    /// The sampling config.
    pub fn config(&self) -> &SamplingConfig {
        &self.config
    }

    /// Picks a token from `logits` (`[vocab]`, f32, unnormalised).
    ///
    /// Greedy when `temperature <= 0` (no RNG draw). Otherwise: scale by
    /// `1 / temperature`, keep the top-k, then the top-p nucleus (of the
    /// temperature-scaled distribution restricted to the top-k), renormalise
    /// and draw one uniform number. Candidates are ordered by probability,
    /// ties by lower id. NaN logits are treated as `-inf`.
    ///
    /// Panics if `logits` is empty.
    pub fn sample(&mut self, logits: &[f32]) -> SampledToken {
        assert!(!logits.is_empty(), "sample: empty logits");
        let c = self.config;
        let token_id = if c.temperature <= 0.0 || c.top_k == 1 {
            argmax(logits)
        } else {
            self.draw(logits)
        };
        SampledToken {
            token_id: token_id as u32,
            logprob: log_softmax_at(logits, token_id),
        }
    }

    fn draw(&mut self, logits: &[f32]) -> usize {
        let c = self.config;
        let inv_t = 1.0 / c.temperature;
        let clean = |v: f32| if v.is_nan() { f32::NEG_INFINITY } else { v };
        let mut cand: Vec<(usize, f32)> = logits
            .iter()
            .enumerate()
            .map(|(i, &v)| (i, clean(v) * inv_t))
            .collect();
        let by_score = |a: &(usize, f32), b: &(usize, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        let k = c.top_k as usize;
        if k > 0 && k < cand.len() {
            cand.select_nth_unstable_by(k - 1, by_score);
            cand.truncate(k);
        }
        cand.sort_unstable_by(by_score);
        let max = cand[0].1;
        if max == f32::NEG_INFINITY {
            return cand[0].0;
        }
        // Probabilities (in f64) of the remaining candidates.
        let mut probs: Vec<f64> = cand
            .iter()
            .map(|&(_, s)| ((s - max) as f64).exp())
            .collect();
        let total: f64 = probs.iter().sum();
        if c.top_p > 0.0 && c.top_p < 1.0 {
            let mut mass = 0.0;
            let mut keep = probs.len();
            for (i, p) in probs.iter().enumerate() {
                mass += p / total;
                if mass >= c.top_p as f64 {
                    keep = i + 1;
                    break;
                }
            }
            probs.truncate(keep);
        }
        let total: f64 = probs.iter().sum();
        let mut u = self.rng.random::<f64>() * total;
        for (i, p) in probs.iter().enumerate() {
            if u < *p {
                return cand[i].0;
            }
            u -= p;
        }
        cand[probs.len() - 1].0
    }
}

/// Index of the largest logit; ties go to the lowest index, NaN is ignored
/// (all-NaN input gives 0).
pub fn argmax(logits: &[f32]) -> usize {
    let mut best = 0;
    let mut best_v = f32::NEG_INFINITY;
    for (i, &v) in logits.iter().enumerate() {
        if v > best_v {
            best = i;
            best_v = v;
        }
    }
    best
}

/// `log_softmax(logits)[i]`, computed in f64 with the max subtracted.
pub fn log_softmax_at(logits: &[f32], i: usize) -> f32 {
    let max = logits
        .iter()
        .copied()
        .filter(|v| !v.is_nan())
        .fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits
        .iter()
        .filter(|v| !v.is_nan())
        .map(|&v| (v as f64 - max).exp())
        .sum();
    (logits[i] as f64 - max - sum.ln()) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(temperature: f32, top_k: u32, top_p: f32) -> SamplingConfig {
        SamplingConfig {
            temperature,
            top_k,
            top_p,
        }
    }

    const LOGITS: [f32; 6] = [1.0, 3.0, 2.5, 3.0, -1.0, 0.0];

    #[test]
    fn greedy_picks_lowest_max() {
        let mut s = Sampler::new(cfg(0.0, 0, 1.0), 1);
        assert_eq!(s.sample(&LOGITS).token_id, 1);
        assert_eq!(argmax(&[f32::NAN, 1.0, 1.0]), 1);
    }

    #[test]
    fn logprob_is_raw_log_softmax() {
        let mut s = Sampler::new(cfg(0.5, 3, 0.9), 7);
        for _ in 0..20 {
            let t = s.sample(&LOGITS);
            let z: f64 = LOGITS.iter().map(|&v| (v as f64).exp()).sum();
            let want = (LOGITS[t.token_id as usize] as f64).exp() / z;
            assert!((t.logprob as f64 - want.ln()).abs() < 1e-6);
        }
    }

    #[test]
    fn seeded_reproducible() {
        let draw = |seed| {
            let mut s = Sampler::new(cfg(1.0, 0, 1.0), seed);
            (0..50)
                .map(|_| s.sample(&LOGITS).token_id)
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(3), draw(3));
        assert_ne!(draw(3), draw(4));
    }

    #[test]
    fn top_k_one_and_tiny_top_p_are_greedy() {
        let mut a = Sampler::new(cfg(1.5, 1, 1.0), 9);
        let mut b = Sampler::new(cfg(1.5, 0, 1e-6), 9);
        for _ in 0..50 {
            assert_eq!(a.sample(&LOGITS).token_id, 1);
            assert_eq!(b.sample(&LOGITS).token_id, 1);
        }
    }

    #[test]
    fn top_k_restricts_support() {
        let mut s = Sampler::new(cfg(5.0, 3, 1.0), 11);
        for _ in 0..500 {
            let t = s.sample(&LOGITS).token_id;
            assert!([1, 2, 3].contains(&t), "{t}");
        }
    }

    #[test]
    fn top_p_restricts_support() {
        // probs ∝ e^[2, 1, 0, -5] = 0.6648, 0.2447, 0.0900, 0.0006 (cumulative 0.9094, 0.9994)
        let logits = [2.0, 1.0, 0.0, -5.0];
        let support = |top_p: f32| {
            let mut s = Sampler::new(cfg(1.0, 0, top_p), 5);
            let mut seen = [0usize; 4];
            for _ in 0..3000 {
                seen[s.sample(&logits).token_id as usize] += 1;
            }
            seen.map(|c| c > 0)
        };
        assert_eq!(support(0.9), [true, true, false, false]);
        assert_eq!(support(0.95), [true, true, true, false]);
    }

    #[test]
    fn frequencies_match_softmax() {
        let logits = [0.0f32, 1.0, 2.0, 0.5];
        let z: f64 = logits.iter().map(|&v| (v as f64).exp()).sum();
        let mut s = Sampler::new(cfg(1.0, 0, 1.0), 1234);
        let n = 40_000;
        let mut counts = [0usize; 4];
        for _ in 0..n {
            counts[s.sample(&logits).token_id as usize] += 1;
        }
        for (i, &c) in counts.iter().enumerate() {
            let p = (logits[i] as f64).exp() / z;
            let freq = c as f64 / n as f64;
            assert!((freq - p).abs() < 0.01, "token {i}: {freq} vs {p}");
        }
        // temperature 2 flattens the distribution
        let mut s = Sampler::new(cfg(2.0, 0, 1.0), 1234);
        let mut top = 0;
        for _ in 0..n {
            top += (s.sample(&logits).token_id == 2) as usize;
        }
        let z2: f64 = logits.iter().map(|&v| (v as f64 / 2.0).exp()).sum();
        let p2 = 1.0f64.exp() / z2;
        assert!((top as f64 / n as f64 - p2).abs() < 0.01);
    }
}
