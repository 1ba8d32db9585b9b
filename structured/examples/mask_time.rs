//! Mask time per token over a real vocabulary: `cargo run --release -p structured-output --example
//! mask_time [MODEL.gguf] [TOKENS]` (default: the SmolLM2 model of `scripts/fetch-model`, 3000
//! tokens). Follows JSON-schema, regex and Lark constraints by choosing uniformly among the allowed
//! tokens (a seeded generator; EOS only where nothing else is allowed) and prints the median, p99 and
//! maximum time of `compute_mask`, and the one-time cost of building the token environment. A
//! random walk visits harder states than a model usually does (long strings, deep nesting).

use std::time::Instant;

use structured_output::{ConstraintCompiler, ConstraintSpec, Progress, VocabSource};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .map(std::path::PathBuf::from)
        .unwrap_or_else(gguf::testing::default_model_path);
    let tokens: usize = args.next().map(|n| n.parse()).transpose()?.unwrap_or(3000);
    let file = gguf::GgufFile::open(&path)?;
    let meta = gguf::TokenizerMetadata::from_gguf(&file)?;
    let eos: Vec<u32> = meta.eos_token_id.into_iter().collect();
    let started = Instant::now();
    let compiler = ConstraintCompiler::new(VocabSource {
        model: &meta.model,
        tokens: &meta.tokens,
        token_types: &meta.token_types,
        vocab_size: meta.tokens.len(),
        eos_token_ids: &eos,
    })?;
    let build_ms = started.elapsed().as_secs_f64() * 1e3;
    let kinds = [
        ConstraintSpec::JsonSchema(
            r#"{"type":"object","properties":{"name":{"type":"string","maxLength":30},
            "age":{"type":"integer","minimum":0,"maximum":120},"tags":{"type":"array",
            "items":{"enum":["a","b","c"]},"maxItems":4}},"required":["name","age","tags"],
            "additionalProperties":false}"#,
        ),
        ConstraintSpec::JsonSchema(
            r##"{"$defs":{"p":{"type":"object","properties":{"x":{"type":"number"},
            "y":{"type":"number"}},"required":["x","y"]}},"type":"array","items":{"$ref":"#/$defs/p"},
            "maxItems":5}"##,
        ),
        ConstraintSpec::JsonObject,
        ConstraintSpec::Regex(
            r"[A-Z][a-z]{2,12}( [A-Z][a-z]{2,12}){0,3}, [0-9]{1,4} [a-z ]{1,40}\.",
        ),
        ConstraintSpec::Lark("start: item (\",\" item)*\nitem: /[a-z]+/ \"=\" /[0-9]+/"),
    ];
    let mut times = Vec::with_capacity(tokens);
    let mut walks = 0;
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    'walks: for &constraint in kinds.iter().cycle() {
        let mut state = compiler.compile(constraint)?;
        walks += 1;
        for _ in 0..200 {
            if times.len() == tokens {
                break 'walks;
            }
            let t = Instant::now();
            let mask = state.compute_mask()?;
            times.push(t.elapsed().as_secs_f64() * 1e6);
            let allowed: Vec<u32> = (0..meta.tokens.len() as u32)
                .filter(|&id| mask.allows(id) && !eos.contains(&id))
                .collect();
            if allowed.is_empty() {
                break;
            }
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let id = allowed[(x >> 33) as usize % allowed.len()];
            if state.advance(id)? == Progress::Complete {
                break;
            }
        }
    }
    times.sort_by(f64::total_cmp);
    let at = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize];
    println!(
        "vocabulary {} tokens ({}): token environment built in {build_ms:.0} ms",
        meta.tokens.len(),
        meta.model
    );
    let mean = times.iter().sum::<f64>() / times.len().max(1) as f64;
    println!(
        "compute_mask over {} tokens in {walks} walks: median {:.1} us, p90 {:.1} us, p99 {:.1} us, \
         max {:.1} us, mean {mean:.1} us",
        times.len(),
        at(0.5),
        at(0.9),
        at(0.99),
        times.last().copied().unwrap_or(0.0)
    );
    Ok(())
}
