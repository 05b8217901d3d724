//! A loaded model: the GGUF file, its architecture and hyper-parameters, and
//! the device it runs on. Immutable after load, shared by sessions.

mod arch;
mod describe;
mod hparams;
pub mod placement;
pub mod transformer;
mod weights;

use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

pub use crate::backend::Weight;
pub use arch::{ArchTraits, Architecture};
pub use hparams::{DeltaNetParams, HyperParams, LayerHeads};
pub use placement::DeviceShare;
pub use weights::{AttentionWeights, DeltaNetWeights, FeedForward, LayerWeights, Mixer, Weights};

use crate::backend::{Device, ModelBackend};
use crate::chat::ChatTemplate;
use crate::error::{Error, Result};
use crate::gguf::{GgufFile, ReadOptions};
use crate::tokenizer::Tokenizer;

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
    gguf: Arc<GgufFile>,
    /// `general.architecture` as the file spells it (any name when vocab-only).
    architecture_name: String,
    /// What runs the model; `None` for a vocab-only load.
    engine: Option<Engine>,
    /// The tokenizer from `tokenizer.ggml.*` (every load); `n_vocab` is its token count.
    tokenizer: Tokenizer,
    n_vocab: u32,
    n_ctx_train: u32,
    /// The (first) device it runs on.
    device: Device,
    options: LoadOptions,
}

/// The parts of a model that compute: its shape, weights and the devices
/// that hold its layers.
struct Engine {
    arch: Architecture,
    hparams: HyperParams,
    weights: Weights,
    stages: Vec<Stage>,
}

/// One device's part of a model: a contiguous run of its layers, with the
/// embedding on the first stage and the output on the last.
pub struct Stage {
    pub device: Device,
    pub backend: ModelBackend,
    pub layers: Range<usize>,
}

impl Model {
    /// Loads and checks the model at `path` onto `options.device`. Errors
    /// name the file.
    pub fn load(path: &Path, options: LoadOptions) -> Result<Model> {
        let one = DeviceShare {
            device: options.device,
            share: 1.0,
        };
        Self::load_split(path, options, &[one])
    }

    /// Loads the model at `path` with its layers split over `shares` (see
    /// [`placement::place`]); `options.device` is not used.
    pub fn load_split(path: &Path, options: LoadOptions, shares: &[DeviceShare]) -> Result<Model> {
        placement::check_shares(shares)?;
        let devices = shares
            .iter()
            .map(|s| Ok((Device::select(s.device, options.n_threads)?, s.share)))
            .collect::<Result<Vec<_>>>()?;
        let read = ReadOptions {
            use_mmap: options.use_mmap,
            load_data: !options.vocab_only,
        };
        let gguf = GgufFile::open(path, read).map_err(|e| e.context(path.display()))?;
        Self::from_gguf_split(gguf, &devices, options).map_err(|e| e.context(path.display()))
    }

    /// Checks a parsed file and makes a model of it on `device`.
    pub fn from_gguf(gguf: GgufFile, device: Device, options: LoadOptions) -> Result<Model> {
        Self::from_gguf_split(gguf, &[(device, 1.0)], options)
    }

    /// Checks a parsed file and makes a model of it, its layers split over
    /// `devices` by their shares (see [`placement::place`]).
    pub fn from_gguf_split(
        gguf: GgufFile,
        devices: &[(Device, f32)],
        options: LoadOptions,
    ) -> Result<Model> {
        let first_device = devices
            .first()
            .ok_or_else(|| Error::invalid_argument("a model needs at least one device"))?
            .0
            .clone();
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
            let tokenizer = Tokenizer::from_gguf(&gguf)?;
            debug_assert_eq!(tokenizer.n_vocab(), n_vocab);
            return Ok(Model {
                gguf: Arc::new(gguf),
                architecture_name,
                engine: None,
                tokenizer,
                n_vocab,
                n_ctx_train,
                device: first_device,
                options,
            });
        }

        let arch = Architecture::from_name(&architecture_name).ok_or_else(|| {
            Error::unsupported(format!(
                "architecture '{}' is not supported (supported: llama, qwen2, qwen3, qwen3moe, gemma3, qwen35, qwen35moe, gpt-oss, gemma4)",
                crate::error::echo(&architecture_name)
            ))
        })?;
        let hparams = HyperParams::from_gguf(&gguf, arch, n_vocab)?;
        arch::check_tensors(&gguf, arch, &hparams)?;
        let tokenizer = Tokenizer::from_gguf(&gguf)?;
        debug_assert_eq!(tokenizer.n_vocab(), n_vocab);
        let n_ctx_train = hparams.n_ctx_train;
        let weights = Weights::locate(&gguf, arch, &hparams);
        let layer_bytes = weights::layer_bytes(&gguf, hparams.n_layer as usize);
        let edge_bytes = (weights.token_embd.n_bytes + weights.output.n_bytes) as u64;
        let placements = placement::place(devices, &layer_bytes, edge_bytes, Device::free_memory)?;
        let gguf = Arc::new(gguf);
        let n_stages = placements.len();
        let first_gpu = placements
            .iter()
            .map(|p| p.device.clone())
            .find(|d| matches!(d, Device::Cuda { .. }));
        let stages = placements
            .into_iter()
            .enumerate()
            .map(|(i, p)| {
                let (first, last) = (i == 0, i + 1 == n_stages);
                let holds = |name: &str| weights.stage_holds(name, &p.layers, first, last);
                let backend =
                    ModelBackend::new(&p.device, Arc::clone(&gguf), &holds, first_gpu.as_ref())
                        .map_err(|e| {
                            e.context(format!("{} (layers {:?})", p.device.name(), p.layers))
                        })?;
                Ok(Stage {
                    device: p.device,
                    backend,
                    layers: p.layers,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Model {
            gguf,
            architecture_name,
            device: stages[0].device.clone(),
            engine: Some(Engine {
                arch,
                hparams,
                weights,
                stages,
            }),
            tokenizer,
            n_vocab,
            n_ctx_train,
            options,
        })
    }

    pub fn gguf(&self) -> &GgufFile {
        &self.gguf
    }
    pub fn architecture_name(&self) -> &str {
        &self.architecture_name
    }
    /// The chat format of this model (`ChatTemplate::detect`).
    pub fn chat_template(&self) -> Result<ChatTemplate> {
        ChatTemplate::detect(&self.gguf, &self.architecture_name, &self.tokenizer)
    }
    pub fn architecture(&self) -> Option<Architecture> {
        self.engine.as_ref().map(|e| e.arch)
    }
    pub fn hparams(&self) -> Option<&HyperParams> {
        self.engine.as_ref().map(|e| &e.hparams)
    }
    /// Whether the model has weights to run (it was not loaded vocab-only).
    pub fn can_compute(&self) -> bool {
        self.engine.is_some()
    }

    fn engine(&self) -> &Engine {
        self.engine
            .as_ref()
            .expect("callers check can_compute() (sessions refuse vocab-only models)")
    }
    /// Architecture and hyper-parameters of a model with weights.
    pub fn config(&self) -> (Architecture, &HyperParams) {
        let e = self.engine();
        (e.arch, &e.hparams)
    }
    pub fn weights(&self) -> &Weights {
        &self.engine().weights
    }
    /// The devices that hold the layers, in the order a forward pass runs
    /// them (one, unless the model was split).
    pub fn stages(&self) -> &[Stage] {
        &self.engine().stages
    }
    pub fn n_vocab(&self) -> u32 {
        self.n_vocab
    }
    /// The model's tokenizer (loaded for every model, `vocab_only` included).
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
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
