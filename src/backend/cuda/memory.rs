//! Device memory, owned by the library: a [`DeviceAllocator`] that hands out
//! typed [`DevicePtr`]s, keeps freed blocks in size classes for reuse (so a
//! decode loop, which asks for the same sizes every step, makes no
//! cudaMalloc/cudaFree), and an [`Arena`] for the scratch of one operation.
//!
//! Reusing a block without waiting for the device is safe because all of a
//! backend's work runs in order on one stream: a kernel that still reads a
//! freed block runs before any later kernel that writes its new owner.

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;

use super::runtime;
use crate::error::{ErrorKind, Result};

/// Usage counters, as `m40_model_describe` reports them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Bytes held by live `DevicePtr`s (size classes, not requested sizes).
    pub in_use: usize,
    /// The most `in_use` has been.
    pub peak: usize,
    /// Freed bytes kept for reuse.
    pub cached: usize,
    /// Allocations served from the cache.
    pub cache_hits: u64,
    /// Allocations that called cudaMalloc.
    pub device_allocations: u64,
}

struct Pool {
    /// Freed blocks by size class.
    free: BTreeMap<usize, Vec<usize>>,
    stats: MemoryStats,
    /// While a thread records a CUDA graph, the blocks it frees: the
    /// recorded kernels keep using them on every replay (see `hold_freed`).
    held: Option<(ThreadId, Vec<(usize, usize)>)>,
}

pub struct DeviceAllocator {
    device: usize,
    pool: Mutex<Pool>,
}

/// Blocks are rounded up to a class so that nearby sizes share blocks: a
/// multiple of 512 bytes below 1 MiB, else a multiple of an eighth of the
/// largest power of two not above the size (at most 12.5% unused).
fn size_class(bytes: usize) -> usize {
    const SMALL: usize = 1 << 20;
    let bytes = bytes.max(1);
    if bytes < SMALL {
        return exact_class(bytes);
    }
    let step = (1usize << (usize::BITS - 1 - bytes.leading_zeros())) / 8;
    bytes.div_ceil(step) * step
}

/// The class of a block no other size is to share: the size in whole
/// 512-byte units.
fn exact_class(bytes: usize) -> usize {
    bytes.max(1).div_ceil(512) * 512
}

impl DeviceAllocator {
    pub fn new(device: usize) -> Arc<DeviceAllocator> {
        Arc::new(DeviceAllocator {
            device,
            pool: Mutex::new(Pool {
                free: BTreeMap::new(),
                stats: MemoryStats::default(),
                held: None,
            }),
        })
    }

    fn pool(&self) -> std::sync::MutexGuard<'_, Pool> {
        // The pool's data stays consistent across a panic elsewhere.
        self.pool.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn stats(&self) -> MemoryStats {
        self.pool().stats
    }

    /// `len` values of T, uninitialized.
    pub fn alloc<T: Copy>(self: &Arc<Self>, len: usize) -> Result<DevicePtr<T>> {
        self.alloc_in(len, size_class)
    }

    /// `len` values of T, uninitialized, in a block of their own size: for
    /// memory held as long as the model (its weights), where a size
    /// class's rounding would only waste device memory (up to an eighth:
    /// 2 GiB of a 16 GiB model).
    pub fn alloc_exact<T: Copy>(self: &Arc<Self>, len: usize) -> Result<DevicePtr<T>> {
        self.alloc_in(len, exact_class)
    }

    fn alloc_in<T: Copy>(
        self: &Arc<Self>,
        len: usize,
        class_of: fn(usize) -> usize,
    ) -> Result<DevicePtr<T>> {
        let bytes = len.checked_mul(std::mem::size_of::<T>()).ok_or_else(|| {
            crate::error::Error::out_of_memory(format!("{len} values do not fit in memory"))
        })?;
        let class = class_of(bytes);
        let cached = {
            let mut pool = self.pool();
            let hit = pool.free.get_mut(&class).and_then(Vec::pop);
            if hit.is_some() {
                pool.stats.cache_hits += 1;
                pool.stats.cached -= class;
            }
            hit
        };
        let addr = match cached {
            Some(addr) => addr,
            None => self.malloc(class)?,
        };
        let mut pool = self.pool();
        pool.stats.in_use += class;
        pool.stats.peak = pool.stats.peak.max(pool.stats.in_use);
        Ok(DevicePtr {
            addr,
            len,
            class,
            allocator: Arc::clone(self),
            _type: PhantomData,
        })
    }

    /// cudaMalloc, retried once after returning the cache to the driver.
    fn malloc(&self, bytes: usize) -> Result<usize> {
        runtime::set_device(self.device)?;
        let ptr = match runtime::malloc(bytes) {
            // Freeing would end the calling thread's recording (see
            // runtime::free): it fails with out of memory instead.
            Err(e)
                if e.kind() == ErrorKind::OutOfMemory
                    && self.pool().stats.cached > 0
                    && !self.holds_for_this_thread() =>
            {
                self.release_cache();
                runtime::malloc(bytes)?
            }
            other => other?,
        };
        self.pool().stats.device_allocations += 1;
        Ok(ptr as usize)
    }

    /// Frees every cached block.
    pub fn release_cache(&self) {
        let blocks: Vec<usize> = {
            let mut pool = self.pool();
            pool.stats.cached = 0;
            std::mem::take(&mut pool.free)
                .into_values()
                .flatten()
                .collect()
        };
        for addr in blocks {
            // SAFETY: cached blocks came from cudaMalloc and have no owner.
            unsafe { runtime::free(addr as *mut c_void) };
        }
    }

