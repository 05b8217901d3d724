//! Hyper-parameters of a supported architecture, read from `{arch}.*` metadata
//! and checked for the ranges and relations the forward pass relies on.

use super::Architecture;
use crate::backend::{DeltaNetShape, Yarn};
use crate::error::{echo, Error, Result};
use crate::gguf::{Array, Entry, GgufFile, Value};
use crate::kv_cache::LayerState;

// Upper bounds well above any published model; they keep hostile values from
// sizing buffers or overflowing products of dimensions.
const MAX_LAYERS: u32 = 1024;
const MAX_EMBEDDING: u32 = 1 << 17;
const MAX_FEED_FORWARD: u32 = 1 << 20;
const MAX_HEADS: u32 = 1024;
const MAX_HEAD_DIM: u32 = 1024;
/// llama.cpp's `LLAMA_MAX_EXPERTS`.
const MAX_EXPERTS: u32 = 512;

/// The shape and numeric constants of a transformer, from GGUF metadata.
#[derive(Clone, Debug, PartialEq)]
pub struct HyperParams {
    pub n_vocab: u32,
    pub n_ctx_train: u32,
    pub n_embd: u32,
    pub n_layer: u32,
    pub n_ff: u32,
    pub n_head: u32,
    /// KV heads of the full-attention layers (of every layer, unless
    /// `sliding_heads` gives the sliding-window layers their own).
    pub n_head_kv: u32,
    /// Width of one query/key head (of the full-attention layers, as
    /// `n_head_kv`).
    pub head_dim_k: u32,
    /// Width of one value head (as `n_head_kv`).
    pub head_dim_v: u32,
    /// How many dimensions of each head RoPE rotates (as `n_head_kv`).
    pub rope_dim: u32,
    /// The sliding-window layers' heads where they are their own (gemma4's
    /// `*_swa` keys and per-layer `head_count_kv`); `None` where every layer
    /// has the heads above.
    pub sliding_heads: Option<LayerHeads>,
    pub rope_freq_base: f32,
    /// The sliding-window layers' RoPE base, at position scale 1, where the
    /// file gives it (gemma4's `rope.freq_base_swa`).
    pub rope_freq_base_swa: Option<f32>,
    /// Position scale of linear RoPE scaling (1 / factor; 1 without scaling).
    pub rope_freq_scale: f32,
    /// YaRN's corrections to the scaled RoPE (gpt-oss); `None` without YaRN.
    pub yarn: Option<Yarn>,
    pub rms_eps: f32,
    /// Tokens a sliding-window (local) attention layer sees; gemma3,
    /// gpt-oss and gemma4.
    pub sliding_window: Option<u32>,
    /// Per layer: whether it attends over the sliding window (every layer
    /// but each `attention.sliding_window_pattern`-th for gemma3 and
    /// gpt-oss, the file's per-layer flags for gemma4; none without a
    /// window).
    pub sliding_layers: Vec<bool>,
    /// The final logits become c · tanh(logits / c) (gemma4's
    /// `final_logit_softcapping`); `None` without capping.
    pub final_logit_softcap: Option<f32>,
    /// Experts of each mixture-of-experts feed-forward block; 0 for a dense
    /// model.
    pub n_expert: u32,
    /// Experts each row uses (1..=n_expert for a MoE model, else 0).
    pub n_expert_used: u32,
    /// Feed-forward width of one expert (0 for a dense model).
    pub n_ff_exp: u32,
    /// Feed-forward width of the shared expert that every row uses beside
    /// its routed ones, gated by σ of its own projection (qwen35moe); 0
    /// where there is none.
    pub n_ff_shared: u32,
    /// The Gated DeltaNet layers' shape (qwen35); `None` for models whose
    /// layers all use attention.
    pub delta_net: Option<DeltaNetParams>,
}

/// One attention layer's key/value heads and rotation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerHeads {
    pub n_head_kv: u32,
    pub head_dim_k: u32,
    pub head_dim_v: u32,
    /// Dimensions of each query and key head that RoPE rotates.
    pub rope_dim: u32,
}

