//! Per-request records, the run summary (throughput, latency percentiles, errors) and the JSON
//! report.
//!
//! Definitions (all times client-side, in milliseconds unless the name says otherwise):
//! - a request is *sent* when the bench calls `Generate` (after it got a concurrency slot);
//! - TTFT: sent -> the first streamed message carrying at least one token;
//! - E2E: sent -> the end of the stream;
//! - ITL: the gaps between consecutive tokens as received. A message carrying k tokens that arrives
//!   g ms after the previous token-carrying message contributes k gaps of g / k each; the extra
//!   tokens of the first message (beyond the first token) contribute zero gaps. A request with G
//!   tokens thus gives G - 1 gaps whose mean is its TPOT;
//! - TPOT: per request, (E2E - TTFT) / (G - 1), for requests with G >= 2 tokens.
//!
//! Throughputs divide totals over the *successful* requests by the wall time of the measured phase
//! (first request sent -> last request finished).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use super::stats::Distribution;

/// Version tag of the JSON report layout.
pub const SCHEMA: &str = "smollm-serve.bench.v1";

/// Inter-token gaps (ms) from the arrivals of one request's token-carrying messages:
/// `(arrival time in ms, tokens in the message)`, in order. Messages without tokens are skipped.
/// See the [module docs](self) for the rule.
pub fn inter_token_gaps(arrivals: &[(f64, usize)]) -> Vec<f64> {
    let mut gaps = Vec::new();
    let mut previous: Option<f64> = None;
    for &(at, tokens) in arrivals.iter().filter(|(_, k)| *k > 0) {
        match previous {
            None => gaps.extend(std::iter::repeat_n(0.0, tokens - 1)),
            Some(prev) => gaps.extend(std::iter::repeat_n((at - prev) / tokens as f64, tokens)),
        }
        previous = Some(at);
    }
    gaps
}

/// Why a request failed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RequestError {
    /// The gRPC status code name (`"UNAVAILABLE"`, `"INVALID_ARGUMENT"`, ...). A request that ran
    /// past `--timeout-secs` is `"DEADLINE_EXCEEDED"`; a stream that ended without its final
    /// message (the one with usage) is `"INTERNAL"`.
    pub code: String,
    /// The status message.
    pub message: String,
}

/// The outcome of one measured request.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RequestRecord {
    /// Index within the measured phase (0-based; warmup requests are not recorded).
    pub index: usize,
    /// Its tenant's name (`--tenant-mix`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// Prompt length in tokens (exact, verified by tokenizing the prompt text).
    pub prompt_tokens: u32,
    /// The `max_new_tokens` asked for.
    pub max_new_tokens: u32,
    /// The sampling seed sent.
    pub seed: u64,
    /// Whether it carried the `--constraint`.
    pub constrained: bool,
    /// For a successful constrained request: whether its output satisfies the constraint (JSON
    /// that parses and validates, a whole-regex match, one of the choices). `None` otherwise.
    pub output_valid: Option<bool>,
    /// When the request was sent, in ms since the measured phase began.
    pub sent_at_ms: f64,
    /// Time to first token (ms); `None` when no token arrived.
    pub ttft_ms: Option<f64>,
    /// End-to-end latency (ms); `None` when the request failed.
    pub e2e_ms: Option<f64>,
    /// Generated tokens: the server's `usage.generated_tokens` when the request succeeded, the
    /// tokens streamed so far when it failed.
    pub generated_tokens: u32,
    /// Tokens received in the stream's `tokens` fields.
    pub streamed_tokens: u32,
    /// Stream messages received.
    pub messages: u32,
    /// The final message's finish reason name (`"MAX_NEW_TOKENS"`, ...); `None` when failed.
    pub finish_reason: Option<String>,
    /// The server's `usage.prompt_tokens`.
    pub server_prompt_tokens: Option<u32>,
    /// The server's `usage.queue_ms` (router arrival -> admitted by the worker).
    pub server_queue_ms: Option<f64>,
    /// The server's `usage.time_to_first_token_ms` (router arrival -> first token).
    pub server_ttft_ms: Option<f64>,
    /// The server's `usage.total_ms` (router arrival -> last message).
    pub server_total_ms: Option<f64>,
    /// The server's `usage.draft_tokens` and `usage.accepted_draft_tokens` (speculative decoding).
    pub server_draft_tokens: Option<(u32, u32)>,
    /// Why it failed; `None` on success.
    pub error: Option<RequestError>,
    /// This request's inter-token gaps (ms), see [`inter_token_gaps`]; not written to the JSON.
    #[serde(skip)]
    pub itl_ms: Vec<f64>,
}

