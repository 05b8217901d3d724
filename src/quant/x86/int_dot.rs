//! Dot products of quantized weight rows with Q8 activations, in AVX2 / VNNI.
//!
//! Every format is brought to the same shape per 32 values: codes in a byte
//! vector times the 32 signed activation bytes, summed exactly in i32 lanes,
//! then scaled in f32. The instructions take one unsigned operand: signed
//! codes (Q8_0, and Q4_0 / Q5_0 after subtracting their offset) go in as |q|
//! with q's sign moved onto the activations; the K formats keep unsigned
//! codes and fold offsets and minimums in through the activation block sums:
//! Σ (q − o)·a = Σ q·a − o·Σ a.

// The kernels index several per-token arrays (acts[t] and the sums' slots)
// in step; one index reads better than zipped iterators.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use crate::quant::kquants::{k_scale_min, k_scale_min_words};
use crate::quant::lookup::{e8m0_half, iq4_xs_scales, IQ4_VALUES, MXFP4_VALUES};
use crate::quant::Q8Block;

/// Σ of 4 adjacent byte products per i32 lane: `u` unsigned, `s` signed.
pub trait IntDot {
    unsafe fn dot(u: __m256i, s: __m256i) -> __m256i;

    /// `acc` + `dot(u, s)`.
    #[inline(always)]
    unsafe fn dot_add(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        _mm256_add_epi32(acc, Self::dot(u, s))
    }
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

    #[inline(always)]
    unsafe fn dot_add(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(acc, u, s)
    }
}

/// Σ of 4 adjacent byte products per i32 lane of codes `u` taken back by
/// `BIAS` and signed activations `s`: Σ (u − BIAS)·s. The panel and
/// interleaved products take it, so that codes past 127 have an AVX2 form.
pub trait CodeDot {
    const BIAS: i32;

    /// `acc` + Σ (u − BIAS)·s.
    ///
    /// # Safety
    /// The CPU has the instructions of the implementation (AVX2, or VNNI).
    unsafe fn biased_dot_add(acc: __m256i, u: __m256i, s: __m256i) -> __m256i;
}

impl<D: IntDot> CodeDot for D {
    const BIAS: i32 = 0;

    #[inline(always)]
    unsafe fn biased_dot_add(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        D::dot_add(acc, u, s)
    }
}

/// AVX2 for codes stored as value + 128 (Q8_0, IQ4_NL, IQ4_XS: up to 255,
/// which `vpmaddubsw` would saturate in pairs times 127). Each code is taken
/// back to its signed value v, |v| goes in as the unsigned operand and v's
/// sign onto the activations, as the one-row Q8_0 kernel does: pair sums
/// are at most 2 · 128 · 127 < 2^15. That needs the activation codes within
/// ±127 (`Q8Block`'s invariant: `vpsignb` leaves −128 as it is).
pub struct Avx2SignedCodes;

impl CodeDot for Avx2SignedCodes {
    const BIAS: i32 = 128;

    #[inline(always)]
    unsafe fn biased_dot_add(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        let v = _mm256_xor_si256(u, _mm256_set1_epi8(-128));
        Avx2Dot::dot_add(acc, _mm256_abs_epi8(v), _mm256_sign_epi8(s, v))
    }
}

#[inline(always)]
unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

/// The f16 at byte `at` as f32.
#[inline(always)]
unsafe fn f16(b: &[u8], at: usize) -> f32 {
    _mm256_cvtss_f32(f16x8(b, at))
}

/// The f16 at byte `at` as f32 in all eight lanes. Scales that feed vector
/// math are converted this way: converting into lane 0 alone lets LLVM emit
/// `vpinsrw` into the accumulator's register, a false dependency that chains
/// every block to the previous one (Q8_0 at a third of its speed).
#[inline(always)]
pub(super) unsafe fn f16x8(b: &[u8], at: usize) -> __m256 {
    _mm256_cvtph_ps(_mm_set1_epi16(i16::from_le_bytes([b[at], b[at + 1]])))
}

