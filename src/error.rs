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
