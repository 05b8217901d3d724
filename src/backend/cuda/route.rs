//! Which kernel takes each matrix product. [`Routes::route`] decides it once
//! for a product's weight format and row count, from what the device, the
//! build and the loaded libraries offer for the model's formats; every
//! operation and fused step launches its products on the route it gives
//! (`products`, `ops`), and the fused steps take their fused forms only
//! where the routes allow them.

use std::ffi::c_int;

use super::cublas::Cublas;
use super::kernels::{
    m40_gemv_dp4a_code, m40_gemv_prepared_path, m40_mmq_expert_rows, m40_mmq_prepare, PreparedForm,
    GEMV_MAX_X,
};
use super::options::CudaOptions;
use super::runtime::DeviceInfo;
use super::weights::matrices;
use crate::gguf::GgufFile;
use crate::quant::GgmlType;

/// Products of at least this many rows go through cuBLAS when it is loaded
/// (and the tensor cores do not take them): fewer rows are a few launches
/// of the decode kernel.
pub(super) const GEMM_MIN_ROWS: usize = 16;
/// Most rows a product takes on the quantized-weight tensor-core kernel
/// while cuBLAS is loaded: past them cuBLAS's f16 products are faster
/// (measured on the H100).
const TENSOR_CORE_MAX_ROWS: usize = 64;

/// The kernel a matrix product of some rows runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ProductRoute {
    /// One launch of the decode kernel (`m40_gemv`) takes every row: at most
    /// GEMV_MAX_X, a decode batch. The kernel normalizes its rows itself, so
    /// a fused step's norm goes into the launch. `prepared`: the launch
    /// prepares its rows in scratch first, which the launches of one
    /// step's products share: the format has the kernel's integer path and
    /// this GPU runs the build's dp4a code (8-bit codes), or the scaled
    /// path that the M40's code runs (scaled values), and the host did not
    /// turn them off.
    Decode { prepared: bool },
    /// The decode kernel, GEMV_MAX_X rows a launch, on rows normalized
    /// beforehand: more rows than one launch takes, which neither the
    /// tensor cores (the format or GPU has no such kernel) nor cuBLAS
    /// (fewer than GEMM_MIN_ROWS rows, or none loaded) take.
    DecodeLaunches,
    /// f16 tensor cores straight from the quantized weights (`m40_mmq`,
    /// sm_80 and newer): more rows than one decode launch takes, up to
    /// TENSOR_CORE_MAX_ROWS while cuBLAS is loaded (any number without it).
    /// The rows are converted to f16 once for the products that share
    /// them, and a fused step's norm goes into that conversion.
    TensorCores,
    /// cuBLAS, on rows normalized beforehand: at least GEMM_MIN_ROWS rows
    /// that the tensor cores do not take. `f16`: on f16 operands (tensor
    /// cores, Volta and newer, with a cuBLAS that has them) for weights
    /// whose values fit f16's range; else in FP32 (TF32 on Ampere and newer)
    /// on weights dequantized to f32.
    Cublas { f16: bool },
}

/// The kernels a mixture of experts' products run on: every expert's
/// product of a step is one launch over work pieces of expert-sorted rows
/// (see cuda/moe.cu).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ExpertRoute {
    /// The decode kernel, pieces of at most `piece_rows` rows; `prepared`
    /// (for the gate and up products, then for down): on prepared
    /// activations (as `ProductRoute::Decode`).
    /// `piece_rows` 1: the one-row kernel, a piece per (row, expert): one
    /// session, and batches of up to GEMV_MAX_X rows of small experts
    /// where the tensor cores would otherwise take them (their experts
    /// mostly have one row each, which a 16-row tile computes at the cost
    /// of 16; two rows sharing an expert read its weights twice, the second
    /// time mostly from L2: `CudaOptions::one_row_expert_bytes`).
    /// `piece_rows` GEMV_MAX_X: the batched kernel, for batches of large
    /// experts and where no tensor cores take them (the M40), which reads
    /// an expert's weights once for its rows and decodes them once, the
    /// M40's scarce resource.
    Decode {
        prepared: [bool; 2],
        piece_rows: usize,
    },
    /// The tensor-core kernel, pieces of `piece_rows` rows (its tile):
    /// batches of more than GEMV_MAX_X rows, where the gate, up and down
    /// formats all have the kernel with one tile. Their experts take a few
    /// rows each, which the batched decode kernel would take a piece per
    /// expert at a time, several times slower than the tensor cores' read
    /// of each expert's weights (measured on the H100).
    TensorCores { piece_rows: usize },
}