impl LayerHeads {
    /// Values of one position's keys, and of its values, in the KV cache.
    pub fn kv_widths(&self) -> (usize, usize) {
        let n = self.n_head_kv as usize;
        (n * self.head_dim_k as usize, n * self.head_dim_v as usize)
    }
}

/// The linear-attention (Gated DeltaNet) layers of a hybrid model, as
/// llama.cpp reads them from `{arch}.ssm.*`: every layer but each
/// `full_attention_interval`-th is one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeltaNetParams {
    /// Taps of the causal convolution over q, k and v (`ssm.conv_kernel`).
    pub conv_kernel: u32,
    /// Width of each key and value head, and of the square state of each
    /// value head (`ssm.state_size`).
    pub head_dim: u32,
    /// Key (and query) heads (`ssm.group_count`).
    pub n_k_heads: u32,
    /// Value heads, each with its own state, decay and write strength
    /// (`ssm.time_step_rank`); value head h reads key head h mod n_k_heads.
    pub n_v_heads: u32,
    pub full_attention_interval: u32,
}

impl DeltaNetParams {
    /// The shape the backends compute with.
    pub fn shape(&self) -> DeltaNetShape {
        DeltaNetShape {
            conv_kernel: self.conv_kernel as usize,
            head_dim: self.head_dim as usize,
            n_k_heads: self.n_k_heads as usize,
            n_v_heads: self.n_v_heads as usize,
        }
    }

    /// Values of the queries, and of the keys, of one row.
    pub fn key_width(&self) -> u32 {
        self.head_dim * self.n_k_heads
    }

    /// Values of one row's values (and of the layer's output before its
    /// projection).
    pub fn value_width(&self) -> u32 {
        self.head_dim * self.n_v_heads
    }

    /// Channels of the convolution: queries, keys and values.
    pub fn conv_channels(&self) -> u32 {
        2 * self.key_width() + self.value_width()
    }
}

