//! Session handles: create, decode, read logits, sample, generate, reset,
//! truncate.

use std::ffi::{c_char, c_void};

use super::args;
use super::handles;
use super::status::{guard, guard_value, m40_status};
use crate::error::{Error, Result};
use crate::sampling::SamplerParams;
use crate::session::{Session, SessionParams};

/// A token id.
pub type m40_token = i32;

/// An opaque session: one sequence of tokens and its KV cache over a model.
/// Used by one thread at a time (a call on a session another call is using
/// fails with M40_ERR_INVALID_ARGUMENT); different sessions may run on
/// different threads at once. Release it with `m40_free`.
pub struct m40_session {
    _opaque: [u8; 0],
}

/// How to create a session.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct m40_session_params {
    /// KV capacity in tokens; 0: min(model's training context, 4096).
    pub n_ctx: u32,
    /// Most tokens one forward pass takes; 0: 512.
    pub n_batch: u32,
}

/// How `m40_sample` picks a token.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct m40_sampler_params {
    /// <= 0: greedy (argmax).
    pub temperature: f32,
    /// <= 0: off.
    pub top_k: i32,
    /// >= 1: off.
    pub top_p: f32,
    /// <= 0: off.
    pub min_p: f32,
    /// 1: off.
    pub repeat_penalty: f32,
    /// Window for repeat_penalty (0: off, -1 or any negative value: every
    /// token of the session).
    pub repeat_last_n: i32,
    /// Same seed, same tokens.
    pub seed: u64,
}

impl From<m40_sampler_params> for SamplerParams {
    fn from(p: m40_sampler_params) -> Self {
        SamplerParams {
            temperature: p.temperature,
            top_k: p.top_k,
            top_p: p.top_p,
            min_p: p.min_p,
            repeat_penalty: p.repeat_penalty,
            repeat_last_n: p.repeat_last_n,
            seed: p.seed,
        }
    }
}

/// ==== 5. Sessions: parameters and creation ====
///
/// Returns the default session parameters (n_ctx 0, n_batch 0: see the fields).
#[no_mangle]
pub extern "C" fn m40_session_default_params() -> m40_session_params {
    m40_session_params {
        n_ctx: 0,
        n_batch: 0,
    }
}

/// Creates a session over `model` (which stays alive at least as long as the
/// session, whatever order the host frees them in) and writes it to
/// `*out_session`. `params` NULL means the defaults. A vocab-only model
/// cannot run sessions (M40_ERR_INVALID_ARGUMENT). The KV cache is
/// allocated whole, for n_ctx tokens: on the CPU, one larger than the
/// memory the machine has available (MemAvailable, and the room under the
/// process's cgroup memory limit) gives M40_ERR_OUT_OF_MEMORY, with the
/// bytes needed and available in the message, as does one the device
/// cannot hold. Release it with `m40_free`. Any number of threads may
/// create sessions over one model at the same time.
///
/// # Safety
/// `params` is NULL or valid; `out_session` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn m40_session_new(
    model: *mut super::m40_model,
    params: *const m40_session_params,
    out_session: *mut *mut m40_session,
) -> m40_status {
    guard(|| {
        // SAFETY: the caller's promises, forwarded.
        let (params, out_session) = unsafe {
            (
                args::struct_or_default(params, || m40_session_default_params()),
                args::out(out_session, "out_session")?,
            )
        };
        let model = handles::model(model as usize)?;
        let session = Session::new(
            model,
            SessionParams {
                n_ctx: params.n_ctx,
                n_batch: params.n_batch,
            },
        )?;
        *out_session = handles::register_session(session)?.cast();
        Ok(())
    })
}

/// Forgets every token of the session (its logits too).
#[no_mangle]
pub extern "C" fn m40_session_reset(session: *mut m40_session) -> m40_status {
    guard(|| {
        handles::with_session(session as usize, |s| {
            s.reset();
            Ok(())
        })
    })
}

/// Forgets the sampler's random state (tokens and logits stay): the next
/// `m40_sample` seeds it from its parameters' seed, as in a new session. A
/// host that reuses a session for an unrelated request (after
/// `m40_session_truncate` to a shared prompt) calls it so that the same seed
/// gives the same tokens as in a fresh session.
#[no_mangle]
pub extern "C" fn m40_session_reset_sampler(session: *mut m40_session) -> m40_status {
    guard(|| {
        handles::with_session(session as usize, |s| {
            s.reset_sampler();
            Ok(())
        })
    })
}

/// Keeps the first `n_keep` tokens and forgets the rest, and the logits with
/// them when any token is dropped (they no longer follow; `n_keep` equal to
/// `m40_session_n_past` changes nothing); `n_keep` above it is an argument
/// error.
#[no_mangle]
pub extern "C" fn m40_session_truncate(session: *mut m40_session, n_keep: u32) -> m40_status {
    guard(|| handles::with_session(session as usize, |s| s.truncate(n_keep as usize)))
}

