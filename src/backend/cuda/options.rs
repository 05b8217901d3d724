//! What a host may ask of the CUDA backend, and the environment variables
//! a model load reads them from.

/// The CUDA backend's options. Every one defaults to the fast path; the
/// switches exist to step around a broken library or driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CudaOptions {
    /// Products of many rows (prompt chunks) through cuBLAS when it can be
    /// loaded; false keeps them on the library's own kernels.
    pub use_cublas: bool,
    /// Weight rows per warp of the one-session decode kernel, 2 or 4 (None:
    /// each format's own choice, whichever measured faster on the H100: 4
    /// for Q6_K on the integer path, 2 otherwise). Tests set it to cover
    /// both.
    pub gemv_rows_per_warp: Option<u32>,
    /// Decode products (up to 8 rows) of the quantized formats with a
    /// prepared path on activations prepared by a launch of their own: 8-bit
    /// with dp4a where the device runs this build's sm_61+ code, scaled FP32
    /// values with masked codes (the M40's path) where it runs sm_52 code or
    /// the compute_52 PTX; false keeps them on the plain FP32 path (tests
    /// set it to cover that path). Products of 9–64 rows take the f16
    /// tensor cores where the GPU has them (sm_80+) either way.
    pub integer_products: bool,
    /// Decode kernels that start while the stream's previous kernel
    /// finishes (programmatic dependent launch), on GPUs that have it (sm_90
    /// and newer) in builds that carry sm_90 code; false launches each
    /// kernel after the previous one has drained.
    pub overlap_launches: bool,
    /// Decode steps recorded once as a CUDA graph and replayed; false
    /// launches every kernel of every step.
    pub graph_decode: bool,
    /// A CPU stage of a split model runs its products of many rows (prompt
    /// chunks) on the split's first GPU, copying their weights over for
    /// each batch; false keeps them on the CPU.
    pub offload_cpu_products: bool,
}

impl Default for CudaOptions {
    fn default() -> CudaOptions {
        CudaOptions {
            use_cublas: true,
            gemv_rows_per_warp: None,
            integer_products: true,
            overlap_launches: true,
            graph_decode: true,
            offload_cpu_products: true,
        }
    }
}

impl CudaOptions {
    /// The defaults, less what the environment switches off. Each variable
    /// set to `0` turns its option off; any other value, or none, leaves it
    /// on.
    ///
    /// | Variable             | Default | Set it to `0` when |
    /// |----------------------|---------|--------------------|
    /// | `M40_CUBLAS`         | on      | cuBLAS is missing, broken or mismatched with the driver: prompts then run on the library's own kernels (slower on long prompts, same results within rounding) |
    /// | `M40_CUDA_GRAPH`     | on      | the driver fails or misbehaves recording or replaying CUDA graphs: every decode kernel is launched one by one (slower on small models) |
    /// | `M40_LAUNCH_OVERLAP` | on      | the driver misbehaves with programmatic dependent launch (sm_90+): each decode kernel waits for the previous one to drain |
    /// | `M40_CPU_OFFLOAD`    | on      | the GPU of a split model has no memory to spare for the layers' weights of a CPU stage's batch, or its link is slow: the CPU's prompt products stay on the CPU |
    pub fn from_env() -> CudaOptions {
        let on = |name: &str| std::env::var(name).map_or(true, |v| v != "0");
        CudaOptions {
            use_cublas: on("M40_CUBLAS"),
            overlap_launches: on("M40_LAUNCH_OVERLAP"),
            graph_decode: on("M40_CUDA_GRAPH"),
            offload_cpu_products: on("M40_CPU_OFFLOAD"),
            ..CudaOptions::default()
        }
    }
}
