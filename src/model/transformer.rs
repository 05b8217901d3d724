//! The transformer forward pass shared by LLaMA (Mixtral's experts
//! included), Qwen2, Qwen3 (dense and MoE), Gemma 3, Qwen3.5 (dense and
//! MoE), gpt-oss and Gemma 4, written once against the [`Backend`]
//! interface. Read top to bottom it is the whole model: embed, then per
//! layer a mixing block (attention, or Qwen3.5's Gated DeltaNet) and a
//! feed-forward block with their residuals, then the output norm and
//! projection (and Gemma 4's soft-capping).
//!
//! A batch is a list of rows, each a token at a position of some sequence
//! (a prompt chunk is many rows of one sequence; a batched decode one row of
//! each of several sequences). Every row's key and value are written to its
//! sequence's cache before attention, so causal attention is simply "each row
//! over its sequence's positions up to its own".

use std::ops::Range;

use super::{ArchTraits, FeedForward, HyperParams, Mixer, Model, Weight, Weights};
use crate::backend::{
    AttentionShape, AttentionStep, Backend, Batch, DeltaNetShape, DeltaNetStep, ForwardPass,
    GatedFfn, Glu, Heads, Norm, Product, Rope, Scratch, SeqPos, SequenceCache, SharedScratch,
    StepOutput,
};
use crate::error::Result;

/// [`forward`] on the model's own devices, each session's caches one per
/// stage of the model (see [`Model::stages`]), the logits of
/// `logit_rows[i]` going to row i of `out` (replacing the contents of a
/// vector, whose allocation is reused, or a sampler's candidates). A split
/// model runs its stages in order, each passing the activations of every
/// row to the next through the host. On failure no output is touched.
pub fn run(
    model: &Model,
    caches: &mut [&mut [SequenceCache]],
    tokens: &[u32],
    rows: &[SeqPos],
    logit_rows: &[usize],
    out: &mut StepOutput,
) -> Result<()> {
    assert_eq!(out.len(), logit_rows.len());
    let stages = model.stages();
    let hp = model.config().1;
    let (n_vocab, width) = (hp.n_vocab as usize, hp.n_embd as usize);
    let mut hidden = Vec::new();
    for (i, stage) in stages.iter().enumerate() {
        let last = i + 1 == stages.len();
        let mut own: Vec<&mut SequenceCache> = caches.iter_mut().map(|c| &mut c[i]).collect();
        let input = (i > 0).then_some(&hidden[..]);
        let part = StagePart {
            layers: stage.layers.clone(),
            input,
            last,
        };
        // Every stage sees the caller's wanted rows, so that each takes a
        // step for what it is (a decode step is recorded and replayed on a
        // GPU, a prompt chunk is not); a stage before the last hands on
        // every row all the same.
        let batch = Batch {
            tokens,
            rows,
            logit_rows,
        };
        let pass = Pass { model, batch, part };
        if last {
            stage
                .backend
                .run_step(&mut own, batch, input, n_vocab, out, &pass)?;
        } else {
            let mut next = Vec::new();
            let mut slots = [&mut next];
            let mut activations = StepOutput::Logits(&mut slots);
            let len = rows.len() * width;
            stage
                .backend
                .run_step(&mut own, batch, input, len, &mut activations, &pass)?;
            hidden = next;
        }
    }
    Ok(())
}

/// What one stage of a (possibly split) model computes: its layers, from
/// the previous stage's activations (`input`) or, on the first stage, from
/// the tokens; up to the logits on the last stage, else up to the
/// activations the next stage starts from.
#[derive(Clone)]
pub struct StagePart<'a> {
    pub layers: Range<usize>,
    pub input: Option<&'a [f32]>,
    pub last: bool,
}

/// The forward pass of one stage over one batch, for whichever backend runs it.
struct Pass<'a> {
    model: &'a Model,
    batch: Batch<'a>,
    part: StagePart<'a>,
}

