//! Dot products of F32 / F16 / BF16 weight rows with f32 activations, and
//! attention's products over F16 rows of a cache (one query's dots with
//! many keys, a weighted sum of many values). Eight (AVX2) or
//! sixteen (AVX-512) lanes of f32 fused multiply-adds; a row length that is
//! not a multiple of the width ends in scalar code.

// The attention kernels index per-head arrays (acc[g], the queries) in step.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use crate::quant::float::{bf16_to_f32, f16_at, softmax_lanes};

#[inline(always)]
unsafe fn hsum256(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

/// The lane sums of four vectors at once (three horizontal adds and one
/// fold instead of four reductions).
#[inline(always)]
unsafe fn sums4_256(v: [__m256; 4]) -> [f32; 4] {
    let h = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
    let s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps::<1>(h));
    let mut out = [0f32; 4];
    _mm_storeu_ps(out.as_mut_ptr(), s);
    out
}

/// The scalar tail: values `from..n` of the row.
fn tail(row: &[u8], x: &[f32], from: usize, width: usize, value: impl Fn(&[u8]) -> f32) -> f32 {
    (from..x.len().min(row.len() / width))
        .map(|i| value(&row[i * width..]) * x[i])
        .sum()
}

/// Software prefetch a kilobyte ahead (see `int_dot::prefetch`).
#[inline(always)]
unsafe fn prefetch(row: &[u8], at: usize) {
    // Prefetching never faults, so the address may lie past the row's end.
    _mm_prefetch(row.as_ptr().wrapping_add(at + 1024).cast(), _MM_HINT_T0);
}

fn f32_at(b: &[u8]) -> f32 {
    f32::from_le_bytes([b[0], b[1], b[2], b[3]])
}
fn bf16_at(b: &[u8]) -> f32 {
    bf16_to_f32(u16::from_le_bytes([b[0], b[1]]))
}

