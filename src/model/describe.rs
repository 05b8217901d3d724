//! `m40_model_describe`: a JSON summary of a loaded model.

use std::collections::BTreeMap;
use std::fmt::Write;

use super::Model;
use crate::backend::Device;

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
        let num = |f: fn(&super::HyperParams) -> u32| {
            hp.map_or("null".to_string(), |hp| f(hp).to_string())
        };

        let mut j = String::from("{");
        let _ = write!(
            j,
            "\"architecture\":{}",
            json_string(self.architecture_name())
        );
        let _ = write!(
            j,
            ",\"name\":{}",
            name.as_deref().map_or("null".to_string(), json_string)
        );
        let _ = write!(j, ",\"gguf_version\":{}", gguf.version());
        let _ = write!(j, ",\"file_size\":{}", gguf.file_size());
        let _ = write!(j, ",\"parameters\":{parameters}");
        let _ = write!(
            j,
            ",\"weight_bytes\":{}",
            gguf.tensors().iter().map(|t| t.n_bytes).sum::<u64>()
        );
        let _ = write!(
            j,
            ",\"weight_bytes_per_token\":{}",
            self.weight_bytes_per_token()
                .map_or("null".to_string(), |b| b.to_string())
        );
        let _ = write!(j, ",\"vocab_size\":{}", self.n_vocab());
        let _ = write!(j, ",\"context_length\":{}", self.n_ctx_train());
        let _ = write!(j, ",\"layers\":{}", num(|h| h.n_layer));
        let _ = write!(j, ",\"embedding_size\":{}", num(|h| h.n_embd));
        let _ = write!(j, ",\"feed_forward_size\":{}", num(|h| h.n_ff));
        let _ = write!(j, ",\"heads\":{}", num(|h| h.n_head));
        let _ = write!(j, ",\"kv_heads\":{}", num(|h| h.n_head_kv));
        let _ = write!(j, ",\"head_dim\":{}", num(|h| h.head_dim_k));
        let _ = write!(
            j,
            ",\"sliding_window\":{}",
            hp.and_then(|h| h.sliding_window)
                .map_or("null".to_string(), |w| w.to_string())
        );
        let _ = write!(j, ",\"tensor_count\":{}", gguf.tensors().len());
        j.push_str(",\"tensor_types\":{");
        for (i, (ty, count)) in types.iter().enumerate() {
            let _ = write!(
                j,
                "{}{}:{count}",
                if i > 0 { "," } else { "" },
                json_string(ty)
            );
        }
        j.push('}');
        let chat = crate::chat::ChatTemplate::for_model(self).map(|t| json_string(t.name()));
        let _ = write!(
            j,
            ",\"chat_template\":{}",
            chat.as_deref().unwrap_or("null")
        );
        let _ = write!(j, ",\"vocab_only\":{}", self.options().vocab_only);
        let _ = write!(
            j,
            ",\"mmap\":{}",
            gguf.data().is_some_and(|d| d.is_mapped())
        );
        let _ = write!(
            j,
            ",\"backend\":{}",
            json_string(self.device().backend_name())
        );
        let _ = write!(j, ",\"device\":{}", json_string(&self.device().name()));
        match self.device() {
            Device::Cpu { threads } => {
                let _ = write!(j, ",\"threads\":{threads}");
            }
            Device::Cuda { index } => {
                let _ = write!(j, ",\"device_index\":{index}");
                #[cfg(feature = "cuda")]
                if let Some(crate::backend::ModelBackend::Cuda(b)) =
                    self.engine.as_ref().map(|e| &e.backend)
                {
                    self.describe_cuda(b, &mut j);
                }
            }
        }
        j.push('}');
        j
    }
}

impl Model {
    /// The CUDA device and its memory as the backend uses it.
    #[cfg(feature = "cuda")]
    fn describe_cuda(&self, b: &crate::backend::cuda::CudaBackend, j: &mut String) {
        let info = b.info();
        let (major, minor) = info.compute_capability;
        let _ = write!(j, ",\"compute_capability\":\"{major}.{minor}\"");
        let _ = write!(j, ",\"multiprocessors\":{}", info.multiprocessors);
        let _ = write!(j, ",\"driver_version\":{}", info.driver_version);
        let _ = write!(
            j,
            ",\"cublas\":{}",
            b.cublas_library().map_or("null".to_string(), json_string)
        );
        if let Ok(gbps) = b.memory_bandwidth_gbps() {
            let _ = write!(j, ",\"memory_bandwidth_gbps\":{gbps:.1}");
        }
        let m = b.memory_stats();
        let _ = write!(
            j,
            ",\"device_memory\":{{\"total\":{},\"weights\":{},\"in_use\":{},\"peak\":{},\"cached\":{},\"cache_hits\":{},\"device_allocations\":{}}}",
            info.total_memory,
            b.weight_bytes(),
            m.in_use,
            m.peak,
            m.cached,
            m.cache_hits,
            m.device_allocations
        );
    }

    /// Bytes of weights one generated token reads: every matrix once, except
    /// the embedding table, of which only one row is read (unless it is also
    /// the output projection, which reads it whole).
    pub fn weight_bytes_per_token(&self) -> Option<u64> {
        let w = self.hparams().map(|_| self.weights())?;
        let all: u64 = self.gguf().tensors().iter().map(|t| t.n_bytes).sum();
        let embd = w.token_embd.n_bytes as u64;
        let embd_row = w.token_embd.row_bytes() as u64;
        let tied = w.output == w.token_embd;
        Some(all - embd + embd_row + if tied { embd } else { 0 })
    }
}

/// `s` as a JSON string literal.
fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::json_string;

    #[test]
    fn json_strings_escape_quotes_backslashes_and_controls() {
        assert_eq!(json_string("a\"b\\c\n\u{1}é"), "\"a\\\"b\\\\c\\n\\u0001é\"");
    }
}