/// Asks for the weights a few blocks ahead: the rows stream from memory, and
/// the hardware prefetcher alone falls behind these kernels' consumption (a
/// cold Q8_0 matrix-vector product on one thread measured much slower
/// without it).
#[inline(always)]
unsafe fn prefetch(block: &[u8]) {
    // Prefetching never faults, so the address may lie past the row's end.
    _mm_prefetch(
        block.as_ptr().wrapping_add(PREFETCH_AHEAD).cast(),
        _MM_HINT_T0,
    );
}

const PREFETCH_AHEAD: usize = 4096;

#[inline(always)]
pub(super) unsafe fn load32(bytes: &[u8]) -> __m256i {
    _mm256_loadu_si256(bytes[..32].as_ptr().cast())
}

#[inline(always)]
unsafe fn act(a: &Q8Block) -> __m256i {
    _mm256_loadu_si256(a.qs.as_ptr().cast())
}

/// 16 bytes of packed nibbles → 32 codes: low nibbles first, then high.
/// The bytes go to both halves of the vector, and the upper half is
/// shifted by 4 (in 64-bit lanes: the bits that cross bytes are masked off).
#[inline(always)]
pub(super) unsafe fn nibbles16(bytes: &[u8]) -> __m256i {
    let b = _mm256_broadcastsi128_si256(_mm_loadu_si128(bytes[..16].as_ptr().cast()));
    let shifted = _mm256_srlv_epi64(b, _mm256_setr_epi64x(0, 0, 4, 4));
    _mm256_and_si256(shifted, _mm256_set1_epi8(0x0F))
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
pub(super) unsafe fn masked_bit(bytes: __m256i, mask: i8, value: i8) -> __m256i {
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

/// Independent sums a one-token kernel spreads its blocks over: a single
/// running sum would wait on each fused multiply-add's latency (4 cycles),
/// which bounds a short row (Gemma's 640 columns) more than the loads do.
const CHAINS: usize = 4;

/// Running sums for `T` (at most [`CHAINS`]) tokens: vectors of scaled
/// integer sums and scalars for the offset / minimum terms. Token t's
/// sums are slot t; one token's are spread over all slots by a counter `k`.
struct Acc<const T: usize> {
    v: [__m256; CHAINS],
    s: [f32; CHAINS],
}

impl<const T: usize> Acc<T> {
    #[inline(always)]
    unsafe fn new() -> Self {
        Acc {
            v: [_mm256_setzero_ps(); CHAINS],
            s: [0.0; CHAINS],
        }
    }

    #[inline(always)]
    fn slot(t: usize, k: usize) -> usize {
        if T == 1 {
            k % CHAINS
        } else {
            t
        }
    }

    /// Token t's vector sum += isum · scale.
    #[inline(always)]
    unsafe fn add_isum(&mut self, t: usize, k: usize, isum: __m256i, scale: __m256) {
        let v = &mut self.v[Self::slot(t, k)];
        *v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), scale, *v);
    }

    /// Token t's vector sum += (Σ q·a_t per lane) · scale.
    #[inline(always)]
    unsafe fn add<D: IntDot>(
        &mut self,
        t: usize,
        k: usize,
        q: __m256i,
        a: &Q8Block,
        scale: __m256,
    ) {
        self.add_isum(t, k, D::dot(q, act(a)), scale);
    }

    /// Token t's scalar sum += x.
    #[inline(always)]
    fn add_scalar(&mut self, t: usize, k: usize, x: f32) {
        self.s[Self::slot(t, k)] += x;
    }

    #[inline(always)]
    unsafe fn finish(self) -> [f32; T] {
        let mut out = [0.0; T];
        if T == 1 {
            let v = _mm256_add_ps(
                _mm256_add_ps(self.v[0], self.v[1]),
                _mm256_add_ps(self.v[2], self.v[3]),
            );
            out[0] = hsum(v) + ((self.s[0] + self.s[1]) + (self.s[2] + self.s[3]));
        } else {
            for t in 0..T {
                out[t] = hsum(self.v[t]) + self.s[t];
            }
        }
        out
    }
}

