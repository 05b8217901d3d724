//! Loading real files: the Gemma 3 270M model and llama.cpp's vocabulary files.

mod common;

use std::path::PathBuf;

use m40llm::error::ErrorKind;
use m40llm::model::{LoadOptions, Model};

fn options(use_mmap: bool, vocab_only: bool) -> LoadOptions {
    LoadOptions {
        device: -1,
        n_threads: 1,
        use_mmap,
        vocab_only,
    }
}

fn vocab_file(name: &str) -> PathBuf {
    common::vocab_path(name)
}

#[test]
fn gemma_loads_and_describes_its_architecture_sizes_and_tensor_types() {
    let path = common::gemma_path();
    let model = Model::load(&path, options(true, false)).unwrap();
    assert_eq!(model.architecture_name(), "gemma3");
    let hp = model.hparams().unwrap();
    assert_eq!(
        (
            hp.n_layer,
            hp.n_embd,
            hp.n_ff,
            hp.n_head,
            hp.n_head_kv,
            hp.head_dim_k,
            hp.n_vocab
        ),
        (18, 640, 2048, 4, 1, 256, 262144)
    );
    assert_eq!(hp.sliding_window, Some(512));
    assert_eq!(hp.rope_freq_base, 1_000_000.0);
    let json = model.describe_json();
    // Counts of each tensor type as gguf-py lists them for this file.
    assert!(
        json.contains(r#""tensor_types":{"F32":109,"Q4_K":27,"Q5_0":81,"Q6_K":9,"Q8_0":10}"#),
        "{json}"
    );
    assert!(
        json.contains(r#""architecture":"gemma3""#) && json.contains(r#""layers":18"#),
        "{json}"
    );
}

#[test]
fn gemma_tensor_bytes_are_the_same_mapped_or_read() {
    let path = common::gemma_path();
    let mapped = Model::load(&path, options(true, false)).unwrap();
    let read = Model::load(&path, options(false, false)).unwrap();
    for name in [
        "token_embd.weight",
        "blk.0.attn_q.weight",
        "blk.17.ffn_down.weight",
        "output_norm.weight",
    ] {
        let a = mapped.gguf().tensor(name).unwrap();
        let b = read.gguf().tensor(name).unwrap();
        assert_eq!(a, b);
        assert_eq!(
            mapped.gguf().tensor_bytes(a).unwrap(),
            read.gguf().tensor_bytes(b).unwrap(),
            "{name}"
        );
    }
}

#[test]
fn every_llama_cpp_vocab_file_loads_vocab_only() {
    // (file, n_vocab as gguf-py counts tokenizer.ggml.tokens)
    for (file, arch) in [
        ("llama-spm", "llama"),
        ("phi-3", "phi3"),
        ("gpt-2", "gpt2"),
        ("deepseek-llm", "llama"),
        ("starcoder", "starcoder2"),
        ("falcon", "falcon"),
    ] {
        for use_mmap in [true, false] {
            let model = Model::load(&vocab_file(file), options(use_mmap, true)).unwrap();
            assert_eq!(model.architecture_name(), arch, "{file}");
            assert!(model.n_vocab() > 30000, "{file}: {}", model.n_vocab());
            assert!(model.gguf().data().is_none());
        }
    }
}

#[test]
fn a_vocab_file_without_weights_is_not_a_runnable_model() {
    let err = Model::load(&vocab_file("llama-spm"), options(true, false)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Format);
    assert!(
        err.message().contains("token_embd.weight") && err.message().contains("missing"),
        "{err}"
    );
    let err = Model::load(&vocab_file("falcon"), options(true, false)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported);
    assert!(err.message().contains("'falcon'"), "{err}");
}
