//! The architectures this build runs and the tensors each one needs, with the
//! shapes their hyper-parameters imply (names as llama.cpp's converters write
//! them; shapes in ggml order, row length first).

use super::HyperParams;
use crate::backend::{Glu, RopeMode};
use crate::error::{Error, Result};
use crate::gguf::GgufFile;

/// A model family with its own forward pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Architecture {
    /// LLaMA 1/2/3, Mistral, TinyLlama.
    Llama,
    /// Qwen2: LLaMA with Q/K/V biases and NEOX RoPE.
    Qwen2,
    /// Qwen3 (dense): LLaMA with NEOX RoPE and an RMSNorm on each query and
    /// key head before RoPE, no biases.
    Qwen3,
    /// Qwen3-MoE: Qwen3's attention with a mixture-of-experts feed-forward
    /// block in every layer.
    Qwen3Moe,
    /// Gemma 3: extra norms, GeGLU, sliding-window layers.
    Gemma3,
    /// Qwen3.5 / Qwen3.6 (dense): Gated DeltaNet linear-attention layers,
    /// with a gated full-attention layer every `full_attention_interval`
    /// layers.
    Qwen35,
    /// Qwen3.5 / Qwen3.6 MoE: Qwen3.5's layers with a mixture-of-experts
    /// feed-forward block and a shared expert gated by σ of its own
    /// projection.
    Qwen35Moe,
    /// OpenAI's gpt-oss: attention with biases and a sink logit per head,
    /// sliding-window and full-attention layers alternating, YaRN RoPE, and
    /// a mixture of experts with biases and a clamped SwiGLU in every layer.
    GptOss,
    /// Google's Gemma 4 (dense): Gemma 3's norms and GeGLU, sliding-window
    /// and full-attention layers with heads of their own, full-attention
    /// layers whose keys serve as values and whose RoPE is proportional
    /// (frequency factors), values RMS-normed, a scale on each layer's
    /// output, and soft-capped logits.
    Gemma4,
}

impl Architecture {
    /// The architecture named by `general.architecture`, if this build runs it.
    pub fn from_name(name: &str) -> Option<Architecture> {
        match name {
            "llama" => Some(Architecture::Llama),
            "qwen2" => Some(Architecture::Qwen2),
            "qwen3" => Some(Architecture::Qwen3),
            "qwen3moe" => Some(Architecture::Qwen3Moe),
            "gemma3" => Some(Architecture::Gemma3),
            "qwen35" => Some(Architecture::Qwen35),
            "qwen35moe" => Some(Architecture::Qwen35Moe),
            "gpt-oss" => Some(Architecture::GptOss),
            "gemma4" => Some(Architecture::Gemma4),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Architecture::Llama => "llama",
            Architecture::Qwen2 => "qwen2",
            Architecture::Qwen3 => "qwen3",
            Architecture::Qwen3Moe => "qwen3moe",
            Architecture::Gemma3 => "gemma3",
            Architecture::Qwen35 => "qwen35",
            Architecture::Qwen35Moe => "qwen35moe",
            Architecture::GptOss => "gpt-oss",
            Architecture::Gemma4 => "gemma4",
        }
    }

    /// Whether its layers mix Gated DeltaNet and gated attention (Qwen3.5).
    pub fn is_hybrid(self) -> bool {
        matches!(self, Architecture::Qwen35 | Architecture::Qwen35Moe)
    }

