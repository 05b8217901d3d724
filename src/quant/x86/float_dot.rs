//! Dot products of F32 / F16 / BF16 weight rows with f32 activations, and
//! attention's products over F16 rows of a cache (one query's dots with
//! many keys, a weighted sum of many values). Eight (AVX2) or
//! sixteen (AVX-512) lanes of f32 fused multiply-adds; a row length that is
//! not a multiple of the width ends in scalar code.

use std::arch::x86_64::*;

use crate::quant::float::{bf16_to_f32, f16_at};

#[inline(always)]
unsafe fn hsum256(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
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

    /// out[j] = row j · x for `out.len()` F16 rows of x.len() values, row j
    /// starting at byte j · stride (attention's scores of one query).
    ///
    /// # Safety
    /// The CPU supports AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn f16_dots(rows: &[u8], stride: usize, x: &[f32], out: &mut [f32]) {
        let n = x.len() / 8 * 8;
        for (j, o) in out.iter_mut().enumerate() {
            let row = &rows[j * stride..][..x.len() * 2];
            let mut acc = _mm256_setzero_ps();
            for i in (0..n).step_by(8) {
                let w = _mm256_cvtph_ps(_mm_loadu_si128(row[i * 2..i * 2 + 16].as_ptr().cast()));
                acc = _mm256_fmadd_ps(w, _mm256_loadu_ps(x[i..i + 8].as_ptr()), acc);
            }
            *o = hsum256(acc) + tail(row, x, n, 2, f16_at);
        }
    }

    /// y += Σ_j a[j] · row j for `a.len()` F16 rows of y.len() values, row j
    /// starting at byte j · stride (attention's weighted sum of values).
    ///
    /// # Safety
    /// The CPU supports AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn f16_axpys(rows: &[u8], stride: usize, a: &[f32], y: &mut [f32]) {
        let n = y.len() / 8 * 8;
        for c in (0..n).step_by(8) {
            let mut acc = _mm256_loadu_ps(y[c..c + 8].as_ptr());
            for (j, &aj) in a.iter().enumerate() {
                let at = j * stride + c * 2;
                let w = _mm256_cvtph_ps(_mm_loadu_si128(rows[at..at + 16].as_ptr().cast()));
                acc = _mm256_fmadd_ps(w, _mm256_set1_ps(aj), acc);
            }
            _mm256_storeu_ps(y[c..c + 8].as_mut_ptr(), acc);
        }
        // The columns past the last whole vector: the scalar kernel.
        if n < y.len() {
            crate::quant::float::f16_axpys(&rows[n * 2..], stride, a, &mut y[n..]);
        }
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

    /// As `avx2::f16_dots`.
    ///
    /// # Safety
    /// The CPU supports AVX-512 F and BW.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw")]
    pub unsafe fn f16_dots(rows: &[u8], stride: usize, x: &[f32], out: &mut [f32]) {
        let n = x.len() / 16 * 16;
        for (j, o) in out.iter_mut().enumerate() {
            let row = &rows[j * stride..][..x.len() * 2];
            let mut acc = _mm512_setzero_ps();
            for i in (0..n).step_by(16) {
                let w = _mm512_cvtph_ps(_mm256_loadu_si256(row[i * 2..i * 2 + 32].as_ptr().cast()));
                acc = _mm512_fmadd_ps(w, _mm512_loadu_ps(x[i..i + 16].as_ptr()), acc);
            }
            *o = _mm512_reduce_add_ps(acc) + tail(row, x, n, 2, f16_at);
        }
    }

    /// As `avx2::f16_axpys`.
    ///
    /// # Safety
    /// The CPU supports AVX-512 F and BW.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw")]
    pub unsafe fn f16_axpys(rows: &[u8], stride: usize, a: &[f32], y: &mut [f32]) {
        let n = y.len() / 16 * 16;
        for c in (0..n).step_by(16) {
            let mut acc = _mm512_loadu_ps(y[c..c + 16].as_ptr());
            for (j, &aj) in a.iter().enumerate() {
                let at = j * stride + c * 2;
                let w = _mm512_cvtph_ps(_mm256_loadu_si256(rows[at..at + 32].as_ptr().cast()));
                acc = _mm512_fmadd_ps(w, _mm512_set1_ps(aj), acc);
            }
            _mm512_storeu_ps(y[c..c + 16].as_mut_ptr(), acc);
        }
        // The columns past the last whole vector: the scalar kernel.
        if n < y.len() {
            crate::quant::float::f16_axpys(&rows[n * 2..], stride, a, &mut y[n..]);
        }
    }
}
