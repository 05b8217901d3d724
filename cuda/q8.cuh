// Activations quantized to 8 bits in blocks of 32, as the CPU backend
// quantizes them (src/quant/q8.rs; Q8_K's scale shared by 256 values): the
// input of the integer products on sm_61+ (gemv.cu's dp4a path;
// prepare.cuh launches it), and the grid the M40's scaled values are
// rounded to (scaled.cuh).
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
// Q5_1, Q8_K (one f32 scale per 256 values, M40Q8K) for the K-quants and
// IQ4_XS. On small models the difference between f32 and f16 scales alone
// moves logits measurably.
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

// Q8_K's scale of a block of 256 values (src/quant/q8.rs's
// quantize_row_q8_k, llama.cpp's quantize_row_q8_K_ref): iscale = −127 / m,
// m the block's first value of largest magnitude, d = 1 / iscale; both 0
// for a block of zeros.
struct M40Q8K {
    float iscale, d;
};

// The Q8_K scale of the 256 values the threads of a block of
// M40_NORM_THREADS hold (thread j value j; 0 where a thread holds none).
// Every thread of the block calls it.
__device__ M40Q8K m40_block_q8_k(float v) {
    static_assert(M40_NORM_THREADS == 256, "a block of the prepare launches holds one Q8_K block");
    __shared__ float warp_max[M40_NORM_THREADS / 32];
    __shared__ int warp_first[M40_NORM_THREADS / 32];
    __shared__ float largest;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    float amax = m40_warp_max(fabsf(v));
    __syncthreads();  // a previous call's readers are done with the arrays
    if (lane == 0) warp_max[warp] = amax;
    __syncthreads();
#pragma unroll
    for (int w = 0; w < M40_NORM_THREADS / 32; w++) amax = fmaxf(amax, warp_max[w]);
    int first = fabsf(v) == amax ? int(threadIdx.x) : M40_NORM_THREADS;
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) first = min(first, __shfl_xor_sync(0xffffffffu, first, offset));
    if (lane == 0) warp_first[warp] = first;
    __syncthreads();
#pragma unroll
    for (int w = 0; w < M40_NORM_THREADS / 32; w++) first = min(first, warp_first[w]);
    if (int(threadIdx.x) == first) largest = v;
    __syncthreads();
    if (amax == 0.0f) return {0.0f, 0.0f};
    const float iscale = -127.0f / largest;
    return {iscale, 1.0f / iscale};
}

// A value's 8-bit code and its block's scale d in f32 (value ≈ d · code).
struct M40Q8Value {
    int q;
    float d;
};

// Value v's code as `scales` says: with Q8_K's scale `k` of its 256 values
// (codes held to 127, as llama.cpp's), else in its block of 32 (lane i % 32
// of the calling warp holding value i, every lane calling it) with d =
// amax / 127 in f32; to nearest, ties to even (the CPU's rounding).
__device__ __forceinline__ M40Q8Value m40_q8_code(float v, int scales, M40Q8K k) {
    if (scales == M40_SCALES_Q8_K) return {min(127, __float2int_rn(v * k.iscale)), k.d};
    const float d = m40_warp_max(fabsf(v)) / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    return {__float2int_rn(v * id), d};
}

// The scale d as `scales` keeps it.
__device__ __forceinline__ float m40_kept_scale(float d, int scales) {
    return scales == M40_SCALES_Q8_0 || scales == M40_SCALES_Q8_1 ? m40_round_to_f16(d) : d;
}

// Value v (index i) of activation row t into q8, its warp holding the 32
// values of its block (lane i % 32), its scales kept as `scales` says (`k`:
// Q8_K's). Every lane of the warp calls it.
__device__ __forceinline__ void m40_quantize_q8_value(float v, int i, int cols, int n_x, int8_t *q8, int t,
                                                      int scales, M40Q8K k) {
    const M40Q8Value c = m40_q8_code(v, scales, k);
    q8[size_t(t) * cols + i] = int8_t(c.q);
    int sum = c.q;
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (i % 32 == 0) {
        const float kept = m40_kept_scale(c.d, scales);
        const float d_sum = scales == M40_SCALES_Q8_1 ? m40_round_to_f16(c.d * float(sum)) : kept * float(sum);
        m40_q8_scales(q8, cols, n_x, t)[i / 32] = make_float2(kept, d_sum);
    }
}
