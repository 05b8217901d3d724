// Types shared by the element-wise and attention kernels and their Rust callers.
#pragma once

#include "common.cuh"

// One row of a batch as the KV-cache kernels see it: where its sequence's
// cache lives and the row's position there. Mirrors `DeviceRow` in
// src/backend/cuda/kernels.rs.
struct M40Row {
    // Device addresses of the sequence's f16 keys and values:
    // n_layer × n_ctx × width each, layer-major.
    unsigned long long keys;
    unsigned long long values;
    int pos;
    int n_ctx;
};

// Head sizes the attention kernels handle.
#define M40_MAX_HEAD_DIM 256

// One layer's attention-input step (per-head norms, RoPE, KV store).
// Mirrors `AttentionInputs` in src/backend/cuda/kernels.rs.
struct M40AttentionInputs {
    const M40Row *rows;
    const float *q_norm;   // head_dim_k f32, or null
    const float *k_norm;
    const float *factors;  // rope_dims / 2 frequency divisors, or null
    double freq_base;
    double freq_scale;
    float eps;
    int layer;
    int n_head;
    int n_head_kv;
    int head_dim_k;
    int head_dim_v;
    int neox;
    int rope_dims;
    int overlap;  // overlap the stream's previous kernel (see m40_launch)
};
