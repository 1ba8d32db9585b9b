//! The worker's Prometheus metrics, served as OpenMetrics text at `GET /metrics` on
//! `metrics_listen`.
//!
//! Read from the engine's published [`EngineStats`] at each scrape (never waiting for a step): gauges `worker_running_sequences`,
//! `worker_waiting_sequences`, `worker_kv_blocks_capacity` (named so because a `_total` suffix means a counter), `worker_kv_blocks_used`,
//! `worker_kv_blocks_free`, `worker_kv_block_size`, `worker_kv_tokens_used`,
//! `worker_kv_tokens_capacity`, `worker_prefix_cache_blocks`, `worker_last_batch_tokens`,
//! `worker_last_batch_sequences`, `worker_held_sequences`, `worker_serving`, `worker_draining`; counters
//! `worker_steps_total`, `worker_prompt_tokens_total`, `worker_generated_tokens_total`,
//! `worker_preemptions_total`, `worker_prefix_cache_query_tokens_total`,
//! `worker_prefix_cache_hit_tokens_total`, `worker_finished_requests_total`,
//! `worker_cancelled_requests_total`, `worker_failed_requests_total`; and the Gateway API Inference
//! Extension's gauges `worker_kv_cache_usage_ratio` and `worker_cache_config_info`
//! ([`crate::gie_metrics`]).
//!
//! Unprefixed: the standard `process_*` metrics and `build_info{component="worker",version,commit}`
//! (`observability::process_metrics`).
//!
//! Speculative decoding, labelled `proposer`: counters `worker_speculative_draft_tokens_total` and
//! `worker_speculative_accepted_tokens_total`, histogram `worker_speculative_accepted_per_step`.
//!
//! Structured output: histogram `worker_constraint_mask_seconds`, the time to compute one constrained
//! sequence's allowed-token mask (observed by the engine for every mask, see `engine::masks`).
//!
//! Per engine step ([`WorkerMetrics::sample_steps`]): histograms `worker_step_duration_seconds`,
//! `worker_batch_tokens` and `worker_batch_sequences`. The sampler asks the engine for its stats
//! again as soon as the previous answer arrived (at most every millisecond); the engine answers
//! between steps, so consecutive answers are one step apart and their spacing is the step's
//! duration. When steps are shorter than the sampling period, each sample records the average
//! duration of the steps it spans and the batch of the last one.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use observability::const_metrics::{counter, gauge};
use observability::process_metrics::{self, BuildInfo, ProcessMetrics};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::health::Lifecycle;
use engine::{EngineHandle, EngineStats};

/// Sampling period while the engine has work, and while it is idle.
const BUSY_PERIOD: Duration = Duration::from_millis(1);
const IDLE_PERIOD: Duration = Duration::from_millis(10);

/// The worker's metrics.
pub struct WorkerMetrics {
    registry: Registry,
    engine: EngineHandle,
    snapshot: Arc<Mutex<Option<EngineStats>>>,
    step_duration: Histogram,
    batch_tokens: Histogram,
    batch_sequences: Histogram,
    process: ProcessMetrics,
}

impl std::fmt::Debug for WorkerMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerMetrics").finish_non_exhaustive()
    }
}

impl WorkerMetrics {
    /// Metrics of `engine`, with the health state of `lifecycle`.
    pub fn new(engine: EngineHandle, lifecycle: Arc<Lifecycle>) -> Arc<Self> {
        let mut registry = Registry::with_prefix("worker");
        let step_duration = Histogram::new([
            0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
        ]);
        let batch_tokens = Histogram::new(exponential_buckets(1.0, 2.0, 14));
        let batch_sequences = Histogram::new(exponential_buckets(1.0, 2.0, 10));
        registry.register(
            "step_duration_seconds",
            "Duration of one engine step (schedule, forward, sample)",
            step_duration.clone(),
        );
        registry.register(
            "batch_tokens",
            "Tokens in an engine step's batch (decodes plus prefill chunks)",
            batch_tokens.clone(),
        );
        registry.register(
            "batch_sequences",
            "Sequences in an engine step's batch",
            batch_sequences.clone(),
        );
        registry.register(
            "constraint_mask_seconds",
            "Time to compute one constrained sequence's allowed-token mask (structured output)",
            engine::mask_seconds(),
        );
        registry.register(
            "speculative_draft_tokens",
            "Draft tokens proposed for speculative decoding, by proposer",
            engine::speculation::metrics::draft_tokens(),
        );
        registry.register(
            "speculative_accepted_tokens",
            "Draft tokens accepted by verification (committed without a step of their own), by proposer",
            engine::speculation::metrics::accepted_tokens(),
        );
        registry.register(
            "speculative_accepted_per_step",
            "Draft tokens accepted per verification of one sequence, by proposer",
            engine::speculation::metrics::accepted_per_step(),
        );
        let snapshot = Arc::new(Mutex::new(None));
        registry.register_collector(Box::new(StatsCollector {
            snapshot: snapshot.clone(),
            lifecycle,
        }));
        Arc::new(Self {
            registry,
            engine,
            snapshot,
            step_duration,
            batch_tokens,
            batch_sequences,
            process: ProcessMetrics::new(BuildInfo {
                component: "worker",
                version: build_info::PACKAGE_VERSION,
                commit: build_info::COMMIT,
            }),
        })
    }

