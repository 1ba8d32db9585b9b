//! `--tenant-mix`: load from several tenants at once (issue 27), each an open-loop Poisson stream
//! of its own rate, API key and priority, through the router's gRPC `Generate`, and the report of
//! each tenant apart: requests, refusals (`RESOURCE_EXHAUSTED`: its quotas or a full queue), other
//! errors, TTFT p50 / p99 of its served requests and its generated tokens per second.
//!
//! The streams are superposed: arrivals come at the total rate (exponential gaps of mean
//! 1 / sum of rates) and each is given to tenant i with probability rate_i / total, which is the
//! same as independent Poisson streams per tenant (the superposition property), drawn from
//! `--seed` so that a run is repeatable.

use std::str::FromStr;
use std::time::Duration;

use serde::Serialize;

use super::report::{RequestRecord, TenantSummary};
use super::rng::{derive_seed, SplitMix64};
use super::stats::percentile;

/// Random stream (with `--seed`) of the tenant picked for each arrival.
const TENANT_STREAM: u64 = (1 << 40) + 3;

/// One tenant's share of the load.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TenantLoad {
    /// Its name in the report (any text without `:` and `,`).
    pub name: String,
    /// The API key its requests carry (`authorization: Bearer KEY`). Not written to the JSON.
    #[serde(skip)]
    pub key: String,
    /// Its arrival rate, requests per second.
    pub rate: f64,
    /// The `priority` its requests ask for; `None`: the tenant's default.
    pub priority: Option<i32>,
}

/// The tenants of `--tenant-mix`: `NAME:KEY:RATE[:PRIORITY]`, comma separated, e.g.
/// `batch:sk-batch:20:-1,search:sk-search:2`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TenantMix {
    /// The tenants, in the order given.
    pub tenants: Vec<TenantLoad>,
}

impl FromStr for TenantMix {
    type Err = String;

    fn from_str(spec: &str) -> Result<Self, String> {
        let mut tenants: Vec<TenantLoad> = Vec::new();
        for entry in spec.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let parts: Vec<&str> = entry.split(':').collect();
            let bad = |why: &str| format!("tenant {entry:?}: {why} (NAME:KEY:RATE[:PRIORITY])");
            let (name, key, rate) = match parts.as_slice() {
                [name, key, rate] | [name, key, rate, _] => (*name, *key, *rate),
                _ => return Err(bad("3 or 4 fields expected")),
            };
            if name.is_empty() || key.is_empty() {
                return Err(bad("empty name or key"));
            }
            let rate: f64 = rate
                .parse()
                .ok()
                .filter(|r: &f64| r.is_finite() && *r > 0.0)
                .ok_or_else(|| bad("RATE must be a number of requests per second above 0"))?;
            let priority = match parts.get(3) {
                Some(p) => Some(
                    p.parse::<i32>()
                        .map_err(|_| bad("PRIORITY must be an integer"))?,
                ),
                None => None,
            };
            if tenants.iter().any(|t| t.name == name) {
                return Err(bad("name given twice"));
            }
            tenants.push(TenantLoad {
                name: name.to_string(),
                key: key.to_string(),
                rate,
                priority,
            });
        }
        if tenants.is_empty() {
            return Err("--tenant-mix names no tenant (NAME:KEY:RATE[:PRIORITY],...)".into());
        }
        Ok(Self { tenants })
    }
}

impl TenantMix {
    /// The total arrival rate, requests per second.
    pub fn total_rate(&self) -> f64 {
        self.tenants.iter().map(|t| t.rate).sum()
    }

    /// For `n` measured requests: each one's arrival offset from the phase start and its tenant
    /// (an index into `tenants`), drawn from `seed` (see the module doc).
    pub fn schedule(&self, seed: u64, arrivals_stream: u64, n: usize) -> Vec<(Duration, usize)> {
        let total = self.total_rate();
        let mut gaps = SplitMix64::new(derive_seed(seed, arrivals_stream));
        let mut picks = SplitMix64::new(derive_seed(seed, TENANT_STREAM));
        let mut t = 0.0;
        (0..n)
            .map(|i| {
                if i > 0 {
                    t += gaps.exponential(total);
                }
                let mut u = picks.next_f64() * total;
                let tenant = self
                    .tenants
                    .iter()
                    .position(|x| {
                        u -= x.rate;
                        u < 0.0
                    })
                    .unwrap_or(self.tenants.len() - 1);
                (Duration::from_secs_f64(t), tenant)
            })
            .collect()
    }
}

