//! The vector widths of the tile kernels ([`super::tile32`] and [`super::interleaved`]'s
//! `tile_k`): one group of 8 rows in 256-bit vectors ([`Group8`], AVX2 or VNNI), or two
//! consecutive interleaved groups in 512-bit ones ([`Group16`], VNNI: lanes 0-7 the first group's
//! rows, 8-15 the second's). Each kernel is written once against [`Lanes`]; every operation is
//! lane-wise, so both widths give each row the same bits.

use std::arch::x86_64::*;
use std::marker::PhantomData;

use super::mac::{Mac, VnniMac};

/// Lane-wise i32 and f32 operations over `ROWS` rows, and loads of their interleaved bytes.
pub(super) trait Lanes {
    /// `ROWS` i32 lanes.
    type I: Copy;
    /// `ROWS` f32 lanes.
    type F: Copy;
    /// Rows (lanes) per vector.
    const ROWS: usize;
    unsafe fn zero() -> Self::I;
    unsafe fn add(a: Self::I, b: Self::I) -> Self::I;
    unsafe fn sub(a: Self::I, b: Self::I) -> Self::I;
    unsafe fn mullo(a: Self::I, b: Self::I) -> Self::I;
    unsafe fn set1(v: i32) -> Self::I;
    /// Low nibbles of each byte, then high nibbles.
    unsafe fn nibbles(v: Self::I) -> (Self::I, Self::I);
    unsafe fn to_f(a: Self::I) -> Self::F;
    unsafe fn fzero() -> Self::F;
    unsafe fn fmul(a: Self::F, b: Self::F) -> Self::F;
    unsafe fn fadd(a: Self::F, b: Self::F) -> Self::F;
    /// `a · b + c`, rounded once (`vfmadd`; [`f32::mul_add`] in the reference).
    unsafe fn fmadd(a: Self::F, b: Self::F, c: Self::F) -> Self::F;
    /// `c − a · b`, rounded once (`vfnmadd`; `(-a).mul_add(b, c)` in the reference).
    unsafe fn fnmadd(a: Self::F, b: Self::F, c: Self::F) -> Self::F;
    unsafe fn fset1(v: f32) -> Self::F;
    /// `acc + Σ_j u_r[j] · x[j]` per dword lane against the activation dword at `xq`.
    unsafe fn mac1(acc: Self::I, u: Self::I, xq: *const i8) -> Self::I;
    /// [`Mac::dot_n`], lane-wise (the same bound on `N` and the codes); by default
    /// [`Lanes::mac1`] in two chains.
    #[inline(always)]
    unsafe fn dot_n<const N: usize>(u: &[Self::I; N], xq: *const i8) -> Self::I {
        let mut s = [Self::zero(); 2];
        for i in 0..N {
            s[i % 2] = Self::mac1(s[i % 2], u[i], xq.add(4 * i));
        }
        Self::add(s[0], s[1])
    }
    /// [`Mac::Q8_OFFSET`] of the products.
    const Q8_OFFSET: i32;
    /// [`Mac::prep`], lane-wise.
    unsafe fn prep(signed: bool, raw: [Self::I; 8]) -> [Self::I; 8];
    /// [`Mac::dot8`]: per lane, the exact sum of a block's 32 products against the activations
    /// at `xq` (plus `Q8_OFFSET · Σ x` for Q8_0).
    unsafe fn dot8(u: &[Self::I; 8], raw: &[Self::I; 8], signed: bool, xq: *const i8) -> Self::I;
    /// The 32 bytes at `p` of each group (lane `r` = dword `r` of its group's 32 bytes).
    unsafe fn load(&self, p: *const u8) -> Self::I;
    /// The 8 f16 at `p` of each group, widened.
    unsafe fn f16(&self, p: *const u8) -> Self::F;
    /// The 8 bytes at `p` of each group as i32 lanes: unsigned, or signed.
    unsafe fn bytes(&self, p: *const u8, signed: bool) -> Self::I;
    /// The `ROWS` lanes of `v` into `out` (`ROWS` long; panics otherwise).
    unsafe fn store(v: Self::F, out: &mut [f32]);
}

/// One group of 8 rows, 256-bit vectors, products by `M`.
pub(super) struct Group8<M>(PhantomData<M>);

impl<M> Group8<M> {
    pub(super) fn new() -> Group8<M> {
        Group8(PhantomData)
    }
}

