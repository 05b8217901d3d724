//! Model handles: parameters, load, queries, describe.

use std::ffi::c_char;

use super::args;
use super::handles;
use super::status::{guard, guard_value, m40_status};
use crate::model::placement::MAX_DEVICES;
use crate::model::{DeviceShare, LoadOptions, Model};

/// An opaque loaded model. Immutable after load: any number of threads and
/// sessions may use one model at the same time. Release it with `m40_free`.
pub struct m40_model {
    _opaque: [u8; 0],
}

/// How to load a model. Get defaults from `m40_model_default_params()` and
/// change what you need.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct m40_model_params {
    /// -1: CPU; 0..N-1: CUDA device. Default: 0 when a CUDA device is usable, else -1.
    pub device: i32,
    /// Threads the CPU backend computes with, the calling thread included;
    /// 0 (the default): one per core (at most 1024). A CUDA device ignores it. At most 1024, else
    /// M40_ERR_INVALID_ARGUMENT. When the system cannot start them all (a
    /// process or user thread limit, memory), the load fails with
    /// M40_ERR_OUT_OF_MEMORY and stops the threads it had started.
    pub n_threads: u32,
    /// Map the file instead of reading it into memory. Default true.
    ///
    /// A mapped file must stay as it is while the model is loaded: the
    /// weights are read from the file's pages as they are used, so
    /// truncating or rewriting the file in place (not replacing it by a
    /// rename) can kill the process with SIGBUS, as with llama.cpp. Where
    /// the file may change under the process, set use_mmap false: the
    /// weights are then read into memory at load.
    pub use_mmap: bool,
    /// Load metadata and tokenizer only (no weights, any architecture). Default false.
    pub vocab_only: bool,
}

impl From<m40_model_params> for LoadOptions {
    fn from(p: m40_model_params) -> Self {
        LoadOptions {
            device: p.device,
            n_threads: p.n_threads,
            use_mmap: p.use_mmap,
            vocab_only: p.vocab_only,
        }
    }
}

/// ==== 2. Models: parameters and loading ====
///
/// Returns the default model parameters.
#[no_mangle]
pub extern "C" fn m40_model_default_params() -> m40_model_params {
    let d = LoadOptions::default();
    m40_model_params {
        device: d.device,
        n_threads: d.n_threads,
        use_mmap: d.use_mmap,
        vocab_only: d.vocab_only,
    }
}

/// Loads the GGUF model at `path` (NUL-terminated) and writes a new model
/// handle to `*out_model`. `params` NULL means the defaults. The file is
/// checked completely (with `vocab_only`, its metadata and tokenizer; the
/// tensors are not read): a malformed or truncated file (a special token id
/// outside the vocabulary included) gives M40_ERR_FORMAT, an architecture
/// or tensor type this build does not run M40_ERR_UNSUPPORTED, a missing
/// file or a path that is not a regular file (a directory, a FIFO, a
/// device; it is not opened) M40_ERR_IO, parameters out of range
/// M40_ERR_INVALID_ARGUMENT. Error messages quote at most 256 bytes of any
/// string from the file. Release the model with `m40_free`. Any number of
/// threads may load models at the same time.
///
/// # Safety
/// `path` is NULL or NUL-terminated; `params` is NULL or valid; `out_model` is
/// NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn m40_model_load(
    path: *const c_char,
    params: *const m40_model_params,
    out_model: *mut *mut m40_model,
) -> m40_status {
    guard(|| {
        // SAFETY: the caller's promises, forwarded.
        let (path, params, out_model) = unsafe {
            (
                args::path(path, "path")?,
                args::struct_or_default(params, || m40_model_default_params()),
                args::out(out_model, "out_model")?,
            )
        };
        let model = Model::load(&path, params.into())?;
        *out_model = handles::register_model(model)?.cast();
        Ok(())
    })
}

/// One device of a split model (`m40_model_load_split`): which device, and
/// its share of the layers.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct m40_device_share {
    /// -1: the CPU; 0..N-1: a CUDA device. A device may be named more than
    /// once: each entry holds its own layers.
    pub device: i32,
    /// The entry's share of the layers relative to the others', finite and
    /// not negative: entry i holds the layers from round(n_layer × (the
    /// shares before it) / total) up to round(n_layer × (the shares through
    /// it) / total). 0 on every entry: chosen from free memory — the
    /// GPUs take layers in proportion to their free memory, each at most
    /// what fits beside 1 GiB for caches and scratch and the embedding and
    /// output (a GPU named twice divides its free memory), and the CPU entries
    /// share the rest (with no CPU entry, every device's share is its free
    /// memory). An entry left with no layers holds nothing.
    pub share: f32,
}

