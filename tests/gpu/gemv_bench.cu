// The decode products of a llama layer on their own, against the time a
// plain kernel takes to read the same bytes (the floor a product can reach):
//   gemv_bench [7b|1b] [TYPE] [ROWS_PER_WARP] [N_X]
// (ROWS_PER_WARP 0, the default: the format's own choice, as the library makes it;
// N_X activation rows, 1-64: past M40_GEMV_MAX_X the products run on tensor cores,
// mmq.cu, each matrix its own launch as the library makes them)
// TYPE is a GGUF type id (2 Q4_0, 8 Q8_0, 12 Q4_K, 14 Q6_K, ...); weights are
// random bytes (timing only), a copy per layer so that L2 does not hold them.
// Built by tests/gpu/pack.sh for sm_90 (the H100); prints one line per
// product and the products of a whole token, with and without their
// activations' quantization (f16 conversion on the tensor-core path).
#include "matmul.cu"
#include "gemv.cu"
#include "mmq.cu"
#include "moe.cu"
#include "layout.cuh"

#include <cstdio>
#include <cstdlib>
#include <vector>

__global__ void fill_bytes(uint8_t *p, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
        uint32_t h = uint32_t(i) * 2654435761u ^ seed;
        h ^= h >> 13;
        h *= 0x5bd1e995u;
        p[i] = uint8_t(h ^ (h >> 15));
    }
}

__device__ uint32_t read_floor_sink;

// Reads n 16-byte vectors once, two loads per thread in flight: the fastest
// of the read patterns tried on the H100 (grid-stride or a segment per warp,
// 1-8 loads in flight, 128 or 256 threads).
__global__ void read_floor(const uint4 *p, size_t n) {
    m40_wait_for_prior_kernels();
    const size_t stride = size_t(gridDim.x) * blockDim.x;
    uint32_t acc = 0;
    size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
    for (; i + stride < n; i += 2 * stride) {
        const uint4 a = __ldcg(p + i), b = __ldcg(p + i + stride);
        acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w;
    }
    if (i < n) {
        const uint4 a = __ldcg(p + i);
        acc ^= a.x ^ a.y ^ a.z ^ a.w;
    }
    if (acc == 0x9e3779b9u) read_floor_sink = acc;  // keeps the loads
}

struct Product {
    const char *name;
    int n_matrices, rows, cols, epilogue;
};

// Bytes of a row of `cols` values of `type` (0 for a type the kernels lack).
static size_t row_bytes(int type, int cols) {
    size_t bytes = 0;
    m40_with_format(type, [&](auto format) {
        using F = decltype(format);
        bytes = size_t(cols) / F::VALUES * F::BYTES;
    });
    return bytes;
}

static void check(cudaError_t status, const char *what) {
    if (status != cudaSuccess) {
        fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(status));
        exit(1);
    }
}

