//! Reference (scalar) encoders/decoders for the supported tensor formats.
//!
//! Block layouts follow ggml (`ggml-common.h`, `ggml-quants.c` in llama.cpp):
//! - `Q8_0`: 32 elements = f16 `d` + 32 × i8 `q`; `x = q * d`.
//! - `Q4_0`: 32 elements = f16 `d` + 16 bytes; `x = (q - 8) * d`.
//! - `Q4_1`: 32 elements = f16 `d`, f16 `m` + 16 bytes; `x = q * d + m`.
//!
//! In both 4-bit formats byte `j` holds element `j` in its low nibble and
//! element `j + 16` in its high nibble. All multi-byte values are little-endian.

use half::{bf16, f16};

use crate::error::{GgufError, Result};
use crate::kquant;
use crate::GgmlType;

/// Elements per block for every supported quantized format.
pub const QK: usize = 32;

fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// Decodes one 34-byte Q8_0 block into 32 floats.
pub fn dequantize_block_q8_0(block: &[u8], out: &mut [f32]) {
    let d = f16_at(block, 0);
    for (o, &q) in out[..QK].iter_mut().zip(&block[2..2 + QK]) {
        *o = (q as i8) as f32 * d;
    }
}

/// Decodes one 18-byte Q4_0 block into 32 floats.
pub fn dequantize_block_q4_0(block: &[u8], out: &mut [f32]) {
    let d = f16_at(block, 0);
    let qs = &block[2..2 + QK / 2];
    for (j, &b) in qs.iter().enumerate() {
        out[j] = ((b & 0x0F) as i32 - 8) as f32 * d;
        out[j + QK / 2] = ((b >> 4) as i32 - 8) as f32 * d;
    }
}

/// Decodes one 20-byte Q4_1 block into 32 floats.
pub fn dequantize_block_q4_1(block: &[u8], out: &mut [f32]) {
    let d = f16_at(block, 0);
    let m = f16_at(block, 2);
    let qs = &block[4..4 + QK / 2];
    for (j, &b) in qs.iter().enumerate() {
        out[j] = (b & 0x0F) as f32 * d + m;
        out[j + QK / 2] = (b >> 4) as f32 * d + m;
    }
}

/// Decodes `n_elements` values of type `dtype` from `bytes` into `out[..n_elements]`.
///
/// Supports F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 and the k-quants Q4_K, Q5_K and Q6_K
/// (their block decoders are in [`crate::kquant`]).
/// Errors: [`GgufError::UnsupportedType`] for other types;
/// [`GgufError::SizeMismatch`] if `n_elements` is not a whole number of
/// blocks, `bytes` is not exactly the encoded size, or `out` is shorter than
/// `n_elements`.
pub fn dequantize(dtype: GgmlType, bytes: &[u8], n_elements: usize, out: &mut [f32]) -> Result<()> {
    let block = dtype
        .block_size()
        .ok_or(GgufError::UnsupportedType(dtype))?;
    let bpb = dtype.bytes_per_block().expect("supported type");
    if !n_elements.is_multiple_of(block) {
        return Err(GgufError::SizeMismatch(format!(
            "{n_elements} elements is not a multiple of the {dtype} block size {block}"
        )));
    }
    let expected = n_elements / block * bpb;
    if bytes.len() != expected {
        return Err(GgufError::SizeMismatch(format!(
            "{n_elements} {dtype} elements need {expected} bytes, got {}",
            bytes.len()
        )));
    }
    if out.len() < n_elements {
        return Err(GgufError::SizeMismatch(format!(
            "output holds {} floats, need {n_elements}",
            out.len()
        )));
    }
    let out = &mut out[..n_elements];
    match dtype {
        GgmlType::F32 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        GgmlType::F16 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = f16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        GgmlType::BF16 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = bf16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        GgmlType::Q8_0
        | GgmlType::Q4_0
        | GgmlType::Q4_1
        | GgmlType::Q5_0
        | GgmlType::Q5_1
        | GgmlType::Q4_K
        | GgmlType::Q5_K
        | GgmlType::Q6_K => {
            let f: fn(&[u8], &mut [f32]) = match dtype {
                GgmlType::Q8_0 => dequantize_block_q8_0,
                GgmlType::Q4_0 => dequantize_block_q4_0,
                GgmlType::Q4_1 => dequantize_block_q4_1,
                GgmlType::Q5_0 => kquant::dequantize_block_q5_0,
                GgmlType::Q5_1 => kquant::dequantize_block_q5_1,
                GgmlType::Q4_K => kquant::dequantize_block_q4_k,
                GgmlType::Q5_K => kquant::dequantize_block_q5_k,
                _ => kquant::dequantize_block_q6_k,
            };
            for (o, b) in out.chunks_exact_mut(block).zip(bytes.chunks_exact(bpb)) {
                f(b, o);
            }
        }
        GgmlType::Unsupported(_) => unreachable!("rejected above"),
    }
    Ok(())
}

