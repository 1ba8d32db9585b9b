//! Test helpers (feature `testing`): the location of the real models and a tiny random llama GGUF.

use std::path::{Path, PathBuf};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::error::Result;
use crate::{GgmlType, GgufWriter};

/// File name of the real test model.
pub const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// The SmolLM2-135M-Instruct chat template, copied verbatim from the real
/// model's `tokenizer.chat_template`.
pub const SMOLLM2_CHAT_TEMPLATE: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// Path of the real model: `$SMOLLM_MODEL` if set, else
/// `<workspace root>/.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf`.
/// The file may not exist (fetch it with `scripts/fetch-model`).
pub fn default_model_path() -> PathBuf {
    if let Some(p) = std::env::var_os("SMOLLM_MODEL") {
        return PathBuf::from(p);
    }
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .join(".cache/models")
        .join(DEFAULT_MODEL_FILE)
}

/// File name of the Gemma 3 270M test model (`scripts/fetch-model gemma3-270m`).
pub const GEMMA3_MODEL_FILE: &str = "gemma-3-270m-q4_k_m.gguf";

/// Path of the Gemma 3 270M Q4_K_M model: `$GEMMA3_MODEL` if set, else
/// `<workspace root>/.cache/models/gemma-3-270m-q4_k_m.gguf`. The file may not exist (fetch it with
/// `scripts/fetch-model gemma3-270m`).
pub fn gemma3_model_path() -> PathBuf {
    if let Some(p) = std::env::var_os("GEMMA3_MODEL") {
        return PathBuf::from(p);
    }
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .join(".cache/models")
        .join(GEMMA3_MODEL_FILE)
}

/// Shape and vocabulary of the model written by [`write_tiny_llama`].
#[derive(Debug, Clone, PartialEq)]
pub struct TinyModelInfo {
    /// Transformer blocks (2).
    pub n_layers: usize,
    /// Embedding width (64).
    pub hidden: usize,
    /// Query heads (4).
    pub n_heads: usize,
    /// Key/value heads (2).
    pub n_kv_heads: usize,
    /// Per-head width (16).
    pub head_dim: usize,
    /// Feed-forward width (128).
    pub ffn_dim: usize,
    /// Maximum positions (256).
    pub context_length: usize,
    /// RoPE base (10000).
    pub rope_base: f32,
    /// RMSNorm epsilon (1e-5).
    pub rms_eps: f32,
    /// Token strings by id (3 specials, 256 byte symbols, then merge results).
    pub tokens: Vec<String>,
    /// BPE merges in priority order (`"left right"`).
    pub merges: Vec<String>,
    /// Beginning-of-sequence id (1, `<|im_start|>`).
    pub bos_token_id: u32,
    /// End-of-sequence id (2, `<|im_end|>`).
    pub eos_token_id: u32,
}

impl TinyModelInfo {
    /// Number of tokens in the vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }
}

const TINY_MERGES: &[&str] = &[
    "Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "o n", "Ġ Ġ", "r e", "Ġ s", "in g", "Ġa n",
    "Ġan d", "Ċ Ċ", "Ġ i", "Ġ o", "e s", "a t", "Ġ w", "o r",
];

/// A standard normal sample via Box-Muller.
fn normal(rng: &mut ChaCha8Rng) -> f32 {
    let u1: f32 = rng.random::<f32>().max(1e-7);
    let u2: f32 = rng.random();
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f32::consts::PI * u2).cos()
}

fn randn(rng: &mut ChaCha8Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| normal(rng) * scale).collect()
}

/// Writes a small random-weight llama GGUF to `path` for fast tests.
///
/// Architecture: hidden 64, 2 layers, 4 heads, 2 KV heads (head_dim 16),
/// FFN 128, context 256, RoPE base 10000, RMS eps 1e-5, tied embeddings (no
/// `output.weight`). Vocabulary: `<|endoftext|>`, `<|im_start|>`,
/// `<|im_end|>` (token type 3), the 256 GPT-2 byte symbols (type 1), then one
/// token per merge in a short merge list. Tokenizer metadata mimics
/// SmolLM2 (`gpt2` model, `smollm` pre-tokenizer, bos 1, eos 2,
/// `add_bos_token` false, SmolLM2 chat template).
///
/// Formats: `token_embd` Q8_0; layer 0 matrices Q4_1; layer 1 attention
/// matrices F16 and FFN matrices F32; norms F32. Weights are
/// `N(0, 1) * 0.1..0.5` and norm weights `1 + N(0, 1) * 0.1`, deterministic
/// in `seed` (ChaCha8).
///
/// Errors: [`crate::GgufError::Io`] if the file cannot be written.
pub fn write_tiny_llama(path: &Path, seed: u64) -> Result<TinyModelInfo> {
    write_tiny_llama_with_context(path, seed, 256)
}

