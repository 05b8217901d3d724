//! The CUDA backend: the model's weights uploaded once in their GGUF layout,
//! activations in f32, an f16 KV cache per sequence, and the kernels of
//! `cuda/` (written for the Tesla M40, sm_52, and run on every newer GPU).
//!
//! All device work of a backend runs in order on one compute stream, behind
//! one mutex: sessions on several host threads share the device safely, and
//! the memory pool may hand a freed block to the next owner without waiting.
//! Decode steps are recorded once and replayed as CUDA graphs (`graph`).

mod cublas;
mod graph;
mod kernels;
pub mod memory;
mod options;
pub mod runtime;

use std::collections::HashMap;
use std::ffi::c_int;
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard};

use super::{
    fill_rows, fused, AttentionShape, AttentionStep, Backend, GatedFfn, Glu, Norm, Product, Rope,
    RopeMode, Scratch, SeqPos,
};
use crate::error::{Error, Result};
use crate::gguf::GgufFile;
use crate::json::JsonObject;
use crate::backend::Weight;
use crate::quant::GgmlType;
pub use graph::GraphStats;
use graph::{Capture, DecodeGraphs};
use kernels::*;
use memory::{human, Arena};
pub use memory::{DeviceAllocator, DevicePtr, MemoryStats};
pub use options::CudaOptions;
use runtime::{check, DeviceInfo, OwnedEvent, OwnedStream, PinnedBuffer};

/// Prefill matrix products of at least this many rows go through cuBLAS
/// (when present); fewer rows are a few passes of the decode kernel, or one
/// tensor-core product (see `tensor_core_products`).
const GEMM_MIN_ROWS: usize = 16;
/// Most rows a product takes on the quantized-weight tensor-core kernel
/// while cuBLAS is present: past them cuBLAS's f16 products win (see
/// docs/cuda-performance.md, steps 22 and 23).
const TENSOR_CORE_MAX_ROWS: usize = 64;
/// Largest f32 band of a dequantized weight matrix fed to one GEMM.
const GEMM_BAND_BYTES: usize = 64 << 20;
/// Bytes allocated past the weights (see `m40_gemv`'s staged reads).
const WEIGHT_TAIL: usize = 16;
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

pub struct CudaBackend {
    info: DeviceInfo,
    allocator: Arc<DeviceAllocator>,
    /// The file's whole data section, as in the file.
    weights: DevicePtr<u8>,
    /// One-row weights (norms, biases, RoPE factors) as f32, by data offset.
    vectors: HashMap<usize, DevicePtr<f32>>,
    /// Weight rows per warp of the one-session decode kernel (2 or 4, or 0:
    /// the format's own choice).
    gemv_rows_per_warp: c_int,
    /// Prefill products on f16 operands (GPUs with f16 tensor cores: Volta,
    /// sm_70, and newer, with cuBLAS 11 or newer); otherwise FP32.
    prefill_in_f16: bool,
    /// The model's matrix formats whose decode products take the integer
    /// path (8-bit activations, dp4a).
    integer_formats: Vec<GgmlType>,
    /// The model's matrix formats whose products of more rows than one
    /// decode launch takes run on f16 tensor cores straight from the
    /// quantized weights (sm_80+, `m40_mmq`).
    tensor_core_formats: Vec<GgmlType>,
    /// Whether cuBLAS takes the products of many rows.
    has_cublas: bool,
    /// Whether decode kernels overlap their predecessors (see CudaOptions).
    overlap_launches: bool,
    /// Whether decode steps are replayed from graphs (see CudaOptions).
    graph_decode: bool,
    graphs: Mutex<DecodeGraphs>,
    /// Taken exclusively while a step is recorded, and shared by the paths
    /// that may enqueue work from another thread meanwhile: forward passes
    /// not replayed (`run_step`), KV cache creation and the measurements. A
    /// recording captures whatever any thread enqueues on the stream, so
    /// hosts of this backend run forward passes through `run_step` (as
    /// sessions do), not through the `Backend` operations directly.
    capture_exclusion: RwLock<()>,
    bandwidth: std::sync::OnceLock<f64>,
    state: Mutex<State>,
}

/// One product of `CudaBackend::tensor_core_products_of`: out (rows ×
/// w.rows) = x · Wᵀ (+ bias), or out += that where `accumulate`.
struct TensorCoreProduct<'a> {
    w: &'a Weight,
    bias: Option<&'a Weight>,
    out: *mut f32,
    accumulate: bool,
}

/// What one operation at a time uses.
/// Fields drop in order: the cuBLAS handle bound to the stream goes first,
/// the stream last.
struct State {
    cublas: Option<cublas::Cublas>,
    arena: Arena,
    staging: Staging,
    /// Pinned host memory results are read back through: the device writes
    /// pinned memory at full link speed, where a copy into pageable memory
    /// went at 2.5 GB/s on the H100 machine (32 sessions' logits: 1.6 ms of
    /// a 7.5 ms 1B step).
    readback: PinnedBuffer,
    /// The row table of the rows RoPE was last given (positions only).
    positions: RowTable,
    /// The row table of the rows the KV kernels were last given.
    cache_rows: RowTable,
    /// Where the decode kernel quantizes its activation rows to 8 bits
    /// (`q8_bytes` for GEMV_MAX_X rows of the widest matrix), when products
    /// take the integer path.
    activations_q8: Option<DevicePtr<i8>>,
    /// The step being recorded into a graph, if any: its kernels read the
    /// step's inputs from the graph's own input block.
    capture: Option<Capture>,
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
    fn row_table(
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
}

#[derive(Clone, Copy)]
enum RowTableKind {
    Positions,
    CacheRows,
}

/// Pinned host memory that small uploads (token ids, row tables, host
/// values) are copied through: a copy from pageable memory would make the
/// host wait for the device, and the host must run ahead of the device for
/// the launches of a step to overlap its kernels. Pieces are handed out in
/// order and reused after the stream has been waited for.
struct Staging {
    buffer: PinnedBuffer,
    used: usize,
}

impl Staging {
    const INITIAL: usize = 1 << 20;

    fn new() -> Result<Staging> {
        Ok(Staging {
            buffer: PinnedBuffer::new(Self::INITIAL)?,
            used: 0,
        })
    }

