//! A hybrid model's parts on the CUDA backend (cuda/delta_net.cu): the
//! caches with linear-attention states beside the attention layers' keys
//! and values, and the Gated DeltaNet step.

use std::ffi::c_int;

use super::attention::device_rows;
use super::kernels::{m40_delta_net, m40_delta_net_scratch, DeviceRow, KvLayer};
use super::memory::human;
use super::runtime::{self, check};
use super::staging::RowTableKind;
use super::{
    dim, CachedLayer, CudaBackend, CudaKvCache, DeltaNetStep, DeviceBuffer, RecurrentSlot, SeqPos,
};
use crate::error::{Error, Result};
use crate::kv_cache::LayerState;

/// Taps the convolution kernel takes (M40_CONV_MAX_TAPS in cuda/delta_net.cu).
const CONV_MAX_TAPS: usize = 16;

/// Head widths the recurrence kernel is built for (cuda/delta_net.cu).
const HEAD_DIMS: [usize; 5] = [16, 32, 64, 128, 256];

/// The longest run of a sequence's rows from which a step takes the
/// chunked form of the delta rule, for all its runs. Below it the rows go
/// one after another:
/// each costs a chain of a few dependent steps, where the chunked form
/// costs two launches more and a chunk's matrix products.
const CHUNKED_FROM_ROWS: usize = 8;

impl CudaBackend {
    /// A sequence's cache for `n_ctx` positions of `layers`: keys and values
    /// for the attention layers only, each layer as wide as its own heads
    /// (Gemma 4's sliding-window and full-attention layers differ), and zero
    /// states for the recurrent ones.
    pub(super) fn sequence_cache(
        &self,
        n_ctx: usize,
        layers: &[LayerState],
    ) -> Result<CudaKvCache> {
        let _shared = self.no_capture();
        let state = self.lock();
        let overflow = || Error::out_of_memory("KV cache size overflows");
        let mut kv_layers = Vec::with_capacity(layers.len());
        let mut recurrent = Vec::with_capacity(layers.len());
        // Values a position of the attention layers so far, and floats of
        // the recurrent states so far.
        let (mut k_values, mut v_values, mut n_state) = (0usize, 0usize, 0usize);
        for layer in layers {
            match *layer {
                LayerState::Kv { k_width, v_width } => {
                    let place = KvLayer {
                        k_start: dim(k_values, "a KV cache's width")?,
                        v_start: dim(v_values, "a KV cache's width")?,
                    };
                    kv_layers.push(Some(CachedLayer {
                        place,
                        k_width,
                        v_width,
                    }));
                    recurrent.push(None);
                    // Each layer starts 16-byte aligned, as the attention
                    // kernels' vector loads of its rows need: a start of a
                    // multiple of 8 values is one at every n_ctx. (Heads
                    // of a multiple of 8 values, every real model's, need
                    // no padding.)
                    let next = |start: usize, width: usize| {
                        start
                            .checked_add(width)
                            .map(|end| end.next_multiple_of(8))
                            .ok_or_else(overflow)
                    };
                    k_values = next(k_values, k_width)?;
                    v_values = next(v_values, v_width)?;
                }
                LayerState::Recurrent(shape) => {
                    if shape.conv_kernel > CONV_MAX_TAPS || !HEAD_DIMS.contains(&shape.head_dim) {
                        return Err(Error::unsupported(format!(
                            "a linear-attention layer of {} taps and heads of {} values; the CUDA kernels take up to {CONV_MAX_TAPS} taps and heads of {HEAD_DIMS:?}",
                            shape.conv_kernel, shape.head_dim
                        )));
                    }
                    let (conv, heads) = shape.state_values();
                    kv_layers.push(None);
                    recurrent.push(Some(RecurrentSlot {
                        conv: n_state,
                        heads: n_state + conv,
                        tokens: 0,
                    }));
                    n_state += conv + heads;
                }
            }
        }
        // The kernels take each layer's start as an int.
        dim(k_values.max(v_values), "a KV cache's width")?;
        let (nk, nv) = (
            n_ctx.checked_mul(k_values).ok_or_else(overflow)?,
            n_ctx.checked_mul(v_values).ok_or_else(overflow)?,
        );
        let total = (nk + nv) * 2 + n_state * 4;
        let context = |e: Error| {
            e.context(format!(
                "KV cache of {n_ctx} positions ({} on {})",
                human(total),
                self.info.name
            ))
        };
        let mut keys = self.allocator.alloc::<u16>(nk).map_err(context)?;
        let mut values = self.allocator.alloc::<u16>(nv).map_err(context)?;
        let mut states = self.allocator.alloc::<f32>(n_state).map_err(context)?;
        // Positions past a sequence's end are never read, but zeroed memory
        // keeps a stray read finite; the states start at zero.
        // SAFETY: each holds its count of elements.
        unsafe {
            runtime::zero(keys.as_mut_ptr().cast(), nk * 2, state.stream.raw())?;
            runtime::zero(values.as_mut_ptr().cast(), nv * 2, state.stream.raw())?;
            runtime::zero(states.as_mut_ptr().cast(), n_state * 4, state.stream.raw())?;
        }
        Ok(CudaKvCache {
            keys,
            values,
            n_ctx,
            kv_layers,
            state: states,
            recurrent,
            needs_clear: false,
        })
    }

