//! Library-wide functions: versions, status names, the last error.

use std::ffi::c_char;

use super::status::{last_error_ptr, m40_status};

/// The version of the C ABI this header describes. A library whose
/// `m40_abi_version()` differs from this is not compatible.
pub const M40_ABI_VERSION: u32 = 1;

/// ==== 1. The library: versions and errors ====
///
/// Returns the C ABI version of the loaded library (compare with
/// `M40_ABI_VERSION`). Like every function of this section it may be called
/// from any thread at any time, before or after any other call.
#[no_mangle]
pub extern "C" fn m40_abi_version() -> u32 {
    M40_ABI_VERSION
}

/// Returns the library version and build, e.g.
/// "0.1.0 (cpu; x86_64-unknown-linux-gnu; release)".
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

/// A status as `m40_status_str` receives it: any 32-bit value, since C lets
/// an `enum m40_status` hold any value of its underlying type. cbindgen.toml
/// renames it to `enum m40_status`, so that the header declares the function
/// with the enum; the two are passed alike.
pub type m40_status_value = i32;

/// Returns a short static description of a status ("ok", "malformed GGUF
/// file", ...); any other value, outside the enum, gets "unknown status".
/// Do not free it.
#[no_mangle]
pub extern "C" fn m40_status_str(status: m40_status_value) -> *const c_char {
    m40_status::from_value(status)
        .map_or(c"unknown status", m40_status::description)
        .as_ptr()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    fn text(status: m40_status_value) -> &'static str {
        // SAFETY: m40_status_str returns a static NUL-terminated string.
        unsafe { CStr::from_ptr(m40_status_str(status)) }
            .to_str()
            .unwrap()
    }

    #[test]
    fn every_status_value_gets_a_string_and_values_outside_the_enum_are_unknown() {
        assert_eq!(text(m40_status::M40_OK as i32), "ok");
        assert_eq!(
            text(m40_status::M40_ERR_FORMAT as i32),
            "malformed GGUF file"
        );
        assert_eq!(text(m40_status::M40_ERR_INTERNAL as i32), "internal error");
        for value in [-1, 10, 1000, i32::MIN, i32::MAX] {
            assert_eq!(text(value), "unknown status", "{value}");
        }
    }
}
