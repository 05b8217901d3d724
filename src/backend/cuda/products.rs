//! The matrix products' launches, one launcher per route (`route`): the
//! decode kernel (`m40_gemv`), the tensor-core kernel (`m40_mmq`) and
//! cuBLAS (on f16 or f32 operands), and the RMS norm and bias adds the
//! unfused forms of the steps put around them.

use std::ffi::c_int;

use super::cublas::Cublas;
use super::kernels::*;
use super::memory::Arena;
use super::route::ProductRoute;
use super::runtime::{check, Stream};
use super::{dim, CudaBackend, DeviceBuffer, Norm, PreparedInput, Product, State, Weight};
use crate::error::{Error, Result};
use crate::quant::{ActivationScales, GgmlType};

/// Largest band of a dequantized weight matrix fed to one cuBLAS product.
const GEMM_BAND_BYTES: usize = 64 << 20;

/// Weight rows of a band of `value_bytes`-byte values of a `cols`-wide
/// matrix: as many as GEMM_BAND_BYTES holds, a multiple of 128 where that
/// is at least 128. A band's rows are its product's output columns, and
/// cuBLAS picks slow kernels for a count that is not a multiple of 8 or an
/// output that starts off a 16-byte boundary: 6,553-row bands (a 5,120-wide
/// matrix in f16) made a qwen35-27b prompt's 17,408 × 5,120 products run at
/// a third of the speed of a single aligned band (H200, 512 rows).
fn band_rows(rows: usize, cols: usize, value_bytes: usize) -> usize {
    const ALIGN: usize = 128;
    let fit = (GEMM_BAND_BYTES / (cols * value_bytes)).max(1);
    let aligned = if fit >= ALIGN {
        fit / ALIGN * ALIGN
    } else {
        fit
    };
    aligned.min(rows)
}

/// One product of `CudaBackend::products_on_tensor_cores`: out (rows ×
/// w.rows) = x · Wᵀ (+ bias), or out += that where `accumulate`.
pub(super) struct TensorCoreProduct<'a> {
    pub w: &'a Weight,
    pub bias: Option<&'a Weight>,
    pub out: *mut f32,
    pub accumulate: bool,
}

/// One cuBLAS product's operands: out (rows × the weight's rows) = x · Wᵀ
/// on the backend's stream.
struct Gemm<'a> {
    cublas: &'a Cublas,
    stream: Stream,
    x: *const f32,
    rows: usize,
    out: *mut f32,
}

impl CudaBackend {
    /// out (rows × w.rows) = x · Wᵀ on `route` (the product's own, see
    /// `CudaBackend::route`).
    ///
    /// # Safety
    /// x holds rows × w.cols values and out rows × w.rows, in device memory.
    pub(super) unsafe fn product(
        &self,
        st: &mut State,
        route: ProductRoute,
        w: &Weight,
        x: *const f32,
        rows: usize,
        out: *mut f32,
    ) -> Result<()> {
        match route {
            ProductRoute::TensorCores => {
                let product = TensorCoreProduct {
                    w,
                    bias: None,
                    out,
                    accumulate: false,
                };
                // SAFETY: as the caller promises.
                unsafe { self.products_on_tensor_cores(st, x, rows, None, &[product]) }
            }
            ProductRoute::Cublas { f16 } => {
                let cublas = st
                    .cublas
                    .as_ref()
                    .ok_or_else(|| Error::internal("a cuBLAS route without cuBLAS"))?;
                let gemm = Gemm {
                    cublas,
                    stream: st.stream.raw(),
                    x,
                    rows,
                    out,
                };
                // SAFETY: as the caller promises.
                unsafe {
                    if f16 {
                        self.gemm_f16(&mut st.arena, w, gemm)
                    } else {
                        self.gemm_f32(&mut st.arena, w, gemm)
                    }
                }
            }
            ProductRoute::Decode { .. } | ProductRoute::DecodeLaunches => {
                let matrix = self.gemv_matrix(w, None, out)?;
                // SAFETY: as the caller promises.
                unsafe {
                    self.gemv(
                        st,
                        w,
                        x,
                        rows,
                        &[matrix],
                        GemvEpilogue::Store,
                        None,
                        false,
                        &AttentionInputs::NONE,
                    )
                }
            }
        }
    }