    /// Enqueues a copy of `data` to `dst` on `stream`.
    ///
    /// # Safety
    /// `dst` is device memory of at least `data.len()` bytes.
    unsafe fn copy_to_device(
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
    fn reset(&mut self) {
        self.used = 0;
    }
}

/// The bytes of a slice of plain values.
fn as_bytes<T: Copy>(values: &[T]) -> &[u8] {
    // SAFETY: the slice's memory, read as bytes; T is Copy plain data.
    unsafe { std::slice::from_raw_parts(values.as_ptr().cast(), std::mem::size_of_val(values)) }
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
        // The decode kernel reads rows in 16-byte-aligned pieces, up to 15
        // bytes past the end of the last row.
        let mut weights = allocator.alloc::<u8>(data.len() + WEIGHT_TAIL)?;
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
        let prefill_in_f16 =
            info.compute_capability.0 >= 7 && cublas.as_ref().is_some_and(|c| c.has_f16_products());
        let matrices = || file.tensors().iter().filter(|t| !is_vector(t));
        let mut integer_formats = Vec::new();
        if options.integer_products {
            for t in matrices() {
                if !integer_formats.contains(&t.ggml_type) && integer_path(t.ggml_type) {
                    integer_formats.push(t.ggml_type);
                }
            }
        }
        let mut tensor_core_formats = Vec::new();
        for t in matrices() {
            // SAFETY: queries and sets the current device's kernel attributes.
            if !tensor_core_formats.contains(&t.ggml_type)
                && unsafe { m40_mmq_prepare(t.ggml_type.id() as c_int) } == 1
            {
                tensor_core_formats.push(t.ggml_type);
            }
        }
        let activations_q8 = if integer_formats.is_empty() {
            None
        } else {
            let widest = matrices().map(|t| t.dims[0] as usize).max().unwrap_or(0);
            Some(allocator.alloc::<i8>(q8_bytes(widest, GEMV_MAX_X))?)
        };
        // SAFETY: a query of the current device's kernel attributes.
        let overlap_launches = options.overlap_launches && unsafe { m40_launch_overlap() } == 1;
        let gemv_rows_per_warp = match options.gemv_rows_per_warp {
            None => 0,
            Some(2) => 2,
            Some(4) => 4,
            Some(n) => {
                return Err(Error::invalid_argument(format!(
                    "{n} weight rows per warp requested for the decode kernel; it takes 2 or 4"
                )))
            }
        };
        Ok(CudaBackend {
            info,
            allocator,
            weights,
            vectors,
            gemv_rows_per_warp,
            prefill_in_f16,
            integer_formats,
            tensor_core_formats,
            has_cublas: cublas.is_some(),
            overlap_launches,
            graph_decode: options.graph_decode,
            graphs: Mutex::new(DecodeGraphs::default()),
            capture_exclusion: RwLock::new(()),
            bandwidth: std::sync::OnceLock::new(),
            state: Mutex::new(State {
                stream,
                arena: Arena::default(),
                staging: Staging::new()?,
                readback: PinnedBuffer::new(Staging::INITIAL)?,
                cublas,
                positions: RowTable::new(),
                cache_rows: RowTable::new(),
                activations_q8,
                capture: None,
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
        self.weights.len() - WEIGHT_TAIL + self.vectors.values().map(|v| v.len() * 4).sum::<usize>()
    }

    /// Device memory bandwidth in GB/s (bytes read + bytes written per
    /// second by a device-to-device copy of 256 MiB, best of five), measured
    /// once on first use: the roofline decode speed is held against.
    pub fn memory_bandwidth_gbps(&self) -> Result<f64> {
        if let Some(&gbps) = self.bandwidth.get() {
            return Ok(gbps);
        }
        const BYTES: usize = 256 << 20;
        let _shared = self.no_capture();
        let state = self.lock();
        let (mut src, mut dst) = (
            self.allocator.alloc::<u8>(BYTES)?,
            self.allocator.alloc::<u8>(BYTES)?,
        );
        let (start, end) = (OwnedEvent::timed()?, OwnedEvent::timed()?);
        let mut best_ms = f32::INFINITY;
        // SAFETY: both blocks hold BYTES bytes.
        unsafe { runtime::zero(src.as_mut_ptr().cast(), BYTES, state.stream.raw())? };
        for round in 0..6 {
            start.record(&state.stream)?;
            // SAFETY: as above.
            unsafe {
                runtime::copy_on_device(
                    dst.as_mut_ptr().cast(),
                    src.as_ptr().cast(),
                    BYTES,
                    state.stream.raw(),
                )?
            };
            end.record(&state.stream)?;
            end.wait()?;
            // The first copy warms the clocks up.
            if round > 0 {
                best_ms = best_ms.min(end.elapsed_since(&start)?);
            }
        }
        let gbps = 2.0 * BYTES as f64 / (f64::from(best_ms) * 1e-3) / 1e9;
        drop((src, dst));
        // The two blocks are no use to the model: give them back to the driver.
        self.allocator.release_cache();
        Ok(*self.bandwidth.get_or_init(|| gbps))
    }

    /// Marks the device work enqueued so far, for timelines of the device's
    /// work that do not wait between operations (`benches/op_profile.rs`).
    pub fn record_event(&self, event: &OwnedEvent) -> Result<()> {
        let _shared = self.no_capture();
        event.record(&self.lock().stream)
    }

    /// Whether decode products of type `ty` run on 8-bit activations (dp4a).
    pub fn integer_products(&self, ty: GgmlType) -> bool {
        self.integer_formats.contains(&ty)
    }

    /// Whether a product of `rows` activation rows with a matrix of type
    /// `ty` runs on f16 tensor cores straight from the quantized weights
    /// (`m40_mmq`): more rows than one decode launch takes, and no more
    /// than cuBLAS would do faster.
    pub fn tensor_core_products(&self, ty: GgmlType, rows: usize) -> bool {
        rows > GEMV_MAX_X
            && (rows <= TENSOR_CORE_MAX_ROWS || !self.has_cublas)
            && self.tensor_core_formats.contains(&ty)
    }

    /// Whether decode kernels overlap their predecessors on this device.
    pub fn overlaps_launches(&self) -> bool {
        self.overlap_launches
    }

    /// The cuBLAS library in use, if any.
    pub fn cublas_library(&self) -> Option<&'static str> {
        self.lock().cublas.as_ref().map(|c| c.library())
    }

    /// The device and its memory as the backend uses it, for
    /// `m40_model_describe`.
    pub(crate) fn describe(&self, j: &mut JsonObject) {
        let info = self.info();
        let (major, minor) = info.compute_capability;
        j.string("compute_capability", Some(&format!("{major}.{minor}")))
            .value("multiprocessors", info.multiprocessors)
            .value("driver_version", info.driver_version)
            .string("cublas", self.cublas_library());
        if let Ok(gbps) = self.memory_bandwidth_gbps() {
            j.value("memory_bandwidth_gbps", format_args!("{gbps:.1}"));
        }
        let m = self.memory_stats();
        let mut memory = JsonObject::new();
        memory
            .value("total", info.total_memory)
            .value("weights", self.weight_bytes())
            .value("in_use", m.in_use)
            .value("peak", m.peak)
            .value("cached", m.cached)
            .value("cache_hits", m.cache_hits)
            .value("device_allocations", m.device_allocations);
        j.value("device_memory", memory.finish());
    }

    /// Keeps steps from being recorded while the caller enqueues work.
    fn no_capture(&self) -> RwLockReadGuard<'_, ()> {
        self.capture_exclusion
            .read()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// The state, with this device current for the calling thread.
    fn lock(&self) -> MutexGuard<'_, State> {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        // The device was usable at load; a failure here resurfaces as the
        // next operation's error.
        let _ = runtime::ensure_device(self.info.index);
        state
    }

    /// How attention over `rows` is launched.
    fn attention_launch(&self, rows: &[SeqPos], shape: &AttentionShape) -> AttentionLaunch {
        let longest = rows
            .iter()
            .map(|r| shape.window.map_or(r.pos + 1, |w| w.min(r.pos + 1)))
            .max()
            .unwrap_or(1);
        let sms = self.info.multiprocessors;
        let multiple_of_8 = heads_of_multiples_of_8(shape);
        let tiled = multiple_of_8 && is_prompt_chunk(rows);
        let splits = if tiled {
            let tile_rows = if shape.head_dim_k.max(shape.head_dim_v) > 128 {
                16
            } else {
                32
            };
            block_attention_splits(rows.len().div_ceil(tile_rows) * shape.n_head, longest, sms)
        } else if multiple_of_8 {
            block_attention_splits(rows.len() * shape.n_head, longest, sms)
        } else {
            attention_splits(rows.len() * shape.n_head, longest, sms)
        };
        let four_heads = multiple_of_8
            && !tiled
            && splits == 1
            && four_heads_a_block(rows.len(), shape.n_head, longest, sms);
        AttentionLaunch {
            tiled,
            splits,
            heads_per_block: if four_heads { 4 } else { 1 },
        }
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

impl CudaBackend {
    /// out (rows × w.rows) = x · Wᵀ: the decode kernel for a few rows,
    /// cuBLAS for many.
    ///
    /// # Safety
    /// x holds rows × w.cols values and out rows × w.rows, in device memory.
    unsafe fn matmul_locked(
        &self,
        st: &mut State,
        w: &Weight,
        x: *const f32,
        rows: usize,
        out: *mut f32,
    ) -> Result<()> {
        if self.tensor_core_products(w.ty, rows) {
            let product = TensorCoreProduct {
                w,
                bias: None,
                out,
                accumulate: false,
            };
            // SAFETY: as the caller promises.
            return unsafe { self.tensor_core_products_of(st, x, rows, None, &[product]) };
        }
        if let (Some(cublas), true) = (&st.cublas, rows >= GEMM_MIN_ROWS) {
            let gemm = Gemm {
                cublas,
                stream: st.stream.raw(),
                x,
                rows,
                out,
            };
            // SAFETY: as the caller promises.
            return unsafe {
                // F32 and BF16 values may lie outside f16's range.
                let f16_weights = !matches!(w.ty, GgmlType::F32 | GgmlType::Bf16);
                if f16_weights && self.prefill_in_f16 {
                    self.gemm_f16(&mut st.arena, w, gemm)
                } else {
                    self.gemm_f32(&mut st.arena, w, gemm)
                }
            };
        }
        let matrix = self.gemv_matrix(w, None, out)?;
        // SAFETY: as the caller promises.
        unsafe {
            self.gemv(
                st,
                w,
                x,
                rows,
                &[matrix],
                GemvEpilogue::Store,
                None,
                false,
                &AttentionInputs::NONE,
            )
        }
    }

    /// A prefill product in FP32 (TF32 tensor cores on Ampere and newer):
    /// F32 weights as they are, other types dequantized to f32 a band of
    /// rows at a time.
    ///
    /// # Safety
    /// As `matmul_locked`.
    unsafe fn gemm_f32(&self, arena: &mut Arena, w: &Weight, g: Gemm) -> Result<()> {
        if w.ty == GgmlType::F32 {
            // SAFETY: an F32 matrix is rows × cols f32 in the data section.
            return unsafe {
                g.cublas.gemm_xwt(
                    self.weight_ptr(w).cast(),
                    w.rows,
                    w.cols,
                    g.x,
                    g.rows,
                    g.out,
                    w.rows,
                )
            };
        }
        let (ty, cols) = (w.ty.id() as c_int, dim(w.cols, "a matrix width")?);
        let band_rows = (GEMM_BAND_BYTES / (w.cols * 4)).clamp(1, w.rows);
        arena.begin(&self.allocator, Arena::footprint(&[band_rows * w.cols * 4]))?;
        let band = arena.take::<f32>(band_rows * w.cols);
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
                        g.stream,
                    ),
                    || format!("dequantizing a {} band", w.ty.name()),
                )?;
                g.cublas
                    .gemm_xwt(band, n, w.cols, g.x, g.rows, g.out.add(first), w.rows)?;
            }
        }
        Ok(())
    }

