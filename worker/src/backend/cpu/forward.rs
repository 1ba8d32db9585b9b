//! The CPU forward pass of every architecture in [`crate::arch`]: the Llama
//! block (Touvron et al. 2023; pre-norm RMSNorm, RoPE, grouped-query
//! attention, gated FFN) with each architecture's options (Q/K/V biases, Q/K
//! norms, half-split RoPE, RoPE frequency factors, post-norms, GeGLU,
//! embedding scale, soft-caps, sliding windows; see [`ModelDesc`]), f32
//! throughout, over a flattened batch of sequences and a paged KV cache (Kwon
//! et al. 2023, PagedAttention). The options are decided per layer or per
//! step, never inside a kernel's inner loop, so a plain Llama runs exactly the
//! operations it ran before they existed.
//!
//! Batch invariant: see the [`crate::backend::cpu`] module docs.

use std::cell::RefCell;
use std::path::Path;

use super::attention::{attention_into, AttnOptions, HeadShape, QueryPos};
use super::matmul::matmul_into;
use super::ops::{
    gated_into, rms_norm_chunks_in_place, rms_norm_into, softcap_in_place, RopeTable,
};
use super::weights::ModelWeights;
use super::{AlignedVec, KvDtype, PagedKvCache};
use crate::arch::{ModelDesc, ModelSource};
use crate::backend::{BatchEntry, EntryLimits, Logits, ModelError, StepPlan};

/// A model of any [`crate::arch::Arch`] with weights in memory in their file
/// formats, run on the CPU with f32 activations.
#[derive(Debug)]
pub struct CpuModel {
    config: ModelDesc,
    weights: ModelWeights,
    /// Element type of the caches made by [`Self::new_kv`].
    kv_dtype: KvDtype,
}

/// Activation buffers of a forward pass, kept per thread and reused by every
/// step (resized, never reallocated once grown to the largest step); the
/// logits go into the caller's [`Logits`].
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
    /// Gated activation output, `[rows, ffn_dim]`.
    h: AlignedVec,
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

/// A checked, flattened batch: the shared [`StepPlan`] plus each token's attention query.
struct Plan<'a> {
    /// Token ids, positions, KV slots and logit rows.
    step: StepPlan,
    /// Position and block table of each token, `[num_tokens]`.
    queries: Vec<QueryPos<'a>>,
}

impl CpuModel {
    /// Opens the model at `path` (a GGUF file or a Hugging Face folder, see
    /// [`model_files::open`]), reads its description and loads all
    /// weights, matrices in the file's own format (~100 MB for SmolLM2-135M
    /// Q4_1), norm vectors and biases as f32. The matrices borrow the file's memory map (see
    /// [`ModelWeights`]): the file must not be truncated or overwritten in place while the model
    /// lives; replace it by renaming a new file over it.
    ///
    /// Errors: [`ModelError::ModelFile`] (I/O, format, unsupported tensor types, a bad folder),
    /// [`ModelError::Arch`], [`ModelError::InvalidConfig`],
    /// [`ModelError::MissingTensor`], [`ModelError::TensorShape`].
    pub fn load(path: &Path) -> Result<CpuModel, ModelError> {
        let file = model_files::open(path)?;
        CpuModel::from_source(&file)
    }

    /// Reads the description and loads all weights from `src` (a GGUF file, or any container
    /// that answers GGUF's metadata keys and tensor names). Errors as [`Self::load`].
    pub fn from_source(src: &dyn ModelSource) -> Result<CpuModel, ModelError> {
        let config = ModelDesc::from_source(src)?;
        let weights = ModelWeights::load(src, &config)?;
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
        let step = StepPlan::new(
            batch,
            EntryLimits {
                vocab_size: c.vocab_size,
                context_length: c.context_length,
                num_blocks: kv.num_blocks(),
                block_size: kv.block_size(),
            },
        )?;
        let queries = step
            .tokens
            .iter()
            .map(|t| QueryPos {
                pos: t.pos,
                block_table: batch[t.entry].block_table,
            })
            .collect();
        Ok(Plan { step, queries })
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
    /// final norm and the LM head. Batch invariant (see the [`crate::backend::cpu`]
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
        let mut logits = Logits::new();
        self.forward_batch_into(batch, kv, &mut logits)?;
        Ok(logits.iter().map(<[f32]>::to_vec).collect())
    }

