//! Pieces and detokenization, rendered as llama.cpp's `token_to_piece` and
//! `detokenize` render them.
//!
//! A token's piece: control, unknown and user-defined tokens are their text;
//! normal tokens are their text with `▁` as a space (SentencePiece, and
//! Gemma 4's BPE) or decoded from GPT-2's byte alphabet (byte-level BPE);
//! byte tokens `<0xXX>` are that
//! one byte, which may be part of a multi-byte UTF-8 character. Control and
//! unknown tokens render as nothing unless special tokens are asked for.

use super::unicode::char_to_byte;
use super::{TokenAttr, Tokenizer, Vocab};
use crate::error::{Error, Result};

/// Every token's piece (as rendered with `special = true`), end to end.
pub(crate) struct Pieces {
    bytes: Vec<u8>,
    ends: Vec<usize>,
}

impl Pieces {
    /// `byte_level`: normal tokens are written in GPT-2's byte alphabet
    /// (else with `▁` for a space).
    pub(crate) fn new(byte_level: bool, vocab: &Vocab) -> Pieces {
        let mut bytes = Vec::with_capacity(vocab.len() * 6);
        let mut ends = Vec::with_capacity(vocab.len());
        for id in 0..vocab.len() as u32 {
            render(byte_level, vocab, id, &mut bytes);
            ends.push(bytes.len());
        }
        bytes.shrink_to_fit();
        Pieces { bytes, ends }
    }

    fn get(&self, id: u32) -> &[u8] {
        let id = id as usize;
        let start = if id == 0 { 0 } else { self.ends[id - 1] };
        &self.bytes[start..self.ends[id]]
    }
}

/// Appends token `id`'s piece (with special tokens rendered) to `out`.
fn render(byte_level: bool, vocab: &Vocab, id: u32, out: &mut Vec<u8>) {
    let attr = vocab.attrs[id as usize];
    let text = vocab.text(id);
    if attr.intersects(TokenAttr::UNKNOWN | TokenAttr::CONTROL | TokenAttr::USER_DEFINED) {
        out.extend_from_slice(text.as_bytes());
    } else if attr.contains(TokenAttr::NORMAL) {
        if byte_level {
            decode_byte_level(text, out)
        } else {
            out.extend_from_slice(text.replace('▁', " ").as_bytes())
        }
    } else if attr.contains(TokenAttr::BYTE) {
        out.push(byte_token_value(text));
    }
    // Other attributes (undefined, unused) render as nothing.
}

/// The byte of a `<0xXX>` token: the hex digits at 3..5, read as `strtol`
/// reads them (as far as they are hex digits).
fn byte_token_value(text: &str) -> u8 {
    let digits = text.as_bytes().get(3..).unwrap_or(&[]);
    let mut value = 0u32;
    for &d in digits.iter().take(2) {
        match (d as char).to_digit(16) {
            Some(v) => value = value * 16 + v,
            None => break,
        }
    }
    value as u8
}

/// A BPE token's text in GPT-2's byte alphabet, back to bytes. A character
/// outside the alphabet is written as llama.cpp writes it:
/// `[UNK_BYTE_0x<its UTF-8 in hex><the token text>]`.
fn decode_byte_level(text: &str, out: &mut Vec<u8>) {
    for c in text.chars() {
        match char_to_byte(c) {
            Some(b) => out.push(b),
            None => {
                out.extend_from_slice(b"[UNK_BYTE_0x");
                let mut utf8 = [0u8; 4];
                for b in c.encode_utf8(&mut utf8).as_bytes() {
                    out.extend_from_slice(format!("{b:02x}").as_bytes());
                }
                out.extend_from_slice(text.as_bytes());
                out.push(b']');
            }
        }
    }
}

impl Tokenizer {
    fn check(&self, token: u32) -> Result<()> {
        if (token as usize) < self.vocab.len() {
            Ok(())
        } else {
            Err(Error::invalid_argument(format!(
                "token {token} is out of range (the vocabulary has {} tokens)",
                self.vocab.len()
            )))
        }
    }

    /// The text of one token, as `llama_token_to_piece(token, lstrip,
    /// special)`: up to `lstrip` leading spaces are dropped; with `special`
    /// false, control and unknown tokens are empty. Not NUL-terminated, and
    /// possibly a fragment of a UTF-8 character (byte tokens).
    pub fn token_to_piece(&self, token: u32, lstrip: usize, special: bool) -> Result<&[u8]> {
        self.check(token)?;
        let attr = self.vocab.attrs[token as usize];
        if !special && attr.intersects(TokenAttr::UNKNOWN | TokenAttr::CONTROL) {
            return Ok(&[]);
        }
        let mut piece = self.pieces.get(token);
        for _ in 0..lstrip {
            match piece.split_first() {
                Some((b' ', rest)) => piece = rest,
                _ => break,
            }
        }
        Ok(piece)
    }

