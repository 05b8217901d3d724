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

/// What a live handle refers to.
enum Handle {
    Model(Arc<Model>),
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
        None => Err(not_live(address, "model")),
    }
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
