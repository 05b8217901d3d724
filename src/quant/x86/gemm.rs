//! Panels ([`crate::quant::panel`]) in AVX2 / VNNI: each format's blocks
//! unpacked to unsigned codes and transposed into interleaved chunks, and
//! the product of a panel with many tokens' Q8 activations.

// The kernels index per-token arrays (isum[t], acc[t], acts[t]) in step.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;
use std::marker::PhantomData;

use super::int_dot::{
    crumbs, k_min_codes, load32, lookup16, masked_bit, nibbles16, q5_codes, q6_codes, table16,
    CodeDot, IntDot,
};
use crate::quant::interleaved::{
    IQ4_XS_GROUP_BLOCK, MXFP4_GROUP_BLOCK, Q4_0_GROUP_BLOCK, Q4_1_GROUP_BLOCK, Q4_K_GROUP_BLOCK,
    Q5_0_GROUP_BLOCK, Q6_K_GROUP_BLOCK, Q8_0_GROUP_BLOCK,
};
use crate::quant::kquants::{k_scale_min, q3k_scales};
use crate::quant::lookup::{e8m0_half, iq4_xs_scales, IQ4_VALUES, MXFP4_VALUES};
use crate::quant::panel::{Panel, PanelHalf, PanelOut, PANEL_ROWS};
use crate::quant::Q8Block;

/// The f16 in the first two bytes of `b` as f32, by F16C (the portable
/// conversion is a call per value).
#[inline(always)]
unsafe fn f16_at(b: &[u8]) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_set1_epi16(i16::from_le_bytes([
        b[0], b[1],
    ]))))
}

/// One format's blocks as `w = scale · u − offset`.
pub(super) trait Unpack {
    const BLOCK_BYTES: usize;
    /// Values a block holds (32 or 256).
    const VALUES: usize;
    /// Columns a scale covers (16 or 32).
    const SUB: usize;
    /// The block's codes, 32 values a vector, and each sub-block's scale and
    /// offset.
    unsafe fn unpack(
        b: &[u8],
        codes: &mut [__m256i; 8],
        scale: &mut [f32; 16],
        offset: &mut [f32; 16],
    );
}

pub(super) struct Q4_0;
pub(super) struct Q4_1;
pub(super) struct Q5_0;
pub(super) struct Q5_1;
pub(super) struct Q8_0;
pub(super) struct Q2K;
pub(super) struct Q3K;
pub(super) struct Q4K;
pub(super) struct Q5K;
pub(super) struct Q6K;

impl Unpack for Q4_0 {
    const BLOCK_BYTES: usize = 18;
    const VALUES: usize = 32;
    const SUB: usize = 32;
    #[inline(always)]
    unsafe fn unpack(
        b: &[u8],
        codes: &mut [__m256i; 8],
        scale: &mut [f32; 16],
        offset: &mut [f32; 16],
    ) {
        let d = f16_at(b);
        codes[0] = nibbles16(&b[2..]);
        (scale[0], offset[0]) = (d, 8.0 * d);
    }
}

impl Unpack for Q4_1 {
    const BLOCK_BYTES: usize = 20;
    const VALUES: usize = 32;
    const SUB: usize = 32;
    #[inline(always)]
    unsafe fn unpack(
        b: &[u8],
        codes: &mut [__m256i; 8],
        scale: &mut [f32; 16],
        offset: &mut [f32; 16],
    ) {
        codes[0] = nibbles16(&b[4..]);
        (scale[0], offset[0]) = (f16_at(b), -f16_at(&b[2..]));
    }
}

impl Unpack for Q5_0 {
    const BLOCK_BYTES: usize = 22;
    const VALUES: usize = 32;
    const SUB: usize = 32;
    #[inline(always)]
    unsafe fn unpack(
        b: &[u8],
        codes: &mut [__m256i; 8],
        scale: &mut [f32; 16],
        offset: &mut [f32; 16],
    ) {
        let d = f16_at(b);
        codes[0] = q5_codes(&b[6..], u32::from_le_bytes([b[2], b[3], b[4], b[5]]));
        (scale[0], offset[0]) = (d, 16.0 * d);
    }
}

impl Unpack for Q5_1 {
    const BLOCK_BYTES: usize = 24;
    const VALUES: usize = 32;
    const SUB: usize = 32;
    #[inline(always)]
    unsafe fn unpack(
        b: &[u8],
        codes: &mut [__m256i; 8],
        scale: &mut [f32; 16],
        offset: &mut [f32; 16],
    ) {
        codes[0] = q5_codes(&b[8..], u32::from_le_bytes([b[4], b[5], b[6], b[7]]));
        (scale[0], offset[0]) = (f16_at(b), -f16_at(&b[2..]));
    }
}

impl Unpack for Q8_0 {
    const BLOCK_BYTES: usize = 34;
    const VALUES: usize = 32;
    const SUB: usize = 32;
    #[inline(always)]
    unsafe fn unpack(
        b: &[u8],
        codes: &mut [__m256i; 8],
        scale: &mut [f32; 16],
        offset: &mut [f32; 16],
    ) {
        let d = f16_at(b);
        // q + 128 as an unsigned byte is q with its top bit flipped.
        codes[0] = _mm256_xor_si256(load32(&b[2..]), _mm256_set1_epi8(-128));
        (scale[0], offset[0]) = (d, 128.0 * d);
    }
}

impl Unpack for Q2K {
    const BLOCK_BYTES: usize = 84;
    const VALUES: usize = 256;
    const SUB: usize = 16;
    #[inline(always)]
    unsafe fn unpack(
        b: &[u8],
        codes: &mut [__m256i; 8],
        scale: &mut [f32; 16],
        offset: &mut [f32; 16],
    ) {
        let (d, dmin) = (f16_at(&b[80..]), f16_at(&b[82..]));
        for half in 0..2 {
            let qs = load32(&b[16 + half * 32..]);
            for shift in 0..4 {
                codes[half * 4 + shift] = crumbs(qs, shift);
            }
        }
        for g in 0..16 {
            scale[g] = d * f32::from(b[g] & 0xF);
            offset[g] = dmin * f32::from(b[g] >> 4);
        }
    }
}

impl Unpack for Q3K {
    const BLOCK_BYTES: usize = 110;
    const VALUES: usize = 256;
    const SUB: usize = 16;
    #[inline(always)]
    unsafe fn unpack(
        b: &[u8],
        codes: &mut [__m256i; 8],
        scale: &mut [f32; 16],
        offset: &mut [f32; 16],
    ) {
        let d = f16_at(&b[108..]);
        let hmask = load32(b);
        for half in 0..2 {
            let qs = load32(&b[32 + half * 32..]);
            for shift in 0..4 {
                let j = half * 4 + shift;
                // q + 4: the high bit set adds 4.
                codes[j] =
                    _mm256_or_si256(crumbs(qs, shift), masked_bit(hmask, (1u8 << j) as i8, 4));
            }
        }
        for (g, s) in q3k_scales(b).into_iter().enumerate() {
            scale[g] = d * f32::from(s);
            offset[g] = 4.0 * scale[g];
        }
    }
}

