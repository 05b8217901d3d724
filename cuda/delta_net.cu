// Qwen3.5's hybrid layers: the Gated DeltaNet of its linear-attention layers
// (causal convolution, L2 norms, the per-head recurrence) and the small
// element-wise steps of its gated attention and shared expert. Definitions
// follow src/backend/cpu/delta_net.rs and `Backend::delta_net`.
//
// A step's rows come in runs, each a sequence's consecutive positions in
// order (a prompt chunk is one run; a batched decode step one run per row);
// `run_starts` holds n_runs + 1 row indices, or is NULL for one row a run.
// Each row's M40Row names its sequence's recurrent states; a layer's state
// lies `state_offset` floats after that: the convolution's last K − 1
// inputs (K − 1 rows of `channels`), then each value head's S × S state,
// column j (value dimension) a run of S floats over the key dimension.
#include "ops.cuh"

// The most taps a convolution has here (Qwen3.5: 4).
#define M40_CONV_MAX_TAPS 16

__device__ __forceinline__ int m40_run_start(const int *run_starts, int run) {
    return run_starts ? run_starts[run] : run;
}

// One thread per (channel, run): its rows through the convolution with the
// run's previous inputs, then SiLU; the state becomes the last K − 1 inputs.
// TAPS is K where the launch knows it at compile time (the window then lives
// in registers), else 0 and `taps` says it.
template <int TAPS>
__global__ void conv_kernel(const float *__restrict__ qkv, int channels, int taps,
                            const float *__restrict__ weights, const M40Row *__restrict__ rows,
                            const int *__restrict__ run_starts, long long state_offset, float *__restrict__ out) {
    constexpr int MAX = TAPS > 0 ? TAPS : M40_CONV_MAX_TAPS;
    if (TAPS > 0) taps = TAPS;
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    const int run = blockIdx.y;
    if (c >= channels) return;
    const int first = m40_run_start(run_starts, run), end = m40_run_start(run_starts, run + 1);
    float *state = reinterpret_cast<float *>(rows[first].state) + state_offset;
    float w[MAX], window[MAX];
#pragma unroll
    for (int i = 0; i < MAX; i++) {
        w[i] = i < taps ? weights[size_t(c) * taps + i] : 0.0f;
        window[i] = i + 1 < taps ? state[size_t(i) * channels + c] : 0.0f;
    }
    float next = first < end ? qkv[size_t(first) * channels + c] : 0.0f;
    for (int r = first; r < end; r++) {
        window[taps - 1] = next;
        if (r + 1 < end) next = qkv[size_t(r + 1) * channels + c];
        float sum = 0.0f;
#pragma unroll
        for (int i = 0; i < MAX; i++) {
            if (i < taps) sum += window[i] * w[i];
        }
        out[size_t(r) * channels + c] = m40_activation(false, sum);
#pragma unroll
        for (int i = 0; i + 1 < MAX; i++) window[i] = window[i + 1];
    }
#pragma unroll
    for (int i = 0; i + 1 < MAX; i++) {
        if (i + 1 < taps) state[size_t(i) * channels + c] = window[i];
    }
}

// One block per (row, query or key head): x / √(Σx² + ε), as an RMS norm
// with ε/n then 1/√n (llama.cpp's build_gdn_l2_norm).
__global__ void __launch_bounds__(M40_NORM_THREADS)
    l2_norm_kernel(float *__restrict__ x, int channels, int head_dim, float eps) {
    float *g = x + size_t(blockIdx.y) * channels + size_t(blockIdx.x) * head_dim;
    const float n = float(head_dim);
    const float scale = m40_inverse_rms(g, head_dim, eps / n), root = 1.0f / sqrtf(n);
    for (int i = threadIdx.x; i < head_dim; i += M40_NORM_THREADS) g[i] = g[i] * scale * root;
}

// Threads of a column of the state: each holds S / M40_DELTA_PARTS of its
// values, the parts of a column adjacent lanes of a warp.
#define M40_DELTA_PARTS 4

