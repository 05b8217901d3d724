//! The layout of the structs the Rust side hands to the kernels' launchers,
//! as fixed numbers: each struct's size and alignment and each field's
//! offset (64-bit host), and the enum values and limits the two sides share.
//! `cuda/layout.cuh` states the same numbers for the C++ originals in
//! `cuda/`: change a struct on one side and both sides, and both files, must
//! change, or the build fails.

use std::mem::{align_of, offset_of, size_of};

use super::kernels::{
    prepared_bytes, AttentionInputs, DeviceRow, ExpertView, ExpertWork, GemvEpilogue, GemvLaunch,
    GemvMatrix, KvLayer, MmqLaunch, PreparedForm, ProjectionRole, YarnRamp, ATTENTION_MAX_HEAD_DIM,
    GEMV_MAX_X, GLU_GELU_TANH, GLU_SILU, GLU_SWIGLU_OAI, MOE_MAX_EXPERTS, MOE_MAX_USED,
};
use crate::quant::ActivationScales;

/// Asserts, at compile time, a struct's size and alignment and then each
/// named field's offset.
macro_rules! layout {
    ($ty:ty, size $size:expr, align $align:expr, { $($field:ident: $offset:expr),* $(,)? }) => {
        const _: () = assert!(
            size_of::<$ty>() == $size && align_of::<$ty>() == $align,
            concat!(stringify!($ty), ": size differs from cuda/layout.cuh")
        );
        $(const _: () = assert!(
            offset_of!($ty, $field) == $offset,
            concat!(stringify!($ty), "::", stringify!($field), ": offset differs from cuda/layout.cuh")
        );)*
    };
}

const _: () = assert!(
    size_of::<usize>() == 8,
    "the launchers' structs are laid out for a 64-bit host"
);

// M40Row (cuda/ops.cuh)
layout!(DeviceRow, size 32, align 8, { keys: 0, values: 8, pos: 16, n_ctx: 20, state: 24 });

// M40KvLayer (cuda/ops.cuh)
layout!(KvLayer, size 8, align 4, { k_start: 0, v_start: 4 });

// M40GemvMatrix (cuda/gemv.cu)
layout!(GemvMatrix, size 32, align 8, { w: 0, bias: 8, y: 16, rows: 24, role: 28 });

// M40Yarn (cuda/ops.cuh)
layout!(YarnRamp, size 16, align 4, { low: 0, high: 4, magnitude: 8, enabled: 12 });

// M40AttentionInputs (cuda/ops.cuh)
layout!(AttentionInputs, size 112, align 8, {
    rows: 0,
    q_norm: 8,
    k_norm: 16,
    factors: 24,
    freq_base: 32,
    freq_scale: 40,
    inv_freq_ratio: 48,
    eps: 56,
    layer: 60,
    n_head: 68,
    n_head_kv: 72,
    head_dim_k: 76,
    head_dim_v: 80,
    neox: 84,
    rope_dims: 88,
    overlap: 92,
    yarn: 96,
});

// M40Gemv (cuda/gemv.cu)
layout!(GemvLaunch, size 328, align 8, {
    m: 0,
    n_matrices: 96,
    cols: 100,
    x: 104,
    n_x: 112,
    epilogue: 116,
    norm: 120,
    eps: 128,
    sm_count: 132,
    x_q8: 136,
    x_quantized: 144,
    overlap: 148,
    attention: 152,
    experts: 264,
});

// M40Mmq (cuda/mmq.cu)
layout!(MmqLaunch, size 144, align 8, {
    w: 0,
    rows: 8,
    cols: 12,
    x_f16: 16,
    x_scales: 24,
    n_x: 32,
    bias: 40,
    y: 48,
    accumulate: 56,
    splits: 60,
    partials: 64,
    overlap: 72,
    experts: 80,
});

// M40ExpertWork, M40Experts (cuda/ops.cuh)
layout!(ExpertWork, size 12, align 4, { expert: 0, first: 4, count: 8 });
layout!(ExpertView, size 64, align 8, {
    work: 0,
    expert_bytes: 8,
    n_work: 16,
    x_shared: 20,
    x_rows: 24,
    shared_expert: 28,
    shared: 32,
    bias_stride: 56,
});

