// Quantized weights times many 8-bit activation rows on int8 tensor cores
// (sm_80+): the products of batched decode past M40_GEMV_MAX_X sessions.
//
// At 32 sessions a step multiplies every weight by 32 rows. gemv.cu's
// kernels keep a row's sums per lane and would spend 32 dp4a-sized steps per
// weight; cuBLAS would need every weight dequantized to f16 and written out
// first (13 GB a step for llama-7b). Here a weight block is decoded straight
// into int8 tensor-core fragments, multiplied with the activations' 8-bit
// codes (q8.cuh) by mma.sync, and each 32-value block's integer sum is scaled
// into FP32 accumulators, as the dp4a path does per dot product. The weights
// are read once per 32 activation rows.
//
//   - A block of 8 warps takes 128 weight rows × 32 activation rows; warp w
//     takes rows 16w..16w+15 as one m16 tile against four n8 tiles.
//   - K goes in steps of 256 values (a super-block, or 8 blocks of 32). Each
//     step's weight bytes and activation codes are copied to shared memory
//     by cp.async, the next step's copies running under this step's math.
//   - The K range may be split over several blocks (the grid's y): a llama-7b
//     attention matrix has only 32 row tiles, too few to keep the memory
//     busy. Each split writes its partial sums; a second kernel adds them in
//     order (the result does not depend on timing) and applies the epilogue.
//
// The activation codes of a 32-value block are what the dp4a path multiplies,
// so results match it up to FP32 summation order.
#include "q8.cuh"

#define M40_MMQ_WARPS 8
#define M40_MMQ_ROWS (16 * M40_MMQ_WARPS)  // weight rows per block
#define M40_MMQ_X 32                       // activation rows per block
#define M40_MMQ_STEP 256                   // values of K per pipeline step
// Steps in shared memory at once (double buffering), and the fewest a split
// of K keeps. Measured on the H100 (mmq products of a llama-7b layer, 32
// rows, ms for 32 layers, Q4_K / Q4_0 / Q8_0 / Q6_K): 4 warps, 3 stages, 4
// steps 5.78 / 5.48 / 6.73 / 8.00; 4 warps, 2 stages, 1 step 5.42 / 5.27 /
// 6.63 / 7.21; 8 warps, 2 stages, 2 steps 5.16 / 5.02 / 5.58 / 6.83; more
// stages or smaller splits lost (fewer resident blocks, more partial sums).
#define M40_MMQ_STAGES 2
#define M40_MMQ_MIN_STEPS 2
// Bytes of an activation row in a stage: 256 codes plus 16, so that the
// 8 rows one ldmatrix reads fall in different banks.
#define M40_MMQ_X_STRIDE (M40_MMQ_STEP + 16)

// Mirrors `MmqLaunch` in src/backend/cuda/kernels.rs.
struct M40Mmq {
    const uint8_t *w;
    int rows, cols;
    // x quantized (q8.cuh layout, n_x rows of cols), quantized first from
    // the f32 rows `x` unless x_quantized.
    const float *x;
    int8_t *x_q8;
    int n_x;
    int x_quantized;
    const float *bias;  // rows f32, or null
    float *y;           // n_x rows of `rows` values
    int accumulate;     // y += product instead of y = product
    // Splits of K (m40_mmq_splits), and their partial sums: splits × n_x ×
    // rows f32, unused when splits is 1.
    int splits;
    float *partials;
    int overlap;
};

// ---- per-format decoding into fragments ----
// Mmq<TYPE> decodes the weights of one row's 256-value step, staged in shared
// memory, as SUB-value pieces: for piece j (of 256 / SUB) the codes a lane
// t (0..3) holds in an m16n8k32 (SUB 32) or m16n8k16 (SUB 16) A fragment,
// i.e. codes 4t..4t+3 (`low`) and 16+4t..16+4t+3 (`high`, SUB 32), packed
// int8, and the piece's scale and offset: weight = code · scale + offset.
// OFFSET: whether any offset is non-zero (it multiplies the activations'
// d·Σcodes, which exist per block of 32).

