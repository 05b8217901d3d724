//! The kernel launchers of `cuda/*.cu`. Each enqueues its kernels on the
//! given stream and returns the launch's CUDA status; pointers are device
//! memory unless stated.

use std::ffi::c_int;

use super::runtime::Stream;
use crate::backend::{Glu, Rope};
use crate::quant::{ActivationScales, GgmlType};

/// One batch row for the KV-cache kernels (`M40Row` in cuda/ops.cuh).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceRow {
    /// Device address of the sequence's keys (f16: each layer's n_ctx
    /// positions in turn, each layer as wide as its heads; see [`KvLayer`]).
    pub keys: u64,
    pub values: u64,
    pub pos: i32,
    pub n_ctx: i32,
    /// Device address of the sequence's recurrent states (a hybrid model's
    /// linear-attention layers, one after another); 0 without.
    pub state: u64,
}

/// Where one attention layer lies in every sequence's cache (`M40KvLayer`
/// in cuda/ops.cuh): its keys start n_ctx × `k_start` values into a
/// sequence's keys, its values n_ctx × `v_start` into its values; the
/// starts are the widths (values a position) of the layers before it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KvLayer {
    pub k_start: c_int,
    pub v_start: c_int,
}

/// Activation rows one `m40_gemv` launch multiplies (M40_GEMV_MAX_X).
pub const GEMV_MAX_X: usize = 8;
/// Most experts a mixture routed by `m40_moe_route` may have, and most a
/// row may use (M40_MOE_MAX_EXPERTS, M40_MOE_MAX_USED in cuda/moe.cu).
pub const MOE_MAX_EXPERTS: usize = 1024;
pub const MOE_MAX_USED: usize = 32;

/// What a `m40_gemv` launch does with each result (M40GemvEpilogue).
#[repr(i32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemvEpilogue {
    Store = 0,
    /// y += result: the residual add.
    Accumulate = 1,
    /// Matrices 0 and 1 are gate and up; y₀ = silu(gate) · up.
    GluSilu = 2,
    /// y₀ = gelu_tanh(gate) · up.
    GluGelu = 3,
    /// y₀ = gpt-oss's clamped SwiGLU of gate and up.
    GluOai = 4,
}

/// One weight matrix of a `m40_gemv` launch (M40GemvMatrix).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct GemvMatrix {
    pub w: *const u8,
    /// `rows` f32, or null.
    pub bias: *const f32,
    /// n_x rows of `rows` values (for keys and values: unused, they go to
    /// the launch's KV cache rows).
    pub y: *mut f32,
    pub rows: c_int,
    pub role: ProjectionRole,
}

impl GemvMatrix {
    pub const NONE: GemvMatrix = GemvMatrix {
        w: std::ptr::null(),
        bias: std::ptr::null(),
        y: std::ptr::null_mut(),
        rows: 0,
        role: ProjectionRole::Plain,
    };
}

/// What a decode product's rows are (M40ProjectionRole in cuda/ops.cuh):
/// plain outputs, or a layer's query, key or value projection, which the
/// product's epilogue turns into attention's inputs (RoPE, the KV store).
#[repr(i32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProjectionRole {
    Plain = 0,
    Queries = 1,
    Keys = 2,
    Values = 3,
}

/// A `m40_gemv` launch (M40Gemv in cuda/gemv.cu): one to three matrices of
/// one type and width times the same n_x activation rows.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct GemvLaunch {
    pub m: [GemvMatrix; 3],
    pub n_matrices: c_int,
    pub cols: c_int,
    pub x: *const f32,
    pub n_x: c_int,
    pub epilogue: GemvEpilogue,
    /// RMSNorm weights (cols f32) applied to x first, or null.
    pub norm: *const f32,
    pub eps: f32,
    /// Multiprocessors of the device (the grid fills them).
    pub sm_count: c_int,
    /// Scratch of `prepared_bytes(cols, n_x)` bytes for x prepared by the
    /// launch (`m40_gemv_prepared_path`: 8-bit codes for the integer path
    /// where the device runs dp4a code, scaled values for the M40's scaled
    /// path elsewhere, grid values in f32 for the FP32 kernel of the
    /// formats without either; `PreparedForm`); null for the FP32 path on
    /// unrounded x.
    pub x_q8: *mut i8,
    /// 1: x_q8 already holds x, normalized and prepared by the previous
    /// launch of the same fused step.
    pub x_quantized: c_int,
    /// 1: the kernels may start while the stream's previous kernel finishes
    /// (`m40_launch_overlap`).
    pub overlap: c_int,
    /// Where the matrices with a query, key or value role put their
    /// results, one cache row per activation row (`rows` null where no
    /// matrix has such a role; its `overlap` is not read).
    pub attention: AttentionInputs,
    /// Expert matrices, or `ExpertView::NONE`.
    pub experts: ExpertView,
}

