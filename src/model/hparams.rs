//! Hyper-parameters of a supported architecture, read from `{arch}.*` metadata
//! and checked for the ranges and relations the forward pass relies on.

use super::Architecture;
use crate::error::{echo, Error, Result};
use crate::gguf::GgufFile;

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
    pub n_head_kv: u32,
    /// Width of one query/key head.
    pub head_dim_k: u32,
    /// Width of one value head.
    pub head_dim_v: u32,
    /// How many dimensions of each head RoPE rotates.
    pub rope_dim: u32,
    pub rope_freq_base: f32,
    /// Position scale of linear RoPE scaling (1 / factor; 1 without scaling).
    pub rope_freq_scale: f32,
    pub rms_eps: f32,
    /// Tokens a sliding-window (local) attention layer sees; gemma3 only.
    pub sliding_window: Option<u32>,
    /// Every this many layers one uses full attention (the others the
    /// sliding window); gemma3 only.
    pub sliding_window_pattern: u32,
    /// Experts of each mixture-of-experts feed-forward block; 0 for a dense
    /// model.
    pub n_expert: u32,
    /// Experts each row uses (1..=n_expert for a MoE model, else 0).
    pub n_expert_used: u32,
    /// Feed-forward width of one expert (0 for a dense model).
    pub n_ff_exp: u32,
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
        let n_ff = required("feed_forward_length", 1..=MAX_FEED_FORWARD)?;
        let n_head = required("attention.head_count", 1..=MAX_HEADS)?;
        let n_head_kv = optional("attention.head_count_kv", 1..=MAX_HEADS, n_head)?;
        if n_head % n_head_kv != 0 {
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
        let rope_freq_scale = match gguf.get(&key("rope.scaling.type")) {
            None => 1.0,
            Some(entry) => match entry.str()? {
                "none" => 1.0,
                "linear" => {
                    1.0 / gguf
                        .require(&key("rope.scaling.factor"))?
                        .f32_in(1e-3..=1e6)?
                }
                other => {
                    return Err(Error::unsupported(format!(
                        "{} = '{}' is not supported (only none and linear)",
                        key("rope.scaling.type"),
                        echo(other)
                    )))
                }
            },
        };
        let rms_eps = gguf
            .require(&key("attention.layer_norm_rms_epsilon"))?
            .f32_in(0.0..=1.0)?;
        let (sliding_window, sliding_window_pattern) = match arch {
            // llama.cpp's defaults for Gemma 3: a 512-token window, and every
            // sixth layer global.
            Architecture::Gemma3 => (
                Some(optional("attention.sliding_window", 1..=u32::MAX, 512)?),
                optional("attention.sliding_window_pattern", 1..=MAX_LAYERS, 6)?,
            ),
            Architecture::Llama
            | Architecture::Qwen2
            | Architecture::Qwen3
            | Architecture::Qwen3Moe => (None, 1),
        };
        // Mixture of experts as llama.cpp reads it: LLaMA has experts when
        // `expert_count` > 0 (Mixtral), each as wide as the dense FFN would
        // be; Qwen3-MoE always has them, `expert_feed_forward_length` wide
        // (else n_ff / n_expert_used).
        let (n_expert, n_expert_used, n_ff_exp) = match arch {
            Architecture::Llama | Architecture::Qwen3Moe => {
                let min = if arch == Architecture::Qwen3Moe { 1 } else { 0 };
                let n_expert = optional("expert_count", min..=MAX_EXPERTS, 0)?;
                if n_expert == 0 {
                    if arch == Architecture::Qwen3Moe {
                        return Err(Error::format(format!(
                            "a {a} model needs {} > 0",
                            key("expert_count")
                        )));
                    }
                    (0, 0, 0)
                } else {
                    let n_used = required("expert_used_count", 1..=n_expert)?;
                    let n_ff_exp = match arch {
                        Architecture::Qwen3Moe => optional(
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
            Architecture::Qwen2 | Architecture::Qwen3 | Architecture::Gemma3 => (0, 0, 0),
        };
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
            rope_freq_base,
            rope_freq_scale,
            rms_eps,
            sliding_window,
            sliding_window_pattern,
            n_expert,
            n_expert_used,
            n_ff_exp,
        })
    }

    /// Whether the feed-forward blocks are mixtures of experts.
    pub fn is_moe(&self) -> bool {
        self.n_expert > 0
    }
}
