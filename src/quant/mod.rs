//! Tensor storage formats: the ggml type ids GGUF files use and their block
//! layouts. The per-format dequantizers and dot products live beside this.

mod types;

pub use types::GgmlType;
