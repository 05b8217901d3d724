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
