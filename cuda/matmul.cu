// Weight-reading kernels besides decode's products (gemv.cu): dequantization
// of row bands to f32 or f16 (prefill through cuBLAS, one-row weights at
// load), the embedding lookup, and the f16 activation rows of prefill's
// tensor-core products.
#include "q8.cuh"

#include <type_traits>

// Stores 16 consecutive values as f32 (four 16-byte stores) or f16 (two).
__device__ __forceinline__ void m40_store16(float *o, const float *v, float scale) {
    float4 *p = reinterpret_cast<float4 *>(o);
#pragma unroll
    for (int j = 0; j < 4; j++)
        p[j] = make_float4(v[4 * j] * scale, v[4 * j + 1] * scale, v[4 * j + 2] * scale, v[4 * j + 3] * scale);
}

__device__ __forceinline__ uint32_t m40_pack_half2(float lo, float hi) {
    return uint32_t(__half_as_ushort(__float2half_rn(lo))) | (uint32_t(__half_as_ushort(__float2half_rn(hi))) << 16);
}

__device__ __forceinline__ void m40_store16(__half *o, const float *v, float scale) {
    uint4 *p = reinterpret_cast<uint4 *>(o);
#pragma unroll
    for (int j = 0; j < 2; j++) {
        const float *u = v + 8 * j;
        p[j] = make_uint4(m40_pack_half2(u[0] * scale, u[1] * scale), m40_pack_half2(u[2] * scale, u[3] * scale),
                          m40_pack_half2(u[4] * scale, u[5] * scale), m40_pack_half2(u[6] * scale, u[7] * scale));
    }
}

// out[i][·] = row src_rows[i] (or i when src_rows is null) of W, times scale,
// as f32 or f16 (Out).
template <class F, class Out>
__global__ void dequantize_kernel(const uint8_t *__restrict__ w, int cols, const int *__restrict__ src_rows,
                                  int n_rows, float scale, Out *__restrict__ out) {
    constexpr int PARTS = F::VALUES / 16;
    const int parts_per_row = cols / 16;
    const size_t index = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (index >= size_t(n_rows) * parts_per_row) return;
    const int i = int(index / parts_per_row), p = int(index % parts_per_row);
    const size_t src = src_rows ? size_t(src_rows[i]) : size_t(i);
    const size_t row_bytes = size_t(cols / F::VALUES) * F::BYTES;
    float v[16];
    F::decode16(w + src * row_bytes + size_t(p / PARTS) * F::BYTES, p % PARTS, v);
    m40_store16(out + size_t(i) * cols + 16 * p, v, scale);
}

template <class Out>
static cudaError_t m40_dequantize_band(int type, const uint8_t *w, int cols, int first_row, int n_rows, Out *out,
                                       cudaStream_t stream) {
    if (cols % 32 != 0 || n_rows < 1) return cudaErrorInvalidValue;
    const size_t n = size_t(n_rows) * (cols / 16);
    return m40_with_format(type, [&](auto f) {
        using F = decltype(f);
        const uint8_t *band = w + size_t(first_row) * (cols / F::VALUES) * F::BYTES;
        dequantize_kernel<F, Out><<<m40_blocks(n, 256), 256, 0, stream>>>(band, cols, nullptr, n_rows, 1.0f, out);
    });
}

// Rows first_row .. first_row + n_rows of W as f32 (n_rows × cols).
M40_EXPORT cudaError_t m40_dequantize_rows(int type, const uint8_t *w, int cols, int first_row, int n_rows,
                                           float *out, cudaStream_t stream) {
    return m40_dequantize_band(type, w, cols, first_row, n_rows, out, stream);
}

// The same rows as f16 (each value rounded to nearest), for tensor-core products.
M40_EXPORT cudaError_t m40_dequantize_rows_f16(int type, const uint8_t *w, int cols, int first_row, int n_rows,
                                               uint16_t *out, cudaStream_t stream) {
    return m40_dequantize_band(type, w, cols, first_row, n_rows, reinterpret_cast<__half *>(out), stream);
}

