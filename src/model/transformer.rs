//! The transformer forward pass shared by LLaMA, Qwen2 and Gemma 3, written
//! once against the [`Backend`] interface. Read top to bottom it is the whole
//! model: embed, then per layer attention and feed-forward blocks with their
//! residuals, then the output norm and projection.
//!
//! A batch is a list of rows, each a token at a position of some sequence
//! (a prompt chunk is many rows of one sequence; a batched decode one row of
//! each of several sequences). Every row's key and value are written to its
//! sequence's cache before attention, so causal attention is simply "each row
//! over its sequence's positions up to its own".

use super::{ArchTraits, HyperParams, Model, Weights};
use crate::backend::{AttentionShape, Backend, ModelBackend, Rope, SeqPos, SequenceCache};
use crate::error::{Error, Result};

/// [`forward`] on the model's own backend, over caches made by it.
pub fn run(
    model: &Model,
    caches: &mut [&mut SequenceCache],
    tokens: &[u32],
    rows: &[SeqPos],
    logit_rows: &[usize],
) -> Result<Vec<f32>> {
    let mismatch = || Error::internal("a session's KV cache is not on its model's backend");
    match model.backend() {
        ModelBackend::Cpu(b) => {
            let mut own = caches
                .iter_mut()
                .map(|c| match &mut **c {
                    SequenceCache::Cpu(kv) => Ok(kv),
                    #[allow(unreachable_patterns)]
                    _ => Err(mismatch()),
                })
                .collect::<Result<Vec<_>>>()?;
            forward(b, model, &mut own, tokens, rows, logit_rows)
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
            forward(&**b, model, &mut own, tokens, rows, logit_rows)
        }
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
    let (arch, hp) = model.config();
    let t: ArchTraits = arch.traits();
    let w: &Weights = model.weights();
    let n = tokens.len();
    let d = hp.n_embd as usize;
    let (n_head, n_head_kv) = (hp.n_head as usize, hp.n_head_kv as usize);
    let (hd_k, hd_v) = (hp.head_dim_k as usize, hp.head_dim_v as usize);
    let (q_width, kv_width_k, kv_width_v) = (n_head * hd_k, n_head_kv * hd_k, n_head_kv * hd_v);
    let o_width = n_head * hd_v;
    let ff = hp.n_ff as usize;

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
    let all_rows: Vec<usize> = (0..n).collect();

    let embedding_scale = if t.embedding_scaled {
        (d as f32).sqrt()
    } else {
        1.0
    };
    b.embed(&w.token_embd, tokens, embedding_scale, &mut x)?;

    for (il, lw) in w.layers.iter().enumerate() {
        let (rope, window) = layer_attention(hp, &t, w, il);
        let shape = AttentionShape {
            n_head,
            n_head_kv,
            head_dim_k: hd_k,
            head_dim_v: hd_v,
            window,
            scale: 1.0 / (hd_k as f32).sqrt(),
        };

        // Attention block: h = norm(x); q, k, v; rotate; attend; x += out.
        b.gather_rows(&x, d, &all_rows, &mut h)?;
        b.rms_norm(&mut h, &lw.attn_norm, hp.rms_eps, n * d)?;
        b.matmul(&lw.wq, &h, n, &mut q)?;
        b.matmul(&lw.wk, &h, n, &mut k)?;
        b.matmul(&lw.wv, &h, n, &mut v)?;
        if let (Some(bq), Some(bk), Some(bv)) = (&lw.bq, &lw.bk, &lw.bv) {
            b.add_bias(&mut q, bq, n)?;
            b.add_bias(&mut k, bk, n)?;
            b.add_bias(&mut v, bv, n)?;
        }
        if let (Some(qn), Some(kn)) = (&lw.q_norm, &lw.k_norm) {
            b.rms_norm(&mut q, qn, hp.rms_eps, n * q_width)?;
            b.rms_norm(&mut k, kn, hp.rms_eps, n * kv_width_k)?;
        }
        b.rope(&mut q, n_head, hd_k, rows, &rope)?;
        b.rope(&mut k, n_head_kv, hd_k, rows, &rope)?;
        b.store_kv(caches, il, &k, &v, rows)?;
        b.attention(caches, il, &q, rows, &shape, &mut attn)?;
        b.matmul(&lw.wo, &attn, n, &mut o)?;
        if let Some(post) = &lw.post_attn_norm {
            b.rms_norm(&mut o, post, hp.rms_eps, n * d)?;
        }
        b.add(&mut x, &o, n * d)?;

        // Feed-forward block: h = norm(x); act(gate(h)) · up(h); x += down(..).
        b.gather_rows(&x, d, &all_rows, &mut h)?;
        b.rms_norm(&mut h, &lw.ffn_norm, hp.rms_eps, n * d)?;
        b.matmul(&lw.ffn_gate, &h, n, &mut gate)?;
        b.matmul(&lw.ffn_up, &h, n, &mut up)?;
        b.glu(t.glu, &gate, &up, n * ff, &mut act)?;
        b.matmul(&lw.ffn_down, &act, n, &mut o)?;
        if let Some(post) = &lw.post_ffn_norm {
            b.rms_norm(&mut o, post, hp.rms_eps, n * d)?;
        }
        b.add(&mut x, &o, n * d)?;
    }

    // Output: only the rows whose next-token logits are wanted.
    let n_out = logit_rows.len();
    let n_vocab = hp.n_vocab as usize;
    let mut last = b.buffer(n_out * d)?;
    b.gather_rows(&x, d, logit_rows, &mut last)?;
    b.rms_norm(&mut last, &w.output_norm, hp.rms_eps, n_out * d)?;
    let mut logits_dev = b.buffer(n_out * n_vocab)?;
    b.matmul(&w.output, &last, n_out, &mut logits_dev)?;
    let mut logits = vec![0f32; n_out * n_vocab];
    b.read(&logits_dev, &mut logits)?;
    Ok(logits)
}

/// Layer `il`'s RoPE and attention window: Gemma 3's local layers use a
/// sliding window and their own RoPE base; every `sliding_window_pattern`-th
/// layer (and every layer of the other architectures) attends globally.
fn layer_attention<'w>(
    hp: &HyperParams,
    t: &ArchTraits,
    w: &'w Weights,
    il: usize,
) -> (Rope<'w>, Option<usize>) {
    let global = (il + 1).is_multiple_of(hp.sliding_window_pattern as usize);
    let local = hp.sliding_window.filter(|_| !global);
    let (freq_base, freq_scale) = match (local, t.local_rope_base) {
        (Some(_), Some(base)) => (base, 1.0),
        _ => (hp.rope_freq_base, hp.rope_freq_scale),
    };
    let rope = Rope {
        mode: t.rope_mode,
        dims: hp.rope_dim as usize,
        freq_base,
        freq_scale,
        freq_factors: w.rope_freqs.as_ref(),
    };
    (rope, local.map(|w| w as usize))
}
