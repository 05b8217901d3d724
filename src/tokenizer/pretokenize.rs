//! BPE pre-tokenizers: the regex splits `tokenizer.ggml.pre` names, applied
//! the way llama.cpp applies them.
//!
//! A pre-tokenizer is a list of patterns applied one after the other: each
//! pattern splits every piece the previous ones left into its matches and the
//! text between them. Two patterns (GPT-2's and LLaMA 3's) are hand-written
//! scanners in llama.cpp, and so they are here (`scan_gpt2`, `scan_llama3`).
//! The others run through `fancy-regex` (they need `(?!\S)` lookahead) over
//! the text transformed as llama.cpp transforms it for `std::regex`:
//!
//! - a pattern that uses `\p{..}` classes runs over a *collapsed* text where
//!   every non-ASCII character stands for its class (one placeholder for
//!   letters, one for digits, ...), and each `\p{X}` becomes "that
//!   placeholder or the ASCII characters of class X" — so `\p{Lu}` matches
//!   any letter, and `~` is not a symbol, exactly as in llama.cpp;
//! - a pattern without them runs over the text itself, with non-ASCII
//!   whitespace written as `\x0B` (C++'s `\s` is ASCII only).
//!
//! In both, `\s` is `[\t\n\x0B\x0C\r ]` and `\d` is `[0-9]`, as in C++.

use std::ops::Range;

use fancy_regex::Regex;

use super::unicode::{self, LETTER, NUMBER, WHITESPACE};
use crate::error::{Error, Result};

/// How a pre-tokenizer name sets up the tokenizer (llama.cpp's per-name flags).
#[derive(Clone, Copy, Debug)]
pub(crate) struct PreConfig {
    pub patterns: &'static [&'static str],
    pub clean_spaces: bool,
    pub ignore_merges: bool,
    /// `Some(b)`: the name sets `add_bos` (the metadata may still override it).
    pub add_bos: Option<bool>,
    /// The name removes the default BOS token (ChatGLM).
    pub no_bos: bool,
    /// SentencePiece-style BPE (Gemma 4): spaces are written `▁` before
    /// the split, words are merged as raw UTF-8 (not GPT-2's byte
    /// alphabet), a symbol without a token falls back to `<0xXX>` byte
    /// tokens, a run of newlines that is a token is that token, and BOS is
    /// added whatever the metadata says.
    pub spm_style: bool,
}

const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const HAN_KANA: &str = r"[\u{4E00}-\u{9FA5}\u{3040}-\u{309F}\u{30A0}-\u{30FF}]+";
/// Cased letters as DeepSeek's tokenizer lists them.
const DEEPSEEK_LETTERS: &str = r"\s?[A-Za-z\u{B5}\u{C0}-\u{D6}\u{D8}-\u{F6}\u{F8}-\u{1BA}\u{1BC}-\u{1BF}\u{1C4}-\u{293}\u{295}-\u{2AF}\u{370}-\u{373}\u{376}\u{377}\u{37B}-\u{37D}\u{37F}\u{386}\u{388}-\u{38A}\u{38C}\u{38E}-\u{3A1}\u{3A3}-\u{3F5}\u{3F7}-\u{481}\u{48A}-\u{52F}\u{531}-\u{556}\u{10A0}-\u{10C5}\u{13A0}-\u{13F5}\u{13F8}-\u{13FD}\u{1C90}-\u{1CBA}\u{1CBD}-\u{1CBF}\u{1D00}-\u{1D2B}\u{1D6B}-\u{1D77}\u{1D79}-\u{1D9A}\u{1E00}-\u{1F15}\u{1F18}-\u{1F1D}\u{1F20}-\u{1F45}\u{1F48}-\u{1F4D}\u{1F50}-\u{1F57}\u{1F59}\u{1F5B}\u{1F5D}\u{1F5F}-\u{1F7D}\u{1F80}-\u{1FB4}\u{1FB6}-\u{1FBC}\u{1FBE}\u{1FC2}-\u{1FC4}\u{1FC6}-\u{1FCC}\u{1FD0}-\u{1FD3}\u{1FD6}-\u{1FDB}\u{1FE0}-\u{1FEC}\u{1FF2}-\u{1FF4}\u{1FF6}-\u{1FFC}\u{2102}\u{2107}\u{210A}-\u{2113}\u{2115}\u{2119}-\u{211D}\u{2124}\u{2126}\u{2128}\u{212A}-\u{212D}\u{212F}-\u{2134}\u{2139}\u{213C}-\u{213F}\u{2145}-\u{2149}\u{214E}\u{2183}\u{2184}\u{2C00}-\u{2C7B}\u{2C7E}-\u{2CE4}\u{2CEB}-\u{2CEE}\u{2CF2}\u{2CF3}\u{A640}-\u{A66D}\u{A680}-\u{A69B}\u{A722}-\u{A76F}\u{A771}-\u{A787}\u{A78B}-\u{A78E}\u{AB70}-\u{ABBF}\u{FB00}-\u{FB06}\u{FB13}-\u{FB17}\u{FF21}-\u{FF3A}\u{FF41}-\u{FF5A}\u{10400}-\u{1044F}\u{104B0}-\u{104D3}\u{104D8}-\u{104FB}\u{10C80}-\u{10CB2}\u{10CC0}-\u{10CF2}\u{118A0}-\u{118DF}\u{1E900}-\u{1E943}]+";
const CJK_HANGUL: &str = r"[\u{4E00}-\u{9FA5}\u{0800}-\u{4E00}\u{AC00}-\u{D7FF}]+";
const BLOOM: &str = r" ?[^(\s|.,!?\u{2026}\u{3002}\u{FF0C}\u{3001}\u{0964}\u{06D4}\u{060C})]+";