    /// [`crate::backend::Backend::delta_net`] on the device.
    pub(super) fn delta_net_step(
        &self,
        caches: &mut [&mut CudaKvCache],
        step: DeltaNetStep,
        qkv: &DeviceBuffer,
        alpha: &DeviceBuffer,
        beta: &DeviceBuffer,
        out: &mut DeviceBuffer,
    ) -> Result<()> {
        let rows = step.rows;
        if rows.is_empty() {
            return Ok(());
        }
        // The L2-norm launch has a grid row per batch row.
        const MAX_ROWS: usize = 65_535;
        if rows.len() > MAX_ROWS {
            return Err(Error::unsupported(format!(
                "{} rows in one step of a linear-attention layer; the CUDA kernels take up to {MAX_ROWS} (use a smaller n_batch)",
                rows.len()
            )));
        }
        let shape = step.shape;
        let runs = runs(caches, step.layer, rows)?;
        if caches.iter().any(|c| c.needs_clear) {
            return Err(Error::internal(
                "a step reached a reset recurrent state before it was cleared",
            ));
        }
        let mut state = self.lock();
        let st = &mut *state;
        // A recorded step counts its rows when it runs (`run_step`).
        let recording = st.capture.is_some();
        let slot = caches[rows[0].seq].recurrent[step.layer].expect("checked by runs");
        let table: Vec<DeviceRow> = device_rows(caches, rows)?;
        let device_rows = st.row_table(&self.allocator, RowTableKind::CacheRows, table)?;
        // One row a run (a batched decode step) needs no table of runs.
        let run_starts = if runs.len() == rows.len() + 1 {
            std::ptr::null()
        } else {
            st.upload_indices(&self.allocator, &runs)?
        };
        let mut conv = self.allocator.alloc::<f32>(rows.len() * shape.channels())?;
        let n_rows = dim(rows.len(), "a batch's rows")?;
        let longest = runs.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0);
        let (head_dim, n_v_heads) = (shape.head_dim as c_int, shape.n_v_heads as c_int);
        let mut scratch = if longest as usize >= CHUNKED_FROM_ROWS {
            // SAFETY: a pure function of its arguments.
            let floats = unsafe { m40_delta_net_scratch(n_rows, head_dim, n_v_heads) };
            Some(self.allocator.alloc::<f32>(floats)?)
        } else {
            None
        };
        let scratch_ptr = scratch
            .as_mut()
            .map_or(std::ptr::null_mut(), |s| s.as_mut_ptr());
        // A launch that fails may have rewritten part of the states: their
        // sequences then count as holding no known number of tokens. A
        // launch being recorded runs nothing, and its failure (a capture
        // another thread's work invalidated, which the recording retries)
        // leaves the states as they were.
        // SAFETY: qkv holds rows × channels values, alpha and beta rows ×
        // n_v_heads, out rows × value_width, conv rows × channels; the
        // weights are f32 vectors of their sizes; each row's state pointer
        // holds this layer's states at the offsets given (its cache was
        // made with this layer's shape); run_starts is NULL or holds the
        // runs' bounds, the longest `longest` rows; scratch is NULL or
        // holds m40_delta_net_scratch floats.
        let launched = unsafe {
            check(
                m40_delta_net(
                    qkv.as_ptr(),
                    alpha.as_ptr(),
                    beta.as_ptr(),
                    self.weights.vector(step.conv)?,
                    self.weights.vector(step.dt_bias)?,
                    self.weights.vector(step.a)?,
                    device_rows,
                    run_starts,
                    n_rows,
                    dim(runs.len() - 1, "a batch's sequences")?,
                    longest,
                    slot.conv as i64,
                    slot.heads as i64,
                    shape.conv_kernel as c_int,
                    head_dim,
                    shape.n_k_heads as c_int,
                    n_v_heads,
                    step.eps,
                    conv.as_mut_ptr(),
                    scratch_ptr,
                    out.as_mut_ptr(),
                    st.stream.raw(),
                ),
                || "linear attention (Gated DeltaNet)".to_string(),
            )
        };
        if launched.is_err() {
            if !recording {
                for r in rows {
                    caches[r.seq].invalidate_recurrent();
                }
            }
            return launched;
        }
        if !recording {
            for r in rows {
                if let Some(s) = caches[r.seq].recurrent[step.layer].as_mut() {
                    s.tokens = s.tokens.saturating_add(1);
                }
            }
        }
        Ok(())
    }

    /// Clears the recurrent states a reset left to clear (see
    /// [`CudaKvCache::reset_recurrent`]), before a step reads them.
    pub(super) fn clear_states(&self, caches: &mut [&mut CudaKvCache]) -> Result<()> {
        if caches.iter().all(|c| !c.needs_clear) {
            return Ok(());
        }
        let _shared = self.no_capture();
        let state = self.lock();
        for cache in caches.iter_mut().filter(|c| c.needs_clear) {
            // SAFETY: the states hold their length of f32.
            unsafe {
                runtime::zero(
                    cache.state.as_mut_ptr().cast(),
                    cache.state.len() * 4,
                    state.stream.raw(),
                )?
            };
            cache.needs_clear = false;
        }
        Ok(())
    }
}

