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
//
// A step whose runs are short (decode) takes each run's rows one after
// another (conv_kernel, delta_kernel). A prompt's runs go through the
// chunked form of the delta rule instead: the convolution a thread per
// (channel, row), then per chunk of up to DeltaChunk<S>::ROWS rows of a
// run, from the state S₀ the chunk starts with, cumulative log decay G and
// b = σ(beta):
//   A[t][i] = b[t]·e^{G[t] − G[i]}·k[t]·k[i] (i < t), T = (I + A)⁻¹,
//   U = T·diag(b)·V, W = T·diag(b·e^G)·K (delta_prepare_kernel, every
//   chunk at once: none of it depends on S₀);
//   Δ = U − W·S₀, out[t] = e^{G[t]}·S₀ᵀq[t] + Σ_{i ≤ t} e^{G[t] − G[i]}(q[t]·k[i])·Δ[i],
//   S = e^{G[n−1]}·S₀ + Σ_i e^{G[n−1] − G[i]}·k[i]·Δ[i]ᵀ (delta_scan_kernel,
//   the chunks of a run in order, a block per tile of the state's columns).
// That is the token-by-token recurrence regrouped: the rows' errors Δ solve
// Δ[t] = b[t]·(v[t] − e^{G[t]}·S₀ᵀk[t] − Σ_{i < t} e^{G[t] − G[i]}(k[t]·k[i])·Δ[i]).
// Decays enter as differences of G, never as quotients, so one that
// underflows within a chunk leaves everything finite.
#include "ops.cuh"

// The most taps a convolution has here (Qwen3.5: 4).
#define M40_CONV_MAX_TAPS 16

__device__ __forceinline__ int m40_run_start(const int *run_starts, int run) {
    return run_starts ? run_starts[run] : run;
}

// The run that holds `row`: the last of the n_runs whose start is ≤ row.
__device__ __forceinline__ int m40_run_of(const int *run_starts, int n_runs, int row) {
    if (!run_starts) return row;
    int lo = 0, hi = n_runs - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (run_starts[mid] <= row) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    return lo;
}

__device__ __forceinline__ float m40_softplus(float x) { return x > 20.0f ? x : logf(1.0f + expf(x)); }

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

// One thread per (channel, row) of a prompt's runs: the convolution of the
// row with the K − 1 inputs before it (the run's or, before the run's
// start, the state's), then SiLU. conv_state_kernel then moves the state on.
__global__ void conv_rows_kernel(const float *__restrict__ qkv, int channels, int taps,
                                 const float *__restrict__ weights, const M40Row *__restrict__ rows,
                                 const int *__restrict__ run_starts, int n_runs, long long state_offset,
                                 float *__restrict__ out) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    const int r = blockIdx.y;
    if (c >= channels) return;
    const int first = m40_run_start(run_starts, m40_run_of(run_starts, n_runs, r));
    const float *state = reinterpret_cast<const float *>(rows[first].state) + state_offset;
    float sum = 0.0f;
    for (int i = 0; i < taps; i++) {
        const int src = r - (taps - 1) + i;
        const float x = src >= first ? qkv[size_t(src) * channels + c]
                                     : state[size_t(src - first + taps - 1) * channels + c];
        sum += x * weights[size_t(c) * taps + i];
    }
    out[size_t(r) * channels + c] = m40_activation(false, sum);
}