impl HyperParams {
    pub fn from_gguf(gguf: &GgufFile, arch: Architecture, n_vocab: u32) -> Result<HyperParams> {
        let a = arch.name();
        let key = |k: &str| format!("{a}.{k}");
        let required = |k: &str, range| gguf.require(&key(k))?.u32_in(range);
        let optional = |k: &str, range, default| match gguf.get(&key(k)) {
            Some(entry) => entry.u32_in(range),
            None => Ok(default),
        };

        let n_ctx_train = required("context_length", 1..=u32::MAX)?;
        let n_embd = required("embedding_length", 1..=MAX_EMBEDDING)?;
        let n_layer = required("block_count", 1..=MAX_LAYERS)?;
        // A Qwen3.5 MoE file has only its experts' widths, and llama.cpp
        // reads none but the experts' for gpt-oss.
        let n_ff = match arch {
            Architecture::Qwen35Moe | Architecture::GptOss => {
                optional("feed_forward_length", 0..=MAX_FEED_FORWARD, 0)?
            }
            Architecture::Gemma4
                if gguf
                    .get(&key("feed_forward_length"))
                    .is_some_and(|e| matches!(e.value, Value::Array(_))) =>
            {
                return Err(Error::unsupported(format!(
                    "{} gives each layer its own width (Gemma 4's double-wide MLPs), which this build does not support",
                    key("feed_forward_length")
                )));
            }
            _ => required("feed_forward_length", 1..=MAX_FEED_FORWARD)?,
        };
        let n_head = required("attention.head_count", 1..=MAX_HEADS)?;
        // gemma4 names each layer's KV heads; the others one count for all.
        let kv_heads_of_layers = match gguf.get(&key("attention.head_count_kv")) {
            None => vec![n_head; n_layer as usize],
            Some(entry) if arch == Architecture::Gemma4 => {
                per_layer_u32(&entry, n_layer, 1..=MAX_HEADS)?
            }
            Some(entry) => vec![entry.u32_in(1..=MAX_HEADS)?; n_layer as usize],
        };
        if let Some(&n_head_kv) = kv_heads_of_layers.iter().find(|&&kv| n_head % kv != 0) {
            return Err(Error::format(format!(
                "{} = {n_head} is not a multiple of {} = {n_head_kv}",
                key("attention.head_count"),
                key("attention.head_count_kv")
            )));
        }
        let implied_head_dim = n_embd / n_head;
        if gguf.get(&key("attention.key_length")).is_none() && n_embd % n_head != 0 {
            return Err(Error::format(format!(
                "{} = {n_embd} is not a multiple of {} = {n_head}, and no {} says the head size",
                key("embedding_length"),
                key("attention.head_count"),
                key("attention.key_length")
            )));
        }
        let head_dim_k = optional("attention.key_length", 1..=MAX_HEAD_DIM, implied_head_dim)?;
        let head_dim_v = optional("attention.value_length", 1..=MAX_HEAD_DIM, implied_head_dim)?;
        if head_dim_k == 0 || head_dim_k % 2 != 0 {
            return Err(Error::format(format!(
                "the attention head size {head_dim_k} must be a positive even number (RoPE rotates pairs)"
            )));
        }
        let rope_dim = optional("rope.dimension_count", 2..=head_dim_k, head_dim_k)?;
        if rope_dim % 2 != 0 {
            return Err(Error::format(format!(
                "{} = {rope_dim} is odd",
                key("rope.dimension_count")
            )));
        }
        let rope_freq_base = match gguf.get(&key("rope.freq_base")) {
            Some(entry) => entry.f32_in(f32::MIN_POSITIVE..=f32::MAX)?,
            None => arch.default_rope_freq_base(),
        };
        let scaling_factor = || -> Result<f32> {
            Ok(1.0
                / gguf
                    .require(&key("rope.scaling.factor"))?
                    .f32_in(1e-3..=1e6)?)
        };
        let (rope_freq_scale, yarn) = match gguf.get(&key("rope.scaling.type")) {
            None => (1.0, None),
            Some(entry) => match entry.str()? {
                "none" => (1.0, None),
                "linear" => (scaling_factor()?, None),
                "yarn" if arch == Architecture::GptOss => {
                    let freq_scale = scaling_factor()?;
                    (
                        freq_scale,
                        Some(yarn_params(gguf, a, n_ctx_train, freq_scale)?),
                    )
                }
                other => {
                    return Err(Error::unsupported(format!(
                        "{} = '{}' is not supported (none and linear; yarn for gpt-oss)",
                        key("rope.scaling.type"),
                        echo(other)
                    )))
                }
            },
        };
        let rms_eps = gguf
            .require(&key("attention.layer_norm_rms_epsilon"))?
            .f32_in(0.0..=1.0)?;
        // Every `pattern`-th layer global, the others sliding.
        let every = |pattern: u32| -> Vec<bool> {
            (0..n_layer)
                .map(|il| !(il + 1).is_multiple_of(pattern))
                .collect()
        };
        let (sliding_window, sliding_layers) = match arch {
            // llama.cpp's defaults for Gemma 3: a 512-token window, and every
            // sixth layer global.
            Architecture::Gemma3 => (
                Some(optional("attention.sliding_window", 1..=u32::MAX, 512)?),
                every(optional(
                    "attention.sliding_window_pattern",
                    1..=MAX_LAYERS,
                    6,
                )?),
            ),
            // llama.cpp requires gpt-oss's window; every second layer is
            // global by default.
            Architecture::GptOss => (
                Some(required("attention.sliding_window", 1..=u32::MAX)?),
                every(optional(
                    "attention.sliding_window_pattern",
                    1..=MAX_LAYERS,
                    2,
                )?),
            ),
            // llama.cpp requires Gemma 4's window and its flag for each layer.
            Architecture::Gemma4 => (
                Some(required("attention.sliding_window", 1..=u32::MAX)?),
                per_layer_flags(
                    &gguf.require(&key("attention.sliding_window_pattern"))?,
                    n_layer,
                )?,
            ),
            Architecture::Llama
            | Architecture::Qwen2
            | Architecture::Qwen3
            | Architecture::Qwen3Moe
            | Architecture::Qwen35
            | Architecture::Qwen35Moe => (None, vec![false; n_layer as usize]),
        };
        // The KV heads of the layers of one kind (sliding or full), which
        // must agree; where no layer is of that kind, the first layer's.
        let kv_heads_of_kind = |sliding: bool| -> Result<u32> {
            let mut kind = kv_heads_of_layers
                .iter()
                .zip(&sliding_layers)
                .filter(|&(_, &s)| s == sliding)
                .map(|(&kv, _)| kv);
            let first = kind.next().unwrap_or(kv_heads_of_layers[0]);
            match kind.find(|&kv| kv != first) {
                None => Ok(first),
                Some(other) => Err(Error::unsupported(format!(
                    "{} = {kv_heads_of_layers:?} gives the {} layers {first} and {other} KV heads; this build takes one count for each kind of layer",
                    key("attention.head_count_kv"),
                    if sliding { "sliding-window" } else { "full-attention" }
                ))),
            }
        };
        let n_head_kv = kv_heads_of_kind(false)?;
        let (sliding_heads, rope_freq_base_swa, final_logit_softcap) = match arch {
            Architecture::Gemma4 => {
                let g = gemma4_params(gguf, a, head_dim_k, head_dim_v, rope_dim)?;
                let heads = LayerHeads {
                    n_head_kv: kv_heads_of_kind(true)?,
                    head_dim_k: g.head_dim_swa,
                    head_dim_v: g.head_dim_swa,
                    rope_dim: g.rope_dim_swa,
                };
                (
                    Some(heads),
                    Some(g.rope_freq_base_swa),
                    g.final_logit_softcap,
                )
            }
            _ => (None, None, None),
        };
        // Mixture of experts as llama.cpp reads it: LLaMA has experts when
        // `expert_count` > 0 (Mixtral), each as wide as the dense FFN would
        // be; Qwen3-MoE always has them, `expert_feed_forward_length` wide
        // (else n_ff / n_expert_used); gpt-oss always, and names their width.
        let (n_expert, n_expert_used, n_ff_exp) = match arch {
            Architecture::Llama
            | Architecture::Qwen3Moe
            | Architecture::Qwen35Moe
            | Architecture::GptOss => {
                let always = arch != Architecture::Llama;
                let n_expert = optional("expert_count", u32::from(always)..=MAX_EXPERTS, 0)?;
                if n_expert == 0 {
                    if always {
                        return Err(Error::format(format!(
                            "a {a} model needs {} > 0",
                            key("expert_count")
                        )));
                    }
                    (0, 0, 0)
                } else {
                    let n_used = required("expert_used_count", 1..=n_expert)?;
                    let n_ff_exp = match arch {
                        Architecture::GptOss => {
                            required("expert_feed_forward_length", 1..=MAX_FEED_FORWARD)?
                        }
                        Architecture::Qwen3Moe | Architecture::Qwen35Moe => optional(
                            "expert_feed_forward_length",
                            1..=MAX_FEED_FORWARD,
                            n_ff / n_used,
                        )?,
                        _ => n_ff,
                    };
                    if n_ff_exp == 0 {
                        return Err(Error::format(format!(
                            "the experts' feed-forward width is 0 (set {})",
                            key("expert_feed_forward_length")
                        )));
                    }
                    (n_expert, n_used, n_ff_exp)
                }
            }
            Architecture::Qwen2
            | Architecture::Qwen3
            | Architecture::Gemma3
            | Architecture::Qwen35
            | Architecture::Gemma4 => (0, 0, 0),
        };
        let delta_net = if arch.is_hybrid() {
            Some(delta_net_params(gguf, a, head_dim_k, head_dim_v)?)
        } else {
            None
        };
        // llama.cpp's default: the shared expert as wide as the dense FFN.
        let n_ff_shared = match arch {
            Architecture::Qwen35Moe => optional(
                "expert_shared_feed_forward_length",
                1..=MAX_FEED_FORWARD,
                n_ff,
            )?,
            _ => 0,
        };
        if let Some(entry) = gguf.get(&key("expert_weights_scale")) {
            let scale = entry.f32_in(f32::MIN..=f32::MAX)?;
            if scale != 0.0 && scale != 1.0 {
                return Err(Error::unsupported(format!(
                    "{} = {scale}: scaled expert weights are not supported",
                    key("expert_weights_scale")
                )));
            }
        }
        if arch == Architecture::GptOss {
            check_gpt_oss_heads(gguf, a, head_dim_k, head_dim_v, rope_dim, rope_freq_base)?;
        }
        if let Some(net) = delta_net {
            check_text_rope_sections(gguf, a, rope_dim)?;
            if n_layer < net.full_attention_interval {
                return Err(Error::format(format!(
                    "{} = {} leaves the model's {n_layer} layers without a full-attention layer",
                    key("full_attention_interval"),
                    net.full_attention_interval
                )));
            }
        }
        Ok(HyperParams {
            n_vocab,
            n_ctx_train,
            n_embd,
            n_layer,
            n_ff,
            n_head,
            n_head_kv,
            head_dim_k,
            head_dim_v,
            rope_dim,
            sliding_heads,
            rope_freq_base,
            rope_freq_base_swa,
            rope_freq_scale,
            yarn,
            rms_eps,
            sliding_window,
            sliding_layers,
            final_logit_softcap,
            n_expert,
            n_expert_used,
            n_ff_exp,
            n_ff_shared,
            delta_net,
        })
    }

