// The transformer's element-wise operations on f32 rows: RMSNorm, residual
// and bias adds, scaling and soft-capping, row gathers, RoPE, the gated
// activations, and the KV-cache store. Definitions follow
// src/backend/cpu/ops.rs.
#include "ops.cuh"

// Each of n_groups groups of `group` values: out ← x / rms(x) · w, or
// x / rms(x) where w is null (Gemma 4's value heads); out may be x.
__global__ void __launch_bounds__(M40_NORM_THREADS)
    rms_norm_kernel(const float *x, const float *__restrict__ w, int group, float eps, float *out) {
    const float *g = x + size_t(blockIdx.x) * group;
    float *o = out + size_t(blockIdx.x) * group;
    const float scale = m40_inverse_rms(g, group, eps);
    for (int i = threadIdx.x; i < group; i += M40_NORM_THREADS) o[i] = w ? g[i] * scale * w[i] : g[i] * scale;
}

M40_EXPORT cudaError_t m40_rms_norm(const float *x, const float *w, int group, int n_groups, float eps, float *out,
                                    cudaStream_t stream) {
    if (n_groups == 0) return cudaSuccess;
    rms_norm_kernel<<<n_groups, M40_NORM_THREADS, 0, stream>>>(x, w, group, eps, out);
    return m40_launch_status();
}

// Each row: x += y / rms(y) · w (Gemma's normalized residual branches).
__global__ void __launch_bounds__(M40_NORM_THREADS)
    norm_add_kernel(float *__restrict__ x, const float *__restrict__ y, const float *__restrict__ w, int width,
                    float eps) {
    const float *g = y + size_t(blockIdx.x) * width;
    float *o = x + size_t(blockIdx.x) * width;
    const float scale = m40_inverse_rms(g, width, eps);
    for (int i = threadIdx.x; i < width; i += M40_NORM_THREADS) o[i] += g[i] * scale * w[i];
}

M40_EXPORT cudaError_t m40_norm_add(float *x, const float *y, const float *w, int width, int n_rows, float eps,
                                    cudaStream_t stream) {
    if (n_rows == 0) return cudaSuccess;
    norm_add_kernel<<<n_rows, M40_NORM_THREADS, 0, stream>>>(x, y, w, width, eps);
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

// x[i] ← x[i] · factor[0]: a layer's output scale (Gemma 4), read on the
// device so that a recorded step needs no host copy of it.
__global__ void scale_by_kernel(float *__restrict__ x, const float *__restrict__ factor, size_t n) {
    const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= *factor;
}

M40_EXPORT cudaError_t m40_scale_by(float *x, const float *factor, size_t n, cudaStream_t stream) {
    if (n == 0) return cudaSuccess;
    scale_by_kernel<<<m40_blocks(n, 256), 256, 0, stream>>>(x, factor, n);
    return m40_launch_status();
}

// x[i] ← cap · tanh(x[i] / cap) in ggml's steps (a scale by 1 / cap, tanh, a
// scale by cap), as the CPU backend computes it: the final logits' soft-capping.
__global__ void soft_cap_kernel(float *__restrict__ x, float cap, size_t n) {
    const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) x[i] = tanhf(x[i] * (1.0f / cap)) * cap;
}

M40_EXPORT cudaError_t m40_soft_cap(float *x, float cap, size_t n, cudaStream_t stream) {
    if (n == 0) return cudaSuccess;
    soft_cap_kernel<<<m40_blocks(n, 256), 256, 0, stream>>>(x, cap, n);
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

// RoPE's cos and sin of pair i of a head at `pos`, with YaRN's corrections
// where `yarn` is enabled. The angle is computed in double, as the CPU
// backend does: positions reach 10^5 and the f32 product would lose the
// phase.
__device__ void m40_rope_angle(int pos, int i, int dims, double freq_base, double freq_scale,
                               const float *factors, const M40Yarn &yarn, float &c, float &s) {
    double inv_freq = pow(freq_base, -2.0 * i / dims);
    if (factors) inv_freq /= double(factors[i]);
    const double theta = double(pos) * m40_yarn_position_scale(yarn, i, freq_scale) * inv_freq;
    c = float(cos(theta));
    s = float(sin(theta));
    if (yarn.enabled) c *= yarn.magnitude, s *= yarn.magnitude;
}

// One thread per (row, head, pair).
__global__ void rope_kernel(float *__restrict__ x, int n_rows, int n_heads, int head_dim,
                            const M40Row *__restrict__ rows, int neox, int dims, double freq_base,
                            double freq_scale, const float *__restrict__ factors, M40Yarn yarn) {
    const int half = dims / 2;
    const size_t index = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (index >= size_t(n_rows) * n_heads * half) return;
    const int i = int(index % half);
    const size_t head = index / half;
    const int row = int(head / n_heads);
    float *h = x + head * head_dim;
    float c, s;
    m40_rope_angle(rows[row].pos, i, dims, freq_base, freq_scale, factors, yarn, c, s);
    const int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
    const float x0 = h[a], x1 = h[b];
    h[a] = x0 * c - x1 * s;
    h[b] = x0 * s + x1 * c;
}

M40_EXPORT cudaError_t m40_rope(float *x, int n_rows, int n_heads, int head_dim, const M40Row *rows, int neox,
                                int dims, float freq_base, float freq_scale, const float *factors, M40Yarn yarn,
                                cudaStream_t stream) {
    const size_t n = size_t(n_rows) * n_heads * (dims / 2);
    if (n == 0) return cudaSuccess;
    rope_kernel<<<m40_blocks(n, 256), 256, 0, stream>>>(x, n_rows, n_heads, head_dim, rows, neox, dims,
                                                        double(freq_base), double(freq_scale), factors, yarn);
    return m40_launch_status();
}

// out = act(gate) · up, act an M40Glu (SiLU, tanh-GELU, or gpt-oss's
// clamped SwiGLU).
__global__ void glu_kernel(int act, const float *__restrict__ gate, const float *__restrict__ up, size_t n,
                           float *__restrict__ out) {
    const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) out[i] = m40_gated(act, gate[i], up[i]);
}

