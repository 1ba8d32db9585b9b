//! The integer dot products of the fast path in portable scalar code: the reference every SIMD
//! kernel must equal bit for bit, and the portable path itself.
//!
//! Activations come in blocks of 32, each with its own scale ([`super::acts`]). Per block, the
//! weight codes `c` (unsigned, as stored: 4, 5 or 6 bits; signed for Q8_0) are multiplied with the
//! activation codes `q` and summed exactly in i32; the block's f32 term is then one fixed formula
//! ([`term32`], [`add_group_k`]). Blocks of 32 of the legacy formats accumulate in 8 lanes (block
//! `b` into lane `b % 8`, in increasing `b`) reduced by [`reduce8`]; the groups of 32 of the
//! k-quants (8 per super-block of 256) accumulate in one sequential sum.

use gguf::kquant::{q6_k_codes, scale_min_k4};
use gguf::GgmlType;

use super::acts::QRow;

/// The f16 at byte `i` of `b`, as f32 (exact).
#[inline(always)]
pub(super) fn f16_at(b: &[u8], i: usize) -> f32 {
    half::f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// The block formats of 32 values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fmt32 {
    /// f16 `d` | 32 i8; `x = d * c`.
    Q8_0,
    /// f16 `d` | 16 bytes of nibbles; `x = d * (c - 8)`.
    Q4_0,
    /// f16 `d` | f16 `m` | 16 bytes; `x = d * c + m`.
    Q4_1,
    /// f16 `d` | u32 `qh` | 16 bytes; `x = d * (c - 16)`.
    Q5_0,
    /// f16 `d` | f16 `m` | u32 `qh` | 16 bytes; `x = d * c + m`.
    Q5_1,
}

impl Fmt32 {
    /// The format of `t`, if it is one of these.
    pub(super) fn of(t: GgmlType) -> Option<Fmt32> {
        Some(match t {
            GgmlType::Q8_0 => Fmt32::Q8_0,
            GgmlType::Q4_0 => Fmt32::Q4_0,
            GgmlType::Q4_1 => Fmt32::Q4_1,
            GgmlType::Q5_0 => Fmt32::Q5_0,
            GgmlType::Q5_1 => Fmt32::Q5_1,
            _ => return None,
        })
    }

    /// Bytes per block.
    pub(super) const fn bytes(self) -> usize {
        match self {
            Fmt32::Q8_0 => 34,
            Fmt32::Q4_0 => 18,
            Fmt32::Q4_1 => 20,
            Fmt32::Q5_0 => 22,
            Fmt32::Q5_1 => 24,
        }
    }

    /// The code offset subtracted before scaling (8, 16 or 0).
    pub(super) const fn offset(self) -> i32 {
        match self {
            Fmt32::Q4_0 => 8,
            Fmt32::Q5_0 => 16,
            _ => 0,
        }
    }

    /// Whether blocks carry a minimum `m` (Q4_1, Q5_1).
    pub(super) const fn has_min(self) -> bool {
        matches!(self, Fmt32::Q4_1 | Fmt32::Q5_1)
    }

    /// The 32 codes of `block` in element order.
    fn codes(self, block: &[u8]) -> [i32; 32] {
        let mut c = [0i32; 32];
        let nibbles = |qs: &[u8], c: &mut [i32; 32]| {
            for j in 0..16 {
                c[j] = i32::from(qs[j] & 0x0F);
                c[j + 16] = i32::from(qs[j] >> 4);
            }
        };
        let fifth = |qh: u32, c: &mut [i32; 32]| {
            for (j, v) in c.iter_mut().enumerate() {
                *v |= (((qh >> j) & 1) << 4) as i32;
            }
        };
        let u32_at =
            |i: usize| u32::from_le_bytes([block[i], block[i + 1], block[i + 2], block[i + 3]]);
        match self {
            Fmt32::Q8_0 => {
                for (v, &b) in c.iter_mut().zip(&block[2..34]) {
                    *v = i32::from(b as i8);
                }
            }
            Fmt32::Q4_0 => nibbles(&block[2..18], &mut c),
            Fmt32::Q4_1 => nibbles(&block[4..20], &mut c),
            Fmt32::Q5_0 => {
                nibbles(&block[6..22], &mut c);
                fifth(u32_at(2), &mut c);
            }
            Fmt32::Q5_1 => {
                nibbles(&block[8..24], &mut c);
                fifth(u32_at(4), &mut c);
            }
        }
        c
    }
}