    /// Whether the feed-forward blocks are mixtures of experts.
    pub fn is_moe(&self) -> bool {
        self.n_expert > 0
    }

    /// Whether layer `il` is a Gated DeltaNet layer (else attention).
    pub fn is_linear_layer(&self, il: usize) -> bool {
        self.delta_net
            .is_some_and(|n| !(il + 1).is_multiple_of(n.full_attention_interval as usize))
    }

    /// Whether layer `il` attends over the sliding window only.
    pub fn is_sliding(&self, il: usize) -> bool {
        self.sliding_layers[il]
    }

    /// The key/value heads and rotation of attention layer `il`.
    pub fn heads(&self, il: usize) -> LayerHeads {
        match self.sliding_heads.filter(|_| self.is_sliding(il)) {
            Some(heads) => heads,
            None => LayerHeads {
                n_head_kv: self.n_head_kv,
                head_dim_k: self.head_dim_k,
                head_dim_v: self.head_dim_v,
                rope_dim: self.rope_dim,
            },
        }
    }

    /// What a sequence's cache keeps for layer `il`: keys and values as
    /// wide as its heads, or a linear-attention layer's state.
    pub fn layer_state(&self, il: usize) -> LayerState {
        match self.delta_net.filter(|_| self.is_linear_layer(il)) {
            Some(net) => LayerState::Recurrent(net.shape()),
            None => {
                let (k_width, v_width) = self.heads(il).kv_widths();
                LayerState::Kv { k_width, v_width }
            }
        }
    }
}