// Each kernel unpacks a block of weights once and dots it with the same
// block of `T` tokens' activations: prefill reads and unpacks each weight
// once per four tokens instead of once per token.

/// Signed codes `q` (|q| ≤ 128) dotted with token `t`: |q| as the unsigned
/// side, q's sign moved onto the activations.
#[inline(always)]
unsafe fn add_signed<D: IntDot, const T: usize>(
    acc: &mut Acc<T>,
    t: usize,
    k: usize,
    q: __m256i,
    abs_q: __m256i,
    a: &Q8Block,
    d: __m256,
) {
    let isum = D::dot(abs_q, _mm256_sign_epi8(act(a), q));
    acc.add_isum(t, k, isum, _mm256_mul_ps(d, _mm256_set1_ps(a.d)));
}

// Q4_0 and Q5_0 subtract their offset from the codes once per block, so the
// per-token work is the signed dot alone.

#[inline(always)]
unsafe fn q4_0<D: IntDot, const T: usize>(row: &[u8], acts: [&[Q8Block]; T]) -> [f32; T] {
    let mut acc = Acc::<T>::new();
    for (i, b) in row.chunks_exact(18).enumerate() {
        prefetch(b);
        let q = _mm256_sub_epi8(nibbles16(&b[2..]), _mm256_set1_epi8(8));
        let (d, abs_q) = (f16x8(b, 0), _mm256_sign_epi8(q, q));
        for t in 0..T {
            add_signed::<D, T>(&mut acc, t, i, q, abs_q, &acts[t][i], d);
        }
    }
    acc.finish()
}

#[inline(always)]
unsafe fn q4_1<D: IntDot, const T: usize>(row: &[u8], acts: [&[Q8Block]; T]) -> [f32; T] {
    let mut acc = Acc::<T>::new();
    for (i, b) in row.chunks_exact(20).enumerate() {
        prefetch(b);
        let (d, m, q) = (f16x8(b, 0), f16(b, 2), nibbles16(&b[4..]));
        for t in 0..T {
            let a = &acts[t][i];
            acc.add::<D>(t, i, q, a, _mm256_mul_ps(d, _mm256_set1_ps(a.d)));
            acc.add_scalar(t, i, m * a.d_sum);
        }
    }
    acc.finish()
}

#[inline(always)]
pub(super) unsafe fn q5_codes(qs: &[u8], qh: u32) -> __m256i {
    _mm256_or_si256(
        nibbles16(qs),
        _mm256_and_si256(bits_to_bytes(qh), _mm256_set1_epi8(0x10)),
    )
}

#[inline(always)]
unsafe fn q5_0<D: IntDot, const T: usize>(row: &[u8], acts: [&[Q8Block]; T]) -> [f32; T] {
    let mut acc = Acc::<T>::new();
    for (i, b) in row.chunks_exact(22).enumerate() {
        prefetch(b);
        let codes = q5_codes(&b[6..], u32::from_le_bytes([b[2], b[3], b[4], b[5]]));
        let q = _mm256_sub_epi8(codes, _mm256_set1_epi8(16));
        let (d, abs_q) = (f16x8(b, 0), _mm256_sign_epi8(q, q));
        for t in 0..T {
            add_signed::<D, T>(&mut acc, t, i, q, abs_q, &acts[t][i], d);
        }
    }
    acc.finish()
}

