//! Releasing handles.

use std::ffi::c_void;

use super::handles;
use super::status::{guard, m40_status};

/// ==== 10. Releasing handles ====
///
/// Releases any handle the library gave out (a model or a session). A model
/// stays alive until its last session is freed, in whatever order the host
/// frees them. NULL is a no-op returning M40_OK. A pointer that is not a live
/// handle (freed already, or never one) gives M40_ERR_INVALID_ARGUMENT and is
/// not touched.
///
/// Thread-safety: freeing a handle that another thread is using at that
/// moment is safe for the library: the other call finishes with the object,
/// which is released when it returns, and every later call with the handle
/// gives M40_ERR_INVALID_ARGUMENT. What is not safe is the host's own use
/// of what it got from the handle: a session's `m40_logits` pointer is
/// invalid once the session is freed and no call is using it any more (at
/// once, when none was). The same holds inside an
/// `m40_generate` callback: freeing the generating session there releases
/// the handle, and the generation runs on (return false to stop it) until
/// `m40_generate` returns and releases the session.
#[no_mangle]
pub extern "C" fn m40_free(handle: *mut c_void) -> m40_status {
    guard(|| handles::free(handle as usize))
}
