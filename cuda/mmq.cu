// Quantized weights times many activation rows on f16 tensor cores (sm_80+):
// the products of batched decode past M40_GEMV_MAX_X sessions and of short
// prompt chunks.
//
// At 32 sessions a step multiplies every weight by 32 rows. gemv.cu's
// kernels keep a row's sums per lane and would spend 32 dp4a-sized steps per
// weight; cuBLAS would need every weight dequantized to f16 and written out
// first (13 GB a step for llama-7b). Here each weight is decoded from its
// block straight into an f16 tensor-core fragment, scale and minimum
// applied (d·(code − zero) + m in f16), and multiplied with
// f16 activation rows by mma.sync into FP32 sums; the weights are read once
// per tile of activation rows. f16 rather than int8 fragments: with 8-bit
// codes on both sides, every 32-value block's integer sum would need its own
// conversion and product of two scales for each (weight row, activation
// row) pair, where f16 fragments sum in FP32 inside the tensor cores across
// a split's whole K range; int8 fragments measured slower on the H100
// (docs/cuda.md).
//
//   - Activation rows are converted to f16 first, normalized on the way
//     where a norm precedes the product (m40_rows_to_f16's power-of-two row
//     scales keep them in range; the epilogue multiplies them back), with
//     each 16 values in the order the weights decode to (m40_mmq_order
//     below), so that no byte shuffles are needed.
//   - A block of 8 warps takes 128 weight rows × X activation rows (16 or
//     32); warp w takes rows 16w..16w+15 as one m16 tile against X / 8 n8
//     tiles.
//   - K goes in steps of 256 values (a super-block, or 8 blocks of 32). Each
//     step's weight bytes and activations are copied to shared memory by
//     cp.async, the next step's copies running under this step's math.
//   - The K range may be split over several blocks (the grid's y): a llama-7b
//     attention matrix has only 32 row tiles, too few to keep the memory
//     busy. Each split writes its partial sums; a second kernel adds them in
//     order (the result does not depend on timing) and applies the epilogue.
//
// The rounding is that of prefill's cuBLAS products, f16 weights and
// activations and FP32 sums, but for the K formats' scales and minima
// (products of two stored numbers), which are rounded to f16 first.
//
// Included after matmul.cu (rows_to_f16_kernel) and gemv.cu
// (m40_code_version), as m40llm.cu does.
#include "quant.cuh"

#include <type_traits>

#define M40_MMQ_WARPS 8
#define M40_MMQ_ROWS (16 * M40_MMQ_WARPS)  // weight rows per block
// Activation rows per block: X, 16 or 32 (M40MmqTile). Up to 16 rows the
// smaller tile does half the work of a 32-row one, whose spare rows would
// repeat the last row's work.
#define M40_MMQ_STEP 256                   // values of K per pipeline step
// Steps in shared memory at once (double buffering), and the fewest a split
// of K keeps. Two stages let the next step's copies run under this step's
// math; a third costs shared memory, so fewer resident blocks, and gains
// nothing: the kernel is held by each warp's chain of shared-memory loads,
// decode and mma, not by the copies' latency. A split of fewer steps spends
// its time filling the pipeline and writing partial sums. Both measured on
// the H100 (3 stages, at least 4 steps: no faster).
#define M40_MMQ_STAGES 2
#define M40_MMQ_MIN_STEPS 2
// Bytes of an activation row in a stage: 256 f16 plus 16, so that the 8
// rows one ldmatrix reads fall in different banks.
#define M40_MMQ_X_STRIDE (2 * M40_MMQ_STEP + 16)

// Mirrors `MmqLaunch` in src/backend/cuda/kernels.rs.
struct M40Mmq {
    const uint8_t *w;
    int rows, cols;
    // x as f16 in m40_mmq_order (n_x rows of cols) with its row scales
    // (m40_mmq_activations).
    const uint16_t *x_f16;
    const float *x_scales;
    int n_x;
    // rows f32, or null; with experts, expert 0's row of a table (M40Experts::bias_stride).
    const float *bias;
    float *y;           // n_x rows of `rows` values
    int accumulate;     // y += product instead of y = product
    // Splits of K (m40_mmq_splits), and their partial sums: splits × n_x ×
    // rows f32, unused when splits is 1.
    int splits;
    float *partials;
    int overlap;
    // Expert matrices (a mixture of experts' products), or work null: then
    // the grid's z takes the work pieces, n_x is the most rows of one (the
    // tile), splits is 1, and every row index is into the sorted rows.
    M40Experts experts;
};

