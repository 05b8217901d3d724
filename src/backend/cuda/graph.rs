//! Decode steps replayed as CUDA graphs.
//!
//! A decode step is a few hundred small kernels; launching them one by one
//! costs the host about as long as the device takes to run a small model's
//! step, so the device waits for the host. The first step of each shape is
//! recorded as a graph; later steps copy their inputs (token ids, positions,
//! KV caches) into the graph's input block and launch the whole step at
//! once.
//!
//! What a recorded step depends on:
//! - the number of rows (one per session), which picks the graph;
//! - each attention launch's split count (and with it the heads a block
//!   takes), which grows with the sequence length: a replay checks the
//!   launches, and a step whose launches changed is recorded again;
//! - each layer's place in the caches (`KvLayer`), a launch parameter: the
//!   same in every cache made for the model's layers, as every session's is;
//! - everything else the kernels read through pointers: weights and the
//!   8-bit activation scratch (fixed for the backend's life; every step
//!   uses the scratch in stream order), the step's inputs (copied in before
//!   each replay), and the activations and scratch of the recording, which
//!   the graph owns.

use std::ffi::c_int;
use std::sync::Arc;

use super::attention::{device_rows, AttentionLaunch};
use super::kernels::DeviceRow;
use super::memory::{Arena, DeviceAllocator, DevicePtr};
use super::runtime::{self, OwnedGraph, OwnedStream, PinnedBuffer};
use super::staging::as_bytes;
use super::{AttentionShape, CudaBackend, CudaKvCache, DeviceBuffer};
use crate::backend::{Batch, StepOutput};
use crate::error::{Error, ErrorKind, Result};

/// Recorded steps kept per backend; the least recently used goes first.
const MAX_GRAPHS: usize = 8;

/// Most rows (sessions) of a recorded decode step. Past one decode launch's
/// rows (GEMV_MAX_X) a step's products take the tensor cores or several
/// decode launches, and launching the step kernel by kernel costs the host
/// more than the device takes: 32 sessions of Gemma 3 270M enqueued in
/// 6.9 ms a step for the device's ~3 (H100, `op_profile`).
const GRAPH_MAX_ROWS: usize = 64;

/// A step's inputs in device memory, at addresses the recording names:
/// the token ids, then the row table (positions and KV caches), then the
/// activations the step starts from when an earlier stage of a split model
/// computed them (`input_len` values).
pub(super) struct StepInputs {
    device: DevicePtr<u8>,
    host: PinnedBuffer,
    rows: usize,
    input_len: usize,
}

impl StepInputs {
    fn new(allocator: &Arc<DeviceAllocator>, rows: usize, input_len: usize) -> Result<StepInputs> {
        let bytes = Self::input_offset(rows) + input_len * std::mem::size_of::<f32>();
        Ok(StepInputs {
            device: allocator.alloc(bytes)?,
            host: PinnedBuffer::new(bytes)?,
            rows,
            input_len,
        })
    }

    /// Where the row table starts: past the ids, 16-byte aligned.
    fn rows_offset(rows: usize) -> usize {
        (rows * std::mem::size_of::<c_int>()).next_multiple_of(16)
    }

    /// Where the input activations start: past the row table, 16-byte aligned.
    fn input_offset(rows: usize) -> usize {
        (Self::rows_offset(rows) + rows * std::mem::size_of::<DeviceRow>()).next_multiple_of(16)
    }

    /// The ids of a step of `n` rows.
    pub(super) fn token_ids(&self, n: usize) -> Result<*const c_int> {
        self.check_rows(n)?;
        Ok(self.device.as_ptr().cast())
    }

    /// The row table of a step of `n` rows.
    pub(super) fn row_table(&self, n: usize) -> Result<*const DeviceRow> {
        self.check_rows(n)?;
        // SAFETY: the offset lies inside the block (see `new`).
        Ok(unsafe { self.device.as_ptr().add(Self::rows_offset(self.rows)) }.cast())
    }

    /// The input activations of a step, `len` values.
    pub(super) fn input(&self, len: usize) -> Result<*const f32> {
        if len != self.input_len {
            return Err(Error::internal(format!(
                "a recorded step of {} input values was given {len}",
                self.input_len
            )));
        }
        // SAFETY: the offset lies inside the block (see `new`).
        Ok(unsafe { self.device.as_ptr().add(Self::input_offset(self.rows)) }.cast())
    }

    fn check_rows(&self, n: usize) -> Result<()> {
        if n != self.rows {
            return Err(Error::internal(format!(
                "a recorded step of {} rows was given {n}",
                self.rows
            )));
        }
        Ok(())
    }

