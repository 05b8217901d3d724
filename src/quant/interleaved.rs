//! Q8_0, Q4_0, Q4_1, Q5_0, IQ4_NL, MXFP4, Q4_K, IQ4_XS and Q6_K matrices
//! stored eight rows interleaved, for the CPU's products.
//!
//! A one-token dot over a row spends several vector instructions a block of
//! weights (unpacking, scale conversion, the dot, its conversion and
//! scaling) and a horizontal sum a row: more than a core's memory bandwidth
//! leaves it, so large matrices do not stream at the bandwidth (Q8_0 at
//! ~22 GB/s a core, Q4_K at ~9). Interleaved, one integer dot instruction
//! multiplies four columns of eight rows with a token's four activations,
//! and the conversions and scaling happen once per eight rows. The layouts
//! keep the codes as stored, so a copy is (nearly) no larger than the rows
//! it is made from.
//!
//! Every layout goes group by group of [`INTERLEAVED_ROWS`] rows, and within
//! a group block by block (32 columns for Q8_0, Q4_0, Q4_1 and Q5_0, 256 for
//! Q4_K and Q6_K). A *chunk* is
//! 32 bytes holding four columns of each row, row r at bytes 4r..4r + 4.
//! - Q8_0, [`Q8_0_GROUP_BLOCK`] bytes a block: the eight rows' f16 scales,
//!   then eight chunks (columns 4k..4k + 4), each code q stored as q + 128
//!   (an unsigned byte). The same size as the rows.
//! - Q4_0, [`Q4_0_GROUP_BLOCK`] bytes a block: the eight rows' f16 scales,
//!   then four chunks whose bytes hold the code of column c in the low
//!   nibble and of column c + 16 in the high one (chunk k: columns
//!   4k..4k + 4 and 16 + 4k..20 + 4k), as Q4_0 stores them. The same size
//!   as the rows.
//! - Q4_1, [`Q4_1_GROUP_BLOCK`] bytes a block: the eight rows' f16 scales,
//!   their f16 minimums, then four chunks of nibbles as in Q4_0. The same
//!   size as the rows.
//! - Q5_0, [`Q5_0_GROUP_BLOCK`] bytes a block: the eight rows' f16 scales,
//!   their 32 fifth bits (a little-endian u32 each), then four chunks of
//!   nibbles as in Q4_0. The same size as the rows.
//! - IQ4_NL, as Q4_0 (its blocks have Q4_0's layout; the codes index its
//!   table instead of being values).
//! - MXFP4, [`MXFP4_GROUP_BLOCK`] bytes a block: the eight rows' E8M0
//!   exponents (a byte each), then four chunks of nibbles as in Q4_0. The
//!   same size as the rows.
//! - Q4_K, [`Q4_K_GROUP_BLOCK`] bytes a super-block: the eight rows' f16 d,
//!   their f16 dmin, the 6-bit scales as bytes (sub-block j's eight rows at
//!   32 + 8j), the 6-bit minimums likewise (at 96 + 8j), then for each pair
//!   of sub-blocks (2p, 2p + 1) eight chunks whose bytes hold a code of
//!   sub-block 2p in the low nibble and the same column's code of 2p + 1 in
//!   the high one: exactly how Q4_K stores them, four bytes of a row at a
//!   time. 2.8% larger than the rows (the scales unpacked).
//! - IQ4_XS, [`IQ4_XS_GROUP_BLOCK`] bytes a super-block: the eight rows'
//!   f16 d, their sub-block scales less 32 as signed bytes (sub-block j's
//!   eight rows at 16 + 8j), then per sub-block four chunks of its nibbles
//!   as in Q4_0. 1.5% larger than the rows.
//! - Q6_K, [`Q6_K_GROUP_BLOCK`] bytes a super-block: the eight rows' f16 d,
//!   their 16 scales (scale i's eight rows at 16 + 8i), then for each half
//!   h of the super-block and column group k (0..8) three chunks: bytes
//!   4k..4k + 4 of the half's first and second 32 low-bit bytes and of its
//!   32 high-bit bytes, the bytes as Q6_K stores them. The same size as
//!   the rows.

use crate::quant::kquants::k_scale_min;
use crate::quant::lookup::iq4_xs_scale_codes;
use crate::quant::GgmlType;

/// Rows interleaved together.
pub const INTERLEAVED_ROWS: usize = 8;

/// Bytes of one block of 32 columns of a Q8_0 group: what the rows' eight
/// Q8_0 blocks take.
pub const Q8_0_GROUP_BLOCK: usize = INTERLEAVED_ROWS * 34;

