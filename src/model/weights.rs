//! The weights of a transformer, located in the GGUF data section: which
//! tensor plays which part of each layer.

use super::{Architecture, HyperParams};
use crate::backend::{ExpertBiases, Experts, SharedExpert, Weight};
use crate::gguf::GgufFile;

/// A layer's feed-forward block: down(act(gate · h) · (up · h)), or a
/// mixture of experts, each such a block.
pub enum FeedForward {
    Dense {
        gate: Weight,
        up: Weight,
        down: Weight,
    },
    Experts(Box<Experts>),
}

/// A layer's attention: q, k, v and output projections, with the biases
/// and per-head norms the architecture has.
pub struct AttentionWeights {
    /// The query projection; with `gated_output`, each head's queries are
    /// followed by as many gate values.
    pub wq: Weight,
    pub wk: Weight,
    /// The value projection; `None` where the keys' projection, before its
    /// norm and RoPE, gives the values (Gemma 4's full-attention layers).
    pub wv: Option<Weight>,
    pub wo: Weight,
    pub bq: Option<Weight>,
    pub bk: Option<Weight>,
    pub bv: Option<Weight>,
    /// The output projection's bias (gpt-oss).
    pub bo: Option<Weight>,
    pub q_norm: Option<Weight>,
    pub k_norm: Option<Weight>,
    /// The output of each head is multiplied by σ(its gate) before the
    /// output projection (Qwen3.5).
    pub gated_output: bool,
    /// A logit per query head that joins its softmax without a value
    /// (gpt-oss).
    pub sinks: Option<Weight>,
}

/// A Gated DeltaNet (linear attention) layer's weights, named as llama.cpp
/// names them.
pub struct DeltaNetWeights {
    /// q, k and v of every head, before the convolution (`attn_qkv`).
    pub qkv: Weight,
    /// The output gate z (`attn_gate`).
    pub gate: Weight,
    /// The convolution's taps, one row per channel (`ssm_conv1d`).
    pub conv: Weight,
    /// Per value head: the decay's bias (`ssm_dt.bias`) and −e^A (`ssm_a`).
    pub dt_bias: Weight,
    pub a: Weight,
    /// Per value head: the write strength's (`ssm_beta`) and the decay's
    /// (`ssm_alpha`) projections.
    pub beta: Weight,
    pub alpha: Weight,
    /// RMS norm of each head's output (`ssm_norm`).
    pub norm: Weight,
    pub out: Weight,
}

/// What mixes a layer's positions.
pub enum Mixer {
    Attention(AttentionWeights),
    DeltaNet(DeltaNetWeights),
}

pub struct LayerWeights {
    pub attn_norm: Weight,
    pub mixer: Mixer,
    pub post_attn_norm: Option<Weight>,
    pub ffn_norm: Weight,
    pub ffn: FeedForward,
    pub shared_expert: Option<SharedExpert>,
    pub post_ffn_norm: Option<Weight>,
    /// One value that multiplies the layer's output, residual included
    /// (Gemma 4).
    pub output_scale: Option<Weight>,
}

impl LayerWeights {
    /// The layer's attention, if it has attention.
    pub fn attention(&self) -> Option<&AttentionWeights> {
        match &self.mixer {
            Mixer::Attention(a) => Some(a),
            Mixer::DeltaNet(_) => None,
        }
    }
}

pub struct Weights {
    pub token_embd: Weight,
    pub output_norm: Weight,
    /// The output projection; the embedding table when the file ties them.
    pub output: Weight,
    pub rope_freqs: Option<Weight>,
    pub layers: Vec<LayerWeights>,
}

