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

// Value v (index i) of activation row t into q8, its warp holding the 32
// values of its block (lane i % 32). The rounding is the CPU's: d = amax /
// 127, codes to nearest, ties to even. Every lane of the warp calls it.
__device__ __forceinline__ void m40_quantize_q8_value(float v, int i, int cols, int n_x, int8_t *q8, int t) {
    const float d = m40_warp_max(fabsf(v)) / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const int q = __float2int_rn(v * id);
    q8[size_t(t) * cols + i] = int8_t(q);
    int sum = q;
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (i % 32 == 0) m40_q8_scales(q8, cols, n_x, t)[i / 32] = make_float2(d, d * float(sum));
}