/// Convenience wrapper around [`dequantize`] that allocates the output vector.
pub fn dequantize_to_vec(dtype: GgmlType, bytes: &[u8], n_elements: usize) -> Result<Vec<f32>> {
    let mut out = vec![0.0; n_elements];
    dequantize(dtype, bytes, n_elements, &mut out)?;
    Ok(out)
}

fn check_blocks(n: usize) -> Result<()> {
    if !n.is_multiple_of(QK) {
        return Err(GgufError::SizeMismatch(format!(
            "{n} elements is not a multiple of the block size {QK}"
        )));
    }
    Ok(())
}

/// Encodes `x` (length a multiple of 32) as Q8_0: per block `d = max|x| / 127`
/// (stored as f16), `q = round(x / d)`, as in ggml's `quantize_row_q8_0_ref`.
/// Errors: `SizeMismatch` if the length is not a multiple of 32.
pub fn quantize_q8_0(x: &[f32]) -> Result<Vec<u8>> {
    check_blocks(x.len())?;
    let mut out = Vec::with_capacity(x.len() / QK * 34);
    for blk in x.chunks_exact(QK) {
        let amax = blk.iter().fold(0.0f32, |a, &v| a.max(v.abs()));
        let d = f16::from_f32(amax / 127.0);
        let df = d.to_f32();
        let id = if df != 0.0 { 1.0 / df } else { 0.0 };
        out.extend_from_slice(&d.to_le_bytes());
        for &v in blk {
            out.push((v * id).round().clamp(-127.0, 127.0) as i8 as u8);
        }
    }
    Ok(out)
}

/// Encodes `x` (length a multiple of 32) as Q4_1: per block `m = min(x)`,
/// `d = (max - min) / 15` (both stored as f16), `q = round((x - m) / d)`
/// clamped to 0..=15, computed against the f16-rounded `d` and `m` so the
/// reconstruction error stays within about `d / 2` (ggml's
/// `quantize_row_q4_1_ref` uses the unrounded values).
/// Errors: `SizeMismatch` if the length is not a multiple of 32.
pub fn quantize_q4_1(x: &[f32]) -> Result<Vec<u8>> {
    check_blocks(x.len())?;
    let mut out = Vec::with_capacity(x.len() / QK * 20);
    for blk in x.chunks_exact(QK) {
        let min = blk.iter().fold(f32::INFINITY, |a, &v| a.min(v));
        let max = blk.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v));
        let d = f16::from_f32((max - min) / 15.0);
        let m = f16::from_f32(min);
        let (df, mf) = (d.to_f32(), m.to_f32());
        let id = if df != 0.0 { 1.0 / df } else { 0.0 };
        out.extend_from_slice(&d.to_le_bytes());
        out.extend_from_slice(&m.to_le_bytes());
        let q = |v: f32| ((v - mf) * id).round().clamp(0.0, 15.0) as u8;
        for j in 0..QK / 2 {
            out.push(q(blk[j]) | (q(blk[j + QK / 2]) << 4));
        }
    }
    Ok(out)
}

/// Encodes `x` as little-endian IEEE binary16 (round to nearest even).
pub fn quantize_f16(x: &[f32]) -> Vec<u8> {
    x.iter()
        .flat_map(|&v| f16::from_f32(v).to_le_bytes())
        .collect()
}

