//! The neutral model description shared by the CPU and CUDA backends: which architecture, its
//! sizes, and every option a forward pass branches on ([`ModelDesc`]), the order of operations
//! every backend executes ([`ModelPlan`]), and the one weight loader of every backend
//! ([`ModelWeights::load`]), all read through [`ModelSource`] (metadata by GGUF key, tensors by
//! GGUF name), so any container that answers those two questions in GGUF's terms (a Hugging Face
//! folder mapped onto GGUF names) gets the same description, plan and weights.
//!
//! A crate of its own, below the engine and the backends: it must not depend on the engine, a
//! backend, `inference-proto` or `tonic`.
//!
//! # The architectures
//!
//! All are decoder-only transformers: token embeddings, `n_layers` blocks of pre-norm
//! grouped-query attention and a gated feed-forward, each added to the residual stream, a final
//! RMSNorm and an LM head (`output.weight`, or the embeddings when the file has none). They
//! differ in:
//!
//! | | RoPE pairs | attention | feed-forward | other |
//! |---|---|---|---|---|
//! | `llama` | interleaved (Q/K rows permuted by the converter) | | SwiGLU | Llama 3: `rope_freqs.weight` divides each frequency; Mistral Nemo: head size from `attention.key_length` |
//! | `qwen2` | half-split | Q/K/V biases | SwiGLU | |
//! | `qwen3` | half-split | per-head Q/K RMSNorm before RoPE; head size from `attention.key_length` | SwiGLU | |
//! | `gemma2` | half-split | scores soft-capped at 50, window on even layers | GeGLU (tanh GELU) | embeddings × sqrt(hidden); post-attention and post-FFN norms; logits soft-capped at 30 |
//! | `gemma3` | half-split, local layers at base 10,000 | Q/K RMSNorm; window on 5 of every 6 layers | GeGLU | as Gemma 2, no soft-caps unless the file sets them |
//! | `phi3` | half-split | fused `attn_qkv` | fused `ffn_up` = gate then up | |
//!
//! Norm weights are used as stored: Gemma's converter already stores `1 + w` (checked against
//! Hugging Face on Gemma 2 and Gemma 3). Settings a GGUF file does not hold (Gemma's window
//! pattern, Gemma 3's local RoPE base, Gemma's attention scale, Gemma 2's soft-caps when absent)
//! are the architectures' published defaults, all in [`defaults`].
//!
//! # Sliding windows and the KV cache
//!
//! A local layer's query at position `p` attends to keys `p + 1 - window ..= p`. The paged KV
//! cache keeps every position's keys and values for the whole sequence: blocks that have slid
//! out of every local layer's window are not released (global layers still need them, and a
//! cache per layer kind is not worth its complexity here).

pub mod defaults;
mod desc;
mod error;
pub mod plan;
mod read;
mod source;
mod weights;

pub use desc::{Activation, Arch, LayerDesc, ModelDesc, Projections, RopeStyle};
pub use error::ArchError;
pub use plan::{
    AttentionOp, Branch, Embed, HeadOp, LayerOp, LayerPlan, ModelPlan, RopeOp, RopeVariant,
};
pub use source::{ModelSource, SourceTensor};
pub use weights::{LayerWeights, MatrixTensor, ModelWeights};

#[cfg(test)]
mod tests;
