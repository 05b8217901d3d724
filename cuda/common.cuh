// Shared by every kernel file: the launcher calling convention, f16/bf16
// loads from raw bytes, and warp reductions.
//
// Maxwell (sm_52) rules for all of cuda/: arithmetic in FP32 only; FP16 is a
// storage format, converted with __half2float / __float2half_rn (plain
// conversion instructions on every architecture); no dp4a, no half
// arithmetic intrinsics, no tensor-core instructions. Two exceptions, kept
// off the M40's path: gemv.cu's integer path runs dp4a on sm_61 and newer,
// mmq.cu's products half arithmetic and f16 tensor cores on sm_80 and newer;
// the host launches each only where the device runs that code.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <atomic>

// Launchers are called from Rust: plain C names, a stream last, and the
// launch's error code as the result.
#define M40_EXPORT extern "C"

// A launch parameter that belongs to the current device (a kernel's
// occupancy, its shared-memory allowance): `find(device)` (≥ 0; device −1
// where the current one cannot be read) on the device's first request, then
// a read. Kept per device because a host may hold several kinds of GPU.
// Each call site has its own cache (`find` is a lambda of its own type);
// two threads finding the same value at once store it twice, which is
// harmless.
#define M40_CACHED_DEVICES 64
template <class Find> static int m40_per_device(Find find) {
    // Static storage starts zeroed: 0 is "not found yet", else value + 1.
    static std::atomic<int> cache[M40_CACHED_DEVICES];
    int device = -1;
    if (cudaGetDevice(&device) != cudaSuccess) {
        cudaGetLastError();  // the launch that follows reports the failure
        return find(-1);
    }
    if (device < 0 || device >= M40_CACHED_DEVICES) return find(device);
    int stored = cache[device].load(std::memory_order_relaxed);
    if (stored == 0) {
        stored = find(device) + 1;
        cache[device].store(stored, std::memory_order_relaxed);
    }
    return stored - 1;
}

static inline cudaError_t m40_launch_status() { return cudaGetLastError(); }

// Overlapping launches (programmatic dependent launch, sm_90 and newer): a
// decode step is ~300 small dependent kernels, and between two of them the
// GPU would otherwise drain the first grid before it starts the second. A
// kernel launched with `overlap` may start while the stream's previous
// kernel is still running, so it calls m40_wait_for_prior_kernels() before
// it reads or writes any memory a prior kernel writes or reads (its
// weights, which nothing writes, may be loaded before); the wait returns
// once the prior kernel has finished and its writes are visible. The short
// kernels let their successor start as soon as all their blocks are running
// (m40_allow_next_kernel), so that a product's blocks are resident, their
// first weights loaded, when its input is ready. Compiled for sm_52–sm_86
// both are no-ops, and the host sets `overlap` only where the device runs
// this build's sm_90 code (m40_launch_overlap). Launch boundaries, not
// device-wide barriers in one resident grid, separate a token's products:
// on the H100 a barrier costs more than the launch boundary it would
// replace (docs/cuda.md).
__device__ __forceinline__ void m40_wait_for_prior_kernels() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void m40_allow_next_kernel() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;");
#endif
}

// kernel<<<grid, threads, shared_bytes, stream>>>(args...), overlapping the
// stream's previous kernel where `overlap` (its status, as a launch's,
// through m40_launch_status).
template <class... Params, class... Args>
static void m40_launch_shared(bool overlap, void (*kernel)(Params...), dim3 grid, unsigned threads,
                              size_t shared_bytes, cudaStream_t stream, Args... args) {
    cudaLaunchAttribute attribute = {};
    attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t config = {};
    config.gridDim = grid;
    config.blockDim = dim3(threads);
    config.dynamicSmemBytes = shared_bytes;
    config.stream = stream;
    config.attrs = &attribute;
    config.numAttrs = overlap ? 1 : 0;
    cudaLaunchKernelEx(&config, kernel, args...);
}

// The same without dynamic shared memory.
template <class... Params, class... Args>
static void m40_launch(bool overlap, void (*kernel)(Params...), dim3 grid, unsigned threads, cudaStream_t stream,
                       Args... args) {
    m40_launch_shared(overlap, kernel, grid, threads, 0, stream, args...);
}

