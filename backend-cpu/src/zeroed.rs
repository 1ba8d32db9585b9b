//! [`ZeroedPages`]: a fixed-size buffer of zeros whose memory the kernel commits page by page as it
//! is first written, for the KV cache.
//!
//! Why: a KV budget of gigabytes is reserved at start-up but filled only as sequences use it. A
//! 64-byte aligned `alloc_zeroed` is not lazy (the system allocator serves alignments above 16
//! bytes with `posix_memalign` and then writes every byte), and neither is `vec![f16::ZERO; n]`:
//! measured on the 2-core machine, a 4 GiB f32 cache took 4.5-7 s of page faults, spent on the
//! engine thread before the first request's first step. An anonymous private mapping
//! (`mmap(MAP_ANONYMOUS)`, through `memmap2`) reads as zeros and is page aligned, which also keeps
//! the SIMD kernels' 64-byte aligned loads (see [`crate::aligned`]).

use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};

/// Element types whose all-zero bit pattern is the value zero.
///
/// # Safety
/// Every bit pattern of all zero bytes must be a valid `Self`, and `Self` must have no padding.
pub(crate) unsafe trait ZeroBits: Copy {}

// SAFETY: IEEE 754 +0.0 is all zero bits; neither type has padding.
unsafe impl ZeroBits for f32 {}
// SAFETY: as for f32 (`half::f16` is a `repr(transparent)` u16).
unsafe impl ZeroBits for half::f16 {}

/// `len` elements of `T`, zeros until written, on page-aligned memory committed as it is touched.
pub(crate) struct ZeroedPages<T: ZeroBits> {
    /// `None` for an empty buffer (a mapping cannot be empty).
    map: Option<memmap2::MmapMut>,
    len: usize,
    _elements: PhantomData<T>,
}

impl<T: ZeroBits> ZeroedPages<T> {
    /// `len` zeros.
    ///
    /// Panics when the mapping cannot be made (out of address space) or the size overflows.
    pub(crate) fn new(len: usize) -> Self {
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .expect("ZeroedPages: size overflows usize");
        let map = (bytes > 0).then(|| {
            memmap2::MmapMut::map_anon(bytes)
                .unwrap_or_else(|e| panic!("ZeroedPages: mapping {bytes} bytes: {e}"))
        });
        ZeroedPages {
            map,
            len,
            _elements: PhantomData,
        }
    }
}

impl<T: ZeroBits> Deref for ZeroedPages<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        match &self.map {
            // SAFETY: the mapping holds `len * size_of::<T>()` bytes, page aligned (so aligned
            // for `T`), each either zero or written through `deref_mut` as a `T`; zero bytes are
            // a valid `T` (`ZeroBits`).
            Some(map) => unsafe { std::slice::from_raw_parts(map.as_ptr().cast::<T>(), self.len) },
            None => &[],
        }
    }
}

impl<T: ZeroBits> DerefMut for ZeroedPages<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        match &mut self.map {
            // SAFETY: as in `deref`, borrowed mutably through `&mut self`.
            Some(map) => unsafe {
                std::slice::from_raw_parts_mut(map.as_mut_ptr().cast::<T>(), self.len)
            },
            None => &mut [],
        }
    }
}

impl<T: ZeroBits> Clone for ZeroedPages<T> {
    fn clone(&self) -> Self {
        let mut copy = ZeroedPages::new(self.len);
        copy.copy_from_slice(self);
        copy
    }
}

impl<T: ZeroBits + std::fmt::Debug> std::fmt::Debug for ZeroedPages<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ZeroedPages({} elements)", self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeros_page_aligned_writable_and_cloned() {
        let mut z = ZeroedPages::<f32>::new(100_003);
        assert_eq!(z.len(), 100_003);
        assert_eq!(z.as_ptr() as usize % 4096, 0);
        assert!(z.iter().all(|&v| v == 0.0));
        z[100_002] = 2.5;
        z.copy_within(100_002..100_003, 7);
        let c = z.clone();
        assert_eq!((c[7], c[100_002], c[8]), (2.5, 2.5, 0.0));
        let h = ZeroedPages::<half::f16>::new(5);
        assert!(h.iter().all(|v| v.to_f32() == 0.0));
        assert!(ZeroedPages::<f32>::new(0).is_empty());
    }

    #[test]
    fn a_large_buffer_costs_nothing_until_written() {
        // 16 GiB of address space: committing it would fail on the test machines (24 GiB, with
        // other work) or take seconds; a mapping takes neither.
        let started = std::time::Instant::now();
        let mut z = ZeroedPages::<f32>::new(4 << 30);
        z[(4 << 30) - 1] = 1.0;
        assert_eq!(z[0], 0.0);
        assert!(started.elapsed().as_secs_f64() < 1.0);
    }
}
