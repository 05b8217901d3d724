//! Tokenizers read from a GGUF file's `tokenizer.ggml.*` metadata, giving the
//! same token ids, pieces and text as llama.cpp (`src/llama-vocab.cpp`) on
//! the same file.
//!
//! - SentencePiece (`tokenizer.ggml.model = "llama"`: LLaMA 1/2, Mistral,
//!   Gemma, Phi-3): [`spm`].
//! - Byte-level BPE (`"gpt2"`: GPT-2, LLaMA 3, Qwen2, DeepSeek, StarCoder,
//!   Falcon, gpt-oss, ...): [`bpe`], after the regex split
//!   `tokenizer.ggml.pre` names ([`pretokenize`]).
//! - Gemma 4's BPE (`"gemma4"`): the same merges over raw UTF-8 with spaces
//!   written `▁`, lines apart, and `<0xXX>` byte tokens (`PreConfig::spm_style`).
//! - Special tokens are cut out of the text first ([`special`]); pieces and
//!   detokenization are in [`detok`].
//!
//! Loading follows llama.cpp's `llama_vocab::impl::load`: its defaults per
//! model and pre-tokenizer, the special token ids and their fallbacks, the
//! end-of-generation tokens it recognises by their text, and its attribute
//! fixes (tokens that look like control tokens become control tokens; Phi-3's
//! special tokens strip the whitespace after them).

mod bpe;
mod detok;
mod index;
mod pretokenize;
mod special;
mod spm;
mod unicode;

use std::fmt;
use std::ops::Range;

use crate::error::{echo, Error, Result};
use crate::gguf::{Array, GgufFile};
use index::TextIndex;

/// Attributes of a token, as llama.cpp's `llama_token_attr` bits.
///
/// (An engine type: the next line keeps it out of the C header.)
/// cbindgen:ignore
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct TokenAttr(u16);

impl TokenAttr {
    pub const UNDEFINED: TokenAttr = TokenAttr(0);
    pub const UNKNOWN: TokenAttr = TokenAttr(1 << 0);
    pub const UNUSED: TokenAttr = TokenAttr(1 << 1);
    pub const NORMAL: TokenAttr = TokenAttr(1 << 2);
    pub const CONTROL: TokenAttr = TokenAttr(1 << 3);
    pub const USER_DEFINED: TokenAttr = TokenAttr(1 << 4);
    pub const BYTE: TokenAttr = TokenAttr(1 << 5);
    pub const NORMALIZED: TokenAttr = TokenAttr(1 << 6);
    pub const LSTRIP: TokenAttr = TokenAttr(1 << 7);
    pub const RSTRIP: TokenAttr = TokenAttr(1 << 8);
    pub const SINGLE_WORD: TokenAttr = TokenAttr(1 << 9);

    pub const fn empty() -> TokenAttr {
        TokenAttr(0)
    }
    pub const fn bits(self) -> u16 {
        self.0
    }
    /// Has every bit of `other`.
    pub const fn contains(self, other: TokenAttr) -> bool {
        self.0 & other.0 == other.0
    }
    /// Has any bit of `other`.
    pub const fn intersects(self, other: TokenAttr) -> bool {
        self.0 & other.0 != 0
    }
    fn set(&mut self, other: TokenAttr, on: bool) {
        if on {
            self.0 |= other.0;
        } else {
            self.0 &= !other.0;
        }
    }

    /// The attribute of a `tokenizer.ggml.token_type` value.
    fn from_token_type(token_type: i32) -> TokenAttr {
        match token_type {
            1 => TokenAttr::NORMAL,
            2 => TokenAttr::UNKNOWN,
            3 => TokenAttr::CONTROL,
            4 => TokenAttr::USER_DEFINED,
            5 => TokenAttr::UNUSED,
            6 => TokenAttr::BYTE,
            _ => TokenAttr::UNDEFINED,
        }
    }
}

impl std::ops::BitOr for TokenAttr {
    type Output = TokenAttr;
    fn bitor(self, rhs: TokenAttr) -> TokenAttr {
        TokenAttr(self.0 | rhs.0)
    }
}

