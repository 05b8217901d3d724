// The GGUF tensor formats on the device: each format decodes any 16
// consecutive values of one of its blocks to f32. Every kernel that reads
// weights (matrix × vector, dequantization, embedding lookup) is written once
// over this interface and instantiated per format. The layouts are ggml's
// (ggml-common.h); src/quant/ holds the CPU definitions they are tested against.
#pragma once

#include "common.cuh"

// GGUF type ids.
enum M40Type {
    M40_F32 = 0, M40_F16 = 1, M40_Q4_0 = 2, M40_Q4_1 = 3, M40_Q5_0 = 6, M40_Q5_1 = 7,
    M40_Q8_0 = 8, M40_Q2_K = 10, M40_Q3_K = 11, M40_Q4_K = 12, M40_Q5_K = 13, M40_Q6_K = 14,
    M40_IQ4_NL = 20, M40_IQ4_XS = 23, M40_BF16 = 30, M40_MXFP4 = 39,
};

// A format: VALUES per block, BYTES per block, and decode16(block, part, out)
// writing values part*16 .. part*16+15 of the block.
template <int TYPE> struct Format;

// The float formats count 16 values as one "block".
template <> struct Format<M40_F32> {
    static constexpr int VALUES = 16, BYTES = 64;
    __device__ static void decode16(const uint8_t *b, int, float *v) {
        const float4 *p = reinterpret_cast<const float4 *>(b);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float4 f = p[i];
            v[4 * i] = f.x; v[4 * i + 1] = f.y; v[4 * i + 2] = f.z; v[4 * i + 3] = f.w;
        }
    }
};

// The 16-bit float formats: 8 values per 16-byte load, each 16-bit word
// widened by `widen` (its bits in the low half of a u32) to f32.
template <class Widen> __device__ __forceinline__ void m40_words8(uint4 w, float *v, Widen widen) {
    const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int j = 0; j < 4; j++) {
        v[2 * j] = widen(words[j] & 0xffffu);
        v[2 * j + 1] = widen(words[j] >> 16);
    }
}

template <class Widen> __device__ __forceinline__ void m40_decode16_words(const uint8_t *b, float *v, Widen widen) {
    const uint4 *p = reinterpret_cast<const uint4 *>(b);
    m40_words8(p[0], v, widen);
    m40_words8(p[1], v + 8, widen);
}

// The widenings of F16 and BF16 bits.
__device__ __forceinline__ float m40_widen_f16(uint32_t bits) { return m40_half_bits(uint16_t(bits)); }
__device__ __forceinline__ float m40_widen_bf16(uint32_t bits) { return __uint_as_float(bits << 16); }

template <> struct Format<M40_F16> {
    static constexpr int VALUES = 16, BYTES = 32;
    __device__ static void decode16(const uint8_t *b, int, float *v) {
        m40_decode16_words(b, v, m40_widen_f16);
    }
};

template <> struct Format<M40_BF16> {
    static constexpr int VALUES = 16, BYTES = 32;
    __device__ static void decode16(const uint8_t *b, int, float *v) {
        m40_decode16_words(b, v, m40_widen_bf16);
    }
};

// Q4_0: d, then 16 bytes whose low nibbles are values 0..15 and high nibbles 16..31.
template <> struct Format<M40_Q4_0> {
    static constexpr int VALUES = 32, BYTES = 18;
    __device__ static void decode16(const uint8_t *b, int part, float *v) {
        const float d = m40_f16(b);
        const int shift = 4 * part;
#pragma unroll
        for (int j = 0; j < 16; j++) v[j] = float(int((b[2 + j] >> shift) & 0xF) - 8) * d;
    }
};

template <> struct Format<M40_Q4_1> {
    static constexpr int VALUES = 32, BYTES = 20;
    __device__ static void decode16(const uint8_t *b, int part, float *v) {
        const float d = m40_f16(b), m = m40_f16(b + 2);
        const int shift = 4 * part;
#pragma unroll
        for (int j = 0; j < 16; j++) v[j] = float((b[4 + j] >> shift) & 0xF) * d + m;
    }
};

