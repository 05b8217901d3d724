//! x86-64 SIMD dot products, chosen at run time.
//!
//! Each kernel is written once, generic over [`IntDot`] (how 32 unsigned
//! weight codes meet 32 signed activations), and compiled twice: for AVX2
//! (`vpmaddubsw` + `vpmaddwd`) and for AVX-512 VNNI (`vpdpbusd`). Both group
//! the products the same way (lane k sums bytes 4k..4k+4), so the two builds
//! give identical integer sums. The panel and interleaved products are
//! generic over `CodeDot`, which adds a third build for AVX2 of the codes
//! past 127 (`Avx2SignedCodes`), with the same integer sums again.

mod amx;
mod float_dot;
mod gemm;
mod int_dot;
mod quantize;

use super::interleaved::InterleavedKernels;
use super::panel::{GemmKernels, PairProduct, Panel, PanelHalf, PanelOut};
use super::{
    float, AttentionKernels, DotKernel, GgmlType, GluKernels, Q8Block, Q8RowsFn, DOT_TOKENS,
};

/// Prefetches every cache line of the `len` bytes at `p`, the last one
/// included where `p` is not line-aligned. Prefetching never faults, so the
/// bytes may lie past the end of what `p` points into.
#[inline(always)]
unsafe fn prefetch_lines(p: *const u8, len: usize) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    for line in (0..len).step_by(64) {
        _mm_prefetch(p.wrapping_add(line).cast(), _MM_HINT_T0);
    }
    if len > 0 {
        _mm_prefetch(p.wrapping_add(len - 1).cast(), _MM_HINT_T0);
    }
}

pub fn avx2_available() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

pub use amx::available as amx_available;

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
// this module's `avx2_*`, `avx512_*` and `amx_*` tables (dots, many-row dots,
// panels, interleaved copies, attention, gated activations), which `Kernels`
// calls only for a `Kernels` whose instruction set `Isa::is_available`
// confirmed on this CPU.
// The kernels read only inside the slices they are given.

/// Safe wrappers of `int_dot::$int`'s kernels (see the SAFETY note above).
macro_rules! q8_wrappers {
    ($int:ident; $($name:ident / $many:ident / $rows:ident),*) => {$(
        pub fn $rows(rows: &[u8], row_bytes: usize, act: &[Q8Block], out: &mut [f32]) {
            // SAFETY: only handed out when the CPU has the features (see above).
            unsafe { int_dot::$int::$rows(rows, row_bytes, act, out) }
        }
        pub fn $name(row: &[u8], act: &[Q8Block]) -> f32 {
            // SAFETY: only handed out when the CPU has the features (see above).
            unsafe { int_dot::$int::$name(row, act) }
        }
        pub fn $many(row: &[u8], acts: [&[Q8Block]; DOT_TOKENS]) -> [f32; DOT_TOKENS] {
            // SAFETY: as above.
            unsafe { int_dot::$int::$many(row, acts) }
        }
    )*};
}

/// Safe wrappers of `float_dot::$float`'s kernels (see the SAFETY note above).
macro_rules! f32_wrappers {
    ($float:ident; $($name:ident),*) => {$(
        pub fn $name(row: &[u8], x: &[f32]) -> f32 {
            // SAFETY: only handed out when the CPU has the features (see above).
            unsafe { float_dot::$float::$name(row, x) }
        }
    )*};
}

/// Safe wrappers of `float_dot::$float`'s attention kernels (see the SAFETY note above).
macro_rules! attention_wrappers {
    ($float:ident) => {
        pub fn f16_dots_many(rows: &[u8], stride: usize, q: &[f32], dk: usize, out: &mut [f32]) {
            // SAFETY: only handed out when the CPU has the features (see above).
            unsafe { float_dot::$float::f16_dots_many(rows, stride, q, dk, out) }
        }
        pub fn f16_axpys_many(rows: &[u8], stride: usize, a: &[f32], n: usize, y: &mut [f32]) {
            // SAFETY: as above.
            unsafe { float_dot::$float::f16_axpys_many(rows, stride, a, n, y) }
        }
        pub fn softmax(scores: &mut [f32], scale: f32) -> (f32, f32) {
            // SAFETY: as above.
            unsafe { float_dot::$float::softmax(scores, scale) }
        }
    };
}

