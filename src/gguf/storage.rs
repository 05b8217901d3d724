//! Where tensor bytes live: a read-only memory map of the file, or a heap copy
//! of the data section when the host asks for no mmap.

use memmap2::Mmap;

/// 64-byte aligned heap bytes, so that tensor data copied out of a file keeps
/// the alignment (32 by default) its offsets promise, as a mapping would.
pub struct AlignedBytes {
    blocks: Vec<Block>,
    len: usize,
}

#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Block([u8; 64]);

impl AlignedBytes {
    /// `len` zeroed bytes, or `None` when the allocation fails.
    pub fn zeroed(len: usize) -> Option<AlignedBytes> {
        let n_blocks = len.div_ceil(64);
        let mut blocks = Vec::new();
        blocks.try_reserve_exact(n_blocks).ok()?;
        blocks.resize(n_blocks, Block([0; 64]));
        Some(AlignedBytes { blocks, len })
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `blocks` owns `n_blocks * 64 >= len` initialized bytes, and
        // `Block` is a plain byte array with no padding.
        unsafe { std::slice::from_raw_parts(self.blocks.as_ptr().cast::<u8>(), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and `&mut self` makes the borrow unique.
        unsafe { std::slice::from_raw_parts_mut(self.blocks.as_mut_ptr().cast::<u8>(), self.len) }
    }
}

/// The bytes of a GGUF data section.
pub enum TensorData {
    /// The whole file mapped; the data section starts at `data_offset`.
    Mapped { map: Mmap, data_offset: usize },
    /// A copy of the data section alone.
    Owned(AlignedBytes),
}

impl TensorData {
    pub fn bytes(&self) -> &[u8] {
        match self {
            TensorData::Mapped { map, data_offset } => &map[*data_offset..],
            TensorData::Owned(bytes) => bytes.as_slice(),
        }
    }

    pub fn is_mapped(&self) -> bool {
        matches!(self, TensorData::Mapped { .. })
    }

    /// Tells the system that bytes `range` of the data section will not be
    /// read for a while, so that a mapped file's pages holding only them
    /// can leave memory (a later read maps them in again from the file).
    /// Nothing for a copy in memory. Best effort: a failure changes nothing.
    pub fn release(&self, range: std::ops::Range<usize>) {
        #[cfg(unix)]
        if let TensorData::Mapped { map, data_offset } = self {
            // SAFETY: sysconf has no preconditions.
            let page = match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
                p if p > 0 => p as usize,
                _ => return,
            };
            // Whole pages inside the range only: the pages at its ends may
            // hold other tensors' bytes.
            let start = (data_offset + range.start).next_multiple_of(page);
            let end = ((data_offset + range.end).min(map.len()) / page) * page;
            if start < end {
                // SAFETY: the map is a read-only shared file mapping that
                // this process never writes, so its pages are clean copies
                // of the file: dropping them changes no byte that any
                // reference sees, and a later read faults the file's same
                // bytes back in. The range lies inside the map (clamped
                // above) and starts on a page boundary.
                let _ = unsafe {
                    map.unchecked_advise_range(
                        memmap2::UncheckedAdvice::DontNeed,
                        start,
                        end - start,
                    )
                };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_bytes_are_aligned_zeroed_and_sized() {
        for len in [0, 1, 63, 64, 65, 1000] {
            let mut b = AlignedBytes::zeroed(len).unwrap();
            assert_eq!(b.as_slice().len(), len);
            assert_eq!(b.as_slice().as_ptr() as usize % 64, 0);
            assert!(b.as_slice().iter().all(|&x| x == 0));
            b.as_mut_slice().iter_mut().for_each(|x| *x = 7);
            assert!(b.as_slice().iter().all(|&x| x == 7));
        }
    }
}
