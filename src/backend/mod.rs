//! Compute backends. The CPU backend runs everywhere; with the `cuda`
//! feature, the CUDA backend runs on NVIDIA GPUs from the Tesla M40 (sm_52)
//! up. The device index a host passes picks one.
//!
//! [`Backend`] is the interface between the model code and a device: the
//! transformer forward pass is written once against it (a [`ForwardPass`]),
//! and each backend implements the operations on its own buffers.
//! [`ModelBackend`] is the backend a model was loaded onto: the model code
//! asks it for caches and steps, and never names a device.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod fused;
mod weight;

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::gguf::GgufFile;
use crate::json::JsonObject;
use crate::kv_cache::KvCache;
pub use crate::kv_cache::LayerState;
use crate::quant::GgmlType;
use crate::sampling;
pub use fused::{
    route, AttentionStep, ExpertBiases, Experts, GatedFfn, Heads, Norm, Product, Scratch,
    SharedExpert, SharedScratch,
};
pub use weight::Weight;

/// How RoPE pairs the dimensions of a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeMode {
    /// Adjacent pairs (2i, 2i+1): LLaMA.
    Normal,
    /// Halves (i, i + d/2): GPT-NeoX, Qwen2, Gemma.
    Neox,
}

/// RoPE for one layer: θ_i = pos · scale · base^(−2i/dims) / factor_i.
#[derive(Clone, Copy, Debug)]
pub struct Rope<'a> {
    pub mode: RopeMode,
    /// Dimensions of each head that rotate (the rest pass through).
    pub dims: usize,
    pub freq_base: f32,
    /// Position scale (linear RoPE scaling: 1 / factor).
    pub freq_scale: f32,
    /// Per-pair frequency divisors (LLaMA 3.1 `rope_freqs`), if any.
    pub freq_factors: Option<&'a Weight>,
    /// YaRN's corrections to the scaled angles, if the model uses YaRN.
    pub yarn: Option<Yarn>,
}

/// YaRN (llama.cpp's `yarn` RoPE scaling, ggml's `rope_yarn` with an
/// extrapolation factor of 1): the pairs that turn more than `beta_fast`
/// times over the original context keep their unscaled angle, those that
/// turn fewer than `beta_slow` times take the scaled one, and the pairs
/// between mix the two along a linear ramp; cos and sin are both multiplied
/// by `attn_factor · (1 + 0.1 · ln(1 / freq_scale))`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Yarn {
    /// The context the model was trained with before scaling.
    pub orig_ctx: u32,
    pub beta_fast: f32,
    pub beta_slow: f32,
    /// llama.cpp's `yarn_attn_factor`, as its context computes it.
    pub attn_factor: f32,
}

impl Yarn {
    /// The pairs where the ramp starts and ends (ggml's
    /// `ggml_rope_yarn_corr_dims`) for RoPE over `dims` dimensions of base
    /// `freq_base`: the pair that turns `beta_fast` times over the original
    /// context and the one that turns `beta_slow` times, the first rounded
    /// down and the second up, within the rotated dimensions. Pairs up to
    /// the first keep their unscaled angle; pair i past it takes the
    /// fraction (i − low) / max(high − low, 0.001), clamped to [0, 1], of
    /// the scaled one.
    pub fn ramp(&self, dims: usize, freq_base: f32) -> [f32; 2] {
        let dims = dims as f32;
        let corr_dim = |turns: f32| {
            dims * (self.orig_ctx as f32 / (turns * 2.0 * std::f32::consts::PI)).ln()
                / (2.0 * freq_base.ln())
        };
        [
            corr_dim(self.beta_fast).floor().max(0.0),
            corr_dim(self.beta_slow).ceil().min(dims - 1.0),
        ]
    }

    /// What cos and sin are multiplied by at position scale `freq_scale`.
    pub fn magnitude(&self, freq_scale: f32) -> f32 {
        self.attn_factor * (1.0 + 0.1 * (1.0 / freq_scale).ln())
    }
}

/// The gated activation of the feed-forward block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Glu {
    /// silu(gate) · up: LLaMA, Qwen2.
    Swiglu,
    /// gelu_tanh(gate) · up: Gemma.
    Geglu,
    /// gpt-oss's clamped SwiGLU (ggml's `swiglu_oai`): with g = min(gate, 7)
    /// and u = clamp(up, −7, 7), g · σ(1.702 · g) · (u + 1).
    SwigluOai,
}

/// One row of a batch as attention sees it: which sequence's KV cache it
/// belongs to and its position there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeqPos {
    pub seq: usize,
    pub pos: usize,
}