// Subtracts k from each byte of x (each below 128).
__device__ __forceinline__ uint32_t m40_bytes_minus(uint32_t x, uint32_t k) {
    return ((x | 0x80808080u) - k * 0x01010101u) ^ 0x80808080u;
}

template <int TYPE> struct Mmq;

// Q4_0 / Q4_1 / Q5_0 / Q5_1: quant word t of a block holds codes 4t..4t+3
// (low nibbles) and 16+4t..16+4t+3 (high): the fragment as it lies.
template <int BYTES_, int QS, int QH, bool MIN, int CODE_OFFSET> struct MmqNibbles {
    static constexpr int VALUES = 32, BYTES = BYTES_, SUB = 32;
    static constexpr bool OFFSET = MIN;
    __device__ static void codes(const uint8_t *s, int t, int j, uint32_t &low, uint32_t &high) {
        const uint8_t *b = s + j * BYTES;
        const uint32_t q = QS % 4 == 0 ? m40_u32_4(b + QS + 4 * t) : m40_u32_2(b + QS + 4 * t);
        low = q & 0x0F0F0F0Fu;
        high = (q >> 4) & 0x0F0F0F0Fu;
        if (QH >= 0) {
            const uint32_t qh = QH % 4 == 0 ? m40_u32_4(b + QH) : m40_u32_2(b + QH);
            low |= m40_spread4_to_bit4(qh >> (4 * t));
            high |= m40_spread4_to_bit4(qh >> (16 + 4 * t));
        }
        if (CODE_OFFSET) {
            low = m40_bytes_minus(low, CODE_OFFSET);
            high = m40_bytes_minus(high, CODE_OFFSET);
        }
    }
    __device__ static void scale(const uint8_t *s, int j, float &d, float &m) {
        d = m40_f16(s + j * BYTES);
        m = MIN ? m40_f16(s + j * BYTES + 2) : 0.0f;
    }
};

template <> struct Mmq<M40_Q4_0> : MmqNibbles<18, 2, -1, false, 8> {};
template <> struct Mmq<M40_Q4_1> : MmqNibbles<20, 4, -1, true, 0> {};
template <> struct Mmq<M40_Q5_0> : MmqNibbles<22, 6, 2, false, 16> {};
template <> struct Mmq<M40_Q5_1> : MmqNibbles<24, 8, 4, true, 0> {};

template <> struct Mmq<M40_Q8_0> {
    static constexpr int VALUES = 32, BYTES = 34, SUB = 32;
    static constexpr bool OFFSET = false;
    __device__ static void codes(const uint8_t *s, int t, int j, uint32_t &low, uint32_t &high) {
        low = m40_u32_2(s + j * BYTES + 2 + 4 * t);
        high = m40_u32_2(s + j * BYTES + 18 + 4 * t);
    }
    __device__ static void scale(const uint8_t *s, int j, float &d, float &m) {
        d = m40_f16(s + j * BYTES);
        m = 0.0f;
    }
};

// Q4_K / Q5_K: sub-block j's codes are the low (j even) or high nibbles of
// quant bytes 32 (j / 2) .. + 31, code i at byte i; Q5_K's fifth bit of code
// i is bit j of qh byte i.
template <int TYPE, int QS, int QH> struct MmqK {
    static constexpr int VALUES = 256, BYTES = TYPE == M40_Q4_K ? 144 : 176, SUB = 32;
    static constexpr bool OFFSET = true;
    __device__ static void codes(const uint8_t *s, int t, int j, uint32_t &low, uint32_t &high) {
        const int shift = 4 * (j % 2);
        const uint8_t *q = s + QS + 32 * (j / 2) + 4 * t;
        low = (m40_u32_4(q) >> shift) & 0x0F0F0F0Fu;
        high = (m40_u32_4(q + 16) >> shift) & 0x0F0F0F0Fu;
        if (QH >= 0) {
            low |= ((m40_u32_4(s + QH + 4 * t) >> j) & 0x01010101u) << 4;
            high |= ((m40_u32_4(s + QH + 16 + 4 * t) >> j) & 0x01010101u) << 4;
        }
    }
    __device__ static void scale(const uint8_t *s, int j, float &d, float &m) {
        int scale, min;
        m40_k_scale_min(s + 4, j, scale, min);
        d = m40_f16(s) * float(scale);
        m = -m40_f16(s + 2) * float(min);
    }
};