// A 32-bit word of a block that is only 2-byte aligned.
__device__ __forceinline__ uint32_t m40_u32_2(const uint8_t *p) {
    const uint16_t *h = reinterpret_cast<const uint16_t *>(p);
    return uint32_t(h[0]) | (uint32_t(h[1]) << 16);
}
__device__ __forceinline__ uint32_t m40_u32_4(const uint8_t *p) { return *reinterpret_cast<const uint32_t *>(p); }

// N consecutive 32-bit words of a run that is only ALIGN-byte aligned (2:
// Q4_0, Q5_0, Q8_0, IQ4_NL blocks; 1: MXFP4's 17-byte blocks), from the
// aligned words it overlaps: a load and a funnel shift a word, where
// m40_u32_2 costs two 16-bit loads and a merge (byte loads, four loads and
// three merges). Reads no byte outside the aligned words the run touches.
// The integer decode products read their staged quants this way, measured
// faster on the H100 for Q4_0, Q5_0 and Q8_0. Where a run is only two
// words (the integer Q6_K, the FP32 path's Q8_0) the address and alignment
// work outweighs the loads saved, measured slower, so those keep m40_u32_2.
template <int N, int ALIGN> __device__ __forceinline__ void m40_words(const uint8_t *p, uint32_t *out) {
    static_assert(ALIGN == 1 || ALIGN == 2, "runs of 4-byte aligned words need no shifts");
    // Pointer arithmetic rather than a mask of p's bits, which would hide
    // from the compiler that p points into shared memory (generic loads).
    const int offset = int(uintptr_t(p) & 3);
    const uint32_t *aligned = reinterpret_cast<const uint32_t *>(p - offset);
    const bool straddles = offset != 0;
    uint32_t w[N + 1];
#pragma unroll
    for (int k = 0; k < N; k++) w[k] = aligned[k];
    w[N] = straddles ? aligned[N] : 0u;
    // A 2-byte aligned run straddles by exactly 2 bytes.
    const int shift = ALIGN == 2 ? (straddles ? 16 : 0) : 8 * offset;
#pragma unroll
    for (int k = 0; k < N; k++) out[k] = __funnelshift_r(w[k], w[k + 1], shift);
}

// Bits 0..3 of b spread to bit 4 of bytes 0..3.
__device__ __forceinline__ uint32_t m40_spread4_to_bit4(uint32_t b) {
    return (((b & 0xF) * 0x00204081u) & 0x01010101u) << 4;
}

// Q4_0, Q4_1, Q5_0 and Q5_1 as the integer kernels (gemv.cu's dp4a path,
// mmq.cu) read them: BYTES per block, 16 quant bytes at QS (value i the low
// nibble of byte i, value 16 + i its high nibble), the 32 fifth bits as one
// word at QH (-1: none; bit i for value i), a minimum at byte 2 (MIN), and
// codes ZERO above the value they stand for (weight = d · (code − ZERO) + m).
template <int BYTES_, int QS, int QH, bool MIN_, int ZERO_> struct NibbleLayout {
    static constexpr int VALUES = 32, BYTES = BYTES_, ZERO = ZERO_, FIFTH_AT = QH;
    static constexpr bool MIN = MIN_, FIFTH = QH >= 0;
    // The block's fifth bits, 0 without them.
    __device__ static uint32_t fifth_bits(const uint8_t *b) {
        return QH < 0 ? 0 : QH % 4 == 0 ? m40_u32_4(b + QH) : m40_u32_2(b + QH);
    }
    // The block's four quant words (word k: quant bytes 4k..4k+3).
    __device__ static void quant_words(const uint8_t *b, uint32_t *words) {
        if (QS % 4 == 0) {
#pragma unroll
            for (int k = 0; k < 4; k++) words[k] = m40_u32_4(b + QS + 4 * k);
        } else {
            m40_words<4, 2>(b + QS, words);
        }
    }
    // The codes of values 16h + 4k .. 16h + 4k + 3 (h = 0: low nibbles, 1:
    // high), one per byte, from quant word k; `fifth`: the block's fifth_bits.
    __device__ static uint32_t word_codes(uint32_t word, uint32_t fifth, int k, int h) {
        uint32_t c = (word >> (4 * h)) & 0x0F0F0F0Fu;
        if (QH >= 0) c |= m40_spread4_to_bit4(fifth >> (16 * h + 4 * k));
        return c;
    }
    // The same codes read from the block (one word).
    __device__ static uint32_t codes(const uint8_t *b, uint32_t fifth, int k, int h) {
        return word_codes(QS % 4 == 0 ? m40_u32_4(b + QS + 4 * k) : m40_u32_2(b + QS + 4 * k), fifth, k, h);
    }
};