/// The f32 term of a block of 32 from its exact integer sum `isum = Σ c·q − offset·Σq`:
/// `(dw * dx) * isum`, plus `mw * (dx * Σq)` for formats with a minimum. Every path computes
/// exactly these operations (no fused multiply-add).
#[inline(always)]
pub(super) fn term32(dw: f32, mw: Option<f32>, dx: f32, dsum: f32, isum: i32) -> f32 {
    let t = (dw * dx) * isum as f32;
    match mw {
        Some(m) => t + m * dsum,
        None => t,
    }
}

/// The 8 lane sums reduced in one fixed order.
#[inline(always)]
pub(super) fn reduce8(a: [f32; 8]) -> f32 {
    ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]))
}

/// Block `b` of a row of format `f`: its [`term32`] against block `b` of `x`.
pub(super) fn block_term32(f: Fmt32, row: &[u8], x: QRow<'_>, b: usize) -> f32 {
    let block = &row[b * f.bytes()..(b + 1) * f.bytes()];
    let codes = f.codes(block);
    let q = &x.qs[32 * b..32 * b + 32];
    let dot: i32 = codes.iter().zip(q).map(|(&c, &q)| c * i32::from(q)).sum();
    let isum = dot - f.offset() * x.sums[b];
    let mw = f.has_min().then(|| f16_at(block, 2));
    term32(f16_at(block, 0), mw, x.d[b], x.dsums[b], isum)
}

/// `Σ_k W[k] · x[k]` of one row of format `f` (`nb` blocks) by the 32-block algorithm.
pub(super) fn dot32(f: Fmt32, row: &[u8], x: QRow<'_>, nb: usize) -> f32 {
    let mut acc = [0.0f32; 8];
    for b in 0..nb {
        acc[b % 8] += block_term32(f, row, x, b);
    }
    reduce8(acc)
}

/// The k-quant formats (super-blocks of 256).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FmtK {
    /// 144 bytes: f16 `d`, f16 `dmin`, 12 bytes of 6-bit (scale, min) pairs, 128 bytes of nibbles.
    Q4K,
    /// 176 bytes: as Q4K with 32 bytes of fifth bits before the nibbles.
    Q5K,
    /// 210 bytes: 128 bytes low bits, 64 bytes high bits, 16 i8 scales, f16 `d`.
    Q6K,
}

impl FmtK {
    /// The format of `t`, if it is one of these.
    pub(super) fn of(t: GgmlType) -> Option<FmtK> {
        Some(match t {
            GgmlType::Q4_K => FmtK::Q4K,
            GgmlType::Q5_K => FmtK::Q5K,
            GgmlType::Q6_K => FmtK::Q6K,
            _ => return None,
        })
    }

    /// Bytes per super-block.
    pub(super) const fn bytes(self) -> usize {
        match self {
            FmtK::Q4K => 144,
            FmtK::Q5K => 176,
            FmtK::Q6K => 210,
        }
    }
}

/// The per-super-block constants of a k-quant row: `d`, `dmin` (0 for Q6_K), and the scale and
/// min of each sub-block (8 of 32 values for Q4_K/Q5_K, 16 of 16 for Q6_K, whose mins are 0).
pub(super) struct KMeta {
    pub(super) d: f32,
    pub(super) dmin: f32,
    pub(super) scales: [i32; 16],
    pub(super) mins: [i32; 8],
}

impl KMeta {
    /// The constants of the super-block `block` of format `f`.
    #[inline(always)]
    pub(super) fn read(f: FmtK, block: &[u8]) -> KMeta {
        let mut m = KMeta {
            d: 0.0,
            dmin: 0.0,
            scales: [0; 16],
            mins: [0; 8],
        };
        match f {
            FmtK::Q4K | FmtK::Q5K => {
                m.d = f16_at(block, 0);
                m.dmin = f16_at(block, 2);
                for j in 0..8 {
                    let (sc, mn) = scale_min_k4(j, &block[4..16]);
                    (m.scales[j], m.mins[j]) = (i32::from(sc), i32::from(mn));
                }
            }
            FmtK::Q6K => {
                m.d = f16_at(block, 208);
                for (s, &b) in m.scales.iter_mut().zip(&block[192..208]) {
                    *s = i32::from(b as i8);
                }
            }
        }
        m
    }
}

