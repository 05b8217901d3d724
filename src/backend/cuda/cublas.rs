//! cuBLAS, loaded at run time: the library links no CUDA library but the
//! static runtime, so one build runs with whichever cuBLAS the machine has
//! (CUDA 13, 12 or 11), or without one (the backend's own kernels then do
//! every matrix product).

use std::ffi::{c_int, c_void};
use std::sync::OnceLock;

use super::runtime::Stream;
use crate::error::{Error, Result};

type Handle = *mut c_void;
const CUBLAS_STATUS_SUCCESS: c_int = 0;
const CUBLAS_OP_N: c_int = 0;
const CUBLAS_OP_T: c_int = 1;
/// cublasMath_t: FP32 products on TF32 tensor cores (Ampere and newer; other
/// GPUs keep plain FP32).
const CUBLAS_TF32_TENSOR_OP_MATH: c_int = 3;
/// cublasMath_t: plain FP32 products.
const CUBLAS_DEFAULT_MATH: c_int = 0;

/// cublasSgemm_v2(handle, transa, transb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc).
type SgemmFn = unsafe extern "C" fn(
    Handle,
    c_int,
    c_int,
    c_int,
    c_int,
    c_int,
    *const f32,
    *const f32,
    c_int,
    *const f32,
    c_int,
    *const f32,
    *mut f32,
    c_int,
) -> c_int;

/// cublasGemmEx(handle, transa, transb, m, n, k, alpha, A, Atype, lda, B,
/// Btype, ldb, beta, C, Ctype, ldc, computeType, algo).
type GemmExFn = unsafe extern "C" fn(
    Handle,
    c_int,
    c_int,
    c_int,
    c_int,
    c_int,
    *const c_void,
    *const c_void,
    c_int,
    c_int,
    *const c_void,
    c_int,
    c_int,
    *const c_void,
    *mut c_void,
    c_int,
    c_int,
    c_int,
    c_int,
) -> c_int;
/// cudaDataType_t values.
const CUDA_R_32F: c_int = 0;
const CUDA_R_16F: c_int = 2;
/// cublasComputeType_t (CUDA 11 and newer): FP32 sums.
const CUBLAS_COMPUTE_32F: c_int = 68;
const CUBLAS_GEMM_DEFAULT: c_int = -1;

struct Api {
    /// Which library was found.
    name: &'static str,
    create: unsafe extern "C" fn(*mut Handle) -> c_int,
    destroy: unsafe extern "C" fn(Handle) -> c_int,
    set_stream: unsafe extern "C" fn(Handle, Stream) -> c_int,
    set_math_mode: unsafe extern "C" fn(Handle, c_int) -> c_int,
    sgemm: SgemmFn,
    gemm_ex: GemmExFn,
    get_version: unsafe extern "C" fn(Handle, *mut c_int) -> c_int,
}

const LIBRARIES: [&str; 4] = [
    "libcublas.so.13",
    "libcublas.so.12",
    "libcublas.so.11",
    "libcublas.so",
];

fn api() -> Option<&'static Api> {
    static API: OnceLock<Option<Api>> = OnceLock::new();
    API.get_or_init(load).as_ref()
}

