// Decode's matrix products: up to M40_GEMV_MAX_X activation rows times one
// to three weight matrices, reading every weight byte once. This is where a
// token's time goes (every weight is read once per step), so the kernel is
// built for memory throughput:
//   - a warp owns R weight rows; its lanes walk the rows together, lane i
//     taking "unit" i, i + 32, ... (a unit is 8 or 16 values of one block,
//     32 on the integer path), so consecutive lanes read consecutive bytes
//     and each weight word is loaded with the widest load its alignment in
//     the GGUF layout allows;
//   - weights are decoded in registers with integer tricks instead of int →
//     float conversions (a quarter-rate instruction on sm_80+): a small
//     integer q placed in the mantissa of 2^23 is the float 2^23 + q;
//   - weights, read once per step, go through L2 only (ld.global.cg) or as
//     a stream (ld.global.cs, evicted first; m40_streamed_weights), so
//     that their stream does not evict from L1 the activations every warp
//     reads again and again;
//   - activations come through the read-only cache (optionally
//     RMS-normalized on the way: the norm that precedes a projection), and
//     every value loaded serves all R rows;
//   - on sm_61+ the quantized formats multiply 8-bit activations with dp4a
//     instead (the integer path below; the M40 keeps FP32);
//   - on the FP32 path, where a matrix has too few row groups to keep the
//     GPU's warps busy, a block's warps share each row group instead
//     (SPLIT, m40_gemv_split);
//   - with overlapping launches (sm_90, see common.cuh) a warp's first
//     weights are in flight before the previous kernel has finished.
// Epilogues write, accumulate into (the residual add) or combine a gate and
// an up row (SwiGLU/GeGLU/gpt-oss's clamped SwiGLU), so a transformer layer's projections need no
// separate element-wise kernels; the query, key and value projections of
// models without per-head norms rotate their RoPE pairs and store keys and
// values in the KV cache (attention's inputs) in theirs.
#include "ops.cuh"
#include "prepare.cuh"

#define M40_GEMV_MAX_X 8
#define M40_GEMV_WARPS 4
// Waves of resident blocks the one-row kernel's expert slices share.
#define M40_GEMV_EXPERT_WAVES 4

// The gated epilogues are M40_GEMV_GLU_SILU + the activation's M40Glu.
enum M40GemvEpilogue {
    M40_GEMV_STORE = 0,
    M40_GEMV_ACCUMULATE = 1,
    M40_GEMV_GLU_SILU = 2,
    M40_GEMV_GLU_GELU = 3,
    M40_GEMV_GLU_OAI = 4
};

// One weight matrix of a launch: `rows` × cols weights, an optional bias of
// `rows` f32, and its output (n_x rows of `rows` values; for keys and values,
// the launch's KV cache rows instead).
struct M40GemvMatrix {
    const uint8_t *w;
    const float *bias;
    float *y;
    int rows;
    int role;  // M40ProjectionRole
};

// Mirrors `GemvLaunch` in src/backend/cuda/kernels.rs.
struct M40Gemv {
    M40GemvMatrix m[3];
    int n_matrices;
    int cols;
    const float *x;
    int n_x;
    int epilogue;
    // RMSNorm weights (cols f32) applied to every x row first, or null.
    const float *norm;
    float eps;
    // Multiprocessors of the device (the grid fills them).
    int sm_count;
    // Scratch for x prepared (m40_prepared_bytes, prepare.cuh): 8-bit codes
    // for the integer path on GPUs with dp4a, scaled values for the scaled
    // path on the M40, for the formats that have them; for the other
    // formats whose activations the CPU rounds, grid values in f32 for the
    // FP32 kernel; null for the FP32 path on unrounded x.
    int8_t *x_q8;
    // x_q8 already holds x (normalized and prepared by the launch of the
    // same step's previous product).
    int x_quantized;
    // Overlap the stream's previous kernel (see m40_launch).
    int overlap;
    // Where the query, key and value roles' results go (their cache rows,
    // one per activation row; layer, head shapes, RoPE); rows is null where
    // no matrix has such a role. Its own `overlap` is not read.
    M40AttentionInputs attention;
    // Expert matrices (a mixture of experts' products), or work null.
    M40Experts experts;
};

// ---- decoding helpers ----

// The float 2^23 + q for 0 ≤ q < 2^23, from q's bits.
#define M40_MAGIC 0x4B000000u
#define M40_MAGIC_F 8388608.0f

// Byte k of w (as a small integer) in the mantissa of 2^23: one PRMT.
__device__ __forceinline__ float m40_byte_magic(uint32_t w, int k) {
    return __uint_as_float(__byte_perm(w, M40_MAGIC, k | 0x7440));
}

// Four bytes of w as floats minus `bias` (exact: all are small integers).
__device__ __forceinline__ void m40_bytes4(uint32_t w, float bias, float *v) {
#pragma unroll
    for (int k = 0; k < 4; k++) v[k] = m40_byte_magic(w, k) - (M40_MAGIC_F + bias);
}

// ---- per-format units ----
// Gemv<TYPE>: a block of VALUES values in BYTES bytes is UNITS units of UNIT
// values; unit u's values come in UNIT/4 groups of 4 consecutive positions,
// group g starting at pos(u, g) within the block. unit() writes the values'
// codes v (as floats), and per group a scale and (where OFFSET) an offset:
// weight = v · scale + offset. SCALES: how many runs of groups share one
// scale (0: none, the codes are the weights), so that a dot product is
// scaled once per run rather than once per group. DIRECT: the kernel reads
// units straight from global memory (16-byte loads already); the others'
// blocks are staged through shared memory (see the kernel).

template <int TYPE> struct Gemv {
    // Any format without a specialization: 16 values of decode16 per unit.
    using F = Format<TYPE>;
    static constexpr int VALUES = F::VALUES, BYTES = F::BYTES, UNIT = 16, UNITS = F::VALUES / 16;
    static constexpr bool OFFSET = false;
    static constexpr int SCALES = 0;
    static constexpr bool DIRECT = false;
    __device__ static int pos(int u, int g) { return 16 * u + 4 * g; }
    __device__ static void unit(const uint8_t *b, int u, float *v, float *sc, float *) {
        F::decode16(b, u, v);
#pragma unroll
        for (int g = 0; g < 4; g++) sc[g] = 1.0f;
    }
};

// Float formats: a "block" of 8 values.
template <> struct Gemv<M40_F32> {
    static constexpr int VALUES = 8, BYTES = 32, UNIT = 8, UNITS = 1;
    static constexpr bool OFFSET = false;
    static constexpr int SCALES = 0;
    static constexpr bool DIRECT = true;
    __device__ static int pos(int, int g) { return 4 * g; }
    __device__ static void unit(const uint8_t *b, int, float *v, float *sc, float *) {
        const float4 *p = reinterpret_cast<const float4 *>(b);
        const float4 a = __ldcs(p), c = __ldcs(p + 1);  // streamed: see m40_streamed_weights
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = c.x, v[5] = c.y, v[6] = c.z, v[7] = c.w;
        sc[0] = sc[1] = 1.0f;
    }
};

// F16 and BF16: 8 values per 16-byte load.
template <float (*WIDEN)(uint32_t)> struct GemvHalf {
    static constexpr int VALUES = 8, BYTES = 16, UNIT = 8, UNITS = 1;
    static constexpr bool OFFSET = false;
    static constexpr int SCALES = 0;
    static constexpr bool DIRECT = true;
    __device__ static int pos(int, int g) { return 4 * g; }
    __device__ static void unit(const uint8_t *b, int, float *v, float *sc, float *) {
        m40_words8(__ldcs(reinterpret_cast<const uint4 *>(b)), v, WIDEN);  // streamed: see m40_streamed_weights
        sc[0] = sc[1] = 1.0f;
    }
};
template <> struct Gemv<M40_F16> : GemvHalf<m40_widen_f16> {};
template <> struct Gemv<M40_BF16> : GemvHalf<m40_widen_bf16> {};

// The 32-value formats: unit u is byte word u of the quants, i.e. values
// 4u..4u+3 (low nibbles) and 16+4u..16+4u+3 (high nibbles).
__device__ __forceinline__ void m40_nibbles8(uint32_t q, uint32_t fifth_low, uint32_t fifth_high, float bias,
                                             float *v) {
    m40_bytes4((q & 0x0F0F0F0Fu) | fifth_low, bias, v);
    m40_bytes4(((q >> 4) & 0x0F0F0F0Fu) | fifth_high, bias, v + 4);
}

template <> struct Gemv<M40_Q4_0> {
    static constexpr int VALUES = 32, BYTES = 18, UNIT = 8, UNITS = 4;
    static constexpr bool OFFSET = false;
    static constexpr int SCALES = 1;
    static constexpr bool DIRECT = false;
    __device__ static int pos(int u, int g) { return 4 * u + 16 * g; }
    __device__ static void unit(const uint8_t *b, int u, float *v, float *sc, float *) {
        m40_nibbles8(m40_u32_2(b + 2 + 4 * u), 0, 0, 8.0f, v);
        sc[0] = sc[1] = m40_f16(b);
    }
};

template <> struct Gemv<M40_Q4_1> {
    static constexpr int VALUES = 32, BYTES = 20, UNIT = 8, UNITS = 4;
    static constexpr bool OFFSET = true;
    static constexpr int SCALES = 1;
    static constexpr bool DIRECT = false;
    __device__ static int pos(int u, int g) { return 4 * u + 16 * g; }
    __device__ static void unit(const uint8_t *b, int u, float *v, float *sc, float *of) {
        m40_nibbles8(m40_u32_4(b + 4 + 4 * u), 0, 0, 0.0f, v);
        sc[0] = sc[1] = m40_f16(b);
        of[0] = of[1] = m40_f16(b + 2);
    }
};

template <> struct Gemv<M40_Q5_0> {
    static constexpr int VALUES = 32, BYTES = 22, UNIT = 8, UNITS = 4;
    static constexpr bool OFFSET = false;
    static constexpr int SCALES = 1;
    static constexpr bool DIRECT = false;
    __device__ static int pos(int u, int g) { return 4 * u + 16 * g; }
    __device__ static void unit(const uint8_t *b, int u, float *v, float *sc, float *) {
        const uint32_t qh = m40_u32_2(b + 2);
        m40_nibbles8(m40_u32_2(b + 6 + 4 * u), m40_spread4_to_bit4(qh >> (4 * u)),
                     m40_spread4_to_bit4(qh >> (16 + 4 * u)), 16.0f, v);
        sc[0] = sc[1] = m40_f16(b);
    }
};

template <> struct Gemv<M40_Q5_1> {
    static constexpr int VALUES = 32, BYTES = 24, UNIT = 8, UNITS = 4;
    static constexpr bool OFFSET = true;
    static constexpr int SCALES = 1;
    static constexpr bool DIRECT = false;
    __device__ static int pos(int u, int g) { return 4 * u + 16 * g; }
    __device__ static void unit(const uint8_t *b, int u, float *v, float *sc, float *of) {
        const uint32_t qh = m40_u32_4(b + 4);
        m40_nibbles8(m40_u32_4(b + 8 + 4 * u), m40_spread4_to_bit4(qh >> (4 * u)),
                     m40_spread4_to_bit4(qh >> (16 + 4 * u)), 0.0f, v);
        sc[0] = sc[1] = m40_f16(b);
        of[0] = of[1] = m40_f16(b + 2);
    }
};

// Q8_0: unit u is values 8u..8u+7.
template <> struct Gemv<M40_Q8_0> {
    static constexpr int VALUES = 32, BYTES = 34, UNIT = 8, UNITS = 4;
    static constexpr bool OFFSET = false;
    static constexpr int SCALES = 1;
    static constexpr bool DIRECT = false;
    __device__ static int pos(int u, int g) { return 8 * u + 4 * g; }
    __device__ static void unit(const uint8_t *b, int u, float *v, float *sc, float *) {
        // Flipping the sign bit maps an int8 q to the byte q + 128.
        m40_bytes4(m40_u32_2(b + 2 + 8 * u) ^ 0x80808080u, 128.0f, v);
        m40_bytes4(m40_u32_2(b + 6 + 8 * u) ^ 0x80808080u, 128.0f, v + 4);
        sc[0] = sc[1] = m40_f16(b);
    }
};

