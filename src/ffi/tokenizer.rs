//! Tokenizer functions: text to tokens, tokens to text, the special tokens.
//! All of them work on any model handle, a `vocab_only` one included.

use std::ffi::c_char;

use super::args;
use super::handles;
use super::m40_model;
use super::m40_token;
use super::status::{guard, guard_value, m40_status};
use crate::error::{Error, ErrorKind, Result};

/// Writes `tokens` to `out_tokens` (room for `cap`) and their number to
/// `*out_n`; when they do not fit, only the number, and BUFFER_TOO_SMALL.
///
/// # Safety
/// `out_tokens` is NULL or points to `cap` writable tokens; `out_n` is NULL
/// (an argument error) or writable.
pub(super) unsafe fn write_tokens(
    tokens: &[u32],
    out_tokens: *mut m40_token,
    cap: usize,
    out_n: *mut usize,
) -> Result<()> {
    // SAFETY: the caller's promise.
    let out_n = unsafe { args::out(out_n, "out_n")? };
    if out_tokens.is_null() && cap > 0 {
        return Err(Error::invalid_argument(format!(
            "out_tokens is NULL but cap is {cap}"
        )));
    }
    *out_n = tokens.len();
    if tokens.len() > cap {
        return Err(Error::new(
            ErrorKind::BufferTooSmall,
            format!(
                "the text has {} tokens, out_tokens holds {cap}",
                tokens.len()
            ),
        ));
    }
    for (i, &token) in tokens.iter().enumerate() {
        // SAFETY: i < cap, and the caller promises `cap` writable tokens.
        *unsafe { args::out(out_tokens.add(i), "out_tokens")? } = token as m40_token;
    }
    Ok(())
}

fn token_id(token: m40_token, n_vocab: u32) -> Result<u32> {
    u32::try_from(token)
        .ok()
        .filter(|&t| t < n_vocab)
        .ok_or_else(|| {
            Error::invalid_argument(format!(
                "token {token} is out of range (the vocabulary has {n_vocab} tokens)"
            ))
        })
}

/// ==== 4. The tokenizer ====
///
/// Tokenizes `text_len` bytes of UTF-8 text at `text` (not necessarily
/// NUL-terminated; NULL is allowed when `text_len` is 0) with the model's
/// tokenizer, as llama.cpp's `llama_tokenize` does: the same ids for the
/// same GGUF file.
///
/// `add_special`: add BOS (and EOS) as the model's metadata asks
/// (`tokenizer.ggml.add_bos_token` / `add_eos_token` and the tokenizer's
/// defaults). `parse_special`: recognise control tokens such as
/// `<start_of_turn>` or `<|im_end|>` written in the text as those single
/// tokens; without it they are tokenized as plain text (user-defined tokens
/// are recognised either way, as in llama.cpp).
///
/// Writes the tokens to `out_tokens` (room for `cap`) and their number to
/// `*out_n`. When `cap` is too small nothing is written to `out_tokens`,
/// `*out_n` gets the number needed and the result is
/// M40_ERR_BUFFER_TOO_SMALL; `out_tokens` may be NULL when `cap` is 0 (a
/// size query). Text that is not valid UTF-8 gives M40_ERR_INVALID_ARGUMENT.
/// Thread-safe: any number of threads may tokenize with one model.
///
/// # Safety
/// `text` is NULL or points to `text_len` readable bytes; `out_tokens` is
/// NULL or points to `cap` writable tokens; `out_n` is writable (NULL is
/// M40_ERR_INVALID_ARGUMENT).
#[no_mangle]
pub unsafe extern "C" fn m40_tokenize(
    model: *const m40_model,
    text: *const c_char,
    text_len: usize,
    add_special: bool,
    parse_special: bool,
    out_tokens: *mut m40_token,
    cap: usize,
    out_n: *mut usize,
) -> m40_status {
    guard(|| {
        let model = handles::model(model as usize)?;
        // SAFETY: the caller's promises, forwarded.
        let text = unsafe { args::utf8(text.cast::<u8>(), text_len, "text")? };
        let tokens = model
            .tokenizer()
            .tokenize(text, add_special, parse_special)?;
        // SAFETY: the caller's promises, forwarded.
        unsafe { write_tokens(&tokens, out_tokens, cap, out_n) }
    })
}