// ---- per-format decoding ----
// The unit is a group of 16 consecutive values of K. An m16n8k16 A fragment
// gives lane t (0..3) of a row K slots 2t, 2t+1 (register a0) and 2t+8,
// 2t+9 (a2). A format hands lane t the codes of values 4t..4t+3 of group q
// as one word of 4 bytes (its natural load); the even bytes (values 4t,
// 4t+2) become a0 and the odd bytes (4t+1, 4t+3) a2, each pair by one mask
// into f16 bits. The activations are stored in the matching order: slot s
// of a group holds value m40_mmq_order(s).
__host__ __device__ constexpr int m40_mmq_order(int slot) {
    return 4 * (slot % 8 / 2) + 2 * (slot % 2) + slot / 8;
}

struct M40MmqOrder {
    __device__ int operator()(int i) const { return (i & ~15) | m40_mmq_order(i & 15); }
};

// Mmq<TYPE>: VALUES and BYTES per block; codes(s, t, q): the 4 unsigned
// codes of values 4t..4t+3 of group q (0..15) of a row's 256-value step at
// s; scale(s, q, d, m): the group's scale and minimum, weight = d · (code −
// ZERO) + m, shared by SCALE_GROUPS consecutive groups (q a multiple of
// it); MIN: whether m can be non-zero.
template <int TYPE> struct Mmq;

// Q4_0 / Q4_1 / Q5_0 / Q5_1 (NibbleBlock, quant.cuh): block b is groups 2b
// (low nibbles) and 2b + 1 (high nibbles).
template <class L> struct MmqNibbles : L {
    static constexpr int SCALE_GROUPS = 2;
    __device__ static uint32_t codes(const uint8_t *s, int t, int q) {
        const uint8_t *b = s + q / 2 * L::BYTES;
        return L::codes(b, L::fifth_bits(b), t, q % 2);
    }
    __device__ static void scale(const uint8_t *s, int q, float &d, float &m) {
        d = m40_f16(s + q / 2 * L::BYTES);
        m = L::MIN ? m40_f16(s + q / 2 * L::BYTES + 2) : 0.0f;
    }
};

template <> struct Mmq<M40_Q4_0> : MmqNibbles<NibbleBlock<M40_Q4_0>> {};
template <> struct Mmq<M40_Q4_1> : MmqNibbles<NibbleBlock<M40_Q4_1>> {};
template <> struct Mmq<M40_Q5_0> : MmqNibbles<NibbleBlock<M40_Q5_0>> {};
template <> struct Mmq<M40_Q5_1> : MmqNibbles<NibbleBlock<M40_Q5_1>> {};

// Q8_0: signed codes, offset by 128 into unsigned ones.
template <> struct Mmq<M40_Q8_0> {
    static constexpr int VALUES = 32, BYTES = 34, ZERO = 128, SCALE_GROUPS = 2;
    static constexpr bool MIN = false;
    __device__ static uint32_t codes(const uint8_t *s, int t, int q) {
        return m40_u32_2(s + q / 2 * BYTES + 2 + 16 * (q % 2) + 4 * t) ^ 0x80808080u;
    }
    __device__ static void scale(const uint8_t *s, int q, float &d, float &m) {
        d = m40_f16(s + q / 2 * BYTES);
        m = 0.0f;
    }
};

// Q4_K / Q5_K: sub-block j = q / 2's codes are the low (j even) or high
// nibbles of quant bytes 32 (j / 2) .. + 31, code i at byte i; Q5_K's fifth
// bit of code i is bit j of qh byte i.
template <int TYPE, int QS, int QH> struct MmqK {
    static constexpr int VALUES = 256, BYTES = TYPE == M40_Q4_K ? 144 : 176, ZERO = 0, SCALE_GROUPS = 2;
    static constexpr bool MIN = true;
    __device__ static uint32_t codes(const uint8_t *s, int t, int q) {
        const int j = q / 2, i = 16 * (q % 2) + 4 * t;
        uint32_t c = (m40_u32_4(s + QS + 32 * (j / 2) + i) >> (4 * (j % 2))) & 0x0F0F0F0Fu;
        if (QH >= 0) c |= ((m40_u32_4(s + QH + i) >> j) & 0x01010101u) << 4;
        return c;
    }
    __device__ static void scale(const uint8_t *s, int q, float &d, float &m) {
        int scale, min;
        m40_k_scale_min(s + 4, q / 2, scale, min);
        d = m40_f16(s) * float(scale);
        m = -m40_f16(s + 2) * float(min);
    }
};

