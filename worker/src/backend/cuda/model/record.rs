//! The launches of one forward step of [`CudaModel`]: [`CudaModel::record`] and the matrix, norm
//! and residual helpers it uses (see the [parent module](super) for the order of operations).

use cudarc::driver::{CudaSlice, PushKernelArg};

use super::super::buffers::StepBuffers;
use super::super::error::{driver, CudaError};
use super::super::kv::KvBlocks;
use super::super::launch::{self, MatmulKernel, ROW_THREADS};
use super::super::weights::{format_suffix, GpuPart};
use super::CudaModel;
use crate::arch::{Activation, RopeStyle};

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

    /// Launches the whole forward pass of `rows` packed rows (inputs already uploaded to `buf`),
    /// ending with `n_logits` rows of f32 logits in `buf.logits`. Launch-only (no synchronisation or
    /// host copies), so it can be captured into a graph.
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
        let (hidden, q_dim, kv_dim, ffn) = (c.hidden, c.q_dim(), c.kv_dim(), c.ffn_dim);
        let width = q_dim + 2 * kv_dim;
        let n = rows as i32;
        let (hidden_i, width_i, q_dim_i, kv_dim_i, ffn_i) = (
            hidden as i32,
            width as i32,
            q_dim as i32,
            kv_dim as i32,
            ffn as i32,
        );
        let (nh, nkv, hd) = (c.n_heads as i32, c.n_kv_heads as i32, c.head_dim as i32);
        let (scale, softcap) = (c.attn_scale, c.attn_softcap.unwrap_or(0.0));
        let (eps, neox) = (c.rms_eps, i32::from(c.rope_style == RopeStyle::Neox));
        let gated = match c.activation {
            Activation::Silu => "swiglu",
            Activation::GeluTanh => "geglu",
        };
        let (stride_i, bs_i) = (table_stride as i32, kv.block_size as i32);
        let att_cfg =
            launch::attention_decode(rows, c.n_heads, c.head_dim, max_keys, self.smem_limit)?;

        let embd = &self.weights.token_embd;
        let (fmt, embed_scale) = (embd.format_id, c.embed_scale.unwrap_or(1.0));
        let mut b = self.stream.launch_builder(self.f("embedding"));
        b.arg(&buf.tokens)
            .arg(&n)
            .arg(&embd.data)
            .arg(&fmt)
            .arg(&hidden_i)
            .arg(&embed_scale)
            .arg(&buf.x);
        // SAFETY: embedding.cu's signature; tokens < vocab (checked when packing).
        driver("embedding", unsafe {
            b.launch(launch::per_row(rows, ROW_THREADS))
        })?;

        for (l, layer) in self.weights.layers.iter().enumerate() {
            let ld = &c.layers[l];
            let (base, pos_scale) = (ld.rope_base, ld.rope_scale);
            let window = ld.sliding_window.unwrap_or(0) as i32;
            self.rmsnorm(&buf.x, &layer.attn_norm, rows, &buf.xn, false)?;
            self.matmul(
                &layer.wqkv,
                &buf.xn,
                hidden,
                rows,
                &buf.qkv,
                width,
                false,
                false,
            )?;
            if let Some(bias) = &layer.qkv_bias {
                let mut b = self.stream.launch_builder(self.f("bias_add"));
                b.arg(&buf.qkv).arg(bias).arg(&n).arg(&width_i);
                // SAFETY: bias_add.cu's signature; the bias holds `width` floats.
                driver("bias_add", unsafe {
                    b.launch(launch::elementwise(rows * width))
                })?;
            }
            if let Some((q_norm, k_norm)) = &layer.qk_norm {
                let mut b = self.stream.launch_builder(self.f("head_rmsnorm"));
                b.arg(&buf.qkv)
                    .arg(q_norm)
                    .arg(k_norm)
                    .arg(&n)
                    .arg(&width_i);
                b.arg(&nh).arg(&nkv).arg(&hd).arg(&eps);
                // SAFETY: head_rmsnorm.cu's signature; the norms hold head_dim floats.
                driver("head_rmsnorm", unsafe {
                    b.launch(launch::head_rmsnorm(rows))
                })?;
            }
            let mut b = self.stream.launch_builder(self.f("rope"));
            b.arg(&buf.qkv).arg(&buf.positions).arg(&n).arg(&width_i);
            b.arg(&nh).arg(&nkv).arg(&hd).arg(&base).arg(&pos_scale);
            b.arg(&self.weights.rope_factors).arg(&neox);
            // SAFETY: rope.cu's signature.
            driver("rope", unsafe {
                b.launch(launch::per_row(rows, ROW_THREADS))
            })?;
            let mut b = self.stream.launch_builder(self.f("kv_write"));
            b.arg(&buf.qkv)
                .arg(&buf.slots)
                .arg(&n)
                .arg(&width_i)
                .arg(&q_dim_i)
                .arg(&kv_dim_i);
            b.arg(&kv.k[l]).arg(&kv.v[l]);
            // SAFETY: kv_write.cu's signature; slots are inside the pool (checked when packing).
            driver("kv_write", unsafe {
                b.launch(launch::per_row(rows, ROW_THREADS))
            })?;
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
            driver("attention_decode", unsafe { b.launch(att_cfg) })?;
            if n_tiles > 0 {
                let mut b = self.stream.launch_builder(self.f("attention_prefill"));
                b.arg(&buf.qkv)
                    .arg(&width_i)
                    .arg(&buf.tiles)
                    .arg(&buf.block_tables);
                b.arg(&stride_i).arg(&kv.k[l]).arg(&kv.v[l]).arg(&bs_i);
                b.arg(&nh).arg(&nkv).arg(&hd).arg(&scale).arg(&buf.att);
                b.arg(&softcap).arg(&window);
                let cfg = launch::attention_prefill(n_tiles, c.n_heads);
                // SAFETY: attention_prefill.cu's signature.
                driver("attention_prefill", unsafe { b.launch(cfg) })?;
            }
            self.residual(
                &layer.wo,
                layer.post_attn_norm.as_ref(),
                &buf.att,
                q_dim,
                rows,
                buf,
            )?;
            self.rmsnorm(&buf.x, &layer.ffn_norm, rows, &buf.xn, false)?;
            self.matmul(
                &layer.w_gate_up,
                &buf.xn,
                hidden,
                rows,
                &buf.gu,
                2 * ffn,
                false,
                false,
            )?;
            let mut b = self.stream.launch_builder(self.f(gated));
            b.arg(&buf.gu).arg(&n).arg(&ffn_i).arg(&buf.h);
            // SAFETY: gated.cu's signature.
            driver(gated, unsafe { b.launch(launch::elementwise(rows * ffn)) })?;
            self.residual(
                &layer.w_down,
                layer.post_ffn_norm.as_ref(),
                &buf.h,
                ffn,
                rows,
                buf,
            )?;
        }

        if n_logits == 0 {
            return Ok(());
        }
        let nl = n_logits as i32;
        let mut b = self.stream.launch_builder(self.f("gather_rows"));
        b.arg(&buf.x)
            .arg(&buf.logit_rows)
            .arg(&nl)
            .arg(&hidden_i)
            .arg(&buf.g);
        // SAFETY: gather_rows.cu's signature; logit rows are < rows.
        driver("gather_rows", unsafe {
            b.launch(launch::per_row(n_logits, ROW_THREADS))
        })?;
        self.rmsnorm(&buf.g, &self.weights.output_norm, n_logits, &buf.gn, false)?;
        let head = self.weights.lm_head();
        self.matmul(
            std::slice::from_ref(head),
            &buf.gn,
            hidden,
            n_logits,
            &buf.logits,
            c.vocab_size,
            false,
            true,
        )?;
        if let Some(cap) = c.final_softcap {
            let total = (n_logits * c.vocab_size) as i32;
            let mut b = self.stream.launch_builder(self.f("softcap"));
            b.arg(&buf.logits).arg(&total).arg(&cap);
            // SAFETY: softcap.cu's signature; logits hold n_logits rows of vocab floats.
            driver("softcap", unsafe {
                b.launch(launch::elementwise(n_logits * c.vocab_size))
            })?;
        }
        Ok(())
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