/// Attention shape of one layer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionShape {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim_k: usize,
    pub head_dim_v: usize,
    /// A query at position p sees keys at positions > p − window.
    pub window: Option<usize>,
    /// Multiplies q·k before the softmax.
    pub scale: f32,
    /// One logit per query head that joins its softmax without a value
    /// (gpt-oss's attention sinks), so that the positions' weights may sum
    /// to less than 1.
    pub sinks: Option<Weight>,
}

/// The shape of a Gated DeltaNet layer (see `model::DeltaNetParams`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeltaNetShape {
    pub conv_kernel: usize,
    pub head_dim: usize,
    pub n_k_heads: usize,
    pub n_v_heads: usize,
}

impl DeltaNetShape {
    pub fn key_width(&self) -> usize {
        self.head_dim * self.n_k_heads
    }

    pub fn value_width(&self) -> usize {
        self.head_dim * self.n_v_heads
    }

    /// Channels of the convolution: queries, keys, then values.
    pub fn channels(&self) -> usize {
        2 * self.key_width() + self.value_width()
    }

    /// f32 values of one sequence's convolution state (its last
    /// `conv_kernel − 1` inputs) and recurrent state (a `head_dim²` matrix
    /// per value head) in one layer.
    pub fn state_values(&self) -> (usize, usize) {
        (
            (self.conv_kernel - 1) * self.channels(),
            self.n_v_heads * self.head_dim * self.head_dim,
        )
    }
}

/// One Gated DeltaNet layer's step over the rows of a batch.
#[derive(Clone, Copy)]
pub struct DeltaNetStep<'a> {
    /// The layer's index among the caches' layers.
    pub layer: usize,
    pub rows: &'a [SeqPos],
    pub shape: DeltaNetShape,
    /// The convolution's taps (`channels` rows of `conv_kernel`).
    pub conv: &'a Weight,
    /// Per value head: the decay's bias and −e^A.
    pub dt_bias: &'a Weight,
    pub a: &'a Weight,
    /// The ε of the queries' and keys' L2 norms.
    pub eps: f32,
}

/// Row i of `values` (rows of `row_len`) replacing the contents of
/// `rows[i]`, whose allocation is reused: the host side of every backend's
/// [`Backend::read_rows`]. A batch's logits can be tens of megabytes a step
/// (32 sessions of a 262,144-token vocabulary: 33.5 MB), which one thread
/// copies at a fraction of the memory's bandwidth (on the H200's host, 8
/// sessions' 8 MB of logits took 1.7 ms a step, half a batched decode step of
/// a Qwen3.5 model), so copies of a few megabytes are split over threads, a
/// megabyte or more each, where a thread's start costs little against it.
fn fill_rows(values: &[f32], row_len: usize, rows: &mut [&mut Vec<f32>]) {
    const BYTES_PER_THREAD: usize = 1 << 20;
    const MAX_THREADS: usize = 8;
    assert!(values.len() >= row_len * rows.len());
    let copy = |values: &[f32], rows: &mut [&mut Vec<f32>]| {
        for (row, values) in rows.iter_mut().zip(values.chunks_exact(row_len)) {
            row.clear();
            row.extend_from_slice(values);
        }
    };
    let threads = (row_len * rows.len() * 4 / BYTES_PER_THREAD)
        .min(std::thread::available_parallelism().map_or(1, |n| n.get()))
        .min(MAX_THREADS)
        .min(rows.len());
    if threads <= 1 {
        copy(values, rows);
        return;
    }
    let per_thread = rows.len().div_ceil(threads);
    std::thread::scope(|scope| {
        for (rows, values) in rows
            .chunks_mut(per_thread)
            .zip(values.chunks(per_thread * row_len))
        {
            scope.spawn(move || copy(values, rows));
        }
    });
}

/// What a sampler asks of one row of a step's logits
/// ([`Backend::read_candidates`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CandidateRequest {
    /// The row's `want` largest logits (by f32::total_cmp, the lower token
    /// id first among equals) and the logits of the `extra` tokens.
    Best { want: usize, extra: Vec<u32> },
    /// The whole row.
    Row,
}

/// One row's answer to a [`CandidateRequest`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Candidates {
    /// (token, logit) of the largest logits, in no particular order
    /// (`Best`); empty for `Row`.
    pub best: Vec<(u32, f32)>,
    /// The logits of the extra tokens in their order (`Best`), or the whole
    /// row (`Row`).
    pub values: Vec<f32>,
}

