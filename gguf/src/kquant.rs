//! Reference (scalar) decoders of the 5-bit formats and the k-quants ("super-block" formats) that
//! most GGUF uploads use (Q4_K_M, Q5_K_M and Q6_K files mix them with Q5_0/Q5_1/Q8_0).
//!
//! Layouts and arithmetic follow ggml (`block_q5_0` .. `block_q6_K` in `ggml-common.h`,
//! `dequantize_row_*` in `ggml-quants.c`, llama.cpp). Every value is computed with the same f32
//! operations in the same order as ggml's C reference, so the output is bit for bit what llama.cpp,
//! the `gguf` Python package and an independent numpy decoder produce (checked against
//! `fixtures/quant-blocks.json`, raw blocks of real tensors with their exact f32 values):
//!
//! - `Q5_0` (32 values, 22 bytes): f16 `d` | u32 `qh` | 16 bytes `qs`. Value `j < 16` is the low
//!   nibble of `qs[j]` with bit `j` of `qh` as its fifth bit, value `j + 16` the high nibble with
//!   bit `j + 16`; `x = (q - 16) * d`.
//! - `Q5_1` (32 values, 24 bytes): f16 `d` | f16 `m` | u32 `qh` | 16 bytes; `x = q * d + m`.
//! - `Q4_K` (256 values, 144 bytes): f16 `d` | f16 `dmin` | 12 bytes of eight 6-bit (scale, min)
//!   pairs | 128 bytes. Four chunks of 64 values: the low nibbles of 32 bytes are sub-block `2c`,
//!   the high nibbles sub-block `2c + 1`; `x = (d * scale) * q - dmin * min`.
//! - `Q5_K` (256 values, 176 bytes): as `Q4_K` with 32 bytes `qh` before the 128 bytes `qs`; chunk
//!   `c` takes bit `2c` (low nibbles) and `2c + 1` (high nibbles) of `qh[l]` as the fifth bit.
//! - `Q6_K` (256 values, 210 bytes): 128 bytes `ql` (low 4 bits) | 64 bytes `qh` (high 2 bits) |
//!   16 signed 8-bit scales | f16 `d`; two halves of 128 values; `x = (d * scale) * (q - 32)`.

use half::f16;

/// Values per k-quant super-block.
pub const QK_K: usize = 256;

/// Bytes of one `Q5_0` block (32 values).
pub const Q5_0_BYTES: usize = 22;
/// Bytes of one `Q5_1` block (32 values).
pub const Q5_1_BYTES: usize = 24;
/// Bytes of one `Q4_K` super-block (256 values).
pub const Q4_K_BYTES: usize = 144;
/// Bytes of one `Q5_K` super-block (256 values).
pub const Q5_K_BYTES: usize = 176;
/// Bytes of one `Q6_K` super-block (256 values).
pub const Q6_K_BYTES: usize = 210;

fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

/// Decodes one 22-byte `Q5_0` block into `out[..32]`.
///
/// Panics if `block` is shorter than 22 bytes or `out` than 32 values.
pub fn dequantize_block_q5_0(block: &[u8], out: &mut [f32]) {
    let d = f16_at(block, 0);
    let qh = u32_at(block, 2);
    let qs = &block[6..22];
    for (j, &b) in qs.iter().enumerate() {
        let hi0 = ((qh >> j) << 4) & 0x10;
        let hi1 = (qh >> (j + 12)) & 0x10;
        let q0 = ((b as u32 & 0x0F) | hi0) as i32 - 16;
        let q1 = ((b as u32 >> 4) | hi1) as i32 - 16;
        out[j] = q0 as f32 * d;
        out[j + 16] = q1 as f32 * d;
    }
}

/// Decodes one 24-byte `Q5_1` block into `out[..32]`.
///
/// Panics if `block` is shorter than 24 bytes or `out` than 32 values.
pub fn dequantize_block_q5_1(block: &[u8], out: &mut [f32]) {
    let d = f16_at(block, 0);
    let m = f16_at(block, 2);
    let qh = u32_at(block, 4);
    let qs = &block[8..24];
    for (j, &b) in qs.iter().enumerate() {
        let hi0 = ((qh >> j) << 4) & 0x10;
        let hi1 = (qh >> (j + 12)) & 0x10;
        let q0 = (b as u32 & 0x0F) | hi0;
        let q1 = (b as u32 >> 4) | hi1;
        out[j] = q0 as f32 * d + m;
        out[j + 16] = q1 as f32 * d + m;
    }
}