// Q4_K / Q5_K: unit u (of 16) is quant bytes 8u..8u+7 of the 128: with
// c = u / 4, l = 8 (u % 4), low nibbles are values 64c + l + 0..7 of
// sub-block 2c, high nibbles 64c + 32 + l + 0..7 of sub-block 2c + 1.
template <int TYPE> struct GemvK {
    static constexpr int VALUES = 256, UNIT = 16, UNITS = 16;
    static constexpr bool OFFSET = true;
    static constexpr int SCALES = 2;
    static constexpr bool DIRECT = false;
    __device__ static int pos(int u, int g) { return 64 * (u / 4) + 8 * (u % 4) + 4 * (g & 1) + 32 * (g >> 1); }
    __device__ static void scales(const uint8_t *b, int u, float *sc, float *of) {
        const float d = m40_f16(b), dmin = m40_f16(b + 2);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int scale, min;
            m40_k_scale_min(b + 4, 2 * (u / 4) + h, scale, min);
            sc[2 * h] = sc[2 * h + 1] = d * float(scale);
            of[2 * h] = of[2 * h + 1] = -dmin * float(min);
        }
    }
};

template <> struct Gemv<M40_Q4_K> : GemvK<M40_Q4_K> {
    static constexpr int BYTES = 144;
    __device__ static void unit(const uint8_t *b, int u, float *v, float *sc, float *of) {
        const uint2 q = *reinterpret_cast<const uint2 *>(b + 16 + 8 * u);
        m40_bytes4(q.x & 0x0F0F0F0Fu, 0.0f, v);
        m40_bytes4(q.y & 0x0F0F0F0Fu, 0.0f, v + 4);
        m40_bytes4((q.x >> 4) & 0x0F0F0F0Fu, 0.0f, v + 8);
        m40_bytes4((q.y >> 4) & 0x0F0F0F0Fu, 0.0f, v + 12);
        scales(b, u, sc, of);
    }
};

template <> struct Gemv<M40_Q5_K> : GemvK<M40_Q5_K> {
    static constexpr int BYTES = 176;
    __device__ static void unit(const uint8_t *b, int u, float *v, float *sc, float *of) {
        const int c = u / 4, l = 8 * (u % 4);
        const uint2 q = *reinterpret_cast<const uint2 *>(b + 48 + 8 * u);
        const uint2 h = *reinterpret_cast<const uint2 *>(b + 16 + l);
        m40_bytes4((q.x & 0x0F0F0F0Fu) | (((h.x >> (2 * c)) & 0x01010101u) << 4), 0.0f, v);
        m40_bytes4((q.y & 0x0F0F0F0Fu) | (((h.y >> (2 * c)) & 0x01010101u) << 4), 0.0f, v + 4);
        m40_bytes4(((q.x >> 4) & 0x0F0F0F0Fu) | (((h.x >> (2 * c + 1)) & 0x01010101u) << 4), 0.0f, v + 8);
        m40_bytes4(((q.y >> 4) & 0x0F0F0F0Fu) | (((h.y >> (2 * c + 1)) & 0x01010101u) << 4), 0.0f, v + 12);
        scales(b, u, sc, of);
    }
};

// Q6_K: unit u (of 16): half h = u / 8, l = 4 (u % 8); group g is values
// 128h + 32g + l + 0..3, whose low nibbles come from ql word 64h + l (g even)
// or 64h + 32 + l (g odd), low (g < 2) or high half, and high bits from qh
// word 32h + l at bits 2g.
template <> struct Gemv<M40_Q6_K> {
    static constexpr int VALUES = 256, BYTES = 210, UNIT = 16, UNITS = 16;
    static constexpr bool OFFSET = false;
    static constexpr int SCALES = 4;
    static constexpr bool DIRECT = false;
    __device__ static int pos(int u, int g) { return 128 * (u / 8) + 32 * g + 4 * (u % 8); }
    __device__ static void unit(const uint8_t *b, int u, float *v, float *sc, float *) {
        const int h = u / 8, l = 4 * (u % 8);
        const uint32_t ql0 = m40_u32_2(b + 64 * h + l), ql1 = m40_u32_2(b + 64 * h + 32 + l);
        const uint32_t qh = m40_u32_2(b + 128 + 32 * h + l);
        const float d = m40_f16(b + 208);
#pragma unroll
        for (int g = 0; g < 4; g++) {
            const uint32_t low = ((g & 1 ? ql1 : ql0) >> (4 * (g >> 1))) & 0x0F0F0F0Fu;
            const uint32_t high = ((qh >> (2 * g)) & 0x03030303u) << 4;
            m40_bytes4(low | high, 32.0f, v + 4 * g);
            sc[g] = d * float(int8_t(b[192 + 8 * h + 2 * g + l / 16]));
        }
    }
};

// ---- the integer path (sm_61+) ----
// Where the GPU has dp4a (four 8-bit products summed into a 32-bit integer in
// one instruction), activations are quantized to 8 bits in blocks of 32 as
// the CPU backend quantizes them (src/quant/q8.rs), and each weight costs a
// fraction of an instruction instead of a decode and an FMA; the activations
// a warp reads shrink from 4 bytes per value (plus the norm's weights) to
// 1.25. The M40 has no dp4a and takes the scaled path below.

// dp4a on sm_61+. The host launches the integer kernels only where they were
// compiled for sm_61+ (m40_gemv_prepared_path), and their bodies are
// compiled only there (gemv_kernel); the byte-by-byte form only keeps the
// code compiling for the older targets.
__device__ __forceinline__ int m40_dp4a(int a, int b, int c) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 610
    return __dp4a(a, b, c);
#else
#pragma unroll
    for (int k = 0; k < 4; k++) c += int(int8_t(a >> (8 * k))) * int(int8_t(b >> (8 * k)));
    return c;
#endif
}

// Per format: a block of VALUES values in BYTES bytes is UNITS units; a unit's
// weights decode (`weights`) to packed 8-bit codes and their scales (W), its
// activations (`activations`, shared by the R rows of a warp) to codes and
// block scales (X), and `dot` is the unit's share of the row's dot product.
// A term that belongs to a whole block of activations (a code offset times
// the block's d·Σcodes) is split evenly over the units that cover the block.
//
// A unit is 32 weights: per weight row, a lane's unit costs eight dp4a, one
// scale conversion and one pair of 16-byte activation loads. Units of 8 or
// 16 weights (as the FP32 path has) spend as much again on loads, address
// arithmetic and scales per weight, which holds the products well short of
// the memory's speed: 32-weight units measured faster on the H100 for every
// format, more so for batches of sessions, where each unit loads every
// row's activations.
template <int TYPE> struct GemvQ8;

// Σ codes w[0..3] · a (four dp4a), plus c.
__device__ __forceinline__ int m40_dp4a_16(const int *w, int4 a, int c) {
    return m40_dp4a(w[3], a.w, m40_dp4a(w[2], a.z, m40_dp4a(w[1], a.y, m40_dp4a(w[0], a.x, c))));
}

// Σ codes w[0..7] · (lo, hi), plus c.
__device__ __forceinline__ int m40_dp4a_32(const int *w, int4 lo, int4 hi, int c) {
    return m40_dp4a_16(w + 4, hi, m40_dp4a_16(w, lo, c));
}

// Activation codes 16h..16h+15 of block `sub` of a row, 16-byte aligned.
__device__ __forceinline__ int4 m40_q8_codes16(M40Q8Row x, int sub, int h) {
    return __ldg(reinterpret_cast<const int4 *>(x.qs + 32 * sub + 16 * h));
}

// Q4_0 / Q4_1 / Q5_0 / Q5_1 (NibbleBlock, quant.cuh): a unit is a whole
// block; w.q[k] holds the codes of values 4k..4k+3, w.q[4 + k] those of
// 16+4k..16+4k+3.
template <class L> struct GemvQ8Nibbles {
    static constexpr int VALUES = 32, BYTES = L::BYTES, UNITS = 1;
    static constexpr bool DIRECT = false;
    struct W {
        int q[8];  // values 0..15, then 16..31
        float d, m;
    };
    struct X {
        int4 low, high;
        float d, d_sum;
    };
    __device__ static void weights(const uint8_t *b, int, W &w) {
        const uint32_t fifth = L::fifth_bits(b);
        uint32_t words[4];
        L::quant_words(b, words);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            w.q[k] = int(L::word_codes(words[k], fifth, k, 0));
            w.q[4 + k] = int(L::word_codes(words[k], fifth, k, 1));
        }
        w.d = m40_f16(b);
        w.m = L::MIN ? m40_f16(b + 2) : 0.0f;
    }
    __device__ static void activations(M40Q8Row x, int block, int, X &a) {
        a.low = m40_q8_codes16(x, block, 0);
        a.high = m40_q8_codes16(x, block, 1);
        const float2 ds = __ldg(x.ds + block);
        a.d = ds.x;
        a.d_sum = ds.y;
    }
    __device__ static float dot(const W &w, const X &a) {
        const float s = float(m40_dp4a_32(w.q, a.low, a.high, 0));
        if (L::MIN) return fmaf(w.d * a.d, s, w.m * a.d_sum);
        return w.d * fmaf(a.d, s, -float(L::ZERO) * a.d_sum);
    }
};

template <> struct GemvQ8<M40_Q4_0> : GemvQ8Nibbles<NibbleBlock<M40_Q4_0>> {};
template <> struct GemvQ8<M40_Q4_1> : GemvQ8Nibbles<NibbleBlock<M40_Q4_1>> {};
template <> struct GemvQ8<M40_Q5_0> : GemvQ8Nibbles<NibbleBlock<M40_Q5_0>> {};
template <> struct GemvQ8<M40_Q5_1> : GemvQ8Nibbles<NibbleBlock<M40_Q5_1>> {};

// Q8_0: a unit is a whole block.
template <> struct GemvQ8<M40_Q8_0> {
    static constexpr int VALUES = 32, BYTES = 34, UNITS = 1;
    static constexpr bool DIRECT = false;
    struct W {
        int q[8];
        float d;
    };
    struct X {
        int4 low, high;
        float d;
    };
    __device__ static void weights(const uint8_t *b, int, W &w) {
        m40_words<8, 2>(b + 2, reinterpret_cast<uint32_t *>(w.q));
        w.d = m40_f16(b);
    }
    __device__ static void activations(M40Q8Row x, int block, int, X &a) {
        a.low = m40_q8_codes16(x, block, 0);
        a.high = m40_q8_codes16(x, block, 1);
        a.d = __ldg(&x.ds[block].x);
    }
    __device__ static float dot(const W &w, const X &a) {
        return w.d * a.d * float(m40_dp4a_32(w.q, a.low, a.high, 0));
    }
};

// The table-lookup formats: a code's table value is the weight's 8-bit
// code, as ggml's CPU products take it, so a unit's dot product is Q8_0's
// on looked-up codes. A unit is 32 values whose 16 quant bytes hold two
// codes each (quant.cuh): IQ4_NL's and MXFP4's whole block, under its
// scale, with Q8_0's activations; IQ4_XS's sub-block u of 8, under its own
// scale, with Q8_K's (kept a block of 32 at a time, as for the K-quants).
struct M40LookupW {
    int q[8];  // values 0..15, then 16..31
    float d;
};
struct M40LookupX {
    int4 low, high;
    float d;
};

// A unit's codes from its 4 quant words.
__device__ __forceinline__ void m40_lookup_unit(const uint32_t *words, uint4 table, M40LookupW &w) {
#pragma unroll
    for (int k = 0; k < 4; k++) {
        uint32_t low, high;
        m40_lookup8(words[k], table, low, high);
        w.q[k] = int(low);
        w.q[4 + k] = int(high);
    }
}