template <> struct Mmq<M40_Q4_K> : MmqK<M40_Q4_K, 16, -1> {};
template <> struct Mmq<M40_Q5_K> : MmqK<M40_Q5_K, 48, 16> {};

// Q6_K: a scale per 16 values, so pieces of 16 (m16n8k16). Value v = 16j + l
// of the super-block: half h = j / 8, quarter g = (j % 8) / 2, position
// 16 (j % 2) + l in the quarter; low nibbles from ql byte 64h + 32 (g % 2)
// + position, shifted by 4 (g / 2), high bits from qh byte 32h + position at
// bit 2g; codes q − 32.
template <> struct Mmq<M40_Q6_K> {
    static constexpr int VALUES = 256, BYTES = 210, SUB = 16;
    static constexpr bool OFFSET = false;
    __device__ static void codes(const uint8_t *s, int t, int j, uint32_t &low, uint32_t &) {
        const int h = j / 8, g = (j % 8) / 2, position = 16 * (j % 2) + 4 * t;
        const uint32_t ql = m40_u32_2(s + 64 * h + 32 * (g % 2) + position);
        const uint32_t qh = m40_u32_2(s + 128 + 32 * h + position);
        const uint32_t q = ((ql >> (4 * (g / 2))) & 0x0F0F0F0Fu) | (((qh >> (2 * g)) & 0x03030303u) << 4);
        low = m40_bytes_minus(q, 32);
    }
    __device__ static void scale(const uint8_t *s, int j, float &d, float &m) {
        d = m40_f16(s + 208) * float(int8_t(s[192 + j]));
        m = 0.0f;
    }
};

template <class M> __host__ __device__ constexpr int m40_mmq_step_bytes() { return M40_MMQ_STEP / M::VALUES * M::BYTES; }

// 16-byte vectors of a weight row's step in shared memory: its bytes plus
// one vector for rows whose step does not start 16-byte aligned, rounded to
// an odd count so that the 8 rows a fragment load reads fall in different
// banks.
template <class M> __host__ __device__ constexpr int m40_mmq_row_vectors() {
    constexpr int bytes = m40_mmq_step_bytes<M>();
    constexpr int vectors = (bytes + 15) / 16 + (bytes % 16 != 0 || M::BYTES % 16 != 0 ? 1 : 0);
    return vectors | 1;
}

// Shared memory of one stage: weight rows, activation codes, then the
// activations' (d, d·Σcodes) per block of 32, by block then activation row.
template <class M> __host__ __device__ constexpr int m40_mmq_stage_bytes() {
    return M40_MMQ_ROWS * m40_mmq_row_vectors<M>() * 16 + M40_MMQ_X * M40_MMQ_X_STRIDE +
           (M40_MMQ_STEP / 32) * M40_MMQ_X * 8;
}

template <class M> constexpr int m40_mmq_shared_bytes() { return M40_MMQ_STAGES * m40_mmq_stage_bytes<M>(); }

// ---- sm_80 instructions ----
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
__device__ __forceinline__ uint32_t m40_shared_address(const void *p) {
    return uint32_t(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void m40_copy16_async(void *shared, const void *global) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(m40_shared_address(shared)), "l"(global));
}

