//! Tensor element types (`ggml_type`) as stored in GGUF tensor infos.
//!
//! Numeric ids, block sizes and block byte sizes follow ggml's `ggml.h` /
//! `ggml.c` (`type_traits` table) from the llama.cpp repository.

use std::fmt;

/// The element type of a tensor in a GGUF file.
///
/// Quantized types store elements in fixed-size *blocks*: `block_size()`
/// elements packed into `bytes_per_block()` bytes. Plain types are blocks of
/// one element. Types this crate cannot decode are kept as
/// [`GgmlType::Unsupported`] with their raw id so files still open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)] // ggml's own names (Q4_K, ...), as llama.cpp and GGUF tools print them
pub enum GgmlType {
    /// IEEE-754 binary32, id 0.
    F32,
    /// IEEE-754 binary16, id 1.
    F16,
    /// Blocks of 32: f16 scale `d` + 16 bytes of 4-bit values, `x = (q - 8) * d`. Id 2.
    Q4_0,
    /// Blocks of 32: f16 scale `d`, f16 min `m` + 16 bytes of 4-bit values, `x = q * d + m`. Id 3.
    Q4_1,
    /// Blocks of 32: f16 scale `d` + 32 signed bytes, `x = q * d`. Id 8.
    Q8_0,
    /// Blocks of 32: f16 `d`, 32 fifth bits, 16 bytes of low nibbles, `x = (q - 16) * d`. Id 6.
    Q5_0,
    /// Blocks of 32: f16 `d`, f16 `m`, 32 fifth bits, 16 bytes, `x = q * d + m`. Id 7.
    Q5_1,
    /// Super-blocks of 256: f16 `d`, `dmin`, eight 6-bit (scale, min) pairs, 4-bit values. Id 12.
    Q4_K,
    /// Super-blocks of 256: as `Q4_K` plus a fifth bit per value. Id 13.
    Q5_K,
    /// Super-blocks of 256: 6-bit values, sixteen i8 scales, f16 `d`. Id 14.
    Q6_K,
    /// bfloat16 (upper half of an f32), id 30.
    BF16,
    /// Any other ggml type id (e.g. the i-quants); can be listed but not decoded.
    Unsupported(u32),
}

impl GgmlType {
    /// Maps a raw ggml type id to a [`GgmlType`]; unknown ids become `Unsupported(id)`.
    pub fn from_id(id: u32) -> Self {
        match id {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            2 => GgmlType::Q4_0,
            3 => GgmlType::Q4_1,
            6 => GgmlType::Q5_0,
            7 => GgmlType::Q5_1,
            8 => GgmlType::Q8_0,
            12 => GgmlType::Q4_K,
            13 => GgmlType::Q5_K,
            14 => GgmlType::Q6_K,
            30 => GgmlType::BF16,
            other => GgmlType::Unsupported(other),
        }
    }

    /// The raw ggml type id as written in GGUF files.
    pub fn id(self) -> u32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Q4_0 => 2,
            GgmlType::Q4_1 => 3,
            GgmlType::Q5_0 => 6,
            GgmlType::Q5_1 => 7,
            GgmlType::Q8_0 => 8,
            GgmlType::Q4_K => 12,
            GgmlType::Q5_K => 13,
            GgmlType::Q6_K => 14,
            GgmlType::BF16 => 30,
            GgmlType::Unsupported(id) => id,
        }
    }

    /// Elements per block (1 for plain float types, 32 for the 4/5/8-bit
    /// block formats, 256 for the k-quants). `None` for `Unsupported`.
    pub fn block_size(self) -> Option<usize> {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => Some(1),
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q8_0 => {
                Some(32)
            }
            GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => Some(256),
            GgmlType::Unsupported(_) => None,
        }
    }

    /// Bytes per block: F32 4, F16/BF16 2, Q4_0 18, Q4_1 20, Q5_0 22, Q5_1 24,
    /// Q8_0 34, Q4_K 144, Q5_K 176, Q6_K 210.
    /// `None` for `Unsupported`.
    pub fn bytes_per_block(self) -> Option<usize> {
        match self {
            GgmlType::F32 => Some(4),
            GgmlType::F16 | GgmlType::BF16 => Some(2),
            GgmlType::Q4_0 => Some(18),
            GgmlType::Q4_1 => Some(20),
            GgmlType::Q5_0 => Some(22),
            GgmlType::Q5_1 => Some(24),
            GgmlType::Q8_0 => Some(34),
            GgmlType::Q4_K => Some(144),
            GgmlType::Q5_K => Some(176),
            GgmlType::Q6_K => Some(210),
            GgmlType::Unsupported(_) => None,
        }
    }

    /// Byte size of `n_elements` elements of this type, or `None` if the type
    /// is unsupported or `n_elements` is not a whole number of blocks.
    pub fn byte_size(self, n_elements: u64) -> Option<u64> {
        let bs = self.block_size()? as u64;
        let bpb = self.bytes_per_block()? as u64;
        if !n_elements.is_multiple_of(bs) {
            return None;
        }
        (n_elements / bs).checked_mul(bpb)
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GgmlType::F32 => write!(f, "F32"),
            GgmlType::F16 => write!(f, "F16"),
            GgmlType::Q4_0 => write!(f, "Q4_0"),
            GgmlType::Q4_1 => write!(f, "Q4_1"),
            GgmlType::Q5_0 => write!(f, "Q5_0"),
            GgmlType::Q5_1 => write!(f, "Q5_1"),
            GgmlType::Q8_0 => write!(f, "Q8_0"),
            GgmlType::Q4_K => write!(f, "Q4_K"),
            GgmlType::Q5_K => write!(f, "Q5_K"),
            GgmlType::Q6_K => write!(f, "Q6_K"),
            GgmlType::BF16 => write!(f, "BF16"),
            GgmlType::Unsupported(id) => write!(f, "unsupported ggml type {id}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_roundtrip() {
        for id in 0..40 {
            assert_eq!(GgmlType::from_id(id).id(), id);
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(GgmlType::Q4_1.byte_size(64), Some(40));
        assert_eq!(GgmlType::Q8_0.byte_size(32), Some(34));
        assert_eq!(GgmlType::F16.byte_size(3), Some(6));
        assert_eq!(GgmlType::Q4_0.byte_size(33), None);
        assert_eq!(GgmlType::Q4_K.byte_size(512), Some(288));
        assert_eq!(GgmlType::Q6_K.byte_size(256), Some(210));
        assert_eq!(GgmlType::Q5_0.byte_size(64), Some(44));
        assert_eq!(GgmlType::Q5_K.byte_size(128), None);
        assert_eq!(GgmlType::Unsupported(16).byte_size(256), None);
    }
}