impl<M: Mac> Lanes for Group8<M> {
    type I = __m256i;
    type F = __m256;
    const ROWS: usize = 8;
    #[inline(always)]
    unsafe fn zero() -> __m256i {
        _mm256_setzero_si256()
    }
    #[inline(always)]
    unsafe fn add(a: __m256i, b: __m256i) -> __m256i {
        _mm256_add_epi32(a, b)
    }
    #[inline(always)]
    unsafe fn sub(a: __m256i, b: __m256i) -> __m256i {
        _mm256_sub_epi32(a, b)
    }
    #[inline(always)]
    unsafe fn mullo(a: __m256i, b: __m256i) -> __m256i {
        _mm256_mullo_epi32(a, b)
    }
    #[inline(always)]
    unsafe fn set1(v: i32) -> __m256i {
        _mm256_set1_epi32(v)
    }
    #[inline(always)]
    unsafe fn nibbles(v: __m256i) -> (__m256i, __m256i) {
        let m4 = _mm256_set1_epi8(0x0F);
        (
            _mm256_and_si256(v, m4),
            _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4),
        )
    }
    #[inline(always)]
    unsafe fn to_f(a: __m256i) -> __m256 {
        _mm256_cvtepi32_ps(a)
    }
    #[inline(always)]
    unsafe fn fzero() -> __m256 {
        _mm256_setzero_ps()
    }
    #[inline(always)]
    unsafe fn fmul(a: __m256, b: __m256) -> __m256 {
        _mm256_mul_ps(a, b)
    }
    #[inline(always)]
    unsafe fn fadd(a: __m256, b: __m256) -> __m256 {
        _mm256_add_ps(a, b)
    }
    #[inline(always)]
    unsafe fn fmadd(a: __m256, b: __m256, c: __m256) -> __m256 {
        _mm256_fmadd_ps(a, b, c)
    }
    #[inline(always)]
    unsafe fn fnmadd(a: __m256, b: __m256, c: __m256) -> __m256 {
        _mm256_fnmadd_ps(a, b, c)
    }
    #[inline(always)]
    unsafe fn fset1(v: f32) -> __m256 {
        _mm256_set1_ps(v)
    }
    #[inline(always)]
    unsafe fn mac1(acc: __m256i, u: __m256i, xq: *const i8) -> __m256i {
        M::mac1(acc, u, xq)
    }
    #[inline(always)]
    unsafe fn dot_n<const N: usize>(u: &[__m256i; N], xq: *const i8) -> __m256i {
        M::dot_n(u, xq)
    }
    const Q8_OFFSET: i32 = M::Q8_OFFSET;
    #[inline(always)]
    unsafe fn prep(signed: bool, raw: [__m256i; 8]) -> [__m256i; 8] {
        M::prep(signed, raw)
    }
    #[inline(always)]
    unsafe fn dot8(u: &[__m256i; 8], raw: &[__m256i; 8], signed: bool, xq: *const i8) -> __m256i {
        M::dot8(u, raw, signed, xq)
    }
    #[inline(always)]
    unsafe fn load(&self, p: *const u8) -> __m256i {
        _mm256_loadu_si256(p as *const __m256i)
    }
    #[inline(always)]
    unsafe fn f16(&self, p: *const u8) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
    }
    #[inline(always)]
    unsafe fn bytes(&self, p: *const u8, signed: bool) -> __m256i {
        let b = _mm_loadl_epi64(p as *const __m128i);
        if signed {
            _mm256_cvtepi8_epi32(b)
        } else {
            _mm256_cvtepu8_epi32(b)
        }
    }
    #[inline(always)]
    unsafe fn store(v: __m256, out: &mut [f32]) {
        assert_eq!(out.len(), 8, "store: one lane per element");
        _mm256_storeu_ps(out.as_mut_ptr(), v);
    }
}

/// Two consecutive groups (`group` bytes apart), 512-bit vectors, `vpdpbusd` (AVX-512 VNNI/BW).
pub(super) struct Group16 {
    pub(super) group: usize,
}

