//! The llama forward pass (Touvron et al. 2023; pre-norm RMSNorm, RoPE,
//! grouped-query attention, SwiGLU FFN), f32 throughout, over a flattened
//! batch of sequences and a paged KV cache (Kwon et al. 2023, PagedAttention).
//!
//! Batch invariant: see the [`crate::model`] module docs.

use std::cell::RefCell;
use std::path::Path;

use gguf::GgufFile;

use super::attention::{attention_into, HeadShape, QueryPos};
use super::matmul::matmul_into;
use super::ops::{rms_norm_into, swiglu_into, RopeTable};
use super::weights::ModelWeights;
use super::{AlignedVec, EntryLimits, KvDtype, ModelError, PagedKvCache};
use crate::arch::ModelDesc;
use crate::engine::BatchEntry;

/// A llama model with weights in memory in their file formats, run on the CPU
/// with f32 activations.
#[derive(Debug)]
pub struct CpuModel {
    config: ModelDesc,
    weights: ModelWeights,
    /// Element type of the caches made by [`Self::new_kv`].
    kv_dtype: KvDtype,
}

/// Activation buffers of a forward pass, kept per thread and reused by every
/// step (resized, never reallocated once grown to the largest step), so a
/// step allocates only its returned logits.
#[derive(Default)]
struct Workspace {
    /// Normed activations, `[rows, hidden]`.
    xn: AlignedVec,
    /// Fused Q/K/V projections, `[rows, q_dim + 2 * kv_dim]`.
    qkv: Vec<f32>,
    /// Queries after RoPE, `[rows, q_dim]`.
    q: AlignedVec,
    /// Attention output, `[rows, q_dim]`.
    att: AlignedVec,
    /// Output projection or FFN down projection, `[rows, hidden]`.
    proj: Vec<f32>,
    /// Fused gate/up projections, `[rows, 2 * ffn_dim]`.
    gate_up: Vec<f32>,
    /// SwiGLU output, `[rows, ffn_dim]`.
    h: AlignedVec,
    /// Logits, `[logit rows, vocab]`.
    logits: Vec<f32>,
}

thread_local! {
    static WORKSPACE: RefCell<Workspace> = RefCell::new(Workspace::default());
}

/// Runs `f` with this thread's [`Workspace`]; a nested call on the same
/// thread (a forward pass started from inside another one) gets a fresh one.
fn with_workspace<R>(f: impl FnOnce(&mut Workspace) -> R) -> R {
    WORKSPACE.with(|cell| match cell.try_borrow_mut() {
        Ok(mut ws) => f(&mut ws),
        Err(_) => f(&mut Workspace::default()),
    })
}

/// Per-token bookkeeping of a flattened batch (validated).
struct Plan<'a> {
    /// Token ids, `[num_tokens]`.
    tokens: Vec<u32>,
    /// Position and block table of each token, `[num_tokens]`.
    queries: Vec<QueryPos<'a>>,
    /// KV slot each token writes, `[num_tokens]`.
    slots: Vec<usize>,
    /// Row (flattened token index) of the last token of each entry that wants logits, in batch order.
    logit_rows: Vec<usize>,
}

impl CpuModel {
    /// Opens the GGUF file at `path`, reads its config and loads all weights,
    /// matrices in the file's own format (Q4_1/Q8_0/F16/BF16/F32; ~100 MB
    /// for SmolLM2-135M Q4_1), norm vectors as f32.
    ///
    /// Errors: [`ModelError::Gguf`] (I/O, format, unsupported tensor types),
    /// [`ModelError::Arch`], [`ModelError::InvalidConfig`],
    /// [`ModelError::MissingTensor`], [`ModelError::TensorShape`].
    pub fn load(path: &Path) -> Result<CpuModel, ModelError> {
        let file = GgufFile::open(path)?;
        let config = ModelDesc::from_source(&file)?;
        if !config.is_plain_llama() {
            return Err(ModelError::Unsupported {
                backend: "cpu",
                arch: config.arch.to_string(),
                what: "not yet implemented".into(),
            });
        }
        let weights = ModelWeights::load(&file, &config)?;
        Ok(CpuModel::from_parts(config, weights))
    }

    /// Builds a model from an already-validated config and weights.
    pub fn from_parts(config: ModelDesc, weights: ModelWeights) -> CpuModel {
        CpuModel {
            config,
            weights,
            kv_dtype: KvDtype::F32,
        }
    }

    /// This model with caches of element type `dtype` from [`Self::new_kv`]
    /// (default [`KvDtype::F32`]). [`Self::forward_batch`] accepts a cache of
    /// either type.
    pub fn with_kv_dtype(mut self, dtype: KvDtype) -> CpuModel {
        self.kv_dtype = dtype;
        self
    }

