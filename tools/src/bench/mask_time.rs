//! `--worker-metrics URL`: the worker's structured-output mask time over the measured phase, from
//! its Prometheus histogram `worker_constraint_mask_seconds` (one observation per constrained
//! sequence per sampled token).
//!
//! The page is scraped right before and right after the measured phase; the bucket counts of the
//! second minus the first are the masks computed during the phase (other clients of the same
//! worker included). The median and p99 are *estimates* from those bucket deltas, computed as
//! Prometheus' `histogram_quantile` does: find the bucket holding the rank `q * count` and
//! interpolate linearly between its lower and upper bound (the first bucket's lower bound is 0; a
//! rank in the `+Inf` bucket gives the largest finite bound). The error is at most the width of
//! that bucket (the worker's buckets are log-spaced, about 19% apart).

use std::time::Duration;

use anyhow::{bail, ensure, Context};
use serde::Serialize;

/// The histogram's metric name on the worker's `/metrics` page.
pub const MASK_HISTOGRAM: &str = "worker_constraint_mask_seconds";

/// How the percentiles are estimated (written with them).
pub const METHOD: &str =
    "estimated from the worker_constraint_mask_seconds bucket deltas over the \
                          measured phase, linear interpolation within a bucket";

/// Limit on each scrape.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(10);

/// One scrape of a histogram: cumulative counts by upper bound, ascending, `+Inf` last.
#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    /// `(upper bound "le", cumulative count)`; the last bound is infinite.
    pub buckets: Vec<(f64, f64)>,
    /// `_sum`: the sum of the observations.
    pub sum: f64,
    /// `_count`: how many observations.
    pub count: f64,
}

impl Histogram {
    /// Reads histogram `name` from a Prometheus / OpenMetrics text page.
    ///
    /// Errors: the histogram is missing, a line of it does not parse, or it has no `+Inf` bucket.
    pub fn parse(page: &str, name: &str) -> anyhow::Result<Histogram> {
        let bucket = format!("{name}_bucket{{");
        let (sum_name, count_name) = (format!("{name}_sum"), format!("{name}_count"));
        let (mut buckets, mut sum, mut count) = (Vec::new(), None, None);
        for line in page.lines().filter(|l| !l.starts_with('#')) {
            let Some((series, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let number = || -> anyhow::Result<f64> {
                value
                    .parse()
                    .with_context(|| format!("bad value in {line:?}"))
            };
            if let Some(labels) = series.strip_prefix(&bucket) {
                let le = labels
                    .split(',')
                    .find_map(|l| l.trim().strip_prefix("le=\""))
                    .and_then(|l| l.split('"').next())
                    .with_context(|| format!("no le label in {line:?}"))?;
                let le = match le {
                    "+Inf" | "Inf" => f64::INFINITY,
                    finite => finite
                        .parse()
                        .with_context(|| format!("bad le in {line:?}"))?,
                };
                buckets.push((le, number()?));
            } else if series == sum_name {
                sum = Some(number()?);
            } else if series == count_name {
                count = Some(number()?);
            }
        }
        ensure!(!buckets.is_empty(), "the page has no histogram {name}");
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        ensure!(
            buckets.last().is_some_and(|b| b.0.is_infinite()),
            "histogram {name} has no +Inf bucket"
        );
        let count = count.unwrap_or(buckets.last().expect("not empty").1);
        Ok(Histogram {
            buckets,
            sum: sum.unwrap_or(0.0),
            count,
        })
    }

    /// The observations made between `earlier` and `self` (bucket by bucket).
    ///
    /// Errors: different bucket bounds, or fewer observations than before (the worker restarted).
    pub fn since(&self, earlier: &Histogram) -> anyhow::Result<Histogram> {
        ensure!(
            self.buckets.len() == earlier.buckets.len()
                && self
                    .buckets
                    .iter()
                    .zip(&earlier.buckets)
                    .all(|(a, b)| a.0 == b.0),
            "the histogram's buckets changed between the scrapes"
        );
        if self.count < earlier.count {
            bail!("the histogram's count went down between the scrapes (did the worker restart?)");
        }
        Ok(Histogram {
            buckets: self
                .buckets
                .iter()
                .zip(&earlier.buckets)
                .map(|(a, b)| (a.0, a.1 - b.1))
                .collect(),
            sum: self.sum - earlier.sum,
            count: self.count - earlier.count,
        })
    }

    /// The estimated `q`-quantile (0 < q <= 1) of the observations, see the [module docs](self);
    /// `None` without observations.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let total = self.buckets.last()?.1;
        if total <= 0.0 {
            return None;
        }
        let rank = q * total;
        let mut lower = (0.0, 0.0); // (bound, cumulative count) below the current bucket
        for &(le, cumulative) in &self.buckets {
            if cumulative >= rank {
                if le.is_infinite() {
                    return Some(lower.0);
                }
                let inside = cumulative - lower.1;
                let fraction = if inside > 0.0 {
                    (rank - lower.1) / inside
                } else {
                    1.0
                };
                return Some(lower.0 + (le - lower.0) * fraction);
            }
            lower = (le, cumulative);
        }
        Some(lower.0)
    }
}

/// The mask time of a run, in microseconds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MaskTime {
    /// The metrics page read.
    pub source: String,
    /// Masks computed during the measured phase.
    pub masks: u64,
    /// Mean mask time (`_sum / _count` deltas, exact).
    pub mean_us: Option<f64>,
    /// Estimated median.
    pub p50_us: Option<f64>,
    /// Estimated 99th percentile.
    pub p99_us: Option<f64>,
    /// [`METHOD`].
    pub method: &'static str,
}

