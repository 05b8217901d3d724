// Causal attention of each row's query heads over its sequence's f16 KV
// cache: the positions a row sees are split into n_splits ranges, each
// (head, row, range) computing an online-softmax partial (max, sum, weighted
// values) in a block or, for many short decode ranges, a warp of its own;
// then one block per (head, row) combines the partials (or, with one range,
// the output is written directly). Decode rows take
// a kernel whose lanes score 32 positions at once; prompt chunks a tiled
// kernel sharing each key and value among 32 rows; odd head sizes a kernel
// with a warp per position. A head's sink logit (gpt-oss's attention sinks),
// where the model has them, joins its softmax without a value wherever the
// output is normalized (m40_softmax_divisor).
#include <type_traits>
#include <utility>

#include "ops.cuh"
#include "prepare.cuh"

#define M40_ATTN_WARPS 4
// Head sizes up to 32 × this many values per lane (M40_MAX_HEAD_DIM).
#define M40_ATTN_MAX_PER_LANE 16
static_assert(32 * M40_ATTN_MAX_PER_LANE == M40_MAX_HEAD_DIM, "every kernel takes the heads m40_attention accepts");

struct Partial {
    float max, sum;
};

// What a head's weighted sum of values is divided by to become its output,
// given the softmax's maximum score and its sum of e^(score − max) over the
// positions: that sum, plus e^(sink − max) where the head has a sink logit
// (`sinks`: one per query head, or null). The sink joins the softmax
// without a value, as ggml's soft_max with sinks takes it; the CPU backend's
// finish_partials (src/backend/cpu/ops.rs) computes the same quotient with
// the sink in the maximum.
__device__ __forceinline__ float m40_softmax_divisor(float max, float sum, const float *sinks, int head) {
    return sinks ? sum + expf(sinks[head] - max) : sum;
}

// One KV head of a row's cache at the layer that starts `start` values a
// position in (keys or values, `width` values per position: M40KvLayer):
// position p's head_dim values start at the result + p × width.
__device__ __forceinline__ const __half *m40_cache_head(unsigned long long cache, int start, int n_ctx, int kv_head,
                                                        int head_dim) {
    return reinterpret_cast<const __half *>(cache) + size_t(start) * n_ctx + size_t(kv_head) * head_dim;
}

// What (row r, head, split) of a decode-style launch attends to: its range
// begin .. end of the positions the row sees, and its KV head's keys and
// values (`k_width` / `v_width` halves per position).
struct M40Range {
    int begin, end, k_width, v_width;
    const __half *keys, *values;
};

__device__ __forceinline__ M40Range m40_range(const M40Row &row, M40KvLayer layer, int head, int n_head, int n_head_kv,
                                              int head_dim_k, int head_dim_v, int window, int n_splits, int split) {
    M40Range g;
    const int first = window > 0 ? max(0, row.pos + 1 - window) : 0;
    const int per_split = (row.pos + 1 - first + n_splits - 1) / n_splits;
    g.begin = first + split * per_split;
    g.end = min(row.pos + 1, g.begin + per_split);
    const int kv_head = head / (n_head / n_head_kv);
    g.k_width = n_head_kv * head_dim_k;
    g.v_width = n_head_kv * head_dim_v;
    g.keys = m40_cache_head(row.keys, layer.k_start, row.n_ctx, kv_head, head_dim_k);
    g.values = m40_cache_head(row.values, layer.v_start, row.n_ctx, kv_head, head_dim_v);
    return g;
}

// Where decode attention also writes its output prepared for the product
// that takes it (prepare.cuh), sparing that product its prepare launch:
// row r's value i at row r of n_x rows of cols in scratch, in `form` (the
// product's format's, m40_prepared_form); none where scratch is null.
// Heads of a multiple of 32 values, so that a warp's 32 lanes hold a block
// of 32.
struct M40PreparedOut {
    int8_t *scratch;
    int cols, n_x;
    int form;
};