__device__ __forceinline__ void m40_copy8_async(void *shared, const void *global) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(m40_shared_address(shared)), "l"(global));
}

__device__ __forceinline__ void m40_copies_commit() { asm volatile("cp.async.commit_group;"); }

// Waits until at most `pending` committed groups of copies are in flight.
template <int pending> __device__ __forceinline__ void m40_copies_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(pending));
}

// Four 8 × 16-byte matrices from shared memory, lanes 8i..8i+7 naming the
// rows of matrix i; lane (4g + t) receives word t of row g of each.
__device__ __forceinline__ void m40_load_matrices4(const void *row, uint32_t *r) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(m40_shared_address(row)));
}

// c = A (16 × 32 codes) · B (32 × 8 codes), integer sums.
__device__ __forceinline__ void m40_mma_k32(const uint32_t *a, uint32_t b0, uint32_t b1, int *c) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%10, %10, %10, %10};"
        : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(0));
}

// c = A (16 × 16 codes) · B (16 × 8 codes).
__device__ __forceinline__ void m40_mma_k16(const uint32_t *a, uint32_t b, int *c) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%7, %7, %7, %7};"
        : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(b), "r"(0));
}
#endif

// An integer sum of at most 32 products of 8-bit codes (|c| < 2^22) as a
// float, with two full-rate instructions instead of a quarter-rate I2F.
__device__ __forceinline__ float m40_small_int_to_float(int c) {
    return __int_as_float(c + 0x4B400000) - 12582912.0f;  // 1.5 · 2^23
}

