// The largest logits of each row, for sampling on the host without the
// whole vocabulary crossing the bus (m40_decode_batch_sample): 32 sessions
// of a 262,144-token vocabulary are 33.5 MB of logits a step, the few dozen
// candidates a sampler keeps under a kilobyte a session.
//
// A row's `want` largest values are found by radix selection on their
// order-preserving 32-bit keys (the order of Rust's f32::total_cmp): three
// histogram passes over the row fix the key of the want-th largest 12, 12
// and 8 bits at a time, then one pass collects every value above it and,
// of the values equal to it, those of the lowest ids — the host sampler's
// order (value, then the lower id first). One block a row.
#pragma once

#include "common.cuh"

#define M40_TOP_THREADS 1024

// The key of a float: larger floats have larger keys, -0 below +0, NaNs
// with the sign bit clear above +inf (f32::total_cmp's order).
__device__ __forceinline__ uint32_t m40_order_key(float f) {
    const uint32_t u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Exclusive prefix sum of v over the block, and the block's total. Every
// thread calls it.
__device__ uint32_t m40_block_exclusive_scan(uint32_t v, uint32_t *total) {
    __shared__ uint32_t warp_sums[M40_TOP_THREADS / 32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    uint32_t inclusive = v;
    for (int d = 1; d < 32; d *= 2) {
        const uint32_t other = __shfl_up_sync(0xffffffffu, inclusive, d);
        if (lane >= d) inclusive += other;
    }
    if (lane == 31) warp_sums[warp] = inclusive;
    __syncthreads();
    if (warp == 0) {
        uint32_t w = lane < M40_TOP_THREADS / 32 ? warp_sums[lane] : 0;
        for (int d = 1; d < 32; d *= 2) {
            const uint32_t other = __shfl_up_sync(0xffffffffu, w, d);
            if (lane >= d) w += other;
        }
        if (lane < M40_TOP_THREADS / 32) warp_sums[lane] = w;
    }
    __syncthreads();
    const uint32_t before = (warp > 0 ? warp_sums[warp - 1] : 0) + inclusive - v;
    *total = warp_sums[M40_TOP_THREADS / 32 - 1];
    __syncthreads();  // warp_sums is reused by the next call
    return before;
}

// Row blockIdx.x of logits (n_vocab values): ids and values of its want
// largest (want[row] ≤ max_want, 0: none) at row · max_want of out_ids and
// out_values, in no particular order, and the values at its extra ids
// (extra_ids[extra_offsets[row] .. extra_offsets[row + 1]]) at the same
// places of extra_values.
__global__ void __launch_bounds__(M40_TOP_THREADS)
    top_logits_kernel(const float *__restrict__ logits, int n_vocab, const int *__restrict__ want, int max_want,
                      int *__restrict__ out_ids, float *__restrict__ out_values, const int *__restrict__ extra_offsets,
                      const int *__restrict__ extra_ids, float *__restrict__ extra_values) {
    __shared__ uint32_t histogram[4096];
    __shared__ uint32_t found_bin, found_above, n_out;
    const int row = blockIdx.x;
    const float *values = logits + size_t(row) * n_vocab;
    for (int i = extra_offsets[row] + threadIdx.x; i < extra_offsets[row + 1]; i += M40_TOP_THREADS)
        extra_values[i] = values[extra_ids[i]];
    const uint32_t wanted = uint32_t(min(want[row], n_vocab));
    if (wanted == 0) return;  // the same for the whole block

    // Keys matching `prefix` under `fixed` are the candidates for the
    // want-th largest; `need` of them are still wanted.
    uint32_t prefix = 0, fixed = 0, need = wanted, last_count = 0;
    constexpr int SHIFTS[3] = {20, 8, 0}, BITS[3] = {12, 12, 8};
#pragma unroll
    for (int level = 0; level < 3; level++) {
        const int shift = SHIFTS[level], bins = 1 << BITS[level];
        for (int b = threadIdx.x; b < bins; b += M40_TOP_THREADS) histogram[b] = 0;
        __syncthreads();
        for (int i = threadIdx.x; i < n_vocab; i += M40_TOP_THREADS) {
            const uint32_t k = m40_order_key(values[i]);
            if ((k & fixed) == prefix) atomicAdd(&histogram[(k >> shift) & (bins - 1)], 1u);
        }
        __syncthreads();
        // Thread t sums its bins counted from the top (bin bins−1 first),
        // so the scan's prefix is the count of keys above its bins.
        const int per = bins >= M40_TOP_THREADS ? bins / M40_TOP_THREADS : 1;
        const int first = threadIdx.x * per;
        uint32_t mine = 0;
        if (first < bins)
            for (int j = 0; j < per; j++) mine += histogram[bins - 1 - (first + j)];
        uint32_t total;
        const uint32_t above = m40_block_exclusive_scan(mine, &total);
        if (first < bins && above < need && need <= above + mine) {
            uint32_t count = above;
            for (int j = 0; j < per; j++) {
                const int bin = bins - 1 - (first + j);
                if (count + histogram[bin] >= need) {
                    found_bin = uint32_t(bin);
                    found_above = count;
                    break;
                }
                count += histogram[bin];
            }
        }
        __syncthreads();
        prefix |= found_bin << shift;
        fixed |= uint32_t(bins - 1) << shift;
        need -= found_above;
        last_count = histogram[found_bin];
        __syncthreads();  // histogram and found_* are rewritten next level
    }

    // prefix is now the want-th largest key; `need` (≥ 1) of the
    // last_count keys equal to it are taken, wanted − need keys lie above.
    if (threadIdx.x == 0) n_out = 0;
    __syncthreads();
    int *ids = out_ids + size_t(row) * max_want;
    float *vals = out_values + size_t(row) * max_want;
    const bool all_equal_taken = last_count == need;
    for (int i = threadIdx.x; i < n_vocab; i += M40_TOP_THREADS) {
        const float v = values[i];
        const uint32_t k = m40_order_key(v);
        if (k > prefix || (all_equal_taken && k == prefix)) {
            const uint32_t slot = atomicAdd(&n_out, 1u);
            ids[slot] = i;
            vals[slot] = v;
        }
    }
    if (all_equal_taken) return;
    // More keys equal the threshold than are wanted: the lowest ids among
    // them, each thread a contiguous range of ids, ranked by a scan.
    const int span = (n_vocab + M40_TOP_THREADS - 1) / M40_TOP_THREADS;
    const int begin = min(n_vocab, int(threadIdx.x) * span), end = min(n_vocab, begin + span);
    uint32_t equal = 0;
    for (int i = begin; i < end; i++) equal += m40_order_key(values[i]) == prefix;
    uint32_t total;
    uint32_t rank = m40_block_exclusive_scan(equal, &total);
    const uint32_t base = wanted - need;
    for (int i = begin; i < end && rank < need; i++) {
        if (m40_order_key(values[i]) == prefix) {
            ids[base + rank] = i;
            vals[base + rank] = values[i];
            rank++;
        }
    }
}

// For each of n_rows rows of logits (n_vocab values each, row r at
// logits + r · n_vocab): its want[r] largest values (0 ≤ want[r] ≤ max_want)
// and their ids at r · max_want of out_values and out_ids, and the values
// at the ids extra_ids[extra_offsets[r] .. extra_offsets[r + 1]] at the same
// places of extra_values. The want inputs and extra lists are in device
// memory.
M40_EXPORT cudaError_t m40_top_logits(const float *logits, int n_vocab, int n_rows, const int *want, int max_want,
                                      int *out_ids, float *out_values, const int *extra_offsets,
                                      const int *extra_ids, float *extra_values, cudaStream_t stream) {
    if (n_vocab < 1 || n_rows < 1 || n_rows > 65535 || max_want < 0) return cudaErrorInvalidValue;
    top_logits_kernel<<<n_rows, M40_TOP_THREADS, 0, stream>>>(logits, n_vocab, want, max_want, out_ids, out_values,
                                                              extra_offsets, extra_ids, extra_values);
    return m40_launch_status();
}
