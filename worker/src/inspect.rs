//! `worker inspect MODEL`: what a GGUF file or Hugging Face model folder holds (architecture, hyper-parameters, tensor formats,
//! tokenizer) and whether this worker can serve it, checked by loading it exactly as serving would.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use gguf::TokenizerMetadata;

use backend_cpu::{load_weights, CpuModel};
use engine::backend::ModelError;
use model_desc::ModelDesc;

/// The outcome of [`inspect`]: a human-readable report and, when the file cannot be served, why.
#[derive(Debug)]
pub struct Inspection {
    /// Several lines: file, architecture, sizes, tensor formats, tokenizer, verdict.
    pub report: String,
    /// `None` when the CPU backend loads the model; else the one-line reason.
    pub unservable: Option<String>,
}

/// Describes the GGUF file or Hugging Face folder at `path` and loads it as the CPU backend would (every tensor's
/// presence, shape and format checked; the weights are read into memory, so this takes as long as
/// a worker's start).
pub fn inspect(path: &Path) -> Inspection {
    let mut report = String::new();
    let line = |r: &mut String, k: &str, v: String| {
        let _ = writeln!(r, "{k:<14} {v}");
    };
    line(&mut report, "file", path.display().to_string());
    let file = match model_files::open(path) {
        Ok(f) => f,
        Err(e) => {
            let reason = e.to_string();
            line(&mut report, "servable", format!("no: {reason}"));
            return Inspection {
                report,
                unservable: Some(reason),
            };
        }
    };
    let format = match file.origin() {
        Some(origin) => format!("{origin}, {} tensors", file.tensors().len()),
        None => {
            let size = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
            format!(
                "GGUF v{}, {} tensors, {:.1} MiB",
                file.version(),
                file.tensors().len(),
                size as f64 / (1 << 20) as f64
            )
        }
    };
    line(&mut report, "format", format);
    let text = |k: &str| {
        file.get_opt_str(k)
            .ok()
            .flatten()
            .unwrap_or("?")
            .to_string()
    };
    line(&mut report, "name", text("general.name"));
    line(&mut report, "architecture", text("general.architecture"));
    let config = ModelDesc::from_source(&file).map_err(ModelError::from);
    match &config {
        Ok(c) => {
            line(
                &mut report,
                "shape",
                format!(
                    "{} layers, hidden {}, {} heads ({} KV) of {}, ffn {}, vocab {}, context {}, \
                 rope base {}",
                    c.n_layers,
                    c.hidden,
                    c.n_heads,
                    c.n_kv_heads,
                    c.head_dim,
                    c.ffn_dim,
                    c.vocab_size,
                    c.context_length,
                    c.rope_base
                ),
            );
            line(&mut report, "options", c.options_summary());
        }
        Err(e) => line(&mut report, "shape", format!("unknown ({e})")),
    }
    let mut formats: BTreeMap<String, usize> = BTreeMap::new();
    for t in file.tensors() {
        *formats.entry(t.dtype.to_string()).or_default() += 1;
    }
    let formats: Vec<String> = formats.iter().map(|(f, n)| format!("{f} x{n}")).collect();
    line(&mut report, "tensors", formats.join(", "));
    match TokenizerMetadata::from_gguf(&file) {
        Ok(t) => line(
            &mut report,
            "tokenizer",
            format!(
                "{} ({}), {} tokens, bos {}, eos {}, chat template: {}",
                t.model,
                if t.pre.is_empty() { "-" } else { &t.pre },
                t.tokens.len(),
                token_id(t.bos_token_id),
                token_id(t.eos_token_id),
                if t.chat_template.is_some() {
                    "yes"
                } else {
                    "no"
                }
            ),
        ),
        Err(e) => line(&mut report, "tokenizer", format!("unreadable ({e})")),
    }
    let has_template = TokenizerMetadata::from_gguf(&file).is_ok_and(|t| t.chat_template.is_some());
    let file_name = path.file_name().map(|n| n.to_string_lossy().into_owned());
    let names: Vec<&str> = [
        file.get_opt_str("general.finetune").ok().flatten(),
        file.get_opt_str("general.name").ok().flatten(),
        file_name.as_deref(),
    ]
    .into_iter()
    .flatten()
    .collect();
    let tuning = instruction_tuning(&names, has_template);
    line(&mut report, "instruct", tuning.to_string());
    // What the model's authors recommend (`scripts/demo` samples with it).
    let sampling = match model_files::sampling::recommended_sampling(path, &file) {
        Ok(Some(found)) => found.to_string(),
        Ok(None) => {
            "none recommended (no general.sampling.* keys or generation_config.json)".into()
        }
        Err(e) => format!("unreadable ({e})"),
    };
    line(&mut report, "sampling", sampling);
    // The rest of what serving would do with the open file: every tensor read and checked.
    let model = config.and_then(|config| {
        let weights = load_weights(&file, &config)?;
        Ok(CpuModel::from_parts(config, weights))
    });
    let unservable = match model {
        Ok(model) => {
            line(
                &mut report,
                "servable",
                format!(
                    "yes, on the CPU backend ({} bytes of KV cache per token in f32)",
                    model.kv_bytes_per_token()
                ),
            );
            None
        }
        Err(e) => {
            let reason = e.to_string();
            line(&mut report, "servable", format!("no: {reason}"));
            Some(reason)
        }
    };
    Inspection { report, unservable }
}