/// The 6-bit (scale, min) pair of sub-block `j` (0..8) from the 12 packed bytes of a `Q4_K` or
/// `Q5_K` super-block (ggml's `get_scale_min_k4`): pairs 0-3 are the low 6 bits of bytes `j` and
/// `j + 4`; pairs 4-7 take their low 4 bits from byte `j + 4` and their high 2 bits from the top
/// bits of bytes `j - 4` (scale) and `j` (min).
pub fn scale_min_k4(j: usize, scales: &[u8]) -> (u8, u8) {
    if j < 4 {
        (scales[j] & 63, scales[j + 4] & 63)
    } else {
        (
            (scales[j + 4] & 0x0F) | ((scales[j - 4] >> 6) << 4),
            (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4),
        )
    }
}

/// Decodes one 144-byte `Q4_K` super-block into `out[..256]`.
///
/// Panics if `block` is shorter than 144 bytes or `out` than 256 values.
pub fn dequantize_block_q4_k(block: &[u8], out: &mut [f32]) {
    dequantize_k4_k5(&block[..Q4_K_BYTES], None, &block[16..144], out);
}

/// Decodes one 176-byte `Q5_K` super-block into `out[..256]`.
///
/// Panics if `block` is shorter than 176 bytes or `out` than 256 values.
pub fn dequantize_block_q5_k(block: &[u8], out: &mut [f32]) {
    dequantize_k4_k5(block, Some(&block[16..48]), &block[48..176], out);
}

/// The body shared by `Q4_K` and `Q5_K`: `block` starts with `d`, `dmin` and the 12 scale bytes;
/// `qh` (Q5_K) holds the fifth bits, `qs` the nibbles.
fn dequantize_k4_k5(block: &[u8], qh: Option<&[u8]>, qs: &[u8], out: &mut [f32]) {
    let d = f16_at(block, 0);
    let dmin = f16_at(block, 2);
    let scales = &block[4..16];
    for c in 0..4 {
        let (sc0, m0) = scale_min_k4(2 * c, scales);
        let (sc1, m1) = scale_min_k4(2 * c + 1, scales);
        let (d0, min0) = (d * sc0 as f32, dmin * m0 as f32);
        let (d1, min1) = (d * sc1 as f32, dmin * m1 as f32);
        let q = &qs[32 * c..32 * c + 32];
        let y = &mut out[64 * c..64 * c + 64];
        for l in 0..32 {
            let (h0, h1) = match qh {
                Some(qh) => ((qh[l] >> (2 * c) & 1) << 4, (qh[l] >> (2 * c + 1) & 1) << 4),
                None => (0, 0),
            };
            y[l] = d0 * ((q[l] & 0x0F) | h0) as f32 - min0;
            y[l + 32] = d1 * ((q[l] >> 4) | h1) as f32 - min1;
        }
    }
}