    /// [`CpuModel::forward_batch`] into the caller's buffer, kept from step to step (the LM head
    /// writes it in place: no copy, no allocation once it is large enough). Errors as
    /// [`CpuModel::forward_batch`]; after an error `logits` is unspecified.
    pub fn forward_batch_into(
        &self,
        batch: &[BatchEntry<'_>],
        kv: &mut PagedKvCache,
        logits: &mut Logits,
    ) -> Result<(), ModelError> {
        let plan = self.plan(batch, kv)?;
        logits.clear(self.config.vocab_size);
        let n = plan.queries.len();
        if n == 0 {
            return Ok(());
        }
        let c = &self.config;
        let (hidden, q_dim, kv_dim) = (c.hidden, c.q_dim(), c.kv_dim());
        let heads = HeadShape {
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            head_dim: c.head_dim,
        };
        // One RoPE table per distinct (base, position scale) of the layers: one for most
        // models, two for Gemma 3 (local and global layers).
        let mut ropes: Vec<((f32, f32), RopeTable)> = Vec::new();
        let mut rope_of = Vec::with_capacity(c.n_layers);
        for ld in &c.layers {
            let key = (ld.rope_base, ld.rope_scale);
            let i = match ropes.iter().position(|(k, _)| *k == key) {
                Some(i) => i,
                None => {
                    let table = RopeTable::with_options(
                        plan.queries.iter().map(|q| q.pos),
                        c.head_dim,
                        ld.rope_base,
                        ld.rope_scale,
                        c.rope_freq_factors.as_deref(),
                    );
                    ropes.push((key, table));
                    ropes.len() - 1
                }
            };
            rope_of.push(i);
        }
        let bs = kv.block_size();
        let n_layers = self.weights.layers.len();

        let mut x = vec![0.0f32; n * hidden];
        for (t, row) in plan.step.tokens.iter().zip(x.chunks_exact_mut(hidden)) {
            self.weights.token_embd.row_into(t.token as usize, row);
        }
        if let Some(scale) = c.embed_scale {
            for v in &mut x {
                *v *= scale;
            }
        }
        // Rows still being computed: all tokens, except in the last layer, where
        // only the rows that need logits go on past the K/V writes.
        let mut queries = plan.queries.clone();
        with_workspace(|ws| {
            for (l, layer) in self.weights.layers.iter().enumerate() {
                let rows = queries.len();
                let rope = &ropes[rope_of[l]].1;
                // Attention block.
                rms_norm_into(&x, &layer.attn_norm, c.rms_eps, &mut ws.xn);
                matmul_into(&ws.xn, rows, hidden, &layer.wqkv.parts, &mut ws.qkv);
                let width = q_dim + 2 * kv_dim;
                if let Some(bias) = &layer.qkv_bias {
                    for r in ws.qkv.chunks_exact_mut(width) {
                        add_in_place(r, bias);
                    }
                }
                ws.q.clear();
                for (t, r) in ws.qkv.chunks_exact_mut(width).enumerate() {
                    let (qt, kvt) = r.split_at_mut(q_dim);
                    let (k, v) = kvt.split_at_mut(kv_dim);
                    if let Some((q_norm, k_norm)) = &layer.qk_norm {
                        rms_norm_chunks_in_place(qt, q_norm, c.rms_eps);
                        rms_norm_chunks_in_place(k, k_norm, c.rms_eps);
                    }
                    rope.apply_style(c.rope_style, qt, t);
                    rope.apply_style(c.rope_style, k, t);
                    ws.q.extend_from_slice(qt);
                    kv.write(l, plan.step.tokens[t].slot, k, v);
                }
                if l + 1 == n_layers && plan.step.logit_rows.len() < rows {
                    let q = gather_rows(&ws.q, q_dim, &plan.step.logit_rows);
                    ws.q.clear();
                    ws.q.extend_from_slice(&q);
                    x = gather_rows(&x, hidden, &plan.step.logit_rows);
                    queries = plan
                        .step
                        .logit_rows
                        .iter()
                        .map(|&r| plan.queries[r])
                        .collect();
                    if queries.is_empty() {
                        return Ok(());
                    }
                }
                let rows = queries.len();
                let opts = AttnOptions {
                    scale: c.attn_scale,
                    softcap: c.attn_softcap,
                    window: c.layers[l].sliding_window,
                };
                attention_into(&ws.q, &queries, kv.layer(l), bs, heads, opts, &mut ws.att);
                matmul_into(&ws.att, rows, q_dim, &layer.wo.parts, &mut ws.proj);
                add_residual(
                    &mut x,
                    &ws.proj,
                    layer.post_attn_norm.as_deref(),
                    c.rms_eps,
                    &mut ws.xn,
                );

                // Feed-forward block.
                rms_norm_into(&x, &layer.ffn_norm, c.rms_eps, &mut ws.xn);
                matmul_into(
                    &ws.xn,
                    rows,
                    hidden,
                    &layer.w_gate_up.parts,
                    &mut ws.gate_up,
                );
                gated_into(&ws.gate_up, c.ffn_dim, c.activation, &mut ws.h);
                matmul_into(&ws.h, rows, c.ffn_dim, &layer.w_down.parts, &mut ws.proj);
                add_residual(
                    &mut x,
                    &ws.proj,
                    layer.post_ffn_norm.as_deref(),
                    c.rms_eps,
                    &mut ws.xn,
                );
            }

            // After the last layer `x` holds exactly the logit rows, in batch order.
            let m = plan.step.logit_rows.len();
            if m == 0 {
                return Ok(());
            }
            debug_assert_eq!(x.len(), m * hidden);
            rms_norm_into(&x, &self.weights.output_norm, c.rms_eps, &mut ws.xn);
            matmul_into(
                &ws.xn,
                m,
                hidden,
                &self.weights.lm_head().parts,
                logits.buffer(c.vocab_size),
            );
            if let Some(cap) = c.final_softcap {
                softcap_in_place(logits.buffer(c.vocab_size), cap);
            }
            Ok(())
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

/// `x += y`, or `x += rms_norm(y, norm)` with a post-norm (Gemma), `scratch` holding the normed
/// rows.
fn add_residual(
    x: &mut [f32],
    y: &[f32],
    norm: Option<&[f32]>,
    eps: f32,
    scratch: &mut AlignedVec,
) {
    match norm {
        Some(w) => {
            rms_norm_into(y, w, eps, scratch);
            add_in_place(x, scratch);
        }
        None => add_in_place(x, y),
    }
}

fn add_in_place(x: &mut [f32], y: &[f32]) {
    for (a, &b) in x.iter_mut().zip(y) {
        *a += b;
    }
}