// Activation block `sub` of a row.
__device__ __forceinline__ void m40_lookup_activations(M40Q8Row x, int sub, M40LookupX &a) {
    a.low = m40_q8_codes16(x, sub, 0);
    a.high = m40_q8_codes16(x, sub, 1);
    a.d = __ldg(&x.ds[sub].x);
}

struct GemvQ8Lookup {
    static constexpr bool DIRECT = false;
    using W = M40LookupW;
    using X = M40LookupX;
    __device__ static float dot(const W &w, const X &a) {
        return w.d * a.d * float(m40_dp4a_32(w.q, a.low, a.high, 0));
    }
};

// IQ4_NL (an f16 scale, 18-byte blocks) and MXFP4 (an E8M0 exponent,
// 17-byte blocks): a unit is a block, its scale, then its 16 quant bytes.
template <int TYPE> struct GemvQ8LookupBlock : GemvQ8Lookup {
    static constexpr bool MX = TYPE == M40_MXFP4;
    static constexpr int VALUES = 32, BYTES = MX ? 17 : 18, UNITS = 1;
    __device__ static void weights(const uint8_t *b, int, W &w) {
        uint32_t words[4];
        m40_words<4, MX ? 1 : 2>(b + (MX ? 1 : 2), words);
        m40_lookup_unit(words, MX ? m40_mxfp4_values() : m40_iq4_values(), w);
        w.d = MX ? m40_e8m0_half(b[0]) : m40_f16(b);
    }
    __device__ static void activations(M40Q8Row x, int block, int, X &a) { m40_lookup_activations(x, block, a); }
};

template <> struct GemvQ8<M40_IQ4_NL> : GemvQ8LookupBlock<M40_IQ4_NL> {};
template <> struct GemvQ8<M40_MXFP4> : GemvQ8LookupBlock<M40_MXFP4> {};

// IQ4_XS blocks (136 bytes) are 8-byte aligned wherever a row is.
template <> struct GemvQ8<M40_IQ4_XS> : GemvQ8Lookup {
    static constexpr int VALUES = 256, BYTES = 136, UNITS = 8;
    __device__ static void weights(const uint8_t *b, int u, W &w) {
        const uint2 first = *reinterpret_cast<const uint2 *>(b + 8 + 16 * u);
        const uint2 second = *reinterpret_cast<const uint2 *>(b + 16 + 16 * u);
        const uint32_t words[4] = {first.x, first.y, second.x, second.y};
        m40_lookup_unit(words, m40_iq4_values(), w);
        w.d = m40_iq4_xs_scale(b, u);
    }
    __device__ static void activations(M40Q8Row x, int block, int u, X &a) {
        m40_lookup_activations(x, 8 * block + u, a);
    }
};

// The codes of a 32-weight unit of the K formats with high bits, a byte
// each (the integer and scaled paths' units are the same): Q5_K unit u (of
// 8), quant bytes 16u..16u+15 with their fifth bits at bit 4, words 0..3
// sub-block 2c's values 16h.., 4..7 sub-block 2c + 1's (c = u / 2,
// h = u % 2); Q6_K unit u, codes[2g + k] group g's values l + 4k.. of
// 128h + 32g (h = u / 4, l = 8 (u % 4)): low nibbles from ql bytes
// 64h + l (g even) or 64h + 32 + l (g odd), low (g < 2) or high half,
// high bits from qh bytes 32h + l at bits 2g.
__device__ __forceinline__ void m40_q5k_codes(const uint8_t *b, int u, uint32_t *codes) {
    const int c = u / 2;
    const uint4 q = *reinterpret_cast<const uint4 *>(b + 48 + 16 * u);
    const uint4 h = *reinterpret_cast<const uint4 *>(b + 16 + 16 * (u % 2));
    const uint32_t words[4] = {q.x, q.y, q.z, q.w}, high_bits[4] = {h.x, h.y, h.z, h.w};
    const auto fifth = [](uint32_t bits, int shift) { return ((bits >> shift) & 0x01010101u) << 4; };
#pragma unroll
    for (int k = 0; k < 4; k++) {
        codes[k] = (words[k] & 0x0F0F0F0Fu) | fifth(high_bits[k], 2 * c);
        codes[4 + k] = ((words[k] >> 4) & 0x0F0F0F0Fu) | fifth(high_bits[k], 2 * c + 1);
    }
}

__device__ __forceinline__ void m40_q6k_codes(const uint8_t *b, int u, uint32_t *codes) {
    const int h = u / 4, l = 8 * (u % 4);
#pragma unroll
    for (int k = 0; k < 2; k++) {
        const uint32_t ql0 = m40_u32_2(b + 64 * h + l + 4 * k), ql1 = m40_u32_2(b + 64 * h + 32 + l + 4 * k);
        const uint32_t qh = m40_u32_2(b + 128 + 32 * h + l + 4 * k);
#pragma unroll
        for (int g = 0; g < 4; g++) {
            const uint32_t low = ((g & 1 ? ql1 : ql0) >> (4 * (g >> 1))) & 0x0F0F0F0Fu;
            codes[2 * g + k] = low | (((qh >> (2 * g)) & 0x03030303u) << 4);
        }
    }
}

// Q4_K / Q5_K: unit u (of 8) is quant bytes 16u..16u+15 of the 128: with
// c = u / 2 and h = u % 2, the low nibbles are values 16h..16h+15 of
// sub-block 2c and the high nibbles those of sub-block 2c + 1; each
// sub-block of 32 is one activation block, and d·scale·q − dmin·min the
// weight.
template <int TYPE> struct GemvQ8K {
    static constexpr int VALUES = 256, UNITS = 8;
    static constexpr bool DIRECT = false;
    struct W {
        int q[8];  // sub-block 2c's 16 values, then 2c + 1's
        float scale_low, min_low, scale_high, min_high;
    };
    struct X {
        int4 low, high;
        float d_low, d_sum_low, d_high, d_sum_high;
    };
    __device__ static void scales(const uint8_t *b, int u, W &w) {
        const float d = m40_f16(b), dmin = m40_f16(b + 2);
        int scale, min;
        m40_k_scale_min(b + 4, 2 * (u / 2), scale, min);
        w.scale_low = d * float(scale);
        w.min_low = dmin * float(min);
        m40_k_scale_min(b + 4, 2 * (u / 2) + 1, scale, min);
        w.scale_high = d * float(scale);
        w.min_high = dmin * float(min);
    }
    __device__ static void activations(M40Q8Row x, int block, int u, X &a) {
        const int sub = 8 * block + 2 * (u / 2);
        a.low = m40_q8_codes16(x, sub, u % 2);
        a.high = m40_q8_codes16(x, sub + 1, u % 2);
        const float2 lo = __ldg(x.ds + sub), hi = __ldg(x.ds + sub + 1);
        a.d_low = lo.x, a.d_sum_low = lo.y, a.d_high = hi.x, a.d_sum_high = hi.y;
    }
    // Each sub-block's minimum term is shared by its 2 units.
    __device__ static float dot(const W &w, const X &a) {
        const float low = float(m40_dp4a_16(w.q, a.low, 0));
        const float high = float(m40_dp4a_16(w.q + 4, a.high, 0));
        const float s = fmaf(w.scale_low * a.d_low, low, w.scale_high * a.d_high * high);
        return fmaf(-0.5f, fmaf(w.min_low, a.d_sum_low, w.min_high * a.d_sum_high), s);
    }
};

template <> struct GemvQ8<M40_Q4_K> : GemvQ8K<M40_Q4_K> {
    static constexpr int BYTES = 144;
    __device__ static void weights(const uint8_t *b, int u, W &w) {
        const uint4 q = *reinterpret_cast<const uint4 *>(b + 16 + 16 * u);
        const uint32_t words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int k = 0; k < 4; k++) {
            w.q[k] = int(words[k] & 0x0F0F0F0Fu);
            w.q[4 + k] = int((words[k] >> 4) & 0x0F0F0F0Fu);
        }
        scales(b, u, w);
    }
};

template <> struct GemvQ8<M40_Q5_K> : GemvQ8K<M40_Q5_K> {
    static constexpr int BYTES = 176;
    __device__ static void weights(const uint8_t *b, int u, W &w) {
        m40_q5k_codes(b, u, reinterpret_cast<uint32_t *>(w.q));
        scales(b, u, w);
    }
};

// Q6_K: unit u (of 8): half h = u / 4, l = 8 (u % 4); group g is values
// 128h + 32g + l + 0..7, whose low nibbles come from ql bytes 64h + l (g
// even) or 64h + 32 + l (g odd), low (g < 2) or high half, and high bits
// from qh bytes 32h + l at bits 2g; each group lies in its own activation
// block and under its own 8-bit scale. Codes are q − 32: the activations
// carry 32·Σcodes per group, taken out inside the dp4a.
template <> struct GemvQ8<M40_Q6_K> {
    static constexpr int VALUES = 256, BYTES = 210, UNITS = 8;
    static constexpr bool DIRECT = false;
    struct W {
        int q[4][2], scale[4];
        float d;
    };
    struct X {
        int2 q[4];
        int offset[4];
        float d[4];
    };
    __device__ static void weights(const uint8_t *b, int u, W &w) {
        const int h = u / 4, l = 8 * (u % 4);
        m40_q6k_codes(b, u, reinterpret_cast<uint32_t *>(w.q));
#pragma unroll
        for (int g = 0; g < 4; g++) w.scale[g] = int8_t(b[192 + 8 * h + 2 * g + l / 16]);
        w.d = m40_f16(b + 208);
    }
    __device__ static void activations(M40Q8Row x, int block, int u, X &a) {
        const int h = u / 4, l = 8 * (u % 4);
#pragma unroll
        for (int g = 0; g < 4; g++) {
            const int sub = 8 * block + 4 * h + g;
            a.q[g] = m40_q8_words2(x.qs + 32 * sub + l);
            a.offset[g] = -m40_dp4a(0x20202020, a.q[g].x, m40_dp4a(0x20202020, a.q[g].y, 0));
            a.d[g] = __ldg(&x.ds[sub].x);
        }
    }
    __device__ static float dot(const W &w, const X &a) {
        float s = 0.0f;
#pragma unroll
        for (int g = 0; g < 4; g++) {
            const int codes = m40_dp4a(w.q[g][0], a.q[g].x, m40_dp4a(w.q[g][1], a.q[g].y, a.offset[g]));
            s = fmaf(a.d[g], float(w.scale[g] * codes), s);
        }
        return w.d * s;
    }
};

// Whether G is one of the integer path's formats.
template <class G> constexpr bool m40_integer = false;
template <int T> constexpr bool m40_integer<GemvQ8<T>> = true;

// ---- the scaled path (the M40's) ----
// Where the GPU has no dp4a (sm_52–sm_60), the formats of the integer path
// multiply in FP32 on activations scaled beforehand (scaled.cuh): each
// weight's code is masked out of its quant word in place, a denormal, and
// multiplied by its scaled activation, one LOP and one FFMA a weight; code
// offsets and minimums come off per block through the rows' sums of 8
// values. A unit is 32 weights as on the integer path (the same staged
// chunks, lane i taking unit i); the activations are FP32, 4 bytes a value
// (plus a sum per 8) through the read-only cache, each load serving the
// warp's R rows. Same interface as GemvQ8: `weights` reads a unit's quant
// words and scales (W), `activations` its scaled values and sums (X),
// `dot` the unit's share of a row's dot product, times 2^−64.
template <int TYPE> struct GemvScaled;

// The 32 scaled activations of a block (or sub-block) and its four sums.
struct M40Scaled32 {
    float4 v[8];  // values 4k..4k+3 in v[k]
    float sum;    // Σ of the 32 values, times 2^−64
};

