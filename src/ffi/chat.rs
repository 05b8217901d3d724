//! Chat templates: a conversation as the prompt text the model was trained on.

use std::ffi::c_char;

use super::args;
use super::handles;
use super::m40_model;
use super::m40_token;
use super::status::{guard, m40_status};
use crate::chat::{ChatMessage, ChatPrompt};
use crate::error::{Error, Result};
use crate::model::Model;

/// One message of a conversation: `role` is "system", "user" or
/// "assistant" ("developer" too where the format has it: gpt-oss, gemma4);
/// both are NUL-terminated UTF-8.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct m40_chat_message {
    pub role: *const c_char,
    pub content: *const c_char,
}

/// The C messages formatted with the model's chat template.
///
/// # Safety
/// `messages` is NULL (with `n_messages` 0) or points to `n_messages`
/// messages whose strings are NUL-terminated.
unsafe fn render(
    model: &Model,
    messages: *const m40_chat_message,
    n_messages: usize,
    add_assistant: bool,
) -> Result<ChatPrompt> {
    let template = model.chat_template()?;
    // SAFETY: the caller's promises, forwarded.
    let raw = unsafe { args::slice(messages, n_messages, "messages")? };
    // SAFETY: as above.
    let messages = unsafe { chat_messages(raw, template.roles())? };
    Ok(template.render(&messages, add_assistant))
}

/// The messages of the C array, checked: UTF-8 text and one of `roles`.
///
/// # Safety
/// Every message's strings are NUL-terminated (and outlive the result).
unsafe fn chat_messages<'a>(
    raw: &'a [m40_chat_message],
    roles: &[&str],
) -> Result<Vec<ChatMessage<'a>>> {
    raw.iter()
        .enumerate()
        .map(|(i, m)| {
            let at = |field: &str| format!("messages[{i}].{field}");
            // SAFETY: the caller promises NUL-terminated strings.
            let role = unsafe { args::c_text(m.role, &at("role"))? };
            // SAFETY: as above.
            let content = unsafe { args::c_text(m.content, &at("content"))? };
            if !roles.contains(&role) {
                return Err(Error::invalid_argument(format!(
                    "{} is {role:?}; this model's chat format takes the roles {}",
                    at("role"),
                    roles.join(", ")
                )));
            }
            Ok(ChatMessage { role, content })
        })
        .collect()
}

/// ==== 9. Chat templates ====
///
/// Writes the prompt text of `n_messages` messages as the model's chat
/// template formats them, followed by the opening of the assistant's turn
/// when `add_assistant` (the text to generate a reply after). Like
/// llama.cpp's `llama_chat_apply_template`, the template in the model's
/// `tokenizer.chat_template` is recognized rather than executed, by its
/// markers, as one of these formats (llama.cpp's but gemma4): "chatml"
/// (`<|im_start|>`), "qwen3" (Qwen3's ChatML template: a reply's
/// `<think>...</think>` is dropped from turns before the last user message,
/// as that template does; the assistant's turn opens with
/// `<|im_start|>assistant\n` alone, so the model's reply may begin with its
/// reasoning), "gemma" (`<start_of_turn>`), "llama3"
/// (`<|start_header_id|>`), the `[INST]` formats of Mistral and LLaMA 2
/// ("mistral-v1", Mixtral's, "mistral-v3", "mistral-v3-tekken",
/// "mistral-v7", "llama2", "llama2-sys", "llama2-sys-bos",
/// "llama2-sys-strip"), where a user message ends with `[/INST]` and
/// `add_assistant` adds nothing, "gpt-oss" (OpenAI's harmony, `<|start|>`
/// and `<|channel|>`, as llama.cpp writes it: `<|start|>role<|message|>`,
/// `<|end|>` after a message, `<|return|>` after a reply, the assistant's
/// turn opened with `<|start|>assistant`), and "gemma4" (`<|turn>`: not one
/// of llama.cpp's; its template's text: `<|turn>role\n`, the assistant
/// "model", messages trimmed, a reply's thinking dropped, the assistant's
/// turn opened with thinking off,
/// `<|turn>model\n<|channel>thought\n<channel|>`). Roles are "system",
/// "user" and "assistant", and "developer" for gpt-oss and gemma4. A model
/// without a template gets its architecture's (Gemma 3: gemma, Qwen2:
/// chatml, Qwen3 and Qwen3 MoE: qwen3, gpt-oss: gpt-oss, Gemma 4: gemma4,
/// LLaMA: llama3 when its vocabulary has the header tokens). Any other
/// template is M40_ERR_UNSUPPORTED. No format writes BOS (tokenizing with
/// `add_special` adds it); the text contains the formats' special tokens as
/// text: tokenize it with `parse_special` (as `m40_generate` does), or,
/// when the messages come from people or programs that must not write the
/// conversation's markup, use `m40_chat_tokenize` instead.
/// `m40_model_describe` names the format (`chat_template`).
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
        // SAFETY: the caller's promises, forwarded.
        let prompt = unsafe { render(&model, messages, n_messages, add_assistant)? };
        // SAFETY: as above.
        unsafe { args::write_text(prompt.text.as_bytes(), buf, cap, out_len) }
    })
}

/// The tokens of `n_messages` messages as the model's chat template formats
/// them (`m40_chat_apply_template`, with `add_assistant` the same), BOS
/// added as `m40_tokenize`'s `add_special` adds it. Special tokens are
/// parsed in the template's own markup only: text inside a message is never
/// tokenized as a control token or an end-of-generation token, so a message
/// holding `<end_of_turn>` or `<|im_end|>` cannot close its turn and forge
/// another one (user-defined tokens, which `m40_tokenize` recognises even
/// without `parse_special`, are recognised in messages too, except those
/// the file makes control tokens and llama.cpp renders as text: gpt-oss's
/// `<|start|>`, `<|message|>`, `<|channel|>`, `<|constrain|>`, `<|end|>`).
/// Messages without such text give exactly the tokens of the template's
/// text tokenized with `add_special` and `parse_special`.
///
/// Writes the tokens to `out_tokens` (room for `cap`) and their number to
/// `*out_n`. When `cap` is too small nothing is written to `out_tokens`,
/// `*out_n` gets the number needed and the result is
/// M40_ERR_BUFFER_TOO_SMALL; `out_tokens` may be NULL when `cap` is 0 (a
/// size query).
///
/// # Safety
/// `messages` is NULL (with `n_messages` 0) or points to `n_messages`
/// messages whose strings are NUL-terminated; `out_tokens` is NULL or points
/// to `cap` writable tokens; `out_n` is writable (NULL is
/// M40_ERR_INVALID_ARGUMENT).
#[no_mangle]
pub unsafe extern "C" fn m40_chat_tokenize(
    model: *const m40_model,
    messages: *const m40_chat_message,
    n_messages: usize,
    add_assistant: bool,
    out_tokens: *mut m40_token,
    cap: usize,
    out_n: *mut usize,
) -> m40_status {
    guard(|| {
        let model = handles::model(model as usize)?;
        // SAFETY: the caller's promises, forwarded.
        let prompt = unsafe { render(&model, messages, n_messages, add_assistant)? };
        let tokens = model
            .tokenizer()
            .tokenize_chat(&prompt.text, true, &prompt.content)?;
        // SAFETY: the caller's promises, forwarded.
        unsafe { super::tokenizer::write_tokens(&tokens, out_tokens, cap, out_n) }
    })
}