fn load() -> Option<Api> {
    for name in LIBRARIES {
        let c_name = format!("{name}\0");
        // SAFETY: a NUL-terminated name; the handle is kept for the process's
        // life (the symbols below point into it).
        let lib =
            unsafe { libc::dlopen(c_name.as_ptr().cast(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if lib.is_null() {
            continue;
        }
        let symbol = |s: &str| {
            let c = format!("{s}\0");
            // SAFETY: a NUL-terminated symbol name in a live handle.
            let p = unsafe { libc::dlsym(lib, c.as_ptr().cast()) };
            (!p.is_null()).then_some(p)
        };
        let (
            Some(create),
            Some(destroy),
            Some(set_stream),
            Some(set_math_mode),
            Some(sgemm),
            Some(gemm_ex),
            Some(get_version),
        ) = (
            symbol("cublasCreate_v2"),
            symbol("cublasDestroy_v2"),
            symbol("cublasSetStream_v2"),
            symbol("cublasSetMathMode"),
            symbol("cublasSgemm_v2"),
            symbol("cublasGemmEx"),
            symbol("cublasGetVersion_v2"),
        )
        else {
            continue;
        };
        // SAFETY: these are the documented signatures of the cuBLAS v2 API,
        // unchanged from CUDA 11 to 13 (each field's type is the symbol's).
        return Some(unsafe {
            Api {
                name,
                create: as_fn(create),
                destroy: as_fn(destroy),
                set_stream: as_fn(set_stream),
                set_math_mode: as_fn(set_math_mode),
                sgemm: as_fn(sgemm),
                gemm_ex: as_fn(gemm_ex),
                get_version: as_fn(get_version),
            }
        });
    }
    None
}

/// A symbol's address as the function pointer type `F`.
///
/// # Safety
/// `F` is a function pointer type matching the symbol's signature.
unsafe fn as_fn<F: Copy>(symbol: *mut c_void) -> F {
    assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: same size (checked); the caller promises the type.
    unsafe { std::mem::transmute_copy(&symbol) }
}

fn check(status: c_int, what: &str) -> Result<()> {
    if status == CUBLAS_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(Error::new(
            crate::error::ErrorKind::Backend,
            format!("cuBLAS {what} failed with status {status}"),
        ))
    }
}

/// A cuBLAS handle bound to one stream of the current device.
pub struct Cublas {
    api: &'static Api,
    handle: Handle,
    /// cuBLAS 11 or newer: `cublasGemmEx` takes a cublasComputeType_t
    /// (an older one, found as plain `libcublas.so`, takes a data type).
    compute_types: bool,
}

// SAFETY: a handle may move between host threads; the backend uses it behind
// its mutex, one thread at a time.
unsafe impl Send for Cublas {}

impl Cublas {
    /// A handle on `stream`, or None when no cuBLAS library can be loaded.
    /// FP32 products run on TF32 tensor cores where the GPU and the library
    /// have them: inputs rounded to 10-bit mantissas (as llama.cpp's f16
    /// products round them), sums in FP32.
    pub fn new(stream: Stream) -> Result<Option<Cublas>> {
        let Some(api) = api() else {
            return Ok(None);
        };
        let mut handle = std::ptr::null_mut();
        // SAFETY: writes one handle.
        check(unsafe { (api.create)(&mut handle) }, "initialization")?;
        let mut cublas = Cublas {
            api,
            handle,
            compute_types: false,
        };
        let mut version = 0;
        // SAFETY: a live handle; writes one int.
        check(
            unsafe { (api.get_version)(handle, &mut version) },
            "version query",
        )?;
        cublas.compute_types = version >= 11000;
        // SAFETY: a live handle and stream.
        check(unsafe { (api.set_stream)(handle, stream) }, "stream setup")?;
        // An older cuBLAS without the TF32 mode keeps plain FP32 products.
        // SAFETY: a live handle.
        let _ = unsafe { (api.set_math_mode)(handle, CUBLAS_TF32_TENSOR_OP_MATH) };
        Ok(Some(cublas))
    }

    pub fn library(&self) -> &'static str {
        self.api.name
    }

    /// Whether [`gemm_xwt_f16`](Self::gemm_xwt_f16) can be called.
    pub fn has_f16_products(&self) -> bool {
        self.compute_types
    }

    /// As [`gemm_xwt`](Self::gemm_xwt), in plain FP32 (no TF32 rounding of
    /// the inputs): for products whose results choose between discrete
    /// alternatives, as a mixture of experts' router logits choose experts.
    ///
    /// # Safety
    /// As `gemm_xwt`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn gemm_xwt_fp32(
        &self,
        w: *const f32,
        m: usize,
        k: usize,
        x: *const f32,
        n: usize,
        out: *mut f32,
        ldo: usize,
    ) -> Result<()> {
        // SAFETY: a live handle; the mode applies to the calls that follow.
        let _ = unsafe { (self.api.set_math_mode)(self.handle, CUBLAS_DEFAULT_MATH) };
        // SAFETY: as the caller promises.
        let result = unsafe { self.gemm_xwt(w, m, k, x, n, out, ldo) };
        // SAFETY: as above; an older cuBLAS without TF32 ignores it.
        let _ = unsafe { (self.api.set_math_mode)(self.handle, CUBLAS_TF32_TENSOR_OP_MATH) };
        result
    }

    /// out (n × m, row-major, row stride `ldo`) = x (n × k) · wᵀ, with w
    /// m × k, all row-major f32 in device memory.
    ///
    /// # Safety
    /// The pointers are device memory of the sizes stated, on the handle's device.
    #[allow(clippy::too_many_arguments)] // BLAS's own shape: three matrices and their dimensions
    pub unsafe fn gemm_xwt(
        &self,
        w: *const f32,
        m: usize,
        k: usize,
        x: *const f32,
        n: usize,
        out: *mut f32,
        ldo: usize,
    ) -> Result<()> {
        // Column-major, out is the (m × n, leading dimension ldo) product of
        // wᵀ-as-stored (k × m, transposed) and x-as-stored (k × n).
        let (alpha, beta) = (1.0f32, 0.0f32);
        check(
            unsafe {
                (self.api.sgemm)(
                    self.handle,
                    CUBLAS_OP_T,
                    CUBLAS_OP_N,
                    dim(m)?,
                    dim(n)?,
                    dim(k)?,
                    &alpha,
                    w,
                    dim(k)?,
                    x,
                    dim(k)?,
                    &beta,
                    out,
                    dim(ldo)?,
                )
            },
            "SGEMM",
        )
    }

    /// As [`gemm_xwt`](Self::gemm_xwt) with w and x in f16 (their bits as
    /// u16) and out in f32: FP32 sums, on tensor cores where the GPU has them.
    ///
    /// # Safety
    /// As `gemm_xwt`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn gemm_xwt_f16(
        &self,
        w: *const u16,
        m: usize,
        k: usize,
        x: *const u16,
        n: usize,
        out: *mut f32,
        ldo: usize,
    ) -> Result<()> {
        let (alpha, beta) = (1.0f32, 0.0f32);
        check(
            unsafe {
                (self.api.gemm_ex)(
                    self.handle,
                    CUBLAS_OP_T,
                    CUBLAS_OP_N,
                    dim(m)?,
                    dim(n)?,
                    dim(k)?,
                    (&alpha as *const f32).cast(),
                    w.cast(),
                    CUDA_R_16F,
                    dim(k)?,
                    x.cast(),
                    CUDA_R_16F,
                    dim(k)?,
                    (&beta as *const f32).cast(),
                    out.cast(),
                    CUDA_R_32F,
                    dim(ldo)?,
                    CUBLAS_COMPUTE_32F,
                    CUBLAS_GEMM_DEFAULT,
                )
            },
            "GEMM (f16 operands)",
        )
    }
}

fn dim(v: usize) -> Result<c_int> {
    c_int::try_from(v).map_err(|_| Error::unsupported(format!("a matrix dimension of {v}")))
}

impl Drop for Cublas {
    fn drop(&mut self) {
        // SAFETY: created by cublasCreate_v2, destroyed once.
        unsafe { (self.api.destroy)(self.handle) };
    }
}
