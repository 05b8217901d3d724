//! How attention and its input step are launched for a batch's rows: which
//! attention kernel (`m40_attention`: tiled for prompt chunks, a lane per
//! position or a warp per position otherwise), how many ranges each row's
//! positions split into, how many heads a block takes, and the
//! attention-input parameters (per-head norms, RoPE, the rows' caches) that
//! `m40_attention_inputs` and the decode kernel's epilogue read.

use std::ffi::c_int;

use super::kernels::{AttentionInputs, DeviceRow, YarnRamp};
use super::route::GEMM_MIN_ROWS;
use super::staging::RowTableKind;
use super::{
    dim, AttentionShape, AttentionStep, CachedLayer, CudaBackend, CudaKvCache, RopeMode, SeqPos,
    State, Weight,
};
use crate::error::{Error, Result};

/// An attention launch (`m40_attention`): the tiled prefill kernel or not,
/// the ranges each (row, head) splits its positions into, and the query
/// heads of a lane-per-position block (1 or 4).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct AttentionLaunch {
    pub tiled: bool,
    pub splits: usize,
    pub heads_per_block: usize,
}

impl CudaBackend {
    /// How attention over `rows` is launched.
    pub(super) fn attention_launch(
        &self,
        rows: &[SeqPos],
        shape: &AttentionShape,
    ) -> AttentionLaunch {
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

    /// One layer's attention-input parameters for the step's rows, their
    /// cache rows uploaded.
    pub(super) fn attention_input_params(
        &self,
        st: &mut State,
        caches: &[&mut CudaKvCache],
        step: AttentionStep,
    ) -> Result<AttentionInputs> {
        let heads = step.heads;
        let cached = cached_layer(caches, step.rows, step.layer)?;
        check_widths(&cached, heads.n_head_kv, heads.head_dim_k, heads.head_dim_v)?;
        let table = device_rows(caches, step.rows)?;
        let device_rows = st.row_table(&self.allocator, RowTableKind::CacheRows, table)?;
        let vector_or_null = |w: Option<&Weight>| match w {
            Some(w) => self.weights.vector(w),
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
            layer: cached.place,
            n_head: step.heads.n_head as c_int,
            n_head_kv: step.heads.n_head_kv as c_int,
            head_dim_k: step.heads.head_dim_k as c_int,
            head_dim_v: step.heads.head_dim_v as c_int,
            neox: c_int::from(step.rope.mode == RopeMode::Neox),
            rope_dims: step.rope.dims as c_int,
            overlap: c_int::from(self.overlap_launches),
            yarn: YarnRamp::of(step.rope),
        })
    }
}

/// The KV-cache kernels' row table: each row's cache and position.
pub(super) fn device_rows(caches: &[&mut CudaKvCache], rows: &[SeqPos]) -> Result<Vec<DeviceRow>> {
    rows.iter()
        .map(|r| {
            let c = &caches[r.seq];
            Ok(DeviceRow {
                keys: c.keys.address(),
                values: c.values.address(),
                pos: dim(r.pos, "a position")?,
                n_ctx: dim(c.n_ctx, "a context length")?,
                state: c.state.address(),
            })
        })
        .collect()
}

/// Where `layer`'s keys and values lie in the caches of `rows` (not
/// empty): one place for all, which a launch takes as a parameter, since
/// every cache of a model's stage is made for the same layers.
pub(super) fn cached_layer(
    caches: &[&mut CudaKvCache],
    rows: &[SeqPos],
    layer: usize,
) -> Result<CachedLayer> {
    let first = caches[rows[0].seq].kv_layer(layer)?;
    for r in rows {
        if caches[r.seq].kv_layer(layer)? != first {
            return Err(Error::internal(format!(
                "the caches of one step lay out layer {layer} differently"
            )));
        }
    }
    Ok(first)
}

/// Checks that a layer's cache holds keys and values as wide as its heads:
/// the kernels address positions by the heads' widths.
pub(super) fn check_widths(
    cached: &CachedLayer,
    n_head_kv: usize,
    head_dim_k: usize,
    head_dim_v: usize,
) -> Result<()> {
    let (k_width, v_width) = (n_head_kv * head_dim_k, n_head_kv * head_dim_v);
    if (cached.k_width, cached.v_width) != (k_width, v_width) {
        return Err(Error::internal(format!(
            "heads of {k_width} key and {v_width} value values a position over a cache layer of {} and {}",
            cached.k_width, cached.v_width
        )));
    }
    Ok(())
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
pub(super) fn heads_of_multiples_of_8(shape: &AttentionShape) -> bool {
    shape.head_dim_k.is_multiple_of(8) && shape.head_dim_v.is_multiple_of(8)
}

/// Whether the lane-per-position kernel takes four heads a block, a warp
/// walking each (row, head) alone, rather than one head whose four warps
/// share its positions, 32 each a round. Two blocks fit an SM (the kernel's
/// registers); the time of either layout is taken as its waves of blocks
/// times the rounds of a warp, and four heads a block are taken only where
/// that time is no longer: on the H100 this picks the faster layout at
/// every shape measured (the test lists them). Four heads must also need
/// fewer waves, so that with one wave either way the shared ranges stay.
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