/// An integer for each of `n_layer` layers: an array of exactly that many,
/// or one number for all (llama.cpp's `get_key_or_arr`).
fn per_layer_u32(
    entry: &Entry,
    n_layer: u32,
    range: std::ops::RangeInclusive<u32>,
) -> Result<Vec<u32>> {
    let Value::Array(array) = entry.value else {
        return Ok(vec![entry.u32_in(range)?; n_layer as usize]);
    };
    let values: Vec<i64> = match array {
        Array::I32(v) => v.iter().map(|&x| i64::from(x)).collect(),
        Array::U32(v) => v.iter().map(|&x| i64::from(x)).collect(),
        _ => {
            return Err(Error::format(format!(
                "metadata key '{}' is not a number or an array of 32-bit integers",
                echo(entry.key)
            )))
        }
    };
    let in_range = |&x: &i64| (i64::from(*range.start())..=i64::from(*range.end())).contains(&x);
    if values.len() != n_layer as usize || !values.iter().all(in_range) {
        return Err(Error::format(format!(
            "metadata key '{}' must hold {n_layer} values (one a layer) in {}..={}",
            echo(entry.key),
            range.start(),
            range.end()
        )));
    }
    Ok(values.into_iter().map(|x| x as u32).collect())
}

/// A flag for each of `n_layer` layers, from an array of exactly that many
/// bools (or integers, nonzero for true: llama.cpp reads either).
fn per_layer_flags(entry: &Entry, n_layer: u32) -> Result<Vec<bool>> {
    let flags: Vec<bool> = match entry.array()? {
        Array::Bool(v) => v.clone(),
        Array::I32(v) => v.iter().map(|&x| x != 0).collect(),
        Array::U32(v) => v.iter().map(|&x| x != 0).collect(),
        _ => {
            return Err(Error::format(format!(
                "metadata key '{}' is not an array of bools",
                echo(entry.key)
            )))
        }
    };
    if flags.len() != n_layer as usize {
        return Err(Error::format(format!(
            "metadata key '{}' has {} entries for {n_layer} layers",
            echo(entry.key),
            flags.len()
        )));
    }
    Ok(flags)
}

