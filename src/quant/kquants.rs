//! The 256-value "K" super-block formats: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K
//! (ggml-common.h), scalar reference code. A super-block holds 16 or 8
//! sub-blocks, each with its own small integer scale (and minimum) multiplied
//! by the super-block's f16 scales. Dequantization follows the order of
//! operations of ggml's reference (as gguf-py does), so it is bit-exact.

use super::f16_at;
use super::q8::Q8Block;

pub(crate) const QK_K: usize = 256;

/// The codes of one super-block, unpacked to one signed byte per value.
type Codes = [i8; QK_K];

// ---- Q2_K: scales[16] qs[64] d dmin — w = d·(sc & 15)·q − dmin·(sc >> 4), q in 0..4

fn q2k_codes(b: &[u8]) -> Codes {
    let qs = &b[16..80];
    let mut q = [0i8; QK_K];
    for half in 0..2 {
        for shift in 0..4 {
            for l in 0..32 {
                q[half * 128 + shift * 32 + l] = ((qs[half * 32 + l] >> (2 * shift)) & 3) as i8;
            }
        }
    }
    q
}

pub fn dequantize_q2_k(row: &[u8], out: &mut [f32]) {
    for (b, y) in row.chunks_exact(84).zip(out.chunks_exact_mut(QK_K)) {
        let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
        let q = q2k_codes(b);
        for (i, y) in y.iter_mut().enumerate() {
            let sc = b[i / 16];
            let dl = d * f32::from(sc & 0xF);
            let ml = dmin * f32::from(sc >> 4);
            *y = dl * f32::from(q[i]) - ml;
        }
    }
}

pub fn dot_q2_k(row: &[u8], act: &[Q8Block]) -> f32 {
    let mut sum = 0.0f32;
    for (b, a8) in row.chunks_exact(84).zip(act.chunks_exact(8)) {
        let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
        let q = q2k_codes(b);
        for (j, a) in a8.iter().enumerate() {
            let (mut scaled, mut mins) = (0i32, 0i32);
            for h in 0..2 {
                let sub = 2 * j + h;
                let sc = i32::from(b[sub] & 0xF);
                let m = i32::from(b[sub] >> 4);
                scaled += sc * int_dot16(&q[sub * 16..], &a.qs[h * 16..]);
                mins += m * i32::from(a.half_sums[h]);
            }
            sum += a.d * (d * scaled as f32 - dmin * mins as f32);
        }
    }
    sum
}

// ---- Q3_K: hmask[32] qs[64] scales[12] d — w = d·(s − 32)·q, q in −4..4

pub(crate) fn q3k_scales(b: &[u8]) -> [i8; 16] {
    let sc = &b[96..108];
    std::array::from_fn(|i| {
        let low = (sc[i % 8] >> (4 * (i / 8))) & 0x0F;
        let high = (sc[8 + i % 4] >> (2 * (i / 4))) & 0x03;
        (low | (high << 4)) as i8 - 32
    })
}

fn q3k_codes(b: &[u8]) -> Codes {
    let (hmask, qs) = (&b[0..32], &b[32..96]);
    let mut q = [0i8; QK_K];
    for half in 0..2 {
        for shift in 0..4 {
            for l in 0..32 {
                let i = half * 128 + shift * 32 + l;
                let low = ((qs[half * 32 + l] >> (2 * shift)) & 3) as i8;
                // The high bit set means no offset; clear means subtract 4.
                let high_set = (hmask[l] >> (i / 32)) & 1 == 1;
                q[i] = if high_set { low } else { low - 4 };
            }
        }
    }
    q
}

pub fn dequantize_q3_k(row: &[u8], out: &mut [f32]) {
    for (b, y) in row.chunks_exact(110).zip(out.chunks_exact_mut(QK_K)) {
        let d = f16_at(b, 108);
        let (scales, q) = (q3k_scales(b), q3k_codes(b));
        for (i, y) in y.iter_mut().enumerate() {
            *y = d * f32::from(scales[i / 16]) * f32::from(q[i]);
        }
    }
}

