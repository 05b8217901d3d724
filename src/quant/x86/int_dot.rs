//! Dot products of quantized weight rows with Q8 activations, in AVX2 / VNNI.
//!
//! Every format is brought to the same shape per 32 values: unsigned codes
//! (0..=127 at most) in a byte vector, times the 32 signed activation bytes,
//! summed exactly in i32 lanes, then scaled in f32. Offsets (Q4_0's −8,
//! Q6_K's −32, ...) and minimums are folded in through the activation block
//! sums, as the scalar reference does: Σ (q − o)·a = Σ q·a − o·Σ a.

use std::arch::x86_64::*;

use crate::quant::kquants::k_scale_min;
use crate::quant::Q8Block;

/// Σ of 4 adjacent byte products per i32 lane: `u` unsigned, `s` signed.
pub trait IntDot {
    unsafe fn dot(u: __m256i, s: __m256i) -> __m256i;
}

pub struct Avx2Dot;
pub struct VnniDot;

impl IntDot for Avx2Dot {
    #[inline(always)]
    unsafe fn dot(u: __m256i, s: __m256i) -> __m256i {
        // Pair sums fit i16: codes are at most 128 (|Q8_0|) and 128·127·2 < 2^15.
        _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
    }
}

impl IntDot for VnniDot {
    #[inline(always)]
    unsafe fn dot(u: __m256i, s: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s)
    }
}

#[inline(always)]
unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

#[inline(always)]
unsafe fn f16(b: &[u8], at: usize) -> f32 {
    let bits = u16::from_le_bytes([b[at], b[at + 1]]);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
}

/// Asks for the weights a few blocks ahead: the rows stream from memory, and
/// the hardware prefetcher alone falls behind these kernels' consumption
/// (measured: cold Q8_0 4096x4096 matvec 3.9 -> 6.6 GB/s on one thread).
#[inline(always)]
unsafe fn prefetch(block: &[u8]) {
    // Prefetching never faults, so the address may lie past the row's end.
    _mm_prefetch(
        block.as_ptr().wrapping_add(PREFETCH_AHEAD).cast(),
        _MM_HINT_T0,
    );
}

const PREFETCH_AHEAD: usize = 1024;

#[inline(always)]
unsafe fn load32(bytes: &[u8]) -> __m256i {
    _mm256_loadu_si256(bytes[..32].as_ptr().cast())
}

#[inline(always)]
unsafe fn act(a: &Q8Block) -> __m256i {
    _mm256_loadu_si256(a.qs.as_ptr().cast())
}

/// 16 bytes of packed nibbles → 32 codes: low nibbles first, then high.
#[inline(always)]
unsafe fn nibbles16(bytes: &[u8]) -> __m256i {
    let b = _mm_loadu_si128(bytes[..16].as_ptr().cast());
    let m = _mm_set1_epi8(0x0F);
    _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m), _mm_and_si128(b, m))
}

/// Byte i is 0xFF when bit i of `x` is set, else 0.
#[inline(always)]
unsafe fn bits_to_bytes(x: u32) -> __m256i {
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(x as i32),
        _mm256_set_epi64x(
            0x0303030303030303,
            0x0202020202020202,
            0x0101010101010101,
            0,
        ),
    );
    let bit = _mm256_set1_epi64x(0x8040201008040201u64 as i64);
    _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit)
}

/// Byte i is `value` when `bytes[i] & mask` is set, else 0.
#[inline(always)]
unsafe fn masked_bit(bytes: __m256i, mask: i8, value: i8) -> __m256i {
    let m = _mm256_set1_epi8(mask);
    _mm256_and_si256(
        _mm256_cmpeq_epi8(_mm256_and_si256(bytes, m), m),
        _mm256_set1_epi8(value),
    )
}