/// One piece of an expert product's work (M40ExpertWork in cuda/ops.cuh):
/// sorted rows first..first+count, all routed to `expert`. Written by
/// `m40_moe_route` on the device; the host only sizes arrays of them.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ExpertWork {
    pub expert: c_int,
    pub first: c_int,
    pub count: c_int,
}

/// How a product launch multiplies expert matrices (M40Experts in
/// cuda/ops.cuh): a grid slice per work piece, its weights `expert_bytes` ×
/// expert past the launch's matrix, or the shared expert's for pieces of
/// expert `shared_expert`; output rows (and input rows, unless `x_shared`)
/// are the pieces' sorted rows.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ExpertView {
    /// `n_work` pieces, or null: a plain product.
    pub work: *const ExpertWork,
    pub expert_bytes: i64,
    pub n_work: c_int,
    /// 1: every piece reads x's rows from row 0 (one session's decode).
    pub x_shared: c_int,
    /// Rows of x (a prepared route prepares them all).
    pub x_rows: c_int,
    /// The expert index the routing gives the shared expert's pieces
    /// (read only where `shared[0]` is not null).
    pub shared_expert: c_int,
    /// The shared expert's matrix for each of the launch's matrices, or
    /// null: no shared expert.
    pub shared: [*const u8; 3],
    /// Values from one expert's bias row to the next: each matrix's bias
    /// is then a table of a row per expert (gpt-oss's expert biases); 0:
    /// every piece takes the same bias. The shared expert's pieces take none.
    pub bias_stride: i64,
}

impl ExpertView {
    pub const NONE: ExpertView = ExpertView {
        work: std::ptr::null(),
        expert_bytes: 0,
        n_work: 0,
        x_shared: 0,
        x_rows: 0,
        shared_expert: 0,
        shared: [std::ptr::null(); 3],
        bias_stride: 0,
    };
}

/// How the decode scratch holds rows prepared for a format's products
/// (`m40_gemv_prepared_form`, cuda/prepare.cuh): the format's block
/// scales, as 8-bit codes where the device runs dp4a code and the format
/// has an integer kernel, as the M40's scaled values where it runs older
/// code and the format has a scaled kernel, else as grid values in f32 for
/// the FP32 kernel. Rows prepared in one form serve only products of the
/// same form.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PreparedForm(c_int);

impl PreparedForm {
    /// `M40_PREPARED_GRID`: grid values in f32.
    pub const GRID: c_int = 4;

    /// `ty`'s form on a device that runs this build's dp4a code or not
    /// (`m40_gemv_dp4a_code`).
    pub fn of(ty: GgmlType, dp4a: bool) -> PreparedForm {
        // SAFETY: host arithmetic on its arguments.
        PreparedForm(unsafe { m40_gemv_prepared_form(ty.id() as c_int, c_int::from(dp4a)) })
    }

    /// The value the kernels take.
    pub fn raw(self) -> c_int {
        self.0
    }

    /// Whether the form's block scales are Q8_K's (one per 256 values).
    pub fn whole_super_blocks(self) -> bool {
        self.0 & !Self::GRID == ActivationScales::Q8K as c_int
    }
}

/// Bytes of scratch for `n_x` activation rows of `cols` values prepared
/// for the decode kernel: the largest of its layouts, the scaled values
/// (an f32 a value, the row padded to whole tiles of 1024 values, and one
/// f32 per 8 values; M40ScaledRow in cuda/scaled.cuh) over the 8-bit codes
/// (a byte a value and two f32 per 32; M40Q8Row in cuda/q8.cuh) and the
/// grid values (an f32 a value). Mirrors `m40_scaled_bytes` in
/// cuda/scaled.cuh.
pub const fn prepared_bytes(cols: usize, n_x: usize) -> usize {
    n_x * (cols.div_ceil(1024) * 1024 * 4 + cols / 2)
}