// One warp merges WARPS warps' online-softmax states (states[w], values
// accs[w * stride + d]; a warp that saw no position has max −∞ and sum 0)
// into `o`: the normalized output (o[d]) of query head `head` (its sink
// where `sinks` has one) when `normalize`, else a partial [max, sum,
// acc[head_dim_v]] for the combine kernel. A normalized output also goes to
// `prepared` (row r, values from `first`) where it has a scratch.
template <int WARPS>
__device__ void m40_merge_warps(const Partial *states, const float *accs, int stride, int head_dim_v, bool normalize,
                                float *o, const float *sinks = nullptr, int head = 0, M40PreparedOut prepared = {},
                                int r = 0, int first = 0) {
    const int lane = threadIdx.x % 32;
    float block_max = -INFINITY;
    for (int w = 0; w < WARPS; w++) block_max = fmaxf(block_max, states[w].max);
    float block_sum = 0.0f, factor[WARPS];
    for (int w = 0; w < WARPS; w++) {
        factor[w] = states[w].sum > 0.0f ? expf(states[w].max - block_max) : 0.0f;
        block_sum += states[w].sum * factor[w];
    }
    if (!normalize && lane == 0) o[0] = block_max, o[1] = block_sum;
    const float divisor = normalize ? m40_softmax_divisor(block_max, block_sum, sinks, head) : 1.0f;
    for (int d = lane; d < head_dim_v; d += 32) {
        float a = 0.0f;
        for (int w = 0; w < WARPS; w++) a += accs[w * stride + d] * factor[w];
        if (normalize) {
            o[d] = a / divisor;
            if (prepared.scratch) m40_prepare_value(a / divisor, first + d, prepared.cols, prepared.n_x, prepared.scratch, r,
                                  prepared.form);
        } else {
            o[2 + d] = a;
        }
    }
}

