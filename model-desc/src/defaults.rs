//! Settings an architecture needs that GGUF files do not store: the published defaults of each
//! architecture, in one place. Every value names its source: the Hugging Face `transformers`
//! configuration class of the architecture (the values its checkpoints are trained with) and the
//! llama.cpp loader (`src/llama-model.cpp`, `load_hparams`), which hard-codes the same values
//! because its converter does not write them either.

use super::Arch;

/// RoPE base θ when `{arch}.rope.freq_base` is absent (Llama 2's value; HF `ModelDesc`
/// `rope_theta = 10000.0`; llama.cpp's default `rope_freq_base_train`).
pub const ROPE_BASE: f32 = 10000.0;

/// RMSNorm epsilon when `{arch}.attention.layer_norm_rms_epsilon` is absent (HF `ModelDesc`
/// `rms_norm_eps = 1e-6` is the class default, but llama.cpp falls back to 1e-5, the value of
/// the original Llama weights; converted files always store it).
pub const RMS_EPS: f32 = 1e-5;

/// Gemma 3's local layers: a layer is global (full attention, the file's RoPE base) iff
/// `(layer + 1) % GEMMA3_SLIDING_PERIOD == 0`, i.e. layers 5, 11, 17, ... (HF
/// `Gemma3TextConfig.sliding_window_pattern = 6`, from which `layer_types` is built; llama.cpp
/// `hparams.set_swa_pattern(6)`). The window itself is in the file
/// (`gemma3.attention.sliding_window`, 512 for Gemma 3 270M); a file without it is read as all
/// global (llama.cpp does the same).
pub const GEMMA3_SLIDING_PERIOD: usize = 6;

/// RoPE base of Gemma 3's local layers when `gemma3.rope.freq_base_swa` is absent (HF
/// `Gemma3TextConfig.rope_local_base_freq = 10000.0`; llama.cpp
/// `hparams.rope_freq_base_train_swa = 10000.0f`, with no position scaling). Global
/// layers use the file's `gemma3.rope.freq_base` (1e6) and its linear scaling, if any.
pub const GEMMA3_LOCAL_ROPE_BASE: f32 = 10000.0;

/// Gemma 2 alternates local and global layers: a layer is local iff it is even (HF
/// `Gemma2Config.layer_types`: sliding when `(i + 1) % 2`; llama.cpp `set_swa_pattern(2)`).
pub const GEMMA2_SLIDING_PERIOD: usize = 2;

/// Gemma 2's window when `gemma2.attention.sliding_window` is absent (HF
/// `Gemma2Config.sliding_window = 4096`; llama.cpp `hparams.n_swa = 4096`).
pub const GEMMA2_SLIDING_WINDOW: usize = 4096;

/// Gemma 2's attention-score soft-cap when `gemma2.attn_logit_softcapping` is absent (HF
/// `Gemma2Config.attn_logit_softcapping = 50.0`; llama.cpp's default for `gemma2`).
pub const GEMMA2_ATTN_SOFTCAP: f32 = 50.0;

/// Gemma 2's logit soft-cap when `gemma2.final_logit_softcapping` is absent (HF
/// `Gemma2Config.final_logit_softcapping = 30.0`; llama.cpp's default for `gemma2`).
pub const GEMMA2_FINAL_SOFTCAP: f32 = 30.0;

/// Whether layer `layer` is a sliding-window (local) layer of `arch`: Gemma 2's even layers,
/// Gemma 3's five of every six; no layer of the other architectures. Mistral 7B v0.1's
/// window and Phi-3's `sliding_window` are ignored as llama.cpp ignores them (Phi-3: llama.cpp
/// PR #13676, "Phi SWA is currently disabled"; Mistral's later releases dropped the window).
pub fn is_local_layer(arch: Arch, layer: usize) -> bool {
    match arch {
        Arch::Gemma2 => !(layer + 1).is_multiple_of(GEMMA2_SLIDING_PERIOD),
        Arch::Gemma3 => !(layer + 1).is_multiple_of(GEMMA3_SLIDING_PERIOD),
        Arch::Llama | Arch::Qwen2 | Arch::Qwen3 | Arch::Phi3 => false,
    }
}

/// Gemma's `query_pre_attn_scalar` (attention scores are scaled by its inverse square root),
/// which GGUF does not store: the head size, except for the 27B models, whose scalar is
/// `hidden / n_heads` (Gemma 2 27B: 46 layers, 4608 / 32 = 144; Gemma 3 27B: 62 layers,
/// 5376 / 32 = 168). This is llama.cpp's rule (`f_attention_scale` for `LLM_TYPE_27B`, after
/// google/gemma_pytorch `config.py`); HF configs store the same values per checkpoint (Gemma 3
/// 270M: 256 = its head size).
pub fn gemma_query_pre_attn_scalar(
    arch: Arch,
    n_layers: usize,
    hidden: usize,
    n_heads: usize,
    head_dim: usize,
) -> usize {
    let is_27b = matches!((arch, n_layers), (Arch::Gemma2, 46) | (Arch::Gemma3, 62));
    if is_27b {
        hidden / n_heads
    } else {
        head_dim
    }
}

/// Gemma multiplies the token embeddings by `sqrt(hidden)`, rounded to f32 from the double (HF
/// `Gemma2Model`/`Gemma3TextModel`: `hidden_size ** 0.5` cast to the activations' dtype;
/// llama.cpp `ggml_scale(inpL, sqrtf(n_embd))`).
pub fn gemma_embed_scale(hidden: usize) -> f32 {
    (hidden as f64).sqrt() as f32
}