    /// A prefill product on f16 operands with FP32 sums (tensor cores):
    /// F16 weights as they are, quantized types dequantized to f16 a band at a
    /// time, activation rows converted once with a power-of-two scale each
    /// (see `m40_rows_to_f16`) that the output rows get back at the end.
    /// The rounding is TF32's (10-bit mantissas); the range is f16's, which
    /// the row scales take care of for activations.
    ///
    /// # Safety
    /// As `matmul_locked`.
    unsafe fn gemm_f16(&self, arena: &mut Arena, w: &Weight, g: Gemm) -> Result<()> {
        let (ty, cols) = (w.ty.id() as c_int, dim(w.cols, "a matrix width")?);
        let n_rows = dim(g.rows, "a row count")?;
        let direct = w.ty == GgmlType::F16;
        let band_rows = if direct {
            w.rows
        } else {
            (GEMM_BAND_BYTES / (w.cols * 2)).clamp(1, w.rows)
        };
        let band_bytes = if direct { 0 } else { band_rows * w.cols * 2 };
        arena.begin(
            &self.allocator,
            Arena::footprint(&[g.rows * w.cols * 2, g.rows * 4, band_bytes]),
        )?;
        let (x16, scales) = (
            arena.take::<u16>(g.rows * w.cols),
            arena.take::<f32>(g.rows),
        );
        let band = if direct {
            std::ptr::null_mut()
        } else {
            arena.take::<u16>(band_rows * w.cols)
        };
        // SAFETY: x holds rows × cols values; x16 and scales were sized for them.
        check(
            unsafe { m40_rows_to_f16(g.x, n_rows, cols, x16, scales, g.stream) },
            || "activation rows to f16".to_string(),
        )?;
        for first in (0..w.rows).step_by(band_rows) {
            let n = band_rows.min(w.rows - first);
            // SAFETY: as in gemm_f32, with f16 bands; an F16 matrix is its
            // own band (rows × cols f16 in the data section).
            unsafe {
                let rows_f16: *const u16 = if direct {
                    self.weight_ptr(w).cast::<u16>().add(first * w.cols)
                } else {
                    check(
                        m40_dequantize_rows_f16(
                            ty,
                            self.weight_ptr(w),
                            cols,
                            first as c_int,
                            n as c_int,
                            band,
                            g.stream,
                        ),
                        || format!("dequantizing a {} band to f16", w.ty.name()),
                    )?;
                    band
                };
                g.cublas.gemm_xwt_f16(
                    rows_f16,
                    n,
                    w.cols,
                    x16,
                    g.rows,
                    g.out.add(first),
                    w.rows,
                )?;
            }
        }
        // SAFETY: out holds rows × w.rows values; scales one per row.
        check(
            unsafe {
                m40_scale_rows(
                    g.out,
                    n_rows,
                    dim(w.rows, "a matrix height")?,
                    scales,
                    g.stream,
                )
            },
            || "restoring row scales".to_string(),
        )
    }