impl fmt::Debug for TokenAttr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const NAMES: [&str; 10] = [
            "UNKNOWN",
            "UNUSED",
            "NORMAL",
            "CONTROL",
            "USER_DEFINED",
            "BYTE",
            "NORMALIZED",
            "LSTRIP",
            "RSTRIP",
            "SINGLE_WORD",
        ];
        let names: Vec<&str> = (0..10)
            .filter(|b| self.0 & (1 << b) != 0)
            .map(|b| NAMES[b])
            .collect();
        if names.is_empty() {
            f.write_str("UNDEFINED")
        } else {
            f.write_str(&names.join("|"))
        }
    }
}

/// Which algorithm turns text into tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenizerKind {
    /// SentencePiece (`tokenizer.ggml.model = "llama"`).
    SentencePiece,
    /// BPE (`tokenizer.ggml.model = "gpt2"`, byte-level; `"gemma4"`,
    /// SentencePiece-style).
    Bpe,
}

/// The special token ids a vocabulary defines (`None`: it has none).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpecialIds {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub eom: Option<u32>,
    pub unk: Option<u32>,
    pub sep: Option<u32>,
    pub pad: Option<u32>,
    pub mask: Option<u32>,
    pub fim_pre: Option<u32>,
    pub fim_suf: Option<u32>,
    pub fim_mid: Option<u32>,
    pub fim_pad: Option<u32>,
    pub fim_rep: Option<u32>,
    pub fim_sep: Option<u32>,
}

/// The token texts with their scores and attributes.
pub(crate) struct Vocab {
    texts: TextIndex,
    scores: Vec<f32>,
    attrs: Vec<TokenAttr>,
    /// SentencePiece's token for each byte (`<0xXX>`), or NONE.
    byte_tokens: [u32; 256],
    /// The characters some token has right before a `▁` (sorted).
    before_space: Vec<char>,
}

impl Vocab {
    fn len(&self) -> usize {
        self.texts.len()
    }
    fn text(&self, id: u32) -> &str {
        self.texts.get(id as usize)
    }
    fn byte_token(&self, byte: u8) -> Option<u32> {
        Some(self.byte_tokens[byte as usize]).filter(|&id| id != u32::MAX)
    }
}

/// A tokenizer loaded from GGUF metadata. Immutable; share it freely.
pub struct Tokenizer {
    kind: TokenizerKind,
    model_name: String,
    pre_name: String,
    vocab: Vocab,
    merges: Option<bpe::Merges>,
    pre: Option<pretokenize::PreTokenizer>,
    ids: SpecialIds,
    /// End-of-generation tokens, sorted.
    eog: Vec<u32>,
    add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
    clean_spaces: bool,
    ignore_merges: bool,
    /// Gemma 4's SentencePiece-style BPE (`PreConfig::spm_style`).
    spm_style: bool,
    /// Control tokens of the file that llama.cpp makes user-defined so that
    /// they render as text (gpt-oss's harmony markup), sorted: parsed in
    /// text as user-defined tokens are, never in a chat message.
    markup: Vec<u32>,
    specials: special::SpecialTokens,
    /// Each token rendered as `token_to_piece(.., special = true)` does.
    pieces: detok::Pieces,
}

/// Token texts llama.cpp takes for end-of-turn tokens when the file names none.
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
const EOM_TEXTS: &[&str] = &["<|eom_id|>"];
const FIM_PRE_TEXTS: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
];
const FIM_SUF_TEXTS: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
];
const FIM_MID_TEXTS: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
];
const FIM_PAD_TEXTS: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_TEXTS: &[&str] = &[
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
];
const FIM_SEP_TEXTS: &[&str] = &["<|file_sep|>"];
/// Token texts llama.cpp treats as end of generation, whatever the file says.
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

/// Picks one id of [`SpecialIds`].
type IdSlot = fn(&mut SpecialIds) -> &mut Option<u32>;

fn read_bool(gguf: &GgufFile, key: &str) -> Result<Option<bool>> {
    gguf.get(key).map(|e| e.bool()).transpose()
}

fn read_id(gguf: &GgufFile, key: &str) -> Result<Option<u32>> {
    gguf.get(key).map(|e| e.u32_in(0..=u32::MAX)).transpose()
}

