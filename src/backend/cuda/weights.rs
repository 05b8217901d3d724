//! The model's weights on the device: the file's data section uploaded once,
//! as it is in the file (the kernels read every format in place), and the
//! one-row weights (norms, biases, RoPE factors, attention sinks) and the
//! experts' bias tables converted to f32 beside it.

use std::collections::HashMap;
use std::ffi::c_int;
use std::sync::{Arc, Mutex};

use super::kernels::{m40_vector_to_f32, PreparedForm, ATTENTION_MAX_HEAD_DIM};
use super::memory::{human, DeviceAllocator, DevicePtr};
use super::runtime::{self, check, DeviceInfo, OwnedEvent, OwnedStream, PinnedBuffer};
use super::staging::Staging;
use super::{dim, Weight};
use crate::error::{Error, Result};
use crate::gguf::{GgufFile, TensorInfo};
use crate::quant::GgmlType;

/// Bytes allocated past the data section: the decode kernel reads rows in
/// 16-byte-aligned pieces, up to 15 bytes past the end of the last row.
const WEIGHT_TAIL: usize = 16;
/// Size of each of the two pinned staging buffers of the upload.
const UPLOAD_CHUNK: usize = 16 << 20;
/// Device memory a model leaves free for activations, KV caches and scratch
/// when it checks that its weights fit.
const HEADROOM: usize = 256 << 20;

/// The weights in device memory.
pub(super) struct DeviceWeights {
    /// The tensors this device holds, in spans of the file's data section
    /// copied as they are in the file.
    data: DevicePtr<u8>,
    /// Where each span lies, by data offset, in order.
    spans: Vec<Span>,
    /// One-row weights as f32, by data offset.
    vectors: HashMap<usize, DevicePtr<f32>>,
    /// Weights this device does not hold, copied in for the products of
    /// one batch (`stage`): a CPU stage's, whose large batches run here.
    staged: Mutex<Staged>,
}

/// The weights of the batch being computed for another device's layers.
#[derive(Default)]
struct Staged {
    block: Option<DevicePtr<u8>>,
    spans: Vec<Span>,
}

/// Data-section bytes `file_start..file_end`, at `device_start` in the
/// device block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Span {
    file_start: usize,
    file_end: usize,
    device_start: usize,
}

/// Tensors closer than this in the file share a span (the padding between
/// them is uploaded too).
const SPAN_GAP: usize = 64 << 10;
/// The alignment grid of spans in the device block: a span lies at the
/// same offset from a multiple of this as its first tensor in the file.
const SPAN_ALIGN: usize = 256;

/// The spans that cover the tensors `held` (data offset and bytes), and
/// the device bytes they take.
fn spans_of(mut held: Vec<(usize, usize)>) -> (Vec<Span>, usize) {
    held.sort_unstable();
    let mut spans: Vec<Span> = Vec::new();
    let mut device_end = 0;
    for (offset, len) in held {
        match spans.last_mut() {
            Some(span) if offset <= span.file_end + SPAN_GAP => {
                let end = span.file_end.max(offset + len);
                device_end += end - span.file_end;
                span.file_end = end;
            }
            _ => {
                // The span's start keeps its offset from the file's
                // alignment grid, so every tensor in it keeps its alignment.
                let device_start = device_end.next_multiple_of(SPAN_ALIGN) + offset % SPAN_ALIGN;
                spans.push(Span {
                    file_start: offset,
                    file_end: offset + len,
                    device_start,
                });
                device_end = device_start + len;
            }
        }
    }
    (spans, device_end)
}