    /// A cuBLAS product in FP32 (TF32 tensor cores on Ampere and newer):
    /// F32 weights as they are, other types dequantized to f32 a band of
    /// rows at a time.
    ///
    /// # Safety
    /// As `product`.
    unsafe fn gemm_f32(&self, arena: &mut Arena, w: &Weight, g: Gemm) -> Result<()> {
        if w.ty == GgmlType::F32 {
            // SAFETY: an F32 matrix is rows × cols f32 in the data section.
            return unsafe {
                g.cublas.gemm_xwt(
                    self.weights.matrix(w).cast(),
                    w.rows,
                    w.cols,
                    g.x,
                    g.rows,
                    g.out,
                    w.rows,
                )
            };
        }
        let (ty, cols) = (w.ty.id() as c_int, dim(w.cols, "a matrix width")?);
        let band_rows = band_rows(w.rows, w.cols, 4);
        let grid = w.ty.activation_scales();
        let rounded_bytes = if grid == ActivationScales::F32 {
            0
        } else {
            g.rows * w.cols * 4
        };
        arena.begin(
            &self.allocator,
            Arena::footprint(&[band_rows * w.cols * 4, rounded_bytes]),
        )?;
        let band = arena.take::<f32>(band_rows * w.cols);
        // The activations on the 8-bit grid the CPU's products of this
        // format put them on (values exact in f32), so that FP32 products,
        // the M40's prompts, are the CPU's up to the order of the sums.
        let x = if grid == ActivationScales::F32 {
            g.x
        } else {
            let rounded = arena.take::<f32>(g.rows * w.cols);
            // SAFETY: x holds rows × cols values; rounded was sized for them.
            check(
                unsafe {
                    m40_rows_to_grid(
                        g.x,
                        dim(g.rows, "a row count")?,
                        cols,
                        grid as c_int,
                        rounded,
                        g.stream,
                    )
                },
                || "activation rows to their 8-bit grid".to_string(),
            )?;
            rounded.cast_const()
        };
        for first in (0..w.rows).step_by(band_rows) {
            let n = band_rows.min(w.rows - first);
            // SAFETY: rows first..first+n of the weight into the band
            // (n × cols); the product writes columns first..first+n of
            // `out`'s rows (row stride w.rows).
            unsafe {
                check(
                    m40_dequantize_rows(
                        ty,
                        self.weights.matrix(w),
                        cols,
                        first as c_int,
                        n as c_int,
                        band,
                        g.stream,
                    ),
                    || format!("dequantizing a {} band", w.ty.name()),
                )?;
                g.cublas
                    .gemm_xwt(band, n, w.cols, x, g.rows, g.out.add(first), w.rows)?;
            }
        }
        Ok(())
    }