/// [`write_tiny_llama`] with `llama.context_length` = `context_length` (the weights are the same for
/// a given `seed`): for tests that need prompts of thousands of tokens.
///
/// Errors: [`crate::GgufError::Io`] if the file cannot be written.
pub fn write_tiny_llama_with_context(
    path: &Path,
    seed: u64,
    context_length: usize,
) -> Result<TinyModelInfo> {
    let b2u = ::tokenizer::byte_level::byte_to_unicode();
    let mut tokens: Vec<String> = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let mut token_types = vec![3i32; 3];
    tokens.extend(b2u.iter().map(|c| c.to_string()));
    token_types.extend(std::iter::repeat_n(1, 256));
    for m in TINY_MERGES {
        tokens.push(m.replace(' ', ""));
        token_types.push(1);
    }
    let info = TinyModelInfo {
        n_layers: 2,
        hidden: 64,
        n_heads: 4,
        n_kv_heads: 2,
        head_dim: 16,
        ffn_dim: 128,
        context_length,
        rope_base: 10000.0,
        rms_eps: 1e-5,
        merges: TINY_MERGES.iter().map(|s| s.to_string()).collect(),
        tokens,
        bos_token_id: 1,
        eos_token_id: 2,
    };
    let (h, f, kv) = (
        info.hidden as u64,
        info.ffn_dim as u64,
        (info.n_kv_heads * info.head_dim) as u64,
    );
    let vocab = info.vocab_size() as u64;

    let mut w = GgufWriter::new();
    w.add_string("general.architecture", "llama")
        .add_string("general.name", "tiny-llama-test")
        .add_u32("general.alignment", 32)
        .add_u32("llama.block_count", info.n_layers as u32)
        .add_u32("llama.context_length", info.context_length as u32)
        .add_u32("llama.embedding_length", h as u32)
        .add_u32("llama.feed_forward_length", f as u32)
        .add_u32("llama.attention.head_count", info.n_heads as u32)
        .add_u32("llama.attention.head_count_kv", info.n_kv_heads as u32)
        .add_f32("llama.rope.freq_base", info.rope_base)
        .add_f32("llama.attention.layer_norm_rms_epsilon", info.rms_eps)
        .add_u32("llama.vocab_size", vocab as u32)
        .add_u32("llama.rope.dimension_count", info.head_dim as u32)
        .add_string("tokenizer.ggml.model", "gpt2")
        .add_string("tokenizer.ggml.pre", "smollm")
        .add_str_array("tokenizer.ggml.tokens", &info.tokens)
        .add_i32_array("tokenizer.ggml.token_type", &token_types)
        .add_str_array("tokenizer.ggml.merges", &info.merges)
        .add_u32("tokenizer.ggml.bos_token_id", info.bos_token_id)
        .add_u32("tokenizer.ggml.eos_token_id", info.eos_token_id)
        .add_u32("tokenizer.ggml.unknown_token_id", 0)
        .add_u32("tokenizer.ggml.padding_token_id", 2)
        .add_bool("tokenizer.ggml.add_bos_token", false)
        .add_string("tokenizer.chat_template", SMOLLM2_CHAT_TEMPLATE);

    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let emb = randn(&mut rng, (h * vocab) as usize, 0.5);
    w.add_tensor_f32("token_embd.weight", &[h, vocab], GgmlType::Q8_0, &emb)?;
    for layer in 0..info.n_layers {
        let (attn_t, ffn_t) = if layer == 0 {
            (GgmlType::Q4_1, GgmlType::Q4_1)
        } else {
            (GgmlType::F16, GgmlType::F32)
        };
        let mats: [(&str, [u64; 2], GgmlType, f32); 7] = [
            ("attn_q", [h, h], attn_t, 0.2),
            ("attn_k", [h, kv], attn_t, 0.2),
            ("attn_v", [h, kv], attn_t, 0.2),
            ("attn_output", [h, h], attn_t, 0.1),
            ("ffn_gate", [h, f], ffn_t, 0.15),
            ("ffn_up", [h, f], ffn_t, 0.15),
            ("ffn_down", [f, h], ffn_t, 0.1),
        ];
        for (name, dims, dtype, scale) in mats {
            let v = randn(&mut rng, (dims[0] * dims[1]) as usize, scale);
            w.add_tensor_f32(&format!("blk.{layer}.{name}.weight"), &dims, dtype, &v)?;
        }
        for name in ["attn_norm", "ffn_norm"] {
            let v: Vec<f32> = randn(&mut rng, h as usize, 0.1)
                .iter()
                .map(|x| 1.0 + x)
                .collect();
            w.add_tensor_f32(
                &format!("blk.{layer}.{name}.weight"),
                &[h],
                GgmlType::F32,
                &v,
            )?;
        }
    }
    let v: Vec<f32> = randn(&mut rng, h as usize, 0.1)
        .iter()
        .map(|x| 1.0 + x)
        .collect();
    w.add_tensor_f32("output_norm.weight", &[h], GgmlType::F32, &v)?;
    w.write(path)?;
    Ok(info)
}

