//! libm40llm: LLM inference for GGUF models behind a plain C ABI.
//!
//! The engine modules are safe Rust with one error type ([`error::Error`]);
//! [`ffi`] is the thin C boundary over them.

pub mod backend;
pub mod chat;
pub mod error;
pub mod ffi;
pub mod gguf;
mod json;
pub mod kv_cache;
pub mod model;
pub mod quant;
pub mod sampling;
pub mod session;
pub mod tokenizer;
