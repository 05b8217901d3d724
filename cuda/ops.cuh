// Types shared by the element-wise and attention kernels and their Rust callers.
#pragma once

#include "common.cuh"

// One row of a batch as the KV-cache kernels see it: where its sequence's
// cache lives and the row's position there. Mirrors `DeviceRow` in
// src/backend/cuda/kernels.rs.
struct M40Row {
    // Device addresses of the sequence's f16 keys and values: each layer's
    // n_ctx positions one after another, layer after layer, each layer as
    // wide as its own heads (M40KvLayer).
    unsigned long long keys;
    unsigned long long values;
    int pos;
    int n_ctx;
    // Device address of the sequence's recurrent states (a hybrid model's
    // linear-attention layers, one after another; 0 without).
    unsigned long long state;
};

// Head sizes the attention kernels handle.
#define M40_MAX_HEAD_DIM 512

// YaRN's corrections to RoPE's angles (ggml's rope_yarn with an
// extrapolation factor of 1; `Rope::yarn_ramp` in src/backend/mod.rs
// computes the numbers): pair i keeps its unscaled angle up to `low`, takes
// the scaled one from `high`, and mixes the two along a linear ramp
// between; cos and sin are multiplied by `magnitude`. enabled 0: plain
// RoPE. Mirrors `YarnRamp` in src/backend/cuda/kernels.rs.
struct M40Yarn {
    float low, high, magnitude;
    int enabled;
};

// Pair i's position scale: freq_scale, or under YaRN its mix of freq_scale
// and 1, in the CPU backend's arithmetic (`RopeTable` in
// src/backend/cpu/ops.rs: the ramp in f32, the mix in double).
__device__ __forceinline__ double m40_yarn_position_scale(const M40Yarn &yarn, int i, double freq_scale) {
    if (!yarn.enabled) return freq_scale;
    const float ramp = (float(i) - yarn.low) / fmaxf(yarn.high - yarn.low, 0.001f);
    const double extrapolate = double(1.0f - fminf(fmaxf(ramp, 0.0f), 1.0f));
    return freq_scale * (1.0 - extrapolate) + extrapolate;
}

// Where one layer lies in every sequence's cache: its keys start
// n_ctx × k_start halves into the keys block, its values n_ctx × v_start
// into the values block (the starts are the widths of the layers before
// it, in values a position), so that layers of different widths (Gemma
// 4's sliding-window and full-attention layers) each take their own.
// Every sequence of a model has the same layers, so a launch takes the
// layer's starts as a parameter whatever its rows' caches. Mirrors
// `KvLayer` in src/backend/cuda/kernels.rs.
struct M40KvLayer {
    int k_start;
    int v_start;
};

// Position `pos`'s keys (all KV heads, `width` values) of `layer` in the
// cache of `row`.
__device__ __forceinline__ __half *m40_cached_keys(const M40Row &row, M40KvLayer layer, int pos, int width) {
    return reinterpret_cast<__half *>(row.keys) + size_t(layer.k_start) * row.n_ctx + size_t(pos) * width;
}

// The same for its values.
__device__ __forceinline__ __half *m40_cached_values(const M40Row &row, M40KvLayer layer, int pos, int width) {
    return reinterpret_cast<__half *>(row.values) + size_t(layer.v_start) * row.n_ctx + size_t(pos) * width;
}

// One layer's attention-input step (per-head norms, RoPE, KV store).
// Mirrors `AttentionInputs` in src/backend/cuda/kernels.rs.
struct M40AttentionInputs {
    const M40Row *rows;
    const float *q_norm;   // head_dim_k f32, or null
    const float *k_norm;
    const float *factors;  // rope_dims / 2 frequency divisors, or null
    double freq_base;
    double freq_scale;
    double inv_freq_ratio;  // freq_base^(-2 / rope_dims)
    float eps;
    M40KvLayer layer;
    int n_head;
    int n_head_kv;
    int head_dim_k;
    int head_dim_v;
    int neox;
    int rope_dims;
    int overlap;  // overlap the stream's previous kernel (see m40_launch)
    M40Yarn yarn;
};

// RoPE's cos and sin of pair i of a head at `pos`, as the decode products'
// epilogue computes them: without the double-precision pow, cos and sin of
// m40_rope_angle (ops.cu), whose registers would become every product
// kernel's. Pair i's inverse frequency is ratio^i (ratio = base^(-2/dims),
// from the host), by squaring in double (relative error ~1e-14: 2e-9 rad at
// position 10^5); the angle is reduced to [-π, π] in double and its cos and
// sin taken in f32 (__sincosf: absolute error under 4e-7). No frequency
// factors: their double division alone changes the code of every product
// kernel, those with no attention inputs to store included, and measured
// slower on the H100, so models with factors keep the separate kernel. No
// YaRN either, for the same reason and because its one architecture
// (gpt-oss) pairs halves (NeoX), which the epilogue does not take anyway.
__device__ __forceinline__ void m40_rope_angle_reduced(int pos, int i, double ratio, double freq_scale, float &c,
                                                       float &s) {
    double inv_freq = 1.0, power = ratio;
    for (int e = i; e > 0; e >>= 1) {
        if (e & 1) inv_freq *= power;
        power *= power;
    }
    const double theta = double(pos) * freq_scale * inv_freq, two_pi = 6.283185307179586;
    const double turns = rint(theta * (1.0 / two_pi));
    __sincosf(float(fma(-turns, two_pi, theta)), &s, &c);
}