impl RequestRecord {
    /// Whether the request succeeded.
    pub fn ok(&self) -> bool {
        self.error.is_none()
    }

    /// Time per output token after the first (ms), for a successful request with >= 2 tokens.
    pub fn tpot_ms(&self) -> Option<f64> {
        match (self.ok(), self.ttft_ms, self.e2e_ms, self.streamed_tokens) {
            (true, Some(ttft), Some(e2e), n) if n >= 2 => Some((e2e - ttft) / (n - 1) as f64),
            _ => None,
        }
    }
}

/// Failures with one status code.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ErrorCount {
    /// How many requests failed with this code.
    pub count: usize,
    /// The message of the lowest-index request that failed with it.
    pub first_message: String,
}

/// Aggregates of the measured phase.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    /// Requests measured.
    pub requests: usize,
    /// Requests that finished with a final message.
    pub succeeded: usize,
    /// Requests that failed.
    pub failed: usize,
    /// Wall time of the measured phase, in seconds.
    pub duration_s: f64,
    /// Successful requests per second.
    pub requests_per_s: f64,
    /// Prompt tokens of the successful requests (the server's count).
    pub prompt_tokens: u64,
    /// Generated tokens of the successful requests (the server's count).
    pub generated_tokens: u64,
    /// `prompt_tokens / duration_s`.
    pub prompt_tokens_per_s: f64,
    /// `generated_tokens / duration_s` (aggregate output throughput).
    pub generated_tokens_per_s: f64,
    /// Time to first token over successful requests (ms).
    pub ttft_ms: Distribution,
    /// Inter-token latency over all gaps of successful requests (ms).
    pub itl_ms: Distribution,
    /// Time per output token over successful requests with >= 2 tokens (ms).
    pub tpot_ms: Distribution,
    /// End-to-end latency over successful requests (ms).
    pub e2e_ms: Distribution,
    /// Speculative decoding over the successful requests: draft tokens proposed and accepted.
    pub draft_tokens: u64,
    /// Of `draft_tokens`, those accepted.
    pub accepted_draft_tokens: u64,
    /// Successful requests by finish reason.
    pub finish_reasons: BTreeMap<String, usize>,
    /// Failed requests by gRPC status code name.
    pub errors: BTreeMap<String, ErrorCount>,
}

