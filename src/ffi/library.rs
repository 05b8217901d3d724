//! Library-wide functions: versions, status names, the last error.

use std::ffi::c_char;

use super::status::{last_error_ptr, m40_status};

/// The version of the C ABI this header describes. A library whose
/// `m40_abi_version()` differs from this is not compatible.
pub const M40_ABI_VERSION: u32 = 1;

/// Returns the C ABI version of the loaded library (compare with
/// `M40_ABI_VERSION`).
#[no_mangle]
pub extern "C" fn m40_abi_version() -> u32 {
    M40_ABI_VERSION
}

/// Returns the library version and build, e.g. "0.1.0 (cpu; x86_64-linux)".
/// The string is static; do not free it.
#[no_mangle]
pub extern "C" fn m40_version() -> *const c_char {
    concat!(
        env!("CARGO_PKG_VERSION"),
        " (",
        env!("M40_BUILD_INFO"),
        ")\0"
    )
    .as_ptr()
    .cast()
}

/// Returns the message of the last failed call on this thread: what failed,
/// where (file, tensor, key, argument) and why; "" when no call has failed.
/// Valid until the next failing call on this thread; do not free it.
/// Successful calls leave it unchanged.
#[no_mangle]
pub extern "C" fn m40_last_error() -> *const c_char {
    last_error_ptr()
}

/// Returns a short static description of a status ("ok", "malformed GGUF
/// file", ...). `status` must be one of the `m40_status` values.
#[no_mangle]
pub extern "C" fn m40_status_str(status: m40_status) -> *const c_char {
    status.description().as_ptr()
}
