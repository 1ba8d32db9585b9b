//! CUDA graphs for decode steps: batch-size buckets, and the captured graphs of one KV cache.
//!
//! A pure decode step (every entry one token that wants logits) of `n` sequences is padded to the
//! smallest bucket `>= n` and replayed from a graph captured once per bucket, so its ~10 launches per
//! layer cost one graph launch. A graph bakes in the device addresses of the step buffers and the KV
//! cache, so graphs are dropped whenever the step buffers are reallocated.

use std::collections::HashMap;

use cudarc::driver::CudaGraph;

/// Decode batch buckets up to `max`: 1, 2, 4, 8, then every 8 to 64, every 16 to 128, every 32 above;
/// `max` itself is always the last bucket. Empty when `max` is 0.
pub fn decode_buckets(max: usize) -> Vec<usize> {
    let mut out = Vec::new();
    let mut b = 1;
    while b < max {
        out.push(b);
        b = match b {
            0..=7 => b * 2,
            8..=63 => b + 8,
            64..=127 => b + 16,
            _ => b + 32,
        };
    }
    if max > 0 {
        out.push(max);
    }
    out
}

/// The bucket a decode step of `n` sequences runs in: the smallest bucket `>= n`; `None` when `n` is
/// 0 or larger than every bucket (the step then runs without a graph).
pub fn bucket_for(n: usize, buckets: &[usize]) -> Option<usize> {
    if n == 0 {
        return None;
    }
    buckets.iter().copied().find(|&b| b >= n)
}

/// An instantiated graph, owned by the engine thread.
pub struct Captured(pub CudaGraph);

// SAFETY: a CudaGraph is a pair of driver handles that must not be used from two threads at once. It
// is created and replayed only inside `forward_batch` on the engine thread, which owns the KV state
// holding it (`&mut`), so it is never used concurrently; moving it between threads is allowed by the
// driver.
unsafe impl Send for Captured {}

/// The decode graphs of one set of step buffers, by bucket.
#[derive(Default)]
pub struct DecodeGraphs {
    graphs: HashMap<usize, Captured>,
}

impl DecodeGraphs {
    /// The graph of `bucket`, if captured.
    pub fn get(&self, bucket: usize) -> Option<&Captured> {
        self.graphs.get(&bucket)
    }

    /// Stores the graph of `bucket`.
    pub fn insert(&mut self, bucket: usize, graph: Captured) {
        self.graphs.insert(bucket, graph);
    }

    /// Drops every graph (the buffers they point at are being replaced).
    pub fn clear(&mut self) {
        self.graphs.clear();
    }

    /// Number of captured graphs.
    pub fn len(&self) -> usize {
        self.graphs.len()
    }

    /// Whether no graph is captured.
    pub fn is_empty(&self) -> bool {
        self.graphs.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets() {
        assert_eq!(
            decode_buckets(128),
            [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128]
        );
        assert_eq!(decode_buckets(5), [1, 2, 4, 5]);
        assert_eq!(decode_buckets(1), [1]);
        assert!(decode_buckets(0).is_empty());
        let b = decode_buckets(256);
        assert_eq!(&b[b.len() - 4..], &[160, 192, 224, 256]);
        assert_eq!(bucket_for(0, &b), None);
        assert_eq!(bucket_for(1, &b), Some(1));
        assert_eq!(bucket_for(3, &b), Some(4));
        assert_eq!(bucket_for(9, &b), Some(16));
        assert_eq!(bucket_for(65, &b), Some(80));
        assert_eq!(bucket_for(256, &b), Some(256));
        assert_eq!(bucket_for(257, &b), None);
    }
}