M40_EXPORT cudaError_t m40_glu(int act, const float *gate, const float *up, size_t n, float *out,
                               cudaStream_t stream) {
    if (act != M40_GLU_SILU && act != M40_GLU_GELU && act != M40_GLU_OAI) return cudaErrorInvalidValue;
    if (n == 0) return cudaSuccess;
    glu_kernel<<<m40_blocks(n, 256), 256, 0, stream>>>(act, gate, up, n, out);
    return m40_launch_status();
}

// Writes each row's key and value (f32 → f16) at its position of `layer`.
__global__ void store_kv_kernel(const float *__restrict__ k, const float *__restrict__ v, int n_rows, int k_width,
                                int v_width, const M40Row *__restrict__ rows, M40KvLayer layer) {
    const int width = k_width + v_width;
    const size_t index = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (index >= size_t(n_rows) * width) return;
    const int r = int(index / width), e = int(index % width);
    const M40Row row = rows[r];
    if (e < k_width) {
        m40_cached_keys(row, layer, row.pos, k_width)[e] = __float2half_rn(k[size_t(r) * k_width + e]);
    } else {
        const int j = e - k_width;
        m40_cached_values(row, layer, row.pos, v_width)[j] = __float2half_rn(v[size_t(r) * v_width + j]);
    }
}

M40_EXPORT cudaError_t m40_store_kv(const float *k, const float *v, int n_rows, int k_width, int v_width,
                                    const M40Row *rows, M40KvLayer layer, cudaStream_t stream) {
    const size_t n = size_t(n_rows) * (k_width + v_width);
    if (n == 0) return cudaSuccess;
    store_kv_kernel<<<m40_blocks(n, 256), 256, 0, stream>>>(k, v, n_rows, k_width, v_width, rows, layer);
    return m40_launch_status();
}

// Attention's inputs for one layer, in one launch: one block per (row,
// head) of q, k and v. Query and key heads get their per-head RMSNorm (when
// given) and RoPE, queries in place; keys and values go to their sequences'
// caches as f16.
__global__ void __launch_bounds__(M40_NORM_THREADS)
    attention_inputs_kernel(float *__restrict__ q, const float *__restrict__ k, const float *__restrict__ v,
                            M40AttentionInputs a) {
    m40_wait_for_prior_kernels();
    m40_allow_next_kernel();
    __shared__ float head[M40_MAX_HEAD_DIM];
    const int r = blockIdx.x, h = blockIdx.y;
    const M40Row row = a.rows[r];
    const int n_q = a.n_head, n_k = a.n_head_kv;
    const bool is_q = h < n_q, is_k = !is_q && h < n_q + n_k;
    const int dim = is_q || is_k ? a.head_dim_k : a.head_dim_v;
    const float *src = is_q ? q + (size_t(r) * n_q + h) * dim
                       : is_k ? k + (size_t(r) * n_k + (h - n_q)) * dim
                              : v + (size_t(r) * n_k + (h - n_q - n_k)) * dim;
    if (!is_q && !is_k) {
        __half *cache = m40_cached_values(row, a.layer, row.pos, n_k * dim) + size_t(h - n_q - n_k) * dim;
        for (int i = threadIdx.x; i < dim; i += blockDim.x) cache[i] = __float2half_rn(src[i]);
        return;
    }
    const float *norm = is_q ? a.q_norm : a.k_norm;
    const float scale = norm ? m40_inverse_rms(src, dim, a.eps) : 1.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) head[i] = norm ? src[i] * scale * norm[i] : src[i];
    __syncthreads();
    float *q_out = q + (size_t(r) * n_q + h) * dim;
    __half *k_out = m40_cached_keys(row, a.layer, row.pos, n_k * dim) + size_t(h - n_q) * dim;
    const auto put = [&](int i, float value) {
        if (is_q)
            q_out[i] = value;
        else
            k_out[i] = __float2half_rn(value);
    };
    const int half = a.rope_dims / 2;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        if (i < half) {
            float c, s;
            m40_rope_angle(row.pos, i, a.rope_dims, a.freq_base, a.freq_scale, a.factors, a.yarn, c, s);
            const int ia = a.neox ? i : 2 * i, ib = a.neox ? i + half : 2 * i + 1;
            const float x0 = head[ia], x1 = head[ib];
            put(ia, x0 * c - x1 * s);
            put(ib, x0 * s + x1 * c);
        } else if (i >= a.rope_dims) {
            put(i, head[i]);
        }
    }
}

M40_EXPORT cudaError_t m40_attention_inputs(float *q, const float *k, const float *v, int n_rows,
                                            const M40AttentionInputs *inputs, cudaStream_t stream) {
    const M40AttentionInputs &a = *inputs;
    if (a.head_dim_k > M40_MAX_HEAD_DIM || a.head_dim_v > M40_MAX_HEAD_DIM || a.rope_dims > a.head_dim_k ||
        a.rope_dims % 2 != 0 || a.n_head + 2 * a.n_head_kv > 65535)
        return cudaErrorInvalidValue;
    if (n_rows == 0) return cudaSuccess;
    m40_launch(a.overlap, attention_inputs_kernel, dim3(n_rows, a.n_head + 2 * a.n_head_kv), M40_NORM_THREADS, stream,
               q, k, v, a);
    return m40_launch_status();
}