#define M40_ROW_THREADS 256

// Values of a row each block of rows_to_f16_kernel converts (a multiple of
// 16): a few rows are each spread over several blocks, ~256 blocks in all,
// each block finding the row's largest magnitude (and with a norm its sum of
// squares) itself, the row read from L2; many rows take a block each.
static int m40_row_chunk(int n_rows, int cols) {
    const int blocks_per_row = max(1, min((256 + n_rows - 1) / n_rows, cols / 512));
    return ((cols + blocks_per_row - 1) / blocks_per_row + 15) / 16 * 16;
}

// Values a block of a row's 8-bit grid spans: Q8_K's 256, else 32.
__host__ __device__ constexpr int m40_grid_block(int scales) { return scales == M40_SCALES_Q8_K ? 256 : 32; }

// Blocks of the grid a conversion block stores the scales of, at most: its
// chunk's, plus one on each side that the chunk cuts.
static int m40_grid_blocks(int chunk, int scales) {
    return scales == M40_SCALES_F32 ? 0 : chunk / m40_grid_block(scales) + 2;
}

// Row r of x (with a norm: x / rms(x) · norm, as rms_norm_kernel computes
// it) for a product on f16 or f32 operands (Out). Where `scales` is not
// M40_SCALES_F32, each value is first rounded to the 8-bit grid that
// llama.cpp's CPU products put a quantized format's activations on (q8.cuh:
// the code of its block's scale, times that scale as kept), so that a
// prompt's products see the activations decode's do. In f16, the row is
// divided by scales[r], a power of two chosen so the row's largest
// magnitude lands in [2^14, 2^15) when it would otherwise overflow f16
// (above 2^15) or sink towards its subnormals (below 2^-4); every other row
// keeps scale 1. Powers of two divide exactly, so the product's row r times
// scales[r] is the product of the f16-rounded row. In f32 the values are
// stored as they are (scales may be null). Output value i is row value
// order(i) (a permutation within each 16 values). Grid: (rows, chunks of
// `chunk` values); dynamic shared memory: m40_grid_blocks(chunk, scales)
// float2.
template <class Out, class Order>
__global__ void __launch_bounds__(M40_ROW_THREADS)
    rows_to_operand_kernel(const float *__restrict__ x, const float *__restrict__ norm, float eps, int cols, int chunk,
                           int grid_scales, Out *__restrict__ out, float *__restrict__ scales, Order order) {
    static_assert(M40_ROW_THREADS == M40_NORM_THREADS, "m40_inverse_rms sums over the block");
    constexpr bool HALF = std::is_same<Out, __half>::value;
    __shared__ float warp_max[M40_ROW_THREADS / 32];
    extern __shared__ float2 grid_scale[];  // per block of the grid: (code scale, kept scale)
    m40_wait_for_prior_kernels();
    m40_allow_next_kernel();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const float *row = x + size_t(blockIdx.x) * cols;
    const float inverse_rms = norm ? m40_inverse_rms(row, cols, eps) : 1.0f;
    const auto value = [&](int i) { return norm ? row[i] * inverse_rms * norm[i] : row[i]; };
    const int begin = blockIdx.y * chunk, end = min(cols, begin + chunk);
    const int per_block = m40_grid_block(grid_scales), first_block = begin / per_block;
    if (grid_scales != M40_SCALES_F32) {
        // A warp a block of the grid, as src/quant/q8.rs's quantizers.
        const int n_blocks = (end - 1) / per_block - first_block + 1;
        for (int b = warp; b < n_blocks; b += M40_ROW_THREADS / 32) {
            const int at = (first_block + b) * per_block;
            float amax = 0.0f;
            for (int j = lane; j < per_block; j += 32) amax = fmaxf(amax, fabsf(value(at + j)));
            amax = m40_warp_max(amax);
            float code_scale = 0.0f, kept = 0.0f;
            if (grid_scales == M40_SCALES_Q8_K) {
                // The first value of that magnitude gives the scale its sign.
                int first = per_block;
                for (int j = lane; j < per_block; j += 32)
                    if (fabsf(value(at + j)) == amax) {
                        first = j;
                        break;
                    }
#pragma unroll
                for (int offset = 16; offset > 0; offset >>= 1)
                    first = min(first, __shfl_xor_sync(0xffffffffu, first, offset));
                if (amax != 0.0f) {
                    code_scale = -127.0f / value(at + first);
                    kept = 1.0f / code_scale;
                }
            } else {
                const float d = amax / 127.0f;
                code_scale = d != 0.0f ? 1.0f / d : 0.0f;
                kept = m40_kept_scale(d, grid_scales);
            }
            if (lane == 0) grid_scale[b] = make_float2(code_scale, kept);
        }
        __syncthreads();
    }
    const auto operand = [&](int i) {
        const float v = value(i);
        if (grid_scales == M40_SCALES_F32) return v;
        const float2 s = grid_scale[i / per_block - first_block];
        int q = __float2int_rn(v * s.x);
        if (grid_scales == M40_SCALES_Q8_K) q = min(127, q);
        return float(q) * s.y;
    };
    float scale = 1.0f;
    if constexpr (HALF) {
        float largest = 0.0f;
        for (int i = threadIdx.x; i < cols; i += M40_ROW_THREADS) largest = fmaxf(largest, fabsf(value(i)));
        largest = m40_warp_max(largest);
        if (lane == 0) warp_max[warp] = largest;
        __syncthreads();
#pragma unroll
        for (int w = 0; w < M40_ROW_THREADS / 32; w++) largest = fmaxf(largest, warp_max[w]);
        if (isfinite(largest) && largest > 0.0f && (largest >= 32768.0f || largest < 0.0625f)) {
            int exponent;
            frexpf(largest, &exponent);  // 2^(exponent-1) ≤ largest < 2^exponent
            // Rows below 2^-96 scale by at most 2^111 (1 / scale stays finite);
            // their values are far below anything a product could show. A
            // value on the grid exceeds the row's largest by at most its
            // kept scale's rounding (2^-11), still well inside f16.
            scale = ldexpf(1.0f, max(exponent, -96) - 15);
        }
    }
    const float inverse = 1.0f / scale;  // exact: a power of two
    Out *o = out + size_t(blockIdx.x) * cols;
    for (int i = begin + threadIdx.x; i < end; i += M40_ROW_THREADS) {
        if constexpr (HALF)
            o[i] = __float2half_rn(operand(order(i)) * inverse);
        else
            o[i] = operand(order(i));
    }
    if (HALF && blockIdx.y == 0 && threadIdx.x == 0) scales[blockIdx.x] = scale;
}