/// `n_elements` values of `format` as random but well-formed blocks (test data for decoders and
/// kernels of formats without an encoder here): every byte random from `seed`, then each block's
/// f16 scale fields set to small finite values (`d` in [2^-10, 2^-6), mins likewise), so decoded
/// values are finite and of a plausible magnitude.
///
/// Panics for unsupported formats or an `n_elements` that is not a whole number of blocks.
pub fn random_encoding(format: GgmlType, n_elements: usize, seed: u64) -> Vec<u8> {
    let block = format.block_size().expect("supported format");
    let bpb = format.bytes_per_block().expect("supported format");
    assert!(n_elements.is_multiple_of(block), "whole blocks only");
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut out = vec![0u8; n_elements / block * bpb];
    rng.fill(&mut out[..]);
    if block == 1 {
        // Plain floats: random bits may be NaN; use values in [-1, 1) instead.
        let values: Vec<f32> = (0..n_elements)
            .map(|_| rng.random_range(-1.0f32..1.0))
            .collect();
        return match format {
            GgmlType::F32 => crate::quant::encode_f32(&values),
            GgmlType::F16 => crate::quant::quantize_f16(&values),
            _ => values
                .iter()
                .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
                .collect(),
        };
    }
    // Byte offsets of the f16 fields of one block.
    let fields: &[usize] = match format {
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q6_K => &[208],
        _ => &[0],
    };
    for b in out.chunks_exact_mut(bpb) {
        for &f in fields {
            let v = half::f16::from_f32(rng.random_range(0.001f32..0.015));
            b[f..f + 2].copy_from_slice(&v.to_le_bytes());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{GgufFile, TokenizerMetadata};

    #[test]
    fn tiny_model_is_readable_and_deterministic() {
        let dir = std::env::temp_dir().join(format!("gguf-tiny-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (a, b) = (dir.join("a.gguf"), dir.join("b.gguf"));
        let info = write_tiny_llama(&a, 7).unwrap();
        write_tiny_llama(&b, 7).unwrap();
        assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
        let f = GgufFile::open(&a).unwrap();
        assert_eq!(f.get_u32("llama.embedding_length").unwrap(), 64);
        assert_eq!(f.tensors().len(), 2 + 2 * 9);
        let tok = TokenizerMetadata::from_gguf(&f).unwrap();
        assert_eq!(tok.tokens, info.tokens);
        assert_eq!(tok.tokens[3 + 32], "Ġ");
        assert_eq!(tok.chat_template.as_deref(), Some(SMOLLM2_CHAT_TEMPLATE));
        assert_eq!(tok.eos_token_id, Some(2));
        assert!(!tok.add_bos_token);
        // every merge result must be a token
        for m in &tok.merges {
            assert!(tok.tokens.contains(&m.replace(' ', "")), "{m}");
        }
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn real_model_template_matches_if_present() {
        let path = default_model_path();
        if !path.exists() {
            return;
        }
        let f = GgufFile::open(&path).unwrap();
        let tok = TokenizerMetadata::from_gguf(&f).unwrap();
        assert_eq!(tok.chat_template.as_deref(), Some(SMOLLM2_CHAT_TEMPLATE));
        assert_eq!(tok.tokens.len(), 49152);
        assert_eq!(tok.merges.len(), 48900);
        assert_eq!(f.tensor("token_embd.weight").unwrap().dtype, GgmlType::Q8_0);
    }
}
