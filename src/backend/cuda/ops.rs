//! The [`Backend`] operations on the CUDA backend's buffers, and the fused
//! steps of a layer on as few launches as each product's route
//! (`CudaBackend::route`) allows; shapes the fused kernels do not take fall
//! back to the composition in `backend::fused`.

use std::ffi::c_int;

use super::attention::{cached_layer, check_widths, device_rows, heads_of_multiples_of_8};
use super::kernels::*;
use super::memory::Arena;
use super::products::TensorCoreProduct;
use super::route::ProductRoute;
use super::runtime::{self, check};
use super::staging::{as_bytes, RowTableKind};
use super::{
    dim, fused, AttentionShape, AttentionStep, Backend, CandidateRequest, Candidates, CudaBackend,
    CudaKvCache, DeltaNetStep, DeviceBuffer, Experts, GatedFfn, Glu, Norm, PreparedInput, Product,
    Rope, RopeMode, Scratch, SeqPos, SharedExpert, SharedScratch, Weight,
};
use crate::error::{Error, Result};
use crate::kv_cache::LayerState;

impl Backend for CudaBackend {
    type Buffer = DeviceBuffer;
    type KvCache = CudaKvCache;

    fn norm_moe_ffn_residual(
        &self,
        x: &mut DeviceBuffer,
        norm: Norm,
        rows: usize,
        experts: &Experts,
        glu: Glu,
        post_norm: Option<Norm>,
        scratch: Scratch<DeviceBuffer>,
    ) -> Result<()> {
        self.moe_ffn_residual(x, norm, rows, experts, None, glu, post_norm, scratch)
    }

    fn norm_moe_shared_ffn_residual(
        &self,
        x: &mut DeviceBuffer,
        norm: Norm,
        rows: usize,
        experts: &Experts,
        shared: &SharedExpert,
        glu: Glu,
        post_norm: Option<Norm>,
        scratch: Scratch<DeviceBuffer>,
        shared_scratch: SharedScratch<DeviceBuffer>,
    ) -> Result<()> {
        if self.mixes_shared_expert(experts, shared, rows, post_norm.is_some()) {
            return self.moe_ffn_residual(x, norm, rows, experts, Some(shared), glu, None, scratch);
        }
        fused::norm_moe_shared_ffn_residual(
            self,
            x,
            norm,
            rows,
            experts,
            shared,
            glu,
            post_norm,
            scratch,
            shared_scratch,
        )
    }

    fn buffer(&self, len: usize) -> Result<DeviceBuffer> {
        self.allocator.alloc::<f32>(len)
    }

    fn read(&self, buffer: &DeviceBuffer, out: &mut [f32]) -> Result<()> {
        let mut state = self.lock();
        out.copy_from_slice(state.read_to_pinned(buffer, out.len())?);
        Ok(())
    }

    fn read_rows(
        &self,
        buffer: &DeviceBuffer,
        row_len: usize,
        rows: &mut [&mut Vec<f32>],
    ) -> Result<()> {
        self.lock()
            .read_rows(self.info.index, buffer, row_len, rows)
    }

    fn read_candidates(
        &self,
        buffer: &DeviceBuffer,
        row_len: usize,
        requests: &[CandidateRequest],
        out: &mut [Candidates],
    ) -> Result<()> {
        self.candidates(buffer, row_len, requests, out)
    }

    fn write(&self, buffer: &mut DeviceBuffer, values: &[f32]) -> Result<()> {
        let mut state = self.lock();
        let st = &mut *state;
        assert!(values.len() <= buffer.len());
        // SAFETY: the buffer holds the values.
        unsafe {
            st.staging
                .copy_to_device(buffer.as_mut_ptr().cast(), as_bytes(values), &st.stream)
        }
    }

