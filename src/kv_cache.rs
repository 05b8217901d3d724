//! The key/value cache of one sequence in host memory: for every layer, the
//! keys and values of each position, stored as f16 (half the memory of f32;
//! attention converts them back as it reads).

use half::f16;

use crate::error::{Error, Result};

pub struct KvCache {
    n_ctx: usize,
    k_width: usize,
    v_width: usize,
    /// Per layer: `n_ctx × k_width` keys and `n_ctx × v_width` values.
    layers: Vec<(Vec<f16>, Vec<f16>)>,
}

impl KvCache {
    pub fn new(n_ctx: usize, n_layer: usize, k_width: usize, v_width: usize) -> Result<KvCache> {
        let per_layer = n_ctx
            .checked_mul(k_width + v_width)
            .ok_or_else(|| Error::out_of_memory("KV cache size overflows"))?;
        let mut layers = Vec::new();
        layers
            .try_reserve_exact(n_layer)
            .map_err(|_| Error::out_of_memory("KV cache"))?;
        for _ in 0..n_layer {
            let zeroed = |n: usize| -> Result<Vec<f16>> {
                let mut v = Vec::new();
                v.try_reserve_exact(n).map_err(|_| {
                    Error::out_of_memory(format!(
                        "cannot allocate a KV cache of {n_ctx} positions ({} MiB per layer)",
                        (per_layer * 2) >> 20
                    ))
                })?;
                v.resize(n, f16::ZERO);
                Ok(v)
            };
            layers.push((zeroed(n_ctx * k_width)?, zeroed(n_ctx * v_width)?));
        }
        Ok(KvCache {
            n_ctx,
            k_width,
            v_width,
            layers,
        })
    }

    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// Values of one position's keys (all KV heads).
    pub fn k_width(&self) -> usize {
        self.k_width
    }

    pub fn v_width(&self) -> usize {
        self.v_width
    }

    /// Stores the key and value of position `pos` in `layer`.
    pub fn store(&mut self, layer: usize, pos: usize, k: &[f32], v: &[f32]) {
        let (keys, values) = &mut self.layers[layer];
        keys[pos * self.k_width..(pos + 1) * self.k_width].copy_from_slice_f32(k);
        values[pos * self.v_width..(pos + 1) * self.v_width].copy_from_slice_f32(v);
    }

    /// The keys of `layer` for `positions`, row after row.
    pub fn keys(&self, layer: usize, positions: std::ops::Range<usize>) -> &[f16] {
        &self.layers[layer].0[positions.start * self.k_width..positions.end * self.k_width]
    }

    pub fn values(&self, layer: usize, positions: std::ops::Range<usize>) -> &[f16] {
        &self.layers[layer].1[positions.start * self.v_width..positions.end * self.v_width]
    }

    /// Bytes held.
    pub fn size_bytes(&self) -> usize {
        self.layers.len() * self.n_ctx * (self.k_width + self.v_width) * 2
    }
}

trait FromF32 {
    fn copy_from_slice_f32(&mut self, src: &[f32]);
}

impl FromF32 for [f16] {
    fn copy_from_slice_f32(&mut self, src: &[f32]) {
        use half::slice::HalfFloatSliceExt;
        self.convert_from_f32_slice(src);
    }
}
