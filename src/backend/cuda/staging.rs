//! Host staging: the pinned host memory that inputs (token ids, row tables,
//! host values) go to the device through and results come back through,
//! and the row tables kept on the device while a batch's rows stay the same.

use std::ffi::c_int;
use std::sync::Arc;

use super::kernels::DeviceRow;
use super::memory::{Arena, DeviceAllocator, DevicePtr};
use super::readback::{CopyWorkers, ReadPieces};
use super::runtime::{self, OwnedEvent, OwnedStream, PinnedBuffer};
use super::{fill_rows, DeviceBuffer, State};
use crate::error::{Error, Result};

/// Which of the backend's row tables an operation uses.
#[derive(Clone, Copy)]
pub(super) enum RowTableKind {
    /// The rows' positions (RoPE).
    Positions,
    /// The rows' caches and positions (the KV-cache and attention kernels).
    CacheRows,
}

impl State {
    /// Copies a list of indices (token ids, row numbers) into this
    /// operation's scratch.
    pub(super) fn upload_indices(
        &mut self,
        allocator: &Arc<DeviceAllocator>,
        ids: &[c_int],
    ) -> Result<*const c_int> {
        if self.capture.is_some() {
            // The copy would be recorded from a staging piece that later
            // steps reuse.
            return Err(Error::unsupported(
                "an index upload inside a recorded decode step",
            ));
        }
        let bytes = std::mem::size_of_val(ids);
        self.arena.begin(allocator, Arena::footprint(&[bytes]))?;
        let device_ids = self.arena.take::<c_int>(ids.len());
        // SAFETY: the arena piece holds ids.len() ints.
        unsafe {
            self.staging
                .copy_to_device(device_ids.cast(), as_bytes(ids), &self.stream)?
        };
        Ok(device_ids)
    }

    /// The device copy of a batch's row table: the recorded step's own
    /// table while a step is recorded (its contents are copied in before
    /// each replay), else `table`'s, uploaded when the rows changed.
    pub(super) fn row_table(
        &mut self,
        allocator: &Arc<DeviceAllocator>,
        table: RowTableKind,
        rows: Vec<DeviceRow>,
    ) -> Result<*const DeviceRow> {
        if let Some(capture) = &self.capture {
            return capture.inputs.row_table(rows.len());
        }
        let table = match table {
            RowTableKind::Positions => &mut self.positions,
            RowTableKind::CacheRows => &mut self.cache_rows,
        };
        table.upload(allocator, rows, &mut self.staging, &self.stream)
    }

    /// The first `len` values of `buffer`, copied into the pinned read-back
    /// buffer (grown to the largest read): the device writes pinned memory
    /// at the link's full speed, pageable memory at a fraction of it. Waits
    /// for the stream, so the step's staging pieces are free again.
    pub(super) fn read_to_pinned(&mut self, buffer: &DeviceBuffer, len: usize) -> Result<&[f32]> {
        assert!(len <= buffer.len());
        // SAFETY: the buffer holds len values.
        unsafe { self.read_bytes_to_pinned(buffer.as_ptr().cast(), len * 4)? };
        Ok(self.readback.as_f32_slice(len))
    }

    /// The first rows.len() rows of `buffer` (`row_len` values each) into
    /// `rows`. A large read goes in pieces of half a megabyte, each copied
    /// into the pinned buffer with an event after it, and the backend's
    /// read-back threads (`readback.rs`, started on the first large read)
    /// move each piece into its rows as soon as its event has passed: the host's
    /// copies run under the device's instead of after them (8 sessions'
    /// logits of a 248,320-token vocabulary are 8 MB a step), and the last
    /// piece's copy is short. Waits for the stream, as `read_to_pinned`
    /// does. A failure once the pieces are on their way leaves the rows
    /// empty; one before leaves them as they were. `device`: the backend's,
    /// which each thread makes current before it waits on an event.
    pub(super) fn read_rows(
        &mut self,
        device: usize,
        buffer: &DeviceBuffer,
        row_len: usize,
        rows: &mut [&mut Vec<f32>],
    ) -> Result<()> {
        const PIECE_VALUES: usize = 1 << 17;
        const MAX_THREADS: usize = 8;
        let len = row_len * rows.len();
        assert!(len <= buffer.len());
        let n_pieces = len.div_ceil(PIECE_VALUES);
        let wanted = n_pieces / 2;
        if wanted > 1 && self.copy_workers.is_none() {
            // Where the system starts no thread, reads take the one-copy
            // path below (and the next large read tries again).
            let available =
                MAX_THREADS.min(std::thread::available_parallelism().map_or(1, |n| n.get()));
            if available > 1 {
                self.copy_workers = CopyWorkers::new(available).ok();
            }
        }
        let threads = self
            .copy_workers
            .as_ref()
            .map_or(1, |w| wanted.min(w.threads()));
        if threads <= 1 {
            let pinned = self.read_to_pinned(buffer, len)?;
            fill_rows(pinned, row_len, rows);
            return Ok(());
        }
        if self.readback.capacity() < len * 4 {
            self.readback = PinnedBuffer::new((len * 4).next_power_of_two())?;
        }
        while self.readback_events.len() < n_pieces {
            self.readback_events.push(OwnedEvent::new()?);
        }
        let pinned = self.readback.as_mut_slice().as_mut_ptr().cast::<f32>();
        for (piece, event) in self.readback_events[..n_pieces].iter().enumerate() {
            let first = piece * PIECE_VALUES;
            let n = PIECE_VALUES.min(len - first);
            // SAFETY: the buffer holds len values and the pinned buffer at
            // least as many; the pinned values are read only after the
            // piece's event has passed.
            unsafe {
                runtime::copy_to_host_async(
                    pinned.add(first).cast(),
                    buffer.as_ptr().add(first).cast(),
                    n * 4,
                    self.stream.raw(),
                )?
            };
            event.record(&self.stream)?;
        }
        let destinations: Vec<*mut f32> = rows
            .iter_mut()
            .map(|row| {
                row.clear();
                row.reserve(row_len);
                row.as_mut_ptr()
            })
            .collect();
        let workers = self.copy_workers.as_ref().expect("started above");
        let read = ReadPieces {
            device,
            pinned: pinned.cast_const(),
            len,
            piece_values: PIECE_VALUES,
            events: self.readback_events.as_ptr(),
            rows: destinations.as_ptr(),
            row_len,
        };
        // SAFETY: the pinned buffer holds len values, filled piece by piece
        // by the copies enqueued above, each followed by its event; each
        // destination has capacity for row_len values; all of it stays
        // untouched here until the workers are done (`run` waits for them).
        let copied = unsafe { workers.run(read, threads) };
        if copied.is_err() {
            // A pool that lost a thread is started again by the next read.
            self.copy_workers = None;
        }
        // Every piece's event has passed, so the stream's copies are done;
        // the step's staging pieces are free again only once all its work
        // is, which the last event marks.
        let done = self.readback_events[n_pieces - 1].wait();
        copied.and(done)?;
        self.staging.reset();
        for row in rows.iter_mut() {
            // SAFETY: the pieces wrote each of the row's row_len values.
            unsafe { row.set_len(row_len) };
        }
        Ok(())
    }

