//! Chat templates: a conversation of (role, content) messages as the prompt
//! text a chat model was trained on. Like llama.cpp's
//! `llama_chat_apply_template`, the model's `tokenizer.chat_template` (a
//! Jinja template) is not executed but recognized by its marker strings as
//! one of the formats below; a model without one gets its architecture's
//! format. Expected outputs in the tests are llama.cpp's own
//! (tests/test-chat-template.cpp).

use crate::error::{Error, Result};
use crate::gguf::GgufFile;
use crate::tokenizer::Tokenizer;

/// The formats recognized.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChatTemplate {
    /// `<|im_start|>role\ncontent<|im_end|>\n` (Qwen2 and many others).
    ChatMl,
    /// `<start_of_turn>user\ncontent<end_of_turn>\n`, the assistant called
    /// "model" and a system message merged into the next user turn (Gemma).
    Gemma,
    /// `<|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|>` (LLaMA 3).
    Llama3,
}

/// One message of a conversation.
#[derive(Clone, Copy, Debug)]
pub struct ChatMessage<'a> {
    /// "system", "user" or "assistant".
    pub role: &'a str,
    pub content: &'a str,
}

impl ChatTemplate {
    /// The format a Jinja chat template writes, by its markers.
    pub fn recognize(template: &str) -> Option<ChatTemplate> {
        if template.contains("<|im_start|>") {
            Some(ChatTemplate::ChatMl)
        } else if template.contains("<start_of_turn>") {
            Some(ChatTemplate::Gemma)
        } else if template.contains("<|start_header_id|>") && template.contains("<|end_header_id|>")
        {
            Some(ChatTemplate::Llama3)
        } else {
            None
        }
    }

    /// The format of a model's file: its `tokenizer.chat_template`
    /// recognized, or, without one, the default of its architecture (named
    /// as in `general.architecture`; LLaMA: LLaMA 3 when the vocabulary has
    /// its header tokens). `Model::chat_template` asks this of a model.
    pub fn detect(
        gguf: &GgufFile,
        architecture: &str,
        tokenizer: &Tokenizer,
    ) -> Result<ChatTemplate> {
        if let Some(entry) = gguf.get("tokenizer.chat_template") {
            let template = entry.str()?;
            return ChatTemplate::recognize(template).ok_or_else(|| {
                Error::unsupported(format!(
                    "the model's chat template is none of the recognized formats ({}); it begins {:?}",
                    Self::NAMES.join(", "),
                    template.chars().take(60).collect::<String>()
                ))
            });
        }
        let llama3_tokens = tokenizer.find_token("<|start_header_id|>").is_some();
        // By name: a vocab-only load has no parsed architecture.
        match architecture {
            "gemma3" => Ok(ChatTemplate::Gemma),
            "qwen2" | "qwen3" | "qwen3moe" => Ok(ChatTemplate::ChatMl),
            "llama" if llama3_tokens => Ok(ChatTemplate::Llama3),
            _ => Err(Error::unsupported(format!(
                "the model has no chat template (tokenizer.chat_template) and '{}' has no default one",
                crate::error::echo(architecture)
            ))),
        }
    }

    const NAMES: [&'static str; 3] = ["chatml", "gemma", "llama3"];

    pub fn name(self) -> &'static str {
        match self {
            ChatTemplate::ChatMl => Self::NAMES[0],
            ChatTemplate::Gemma => Self::NAMES[1],
            ChatTemplate::Llama3 => Self::NAMES[2],
        }
    }

