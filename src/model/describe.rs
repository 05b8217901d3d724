//! `m40_model_describe`: a JSON summary of a loaded model.

use std::collections::BTreeMap;

use super::{HyperParams, LayerHeads, Model};
use crate::backend::{Device, LayerState};
use crate::json::JsonObject;

impl Model {
    /// One JSON object: architecture, sizes, tensor types and where it runs.
    /// Keys that a vocab-only load does not know are `null`.
    pub fn describe_json(&self) -> String {
        let gguf = self.gguf();
        let mut types: BTreeMap<&str, usize> = BTreeMap::new();
        for t in gguf.tensors() {
            *types.entry(t.ggml_type.name()).or_default() += 1;
        }
        let parameters: u64 = gguf.tensors().iter().map(|t| t.n_elements()).sum();
        let name = gguf
            .get("general.name")
            .and_then(|e| e.str().ok().map(str::to_string));
        let hp = self.hparams();
        let num =
            |f: fn(&HyperParams) -> u32| hp.map_or("null".to_string(), |hp| f(hp).to_string());
        let or_null = |v: Option<u64>| v.map_or("null".to_string(), |v| v.to_string());
        // The sliding-window layers' heads (Gemma 4's differ from the others').
        let sliding = |f: fn(&LayerHeads) -> u32| {
            or_null(hp.and_then(|h| {
                let il = h.sliding_layers.iter().position(|&s| s)?;
                Some(u64::from(f(&h.heads(il))))
            }))
        };

        let mut j = JsonObject::new();
        j.string("architecture", Some(self.architecture_name()))
            .string("name", name.as_deref())
            .value("gguf_version", gguf.version())
            .value("file_size", gguf.file_size())
            .value("parameters", parameters)
            .value(
                "weight_bytes",
                gguf.tensors().iter().map(|t| t.n_bytes).sum::<u64>(),
            )
            .value(
                "weight_bytes_per_token",
                or_null(self.weight_bytes_per_token()),
            )
            .value("vocab_size", self.n_vocab())
            .value("context_length", self.n_ctx_train())
            .value("layers", num(|h| h.n_layer))
            .value("embedding_size", num(|h| h.n_embd))
            .value("feed_forward_size", num(|h| h.n_ff))
            .value("heads", num(|h| h.n_head))
            .value("kv_heads", num(|h| h.n_head_kv))
            .value("head_dim", num(|h| h.head_dim_k))
            .value("sliding_kv_heads", sliding(|h| h.n_head_kv))
            .value("sliding_head_dim", sliding(|h| h.head_dim_k))
            .value(
                "sliding_window",
                or_null(hp.and_then(|h| h.sliding_window).map(u64::from)),
            )
            .value(
                "expert_count",
                or_null(hp.filter(|h| h.is_moe()).map(|h| u64::from(h.n_expert))),
            )
            .value(
                "expert_used_count",
                or_null(
                    hp.filter(|h| h.is_moe())
                        .map(|h| u64::from(h.n_expert_used)),
                ),
            )
            .value("tensor_count", gguf.tensors().len());
        let mut tensor_types = JsonObject::new();
        for (ty, count) in &types {
            tensor_types.value(ty, count);
        }
        let chat = self.chat_template().ok().map(|t| t.name());
        j.value("tensor_types", tensor_types.finish())
            .string("chat_template", chat)
            .value("vocab_only", self.options().vocab_only)
            .value("mmap", gguf.data().is_some_and(|d| d.is_mapped()))
            .string("backend", Some(self.device().backend_name()))
            .string("device", Some(&self.device().name()));
        match self.device() {
            Device::Cpu { threads } => j.value("threads", threads),
            Device::Cuda { index } => j.value("device_index", index),
        };
        if let Some(engine) = &self.engine {
            engine.stages[0].backend.describe(&mut j);
            j.value("devices", self.describe_stages());
        }
        j.finish()
    }

    /// The devices that hold the model, in order: which layers each holds,
    /// its bytes of weights, of KV cache per token of a session, and of a
    /// session's recurrent state (linear-attention layers: a fixed size
    /// whatever the context).
    fn describe_stages(&self) -> String {
        let hp = self
            .hparams()
            .expect("a computing model has hyper-parameters");
        let w = self.weights();
        let stages = self.stages();
        // f16 keys and values of a position in layer `il`.
        let kv_bytes = |il: usize| match hp.layer_state(il) {
            LayerState::Kv { k_width, v_width } => (k_width + v_width) as u64 * 2,
            LayerState::Recurrent(_) => 0,
        };
        let items: Vec<String> = stages
            .iter()
            .enumerate()
            .map(|(i, stage)| {
                let (first, last) = (i == 0, i + 1 == stages.len());
                let weight_bytes: u64 = self
                    .gguf()
                    .tensors()
                    .iter()
                    .filter(|t| w.stage_holds(&t.name, &stage.layers, first, last))
                    .map(|t| t.n_bytes)
                    .sum();
                let attention_layers = stage
                    .layers
                    .clone()
                    .filter(|&il| !hp.is_linear_layer(il))
                    .count() as u64;
                let kv_bytes_per_token: u64 = stage.layers.clone().map(kv_bytes).sum();
                let recurrent_layers = stage.layers.len() as u64 - attention_layers;
                let (conv, ssm) = hp.delta_net.map_or((0, 0), |p| p.shape().state_values());
                let recurrent_bytes = recurrent_layers * (conv + ssm) as u64 * 4;
                let mut j = JsonObject::new();
                j.string("backend", Some(stage.device.backend_name()))
                    .string("device", Some(&stage.device.name()));
                match stage.device {
                    Device::Cpu { threads } => j.value("threads", threads),
                    Device::Cuda { index } => j.value("device_index", index),
                };
                j.value(
                    "layers",
                    format_args!("[{},{}]", stage.layers.start, stage.layers.end),
                )
                .value("embedding", first)
                .value("output", last)
                .value("weight_bytes", weight_bytes)
                .value("kv_bytes_per_token", kv_bytes_per_token)
                .value("recurrent_state_bytes", recurrent_bytes);
                j.finish()
            })
            .collect();
        format!("[{}]", items.join(","))
    }

    /// Bytes of weights one generated token reads: every matrix once, except
    /// the embedding table, of which only one row is read (unless it is also
    /// the output projection, which reads it whole), and the experts (their
    /// matrices and biases), of which only the `n_expert_used` routed ones
    /// are read.
    pub fn weight_bytes_per_token(&self) -> Option<u64> {
        let hp = self.hparams()?;
        let w = self.weights();
        let all: u64 = self
            .gguf()
            .tensors()
            .iter()
            .map(|t| {
                if t.name.ends_with("_exps.weight") || t.name.ends_with("_exps.bias") {
                    t.n_bytes / u64::from(hp.n_expert) * u64::from(hp.n_expert_used)
                } else {
                    t.n_bytes
                }
            })
            .sum();
        let embd = w.token_embd.n_bytes as u64;
        let embd_row = w.token_embd.row_bytes() as u64;
        let tied = if w.output_is_embedding() { embd } else { 0 };
        Some(all - embd + embd_row + tied)
    }
}
