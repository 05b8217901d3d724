//! The registry of live handles.
//!
//! A handle the host holds is a number the library never hands out twice,
//! typed as a pointer; the registry maps it to the object. The library never
//! dereferences a handle: it looks it up. So a freed, foreign or garbage
//! pointer is reported instead of being read, and a second free is an error,
//! not a crash. Each call takes its own `Arc` of the object, so a concurrent
//! `m40_free` cannot destroy a model or session under a call that is using
//! it: the call finishes, and the object goes with the last `Arc`.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, TryLockError};

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

/// The next handle value. Handles are never reused (a 64-bit count does not
/// wrap), so a freed handle stays invalid for good: a call with it fails
/// even after other handles were created, instead of reaching whatever
/// object a reused address would name. Multiples of 16, like addresses of
/// allocations, and far from NULL.
static NEXT_HANDLE: AtomicUsize = AtomicUsize::new(0x4d40_0000);

/// Registers `object` under a fresh, never used, non-NULL handle value.
fn register(object: Handle) -> Result<*mut u8> {
    let address = NEXT_HANDLE.fetch_add(16, Ordering::Relaxed);
    if address < 0x4d40_0000 {
        // Wrapped around (a 32-bit target after 2^28 handles).
        NEXT_HANDLE.store(usize::MAX - 15, Ordering::Relaxed);
        return Err(Error::internal(
            "libm40llm has handed out every handle value",
        ));
    }
    registry().insert(address, object);
    Ok(address as *mut u8)
}

pub(crate) fn register_model(model: Model) -> Result<*mut u8> {
    register(Handle::Model(Arc::new(model)))
}

pub(crate) fn register_session(session: Session) -> Result<*mut u8> {
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

thread_local! {
    /// The sessions this thread holds locked, innermost last: a call into one
    /// of them from inside its own `m40_generate` callback is told so.
    static HELD: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

/// A session locked for one call; unlocks (and forgets that this thread
/// holds it) when dropped.
pub(crate) struct Locked<'a> {
    guard: MutexGuard<'a, Session>,
    address: usize,
}

impl std::ops::Deref for Locked<'_> {
    type Target = Session;
    fn deref(&self) -> &Session {
        &self.guard
    }
}

impl std::ops::DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut Session {
        &mut self.guard
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        HELD.with(|held| {
            let mut held = held.borrow_mut();
            if let Some(i) = held.iter().rposition(|&a| a == self.address) {
                held.remove(i);
            }
        });
    }
}

/// Locks the session at `address` (`name` says which argument it is) for
/// one call. A session is for one thread at a time: when another thread is
/// using it, or this thread is (a call from inside the `m40_generate`
/// callback of that very session), the call fails at once instead of
/// waiting, which would be a deadlock in the second case.
pub(crate) fn lock<'a>(
    address: usize,
    session: &'a Mutex<Session>,
    name: &str,
) -> Result<Locked<'a>> {
    let guard = match session.try_lock() {
        Ok(guard) => guard,
        // A panic in an earlier call was caught and reported. Sessions
        // commit a step only after it completed (cache entries past n_past
        // are ignored), so the state is consistent and the session usable.
        Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
        Err(TryLockError::WouldBlock) => {
            let this_thread = HELD.with(|held| held.borrow().contains(&address));
            return Err(Error::invalid_argument(if this_thread {
                format!(
                    "{name} {address:#x} is in use by this thread: it is generating (m40_generate), \
                     and its on_piece callback may not call functions on the same session \
                     (other sessions and the model are allowed)"
                )
            } else {
                format!(
                    "{name} {address:#x} is in use by another thread (a session is for one thread at a time)"
                )
            }));
        }
    };
    HELD.with(|held| held.borrow_mut().push(address));
    Ok(Locked { guard, address })
}

/// Runs `f` on the session, which must not be in use by another call (see
/// [`lock`]).
pub(crate) fn with_session<T>(
    address: usize,
    f: impl FnOnce(&mut Session) -> Result<T>,
) -> Result<T> {
    let session = session(address)?;
    let mut locked = lock(address, &session, "session")?;
    f(&mut locked)
}

/// Releases any handle; NULL is a no-op. A model's memory goes when the last
/// `Arc` (the registry's or a session's) is dropped.
pub(crate) fn free(address: usize) -> Result<()> {
    if address == 0 {
        return Ok(());
    }
    // Taken out under the registry's lock, dropped after it: the last
    // reference to a model or session may take a while to release.
    let removed = registry().remove(&address);
    match removed {
        Some(object) => {
            drop(object);
            Ok(())
        }
        None => Err(not_live(address, "libm40llm")),
    }
}