/// A `m40_mmq` launch (M40Mmq in cuda/mmq.cu): y (n_x × rows) = x · Wᵀ
/// (+ bias), stored or added to y, on f16 tensor cores.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MmqLaunch {
    pub w: *const u8,
    pub rows: c_int,
    pub cols: c_int,
    /// n_x activation rows of cols as `m40_mmq_activations` converts them:
    /// `x_f16` (n_x × cols f16) and `x_scales` (n_x f32).
    pub x_f16: *const u16,
    pub x_scales: *const f32,
    pub n_x: c_int,
    /// `rows` f32, or null.
    pub bias: *const f32,
    pub y: *mut f32,
    /// 1: y += product (the residual add).
    pub accumulate: c_int,
    /// Splits of the columns (`m40_mmq_splits`) and, when more than one,
    /// their partial sums: splits × n_x × rows f32.
    pub splits: c_int,
    pub partials: *mut f32,
    /// As `GemvLaunch::overlap`.
    pub overlap: c_int,
    /// Expert matrices (n_x: the most rows of a piece, `m40_mmq_expert_rows`;
    /// splits 1), or `ExpertView::NONE`.
    pub experts: ExpertView,
}

/// YaRN's corrections to RoPE's angles as the kernels take them (M40Yarn
/// in cuda/ops.cuh): the pairs where the ramp starts and ends
/// (`Yarn::ramp`) and what cos and sin are multiplied by
/// (`Yarn::magnitude`); `enabled` 0: plain RoPE.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct YarnRamp {
    pub low: f32,
    pub high: f32,
    pub magnitude: f32,
    pub enabled: c_int,
}

impl YarnRamp {
    pub const NONE: YarnRamp = YarnRamp {
        low: 0.0,
        high: 0.0,
        magnitude: 1.0,
        enabled: 0,
    };

    /// `rope`'s YaRN corrections, or none.
    pub fn of(rope: &Rope) -> YarnRamp {
        match rope.yarn {
            None => YarnRamp::NONE,
            Some(yarn) => {
                let [low, high] = yarn.ramp(rope.dims, rope.freq_base);
                YarnRamp {
                    low,
                    high,
                    magnitude: yarn.magnitude(rope.freq_scale),
                    enabled: 1,
                }
            }
        }
    }
}

/// One layer's attention-input step (M40AttentionInputs in cuda/ops.cuh).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct AttentionInputs {
    pub rows: *const DeviceRow,
    pub q_norm: *const f32,
    pub k_norm: *const f32,
    pub factors: *const f32,
    pub freq_base: f64,
    pub freq_scale: f64,
    /// freq_base^(−2 / rope_dims): the products' epilogue takes pair i's
    /// inverse frequency as its i-th power.
    pub inv_freq_ratio: f64,
    pub eps: f32,
    pub layer: KvLayer,
    pub n_head: c_int,
    pub n_head_kv: c_int,
    pub head_dim_k: c_int,
    pub head_dim_v: c_int,
    pub neox: c_int,
    pub rope_dims: c_int,
    /// As `GemvLaunch::overlap`.
    pub overlap: c_int,
    /// YaRN's corrections (`attention_inputs_kernel` only: the products'
    /// epilogue refuses them).
    pub yarn: YarnRamp,
}

impl AttentionInputs {
    /// For launches without attention inputs.
    pub const NONE: AttentionInputs = AttentionInputs {
        rows: std::ptr::null(),
        q_norm: std::ptr::null(),
        k_norm: std::ptr::null(),
        factors: std::ptr::null(),
        freq_base: 0.0,
        freq_scale: 0.0,
        inv_freq_ratio: 0.0,
        eps: 0.0,
        layer: KvLayer {
            k_start: 0,
            v_start: 0,
        },
        n_head: 0,
        n_head_kv: 0,
        head_dim_k: 0,
        head_dim_v: 0,
        neox: 0,
        rope_dims: 0,
        overlap: 0,
        yarn: YarnRamp::NONE,
    };
}

/// Head sizes the attention kernel handles (32 lanes × M40_ATTN_MAX_PER_LANE).
pub const ATTENTION_MAX_HEAD_DIM: usize = 512;

/// The activation of `m40_glu` (M40Glu in cuda/common.cuh).
pub const GLU_SILU: c_int = 0;
pub const GLU_GELU_TANH: c_int = 1;
pub const GLU_SWIGLU_OAI: c_int = 2;