template <> struct Mmq<M40_Q4_K> : MmqK<M40_Q4_K, 16, -1> {};
template <> struct Mmq<M40_Q5_K> : MmqK<M40_Q5_K, 48, 16> {};

// Q6_K: a scale per group. Value v = 16q + l of the super-block: half h =
// q / 8, quarter g = (q % 8) / 2, position 16 (q % 2) + l in the quarter;
// low nibbles from ql byte 64h + 32 (g % 2) + position, shifted by 4 (g /
// 2), high bits from qh byte 32h + position at bit 2g; codes q − 32.
template <> struct Mmq<M40_Q6_K> {
    static constexpr int VALUES = 256, BYTES = 210, ZERO = 32, SCALE_GROUPS = 1;
    static constexpr bool MIN = false;
    __device__ static uint32_t codes(const uint8_t *s, int t, int q) {
        const int h = q / 8, g = (q % 8) / 2, position = 16 * (q % 2) + 4 * t;
        const uint32_t ql = m40_u32_2(s + 64 * h + 32 * (g % 2) + position);
        const uint32_t qh = m40_u32_2(s + 128 + 32 * h + position);
        return ((ql >> (4 * (g / 2))) & 0x0F0F0F0Fu) | (((qh >> (2 * g)) & 0x03030303u) << 4);
    }
    __device__ static void scale(const uint8_t *s, int q, float &d, float &m) {
        d = m40_f16(s + 208) * float(int8_t(s[192 + q]));
        m = 0.0f;
    }
};

// The table-lookup formats (quant.cuh): a code's table value offset by 128
// into an unsigned byte, so that d · (code − 128) is d times the value, as
// their FP32 decode has it (the product rounded to f16 here). IQ4_NL's and
// MXFP4's blocks are 32 values, group 2b the low nibbles of block b's 16
// quant bytes and 2b + 1 the high ones; IQ4_XS's sub-block j of 32 is
// groups 2j and 2j + 1 likewise. An MXFP4 scale outside f16's range (2^−24
// to 2^15; ggml's exponents 104 to 143) is rounded into it, where the FP32
// path keeps it.
__device__ __forceinline__ uint32_t m40_mmq_lookup(uint32_t quant_bytes, int high, uint4 table) {
    return m40_lookup4((quant_bytes >> (4 * high)) & 0x0F0F0F0Fu, table) ^ 0x80808080u;
}

template <> struct Mmq<M40_IQ4_NL> {
    static constexpr int VALUES = 32, BYTES = 18, ZERO = 128, SCALE_GROUPS = 2;
    static constexpr bool MIN = false;
    __device__ static uint32_t codes(const uint8_t *s, int t, int q) {
        return m40_mmq_lookup(m40_u32_2(s + q / 2 * BYTES + 2 + 4 * t), q % 2, m40_iq4_values());
    }
    __device__ static void scale(const uint8_t *s, int q, float &d, float &m) {
        d = m40_f16(s + q / 2 * BYTES);
        m = 0.0f;
    }
};

// MXFP4's 17-byte blocks leave its quant bytes at any alignment.
template <> struct Mmq<M40_MXFP4> {
    static constexpr int VALUES = 32, BYTES = 17, ZERO = 128, SCALE_GROUPS = 2;
    static constexpr bool MIN = false;
    __device__ static uint32_t codes(const uint8_t *s, int t, int q) {
        const uint8_t *b = s + q / 2 * BYTES + 1 + 4 * t;
        const uint32_t bytes = uint32_t(b[0]) | uint32_t(b[1]) << 8 | uint32_t(b[2]) << 16 | uint32_t(b[3]) << 24;
        return m40_mmq_lookup(bytes, q % 2, m40_mxfp4_values());
    }
    __device__ static void scale(const uint8_t *s, int q, float &d, float &m) {
        d = m40_e8m0_half(s[q / 2 * BYTES]);
        m = 0.0f;
    }
};

