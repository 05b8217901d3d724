//! The CUDA backend: the model's weights uploaded once in their GGUF layout,
//! activations in f32, an f16 KV cache per sequence, and the kernels of
//! `cuda/` (written for the Tesla M40, sm_52, and run on every newer GPU).
//!
//! All device work of a backend runs in order on one compute stream, behind
//! one mutex: sessions on several host threads share the device safely, and
//! the memory pool may hand a freed block to the next owner without waiting.

mod cublas;
mod kernels;
pub mod memory;
pub mod runtime;

use std::collections::HashMap;
use std::ffi::c_int;
use std::sync::{Arc, Mutex, MutexGuard};

use super::{AttentionShape, Backend, Glu, Rope, RopeMode, SeqPos};
use crate::error::{Error, Result};
use crate::gguf::GgufFile;
use crate::model::Weight;
use crate::quant::GgmlType;
use kernels::*;
use memory::{human, Arena};
pub use memory::{DeviceAllocator, DevicePtr, MemoryStats};
use runtime::{check, DeviceInfo, OwnedEvent, OwnedStream, PinnedBuffer};

/// Prefill matrix products of at least this many rows go through cuBLAS
/// (when present); fewer rows are a few passes of the matvec kernel.
const GEMM_MIN_ROWS: usize = 16;
/// Largest f32 band of a dequantized weight matrix fed to one GEMM.
const GEMM_BAND_BYTES: usize = 64 << 20;
/// Size of each of the two pinned staging buffers of the weight upload.
const UPLOAD_CHUNK: usize = 16 << 20;
/// Device memory a model leaves free for activations, KV caches and scratch
/// when it checks that its weights fit.
const HEADROOM: usize = 256 << 20;

/// Whether a CUDA device can be used: the default device is the first GPU
/// when there is one.
pub fn device_count() -> usize {
    runtime::device_count().unwrap_or(0)
}

/// What a host asks of the backend.
#[derive(Clone, Copy, Debug)]
pub struct CudaOptions {
    /// Large matrix products through cuBLAS when it can be loaded.
    pub use_cublas: bool,
}

pub struct CudaBackend {
    info: DeviceInfo,
    allocator: Arc<DeviceAllocator>,
    /// The file's whole data section, as in the file.
    weights: DevicePtr<u8>,
    /// One-row weights (norms, biases, RoPE factors) as f32, by data offset.
    vectors: HashMap<usize, DevicePtr<f32>>,
    state: Mutex<State>,
}

/// What one operation at a time uses.
/// Fields drop in order: the cuBLAS handle bound to the stream goes first,
/// the stream last.
struct State {
    cublas: Option<cublas::Cublas>,
    arena: Arena,
    /// The row table of the rows RoPE was last given (positions only).
    positions: RowTable,
    /// The row table of the rows the KV kernels were last given.
    cache_rows: RowTable,
    stream: OwnedStream,
}

impl State {
    /// Copies a list of indices (token ids, row numbers) into this
    /// operation's scratch.
    fn upload_indices(
        &mut self,
        allocator: &Arc<DeviceAllocator>,
        ids: &[c_int],
    ) -> Result<*const c_int> {
        let bytes = std::mem::size_of_val(ids);
        self.arena.begin(allocator, Arena::footprint(&[bytes]))?;
        let device_ids = self.arena.take::<c_int>(ids.len());
        // SAFETY: the arena piece holds ids.len() ints; the host slice is
        // staged before the call returns.
        unsafe {
            runtime::copy_to_device(
                device_ids.cast(),
                ids.as_ptr().cast(),
                bytes,
                self.stream.raw(),
            )?
        };
        Ok(device_ids)
    }
}

/// A host table of batch rows and its device copy, uploaded again only when
/// the rows change (every layer of a forward pass uses the same rows).
struct RowTable {
    host: Vec<DeviceRow>,
    device: Option<DevicePtr<DeviceRow>>,
}

impl RowTable {
    fn new() -> RowTable {
        RowTable {
            host: Vec::new(),
            device: None,
        }
    }

