//! [`Prefetch`]: software prefetch of the next weight block while the matmul computes the
//! current one.

/// Software prefetch of a weight block into L2, spread over the register tiles of the block
/// computed before it, so the next block streams in from memory while the FMAs run (the
/// hardware prefetchers alone leave a decode step's scratch decoding waiting on memory).
pub(super) struct Prefetch {
    /// Next cache line to fetch.
    next: *const u8,
    /// One past the last byte.
    end: *const u8,
    /// Lines fetched per [`Prefetch::step`].
    per_step: usize,
}

impl Prefetch {
    /// Fetches `bytes`, once [`Prefetch::spread_over`] has said over how many steps.
    pub(super) fn new(bytes: &[u8]) -> Self {
        Prefetch {
            next: bytes.as_ptr(),
            end: bytes.as_ptr().wrapping_add(bytes.len()),
            per_step: 0,
        }
    }

    /// Spreads the lines not yet fetched evenly over `steps` calls of [`Prefetch::step`] (the
    /// register tiles of the computing block, which knows how many it runs).
    pub(super) fn spread_over(&mut self, steps: usize) {
        let lines = (self.end as usize)
            .saturating_sub(self.next as usize)
            .div_ceil(64);
        self.per_step = lines.div_ceil(steps.max(1));
    }

    /// Fetches the next few lines (none once the block is done).
    #[inline(always)]
    pub(super) fn step(&mut self) {
        for _ in 0..self.per_step {
            if self.next >= self.end {
                return;
            }
            #[cfg(target_arch = "x86_64")]
            // SAFETY: a prefetch never faults, and `next` lies inside the block.
            unsafe {
                use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
                _mm_prefetch::<_MM_HINT_T1>(self.next as *const i8);
            }
            self.next = self.next.wrapping_add(64);
        }
    }
}
