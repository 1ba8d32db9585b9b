//! A byte range of a shared, read-only memory map that keeps the map alive: how a tensor's bytes
//! are handed out without copying them (the weights are then served from the page cache).
//!
//! The mapping is of a file that must not be truncated or overwritten in place while it is mapped
//! (replace a model file by renaming a new one over it): as for every mmap-based model loader
//! (llama.cpp's default), pages of a truncated file raise `SIGBUS` when read, and pages of a file
//! written in place change under the reader.

use std::ops::{Deref, Range};
use std::sync::Arc;

use memmap2::Mmap;

/// `range` of the shared `map`: dereferences to those bytes, clones in O(1) (an `Arc` count), and
/// keeps the mapping alive for as long as any clone lives.
#[derive(Clone)]
pub struct MappedBytes {
    map: Arc<Mmap>,
    range: Range<usize>,
}

impl MappedBytes {
    /// `range` of `map`; `None` when the range is reversed or ends past the mapping.
    pub fn new(map: Arc<Mmap>, range: Range<usize>) -> Option<MappedBytes> {
        (range.start <= range.end && range.end <= map.len()).then_some(MappedBytes { map, range })
    }

    /// The sub-range `range` of these bytes (relative to their start); `None` when it is reversed
    /// or ends past them.
    pub fn slice(&self, range: Range<usize>) -> Option<MappedBytes> {
        if range.start > range.end || range.end > self.range.len() {
            return None;
        }
        Some(MappedBytes {
            map: self.map.clone(),
            range: self.range.start + range.start..self.range.start + range.end,
        })
    }

    /// The byte range within the mapping.
    pub fn range(&self) -> Range<usize> {
        self.range.clone()
    }

    /// The whole mapping these bytes lie in (its start address bounds theirs, e.g. to check that a
    /// consumer borrows the map instead of copying).
    pub fn map(&self) -> &[u8] {
        &self.map
    }
}

impl Deref for MappedBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.map[self.range.clone()]
    }
}

impl AsRef<[u8]> for MappedBytes {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl std::fmt::Debug for MappedBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MappedBytes({:?})", self.range)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map_of(bytes: &[u8]) -> (tempfile::TempDir, Arc<Mmap>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data.bin");
        std::fs::write(&path, bytes).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        // SAFETY: the test's own file, not modified while mapped.
        (dir, Arc::new(unsafe { Mmap::map(&file) }.unwrap()))
    }

    #[test]
    fn ranges_borrow_the_mapping_and_are_bounds_checked() {
        let (_dir, map) = map_of(&[0, 1, 2, 3, 4, 5, 6, 7]);
        let start = map.as_ptr();
        let b = MappedBytes::new(map.clone(), 2..7).unwrap();
        assert_eq!(&*b, &[2, 3, 4, 5, 6]);
        assert_eq!(b.as_ptr(), start.wrapping_add(2));
        let s = b.slice(1..3).unwrap();
        assert_eq!((&*s, s.range()), (&[3u8, 4][..], 3..5));
        assert_eq!(s.as_ptr(), start.wrapping_add(3));
        assert_eq!(s.map().as_ptr(), start);
        assert!(b.slice(0..6).is_none());
        let reversed = |start, end| Range { start, end };
        assert!(b.slice(reversed(3, 2)).is_none());
        assert!(MappedBytes::new(map.clone(), 0..9).is_none());
        assert!(MappedBytes::new(map.clone(), reversed(5, 4)).is_none());
        // The clones keep the mapping alive after every other handle is gone.
        drop(map);
        drop(b);
        assert_eq!(&*s.clone(), &[3, 4]);
        assert_eq!(format!("{s:?}"), "MappedBytes(3..5)");
    }
}