impl Lanes for Group16 {
    type I = __m512i;
    type F = __m512;
    const ROWS: usize = 16;
    #[inline(always)]
    unsafe fn zero() -> __m512i {
        _mm512_setzero_si512()
    }
    #[inline(always)]
    unsafe fn add(a: __m512i, b: __m512i) -> __m512i {
        _mm512_add_epi32(a, b)
    }
    #[inline(always)]
    unsafe fn sub(a: __m512i, b: __m512i) -> __m512i {
        _mm512_sub_epi32(a, b)
    }
    #[inline(always)]
    unsafe fn mullo(a: __m512i, b: __m512i) -> __m512i {
        _mm512_mullo_epi32(a, b)
    }
    #[inline(always)]
    unsafe fn set1(v: i32) -> __m512i {
        _mm512_set1_epi32(v)
    }
    #[inline(always)]
    unsafe fn nibbles(v: __m512i) -> (__m512i, __m512i) {
        let m4 = _mm512_set1_epi8(0x0F);
        (
            _mm512_and_si512(v, m4),
            _mm512_and_si512(_mm512_srli_epi16::<4>(v), m4),
        )
    }
    #[inline(always)]
    unsafe fn to_f(a: __m512i) -> __m512 {
        _mm512_cvtepi32_ps(a)
    }
    #[inline(always)]
    unsafe fn fzero() -> __m512 {
        _mm512_setzero_ps()
    }
    #[inline(always)]
    unsafe fn fmul(a: __m512, b: __m512) -> __m512 {
        _mm512_mul_ps(a, b)
    }
    #[inline(always)]
    unsafe fn fadd(a: __m512, b: __m512) -> __m512 {
        _mm512_add_ps(a, b)
    }
    #[inline(always)]
    unsafe fn fmadd(a: __m512, b: __m512, c: __m512) -> __m512 {
        _mm512_fmadd_ps(a, b, c)
    }
    #[inline(always)]
    unsafe fn fnmadd(a: __m512, b: __m512, c: __m512) -> __m512 {
        _mm512_fnmadd_ps(a, b, c)
    }
    #[inline(always)]
    unsafe fn fset1(v: f32) -> __m512 {
        _mm512_set1_ps(v)
    }
    #[inline(always)]
    unsafe fn mac1(acc: __m512i, u: __m512i, xq: *const i8) -> __m512i {
        let x = _mm512_set1_epi32(std::ptr::read_unaligned(xq as *const i32));
        _mm512_dpbusd_epi32(acc, u, x)
    }
    const Q8_OFFSET: i32 = VnniMac::Q8_OFFSET;
    #[inline(always)]
    unsafe fn prep(signed: bool, raw: [__m512i; 8]) -> [__m512i; 8] {
        // Q8_0's signed bytes biased by 128 to unsigned, as `VnniMac::prep`.
        let mut u = raw;
        if signed {
            // A loop, not a closure: closures do not inherit the caller's target features.
            for v in &mut u {
                *v = _mm512_xor_si512(*v, _mm512_set1_epi8(-128));
            }
        }
        u
    }
    #[inline(always)]
    unsafe fn dot8(u: &[__m512i; 8], _: &[__m512i; 8], _: bool, xq: *const i8) -> __m512i {
        let mut s = [_mm512_setzero_si512(); 2];
        for i in 0..8 {
            s[i % 2] = Self::mac1(s[i % 2], u[i], xq.add(4 * i));
        }
        _mm512_add_epi32(s[0], s[1])
    }
    #[inline(always)]
    unsafe fn load(&self, p: *const u8) -> __m512i {
        let lo = _mm512_castsi256_si512(_mm256_loadu_si256(p as *const __m256i));
        _mm512_inserti64x4::<1>(lo, _mm256_loadu_si256(p.add(self.group) as *const __m256i))
    }
    #[inline(always)]
    unsafe fn f16(&self, p: *const u8) -> __m512 {
        let lo = _mm_loadu_si128(p as *const __m128i);
        let hi = _mm_loadu_si128(p.add(self.group) as *const __m128i);
        _mm512_cvtph_ps(_mm256_inserti128_si256::<1>(_mm256_castsi128_si256(lo), hi))
    }
    #[inline(always)]
    unsafe fn bytes(&self, p: *const u8, signed: bool) -> __m512i {
        let lo = _mm_loadl_epi64(p as *const __m128i);
        let hi = _mm_loadl_epi64(p.add(self.group) as *const __m128i);
        let b = _mm_unpacklo_epi64(lo, hi);
        if signed {
            _mm512_cvtepi8_epi32(b)
        } else {
            _mm512_cvtepu8_epi32(b)
        }
    }
    #[inline(always)]
    unsafe fn store(v: __m512, out: &mut [f32]) {
        assert_eq!(out.len(), 16, "store: one lane per element");
        _mm512_storeu_ps(out.as_mut_ptr(), v);
    }
}

/// Rows per token in a [`TokenTile`]: the kernels' chunk of rows (the matmul's `CHUNK_R`, which
/// asserts that the two agree; this module does not import it, to keep the imports one way).
pub(in super::super) const TILE_ROWS: usize = 16;

/// A kernel's outputs token by token: `tile[t][r]` is row `r` of the chunk against token `t`.
pub(super) type TokenTile<const T: usize> = [[f32; TILE_ROWS]; T];

/// `tile[t][at..at + L::ROWS]` = the lanes of `acc[t]`, one vector store per token (lanes of rows
/// past the matrix's end land in the tile too and are not read).
///
/// Panics if `at + L::ROWS > TILE_ROWS`.
#[inline(always)]
pub(super) unsafe fn store_tokens<L: Lanes, const T: usize>(
    acc: &[L::F; T],
    tile: &mut TokenTile<T>,
    at: usize,
) {
    assert!(
        at + L::ROWS <= TILE_ROWS,
        "store_tokens: lanes past the tile"
    );
    for t in 0..T {
        L::store(acc[t], &mut tile[t][at..at + L::ROWS]);
    }
}

/// `o[r][t]` = lane `r` of `acc[t]` for the rows of `o` (at most `L::ROWS`).
#[inline(always)]
pub(super) unsafe fn store_rows<L: Lanes, const T: usize>(acc: &[L::F; T], o: &mut [[f32; T]]) {
    for t in 0..T {
        let mut lanes = [0.0f32; 16];
        L::store(acc[t], &mut lanes[..L::ROWS]);
        for (r, o) in o.iter_mut().enumerate() {
            o[t] = lanes[r];
        }
    }
}