/// The 256 six-bit codes (0..=63, before ggml's `- 32`) of a 210-byte `Q6_K` super-block, in
/// element order: element `128h + 32k + l` (half `h`, quarter `k`, `l < 32`) takes its low 4 bits
/// from `ql[64h + l + 32 (k & 1)]` (low nibble for `k < 2`, high for `k >= 2`) and its top 2
/// bits from bits `2k..2k + 2` of `qh[32h + l]` (ggml's `dequantize_row_q6_K`).
///
/// Panics if `block` is shorter than 210 bytes.
pub fn q6_k_codes(block: &[u8]) -> [u8; 256] {
    let mut c = [0u8; 256];
    for h in 0..2 {
        let ql = &block[64 * h..64 * h + 64];
        let qh = &block[128 + 32 * h..128 + 32 * h + 32];
        let y = &mut c[128 * h..128 * h + 128];
        for l in 0..32 {
            y[l] = (ql[l] & 0x0F) | ((qh[l] & 3) << 4);
            y[l + 32] = (ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4);
            y[l + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
            y[l + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
        }
    }
    c
}

/// Decodes one 210-byte `Q6_K` super-block into `out[..256]`.
///
/// Panics if `block` is shorter than 210 bytes or `out` than 256 values.
pub fn dequantize_block_q6_k(block: &[u8], out: &mut [f32]) {
    let d = f16_at(block, 208);
    let codes = q6_k_codes(block);
    // Sub-block g (16 values) has scale g.
    for (g, (ys, cs)) in out[..256]
        .chunks_exact_mut(16)
        .zip(codes.chunks_exact(16))
        .enumerate()
    {
        let scale = d * (block[192 + g] as i8) as f32;
        for (y, &c) in ys.iter_mut().zip(cs) {
            *y = scale * (i32::from(c) - 32) as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{dequantize_block_q4_1, dequantize_block_q8_0};

    type Decoder = fn(&[u8], &mut [f32]);

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex fixture"))
            .collect()
    }

    /// Every block of `fixtures/quant-blocks.json` (written by llama.cpp, three decoders agreeing)
    /// decodes to exactly its stored f32 values.
    #[test]
    fn every_fixture_block_decodes_bit_for_bit() {
        let text = include_str!("../../fixtures/quant-blocks.json");
        let fixture: serde_json::Value = serde_json::from_str(text).expect("fixture JSON");
        let decoders: [(&str, usize, Decoder); 7] = [
            ("Q5_0", Q5_0_BYTES, dequantize_block_q5_0),
            ("Q5_1", Q5_1_BYTES, dequantize_block_q5_1),
            ("Q4_K", Q4_K_BYTES, dequantize_block_q4_k),
            ("Q5_K", Q5_K_BYTES, dequantize_block_q5_k),
            ("Q6_K", Q6_K_BYTES, dequantize_block_q6_k),
            ("Q8_0", 34, dequantize_block_q8_0),
            ("Q4_1", 20, dequantize_block_q4_1),
        ];
        let mut checked = 0;
        for (name, bytes, decode) in decoders {
            let entry = &fixture["types"][name];
            assert_eq!(entry["block_bytes"].as_u64(), Some(bytes as u64), "{name}");
            let elems = entry["block_elems"].as_u64().expect("block_elems") as usize;
            let blocks = entry["blocks"].as_array().expect("blocks");
            assert!(!blocks.is_empty(), "{name} has no fixture block");
            for b in blocks {
                let raw = hex(b["hex"].as_str().expect("hex"));
                assert_eq!(raw.len(), bytes, "{name}");
                let want: Vec<f32> = b["values"]
                    .as_array()
                    .expect("values")
                    .iter()
                    .map(|v| v.as_f64().expect("number") as f32)
                    .collect();
                assert_eq!(want.len(), elems, "{name}");
                let mut got = vec![f32::NAN; elems];
                decode(&raw, &mut got);
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(
                        g.to_bits(),
                        w.to_bits(),
                        "{name} {} value {i}: {g} vs {w}",
                        b["tensor"]
                    );
                }
                checked += 1;
            }
        }
        assert_eq!(checked, 14);
    }

    #[test]
    fn scale_min_pairs_unpack_the_high_bits() {
        // Pair 4: scale = low 4 bits of byte 8 | top 2 bits of byte 0 << 4; min = high 4 bits of
        // byte 8 | top 2 bits of byte 4 << 4.
        let mut s = [0u8; 12];
        s[0] = 0b11_000101;
        s[4] = 0b10_000011;
        s[8] = 0b1001_0110;
        assert_eq!(scale_min_k4(0, &s), (0b000101, 0b000011));
        assert_eq!(scale_min_k4(4, &s), (0b11_0110, 0b10_1001));
    }

    #[test]
    fn q5_0_fifth_bits_come_from_qh() {
        let mut block = [0u8; Q5_0_BYTES];
        block[..2].copy_from_slice(&f16::from_f32(1.0).to_le_bytes());
        // Bit 0 sets the fifth bit of value 0; bit 16 that of value 16.
        block[2..6].copy_from_slice(&(1u32 | (1 << 16)).to_le_bytes());
        block[6] = 0x21; // value 0: low nibble 1, value 16: high nibble 2
        let mut out = [0.0; 32];
        dequantize_block_q5_0(&block, &mut out);
        assert_eq!(out[0], (16 + 1 - 16) as f32);
        assert_eq!(out[16], (16 + 2 - 16) as f32);
        assert_eq!(out[1], -16.0);
    }
}