/// The gated activations of `crate::quant::float`, built with `$features`
/// (see the SAFETY note above): the same element-wise code, vectorized at
/// the instruction set's width.
macro_rules! glu_kernels {
    ($features:literal) => {
        pub fn swiglu(out: &mut [f32], gate: &[f32], up: &[f32]) {
            #[target_feature(enable = $features)]
            unsafe fn inner(out: &mut [f32], gate: &[f32], up: &[f32]) {
                float::gated(out, gate, up, float::silu)
            }
            // SAFETY: only handed out when the CPU has the features.
            unsafe { inner(out, gate, up) }
        }
        pub fn geglu(out: &mut [f32], gate: &[f32], up: &[f32]) {
            #[target_feature(enable = $features)]
            unsafe fn inner(out: &mut [f32], gate: &[f32], up: &[f32]) {
                float::gated(out, gate, up, float::gelu_tanh)
            }
            // SAFETY: as above.
            unsafe { inner(out, gate, up) }
        }
        pub fn swiglu_oai(out: &mut [f32], gate: &[f32], up: &[f32]) {
            #[target_feature(enable = $features)]
            unsafe fn inner(out: &mut [f32], gate: &[f32], up: &[f32]) {
                float::gated_pairs(out, gate, up, float::swiglu_oai_value)
            }
            // SAFETY: as above.
            unsafe { inner(out, gate, up) }
        }
    };
}

/// Safe wrappers of the panel packers (see the SAFETY note above). They
/// need AVX2 alone, so both instruction sets share them.
mod packers {
    use super::gemm::{self, *};
    use super::PanelHalf;

    macro_rules! packers {
        ($($name:ident: $format:ty),*) => {$(
            pub fn $name(rows: &[u8], row_bytes: usize, panel: PanelHalf<'_>) {
                #[target_feature(enable = "avx2,fma,f16c")]
                unsafe fn inner(rows: &[u8], row_bytes: usize, panel: PanelHalf<'_>) {
                    gemm::pack::<$format>(rows, row_bytes, panel)
                }
                // SAFETY: only handed out when the CPU has the features.
                unsafe { inner(rows, row_bytes, panel) }
            }
        )*};
    }
    packers!(q4_0: Q4_0, q4_1: Q4_1, q5_0: Q5_0, q5_1: Q5_1, q8_0: Q8_0,
        q2_k: Q2K, q3_k: Q3K, q4_k: Q4K, q5_k: Q5K, q6_k: Q6K,
        iq4_nl: Iq4Nl, iq4_xs: Iq4Xs, mxfp4: Mxfp4);
}

/// Safe wrappers of the panel products with `$dot` (see the SAFETY note
/// above), `$max` tokens a tile.
macro_rules! panel_products {
    ($dot:ty, $features:literal, $max:literal; $($name:ident: $sub:literal),*) => {$(
        pub fn $name(panel: &Panel, acts: &[Q8Block], out: PanelOut) {
            #[target_feature(enable = $features)]
            unsafe fn inner(panel: &Panel, acts: &[Q8Block], out: PanelOut) {
                gemm::product::<$dot, $sub, $max>(panel, acts, out)
            }
            // SAFETY: only handed out when the CPU has the features.
            unsafe { inner(panel, acts, out) }
        }
    )*};
}

