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
    /// Decode products (up to 8 rows) of the quantized formats on
    /// activations prepared by a launch of their own, on the 8-bit grid of
    /// llama.cpp's CPU: 8-bit codes with dp4a where the device runs this
    /// build's sm_61+ code and the format has an integer kernel, scaled FP32
    /// values with masked codes (the M40's path) where it runs sm_52 code or
    /// the compute_52 PTX and the format has a scaled kernel, else grid
    /// values for the FP32 kernel; false keeps them on the plain FP32 path
    /// on unrounded activations (tests set it to cover that path). Products
    /// of 9–64 rows, and a full batch's large ones
    /// (`batch_tensor_core_bytes`), take the f16 tensor cores where the GPU
    /// has them (sm_80+) either way.
    pub integer_products: bool,
    /// A decode batch of 8 rows (the decode kernel's most, GEMV_MAX_X)
    /// takes the f16 tensor cores (sm_80+) for products that read the same
    /// rows (a layer's Q, K and V; a gated FFN's gate and up; …) where
    /// their matrices total at least this many bytes. The decode kernel
    /// multiplies each weight by 8 rows of activations from its L1 cache,
    /// well under the memory's speed; the tensor cores read each weight once
    /// for a 16-row tile, after a conversion of the rows that the products
    /// share. On the H200, at 8 sessions, they took qwen35-27b from 1,285 to
    /// 1,473 tok/s (matrices of 18–50 MB) and qwen35-35b-a3b's 248,320-row
    /// output from 0.35 to 0.19 ms a step, but made its 5–14 MB groups
    /// slower, and fewer rows slower everywhere. Tests set 0 to cover the
    /// path.
    pub batch_tensor_core_bytes: usize,
    /// A decode batch's launch (2 to 8 rows) whose matrices total at most
    /// this many bytes runs each row as a slice of one launch of the
    /// one-session kernel. A small matrix gives the batched kernel too few
    /// row groups to keep the GPU busy, and each of its warps walks its rows
    /// one activation row after another; the slices read the matrix once a
    /// row, from L2. A mixture of experts' router (256 × 2048 F32) took 20
    /// µs a step at 8 rows and its shared expert's gate (1 × 2048) 18 µs on
    /// the H200; as slices qwen35-35b-a3b's 8 sessions ran 11% faster. Tests
    /// set it to cover both forms.
    pub row_slice_bytes: usize,
    /// A decode batch's expert products (2 to 8 rows, on GPUs with tensor
    /// cores for the experts' formats) take a one-row piece per (row,
    /// expert) where an expert's gate, up and down matrices total at most
    /// this many bytes, and the batched decode kernel, a piece per expert
    /// for all its rows, where they total more. A one-row piece reads its
    /// expert again for each row that chose it, mostly from L2 for small
    /// experts: 8 sessions of qwen3-30b-a3b (2.6 MB experts) ran 3% faster
    /// on the H100 in one-row pieces. gpt-oss-20b's 13.2 MB experts ran
    /// 6.17 ms a step in one-row pieces and 2.99 ms batched on the H200 (8
    /// sessions: 873 → 1,169 tok/s). Tests set 0 to cover the batched form.
    pub one_row_expert_bytes: usize,
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
            batch_tensor_core_bytes: 16 << 20,
            row_slice_bytes: 4 << 20,
            one_row_expert_bytes: 8 << 20,
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
