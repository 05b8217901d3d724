//! Tensor storage formats: the ggml types, their block layouts, conversion of
//! rows to f32 and dot products of rows with activations.
//!
//! Every format has a scalar reference implementation (`float`, `legacy`,
//! `kquants`, `lookup`), always built and tested. On x86-64 the `x86` module adds AVX2
//! and AVX-512 (VNNI) dot products, chosen at run time by [`Kernels::best`].
//!
//! Which path computes what:
//! - F32, F16, BF16 weights: f32 activations, products and sums in f32.
//! - Quantized weights: activations quantized to 8 bits in blocks of 32
//!   ([`q8`]), integer dot products per block, one f32 scale per block. This
//!   is what llama.cpp's CPU backend does; the rounding of activations moves
//!   a dot by at most Σ_blocks (amax_block / 254) · Σ|w| over the block
//!   ([`q8::dot_error_bound`]), about 0.1–0.5% of Σ|w·x| in practice.
//! - Dequantization (`dequantize`) is bit-exact with ggml's definitions.

mod float;
pub mod interleaved;
mod kquants;
mod legacy;
mod lookup;
pub mod pair_timing;
pub mod panel;
pub mod q8;
mod types;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use float::{exp, gelu_tanh, sigmoid, silu};
pub use interleaved::{
    interleave, interleave_groups, interleaved_group_bytes, InterleavedKernels, INTERLEAVED_ROWS,
};
pub use panel::{
    GemmKernels, PairProduct, Panel, PanelHalf, PanelOut, PanelProduct, GEMM_MIN_TOKENS, PANEL_ROWS,
};
pub(crate) use q8::Q8_BLOCK;
pub use q8::{quantize_row_q8, quantize_row_q8_k, round_scales, ActivationScales, Q8Block};
pub use types::GgmlType;

/// The f16 at byte `at` of a block, as f32.
fn f16_at(block: &[u8], at: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([block[at], block[at + 1]])).to_f32()
}

/// Tokens a multi-token dot ([`Q8Dot4Fn`]) takes at once.
pub const DOT_TOKENS: usize = 4;

/// A quantized row dotted with one token's Q8 activations.
pub type Q8DotFn = fn(&[u8], &[Q8Block]) -> f32;
/// A quantized row dotted with four tokens' activations: the row is
/// unpacked once for all four (prefill).
pub type Q8Dot4Fn = fn(&[u8], [&[Q8Block]; DOT_TOKENS]) -> [f32; DOT_TOKENS];

/// Consecutive quantized rows (`row_bytes` each) dotted with one token's Q8
/// activations: `out[r]` = row r · act (decode: one call per band of rows
/// rather than per row).
pub type Q8RowsFn = fn(&[u8], usize, &[Q8Block], &mut [f32]);

/// A dot product of one weight row (its raw bytes) with activations.
#[derive(Clone, Copy)]
pub enum DotKernel {
    /// Float weights: the activations as f32.
    F32(fn(&[u8], &[f32]) -> f32),
    /// Quantized weights: the activations as Q8 blocks of 32; the
    /// multi-token form where the instruction set has one.
    Q8(Q8DotFn, Option<Q8Dot4Fn>),
}

/// Attention's products over F16 rows of a cache, row j starting at byte
/// j · stride, for the G query heads that share a KV head at once (each row
/// converted once for all of them):
/// - `dots(rows, stride, q, dk, out)`: `out[g · n + j]` = row j · query g,
///   for the G = q.len() / dk queries of q and n = out.len() / G rows;
/// - `axpys(rows, stride, a, n, y)`: y_g += Σ_j a[g · n + j] · row j, for
///   the G = a.len() / n weight vectors and y's G equal parts y_g;
/// - `softmax(scores, scale)`: scores[i] = e^(scale · scores[i] − max),
///   returning (max, Σ).
#[derive(Clone, Copy)]
pub struct AttentionKernels {
    pub dots: fn(&[u8], usize, &[f32], usize, &mut [f32]),
    pub axpys: fn(&[u8], usize, &[f32], usize, &mut [f32]),
    pub softmax: fn(&mut [f32], f32) -> (f32, f32),
}