impl Tokenizer {
    /// Reads the tokenizer of a GGUF file. Unknown tokenizer models and
    /// pre-tokenizers are `Unsupported`; malformed metadata is `Format`.
    pub fn from_gguf(gguf: &GgufFile) -> Result<Tokenizer> {
        let model_name = gguf.require("tokenizer.ggml.model")?.str()?.to_string();
        let mut pre_name = match gguf.get("tokenizer.ggml.pre") {
            Some(e) => e.str()?.to_string(),
            None => String::new(),
        };
        let tokens_entry = gguf.require("tokenizer.ggml.tokens")?;
        let tokens = tokens_entry.string_array()?;
        let n = tokens.len();
        if n == 0 || n > i32::MAX as usize {
            return Err(Error::format(format!(
                "tokenizer.ggml.tokens holds {n} tokens"
            )));
        }

        let mut ids = SpecialIds::default();
        let (kind, merges, pre, clean_spaces, ignore_merges, mut add_bos, mut add_space_prefix);
        let mut spm_style = false;
        let mut add_eos = false;
        match model_name.as_str() {
            "llama" => {
                kind = TokenizerKind::SentencePiece;
                (ids.bos, ids.eos, ids.unk) = (Some(1), Some(2), Some(0));
                (merges, pre) = (None, None);
                (add_space_prefix, clean_spaces, add_bos, ignore_merges) = (true, false, true, false);
            }
            "gpt2" | "gemma4" => {
                kind = TokenizerKind::Bpe;
                let entry = gguf
                    .get("tokenizer.ggml.merges")
                    .ok_or_else(|| Error::format("missing metadata key 'tokenizer.ggml.merges' (a BPE tokenizer needs its merges)"))?;
                let entries = entry.string_array()?;
                merges = Some(bpe::Merges::new(entries));
                if model_name == "gemma4" {
                    // No default special ids; the pre-tokenizer is Gemma 4's
                    // whatever the file names.
                    pre_name = "gemma4".to_string();
                } else {
                    (ids.bos, ids.eos) = (Some(11), Some(11));
                }
                let config = pretokenize::config(&pre_name).ok_or_else(|| {
                    Error::unsupported(format!(
                        "pre-tokenizer '{}' (tokenizer.ggml.pre) is not supported (supported: {})",
                        echo(&pre_name),
                        pretokenize::NAMES.join(", ")
                    ))
                })?;
                pre = Some(pretokenize::PreTokenizer::new(config.patterns)?);
                add_space_prefix = false;
                clean_spaces = config.clean_spaces;
                ignore_merges = config.ignore_merges;
                add_bos = config.add_bos.unwrap_or(false);
                if config.no_bos {
                    ids.bos = None;
                }
                spm_style = config.spm_style;
            }
            other => {
                return Err(Error::unsupported(format!(
                    "tokenizer model '{}' (tokenizer.ggml.model) is not supported (supported: llama, gpt2, gemma4)",
                    echo(other)
                )))
            }
        }
        if let Some(v) = read_bool(gguf, "tokenizer.ggml.add_space_prefix")? {
            add_space_prefix = v;
        }

        let scores = match gguf.get("tokenizer.ggml.scores") {
            None => vec![0.0; n],
            Some(e) => match e.array()? {
                Array::F32(v) if v.len() >= n => v[..n].to_vec(),
                Array::I32(v) if v.len() >= n => v[..n].iter().map(|&s| s as f32).collect(),
                other => {
                    return Err(Error::format(format!(
                        "tokenizer.ggml.scores must be an array of at least {n} f32 or i32, it is {} of {}",
                        other.len(),
                        other.element_type().name()
                    )))
                }
            },
        };
        let mut attrs = match gguf.get("tokenizer.ggml.token_type") {
            None => vec![TokenAttr::NORMAL; n],
            Some(e) => match e.array()? {
                Array::I32(v) if v.len() >= n => v[..n].iter().map(|&t| TokenAttr::from_token_type(t)).collect(),
                other => {
                    return Err(Error::format(format!(
                        "tokenizer.ggml.token_type must be an array of at least {n} i32, it is {} of {}",
                        other.len(),
                        other.element_type().name()
                    )))
                }
            },
        };

        let bytes: usize = tokens.iter().map(String::len).sum();
        let mut texts = TextIndex::with_capacity(n, bytes);
        for (i, token) in tokens.iter().enumerate() {
            let inserted = if token.is_empty() {
                texts.insert(&format!("[EMPTY_{i}]"))
            } else {
                texts.insert(token)
            };
            if let Err(first) = inserted {
                return Err(Error::format(format!(
                    "duplicate token in tokenizer.ggml.tokens: {:?} has ids {first} and {i}",
                    echo(token)
                )));
            }
        }

        // Special ids: defaults outside the vocabulary are dropped; a file's
        // id outside it is a malformed file. (llama.cpp warns and keeps the
        // default, which silently gives such a model another BOS or EOS.)
        let in_range = |id: Option<u32>| id.filter(|&id| (id as usize) < n);
        let special_keys: [(&str, IdSlot); 17] = [
            ("bos_token_id", |s| &mut s.bos),
            ("eos_token_id", |s| &mut s.eos),
            ("eot_token_id", |s| &mut s.eot),
            ("eom_token_id", |s| &mut s.eom),
            ("unknown_token_id", |s| &mut s.unk),
            ("seperator_token_id", |s| &mut s.sep),
            ("padding_token_id", |s| &mut s.pad),
            ("mask_token_id", |s| &mut s.mask),
            ("fim_pre_token_id", |s| &mut s.fim_pre),
            ("fim_suf_token_id", |s| &mut s.fim_suf),
            ("fim_mid_token_id", |s| &mut s.fim_mid),
            ("fim_pad_token_id", |s| &mut s.fim_pad),
            ("fim_rep_token_id", |s| &mut s.fim_rep),
            ("fim_sep_token_id", |s| &mut s.fim_sep),
            ("prefix_token_id", |s| &mut s.fim_pre),
            ("suffix_token_id", |s| &mut s.fim_suf),
            ("middle_token_id", |s| &mut s.fim_mid),
        ];
        for (key, field) in special_keys {
            let slot = field(&mut ids);
            *slot = in_range(*slot);
            let key = format!("tokenizer.ggml.{key}");
            if let Some(id) = read_id(gguf, &key)? {
                if id as usize >= n {
                    return Err(Error::format(format!(
                        "metadata key '{key}' = {id} is outside the vocabulary of {n} tokens"
                    )));
                }
                *slot = Some(id);
            }
        }
        if let Some(v) = read_bool(gguf, "tokenizer.ggml.add_bos_token")? {
            add_bos = v;
        }
        // llama.cpp adds BOS for Gemma 4 even where the file says not to.
        add_bos |= spm_style;
        if let Some(v) = read_bool(gguf, "tokenizer.ggml.add_eos_token")? {
            add_eos = v;
        }
        let add_sep = read_bool(gguf, "tokenizer.ggml.add_sep_token")?.unwrap_or(false);
        for (add, id, what) in [
            (add_bos, ids.bos, "bos"),
            (add_eos, ids.eos, "eos"),
            (add_sep, ids.sep, "seperator"),
        ] {
            if add && id.is_none() {
                return Err(Error::format(format!(
                    "tokenizer.ggml.add_{}_token is true, but tokenizer.ggml.{what}_token_id is not set",
                    if what == "seperator" { "sep" } else { what }
                )));
            }
        }

        // Tokens recognised by their text; each found one becomes a control
        // token. (llama.cpp walks a hash map; the first match in id order
        // is taken here, which differs only for files with several
        // candidates of one kind.)
        let control = TokenAttr::CONTROL;
        let find_first = |texts: &TextIndex, names: &[&str]| {
            names.iter().filter_map(|name| texts.find(name)).min()
        };
        for (slot, names) in [
            (&mut ids.eot, EOT_TEXTS),
            (&mut ids.eom, EOM_TEXTS),
            (&mut ids.fim_pre, FIM_PRE_TEXTS),
            (&mut ids.fim_suf, FIM_SUF_TEXTS),
            (&mut ids.fim_mid, FIM_MID_TEXTS),
            (&mut ids.fim_pad, FIM_PAD_TEXTS),
            (&mut ids.fim_rep, FIM_REP_TEXTS),
            (&mut ids.fim_sep, FIM_SEP_TEXTS),
        ] {
            if slot.is_none() {
                if let Some(id) = find_first(&texts, names) {
                    *slot = Some(id);
                    attrs[id as usize].set(control, true);
                }
            }
        }
        for (id, a) in attrs.iter_mut().enumerate() {
            if a.contains(control) && texts.get(id).contains("unused") {
                a.set(TokenAttr::UNUSED, true);
            }
        }

        let mut eog: Vec<u32> = [ids.fim_pad, ids.fim_rep, ids.fim_sep]
            .into_iter()
            .flatten()
            .collect();
        for name in EOG_TEXTS {
            if let Some(id) = texts.find(name) {
                eog.push(id);
                attrs[id as usize].set(control, true);
            }
        }
        // gpt-oss: these render as text.
        let mut markup = Vec::new();
        let mut render_as_text = |attrs: &mut [TokenAttr], id: u32| {
            if attrs[id as usize].contains(control) {
                markup.push(id);
            }
            attrs[id as usize] = TokenAttr::USER_DEFINED;
        };
        for name in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"] {
            if let Some(id) = texts.find(name) {
                render_as_text(&mut attrs, id);
            }
        }
        eog.extend([ids.eos, ids.eot, ids.eom].into_iter().flatten());
        eog.sort_unstable();
        eog.dedup();
        let eog_has =
            |eog: &[u32], name: &str| eog.iter().any(|&id| texts.get(id as usize) == name);
        // o200k_harmony and solar-open: "<|end|>" ends a message, not the generation.
        if eog_has(&eog, "<|end|>")
            && ((eog_has(&eog, "<|return|>")
                && (eog_has(&eog, "<|call|>") || eog_has(&eog, "<|calls|>")))
                || ((eog_has(&eog, "<|call|>") || eog_has(&eog, "<|calls|>"))
                    && eog_has(&eog, "<|flush|>")))
        {
            let end = texts.find("<|end|>").unwrap();
            eog.retain(|&id| id != end);
            render_as_text(&mut attrs, end);
        }
        markup.sort_unstable();
        // Gemma 4: "</s>" is text there.
        if eog_has(&eog, "<|tool_response>") && eog_has(&eog, "</s>") {
            let s = texts.find("</s>").unwrap();
            eog.retain(|&id| id != s);
            attrs[s as usize] = TokenAttr::NORMAL;
        }