/// The spans of `file`'s data section that hold the tensors `holds`
/// names, and the device bytes they take, once checked that the kernels take
/// the file's head sizes, can read its matrices, and that the spans fit on
/// the device with room to run.
pub(super) fn checked_spans(
    file: &GgufFile,
    info: &DeviceInfo,
    holds: &dyn Fn(&str) -> bool,
) -> Result<(Vec<Span>, usize)> {
    let architecture = file
        .get("general.architecture")
        .and_then(|a| a.str().ok().map(str::to_string))
        .unwrap_or_default();
    // A backend that holds no attention layer (one that only takes a CPU
    // stage's products, `GpuProducts`) runs heads of any size.
    let runs_attention = file
        .tensors()
        .iter()
        .any(|t| holds(&t.name) && t.name.ends_with(".attn_q.weight"));
    if runs_attention {
        check_head_sizes(file, &architecture)?;
    }
    if let Some(t) = file
        .tensors()
        .iter()
        .find(|t| holds(&t.name) && !computes(t.ggml_type))
    {
        return Err(Error::unsupported(format!(
            "tensor '{}' has type {}, which the CUDA backend does not compute with (the CPU backend does)",
            t.name, t.ggml_type
        )));
    }
    check_tensor_layouts(file)?;
    let held: Vec<(usize, usize)> = file
        .tensors()
        .iter()
        .filter(|t| holds(&t.name))
        .map(|t| (t.offset as usize, t.n_bytes as usize))
        .collect();
    let (spans, bytes) = spans_of(held);
    let (free, total) = runtime::memory_info()?;
    if bytes + HEADROOM > free {
        return Err(Error::out_of_memory(format!(
            "the model's weights need {} of device memory (plus {} for activations); {} has {} free of {}",
            human(bytes),
            human(HEADROOM),
            info.name,
            human(free),
            human(total)
        )));
    }
    Ok((spans, bytes))
}

impl DeviceWeights {
    /// Uploads the spans (`bytes` on the device, see [`checked_spans`]) of
    /// `file` and converts the one-row weights in them on `stream`.
    pub fn upload(
        file: &GgufFile,
        (spans, bytes): (Vec<Span>, usize),
        allocator: &Arc<DeviceAllocator>,
        stream: &OwnedStream,
    ) -> Result<DeviceWeights> {
        let data = file
            .data()
            .ok_or_else(|| Error::internal("the CUDA backend needs the tensor data"))?
            .bytes();
        let mut weights = allocator.alloc_exact::<u8>(bytes + WEIGHT_TAIL)?;
        let pieces: Vec<(&[u8], usize)> = spans
            .iter()
            .map(|s| (&data[s.file_start..s.file_end], s.device_start))
            .collect();
        upload(&pieces, &mut weights)?;
        let mut weights = DeviceWeights {
            data: weights,
            spans,
            vectors: HashMap::new(),
            staged: Mutex::default(),
        };
        for t in file.tensors() {
            let Some(src) = weights.locate(t.offset as usize, t.n_bytes as usize) else {
                continue;
            };
            if is_vector(t) {
                let n = t.n_elements() as usize;
                let mut v = allocator.alloc::<f32>(n)?;
                // SAFETY: `src` is the tensor's bytes on the device (an
                // uploaded span holds them); `v` holds n values.
                check(
                    unsafe {
                        m40_vector_to_f32(
                            t.ggml_type.id() as c_int,
                            src,
                            dim(n, "a vector length")?,
                            v.as_mut_ptr(),
                            stream.raw(),
                        )
                    },
                    || format!("converting tensor '{}'", t.name),
                )?;
                weights.vectors.insert(t.offset as usize, v);
            }
        }
        runtime::synchronize(stream)?;
        Ok(weights)
    }

    /// Device address of the `len` bytes at data offset `offset`, when an
    /// uploaded span holds them, or else the staged weights do.
    fn locate(&self, offset: usize, len: usize) -> Option<*const u8> {
        locate_in(&self.spans, &self.data, offset, len).or_else(|| {
            let staged = self.staged.lock().unwrap_or_else(|e| e.into_inner());
            locate_in(&staged.spans, staged.block.as_ref()?, offset, len)
        })
    }

    /// Copies the weights `ws` of `data` (the file's data section) to the
    /// device through `staging` on `stream`, in place of the ones staged
    /// before, for products that follow on that stream. The stream has
    /// finished with the previous ones (their products' results were read).
    pub fn stage(
        &self,
        data: &[u8],
        ws: &[&Weight],
        allocator: &Arc<DeviceAllocator>,
        staging: &mut Staging,
        stream: &OwnedStream,
    ) -> Result<()> {
        let (spans, bytes) = spans_of(ws.iter().map(|w| (w.offset, w.n_bytes)).collect());
        let mut staged = self.staged.lock().unwrap_or_else(|e| e.into_inner());
        staged.spans.clear();
        if staged
            .block
            .as_ref()
            .is_none_or(|b| b.len() < bytes + WEIGHT_TAIL)
        {
            staged.block = None;
            staged.block = Some(allocator.alloc_exact::<u8>(bytes + WEIGHT_TAIL)?);
        }
        let block = staged.block.as_mut().expect("allocated above");
        for span in &spans {
            let bytes = &data[span.file_start..span.file_end];
            // SAFETY: the span lies inside the block (`spans_of` counted it).
            unsafe {
                let dst = block.as_mut_ptr().add(span.device_start);
                staging.copy_to_device(dst.cast(), bytes, stream)?;
            }
        }
        staged.spans = spans;
        Ok(())
    }