/// Gated activations, `out[i] = act(gate[i]) · up[i]`: `swiglu` with SiLU,
/// `geglu` with tanh-GELU; `swiglu_oai` is gpt-oss's clamped SwiGLU
/// (`float::swiglu_oai_value`). Every instruction set's build gives the
/// same bits (each element is computed on its own, in the same operations).
#[derive(Clone, Copy)]
pub struct GluKernels {
    pub swiglu: fn(&mut [f32], &[f32], &[f32]),
    pub geglu: fn(&mut [f32], &[f32], &[f32]),
    pub swiglu_oai: fn(&mut [f32], &[f32], &[f32]),
}

/// Converts a row of whole blocks to f32 (bit-exact with ggml).
pub type DequantizeFn = fn(&[u8], &mut [f32]);

/// The code for one format.
#[derive(Clone, Copy)]
pub struct FormatKernels {
    pub dequantize: DequantizeFn,
    pub dot: DotKernel,
}

/// An instruction set the dot products can be built for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// Portable Rust: the reference.
    Scalar,
    /// AVX2 + FMA + F16C.
    Avx2,
    /// AVX-512 F/BW/VL with VNNI: 512-bit float dots; integer dots with
    /// `vpdpbusd` at 256-bit width for one token (eight interleaved rows
    /// match the 32-value blocks), and at 512-bit width for panel products
    /// (two panels, sixteen rows), where each broadcast token and each
    /// sub-block's scaling then serve twice the rows.
    Avx512,
    /// AVX-512 with AMX-INT8 tiles (Intel Xeon from Sapphire Rapids on):
    /// as [`Isa::Avx512`], but a pair of panels meets sixteen tokens a
    /// `tdpbsud` in prompt and batch products, with the same results bit
    /// for bit.
    Amx,
}

impl Isa {
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Amx => "amx",
        }
    }

    /// Whether this CPU runs code built for `self`.
    pub fn is_available(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => x86::avx2_available(),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => x86::avx512_available(),
            #[cfg(target_arch = "x86_64")]
            Isa::Amx => x86::amx_available(),
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// Every instruction set this CPU runs, the reference first (asking
    /// the OS for AMX tiles where the CPU has them).
    pub fn all_available() -> Vec<Isa> {
        [Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Amx]
            .into_iter()
            .filter(|isa| isa.is_available())
            .collect()
    }
}

/// The kernels of one instruction set.
#[derive(Clone, Copy, Debug)]
pub struct Kernels {
    isa: Isa,
}

impl Kernels {
    /// The fastest kernels this CPU runs, or where `M40_CPU_ISA` names an
    /// instruction set (`scalar`, `avx2`, `avx512`, `amx`), the fastest of
    /// those up to it, to compare them in one run. AMX tiles only where
    /// `M40_CPU_ISA=amx` asks for them: their pair product alone can beat
    /// AVX-512 VNNI's, which gives the same results bit for bit, but whole
    /// prompts on Xeon hosts with AMX ran faster on VNNI, on two threads in
    /// 11 rounds of 12 (docs/cpu.md, "AMX tiles").
    pub fn best() -> Kernels {
        static BEST: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
        let isa = *BEST.get_or_init(|| {
            let cap = std::env::var("M40_CPU_ISA").ok();
            // AMX is not even asked of the OS (`arch_prctl`) unless named.
            let candidates = [Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Amx]
                .into_iter()
                .filter(|&isa| isa != Isa::Amx || cap.as_deref() == Some("amx"));
            let mut isas: Vec<Isa> = candidates.filter(|isa| isa.is_available()).collect();
            if let Some(at) = cap.and_then(|name| isas.iter().position(|i| i.name() == name)) {
                isas.truncate(at + 1);
            }
            *isas.last().unwrap_or(&Isa::Scalar)
        });
        Kernels { isa }
    }

