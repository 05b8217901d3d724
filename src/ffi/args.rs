//! Checked conversions of the host's raw arguments. Every raw pointer the host
//! passes is dereferenced here and nowhere else in the library.

use std::ffi::{c_char, CStr};
use std::path::PathBuf;

use crate::error::{Error, ErrorKind, Result};

/// A NUL-terminated path argument.
///
/// # Safety
/// `ptr` is NULL or points to a NUL-terminated string that stays valid for the call.
pub(crate) unsafe fn path(ptr: *const c_char, name: &str) -> Result<PathBuf> {
    if ptr.is_null() {
        return Err(Error::invalid_argument(format!("{name} is NULL")));
    }
    // SAFETY: non-NULL, and the caller promises NUL termination.
    let bytes = unsafe { CStr::from_ptr(ptr) }.to_bytes();
    if bytes.is_empty() {
        return Err(Error::invalid_argument(format!(
            "{name} is an empty string"
        )));
    }
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        Ok(PathBuf::from(std::ffi::OsStr::from_bytes(bytes)))
    }
    #[cfg(not(unix))]
    {
        std::str::from_utf8(bytes)
            .map(PathBuf::from)
            .map_err(|_| Error::invalid_argument(format!("{name} is not valid UTF-8")))
    }
}

/// A NUL-terminated UTF-8 string argument (empty allowed).
///
/// # Safety
/// `ptr` is NULL or points to a NUL-terminated string that stays valid for the call.
pub(crate) unsafe fn c_text<'a>(ptr: *const c_char, name: &str) -> Result<&'a str> {
    if ptr.is_null() {
        return Err(Error::invalid_argument(format!("{name} is NULL")));
    }
    // SAFETY: non-NULL, and the caller promises NUL termination.
    unsafe { CStr::from_ptr(ptr) }
        .to_str()
        .map_err(|_| Error::invalid_argument(format!("{name} is not valid UTF-8")))
}

/// A struct passed by pointer for reading; NULL means "use `default`".
///
/// # Safety
/// `ptr` is NULL or points to a valid, initialized `T`.
pub(crate) unsafe fn struct_or_default<T: Copy>(ptr: *const T, default: impl FnOnce() -> T) -> T {
    // SAFETY: the caller promises a valid T when non-NULL.
    unsafe { ptr.as_ref() }.copied().unwrap_or_else(default)
}

/// An output location the function writes on success.
///
/// # Safety
/// `ptr` is NULL or points to writable memory for a `T`.
pub(crate) unsafe fn out<'a, T>(ptr: *mut T, name: &str) -> Result<&'a mut T> {
    // SAFETY: the caller promises writable memory when non-NULL.
    unsafe { ptr.as_mut() }.ok_or_else(|| Error::invalid_argument(format!("{name} is NULL")))
}

/// A host array of `len` elements; NULL is allowed when `len` is 0.
///
/// # Safety
/// `ptr` is NULL or points to `len` readable, initialized elements.
pub(crate) unsafe fn slice<'a, T>(ptr: *const T, len: usize, name: &str) -> Result<&'a [T]> {
    if len == 0 {
        return Ok(&[]);
    }
    if ptr.is_null() {
        return Err(Error::invalid_argument(format!(
            "{name} is NULL but its length is {len}"
        )));
    }
    if len > isize::MAX as usize / std::mem::size_of::<T>().max(1) {
        return Err(Error::invalid_argument(format!(
            "{name} length {len} is impossible"
        )));
    }
    // SAFETY: non-NULL, and the caller promises `len` readable elements.
    Ok(unsafe { std::slice::from_raw_parts(ptr, len) })
}

/// A host string of `len` bytes that must be UTF-8 (not necessarily
/// NUL-terminated; NULL is allowed when `len` is 0).
///
/// # Safety
/// As `slice`.
pub(crate) unsafe fn utf8<'a>(ptr: *const u8, len: usize, name: &str) -> Result<&'a str> {
    // SAFETY: the caller's promise, forwarded.
    let bytes = unsafe { slice(ptr, len, name)? };
    std::str::from_utf8(bytes)
        .map_err(|e| Error::invalid_argument(format!("{name} is not valid UTF-8: {e}")))
}

/// Writes `text` and a terminating NUL into the host's buffer of `cap` bytes,
/// and its length (without the NUL) into `*out_len` when that is not NULL.
/// A buffer too small gets nothing but the needed length.
///
/// # Safety
/// `buf` is NULL or points to `cap` writable bytes; `out_len` is NULL or writable.
pub(crate) unsafe fn write_text(
    text: &[u8],
    buf: *mut c_char,
    cap: usize,
    out_len: *mut usize,
) -> Result<()> {
    // SAFETY: the caller promises out_len is NULL or writable.
    let out_len = unsafe { out_len.as_mut() };
    let needed = text.len() + 1;
    if buf.is_null() && cap > 0 {
        return Err(Error::invalid_argument(format!(
            "buf is NULL but cap is {cap}"
        )));
    }
    if cap < needed {
        if let Some(len) = out_len {
            *len = text.len();
        }
        return Err(Error::new(
            ErrorKind::BufferTooSmall,
            format!("the output needs {needed} bytes (with its NUL), the buffer holds {cap}"),
        ));
    }
    // SAFETY: buf holds cap >= text.len() + 1 writable bytes, and a host buffer
    // cannot overlap the library's own `text`.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), text.len());
        *buf.add(text.len()) = 0;
    }
    if let Some(len) = out_len {
        *len = text.len();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_text_reports_the_needed_length_and_writes_nothing_when_short() {
        let mut buf = [b'x' as c_char; 4];
        let mut len = 0usize;
        let err =
            unsafe { write_text(b"hello", buf.as_mut_ptr(), buf.len(), &mut len) }.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::BufferTooSmall);
        assert_eq!(len, 5);
        assert!(buf.iter().all(|&c| c == b'x' as c_char));
    }

    #[test]
    fn write_text_terminates_and_measures() {
        let mut buf = [0 as c_char; 6];
        let mut len = 0usize;
        unsafe { write_text(b"hello", buf.as_mut_ptr(), buf.len(), &mut len) }.unwrap();
        assert_eq!(len, 5);
        assert_eq!(unsafe { CStr::from_ptr(buf.as_ptr()) }.to_bytes(), b"hello");
    }

    #[test]
    fn a_size_query_with_a_null_buffer_is_allowed() {
        let mut len = 0usize;
        let err = unsafe { write_text(b"abc", std::ptr::null_mut(), 0, &mut len) }.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::BufferTooSmall);
        assert_eq!(len, 3);
        let err = unsafe { write_text(b"abc", std::ptr::null_mut(), 8, &mut len) }.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    }

    #[test]
    fn null_and_empty_paths_are_argument_errors() {
        assert_eq!(
            unsafe { path(std::ptr::null(), "path") }
                .unwrap_err()
                .kind(),
            ErrorKind::InvalidArgument
        );
        assert_eq!(
            unsafe { path(c"".as_ptr(), "path") }.unwrap_err().kind(),
            ErrorKind::InvalidArgument
        );
        assert_eq!(
            unsafe { path(c"/a/b".as_ptr(), "path") }.unwrap(),
            PathBuf::from("/a/b")
        );
    }
}
