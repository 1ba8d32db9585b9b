//! Weight storage in the file's own format and the per-format decoders used by
//! [`super::matmul`].
//!
//! A [`QMatrix`] keeps a GGUF matrix exactly as the file encodes it (Q8_0,
//! Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, F16, BF16, or F32), one row per
//! output feature. Every block format has an AVX2 decoder and an AVX-512 one
//! ([`blocks512`], shared with the fused matmul kernels). The matmul
//! decodes a few rows at a time into a small per-thread f32 tile (L1
//! resident: `TILE_R * cols * 4` bytes, at most 18 KiB for SmolLM2's 1536-wide
//! rows) and multiplies float32 activations against it (in `exact` numerics; the 8-bit
//! activation kernels of `fast` numerics are [`crate::matmul::int8`]).
//!
//! Exactness: every decoder produces bitwise the values of the scalar
//! reference [`gguf::dequantize`] (ggml's `dequantize_row_*` formulas):
//! Q4_1 `q * d + m`, Q4_0 `(q - 8) * d`, Q8_0 `q * d`, F16/BF16 widened
//! exactly. The SIMD Q4_1 decoder computes `fma(q, d, m)`, which equals the
//! reference's `q * d + m` because `q * d` (4-bit × 11-bit significands) is
//! exact in f32; the same holds for the Q4_0/Q8_0 products (≤ 19-bit
//! significands). The 5-bit and k-quant decoders repeat the reference's
//! operations in its order (`(d * scale) * q - dmin * min` for Q4_K/Q5_K,
//! `(d * scale) * (q - 32)` for Q6_K, `(q - 16) * d` and `q * d + m` for
//! Q5_0/Q5_1), so they are bitwise equal too. So the only difference to the f32 reference model is the
//! summation order of the dot products.
//!
//! SIMD paths ([`SimdPath`]): AVX-512F (+F16C), AVX2+FMA (+F16C), and a
//! portable scalar fallback, picked once at run time ([`SimdPath::detect`];
//! the environment variable `WORKER_SIMD=portable` or `WORKER_SIMD=avx2`
//! forces a slower path, e.g. to check a path end to end);
//! the `*_with` functions take the path as a parameter so that tests can force
//! each available one.

#[cfg(target_arch = "x86_64")]
pub(crate) mod blocks512;
mod dequant;
mod interleave;
mod simd_path;

use std::sync::Arc;

use gguf::{GgmlType, MappedBytes};

pub use interleave::{Interleaved8, GROUP_ROWS};
pub use simd_path::SimdPath;

/// Storage of a [`QMatrix`]: F32 matrices as floats (used in place, so they need `f32` alignment),
/// all other formats as the file's bytes, either copied to the heap or borrowed from the model
/// file's memory map.
#[derive(Debug, Clone)]
enum Storage {
    F32(Vec<f32>),
    Bytes(Vec<u8>),
    /// The bytes in the file's mapping (served from the page cache; a clone shares the mapping).
    Mapped(MappedBytes),
}

/// Why bytes cannot be a [`QMatrix`] of the given format and shape.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QMatrixError {
    /// The format cannot be decoded, or `cols` is not a whole number of its blocks.
    #[error("{format}: cannot hold rows of {cols} elements")]
    RowLength {
        /// The tensor's format.
        format: GgmlType,
        /// The row length asked for.
        cols: usize,
    },
    /// The bytes are not exactly `rows` encoded rows (or `cols` is 0).
    #[error("{format} [{rows}, {cols}] needs {needed} bytes, got {got}")]
    Size {
        /// The tensor's format.
        format: GgmlType,
        /// Rows asked for.
        rows: usize,
        /// Row length asked for.
        cols: usize,
        /// Bytes `rows` rows take.
        needed: usize,
        /// Bytes given.
        got: usize,
    },
}

