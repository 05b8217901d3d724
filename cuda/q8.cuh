// Activations quantized to 8 bits in blocks of 32, as the CPU backend
// quantizes them (src/quant/q8.rs): the input of the integer products on
// sm_61+ (gemv.cu's dp4a path; prepare.cuh launches it).
#pragma once

#include "quant.cuh"

// n_x rows of cols activations in 8-bit blocks of 32, n_x · cols · 5/4 bytes:
// every row's codes (row-major), then every block's (d, d·Σcodes), value ≈
// d · code. Row t's pairs:
__device__ __forceinline__ float2 *m40_q8_scales(const int8_t *q8, int cols, int n_x, int t) {
    return reinterpret_cast<float2 *>(const_cast<int8_t *>(q8) + size_t(n_x) * cols) + size_t(t) * (cols / 32);
}

// One row's view.
struct M40Q8Row {
    const int8_t *qs;
    const float2 *ds;
};

__device__ __forceinline__ M40Q8Row m40_q8_row(const int8_t *q8, int cols, int n_x, int t) {
    return {q8 + size_t(t) * cols, m40_q8_scales(q8, cols, n_x, t)};
}

// Eight codes from an 8-byte-aligned position of a row.
__device__ __forceinline__ int2 m40_q8_words2(const int8_t *q) { return __ldg(reinterpret_cast<const int2 *>(q)); }

// How the blocks' scales are kept, per weight format, as llama.cpp's CPU
// products keep them (ggml-cpu's vec_dot_type; `ActivationScales` in
// src/quant/q8.rs, whose discriminants these are): Q8_0 (d made in f32, the
// codes rounded with it, d kept as f16) for Q4_0, Q5_0, Q8_0, IQ4_NL and
// MXFP4, Q8_1 (d as Q8_0's, d·Σq made in f32 and kept as f16) for Q4_1 and
// Q5_1, f32 scales otherwise. The K-quants and IQ4_XS take Q8_K, one scale
// per 256 values on the CPU; here, where a warp holds a block of 32, they
// keep an f32 scale per block of 32. On small models the difference between
// f32 and f16 scales alone moves logits measurably.
enum M40ActivationScales { M40_SCALES_F32 = 0, M40_SCALES_Q8_0 = 1, M40_SCALES_Q8_1 = 2, M40_SCALES_Q8_K = 3 };

__host__ __device__ constexpr int m40_activation_scales(int type) {
    return type == M40_Q4_0 || type == M40_Q5_0 || type == M40_Q8_0 || type == M40_IQ4_NL || type == M40_MXFP4
               ? M40_SCALES_Q8_0
           : type == M40_Q4_1 || type == M40_Q5_1 ? M40_SCALES_Q8_1
           : type == M40_Q2_K || type == M40_Q3_K || type == M40_Q4_K || type == M40_Q5_K || type == M40_Q6_K ||
                   type == M40_IQ4_XS
               ? M40_SCALES_Q8_K
               : M40_SCALES_F32;
}

__device__ __forceinline__ float m40_round_to_f16(float v) { return __half2float(__float2half_rn(v)); }

// A value's 8-bit code in its block of 32 (lane i % 32 of the calling warp
// holding value i) and the block's scale d = amax / 127 in f32; codes to
// nearest with it, ties to even (the CPU's rounding). Every lane of the warp
// calls it.
__device__ __forceinline__ int m40_q8_code(float v, float &d) {
    d = m40_warp_max(fabsf(v)) / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    return __float2int_rn(v * id);
}

// The scale d as `scales` keeps it.
__device__ __forceinline__ float m40_kept_scale(float d, int scales) {
    return scales == M40_SCALES_Q8_0 || scales == M40_SCALES_Q8_1 ? m40_round_to_f16(d) : d;
}

// Value v (index i) of activation row t into q8, its warp holding the 32
// values of its block (lane i % 32), its scales kept as `scales` says.
// Every lane of the warp calls it.
__device__ __forceinline__ void m40_quantize_q8_value(float v, int i, int cols, int n_x, int8_t *q8, int t,
                                                      int scales) {
    float d;
    const int q = m40_q8_code(v, d);
    q8[size_t(t) * cols + i] = int8_t(q);
    int sum = q;
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (i % 32 == 0) {
        const float kept = m40_kept_scale(d, scales);
        const float d_sum = scales == M40_SCALES_Q8_1 ? m40_round_to_f16(d * float(sum)) : kept * float(sum);
        m40_q8_scales(q8, cols, n_x, t)[i / 32] = make_float2(kept, d_sum);
    }
}