    /// The norm before each feed-forward block: Qwen3.5 and gpt-oss name it
    /// as Hugging Face does.
    pub fn ffn_norm_name(self) -> &'static str {
        match self {
            Architecture::Qwen35 | Architecture::Qwen35Moe | Architecture::GptOss => {
                "post_attention_norm.weight"
            }
            _ => "ffn_norm.weight",
        }
    }

    /// How this architecture's forward pass differs from LLaMA's.
    pub fn traits(self) -> ArchTraits {
        match self {
            Architecture::Llama => ArchTraits {
                rope_mode: RopeMode::Normal,
                glu: Glu::Swiglu,
                embedding_scaled: false,
                local_rope_base: None,
                attention_scale: None,
                value_norm: false,
            },
            Architecture::Qwen2
            | Architecture::Qwen3
            | Architecture::Qwen3Moe
            // Qwen3.5's RoPE is llama.cpp's interleaved multi-section kind,
            // which for text (every section at the token's position) is
            // NEOX over `rope.dimension_count` dimensions; `HyperParams`
            // checks that the sections rotate every pair.
            | Architecture::Qwen35
            | Architecture::Qwen35Moe => ArchTraits {
                rope_mode: RopeMode::Neox,
                glu: Glu::Swiglu,
                embedding_scaled: false,
                local_rope_base: None,
                attention_scale: None,
                value_norm: false,
            },
            Architecture::Gemma3 => ArchTraits {
                rope_mode: RopeMode::Neox,
                glu: Glu::Geglu,
                embedding_scaled: true,
                local_rope_base: Some(10_000.0),
                attention_scale: None,
                value_norm: false,
            },
            Architecture::GptOss => ArchTraits {
                rope_mode: RopeMode::Neox,
                glu: Glu::SwigluOai,
                embedding_scaled: false,
                local_rope_base: None,
                attention_scale: None,
                value_norm: false,
            },
            // llama.cpp: `f_attention_scale = 1` (its q and k norms set the
            // scale of q·k), and `Vcur = ggml_rms_norm(Vcur)` in every layer.
            // The sliding-window layers' RoPE base comes from the file
            // (`HyperParams::rope_freq_base_swa`).
            Architecture::Gemma4 => ArchTraits {
                rope_mode: RopeMode::Neox,
                glu: Glu::Geglu,
                embedding_scaled: true,
                local_rope_base: None,
                attention_scale: Some(1.0),
                value_norm: true,
            },
        }
    }

    /// llama.cpp's RoPE base when the file sets none.
    pub fn default_rope_freq_base(self) -> f32 {
        match self {
            Architecture::Llama
            | Architecture::Qwen2
            | Architecture::Qwen3
            | Architecture::Qwen3Moe
            | Architecture::GptOss
            | Architecture::Gemma4 => 10_000.0,
            Architecture::Gemma3 => 1_000_000.0,
            Architecture::Qwen35 | Architecture::Qwen35Moe => 10_000_000.0,
        }
    }
}

/// The per-architecture choices of the forward pass. (Biases, Q/K norms and
/// post-norms need no flag: they are used where the file has them.)
#[derive(Clone, Copy, Debug)]
pub struct ArchTraits {
    pub rope_mode: RopeMode,
    pub glu: Glu,
    /// Gemma multiplies the embeddings by √d_model.
    pub embedding_scaled: bool,
    /// RoPE base of the sliding-window layers (Gemma 3's local layers).
    pub local_rope_base: Option<f32>,
    /// What multiplies q·k before the softmax where it is not
    /// 1 / √head_dim_k.
    pub attention_scale: Option<f32>,
    /// Each value head is RMS-normed, with no weight, before it is cached.
    pub value_norm: bool,
}

/// A tensor the architecture knows, with its expected shape.
struct TensorSpec {
    name: String,
    dims: Vec<u64>,
    required: bool,
}

fn spec(name: impl Into<String>, dims: &[u32], required: bool) -> TensorSpec {
    TensorSpec {
        name: name.into(),
        dims: dims.iter().map(|&d| u64::from(d)).collect(),
        required,
    }
}