/// Returns how many tokens the session holds (0 for an invalid handle, with
/// `m40_last_error` set).
#[no_mangle]
pub extern "C" fn m40_session_n_past(session: *const m40_session) -> u32 {
    guard_value(0, || {
        handles::with_session(session as usize, |s| Ok(s.n_past() as u32))
    })
}

/// Returns the bytes of memory the session's caches hold, on whichever
/// devices hold the model's layers: keys and values for `n_ctx` positions of
/// each attention layer, and each linear-attention layer's state (a hybrid
/// model's, whose size does not depend on `n_ctx`). 0 for an invalid handle,
/// with `m40_last_error` set.
#[no_mangle]
pub extern "C" fn m40_session_memory_bytes(session: *const m40_session) -> u64 {
    guard_value(0, || {
        handles::with_session(session as usize, |s| Ok(s.memory_bytes() as u64))
    })
}

/// Converts host token ids, rejecting negative ones.
fn token_ids(tokens: &[m40_token]) -> Result<Vec<u32>, Error> {
    tokens
        .iter()
        .enumerate()
        .map(|(i, &t)| {
            u32::try_from(t).map_err(|_| Error::invalid_argument(format!("token {i} is id {t}")))
        })
        .collect()
}

/// ==== 6. Decoding: tokens in, logits out ====
///
/// Appends `n_tokens` tokens (a whole prompt or one generated token) and
/// runs the model over them (a prompt in chunks of n_batch); afterwards
/// `m40_logits` holds the next-token logits. M40_ERR_CONTEXT_FULL when they
/// do not fit, M40_ERR_INVALID_ARGUMENT for an id outside the vocabulary;
/// a failed decode leaves the session as it was.
///
/// # Safety
/// `tokens` points to `n_tokens` readable tokens (`n_tokens` 0 is an
/// argument error: there is nothing to decode).
#[no_mangle]
pub unsafe extern "C" fn m40_decode(
    session: *mut m40_session,
    tokens: *const m40_token,
    n_tokens: usize,
) -> m40_status {
    // SAFETY: the caller's promise, forwarded.
    unsafe { decode_with(session, tokens, n_tokens, Session::decode) }
}

/// `m40_decode` and `m40_decode_no_logits`: the tokens checked, then `decode`.
///
/// # Safety
/// `tokens` points to `n_tokens` readable tokens.
unsafe fn decode_with(
    session: *mut m40_session,
    tokens: *const m40_token,
    n_tokens: usize,
    decode: fn(&mut Session, &[u32]) -> Result<()>,
) -> m40_status {
    guard(|| {
        // SAFETY: the caller's promise, forwarded.
        let tokens = token_ids(unsafe { args::slice(tokens, n_tokens, "tokens")? })?;
        handles::with_session(session as usize, |s| decode(s, &tokens))
    })
}

/// Appends `n_tokens` tokens as `m40_decode` does, but computes no
/// next-token logits: the model's output layer (for a large vocabulary, a
/// large share of a short chunk's time) is skipped, `m40_logits` is NULL
/// and `m40_sample` an argument error until the next `m40_decode`. For the
/// leading pieces of a prompt a host decodes a piece at a time between
/// other work (a server admitting a long prompt between decode steps); the
/// last piece goes through `m40_decode`. Errors and failure as `m40_decode`.
///
/// # Safety
/// As `m40_decode`.
#[no_mangle]
pub unsafe extern "C" fn m40_decode_no_logits(
    session: *mut m40_session,
    tokens: *const m40_token,
    n_tokens: usize,
) -> m40_status {
    // SAFETY: the caller's promise, forwarded.
    unsafe { decode_with(session, tokens, n_tokens, Session::decode_without_logits) }
}

/// Returns the session's next-token logits (`m40_model_n_vocab` floats),
/// valid until the session's next decode, reset, truncate or free; NULL
/// before the first decode, after a reset or a truncate that dropped
/// tokens, or for an invalid handle.
#[no_mangle]
pub extern "C" fn m40_logits(session: *const m40_session) -> *const f32 {
    guard_value(std::ptr::null(), || {
        handles::with_session(session as usize, |s| {
            Ok(s.logits().map_or(std::ptr::null(), <[f32]>::as_ptr))
        })
    })
}

