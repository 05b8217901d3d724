//! The formats whose 4-bit codes index a table of 16 values instead of
//! being the values: IQ4_NL and IQ4_XS (a non-uniform table fitted to the
//! distribution of weights) and MXFP4 (the FP4 E2M1 numbers under a
//! power-of-two scale per block of 32, OCP microscaling), ggml-common.h;
//! scalar reference code. Dequantization follows ggml's definitions
//! operation for operation, so the results are bit-exact.
//!
//! The table values are small integers, so the dots stay integer per block
//! of 32 as every other quantized format's: the looked-up values times the
//! Q8 activations, one float scale a block.

use super::f16_at;
use super::legacy::{int_dot, unpack_q4};
use super::q8::Q8Block;

/// IQ4_NL's and IQ4_XS's values (ggml's `kvalues_iq4nl`).
pub(crate) const IQ4_VALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// MXFP4's values: the E2M1 numbers doubled (ggml's `kvalues_mxfp4`); the
/// block's scale carries the half back.
pub(crate) const MXFP4_VALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// IQ4_NL block: f16 d, then 16 bytes of codes.
const IQ4_NL_BYTES: usize = 18;
/// MXFP4 block: the E8M0 exponent, then 16 bytes of codes.
const MXFP4_BYTES: usize = 17;
/// IQ4_XS super-block of 256 values: f16 d, u16 high scale bits (2 a
/// sub-block), 4 bytes of low scale bits (4 a sub-block), 128 bytes of codes.
const IQ4_XS_BYTES: usize = 136;

/// The 32 values of a block's 16 code bytes: byte j's low nibble is value
/// j, its high nibble value j + 16.
fn lookup(qs: &[u8], table: &[i8; 16]) -> [i8; 32] {
    unpack_q4(qs).map(|code| table[code as usize])
}

/// MXFP4's block scale, 2^(e − 127) / 2 (ggml's `ggml_e8m0_to_fp32_half`):
/// the exponents 0 and 1 give subnormal floats.
pub(crate) fn e8m0_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        u32::from(e - 1) << 23
    };
    f32::from_bits(bits)
}

/// An IQ4_XS super-block's eight sub-block scales less 32 (−32..31):
/// sub-block ib's low four bits at bits 4·ib of the little-endian u32 at
/// byte 4, its high two at bits 2·ib of the u16 at byte 2.
pub(crate) fn iq4_xs_scale_codes(b: &[u8]) -> [i8; 8] {
    let high = u32::from(u16::from_le_bytes([b[2], b[3]]));
    let low = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    std::array::from_fn(|ib| {
        let scale = ((low >> (4 * ib)) & 0x0F) | (((high >> (2 * ib)) & 3) << 4);
        scale as i8 - 32
    })
}

/// An IQ4_XS super-block's eight sub-block scales, d · (6-bit scale − 32).
pub(crate) fn iq4_xs_scales(b: &[u8]) -> [f32; 8] {
    let d = f16_at(b, 0);
    iq4_xs_scale_codes(b).map(|scale| d * f32::from(scale))
}

pub fn dequantize_iq4_nl(row: &[u8], out: &mut [f32]) {
    for (b, y) in row.chunks_exact(IQ4_NL_BYTES).zip(out.chunks_exact_mut(32)) {
        let d = f16_at(b, 0);
        for (v, q) in y.iter_mut().zip(lookup(&b[2..], &IQ4_VALUES)) {
            *v = d * f32::from(q);
        }
    }
}

pub fn dequantize_iq4_xs(row: &[u8], out: &mut [f32]) {
    for (b, y) in row
        .chunks_exact(IQ4_XS_BYTES)
        .zip(out.chunks_exact_mut(256))
    {
        let scales = iq4_xs_scales(b);
        for (ib, (y, dl)) in y.chunks_exact_mut(32).zip(scales).enumerate() {
            for (v, q) in y.iter_mut().zip(lookup(&b[8 + 16 * ib..], &IQ4_VALUES)) {
                *v = dl * f32::from(q);
            }
        }
    }
}

pub fn dequantize_mxfp4(row: &[u8], out: &mut [f32]) {
    for (b, y) in row.chunks_exact(MXFP4_BYTES).zip(out.chunks_exact_mut(32)) {
        let d = e8m0_half(b[0]);
        for (v, q) in y.iter_mut().zip(lookup(&b[1..], &MXFP4_VALUES)) {
            *v = f32::from(q) * d;
        }
    }
}

pub fn dot_iq4_nl(row: &[u8], act: &[Q8Block]) -> f32 {
    let mut sum = 0.0f32;
    for (b, a) in row.chunks_exact(IQ4_NL_BYTES).zip(act) {
        let isum = int_dot(&lookup(&b[2..], &IQ4_VALUES), a);
        sum += f16_at(b, 0) * a.d * isum as f32;
    }
    sum
}

pub fn dot_iq4_xs(row: &[u8], act: &[Q8Block]) -> f32 {
    let mut sum = 0.0f32;
    for (b, a8) in row.chunks_exact(IQ4_XS_BYTES).zip(act.chunks_exact(8)) {
        for (ib, (a, dl)) in a8.iter().zip(iq4_xs_scales(b)).enumerate() {
            let isum = int_dot(&lookup(&b[8 + 16 * ib..], &IQ4_VALUES), a);
            sum += dl * a.d * isum as f32;
        }
    }
    sum
}

pub fn dot_mxfp4(row: &[u8], act: &[Q8Block]) -> f32 {
    let mut sum = 0.0f32;
    for (b, a) in row.chunks_exact(MXFP4_BYTES).zip(act) {
        let isum = int_dot(&lookup(&b[1..], &MXFP4_VALUES), a);
        sum += e8m0_half(b[0]) * a.d * isum as f32;
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e8m0_halves_are_powers_of_two_down_to_the_subnormals() {
        assert_eq!(e8m0_half(128), 1.0);
        assert_eq!(e8m0_half(127), 0.5);
        assert_eq!(e8m0_half(2), 2f32.powi(-126));
        assert_eq!(e8m0_half(1), 2f32.powi(-127));
        assert_eq!(e8m0_half(0), 2f32.powi(-128));
        assert_eq!(e8m0_half(254), 2f32.powi(126));
    }

    #[test]
    fn codes_index_the_table_low_nibbles_first() {
        let mut qs = [0u8; 16];
        qs[0] = 0xF0;
        qs[15] = 0x0E;
        let v = lookup(&qs, &MXFP4_VALUES);
        assert_eq!((v[0], v[16], v[15], v[31]), (0, -12, -8, 0));
    }

    #[test]
    fn an_iq4_xs_scale_takes_four_low_and_two_high_bits() {
        let mut b = [0u8; IQ4_XS_BYTES];
        b[0..2].copy_from_slice(&half::f16::from_f32(0.5).to_le_bytes());
        // Sub-block 3: low bits in the high nibble of byte 4 + 1, high bits
        // at bits 6..8 of scales_h.
        b[5] = 0x70;
        b[2] = 0b1100_0000;
        let scales = iq4_xs_scales(&b);
        assert_eq!(scales[3], 0.5 * (0x37 - 32) as f32);
        assert_eq!(scales[0], 0.5 * -32.0);
    }
}