fn tensor_specs(arch: Architecture, hp: &HyperParams) -> Vec<TensorSpec> {
    let (d, v, ff) = (hp.n_embd, hp.n_vocab, hp.n_ff);
    let mut specs = vec![
        spec("token_embd.weight", &[d, v], true),
        spec("output_norm.weight", &[d], true),
        // Absent means the output projection is tied to the embedding.
        spec("output.weight", &[d, v], false),
    ];
    let full_layers = (0..hp.n_layer as usize).any(|il| !hp.is_sliding(il));
    match arch {
        // LLaMA 3.1-style frequency factors for long-context RoPE.
        Architecture::Llama => specs.push(spec("rope_freqs.weight", &[hp.rope_dim / 2], false)),
        // Gemma 4's proportional RoPE of the full-attention layers: a factor
        // for each pair of a head (llama.cpp's `n_embd_head / 2`).
        Architecture::Gemma4 if full_layers => {
            specs.push(spec("rope_freqs.weight", &[hp.head_dim_k / 2], true))
        }
        _ => {}
    }
    for i in 0..hp.n_layer {
        let b = |n: &str| format!("blk.{i}.{n}");
        let heads = hp.heads(i as usize);
        let q = hp.n_head * heads.head_dim_k;
        let k = heads.n_head_kv * heads.head_dim_k;
        let vv = heads.n_head_kv * heads.head_dim_v;
        let o = hp.n_head * heads.head_dim_v;
        specs.push(spec(b("attn_norm.weight"), &[d], true));
        match hp.delta_net.filter(|_| hp.is_linear_layer(i as usize)) {
            Some(net) => {
                let (channels, value) = (net.conv_channels(), net.value_width());
                specs.extend([
                    spec(b("attn_qkv.weight"), &[d, channels], true),
                    spec(b("attn_gate.weight"), &[d, value], true),
                    spec(b("ssm_conv1d.weight"), &[net.conv_kernel, channels], true),
                    spec(b("ssm_dt.bias"), &[net.n_v_heads], true),
                    spec(b("ssm_a"), &[net.n_v_heads], true),
                    spec(b("ssm_beta.weight"), &[d, net.n_v_heads], true),
                    spec(b("ssm_alpha.weight"), &[d, net.n_v_heads], true),
                    spec(b("ssm_norm.weight"), &[net.head_dim], true),
                    spec(b("ssm_out.weight"), &[value, d], true),
                ]);
            }
            None => {
                // Qwen3.5's full-attention layers project each query head
                // and its output gate together.
                let q = if arch.is_hybrid() { 2 * q } else { q };
                // A Gemma 4 layer without a value projection takes its keys'.
                let values_required = arch != Architecture::Gemma4;
                specs.extend([
                    spec(b("attn_q.weight"), &[d, q], true),
                    spec(b("attn_k.weight"), &[d, k], true),
                    spec(b("attn_v.weight"), &[d, vv], values_required),
                    spec(b("attn_output.weight"), &[o, d], true),
                ]);
            }
        }
        specs.push(spec(b(arch.ffn_norm_name()), &[d], true));
        if hp.is_moe() {
            // The router, and each expert's matrices stacked along the
            // third dimension (expert e is the e-th contiguous slice).
            let (e, ff_exp) = (hp.n_expert, hp.n_ff_exp);
            specs.extend([
                spec(b("ffn_gate_inp.weight"), &[d, e], true),
                spec(b("ffn_gate_exps.weight"), &[d, ff_exp, e], true),
                spec(b("ffn_up_exps.weight"), &[d, ff_exp, e], true),
                spec(b("ffn_down_exps.weight"), &[ff_exp, d, e], true),
            ]);
            if arch == Architecture::GptOss {
                specs.extend([
                    spec(b("ffn_gate_inp.bias"), &[e], true),
                    spec(b("ffn_gate_exps.bias"), &[ff_exp, e], true),
                    spec(b("ffn_up_exps.bias"), &[ff_exp, e], true),
                    spec(b("ffn_down_exps.bias"), &[d, e], true),
                ]);
            }
            if hp.n_ff_shared > 0 {
                let sh = hp.n_ff_shared;
                specs.extend([
                    spec(b("ffn_gate_inp_shexp.weight"), &[d], true),
                    spec(b("ffn_gate_shexp.weight"), &[d, sh], true),
                    spec(b("ffn_up_shexp.weight"), &[d, sh], true),
                    spec(b("ffn_down_shexp.weight"), &[sh, d], true),
                ]);
            }
        } else {
            specs.extend([
                spec(b("ffn_gate.weight"), &[d, ff], true),
                spec(b("ffn_up.weight"), &[d, ff], true),
                spec(b("ffn_down.weight"), &[ff, d], true),
            ]);
        }
        match arch {
            Architecture::Llama => {}
            Architecture::Qwen2 => specs.extend([
                spec(b("attn_q.bias"), &[q], true),
                spec(b("attn_k.bias"), &[k], true),
                spec(b("attn_v.bias"), &[vv], true),
            ]),
            Architecture::Qwen3 | Architecture::Qwen3Moe => specs.extend([
                spec(b("attn_q_norm.weight"), &[heads.head_dim_k], true),
                spec(b("attn_k_norm.weight"), &[heads.head_dim_k], true),
            ]),
            Architecture::Qwen35 | Architecture::Qwen35Moe if hp.is_linear_layer(i as usize) => {}
            Architecture::Qwen35 | Architecture::Qwen35Moe => specs.extend([
                spec(b("attn_q_norm.weight"), &[heads.head_dim_k], true),
                spec(b("attn_k_norm.weight"), &[heads.head_dim_k], true),
            ]),
            Architecture::Gemma3 => specs.extend([
                spec(b("attn_q_norm.weight"), &[heads.head_dim_k], true),
                spec(b("attn_k_norm.weight"), &[heads.head_dim_k], true),
                spec(b("post_attention_norm.weight"), &[d], true),
                spec(b("post_ffw_norm.weight"), &[d], true),
            ]),
            // llama.cpp: the layer's scalar output scale is optional.
            Architecture::Gemma4 => specs.extend([
                spec(b("attn_q_norm.weight"), &[heads.head_dim_k], true),
                spec(b("attn_k_norm.weight"), &[heads.head_dim_k], true),
                spec(b("post_attention_norm.weight"), &[d], true),
                spec(b("post_ffw_norm.weight"), &[d], true),
                spec(b("layer_output_scale.weight"), &[1], false),
            ]),
            Architecture::GptOss => specs.extend([
                spec(b("attn_q.bias"), &[q], true),
                spec(b("attn_k.bias"), &[k], true),
                spec(b("attn_v.bias"), &[vv], true),
                spec(b("attn_output.bias"), &[d], true),
                spec(b("attn_sinks.weight"), &[hp.n_head], true),
            ]),
        }
    }
    specs
}