#[inline(always)]
unsafe fn k_with_min<const FIFTH_BIT: bool>(
    b: &[u8],
    codes: &mut [__m256i; 8],
    scale: &mut [f32; 16],
    offset: &mut [f32; 16],
) {
    let (d, dmin) = (f16_at(b), f16_at(&b[2..]));
    let (sc, min) = k_scale_min(&b[4..16]);
    *codes = k_min_codes::<FIFTH_BIT>(b);
    for j in 0..8 {
        scale[j] = d * f32::from(sc[j]);
        offset[j] = dmin * f32::from(min[j]);
    }
}

impl Unpack for Q4K {
    const BLOCK_BYTES: usize = 144;
    const VALUES: usize = 256;
    const SUB: usize = 32;
    #[inline(always)]
    unsafe fn unpack(
        b: &[u8],
        codes: &mut [__m256i; 8],
        scale: &mut [f32; 16],
        offset: &mut [f32; 16],
    ) {
        k_with_min::<false>(b, codes, scale, offset)
    }
}

impl Unpack for Q5K {
    const BLOCK_BYTES: usize = 176;
    const VALUES: usize = 256;
    const SUB: usize = 32;
    #[inline(always)]
    unsafe fn unpack(
        b: &[u8],
        codes: &mut [__m256i; 8],
        scale: &mut [f32; 16],
        offset: &mut [f32; 16],
    ) {
        k_with_min::<true>(b, codes, scale, offset)
    }
}

impl Unpack for Q6K {
    const BLOCK_BYTES: usize = 210;
    const VALUES: usize = 256;
    const SUB: usize = 16;
    #[inline(always)]
    unsafe fn unpack(
        b: &[u8],
        codes: &mut [__m256i; 8],
        scale: &mut [f32; 16],
        offset: &mut [f32; 16],
    ) {
        for half in 0..2 {
            let ql0 = load32(&b[half * 64..]);
            let ql1 = load32(&b[half * 64 + 32..]);
            let qh = load32(&b[128 + half * 32..]);
            codes[half * 4..half * 4 + 4].copy_from_slice(&q6_codes(ql0, ql1, qh));
        }
        let d = f16_at(&b[208..]);
        for g in 0..16 {
            scale[g] = d * f32::from(b[192 + g] as i8);
            offset[g] = 32.0 * scale[g];
        }
    }
}

// The table-lookup formats: each value v of the table becomes the
// unsigned code v + OFFSET (IQ4's −127..113 by 128, MXFP4's −12..12 by 12)
// by the same byte shuffle that looks it up, and the offset comes off as
// OFFSET · scale. IQ4's codes reach 241: `vpmaddubsw` would saturate their
// pair sums, so on AVX2 their panels go through `Avx2SignedCodes`.

pub(super) struct Iq4Nl;
pub(super) struct Iq4Xs;
pub(super) struct Mxfp4;

impl Unpack for Iq4Nl {
    const BLOCK_BYTES: usize = 18;
    const VALUES: usize = 32;
    const SUB: usize = 32;
    #[inline(always)]
    unsafe fn unpack(
        b: &[u8],
        codes: &mut [__m256i; 8],
        scale: &mut [f32; 16],
        offset: &mut [f32; 16],
    ) {
        let d = f16_at(b);
        codes[0] = lookup16(&b[2..], table16(&IQ4_VALUES, -128));
        (scale[0], offset[0]) = (d, 128.0 * d);
    }
}

impl Unpack for Iq4Xs {
    const BLOCK_BYTES: usize = 136;
    const VALUES: usize = 256;
    const SUB: usize = 32;
    #[inline(always)]
    unsafe fn unpack(
        b: &[u8],
        codes: &mut [__m256i; 8],
        scale: &mut [f32; 16],
        offset: &mut [f32; 16],
    ) {
        let table = table16(&IQ4_VALUES, -128);
        for (ib, dl) in iq4_xs_scales(b).into_iter().enumerate() {
            codes[ib] = lookup16(&b[8 + 16 * ib..], table);
            (scale[ib], offset[ib]) = (dl, 128.0 * dl);
        }
    }
}

impl Unpack for Mxfp4 {
    const BLOCK_BYTES: usize = 17;
    const VALUES: usize = 32;
    const SUB: usize = 32;
    #[inline(always)]
    unsafe fn unpack(
        b: &[u8],
        codes: &mut [__m256i; 8],
        scale: &mut [f32; 16],
        offset: &mut [f32; 16],
    ) {
        let d = e8m0_half(b[0]);
        codes[0] = lookup16(&b[1..], table16(&MXFP4_VALUES, 12));
        (scale[0], offset[0]) = (d, 12.0 * d);
    }
}

/// Transposes eight rows of eight 32-bit elements: out[k] holds element k of
/// every row, row r in lane r.
#[inline(always)]
unsafe fn transpose8(a: [__m256i; 8]) -> [__m256i; 8] {
    let t = [
        _mm256_unpacklo_epi32(a[0], a[1]),
        _mm256_unpackhi_epi32(a[0], a[1]),
        _mm256_unpacklo_epi32(a[2], a[3]),
        _mm256_unpackhi_epi32(a[2], a[3]),
        _mm256_unpacklo_epi32(a[4], a[5]),
        _mm256_unpackhi_epi32(a[4], a[5]),
        _mm256_unpacklo_epi32(a[6], a[7]),
        _mm256_unpackhi_epi32(a[6], a[7]),
    ];
    // u[k] holds elements k and k + 4 of four rows (rows 0..4, then 4..8).
    let u = [
        _mm256_unpacklo_epi64(t[0], t[2]),
        _mm256_unpackhi_epi64(t[0], t[2]),
        _mm256_unpacklo_epi64(t[1], t[3]),
        _mm256_unpackhi_epi64(t[1], t[3]),
        _mm256_unpacklo_epi64(t[4], t[6]),
        _mm256_unpackhi_epi64(t[4], t[6]),
        _mm256_unpacklo_epi64(t[5], t[7]),
        _mm256_unpackhi_epi64(t[5], t[7]),
    ];
    [
        _mm256_permute2x128_si256(u[0], u[4], 0x20),
        _mm256_permute2x128_si256(u[1], u[5], 0x20),
        _mm256_permute2x128_si256(u[2], u[6], 0x20),
        _mm256_permute2x128_si256(u[3], u[7], 0x20),
        _mm256_permute2x128_si256(u[0], u[4], 0x31),
        _mm256_permute2x128_si256(u[1], u[5], 0x31),
        _mm256_permute2x128_si256(u[2], u[6], 0x31),
        _mm256_permute2x128_si256(u[3], u[7], 0x31),
    ]
}

