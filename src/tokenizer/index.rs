//! Strings stored end to end and found by content: the vocabulary's
//! text -> id map (262k tokens for Gemma: one allocation for the texts, one
//! for the table, lookups by `&str` slices of the input without copying).

use std::hash::{BuildHasherDefault, Hasher};

/// FxHash (rustc's hasher): fast and good enough for keys that are not
/// chosen by an attacker to collide.
#[derive(Default, Clone, Copy)]
pub(crate) struct FxHasher {
    hash: u64,
}

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl FxHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.hash = (self.hash.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            self.add(u64::from_le_bytes(chunk.try_into().unwrap()));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut last = [0u8; 8];
            last[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(last) ^ ((rest.len() as u64) << 59));
        }
    }
    #[inline]
    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }
    #[inline]
    fn write_u32(&mut self, n: u32) {
        self.add(n.into());
    }
    #[inline]
    fn finish(&self) -> u64 {
        self.hash
    }
}

pub(crate) type FxBuildHasher = BuildHasherDefault<FxHasher>;
pub(crate) type FxHashMap<K, V> = std::collections::HashMap<K, V, FxBuildHasher>;

fn hash_bytes(bytes: &[u8]) -> u64 {
    let mut h = FxHasher::default();
    h.write(bytes);
    // Mix the high bits down: the table indexes with the low ones.
    let x = h.finish();
    x ^ (x >> 29) ^ (x >> 47)
}

const EMPTY: u32 = u32::MAX;

/// A set of distinct strings numbered 0.. in insertion order.
pub(crate) struct TextIndex {
    text: String,
    /// End of string `i` in `text`; it starts where `i - 1` ends.
    ends: Vec<usize>,
    /// Open addressing with linear probing; `EMPTY` or a string number.
    slots: Vec<u32>,
}

impl TextIndex {
    /// An index for about `count` strings of `bytes` bytes in all.
    pub(crate) fn with_capacity(count: usize, bytes: usize) -> TextIndex {
        let slots = (count.max(4) * 2).next_power_of_two();
        TextIndex {
            text: String::with_capacity(bytes),
            ends: Vec::with_capacity(count),
            slots: vec![EMPTY; slots],
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.ends.len()
    }

    /// String number `i`.
    pub(crate) fn get(&self, i: usize) -> &str {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.text[start..self.ends[i]]
    }

    fn find_slot(&self, s: &[u8]) -> Result<usize, usize> {
        let mask = self.slots.len() - 1;
        let mut slot = hash_bytes(s) as usize & mask;
        loop {
            match self.slots[slot] {
                EMPTY => return Err(slot),
                i if self.get(i as usize).as_bytes() == s => return Ok(i as usize),
                _ => slot = (slot + 1) & mask,
            }
        }
    }

    /// The number of `s`, if it is in the set.
    #[inline]
    pub(crate) fn find(&self, s: &str) -> Option<u32> {
        self.find_bytes(s.as_bytes())
    }

    #[inline]
    pub(crate) fn find_bytes(&self, s: &[u8]) -> Option<u32> {
        self.find_slot(s).ok().map(|i| i as u32)
    }

    /// Adds `s` and returns its number, or `Err` with the number it already has.
    pub(crate) fn insert(&mut self, s: &str) -> Result<u32, u32> {
        if (self.ends.len() + 1) * 2 > self.slots.len() {
            self.grow();
        }
        let slot = match self.find_slot(s.as_bytes()) {
            Ok(existing) => return Err(existing as u32),
            Err(slot) => slot,
        };
        let i = self.ends.len() as u32;
        self.text.push_str(s);
        self.ends.push(self.text.len());
        self.slots[slot] = i;
        Ok(i)
    }

    fn grow(&mut self) {
        let size = self.slots.len() * 2;
        self.slots = vec![EMPTY; size];
        for i in 0..self.ends.len() {
            let slot = self.find_slot(self.get(i).as_bytes()).unwrap_err();
            self.slots[slot] = i as u32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_are_found_by_content_and_numbered_in_order() {
        let mut index = TextIndex::with_capacity(1, 1);
        for (i, s) in ["a", "ab", "", "▁the", "abc"].iter().enumerate() {
            assert_eq!(index.insert(s), Ok(i as u32));
        }
        assert_eq!(index.insert("ab"), Err(1));
        assert_eq!(index.find("▁the"), Some(3));
        assert_eq!(index.find(""), Some(2));
        assert_eq!(index.find("abcd"), None);
        assert_eq!(index.get(4), "abc");
        assert_eq!(index.len(), 5);
        for n in 0..1000 {
            index.insert(&format!("tok{n}")).unwrap();
        }
        assert_eq!(index.find("tok999"), Some(1004));
    }
}
