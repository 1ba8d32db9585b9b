//! The model-server metrics of the Kubernetes Gateway API Inference Extension (GIE): what its
//! endpoint picker scrapes from each model server to pick one (protocol:
//! gateway-api-inference-extension `docs/proposals/003-model-server-protocol/README.md`). Encoded
//! with the worker's other metrics at `GET /metrics` on `metrics_listen`; the picker is pointed at
//! them by its metric flags (the Helm chart's GIE profile sets them):
//!
//! | GIE metric | type | name here | picker flag |
//! |---|---|---|---|
//! | TotalQueuedRequests | gauge | `worker_waiting_sequences` | `--total-queued-requests-metric` |
//! | TotalRunningRequests | gauge | `worker_running_sequences` | `--total-running-requests-metric` |
//! | KVCacheUtilization | gauge, a fraction in [0, 1] | `worker_kv_cache_usage_ratio` | `--kv-cache-usage-percentage-metric` |
//! | BlockSize (optional) | labelled, vLLM's info format | `worker_cache_config_info{block_size, num_gpu_blocks}` = 1 | `--cache-info-metric` |
//!
//! The two queue gauges are the worker's general ones (encoded in [`crate::metrics`]); this module
//! adds the two that exist for the picker.

use engine::EngineStats;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;

/// Fraction of the KV cache's blocks in use, in [0, 1] (0 for an empty pool).
pub fn kv_cache_usage(stats: &EngineStats) -> f64 {
    if stats.kv_blocks_total == 0 {
        return 0.0;
    }
    (stats.kv_blocks_used as f64 / stats.kv_blocks_total as f64).clamp(0.0, 1.0)
}

/// Encodes `kv_cache_usage_ratio` and `cache_config_info` of `stats` (the registry adds the
/// `worker_` prefix).
pub fn encode(e: &mut DescriptorEncoder, stats: &EngineStats) -> std::fmt::Result {
    let usage = ConstGauge::new(kv_cache_usage(stats));
    usage.encode(e.encode_descriptor(
        "kv_cache_usage_ratio",
        "Fraction of KV cache blocks in use, 0 to 1 (GIE KVCacheUtilization)",
        None,
        usage.metric_type(),
    )?)?;
    let info = ConstGauge::new(1i64);
    let mut family = e.encode_descriptor(
        "cache_config_info",
        "KV cache configuration in labels: block_size (tokens per block) and num_gpu_blocks \
         (blocks in the pool); always 1 (GIE BlockSize, vLLM's cache_config_info format)",
        None,
        info.metric_type(),
    )?;
    let block_size = stats.kv_block_size.to_string();
    let blocks = stats.kv_blocks_total.to_string();
    let labels = [
        ("block_size", block_size.as_str()),
        ("num_gpu_blocks", blocks.as_str()),
    ];
    info.encode(family.encode_family(&labels)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_is_a_fraction_of_the_pool() {
        let mut stats = EngineStats::default();
        assert_eq!(kv_cache_usage(&stats), 0.0);
        stats.kv_blocks_total = 200;
        stats.kv_blocks_used = 50;
        assert_eq!(kv_cache_usage(&stats), 0.25);
        stats.kv_blocks_used = 200;
        assert_eq!(kv_cache_usage(&stats), 1.0);
    }
}
