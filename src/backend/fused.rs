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

/// A mixture-of-experts feed-forward block: a router and `n_expert`
/// gated feed-forward blocks, stacked in 3-D tensors (see [`Weight::part`]).
/// Each row uses the `n_used` experts its router ranks highest.
#[derive(Clone, Copy, Debug)]
pub struct Experts {
    /// `n_expert` rows: the router logits are router · h.
    pub router: Weight,
    pub gate: Weight,
    pub up: Weight,
    pub down: Weight,
    pub n_expert: usize,
    pub n_used: usize,
    /// The biases of the router and of every expert's products (gpt-oss).
    pub biases: Option<ExpertBiases>,
}

/// The biases of a mixture's products, each added to its product's output:
/// one for the router (`n_expert` values), and one row per expert for each
/// of the gate, up and down products (expert e's is row e).
#[derive(Clone, Copy, Debug)]
pub struct ExpertBiases {
    pub router: Weight,
    pub gate: Weight,
    pub up: Weight,
    pub down: Weight,
}

impl Experts {
    /// Expert `e`'s gate, up and down matrices.
    pub fn expert(&self, e: usize) -> [Weight; 3] {
        [self.gate, self.up, self.down].map(|w| w.part(e, self.n_expert))
    }
}

impl ExpertBiases {
    /// Expert `e`'s gate, up and down biases.
    pub fn expert(&self, e: usize, n_expert: usize) -> [Weight; 3] {
        [self.gate, self.up, self.down].map(|w| w.part(e, n_expert))
    }
}

/// An expert every row uses beside its routed ones, its output scaled by
/// σ(gate_inp · h) (Qwen3.5 MoE).
#[derive(Clone, Copy, Debug)]
pub struct SharedExpert {
    /// One row: the gate's projection.
    pub gate_inp: Weight,
    pub gate: Weight,
    pub up: Weight,
    pub down: Weight,
}

/// The shared expert's intermediates, one buffer each.
pub struct SharedScratch<'a, Buf> {
    pub gate: &'a mut Buf,
    pub up: &'a mut Buf,
    pub act: &'a mut Buf,
    /// gate_inp · h, one value a row.
    pub logit: &'a mut Buf,
    pub out: &'a mut Buf,
}

/// The smallest sum of the chosen experts' probabilities that their
/// renormalization divides by (llama.cpp's clamp: 2^-14, the smallest
/// normal f16).
const MIN_WEIGHT_SUM: f32 = 1.0 / 16_384.0;

/// The experts one row uses and their weights, as llama.cpp's
/// `build_moe_ffn` chooses them for LLaMA (Mixtral) and Qwen3-MoE: the
/// softmax of the router logits, the `n_used` most probable experts (in
/// decreasing probability; ties to the lower index), their probabilities
/// renormalized to sum to 1. That is also gpt-oss's gating
/// (`SOFTMAX_WEIGHT`: the `n_used` largest logits, weighted by the softmax
/// of those alone): both weight expert e by e^(l_e) / Σ_chosen e^(l_c).
pub fn route(logits: &[f32], n_used: usize) -> Vec<(usize, f32)> {
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    let exps: Vec<f32> = logits.iter().map(|&l| (l - max).exp()).collect();
    let sum: f64 = exps.iter().map(|&e| f64::from(e)).sum();
    let inv = (1.0 / sum) as f32;
    let probs: Vec<f32> = exps.iter().map(|&e| e * inv).collect();
    let mut order: Vec<usize> = (0..logits.len()).collect();
    // Stable: equal probabilities keep their index order.
    order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]));
    order.truncate(n_used);
    let chosen: f32 = order.iter().map(|&e| probs[e]).sum();
    let chosen = chosen.max(MIN_WEIGHT_SUM);
    order.into_iter().map(|e| (e, probs[e] / chosen)).collect()
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
    let ws: Vec<&Weight> = products.iter().map(|p| p.w).collect();
    let mut outs: Vec<&mut B::Buffer> = products.iter_mut().map(|p| &mut *p.out).collect();
    b.matmuls(&ws, normed, rows, &mut outs)?;
    for p in products.iter_mut() {
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
    let mut outs = [&mut *scratch.product, &mut *scratch.product2];
    b.matmuls(&[ffn.gate, ffn.up], scratch.normed, rows, &mut outs)?;
    b.glu(
        ffn.glu,
        scratch.product,
        scratch.product2,
        rows * ffn.gate.rows,
        out,
    )
}

