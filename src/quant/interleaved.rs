//! Q8_0 matrices stored eight rows interleaved, for the CPU's products.
//!
//! A one-token dot over Q8_0 rows spends about eight vector instructions a
//! block of 32 weights (scale conversion, signs, the dot, its conversion and
//! scaling) and a horizontal sum a row: more than a core's memory bandwidth
//! leaves it, so a large Q8_0 matrix (an output projection of a 262k
//! vocabulary) does not stream at the bandwidth. Interleaved, one integer
//! dot instruction multiplies four columns of eight rows with a token's
//! four activations, and the conversion and scaling happen once per eight
//! rows: about 1.6 instructions a block. The layout is the
//! [`crate::quant::panel`] layout with the codes stored rather than
//! unpacked, so it is no larger than the rows it is made from.
//!
//! Layout: for each group of [`INTERLEAVED_ROWS`] rows, for each block of
//! 32 columns, [`INTERLEAVED_BLOCK_BYTES`] bytes: the eight rows' f16
//! scales, then eight chunks of 32 bytes, chunk k holding columns 4k..4k + 4
//! of each row, row r at bytes 4r..4r + 4, each code q stored as q + 128
//! (an unsigned byte).

/// Rows interleaved together.
pub const INTERLEAVED_ROWS: usize = 8;

/// Bytes of one block of 32 columns of the eight rows: what the rows' eight
/// Q8_0 blocks take.
pub const INTERLEAVED_BLOCK_BYTES: usize = INTERLEAVED_ROWS * 34;

/// `rows` (Q8_0, `n_rows` rows of `cols` values, `n_rows` a multiple of 8)
/// interleaved eight rows at a time; `None` when the memory for the copy
/// cannot be had.
pub fn interleave_q8_0(rows: &[u8], n_rows: usize, cols: usize) -> Option<Vec<u8>> {
    let blocks = cols / 32;
    let row_bytes = blocks * 34;
    assert!(
        cols.is_multiple_of(32)
            && n_rows.is_multiple_of(INTERLEAVED_ROWS)
            && rows.len() == n_rows * row_bytes,
        "Q8_0 rows of {cols} columns in {} bytes for {n_rows} rows",
        rows.len()
    );
    let mut out = Vec::new();
    out.try_reserve_exact(rows.len()).ok()?;
    out.resize(rows.len(), 0);
    for (group, dst) in rows
        .chunks_exact(INTERLEAVED_ROWS * row_bytes)
        .zip(out.chunks_exact_mut(INTERLEAVED_ROWS * row_bytes))
    {
        for (b, block) in dst.chunks_exact_mut(INTERLEAVED_BLOCK_BYTES).enumerate() {
            for r in 0..INTERLEAVED_ROWS {
                let src = &group[r * row_bytes + b * 34..][..34];
                block[2 * r..2 * r + 2].copy_from_slice(&src[..2]);
                for k in 0..8 {
                    let four = u32::from_le_bytes([
                        src[2 + 4 * k],
                        src[3 + 4 * k],
                        src[4 + 4 * k],
                        src[5 + 4 * k],
                    ]);
                    let at = 16 + k * 32 + r * 4;
                    block[at..at + 4].copy_from_slice(&(four ^ 0x8080_8080).to_le_bytes());
                }
            }
        }
    }
    Some(out)
}

/// The code for interleaved Q8_0 matrices.
#[derive(Clone, Copy)]
pub struct InterleavedKernels {
    /// `dot_rows(data, cols, act, out)`: `out[r]` = row r · act for the
    /// `out.len()` rows (a multiple of 8) that `data` holds interleaved.
    pub dot_rows: fn(&[u8], usize, &[crate::quant::Q8Block], &mut [f32]),
    /// `pack(group, panel)`: eight interleaved rows (one group) as a
    /// [`crate::quant::Panel`] for products with many tokens.
    pub pack: fn(&[u8], &mut crate::quant::Panel),
}