#[inline(always)]
unsafe fn store_chunk(chunk: &mut [u8; 32], codes: __m256i) {
    _mm256_storeu_si256(chunk.as_mut_ptr().cast(), codes)
}

/// Sub-block g's scales and offsets of `panel`'s rows.
#[inline(always)]
unsafe fn store_factors(panel: &mut PanelHalf<'_>, g: usize, scales: __m256, offsets: __m256) {
    let (s, o) = panel.factors(g);
    _mm256_storeu_ps(s.as_mut_ptr(), scales);
    _mm256_storeu_ps(o.as_mut_ptr(), offsets);
}

/// Unpacks `PANEL_ROWS` rows of `row_bytes` bytes (`rows` holds exactly
/// those) into `panel`.
#[inline(always)]
pub(super) unsafe fn pack<F: Unpack>(rows: &[u8], row_bytes: usize, mut panel: PanelHalf<'_>) {
    let n_blocks = row_bytes / F::BLOCK_BYTES;
    assert!(
        rows.len() == PANEL_ROWS * row_bytes
            && row_bytes == n_blocks * F::BLOCK_BYTES
            && panel.sub() == F::SUB
            && panel.cols() == n_blocks * F::VALUES,
        "a panel of {} columns by {} for {} bytes a row",
        panel.cols(),
        panel.sub(),
        row_bytes
    );
    let (groups, subs) = (F::VALUES / 32, F::VALUES / F::SUB);
    let mut codes = [[_mm256_setzero_si256(); 8]; PANEL_ROWS];
    let mut scale = [[0f32; 16]; PANEL_ROWS];
    let mut offset = [[0f32; 16]; PANEL_ROWS];
    for blk in 0..n_blocks {
        for r in 0..PANEL_ROWS {
            let at = r * row_bytes + blk * F::BLOCK_BYTES;
            F::unpack(
                &rows[at..at + F::BLOCK_BYTES],
                &mut codes[r],
                &mut scale[r],
                &mut offset[r],
            );
        }
        for j in 0..groups {
            let chunks = transpose8(std::array::from_fn(|r| codes[r][j]));
            // Group j's eight chunks.
            for (k, c) in chunks.into_iter().enumerate() {
                store_chunk(panel.chunk((blk * groups + j) * 8 + k), c);
            }
        }
        for g in 0..subs {
            let (scales, offsets) = panel.factors(blk * subs + g);
            for r in 0..PANEL_ROWS {
                scales[r] = scale[r][g];
                offsets[r] = offset[r][g];
            }
        }
    }
}

/// d · Σ q over the `SUB` columns of `act` from column `first` (0, or 16
/// for the second half of a block): what a sub-block's offset multiplies.
#[inline(always)]
fn sub_block_sum<const SUB: usize>(act: &Q8Block, first: usize) -> f32 {
    if SUB == 32 {
        act.d_sum
    } else {
        act.d * f32::from(act.half_sums[first / 16])
    }
}

/// The panel's rows dotted with `T` tokens, whose blocks start at `acts[t]`:
/// lane r of result t is row r · token t.
///
/// # Safety
/// `acts[t]` points to `panel.cols / 32` blocks; `panel.sub == SUB`.
#[inline(always)]
unsafe fn tile<D: CodeDot, const SUB: usize, const T: usize>(
    panel: &Panel,
    acts: [*const Q8Block; T],
) -> [__m256; T] {
    let mut acc = [_mm256_setzero_ps(); T];
    let codes = panel.codes.as_ptr();
    let factors = panel.factors.as_ptr();
    for g in 0..panel.cols / SUB {
        let (block, first) = (g * SUB / 32, g * SUB % 32);
        let mut isum = [_mm256_setzero_si256(); T];
        for k in 0..SUB / 4 {
            // SAFETY (all pointer reads): chunk g·SUB/4 + k < cols/4 of the
            // panel's codes, block < cols/32 of each token's activations,
            // sub-block g < cols/SUB of the factors.
            let w = _mm256_loadu_si256(codes.add((g * SUB / 4 + k) * 32).cast());
            for t in 0..T {
                let q = (*acts[t].add(block)).qs.as_ptr().add(first + 4 * k);
                let four = _mm256_set1_epi32(q.cast::<i32>().read_unaligned());
                isum[t] = D::biased_dot_add(isum[t], w, four);
            }
        }
        if D::BIAS != 0 {
            // Σ u·a = Σ (u − BIAS)·a + BIAS · Σ a, exactly: the sums are
            // then the other products' to the bit.
            for t in 0..T {
                let a = &*acts[t].add(block);
                let a_sum = if SUB == 32 {
                    a.sum()
                } else {
                    i32::from(a.half_sums[first / 16])
                };
                isum[t] = _mm256_add_epi32(isum[t], _mm256_set1_epi32(D::BIAS * a_sum));
            }
        }
        let scale = _mm256_loadu_ps(factors.add(g * 2 * PANEL_ROWS));
        let offset = _mm256_loadu_ps(factors.add(g * 2 * PANEL_ROWS + PANEL_ROWS));
        for t in 0..T {
            let a = &*acts[t].add(block);
            let q_sum = sub_block_sum::<SUB>(a, first);
            let scaled = _mm256_mul_ps(scale, _mm256_set1_ps(a.d));
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), scaled, acc[t]);
            acc[t] = _mm256_fnmadd_ps(offset, _mm256_set1_ps(q_sum), acc[t]);
        }
    }
    acc
}

/// Sub-block g's scales and offsets of a pair of panels, half 0's rows in
/// lanes 0..8 and half 1's in 8..16: what a pair product's sums of that
/// sub-block are scaled by.
///
/// # Safety
/// `pair` is a pair; g < cols / sub; the CPU has AVX-512 F.
#[inline(always)]
pub(super) unsafe fn pair_factors(pair: &Panel, g: usize) -> (__m512, __m512) {
    let at = pair.factors.as_ptr().add(g * 4 * PANEL_ROWS);
    (_mm512_loadu_ps(at), _mm512_loadu_ps(at.add(2 * PANEL_ROWS)))
}