        let mut byte_tokens = [u32::MAX; 256];
        if spm_style {
            // Only `<0xXX>` tokens stand for a byte; a byte without one is
            // dropped, as llama.cpp drops it.
            for (b, slot) in byte_tokens.iter_mut().enumerate() {
                *slot = texts.find(&format!("<0x{b:02X}>")).unwrap_or(u32::MAX);
            }
        } else if kind == TokenizerKind::SentencePiece {
            for (b, slot) in byte_tokens.iter_mut().enumerate() {
                let hex = format!("<0x{b:02X}>");
                let single = (b < 0x80)
                    .then(|| texts.find(std::str::from_utf8(&[b as u8]).unwrap()))
                    .flatten();
                // llama.cpp throws when a byte has no token; we use <unk>.
                *slot = texts.find(&hex).or(single).or(ids.unk).unwrap_or(u32::MAX);
            }
        }
        let mut before_space: Vec<char> = Vec::new();
        for id in 0..n {
            let text = texts.get(id);
            let mut prev = None;
            for c in text.chars() {
                if c == '▁' {
                    if let Some(p) = prev {
                        if !before_space.contains(&p) {
                            before_space.push(p);
                        }
                    }
                }
                prev = Some(c);
            }
        }
        before_space.sort_unstable();
        let mut vocab = Vocab {
            texts,
            scores,
            attrs,
            byte_tokens,
            before_space,
        };
        let specials = special::SpecialTokens::new(&vocab);
        let pieces = detok::Pieces::new(kind == TokenizerKind::Bpe && !spm_style, &vocab);