impl Summary {
    /// Summarizes `records` (any order) of a phase that took `duration_s` seconds.
    pub fn from_records(records: &[RequestRecord], duration_s: f64) -> Summary {
        let mut sorted: Vec<&RequestRecord> = records.iter().collect();
        sorted.sort_by_key(|r| r.index);
        let ok: Vec<&RequestRecord> = sorted.iter().copied().filter(|r| r.ok()).collect();
        let prompt_tokens: u64 = ok
            .iter()
            .map(|r| r.server_prompt_tokens.unwrap_or(r.prompt_tokens) as u64)
            .sum();
        let generated_tokens: u64 = ok.iter().map(|r| r.generated_tokens as u64).sum();
        let per_s = |x: f64| {
            if duration_s > 0.0 {
                x / duration_s
            } else {
                0.0
            }
        };
        let collect = |f: &dyn Fn(&RequestRecord) -> Option<f64>| -> Vec<f64> {
            ok.iter().filter_map(|r| f(r)).collect()
        };
        let itl: Vec<f64> = ok.iter().flat_map(|r| r.itl_ms.iter().copied()).collect();
        let mut finish_reasons = BTreeMap::new();
        for r in &ok {
            let reason = r.finish_reason.clone().unwrap_or_else(|| "UNKNOWN".into());
            *finish_reasons.entry(reason).or_insert(0) += 1;
        }
        let mut errors: BTreeMap<String, ErrorCount> = BTreeMap::new();
        for e in sorted.iter().filter_map(|r| r.error.as_ref()) {
            errors
                .entry(e.code.clone())
                .or_insert_with(|| ErrorCount {
                    count: 0,
                    first_message: e.message.clone(),
                })
                .count += 1;
        }
        let drafts = |pick: fn((u32, u32)) -> u32| -> u64 {
            ok.iter()
                .filter_map(|r| r.server_draft_tokens)
                .map(|d| pick(d) as u64)
                .sum()
        };
        Summary {
            draft_tokens: drafts(|d| d.0),
            accepted_draft_tokens: drafts(|d| d.1),
            requests: records.len(),
            succeeded: ok.len(),
            failed: records.len() - ok.len(),
            duration_s,
            requests_per_s: per_s(ok.len() as f64),
            prompt_tokens,
            generated_tokens,
            prompt_tokens_per_s: per_s(prompt_tokens as f64),
            generated_tokens_per_s: per_s(generated_tokens as f64),
            ttft_ms: Distribution::from_samples(&collect(&|r| r.ttft_ms)),
            itl_ms: Distribution::from_samples(&itl),
            tpot_ms: Distribution::from_samples(&collect(&|r| r.tpot_ms())),
            e2e_ms: Distribution::from_samples(&collect(&|r| r.e2e_ms)),
            finish_reasons,
            errors,
        }
    }

    /// The human-readable result table.
    pub fn render(&self, label: &str) -> String {
        let mut s = String::new();
        let rule = "=".repeat(72);
        let _ = writeln!(s, "{rule}");
        if !label.is_empty() {
            let _ = writeln!(s, "label:               {label}");
        }
        let _ = writeln!(
            s,
            "requests:            {} ok, {} failed, {:.2} s",
            self.succeeded, self.failed, self.duration_s
        );
        let _ = writeln!(s, "request throughput:  {:.2} req/s", self.requests_per_s);
        let _ = writeln!(
            s,
            "prompt tokens:       {} ({:.1} tok/s)",
            self.prompt_tokens, self.prompt_tokens_per_s
        );
        let _ = writeln!(
            s,
            "generated tokens:    {} ({:.1} tok/s)",
            self.generated_tokens, self.generated_tokens_per_s
        );
        let _ = writeln!(
            s,
            "{:<12}{:>10}{:>10}{:>10}{:>10}{:>10}{:>10}",
            "latency ms", "mean", "p50", "p90", "p95", "p99", "max"
        );
        for (name, d) in [
            ("TTFT", &self.ttft_ms),
            ("ITL", &self.itl_ms),
            ("TPOT", &self.tpot_ms),
            ("E2E", &self.e2e_ms),
        ] {
            let cell = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{v:.2}"));
            let _ = writeln!(
                s,
                "{name:<12}{:>10}{:>10}{:>10}{:>10}{:>10}{:>10}",
                cell(d.mean),
                cell(d.p50),
                cell(d.p90),
                cell(d.p95),
                cell(d.p99),
                cell(d.max)
            );
        }
        let reasons: Vec<String> = self
            .finish_reasons
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let reasons = if reasons.is_empty() {
            "-".to_string()
        } else {
            reasons.join(" ")
        };
        let _ = writeln!(s, "finish reasons:      {reasons}");
        if self.draft_tokens > 0 {
            let _ = writeln!(
                s,
                "speculation:         {} drafted, {} accepted (acceptance rate {:.1}%)",
                self.draft_tokens,
                self.accepted_draft_tokens,
                100.0 * self.accepted_draft_tokens as f64 / self.draft_tokens as f64
            );
        }
        if self.errors.is_empty() {
            let _ = writeln!(s, "errors:              none");
        } else {
            let _ = writeln!(s, "errors:");
            for (code, e) in &self.errors {
                let _ = writeln!(s, "  {code} x{}: {}", e.count, e.first_message);
            }
        }
        let _ = write!(s, "{rule}");
        s
    }
}

