// Activations scaled for the M40's decode products (gemv.cu's GemvScaled):
// the FP32 path's counterpart of q8.cuh's 8-bit codes, on GPUs without
// dp4a (sm_52–sm_60).
//
// A weight's code q (a small non-negative integer) is taken out of its
// quant word by a mask alone, q's bits left where they lie at bit p: with
// the exponent bits zero, those are the bits of the float q · 2^(p − 149),
// a denormal, exact. FFMA multiplies denormals at full rate (the library is
// built without -ftz), so a weight costs one LOP and one FFMA: no shift, no
// conversion and no bias subtraction per weight. Every format puts the code
// of an even value at bit 0 or 4 and that of an odd value at bit 8 or 12 of
// a 16-bit half of a word (the factor 16 of bits 4 and 12 goes into the
// block's scale), so activation i is scaled by 2^(85 − 8·(i % 2)) and every
// product x·q comes out as x·q · 2^−64 (M40_SCALED_RESULT undoes it). A
// format's code offset (Q4_0's 8, Q8_0's 128, Q6_K's 32) and minimum come
// off per block through the sums of 8 values each row carries, scaled by
// 2^−64 as well. 2^85 keeps activations up to 2^42 in range, 2^−64 keeps
// dot products down to 2^−62 normal.
#pragma once

#include "q8.cuh"

#define M40_SCALED_EVEN 0x1p85f
#define M40_SCALED_ODD 0x1p77f
#define M40_SCALED_SUM 0x1p-64f
#define M40_SCALED_RESULT 0x1p64f

// A row's values lie in tiles of 32 blocks of 32 (1024 values, a row's last
// tile padded): in a tile, block b's values 4k..4k+3 are the float4 at
// 32k + b, so that the lanes of a warp, each taking a block (lane i block
// i of a round, as the decode kernel deals them), read 512 consecutive
// bytes with each 16-byte load rather than a 16-byte piece of 32 lines.
// The sums lie in value order (sum j: values 8j..8j+7).
#define M40_SCALED_TILE 1024

__host__ __device__ constexpr int m40_scaled_padded(int cols) {
    return (cols + M40_SCALED_TILE - 1) / M40_SCALED_TILE * M40_SCALED_TILE;
}

// n_x rows of cols scaled activations (m40_scaled_bytes): every row's tiled
// values, then every row's sums of 8 values.
struct M40ScaledRow {
    const float *x;
    const float *sums;
};

__host__ __device__ constexpr size_t m40_scaled_bytes(int cols, int n_x) {
    return size_t(n_x) * (size_t(m40_scaled_padded(cols)) * 4 + size_t(cols) / 2);
}

// Where row t's values and its sums start in the scratch, in floats.
__host__ __device__ constexpr size_t m40_scaled_values_at(int cols, int t) {
    return size_t(t) * m40_scaled_padded(cols);
}
__host__ __device__ constexpr size_t m40_scaled_sums_at(int cols, int n_x, int t) {
    return size_t(n_x) * m40_scaled_padded(cols) + size_t(t) * (cols / 8);
}

__device__ __forceinline__ M40ScaledRow m40_scaled_row(const int8_t *scratch, int cols, int n_x, int t) {
    const float *base = reinterpret_cast<const float *>(scratch);
    return {base + m40_scaled_values_at(cols, t), base + m40_scaled_sums_at(cols, n_x, t)};
}

// The float4 of a row holding block `block`'s first four values: its values
// 4k.. are 32·k float4 further.
__host__ __device__ constexpr int m40_scaled_vector(int block) { return (block >> 5) * 256 + (block & 31); }

__device__ __forceinline__ const float4 *m40_scaled_block(const float *x, int block) {
    return reinterpret_cast<const float4 *>(x) + m40_scaled_vector(block);
}