template <> struct Mmq<M40_IQ4_XS> {
    static constexpr int VALUES = 256, BYTES = 136, ZERO = 128, SCALE_GROUPS = 2;
    static constexpr bool MIN = false;
    __device__ static uint32_t codes(const uint8_t *s, int t, int q) {
        return m40_mmq_lookup(m40_u32_4(s + 8 + 16 * (q / 2) + 4 * t), q % 2, m40_iq4_values());
    }
    __device__ static void scale(const uint8_t *s, int q, float &d, float &m) {
        d = m40_iq4_xs_scale(s, q / 2);
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

// Shared memory of one stage: weight rows, then X activation rows.
template <class M, int X> __host__ __device__ constexpr int m40_mmq_stage_bytes() {
    return M40_MMQ_ROWS * m40_mmq_row_vectors<M>() * 16 + X * M40_MMQ_X_STRIDE;
}

template <class M, int X> constexpr int m40_mmq_shared_bytes() { return M40_MMQ_STAGES * m40_mmq_stage_bytes<M, X>(); }

// The activation-row tile of a product of n_x rows.
template <int X_> struct M40MmqTile {
    static constexpr int X = X_;
};

// (Defined below the kernel.)
template <class M, int X> static int m40_mmq_blocks_per_sm();

// Calls f(M40MmqTile<X>{}) with the tile of a product of n_x rows: 16 up
// to 16 rows, or where the 32-row tile's shared memory does not fit (Q8_0
// on GPUs with 99 KB a block); 32 otherwise.
template <class M, class F> static void m40_with_mmq_tile(int n_x, F &&f) {
    if (n_x <= 16 || m40_mmq_blocks_per_sm<M, 32>() < 1)
        f(M40MmqTile<16>{});
    else
        f(M40MmqTile<32>{});
}

// ---- sm_80 instructions ----
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
__device__ __forceinline__ uint32_t m40_shared_address(const void *p) {
    return uint32_t(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void m40_copy16_async(void *shared, const void *global) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(m40_shared_address(shared)), "l"(global));
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

// c += A (16 × 16 f16) · B (16 × 8 f16), FP32 sums.
__device__ __forceinline__ void m40_mma_f16(const uint32_t *a, uint32_t b0, uint32_t b1, float *c) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t m40_half2_bits(__half2 h) { return *reinterpret_cast<uint32_t *>(&h); }

// Codes c (4 bytes, values 4t..4t+3 of a group) as the f16 weight pairs
// (values 4t, 4t+2) and (4t+1, 4t+3): d · (code − ZERO) + m, d and m the
// halves of `scale`. A code below 1024 in the low mantissa bits of 1024.0 is
// 1024 + code exactly, and so is the subtraction; only the final
// multiply-add rounds.
template <class M>
__device__ __forceinline__ void m40_mmq_weights(uint32_t c, uint32_t scale, uint32_t &even, uint32_t &odd) {
    const uint32_t exponent = 0x64006400u;  // 1024.0 in both halves
    const __half2 zero = __float2half2_rn(float(1024 + M::ZERO));
    const __half2 dm = *reinterpret_cast<const __half2 *>(&scale);
    const __half2 d = __low2half2(dm), m = __high2half2(dm);
    const uint32_t pairs[2] = {(c & 0x00FF00FFu) | exponent, ((c >> 8) & 0x00FF00FFu) | exponent};
    uint32_t out[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const __half2 code = __hsub2(*reinterpret_cast<const __half2 *>(&pairs[i]), zero);
        out[i] = m40_half2_bits(M::MIN ? __hfma2(code, d, m) : __hmul2(code, d));
    }
    even = out[0];
    odd = out[1];
}
#endif

// The kernel. Grid: (row tiles, splits of K, tiles of X activation rows).
template <class M, int X> __global__ void __launch_bounds__(32 * M40_MMQ_WARPS) mmq_kernel(M40Mmq p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    extern __shared__ uint4 m40_mmq_shared[];
    constexpr int THREADS = 32 * M40_MMQ_WARPS, GROUPS = M40_MMQ_STEP / 16;
    constexpr int ROW_VECTORS = m40_mmq_row_vectors<M>(), STEP_BYTES = m40_mmq_step_bytes<M>();
    constexpr int STAGE_BYTES = m40_mmq_stage_bytes<M, X>(), W_VECTORS = M40_MMQ_ROWS * ROW_VECTORS;
    // A thread's 16-byte copies per step: weights (the last one for the
    // first threads only) and activations (32 vectors a row).
    constexpr int W_COPIES = (W_VECTORS + THREADS - 1) / THREADS, X_COPIES = X * 32 / THREADS;
    // Scale units (groups sharing a scale) of a step, and how many of each
    // row's units each of the row's four lanes decodes.
    constexpr int UNITS = GROUPS / M::SCALE_GROUPS, LANE_UNITS = UNITS / 4;
    static_assert(UNITS % 4 == 0 && LANE_UNITS >= 1, "a row's four lanes share its scale units evenly");
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
    const int row0 = blockIdx.x * M40_MMQ_ROWS;
    int x0 = blockIdx.z * X, n_x = p.n_x;
    const uint8_t *w = p.w;
    const float *bias = p.bias;
    if (p.experts.work) {
        m40_wait_for_prior_kernels();
        const M40ExpertWork work = p.experts.work[blockIdx.z];
        if (work.count == 0) return;
        w = m40_expert_matrix(p.experts, w, 0, work.expert);
        bias = m40_expert_bias(p.experts, bias, work.expert);
        x0 = work.first;
        n_x = work.first + work.count;  // the bound of x's rows below
    }
    const int cols = p.cols;
    const size_t row_bytes = size_t(cols / M::VALUES) * M::BYTES;
    const int steps = (cols + M40_MMQ_STEP - 1) / M40_MMQ_STEP;
    const int step_begin = blockIdx.y * steps / p.splits, step_end = (blockIdx.y + 1) * steps / p.splits;
    const int n_steps = step_end - step_begin;
    uint8_t *shared = reinterpret_cast<uint8_t *>(m40_mmq_shared);

    // Rows past the matrix or the batch read its last row and are not written.
    const auto weight_row = [&](int r) { return w + size_t(min(row0 + r, p.rows - 1)) * row_bytes; };

    // The thread's copies, found once (a step adds its offset): weight copy
    // j is vector v of row r of the stage, i = thread + THREADS j = r ·
    // ROW_VECTORS + v, read from the row's step start rounded down to 16
    // bytes; activation copy j is vector `lane` of row warp + 8j.
    const uint8_t *w_sources[W_COPIES];
    int w_offsets[W_COPIES];
#pragma unroll
    for (int j = 0; j < W_COPIES; j++) {
        const int i = threadIdx.x + THREADS * j, v = i % ROW_VECTORS;
        w_sources[j] = weight_row(min(i / ROW_VECTORS, M40_MMQ_ROWS - 1)) + 16 * v;
        w_offsets[j] = 16 * v;
    }
    const uint16_t *x_sources[X_COPIES];
#pragma unroll
    for (int j = 0; j < X_COPIES; j++)
        x_sources[j] = p.x_f16 + size_t(min(x0 + warp + THREADS / 32 * j, n_x - 1)) * cols + 8 * lane;

    // Step k's weights and activations into stage `stage`.
    const auto fetch = [&](int stage, int k) {
        uint8_t *base = shared + stage * STAGE_BYTES;
        const int values = min(M40_MMQ_STEP, cols - k * M40_MMQ_STEP);
        const int bytes = values / M::VALUES * M::BYTES;
#pragma unroll
        for (int j = 0; j < W_COPIES; j++) {
            const uint8_t *source = w_sources[j] + size_t(k) * STEP_BYTES;
            const int misalignment = int(uintptr_t(source) & 15);
            if ((W_VECTORS % THREADS == 0 || threadIdx.x + THREADS * j < W_VECTORS) &&
                w_offsets[j] < bytes + misalignment)
                m40_copy16_async(base + 16 * (threadIdx.x + THREADS * j), source - misalignment);
        }
#pragma unroll
        for (int j = 0; j < X_COPIES; j++)
            if (lane < values / 8)
                m40_copy16_async(base + W_VECTORS * 16 + (warp + THREADS / 32 * j) * M40_MMQ_X_STRIDE + 16 * lane,
                                 x_sources[j] + size_t(k) * M40_MMQ_STEP);
    };

    // The activations (and y) are the previous kernel's.
    float acc[X / 8][4] = {};
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
        const uint8_t *x_rows = base + W_VECTORS * 16;
        const int groups = min(M40_MMQ_STEP, cols - k * M40_MMQ_STEP) / 16;

        // A row's scales are decoded once, each of its four lanes taking
        // LANE_UNITS units (every lane decoding every unit would be about a
        // third of the kernel's instructions); the group loop fetches them
        // by shuffle. Packed as f16 (d, m).
        uint32_t lane_scales[2][LANE_UNITS];
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int u = 0; u < LANE_UNITS; u++) {
                const int q = (t * LANE_UNITS + u) * M::SCALE_GROUPS;
                float d = 0.0f, m = 0.0f;
                if (q < groups) M::scale(w_rows[h], q, d, m);
                lane_scales[h][u] = m40_half2_bits(__floats2half2_rn(d, m));
            }

        // The lane's ldmatrix row: activation row 8 (lane / 16) + lane % 8
        // of an n8 tile pair, K slots 0..7 or 8..15 (lane / 8 % 2).
        const int matrix = lane / 8, matrix_row = lane % 8;
        // `whole`: the step has all its groups, and the loop has no exits, so
        // that the compiler can interleave the groups' loads and products.
        const auto multiply = [&](auto whole) {
            uint32_t scales[2];
#pragma unroll
            for (int q = 0; q < GROUPS; q++) {
                if (!decltype(whole)::value && q >= groups) break;
                if (q % M::SCALE_GROUPS == 0) {
                    const int unit = q / M::SCALE_GROUPS;
#pragma unroll
                    for (int h = 0; h < 2; h++)
                        scales[h] = __shfl_sync(0xFFFFFFFFu, lane_scales[h][unit % LANE_UNITS],
                                                (lane & ~3) | unit / LANE_UNITS);
                }
                uint32_t a[4];
#pragma unroll
                for (int h = 0; h < 2; h++) m40_mmq_weights<M>(M::codes(w_rows[h], t, q), scales[h], a[h], a[2 + h]);
#pragma unroll
                for (int pair = 0; pair < X / 16; pair++) {
                    uint32_t b[4];
                    const int row = 16 * pair + 8 * (matrix / 2) + matrix_row;
                    m40_load_matrices4(x_rows + row * M40_MMQ_X_STRIDE + 32 * q + 16 * (matrix % 2), b);
                    m40_mma_f16(a, b[0], b[1], acc[2 * pair]);
                    m40_mma_f16(a, b[2], b[3], acc[2 * pair + 1]);
                }
            }
        };
        if (groups == GROUPS)
            multiply(std::true_type{});
        else
            multiply(std::false_type{});
    }

    // acc[n][e]: weight row 16 warp + g + 8 (e / 2), activation row 8n + 2t + e % 2.
#pragma unroll
    for (int n = 0; n < X / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int row = row0 + 16 * warp + g + 8 * (e / 2), x = x0 + 8 * n + 2 * t + e % 2;
            if (row >= p.rows || x >= n_x) continue;
            if (p.splits > 1) {
                p.partials[(size_t(blockIdx.y) * n_x + x) * p.rows + row] = acc[n][e];
            } else {
                const float value = acc[n][e] * p.x_scales[x] + (bias ? bias[row] : 0.0f);
                float *out = p.y + size_t(x) * p.rows + row;
                *out = p.accumulate ? *out + value : value;
            }
        }
#endif
}

// The splits' partial sums added in order, the row scale, the bias, and the
// epilogue.
__global__ void mmq_combine_kernel(M40Mmq p) {
    m40_wait_for_prior_kernels();
    const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
    const size_t n = size_t(p.n_x) * p.rows;
    if (i >= n) return;
    float sum = 0.0f;
    for (int s = 0; s < p.splits; s++) sum += p.partials[s * n + i];
    const float value = sum * p.x_scales[i / p.rows] + (p.bias ? p.bias[i % p.rows] : 0.0f);
    p.y[i] = p.accumulate ? p.y[i] + value : value;
}

// The formats with a tensor-core path.
constexpr bool m40_mmq_format(int type) {
    return type == M40_Q4_0 || type == M40_Q4_1 || type == M40_Q5_0 || type == M40_Q5_1 || type == M40_Q8_0 ||
           type == M40_Q4_K || type == M40_Q5_K || type == M40_Q6_K || type == M40_IQ4_NL || type == M40_MXFP4 ||
           type == M40_IQ4_XS;
}

// Calls f(Mmq<TYPE>{}) for a format with a tensor-core path.
template <class F> static cudaError_t m40_with_mmq_format(int type, F &&f) {
    return m40_with_format(type, [&](auto format) {
        constexpr int TYPE = FormatType<decltype(format)>::value;
        if constexpr (m40_mmq_format(TYPE)) f(Mmq<TYPE>{});
    });
}

// The shared memory a block asks for: its stages, or half of an SM's
// shared memory where that is more, so that no more than two blocks share
// an SM. The splits (m40_mmq_splits) launch about two blocks an SM; where
// three fit, a launch that starts while the previous kernel still runs
// (overlapping launches) could find some SMs full and stack three blocks
// on others, which then set the product's time (measured slower on the
// H100 than two blocks an SM). Per device, like m40_mmq_blocks_per_sm.
template <class M, int X> static int m40_mmq_block_shared() {
    return m40_per_device([](int device) {
        int per_sm = 0, reserved = 0, per_block = 0;
        if (cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device) != cudaSuccess ||
            cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, device) != cudaSuccess ||
            cudaDeviceGetAttribute(&per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess) {
            cudaGetLastError();
            return m40_mmq_shared_bytes<M, X>();
        }
        return max(m40_mmq_shared_bytes<M, X>(), min(per_sm / 2 - reserved, per_block));
    });
}

