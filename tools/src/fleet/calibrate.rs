//! Calibration of the simulator against real workers.
//!
//! # The fit ([`fit_cost`])
//!
//! On a fleet of one worker and one router, each probe alone on the worker, three times (median):
//!
//! - TTFT of a short and a long prompt with one output token: the slope is the cost per prompt
//!   token (`per_token_s`);
//! - the mean inter-token gap of 1 and of `batch` concurrent decodes: the slope per decoding
//!   sequence is `per_token_s + per_decode_s`, the intercept is the step's fixed cost
//!   (`step_base_s`).
//!
//! # The shared host ([`fit_host_cores`])
//!
//! The real fleet's W workers share this machine's cores with each other and with the routers and
//! the load generator, so the simulated replay of a real run models them as sharing a host
//! ([`super::sim::SharedHost`]). How many cores the workers effectively get is fitted once per
//! workload, on throughput only: the cores at which the simulator's saturating run (every request
//! at time 0, `round_robin`) completes requests as fast as the real one did. The latency figures
//! of the 80 % runs are then predictions, not fits.
//!
//! # The comparison ([`relative_error`])
//!
//! The same workload (the routers' token ids of the same texts, the same arrival times) runs on the
//! real fleet and in the simulator; each figure's error is `(simulated - measured) / measured`.

use std::time::Instant;

use anyhow::{ensure, Context};
use inference_proto::inference::v1::text_generation_client::TextGenerationClient;
use inference_proto::inference::v1::GenerateRequest;

use super::real::Fleet;
use super::sim::worker::CostModel;
use super::workload::{WorkloadRequest, WORDS};

/// Probe repetitions (the median is kept).
const REPEATS: usize = 3;

/// `(time to first token, mean inter-token gap)` in seconds of one request of `words` words and
/// `new` output tokens; `n` copies run concurrently (distinct prompts) and the medians are returned.
async fn probe(
    fleet: &Fleet,
    words: usize,
    new: u32,
    n: usize,
    salt: u32,
) -> anyhow::Result<(f64, f64)> {
    let addr = &fleet.routers[0];
    let client = TextGenerationClient::connect(format!("http://{addr}"))
        .await
        .with_context(|| format!("connecting to router {addr}"))?;
    let mut tasks = Vec::new();
    for k in 0..n {
        let mut client = client.clone();
        let request = WorkloadRequest {
            // A fresh prompt each time (no prefix-cache hit): word indices from the salt.
            words: (0..words as u32)
                .map(|j| {
                    (j * 7 + salt * 13 + k as u32 * 31 + j * j * (salt + 3)) % WORDS.len() as u32
                })
                .collect(),
            max_new_tokens: new,
            arrival_s: 0.0,
            after: None,
        };
        tasks.push(tokio::spawn(async move {
            let sent = Instant::now();
            let mut stream = client
                .generate(GenerateRequest {
                    prompt: request.text(),
                    max_new_tokens: Some(new),
                    ignore_eos: true,
                    ..Default::default()
                })
                .await?
                .into_inner();
            let (mut first, mut last, mut tokens) = (None, 0.0, 0usize);
            while let Some(m) = stream.message().await? {
                if !m.tokens.is_empty() {
                    let at = sent.elapsed().as_secs_f64();
                    first.get_or_insert(at);
                    last = at;
                    tokens += m.tokens.len();
                }
            }
            let first = first.unwrap_or(last);
            let gap = if tokens > 1 {
                (last - first) / (tokens - 1) as f64
            } else {
                0.0
            };
            Ok::<(f64, f64), tonic::Status>((first, gap))
        }));
    }
    let mut ttft = Vec::new();
    let mut gaps = Vec::new();
    for t in tasks {
        let (a, b) = t.await.context("a probe task panicked")??;
        ttft.push(a);
        gaps.push(b);
    }
    Ok((median(&mut ttft), median(&mut gaps)))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Fits the step cost of the (one) worker of `fleet` (see the module docs). `short`/`long`: prompt
/// lengths in words (both within one step's token budget); `batch`: concurrent decodes.
pub async fn fit_cost(
    fleet: &Fleet,
    short: usize,
    long: usize,
    batch: usize,
) -> anyhow::Result<CostModel> {
    ensure!(
        long > short && batch > 1,
        "the probes need long > short and batch > 1"
    );
    let (mut s, mut l, mut d1, mut db) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for r in 0..REPEATS as u32 {
        s.push(probe(fleet, short, 1, 1, 10 + r).await?.0);
        l.push(probe(fleet, long, 1, 1, 20 + r).await?.0);
        d1.push(probe(fleet, short, 32, 1, 30 + r).await?.1);
        db.push(probe(fleet, short, 32, batch, 40 + r).await?.1);
    }
    // Words to tokens: the probes' texts tokenize to about one token per word plus BOS.
    let per_token_s = ((median(&mut l) - median(&mut s)) / (long - short) as f64).max(0.0);
    let (g1, gb) = (median(&mut d1), median(&mut db));
    let per_seq = ((gb - g1) / (batch - 1) as f64).max(0.0);
    Ok(CostModel {
        step_base_s: (g1 - per_seq).max(0.0),
        per_token_s,
        per_decode_s: (per_seq - per_token_s).max(0.0),
    })
}

/// The cores in `[lo, hi]` at which `capacity(cores)` (the simulator's saturating requests/s, not
/// decreasing in cores) comes closest to `measured`: bisection to 0.01 cores; `lo` or `hi` when
/// `measured` lies outside what the range can give.
pub fn fit_host_cores(measured: f64, lo: f64, hi: f64, capacity: impl Fn(f64) -> f64) -> f64 {
    if capacity(lo) >= measured {
        return lo;
    }
    if capacity(hi) <= measured {
        return hi;
    }
    let (mut lo, mut hi) = (lo, hi);
    while hi - lo > 0.01 {
        let mid = 0.5 * (lo + hi);
        if capacity(mid) < measured {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    0.5 * (lo + hi)
}

/// `(simulated - measured) / measured` (0 when both are 0).
pub fn relative_error(simulated: f64, measured: f64) -> f64 {
    if measured == 0.0 {
        if simulated == 0.0 {
            0.0
        } else {
            f64::INFINITY
        }
    } else {
        (simulated - measured) / measured
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fitted_cores_give_the_measured_capacity() {
        // Capacity grows with cores up to 4 (4 single-thread workers), 1 req/s per core.
        let capacity = |cores: f64| cores.min(4.0);
        assert!((fit_host_cores(2.5, 1.0, 4.0, capacity) - 2.5).abs() < 0.01);
        assert_eq!(fit_host_cores(0.5, 1.0, 4.0, capacity), 1.0);
        assert_eq!(fit_host_cores(9.0, 1.0, 4.0, capacity), 4.0);
    }

    #[test]
    fn relative_error_is_signed_and_total() {
        assert_eq!(relative_error(1.2, 1.0), 0.19999999999999996);
        assert_eq!(relative_error(0.5, 1.0), -0.5);
        assert_eq!(relative_error(0.0, 0.0), 0.0);
        assert!(relative_error(1.0, 0.0).is_infinite());
    }
}