template <int TYPE> struct NibbleBlock;
template <> struct NibbleBlock<M40_Q4_0> : NibbleLayout<18, 2, -1, false, 8> {};
template <> struct NibbleBlock<M40_Q4_1> : NibbleLayout<20, 4, -1, true, 0> {};
template <> struct NibbleBlock<M40_Q5_0> : NibbleLayout<22, 6, 2, false, 16> {};
template <> struct NibbleBlock<M40_Q5_1> : NibbleLayout<24, 8, 4, true, 0> {};

// Q5_0: d, a 32-bit word of fifth bits (bit i for value i), then nibbles as Q4_0.
template <> struct Format<M40_Q5_0> {
    static constexpr int VALUES = 32, BYTES = 22;
    __device__ static void decode16(const uint8_t *b, int part, float *v) {
        const float d = m40_f16(b);
        const uint32_t qh = m40_u32_2(b + 2) >> (16 * part);
        const int shift = 4 * part;
#pragma unroll
        for (int j = 0; j < 16; j++) {
            int q = ((b[6 + j] >> shift) & 0xF) | (((qh >> j) & 1) << 4);
            v[j] = float(q - 16) * d;
        }
    }
};

template <> struct Format<M40_Q5_1> {
    static constexpr int VALUES = 32, BYTES = 24;
    __device__ static void decode16(const uint8_t *b, int part, float *v) {
        const float d = m40_f16(b), m = m40_f16(b + 2);
        const uint32_t qh = m40_u32_2(b + 4) >> (16 * part);
        const int shift = 4 * part;
#pragma unroll
        for (int j = 0; j < 16; j++) {
            int q = ((b[8 + j] >> shift) & 0xF) | (((qh >> j) & 1) << 4);
            v[j] = float(q) * d + m;
        }
    }
};

template <> struct Format<M40_Q8_0> {
    static constexpr int VALUES = 32, BYTES = 34;
    __device__ static void decode16(const uint8_t *b, int part, float *v) {
        const float d = m40_f16(b);
        const int8_t *q = reinterpret_cast<const int8_t *>(b + 2 + 16 * part);
#pragma unroll
        for (int j = 0; j < 16; j++) v[j] = float(q[j]) * d;
    }
};

// The table-lookup formats: each 4-bit code indexes a table of 16 int8
// values (ggml-common.h's kvalues_iq4nl and kvalues_mxfp4, the latter the
// FP4 E2M1 numbers doubled), as four little-endian words.
__device__ __forceinline__ uint4 m40_iq4_values() { return make_uint4(0xBFAD9881u, 0xF6EADDCFu, 0x26190D01u, 0x71594535u); }
__device__ __forceinline__ uint4 m40_mxfp4_values() { return make_uint4(0x03020100u, 0x0C080604u, 0xFDFEFF00u, 0xF4F8FAFCu); }

// The table's bytes for the four codes in the low nibbles of `codes`' bytes
// (high nibbles zero): codes 0..7 from the first two words, 8..15 from the
// last two, by one byte permute each (its selector nibbles' bit 3 must stay
// clear: it would copy the sign instead) and a select on each code's bit 3.
__device__ __forceinline__ uint32_t m40_lookup4(uint32_t codes, uint4 table) {
    const uint32_t low = codes & 0x07070707u;
    const uint32_t selector = (low & 0x7u) | ((low >> 4) & 0x70u) | ((low >> 8) & 0x700u) | ((low >> 12) & 0x7000u);
    const uint32_t first = __byte_perm(table.x, table.y, selector), second = __byte_perm(table.z, table.w, selector);
    const uint32_t upper = ((codes >> 3) & 0x01010101u) * 0xFFu;
    return (first & ~upper) | (second & upper);
}