/// (x0 for lanes 0..4, x1 for lanes 4..8): the two 16-value halves' scales.
#[inline(always)]
unsafe fn halves(x0: f32, x1: f32) -> __m256 {
    _mm256_set_m128(_mm_set1_ps(x1), _mm_set1_ps(x0))
}

#[inline(always)]
unsafe fn acc_scaled<D: IntDot>(acc: __m256, q: __m256i, a: &Q8Block, scale: __m256) -> __m256 {
    _mm256_fmadd_ps(_mm256_cvtepi32_ps(D::dot(q, act(a))), scale, acc)
}

#[inline(always)]
unsafe fn q4_0<D: IntDot>(row: &[u8], act: &[Q8Block]) -> f32 {
    let (mut acc, mut offsets) = (_mm256_setzero_ps(), 0.0f32);
    for (b, a) in row.chunks_exact(18).zip(act) {
        prefetch(b);
        let dd = f16(b, 0) * a.d;
        acc = acc_scaled::<D>(acc, nibbles16(&b[2..]), a, _mm256_set1_ps(dd));
        offsets += dd * (-8 * a.sum()) as f32;
    }
    hsum(acc) + offsets
}

#[inline(always)]
unsafe fn q4_1<D: IntDot>(row: &[u8], act: &[Q8Block]) -> f32 {
    let (mut acc, mut mins) = (_mm256_setzero_ps(), 0.0f32);
    for (b, a) in row.chunks_exact(20).zip(act) {
        prefetch(b);
        acc = acc_scaled::<D>(acc, nibbles16(&b[4..]), a, _mm256_set1_ps(f16(b, 0) * a.d));
        mins += f16(b, 2) * a.d * a.sum() as f32;
    }
    hsum(acc) + mins
}

#[inline(always)]
unsafe fn q5_codes(qs: &[u8], qh: u32) -> __m256i {
    _mm256_or_si256(
        nibbles16(qs),
        _mm256_and_si256(bits_to_bytes(qh), _mm256_set1_epi8(0x10)),
    )
}

#[inline(always)]
unsafe fn q5_0<D: IntDot>(row: &[u8], act: &[Q8Block]) -> f32 {
    let (mut acc, mut offsets) = (_mm256_setzero_ps(), 0.0f32);
    for (b, a) in row.chunks_exact(22).zip(act) {
        prefetch(b);
        let dd = f16(b, 0) * a.d;
        let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
        acc = acc_scaled::<D>(acc, q5_codes(&b[6..], qh), a, _mm256_set1_ps(dd));
        offsets += dd * (-16 * a.sum()) as f32;
    }
    hsum(acc) + offsets
}

#[inline(always)]
unsafe fn q5_1<D: IntDot>(row: &[u8], act: &[Q8Block]) -> f32 {
    let (mut acc, mut mins) = (_mm256_setzero_ps(), 0.0f32);
    for (b, a) in row.chunks_exact(24).zip(act) {
        prefetch(b);
        let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
        acc = acc_scaled::<D>(
            acc,
            q5_codes(&b[8..], qh),
            a,
            _mm256_set1_ps(f16(b, 0) * a.d),
        );
        mins += f16(b, 2) * a.d * a.sum() as f32;
    }
    hsum(acc) + mins
}

#[inline(always)]
unsafe fn q8_0<D: IntDot>(row: &[u8], act: &[Q8Block]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (b, a) in row.chunks_exact(34).zip(act) {
        prefetch(b);
        // Signed × signed: |w| as the unsigned side, the sign moved onto a.
        let w = load32(&b[2..]);
        let isum = D::dot(_mm256_sign_epi8(w, w), _mm256_sign_epi8(self::act(a), w));
        acc = _mm256_fmadd_ps(
            _mm256_cvtepi32_ps(isum),
            _mm256_set1_ps(f16(b, 0) * a.d),
            acc,
        );
    }
    hsum(acc)
}