/// Each tenant's summary of `records` (those whose `tenant` is set) over `duration_s`.
pub fn summarize(
    mix: &TenantMix,
    records: &[RequestRecord],
    duration_s: f64,
) -> Vec<TenantSummary> {
    mix.tenants
        .iter()
        .map(|t| {
            let mine: Vec<&RequestRecord> = records
                .iter()
                .filter(|r| r.tenant.as_deref() == Some(t.name.as_str()))
                .collect();
            let refused = mine
                .iter()
                .filter(|r| {
                    r.error
                        .as_ref()
                        .is_some_and(|e| e.code == "RESOURCE_EXHAUSTED")
                })
                .count();
            let succeeded = mine.iter().filter(|r| r.error.is_none()).count();
            let mut ttft: Vec<f64> = mine
                .iter()
                .filter(|r| r.error.is_none())
                .filter_map(|r| r.ttft_ms)
                .collect();
            ttft.sort_by(f64::total_cmp);
            let mut itl: Vec<f64> = mine
                .iter()
                .filter(|r| r.error.is_none())
                .flat_map(|r| r.itl_ms.iter().copied())
                .collect();
            itl.sort_by(f64::total_cmp);
            let generated: u64 = mine
                .iter()
                .filter(|r| r.error.is_none())
                .map(|r| u64::from(r.generated_tokens))
                .sum();
            TenantSummary {
                name: t.name.clone(),
                requests: mine.len(),
                succeeded,
                refused,
                failed: mine.len() - succeeded - refused,
                ttft_p50_ms: percentile(&ttft, 50.0),
                ttft_p99_ms: percentile(&ttft, 99.0),
                itl_p50_ms: percentile(&itl, 50.0),
                itl_p99_ms: percentile(&itl, 99.0),
                generated_tokens_per_s: generated as f64 / duration_s.max(1e-9),
            }
        })
        .collect()
}

/// The per-tenant table, one line per tenant.
pub fn render(summaries: &[TenantSummary]) -> String {
    let ms = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}"));
    let mut out = String::from(
        "tenant            requests  served  refused  failed  TTFT p50 ms  TTFT p99 ms  ITL p50 ms  ITL p99 ms  gen tok/s\n",
    );
    for s in summaries {
        out.push_str(&format!(
            "{:<16} {:>9} {:>7} {:>8} {:>7} {:>12} {:>12} {:>11} {:>11} {:>10.1}\n",
            s.name,
            s.requests,
            s.succeeded,
            s.refused,
            s.failed,
            ms(s.ttft_p50_ms),
            ms(s.ttft_p99_ms),
            ms(s.itl_p50_ms),
            ms(s.itl_p99_ms),
            s.generated_tokens_per_s
        ));
    }
    out.trim_end().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spec_parses_and_bad_ones_are_named() {
        let mix: TenantMix = "batch:sk-b:20:-1, search:sk-s:2".parse().unwrap();
        assert_eq!(mix.tenants.len(), 2);
        assert_eq!(mix.tenants[0].priority, Some(-1));
        assert_eq!(mix.tenants[1].priority, None);
        assert_eq!(mix.total_rate(), 22.0);
        for (bad, needle) in [
            ("a:k", "3 or 4 fields"),
            ("a:k:0", "above 0"),
            ("a:k:x", "RATE"),
            ("a:k:1:high", "PRIORITY"),
            ("a:k:1,a:j:2", "twice"),
            (":k:1", "empty"),
            ("", "no tenant"),
        ] {
            let e = bad.parse::<TenantMix>().unwrap_err();
            assert!(e.contains(needle), "{bad}: {e}");
        }
        // The key never reaches the JSON.
        let json = serde_json::to_string(&mix).unwrap();
        assert!(!json.contains("sk-b"), "{json}");
    }

    #[test]
    fn arrivals_split_by_rate_and_repeat_with_the_seed() {
        let mix: TenantMix = "a:ka:9,b:kb:1".parse().unwrap();
        let schedule = mix.schedule(7, 99, 4000);
        assert_eq!(schedule, mix.schedule(7, 99, 4000));
        let b = schedule.iter().filter(|(_, t)| *t == 1).count();
        assert!(
            (300..500).contains(&b),
            "{b} of 4000 for a rate share of 10 %"
        );
        // The total rate: 4000 arrivals at 10/s take about 400 s.
        let last = schedule.last().unwrap().0.as_secs_f64();
        assert!((360.0..440.0).contains(&last), "{last}");
        assert!(schedule.windows(2).all(|w| w[0].0 <= w[1].0));
    }

    #[test]
    fn a_tenants_ttft_percentiles_are_over_its_own_requests() {
        // `percentile` takes percent: p50 and p99 of 1..=100 ms, not p0.5 and p0.99.
        let mix: TenantMix = "a:key-a:1,b:key-b:1".parse().unwrap();
        let mut records: Vec<_> = (1..=100)
            .map(|i| {
                let mut r = crate::bench::report::tests::record(i, i as f64, 1000.0, 4);
                r.tenant = Some("a".into());
                r
            })
            .collect();
        let mut b = crate::bench::report::tests::record(100, 5000.0, 6000.0, 4);
        b.tenant = Some("b".into());
        records.push(b);
        let s = summarize(&mix, &records, 10.0);
        assert_eq!((s[0].requests, s[1].requests), (100, 1));
        assert!((s[0].ttft_p50_ms.unwrap() - 50.5).abs() < 1e-9);
        assert!((s[0].ttft_p99_ms.unwrap() - 99.01).abs() < 1e-9);
        // ITL: each record's gaps are (e2e - ttft) / (tokens - 1), over the tenant's own requests.
        assert!((s[1].itl_p50_ms.unwrap() - 1000.0 / 3.0).abs() < 1e-9);
        assert!((s[1].itl_p99_ms.unwrap() - 1000.0 / 3.0).abs() < 1e-9);
        assert!(s[0].itl_p99_ms.unwrap() > s[0].itl_p50_ms.unwrap());
        assert_eq!(s[1].ttft_p99_ms, Some(5000.0));
    }
}