#[inline(always)]
unsafe fn q5_1<D: IntDot, const T: usize>(row: &[u8], acts: [&[Q8Block]; T]) -> [f32; T] {
    let mut acc = Acc::<T>::new();
    for (i, b) in row.chunks_exact(24).enumerate() {
        prefetch(b);
        let (d, m) = (f16x8(b, 0), f16(b, 2));
        let q = q5_codes(&b[8..], u32::from_le_bytes([b[4], b[5], b[6], b[7]]));
        for t in 0..T {
            let a = &acts[t][i];
            acc.add::<D>(t, i, q, a, _mm256_mul_ps(d, _mm256_set1_ps(a.d)));
            acc.add_scalar(t, i, m * a.d_sum);
        }
    }
    acc.finish()
}

#[inline(always)]
unsafe fn q8_0<D: IntDot, const T: usize>(row: &[u8], acts: [&[Q8Block]; T]) -> [f32; T] {
    let mut acc = Acc::<T>::new();
    for (i, b) in row.chunks_exact(34).enumerate() {
        prefetch(b);
        let q = load32(&b[2..]);
        let (d, abs_q) = (f16x8(b, 0), _mm256_sign_epi8(q, q));
        for t in 0..T {
            add_signed::<D, T>(&mut acc, t, i, q, abs_q, &acts[t][i], d);
        }
    }
    acc.finish()
}

// The table-lookup formats: each nibble picks one of 16 signed values,
// looked up for 32 codes at once by a byte shuffle of the table (the
// shuffle reads each 128-bit lane's own copy), then dotted as signed codes.

/// 16 bytes of packed 4-bit codes → the 32 bytes they index in `table`
/// (a [`table16`]), low nibbles first.
#[inline(always)]
pub(super) unsafe fn lookup16(bytes: &[u8], table: __m256i) -> __m256i {
    _mm256_shuffle_epi8(table, nibbles16(bytes))
}

/// A shuffle table of `values` + `offset` (wrapping, in bytes) in both lanes:
/// offset 0 for the signed values, or one that makes them unsigned codes.
#[inline(always)]
pub(super) unsafe fn table16(values: &[i8; 16], offset: i8) -> __m256i {
    let t: [i8; 16] = std::array::from_fn(|i| values[i].wrapping_add(offset));
    _mm256_broadcastsi128_si256(_mm_loadu_si128(t.as_ptr().cast()))
}

/// The 32-value table-lookup formats: `BYTES` a block, its codes from byte
/// `CODES` on, indexing `values`; `scale` reads the block's scale.
#[inline(always)]
unsafe fn lookup_blocks32<D: IntDot, const T: usize, const BYTES: usize, const CODES: usize>(
    row: &[u8],
    acts: [&[Q8Block]; T],
    values: &[i8; 16],
    scale: impl Fn(&[u8]) -> __m256,
) -> [f32; T] {
    let table = table16(values, 0);
    let mut acc = Acc::<T>::new();
    for (i, b) in row.chunks_exact(BYTES).enumerate() {
        prefetch(b);
        let q = lookup16(&b[CODES..], table);
        let (d, abs_q) = (scale(b), _mm256_sign_epi8(q, q));
        for t in 0..T {
            add_signed::<D, T>(&mut acc, t, i, q, abs_q, &acts[t][i], d);
        }
    }
    acc.finish()
}

#[inline(always)]
unsafe fn iq4_nl<D: IntDot, const T: usize>(row: &[u8], acts: [&[Q8Block]; T]) -> [f32; T] {
    lookup_blocks32::<D, T, 18, 2>(row, acts, &IQ4_VALUES, |b| f16x8(b, 0))
}

#[inline(always)]
unsafe fn mxfp4<D: IntDot, const T: usize>(row: &[u8], acts: [&[Q8Block]; T]) -> [f32; T] {
    lookup_blocks32::<D, T, 17, 1>(row, acts, &MXFP4_VALUES, |b| {
        _mm256_set1_ps(e8m0_half(b[0]))
    })
}

