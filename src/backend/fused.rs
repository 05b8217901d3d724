//! The fused steps of a transformer layer, as the forward pass calls them,
//! and their composition from the primitive [`Backend`] operations. The
//! composition is the definition: it is what the trait's default methods run
//! (the CPU backend), what the CUDA backend falls back to for shapes its
//! fused kernels do not take (prefill), and what the GPU tests compare the
//! fused kernels against.

use super::{Backend, Glu, Rope, SeqPos, Weight};
use crate::error::Result;

/// RMSNorm weights and their epsilon.
#[derive(Clone, Copy, Debug)]
pub struct Norm<'a> {
    pub weight: &'a Weight,
    pub eps: f32,
}

/// One matrix product of a fused step: out = input · Wᵀ (+ bias).
pub struct Product<'a, Buf> {
    pub w: &'a Weight,
    pub bias: Option<&'a Weight>,
    pub out: &'a mut Buf,
}

/// The gated feed-forward input: act(input · gateᵀ) · (input · upᵀ).
#[derive(Clone, Copy, Debug)]
pub struct GatedFfn<'a> {
    pub gate: &'a Weight,
    pub up: &'a Weight,
    pub glu: Glu,
}

/// Head layout of one layer's attention inputs.
#[derive(Clone, Copy, Debug)]
pub struct Heads {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim_k: usize,
    pub head_dim_v: usize,
}

/// One layer's attention-input step for a set of rows: the layer (of the
/// rows' caches), the rows (sequence and position of each), their heads,
/// the per-head norms where the model has them, and RoPE.
#[derive(Clone, Copy, Debug)]
pub struct AttentionStep<'a> {
    pub layer: usize,
    pub rows: &'a [SeqPos],
    pub heads: Heads,
    pub qk_norm: Option<(Norm<'a>, Norm<'a>)>,
    pub rope: &'a Rope<'a>,
}

/// Scratch a composed step may use, one buffer per intermediate.
pub struct Scratch<'a, Buf> {
    /// The normalized input rows.
    pub normed: &'a mut Buf,
    /// A product before its activation or residual add.
    pub product: &'a mut Buf,
    /// The second product of a gated feed-forward (up).
    pub product2: &'a mut Buf,
}

/// h = norm(x) for `rows` rows, then every product reads h.
pub fn norm_matmuls<B: Backend + ?Sized>(
    b: &B,
    x: &B::Buffer,
    norm: Norm,
    rows: usize,
    normed: &mut B::Buffer,
    products: &mut [Product<B::Buffer>],
) -> Result<()> {
    normalize(b, x, norm, rows, normed)?;
    for p in products.iter_mut() {
        b.matmul(p.w, normed, rows, p.out)?;
        if let Some(bias) = p.bias {
            b.add_bias(p.out, bias, rows)?;
        }
    }
    Ok(())
}

/// out = act(norm(x) · gateᵀ) · (norm(x) · upᵀ).
pub fn norm_gated_ffn<B: Backend + ?Sized>(
    b: &B,
    x: &B::Buffer,
    norm: Norm,
    rows: usize,
    ffn: GatedFfn,
    scratch: Scratch<B::Buffer>,
    out: &mut B::Buffer,
) -> Result<()> {
    normalize(b, x, norm, rows, scratch.normed)?;
    b.matmul(ffn.gate, scratch.normed, rows, scratch.product)?;
    b.matmul(ffn.up, scratch.normed, rows, scratch.product2)?;
    b.glu(
        ffn.glu,
        scratch.product,
        scratch.product2,
        rows * ffn.gate.rows,
        out,
    )
}

/// x += post_norm(a · Wᵀ) (the norm only where the model has one).
pub fn matmul_residual<B: Backend + ?Sized>(
    b: &B,
    w: &Weight,
    a: &B::Buffer,
    rows: usize,
    post_norm: Option<Norm>,
    product: &mut B::Buffer,
    x: &mut B::Buffer,
) -> Result<()> {
    b.matmul(w, a, rows, product)?;
    if let Some(n) = post_norm {
        b.rms_norm(product, n.weight, n.eps, rows * w.rows)?;
    }
    b.add(x, product, rows * w.rows)
}

/// Per-head norms (where the model has them) and RoPE of q and k, then the
/// rows' keys and values into their caches.
pub fn attention_inputs<B: Backend + ?Sized>(
    b: &B,
    caches: &mut [&mut B::KvCache],
    step: AttentionStep,
    q: &mut B::Buffer,
    k: &mut B::Buffer,
    v: &B::Buffer,
) -> Result<()> {
    let AttentionStep {
        layer,
        rows,
        heads,
        qk_norm,
        rope,
    } = step;
    let n = rows.len();
    if let Some((qn, kn)) = qk_norm {
        b.rms_norm(q, qn.weight, qn.eps, n * heads.n_head * heads.head_dim_k)?;
        b.rms_norm(k, kn.weight, kn.eps, n * heads.n_head_kv * heads.head_dim_k)?;
    }
    b.rope(q, heads.n_head, heads.head_dim_k, rows, rope)?;
    b.rope(k, heads.n_head_kv, heads.head_dim_k, rows, rope)?;
    b.store_kv(caches, layer, k, v, rows)
}

/// q, k and v of norm(x) for each of the step's rows, then their attention
/// inputs.
pub fn norm_qkv_attention_inputs<B: Backend + ?Sized>(
    b: &B,
    x: &B::Buffer,
    norm: Norm,
    normed: &mut B::Buffer,
    qkv: &mut [Product<B::Buffer>; 3],
    caches: &mut [&mut B::KvCache],
    step: AttentionStep,
) -> Result<()> {
    b.norm_matmuls(x, norm, step.rows.len(), normed, qkv)?;
    let [q, k, v] = qkv;
    b.attention_inputs(caches, step, q.out, k.out, v.out)
}

/// normed = norm(x) for `rows` rows of the norm's width.
fn normalize<B: Backend + ?Sized>(
    b: &B,
    x: &B::Buffer,
    norm: Norm,
    rows: usize,
    normed: &mut B::Buffer,
) -> Result<()> {
    let width = norm.weight.cols * norm.weight.rows;
    let all: Vec<usize> = (0..rows).collect();
    b.gather_rows(x, width, &all, normed)?;
    b.rms_norm(normed, norm.weight, norm.eps, rows * width)
}
