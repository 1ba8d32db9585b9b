//! The launches of one forward step of [`CudaModel`]: [`CudaModel::record`], which executes the
//! model's [`ModelPlan`](model_desc::ModelPlan) op by op (see [`model_desc::plan`] for the ops),
//! and the launches of each op.

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use super::super::buffers::StepBuffers;
use super::super::error::{driver, CudaError};
use super::super::kv_store::KvBlocks;
use super::super::launch::{self, MatmulKernel, ROW_THREADS};
use super::super::weights::{format_suffix, GpuPart};
use super::CudaModel;
use model_desc::{
    Activation, AttentionOp, Branch, Embed, HeadOp, LayerOp, LayerWeights, RopeStyle,
};

/// One transformer block's weights on the GPU.
type GpuLayer = LayerWeights<GpuPart, CudaSlice<f32>>;

/// What every launch of one step shares: the cache, the buffers and the step's shape.
struct Step<'a> {
    kv: &'a KvBlocks,
    buf: &'a StepBuffers,
    /// Packed rows.
    rows: usize,
    /// Prefill tiles (fast mode), 0 for none.
    n_tiles: usize,
    /// Entries per block table.
    table_stride: usize,
    /// `attention_decode`'s launch shape for the step's longest context.
    attention: LaunchConfig,
}