    fn step_input(&self, values: &[f32], out: &mut DeviceBuffer) -> Result<()> {
        let mut state = self.lock();
        let st = &mut *state;
        assert!(values.len() <= out.len());
        // A recorded step copies from its input block, which each replay
        // fills with that step's values.
        let Some(capture) = &st.capture else {
            drop(state);
            return self.write(out, values);
        };
        let src = capture.inputs.input(values.len())?;
        // SAFETY: the input block holds `values.len()` values (checked by
        // `input`), and `out` holds as many.
        unsafe {
            runtime::copy_on_device(
                out.as_mut_ptr().cast(),
                src.cast(),
                std::mem::size_of_val(values),
                st.stream.raw(),
            )
        }
    }

    fn kv_cache(&self, n_ctx: usize, layers: &[LayerState]) -> Result<CudaKvCache> {
        self.sequence_cache(n_ctx, layers)
    }

    fn reset_recurrent(&self, cache: &mut CudaKvCache) {
        cache.reset_recurrent();
        // Cleared now where it can be; else before the next step
        // (`run_step`), which reports a failure to clear.
        let _ = self.clear_states(&mut [cache]);
    }

    fn embed(
        &self,
        table: &Weight,
        tokens: &[u32],
        scale: f32,
        out: &mut DeviceBuffer,
    ) -> Result<()> {
        let mut state = self.lock();
        let st = &mut *state;
        let ids: Vec<c_int> = tokens.iter().map(|&t| t as c_int).collect();
        let device_ids = match &st.capture {
            Some(capture) => capture.inputs.token_ids(ids.len())?,
            None => st.upload_indices(&self.allocator, &ids)?,
        };
        // SAFETY: `device_ids` holds the ids; `out` holds one row per token;
        // the table is a located weight.
        unsafe {
            check(
                m40_embed(
                    table.ty.id() as c_int,
                    self.weights.matrix(table),
                    dim(table.cols, "an embedding width")?,
                    device_ids,
                    dim(ids.len(), "a batch")?,
                    scale,
                    out.as_mut_ptr(),
                    st.stream.raw(),
                ),
                || "embedding lookup".to_string(),
            )
        }
    }

    fn matmul(
        &self,
        w: &Weight,
        x: &DeviceBuffer,
        rows: usize,
        out: &mut DeviceBuffer,
    ) -> Result<()> {
        assert!(x.len() >= rows * w.cols && out.len() >= rows * w.rows);
        let route = self.route(w, rows);
        let mut state = self.lock();
        // SAFETY: sizes checked above.
        unsafe { self.product(&mut state, route, w, x.as_ptr(), rows, out.as_mut_ptr()) }
    }

    fn add_bias(&self, x: &mut DeviceBuffer, bias: &Weight, rows: usize) -> Result<()> {
        let state = self.lock();
        assert!(x.len() >= rows * bias.cols * bias.rows);
        // SAFETY: size checked above.
        unsafe { self.add_bias_into(&state, x.as_mut_ptr(), bias, rows) }
    }

    fn rms_norm(&self, x: &mut DeviceBuffer, weight: &Weight, eps: f32, len: usize) -> Result<()> {
        let state = self.lock();
        let group = weight.cols * weight.rows;
        let x = x.as_mut_ptr();
        // SAFETY: x holds len values, a whole number of groups; in place.
        unsafe { self.rms_norm_into(&state, x, weight, eps, len / group, x) }
    }

    fn rms_normalize(
        &self,
        x: &mut DeviceBuffer,
        group: usize,
        eps: f32,
        len: usize,
    ) -> Result<()> {
        assert!(group > 0 && len.is_multiple_of(group) && x.len() >= len);
        let state = self.lock();
        let x = x.as_mut_ptr();
        // SAFETY: x holds len values, a whole number of groups (checked
        // above); in place, without a weight.
        unsafe {
            check(
                m40_rms_norm(
                    x,
                    std::ptr::null(),
                    dim(group, "a norm width")?,
                    dim(len / group, "a count of groups")?,
                    eps,
                    x,
                    state.stream.raw(),
                ),
                || "RMS norm without a weight".to_string(),
            )
        }
    }

