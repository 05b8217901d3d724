//! Chat templates: a conversation of (role, content) messages as the prompt
//! text a chat model was trained on. Like llama.cpp's
//! `llama_chat_apply_template`, the model's `tokenizer.chat_template` (a
//! Jinja template) is not executed but recognized by its marker strings as
//! one of the formats below; a model without one gets its architecture's
//! format. Expected outputs in the tests are llama.cpp's own
//! (tests/test-chat-template.cpp, or `llama_chat_apply_template` itself for
//! gpt-oss), or, where llama.cpp has none (Qwen3's reasoning, Gemma 4), the
//! model's template rendered by Jinja2.
//!
//! No format writes BOS: the tokenizer adds it (`add_special`), as with
//! llama.cpp. The text holds the formats' special tokens (`<|im_start|>`,
//! `</s>`, ...) as text, for a tokenizer that parses special tokens.

use std::ops::Range;

use crate::error::{Error, Result};
use crate::gguf::GgufFile;
use crate::tokenizer::Tokenizer;

/// The formats recognized, named as llama.cpp names them (`name`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChatTemplate {
    /// `<|im_start|>role\ncontent<|im_end|>\n` (Qwen2 and many others).
    ChatMl,
    /// `<start_of_turn>user\ncontent<end_of_turn>\n`, the assistant called
    /// "model" and a system message merged into the next user turn (Gemma).
    Gemma,
    /// `<|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|>` (LLaMA 3).
    Llama3,
    /// ChatML as Qwen3's template writes it. Qwen3 is a reasoning model: a
    /// reply it generates usually begins with its thinking,
    /// `<think>...</think>`.
    /// The template drops that block from the replies before the last user
    /// message (earlier turns), so this format does too; replies after it
    /// (a turn still in progress) keep it, and the last message, when it is
    /// a reply without one, gets an empty `<think>\n\n</think>\n\n`. The
    /// assistant's turn opens with `<|im_start|>assistant\n` alone, as
    /// llama.cpp's `llama_chat_apply_template` and Qwen3's template (without
    /// `enable_thinking` false) write it: whether to think is the model's
    /// choice, and its reply, reasoning included, is generated text like any
    /// other. llama.cpp formats this template as plain ChatML; the two
    /// differ only where a reply holds `</think>` or the conversation ends
    /// with a reply.
    Qwen3,
    /// Mistral's "v1" format (Mistral 7B v0.1-v0.2, Mixtral 8x7B):
    /// ` [INST] user [/INST] reply</s>`, a system message opening the next
    /// instruction.
    MistralV1,
    /// Mistral's "v3": `[INST] user[/INST] reply</s>`, replies trimmed.
    MistralV3,
    /// Mistral's "v3-tekken" (Mistral Nemo): `[INST]user[/INST]reply</s>`.
    MistralV3Tekken,
    /// Mistral's "v7": `[SYSTEM_PROMPT] system[/SYSTEM_PROMPT][INST] user[/INST] reply</s>`.
    MistralV7,
    /// LLaMA 2's `[INST] user [/INST]reply</s>` without a system role (the
    /// system text opens the first instruction), also Mistral's instruct
    /// template before its v1.
    Llama2,
    /// LLaMA 2 with `<<SYS>>\nsystem\n<</SYS>>\n\n` in the instruction.
    Llama2Sys,
    /// `Llama2Sys` with `<s>` before each later instruction.
    Llama2SysBos,
    /// `Llama2Sys` with every message trimmed.
    Llama2SysStrip,
    /// OpenAI's harmony format (gpt-oss) as llama.cpp writes it:
    /// `<|start|>role<|message|>content<|end|>`, a reply closed with
    /// `<|return|>`, the assistant's turn opened with `<|start|>assistant`
    /// (the model then writes its channel). Roles as given, "developer"
    /// among them.
    Harmony,
    /// Gemma 4: `<|turn>role\ncontent<turn|>\n`, the assistant called
    /// "model", a first system or developer message as the system turn,
    /// every message trimmed (as Jinja's `trim`: Python's whitespace), a
    /// reply's thinking (`<|channel>...<channel|>`) dropped and a reply
    /// right after another continuing its turn; the assistant's turn opens
    /// with thinking off, `<|turn>model\n<|channel>thought\n<channel|>`, as
    /// its template (google-gemma-4-31B-it) renders it. llama.cpp's
    /// `llama_chat_apply_template` does not know it.
    Gemma4,
}

