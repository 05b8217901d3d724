//! The engine's one error type. Every fallible engine function returns
//! [`Result`]; the C boundary maps [`ErrorKind`] to `m40_status` in one place
//! (`ffi::status`).

use std::fmt;

/// What class of failure happened; each maps to one `m40_status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    InvalidArgument,
    Io,
    Format,
    Unsupported,
    OutOfMemory,
    ContextFull,
    Backend,
    BufferTooSmall,
    Internal,
}

/// A failure with a message that names what failed, where, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    kind: ErrorKind,
    message: String,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: message.into(),
        }
    }
    pub fn invalid_argument(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidArgument, message)
    }
    pub fn format(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Format, message)
    }
    pub fn unsupported(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unsupported, message)
    }
    pub fn out_of_memory(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::OutOfMemory, message)
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, message)
    }

    /// An I/O error while doing `what`, classified: a failed allocation is
    /// out-of-memory, everything else is `Io`. Callers add the file name with
    /// [`Error::context`].
    pub fn io(what: &str, err: std::io::Error) -> Self {
        let kind = if err.kind() == std::io::ErrorKind::OutOfMemory {
            ErrorKind::OutOfMemory
        } else {
            ErrorKind::Io
        };
        Self::new(kind, format!("{what}: {err}"))
    }

    pub fn kind(&self) -> ErrorKind {
        self.kind
    }
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The same error with `prefix: ` in front of its message (e.g. the file name).
    pub fn context(self, prefix: impl fmt::Display) -> Self {
        Error {
            kind: self.kind,
            message: format!("{prefix}: {}", self.message),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

/// The most bytes of a file-supplied string an error message quotes.
pub const MAX_ECHO_BYTES: usize = 256;

/// A string read from an untrusted file (a metadata key or value, a tensor
/// name, an architecture or tokenizer name), as an error message quotes it:
/// whole when it is at most [`MAX_ECHO_BYTES`] long, else its first bytes up
/// to a character boundary, an ellipsis and its full length. A file cannot
/// make a message as long as itself. `{}` writes it as is, `{:?}` quoted
/// and escaped.
pub fn echo(text: &str) -> Echo<'_> {
    Echo(text)
}

/// See [`echo`].
#[derive(Clone, Copy)]
pub struct Echo<'a>(&'a str);

impl Echo<'_> {
    /// The quoted prefix, and whether it is all of the string.
    fn head(&self) -> (&str, bool) {
        if self.0.len() <= MAX_ECHO_BYTES {
            return (self.0, true);
        }
        let mut end = MAX_ECHO_BYTES;
        while !self.0.is_char_boundary(end) {
            end -= 1;
        }
        (&self.0[..end], false)
    }

    fn write_rest(&self, f: &mut fmt::Formatter<'_>, whole: bool) -> fmt::Result {
        if whole {
            Ok(())
        } else {
            write!(f, "… ({} bytes)", self.0.len())
        }
    }
}

impl fmt::Display for Echo<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (head, whole) = self.head();
        f.write_str(head)?;
        self.write_rest(f, whole)
    }
}

impl fmt::Debug for Echo<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (head, whole) = self.head();
        fmt::Debug::fmt(head, f)?;
        self.write_rest(f, whole)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_strings_are_echoed_whole() {
        assert_eq!(echo("llama").to_string(), "llama");
        assert_eq!(format!("{:?}", echo("a\"b")), "\"a\\\"b\"");
        let exact = "x".repeat(MAX_ECHO_BYTES);
        assert_eq!(echo(&exact).to_string(), exact);
    }

    #[test]
    fn long_strings_are_cut_on_a_character_boundary_with_their_length() {
        let long = "é".repeat(1 << 19); // 1 MiB of two-byte characters
        let shown = echo(&long).to_string();
        assert!(shown.len() < MAX_ECHO_BYTES + 32, "{} bytes", shown.len());
        assert_eq!(
            shown,
            format!("{}… (1048576 bytes)", "é".repeat(MAX_ECHO_BYTES / 2))
        );
        let odd = format!("x{}", "é".repeat(200));
        let shown = format!("{:?}", echo(&odd));
        assert!(
            shown.starts_with("\"xé") && shown.ends_with("é\"… (401 bytes)"),
            "{shown}"
        );
    }
}