/// Checks that the file holds exactly the tensors `arch` uses, each with the
/// shape `hp` implies and a type this build computes with.
pub fn check_tensors(gguf: &GgufFile, arch: Architecture, hp: &HyperParams) -> Result<()> {
    let specs = tensor_specs(arch, hp);
    for s in &specs {
        match gguf.tensor(&s.name) {
            None if s.required => {
                return Err(Error::format(format!(
                    "tensor '{}' is missing (a {} model needs it)",
                    s.name,
                    arch.name()
                )))
            }
            None => {}
            Some(t) if t.dims != s.dims => {
                return Err(Error::format(format!(
                    "tensor '{}' has shape {:?}, expected {:?} from the model's hyper-parameters",
                    s.name, t.dims, s.dims
                )))
            }
            Some(t) if !t.ggml_type.is_supported() => {
                return Err(Error::unsupported(format!(
                    "tensor '{}' has type {}, which this build does not compute with",
                    s.name, t.ggml_type
                )))
            }
            Some(_) => {}
        }
    }
    let known: std::collections::HashSet<&str> = specs.iter().map(|s| s.name.as_str()).collect();
    if let Some(extra) = gguf
        .tensors()
        .iter()
        .find(|t| !known.contains(t.name.as_str()))
    {
        return Err(Error::format(format!(
            "unexpected tensor '{}' for a {} model with {} layers",
            extra.name,
            arch.name(),
            hp.n_layer
        )));
    }
    Ok(())
}
