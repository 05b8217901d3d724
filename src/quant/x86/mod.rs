//! x86-64 SIMD dot products, chosen at run time.
//!
//! Each kernel is written once, generic over [`IntDot`] (how 32 unsigned
//! weight codes meet 32 signed activations), and compiled twice: for AVX2
//! (`vpmaddubsw` + `vpmaddwd`) and for AVX-512 VNNI (`vpdpbusd`). Both group
//! the products the same way (lane k sums bytes 4k..4k+4), so the two builds
//! give identical integer sums.

mod float_dot;
mod int_dot;

use super::{DotKernel, GgmlType, Q8Block};

pub fn avx2_available() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

pub fn avx512_available() -> bool {
    avx2_available()
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni")
}

// Safe `fn` pointers over the `unsafe` target-feature kernels.
//
// SAFETY (of every wrapper below): the wrappers are reachable only through
// `avx2_dot` / `avx512_dot`, which `Kernels::format` calls only for a
// `Kernels` whose instruction set `Isa::is_available` confirmed on this CPU.
// The kernels read only inside the slices they are given.

/// AVX2 kernels (safe wrappers; see the SAFETY note above).
mod avx2 {
    use super::*;
    macro_rules! q8 {
        ($($name:ident),*) => {$(
            pub fn $name(row: &[u8], act: &[Q8Block]) -> f32 {
                // SAFETY: only handed out when AVX2 is available (see above).
                unsafe { int_dot::avx2::$name(row, act) }
            }
        )*};
    }
    macro_rules! f32dot {
        ($($name:ident),*) => {$(
            pub fn $name(row: &[u8], x: &[f32]) -> f32 {
                // SAFETY: as above.
                unsafe { float_dot::avx2::$name(row, x) }
            }
        )*};
    }
    q8!(q4_0, q4_1, q5_0, q5_1, q8_0, q2_k, q3_k, q4_k, q5_k, q6_k);
    f32dot!(f32, f16, bf16);
}

/// AVX-512 kernels (safe wrappers; see the SAFETY note above).
mod avx512 {
    use super::*;
    macro_rules! q8 {
        ($($name:ident),*) => {$(
            pub fn $name(row: &[u8], act: &[Q8Block]) -> f32 {
                // SAFETY: only handed out when AVX-512 VNNI is available (see above).
                unsafe { int_dot::vnni::$name(row, act) }
            }
        )*};
    }
    macro_rules! f32dot {
        ($($name:ident),*) => {$(
            pub fn $name(row: &[u8], x: &[f32]) -> f32 {
                // SAFETY: as above.
                unsafe { float_dot::avx512::$name(row, x) }
            }
        )*};
    }
    q8!(q4_0, q4_1, q5_0, q5_1, q8_0, q2_k, q3_k, q4_k, q5_k, q6_k);
    f32dot!(f32, f16, bf16);
}

macro_rules! table {
    ($module:ident, $ty:expr) => {{
        use DotKernel::{F32 as Float, Q8};
        use GgmlType::*;
        Some(match $ty {
            F32 => Float($module::f32),
            F16 => Float($module::f16),
            Bf16 => Float($module::bf16),
            Q4_0 => Q8($module::q4_0),
            Q4_1 => Q8($module::q4_1),
            Q5_0 => Q8($module::q5_0),
            Q5_1 => Q8($module::q5_1),
            Q8_0 => Q8($module::q8_0),
            Q2K => Q8($module::q2_k),
            Q3K => Q8($module::q3_k),
            Q4K => Q8($module::q4_k),
            Q5K => Q8($module::q5_k),
            Q6K => Q8($module::q6_k),
            _ => return None,
        })
    }};
}

/// The AVX2 dot for `ty`. Call only after `avx2_available()`.
pub fn avx2_dot(ty: GgmlType) -> Option<DotKernel> {
    table!(avx2, ty)
}

/// The AVX-512 dot for `ty`. Call only after `avx512_available()`.
pub fn avx512_dot(ty: GgmlType) -> Option<DotKernel> {
    table!(avx512, ty)
}