/// What Gemma 4 reads beyond the other architectures' keys.
struct Gemma4Params {
    /// The sliding-window layers' width of each query, key and value head,
    /// and the dimensions RoPE rotates (their KV heads come from the
    /// per-layer `head_count_kv`).
    head_dim_swa: u32,
    rope_dim_swa: u32,
    rope_freq_base_swa: f32,
    final_logit_softcap: Option<f32>,
}

/// Gemma 4's `*_swa` keys, its soft-capping, and what this build refuses of
/// it: per-layer input embeddings and layers that reuse another layer's
/// KV cache (the E2B and E4B models), and mixtures of experts (26B-A4B).
/// llama.cpp requires queries, keys and values of one width in every layer
/// (the full-attention layers' values may be their keys).
fn gemma4_params(
    gguf: &GgufFile,
    a: &str,
    head_dim_k: u32,
    head_dim_v: u32,
    rope_dim: u32,
) -> Result<Gemma4Params> {
    let key = |k: &str| format!("{a}.{k}");
    let required = |k: &str, range| gguf.require(&key(k))?.u32_in(range);
    let optional = |k: &str, range, default| match gguf.get(&key(k)) {
        Some(entry) => entry.u32_in(range),
        None => Ok(default),
    };
    let refused = [
        (
            "embedding_length_per_layer_input",
            required("embedding_length_per_layer_input", 0..=MAX_EMBEDDING)?,
            "per-layer input embeddings",
        ),
        (
            "attention.shared_kv_layers",
            optional("attention.shared_kv_layers", 0..=MAX_LAYERS, 0)?,
            "layers that reuse another layer's KV cache",
        ),
        (
            "expert_count",
            optional("expert_count", 0..=MAX_EXPERTS, 0)?,
            "mixtures of experts",
        ),
    ];
    if let Some((k, value, what)) = refused.into_iter().find(|r| r.1 > 0) {
        return Err(Error::unsupported(format!(
            "{} = {value}: Gemma 4's {what} are not supported",
            key(k)
        )));
    }
    let head_dim_k_swa = required("attention.key_length_swa", 1..=MAX_HEAD_DIM)?;
    let head_dim_v_swa = required("attention.value_length_swa", 1..=MAX_HEAD_DIM)?;
    if head_dim_k != head_dim_v || head_dim_k_swa != head_dim_v_swa {
        return Err(Error::format(format!(
            "a {a} model's keys and values must be equally wide (here {head_dim_k} and {head_dim_v}, sliding-window layers {head_dim_k_swa} and {head_dim_v_swa})"
        )));
    }
    if head_dim_k_swa % 2 != 0 {
        return Err(Error::format(format!(
            "the sliding-window layers' head size {head_dim_k_swa} must be even (RoPE rotates pairs)"
        )));
    }
    // llama.cpp's default: the full-attention layers' rotation.
    let rope_dim_swa = optional("rope.dimension_count_swa", 2..=MAX_HEAD_DIM, rope_dim)?;
    if rope_dim_swa % 2 != 0 || rope_dim_swa > head_dim_k_swa {
        return Err(Error::format(format!(
            "{} = {rope_dim_swa} must be even and at most the sliding-window layers' head size {head_dim_k_swa}",
            key("rope.dimension_count_swa")
        )));
    }
    let rope_freq_base_swa = match gguf.get(&key("rope.freq_base_swa")) {
        Some(entry) => entry.f32_in(f32::MIN_POSITIVE..=f32::MAX)?,
        // llama.cpp's default (`rope_freq_base_train_swa`).
        None => 10_000.0,
    };
    // 0 (llama.cpp's default) turns capping off.
    let final_logit_softcap = match gguf.get(&key("final_logit_softcapping")) {
        Some(entry) => Some(entry.f32_in(0.0..=f32::MAX)?).filter(|&c| c > 0.0),
        None => None,
    };
    Ok(Gemma4Params {
        head_dim_swa: head_dim_k_swa,
        rope_dim_swa,
        rope_freq_base_swa,
        final_logit_softcap,
    })
}