/// Safe wrappers of every interleaved layout's kernels for one instruction
/// set (see the SAFETY note above): `$narrow` takes the codes up to 127,
/// `$wide` those stored as value + 128 (Q8_0, IQ4_NL, IQ4_XS).
macro_rules! interleaved_wrappers {
    ($narrow:ty, $wide:ty, $features:literal) => {
        interleaved_wrappers!(@each $features;
            $narrow: q4_0_interleaved_rows / q4_0_interleaved_pack:
                interleaved_block32_rows / pack_interleaved_block32 for gemm::Q4_0x8,
            $narrow: q4_1_interleaved_rows / q4_1_interleaved_pack:
                interleaved_block32_rows / pack_interleaved_block32 for gemm::Q4_1x8,
            $narrow: q5_0_interleaved_rows / q5_0_interleaved_pack:
                interleaved_block32_rows / pack_interleaved_block32 for gemm::Q5_0x8,
            $narrow: mxfp4_interleaved_rows / mxfp4_interleaved_pack:
                interleaved_block32_rows / pack_interleaved_block32 for gemm::Mxfp4X8,
            $narrow: q4_k_interleaved_rows / q4_k_interleaved_pack:
                interleaved_q4_k_rows / pack_interleaved_q4_k,
            $narrow: q6_k_interleaved_rows / q6_k_interleaved_pack:
                interleaved_q6_k_rows / pack_interleaved_q6_k,
            $wide: q8_0_interleaved_rows / q8_0_interleaved_pack:
                interleaved_block32_rows / pack_interleaved_block32 for gemm::Q8_0x8,
            $wide: iq4_nl_interleaved_rows / iq4_nl_interleaved_pack:
                interleaved_block32_rows / pack_interleaved_block32 for gemm::Iq4NlX8,
            $wide: iq4_xs_interleaved_rows / iq4_xs_interleaved_pack:
                interleaved_iq4_xs_rows / pack_interleaved_iq4_xs);
    };
    (@each $features:literal;
     $($dot:ty: $dot_rows:ident / $pack:ident: $kernel:ident / $packer:ident $(for $layout:ty)?),*
    ) => {$(
        pub fn $dot_rows(data: &[u8], cols: usize, act: &[Q8Block], out: &mut [f32]) {
            #[target_feature(enable = $features)]
            unsafe fn inner(data: &[u8], cols: usize, act: &[Q8Block], out: &mut [f32]) {
                gemm::$kernel::<$dot $(, $layout)?>(data, cols, act, out)
            }
            // SAFETY: only handed out when the CPU has the features.
            unsafe { inner(data, cols, act, out) }
        }
        pub fn $pack(group: &[u8], panel: PanelHalf<'_>) {
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn inner(group: &[u8], panel: PanelHalf<'_>) {
                gemm::$packer$(::<$layout>)?(group, panel)
            }
            // SAFETY: as above.
            unsafe { inner(group, panel) }
        }
    )*};
}

mod avx2 {
    use super::*;
    use int_dot::{Avx2Dot, Avx2SignedCodes};
    panel_products!(Avx2Dot, "avx2,fma,f16c", 4; product_by16: 16, product_by32: 32);
    // The panel product of the codes stored as value + 128.
    panel_products!(Avx2SignedCodes, "avx2,fma,f16c", 4; wide_product_by32: 32);

    /// 256-bit vectors hold one panel's rows: no pair product.
    pub fn pair(_sub: usize) -> Option<PairProduct> {
        None
    }
    interleaved_wrappers!(Avx2Dot, Avx2SignedCodes, "avx2,fma,f16c");
    q8_wrappers!(avx2; q4_0 / q4_0_x4 / q4_0_rows, q4_1 / q4_1_x4 / q4_1_rows,
        q5_0 / q5_0_x4 / q5_0_rows, q5_1 / q5_1_x4 / q5_1_rows, q8_0 / q8_0_x4 / q8_0_rows,
        q2_k / q2_k_x4 / q2_k_rows, q3_k / q3_k_x4 / q3_k_rows, q4_k / q4_k_x4 / q4_k_rows,
        q5_k / q5_k_x4 / q5_k_rows, q6_k / q6_k_x4 / q6_k_rows,
        iq4_nl / iq4_nl_x4 / iq4_nl_rows, iq4_xs / iq4_xs_x4 / iq4_xs_rows,
        mxfp4 / mxfp4_x4 / mxfp4_rows);
    f32_wrappers!(avx2; f32, f16, bf16);
    attention_wrappers!(avx2);
    glu_kernels!("avx2,fma,f16c");
}

mod avx512 {
    use super::*;
    use int_dot::VnniDot;
    panel_products!(VnniDot, "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni", 8;
        product_by16: 16, product_by32: 32);
    // `vpdpbusd` takes unsigned codes up to 255 as they are.
    pub use self::product_by32 as wide_product_by32;

