//! What an attention call is given ([`At`]): the query rows, each query's position and block
//! table ([`QueryPos`]), the layer's paged K/V, the head shape ([`HeadShape`]) and how keys are
//! scored ([`AttnOptions`], with the soft-cap's formula [`softcap_in_place`]).

use super::super::kv_store::PagedLayer;

/// Shape of the attention heads.
#[derive(Debug, Clone, Copy)]
pub struct HeadShape {
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads (divides `n_heads`; query head `h` uses KV head
    /// `h / (n_heads / n_kv_heads)`).
    pub n_kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
}

/// How a layer scores its keys (see the [`attention`](super) module docs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttnOptions {
    /// Scores are `q·k * scale`.
    pub scale: f32,
    /// Scaled scores `s` become `softcap * tanh(s / softcap)`.
    pub softcap: Option<f32>,
    /// A query at `pos` attends to keys `pos + 1 - window ..= pos` only (`None`: all of `0..=pos`).
    pub window: Option<usize>,
}

impl AttnOptions {
    /// Plain causal attention scaled by `1 / sqrt(head_dim)`.
    pub fn plain(head_dim: usize) -> AttnOptions {
        AttnOptions {
            scale: 1.0 / (head_dim as f32).sqrt(),
            softcap: None,
            window: None,
        }
    }

    /// The positions a query at `pos` attends to.
    pub fn keys(&self, pos: usize) -> std::ops::Range<usize> {
        let first = match self.window {
            Some(w) => (pos + 1).saturating_sub(w),
            None => 0,
        };
        first..pos + 1
    }
}

/// `s = cap * tanh(s / cap)` for every score (Gemma 2's attention soft-capping; one formula per
/// element, so every kernel gets the same bits).
pub(super) fn softcap_in_place(scores: &mut [f32], cap: f32) {
    for s in scores {
        *s = (*s / cap).tanh() * cap;
    }
}

/// Where one query token sits: its position in its sequence and the sequence's block table.
#[derive(Debug, Clone, Copy)]
pub struct QueryPos<'a> {
    /// Position of the token in its sequence (0-based); it attends to positions `0..=pos`.
    pub pos: usize,
    /// The sequence's physical block ids (block `i` holds positions `i * block_size ..`); covers
    /// at least `pos + 1` positions.
    pub block_table: &'a [u32],
}

/// The inputs of one attention call (as [`super::attention`]'s arguments), shared by the kernels.
pub(super) struct At<'a> {
    /// Query rows, `[n, n_heads * head_dim]`.
    pub q: &'a [f32],
    /// Position and block table of each query.
    pub queries: &'a [QueryPos<'a>],
    /// The layer's K/V.
    pub layer: &'a PagedLayer,
    /// Tokens per KV block.
    pub block_size: usize,
    /// Head shape.
    pub s: HeadShape,
    /// Scale, soft-cap and window.
    pub opts: AttnOptions,
}