    /// The prompt text of `messages`, ending with the assistant's turn
    /// opened when `add_assistant` (the text to generate a reply after).
    pub fn apply(self, messages: &[ChatMessage], add_assistant: bool) -> String {
        let mut out = String::new();
        match self {
            ChatTemplate::ChatMl => {
                for m in messages {
                    out += &format!("<|im_start|>{}\n{}<|im_end|>\n", m.role, m.content);
                }
                if add_assistant {
                    out += "<|im_start|>assistant\n";
                }
            }
            ChatTemplate::Gemma => {
                // Gemma has no system role: its text opens the next user turn.
                let mut system = String::new();
                for m in messages {
                    if m.role == "system" {
                        system += trim(m.content);
                        continue;
                    }
                    let role = if m.role == "assistant" {
                        "model"
                    } else {
                        m.role
                    };
                    out += &format!("<start_of_turn>{role}\n");
                    if !system.is_empty() && role != "model" {
                        out += &format!("{system}\n\n");
                        system.clear();
                    }
                    out += &format!("{}<end_of_turn>\n", trim(m.content));
                }
                if add_assistant {
                    out += "<start_of_turn>model\n";
                }
            }
            ChatTemplate::Llama3 => {
                for m in messages {
                    out += &format!(
                        "<|start_header_id|>{}<|end_header_id|>\n\n{}<|eot_id|>",
                        m.role,
                        trim(m.content)
                    );
                }
                if add_assistant {
                    out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
                }
            }
        }
        out
    }
}

/// `s` without leading and trailing whitespace as llama.cpp trims it (C's
/// `isspace`: ASCII only, vertical tab included), not Unicode's.
fn trim(s: &str) -> &str {
    s.trim_matches(|c| matches!(c, ' ' | '\t' | '\n' | '\x0B' | '\x0C' | '\r'))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// llama.cpp's test conversation.
    const CONVERSATION: [(&str, &str); 6] = [
        ("system", "You are a helpful assistant"),
        ("user", "Hello"),
        ("assistant", "Hi there"),
        ("user", "Who are you"),
        ("assistant", "   I am an assistant   "),
        ("user", "Another question"),
    ];

    fn conversation() -> Vec<ChatMessage<'static>> {
        CONVERSATION
            .iter()
            .map(|&(role, content)| ChatMessage { role, content })
            .collect()
    }

    #[test]
    fn each_format_writes_what_llama_cpp_writes() {
        let cases = [
            (
                "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
                ChatTemplate::ChatMl,
                "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\nHi there<|im_end|>\n<|im_start|>user\nWho are you<|im_end|>\n<|im_start|>assistant\n   I am an assistant   <|im_end|>\n<|im_start|>user\nAnother question<|im_end|>\n<|im_start|>assistant\n",
            ),
            (
                "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}",
                ChatTemplate::Gemma,
                "<start_of_turn>user\nYou are a helpful assistant\n\nHello<end_of_turn>\n<start_of_turn>model\nHi there<end_of_turn>\n<start_of_turn>user\nWho are you<end_of_turn>\n<start_of_turn>model\nI am an assistant<end_of_turn>\n<start_of_turn>user\nAnother question<end_of_turn>\n<start_of_turn>model\n",
            ),
            (
                "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' %}",
                ChatTemplate::Llama3,
                "<|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHi there<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWho are you<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nI am an assistant<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nAnother question<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
            ),
        ];
        for (jinja, format, expected) in cases {
            assert_eq!(ChatTemplate::recognize(jinja), Some(format));
            assert_eq!(
                format.apply(&conversation(), true),
                expected,
                "{}",
                format.name()
            );
            // Without the assistant's turn: the same text up to it.
            let closed = format.apply(&conversation(), false);
            assert!(expected.starts_with(&closed) && closed.len() < expected.len());
        }
        assert_eq!(ChatTemplate::recognize("{{ messages }}"), None);
    }

    #[test]
    fn messages_are_trimmed_as_llama_cpp_trims_them() {
        // C's isspace: ASCII whitespace with the vertical tab, nothing else.
        let text = " \t\x0B\u{3000}Hi\u{a0}\x0C\r\n";
        let message = [ChatMessage {
            role: "user",
            content: text,
        }];
        assert_eq!(
            ChatTemplate::Llama3.apply(&message, false),
            "<|start_header_id|>user<|end_header_id|>\n\n\u{3000}Hi\u{a0}<|eot_id|>"
        );
    }
}
