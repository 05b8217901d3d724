//! `m40_chat_apply_template` through the C API: which format a model gets
//! (its `tokenizer.chat_template` recognized, or its architecture's), what
//! each writes (compared with llama.cpp's tests/test-chat-template.cpp
//! outputs in src/chat.rs; here through the ABI), and argument errors.

mod common;

use std::ffi::{c_char, CStr, CString};
use std::path::Path;

use common::gguf_writer::Meta;
use common::tiny_model::tiny_model;
use m40llm::ffi::*;

fn load(path: &Path) -> *mut m40_model {
    let c_path = CString::new(path.to_str().unwrap()).unwrap();
    let mut params = m40_model_default_params();
    params.vocab_only = true;
    let mut model = std::ptr::null_mut();
    let status = unsafe { m40_model_load(c_path.as_ptr(), &params, &mut model) };
    assert_eq!(status, m40_status::M40_OK, "{}", last_error());
    model
}

/// A tiny model with `template` as its tokenizer.chat_template (or none).
fn tiny_with_template(name: &str, template: Option<&str>) -> *mut m40_model {
    let mut writer = tiny_model("llama");
    if let Some(t) = template {
        writer = writer.kv("tokenizer.chat_template", Meta::str(t));
    }
    let path = common::scratch_path(&format!("chat-{name}.gguf"));
    std::fs::write(&path, writer.build()).unwrap();
    load(&path)
}

fn last_error() -> String {
    unsafe { CStr::from_ptr(m40_last_error()) }
        .to_string_lossy()
        .into_owned()
}

/// The template's text for (role, content) pairs, with the size query first.
fn apply(
    model: *const m40_model,
    messages: &[(&str, &str)],
    add_assistant: bool,
) -> Result<String, (m40_status, String)> {
    let owned: Vec<(CString, CString)> = messages
        .iter()
        .map(|(r, c)| (CString::new(*r).unwrap(), CString::new(*c).unwrap()))
        .collect();
    let raw: Vec<m40_chat_message> = owned
        .iter()
        .map(|(r, c)| m40_chat_message {
            role: r.as_ptr(),
            content: c.as_ptr(),
        })
        .collect();
    let call = |buf: *mut c_char, cap: usize, len: &mut usize| unsafe {
        m40_chat_apply_template(model, raw.as_ptr(), raw.len(), add_assistant, buf, cap, len)
    };
    let mut len = 0usize;
    let status = call(std::ptr::null_mut(), 0, &mut len);
    if status != m40_status::M40_ERR_BUFFER_TOO_SMALL {
        return Err((status, last_error()));
    }
    let mut buf = vec![0 as c_char; len + 1];
    let status = call(buf.as_mut_ptr(), buf.len(), &mut len);
    assert_eq!(status, m40_status::M40_OK, "{}", last_error());
    Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_str()
        .unwrap()
        .to_string())
}

fn describe(model: *const m40_model) -> String {
    let mut len = 0;
    unsafe { m40_model_describe(model, std::ptr::null_mut(), 0, &mut len) };
    let mut buf = vec![0 as c_char; len + 1];
    unsafe { m40_model_describe(model, buf.as_mut_ptr(), buf.len(), &mut len) };
    unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_str()
        .unwrap()
        .to_string()
}

const TURNS: [(&str, &str); 3] = [
    ("system", "Be brief."),
    ("user", "Hi"),
    ("assistant", " Hello "),
];

#[test]
fn a_recognized_template_formats_the_conversation() {
    let chatml = tiny_with_template("chatml", Some("{% for m in messages %}{{'<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n'}}{% endfor %}"));
    assert_eq!(
        apply(chatml, &TURNS, true).unwrap(),
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n Hello <|im_end|>\n<|im_start|>assistant\n"
    );
    assert!(describe(chatml).contains("\"chat_template\":\"chatml\""));

    let llama3 = tiny_with_template(
        "llama3",
        Some("{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"),
    );
    assert_eq!(
        apply(llama3, &TURNS[1..], false).unwrap(),
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHello<|eot_id|>"
    );
    assert_eq!(apply(llama3, &[], false).unwrap(), "");
    for m in [chatml, llama3] {
        m40_free(m.cast());
    }
}

#[test]
fn gemma_gets_its_architectures_template_and_the_special_tokens_parse() {
    let path = common::gemma_path();
    let model = load(&path);
    let description = describe(model);
    assert!(
        description.contains("\"chat_template\":\"gemma\""),
        "{description}"
    );
    let text = apply(model, &TURNS, true).unwrap();
    assert_eq!(
        text,
        "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello<end_of_turn>\n<start_of_turn>model\n"
    );
    // Tokenized with parse_special, the markers are single control tokens.
    let mut n = 0usize;
    let mut tokens = vec![0 as m40_token; 64];
    let status = unsafe {
        m40_tokenize(
            model,
            text.as_ptr().cast(),
            text.len(),
            true,
            true,
            tokens.as_mut_ptr(),
            tokens.len(),
            &mut n,
        )
    };
    assert_eq!(status, m40_status::M40_OK, "{}", last_error());
    let start_of_turn = tokens[1];
    assert_eq!(
        tokens[..n].iter().filter(|&&t| t == start_of_turn).count(),
        3
    );
    // <end_of_turn> ends a generation.
    let end_of_turn = tokens[..n]
        .iter()
        .position(|&t| t != start_of_turn && m40_token_is_eog(model, t));
    assert!(end_of_turn.is_some(), "{:?}", &tokens[..n]);
    m40_free(model.cast());
}

#[test]
fn models_without_a_usable_template_and_bad_messages_are_errors() {
    let none = tiny_with_template("none", None);
    let (status, message) = apply(none, &TURNS, true).unwrap_err();
    assert_eq!(status, m40_status::M40_ERR_UNSUPPORTED);
    assert!(message.contains("no chat template"), "{message}");
    assert!(describe(none).contains("\"chat_template\":null"));

    let unknown = tiny_with_template("unknown", Some("{{ messages | tojson }}"));
    let (status, message) = apply(unknown, &TURNS, true).unwrap_err();
    assert_eq!(status, m40_status::M40_ERR_UNSUPPORTED);
    assert!(message.contains("chatml, gemma, llama3"), "{message}");

    let chatml = tiny_with_template("chatml-errors", Some("<|im_start|>"));
    let (status, message) = apply(chatml, &[("robot", "beep")], true).unwrap_err();
    assert_eq!(status, m40_status::M40_ERR_INVALID_ARGUMENT);
    assert!(message.contains("messages[0].role"), "{message}");
    let null_role = [m40_chat_message {
        role: std::ptr::null(),
        content: c"x".as_ptr(),
    }];
    let mut len = 0;
    let status = unsafe {
        m40_chat_apply_template(
            chatml,
            null_role.as_ptr(),
            1,
            true,
            std::ptr::null_mut(),
            0,
            &mut len,
        )
    };
    assert_eq!(status, m40_status::M40_ERR_INVALID_ARGUMENT);
    assert!(
        last_error().contains("messages[0].role is NULL"),
        "{}",
        last_error()
    );
    let status = unsafe {
        m40_chat_apply_template(
            chatml,
            std::ptr::null(),
            3,
            true,
            std::ptr::null_mut(),
            0,
            &mut len,
        )
    };
    assert_eq!(status, m40_status::M40_ERR_INVALID_ARGUMENT);
    for m in [none, unknown, chatml] {
        m40_free(m.cast());
    }
}
