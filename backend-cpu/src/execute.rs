//! The CPU's execution of a [`ModelPlan`]: each op of the plan as the CPU kernels compute it, in
//! f32 over the step's flattened tokens, one row per token (see [`model_desc::plan`] for the ops
//! and their buffers).
//!
//! From the last layer's attention on, only the rows that want logits are computed (their K/V
//! are written by then, and every later op is per row).
//!
//! Batch invariant: see the [`crate`] module docs.

use std::cell::RefCell;
use std::ops::ControlFlow;

use super::attention::{attention_into, AttnOptions, HeadShape, QueryPos};
use super::matmul::{matmul_into_numerics, Numerics};
use super::ops::{
    gated_into, rms_norm_chunks_in_place, rms_norm_into, softcap_in_place, RopeTable,
};
use super::weights::{LayerWeights, ModelWeights};
use super::{AlignedVec, PagedKvCache};
use engine::backend::{Logits, StepPlan};
use model_desc::{AttentionOp, Branch, HeadOp, LayerOp, ModelDesc, ModelPlan};

/// Activation buffers of a forward pass, kept per thread and reused by every step (resized, never
/// reallocated once grown to the largest step); the logits go into the caller's [`Logits`].
#[derive(Default)]
struct Workspace {
    /// Normed activations, `[rows, hidden]`.
    xn: AlignedVec,
    /// Fused Q/K/V projections, `[rows, q_dim + 2 * kv_dim]`.
    qkv: Vec<f32>,
    /// The queries attention reads, `[rows, q_dim]`.
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

/// Runs `f` with this thread's [`Workspace`]; a nested call on the same thread (a forward pass
/// started from inside another one) gets a fresh one.
fn with_workspace<R>(f: impl FnOnce(&mut Workspace) -> R) -> R {
    WORKSPACE.with(|cell| match cell.try_borrow_mut() {
        Ok(mut ws) => f(&mut ws),
        Err(_) => f(&mut Workspace::default()),
    })
}

/// A checked, flattened batch: the shared [`StepPlan`] plus each token's attention query.
pub(super) struct Step<'a> {
    /// Token ids, positions, KV slots and logit rows.
    pub(super) plan: StepPlan,
    /// Position and block table of each token, `[num_tokens]`.
    pub(super) queries: Vec<QueryPos<'a>>,
}

/// One forward pass of a [`Step`] (at least one token) through a model's plan.
pub(super) struct Pass<'m, 'a> {
    desc: &'m ModelDesc,
    weights: &'m ModelWeights,
    /// How the matmuls multiply quantized weights.
    numerics: Numerics,
    step: &'m Step<'a>,
    kv: &'m mut PagedKvCache,
    /// One RoPE table per [`ModelPlan::rope_variants`], over the step's positions.
    ropes: Vec<RopeTable>,
    /// The residual stream, `[rows, hidden]`.
    x: Vec<f32>,
    /// The rows being computed: every token, then from the last layer's attention on the logit
    /// rows only.
    queries: Vec<QueryPos<'a>>,
}

impl<'m, 'a> Pass<'m, 'a> {
    /// A pass of `step` through the model of `desc` and `weights`, writing K/V into `kv` (checked
    /// against the model with the step).
    pub(super) fn new(
        desc: &'m ModelDesc,
        weights: &'m ModelWeights,
        numerics: Numerics,
        step: &'m Step<'a>,
        kv: &'m mut PagedKvCache,
    ) -> Pass<'m, 'a> {
        Pass {
            desc,
            weights,
            numerics,
            step,
            kv,
            ropes: Vec::new(),
            x: Vec::new(),
            queries: step.queries.clone(),
        }
    }

    /// Runs `plan`, writing the logits of the step's logit rows into `logits` (already cleared
    /// to the vocabulary size).
    pub(super) fn run(mut self, plan: &ModelPlan, logits: &mut Logits) {
        let c = self.desc;
        let positions = || self.step.queries.iter().map(|q| q.pos);
        self.ropes = plan
            .rope_variants
            .iter()
            .map(|v| {
                let factors = c.rope_freq_factors.as_deref();
                RopeTable::with_options(positions(), c.head_dim, v.base, v.pos_scale, factors)
            })
            .collect();
        self.x = vec![0.0f32; self.queries.len() * c.hidden];
        let embd = &self.weights.token_embd;
        for (t, row) in self
            .step
            .plan
            .tokens
            .iter()
            .zip(self.x.chunks_exact_mut(c.hidden))
        {
            embd.dequantize_rows(t.token as usize, row);
        }
        if let Some(scale) = plan.embed.scale {
            for v in &mut self.x {
                *v *= scale;
            }
        }
        let weights = self.weights;
        with_workspace(|ws| {
            let last = plan.layers.len() - 1;
            for (l, (layer, w)) in plan.layers.iter().zip(&weights.layers).enumerate() {
                for &op in &layer.ops {
                    if self.layer_op(l, l == last, op, w, ws).is_break() {
                        return;
                    }
                }
            }
            self.head(&plan.head, ws, logits);
        })
    }