/// `acc` plus one token's integer sums of a sub-block (sixteen rows)
/// scaled: `scale · d · isum − offset · d · Σ q`, in the f32 operations
/// every pair product uses, so that its rows' results are the same bit
/// for bit on each path.
///
/// # Safety
/// The CPU has AVX-512 F.
#[inline(always)]
pub(super) unsafe fn scale_pair_sums<const SUB: usize>(
    isum: __m512i,
    act: &Q8Block,
    first: usize,
    (scale, offset): (__m512, __m512),
    acc: __m512,
) -> __m512 {
    let q_sum = sub_block_sum::<SUB>(act, first);
    let scaled = _mm512_mul_ps(scale, _mm512_set1_ps(act.d));
    let acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), scaled, acc);
    _mm512_fnmadd_ps(offset, _mm512_set1_ps(q_sum), acc)
}

/// Checks that `panel` is whole and has sub-blocks of `sub`, that `acts`
/// holds whole tokens of its blocks and `out` a run of its rows for each;
/// returns the blocks a token and the tokens.
pub(super) fn panel_product_shapes(
    panel: &Panel,
    sub: usize,
    acts: &[Q8Block],
    out: &PanelOut,
) -> (usize, usize) {
    let cols = panel.cols;
    let blocks = cols / 32;
    assert!(
        panel.sub == sub
            && panel.codes.len() == cols * panel.rows()
            && panel.factors.len() == cols / sub * 2 * panel.rows()
            && blocks > 0
            && cols == blocks * 32
            && acts.len().is_multiple_of(blocks)
            && out.tokens() == acts.len() / blocks
            && out.width() == panel.rows(),
        "panel product shapes"
    );
    (blocks, acts.len() / blocks)
}

/// A pair of panels' rows dotted with `T` tokens in 512-bit vectors: lanes
/// 0..8 are half 0's rows, lanes 8..16 half 1's. Each token's broadcast
/// activations and each sub-block's scaling then serve sixteen rows. Every
/// lane goes through the operations of [`tile`] in the same order, so a
/// row's sums are [`tile`]'s, bit for bit.
///
/// # Safety
/// As [`tile`], for a pair; the CPU has AVX-512 F and VNNI.
#[inline(always)]
unsafe fn tile_pair<const SUB: usize, const T: usize>(
    pair: &Panel,
    acts: [*const Q8Block; T],
) -> [__m512; T] {
    let mut acc = [_mm512_setzero_ps(); T];
    let codes = pair.codes.as_ptr();
    for g in 0..pair.cols / SUB {
        let (block, first) = (g * SUB / 32, g * SUB % 32);
        let mut isum = [_mm512_setzero_si512(); T];
        for k in 0..SUB / 4 {
            // SAFETY (all pointer reads): as in `tile`, for 64-byte chunks.
            let w = _mm512_loadu_si512(codes.add((g * SUB / 4 + k) * 64).cast());
            for t in 0..T {
                let q = (*acts[t].add(block)).qs.as_ptr().add(first + 4 * k);
                let four = _mm512_set1_epi32(q.cast::<i32>().read_unaligned());
                isum[t] = _mm512_dpbusd_epi32(isum[t], w, four);
            }
        }
        let factors = pair_factors(pair, g);
        for t in 0..T {
            acc[t] = scale_pair_sums::<SUB>(isum[t], &*acts[t].add(block), first, factors, acc[t]);
        }
    }
    acc
}

/// The tiles of a panel product: one panel's rows ([`tile`]) or a pair's
/// ([`tile_pair`]).
trait PanelTile {
    /// Value r of `out`'s run t0 + t = row r · token t for the `T` tokens
    /// whose blocks start at `acts[t]`.
    ///
    /// # Safety
    /// As [`tile`]; `out` has runs of the panel's rows, at least t0 + T.
    unsafe fn tile<const T: usize>(&self, acts: [*const Q8Block; T], out: &mut PanelOut, t0: usize);
}

struct OnePanel<'a, D, const SUB: usize>(&'a Panel, PhantomData<D>);

impl<D: CodeDot, const SUB: usize> PanelTile for OnePanel<'_, D, SUB> {
    #[inline(always)]
    unsafe fn tile<const T: usize>(
        &self,
        acts: [*const Q8Block; T],
        out: &mut PanelOut,
        t0: usize,
    ) {
        for (t, s) in tile::<D, SUB, T>(self.0, acts).into_iter().enumerate() {
            _mm256_storeu_ps(out.run(t0 + t)[..PANEL_ROWS].as_mut_ptr(), s);
        }
    }
}

struct PairOfPanels<'a, const SUB: usize>(&'a Panel);

impl<const SUB: usize> PanelTile for PairOfPanels<'_, SUB> {
    #[inline(always)]
    unsafe fn tile<const T: usize>(
        &self,
        acts: [*const Q8Block; T],
        out: &mut PanelOut,
        t0: usize,
    ) {
        for (t, s) in tile_pair::<SUB, T>(self.0, acts).into_iter().enumerate() {
            _mm512_storeu_ps(out.run(t0 + t)[..2 * PANEL_ROWS].as_mut_ptr(), s);
        }
    }
}

/// Value r of `out`'s run t = row r of `panel` · token t for every token
/// of `acts`, `MAX` tokens a tile of `kernel` (which multiplies `panel`).
#[inline(always)]
unsafe fn product_tiles<K: PanelTile, const SUB: usize, const MAX: usize>(
    kernel: &K,
    panel: &Panel,
    acts: &[Q8Block],
    mut out: PanelOut,
) {
    let (blocks, n_tokens) = panel_product_shapes(panel, SUB, acts, &out);
    let mut t0 = 0;
    while t0 < n_tokens {
        let n = (n_tokens - t0).min(MAX);
        let token = |t: usize| acts[(t0 + t) * blocks..].as_ptr();
        macro_rules! tiles {
            ($($n:literal),*) => {
                match n {
                    // SAFETY: each token's pointer starts `blocks` blocks
                    // inside `acts`; the panel's shapes are checked above.
                    $($n => kernel.tile::<$n>(std::array::from_fn(token), &mut out, t0),)*
                    _ => unreachable!("{n} tokens a tile"),
                }
            };
        }
        tiles!(1, 2, 3, 4, 5, 6, 7, 8);
        t0 += n;
    }
}

/// Value r of `out`'s run t = panel row r · token t for every token of
/// `acts`, `MAX` tokens a tile.
#[inline(always)]
pub(super) unsafe fn product<D: CodeDot, const SUB: usize, const MAX: usize>(
    panel: &Panel,
    acts: &[Q8Block],
    out: PanelOut,
) {
    assert_eq!(panel.halves, 1, "a pair in a one-panel product");
    let kernel = OnePanel::<D, SUB>(panel, PhantomData);
    product_tiles::<_, SUB, MAX>(&kernel, panel, acts, out)
}