// Allows the kernel its shared memory (over the 48 KB default) on the
// current device; false where the device has less (that device then keeps
// cuBLAS and the decode kernel for these products).
template <class M, int X> static bool m40_mmq_allow_shared() {
    if (cudaFuncSetAttribute(mmq_kernel<M, X>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             m40_mmq_block_shared<M, X>()) == cudaSuccess)
        return true;
    cudaGetLastError();  // the caller reports the failure
    return false;
}

// Resident blocks of the kernel per SM on the current device: 0 where this
// build has no sm_80+ code there (m40_code_version, gemv.cu) or the
// kernel's shared memory does not fit. After a device's first call, a read.
template <class M, int X> static int m40_mmq_blocks_per_sm() {
    return m40_per_device([](int) {
        int n = 0;
        if (m40_code_version() < 80 || !m40_mmq_allow_shared<M, X>() ||
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, mmq_kernel<M, X>, 32 * M40_MMQ_WARPS,
                                                          m40_mmq_block_shared<M, X>()) != cudaSuccess ||
            n < 1) {
            cudaGetLastError();
            n = 0;
        }
        return n;
    });
}

// 1 where the current device runs tensor-core products of `type`: this
// build's sm_80+ code runs there and the 16-row tile's shared memory fits
// (the 32-row tile is used where it fits too). The kernel's shared-memory
// allowance belongs to the device, so this is called once per device (with
// it current) before its first m40_mmq.
M40_EXPORT int m40_mmq_prepare(int type) {
    int ready = 0;
    if (!m40_mmq_format(type) || m40_code_version() < 80) return 0;
    m40_with_mmq_format(type, [&](auto m) {
        using M = decltype(m);
        ready = m40_mmq_blocks_per_sm<M, 16>() >= 1 && m40_mmq_allow_shared<M, 16>();
        if (ready && m40_mmq_blocks_per_sm<M, 32>() >= 1) ready = m40_mmq_allow_shared<M, 32>();
    });
    return ready;
}