/// One token for each of `n_sessions` sessions of the same model, in one
/// batched forward pass (the weights are read once for all of them); each
/// session's logits are then as if it had decoded its token alone. Each
/// session must have room for one token; on failure no session changes.
/// The same session may not appear twice.
///
/// Threads: the call holds every listed session for its duration, so none
/// of them may be in use by another call (M40_ERR_INVALID_ARGUMENT if one
/// is, and nothing changes). Other threads may meanwhile use other sessions
/// of the same model and the model itself; their work and the batch's
/// share the model's backend, which runs one operation (a parallel CPU
/// loop, a device call) at a time.
///
/// # Safety
/// `sessions` and `tokens` point to `n_sessions` readable elements each.
#[no_mangle]
pub unsafe extern "C" fn m40_decode_batch(
    sessions: *const *mut m40_session,
    tokens: *const m40_token,
    n_sessions: usize,
) -> m40_status {
    guard(|| {
        // SAFETY: the caller's promises, forwarded.
        let (handles_in, tokens) = unsafe { batch_args(sessions, tokens, n_sessions)? };
        with_batch(handles_in, |refs| Session::decode_batch(refs, &tokens))
    })
}

/// `m40_decode_batch`, then each session's next token sampled as
/// `m40_sample` with `params[i]` would pick it (NULL `params`: the defaults
/// for every session), written to `out_tokens[i]`; the tokens are not
/// decoded. The same tokens and random states as those two calls, but the
/// logits stay on the device that computed them: only what each sampler
/// needs comes back (its top_k best, or the greedy pick, and the logits of
/// the tokens its repetition penalty covers; the whole row when top_k is
/// off or above 1024 with a temperature above 0), so afterwards the
/// sessions hold no logits (`m40_logits` is NULL and `m40_sample` fails
/// until their next decode). On failure no session changes and nothing is
/// written to `out_tokens`. Threads: as `m40_decode_batch`.
///
/// # Safety
/// `sessions` and `tokens` point to `n_sessions` readable elements each;
/// `params` is NULL or points to `n_sessions` valid elements; `out_tokens`
/// points to `n_sessions` writable elements.
#[no_mangle]
pub unsafe extern "C" fn m40_decode_batch_sample(
    sessions: *const *mut m40_session,
    tokens: *const m40_token,
    n_sessions: usize,
    params: *const m40_sampler_params,
    out_tokens: *mut m40_token,
) -> m40_status {
    guard(|| {
        // SAFETY: the caller's promises, forwarded.
        let (handles_in, tokens) = unsafe { batch_args(sessions, tokens, n_sessions)? };
        let params: Vec<SamplerParams> = if params.is_null() {
            vec![m40_sampler_default_params().into(); n_sessions]
        } else {
            // SAFETY: the caller promises n_sessions elements.
            let given = unsafe { args::slice(params, n_sessions, "params")? };
            given.iter().map(|&p| p.into()).collect()
        };
        if out_tokens.is_null() {
            return Err(Error::invalid_argument("out_tokens is NULL"));
        }
        let next = with_batch(handles_in, |refs| {
            Session::decode_batch_sample(refs, &tokens, &params)
        })?;
        for (i, &t) in next.iter().enumerate() {
            // SAFETY: the caller promises n_sessions writable elements.
            *unsafe { args::out(out_tokens.add(i), "out_tokens")? } = t as m40_token;
        }
        Ok(())
    })
}

/// A batch call's session handles and token ids.
///
/// # Safety
/// `sessions` and `tokens` point to `n_sessions` readable elements each.
unsafe fn batch_args<'a>(
    sessions: *const *mut m40_session,
    tokens: *const m40_token,
    n_sessions: usize,
) -> Result<(&'a [*mut m40_session], Vec<u32>), Error> {
    // SAFETY: the caller's promises, forwarded.
    let (handles_in, tokens) = unsafe {
        (
            args::slice(sessions, n_sessions, "sessions")?,
            args::slice(tokens, n_sessions, "tokens")?,
        )
    };
    Ok((handles_in, token_ids(tokens)?))
}

/// Runs `f` on the batch's sessions, each held for the call: live, listed
/// once, and in use by no other call.
fn with_batch<T>(
    handles_in: &[*mut m40_session],
    f: impl FnOnce(&mut [&mut Session]) -> Result<T, Error>,
) -> Result<T, Error> {
    let mut addresses: Vec<usize> = handles_in.iter().map(|&p| p as usize).collect();
    let sessions = addresses
        .iter()
        .map(|&a| handles::session(a))
        .collect::<Result<Vec<_>, _>>()?;
    addresses.sort_unstable();
    if addresses.windows(2).any(|w| w[0] == w[1]) {
        return Err(Error::invalid_argument(
            "the same session appears twice in the batch",
        ));
    }
    let mut guards = Vec::with_capacity(sessions.len());
    for (i, s) in sessions.iter().enumerate() {
        guards.push(handles::lock(
            handles_in[i] as usize,
            s,
            &format!("sessions[{i}]"),
        )?);
    }
    let mut refs: Vec<&mut Session> = guards.iter_mut().map(|g| &mut **g).collect();
    f(&mut refs)
}