/// Value r of `out`'s run t = row r of a pair of panels · token t, for
/// every token of `acts`, `MAX` tokens a tile, through [`tile_pair`].
///
/// # Safety
/// The CPU has AVX-512 F and VNNI.
#[inline(always)]
pub(super) unsafe fn product_pair<const SUB: usize, const MAX: usize>(
    pair: &Panel,
    acts: &[Q8Block],
    out: PanelOut,
) {
    assert_eq!(pair.halves, 2, "a panel in a pair product");
    product_tiles::<_, SUB, MAX>(&PairOfPanels::<SUB>(pair), pair, acts, out)
}

/// Eight bytes at `p` as eight f32 lanes.
#[inline(always)]
unsafe fn bytes8_to_f32(p: *const u8) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(p.cast())))
}

/// Interleaved Q4_K rows (`crate::quant::interleaved`) dotted with one
/// token: `out[r]` = row r · act.
#[inline(always)]
pub(super) unsafe fn interleaved_q4_k_rows<D: IntDot>(
    data: &[u8],
    cols: usize,
    act: &[Q8Block],
    out: &mut [f32],
) {
    const BLOCK: usize = Q4_K_GROUP_BLOCK;
    let m4 = _mm256_set1_epi8(0x0F);
    let far = far_prefetch();
    for (group, y) in row_groups(data, cols, 256, BLOCK, act, out, "Q4_K") {
        let (mut total, mut total_min) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        for (s, block) in group.chunks_exact(BLOCK).enumerate() {
            prefetch_ahead(block, far, &[2 * BLOCK, 2 * BLOCK + 512]);
            let b = block.as_ptr();
            let blocks = &act[s * 8..s * 8 + 8];
            // Σ_j sc_j · a_j.d · isum_j and Σ_j min_j · a_j.d_sum, d and dmin
            // applied once a super-block.
            let (mut sums, mut mins) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            for p in 0..4 {
                let (low, high) = (&blocks[2 * p], &blocks[2 * p + 1]);
                let mut isum = [_mm256_setzero_si256(); 2];
                for k in 0..8 {
                    // SAFETY (all pointer reads): chunk 8p + k, the scale and
                    // minimum bytes and activation bytes 4k..4k + 4 are in
                    // bounds of the block and the activations.
                    let w = _mm256_loadu_si256(b.add(160 + (8 * p + k) * 32).cast());
                    let codes = [
                        _mm256_and_si256(w, m4),
                        _mm256_and_si256(_mm256_srli_epi16(w, 4), m4),
                    ];
                    for (h, a) in [low, high].into_iter().enumerate() {
                        let four = _mm256_set1_epi32(
                            a.qs.as_ptr().add(4 * k).cast::<i32>().read_unaligned(),
                        );
                        isum[h] = D::dot_add(isum[h], codes[h], four);
                    }
                }
                for (h, a) in [low, high].into_iter().enumerate() {
                    let j = 2 * p + h;
                    let scale =
                        _mm256_mul_ps(bytes8_to_f32(b.add(32 + 8 * j)), _mm256_set1_ps(a.d));
                    sums = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[h]), scale, sums);
                    mins = _mm256_fmadd_ps(
                        bytes8_to_f32(b.add(96 + 8 * j)),
                        _mm256_set1_ps(a.d_sum),
                        mins,
                    );
                }
            }
            let d = _mm256_cvtph_ps(_mm_loadu_si128(b.cast()));
            let dmin = _mm256_cvtph_ps(_mm_loadu_si128(b.add(16).cast()));
            total = _mm256_fmadd_ps(sums, d, total);
            total_min = _mm256_fmadd_ps(mins, dmin, total_min);
        }
        _mm256_storeu_ps(y.as_mut_ptr(), _mm256_sub_ps(total, total_min));
    }
}

/// The groups of eight interleaved rows in `data`, each with its eight
/// outputs, once the shapes are checked: a group holds `block` bytes for
/// every `span` columns, and `act` one Q8 block per 32 columns.
fn row_groups<'a>(
    data: &'a [u8],
    cols: usize,
    span: usize,
    block: usize,
    act: &[Q8Block],
    out: &'a mut [f32],
    what: &str,
) -> impl Iterator<Item = (&'a [u8], &'a mut [f32])> {
    let blocks = cols / span;
    assert!(
        cols.is_multiple_of(span)
            && act.len() * 32 == cols
            && out.len().is_multiple_of(PANEL_ROWS)
            && data.len() == out.len() / PANEL_ROWS * blocks * block,
        "interleaved {what} shapes"
    );
    data.chunks_exact(blocks * block)
        .zip(out.chunks_exact_mut(PANEL_ROWS))
}

/// How far ahead of the block in use the interleaved kernels prefetch where
/// they prefetch far (`prefetch_ahead`).
const FAR_PREFETCH: usize = 4608;

/// Prefetches the interleaved copy ahead of `block`, in the way that suits
/// the core. A decode step's task reads a short stream (tens to hundreds of
/// kilobytes), and on most cores the hardware prefetchers reach full speed
/// on it too late: prefetching every cache line of the stretch
/// `FAR_PREFETCH` bytes ahead, as long as the block, takes an Intel thread
/// from 7 to 13 GB/s on Q4_K and a Qwen3-8B-shaped decode from llama.cpp's
/// speed to 1.4 times it, and a Zen 3 thread's SmolLM2 decode from 56–70
/// to 81–88 tokens/s (docs/cpu.md). On AMD cores with AVX-512 (Zen 4 on)
/// the same prefetches halve the decode; there the kernels prefetch only
/// the lines at `near` (offsets from the block), which the hardware streams
/// on from. Past the copy's end the addresses are only prefetched, never
/// read.
#[inline(always)]
unsafe fn prefetch_ahead(block: &[u8], far: bool, near: &[usize]) {
    if far {
        super::prefetch_lines(block.as_ptr().wrapping_add(FAR_PREFETCH), block.len());
    } else {
        for &offset in near {
            _mm_prefetch(block.as_ptr().wrapping_add(offset).cast(), _MM_HINT_T0);
        }
    }
}

/// Whether to prefetch far ahead (`prefetch_ahead`): on every core but an
/// AMD one with AVX-512, read once.
fn far_prefetch() -> bool {
    static FAR: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *FAR.get_or_init(|| {
        // CPUID leaf 0: the vendor string, on every x86-64.
        let id = __cpuid(0);
        let amd = [id.ebx, id.edx, id.ecx]
            .iter()
            .flat_map(|r| r.to_le_bytes())
            .eq(*b"AuthenticAMD");
        !(amd && is_x86_feature_detected!("avx512f"))
    })
}