// partial layout: per (row, head, split): [max, sum, acc[head_dim_v]].
__global__ void __launch_bounds__(32 * M40_ATTN_WARPS)
    attention_partial_kernel(const float *__restrict__ q, const M40Row *__restrict__ rows, M40KvLayer layer, int n_head,
                             int n_head_kv, int head_dim_k, int head_dim_v, int window, float scale, int n_splits,
                             float *__restrict__ partial) {
    m40_wait_for_prior_kernels();
    m40_allow_next_kernel();
    // Rows on x, whose limit (2^31 − 1) no batch reaches; heads and splits on y and z.
    const int r = blockIdx.x, head = blockIdx.y, split = blockIdx.z;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const M40Range g =
        m40_range(rows[r], layer, head, n_head, n_head_kv, head_dim_k, head_dim_v, window, n_splits, split);

    float qv[M40_ATTN_MAX_PER_LANE], acc[M40_ATTN_MAX_PER_LANE];
    const float *qh = q + (size_t(r) * n_head + head) * head_dim_k;
#pragma unroll
    for (int j = 0; j < M40_ATTN_MAX_PER_LANE; j++) {
        const int d = lane + 32 * j;
        qv[j] = d < head_dim_k ? qh[d] * scale : 0.0f;
        acc[j] = 0.0f;
    }
    float run_max = -INFINITY, run_sum = 0.0f;
    for (int p = g.begin + warp; p < g.end; p += M40_ATTN_WARPS) {
        const __half *key = g.keys + size_t(p) * g.k_width;
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
        const __half *value = g.values + size_t(p) * g.v_width;
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
    m40_merge_warps<M40_ATTN_WARPS>(states, &accs[0][0], 32 * M40_ATTN_MAX_PER_LANE, head_dim_v, false,
                    partial + ((size_t(r) * n_head + head) * n_splits + split) * (head_dim_v + 2));
}

__global__ void attention_combine_kernel(const float *__restrict__ partial, int n_head, int head_dim_v,
                                         int n_splits, const float *__restrict__ sinks, float *__restrict__ out,
                                         M40PreparedOut prepared) {
    m40_wait_for_prior_kernels();
    m40_allow_next_kernel();
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
    total = m40_softmax_divisor(max_all, total, sinks, head);
    for (int d = threadIdx.x; d < head_dim_v; d += blockDim.x) {
        float a = 0.0f;
        for (int s = 0; s < n_splits; s++) {
            const float *p = parts + s * (head_dim_v + 2);
            if (p[1] > 0.0f) a += p[2 + d] * expf(p[0] - max_all);
        }
        out[(size_t(r) * n_head + head) * head_dim_v + d] = a / total;
        if (prepared.scratch)
            m40_prepare_value(a / total, head * head_dim_v + d, prepared.cols, prepared.n_x, prepared.scratch, r,
                              prepared.form);
    }
}

// ---- Prefill: a tile of consecutive rows of one sequence per block ----
//
// The kernel above gives every (row, head) its own walk over the positions,
// one position after another, each a warp-wide reduction: fine for decode's
// one row, slow for a prompt's hundreds. Here a block takes TILE_ROWS
// consecutive rows of one sequence (consecutive positions) and one query
// head, and walks the positions 32 at a time (flash-attention style): the
// 32 keys go to shared memory once for all the tile's rows, lane c scores
// position c against the warp's ROWS queries (one online-softmax update per
// 32 positions), then the 32 values are read once for every row. f16 keys
// and values stay f16 in shared memory (converted as read: one conversion
// per ROWS multiply-adds); all arithmetic is FP32.

// Up to MAX_D-value heads; ROWS query rows per warp, 4 warps.
template <int MAX_D> struct PrefillTile {
    static constexpr int ROWS = MAX_D > 128 ? 4 : 8;
    static constexpr int WARPS = 4;
    static constexpr int TILE_ROWS = ROWS * WARPS;
    // Values of a head the shared tile holds at once: the whole head up to
    // 256; wider heads pass through it in pieces of 128, which keeps a
    // block within the 48 KB of shared memory a block gets on every GPU
    // (sm_52 included): at 512 the queries take 32 KB, a whole-head tile
    // would take 66 KB, a piece's 8.4 KB.
    static constexpr int PIECE = MAX_D > 256 ? 128 : MAX_D;
    static constexpr int PIECES = MAX_D / PIECE;
    // f16 pairs of a piece, and the key/value row stride in 32-bit words:
    // two words of padding keep lane c's 8-byte key loads conflict-free.
    static constexpr int PAIRS = PIECE / 2;
    static constexpr int STRIDE = PAIRS + 2;
    // Value pairs per lane and piece: lane owns pairs lane + 32 j of each.
    static constexpr int LANE_PAIRS = (PAIRS + 31) / 32;
    // Accumulators per row: every piece's pairs.
    static constexpr int ACCS = 2 * LANE_PAIRS * PIECES;
    // The head value of a lane's accumulator pair j (of piece j / LANE_PAIRS).
    static __device__ __forceinline__ int value(int j, int lane) {
        return (j / LANE_PAIRS) * PIECE + 2 * (lane + 32 * (j % LANE_PAIRS));
    }
};

__device__ __forceinline__ float2 m40_half2_bits(uint32_t w) {
    return make_float2(m40_half_bits(uint16_t(w & 0xffffu)), m40_half_bits(uint16_t(w >> 16)));
}

// f(std::integral_constant<int, i>) for i = 0 .. N − 1, in order: a loop
// over a head's pieces whose index is a constant in each body (it picks
// registers).
template <class F, int... I> __device__ __forceinline__ void m40_each_index(F &f, std::integer_sequence<int, I...>) {
    (f(std::integral_constant<int, I>{}), ...);
}
template <int N, class F> __device__ __forceinline__ void m40_each_piece(F &&f) {
    m40_each_index(f, std::make_integer_sequence<int, N>{});
}

// Copies positions begin .. begin+31 (those below end; zeros past it) of
// `dim` values (a multiple of 8, at most a PIECE) of one head's keys or
// values, from `head` on, into shared memory, STRIDE words per position.
template <int MAX_D>
__device__ __forceinline__ void m40_load_kv_tile(uint32_t *tile, const __half *head, int width, int dim, int begin,
                                                 int end) {
    using T = PrefillTile<MAX_D>;
    const int chunks = dim / 8;  // 16-byte pieces per position
    for (int i = threadIdx.x; i < 32 * chunks; i += 32 * T::WARPS) {
        const int c = i / chunks, part = i % chunks, p = begin + c;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (p < end) v = *reinterpret_cast<const uint4 *>(head + size_t(p) * width + 8 * part);
        uint2 *dst = reinterpret_cast<uint2 *>(tile + c * T::STRIDE + 4 * part);
        dst[0] = make_uint2(v.x, v.y);
        dst[1] = make_uint2(v.z, v.w);
    }
}

// partial: as attention_partial_kernel's, one entry per (row, head, split);
// with one split the normalized output goes straight to out.
template <int MAX_D>
__global__ void __launch_bounds__(32 * PrefillTile<MAX_D>::WARPS)
    attention_prefill_kernel(const float *__restrict__ q, int n_rows, const M40Row *__restrict__ rows, M40KvLayer layer,
                             int n_head, int n_head_kv, int head_dim_k, int head_dim_v, int window, float scale,
                             int n_splits, const float *__restrict__ sinks, float *__restrict__ partial,
                             float *__restrict__ out) {
    m40_wait_for_prior_kernels();
    m40_allow_next_kernel();
    using T = PrefillTile<MAX_D>;
    constexpr int ROWS = T::ROWS;
    __shared__ __align__(16) float queries[T::TILE_ROWS][MAX_D];
    __shared__ __align__(16) uint32_t kv[32 * T::STRIDE];
    __shared__ __align__(16) float probs[T::WARPS][32][ROWS];  // [warp][position][row]

    const int first_row = blockIdx.x * T::TILE_ROWS, head = blockIdx.y, split = blockIdx.z;
    const int tile_rows = min(T::TILE_ROWS, n_rows - first_row);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const M40Row row0 = rows[first_row];
    const int pos0 = row0.pos;

    // Positions any row of the tile sees, this split's share of them.
    const int seen_begin = window > 0 ? max(0, pos0 + 1 - window) : 0;
    const int seen_end = pos0 + tile_rows;
    const int per_split = (seen_end - seen_begin + n_splits - 1) / n_splits;
    const int begin = seen_begin + split * per_split;
    const int end = min(seen_end, begin + per_split);

    const int kv_head = head / (n_head / n_head_kv);
    const int k_width = n_head_kv * head_dim_k, v_width = n_head_kv * head_dim_v;
    const __half *keys = m40_cache_head(row0.keys, layer.k_start, row0.n_ctx, kv_head, head_dim_k);
    const __half *values = m40_cache_head(row0.values, layer.v_start, row0.n_ctx, kv_head, head_dim_v);

    for (int i = threadIdx.x; i < T::TILE_ROWS * MAX_D; i += 32 * T::WARPS) {
        const int r = i / MAX_D, d = i % MAX_D;
        queries[r][d] = r < tile_rows && d < head_dim_k
                            ? q[(size_t(first_row + r) * n_head + head) * head_dim_k + d] * scale
                            : 0.0f;
    }

    // Row r of this warp is tile row warp * ROWS + r, at position pos0 + that.
    const int warp_first = warp * ROWS;
    float run_max[ROWS], lane_sum[ROWS], acc[ROWS][T::ACCS];
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
        run_max[r] = -INFINITY;
        lane_sum[r] = 0.0f;
#pragma unroll
        for (int j = 0; j < T::ACCS; j++) acc[r][j] = 0.0f;
    }

    for (int t = begin; t < end; t += 32) {
        // Scores of position t + lane against the warp's rows, 4 dims a step.
        float score[ROWS];
#pragma unroll
        for (int r = 0; r < ROWS; r++) score[r] = 0.0f;
        m40_each_piece<T::PIECES>([&](auto piece) {
            const int from = decltype(piece)::value * T::PIECE;
            const int dims = T::PIECES == 1 ? head_dim_k : min(T::PIECE, head_dim_k - from);
            if (T::PIECES > 1 && dims <= 0) return;
            __syncthreads();  // the queries are in; the previous tile is read
            m40_load_kv_tile<MAX_D>(kv, keys + from, k_width, dims, t, end);
            __syncthreads();
            const uint32_t *key = kv + lane * T::STRIDE;
            for (int d = 0; d < dims; d += 4) {
                const uint2 words = *reinterpret_cast<const uint2 *>(key + d / 2);
                const float2 k01 = m40_half2_bits(words.x), k23 = m40_half2_bits(words.y);
#pragma unroll
                for (int r = 0; r < ROWS; r++) {
                    const float4 qv = *reinterpret_cast<const float4 *>(&queries[warp_first + r][from + d]);
                    score[r] += qv.x * k01.x + qv.y * k01.y + qv.z * k23.x + qv.w * k23.y;
                }
            }
        });

        // Causal and window masks, then one online-softmax step per row.
        const int p = t + lane;
        float correction[ROWS];
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            const int local = warp_first + r, pos = pos0 + local;
            const bool visible = local < tile_rows && p < end && p <= pos && (window <= 0 || p > pos - window);
            const float s = visible ? score[r] : -INFINITY;
            const float new_max = fmaxf(run_max[r], m40_warp_max(s));
            // A row that has seen nothing yet keeps max −∞ and weight 0.
            const float weight = new_max == -INFINITY ? 0.0f : expf(s - new_max);
            correction[r] = new_max == -INFINITY ? 1.0f : expf(run_max[r] - new_max);
            lane_sum[r] = lane_sum[r] * correction[r] + weight;
            run_max[r] = new_max;
            probs[warp][lane][r] = weight;
        }
        const int n_pos = min(32, end - t);
        m40_each_piece<T::PIECES>([&](auto piece_constant) {
            constexpr int piece = decltype(piece_constant)::value;
            const int from = piece * T::PIECE;
            const int dims = T::PIECES == 1 ? head_dim_v : min(T::PIECE, head_dim_v - from);
            if (T::PIECES > 1 && dims <= 0) return;
            __syncthreads();  // every warp is done with the previous tile; probs are written
            m40_load_kv_tile<MAX_D>(kv, values + from, v_width, dims, t, end);
            __syncthreads();
            if constexpr (piece == 0)
#pragma unroll
                for (int r = 0; r < ROWS; r++)
#pragma unroll
                    for (int j = 0; j < T::ACCS; j++) acc[r][j] *= correction[r];
            constexpr int first_acc = 2 * T::LANE_PAIRS * piece;
            for (int c = 0; c < n_pos; c++) {
                float weight[ROWS];
#pragma unroll
                for (int r = 0; r < ROWS; r += 4) {
                    const float4 w4 = *reinterpret_cast<const float4 *>(&probs[warp][c][r]);
                    weight[r] = w4.x, weight[r + 1] = w4.y, weight[r + 2] = w4.z, weight[r + 3] = w4.w;
                }
#pragma unroll
                for (int j = 0; j < T::LANE_PAIRS; j++) {
                    const int pair = lane + 32 * j;
                    if (2 * pair < dims) {
                        const float2 v = m40_half2_bits(kv[c * T::STRIDE + pair]);
#pragma unroll
                        for (int r = 0; r < ROWS; r++) {
                            acc[r][first_acc + 2 * j] += weight[r] * v.x;
                            acc[r][first_acc + 2 * j + 1] += weight[r] * v.y;
                        }
                    }
                }
            }
        });
    }