    fn scale_by(&self, x: &mut DeviceBuffer, factor: &Weight, len: usize) -> Result<()> {
        assert!(factor.cols * factor.rows == 1 && x.len() >= len);
        let state = self.lock();
        // SAFETY: x holds len values; the factor is one f32 on the device.
        unsafe {
            check(
                m40_scale_by(
                    x.as_mut_ptr(),
                    self.weights.vector(factor)?,
                    len,
                    state.stream.raw(),
                ),
                || "scaling by a weight".to_string(),
            )
        }
    }

    fn soft_cap(&self, x: &mut DeviceBuffer, cap: f32, len: usize) -> Result<()> {
        assert!(x.len() >= len);
        let state = self.lock();
        // SAFETY: x holds len values.
        unsafe {
            check(
                m40_soft_cap(x.as_mut_ptr(), cap, len, state.stream.raw()),
                || "soft-capping".to_string(),
            )
        }
    }

    fn gather_rows(
        &self,
        src: &DeviceBuffer,
        width: usize,
        rows: &[usize],
        out: &mut DeviceBuffer,
    ) -> Result<()> {
        let mut state = self.lock();
        let st = &mut *state;
        if rows.is_empty() {
            return Ok(());
        }
        if rows.iter().enumerate().all(|(i, &r)| i == r) {
            // SAFETY: both hold rows.len() × width values.
            return unsafe {
                runtime::copy_on_device(
                    out.as_mut_ptr().cast(),
                    src.as_ptr().cast(),
                    rows.len() * width * 4,
                    st.stream.raw(),
                )
            };
        }
        let ids: Vec<c_int> = rows.iter().map(|&r| r as c_int).collect();
        let device_ids = st.upload_indices(&self.allocator, &ids)?;
        // SAFETY: `device_ids` holds the ids; src holds every named row.
        unsafe {
            check(
                m40_gather_rows(
                    src.as_ptr(),
                    dim(width, "a row width")?,
                    device_ids,
                    ids.len() as c_int,
                    out.as_mut_ptr(),
                    st.stream.raw(),
                ),
                || "row gather".to_string(),
            )
        }
    }

    fn add(&self, x: &mut DeviceBuffer, y: &DeviceBuffer, len: usize) -> Result<()> {
        let state = self.lock();
        // SAFETY: both hold len values.
        unsafe {
            check(
                m40_add(x.as_mut_ptr(), y.as_ptr(), len, len, state.stream.raw()),
                || "residual add".to_string(),
            )
        }
    }

    fn rope(
        &self,
        x: &mut DeviceBuffer,
        n_heads: usize,
        head_dim: usize,
        positions: &[SeqPos],
        rope: &Rope,
    ) -> Result<()> {
        let mut state = self.lock();
        let st = &mut *state;
        let table: Vec<DeviceRow> = positions
            .iter()
            .map(|p| {
                Ok(DeviceRow {
                    keys: 0,
                    values: 0,
                    pos: dim(p.pos, "a position")?,
                    n_ctx: 0,
                    state: 0,
                })
            })
            .collect::<Result<_>>()?;
        let rows = st.row_table(&self.allocator, RowTableKind::Positions, table)?;
        let factors = match rope.freq_factors {
            Some(f) => self.weights.vector(f)?,
            None => std::ptr::null(),
        };
        // SAFETY: x holds positions.len() × n_heads × head_dim values; the
        // row table one entry per row; factors dims/2 values when present.
        unsafe {
            check(
                m40_rope(
                    x.as_mut_ptr(),
                    positions.len() as c_int,
                    n_heads as c_int,
                    head_dim as c_int,
                    rows,
                    c_int::from(rope.mode == RopeMode::Neox),
                    rope.dims as c_int,
                    rope.freq_base,
                    rope.freq_scale,
                    factors,
                    YarnRamp::of(rope),
                    st.stream.raw(),
                ),
                || "RoPE".to_string(),
            )
        }
    }

    fn glu(
        &self,
        glu: Glu,
        gate: &DeviceBuffer,
        up: &DeviceBuffer,
        len: usize,
        out: &mut DeviceBuffer,
    ) -> Result<()> {
        let act = glu_activation(glu);
        let state = self.lock();
        // SAFETY: all three hold len values.
        unsafe {
            check(
                m40_glu(
                    act,
                    gate.as_ptr(),
                    up.as_ptr(),
                    len,
                    out.as_mut_ptr(),
                    state.stream.raw(),
                ),
                || "gated activation".to_string(),
            )
        }
    }

