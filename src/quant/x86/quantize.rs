//! Activations quantized to Q8 blocks in AVX2, bit-exact with the scalar
//! [`crate::quant::quantize_row_q8`] for finite input: the same scale and
//! inverse, products rounded to nearest with ties to even (`vcvtps2dq` in
//! the default rounding mode).

use std::arch::x86_64::*;

use crate::quant::Q8Block;

#[inline(always)]
unsafe fn hmax(v: __m256) -> f32 {
    let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)))
}

#[inline(always)]
unsafe fn hsum_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
    _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01)))
}

/// # Safety
/// The CPU supports AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn quantize_row_q8(x: &[f32], out: &mut [Q8Block]) {
    assert_eq!(x.len(), out.len() * 32, "a row of whole blocks");
    let magnitude = _mm256_set1_ps(-0.0);
    for (block, xs) in out.iter_mut().zip(x.chunks_exact(32)) {
        let v: [__m256; 4] =
            std::array::from_fn(|i| _mm256_loadu_ps(xs[i * 8..i * 8 + 8].as_ptr()));
        let abs = |v| _mm256_andnot_ps(magnitude, v);
        let amax = hmax(_mm256_max_ps(
            _mm256_max_ps(abs(v[0]), abs(v[1])),
            _mm256_max_ps(abs(v[2]), abs(v[3])),
        ));
        let d = amax / 127.0;
        let id = _mm256_set1_ps(if d != 0.0 { 1.0 / d } else { 0.0 });
        let q: [__m256i; 4] = std::array::from_fn(|i| _mm256_cvtps_epi32(_mm256_mul_ps(v[i], id)));
        store_block(q, d, block);
    }
}

/// A block's 32 codes (`q`, eight a vector, each within i8) and its scale d
/// into `block`, with its sums.
#[inline(always)]
unsafe fn store_block(q: [__m256i; 4], d: f32, block: &mut Q8Block) {
    // The packs interleave 128-bit lanes; the permutation puts the 4-byte
    // groups back in order.
    let bytes = _mm256_packs_epi16(
        _mm256_packs_epi32(q[0], q[1]),
        _mm256_packs_epi32(q[2], q[3]),
    );
    let bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(block.qs.as_mut_ptr().cast(), bytes);
    let h0 = hsum_i32(_mm256_add_epi32(q[0], q[1]));
    let h1 = hsum_i32(_mm256_add_epi32(q[2], q[3]));
    block.d = d;
    block.half_sums = [h0 as i16, h1 as i16];
    block.d_sum = d * (h0 + h1) as f32;
}

/// Q8_K's blocks ([`crate::quant::quantize_row_q8_k`]), bit-exact with it
/// for finite input: each 256 values' scale from their first value of
/// largest magnitude, the codes rounded to nearest with ties to even and
/// held to 127.
///
/// # Safety
/// The CPU supports AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn quantize_row_q8_k(x: &[f32], out: &mut [Q8Block]) {
    assert_eq!(x.len(), out.len() * 32, "a row of whole blocks");
    assert_eq!(x.len() % 256, 0, "a row of whole Q8_K blocks");
    let magnitude = _mm256_set1_ps(-0.0);
    let abs = |v| _mm256_andnot_ps(magnitude, v);
    let load = |xs: &[f32], i: usize| _mm256_loadu_ps(xs[i * 8..i * 8 + 8].as_ptr());
    for (blocks, xs) in out.chunks_exact_mut(8).zip(x.chunks_exact(256)) {
        let mut m = _mm256_setzero_ps();
        for i in 0..32 {
            m = _mm256_max_ps(m, abs(load(xs, i)));
        }
        let amax = hmax(m);
        let wide = _mm256_set1_ps(amax);
        let first = (0..32).find_map(|i| {
            let hits = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(abs(load(xs, i)), wide));
            (hits != 0).then(|| i * 8 + hits.trailing_zeros() as usize)
        });
        let (iscale, d) = match first {
            Some(at) if amax != 0.0 => {
                let iscale = -127.0 / xs[at];
                (iscale, 1.0 / iscale)
            }
            _ => (0.0, 0.0),
        };
        let scale = _mm256_set1_ps(iscale);
        let most = _mm256_set1_epi32(127);
        for (block, bx) in blocks.iter_mut().zip(xs.chunks_exact(32)) {
            let q: [__m256i; 4] = std::array::from_fn(|i| {
                _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(load(bx, i), scale)), most)
            });
            store_block(q, d, block);
        }
    }
}