/// Bytes of one block of 32 columns of a Q4_0 group.
pub const Q4_0_GROUP_BLOCK: usize = INTERLEAVED_ROWS * 18;

/// Bytes of one block of 32 columns of a Q4_1 group.
pub const Q4_1_GROUP_BLOCK: usize = INTERLEAVED_ROWS * 20;

/// Bytes of one block of 32 columns of a Q5_0 group.
pub const Q5_0_GROUP_BLOCK: usize = INTERLEAVED_ROWS * 22;

/// Bytes of one block of 32 columns of an MXFP4 group.
pub const MXFP4_GROUP_BLOCK: usize = INTERLEAVED_ROWS * 17;

/// Bytes of one super-block of 256 columns of an IQ4_XS group.
pub const IQ4_XS_GROUP_BLOCK: usize = 16 + 64 + 8 * 4 * 32;

/// Bytes of one super-block of 256 columns of a Q6_K group.
pub const Q6_K_GROUP_BLOCK: usize = INTERLEAVED_ROWS * 210;

/// Bytes of one super-block of 256 columns of a Q4_K group.
pub const Q4_K_GROUP_BLOCK: usize = 32 + 2 * 64 + 4 * 8 * 32;

/// Bytes of [`INTERLEAVED_ROWS`] rows of `cols` values of `ty` interleaved.
pub fn interleaved_group_bytes(ty: GgmlType, cols: usize) -> Option<usize> {
    match ty {
        GgmlType::Q8_0 if cols.is_multiple_of(32) => Some(cols / 32 * Q8_0_GROUP_BLOCK),
        GgmlType::Q4_0 | GgmlType::Iq4Nl if cols.is_multiple_of(32) => {
            Some(cols / 32 * Q4_0_GROUP_BLOCK)
        }
        GgmlType::Q4_1 if cols.is_multiple_of(32) => Some(cols / 32 * Q4_1_GROUP_BLOCK),
        GgmlType::Q5_0 if cols.is_multiple_of(32) => Some(cols / 32 * Q5_0_GROUP_BLOCK),
        GgmlType::Mxfp4 if cols.is_multiple_of(32) => Some(cols / 32 * MXFP4_GROUP_BLOCK),
        GgmlType::Q4K if cols.is_multiple_of(256) => Some(cols / 256 * Q4_K_GROUP_BLOCK),
        GgmlType::Iq4Xs if cols.is_multiple_of(256) => Some(cols / 256 * IQ4_XS_GROUP_BLOCK),
        GgmlType::Q6K if cols.is_multiple_of(256) => Some(cols / 256 * Q6_K_GROUP_BLOCK),
        _ => None,
    }
}

/// `rows` (`n_rows` rows of `cols` values of `ty`, `n_rows` a multiple of
/// 8) interleaved eight rows at a time; `None` for a type or shape without
/// a layout, or when the memory for the copy cannot be had.
pub fn interleave(ty: GgmlType, rows: &[u8], n_rows: usize, cols: usize) -> Option<Vec<u8>> {
    let group_bytes = interleaved_group_bytes(ty, cols)?;
    let row_bytes = ty.row_bytes(cols as u64)? as usize;
    if !n_rows.is_multiple_of(INTERLEAVED_ROWS) || rows.len() != n_rows * row_bytes {
        return None;
    }
    let mut out = Vec::new();
    out.try_reserve_exact(n_rows / INTERLEAVED_ROWS * group_bytes)
        .ok()?;
    out.resize(n_rows / INTERLEAVED_ROWS * group_bytes, 0);
    interleave_groups(ty, rows, cols, &mut out);
    Some(out)
}

/// Interleaves whole groups of eight rows of `rows` into `out`, which holds
/// [`interleaved_group_bytes`] for each (a piece of a matrix, so that
/// pieces can be copied in parallel). Panics where `ty` has no layout or
/// the lengths do not match.
pub fn interleave_groups(ty: GgmlType, rows: &[u8], cols: usize, out: &mut [u8]) {
    let group_bytes = interleaved_group_bytes(ty, cols).expect("a type with a layout");
    let row_bytes = ty.row_bytes(cols as u64).expect("whole blocks") as usize;
    let source_group = INTERLEAVED_ROWS * row_bytes;
    assert!(
        rows.len().is_multiple_of(source_group)
            && out.len() == rows.len() / source_group * group_bytes,
        "{} bytes of rows into {} bytes",
        rows.len(),
        out.len()
    );
    for (group, dst) in rows
        .chunks_exact(source_group)
        .zip(out.chunks_exact_mut(group_bytes))
    {
        let row = |r: usize| &group[r * row_bytes..(r + 1) * row_bytes];
        match ty {
            GgmlType::Q8_0 => interleave_block32_group(row, dst, 34, 2, 0, 8, 0x80),
            GgmlType::Q4_0 | GgmlType::Iq4Nl => interleave_block32_group(row, dst, 18, 2, 0, 4, 0),
            GgmlType::Mxfp4 => interleave_block32_group(row, dst, 17, 1, 0, 4, 0),
            // The minimum follows the scale, as Q5_0's fifth bits do.
            GgmlType::Q4_1 => interleave_block32_group(row, dst, 20, 2, 2, 4, 0),
            GgmlType::Q5_0 => interleave_block32_group(row, dst, 22, 2, 4, 4, 0),
            GgmlType::Q6K => interleave_q6_k_group(row, dst),
            GgmlType::Iq4Xs => interleave_iq4_xs_group(row, dst),
            _ => interleave_q4_k_group(row, dst),
        }
    }
}