/// Structured-output runs (`--constraint`): the constrained and the unconstrained requests
/// summarized apart (their throughputs are each subset's tokens over the whole phase's wall time,
/// so the two add up to the run's), and the constrained outputs checked.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ConstrainedSummary {
    /// The requests that carried the constraint.
    pub constrained: Summary,
    /// The others.
    pub unconstrained: Summary,
    /// Successful constrained requests whose output satisfies the constraint.
    pub valid_outputs: usize,
    /// Successful constrained requests whose output does not (truncated ones included).
    pub invalid_outputs: usize,
    /// Successful constrained requests ended by their token budget (`MAX_NEW_TOKENS`,
    /// `CONTEXT_LENGTH`, OpenAI's `length`) rather than by completing the constraint.
    pub truncated_outputs: usize,
}

impl ConstrainedSummary {
    /// Splits `records` of a phase that took `duration_s` seconds.
    pub fn from_records(records: &[RequestRecord], duration_s: f64) -> ConstrainedSummary {
        let (constrained, unconstrained): (Vec<RequestRecord>, Vec<RequestRecord>) =
            records.iter().cloned().partition(|r| r.constrained);
        let truncated = ["MAX_NEW_TOKENS", "CONTEXT_LENGTH", "length"];
        ConstrainedSummary {
            valid_outputs: constrained
                .iter()
                .filter(|r| r.output_valid == Some(true))
                .count(),
            invalid_outputs: constrained
                .iter()
                .filter(|r| r.output_valid == Some(false))
                .count(),
            truncated_outputs: constrained
                .iter()
                .filter(|r| r.ok())
                .filter(|r| {
                    r.finish_reason
                        .as_deref()
                        .is_some_and(|f| truncated.contains(&f))
                })
                .count(),
            constrained: Summary::from_records(&constrained, duration_s),
            unconstrained: Summary::from_records(&unconstrained, duration_s),
        }
    }

    /// The lines added to the text report.
    pub fn render(&self) -> String {
        let line = |name: &str, s: &Summary| {
            let p50 = |d: &super::stats::Distribution| {
                d.p50.map_or("-".to_string(), |v| format!("{v:.2}"))
            };
            format!(
                "{name:<14} {} ok, {} failed, {} tokens ({:.1} tok/s), TTFT p50 {} ms, \
                 ITL p50 {} ms, E2E p50 {} ms\n",
                s.succeeded,
                s.failed,
                s.generated_tokens,
                s.generated_tokens_per_s,
                p50(&s.ttft_ms),
                p50(&s.itl_ms),
                p50(&s.e2e_ms)
            )
        };
        let mut out = line("constrained:", &self.constrained);
        out += &line("unconstrained:", &self.unconstrained);
        out += &format!(
            "constrained outputs: {} valid, {} invalid ({} truncated by the token budget)",
            self.valid_outputs, self.invalid_outputs, self.truncated_outputs
        );
        out
    }
}

/// The JSON document `--json` writes.
#[derive(Debug, Clone, Serialize)]
pub struct Report<C: Serialize> {
    /// [`SCHEMA`].
    pub schema: &'static str,
    /// The `--label` text.
    pub label: String,
    /// The router address; empty with `--worker` (the worker address is `config.worker`).
    pub router: String,
    /// The served model's name (`ModelInfo.model_name`).
    pub model: String,
    /// The model's context length in tokens.
    pub max_context_tokens: u32,
    /// When the measured phase began, in ms since the Unix epoch.
    pub started_unix_ms: u64,
    /// The settings of the run (the command-line flags).
    pub config: C,
    /// The aggregates.
    pub summary: Summary,
    /// With `--constraint`: the constrained and unconstrained requests apart.
    pub constrained: Option<ConstrainedSummary>,
    /// With `--worker-metrics`: the worker's mask time during the measured phase.
    pub mask_time: Option<super::mask_time::MaskTime>,
    /// With `--tenant-mix`: each tenant's figures.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenants: Option<Vec<TenantSummary>>,
    /// Every measured request, by index.
    pub requests: Vec<RequestRecord>,
}