__device__ __forceinline__ void m40_scaled32(M40ScaledRow x, int block, M40Scaled32 &a) {
    const float4 *v = m40_scaled_block(x.x, block);
#pragma unroll
    for (int k = 0; k < 8; k++) a.v[k] = __ldg(v + 32 * k);
    const float4 s = __ldg(reinterpret_cast<const float4 *>(x.sums) + block);
    a.sum = (s.x + s.y) + (s.z + s.w);
}

// A nibble of fifth bits at bit 4 of bytes 0..3: the nibble (bits 0..3;
// for the high one, bits 4..7 where they lie, 16 times the nibble) times
// 2^4 + 2^11 + 2^18 + 2^25, whose four shifted copies never overlap (no
// carries). Each copy's other bits land in a byte's bits 0..3 or 5..7,
// which m40_nibbles_with_bit4 and the code masks leave out; the top byte's
// bits 29..31 stay clear.
__device__ __forceinline__ uint32_t m40_fifth_bits_at_4(uint32_t low_nibble) { return low_nibble * 0x02040810u; }
__device__ __forceinline__ uint32_t m40_high_fifth_bits_at_4(uint32_t high_nibble) {
    return high_nibble * 0x00204081u;
}

// Q4_0 / Q4_1 / Q5_0 / Q5_1 (NibbleBlock, quant.cuh): a unit is a whole
// block. Without fifth bits the nibbles are masked straight out of the
// quant words (the high nibbles' sum comes out 16 times too large); with
// them each word's codes are put together a byte each first, the fifth
// bits read a byte (eight values) at a time.
template <class L> struct GemvScaledNibbles {
    static constexpr int VALUES = 32, BYTES = L::BYTES, UNITS = 1;
    static constexpr bool DIRECT = false;
    struct W {
        uint32_t q[8];  // quant words 0..3; with fifth bits, the codes of values 4k.. (k = 0..7), bits 5..7 of a byte stray
        float d, m;
    };
    using X = M40Scaled32;
    __device__ static void weights(const uint8_t *b, int, W &w) {
        L::quant_words(b, w.q);
        if (L::FIFTH) {
            // Fifth-bit byte m: values 8m..8m+3 in its low nibble, 8m+4.. in its high.
            uint32_t fifth[8];
#pragma unroll
            for (int m = 0; m < 4; m++) {
                const uint32_t bits = b[L::FIFTH_AT + m];
                fifth[2 * m] = m40_fifth_bits_at_4(bits & 0x0Fu);
                fifth[2 * m + 1] = m40_high_fifth_bits_at_4(bits & 0xF0u);
            }
            // Quant word k: values 4k.. in its low nibbles, 16 + 4k.. in its high.
#pragma unroll
            for (int k = 3; k >= 0; k--) {
                w.q[4 + k] = m40_nibbles_with_bit4(w.q[k] >> 4, fifth[4 + k]);
                w.q[k] = m40_nibbles_with_bit4(w.q[k], fifth[k]);
            }
        }
        w.d = m40_f16(b);
        w.m = L::MIN ? m40_f16(b + 2) : 0.0f;
    }
    __device__ static void activations(M40ScaledRow x, int block, int, X &a) { m40_scaled32(x, block, a); }
    __device__ static float dot(const W &w, const X &a) {
        float s = 0.0f;
        if (L::FIFTH) {
            M40CodeSums<0, 5> sums;
#pragma unroll
            for (int k = 0; k < 8; k++) sums.add(w.q[k], a.v[k]);
            s = sums.total();
        } else {
            float hi = 0.0f;
#pragma unroll
            for (int k = 0; k < 4; k++) m40_scaled_nibbles8(w.q[k], a.v[k], a.v[4 + k], s, hi);
            s = fmaf(hi, 0.0625f, s);
        }
        if (L::MIN) return fmaf(w.d, s, w.m * a.sum);
        return w.d * fmaf(-float(L::ZERO), a.sum, s);
    }
};

template <> struct GemvScaled<M40_Q4_0> : GemvScaledNibbles<NibbleBlock<M40_Q4_0>> {};
template <> struct GemvScaled<M40_Q4_1> : GemvScaledNibbles<NibbleBlock<M40_Q4_1>> {};
template <> struct GemvScaled<M40_Q5_0> : GemvScaledNibbles<NibbleBlock<M40_Q5_0>> {};
template <> struct GemvScaled<M40_Q5_1> : GemvScaledNibbles<NibbleBlock<M40_Q5_1>> {};

// Q8_0: a unit is a whole block; flipping each byte's sign bit makes the
// int8 q the code q + 128.
template <> struct GemvScaled<M40_Q8_0> {
    static constexpr int VALUES = 32, BYTES = 34, UNITS = 1;
    static constexpr bool DIRECT = false;
    struct W {
        uint32_t q[8];
        float d;
    };
    using X = M40Scaled32;
    __device__ static void weights(const uint8_t *b, int, W &w) {
        m40_words<8, 2>(b + 2, w.q);
#pragma unroll
        for (int k = 0; k < 8; k++) w.q[k] ^= 0x80808080u;
        w.d = m40_f16(b);
    }
    __device__ static void activations(M40ScaledRow x, int block, int, X &a) { m40_scaled32(x, block, a); }
    __device__ static float dot(const W &w, const X &a) {
        float s = 0.0f, t = 0.0f;
#pragma unroll
        for (int k = 0; k < 8; k += 2) {
            s = m40_scaled_bytes4(w.q[k], a.v[k], s);
            t = m40_scaled_bytes4(w.q[k + 1], a.v[k + 1], t);
        }
        return w.d * fmaf(-128.0f, a.sum, s + t);
    }
};

// The 6-bit scales and minimums of sub-blocks 2c and 2c + 1 of a Q4_K or
// Q5_K block, as d · scale and dmin · min (scale_high divided by 16 where
// the high nibbles' sums come out 16 times too large). Branch-free: c
// differs between a warp's lanes.
__device__ __forceinline__ void m40_k_scales_pair(const uint8_t *b, int c, float high_factor, float &scale_low,
                                                  float &min_low, float &scale_high, float &min_high) {
    // Staged K blocks are 16-byte aligned (a row is whole 16-byte vectors).
    const uint32_t *words = reinterpret_cast<const uint32_t *>(b);
    const uint32_t dm = words[0], lo = words[1], mid = words[2], hi = words[3];
    const bool first = c < 2;
    const uint32_t scales = first ? lo & 0x3F3F3F3Fu : (hi & 0x0F0F0F0Fu) | ((lo >> 2) & 0x30303030u);
    const uint32_t mins = first ? mid & 0x3F3F3F3Fu : ((hi >> 4) & 0x0F0F0F0Fu) | ((mid >> 2) & 0x30303030u);
    const int k = 2 * (c & 1);
    const float d = m40_half_bits(uint16_t(dm)), dmin = m40_half_bits(uint16_t(dm >> 16));
    scale_low = d * (m40_byte_magic(scales, k) - M40_MAGIC_F);
    scale_high = d * high_factor * (m40_byte_magic(scales, k + 1) - M40_MAGIC_F);
    min_low = dmin * (m40_byte_magic(mins, k) - M40_MAGIC_F);
    min_high = dmin * (m40_byte_magic(mins, k + 1) - M40_MAGIC_F);
}

// Q4_K / Q5_K: unit u (of 8) is quant bytes 16u..16u+15 of the 128 as on
// the integer path (c = u / 2, h = u % 2): the low nibbles are values
// 16h..16h+15 of sub-block 2c, the high nibbles those of 2c + 1. A format
// sums the unit's low and high codes times their activations (`codes`);
// the scales and minimums are the same for both.
template <class K> struct GemvScaledK {
    static constexpr int VALUES = 256, UNITS = 8;
    static constexpr bool DIRECT = false;
    struct W {
        typename K::Codes q;
        float scale_low, min_low, scale_high, min_high;
    };
    struct X {
        float4 low[4], high[4];
        float sum_low, sum_high;
    };
    __device__ static void weights(const uint8_t *b, int u, W &w) {
        K::codes(b, u, w.q);
        m40_k_scales_pair(b, u / 2, K::HIGH_FACTOR, w.scale_low, w.min_low, w.scale_high, w.min_high);
    }
    __device__ static void activations(M40ScaledRow x, int block, int u, X &a) {
        const int first = 256 * block + 64 * (u / 2) + 16 * (u % 2);
        // Sub-block 2c + 1 is the tile's next block (2c is even).
        const float4 *low = m40_scaled_block(x.x, first / 32) + 32 * 4 * (u % 2);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            a.low[k] = __ldg(low + 32 * k);
            a.high[k] = __ldg(low + 32 * k + 1);
        }
        const float2 lo = __ldg(reinterpret_cast<const float2 *>(x.sums + first / 8));
        const float2 hi = __ldg(reinterpret_cast<const float2 *>(x.sums + first / 8 + 4));
        a.sum_low = lo.x + lo.y;
        a.sum_high = hi.x + hi.y;
    }
    __device__ static float dot(const W &w, const X &a) {
        float lo = 0.0f, hi = 0.0f;
        K::multiply(w.q, a, lo, hi);
        const float s = fmaf(w.scale_low, lo, w.scale_high * hi);
        return s - fmaf(w.min_low, a.sum_low, w.min_high * a.sum_high);
    }
};

// Q4_K: the quant words as they are, nibbles masked straight out (the high
// nibbles' sum 16 times too large, taken out of their scale).
struct M40ScaledQ4K {
    using Codes = uint4;
    static constexpr float HIGH_FACTOR = 0.0625f;
    __device__ static void codes(const uint8_t *b, int u, uint4 &q) {
        q = *reinterpret_cast<const uint4 *>(b + 16 + 16 * u);
    }
    template <class X> __device__ static void multiply(const uint4 &q, const X &a, float &lo, float &hi) {
        m40_scaled_nibbles8(q.x, a.low[0], a.high[0], lo, hi);
        m40_scaled_nibbles8(q.y, a.low[1], a.high[1], lo, hi);
        m40_scaled_nibbles8(q.z, a.low[2], a.high[2], lo, hi);
        m40_scaled_nibbles8(q.w, a.low[3], a.high[3], lo, hi);
    }
};

// Q5_K: the codes with their fifth bits, a byte each, as m40_q5k_codes
// lays them out but for the high nibbles' codes, which lie one bit up
// (bits 1..5, twice the code: HIGH_FACTOR). Sub-block s's fifth bits are
// bit s of each high-bit byte: rotating the word left by 4 − 2c (mod 32:
// what wraps around lands in bits the codes leave out) brings sub-block
// 2c's to bit 4, where the low nibbles' codes want it, and 2c + 1's to bit
// 5, where the high nibbles' want it: one funnel shift for both, whatever
// the lane's c; bits between the codes stray.
struct M40ScaledQ5K {
    struct Codes {
        uint32_t q[8];  // sub-block 2c's values, then 2c + 1's
    };
    static constexpr float HIGH_FACTOR = 0.5f;
    __device__ static void codes(const uint8_t *b, int u, Codes &c) {
        const uint4 q = *reinterpret_cast<const uint4 *>(b + 48 + 16 * u);
        const uint4 h = *reinterpret_cast<const uint4 *>(b + 16 + 16 * (u % 2));
        const uint32_t words[4] = {q.x, q.y, q.z, q.w}, high_bits[4] = {h.x, h.y, h.z, h.w};
        const int turn = (4 - 2 * (u / 2)) & 31;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const uint32_t fifth = __funnelshift_l(high_bits[k], high_bits[k], turn);
            c.q[k] = m40_nibbles_with_bit4(words[k], fifth);
            c.q[4 + k] = m40_select_bits<0x1E1E1E1Eu>(words[k] >> 3, fifth);
        }
    }
    template <class X> __device__ static void multiply(const Codes &c, const X &a, float &lo, float &hi) {
        M40CodeSums<0, 5> low;
        M40CodeSums<1, 5> high;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            low.add(c.q[k], a.low[k]);
            high.add(c.q[4 + k], a.high[k]);
        }
        lo += low.total();
        hi += high.total();
    }
};