    fn delta_net(
        &self,
        caches: &mut [&mut CudaKvCache],
        step: DeltaNetStep,
        qkv: &DeviceBuffer,
        alpha: &DeviceBuffer,
        beta: &DeviceBuffer,
        out: &mut DeviceBuffer,
    ) -> Result<()> {
        self.delta_net_step(caches, step, qkv, alpha, beta, out)
    }

    fn split_halves(
        &self,
        x: &DeviceBuffer,
        groups: usize,
        half: usize,
        first: &mut DeviceBuffer,
        second: &mut DeviceBuffer,
    ) -> Result<()> {
        let state = self.lock();
        // SAFETY: x holds groups × 2 · half values, first and second groups
        // × half each.
        unsafe {
            check(
                m40_split_halves(
                    x.as_ptr(),
                    dim(groups, "a count of heads")?,
                    dim(half, "a head width")?,
                    first.as_mut_ptr(),
                    second.as_mut_ptr(),
                    state.stream.raw(),
                ),
                || "splitting queries and gates".to_string(),
            )
        }
    }

    fn sigmoid_gate(&self, x: &mut DeviceBuffer, gate: &DeviceBuffer, len: usize) -> Result<()> {
        let state = self.lock();
        // SAFETY: both hold len values.
        unsafe {
            check(
                m40_sigmoid_gate(x.as_mut_ptr(), gate.as_ptr(), len, state.stream.raw()),
                || "output gate".to_string(),
            )
        }
    }

    fn gated_add(
        &self,
        x: &mut DeviceBuffer,
        y: &DeviceBuffer,
        gate: &DeviceBuffer,
        rows: usize,
        width: usize,
    ) -> Result<()> {
        let state = self.lock();
        // SAFETY: x and y hold rows × width values, gate one a row.
        unsafe {
            check(
                m40_gated_add(
                    x.as_mut_ptr(),
                    y.as_ptr(),
                    gate.as_ptr(),
                    dim(rows, "a batch's rows")?,
                    dim(width, "a row width")?,
                    state.stream.raw(),
                ),
                || "gated shared expert".to_string(),
            )
        }
    }