impl MaskTime {
    /// The mask time of the observations in `delta`, read from `source`.
    pub fn from_delta(source: &str, delta: &Histogram) -> MaskTime {
        let us = |s: f64| s * 1e6;
        MaskTime {
            source: source.to_string(),
            masks: delta.count.round() as u64,
            mean_us: (delta.count > 0.0).then(|| us(delta.sum / delta.count)),
            p50_us: delta.quantile(0.5).map(us),
            p99_us: delta.quantile(0.99).map(us),
            method: METHOD,
        }
    }

    /// One line for the text report.
    pub fn render(&self) -> String {
        let cell = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{v:.1}"));
        format!(
            "mask time (worker):  {} masks, mean {} us, p50 ~{} us, p99 ~{} us ({})",
            self.masks,
            cell(self.mean_us),
            cell(self.p50_us),
            cell(self.p99_us),
            "estimated from histogram buckets"
        )
    }
}

/// The worker's metrics page, `--worker-metrics` (`http://HOST:PORT/metrics`, or `HOST:PORT` for
/// that).
#[derive(Debug, Clone)]
pub struct MetricsPage {
    client: reqwest::Client,
    /// The URL scraped.
    pub url: String,
}

impl MetricsPage {
    /// The page at `address`.
    ///
    /// Errors: an address that is neither `http://...` nor `HOST:PORT`.
    pub fn new(address: &str) -> anyhow::Result<MetricsPage> {
        let url = if address.starts_with("http://") {
            address.to_string()
        } else if address.contains("://") {
            bail!("--worker-metrics takes http://HOST:PORT/metrics or HOST:PORT, got {address:?}");
        } else {
            format!("http://{address}/metrics")
        };
        Ok(MetricsPage {
            client: reqwest::Client::builder().timeout(SCRAPE_TIMEOUT).build()?,
            url,
        })
    }