#pragma unroll
    for (int r = 0; r < ROWS; r++) {
        const int local = warp_first + r;
        const float sum = m40_warp_sum(lane_sum[r]);
        if (local >= tile_rows) continue;
        const size_t row_head = size_t(first_row + local) * n_head + head;
        if (n_splits == 1) {
            float *o = out + row_head * head_dim_v;
            const float divisor = m40_softmax_divisor(run_max[r], sum, sinks, head);
#pragma unroll
            for (int j = 0; j < T::ACCS / 2; j++) {
                const int d = T::value(j, lane);
                if (d < head_dim_v) o[d] = acc[r][2 * j] / divisor, o[d + 1] = acc[r][2 * j + 1] / divisor;
            }
        } else {
            float *o = partial + (row_head * n_splits + split) * (head_dim_v + 2);
            if (lane == 0) o[0] = run_max[r], o[1] = sum;
#pragma unroll
            for (int j = 0; j < T::ACCS / 2; j++) {
                const int d = T::value(j, lane);
                if (d < head_dim_v) o[2 + d] = acc[r][2 * j], o[3 + d] = acc[r][2 * j + 1];
            }
        }
    }
}

// ---- Decode: a lane per position ----
//
// attention_partial_kernel walks a warp's positions one after another, each
// a chain of dependent loads and a warp reduction: at decode's short ranges
// the step is a handful of memory round trips per position. Here lane c of a
// warp scores position t + c on its own (its key read with 16-byte loads,
// all independent, the query broadcast from shared memory), the warp takes
// one online-softmax step per 32 positions, and the 32 value rows are read
// coalesced (lane owns value pairs lane + 32 j). For heads of up to 128
// values the values are loaded together with the keys, before any score
// is known, so that 32 positions cost one memory round trip rather than
// one for the keys and one per few value rows; 256-value heads would need
// twice the registers and load their values after the scores, and a
// 512-value head's key is read in two halves. Heads of a multiple of 8
// values; one split writes the normalized output directly, more write
// partials for the combine kernel.
//
// A block takes HEADS query heads of a row (blockIdx.y × HEADS onwards), its
// warps dealt out evenly among them. With one head the four warps share its
// range, 32 positions each in turn, which suits a few rows' long ranges.
// Many rows' short ranges (32 sessions at ~100 positions: at most one round
// for each warp) would leave most of those warps idle while they hold their
// registers (~200 a thread: two blocks an SM); with four heads every warp
// walks a range of its own (four_heads_a_block in src/backend/cuda/mod.rs
// chooses).
template <int MAX_D, int HEADS>
__global__ void __launch_bounds__(32 * M40_ATTN_WARPS)
    attention_decode_kernel(const float *__restrict__ q, const M40Row *__restrict__ rows, M40KvLayer layer, int n_head,
                            int n_head_kv, int head_dim_k, int head_dim_v, int window, float scale, int n_splits,
                            const float *__restrict__ sinks, float *__restrict__ partial, float *__restrict__ out,
                            M40PreparedOut prepared) {
    m40_wait_for_prior_kernels();
    m40_allow_next_kernel();
    static_assert(M40_ATTN_WARPS % HEADS == 0, "a head's warps are a whole share of the block's");
    constexpr int CHUNKS = MAX_D / 8;       // 16-byte pieces of a key, at most
    // A lane reads its key up to 32 pieces (256 values, 128 registers) at a
    // time: a 512-value head in two groups.
    constexpr int GROUP = CHUNKS < 32 ? CHUNKS : 32;
    constexpr int LANE_PAIRS = MAX_D / 64;  // value pairs per lane
    constexpr bool VALUES_WITH_KEYS = MAX_D <= 128;
    constexpr int HEAD_WARPS = M40_ATTN_WARPS / HEADS, HEAD_THREADS = 32 * HEAD_WARPS;
    constexpr int QUERY_PER_THREAD = (MAX_D + HEAD_THREADS - 1) / HEAD_THREADS;
    const int r = blockIdx.x, split = blockIdx.z;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    // The warp's head (its slot in the block) and its turn among the head's warps.
    const int slot = warp / HEAD_WARPS, turn = warp % HEAD_WARPS, head_thread = threadIdx.x % HEAD_THREADS;
    const int head = blockIdx.y * HEADS + slot;
    // The last block's spare slots (n_head not a multiple of HEADS) take no positions.
    const bool has_head = head < n_head;

    // The query's loads go out beside the row table's: neither waits on the
    // other. (A spare slot's pointer is its row's last head, never read.)
    const float *qh = q + (size_t(r) * n_head + min(head, n_head - 1)) * head_dim_k;
    float query_part[QUERY_PER_THREAD];
#pragma unroll
    for (int i = 0; i < QUERY_PER_THREAD; i++) {
        const int d = head_thread + HEAD_THREADS * i;
        query_part[i] = has_head && d < head_dim_k ? qh[d] : 0.0f;
    }
    M40Range g = m40_range(rows[r], layer, min(head, n_head - 1), n_head, n_head_kv, head_dim_k, head_dim_v, window,
                           n_splits, split);
    if (!has_head) g.end = g.begin;
    __shared__ __align__(16) float queries[HEADS][MAX_D];
    float *query = queries[slot];
#pragma unroll
    for (int i = 0; i < QUERY_PER_THREAD; i++) {
        const int d = head_thread + HEAD_THREADS * i;
        if (d < head_dim_k) query[d] = query_part[i] * scale;
    }
    __syncthreads();

    float acc[2 * LANE_PAIRS];
#pragma unroll
    for (int j = 0; j < 2 * LANE_PAIRS; j++) acc[j] = 0.0f;
    float run_max = -INFINITY, run_sum = 0.0f;
    for (int t = g.begin + 32 * turn; t < g.end; t += 32 * HEAD_WARPS) {
        const bool valid = t + lane < g.end;
        const int n = min(32, g.end - t);
        // Value pair `pair` of position t + c (c < n, pair within the head).
        const auto value_word = [&](int c, int pair) {
            return reinterpret_cast<const uint32_t *>(g.values + size_t(t + c) * g.v_width)[pair];
        };
        uint32_t values[VALUES_WITH_KEYS ? 32 : 1][LANE_PAIRS];
        float s = valid ? 0.0f : -INFINITY;
#pragma unroll
        for (int group = 0; group < CHUNKS / GROUP; group++) {
            const int first = group * GROUP;
            if (group > 0 && 8 * first >= head_dim_k) break;
            uint4 pieces[GROUP];
            if (valid) {
                const uint4 *key = reinterpret_cast<const uint4 *>(g.keys + size_t(t + lane) * g.k_width) + first;
#pragma unroll
                for (int i = 0; i < GROUP; i++)
                    if (8 * (first + i) < head_dim_k) pieces[i] = key[i];
            }
            // Heads of up to 128 values are one group.
            if constexpr (VALUES_WITH_KEYS) {
#pragma unroll
                for (int c = 0; c < 32; c++)
#pragma unroll
                    for (int j = 0; j < LANE_PAIRS; j++) {
                        const int pair = lane + 32 * j;
                        if (c < n && 2 * pair < head_dim_v) values[c][j] = value_word(c, pair);
                    }
            }
            if (valid) {
#pragma unroll
                for (int i = 0; i < GROUP; i++) {
                    const int d = 8 * (first + i);
                    if (d >= head_dim_k) break;
                    const float4 qa = *reinterpret_cast<const float4 *>(&query[d]);
                    const float4 qb = *reinterpret_cast<const float4 *>(&query[d + 4]);
                    const float2 k0 = m40_half2_bits(pieces[i].x), k1 = m40_half2_bits(pieces[i].y);
                    const float2 k2 = m40_half2_bits(pieces[i].z), k3 = m40_half2_bits(pieces[i].w);
                    s = fmaf(qa.x, k0.x, fmaf(qa.y, k0.y, fmaf(qa.z, k1.x, fmaf(qa.w, k1.y, s))));
                    s = fmaf(qb.x, k2.x, fmaf(qb.y, k2.y, fmaf(qb.z, k3.x, fmaf(qb.w, k3.y, s))));
                }
            }
        }
        // Lane 0's position is always valid: new_max is finite.
        const float new_max = fmaxf(run_max, m40_warp_max(s));
        const float correction = expf(run_max - new_max);
        const float weight = valid ? expf(s - new_max) : 0.0f;
        run_sum = run_sum * correction + m40_warp_sum(weight);
#pragma unroll
        for (int j = 0; j < 2 * LANE_PAIRS; j++) acc[j] *= correction;
        // Position c's value pairs, weighted (c < n: the shuffle is warp-wide).
        const auto accumulate = [&](int c, const auto &word_of_pair) {
            const float w = __shfl_sync(0xffffffffu, weight, c);
#pragma unroll
            for (int j = 0; j < LANE_PAIRS; j++) {
                if (2 * (lane + 32 * j) >= head_dim_v) continue;
                const float2 v = m40_half2_bits(word_of_pair(j));
                acc[2 * j] = fmaf(w, v.x, acc[2 * j]);
                acc[2 * j + 1] = fmaf(w, v.y, acc[2 * j + 1]);
            }
        };
        if constexpr (VALUES_WITH_KEYS) {
#pragma unroll
            for (int c = 0; c < 32; c++)
                if (c < n) accumulate(c, [&](int j) { return values[c][j]; });
        } else {
#pragma unroll 8
            for (int c = 0; c < n; c++) accumulate(c, [&](int j) { return value_word(c, lane + 32 * j); });
        }
        run_max = new_max;
    }

    // Combine the warps' states (a warp that saw no position has max −∞).
    __shared__ Partial states[M40_ATTN_WARPS];
    __shared__ float accs[M40_ATTN_WARPS][MAX_D];
    if (lane == 0) states[warp] = {run_max, run_sum};
#pragma unroll
    for (int j = 0; j < LANE_PAIRS; j++) {
        const int d = 2 * (lane + 32 * j);
        if (d < head_dim_v) accs[warp][d] = acc[2 * j], accs[warp][d + 1] = acc[2 * j + 1];
    }
    __syncthreads();
    if (turn != 0 || !has_head) return;
    const size_t row_head = size_t(r) * n_head + head;
    m40_merge_warps<HEAD_WARPS>(&states[warp], &accs[warp][0], MAX_D, head_dim_v, n_splits == 1,
                                n_splits == 1 ? out + row_head * head_dim_v
                                              : partial + (row_head * n_splits + split) * (head_dim_v + 2),
                                sinks, head, prepared, r, head * head_dim_v);
}