impl ForwardPass for Pass<'_> {
    fn enqueue<B: Backend>(&self, b: &B, caches: &mut [&mut B::KvCache]) -> Result<B::Buffer> {
        let Batch {
            tokens,
            rows,
            logit_rows,
        } = self.batch;
        stage_on_device(b, self.model, &self.part, caches, tokens, rows, logit_rows)
    }
}

/// Logits for `logit_rows` of the batch (`logit_rows.len() × n_vocab`).
pub fn forward<B: Backend>(
    b: &B,
    model: &Model,
    caches: &mut [&mut B::KvCache],
    tokens: &[u32],
    rows: &[SeqPos],
    logit_rows: &[usize],
) -> Result<Vec<f32>> {
    let device = logits_on_device(b, model, caches, tokens, rows, logit_rows)?;
    let mut logits = vec![0f32; logit_rows.len() * model.config().1.n_vocab as usize];
    b.read(&device, &mut logits)?;
    Ok(logits)
}

/// [`forward`] up to its logits in the backend's buffer: only enqueued
/// work, so that a backend can record it and replay it.
pub fn logits_on_device<B: Backend>(
    b: &B,
    model: &Model,
    caches: &mut [&mut B::KvCache],
    tokens: &[u32],
    rows: &[SeqPos],
    logit_rows: &[usize],
) -> Result<B::Buffer> {
    let whole = StagePart {
        layers: 0..model.config().1.n_layer as usize,
        input: None,
        last: true,
    };
    stage_on_device(b, model, &whole, caches, tokens, rows, logit_rows)
}