    /// Products of the same `rows` activation rows x, or norm(x) where a
    /// norm is given, with several matrices on f16 tensor cores
    /// (`tensor_core_products`): x is normalized and converted to f16 once
    /// for all of them.
    ///
    /// # Safety
    /// x holds rows × cols values (every matrix's width) and each product's
    /// out rows × w.rows, in device memory; a bias holds w.rows values.
    unsafe fn tensor_core_products_of(
        &self,
        st: &mut State,
        x: *const f32,
        rows: usize,
        norm: Option<Norm>,
        products: &[TensorCoreProduct],
    ) -> Result<()> {
        let Some(first) = products.first() else {
            return Ok(());
        };
        let cols = dim(first.w.cols, "a matrix width")?;
        let n_x = dim(rows, "a row count")?;
        let sm_count = dim(self.info.multiprocessors, "a multiprocessor count")?;
        let mut splits = Vec::with_capacity(products.len());
        let mut pieces = vec![rows * first.w.cols * 2, rows * 4];
        for p in products {
            assert_eq!(
                p.w.cols, first.w.cols,
                "tensor-core products share their input"
            );
            let ty = p.w.ty.id() as c_int;
            // SAFETY: arithmetic on the kernel's occupancy, found when the
            // backend was created.
            let n = unsafe {
                m40_mmq_splits(ty, dim(p.w.rows, "a matrix height")?, cols, n_x, sm_count)
            };
            if n < 1 {
                return Err(Error::internal(format!(
                    "no tensor-core product of {} weights on this device",
                    p.w.ty.name()
                )));
            }
            if n > 1 {
                pieces.push(n as usize * rows * p.w.rows * 4);
            }
            splits.push(n);
        }
        st.arena.begin(&self.allocator, Arena::footprint(&pieces))?;
        let (x_f16, x_scales) = (
            st.arena.take::<u16>(rows * first.w.cols),
            st.arena.take::<f32>(rows),
        );
        let overlap = c_int::from(self.overlap_launches);
        let (norm_weights, eps) = match norm {
            Some(n) => {
                assert_eq!(n.weight.cols * n.weight.rows, first.w.cols);
                (self.vector(n.weight)?, n.eps)
            }
            None => (std::ptr::null(), 0.0),
        };
        // SAFETY: x holds rows × cols values, a norm cols weights; x_f16 and
        // x_scales were sized for them above.
        check(
            unsafe {
                m40_mmq_activations(
                    overlap,
                    x,
                    norm_weights,
                    eps,
                    n_x,
                    cols,
                    x_f16,
                    x_scales,
                    st.stream.raw(),
                )
            },
            || "activation rows to f16 for tensor cores".to_string(),
        )?;
        for (p, &splits) in products.iter().zip(&splits) {
            let partials = if splits > 1 {
                st.arena.take::<f32>(splits as usize * rows * p.w.rows)
            } else {
                std::ptr::null_mut()
            };
            let launch = MmqLaunch {
                w: self.weight_ptr(p.w),
                rows: dim(p.w.rows, "a matrix height")?,
                cols,
                x_f16,
                x_scales,
                n_x,
                bias: match p.bias {
                    Some(b) => {
                        assert_eq!(b.cols * b.rows, p.w.rows);
                        self.vector(b)?
                    }
                    None => std::ptr::null(),
                },
                y: p.out,
                accumulate: c_int::from(p.accumulate),
                splits,
                partials,
                overlap,
            };
            // SAFETY: x_f16 holds the converted rows, out rows × w.rows
            // values (as the caller promises); the partials were sized
            // above; the struct is read before the call returns.
            check(
                unsafe { m40_mmq(p.w.ty.id() as c_int, &launch, st.stream.raw()) },
                || format!("{} matrix × {rows} rows on tensor cores", p.w.ty.name()),
            )?;
        }
        Ok(())
    }

    fn gemv_matrix(&self, w: &Weight, bias: Option<&Weight>, y: *mut f32) -> Result<GemvMatrix> {
        Ok(GemvMatrix {
            w: self.weight_ptr(w),
            bias: match bias {
                Some(b) => self.vector(b)?,
                None => std::ptr::null(),
            },
            y,
            rows: dim(w.rows, "a matrix height")?,
            role: ProjectionRole::Plain,
        })
    }

    /// The decode kernel: `matrices` (all of `like`'s type and width) times
    /// `n_x` rows of x, GEMV_MAX_X rows per launch, each launch normalizing
    /// its rows first when `norm` (weights, eps) is given. `input_quantized`:
    /// the previous launch of the same step took the integer path with the
    /// same x and norm, so the 8-bit scratch already holds them.
    /// `attention`: where matrices with a query, key or value role put their
    /// results (its row table has a row per x row), or `NONE`.
    ///
    /// # Safety
    /// x holds n_x × like.cols values; each matrix's y holds n_x of its rows
    /// (for GLU epilogues: matrix 0's); a norm's weights hold like.cols values;
    /// the attention inputs name live caches with room for their rows.
    #[allow(clippy::too_many_arguments)]
    unsafe fn gemv(
        &self,
        st: &State,
        like: &Weight,
        x: *const f32,
        n_x: usize,
        matrices: &[GemvMatrix],
        epilogue: GemvEpilogue,
        norm: Option<(*const f32, f32)>,
        input_quantized: bool,
        attention: &AttentionInputs,
    ) -> Result<()> {
        // The scratch holds one launch's rows.
        assert!(!input_quantized || n_x <= GEMV_MAX_X);
        for first in (0..n_x).step_by(GEMV_MAX_X) {
            let mut m = [GemvMatrix::NONE; 3];
            for (slot, matrix) in m.iter_mut().zip(matrices) {
                *slot = GemvMatrix {
                    // SAFETY: row `first` of the matrix's output.
                    y: unsafe { matrix.y.add(first * matrix.rows as usize) },
                    ..*matrix
                };
            }
            let launch = GemvLaunch {
                m,
                n_matrices: matrices.len() as c_int,
                cols: dim(like.cols, "a matrix width")?,
                // SAFETY: row `first` of x.
                x: unsafe { x.add(first * like.cols) },
                n_x: GEMV_MAX_X.min(n_x - first) as c_int,
                epilogue,
                norm: norm.map_or(std::ptr::null(), |n| n.0),
                eps: norm.map_or(0.0, |n| n.1),
                sm_count: self.info.multiprocessors as c_int,
                // The scratch is device memory that only kernels on this
                // state's stream touch, one launch after another.
                x_q8: st
                    .activations_q8
                    .as_ref()
                    .map_or(std::ptr::null_mut(), |q| q.as_ptr().cast_mut()),
                x_quantized: c_int::from(input_quantized),
                overlap: c_int::from(self.overlap_launches),
                attention: AttentionInputs {
                    rows: if attention.rows.is_null() {
                        attention.rows
                    } else {
                        // SAFETY: the table has a row per x row.
                        unsafe { attention.rows.add(first) }
                    },
                    ..*attention
                },
            };
            // SAFETY: the launch names live device memory (see above); the
            // struct is read before the call returns.
            check(
                unsafe {
                    m40_gemv(
                        like.ty.id() as c_int,
                        &launch,
                        self.gemv_rows_per_warp,
                        st.stream.raw(),
                    )
                },
                || format!("{} matrix × vector", like.ty.name()),
            )?;
        }
        Ok(())
    }

