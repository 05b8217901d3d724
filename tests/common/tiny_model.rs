//! Complete, valid GGUF models of each supported architecture, small enough to
//! build in microseconds: the base that malformed-file tests corrupt.

use super::gguf_writer::{f32_bytes, tt, GgufWriter, Meta};

/// The shapes of a tiny model.
#[derive(Clone, Copy, Debug)]
pub struct TinyShape {
    pub n_vocab: u64,
    pub n_embd: u64,
    pub n_layer: u64,
    pub n_head: u64,
    pub n_head_kv: u64,
    pub n_ff: u64,
}

pub const TINY: TinyShape = TinyShape {
    n_vocab: 16,
    n_embd: 32,
    n_layer: 2,
    n_head: 4,
    n_head_kv: 2,
    n_ff: 64,
};

/// Experts of the tiny mixture-of-experts models, and how many each token uses.
pub const TINY_EXPERTS: (u64, u64) = (4, 2);

/// A valid `arch` model ("llama", "qwen2", "qwen3moe", "gemma3",
/// "llama-moe": LLaMA with Mixtral's experts, "qwen35": a Gated DeltaNet
/// layer then a gated attention layer, "qwen35moe": those with experts
/// and a shared expert, "gpt-oss": an 8-token sliding window on every
/// second layer, attention sinks, YaRN and biased experts, or "gemma4":
/// sliding-window layers of 2 KV heads of 8 (an 8-token window) then
/// full-attention layers of 1 KV head of 32 whose keys serve as values,
/// with proportional RoPE, output scales and soft-capped logits) with F32
/// weights.
pub fn tiny_model(arch: &str) -> GgufWriter {
    tiny_model_with(arch, TINY)
}