/// ==== 7. Sampling ====
///
/// Returns the default sampler: temperature 0.8, top_k 40, top_p 0.95,
/// min_p 0.05, repeat_penalty 1.0, repeat_last_n 64, seed 0.
#[no_mangle]
pub extern "C" fn m40_sampler_default_params() -> m40_sampler_params {
    let d = SamplerParams::default();
    m40_sampler_params {
        temperature: d.temperature,
        top_k: d.top_k,
        top_p: d.top_p,
        min_p: d.min_p,
        repeat_penalty: d.repeat_penalty,
        repeat_last_n: d.repeat_last_n,
        seed: d.seed,
    }
}

/// Picks the next token from the session's logits with `params` (NULL:
/// the defaults) and writes it to `*out_token`; it does not decode it.
/// The random state lives in the session: the same seed from the same state
/// gives the same tokens.
///
/// # Safety
/// `params` is NULL or valid; `out_token` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn m40_sample(
    session: *mut m40_session,
    params: *const m40_sampler_params,
    out_token: *mut m40_token,
) -> m40_status {
    guard(|| {
        // SAFETY: the caller's promises, forwarded.
        let (params, out_token) = unsafe {
            (
                args::struct_or_default(params, || m40_sampler_default_params()),
                args::out(out_token, "out_token")?,
            )
        };
        let token = handles::with_session(session as usize, |s| s.sample(&params.into()))?;
        *out_token = token as m40_token;
        Ok(())
    })
}

/// Called with each piece of generated text: `piece` holds `len` bytes of
/// whole UTF-8 characters (NUL-terminated for convenience) and `token` is the
/// token that completed it; only the last piece of a generation may end
/// inside a character (the token limit cut it, or the model produced bytes
/// that are not UTF-8). Return false to stop generating.
pub type m40_piece_fn = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        piece: *const c_char,
        len: usize,
        token: m40_token,
    ) -> bool,
>;

/// ==== 8. Generation ====
///
/// Tokenizes `prompt` (`prompt_len` bytes of UTF-8; when the session is
/// empty BOS and EOS are added as the model's metadata asks, as with
/// `m40_tokenize`'s `add_special`, and special tokens like
/// `<start_of_turn>` are parsed),
/// decodes it, then samples up to `max_tokens` tokens with `params` (NULL:
/// the defaults), decoding each into the session and passing its text to
/// `on_piece`. Stops at an end-of-generation token, after `max_tokens`, or
/// when `on_piece` returns false. The session keeps the prompt and the
/// generated tokens, so a later call continues the conversation.
/// M40_ERR_CONTEXT_FULL when the session fills up. Text goes to `on_piece`
/// in whole UTF-8 characters: when generation stops (context full, or
/// `on_piece` returned false) the bytes of a character still incomplete are
/// dropped; everything else generated was delivered.
///
/// `on_piece` runs on the calling thread while the session is held by this
/// call: from inside it, functions on the same session (decode, sample,
/// logits, n_past, reset, another generate, a batch with it) fail at once
/// with M40_ERR_INVALID_ARGUMENT, saying so, and change nothing; the
/// generation goes on. The model, the tokenizer and other sessions may be
/// used from inside it, even to generate with them. `m40_free` of the
/// session is allowed there too (see `m40_free`).
///
/// # Safety
/// `prompt` points to `prompt_len` readable bytes; `params` is NULL or valid;
/// `on_piece` is NULL or a function that may be called with `user_data`.
#[no_mangle]
pub unsafe extern "C" fn m40_generate(
    session: *mut m40_session,
    prompt: *const c_char,
    prompt_len: usize,
    params: *const m40_sampler_params,
    max_tokens: u32,
    on_piece: m40_piece_fn,
    user_data: *mut c_void,
) -> m40_status {
    guard(|| {
        // SAFETY: the caller's promises, forwarded.
        let (prompt, params) = unsafe {
            (
                args::utf8(prompt.cast(), prompt_len, "prompt")?,
                args::struct_or_default(params, || m40_sampler_default_params()),
            )
        };
        handles::with_session(session as usize, |s| {
            let mut text = Vec::new();
            s.generate(prompt, &params.into(), max_tokens, |piece, token| {
                let Some(callback) = on_piece else {
                    return true;
                };
                text.clear();
                text.extend_from_slice(piece);
                text.push(0);
                // SAFETY: the host's callback, with its own user_data and a
                // piece that lives for the call.
                unsafe {
                    callback(
                        user_data,
                        text.as_ptr().cast(),
                        piece.len(),
                        token as m40_token,
                    )
                }
            })?;
            Ok(())
        })
    })
}