/// The bounds of the runs of `rows` (each a sequence's consecutive rows),
/// checked: a sequence's rows are consecutive in the batch, in position
/// order from where its state in `layer` stands.
fn runs(caches: &[&mut CudaKvCache], layer: usize, rows: &[SeqPos]) -> Result<Vec<c_int>> {
    let mut starts: Vec<c_int> = Vec::new();
    let mut seen: Vec<usize> = Vec::new();
    for (i, r) in rows.iter().enumerate() {
        let slot = caches[r.seq]
            .recurrent
            .get(layer)
            .copied()
            .flatten()
            .ok_or_else(|| Error::internal(format!("layer {layer} has no recurrent state")))?;
        let continues = i > 0 && rows[i - 1].seq == r.seq;
        let offset = if continues {
            i - *starts.last().expect("a run started") as usize
        } else {
            if seen.contains(&r.seq) {
                return Err(Error::internal(
                    "a sequence's rows are not consecutive in the batch",
                ));
            }
            seen.push(r.seq);
            starts.push(i as c_int);
            0
        };
        if slot.tokens.checked_add(offset) != Some(r.pos) {
            return Err(Error::internal(format!(
                "a linear-attention layer's state holds {} tokens of sequence {}, but a row is at position {}",
                slot.tokens, r.seq, r.pos
            )));
        }
    }
    starts.push(rows.len() as c_int);
    Ok(starts)
}