    /// The kernels of `isa`, if this CPU runs them.
    pub fn for_isa(isa: Isa) -> Option<Kernels> {
        isa.is_available().then_some(Kernels { isa })
    }

    pub fn isa(self) -> Isa {
        self.isa
    }

    /// Attention's kernels over an F16 cache.
    pub fn attention(self) -> AttentionKernels {
        match self.isa {
            #[cfg(target_arch = "x86_64")]
            // `is_available` was checked when this `Kernels` was made.
            Isa::Avx2 => x86::avx2_attention(),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 | Isa::Amx => x86::avx512_attention(),
            _ => AttentionKernels {
                dots: float::f16_dots_many,
                axpys: float::f16_axpys_many,
                softmax: float::softmax,
            },
        }
    }

    /// The gated activations, vectorized for this instruction set (a
    /// prompt's are millions of values).
    pub fn glu(self) -> GluKernels {
        match self.isa {
            #[cfg(target_arch = "x86_64")]
            // `is_available` was checked when this `Kernels` was made.
            Isa::Avx2 => x86::avx2_glu(),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 | Isa::Amx => x86::avx512_glu(),
            _ => GluKernels {
                swiglu: float::swiglu,
                geglu: float::geglu,
                swiglu_oai: float::swiglu_oai,
            },
        }
    }

    /// The quantizer of activations for the Q8 dots: `quantize_row_q8` in
    /// this instruction set, with identical results.
    pub fn quantizer(self) -> fn(&[f32], &mut [Q8Block]) {
        match self.isa {
            #[cfg(target_arch = "x86_64")]
            // `is_available` was checked when this `Kernels` was made.
            Isa::Avx2 | Isa::Avx512 | Isa::Amx => x86::avx2_quantize,
            _ => quantize_row_q8,
        }
    }

    /// The quantizer of activations into Q8_K's scales
    /// (`quantize_row_q8_k`) in this instruction set, with identical
    /// results.
    pub fn q8_k_quantizer(self) -> fn(&[f32], &mut [Q8Block]) {
        match self.isa {
            #[cfg(target_arch = "x86_64")]
            // `is_available` was checked when this `Kernels` was made.
            Isa::Avx2 | Isa::Avx512 | Isa::Amx => x86::avx2_quantize_q8_k,
            _ => quantize_row_q8_k,
        }
    }

    /// The one-token dot of `ty` over many rows, where this instruction set
    /// has it.
    pub fn dot_rows(self, ty: GgmlType) -> Option<Q8RowsFn> {
        match self.isa {
            #[cfg(target_arch = "x86_64")]
            // `is_available` was checked when this `Kernels` was made.
            Isa::Avx2 => x86::avx2_dot_rows(ty),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 | Isa::Amx => x86::avx512_dot_rows(ty),
            _ => None,
        }
    }

    /// The code for `ty` matrices stored interleaved
    /// ([`interleave`]), where this instruction set has it.
    pub fn interleaved(self, ty: GgmlType) -> Option<InterleavedKernels> {
        match self.isa {
            #[cfg(target_arch = "x86_64")]
            // `is_available` was checked when this `Kernels` was made.
            Isa::Avx2 => x86::avx2_interleaved(ty),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => x86::avx512_interleaved(ty),
            #[cfg(target_arch = "x86_64")]
            Isa::Amx => x86::amx_interleaved(ty),
            _ => None,
        }
    }

    /// The panel code for `ty` (products with many tokens), where this
    /// instruction set has it.
    pub fn gemm(self, ty: GgmlType) -> Option<GemmKernels> {
        match self.isa {
            #[cfg(target_arch = "x86_64")]
            // `is_available` was checked when this `Kernels` was made.
            Isa::Avx2 => x86::avx2_gemm(ty),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => x86::avx512_gemm(ty),
            #[cfg(target_arch = "x86_64")]
            Isa::Amx => x86::amx_gemm(ty),
            _ => None,
        }
    }