template <> struct GemvScaled<M40_Q4_K> : GemvScaledK<M40ScaledQ4K> {
    static constexpr int BYTES = 144;
};
template <> struct GemvScaled<M40_Q5_K> : GemvScaledK<M40ScaledQ5K> {
    static constexpr int BYTES = 176;
};

// Q6_K: unit u (of 8) as on the integer path: half h = u / 4, l = 8 (u % 4);
// group g is values 128h + 32g + l + 0..7, its codes (q + 32, 6 bits) a byte
// each, under its own 8-bit scale.
template <> struct GemvScaled<M40_Q6_K> {
    static constexpr int VALUES = 256, BYTES = 210, UNITS = 8;
    static constexpr bool DIRECT = false;
    struct W {
        uint32_t q[4][2];
        float scale[4];  // d · the group's scale
    };
    struct X {
        float4 v[4][2];
        float sum[4];  // 32 · Σ of the group's 8 values, times 2^−64
    };
    __device__ static void weights(const uint8_t *b, int u, W &w) {
        const int h = u / 4, l = 8 * (u % 4);
        // The codes as m40_q6k_codes lays them out, bits 6..7 of a byte
        // stray: group g's high bits (bits 2g, 2g + 1 of each qh byte)
        // brought to bits 4..5 by one shift, or none.
#pragma unroll
        for (int k = 0; k < 2; k++) {
            const uint32_t ql0 = m40_u32_2(b + 64 * h + l + 4 * k), ql1 = m40_u32_2(b + 64 * h + 32 + l + 4 * k);
            const uint32_t qh = m40_u32_2(b + 128 + 32 * h + l + 4 * k);
            w.q[0][k] = m40_nibbles_with_bit4(ql0, qh << 4);
            w.q[1][k] = m40_nibbles_with_bit4(ql1, qh << 2);
            w.q[2][k] = m40_nibbles_with_bit4(ql0 >> 4, qh);
            w.q[3][k] = m40_nibbles_with_bit4(ql1 >> 4, qh >> 2);
        }
        const float d = m40_f16(b + 208);
        // The int8 scale s as a float: s ^ 0x80 is s + 128 in the mantissa of 2^23.
#pragma unroll
        for (int g = 0; g < 4; g++) {
            const uint32_t s = b[192 + 8 * h + 2 * g + l / 16];
            w.scale[g] = d * (__uint_as_float(s ^ (M40_MAGIC | 0x80u)) - (M40_MAGIC_F + 128.0f));
        }
    }
    __device__ static void activations(M40ScaledRow x, int block, int u, X &a) {
        const int first = 256 * block + 128 * (u / 4) + 8 * (u % 4);
        // Group g's values are block first / 32 + g's, in the same tile.
        const float4 *v = m40_scaled_block(x.x, first / 32) + 32 * 2 * (u % 4);
#pragma unroll
        for (int g = 0; g < 4; g++) {
            a.v[g][0] = __ldg(v + g);
            a.v[g][1] = __ldg(v + g + 32);
            a.sum[g] = 32.0f * __ldg(x.sums + (first + 32 * g) / 8);
        }
    }
    __device__ static float dot(const W &w, const X &a) {
        float s = 0.0f;
#pragma unroll
        for (int g = 0; g < 4; g++) {
            M40CodeSums<0, 6> codes(-a.sum[g]);
            codes.add(w.q[g][0], a.v[g][0]);
            codes.add(w.q[g][1], a.v[g][1]);
            s = fmaf(w.scale[g], codes.total(), s);
        }
        return s;
    }
};

// Whether G is one of the scaled path's formats, or either prepared path's.
template <class G> constexpr bool m40_scaled = false;
template <int T> constexpr bool m40_scaled<GemvScaled<T>> = true;
template <class G> constexpr bool m40_prepared = m40_integer<G> || m40_scaled<G>;

// Row t of the prepared activations as G reads them.
template <class G> __device__ __forceinline__ auto m40_prepared_row(const int8_t *scratch, int cols, int n_x, int t) {
    if constexpr (m40_integer<G>)
        return m40_q8_row(scratch, cols, n_x, t);
    else
        return m40_scaled_row(scratch, cols, n_x, t);
}

// Whether the staged formats' weights are loaded as a stream (ld.global.cs:
// evicted first from L1 and L2) rather than through L2 only
// (ld.global.cg); the direct formats (F32, F16, BF16) stream. Streaming
// measured faster on the H100 for F16 and Q4_K on the integer path, and
// slower for Q8_0 and llama-7b Q4_0 (the cause is not known); the formats
// not measured keep cg.
template <class G> constexpr bool m40_streamed_weights = false;
template <> constexpr bool m40_streamed_weights<GemvQ8<M40_Q4_K>> = true;

// ---- the kernel ----

// Matrix m of a launch, chosen without indexing the parameter array at run
// time (which would copy the parameters to local memory).
__device__ __forceinline__ const M40GemvMatrix &m40_matrix(const M40Gemv &p, int m) {
    return m == 0 ? p.m[0] : m == 1 ? p.m[1] : p.m[2];
}

// 1 / rms of each of the n_x activation rows, into inv_rms (all threads
// of the block take part): the batched kernels' norm prologue.
__device__ void m40_gemv_inverse_rms(const M40Gemv &p, const float *x, int n_x, float *inv_rms) {
    __shared__ float partial[M40_GEMV_WARPS][M40_GEMV_MAX_X];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    for (int t = 0; t < n_x; t++) {
        const float4 *row = reinterpret_cast<const float4 *>(x + size_t(t) * p.cols);
        float sum = 0.0f;
        for (int i = threadIdx.x; i < p.cols / 4; i += blockDim.x) {
            const float4 a = __ldg(row + i);
            sum += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
        }
        sum = m40_warp_sum(sum);
        if (lane == 0) partial[warp][t] = sum;
    }
    __syncthreads();
    if (threadIdx.x < n_x) {
        float sum = 0.0f;
#pragma unroll
        for (int w = 0; w < M40_GEMV_WARPS; w++) sum += partial[w][threadIdx.x];
        inv_rms[threadIdx.x] = 1.0f / sqrtf(sum / float(p.cols) + p.eps);
    }
    __syncthreads();
}

// The rows of one warp's row group: matrix, row and weights of each (rows
// past the end read row 0 and are not written).
template <int R> struct M40RowGroup {
    const uint8_t *w[R];
    int mat[R], row[R];
    bool valid[R];
};

// The weights of a launch's matrices for the block (expert 0's, or those
// of its work piece's expert).
struct M40Matrices {
    const uint8_t *w[3];
    __device__ const uint8_t *operator[](int m) const { return m == 0 ? w[0] : m == 1 ? w[1] : w[2]; }
};

template <int R>
__device__ __forceinline__ void m40_row_group(const M40Gemv &p, bool glu, int group, size_t row_bytes,
                                              const M40Matrices &w, M40RowGroup<R> &g) {
#pragma unroll
    for (int j = 0; j < R; j++) {
        if (glu) {
            g.mat[j] = j / (R / 2);
            g.row[j] = group * (R / 2) + j % (R / 2);
            g.valid[j] = g.row[j] < p.m[0].rows;
        } else {
            int s = group * R + j, m = 0;
            while (m + 1 < p.n_matrices && s >= m40_matrix(p, m).rows) s -= m40_matrix(p, m++).rows;
            g.mat[j] = m;
            g.row[j] = s;
            g.valid[j] = s < m40_matrix(p, m).rows;
        }
        if (!g.valid[j]) g.row[j] = 0;
        g.w[j] = w[g.mat[j]] + g.row[j] * row_bytes;
    }
}

// A row group's rows as the staged loop streams them (m40_gemv_body).
template <int R> struct M40RowStream {
    const uint4 *next[R];  // this lane's first load of the row's next chunk
    int misalignment[R];   // the row's first block's offset in its first 16-byte vector
};

// Blocks per staged chunk: about CHUNK_ROW_BYTES of each row, in whole
// rounds of a row group's LANES lanes (each lane takes one unit per round).
template <class G, int CHUNK_ROW_BYTES, int LANES = 32> __host__ __device__ constexpr int m40_chunk_blocks() {
    constexpr int round = G::UNITS >= LANES ? 1 : LANES / G::UNITS;
    constexpr int blocks = CHUNK_ROW_BYTES / G::BYTES / round * round;
    return blocks < round ? round : blocks;
}