pub fn tiny_model_with(arch: &str, s: TinyShape) -> GgufWriter {
    let (arch, moe) = match arch {
        "llama-moe" => ("llama", true),
        "qwen3moe" => ("qwen3moe", true),
        "qwen35moe" => ("qwen35moe", true),
        "gpt-oss" => ("gpt-oss", true),
        other => (other, false),
    };
    let (n_expert, n_expert_used) = TINY_EXPERTS;
    let head_dim = s.n_embd / s.n_head;
    let tokens: Vec<String> = (0..s.n_vocab).map(|i| format!("tok{i}")).collect();
    let token_refs: Vec<&str> = tokens.iter().map(String::as_str).collect();
    let a = |k: &str| format!("{arch}.{k}");
    let mut w = GgufWriter::new()
        .kv("general.architecture", Meta::str(arch))
        .kv("general.name", Meta::str("tiny test model"))
        .kv(&a("context_length"), Meta::U32(256))
        .kv(&a("embedding_length"), Meta::U32(s.n_embd as u32))
        .kv(&a("block_count"), Meta::U32(s.n_layer as u32))
        .kv(&a("feed_forward_length"), Meta::U32(s.n_ff as u32))
        .kv(&a("attention.head_count"), Meta::U32(s.n_head as u32))
        .kv(&a("attention.head_count_kv"), Meta::U32(s.n_head_kv as u32))
        .kv(&a("attention.layer_norm_rms_epsilon"), Meta::F32(1e-6))
        .kv(&a("rope.freq_base"), Meta::F32(10000.0))
        .kv("tokenizer.ggml.model", Meta::str("llama"))
        .kv("tokenizer.ggml.tokens", Meta::strings(&token_refs))
        .kv(
            "tokenizer.ggml.scores",
            Meta::Array(
                super::gguf_writer::vt::F32,
                (0..s.n_vocab).map(|i| Meta::F32(-(i as f32))).collect(),
            ),
        );
    if moe {
        w.set_kv(&a("expert_count"), Meta::U32(n_expert as u32));
        w.set_kv(&a("expert_used_count"), Meta::U32(n_expert_used as u32));
    }
    // qwen35: the DeltaNet's heads as wide as the attention's, twice as
    // many value heads as key heads, every second layer attention.
    let net = (4u64, head_dim, 2u64, 4u64);
    let hybrid = arch == "qwen35" || arch == "qwen35moe";
    if hybrid {
        let (conv, state, groups, rank) = net;
        w.set_kv(&a("ssm.conv_kernel"), Meta::U32(conv as u32));
        w.set_kv(&a("ssm.state_size"), Meta::U32(state as u32));
        w.set_kv(&a("ssm.group_count"), Meta::U32(groups as u32));
        w.set_kv(&a("ssm.time_step_rank"), Meta::U32(rank as u32));
        w.set_kv(&a("ssm.inner_size"), Meta::U32((state * rank) as u32));
        w.set_kv(&a("full_attention_interval"), Meta::U32(2));
        let sections = [2, 1, 1, 0].map(Meta::I32).to_vec();
        w.set_kv(
            &a("rope.dimension_sections"),
            Meta::Array(super::gguf_writer::vt::I32, sections),
        );
    }
    if arch == "gpt-oss" {
        // YaRN's ramp spans these 4-pair heads' first two pairs.
        w.set_kv(&a("expert_feed_forward_length"), Meta::U32(s.n_ff as u32));
        w.set_kv(&a("attention.sliding_window"), Meta::U32(8));
        w.set_kv(&a("rope.scaling.type"), Meta::str("yarn"));
        w.set_kv(&a("rope.scaling.factor"), Meta::F32(32.0));
        w.set_kv(&a("rope.scaling.original_context_length"), Meta::U32(64));
    }
    // gemma4: every second layer full attention, with heads four times as
    // wide (keys and values of 32 values a position against the sliding
    // layers' 16).
    let gemma4_sliding = |i: u64| !(i + 1).is_multiple_of(2);
    let gemma4_heads = |i: u64| {
        if gemma4_sliding(i) {
            (head_dim, s.n_head_kv)
        } else {
            (4 * head_dim, 1)
        }
    };
    if arch == "gemma4" {
        let per_layer = |f: &dyn Fn(u64) -> Meta| (0..s.n_layer).map(f).collect();
        w.set_kv(
            &a("attention.head_count_kv"),
            Meta::Array(
                super::gguf_writer::vt::I32,
                per_layer(&|i| Meta::I32(gemma4_heads(i).1 as i32)),
            ),
        );
        w.set_kv(
            &a("attention.sliding_window_pattern"),
            Meta::Array(
                super::gguf_writer::vt::BOOL,
                per_layer(&|i| Meta::Bool(gemma4_sliding(i))),
            ),
        );
        let full = 4 * head_dim as u32;
        for (k, v) in [
            ("attention.key_length", full),
            ("attention.value_length", full),
            ("rope.dimension_count", full),
            ("attention.key_length_swa", head_dim as u32),
            ("attention.value_length_swa", head_dim as u32),
            ("rope.dimension_count_swa", head_dim as u32),
            ("attention.sliding_window", 8),
            ("attention.shared_kv_layers", 0),
            ("embedding_length_per_layer_input", 0),
        ] {
            w.set_kv(&a(k), Meta::U32(v));
        }
        w.set_kv(&a("rope.freq_base_swa"), Meta::F32(10000.0));
        w.set_kv(&a("final_logit_softcapping"), Meta::F32(10.0));
    }
    if arch == "gemma3" {
        w.set_kv(&a("attention.key_length"), Meta::U32(head_dim as u32));
        w.set_kv(&a("attention.value_length"), Meta::U32(head_dim as u32));
        w.set_kv(&a("attention.sliding_window"), Meta::U32(8));
    }

    let mut seed = 0u32;
    let mut add = |w: GgufWriter, name: &str, dims: &[u64]| {
        seed += 1;
        w.tensor(name, dims, tt::F32, f32_bytes(dims.iter().product(), seed))
    };
    let (d, v, ff) = (s.n_embd, s.n_vocab, s.n_ff);
    let (q, kv) = (s.n_head * head_dim, s.n_head_kv * head_dim);
    w = add(w, "token_embd.weight", &[d, v]);
    if arch == "gemma4" {
        // Proportional RoPE: the first quarter of each full-attention head's
        // pairs turn, the others' angles are divided by 1e30 (as Gemma 4's
        // converter writes them).
        let pairs = 2 * head_dim;
        let factors: Vec<u8> = (0..pairs)
            .flat_map(|p| (if p < pairs / 4 { 1.0f32 } else { 1e30 }).to_le_bytes())
            .collect();
        w = w.tensor("rope_freqs.weight", &[pairs], tt::F32, factors);
    }
    for i in 0..s.n_layer {
        let b = |n: &str| format!("blk.{i}.{n}");
        w = add(w, &b("attn_norm.weight"), &[d]);
        if arch == "gemma4" {
            let (hd, n_kv) = gemma4_heads(i);
            w = add(w, &b("attn_q.weight"), &[d, s.n_head * hd]);
            w = add(w, &b("attn_k.weight"), &[d, n_kv * hd]);
            if gemma4_sliding(i) {
                w = add(w, &b("attn_v.weight"), &[d, n_kv * hd]);
            }
            w = add(w, &b("attn_output.weight"), &[s.n_head * hd, d]);
            w = add(w, &b("attn_q_norm.weight"), &[hd]);
            w = add(w, &b("attn_k_norm.weight"), &[hd]);
            w = add(w, &b("post_attention_norm.weight"), &[d]);
            let scale = (0.75f32 + 0.125 * i as f32).to_le_bytes().to_vec();
            w = w.tensor(&b("layer_output_scale.weight"), &[1], tt::F32, scale);
            w = add(w, &b("ffn_norm.weight"), &[d]);
            w = add(w, &b("ffn_gate.weight"), &[d, ff]);
            w = add(w, &b("ffn_up.weight"), &[d, ff]);
            w = add(w, &b("ffn_down.weight"), &[ff, d]);
            w = add(w, &b("post_ffw_norm.weight"), &[d]);
            continue;
        }
        if hybrid {
            let (conv, state, groups, rank) = net;
            let (key, value) = (state * groups, state * rank);
            if i % 2 == 0 {
                w = add(w, &b("attn_qkv.weight"), &[d, 2 * key + value]);
                w = add(w, &b("attn_gate.weight"), &[d, value]);
                w = add(w, &b("ssm_conv1d.weight"), &[conv, 2 * key + value]);
                w = add(w, &b("ssm_dt.bias"), &[rank]);
                // −e^A, negative in real files: each head's state decays.
                let decays: Vec<u8> = (0..rank)
                    .flat_map(|h| (-0.2 - 0.3 * h as f32).to_le_bytes())
                    .collect();
                w = w.tensor(&b("ssm_a"), &[rank], tt::F32, decays);
                w = add(w, &b("ssm_beta.weight"), &[d, rank]);
                w = add(w, &b("ssm_alpha.weight"), &[d, rank]);
                w = add(w, &b("ssm_norm.weight"), &[state]);
                w = add(w, &b("ssm_out.weight"), &[value, d]);
            } else {
                w = add(w, &b("attn_q.weight"), &[d, 2 * q]);
                w = add(w, &b("attn_k.weight"), &[d, kv]);
                w = add(w, &b("attn_v.weight"), &[d, kv]);
                w = add(w, &b("attn_q_norm.weight"), &[head_dim]);
                w = add(w, &b("attn_k_norm.weight"), &[head_dim]);
                w = add(w, &b("attn_output.weight"), &[q, d]);
            }
            w = add(w, &b("post_attention_norm.weight"), &[d]);
            if moe {
                // Experts n_ff / n_expert_used wide; the shared expert n_ff.
                let ff_exp = ff / n_expert_used;
                w = add(w, &b("ffn_gate_inp.weight"), &[d, n_expert]);
                w = add(w, &b("ffn_gate_exps.weight"), &[d, ff_exp, n_expert]);
                w = add(w, &b("ffn_up_exps.weight"), &[d, ff_exp, n_expert]);
                w = add(w, &b("ffn_down_exps.weight"), &[ff_exp, d, n_expert]);
                w = add(w, &b("ffn_gate_inp_shexp.weight"), &[d]);
                w = add(w, &b("ffn_gate_shexp.weight"), &[d, ff]);
                w = add(w, &b("ffn_up_shexp.weight"), &[d, ff]);
                w = add(w, &b("ffn_down_shexp.weight"), &[ff, d]);
            } else {
                w = add(w, &b("ffn_gate.weight"), &[d, ff]);
                w = add(w, &b("ffn_up.weight"), &[d, ff]);
                w = add(w, &b("ffn_down.weight"), &[ff, d]);
            }
            continue;
        }
        if arch == "gpt-oss" {
            for (name, width) in [("attn_q", q), ("attn_k", kv), ("attn_v", kv)] {
                w = add(w, &b(&format!("{name}.weight")), &[d, width]);
                w = add(w, &b(&format!("{name}.bias")), &[width]);
            }
            w = add(w, &b("attn_output.weight"), &[q, d]);
            w = add(w, &b("attn_output.bias"), &[d]);
            w = add(w, &b("attn_sinks.weight"), &[s.n_head]);
            w = add(w, &b("post_attention_norm.weight"), &[d]);
            w = add(w, &b("ffn_gate_inp.weight"), &[d, n_expert]);
            w = add(w, &b("ffn_gate_inp.bias"), &[n_expert]);
            for (name, dims) in [
                ("ffn_gate_exps", [d, ff, n_expert]),
                ("ffn_up_exps", [d, ff, n_expert]),
                ("ffn_down_exps", [ff, d, n_expert]),
            ] {
                w = add(w, &b(&format!("{name}.weight")), &dims);
                w = add(w, &b(&format!("{name}.bias")), &[dims[1], n_expert]);
            }
            continue;
        }
        w = add(w, &b("attn_q.weight"), &[d, q]);
        w = add(w, &b("attn_k.weight"), &[d, kv]);
        w = add(w, &b("attn_v.weight"), &[d, kv]);
        if arch == "qwen2" {
            w = add(w, &b("attn_q.bias"), &[q]);
            w = add(w, &b("attn_k.bias"), &[kv]);
            w = add(w, &b("attn_v.bias"), &[kv]);
        }
        if arch == "gemma3" || arch == "qwen3moe" {
            w = add(w, &b("attn_q_norm.weight"), &[head_dim]);
            w = add(w, &b("attn_k_norm.weight"), &[head_dim]);
        }
        if arch == "gemma3" {
            w = add(w, &b("post_attention_norm.weight"), &[d]);
            w = add(w, &b("post_ffw_norm.weight"), &[d]);
        }
        w = add(w, &b("attn_output.weight"), &[q, d]);
        w = add(w, &b("ffn_norm.weight"), &[d]);
        if moe {
            // qwen3moe without expert_feed_forward_length: n_ff / n_expert_used.
            let ff_exp = if arch == "llama" {
                ff
            } else {
                ff / n_expert_used
            };
            w = add(w, &b("ffn_gate_inp.weight"), &[d, n_expert]);
            w = add(w, &b("ffn_gate_exps.weight"), &[d, ff_exp, n_expert]);
            w = add(w, &b("ffn_up_exps.weight"), &[d, ff_exp, n_expert]);
            w = add(w, &b("ffn_down_exps.weight"), &[ff_exp, d, n_expert]);
        } else {
            w = add(w, &b("ffn_gate.weight"), &[d, ff]);
            w = add(w, &b("ffn_up.weight"), &[d, ff]);
            w = add(w, &b("ffn_down.weight"), &[ff, d]);
        }
    }
    w = add(w, "output_norm.weight", &[d]);
    if arch != "gemma3" && arch != "gemma4" {
        w = add(w, "output.weight", &[d, v]);
    }
    w
}
