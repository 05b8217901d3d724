//! The CUDA backend: the model's weights uploaded once in their GGUF layout,
//! activations in f32, an f16 KV cache per sequence, and the kernels of
//! `cuda/` (written for the Tesla M40, sm_52, and run on every newer GPU).
//!
//! All device work of a backend runs in order on one compute stream, behind
//! one mutex: sessions on several host threads share the device safely, and
//! the memory pool may hand a freed block to the next owner without waiting.
//! Decode steps are recorded once and replayed as CUDA graphs (`graph`).
//!
//! One concern a file:
//! - `options`: what a host may ask of the backend, and the environment
//!   variables it is read from;
//! - `weights`: the weights' upload and where each lies on the device;
//! - `staging`: the pinned host memory inputs and results go through;
//! - `route`: which kernel takes each matrix product;
//! - `products`: the matrix products' launches on their routes;
//! - `attention`: how attention and its input step are launched;
//! - `ops`: the [`Backend`] operations and fused steps, built on those;
//! - `graph`: decode steps recorded and replayed;
//! - `offload`: a CPU stage's large products run on a GPU;
//! - `kernels`, `cublas`, `runtime`, `memory`: the kernels' C interface,
//!   cuBLAS, the CUDA runtime, and device memory.

mod attention;
mod candidates;
mod cublas;
mod experts;
mod graph;
mod hybrid;
mod kernels;
mod layout;
pub mod memory;
mod offload;
mod ops;
mod options;
mod products;
mod readback;
mod route;
pub mod runtime;
mod staging;
mod weights;

use std::ffi::c_int;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock, RwLockReadGuard};

use super::{
    fill_rows, fused, AttentionShape, AttentionStep, Backend, CandidateRequest, Candidates,
    DeltaNetStep, Experts, GatedFfn, Glu, Norm, Product, Rope, RopeMode, Scratch, SeqPos,
    SharedExpert, SharedScratch, Weight,
};
use crate::error::{Error, Result};
use crate::gguf::GgufFile;
use crate::json::JsonObject;
use crate::quant::GgmlType;
pub use graph::GraphStats;
use graph::{Capture, DecodeGraphs};
use kernels::{m40_launch_overlap, prepared_bytes, ExpertWork, KvLayer, PreparedForm, GEMV_MAX_X};
use memory::Arena;
pub use memory::{DeviceAllocator, DevicePtr, MemoryStats};
pub use offload::GpuProducts;
pub use options::CudaOptions;
use route::{ProductRoute, Routes};
use runtime::{DeviceInfo, OwnedEvent, OwnedStream, PinnedBuffer};
use staging::{RowTable, Staging};
use weights::DeviceWeights;

/// Whether a CUDA device can be used: the default device is the first GPU
/// when there is one.
pub fn device_count() -> usize {
    runtime::device_count().unwrap_or(0)
}

pub struct CudaBackend {
    info: DeviceInfo,
    allocator: Arc<DeviceAllocator>,
    weights: DeviceWeights,
    /// Which kernel takes each product.
    routes: Routes,
    /// The form each layer's attention output product reads its prepared
    /// rows in, where it takes a prepared route
    /// (`weights::attention_output_forms`).
    attention_output_forms: Vec<Option<PreparedForm>>,
    /// Weight rows per warp of the one-session decode kernel (2 or 4, or 0:
    /// the format's own choice).
    gemv_rows_per_warp: c_int,
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
    bandwidth: OnceLock<f64>,
    /// Work pieces (expert 0, row t, 1 row) for t < GEMV_MAX_X: a batch's
    /// small products as one-row slices of one launch (`gemv`).
    row_pieces: DevicePtr<ExpertWork>,
    /// A batch's launches whose matrices total at most this many bytes take
    /// their rows as one-row slices (`CudaOptions::row_slice_bytes`).
    row_slice_bytes: usize,
    state: Mutex<State>,
}

/// What one operation at a time uses.
/// Fields drop in order: the cuBLAS handle bound to the stream goes first,
/// the stream last.
struct State {
    cublas: Option<cublas::Cublas>,
    arena: Arena,
    staging: Staging,
    /// Pinned host memory results are read back through (see
    /// `State::read_to_pinned`).
    readback: PinnedBuffer,
    /// One event per piece of a large read (see `State::read_rows`).
    readback_events: Vec<OwnedEvent>,
    /// The threads that move a large read's pieces into their rows,
    /// started on the first such read.
    copy_workers: Option<readback::CopyWorkers>,
    /// The row table of the rows RoPE was last given (positions only).
    positions: RowTable,
    /// The row table of the rows the KV kernels were last given.
    cache_rows: RowTable,
    /// Where the decode kernel prepares its activation rows (8-bit codes,
    /// scaled values or grid values, `PreparedForm`: `prepared_bytes` for
    /// GEMV_MAX_X rows of the widest matrix), when products take a prepared
    /// route.
    activations_q8: Option<DevicePtr<i8>>,
    /// The widest matrix's width: the scratch holds GEMV_MAX_X rows of it.
    widest_product: usize,
    /// The step being recorded into a graph, if any: its kernels read the
    /// step's inputs from the graph's own input block.
    capture: Option<Capture>,
    /// Operations that have locked the state, counting this one.
    op: u64,
    /// What the decode scratch (`activations_q8`) holds prepared, when an
    /// operation other than a product prepared it for the next one: decode
    /// attention writes its output there as well, and the attention output
    /// product that follows takes it without a prepare launch.
    prepared_input: Option<PreparedInput>,
    stream: OwnedStream,
}