#[inline(always)]
unsafe fn iq4_xs<D: IntDot, const T: usize>(row: &[u8], acts: [&[Q8Block]; T]) -> [f32; T] {
    let table = table16(&IQ4_VALUES, 0);
    let mut acc = Acc::<T>::new();
    for (i, b) in row.chunks_exact(136).enumerate() {
        prefetch(b);
        for (ib, dl) in iq4_xs_scales(b).into_iter().enumerate() {
            let k = 8 * i + ib;
            let q = lookup16(&b[8 + 16 * ib..], table);
            let (d, abs_q) = (_mm256_set1_ps(dl), _mm256_sign_epi8(q, q));
            for t in 0..T {
                add_signed::<D, T>(&mut acc, t, k, q, abs_q, &acts[t][k], d);
            }
        }
    }
    acc.finish()
}

/// Bits `2·shift..2·shift + 2` of each byte.
#[inline(always)]
pub(super) unsafe fn crumbs(qs: __m256i, shift: usize) -> __m256i {
    _mm256_and_si256(
        _mm256_srlv_epi64(qs, _mm256_set1_epi64x(2 * shift as i64)),
        _mm256_set1_epi8(3),
    )
}

#[inline(always)]
unsafe fn q2_k<D: IntDot, const T: usize>(row: &[u8], acts: [&[Q8Block]; T]) -> [f32; T] {
    let mut acc = Acc::<T>::new();
    for (i, b) in row.chunks_exact(84).enumerate() {
        prefetch(b);
        let (d, dmin) = (f16x8(b, 80), f16(b, 82));
        for half in 0..2 {
            let qs = load32(&b[16 + half * 32..]);
            for shift in 0..4 {
                let j = half * 4 + shift;
                let (s0, s1) = (b[2 * j], b[2 * j + 1]);
                let q = crumbs(qs, shift);
                let (sc0, sc1) = (f32::from(s0 & 0xF), f32::from(s1 & 0xF));
                let (m0, m1) = (i32::from(s0 >> 4), i32::from(s1 >> 4));
                for t in 0..T {
                    let a = &acts[t][i * 8 + j];
                    acc.add::<D>(t, j, q, a, _mm256_mul_ps(d, halves(sc0 * a.d, sc1 * a.d)));
                    let m = m0 * i32::from(a.half_sums[0]) + m1 * i32::from(a.half_sums[1]);
                    acc.add_scalar(t, j, -(dmin * a.d * m as f32));
                }
            }
        }
    }
    acc.finish()
}

#[inline(always)]
unsafe fn q3_k<D: IntDot, const T: usize>(row: &[u8], acts: [&[Q8Block]; T]) -> [f32; T] {
    let mut acc = Acc::<T>::new();
    for (i, b) in row.chunks_exact(110).enumerate() {
        prefetch(b);
        let d = f16x8(b, 108);
        let sc = &b[96..108];
        let scale = |k: usize| -> i32 {
            let low = (sc[k % 8] >> (4 * (k / 8))) & 0x0F;
            let high = (sc[8 + k % 4] >> (2 * (k / 4))) & 0x03;
            i32::from(low | (high << 4)) - 32
        };
        let hmask = load32(b);
        for half in 0..2 {
            let qs = load32(&b[32 + half * 32..]);
            for shift in 0..4 {
                let j = half * 4 + shift;
                // Unsigned codes q + 4: the high bit set adds 4.
                let q = _mm256_or_si256(crumbs(qs, shift), masked_bit(hmask, (1u8 << j) as i8, 4));
                let (s0, s1) = (scale(2 * j), scale(2 * j + 1));
                for t in 0..T {
                    let a = &acts[t][i * 8 + j];
                    acc.add::<D>(
                        t,
                        j,
                        q,
                        a,
                        _mm256_mul_ps(d, halves(a.d * s0 as f32, a.d * s1 as f32)),
                    );
                    let o = s0 * i32::from(a.half_sums[0]) + s1 * i32::from(a.half_sums[1]);
                    acc.add_scalar(t, j, _mm256_cvtss_f32(d) * a.d * (-4 * o) as f32);
                }
            }
        }
    }
    acc.finish()
}