    /// One layer's attention-input parameters for the step's rows, their
    /// cache rows uploaded.
    fn attention_input_params(
        &self,
        st: &mut State,
        caches: &[&mut CudaKvCache],
        step: AttentionStep,
    ) -> Result<AttentionInputs> {
        let table = device_rows(caches, step.rows)?;
        let device_rows = st.row_table(&self.allocator, RowTableKind::CacheRows, table)?;
        let vector_or_null = |w: Option<&Weight>| match w {
            Some(w) => self.vector(w),
            None => Ok(std::ptr::null()),
        };
        Ok(AttentionInputs {
            rows: device_rows,
            q_norm: vector_or_null(step.qk_norm.map(|(qn, _)| qn.weight))?,
            k_norm: vector_or_null(step.qk_norm.map(|(_, kn)| kn.weight))?,
            factors: vector_or_null(step.rope.freq_factors)?,
            freq_base: f64::from(step.rope.freq_base),
            freq_scale: f64::from(step.rope.freq_scale),
            inv_freq_ratio: f64::from(step.rope.freq_base).powf(-2.0 / step.rope.dims as f64),
            eps: step.qk_norm.map_or(0.0, |(qn, _)| qn.eps),
            layer: step.layer as c_int,
            n_head: step.heads.n_head as c_int,
            n_head_kv: step.heads.n_head_kv as c_int,
            head_dim_k: step.heads.head_dim_k as c_int,
            head_dim_v: step.heads.head_dim_v as c_int,
            neox: c_int::from(step.rope.mode == RopeMode::Neox),
            rope_dims: step.rope.dims as c_int,
            overlap: c_int::from(self.overlap_launches),
        })
    }

    /// norm(x) times each product on the decode kernel (at most GEMV_MAX_X
    /// rows). With `attention`, the products are a layer's queries, keys
    /// and values, and their epilogue does the attention-input step: RoPE,
    /// then the keys and values into the caches (`attention` says where).
    #[allow(clippy::too_many_arguments)]
    fn decode_products(
        &self,
        st: &State,
        x: &DeviceBuffer,
        norm: Norm,
        rows: usize,
        normed: &mut DeviceBuffer,
        products: &mut [Product<DeviceBuffer>],
        attention: Option<&AttentionInputs>,
    ) -> Result<()> {
        assert!(rows <= GEMV_MAX_X && (attention.is_none() || products.len() == 3));
        let roles = [
            ProjectionRole::Queries,
            ProjectionRole::Keys,
            ProjectionRole::Values,
        ];
        let (input, fused_norm) = self.normalized_input(st, x, norm, rows, normed)?;
        // Consecutive products of one type share a launch (Q, K and V usually
        // do); x is quantized for the first launch on the integer path.
        let mut quantized = false;
        let mut first = 0;
        while first < products.len() {
            let ty = products[first].w.ty;
            let n = products[first..]
                .iter()
                .take(3)
                .take_while(|p| p.w.ty == ty)
                .count();
            let mut matrices = [GemvMatrix::NONE; 3];
            for (i, m) in (first..first + n).zip(matrices.iter_mut()) {
                let p = &mut products[i];
                *m = GemvMatrix {
                    role: attention.map_or(ProjectionRole::Plain, |_| roles[i]),
                    ..self.gemv_matrix(p.w, p.bias, p.out.as_mut_ptr())?
                };
            }
            let integer = self.integer_products(ty);
            // SAFETY: the caller checked the sizes; the norm only where it
            // fits; the attention inputs are the caller's.
            unsafe {
                self.gemv(
                    st,
                    products[first].w,
                    input,
                    rows,
                    &matrices[..n],
                    GemvEpilogue::Store,
                    fused_norm,
                    quantized && integer,
                    attention.unwrap_or(&AttentionInputs::NONE),
                )?
            };
            quantized |= integer;
            first += n;
        }
        Ok(())
    }

    /// out = x / rms(x) · weight for `n_groups` groups of the weight's width.
    ///
    /// # Safety
    /// x and out hold n_groups groups (they may be the same memory).
    unsafe fn rms_norm_into(
        &self,
        st: &State,
        x: *const f32,
        weight: &Weight,
        eps: f32,
        n_groups: usize,
        out: *mut f32,
    ) -> Result<()> {
        let group = weight.cols * weight.rows;
        check(
            // SAFETY: as the caller promises.
            unsafe {
                m40_rms_norm(
                    x,
                    self.vector(weight)?,
                    dim(group, "a norm width")?,
                    dim(n_groups, "a row count")?,
                    eps,
                    out,
                    st.stream.raw(),
                )
            },
            || "RMS norm".to_string(),
        )
    }

    /// The input of a fused step's products: x itself when the decode kernel
    /// normalizes it (the returned norm), else norm(x) written to `normed`.
    fn normalized_input(
        &self,
        st: &State,
        x: &DeviceBuffer,
        norm: Norm,
        rows: usize,
        normed: &mut DeviceBuffer,
    ) -> Result<(*const f32, Option<(*const f32, f32)>)> {
        let width = norm.weight.cols * norm.weight.rows;
        assert!(x.len() >= rows * width);
        if fuses_norm(rows) {
            return Ok((x.as_ptr(), Some((self.vector(norm.weight)?, norm.eps))));
        }
        assert!(normed.len() >= rows * width);
        // SAFETY: both hold rows × width values.
        unsafe {
            self.rms_norm_into(
                st,
                x.as_ptr(),
                norm.weight,
                norm.eps,
                rows,
                normed.as_mut_ptr(),
            )?
        };
        Ok((normed.as_ptr(), None))
    }

    /// x[r] += bias for `rows` rows.
    ///
    /// # Safety
    /// x is device memory of rows × the bias's width values.
    unsafe fn add_bias_locked(
        &self,
        st: &State,
        x: *mut f32,
        bias: &Weight,
        rows: usize,
    ) -> Result<()> {
        let width = bias.cols * bias.rows;
        // SAFETY: as the caller promises.
        check(
            unsafe { m40_add(x, self.vector(bias)?, rows * width, width, st.stream.raw()) },
            || "bias add".to_string(),
        )
    }
}

/// One prefill product's operands: out (rows × the weight's rows) = x · Wᵀ
/// on the backend's stream.
struct Gemm<'a> {
    cublas: &'a cublas::Cublas,
    stream: runtime::Stream,
    x: *const f32,
    rows: usize,
    out: *mut f32,
}

/// Whether the decode kernel normalizes `rows` activation rows itself
/// (decode batches; more rows are normalized in the tensor cores' f16
/// conversion, or first where cuBLAS multiplies them).
fn fuses_norm(rows: usize) -> bool {
    rows <= GEMV_MAX_X
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

/// Whether the decode kernel has an integer path for `ty` that runs dp4a on
/// the current device.
fn integer_path(ty: GgmlType) -> bool {
    // SAFETY: a query of the current device's kernel attributes.
    unsafe { m40_gemv_integer_path(ty.id() as c_int) == 1 }
}

/// One-row weights (norms, biases, RoPE factors), which the backend keeps as f32.
fn is_vector(t: &crate::gguf::TensorInfo) -> bool {
    t.dims.iter().skip(1).all(|&d| d == 1)
}

/// The kernels read matrices with vector loads: every matrix row must be a
/// multiple of 32 values and every matrix 16-byte aligned (GGUF's default
/// alignment of 32 gives that).
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
        // Float rows are read with 16-byte loads, quantized rows in
        // 16-byte-aligned pieces whose blocks keep their alignment.
        if t.offset % 16 != 0 {
            return Err(Error::unsupported(format!(
                "tensor '{}' is not 16-byte aligned in the file (general.alignment below 16)",
                t.name
            )));
        }
    }
    Ok(())
}

