//! Chat templates: a conversation as the prompt text the model was trained on.

use std::ffi::c_char;

use super::args;
use super::handles;
use super::m40_model;
use super::status::{guard, m40_status};
use crate::chat::ChatMessage;
use crate::error::{Error, Result};

/// One message of a conversation: `role` is "system", "user" or
/// "assistant"; both are NUL-terminated UTF-8.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct m40_chat_message {
    pub role: *const c_char,
    pub content: *const c_char,
}

/// ==== 9. Chat templates ====
///
/// Writes the prompt text of `n_messages` messages as the model's chat
/// template formats them, followed by the opening of the assistant's turn
/// when `add_assistant` (the text to generate a reply after). Like
/// llama.cpp's `llama_chat_apply_template`, the template in the model's
/// `tokenizer.chat_template` is recognized rather than executed, by its
/// markers, as one of llama.cpp's formats: "chatml" (`<|im_start|>`),
/// "qwen3" (Qwen3's ChatML template: a reply's `<think>...</think>` is
/// dropped from turns before the last user message, as that template does;
/// the assistant's turn opens with `<|im_start|>assistant\n` alone, so the
/// model's reply may begin with its reasoning), "gemma" (`<start_of_turn>`),
/// "llama3" (`<|start_header_id|>`), and the `[INST]` formats of Mistral
/// and LLaMA 2 ("mistral-v1", Mixtral's, "mistral-v3", "mistral-v3-tekken",
/// "mistral-v7", "llama2", "llama2-sys", "llama2-sys-bos",
/// "llama2-sys-strip"), where a user message ends with `[/INST]` and
/// `add_assistant` adds nothing. A model without a template gets its
/// architecture's (Gemma 3: gemma, Qwen2: chatml, Qwen3 and Qwen3 MoE:
/// qwen3, LLaMA: llama3 when its vocabulary has the header tokens). Any
/// other template is M40_ERR_UNSUPPORTED. No format writes BOS (tokenizing
/// with `add_special` adds it); the text contains the formats' special
/// tokens as text: tokenize it with `parse_special` (as `m40_generate`
/// does). `m40_model_describe` names the format (`chat_template`).
///
/// The text is followed by a NUL; `*out_len` (when not NULL) gets its length
/// without it. When `cap` is too small nothing is written, `*out_len` gets
/// the length and the result is M40_ERR_BUFFER_TOO_SMALL; `buf` may be NULL
/// when `cap` is 0.
///
/// # Safety
/// `messages` is NULL (with `n_messages` 0) or points to `n_messages`
/// messages whose strings are NUL-terminated; `buf` is NULL or holds `cap`
/// writable bytes; `out_len` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn m40_chat_apply_template(
    model: *const m40_model,
    messages: *const m40_chat_message,
    n_messages: usize,
    add_assistant: bool,
    buf: *mut c_char,
    cap: usize,
    out_len: *mut usize,
) -> m40_status {
    guard(|| {
        let model = handles::model(model as usize)?;
        let template = model.chat_template()?;
        // SAFETY: the caller's promises, forwarded.
        let raw = unsafe { args::slice(messages, n_messages, "messages")? };
        let messages = raw
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let at = |field: &str| format!("messages[{i}].{field}");
                // SAFETY: the caller promises NUL-terminated strings.
                let role = unsafe { args::c_text(m.role, &at("role"))? };
                // SAFETY: as above.
                let content = unsafe { args::c_text(m.content, &at("content"))? };
                if !["system", "user", "assistant"].contains(&role) {
                    return Err(Error::invalid_argument(format!(
                        "{} is {role:?}; roles are \"system\", \"user\" and \"assistant\"",
                        at("role")
                    )));
                }
                Ok(ChatMessage { role, content })
            })
            .collect::<Result<Vec<_>>>()?;
        let text = template.apply(&messages, add_assistant);
        // SAFETY: the caller's promises, forwarded.
        unsafe { args::write_text(text.as_bytes(), buf, cap, out_len) }
    })
}
