// Weight-reading kernels besides decode's products (gemv.cu): dequantization
// of row bands to f32 (prefill through cuBLAS, one-row weights at load) and
// the embedding lookup.
#include "quant.cuh"

// out[i][·] = row src_rows[i] (or i when src_rows is null) of W as f32, times scale.
template <class F>
__global__ void dequantize_kernel(const uint8_t *__restrict__ w, int cols, const int *__restrict__ src_rows,
                                  int n_rows, float scale, float *__restrict__ out) {
    constexpr int PARTS = F::VALUES / 16;
    const int parts_per_row = cols / 16;
    const size_t index = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (index >= size_t(n_rows) * parts_per_row) return;
    const int i = int(index / parts_per_row), p = int(index % parts_per_row);
    const size_t src = src_rows ? size_t(src_rows[i]) : size_t(i);
    const size_t row_bytes = size_t(cols / F::VALUES) * F::BYTES;
    float v[16];
    F::decode16(w + src * row_bytes + size_t(p / PARTS) * F::BYTES, p % PARTS, v);
    float4 *o = reinterpret_cast<float4 *>(out + size_t(i) * cols + 16 * p);
#pragma unroll
    for (int j = 0; j < 4; j++)
        o[j] = make_float4(v[4 * j] * scale, v[4 * j + 1] * scale, v[4 * j + 2] * scale, v[4 * j + 3] * scale);
}

// Rows first_row .. first_row + n_rows of W as f32 (n_rows × cols).
M40_EXPORT cudaError_t m40_dequantize_rows(int type, const uint8_t *w, int cols, int first_row, int n_rows,
                                           float *out, cudaStream_t stream) {
    if (cols % 32 != 0 || n_rows < 1) return cudaErrorInvalidValue;
    const size_t n = size_t(n_rows) * (cols / 16);
    return m40_with_format(type, [&](auto f) {
        using F = decltype(f);
        const uint8_t *band = w + size_t(first_row) * (cols / F::VALUES) * F::BYTES;
        dequantize_kernel<F><<<m40_blocks(n, 256), 256, 0, stream>>>(band, cols, nullptr, n_rows, 1.0f, out);
    });
}

// out[i] = table[tokens[i]] · scale (tokens in device memory).
M40_EXPORT cudaError_t m40_embed(int type, const uint8_t *table, int cols, const int *tokens, int n_tokens,
                                 float scale, float *out, cudaStream_t stream) {
    if (cols % 32 != 0 || n_tokens < 1) return cudaErrorInvalidValue;
    const size_t n = size_t(n_tokens) * (cols / 16);
    return m40_with_format(type, [&](auto f) {
        using F = decltype(f);
        dequantize_kernel<F><<<m40_blocks(n, 256), 256, 0, stream>>>(table, cols, tokens, n_tokens, scale, out);
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