/// Copies four bytes of each row into a chunk, `flip` xored into each.
fn chunk(dst: &mut [u8], four: impl Fn(usize) -> [u8; 4], flip: u8) {
    for r in 0..INTERLEAVED_ROWS {
        let bytes = u32::from_le_bytes(four(r)) ^ (u32::from(flip) * 0x0101_0101);
        dst[4 * r..4 * r + 4].copy_from_slice(&bytes.to_le_bytes());
    }
}

/// A 32-column layout (Q8_0, Q4_0, Q4_1, Q5_0, IQ4_NL, MXFP4), a block at a
/// time: the eight rows' scales (`scale_bytes` each: an f16, or MXFP4's
/// exponent byte), then their `high_bytes` bytes that follow the scale in a
/// block (Q4_1's f16 minimum, Q5_0's fifth bits), then `chunks` chunks of
/// codes, four bytes of each row a chunk, `flip` xored into each byte.
fn interleave_block32_group<'a>(
    row: impl Fn(usize) -> &'a [u8],
    dst: &mut [u8],
    src_bytes: usize,
    scale_bytes: usize,
    high_bytes: usize,
    chunks: usize,
    flip: u8,
) {
    let scales_to = INTERLEAVED_ROWS * scale_bytes;
    let (codes_from, codes_to) = (
        scale_bytes + high_bytes,
        scales_to + INTERLEAVED_ROWS * high_bytes,
    );
    for (b, block) in dst
        .chunks_exact_mut(INTERLEAVED_ROWS * src_bytes)
        .enumerate()
    {
        let src = |r: usize| &row(r)[b * src_bytes..(b + 1) * src_bytes];
        for r in 0..INTERLEAVED_ROWS {
            block[scale_bytes * r..scale_bytes * (r + 1)].copy_from_slice(&src(r)[..scale_bytes]);
            block[scales_to + high_bytes * r..scales_to + high_bytes * (r + 1)]
                .copy_from_slice(&src(r)[scale_bytes..codes_from]);
        }
        for k in 0..chunks {
            let at = codes_from + 4 * k;
            let four = |r: usize| src(r)[at..at + 4].try_into().unwrap();
            chunk(
                &mut block[codes_to + 32 * k..codes_to + 32 * (k + 1)],
                four,
                flip,
            );
        }
    }
}

fn interleave_q6_k_group<'a>(row: impl Fn(usize) -> &'a [u8], dst: &mut [u8]) {
    for (s, block) in dst.chunks_exact_mut(Q6_K_GROUP_BLOCK).enumerate() {
        let src = |r: usize| &row(r)[s * 210..(s + 1) * 210];
        for r in 0..INTERLEAVED_ROWS {
            let b = src(r);
            block[2 * r..2 * r + 2].copy_from_slice(&b[208..210]);
            for i in 0..16 {
                block[16 + 8 * i + r] = b[192 + i];
            }
        }
        for h in 0..2 {
            for k in 0..8 {
                // The half's first and second low-bit runs, then its high bits.
                for (c, at) in [h * 64, h * 64 + 32, 128 + h * 32].into_iter().enumerate() {
                    let four = |r: usize| src(r)[at + 4 * k..at + 4 * k + 4].try_into().unwrap();
                    let out = 144 + ((h * 8 + k) * 3 + c) * 32;
                    chunk(&mut block[out..out + 32], four, 0);
                }
            }
        }
    }
}