    /// Runs one op of layer `l`; breaks when no row is left to compute.
    fn layer_op(
        &mut self,
        l: usize,
        last: bool,
        op: LayerOp,
        w: &LayerWeights,
        ws: &mut Workspace,
    ) -> ControlFlow<()> {
        let c = self.desc;
        let (hidden, q_dim, kv_dim, eps) = (c.hidden, c.q_dim(), c.kv_dim(), c.rms_eps);
        let width = q_dim + 2 * kv_dim;
        let rows = self.queries.len();
        match op {
            LayerOp::Norm(branch) => rms_norm_into(&self.x, w.norm(branch), eps, &mut ws.xn),
            LayerOp::QkvProject => {
                matmul_into_numerics(self.numerics, &ws.xn, rows, hidden, &w.wqkv, &mut ws.qkv)
            }
            LayerOp::QkvBias => {
                for r in ws.qkv.chunks_exact_mut(width) {
                    add_in_place(r, w.bias());
                }
            }
            LayerOp::QkNorm => {
                let (q_norm, k_norm) = w.qk_norms();
                for r in ws.qkv.chunks_exact_mut(width) {
                    let (q, kv) = r.split_at_mut(q_dim);
                    rms_norm_chunks_in_place(q, q_norm, eps);
                    rms_norm_chunks_in_place(&mut kv[..kv_dim], k_norm, eps);
                }
            }
            LayerOp::Rope(rope) => {
                let table = &self.ropes[rope.index];
                for (t, r) in ws.qkv.chunks_exact_mut(width).enumerate() {
                    let (q, kv) = r.split_at_mut(q_dim);
                    table.apply_style(rope.style, q, t);
                    table.apply_style(rope.style, &mut kv[..kv_dim], t);
                }
            }
            LayerOp::KvWrite => {
                for (t, r) in ws.qkv.chunks_exact(width).enumerate() {
                    let (k, v) = r[q_dim..].split_at(kv_dim);
                    self.kv.write(l, self.step.plan.tokens[t].slot, k, v);
                }
            }
            LayerOp::Attention(a) => return self.attention(l, last, a, ws),
            LayerOp::Residual { branch, post_norm } => {
                let (y, k) = match branch {
                    Branch::Attention => (&ws.att, q_dim),
                    Branch::FeedForward => (&ws.h, c.ffn_dim),
                };
                let wy = std::slice::from_ref(w.out_projection(branch));
                matmul_into_numerics(self.numerics, y, rows, k, wy, &mut ws.proj);
                let norm = post_norm.then(|| w.post_norm(branch).as_slice());
                add_residual(&mut self.x, &ws.proj, norm, eps, &mut ws.xn);
            }
            LayerOp::GateUpProject => matmul_into_numerics(
                self.numerics,
                &ws.xn,
                rows,
                hidden,
                &w.w_gate_up,
                &mut ws.gate_up,
            ),
            LayerOp::Gate(act) => gated_into(&ws.gate_up, c.ffn_dim, act, &mut ws.h),
        }
        ControlFlow::Continue(())
    }

    /// Attention of layer `l`; in the `last` layer, first drops the rows that want no logits
    /// (breaking when none is left).
    fn attention(
        &mut self,
        l: usize,
        last: bool,
        a: AttentionOp,
        ws: &mut Workspace,
    ) -> ControlFlow<()> {
        let c = self.desc;
        let (q_dim, width) = (c.q_dim(), c.q_dim() + 2 * c.kv_dim());
        let logit_rows = &self.step.plan.logit_rows;
        ws.q.clear();
        if last && logit_rows.len() < self.queries.len() {
            for &r in logit_rows {
                ws.q.extend_from_slice(&ws.qkv[r * width..r * width + q_dim]);
            }
            self.x = gather_rows(&self.x, c.hidden, logit_rows);
            self.queries = logit_rows.iter().map(|&r| self.step.queries[r]).collect();
            if self.queries.is_empty() {
                return ControlFlow::Break(());
            }
        } else {
            for r in ws.qkv.chunks_exact(width) {
                ws.q.extend_from_slice(&r[..q_dim]);
            }
        }
        let heads = HeadShape {
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            head_dim: c.head_dim,
        };
        let opts = AttnOptions {
            scale: a.scale,
            softcap: a.softcap,
            window: a.window,
        };
        let (layer, bs) = (self.kv.layer(l), self.kv.block_size());
        attention_into(&ws.q, &self.queries, layer, bs, heads, opts, &mut ws.att);
        ControlFlow::Continue(())
    }

    /// The head's ops on the logit rows (all that `x` holds after the last layer, in batch
    /// order).
    fn head(&self, ops: &[HeadOp], ws: &mut Workspace, logits: &mut Logits) {
        let c = self.desc;
        let m = self.step.plan.logit_rows.len();
        if m == 0 {
            return;
        }
        debug_assert_eq!(self.x.len(), m * c.hidden);
        for &op in ops {
            match op {
                HeadOp::Norm => {
                    rms_norm_into(&self.x, &self.weights.output_norm, c.rms_eps, &mut ws.xn)
                }
                HeadOp::LmHead => {
                    let head = std::slice::from_ref(self.weights.lm_head());
                    let y = logits.buffer(c.vocab_size);
                    matmul_into_numerics(self.numerics, &ws.xn, m, c.hidden, head, y);
                }
                HeadOp::Softcap(cap) => softcap_in_place(logits.buffer(c.vocab_size), cap),
            }
        }
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