/// [`Backend::read_candidates`] from logits on the host: row i of `values`
/// (rows of `row_len`) answers `requests[i]` in `out[i]`.
fn candidates_of_rows(
    values: &[f32],
    row_len: usize,
    requests: &[CandidateRequest],
    out: &mut [Candidates],
) {
    for ((request, out), row) in requests.iter().zip(out).zip(values.chunks_exact(row_len)) {
        *out = match request {
            CandidateRequest::Best { want, extra } => Candidates {
                best: sampling::best_of(row, *want),
                values: extra.iter().map(|&t| row[t as usize]).collect(),
            },
            CandidateRequest::Row => Candidates {
                best: Vec::new(),
                values: row.to_vec(),
            },
        };
    }
}

/// Where a step's wanted logits go.
pub enum StepOutput<'a, 'b> {
    /// Row i's logits replace the contents of `rows[i]`
    /// ([`Backend::read_rows`]).
    Logits(&'a mut [&'b mut Vec<f32>]),
    /// Row i's answer to `requests[i]` goes to `out[i]`
    /// ([`Backend::read_candidates`]).
    Candidates {
        requests: &'a [CandidateRequest],
        out: &'a mut [Candidates],
    },
}

impl StepOutput<'_, '_> {
    /// The rows wanted.
    pub fn len(&self) -> usize {
        match self {
            StepOutput::Logits(rows) => rows.len(),
            StepOutput::Candidates { requests, .. } => requests.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Reads the step's logits rows (at the start of `buffer`, `row_len`
    /// each) from backend `b` into this output. On failure nothing is
    /// touched.
    pub fn read<B: Backend + ?Sized>(
        &mut self,
        b: &B,
        buffer: &B::Buffer,
        row_len: usize,
    ) -> Result<()> {
        match self {
            StepOutput::Logits(rows) => b.read_rows(buffer, row_len, rows),
            StepOutput::Candidates { requests, out } => {
                b.read_candidates(buffer, row_len, requests, out)
            }
        }
    }
}

/// The operations a device provides to the forward pass. Activations are
/// row-major `rows × width` matrices of f32 in the backend's `Buffer`s.
pub trait Backend {
    type Buffer;
    /// One sequence's key/value cache for every layer.
    type KvCache: Send;

    /// A buffer of `len` values (its contents are unspecified until written).
    fn buffer(&self, len: usize) -> Result<Self::Buffer>;
    /// Copies a buffer's values to the host.
    fn read(&self, buffer: &Self::Buffer, out: &mut [f32]) -> Result<()>;
    /// Copies rows of `row_len` values from the start of a buffer to the
    /// host, row i replacing the contents of `rows[i]` (whose allocation is
    /// reused: a decode step's logits go straight into the sessions' own).
    /// On failure no row is touched.
    fn read_rows(
        &self,
        buffer: &Self::Buffer,
        row_len: usize,
        rows: &mut [&mut Vec<f32>],
    ) -> Result<()>;
    /// Row i of the rows of `row_len` values at the start of a buffer
    /// answers `requests[i]` in `out[i]`: its largest values and a few
    /// others, or all of it. A backend whose buffers are not host memory
    /// selects on its own side and copies only the answers. On failure no
    /// answer is touched.
    fn read_candidates(
        &self,
        buffer: &Self::Buffer,
        row_len: usize,
        requests: &[CandidateRequest],
        out: &mut [Candidates],
    ) -> Result<()> {
        let mut values = vec![0f32; row_len * requests.len()];
        self.read(buffer, &mut values)?;
        candidates_of_rows(&values, row_len, requests, out);
        Ok(())
    }
    /// Copies host values into the start of a buffer.
    fn write(&self, buffer: &mut Self::Buffer, values: &[f32]) -> Result<()>;
    /// The rows a step starts from when another device computed them (the
    /// previous stage of a split model): `values` into the start of `out`.
    /// A backend that records steps reads them from the recording's inputs.
    fn step_input(&self, values: &[f32], out: &mut Self::Buffer) -> Result<()> {
        self.write(out, values)
    }

    /// A sequence's cache for `n_ctx` positions of `layers`: keys and values
    /// of each attention layer's widths, a zero state for each
    /// linear-attention layer.
    fn kv_cache(&self, n_ctx: usize, layers: &[LayerState]) -> Result<Self::KvCache>;
    /// A cache's linear-attention states back to those of no tokens.
    fn reset_recurrent(&self, cache: &mut Self::KvCache);

    /// out[r] = table[tokens[r]] · scale.
    fn embed(
        &self,
        table: &Weight,
        tokens: &[u32],
        scale: f32,
        out: &mut Self::Buffer,
    ) -> Result<()>;
    /// out = x · Wᵀ for `rows` rows of x.
    fn matmul(
        &self,
        w: &Weight,
        x: &Self::Buffer,
        rows: usize,
        out: &mut Self::Buffer,
    ) -> Result<()>;
    /// outs[i] = x · ws[i]ᵀ for `rows` rows of x: products of one input
    /// (Q/K/V, gate and up), which a backend may run together.
    fn matmuls(
        &self,
        ws: &[&Weight],
        x: &Self::Buffer,
        rows: usize,
        outs: &mut [&mut Self::Buffer],
    ) -> Result<()> {
        for (w, out) in ws.iter().zip(outs.iter_mut()) {
            self.matmul(w, x, rows, out)?;
        }
        Ok(())
    }
    /// x[r] += bias for every row.
    fn add_bias(&self, x: &mut Self::Buffer, bias: &Weight, rows: usize) -> Result<()>;
    /// Normalizes every `weight.cols`-wide group of x by its RMS and scales
    /// it by `weight`, in place (groups are rows, or heads for per-head norms).
    fn rms_norm(&self, x: &mut Self::Buffer, weight: &Weight, eps: f32, len: usize) -> Result<()>;
    /// Divides every `group`-wide group of x by its RMS, with no weight (Gemma
    /// 4's value heads), in place.
    fn rms_normalize(&self, x: &mut Self::Buffer, group: usize, eps: f32, len: usize)
        -> Result<()>;
    /// x ← x · factor, `factor` a weight of one value (Gemma 4's per-layer
    /// output scale).
    fn scale_by(&self, x: &mut Self::Buffer, factor: &Weight, len: usize) -> Result<()>;
    /// x ← cap · tanh(x / cap): soft-capping (Gemma 4's final logits).
    fn soft_cap(&self, x: &mut Self::Buffer, cap: f32, len: usize) -> Result<()>;
    /// out[i] = src[rows[i]] for rows `width` wide.
    fn gather_rows(
        &self,
        src: &Self::Buffer,
        width: usize,
        rows: &[usize],
        out: &mut Self::Buffer,
    ) -> Result<()>;
    /// x += y.
    fn add(&self, x: &mut Self::Buffer, y: &Self::Buffer, len: usize) -> Result<()>;
    /// Rotates every head of every row by its row's position.
    fn rope(
        &self,
        x: &mut Self::Buffer,
        n_heads: usize,
        head_dim: usize,
        positions: &[SeqPos],
        rope: &Rope,
    ) -> Result<()>;
    /// out = act(gate) · up.
    fn glu(
        &self,
        glu: Glu,
        gate: &Self::Buffer,
        up: &Self::Buffer,
        len: usize,
        out: &mut Self::Buffer,
    ) -> Result<()>;
    /// Writes the rows' keys and values into their sequences' caches.
    fn store_kv(
        &self,
        caches: &mut [&mut Self::KvCache],
        layer: usize,
        k: &Self::Buffer,
        v: &Self::Buffer,
        rows: &[SeqPos],
    ) -> Result<()>;
    /// Causal attention of each row's queries over its sequence's cache
    /// (positions ≤ the row's own, within the window).
    fn attention(
        &self,
        caches: &[&mut Self::KvCache],
        layer: usize,
        q: &Self::Buffer,
        rows: &[SeqPos],
        shape: &AttentionShape,
        out: &mut Self::Buffer,
    ) -> Result<()>;

    /// The Gated DeltaNet of a linear-attention layer, rows of each
    /// sequence in position order from where its recurrent state stands:
    /// the causal convolution of `qkv` (rows of `shape.channels()`) with
    /// the sequence's previous inputs, SiLU, L2 norms of each query and key
    /// head, then per value head h and row t, with decay
    /// g = softplus(alpha[t][h] + dt_bias[h]) · a[h] and strength
    /// b = σ(beta[t][h]):
    /// S ← e^g·S; S += k (b·(v − Sᵀk))ᵀ; out[t] = Sᵀq / √head_dim.
    /// The sequences' convolution and recurrent states advance by their
    /// rows.
    fn delta_net(
        &self,
        caches: &mut [&mut Self::KvCache],
        step: DeltaNetStep,
        qkv: &Self::Buffer,
        alpha: &Self::Buffer,
        beta: &Self::Buffer,
        out: &mut Self::Buffer,
    ) -> Result<()>;
    /// Splits each of `groups` runs of `2 · half` values of x into its
    /// first half (to `first`) and second half (to `second`).
    fn split_halves(
        &self,
        x: &Self::Buffer,
        groups: usize,
        half: usize,
        first: &mut Self::Buffer,
        second: &mut Self::Buffer,
    ) -> Result<()>;
    /// x ← x · σ(gate).
    fn sigmoid_gate(&self, x: &mut Self::Buffer, gate: &Self::Buffer, len: usize) -> Result<()>;
    /// x[r] += σ(gate[r]) · y[r] for `rows` rows of `width` values, one gate
    /// value a row.
    fn gated_add(
        &self,
        x: &mut Self::Buffer,
        y: &Self::Buffer,
        gate: &Self::Buffer,
        rows: usize,
        width: usize,
    ) -> Result<()>;

    /// x += post_norm(Σ w_e · down_e(act(h · gate_eᵀ) · (h · up_eᵀ))) for
    /// `rows` rows of h = norm(x): the mixture-of-experts feed-forward
    /// block with its residual, over the experts and weights [`route`]
    /// gives each row (of the router's logits plus its bias, and each
    /// expert's products plus theirs, where `experts.biases` has them).
    /// `scratch` holds h and the mixture's output.
    #[allow(clippy::too_many_arguments)]
    fn norm_moe_ffn_residual(
        &self,
        x: &mut Self::Buffer,
        norm: Norm,
        rows: usize,
        experts: &Experts,
        glu: Glu,
        post_norm: Option<Norm>,
        scratch: Scratch<Self::Buffer>,
    ) -> Result<()>;

    // The fused steps of a layer (see `fused`): by default composed of the
    // operations above; a backend overrides them with fewer, fused kernels.

    /// Every product reads norm(x) (`rows` rows); `normed` is scratch.
    fn norm_matmuls(
        &self,
        x: &Self::Buffer,
        norm: Norm,
        rows: usize,
        normed: &mut Self::Buffer,
        products: &mut [Product<Self::Buffer>],
    ) -> Result<()> {
        fused::norm_matmuls(self, x, norm, rows, normed, products)
    }

    /// out = act(norm(x) · gateᵀ) · (norm(x) · upᵀ).
    fn norm_gated_ffn(
        &self,
        x: &Self::Buffer,
        norm: Norm,
        rows: usize,
        ffn: GatedFfn,
        scratch: Scratch<Self::Buffer>,
        out: &mut Self::Buffer,
    ) -> Result<()> {
        fused::norm_gated_ffn(self, x, norm, rows, ffn, scratch, out)
    }

    /// x += post_norm(mixture(h)) + σ(gate_inp · h) · shared(h), h =
    /// norm(x): a mixture of experts with a shared expert (Qwen3.5 MoE).
    #[allow(clippy::too_many_arguments)]
    fn norm_moe_shared_ffn_residual(
        &self,
        x: &mut Self::Buffer,
        norm: Norm,
        rows: usize,
        experts: &Experts,
        shared: &SharedExpert,
        glu: Glu,
        post_norm: Option<Norm>,
        scratch: Scratch<Self::Buffer>,
        shared_scratch: SharedScratch<Self::Buffer>,
    ) -> Result<()> {
        fused::norm_moe_shared_ffn_residual(
            self,
            x,
            norm,
            rows,
            experts,
            shared,
            glu,
            post_norm,
            scratch,
            shared_scratch,
        )
    }

    /// x += post_norm(a · Wᵀ + bias); `product` is scratch.
    #[allow(clippy::too_many_arguments)]
    fn matmul_residual(
        &self,
        w: &Weight,
        bias: Option<&Weight>,
        a: &Self::Buffer,
        rows: usize,
        post_norm: Option<Norm>,
        product: &mut Self::Buffer,
        x: &mut Self::Buffer,
    ) -> Result<()> {
        fused::matmul_residual(self, w, bias, a, rows, post_norm, product, x)
    }

    /// q, k and v of norm(x) (`qkv`, one row per row of the step), then
    /// their attention inputs (`attention_inputs`): the first step of a
    /// layer's attention block. `normed` is scratch.
    fn norm_qkv_attention_inputs(
        &self,
        x: &Self::Buffer,
        norm: Norm,
        normed: &mut Self::Buffer,
        qkv: &mut [Product<Self::Buffer>; 3],
        caches: &mut [&mut Self::KvCache],
        step: AttentionStep,
    ) -> Result<()> {
        fused::norm_qkv_attention_inputs(self, x, norm, normed, qkv, caches, step)
    }

    /// Per-head norms and RoPE of q and k, then k and v into the caches. q
    /// holds the rotated queries afterwards; k's contents are unspecified
    /// (the caches hold the rotated keys).
    fn attention_inputs(
        &self,
        caches: &mut [&mut Self::KvCache],
        step: AttentionStep,
        q: &mut Self::Buffer,
        k: &mut Self::Buffer,
        v: &Self::Buffer,
    ) -> Result<()> {
        fused::attention_inputs(self, caches, step, q, k, v)
    }
}

/// Products of many rows that a CPU stage of a split model hands to a GPU
/// of the same split (partial offload): its weights cross to the GPU for
/// each batch, which for a prompt chunk costs less than the CPU's compute.
pub trait ProductHelper: Send + Sync {
    /// Whether it computes products of weights of type `ty`.
    fn takes(&self, ty: GgmlType) -> bool;

    /// outs[i][..rows × ws[i].rows] = x · ws[i]ᵀ for `rows` rows of x
    /// (every weight as wide as x's rows, of types it takes). An error of
    /// kind `OutOfMemory` leaves these products to the caller.
    fn products(
        &self,
        ws: &[&Weight],
        x: &[f32],
        rows: usize,
        outs: &mut [&mut Vec<f32>],
    ) -> Result<()>;
}

/// The device a model runs on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Device {
    Cpu { threads: usize },
    Cuda { index: usize },
}

/// The device index `m40_model_default_params` proposes: the first CUDA device
/// when one is usable, else the CPU (-1).
pub fn default_device_index() -> i32 {
    #[cfg(feature = "cuda")]
    if cuda::device_count() > 0 {
        return 0;
    }
    -1
}

impl Device {
    /// The device for a host's `device` index and `n_threads` (0: one per core).
    pub fn select(index: i32, n_threads: u32) -> Result<Device> {
        // Checked whichever device is asked for, before the file is read.
        cpu::check_thread_count(n_threads as usize)?;
        match index {
            -1 => {
                let threads = match n_threads {
                    // One per core, within the pool's limit on machines
                    // with more cores than that.
                    0 => std::thread::available_parallelism()
                        .map_or(1, |n| n.get())
                        .min(cpu::MAX_THREADS),
                    n => n as usize,
                };
                Ok(Device::Cpu { threads })
            }
            i if i >= 0 => Self::select_cuda(i as usize),
            i => Err(Error::invalid_argument(format!(
                "device index {i} is invalid (-1 for the CPU, 0..N-1 for a CUDA device)"
            ))),
        }
    }