    /// The pair product for sub-blocks of `sub` columns.
    pub fn pair(sub: usize) -> Option<PairProduct> {
        fn by16(pair: &Panel, acts: &[Q8Block], out: PanelOut) {
            #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
            unsafe fn inner(pair: &Panel, acts: &[Q8Block], out: PanelOut) {
                gemm::product_pair::<16, 8>(pair, acts, out)
            }
            // SAFETY: only handed out when the CPU has the features.
            unsafe { inner(pair, acts, out) }
        }
        fn by32(pair: &Panel, acts: &[Q8Block], out: PanelOut) {
            #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
            unsafe fn inner(pair: &Panel, acts: &[Q8Block], out: PanelOut) {
                gemm::product_pair::<32, 8>(pair, acts, out)
            }
            // SAFETY: as above.
            unsafe { inner(pair, acts, out) }
        }
        Some(if sub == 16 { by16 } else { by32 })
    }
    interleaved_wrappers!(
        VnniDot,
        VnniDot,
        "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"
    );
    q8_wrappers!(vnni; q4_0 / q4_0_x4 / q4_0_rows, q4_1 / q4_1_x4 / q4_1_rows,
        q5_0 / q5_0_x4 / q5_0_rows, q5_1 / q5_1_x4 / q5_1_rows, q8_0 / q8_0_x4 / q8_0_rows,
        q2_k / q2_k_x4 / q2_k_rows, q3_k / q3_k_x4 / q3_k_rows, q4_k / q4_k_x4 / q4_k_rows,
        q5_k / q5_k_x4 / q5_k_rows, q6_k / q6_k_x4 / q6_k_rows,
        iq4_nl / iq4_nl_x4 / iq4_nl_rows, iq4_xs / iq4_xs_x4 / iq4_xs_rows,
        mxfp4 / mxfp4_x4 / mxfp4_rows);
    f32_wrappers!(avx512; f32, f16, bf16);
    attention_wrappers!(avx512);
    glu_kernels!("avx2,fma,f16c,avx512f,avx512bw");
}

