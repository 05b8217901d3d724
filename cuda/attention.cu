// Causal attention of each row's query heads over its sequence's f16 KV
// cache, in two kernels: the positions a row sees are split into n_splits
// ranges, one block per (head, row, range) computing an online-softmax
// partial (max, sum, weighted values), then one block per (head, row)
// combines the partials. One launch shape serves decode (one row, long
// history: many splits keep every SM busy) and prefill (many rows: one split).
#include "ops.cuh"

#define M40_ATTN_WARPS 4
// Head sizes up to 32 × this many values per lane.
#define M40_ATTN_MAX_PER_LANE 8

struct Partial {
    float max, sum;
};

// partial layout: per (row, head, split): [max, sum, acc[head_dim_v]].
__global__ void __launch_bounds__(32 * M40_ATTN_WARPS)
    attention_partial_kernel(const float *__restrict__ q, const M40Row *__restrict__ rows, int layer, int n_head,
                             int n_head_kv, int head_dim_k, int head_dim_v, int window, float scale, int n_splits,
                             float *__restrict__ partial) {
    // Rows on x, whose limit (2^31 − 1) no batch reaches; heads and splits on y and z.
    const int r = blockIdx.x, head = blockIdx.y, split = blockIdx.z;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const M40Row row = rows[r];
    const int first = window > 0 ? max(0, row.pos + 1 - window) : 0;
    const int n_pos = row.pos + 1 - first;
    const int per_split = (n_pos + n_splits - 1) / n_splits;
    const int begin = first + split * per_split;
    const int end = min(row.pos + 1, begin + per_split);

    const int kv_head = head / (n_head / n_head_kv);
    const int k_width = n_head_kv * head_dim_k, v_width = n_head_kv * head_dim_v;
    const size_t layer_base = size_t(layer) * row.n_ctx;
    const __half *keys = reinterpret_cast<const __half *>(row.keys) + layer_base * k_width + kv_head * head_dim_k;
    const __half *values =
        reinterpret_cast<const __half *>(row.values) + layer_base * v_width + kv_head * head_dim_v;

    float qv[M40_ATTN_MAX_PER_LANE], acc[M40_ATTN_MAX_PER_LANE];
    const float *qh = q + (size_t(r) * n_head + head) * head_dim_k;
#pragma unroll
    for (int j = 0; j < M40_ATTN_MAX_PER_LANE; j++) {
        const int d = lane + 32 * j;
        qv[j] = d < head_dim_k ? qh[d] * scale : 0.0f;
        acc[j] = 0.0f;
    }
    float run_max = -INFINITY, run_sum = 0.0f;
    for (int p = begin + warp; p < end; p += M40_ATTN_WARPS) {
        const __half *key = keys + size_t(p) * k_width;
        float s = 0.0f;
#pragma unroll
        for (int j = 0; j < M40_ATTN_MAX_PER_LANE; j++) {
            const int d = lane + 32 * j;
            if (d < head_dim_k) s += qv[j] * __half2float(key[d]);
        }
        s = m40_warp_sum(s);
        const float new_max = fmaxf(run_max, s);
        const float correction = expf(run_max - new_max), weight = expf(s - new_max);
        run_sum = run_sum * correction + weight;
        const __half *value = values + size_t(p) * v_width;
#pragma unroll
        for (int j = 0; j < M40_ATTN_MAX_PER_LANE; j++) {
            const int d = lane + 32 * j;
            const float x = d < head_dim_v ? __half2float(value[d]) : 0.0f;
            acc[j] = acc[j] * correction + weight * x;
        }
        run_max = new_max;
    }

    // Combine the warps' states.
    __shared__ Partial states[M40_ATTN_WARPS];
    __shared__ float accs[M40_ATTN_WARPS][32 * M40_ATTN_MAX_PER_LANE];
    if (lane == 0) states[warp] = {run_max, run_sum};
#pragma unroll
    for (int j = 0; j < M40_ATTN_MAX_PER_LANE; j++) accs[warp][lane + 32 * j] = acc[j];
    __syncthreads();
    if (warp != 0) return;
    float block_max = -INFINITY;
    for (int w = 0; w < M40_ATTN_WARPS; w++) block_max = fmaxf(block_max, states[w].max);
    float *out = partial + ((size_t(r) * n_head + head) * n_splits + split) * (head_dim_v + 2);
    float block_sum = 0.0f;
    float factor[M40_ATTN_WARPS];
    for (int w = 0; w < M40_ATTN_WARPS; w++) {
        // A warp that saw no position has max −∞ and contributes nothing.
        factor[w] = states[w].sum > 0.0f ? expf(states[w].max - block_max) : 0.0f;
        block_sum += states[w].sum * factor[w];
    }
    if (lane == 0) {
        out[0] = block_max;
        out[1] = block_sum;
    }
    for (int d = lane; d < head_dim_v; d += 32) {
        float a = 0.0f;
        for (int w = 0; w < M40_ATTN_WARPS; w++) a += accs[w][d] * factor[w];
        out[2 + d] = a;
    }
}

__global__ void attention_combine_kernel(const float *__restrict__ partial, int n_head, int head_dim_v,
                                         int n_splits, float *__restrict__ out) {
    const int r = blockIdx.x, head = blockIdx.y;
    const float *parts = partial + (size_t(r) * n_head + head) * n_splits * (head_dim_v + 2);
    float max_all = -INFINITY;
    for (int s = 0; s < n_splits; s++) {
        const float *p = parts + s * (head_dim_v + 2);
        if (p[1] > 0.0f) max_all = fmaxf(max_all, p[0]);
    }
    float total = 0.0f;
    for (int s = 0; s < n_splits; s++) {
        const float *p = parts + s * (head_dim_v + 2);
        if (p[1] > 0.0f) total += p[1] * expf(p[0] - max_all);
    }
    for (int d = threadIdx.x; d < head_dim_v; d += blockDim.x) {
        float a = 0.0f;
        for (int s = 0; s < n_splits; s++) {
            const float *p = parts + s * (head_dim_v + 2);
            if (p[1] > 0.0f) a += p[2 + d] * expf(p[0] - max_all);
        }
        out[(size_t(r) * n_head + head) * head_dim_v + d] = a / total;
    }
}

// partial: n_rows × n_head × n_splits × (head_dim_v + 2) floats of scratch.
M40_EXPORT cudaError_t m40_attention(const float *q, int n_rows, const M40Row *rows, int layer, int n_head,
                                     int n_head_kv, int head_dim_k, int head_dim_v, int window, float scale,
                                     int n_splits, float *partial, float *out, cudaStream_t stream) {
    if (head_dim_k > 32 * M40_ATTN_MAX_PER_LANE || head_dim_v > 32 * M40_ATTN_MAX_PER_LANE || n_splits < 1 ||
        n_head_kv < 1 || n_head % n_head_kv != 0 || n_head > 65535 || n_splits > 65535)
        return cudaErrorInvalidValue;
    attention_partial_kernel<<<dim3(n_rows, n_head, n_splits), 32 * M40_ATTN_WARPS, 0, stream>>>(
        q, rows, layer, n_head, n_head_kv, head_dim_k, head_dim_v, window, scale, n_splits, partial);
    cudaError_t status = m40_launch_status();
    if (status != cudaSuccess) return status;
    attention_combine_kernel<<<dim3(n_rows, n_head), 128, 0, stream>>>(partial, n_head, head_dim_v, n_splits, out);
    return m40_launch_status();
}
