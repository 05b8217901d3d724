//! Activations quantized to 8 bits for the integer dot products.
//!
//! llama.cpp's CPU path does the same (Q8_0 / Q8_K activations): a row of
//! activations is cut into blocks of 32, each stored as a scale `d` and 32
//! signed bytes with `x ≈ d · q`, `|q| ≤ 127`. The dot product of a quantized
//! weight row with such a row is then integer arithmetic per block, scaled
//! once. Rounding each activation to the nearest multiple of `d` moves it by
//! at most `d / 2 = amax / 254` of its block's largest magnitude, which bounds
//! how far these dots land from the exact f32 ones (`dot_error_bound`).

/// 32 activations as `d · qs[i]`, with the sums of each half of `qs` that the
/// weight formats with an offset (Q4_1, Q5_1, the K-quants' minimums) need.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[repr(C)]
pub struct Q8Block {
    pub d: f32,
    /// d · Σ qs: what a weight block's minimum or offset multiplies.
    pub d_sum: f32,
    /// Sums of `qs[0..16]` and `qs[16..32]`.
    pub half_sums: [i16; 2],
    pub qs: [i8; 32],
}

impl Q8Block {
    pub fn sum(&self) -> i32 {
        i32::from(self.half_sums[0]) + i32::from(self.half_sums[1])
    }
}

pub(crate) const Q8_BLOCK: usize = 32;

/// How llama.cpp stores the scales of the activation blocks a weight
/// format's dots take (ggml-cpu's `vec_dot_type`), which ours mirror:
/// rounding the scales as llama.cpp does matters on small random models,
/// where the difference between f32 and f16 scales alone carried qwen35's
/// Q8_0 logits past a 2% 95th percentile against llama.cpp's.
/// The CUDA backend's prepare kernels take the same choice as an `int`
/// (`M40ActivationScales` in cuda/q8.cuh, these discriminants).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
pub enum ActivationScales {
    /// f32 scales, one a block of 32: formats without integer dots.
    F32 = 0,
    /// Q8_0: `d` made in f32 (the codes round with it) and stored as f16.
    Q8_0 = 1,
    /// Q8_1: `d` as Q8_0's, and `s` = d · Σq made in f32 and stored as f16.
    Q8_1 = 2,
    /// Q8_K (the K-quants and IQ4_XS): one f32 scale for each 256 values,
    /// from their value of largest magnitude (`quantize_row_q8_k`); every
    /// block of 32 of the 256 carries it (as in the CUDA kernels, whose
    /// prepare and conversion blocks find it for their 256 values).
    Q8K = 3,
}

/// Rounds the blocks' scales as `scales` says (the codes are unchanged);
/// Q8K's, made by `quantize_row_q8_k`, stay as they are.
pub fn round_scales(blocks: &mut [Q8Block], scales: ActivationScales) {
    if matches!(scales, ActivationScales::F32 | ActivationScales::Q8K) {
        return;
    }
    let f16 = |v: f32| half::f16::from_f32(v).to_f32();
    for b in blocks {
        b.d = f16(b.d);
        b.d_sum = match scales {
            ActivationScales::Q8_1 => f16(b.d_sum),
            _ => b.d * b.sum() as f32,
        };
    }
}

/// Quantizes `x` (a multiple of 32 long) into `out` (one block per 32 values).
pub fn quantize_row_q8(x: &[f32], out: &mut [Q8Block]) {
    debug_assert_eq!(x.len(), out.len() * Q8_BLOCK);
    for (block, xs) in out.iter_mut().zip(x.chunks_exact(Q8_BLOCK)) {
        *block = quantize_block(xs);
    }
}

/// Values in a Q8_K block: one activation scale each.
pub const Q8K_BLOCK: usize = 256;

/// Quantizes `x` (a multiple of 256 long) as llama.cpp's Q8_K does
/// (`quantize_row_q8_K_ref`, which its x86 build runs too), into blocks of
/// 32 (`out`, one per 32 values): each 256 values share d = 1 / (−127 / m),
/// m their value of largest magnitude (the first, in a tie), and each value
/// becomes min(127, round(v · (−127 / m))), ties to even; d is negative
/// where m is positive, and a block of zeros has d = 0.
pub fn quantize_row_q8_k(x: &[f32], out: &mut [Q8Block]) {
    debug_assert_eq!(x.len(), out.len() * Q8_BLOCK);
    debug_assert_eq!(x.len() % Q8K_BLOCK, 0);
    for (blocks, xs) in out
        .chunks_exact_mut(Q8K_BLOCK / Q8_BLOCK)
        .zip(x.chunks_exact(Q8K_BLOCK))
    {
        // The largest magnitude, then the first value that has it (the
        // two loops vectorize where llama.cpp's one does not).
        let amax = xs.iter().fold(0.0f32, |m, &v| m.max(v.abs()));
        let (iscale, d) = match xs.iter().find(|v| v.abs() == amax) {
            Some(&max) if amax != 0.0 => {
                let iscale = -127.0 / max;
                (iscale, 1.0 / iscale)
            }
            _ => (0.0, 0.0),
        };
        for (block, xs) in blocks.iter_mut().zip(xs.chunks_exact(Q8_BLOCK)) {
            let mut qs = [0i8; 32];
            for (q, &v) in qs.iter_mut().zip(xs) {
                *q = round_small(v * iscale).min(127.0) as i8;
            }
            *block = with_sums(d, qs);
        }
    }
}