        // Per-model attributes llama.cpp sets by name.
        let lower = |key: &str| {
            gguf.get(key)
                .and_then(|e| e.str().ok().map(str::to_lowercase))
                .unwrap_or_default()
        };
        let (general_name, architecture) = (lower("general.name"), lower("general.architecture"));
        let set_attr = |vocab: &mut Vocab, name: &str, attr: TokenAttr, on: bool| {
            if let Some(id) = vocab.texts.find(name) {
                vocab.attrs[id as usize].set(attr, on);
            }
        };
        if ["jina-v2-de", "jina-v2-es", "jina-v2-code"]
            .iter()
            .any(|p| pre_name.contains(p))
            || ["nomic-bert-moe", "jina-bert-v3"]
                .iter()
                .any(|a| architecture.contains(a))
        {
            set_attr(&mut vocab, "<mask>", TokenAttr::LSTRIP, true);
        } else if general_name.contains("phi-3") || general_name.contains("phi3") {
            for &id in specials.tokens() {
                vocab.attrs[id as usize].set(TokenAttr::RSTRIP, true);
            }
            set_attr(&mut vocab, "</s>", TokenAttr::RSTRIP, true);
            for name in ["<unk>", "<s>", "<|endoftext|>"] {
                set_attr(&mut vocab, name, TokenAttr::RSTRIP, false);
            }
        } else if general_name.contains("modern-bert") {
            set_attr(&mut vocab, "[MASK]", TokenAttr::LSTRIP, true);
        }