    fn upload(
        &mut self,
        allocator: &Arc<DeviceAllocator>,
        rows: Vec<DeviceRow>,
        stream: runtime::Stream,
    ) -> Result<*const DeviceRow> {
        if self.device.is_none() || rows != self.host {
            let mut device = allocator.alloc::<DeviceRow>(rows.len())?;
            // SAFETY: `device` holds rows.len() entries; the host vector is
            // staged before the call returns.
            unsafe {
                runtime::copy_to_device(
                    device.as_mut_ptr().cast(),
                    rows.as_ptr().cast(),
                    std::mem::size_of_val(rows.as_slice()),
                    stream,
                )?
            };
            self.device = Some(device);
            self.host = rows;
        }
        Ok(self.device.as_ref().expect("uploaded above").as_ptr())
    }
}

/// One sequence's keys and values in device memory, f16.
pub struct CudaKvCache {
    keys: DevicePtr<u16>,
    values: DevicePtr<u16>,
    n_ctx: usize,
    k_width: usize,
    v_width: usize,
}

/// A batch's activations: `len` f32 in device memory.
pub type DeviceBuffer = DevicePtr<f32>;

fn dim(v: usize, what: &str) -> Result<c_int> {
    c_int::try_from(v)
        .map_err(|_| Error::unsupported(format!("{what} of {v} is too large for the CUDA kernels")))
}

impl CudaBackend {
    /// Uploads the weights of `file` to CUDA device `index`.
    pub fn new(file: Arc<GgufFile>, index: usize, options: CudaOptions) -> Result<CudaBackend> {
        let info = runtime::device_info(index)?;
        let data = file
            .data()
            .ok_or_else(|| Error::internal("the CUDA backend needs the tensor data"))?
            .bytes();
        check_tensor_layouts(&file)?;
        let (free, total) = runtime::memory_info()?;
        if data.len() + HEADROOM > free {
            return Err(Error::out_of_memory(format!(
                "the model's weights need {} of device memory (plus {} for activations); {} has {} free of {}",
                human(data.len()),
                human(HEADROOM),
                info.name,
                human(free),
                human(total)
            )));
        }
        let allocator = DeviceAllocator::new(index);
        let stream = OwnedStream::new()?;
        let mut weights = allocator.alloc::<u8>(data.len())?;
        upload(data, &mut weights)?;

        let mut vectors = HashMap::new();
        for t in file.tensors() {
            if is_vector(t) {
                let n = t.n_elements() as usize;
                let mut v = allocator.alloc::<f32>(n)?;
                // SAFETY: the tensor's bytes lie inside the uploaded data
                // section (checked by the reader); `v` holds n values.
                check(
                    unsafe {
                        m40_vector_to_f32(
                            t.ggml_type.id() as c_int,
                            weights.as_ptr().add(t.offset as usize),
                            dim(n, "a vector length")?,
                            v.as_mut_ptr(),
                            stream.raw(),
                        )
                    },
                    || format!("converting tensor '{}'", t.name),
                )?;
                vectors.insert(t.offset as usize, v);
            }
        }
        runtime::synchronize(&stream)?;
        let cublas = if options.use_cublas {
            cublas::Cublas::new(stream.raw())?
        } else {
            None
        };
        Ok(CudaBackend {
            info,
            allocator,
            weights,
            vectors,
            state: Mutex::new(State {
                stream,
                arena: Arena::default(),
                cublas,
                positions: RowTable::new(),
                cache_rows: RowTable::new(),
            }),
        })
    }

    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    pub fn memory_stats(&self) -> MemoryStats {
        self.allocator.stats()
    }

    /// Bytes of device memory the weights take.
    pub fn weight_bytes(&self) -> usize {
        self.weights.len() + self.vectors.values().map(|v| v.len() * 4).sum::<usize>()
    }

    /// The cuBLAS library in use, if any.
    pub fn cublas_library(&self) -> Option<&'static str> {
        self.lock().cublas.as_ref().map(|c| c.library())
    }

    /// The state, with this device current for the calling thread.
    fn lock(&self) -> MutexGuard<'_, State> {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        // The device was usable at load; a failure here resurfaces as the
        // next operation's error.
        let _ = runtime::set_device(self.info.index);
        state
    }

    fn weight_ptr(&self, w: &Weight) -> *const u8 {
        debug_assert!(w.offset + w.n_bytes <= self.weights.len());
        // SAFETY: a located weight lies inside the data section.
        unsafe { self.weights.as_ptr().add(w.offset) }
    }

    fn vector(&self, w: &Weight) -> Result<*const f32> {
        self.vectors
            .get(&w.offset)
            .map(|v| v.as_ptr())
            .ok_or_else(|| Error::internal("a one-row weight was not converted at load"))
    }
}