/// A vector width for attention's kernels: f32 lanes, loads of f16 and
/// f32, and a fold to eight lanes for the reductions.
trait Lanes {
    type V: Copy;
    const N: usize;
    unsafe fn zero() -> Self::V;
    unsafe fn f16s(p: *const u8) -> Self::V;
    unsafe fn load(p: *const f32) -> Self::V;
    unsafe fn store(p: *mut f32, v: Self::V);
    unsafe fn splat(x: f32) -> Self::V;
    unsafe fn fmadd(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    unsafe fn fold(v: Self::V) -> __m256;
}

struct Lanes8;
struct Lanes16;

impl Lanes for Lanes8 {
    type V = __m256;
    const N: usize = 8;
    #[inline(always)]
    unsafe fn zero() -> __m256 {
        _mm256_setzero_ps()
    }
    #[inline(always)]
    unsafe fn f16s(p: *const u8) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(p.cast()))
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> __m256 {
        _mm256_loadu_ps(p)
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m256) {
        _mm256_storeu_ps(p, v)
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> __m256 {
        _mm256_set1_ps(x)
    }
    #[inline(always)]
    unsafe fn fmadd(a: __m256, b: __m256, c: __m256) -> __m256 {
        _mm256_fmadd_ps(a, b, c)
    }
    #[inline(always)]
    unsafe fn fold(v: __m256) -> __m256 {
        v
    }
}

impl Lanes for Lanes16 {
    type V = __m512;
    const N: usize = 16;
    #[inline(always)]
    unsafe fn zero() -> __m512 {
        _mm512_setzero_ps()
    }
    #[inline(always)]
    unsafe fn f16s(p: *const u8) -> __m512 {
        _mm512_cvtph_ps(_mm256_loadu_si256(p.cast()))
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> __m512 {
        _mm512_loadu_ps(p)
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m512) {
        _mm512_storeu_ps(p, v)
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> __m512 {
        _mm512_set1_ps(x)
    }
    #[inline(always)]
    unsafe fn fmadd(a: __m512, b: __m512, c: __m512) -> __m512 {
        _mm512_fmadd_ps(a, b, c)
    }
    /// The two 256-bit halves added.
    #[inline(always)]
    unsafe fn fold(v: __m512) -> __m256 {
        let high = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
        _mm256_add_ps(_mm512_castps512_ps256(v), high)
    }
}

/// Query heads a pass over the rows serves at once.
const HEADS: usize = 4;

/// `out[g · n + j]` = row j · query g for the `G` queries of `q`.
#[inline(always)]
unsafe fn dots_group<L: Lanes, const G: usize>(
    rows: &[u8],
    stride: usize,
    q: &[f32],
    dk: usize,
    out: &mut [f32],
    n: usize,
) {
    let full = dk / L::N * L::N;
    assert!(q.len() == G * dk && out.len() == G * n);
    let qp = q.as_ptr();
    for j in 0..n {
        let row = &rows[j * stride..][..dk * 2];
        let rp = row.as_ptr();
        let mut acc = [L::zero(); HEADS];
        let mut i = 0;
        while i < full {
            // SAFETY: i + N ≤ dk: inside the row and each query.
            let k = L::f16s(rp.add(i * 2));
            for g in 0..G {
                acc[g] = L::fmadd(k, L::load(qp.add(g * dk + i)), acc[g]);
            }
            i += L::N;
        }
        let sums = sums4_256([
            L::fold(acc[0]),
            L::fold(acc[1]),
            L::fold(acc[2]),
            L::fold(acc[3]),
        ]);
        for g in 0..G {
            out[g * n + j] = sums[g] + tail(row, &q[g * dk..(g + 1) * dk], full, 2, f16_at);
        }
    }
}

/// `crate::quant::float::f16_dots_many`, the queries in groups of up to
/// [`HEADS`].
#[inline(always)]
unsafe fn dots_many<L: Lanes>(rows: &[u8], stride: usize, q: &[f32], dk: usize, out: &mut [f32]) {
    let heads = q.len() / dk.max(1);
    let n = out.len() / heads.max(1);
    let mut g0 = 0;
    while g0 < heads {
        let g = (heads - g0).min(HEADS);
        let (q, out) = (&q[g0 * dk..(g0 + g) * dk], &mut out[g0 * n..(g0 + g) * n]);
        match g {
            4 => dots_group::<L, 4>(rows, stride, q, dk, out, n),
            3 => dots_group::<L, 3>(rows, stride, q, dk, out, n),
            2 => dots_group::<L, 2>(rows, stride, q, dk, out, n),
            _ => dots_group::<L, 1>(rows, stride, q, dk, out, n),
        }
        g0 += g;
    }
}

/// y_g += Σ_j a[g · n + j] · row j for the `G` weight vectors of `a`.
#[inline(always)]
unsafe fn axpys_group<L: Lanes, const G: usize>(
    rows: &[u8],
    stride: usize,
    a: &[f32],
    n: usize,
    y: &mut [f32],
    dv: usize,
) {
    let full = dv / L::N * L::N;
    assert!(a.len() == G * n && y.len() == G * dv);
    for c in (0..full).step_by(L::N) {
        let mut acc: [L::V; G] = std::array::from_fn(|g| L::load(y[g * dv + c..][..L::N].as_ptr()));
        for j in 0..n {
            let at = j * stride + c * 2;
            let v = L::f16s(rows[at..at + L::N * 2].as_ptr());
            for g in 0..G {
                acc[g] = L::fmadd(v, L::splat(a[g * n + j]), acc[g]);
            }
        }
        for g in 0..G {
            L::store(y[g * dv + c..][..L::N].as_mut_ptr(), acc[g]);
        }
    }
    // The columns past the last whole vector: the scalar kernel.
    if full < dv {
        for g in 0..G {
            let weights = &a[g * n..(g + 1) * n];
            let y = &mut y[g * dv + full..(g + 1) * dv];
            crate::quant::float::f16_axpys(&rows[full * 2..], stride, weights, y);
        }
    }
}

/// `crate::quant::float::f16_axpys_many`, the weight vectors in groups of up
/// to [`HEADS`].
#[inline(always)]
unsafe fn axpys_many<L: Lanes>(rows: &[u8], stride: usize, a: &[f32], n: usize, y: &mut [f32]) {
    let heads = a.len() / n.max(1);
    let dv = y.len() / heads.max(1);
    let mut g0 = 0;
    while g0 < heads {
        let g = (heads - g0).min(HEADS);
        let (a, y) = (&a[g0 * n..(g0 + g) * n], &mut y[g0 * dv..(g0 + g) * dv]);
        match g {
            4 => axpys_group::<L, 4>(rows, stride, a, n, y, dv),
            3 => axpys_group::<L, 3>(rows, stride, a, n, y, dv),
            2 => axpys_group::<L, 2>(rows, stride, a, n, y, dv),
            _ => axpys_group::<L, 1>(rows, stride, a, n, y, dv),
        }
        g0 += g;
    }
}

pub mod avx2 {
    use super::*;

    /// # Safety
    /// The CPU supports AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn f32(row: &[u8], x: &[f32]) -> f32 {
        let n = x.len().min(row.len() / 4) / 8 * 8;
        let mut acc = _mm256_setzero_ps();
        for i in (0..n).step_by(8) {
            prefetch(row, i * 4);
            let w = _mm256_loadu_ps(row[i * 4..i * 4 + 32].as_ptr().cast());
            acc = _mm256_fmadd_ps(w, _mm256_loadu_ps(x[i..i + 8].as_ptr()), acc);
        }
        hsum256(acc) + tail(row, x, n, 4, f32_at)
    }

    /// # Safety
    /// The CPU supports AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn f16(row: &[u8], x: &[f32]) -> f32 {
        let n = x.len().min(row.len() / 2) / 8 * 8;
        let mut acc = _mm256_setzero_ps();
        for i in (0..n).step_by(8) {
            prefetch(row, i * 2);
            let w = _mm256_cvtph_ps(_mm_loadu_si128(row[i * 2..i * 2 + 16].as_ptr().cast()));
            acc = _mm256_fmadd_ps(w, _mm256_loadu_ps(x[i..i + 8].as_ptr()), acc);
        }
        hsum256(acc) + tail(row, x, n, 2, f16_at)
    }

