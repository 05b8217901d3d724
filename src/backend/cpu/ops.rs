//! The CPU's element-wise and attention operations, on f32 slices. They follow
//! ggml's definitions (RMS over f64 sums, RoPE angles, tanh-GELU), computed
//! exactly rather than from ggml's f16 lookup tables.

use half::f16;

use super::ThreadPool;
use crate::backend::{AttentionShape, Rope, RopeMode, SeqPos};
use crate::kv_cache::KvCache;
use crate::quant::{exp, AttentionKernels, Kernels};

/// 1 / rms(x), the RMS with `eps` added to the mean square.
fn inverse_rms(x: &[f32], eps: f32) -> f32 {
    let sum: f64 = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
    let mean = (sum / x.len() as f64) as f32;
    1.0 / (mean + eps).sqrt()
}

/// x ← x / rms(x) · w.
pub fn rms_norm(x: &mut [f32], w: &[f32], eps: f32) {
    let scale = inverse_rms(x, eps);
    x.iter_mut().zip(w).for_each(|(v, &w)| *v = *v * scale * w);
}

/// x ← x / rms(x): ggml's `rms_norm` without a weight.
pub fn rms_normalize(x: &mut [f32], eps: f32) {
    let scale = inverse_rms(x, eps);
    x.iter_mut().for_each(|v| *v *= scale);
}

/// x ← cap · tanh(x / cap) in ggml's operations (llama.cpp's final logit
/// soft-capping: a scale by 1 / cap, tanh, a scale by cap), so that values
/// far below the cap pass almost unchanged and none exceeds it.
pub fn soft_cap(x: &mut [f32], cap: f32) {
    let inv = 1.0 / cap;
    x.iter_mut().for_each(|v| *v = (*v * inv).tanh() * cap);
}

/// The inverse frequencies of one layer's RoPE.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeTable {
    inv_freq: Vec<f64>,
    /// Each pair's position scale: the layer's, or under YaRN the pair's
    /// mix of the scaled and the unscaled angle.
    pos_scale: Vec<f64>,
    /// What cos and sin are multiplied by (YaRN; 1 otherwise).
    magnitude: f32,
}

impl RopeTable {
    pub fn new(rope: &Rope, factors: Option<&[f32]>) -> RopeTable {
        let half = rope.dims / 2;
        let inv_freq = (0..half)
            .map(|i| {
                let f = f64::from(rope.freq_base).powf(-2.0 * i as f64 / rope.dims as f64);
                f / factors.map_or(1.0, |ff| f64::from(ff[i]))
            })
            .collect();
        let freq_scale = f64::from(rope.freq_scale);
        let (pos_scale, magnitude) = match &rope.yarn {
            None => (vec![freq_scale; half], 1.0),
            Some(yarn) => {
                let [low, high] = yarn.ramp(rope.dims, rope.freq_base);
                let scale = (0..half)
                    .map(|i| {
                        // ggml's `rope_yarn_ramp`: 1 below `low`, 0 above
                        // `high`.
                        let y = (i as f32 - low) / (high - low).max(0.001);
                        let extrapolate = f64::from(1.0 - y.clamp(0.0, 1.0));
                        freq_scale * (1.0 - extrapolate) + extrapolate
                    })
                    .collect();
                let magnitude = yarn.magnitude(rope.freq_scale);
                (scale, magnitude)
            }
        };
        RopeTable {
            inv_freq,
            pos_scale,
            magnitude,
        }
    }

    /// cos and sin of every pair's angle at position `pos`.
    pub fn angles(&self, pos: usize) -> (Vec<f32>, Vec<f32>) {
        let m = self.magnitude;
        self.inv_freq
            .iter()
            .zip(&self.pos_scale)
            .map(|(&f, &scale)| {
                let angle = pos as f64 * scale * f;
                (angle.cos() as f32 * m, angle.sin() as f32 * m)
            })
            .unzip()
    }
}