/// Copies the data section to the device through two pinned buffers, so
/// that filling one overlaps the transfer of the other.
fn upload(data: &[u8], dst: &mut DevicePtr<u8>) -> Result<()> {
    let stream = OwnedStream::new()?;
    let mut staging = [
        PinnedBuffer::new(UPLOAD_CHUNK)?,
        PinnedBuffer::new(UPLOAD_CHUNK)?,
    ];
    let done = [OwnedEvent::new()?, OwnedEvent::new()?];
    for (i, chunk) in data.chunks(UPLOAD_CHUNK).enumerate() {
        let slot = i % 2;
        done[slot].wait()?;
        staging[slot].as_mut_slice()[..chunk.len()].copy_from_slice(chunk);
        // SAFETY: the destination range lies inside `dst`; the staging
        // buffer is not touched again until its event has fired.
        unsafe {
            runtime::copy_to_device(
                dst.as_mut_ptr().add(i * UPLOAD_CHUNK).cast(),
                staging[slot].as_ptr(),
                chunk.len(),
                stream.raw(),
            )?
        };
        done[slot].record(&stream)?;
    }
    runtime::synchronize(&stream)
}

/// One-row weights (norms, biases, RoPE factors), which the backend keeps as f32.
fn is_vector(t: &crate::gguf::TensorInfo) -> bool {
    t.dims.iter().skip(1).all(|&d| d == 1)
}

/// The kernels read matrices 16 values at a time with vector loads: every
/// matrix row must be a multiple of 32 values and float matrices 16-byte
/// aligned (GGUF's default alignment of 32 gives that).
fn check_tensor_layouts(file: &GgufFile) -> Result<()> {
    for t in file.tensors() {
        let ty = t.ggml_type;
        if !ty.is_supported() {
            continue;
        }
        if is_vector(t) {
            continue;
        }
        if t.dims[0] % 32 != 0 {
            return Err(Error::unsupported(format!(
                "tensor '{}' has rows of {} values; the CUDA backend needs a multiple of 32",
                t.name, t.dims[0]
            )));
        }
        let float = matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::Bf16);
        if float && t.offset % 16 != 0 {
            return Err(Error::unsupported(format!(
                "tensor '{}' is not 16-byte aligned in the file (general.alignment below 16)",
                t.name
            )));
        }
    }
    Ok(())
}

impl Backend for CudaBackend {
    type Buffer = DeviceBuffer;
    type KvCache = CudaKvCache;

    fn buffer(&self, len: usize) -> Result<DeviceBuffer> {
        let state = self.lock();
        let mut b = self.allocator.alloc::<f32>(len)?;
        // SAFETY: `b` holds len values.
        unsafe { runtime::zero(b.as_mut_ptr().cast(), len * 4, state.stream.raw())? };
        Ok(b)
    }

