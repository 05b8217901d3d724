//! The float formats F32, F16 and BF16: conversion to f32 (exact: every F16
//! and BF16 value is an f32 value) and dots with f32 activations, scalar
//! reference code. Float weights are not worth quantizing activations for:
//! their dots multiply in f32 and sum in f32.

use half::f16;

pub fn dequantize_f32(row: &[u8], out: &mut [f32]) {
    for (b, y) in row.chunks_exact(4).zip(out) {
        *y = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
}

/// The F16 value in the first two (little-endian) bytes of `b`.
pub fn f16_at(b: &[u8]) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32()
}

pub fn dequantize_f16(row: &[u8], out: &mut [f32]) {
    for (b, y) in row.chunks_exact(2).zip(out) {
        *y = f16_at(b);
    }
}

pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

pub fn dequantize_bf16(row: &[u8], out: &mut [f32]) {
    for (b, y) in row.chunks_exact(2).zip(out) {
        *y = bf16_to_f32(u16::from_le_bytes([b[0], b[1]]));
    }
}

/// Dots as sums of eight interleaved partial sums, the order the SIMD code
/// uses too, so that scalar and vector results stay close.
fn dot_with(row: &[u8], x: &[f32], width: usize, value: impl Fn(&[u8]) -> f32) -> f32 {
    let mut partial = [0.0f32; 8];
    for (i, (b, &xv)) in row.chunks_exact(width).zip(x).enumerate() {
        partial[i % 8] += value(b) * xv;
    }
    partial.iter().sum()
}

pub fn dot_f32(row: &[u8], x: &[f32]) -> f32 {
    dot_with(row, x, 4, |b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

pub fn dot_f16(row: &[u8], x: &[f32]) -> f32 {
    dot_with(row, x, 2, f16_at)
}

pub fn dot_bf16(row: &[u8], x: &[f32]) -> f32 {
    dot_with(row, x, 2, |b| bf16_to_f32(u16::from_le_bytes([b[0], b[1]])))
}

/// out[j] = row j · x for `out.len()` F16 rows of x.len() values, row j
/// starting at byte j · stride (attention's scores of one query).
pub fn f16_dots(rows: &[u8], stride: usize, x: &[f32], out: &mut [f32]) {
    for (j, o) in out.iter_mut().enumerate() {
        *o = dot_f16(&rows[j * stride..][..x.len() * 2], x);
    }
}

/// y += Σ_j a[j] · row j for `a.len()` F16 rows of y.len() values, row j
/// starting at byte j · stride (attention's weighted sum of values).
pub fn f16_axpys(rows: &[u8], stride: usize, a: &[f32], y: &mut [f32]) {
    for (j, &aj) in a.iter().enumerate() {
        let row = &rows[j * stride..][..y.len() * 2];
        for (b, y) in row.chunks_exact(2).zip(y.iter_mut()) {
            *y += aj * f16_at(b);
        }
    }
}

/// [`f16_dots`] for each of the `q.len() / dk` queries of `q` (dk values
/// each): `out[g · n + j]` = row j · query g, `n = out.len() / queries`.
pub fn f16_dots_many(rows: &[u8], stride: usize, q: &[f32], dk: usize, out: &mut [f32]) {
    let n = out.len() / (q.len() / dk).max(1);
    for (query, o) in q
        .chunks_exact(dk.max(1))
        .zip(out.chunks_exact_mut(n.max(1)))
    {
        f16_dots(rows, stride, query, o);
    }
}

/// [`f16_axpys`] for each of the `a.len() / n` weight vectors of `a` (n
/// each): `y_g += Σ_j a[g · n + j] · row j`, y_g the g-th of y's equal parts.
pub fn f16_axpys_many(rows: &[u8], stride: usize, a: &[f32], n: usize, y: &mut [f32]) {
    let dv = y.len() / (a.len() / n.max(1)).max(1);
    for (weights, y) in a.chunks_exact(n.max(1)).zip(y.chunks_exact_mut(dv.max(1))) {
        f16_axpys(rows, stride, weights, y);
    }
}

/// Softmax numerators in place, `L` lanes at a time: scores[i] becomes
/// e^(scale · scores[i] − max); returns (max, Σ), max = max_i scale ·
/// scores[i]. Written lane by lane so that the compiler keeps each lane's
/// maximum and sum in a vector register (a single running sum of floats
/// would be a serial chain).
#[inline(always)]
pub fn softmax_lanes<const L: usize>(scores: &mut [f32], scale: f32) -> (f32, f32) {
    let mut lane_max = [f32::NEG_INFINITY; L];
    let mut chunks = scores.chunks_exact_mut(L);
    for c in &mut chunks {
        for l in 0..L {
            c[l] *= scale;
            lane_max[l] = lane_max[l].max(c[l]);
        }
    }
    let mut max = lane_max.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    for x in chunks.into_remainder() {
        *x *= scale;
        max = max.max(*x);
    }
    let mut lane_sum = [0f32; L];
    let mut chunks = scores.chunks_exact_mut(L);
    for c in &mut chunks {
        for l in 0..L {
            c[l] = exp(c[l] - max);
            lane_sum[l] += c[l];
        }
    }
    let mut sum: f32 = lane_sum.iter().sum();
    for x in chunks.into_remainder() {
        *x = exp(*x - max);
        sum += *x;
    }
    (max, sum)
}

/// [`softmax_lanes`] for the portable build.
pub fn softmax(scores: &mut [f32], scale: f32) -> (f32, f32) {
    softmax_lanes::<4>(scores, scale)
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
    // n = x · log2 e rounded as `q8::round_small` rounds it: adding
    // 1.5 · 2^23 leaves n in the low bits of `shifted`, from which 2^n's
    // exponent is taken by integer arithmetic (a saturating `n as i32`
    // does not vectorize: it became a scalar conversion per lane).
    const SHIFT: f32 = 12_582_912.0;
    let x = x.clamp(-87.0, 88.0);
    let shifted = x * LOG2_E + SHIFT;
    let n = shifted - SHIFT;
    let r = x - n * LN2_HI - n * LN2_LO;
    // Taylor series of e^r for |r| ≤ ln 2 / 2: the next term is < 1.3e-7.
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    // |n| ≤ 127, so n + 127 is a biased exponent from 1 to 254.
    let biased = shifted
        .to_bits()
        .wrapping_sub(SHIFT.to_bits())
        .wrapping_add(127);
    f32::from_bits(biased << 23) * p
}

/// SiLU, x · σ(x).
#[inline(always)]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + exp(-x))
}

/// The logistic function, 1 / (1 + e^(−x)).
#[inline(always)]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
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

/// The slope and the clamp of gpt-oss's SwiGLU (llama.cpp's
/// `LLM_FFN_SWIGLU_OAI_MOE`: α = 1.702, limit = 7).
pub const SWIGLU_OAI_ALPHA: f32 = 1.702;
pub const SWIGLU_OAI_LIMIT: f32 = 7.0;

/// gpt-oss's clamped SwiGLU of one gate and up value, in the operations of
/// ggml's CPU `swiglu_oai`: the gate clamped from above only, the up value
/// both ways and offset by 1.
#[inline(always)]
pub fn swiglu_oai_value(gate: f32, up: f32) -> f32 {
    let x = gate.min(SWIGLU_OAI_LIMIT);
    let y = up.clamp(-SWIGLU_OAI_LIMIT, SWIGLU_OAI_LIMIT);
    x / (1.0 + exp(SWIGLU_OAI_ALPHA * -x)) * (y + 1.0)
}

/// out = act(gate) · up, element by element. Each element is computed on
/// its own, so every instruction set's build gives the same bits.
#[inline(always)]
pub fn gated(out: &mut [f32], gate: &[f32], up: &[f32], act: impl Fn(f32) -> f32) {
    gated_pairs(out, gate, up, |g, u| act(g) * u)
}

/// out = f(gate, up), element by element, as [`gated`].
#[inline(always)]
pub fn gated_pairs(out: &mut [f32], gate: &[f32], up: &[f32], f: impl Fn(f32, f32) -> f32) {
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = f(g, u);
    }
}