    /// Element type of the caches made by [`Self::new_kv`].
    pub fn kv_dtype(&self) -> KvDtype {
        self.kv_dtype
    }

    /// The model's hyper-parameters.
    pub fn config(&self) -> &ModelDesc {
        &self.config
    }

    /// A zeroed paged KV cache of `num_blocks` blocks of `block_size` tokens
    /// for this model (`n_layers` layers of width `kv_dim`); it takes
    /// `num_blocks * block_size *` [`Self::kv_bytes_per_token`] bytes.
    ///
    /// Panics if `block_size` is 0.
    pub fn new_kv(&self, num_blocks: usize, block_size: usize) -> PagedKvCache {
        PagedKvCache::with_dtype(
            self.kv_dtype,
            self.config.n_layers,
            self.config.kv_dim(),
            num_blocks,
            block_size,
        )
    }

    /// KV cache bytes per token: `2 * n_layers * kv_dim * 4` (K and V, f32), or `* 2` in f16.
    pub fn kv_bytes_per_token(&self) -> usize {
        2 * self.config.n_layers * self.config.kv_dim() * self.kv_dtype.bytes()
    }

    /// Checks `batch` against the model and `kv` and lays out its tokens.
    fn plan<'a>(
        &self,
        batch: &[BatchEntry<'a>],
        kv: &PagedKvCache,
    ) -> Result<Plan<'a>, ModelError> {
        let c = &self.config;
        if kv.n_layers() != c.n_layers || kv.kv_dim() != c.kv_dim() {
            return Err(ModelError::CacheMismatch(format!(
                "cache has {} layers of width {}, model {} of width {}",
                kv.n_layers(),
                kv.kv_dim(),
                c.n_layers,
                c.kv_dim()
            )));
        }
        let bs = kv.block_size();
        let n: usize = batch.iter().map(|e| e.tokens.len()).sum();
        let mut plan = Plan {
            tokens: Vec::with_capacity(n),
            queries: Vec::with_capacity(n),
            slots: Vec::with_capacity(n),
            logit_rows: Vec::new(),
        };
        // (slot, entry) of every write, to detect two writes of one slot.
        let mut writes = Vec::with_capacity(n);
        let limits = EntryLimits {
            vocab_size: c.vocab_size,
            context_length: c.context_length,
            num_blocks: kv.num_blocks(),
            block_size: bs,
        };
        for (entry, e) in batch.iter().enumerate() {
            limits.check(entry, e)?;
            for (i, &t) in e.tokens.iter().enumerate() {
                let pos = e.start_pos + i;
                let slot = kv.slot(e.block_table, pos);
                plan.tokens.push(t);
                plan.queries.push(QueryPos {
                    pos,
                    block_table: e.block_table,
                });
                plan.slots.push(slot);
                writes.push((slot, entry));
            }
            if e.want_logits {
                plan.logit_rows.push(plan.tokens.len() - 1);
            }
        }
        writes.sort_unstable();
        if let Some(w) = writes.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(ModelError::SlotConflict {
                slot: w[0].0,
                first: w[0].1,
                second: w[1].1,
            });
        }
        Ok(plan)
    }

    /// Runs a flattened batch of sequences in one step.
    ///
    /// Entry `e` runs its `tokens` at positions `start_pos..start_pos + tokens.len()`
    /// of its sequence, attending to positions `0..start_pos` already in `kv`
    /// (read through its block table) and causally to its own tokens. The
    /// keys (RoPE applied) and values of every token are written to slot
    /// `block_table[pos / block_size] * block_size + pos % block_size` of
    /// each layer. Returns, in batch order, the logits (`[vocab_size]`, f32,
    /// unnormalised) of the last token of every entry with `want_logits`.
    ///
    /// All tokens of all entries form one `[num_tokens, hidden]` activation,
    /// so every linear layer is a single matrix multiply; only the rows that
    /// need logits go through the last layer's attention output and FFN, the
    /// final norm and the LM head. Batch invariant (see the [`crate::model`]
    /// module docs).
    ///
    /// Errors, checked before anything is written (`kv` is left unchanged):
    /// [`ModelError::EmptyInput`], [`ModelError::TokenOutOfRange`],
    /// [`ModelError::ContextOverflow`], [`ModelError::BlockTableTooShort`],
    /// [`ModelError::BlockOutOfRange`] (block ids covering positions
    /// `0..start_pos + tokens.len()`), [`ModelError::SlotConflict`] (two
    /// tokens of the batch would write one slot),
    /// [`ModelError::CacheMismatch`]. An empty batch returns no logits. If
    /// the computation panics midway, only slots of the batch's own positions
    /// may have been written.
    pub fn forward_batch(
        &self,
        batch: &[BatchEntry<'_>],
        kv: &mut PagedKvCache,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let plan = self.plan(batch, kv)?;
        let n = plan.tokens.len();
        if n == 0 {
            return Ok(Vec::new());
        }
        let c = &self.config;
        let (hidden, q_dim, kv_dim) = (c.hidden, c.q_dim(), c.kv_dim());
        let heads = HeadShape {
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            head_dim: c.head_dim,
        };
        let rope =
            RopeTable::at_positions(plan.queries.iter().map(|q| q.pos), c.head_dim, c.rope_base);
        let bs = kv.block_size();
        let n_layers = self.weights.layers.len();

        let mut x = vec![0.0f32; n * hidden];
        for (&t, row) in plan.tokens.iter().zip(x.chunks_exact_mut(hidden)) {
            self.weights.token_embd.row_into(t as usize, row);
        }
        // Rows still being computed: all tokens, except in the last layer, where
        // only the rows that need logits go on past the K/V writes.
        let mut queries = plan.queries.clone();
        with_workspace(|ws| {
            for (l, layer) in self.weights.layers.iter().enumerate() {
                let rows = queries.len();
                // Attention block.
                rms_norm_into(&x, &layer.attn_norm, c.rms_eps, &mut ws.xn);
                matmul_into(&ws.xn, rows, hidden, &layer.wqkv.parts, &mut ws.qkv);
                let width = q_dim + 2 * kv_dim;
                ws.q.clear();
                for (t, r) in ws.qkv.chunks_exact_mut(width).enumerate() {
                    let (qt, kvt) = r.split_at_mut(q_dim);
                    let (k, v) = kvt.split_at_mut(kv_dim);
                    rope.apply(qt, t);
                    rope.apply(k, t);
                    ws.q.extend_from_slice(qt);
                    kv.write(l, plan.slots[t], k, v);
                }
                if l + 1 == n_layers && plan.logit_rows.len() < rows {
                    let q = gather_rows(&ws.q, q_dim, &plan.logit_rows);
                    ws.q.clear();
                    ws.q.extend_from_slice(&q);
                    x = gather_rows(&x, hidden, &plan.logit_rows);
                    queries = plan.logit_rows.iter().map(|&r| plan.queries[r]).collect();
                    if queries.is_empty() {
                        return Ok(Vec::new());
                    }
                }
                let rows = queries.len();
                attention_into(&ws.q, &queries, kv.layer(l), bs, heads, &mut ws.att);
                matmul_into(&ws.att, rows, q_dim, &layer.wo.parts, &mut ws.proj);
                add_in_place(&mut x, &ws.proj);

                // Feed-forward block.
                rms_norm_into(&x, &layer.ffn_norm, c.rms_eps, &mut ws.xn);
                matmul_into(
                    &ws.xn,
                    rows,
                    hidden,
                    &layer.w_gate_up.parts,
                    &mut ws.gate_up,
                );
                swiglu_into(&ws.gate_up, c.ffn_dim, &mut ws.h);
                matmul_into(&ws.h, rows, c.ffn_dim, &layer.w_down.parts, &mut ws.proj);
                add_in_place(&mut x, &ws.proj);
            }

            // After the last layer `x` holds exactly the logit rows, in batch order.
            let m = plan.logit_rows.len();
            if m == 0 {
                return Ok(Vec::new());
            }
            debug_assert_eq!(x.len(), m * hidden);
            rms_norm_into(&x, &self.weights.output_norm, c.rms_eps, &mut ws.xn);
            matmul_into(
                &ws.xn,
                m,
                hidden,
                &self.weights.lm_head().parts,
                &mut ws.logits,
            );
            Ok(ws
                .logits
                .chunks_exact(c.vocab_size)
                .map(<[f32]>::to_vec)
                .collect())
        })
    }
}

/// Rows `rows` (in that order) of the row-major `[_, width]` matrix `src`.
fn gather_rows(src: &[f32], width: usize, rows: &[usize]) -> Vec<f32> {
    let mut out = Vec::with_capacity(rows.len() * width);
    for &r in rows {
        out.extend_from_slice(&src[r * width..(r + 1) * width]);
    }
    out
}

fn add_in_place(x: &mut [f32], y: &[f32]) {
    for (a, &b) in x.iter_mut().zip(y) {
        *a += b;
    }
}