    /// A cuBLAS product on f16 operands with FP32 sums (tensor cores):
    /// F16 weights as they are, quantized types dequantized to f16 a band at a
    /// time, activation rows converted once, on the format's 8-bit grid, with
    /// a power-of-two scale each (see `m40_rows_to_f16`) that the output rows
    /// get back at the end.
    /// The rounding is TF32's (10-bit mantissas); the range is f16's, which
    /// the row scales take care of for activations.
    ///
    /// # Safety
    /// As `product`.
    unsafe fn gemm_f16(&self, arena: &mut Arena, w: &Weight, g: Gemm) -> Result<()> {
        let (ty, cols) = (w.ty.id() as c_int, dim(w.cols, "a matrix width")?);
        let n_rows = dim(g.rows, "a row count")?;
        let direct = w.ty == GgmlType::F16;
        let band_rows = if direct {
            w.rows
        } else {
            band_rows(w.rows, w.cols, 2)
        };
        let band_bytes = if direct { 0 } else { band_rows * w.cols * 2 };
        arena.begin(
            &self.allocator,
            Arena::footprint(&[g.rows * w.cols * 2, g.rows * 4, band_bytes]),
        )?;
        let (x16, scales) = (
            arena.take::<u16>(g.rows * w.cols),
            arena.take::<f32>(g.rows),
        );
        let band = if direct {
            std::ptr::null_mut()
        } else {
            arena.take::<u16>(band_rows * w.cols)
        };
        // SAFETY: x holds rows × cols values; x16 and scales were sized for them.
        check(
            unsafe {
                m40_rows_to_f16(
                    g.x,
                    n_rows,
                    cols,
                    w.ty.activation_scales() as c_int,
                    x16,
                    scales,
                    g.stream,
                )
            },
            || "activation rows to f16".to_string(),
        )?;
        for first in (0..w.rows).step_by(band_rows) {
            let n = band_rows.min(w.rows - first);
            // SAFETY: as in gemm_f32, with f16 bands; an F16 matrix is its
            // own band (rows × cols f16 in the data section).
            unsafe {
                let rows_f16: *const u16 = if direct {
                    self.weights.matrix(w).cast::<u16>().add(first * w.cols)
                } else {
                    check(
                        m40_dequantize_rows_f16(
                            ty,
                            self.weights.matrix(w),
                            cols,
                            first as c_int,
                            n as c_int,
                            band,
                            g.stream,
                        ),
                        || format!("dequantizing a {} band to f16", w.ty.name()),
                    )?;
                    band
                };
                g.cublas.gemm_xwt_f16(
                    rows_f16,
                    n,
                    w.cols,
                    x16,
                    g.rows,
                    g.out.add(first),
                    w.rows,
                )?;
            }
        }
        // SAFETY: out holds rows × w.rows values; scales one per row.
        check(
            unsafe {
                m40_scale_rows(
                    g.out,
                    n_rows,
                    dim(w.rows, "a matrix height")?,
                    scales,
                    g.stream,
                )
            },
            || "restoring row scales".to_string(),
        )
    }

    /// Products of the same `rows` activation rows x, or norm(x) where a
    /// norm is given, with several matrices on the tensor-core route: x is
    /// normalized, put on their format's 8-bit grid and converted to f16
    /// once for all of them (once more for a matrix whose format keeps
    /// another grid).
    ///
    /// # Safety
    /// x holds rows × cols values (every matrix's width) and each product's
    /// out rows × w.rows, in device memory; a bias holds w.rows values.
    pub(super) unsafe fn products_on_tensor_cores(
        &self,
        st: &mut State,
        x: *const f32,
        rows: usize,
        norm: Option<Norm>,
        products: &[TensorCoreProduct],
    ) -> Result<()> {
        let Some(first) = products.first() else {
            return Ok(());
        };
        let cols = dim(first.w.cols, "a matrix width")?;
        let n_x = dim(rows, "a row count")?;
        let sm_count = dim(self.info.multiprocessors, "a multiprocessor count")?;
        let mut splits = Vec::with_capacity(products.len());
        let mut pieces = vec![rows * first.w.cols * 2, rows * 4];
        for p in products {
            assert_eq!(
                p.w.cols, first.w.cols,
                "tensor-core products share their input"
            );
            let ty = p.w.ty.id() as c_int;
            // SAFETY: arithmetic on the kernel's occupancy, found when the
            // backend was created.
            let n = unsafe {
                m40_mmq_splits(ty, dim(p.w.rows, "a matrix height")?, cols, n_x, sm_count)
            };
            if n < 1 {
                return Err(Error::internal(format!(
                    "no tensor-core product of {} weights on this device",
                    p.w.ty.name()
                )));
            }
            if n > 1 {
                pieces.push(n as usize * rows * p.w.rows * 4);
            }
            splits.push(n);
        }
        st.arena.begin(&self.allocator, Arena::footprint(&pieces))?;
        let (x_f16, x_scales) = (
            st.arena.take::<u16>(rows * first.w.cols),
            st.arena.take::<f32>(rows),
        );
        let overlap = c_int::from(self.overlap_launches);
        let (norm_weights, eps) = match norm {
            Some(n) => {
                assert_eq!(n.weight.cols * n.weight.rows, first.w.cols);
                (self.weights.vector(n.weight)?, n.eps)
            }
            None => (std::ptr::null(), 0.0),
        };
        let mut converted = None;
        for (p, &splits) in products.iter().zip(&splits) {
            // Products of formats on the same 8-bit grid share a conversion;
            // the stream runs the products of the last one before the next.
            let grid = p.w.ty.activation_scales();
            if converted != Some(grid) {
                // SAFETY: x holds rows × cols values, a norm cols weights;
                // x_f16 and x_scales were sized for them above.
                check(
                    unsafe {
                        m40_mmq_activations(
                            overlap,
                            x,
                            norm_weights,
                            eps,
                            n_x,
                            cols,
                            grid as c_int,
                            x_f16,
                            x_scales,
                            st.stream.raw(),
                        )
                    },
                    || "activation rows to f16 for tensor cores".to_string(),
                )?;
                converted = Some(grid);
            }
            let partials = if splits > 1 {
                st.arena.take::<f32>(splits as usize * rows * p.w.rows)
            } else {
                std::ptr::null_mut()
            };
            let launch = MmqLaunch {
                w: self.weights.matrix(p.w),
                rows: dim(p.w.rows, "a matrix height")?,
                cols,
                x_f16,
                x_scales,
                n_x,
                bias: match p.bias {
                    Some(b) => {
                        assert_eq!(b.cols * b.rows, p.w.rows);
                        self.weights.vector(b)?
                    }
                    None => std::ptr::null(),
                },
                y: p.out,
                accumulate: c_int::from(p.accumulate),
                splits,
                partials,
                overlap,
                experts: ExpertView::NONE,
            };
            // SAFETY: x_f16 holds the converted rows, out rows × w.rows
            // values (as the caller promises); the partials were sized
            // above; the struct is read before the call returns.
            check(
                unsafe { m40_mmq(p.w.ty.id() as c_int, &launch, st.stream.raw()) },
                || format!("{} matrix × {rows} rows on tensor cores", p.w.ty.name()),
            )?;
        }
        Ok(())
    }

