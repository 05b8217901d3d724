//! The float formats F32, F16 and BF16: conversion to f32 (exact: every F16
//! and BF16 value is an f32 value) and dots with f32 activations, scalar
//! reference code. Float weights are not worth quantizing activations for:
//! their dots multiply in f32 and sum in f32.

use half::f16;

pub fn dequantize_f32(row: &[u8], out: &mut [f32]) {
    for (b, y) in row.chunks_exact(4).zip(out) {
        *y = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
}

/// The F16 value in the first two (little-endian) bytes of `b`.
pub fn f16_at(b: &[u8]) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32()
}

pub fn dequantize_f16(row: &[u8], out: &mut [f32]) {
    for (b, y) in row.chunks_exact(2).zip(out) {
        *y = f16_at(b);
    }
}

pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

pub fn dequantize_bf16(row: &[u8], out: &mut [f32]) {
    for (b, y) in row.chunks_exact(2).zip(out) {
        *y = bf16_to_f32(u16::from_le_bytes([b[0], b[1]]));
    }
}

/// Dots as sums of eight interleaved partial sums, the order the SIMD code
/// uses too, so that scalar and vector results stay close.
fn dot_with(row: &[u8], x: &[f32], width: usize, value: impl Fn(&[u8]) -> f32) -> f32 {
    let mut partial = [0.0f32; 8];
    for (i, (b, &xv)) in row.chunks_exact(width).zip(x).enumerate() {
        partial[i % 8] += value(b) * xv;
    }
    partial.iter().sum()
}

pub fn dot_f32(row: &[u8], x: &[f32]) -> f32 {
    dot_with(row, x, 4, |b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

pub fn dot_f16(row: &[u8], x: &[f32]) -> f32 {
    dot_with(row, x, 2, f16_at)
}

pub fn dot_bf16(row: &[u8], x: &[f32]) -> f32 {
    dot_with(row, x, 2, |b| bf16_to_f32(u16::from_le_bytes([b[0], b[1]])))
}

/// out[j] = row j · x for `out.len()` F16 rows of x.len() values, row j
/// starting at byte j · stride (attention's scores of one query).
pub fn f16_dots(rows: &[u8], stride: usize, x: &[f32], out: &mut [f32]) {
    for (j, o) in out.iter_mut().enumerate() {
        *o = dot_f16(&rows[j * stride..][..x.len() * 2], x);
    }
}

/// y += Σ_j a[j] · row j for `a.len()` F16 rows of y.len() values, row j
/// starting at byte j · stride (attention's weighted sum of values).
pub fn f16_axpys(rows: &[u8], stride: usize, a: &[f32], y: &mut [f32]) {
    for (j, &aj) in a.iter().enumerate() {
        let row = &rows[j * stride..][..y.len() * 2];
        for (b, y) in row.chunks_exact(2).zip(y.iter_mut()) {
            *y += aj * f16_at(b);
        }
    }
}
