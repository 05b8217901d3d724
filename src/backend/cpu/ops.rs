//! The CPU's element-wise and attention operations, on f32 slices. They follow
//! ggml's definitions (RMS over f64 sums, RoPE angles, tanh-GELU), computed
//! exactly rather than from ggml's f16 lookup tables.

use half::f16;
use half::slice::HalfFloatSliceExt;

use super::ThreadPool;
use crate::backend::{AttentionShape, Rope, RopeMode, SeqPos};
use crate::kv_cache::KvCache;

/// x ← x / rms(x) · w.
pub fn rms_norm(x: &mut [f32], w: &[f32], eps: f32) {
    let sum: f64 = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
    let mean = (sum / x.len() as f64) as f32;
    let scale = 1.0 / (mean + eps).sqrt();
    x.iter_mut().zip(w).for_each(|(v, &w)| *v = *v * scale * w);
}

/// e^x within 3e-7 relative (two f32 ulps), in straight-line f32 arithmetic that the
/// compiler vectorizes (libm's `expf` is a call per value; the activations
/// of a prompt are millions of values).
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    const LOG2_E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split so that n · LN2_HI is exact for the n that occur.
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    // Beyond these e^x is 0 or infinite in f32 anyway.
    let x = x.clamp(-87.0, 88.0);
    let n = crate::quant::q8::round_small(x * LOG2_E);
    let r = x - n * LN2_HI - n * LN2_LO;
    // Taylor series of e^r for |r| ≤ ln 2 / 2: the next term is < 1.3e-7.
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    f32::from_bits(((n as i32 + 127) as u32) << 23) * p
}

#[inline(always)]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + exp(-x))
}

/// GELU with the tanh approximation, as ggml and Gemma use:
/// ½x(1 + tanh y) written as x / (1 + e^{−2y}), which has no cancellation.
#[inline(always)]
pub fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    const COEF_A: f32 = 0.044715;
    let y = SQRT_2_OVER_PI * x * (1.0 + COEF_A * x * x);
    x / (1.0 + exp(-2.0 * y))
}

/// out = act(gate) · up, element by element.
#[inline(always)]
pub fn gated(out: &mut [f32], gate: &[f32], up: &[f32], act: impl Fn(f32) -> f32) {
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = act(g) * u;
    }
}

/// The inverse frequencies of one layer's RoPE.
pub struct RopeTable {
    inv_freq: Vec<f64>,
    freq_scale: f64,
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
        RopeTable {
            inv_freq,
            freq_scale: f64::from(rope.freq_scale),
        }
    }

    /// cos and sin of every pair's angle at position `pos`.
    pub fn angles(&self, pos: usize) -> (Vec<f32>, Vec<f32>) {
        let p = pos as f64 * self.freq_scale;
        self.inv_freq
            .iter()
            .map(|&f| ((p * f).cos() as f32, (p * f).sin() as f32))
            .unzip()
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

/// The writable output, shared by tasks that write disjoint heads.
struct Out(*mut f32, usize);
// SAFETY: every task writes only the slice of its own (row, kv head) group,
// and the pool joins all tasks before `attention` returns.
unsafe impl Sync for Out {}

impl Out {
    /// # Safety
    /// No other task writes `start..start + src.len()` during the loop.
    unsafe fn write(&self, start: usize, src: &[f32]) {
        assert!(start + src.len() <= self.1);
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.0.add(start), src.len()) };
    }
}

