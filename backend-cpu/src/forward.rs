//! [`CpuModel`]: the CPU forward pass of every architecture in [`model_desc`], f32 throughout,
//! over a flattened batch of sequences and a paged KV cache (Kwon et al. 2023, PagedAttention).
//! A step is checked and laid out here and runs the model's [`ModelPlan`] (the Llama block with
//! each architecture's options, decided per layer when the model is loaded) through
//! [`super::execute`].
//!
//! Batch invariant: see the [`crate`] module docs.

use std::path::Path;

use super::attention::QueryPos;
use super::execute::{Pass, Step};
use super::weights::{load_weights, ModelWeights};
use super::{KvDtype, Numerics, PagedKvCache, QMatrix};
use engine::backend::{BatchEntry, EntryLimits, Logits, ModelError, StepPlan};
use model_desc::{ModelDesc, ModelPlan, ModelSource};

/// A model of any [`model_desc::Arch`] with weights in memory in their file
/// formats, run on the CPU with f32 activations.
#[derive(Debug)]
pub struct CpuModel {
    config: ModelDesc,
    /// The order of operations, from `config`.
    plan: ModelPlan,
    weights: ModelWeights,
    /// Element type of the caches made by [`Self::new_kv`].
    kv_dtype: KvDtype,
    /// How quantized weights are multiplied.
    numerics: Numerics,
}

impl CpuModel {
    /// Opens the model at `path` (a GGUF file or a Hugging Face folder, see
    /// [`model_files::open`]), reads its description and loads all
    /// weights, matrices in the file's own format (~100 MB for SmolLM2-135M
    /// Q4_1), norm vectors and biases as f32. The matrices borrow the file's memory map (see
    /// [`load_weights`]): the file must not be truncated or overwritten in place while the model
    /// lives; replace it by renaming a new file over it.
    ///
    /// Errors: [`ModelError::ModelFile`] (I/O, format, unsupported tensor types, a bad folder),
    /// [`ModelError::Arch`] (the description, a missing tensor or one of the wrong dims),
    /// [`ModelError::InvalidConfig`].
    pub fn load(path: &Path) -> Result<CpuModel, ModelError> {
        let file = model_files::open(path)?;
        CpuModel::from_source(&file)
    }

    /// Reads the description and loads all weights from `src` (a GGUF file, or any container
    /// that answers GGUF's metadata keys and tensor names). Errors as [`Self::load`].
    pub fn from_source(src: &dyn ModelSource) -> Result<CpuModel, ModelError> {
        let config = ModelDesc::from_source(src)?;
        let weights = load_weights(src, &config)?;
        Ok(CpuModel::from_parts(config, weights))
    }

    /// Builds a model from an already-validated config and weights (from [`load_weights`] with
    /// the same config).
    pub fn from_parts(config: ModelDesc, weights: ModelWeights) -> CpuModel {
        CpuModel {
            plan: ModelPlan::new(&config),
            config,
            weights,
            kv_dtype: KvDtype::F32,
            numerics: Numerics::Exact,
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

    /// This model multiplying its quantized weights in numeric mode `numerics` (default
    /// [`Numerics::Exact`]; [`Numerics::Fast`]: 8-bit activations, see [`crate::matmul::int8`]).
    ///
    /// `Fast` also interleaves the block-quantized matrices that the forward pass multiplies
    /// (every layer's and the LM head; every block format but Q5_K, [`QMatrix::interleave`]): a
    /// heap copy of those weights, made once here (about 100 MB for SmolLM2-135M Q4_1, 245 MB
    /// for Gemma 3 270M Q4_K_M, 0.2 s); `Exact` drops it.
    pub fn with_numerics(mut self, numerics: Numerics) -> CpuModel {
        self.numerics = numerics;
        let w = &mut self.weights;
        let head = w.output.as_mut().unwrap_or(&mut w.token_embd);
        let mut matrices: Vec<&mut QMatrix> = vec![head];
        for l in &mut w.layers {
            matrices.extend(l.wqkv.iter_mut().chain(l.w_gate_up.iter_mut()));
            matrices.extend([&mut l.wo, &mut l.w_down]);
        }
        for m in matrices {
            match numerics {
                Numerics::Fast => m.interleave(),
                Numerics::Exact => m.drop_interleaved(),
            }
        }
        self
    }

    /// The numeric mode of the matmuls.
    pub fn numerics(&self) -> Numerics {
        self.numerics
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
    fn check<'a>(
        &self,
        batch: &[BatchEntry<'a>],
        kv: &PagedKvCache,
    ) -> Result<Step<'a>, ModelError> {
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
        let plan = StepPlan::new(
            batch,
            EntryLimits {
                vocab_size: c.vocab_size,
                context_length: c.context_length,
                num_blocks: kv.num_blocks(),
                block_size: kv.block_size(),
            },
        )?;
        let queries = plan
            .tokens
            .iter()
            .map(|t| QueryPos {
                pos: t.pos,
                block_table: batch[t.entry].block_table,
            })
            .collect();
        Ok(Step { plan, queries })
    }

    /// Runs a flattened batch of sequences in one step.
    ///
    /// Entry `e` runs its `tokens` at positions `start_pos..start_pos + tokens.len()`
    /// of its sequence, attending to positions `0..start_pos` already in `kv`
    /// (read through its block table) and causally to its own tokens. The
    /// keys (RoPE applied) and values of every token are written to slot
    /// `block_table[pos / block_size] * block_size + pos % block_size` of
    /// each layer. Returns, in batch order, the logits (`[vocab_size]`, f32,
    /// unnormalised) of the last `logit_tokens` tokens of every entry.
    ///
    /// All tokens of all entries form one `[num_tokens, hidden]` activation,
    /// so every linear layer is a single matrix multiply; only the rows that
    /// need logits go through the last layer's attention output and FFN, the
    /// final norm and the LM head. Batch invariant (see the [`crate`]
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
        let step = self.check(batch, kv)?;
        logits.clear(self.config.vocab_size);
        if step.queries.is_empty() {
            return Ok(());
        }
        Pass::new(&self.config, &self.weights, self.numerics, &step, kv).run(&self.plan, logits);
        Ok(())
    }
}