    /// Enqueues the copy of a step's inputs to the device. The previous
    /// step's copy has run: every step ends by waiting for its outputs.
    fn upload(
        &mut self,
        ids: &[c_int],
        rows: &[DeviceRow],
        input: &[f32],
        stream: &OwnedStream,
    ) -> Result<()> {
        self.check_rows(ids.len())?;
        self.check_rows(rows.len())?;
        self.input(input.len())?;
        let offset = Self::rows_offset(self.rows);
        let input_offset = Self::input_offset(self.rows);
        let host = self.host.as_mut_slice();
        host[..std::mem::size_of_val(ids)].copy_from_slice(as_bytes(ids));
        host[offset..offset + std::mem::size_of_val(rows)].copy_from_slice(as_bytes(rows));
        host[input_offset..input_offset + std::mem::size_of_val(input)]
            .copy_from_slice(as_bytes(input));
        // SAFETY: the device block holds at least the pinned buffer's bytes
        // (same request, rounded up to a size class); the pinned copy stays
        // untouched until the next step, which starts after this one ended.
        unsafe {
            runtime::copy_to_device(
                self.device.as_mut_ptr().cast(),
                self.host.as_ptr(),
                self.host.capacity(),
                stream.raw(),
            )
        }
    }
}

/// What a backend records while a step is being captured.
pub(super) struct Capture {
    pub inputs: StepInputs,
    /// The attention launches' shapes, each once, and how each was
    /// launched in the recording.
    pub attention: Vec<(AttentionShape, AttentionLaunch)>,
}

/// One recorded decode step.
pub(super) struct DecodeGraph {
    graph: OwnedGraph,
    inputs: StepInputs,
    attention: Vec<(AttentionShape, AttentionLaunch)>,
    /// What the step computes: its logits, or on a stage of a split model
    /// before the last, its activations.
    output: DeviceBuffer,
    /// The recording's activations and scratch, named by its kernels.
    _memory: (Vec<DevicePtr<u8>>, Arena),
}

/// How many steps were recorded and replayed (tests and tools read it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GraphStats {
    pub captures: u64,
    pub replays: u64,
    /// Whether the recorded kernels overlap their predecessors.
    pub overlapped: bool,
}

/// A backend's recorded steps.
#[derive(Default)]
pub(super) struct DecodeGraphs {
    graphs: Vec<DecodeGraph>,
    captures: u64,
    replays: u64,
    /// Recording failed altogether: steps run launch by launch.
    off: bool,
    /// Recording a step of more than GEMV_MAX_X rows failed: such steps
    /// run launch by launch, smaller ones are still recorded.
    large_off: bool,
}

impl CudaBackend {
    /// One forward pass: `enqueue` enqueues it and returns the device buffer
    /// whose output rows (`row_len` values each from its start: the logits
    /// of `logit_rows`, or the activations of every row on a stage before
    /// the last of a split model) go to `out` (untouched on failure). A
    /// decode step (up to GRAPH_MAX_ROWS rows, one per session, an output
    /// for each) runs as a recorded graph where the device allows; `input`,
    /// the activations an earlier stage computed, is then one of its inputs.
    pub fn run_step(
        &self,
        caches: &mut [&mut CudaKvCache],
        batch: Batch,
        input: Option<&[f32]>,
        row_len: usize,
        out: &mut StepOutput,
        mut enqueue: impl FnMut(&mut [&mut CudaKvCache]) -> Result<DeviceBuffer>,
    ) -> Result<()> {
        let Batch {
            tokens,
            rows,
            logit_rows,
        } = batch;
        let decode_step = tokens.len() == rows.len()
            && (1..=GRAPH_MAX_ROWS).contains(&rows.len())
            && logit_rows.iter().copied().eq(0..rows.len());
        // A reset's clearing of recurrent states goes before any recording.
        self.clear_states(caches)?;
        if !self.graph_decode || !decode_step {
            return self.run_directly(caches, &mut enqueue, row_len, out);
        }
        let mut graphs = self.graphs.lock().unwrap_or_else(|e| e.into_inner());
        let large = rows.len() > super::GEMV_MAX_X;
        if graphs.off || (large && graphs.large_off) {
            return self.run_directly(caches, &mut enqueue, row_len, out);
        }
        let input = input.unwrap_or(&[]);
        let ids: Vec<c_int> = tokens.iter().map(|&t| t as c_int).collect();
        let table = device_rows(caches, rows)?;
        let recorded = graphs.graphs.iter().position(|g| {
            g.inputs.rows == rows.len()
                && g.inputs.input_len == input.len()
                && g.attention
                    .iter()
                    .all(|(shape, launch)| self.attention_launch(rows, shape) == *launch)
        });
        let graph = match recorded {
            // The most recently used goes last.
            Some(i) => graphs.graphs.remove(i),
            None => match self.record(&mut graphs, caches, rows.len(), input.len(), &mut enqueue) {
                Ok(graph) => graph,
                Err(e) => {
                    // A step that cannot be recorded runs launch by launch;
                    // if it fails that way too, its error is the real one.
                    // Out of memory says nothing about recording: a later
                    // step is recorded.
                    self.run_directly(caches, &mut enqueue, row_len, out)?;
                    if e.kind() != ErrorKind::OutOfMemory {
                        if large {
                            graphs.large_off = true;
                        } else {
                            graphs.off = true;
                        }
                    }
                    return Ok(());
                }
            },
        };
        graphs.graphs.push(graph);
        let graph = graphs.graphs.last_mut().expect("pushed above");
        let launched = {
            let state = self.lock();
            graph.inputs.upload(&ids, &table, input, &state.stream)?;
            graph.graph.launch(&state.stream)
        };
        if let Err(e) = launched {
            // A replay that fails may have run part of the step: its
            // sequences' states then hold no known number of tokens.
            for r in rows {
                caches[r.seq].invalidate_recurrent();
            }
            return Err(e);
        }
        // The step's recurrent states took in its rows (a recording counts
        // none: its launches ran only now).
        for r in rows {
            caches[r.seq].advance_recurrent(1);
        }
        out.read(self, &graph.output, row_len)?;
        graphs.replays += 1;
        Ok(())
    }