/// [`gated`] with [`silu`], for the portable build.
pub fn swiglu(out: &mut [f32], gate: &[f32], up: &[f32]) {
    gated(out, gate, up, silu)
}

/// [`gated`] with [`gelu_tanh`], for the portable build.
pub fn geglu(out: &mut [f32], gate: &[f32], up: &[f32]) {
    gated(out, gate, up, gelu_tanh)
}

/// [`gated_pairs`] with [`swiglu_oai_value`], for the portable build.
pub fn swiglu_oai(out: &mut [f32], gate: &[f32], up: &[f32]) {
    gated_pairs(out, gate, up, swiglu_oai_value)
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn swiglu_oai_clamps_as_ggml_does() {
        // ggml-cpu's swiglu_oai: x = min(gate, 7), y = clamp(up, −7, 7),
        // x / (1 + e^(−1.702 x)) · (y + 1). Values of that formula in f64:
        // no clamp; both clamped (gate 10 → 7, up −9 → −7); a negative gate
        // is not clamped from below; both at the limit; up = −1 cancels the
        // gate; only the up value clamped.
        let cases = [
            (2.0, 0.5, 2.903_487_934_716_312_5),
            (10.0, -9.0, -41.999_718_769_819_91),
            (-10.0, 3.0, -1.623_184_517_942_124_7e-6),
            (7.0, 7.0, 55.999_625_026_426_54),
            (-1.0, -1.0, 0.0),
            (0.5, 20.0, 2.803_107_492_851_041),
        ];
        for (gate, up, want) in cases {
            let got = f64::from(swiglu_oai_value(gate, up));
            assert!(
                (got - want).abs() <= 1e-6 * want.abs(),
                "swiglu_oai({gate}, {up}) = {got}, not {want}"
            );
        }
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
}