#[inline(always)]
unsafe fn q2_k<D: IntDot>(row: &[u8], act: &[Q8Block]) -> f32 {
    let (mut acc, mut mins) = (_mm256_setzero_ps(), 0.0f32);
    for (b, a8) in row.chunks_exact(84).zip(act.chunks_exact(8)) {
        prefetch(b);
        let (d, dmin) = (f16(b, 80), f16(b, 82));
        for half in 0..2 {
            let qs = load32(&b[16 + half * 32..]);
            for shift in 0..4 {
                let j = half * 4 + shift;
                let a = &a8[j];
                let (s0, s1) = (b[2 * j], b[2 * j + 1]);
                let q = _mm256_and_si256(
                    _mm256_srlv_epi64(qs, _mm256_set1_epi64x(2 * shift as i64)),
                    _mm256_set1_epi8(3),
                );
                let scale = halves(d * a.d * f32::from(s0 & 0xF), d * a.d * f32::from(s1 & 0xF));
                acc = acc_scaled::<D>(acc, q, a, scale);
                let m = i32::from(s0 >> 4) * i32::from(a.half_sums[0])
                    + i32::from(s1 >> 4) * i32::from(a.half_sums[1]);
                mins += dmin * a.d * m as f32;
            }
        }
    }
    hsum(acc) - mins
}

#[inline(always)]
unsafe fn q3_k<D: IntDot>(row: &[u8], act: &[Q8Block]) -> f32 {
    let (mut acc, mut offsets) = (_mm256_setzero_ps(), 0.0f32);
    for (b, a8) in row.chunks_exact(110).zip(act.chunks_exact(8)) {
        prefetch(b);
        let d = f16(b, 108);
        let sc = &b[96..108];
        let scale = |i: usize| -> i32 {
            let low = (sc[i % 8] >> (4 * (i / 8))) & 0x0F;
            let high = (sc[8 + i % 4] >> (2 * (i / 4))) & 0x03;
            i32::from(low | (high << 4)) - 32
        };
        let hmask = load32(b);
        for half in 0..2 {
            let qs = load32(&b[32 + half * 32..]);
            for shift in 0..4 {
                let j = half * 4 + shift;
                let a = &a8[j];
                let low = _mm256_and_si256(
                    _mm256_srlv_epi64(qs, _mm256_set1_epi64x(2 * shift as i64)),
                    _mm256_set1_epi8(3),
                );
                // Unsigned codes q + 4: the high bit set adds 4.
                let q = _mm256_or_si256(low, masked_bit(hmask, (1u8 << j) as i8, 4));
                let (s0, s1) = (scale(2 * j), scale(2 * j + 1));
                acc = acc_scaled::<D>(acc, q, a, halves(d * a.d * s0 as f32, d * a.d * s1 as f32));
                let o = s0 * i32::from(a.half_sums[0]) + s1 * i32::from(a.half_sums[1]);
                offsets += d * a.d * (-4 * o) as f32;
            }
        }
    }
    hsum(acc) + offsets
}

#[inline(always)]
unsafe fn k_with_min<D: IntDot>(
    row: &[u8],
    act: &[Q8Block],
    block_bytes: usize,
    fifth_bit: bool,
) -> f32 {
    let (mut acc, mut mins) = (_mm256_setzero_ps(), 0.0f32);
    let qs_at = if fifth_bit { 48 } else { 16 };
    for (b, a8) in row.chunks_exact(block_bytes).zip(act.chunks_exact(8)) {
        prefetch(b);
        let (d, dmin) = (f16(b, 0), f16(b, 2));
        let (scale, min) = k_scale_min(&b[4..16]);
        let qh = if fifth_bit {
            load32(&b[16..])
        } else {
            _mm256_setzero_si256()
        };
        for chunk in 0..4 {
            let bytes = load32(&b[qs_at + chunk * 32..]);
            let m = _mm256_set1_epi8(0x0F);
            let nibbles = [
                _mm256_and_si256(bytes, m),
                _mm256_and_si256(_mm256_srli_epi16(bytes, 4), m),
            ];
            for (h, mut q) in nibbles.into_iter().enumerate() {
                let j = chunk * 2 + h;
                if fifth_bit {
                    q = _mm256_or_si256(q, masked_bit(qh, (1u8 << j) as i8, 0x10));
                }
                let a = &a8[j];
                acc = acc_scaled::<D>(acc, q, a, _mm256_set1_ps(d * f32::from(scale[j]) * a.d));
                mins += dmin * f32::from(min[j]) * a.d * a.sum() as f32;
            }
        }
    }
    hsum(acc) - mins
}

