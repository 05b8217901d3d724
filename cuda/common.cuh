// Shared by every kernel file: the launcher calling convention, f16/bf16
// loads from raw bytes, and warp reductions.
//
// Maxwell (sm_52) rules for all of cuda/: arithmetic in FP32 only; FP16 is a
// storage format, converted with __half2float / __float2half_rn (plain
// conversion instructions on every architecture); no dp4a, no half
// arithmetic intrinsics, no tensor-core instructions.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

// Launchers are called from Rust: plain C names, a stream last, and the
// launch's error code as the result.
#define M40_EXPORT extern "C"

static inline cudaError_t m40_launch_status() { return cudaGetLastError(); }

__device__ __forceinline__ float m40_f16(const uint8_t *p) {
    // Every f16 inside a GGUF block sits at an even address: tensors are
    // 32-byte aligned and every block size is even.
    return __half2float(__ushort_as_half(*reinterpret_cast<const uint16_t *>(p)));
}

__device__ __forceinline__ float m40_half_bits(uint16_t bits) {
    return __half2float(__ushort_as_half(bits));
}

__device__ __forceinline__ float m40_bf16(const uint8_t *p) {
    uint32_t bits = uint32_t(*reinterpret_cast<const uint16_t *>(p)) << 16;
    return __uint_as_float(bits);
}

__device__ __forceinline__ float m40_warp_sum(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

__device__ __forceinline__ float m40_warp_max(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
}

// The gate activation of SwiGLU (SiLU) or GeGLU (tanh-GELU, written as
// x / (1 + e^{−2y}), as the CPU backend computes it).
__device__ __forceinline__ float m40_activation(bool gelu, float g) {
    if (!gelu) return g / (1.0f + expf(-g));
    const float y = 0.7978845608f * g * (1.0f + 0.044715f * g * g);
    return g / (1.0f + expf(-2.0f * y));
}

static inline unsigned m40_blocks(size_t n, unsigned threads) {
    return unsigned((n + threads - 1) / threads);
}