/// One message of a conversation.
#[derive(Clone, Copy, Debug)]
pub struct ChatMessage<'a> {
    /// "system", "user" or "assistant".
    pub role: &'a str,
    pub content: &'a str,
}

impl ChatTemplate {
    /// The format a Jinja chat template writes, by its markers, tried in
    /// llama.cpp's order (`llm_chat_detect_template`).
    pub fn recognize(template: &str) -> Option<ChatTemplate> {
        let has = |marker: &str| template.contains(marker);
        if has("<|im_start|>") {
            // Qwen3's own handling of reasoning: written back only after
            // the last user query, in the form `Qwen3` writes. Other
            // ChatML templates with `<think>` (QwQ, Qwen3.5) treat it
            // otherwise, and llama.cpp formats them all as ChatML.
            if has("<think>")
                && has("last_query_index")
                && has(r"reasoning_content.strip('\n') + '\n</think>\n\n'")
            {
                Some(ChatTemplate::Qwen3)
            } else {
                Some(ChatTemplate::ChatMl)
            }
        } else if has("[INST]") {
            Some(Self::recognize_inst(template))
        } else if has("<start_of_turn>") {
            Some(ChatTemplate::Gemma)
        } else if has("<|start_header_id|>") && has("<|end_header_id|>") {
            Some(ChatTemplate::Llama3)
        } else if has("<|start|>") && has("<|channel|>") {
            Some(ChatTemplate::Harmony)
        } else if has("<|turn>") && has("<turn|>") {
            // Not one of llama.cpp's: its markers are none of theirs.
            Some(ChatTemplate::Gemma4)
        } else {
            None
        }
    }

    /// Which `[INST]` format: Mistral's official templates by their system
    /// prompt or tools markers and their spacing, else LLaMA 2's variants.
    fn recognize_inst(template: &str) -> ChatTemplate {
        let has = |marker: &str| template.contains(marker);
        if has("[SYSTEM_PROMPT]") {
            ChatTemplate::MistralV7
        } else if has("' [INST] ' + system_message") || has("[AVAILABLE_TOOLS]") {
            if has(" [INST]") {
                ChatTemplate::MistralV1
            } else if has("\"[INST]\"") {
                ChatTemplate::MistralV3Tekken
            } else {
                ChatTemplate::MistralV3
            }
        } else if has("content.strip()") {
            ChatTemplate::Llama2SysStrip
        } else if has("bos_token + '[INST]") {
            ChatTemplate::Llama2SysBos
        } else if has("<<SYS>>") {
            ChatTemplate::Llama2Sys
        } else {
            ChatTemplate::Llama2
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
        // By name: a vocab-only load has no parsed architecture. A LLaMA
        // without LLaMA 3's tokens (Mistral, Mixtral) has no default: its
        // files carry their template, and llama.cpp has none for them.
        match architecture {
            "gemma3" => Ok(ChatTemplate::Gemma),
            "qwen2" => Ok(ChatTemplate::ChatMl),
            "qwen3" | "qwen3moe" => Ok(ChatTemplate::Qwen3),
            "gpt-oss" => Ok(ChatTemplate::Harmony),
            "gemma4" => Ok(ChatTemplate::Gemma4),
            "llama" if llama3_tokens => Ok(ChatTemplate::Llama3),
            _ => Err(Error::unsupported(format!(
                "the model has no chat template (tokenizer.chat_template) and '{}' has no default one",
                crate::error::echo(architecture)
            ))),
        }
    }

    const NAMES: [&'static str; 14] = [
        "chatml",
        "gemma",
        "llama3",
        "qwen3",
        "mistral-v1",
        "mistral-v3",
        "mistral-v3-tekken",
        "mistral-v7",
        "llama2",
        "llama2-sys",
        "llama2-sys-bos",
        "llama2-sys-strip",
        "gpt-oss",
        "gemma4",
    ];

    /// llama.cpp's name of the format (gemma4, which llama.cpp does not
    /// format, by its architecture's name), which `m40_model_describe`
    /// reports.
    pub fn name(self) -> &'static str {
        Self::NAMES[match self {
            ChatTemplate::ChatMl => 0,
            ChatTemplate::Gemma => 1,
            ChatTemplate::Llama3 => 2,
            ChatTemplate::Qwen3 => 3,
            ChatTemplate::MistralV1 => 4,
            ChatTemplate::MistralV3 => 5,
            ChatTemplate::MistralV3Tekken => 6,
            ChatTemplate::MistralV7 => 7,
            ChatTemplate::Llama2 => 8,
            ChatTemplate::Llama2Sys => 9,
            ChatTemplate::Llama2SysBos => 10,
            ChatTemplate::Llama2SysStrip => 11,
            ChatTemplate::Harmony => 12,
            ChatTemplate::Gemma4 => 13,
        }]
    }

