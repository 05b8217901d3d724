// Times the linear-attention kernels of cuda/delta_net.cu at qwen35-27b's
// shapes (16 key heads and, by default, 48 value heads of 128 values), each
// alone and as a whole step in both forms, after checking that the chunked
// form gives the token-by-token outputs and states. Built apart from the
// library, with the CUDA toolkit alone:
//
//   nvcc -std=c++17 -O3 -arch=sm_90 -Icuda tools/delta_net_bench.cu -o delta_net_bench
//   ./delta_net_bench [ROWS (512)] [VALUE HEADS (48)]
#include "delta_net.cu"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

// n floats drawn uniformly from [lo, hi), on the device.
static float *device_values(size_t n, float lo, float hi) {
    std::vector<float> host(n);
    for (auto &x : host) x = lo + (hi - lo) * (rand() / float(RAND_MAX));
    float *d = nullptr;
    cudaMalloc(&d, n * 4);
    cudaMemcpy(d, host.data(), n * 4, cudaMemcpyHostToDevice);
    return d;
}

static std::vector<float> to_host(const float *d, size_t n) {
    std::vector<float> host(n);
    cudaMemcpy(host.data(), d, n * 4, cudaMemcpyDeviceToHost);
    return host;
}

// The largest difference of a and b, and the largest magnitude of b.
static void compare(const char *what, const std::vector<float> &a, const std::vector<float> &b) {
    double diff = 0, scale = 0;
    for (size_t i = 0; i < a.size(); i++) {
        diff = fmax(diff, fabs(a[i] - b[i]));
        scale = fmax(scale, fabs(b[i]));
    }
    printf("chunked against token by token, %s: %.3g of %.3g\n", what, diff, scale);
}

int main(int argc, char **argv) {
    const int rows = argc > 1 ? atoi(argv[1]) : 512, n_v = argc > 2 ? atoi(argv[2]) : 48;
    const int n_k = 16, S = 128, taps = 4;
    const int channels = 2 * n_k * S + n_v * S;
    float *qkv = device_values(size_t(rows) * channels, -1, 1);
    float *alpha = device_values(size_t(rows) * n_v, -1, 1), *beta = device_values(size_t(rows) * n_v, -2, 2);
    float *weights = device_values(size_t(channels) * taps, -0.5, 0.5);
    float *dt_bias = device_values(n_v, -1, 1), *a = device_values(n_v, -2, -0.1);
    float *conv = device_values(size_t(rows) * channels, 0, 0);
    const size_t n_out = size_t(rows) * n_v * S;
    float *out = device_values(n_out, 0, 0);
    float *scratch = device_values(m40_delta_net_scratch(rows, S, n_v), 0, 0);
    const size_t n_state = size_t(taps - 1) * channels + size_t(n_v) * S * S;
    float *state = device_values(n_state, 0, 0);
    // One sequence: every row names the same states.
    std::vector<M40Row> host_rows(rows);
    for (int r = 0; r < rows; r++) host_rows[r] = M40Row{0, 0, r, rows, (unsigned long long)state};
    M40Row *row_table = nullptr;
    cudaMalloc(&row_table, rows * sizeof(M40Row));
    cudaMemcpy(row_table, host_rows.data(), rows * sizeof(M40Row), cudaMemcpyHostToDevice);
    const int host_runs[2] = {0, rows};
    int *runs = nullptr;
    cudaMalloc(&runs, sizeof host_runs);
    cudaMemcpy(runs, host_runs, sizeof host_runs, cudaMemcpyHostToDevice);
    const long long conv_offset = 0, state_offset = (long long)(taps - 1) * channels;
    auto step = [&](float *chunk_scratch) {
        m40_delta_net(qkv, alpha, beta, weights, dt_bias, a, row_table, runs, rows, 1, rows, conv_offset,
                      state_offset, taps, S, n_k, n_v, 1e-6f, conv, chunk_scratch, out, 0);
    };

    cudaMemset(state, 0, n_state * 4);
    step(scratch);
    const std::vector<float> chunked_out = to_host(out, n_out), chunked_state = to_host(state, n_state);
    cudaMemset(state, 0, n_state * 4);
    step(nullptr);
    compare("outputs", chunked_out, to_host(out, n_out));
    compare("states", chunked_state, to_host(state, n_state));

    cudaEvent_t start, stop;
    cudaEventCreate(&start);
    cudaEventCreate(&stop);
    auto time = [&](const char *what, auto launch) {
        launch();
        cudaDeviceSynchronize();
        cudaEventRecord(start);
        for (int i = 0; i < 10; i++) launch();
        cudaEventRecord(stop);
        cudaEventSynchronize(stop);
        float ms = 0;
        cudaEventElapsedTime(&ms, start, stop);
        printf("%-28s %8.1f us  (%s)\n", what, ms * 100, cudaGetErrorString(cudaGetLastError()));
    };
    using D = DeltaChunk<128>;
    const DeltaScratch parts(scratch, rows, S, n_v);
    const dim3 channel_blocks(m40_blocks(channels, 128), rows);
    time("whole, chunked", [&] { step(scratch); });
    time("whole, token by token", [&] { step(nullptr); });
    time("conv rows", [&] {
        conv_rows_kernel<<<channel_blocks, 128>>>(qkv, channels, taps, weights, row_table, runs, 1, conv_offset,
                                                  conv);
    });
    time("conv state", [&] {
        conv_state_kernel<<<dim3(m40_blocks(channels, 128), 1), 128>>>(qkv, channels, taps, row_table, runs,
                                                                       conv_offset);
    });
    time("conv (token kernel)", [&] {
        conv_kernel<4><<<dim3(m40_blocks(channels, 128), 1), 128>>>(qkv, channels, taps, weights, row_table, runs,
                                                                     conv_offset, conv);
    });
    time("l2 norms", [&] { l2_norm_kernel<<<dim3(2 * n_k, rows), M40_NORM_THREADS>>>(conv, channels, S, 1e-6f); });
    time("prepare", [&] {
        delta_prepare_kernel<128><<<dim3((rows + D::ROWS - 1) / D::ROWS, n_v, 1), M40_DELTA_PREPARE_THREADS>>>(
            conv, alpha, beta, dt_bias, a, runs, n_k, n_v, parts);
    });
    time("scan", [&] {
        delta_scan_kernel<128><<<dim3(S / D::COLS, n_v, 1), D::THREADS>>>(conv, parts, row_table, runs,
                                                                          state_offset, n_k, n_v, out);
    });
    time("token recurrence", [&] {
        delta_kernel<128><<<dim3(n_v, 1), 128 * M40_DELTA_PARTS>>>(conv, alpha, beta, dt_bias, a, row_table, runs,
                                                                   state_offset, n_k, n_v, out);
    });
    return 0;
}