    /// # Safety
    /// The CPU supports AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn bf16(row: &[u8], x: &[f32]) -> f32 {
        let n = x.len().min(row.len() / 2) / 8 * 8;
        let mut acc = _mm256_setzero_ps();
        for i in (0..n).step_by(8) {
            prefetch(row, i * 2);
            let bits =
                _mm256_cvtepu16_epi32(_mm_loadu_si128(row[i * 2..i * 2 + 16].as_ptr().cast()));
            let w = _mm256_castsi256_ps(_mm256_slli_epi32(bits, 16));
            acc = _mm256_fmadd_ps(w, _mm256_loadu_ps(x[i..i + 8].as_ptr()), acc);
        }
        hsum256(acc) + tail(row, x, n, 2, bf16_at)
    }

    /// As `crate::quant::float::f16_dots_many`: each key row converted once
    /// for up to four query heads.
    ///
    /// # Safety
    /// The CPU supports AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn f16_dots_many(rows: &[u8], stride: usize, q: &[f32], dk: usize, out: &mut [f32]) {
        dots_many::<Lanes8>(rows, stride, q, dk, out)
    }

    /// As `crate::quant::float::f16_axpys_many`: each value row converted
    /// once for up to four query heads.
    ///
    /// # Safety
    /// The CPU supports AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn f16_axpys_many(rows: &[u8], stride: usize, a: &[f32], n: usize, y: &mut [f32]) {
        axpys_many::<Lanes8>(rows, stride, a, n, y)
    }

    /// As `crate::quant::float::softmax`, 8 lanes.
    ///
    /// # Safety
    /// The CPU supports AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn softmax(scores: &mut [f32], scale: f32) -> (f32, f32) {
        softmax_lanes::<8>(scores, scale)
    }
}

pub mod avx512 {
    use super::*;

    /// # Safety
    /// The CPU supports AVX-512 F and BW.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw")]
    pub unsafe fn f32(row: &[u8], x: &[f32]) -> f32 {
        let n = x.len().min(row.len() / 4) / 16 * 16;
        let mut acc = _mm512_setzero_ps();
        for i in (0..n).step_by(16) {
            prefetch(row, i * 4);
            let w = _mm512_loadu_ps(row[i * 4..i * 4 + 64].as_ptr().cast());
            acc = _mm512_fmadd_ps(w, _mm512_loadu_ps(x[i..i + 16].as_ptr()), acc);
        }
        _mm512_reduce_add_ps(acc) + tail(row, x, n, 4, f32_at)
    }

    /// # Safety
    /// The CPU supports AVX-512 F and BW.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw")]
    pub unsafe fn f16(row: &[u8], x: &[f32]) -> f32 {
        let n = x.len().min(row.len() / 2) / 16 * 16;
        let mut acc = _mm512_setzero_ps();
        for i in (0..n).step_by(16) {
            prefetch(row, i * 2);
            let w = _mm512_cvtph_ps(_mm256_loadu_si256(row[i * 2..i * 2 + 32].as_ptr().cast()));
            acc = _mm512_fmadd_ps(w, _mm512_loadu_ps(x[i..i + 16].as_ptr()), acc);
        }
        _mm512_reduce_add_ps(acc) + tail(row, x, n, 2, f16_at)
    }

    /// # Safety
    /// The CPU supports AVX-512 F and BW.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw")]
    pub unsafe fn bf16(row: &[u8], x: &[f32]) -> f32 {
        let n = x.len().min(row.len() / 2) / 16 * 16;
        let mut acc = _mm512_setzero_ps();
        for i in (0..n).step_by(16) {
            prefetch(row, i * 2);
            let bits =
                _mm512_cvtepu16_epi32(_mm256_loadu_si256(row[i * 2..i * 2 + 32].as_ptr().cast()));
            let w = _mm512_castsi512_ps(_mm512_slli_epi32(bits, 16));
            acc = _mm512_fmadd_ps(w, _mm512_loadu_ps(x[i..i + 16].as_ptr()), acc);
        }
        _mm512_reduce_add_ps(acc) + tail(row, x, n, 2, bf16_at)
    }

    /// As `avx2::f16_dots_many`, 16 lanes.
    ///
    /// # Safety
    /// The CPU supports AVX-512 F and BW.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw")]
    pub unsafe fn f16_dots_many(rows: &[u8], stride: usize, q: &[f32], dk: usize, out: &mut [f32]) {
        dots_many::<Lanes16>(rows, stride, q, dk, out)
    }

    /// As `avx2::f16_axpys_many`, 16 lanes.
    ///
    /// # Safety
    /// The CPU supports AVX-512 F and BW.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw")]
    pub unsafe fn f16_axpys_many(rows: &[u8], stride: usize, a: &[f32], n: usize, y: &mut [f32]) {
        axpys_many::<Lanes16>(rows, stride, a, n, y)
    }

    /// As `crate::quant::float::softmax`, 16 lanes.
    ///
    /// # Safety
    /// The CPU supports AVX-512 F and BW.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw")]
    pub unsafe fn softmax(scores: &mut [f32], scale: f32) -> (f32, f32) {
        softmax_lanes::<16>(scores, scale)
    }
}