fn interleave_q4_k_group<'a>(row: impl Fn(usize) -> &'a [u8], dst: &mut [u8]) {
    for (s, block) in dst.chunks_exact_mut(Q4_K_GROUP_BLOCK).enumerate() {
        let src = |r: usize| &row(r)[s * 144..(s + 1) * 144];
        for r in 0..INTERLEAVED_ROWS {
            let b = src(r);
            block[2 * r..2 * r + 2].copy_from_slice(&b[..2]);
            block[16 + 2 * r..18 + 2 * r].copy_from_slice(&b[2..4]);
            let (scale, min) = k_scale_min(&b[4..16]);
            for j in 0..8 {
                block[32 + 8 * j + r] = scale[j];
                block[96 + 8 * j + r] = min[j];
            }
        }
        for p in 0..4 {
            for k in 0..8 {
                let four = |r: usize| {
                    let at = 16 + 32 * p + 4 * k;
                    src(r)[at..at + 4].try_into().unwrap()
                };
                let at = 160 + (8 * p + k) * 32;
                chunk(&mut block[at..at + 32], four, 0);
            }
        }
    }
}

fn interleave_iq4_xs_group<'a>(row: impl Fn(usize) -> &'a [u8], dst: &mut [u8]) {
    for (s, block) in dst.chunks_exact_mut(IQ4_XS_GROUP_BLOCK).enumerate() {
        let src = |r: usize| &row(r)[s * 136..(s + 1) * 136];
        for r in 0..INTERLEAVED_ROWS {
            let b = src(r);
            block[2 * r..2 * r + 2].copy_from_slice(&b[..2]);
            for (j, scale) in iq4_xs_scale_codes(b).into_iter().enumerate() {
                block[16 + 8 * j + r] = scale as u8;
            }
        }
        for j in 0..8 {
            for k in 0..4 {
                let four = |r: usize| {
                    let at = 8 + 16 * j + 4 * k;
                    src(r)[at..at + 4].try_into().unwrap()
                };
                let at = 80 + (4 * j + k) * 32;
                chunk(&mut block[at..at + 32], four, 0);
            }
        }
    }
}

/// The code for one type's interleaved matrices.
#[derive(Clone, Copy)]
pub struct InterleavedKernels {
    /// `dot_rows(data, cols, act, out)`: `out[r]` = row r · act for the
    /// `out.len()` rows (a multiple of 8) that `data` holds interleaved.
    pub dot_rows: fn(&[u8], usize, &[crate::quant::Q8Block], &mut [f32]),
    /// Columns a scale covers in the panels `pack` makes (32, or 16 for
    /// Q6_K).
    pub sub: usize,
    /// `pack(group, half)`: eight interleaved rows (one group) into a half
    /// of a [`crate::quant::Panel`] (made with `sub`) for products with
    /// many tokens.
    pub pack: fn(&[u8], crate::quant::PanelHalf<'_>),
    /// The product of such a panel with many tokens (as
    /// [`crate::quant::GemmKernels::product`]).
    pub product: crate::quant::PanelProduct,
    /// The product of a pair of such panels (as
    /// [`crate::quant::GemmKernels::pair`]).
    pub pair: Option<crate::quant::PairProduct>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_of_whole_groups_interleave_as_the_whole_matrix_does() {
        for (ty, n_rows, cols) in [
            (GgmlType::Q8_0, 32, 256),
            (GgmlType::Q4_0, 64, 96),
            (GgmlType::Q4_1, 16, 64),
            (GgmlType::Q5_0, 16, 64),
            (GgmlType::Q4K, 24, 512),
            (GgmlType::Q6K, 16, 512),
        ] {
            let row_bytes = ty.row_bytes(cols as u64).unwrap() as usize;
            let rows: Vec<u8> = (0..n_rows * row_bytes)
                .map(|i| (i * 7 + i / 13) as u8)
                .collect();
            let whole = interleave(ty, &rows, n_rows, cols).unwrap();
            let group = interleaved_group_bytes(ty, cols).unwrap();
            assert_eq!(whole.len(), n_rows / 8 * group);
            let mut pieces = vec![0u8; whole.len()];
            let (first, rest) = pieces.split_at_mut(group);
            interleave_groups(ty, &rows[..8 * row_bytes], cols, first);
            interleave_groups(ty, &rows[8 * row_bytes..], cols, rest);
            assert_eq!(pieces, whole, "{ty}");
        }
    }

    #[test]
    fn shapes_without_a_layout_have_no_copy() {
        assert!(interleave(GgmlType::Q5_1, &[0; 24 * 8], 8, 32).is_none());
        assert!(interleave(GgmlType::Q8_0, &[0; 34 * 7], 7, 32).is_none());
        assert!(interleave(GgmlType::Q4K, &[0; 144 * 8], 8, 128).is_none());
    }
}