// The kernel. Grid: (row tiles, splits of K, tiles of 32 activation rows).
template <class M> __global__ void __launch_bounds__(32 * M40_MMQ_WARPS) mmq_kernel(M40Mmq p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    extern __shared__ uint4 m40_mmq_shared[];
    constexpr int ROW_VECTORS = m40_mmq_row_vectors<M>(), STEP_BYTES = m40_mmq_step_bytes<M>();
    constexpr int STAGE_BYTES = m40_mmq_stage_bytes<M>();
    constexpr int W_BYTES = M40_MMQ_ROWS * ROW_VECTORS * 16, X_BYTES = M40_MMQ_X * M40_MMQ_X_STRIDE;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
    const int row0 = blockIdx.x * M40_MMQ_ROWS, x0 = blockIdx.z * M40_MMQ_X;
    const int cols = p.cols, n_x = p.n_x;
    const size_t row_bytes = size_t(cols / M::VALUES) * M::BYTES;
    const int steps = (cols + M40_MMQ_STEP - 1) / M40_MMQ_STEP;
    const int step_begin = blockIdx.y * steps / p.splits, step_end = (blockIdx.y + 1) * steps / p.splits;
    const int n_steps = step_end - step_begin;
    uint8_t *shared = reinterpret_cast<uint8_t *>(m40_mmq_shared);
    const float2 *x_scales = m40_q8_scales(p.x_q8, cols, n_x, 0);

    // Rows past the matrix or the batch read its last row and are not written.
    const auto weight_row = [&](int r) { return p.w + size_t(min(row0 + r, p.rows - 1)) * row_bytes; };
    const auto x_row = [&](int r) { return min(x0 + r, n_x - 1); };

    // Step k's weights and activations into stage `stage`.
    const auto fetch = [&](int stage, int k) {
        uint8_t *base = shared + stage * STAGE_BYTES;
        const int values = min(M40_MMQ_STEP, cols - k * M40_MMQ_STEP);
        const int bytes = values / M::VALUES * M::BYTES;
        for (int i = threadIdx.x; i < M40_MMQ_ROWS * ROW_VECTORS; i += 32 * M40_MMQ_WARPS) {
            const int r = i / ROW_VECTORS, v = i % ROW_VECTORS;
            const uint8_t *start = weight_row(r) + size_t(k) * STEP_BYTES;
            const uint8_t *aligned = reinterpret_cast<const uint8_t *>(uintptr_t(start) & ~uintptr_t(15));
            if (16 * v < start + bytes - aligned) m40_copy16_async(base + 16 * i, aligned + 16 * v);
        }
        // Codes: 16 vectors per activation row (fewer in a short last step).
        const int code_vectors = values / 16;
        for (int i = threadIdx.x; i < M40_MMQ_X * 16; i += 32 * M40_MMQ_WARPS) {
            const int r = i / 16, v = i % 16;
            if (v < code_vectors)
                m40_copy16_async(base + W_BYTES + r * M40_MMQ_X_STRIDE + 16 * v,
                                 p.x_q8 + size_t(x_row(r)) * cols + size_t(k) * M40_MMQ_STEP + 16 * v);
        }
        float2 *scales = reinterpret_cast<float2 *>(base + W_BYTES + X_BYTES);
        for (int i = threadIdx.x; i < (M40_MMQ_STEP / 32) * M40_MMQ_X; i += 32 * M40_MMQ_WARPS) {
            const int block = i / M40_MMQ_X, r = i % M40_MMQ_X;
            if (32 * block < values)
                m40_copy8_async(scales + i, x_scales + size_t(x_row(r)) * (cols / 32) + k * (M40_MMQ_STEP / 32) + block);
        }
    };

    // The activations (and y) are the previous kernel's.
    float acc[4][4] = {};
    m40_wait_for_prior_kernels();
#pragma unroll
    for (int s = 0; s < M40_MMQ_STAGES - 1; s++) {
        if (s < n_steps) fetch(s, step_begin + s);
        m40_copies_commit();
    }
    for (int i = 0; i < n_steps; i++) {
        m40_copies_wait<M40_MMQ_STAGES - 2>();
        __syncthreads();  // step i has landed; every warp is done with step i - 1's stage
        if (i + M40_MMQ_STAGES - 1 < n_steps)
            fetch((i + M40_MMQ_STAGES - 1) % M40_MMQ_STAGES, step_begin + i + M40_MMQ_STAGES - 1);
        m40_copies_commit();

        const int k = step_begin + i;
        const uint8_t *base = shared + (i % M40_MMQ_STAGES) * STAGE_BYTES;
        const uint8_t *w_rows[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int r = 16 * warp + g + 8 * h;
            const uintptr_t start = uintptr_t(weight_row(r) + size_t(k) * STEP_BYTES);
            w_rows[h] = base + r * ROW_VECTORS * 16 + (start & 15);
        }
        const uint8_t *x_codes = base + W_BYTES;
        const float4 *x_ds = reinterpret_cast<const float4 *>(base + W_BYTES + X_BYTES);
        const int pieces = min(M40_MMQ_STEP, cols - k * M40_MMQ_STEP) / M::SUB;
        // The lane's ldmatrix row: activation row 8 (lane / 8) + lane % 8 of
        // an n8 tile pair, or of the four n8 tiles.
        const int matrix = lane / 8, matrix_row = lane % 8;
#pragma unroll
        for (int j = 0; j < M40_MMQ_STEP / M::SUB; j++) {
            if (j >= pieces) break;
            uint32_t a[4];
            float d[2], m[2];
#pragma unroll
            for (int h = 0; h < 2; h++) {
                M::codes(w_rows[h], t, j, a[h], a[2 + h]);
                M::scale(w_rows[h], j, d[h], m[h]);
            }
            // Activation block of the piece, and the lane's two rows'
            // (d, d·Σcodes) in each n8 tile.
            const int block = j * M::SUB / 32;
            int c[4][4];
            if constexpr (M::SUB == 32) {
#pragma unroll
                for (int pair = 0; pair < 2; pair++) {
                    uint32_t b[4];
                    const int row = 16 * pair + 8 * (matrix / 2) + matrix_row;
                    m40_load_matrices4(x_codes + row * M40_MMQ_X_STRIDE + 32 * j + 16 * (matrix % 2), b);
                    m40_mma_k32(a, b[0], b[1], c[2 * pair]);
                    m40_mma_k32(a, b[2], b[3], c[2 * pair + 1]);
                }
            } else {
                uint32_t b[4];
                m40_load_matrices4(x_codes + (8 * matrix + matrix_row) * M40_MMQ_X_STRIDE + 16 * j, b);
#pragma unroll
                for (int n = 0; n < 4; n++) m40_mma_k16(a, b[n], c[n]);
            }
#pragma unroll
            for (int n = 0; n < 4; n++) {
                const float4 xs = x_ds[block * (M40_MMQ_X / 2) + 4 * n + t];  // rows 8n + 2t, 8n + 2t + 1
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int h = e / 2;
                    const float x_d = e % 2 ? xs.z : xs.x, x_d_sum = e % 2 ? xs.w : xs.y;
                    float v = fmaf(m40_small_int_to_float(c[n][e]), d[h] * x_d, acc[n][e]);
                    if (M::OFFSET) v = fmaf(m[h], x_d_sum, v);
                    acc[n][e] = v;
                }
            }
        }
    }

    // acc[n][e]: weight row 16 warp + g + 8 (e / 2), activation row 8n + 2t + e % 2.