/// One stage's part of the forward pass, enqueued on `b`: its layers (the
/// caches hold those layers only, the stage's first at index 0), then the
/// logits of `logit_rows` on the last stage, or the activations of every
/// row (`rows × n_embd`) on any other.
fn stage_on_device<B: Backend>(
    b: &B,
    model: &Model,
    part: &StagePart,
    caches: &mut [&mut B::KvCache],
    tokens: &[u32],
    rows: &[SeqPos],
    logit_rows: &[usize],
) -> Result<B::Buffer> {
    let (arch, hp) = model.config();
    let t: ArchTraits = arch.traits();
    let w: &Weights = model.weights();
    let n = tokens.len();
    let d = hp.n_embd as usize;
    let n_head = hp.n_head as usize;
    // Attention scratch as wide as the widest layer's (Gemma 4's layers
    // differ).
    let widest = |width: &dyn Fn(&Heads) -> usize| {
        part.layers
            .clone()
            .map(|il| width(&layer_heads(hp, il)))
            .max()
            .unwrap_or(0)
    };
    let q_width = widest(&|h| h.n_head * h.head_dim_k);
    let kv_width_k = widest(&|h| h.n_head_kv * h.head_dim_k);
    let kv_width_v = widest(&|h| h.n_head_kv * h.head_dim_v);
    let o_width = widest(&|h| h.n_head * h.head_dim_v);
    // Dense feed-forward scratch (a MoE model needs none of it).
    let ff = if hp.is_moe() { 0 } else { hp.n_ff as usize };

    let mut x = b.buffer(n * d)?;
    let mut h = b.buffer(n * d)?;
    let mut q = b.buffer(n * q_width)?;
    let mut k = b.buffer(n * kv_width_k)?;
    let mut v = b.buffer(n * kv_width_v)?;
    let mut attn = b.buffer(n * o_width)?;
    let mut o = b.buffer(n * d)?;
    let mut gate = b.buffer(n * ff)?;
    let mut up = b.buffer(n * ff)?;
    let mut act = b.buffer(n * ff)?;
    let norm = |weight| Norm {
        weight,
        eps: hp.rms_eps,
    };

    let embedding_scale = if t.embedding_scaled {
        (d as f32).sqrt()
    } else {
        1.0
    };
    match part.input {
        Some(input) => b.step_input(input, &mut x)?,
        None => b.embed(&w.token_embd, tokens, embedding_scale, &mut x)?,
    }

    // A hybrid model's scratch: its attention layers' gated queries (every
    // attention layer of a hybrid model gates its output), and its Gated
    // DeltaNet layers' inputs and outputs.
    let gated = hp.delta_net.is_some();
    let mut q_gated = b.buffer(if gated { 2 * n * q_width } else { 0 })?;
    let mut q_gate = b.buffer(if gated { n * q_width } else { 0 })?;
    let net = hp.delta_net.map(|p| p.shape());
    let net_len = |width: fn(&DeltaNetShape) -> usize| net.as_ref().map_or(0, |s| n * width(s));
    let mut net_qkv = b.buffer(net_len(DeltaNetShape::channels))?;
    let mut net_z = b.buffer(net_len(DeltaNetShape::value_width))?;
    let mut net_alpha = b.buffer(net_len(|s| s.n_v_heads))?;
    let mut net_beta = b.buffer(net_len(|s| s.n_v_heads))?;
    let mut net_out = b.buffer(net_len(DeltaNetShape::value_width))?;
    let mut net_gated = b.buffer(net_len(DeltaNetShape::value_width))?;

    // The shared expert's scratch (Qwen3.5 MoE).
    let shared = hp.n_ff_shared as usize;
    let mut shared_gate = b.buffer(n * shared)?;
    let mut shared_up = b.buffer(n * shared)?;
    let mut shared_act = b.buffer(n * shared)?;
    let mut shared_logit = b.buffer(if shared > 0 { n } else { 0 })?;
    let mut shared_out = b.buffer(if shared > 0 { n * d } else { 0 })?;

    // Every row of the step, in order: the rows Gemma 4's full-attention
    // layers copy from their keys into their values.
    let every_row: Vec<usize> = (0..n).collect();
    for (il, lw) in w.layers[part.layers.clone()].iter().enumerate() {
        let model_layer = part.layers.start + il;
        let heads = layer_heads(hp, model_layer);
        let (rope, window) = layer_attention(hp, &t, w, model_layer);
        let shape = AttentionShape {
            n_head,
            n_head_kv: heads.n_head_kv,
            head_dim_k: heads.head_dim_k,
            head_dim_v: heads.head_dim_v,
            window,
            scale: t
                .attention_scale
                .unwrap_or(1.0 / (heads.head_dim_k as f32).sqrt()),
            sinks: lw.attention().and_then(|aw| aw.sinks),
        };

        match &lw.mixer {
            // Attention block: q, k, v of norm(x) (v: k's projection where
            // the layer has none, Gemma 4's full-attention layers; each value
            // head RMS-normed where the architecture says); rotate and cache;
            // attend; x += (post-norm of) the output projection, plus its
            // bias where it has one (of the output gated by σ(gate) where
            // each head's queries carry a gate).
            Mixer::Attention(aw) => {
                let qk_norm = aw.q_norm.as_ref().zip(aw.k_norm.as_ref());
                let step = AttentionStep {
                    layer: il,
                    rows,
                    heads,
                    qk_norm: qk_norm.map(|(qn, kn)| (norm(qn), norm(kn))),
                    rope: &rope,
                };
                let attn_norm = norm(&lw.attn_norm);
                match (&aw.wv, aw.gated_output || t.value_norm) {
                    // The values go to the cache as projected: one fused step.
                    (Some(wv), false) => {
                        let mut products = [
                            product(&aw.wq, &aw.bq, &mut q),
                            product(&aw.wk, &aw.bk, &mut k),
                            product(wv, &aw.bv, &mut v),
                        ];
                        b.norm_qkv_attention_inputs(
                            &x,
                            attn_norm,
                            &mut h,
                            &mut products,
                            caches,
                            step,
                        )?;
                    }
                    (wv, _) => {
                        {
                            let q_out = if aw.gated_output {
                                &mut q_gated
                            } else {
                                &mut q
                            };
                            let mut products = vec![
                                product(&aw.wq, &aw.bq, q_out),
                                product(&aw.wk, &aw.bk, &mut k),
                            ];
                            if let Some(wv) = wv {
                                products.push(product(wv, &aw.bv, &mut v));
                            }
                            b.norm_matmuls(&x, attn_norm, n, &mut h, &mut products)?;
                        }
                        if aw.gated_output {
                            let hd_k = heads.head_dim_k;
                            b.split_halves(&q_gated, n * n_head, hd_k, &mut q, &mut q_gate)?;
                        }
                        let v_width = heads.n_head_kv * heads.head_dim_v;
                        if wv.is_none() {
                            // The keys' values before their norm and RoPE
                            // (the hyper-parameters make keys and values
                            // equally wide then).
                            b.gather_rows(&k, v_width, &every_row, &mut v)?;
                        }
                        if t.value_norm {
                            b.rms_normalize(&mut v, heads.head_dim_v, hp.rms_eps, n * v_width)?;
                        }
                        b.attention_inputs(caches, step, &mut q, &mut k, &v)?;
                    }
                }
                b.attention(caches, il, &q, rows, &shape, &mut attn)?;
                if aw.gated_output {
                    b.sigmoid_gate(&mut attn, &q_gate, n * n_head * heads.head_dim_v)?;
                }
                let post_attn = lw.post_attn_norm.as_ref().map(norm);
                let bo = aw.bo.as_ref();
                b.matmul_residual(&aw.wo, bo, &attn, n, post_attn, &mut o, &mut x)?;
            }
            // Gated DeltaNet block: q, k, v (convolved), the output gate z
            // and each value head's decay and write strength from norm(x);
            // the recurrence; each head's output RMS-normed and gated by
            // SiLU(z); x += its projection.
            Mixer::DeltaNet(dw) => {
                let s = net.expect("a model with DeltaNet layers has their shape");
                let mut products = [
                    (&dw.qkv, &mut net_qkv),
                    (&dw.gate, &mut net_z),
                    (&dw.alpha, &mut net_alpha),
                    (&dw.beta, &mut net_beta),
                ]
                .map(|(w, out)| Product { w, bias: None, out });
                b.norm_matmuls(&x, norm(&lw.attn_norm), n, &mut h, &mut products)?;
                let step = DeltaNetStep {
                    layer: il,
                    rows,
                    shape: s,
                    conv: &dw.conv,
                    dt_bias: &dw.dt_bias,
                    a: &dw.a,
                    eps: hp.rms_eps,
                };
                b.delta_net(caches, step, &net_qkv, &net_alpha, &net_beta, &mut net_out)?;
                let width = n * s.value_width();
                b.rms_norm(&mut net_out, &dw.norm, hp.rms_eps, width)?;
                b.glu(Glu::Swiglu, &net_z, &net_out, width, &mut net_gated)?;
                b.matmul_residual(&dw.out, None, &net_gated, n, None, &mut o, &mut x)?;
            }
        }

        // Feed-forward block: x += (post-norm of) down(act(gate(h)) · up(h)),
        // h = norm(x); with experts, x += (post-norm of) the sum of each
        // row's routed experts' outputs, weighted by the router.
        let post_ffn = lw.post_ffn_norm.as_ref().map(norm);
        match &lw.ffn {
            FeedForward::Dense {
                gate: w_gate,
                up: w_up,
                down: w_down,
            } => {
                let ffn = GatedFfn {
                    gate: w_gate,
                    up: w_up,
                    glu: t.glu,
                };
                let scratch = Scratch {
                    normed: &mut h,
                    product: &mut gate,
                    product2: &mut up,
                };
                b.norm_gated_ffn(&x, norm(&lw.ffn_norm), n, ffn, scratch, &mut act)?;
                b.matmul_residual(w_down, None, &act, n, post_ffn, &mut o, &mut x)?;
            }
            FeedForward::Experts(experts) => {
                let scratch = Scratch {
                    normed: &mut h,
                    product: &mut o,
                    product2: &mut up,
                };
                let ffn_norm = norm(&lw.ffn_norm);
                match &lw.shared_expert {
                    Some(shared) => {
                        let shared_scratch = SharedScratch {
                            gate: &mut shared_gate,
                            up: &mut shared_up,
                            act: &mut shared_act,
                            logit: &mut shared_logit,
                            out: &mut shared_out,
                        };
                        b.norm_moe_shared_ffn_residual(
                            &mut x,
                            ffn_norm,
                            n,
                            experts,
                            shared,
                            t.glu,
                            post_ffn,
                            scratch,
                            shared_scratch,
                        )?
                    }
                    None => b.norm_moe_ffn_residual(
                        &mut x, ffn_norm, n, experts, t.glu, post_ffn, scratch,
                    )?,
                }
            }
        }
        // The layer's output, residual included, times its scale.
        if let Some(scale) = &lw.output_scale {
            b.scale_by(&mut x, scale, n * d)?;
        }
    }

    if !part.last {
        return Ok(x);
    }
    // Output: only the rows whose next-token logits are wanted.
    let n_out = logit_rows.len();
    let n_vocab = hp.n_vocab as usize;
    let mut last = b.buffer(n_out * d)?;
    b.gather_rows(&x, d, logit_rows, &mut last)?;
    let mut logits_dev = b.buffer(n_out * n_vocab)?;
    let mut output = [Product {
        w: &w.output,
        bias: None,
        out: &mut logits_dev,
    }];
    b.norm_matmuls(&last, norm(&w.output_norm), n_out, &mut h, &mut output)?;
    if let Some(cap) = hp.final_logit_softcap {
        b.soft_cap(&mut logits_dev, cap, n_out * n_vocab)?;
    }
    Ok(logits_dev)
}

