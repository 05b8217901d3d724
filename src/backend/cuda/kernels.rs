//! The kernel launchers of `cuda/*.cu`. Each enqueues its kernels on the
//! given stream and returns the launch's CUDA status; pointers are device
//! memory unless stated.

use std::ffi::c_int;

use super::runtime::Stream;

/// One batch row for the KV-cache kernels (`M40Row` in cuda/ops.cuh).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceRow {
    /// Device address of the sequence's keys (f16, layer × n_ctx × width).
    pub keys: u64,
    pub values: u64,
    pub pos: i32,
    pub n_ctx: i32,
}

/// Activation rows one `m40_matvec` call multiplies (M40_MATVEC_MAX_ROWS).
pub const MATVEC_MAX_ROWS: usize = 8;

/// Head sizes the attention kernel handles (32 lanes × M40_ATTN_MAX_PER_LANE).
pub const ATTENTION_MAX_HEAD_DIM: usize = 256;

/// The activation of `m40_glu`.
pub const GLU_SILU: c_int = 0;
pub const GLU_GELU_TANH: c_int = 1;

extern "C" {
    pub fn m40_matvec(
        ty: c_int,
        w: *const u8,
        rows: c_int,
        cols: c_int,
        x: *const f32,
        n_x: c_int,
        y: *mut f32,
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
        x: *mut f32,
        w: *const f32,
        group: c_int,
        n_groups: c_int,
        eps: f32,
        stream: Stream,
    ) -> c_int;
    pub fn m40_add(x: *mut f32, y: *const f32, n: usize, period: usize, stream: Stream) -> c_int;
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
        layer: c_int,
        stream: Stream,
    ) -> c_int;
    pub fn m40_attention(
        q: *const f32,
        n_rows: c_int,
        rows: *const DeviceRow,
        layer: c_int,
        n_head: c_int,
        n_head_kv: c_int,
        head_dim_k: c_int,
        head_dim_v: c_int,
        window: c_int,
        scale: f32,
        n_splits: c_int,
        partial: *mut f32,
        out: *mut f32,
        stream: Stream,
    ) -> c_int;
}