/// Causal attention over each row's cache, one task per (row, KV head): the
/// query heads sharing a KV head read its keys and values once.
pub fn attention(
    pool: &ThreadPool,
    caches: &[&mut KvCache],
    layer: usize,
    q: &[f32],
    rows: &[SeqPos],
    s: &AttentionShape,
    out: &mut [f32],
) {
    let group = s.n_head / s.n_head_kv;
    let (q_width, o_width) = (s.n_head * s.head_dim_k, s.n_head * s.head_dim_v);
    assert!(q.len() >= rows.len() * q_width && out.len() >= rows.len() * o_width);
    let out = Out(out.as_mut_ptr(), out.len());
    pool.run(rows.len() * s.n_head_kv, &|task| {
        let (i, kv_head) = (task / s.n_head_kv, task % s.n_head_kv);
        let row = rows[i];
        let cache = &caches[row.seq];
        let first = s.window.map_or(0, |w| (row.pos + 1).saturating_sub(w));
        let positions = first..row.pos + 1;
        let keys = cache.keys(layer, positions.clone());
        let values = cache.values(layer, positions.clone());
        let heads = kv_head * group..(kv_head + 1) * group;
        let n = positions.len();
        let mut scores = vec![0f32; n * group];
        let mut k = vec![0f32; s.head_dim_k];
        for j in 0..n {
            let key =
                &keys[j * cache.k_width()..][kv_head * s.head_dim_k..(kv_head + 1) * s.head_dim_k];
            key.convert_to_f32_slice(&mut k);
            for (g, h) in heads.clone().enumerate() {
                let qh = &q[i * q_width + h * s.head_dim_k..][..s.head_dim_k];
                scores[g * n + j] = dot(qh, &k) * s.scale;
            }
        }
        for g in 0..group {
            softmax(&mut scores[g * n..(g + 1) * n]);
        }
        let mut acc = vec![0f32; group * s.head_dim_v];
        let mut v = vec![0f32; s.head_dim_v];
        for j in 0..n {
            let value: &[f16] = &values[j * cache.v_width()..]
                [kv_head * s.head_dim_v..(kv_head + 1) * s.head_dim_v];
            value.convert_to_f32_slice(&mut v);
            for g in 0..group {
                let p = scores[g * n + j];
                acc[g * s.head_dim_v..(g + 1) * s.head_dim_v]
                    .iter_mut()
                    .zip(&v)
                    .for_each(|(a, &x)| *a += p * x);
            }
        }
        // SAFETY: heads `heads` of row `i` belong to this task alone.
        unsafe { out.write(i * o_width + heads.start * s.head_dim_v, &acc) };
    });
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    // Eight partial sums let the compiler vectorize.
    let mut partial = [0f32; 8];
    let chunks = a.len() / 8 * 8;
    for (ca, cb) in a[..chunks].chunks_exact(8).zip(b[..chunks].chunks_exact(8)) {
        for k in 0..8 {
            partial[k] += ca[k] * cb[k];
        }
    }
    let tail: f32 = a[chunks..]
        .iter()
        .zip(&b[chunks..])
        .map(|(x, y)| x * y)
        .sum();
    partial.iter().sum::<f32>() + tail
}

fn softmax(x: &mut [f32]) {
    let max = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    let mut sum = 0f64;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += f64::from(*v);
    }
    let inv = (1.0 / sum) as f32;
    x.iter_mut().for_each(|v| *v *= inv);
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn exp_is_within_two_ulps_of_the_exact_value() {
        let mut worst = 0f64;
        let mut x = -87.0f32;
        while x < 88.0 {
            let exact = f64::from(x).exp();
            worst = worst.max((f64::from(exp(x)) - exact).abs() / exact);
            x += 0.0137;
        }
        assert!(worst < 3e-7, "worst relative error {worst:e}");
        assert_eq!(exp(-1000.0), exp(-87.0));
        assert!(exp(1000.0).is_finite());
    }

    #[test]
    fn activations_match_their_definitions() {
        for x in [-20.0f32, -3.0, -1.0, -0.001, 0.0, 0.3, 1.0, 3.0, 20.0] {
            let xd = f64::from(x);
            let silu_exact = xd / (1.0 + (-xd).exp());
            let gelu_exact = 0.5
                * xd
                * (1.0 + (0.797_884_560_802_865_4 * xd * (1.0 + 0.044715 * xd * xd)).tanh());
            assert!(
                (f64::from(silu(x)) - silu_exact).abs() <= 1e-6 * silu_exact.abs().max(1e-3),
                "silu({x})"
            );
            assert!(
                (f64::from(gelu_tanh(x)) - gelu_exact).abs() <= 1e-6 * gelu_exact.abs().max(1e-3),
                "gelu({x})"
            );
        }
    }
}
