//! BPE (`tokenizer.ggml.model = "gpt2"` and `"gemma4"`): rank-ordered merges.
//!
//! The pre-tokenizer cuts the text into words; each word is written in
//! GPT-2's byte alphabet (every byte one printable character; Gemma 4's
//! words stay raw UTF-8) and starts as one symbol per character. The adjacent pair listed earliest in
//! `tokenizer.ggml.merges` is merged first (ties: the leftmost), its
//! neighbours become candidates, until no listed pair is left; a min-heap
//! with lazy deletion makes it O(n log n). Each final symbol is looked up as
//! a token; one that is not a token contributes its single-byte tokens
//! (llama.cpp looks up each raw byte, so only ASCII ones can be found;
//! Gemma 4's are its `<0xXX>` tokens).

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

use super::index::{FxHashMap, TextIndex};
use super::unicode::{byte_to_char, utf8_len};
use super::Vocab;

const NONE: u32 = u32::MAX;

/// `tokenizer.ggml.merges`: the rank of each (left, right) pair.
pub(crate) struct Merges {
    /// Every distinct string that is the left or right side of a merge.
    sides: TextIndex,
    /// (left side << 32 | right side) -> rank; the first listing counts.
    ranks: FxHashMap<u64, u32>,
}

impl Merges {
    /// Parses merges as llama.cpp does: split at the first space after the
    /// first byte; an entry without one is ignored.
    pub(crate) fn new(entries: &[String]) -> Merges {
        let bytes: usize = entries.iter().map(String::len).sum();
        let mut sides = TextIndex::with_capacity(entries.len(), bytes);
        let mut ranks = FxHashMap::with_capacity_and_hasher(entries.len(), Default::default());
        for (rank, entry) in entries.iter().enumerate() {
            let Some(space) = entry.bytes().skip(1).position(|b| b == b' ').map(|i| i + 1) else {
                continue;
            };
            let mut side = |s: &str| sides.insert(s).unwrap_or_else(|existing| existing);
            let (left, right) = (side(&entry[..space]), side(&entry[space + 1..]));
            ranks.entry(pair(left, right)).or_insert(rank as u32);
        }
        Merges { sides, ranks }
    }

    pub(crate) fn len(&self) -> usize {
        self.ranks.len()
    }

    fn side(&self, text: &[u8]) -> u32 {
        self.sides.find_bytes(text).unwrap_or(NONE)
    }

    fn rank(&self, left: u32, right: u32) -> Option<u32> {
        if left == NONE || right == NONE {
            return None;
        }
        self.ranks.get(&pair(left, right)).copied()
    }
}

fn pair(left: u32, right: u32) -> u64 {
    (u64::from(left) << 32) | u64::from(right)
}

#[derive(Clone, Copy)]
struct Symbol {
    start: u32,
    len: u32,
    prev: u32,
    next: u32,
    /// This symbol's text as a merge side, or NONE.
    side: u32,
}

#[derive(Clone, Copy, PartialEq, Eq)]
struct Bigram {
    rank: u32,
    left: u32,
    right: u32,
    left_len: u32,
    right_len: u32,
}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Bigram {
    /// Lowest rank, then leftmost, first (with `Reverse` in a max-heap).
    fn cmp(&self, other: &Self) -> Ordering {
        (self.rank, self.left).cmp(&(other.rank, other.left))
    }
}

/// Buffers reused across the words of one tokenize call.
#[derive(Default)]
pub(crate) struct BpeScratch {
    word: String,
    symbols: Vec<Symbol>,
    heap: BinaryHeap<Reverse<Bigram>>,
}

/// Appends the tokens of one pre-tokenized word (raw text) to `out`.
/// `(ignore_merges, spm_style)`: a word that is a token is that token;
/// Gemma 4's SentencePiece-style BPE (`PreConfig::spm_style`).
pub(crate) fn tokenize_word(
    vocab: &Vocab,
    merges: &Merges,
    (ignore_merges, spm_style): (bool, bool),
    raw: &str,
    scratch: &mut BpeScratch,
    out: &mut Vec<u32>,
) {
    let word = &mut scratch.word;
    word.clear();
    if spm_style {
        word.push_str(raw);
    } else {
        word.extend(raw.bytes().map(byte_to_char));
    }
    // Gemma 4: a run of newlines that is a token is not merged
    // (llama.cpp's fix of its pull request 21343).
    let newlines = spm_style && word.bytes().all(|b| b == b'\n');
    if ignore_merges || newlines {
        if let Some(id) = vocab.texts.find(word) {
            out.push(id);
            return;
        }
    }
    let bytes = word.as_bytes();
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
            side: merges.side(&bytes[offset..offset + len]),
        });
        offset += len;
    }

    let heap = &mut scratch.heap;
    heap.clear();
    let propose =
        |symbols: &[Symbol], heap: &mut BinaryHeap<Reverse<Bigram>>, left: u32, right: u32| {
            if left == NONE || right == NONE {
                return;
            }
            let (l, r) = (symbols[left as usize], symbols[right as usize]);
            if let Some(rank) = merges.rank(l.side, r.side) {
                heap.push(Reverse(Bigram {
                    rank,
                    left,
                    right,
                    left_len: l.len,
                    right_len: r.len,
                }));
            }
        };
    for i in 1..symbols.len() as u32 {
        propose(symbols, heap, i - 1, i);
    }
    while let Some(Reverse(b)) = heap.pop() {
        let (l, r) = (b.left as usize, b.right as usize);
        // A pair whose sides changed since it was proposed is outdated (its
        // text would differ: sides only ever grow, and a merged-away symbol
        // has length 0).
        if symbols[l].len == 0
            || symbols[r].len == 0
            || symbols[l].len != b.left_len
            || symbols[r].len != b.right_len
        {
            continue;
        }
        symbols[l].len += symbols[r].len;
        symbols[r].len = 0;
        let start = symbols[l].start as usize;
        symbols[l].side = merges.side(&bytes[start..start + symbols[l].len as usize]);
        let after = symbols[r].next;
        symbols[l].next = after;
        if after != NONE {
            symbols[after as usize].prev = b.left;
        }
        propose(symbols, heap, symbols[l].prev, b.left);
        propose(symbols, heap, b.left, after);
    }

    if symbols.is_empty() {
        return;
    }
    let mut i = 0u32;
    while i != NONE {
        let s = symbols[i as usize];
        let text = &bytes[s.start as usize..(s.start + s.len) as usize];
        match vocab.texts.find_bytes(text) {
            Some(id) => out.push(id),
            None if spm_style => out.extend(text.iter().filter_map(|&b| vocab.byte_token(b))),
            None => out.extend(text.iter().filter_map(|&b| vocab.texts.find_bytes(&[b]))),
        }
        i = s.next;
    }
}
