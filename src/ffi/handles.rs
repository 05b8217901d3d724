//! The registry of live handles.
//!
//! A handle the host holds is the address of a small allocation the library
//! made for it; the registry maps that address to the object. The library
//! never dereferences a handle: it looks it up. So a freed, foreign or garbage
//! pointer is reported instead of being read, and a second free is an error,
//! not a crash. Each call takes its own `Arc` of the object, so a concurrent
//! `m40_free` cannot destroy a model under a call that is using it.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};

use crate::error::{Error, Result};
use crate::model::Model;
use crate::session::Session;

/// What a live handle refers to.
enum Handle {
    Model(Arc<Model>),
    Session(Arc<Mutex<Session>>),
}

impl Handle {
    fn kind(&self) -> &'static str {
        match self {
            Handle::Model(_) => "model",
            Handle::Session(_) => "session",
        }
    }
}

static REGISTRY: LazyLock<Mutex<HashMap<usize, Handle>>> = LazyLock::new(Default::default);

fn registry() -> MutexGuard<'static, HashMap<usize, Handle>> {
    // The map stays consistent even if a holder panicked: every critical
    // section is a single insert, lookup or remove.
    REGISTRY
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Registers `object` under a fresh, unique, non-NULL address.
fn register(object: Handle) -> *mut u8 {
    let address = Box::into_raw(Box::new(0u8));
    registry().insert(address as usize, object);
    address
}

pub(crate) fn register_model(model: Model) -> *mut u8 {
    register(Handle::Model(Arc::new(model)))
}

pub(crate) fn register_session(session: Session) -> *mut u8 {
    register(Handle::Session(Arc::new(Mutex::new(session))))
}

fn not_live(address: usize, expected: &str) -> Error {
    Error::invalid_argument(format!(
        "{address:#x} is not a live {expected} handle (never returned by libm40llm, or already freed)"
    ))
}

/// The model behind a host's model handle.
pub(crate) fn model(address: usize) -> Result<Arc<Model>> {
    if address == 0 {
        return Err(Error::invalid_argument("model is NULL"));
    }
    match registry().get(&address) {
        Some(Handle::Model(model)) => Ok(Arc::clone(model)),
        Some(other) => Err(wrong_kind(address, other, "model")),
        None => Err(not_live(address, "model")),
    }
}

fn wrong_kind(address: usize, found: &Handle, expected: &str) -> Error {
    Error::invalid_argument(format!(
        "{address:#x} is a {} handle, not a {expected}",
        found.kind()
    ))
}

/// The session behind a host's session handle.
pub(crate) fn session(address: usize) -> Result<Arc<Mutex<Session>>> {
    if address == 0 {
        return Err(Error::invalid_argument("session is NULL"));
    }
    match registry().get(&address) {
        Some(Handle::Session(session)) => Ok(Arc::clone(session)),
        Some(other) => Err(wrong_kind(address, other, "session")),
        None => Err(not_live(address, "session")),
    }
}

/// Runs `f` on the session, which must not be in use by another thread
/// (the contract allows one thread per session; a clash is reported, not
/// waited on).
pub(crate) fn with_session<T>(
    address: usize,
    f: impl FnOnce(&mut Session) -> Result<T>,
) -> Result<T> {
    let session = session(address)?;
    let mut guard = match session.try_lock() {
        Ok(guard) => guard,
        // A panic in an earlier call was caught and reported. Sessions
        // commit a step only after it completed (cache entries past n_past
        // are ignored), so the state is consistent and the session usable.
        Err(std::sync::TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
        Err(std::sync::TryLockError::WouldBlock) => {
            return Err(Error::invalid_argument(format!(
                "session {address:#x} is in use by another thread (a session is for one thread at a time)"
            )))
        }
    };
    f(&mut guard)
}

/// Releases any handle; NULL is a no-op. A model's memory goes when the last
/// `Arc` (the registry's or a session's) is dropped.
pub(crate) fn free(address: usize) -> Result<()> {
    if address == 0 {
        return Ok(());
    }
    let removed = registry().remove(&address);
    match removed {
        Some(object) => {
            // SAFETY: `address` came from `Box::into_raw` in `register` and was
            // still registered, so this is its one and only release.
            drop(unsafe { Box::from_raw(address as *mut u8) });
            drop(object);
            Ok(())
        }
        None => Err(not_live(address, "libm40llm")),
    }
}
