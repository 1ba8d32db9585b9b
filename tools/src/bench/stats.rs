//! Percentiles and distribution summaries of latency samples.

use serde::Serialize;

/// The `q`-th percentile (`q` in `[0, 100]`) of `sorted` (ascending, no NaN), by linear
/// interpolation between the two closest ranks (numpy's default `"linear"` method): the rank is
/// `q / 100 * (n - 1)`.
///
/// Returns `None` for an empty slice. The result is non-decreasing in `q`, so p50 <= p95 <= p99.
pub fn percentile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (q.clamp(0.0, 100.0) / 100.0) * (sorted.len() - 1) as f64;
    let lo = rank.floor() as usize;
    let hi = rank.ceil() as usize;
    let frac = rank - lo as f64;
    Some(sorted[lo] + (sorted[hi] - sorted[lo]) * frac)
}

/// Summary of a set of samples, in the samples' unit (milliseconds for every latency the bench
/// reports). Every field but `count` is `None` (JSON `null`) when there are no samples.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Distribution {
    /// Number of samples.
    pub count: usize,
    /// Arithmetic mean.
    pub mean: Option<f64>,
    /// Smallest sample.
    pub min: Option<f64>,
    /// Median (linear interpolation, see [`percentile`]).
    pub p50: Option<f64>,
    /// 90th percentile.
    pub p90: Option<f64>,
    /// 95th percentile.
    pub p95: Option<f64>,
    /// 99th percentile.
    pub p99: Option<f64>,
    /// Largest sample.
    pub max: Option<f64>,
}

impl Distribution {
    /// Summarizes `samples` (any order; NaN samples are dropped).
    pub fn from_samples(samples: &[f64]) -> Distribution {
        let mut sorted: Vec<f64> = samples.iter().copied().filter(|x| !x.is_nan()).collect();
        sorted.sort_by(f64::total_cmp);
        let count = sorted.len();
        let mean = (count > 0).then(|| sorted.iter().sum::<f64>() / count as f64);
        Distribution {
            count,
            mean,
            min: sorted.first().copied(),
            p50: percentile(&sorted, 50.0),
            p90: percentile(&sorted, 90.0),
            p95: percentile(&sorted, 95.0),
            p99: percentile(&sorted, 99.0),
            max: sorted.last().copied(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_interpolates_linearly() {
        let s = [1.0, 2.0, 3.0, 4.0, 5.0];
        assert_eq!(percentile(&s, 0.0), Some(1.0));
        assert_eq!(percentile(&s, 50.0), Some(3.0));
        assert_eq!(percentile(&s, 100.0), Some(5.0));
        assert_eq!(percentile(&s, 25.0), Some(2.0));
        // rank 0.95 * 4 = 3.8 -> 4 + 0.8 * (5 - 4)
        assert!((percentile(&s, 95.0).unwrap() - 4.8).abs() < 1e-12);
        assert_eq!(percentile(&[7.0], 99.0), Some(7.0));
        assert_eq!(percentile(&[], 50.0), None);
        // Two samples: the median is their mean.
        assert_eq!(percentile(&[10.0, 20.0], 50.0), Some(15.0));
    }

    #[test]
    fn percentiles_are_ordered() {
        let samples: Vec<f64> = (0..1000)
            .map(|i| ((i * 7919) % 1000) as f64 * 0.37)
            .collect();
        let d = Distribution::from_samples(&samples);
        let (min, p50, p90, p95, p99, max) = (
            d.min.unwrap(),
            d.p50.unwrap(),
            d.p90.unwrap(),
            d.p95.unwrap(),
            d.p99.unwrap(),
            d.max.unwrap(),
        );
        assert!(min <= p50 && p50 <= p90 && p90 <= p95 && p95 <= p99 && p99 <= max);
        assert_eq!(d.count, 1000);
        assert_eq!(min, 0.0);
        assert!((max - 999.0 * 0.37).abs() < 1e-9);
    }

    #[test]
    fn distribution_of_unsorted_samples() {
        let d = Distribution::from_samples(&[3.0, 1.0, f64::NAN, 2.0]);
        assert_eq!(d.count, 3);
        assert_eq!(d.mean, Some(2.0));
        assert_eq!(d.min, Some(1.0));
        assert_eq!(d.p50, Some(2.0));
        assert_eq!(d.max, Some(3.0));
    }

    #[test]
    fn empty_distribution_is_all_null() {
        let d = Distribution::from_samples(&[]);
        assert_eq!(d.count, 0);
        assert!(d.mean.is_none() && d.p50.is_none() && d.p99.is_none() && d.max.is_none());
        let json = serde_json::to_value(d).unwrap();
        assert!(json["p95"].is_null());
        assert_eq!(json["count"], 0);
    }
}