/// A row-major `[rows, cols]` weight matrix stored in a GGUF tensor format.
///
/// Row `r` holds the `cols` input weights of output feature `r`, encoded as
/// `cols / block_size` consecutive blocks of the format ([`Self::row_bytes`]
/// bytes per row). The encoded bytes are either a heap copy ([`Self::from_bytes`]) or a range of
/// the memory-mapped model file ([`Self::from_mapped`]); every accessor and kernel reads both
/// alike, with unaligned loads (a row starts at any byte).
#[derive(Debug, Clone)]
pub struct QMatrix {
    format: GgmlType,
    rows: usize,
    cols: usize,
    row_bytes: usize,
    data: Storage,
    /// The rows re-laid out for the 8-bit activation kernels ([`Self::interleave`]), shared by
    /// clones.
    interleaved: Option<Arc<Interleaved8>>,
}

impl QMatrix {
    /// Wraps a copy of `bytes` (the tensor data as stored in a GGUF file) as a `[rows, cols]`
    /// matrix.
    ///
    /// Errors ([`QMatrixError`]) if the format is one `gguf` cannot decode
    /// ([`GgmlType::Unsupported`]), if `cols` is not a multiple of the format's block size, or
    /// if `bytes` is not exactly `rows` encoded rows.
    pub fn from_bytes(
        format: GgmlType,
        rows: usize,
        cols: usize,
        bytes: &[u8],
    ) -> Result<QMatrix, QMatrixError> {
        Self::build(format, rows, cols, bytes, || Storage::Bytes(bytes.to_vec()))
    }

    /// Like [`Self::from_bytes`], but borrows `bytes` from the model file's memory map instead of
    /// copying them: the weights are then read from the page cache (loaded on first use, shared
    /// with other processes mapping the file, evictable under memory pressure) and the map lives
    /// as long as the matrix. An F32 matrix is still converted to floats in memory.
    ///
    /// Errors: as [`Self::from_bytes`].
    pub fn from_mapped(
        format: GgmlType,
        rows: usize,
        cols: usize,
        bytes: MappedBytes,
    ) -> Result<QMatrix, QMatrixError> {
        Self::build(format, rows, cols, &bytes, || {
            Storage::Mapped(bytes.clone())
        })
    }

    /// Checks `bytes` against the shape and keeps them: as floats for F32, else as `keep` stores
    /// them.
    fn build(
        format: GgmlType,
        rows: usize,
        cols: usize,
        bytes: &[u8],
        keep: impl FnOnce() -> Storage,
    ) -> Result<QMatrix, QMatrixError> {
        let row_bytes = format
            .byte_size(cols as u64)
            .ok_or(QMatrixError::RowLength { format, cols })? as usize;
        if cols == 0 || bytes.len() != rows * row_bytes {
            return Err(QMatrixError::Size {
                format,
                rows,
                cols,
                needed: rows * row_bytes,
                got: bytes.len(),
            });
        }
        let data = if format == GgmlType::F32 {
            Storage::F32(
                bytes
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect(),
            )
        } else {
            keep()
        };
        Ok(QMatrix {
            format,
            rows,
            cols,
            row_bytes,
            data,
            interleaved: None,
        })
    }

    /// A `[rows, cols]` F32 matrix from row-major values.
    ///
    /// Panics if `data.len() != rows * cols` or `cols == 0`.
    pub fn from_f32(rows: usize, cols: usize, data: Vec<f32>) -> QMatrix {
        assert!(
            cols > 0 && data.len() == rows * cols,
            "QMatrix::from_f32: bad shape"
        );
        QMatrix {
            format: GgmlType::F32,
            rows,
            cols,
            row_bytes: cols * 4,
            data: Storage::F32(data),
            interleaved: None,
        }
    }

    /// The storage format.
    pub fn format(&self) -> GgmlType {
        self.format
    }