/// The first `len` values of `buffer`, copied into the backend's pinned
/// buffer (grown to the largest read): a copy into pageable memory ran at a
/// fraction of the link's speed (docs/cuda-performance.md, step 17). Waits
/// for the stream, so the step's staging pieces are free again.
fn read_to_pinned<'a>(st: &'a mut State, buffer: &DeviceBuffer, len: usize) -> Result<&'a [f32]> {
    assert!(len <= buffer.len());
    let bytes = len * 4;
    if st.readback.capacity() < bytes {
        st.readback = PinnedBuffer::new(bytes.next_power_of_two())?;
    }
    let pinned = &mut st.readback.as_mut_slice()[..bytes];
    // SAFETY: the buffer holds `bytes` bytes; the copy waits for the stream.
    unsafe { runtime::copy_to_host(pinned, buffer.as_ptr().cast(), st.stream.raw())? };
    st.staging.reset();
    Ok(st.readback.as_f32_slice(len))
}

impl Backend for CudaBackend {
    type Buffer = DeviceBuffer;
    type KvCache = CudaKvCache;

    fn buffer(&self, len: usize) -> Result<DeviceBuffer> {
        self.allocator.alloc::<f32>(len)
    }

    fn read(&self, buffer: &DeviceBuffer, out: &mut [f32]) -> Result<()> {
        let mut state = self.lock();
        out.copy_from_slice(read_to_pinned(&mut state, buffer, out.len())?);
        Ok(())
    }

    fn read_rows(
        &self,
        buffer: &DeviceBuffer,
        row_len: usize,
        rows: &mut [&mut Vec<f32>],
    ) -> Result<()> {
        let mut state = self.lock();
        let pinned = read_to_pinned(&mut state, buffer, row_len * rows.len())?;
        fill_rows(pinned, row_len, rows);
        Ok(())
    }

    fn write(&self, buffer: &mut DeviceBuffer, values: &[f32]) -> Result<()> {
        let mut state = self.lock();
        let st = &mut *state;
        assert!(values.len() <= buffer.len());
        // SAFETY: the buffer holds the values.
        unsafe {
            st.staging
                .copy_to_device(buffer.as_mut_ptr().cast(), as_bytes(values), &st.stream)
        }
    }

    fn kv_cache(
        &self,
        n_ctx: usize,
        n_layer: usize,
        k_width: usize,
        v_width: usize,
    ) -> Result<CudaKvCache> {
        let _shared = self.no_capture();
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
        let device_ids = match &st.capture {
            Some(capture) => capture.inputs.token_ids(ids.len())?,
            None => st.upload_indices(&self.allocator, &ids)?,
        };
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
        assert!(x.len() >= rows * w.cols && out.len() >= rows * w.rows);
        let mut state = self.lock();
        // SAFETY: sizes checked above.
        unsafe { self.matmul_locked(&mut state, w, x.as_ptr(), rows, out.as_mut_ptr()) }
    }

    fn add_bias(&self, x: &mut DeviceBuffer, bias: &Weight, rows: usize) -> Result<()> {
        let state = self.lock();
        assert!(x.len() >= rows * bias.cols * bias.rows);
        // SAFETY: size checked above.
        unsafe { self.add_bias_locked(&state, x.as_mut_ptr(), bias, rows) }
    }