#pragma unroll
    for (int n = 0; n < 4; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int row = row0 + 16 * warp + g + 8 * (e / 2), x = x0 + 8 * n + 2 * t + e % 2;
            if (row >= p.rows || x >= n_x) continue;
            if (p.splits > 1) {
                p.partials[(size_t(blockIdx.y) * n_x + x) * p.rows + row] = acc[n][e];
            } else {
                const float value = acc[n][e] + (p.bias ? p.bias[row] : 0.0f);
                float *out = p.y + size_t(x) * p.rows + row;
                *out = p.accumulate ? *out + value : value;
            }
        }
#endif
}

// The splits' partial sums added in order, the bias, and the epilogue.
__global__ void mmq_combine_kernel(M40Mmq p) {
    m40_wait_for_prior_kernels();
    const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
    const size_t n = size_t(p.n_x) * p.rows;
    if (i >= n) return;
    float sum = 0.0f;
    for (int s = 0; s < p.splits; s++) sum += p.partials[s * n + i];
    const float value = sum + (p.bias ? p.bias[i % p.rows] : 0.0f);
    p.y[i] = p.accumulate ? p.y[i] + value : value;
}

// The formats with a tensor-core path.
constexpr bool m40_mmq_format(int type) {
    return type == M40_Q4_0 || type == M40_Q4_1 || type == M40_Q5_0 || type == M40_Q5_1 || type == M40_Q8_0 ||
           type == M40_Q4_K || type == M40_Q5_K || type == M40_Q6_K;
}

// Calls f(Mmq<TYPE>{}) for a format with a tensor-core path.
template <class F> static cudaError_t m40_with_mmq_format(int type, F &&f) {
    return m40_with_format(type, [&](auto format) {
        constexpr int TYPE = FormatType<decltype(format)>::value;
        if constexpr (m40_mmq_format(TYPE)) f(Mmq<TYPE>{});
    });
}

// Allows the kernel its shared memory (over the 48 KB default) on the
// current device; false where the device has less.
template <class M> static bool m40_mmq_allow_shared() {
    if (cudaFuncSetAttribute(mmq_kernel<M>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             m40_mmq_shared_bytes<M>()) == cudaSuccess)
        return true;
    cudaGetLastError();  // the caller reports the failure
    return false;
}