// NX: activation rows the kernel is built for: 1 (one session's decode,
// straight-line code) or M40_GEMV_MAX_X (any n_x up to it). NORM: x is
// RMS-normalized on the fly (x · norm weights as it is loaded, each dot
// product times 1/rms at the end). CHUNK_ROW_BYTES: bytes of each row staged
// per chunk (formats read through shared memory).
//
// Activations are read through the read-only cache rather than staged per
// block: every block of an SM shares that copy, where staging would read x
// from L2 once per block (as many bytes as the weights of a small matrix).
// Blocks loop over warp-sized row groups, so a prologue runs once per
// block.
//
// SPLIT: the block's warps share each row group, warp w taking the w-th
// quarter of the columns, and their sums meet in shared memory — where a
// matrix has too few row groups for the warps (m40_gemv_split).
// A template parameter rather than an argument: as an argument it made the
// kernels that do not split slower (more registers, run-time column bounds).
//
// LANES: lanes a row group takes, 32 or 16. At 16 each half of a warp
// walks a row group of its own (the warp's item is two consecutive groups),
// for rows of 16 units or fewer, which would leave half of a warp's lanes
// without a unit (a mixture of experts' down rows of 512 values): the
// warp's loads, reductions and stores then serve twice the rows.
template <class G, int R, int NX, bool NORM, int CHUNK_ROW_BYTES, bool SPLIT, int LANES>
__device__ __forceinline__ void m40_gemv_body(const M40Gemv &p) {
    static_assert(LANES == 32 || (LANES == 16 && NX == 1 && !SPLIT), "half-warp row groups: one session, no split");
    constexpr int HALVES = 32 / LANES;
    const int warp = threadIdx.x / 32, half = threadIdx.x % 32 / LANES, lane = threadIdx.x % LANES;
    const int cols = p.cols;
    int n_x = NX == 1 ? 1 : p.n_x;
    // An expert product: this block's slice of the grid takes one work
    // piece, whose expert (and so whose weights) the routing kernel chose.
    M40Matrices matrices = {{p.m[0].w, p.m[1].w, p.m[2].w}};
    int x_row0 = 0, y_row0 = 0, q8_rows = n_x;
    // The work piece's expert, whose row of each bias table the epilogue
    // adds (−1: a plain product, the matrices' own biases).
    int piece_expert = -1;
    if (p.experts.work) {
        m40_wait_for_prior_kernels();
        const M40ExpertWork work = p.experts.work[blockIdx.y];
        if (work.count == 0) return;
#pragma unroll
        for (int m = 0; m < 3; m++)
            if (m < p.n_matrices) matrices.w[m] = m40_expert_matrix(p.experts, p.m[m].w, m, work.expert);
        piece_expert = work.expert;
        y_row0 = work.first;
        x_row0 = p.experts.x_shared ? 0 : work.first;
        if (NX > 1) n_x = work.count;
        q8_rows = p.experts.x_rows;
    }
    const float *x = p.x + size_t(x_row0) * cols;
    // Matrix m's bias for the block, found in the epilogue: only the expert
    // index stays live through the loop.
    const auto bias_of = [&](int m) {
        const float *bias = m40_matrix(p, m).bias;
        return piece_expert < 0 ? bias : m40_expert_bias(p.experts, bias, piece_expert);
    };
    const bool glu = p.epilogue >= M40_GEMV_GLU_SILU;
    const int rows_per_warp = glu ? R / 2 : R;
    int total_rows = p.m[0].rows;
    if (!glu) total_rows += p.m[1].rows + p.m[2].rows;
    // A warp's items are HALVES row groups each, half h taking the
    // item's h-th (a group past the end has no valid rows).
    const int n_groups = (total_rows + rows_per_warp - 1) / rows_per_warp;
    const int n_items = (n_groups + HALVES - 1) / HALVES;
    const int first_item = SPLIT ? blockIdx.x : blockIdx.x * M40_GEMV_WARPS + warp;
    const int item_stride = SPLIT ? gridDim.x : gridDim.x * M40_GEMV_WARPS;
    const auto group_of = [&](int item) { return item * HALVES + half; };

    // With overlapping launches, everything a prior kernel writes (x, x_q8,
    // the outputs) is touched only after the wait; the weights, which
    // nothing writes, may be loaded before. The products do not let their
    // successor start early: its blocks would wait beside theirs, which
    // measured slower on the H100, most of all for batches of sessions; the
    // successor still starts as their blocks exit. Letting it start at each
    // warp's last chunk gains nothing where a quantize launch follows the
    // product (that launch already lets the next product start early), and
    // on the integer path one follows every product but Q/K/V and the
    // output.
    //
    // One session's kernels sum the norm's x² from the x values that their
    // first row group loads anyway (a row group reads every column once: a
    // warp's own, or with SPLIT its block's four warps together), rather
    // than in a prologue that reads x once more between the wait and the
    // first weight. The batched kernels keep the prologue: eight rows'
    // sums live through the loop would cost them registers on sm_90 and
    // spills on sm_52.
    constexpr bool RMS_INLINE = NORM && NX == 1;
    __shared__ float inv_rms[M40_GEMV_MAX_X];
    const auto inputs_ready = [&] {
        m40_wait_for_prior_kernels();
        if (NORM && !RMS_INLINE) m40_gemv_inverse_rms(p, x, n_x, inv_rms);
    };
    bool measuring = RMS_INLINE;  // the first row group, summing x²
    float sum_squares = 0.0f, inline_inv_rms = 1.0f;

    const int n_blocks = cols / G::VALUES;
    const size_t row_bytes = size_t(n_blocks) * G::BYTES;
    // This warp's blocks of each row: [block_begin, block_end).
    const int parts = SPLIT ? M40_GEMV_WARPS : 1, part = SPLIT ? warp : 0;
    const int block_begin = part * n_blocks / parts, block_end = (part + 1) * n_blocks / parts;

    float acc[R][NX];
    const auto clear = [&] {
#pragma unroll
        for (int j = 0; j < R; j++)
#pragma unroll
            for (int t = 0; t < NX; t++) acc[j][t] = 0.0f;
    };

    // Unit `u` of block `block` (of the row) for every row, its weights
    // read from `blocks[j]` (global memory or the staged chunk), times the
    // activations: loads first, then math.
    const auto step = [&](const uint8_t *const *blocks, int block, int u) {
        if constexpr (m40_prepared<G>) {
            typename G::W w[R];
#pragma unroll
            for (int j = 0; j < R; j++) G::weights(blocks[j], u, w[j]);
#pragma unroll
            for (int t = 0; t < NX; t++) {
                if (NX > 1 && t >= n_x) break;
                typename G::X a;
                G::activations(m40_prepared_row<G>(p.x_q8, cols, q8_rows, x_row0 + t), block, u, a);
#pragma unroll
                for (int j = 0; j < R; j++) acc[j][t] += G::dot(w[j], a);
            }
        } else {
            constexpr int GROUPS = G::UNIT / 4;
            float v[R][G::UNIT], sc[R][GROUPS], of[R][GROUPS];
#pragma unroll
            for (int j = 0; j < R; j++) G::unit(blocks[j], u, v[j], sc[j], of[j]);
            const float *xb = x + size_t(block) * G::VALUES;
            float4 nw[GROUPS];
            if (NORM) {
#pragma unroll
                for (int g = 0; g < GROUPS; g++)
                    nw[g] = __ldg(reinterpret_cast<const float4 *>(p.norm + size_t(block) * G::VALUES + G::pos(u, g)));
            }
#pragma unroll
            for (int t = 0; t < NX; t++) {
                if (NX > 1 && t >= n_x) break;
                float xv[G::UNIT];
#pragma unroll
                for (int g = 0; g < GROUPS; g++) {
                    float4 a = __ldg(reinterpret_cast<const float4 *>(xb + size_t(t) * cols + G::pos(u, g)));
                    if (RMS_INLINE && measuring)
                        sum_squares = fmaf(a.x, a.x, fmaf(a.y, a.y, fmaf(a.z, a.z, fmaf(a.w, a.w, sum_squares))));
                    if (NORM) a = make_float4(a.x * nw[g].x, a.y * nw[g].y, a.z * nw[g].z, a.w * nw[g].w);
                    xv[4 * g] = a.x, xv[4 * g + 1] = a.y, xv[4 * g + 2] = a.z, xv[4 * g + 3] = a.w;
                }
#pragma unroll
                for (int j = 0; j < R; j++) {
                    float s = 0.0f;
                    constexpr int RUNS = G::SCALES > 0 ? G::SCALES : 1, RUN = GROUPS / RUNS;
#pragma unroll
                    for (int k = 0; k < RUNS; k++) {
                        float dot = 0.0f, sum = 0.0f;
#pragma unroll
                        for (int g = k * RUN; g < (k + 1) * RUN; g++) {
                            const float *vg = v[j] + 4 * g, *xg = xv + 4 * g;
                            dot = fmaf(vg[0], xg[0], fmaf(vg[1], xg[1], fmaf(vg[2], xg[2], fmaf(vg[3], xg[3], dot))));
                            if (G::OFFSET) sum += xg[0] + xg[1] + xg[2] + xg[3];
                        }
                        s = G::SCALES > 0 ? fmaf(dot, sc[j][k * RUN], s) : s + dot;
                        if (G::OFFSET) s = fmaf(sum, of[j][k * RUN], s);
                    }
                    acc[j][t] += s;
                }
            }
        }
    };

    // The row group's sums, reduced across its lanes, through the
    // epilogue; lane t (of the group's) writes activation row t's results.
    const auto finish = [&](const M40RowGroup<R> &g) {
#pragma unroll
        for (int j = 0; j < R; j++)
#pragma unroll
            for (int t = 0; t < NX; t++)
                if (t < n_x)
                    acc[j][t] = m40_warp_sum<LANES>(acc[j][t]) * (NORM && !RMS_INLINE ? inv_rms[t] : 1.0f) *
                                (m40_scaled<G> ? M40_SCALED_RESULT : 1.0f);
        if (RMS_INLINE && measuring) sum_squares = m40_warp_sum<LANES>(sum_squares);
        if constexpr (SPLIT) {
            __shared__ float partial[M40_GEMV_WARPS][R][NX];
            __shared__ float partial_squares[M40_GEMV_WARPS];
            __syncthreads();  // the previous group's sums have been read
            if (lane == 0) {
#pragma unroll
                for (int j = 0; j < R; j++)
#pragma unroll
                    for (int t = 0; t < NX; t++) partial[warp][j][t] = acc[j][t];
                if (RMS_INLINE && measuring) partial_squares[warp] = sum_squares;
            }
            __syncthreads();
            if (warp != 0) {
                measuring = false;  // warp 0 scales the block's sums
                return;
            }
#pragma unroll
            for (int j = 0; j < R; j++)
#pragma unroll
                for (int t = 0; t < NX; t++) {
                    acc[j][t] = partial[0][j][t];
#pragma unroll
                    for (int w = 1; w < M40_GEMV_WARPS; w++) acc[j][t] += partial[w][j][t];
                }
            if (RMS_INLINE && measuring) {
                sum_squares = partial_squares[0];
#pragma unroll
                for (int w = 1; w < M40_GEMV_WARPS; w++) sum_squares += partial_squares[w];
            }
        }
        if (RMS_INLINE) {
            if (measuring) {
                inline_inv_rms = 1.0f / sqrtf(sum_squares / float(cols) + p.eps);
                measuring = false;
            }
#pragma unroll
            for (int j = 0; j < R; j++) acc[j][0] *= inline_inv_rms;
        }
        // Lane t writes activation row t's results, its sums picked by
        // selects: indexing acc by the lane would move it to local memory.
        const int t = lane;
        if (t >= n_x) return;
        float sums[R];
#pragma unroll
        for (int j = 0; j < R; j++) {
            sums[j] = acc[j][0];
#pragma unroll
            for (int k = 1; k < NX; k++)
                if (t == k) sums[j] = acc[j][k];
        }
        if (glu) {
#pragma unroll
            for (int j = 0; j < R / 2; j++) {
                if (!g.valid[j]) continue;
                const M40GemvMatrix &gm = p.m[0];
                const float *gate_bias = bias_of(0), *up_bias = bias_of(1);
                const float gate = sums[j] + (gate_bias ? gate_bias[g.row[j]] : 0.0f);
                const float up = sums[j + R / 2] + (up_bias ? up_bias[g.row[j]] : 0.0f);
                gm.y[size_t(y_row0 + t) * gm.rows + g.row[j]] = m40_gated(p.epilogue - M40_GEMV_GLU_SILU, gate, up);
            }
        } else if (p.attention.rows) {
            // RoPE pairs are adjacent rows of one matrix: every height is
            // even (m40_gemv checks), and so are R and each matrix's first row.
#pragma unroll
            for (int j = 0; j < R; j += 2) {
                if (!g.valid[j]) continue;
                const M40GemvMatrix &m = m40_matrix(p, g.mat[j]);
                const float *bias = bias_of(g.mat[j]);
                const int row = g.row[j];
                const float x0 = sums[j] + (bias ? bias[row] : 0.0f);
                const float x1 = sums[j + 1] + (bias ? bias[row + 1] : 0.0f);
                float *out = m.y + size_t(t) * m.rows;
                if (m.role == M40_PLAIN_OUTPUT) {
                    out[row] = x0;
                    out[row + 1] = x1;
                } else {
                    m40_attention_input_pair(p.attention, m.role, t, row, x0, x1, out);
                }
            }
        } else {
#pragma unroll
            for (int j = 0; j < R; j++) {
                if (!g.valid[j]) continue;
                const M40GemvMatrix &m = m40_matrix(p, g.mat[j]);
                const float *bias = bias_of(g.mat[j]);
                const float value = sums[j] + (bias ? bias[g.row[j]] : 0.0f);
                float *out = m.y + size_t(y_row0 + t) * m.rows + g.row[j];
                *out = p.epilogue == M40_GEMV_ACCUMULATE ? *out + value : value;
            }
        }
    };

    if constexpr (G::DIRECT) {
        // Several units per lane per round: without branches between them
        // the compiler issues all their loads before the first use.
        constexpr int UNROLL = 4;
        const int units = block_end * G::UNITS;
        inputs_ready();
        for (int item = first_item; item < n_items; item += item_stride) {
            M40RowGroup<R> g;
            m40_row_group(p, glu, group_of(item), row_bytes, matrices, g);
            clear();
            const auto direct = [&](int i) {
                const int block = i / G::UNITS;
                const uint8_t *blocks[R];
#pragma unroll
                for (int j = 0; j < R; j++) blocks[j] = g.w[j] + size_t(block) * G::BYTES;
                step(blocks, block, i % G::UNITS);
            };
            int i = block_begin * G::UNITS + lane;
            for (; i + LANES * (UNROLL - 1) < units; i += LANES * UNROLL) {
#pragma unroll
                for (int k = 0; k < UNROLL; k++) direct(i + LANES * k);
            }
            for (; i < units; i += LANES) direct(i);
            finish(g);
        }
    } else {
        // The rows' bytes go through shared memory a chunk of CHUNK_BLOCKS
        // blocks at a time, read with 16-byte loads (the blocks of these
        // formats are only 2- or 4-byte aligned, and loads that narrow
        // cannot keep enough bytes in flight). The warp's work is one
        // sequence of (item, chunk) steps, and the next step's loads are
        // issued before this step's math, across items too: the loads
        // never stop while the warp has rows left.
        constexpr int CHUNK_BLOCKS = m40_chunk_blocks<G, CHUNK_ROW_BYTES, LANES>();
        constexpr int CHUNK_VECTORS = (CHUNK_BLOCKS * G::BYTES + 15) / 16 + 1;
        constexpr int CHUNK_VECTORS_PER_LANE = (CHUNK_VECTORS + LANES - 1) / LANES;
        constexpr int ROUNDS = CHUNK_BLOCKS * G::UNITS / LANES;
        __shared__ uint4 staged[M40_GEMV_WARPS][HALVES][R][CHUNK_VECTORS];
        const int n_chunks = (block_end - block_begin + CHUNK_BLOCKS - 1) / CHUNK_BLOCKS;

        uint4 next[R][CHUNK_VECTORS_PER_LANE];
        // The M40's kernels (the scaled path, one session, 4 rows a warp)
        // keep each row's address of this lane's next load, where a chunk
        // is a whole number of 16-byte vectors (every format's but Q6_K's)
        // and so a row's chunks share its misalignment: a chunk's loads
        // then cost a pointer step a row. Computing the chunk's address
        // from the row's, as the others do (and the last, partial chunk),
        // costs Maxwell ~20 instructions a row and chunk, half an
        // instruction a weight of Q5_0. Elsewhere the kept addresses cost
        // registers for little: the batched kernels spilled, and the
        // 2-row kernels (the H100's small products) and the integer
        // path's lost a block an SM. Offsets within a row are ints (a row
        // is far below 2 GiB): 64-bit products and differences cost more.
        constexpr int CHUNK_BYTES = CHUNK_BLOCKS * G::BYTES;
        constexpr bool WHOLE_VECTORS = m40_scaled<G> && NX == 1 && R == 4 && CHUNK_BYTES % 16 == 0;
        M40RowStream<R> stream, fetched_stream;
        const auto begin_rows = [&](const M40RowGroup<R> &g, M40RowStream<R> &s) {
            if constexpr (WHOLE_VECTORS) {
#pragma unroll
                for (int j = 0; j < R; j++) {
                    const uint8_t *start = g.w[j] + block_begin * G::BYTES;
                    s.misalignment[j] = int(uintptr_t(start) & 15);
                    s.next[j] = reinterpret_cast<const uint4 *>(start - s.misalignment[j]) + lane;
                }
            }
        };
        const auto load = [&](const uint4 *at) { return m40_streamed_weights<G> ? __ldcs(at) : __ldcg(at); };
        const auto fetch = [&](const M40RowGroup<R> &g, M40RowStream<R> &s, int chunk) {
            const int first_block = block_begin + chunk * CHUNK_BLOCKS;
            const int bytes = min(CHUNK_BLOCKS, block_end - first_block) * G::BYTES;
            if constexpr (WHOLE_VECTORS) {
                if (chunk + 1 < n_chunks) {
                    // A full chunk may read one vector more than it needs
                    // (an aligned row's): the next chunk's first, inside the row.
#pragma unroll
                    for (int j = 0; j < R; j++) {
#pragma unroll
                        for (int k = 0; k < CHUNK_VECTORS_PER_LANE; k++)
                            if (lane + LANES * k < CHUNK_VECTORS) next[j][k] = load(s.next[j] + LANES * k);
                        s.next[j] += CHUNK_BYTES / 16;
                    }
                } else {
#pragma unroll
                    for (int j = 0; j < R; j++) {
                        const int vectors = (s.misalignment[j] + bytes + 15) >> 4;
#pragma unroll
                        for (int k = 0; k < CHUNK_VECTORS_PER_LANE; k++)
                            if (lane + LANES * k < vectors) next[j][k] = load(s.next[j] + LANES * k);
                    }
                }
                return;
            }
            const int offset = first_block * G::BYTES;
#pragma unroll
            for (int j = 0; j < R; j++) {
                const uint8_t *start = g.w[j] + offset;
                const int misalignment = int(uintptr_t(start) & 15);
                const uint4 *aligned = reinterpret_cast<const uint4 *>(start - misalignment);
                const int vectors = (misalignment + bytes + 15) >> 4;
#pragma unroll
                for (int k = 0; k < CHUNK_VECTORS_PER_LANE; k++) {
                    const int index = lane + LANES * k;
                    if (index < vectors) next[j][k] = load(aligned + index);
                }
            }
        };

        int item = first_item, chunk = 0;
        M40RowGroup<R> g, fetched;
        // The first chunk's loads go out before the wait: with overlapping
        // launches they are in flight while the previous kernel finishes.
        if (item < n_items) {
            m40_row_group(p, glu, group_of(item), row_bytes, matrices, g);
            begin_rows(g, stream);
            fetch(g, stream, 0);
        }
        inputs_ready();
        if (item >= n_items) return;
        clear();
        for (;;) {
            __syncwarp();
#pragma unroll
            for (int j = 0; j < R; j++)
#pragma unroll
                for (int k = 0; k < CHUNK_VECTORS_PER_LANE; k++)
                    if (lane + LANES * k < CHUNK_VECTORS) staged[warp][half][j][lane + LANES * k] = next[j][k];
            __syncwarp();
            // What comes next: this item's next chunk, or the next item's first.
            const bool last_chunk = chunk + 1 == n_chunks;
            const int next_item = last_chunk ? item + item_stride : item;
            if (next_item < n_items) {
                if (last_chunk) {
                    m40_row_group(p, glu, group_of(next_item), row_bytes, matrices, fetched);
                    begin_rows(fetched, fetched_stream);
                    fetch(fetched, fetched_stream, 0);
                } else {
                    fetch(g, stream, chunk + 1);
                }
            }
            const int first_block = block_begin + chunk * CHUNK_BLOCKS;
            const int chunk_units = min(CHUNK_BLOCKS, block_end - first_block) * G::UNITS;
            const uint8_t *stage_base[R];
#pragma unroll
            for (int j = 0; j < R; j++) {
                const int misalignment =
                    WHOLE_VECTORS ? stream.misalignment[j] : int(uintptr_t(g.w[j] + first_block * G::BYTES) & 15);
                stage_base[j] = reinterpret_cast<const uint8_t *>(staged[warp][half][j]) + misalignment;
            }
#pragma unroll 2
            for (int k = 0; k < ROUNDS; k++) {
                const int i = lane + LANES * k;
                if (i >= chunk_units) break;
                const int block = i / G::UNITS;
                const uint8_t *blocks[R];
#pragma unroll
                for (int j = 0; j < R; j++) blocks[j] = stage_base[j] + block * G::BYTES;
                step(blocks, first_block + block, i % G::UNITS);
            }
            if (!last_chunk) {
                chunk++;
                continue;
            }
            finish(g);
            if (next_item >= n_items) break;
            clear();
            g = fetched;
            stream = fetched_stream;
            item = next_item;
            chunk = 0;
        }
    }
}

