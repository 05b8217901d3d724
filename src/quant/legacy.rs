//! The 32-value block formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (ggml-common.h),
//! scalar reference code. Dequantization follows ggml's definitions operation
//! for operation, so the results are bit-exact (no fused multiply-add).

use super::f16_at;
use super::q8::Q8Block;

/// Low nibbles hold values 0..16 of a block, high nibbles 16..32.
fn nibbles(qs: &[u8], j: usize) -> (u8, u8) {
    (qs[j] & 0x0F, qs[j] >> 4)
}

/// The fifth bits of Q5_0 / Q5_1: bit `i` of the little-endian u32 is value `i`'s.
fn high_bits(block: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([block[at], block[at + 1], block[at + 2], block[at + 3]])
}

pub fn dequantize_q4_0(row: &[u8], out: &mut [f32]) {
    for (b, y) in row.chunks_exact(18).zip(out.chunks_exact_mut(32)) {
        let d = f16_at(b, 0);
        for j in 0..16 {
            let (lo, hi) = nibbles(&b[2..], j);
            y[j] = f32::from(lo as i8 - 8) * d;
            y[j + 16] = f32::from(hi as i8 - 8) * d;
        }
    }
}

pub fn dequantize_q4_1(row: &[u8], out: &mut [f32]) {
    for (b, y) in row.chunks_exact(20).zip(out.chunks_exact_mut(32)) {
        let (d, m) = (f16_at(b, 0), f16_at(b, 2));
        for j in 0..16 {
            let (lo, hi) = nibbles(&b[4..], j);
            y[j] = f32::from(lo) * d + m;
            y[j + 16] = f32::from(hi) * d + m;
        }
    }
}

pub fn dequantize_q5_0(row: &[u8], out: &mut [f32]) {
    for (b, y) in row.chunks_exact(22).zip(out.chunks_exact_mut(32)) {
        let d = f16_at(b, 0);
        let qh = high_bits(b, 2);
        for j in 0..16 {
            let (lo, hi) = nibbles(&b[6..], j);
            let q0 = (lo | (((qh >> j) & 1) as u8) << 4) as i8 - 16;
            let q1 = (hi | (((qh >> (j + 16)) & 1) as u8) << 4) as i8 - 16;
            y[j] = f32::from(q0) * d;
            y[j + 16] = f32::from(q1) * d;
        }
    }
}

pub fn dequantize_q5_1(row: &[u8], out: &mut [f32]) {
    for (b, y) in row.chunks_exact(24).zip(out.chunks_exact_mut(32)) {
        let (d, m) = (f16_at(b, 0), f16_at(b, 2));
        let qh = high_bits(b, 4);
        for j in 0..16 {
            let (lo, hi) = nibbles(&b[8..], j);
            let q0 = lo | (((qh >> j) & 1) as u8) << 4;
            let q1 = hi | (((qh >> (j + 16)) & 1) as u8) << 4;
            y[j] = f32::from(q0) * d + m;
            y[j + 16] = f32::from(q1) * d + m;
        }
    }
}

pub fn dequantize_q8_0(row: &[u8], out: &mut [f32]) {
    for (b, y) in row.chunks_exact(34).zip(out.chunks_exact_mut(32)) {
        let d = f16_at(b, 0);
        for j in 0..32 {
            y[j] = f32::from(b[2 + j] as i8) * d;
        }
    }
}

/// Σ q·a over one block of 32 weight codes (already unpacked) and activations.
pub(super) fn int_dot(q: &[i8; 32], a: &Q8Block) -> i32 {
    q.iter()
        .zip(&a.qs)
        .map(|(&w, &x)| i32::from(w) * i32::from(x))
        .sum()
}

/// A block's 32 nibble codes: value j in the low nibble of byte j, value
/// j + 16 in its high nibble.
pub(super) fn unpack_q4(qs: &[u8]) -> [i8; 32] {
    let mut q = [0i8; 32];
    for j in 0..16 {
        let (lo, hi) = nibbles(qs, j);
        q[j] = lo as i8;
        q[j + 16] = hi as i8;
    }
    q
}

fn unpack_q5(qs: &[u8], qh: u32) -> [i8; 32] {
    let mut q = unpack_q4(qs);
    for (j, v) in q.iter_mut().enumerate() {
        *v |= (((qh >> j) & 1) as i8) << 4;
    }
    q
}

// The dots: each weight block is d·(q − offset) or d·q + m, so
//   Σ w·x = d_w·d_a·Σ q·a − offset·d_w·d_a·Σ a     (Q4_0, Q5_0)
//   Σ w·x = d_w·d_a·Σ q·a + m·d_a·Σ a              (Q4_1, Q5_1)
// with the integer sums exact and one float scale per block.

pub fn dot_q4_0(row: &[u8], act: &[Q8Block]) -> f32 {
    let mut sum = 0.0f32;
    for (b, a) in row.chunks_exact(18).zip(act) {
        let isum = int_dot(&unpack_q4(&b[2..]), a) - 8 * a.sum();
        sum += f16_at(b, 0) * a.d * isum as f32;
    }
    sum
}

pub fn dot_q4_1(row: &[u8], act: &[Q8Block]) -> f32 {
    let mut sum = 0.0f32;
    for (b, a) in row.chunks_exact(20).zip(act) {
        let isum = int_dot(&unpack_q4(&b[4..]), a);
        sum += f16_at(b, 0) * a.d * isum as f32 + f16_at(b, 2) * a.d * a.sum() as f32;
    }
    sum
}

pub fn dot_q5_0(row: &[u8], act: &[Q8Block]) -> f32 {
    let mut sum = 0.0f32;
    for (b, a) in row.chunks_exact(22).zip(act) {
        let isum = int_dot(&unpack_q5(&b[6..], high_bits(b, 2)), a) - 16 * a.sum();
        sum += f16_at(b, 0) * a.d * isum as f32;
    }
    sum
}

pub fn dot_q5_1(row: &[u8], act: &[Q8Block]) -> f32 {
    let mut sum = 0.0f32;
    for (b, a) in row.chunks_exact(24).zip(act) {
        let isum = int_dot(&unpack_q5(&b[8..], high_bits(b, 4)), a);
        sum += f16_at(b, 0) * a.d * isum as f32 + f16_at(b, 2) * a.d * a.sum() as f32;
    }
    sum
}

pub fn dot_q8_0(row: &[u8], act: &[Q8Block]) -> f32 {
    let mut sum = 0.0f32;
    for (b, a) in row.chunks_exact(34).zip(act) {
        let q: [i8; 32] = std::array::from_fn(|j| b[2 + j] as i8);
        sum += f16_at(b, 0) * a.d * int_dot(&q, a) as f32;
    }
    sum
}