// Resident blocks of the kernel per SM, computed once for the device of the
// first call (another device only changes how K is split); 0 where its
// shared memory does not fit.
template <class M> static int m40_mmq_blocks_per_sm() {
    static const int blocks_per_sm = [] {
        int n = 0;
        if (!m40_mmq_allow_shared<M>() ||
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, mmq_kernel<M>, 32 * M40_MMQ_WARPS,
                                                          m40_mmq_shared_bytes<M>()) != cudaSuccess ||
            n < 1) {
            cudaGetLastError();
            n = 0;
        }
        return n;
    }();
    return blocks_per_sm;
}

// Whether this build runs the tensor-core products on the current device:
// its code there is sm_80 or newer (m40_code_version, gemv.cu).
static int m40_mmq_available() { return m40_code_version() >= 80; }

// Splits of K for a product: enough blocks for one wave of resident blocks,
// each split keeping at least M40_MMQ_MIN_STEPS steps (shorter splits spend
// their time filling the pipeline and writing partial sums). 0 where the
// device cannot run the kernel.
M40_EXPORT int m40_mmq_splits(int type, int rows, int cols, int n_x, int sm_count) {
    int splits = 0;
    if (!m40_mmq_format(type) || !m40_mmq_available()) return 0;
    m40_with_mmq_format(type, [&](auto m) {
        const int per_sm = m40_mmq_blocks_per_sm<decltype(m)>();
        if (per_sm < 1 || rows < 1 || cols < 1 || n_x < 1) return;
        const long tiles = long((rows + M40_MMQ_ROWS - 1) / M40_MMQ_ROWS) * ((n_x + M40_MMQ_X - 1) / M40_MMQ_X);
        const long resident = long(per_sm) * (sm_count > 0 ? sm_count : 1);
        const int steps = (cols + M40_MMQ_STEP - 1) / M40_MMQ_STEP;
        const long wanted = (resident + tiles - 1) / tiles;
        splits = int(max(1L, min(wanted, long(max(1, steps / M40_MMQ_MIN_STEPS)))));
    });
    return splits;
}

// y (n_x × rows) = (or +=) x · Wᵀ + bias on the tensor cores. cols: whole
// blocks of the format (whole super-blocks for the K formats).
M40_EXPORT cudaError_t m40_mmq(int type, const M40Mmq *params, cudaStream_t stream) {
    const M40Mmq &p = *params;
    if (p.rows < 1 || p.n_x < 1 || p.splits < 1 || p.cols % 32 != 0 || (p.splits > 1 && !p.partials) ||
        !m40_mmq_format(type))
        return cudaErrorInvalidValue;
    if ((type == M40_Q4_K || type == M40_Q5_K || type == M40_Q6_K) && p.cols % 256 != 0)
        return cudaErrorInvalidValue;
    if (!m40_mmq_available()) return cudaErrorInvalidDeviceFunction;
    cudaError_t status = cudaSuccess;
    const cudaError_t launched = m40_with_mmq_format(type, [&](auto m) {
        using M = decltype(m);
        // The attribute is the current device's: set it for every launch.
        if (m40_mmq_blocks_per_sm<M>() < 1 || !m40_mmq_allow_shared<M>()) {
            status = cudaErrorInvalidConfiguration;  // its shared memory does not fit
            return;
        }
        if (!p.x_quantized) m40_quantize_q8(p.overlap, p.x, nullptr, 0.0f, p.cols, p.n_x, p.x_q8, stream);
        const dim3 grid((p.rows + M40_MMQ_ROWS - 1) / M40_MMQ_ROWS, p.splits, (p.n_x + M40_MMQ_X - 1) / M40_MMQ_X);
        m40_launch_shared(p.overlap, mmq_kernel<M>, grid, 32 * M40_MMQ_WARPS, m40_mmq_shared_bytes<M>(), stream, p);
        if (p.splits > 1)
            m40_launch(p.overlap, mmq_combine_kernel, dim3(m40_blocks(size_t(p.n_x) * p.rows, 256)), 256, stream, p);
    });
    return status != cudaSuccess ? status : launched;
}