    /// Number of rows (output features).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Number of columns (input features).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Encoded bytes per row.
    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }

    /// Bytes of the matrix (in the heap, or in the page cache when borrowed from the file's map,
    /// see [`Self::is_mapped`]).
    pub fn size_bytes(&self) -> usize {
        self.rows * self.row_bytes
    }

    /// Whether the encoded bytes are borrowed from the model file's memory map rather than held
    /// on the heap.
    pub fn is_mapped(&self) -> bool {
        matches!(self.data, Storage::Mapped(_))
    }

    /// Also keeps a copy of the rows interleaved 8 at a time for the `fast` numerics' integer
    /// kernels ([`Interleaved8`]: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K and Q6_K; other formats are
    /// left as they are). The copy takes [`Self::size_bytes`] more heap (rounded up to whole
    /// groups of 8 rows; 3 % more for Q4_K, 30 % more for Q6_K, whose codes it decodes to bytes);
    /// the file's bytes stay for the exact path and embedding lookups.
    pub fn interleave(&mut self) {
        if self.interleaved.is_none() {
            if let Some(bytes) = self.encoded() {
                self.interleaved =
                    Interleaved8::new(self.format, self.rows, self.cols, bytes).map(Arc::new);
            }
        }
    }

    /// Drops the copy [`Self::interleave`] made (the `exact` numerics do not read it).
    pub fn drop_interleaved(&mut self) {
        self.interleaved = None;
    }

    /// The interleaved copy, if [`Self::interleave`] made one.
    pub fn interleaved(&self) -> Option<&Interleaved8> {
        self.interleaved.as_deref()
    }

    /// Rows `r0..r0 + count` as f32 values when the matrix is stored as F32.
    pub(crate) fn f32_rows(&self, r0: usize, count: usize) -> Option<&[f32]> {
        match &self.data {
            Storage::F32(v) => Some(&v[r0 * self.cols..(r0 + count) * self.cols]),
            Storage::Bytes(_) | Storage::Mapped(_) => None,
        }
    }

    /// All encoded rows, wherever they are kept (`None` for F32 storage, which has none).
    fn encoded(&self) -> Option<&[u8]> {
        match &self.data {
            Storage::Bytes(b) => Some(b),
            Storage::Mapped(b) => Some(b),
            Storage::F32(_) => None,
        }
    }

    /// The encoded bytes of row `r` (empty for F32 storage, which has none).
    pub(crate) fn row_encoded(&self, r: usize) -> &[u8] {
        self.rows_encoded(r, 1)
    }

    /// The encoded bytes of rows `r0..r0 + count` (empty for F32 storage).
    ///
    /// Panics if the rows are out of range.
    pub(crate) fn rows_encoded(&self, r0: usize, count: usize) -> &[u8] {
        self.encoded().map_or(&[], |b| {
            &b[r0 * self.row_bytes..(r0 + count) * self.row_bytes]
        })
    }

    /// Decodes rows `r0..r0 + out.len() / cols` into `out` (row-major) with the detected path.
    ///
    /// Panics if `out.len()` is not a multiple of `cols` or the rows are out of range.
    pub fn dequantize_rows(&self, r0: usize, out: &mut [f32]) {
        self.dequantize_rows_with(SimdPath::detect(), r0, out)
    }

    /// [`Self::dequantize_rows`] on a given path (bitwise the same result on every path).
    pub fn dequantize_rows_with(&self, path: SimdPath, r0: usize, out: &mut [f32]) {
        assert!(
            out.len().is_multiple_of(self.cols),
            "dequantize_rows: partial row"
        );
        let count = out.len() / self.cols;
        assert!(
            r0 + count <= self.rows,
            "dequantize_rows: rows out of range"
        );
        match &self.data {
            Storage::F32(v) => out.copy_from_slice(&v[r0 * self.cols..(r0 + count) * self.cols]),
            Storage::Bytes(_) | Storage::Mapped(_) => {
                dequant::decode(path, self.format, self.rows_encoded(r0, count), out);
            }
        }
    }
}