/// What the routes depend on, fixed when the backend is created.
pub(super) struct Routes {
    /// The model's matrix formats whose decode products take a prepared
    /// route (8-bit activations and dp4a, the M40's scaled values, or grid
    /// values for the FP32 kernel).
    prepared_formats: Vec<GgmlType>,
    /// Whether the device runs this build's dp4a code, which decides each
    /// format's `PreparedForm`.
    dp4a: bool,
    /// The model's matrix formats that have a tensor-core kernel on this
    /// device (`m40_mmq`), and the rows of its expert work pieces for
    /// batches of up to 16 rows and of more.
    tensor_core_formats: Vec<GgmlType>,
    expert_piece_rows: Vec<(GgmlType, [usize; 2])>,
    has_cublas: bool,
    /// cuBLAS products on f16 operands (GPUs with f16 tensor cores: Volta,
    /// sm_70, and newer, with cuBLAS 11 or newer).
    prefill_in_f16: bool,
    /// The least bytes of products sharing their rows that a full decode
    /// batch takes on the tensor cores (`CudaOptions::batch_tensor_core_bytes`).
    batch_tensor_core_bytes: usize,
    /// The most bytes of an expert whose decode batches take one-row pieces
    /// (`CudaOptions::one_row_expert_bytes`).
    one_row_expert_bytes: usize,
}

impl Routes {
    /// The routes for the matrices of `file` on the current device, with
    /// `cublas` where it was loaded, as `options` allow (its prepared routes,
    /// `integer_products`, and its `batch_tensor_core_bytes`). Prepares the
    /// tensor-core kernels of the model's formats.
    pub fn new(
        file: &GgufFile,
        info: &DeviceInfo,
        cublas: Option<&Cublas>,
        options: &CudaOptions,
    ) -> Routes {
        let mut prepared_formats = Vec::new();
        if options.integer_products {
            for t in matrices(file) {
                if !prepared_formats.contains(&t.ggml_type) && prepared_path(t.ggml_type) {
                    prepared_formats.push(t.ggml_type);
                }
            }
        }
        let mut tensor_core_formats = Vec::new();
        for t in matrices(file) {
            // SAFETY: queries and sets the current device's kernel attributes.
            if !tensor_core_formats.contains(&t.ggml_type)
                && unsafe { m40_mmq_prepare(t.ggml_type.id() as c_int) } == 1
            {
                tensor_core_formats.push(t.ggml_type);
            }
        }
        let expert_piece_rows = tensor_core_formats
            .iter()
            .map(|&t| {
                // SAFETY: queries of the current device's kernel attributes.
                let tile = |rows| unsafe { m40_mmq_expert_rows(t.id() as c_int, rows) }.max(0);
                (t, [tile(16) as usize, tile(32) as usize])
            })
            .filter(|&(_, rows)| rows[0] > 0 && rows[1] > 0)
            .collect();
        Routes {
            prepared_formats,
            // SAFETY: a query of the current device's kernel attributes.
            dp4a: unsafe { m40_gemv_dp4a_code() } == 1,
            tensor_core_formats,
            expert_piece_rows,
            has_cublas: cublas.is_some(),
            prefill_in_f16: info.compute_capability.0 >= 7
                && cublas.is_some_and(|c| c.has_f16_products()),
            batch_tensor_core_bytes: options.batch_tensor_core_bytes,
            one_row_expert_bytes: options.one_row_expert_bytes,
        }
    }

    /// The routes of products that read the same `rows` rows, each given by
    /// its matrix's format and bytes: a full decode batch (GEMV_MAX_X rows)
    /// takes the tensor cores for all of them where every format has the
    /// kernel and the matrices total at least `batch_tensor_core_bytes` (one
    /// conversion of the rows serves them all); else each takes `route`.
    pub fn shared_rows_routes(
        &self,
        matrices: impl Iterator<Item = (GgmlType, usize)> + Clone,
        rows: usize,
    ) -> Vec<ProductRoute> {
        let total: usize = matrices.clone().map(|(_, bytes)| bytes).sum();
        let tensor_cores = rows == GEMV_MAX_X
            && matrices.clone().next().is_some()
            && total >= self.batch_tensor_core_bytes
            && matrices
                .clone()
                .all(|(ty, _)| self.tensor_core_formats.contains(&ty));
        matrices
            .map(|(ty, _)| {
                if tensor_cores {
                    ProductRoute::TensorCores
                } else {
                    self.route(ty, rows)
                }
            })
            .collect()
    }