    #[cfg(feature = "cuda")]
    fn select_cuda(index: usize) -> Result<Device> {
        let count = cuda::runtime::device_count()
            .map_err(|e| e.context(format!("device {index} requested")))?;
        if index >= count {
            return Err(Error::invalid_argument(format!(
                "device {index} requested, but the driver reports {count} CUDA device(s) (use 0..{count} or -1 for the CPU)"
            )));
        }
        Ok(Device::Cuda { index })
    }

    #[cfg(not(feature = "cuda"))]
    fn select_cuda(index: usize) -> Result<Device> {
        Err(Error::unsupported(format!(
            "device {index} requested, but this build of libm40llm has no CUDA backend (build with --features cuda); use device -1 (CPU)"
        )))
    }

    /// The backend's short name, as `m40_model_describe` reports it.
    pub fn backend_name(&self) -> &'static str {
        match self {
            Device::Cpu { .. } => "cpu",
            Device::Cuda { .. } => "cuda",
        }
    }

    /// Memory free for a model's weights and caches now: a GPU's free
    /// device memory, or the host memory available to this process.
    pub fn free_memory(&self) -> Result<u64> {
        match self {
            Device::Cpu { .. } => Ok(crate::kv_cache::available_memory().unwrap_or(0)),
            #[cfg(feature = "cuda")]
            Device::Cuda { index } => {
                cuda::runtime::ensure_device(*index)?;
                Ok(cuda::runtime::memory_info()?.0 as u64)
            }
            #[cfg(not(feature = "cuda"))]
            Device::Cuda { .. } => {
                unreachable!("Device::select refuses CUDA devices in this build")
            }
        }
    }