    /// Text of `tokens` as `llama_detokenize` writes it: with
    /// `remove_special`, a leading BOS and trailing EOS that the metadata
    /// adds are dropped; `unparse_special` renders control tokens; a model
    /// that prefixes a space (SentencePiece) loses the first token's leading
    /// space unless a BOS was dropped before it; BPE models that ask for it
    /// get llama.cpp's clean-up of spaces before punctuation and
    /// contractions. The bytes need not be valid UTF-8.
    pub fn detokenize(
        &self,
        tokens: &[u32],
        remove_special: bool,
        unparse_special: bool,
    ) -> Result<Vec<u8>> {
        for (i, &t) in tokens.iter().enumerate() {
            self.check(t)
                .map_err(|e| e.context(format!("tokens[{i}]")))?;
        }
        let mut tokens = tokens;
        let mut remove_space = self.add_space_prefix;
        if remove_special && self.add_bos && same(tokens.first(), self.ids.bos) {
            remove_space = false;
            tokens = &tokens[1..];
        }
        if remove_special && self.add_eos && same(tokens.last(), self.ids.eos) {
            tokens = &tokens[..tokens.len() - 1];
        }
        let mut out = Vec::with_capacity(tokens.len() * 6);
        for &t in tokens {
            out.extend_from_slice(self.token_to_piece(
                t,
                remove_space as usize,
                unparse_special,
            )?);
            remove_space = false;
        }
        if self.clean_spaces {
            clean_spaces(&mut out);
        }
        Ok(out)
    }
}

/// Whether `token` is the special token `special` (which may not exist).
fn same(token: Option<&u32>, special: Option<u32>) -> bool {
    matches!((token, special), (Some(&t), Some(s)) if t == s)
}

/// llama.cpp's `clean_up_tokenization_spaces`, pass for pass: drop the space
/// before `? ! . ,`; turn ` ' ` into `'`; drop the space before `'s 'm 're
/// 've`.
fn clean_spaces(text: &mut Vec<u8>) {
    if text.is_empty() {
        return;
    }
    // Pass 1: " ?", " !", " .", " ,".
    let src = std::mem::take(text);
    let mut out = Vec::with_capacity(src.len());
    out.push(src[0]);
    for i in 1..src.len() {
        let x = src[i];
        if src[i - 1] == b' ' && matches!(x, b'?' | b'!' | b'.' | b',') {
            out.pop();
        }
        out.push(x);
    }

    // Pass 2: " ' " becomes "'". llama.cpp blanks the skipped space in its
    // buffer, which the next step then sees; so does this.
    let mut src = out;
    let mut out = Vec::with_capacity(src.len());
    out.push(src[0]);
    let mut i = 1;
    while i < src.len() {
        let x = src[i];
        if x == b'\'' && i + 1 < src.len() && src[i - 1] == b' ' && src[i + 1] == b' ' {
            out.pop();
            i += 1;
            src[i] = 0;
        }
        out.push(x);
        i += 1;
    }

    // Pass 3: " 's", " 'm", " 're", " 've" lose their space.
    let src = out;
    let mut out = Vec::with_capacity(src.len());
    out.push(src[0]);
    for i in 1..src.len() {
        let x = src[i];
        if src[i - 1] == b' ' && x == b'\'' && i + 1 < src.len() {
            let x1 = src[i + 1];
            let removes = match x1 {
                b's' | b'm' => true,
                b't' | b'd' => false,
                _ => i + 2 < src.len() && matches!((x1, src[i + 2]), (b'r', b'e') | (b'v', b'e')),
            };
            if removes {
                out.pop();
            }
        }
        out.push(x);
    }
    *text = out;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cleaned(s: &str) -> String {
        let mut v = s.as_bytes().to_vec();
        clean_spaces(&mut v);
        String::from_utf8(v).unwrap()
    }

    #[test]
    fn clean_spaces_follows_llama_cpp() {
        assert_eq!(cleaned("Hello , world !"), "Hello, world!");
        assert_eq!(cleaned("a ' b"), "a'b");
        assert_eq!(cleaned("a ' ' b"), "a'' b");
        assert_eq!(
            cleaned("it 's we 're they 'll I 'd"),
            "it's we're they 'll I 'd"
        );
        assert_eq!(cleaned(" ."), ".");
        assert_eq!(cleaned("x"), "x");
        assert_eq!(cleaned(""), "");
    }

    #[test]
    fn byte_tokens_read_like_strtol() {
        assert_eq!(byte_token_value("<0x0A>"), 0x0A);
        assert_eq!(byte_token_value("<0xFF>"), 0xFF);
        assert_eq!(byte_token_value("<0xG1>"), 0);
        assert_eq!(byte_token_value("<0x"), 0);
    }

    #[test]
    fn byte_level_text_decodes_and_marks_strangers() {
        let mut out = Vec::new();
        decode_byte_level("ĠhelloĊ", &mut out);
        assert_eq!(out, b" hello\n");
        out.clear();
        decode_byte_level("a\u{400}", &mut out);
        assert_eq!(out, "a[UNK_BYTE_0xd080a\u{400}]".as_bytes());
    }
}