/// YaRN as llama.cpp sets it up for a model whose `rope.scaling.type` is
/// `yarn`: the original context from `rope.scaling.original_context_length`
/// (else the training context), ggml's default ramp (β 32 and 1), and the
/// context's attention factor ([`yarn_attn_factor`]).
fn yarn_params(gguf: &GgufFile, a: &str, n_ctx_train: u32, freq_scale: f32) -> Result<Yarn> {
    let key = |k: &str| format!("{a}.{k}");
    let orig_ctx = match gguf.get(&key("rope.scaling.original_context_length")) {
        Some(entry) => entry.u32_in(1..=u32::MAX)?,
        None => n_ctx_train,
    };
    let rope_attn_factor = match gguf.get(&key("rope.scaling.attn_factor")) {
        Some(entry) => entry.f32_in(f32::MIN_POSITIVE..=f32::MAX)?,
        None => 1.0,
    };
    Ok(Yarn {
        orig_ctx,
        beta_fast: 32.0,
        beta_slow: 1.0,
        attn_factor: yarn_attn_factor(freq_scale, rope_attn_factor),
    })
}

/// llama.cpp's `yarn_attn_factor` for YaRN at `freq_scale` (its
/// `llama_context`): `get_mscale(factor, 1)`, the magnitude
/// 1 + 0.1 · ln(factor) of YaRN's paper, divided by the same magnitude
/// that ggml's `rope_yarn` multiplies in itself, times the file's
/// `rope.scaling.attn_factor`.
fn yarn_attn_factor(freq_scale: f32, rope_attn_factor: f32) -> f32 {
    let factor = 1.0 / freq_scale;
    let mscale = if factor <= 1.0 {
        1.0
    } else {
        0.1 * factor.ln() + 1.0
    };
    mscale * (1.0 / (1.0 + 0.1 * factor.ln())) * rope_attn_factor
}

/// gpt-oss's heads as llama.cpp shapes them: `rope.dimension_count` wide
/// for queries, keys and values alike (its attention scale is
/// 1 / √rope_dim), and one RoPE base for every layer.
fn check_gpt_oss_heads(
    gguf: &GgufFile,
    a: &str,
    head_dim_k: u32,
    head_dim_v: u32,
    rope_dim: u32,
    rope_freq_base: f32,
) -> Result<()> {
    if head_dim_k != rope_dim || head_dim_v != rope_dim {
        return Err(Error::format(format!(
            "a {a} model's heads are {a}.rope.dimension_count = {rope_dim} wide, not {head_dim_k} (keys) and {head_dim_v} (values)"
        )));
    }
    let swa_base = format!("{a}.rope.freq_base_swa");
    if let Some(entry) = gguf.get(&swa_base) {
        let base = entry.f32_in(f32::MIN_POSITIVE..=f32::MAX)?;
        if base != rope_freq_base {
            return Err(Error::unsupported(format!(
                "{swa_base} = {base} differs from {a}.rope.freq_base = {rope_freq_base}: a RoPE base of the sliding-window layers' own is not supported"
            )));
        }
    }
    Ok(())
}