/// `acc` plus the term of group `j` (values `32j..32j + 32`) of a k-quant super-block with
/// constants `m`, against an activation block of scale `dx` and scaled sum `dsum` (`dx · Σq`),
/// from the group's exact integer sum `gsum`:
///
/// - Q4_K/Q5_K (group `j` is sub-block `j`): `gsum = Σ c·q`; with `ds = d * scale_j` and
///   `dm = dmin * min_j`, `acc = fma(dx, ds * gsum, acc)` then `acc = fma(-dm, dsum, acc)`
///   (`x = d·scale·c − dmin·min`);
/// - Q6_K (group `j` is sub-blocks `2j` and `2j + 1`, of 16): `gsum = Σ_g scale_g · (Σ c·q −
///   32 · Σq)` over both, and `acc = fma(dx * d, gsum, acc)` (`x = d·scale·(c − 32)`).
///
/// Every path computes exactly these operations: `fma` is a fused multiply-add, rounded once
/// ([`f32::mul_add`] here, `vfmadd`/`vfnmadd` in the SIMD kernels), every other operation a
/// separate IEEE multiply.
#[inline(always)]
pub(super) fn add_group_k(
    f: FmtK,
    m: &KMeta,
    j: usize,
    (dx, dsum): (f32, f32),
    gsum: i32,
    acc: f32,
) -> f32 {
    match f {
        FmtK::Q4K | FmtK::Q5K => {
            let ds = m.d * m.scales[j] as f32;
            let dm = m.dmin * m.mins[j] as f32;
            let acc = dx.mul_add(ds * gsum as f32, acc);
            (-dm).mul_add(dsum, acc)
        }
        FmtK::Q6K => (dx * m.d).mul_add(gsum as f32, acc),
    }
}

/// The 256 codes of a k-quant super-block in element order (Q4_K 0..16, Q5_K 0..32, Q6_K 0..64).
fn codes_k(f: FmtK, block: &[u8]) -> [i32; 256] {
    let mut c = [0i32; 256];
    match f {
        FmtK::Q4K | FmtK::Q5K => {
            let (qh, qs) = match f {
                FmtK::Q5K => (Some(&block[16..48]), &block[48..176]),
                _ => (None, &block[16..144]),
            };
            for ch in 0..4 {
                for l in 0..32 {
                    let b = qs[32 * ch + l];
                    let (h0, h1) = match qh {
                        Some(qh) => ((qh[l] >> (2 * ch)) & 1, (qh[l] >> (2 * ch + 1)) & 1),
                        None => (0, 0),
                    };
                    c[64 * ch + l] = i32::from((b & 0x0F) | (h0 << 4));
                    c[64 * ch + 32 + l] = i32::from((b >> 4) | (h1 << 4));
                }
            }
        }
        FmtK::Q6K => {
            for (v, q) in c.iter_mut().zip(q6_k_codes(block)) {
                *v = i32::from(q);
            }
        }
    }
    c
}

/// `Σ_k W[k] · x[k]` of one row of format `f` (`nsb` super-blocks) by the k-quant algorithm.
pub(super) fn dot_k(f: FmtK, row: &[u8], x: QRow<'_>, nsb: usize) -> f32 {
    let mut acc = 0.0f32;
    for sb in 0..nsb {
        let block = &row[sb * f.bytes()..(sb + 1) * f.bytes()];
        let m = KMeta::read(f, block);
        let codes = codes_k(f, block);
        let dot = |r: std::ops::Range<usize>| -> i32 {
            let q = &x.qs[256 * sb + r.start..256 * sb + r.end];
            codes[r]
                .iter()
                .zip(q)
                .map(|(&c, &q)| c * i32::from(q))
                .sum()
        };
        for j in 0..8 {
            let b = 8 * sb + j;
            let gsum = match f {
                FmtK::Q4K | FmtK::Q5K => dot(32 * j..32 * j + 32),
                FmtK::Q6K => (0..2)
                    .map(|h| {
                        let g = 2 * j + h;
                        let sub = dot(16 * g..16 * g + 16) - 32 * i32::from(x.bsums[2 * b + h]);
                        m.scales[g] * sub
                    })
                    .sum(),
            };
            acc = add_group_k(f, &m, j, (x.d[b], x.dsums[b]), gsum, acc);
        }
    }
    acc
}
