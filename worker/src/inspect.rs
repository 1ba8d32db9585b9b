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
        assert!(i.report.contains(", bos 1, eos 2, "), "{}", i.report);
        assert!(
            i.report.contains("sampling       none recommended"),
            "{}",
            i.report
        );
        assert_eq!(token_id(None), "none");
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