// The table's bytes for the 8 codes of a quant word whose bytes hold two
// each (value j's code in byte j's low nibble, value 16 + j's in its high
// one, as every table-lookup block holds them): values j into `low` and
// 16 + j into `high`, a byte each. Each half of the table is looked up for
// four codes at once, the nibbles of two bytes as they lie (value order 0,
// 16, 1, 17), each code's bit 3 picks its half, and two more permutes put
// the bytes in value order: 13 operations (source count) for 8 codes, where
// m40_lookup4 takes as many for 4.
__device__ __forceinline__ void m40_lookup8(uint32_t word, uint4 table, uint32_t &low, uint32_t &high) {
    const uint32_t index = word & 0x77777777u;
    const uint32_t half = 0x32103210u | ((word & 0x88888888u) >> 1);
    const uint32_t first =
        __byte_perm(__byte_perm(table.x, table.y, index), __byte_perm(table.z, table.w, index), half);
    const uint32_t second = __byte_perm(__byte_perm(table.x, table.y, index >> 16),
                                        __byte_perm(table.z, table.w, index >> 16), half >> 16);
    low = __byte_perm(first, second, 0x6420);
    high = __byte_perm(first, second, 0x7531);
}

// 16 values of a table-lookup block: the codes of 16 quant bytes (low
// nibbles for part 0, high for part 1), looked up and scaled by d as ggml
// scales them (d · value; the product is exact either way round).
__device__ __forceinline__ void m40_lookup16(const uint8_t *qs, int part, uint4 table, float d, float *v) {
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const uint32_t word = uint32_t(qs[4 * k]) | uint32_t(qs[4 * k + 1]) << 8 | uint32_t(qs[4 * k + 2]) << 16 |
                              uint32_t(qs[4 * k + 3]) << 24;
        const uint32_t values = m40_lookup4((word >> (4 * part)) & 0x0F0F0F0Fu, table);
#pragma unroll
        for (int i = 0; i < 4; i++) v[4 * k + i] = d * float(int8_t(values >> (8 * i)));
    }
}

// IQ4_NL: d, then 16 bytes whose low nibbles code values 0..15 and high
// nibbles 16..31.
template <> struct Format<M40_IQ4_NL> {
    static constexpr int VALUES = 32, BYTES = 18;
    __device__ static void decode16(const uint8_t *b, int part, float *v) {
        m40_lookup16(b + 2, part, m40_iq4_values(), m40_f16(b), v);
    }
};

// MXFP4's scale for its E8M0 exponent e: 2^(e − 127) / 2
// (ggml_e8m0_to_fp32_half: exponents 0 and 1 give subnormals).
__device__ __forceinline__ float m40_e8m0_half(uint32_t e) {
    return __uint_as_float(e < 2 ? 0x00200000u << e : (e - 1) << 23);
}

// MXFP4: an E8M0 exponent, then 16 bytes of codes as IQ4_NL's.
template <> struct Format<M40_MXFP4> {
    static constexpr int VALUES = 32, BYTES = 17;
    __device__ static void decode16(const uint8_t *b, int part, float *v) {
        m40_lookup16(b + 1, part, m40_mxfp4_values(), m40_e8m0_half(b[0]), v);
    }
};

// IQ4_XS: d, the sub-blocks' high scale bits (a u16, 2 bits each), their
// low scale bits (4 bytes, 4 bits each), then 8 sub-blocks of 32 values
// coded as IQ4_NL's under d · (scale − 32). Part p is sub-block p / 2's
// low (p even) or high nibbles.
// Sub-block `sub`'s scale of an IQ4_XS block: d · (scale − 32).
__device__ __forceinline__ float m40_iq4_xs_scale(const uint8_t *b, int sub) {
    const uint32_t high = *reinterpret_cast<const uint16_t *>(b + 2);
    const int scale = ((b[4 + sub / 2] >> (4 * (sub % 2))) & 0xF) | (((high >> (2 * sub)) & 3) << 4);
    return m40_f16(b) * float(scale - 32);
}