    pub(super) fn gemv_matrix(
        &self,
        w: &Weight,
        bias: Option<&Weight>,
        y: *mut f32,
    ) -> Result<GemvMatrix> {
        Ok(GemvMatrix {
            w: self.weights.matrix(w),
            bias: match bias {
                Some(b) => self.weights.vector(b)?,
                None => std::ptr::null(),
            },
            y,
            rows: dim(w.rows, "a matrix height")?,
            role: ProjectionRole::Plain,
        })
    }

    /// The decode kernel: `matrices` (all of `like`'s type and width) times
    /// `n_x` rows of x, GEMV_MAX_X rows per launch, each launch normalizing
    /// its rows first when `norm` (weights, eps) is given. `input_quantized`:
    /// the previous launch of the same step prepared the same x and norm
    /// (`ProductRoute::Decode`), so the scratch already holds them.
    /// `attention`: where matrices with a query, key or value role put their
    /// results (its row table has a row per x row), or `NONE`.
    ///
    /// # Safety
    /// x holds n_x × like.cols values; each matrix's y holds n_x of its rows
    /// (for GLU epilogues: matrix 0's); a norm's weights hold like.cols values;
    /// the attention inputs name live caches with room for their rows.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn gemv(
        &self,
        st: &State,
        like: &Weight,
        x: *const f32,
        n_x: usize,
        matrices: &[GemvMatrix],
        epilogue: GemvEpilogue,
        norm: Option<(*const f32, f32)>,
        input_quantized: bool,
        attention: &AttentionInputs,
    ) -> Result<()> {
        // Rows the previous operation prepared for this product (decode
        // attention's output) need no prepare launch.
        let prepared_before = norm.is_none()
            && st.prepared_input
                == Some(PreparedInput {
                    x: x as usize,
                    cols: like.cols,
                    rows: n_x,
                    op: st.op,
                    form: self.routes.form(like.ty),
                });
        let input_quantized = input_quantized || prepared_before;
        // The scratch holds one launch's rows.
        assert!(!input_quantized || n_x <= GEMV_MAX_X);
        // Small matrices take a batch's rows as one-row slices of the
        // one-session kernel (`CudaOptions::row_slice_bytes` says why): the
        // slices are the pieces of an expert launch whose experts are all
        // matrix 0, piece t row t. The attention epilogue addresses its
        // caches by launch row, so those launches keep the batched kernel.
        let matrix_bytes =
            matrices.iter().map(|m| m.rows as usize).sum::<usize>() * (like.n_bytes / like.rows);
        let row_slices = attention.rows.is_null() && matrix_bytes <= self.row_slice_bytes;
        for first in (0..n_x).step_by(GEMV_MAX_X) {
            let launch_rows = GEMV_MAX_X.min(n_x - first);
            let sliced = row_slices && launch_rows > 1;
            let mut m = [GemvMatrix::NONE; 3];
            for (slot, matrix) in m.iter_mut().zip(matrices) {
                *slot = GemvMatrix {
                    // SAFETY: row `first` of the matrix's output.
                    y: unsafe { matrix.y.add(first * matrix.rows as usize) },
                    ..*matrix
                };
            }
            let launch = GemvLaunch {
                m,
                n_matrices: matrices.len() as c_int,
                cols: dim(like.cols, "a matrix width")?,
                // SAFETY: row `first` of x.
                x: unsafe { x.add(first * like.cols) },
                n_x: if sliced { 1 } else { launch_rows as c_int },
                epilogue,
                norm: norm.map_or(std::ptr::null(), |n| n.0),
                eps: norm.map_or(0.0, |n| n.1),
                sm_count: self.info.multiprocessors as c_int,
                // The scratch is device memory that only kernels on this
                // state's stream touch, one launch after another.
                x_q8: st
                    .activations_q8
                    .as_ref()
                    .map_or(std::ptr::null_mut(), |q| q.as_ptr().cast_mut()),
                x_quantized: c_int::from(input_quantized),
                overlap: c_int::from(self.overlap_launches),
                attention: AttentionInputs {
                    rows: if attention.rows.is_null() {
                        attention.rows
                    } else {
                        // SAFETY: the table has a row per x row.
                        unsafe { attention.rows.add(first) }
                    },
                    ..*attention
                },
                experts: if sliced {
                    ExpertView {
                        work: self.row_pieces.as_ptr(),
                        expert_bytes: 0,
                        n_work: launch_rows as c_int,
                        x_shared: 0,
                        x_rows: launch_rows as c_int,
                        ..ExpertView::NONE
                    }
                } else {
                    ExpertView::NONE
                },
            };
            // SAFETY: the launch names live device memory (see above).
            unsafe { self.launch_gemv(st, like.ty, &launch, "matrix × vector")? };
        }
        Ok(())
    }

    /// One `m40_gemv` launch of matrices of type `ty`; `what` names the
    /// product in an error.
    ///
    /// # Safety
    /// The launch names live device memory of the sizes it states.
    pub(super) unsafe fn launch_gemv(
        &self,
        st: &State,
        ty: GgmlType,
        launch: &GemvLaunch,
        what: &str,
    ) -> Result<()> {
        // SAFETY: as the caller promises; the struct is read before the
        // call returns.
        check(
            unsafe {
                m40_gemv(
                    ty.id() as c_int,
                    launch,
                    self.gemv_rows_per_warp,
                    st.stream.raw(),
                )
            },
            || format!("{} {what}", ty.name()),
        )
    }

    /// norm(x) times each product on the decode route (`routes`, one per
    /// product, each `Decode`): the kernel normalizes x itself. Consecutive
    /// products of one format share a launch (Q, K and V usually do); on the
    /// prepared route x is prepared by the first launch only. With
    /// `attention`, the products are a layer's queries, keys and values, and
    /// their epilogue does the attention-input step: RoPE, then the keys and
    /// values into the caches (`attention` says where).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn decode_products(
        &self,
        st: &State,
        x: &DeviceBuffer,
        norm: Norm,
        rows: usize,
        products: &mut [Product<DeviceBuffer>],
        routes: &[ProductRoute],
        attention: Option<&AttentionInputs>,
    ) -> Result<()> {
        assert!(rows <= GEMV_MAX_X && (attention.is_none() || products.len() == 3));
        assert!(x.len() >= rows * norm.weight.cols * norm.weight.rows);
        assert_eq!(routes.len(), products.len());
        let roles = [
            ProjectionRole::Queries,
            ProjectionRole::Keys,
            ProjectionRole::Values,
        ];
        let fused_norm = Some((self.weights.vector(norm.weight)?, norm.eps));
        // The form x was last prepared in, if it was: a launch of a format
        // that reads another prepares it again.
        let mut quantized: Option<PreparedForm> = None;
        let mut first = 0;
        while first < products.len() {
            let ty = products[first].w.ty;
            let ProductRoute::Decode { prepared } = routes[first] else {
                return Err(Error::internal(
                    "a decode launch of a product not routed there",
                ));
            };
            let n = products[first..]
                .iter()
                .take(3)
                .take_while(|p| p.w.ty == ty)
                .count();
            let mut matrices = [GemvMatrix::NONE; 3];
            for (i, m) in (first..first + n).zip(matrices.iter_mut()) {
                let p = &mut products[i];
                *m = GemvMatrix {
                    role: attention.map_or(ProjectionRole::Plain, |_| roles[i]),
                    ..self.gemv_matrix(p.w, p.bias, p.out.as_mut_ptr())?
                };
            }
            // SAFETY: the caller checked the sizes; the attention inputs are
            // the caller's.
            unsafe {
                self.gemv(
                    st,
                    products[first].w,
                    x.as_ptr(),
                    rows,
                    &matrices[..n],
                    GemvEpilogue::Store,
                    fused_norm,
                    prepared && quantized == Some(self.routes.form(ty)),
                    attention.unwrap_or(&AttentionInputs::NONE),
                )?
            };
            if prepared {
                quantized = Some(self.routes.form(ty));
            }
            first += n;
        }
        Ok(())
    }

    /// out = x / rms(x) · weight for `n_groups` groups of the weight's width.
    ///
    /// # Safety
    /// x and out hold n_groups groups (they may be the same memory).
    pub(super) unsafe fn rms_norm_into(
        &self,
        st: &State,
        x: *const f32,
        weight: &Weight,
        eps: f32,
        n_groups: usize,
        out: *mut f32,
    ) -> Result<()> {
        let group = weight.cols * weight.rows;
        check(
            // SAFETY: as the caller promises.
            unsafe {
                m40_rms_norm(
                    x,
                    self.weights.vector(weight)?,
                    dim(group, "a norm width")?,
                    dim(n_groups, "a row count")?,
                    eps,
                    out,
                    st.stream.raw(),
                )
            },
            || "RMS norm".to_string(),
        )
    }

    /// x[r] += bias for `rows` rows.
    ///
    /// # Safety
    /// x is device memory of rows × the bias's width values.
    pub(super) unsafe fn add_bias_into(
        &self,
        st: &State,
        x: *mut f32,
        bias: &Weight,
        rows: usize,
    ) -> Result<()> {
        let width = bias.cols * bias.rows;
        // SAFETY: as the caller promises.
        check(
            unsafe {
                m40_add(
                    x,
                    self.weights.vector(bias)?,
                    rows * width,
                    width,
                    st.stream.raw(),
                )
            },
            || "bias add".to_string(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::band_rows;

    #[test]
    fn bands_are_whole_multiples_of_128_rows_where_they_can_be() {
        // 64 MiB of f16 rows 5,120 wide hold 6,553 rows: 6,528 are taken.
        assert_eq!(band_rows(17_408, 5_120, 2), 6_528);
        assert_eq!(band_rows(17_408, 5_120, 2) % 128, 0);
        // One band when the matrix fits.
        assert_eq!(band_rows(5_120, 6_144, 2), 5_120);
        // Rows too wide for 128 of them in a band: as many as fit, at least one.
        assert_eq!(band_rows(1_000, 1 << 20, 4), 16);
        assert_eq!(band_rows(1_000, 1 << 27, 2), 1);
    }
}