    /// `bytes` bytes of device memory at `src`, copied into the pinned
    /// read-back buffer as `read_to_pinned` does.
    ///
    /// # Safety
    /// `src` is device memory of at least `bytes` bytes.
    pub(super) unsafe fn read_bytes_to_pinned(
        &mut self,
        src: *const u8,
        bytes: usize,
    ) -> Result<&[u8]> {
        if self.readback.capacity() < bytes {
            self.readback = PinnedBuffer::new(bytes.next_power_of_two())?;
        }
        let pinned = &mut self.readback.as_mut_slice()[..bytes];
        // SAFETY: the caller's promise; the copy waits for the stream.
        unsafe { runtime::copy_to_host(pinned, src.cast(), self.stream.raw())? };
        self.staging.reset();
        Ok(&self.readback.as_mut_slice()[..bytes])
    }
}

/// Pinned host memory that small uploads (token ids, row tables, host
/// values) are copied through: a copy from pageable memory would make the
/// host wait for the device, and the host must run ahead of the device for
/// the launches of a step to overlap its kernels. Pieces are handed out in
/// order and reused after the stream has been waited for.
pub(super) struct Staging {
    buffer: PinnedBuffer,
    used: usize,
}

impl Staging {
    pub const INITIAL: usize = 1 << 20;

    pub fn new() -> Result<Staging> {
        Ok(Staging {
            buffer: PinnedBuffer::new(Self::INITIAL)?,
            used: 0,
        })
    }

    /// Enqueues a copy of `data` to `dst` on `stream`.
    ///
    /// # Safety
    /// `dst` is device memory of at least `data.len()` bytes.
    pub unsafe fn copy_to_device(
        &mut self,
        dst: *mut std::ffi::c_void,
        data: &[u8],
        stream: &OwnedStream,
    ) -> Result<()> {
        let mut start = self.used.next_multiple_of(64);
        if start + data.len() > self.buffer.capacity() {
            // Earlier copies out of the buffer must be done before it is reused.
            runtime::synchronize(stream)?;
            if data.len() > self.buffer.capacity() {
                self.buffer = PinnedBuffer::new(data.len().next_power_of_two())?;
            }
            start = 0;
        }
        let piece = &mut self.buffer.as_mut_slice()[start..start + data.len()];
        piece.copy_from_slice(data);
        self.used = start + data.len();
        // SAFETY: the piece stays untouched until the stream has been waited
        // for (`reset` or the synchronization above).
        unsafe { runtime::copy_to_device(dst, piece.as_ptr().cast(), data.len(), stream.raw()) }
    }

    /// The stream has been waited for: every piece may be reused.
    pub fn reset(&mut self) {
        self.used = 0;
    }
}

/// The bytes of a slice of plain values.
pub(super) fn as_bytes<T: Copy>(values: &[T]) -> &[u8] {
    // SAFETY: the slice's memory, read as bytes; T is Copy plain data.
    unsafe { std::slice::from_raw_parts(values.as_ptr().cast(), std::mem::size_of_val(values)) }
}

/// A host table of batch rows and its device copy, uploaded again only when
/// the rows change (every layer of a forward pass uses the same rows).
pub(super) struct RowTable {
    host: Vec<DeviceRow>,
    device: Option<DevicePtr<DeviceRow>>,
}

impl RowTable {
    pub fn new() -> RowTable {
        RowTable {
            host: Vec::new(),
            device: None,
        }
    }

    fn upload(
        &mut self,
        allocator: &Arc<DeviceAllocator>,
        rows: Vec<DeviceRow>,
        staging: &mut Staging,
        stream: &OwnedStream,
    ) -> Result<*const DeviceRow> {
        if self.device.is_none() || rows != self.host {
            let mut device = allocator.alloc::<DeviceRow>(rows.len())?;
            // SAFETY: `device` holds rows.len() entries.
            unsafe { staging.copy_to_device(device.as_mut_ptr().cast(), as_bytes(&rows), stream)? };
            self.device = Some(device);
            self.host = rows;
        }
        Ok(self.device.as_ref().expect("uploaded above").as_ptr())
    }
}