    /// The roles a message may have: "system", "user" and "assistant";
    /// the formats that know one also "developer" (gpt-oss's instructions;
    /// Gemma 4 takes a first one as its system turn).
    pub fn roles(self) -> &'static [&'static str] {
        match self {
            ChatTemplate::Harmony | ChatTemplate::Gemma4 => {
                &["system", "developer", "user", "assistant"]
            }
            _ => &["system", "user", "assistant"],
        }
    }

    /// The prompt text of `messages`, ending with the assistant's turn
    /// opened when `add_assistant` (the text to generate a reply after).
    /// The `[INST]` formats have no opening of their own: a user message
    /// ends with `[/INST]`, after which the reply follows, and
    /// `add_assistant` adds nothing.
    pub fn apply(self, messages: &[ChatMessage], add_assistant: bool) -> String {
        self.render(messages, add_assistant).text
    }

    /// `apply`'s text with the byte ranges that came from the messages'
    /// contents, so that a tokenizer can parse special tokens in the
    /// format's markup and nowhere else.
    pub fn render(self, messages: &[ChatMessage], add_assistant: bool) -> ChatPrompt {
        let mut p = ChatPrompt::default();
        match self {
            ChatTemplate::ChatMl => {
                for m in messages {
                    p.markup(&format!("<|im_start|>{}\n", m.role));
                    p.content(m.content);
                    p.markup("<|im_end|>\n");
                }
                if add_assistant {
                    p.markup("<|im_start|>assistant\n");
                }
            }
            ChatTemplate::Qwen3 => {
                qwen3(messages, &mut p);
                if add_assistant {
                    p.markup("<|im_start|>assistant\n");
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
                    p.markup(&format!("<start_of_turn>{role}\n"));
                    if !system.is_empty() && role != "model" {
                        p.content(&system);
                        p.markup("\n\n");
                        system.clear();
                    }
                    p.content(trim(m.content));
                    p.markup("<end_of_turn>\n");
                }
                if add_assistant {
                    p.markup("<start_of_turn>model\n");
                }
            }
            ChatTemplate::Harmony => {
                for m in messages {
                    p.markup(&format!("<|start|>{}<|message|>", m.role));
                    p.content(m.content);
                    p.markup(if m.role == "assistant" {
                        "<|return|>"
                    } else {
                        "<|end|>"
                    });
                }
                if add_assistant {
                    p.markup("<|start|>assistant");
                }
            }
            ChatTemplate::Gemma4 => {
                gemma4(messages, &mut p);
                if add_assistant {
                    p.markup("<|turn>model\n<|channel>thought\n<channel|>");
                }
            }
            ChatTemplate::Llama3 => {
                for m in messages {
                    p.markup(&format!(
                        "<|start_header_id|>{}<|end_header_id|>\n\n",
                        m.role
                    ));
                    p.content(trim(m.content));
                    p.markup("<|eot_id|>");
                }
                if add_assistant {
                    p.markup("<|start_header_id|>assistant<|end_header_id|>\n\n");
                }
            }
            ChatTemplate::MistralV7 => {
                for m in messages {
                    let (open, close) = match m.role {
                        "system" => ("[SYSTEM_PROMPT] ", "[/SYSTEM_PROMPT]"),
                        "user" => ("[INST] ", "[/INST]"),
                        _ => (" ", "</s>"),
                    };
                    p.markup(open);
                    p.content(m.content);
                    p.markup(close);
                }
            }
            ChatTemplate::MistralV1 | ChatTemplate::MistralV3 | ChatTemplate::MistralV3Tekken => {
                let lead = if self == ChatTemplate::MistralV1 {
                    " "
                } else {
                    ""
                };
                let trail = if self == ChatTemplate::MistralV3Tekken {
                    ""
                } else {
                    " "
                };
                // A system message joins the instruction it is in (or opens).
                let mut in_instruction = false;
                for m in messages {
                    if !in_instruction {
                        p.markup(&format!("{lead}[INST]{trail}"));
                        in_instruction = true;
                    }
                    match m.role {
                        "system" => {
                            p.content(m.content);
                            p.markup("\n\n");
                        }
                        "user" => {
                            p.content(m.content);
                            p.markup(&format!("{lead}[/INST]"));
                        }
                        _ => {
                            let reply = if self == ChatTemplate::MistralV3 {
                                trim(m.content)
                            } else {
                                m.content
                            };
                            p.markup(trail);
                            p.content(reply);
                            p.markup("</s>");
                            in_instruction = false;
                        }
                    }
                }
            }
            ChatTemplate::Llama2
            | ChatTemplate::Llama2Sys
            | ChatTemplate::Llama2SysBos
            | ChatTemplate::Llama2SysStrip => {
                // The first instruction is open from the start, BOS left to
                // the tokenizer; later ones open after each reply.
                p.markup("[INST] ");
                let mut in_instruction = true;
                for m in messages {
                    let content = if self == ChatTemplate::Llama2SysStrip {
                        trim(m.content)
                    } else {
                        m.content
                    };
                    if !in_instruction {
                        p.markup(if self == ChatTemplate::Llama2SysBos {
                            "<s>[INST] "
                        } else {
                            "[INST] "
                        });
                        in_instruction = true;
                    }
                    let (open, close) = match m.role {
                        "system" if self == ChatTemplate::Llama2 => ("", "\n"),
                        "system" => ("<<SYS>>\n", "\n<</SYS>>\n\n"),
                        "user" => ("", " [/INST]"),
                        _ => {
                            in_instruction = false;
                            ("", "</s>")
                        }
                    };
                    p.markup(open);
                    p.content(content);
                    p.markup(close);
                }
            }
        }
        p
    }
}