template <> struct Format<M40_IQ4_XS> {
    static constexpr int VALUES = 256, BYTES = 136;
    __device__ static void decode16(const uint8_t *b, int part, float *v) {
        m40_lookup16(b + 8 + 16 * (part / 2), part % 2, m40_iq4_values(), m40_iq4_xs_scale(b, part / 2), v);
    }
};

// The super-block formats hold 256 values as 16 parts of 16 (Q2_K, Q3_K,
// Q6_K: one scale per part) or 8 sub-blocks of 32 (Q4_K, Q5_K). Values are
// laid out in two halves of 128; within a half, 2-bit codes take four shifts
// of the same 32 bytes.

// Q2_K: scales[16] (low nibble scale, high nibble min), qs[64], d, dmin.
template <> struct Format<M40_Q2_K> {
    static constexpr int VALUES = 256, BYTES = 84;
    __device__ static void decode16(const uint8_t *b, int part, float *v) {
        const float d = m40_f16(b + 80), dmin = m40_f16(b + 82);
        const int half = part / 8, shift = 2 * ((part % 8) / 2), l0 = 16 * (part % 2);
        const uint8_t sc = b[part];
        const float dl = d * float(sc & 0xF), ml = dmin * float(sc >> 4);
        const uint8_t *qs = b + 16 + 32 * half + l0;
#pragma unroll
        for (int j = 0; j < 16; j++) v[j] = dl * float((qs[j] >> shift) & 3) - ml;
    }
};

// Q3_K: hmask[32], qs[64], 12 bytes of 6-bit scales, d. A value's code is its
// 2 low bits minus 4 when its hmask bit is clear.
template <> struct Format<M40_Q3_K> {
    static constexpr int VALUES = 256, BYTES = 110;
    __device__ static void decode16(const uint8_t *b, int part, float *v) {
        const float d = m40_f16(b + 108);
        const uint8_t *sc = b + 96;
        const int low = (sc[part % 8] >> (4 * (part / 8))) & 0xF;
        const int high = (sc[8 + part % 4] >> (2 * (part / 4))) & 3;
        const float dl = d * float((low | (high << 4)) - 32);
        const int half = part / 8, shift_index = (part % 8) / 2, l0 = 16 * (part % 2);
        const int mask_bit = 4 * half + shift_index;  // value index / 32
        const uint8_t *hmask = b + l0, *qs = b + 32 + 32 * half + l0;
#pragma unroll
        for (int j = 0; j < 16; j++) {
            int q = (qs[j] >> (2 * shift_index)) & 3;
            if (!((hmask[j] >> mask_bit) & 1)) q -= 4;
            v[j] = dl * float(q);
        }
    }
};

// The 6-bit scale and min of sub-block j of Q4_K/Q5_K from their 12 bytes.
__device__ __forceinline__ void m40_k_scale_min(const uint8_t *sc, int j, int &scale, int &min) {
    if (j < 4) {
        scale = sc[j] & 63;
        min = sc[j + 4] & 63;
    } else {
        scale = (sc[j + 4] & 0xF) | ((sc[j - 4] >> 2) & 0x30);
        min = (sc[j + 4] >> 4) | ((sc[j] >> 2) & 0x30);
    }
}