/// `m40_glu`'s activation for `glu`.
pub fn glu_activation(glu: Glu) -> c_int {
    match glu {
        Glu::Swiglu => GLU_SILU,
        Glu::Geglu => GLU_GELU_TANH,
        Glu::SwigluOai => GLU_SWIGLU_OAI,
    }
}

impl GemvEpilogue {
    /// The gated-activation epilogue for `glu`.
    pub fn gated(glu: Glu) -> GemvEpilogue {
        match glu {
            Glu::Swiglu => GemvEpilogue::GluSilu,
            Glu::Geglu => GemvEpilogue::GluGelu,
            Glu::SwigluOai => GemvEpilogue::GluOai,
        }
    }
}

extern "C" {
    /// For each of `n_rows` rows of logits (`n_vocab` each): the ids and
    /// values of its `want[r]` largest (≤ `max_want`) at r · max_want of
    /// `out_ids` and `out_values`, in no particular order, and the values at
    /// `extra_ids[extra_offsets[r] .. extra_offsets[r + 1]]` at the same
    /// places of `extra_values` (cuda/top.cu). Every array is device memory.
    pub fn m40_top_logits(
        logits: *const f32,
        n_vocab: c_int,
        n_rows: c_int,
        want: *const c_int,
        max_want: c_int,
        out_ids: *mut c_int,
        out_values: *mut f32,
        extra_offsets: *const c_int,
        extra_ids: *const c_int,
        extra_values: *mut f32,
        stream: Stream,
    ) -> c_int;
    pub fn m40_gemv(
        ty: c_int,
        launch: *const GemvLaunch,
        rows_per_warp: c_int,
        stream: Stream,
    ) -> c_int;
    /// 1 when decode products of type `ty` prepare their activations in a
    /// scratch on the current device (given one): every format whose
    /// activations llama.cpp's CPU rounds to 8 bits, in its `PreparedForm`.
    pub fn m40_gemv_prepared_path(ty: c_int) -> c_int;
    /// 1 where the current device runs this build's dp4a code (sm_61+
    /// SASS; not the sm_52 SASS or the compute_52 PTX).
    pub fn m40_gemv_dp4a_code() -> c_int;
    /// The form (`PreparedForm`) decode products of type `ty` read their
    /// prepared rows in where the device runs dp4a code (`dp4a` 1) or not
    /// (host arithmetic).
    pub fn m40_gemv_prepared_form(ty: c_int, dp4a: c_int) -> c_int;
    /// 1 when launches may overlap the stream's previous kernel on the
    /// current device (programmatic dependent launch: sm_90+ code).
    pub fn m40_launch_overlap() -> c_int;
    /// 1 where the current device runs `m40_mmq` products of type `ty`
    /// (this build's sm_80+ code runs there); readies the device for them.
    /// Called once per device, with it current, before its first `m40_mmq`.
    pub fn m40_mmq_prepare(ty: c_int) -> c_int;
    pub fn m40_mmq(ty: c_int, launch: *const MmqLaunch, stream: Stream) -> c_int;
    /// x (n_rows × cols f32), normalized first where `norm` (cols f32
    /// weights, with eps) is not null, rounded to the 8-bit grid of
    /// `grid_scales` (`ActivationScales`: the products' format's; F32
    /// leaves the values as they are), as `m40_mmq` takes it converted
    /// (x_f16, n_rows × cols; x_scales, n_rows).
    pub fn m40_mmq_activations(
        overlap: c_int,
        x: *const f32,
        norm: *const f32,
        eps: f32,
        n_rows: c_int,
        cols: c_int,
        grid_scales: c_int,
        x_f16: *mut u16,
        x_scales: *mut f32,
        stream: Stream,
    ) -> c_int;
    /// The column splits of a `m40_mmq` launch of this shape on a device of
    /// `sm_count` multiprocessors; 0 where no device was readied for the
    /// format (`m40_mmq_prepare`), or a format without the path.
    pub fn m40_mmq_splits(
        ty: c_int,
        rows: c_int,
        cols: c_int,
        n_x: c_int,
        sm_count: c_int,
    ) -> c_int;
    /// Rows of one expert work piece on the tensor cores for `ty` in a step
    /// of `n_rows` rows (the tile), or 0 where the format has no
    /// tensor-core kernel on this device.
    pub fn m40_mmq_expert_rows(ty: c_int, n_rows: c_int) -> c_int;
    /// Routes `n_rows` rows by their router logits (`n_rows × n_expert`) to
    /// `n_used` experts each, and where `shared_logit` (one a row) is not
    /// null to the shared expert as expert `n_expert`, weighted σ(logit):
    /// with S slots a row (`n_used`, plus one for the shared expert),
    /// `slot_weight`, `slot_row` (`n_rows × S`: each (row, slot)'s weight
    /// and sorted row), `sorted_source` (the source row of each sorted row)
    /// and `n_work` work pieces of at most `piece_rows` rows (at least
    /// `m40_moe_pieces` of them, the shared expert counted as one more
    /// expert and one more used). Where `x_q8`
    /// is not null the launch also prepares `x_rows` rows of `x` (`cols`
    /// wide, normalized first where `norm` is not null) into it in `x_form`
    /// (`PreparedForm`), as `m40_gemv` would.
    pub fn m40_moe_route(
        overlap: c_int,
        logits: *const f32,
        shared_logit: *const f32,
        n_rows: c_int,
        n_expert: c_int,
        n_used: c_int,
        piece_rows: c_int,
        slot_weight: *mut f32,
        slot_row: *mut c_int,
        sorted_source: *mut c_int,
        work: *mut ExpertWork,
        n_work: c_int,
        x: *const f32,
        norm: *const f32,
        eps: f32,
        cols: c_int,
        x_rows: c_int,
        x_q8: *mut i8,
        x_form: c_int,
        stream: Stream,
    ) -> c_int;
    /// The most work pieces a routing of this shape makes (host arithmetic).
    pub fn m40_moe_pieces(
        n_rows: c_int,
        n_expert: c_int,
        n_used: c_int,
        piece_rows: c_int,
    ) -> c_int;
    /// x[r] (+)= Σ_s slot_weight[r, s] · y[slot_row[r, s]] for rows of `width`.
    pub fn m40_moe_combine(
        x: *mut f32,
        y: *const f32,
        slot_weight: *const f32,
        slot_row: *const c_int,
        n_rows: c_int,
        n_used: c_int,
        width: c_int,
        accumulate: c_int,
        stream: Stream,
    ) -> c_int;
    pub fn m40_dequantize_rows(
        ty: c_int,
        w: *const u8,
        cols: c_int,
        first_row: c_int,
        n_rows: c_int,
        out: *mut f32,
        stream: Stream,
    ) -> c_int;
    pub fn m40_dequantize_rows_f16(
        ty: c_int,
        w: *const u8,
        cols: c_int,
        first_row: c_int,
        n_rows: c_int,
        out: *mut u16,
        stream: Stream,
    ) -> c_int;
    /// Rows of x on the 8-bit grid of `grid_scales` (as in
    /// `m40_mmq_activations`) as f16, each divided by its power-of-two
    /// scale (`scales`, one per row) to stay in f16's range.
    pub fn m40_rows_to_f16(
        x: *const f32,
        n_rows: c_int,
        cols: c_int,
        grid_scales: c_int,
        out: *mut u16,
        scales: *mut f32,
        stream: Stream,
    ) -> c_int;
    /// Rows of x on the 8-bit grid of `grid_scales`, as f32.
    pub fn m40_rows_to_grid(
        x: *const f32,
        n_rows: c_int,
        cols: c_int,
        grid_scales: c_int,
        out: *mut f32,
        stream: Stream,
    ) -> c_int;
    pub fn m40_scale_rows(
        y: *mut f32,
        n_rows: c_int,
        width: c_int,
        scales: *const f32,
        stream: Stream,
    ) -> c_int;
    pub fn m40_embed(
        ty: c_int,
        table: *const u8,
        cols: c_int,
        tokens: *const c_int,
        n_tokens: c_int,
        scale: f32,
        out: *mut f32,
        stream: Stream,
    ) -> c_int;
    pub fn m40_vector_to_f32(
        ty: c_int,
        w: *const u8,
        n: c_int,
        out: *mut f32,
        stream: Stream,
    ) -> c_int;
    pub fn m40_rms_norm(
        x: *const f32,
        w: *const f32,
        group: c_int,
        n_groups: c_int,
        eps: f32,
        out: *mut f32,
        stream: Stream,
    ) -> c_int;
    pub fn m40_norm_add(
        x: *mut f32,
        y: *const f32,
        w: *const f32,
        width: c_int,
        n_rows: c_int,
        eps: f32,
        stream: Stream,
    ) -> c_int;
    pub fn m40_attention_inputs(
        q: *mut f32,
        k: *const f32,
        v: *const f32,
        n_rows: c_int,
        inputs: *const AttentionInputs,
        stream: Stream,
    ) -> c_int;
    pub fn m40_add(x: *mut f32, y: *const f32, n: usize, period: usize, stream: Stream) -> c_int;
    /// x[i] ← x[i] · factor[0] for n values (`factor`: one f32 on the device).
    pub fn m40_scale_by(x: *mut f32, factor: *const f32, n: usize, stream: Stream) -> c_int;
    /// x[i] ← cap · tanh(x[i] / cap) for n values.
    pub fn m40_soft_cap(x: *mut f32, cap: f32, n: usize, stream: Stream) -> c_int;
    pub fn m40_delta_net(
        qkv: *const f32,
        alpha: *const f32,
        beta: *const f32,
        conv_weights: *const f32,
        dt_bias: *const f32,
        a: *const f32,
        rows: *const DeviceRow,
        run_starts: *const c_int,
        n_rows: c_int,
        n_runs: c_int,
        max_run_rows: c_int,
        conv_state_offset: i64,
        state_offset: i64,
        taps: c_int,
        head_dim: c_int,
        n_k_heads: c_int,
        n_v_heads: c_int,
        eps: f32,
        conv: *mut f32,
        scratch: *mut f32,
        out: *mut f32,
        stream: Stream,
    ) -> c_int;
    pub fn m40_delta_net_scratch(n_rows: c_int, head_dim: c_int, n_v_heads: c_int) -> usize;
    pub fn m40_split_halves(
        x: *const f32,
        groups: c_int,
        half: c_int,
        first: *mut f32,
        second: *mut f32,
        stream: Stream,
    ) -> c_int;
    pub fn m40_sigmoid_gate(x: *mut f32, gate: *const f32, n: usize, stream: Stream) -> c_int;
    pub fn m40_gated_add(
        x: *mut f32,
        y: *const f32,
        gate: *const f32,
        rows: c_int,
        width: c_int,
        stream: Stream,
    ) -> c_int;
    pub fn m40_gather_rows(
        src: *const f32,
        width: c_int,
        rows: *const c_int,
        n_rows: c_int,
        out: *mut f32,
        stream: Stream,
    ) -> c_int;
    pub fn m40_rope(
        x: *mut f32,
        n_rows: c_int,
        n_heads: c_int,
        head_dim: c_int,
        rows: *const DeviceRow,
        neox: c_int,
        dims: c_int,
        freq_base: f32,
        freq_scale: f32,
        factors: *const f32,
        yarn: YarnRamp,
        stream: Stream,
    ) -> c_int;
    pub fn m40_glu(
        act: c_int,
        gate: *const f32,
        up: *const f32,
        n: usize,
        out: *mut f32,
        stream: Stream,
    ) -> c_int;
    pub fn m40_store_kv(
        k: *const f32,
        v: *const f32,
        n_rows: c_int,
        k_width: c_int,
        v_width: c_int,
        rows: *const DeviceRow,
        layer: KvLayer,
        stream: Stream,
    ) -> c_int;
    /// Attention of `n_rows` rows (cuda/attention.cu). `sinks`: null, or
    /// one logit per query head that joins its softmax without a value.
    /// `prepared`: null, or the decode scratch, where a decode step's
    /// output (at most GEMV_MAX_X rows, heads of a multiple of 32 values)
    /// also goes prepared for the next decode product, in `prepared_form`
    /// (`PreparedForm`, not of Q8_K's scales).
    pub fn m40_attention(
        q: *const f32,
        n_rows: c_int,
        rows: *const DeviceRow,
        layer: KvLayer,
        n_head: c_int,
        n_head_kv: c_int,
        head_dim_k: c_int,
        head_dim_v: c_int,
        window: c_int,
        scale: f32,
        sinks: *const f32,
        prompt_chunk: c_int,
        n_splits: c_int,
        heads_per_block: c_int,
        partial: *mut f32,
        out: *mut f32,
        prepared: *mut i8,
        prepared_form: c_int,
        overlap: c_int,
        stream: Stream,
    ) -> c_int;
}
