//! SentencePiece (`tokenizer.ggml.model = "llama"`): score-ordered merges.
//!
//! The text (spaces already written as `▁`) starts as one symbol per UTF-8
//! character. Every adjacent pair whose concatenation is a token is a
//! candidate; the candidate whose token has the highest score is merged first
//! (ties: the leftmost), the pairs around the merged symbol become candidates,
//! and so on until none is left. A max-heap with lazy deletion makes this
//! O(n log n) in the number of characters. Symbols that are not tokens in the
//! end (characters outside the vocabulary) are written as their bytes'
//! `<0xXX>` tokens.
//!
//! A merge can only join two symbols that some token contains side by side.
//! Where a `▁` follows a character that no token has just before a `▁`, no
//! merge can ever cross, so the text is cut there first and each piece
//! (about a word) merged on its own: the same result, with small heaps.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::unicode::utf8_len;
use super::Vocab;

const NONE: u32 = u32::MAX;

#[derive(Clone, Copy)]
struct Symbol {
    start: u32,
    /// Bytes; 0 once merged into the symbol on its left.
    len: u32,
    prev: u32,
    next: u32,
}

/// A candidate merge of `left` and the symbol after it.
#[derive(Clone, Copy)]
struct Bigram {
    score: f32,
    left: u32,
    right: u32,
    /// Bytes of the pair when it was proposed; a pair that has changed since
    /// no longer adds up to this.
    size: u32,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Bigram {
    /// Higher score first; equal scores, the leftmost first. (-0.0 and 0.0
    /// are equal scores, as they are to C++'s `<`.)
    fn cmp(&self, other: &Self) -> Ordering {
        let key = |s: f32| if s == 0.0 { 0.0 } else { s };
        key(self.score)
            .total_cmp(&key(other.score))
            .then_with(|| other.left.cmp(&self.left))
    }
}

/// Buffers reused across the fragments of one tokenize call.
#[derive(Default)]
pub(crate) struct SpmScratch {
    symbols: Vec<Symbol>,
    heap: BinaryHeap<Bigram>,
}

/// Appends the tokens of `text` (whose spaces are already `▁`) to `out`.
pub(crate) fn tokenize(vocab: &Vocab, text: &str, scratch: &mut SpmScratch, out: &mut Vec<u32>) {
    let mut start = 0;
    let mut prev: Option<char> = None;
    for (i, c) in text.char_indices() {
        if c == '▁' && i > start && prev.is_some_and(|p| !vocab.before_space.contains(&p)) {
            tokenize_piece(vocab, &text[start..i], scratch, out);
            start = i;
        }
        prev = Some(c);
    }
    tokenize_piece(vocab, &text[start..], scratch, out);
}

/// [`tokenize`] for a piece no merge crosses into or out of.
fn tokenize_piece(vocab: &Vocab, text: &str, scratch: &mut SpmScratch, out: &mut Vec<u32>) {
    let bytes = text.as_bytes();
    let symbols = &mut scratch.symbols;
    symbols.clear();
    let mut offset = 0usize;
    while offset < bytes.len() {
        let len = utf8_len(bytes[offset]).min(bytes.len() - offset);
        let index = symbols.len() as u32;
        symbols.push(Symbol {
            start: offset as u32,
            len: len as u32,
            prev: if index == 0 { NONE } else { index - 1 },
            next: if offset + len == bytes.len() {
                NONE
            } else {
                index + 1
            },
        });
        offset += len;
    }
    if symbols.is_empty() {
        return;
    }

    let heap = &mut scratch.heap;
    heap.clear();
    let propose = |symbols: &[Symbol], heap: &mut BinaryHeap<Bigram>, left: u32, right: u32| {
        if left == NONE || right == NONE {
            return;
        }
        let l = symbols[left as usize];
        let size = l.len + symbols[right as usize].len;
        let pair = &bytes[l.start as usize..(l.start + size) as usize];
        if let Some(id) = vocab.texts.find_bytes(pair) {
            heap.push(Bigram {
                score: vocab.scores[id as usize],
                left,
                right,
                size,
            });
        }
    };
    for i in 1..symbols.len() as u32 {
        propose(symbols, heap, i - 1, i);
    }
    while let Some(b) = heap.pop() {
        let (l, r) = (b.left as usize, b.right as usize);
        if symbols[l].len == 0 || symbols[r].len == 0 || symbols[l].len + symbols[r].len != b.size {
            continue; // one side was merged since this pair was proposed
        }
        symbols[l].len += symbols[r].len;
        symbols[r].len = 0;
        let after = symbols[r].next;
        symbols[l].next = after;
        if after != NONE {
            symbols[after as usize].prev = b.left;
        }
        propose(symbols, heap, symbols[l].prev, b.left);
        propose(symbols, heap, b.left, after);
    }

    // Every merged symbol is a token by construction; a symbol that is not
    // is a single character outside the vocabulary: byte fallback.
    let mut i = 0u32;
    while i != NONE {
        let s = symbols[i as usize];
        let piece = &bytes[s.start as usize..(s.start + s.len) as usize];
        match vocab.texts.find_bytes(piece) {
            Some(id) => out.push(id),
            None => {
                for &byte in piece {
                    if let Some(id) = vocab.byte_token(byte) {
                        out.push(id);
                    }
                }
            }
        }
        i = s.next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::{GgufFile, ReadOptions};
    use crate::tokenizer::Tokenizer;

    fn vocab_file(name: &str) -> Tokenizer {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join(format!("tests/data/vocab/ggml-vocab-{name}.gguf"));
        let options = ReadOptions {
            use_mmap: true,
            load_data: false,
        };
        Tokenizer::from_gguf(&GgufFile::open(&path, options).unwrap()).unwrap()
    }

    #[test]
    fn cutting_at_spaces_no_token_spans_changes_nothing() {
        for name in ["llama-spm", "phi-3"] {
            let tokenizer = vocab_file(name);
            let vocab = &tokenizer.vocab;
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join(format!("tests/data/vocab/ggml-vocab-{name}.gguf.inp"));
            let text = std::fs::read_to_string(path).unwrap();
            let escaped = format!("▁{}", text.replace(' ', "▁")).repeat(3);
            let (mut cut, mut whole) = (Vec::new(), Vec::new());
            let mut scratch = SpmScratch::default();
            tokenize(vocab, &escaped, &mut scratch, &mut cut);
            tokenize_piece(vocab, &escaped, &mut scratch, &mut whole);
            assert!(cut.len() > 1000, "{name}");
            assert_eq!(cut, whole, "{name}");
        }
    }
}