struct M40RowOrder {
    __device__ int operator()(int i) const { return i; }
};

// Launches rows_to_operand_kernel over n_rows rows of x.
template <class Out, class Order>
static cudaError_t m40_rows_to_operand(bool overlap, const float *x, const float *norm, float eps, int n_rows,
                                       int cols, int grid_scales, Out *out, float *scales, cudaStream_t stream) {
    if (n_rows < 1 || cols < 1 || grid_scales < M40_SCALES_F32 || grid_scales > M40_SCALES_Q8_K ||
        (grid_scales != M40_SCALES_F32 && cols % m40_grid_block(grid_scales) != 0))
        return cudaErrorInvalidValue;
    const int chunk = m40_row_chunk(n_rows, cols);
    const dim3 grid(n_rows, m40_blocks(size_t(cols), chunk));
    const size_t shared = sizeof(float2) * m40_grid_blocks(chunk, grid_scales);
    if (shared > 48 * 1024) return cudaErrorInvalidValue;
    m40_launch_shared(overlap, rows_to_operand_kernel<Out, Order>, grid, M40_ROW_THREADS, shared, stream, x, norm,
                      eps, cols, chunk, grid_scales, out, scales, Order{});
    return m40_launch_status();
}

// n_rows rows of x as f16 with their row scales (rows_to_operand_kernel),
// on the 8-bit grid `grid_scales` says (M40ActivationScales) first.
M40_EXPORT cudaError_t m40_rows_to_f16(const float *x, int n_rows, int cols, int grid_scales, uint16_t *out,
                                       float *scales, cudaStream_t stream) {
    return m40_rows_to_operand<__half, M40RowOrder>(false, x, nullptr, 0.0f, n_rows, cols, grid_scales,
                                                    reinterpret_cast<__half *>(out), scales, stream);
}