    /// Device address of a matrix, in its stored format. The model asks
    /// only for the weights of the layers this device holds.
    pub fn matrix(&self, w: &Weight) -> *const u8 {
        self.locate(w.offset, w.n_bytes)
            .expect("a weight of a layer this device does not hold")
    }

    /// Device address of a one-row weight's f32 values.
    pub fn vector(&self, w: &Weight) -> Result<*const f32> {
        self.vectors
            .get(&w.offset)
            .map(|v| v.as_ptr())
            .ok_or_else(|| Error::internal("a one-row weight was not converted at load"))
    }

    /// Bytes of device memory the weights take.
    pub fn bytes(&self) -> usize {
        self.data.len() - WEIGHT_TAIL + self.vectors.values().map(|v| v.len() * 4).sum::<usize>()
    }
}

/// The address of `len` bytes at data offset `offset` in `block`, which
/// holds `spans`, when one of them holds those bytes.
fn locate_in(
    spans: &[Span],
    block: &DevicePtr<u8>,
    offset: usize,
    len: usize,
) -> Option<*const u8> {
    let i = spans.partition_point(|s| s.file_start <= offset);
    let span = spans[..i].last()?;
    (offset + len <= span.file_end).then(|| {
        // SAFETY: the span's bytes lie inside the device block.
        unsafe {
            block
                .as_ptr()
                .add(span.device_start + offset - span.file_start)
        }
    })
}

/// The file's matrices: every tensor but the one-row weights.
pub(super) fn matrices(file: &GgufFile) -> impl Iterator<Item = &TensorInfo> {
    file.tensors().iter().filter(|t| !is_vector(t))
}

/// The form each attention layer's output product prepares its activations
/// in, `form` of its weight format (None: no prepared route), by
/// layer of the layers `holds` names (the first held `blk.N` is layer 0,
/// as a stage's operations count them): decode attention writes its output
/// prepared with them. None for a layer without one.
pub(super) fn attention_output_forms(
    file: &GgufFile,
    holds: &dyn Fn(&str) -> bool,
    form: &dyn Fn(GgmlType) -> Option<PreparedForm>,
) -> Vec<Option<PreparedForm>> {
    let layer_of = |name: &str| {
        let rest = name.strip_prefix("blk.")?;
        rest[..rest.find('.')?].parse::<usize>().ok()
    };
    let held = || file.tensors().iter().filter(|t| holds(&t.name));
    let Some(first) = held().filter_map(|t| layer_of(&t.name)).min() else {
        return Vec::new();
    };
    let mut forms = Vec::new();
    for t in held().filter(|t| t.name.ends_with(".attn_output.weight")) {
        let Some(layer) = layer_of(&t.name).map(|l| l - first) else {
            continue;
        };
        if forms.len() <= layer {
            forms.resize(layer + 1, None);
        }
        forms[layer] = form(t.ggml_type);
    }
    forms
}

/// Copies each piece (bytes, offset in `dst`) to the device through two
/// pinned buffers, so that filling one overlaps the transfer of the other.
fn upload(pieces: &[(&[u8], usize)], dst: &mut DevicePtr<u8>) -> Result<()> {
    let stream = OwnedStream::new()?;
    let mut staging = [
        PinnedBuffer::new(UPLOAD_CHUNK)?,
        PinnedBuffer::new(UPLOAD_CHUNK)?,
    ];
    let done = [OwnedEvent::new()?, OwnedEvent::new()?];
    let chunks = pieces.iter().flat_map(|&(bytes, at)| {
        bytes
            .chunks(UPLOAD_CHUNK)
            .enumerate()
            .map(move |(i, chunk)| (chunk, at + i * UPLOAD_CHUNK))
    });
    for (i, (chunk, at)) in chunks.enumerate() {
        let slot = i % 2;
        done[slot].wait()?;
        staging[slot].as_mut_slice()[..chunk.len()].copy_from_slice(chunk);
        assert!(at + chunk.len() <= dst.len());
        // SAFETY: the destination range lies inside `dst` (checked above);
        // the staging buffer is not touched again until its event has fired.
        unsafe {
            runtime::copy_to_device(
                dst.as_mut_ptr().add(at).cast(),
                staging[slot].as_ptr(),
                chunk.len(),
                stream.raw(),
            )?
        };
        done[slot].record(&stream)?;
    }
    runtime::synchronize(&stream)
}