    /// Counts of recorded and replayed decode steps.
    pub fn graph_stats(&self) -> GraphStats {
        let graphs = self.graphs.lock().unwrap_or_else(|e| e.into_inner());
        GraphStats {
            captures: graphs.captures,
            replays: graphs.replays,
            overlapped: graphs.captures > 0 && self.overlap_launches,
        }
    }

    /// Records a step of `n_rows` rows and makes room for it among the
    /// recordings. A recording that fails is tried again: one can fail
    /// while other threads use the device, and the next attempt succeed.
    /// Out of memory is not retried.
    fn record(
        &self,
        graphs: &mut DecodeGraphs,
        caches: &mut [&mut CudaKvCache],
        n_rows: usize,
        input_len: usize,
        enqueue: &mut impl FnMut(&mut [&mut CudaKvCache]) -> Result<DeviceBuffer>,
    ) -> Result<DecodeGraph> {
        const ATTEMPTS: usize = 3;
        let mut attempt = 0;
        let graph = loop {
            attempt += 1;
            match self.record_step(caches, n_rows, input_len, enqueue) {
                Ok(graph) => break graph,
                Err(e) if attempt == ATTEMPTS || e.kind() == ErrorKind::OutOfMemory => {
                    return Err(e)
                }
                Err(_) => {}
            }
        };
        if graphs.graphs.len() == MAX_GRAPHS {
            graphs.graphs.remove(0);
        }
        graphs.captures += 1;
        Ok(graph)
    }

    fn run_directly(
        &self,
        caches: &mut [&mut CudaKvCache],
        enqueue: &mut impl FnMut(&mut [&mut CudaKvCache]) -> Result<DeviceBuffer>,
        row_len: usize,
        out: &mut StepOutput,
    ) -> Result<()> {
        let _shared = self.no_capture();
        let device = enqueue(caches)?;
        out.read(self, &device, row_len)
    }

    /// Records one step of `n_rows` rows (and `input_len` input
    /// activations): `enqueue`'s launches go into a graph, and the memory
    /// they name stays the graph's.
    fn record_step(
        &self,
        caches: &mut [&mut CudaKvCache],
        n_rows: usize,
        input_len: usize,
        enqueue: &mut impl FnMut(&mut [&mut CudaKvCache]) -> Result<DeviceBuffer>,
    ) -> Result<DecodeGraph> {
        // No other thread may enqueue work while the stream is recorded.
        let _exclusive = self
            .capture_exclusion
            .write()
            .unwrap_or_else(|e| e.into_inner());
        let inputs = StepInputs::new(&self.allocator, n_rows, input_len)?;
        let mut scratch = Arena::default();
        let recording = {
            let mut state = self.lock();
            let st = &mut *state;
            let recording = runtime::begin_capture(&st.stream)?;
            std::mem::swap(&mut st.arena, &mut scratch);
            st.capture = Some(Capture {
                inputs,
                attention: Vec::new(),
            });
            self.allocator.hold_freed();
            recording
        };
        // Whatever `enqueue` does, the recording ends before this returns.
        let output = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| enqueue(caches)));
        let mut state = self.lock();
        let st = &mut *state;
        let graph = runtime::end_capture(&st.stream, recording);
        std::mem::swap(&mut st.arena, &mut scratch);
        let capture = st.capture.take().expect("set above");
        let memory = self.allocator.take_held();
        drop(state);
        let output = output.unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        Ok(DecodeGraph {
            graph: graph?,
            inputs: capture.inputs,
            attention: capture.attention,
            output: output?,
            _memory: (memory, scratch),
        })
    }
}