    fn read(&self, buffer: &DeviceBuffer, out: &mut [f32]) -> Result<()> {
        let state = self.lock();
        assert!(out.len() <= buffer.len());
        let bytes = out.len() * 4;
        // SAFETY: an f32 slice viewed as its bytes; the buffer holds them.
        let dst = unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr().cast::<u8>(), bytes) };
        unsafe { runtime::copy_to_host(dst, buffer.as_ptr().cast(), state.stream.raw()) }
    }

    fn write(&self, buffer: &mut DeviceBuffer, values: &[f32]) -> Result<()> {
        let state = self.lock();
        assert!(values.len() <= buffer.len());
        // SAFETY: the buffer holds the values; the host slice is staged
        // before the call returns.
        unsafe {
            runtime::copy_to_device(
                buffer.as_mut_ptr().cast(),
                values.as_ptr().cast(),
                values.len() * 4,
                state.stream.raw(),
            )
        }
    }

    fn kv_cache(
        &self,
        n_ctx: usize,
        n_layer: usize,
        k_width: usize,
        v_width: usize,
    ) -> Result<CudaKvCache> {
        let state = self.lock();
        let slots = n_ctx
            .checked_mul(n_layer)
            .ok_or_else(|| Error::out_of_memory("KV cache size overflows"))?;
        let sized = |w: usize| {
            slots
                .checked_mul(w)
                .ok_or_else(|| Error::out_of_memory("KV cache size overflows"))
        };
        let (nk, nv) = (sized(k_width)?, sized(v_width)?);
        let alloc = |n: usize| {
            self.allocator.alloc::<u16>(n).map_err(|e| {
                e.context(format!(
                    "KV cache of {n_ctx} positions ({} on {})",
                    human((nk + nv) * 2),
                    self.info.name
                ))
            })
        };
        let (mut keys, mut values) = (alloc(nk)?, alloc(nv)?);
        // Positions past a sequence's end are never read, but zeroed memory
        // keeps a stray read finite.
        // SAFETY: each holds its count of u16.
        unsafe {
            runtime::zero(keys.as_mut_ptr().cast(), nk * 2, state.stream.raw())?;
            runtime::zero(values.as_mut_ptr().cast(), nv * 2, state.stream.raw())?;
        }
        Ok(CudaKvCache {
            keys,
            values,
            n_ctx,
            k_width,
            v_width,
        })
    }

    fn embed(
        &self,
        table: &Weight,
        tokens: &[u32],
        scale: f32,
        out: &mut DeviceBuffer,
    ) -> Result<()> {
        let mut state = self.lock();
        let st = &mut *state;
        let ids: Vec<c_int> = tokens.iter().map(|&t| t as c_int).collect();
        let device_ids = st.upload_indices(&self.allocator, &ids)?;
        // SAFETY: `device_ids` holds the ids; `out` holds one row per token;
        // the table is a located weight.
        unsafe {
            check(
                m40_embed(
                    table.ty.id() as c_int,
                    self.weight_ptr(table),
                    dim(table.cols, "an embedding width")?,
                    device_ids,
                    dim(ids.len(), "a batch")?,
                    scale,
                    out.as_mut_ptr(),
                    st.stream.raw(),
                ),
                || "embedding lookup".to_string(),
            )
        }
    }

    fn matmul(
        &self,
        w: &Weight,
        x: &DeviceBuffer,
        rows: usize,
        out: &mut DeviceBuffer,
    ) -> Result<()> {
        let mut state = self.lock();
        let st = &mut *state;
        let stream = st.stream.raw();
        let (ty, w_rows, cols) = (
            w.ty.id() as c_int,
            dim(w.rows, "a matrix height")?,
            dim(w.cols, "a matrix width")?,
        );
        assert!(x.len() >= rows * w.cols && out.len() >= rows * w.rows);
        if let (Some(cublas), true) = (&st.cublas, rows >= GEMM_MIN_ROWS) {
            let band_rows = (GEMM_BAND_BYTES / (w.cols * 4)).clamp(1, w.rows);
            st.arena
                .begin(&self.allocator, Arena::footprint(&[band_rows * w.cols * 4]))?;
            let band = st.arena.take::<f32>(band_rows * w.cols);
            for first in (0..w.rows).step_by(band_rows) {
                let n = band_rows.min(w.rows - first);
                // SAFETY: rows first..first+n of the weight into the band
                // (n × cols); the product writes columns first..first+n of
                // `out`'s rows (row stride w.rows).
                unsafe {
                    check(
                        m40_dequantize_rows(
                            ty,
                            self.weight_ptr(w),
                            cols,
                            first as c_int,
                            n as c_int,
                            band,
                            stream,
                        ),
                        || format!("dequantizing a {} band", w.ty.name()),
                    )?;
                    cublas.gemm_xwt(
                        band,
                        n,
                        w.cols,
                        x.as_ptr(),
                        rows,
                        out.as_mut_ptr().add(first),
                        w.rows,
                    )?;
                }
            }
            return Ok(());
        }
        for first in (0..rows).step_by(MATVEC_MAX_ROWS) {
            let n = MATVEC_MAX_ROWS.min(rows - first);
            // SAFETY: rows first..first+n of x and of out, inside both buffers.
            unsafe {
                check(
                    m40_matvec(
                        ty,
                        self.weight_ptr(w),
                        w_rows,
                        cols,
                        x.as_ptr().add(first * w.cols),
                        n as c_int,
                        out.as_mut_ptr().add(first * w.rows),
                        stream,
                    ),
                    || format!("{} matrix × vector", w.ty.name()),
                )?;
            }
        }
        Ok(())
    }

    fn add_bias(&self, x: &mut DeviceBuffer, bias: &Weight, rows: usize) -> Result<()> {
        let state = self.lock();
        let b = self.vector(bias)?;
        let width = bias.cols * bias.rows;
        // SAFETY: x holds rows × width values; the bias width values.
        unsafe {
            check(
                m40_add(x.as_mut_ptr(), b, rows * width, width, state.stream.raw()),
                || "bias add".to_string(),
            )
        }
    }

    fn rms_norm(&self, x: &mut DeviceBuffer, weight: &Weight, eps: f32, len: usize) -> Result<()> {
        let state = self.lock();
        let w = self.vector(weight)?;
        let group = weight.cols * weight.rows;
        // SAFETY: x holds len values, a whole number of groups.
        unsafe {
            check(
                m40_rms_norm(
                    x.as_mut_ptr(),
                    w,
                    dim(group, "a norm width")?,
                    dim(len / group, "a row count")?,
                    eps,
                    state.stream.raw(),
                ),
                || "RMS norm".to_string(),
            )
        }
    }

    fn gather_rows(
        &self,
        src: &DeviceBuffer,
        width: usize,
        rows: &[usize],
        out: &mut DeviceBuffer,
    ) -> Result<()> {
        let mut state = self.lock();
        let st = &mut *state;
        if rows.is_empty() {
            return Ok(());
        }
        if rows.iter().enumerate().all(|(i, &r)| i == r) {
            // SAFETY: both hold rows.len() × width values.
            return unsafe {
                runtime::copy_on_device(
                    out.as_mut_ptr().cast(),
                    src.as_ptr().cast(),
                    rows.len() * width * 4,
                    st.stream.raw(),
                )
            };
        }
        let ids: Vec<c_int> = rows.iter().map(|&r| r as c_int).collect();
        let device_ids = st.upload_indices(&self.allocator, &ids)?;
        // SAFETY: `device_ids` holds the ids; src holds every named row.
        unsafe {
            check(
                m40_gather_rows(
                    src.as_ptr(),
                    dim(width, "a row width")?,
                    device_ids,
                    ids.len() as c_int,
                    out.as_mut_ptr(),
                    st.stream.raw(),
                ),
                || "row gather".to_string(),
            )
        }
    }

    fn add(&self, x: &mut DeviceBuffer, y: &DeviceBuffer, len: usize) -> Result<()> {
        let state = self.lock();
        // SAFETY: both hold len values.
        unsafe {
            check(
                m40_add(x.as_mut_ptr(), y.as_ptr(), len, len, state.stream.raw()),
                || "residual add".to_string(),
            )
        }
    }

    fn rope(
        &self,
        x: &mut DeviceBuffer,
        n_heads: usize,
        head_dim: usize,
        positions: &[SeqPos],
        rope: &Rope,
    ) -> Result<()> {
        let mut state = self.lock();
        let st = &mut *state;
        let table: Vec<DeviceRow> = positions
            .iter()
            .map(|p| {
                Ok(DeviceRow {
                    keys: 0,
                    values: 0,
                    pos: dim(p.pos, "a position")?,
                    n_ctx: 0,
                })
            })
            .collect::<Result<_>>()?;
        let rows = st
            .positions
            .upload(&self.allocator, table, st.stream.raw())?;
        let factors = match rope.freq_factors {
            Some(f) => self.vector(f)?,
            None => std::ptr::null(),
        };
        // SAFETY: x holds positions.len() × n_heads × head_dim values; the
        // row table one entry per row; factors dims/2 values when present.
        unsafe {
            check(
                m40_rope(
                    x.as_mut_ptr(),
                    positions.len() as c_int,
                    n_heads as c_int,
                    head_dim as c_int,
                    rows,
                    c_int::from(rope.mode == RopeMode::Neox),
                    rope.dims as c_int,
                    rope.freq_base,
                    rope.freq_scale,
                    factors,
                    st.stream.raw(),
                ),
                || "RoPE".to_string(),
            )
        }
    }

    fn glu(
        &self,
        glu: Glu,
        gate: &DeviceBuffer,
        up: &DeviceBuffer,
        len: usize,
        out: &mut DeviceBuffer,
    ) -> Result<()> {
        let state = self.lock();
        let act = match glu {
            Glu::Swiglu => GLU_SILU,
            Glu::Geglu => GLU_GELU_TANH,
        };
        // SAFETY: all three hold len values.
        unsafe {
            check(
                m40_glu(
                    act,
                    gate.as_ptr(),
                    up.as_ptr(),
                    len,
                    out.as_mut_ptr(),
                    state.stream.raw(),
                ),
                || "gated activation".to_string(),
            )
        }
    }

    fn store_kv(
        &self,
        caches: &mut [&mut CudaKvCache],
        layer: usize,
        k: &DeviceBuffer,
        v: &DeviceBuffer,
        rows: &[SeqPos],
    ) -> Result<()> {
        let Some(first) = rows.first() else {
            return Ok(());
        };
        let mut state = self.lock();
        let st = &mut *state;
        let (k_width, v_width) = (caches[first.seq].k_width, caches[first.seq].v_width);
        let table = device_rows(caches, rows)?;
        let device_rows = st
            .cache_rows
            .upload(&self.allocator, table, st.stream.raw())?;
        // SAFETY: k and v hold rows.len() rows of their widths; every row's
        // cache has room for its position (the session checked it).
        unsafe {
            check(
                m40_store_kv(
                    k.as_ptr(),
                    v.as_ptr(),
                    rows.len() as c_int,
                    k_width as c_int,
                    v_width as c_int,
                    device_rows,
                    layer as c_int,
                    st.stream.raw(),
                ),
                || "KV cache store".to_string(),
            )
        }
    }

    fn attention(
        &self,
        caches: &[&mut CudaKvCache],
        layer: usize,
        q: &DeviceBuffer,
        rows: &[SeqPos],
        shape: &AttentionShape,
        out: &mut DeviceBuffer,
    ) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        if shape.head_dim_k > ATTENTION_MAX_HEAD_DIM || shape.head_dim_v > ATTENTION_MAX_HEAD_DIM {
            return Err(Error::unsupported(format!(
                "heads of {} values; the CUDA attention kernel handles up to {ATTENTION_MAX_HEAD_DIM}",
                shape.head_dim_k.max(shape.head_dim_v)
            )));
        }
        let mut state = self.lock();
        let st = &mut *state;
        let table = device_rows(caches, rows)?;
        let device_rows = st
            .cache_rows
            .upload(&self.allocator, table, st.stream.raw())?;
        let longest = rows
            .iter()
            .map(|r| shape.window.map_or(r.pos + 1, |w| w.min(r.pos + 1)))
            .max()
            .unwrap_or(1);
        let n_splits = attention_splits(
            rows.len() * shape.n_head,
            longest,
            self.info.multiprocessors,
        );
        let partial_len = rows.len() * shape.n_head * n_splits * (shape.head_dim_v + 2);
        st.arena
            .begin(&self.allocator, Arena::footprint(&[partial_len * 4]))?;
        let partial = st.arena.take::<f32>(partial_len);
        // SAFETY: q and out hold rows.len() × n_head heads; the partials
        // piece is sized for the launch; the row table names live caches.
        unsafe {
            check(
                m40_attention(
                    q.as_ptr(),
                    rows.len() as c_int,
                    device_rows,
                    layer as c_int,
                    shape.n_head as c_int,
                    shape.n_head_kv as c_int,
                    shape.head_dim_k as c_int,
                    shape.head_dim_v as c_int,
                    shape
                        .window
                        .map_or(0, |w| w.min(i32::MAX as usize) as c_int),
                    shape.scale,
                    n_splits as c_int,
                    partial,
                    out.as_mut_ptr(),
                    st.stream.raw(),
                ),
                || "attention".to_string(),
            )
        }
    }
}

/// How many ranges each (row, head) splits its positions into: enough blocks
/// to fill the GPU twice over, but no range shorter than 64 positions.
fn attention_splits(row_heads: usize, longest: usize, multiprocessors: usize) -> usize {
    let wanted = (2 * multiprocessors).div_ceil(row_heads.max(1));
    wanted.clamp(1, longest.div_ceil(64).max(1))
}

fn device_rows(caches: &[&mut CudaKvCache], rows: &[SeqPos]) -> Result<Vec<DeviceRow>> {
    rows.iter()
        .map(|r| {
            let c = &caches[r.seq];
            Ok(DeviceRow {
                keys: c.keys.address(),
                values: c.values.address(),
                pos: dim(r.pos, "a position")?,
                n_ctx: dim(c.n_ctx, "a context length")?,
            })
        })
        .collect()
}