    fn rms_norm(&self, x: &mut DeviceBuffer, weight: &Weight, eps: f32, len: usize) -> Result<()> {
        let state = self.lock();
        let group = weight.cols * weight.rows;
        let x = x.as_mut_ptr();
        // SAFETY: x holds len values, a whole number of groups; in place.
        unsafe { self.rms_norm_into(&state, x, weight, eps, len / group, x) }
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
        let rows = st.row_table(&self.allocator, RowTableKind::Positions, table)?;
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
        let device_rows = st.row_table(&self.allocator, RowTableKind::CacheRows, table)?;
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
        let device_rows = st.row_table(&self.allocator, RowTableKind::CacheRows, table)?;
        let launch = self.attention_launch(rows, shape);
        let n_splits = launch.splits;
        if let Some(capture) = &mut st.capture {
            // Layers of one shape share an entry: a replay checks each once.
            let entry = (*shape, launch);
            if !capture.attention.contains(&entry) {
                capture.attention.push(entry);
            }
        }
        // Those two kernels write the output directly over one range.
        let partial_len = if heads_of_multiples_of_8(shape) && n_splits == 1 {
            0
        } else {
            rows.len() * shape.n_head * n_splits * (shape.head_dim_v + 2)
        };
        st.arena
            .begin(&self.allocator, Arena::footprint(&[partial_len * 4]))?;
        let partial = st.arena.take::<f32>(partial_len);
        // SAFETY: q and out hold rows.len() × n_head heads; the partials
        // piece is sized for the launch; the row table names live caches
        // (for the tiled kernel, one sequence at consecutive positions).
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
                    c_int::from(launch.tiled),
                    n_splits as c_int,
                    launch.heads_per_block as c_int,
                    partial,
                    out.as_mut_ptr(),
                    c_int::from(self.overlap_launches),
                    st.stream.raw(),
                ),
                || "attention".to_string(),
            )
        }
    }

    fn norm_matmuls(
        &self,
        x: &DeviceBuffer,
        norm: Norm,
        rows: usize,
        normed: &mut DeviceBuffer,
        products: &mut [Product<DeviceBuffer>],
    ) -> Result<()> {
        let mut state = self.lock();
        let st = &mut *state;
        for p in products.iter() {
            assert!(
                p.w.cols == norm.weight.cols * norm.weight.rows && p.out.len() >= rows * p.w.rows
            );
        }
        assert!(x.len() >= rows * norm.weight.cols * norm.weight.rows);
        if rows > GEMV_MAX_X {
            let on_tensor_cores: Vec<TensorCoreProduct> = products
                .iter_mut()
                .filter(|p| self.tensor_core_products(p.w.ty, rows))
                .map(|p| TensorCoreProduct {
                    w: p.w,
                    bias: p.bias,
                    out: p.out.as_mut_ptr(),
                    accumulate: false,
                })
                .collect();
            if on_tensor_cores.len() == products.len() {
                // The norm goes into the f16 conversion.
                // SAFETY: x holds rows × the norm's width values (checked
                // above), each out rows × its w.rows, each bias its product's.
                return unsafe {
                    self.tensor_core_products_of(st, x.as_ptr(), rows, Some(norm), &on_tensor_cores)
                };
            }
            let (input, _) = self.normalized_input(st, x, norm, rows, normed)?;
            // SAFETY: as below; each bias is its product's.
            unsafe { self.tensor_core_products_of(st, input, rows, None, &on_tensor_cores)? };
            for p in products.iter_mut() {
                if self.tensor_core_products(p.w.ty, rows) {
                    continue;
                }
                // SAFETY: input holds rows × p.w.cols values (checked by
                // normalized_input), p.out rows × p.w.rows (checked above).
                unsafe {
                    self.matmul_locked(st, p.w, input, rows, p.out.as_mut_ptr())?;
                    if let Some(bias) = p.bias {
                        assert_eq!(bias.cols * bias.rows, p.w.rows);
                        self.add_bias_locked(st, p.out.as_mut_ptr(), bias, rows)?;
                    }
                }
            }
            return Ok(());
        }
        self.decode_products(st, x, norm, rows, normed, products, None)
    }

    fn norm_qkv_attention_inputs(
        &self,
        x: &DeviceBuffer,
        norm: Norm,
        normed: &mut DeviceBuffer,
        qkv: &mut [Product<DeviceBuffer>; 3],
        caches: &mut [&mut CudaKvCache],
        step: AttentionStep,
    ) -> Result<()> {
        let AttentionStep {
            rows,
            heads,
            qk_norm,
            rope,
            ..
        } = step;
        let n = rows.len();
        let widths = [
            heads.n_head * heads.head_dim_k,
            heads.n_head_kv * heads.head_dim_k,
            heads.n_head_kv * heads.head_dim_v,
        ];
        // The decode products' epilogue takes the attention-input step where
        // its RoPE pairs are adjacent rows, without frequency factors
        // (m40_rope_angle_reduced in cuda/ops.cuh says why), and the heads
        // have no norms.
        let in_epilogue = (1..=GEMV_MAX_X).contains(&n)
            && qk_norm.is_none()
            && rope.mode == RopeMode::Normal
            && rope.freq_factors.is_none()
            && rope.dims.is_multiple_of(2)
            && rope.dims <= heads.head_dim_k
            && heads.head_dim_k.max(heads.head_dim_v) <= ATTENTION_MAX_HEAD_DIM
            && qkv.iter().zip(widths).all(|(p, w)| p.w.rows == w);
        if !in_epilogue {
            return fused::norm_qkv_attention_inputs(self, x, norm, normed, qkv, caches, step);
        }
        let width = norm.weight.cols * norm.weight.rows;
        for p in qkv.iter() {
            assert!(p.w.cols == width && p.out.len() >= n * p.w.rows);
        }
        assert!(x.len() >= n * width);
        let mut state = self.lock();
        let st = &mut *state;
        let attention = self.attention_input_params(st, caches, step)?;
        self.decode_products(st, x, norm, n, normed, qkv, Some(&attention))
    }

    fn norm_gated_ffn(
        &self,
        x: &DeviceBuffer,
        norm: Norm,
        rows: usize,
        ffn: GatedFfn,
        scratch: Scratch<DeviceBuffer>,
        out: &mut DeviceBuffer,
    ) -> Result<()> {
        let (gate, up) = (ffn.gate, ffn.up);
        let same_shape = gate.rows == up.rows && gate.cols == up.cols;
        let width = norm.weight.cols * norm.weight.rows;
        if same_shape
            && self.tensor_core_products(gate.ty, rows)
            && self.tensor_core_products(up.ty, rows)
        {
            let n = rows * gate.rows;
            assert!(x.len() >= rows * width && gate.cols == width);
            assert!(scratch.product.len() >= n && scratch.product2.len() >= n && out.len() >= n);
            let products = [
                TensorCoreProduct {
                    w: gate,
                    bias: None,
                    out: scratch.product.as_mut_ptr(),
                    accumulate: false,
                },
                TensorCoreProduct {
                    w: up,
                    bias: None,
                    out: scratch.product2.as_mut_ptr(),
                    accumulate: false,
                },
            ];
            {
                let mut state = self.lock();
                // SAFETY: x holds rows × width values, both products rows ×
                // gate.rows (checked above).
                unsafe {
                    self.tensor_core_products_of(
                        &mut state,
                        x.as_ptr(),
                        rows,
                        Some(norm),
                        &products,
                    )?
                };
            }
            return self.glu(ffn.glu, scratch.product, scratch.product2, n, out);
        }
        let one_launch = gate.ty == up.ty && same_shape;
        if rows > GEMV_MAX_X || !one_launch {
            return fused::norm_gated_ffn(self, x, norm, rows, ffn, scratch, out);
        }
        assert!(out.len() >= rows * gate.rows && gate.cols == norm.weight.cols * norm.weight.rows);
        let mut state = self.lock();
        let st = &mut *state;
        let (input, fused_norm) = self.normalized_input(st, x, norm, rows, scratch.normed)?;
        let epilogue = match ffn.glu {
            Glu::Swiglu => GemvEpilogue::GluSilu,
            Glu::Geglu => GemvEpilogue::GluGelu,
        };
        let matrices = [
            self.gemv_matrix(gate, None, out.as_mut_ptr())?,
            self.gemv_matrix(up, None, out.as_mut_ptr())?,
        ];
        // SAFETY: input holds rows × cols values, out rows × gate.rows.
        unsafe {
            self.gemv(
                st,
                gate,
                input,
                rows,
                &matrices,
                epilogue,
                fused_norm,
                false,
                &AttentionInputs::NONE,
            )
        }
    }

    fn matmul_residual(
        &self,
        w: &Weight,
        a: &DeviceBuffer,
        rows: usize,
        post_norm: Option<Norm>,
        product: &mut DeviceBuffer,
        x: &mut DeviceBuffer,
    ) -> Result<()> {
        assert!(a.len() >= rows * w.cols && x.len() >= rows * w.rows);
        let mut state = self.lock();
        let st = &mut *state;
        if rows <= GEMV_MAX_X && post_norm.is_none() {
            let matrix = self.gemv_matrix(w, None, x.as_mut_ptr())?;
            // SAFETY: sizes checked above.
            return unsafe {
                self.gemv(
                    st,
                    w,
                    a.as_ptr(),
                    rows,
                    &[matrix],
                    GemvEpilogue::Accumulate,
                    None,
                    false,
                    &AttentionInputs::NONE,
                )
            };
        }
        if post_norm.is_none() && self.tensor_core_products(w.ty, rows) {
            let product = TensorCoreProduct {
                w,
                bias: None,
                out: x.as_mut_ptr(),
                accumulate: true,
            };
            // SAFETY: a holds rows × w.cols values, x rows × w.rows (checked).
            return unsafe { self.tensor_core_products_of(st, a.as_ptr(), rows, None, &[product]) };
        }
        assert!(product.len() >= rows * w.rows);
        if let Some(norm) = post_norm {
            assert_eq!(norm.weight.cols * norm.weight.rows, w.rows);
        }
        // SAFETY: a holds rows × w.cols values, product rows × w.rows (checked).
        unsafe { self.matmul_locked(st, w, a.as_ptr(), rows, product.as_mut_ptr())? };
        let n = rows * w.rows;
        // SAFETY: x and product hold rows × w.rows values.
        unsafe {
            match post_norm {
                Some(norm) => check(
                    m40_norm_add(
                        x.as_mut_ptr(),
                        product.as_ptr(),
                        self.vector(norm.weight)?,
                        dim(w.rows, "a row width")?,
                        dim(rows, "a row count")?,
                        norm.eps,
                        st.stream.raw(),
                    ),
                    || "normalized residual add".to_string(),
                ),
                None => check(
                    m40_add(x.as_mut_ptr(), product.as_ptr(), n, n, st.stream.raw()),
                    || "residual add".to_string(),
                ),
            }
        }
    }

    fn attention_inputs(
        &self,
        caches: &mut [&mut CudaKvCache],
        step: AttentionStep,
        q: &mut DeviceBuffer,
        k: &mut DeviceBuffer,
        v: &DeviceBuffer,
    ) -> Result<()> {
        let AttentionStep {
            rows,
            heads,
            qk_norm,
            ..
        } = step;
        if rows.is_empty() {
            return Ok(());
        }
        if qk_norm.is_some_and(|(qn, kn)| qn.eps != kn.eps) {
            // The fused kernel takes one epsilon for both norms.
            return fused::attention_inputs(self, caches, step, q, k, v);
        }
        if heads.head_dim_k > ATTENTION_MAX_HEAD_DIM || heads.head_dim_v > ATTENTION_MAX_HEAD_DIM {
            return Err(Error::unsupported(format!(
                "heads of {} values; the CUDA kernels handle up to {ATTENTION_MAX_HEAD_DIM}",
                heads.head_dim_k.max(heads.head_dim_v)
            )));
        }
        let n = rows.len();
        assert!(
            q.len() >= n * heads.n_head * heads.head_dim_k
                && k.len() >= n * heads.n_head_kv * heads.head_dim_k
                && v.len() >= n * heads.n_head_kv * heads.head_dim_v
        );
        let mut state = self.lock();
        let st = &mut *state;
        let inputs = self.attention_input_params(st, caches, step)?;
        // SAFETY: q, k, v hold the rows' heads (checked above); every row's
        // cache has room for its position (the session checked it).
        unsafe {
            check(
                m40_attention_inputs(
                    q.as_mut_ptr(),
                    k.as_ptr(),
                    v.as_ptr(),
                    n as c_int,
                    &inputs,
                    st.stream.raw(),
                ),
                || "attention inputs (norms, RoPE, KV store)".to_string(),
            )
        }
    }
}

