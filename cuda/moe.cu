// A mixture of experts' routing and the sums of its experts' outputs. The
// expert products themselves are gemv.cu's and mmq.cu's kernels, told by
// M40Experts (ops.cuh) to take their weights per work piece.
//
// A step's n_rows × n_used (row, slot) pairs are sorted by expert, so that
// each chosen expert's weights are read once per piece of up to
// `piece_rows` rows rather than once per row: every row an expert takes is
// a row of its pieces. The routing stays on the device (no copy to the
// host between the router and the experts), which is what lets a decode
// step with experts be recorded once and replayed as a CUDA graph: the
// grids are sized for the most pieces any routing can make (pieces past
// the routing's own have count 0 and return at once).
//
// Within an expert, the order of its rows follows atomic increments, so it
// may change from run to run; no result depends on it, as every product
// kernel computes each of its rows on its own.
//
// One session's routing launch also prepares its row for the gate and up
// products (in their format's form, prepare.cuh; blocks past the
// first, the routing taking block 0): the two depend only on the router's launch, and as one launch they
// cost one launch boundary rather than two.
#include "ops.cuh"
#include "prepare.cuh"

#define M40_MOE_THREADS 256
// Most experts a model may have, and most experts a row may use.
#define M40_MOE_MAX_EXPERTS 1024
#define M40_MOE_MAX_USED 32

// The smallest sum of a row's chosen probabilities its weights are divided
// by (the CPU backend's and llama.cpp's clamp, 2^-14).
#define M40_MOE_MIN_WEIGHT_SUM (1.0f / 16384.0f)

#define M40_MOE_WARPS (M40_MOE_THREADS / 32)
static_assert(M40_MOE_THREADS == M40_NORM_THREADS, "the routing launch's blocks also prepare rows (prepare.cuh)");

// Rows the routing launch prepares (n_x rows of x, normalized with `norm`
// where given, into q8, in `form`: prepare.cuh's m40_prepared_form), or q8
// null.
struct M40MoeQuantize {
    const float *x;
    const float *norm;
    float eps;
    int cols, n_x;
    int8_t *q8;
    int form;
};