/// x += post_norm(mixture(h)) + σ(gate_inp · h) · shared(h) for `rows`
/// rows of h = norm(x): the shared expert reads h before the mixture adds
/// to x.
#[allow(clippy::too_many_arguments)]
pub fn norm_moe_shared_ffn_residual<B: Backend + ?Sized>(
    b: &B,
    x: &mut B::Buffer,
    norm: Norm,
    rows: usize,
    experts: &Experts,
    shared: &SharedExpert,
    glu: Glu,
    post_norm: Option<Norm>,
    scratch: Scratch<B::Buffer>,
    shared_scratch: SharedScratch<B::Buffer>,
) -> Result<()> {
    let s = shared_scratch;
    let mut products = [
        (&shared.gate, &mut *s.gate),
        (&shared.up, &mut *s.up),
        (&shared.gate_inp, &mut *s.logit),
    ]
    .map(|(w, out)| Product { w, bias: None, out });
    b.norm_matmuls(x, norm, rows, scratch.normed, &mut products)?;
    b.glu(glu, s.gate, s.up, rows * shared.gate.rows, s.act)?;
    b.matmul(&shared.down, s.act, rows, s.out)?;
    b.norm_moe_ffn_residual(x, norm, rows, experts, glu, post_norm, scratch)?;
    b.gated_add(x, s.out, s.logit, rows, experts.router.cols)
}

/// x += post_norm(a · Wᵀ + bias) (the bias and the norm only where the
/// model has them).
#[allow(clippy::too_many_arguments)]
pub fn matmul_residual<B: Backend + ?Sized>(
    b: &B,
    w: &Weight,
    bias: Option<&Weight>,
    a: &B::Buffer,
    rows: usize,
    post_norm: Option<Norm>,
    product: &mut B::Buffer,
    x: &mut B::Buffer,
) -> Result<()> {
    b.matmul(w, a, rows, product)?;
    if let Some(bias) = bias {
        b.add_bias(product, bias, rows)?;
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_takes_the_most_probable_experts_and_renormalizes_their_weights() {
        // softmax of ln(1, 4, 2, 3) is (0.1, 0.4, 0.2, 0.3): the top two are
        // experts 1 and 3, weighted 0.4 / 0.7 and 0.3 / 0.7.
        let logits = [1f32, 4.0, 2.0, 3.0].map(f32::ln);
        let chosen = route(&logits, 2);
        assert_eq!(chosen.iter().map(|c| c.0).collect::<Vec<_>>(), [1, 3]);
        assert!((chosen[0].1 - 4.0 / 7.0).abs() < 1e-6, "{chosen:?}");
        assert!((chosen[1].1 - 3.0 / 7.0).abs() < 1e-6, "{chosen:?}");
        // every expert: the weights are the softmax itself
        let all = route(&logits, 4);
        let weights: Vec<f32> = all.iter().map(|c| c.1).collect();
        assert_eq!(all.iter().map(|c| c.0).collect::<Vec<_>>(), [1, 3, 2, 0]);
        for (w, expected) in weights.iter().zip([0.4, 0.3, 0.2, 0.1]) {
            assert!((w - expected).abs() < 1e-6, "{weights:?}");
        }
        // one expert: weight 1
        assert_eq!(route(&logits, 1), [(1, 1.0)]);
    }

    #[test]
    fn gpt_oss_routing_weights_the_top_biased_logits_by_their_own_softmax() {
        // llama.cpp's SOFTMAX_WEIGHT gating (build_moe_ffn): the router's
        // bias is added to its logits, the `n_used` largest are chosen and
        // weighted by the softmax of those alone. Logits (1, 3, 2, 0.5) plus
        // bias (0, −2.5, 0.5, 1) are (1, 0.5, 2.5, 1.5): experts 2 and 3,
        // weighted by softmax(2.5, 1.5) = 1 / (1 + e^−1) = 0.731059 and
        // e^−1 / (1 + e^−1) = 0.268941.
        let logits = [1.0f32, 3.0, 2.0, 0.5];
        let bias = [0.0f32, -2.5, 0.5, 1.0];
        let biased: Vec<f32> = logits.iter().zip(&bias).map(|(l, b)| l + b).collect();
        let chosen = route(&biased, 2);
        assert_eq!(chosen.iter().map(|c| c.0).collect::<Vec<_>>(), [2, 3]);
        assert!((chosen[0].1 - 0.731_058_6).abs() < 1e-6, "{chosen:?}");
        assert!((chosen[1].1 - 0.268_941_4).abs() < 1e-6, "{chosen:?}");
    }

    #[test]
    fn route_breaks_ties_toward_the_lower_index() {
        assert_eq!(route(&[0.5, 2.0, 2.0, 2.0], 2), [(1, 0.5), (2, 0.5)]);
    }

    #[test]
    fn expert_parts_are_contiguous_slices_of_whole_rows() {
        let w = Weight {
            ty: crate::quant::GgmlType::F32,
            rows: 6,
            cols: 4,
            offset: 100,
            n_bytes: 96,
        };
        let p = w.part(2, 3);
        assert_eq!((p.rows, p.cols, p.offset, p.n_bytes), (2, 4, 164, 32));
    }
}
