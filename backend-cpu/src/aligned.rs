//! [`AlignedVec`]: a growable f32 buffer whose first element sits on a
//! 64-byte (cache-line) boundary.
//!
//! Why: the SIMD kernels load 16 floats (64 bytes) at a time along rows whose
//! widths are multiples of 16 floats (576, 1536, 64 per head), so with an
//! aligned base every load is aligned. A 64-byte load that straddles two cache
//! lines costs two; measured on the 2-core test machine, an 8 × 3 f32 tile
//! kernel ran 25-35 % slower on buffers offset by 4 bytes. `Vec<f32>` only
//! promises 4-byte alignment (glibc gives 16).

use std::ops::{Deref, DerefMut};

/// One cache line of floats; the unit of [`AlignedVec`]'s storage.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([f32; LINE]);

/// Floats per cache line.
const LINE: usize = 16;

/// A resizable `[f32]` buffer starting on a 64-byte boundary. Capacity only
/// grows, so a buffer reused across steps stops allocating once it has held
/// the largest step.
#[derive(Clone, Default)]
pub struct AlignedVec {
    lines: Vec<Line>,
    len: usize,
}

impl AlignedVec {
    /// An empty buffer (no allocation).
    pub const fn new() -> AlignedVec {
        AlignedVec {
            lines: Vec::new(),
            len: 0,
        }
    }

    /// Sets the length to `len` floats; new elements are `value`, existing ones are kept.
    pub fn resize(&mut self, len: usize, value: f32) {
        let old = self.len;
        let lines = len.div_ceil(LINE);
        if lines > self.lines.len() {
            self.lines.resize(lines, Line([0.0; LINE]));
        }
        self.len = len;
        if len > old {
            self[old..].fill(value);
        }
    }

    /// Sets the length to 0 (keeps the allocation).
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Appends `values`.
    pub fn extend_from_slice(&mut self, values: &[f32]) {
        let old = self.len;
        self.resize(old + values.len(), 0.0);
        self[old..].copy_from_slice(values);
    }
}

impl Deref for AlignedVec {
    type Target = [f32];

    fn deref(&self) -> &[f32] {
        // SAFETY: `lines` holds at least `len.div_ceil(16)` initialised lines of
        // 16 f32 each (`repr(C)`, no padding besides the alignment, which a
        // 64-byte array of floats does not need), so its first `len` floats are
        // valid and contiguous.
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr().cast::<f32>(), self.len) }
    }
}

impl DerefMut for AlignedVec {
    fn deref_mut(&mut self) -> &mut [f32] {
        // SAFETY: as in `deref`, borrowed mutably through `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr().cast::<f32>(), self.len) }
    }
}

impl std::fmt::Debug for AlignedVec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_and_resizes_like_a_vec() {
        let mut v = AlignedVec::new();
        assert!(v.is_empty());
        v.resize(3, 1.5);
        assert_eq!(&v[..], &[1.5, 1.5, 1.5]);
        assert_eq!(v.as_ptr() as usize % 64, 0);
        v.extend_from_slice(&[2.0; 20]);
        assert_eq!(v.len(), 23);
        assert_eq!(v[22], 2.0);
        v.resize(2, 0.0);
        v.resize(4, 7.0);
        assert_eq!(&v[..], &[1.5, 1.5, 7.0, 7.0]);
        v.clear();
        assert!(v.is_empty());
        let mut big = AlignedVec::new();
        big.extend_from_slice(&vec![3.0; 10_000]);
        assert_eq!(big.as_ptr() as usize % 64, 0);
        assert_eq!(big.iter().sum::<f32>(), 30_000.0);
    }
}