#[inline(always)]
unsafe fn q4_k<D: IntDot>(row: &[u8], act: &[Q8Block]) -> f32 {
    k_with_min::<D>(row, act, 144, false)
}

#[inline(always)]
unsafe fn q5_k<D: IntDot>(row: &[u8], act: &[Q8Block]) -> f32 {
    k_with_min::<D>(row, act, 176, true)
}

/// Bits `shift..shift + 2` of each byte of `qh`, moved to bits 4..6.
#[inline(always)]
unsafe fn q6_high(qh: __m256i, shift: i64) -> __m256i {
    let two_bits = _mm256_and_si256(
        _mm256_srlv_epi64(qh, _mm256_set1_epi64x(shift)),
        _mm256_set1_epi8(3),
    );
    _mm256_slli_epi16(two_bits, 4)
}

#[inline(always)]
unsafe fn q6_k<D: IntDot>(row: &[u8], act: &[Q8Block]) -> f32 {
    let (mut acc, mut offsets) = (_mm256_setzero_ps(), 0.0f32);
    let m4 = _mm256_set1_epi8(0x0F);
    for (b, a8) in row.chunks_exact(210).zip(act.chunks_exact(8)) {
        prefetch(b);
        let d = f16(b, 208);
        let scales = &b[192..208];
        for half in 0..2 {
            let ql0 = load32(&b[half * 64..]);
            let ql1 = load32(&b[half * 64 + 32..]);
            let qh = load32(&b[128 + half * 32..]);
            let codes = [
                _mm256_or_si256(_mm256_and_si256(ql0, m4), q6_high(qh, 0)),
                _mm256_or_si256(_mm256_and_si256(ql1, m4), q6_high(qh, 2)),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                    q6_high(qh, 4),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                    q6_high(qh, 6),
                ),
            ];
            for (s, q) in codes.into_iter().enumerate() {
                let j = half * 4 + s;
                let a = &a8[j];
                let (s0, s1) = (
                    i32::from(scales[2 * j] as i8),
                    i32::from(scales[2 * j + 1] as i8),
                );
                acc = acc_scaled::<D>(acc, q, a, halves(d * a.d * s0 as f32, d * a.d * s1 as f32));
                let o = s0 * i32::from(a.half_sums[0]) + s1 * i32::from(a.half_sums[1]);
                offsets += d * a.d * (-32 * o) as f32;
            }
        }
    }
    hsum(acc) + offsets
}

macro_rules! instantiate {
    ($module:ident, $dot:ty, $features:literal) => {
        pub mod $module {
            use super::*;
            macro_rules! one {
                ($name:ident) => {
                    /// # Safety
                    /// The CPU supports the enabled target features.
                    #[target_feature(enable = $features)]
                    pub unsafe fn $name(row: &[u8], act: &[Q8Block]) -> f32 {
                        super::$name::<$dot>(row, act)
                    }
                };
            }
            one!(q4_0);
            one!(q4_1);
            one!(q5_0);
            one!(q5_1);
            one!(q8_0);
            one!(q2_k);
            one!(q3_k);
            one!(q4_k);
            one!(q5_k);
            one!(q6_k);
        }
    };
}

instantiate!(avx2, Avx2Dot, "avx2,fma,f16c");
instantiate!(
    vnni,
    VnniDot,
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"
);