/// cos and sin of every pair's angle at each position of a step, for one
/// table: a step's Q and K and all its layers of one RoPE share them, where
/// computing them for each row of each call took a prompt chunk of SmolLM2
/// 30 layers × 2 × 128 rows × 32 pairs of f64 sin and cos.
#[derive(Debug)]
pub struct StepAngles {
    table: RopeTable,
    positions: Vec<usize>,
    /// Row j's cos at `cos[j · pairs..]`, likewise `sin`.
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl StepAngles {
    pub fn new(table: RopeTable, positions: Vec<usize>) -> StepAngles {
        let (mut cos, mut sin) = (Vec::new(), Vec::new());
        for &pos in &positions {
            let (c, s) = table.angles(pos);
            cos.extend_from_slice(&c);
            sin.extend_from_slice(&s);
        }
        StepAngles {
            table,
            positions,
            cos,
            sin,
        }
    }

    /// Whether these are the angles of `table` at `positions`.
    pub fn serves(
        &self,
        table: &RopeTable,
        positions: impl ExactSizeIterator<Item = usize>,
    ) -> bool {
        positions.len() == self.positions.len()
            && self.positions.iter().copied().eq(positions)
            && self.table == *table
    }

    /// Row j's cos and sin.
    pub fn row(&self, j: usize) -> (&[f32], &[f32]) {
        let pairs = self.table.inv_freq.len();
        (
            &self.cos[j * pairs..][..pairs],
            &self.sin[j * pairs..][..pairs],
        )
    }
}

/// Rotates the first `2 · cos.len()` dimensions of one head.
pub fn rotate(head: &mut [f32], mode: RopeMode, cos: &[f32], sin: &[f32]) {
    let half = cos.len();
    for i in 0..half {
        let (a, b) = match mode {
            RopeMode::Normal => (2 * i, 2 * i + 1),
            RopeMode::Neox => (i, i + half),
        };
        let (x0, x1) = (head[a], head[b]);
        head[a] = x0 * cos[i] - x1 * sin[i];
        head[b] = x0 * sin[i] + x1 * cos[i];
    }
}

/// A slice that tasks write at disjoint ranges.
struct Shared(*mut f32, usize);
// SAFETY: every task writes only ranges no other task writes (its own (row,
// KV head) group, or its own span's partials), and the pool joins all tasks
// before the slice is read or dropped.
unsafe impl Sync for Shared {}

impl Shared {
    fn new(out: &mut [f32]) -> Shared {
        Shared(out.as_mut_ptr(), out.len())
    }