    /// A human-readable device name (the CPU's model name where the OS tells it).
    pub fn name(&self) -> String {
        match self {
            Device::Cpu { .. } => {
                cpu_model_name().unwrap_or_else(|| std::env::consts::ARCH.to_string())
            }
            #[cfg(feature = "cuda")]
            Device::Cuda { index } => cuda::runtime::device_info(*index)
                .map_or_else(|_| format!("CUDA device {index}"), |i| i.name),
            #[cfg(not(feature = "cuda"))]
            Device::Cuda { index } => format!("CUDA device {index}"),
        }
    }
}

/// The backend a model computes with.
pub enum ModelBackend {
    Cpu(cpu::CpuBackend),
    #[cfg(feature = "cuda")]
    Cuda(Box<cuda::CudaBackend>),
}

/// One sequence's KV cache, on its model's backend.
pub enum SequenceCache {
    Cpu(KvCache),
    #[cfg(feature = "cuda")]
    Cuda(cuda::CudaKvCache),
}

impl SequenceCache {
    /// Whether the cache's recurrent states have taken in exactly `tokens`
    /// tokens (true where it has none).
    pub fn recurrent_holds(&self, tokens: usize) -> bool {
        match self {
            SequenceCache::Cpu(kv) => kv.recurrent_holds(tokens),
            #[cfg(feature = "cuda")]
            SequenceCache::Cuda(kv) => kv.recurrent_holds(tokens),
        }
    }

