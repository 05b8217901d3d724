//! A CPU stage's products of many rows, run on a GPU of the same split
//! model (partial offload). The weights cross to the GPU with each batch:
//! a prompt chunk's product reads each weight hundreds of times, so
//! copying it over PCIe once costs less than the CPU's arithmetic; a decode
//! step reads each weight once and stays on the CPU (the CPU backend's
//! `HELPER_MIN_ROWS`).

use std::sync::{Arc, Mutex};

use super::{Backend, CudaBackend, CudaOptions, DeviceBuffer, Weight};
use crate::backend::ProductHelper;
use crate::error::{Error, Result};
use crate::gguf::GgufFile;
use crate::quant::GgmlType;

/// A CUDA backend that holds no weights of its own and computes products
/// of weights it is handed for the batch.
pub struct GpuProducts {
    file: Arc<GgufFile>,
    gpu: CudaBackend,
    /// One batch at a time: the staged weights are the batch's.
    turn: Mutex<()>,
}

impl GpuProducts {
    /// Products of `file`'s weights on CUDA device `index`.
    pub fn new(file: Arc<GgufFile>, index: usize, options: CudaOptions) -> Result<GpuProducts> {
        let gpu = CudaBackend::new(Arc::clone(&file), index, options, &|_| false)?;
        Ok(GpuProducts {
            file,
            gpu,
            turn: Mutex::new(()),
        })
    }
}

impl ProductHelper for GpuProducts {
    fn takes(&self, ty: GgmlType) -> bool {
        super::weights::computes(ty)
    }

    fn products(
        &self,
        ws: &[&Weight],
        x: &[f32],
        rows: usize,
        outs: &mut [&mut Vec<f32>],
    ) -> Result<()> {
        let Some(cols) = ws.first().map(|w| w.cols) else {
            return Ok(());
        };
        assert!(ws.iter().all(|w| w.cols == cols) && outs.len() == ws.len());
        let _turn = self.turn.lock().unwrap_or_else(|e| e.into_inner());
        let data = self
            .file
            .data()
            .ok_or_else(|| Error::internal("the tensor data is not loaded"))?
            .bytes();
        let gpu = &self.gpu;
        gpu.stage_weights(data, ws)?;
        let mut input = gpu.buffer(rows * cols)?;
        gpu.write(&mut input, &x[..rows * cols])?;
        let mut results = ws
            .iter()
            .map(|w| gpu.buffer(rows * w.rows))
            .collect::<Result<Vec<DeviceBuffer>>>()?;
        {
            let mut refs: Vec<&mut DeviceBuffer> = results.iter_mut().collect();
            gpu.matmuls(ws, &input, rows, &mut refs)?;
        }
        for ((w, result), out) in ws.iter().zip(&results).zip(outs.iter_mut()) {
            gpu.read(result, &mut out[..rows * w.rows])?;
        }
        Ok(())
    }
}