    /// # Safety
    /// No other task writes or reads `start..start + len` while the returned
    /// slice lives.
    #[allow(clippy::mut_from_ref)]
    unsafe fn slice(&self, start: usize, len: usize) -> &mut [f32] {
        assert!(start + len <= self.1);
        unsafe { std::slice::from_raw_parts_mut(self.0.add(start), len) }
    }
}

/// Positions a span covers: a row's keys are taken a span at a time, each
/// span's softmax partials computed on their own and merged in position
/// order. The spans depend on the row's position count alone, so a row's
/// result is the same whichever task computes which span and whatever rows
/// share its batch; where a step has fewer (row, KV head) pairs than
/// threads (one session, few KV heads, a long context) the spans are
/// separate tasks.
const SPAN: usize = 256;

/// One span's softmax partials for `queries` (query heads of one KV head,
/// `head_dim_k` values each: the group of one row, or the groups of several
/// rows of one sequence), each `[max score, Σ e^(score − max),
/// Σ e^(score − max) · v (head_dim_v)]`. Each query's partials are computed
/// on their own: the same whichever queries share the call.
#[allow(clippy::too_many_arguments)]
fn span_partials(
    kernels: AttentionKernels,
    keys: &[f16],
    values: &[f16],
    queries: &[f32],
    s: &AttentionShape,
    kv_head: usize,
    k_width: usize,
    v_width: usize,
    out: &mut [f32],
) {
    let (dk, dv) = (s.head_dim_k, s.head_dim_v);
    let n_queries = queries.len() / dk;
    let n = keys.len() / k_width;
    let key_rows = &f16_bytes(keys)[kv_head * dk * 2..];
    let value_rows = &f16_bytes(values)[kv_head * dv * 2..];
    let mut scratch = SPAN_SCRATCH.take();
    scratch.clear();
    scratch.resize(n_queries * (n + dv), 0.0);
    let (scores, weighted) = scratch.split_at_mut(n_queries * n);
    (kernels.dots)(key_rows, k_width * 2, queries, dk, scores);
    for (part, head_scores) in out.chunks_exact_mut(dv + 2).zip(scores.chunks_exact_mut(n)) {
        let (max, sum) = (kernels.softmax)(head_scores, s.scale);
        part[0] = max;
        part[1] = sum;
    }
    (kernels.axpys)(value_rows, v_width * 2, scores, n, weighted);
    for (part, w) in out.chunks_exact_mut(dv + 2).zip(weighted.chunks_exact(dv)) {
        part[2..].copy_from_slice(w);
    }
    SPAN_SCRATCH.set(scratch);
}

thread_local! {
    /// Each thread's scores and weighted values of `span_partials`, kept
    /// between calls: at the start of a prompt a call covers a few dozen
    /// keys, and a buffer allocated and zeroed for each showed in its
    /// profile. At most a span's scores and a head's values a query.
    static SPAN_SCRATCH: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Merges span partials `next` into `total` (both as `span_partials` lays
/// them out), the running softmax of their positions together.
fn merge_partials(total: &mut [f32], next: &[f32], dv: usize) {
    for (t, n) in total
        .chunks_exact_mut(dv + 2)
        .zip(next.chunks_exact(dv + 2))
    {
        let max = t[0].max(n[0]);
        let (a, b) = (exp(t[0] - max), exp(n[0] - max));
        t[0] = max;
        t[1] = t[1] * a + n[1] * b;
        t[2..]
            .iter_mut()
            .zip(&n[2..])
            .for_each(|(x, &y)| *x = *x * a + y * b);
    }
}

/// The attention output of each query head from its merged partials. A
/// head's sink logit (`sinks`, one per head) joins the softmax as ggml's
/// `soft_max` takes it: in the maximum and in the sum, with no value.
fn finish_partials(total: &[f32], sinks: Option<&[f32]>, out: &mut [f32], dv: usize) {
    for (h, (t, o)) in total
        .chunks_exact(dv + 2)
        .zip(out.chunks_exact_mut(dv))
        .enumerate()
    {
        let (scale, sum) = match sinks {
            None => (1.0, t[1]),
            Some(sinks) => {
                let max = t[0].max(sinks[h]);
                let scale = exp(t[0] - max);
                (scale, t[1] * scale + exp(sinks[h] - max))
            }
        };
        let inv = scale / sum;
        o.iter_mut().zip(&t[2..]).for_each(|(o, &x)| *o = x * inv);
    }
}

/// Bytes of f16 values, as the F16 dot kernels read rows.
fn f16_bytes(values: &[f16]) -> &[u8] {
    // SAFETY: f16 is a `#[repr(transparent)]` u16: two bytes, no padding,
    // any bit pattern a valid u8; the slice covers exactly those bytes.
    unsafe {
        std::slice::from_raw_parts(values.as_ptr().cast::<u8>(), std::mem::size_of_val(values))
    }
}

/// Rows of one sequence whose queries share a pass over each span's keys and
/// values in a prompt (`attention`).
const ROW_BLOCK: usize = 8;

/// Causal attention over each row's cache. A (row, KV head) pair's query
/// heads read its keys and values a span of positions at a time (`SPAN`).
/// Consecutive rows of one sequence whose positions start alike (a prompt's)
/// are taken in blocks of up to `ROW_BLOCK`: the spans every row of a block
/// sees whole are read once for all of their queries, so a long context's
/// keys and values cross the caches once per block instead of once per row.
/// One task a (block, KV head) where those keep the threads busy, else one
/// task a (row, KV head) span, the partials merged afterwards. A span's
/// scores and its weighted sum of values are one call each of the CPU's
/// attention kernels (`Kernels::attention`). Every query's partials are its
/// own and merged in span order, so a row's result is the same in a block,
/// a batch or alone. `sinks` are the values of `s.sinks`, one per query
/// head.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    pool: &ThreadPool,
    kernels: Kernels,
    caches: &[&mut KvCache],
    layer: usize,
    q: &[f32],
    rows: &[SeqPos],
    s: &AttentionShape,
    sinks: Option<&[f32]>,
    out: &mut [f32],
) {
    let group = s.n_head / s.n_head_kv;
    let (q_width, o_width) = (s.n_head * s.head_dim_k, s.n_head * s.head_dim_v);
    assert!(q.len() >= rows.len() * q_width && out.len() >= rows.len() * o_width);
    let kernels = kernels.attention();
    let part_len = group * (s.head_dim_v + 2);
    let positions = |i: usize| {
        let pos = rows[i].pos;
        s.window.map_or(0, |w| (pos + 1).saturating_sub(w))..pos + 1
    };
    let queries = |i: usize, kv_head: usize| {
        &q[i * q_width + kv_head * group * s.head_dim_k..][..group * s.head_dim_k]
    };
    // Span `k` of row i's pair (i, kv_head), into `part`.
    let span = |i: usize, kv_head: usize, k: usize, part: &mut [f32]| {
        let cache = &caches[rows[i].seq];
        let all = positions(i);
        let first = all.start + k * SPAN;
        let range = first..(first + SPAN).min(all.end);
        span_partials(
            kernels,
            cache.keys(layer, range.clone()),
            cache.values(layer, range),
            queries(i, kv_head),
            s,
            kv_head,
            cache.k_width(layer),
            cache.v_width(layer),
            part,
        );
    };
    let spans = |i: usize| positions(i).len().div_ceil(SPAN);
    let output = Shared::new(out);
    let finish = |i: usize, kv_head: usize, total: &[f32]| {
        // SAFETY: the heads of pair (i, kv_head) belong to this task alone.
        let o = unsafe {
            output.slice(
                i * o_width + kv_head * group * s.head_dim_v,
                group * s.head_dim_v,
            )
        };
        let group_sinks = sinks.map(|sinks| &sinks[kv_head * group..][..group]);
        finish_partials(total, group_sinks, o, s.head_dim_v);
    };
    let n_pairs = rows.len() * s.n_head_kv;
    // Blocks of at most `block_rows` rows, fewer where the threads need the
    // tasks.
    let block_rows = (n_pairs / (4 * pool.n_threads())).clamp(1, ROW_BLOCK);
    let mut blocks: Vec<std::ops::Range<usize>> = Vec::new();
    for i in 0..rows.len() {
        match blocks.last_mut() {
            Some(b)
                if b.len() < block_rows
                    && rows[b.start].seq == rows[i].seq
                    && positions(b.start).start == positions(i).start =>
            {
                b.end = i + 1
            }
            _ => blocks.push(i..i + 1),
        }
    }
    if blocks.len() * s.n_head_kv >= 2 * pool.n_threads() {
        pool.run(blocks.len() * s.n_head_kv, &|task| {
            let (block, kv_head) = (&blocks[task / s.n_head_kv], task % s.n_head_kv);
            let n = block.len();
            let mut totals = vec![0f32; n * part_len];
            let mut next = vec![0f32; n * part_len];
            // Spans that every row of the block sees whole.
            let shared = block.clone().map(|i| positions(i).len()).min().unwrap_or(0) / SPAN;
            let mut block_queries = Vec::new();
            if n > 1 && shared > 0 {
                for i in block.clone() {
                    block_queries.extend_from_slice(queries(i, kv_head));
                }
            }
            for k in 0..block.clone().map(spans).max().unwrap_or(0) {
                let part = if k == 0 { &mut totals } else { &mut next };
                if n > 1 && k < shared {
                    let cache = &caches[rows[block.start].seq];
                    let first = positions(block.start).start + k * SPAN;
                    span_partials(
                        kernels,
                        cache.keys(layer, first..first + SPAN),
                        cache.values(layer, first..first + SPAN),
                        &block_queries,
                        s,
                        kv_head,
                        cache.k_width(layer),
                        cache.v_width(layer),
                        part,
                    );
                } else {
                    for (r, i) in block.clone().enumerate() {
                        if k < spans(i) {
                            span(i, kv_head, k, &mut part[r * part_len..][..part_len]);
                        }
                    }
                }
                if k > 0 {
                    for (r, i) in block.clone().enumerate() {
                        if k < spans(i) {
                            merge_partials(
                                &mut totals[r * part_len..][..part_len],
                                &next[r * part_len..][..part_len],
                                s.head_dim_v,
                            );
                        }
                    }
                }
            }
            for (r, i) in block.clone().enumerate() {
                finish(i, kv_head, &totals[r * part_len..][..part_len]);
            }
        });
        return;
    }
    // One task a span: each pair's spans' partials side by side, then merged.
    let spans_of_pair = |pair: usize| spans(pair / s.n_head_kv);
    let first_span: Vec<usize> = (0..n_pairs)
        .scan(0, |at, pair| {
            let first = *at;
            *at += spans_of_pair(pair);
            Some(first)
        })
        .collect();
    let n_spans = first_span
        .last()
        .map_or(0, |&f| f + spans_of_pair(n_pairs - 1));
    let mut partials = vec![0f32; n_spans * part_len];
    let shared = Shared::new(&mut partials);
    pool.run(n_spans, &|task| {
        let pair = first_span.partition_point(|&f| f <= task) - 1;
        let (i, kv_head) = (pair / s.n_head_kv, pair % s.n_head_kv);
        // SAFETY: span `task`'s partials belong to this task alone.
        let part = unsafe { shared.slice(task * part_len, part_len) };
        span(i, kv_head, task - first_span[pair], part);
    });
    pool.run(n_pairs, &|pair| {
        let first = first_span[pair];
        let mut total = partials[first * part_len..][..part_len].to_vec();
        for k in 1..spans_of_pair(pair) {
            merge_partials(
                &mut total,
                &partials[(first + k) * part_len..][..part_len],
                s.head_dim_v,
            );
        }
        finish(pair / s.n_head_kv, pair % s.n_head_kv, &total);
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Yarn;

    #[test]
    fn rms_norm_makes_unit_rms_before_the_weight() {
        let mut x = vec![3.0, -4.0, 0.0, 0.0];
        rms_norm(&mut x, &[1.0, 1.0, 2.0, 1.0], 0.0);
        // mean of squares (9 + 16) / 4 = 6.25, rms 2.5
        assert_eq!(x, vec![1.2, -1.6, 0.0, 0.0]);
    }

    #[test]
    fn rope_at_position_zero_is_the_identity_and_pairs_follow_the_mode() {
        let rope = Rope {
            mode: RopeMode::Neox,
            dims: 4,
            freq_base: 10000.0,
            freq_scale: 1.0,
            freq_factors: None,
            yarn: None,
        };
        let table = RopeTable::new(&rope, None);
        let (cos, sin) = table.angles(0);
        let mut head = vec![1.0, 2.0, 3.0, 4.0, 5.0];
        rotate(&mut head, RopeMode::Neox, &cos, &sin);
        assert_eq!(head, vec![1.0, 2.0, 3.0, 4.0, 5.0]);
        // position 1, first pair rotates by 1 radian: NEOX pairs (0, 2), NORMAL pairs (0, 1)
        let (cos, sin) = table.angles(1);
        let mut neox = vec![1.0, 0.0, 0.0, 0.0];
        rotate(&mut neox, RopeMode::Neox, &cos, &sin);
        assert!((neox[0] - 1f32.cos()).abs() < 1e-6 && (neox[2] - 1f32.sin()).abs() < 1e-6);
        let mut normal = vec![1.0, 0.0, 0.0, 0.0];
        rotate(&mut normal, RopeMode::Normal, &cos, &sin);
        assert!((normal[0] - 1f32.cos()).abs() < 1e-6 && (normal[1] - 1f32.sin()).abs() < 1e-6);
    }

    #[test]
    fn step_angles_are_each_positions_angles_and_serve_only_their_own() {
        let rope = |freq_base| Rope {
            mode: RopeMode::Neox,
            dims: 8,
            freq_base,
            freq_scale: 1.0,
            freq_factors: None,
            yarn: None,
        };
        let table = RopeTable::new(&rope(10000.0), None);
        let positions = vec![7, 3, 1000];
        let angles = StepAngles::new(table.clone(), positions.clone());
        for (j, &pos) in positions.iter().enumerate() {
            let (cos, sin) = table.angles(pos);
            assert_eq!(angles.row(j), (&cos[..], &sin[..]));
        }
        assert!(angles.serves(&table, positions.iter().copied()));
        assert!(!angles.serves(&table, [7, 3, 1001].into_iter()));
        assert!(!angles.serves(&table, [7, 3].into_iter()));
        let other = RopeTable::new(&rope(1e6), None);
        assert!(!angles.serves(&other, positions.iter().copied()));
    }

    #[test]
    fn rms_normalize_makes_unit_rms_without_a_weight() {
        // ggml_rms_norm: x / sqrt(mean(x²) + eps); mean of squares of (3,
        // −4, 0, 0) is 6.25.
        let mut x = vec![3.0, -4.0, 0.0, 0.0];
        rms_normalize(&mut x, 0.0);
        assert_eq!(x, vec![1.2, -1.6, 0.0, 0.0]);
    }

    #[test]
    fn soft_cap_is_cap_times_tanh_of_x_over_cap() {
        // llama.cpp's final logit soft-capping (src/models/gemma4.cpp):
        // scale by 1/c, tanh, scale by c. At c = 10: 10 · tanh(0.5) =
        // 4.6211716, 10 · tanh(−3) = −9.9505475, 10 · tanh(0.01) =
        // 0.0999967, and large values stop at the cap.
        let mut x = vec![5.0, -30.0, 0.1, 1000.0];
        soft_cap(&mut x, 10.0);
        for (got, want) in x.iter().zip([4.621_172, -9.950_548, 0.099_996_67, 10.0]) {
            assert!((got - want).abs() < 1e-6, "{x:?}");
        }
    }

    #[test]
    fn proportional_rope_turns_only_the_pairs_whose_factor_is_one() {
        // Gemma 4's full-attention RoPE as llama.cpp runs it: ggml's NEOX
        // rope over the whole head (here 128 dimensions, base 10^6) with
        // `rope_freqs` dividing each pair's angle; its converter writes 1
        // for the first quarter of the pairs and 1e30 for the others, so
        // that only those turn. θ_i = p · 10^6^(−2i/128) / f_i at p = 100:
        // pair 0 turns 100 rad (cos 0.8623189, sin −0.5063656), pair 8
        // 17.782794 (0.4829622, −0.8756412), pair 15 3.9241898
        // (−0.7090847, −0.7051234); pairs 16 to 63 turn by under 1e-29.
        let factors: Vec<f32> = (0..64).map(|i| if i < 16 { 1.0 } else { 1e30 }).collect();
        let rope = Rope {
            mode: RopeMode::Neox,
            dims: 128,
            freq_base: 1e6,
            freq_scale: 1.0,
            freq_factors: None,
            yarn: None,
        };
        let table = RopeTable::new(&rope, Some(&factors));
        let (cos, sin) = table.angles(100);
        let turned = [
            (0, 0.862_318_9, -0.506_365_6),
            (8, 0.482_962_2, -0.875_641_2),
            (15, -0.709_084_7, -0.705_123_4),
        ];
        for (i, c, s) in turned {
            let mut head = vec![0f32; 128];
            head[i] = 1.0;
            rotate(&mut head, RopeMode::Neox, &cos, &sin);
            assert!(
                (head[i] - c).abs() < 1e-6 && (head[i + 64] - s).abs() < 1e-6,
                "pair {i}"
            );
        }
        let mut head: Vec<f32> = (0..128).map(|i| i as f32 - 60.0).collect();
        let before = head.clone();
        rotate(&mut head, RopeMode::Neox, &cos, &sin);
        for i in (16..64).flat_map(|i| [i, i + 64]) {
            assert!((head[i] - before[i]).abs() < 1e-20, "dimension {i}");
        }
    }

    #[test]
    fn attention_of_a_prompts_rows_in_blocks_equals_each_row_alone() {
        // Two sequences (one at a long context, one short) and a sliding
        // window, so that blocks share whole spans, hold rows of one
        // sequence only, and fall back to row by row where starts differ.
        let (n_head, n_head_kv, dk, dv) = (6, 2, 64, 48);
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            (rng >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        };
        let n_ctx = 1100;
        let mut caches = [
            KvCache::new(n_ctx, 1, n_head_kv * dk, n_head_kv * dv).unwrap(),
            KvCache::new(n_ctx, 1, n_head_kv * dk, n_head_kv * dv).unwrap(),
        ];
        for cache in &mut caches {
            for pos in 0..n_ctx {
                let k: Vec<f32> = (0..n_head_kv * dk).map(|_| next()).collect();
                let v: Vec<f32> = (0..n_head_kv * dv).map(|_| next()).collect();
                cache.store(0, pos, &k, &v);
            }
        }
        let mut rows: Vec<SeqPos> = (1000..1019).map(|pos| SeqPos { seq: 0, pos }).collect();
        rows.extend((3..9).map(|pos| SeqPos { seq: 1, pos }));
        rows.extend((1050..1060).map(|pos| SeqPos { seq: 0, pos }));
        let q: Vec<f32> = (0..rows.len() * n_head * dk).map(|_| next()).collect();
        let (q_width, o_width) = (n_head * dk, n_head * dv);
        let sink_values: Vec<f32> = (0..n_head).map(|_| 4.0 * next()).collect();
        let cases = [None, Some(700)]
            .into_iter()
            .flat_map(|window| [(window, None), (window, Some(&sink_values[..]))]);
        for (window, sinks) in cases {
            let s = AttentionShape {
                n_head,
                n_head_kv,
                head_dim_k: dk,
                head_dim_v: dv,
                window,
                scale: 0.125,
                sinks: None,
            };
            let refs: Vec<&mut KvCache> = caches.iter_mut().collect();
            for kernels in crate::quant::Isa::all_available()
                .into_iter()
                .filter_map(Kernels::for_isa)
            {
                let one = ThreadPool::new(1);
                let mut alone = vec![0f32; rows.len() * o_width];
                for (i, row) in rows.iter().enumerate() {
                    attention(
                        &one,
                        kernels,
                        &refs,
                        0,
                        &q[i * q_width..(i + 1) * q_width],
                        std::slice::from_ref(row),
                        &s,
                        sinks,
                        &mut alone[i * o_width..(i + 1) * o_width],
                    );
                }
                for threads in [1, 2, 3] {
                    let pool = ThreadPool::new(threads);
                    let mut together = vec![f32::NAN; rows.len() * o_width];
                    attention(
                        &pool,
                        kernels,
                        &refs,
                        0,
                        &q,
                        &rows,
                        &s,
                        sinks,
                        &mut together,
                    );
                    let same = together
                        .iter()
                        .zip(&alone)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(
                        same,
                        "{window:?}, sinks {}, {threads} threads",
                        sinks.is_some()
                    );
                }
            }
        }
    }

    /// One row over a cache of `keys` (each a first coordinate, the rest 0)
    /// and `values` (rows of 64), two query heads sharing one KV head.
    fn attend_one_row(
        queries: [f32; 2],
        keys: &[f32],
        values: &[Vec<f32>],
        sinks: [f32; 2],
    ) -> Vec<f32> {
        let d = 64;
        let mut cache = KvCache::new(keys.len(), 1, d, d).unwrap();
        for (pos, (&k, v)) in keys.iter().zip(values).enumerate() {
            let mut key = vec![0f32; d];
            key[0] = k;
            cache.store(0, pos, &key, v);
        }
        let mut q = vec![0f32; 2 * d];
        q[0] = queries[0];
        q[d] = queries[1];
        let shape = AttentionShape {
            n_head: 2,
            n_head_kv: 1,
            head_dim_k: d,
            head_dim_v: d,
            window: None,
            scale: 1.0,
            sinks: None,
        };
        let row = SeqPos {
            seq: 0,
            pos: keys.len() - 1,
        };
        let mut out = vec![f32::NAN; 2 * d];
        attention(
            &ThreadPool::new(2),
            Kernels::best(),
            &[&mut cache],
            0,
            &q,
            &[row],
            &shape,
            Some(&sinks),
            &mut out,
        );
        out
    }

    #[test]
    fn attention_sinks_join_the_softmax_without_a_value() {
        // ggml's soft_max with sinks (ggml-cpu ops.cpp): max = max(max
        // score, sink), sum = Σ e^(score − max) + e^(sink − max), weight =
        // e^(score − max) / sum; the same as e^score / (Σ e^score + e^sink).
        // Three positions with one-hot values, so that the output is the
        // weights. Head 0: scores 0, 1, 2 and sink 1.5 (below the largest
        // score): weights 1, e, e² over 1 + e + e² + e^1.5 = 0.064148,
        // 0.174371, 0.473991. Head 1: scores 0, 0.5, 1 and sink 3 (above
        // every score): 1, e^0.5, e over 1 + e^0.5 + e + e³ = 0.039289,
        // 0.064776, 0.106798.
        let one_hot = |i: usize| {
            let mut v = vec![0f32; 64];
            v[i] = 1.0;
            v
        };
        let values: Vec<Vec<f32>> = (0..3).map(one_hot).collect();
        let out = attend_one_row([1.0, 0.5], &[0.0, 1.0, 2.0], &values, [1.5, 3.0]);
        let expected: [[f64; 3]; 2] = [
            [0.064_147_685, 0.174_371_488, 0.473_990_846],
            [0.039_288_810, 0.064_776_296, 0.106_798_057],
        ];
        for (h, want) in expected.iter().enumerate() {
            for (p, &w) in want.iter().enumerate() {
                let got = f64::from(out[h * 64 + p]);
                assert!(
                    (got - w).abs() < 1e-6,
                    "head {h} position {p}: {got} vs {w}"
                );
            }
            assert!(out[h * 64 + 3..(h + 1) * 64].iter().all(|&v| v == 0.0));
        }
    }

    #[test]
    fn an_attention_sink_joins_a_long_history_once() {
        // 600 positions (three spans of `SPAN`) of equal scores and a sink
        // of ln 2 (e^sink = 2): each position weighs 1 / (600 + 2), and the
        // 200 positions holding each one-hot value add up to 200 / 602 =
        // 0.332226, whatever the span merging did.
        let values: Vec<Vec<f32>> = (0..600)
            .map(|p| {
                let mut v = vec![0f32; 64];
                v[p % 3] = 1.0;
                v
            })
            .collect();
        let ln2 = std::f32::consts::LN_2;
        let out = attend_one_row([1.0, 1.0], &[0.0; 600], &values, [ln2, ln2]);
        for h in 0..2 {
            for j in 0..3 {
                let got = out[h * 64 + j];
                assert!(
                    (got - 0.332_225_9).abs() < 1e-5,
                    "head {h} value {j}: {got}"
                );
            }
        }
    }

    #[test]
    fn yarn_angles_follow_ggmls_ramp_and_magnitude() {
        // gpt-oss-20b's RoPE: 64 dimensions, base 150000, YaRN factor 32
        // from a context of 4096, β 32 and 1, and llama.cpp's attention
        // factor for it, (1 + 0.1 ln 32) / (1 + 0.1 ln 32) = 1.
        let rope = Rope {
            mode: RopeMode::Neox,
            dims: 64,
            freq_base: 150_000.0,
            freq_scale: 1.0 / 32.0,
            freq_factors: None,
            yarn: Some(Yarn {
                orig_ctx: 4096,
                beta_fast: 32.0,
                beta_slow: 1.0,
                attn_factor: 1.0,
            }),
        };
        // ggml_rope_yarn_corr_dims: 64 · ln(4096 / (β · 2π)) / (2 ln 150000)
        // is 8.093 for β = 32 (down to 8) and 17.398 for β = 1 (up to 18).
        let yarn = rope.yarn.unwrap();
        assert_eq!(yarn.ramp(rope.dims, rope.freq_base), [8.0, 18.0]);
        // rope_yarn: pairs up to 8 keep θ = p · 150000^(−2i/64), pairs from
        // 18 take θ / 32, pair 13 sits half way up the ramp: θ · (0.5 / 32 +
        // 0.5); cos and sin are scaled by 1 + 0.1 ln 32 = 1.346574. At
        // position 1000 the angles of pairs 0, 8, 13, 18 and 31 are 1000,
        // 50.81327, 4.069555, 0.03830881 and 0.0003023511:
        let table = RopeTable::new(&rope, None);
        let (cos, sin) = table.angles(1000);
        let expected = [
            (0, 0.757_284_8, 1.113_454_2),
            (8, 1.149_538, 0.701_300_8),
            (13, -0.807_225_6, -1.077_797_4),
            (18, 1.345_585_6, 0.051_573_02),
            (31, 1.346_573_5, 0.000_407_138_06),
        ];
        for (i, c, s) in expected {
            assert!((cos[i] - c).abs() < 2e-6, "pair {i}: cos {} vs {c}", cos[i]);
            assert!((sin[i] - s).abs() < 2e-6, "pair {i}: sin {} vs {s}", sin[i]);
        }
    }
}