        Ok(Tokenizer {
            kind,
            model_name,
            pre_name,
            vocab,
            merges,
            pre,
            ids,
            eog,
            add_bos,
            add_eos,
            add_space_prefix,
            clean_spaces,
            ignore_merges,
            spm_style,
            markup,
            specials,
            pieces,
        })
    }

    pub fn kind(&self) -> TokenizerKind {
        self.kind
    }
    /// `tokenizer.ggml.model` as the file spells it.
    pub fn model_name(&self) -> &str {
        &self.model_name
    }
    /// `tokenizer.ggml.pre` as the file spells it ("" when absent).
    pub fn pre_name(&self) -> &str {
        &self.pre_name
    }
    /// The number of tokens.
    pub fn n_vocab(&self) -> u32 {
        self.vocab.len() as u32
    }
    /// The number of BPE merges (0 for SentencePiece).
    pub fn n_merges(&self) -> usize {
        self.merges.as_ref().map_or(0, bpe::Merges::len)
    }
    pub fn special_ids(&self) -> &SpecialIds {
        &self.ids
    }
    pub fn bos(&self) -> Option<u32> {
        self.ids.bos
    }
    pub fn eos(&self) -> Option<u32> {
        self.ids.eos
    }
    /// Whether `add_special` tokenization starts with BOS / ends with EOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }
    pub fn add_eos(&self) -> bool {
        self.add_eos
    }
    pub fn add_space_prefix(&self) -> bool {
        self.add_space_prefix
    }
    /// The end-of-generation tokens, ascending.
    pub fn eog_tokens(&self) -> &[u32] {
        &self.eog
    }
    /// Whether generating `token` ends the generation (EOS, EOT, EOM and the
    /// tokens llama.cpp recognises by their text, like `<end_of_turn>`,
    /// `<|eot_id|>`, `<|im_end|>`, `<|endoftext|>`).
    pub fn is_eog(&self, token: u32) -> bool {
        self.eog.binary_search(&token).is_ok()
    }
    /// The token's text as the vocabulary stores it.
    pub fn token_text(&self, token: u32) -> Option<&str> {
        ((token as usize) < self.vocab.len()).then(|| self.vocab.text(token))
    }
    pub fn token_score(&self, token: u32) -> Option<f32> {
        self.vocab.scores.get(token as usize).copied()
    }
    pub fn token_attr(&self, token: u32) -> Option<TokenAttr> {
        self.vocab.attrs.get(token as usize).copied()
    }
    /// The token whose text is exactly `text`.
    pub fn find_token(&self, text: &str) -> Option<u32> {
        self.vocab.texts.find(text)
    }

    /// Tokenizes `text` as `llama_tokenize` does: `add_special` adds BOS/EOS
    /// as the metadata asks; `parse_special` recognises control tokens in
    /// the text (user-defined tokens are always recognised).
    pub fn tokenize(&self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<u32>> {
        let fragments = self.specials.partition(&self.vocab, text, parse_special);
        self.tokenize_fragments(text, add_special, fragments)
    }

    /// Tokenizes a chat prompt whose `content` byte ranges are the
    /// messages' text (`ChatPrompt`): special tokens are parsed in the rest,
    /// the chat format's markup, as `tokenize` with `parse_special` would;
    /// text in the messages never becomes a control token (so a user cannot
    /// close their turn and write the model's), nor an end-of-generation
    /// one, and other user-defined tokens are recognised there as
    /// `tokenize` always recognises them (but for the file's control tokens
    /// that render as text, gpt-oss's `<|start|>`, `<|message|>`,
    /// `<|channel|>`, `<|constrain|>` and `<|end|>`: its turns' markup).
    /// Text without special tokens in its messages tokenizes exactly as
    /// `tokenize` with `parse_special`.
    pub fn tokenize_chat(
        &self,
        text: &str,
        add_special: bool,
        content: &[Range<usize>],
    ) -> Result<Vec<u32>> {
        let in_content = |bytes: &Range<usize>| {
            // First range ending after the start; overlaps if it starts
            // before the end.
            let i = content.partition_point(|c| c.end <= bytes.start);
            content.get(i).is_some_and(|c| c.start < bytes.end)
        };
        let fragments = self
            .specials
            .partition_where(&self.vocab, text, |id, bytes| {
                !in_content(&bytes)
                    || (self.vocab.attrs[id as usize].contains(TokenAttr::USER_DEFINED)
                        && !self.is_eog(id)
                        && self.markup.binary_search(&id).is_err())
            });
        self.tokenize_fragments(text, add_special, fragments)
    }

    fn tokenize_fragments(
        &self,
        text: &str,
        add_special: bool,
        fragments: Vec<special::Fragment>,
    ) -> Result<Vec<u32>> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && self.add_bos {
            out.extend(self.ids.bos);
        }
        match self.kind {
            TokenizerKind::SentencePiece => {
                let mut scratch = spm::SpmScratch::default();
                let mut buf = String::new();
                let mut prev_special = true;
                for fragment in fragments {
                    match fragment {
                        special::Fragment::Text(range) => {
                            buf.clear();
                            if self.add_space_prefix && prev_special {
                                buf.push('▁');
                            }
                            for c in text[range].chars() {
                                if c == ' ' {
                                    buf.push('▁');
                                } else {
                                    buf.push(c);
                                }
                            }
                            spm::tokenize(&self.vocab, &buf, &mut scratch, &mut out);
                            prev_special = false;
                        }
                        special::Fragment::Token(id) => {
                            out.push(id);
                            prev_special = true;
                        }
                    }
                }
            }
            TokenizerKind::Bpe => {
                let (pre, merges) = (self.pre.as_ref().unwrap(), self.merges.as_ref().unwrap());
                let mut scratch = bpe::BpeScratch::default();
                for fragment in fragments {
                    match fragment {
                        special::Fragment::Text(range) => {
                            let escaped;
                            let fragment = if self.spm_style {
                                escaped = text[range].replace(' ', "▁");
                                escaped.as_str()
                            } else {
                                &text[range]
                            };
                            for word in pre.split(fragment)? {
                                bpe::tokenize_word(
                                    &self.vocab,
                                    merges,
                                    (self.ignore_merges, self.spm_style),
                                    &fragment[word],
                                    &mut scratch,
                                    &mut out,
                                );
                            }
                        }
                        special::Fragment::Token(id) => out.push(id),
                    }
                }
            }
        }
        if add_special && self.add_eos {
            out.extend(self.ids.eos);
        }
        Ok(out)
    }
}

impl fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tokenizer")
            .field("kind", &self.kind)
            .field("pre", &self.pre_name)
            .field("n_vocab", &self.vocab.len())
            .field("bos", &self.ids.bos)
            .field("eos", &self.ids.eos)
            .finish_non_exhaustive()
    }
}