// The kernel, its body compiled only where the host may launch it: the
// integer path's for code with dp4a (sm_61+), the scaled path's for code
// without (sm_52–sm_60, the compute_52 PTX), every other path everywhere
// (m40_gemv_prepared_path).
template <class G, int R, int NX, bool NORM, int CHUNK_ROW_BYTES, bool SPLIT, int LANES>
__global__ void __launch_bounds__(32 * M40_GEMV_WARPS) gemv_kernel(M40Gemv p) {
    if constexpr (m40_integer<G> ? M40_DP4A_CODE : m40_scaled<G> ? !M40_DP4A_CODE : true)
        m40_gemv_body<G, R, NX, NORM, CHUNK_ROW_BYTES, SPLIT, LANES>(p);
}

// Resident blocks of a kernel per SM on the current device.
template <class G, int R, int NX, bool NORM, int CHUNK, bool SPLIT, int LANES = 32>
static int m40_gemv_blocks_per_sm() {
    return m40_per_device([](int) {
        int n = 0;
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, gemv_kernel<G, R, NX, NORM, CHUNK, SPLIT, LANES>,
                                                          32 * M40_GEMV_WARPS, 0) != cudaSuccess ||
            n < 1) {
            cudaGetLastError();  // a failed query leaves no error for the launch to report
            n = 1;
        }
        return n;
    });
}

// Whether one session's product on the FP32 path shares each row group
// among a block's warps (SPLIT): where the matrix has too few row groups for
// two waves of resident warps, so that the row groups keep every warp of
// the GPU busy. On the H100 neither choice wins every product of the FP32
// path, and its GPU, the M40, has 24 SMs, not 132, so the rule stays the
// simple one. The float formats split below four waves, which on the H100
// splits every llama-7b F16 product and measured fastest of 0 to 4 waves;
// the M40's F16 was not measured.
//
// The integer path never splits: a warp that owns whole rows measured
// faster on the H100 for every integer format, Q8_0's long rows included
// (its staged quants are read as whole words, m40_words).
template <class G> static bool m40_gemv_split(const M40Gemv &p, size_t groups, size_t resident_warps) {
    if (p.cols / G::VALUES < M40_GEMV_WARPS) return false;
    const size_t waves = G::DIRECT ? 4 : 2;
    return groups < waves * resident_warps;
}

// Row groups of a launch at R weight rows a warp (a GLU epilogue's warp
// takes R / 2 rows of each of its two matrices), per grid slice.
static size_t m40_gemv_groups(const M40Gemv &p, int R) {
    const bool glu = p.epilogue >= M40_GEMV_GLU_SILU;
    const int total_rows = glu ? p.m[0].rows : p.m[0].rows + p.m[1].rows + p.m[2].rows;
    const int rows_per_warp = glu ? R / 2 : R;
    return size_t((total_rows + rows_per_warp - 1) / rows_per_warp);
}

// Grid slices of a launch (one per expert work piece) and the device's SMs.
static size_t m40_gemv_slices(const M40Gemv &p) { return p.experts.work ? size_t(p.experts.n_work) : 1; }
static size_t m40_gemv_sms(const M40Gemv &p) { return size_t(p.sm_count > 0 ? p.sm_count : 1); }

// Enough blocks to fill every SM as far as the kernel's occupancy allows
// (the blocks loop over the rest).
template <class G, int R, int NX, bool NORM, int CHUNK, int LANES = 32>
static void m40_gemv_launch(const M40Gemv &p, cudaStream_t stream) {
    const size_t groups = m40_gemv_groups(p, R), sms = m40_gemv_sms(p);
    const size_t items = (groups + 32 / LANES - 1) / (32 / LANES);
    // Expert products: a slice of the grid (its y) per work piece. The
    // batched kernel's slices are as wide as their matrix needs: slices of
    // pieces the routing left empty exit at once, so the grid is not held to
    // the resident blocks (a batch's experts have few rows each, and a slice
    // with a share of the resident warps would walk its matrix a row group
    // after another). The one-row kernel's pieces (one session's, or a
    // batch's one-row pieces) all have their row, and its slices share
    // M40_GEMV_EXPERT_WAVES waves of the resident blocks: each warp then
    // takes several items, whose loads run ahead across them, rather than
    // one (8 sessions of qwen35-35b-a3b, H200: 1,038–1,042 → 1,070 tok/s).
    const bool experts = p.experts.work != nullptr;
    const size_t slices = m40_gemv_slices(p);
    const auto per_slice = [&](size_t resident) {
        if (!experts) return resident;
        if (NX > 1) return ~size_t(0);
        const size_t share = resident * M40_GEMV_EXPERT_WAVES / slices;
        return share > 0 ? share : size_t(1);
    };
    const size_t resident = size_t(m40_gemv_blocks_per_sm<G, R, NX, NORM, CHUNK, false, LANES>()) * sms;
    // The batched kernels, short of registers already, and the integer
    // path are built without the split.
    if constexpr (NX == 1 && !m40_prepared<G> && LANES == 32) {
        if (m40_gemv_split<G>(p, groups * slices, resident * M40_GEMV_WARPS)) {
            const size_t split_resident =
                per_slice(size_t(m40_gemv_blocks_per_sm<G, R, NX, NORM, CHUNK, true>()) * sms);
            m40_launch(p.overlap, gemv_kernel<G, R, NX, NORM, CHUNK, true, 32>,
                       dim3(unsigned(groups < split_resident ? groups : split_resident), unsigned(slices)),
                       32 * M40_GEMV_WARPS, stream, p);
            return;
        }
    }
    const size_t needed = (items + M40_GEMV_WARPS - 1) / M40_GEMV_WARPS, share = per_slice(resident);
    m40_launch(p.overlap, gemv_kernel<G, R, NX, NORM, CHUNK, false, LANES>,
               dim3(unsigned(needed < share ? needed : share), unsigned(slices)), 32 * M40_GEMV_WARPS, stream, p);
}