macro_rules! table {
    ($module:ident, $ty:expr) => {{
        use DotKernel::{F32 as Float, Q8};
        use GgmlType::*;
        Some(match $ty {
            F32 => Float($module::f32),
            F16 => Float($module::f16),
            Bf16 => Float($module::bf16),
            Q4_0 => Q8($module::q4_0, Some($module::q4_0_x4)),
            Q4_1 => Q8($module::q4_1, Some($module::q4_1_x4)),
            Q5_0 => Q8($module::q5_0, Some($module::q5_0_x4)),
            Q5_1 => Q8($module::q5_1, Some($module::q5_1_x4)),
            Q8_0 => Q8($module::q8_0, Some($module::q8_0_x4)),
            Q2K => Q8($module::q2_k, Some($module::q2_k_x4)),
            Q3K => Q8($module::q3_k, Some($module::q3_k_x4)),
            Q4K => Q8($module::q4_k, Some($module::q4_k_x4)),
            Q5K => Q8($module::q5_k, Some($module::q5_k_x4)),
            Q6K => Q8($module::q6_k, Some($module::q6_k_x4)),
            Iq4Nl => Q8($module::iq4_nl, Some($module::iq4_nl_x4)),
            Iq4Xs => Q8($module::iq4_xs, Some($module::iq4_xs_x4)),
            Mxfp4 => Q8($module::mxfp4, Some($module::mxfp4_x4)),
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

// The one-panel product of `$module` for sub-blocks of `$sub` columns.
macro_rules! product_for {
    ($module:ident, $sub:expr) => {
        if $sub == 16 {
            $module::product_by16
        } else {
            $module::product_by32
        }
    };
}

// The formats whose codes pass 127 (Q8_0, IQ4_NL, IQ4_XS: value + 128) take
// `$module::wide_product_by32`: on AVX2 not `vpmaddubsw`'s, which saturates.
macro_rules! gemm_table {
    ($module:ident, $ty:expr) => {{
        use GgmlType::*;
        let p = |sub: usize, pack: fn(&[u8], usize, PanelHalf<'_>)| {
            let product = product_for!($module, sub);
            Some(GemmKernels {
                sub,
                pack,
                product,
                pair: $module::pair(sub),
            })
        };
        let wide = |pack| {
            let product = $module::wide_product_by32;
            p(32, pack).map(|k| GemmKernels { product, ..k })
        };
        match $ty {
            Q4_0 => p(32, packers::q4_0),
            Q4_1 => p(32, packers::q4_1),
            Q5_0 => p(32, packers::q5_0),
            Q5_1 => p(32, packers::q5_1),
            Q8_0 => wide(packers::q8_0),
            Iq4Nl => wide(packers::iq4_nl),
            Iq4Xs => wide(packers::iq4_xs),
            Q2K => p(16, packers::q2_k),
            Q3K => p(16, packers::q3_k),
            Q4K => p(32, packers::q4_k),
            Q5K => p(32, packers::q5_k),
            Q6K => p(16, packers::q6_k),
            Mxfp4 => p(32, packers::mxfp4),
            _ => None,
        }
    }};
}

macro_rules! rows_table {
    ($module:ident, $ty:expr) => {{
        use GgmlType::*;
        Some(match $ty {
            Q4_0 => $module::q4_0_rows,
            Q4_1 => $module::q4_1_rows,
            Q5_0 => $module::q5_0_rows,
            Q5_1 => $module::q5_1_rows,
            Q8_0 => $module::q8_0_rows,
            Q2K => $module::q2_k_rows,
            Q3K => $module::q3_k_rows,
            Q4K => $module::q4_k_rows,
            Q5K => $module::q5_k_rows,
            Q6K => $module::q6_k_rows,
            Iq4Nl => $module::iq4_nl_rows,
            Iq4Xs => $module::iq4_xs_rows,
            Mxfp4 => $module::mxfp4_rows,
            _ => return None,
        })
    }};
}

/// The AVX2 many-row dot for `ty`. Call only after `avx2_available()`.
pub fn avx2_dot_rows(ty: GgmlType) -> Option<Q8RowsFn> {
    rows_table!(avx2, ty)
}

/// The AVX-512 many-row dot for `ty`. Call only after `avx512_available()`.
pub fn avx512_dot_rows(ty: GgmlType) -> Option<Q8RowsFn> {
    rows_table!(avx512, ty)
}

// The layouts whose codes pass 127 take `$module::wide_product_by32`, as in
// `gemm_table!`.
macro_rules! interleaved_table {
    ($module:ident, $ty:expr) => {{
        use $module::*;
        use GgmlType::*;
        type DotRows = fn(&[u8], usize, &[Q8Block], &mut [f32]);
        let k = |sub: usize, dot_rows: DotRows, pack: fn(&[u8], PanelHalf<'_>)| {
            let product = product_for!($module, sub);
            Some(InterleavedKernels {
                sub,
                dot_rows,
                pack,
                product,
                pair: pair(sub),
            })
        };
        let wide = |dot_rows, pack| {
            let product = wide_product_by32;
            k(32, dot_rows, pack).map(|k| InterleavedKernels { product, ..k })
        };
        match $ty {
            Q8_0 => wide(q8_0_interleaved_rows, q8_0_interleaved_pack),
            Iq4Nl => wide(iq4_nl_interleaved_rows, iq4_nl_interleaved_pack),
            Iq4Xs => wide(iq4_xs_interleaved_rows, iq4_xs_interleaved_pack),
            Q4_0 => k(32, q4_0_interleaved_rows, q4_0_interleaved_pack),
            Q4_1 => k(32, q4_1_interleaved_rows, q4_1_interleaved_pack),
            Q5_0 => k(32, q5_0_interleaved_rows, q5_0_interleaved_pack),
            Mxfp4 => k(32, mxfp4_interleaved_rows, mxfp4_interleaved_pack),
            Q4K => k(32, q4_k_interleaved_rows, q4_k_interleaved_pack),
            Q6K => k(16, q6_k_interleaved_rows, q6_k_interleaved_pack),
            _ => None,
        }
    }};
}

/// The AVX2 code for interleaved `ty` matrices (those of Q8_0, IQ4_NL and
/// IQ4_XS, whose codes pass 127, through `Avx2SignedCodes`). Call only
/// after `avx2_available()`.
pub fn avx2_interleaved(ty: GgmlType) -> Option<InterleavedKernels> {
    interleaved_table!(avx2, ty)
}

/// The AVX-512 code for interleaved `ty` matrices. Call only after
/// `avx512_available()`.
pub fn avx512_interleaved(ty: GgmlType) -> Option<InterleavedKernels> {
    interleaved_table!(avx512, ty)
}

/// The AVX2 panel code for `ty`: Q8_0's, IQ4_NL's and IQ4_XS's codes
/// (up to 255 and 241, which `vpmaddubsw` would saturate in pairs times
/// 127) through `Avx2SignedCodes`. Call only after `avx2_available()`.
pub fn avx2_gemm(ty: GgmlType) -> Option<GemmKernels> {
    gemm_table!(avx2, ty)
}

/// The AVX-512 panel code for `ty`. Call only after `avx512_available()`.
pub fn avx512_gemm(ty: GgmlType) -> Option<GemmKernels> {
    gemm_table!(avx512, ty)
}

/// The AMX pair product for sub-blocks of `sub` columns (see the SAFETY
/// note above: handed out only where `amx_available()`).
fn amx_pair(sub: usize) -> PairProduct {
    fn by16(pair: &Panel, acts: &[Q8Block], out: PanelOut) {
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        unsafe fn inner(pair: &Panel, acts: &[Q8Block], out: PanelOut) {
            amx::product_pair::<16>(pair, acts, out)
        }
        // SAFETY: only handed out when the CPU has the features.
        unsafe { inner(pair, acts, out) }
    }
    fn by32(pair: &Panel, acts: &[Q8Block], out: PanelOut) {
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        unsafe fn inner(pair: &Panel, acts: &[Q8Block], out: PanelOut) {
            amx::product_pair::<32>(pair, acts, out)
        }
        // SAFETY: as above.
        unsafe { inner(pair, acts, out) }
    }
    if sub == 16 {
        by16
    } else {
        by32
    }
}

/// The AVX-512 panel code for `ty` with AMX pair products. Call only after
/// `amx_available()`.
pub fn amx_gemm(ty: GgmlType) -> Option<GemmKernels> {
    avx512_gemm(ty).map(|k| GemmKernels {
        pair: Some(amx_pair(k.sub)),
        ..k
    })
}

/// The AVX-512 code for interleaved `ty` matrices with AMX pair products.
/// Call only after `amx_available()`.
pub fn amx_interleaved(ty: GgmlType) -> Option<InterleavedKernels> {
    avx512_interleaved(ty).map(|k| InterleavedKernels {
        pair: Some(amx_pair(k.sub)),
        ..k
    })
}

/// The AVX2 activation quantizer. Call only after `avx2_available()`.
pub fn avx2_quantize(x: &[f32], out: &mut [Q8Block]) {
    // SAFETY: only handed out when the CPU has the features (see above).
    unsafe { quantize::quantize_row_q8(x, out) }
}

/// The AVX2 Q8_K activation quantizer. Call only after `avx2_available()`.
pub fn avx2_quantize_q8_k(x: &[f32], out: &mut [Q8Block]) {
    // SAFETY: only handed out when the CPU has the features (see above).
    unsafe { quantize::quantize_row_q8_k(x, out) }
}

/// The AVX2 attention kernels. Call only after `avx2_available()`.
pub fn avx2_attention() -> AttentionKernels {
    AttentionKernels {
        dots: avx2::f16_dots_many,
        axpys: avx2::f16_axpys_many,
        softmax: avx2::softmax,
    }
}

/// The AVX2 gated activations. Call only after `avx2_available()`.
pub fn avx2_glu() -> GluKernels {
    GluKernels {
        swiglu: avx2::swiglu,
        geglu: avx2::geglu,
        swiglu_oai: avx2::swiglu_oai,
    }
}

/// The AVX-512 gated activations. Call only after `avx512_available()`.
pub fn avx512_glu() -> GluKernels {
    GluKernels {
        swiglu: avx512::swiglu,
        geglu: avx512::geglu,
        swiglu_oai: avx512::swiglu_oai,
    }
}

/// The AVX-512 attention kernels. Call only after `avx512_available()`.
pub fn avx512_attention() -> AttentionKernels {
    AttentionKernels {
        dots: avx512::f16_dots_many,
        axpys: avx512::f16_axpys_many,
        softmax: avx512::softmax,
    }
}
