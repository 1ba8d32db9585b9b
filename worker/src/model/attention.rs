//! Causal grouped-query attention over the KV cache (Ainslie et al. 2023,
//! "GQA"; scaled dot-product attention from Vaswani et al. 2017).

use rayon::prelude::*;

use super::kv_cache::LayerCache;
use super::matmul::dot;
use super::ops::softmax_in_place;

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

/// Attention for `n` new tokens whose keys/values are already appended to
/// `cache` (which then holds `start + n` tokens).
///
/// `q` is `[n, n_heads * head_dim]` (RoPE applied). Token `t` (at position
/// `start + t`) attends to cache positions `0..=start + t`. Scores are
/// `q·k / sqrt(head_dim)`, softmax in f32, output `Σ p_j v_j` accumulated in
/// increasing `j`. Returns `[n, n_heads * head_dim]`. Each (token, head) is
/// computed independently in parallel, so results do not depend on `n`.
pub fn attention(q: &[f32], n: usize, start: usize, cache: &LayerCache, s: HeadShape) -> Vec<f32> {
    let hd = s.head_dim;
    let q_dim = s.n_heads * hd;
    let kv_dim = s.n_kv_heads * hd;
    let group = s.n_heads / s.n_kv_heads;
    let scale = 1.0 / (hd as f32).sqrt();
    debug_assert_eq!(q.len(), n * q_dim);
    debug_assert!(cache.k.len() >= (start + n) * kv_dim);
    let mut out = vec![0.0f32; n * q_dim];
    out.par_chunks_mut(hd).enumerate().for_each(|(idx, o)| {
        let (t, h) = (idx / s.n_heads, idx % s.n_heads);
        let kv_off = (h / group) * hd;
        let qv = &q[t * q_dim + h * hd..t * q_dim + (h + 1) * hd];
        let n_keys = start + t + 1;
        let mut p: Vec<f32> = (0..n_keys)
            .map(|j| {
                let k = &cache.k[j * kv_dim + kv_off..j * kv_dim + kv_off + hd];
                dot(qv, k) * scale
            })
            .collect();
        softmax_in_place(&mut p);
        for (j, &pj) in p.iter().enumerate() {
            let v = &cache.v[j * kv_dim + kv_off..j * kv_dim + kv_off + hd];
            for (od, &vd) in o.iter_mut().zip(v) {
                *od += pj * vd;
            }
        }
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_key_returns_its_value() {
        let s = HeadShape {
            n_heads: 2,
            n_kv_heads: 1,
            head_dim: 2,
        };
        let cache = LayerCache {
            k: vec![1.0, 0.0],
            v: vec![3.0, -4.0],
        };
        let out = attention(&[0.5, 0.5, -1.0, 2.0], 1, 0, &cache, s);
        assert_eq!(out, [3.0, -4.0, 3.0, -4.0]);
    }

    #[test]
    fn causal_and_weighted() {
        let s = HeadShape {
            n_heads: 1,
            n_kv_heads: 1,
            head_dim: 2,
        };
        // two keys; query 0 may only see key 0, query 1 sees both equally (q = 0).
        let cache = LayerCache {
            k: vec![1.0, 0.0, 0.0, 1.0],
            v: vec![1.0, 0.0, 0.0, 1.0],
        };
        let out = attention(&[5.0, 5.0, 0.0, 0.0], 2, 0, &cache, s);
        assert_eq!(&out[..2], &[1.0, 0.0]);
        assert!((out[2] - 0.5).abs() < 1e-6 && (out[3] - 0.5).abs() < 1e-6);
    }
}
