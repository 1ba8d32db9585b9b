//! Whether a request can ever fit a worker's paged KV cache, checked by the router before any
//! work: a request whose whole sequence needs more KV blocks than every ready worker has is
//! refused with `INVALID_ARGUMENT` / HTTP 400 at admission, as the worker itself would refuse it
//! (`engine/src/core.rs`), but before an HTTP stream has sent its headers.

use inference_proto::worker::{AddRequest, InfoResponse};

use crate::validation::ValidationError;

/// A worker's paged KV cache, from its `Info` (`EngineStats.kv_block_size`, `kv_blocks_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvCapacity {
    /// Tokens per block.
    pub block_size: u32,
    /// Blocks in the cache.
    pub blocks: u64,
}

impl KvCapacity {
    /// The capacity `info` reports; `None` when it reports none (no stats, or a block size of 0).
    pub fn of(info: &InfoResponse) -> Option<Self> {
        let stats = info.stats.as_ref()?;
        (stats.kv_block_size > 0 && stats.kv_blocks_total > 0).then_some(Self {
            block_size: stats.kv_block_size,
            blocks: stats.kv_blocks_total,
        })
    }

    /// Blocks that `tokens` tokens take (the last one partly filled).
    pub fn blocks_for(&self, tokens: u64) -> u64 {
        tokens.div_ceil(u64::from(self.block_size))
    }
}

/// The refusal of `request` when it fits none of `workers` (the capacities of the ready workers
/// that report one) with a context of `context_length` tokens; `None` when one can hold it, or
/// when no worker reports its capacity (the worker then decides).
///
/// The sequence's longest length is `prompt + max_new_tokens`, capped at the context (generation
/// stops there), as the worker counts it.
pub fn never_fits(
    request: &AddRequest,
    context_length: u32,
    workers: &[KvCapacity],
) -> Option<ValidationError> {
    let prompt = request.prompt_ids.len() + request.generated_ids.len();
    let longest =
        (prompt as u64 + u64::from(request.max_new_tokens)).min(u64::from(context_length));
    let largest = workers
        .iter()
        .max_by_key(|c| c.blocks * u64::from(c.block_size))?;
    if workers.iter().any(|c| c.blocks_for(longest) <= c.blocks) {
        return None;
    }
    Some(ValidationError::invalid(
        "max_new_tokens",
        format!(
            "prompt ({prompt} tokens) + max_new_tokens ({}) needs {} KV blocks; the largest KV \
             cache of the ready workers has {} blocks of {} tokens",
            request.max_new_tokens,
            largest.blocks_for(longest),
            largest.blocks,
            largest.block_size
        ),
    ))
}

#[cfg(test)]
mod tests {
    use inference_proto::worker::EngineStats;

    use super::*;

    fn request(prompt: usize, max_new_tokens: u32) -> AddRequest {
        AddRequest {
            prompt_ids: vec![1; prompt],
            max_new_tokens,
            ..Default::default()
        }
    }

    #[test]
    fn capacity_comes_from_the_workers_stats() {
        let mut info = InfoResponse::default();
        assert_eq!(KvCapacity::of(&info), None);
        info.stats = Some(EngineStats {
            kv_block_size: 16,
            kv_blocks_total: 320,
            ..Default::default()
        });
        let c = KvCapacity::of(&info).unwrap();
        assert_eq!((c.block_size, c.blocks), (16, 320));
        assert_eq!(
            (c.blocks_for(0), c.blocks_for(16), c.blocks_for(17)),
            (0, 1, 2)
        );
        info.stats.as_mut().unwrap().kv_block_size = 0;
        assert_eq!(KvCapacity::of(&info), None);
    }

    #[test]
    fn refused_only_when_no_ready_worker_can_hold_it() {
        let small = KvCapacity {
            block_size: 16,
            blocks: 320,
        };
        let large = KvCapacity {
            block_size: 16,
            blocks: 1000,
        };
        // 5,120 tokens fill the small cache exactly; one more token does not fit.
        assert_eq!(never_fits(&request(5000, 120), 8192, &[small]), None);
        let err = never_fits(&request(5000, 121), 8192, &[small]).unwrap();
        assert_eq!(err.field(), "max_new_tokens");
        assert_eq!(
            err.to_string(),
            "prompt (5000 tokens) + max_new_tokens (121) needs 321 KV blocks; the largest KV cache \
             of the ready workers has 320 blocks of 16 tokens"
        );
        // Another worker that holds it, in any order.
        assert_eq!(never_fits(&request(5000, 121), 8192, &[small, large]), None);
        assert_eq!(never_fits(&request(5000, 121), 8192, &[large, small]), None);
        // Generation stops at the context, so the cap counts, not the asked maximum.
        assert_eq!(never_fits(&request(5000, 4000), 5120, &[small]), None);
        // No worker reports a capacity: the worker decides.
        assert_eq!(never_fits(&request(100_000, 1), 200_000, &[]), None);
        // The message names the largest cache.
        let err = never_fits(&request(20_000, 1), 32_768, &[small, large]).unwrap();
        assert!(
            err.to_string().ends_with("has 1000 blocks of 16 tokens"),
            "{err}"
        );
    }
}