const DEFAULT_PATTERNS: &[&str] = &[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"];
const STARCODER_PATTERNS: &[&str] = &[r"\p{N}", GPT2];

/// The pre-tokenizers this library runs, by their `tokenizer.ggml.pre` names.
pub(crate) fn config(name: &str) -> Option<PreConfig> {
    let c = |patterns: &'static [&'static str], clean_spaces: bool| PreConfig {
        patterns,
        clean_spaces,
        ignore_merges: false,
        add_bos: None,
        no_bos: false,
        spm_style: false,
    };
    Some(match name {
        "" | "default" => c(DEFAULT_PATTERNS, true),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0"
        | "lfm2" | "jina-v5-nano" => PreConfig {
            ignore_merges: true,
            add_bos: Some(true),
            ..c(&[LLAMA3], true)
        },
        "dbrx" | "smaug-bpe" => c(&[LLAMA3], true),
        "glm4" | "chatglm-bpe" => PreConfig {
            no_bos: true,
            ..c(&[LLAMA3], true)
        },
        "deepseek-llm" => c(
            &[
                "[\r\n]",
                DEEPSEEK_LETTERS,
                r"\s?[!-/:-~\u{FF01}-\u{FF0F}\u{FF1A}-\u{FF5E}\u{2018}-\u{201F}\u{3000}-\u{3002}]+",
                r"\s+$",
                CJK_HANGUL,
                r"\p{N}+",
            ],
            false,
        ),
        "deepseek-coder" => c(
            &["[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", CJK_HANGUL, r"\p{N}"],
            false,
        ),
        "deepseek-v3" | "hunyuan-dense" | "joyai-llm" | "hy_v4" => c(
            &[
                r"\p{N}{1,3}",
                HAN_KANA,
                r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##,
            ],
            false,
        ),
        "falcon" => c(&[r"[\p{P}\$\+<=>\^~\|`]+", GPT2, r"[0-9][0-9][0-9]"], true),
        "starcoder" | "refact" | "codeshell" | "exaone" | "minerva-7b" | "mellum2" => {
            c(STARCODER_PATTERNS, true)
        }
        "command-r" | "smollm" => c(STARCODER_PATTERNS, false),
        "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es" | "jina-v2-de"
        | "a.x-4.0" | "mellum" | "modern-bert" | "mpt" | "olmo" | "jais" | "exaone4" => {
            c(&[GPT2], true)
        }
        "trillion" | "granite-docling" => c(&[GPT2], false),
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "hunyuan" | "solar-open"
        | "grok-2" => c(&[QWEN2], false),
        "stablelm2" | "megrez" => c(&[QWEN2], true),
        "qwen35" => c(
            &[
                r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
            ],
            false,
        ),
        "poro-chat" => c(&[BLOOM], false),
        "bloom" | "gpt3-finnish" => c(&[BLOOM], true),
        "viking" => c(&[BLOOM, r"\p{N}"], false),
        "tekken" => PreConfig {
            ignore_merges: true,
            add_bos: Some(true),
            ..c(
                &[
                    r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
                ],
                false,
            )
        },
        "chameleon" => PreConfig {
            add_bos: Some(true),
            ..c(
                &[
                    r"<sentinel:[0-9]+>",
                    r"(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
                    r"([\t\n]|    |  )",
                    r"\p{N}",
                    r"[\p{P}!-/:-@\[-`{-~]",
                    GPT2,
                ],
                false,
            )
        },
        "gpt-4o" | "llama4" | "kanana2" | "talkie" | "minimax-m2" => c(&[GPT4O], false),
        "gemma4" => PreConfig {
            spm_style: true,
            // Only lines apart: merges run over the whole line.
            ..c(&[r"[^\n]+|[\n]+"], true)
        },
        "bailingmoe" | "bailingmoe2" | "llada-moe" => c(
            &[
                r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+",
            ],
            false,
        ),
        "seed-coder" => c(
            &[
                r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+",
            ],
            false,
        ),
        "ufakzeka" => c(
            &[r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"],
            false,
        ),
        _ => return None,
    })
}

/// Every name [`config`] knows (for tests and error messages).
pub(crate) const NAMES: &[&str] = &[
    "default",
    "llama3",
    "llama-v3",
    "llama-bpe",
    "falcon3",
    "falcon-h1",
    "pixtral",
    "midm-2.0",
    "lfm2",
    "jina-v5-nano",
    "dbrx",
    "smaug-bpe",
    "glm4",
    "chatglm-bpe",
    "deepseek-llm",
    "deepseek-coder",
    "deepseek-v3",
    "hunyuan-dense",
    "joyai-llm",
    "hy_v4",
    "falcon",
    "starcoder",
    "refact",
    "codeshell",
    "exaone",
    "minerva-7b",
    "mellum2",
    "command-r",
    "smollm",
    "gpt-2",
    "phi-2",
    "jina-es",
    "jina-de",
    "gigachat",
    "jina-v2-es",
    "jina-v2-de",
    "a.x-4.0",
    "mellum",
    "modern-bert",
    "mpt",
    "olmo",
    "jais",
    "exaone4",
    "trillion",
    "granite-docling",
    "qwen2",
    "deepseek-r1-qwen",
    "kormo",
    "f2llmv2",
    "hunyuan",
    "solar-open",
    "grok-2",
    "stablelm2",
    "megrez",
    "qwen35",
    "poro-chat",
    "bloom",
    "gpt3-finnish",
    "viking",
    "tekken",
    "chameleon",
    "gpt-4o",
    "llama4",
    "kanana2",
    "talkie",
    "minimax-m2",
    "gemma4",
    "bailingmoe",
    "bailingmoe2",
    "llada-moe",
    "seed-coder",
    "ufakzeka",
];

/// One step of a pre-tokenizer.
enum Step {
    /// llama.cpp's hand-written scanner for the GPT-2 pattern.
    Gpt2,
    /// llama.cpp's hand-written scanner for the LLaMA 3 pattern.
    Llama3,
    /// A regex over the collapsed text (`collapsed`) or over the text itself.
    Regex { regex: Regex, collapsed: bool },
}

/// A compiled pre-tokenizer.
pub(crate) struct PreTokenizer {
    steps: Vec<Step>,
}

/// The class names llama.cpp collapses, with the placeholder character that
/// stands for the non-ASCII members and the ASCII members (as it lists them).
const COLLAPSED_CLASSES: &[(&str, char, &str)] = &[
    ("N", '\u{F0D1}', "0-9"),
    ("L", '\u{F0D2}', "A-Za-z"),
    ("Lu", '\u{F0D2}', "A-Za-z"),
    ("Ll", '\u{F0D2}', "A-Za-z"),
    ("Lt", '\u{F0D2}', "A-Za-z"),
    ("Lm", '\u{F0D2}', "A-Za-z"),
    ("Lo", '\u{F0D2}', "A-Za-z"),
    ("P", '\u{F0D3}', r"!-#%-*,-/:-;?-@\[-\]_\{\}"),
    ("M", '\u{F0D4}', ""),
    ("S", '\u{F0D5}', r"\$\+<->\^`\|"),
];
/// The placeholder of non-ASCII characters of no collapsed class.
const OTHER: char = '\u{F0D0}';
const ASCII_SPACE: &str = r"\t\n\x0B\x0C\r\x20";

/// Rewrites a llama.cpp pattern for `fancy-regex` (see the module comment).
fn translate(pattern: &str) -> Result<(String, bool)> {
    let collapsed = COLLAPSED_CLASSES
        .iter()
        .any(|(name, _, _)| pattern.contains(&format!(r"\p{{{name}}}")));
    let mut out = String::with_capacity(pattern.len() * 2);
    let mut in_class = false;
    let mut chars = pattern.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '[' if !in_class => {
                in_class = true;
                out.push('[');
            }
            ']' if in_class => {
                in_class = false;
                out.push(']');
            }
            '\\' => {
                let Some(e) = chars.next() else {
                    return Err(Error::internal(format!(
                        "pattern ends with '\\': {pattern}"
                    )));
                };
                let class_body = match e {
                    's' => Some(ASCII_SPACE.to_string()),
                    'd' => Some("0-9".to_string()),
                    'S' if !in_class => {
                        out.push_str(&format!("[^{ASCII_SPACE}]"));
                        continue;
                    }
                    'p' if collapsed => {
                        let mut name = String::new();
                        if chars.next() != Some('{') {
                            return Err(Error::internal(format!("bad \\p in {pattern}")));
                        }
                        for n in chars.by_ref() {
                            if n == '}' {
                                break;
                            }
                            name.push(n);
                        }
                        let (_, placeholder, ascii) = COLLAPSED_CLASSES
                            .iter()
                            .find(|(n, _, _)| *n == name)
                            .ok_or_else(|| {
                                Error::internal(format!("class \\p{{{name}}} in {pattern}"))
                            })?;
                        Some(format!("{placeholder}{ascii}"))
                    }
                    _ => None,
                };
                match class_body {
                    Some(body) if in_class => out.push_str(&body),
                    Some(body) => {
                        out.push('[');
                        out.push_str(&body);
                        out.push(']');
                    }
                    None => {
                        out.push('\\');
                        out.push(e);
                    }
                }
            }
            _ => out.push(c),
        }
    }
    Ok((out, collapsed))
}