    /// The code for `ty`; `None` for types this build does not compute with.
    pub fn format(self, ty: GgmlType) -> Option<FormatKernels> {
        let dequantize = dequantizer(ty)?;
        let dot = match self.isa {
            Isa::Scalar => scalar_dot(ty)?,
            #[cfg(target_arch = "x86_64")]
            // `is_available` was checked when this `Kernels` was made.
            Isa::Avx2 => x86::avx2_dot(ty).or_else(|| scalar_dot(ty))?,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 | Isa::Amx => x86::avx512_dot(ty).or_else(|| scalar_dot(ty))?,
            #[cfg(not(target_arch = "x86_64"))]
            _ => scalar_dot(ty)?,
        };
        Some(FormatKernels { dequantize, dot })
    }
}

fn dequantizer(ty: GgmlType) -> Option<DequantizeFn> {
    use GgmlType::*;
    Some(match ty {
        F32 => float::dequantize_f32,
        F16 => float::dequantize_f16,
        Bf16 => float::dequantize_bf16,
        Q4_0 => legacy::dequantize_q4_0,
        Q4_1 => legacy::dequantize_q4_1,
        Q5_0 => legacy::dequantize_q5_0,
        Q5_1 => legacy::dequantize_q5_1,
        Q8_0 => legacy::dequantize_q8_0,
        Q2K => kquants::dequantize_q2_k,
        Q3K => kquants::dequantize_q3_k,
        Q4K => kquants::dequantize_q4_k,
        Q5K => kquants::dequantize_q5_k,
        Q6K => kquants::dequantize_q6_k,
        Iq4Nl => lookup::dequantize_iq4_nl,
        Iq4Xs => lookup::dequantize_iq4_xs,
        Mxfp4 => lookup::dequantize_mxfp4,
        _ => return None,
    })
}

fn scalar_dot(ty: GgmlType) -> Option<DotKernel> {
    use DotKernel::{F32 as Float, Q8};
    use GgmlType::*;
    Some(match ty {
        F32 => Float(float::dot_f32),
        F16 => Float(float::dot_f16),
        Bf16 => Float(float::dot_bf16),
        Q4_0 => Q8(legacy::dot_q4_0, None),
        Q4_1 => Q8(legacy::dot_q4_1, None),
        Q5_0 => Q8(legacy::dot_q5_0, None),
        Q5_1 => Q8(legacy::dot_q5_1, None),
        Q8_0 => Q8(legacy::dot_q8_0, None),
        Q2K => Q8(kquants::dot_q2_k, None),
        Q3K => Q8(kquants::dot_q3_k, None),
        Q4K => Q8(kquants::dot_q4_k, None),
        Q5K => Q8(kquants::dot_q5_k, None),
        Q6K => Q8(kquants::dot_q6_k, None),
        Iq4Nl => Q8(lookup::dot_iq4_nl, None),
        Iq4Xs => Q8(lookup::dot_iq4_xs, None),
        Mxfp4 => Q8(lookup::dot_mxfp4, None),
        _ => return None,
    })
}

/// Converts a row of `ty` (whole blocks) to f32, bit-exact with ggml.
/// Panics for a type this build does not compute with (the loader rejects
/// those) or when `out` does not hold the row's values.
pub fn dequantize_row(ty: GgmlType, row: &[u8], out: &mut [f32]) {
    let n_blocks = row.len() as u64 / ty.block_bytes();
    assert_eq!(
        out.len() as u64,
        n_blocks * ty.block_elements(),
        "{ty} row of {} bytes",
        row.len()
    );
    dequantizer(ty).unwrap_or_else(|| panic!("no dequantizer for {ty}"))(row, out);
}