/// The eight sub-blocks' codes of a Q4_K (or, with `FIFTH_BIT`, Q5_K)
/// super-block: the nibbles of each 32-byte run (low nibbles sub-block 2c,
/// high ones 2c + 1), Q5_K's fifth bits at bit 4.
#[inline(always)]
pub(super) unsafe fn k_min_codes<const FIFTH_BIT: bool>(b: &[u8]) -> [__m256i; 8] {
    let qs_at = if FIFTH_BIT { 48 } else { 16 };
    let m4 = _mm256_set1_epi8(0x0F);
    let mut codes = [_mm256_setzero_si256(); 8];
    for chunk in 0..4 {
        let bytes = load32(&b[qs_at + chunk * 32..]);
        codes[2 * chunk] = _mm256_and_si256(bytes, m4);
        codes[2 * chunk + 1] = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), m4);
    }
    if FIFTH_BIT {
        let qh = load32(&b[16..]);
        for (j, c) in codes.iter_mut().enumerate() {
            *c = _mm256_or_si256(*c, masked_bit(qh, (1u8 << j) as i8, 0x10));
        }
    }
    codes
}

#[inline(always)]
unsafe fn k_with_min<D: IntDot, const T: usize, const FIFTH_BIT: bool>(
    row: &[u8],
    acts: [&[Q8Block]; T],
) -> [f32; T] {
    let mut acc = Acc::<T>::new();
    let block_bytes = if FIFTH_BIT { 176 } else { 144 };
    for (i, b) in row.chunks_exact(block_bytes).enumerate() {
        prefetch(b);
        let (d, dmin) = (f16x8(b, 0), f16(b, 2));
        let (scale, min) = k_scale_min(&b[4..16]);
        for (j, q) in k_min_codes::<FIFTH_BIT>(b).into_iter().enumerate() {
            let (sc, dm) = (f32::from(scale[j]), dmin * f32::from(min[j]));
            for t in 0..T {
                let a = &acts[t][i * 8 + j];
                acc.add::<D>(t, j, q, a, _mm256_mul_ps(d, _mm256_set1_ps(sc * a.d)));
                acc.add_scalar(t, j, -(dm * a.d_sum));
            }
        }
    }
    acc.finish()
}

/// Lane j of the result is the sum of v[j]'s lanes.
#[inline(always)]
unsafe fn lane_sums(v: [__m256i; 8]) -> __m256i {
    // Pairwise sums within each 128-bit half, then the two halves' partial
    // sums added: [Σ v0 .. Σ v3 | Σ v4 .. Σ v7].
    let s01 = _mm256_hadd_epi32(v[0], v[1]);
    let s23 = _mm256_hadd_epi32(v[2], v[3]);
    let s45 = _mm256_hadd_epi32(v[4], v[5]);
    let s67 = _mm256_hadd_epi32(v[6], v[7]);
    let t0 = _mm256_hadd_epi32(s01, s23);
    let t1 = _mm256_hadd_epi32(s45, s67);
    _mm256_add_epi32(
        _mm256_permute2x128_si256(t0, t1, 0x20),
        _mm256_permute2x128_si256(t0, t1, 0x31),
    )
}

/// Eight bytes as eight f32 lanes.
#[inline(always)]
unsafe fn bytes_to_f32(w: u64) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(w as i64)))
}