// What a decode product's rows are (M40GemvMatrix::role in gemv.cu): plain
// outputs, or one layer's query, key or value projection, which its
// epilogue turns into attention's inputs. Mirrors `ProjectionRole` in
// src/backend/cuda/kernels.rs.
enum M40ProjectionRole { M40_PLAIN_OUTPUT = 0, M40_QUERIES = 1, M40_KEYS = 2, M40_VALUES = 3 };

// Values `row` and row + 1 (a RoPE pair: `row` even) of activation row t's
// query, key or value projection (`role`), for models whose pairs are
// adjacent (not NeoX), without frequency factors, and whose heads have no
// norms: queries and keys rotated, then queries into `queries` (the row's
// f32 heads), keys and values into the row's cache as f16. The decode
// products' epilogue (gemv.cu) does attention_inputs_kernel's work with it.
__device__ inline void m40_attention_input_pair(const M40AttentionInputs &a, int role, int t, int row, float x0,
                                                float x1, float *queries) {
    const M40Row kv = a.rows[t];
    // Where a key or value pair goes: one address for either, so that the
    // epilogue's registers do not hold two.
    const bool is_values = role == M40_VALUES;
    const int start = is_values ? a.layer.v_start : a.layer.k_start;
    const int width = a.n_head_kv * (is_values ? a.head_dim_v : a.head_dim_k);
    __half *cached = reinterpret_cast<__half *>(is_values ? kv.values : kv.keys) + size_t(start) * kv.n_ctx +
                     size_t(kv.pos) * width + row;
    if (is_values) {
        cached[0] = __float2half_rn(x0);
        cached[1] = __float2half_rn(x1);
        return;
    }
    const int i = row % a.head_dim_k;
    if (i < a.rope_dims) {
        float c, s;
        m40_rope_angle_reduced(kv.pos, i / 2, a.inv_freq_ratio, a.freq_scale, c, s);
        const float r0 = x0 * c - x1 * s, r1 = x0 * s + x1 * c;
        x0 = r0, x1 = r1;
    }
    if (role == M40_QUERIES) {
        queries[row] = x0;
        queries[row + 1] = x1;
    } else {
        cached[0] = __float2half_rn(x0);
        cached[1] = __float2half_rn(x1);
    }
}

// One piece of an expert product's work (a mixture-of-experts block): rows
// first..first+count of the step's expert-sorted rows, all routed to
// `expert`. Written by m40_moe_route; count 0 marks an unused piece (the
// launches' grids are sized for the most pieces a step can have, so that a
// recorded decode step replays whatever its routing).
struct M40ExpertWork {
    int expert;
    int first;
    int count;
};

// How a product launch (M40Gemv, M40Mmq) multiplies expert matrices: one
// grid slice per work piece, its weights `expert_bytes` × expert past the
// launch's matrix (expert 0 of the stacked 3-D tensor), or, for the pieces
// of expert `shared_expert` where shared[0] is not null, the shared
// expert's matrices shared[m] (one per matrix of the launch: a shared
// expert every row uses, routed as one more expert). Output rows are the
// pieces' sorted rows; input rows too, unless x_shared (every piece reads
// x's rows from 0: one session's decode, whose pieces all take its one
// row). work null: a plain product. Mirrors `ExpertView` in
// src/backend/cuda/kernels.rs.
struct M40Experts {
    const M40ExpertWork *work;
    long long expert_bytes;
    int n_work;
    int x_shared;
    // Rows of x (and of its 8-bit copy, whose layout depends on the count).
    int x_rows;
    int shared_expert;
    const uint8_t *shared[3];
    // Values from one expert's bias row to the next: a matrix's bias
    // (M40GemvMatrix::bias, M40Mmq::bias) is then a table of a row per
    // expert, as gpt-oss's expert biases are; 0: every expert takes the
    // same row. The shared expert has none.
    long long bias_stride;
};

// Matrix m's weights for a work piece of expert `expert` (see M40Experts),
// given the launch's matrix `w` (expert 0's).
__device__ __forceinline__ const uint8_t *m40_expert_matrix(const M40Experts &e, const uint8_t *w, int m, int expert) {
    if (e.shared[0] && expert == e.shared_expert) return m == 0 ? e.shared[0] : m == 1 ? e.shared[1] : e.shared[2];
    return w + size_t(expert) * size_t(e.expert_bytes);
}

// A matrix's bias for a work piece of expert `expert`, given the launch's
// bias `bias` (expert 0's row, or null).
__device__ __forceinline__ const float *m40_expert_bias(const M40Experts &e, const float *bias, int expert) {
    if (!bias || (e.shared[0] && expert == e.shared_expert)) return nullptr;
    return bias + size_t(expert) * size_t(e.bias_stride);
}
