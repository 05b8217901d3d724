//! A loaded model: the GGUF file, its architecture and hyper-parameters, and
//! the device it runs on. Immutable after load, shared by sessions.

mod arch;
mod describe;
mod hparams;

use std::path::Path;

pub use arch::Architecture;
pub use hparams::HyperParams;

use crate::backend::Device;
use crate::error::{Error, Result};
use crate::gguf::{GgufFile, ReadOptions};

/// How to load a model (the engine's view of `m40_model_params`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadOptions {
    /// -1: CPU; 0..N-1: CUDA device.
    pub device: i32,
    /// CPU worker threads; 0: one per core.
    pub n_threads: u32,
    pub use_mmap: bool,
    /// Metadata and tokenizer only: no weights, any architecture.
    pub vocab_only: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            device: crate::backend::default_device_index(),
            n_threads: 0,
            use_mmap: true,
            vocab_only: false,
        }
    }
}

/// A model ready for sessions.
pub struct Model {
    gguf: GgufFile,
    /// `general.architecture` as the file spells it (any name when vocab-only).
    architecture_name: String,
    /// The architecture and hyper-parameters; `None` for a vocab-only load.
    config: Option<(Architecture, HyperParams)>,
    n_vocab: u32,
    n_ctx_train: u32,
    device: Device,
    options: LoadOptions,
}

impl Model {
    /// Loads and checks the model at `path`. Errors name the file.
    pub fn load(path: &Path, options: LoadOptions) -> Result<Model> {
        let device = Device::select(options.device, options.n_threads)?;
        let read = ReadOptions {
            use_mmap: options.use_mmap,
            load_data: !options.vocab_only,
        };
        let gguf = GgufFile::open(path, read).map_err(|e| e.context(path.display()))?;
        Self::from_gguf(gguf, device, options).map_err(|e| e.context(path.display()))
    }

    /// Checks a parsed file and makes a model of it.
    pub fn from_gguf(gguf: GgufFile, device: Device, options: LoadOptions) -> Result<Model> {
        let architecture_name = gguf.require("general.architecture")?.str()?.to_string();
        let tokens = gguf.require("tokenizer.ggml.tokens")?;
        let n_vocab = tokens.string_array()?.len();
        let n_vocab = u32::try_from(n_vocab)
            .ok()
            .filter(|&n| n > 0 && n <= i32::MAX as u32)
            .ok_or_else(|| {
                Error::format(format!("tokenizer.ggml.tokens holds {n_vocab} tokens"))
            })?;

        if options.vocab_only {
            // Only the tokenizer is used, so any architecture will do; the
            // training context is informative and may be absent.
            let n_ctx_train = gguf
                .get(&format!("{architecture_name}.context_length"))
                .and_then(|e| e.u32_in(0..=u32::MAX).ok())
                .unwrap_or(0);
            return Ok(Model {
                gguf,
                architecture_name,
                config: None,
                n_vocab,
                n_ctx_train,
                device,
                options,
            });
        }

        let arch = Architecture::from_name(&architecture_name).ok_or_else(|| {
            Error::unsupported(format!(
                "architecture '{architecture_name}' is not supported (supported: llama, qwen2, gemma3)"
            ))
        })?;
        let hparams = HyperParams::from_gguf(&gguf, arch, n_vocab)?;
        arch::check_tensors(&gguf, arch, &hparams)?;
        let n_ctx_train = hparams.n_ctx_train;
        Ok(Model {
            gguf,
            architecture_name,
            config: Some((arch, hparams)),
            n_vocab,
            n_ctx_train,
            device,
            options,
        })
    }

    pub fn gguf(&self) -> &GgufFile {
        &self.gguf
    }
    pub fn architecture_name(&self) -> &str {
        &self.architecture_name
    }
    pub fn architecture(&self) -> Option<Architecture> {
        self.config.as_ref().map(|(arch, _)| *arch)
    }
    pub fn hparams(&self) -> Option<&HyperParams> {
        self.config.as_ref().map(|(_, hp)| hp)
    }
    pub fn n_vocab(&self) -> u32 {
        self.n_vocab
    }
    pub fn n_ctx_train(&self) -> u32 {
        self.n_ctx_train
    }
    pub fn device(&self) -> &Device {
        &self.device
    }
    pub fn options(&self) -> LoadOptions {
        self.options
    }
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("architecture", &self.architecture_name)
            .field("n_vocab", &self.n_vocab)
            .field("tensors", &self.gguf.tensors().len())
            .field("device", &self.device)
            .finish_non_exhaustive()
    }
}