// Splits of K for a product: a block for each resident slot (two an SM at
// most, m40_mmq_block_shared), each split keeping at least
// M40_MMQ_MIN_STEPS steps (shorter splits spend their time filling the
// pipeline and writing partial sums), and never a second, partial wave,
// which costs nearly a whole one (on the H100 every product measured
// fastest at about two blocks an SM and at most one wave). 0 for a
// format without the path or where its tile cannot run (no sm_80+ code,
// too little shared memory).
// Rows of one expert work piece on the tensor cores for a step of n_rows
// rows (the tile a launch of min(n_rows, 32) rows takes), or 0 where `type`
// has no tensor-core kernel here.
M40_EXPORT int m40_mmq_expert_rows(int type, int n_rows) {
    int rows = 0;
    if (!m40_mmq_format(type) || m40_code_version() < 80 || n_rows < 1) return 0;
    m40_with_mmq_format(type, [&](auto m) {
        m40_with_mmq_tile<decltype(m)>(n_rows < 32 ? n_rows : 32, [&](auto tile) { rows = decltype(tile)::X; });
    });
    return rows;
}

M40_EXPORT int m40_mmq_splits(int type, int rows, int cols, int n_x, int sm_count) {
    int splits = 0;
    if (!m40_mmq_format(type) || rows < 1 || cols < 1 || n_x < 1) return 0;
    m40_with_mmq_format(type, [&](auto m) {
        m40_with_mmq_tile<decltype(m)>(n_x, [&](auto tile) {
            constexpr int X = decltype(tile)::X;
            const int per_sm = m40_mmq_blocks_per_sm<decltype(m), X>();
            if (per_sm < 1) return;
            const long tiles = long((rows + M40_MMQ_ROWS - 1) / M40_MMQ_ROWS) * ((n_x + X - 1) / X);
            const long slots = long(per_sm) * (sm_count > 0 ? sm_count : 1);
            const int steps = (cols + M40_MMQ_STEP - 1) / M40_MMQ_STEP;
            splits = int(max(1L, min(slots / tiles, long(max(1, steps / M40_MMQ_MIN_STEPS)))));
        });
    });
    return splits;
}