/// Checks that `group` holds `block` bytes for each 256 columns of
/// `panel`, made with sub-blocks of `sub` columns (the super-block layouts'
/// packing).
fn check_super_block_panel(
    group: &[u8],
    block: usize,
    panel: &PanelHalf<'_>,
    sub: usize,
    what: &str,
) {
    assert!(
        panel.sub() == sub && group.len() == panel.cols() / 256 * block,
        "an interleaved {what} group of {} bytes for a panel of {} columns",
        group.len(),
        panel.cols()
    );
}

/// Eight interleaved Q4_K rows as a panel.
#[inline(always)]
pub(super) unsafe fn pack_interleaved_q4_k(group: &[u8], mut panel: PanelHalf<'_>) {
    const BLOCK: usize = Q4_K_GROUP_BLOCK;
    check_super_block_panel(group, BLOCK, &panel, 32, "Q4_K");
    let m4 = _mm256_set1_epi8(0x0F);
    for (s, block) in group.chunks_exact(BLOCK).enumerate() {
        let b = block.as_ptr();
        let d = _mm256_cvtph_ps(_mm_loadu_si128(b.cast()));
        let dmin = _mm256_cvtph_ps(_mm_loadu_si128(b.add(16).cast()));
        for j in 0..8 {
            let scale = _mm256_mul_ps(d, bytes8_to_f32(b.add(32 + 8 * j)));
            let min = _mm256_mul_ps(dmin, bytes8_to_f32(b.add(96 + 8 * j)));
            store_factors(&mut panel, s * 8 + j, scale, min);
        }
        for p in 0..4 {
            for k in 0..8 {
                let w = load32(&block[160 + (8 * p + k) * 32..]);
                // Sub-blocks 2p and 2p + 1, chunk k of each.
                let low = _mm256_and_si256(w, m4);
                store_chunk(panel.chunk((s * 8 + 2 * p) * 8 + k), low);
                let high = _mm256_and_si256(_mm256_srli_epi16(w, 4), m4);
                store_chunk(panel.chunk((s * 8 + 2 * p + 1) * 8 + k), high);
            }
        }
    }
}

/// Bit 4 of byte i of each lane: bit `first + i` of the lane's u32 of fifth
/// bits, for i in 0..4. One multiply spreads four bits a byte apart (bit i
/// lands at 8i + 4; the four copies of the nibble never overlap, so no
/// carries), and a mask keeps the wanted ones.
#[inline(always)]
unsafe fn fifth_bits(qh: __m256i, first: i32) -> __m256i {
    let nibble = _mm256_and_si256(
        _mm256_srl_epi32(qh, _mm_cvtsi32_si128(first)),
        _mm256_set1_epi32(0xF),
    );
    let spread = _mm256_mullo_epi32(
        nibble,
        _mm256_set1_epi32((1 << 4) | (1 << 11) | (1 << 18) | (1 << 25)),
    );
    _mm256_and_si256(spread, _mm256_set1_epi32(0x1010_1010))
}

/// A layout of 32-column blocks (`crate::quant::interleaved`): each block
/// is the eight rows' f16 scales d, then what `codes` turns into eight
/// chunks of unsigned codes q + `OFFSET` (chunk c: columns 4c..4c + 4); a
/// weight is d · q, or with `MINS` (Q4_1: the rows' f16 minimums m follow
/// the scales) d · q + m.
pub(super) trait Block32 {
    const BLOCK: usize;
    const OFFSET: i32;
    const MINS: bool = false;
    /// The block's eight chunks of codes.
    unsafe fn codes(block: &[u8]) -> [__m256i; 8];

    /// The eight rows' scales d.
    #[inline(always)]
    unsafe fn scales(block: &[u8]) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(block.as_ptr().cast()))
    }
}

/// The eight rows' f16 minimums of a [`Block32::MINS`] block.
#[inline(always)]
unsafe fn block_mins(block: &[u8]) -> __m256 {
    _mm256_cvtph_ps(_mm_loadu_si128(block[16..32].as_ptr().cast()))
}

pub(super) struct Q8_0x8;
pub(super) struct Q4_0x8;
pub(super) struct Q4_1x8;
pub(super) struct Q5_0x8;

impl Block32 for Q8_0x8 {
    const BLOCK: usize = Q8_0_GROUP_BLOCK;
    const OFFSET: i32 = 128;
    #[inline(always)]
    unsafe fn codes(block: &[u8]) -> [__m256i; 8] {
        std::array::from_fn(|k| load32(&block[16 + 32 * k..]))
    }
}

/// Q4_0 and Q5_0's four chunks of nibbles: low nibbles are columns
/// 4k..4k + 4, high ones 16 + 4k..20 + 4k; `fifth(c)` is bit 4 of chunk c.
#[inline(always)]
unsafe fn nibble_chunks(nibbles: &[u8], fifth: impl Fn(usize) -> __m256i) -> [__m256i; 8] {
    let m4 = _mm256_set1_epi8(0x0F);
    let mut out = [_mm256_setzero_si256(); 8];
    for k in 0..4 {
        let w = load32(&nibbles[32 * k..]);
        out[k] = _mm256_or_si256(_mm256_and_si256(w, m4), fifth(k));
        out[4 + k] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(w, 4), m4), fifth(4 + k));
    }
    out
}

impl Block32 for Q4_0x8 {
    const BLOCK: usize = Q4_0_GROUP_BLOCK;
    const OFFSET: i32 = 8;
    #[inline(always)]
    unsafe fn codes(block: &[u8]) -> [__m256i; 8] {
        nibble_chunks(&block[16..], |_| _mm256_setzero_si256())
    }
}

/// The table-lookup layouts' four chunks of nibbles (as Q4_0's), each
/// nibble replaced by its entry of `table`.
#[inline(always)]
unsafe fn looked_up_chunks(nibbles: &[u8], table: __m256i) -> [__m256i; 8] {
    nibble_chunks(nibbles, |_| _mm256_setzero_si256()).map(|c| _mm256_shuffle_epi8(table, c))
}

/// IQ4_NL in Q4_0's layout: each nibble looked up as its value + 128.
pub(super) struct Iq4NlX8;

impl Block32 for Iq4NlX8 {
    const BLOCK: usize = Q4_0_GROUP_BLOCK;
    const OFFSET: i32 = 128;
    #[inline(always)]
    unsafe fn codes(block: &[u8]) -> [__m256i; 8] {
        looked_up_chunks(&block[16..], table16(&IQ4_VALUES, -128))
    }
}

/// MXFP4: the eight rows' exponent bytes, then Q4_0's nibbles, each looked
/// up as its value + 12.
pub(super) struct Mxfp4X8;