/// Q4_K / Q5_K dotted with one token (decode). A super-block's eight
/// sub-block sums are gathered into one vector's lanes, so its scales,
/// minimums and the activations' scales are applied as vectors, once a
/// super-block, rather than as scalars per sub-block.
#[inline(always)]
unsafe fn k_with_min_1<D: IntDot, const FIFTH_BIT: bool>(row: &[u8], acts: &[Q8Block]) -> f32 {
    let block_bytes = if FIFTH_BIT { 176 } else { 144 };
    let n = row.len() / block_bytes;
    assert!(acts.len() >= n * 8, "activations for every sub-block");
    // The activation blocks' d and d_sum fields, 8 blocks apart in f32s.
    const STRIDE: i32 = (std::mem::size_of::<Q8Block>() / 4) as i32;
    const _: () = assert!(
        std::mem::offset_of!(Q8Block, d) == 0
            && std::mem::offset_of!(Q8Block, d_sum) == 4
            && std::mem::size_of::<Q8Block>().is_multiple_of(4)
    );
    let index = _mm256_mullo_epi32(
        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
        _mm256_set1_epi32(STRIDE),
    );
    let mut acc = [_mm256_setzero_ps(); 2];
    let mut mins = _mm256_setzero_ps();
    for (i, b) in row.chunks_exact(block_bytes).enumerate() {
        prefetch(b);
        let (scales, min) = k_scale_min_words(&b[4..16]);
        let blocks = &acts[i * 8..i * 8 + 8];
        // SAFETY: the eight blocks of `blocks` are in bounds, and d and
        // d_sum are their first two f32 fields (repr(C)).
        let first = blocks.as_ptr().cast::<f32>();
        let a_d = _mm256_i32gather_ps::<4>(first, index);
        let a_sum = _mm256_i32gather_ps::<4>(first.add(1), index);
        let scale = _mm256_mul_ps(_mm256_mul_ps(bytes_to_f32(scales), f16x8(b, 0)), a_d);
        mins = _mm256_fmadd_ps(_mm256_mul_ps(bytes_to_f32(min), f16x8(b, 2)), a_sum, mins);
        let codes = k_min_codes::<FIFTH_BIT>(b);
        let isum: [__m256i; 8] = std::array::from_fn(|j| D::dot(codes[j], act(&blocks[j])));
        let sums = _mm256_cvtepi32_ps(lane_sums(isum));
        acc[i % 2] = _mm256_fmadd_ps(sums, scale, acc[i % 2]);
    }
    hsum(_mm256_add_ps(acc[0], acc[1])) - hsum(mins)
}

#[inline(always)]
unsafe fn q4_k<D: IntDot, const T: usize>(row: &[u8], acts: [&[Q8Block]; T]) -> [f32; T] {
    if T == 1 {
        let mut out = [0.0; T];
        out[0] = k_with_min_1::<D, false>(row, acts[0]);
        return out;
    }
    k_with_min::<D, T, false>(row, acts)
}

#[inline(always)]
unsafe fn q5_k<D: IntDot, const T: usize>(row: &[u8], acts: [&[Q8Block]; T]) -> [f32; T] {
    if T == 1 {
        let mut out = [0.0; T];
        out[0] = k_with_min_1::<D, true>(row, acts[0]);
        return out;
    }
    k_with_min::<D, T, true>(row, acts)
}

/// The 6-bit codes of 128 Q6_K weights: the low nibbles of `ql0` and
/// `ql1`, then their high nibbles, each with two bits of `qh` (bits 0..2,
/// 2..4, 4..6, 6..8 of each byte) as bits 4..6.
#[inline(always)]
pub(super) unsafe fn q6_codes(ql0: __m256i, ql1: __m256i, qh: __m256i) -> [__m256i; 4] {
    let (m4, m30) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x30));
    [
        _mm256_or_si256(
            _mm256_and_si256(ql0, m4),
            _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30),
        ),
        _mm256_or_si256(
            _mm256_and_si256(ql1, m4),
            _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30),
        ),
        _mm256_or_si256(
            _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
            _mm256_and_si256(qh, m30),
        ),
        _mm256_or_si256(
            _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
            _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30),
        ),
    ]
}