    /// Fetches the engine's stats and renders every metric as OpenMetrics text.
    pub async fn render(&self) -> String {
        // The engine's published state: a running step never delays a scrape (once the engine has
        // stopped it holds the last values).
        *self.snapshot.lock().expect("stats lock") = Some(self.engine.snapshot().stats);
        process_metrics::render(&self.registry, &self.process)
    }

    /// Records step durations and batch sizes until the engine stops (see the module doc).
    pub async fn sample_steps(self: Arc<Self>) {
        let mut previous: Option<(EngineStats, Instant)> = None;
        loop {
            let Some(stats) = self.engine.stats().await else {
                return;
            };
            let now = Instant::now();
            if let Some((before, at)) = &previous {
                let steps = stats.steps.saturating_sub(before.steps);
                if steps > 0 {
                    self.batch_tokens.observe(stats.last_batch_tokens.into());
                    self.batch_sequences
                        .observe(stats.last_batch_sequences.into());
                    // Only when the engine had work all along (no idle time in the interval).
                    if before.running_sequences + before.waiting_sequences > 0 {
                        let per_step = now.duration_since(*at).as_secs_f64() / steps as f64;
                        for _ in 0..steps.min(1_000) {
                            self.step_duration.observe(per_step);
                        }
                    }
                }
            }
            let busy = stats.running_sequences + stats.waiting_sequences > 0;
            previous = Some((stats, now));
            tokio::time::sleep(if busy { BUSY_PERIOD } else { IDLE_PERIOD }).await;
        }
    }
}

/// Encodes the last [`EngineStats`] snapshot and the health state.
struct StatsCollector {
    snapshot: Arc<Mutex<Option<EngineStats>>>,
    lifecycle: Arc<Lifecycle>,
}

impl std::fmt::Debug for StatsCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatsCollector").finish_non_exhaustive()
    }
}

impl Collector for StatsCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> std::fmt::Result {
        let lc = &self.lifecycle;
        gauge(
            &mut e,
            "serving",
            "Whether the worker reports SERVING",
            lc.is_serving().into(),
        )?;
        gauge(
            &mut e,
            "draining",
            "Whether the worker is draining (SIGTERM received)",
            lc.is_draining().into(),
        )?;
        let Some(s) = *self.snapshot.lock().expect("stats lock") else {
            return Ok(());
        };
        let gauges: [(&str, &str, u64); 12] = [
            (
                "running_sequences",
                "Sequences running (in the batch)",
                s.running_sequences.into(),
            ),
            (
                "waiting_sequences",
                "Sequences waiting for admission",
                s.waiting_sequences.into(),
            ),
            (
                "kv_blocks_capacity",
                "KV cache blocks in the pool",
                s.kv_blocks_total,
            ),
            (
                "kv_blocks_used",
                "KV cache blocks held by sequences",
                s.kv_blocks_used,
            ),
            ("kv_blocks_free", "KV cache blocks free", s.kv_blocks_free),
            (
                "kv_block_size",
                "Tokens per KV cache block",
                s.kv_block_size.into(),
            ),
            (
                "kv_tokens_used",
                "KV cache tokens held by live sequences",
                s.kv_tokens_used,
            ),
            (
                "kv_tokens_capacity",
                "KV cache capacity in tokens",
                s.kv_tokens_capacity,
            ),
            (
                "prefix_cache_blocks",
                "Full blocks addressable in the prefix cache",
                s.prefix_cache_blocks,
            ),
            (
                "last_batch_tokens",
                "Tokens in the last step's batch",
                s.last_batch_tokens.into(),
            ),
            (
                "last_batch_sequences",
                "Sequences in the last step's batch",
                s.last_batch_sequences.into(),
            ),
            (
                "held_sequences",
                "Sequences held because their clients stopped reading (no batch slot, no KV blocks)",
                s.held_sequences.into(),
            ),
        ];
        for (name, help, v) in gauges {
            gauge(&mut e, name, help, v as i64)?;
        }
        crate::gie_metrics::encode(&mut e, &s)?;
        let counters: [(&str, &str, u64); 9] = [
            ("steps", "Engine steps run", s.steps),
            (
                "prompt_tokens",
                "Prompt tokens of admitted requests",
                s.prompt_tokens,
            ),
            ("generated_tokens", "Tokens generated", s.generated_tokens),
            (
                "preemptions",
                "Sequences preempted (recomputed later) because the KV cache was full",
                s.preemptions,
            ),
            (
                "prefix_cache_query_tokens",
                "Prompt tokens looked up in the prefix cache",
                s.prefix_cache_query_tokens,
            ),
            (
                "prefix_cache_hit_tokens",
                "Prompt tokens found in the prefix cache (not recomputed)",
                s.prefix_cache_hit_tokens,
            ),
            (
                "finished_requests",
                "Requests that finished",
                s.finished_requests,
            ),
            (
                "cancelled_requests",
                "Requests cancelled (by the router or a closed stream)",
                s.cancelled_requests,
            ),
            (
                "failed_requests",
                "Requests rejected or failed by the worker",
                s.failed_requests,
            ),
        ];
        for (name, help, v) in counters {
            counter(&mut e, name, help, v)?;
        }
        Ok(())
    }
}