    /// The route of a product of `rows` activation rows with a matrix of
    /// format `ty`.
    pub fn route(&self, ty: GgmlType, rows: usize) -> ProductRoute {
        if rows <= GEMV_MAX_X {
            return ProductRoute::Decode {
                prepared: self.prepared_formats.contains(&ty),
            };
        }
        if (rows <= TENSOR_CORE_MAX_ROWS || !self.has_cublas)
            && self.tensor_core_formats.contains(&ty)
        {
            return ProductRoute::TensorCores;
        }
        if self.has_cublas && rows >= GEMM_MIN_ROWS {
            // F32 and BF16 values may lie outside f16's range.
            let f16_weights = !matches!(ty, GgmlType::F32 | GgmlType::Bf16);
            return ProductRoute::Cublas {
                f16: f16_weights && self.prefill_in_f16,
            };
        }
        ProductRoute::DecodeLaunches
    }

    /// The route of a mixture of experts' products for `rows` rows, the
    /// experts' gate and up matrices of format `gate_up`, down of `down`,
    /// an expert's three matrices `expert_bytes` bytes.
    pub fn expert_route(
        &self,
        gate_up: GgmlType,
        down: GgmlType,
        rows: usize,
        expert_bytes: usize,
    ) -> ExpertRoute {
        let piece_rows = |ty| {
            self.expert_piece_rows
                .iter()
                .find(|&&(t, _)| t == ty)
                .map(|&(_, tiles)| tiles[usize::from(rows > 16)])
        };
        let prepared = [gate_up, down].map(|t| self.prepared_formats.contains(&t));
        if rows > 1 {
            if let (Some(a), Some(b)) = (piece_rows(gate_up), piece_rows(down)) {
                if a == b {
                    if rows <= GEMV_MAX_X {
                        let one_row = expert_bytes <= self.one_row_expert_bytes;
                        return ExpertRoute::Decode {
                            prepared,
                            piece_rows: if one_row { 1 } else { GEMV_MAX_X },
                        };
                    }
                    return ExpertRoute::TensorCores { piece_rows: a };
                }
            }
        }
        ExpertRoute::Decode {
            prepared,
            piece_rows: if rows == 1 { 1 } else { GEMV_MAX_X },
        }
    }

    /// The form in which decode products of `ty` read prepared rows.
    pub fn form(&self, ty: GgmlType) -> PreparedForm {
        PreparedForm::of(ty, self.dp4a)
    }

    /// Whether any of the model's formats takes a prepared route (and the
    /// decode kernel needs its scratch).
    pub fn any_prepared(&self) -> bool {
        !self.prepared_formats.is_empty()
    }
}