/// out = input · Wᵀ, plus the bias where there is one.
fn product<'a, Buf>(w: &'a Weight, bias: &'a Option<Weight>, out: &'a mut Buf) -> Product<'a, Buf> {
    Product {
        w,
        bias: bias.as_ref(),
        out,
    }
}

/// Layer `il`'s attention heads: its KV heads and head widths (Gemma 4's
/// sliding-window and full-attention layers differ).
fn layer_heads(hp: &HyperParams, il: usize) -> Heads {
    let h = hp.heads(il);
    Heads {
        n_head: hp.n_head as usize,
        n_head_kv: h.n_head_kv as usize,
        head_dim_k: h.head_dim_k as usize,
        head_dim_v: h.head_dim_v as usize,
    }
}

/// Layer `il`'s RoPE and attention window: the sliding-window layers (Gemma
/// 3's and Gemma 4's local layers) see the last `sliding_window` positions
/// and take their own RoPE base at position scale 1 where the architecture
/// or the file gives one; the frequency factors (`rope_freqs`: LLaMA 3.1's,
/// Gemma 4's proportional RoPE) are the full-attention layers'. Each layer
/// rotates its own `rope_dim` dimensions.
fn layer_attention<'w>(
    hp: &HyperParams,
    t: &ArchTraits,
    w: &'w Weights,
    il: usize,
) -> (Rope<'w>, Option<usize>) {
    let local = hp.sliding_window.filter(|_| hp.is_sliding(il));
    let (freq_base, freq_scale) = match (local, hp.rope_freq_base_swa.or(t.local_rope_base)) {
        (Some(_), Some(base)) => (base, 1.0),
        _ => (hp.rope_freq_base, hp.rope_freq_scale),
    };
    let rope = Rope {
        mode: t.rope_mode,
        dims: hp.heads(il).rope_dim as usize,
        freq_base,
        freq_scale,
        freq_factors: w.rope_freqs.as_ref().filter(|_| local.is_none()),
        yarn: hp.yarn,
    };
    (rope, local.map(|w| w as usize))
}