    /// Scrapes the page and reads the mask histogram.
    ///
    /// Errors: the page cannot be fetched, or it has no (well-formed) mask histogram.
    pub async fn mask_histogram(&self) -> anyhow::Result<Histogram> {
        let response = self
            .client
            .get(&self.url)
            .send()
            .await
            .with_context(|| format!("GET {}", self.url))?;
        let status = response.status();
        ensure!(status.is_success(), "GET {} answered {status}", self.url);
        let page = response.text().await.context("reading the metrics page")?;
        Histogram::parse(&page, MASK_HISTOGRAM).with_context(|| format!("reading {}", self.url))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(buckets: &[(&str, u64)], sum: f64) -> String {
        let mut s = format!(
            "# HELP {MASK_HISTOGRAM} Time.\n# TYPE {MASK_HISTOGRAM} histogram\n\
             other_metric_bucket{{le=\"1\"}} 5\n"
        );
        let count = buckets.last().map_or(0, |b| b.1);
        s += &format!("{MASK_HISTOGRAM}_sum {sum}\n{MASK_HISTOGRAM}_count {count}\n");
        for (le, n) in buckets {
            s += &format!("{MASK_HISTOGRAM}_bucket{{le=\"{le}\"}} {n}\n");
        }
        s + "# EOF\n"
    }

    #[test]
    fn parses_and_subtracts_scrapes() {
        let before = Histogram::parse(
            &page(&[("1e-5", 1), ("2e-5", 2), ("+Inf", 2)], 0.00003),
            MASK_HISTOGRAM,
        )
        .unwrap();
        assert_eq!(before.buckets[0], (1e-5, 1.0));
        assert!(before.buckets[2].0.is_infinite());
        assert_eq!(before.count, 2.0);
        let after = Histogram::parse(
            &page(&[("1e-5", 1), ("2e-5", 12), ("+Inf", 13)], 0.00033),
            MASK_HISTOGRAM,
        )
        .unwrap();
        let delta = after.since(&before).unwrap();
        assert_eq!(
            delta.buckets,
            vec![(1e-5, 0.0), (2e-5, 10.0), (f64::INFINITY, 11.0)]
        );
        assert_eq!(delta.count, 11.0);
        assert!((delta.sum - 0.0003).abs() < 1e-12);
        assert!(before.since(&after).is_err());
        assert!(Histogram::parse("up 1\n", MASK_HISTOGRAM).is_err());
    }

    #[test]
    fn quantiles_interpolate_within_the_bucket() {
        // 100 observations: 50 in (0, 10 us], 40 in (10, 20], 9 in (20, 40], 1 above 40 us.
        let h = Histogram {
            buckets: vec![
                (10e-6, 50.0),
                (20e-6, 90.0),
                (40e-6, 99.0),
                (f64::INFINITY, 100.0),
            ],
            sum: 0.0,
            count: 100.0,
        };
        let close = |a: f64, b: f64| (a - b).abs() < 1e-12;
        assert!(close(h.quantile(0.5).unwrap(), 10e-6));
        assert!(close(h.quantile(0.7).unwrap(), 15e-6));
        assert!(close(h.quantile(0.99).unwrap(), 40e-6));
        assert!(close(h.quantile(0.25).unwrap(), 5e-6));
        // In +Inf: the largest finite bound.
        assert!(close(h.quantile(0.995).unwrap(), 40e-6));
        let empty = Histogram {
            buckets: vec![(1.0, 0.0), (f64::INFINITY, 0.0)],
            sum: 0.0,
            count: 0.0,
        };
        assert_eq!(empty.quantile(0.5), None);
        let t = MaskTime::from_delta("x", &h);
        assert_eq!(t.masks, 100);
        assert!(close(t.p50_us.unwrap(), 10.0));
        assert_eq!(t.mean_us, Some(0.0));
    }

    #[test]
    fn metrics_addresses() {
        assert_eq!(
            MetricsPage::new("127.0.0.1:9100").unwrap().url,
            "http://127.0.0.1:9100/metrics"
        );
        assert_eq!(
            MetricsPage::new("http://h:1/m").unwrap().url,
            "http://h:1/m"
        );
        assert!(MetricsPage::new("https://h:1/m").is_err());
    }
}