impl PreTokenizer {
    pub(crate) fn new(patterns: &[&str]) -> Result<PreTokenizer> {
        let steps = patterns
            .iter()
            .map(|&pattern| {
                Ok(match pattern {
                    GPT2 => Step::Gpt2,
                    LLAMA3 => Step::Llama3,
                    _ => {
                        let (translated, collapsed) = translate(pattern)?;
                        let regex = fancy_regex::RegexBuilder::new(&translated)
                            .backtrack_limit(100_000_000)
                            .build()
                            .map_err(|e| {
                                Error::internal(format!("pre-tokenizer pattern {pattern:?}: {e}"))
                            })?;
                        Step::Regex { regex, collapsed }
                    }
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(PreTokenizer { steps })
    }

    /// Splits `text` into words: byte ranges that cover it in order.
    pub(crate) fn split(&self, text: &str) -> Result<Vec<Range<usize>>> {
        let chars: Vec<char> = text.chars().collect();
        let cps: Vec<u32> = chars.iter().map(|&c| c as u32).collect();
        // Piece lengths in code points, as llama.cpp keeps them.
        let mut pieces = vec![cps.len()];
        let mut collapsed: Option<Transformed> = None;
        let mut spaced: Option<Transformed> = None;
        for step in &self.steps {
            pieces = match step {
                Step::Gpt2 => scan(&cps, &pieces, gpt2_piece),
                Step::Llama3 => scan(&cps, &pieces, llama3_piece),
                Step::Regex {
                    regex,
                    collapsed: true,
                } => {
                    let t = collapsed.get_or_insert_with(|| Transformed::collapsed(&chars));
                    t.split(regex, &pieces)?
                }
                Step::Regex {
                    regex,
                    collapsed: false,
                } => {
                    let t = spaced.get_or_insert_with(|| Transformed::spaced(&chars));
                    t.split(regex, &pieces)?
                }
            };
        }
        let mut words = Vec::with_capacity(pieces.len());
        let mut chars_iter = chars.iter();
        let mut byte = 0;
        for len in pieces {
            let start = byte;
            for c in chars_iter.by_ref().take(len) {
                byte += c.len_utf8();
            }
            if byte > start {
                words.push(start..byte);
            }
        }
        Ok(words)
    }
}

/// The text as a regex step sees it: one character per code point of the
/// original, and where each one starts.
struct Transformed {
    text: String,
    /// Byte offset in `text` of each code point, and the end.
    starts: Vec<usize>,
}

impl Transformed {
    fn build(chars: &[char], map: impl Fn(char) -> char) -> Transformed {
        let mut text = String::with_capacity(chars.len());
        let mut starts = Vec::with_capacity(chars.len() + 1);
        for &c in chars {
            starts.push(text.len());
            text.push(map(c));
        }
        starts.push(text.len());
        Transformed { text, starts }
    }

    fn collapsed(chars: &[char]) -> Transformed {
        Self::build(chars, |c| {
            if c.is_ascii() {
                return c;
            }
            let classes = unicode::classes(c as u32);
            if classes & WHITESPACE != 0 {
                return '\x0B';
            }
            match classes & unicode::CATEGORIES {
                unicode::NUMBER => '\u{F0D1}',
                unicode::LETTER => '\u{F0D2}',
                unicode::PUNCTUATION => '\u{F0D3}',
                unicode::ACCENT_MARK => '\u{F0D4}',
                unicode::SYMBOL => '\u{F0D5}',
                _ => OTHER,
            }
        })
    }

    fn spaced(chars: &[char]) -> Transformed {
        Self::build(chars, |c| {
            if !c.is_ascii() && unicode::classes(c as u32) & WHITESPACE != 0 {
                '\x0B'
            } else {
                c
            }
        })
    }

    /// Splits every piece into the regex's matches and the text between them.
    fn split(&self, regex: &Regex, pieces: &[usize]) -> Result<Vec<usize>> {
        let mut out = Vec::with_capacity(pieces.len());
        let mut start = 0usize; // code point index of the piece
        for &len in pieces {
            let (b0, b1) = (self.starts[start], self.starts[start + len]);
            let piece = &self.text[b0..b1];
            let cp_at = |byte: usize| self.starts.partition_point(|&s| s < b0 + byte);
            let mut done = start;
            for m in regex.find_iter(piece) {
                let m =
                    m.map_err(|e| Error::internal(format!("pre-tokenizer regex failed: {e}")))?;
                let (ms, me) = (cp_at(m.start()), cp_at(m.end()));
                if ms > done {
                    out.push(ms - done);
                }
                if me > ms {
                    out.push(me - ms);
                }
                done = me;
            }
            if start + len > done {
                out.push(start + len - done);
            }
            start += len;
        }
        Ok(out)
    }
}

/// Runs a hand-written scanner over every piece; it appends the lengths of
/// the words it finds in `cps[range]`.
fn scan(
    cps: &[u32],
    pieces: &[usize],
    piece_fn: fn(&[u32], Range<usize>, &mut Vec<usize>),
) -> Vec<usize> {
    let mut out = Vec::with_capacity(pieces.len());
    let mut start = 0;
    for &len in pieces {
        piece_fn(cps, start..start + len, &mut out);
        start += len;
    }
    out
}

/// A code point or "outside the piece", and its classes (none outside).
struct Cursor<'a> {
    cps: &'a [u32],
    range: Range<usize>,
    /// Where the word being scanned began.
    word_start: usize,
}

const OUT: u32 = u32::MAX;

impl Cursor<'_> {
    fn cp(&self, pos: usize) -> u32 {
        if self.range.contains(&pos) {
            self.cps[pos]
        } else {
            OUT
        }
    }
    fn classes(&self, pos: usize) -> u8 {
        if self.range.contains(&pos) {
            unicode::classes(self.cps[pos])
        } else {
            0
        }
    }
    /// Ends the current word at `end` (an empty word is not recorded).
    fn word(&mut self, end: usize, out: &mut Vec<usize>) {
        if end > self.word_start {
            out.push(end - self.word_start);
        }
        self.word_start = end;
    }
}

fn is_text(classes: u8) -> bool {
    classes & (WHITESPACE | LETTER | NUMBER) == 0 && classes != 0
}

/// Counts the whitespace run at `pos`; returns (count, end of its last
/// `\r`/`\n` or 0).
fn whitespace_run(c: &Cursor, pos: usize) -> (usize, usize) {
    let mut n = 0;
    let mut last_newline_end = 0;
    while c.classes(pos + n) & WHITESPACE != 0 {
        let cp = c.cp(pos + n);
        if cp == '\r' as u32 || cp == '\n' as u32 {
            last_newline_end = pos + n + 1;
        }
        n += 1;
    }
    (n, last_newline_end)
}

/// The contraction `'s 't 'm 'd` (2) or `'re 've 'll` (3) at `pos`, by
/// llama.cpp's rules: case-sensitive for GPT-2, any case for LLaMA 3.
fn contraction(c: &Cursor, pos: usize, any_case: bool) -> usize {
    if c.cp(pos) != '\'' as u32 || pos + 1 >= c.range.end {
        return 0;
    }
    let lower = |cp: u32| {
        if any_case && (b'A' as u32..=b'Z' as u32).contains(&cp) {
            cp + 32
        } else {
            cp
        }
    };
    let is = |cp: u32, ch: char| cp == ch as u32;
    let next = lower(c.cp(pos + 1));
    if is(next, 's') || is(next, 't') || is(next, 'm') || is(next, 'd') {
        return 2;
    }
    if pos + 2 < c.range.end {
        let next2 = lower(c.cp(pos + 2));
        if (is(next, 'r') && is(next2, 'e'))
            || (is(next, 'v') && is(next2, 'e'))
            || (is(next, 'l') && is(next2, 'l'))
        {
            return 3;
        }
    }
    0
}

/// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
/// as llama.cpp scans it.
fn gpt2_piece(cps: &[u32], range: Range<usize>, out: &mut Vec<usize>) {
    let mut c = Cursor {
        cps,
        word_start: range.start,
        range: range.clone(),
    };
    let mut pos = range.start;
    while pos < range.end {
        let cp = c.cp(pos);
        let n = contraction(&c, pos, false);
        if n > 0 {
            pos += n;
            c.word(pos, out);
            continue;
        }
        let space = cp == ' ' as u32;
        let mut next = if space {
            c.classes(pos + 1)
        } else {
            c.classes(pos)
        };
        for class in [LETTER, NUMBER] {
            if next & class != 0 {
                pos += space as usize;
                while next & class != 0 {
                    pos += 1;
                    next = c.classes(pos);
                }
                break;
            }
        }
        if pos > c.word_start {
            c.word(pos, out);
            continue;
        }
        if is_text(next) {
            pos += space as usize;
            while is_text(next) {
                pos += 1;
                next = c.classes(pos);
            }
            c.word(pos, out);
            continue;
        }
        let (n_space, _) = whitespace_run(&c, pos);
        if n_space > 1 && c.cp(pos + n_space) != OUT {
            pos += n_space - 1;
        } else if n_space > 0 {
            pos += n_space;
        } else {
            pos += 1;
        }
        c.word(pos, out);
    }
}

/// `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
/// ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+` as llama.cpp scans it.
fn llama3_piece(cps: &[u32], range: Range<usize>, out: &mut Vec<usize>) {
    let mut c = Cursor {
        cps,
        word_start: range.start,
        range: range.clone(),
    };
    let newline = |cp: u32| cp == '\r' as u32 || cp == '\n' as u32;
    let mut pos = range.start;
    while pos < range.end {
        let cp = c.cp(pos);
        let classes = c.classes(pos);
        let n = contraction(&c, pos, true);
        if n > 0 {
            pos += n;
            c.word(pos, out);
            continue;
        }
        // [^\r\n\p{L}\p{N}]?\p{L}+
        if !newline(cp)
            && classes & NUMBER == 0
            && (classes & LETTER != 0 || c.classes(pos + 1) & LETTER != 0)
        {
            pos += 1;
            while c.classes(pos) & LETTER != 0 {
                pos += 1;
            }
            c.word(pos, out);
            continue;
        }
        // \p{N}{1,3}
        if classes & NUMBER != 0 {
            let mut run_start = pos;
            while c.classes(pos) & NUMBER != 0 {
                pos += 1;
                if pos - run_start >= 3 {
                    c.word(pos, out);
                    run_start = pos;
                }
            }
            c.word(pos, out);
            continue;
        }
        // " ?[^\s\p{L}\p{N}]+[\r\n]*" (llama.cpp tests the first character's
        // own classes for being inside the piece, not the next one's)
        let mut next = if cp == ' ' as u32 {
            c.classes(pos + 1)
        } else {
            classes
        };
        if next & (WHITESPACE | LETTER | NUMBER) == 0 && classes != 0 {
            pos += (cp == ' ' as u32) as usize;
            while is_text(next) {
                pos += 1;
                next = c.classes(pos);
            }
            while newline(c.cp(pos)) {
                pos += 1;
            }
            c.word(pos, out);
            continue;
        }
        let (n_space, last_newline_end) = whitespace_run(&c, pos);
        if last_newline_end > 0 {
            pos = last_newline_end; // \s*[\r\n]+
        } else if n_space > 1 && c.cp(pos + n_space) != OUT {
            pos += n_space - 1; // \s+(?!\S)
        } else if n_space > 0 {
            pos += n_space; // \s+
        } else {
            pos += 1;
        }
        c.word(pos, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words<'a>(pre: &PreTokenizer, text: &'a str) -> Vec<&'a str> {
        pre.split(text)
            .unwrap()
            .into_iter()
            .map(|r| &text[r])
            .collect()
    }

    #[test]
    fn every_named_pre_tokenizer_compiles() {
        for name in NAMES {
            let config = config(name).unwrap_or_else(|| panic!("{name} has no config"));
            PreTokenizer::new(config.patterns).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        assert!(config("no-such-pre").is_none());
    }

    #[test]
    fn gpt2_splits_words_contractions_and_spaces() {
        let pre = PreTokenizer::new(&[GPT2]).unwrap();
        assert_eq!(words(&pre, "Hello world"), ["Hello", " world"]);
        assert_eq!(words(&pre, "I'll   go!!"), ["I", "'ll", "  ", " go", "!!"]);
        assert_eq!(words(&pre, "a  \n"), ["a", "  \n"]);
        assert_eq!(words(&pre, "x 123abc"), ["x", " 123", "abc"]);
    }

    #[test]
    fn llama3_groups_digits_by_three_and_newlines() {
        let pre = PreTokenizer::new(&[LLAMA3]).unwrap();
        assert_eq!(words(&pre, "12345"), ["123", "45"]);
        assert_eq!(
            words(&pre, "He'LL go\n\n  x"),
            ["He", "'LL", " go", "\n\n", " ", " x"]
        );
        assert_eq!(words(&pre, "...\n"), ["...\n"]);
    }

    #[test]
    fn regex_steps_match_the_hand_written_scanners_on_plain_text() {
        // QWEN2 differs from LLAMA3 only in single digits; on text without
        // digits the regex path must agree with the LLaMA 3 scanner.
        let scanner = PreTokenizer::new(&[LLAMA3]).unwrap();
        let regex = PreTokenizer::new(&[QWEN2]).unwrap();
        for text in [
            "Hello, y'all! How are you 😁 ?",
            "  a\n\n b  \t c",
            "' era",
            "\n =",
            "нещо на Български",
        ] {
            assert_eq!(words(&scanner, text), words(&regex, text), "{text:?}");
        }
    }

    #[test]
    fn collapsed_classes_follow_llama_cpp() {
        // '~' is not among the ASCII symbols llama.cpp lists for \p{S}.
        let (pattern, collapsed) = translate(r"[\p{S}]+|\S").unwrap();
        assert!(collapsed);
        assert_eq!(
            pattern,
            "[\u{F0D5}\\$\\+<->\\^`\\|]+|[^\\t\\n\\x0B\\x0C\\r\\x20]"
        );
        let pre = PreTokenizer::new(&[r"\p{P}+"]).unwrap();
        assert_eq!(words(&pre, "a...b「」c"), ["a", "...", "b", "「」", "c"]);
    }
}