impl Block32 for Mxfp4X8 {
    const BLOCK: usize = MXFP4_GROUP_BLOCK;
    const OFFSET: i32 = 12;
    #[inline(always)]
    unsafe fn codes(block: &[u8]) -> [__m256i; 8] {
        looked_up_chunks(&block[8..], table16(&MXFP4_VALUES, 12))
    }

    /// 2^(e − 128) for each row's exponent e, as `e8m0_half` computes it:
    /// (e − 1) as the float's exponent field, or for e < 2 the subnormal
    /// 2^21 << e.
    #[inline(always)]
    unsafe fn scales(block: &[u8]) -> __m256 {
        let e = _mm256_cvtepu8_epi32(_mm_loadl_epi64(block.as_ptr().cast()));
        let normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
        let subnormal = _mm256_sllv_epi32(_mm256_set1_epi32(0x0020_0000), e);
        let is_normal = _mm256_cmpgt_epi32(e, _mm256_set1_epi32(1));
        _mm256_castsi256_ps(_mm256_blendv_epi8(subnormal, normal, is_normal))
    }
}

impl Block32 for Q4_1x8 {
    const BLOCK: usize = Q4_1_GROUP_BLOCK;
    const OFFSET: i32 = 0;
    const MINS: bool = true;
    #[inline(always)]
    unsafe fn codes(block: &[u8]) -> [__m256i; 8] {
        nibble_chunks(&block[32..], |_| _mm256_setzero_si256())
    }
}

impl Block32 for Q5_0x8 {
    const BLOCK: usize = Q5_0_GROUP_BLOCK;
    const OFFSET: i32 = 16;
    #[inline(always)]
    unsafe fn codes(block: &[u8]) -> [__m256i; 8] {
        let qh = load32(&block[16..]);
        nibble_chunks(&block[48..], |c| fifth_bits(qh, 4 * c as i32))
    }
}

/// Eight rows' 32 codes q + `offset` (chunk k: columns 4k..4k + 4, row r
/// at bytes 4r..4r + 4) dotted with one Q8 block: Σ q·a per row, as f32.
/// Σ (q + offset − BIAS)·a − (offset − BIAS)·Σ a; two chains of four dots,
/// half the latency of one of eight.
#[inline(always)]
unsafe fn offset_codes_dot<D: CodeDot>(codes: [__m256i; 8], a: &Q8Block, offset: i32) -> __m256 {
    let q = a.qs.as_ptr();
    let mut isum = [
        _mm256_set1_epi32((D::BIAS - offset) * a.sum()),
        _mm256_setzero_si256(),
    ];
    for (k, c) in codes.into_iter().enumerate() {
        // SAFETY: activation bytes 4k..4k + 4 are in bounds (k < 8).
        let four = _mm256_set1_epi32(q.add(4 * k).cast::<i32>().read_unaligned());
        isum[k % 2] = D::biased_dot_add(isum[k % 2], c, four);
    }
    _mm256_cvtepi32_ps(_mm256_add_epi32(isum[0], isum[1]))
}

/// Interleaved rows of a 32-column layout dotted with one token: `out[r]` =
/// row r · act.
#[inline(always)]
pub(super) unsafe fn interleaved_block32_rows<D: CodeDot, L: Block32>(
    data: &[u8],
    cols: usize,
    act: &[Q8Block],
    out: &mut [f32],
) {
    let far = far_prefetch();
    for (group, y) in row_groups(data, cols, 32, L::BLOCK, act, out, "32-column") {
        let mut acc = [_mm256_setzero_ps(); 2];
        for (b, (block, a)) in group.chunks_exact(L::BLOCK).zip(act).enumerate() {
            prefetch_ahead(block, far, &[2048]);
            let d = L::scales(block);
            let sums = offset_codes_dot::<D>(L::codes(block), a, L::OFFSET);
            acc[b % 2] = _mm256_fmadd_ps(sums, _mm256_mul_ps(d, _mm256_set1_ps(a.d)), acc[b % 2]);
            if L::MINS {
                // Σ m · a = m · (the block's activation scale × Σ codes).
                let a_sum = _mm256_set1_ps(a.d * a.sum() as f32);
                acc[b % 2] = _mm256_fmadd_ps(block_mins(block), a_sum, acc[b % 2]);
            }
        }
        _mm256_storeu_ps(y.as_mut_ptr(), _mm256_add_ps(acc[0], acc[1]));
    }
}

/// Eight interleaved rows of a 32-column layout as a panel.
#[inline(always)]
pub(super) unsafe fn pack_interleaved_block32<L: Block32>(group: &[u8], mut panel: PanelHalf<'_>) {
    let blocks = panel.cols() / 32;
    assert!(
        panel.sub() == 32 && group.len() == blocks * L::BLOCK,
        "an interleaved group of {} bytes for a panel of {} columns",
        group.len(),
        panel.cols()
    );
    let offset = _mm256_set1_ps(L::OFFSET as f32);
    for (b, block) in group.chunks_exact(L::BLOCK).enumerate() {
        let d = L::scales(block);
        // A panel subtracts its offsets: d · OFFSET, or a minimum's −m.
        let subtracted = if L::MINS {
            _mm256_sub_ps(_mm256_setzero_ps(), block_mins(block))
        } else {
            _mm256_mul_ps(d, offset)
        };
        store_factors(&mut panel, b, d, subtracted);
        for (k, c) in L::codes(block).into_iter().enumerate() {
            store_chunk(panel.chunk(b * 8 + k), c);
        }
    }
}

/// The four code vectors (sub-blocks 4h..4h + 4 of a half, one chunk of
/// columns each) of an interleaved Q6_K column group: the low nibbles of
/// the two low-bit chunks, then their high nibbles, each with its two high
/// bits from the high-bit chunk.
#[inline(always)]
unsafe fn q6_k_codes(chunks: *const u8) -> [__m256i; 4] {
    q6_codes(
        _mm256_loadu_si256(chunks.cast()),
        _mm256_loadu_si256(chunks.add(32).cast()),
        _mm256_loadu_si256(chunks.add(64).cast()),
    )
}

/// Eight i8 scales at `p` as eight f32 lanes.
#[inline(always)]
unsafe fn scales8_to_f32(p: *const u8) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(p.cast())))
}

/// The eight rows' scales of an interleaved IQ4_XS super-block's
/// sub-block `j`: d · (scale − 32), as `iq4_xs_scales` computes them, `d`
/// the rows' d (the block's first 16 bytes, loaded once a super-block).
#[inline(always)]
unsafe fn iq4_xs_row_scales(b: *const u8, d: __m256, j: usize) -> __m256 {
    _mm256_mul_ps(d, scales8_to_f32(b.add(16 + 8 * j)))
}

