//! AVX-512 kernel of the tiled value pass: several query rows against one block of value rows,
//! each output element updated exactly as [`add_scaled`](super::super::matmul::add_scaled)
//! would (a product, then a sum, in increasing key order), with the value vector loaded once
//! for all rows and the outputs kept in registers across the block.

use std::arch::x86_64::*;

/// `o[i] += p[i][j] * vs[j]` for `j = 0..vs.len()` in order, for each of the `ROWS` rows `o[i]`
/// (`o` is `[ROWS, hd]`, each `p[i]` is `vs.len()` long, each `vs[j]` is `hd` long, `hd` a
/// multiple of 16): per element, bitwise `vs.len()` [`add_scaled`] calls in order.
///
/// [`add_scaled`]: super::super::matmul::add_scaled
///
/// # Safety
/// The CPU must support AVX-512F.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn add_values_rows<const ROWS: usize>(
    o: &mut [f32],
    p: [&[f32]; ROWS],
    vs: &[&[f32]],
    hd: usize,
) {
    assert!(hd.is_multiple_of(16) && o.len() == ROWS * hd);
    assert!(p.iter().all(|pi| pi.len() == vs.len()) && vs.iter().all(|v| v.len() == hd));
    let op = o.as_mut_ptr();
    for c in (0..hd).step_by(16) {
        let mut acc: [__m512; ROWS] = std::array::from_fn(|i| _mm512_loadu_ps(op.add(i * hd + c)));
        for (j, v) in vs.iter().enumerate() {
            let v = _mm512_loadu_ps(v.as_ptr().add(c));
            for i in 0..ROWS {
                let prod = _mm512_mul_ps(_mm512_set1_ps(*p[i].get_unchecked(j)), v);
                acc[i] = _mm512_add_ps(acc[i], prod);
            }
        }
        for (i, a) in acc.into_iter().enumerate() {
            _mm512_storeu_ps(op.add(i * hd + c), a);
        }
    }
}