/// Whether a model is instruction-tuned (made to follow chat turns) or a base (pretrained) model,
/// as far as its file says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tuning {
    /// Its name or `general.finetune` says instruct / chat / it.
    Instruct,
    /// No such name, but the file carries its own chat template.
    LikelyInstruct,
    /// Its name says base / pretrained, or it has neither such a name nor a chat template.
    Base,
}

impl std::fmt::Display for Tuning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Tuning::Instruct => "yes (its name says it is instruction-tuned)",
            Tuning::LikelyInstruct => {
                "likely (it carries its own chat template; its name does not say)"
            }
            Tuning::Base => {
                "no: a base (pretrained) model; chat requests get a built-in template and poor \
                 answers: use /v1/completions, or an instruction-tuned file"
            }
        })
    }
}

/// [`Tuning`] from a model's `names` (the GGUF keys `general.finetune` and `general.name`, and the
/// file or folder name: the words `instruct`, `chat`, `it`, or `base`, `pt`, `pretrained`, in any
/// case, as separate words) and whether the file has a chat template (`tokenizer.chat_template`).
pub fn instruction_tuning(names: &[&str], has_template: bool) -> Tuning {
    let words: Vec<String> = names
        .iter()
        .flat_map(|text| {
            text.split(|c: char| !c.is_ascii_alphanumeric())
                .map(str::to_ascii_lowercase)
                .collect::<Vec<_>>()
        })
        .collect();
    let says = |list: &[&str]| words.iter().any(|w| list.contains(&w.as_str()));
    if says(&["instruct", "chat", "it"]) {
        Tuning::Instruct
    } else if says(&["base", "pt", "pretrained"]) || !has_template {
        Tuning::Base
    } else {
        Tuning::LikelyInstruct
    }
}

/// A special token's id as `inspect` prints it: the number, or `none`.
fn token_id(id: Option<u32>) -> String {
    id.map_or_else(|| "none".to_string(), |id| id.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tiny_model_is_described_and_servable() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiny.gguf");
        gguf::testing::write_tiny_llama(&path, 3).unwrap();
        let i = inspect(&path);
        assert!(i.unservable.is_none(), "{}", i.report);
        assert!(i.report.contains("architecture   llama"), "{}", i.report);
        assert!(i.report.contains("servable       yes"), "{}", i.report);
        assert!(i.report.contains("tokenizer      gpt2"), "{}", i.report);
        assert!(i.report.contains("instruct       likely"), "{}", i.report);
        assert!(i.report.contains(", bos 1, eos 2, "), "{}", i.report);
        assert!(
            i.report.contains("sampling       none recommended"),
            "{}",
            i.report
        );
        assert_eq!(token_id(None), "none");
    }

    #[test]
    fn instruction_tuning_is_read_from_the_name_and_the_template() {
        use Tuning::*;
        let cases: [(&[&str], bool, Tuning); 9] = [
            (&["Instruct", "SmolLM2 135M Instruct"], true, Instruct),
            (&["gemma-3-270m-it"], false, Instruct),
            (&["Qwen2.5 Chat"], true, Instruct),
            // The file name says it where the metadata does not.
            (
                &["Smollm2 135M 8k", "SmolLM2-135M-Instruct.Q4_1.gguf"],
                true,
                Instruct,
            ),
            (&["Gemma 3 270m", "gemma-3-270m-q4_k_m.gguf"], false, Base),
            (&["pt", "gemma-3-270m"], true, Base),
            (&["Llama 3.2 1B"], true, LikelyInstruct),
            (&[], false, Base),
            // Words, not substrings: "Edit" holds "it", "Basement" holds "base".
            (&["Edit Basement"], true, LikelyInstruct),
        ];
        for (names, template, expected) in cases {
            assert_eq!(
                instruction_tuning(names, template),
                expected,
                "{names:?} {template}"
            );
        }
        assert!(Base.to_string().starts_with("no: a base"));
    }

    #[test]
    fn other_architectures_show_their_options() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../fixtures/tiny-arch/gemma2/gemma2-f32.gguf");
        let i = inspect(&path);
        assert!(i.unservable.is_none(), "{}", i.report);
        assert!(i.report.contains("architecture   gemma2"), "{}", i.report);
        assert!(
            i.report.contains("sliding window 8 on 2 of 4 layers"),
            "{}",
            i.report
        );
        assert!(i.report.contains("logit soft-cap 30"), "{}", i.report);
    }

    #[test]
    fn bad_files_say_why() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.gguf");
        std::fs::write(&path, b"not a model").unwrap();
        let i = inspect(&path);
        assert!(i.unservable.unwrap().contains("not a GGUF file"));
        // A truncated file: the tensor data lies outside it.
        let tiny = dir.path().join("tiny.gguf");
        gguf::testing::write_tiny_llama(&tiny, 3).unwrap();
        let bytes = std::fs::read(&tiny).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
        let reason = inspect(&path).unservable.unwrap();
        assert!(reason.contains("outside the file"), "{reason}");
        // Another architecture.
        let mut w = gguf::GgufWriter::new();
        w.add_string("general.architecture", "gpt2");
        w.write(&path).unwrap();
        let i = inspect(&path);
        assert!(i
            .unservable
            .unwrap()
            .contains("unsupported model architecture `gpt2`"));
        assert!(i.report.contains("architecture   gpt2"), "{}", i.report);
    }
}
