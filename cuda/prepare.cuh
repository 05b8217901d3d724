// The launch that prepares a decode product's activations in scratch before
// its products read them (gemv.cu's M40Gemv::x_q8, moe.cu's routing launch):
// on GPUs with dp4a (code compiled for sm_61 or newer) 8-bit codes for the
// integer path (q8.cuh); on the M40 (sm_52 code, the compute_52 PTX
// included) values scaled for the FP32 path's masked codes (scaled.cuh).
// The host asks which of the two the device runs (m40_code_version, gemv.cu).
// Formats without the kernel the device runs get their activations rounded
// to the same grid, as f32 values for their FP32 kernel (M40_PREPARED_GRID).
#pragma once

#include "q8.cuh"
#include "scaled.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 610
#define M40_DP4A_CODE 1
#else
#define M40_DP4A_CODE 0
#endif

// The formats whose decode products read scaled values on the M40
// (gemv.cu's GemvScaled), and those that read 8-bit codes on GPUs with dp4a
// (GemvQ8): the same and the table-lookup formats, whose table values are
// their weights' codes.
__host__ __device__ constexpr bool m40_scaled_format(int type) {
    return type == M40_Q4_0 || type == M40_Q4_1 || type == M40_Q5_0 || type == M40_Q5_1 || type == M40_Q8_0 ||
           type == M40_Q4_K || type == M40_Q5_K || type == M40_Q6_K;
}
__host__ __device__ constexpr bool m40_integer_format(int type) {
    return m40_scaled_format(type) || type == M40_IQ4_NL || type == M40_IQ4_XS || type == M40_MXFP4;
}

// How a format's decode products read prepared rows (a "form") on a GPU
// that runs this build's dp4a code or not: the block scales
// (M40ActivationScales, bits 0–1), plus M40_PREPARED_GRID for the formats
// whose activations llama.cpp's CPU rounds to 8 bits but which have no
// prepared kernel there (Q2_K and Q3_K; the table-lookup formats without
// dp4a): their FP32 kernel reads each value as the CPU multiplies it,
// d · code in f32, from rows laid out as x is (row t's value i at
// t · cols + i). Rows prepared in one form are read only by products of
// the same form (the host's PreparedForm).
#define M40_PREPARED_GRID 4

__host__ __device__ constexpr int m40_prepared_form(int type, bool dp4a) {
    const int scales = m40_activation_scales(type);
    const bool own_kernel = dp4a ? m40_integer_format(type) : m40_scaled_format(type);
    return own_kernel || scales == M40_SCALES_F32 ? scales : scales | M40_PREPARED_GRID;
}

__host__ __device__ constexpr int m40_form_scales(int form) { return form & ~M40_PREPARED_GRID; }

// Whether a host's argument names a form (grid values need a grid).
constexpr bool m40_valid_form(int form) {
    return (form & ~(M40_PREPARED_GRID | 3)) == 0 && form != (M40_SCALES_F32 | M40_PREPARED_GRID);
}

// Bytes of scratch for n_x prepared rows of cols values: the largest layout,
// the scaled one (over 4.5 bytes a value; the codes take 1.25, grid values
// 4). Mirrors `prepared_bytes` in src/backend/cuda/kernels.rs.
static inline size_t m40_prepared_bytes(int cols, int n_x) { return m40_scaled_bytes(cols, n_x); }

// Value v (index i) of activation row t into scratch in `form` (the
// products' weight format's on this GPU, m40_prepared_form), as this code's products
// read it, rounded to 8 bits with the form's block scales (`k`, Q8_K's
// scale of its 256 values, for M40_SCALES_Q8_K); its warp holds the 32
// values of its block of 32 (lane i % 32), and every lane of the warp calls
// it.
__device__ __forceinline__ void m40_prepare_value(float v, int i, int cols, int n_x, int8_t *scratch, int t, int form,
                                                  M40Q8K k = {}) {
    const int scales = m40_form_scales(form);
    if (form & M40_PREPARED_GRID) {
        const M40Q8Value c = m40_q8_code(v, scales, k);
        reinterpret_cast<float *>(scratch)[size_t(t) * cols + i] = float(c.q) * m40_kept_scale(c.d, scales);
        return;
    }
#if M40_DP4A_CODE
    m40_quantize_q8_value(v, i, cols, n_x, scratch, t, scales, k);
#else
    m40_scale_value(v, i, cols, n_x, scratch, t, scales, k);
#endif
}

// Values part · M40_NORM_THREADS.. of activation row t of x (normalized with
// `norm` first where given) into scratch, as this code's products read
// them: a CUDA block takes M40_NORM_THREADS values, so that a row is spread
// over the GPU rather than walked by one block (each block computes the
// row's rms itself; the row is read from L2), and a Q8_K block of 256
// values is a CUDA block's. Every thread of the block calls it.
__device__ void m40_prepare_part(const float *__restrict__ x, const float *__restrict__ norm, float eps, int cols,
                                 int n_x, int8_t *scratch, int form, int t, int part) {
    int i;
    float v;
    const bool in_row = m40_row_value(x, norm, eps, cols, t, part, i, v);
    const M40Q8K k = m40_form_scales(form) == M40_SCALES_Q8_K ? m40_block_q8_k(in_row ? v : 0.0f) : M40Q8K{};
    if (!in_row) return;  // whole warps: cols is a multiple of 32
    m40_prepare_value(v, i, cols, n_x, scratch, t, form, k);
}

// Activation row blockIdx.y, values blockIdx.x · M40_NORM_THREADS.., into scratch.
__global__ void __launch_bounds__(M40_NORM_THREADS)
    prepare_activations_kernel(const float *__restrict__ x, const float *__restrict__ norm, float eps, int cols,
                               int n_x, int8_t *scratch, int form) {
    m40_wait_for_prior_kernels();
    m40_allow_next_kernel();
    m40_prepare_part(x, norm, eps, cols, n_x, scratch, form, blockIdx.y, blockIdx.x);
}

// Prepares n_x rows of x (normalized first where `norm` is given) into
// scratch in `form`.
static void m40_prepare_activations(bool overlap, const float *x, const float *norm, float eps, int cols, int n_x,
                                    int8_t *scratch, int form, cudaStream_t stream) {
    const dim3 grid(m40_blocks(size_t(cols), M40_NORM_THREADS), unsigned(n_x));
    m40_launch(overlap, prepare_activations_kernel, grid, M40_NORM_THREADS, stream, x, norm, eps, cols, n_x,
               scratch, form);
}
