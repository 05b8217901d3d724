//! The mixture-of-experts feed-forward block on the GPU, with its routing
//! on the device (cuda/moe.cu): the router's logits (a product like any
//! other), `m40_moe_route` (each row's experts and weights, the rows sorted
//! by expert into work pieces), each expert product as one launch over the
//! pieces (`ExpertView`; `ExpertRoute` says which kernel: the one-row
//! decode kernel for one session and small batches of small experts, the
//! tensor cores for larger batches and prompts where the GPU and the
//! formats have them, else the decode kernel in pieces of 8 rows), and the
//! weighted sum of each row's expert outputs into the residual. No value
//! comes back to the host, so a decode step with experts is recorded and
//! replayed like any other.
//!
//! Biases (gpt-oss's) go where the CPU backend adds them: the router's into
//! its logits before the routing, each expert's gate, up and down rows into
//! that expert's products (the launches read row e of each bias table for
//! expert e's pieces), so that the down bias is weighted with its expert's
//! output.
//!
//! A shared expert (Qwen3.5 MoE) of the routed experts' shapes and formats
//! joins a decode step's mixture as one more expert that every row uses,
//! weighted σ(its gate's logit): its products are pieces of the experts'
//! launches, its logit a row of the router's, and its output part of their
//! weighted sum, where on its own it would take seven launches a layer.

use std::ffi::c_int;

use super::kernels::*;
use super::memory::Arena;
use super::route::{ExpertRoute, ProductRoute};
use super::runtime::check;
use super::{dim, Backend, CudaBackend, DeviceBuffer, Experts, Glu, Norm, Product, Scratch, State};
use super::{SharedExpert, Weight, GEMV_MAX_X};
use crate::error::{Error, Result};
use crate::quant::GgmlType;

/// The routing of one step's rows, in device memory.
struct Routing {
    /// Each (row, slot)'s weight and sorted row (rows × slots a row).
    slot_weight: *mut f32,
    slot_row: *mut c_int,
    /// Each sorted row's source row.
    sorted_source: *mut c_int,
    work: *mut ExpertWork,
    n_work: c_int,
    /// The expert index the shared expert's pieces carry (n_expert).
    shared_expert: c_int,
}

/// One expert product: the matrices (expert 0's parts of the stacked
/// tensors) and how the launch finds the others.
struct ExpertProduct<'a> {
    matrices: &'a [(Weight, *mut f32)],
    /// Each matrix's bias table (a row per expert), where the mixture has
    /// biases.
    biases: Option<&'a [Weight]>,
    epilogue: GemvEpilogue,
    /// Bytes from one expert's matrix to the next.
    expert_bytes: usize,
    /// The shared expert's matrix beside each of `matrices`, where the
    /// step routes a shared expert.
    shared: Option<&'a [Weight]>,
}

impl CudaBackend {
    /// Whether a step of `rows` rows takes `shared` into the mixture
    /// (`moe_ffn_residual`): decode steps (up to GEMV_MAX_X rows, on the
    /// decode kernel) with no norm after the block, whose shared expert has
    /// the routed experts' shapes and formats and fits the routing's limits.
    pub(super) fn mixes_shared_expert(
        &self,
        ex: &Experts,
        shared: &SharedExpert,
        rows: usize,
        post_norm: bool,
    ) -> bool {
        let same = |a: &Weight, b: &Weight| a.ty == b.ty && a.rows == b.rows && a.cols == b.cols;
        let [gate, up, down] = ex.expert(0);
        rows <= GEMV_MAX_X
            && !post_norm
            && same(&shared.gate, &gate)
            && same(&shared.up, &up)
            && same(&shared.down, &down)
            && shared.gate_inp.rows == 1
            && shared.gate_inp.cols == ex.router.cols
            && ex.n_expert < MOE_MAX_EXPERTS
            && ex.n_used < MOE_MAX_USED
    }

