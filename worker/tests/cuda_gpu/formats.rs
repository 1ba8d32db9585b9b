//! Weight formats for the GPU checks (part of `cuda_gpu`): test matrices in every format the
//! kernels decode, llama.cpp's fixture blocks, and a decode through the `embedding` kernel.

use cudarc::driver::PushKernelArg;
use gguf::GgmlType;
use half::{bf16, f16};
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use serde_json::Value;

use super::common::{random, rows_cfg, Kernels};

/// Every weight format the CUDA kernels decode.
pub const ALL_FORMATS: [GgmlType; 11] = [
    GgmlType::Q4_1,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::F32,
];

/// Encodes `w` (`[rows, cols]`) in `format` as a GGUF tensor would store it.
pub fn encode(format: GgmlType, w: &[f32]) -> Vec<u8> {
    match format {
        GgmlType::F32 => gguf::quant::encode_f32(w),
        GgmlType::F16 => gguf::quant::quantize_f16(w),
        GgmlType::BF16 => w
            .iter()
            .flat_map(|x| bf16::from_f32(*x).to_le_bytes())
            .collect(),
        GgmlType::Q8_0 => gguf::quantize_q8_0(w).unwrap(),
        GgmlType::Q4_1 => gguf::quantize_q4_1(w).unwrap(),
        GgmlType::Q4_0 => w
            .chunks_exact(32)
            .flat_map(|b| {
                let amax = b.iter().fold(0.0f32, |m, x| m.max(x.abs()));
                let d = amax / 8.0;
                let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
                let q = |x: f32| ((x * inv + 8.5) as i32).clamp(0, 15) as u8;
                let mut out = f16::from_f32(d).to_le_bytes().to_vec();
                out.extend((0..16).map(|j| q(b[j]) | (q(b[j + 16]) << 4)));
                out
            })
            .collect(),
        // No quantizer for these here: [`weight_bytes`] writes random blocks instead.
        GgmlType::Q5_0
        | GgmlType::Q5_1
        | GgmlType::Q4_K
        | GgmlType::Q5_K
        | GgmlType::Q6_K
        | GgmlType::Unsupported(_) => unreachable!("no encoder for {format}"),
    }
}

/// Byte offsets of the f16 scales (d, and dmin or m) in one block of the formats encoded as random
/// blocks, and the block size in bytes.
pub fn scale_fields(format: GgmlType) -> Option<(&'static [usize], usize)> {
    Some(match format {
        GgmlType::Q5_0 => (&[0], 22),
        GgmlType::Q5_1 => (&[0, 2], 24),
        GgmlType::Q4_K => (&[0, 2], 144),
        GgmlType::Q5_K => (&[0, 2], 176),
        GgmlType::Q6_K => (&[208], 210),
        _ => return None,
    })
}

/// A `[rows, cols]` weight matrix in `format` as a GGUF tensor stores it: the formats with an
/// encoder quantize random values; the 5-bit formats and k-quants get random blocks (every quant,
/// scale and high bit random) whose f16 scales are set to random finite values in [2^-10, 2^-4),
/// so every bit pattern of the layout is exercised.
pub fn weight_bytes(format: GgmlType, rng: &mut ChaCha8Rng, rows: usize, cols: usize) -> Vec<u8> {
    let Some((scales, block)) = scale_fields(format) else {
        return encode(format, &random(rng, rows * cols, 0.5));
    };
    let n = format.byte_size((rows * cols) as u64).unwrap() as usize;
    let mut bytes: Vec<u8> = (0..n).map(|_| rng.random()).collect();
    for b in bytes.chunks_exact_mut(block) {
        for &at in scales {
            let v = f16::from_f32(rng.random_range(1.0f32 / 1024.0..1.0 / 16.0));
            b[at..at + 2].copy_from_slice(&v.to_le_bytes());
        }
    }
    bytes
}

/// Runs `embedding` over `table` (`[rows, cols]` in `format`) for every row; returns the decoded
/// rows as the activation buffer stores them.
pub fn run_embedding(
    k: &Kernels,
    format: GgmlType,
    table: &[u8],
    rows: usize,
    cols: usize,
) -> Vec<f32> {
    let tokens: Vec<u32> = (0..rows as u32).collect();
    embed_tokens(k, format, table, &tokens, cols)
}

/// Runs `embedding` for `tokens` over `table` (rows of `cols` in `format`); returns their decoded
/// rows as the activation buffer stores them.
pub fn embed_tokens(
    k: &Kernels,
    format: GgmlType,
    table: &[u8],
    tokens: &[u32],
    cols: usize,
) -> Vec<f32> {
    let d_table = k.stream.clone_htod(table).unwrap();
    let d_tokens = k.stream.clone_htod(tokens).unwrap();
    let out = k.act(&vec![0.0; tokens.len() * cols]);
    let (n, fmt, h, one) = (tokens.len() as i32, format.id() as i32, cols as i32, 1.0f32);
    let mut b = k.stream.launch_builder(&k.funcs["embedding"]);
    b.arg(&d_tokens)
        .arg(&n)
        .arg(&d_table)
        .arg(&fmt)
        .arg(&h)
        .arg(&one)
        .arg(&out);
    unsafe { b.launch(rows_cfg(tokens.len(), 128, 0)) }.unwrap();
    k.read_act(&out, tokens.len() * cols)
}

/// The raw blocks of `fixtures/quant-blocks.json` (written by llama.cpp) with their exact f32
/// values: `(format, block elements, bytes of all blocks, values of all blocks)`.
pub fn fixture_blocks() -> Vec<(GgmlType, usize, Vec<u8>, Vec<f32>)> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/quant-blocks.json");
    let json: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let types = json["types"].as_object().unwrap();
    let format = |name: &str| match name {
        "Q4_1" => GgmlType::Q4_1,
        "Q8_0" => GgmlType::Q8_0,
        "Q5_0" => GgmlType::Q5_0,
        "Q5_1" => GgmlType::Q5_1,
        "Q4_K" => GgmlType::Q4_K,
        "Q5_K" => GgmlType::Q5_K,
        "Q6_K" => GgmlType::Q6_K,
        other => panic!("fixture type {other}"),
    };
    types
        .iter()
        .map(|(name, t)| {
            let elems = t["block_elems"].as_u64().unwrap() as usize;
            let (mut bytes, mut values) = (Vec::new(), Vec::new());
            for b in t["blocks"].as_array().unwrap() {
                let hex = b["hex"].as_str().unwrap();
                bytes.extend(
                    (0..hex.len())
                        .step_by(2)
                        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()),
                );
                values.extend(
                    b["values"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|v| v.as_f64().unwrap() as f32),
                );
            }
            (format(name), elems, bytes, values)
        })
        .collect()
}