/// Rows of activations prepared in the decode scratch by one operation for
/// the product of the operation right after it (`op`, State::op): `rows`
/// rows of `cols` values at device address `x`, unnormalized.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct PreparedInput {
    x: usize,
    cols: usize,
    rows: usize,
    op: u64,
    /// The form it was prepared in: only products of formats that read
    /// the same one read it.
    form: PreparedForm,
}

/// One sequence's cache in device memory: the keys and values (f16) of its
/// attention layers, each layer as wide as its own heads, and the
/// recurrent states (f32) of a hybrid model's linear-attention layers.
pub struct CudaKvCache {
    keys: DevicePtr<u16>,
    values: DevicePtr<u16>,
    n_ctx: usize,
    /// Per layer of the stage: where its keys and values lie (none for a
    /// recurrent layer).
    kv_layers: Vec<Option<CachedLayer>>,
    /// Every recurrent layer's states, one layer after another.
    state: DevicePtr<f32>,
    /// Per layer of the stage: where its states lie in `state`.
    recurrent: Vec<Option<RecurrentSlot>>,
    /// Whether `state` still holds what a reset forgot: it is cleared on
    /// the device before the next step reads it.
    needs_clear: bool,
}

/// An attention layer's keys and values in a [`CudaKvCache`]: where they
/// start (the same in every cache of the model's stage, so that a launch,
/// recorded or not, takes them as a parameter) and the values a position
/// holds of each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct CachedLayer {
    place: KvLayer,
    k_width: usize,
    v_width: usize,
}

/// A linear-attention layer's states in a [`CudaKvCache`].
#[derive(Clone, Copy, Debug)]
struct RecurrentSlot {
    /// Offsets in floats of its convolution inputs and of its heads' states.
    conv: usize,
    heads: usize,
    /// Tokens the states have taken in.
    tokens: usize,
}

impl CudaKvCache {
    /// Bytes of device memory held.
    pub fn size_bytes(&self) -> usize {
        (self.keys.len() + self.values.len()) * 2 + self.state.len() * 4
    }

    /// Where attention layer `layer`'s keys and values lie.
    fn kv_layer(&self, layer: usize) -> Result<CachedLayer> {
        self.kv_layers
            .get(layer)
            .copied()
            .flatten()
            .ok_or_else(|| Error::internal(format!("layer {layer} has no keys and values")))
    }

    /// Whether every recurrent layer has taken in exactly `tokens` tokens.
    pub fn recurrent_holds(&self, tokens: usize) -> bool {
        self.recurrent.iter().flatten().all(|r| r.tokens == tokens)
    }

    /// The states as holding no known number of tokens (a launch that
    /// failed may have rewritten them): the session catches them up.
    fn invalidate_recurrent(&mut self) {
        for r in self.recurrent.iter_mut().flatten() {
            r.tokens = usize::MAX;
        }
    }

    /// Every recurrent layer's count of tokens taken in, `n` more.
    fn advance_recurrent(&mut self, n: usize) {
        for r in self.recurrent.iter_mut().flatten() {
            r.tokens = r.tokens.saturating_add(n);
        }
    }

    /// Every recurrent state back to that of no tokens (cleared on the
    /// device before the next step that reads them).
    pub fn reset_recurrent(&mut self) {
        for r in self.recurrent.iter_mut().flatten() {
            r.tokens = 0;
        }
        self.needs_clear = !self.state.is_empty();
    }
}

/// A batch's activations: `len` f32 in device memory.
pub type DeviceBuffer = DevicePtr<f32>;

fn dim(v: usize, what: &str) -> Result<c_int> {
    c_int::try_from(v)
        .map_err(|_| Error::unsupported(format!("{what} of {v} is too large for the CUDA kernels")))
}