    /// From now until `take_held`, blocks the calling thread frees stay
    /// owned: a graph being recorded names them, and handing them to the
    /// next owner would let a replay overwrite the new owner's data.
    pub fn hold_freed(&self) {
        self.pool().held = Some((std::thread::current().id(), Vec::new()));
    }

    fn holds_for_this_thread(&self) -> bool {
        self.pool()
            .held
            .as_ref()
            .is_some_and(|(thread, _)| *thread == std::thread::current().id())
    }

    /// The blocks freed since `hold_freed`, owned again; freeing returns to
    /// the pool as usual afterwards.
    pub fn take_held(self: &Arc<Self>) -> Vec<DevicePtr<u8>> {
        let held = self
            .pool()
            .held
            .take()
            .map_or_else(Vec::new, |(_, blocks)| blocks);
        held.into_iter()
            .map(|(addr, class)| DevicePtr {
                addr,
                len: class,
                class,
                allocator: Arc::clone(self),
                _type: PhantomData,
            })
            .collect()
    }

    fn give_back(&self, addr: usize, class: usize) {
        let mut pool = self.pool();
        if let Some((thread, blocks)) = &mut pool.held {
            if *thread == std::thread::current().id() {
                blocks.push((addr, class));
                return;
            }
        }
        pool.stats.in_use -= class;
        pool.stats.cached += class;
        pool.free.entry(class).or_default().push(addr);
    }
}

impl Drop for DeviceAllocator {
    fn drop(&mut self) {
        if runtime::set_device(self.device).is_ok() {
            self.release_cache();
        }
    }
}

/// `len` values of T in device memory, returned to its allocator on drop.
pub struct DevicePtr<T> {
    addr: usize,
    len: usize,
    class: usize,
    allocator: Arc<DeviceAllocator>,
    _type: PhantomData<T>,
}

impl<T> DevicePtr<T> {
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn as_ptr(&self) -> *const T {
        self.addr as *const T
    }
    pub fn as_mut_ptr(&mut self) -> *mut T {
        self.addr as *mut T
    }
    /// The device address, for tables the kernels read.
    pub fn address(&self) -> u64 {
        self.addr as u64
    }
}

impl<T> Drop for DevicePtr<T> {
    fn drop(&mut self) {
        self.allocator.give_back(self.addr, self.class);
    }
}

/// Scratch for one operation: a block that grows to the largest request and
/// is reused by every operation after it (the stream orders their use).
#[derive(Default)]
pub struct Arena {
    block: Option<DevicePtr<u8>>,
    used: usize,
}

/// Scratch pieces start on 256-byte boundaries, as cudaMalloc's do.
const ARENA_ALIGN: usize = 256;

impl Arena {
    /// Starts an operation that will take at most `bytes` in all (counting
    /// each piece rounded up to 256 bytes).
    pub fn begin(&mut self, allocator: &Arc<DeviceAllocator>, bytes: usize) -> Result<()> {
        self.used = 0;
        if self.block.as_ref().is_none_or(|b| b.len() < bytes) {
            self.block = None;
            self.block = Some(allocator.alloc(bytes)?);
        }
        Ok(())
    }

    /// `len` values of T from the block reserved by `begin`.
    pub fn take<T>(&mut self, len: usize) -> *mut T {
        let bytes = (len * std::mem::size_of::<T>()).div_ceil(ARENA_ALIGN) * ARENA_ALIGN;
        let block = self
            .block
            .as_mut()
            .expect("Arena::begin reserves the block");
        assert!(
            self.used + bytes <= block.len(),
            "arena overrun: the operation reserved less than it takes"
        );
        // SAFETY: within the block, checked above.
        let ptr = unsafe { block.as_mut_ptr().add(self.used) };
        self.used += bytes;
        ptr.cast()
    }

    /// Bytes `begin` must reserve for pieces of these byte sizes.
    pub fn footprint(pieces: &[usize]) -> usize {
        pieces
            .iter()
            .map(|b| b.div_ceil(ARENA_ALIGN) * ARENA_ALIGN)
            .sum()
    }
}

/// Bytes as a short human-readable size.
pub fn human(bytes: usize) -> String {
    const MIB: f64 = (1 << 20) as f64;
    if bytes >= 1 << 30 {
        format!("{:.2} GiB", bytes as f64 / (MIB * 1024.0))
    } else if bytes >= 1 << 20 {
        format!("{:.1} MiB", bytes as f64 / MIB)
    } else {
        format!("{bytes} bytes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_classes_cover_the_request_and_waste_at_most_an_eighth() {
        for bytes in [
            1usize,
            511,
            512,
            513,
            4096,
            (1 << 20) - 1,
            1 << 20,
            3 << 20,
            1_000_000_007,
            (1 << 30) + 1,
            (16 << 30) + (40 << 20),
        ] {
            let class = size_class(bytes);
            assert!(class >= bytes);
            assert!(class - bytes <= 512.max(bytes / 8), "{bytes} → {class}");
        }
        // Nearby sizes share a class, which is what makes the cache hit.
        assert_eq!(size_class(5 << 20), size_class((5 << 20) - 1000));
    }

    #[test]
    fn exact_classes_round_only_to_512_bytes() {
        assert_eq!(exact_class(0), 512);
        assert_eq!(exact_class((16 << 30) + 1), (16 << 30) + 512);
    }
}