impl Weights {
    /// Locates every weight; `arch::check_tensors` has already checked that
    /// the required ones exist with the right shapes.
    pub fn locate(gguf: &GgufFile, arch: Architecture, hp: &HyperParams) -> Weights {
        let n_layer = hp.n_layer as usize;
        let get = |name: &str| gguf.tensor(name).map(Weight::from_info);
        let req =
            |name: &str| get(name).unwrap_or_else(|| panic!("tensor '{name}' was checked at load"));
        let token_embd = req("token_embd.weight");
        Weights {
            token_embd,
            output_norm: req("output_norm.weight"),
            output: get("output.weight").unwrap_or(token_embd),
            rope_freqs: get("rope_freqs.weight"),
            layers: (0..n_layer)
                .map(|i| {
                    let b = |n: &str| format!("blk.{i}.{n}");
                    let mixer = if hp.is_linear_layer(i) {
                        Mixer::DeltaNet(DeltaNetWeights {
                            qkv: req(&b("attn_qkv.weight")),
                            gate: req(&b("attn_gate.weight")),
                            conv: req(&b("ssm_conv1d.weight")),
                            dt_bias: req(&b("ssm_dt.bias")),
                            a: req(&b("ssm_a")),
                            beta: req(&b("ssm_beta.weight")),
                            alpha: req(&b("ssm_alpha.weight")),
                            norm: req(&b("ssm_norm.weight")),
                            out: req(&b("ssm_out.weight")),
                        })
                    } else {
                        Mixer::Attention(AttentionWeights {
                            wq: req(&b("attn_q.weight")),
                            wk: req(&b("attn_k.weight")),
                            wv: get(&b("attn_v.weight")),
                            wo: req(&b("attn_output.weight")),
                            bq: get(&b("attn_q.bias")),
                            bk: get(&b("attn_k.bias")),
                            bv: get(&b("attn_v.bias")),
                            bo: get(&b("attn_output.bias")),
                            q_norm: get(&b("attn_q_norm.weight")),
                            k_norm: get(&b("attn_k_norm.weight")),
                            gated_output: hp.delta_net.is_some(),
                            sinks: get(&b("attn_sinks.weight")),
                        })
                    };
                    // Where `post_attention_norm` is the feed-forward norm
                    // (Qwen3.5, gpt-oss), there is no norm after attention.
                    let post_attn = "post_attention_norm.weight";
                    let (ffn_norm, post_attn_norm) = match arch.ffn_norm_name() {
                        name if name == post_attn => (req(&b(name)), None),
                        name => (req(&b(name)), get(&b(post_attn))),
                    };
                    LayerWeights {
                        attn_norm: req(&b("attn_norm.weight")),
                        mixer,
                        post_attn_norm,
                        ffn_norm,
                        ffn: if hp.is_moe() {
                            FeedForward::Experts(Box::new(Experts {
                                router: req(&b("ffn_gate_inp.weight")),
                                gate: req(&b("ffn_gate_exps.weight")),
                                up: req(&b("ffn_up_exps.weight")),
                                down: req(&b("ffn_down_exps.weight")),
                                n_expert: hp.n_expert as usize,
                                n_used: hp.n_expert_used as usize,
                                biases: get(&b("ffn_gate_inp.bias")).map(|router| ExpertBiases {
                                    router,
                                    gate: req(&b("ffn_gate_exps.bias")),
                                    up: req(&b("ffn_up_exps.bias")),
                                    down: req(&b("ffn_down_exps.bias")),
                                }),
                            }))
                        } else {
                            FeedForward::Dense {
                                gate: req(&b("ffn_gate.weight")),
                                up: req(&b("ffn_up.weight")),
                                down: req(&b("ffn_down.weight")),
                            }
                        },
                        shared_expert: (hp.n_ff_shared > 0).then(|| SharedExpert {
                            gate_inp: req(&b("ffn_gate_inp_shexp.weight")),
                            gate: req(&b("ffn_gate_shexp.weight")),
                            up: req(&b("ffn_up_shexp.weight")),
                            down: req(&b("ffn_down_shexp.weight")),
                        }),
                        post_ffn_norm: get(&b("post_ffw_norm.weight")),
                        output_scale: get(&b("layer_output_scale.weight")),
                    }
                })
                .collect(),
        }
    }
}

/// Bytes of weights of each of the `n_layer` layers (`blk.N.*`).
pub fn layer_bytes(gguf: &GgufFile, n_layer: usize) -> Vec<u64> {
    let mut bytes = vec![0u64; n_layer];
    for t in gguf.tensors() {
        if let Some(il) = layer_of(&t.name).filter(|&il| il < n_layer) {
            bytes[il] += t.n_bytes;
        }
    }
    bytes
}

/// The layer a tensor belongs to, from its name (`blk.N.`).
fn layer_of(name: &str) -> Option<usize> {
    name.strip_prefix("blk.")?.split('.').next()?.parse().ok()
}

impl Weights {
    /// Whether the output projection is the embedding table (the file ties them).
    pub fn output_is_embedding(&self) -> bool {
        self.output == self.token_embd
    }

    /// Whether the stage running `layers` (the first and/or last of a
    /// split) needs the tensor `name`: its layers' tensors, the embedding
    /// table on the first stage (and on the last when it is also the output
    /// projection), the output norm and projection on the last, and whatever
    /// belongs to no layer (RoPE factors) everywhere.
    pub fn stage_holds(
        &self,
        name: &str,
        layers: &std::ops::Range<usize>,
        first: bool,
        last: bool,
    ) -> bool {
        if let Some(il) = layer_of(name) {
            return layers.contains(&il);
        }
        match name {
            "token_embd.weight" => first || (last && self.output_is_embedding()),
            "output.weight" | "output_norm.weight" => last,
            _ => true,
        }
    }
}