pub fn dot_q3_k(row: &[u8], act: &[Q8Block]) -> f32 {
    let mut sum = 0.0f32;
    for (b, a8) in row.chunks_exact(110).zip(act.chunks_exact(8)) {
        let d = f16_at(b, 108);
        let (scales, q) = (q3k_scales(b), q3k_codes(b));
        for (j, a) in a8.iter().enumerate() {
            let scaled: i32 = (0..2)
                .map(|h| {
                    i32::from(scales[2 * j + h])
                        * int_dot16(&q[(2 * j + h) * 16..], &a.qs[h * 16..])
                })
                .sum();
            sum += a.d * d * scaled as f32;
        }
    }
    sum
}

// ---- Q4_K / Q5_K: d dmin scales[12] [qh[32]] qs[128] — w = d·sc·q − dmin·m per 32 values

/// The eight 6-bit (scale, min) pairs packed into 12 bytes.
pub fn k_scale_min(sc: &[u8]) -> ([u8; 8], [u8; 8]) {
    let (scale, min) = k_scale_min_words(sc);
    (scale.to_le_bytes(), min.to_le_bytes())
}

/// [`k_scale_min`] as two little-endian words of eight bytes, unpacked four
/// bytes at a time: scales 0..4 and minimums 0..4 are the low 6 bits of
/// bytes 0..4 and 4..8; scales and minimums 4..8 take their low 4 bits from
/// the nibbles of bytes 8..12 and their top 2 from the top bits of bytes
/// 0..4 and 4..8.
pub fn k_scale_min_words(sc: &[u8]) -> (u64, u64) {
    const LOW6: u32 = 0x3F3F_3F3F;
    const LOW4: u32 = 0x0F0F_0F0F;
    const LOW2: u32 = 0x0303_0303;
    let word =
        |i: usize| u32::from_le_bytes([sc[4 * i], sc[4 * i + 1], sc[4 * i + 2], sc[4 * i + 3]]);
    let (w0, w1, w2) = (word(0), word(1), word(2));
    let scale_high = (w2 & LOW4) | (((w0 >> 6) & LOW2) << 4);
    let min_high = ((w2 >> 4) & LOW4) | (((w1 >> 6) & LOW2) << 4);
    (
        u64::from(w0 & LOW6) | u64::from(scale_high) << 32,
        u64::from(w1 & LOW6) | u64::from(min_high) << 32,
    )
}

fn q4k_codes(qs: &[u8]) -> Codes {
    let mut q = [0i8; QK_K];
    for chunk in 0..4 {
        for l in 0..32 {
            let byte = qs[chunk * 32 + l];
            q[chunk * 64 + l] = (byte & 0x0F) as i8;
            q[chunk * 64 + 32 + l] = (byte >> 4) as i8;
        }
    }
    q
}

fn q5k_codes(b: &[u8]) -> Codes {
    let qh = &b[16..48];
    let mut q = q4k_codes(&b[48..176]);
    for (i, v) in q.iter_mut().enumerate() {
        *v |= (((qh[i % 32] >> (i / 32)) & 1) as i8) << 4;
    }
    q
}

fn dequantize_k_with_min(b: &[u8], q: &Codes, y: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let (scale, min) = k_scale_min(&b[4..16]);
    for (i, y) in y.iter_mut().enumerate() {
        let dl = d * f32::from(scale[i / 32]);
        let ml = dmin * f32::from(min[i / 32]);
        *y = dl * f32::from(q[i]) - ml;
    }
}

fn dot_k_with_min(b: &[u8], q: &Codes, a8: &[Q8Block]) -> f32 {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let (scale, min) = k_scale_min(&b[4..16]);
    let mut sum = 0.0f32;
    for (j, a) in a8.iter().enumerate() {
        let qj: &[i8; 32] = q[j * 32..j * 32 + 32].try_into().unwrap();
        let scaled = i32::from(scale[j]) * int_dot32(qj, &a.qs);
        let mins = i32::from(min[j]) * a.sum();
        sum += a.d * (d * scaled as f32 - dmin * mins as f32);
    }
    sum
}