/// A conversation's prompt text and the byte ranges of it that are the
/// messages' text: only the rest, the format's own markup, may hold the
/// special tokens that open and close turns (`Tokenizer::tokenize_chat`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChatPrompt {
    pub text: String,
    /// Ascending, disjoint, non-empty.
    pub content: Vec<Range<usize>>,
}

impl ChatPrompt {
    fn markup(&mut self, s: &str) {
        self.text += s;
    }

    fn content(&mut self, s: &str) {
        let start = self.text.len();
        self.text += s;
        match self.content.last_mut() {
            Some(last) if last.end == start => last.end = self.text.len(),
            _ if s.is_empty() => {}
            _ => self.content.push(start..self.text.len()),
        }
    }
}

/// Qwen3's messages: ChatML, a reply's `<think>...</think>` kept only after
/// the last user query (its template's rule, for text messages).
fn qwen3(messages: &[ChatMessage], p: &mut ChatPrompt) {
    // A user message that wraps a tool's response continues the query
    // before it rather than starting one.
    let last_query = messages.iter().rposition(|m| {
        m.role == "user"
            && !(m.content.starts_with("<tool_response>")
                && m.content.ends_with("</tool_response>"))
    });
    for (i, m) in messages.iter().enumerate() {
        if m.role != "assistant" {
            p.markup(&format!("<|im_start|>{}\n", m.role));
            p.content(m.content);
            p.markup("<|im_end|>\n");
            continue;
        }
        let (reasoning, reply) = split_reasoning(m.content);
        let in_progress = last_query.is_some_and(|q| i > q);
        let last = i + 1 == messages.len();
        if in_progress && (last || !reasoning.is_empty()) {
            p.markup("<|im_start|>assistant\n<think>\n");
            p.content(reasoning.trim_matches('\n'));
            p.markup("\n</think>\n\n");
            p.content(reply.trim_start_matches('\n'));
            p.markup("<|im_end|>\n");
        } else {
            p.markup("<|im_start|>assistant\n");
            p.content(reply);
            p.markup("<|im_end|>\n");
        }
    }
}

