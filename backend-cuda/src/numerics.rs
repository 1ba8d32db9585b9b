//! [`Numerics`]: the numeric mode of the CUDA backend (the `cuda_numerics` setting), which the
//! kernels are compiled for ([`super::compile`]), the module cache is keyed by ([`super::cache`])
//! and the step buffers are sized by ([`super::buffers`]).

use serde::{Deserialize, Serialize};

/// The numeric mode of the CUDA backend, fixed when the kernels are compiled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Numerics {
    /// f32 activations, KV cache and accumulation, no TF32, no implicit FMA contraction, fixed
    /// reduction order per output element: greedy ids equal the CPU reference, results are batch
    /// invariant.
    Exact,
    /// bf16 activations and KV cache (f32 accumulation), FlashAttention-style prefill: less memory
    /// traffic, results diverge slightly from the reference (measured by `scripts/gpu-check`).
    Fast,
}

impl Numerics {
    /// `"exact"` or `"fast"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Numerics::Exact => "exact",
            Numerics::Fast => "fast",
        }
    }

    /// Bytes of one activation / KV element: 4 (f32) or 2 (bf16).
    pub fn act_bytes(self) -> usize {
        match self {
            Numerics::Exact => 4,
            Numerics::Fast => 2,
        }
    }
}