/// Whether the decode kernel prepares the activations of `ty`'s products
/// on the current device (the integer or the scaled path).
fn prepared_path(ty: GgmlType) -> bool {
    // SAFETY: a query of the current device's kernel attributes.
    unsafe { m40_gemv_prepared_path(ty.id() as c_int) == 1 }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routes(has_cublas: bool) -> Routes {
        Routes {
            prepared_formats: vec![GgmlType::Q4K],
            dp4a: true,
            tensor_core_formats: vec![GgmlType::Q4K, GgmlType::Q8_0],
            expert_piece_rows: vec![(GgmlType::Q4K, [16, 32]), (GgmlType::Q8_0, [16, 32])],
            has_cublas,
            prefill_in_f16: true,
            batch_tensor_core_bytes: 16 << 20,
            one_row_expert_bytes: 8 << 20,
        }
    }

    #[test]
    fn decode_batches_take_one_decode_launch_prepared_where_the_format_has_it() {
        let r = routes(true);
        assert_eq!(
            r.route(GgmlType::Q4K, 1),
            ProductRoute::Decode { prepared: true }
        );
        assert_eq!(
            r.route(GgmlType::Q8_0, 8),
            ProductRoute::Decode { prepared: false }
        );
    }

    #[test]
    fn tensor_cores_take_9_to_64_rows_with_cublas_and_any_more_without() {
        let r = routes(true);
        assert_eq!(r.route(GgmlType::Q4K, 9), ProductRoute::TensorCores);
        assert_eq!(r.route(GgmlType::Q4K, 64), ProductRoute::TensorCores);
        assert_eq!(
            r.route(GgmlType::Q4K, 65),
            ProductRoute::Cublas { f16: true }
        );
        assert_eq!(
            routes(false).route(GgmlType::Q4K, 512),
            ProductRoute::TensorCores
        );
    }

    #[test]
    fn full_decode_batches_take_tensor_cores_for_large_products_sharing_their_rows() {
        let r = routes(true);
        let big = 16 << 20;
        let decode = ProductRoute::Decode { prepared: true };
        // Together past the bound: all of them, at 8 rows only.
        assert_eq!(
            r.shared_rows_routes(
                [(GgmlType::Q4K, big - 10), (GgmlType::Q4K, 10)].into_iter(),
                GEMV_MAX_X
            ),
            [ProductRoute::TensorCores; 2]
        );
        assert_eq!(
            r.shared_rows_routes([(GgmlType::Q4K, big)].into_iter(), GEMV_MAX_X - 1),
            [decode]
        );
        // Short of it, or a format without the kernel: each its own route.
        assert_eq!(
            r.shared_rows_routes(
                [(GgmlType::Q4K, big - 11), (GgmlType::Q4K, 10)].into_iter(),
                GEMV_MAX_X
            ),
            [decode; 2]
        );
        assert_eq!(
            r.shared_rows_routes(
                [(GgmlType::Q4K, big), (GgmlType::Q6K, 10)].into_iter(),
                GEMV_MAX_X
            ),
            [decode, ProductRoute::Decode { prepared: false }]
        );
    }

    #[test]
    fn small_experts_take_one_row_pieces_up_to_a_decode_batch_and_tensor_cores_past_it() {
        let r = routes(true);
        assert_eq!(
            r.expert_route(GgmlType::Q4K, GgmlType::Q8_0, 1, 3 << 20),
            ExpertRoute::Decode {
                prepared: [true, false],
                piece_rows: 1
            }
        );
        assert_eq!(
            r.expert_route(GgmlType::Q4K, GgmlType::Q8_0, GEMV_MAX_X, 3 << 20),
            ExpertRoute::Decode {
                prepared: [true, false],
                piece_rows: 1
            }
        );
        assert_eq!(
            r.expert_route(GgmlType::Q4K, GgmlType::Q8_0, GEMV_MAX_X + 1, 3 << 20),
            ExpertRoute::TensorCores { piece_rows: 16 }
        );
        assert_eq!(
            r.expert_route(GgmlType::Q4K, GgmlType::Q8_0, 17, 3 << 20),
            ExpertRoute::TensorCores { piece_rows: 32 }
        );
        // Large experts: the batched decode kernel up to a decode batch,
        // one piece an expert for its rows, whose weights it reads once.
        assert_eq!(
            r.expert_route(GgmlType::Q4K, GgmlType::Q8_0, 1, 13 << 20),
            ExpertRoute::Decode {
                prepared: [true, false],
                piece_rows: 1
            }
        );
        assert_eq!(
            r.expert_route(GgmlType::Q4K, GgmlType::Q8_0, GEMV_MAX_X, 13 << 20),
            ExpertRoute::Decode {
                prepared: [true, false],
                piece_rows: GEMV_MAX_X
            }
        );
        assert_eq!(
            r.expert_route(GgmlType::Q4K, GgmlType::Q8_0, GEMV_MAX_X + 1, 13 << 20),
            ExpertRoute::TensorCores { piece_rows: 16 }
        );
        // Without tensor cores for every format: the batched decode kernel.
        assert_eq!(
            r.expert_route(GgmlType::Q4K, GgmlType::Q6K, 3, 3 << 20),
            ExpertRoute::Decode {
                prepared: [true, false],
                piece_rows: GEMV_MAX_X
            }
        );
        assert_eq!(
            r.expert_route(GgmlType::Q4K, GgmlType::Q6K, 512, 3 << 20),
            ExpertRoute::Decode {
                prepared: [true, false],
                piece_rows: GEMV_MAX_X
            }
        );
    }

    #[test]
    fn other_formats_take_cublas_from_16_rows_and_decode_launches_below() {
        let r = routes(true);
        assert_eq!(r.route(GgmlType::Q6K, 15), ProductRoute::DecodeLaunches);
        assert_eq!(
            r.route(GgmlType::Q6K, 16),
            ProductRoute::Cublas { f16: true }
        );
        assert_eq!(
            r.route(GgmlType::F32, 16),
            ProductRoute::Cublas { f16: false }
        );
        assert_eq!(
            routes(false).route(GgmlType::Q6K, 512),
            ProductRoute::DecodeLaunches
        );
    }
}