/// Interleaved IQ4_XS rows (`crate::quant::interleaved`) dotted with one
/// token: `out[r]` = row r · act. The codes are looked up as value + 128
/// (on AVX2 only `Avx2SignedCodes` takes them).
#[inline(always)]
pub(super) unsafe fn interleaved_iq4_xs_rows<D: CodeDot>(
    data: &[u8],
    cols: usize,
    act: &[Q8Block],
    out: &mut [f32],
) {
    const BLOCK: usize = IQ4_XS_GROUP_BLOCK;
    let table = table16(&IQ4_VALUES, -128);
    let far = far_prefetch();
    for (group, y) in row_groups(data, cols, 256, BLOCK, act, out, "IQ4_XS") {
        let mut acc = [_mm256_setzero_ps(); 2];
        for (s, block) in group.chunks_exact(BLOCK).enumerate() {
            prefetch_ahead(block, far, &[2 * BLOCK, 2 * BLOCK + 512]);
            let b = block.as_ptr();
            let d = _mm256_cvtph_ps(_mm_loadu_si128(b.cast()));
            for (j, a) in act[s * 8..s * 8 + 8].iter().enumerate() {
                let codes = looked_up_chunks(&block[80 + 128 * j..], table);
                let sums = offset_codes_dot::<D>(codes, a, 128);
                // SAFETY: the scale bytes of sub-block j are in the block.
                let scale = _mm256_mul_ps(iq4_xs_row_scales(b, d, j), _mm256_set1_ps(a.d));
                acc[j % 2] = _mm256_fmadd_ps(sums, scale, acc[j % 2]);
            }
        }
        _mm256_storeu_ps(y.as_mut_ptr(), _mm256_add_ps(acc[0], acc[1]));
    }
}

/// Eight interleaved IQ4_XS rows as a panel.
#[inline(always)]
pub(super) unsafe fn pack_interleaved_iq4_xs(group: &[u8], mut panel: PanelHalf<'_>) {
    const BLOCK: usize = IQ4_XS_GROUP_BLOCK;
    check_super_block_panel(group, BLOCK, &panel, 32, "IQ4_XS");
    let table = table16(&IQ4_VALUES, -128);
    for (s, block) in group.chunks_exact(BLOCK).enumerate() {
        let d = _mm256_cvtph_ps(_mm_loadu_si128(block.as_ptr().cast()));
        for j in 0..8 {
            let sub = s * 8 + j;
            let scale = iq4_xs_row_scales(block.as_ptr(), d, j);
            let offset = _mm256_mul_ps(scale, _mm256_set1_ps(128.0));
            store_factors(&mut panel, sub, scale, offset);
            for (k, c) in looked_up_chunks(&block[80 + 128 * j..], table)
                .into_iter()
                .enumerate()
            {
                store_chunk(panel.chunk(sub * 8 + k), c);
            }
        }
    }
}

/// Interleaved Q6_K rows (`crate::quant::interleaved`) dotted with one
/// token: `out[r]` = row r · act.
#[inline(always)]
pub(super) unsafe fn interleaved_q6_k_rows<D: IntDot>(
    data: &[u8],
    cols: usize,
    act: &[Q8Block],
    out: &mut [f32],
) {
    const BLOCK: usize = Q6_K_GROUP_BLOCK;
    let far = far_prefetch();
    for (group, y) in row_groups(data, cols, 256, BLOCK, act, out, "Q6_K") {
        let mut total = _mm256_setzero_ps();
        for (s, block) in group.chunks_exact(BLOCK).enumerate() {
            prefetch_ahead(block, far, &[2 * BLOCK, 2 * BLOCK + 840]);
            let b = block.as_ptr();
            let blocks = &act[s * 8..s * 8 + 8];
            let mut sums = _mm256_setzero_ps();
            for h in 0..2 {
                // Sub-block 4h + i, columns 0..16 and 16..32: codes are
                // q + 32, so each sum starts at −32 · Σ a of its 16 columns.
                let mut isum: [[__m256i; 2]; 4] = std::array::from_fn(|i| {
                    let a = &blocks[4 * h + i];
                    std::array::from_fn(|half| {
                        _mm256_set1_epi32(-32 * i32::from(a.half_sums[half]))
                    })
                });
                for k in 0..8 {
                    // SAFETY: the three chunks of column group (h, k) and
                    // activation bytes 4k..4k + 4 are in bounds.
                    let codes = q6_k_codes(b.add(144 + (h * 8 + k) * 3 * 32));
                    for i in 0..4 {
                        let q = blocks[4 * h + i].qs.as_ptr().add(4 * k);
                        let four = _mm256_set1_epi32(q.cast::<i32>().read_unaligned());
                        isum[i][k / 4] = D::dot_add(isum[i][k / 4], codes[i], four);
                    }
                }
                for i in 0..4 {
                    let j = 4 * h + i;
                    let a_d = _mm256_set1_ps(blocks[j].d);
                    for half in 0..2 {
                        let scale =
                            _mm256_mul_ps(scales8_to_f32(b.add(16 + 8 * (2 * j + half))), a_d);
                        sums = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[i][half]), scale, sums);
                    }
                }
            }
            let d = _mm256_cvtph_ps(_mm_loadu_si128(b.cast()));
            total = _mm256_fmadd_ps(sums, d, total);
        }
        _mm256_storeu_ps(y.as_mut_ptr(), total);
    }
}

/// Eight interleaved Q6_K rows as a panel (16 columns a scale).
#[inline(always)]
pub(super) unsafe fn pack_interleaved_q6_k(group: &[u8], mut panel: PanelHalf<'_>) {
    const BLOCK: usize = Q6_K_GROUP_BLOCK;
    check_super_block_panel(group, BLOCK, &panel, 16, "Q6_K");
    for (s, block) in group.chunks_exact(BLOCK).enumerate() {
        let b = block.as_ptr();
        let d = _mm256_cvtph_ps(_mm_loadu_si128(b.cast()));
        for g in 0..16 {
            let scale = _mm256_mul_ps(d, scales8_to_f32(b.add(16 + 8 * g)));
            let offset = _mm256_mul_ps(scale, _mm256_set1_ps(32.0));
            store_factors(&mut panel, s * 16 + g, scale, offset);
        }
        for h in 0..2 {
            for k in 0..8 {
                let codes = q6_k_codes(b.add(144 + (h * 8 + k) * 3 * 32));
                for (i, c) in codes.into_iter().enumerate() {
                    store_chunk(panel.chunk((s * 8 + 4 * h + i) * 8 + k), c);
                }
            }
        }
    }
}