/// `x` rounded to the nearest integer, ties to even, for |x| < 2^22: adding
/// and removing 1.5·2^23 leaves no fraction bits. Unlike `round_ties_even`
/// (a libm call on baseline x86-64) it vectorizes.
#[inline(always)]
pub(crate) fn round_small(x: f32) -> f32 {
    const SHIFT: f32 = 12_582_912.0;
    (x + SHIFT) - SHIFT
}

fn quantize_block(xs: &[f32]) -> Q8Block {
    let amax = xs.iter().fold(0.0f32, |m, &v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut qs = [0i8; 32];
    for (q, &v) in qs.iter_mut().zip(xs) {
        // Round to nearest, ties to even (ggml's SIMD quantizers round the
        // same way; its scalar one rounds ties away).
        *q = round_small(v * id) as i8;
    }
    with_sums(d, qs)
}

/// The block of codes `qs` at scale `d`, with its sums.
fn with_sums(d: f32, qs: [i8; 32]) -> Q8Block {
    let half = |h: &[i8]| h.iter().map(|&q| i16::from(q)).sum::<i16>();
    let half_sums = [half(&qs[..16]), half(&qs[16..])];
    let d_sum = d * (i32::from(half_sums[0]) + i32::from(half_sums[1])) as f32;
    Q8Block {
        d,
        d_sum,
        half_sums,
        qs,
    }
}

/// How far a dot with activations quantized as `scales` says can land from
/// the dot with the exact `x`, for weights `w` (dequantized): the
/// activations are quantized here as the CPU quantizes them, and each
/// block's rounding is bounded by Σ |w| · |x − d · q| over its values, with
/// `d` stored as `scales` stores it, so that an f16 scale's rounding counts
/// as much as it moves (a block whose largest magnitude is under
/// 127 · 2^−25 gets d = 0 in f16, as in llama.cpp, and loses its whole
/// dot). Q8_1's sum term, rounded to f16
/// on its own, adds the largest |w| of its block (a weight block's offset
/// is one of its values) times that rounding. 0.1% of the bound, and 10^−5
/// of Σ |w · x|, allow for the f32 sums.
pub fn dot_error_bound(scales: ActivationScales, w: &[f32], x: &[f32]) -> f64 {
    let mut blocks = vec![Q8Block::default(); x.len() / Q8_BLOCK];
    if scales == ActivationScales::Q8K {
        quantize_row_q8_k(x, &mut blocks);
    } else {
        quantize_row_q8(x, &mut blocks);
    }
    round_scales(&mut blocks, scales);
    let rounding: f64 = w
        .chunks(Q8_BLOCK)
        .zip(x.chunks(Q8_BLOCK))
        .zip(&blocks)
        .map(|((wb, xb), b)| {
            let values: f64 = wb
                .iter()
                .zip(xb)
                .zip(&b.qs)
                .map(|((&wv, &xv), &q)| {
                    let moved = f64::from(xv) - f64::from(b.d) * f64::from(q);
                    f64::from(wv).abs() * moved.abs()
                })
                .sum();
            let sum_term = if scales == ActivationScales::Q8_1 {
                let largest = wb.iter().fold(0f64, |m, &v| m.max(f64::from(v).abs()));
                let kept = f64::from(b.d) * f64::from(b.sum());
                largest * (f64::from(b.d_sum) - kept).abs()
            } else {
                0.0
            };
            values + sum_term
        })
        .sum();
    let magnitude: f64 = w.iter().zip(x).map(|(a, b)| (a * b).abs() as f64).sum();
    rounding * 1.001 + magnitude * 1e-5 + 1e-30
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_round_ties_to_even_and_keep_their_sums() {
        let mut x = [0.0f32; 32];
        x[0] = 127.0; // d = 1
        x[1] = 2.5;
        x[2] = -2.5;
        x[3] = -0.49;
        x[20] = -127.0;
        let mut out = [Q8Block::default()];
        quantize_row_q8(&x, &mut out);
        let b = out[0];
        assert_eq!(b.d, 1.0);
        assert_eq!(&b.qs[..4], &[127, 2, -2, 0]);
        assert_eq!(b.half_sums, [127, -127]);
        assert_eq!(b.sum(), 0);
    }

    /// ggml's quantize_row_q8_K_ref: one scale for 256 values from the
    /// first value of largest magnitude m, iscale = −127 / m, codes
    /// min(127, nearest(iscale · x)) and d = 1 / iscale, so that d is
    /// negative where m is positive; zeros give d = 0.
    #[test]
    fn q8_k_blocks_share_llama_cpps_scale_per_256_values() {
        let mut x: Vec<f32> = (0..512)
            .map(|i| ((i * 37) % 101) as f32 * 0.13 - 6.1)
            .collect();
        x[70] = 25.4; // the first 256's largest magnitude, positive
        x[300] = -31.75; // the second's, negative, ahead of an equal positive one
        x[301] = 31.75;
        x[5] = -25.4 * 0.5 / 127.0 * 3.0; // iscale · x = 1.5: a tie, to even
        let mut out = [Q8Block::default(); 16];
        quantize_row_q8_k(&x, &mut out);
        for (half, max) in [(0usize, 25.4f32), (1, -31.75)] {
            let iscale = -127.0f32 / max;
            for b in &out[half * 8..half * 8 + 8] {
                assert_eq!(b.d, 1.0 / iscale);
            }
            for (j, &v) in x[half * 256..half * 256 + 256].iter().enumerate() {
                let want = (v * iscale).round_ties_even().min(127.0) as i8;
                assert_eq!(out[half * 8 + j / 32].qs[j % 32], want, "value {j}");
            }
        }
        assert!(out[0].d < 0.0 && out[8].d > 0.0);
        assert_eq!(out[0].qs[5], 2);
        assert_eq!(out[2].qs[70 - 64], -127);
        assert_eq!(out[9].qs[300 - 288], -127);
        assert_eq!(out[9].qs[301 - 288], 127);
        let b = out[3];
        assert_eq!(b.d_sum, b.d * b.sum() as f32);
        let mut zeros = [Q8Block::default(); 8];
        quantize_row_q8_k(&[0.0; 256], &mut zeros);
        assert!(zeros.iter().all(|b| *b == Q8Block::default()));
    }

    #[test]
    fn round_small_rounds_to_nearest_with_ties_to_even() {
        for (x, r) in [
            (0.49, 0.0),
            (0.5, 0.0),
            (1.5, 2.0),
            (2.5, 2.0),
            (-2.5, -2.0),
            (-2.51, -3.0),
            (126.7, 127.0),
        ] {
            assert_eq!(round_small(x), r, "{x}");
            assert_eq!(round_small(x), x.round_ties_even());
        }
    }

    /// ggml's quantize_row_q8_0_ref and quantize_row_q8_1_ref: d = amax /
    /// 127 in f32, the codes round x / d, then `d` is stored as f16 and
    /// Q8_1's `s` as f16(Σq · d) with the f32 d.
    #[test]
    fn scales_round_as_llama_cpps_q8_0_and_q8_1_blocks_store_them() {
        let x: Vec<f32> = (0..32).map(|i| (i as f32 - 10.3) * 0.731).collect();
        let mut q = [Q8Block::default()];
        quantize_row_q8(&x, &mut q);
        let exact = q[0];
        let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        assert_eq!(exact.d, amax / 127.0);
        let f16 = |v: f32| half::f16::from_f32(v).to_f32();
        assert_ne!(
            f16(exact.d),
            exact.d,
            "a scale f16 cannot hold, so the test sees the rounding"
        );

        let mut q8_0 = [exact];
        round_scales(&mut q8_0, ActivationScales::Q8_0);
        assert_eq!(q8_0[0].qs, exact.qs);
        assert_eq!(q8_0[0].d, f16(exact.d));
        assert_eq!(q8_0[0].d_sum, f16(exact.d) * exact.sum() as f32);

        let mut q8_1 = [exact];
        round_scales(&mut q8_1, ActivationScales::Q8_1);
        assert_eq!(q8_1[0].d, f16(exact.d));
        assert_eq!(q8_1[0].d_sum, f16(exact.sum() as f32 * exact.d));

        let mut kept = [exact];
        round_scales(&mut kept, ActivationScales::F32);
        assert_eq!(kept[0], exact);
    }

    #[test]
    fn an_all_zero_block_has_zero_scale_and_codes() {
        let mut out = [Q8Block {
            d: 9.0,
            d_sum: 1.0,
            half_sums: [1, 1],
            qs: [1; 32],
        }];
        quantize_row_q8(&[0.0; 32], &mut out);
        assert_eq!(out[0], Q8Block::default());
    }

    #[test]
    fn the_error_bound_covers_the_rounding_of_every_activation() {
        let x: Vec<f32> = (0..64).map(|i| ((i * 37) % 23) as f32 - 11.3).collect();
        let w: Vec<f32> = (0..64).map(|i| ((i * 11) % 7) as f32 - 3.1).collect();
        let mut q = [Q8Block::default(); 2];
        quantize_row_q8(&x, &mut q);
        let rounded: f64 = q
            .iter()
            .flat_map(|b| b.qs.iter().map(move |&v| b.d as f64 * v as f64))
            .zip(&w)
            .map(|(xq, &wv)| xq * wv as f64)
            .sum();
        let exact: f64 = x.iter().zip(&w).map(|(&a, &b)| a as f64 * b as f64).sum();
        assert!((rounded - exact).abs() <= dot_error_bound(ActivationScales::F32, &w, &x));
    }
}
