// The layout of the structs the Rust side hands to the kernels' launchers,
// as fixed numbers: each struct's size and alignment and each field's offset
// (64-bit host), and the enum values and limits the two sides share.
// src/backend/cuda/layout.rs states the same numbers for the Rust copies in
// src/backend/cuda/kernels.rs: change a struct on one side and both sides,
// and both files, must change, or the build fails. Included where every
// struct it names is defined (the end of m40llm.cu; tests/gpu/gemv_bench.cu).
#pragma once

#include <cstddef>

static_assert(sizeof(void *) == 8, "the launchers' structs are laid out for a 64-bit host");

#define M40_FIELD(S, f, offset) \
    static_assert(offsetof(S, f) == (offset), #S "::" #f ": offset differs from src/backend/cuda/layout.rs")
#define M40_SIZE(S, size, align) \
    static_assert(sizeof(S) == (size) && alignof(S) == (align), #S ": size differs from src/backend/cuda/layout.rs")

// DeviceRow (ops.cuh)
M40_SIZE(M40Row, 32, 8);
M40_FIELD(M40Row, keys, 0);
M40_FIELD(M40Row, values, 8);
M40_FIELD(M40Row, pos, 16);
M40_FIELD(M40Row, n_ctx, 20);
M40_FIELD(M40Row, state, 24);

// KvLayer (ops.cuh)
M40_SIZE(M40KvLayer, 8, 4);
M40_FIELD(M40KvLayer, k_start, 0);
M40_FIELD(M40KvLayer, v_start, 4);

// GemvMatrix (gemv.cu)
M40_SIZE(M40GemvMatrix, 32, 8);
M40_FIELD(M40GemvMatrix, w, 0);
M40_FIELD(M40GemvMatrix, bias, 8);
M40_FIELD(M40GemvMatrix, y, 16);
M40_FIELD(M40GemvMatrix, rows, 24);
M40_FIELD(M40GemvMatrix, role, 28);

// YarnRamp (ops.cuh)
M40_SIZE(M40Yarn, 16, 4);
M40_FIELD(M40Yarn, low, 0);
M40_FIELD(M40Yarn, high, 4);
M40_FIELD(M40Yarn, magnitude, 8);
M40_FIELD(M40Yarn, enabled, 12);

// AttentionInputs (ops.cuh)
M40_SIZE(M40AttentionInputs, 112, 8);
M40_FIELD(M40AttentionInputs, rows, 0);
M40_FIELD(M40AttentionInputs, q_norm, 8);
M40_FIELD(M40AttentionInputs, k_norm, 16);
M40_FIELD(M40AttentionInputs, factors, 24);
M40_FIELD(M40AttentionInputs, freq_base, 32);
M40_FIELD(M40AttentionInputs, freq_scale, 40);
M40_FIELD(M40AttentionInputs, inv_freq_ratio, 48);
M40_FIELD(M40AttentionInputs, eps, 56);
M40_FIELD(M40AttentionInputs, layer, 60);
M40_FIELD(M40AttentionInputs, n_head, 68);
M40_FIELD(M40AttentionInputs, n_head_kv, 72);
M40_FIELD(M40AttentionInputs, head_dim_k, 76);
M40_FIELD(M40AttentionInputs, head_dim_v, 80);
M40_FIELD(M40AttentionInputs, neox, 84);
M40_FIELD(M40AttentionInputs, rope_dims, 88);
M40_FIELD(M40AttentionInputs, overlap, 92);
M40_FIELD(M40AttentionInputs, yarn, 96);

// GemvLaunch (gemv.cu)
M40_SIZE(M40Gemv, 328, 8);
M40_FIELD(M40Gemv, m, 0);
M40_FIELD(M40Gemv, n_matrices, 96);
M40_FIELD(M40Gemv, cols, 100);
M40_FIELD(M40Gemv, x, 104);
M40_FIELD(M40Gemv, n_x, 112);
M40_FIELD(M40Gemv, epilogue, 116);
M40_FIELD(M40Gemv, norm, 120);
M40_FIELD(M40Gemv, eps, 128);
M40_FIELD(M40Gemv, sm_count, 132);
M40_FIELD(M40Gemv, x_q8, 136);
M40_FIELD(M40Gemv, x_quantized, 144);
M40_FIELD(M40Gemv, overlap, 148);
M40_FIELD(M40Gemv, attention, 152);
M40_FIELD(M40Gemv, experts, 264);

// MmqLaunch (mmq.cu)
M40_SIZE(M40Mmq, 144, 8);
M40_FIELD(M40Mmq, w, 0);
M40_FIELD(M40Mmq, rows, 8);
M40_FIELD(M40Mmq, cols, 12);
M40_FIELD(M40Mmq, x_f16, 16);
M40_FIELD(M40Mmq, x_scales, 24);
M40_FIELD(M40Mmq, n_x, 32);
M40_FIELD(M40Mmq, bias, 40);
M40_FIELD(M40Mmq, y, 48);
M40_FIELD(M40Mmq, accumulate, 56);
M40_FIELD(M40Mmq, splits, 60);
M40_FIELD(M40Mmq, partials, 64);
M40_FIELD(M40Mmq, overlap, 72);
M40_FIELD(M40Mmq, experts, 80);

// ExpertWork, ExpertView (ops.cuh)
M40_SIZE(M40ExpertWork, 12, 4);
M40_FIELD(M40ExpertWork, expert, 0);
M40_FIELD(M40ExpertWork, first, 4);
M40_FIELD(M40ExpertWork, count, 8);
M40_SIZE(M40Experts, 64, 8);
M40_FIELD(M40Experts, work, 0);
M40_FIELD(M40Experts, expert_bytes, 8);
M40_FIELD(M40Experts, n_work, 16);
M40_FIELD(M40Experts, x_shared, 20);
M40_FIELD(M40Experts, x_rows, 24);
M40_FIELD(M40Experts, shared_expert, 28);
M40_FIELD(M40Experts, shared, 32);
M40_FIELD(M40Experts, bias_stride, 56);

// ProjectionRole, GemvEpilogue (fields of type int here, repr(i32) there)
static_assert(M40_PLAIN_OUTPUT == 0 && M40_QUERIES == 1 && M40_KEYS == 2 && M40_VALUES == 3,
              "M40ProjectionRole differs from src/backend/cuda/layout.rs");
static_assert(M40_GEMV_STORE == 0 && M40_GEMV_ACCUMULATE == 1 && M40_GEMV_GLU_SILU == 2 && M40_GEMV_GLU_GELU == 3 &&
                  M40_GEMV_GLU_OAI == 4,
              "M40GemvEpilogue differs from src/backend/cuda/layout.rs");
// The gated activations (GLU_SILU, GLU_GELU_TANH, GLU_SWIGLU_OAI there)
static_assert(M40_GLU_SILU == 0 && M40_GLU_GELU == 1 && M40_GLU_OAI == 2,
              "M40Glu differs from src/backend/cuda/layout.rs");
// ActivationScales (src/quant/q8.rs; an int here)
static_assert(M40_SCALES_F32 == 0 && M40_SCALES_Q8_0 == 1 && M40_SCALES_Q8_1 == 2 && M40_SCALES_Q8_K == 3,
              "M40ActivationScales differs from src/backend/cuda/layout.rs");
// PreparedForm::GRID (src/backend/cuda/kernels.rs)
static_assert(M40_PREPARED_GRID == 4, "M40_PREPARED_GRID differs from src/backend/cuda/layout.rs");

// GEMV_MAX_X, ATTENTION_MAX_HEAD_DIM, MOE_MAX_EXPERTS, MOE_MAX_USED
static_assert(M40_GEMV_MAX_X == 8, "M40_GEMV_MAX_X differs from src/backend/cuda/layout.rs");
static_assert(M40_MOE_MAX_EXPERTS == 1024 && M40_MOE_MAX_USED == 32,
              "M40_MOE_MAX_EXPERTS or M40_MOE_MAX_USED differs from src/backend/cuda/layout.rs");
static_assert(M40_MAX_HEAD_DIM == 512, "M40_MAX_HEAD_DIM differs from src/backend/cuda/layout.rs");

// The prepared activations' scratch (m40_scaled_bytes, scaled.cuh; prepared_bytes there)
static_assert(m40_scaled_bytes(4096, 8) == 147456 && m40_scaled_bytes(11008, 1) == 50560 &&
                  m40_scaled_bytes(2048, 3) == 27648,
              "m40_scaled_bytes differs from prepared_bytes in src/backend/cuda/kernels.rs");

#undef M40_FIELD
#undef M40_SIZE