    /// Bytes the cache holds (keys, values and recurrent states).
    pub fn size_bytes(&self) -> usize {
        match self {
            SequenceCache::Cpu(kv) => kv.size_bytes(),
            #[cfg(feature = "cuda")]
            SequenceCache::Cuda(kv) => kv.size_bytes(),
        }
    }

    /// Every recurrent state back to that of no tokens.
    pub fn reset_recurrent(&mut self) {
        match self {
            SequenceCache::Cpu(kv) => kv.reset_recurrent(),
            #[cfg(feature = "cuda")]
            SequenceCache::Cuda(kv) => kv.reset_recurrent(),
        }
    }
}

/// The rows of one forward pass: each row's token and its sequence and
/// position, and the rows whose next-token logits are wanted.
#[derive(Clone, Copy, Debug)]
pub struct Batch<'a> {
    pub tokens: &'a [u32],
    pub rows: &'a [SeqPos],
    pub logit_rows: &'a [usize],
}

/// A forward pass written once against [`Backend`]: it enqueues its work on
/// whichever backend runs it and returns the buffer of its logits.
pub trait ForwardPass {
    fn enqueue<B: Backend>(&self, b: &B, caches: &mut [&mut B::KvCache]) -> Result<B::Buffer>;
}

impl ModelBackend {
    /// The backend for `device`, computing with the weights of `file` that
    /// `holds` names (a GPU uploads those; the others are never read). A
    /// CPU stage of a split that has a GPU (`gpu`) runs its products of
    /// many rows there, unless the environment says not to. The CUDA
    /// backend's options come from the environment
    /// (`cuda::CudaOptions::from_env`).
    pub fn new(
        device: &Device,
        file: Arc<GgufFile>,
        holds: &dyn Fn(&str) -> bool,
        gpu: Option<&Device>,
    ) -> Result<ModelBackend> {
        match *device {
            Device::Cpu { threads } => {
                let _ = holds;
                let helper = Self::product_helper(gpu, &file)?;
                Ok(ModelBackend::Cpu(
                    cpu::CpuBackend::new(file, threads)?.with_helper(helper),
                ))
            }
            #[cfg(feature = "cuda")]
            Device::Cuda { index } => {
                let options = cuda::CudaOptions::from_env();
                let backend = cuda::CudaBackend::new(file, index, options, holds)?;
                Ok(ModelBackend::Cuda(Box::new(backend)))
            }
            #[cfg(not(feature = "cuda"))]
            Device::Cuda { .. } => {
                unreachable!("Device::select refuses CUDA devices in this build")
            }
        }
    }