/// `{a}.ssm.*` and `{a}.full_attention_interval`, checked.
fn delta_net_params(
    gguf: &GgufFile,
    a: &str,
    head_dim_k: u32,
    head_dim_v: u32,
) -> Result<DeltaNetParams> {
    let key = |k: &str| format!("{a}.{k}");
    let required = |k: &str, range| gguf.require(&key(k))?.u32_in(range);
    let net = DeltaNetParams {
        conv_kernel: required("ssm.conv_kernel", 1..=64)?,
        head_dim: required("ssm.state_size", 1..=MAX_HEAD_DIM)?,
        n_k_heads: required("ssm.group_count", 1..=MAX_HEADS)?,
        n_v_heads: required("ssm.time_step_rank", 1..=MAX_HEADS)?,
        full_attention_interval: match gguf.get(&key("full_attention_interval")) {
            Some(entry) => entry.u32_in(1..=MAX_LAYERS)?,
            // llama.cpp's default.
            None => 4,
        },
    };
    if !net.n_v_heads.is_multiple_of(net.n_k_heads) {
        return Err(Error::format(format!(
            "{} = {} is not a multiple of {} = {}",
            key("ssm.time_step_rank"),
            net.n_v_heads,
            key("ssm.group_count"),
            net.n_k_heads
        )));
    }
    let inner = required("ssm.inner_size", 1..=u32::MAX)?;
    if inner != net.value_width() {
        return Err(Error::format(format!(
            "{} = {inner} is not {} × {} = {}",
            key("ssm.inner_size"),
            key("ssm.state_size"),
            key("ssm.time_step_rank"),
            net.value_width()
        )));
    }
    if head_dim_k != head_dim_v {
        return Err(Error::format(format!(
            "a {a} model's attention heads need equal key and value widths (here {head_dim_k} and {head_dim_v})"
        )));
    }
    Ok(net)
}

/// Checks that `{a}.rope.dimension_sections` (llama.cpp's interleaved
/// multi-section RoPE) rotates every pair of the `rope_dim` rotated
/// dimensions of a text token: pair i belongs to section (i mod Σ sections)
/// taken round-robin over the first three sections, whose positions are the
/// token's own; a pair of the fourth (position 0) would stay unrotated,
/// which this build's RoPE does not model.
fn check_text_rope_sections(gguf: &GgufFile, a: &str, rope_dim: u32) -> Result<()> {
    let name = format!("{a}.rope.dimension_sections");
    let entry = gguf.require(&name)?;
    let sections: Vec<i64> = match entry.array()? {
        Array::I32(v) => v.iter().map(|&x| i64::from(x)).collect(),
        Array::U32(v) => v.iter().map(|&x| i64::from(x)).collect(),
        _ => return Err(Error::format(format!("{name} is not an array of integers"))),
    };
    if sections.len() != 4
        || sections
            .iter()
            .any(|&s| !(0..=i64::from(MAX_HEAD_DIM)).contains(&s))
    {
        return Err(Error::format(format!(
            "{name} must hold four section sizes in 0..={MAX_HEAD_DIM}"
        )));
    }
    let total: i64 = sections.iter().sum();
    if total == 0 {
        return Err(Error::format(format!("{name} has no dimensions")));
    }
    let rotates = |pair: i64| {
        let sector = pair % total;
        (0..3).any(|s| sector % 3 == s && sector < 3 * sections[s as usize])
    };
    match (0..i64::from(rope_dim / 2)).find(|&p| !rotates(p)) {
        None => Ok(()),
        Some(pair) => Err(Error::unsupported(format!(
            "{name} = {sections:?} leaves RoPE pair {pair} of a text token unrotated, which this build does not support"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yarn_attention_factor_cancels_the_magnitude_ggml_applies() {
        // gpt-oss: factor 32. get_mscale(32, 1) = 1 + 0.1 ln 32 = 1.346574,
        // divided by the same 1 + 0.1 ln 32 (llama_context's cancellation
        // of rope_yarn's own magnitude): 1, to f32 rounding; the file's
        // attention factor multiplies it.
        assert!((yarn_attn_factor(1.0 / 32.0, 1.0) - 1.0).abs() < 1e-6);
        assert!((yarn_attn_factor(1.0 / 32.0, 0.5) - 0.5).abs() < 1e-6);
        // No scaling (factor 1): get_mscale is 1 and ln 1 = 0.
        assert_eq!(yarn_attn_factor(1.0, 1.0), 1.0);
    }
}