// One block does the routing: a step has at most a few thousand (row, slot)
// pairs, and the pieces need every expert's count. Latency, not work, is
// what a decode step's routing costs, so every value stays in registers
// where it can and the loops have no serial chains through memory.
//   1. per row (a warp each, lane i taking experts i, i + 32, ...): the
//      softmax of its router logits, its n_used most probable experts (ties
//      to the lower index, as backend::fused::route), their probabilities
//      renormalized to sum to 1;
//   2. per expert (warp 0, lane i taking a run of experts): the first
//      sorted row and the pieces of at most piece_rows rows, from
//      exclusive scans of the counts;
//   3. per (row, slot): its sorted row, and the sorted row's source row.
// The launch's other blocks, if any, prepare rows (M40MoeQuantize).
//
// A shared expert (shared_logit not null: one logit a row) is routed as
// expert n_expert, every row's last slot, weighted σ(its logit): its
// products then run as pieces of the experts' launches, and its output is
// summed with theirs.
//
// PER_LANE: experts per lane of a row's warp, the fewest that hold the
// model's (a row's selection is a chain of n_used warp-wide rounds over
// them, and in a one-session step that chain is the kernel's time).
template <int PER_LANE>
__global__ void __launch_bounds__(M40_MOE_THREADS)
    moe_route_kernel(const float *__restrict__ logits, const float *__restrict__ shared_logit, int n_rows,
                     int n_expert, int n_used, int piece_rows,
                     float *__restrict__ slot_weight, int *__restrict__ slot_row, int *__restrict__ sorted_source,
                     M40ExpertWork *__restrict__ work, int n_work, M40MoeQuantize quantize) {
    m40_wait_for_prior_kernels();
    if (blockIdx.x > 0) {
        const int parts = (quantize.cols + M40_NORM_THREADS - 1) / M40_NORM_THREADS, b = blockIdx.x - 1;
        m40_prepare_part(quantize.x, quantize.norm, quantize.eps, quantize.cols, quantize.n_x, quantize.q8,
                         quantize.form, b / parts, b % parts);
        return;
    }
    __shared__ int count[M40_MOE_MAX_EXPERTS], next[M40_MOE_MAX_EXPERTS];
    __shared__ int n_pieces;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    // Slots a row, and experts, the shared one included.
    const int per_row = n_used + (shared_logit ? 1 : 0), n_total = n_expert + (shared_logit ? 1 : 0);
    for (int e = threadIdx.x; e < n_total; e += blockDim.x) count[e] = 0;
    __syncthreads();

    for (int r = warp; r < n_rows; r += M40_MOE_WARPS) {
        const float *l = logits + size_t(r) * n_expert;
        float p[PER_LANE];
        float max = -INFINITY;
#pragma unroll
        for (int j = 0; j < PER_LANE; j++) {
            const int e = lane + 32 * j;
            p[j] = e < n_expert ? l[e] : -INFINITY;
            max = fmaxf(max, p[j]);
        }
        max = m40_warp_max(max);
        double sum = 0.0;
#pragma unroll
        for (int j = 0; j < PER_LANE; j++) {
            p[j] = lane + 32 * j < n_expert ? expf(p[j] - max) : -1.0f;
            if (lane + 32 * j < n_expert) sum += double(p[j]);
        }
#pragma unroll
        for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
        const float inv = float(1.0 / sum);
#pragma unroll
        for (int j = 0; j < PER_LANE; j++)
            if (lane + 32 * j < n_expert) p[j] *= inv;
        // Lane s keeps the s-th choice.
        int mine = 0;
        float mine_p = 0.0f, chosen_sum = 0.0f;
        for (int s = 0; s < n_used; s++) {
            // The lane's best, then the warp's: the highest probability,
            // the lower index among equals; a chosen expert's is -1.
            float best_p = -1.0f;
            int best = n_expert;
#pragma unroll
            for (int j = 0; j < PER_LANE; j++)
                if (p[j] > best_p) {
                    best_p = p[j];
                    best = lane + 32 * j;
                }
#pragma unroll
            for (int offset = 16; offset > 0; offset >>= 1) {
                const float other_p = __shfl_xor_sync(0xffffffffu, best_p, offset);
                const int other = __shfl_xor_sync(0xffffffffu, best, offset);
                if (other_p > best_p || (other_p == best_p && other < best)) {
                    best_p = other_p;
                    best = other;
                }
            }
            if (best >= n_expert) {
                // NaN logits rank no expert: take the lowest not taken.
                int free = n_expert;
#pragma unroll
                for (int j = 0; j < PER_LANE; j++)
                    if (p[j] != -1.0f && lane + 32 * j < n_expert) free = min(free, lane + 32 * j);
#pragma unroll
                for (int offset = 16; offset > 0; offset >>= 1)
                    free = min(free, __shfl_xor_sync(0xffffffffu, free, offset));
                best = free;
                best_p = 0.0f;
            }
#pragma unroll
            for (int j = 0; j < PER_LANE; j++)
                if (lane + 32 * j == best) p[j] = -1.0f;
            if (lane == s) {
                mine = best;
                mine_p = best_p;
            }
            chosen_sum += best_p;
        }
        chosen_sum = fmaxf(chosen_sum, M40_MOE_MIN_WEIGHT_SUM);
        if (lane < n_used) {
            slot_weight[r * per_row + lane] = mine_p / chosen_sum;
            slot_row[r * per_row + lane] = mine;  // the expert, until its sorted row replaces it below
            atomicAdd(&count[mine], 1);
        } else if (shared_logit && lane == n_used) {
            slot_weight[r * per_row + lane] = m40_sigmoid(shared_logit[r]);
            slot_row[r * per_row + lane] = n_expert;
            atomicAdd(&count[n_expert], 1);
        }
    }
    __syncthreads();

    if (warp == 0) {
        // Lane i's run of experts, its rows and pieces, then exclusive
        // scans of both across the warp.
        const int per_lane = (n_total + 31) / 32, first_e = lane * per_lane;
        const int last_e = min(n_total, first_e + per_lane);
        int rows = 0, pieces = 0;
        for (int e = first_e; e < last_e; e++) {
            rows += count[e];
            pieces += (count[e] + piece_rows - 1) / piece_rows;
        }
        int row_offset = rows, piece = pieces;
#pragma unroll
        for (int offset = 1; offset < 32; offset <<= 1) {
            const int r = __shfl_up_sync(0xffffffffu, row_offset, offset);
            const int q = __shfl_up_sync(0xffffffffu, piece, offset);
            if (lane >= offset) {
                row_offset += r;
                piece += q;
            }
        }
        row_offset -= rows;
        piece -= pieces;
        if (lane == 31) n_pieces = piece + pieces;
        for (int e = first_e; e < last_e; e++) {
            next[e] = row_offset;
            for (int start = 0; start < count[e]; start += piece_rows, piece++)
                if (piece < n_work) work[piece] = {e, row_offset + start, min(piece_rows, count[e] - start)};
            row_offset += count[e];
        }
    }
    __syncthreads();
    for (int i = n_pieces + threadIdx.x; i < n_work; i += blockDim.x) work[i] = {0, 0, 0};
    for (int i = threadIdx.x; i < n_rows * per_row; i += blockDim.x) {
        const int sorted = atomicAdd(&next[slot_row[i]], 1);
        slot_row[i] = sorted;
        sorted_source[sorted] = i / per_row;
    }
}