/// Writes the text of one token into `buf` as llama.cpp's
/// `llama_token_to_piece(model, token, buf, cap, 0, true)` renders it:
/// special tokens (`<bos>`, `<end_of_turn>`, ...) as their text, `▁` as a
/// space, a byte token `<0xXX>` as that single byte — which may be one byte
/// of a multi-byte UTF-8 character, so concatenate pieces before decoding
/// them. No leading space is removed.
///
/// The bytes are followed by a NUL; `*out_len` (when not NULL) gets their
/// number without it. When `cap` is too small nothing is written to `buf`,
/// `*out_len` gets the length and the result is M40_ERR_BUFFER_TOO_SMALL
/// (call again with at least `*out_len + 1` bytes); `buf` may be NULL when
/// `cap` is 0. A token outside the vocabulary gives M40_ERR_INVALID_ARGUMENT.
///
/// # Safety
/// `buf` is NULL or holds `cap` writable bytes; `out_len` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn m40_token_to_piece(
    model: *const m40_model,
    token: m40_token,
    buf: *mut c_char,
    cap: usize,
    out_len: *mut usize,
) -> m40_status {
    guard(|| {
        let model = handles::model(model as usize)?;
        let tokenizer = model.tokenizer();
        let id = token_id(token, tokenizer.n_vocab())?;
        let piece = tokenizer.token_to_piece(id, 0, true)?;
        // SAFETY: the caller's promises, forwarded.
        unsafe { args::write_text(piece, buf, cap, out_len) }
    })
}

/// Writes the text of `n_tokens` tokens into `buf` as llama.cpp's
/// `llama_detokenize(model, tokens, n_tokens, buf, cap, false, false)` does
/// (`remove_special` and `unparse_special` false): control tokens such as
/// BOS render as nothing; for a tokenizer that prefixes a space
/// (SentencePiece with `add_space_prefix`), the first token loses one
/// leading space; BPE tokenizers that ask for it get llama.cpp's clean-up of
/// spaces before punctuation. So `m40_detokenize(m40_tokenize(s))` gives
/// back `s` for most text. The bytes are raw (byte tokens are reassembled
/// into UTF-8, but a model can produce invalid sequences).
///
/// The text is followed by a NUL; `*out_len` (when not NULL) gets its length
/// without it. When `cap` is too small nothing is written to `buf`,
/// `*out_len` gets the length and the result is M40_ERR_BUFFER_TOO_SMALL;
/// `buf` may be NULL when `cap` is 0. A token outside the vocabulary gives
/// M40_ERR_INVALID_ARGUMENT.
///
/// # Safety
/// `tokens` is NULL (with `n_tokens` 0) or points to `n_tokens` readable
/// tokens; `buf` is NULL or holds `cap` writable bytes; `out_len` is NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn m40_detokenize(
    model: *const m40_model,
    tokens: *const m40_token,
    n_tokens: usize,
    buf: *mut c_char,
    cap: usize,
    out_len: *mut usize,
) -> m40_status {
    guard(|| {
        let model = handles::model(model as usize)?;
        let tokenizer = model.tokenizer();
        // SAFETY: the caller's promises, forwarded.
        let tokens = unsafe { args::slice(tokens, n_tokens, "tokens")? };
        let ids = tokens
            .iter()
            .enumerate()
            .map(|(i, &t)| {
                token_id(t, tokenizer.n_vocab()).map_err(|e| e.context(format!("tokens[{i}]")))
            })
            .collect::<Result<Vec<u32>>>()?;
        let text = tokenizer.detokenize(&ids, false, false)?;
        // SAFETY: the caller's promises, forwarded.
        unsafe { args::write_text(&text, buf, cap, out_len) }
    })
}

/// The model's beginning-of-sequence token, or -1 when it has none (or
/// `model` is not a live model handle; then `m40_last_error` says so).
#[no_mangle]
pub extern "C" fn m40_token_bos(model: *const m40_model) -> m40_token {
    guard_value(-1, || {
        let model = handles::model(model as usize)?;
        Ok(model.tokenizer().bos().map_or(-1, |t| t as m40_token))
    })
}

/// The model's end-of-sequence token, or -1 when it has none (or `model` is
/// not a live model handle; then `m40_last_error` says so).
#[no_mangle]
pub extern "C" fn m40_token_eos(model: *const m40_model) -> m40_token {
    guard_value(-1, || {
        let model = handles::model(model as usize)?;
        Ok(model.tokenizer().eos().map_or(-1, |t| t as m40_token))
    })
}

/// Whether generating `token` should end the generation: EOS, EOT, EOM and
/// every token llama.cpp recognises as end-of-generation by its text
/// (`<end_of_turn>`, `<|eot_id|>`, `<|im_end|>`, `<|endoftext|>`, ...).
/// False for other tokens, and for a token outside the vocabulary or a
/// `model` that is not a live model handle (then `m40_last_error` says so).
#[no_mangle]
pub extern "C" fn m40_token_is_eog(model: *const m40_model, token: m40_token) -> bool {
    guard_value(false, || {
        let model = handles::model(model as usize)?;
        let tokenizer = model.tokenizer();
        Ok(tokenizer.is_eog(token_id(token, tokenizer.n_vocab())?))
    })
}