/// Refuses, at load rather than at the first step, heads wider than the
/// attention kernels take (`ATTENTION_MAX_HEAD_DIM`, 512: real Gemma 4
/// models' full-attention heads; the hyper-parameters allow up to 1024).
fn check_head_sizes(file: &GgufFile, architecture: &str) -> Result<()> {
    for key in [
        "attention.key_length",
        "attention.value_length",
        "attention.key_length_swa",
        "attention.value_length_swa",
    ] {
        let name = format!("{architecture}.{key}");
        let Some(width) = file.get(&name).and_then(|e| e.value.as_i128()) else {
            continue;
        };
        if width > ATTENTION_MAX_HEAD_DIM as i128 {
            return Err(Error::unsupported(format!(
                "{name} = {width}: the CUDA attention kernels take heads of up to {ATTENTION_MAX_HEAD_DIM} values (the CPU backend, device -1, runs wider ones)"
            )));
        }
    }
    Ok(())
}

/// Whether the CUDA kernels compute with tensors of `ty` (cuda/quant.cuh's
/// formats).
pub(super) fn computes(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(
        ty,
        F32 | F16
            | Bf16
            | Q4_0
            | Q4_1
            | Q5_0
            | Q5_1
            | Q8_0
            | Q2K
            | Q3K
            | Q4K
            | Q5K
            | Q6K
            | Iq4Nl
            | Iq4Xs
            | Mxfp4
    )
}

/// A weight converted to f32 whole at load rather than multiplied as a
/// matrix: one row (norms, biases), a mixture's bias table of an expert
/// product (a row per expert, gpt-oss's; the expert launches add row e to
/// expert e's outputs), or a Gated DeltaNet layer's convolution taps (a few
/// values a channel). Any other matrix is multiplied, and must have rows
/// the products take (`check_tensor_layouts`).
fn is_vector(t: &TensorInfo) -> bool {
    let taps = t.dims.len() == 2 && t.dims[0] < 32 && t.name.ends_with(".ssm_conv1d.weight");
    let expert_biases = t.dims.len() == 2 && t.name.ends_with("_exps.bias");
    t.dims.iter().skip(1).all(|&d| d == 1) || taps || expert_biases
}

/// The kernels read matrices with vector loads: every matrix row must be a
/// multiple of 32 values and every matrix 16-byte aligned (GGUF's default
/// alignment of 32 gives that).
fn check_tensor_layouts(file: &GgufFile) -> Result<()> {
    for t in file.tensors() {
        let ty = t.ggml_type;
        if !computes(ty) {
            continue;
        }
        if is_vector(t) {
            continue;
        }
        if t.dims[0] % 32 != 0 {
            return Err(Error::unsupported(format!(
                "tensor '{}' has rows of {} values; the CUDA backend needs a multiple of 32",
                t.name, t.dims[0]
            )));
        }
        // Float rows are read with 16-byte loads, quantized rows in
        // 16-byte-aligned pieces whose blocks keep their alignment.
        if t.offset % 16 != 0 {
            return Err(Error::unsupported(format!(
                "tensor '{}' is not 16-byte aligned in the file (general.alignment below 16)",
                t.name
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn near_tensors_share_a_span_and_far_ones_keep_their_alignment() {
        let (spans, bytes) = spans_of(vec![
            (1 << 20, 100),
            (0, 64),
            (64, 32),
            ((2 << 20) + 48, 10),
        ]);
        assert_eq!(
            spans,
            [
                Span {
                    file_start: 0,
                    file_end: 96,
                    device_start: 0
                },
                Span {
                    file_start: 1 << 20,
                    file_end: (1 << 20) + 100,
                    device_start: 256
                },
                Span {
                    file_start: (2 << 20) + 48,
                    file_end: (2 << 20) + 58,
                    device_start: 512 + 48
                },
            ]
        );
        assert_eq!(bytes, 570);
    }
}