impl CudaModel {
    /// One matrix product `out[:, off..] (+)= x @ W^T` over the parts of `parts` (each its own launch
    /// writing its column range).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn matmul<T>(
        &self,
        parts: &[GpuPart],
        x: &CudaSlice<u8>,
        x_stride: usize,
        m: usize,
        out: &CudaSlice<T>,
        out_stride: usize,
        accumulate: bool,
        out_f32: bool,
    ) -> Result<(), CudaError> {
        let kind = MatmulKernel::for_rows(m);
        let mut off = 0usize;
        for p in parts {
            let suffix = format_suffix(p.format).expect("checked at load");
            let name = format!("{}_{suffix}", kind.prefix());
            let cfg = kind.shape(m, p.rows);
            let (n_out, k, xs, mm) = (p.rows as i32, p.cols as i32, x_stride as i32, m as i32);
            let (os, oo) = (out_stride as i32, off as i32);
            let (acc, f32o) = (i32::from(accumulate), i32::from(out_f32));
            let mut b = self.stream.launch_builder(self.f(&name));
            b.arg(&p.data).arg(&n_out).arg(&k).arg(x).arg(&xs).arg(&mm);
            b.arg(out).arg(&os).arg(&oo).arg(&acc).arg(&f32o);
            // SAFETY: the arguments match the kernel's signature (matmul_gemv.cu / matmul_gemm.cu);
            // the buffers hold at least m rows of x_stride / out_stride elements and the part's rows.
            driver(&name, unsafe { b.launch(cfg) })?;
            off += p.rows;
        }
        Ok(())
    }

    /// `out = rmsnorm(x) * weight` over `n` rows of `hidden`, or `out += ...` with `accumulate`.
    pub(super) fn rmsnorm(
        &self,
        x: &CudaSlice<u8>,
        weight: &CudaSlice<f32>,
        n: usize,
        out: &CudaSlice<u8>,
        accumulate: bool,
    ) -> Result<(), CudaError> {
        let (ni, dim, eps) = (n as i32, self.config.hidden as i32, self.config.rms_eps);
        let acc = i32::from(accumulate);
        let mut b = self.stream.launch_builder(self.f("rmsnorm"));
        b.arg(x)
            .arg(weight)
            .arg(&ni)
            .arg(&dim)
            .arg(&eps)
            .arg(out)
            .arg(&acc);
        // SAFETY: rmsnorm.cu's signature; x and out hold n rows of `hidden`.
        driver("rmsnorm", unsafe { b.launch(launch::rmsnorm(n)) }).map(drop)
    }

    /// Launches the whole forward pass of `rows` packed rows (inputs already uploaded to `buf`):
    /// the model's [`ModelPlan`](model_desc::ModelPlan) op by op, ending with `n_logits` rows of
    /// f32 logits in `buf.logits`. Launch-only (no synchronisation or host copies), so it can be
    /// captured into a graph.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn record(
        &self,
        kv: &KvBlocks,
        buf: &StepBuffers,
        rows: usize,
        n_logits: usize,
        n_tiles: usize,
        table_stride: usize,
        max_keys: usize,
    ) -> Result<(), CudaError> {
        let c = &self.config;
        let step = Step {
            kv,
            buf,
            rows,
            n_tiles,
            table_stride,
            attention: launch::attention_decode(
                rows,
                c.n_heads,
                c.head_dim,
                max_keys,
                self.smem_limit,
            )?,
        };
        self.embed(&step, self.plan.embed)?;
        let layers = self.plan.layers.iter().zip(&self.weights.tensors.layers);
        for (l, (layer, w)) in layers.enumerate() {
            for &op in &layer.ops {
                self.layer_op(&step, l, op, w)?;
            }
        }
        if n_logits == 0 {
            return Ok(());
        }
        let (nl, hidden) = (n_logits as i32, c.hidden as i32);
        let mut b = self.stream.launch_builder(self.f("gather_rows"));
        b.arg(&buf.x)
            .arg(&buf.logit_rows)
            .arg(&nl)
            .arg(&hidden)
            .arg(&buf.g);
        // SAFETY: gather_rows.cu's signature; logit rows are < rows.
        driver("gather_rows", unsafe {
            b.launch(launch::per_row(n_logits, ROW_THREADS))
        })?;
        for &op in &self.plan.head {
            self.head_op(buf, n_logits, op)?;
        }
        Ok(())
    }

    /// The embedding lookup of every row into `buf.x`, times `embed.scale`.
    fn embed(&self, s: &Step<'_>, embed: Embed) -> Result<(), CudaError> {
        let embd = &self.weights.tensors.token_embd;
        let (n, hidden) = (s.rows as i32, self.config.hidden as i32);
        let (fmt, scale) = (embd.format_id, embed.scale.unwrap_or(1.0));
        let mut b = self.stream.launch_builder(self.f("embedding"));
        b.arg(&s.buf.tokens)
            .arg(&n)
            .arg(&embd.data)
            .arg(&fmt)
            .arg(&hidden)
            .arg(&scale)
            .arg(&s.buf.x);
        // SAFETY: embedding.cu's signature; tokens < vocab (checked when packing).
        driver("embedding", unsafe {
            b.launch(launch::per_row(s.rows, ROW_THREADS))
        })
        .map(drop)
    }

    /// The launches of `op` in layer `l`, whose weights are `w`.
    fn layer_op(&self, s: &Step<'_>, l: usize, op: LayerOp, w: &GpuLayer) -> Result<(), CudaError> {
        let c = &self.config;
        let (hidden, q_dim, kv_dim, ffn) = (c.hidden, c.q_dim(), c.kv_dim(), c.ffn_dim);
        let width = q_dim + 2 * kv_dim;
        let (buf, rows, n) = (s.buf, s.rows, s.rows as i32);
        let (width_i, ffn_i) = (width as i32, ffn as i32);
        let (nh, nkv, hd) = (c.n_heads as i32, c.n_kv_heads as i32, c.head_dim as i32);
        match op {
            LayerOp::Norm(branch) => self.rmsnorm(&buf.x, w.norm(branch), rows, &buf.xn, false),
            LayerOp::QkvProject => {
                let xn = &buf.xn;
                self.matmul(&w.wqkv, xn, hidden, rows, &buf.qkv, width, false, false)
            }
            LayerOp::QkvBias => {
                let mut b = self.stream.launch_builder(self.f("bias_add"));
                b.arg(&buf.qkv).arg(w.bias()).arg(&n).arg(&width_i);
                // SAFETY: bias_add.cu's signature; the bias holds `width` floats.
                driver("bias_add", unsafe {
                    b.launch(launch::elementwise(rows * width))
                })
                .map(drop)
            }
            LayerOp::QkNorm => {
                let (q_norm, k_norm) = w.qk_norms();
                let mut b = self.stream.launch_builder(self.f("head_rmsnorm"));
                b.arg(&buf.qkv)
                    .arg(q_norm)
                    .arg(k_norm)
                    .arg(&n)
                    .arg(&width_i);
                b.arg(&nh).arg(&nkv).arg(&hd).arg(&c.rms_eps);
                // SAFETY: head_rmsnorm.cu's signature; the norms hold head_dim floats.
                driver("head_rmsnorm", unsafe {
                    b.launch(launch::head_rmsnorm(rows))
                })
                .map(drop)
            }
            LayerOp::Rope(rope) => {
                let (base, pos_scale) = (rope.variant.base, rope.variant.pos_scale);
                let neox = i32::from(rope.style == RopeStyle::Neox);
                let mut b = self.stream.launch_builder(self.f("rope"));
                b.arg(&buf.qkv).arg(&buf.positions).arg(&n).arg(&width_i);
                b.arg(&nh).arg(&nkv).arg(&hd).arg(&base).arg(&pos_scale);
                b.arg(&self.weights.rope_factors).arg(&neox);
                // SAFETY: rope.cu's signature.
                driver("rope", unsafe {
                    b.launch(launch::per_row(rows, ROW_THREADS))
                })
                .map(drop)
            }
            LayerOp::KvWrite => {
                let (q_dim_i, kv_dim_i) = (q_dim as i32, kv_dim as i32);
                let mut b = self.stream.launch_builder(self.f("kv_write"));
                b.arg(&buf.qkv)
                    .arg(&buf.slots)
                    .arg(&n)
                    .arg(&width_i)
                    .arg(&q_dim_i)
                    .arg(&kv_dim_i);
                b.arg(&s.kv.k[l]).arg(&s.kv.v[l]);
                // SAFETY: kv_write.cu's signature; slots are inside the pool (checked when packing).
                driver("kv_write", unsafe {
                    b.launch(launch::per_row(rows, ROW_THREADS))
                })
                .map(drop)
            }
            LayerOp::Attention(a) => self.attention(s, l, a),
            LayerOp::Residual { branch, post_norm } => {
                let (x, k) = match branch {
                    Branch::Attention => (&buf.att, q_dim),
                    Branch::FeedForward => (&buf.h, ffn),
                };
                let norm = post_norm.then(|| w.post_norm(branch));
                self.residual(w.out_projection(branch), norm, x, k, rows, buf)
            }
            LayerOp::GateUpProject => {
                let xn = &buf.xn;
                self.matmul(
                    &w.w_gate_up,
                    xn,
                    hidden,
                    rows,
                    &buf.gu,
                    2 * ffn,
                    false,
                    false,
                )
            }
            LayerOp::Gate(act) => {
                let gated = match act {
                    Activation::Silu => "swiglu",
                    Activation::GeluTanh => "geglu",
                };
                let mut b = self.stream.launch_builder(self.f(gated));
                b.arg(&buf.gu).arg(&n).arg(&ffn_i).arg(&buf.h);
                // SAFETY: gated.cu's signature.
                driver(gated, unsafe { b.launch(launch::elementwise(rows * ffn)) }).map(drop)
            }
        }
    }

    /// Attention of layer `l` into `buf.att`: every query through `attention_decode`, then the
    /// step's prefill tiles (fast mode) through `attention_prefill`.
    fn attention(&self, s: &Step<'_>, l: usize, a: AttentionOp) -> Result<(), CudaError> {
        let c = &self.config;
        let (buf, kv) = (s.buf, s.kv);
        let (n, width_i) = (s.rows as i32, (c.q_dim() + 2 * c.kv_dim()) as i32);
        let (nh, nkv, hd) = (c.n_heads as i32, c.n_kv_heads as i32, c.head_dim as i32);
        let (stride_i, bs_i) = (s.table_stride as i32, kv.block_size as i32);
        let (scale, softcap) = (a.scale, a.softcap.unwrap_or(0.0));
        let window = a.window.unwrap_or(0) as i32;
        let mut b = self.stream.launch_builder(self.f("attention_decode"));
        b.arg(&buf.qkv)
            .arg(&width_i)
            .arg(&buf.att_positions)
            .arg(&buf.table_index);
        b.arg(&buf.block_tables)
            .arg(&stride_i)
            .arg(&kv.k[l])
            .arg(&kv.v[l])
            .arg(&bs_i);
        b.arg(&nh)
            .arg(&nkv)
            .arg(&hd)
            .arg(&scale)
            .arg(&buf.att)
            .arg(&n)
            .arg(&softcap)
            .arg(&window);
        // SAFETY: attention_decode.cu's signature; shared memory sized for max_keys.
        driver("attention_decode", unsafe { b.launch(s.attention) })?;
        if s.n_tiles > 0 {
            let mut b = self.stream.launch_builder(self.f("attention_prefill"));
            b.arg(&buf.qkv)
                .arg(&width_i)
                .arg(&buf.tiles)
                .arg(&buf.block_tables);
            b.arg(&stride_i).arg(&kv.k[l]).arg(&kv.v[l]).arg(&bs_i);
            b.arg(&nh).arg(&nkv).arg(&hd).arg(&scale).arg(&buf.att);
            b.arg(&softcap).arg(&window);
            let cfg = launch::attention_prefill(s.n_tiles, c.n_heads);
            // SAFETY: attention_prefill.cu's signature.
            driver("attention_prefill", unsafe { b.launch(cfg) })?;
        }
        Ok(())
    }

    /// The launches of head op `op` on the `n_logits` rows gathered into `buf.g`.
    fn head_op(&self, buf: &StepBuffers, n_logits: usize, op: HeadOp) -> Result<(), CudaError> {
        let (hidden, vocab) = (self.config.hidden, self.config.vocab_size);
        let w = &self.weights.tensors;
        match op {
            HeadOp::Norm => self.rmsnorm(&buf.g, &w.output_norm, n_logits, &buf.gn, false),
            HeadOp::LmHead => {
                let head = std::slice::from_ref(w.lm_head());
                self.matmul(
                    head,
                    &buf.gn,
                    hidden,
                    n_logits,
                    &buf.logits,
                    vocab,
                    false,
                    true,
                )
            }
            HeadOp::Softcap(cap) => {
                let total = (n_logits * vocab) as i32;
                let mut b = self.stream.launch_builder(self.f("softcap"));
                b.arg(&buf.logits).arg(&total).arg(&cap);
                // SAFETY: softcap.cu's signature; logits hold n_logits rows of vocab floats.
                driver("softcap", unsafe {
                    b.launch(launch::elementwise(n_logits * vocab))
                })
                .map(drop)
            }
        }
    }

    /// A block's output projection `y = x @ W^T` added to the residual stream `buf.x`: fused into
    /// the matrix kernel's epilogue, or with a post-norm (Gemma) written to `buf.xn` (free at this
    /// point of the layer) and added as `x += rmsnorm(y) * norm`.
    pub(super) fn residual(
        &self,
        w: &GpuPart,
        post_norm: Option<&CudaSlice<f32>>,
        x: &CudaSlice<u8>,
        k: usize,
        rows: usize,
        buf: &StepBuffers,
    ) -> Result<(), CudaError> {
        let hidden = self.config.hidden;
        let parts = std::slice::from_ref(w);
        match post_norm {
            None => self.matmul(parts, x, k, rows, &buf.x, hidden, true, false),
            Some(norm) => {
                self.matmul(parts, x, k, rows, &buf.xn, hidden, false, false)?;
                self.rmsnorm(&buf.xn, norm, rows, &buf.x, true)
            }
        }
    }
}