// One block per (value head, run), S × M40_DELTA_PARTS threads: the run's
// rows one after another through the recurrence (see Backend::delta_net),
// the head's state in registers. Part p of column j holds the key
// dimensions 16m + 4p .. 16m + 4p + 3 (m = 0 .. S/16 − 1): read as float4
// from shared memory, a quarter-warp's four parts take 64 contiguous bytes
// and no two lanes' reads share a bank unless they share an address. A
// row's q and k go through shared memory (two buffers, so one barrier a row
// suffices) and the next row's inputs are loaded while the current one is
// computed: the rows are a chain, and without that each would wait out its
// loads' latency.
template <int S>
__global__ void __launch_bounds__(S *M40_DELTA_PARTS)
    delta_kernel(const float *__restrict__ conv, const float *__restrict__ alpha, const float *__restrict__ beta,
                 const float *__restrict__ dt_bias, const float *__restrict__ a, const M40Row *__restrict__ rows,
                 const int *__restrict__ run_starts, long long state_offset, int n_k_heads, int n_v_heads,
                 float *__restrict__ out) {
    constexpr int M = S / 16;  // float4 groups a thread holds
    static_assert(S % 16 == 0, "heads of a multiple of 16 values");
    __shared__ __align__(16) float q[2][S];
    __shared__ __align__(16) float k[2][S];
    const int h = blockIdx.x, run = blockIdx.y, t = threadIdx.x;
    const int j = t / M40_DELTA_PARTS, part = t % M40_DELTA_PARTS;
    const int kh = h % n_k_heads;
    const int key_width = n_k_heads * S, channels = 2 * key_width + n_v_heads * S;
    const int first = m40_run_start(run_starts, run), end = m40_run_start(run_starts, run + 1);
    float *column = reinterpret_cast<float *>(rows[first].state) + state_offset + size_t(h) * S * S + size_t(j) * S;
    const float bias = dt_bias[h], neg_a = a[h];
    // Threads 0..S − 1 carry a q value, S..2S − 1 a k value.
    const int qk = t < S ? kh * S + t : key_width + kh * S + (t - S);
    // Row r's inputs, loaded a row ahead.
    auto load = [&](int r, float &x_qk, float &v, float &al, float &be) {
        const float *x = conv + size_t(r) * channels;
        if (t < 2 * S) x_qk = x[qk];
        v = x[2 * key_width + h * S + j];
        al = alpha[size_t(r) * n_v_heads + h];
        be = beta[size_t(r) * n_v_heads + h];
    };
    float4 st[M];
#pragma unroll
    for (int m = 0; m < M; m++) st[m] = *reinterpret_cast<const float4 *>(column + 16 * m + 4 * part);
    const float scale = 1.0f / sqrtf(float(S));
    float x_qk = 0.0f, v = 0.0f, al = 0.0f, be = 0.0f;
    if (first < end) load(first, x_qk, v, al, be);
    for (int r = first; r < end; r++) {
        const int buf = (r - first) & 1;
        if (t < S) {
            q[buf][t] = x_qk;
        } else if (t < 2 * S) {
            k[buf][t - S] = x_qk;
        }
        const float v_r = v, pre = al + bias, be_r = be;
        __syncthreads();
        if (r + 1 < end) load(r + 1, x_qk, v, al, be);
        const float softplus = pre > 20.0f ? pre : logf(1.0f + expf(pre));
        const float decay = expf(softplus * neg_a);
        const float strength = m40_sigmoid(be_r);
        const float4 *k4 = reinterpret_cast<const float4 *>(k[buf]) + part;
        const float4 *q4 = reinterpret_cast<const float4 *>(q[buf]) + part;
        float predicted = 0.0f;
#pragma unroll
        for (int m = 0; m < M; m++) {
            const float4 kv = k4[4 * m];
            st[m].x *= decay, st[m].y *= decay, st[m].z *= decay, st[m].w *= decay;
            predicted += st[m].x * kv.x + st[m].y * kv.y + st[m].z * kv.z + st[m].w * kv.w;
        }
#pragma unroll
        for (int o = 1; o < M40_DELTA_PARTS; o <<= 1) predicted += __shfl_xor_sync(0xffffffffu, predicted, o);
        const float delta = (v_r - predicted) * strength;
        float read = 0.0f;
#pragma unroll
        for (int m = 0; m < M; m++) {
            const float4 kv = k4[4 * m], qv = q4[4 * m];
            st[m].x += kv.x * delta, st[m].y += kv.y * delta, st[m].z += kv.z * delta, st[m].w += kv.w * delta;
            read += st[m].x * qv.x + st[m].y * qv.y + st[m].z * qv.z + st[m].w * qv.w;
        }
#pragma unroll
        for (int o = 1; o < M40_DELTA_PARTS; o <<= 1) read += __shfl_xor_sync(0xffffffffu, read, o);
        if (part == 0) out[size_t(r) * n_v_heads * S + h * S + j] = read * scale;
    }
#pragma unroll
    for (int m = 0; m < M; m++) *reinterpret_cast<float4 *>(column + 16 * m + 4 * part) = st[m];
}

