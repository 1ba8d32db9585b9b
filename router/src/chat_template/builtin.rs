//! Built-in chat templates, for model files that carry none (Gemma 3's GGUF, for one): the chat
//! format of the model's family, chosen by `general.architecture` and used only when the
//! vocabulary has every special token the format writes.
//!
//! | architecture | template | special tokens it needs |
//! |---|---|---|
//! | `gemma`, `gemma2`, `gemma3` | `gemma` | `<start_of_turn>`, `<end_of_turn>` |
//! | `qwen2`, `qwen3` | `chatml` | `<|im_start|>`, `<|im_end|>` |
//! | `phi3` | `phi3` | `<|user|>`, `<|assistant|>`, `<|end|>` |
//! | `llama` | `llama3` when the vocabulary is Llama 3's, else `chatml` when it has ChatML's tokens | see those rows |
//!
//! The formats follow the templates each family publishes with its instruction-tuned models
//! (`tokenizer_config.json` on the Hugging Face Hub), written here without tool calling and without
//! trimming content (content is kept apart from markup; see the module docs of [`super`]).

/// A built-in chat template.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BuiltinTemplate {
    /// Its name (`"gemma"`, `"chatml"`, `"llama3"`, `"phi3"`).
    pub name: &'static str,
    /// The Jinja source.
    pub source: &'static str,
    /// Special-token texts the template writes; all must be in the vocabulary.
    pub needs: &'static [&'static str],
}

const GEMMA: BuiltinTemplate = BuiltinTemplate {
    name: "gemma",
    source: include_str!("builtin/gemma.jinja"),
    needs: &["<start_of_turn>", "<end_of_turn>"],
};

const CHATML: BuiltinTemplate = BuiltinTemplate {
    name: "chatml",
    source: include_str!("builtin/chatml.jinja"),
    needs: &["<|im_start|>", "<|im_end|>"],
};

const LLAMA3: BuiltinTemplate = BuiltinTemplate {
    name: "llama3",
    source: include_str!("builtin/llama3.jinja"),
    needs: &["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
};

const PHI3: BuiltinTemplate = BuiltinTemplate {
    name: "phi3",
    source: include_str!("builtin/phi3.jinja"),
    needs: &["<|user|>", "<|assistant|>", "<|end|>"],
};

/// The built-in template for `architecture` (`general.architecture`), if there is one whose special
/// tokens the vocabulary has (`has_token(text)` says whether a token with exactly that text exists).
pub fn builtin_template(
    architecture: &str,
    has_token: impl Fn(&str) -> bool,
) -> Option<BuiltinTemplate> {
    let candidates: &[BuiltinTemplate] = match architecture {
        "gemma" | "gemma2" | "gemma3" => &[GEMMA],
        "qwen2" | "qwen3" => &[CHATML],
        "phi3" => &[PHI3],
        "llama" => &[LLAMA3, CHATML],
        _ => &[],
    };
    candidates
        .iter()
        .find(|t| t.needs.iter().all(|s| has_token(s)))
        .copied()
}