pub fn dequantize_q4_k(row: &[u8], out: &mut [f32]) {
    for (b, y) in row.chunks_exact(144).zip(out.chunks_exact_mut(QK_K)) {
        dequantize_k_with_min(b, &q4k_codes(&b[16..144]), y);
    }
}

pub fn dot_q4_k(row: &[u8], act: &[Q8Block]) -> f32 {
    row.chunks_exact(144)
        .zip(act.chunks_exact(8))
        .map(|(b, a8)| dot_k_with_min(b, &q4k_codes(&b[16..144]), a8))
        .sum()
}

pub fn dequantize_q5_k(row: &[u8], out: &mut [f32]) {
    for (b, y) in row.chunks_exact(176).zip(out.chunks_exact_mut(QK_K)) {
        dequantize_k_with_min(b, &q5k_codes(b), y);
    }
}

pub fn dot_q5_k(row: &[u8], act: &[Q8Block]) -> f32 {
    row.chunks_exact(176)
        .zip(act.chunks_exact(8))
        .map(|(b, a8)| dot_k_with_min(b, &q5k_codes(b), a8))
        .sum()
}

// ---- Q6_K: ql[128] qh[64] scales[16] d — w = d·s·(q − 32), q in 0..64

fn q6k_codes(b: &[u8]) -> Codes {
    let (ql, qh) = (&b[0..128], &b[128..192]);
    let mut q = [0i8; QK_K];
    for half in 0..2 {
        for l in 0..64 {
            let byte = ql[half * 64 + l];
            q[half * 128 + l] = (byte & 0x0F) as i8;
            q[half * 128 + 64 + l] = (byte >> 4) as i8;
        }
        for shift in 0..4 {
            for l in 0..32 {
                let i = half * 128 + shift * 32 + l;
                q[i] = (q[i] | ((((qh[half * 32 + l] >> (2 * shift)) & 3) as i8) << 4)) - 32;
            }
        }
    }
    q
}

pub fn dequantize_q6_k(row: &[u8], out: &mut [f32]) {
    for (b, y) in row.chunks_exact(210).zip(out.chunks_exact_mut(QK_K)) {
        let d = f16_at(b, 208);
        let q = q6k_codes(b);
        for (i, y) in y.iter_mut().enumerate() {
            *y = d * f32::from(b[192 + i / 16] as i8) * f32::from(q[i]);
        }
    }
}

pub fn dot_q6_k(row: &[u8], act: &[Q8Block]) -> f32 {
    let mut sum = 0.0f32;
    for (b, a8) in row.chunks_exact(210).zip(act.chunks_exact(8)) {
        let d = f16_at(b, 208);
        let q = q6k_codes(b);
        for (j, a) in a8.iter().enumerate() {
            let scaled: i32 = (0..2)
                .map(|h| {
                    i32::from(b[192 + 2 * j + h] as i8)
                        * int_dot16(&q[(2 * j + h) * 16..], &a.qs[h * 16..])
                })
                .sum();
            sum += a.d * d * scaled as f32;
        }
    }
    sum
}

fn int_dot16(q: &[i8], a: &[i8]) -> i32 {
    q[..16]
        .iter()
        .zip(&a[..16])
        .map(|(&w, &x)| i32::from(w) * i32::from(x))
        .sum()
}

fn int_dot32(q: &[i8; 32], a: &[i8; 32]) -> i32 {
    q.iter()
        .zip(a)
        .map(|(&w, &x)| i32::from(w) * i32::from(x))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_min_words_match_ggmls_byte_by_byte_unpacking() {
        // get_scale_min_k4 of ggml-quants.c, for every j.
        let reference = |j: usize, q: &[u8]| -> (u8, u8) {
            if j < 4 {
                (q[j] & 63, q[j + 4] & 63)
            } else {
                (
                    (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
                    (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
                )
            }
        };
        let mut state = 0x2545_F491u32;
        for _ in 0..1000 {
            let q: Vec<u8> = (0..12)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 17;
                    state ^= state << 5;
                    state as u8
                })
                .collect();
            let (scale, min) = k_scale_min(&q);
            for j in 0..8 {
                assert_eq!((scale[j], min[j]), reference(j, &q), "{q:?} {j}");
            }
        }
    }
}