    /// The GPU products a CPU stage hands its large batches to, if any.
    fn product_helper(
        gpu: Option<&Device>,
        file: &Arc<GgufFile>,
    ) -> Result<Option<Box<dyn ProductHelper>>> {
        match gpu {
            #[cfg(feature = "cuda")]
            Some(&Device::Cuda { index }) => {
                let options = cuda::CudaOptions::from_env();
                if !options.offload_cpu_products {
                    return Ok(None);
                }
                let helper = cuda::GpuProducts::new(Arc::clone(file), index, options)?;
                Ok(Some(Box::new(helper)))
            }
            _ => {
                let _ = file;
                Ok(None)
            }
        }
    }

    /// A sequence's cache for `n_ctx` positions of the stage's `layers`
    /// (keys and values, or a recurrent state).
    pub fn kv_cache(&self, n_ctx: usize, layers: &[LayerState]) -> Result<SequenceCache> {
        Ok(match self {
            ModelBackend::Cpu(b) => SequenceCache::Cpu(b.kv_cache(n_ctx, layers)?),
            #[cfg(feature = "cuda")]
            ModelBackend::Cuda(b) => SequenceCache::Cuda(b.kv_cache(n_ctx, layers)?),
        })
    }

    /// Runs `pass` over `batch` with caches made by this backend: its
    /// output rows (`row_len` values each from the start of the buffer the
    /// pass returns) go to `out`: logits replacing the contents of a vector,
    /// whose allocation is reused, or a sampler's candidates. `input` is the
    /// step's first activations when the previous stage of a split model
    /// computed them (the pass reads them through `Backend::step_input`).
    /// On failure no output is touched. The CUDA backend replays decode
    /// steps it has recorded (see `cuda::CudaBackend::run_step`).
    pub fn run_step(
        &self,
        caches: &mut [&mut SequenceCache],
        batch: Batch,
        input: Option<&[f32]>,
        row_len: usize,
        out: &mut StepOutput,
        pass: &impl ForwardPass,
    ) -> Result<()> {
        let mismatch = || Error::internal("a session's KV cache is not on its model's backend");
        match self {
            ModelBackend::Cpu(b) => {
                // The pass reads `input` itself; only a recorded step needs
                // the batch and input apart from it.
                let _ = (batch, input);
                let mut own = caches
                    .iter_mut()
                    .map(|c| match &mut **c {
                        SequenceCache::Cpu(kv) => Ok(kv),
                        #[allow(unreachable_patterns)]
                        _ => Err(mismatch()),
                    })
                    .collect::<Result<Vec<_>>>()?;
                let device = pass.enqueue(b, &mut own)?;
                out.read(b, &device, row_len)
            }
            #[cfg(feature = "cuda")]
            ModelBackend::Cuda(b) => {
                let mut own = caches
                    .iter_mut()
                    .map(|c| match &mut **c {
                        SequenceCache::Cuda(kv) => Ok(kv),
                        _ => Err(mismatch()),
                    })
                    .collect::<Result<Vec<_>>>()?;
                b.run_step(&mut own, batch, input, row_len, out, |caches| {
                    pass.enqueue(&**b, caches)
                })
            }
        }
    }