impl CudaBackend {
    /// Uploads the weights of `file` that `holds` names to CUDA device
    /// `index` (the layers of one stage of a split model, or all of them).
    pub fn new(
        file: Arc<GgufFile>,
        index: usize,
        options: CudaOptions,
        holds: &dyn Fn(&str) -> bool,
    ) -> Result<CudaBackend> {
        let info = runtime::device_info(index)?;
        let spans = weights::checked_spans(&file, &info, holds)?;
        let allocator = DeviceAllocator::new(index);
        let stream = OwnedStream::new()?;
        let weights = DeviceWeights::upload(&file, spans, &allocator, &stream)?;
        let cublas = if options.use_cublas {
            cublas::Cublas::new(stream.raw())?
        } else {
            None
        };
        let routes = Routes::new(&file, &info, cublas.as_ref(), &options);
        let attention_output_forms = weights::attention_output_forms(&file, holds, &|ty| {
            (routes.route(ty, 1) == ProductRoute::Decode { prepared: true })
                .then(|| routes.form(ty))
        });
        let widest = weights::matrices(&file)
            .map(|t| t.dims[0] as usize)
            .max()
            .unwrap_or(0);
        let activations_q8 = if routes.any_prepared() {
            Some(allocator.alloc::<i8>(prepared_bytes(widest, GEMV_MAX_X))?)
        } else {
            None
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
        let mut row_pieces = allocator.alloc::<ExpertWork>(GEMV_MAX_X)?;
        let pieces: Vec<ExpertWork> = (0..GEMV_MAX_X as c_int)
            .map(|t| ExpertWork {
                expert: 0,
                first: t,
                count: 1,
            })
            .collect();
        // SAFETY: row_pieces holds GEMV_MAX_X pieces; the copy from pageable
        // memory is staged before it returns, and the stream is waited for
        // below, before any kernel can read them.
        unsafe {
            runtime::copy_to_device(
                row_pieces.as_mut_ptr().cast(),
                pieces.as_ptr().cast(),
                std::mem::size_of_val(pieces.as_slice()),
                stream.raw(),
            )?;
        }
        runtime::synchronize(&stream)?;
        Ok(CudaBackend {
            attention_output_forms,
            row_pieces,
            row_slice_bytes: options.row_slice_bytes,
            info,
            allocator,
            weights,
            routes,
            gemv_rows_per_warp,
            overlap_launches,
            graph_decode: options.graph_decode,
            graphs: Mutex::new(DecodeGraphs::default()),
            capture_exclusion: RwLock::new(()),
            bandwidth: OnceLock::new(),
            state: Mutex::new(State {
                stream,
                arena: Arena::default(),
                staging: Staging::new()?,
                readback: PinnedBuffer::new(Staging::INITIAL)?,
                readback_events: Vec::new(),
                copy_workers: None,
                cublas,
                positions: RowTable::new(),
                cache_rows: RowTable::new(),
                activations_q8,
                widest_product: widest,
                capture: None,
                op: 0,
                prepared_input: None,
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
        self.weights.bytes()
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

    /// Copies weights this device does not hold (`ws`, of `data`, the data
    /// section) over for the products that follow, in place of those
    /// copied before (`GpuProducts`).
    fn stage_weights(&self, data: &[u8], ws: &[&Weight]) -> Result<()> {
        let _shared = self.no_capture();
        let mut state = self.lock();
        let st = &mut *state;
        self.weights
            .stage(data, ws, &self.allocator, &mut st.staging, &st.stream)
    }

    /// Marks the device work enqueued so far, for timelines of the device's
    /// work that do not wait between operations (`benches/op_profile.rs`).
    pub fn record_event(&self, event: &OwnedEvent) -> Result<()> {
        let _shared = self.no_capture();
        event.record(&self.lock().stream)
    }

    /// Whether decode products of type `ty` run on activations rounded to
    /// 8 bits in blocks of 32, as the CPU's are: prepared for the integer
    /// path (dp4a, sm_61+ code) or, on the M40's scaled path, rounded to
    /// the same grid.
    pub fn rounded_activation_products(&self, ty: GgmlType) -> bool {
        self.routes.route(ty, 1) == ProductRoute::Decode { prepared: true }
    }

    /// Whether products of the same `rows` activation rows with each of
    /// `weights` (a fused step's group, or one product alone) run on f16
    /// tensor cores straight from the quantized weights (`m40_mmq`; the
    /// tensor-core route).
    pub fn tensor_core_products(&self, weights: &[&Weight], rows: usize) -> bool {
        self.shared_rows_routes(weights.iter().copied(), rows)
            .iter()
            .all(|&r| r == ProductRoute::TensorCores)
    }

    /// The kernel that takes a product of `rows` activation rows with `w`.
    fn route(&self, w: &Weight, rows: usize) -> ProductRoute {
        self.shared_rows_routes([w], rows)[0]
    }

    /// The kernels that take products of the same `rows` rows with each of
    /// `weights` (`Routes::shared_rows_routes`).
    fn shared_rows_routes<'w, I>(&self, weights: I, rows: usize) -> Vec<ProductRoute>
    where
        I: IntoIterator<Item = &'w Weight>,
        I::IntoIter: Clone,
    {
        let matrices = weights.into_iter().map(|w| (w.ty, w.n_bytes));
        self.routes.shared_rows_routes(matrices, rows)
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
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.op += 1;
        // The device was usable at load; a failure here resurfaces as the
        // next operation's error.
        let _ = runtime::ensure_device(self.info.index);
        state
    }
}