    fn store_kv(
        &self,
        caches: &mut [&mut CudaKvCache],
        layer: usize,
        k: &DeviceBuffer,
        v: &DeviceBuffer,
        rows: &[SeqPos],
    ) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        let mut state = self.lock();
        let st = &mut *state;
        let cached = cached_layer(caches, rows, layer)?;
        assert!(
            k.len() >= rows.len() * cached.k_width && v.len() >= rows.len() * cached.v_width,
            "keys and values for every row at the layer's widths"
        );
        let table = device_rows(caches, rows)?;
        let device_rows = st.row_table(&self.allocator, RowTableKind::CacheRows, table)?;
        // SAFETY: k and v hold rows.len() rows of their widths (asserted);
        // every row's cache has room for its position (the session checked
        // it).
        unsafe {
            check(
                m40_store_kv(
                    k.as_ptr(),
                    v.as_ptr(),
                    rows.len() as c_int,
                    dim(cached.k_width, "a key width")?,
                    dim(cached.v_width, "a value width")?,
                    device_rows,
                    cached.place,
                    st.stream.raw(),
                ),
                || "KV cache store".to_string(),
            )
        }
    }

    fn attention(
        &self,
        caches: &[&mut CudaKvCache],
        layer: usize,
        q: &DeviceBuffer,
        rows: &[SeqPos],
        shape: &AttentionShape,
        out: &mut DeviceBuffer,
    ) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        if shape.head_dim_k > ATTENTION_MAX_HEAD_DIM || shape.head_dim_v > ATTENTION_MAX_HEAD_DIM {
            return Err(Error::unsupported(format!(
                "heads of {} values; the CUDA attention kernel handles up to {ATTENTION_MAX_HEAD_DIM}",
                shape.head_dim_k.max(shape.head_dim_v)
            )));
        }
        let cached = cached_layer(caches, rows, layer)?;
        check_widths(&cached, shape.n_head_kv, shape.head_dim_k, shape.head_dim_v)?;
        // A sink logit per query head (gpt-oss), converted to f32 at load.
        let sinks = match &shape.sinks {
            Some(w) => {
                assert_eq!(w.cols * w.rows, shape.n_head, "a sink logit per query head");
                self.weights.vector(w)?
            }
            None => std::ptr::null(),
        };
        let mut state = self.lock();
        let st = &mut *state;
        let table = device_rows(caches, rows)?;
        let device_rows = st.row_table(&self.allocator, RowTableKind::CacheRows, table)?;
        let launch = self.attention_launch(rows, shape);
        let n_splits = launch.splits;
        if let Some(capture) = &mut st.capture {
            // Layers of one shape share an entry: a replay checks each once.
            let entry = (*shape, launch);
            if !capture.attention.contains(&entry) {
                capture.attention.push(entry);
            }
        }
        // Those two kernels write the output directly over one range.
        let partial_len = if heads_of_multiples_of_8(shape) && n_splits == 1 {
            0
        } else {
            rows.len() * shape.n_head * n_splits * (shape.head_dim_v + 2)
        };
        st.arena
            .begin(&self.allocator, Arena::footprint(&[partial_len * 4]))?;
        let partial = st.arena.take::<f32>(partial_len);
        // A decode step's output also goes prepared into the decode
        // scratch, for the attention output product that follows, in that
        // product's form; not with Q8_K's scales, whose 256 values the
        // kernel's warps do not hold (the product prepares them itself).
        let width = shape.n_head * shape.head_dim_v;
        let form = self.attention_output_forms.get(layer).copied().flatten();
        let prepared = match (&st.activations_q8, form) {
            (Some(scratch), Some(form))
                if !launch.tiled
                    && rows.len() <= GEMV_MAX_X
                    && shape.head_dim_v.is_multiple_of(32)
                    && shape.head_dim_k.is_multiple_of(8)
                    && width <= st.widest_product
                    && !form.whole_super_blocks() =>
            {
                scratch.as_ptr().cast_mut()
            }
            _ => std::ptr::null_mut(),
        };
        let form = form.filter(|_| !prepared.is_null());
        st.prepared_input = form.map(|form| PreparedInput {
            x: out.as_ptr() as usize,
            cols: width,
            rows: rows.len(),
            op: st.op + 1,
            form,
        });
        // SAFETY: q and out hold rows.len() × n_head heads; sinks, when not
        // null, n_head values; the partials piece is sized for the launch; the row table names live caches
        // (for the tiled kernel, one sequence at consecutive positions);
        // the decode scratch holds GEMV_MAX_X prepared rows of the widest
        // product's width.
        unsafe {
            check(
                m40_attention(
                    q.as_ptr(),
                    rows.len() as c_int,
                    device_rows,
                    cached.place,
                    shape.n_head as c_int,
                    shape.n_head_kv as c_int,
                    shape.head_dim_k as c_int,
                    shape.head_dim_v as c_int,
                    shape
                        .window
                        .map_or(0, |w| w.min(i32::MAX as usize) as c_int),
                    shape.scale,
                    sinks,
                    c_int::from(launch.tiled),
                    n_splits as c_int,
                    launch.heads_per_block as c_int,
                    partial,
                    out.as_mut_ptr(),
                    prepared,
                    form.map_or(0, PreparedForm::raw),
                    c_int::from(self.overlap_launches),
                    st.stream.raw(),
                ),
                || "attention".to_string(),
            )
        }
    }

    fn norm_matmuls(
        &self,
        x: &DeviceBuffer,
        norm: Norm,
        rows: usize,
        normed: &mut DeviceBuffer,
        products: &mut [Product<DeviceBuffer>],
    ) -> Result<()> {
        let mut state = self.lock();
        let st = &mut *state;
        let width = norm.weight.cols * norm.weight.rows;
        for p in products.iter() {
            assert!(p.w.cols == width && p.out.len() >= rows * p.w.rows);
        }
        assert!(x.len() >= rows * width);
        let routes = self.shared_rows_routes(products.iter().map(|p| p.w), rows);
        if !routes.is_empty()
            && routes
                .iter()
                .all(|r| matches!(r, ProductRoute::Decode { .. }))
        {
            return self.decode_products(st, x, norm, rows, products, &routes, None);
        }
        let on_tensor_cores: Vec<TensorCoreProduct> = products
            .iter_mut()
            .zip(&routes)
            .filter(|(_, &route)| route == ProductRoute::TensorCores)
            .map(|(p, _)| TensorCoreProduct {
                w: p.w,
                bias: p.bias,
                out: p.out.as_mut_ptr(),
                accumulate: false,
            })
            .collect();
        if on_tensor_cores.len() == products.len() {
            // The norm goes into the f16 conversion.
            // SAFETY: x holds rows × the norm's width values (checked
            // above), each out rows × its w.rows, each bias its product's.
            return unsafe {
                self.products_on_tensor_cores(st, x.as_ptr(), rows, Some(norm), &on_tensor_cores)
            };
        }
        assert!(normed.len() >= rows * width);
        // SAFETY: x and normed hold rows × width values (checked above).
        unsafe {
            self.rms_norm_into(
                st,
                x.as_ptr(),
                norm.weight,
                norm.eps,
                rows,
                normed.as_mut_ptr(),
            )?
        };
        let input = normed.as_ptr();
        // SAFETY: as below; each bias is its product's.
        unsafe { self.products_on_tensor_cores(st, input, rows, None, &on_tensor_cores)? };
        for (p, &route) in products.iter_mut().zip(&routes) {
            if route == ProductRoute::TensorCores {
                continue;
            }
            // SAFETY: input holds rows × p.w.cols values, p.out rows ×
            // p.w.rows (checked above).
            unsafe {
                self.product(st, route, p.w, input, rows, p.out.as_mut_ptr())?;
                if let Some(bias) = p.bias {
                    assert_eq!(bias.cols * bias.rows, p.w.rows);
                    self.add_bias_into(st, p.out.as_mut_ptr(), bias, rows)?;
                }
            }
        }
        Ok(())
    }

    fn norm_qkv_attention_inputs(
        &self,
        x: &DeviceBuffer,
        norm: Norm,
        normed: &mut DeviceBuffer,
        qkv: &mut [Product<DeviceBuffer>; 3],
        caches: &mut [&mut CudaKvCache],
        step: AttentionStep,
    ) -> Result<()> {
        let AttentionStep {
            rows,
            heads,
            qk_norm,
            rope,
            ..
        } = step;
        let n = rows.len();
        let widths = [
            heads.n_head * heads.head_dim_k,
            heads.n_head_kv * heads.head_dim_k,
            heads.n_head_kv * heads.head_dim_v,
        ];
        let routes = self.shared_rows_routes(qkv.iter().map(|p| p.w), n);
        // The decode products' epilogue takes the attention-input step where
        // its RoPE pairs are adjacent rows, without frequency factors or
        // YaRN (m40_rope_angle_reduced in cuda/ops.cuh says why), and the
        // heads have no norms.
        let in_epilogue = n > 0
            && routes
                .iter()
                .all(|r| matches!(r, ProductRoute::Decode { .. }))
            && qk_norm.is_none()
            && rope.mode == RopeMode::Normal
            && rope.freq_factors.is_none()
            && rope.yarn.is_none()
            && rope.dims.is_multiple_of(2)
            && rope.dims <= heads.head_dim_k
            && heads.head_dim_k.max(heads.head_dim_v) <= ATTENTION_MAX_HEAD_DIM
            && qkv.iter().zip(widths).all(|(p, w)| p.w.rows == w);
        if !in_epilogue {
            return fused::norm_qkv_attention_inputs(self, x, norm, normed, qkv, caches, step);
        }
        let width = norm.weight.cols * norm.weight.rows;
        for p in qkv.iter() {
            assert!(p.w.cols == width && p.out.len() >= n * p.w.rows);
        }
        assert!(x.len() >= n * width);
        let mut state = self.lock();
        let st = &mut *state;
        let attention = self.attention_input_params(st, caches, step)?;
        self.decode_products(st, x, norm, n, qkv, &routes, Some(&attention))
    }

    fn norm_gated_ffn(
        &self,
        x: &DeviceBuffer,
        norm: Norm,
        rows: usize,
        ffn: GatedFfn,
        scratch: Scratch<DeviceBuffer>,
        out: &mut DeviceBuffer,
    ) -> Result<()> {
        let (gate, up) = (ffn.gate, ffn.up);
        let same_shape = gate.rows == up.rows && gate.cols == up.cols;
        let width = norm.weight.cols * norm.weight.rows;
        let routes = self.shared_rows_routes([gate, up], rows);
        if same_shape && routes == [ProductRoute::TensorCores; 2] {
            // Both products read one f16 conversion of the rows, which
            // takes the norm.
            let n = rows * gate.rows;
            assert!(x.len() >= rows * width && gate.cols == width);
            assert!(scratch.product.len() >= n && scratch.product2.len() >= n && out.len() >= n);
            let products = [
                TensorCoreProduct {
                    w: gate,
                    bias: None,
                    out: scratch.product.as_mut_ptr(),
                    accumulate: false,
                },
                TensorCoreProduct {
                    w: up,
                    bias: None,
                    out: scratch.product2.as_mut_ptr(),
                    accumulate: false,
                },
            ];
            {
                let mut state = self.lock();
                // SAFETY: x holds rows × width values, both products rows ×
                // gate.rows (checked above).
                unsafe {
                    self.products_on_tensor_cores(
                        &mut state,
                        x.as_ptr(),
                        rows,
                        Some(norm),
                        &products,
                    )?
                };
            }
            return self.glu(ffn.glu, scratch.product, scratch.product2, n, out);
        }
        // One decode launch takes both matrices where they share a format
        // and shape, normalizing its rows and applying the activation in
        // its epilogue.
        let one_launch = gate.ty == up.ty && same_shape;
        if !matches!(routes[0], ProductRoute::Decode { .. }) || !one_launch {
            return fused::norm_gated_ffn(self, x, norm, rows, ffn, scratch, out);
        }
        assert!(out.len() >= rows * gate.rows && gate.cols == width);
        assert!(x.len() >= rows * width);
        let state = self.lock();
        let epilogue = GemvEpilogue::gated(ffn.glu);
        let matrices = [
            self.gemv_matrix(gate, None, out.as_mut_ptr())?,
            self.gemv_matrix(up, None, out.as_mut_ptr())?,
        ];
        // SAFETY: x holds rows × cols values, out rows × gate.rows.
        unsafe {
            self.gemv(
                &state,
                gate,
                x.as_ptr(),
                rows,
                &matrices,
                epilogue,
                Some((self.weights.vector(norm.weight)?, norm.eps)),
                false,
                &AttentionInputs::NONE,
            )
        }
    }

    fn matmul_residual(
        &self,
        w: &Weight,
        bias: Option<&Weight>,
        a: &DeviceBuffer,
        rows: usize,
        post_norm: Option<Norm>,
        product: &mut DeviceBuffer,
        x: &mut DeviceBuffer,
    ) -> Result<()> {
        assert!(a.len() >= rows * w.cols && x.len() >= rows * w.rows);
        if let Some(b) = bias {
            assert_eq!(
                b.cols * b.rows,
                w.rows,
                "an output bias per row of the product"
            );
        }
        let route = self.route(w, rows);
        // Without a post-norm, the decode and tensor-core kernels add their
        // products, with the bias where there is one (gpt-oss's), to x
        // themselves; the other routes take the composition.
        match (route, post_norm) {
            (ProductRoute::Decode { .. } | ProductRoute::TensorCores, None) => {}
            _ if bias.is_some() => {
                return fused::matmul_residual(self, w, bias, a, rows, post_norm, product, x);
            }
            _ => {}
        }
        let mut state = self.lock();
        let st = &mut *state;
        match (route, post_norm) {
            (ProductRoute::Decode { .. }, None) => {
                let matrix = self.gemv_matrix(w, bias, x.as_mut_ptr())?;
                // SAFETY: sizes checked above.
                return unsafe {
                    self.gemv(
                        st,
                        w,
                        a.as_ptr(),
                        rows,
                        &[matrix],
                        GemvEpilogue::Accumulate,
                        None,
                        false,
                        &AttentionInputs::NONE,
                    )
                };
            }
            (ProductRoute::TensorCores, None) => {
                let product = TensorCoreProduct {
                    w,
                    bias,
                    out: x.as_mut_ptr(),
                    accumulate: true,
                };
                // SAFETY: a holds rows × w.cols values, x rows × w.rows, a
                // bias w.rows (checked).
                return unsafe {
                    self.products_on_tensor_cores(st, a.as_ptr(), rows, None, &[product])
                };
            }
            _ => {}
        }
        assert!(product.len() >= rows * w.rows);
        if let Some(norm) = post_norm {
            assert_eq!(norm.weight.cols * norm.weight.rows, w.rows);
        }
        // SAFETY: a holds rows × w.cols values, product rows × w.rows (checked).
        unsafe { self.product(st, route, w, a.as_ptr(), rows, product.as_mut_ptr())? };
        let n = rows * w.rows;
        // SAFETY: x and product hold rows × w.rows values.
        unsafe {
            match post_norm {
                Some(norm) => check(
                    m40_norm_add(
                        x.as_mut_ptr(),
                        product.as_ptr(),
                        self.weights.vector(norm.weight)?,
                        dim(w.rows, "a row width")?,
                        dim(rows, "a row count")?,
                        norm.eps,
                        st.stream.raw(),
                    ),
                    || "normalized residual add".to_string(),
                ),
                None => check(
                    m40_add(x.as_mut_ptr(), product.as_ptr(), n, n, st.stream.raw()),
                    || "residual add".to_string(),
                ),
            }
        }
    }

    fn attention_inputs(
        &self,
        caches: &mut [&mut CudaKvCache],
        step: AttentionStep,
        q: &mut DeviceBuffer,
        k: &mut DeviceBuffer,
        v: &DeviceBuffer,
    ) -> Result<()> {
        let AttentionStep {
            rows,
            heads,
            qk_norm,
            ..
        } = step;
        if rows.is_empty() {
            return Ok(());
        }
        if qk_norm.is_some_and(|(qn, kn)| qn.eps != kn.eps) {
            // The fused kernel takes one epsilon for both norms.
            return fused::attention_inputs(self, caches, step, q, k, v);
        }
        if heads.head_dim_k > ATTENTION_MAX_HEAD_DIM || heads.head_dim_v > ATTENTION_MAX_HEAD_DIM {
            return Err(Error::unsupported(format!(
                "heads of {} values; the CUDA kernels handle up to {ATTENTION_MAX_HEAD_DIM}",
                heads.head_dim_k.max(heads.head_dim_v)
            )));
        }
        let n = rows.len();
        assert!(
            q.len() >= n * heads.n_head * heads.head_dim_k
                && k.len() >= n * heads.n_head_kv * heads.head_dim_k
                && v.len() >= n * heads.n_head_kv * heads.head_dim_v
        );
        let mut state = self.lock();
        let st = &mut *state;
        let inputs = self.attention_input_params(st, caches, step)?;
        // SAFETY: q, k, v hold the rows' heads (checked above); every row's
        // cache has room for its position (the session checked it).
        unsafe {
            check(
                m40_attention_inputs(
                    q.as_mut_ptr(),
                    k.as_ptr(),
                    v.as_ptr(),
                    n as c_int,
                    &inputs,
                    st.stream.raw(),
                ),
                || "attention inputs (norms, RoPE, KV store)".to_string(),
            )
        }
    }
}
