// The transformer's element-wise operations on f32 rows: RMSNorm, residual
// and bias adds, row gathers, RoPE, the gated activations, and the KV-cache
// store. Definitions follow src/backend/cpu/ops.rs.
#include "ops.cuh"

#define M40_NORM_THREADS 256

// Each of n_groups groups of `group` values: x ← x / rms(x) · w.
__global__ void __launch_bounds__(M40_NORM_THREADS)
    rms_norm_kernel(float *__restrict__ x, const float *__restrict__ w, int group, float eps) {
    float *g = x + size_t(blockIdx.x) * group;
    float sum = 0.0f;
    for (int i = threadIdx.x; i < group; i += M40_NORM_THREADS) sum += g[i] * g[i];
    __shared__ float partial[M40_NORM_THREADS / 32];
    sum = m40_warp_sum(sum);
    if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = sum;
    __syncthreads();
    if (threadIdx.x < 32) {
        sum = threadIdx.x < M40_NORM_THREADS / 32 ? partial[threadIdx.x] : 0.0f;
        sum = m40_warp_sum(sum);
        if (threadIdx.x == 0) partial[0] = sum;
    }
    __syncthreads();
    const float scale = 1.0f / sqrtf(partial[0] / float(group) + eps);
    for (int i = threadIdx.x; i < group; i += M40_NORM_THREADS) g[i] = g[i] * scale * w[i];
}

M40_EXPORT cudaError_t m40_rms_norm(float *x, const float *w, int group, int n_groups, float eps,
                                    cudaStream_t stream) {
    if (n_groups == 0) return cudaSuccess;
    rms_norm_kernel<<<n_groups, M40_NORM_THREADS, 0, stream>>>(x, w, group, eps);
    return m40_launch_status();
}

// x[i] += y[i % period]: the residual add (period = n) and the bias add (period = width).
__global__ void add_kernel(float *__restrict__ x, const float *__restrict__ y, size_t n, size_t period) {
    const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) x[i] += y[i % period];
}

M40_EXPORT cudaError_t m40_add(float *x, const float *y, size_t n, size_t period, cudaStream_t stream) {
    if (n == 0) return cudaSuccess;
    add_kernel<<<m40_blocks(n, 256), 256, 0, stream>>>(x, y, n, period);
    return m40_launch_status();
}

// out[i] = src[rows[i]], rows `width` wide.
__global__ void gather_kernel(const float *__restrict__ src, int width, const int *__restrict__ rows, int n_rows,
                              float *__restrict__ out) {
    const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= size_t(n_rows) * width) return;
    const size_t r = i / width, c = i % width;
    out[i] = src[size_t(rows[r]) * width + c];
}

M40_EXPORT cudaError_t m40_gather_rows(const float *src, int width, const int *rows, int n_rows, float *out,
                                       cudaStream_t stream) {
    if (n_rows == 0) return cudaSuccess;
    gather_kernel<<<m40_blocks(size_t(n_rows) * width, 256), 256, 0, stream>>>(src, width, rows, n_rows, out);
    return m40_launch_status();
}

// One thread per (row, head, pair). The angle is computed in double, as the
// CPU backend does: positions reach 10^5 and the f32 product would lose the
// phase.
__global__ void rope_kernel(float *__restrict__ x, int n_rows, int n_heads, int head_dim,
                            const M40Row *__restrict__ rows, int neox, int dims, double freq_base,
                            double freq_scale, const float *__restrict__ factors) {
    const int half = dims / 2;
    const size_t index = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (index >= size_t(n_rows) * n_heads * half) return;
    const int i = int(index % half);
    const size_t head = index / half;
    const int row = int(head / n_heads);
    float *h = x + head * head_dim;
    double inv_freq = pow(freq_base, -2.0 * i / dims);
    if (factors) inv_freq /= double(factors[i]);
    const double theta = double(rows[row].pos) * freq_scale * inv_freq;
    const float c = float(cos(theta)), s = float(sin(theta));
    const int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
    const float x0 = h[a], x1 = h[b];
    h[a] = x0 * c - x1 * s;
    h[b] = x0 * s + x1 * c;
}

M40_EXPORT cudaError_t m40_rope(float *x, int n_rows, int n_heads, int head_dim, const M40Row *rows, int neox,
                                int dims, float freq_base, float freq_scale, const float *factors,
                                cudaStream_t stream) {
    const size_t n = size_t(n_rows) * n_heads * (dims / 2);
    if (n == 0) return cudaSuccess;
    rope_kernel<<<m40_blocks(n, 256), 256, 0, stream>>>(x, n_rows, n_heads, head_dim, rows, neox, dims,
                                                        double(freq_base), double(freq_scale), factors);
    return m40_launch_status();
}

// out = act(gate) · up; act 0: SiLU, 1: tanh-GELU written as x / (1 + e^{−2y}).
__global__ void glu_kernel(int act, const float *__restrict__ gate, const float *__restrict__ up, size_t n,
                           float *__restrict__ out) {
    const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float g = gate[i];
    float a;
    if (act == 0) {
        a = g / (1.0f + expf(-g));
    } else {
        const float y = 0.7978845608f * g * (1.0f + 0.044715f * g * g);
        a = g / (1.0f + expf(-2.0f * y));
    }
    out[i] = a * up[i];
}

M40_EXPORT cudaError_t m40_glu(int act, const float *gate, const float *up, size_t n, float *out,
                               cudaStream_t stream) {
    if (n == 0) return cudaSuccess;
    glu_kernel<<<m40_blocks(n, 256), 256, 0, stream>>>(act, gate, up, n, out);
    return m40_launch_status();
}

// Writes each row's key and value (f32 → f16) at its position of `layer`.
__global__ void store_kv_kernel(const float *__restrict__ k, const float *__restrict__ v, int n_rows, int k_width,
                                int v_width, const M40Row *__restrict__ rows, int layer) {
    const int width = k_width + v_width;
    const size_t index = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (index >= size_t(n_rows) * width) return;
    const int r = int(index / width), e = int(index % width);
    const M40Row row = rows[r];
    const size_t slot = size_t(layer) * row.n_ctx + row.pos;
    if (e < k_width) {
        reinterpret_cast<__half *>(row.keys)[slot * k_width + e] = __float2half_rn(k[size_t(r) * k_width + e]);
    } else {
        const int j = e - k_width;
        reinterpret_cast<__half *>(row.values)[slot * v_width + j] = __float2half_rn(v[size_t(r) * v_width + j]);
    }
}

M40_EXPORT cudaError_t m40_store_kv(const float *k, const float *v, int n_rows, int k_width, int v_width,
                                    const M40Row *rows, int layer, cudaStream_t stream) {
    const size_t n = size_t(n_rows) * (k_width + v_width);
    if (n == 0) return cudaSuccess;
    store_kv_kernel<<<m40_blocks(n, 256), 256, 0, stream>>>(k, v, n_rows, k_width, v_width, rows, layer);
    return m40_launch_status();
}