// y (n_x × rows) = (or +=) x · Wᵀ + bias on the tensor cores, on a device
// m40_mmq_prepare accepted `type` for. cols: whole blocks of the format
// (whole super-blocks for the K formats).
M40_EXPORT cudaError_t m40_mmq(int type, const M40Mmq *params, cudaStream_t stream) {
    const M40Mmq &p = *params;
    if (p.rows < 1 || p.n_x < 1 || p.splits < 1 || p.cols % 32 != 0 || (p.splits > 1 && !p.partials) ||
        !m40_mmq_format(type))
        return cudaErrorInvalidValue;
    if ((type == M40_Q4_K || type == M40_Q5_K || type == M40_Q6_K || type == M40_IQ4_XS) && p.cols % 256 != 0)
        return cudaErrorInvalidValue;
    if (p.experts.work && (p.splits != 1 || p.experts.n_work < 1 || p.experts.n_work > 65535 ||
                           p.experts.expert_bytes < 0 || p.experts.bias_stride < 0 || p.n_x > 32))
        return cudaErrorInvalidValue;
    cudaError_t status = cudaSuccess;
    const cudaError_t launched = m40_with_mmq_format(type, [&](auto m) {
        using M = decltype(m);
        m40_with_mmq_tile<M>(p.n_x, [&](auto tile) {
            constexpr int X = decltype(tile)::X;
            if (m40_mmq_blocks_per_sm<M, X>() < 1) {
                status = cudaErrorInvalidDeviceFunction;  // no sm_80+ code here, or too little shared memory
                return;
            }
            const dim3 grid((p.rows + M40_MMQ_ROWS - 1) / M40_MMQ_ROWS, p.splits,
                            p.experts.work ? p.experts.n_work : (p.n_x + X - 1) / X);
            m40_launch_shared(p.overlap, mmq_kernel<M, X>, grid, 32 * M40_MMQ_WARPS, m40_mmq_block_shared<M, X>(),
                              stream, p);
            if (p.splits > 1)
                m40_launch(p.overlap, mmq_combine_kernel, dim3(m40_blocks(size_t(p.n_x) * p.rows, 256)), 256,
                           stream, p);
        });
    });
    return status != cudaSuccess ? status : launched;
}

// x (n_rows × cols f32), or norm(x) where `norm` (cols weights, and eps) is
// given, on the 8-bit grid `grid_scales` says (M40ActivationScales: the
// products' format's), as f16 rows in m40_mmq_order scaled into f16's
// range, with their row scales (rows_to_operand_kernel, matmul.cu): the
// input of m40_mmq launches (one conversion serves every matrix of an input
// whose format keeps the same grid). With the norm the conversion saves the
// norm's own launch and pass over the rows.
M40_EXPORT cudaError_t m40_mmq_activations(int overlap, const float *x, const float *norm, float eps, int n_rows,
                                           int cols, int grid_scales, uint16_t *x_f16, float *x_scales,
                                           cudaStream_t stream) {
    if (cols % 16 != 0) return cudaErrorInvalidValue;
    return m40_rows_to_operand<__half, M40MmqOrder>(overlap, x, norm, eps, n_rows, cols, grid_scales,
                                                    reinterpret_cast<__half *>(x_f16), x_scales, stream);
}
