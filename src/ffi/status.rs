//! Status codes, the thread-local last-error message, and the guard every
//! exported body runs under.

use std::cell::RefCell;
use std::ffi::CString;
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::error::{Error, ErrorKind, Result};

/// ==== Types: the status, the handles, parameters and callbacks ====
///
/// The result of every fallible call. On failure `m40_last_error()` says what
/// failed, where and why.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum m40_status {
    M40_OK = 0,
    /// NULL pointer, bad length, token out of range, invalid UTF-8, ...
    M40_ERR_INVALID_ARGUMENT = 1,
    /// File missing or unreadable, or the path is not a regular file.
    M40_ERR_IO = 2,
    /// Malformed or truncated GGUF.
    M40_ERR_FORMAT = 3,
    /// Architecture or tensor type not supported by this build.
    M40_ERR_UNSUPPORTED = 4,
    /// Host or device memory exhausted (or another resource the system
    /// gives out, such as threads).
    M40_ERR_OUT_OF_MEMORY = 5,
    /// The session has no room for the tokens.
    M40_ERR_CONTEXT_FULL = 6,
    /// CUDA / device failure.
    M40_ERR_BACKEND = 7,
    /// The output buffer is too small; the size needed was written to the
    /// function's length output (the one exception to "outputs are written
    /// only on M40_OK").
    M40_ERR_BUFFER_TOO_SMALL = 8,
    /// A bug in libm40llm (a caught panic).
    M40_ERR_INTERNAL = 9,
}

impl From<ErrorKind> for m40_status {
    fn from(kind: ErrorKind) -> Self {
        match kind {
            ErrorKind::InvalidArgument => m40_status::M40_ERR_INVALID_ARGUMENT,
            ErrorKind::Io => m40_status::M40_ERR_IO,
            ErrorKind::Format => m40_status::M40_ERR_FORMAT,
            ErrorKind::Unsupported => m40_status::M40_ERR_UNSUPPORTED,
            ErrorKind::OutOfMemory => m40_status::M40_ERR_OUT_OF_MEMORY,
            ErrorKind::ContextFull => m40_status::M40_ERR_CONTEXT_FULL,
            ErrorKind::Backend => m40_status::M40_ERR_BACKEND,
            ErrorKind::BufferTooSmall => m40_status::M40_ERR_BUFFER_TOO_SMALL,
            ErrorKind::Internal => m40_status::M40_ERR_INTERNAL,
        }
    }
}

impl m40_status {
    /// The status whose value is `value`, if one is.
    pub(crate) fn from_value(value: i32) -> Option<m40_status> {
        use m40_status::*;
        [
            M40_OK,
            M40_ERR_INVALID_ARGUMENT,
            M40_ERR_IO,
            M40_ERR_FORMAT,
            M40_ERR_UNSUPPORTED,
            M40_ERR_OUT_OF_MEMORY,
            M40_ERR_CONTEXT_FULL,
            M40_ERR_BACKEND,
            M40_ERR_BUFFER_TOO_SMALL,
            M40_ERR_INTERNAL,
        ]
        .into_iter()
        .find(|&s| s as i32 == value)
    }

    pub(crate) fn description(self) -> &'static std::ffi::CStr {
        match self {
            m40_status::M40_OK => c"ok",
            m40_status::M40_ERR_INVALID_ARGUMENT => c"invalid argument",
            m40_status::M40_ERR_IO => c"I/O error",
            m40_status::M40_ERR_FORMAT => c"malformed GGUF file",
            m40_status::M40_ERR_UNSUPPORTED => c"unsupported",
            m40_status::M40_ERR_OUT_OF_MEMORY => c"out of memory",
            m40_status::M40_ERR_CONTEXT_FULL => c"context full",
            m40_status::M40_ERR_BACKEND => c"backend (device) error",
            m40_status::M40_ERR_BUFFER_TOO_SMALL => c"buffer too small",
            m40_status::M40_ERR_INTERNAL => c"internal error",
        }
    }
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// The calling thread's last error message; valid until its next failing call.
pub(crate) fn last_error_ptr() -> *const std::ffi::c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

fn set_last_error(message: &str) {
    // Messages can quote file contents; a NUL would cut the C string short.
    let c = CString::new(message.replace('\0', "\\0")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

/// Records `err` as the thread's last error and returns its status.
fn fail(err: &Error) -> m40_status {
    set_last_error(err.message());
    err.kind().into()
}

fn panic_error(payload: Box<dyn std::any::Any + Send>) -> Error {
    let what = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_string());
    Error::internal(format!(
        "internal error (a bug in libm40llm, please report it): {what}"
    ))
}

/// Runs an exported function's body: a panic never crosses the C boundary, and
/// any failure leaves its message for `m40_last_error`.
pub(crate) fn guard(body: impl FnOnce() -> Result<()>) -> m40_status {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => m40_status::M40_OK,
        Ok(Err(err)) => fail(&err),
        Err(payload) => fail(&panic_error(payload)),
    }
}

/// [`guard`] for functions that return a value instead of a status: on failure
/// they return `on_error` and leave the message.
pub(crate) fn guard_value<T>(on_error: T, body: impl FnOnce() -> Result<T>) -> T {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(value)) => value,
        Ok(Err(err)) => {
            fail(&err);
            on_error
        }
        Err(payload) => {
            fail(&panic_error(payload));
            on_error
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn last_error() -> String {
        // SAFETY: the pointer is the thread's live last-error CString.
        unsafe { std::ffi::CStr::from_ptr(last_error_ptr()) }
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn a_panic_becomes_internal_with_its_message() {
        let status = guard(|| panic!("boom {}", 42));
        assert_eq!(status, m40_status::M40_ERR_INTERNAL);
        assert!(last_error().contains("boom 42"), "{}", last_error());
    }

    #[test]
    fn success_keeps_the_previous_message() {
        assert_eq!(
            guard(|| Err(Error::format("bad tensor 'x'"))),
            m40_status::M40_ERR_FORMAT
        );
        assert_eq!(guard(|| Ok(())), m40_status::M40_OK);
        assert_eq!(last_error(), "bad tensor 'x'");
    }

    #[test]
    fn messages_with_nul_bytes_are_kept_whole() {
        guard(|| Err(Error::format("key 'a\0b'")));
        assert_eq!(last_error(), "key 'a\\0b'");
    }

    #[test]
    fn guard_value_returns_the_fallback_on_error() {
        assert_eq!(
            guard_value(-1, || Err(Error::invalid_argument("model is NULL"))),
            -1
        );
        assert_eq!(last_error(), "model is NULL");
        assert_eq!(guard_value(-1, || Ok(7)), 7);
    }
}
