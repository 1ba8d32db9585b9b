//! The value changes llama.cpp's `convert_hf_to_gguf.py` makes between a Hugging Face
//! checkpoint and a GGUF file (everything else is a rename): the llama Q/K row permutation,
//! Gemma's `1 + w` norm weights, and the llama3 RoPE frequency factors.

use gguf::GgmlType;

/// Reorders the rows of a Q or K projection (weight `[n_head * head_dim, cols]` or bias
/// `[n_head * head_dim]`, `row_bytes` bytes per row) from Hugging Face's rotate-half layout to
/// the interleaved layout GGUF llama files use: within each head, output row `2i + j` is input
/// row `j * head_dim / 2 + i` (the converter's `LlamaModel.permute`: reshape to
/// `[n_head, 2, head_dim / 2, ...]` and swap the middle axes). A pure byte move, so any dtype.
///
/// Panics unless `bytes` holds `n_head` heads of an even number of rows each (the caller checks
/// the shape against the config first).
pub fn permute_rows(bytes: &[u8], row_bytes: usize, n_head: usize) -> Vec<u8> {
    let rows = bytes.len() / row_bytes;
    assert!(
        rows * row_bytes == bytes.len() && rows.is_multiple_of(2 * n_head),
        "permute_rows: {rows} rows do not split into {n_head} heads of pairs"
    );
    let head_dim = rows / n_head;
    let half = head_dim / 2;
    let mut out = Vec::with_capacity(bytes.len());
    for h in 0..n_head {
        for i in 0..half {
            for j in 0..2 {
                let src = h * head_dim + j * half + i;
                out.extend_from_slice(&bytes[src * row_bytes..(src + 1) * row_bytes]);
            }
        }
    }
    out
}

/// `1 + w` in f32 for a norm weight stored as `dtype` (Gemma's RMSNorm multiplies by `1 + w`;
/// GGUF files store the sum, as f32). Errors: a `dtype` that is not a float type.
pub fn add_one(dtype: GgmlType, bytes: &[u8]) -> gguf::Result<Vec<u8>> {
    let n = bytes.len() / dtype.byte_size(1).unwrap_or(1) as usize;
    let w = gguf::dequantize_to_vec(dtype, bytes, n)?;
    Ok(w.iter().flat_map(|x| (x + 1.0).to_le_bytes()).collect())
}

/// Llama 3's RoPE scaling as GGUF stores it (`rope_freqs.weight`, one factor per rotated pair:
/// the model divides frequency `i` by factor `i`).
///
/// Computed as llama.cpp's converter computes it, in f32 throughout (its `torch.float32`
/// tensors): `freq_i = 1 / base^(2i / dim)`, wavelength `2π / freq_i`; factor 1 for wavelengths
/// below `original_context / high_freq_factor`, `factor` above `original_context /
/// low_freq_factor`, and between them `1 / ((1 - s) / factor + s)` with
/// `s = (original_context / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)`.
pub fn llama3_rope_factors(
    base: f64,
    dim: usize,
    factor: f64,
    low_freq_factor: f64,
    high_freq_factor: f64,
    original_context: f64,
) -> Vec<f32> {
    let (factor, low, high) = (
        factor as f32,
        low_freq_factor as f32,
        high_freq_factor as f32,
    );
    let old = original_context as f32;
    let low_freq_wavelen = old / low;
    let high_freq_wavelen = old / high;
    let two_pi = std::f64::consts::PI as f32 * 2.0;
    (0..dim)
        .step_by(2)
        .map(|i| {
            let exponent = i as f32 / dim as f32;
            let freq = 1.0f32 / (base as f32).powf(exponent);
            let wavelen = two_pi / freq;
            if wavelen < high_freq_wavelen {
                1.0
            } else if wavelen > low_freq_wavelen {
                factor
            } else {
                let smooth = (old / wavelen - low) / (high - low);
                1.0 / ((1.0 - smooth) / factor + smooth)
            }
        })
        .collect()
}

/// `v` as little-endian f32 bytes.
pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permutation_interleaves_each_heads_halves() {
        // 2 heads of 4 rows, one byte per row: head rows [a0 a1 b0 b1] -> [a0 b0 a1 b1].
        let rows: Vec<u8> = (0..8).collect();
        assert_eq!(permute_rows(&rows, 1, 2), [0, 2, 1, 3, 4, 6, 5, 7]);
        // Rows of several bytes move whole.
        let wide: Vec<u8> = (0..8).flat_map(|r| [r, 100 + r]).collect();
        let p = permute_rows(&wide, 2, 1);
        assert_eq!(&p[..6], &[0, 100, 4, 104, 1, 101]);
    }

    #[test]
    fn gemma_norms_are_shifted_by_one_in_f32() {
        let bf16: Vec<u8> = [0.5f32, -1.0]
            .iter()
            .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes())
            .collect();
        assert_eq!(
            add_one(GgmlType::BF16, &bf16).unwrap(),
            f32_bytes(&[1.5, 0.0])
        );
    }

    #[test]
    fn llama3_factors_follow_the_published_recipe() {
        // Llama 3.1 8B (base 5e5, head dim 128, factor 8, 1, 4, 8192): the high frequencies are
        // unscaled, the low ones divided by 8, the middle band interpolated.
        let f = llama3_rope_factors(500000.0, 128, 8.0, 1.0, 4.0, 8192.0);
        assert_eq!(f.len(), 64);
        assert_eq!(f[0], 1.0);
        assert_eq!(f[63], 8.0);
        assert!(f.windows(2).all(|w| w[0] <= w[1]), "{f:?}");
        assert!(f.iter().any(|&x| x > 1.0 && x < 8.0));
    }
}