// Value v (index i) of activation row t, scaled into `scratch` (the layout
// above; a padded tile's tail is never written, nor read), its warp holding
// the 32 values of its block (lane i % 32). The value is first rounded to
// its block's 8-bit grid, d · code with d kept as `scales` says (q8.cuh; `k`:
// Q8_K's), so that the M40's products see the activations the integer path
// and the CPU backend see, as llama.cpp's CPU products do; the sums are of
// the rounded values (Q8_1's f16 sum is not mirrored: a Q4_1 or Q5_1
// block's minimum multiplies a sum within one f16 rounding of it). Every
// lane of the warp calls it.
__device__ __forceinline__ void m40_scale_value(float v, int i, int cols, int n_x, int8_t *scratch, int t, int scales,
                                                M40Q8K k) {
    const M40Q8Value c = m40_q8_code(v, scales, k);
    v = float(c.q) * m40_kept_scale(c.d, scales);
    float *values = reinterpret_cast<float *>(scratch) + m40_scaled_values_at(cols, t);
    values[4 * (m40_scaled_vector(i / 32) + 32 * (i / 4 % 8)) + i % 4] = v * (i % 2 ? M40_SCALED_ODD : M40_SCALED_EVEN);
    float sum = v;
#pragma unroll
    for (int offset = 1; offset < 8; offset <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (i % 8 == 0) reinterpret_cast<float *>(scratch)[m40_scaled_sums_at(cols, n_x, t) + i / 8] = sum * M40_SCALED_SUM;
}

// The float whose bits are those of w under `mask` (a code in place: see above).
__device__ __forceinline__ float m40_code(uint32_t w, uint32_t mask) { return __uint_as_float(w & mask); }

// acc + Σ x[k] · code k, for the four byte codes of c (each below 2^8; x
// the values' scaled activations): bytes 0 and 1 in place, 2 and 3 after one
// shift, which keeps every code clear of the exponent.
__device__ __forceinline__ float m40_scaled_bytes4(uint32_t c, float4 x, float acc) {
    const uint32_t h = c >> 16;
    acc = fmaf(x.x, m40_code(c, 0xFFu), acc);
    acc = fmaf(x.y, m40_code(c, 0xFF00u), acc);
    acc = fmaf(x.z, m40_code(h, 0xFFu), acc);
    return fmaf(x.w, m40_code(h, 0xFF00u), acc);
}

// The sums a word of four codes goes into, each at its own power of two,
// so that no code but the last is shifted. A code is BITS bits at bit LOW
// of its byte (LOW + BITS ≤ 7; the byte's other bits may hold anything):
// codes 0 and 1 are masked where they lie, as in m40_scaled_bytes4
// (x·q · 2^(LOW−64)); code 2 is masked where it lies too, bits 16 + LOW..,
// clear of the exponent (x·q · 2^(LOW−48)); code 3 is taken down to bit 0,
// an odd value's code on an even value's bits (x·q · 2^−72). That is one
// shift a word where taking codes 2 and 3 down to bits 0 and 8 costs two
// and a mask more; the two extra sums cost two FFMAs a sum (total()).
template <int LOW, int BITS> struct M40CodeSums {
    static_assert(LOW + BITS <= 7, "code 2, masked in place, must stay clear of the exponent (bit 23)");
    static constexpr uint32_t MASK = ((1u << BITS) - 1) << LOW;
    float near, third, fourth;
    __device__ __forceinline__ explicit M40CodeSums(float start = 0.0f) : near(start), third(0.0f), fourth(0.0f) {}
    // sums += x[k] · code k for the four codes of c.
    __device__ __forceinline__ void add(uint32_t c, float4 x) {
        near = fmaf(x.x, m40_code(c, MASK), near);
        near = fmaf(x.y, m40_code(c, MASK << 8), near);
        third = fmaf(x.z, m40_code(c, MASK << 16), third);
        fourth = fmaf(x.w, m40_code(c >> (24 + LOW), MASK >> LOW), fourth);
    }
    // (Σ x·q) · 2^(LOW−64), plus the start.
    __device__ __forceinline__ float total() const {
        return fmaf(third, 0x1p-16f, fmaf(fourth, float(1u << (8 + LOW)), near));
    }
};

// Bits `mask` of a, the others of b: one LOP3 (the compiler, left to
// itself, masks b first).
template <uint32_t MASK> __device__ __forceinline__ uint32_t m40_select_bits(uint32_t a, uint32_t b) {
    uint32_t out;
    // LUT 0xE4: (a & c) | (b & ~c) for a = 0xF0, b = 0xCC, c = 0xAA.
    asm("lop3.b32 %0, %1, %2, %3, 0xE4;" : "=r"(out) : "r"(a), "r"(b), "n"(MASK));
    return out;
}

// The low nibble of each byte of `nibbles` with bits 4..7 of the same byte
// of `high` above it, the code's top bit at bit 4 (bits 5..7 are left to
// M40CodeSums's masks).
__device__ __forceinline__ uint32_t m40_nibbles_with_bit4(uint32_t nibbles, uint32_t high) {
    return m40_select_bits<0x0F0F0F0Fu>(nibbles, high);
}

// The nibbles of quant word w: its bytes' low nibbles (values `low`) into
// lo, their high nibbles (values `high`) into hi, which comes out 16 times
// the sum (codes at bits 4 and 12).
__device__ __forceinline__ void m40_scaled_nibbles8(uint32_t w, float4 low, float4 high, float &lo, float &hi) {
    const uint32_t h = w >> 16;
    lo = fmaf(low.x, m40_code(w, 0x0Fu), lo);
    lo = fmaf(low.y, m40_code(w, 0x0F00u), lo);
    lo = fmaf(low.z, m40_code(h, 0x0Fu), lo);
    lo = fmaf(low.w, m40_code(h, 0x0F00u), lo);
    hi = fmaf(high.x, m40_code(w, 0xF0u), hi);
    hi = fmaf(high.y, m40_code(w, 0xF000u), hi);
    hi = fmaf(high.z, m40_code(h, 0xF0u), hi);
    hi = fmaf(high.w, m40_code(h, 0xF000u), hi);
}