M40_EXPORT cudaError_t m40_delta_net(const float *qkv, const float *alpha, const float *beta, const float *conv_weights,
                                     const float *dt_bias, const float *a, const M40Row *rows, const int *run_starts,
                                     int n_rows, int n_runs, long long conv_state_offset, long long state_offset,
                                     int taps, int head_dim, int n_k_heads, int n_v_heads, float eps, float *conv,
                                     float *out, cudaStream_t stream) {
    if (n_rows == 0) return cudaSuccess;
    if (taps < 1 || taps > M40_CONV_MAX_TAPS) return cudaErrorInvalidValue;
    const int channels = 2 * n_k_heads * head_dim + n_v_heads * head_dim;
    const dim3 conv_grid(m40_blocks(channels, 128), n_runs);
    if (taps == 4) {
        conv_kernel<4><<<conv_grid, 128, 0, stream>>>(qkv, channels, taps, conv_weights, rows, run_starts,
                                                      conv_state_offset, conv);
    } else {
        conv_kernel<0><<<conv_grid, 128, 0, stream>>>(qkv, channels, taps, conv_weights, rows, run_starts,
                                                      conv_state_offset, conv);
    }
    l2_norm_kernel<<<dim3(2 * n_k_heads, n_rows), M40_NORM_THREADS, 0, stream>>>(conv, channels, head_dim, eps);
    const dim3 grid(n_v_heads, n_runs);
    switch (head_dim) {
#define M40_DELTA(S)                                                                                        \
    case S:                                                                                                 \
        delta_kernel<S><<<grid, S * M40_DELTA_PARTS, 0, stream>>>(conv, alpha, beta, dt_bias, a, rows,     \
                                                                  run_starts, state_offset, n_k_heads,     \
                                                                  n_v_heads, out);                         \
        break;
        M40_DELTA(16)
        M40_DELTA(32)
        M40_DELTA(64)
        M40_DELTA(128)
        M40_DELTA(256)
#undef M40_DELTA
        default:
            return cudaErrorInvalidValue;
    }
    return m40_launch_status();
}

// Each of `groups` runs of 2 · half values: the first half to `first`, the
// second to `second` (a Qwen3.5 attention head's query and its gate).
__global__ void split_halves_kernel(const float *__restrict__ x, size_t n, int half, float *__restrict__ first,
                                    float *__restrict__ second) {
    const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const size_t group = i / (2 * half);
    const int e = int(i % (2 * half));
    if (e < half) {
        first[group * half + e] = x[i];
    } else {
        second[group * half + e - half] = x[i];
    }
}

M40_EXPORT cudaError_t m40_split_halves(const float *x, int groups, int half, float *first, float *second,
                                        cudaStream_t stream) {
    const size_t n = size_t(groups) * 2 * half;
    if (n == 0) return cudaSuccess;
    split_halves_kernel<<<m40_blocks(n, 256), 256, 0, stream>>>(x, n, half, first, second);
    return m40_launch_status();
}

// x ← x · σ(gate).
__global__ void sigmoid_gate_kernel(float *__restrict__ x, const float *__restrict__ gate, size_t n) {
    const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= m40_sigmoid(gate[i]);
}

M40_EXPORT cudaError_t m40_sigmoid_gate(float *x, const float *gate, size_t n, cudaStream_t stream) {
    if (n == 0) return cudaSuccess;
    sigmoid_gate_kernel<<<m40_blocks(n, 256), 256, 0, stream>>>(x, gate, n);
    return m40_launch_status();
}

// x[r] += σ(gate[r]) · y[r], rows `width` wide (the shared expert).
__global__ void gated_add_kernel(float *__restrict__ x, const float *__restrict__ y, const float *__restrict__ gate,
                                 size_t n, int width) {
    const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) x[i] += m40_sigmoid(gate[i / width]) * y[i];
}

M40_EXPORT cudaError_t m40_gated_add(float *x, const float *y, const float *gate, int rows, int width,
                                     cudaStream_t stream) {
    const size_t n = size_t(rows) * width;
    if (n == 0) return cudaSuccess;
    gated_add_kernel<<<m40_blocks(n, 256), 256, 0, stream>>>(x, y, gate, n, width);
    return m40_launch_status();
}