    /// x += post_norm(Σ w_e · expert_e(norm(x))), plus σ(gate_inp · h) ·
    /// shared(h) where `shared` is given (see `mixes_shared_expert`):
    /// `Backend::norm_moe_ffn_residual` and, for the steps that mix it,
    /// `Backend::norm_moe_shared_ffn_residual`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn moe_ffn_residual(
        &self,
        x: &mut DeviceBuffer,
        norm: Norm,
        rows: usize,
        ex: &Experts,
        shared: Option<&SharedExpert>,
        glu: Glu,
        post_norm: Option<Norm>,
        scratch: Scratch<DeviceBuffer>,
    ) -> Result<()> {
        let (d, n_expert) = (ex.router.cols, ex.n_expert);
        // Slots a row: the routed experts, then the shared one.
        let k = ex.n_used + usize::from(shared.is_some());
        let [gate, up, down] = ex.expert(0);
        let ff = gate.rows;
        assert!(
            gate.cols == d && up.cols == d && up.rows == ff && down.cols == ff && down.rows == d,
            "expert shapes"
        );
        assert!(x.len() >= rows * d && scratch.normed.len() >= rows * d);
        let biases = ex.biases.as_ref();
        if let Some(b) = biases {
            assert!(
                b.router.cols * b.router.rows == n_expert
                    && [(&b.gate, ff), (&b.up, ff), (&b.down, d)]
                        .iter()
                        .all(|(t, width)| t.cols == *width && t.rows == n_expert),
                "a bias per expert and output"
            );
        }
        let activation = glu_activation(glu);
        let gated_epilogue = GemvEpilogue::gated(glu);
        if rows == 0 {
            return Ok(());
        }
        let n_slots = rows * k;

        // The router's logits: a product of h = norm(x) on its own route.
        // One session's products normalize its row themselves; a batch's
        // rows are normalized once, here, for the router and every expert
        // product to read (each expert would otherwise normalize again
        // the few rows it takes).
        let mut logits = self.buffer(rows * n_expert)?;
        let mut shared_logit = shared.map(|_| self.buffer(rows)).transpose()?;
        let router_route = self.route(&ex.router, rows);
        if rows == 1 {
            let router = Product {
                w: &ex.router,
                bias: biases.map(|b| &b.router),
                out: &mut logits,
            };
            match shared.zip(shared_logit.as_mut()) {
                Some((sh, out)) => {
                    let gate_inp = Product {
                        w: &sh.gate_inp,
                        bias: None,
                        out,
                    };
                    self.norm_matmuls(x, norm, rows, scratch.normed, &mut [router, gate_inp])?
                }
                None => self.norm_matmuls(x, norm, rows, scratch.normed, &mut [router])?,
            }
        } else {
            let mut state = self.lock();
            // SAFETY: x and normed hold rows × d values (checked above),
            // logits rows × n_expert.
            unsafe {
                self.rms_norm_into(
                    &state,
                    x.as_ptr(),
                    norm.weight,
                    norm.eps,
                    rows,
                    scratch.normed.as_mut_ptr(),
                )?;
                match (router_route, &state.cublas) {
                    // The choice of experts is discrete: TF32's rounding of
                    // the router's inputs would flip near-ties the FP32
                    // products of the CPU and of one session decide.
                    (ProductRoute::Cublas { .. }, Some(cublas))
                        if ex.router.ty == GgmlType::F32 =>
                    {
                        cublas.gemm_xwt_fp32(
                            self.weights.matrix(&ex.router).cast(),
                            n_expert,
                            d,
                            scratch.normed.as_ptr(),
                            rows,
                            logits.as_mut_ptr(),
                            n_expert,
                        )?
                    }
                    _ => self.product(
                        &mut state,
                        router_route,
                        &ex.router,
                        scratch.normed.as_ptr(),
                        rows,
                        logits.as_mut_ptr(),
                    )?,
                }
                if let Some(b) = biases {
                    // SAFETY: logits holds rows × n_expert values.
                    self.add_bias_into(&state, logits.as_mut_ptr(), &b.router, rows)?;
                }
                if let Some((sh, out)) = shared.zip(shared_logit.as_mut()) {
                    // SAFETY: normed holds rows × d values, out rows.
                    self.product(
                        &mut state,
                        self.route(&sh.gate_inp, rows),
                        &sh.gate_inp,
                        scratch.normed.as_ptr(),
                        rows,
                        out.as_mut_ptr(),
                    )?;
                }
            }
        }
        let h = scratch.normed.as_ptr();
        // Each product's bias table, where the mixture has biases.
        let [gate_bias, up_bias, down_bias] = match biases {
            Some(b) => [Some(&b.gate), Some(&b.up), Some(&b.down)],
            None => [None; 3],
        };

        let expert_bytes = gate.n_bytes + up.n_bytes + down.n_bytes;
        let route = self
            .routes
            .expert_route(gate.ty, down.ty, rows, expert_bytes);
        let piece_rows = match route {
            ExpertRoute::TensorCores { piece_rows } => piece_rows,
            ExpertRoute::Decode { piece_rows, .. } => piece_rows,
        };
        let n_rows = dim(rows, "a row count")?;
        let (e, used, slots, piece) = (
            dim(n_expert, "an expert count")?,
            dim(ex.n_used, "an experts-used count")?,
            dim(k, "an experts-used count")?,
            dim(piece_rows, "a piece size")?,
        );
        // The shared expert counts as one more expert, and one more used.
        let extra = c_int::from(shared.is_some());
        // SAFETY: host arithmetic.
        let n_work = unsafe { m40_moe_pieces(n_rows, e + extra, slots, piece) };
        if !(1..=65_535).contains(&n_work) {
            return Err(Error::unsupported(format!(
                "{rows} rows routed to {k} of {n_expert} experts make {n_work} work pieces; the CUDA kernels take 1 to 65535"
            )));
        }
        let widest = d.max(ff);
        let tensor_cores = matches!(route, ExpertRoute::TensorCores { .. });
        let prepared = match route {
            ExpertRoute::Decode { prepared, .. } => prepared,
            ExpertRoute::TensorCores { .. } => [false; 2],
        };
        // Every piece of scratch the block needs, in one allocation that
        // lives until the step's kernels have been enqueued (the stream
        // orders any reuse; a recorded step keeps it).
        let mut pieces = vec![
            n_slots * 4,          // slot weights
            n_slots * 4,          // slot rows
            n_slots * 4,          // sorted sources
            n_work as usize * 12, // work pieces
            n_slots * d * 4,      // the sorted input rows, then the outputs
            n_slots * ff * 4,     // the gated activations
        ];
        if tensor_cores {
            pieces.extend([n_slots * ff * 4, n_slots * widest * 2, n_slots * 4]);
        }
        if prepared.contains(&true) {
            pieces.push(prepared_bytes(widest, n_slots));
        }
        if !tensor_cores && gate.ty != up.ty {
            pieces.push(n_slots * ff * 4);
        }
        let mut arena = Arena::default();
        arena.begin(&self.allocator, Arena::footprint(&pieces))?;
        let routing = Routing {
            slot_weight: arena.take::<f32>(n_slots),
            slot_row: arena.take::<c_int>(n_slots),
            sorted_source: arena.take::<c_int>(n_slots),
            work: arena.take::<ExpertWork>(n_work as usize),
            n_work,
            shared_expert: e,
        };
        let (sorted, act) = (
            arena.take::<f32>(n_slots * d),
            arena.take::<f32>(n_slots * ff),
        );
        let q8 = if prepared.contains(&true) {
            arena.take::<i8>(prepared_bytes(widest, n_slots))
        } else {
            std::ptr::null_mut()
        };
        // One session's row, normalized and prepared by the routing launch
        // for the gate and up products (one launch, gate and up together).
        let quantized_by_route = rows == 1 && prepared[0] && gate.ty == up.ty;
        let norm_weights = self.weights.vector(norm.weight)?;

        let state = self.lock();
        let st = &*state;
        let stream = st.stream.raw();
        // SAFETY: logits holds rows × n_expert values; the routing's arrays
        // were sized above (n_work pieces, as m40_moe_pieces requires); x
        // holds one row of d values and q8 prepared_bytes(d, 1) bytes or more
        // where the launch prepares it.
        check(
            unsafe {
                m40_moe_route(
                    c_int::from(self.overlap_launches),
                    logits.as_ptr(),
                    shared_logit
                        .as_ref()
                        .map_or(std::ptr::null(), |l| l.as_ptr()),
                    n_rows,
                    e,
                    used,
                    piece,
                    routing.slot_weight,
                    routing.slot_row,
                    routing.sorted_source,
                    routing.work,
                    n_work,
                    x.as_ptr(),
                    norm_weights,
                    norm.eps,
                    dim(d, "a row width")?,
                    1,
                    if quantized_by_route {
                        q8
                    } else {
                        std::ptr::null_mut()
                    },
                    self.routes.form(gate.ty).raw(),
                    stream,
                )
            },
            || "expert routing".to_string(),
        )?;
        if tensor_cores {
            let up_out = arena.take::<f32>(n_slots * ff);
            let x_f16 = arena.take::<u16>(n_slots * widest);
            let x_scales = arena.take::<f32>(n_slots);
            // SAFETY: every pointer was sized above for n_slots rows.
            unsafe {
                self.gather_sorted(st, h, d, &routing, n_slots, sorted)?;
                self.to_f16(st, sorted, &gate, n_slots, x_f16, x_scales)?;
                self.experts_on_tensor_cores(
                    st,
                    &gate,
                    gate_bias,
                    shared.map(|s| &s.gate),
                    x_f16,
                    x_scales,
                    piece_rows,
                    &routing,
                    act,
                )?;
                if up.ty.activation_scales() != gate.ty.activation_scales() {
                    self.to_f16(st, sorted, &up, n_slots, x_f16, x_scales)?;
                }
                self.experts_on_tensor_cores(
                    st,
                    &up,
                    up_bias,
                    shared.map(|s| &s.up),
                    x_f16,
                    x_scales,
                    piece_rows,
                    &routing,
                    up_out,
                )?;
                check(
                    m40_glu(activation, act, up_out, n_slots * ff, act, stream),
                    || "expert activations".to_string(),
                )?;
                self.to_f16(st, act, &down, n_slots, x_f16, x_scales)?;
                self.experts_on_tensor_cores(
                    st,
                    &down,
                    down_bias,
                    shared.map(|s| &s.down),
                    x_f16,
                    x_scales,
                    piece_rows,
                    &routing,
                    sorted,
                )?;
            }
        } else {
            // One session's pieces all read its one row, which they
            // normalize themselves; a batch's normalized rows are gathered
            // into expert order first.
            let (input, x_rows, x_shared, fused_norm) = if rows == 1 {
                (x.as_ptr(), 1, true, Some((norm_weights, norm.eps)))
            } else {
                // SAFETY: h holds rows × d values, sorted n_slots × d.
                unsafe { self.gather_sorted(st, h, d, &routing, n_slots, sorted)? };
                (sorted.cast_const(), n_slots, false, None)
            };
            let q8_gate_up = if prepared[0] {
                q8
            } else {
                std::ptr::null_mut()
            };
            let gate_up_biases = biases.map(|b| [b.gate, b.up]);
            if gate.ty == up.ty {
                let shared_gate_up = shared.map(|s| [s.gate, s.up]);
                let product = ExpertProduct {
                    matrices: &[(gate, act), (up, act)],
                    biases: gate_up_biases.as_ref().map(|b| &b[..]),
                    epilogue: gated_epilogue,
                    expert_bytes: gate.n_bytes,
                    shared: shared_gate_up.as_ref().map(|m| &m[..]),
                };
                // SAFETY: input holds x_rows × d values, act n_slots × ff.
                unsafe {
                    self.experts_on_decode_kernel(
                        st,
                        &product,
                        input,
                        piece_rows,
                        x_rows,
                        x_shared,
                        fused_norm,
                        q8_gate_up,
                        quantized_by_route,
                        &routing,
                    )?
                };
            } else {
                let up_out = arena.take::<f32>(n_slots * ff);
                let shared_gate_up = shared.map(|s| [s.gate, s.up]);
                for (i, (w, out)) in [(gate, act), (up, up_out)].into_iter().enumerate() {
                    let product = ExpertProduct {
                        matrices: &[(w, out)],
                        biases: gate_up_biases.as_ref().map(|b| &b[i..=i]),
                        epilogue: GemvEpilogue::Store,
                        expert_bytes: w.n_bytes,
                        shared: shared_gate_up.as_ref().map(|m| &m[i..=i]),
                    };
                    let q8 = if self.routes.route(w.ty, 1)
                        == (ProductRoute::Decode { prepared: true })
                    {
                        q8
                    } else {
                        std::ptr::null_mut()
                    };
                    // SAFETY: as above, out n_slots × ff.
                    unsafe {
                        self.experts_on_decode_kernel(
                            st, &product, input, piece_rows, x_rows, x_shared, fused_norm, q8,
                            false, &routing,
                        )?
                    };
                }
                // SAFETY: act and up_out hold n_slots × ff values.
                check(
                    unsafe { m40_glu(activation, act, up_out, n_slots * ff, act, stream) },
                    || "expert activations".to_string(),
                )?;
            }
            let shared_down = shared.map(|s| [s.down]);
            let down_biases = biases.map(|b| [b.down]);
            let product = ExpertProduct {
                matrices: &[(down, sorted)],
                biases: down_biases.as_ref().map(|b| &b[..]),
                epilogue: GemvEpilogue::Store,
                expert_bytes: down.n_bytes,
                shared: shared_down.as_ref().map(|m| &m[..]),
            };
            let q8_down = if prepared[1] {
                q8
            } else {
                std::ptr::null_mut()
            };
            // SAFETY: act holds n_slots × ff values, sorted n_slots × d.
            unsafe {
                self.experts_on_decode_kernel(
                    st, &product, act, piece_rows, n_slots, false, None, q8_down, false, &routing,
                )?
            };
        }

        let width = dim(d, "a row width")?;
        // The weighted sum into the residual, or, where a norm follows the
        // block, into scratch first.
        let (out, accumulate) = match post_norm {
            None => (x.as_mut_ptr(), 1),
            Some(_) => (scratch.normed.as_mut_ptr(), 0),
        };
        // SAFETY: out holds rows × d values (x, or normed, which held h),
        // sorted n_slots × d, the routing's arrays rows × k.
        check(
            unsafe {
                m40_moe_combine(
                    out,
                    sorted,
                    routing.slot_weight,
                    routing.slot_row,
                    n_rows,
                    slots,
                    width,
                    accumulate,
                    stream,
                )
            },
            || "expert outputs".to_string(),
        )?;
        let Some(post) = post_norm else {
            return Ok(());
        };
        // SAFETY: x and out hold rows × d values.
        check(
            unsafe {
                m40_norm_add(
                    x.as_mut_ptr(),
                    out,
                    self.weights.vector(post.weight)?,
                    width,
                    n_rows,
                    post.eps,
                    stream,
                )
            },
            || "normalized residual add".to_string(),
        )
    }

    /// sorted[i] = x[sorted_source[i]] for the step's n_slots sorted rows.
    ///
    /// # Safety
    /// x holds every source row (`width` values each), sorted n_slots rows.
    unsafe fn gather_sorted(
        &self,
        st: &State,
        x: *const f32,
        width: usize,
        routing: &Routing,
        n_slots: usize,
        sorted: *mut f32,
    ) -> Result<()> {
        check(
            // SAFETY: as the caller promises; the sources come from routing.
            unsafe {
                m40_gather_rows(
                    x,
                    dim(width, "a row width")?,
                    routing.sorted_source,
                    dim(n_slots, "a row count")?,
                    sorted,
                    st.stream.raw(),
                )
            },
            || "rows into expert order".to_string(),
        )
    }

    /// n_rows rows of x, as wide as `w`, to f16 for `w`'s products on the
    /// tensor cores, on its format's 8-bit grid.
    ///
    /// # Safety
    /// x holds n_rows × w.cols values, x_f16 and x_scales room for them.
    unsafe fn to_f16(
        &self,
        st: &State,
        x: *const f32,
        w: &Weight,
        n_rows: usize,
        x_f16: *mut u16,
        x_scales: *mut f32,
    ) -> Result<()> {
        check(
            // SAFETY: as the caller promises.
            unsafe {
                m40_mmq_activations(
                    c_int::from(self.overlap_launches),
                    x,
                    std::ptr::null(),
                    0.0,
                    dim(n_rows, "a row count")?,
                    dim(w.cols, "a row width")?,
                    w.ty.activation_scales() as c_int,
                    x_f16,
                    x_scales,
                    st.stream.raw(),
                )
            },
            || "expert rows to f16 for tensor cores".to_string(),
        )
    }

    /// One expert product on the tensor cores: the sorted rows (as f16)
    /// times each piece's expert's matrix `w` (expert 0's part), plus its
    /// row of `bias` (a table of a row per expert) where given, into `out`.
    ///
    /// # Safety
    /// x_f16 and x_scales hold the sorted rows' conversion, out the sorted
    /// rows of w.rows values; the routing's pieces were written for
    /// `piece_rows`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn experts_on_tensor_cores(
        &self,
        st: &State,
        w: &Weight,
        bias: Option<&Weight>,
        shared: Option<&Weight>,
        x_f16: *const u16,
        x_scales: *const f32,
        piece_rows: usize,
        routing: &Routing,
        out: *mut f32,
    ) -> Result<()> {
        let launch = MmqLaunch {
            w: self.weights.matrix(w),
            rows: dim(w.rows, "a matrix height")?,
            cols: dim(w.cols, "a matrix width")?,
            x_f16,
            x_scales,
            n_x: dim(piece_rows, "a piece size")?,
            bias: match bias {
                Some(b) => self.weights.vector(b)?,
                None => std::ptr::null(),
            },
            y: out,
            accumulate: 0,
            splits: 1,
            partials: std::ptr::null_mut(),
            overlap: c_int::from(self.overlap_launches),
            experts: ExpertView {
                work: routing.work,
                expert_bytes: w.n_bytes as i64,
                n_work: routing.n_work,
                shared_expert: routing.shared_expert,
                shared: [
                    shared.map_or(std::ptr::null(), |s| self.weights.matrix(s)),
                    std::ptr::null(),
                    std::ptr::null(),
                ],
                bias_stride: w.rows as i64,
                ..ExpertView::NONE
            },
        };
        // SAFETY: as the caller promises; the struct is read before the
        // call returns.
        check(
            unsafe { m40_mmq(w.ty.id() as c_int, &launch, st.stream.raw()) },
            || format!("{} experts on tensor cores", w.ty.name()),
        )
    }

    /// One expert product on the decode kernel: x's rows (each piece's own,
    /// or row 0 for all where `x_shared`) times each piece's expert's
    /// matrices, through `product.epilogue`. `piece_rows`: the routing's
    /// most rows a piece (pieces of one row take the one-row kernel). `q8`:
    /// the scratch where the format's launch prepares its activations, else
    /// null; `quantized`: it already holds x (the routing launch's work).
    ///
    /// # Safety
    /// x holds x_rows rows of the matrices' width; each output holds the
    /// step's sorted rows; q8, when not null, prepared_bytes(width, x_rows) bytes.
    #[allow(clippy::too_many_arguments)]
    unsafe fn experts_on_decode_kernel(
        &self,
        st: &State,
        product: &ExpertProduct,
        x: *const f32,
        piece_rows: usize,
        x_rows: usize,
        x_shared: bool,
        norm: Option<(*const f32, f32)>,
        q8: *mut i8,
        quantized: bool,
        routing: &Routing,
    ) -> Result<()> {
        let (like, _) = product.matrices[0];
        let mut m = [GemvMatrix::NONE; 3];
        for (i, (slot, &(w, out))) in m.iter_mut().zip(product.matrices).enumerate() {
            // A launch's matrices share their height (gate and up), so one
            // stride steps every bias table a row per expert.
            assert_eq!(w.rows, like.rows);
            *slot = self.gemv_matrix(&w, product.biases.map(|b| &b[i]), out)?;
        }
        let mut shared = [std::ptr::null(); 3];
        for (slot, w) in shared.iter_mut().zip(product.shared.unwrap_or(&[])) {
            *slot = self.weights.matrix(w);
        }
        let launch = GemvLaunch {
            m,
            n_matrices: product.matrices.len() as c_int,
            cols: dim(like.cols, "a matrix width")?,
            x,
            n_x: if piece_rows == 1 {
                1
            } else {
                GEMV_MAX_X as c_int
            },
            epilogue: product.epilogue,
            norm: norm.map_or(std::ptr::null(), |n| n.0),
            eps: norm.map_or(0.0, |n| n.1),
            sm_count: self.info.multiprocessors as c_int,
            x_q8: q8,
            x_quantized: c_int::from(quantized),
            overlap: c_int::from(self.overlap_launches),
            attention: AttentionInputs::NONE,
            experts: ExpertView {
                work: routing.work,
                expert_bytes: product.expert_bytes as i64,
                n_work: routing.n_work,
                x_shared: c_int::from(x_shared),
                x_rows: dim(x_rows, "a row count")?,
                shared_expert: routing.shared_expert,
                shared,
                bias_stride: like.rows as i64,
            },
        };
        // SAFETY: as the caller promises.
        unsafe { self.launch_gemv(st, like.ty, &launch, "experts × vectors") }
    }
}
