//! A small deterministic random stream (SplitMix64), so that a `--seed` gives the same prompts,
//! lengths, arrival times and sampling seeds on every build.

/// SplitMix64 (Steele, Lea, Flood 2014): 64-bit state, full period, good enough for workload
/// generation (not for cryptography).
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A stream starting from `seed`.
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64 { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)` (53 random bits).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `[0, n)`; `n` must be positive.
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "below(0)");
        // Multiply-shift: the bias is at most n / 2^64, negligible here.
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// Uniform in `[lo, hi]` (both included); `lo` when `hi <= lo`.
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        match (hi - lo).checked_add(1) {
            Some(span) => lo + self.below(span),
            None => self.next_u64(),
        }
    }

    /// An exponential sample with rate `rate` (mean `1 / rate`): the gap between Poisson
    /// arrivals, in the reciprocal unit of `rate` (seconds for requests/s).
    pub fn exponential(&mut self, rate: f64) -> f64 {
        // 1 - U is in (0, 1], so the logarithm is finite.
        -(1.0 - self.next_f64()).ln() / rate
    }
}

/// A seed derived from `seed` and a stream number `index` (distinct indices give unrelated seeds).
pub fn derive_seed(seed: u64, index: u64) -> u64 {
    SplitMix64::new(seed ^ index.wrapping_mul(0xD1B5_4A32_D192_ED03)).next_u64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_in_range() {
        let mut a = SplitMix64::new(42);
        let mut b = SplitMix64::new(42);
        for _ in 0..1000 {
            assert_eq!(a.next_u64(), b.next_u64());
            let x = a.between(5, 9);
            assert!((5..=9).contains(&x));
            b.between(5, 9);
            let f = a.next_f64();
            assert!((0.0..1.0).contains(&f));
            b.next_f64();
        }
        assert_eq!(a.between(7, 7), 7);
        assert_eq!(a.between(7, 3), 7);
    }

    #[test]
    fn between_hits_both_ends() {
        let mut r = SplitMix64::new(1);
        let seen: std::collections::HashSet<u64> = (0..500).map(|_| r.between(0, 3)).collect();
        assert_eq!(seen.len(), 4);
    }

    #[test]
    fn exponential_mean_is_one_over_rate() {
        let mut r = SplitMix64::new(7);
        let n = 20_000;
        let mean = (0..n).map(|_| r.exponential(4.0)).sum::<f64>() / n as f64;
        assert!((mean - 0.25).abs() < 0.01, "{mean}");
    }

    #[test]
    fn derived_seeds_differ() {
        let seeds: std::collections::HashSet<u64> = (0..100).map(|i| derive_seed(0, i)).collect();
        assert_eq!(seeds.len(), 100);
        assert_ne!(derive_seed(1, 0), derive_seed(2, 0));
    }
}