/// What one tenant of `--tenant-mix` got in the measured phase ([`super::tenant_mix::summarize`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TenantSummary {
    /// The tenant's name.
    pub name: String,
    /// Its requests sent.
    pub requests: usize,
    /// Served to the end.
    pub succeeded: usize,
    /// Refused with `RESOURCE_EXHAUSTED` (its quotas, a full queue, displaced).
    pub refused: usize,
    /// Failed otherwise.
    pub failed: usize,
    /// TTFT of its served requests, ms (p50, p99); `None` without any.
    pub ttft_p50_ms: Option<f64>,
    /// See `ttft_p50_ms`.
    pub ttft_p99_ms: Option<f64>,
    /// Inter-token latency over its served requests' gaps, ms (p50, p99); `None` without any.
    pub itl_p50_ms: Option<f64>,
    /// See `itl_p50_ms`.
    pub itl_p99_ms: Option<f64>,
    /// Its generated tokens per second of the measured phase.
    pub generated_tokens_per_s: f64,
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A successful record of `tokens` generated tokens with these latencies (ms).
    pub(crate) fn record(index: usize, ttft: f64, e2e: f64, tokens: u32) -> RequestRecord {
        RequestRecord {
            index,
            tenant: None,
            prompt_tokens: 10,
            max_new_tokens: tokens,
            seed: 0,
            constrained: false,
            output_valid: None,
            sent_at_ms: 0.0,
            ttft_ms: Some(ttft),
            e2e_ms: Some(e2e),
            generated_tokens: tokens,
            streamed_tokens: tokens,
            messages: tokens + 1,
            finish_reason: Some("MAX_NEW_TOKENS".into()),
            server_prompt_tokens: Some(10),
            server_queue_ms: Some(0.0),
            server_ttft_ms: Some(ttft),
            server_total_ms: Some(e2e),
            server_draft_tokens: Some((4, 3)),
            error: None,
            itl_ms: vec![(e2e - ttft) / (tokens - 1) as f64; tokens as usize - 1],
        }
    }

    fn failed(index: usize, code: &str, message: &str) -> RequestRecord {
        RequestRecord {
            ttft_ms: None,
            e2e_ms: None,
            generated_tokens: 0,
            streamed_tokens: 0,
            finish_reason: None,
            server_prompt_tokens: None,
            error: Some(RequestError {
                code: code.into(),
                message: message.into(),
            }),
            itl_ms: Vec::new(),
            ..record(index, 0.0, 0.0, 2)
        }
    }

    #[test]
    fn gaps_are_split_evenly_within_a_message() {
        // One token at 10, two at 30, none at 35 (final message), one at 40.
        let gaps = inter_token_gaps(&[(10.0, 1), (30.0, 2), (35.0, 0), (40.0, 1)]);
        assert_eq!(gaps, vec![10.0, 10.0, 10.0]);
        // Three tokens in the first message: two zero gaps; then one 6 ms gap.
        assert_eq!(
            inter_token_gaps(&[(5.0, 3), (11.0, 1)]),
            vec![0.0, 0.0, 6.0]
        );
        assert!(inter_token_gaps(&[(1.0, 0)]).is_empty());
        assert!(inter_token_gaps(&[(1.0, 1)]).is_empty());
    }

    #[test]
    fn gaps_average_to_tpot() {
        let arrivals = [(100.0, 1), (120.0, 3), (121.0, 0), (150.0, 2), (160.0, 1)];
        let gaps = inter_token_gaps(&arrivals);
        assert_eq!(gaps.len(), 6);
        let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
        assert!((mean - (160.0 - 100.0) / 6.0).abs() < 1e-12);
    }

    #[test]
    fn summary_counts_throughput_and_errors() {
        let records = vec![
            record(0, 10.0, 110.0, 11),
            failed(3, "UNAVAILABLE", "no worker"),
            record(1, 20.0, 220.0, 11),
            failed(2, "UNAVAILABLE", "worker went away"),
            failed(4, "DEADLINE_EXCEEDED", "timeout"),
        ];
        let s = Summary::from_records(&records, 2.0);
        assert_eq!((s.requests, s.succeeded, s.failed), (5, 2, 3));
        assert_eq!(s.generated_tokens, 22);
        assert_eq!(s.prompt_tokens, 20);
        assert_eq!(s.generated_tokens_per_s, 11.0);
        assert_eq!(s.requests_per_s, 1.0);
        assert_eq!(s.ttft_ms.count, 2);
        assert_eq!(s.ttft_ms.p50, Some(15.0));
        assert_eq!(s.tpot_ms.p50, Some(15.0));
        assert_eq!(s.itl_ms.count, 20);
        assert_eq!(s.e2e_ms.max, Some(220.0));
        assert_eq!(s.finish_reasons["MAX_NEW_TOKENS"], 2);
        assert_eq!(s.errors["UNAVAILABLE"].count, 2);
        assert_eq!(s.errors["UNAVAILABLE"].first_message, "worker went away");
        assert_eq!(s.errors["DEADLINE_EXCEEDED"].count, 1);
        let text = s.render("run A");
        assert!(text.contains("2 ok, 3 failed"), "{text}");
        assert!(text.contains("UNAVAILABLE x2: worker went away"), "{text}");
        // Only the successful requests' draft counts: 2 x (4 drafted, 3 accepted).
        assert_eq!((s.draft_tokens, s.accepted_draft_tokens), (8, 6));
        assert!(
            text.contains("8 drafted, 6 accepted (acceptance rate 75.0%)"),
            "{text}"
        );
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["errors"]["UNAVAILABLE"]["count"], 2);
        assert_eq!(
            json["ttft_ms"]["p99"],
            serde_json::json!(s.ttft_ms.p99.unwrap())
        );
    }

    #[test]
    fn empty_summary_has_null_percentiles() {
        let s = Summary::from_records(&[failed(0, "INTERNAL", "x")], 0.0);
        assert_eq!(s.requests_per_s, 0.0);
        assert!(s.ttft_ms.p50.is_none());
        assert!(s.render("").contains("-"));
    }

    #[test]
    fn constrained_requests_are_summarized_apart() {
        let mut records = vec![
            record(0, 10.0, 110.0, 11),
            record(1, 10.0, 50.0, 5),
            record(2, 10.0, 110.0, 11),
            record(3, 10.0, 60.0, 6),
            failed(4, "INTERNAL", "x"),
        ];
        for (r, valid) in records.iter_mut().skip(1).step_by(2).zip([true, false]) {
            r.constrained = true;
            r.output_valid = Some(valid);
            r.finish_reason = Some(
                if valid {
                    "CONSTRAINT_COMPLETE"
                } else {
                    "MAX_NEW_TOKENS"
                }
                .into(),
            );
        }
        let c = ConstrainedSummary::from_records(&records, 1.0);
        assert_eq!((c.constrained.requests, c.constrained.succeeded), (2, 2));
        assert_eq!((c.unconstrained.requests, c.unconstrained.failed), (3, 1));
        assert_eq!(c.constrained.generated_tokens, 11);
        assert_eq!(c.unconstrained.generated_tokens, 22);
        assert_eq!(c.constrained.generated_tokens_per_s, 11.0);
        assert_eq!(
            (c.valid_outputs, c.invalid_outputs, c.truncated_outputs),
            (1, 1, 1)
        );
        let text = c.render();
        assert!(text.contains("1 valid, 1 invalid (1 truncated"), "{text}");
    }
}
