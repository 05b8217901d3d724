//! The weights of a transformer, located in the GGUF data section. Backends
//! resolve a [`Weight`] to their own copy (the CPU reads it from the file's
//! mapping, a GPU from the copy it uploaded).

use crate::gguf::{GgufFile, TensorInfo};
use crate::quant::GgmlType;

/// A weight matrix (or vector: one row) in its stored format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Weight {
    pub ty: GgmlType,
    pub rows: usize,
    /// Values per row (GGUF's first dimension).
    pub cols: usize,
    /// Byte range inside the data section.
    pub offset: usize,
    pub n_bytes: usize,
}

impl Weight {
    fn from_info(info: &TensorInfo) -> Weight {
        Weight {
            ty: info.ggml_type,
            rows: (info.n_elements() / info.dims[0]) as usize,
            cols: info.dims[0] as usize,
            offset: info.offset as usize,
            n_bytes: info.n_bytes as usize,
        }
    }

    pub fn row_bytes(&self) -> usize {
        self.n_bytes / self.rows
    }
}

pub struct LayerWeights {
    pub attn_norm: Weight,
    pub wq: Weight,
    pub wk: Weight,
    pub wv: Weight,
    pub wo: Weight,
    pub bq: Option<Weight>,
    pub bk: Option<Weight>,
    pub bv: Option<Weight>,
    pub q_norm: Option<Weight>,
    pub k_norm: Option<Weight>,
    pub post_attn_norm: Option<Weight>,
    pub ffn_norm: Weight,
    pub ffn_gate: Weight,
    pub ffn_up: Weight,
    pub ffn_down: Weight,
    pub post_ffn_norm: Option<Weight>,
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
    pub fn locate(gguf: &GgufFile, n_layer: usize) -> Weights {
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
                    LayerWeights {
                        attn_norm: req(&b("attn_norm.weight")),
                        wq: req(&b("attn_q.weight")),
                        wk: req(&b("attn_k.weight")),
                        wv: req(&b("attn_v.weight")),
                        wo: req(&b("attn_output.weight")),
                        bq: get(&b("attn_q.bias")),
                        bk: get(&b("attn_k.bias")),
                        bv: get(&b("attn_v.bias")),
                        q_norm: get(&b("attn_q_norm.weight")),
                        k_norm: get(&b("attn_k_norm.weight")),
                        post_attn_norm: get(&b("post_attention_norm.weight")),
                        ffn_norm: req(&b("ffn_norm.weight")),
                        ffn_gate: req(&b("ffn_gate.weight")),
                        ffn_up: req(&b("ffn_up.weight")),
                        ffn_down: req(&b("ffn_down.weight")),
                        post_ffn_norm: get(&b("post_ffw_norm.weight")),
                    }
                })
                .collect(),
        }
    }
}