/// Loads the GGUF model at `path` as `m40_model_load` does, with its layers
/// split over `n_devices` devices (`devices`, in order; at most 64): each
/// holds the weights of a contiguous run of layers and their part of every
/// session's KV cache, the first also the token embeddings and the last the
/// output norm and projection. A forward pass runs the devices in order;
/// only the activations of the rows in flight cross between them, through
/// host memory, once per device boundary per step. GPU + CPU entries give
/// partial offload (llama.cpp's `-ngl`), several GPUs a layer split
/// (`-sm layer -ts`). `params->device` is not used; `n_threads` applies
/// to every CPU entry. Every function of the API works on a split model as
/// on any other; `m40_model_describe` lists its devices under "devices".
/// `n_devices` 0 or more than 64, a NULL `devices`, a share that is
/// negative or not finite, or an unknown device give
/// M40_ERR_INVALID_ARGUMENT (or M40_ERR_UNSUPPORTED for a CUDA device in a
/// build without CUDA); a device whose layers do not fit
/// M40_ERR_OUT_OF_MEMORY, naming it.
///
/// # Safety
/// As `m40_model_load`; `devices` is NULL or holds `n_devices` entries.
#[no_mangle]
pub unsafe extern "C" fn m40_model_load_split(
    path: *const c_char,
    params: *const m40_model_params,
    devices: *const m40_device_share,
    n_devices: usize,
    out_model: *mut *mut m40_model,
) -> m40_status {
    guard(|| {
        if n_devices == 0 || n_devices > MAX_DEVICES {
            return Err(crate::error::Error::invalid_argument(format!(
                "n_devices is {n_devices}; a split takes 1 to {MAX_DEVICES} devices"
            )));
        }
        // SAFETY: the caller's promises, forwarded.
        let (path, params, devices, out_model) = unsafe {
            (
                args::path(path, "path")?,
                args::struct_or_default(params, || m40_model_default_params()),
                args::slice(devices, n_devices, "devices")?,
                args::out(out_model, "out_model")?,
            )
        };
        let shares: Vec<DeviceShare> = devices
            .iter()
            .map(|d| DeviceShare {
                device: d.device,
                share: d.share,
            })
            .collect();
        let model = Model::load_split(&path, params.into(), &shares)?;
        *out_model = handles::register_model(model)?.cast();
        Ok(())
    })
}

/// ==== 3. Models: queries ====
///
/// Returns the number of tokens in the model's vocabulary, or -1 (with
/// `m40_last_error`) when `model` is not a live model handle.
#[no_mangle]
pub extern "C" fn m40_model_n_vocab(model: *const m40_model) -> i32 {
    guard_value(-1, || Ok(handles::model(model as usize)?.n_vocab() as i32))
}

/// Returns the context length the model was trained with (0 when a vocab-only
/// file does not say), or -1 when `model` is not a live model handle.
#[no_mangle]
pub extern "C" fn m40_model_n_ctx_train(model: *const m40_model) -> i32 {
    guard_value(-1, || {
        let n = handles::model(model as usize)?.n_ctx_train();
        Ok(i32::try_from(n).unwrap_or(i32::MAX))
    })
}

/// Writes a JSON object describing the model (architecture, layers,
/// embedding size, heads, tensor types, backend, device name, ...) into `buf`
/// as a NUL-terminated string, and its length without the NUL into
/// `*out_len` (when not NULL). If `cap` is too small nothing is written to
/// `buf`, `*out_len` gets the length and the result is
/// M40_ERR_BUFFER_TOO_SMALL: call again with at least `*out_len + 1` bytes.
/// `buf` may be NULL when `cap` is 0. On a CUDA device the object holds live
/// memory figures, so it may grow between a size query and the call that
/// fills the buffer: call again while the result is BUFFER_TOO_SMALL.
///
/// # Safety
/// `buf` is NULL or holds `cap` writable bytes; `out_len` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn m40_model_describe(
    model: *const m40_model,
    buf: *mut c_char,
    cap: usize,
    out_len: *mut usize,
) -> m40_status {
    guard(|| {
        let json = handles::model(model as usize)?.describe_json();
        // SAFETY: the caller's promises, forwarded.
        unsafe { args::write_text(json.as_bytes(), buf, cap, out_len) }
    })
}