// Routes n_rows rows by their router logits (n_rows × n_expert) to n_used
// experts each, and, where shared_logit is not null, to the shared expert
// as expert n_expert (see moe_route_kernel): with S slots a row (n_used,
// or n_used + 1 with the shared expert), slot_weight and slot_row
// (n_rows × S) get each (row, slot)'s weight and sorted row,
// sorted_source (n_rows × S) the source row of each sorted row, and work
// its n_work pieces. n_work must be at least m40_moe_pieces(n_rows,
// n_expert, n_used, piece_rows), counting the shared expert as one more
// expert and one more used. Where
// x_q8 is not null the launch also prepares x's x_rows rows of `cols`
// (normalized with `norm` and eps where norm is given) into x_q8 in
// `x_form`, as the decode products read them (prepare.cuh). overlap: see
// m40_launch.
M40_EXPORT cudaError_t m40_moe_route(int overlap, const float *logits, const float *shared_logit, int n_rows,
                                     int n_expert, int n_used, int piece_rows, float *slot_weight, int *slot_row, int *sorted_source,
                                     M40ExpertWork *work, int n_work, const float *x, const float *norm, float eps,
                                     int cols, int x_rows, int8_t *x_q8, int x_form, cudaStream_t stream) {
    if (n_rows < 1 || n_expert < 1 || n_expert > M40_MOE_MAX_EXPERTS || n_used < 1 || n_used > n_expert ||
        n_used > M40_MOE_MAX_USED || piece_rows < 1 || n_work < 1)
        return cudaErrorInvalidValue;
    if (shared_logit && (n_expert + 1 > M40_MOE_MAX_EXPERTS || n_used + 1 > M40_MOE_MAX_USED))
        return cudaErrorInvalidValue;
    if (x_q8 && (!x || cols < 32 || cols % 32 != 0 || x_rows < 1 || x_rows > 65535 || !m40_valid_form(x_form) ||
                 (m40_form_scales(x_form) == M40_SCALES_Q8_K && cols % 256 != 0)))
        return cudaErrorInvalidValue;
    const M40MoeQuantize quantize = {x, norm, eps, cols, x_rows, x_q8, x_form};
    const unsigned quantize_blocks = x_q8 ? unsigned(x_rows) * m40_blocks(size_t(cols), M40_NORM_THREADS) : 0;
    const auto launch = [&](auto kernel) {
        m40_launch(overlap, kernel, dim3(1 + quantize_blocks), M40_MOE_THREADS, stream, logits, shared_logit, n_rows,
                   n_expert, n_used, piece_rows, slot_weight, slot_row, sorted_source, work, n_work, quantize);
    };
    if (n_expert <= 32) launch(moe_route_kernel<1>);
    else if (n_expert <= 64) launch(moe_route_kernel<2>);
    else if (n_expert <= 128) launch(moe_route_kernel<4>);
    else if (n_expert <= 256) launch(moe_route_kernel<8>);
    else if (n_expert <= 512) launch(moe_route_kernel<16>);
    else launch(moe_route_kernel<32>);
    return m40_launch_status();
}

// The most work pieces a routing of n_rows rows can make: each expert used
// makes ⌈its rows / piece_rows⌉ ≤ 1 + (its rows − 1) / piece_rows.
M40_EXPORT int m40_moe_pieces(int n_rows, int n_expert, int n_used, int piece_rows) {
    const long slots = long(n_rows) * n_used, used = slots < n_expert ? slots : n_expert;
    return int(used + (slots - used) / piece_rows);
}

// x[r] (+)= Σ_s slot_weight[r, s] · y[slot_row[r, s]], in slot order, for
// rows of `width`.
__global__ void moe_combine_kernel(float *__restrict__ x, const float *__restrict__ y,
                                   const float *__restrict__ slot_weight, const int *__restrict__ slot_row,
                                   int n_rows, int n_used, int width, int accumulate) {
    const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= size_t(n_rows) * width) return;
    const size_t r = i / width, c = i % width;
    float sum = 0.0f;
    for (int s = 0; s < n_used; s++)
        sum += slot_weight[r * n_used + s] * y[size_t(slot_row[r * n_used + s]) * width + c];
    x[i] = accumulate ? x[i] + sum : sum;
}

M40_EXPORT cudaError_t m40_moe_combine(float *x, const float *y, const float *slot_weight, const int *slot_row,
                                       int n_rows, int n_used, int width, int accumulate, cudaStream_t stream) {
    if (n_rows < 1 || n_used < 1 || width < 1) return cudaErrorInvalidValue;
    moe_combine_kernel<<<m40_blocks(size_t(n_rows) * width, 256), 256, 0, stream>>>(x, y, slot_weight, slot_row,
                                                                                     n_rows, n_used, width, accumulate);
    return m40_launch_status();
}