/// Every tensor format a [`QMatrix`] holds (the tests of each decoder and kernel path go
/// through all of them).
#[cfg(test)]
pub(crate) const SERVED_FORMATS: [GgmlType; 11] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) as f32
            })
            .collect()
    }

    fn encode(format: GgmlType, x: &[f32]) -> Vec<u8> {
        match format {
            GgmlType::Q8_0 => gguf::quantize_q8_0(x).unwrap(),
            GgmlType::Q4_1 => gguf::quantize_q4_1(x).unwrap(),
            GgmlType::Q4_0 => {
                // Q4_0 has no encoder in `gguf`: random bytes make valid blocks.
                let mut out = Vec::new();
                for (i, blk) in x.chunks_exact(32).enumerate() {
                    out.extend_from_slice(
                        &half::f16::from_f32(0.01 + i as f32 * 1e-3).to_le_bytes(),
                    );
                    out.extend(blk[..16].iter().map(|v| (v.to_bits() >> 7) as u8));
                }
                out
            }
            GgmlType::F16 => gguf::quant::quantize_f16(x),
            GgmlType::BF16 => x
                .iter()
                .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
                .collect(),
            GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => {
                gguf::testing::random_encoding(format, x.len(), x.len() as u64)
            }
            _ => gguf::quant::encode_f32(x),
        }
    }

    /// Every path decodes every format bitwise like `gguf::dequantize`.
    #[test]
    fn decoders_match_reference_bitwise() {
        for format in SERVED_FORMATS {
            let shapes: &[(usize, usize)] = if format.block_size() == Some(256) {
                &[(1, 256), (3, 512), (2, 1536)]
            } else {
                &[(1, 32), (3, 64), (5, 160), (2, 1536)]
            };
            for &(rows, cols) in shapes {
                let x = data(rows * cols, cols as u64 + 7);
                let bytes = encode(format, &x);
                let m = QMatrix::from_bytes(format, rows, cols, &bytes).unwrap();
                let want = gguf::dequantize_to_vec(format, &bytes, rows * cols).unwrap();
                for path in SimdPath::available() {
                    let mut got = vec![f32::NAN; rows * cols];
                    m.dequantize_rows_with(path, 0, &mut got);
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&got), bits(&want), "{format} {rows}x{cols} {path:?}");
                    if rows > 1 {
                        let mut one = vec![0.0; cols];
                        m.dequantize_rows_with(path, rows - 1, &mut one);
                        assert_eq!(bits(&one), bits(&want[(rows - 1) * cols..]));
                    }
                }
            }
        }
        // F16/BF16 rows need not be a multiple of the vector width.
        for format in [GgmlType::F16, GgmlType::BF16, GgmlType::F32] {
            let x = data(2 * 37, 3);
            let bytes = encode(format, &x);
            let m = QMatrix::from_bytes(format, 2, 37, &bytes).unwrap();
            let want = gguf::dequantize_to_vec(format, &bytes, 74).unwrap();
            for path in SimdPath::available() {
                let mut got = vec![0.0; 74];
                m.dequantize_rows_with(path, 0, &mut got);
                assert_eq!(got, want, "{format} {path:?}");
            }
        }
    }

    #[test]
    fn rejects_bad_shapes() {
        assert!(QMatrix::from_bytes(GgmlType::Q8_0, 2, 33, &[0; 68]).is_err());
        assert!(QMatrix::from_bytes(GgmlType::Q8_0, 2, 32, &[0; 67]).is_err());
        assert!(QMatrix::from_bytes(GgmlType::Unsupported(16), 1, 256, &[0; 144]).is_err());
        let m = QMatrix::from_bytes(GgmlType::Q4_1, 3, 64, &[0; 120]).unwrap();
        assert_eq!(
            (m.rows(), m.cols(), m.row_bytes(), m.size_bytes()),
            (3, 64, 40, 120)
        );
    }
}