// n_rows rows of x on the 8-bit grid `grid_scales` says, as f32: the
// activations of a product in FP32 (cuBLAS on weights dequantized to f32).
M40_EXPORT cudaError_t m40_rows_to_grid(const float *x, int n_rows, int cols, int grid_scales, float *out,
                                        cudaStream_t stream) {
    return m40_rows_to_operand<float, M40RowOrder>(false, x, nullptr, 0.0f, n_rows, cols, grid_scales, out,
                                                   nullptr, stream);
}

// Row r of y (width values) times scales[r]: undoes rows_to_f16's scaling
// in a product's output. Rows of scale 1, nearly all, return at once.
__global__ void __launch_bounds__(M40_ROW_THREADS)
    scale_rows_kernel(float *__restrict__ y, int width, const float *__restrict__ scales) {
    const float scale = scales[blockIdx.x];
    if (scale == 1.0f) return;
    float *row = y + size_t(blockIdx.x) * width;
    for (int i = threadIdx.x; i < width; i += M40_ROW_THREADS) row[i] *= scale;
}

M40_EXPORT cudaError_t m40_scale_rows(float *y, int n_rows, int width, const float *scales, cudaStream_t stream) {
    if (n_rows < 1 || width < 1) return cudaErrorInvalidValue;
    scale_rows_kernel<<<n_rows, M40_ROW_THREADS, 0, stream>>>(y, width, scales);
    return m40_launch_status();
}

// out[i] = table[tokens[i]] · scale (tokens in device memory).
M40_EXPORT cudaError_t m40_embed(int type, const uint8_t *table, int cols, const int *tokens, int n_tokens,
                                 float scale, float *out, cudaStream_t stream) {
    if (cols % 32 != 0 || n_tokens < 1) return cudaErrorInvalidValue;
    const size_t n = size_t(n_tokens) * (cols / 16);
    return m40_with_format(type, [&](auto f) {
        using F = decltype(f);
        dequantize_kernel<F, float><<<m40_blocks(n, 256), 256, 0, stream>>>(table, cols, tokens, n_tokens, scale, out);
    });
}

// A vector of any length (norm weights, biases, RoPE factors) as f32.
__global__ void vector_kernel(int type, const uint8_t *__restrict__ w, int n, float *__restrict__ out) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    switch (type) {
        case M40_F32: out[i] = reinterpret_cast<const float *>(w)[i]; break;
        case M40_F16: out[i] = m40_f16(w + 2 * i); break;
        case M40_BF16: out[i] = m40_bf16(w + 2 * i); break;
    }
}

M40_EXPORT cudaError_t m40_vector_to_f32(int type, const uint8_t *w, int n, float *out, cudaStream_t stream) {
    if (n == 0) return cudaSuccess;
    if (type == M40_F32 || type == M40_F16 || type == M40_BF16) {
        vector_kernel<<<m40_blocks(n, 256), 256, 0, stream>>>(type, w, n, out);
        return m40_launch_status();
    }
    // Quantized vectors decode like a one-row matrix.
    return m40_dequantize_rows(type, w, n, 0, 1, out, stream);
}