/// Encodes `x` as little-endian f32 bytes.
pub fn encode_f32(x: &[f32]) -> Vec<u8> {
    x.iter().flat_map(|v| v.to_le_bytes()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ramp(n: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0)
            .collect()
    }

    #[test]
    fn q8_0_known_block() {
        let mut block = vec![0u8; 34];
        block[..2].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
        for j in 0..32 {
            block[2 + j] = (j as i8 - 16) as u8;
        }
        let out = dequantize_to_vec(GgmlType::Q8_0, &block, 32).unwrap();
        for (j, v) in out.iter().enumerate() {
            assert_eq!(*v, (j as f32 - 16.0) * 0.5);
        }
    }

    #[test]
    fn q4_1_known_block_nibble_order() {
        let mut block = vec![0u8; 20];
        block[..2].copy_from_slice(&f16::from_f32(2.0).to_le_bytes());
        block[2..4].copy_from_slice(&f16::from_f32(-1.0).to_le_bytes());
        for j in 0..16 {
            block[4 + j] = (j as u8) | ((15 - j as u8) << 4);
        }
        let out = dequantize_to_vec(GgmlType::Q4_1, &block, 32).unwrap();
        for j in 0..16 {
            assert_eq!(out[j], j as f32 * 2.0 - 1.0, "low nibble {j}");
            assert_eq!(out[j + 16], (15 - j) as f32 * 2.0 - 1.0, "high nibble {j}");
        }
    }

    #[test]
    fn q4_0_known_block() {
        let mut block = vec![0u8; 18];
        block[..2].copy_from_slice(&f16::from_f32(0.25).to_le_bytes());
        for j in 0..16 {
            block[2 + j] = (j as u8) | (((j as u8 + 1) & 15) << 4);
        }
        let out = dequantize_to_vec(GgmlType::Q4_0, &block, 32).unwrap();
        for j in 0..16 {
            assert_eq!(out[j], (j as f32 - 8.0) * 0.25);
            assert_eq!(out[j + 16], (((j + 1) & 15) as f32 - 8.0) * 0.25);
        }
    }

    #[test]
    fn q8_0_roundtrip_error_bound() {
        let x = ramp(256);
        let y = dequantize_to_vec(GgmlType::Q8_0, &quantize_q8_0(&x).unwrap(), 256).unwrap();
        for (blk_x, blk_y) in x.chunks(32).zip(y.chunks(32)) {
            let amax = blk_x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
            for (a, b) in blk_x.iter().zip(blk_y) {
                // half a quantization step plus f16 rounding of d.
                assert!(
                    (a - b).abs() <= amax / 127.0 * 0.5 + amax * 1e-3,
                    "{a} vs {b}"
                );
            }
        }
    }

    #[test]
    fn q4_1_roundtrip_error_bound() {
        let x = ramp(512);
        let y = dequantize_to_vec(GgmlType::Q4_1, &quantize_q4_1(&x).unwrap(), 512).unwrap();
        for (blk_x, blk_y) in x.chunks(32).zip(y.chunks(32)) {
            let min = blk_x.iter().fold(f32::INFINITY, |a, &v| a.min(v));
            let max = blk_x.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v));
            let step = (max - min) / 15.0;
            for (a, b) in blk_x.iter().zip(blk_y) {
                assert!((a - b).abs() <= step * 0.5 + 1e-2, "{a} vs {b}");
            }
        }
    }

    #[test]
    fn constant_block_is_exact() {
        let x = vec![0.75f32; 32];
        let y = dequantize_to_vec(GgmlType::Q4_1, &quantize_q4_1(&x).unwrap(), 32).unwrap();
        assert!(y.iter().all(|&v| v == 0.75));
        let z = vec![0.0f32; 32];
        let y = dequantize_to_vec(GgmlType::Q8_0, &quantize_q8_0(&z).unwrap(), 32).unwrap();
        assert!(y.iter().all(|&v| v == 0.0));
    }

    #[test]
    fn float_formats() {
        let x = [1.0f32, -2.5, 0.099_975_586, 65504.0];
        let y = dequantize_to_vec(GgmlType::F16, &quantize_f16(&x), 4).unwrap();
        assert_eq!(y, x);
        let y = dequantize_to_vec(GgmlType::F32, &encode_f32(&x), 4).unwrap();
        assert_eq!(y, x);
        let bytes: Vec<u8> = [1.0f32, -3.0]
            .iter()
            .flat_map(|&v| bf16::from_f32(v).to_le_bytes())
            .collect();
        assert_eq!(
            dequantize_to_vec(GgmlType::BF16, &bytes, 2).unwrap(),
            [1.0, -3.0]
        );
    }

    #[test]
    fn size_errors() {
        assert!(matches!(
            dequantize_to_vec(GgmlType::Q8_0, &[0; 34], 33),
            Err(GgufError::SizeMismatch(_))
        ));
        assert!(matches!(
            dequantize_to_vec(GgmlType::Q8_0, &[0; 33], 32),
            Err(GgufError::SizeMismatch(_))
        ));
        assert!(matches!(
            dequantize_to_vec(GgmlType::Unsupported(16), &[0; 33], 32),
            Err(GgufError::UnsupportedType(_))
        ));
        assert!(quantize_q4_1(&[0.0; 31]).is_err());
    }
}