/// An attention launch (`m40_attention`): the tiled prefill kernel or not,
/// the ranges each (row, head) splits its positions into, and the query
/// heads of a lane-per-position block (1 or 4).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct AttentionLaunch {
    tiled: bool,
    splits: usize,
    heads_per_block: usize,
}

/// How many ranges each (row, head) splits its positions into. A warp walks
/// its positions one after another, so short ranges (about 32 positions per
/// block) keep decode's latency low; the split count stays within what fills
/// the GPU many times over (prefill's many rows need no splitting).
fn attention_splits(row_heads: usize, longest: usize, multiprocessors: usize) -> usize {
    const POSITIONS_PER_SPLIT: usize = 32;
    let most_blocks = 32 * multiprocessors;
    let fill = (2 * multiprocessors).div_ceil(row_heads.max(1));
    let short = longest.div_ceil(POSITIONS_PER_SPLIT);
    fill.max(short)
        .min(most_blocks / row_heads.max(1))
        .clamp(1, longest.div_ceil(16).max(1))
}

/// Whether keys and values are heads of a multiple of 8 values: they take
/// the tiled kernel (prompt chunks) or the lane-per-position kernel (other
/// rows), else a warp per position.
fn heads_of_multiples_of_8(shape: &AttentionShape) -> bool {
    shape.head_dim_k.is_multiple_of(8) && shape.head_dim_v.is_multiple_of(8)
}

/// Whether the lane-per-position kernel takes four heads a block, a warp
/// walking each (row, head) alone, rather than one head whose four warps
/// share its positions, 32 each a round. Two blocks fit an SM (the kernel's
/// registers); the time of either layout is taken as its waves of blocks
/// times the rounds of a warp. Four heads must also need fewer waves, so
/// that with one wave either way the shared ranges stay.
///
/// Measured on the H100 (32 heads of 128 values, µs a launch, one head /
/// four): 32 rows at 100 positions 33.2 / 27.5 and at 2000 378 / 368, where
/// this picks four; 1 row at 1100 positions over 9 ranges 17.5 / 22.0, 8 rows
/// at 1000 over 2 ranges 60.2 / 75.6, 16 rows at 1000 102.6 / 132.8, where it
/// keeps one.
fn four_heads_a_block(
    rows: usize,
    n_head: usize,
    positions: usize,
    multiprocessors: usize,
) -> bool {
    let slots = 2 * multiprocessors.max(1);
    let rounds = positions.div_ceil(32);
    let waves_one = (rows * n_head).div_ceil(slots);
    let waves_four = (rows * n_head.div_ceil(4)).div_ceil(slots);
    waves_four * rounds <= waves_one * rounds.div_ceil(4) && waves_four < waves_one
}

/// Rows that the tiled prefill kernel takes: enough of them (a prompt
/// chunk, not a decode batch), all of one sequence at consecutive positions.
fn is_prompt_chunk(rows: &[SeqPos]) -> bool {
    rows.len() >= GEMM_MIN_ROWS
        && rows
            .windows(2)
            .all(|p| p[1].seq == p[0].seq && p[1].pos == p[0].pos + 1)
}

/// Position ranges of the tiled and lane-per-position kernels, given how
/// many blocks one range takes (tiles or rows, times heads): one range when
/// those blocks fill the GPU twice; else enough ranges to, each of at least
/// 128 positions (4 rounds of the tiled kernel's 32 positions, one round of
/// the 4 warps × 32 lanes of the other with one head a block).
fn block_attention_splits(
    blocks_per_range: usize,
    longest: usize,
    multiprocessors: usize,
) -> usize {
    const MIN_POSITIONS_PER_SPLIT: usize = 128;
    let fill = (2 * multiprocessors).div_ceil(blocks_per_range.max(1));
    fill.min(longest.div_ceil(MIN_POSITIONS_PER_SPLIT)).max(1)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn four_heads_a_block_where_the_h100_measured_them_faster() {
        const H100: usize = 132;
        // (rows, positions, measured faster with four heads), 32 heads.
        for (rows, positions, four) in [
            (32, 100, true),
            (32, 2000, true),
            (16, 1000, false),
            (8, 129, false),
            (1, 1100, false),
        ] {
            assert_eq!(
                four_heads_a_block(rows, 32, positions, H100),
                four,
                "{rows} rows at {positions}"
            );
        }
        // One wave either way: the shared ranges stay.
        assert!(!four_heads_a_block(1, 32, 10, H100));
        assert!(!four_heads_a_block(8, 32, 10, H100));
        // 16 sessions: four heads while a warp's range is two rounds at most.
        assert!(four_heads_a_block(16, 32, 64, H100));
        assert!(!four_heads_a_block(16, 32, 65, H100));
    }
}
