//! What one fleet run produced ([`FleetOutcome`], from real processes or the simulator alike) and
//! its summary ([`FleetSummary`]): the figures `bench fleet` prints and BENCHMARKS.md quotes.

use serde::Serialize;

use crate::bench::stats::percentile;

/// One request's times, in seconds from the run's start.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct RequestTiming {
    /// When it was sent (a conversation's turn: when it could be sent).
    pub arrival_s: f64,
    /// When its first token arrived (`None`: failed or never answered).
    pub first_token_s: Option<f64>,
    /// When its last token arrived (`None`: failed).
    pub finish_s: Option<f64>,
    /// Tokens it generated.
    pub output_tokens: u64,
}

/// Every request's timing and each worker's counters.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FleetOutcome {
    /// Per request, in workload order.
    pub requests: Vec<RequestTiming>,
    /// Requests each worker received.
    pub worker_requests: Vec<u64>,
    /// Prompt tokens each worker looked up in its prefix cache.
    pub worker_query_tokens: Vec<u64>,
    /// Prompt tokens each worker found there.
    pub worker_hit_tokens: Vec<u64>,
}

/// The figures of one run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FleetSummary {
    /// Requests that finished.
    pub completed: usize,
    /// Requests that did not.
    pub failed: usize,
    /// Prefix-cache hit rate over all workers (hit tokens / query tokens).
    pub hit_rate: f64,
    /// Each worker's hit rate (0 for a worker that got no request).
    pub worker_hit_rates: Vec<f64>,
    /// TTFT percentiles, in milliseconds.
    pub ttft_p50_ms: f64,
    /// TTFT p90, ms.
    pub ttft_p90_ms: f64,
    /// TTFT p99, ms.
    pub ttft_p99_ms: f64,
    /// Median of the requests' mean inter-token gap, ms.
    pub itl_p50_ms: f64,
    /// Request latency (arrival to last token) percentiles, ms: what TTFT and ITL add up to.
    pub e2e_p50_ms: f64,
    /// End-to-end latency p99, ms.
    pub e2e_p99_ms: f64,
    /// Generated tokens per second over the run (first arrival to last finish).
    pub output_tokens_per_s: f64,
    /// Completed requests per second over the run.
    pub requests_per_s: f64,
    /// Most requests any worker got over the mean (1.0 = perfectly even).
    pub max_over_mean_requests: f64,
}

impl FleetOutcome {
    /// Sums up the run.
    pub fn summary(&self) -> FleetSummary {
        let mut ttft: Vec<f64> = Vec::new();
        let mut itl: Vec<f64> = Vec::new();
        let mut e2e: Vec<f64> = Vec::new();
        let (mut start, mut end) = (f64::INFINITY, 0.0f64);
        let mut tokens = 0u64;
        let mut completed = 0;
        for r in &self.requests {
            start = start.min(r.arrival_s);
            if let (Some(first), Some(finish)) = (r.first_token_s, r.finish_s) {
                completed += 1;
                ttft.push((first - r.arrival_s) * 1e3);
                e2e.push((finish - r.arrival_s) * 1e3);
                if r.output_tokens > 1 {
                    itl.push((finish - first) * 1e3 / (r.output_tokens - 1) as f64);
                }
                end = end.max(finish);
                tokens += r.output_tokens;
            }
        }
        ttft.sort_by(f64::total_cmp);
        itl.sort_by(f64::total_cmp);
        e2e.sort_by(f64::total_cmp);
        let duration = (end - start).max(1e-9);
        let query: u64 = self.worker_query_tokens.iter().sum();
        let hit: u64 = self.worker_hit_tokens.iter().sum();
        let workers = self.worker_requests.len().max(1);
        let mean = self.worker_requests.iter().sum::<u64>() as f64 / workers as f64;
        let max = self.worker_requests.iter().copied().max().unwrap_or(0) as f64;
        FleetSummary {
            completed,
            failed: self.requests.len() - completed,
            hit_rate: ratio(hit, query),
            worker_hit_rates: self
                .worker_hit_tokens
                .iter()
                .zip(&self.worker_query_tokens)
                .map(|(&h, &q)| ratio(h, q))
                .collect(),
            ttft_p50_ms: percentile(&ttft, 50.0).unwrap_or(0.0),
            ttft_p90_ms: percentile(&ttft, 90.0).unwrap_or(0.0),
            ttft_p99_ms: percentile(&ttft, 99.0).unwrap_or(0.0),
            itl_p50_ms: percentile(&itl, 50.0).unwrap_or(0.0),
            e2e_p50_ms: percentile(&e2e, 50.0).unwrap_or(0.0),
            e2e_p99_ms: percentile(&e2e, 99.0).unwrap_or(0.0),
            output_tokens_per_s: tokens as f64 / duration,
            requests_per_s: completed as f64 / duration,
            max_over_mean_requests: if mean > 0.0 { max / mean } else { 0.0 },
        }
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

impl FleetSummary {
    /// One line of the report: `label` then the figures.
    pub fn render(&self, label: &str) -> String {
        format!(
            "{label:<28} hit {:>5.1}%  TTFT p50 {:>8.1} p90 {:>8.1} p99 {:>8.1} ms  ITL p50 {:>6.1} ms  E2E p50 {:>8.1} p99 {:>8.1} ms  {:>7.1} tok/s  {:>6.2} req/s  max/mean {:.2}  done {}/{}",
            self.hit_rate * 100.0,
            self.ttft_p50_ms,
            self.ttft_p90_ms,
            self.ttft_p99_ms,
            self.itl_p50_ms,
            self.e2e_p50_ms,
            self.e2e_p99_ms,
            self.output_tokens_per_s,
            self.requests_per_s,
            self.max_over_mean_requests,
            self.completed,
            self.completed + self.failed,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_has_each_requests_ttft_itl_and_end_to_end_latency() {
        let timing = |arrival_s, first, finish, output_tokens| RequestTiming {
            arrival_s,
            first_token_s: Some(first),
            finish_s: Some(finish),
            output_tokens,
        };
        let outcome = FleetOutcome {
            // TTFT 0.1 and 0.3 s; end to end 0.5 and 1.3 s; mean gaps 0.1 and 0.2 s.
            requests: vec![
                timing(0.0, 0.1, 0.5, 5),
                timing(1.0, 1.3, 2.3, 6),
                RequestTiming {
                    arrival_s: 1.5,
                    first_token_s: None,
                    finish_s: None,
                    output_tokens: 0,
                },
            ],
            worker_requests: vec![2, 1],
            worker_query_tokens: vec![100, 0],
            worker_hit_tokens: vec![40, 0],
        };
        let s = outcome.summary();
        assert_eq!((s.completed, s.failed), (2, 1));
        assert!((s.hit_rate - 0.4).abs() < 1e-12);
        // Percentiles interpolate between the two completed requests.
        let close = |a: f64, b: f64| (a - b).abs() < 1e-6;
        assert!(
            close(s.ttft_p50_ms, 200.0) && close(s.ttft_p99_ms, 298.0),
            "{s:?}"
        );
        assert!(
            close(s.e2e_p50_ms, 900.0) && close(s.e2e_p99_ms, 1292.0),
            "{s:?}"
        );
        assert!(close(s.itl_p50_ms, 150.0), "{s:?}");
        assert!((s.max_over_mean_requests - 2.0 / 1.5).abs() < 1e-12);
        assert!(s.render("x").contains("E2E p50"));
    }
}