// M40ProjectionRole, M40GemvEpilogue (fields of type int on the C++ side)
const _: () = assert!(
    size_of::<ProjectionRole>() == 4
        && ProjectionRole::Plain as i32 == 0
        && ProjectionRole::Queries as i32 == 1
        && ProjectionRole::Keys as i32 == 2
        && ProjectionRole::Values as i32 == 3,
    "ProjectionRole differs from cuda/layout.cuh"
);
const _: () = assert!(
    size_of::<GemvEpilogue>() == 4
        && GemvEpilogue::Store as i32 == 0
        && GemvEpilogue::Accumulate as i32 == 1
        && GemvEpilogue::GluSilu as i32 == 2
        && GemvEpilogue::GluGelu as i32 == 3
        && GemvEpilogue::GluOai as i32 == 4,
    "GemvEpilogue differs from cuda/layout.cuh"
);
// M40Glu (cuda/common.cuh)
const _: () = assert!(
    GLU_SILU == 0 && GLU_GELU_TANH == 1 && GLU_SWIGLU_OAI == 2,
    "the GLU activations differ from cuda/layout.cuh"
);
const _: () = assert!(
    ActivationScales::F32 as i32 == 0
        && ActivationScales::Q8_0 as i32 == 1
        && ActivationScales::Q8_1 as i32 == 2
        && ActivationScales::Q8K as i32 == 3,
    "ActivationScales differs from cuda/layout.cuh"
);
// M40_PREPARED_GRID (cuda/prepare.cuh)
const _: () = assert!(
    PreparedForm::GRID == 4,
    "PreparedForm::GRID differs from cuda/layout.cuh"
);

// M40_GEMV_MAX_X, M40_MAX_HEAD_DIM, M40_MOE_MAX_EXPERTS, M40_MOE_MAX_USED
const _: () = assert!(GEMV_MAX_X == 8, "GEMV_MAX_X differs from cuda/layout.cuh");
const _: () = assert!(
    MOE_MAX_EXPERTS == 1024 && MOE_MAX_USED == 32,
    "MOE_MAX_EXPERTS or MOE_MAX_USED differs from cuda/layout.cuh"
);
const _: () = assert!(
    ATTENTION_MAX_HEAD_DIM == 512,
    "ATTENTION_MAX_HEAD_DIM differs from cuda/layout.cuh"
);

// m40_scaled_bytes (cuda/scaled.cuh): the prepared activations' scratch
const _: () = assert!(
    prepared_bytes(4096, 8) == 147456
        && prepared_bytes(11008, 1) == 50560
        && prepared_bytes(2048, 3) == 27648,
    "prepared_bytes differs from cuda/layout.cuh"
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::GgmlType;

    /// The forms the kernels give each format (host arithmetic in
    /// cuda/prepare.cuh), with llama.cpp's CPU block scales: codes for the
    /// formats with an integer kernel where the device runs dp4a code (the
    /// table-lookup formats among them), scaled values for those with a
    /// scaled kernel where it does not, else grid values.
    #[test]
    fn formats_read_prepared_rows_in_their_own_form() {
        let grid = PreparedForm::GRID;
        // (format, scales, grid values with dp4a, grid values without)
        for (ty, scales, dp4a_grid, scaled_grid) in [
            (GgmlType::F16, ActivationScales::F32, false, false),
            (GgmlType::Q4_0, ActivationScales::Q8_0, false, false),
            (GgmlType::Q4_1, ActivationScales::Q8_1, false, false),
            (GgmlType::Q8_0, ActivationScales::Q8_0, false, false),
            (GgmlType::Q4K, ActivationScales::Q8K, false, false),
            (GgmlType::Q6K, ActivationScales::Q8K, false, false),
            (GgmlType::Q2K, ActivationScales::Q8K, true, true),
            (GgmlType::Q3K, ActivationScales::Q8K, true, true),
            (GgmlType::Iq4Nl, ActivationScales::Q8_0, false, true),
            (GgmlType::Iq4Xs, ActivationScales::Q8K, false, true),
            (GgmlType::Mxfp4, ActivationScales::Q8_0, false, true),
        ] {
            assert_eq!(scales, ty.activation_scales(), "{ty:?}");
            for (dp4a, in_grid) in [(true, dp4a_grid), (false, scaled_grid)] {
                let want = scales as i32 | if in_grid { grid } else { 0 };
                let form = PreparedForm::of(ty, dp4a);
                assert_eq!(form.raw(), want, "{ty:?}, dp4a {dp4a}");
                assert_eq!(form.whole_super_blocks(), scales == ActivationScales::Q8K);
            }
        }
    }
}