// Attention of n_rows rows. With prompt_chunk the rows are one sequence at
// consecutive positions and go to the tiled kernel; other rows to the
// lane-per-position kernel, heads_per_block (1 or 4) query heads a block;
// both need head sizes of a multiple of 8, and other sizes take
// attention_partial_kernel (a warp per position). partial: n_rows × n_head ×
// n_splits × (head_dim_v + 2) floats of scratch (the tiled and
// lane-per-position kernels with one range write out directly). prepared:
// null, or scratch (m40_prepared_bytes(n_head · head_dim_v, n_rows) bytes)
// where the output also goes prepared for the next decode product (in
// prepared_form, any whose block scales are not Q8_K's, whose 256 values a
// warp does not hold), for rows that are not a prompt chunk, at most M40_GEMV_MAX_X of them, with
// head_dim_v a multiple of 32 and head_dim_k of 8. sinks: null, or one
// logit per query head that joins its softmax without a value (gpt-oss's
// attention sinks). overlap: see m40_launch.
M40_EXPORT cudaError_t m40_attention(const float *q, int n_rows, const M40Row *rows, M40KvLayer layer, int n_head,
                                     int n_head_kv, int head_dim_k, int head_dim_v, int window, float scale,
                                     const float *sinks, int prompt_chunk, int n_splits, int heads_per_block,
                                     float *partial, float *out, int8_t *prepared, int prepared_form, int overlap,
                                     cudaStream_t stream) {
    const int dim = max(head_dim_k, head_dim_v);
    const bool multiple_of_8 = head_dim_k % 8 == 0 && head_dim_v % 8 == 0;
    if (dim > 32 * M40_ATTN_MAX_PER_LANE || n_splits < 1 || n_head_kv < 1 || n_head % n_head_kv != 0 ||
        n_head > 65535 || n_splits > 65535 || (prompt_chunk && !multiple_of_8) ||
        (heads_per_block != 1 && heads_per_block != 4))
        return cudaErrorInvalidValue;
    if (prepared && (prompt_chunk || !multiple_of_8 || head_dim_v % 32 != 0 || n_rows > M40_GEMV_MAX_X ||
                     !m40_valid_form(prepared_form) || m40_form_scales(prepared_form) == M40_SCALES_Q8_K))
        return cudaErrorInvalidValue;
    const M40PreparedOut prepared_out = {prepared, n_head * head_dim_v, n_rows, prepared_form};
    if (n_rows < 1) return cudaSuccess;
    const auto by_head_size = [&](auto launch) {
        if (dim <= 64)
            launch(std::integral_constant<int, 64>{});
        else if (dim <= 128)
            launch(std::integral_constant<int, 128>{});
        else if (dim <= 256)
            launch(std::integral_constant<int, 256>{});
        else
            launch(std::integral_constant<int, 512>{});
    };
    if (prompt_chunk) {
        by_head_size([&](auto tile) {
            constexpr int MAX_D = decltype(tile)::value;
            using T = PrefillTile<MAX_D>;
            const dim3 grid((n_rows + T::TILE_ROWS - 1) / T::TILE_ROWS, n_head, n_splits);
            m40_launch(overlap, attention_prefill_kernel<MAX_D>, grid, 32 * T::WARPS, stream, q, n_rows, rows, layer,
                       n_head, n_head_kv, head_dim_k, head_dim_v, window, scale, n_splits, sinks, partial, out);
        });
    } else if (multiple_of_8) {
        by_head_size([&](auto size) {
            constexpr int MAX_D = decltype(size)::value;
            const auto launch = [&](auto heads) {
                constexpr int HEADS = decltype(heads)::value;
                m40_launch(overlap, attention_decode_kernel<MAX_D, HEADS>,
                           dim3(n_rows, (n_head + HEADS - 1) / HEADS, n_splits), 32 * M40_ATTN_WARPS, stream, q, rows,
                           layer, n_head, n_head_kv, head_dim_k, head_dim_v, window, scale, n_splits, sinks, partial,
                           out, prepared_out);
            };
            if (heads_per_block == 4)
                launch(std::integral_constant<int, 4>{});
            else
                launch(std::integral_constant<int, 1>{});
        });
    } else {
        m40_launch(overlap, attention_partial_kernel, dim3(n_rows, n_head, n_splits), 32 * M40_ATTN_WARPS, stream, q,
                   rows, layer, n_head, n_head_kv, head_dim_k, head_dim_v, window, scale, n_splits, partial);
    }
    cudaError_t status = m40_launch_status();
    if (status != cudaSuccess || (multiple_of_8 && n_splits == 1)) return status;
    m40_launch(overlap, attention_combine_kernel, dim3(n_rows, n_head), 128, stream, partial, n_head, head_dim_v,
               n_splits, sinks, out, prepared_out);
    return m40_launch_status();
}