__device__ __forceinline__ float m40_f16(const uint8_t *p) {
    // Every f16 inside a GGUF block sits at an even address: tensors are
    // 32-byte aligned and every block size is even.
    return __half2float(__ushort_as_half(*reinterpret_cast<const uint16_t *>(p)));
}

__device__ __forceinline__ float m40_half_bits(uint16_t bits) {
    return __half2float(__ushort_as_half(bits));
}

__device__ __forceinline__ float m40_bf16(const uint8_t *p) {
    uint32_t bits = uint32_t(*reinterpret_cast<const uint16_t *>(p)) << 16;
    return __uint_as_float(bits);
}

// The sum over the warp, or over each run of LANES lanes (every lane of the
// warp takes part either way).
template <int LANES = 32> __device__ __forceinline__ float m40_warp_sum(float v) {
#pragma unroll
    for (int offset = LANES / 2; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

__device__ __forceinline__ float m40_warp_max(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
}

// Threads of the kernels that reduce over a whole row (norms, quantization).
#define M40_NORM_THREADS 256

// The sum of v over a block of M40_NORM_THREADS threads, returned to all.
__device__ float m40_block_sum(float v) {
    __shared__ float partial[M40_NORM_THREADS / 32];
    v = m40_warp_sum(v);
    __syncthreads();  // a previous call's readers are done with `partial`
    if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
    __syncthreads();
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < M40_NORM_THREADS / 32; w++) sum += partial[w];
    return sum;
}

// 1 / rms of a group of values.
__device__ float m40_inverse_rms(const float *g, int group, float eps) {
    float sum = 0.0f;
    for (int i = threadIdx.x; i < group; i += M40_NORM_THREADS) sum += g[i] * g[i];
    return 1.0f / sqrtf(m40_block_sum(sum) / float(group) + eps);
}

// Value i = part · M40_NORM_THREADS + threadIdx.x of activation row t of x,
// RMS-normalized with `norm` first where given, into v; false past the
// row's end. Every thread of the block calls it (the row's 1/rms is the
// block's sum): the decode products' prepare launches (q8.cuh, scaled.cuh).
__device__ bool m40_row_value(const float *__restrict__ x, const float *__restrict__ norm, float eps, int cols,
                              int t, int part, int &i, float &v) {
    const float *row = x + size_t(t) * cols;
    const float scale = norm ? m40_inverse_rms(row, cols, eps) : 1.0f;
    i = part * M40_NORM_THREADS + threadIdx.x;
    if (i >= cols) return false;
    v = norm ? row[i] * scale * norm[i] : row[i];
    return true;
}

// The logistic function (Qwen3.5's gates and write strengths).
__device__ __forceinline__ float m40_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// The gate activation of SwiGLU (SiLU) or GeGLU (tanh-GELU, written as
// x / (1 + e^{−2y}), as the CPU backend computes it).
__device__ __forceinline__ float m40_activation(bool gelu, float g) {
    if (!gelu) return g / (1.0f + expf(-g));
    const float y = 0.7978845608f * g * (1.0f + 0.044715f * g * g);
    return g / (1.0f + expf(-2.0f * y));
}

// The gated activations act(gate) · up a kernel may apply (`glu_activation`
// in src/backend/cuda/kernels.rs names the same numbers).
enum M40Glu { M40_GLU_SILU = 0, M40_GLU_GELU = 1, M40_GLU_OAI = 2 };

// gpt-oss's clamped SwiGLU (ggml's swiglu_oai, as src/quant/float.rs
// computes it): the gate clamped from above at 7, the up value to ±7, then
// g · σ(1.702 g) · (u + 1).
__device__ __forceinline__ float m40_swiglu_oai(float gate, float up) {
    const float g = fminf(gate, 7.0f), u = fminf(fmaxf(up, -7.0f), 7.0f);
    return g / (1.0f + expf(-1.702f * g)) * (u + 1.0f);
}

// act(gate) · up for `act` an M40Glu.
__device__ __forceinline__ float m40_gated(int act, float gate, float up) {
    return act == M40_GLU_OAI ? m40_swiglu_oai(gate, up) : m40_activation(act == M40_GLU_GELU, gate) * up;
}

static inline unsigned m40_blocks(size_t n, unsigned threads) {
    return unsigned((n + threads - 1) / threads);
}