// One thread per (channel, run): the state becomes the last K − 1 of the
// state's inputs followed by the run's. Input i of that sequence lies at or
// after state slot i, so the slots are rewritten in order, in place.
__global__ void conv_state_kernel(const float *__restrict__ qkv, int channels, int taps,
                                  const M40Row *__restrict__ rows, const int *__restrict__ run_starts,
                                  long long state_offset) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    const int run = blockIdx.y;
    if (c >= channels) return;
    const int first = m40_run_start(run_starts, run), len = m40_run_start(run_starts, run + 1) - first;
    float *state = reinterpret_cast<float *>(rows[first].state) + state_offset;
    for (int i = 0; i + 1 < taps; i++) {
        const int src = len + i;
        state[size_t(i) * channels + c] = src < taps - 1 ? state[size_t(src) * channels + c]
                                                         : qkv[size_t(first + src - (taps - 1)) * channels + c];
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
        const float softplus = m40_softplus(pre);
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

// The chunked form's shapes for heads of S values. A chunk's keys and
// queries (ROWS × S each) sit in shared memory, so wider heads take fewer
// rows. A scan block holds COLS columns of a head's state, each split over
// PARTS adjacent lanes as delta_kernel splits it (part p holding key
// dimensions 4·PARTS·m + 4p … + 3), so its float4 reads of a row take
// 16·PARTS contiguous bytes and share no bank.
template <int S>
struct DeltaChunk {
    static_assert(S % 16 == 0, "heads of a multiple of 16 values");
    static constexpr int ROWS = S <= 128 ? 32 : 16;
    static constexpr int COLS = 16;
    static constexpr int PARTS = S / 4 < 8 ? S / 4 : 8;
    static constexpr int THREADS = COLS * PARTS;
    static constexpr int M = S / (4 * PARTS);  // float4 groups a scan thread holds
};

// The row stride of a chunk's decayed q·k values in the scratch (the most
// rows a chunk has).
#define M40_DELTA_MAX_CHUNK 32
#define M40_DELTA_PREPARE_THREADS 256

// Scratch of a chunked step of n_rows rows, in floats: per (row, value
// head) W's and U's rows (S each), the row's decayed q·k values with the
// chunk's earlier rows (M40_DELTA_MAX_CHUNK) and its decays e^{G[t]} and
// e^{G[n−1] − G[t]} (2).
struct DeltaScratch {
    float *w, *u, *p, *g;
    __host__ __device__ DeltaScratch(float *base, size_t n_rows, int head_dim, int n_v_heads) {
        if (!base) {
            w = u = p = g = nullptr;
            return;
        }
        const size_t per = n_rows * size_t(n_v_heads);
        w = base;
        u = w + per * head_dim;
        p = u + per * head_dim;
        g = p + per * M40_DELTA_MAX_CHUNK;
    }
    static size_t floats(size_t n_rows, int head_dim, int n_v_heads) {
        return n_rows * size_t(n_v_heads) * (2 * size_t(head_dim) + M40_DELTA_MAX_CHUNK + 2);
    }
};

// Rows t < n of `src` (WIDTH floats each, `stride` floats apart) into the
// ROWS rows of `dst`, PITCH floats apart, zeros past n, each row scaled by
// scale[t] where scale is given: every thread's float4 loads issued before
// its stores, so that a block waits out the loads' latency once. A pitch
// that is not whole float4s (padded against bank conflicts) takes scalar
// stores.
template <int ROWS, int WIDTH, int NT, int PITCH = WIDTH>
__device__ __forceinline__ void m40_load_rows(float *dst, const float *__restrict__ src, size_t stride, int n,
                                              const float *scale) {
    static_assert(WIDTH % 4 == 0, "rows of whole float4s");
    constexpr int QUADS = ROWS * WIDTH / 4, PER = (QUADS + NT - 1) / NT;
    float4 v[PER];
#pragma unroll
    for (int k = 0; k < PER; k++) {
        const int e = threadIdx.x + k * NT, t = e / (WIDTH / 4), m = e % (WIDTH / 4);
        v[k] = e < QUADS && t < n ? reinterpret_cast<const float4 *>(src + t * stride)[m]
                                  : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
#pragma unroll
    for (int k = 0; k < PER; k++) {
        const int e = threadIdx.x + k * NT, t = e / (WIDTH / 4), m = e % (WIDTH / 4);
        if (e < QUADS) {
            if (scale) {
                const float f = scale[t];
                v[k].x *= f, v[k].y *= f, v[k].z *= f, v[k].w *= f;
            }
            if constexpr (PITCH % 4 == 0) {
                reinterpret_cast<float4 *>(dst + t * PITCH)[m] = v[k];
            } else {
                float *d = dst + t * PITCH + 4 * m;
                d[0] = v[k].x, d[1] = v[k].y, d[2] = v[k].z, d[3] = v[k].w;
            }
        }
    }
}

// One block per (chunk, value head, run): the chunk's decays, its rows'
// decayed q·k values, T = (I + A)⁻¹, and W's and U's rows (see the top of
// this file). Nothing here depends on the state, so every chunk of every
// run is prepared at once.
template <int S>
__global__ void __launch_bounds__(M40_DELTA_PREPARE_THREADS)
    delta_prepare_kernel(const float *__restrict__ conv, const float *__restrict__ alpha,
                         const float *__restrict__ beta, const float *__restrict__ dt_bias,
                         const float *__restrict__ a, const int *__restrict__ run_starts, int n_k_heads,
                         int n_v_heads, DeltaScratch scratch) {
    constexpr int C = DeltaChunk<S>::ROWS, LD = S + 1;  // padded: a warp's lanes read rows i at one m
    constexpr int NT = M40_DELTA_PREPARE_THREADS;
    __shared__ float ks[C * LD], qs[C * LD];
    __shared__ float am[C][C + 1], tm[C][C + 1];
    __shared__ float gs[C], bs[C], bw[C];
    const int h = blockIdx.y, run = blockIdx.z, tid = threadIdx.x;
    const int first = m40_run_start(run_starts, run) + blockIdx.x * C, end = m40_run_start(run_starts, run + 1);
    if (first >= end) return;
    const int n = min(C, end - first);
    const int kh = h % n_k_heads, key_width = n_k_heads * S, channels = 2 * key_width + n_v_heads * S;
    // A chunk's rows of `offset` (S values of each conv row) into `dst`.
    auto load_rows = [&](float *dst, int offset) {
        m40_load_rows<C, S, NT, LD>(dst, conv + size_t(first) * channels + offset, channels, n, nullptr);
    };
    load_rows(ks, key_width + kh * S);
    load_rows(qs, kh * S);
    if (tid < 32) {
        // Rows past the chunk's end decay by nothing and have no strength.
        float lg = 0.0f, b = 0.0f;
        if (tid < n) {
            const size_t i = size_t(first + tid) * n_v_heads + h;
            lg = m40_softplus(alpha[i] + dt_bias[h]) * a[h];
            b = m40_sigmoid(beta[i]);
        }
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const float y = __shfl_up_sync(0xffffffffu, lg, o);
            if (tid >= o) lg += y;
        }
        const float last = __shfl_sync(0xffffffffu, lg, n - 1);
        if (tid < C) {
            gs[tid] = lg;
            bs[tid] = b;
            bw[tid] = b * expf(lg);
        }
        if (tid < n) {
            float *g = scratch.g + 2 * (size_t(first + tid) * n_v_heads + h);
            g[0] = expf(lg);
            g[1] = expf(last - lg);
        }
    }
    __syncthreads();
    for (int e = tid; e < C * C; e += NT) {
        const int t = e / C, i = e % C;
        float kk = 0.0f, qk = 0.0f, decay = 0.0f;
        if (i <= t) {
#pragma unroll 8
            for (int m = 0; m < S; m++) {
                const float ki = ks[i * LD + m];
                kk += ks[t * LD + m] * ki;
                qk += qs[t * LD + m] * ki;
            }
            decay = expf(gs[t] - gs[i]);
        }
        am[t][i] = i < t ? bs[t] * decay * kk : 0.0f;
        if (t < n) scratch.p[(size_t(first + t) * n_v_heads + h) * M40_DELTA_MAX_CHUNK + i] = decay * qk;
    }
    __syncthreads();
    // The queries are done with: the values take their place.
    load_rows(qs, 2 * key_width + h * S);
    // T = (I + A)⁻¹ by forward substitution, lane c of the first warp
    // taking column c: T[t][c] = [t = c] − Σ_{i < t} A[t][i]·T[i][c], the
    // column in registers.
    if (tid < C) {
        float column[C];
#pragma unroll
        for (int t = 0; t < C; t++) {
            float x = t == tid ? 1.0f : 0.0f;
#pragma unroll
            for (int i = 0; i < t; i++) x -= am[t][i] * column[i];
            column[t] = x;
            tm[t][tid] = x;
        }
    }
    __syncthreads();
    // A thread per column of [V | K]: U = T·diag(b)·V, W = T·diag(b·e^G)·K,
    // row i of the input added to every output row in turn (T is zero
    // above its diagonal). The loop over i stays rolled: unrolled, the
    // compiler would hoist all of T's values into registers, and spill.
    for (int col = tid; col < 2 * S; col += NT) {
        const bool is_v = col < S;
        const int j = is_v ? col : col - S;
        float y[C];
#pragma unroll
        for (int t = 0; t < C; t++) y[t] = 0.0f;
#pragma unroll 1
        for (int i = 0; i < C; i++) {
            const float x = is_v ? bs[i] * qs[i * LD + j] : bw[i] * ks[i * LD + j];
#pragma unroll
            for (int t = 0; t < C; t++) y[t] += tm[t][i] * x;
        }
        float *dst = is_v ? scratch.u : scratch.w;
#pragma unroll
        for (int t = 0; t < C; t++) {
            if (t < n) dst[(size_t(first + t) * n_v_heads + h) * S + j] = y[t];
        }
    }
}

// Halving exchanges over the PARTS lanes of a column: a lane keeps the
// half of its 2·HALF sums on its side of the partner bit and adds the
// partner's copy of that half, until each lane holds 2·ROWS/PARTS sums.
template <int HALF, int BIT>
__device__ __forceinline__ void m40_exchange_halves(float *sums, int part) {
    const bool upper = part & BIT;
#pragma unroll
    for (int i = 0; i < HALF; i++) {
        const float send = upper ? sums[i] : sums[i + HALF];
        const float keep = upper ? sums[i + HALF] : sums[i];
        sums[i] = keep + __shfl_xor_sync(0xffffffffu, send, BIT);
    }
    if constexpr (BIT > 1) m40_exchange_halves<HALF / 2, BIT / 2>(sums, part);
}

// One block per (tile of COLS value columns, value head, run): the run's
// chunks in order, the tile's columns of the state in registers (see
// DeltaChunk). Per chunk: each thread's partial sums of W·S₀ and Q·S₀ for
// every row, spread over the column's PARTS lanes by halving exchanges (a
// lane ends with 2·ROWS/PARTS of the sums: the first half of the lanes
// W's, the rest Q's), Δ through shared memory, then the outputs and the
// state's update.
template <int S>
__global__ void __launch_bounds__(DeltaChunk<S>::THREADS)
    delta_scan_kernel(const float *__restrict__ conv, DeltaScratch scratch, const M40Row *__restrict__ rows,
                      const int *__restrict__ run_starts, long long state_offset, int n_k_heads, int n_v_heads,
                      float *__restrict__ out) {
    using D = DeltaChunk<S>;
    constexpr int C = D::ROWS, COLS = D::COLS, PARTS = D::PARTS, M = D::M, NT = D::THREADS;
    constexpr int HELD = 2 * C / PARTS;  // sums a lane holds after the exchanges
    static_assert(PARTS >= 2 && C % HELD == 0, "a lane's sums all W's or all Q's");
    __shared__ __align__(16) float ws[C][S];  // W's rows, then the decayed keys
    __shared__ __align__(16) float qs[C][S];
    __shared__ __align__(16) float us[C][COLS];
    __shared__ __align__(16) float ps[C][C];
    __shared__ float ds[C][COLS], from_start[C], to_end[C];
    const int tile = blockIdx.x, h = blockIdx.y, run = blockIdx.z, tid = threadIdx.x;
    const int j = tid / PARTS, part = tid % PARTS, col = tile * COLS + j;
    const int kh = h % n_k_heads, key_width = n_k_heads * S, channels = 2 * key_width + n_v_heads * S;
    const int first = m40_run_start(run_starts, run), end = m40_run_start(run_starts, run + 1);
    float *column = reinterpret_cast<float *>(rows[first].state) + state_offset + size_t(h) * S * S + size_t(col) * S;
    float4 st[M];
#pragma unroll
    for (int m = 0; m < M; m++) st[m] = *reinterpret_cast<const float4 *>(column + 4 * (PARTS * m + part));
    const float scale = 1.0f / sqrtf(float(S));
    for (int c0 = first; c0 < end; c0 += C) {
        const int n = min(C, end - c0);
        const size_t head_rows = size_t(c0) * n_v_heads + h, stride = size_t(n_v_heads);
        m40_load_rows<C, S, NT>(ws[0], scratch.w + head_rows * S, stride * S, n, nullptr);
        m40_load_rows<C, S, NT>(qs[0], conv + size_t(c0) * channels + kh * S, channels, n, nullptr);
        m40_load_rows<C, COLS, NT>(us[0], scratch.u + head_rows * S + tile * COLS, stride * S, n, nullptr);
        m40_load_rows<C, C, NT>(ps[0], scratch.p + head_rows * M40_DELTA_MAX_CHUNK, stride * M40_DELTA_MAX_CHUNK, n,
                                nullptr);
        if (tid < C) {
            const float *g = scratch.g + 2 * (size_t(c0 + tid) * n_v_heads + h);
            from_start[tid] = tid < n ? g[0] : 0.0f;
            to_end[tid] = tid < n ? g[1] : 0.0f;
        }
        __syncthreads();
        float sums[2 * C];
#pragma unroll
        for (int t = 0; t < C; t++) {
            const float4 *w4 = reinterpret_cast<const float4 *>(ws[t]) + part;
            const float4 *q4 = reinterpret_cast<const float4 *>(qs[t]) + part;
            float sw = 0.0f, sq = 0.0f;
#pragma unroll
            for (int m = 0; m < M; m++) {
                const float4 w = w4[PARTS * m], q = q4[PARTS * m];
                sw += st[m].x * w.x + st[m].y * w.y + st[m].z * w.z + st[m].w * w.w;
                sq += st[m].x * q.x + st[m].y * q.y + st[m].z * q.z + st[m].w * q.w;
            }
            sums[t] = sw;
            sums[C + t] = sq;
        }
        m40_exchange_halves<C, PARTS / 2>(sums, part);
        const int held = part * HELD;  // the index of sums[0] among the 2·C
        if (held < C) {
#pragma unroll
            for (int i = 0; i < HELD; i++) ds[held + i][j] = us[held + i][j] - sums[i];
        }
        __syncthreads();
        // The keys, each decayed to the chunk's end, over W's rows.
        m40_load_rows<C, S, NT>(ws[0], conv + size_t(c0) * channels + key_width + kh * S, channels, n, to_end);
        if (held >= C) {
#pragma unroll
            for (int i = 0; i < HELD; i++) {
                const int t = held - C + i;
                if (t < n) {
                    float o = from_start[t] * sums[i];
                    for (int k = 0; k <= t; k++) o += ps[t][k] * ds[k][j];
                    out[size_t(c0 + t) * n_v_heads * S + h * S + col] = o * scale;
                }
            }
        }
        __syncthreads();
        const float decay = from_start[n - 1];
#pragma unroll
        for (int m = 0; m < M; m++) st[m].x *= decay, st[m].y *= decay, st[m].z *= decay, st[m].w *= decay;
        for (int t = 0; t < n; t++) {
            const float d = ds[t][j];
            const float4 *k4 = reinterpret_cast<const float4 *>(ws[t]) + part;
#pragma unroll
            for (int m = 0; m < M; m++) {
                const float4 k = k4[PARTS * m];
                st[m].x += k.x * d, st[m].y += k.y * d, st[m].z += k.z * d, st[m].w += k.w * d;
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int m = 0; m < M; m++) *reinterpret_cast<float4 *>(column + 4 * (PARTS * m + part)) = st[m];
}

template <int S>
static void m40_delta_chunked(const float *conv, const float *alpha, const float *beta, const float *dt_bias,
                              const float *a, const M40Row *rows, const int *run_starts, int n_runs,
                              int max_run_rows, long long state_offset, int n_k_heads, int n_v_heads,
                              DeltaScratch scratch, float *out, cudaStream_t stream) {
    using D = DeltaChunk<S>;
    const dim3 prepare((max_run_rows + D::ROWS - 1) / D::ROWS, n_v_heads, n_runs);
    delta_prepare_kernel<S><<<prepare, M40_DELTA_PREPARE_THREADS, 0, stream>>>(conv, alpha, beta, dt_bias, a,
                                                                               run_starts, n_k_heads, n_v_heads,
                                                                               scratch);
    delta_scan_kernel<S><<<dim3(S / D::COLS, n_v_heads, n_runs), D::THREADS, 0, stream>>>(
        conv, scratch, rows, run_starts, state_offset, n_k_heads, n_v_heads, out);
}

M40_EXPORT size_t m40_delta_net_scratch(int n_rows, int head_dim, int n_v_heads) {
    return DeltaScratch::floats(size_t(n_rows), head_dim, n_v_heads);
}

// `scratch`: NULL for the token-by-token kernels, else the chunked form's
// (m40_delta_net_scratch floats), which every run of the step then takes;
// `max_run_rows`: the longest run's rows (the chunks prepared per run).
M40_EXPORT cudaError_t m40_delta_net(const float *qkv, const float *alpha, const float *beta, const float *conv_weights,
                                     const float *dt_bias, const float *a, const M40Row *rows, const int *run_starts,
                                     int n_rows, int n_runs, int max_run_rows, long long conv_state_offset,
                                     long long state_offset, int taps, int head_dim, int n_k_heads, int n_v_heads,
                                     float eps, float *conv, float *scratch, float *out, cudaStream_t stream) {
    if (n_rows == 0) return cudaSuccess;
    if (taps < 1 || taps > M40_CONV_MAX_TAPS || (scratch && max_run_rows < 1)) return cudaErrorInvalidValue;
    const int channels = 2 * n_k_heads * head_dim + n_v_heads * head_dim;
    if (scratch) {
        conv_rows_kernel<<<dim3(m40_blocks(channels, 128), n_rows), 128, 0, stream>>>(
            qkv, channels, taps, conv_weights, rows, run_starts, n_runs, conv_state_offset, conv);
        conv_state_kernel<<<dim3(m40_blocks(channels, 128), n_runs), 128, 0, stream>>>(qkv, channels, taps, rows,
                                                                                     run_starts, conv_state_offset);
    } else {
        const dim3 conv_grid(m40_blocks(channels, 128), n_runs);
        if (taps == 4) {
            conv_kernel<4><<<conv_grid, 128, 0, stream>>>(qkv, channels, taps, conv_weights, rows, run_starts,
                                                          conv_state_offset, conv);
        } else {
            conv_kernel<0><<<conv_grid, 128, 0, stream>>>(qkv, channels, taps, conv_weights, rows, run_starts,
                                                          conv_state_offset, conv);
        }
    }
    l2_norm_kernel<<<dim3(2 * n_k_heads, n_rows), M40_NORM_THREADS, 0, stream>>>(conv, channels, head_dim, eps);
    const DeltaScratch chunked(scratch, size_t(n_rows), head_dim, n_v_heads);
    const dim3 grid(n_v_heads, n_runs);
    switch (head_dim) {
#define M40_DELTA(S)                                                                                         \
    case S:                                                                                                  \
        if (scratch) {                                                                                       \
            m40_delta_chunked<S>(conv, alpha, beta, dt_bias, a, rows, run_starts, n_runs, max_run_rows,      \
                                 state_offset, n_k_heads, n_v_heads, chunked, out, stream);                  \
        } else {                                                                                             \
            delta_kernel<S><<<grid, S * M40_DELTA_PARTS, 0, stream>>>(conv, alpha, beta, dt_bias, a, rows,  \
                                                                      run_starts, state_offset, n_k_heads,  \
                                                                      n_v_heads, out);                      \
        }                                                                                                    \
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