#[inline(always)]
unsafe fn q6_k<D: IntDot, const T: usize>(row: &[u8], acts: [&[Q8Block]; T]) -> [f32; T] {
    let mut acc = Acc::<T>::new();
    for (i, b) in row.chunks_exact(210).enumerate() {
        prefetch(b);
        let d = f16x8(b, 208);
        let scales = &b[192..208];
        for half in 0..2 {
            let ql0 = load32(&b[half * 64..]);
            let ql1 = load32(&b[half * 64 + 32..]);
            let qh = load32(&b[128 + half * 32..]);
            let codes = q6_codes(ql0, ql1, qh);
            for (s, q) in codes.into_iter().enumerate() {
                let j = half * 4 + s;
                let (s0, s1) = (
                    i32::from(scales[2 * j] as i8),
                    i32::from(scales[2 * j + 1] as i8),
                );
                for t in 0..T {
                    let a = &acts[t][i * 8 + j];
                    acc.add::<D>(
                        t,
                        j,
                        q,
                        a,
                        _mm256_mul_ps(d, halves(a.d * s0 as f32, a.d * s1 as f32)),
                    );
                    let o = s0 * i32::from(a.half_sums[0]) + s1 * i32::from(a.half_sums[1]);
                    acc.add_scalar(t, j, _mm256_cvtss_f32(d) * a.d * (-32 * o) as f32);
                }
            }
        }
    }
    acc.finish()
}

/// Tokens a multi-token kernel takes at once.
pub const TOKENS: usize = 4;

macro_rules! instantiate {
    ($module:ident, $dot:ty, $features:literal) => {
        pub mod $module {
            use super::*;
            macro_rules! one {
                ($name:ident, $many:ident, $rows:ident) => {
                    /// # Safety
                    /// The CPU supports the enabled target features.
                    #[target_feature(enable = $features)]
                    pub unsafe fn $rows(
                        rows: &[u8],
                        row_bytes: usize,
                        act: &[Q8Block],
                        out: &mut [f32],
                    ) {
                        for (row, y) in rows.chunks_exact(row_bytes).zip(out) {
                            *y = super::$name::<$dot, 1>(row, [act])[0];
                        }
                    }

                    /// # Safety
                    /// The CPU supports the enabled target features.
                    #[target_feature(enable = $features)]
                    pub unsafe fn $name(row: &[u8], act: &[Q8Block]) -> f32 {
                        super::$name::<$dot, 1>(row, [act])[0]
                    }

                    /// # Safety
                    /// The CPU supports the enabled target features.
                    #[target_feature(enable = $features)]
                    pub unsafe fn $many(row: &[u8], acts: [&[Q8Block]; TOKENS]) -> [f32; TOKENS] {
                        super::$name::<$dot, TOKENS>(row, acts)
                    }
                };
            }
            one!(q4_0, q4_0_x4, q4_0_rows);
            one!(q4_1, q4_1_x4, q4_1_rows);
            one!(q5_0, q5_0_x4, q5_0_rows);
            one!(q5_1, q5_1_x4, q5_1_rows);
            one!(q8_0, q8_0_x4, q8_0_rows);
            one!(q2_k, q2_k_x4, q2_k_rows);
            one!(q3_k, q3_k_x4, q3_k_rows);
            one!(q4_k, q4_k_x4, q4_k_rows);
            one!(q5_k, q5_k_x4, q5_k_rows);
            one!(q6_k, q6_k_x4, q6_k_rows);
            one!(iq4_nl, iq4_nl_x4, iq4_nl_rows);
            one!(iq4_xs, iq4_xs_x4, iq4_xs_rows);
            one!(mxfp4, mxfp4_x4, mxfp4_rows);
        }
    };
}

instantiate!(avx2, Avx2Dot, "avx2,fma,f16c");
instantiate!(
    vnni,
    VnniDot,
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"
);