    /// The device's part of `m40_model_describe` beyond the [`Device`]
    /// itself: for a GPU, its compute capability, libraries and memory.
    pub(crate) fn describe(&self, j: &mut JsonObject) {
        match self {
            // The Device says all there is to say of a CPU.
            ModelBackend::Cpu(_) => {
                let _ = j;
            }
            #[cfg(feature = "cuda")]
            ModelBackend::Cuda(b) => b.describe(j),
        }
    }
}

fn cpu_model_name() -> Option<String> {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    cpuinfo.lines().find_map(|line| {
        line.strip_prefix("model name")?
            .split_once(':')
            .map(|(_, v)| v.trim().to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn rows_are_filled_in_order_by_one_thread_or_several() {
        // 5 rows of 3 values (one thread), and 5 rows of 2^19 values (10
        // MiB: several threads, the last one's share shorter).
        for row_len in [3, 1 << 19] {
            let values: Vec<f32> = (0..5 * row_len).map(|i| i as f32).collect();
            let mut storage: Vec<Vec<f32>> = (0..5).map(|i| vec![-1.0; i]).collect();
            let mut rows: Vec<&mut Vec<f32>> = storage.iter_mut().collect();
            fill_rows(&values, row_len, &mut rows);
            for (i, row) in storage.iter().enumerate() {
                assert_eq!(row[..], values[i * row_len..(i + 1) * row_len], "row {i}");
            }
        }
    }

    #[test]
    fn cpu_is_device_minus_one_and_zero_threads_means_all_cores() {
        let Device::Cpu { threads } = Device::select(-1, 0).unwrap() else {
            panic!("-1 is the CPU")
        };
        assert!(threads >= 1);
        assert_eq!(Device::select(-1, 3).unwrap(), Device::Cpu { threads: 3 });
    }

    #[test]
    fn bad_device_indices_are_rejected_with_reasons() {
        assert_eq!(
            Device::select(-2, 1).unwrap_err().kind(),
            ErrorKind::InvalidArgument
        );
        #[cfg(not(feature = "cuda"))]
        {
            let err = Device::select(0, 1).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Unsupported);
            assert!(err.message().contains("no CUDA backend"), "{err}");
        }
        #[cfg(feature = "cuda")]
        {
            let err = Device::select(1000, 1).unwrap_err();
            assert!(err.message().contains("device 1000 requested"), "{err}");
        }
    }
}