int main(int argc, char **argv) {
    const bool small = argc > 1 && argv[1][0] == '1';
    const int type = argc > 2 ? atoi(argv[2]) : M40_Q4_0;
    const int rows_per_warp = argc > 3 ? atoi(argv[3]) : 0;
    const int n_x = argc > 4 ? atoi(argv[4]) : 1;
    const int hidden = small ? 2048 : 4096, ffn = small ? 5632 : 11008, layers = small ? 22 : 32, vocab = 32000;
    const bool tensor_cores = n_x > M40_GEMV_MAX_X;
    if (row_bytes(type, 256) == 0 || n_x < 1 || n_x > 64 || (tensor_cores && !m40_mmq_prepare(type)) ||
        (rows_per_warp != 0 && rows_per_warp != 2 && rows_per_warp != 4)) {
        fprintf(stderr, "usage: gemv_bench [7b|1b] [GGUF type id] [rows per warp: 0 (the format's choice), 2 or 4] "
                        "[activation rows: 1-64; past 8 on an sm_80+ GPU]\n");
        return 2;
    }
    int sms = 0;
    check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "device query");
    const Product products[] = {
        {"q/k/v", 3, hidden, hidden, M40_GEMV_STORE},
        {"attn out", 1, hidden, hidden, M40_GEMV_ACCUMULATE},
        {"gate/up", 2, ffn, hidden, M40_GEMV_GLU_SILU},
        {"down", 1, hidden, ffn, M40_GEMV_ACCUMULATE},
        {"output", 1, vocab, hidden, M40_GEMV_STORE},
    };
    const int n_products = 5;
    std::vector<std::vector<uint8_t *>> weights(n_products);
    size_t token_bytes = 0;
    for (int s = 0; s < n_products; s++) {
        const Product &pr = products[s];
        const size_t bytes = size_t(pr.n_matrices) * pr.rows * row_bytes(type, pr.cols);
        for (int l = 0; l < (s == 4 ? 1 : layers); l++) {
            uint8_t *w;
            check(cudaMalloc(&w, bytes), "weights");
            fill_bytes<<<1024, 256>>>(w, bytes, 1000u * s + l);
            weights[s].push_back(w);
            token_bytes += bytes;
        }
    }
    const size_t widest = size_t(ffn > vocab ? ffn : vocab);
    const size_t max_x = tensor_cores ? size_t(n_x) : M40_GEMV_MAX_X;
    float *x, *y, *partials;
    int8_t *x_q8;
    uint16_t *x_f16;
    check(cudaMalloc(&x, max_x * widest * 4), "x");
    check(cudaMalloc(&y, 3 * max_x * widest * 4), "y");
    check(cudaMalloc(&x_q8, m40_prepared_bytes(int(widest), int(max_x))), "x_q8");
    check(cudaMalloc(&x_f16, max_x * widest * 2 + max_x * 4), "x_f16");
    check(cudaMemset(x_f16, 0, max_x * widest * 2 + max_x * 4), "x_f16");
    check(cudaMalloc(&partials, (tensor_cores ? 64 : 1) * max_x * widest * 4), "partial sums");
    check(cudaMemset(x, 0, max_x * widest * 4), "x");
    fill_bytes<<<64, 256>>>(reinterpret_cast<uint8_t *>(x_q8), m40_prepared_bytes(int(widest), int(max_x)), 9);
    cudaStream_t stream;
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
    cudaEvent_t start, stop;
    cudaEventCreate(&start);
    cudaEventCreate(&stop);
    const bool prepared = m40_gemv_prepared_path(type), overlap = m40_launch_overlap();
    const bool dp4a = m40_gemv_dp4a_code(), grid = m40_gemv_prepared_form(type, dp4a) & M40_PREPARED_GRID;

    const auto product = [&](int s, int layer, bool quantized) {
        const Product &pr = products[s];
        const size_t matrix_bytes = size_t(pr.rows) * row_bytes(type, pr.cols);
        if (tensor_cores) {
            // One conversion for the product's matrices, as the library makes it.
            float *x_scales = reinterpret_cast<float *>(x_f16 + max_x * widest);
            if (!quantized) check(m40_mmq_activations(overlap, x, nullptr, 0.0f, n_x, pr.cols, m40_activation_scales(type), x_f16, x_scales, stream), pr.name);
            for (int m = 0; m < pr.n_matrices; m++) {
                M40Mmq p = {};
                p.w = weights[s][layer] + m * matrix_bytes;
                p.rows = pr.rows;
                p.cols = pr.cols;
                p.x_f16 = x_f16;
                p.x_scales = x_scales;
                p.n_x = n_x;
                p.y = y + m * max_x * widest;
                p.accumulate = pr.epilogue == M40_GEMV_ACCUMULATE;
                p.splits = m40_mmq_splits(type, pr.rows, pr.cols, n_x, sms);
                p.partials = partials;
                p.overlap = overlap;
                check(m40_mmq(type, &p, stream), pr.name);
            }
            return;
        }
        M40Gemv p = {};
        for (int m = 0; m < pr.n_matrices; m++)
            p.m[m] = {weights[s][layer] + m * matrix_bytes, nullptr, y + m * max_x * widest, pr.rows, 0};
        p.n_matrices = pr.n_matrices;
        p.cols = pr.cols;
        p.x = x;
        p.n_x = n_x;
        p.epilogue = pr.epilogue;
        p.sm_count = sms;
        p.x_q8 = prepared ? x_q8 : nullptr;
        p.x_quantized = quantized;
        p.overlap = overlap;
        check(m40_gemv(type, &p, rows_per_warp, stream), pr.name);
    };
    // Microseconds per call of `launch` over `reps` calls (after two warm-up calls).
    const auto time_us = [&](int reps, auto launch) {
        for (int r = 0; r < reps + 2; r++) {
            if (r == 2) cudaEventRecord(start, stream);
            launch(r);
        }
        cudaEventRecord(stop, stream);
        check(cudaEventSynchronize(stop), "timing");
        float ms = 0.0f;
        cudaEventElapsedTime(&ms, start, stop);
        return 1000.0 * ms / reps;
    };

    printf("type %d, rows per warp %d (0: the format's choice), %d activation rows, %s path, launches %s, "
           "%d layers: %.1f MB per token\n",
           type, rows_per_warp, n_x, tensor_cores ? "tensor-core"
           : !prepared  ? "FP32"
           : grid       ? "FP32 on grid values"
           : dp4a       ? "integer"
                        : "scaled",
           overlap ? "overlapping" : "in order", layers,
           token_bytes / 1e6);
    printf("%-9s %8s %10s %10s %8s\n", "product", "MB", "read (us)", "gemv (us)", "GB/s");
    for (int s = 0; s < n_products; s++) {
        const int copies = int(weights[s].size());
        const size_t bytes = size_t(products[s].n_matrices) * products[s].rows * row_bytes(type, products[s].cols);
        const double floor_us = time_us(48, [&](int r) {
            m40_launch(overlap, read_floor, dim3(16 * sms), 128, stream,
                       reinterpret_cast<const uint4 *>(weights[s][r % copies]), bytes / 16);
        });
        const double gemv_us = time_us(48, [&](int r) { product(s, r % copies, true); });
        printf("%-9s %8.1f %10.2f %10.2f %8.0f\n", products[s].name, bytes / 1e6, floor_us, gemv_us,
               bytes / gemv_us / 1e3);
    }
    for (int quantize = 0; quantize < 2; quantize++) {
        const double token_us = time_us(10, [&](int) {
            for (int l = 0; l < layers; l++)
                for (int s = 0; s < 4; s++) product(s, l, !quantize);
            product(4, 0, !quantize);
        });
        printf("a token's products%s: %.3f ms, %.0f GB/s\n",
               !quantize || !prepared ? "" : tensor_cores ? " with their f16 conversions" : " with their prepare launches", token_us / 1e3, token_bytes / token_us / 1e3);
        if (!prepared) break;
    }
    return 0;
}