/// A reply's reasoning and answer, split as Qwen3's template splits them:
/// the reasoning is what precedes the first `</think>` (after its last
/// `<think>`), the answer what follows the last one; a reply without
/// `</think>` is all answer.
fn split_reasoning(content: &str) -> (&str, &str) {
    const END: &str = "</think>";
    let (Some(first), Some(last)) = (content.find(END), content.rfind(END)) else {
        return ("", content);
    };
    let before = content[..first].trim_end_matches('\n');
    let reasoning = before.rsplit("<think>").next().unwrap_or(before);
    (
        reasoning.trim_start_matches('\n'),
        content[last + END.len()..].trim_start_matches('\n'),
    )
}

/// Gemma 4's messages, as its template writes text messages: a first
/// system (or developer) message is the system turn; the assistant is
/// "model", and a reply right after another continues its turn; a reply
/// loses its thinking.
fn gemma4(messages: &[ChatMessage], p: &mut ChatPrompt) {
    let mut rest = messages;
    if let Some(first) = messages.first() {
        if first.role == "system" || first.role == "developer" {
            p.markup("<|turn>system\n");
            p.content(jinja_trim(first.content));
            p.markup("<turn|>\n");
            rest = &messages[1..];
        }
    }
    let mut previous = None;
    for m in rest {
        let reply = m.role == "assistant";
        if !(reply && previous == Some("assistant")) {
            let role = if reply { "model" } else { m.role };
            p.markup(&format!("<|turn>{role}\n"));
        }
        if reply {
            p.content(jinja_trim(&strip_thinking(m.content)));
        } else {
            p.content(jinja_trim(m.content));
        }
        p.markup("<turn|>\n");
        previous = Some(m.role);
    }
}

/// A Gemma 4 reply without its thinking, as its template's `strip_thinking`
/// cuts it: of each part between `<channel|>` markers, what precedes
/// `<|channel>`.
fn strip_thinking(content: &str) -> String {
    content
        .split("<channel|>")
        .map(|part| part.split("<|channel>").next().unwrap_or(part))
        .collect()
}

/// `s` as Jinja's `trim` leaves it (Python's `str.strip()`): Unicode
/// whitespace and the separators U+001C..U+001F off both ends.
fn jinja_trim(s: &str) -> &str {
    s.trim_matches(|c: char| c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c))
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
            // llama.cpp's llama_chat_apply_template (tests/data/README.md).
            (
                "{{- '<|start|>' + message.role + '<|message|>' }}{{- '<|channel|>final' }}",
                ChatTemplate::Harmony,
                "<|start|>system<|message|>You are a helpful assistant<|end|><|start|>user<|message|>Hello<|end|><|start|>assistant<|message|>Hi there<|return|><|start|>user<|message|>Who are you<|end|><|start|>assistant<|message|>   I am an assistant   <|return|><|start|>user<|message|>Another question<|end|><|start|>assistant",
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
    fn gemma4_trims_as_jinja_and_drops_thinking_as_its_template() {
        // Python's str.strip(): Unicode whitespace and U+001C..U+001F.
        assert_eq!(jinja_trim("\u{1c}\u{3000} a b\u{a0}\u{2029}\u{1f}"), "a b");
        assert_eq!(jinja_trim("\u{200b}x"), "\u{200b}x");
        assert_eq!(strip_thinking("a<|channel>x<channel|>b"), "ab");
        assert_eq!(strip_thinking("<channel|>b<|channel>"), "b");
        assert_eq!(strip_thinking("plain"), "plain");
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
