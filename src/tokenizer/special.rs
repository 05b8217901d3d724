//! The special-token partition: text is cut at special tokens before the
//! tokenizer proper sees it, as llama.cpp's `tokenizer_st_partition` does.
//!
//! llama.cpp takes the special tokens (CONTROL, USER_DEFINED and UNKNOWN
//! tokens) longest first; for each it cuts every remaining text fragment at
//! each occurrence, scanning left to right. USER_DEFINED tokens are always
//! cut out; CONTROL and UNKNOWN ones only with `parse_special`. A token with
//! the LSTRIP (RSTRIP) attribute also takes the ASCII whitespace before
//! (after) it.
//!
//! Scanning the whole text once per special token (Gemma has 6,414) would be
//! slow, so one pass over the text with a trie finds every occurrence of
//! every special token first; then each token that occurs, in llama.cpp's
//! order, cuts the fragments in one sweep. The result is the same.

use std::ops::Range;

use super::{TokenAttr, Vocab};

const NONE: u32 = u32::MAX;

/// A piece of the partitioned text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Fragment {
    /// Raw text (a byte range of the input) for the tokenizer.
    Text(Range<usize>),
    /// A special token found in the text.
    Token(u32),
}

#[derive(Default)]
struct Node {
    /// (byte, child node), sorted by byte.
    edges: Vec<(u8, u32)>,
    /// The special token that ends here, or NONE.
    token: u32,
}

/// The special tokens of a vocabulary, ready to find in text.
pub(crate) struct SpecialTokens {
    nodes: Vec<Node>,
    /// Which bytes can start a special token.
    starts: [bool; 256],
    /// Position of each special token in llama.cpp's processing order
    /// (longest first; equal lengths by id), by token id; NONE if not special.
    order: Vec<u32>,
    /// The tokens by that order.
    by_order: Vec<u32>,
}

impl SpecialTokens {
    /// Collects the tokens whose attributes make them special.
    pub(crate) fn new(vocab: &Vocab) -> SpecialTokens {
        let special = TokenAttr::CONTROL | TokenAttr::USER_DEFINED | TokenAttr::UNKNOWN;
        let mut by_order: Vec<u32> = (0..vocab.len() as u32)
            .filter(|&id| vocab.attrs[id as usize].intersects(special))
            .collect();
        by_order.sort_by_key(|&id| std::cmp::Reverse(vocab.text(id).len()));
        let mut order = vec![NONE; vocab.len()];
        let mut nodes = vec![Node {
            edges: Vec::new(),
            token: NONE,
        }];
        let mut starts = [false; 256];
        for (rank, &id) in by_order.iter().enumerate() {
            order[id as usize] = rank as u32;
            let text = vocab.text(id).as_bytes();
            let Some(&first) = text.first() else { continue };
            starts[first as usize] = true;
            let mut node = 0usize;
            for &b in text {
                node = match nodes[node].edges.binary_search_by_key(&b, |e| e.0) {
                    Ok(i) => nodes[node].edges[i].1 as usize,
                    Err(i) => {
                        let child = nodes.len();
                        nodes.push(Node {
                            edges: Vec::new(),
                            token: NONE,
                        });
                        nodes[node].edges.insert(i, (b, child as u32));
                        child
                    }
                };
            }
            nodes[node].token = id;
        }
        SpecialTokens {
            nodes,
            starts,
            order,
            by_order,
        }
    }

    /// The special tokens in llama.cpp's order (longest first).
    pub(crate) fn tokens(&self) -> &[u32] {
        &self.by_order
    }

    /// Cuts `text` at its special tokens (control and unknown ones only
    /// with `parse_special`).
    pub(crate) fn partition(
        &self,
        vocab: &Vocab,
        text: &str,
        parse_special: bool,
    ) -> Vec<Fragment> {
        let skipped = if parse_special {
            TokenAttr::empty()
        } else {
            TokenAttr::CONTROL | TokenAttr::UNKNOWN
        };
        self.partition_where(vocab, text, |id, _| {
            !vocab.attrs[id as usize].intersects(skipped)
        })
    }

    /// Cuts `text` at the occurrences of special tokens that `eligible`
    /// accepts (given the token and the bytes it would take).
    pub(crate) fn partition_where(
        &self,
        vocab: &Vocab,
        text: &str,
        eligible: impl Fn(u32, Range<usize>) -> bool,
    ) -> Vec<Fragment> {
        let bytes = text.as_bytes();
        if bytes.is_empty() {
            return Vec::new();
        }
        // Every occurrence of every eligible special token: (order, start).
        let mut found: Vec<(u32, u32)> = Vec::new();
        for start in 0..bytes.len() {
            if !self.starts[bytes[start] as usize] {
                continue;
            }
            let mut node = 0usize;
            for &b in &bytes[start..] {
                match self.nodes[node].edges.binary_search_by_key(&b, |e| e.0) {
                    Ok(i) => node = self.nodes[node].edges[i].1 as usize,
                    Err(_) => break,
                }
                let id = self.nodes[node].token;
                if id != NONE && eligible(id, start..start + vocab.text(id).len()) {
                    found.push((self.order[id as usize], start as u32));
                }
            }
        }
        let mut fragments = vec![Fragment::Text(0..bytes.len())];
        if found.is_empty() {
            return fragments;
        }
        found.sort_unstable();

        for group in found.chunk_by(|a, b| a.0 == b.0) {
            let id = self.by_order[group[0].0 as usize];
            let len = vocab.text(id).len();
            let attr = vocab.attrs[id as usize];
            let mut starts = group.iter().map(|&(_, s)| s as usize).peekable();
            let mut next = Vec::with_capacity(fragments.len() + group.len() * 2);
            for fragment in fragments {
                let Fragment::Text(range) = fragment else {
                    next.push(fragment);
                    continue;
                };
                let mut cursor = range.start;
                while let Some(&start) = starts.peek() {
                    if start >= range.end {
                        break;
                    }
                    starts.next();
                    if start < cursor {
                        continue; // overlaps a cut already made
                    }
                    if start + len > range.end {
                        // Runs past the fragment; so does every later one.
                        while starts.next_if(|&s| s < range.end).is_some() {}
                        break;
                    }
                    let mut left_end = start;
                    if attr.contains(TokenAttr::LSTRIP) {
                        while left_end > cursor && bytes[left_end - 1].is_ascii_whitespace_c() {
                            left_end -= 1;
                        }
                    }
                    if left_end > cursor {
                        next.push(Fragment::Text(cursor..left_end));
                    }
                    next.push(Fragment::Token(id));
                    cursor = start + len;
                    if attr.contains(TokenAttr::RSTRIP) {
                        while cursor < range.end && bytes[cursor].is_ascii_whitespace_c() {
                            cursor += 1;
                        }
                    }
                }
                if cursor < range.end {
                    next.push(Fragment::Text(cursor..range.end));
                }
            }
            fragments = next;
        }
        fragments
    }
}

/// C's `isspace` in the "C" locale.
trait CSpace {
    fn is_ascii_whitespace_c(&self) -> bool;
}

impl CSpace for u8 {
    fn is_ascii_whitespace_c(&self) -> bool {
        matches!(self, b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r')
    }
}
