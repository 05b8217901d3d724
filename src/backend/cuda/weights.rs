//! The model's weights on the device: the file's data section uploaded once,
//! as it is in the file (the kernels read every format in place), and the
//! one-row weights (norms, biases, RoPE factors) converted to f32 beside it.

use std::collections::HashMap;
use std::ffi::c_int;
use std::sync::Arc;

use super::kernels::m40_vector_to_f32;
use super::memory::{human, DeviceAllocator, DevicePtr};
use super::runtime::{self, check, DeviceInfo, OwnedEvent, OwnedStream, PinnedBuffer};
use super::{dim, Weight};
use crate::error::{Error, Result};
use crate::gguf::{GgufFile, TensorInfo};

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
    /// The file's whole data section, as in the file.
    data: DevicePtr<u8>,
    /// One-row weights as f32, by data offset.
    vectors: HashMap<usize, DevicePtr<f32>>,
}

/// The data section of `file`, once checked that the kernels can read its
/// matrices and that it fits on the device with room to run.
pub(super) fn checked_data<'f>(file: &'f GgufFile, info: &DeviceInfo) -> Result<&'f [u8]> {
    let data = file
        .data()
        .ok_or_else(|| Error::internal("the CUDA backend needs the tensor data"))?
        .bytes();
    check_tensor_layouts(file)?;
    let (free, total) = runtime::memory_info()?;
    if data.len() + HEADROOM > free {
        return Err(Error::out_of_memory(format!(
            "the model's weights need {} of device memory (plus {} for activations); {} has {} free of {}",
            human(data.len()),
            human(HEADROOM),
            info.name,
            human(free),
            human(total)
        )));
    }
    Ok(data)
}

impl DeviceWeights {
    /// Uploads `data` (the data section of `file`, see [`checked_data`])
    /// and converts the file's one-row weights on `stream`.
    pub fn upload(
        file: &GgufFile,
        data: &[u8],
        allocator: &Arc<DeviceAllocator>,
        stream: &OwnedStream,
    ) -> Result<DeviceWeights> {
        let mut weights = allocator.alloc_exact::<u8>(data.len() + WEIGHT_TAIL)?;
        upload(data, &mut weights)?;
        let mut vectors = HashMap::new();
        for t in file.tensors() {
            if is_vector(t) {
                let n = t.n_elements() as usize;
                let mut v = allocator.alloc::<f32>(n)?;
                // SAFETY: the tensor's bytes lie inside the uploaded data
                // section (checked by the reader); `v` holds n values.
                check(
                    unsafe {
                        m40_vector_to_f32(
                            t.ggml_type.id() as c_int,
                            weights.as_ptr().add(t.offset as usize),
                            dim(n, "a vector length")?,
                            v.as_mut_ptr(),
                            stream.raw(),
                        )
                    },
                    || format!("converting tensor '{}'", t.name),
                )?;
                vectors.insert(t.offset as usize, v);
            }
        }
        runtime::synchronize(stream)?;
        Ok(DeviceWeights {
            data: weights,
            vectors,
        })
    }

    /// Device address of a matrix, in its stored format.
    pub fn matrix(&self, w: &Weight) -> *const u8 {
        debug_assert!(w.offset + w.n_bytes <= self.data.len());
        // SAFETY: a located weight lies inside the data section.
        unsafe { self.data.as_ptr().add(w.offset) }
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

/// The file's matrices: every tensor but the one-row weights.
pub(super) fn matrices(file: &GgufFile) -> impl Iterator<Item = &TensorInfo> {
    file.tensors().iter().filter(|t| !is_vector(t))
}

/// Copies the data section to the device through two pinned buffers, so
/// that filling one overlaps the transfer of the other.
fn upload(data: &[u8], dst: &mut DevicePtr<u8>) -> Result<()> {
    let stream = OwnedStream::new()?;
    let mut staging = [
        PinnedBuffer::new(UPLOAD_CHUNK)?,
        PinnedBuffer::new(UPLOAD_CHUNK)?,
    ];
    let done = [OwnedEvent::new()?, OwnedEvent::new()?];
    for (i, chunk) in data.chunks(UPLOAD_CHUNK).enumerate() {
        let slot = i % 2;
        done[slot].wait()?;
        staging[slot].as_mut_slice()[..chunk.len()].copy_from_slice(chunk);
        // SAFETY: the destination range lies inside `dst`; the staging
        // buffer is not touched again until its event has fired.
        unsafe {
            runtime::copy_to_device(
                dst.as_mut_ptr().add(i * UPLOAD_CHUNK).cast(),
                staging[slot].as_ptr(),
                chunk.len(),
                stream.raw(),
            )?
        };
        done[slot].record(&stream)?;
    }
    runtime::synchronize(&stream)
}

/// One-row weights (norms, biases, RoPE factors), which the backend keeps as f32.
fn is_vector(t: &TensorInfo) -> bool {
    t.dims.iter().skip(1).all(|&d| d == 1)
}

/// The kernels read matrices with vector loads: every matrix row must be a
/// multiple of 32 values and every matrix 16-byte aligned (GGUF's default
/// alignment of 32 gives that).
fn check_tensor_layouts(file: &GgufFile) -> Result<()> {
    for t in file.tensors() {
        let ty = t.ggml_type;
        if !ty.is_supported() {
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