// Q4_K: d, dmin, scales[12], qs[128]; sub-block 2c holds the low nibbles of
// bytes 32c..32c+31 and sub-block 2c+1 their high nibbles.
template <> struct Format<M40_Q4_K> {
    static constexpr int VALUES = 256, BYTES = 144;
    __device__ static void decode16(const uint8_t *b, int part, float *v) {
        const int sub = part / 2, l0 = 16 * (part % 2);
        int scale, min;
        m40_k_scale_min(b + 4, sub, scale, min);
        const float dl = m40_f16(b) * float(scale), ml = m40_f16(b + 2) * float(min);
        const uint8_t *qs = b + 16 + 32 * (sub / 2) + l0;
        const int shift = 4 * (sub % 2);
#pragma unroll
        for (int j = 0; j < 16; j++) v[j] = dl * float((qs[j] >> shift) & 0xF) - ml;
    }
};

// Q5_K: Q4_K plus qh[32], bit `sub` of qh[l] being value l of sub-block `sub`'s fifth bit.
template <> struct Format<M40_Q5_K> {
    static constexpr int VALUES = 256, BYTES = 176;
    __device__ static void decode16(const uint8_t *b, int part, float *v) {
        const int sub = part / 2, l0 = 16 * (part % 2);
        int scale, min;
        m40_k_scale_min(b + 4, sub, scale, min);
        const float dl = m40_f16(b) * float(scale), ml = m40_f16(b + 2) * float(min);
        const uint8_t *qh = b + 16 + l0, *qs = b + 48 + 32 * (sub / 2) + l0;
        const int shift = 4 * (sub % 2);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            int q = ((qs[j] >> shift) & 0xF) | (((qh[j] >> sub) & 1) << 4);
            v[j] = dl * float(q) - ml;
        }
    }
};

// Q6_K: ql[128] (low nibbles), qh[64] (2 high bits each), scales[16] (i8), d.
template <> struct Format<M40_Q6_K> {
    static constexpr int VALUES = 256, BYTES = 210;
    __device__ static void decode16(const uint8_t *b, int part, float *v) {
        const float dl = m40_f16(b + 208) * float(int8_t(b[192 + part]));
        const int half = part / 8, quarter = (part % 8) / 2, l0 = 16 * (part % 2);
        const uint8_t *ql = b + 64 * half + 32 * (quarter & 1) + l0;
        const uint8_t *qh = b + 128 + 32 * half + l0;
        const int low_shift = 4 * (quarter >> 1), high_shift = 2 * quarter;
#pragma unroll
        for (int j = 0; j < 16; j++) {
            int q = ((ql[j] >> low_shift) & 0xF) | (((qh[j] >> high_shift) & 3) << 4);
            v[j] = dl * float(q - 32);
        }
    }
};

// The GGUF id of a Format type.
template <class F> struct FormatType;
template <int T> struct FormatType<Format<T>> {
    static constexpr int value = T;
};

// Calls F.template operator()<Format<T>>() for the format with GGUF id
// `type`; returns cudaErrorInvalidValue for any other id.
template <class F> cudaError_t m40_with_format(int type, F &&f) {
    switch (type) {
        case M40_F32: f(Format<M40_F32>{}); break;
        case M40_F16: f(Format<M40_F16>{}); break;
        case M40_BF16: f(Format<M40_BF16>{}); break;
        case M40_Q4_0: f(Format<M40_Q4_0>{}); break;
        case M40_Q4_1: f(Format<M40_Q4_1>{}); break;
        case M40_Q5_0: f(Format<M40_Q5_0>{}); break;
        case M40_Q5_1: f(Format<M40_Q5_1>{}); break;
        case M40_Q8_0: f(Format<M40_Q8_0>{}); break;
        case M40_Q2_K: f(Format<M40_Q2_K>{}); break;
        case M40_Q3_K: f(Format<M40_Q3_K>{}); break;
        case M40_Q4_K: f(Format<M40_Q4_K>{}); break;
        case M40_Q5_K: f(Format<M40_Q5_K>{}); break;
        case M40_Q6_K: f(Format<M40_Q6_K>{}); break;
        case M40_IQ4_NL: f(Format<M40_IQ4_NL>{}); break;
        case M40_IQ4_XS: f(Format<M40_IQ4_XS>{}); break;
        case M40_MXFP4: f(Format<M40_MXFP4>{}); break;
        default: return cudaErrorInvalidValue;
    }
    return m40_launch_status();
}
