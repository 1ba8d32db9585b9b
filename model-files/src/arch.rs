//! [`Arch`]: the architectures served, one list for the GGUF reader, the Hugging Face folder
//! converter and the worker.

/// The model architectures served, named as GGUF names them (`general.architecture`). Hugging
/// Face folders map their `model_type` onto these (`Arch::of`, in [`crate::hf`]); the worker's
/// model description and both backends take it from here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Arch {
    /// `llama`: Llama 2/3/3.x, Mistral, SmolLM2 (and every model llama.cpp converts as `llama`).
    Llama,
    /// `qwen2`: Qwen 2 / 2.5 (Q/K/V biases).
    Qwen2,
    /// `qwen3`: Qwen 3 dense (per-head Q/K RMSNorm).
    Qwen3,
    /// `gemma2`: Gemma 2 (post-norms, GeGLU, soft-capping, alternating sliding window).
    Gemma2,
    /// `gemma3`: Gemma 3 text (Gemma 2's layout with Q/K norms, 5 local : 1 global layers).
    Gemma3,
    /// `phi3`: Phi-3 / Phi-3.5 mini (fused QKV and gate|up projections).
    Phi3,
}

impl Arch {
    /// Every supported architecture.
    pub const ALL: [Arch; 6] = [
        Arch::Llama,
        Arch::Qwen2,
        Arch::Qwen3,
        Arch::Gemma2,
        Arch::Gemma3,
        Arch::Phi3,
    ];

    /// The architecture named `name` (GGUF's spelling), if supported.
    pub fn from_name(name: &str) -> Option<Arch> {
        Arch::ALL.into_iter().find(|a| a.name() == name)
    }

    /// GGUF's name (`general.architecture`, and the prefix of the architecture's keys).
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Gemma2 => "gemma2",
            Arch::Gemma3 => "gemma3",
            Arch::Phi3 => "phi3",
        }
    }
}

impl std::fmt::Display for Arch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