// Weight rows per warp of the batched launches (8 activation rows of
// accumulators per weight row), by format, as measured on the H100: the
// 32-value 4- and 5-bit formats gain from sharing each activation load over
// 4 rows; the others need the registers more and are faster at 2.
constexpr int m40_batch_rows(int type) {
    return type == M40_Q4_0 || type == M40_Q4_1 || type == M40_Q5_0 || type == M40_Q5_1 ? 4 : 2;
}

// Bytes of each row a warp stages per chunk in the one-session kernel, by
// format: the fastest of the sizes measured on the H100 (576 to 3072 bytes),
// on the FP32 path and again on the integer path. More bytes in flight do
// not help: the kernel is bound by its work per weight, and larger chunks
// cost registers.
constexpr int m40_chunk_row_bytes(int type) {
    return type == M40_Q4_0 || type == M40_Q4_1 || type == M40_Q5_0 || type == M40_Q5_1 ? 1152 : 576;
}

// Weight rows per warp of the one-session kernel where the caller leaves the
// choice to the format, as measured on the H100 (gemv_bench, llama-7b
// shapes): the integer Q6_K is faster at 4 rows for every product, the
// other integer formats at 2. The FP32 path takes 2; the scaled path
// chooses by the product's size (m40_scaled_rows).
template <class G, int TYPE> constexpr int m40_single_rows() { return m40_integer<G> && TYPE == M40_Q6_K ? 4 : 2; }

// Rows per warp of one session's product on the scaled path: 4, which on
// the M40 issues 10–14% fewer instructions a weight and reads half the
// activation bytes, unless its row groups at 4 rows would not make two
// waves of the kernel's resident warps, where 2 rows a warp keep twice as
// many warps streaming (a 1B model's matrices on a GPU of 132 SMs; on the
// M40's 24 every llama-1b and llama-7b matrix makes its two waves at 4).
template <class G, int TYPE, bool NORM> static int m40_scaled_rows(const M40Gemv &p) {
    constexpr int CHUNK = m40_chunk_row_bytes(TYPE);
    const size_t groups = m40_gemv_groups(p, 4) * m40_gemv_slices(p);
    const size_t resident = size_t(m40_gemv_blocks_per_sm<G, 4, 1, NORM, CHUNK, false>()) * m40_gemv_sms(p);
    return groups >= 2 * resident * M40_GEMV_WARPS ? 4 : 2;
}

// The launch of kernel G for a batch (n_x > 1) or one session.
template <class G, int TYPE, bool NORM>
static void m40_gemv_shapes(const M40Gemv &p, int rows_per_warp, cudaStream_t stream) {
    constexpr int CHUNK = m40_chunk_row_bytes(TYPE);
    if (p.n_x > 1) {
        m40_gemv_launch<G, m40_batch_rows(TYPE), M40_GEMV_MAX_X, NORM, 576>(p, stream);
        return;
    }
    if (rows_per_warp == 0)
        rows_per_warp = m40_scaled<G> ? m40_scaled_rows<G, TYPE, NORM>(p) : m40_single_rows<G, TYPE>();
    if constexpr (m40_prepared<G>) {
        // Rows of 16 units or fewer take a row group a half-warp: a
        // mixture's down rows of 512 values (8 sessions of qwen35-35b-a3b,
        // H200: 912 → 1,040 tok/s; one session 306 → 316).
        if (p.cols / G::VALUES * G::UNITS <= 16) {
            if (rows_per_warp == 4)
                m40_gemv_launch<G, 4, 1, NORM, CHUNK / 2, 16>(p, stream);
            else
                m40_gemv_launch<G, 2, 1, NORM, CHUNK / 2, 16>(p, stream);
            return;
        }
    }
    if (rows_per_warp == 4)
        m40_gemv_launch<G, 4, 1, NORM, CHUNK>(p, stream);
    else
        m40_gemv_launch<G, 2, 1, NORM, CHUNK>(p, stream);
}

// The virtual architecture (e.g. 52, 61, 90) of the code this build runs on
// the current device: the SASS compiled for it, or 52 for the compute_52 PTX
// the driver compiles for newer GPUs; 0 if the query fails.
static int m40_code_version() {
    return m40_per_device([](int) {
        cudaFuncAttributes attributes;
        if (cudaFuncGetAttributes(&attributes, prepare_activations_kernel) != cudaSuccess) {
            cudaGetLastError();
            return 0;
        }
        return attributes.ptxVersion;
    });
}

// rows_per_warp (2 or 4): weight rows per warp of the one-session kernel
// (the caller picks per GPU), or 0 for the format's own choice. GLU
// epilogues need matrices 0 (gate) and 1 (up) of equal height. The first
// n_matrices have rows, the others none. Expert products (p.experts.work)
// take n_x 1 (one session: every piece reads one x row) or up to
// M40_GEMV_MAX_X (each piece's count); where it prepares x (x_q8) the
// launch prepares all p.experts.x_rows rows.
M40_EXPORT cudaError_t m40_gemv(int type, const M40Gemv *params, int rows_per_warp, cudaStream_t stream) {
    const M40Gemv &p = *params;
    if (p.n_x < 1 || p.n_x > M40_GEMV_MAX_X || p.cols % 32 != 0 || p.n_matrices < 1 || p.n_matrices > 3 ||
        (rows_per_warp != 0 && rows_per_warp != 2 && rows_per_warp != 4))
        return cudaErrorInvalidValue;
    for (int m = 0; m < 3; m++)
        if ((m < p.n_matrices) != (p.m[m].rows > 0)) return cudaErrorInvalidValue;
    if (p.attention.rows) {
        const M40AttentionInputs &a = p.attention;
        if (p.epilogue != M40_GEMV_STORE || a.q_norm || a.k_norm || a.factors || a.neox || a.yarn.enabled ||
            a.head_dim_k < 2 ||
            a.head_dim_k > M40_MAX_HEAD_DIM || a.head_dim_v > M40_MAX_HEAD_DIM || a.rope_dims % 2 != 0 ||
            a.rope_dims > a.head_dim_k)
            return cudaErrorInvalidValue;
        for (int m = 0; m < p.n_matrices; m++) {
            const M40GemvMatrix &mat = p.m[m];
            const int width = mat.role == M40_QUERIES ? a.n_head * a.head_dim_k
                              : mat.role == M40_KEYS  ? a.n_head_kv * a.head_dim_k
                              : mat.role == M40_VALUES ? a.n_head_kv * a.head_dim_v
                                                       : mat.rows;
            if (mat.role < M40_PLAIN_OUTPUT || mat.role > M40_VALUES || mat.rows != width || mat.rows % 2 != 0)
                return cudaErrorInvalidValue;
        }
    } else {
        for (int m = 0; m < 3; m++)
            if (p.m[m].role != M40_PLAIN_OUTPUT) return cudaErrorInvalidValue;
    }
    if (p.experts.work && (p.experts.n_work < 1 || p.experts.n_work > 65535 || p.experts.x_rows < 1 ||
                           p.experts.expert_bytes < 0 || p.experts.bias_stride < 0 || p.attention.rows))
        return cudaErrorInvalidValue;
    if (p.experts.shared[0])
        for (int m = 1; m < p.n_matrices; m++)
            if (!p.experts.shared[m]) return cudaErrorInvalidValue;
    if (p.epilogue < M40_GEMV_STORE || p.epilogue > M40_GEMV_GLU_OAI) return cudaErrorInvalidValue;
    const bool glu = p.epilogue >= M40_GEMV_GLU_SILU;
    if (glu && (p.n_matrices != 2 || p.m[0].rows != p.m[1].rows)) return cudaErrorInvalidValue;
    if (type == M40_Q2_K || type == M40_Q3_K || type == M40_Q4_K || type == M40_Q5_K || type == M40_Q6_K ||
        type == M40_IQ4_XS) {
        if (p.cols % 256 != 0) return cudaErrorInvalidValue;  // whole super-blocks
    }
    return m40_with_format(type, [&](auto f) {
        constexpr int TYPE = FormatType<decltype(f)>::value;
        if constexpr (m40_activation_scales(TYPE) != M40_SCALES_F32) {
            if (p.x_q8) {
                const bool dp4a = m40_code_version() >= 61;
                const int form = m40_prepared_form(TYPE, dp4a);
                const int x_rows = p.experts.work ? p.experts.x_rows : p.n_x;
                if (!p.x_quantized)
                    m40_prepare_activations(p.overlap, p.x, p.norm, p.eps, p.cols, x_rows, p.x_q8, form, stream);
                // A form without the grid flag names a kernel the format has
                // for this code (m40_prepared_form), so one branch launches.
                if (form & M40_PREPARED_GRID) {
                    // The FP32 kernel on the rounded rows, which lie as x does.
                    M40Gemv grid = p;
                    grid.x = reinterpret_cast<const float *>(p.x_q8);
                    grid.norm = nullptr;
                    grid.x_q8 = nullptr;
                    m40_gemv_shapes<Gemv<TYPE>, TYPE, false>(grid, rows_per_warp, stream);
                } else if (dp4a) {
                    if constexpr (m40_integer_format(TYPE)) m40_gemv_shapes<GemvQ8<TYPE>, TYPE, false>(p, rows_per_warp, stream);
                } else {
                    if constexpr (m40_scaled_format(TYPE))
                        m40_gemv_shapes<GemvScaled<TYPE>, TYPE, false>(p, rows_per_warp, stream);
                }
                return;
            }
        }
        if (p.norm)
            m40_gemv_shapes<Gemv<TYPE>, TYPE, true>(p, rows_per_warp, stream);
        else
            m40_gemv_shapes<Gemv<TYPE>, TYPE, false>(p, rows_per_warp, stream);
    });
}

// Whether decode products of `type` prepare their activations in scratch
// (given one): every format whose activations llama.cpp's CPU rounds to 8
// bits. Where the format has the integer path and this build's code runs
// dp4a on the current device (compiled for sm_61 or newer), as 8-bit
// codes; where it has the scaled path and the code is for older GPUs
// (sm_52–sm_60 SASS, the compute_52 PTX), as scaled values; else as grid
// values for its FP32 kernel (m40_prepared_form).
M40_EXPORT int m40_gemv_prepared_path(int type) {
    return m40_activation_scales(type) != M40_SCALES_F32 && m40_code_version() > 0;
}

// The form decode products of `type` read their prepared rows in on a GPU
// that runs this build's dp4a code (dp4a 1, m40_gemv_dp4a_code) or not
// (prepare.cuh): rows prepared in one form serve only products of the same.
M40_EXPORT int m40_gemv_prepared_form(int type, int dp4a) { return m40_prepared_form(type, dp4a != 0); }

// Whether the current device runs this build's dp4a code (sm_61+ SASS): the
// formats with an integer kernel then take it, else those with a scaled
// kernel take that one, and the others the FP32 kernel on grid values.
M40_EXPORT int m40_gemv_dp4a_code() { return m40_code_version() >= 61; }

// Whether launches may overlap on the current device (m40_launch): this
// build's kernels run its sm_90 code there (not the compute_52 PTX, whose
// kernels do not wait), so the device has programmatic dependent launch.
M40_EXPORT int m40_launch_overlap() { return m40_code_version() >= 90; }
