//! Feeds arbitrary bytes to the GGUF reader and the model checks behind it.
//! Any outcome but a clean `Ok` or `Err` (a panic, an overflow, an abort from
//! an allocation sized by the input, a hang) is a bug.
#![no_main]

use libfuzzer_sys::fuzz_target;
use m40llm::backend::Device;
use m40llm::gguf::GgufFile;
use m40llm::model::{LoadOptions, Model};

fuzz_target!(|data: &[u8]| {
    let Ok(gguf) = GgufFile::from_bytes(data) else { return };
    for t in gguf.tensors() {
        // Every accepted tensor's bytes must be inside the file.
        assert!(gguf.tensor_bytes(t).is_some());
    }
    let options = LoadOptions { device: -1, n_threads: 1, use_mmap: false, vocab_only: false };
    if let Ok(model) = Model::from_gguf(gguf, Device::Cpu { threads: 1 }, options) {
        let _ = model.describe_json();
    }
});
